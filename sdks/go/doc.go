// Package cronoq is the Go client for a cronoq server: it submits, inspects, waits for and
// watches tasks over the cronoq.v1 gRPC API, and runs remote workers with RunWorker.
//
// A Client is cheap to create and safe for concurrent use; its connection is opened lazily by
// gRPC on the first call, so Dial fails only for a malformed target. Calls the SDK does not
// wrap (recurring schedules, snapshots, worker listings) are made with the generated stubs in
// the cronoqpb package over Client.Conn.
//
// Every failed call returns a *Error carrying the gRPC status code, so callers can tell a
// timeout, a missing task or a transient condition apart with errors.As.
//
// RunWorker implements worker protocol version 3: it registers for one pool, runs the handler
// for each lease within the granted slots, heartbeats the running leases, reports exactly one
// outcome per lease, follows shard redirects safely and reconnects with backoff.
package cronoq
