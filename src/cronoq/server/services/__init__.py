"""The gRPC services, apart from the fronts that carry their calls: Tasks and Admin (`tasks`),
the workers' stream (`worker_stream`) over the sans-I/O lease bookkeeping (`worker_leases`), and
the servicers that route calls between shards (`sharding`). None imports a front or the app."""
