"""What the Client and the Worker share: errors, payload encoding, channels, enum names.

Kept apart so that `_client.py` and `_worker.py` never import each other; the rules implemented
here are docs/client.md, "Errors", "Encodings", "Connecting" and "Data classes" (status names).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeAlias

try:
    import grpc
    import grpc.aio

    from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
except ImportError as e:  # pragma: no cover - exercised by a subprocess test without grpc
    raise ImportError(
        "cronoq.client needs grpcio and protobuf; install them with: pip install 'cronoq[client]'"
    ) from e

from cronoq.errors import CronoqError

__all__ = [
    "CancelTask",
    "ClientError",
    "Metadata",
    "Payload",
    "Reject",
    "TaskRef",
    "encode_payload",
    "enum_name",
    "is_secure",
    "metadata",
    "open_channel",
    "priority_name",
    "strip_target",
]

Payload: TypeAlias = (
    bytes | bytearray | memoryview | str | dict[str, Any] | list[Any] | int | float | bool | None
)
TaskRef: TypeAlias = int | str
Metadata: TypeAlias = tuple[tuple[str, str], ...] | None


_RETRYABLE_CODES = frozenset({"unavailable", "resource_exhausted"})


class ClientError(CronoqError):
    """A gRPC call failed; `code` is the status name in lower case (`not_found`, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def retryable(self) -> bool:
        """True when trying the same call later may succeed (the server was busy or away)."""
        return self.code in _RETRYABLE_CODES

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> ClientError:
        """The ClientError for a failed call; tolerant of errors that carry no status."""
        code_of = getattr(e, "code", None)
        status = code_of() if callable(code_of) else None
        code = "unknown" if status is None else status.name.lower()
        details_of = getattr(e, "details", None)
        message = (details_of() or "") if callable(details_of) else str(e)
        return cls(code, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, self.message))


class Reject(CronoqError):
    """Raised by a worker's handler: give the lease back unrun, for another worker to take."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason,))


class CancelTask(CronoqError):
    """Raised by a worker's handler: end the whole task as cancelled, with no further attempt."""


_BINARY = (bytes, bytearray, memoryview)  # (a tuple: `bytes | ...` builds a union per call)


def encode_payload(value: Any, content_type: str | None = None) -> tuple[bytes, str]:
    """The bytes and media type sent for `value` (docs/client.md, "Encodings"); JSON for
    anything structured.

    An explicit `content_type` wins for every kind of value. Raises TypeError (or ValueError for
    a circular structure) when JSON cannot encode the value.
    """
    if value is None:  # (first: a handler's usual result)
        data, default = b"", ""
    elif isinstance(value, _BINARY):
        data, default = bytes(value), "application/octet-stream"
    elif isinstance(value, str):
        data, default = value.encode("utf-8"), "text/plain; charset=utf-8"
    else:
        data, default = json.dumps(value).encode("utf-8"), "application/json"
    return data, content_type or default


def strip_target(target: str) -> str:
    """The gRPC target for a user's server address: scheme and trailing slashes removed."""
    for scheme in ("http://", "https://", "grpc://"):
        if target.startswith(scheme):
            return target[len(scheme) :].rstrip("/")
    return target


def is_secure(target: str, tls: bool, credentials: grpc.ChannelCredentials | None) -> bool:
    """TLS is chosen by credentials, `tls=True` or an https:// address; nothing turns it off."""
    return credentials is not None or tls or target.startswith("https://")


def open_channel(
    target: str,
    *,
    tls: bool,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]] | None,
) -> grpc.aio.Channel:
    """A channel on the running event loop for `target` (docs/client.md, "Connecting")."""
    address = strip_target(target)
    opts = list(options) if options is not None else None
    if is_secure(target, tls, credentials):
        creds = credentials if credentials is not None else grpc.ssl_channel_credentials()
        return grpc.aio.secure_channel(address, creds, options=opts)
    return grpc.aio.insecure_channel(address, options=opts)


def metadata(token: str | None) -> Metadata:
    """The bearer header every call carries when there is a token, and nothing otherwise."""
    return (("authorization", f"Bearer {token}"),) if token else None


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """`TASK_STATUS_RUNNING` -> `running`: the lower-case name a wire enum value shows users."""
    return str(enum.Name(value)).removeprefix(prefix).lower()


def priority_name(value: int) -> str | None:
    """The lower-case priority name of a wire value; None for PRIORITY_UNSPECIFIED."""
    return None if value == pb.PRIORITY_UNSPECIFIED else enum_name(pb.Priority, value, "PRIORITY_")
