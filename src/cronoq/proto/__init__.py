"""The cronoq.v1 wire definition: `cronoq/v1/cronoq.proto` and the stubs generated from it.

The generated modules (`cronoq.proto.cronoq.v1.cronoq_pb2`, `..._pb2_grpc`) need grpcio and
protobuf (`pip install 'cronoq[server]'`), so nothing here imports them: the library stays
free of both, and whoever serves or calls cronoq.v1 imports the stubs itself.
"""

from importlib.resources import files

__all__ = ["proto_text"]


def proto_text() -> str:
    """The complete text of cronoq/v1/cronoq.proto, read from the installed package data."""
    return (files(__name__) / "cronoq" / "v1" / "cronoq.proto").read_text(encoding="utf-8")
