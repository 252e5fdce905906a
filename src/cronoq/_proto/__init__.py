"""The generated cronoq.v1 stubs under the name the published package gives them.

Ours live in `cronoq.proto.cronoq.v1`; programs written for the published client sometimes
reach for `cronoq._proto.cronoq_pb2` (for example to build a `TaskSpec` by hand), so both
module names resolve to the same modules and the same message classes. Needs grpcio and
protobuf, like `cronoq.client`.
"""

import sys

from cronoq.proto.cronoq.v1 import cronoq_pb2, cronoq_pb2_grpc

__all__ = ["cronoq_pb2", "cronoq_pb2_grpc"]

# `import cronoq._proto.cronoq_pb2` finds the modules already imported, under this name too.
sys.modules[f"{__name__}.cronoq_pb2"] = cronoq_pb2
sys.modules[f"{__name__}.cronoq_pb2_grpc"] = cronoq_pb2_grpc
