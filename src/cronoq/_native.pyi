# Types of the native transport extension (native/src/lib.rs), for mypy: the extension has none.

from collections.abc import Sequence
from typing import Any, Final

Event = tuple[Any, ...]  # (kind, call_id, ...): see native/src/lib.rs
Metadata = list[tuple[str, str | bytes]]

# Event kinds, the first item of each drained tuple.
CALL: Final = 0
MESSAGE: Final = 1
HALF_CLOSE: Final = 2
GONE: Final = 3
WRITABLE: Final = 4  # (4, call_id): pending bytes back at LOW_WATER after a send over HIGH_WATER
# Backpressure thresholds on a call's pending bytes (see Transport.send).
HIGH_WATER: Final = 65536
LOW_WATER: Final = 16384

class Transport:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_receive_bytes: int,
        max_unsent_bytes: int,
        max_concurrent_streams: int,
        keepalive_interval_s: float,
        keepalive_timeout_s: float,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
        client_ca: bytes | None = None,
    ) -> None: ...
    @property
    def port(self) -> int: ...
    def fileno(self) -> int: ...
    def drain(self) -> list[Event]: ...
    def send(self, call_id: int, messages: list[bytes], *, budgeted: bool = False) -> int:
        """Queue framed messages; the call's pending bytes after them (framed bytes not yet
        passed to HTTP/2 with flow-control window), or -1 (nothing queued) if the call is gone.
        A result over HIGH_WATER arms one (WRITABLE, call_id) event for when the pending bytes
        fall to LOW_WATER or below. With `budgeted`, -2 (nothing queued) if the connection
        already holds bytes and these would take it over `max_unsent_bytes`."""
    def unsent_bytes(self) -> int: ...
    def headers(self, call_id: int, metadata: Metadata) -> bool: ...
    def finish(self, call_id: int, code: int, message: str, trailers: Metadata) -> None: ...
    def stop_accepting(self) -> None: ...
    def close(self) -> None: ...

# CPython's PyObject_GC_UnTrack (see cronoq.core.model.leave_collector).
def gc_untrack(obj: object, /) -> None: ...

# native/src/otlp.rs: span records (see cronoq._otlp) into one OTLP ExportTraceServiceRequest,
# encoded with the GIL released; TypeError or ValueError for a malformed record.
def otlp_encode(
    resource: dict[str, str], scope: str, scope_version: str, spans: Sequence[Any]
) -> bytes: ...

# native/src/client.rs: one gRPC bidirectional call on an HTTP/2 connection of its own.
# (code, message percent-decoded, initial metadata, trailing metadata): how the call ended.
CallEnd = tuple[int, str, Metadata, Metadata]

class ClientCall:
    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        metadata: Metadata,
        *,
        authority: str,
        user_agent: str,
        max_receive_bytes: int,
        tls: bool = False,
        server_name: str | None = None,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        keepalive_time_s: float = 0.0,
        keepalive_timeout_s: float = 20.0,
    ) -> None:
        """Connects (TCP, TLS when `tls`: the system's roots unless `root_certificates`, a
        client certificate for mTLS) and starts the call at once, on a thread of its own."""
    def fileno(self) -> int: ...
    def send(self, messages: list[bytes], *, end: bool = False) -> bool:
        """Queue serialized messages, framed and written together; `end` half-closes after
        them. False (nothing queued) once the call has ended."""
    def drain(self) -> tuple[list[bytes], CallEnd | None, bool]:
        """(messages read since the last drain, the end once known, the thread is done)."""
    def cancel(self) -> None:
        """RST_STREAM CANCEL and close the connection (no-op once ended); does not wait."""
    def close(self) -> None:
        """Cancel, wait for the thread to end, close the wake socket; idempotent."""
