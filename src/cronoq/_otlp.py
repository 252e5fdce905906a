"""OpenTelemetry span export over OTLP/HTTP (protobuf), without opentelemetry-sdk.

The hot path is `Exporter.add`: one `list.append` of a plain tuple (a span record, below). A
daemon thread takes the queued records in batches, encodes each batch into an OTLP
`ExportTraceServiceRequest` (natively, `cronoq._native.otlp_encode`, with the GIL released
while encoding; else the pure-Python encoder here, which gives the same bytes) and POSTs it
with http.client. docs/dependencies.md says why this is not opentelemetry-sdk.

A span record is a tuple of 11 items:

    (trace_id,        # str, 32 lowercase hex digits
     span_id,         # str, 16 lowercase hex digits
     parent_span_id,  # str, 16 lowercase hex digits, or '' for a root span
     name,            # str
     kind,            # int, OTLP SpanKind: 0 unspecified, 1 internal, 2 server, 3 client,
                      #      4 producer, 5 consumer
     start_ns,        # int, unix nanoseconds (0 <= n < 2**64)
     end_ns,          # int, unix nanoseconds
     attributes,      # tuple of (key: str, value: str | int | float | bool); int in int64
     status_code,     # int: 0 unset, 1 ok, 2 error
     status_message,  # str
     links)           # tuple of (trace_id hex, span_id hex)

`attributes`, `links` and their pairs may be lists too. The encoding is protobuf's canonical
one (fields in number order, proto3 defaults left out), so it equals what opentelemetry-proto's
generated classes serialize for the same message.
"""

from __future__ import annotations

import email.utils
import http.client
import importlib.metadata
import logging
import math
import os
import random
import ssl
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

log = logging.getLogger("cronoq.otlp")

AttributeValue: TypeAlias = str | int | float | bool
Record: TypeAlias = tuple[
    str,  # trace_id
    str,  # span_id
    str,  # parent_span_id ('' for a root)
    str,  # name
    int,  # kind
    int,  # start_ns
    int,  # end_ns
    tuple[tuple[str, AttributeValue], ...],  # attributes
    int,  # status_code
    str,  # status_message
    tuple[tuple[str, str], ...],  # links: (trace_id, span_id)
]

# OTLP SpanKind and StatusCode values.
KIND_UNSPECIFIED: Final = 0
KIND_INTERNAL: Final = 1
KIND_SERVER: Final = 2
KIND_CLIENT: Final = 3
KIND_PRODUCER: Final = 4
KIND_CONSUMER: Final = 5
STATUS_UNSET: Final = 0
STATUS_OK: Final = 1
STATUS_ERROR: Final = 2

TRACES_PATH: Final = "/v1/traces"
CONTENT_TYPE: Final = "application/x-protobuf"
# HTTP answers worth retrying (the OTLP/HTTP specification's list).
RETRYABLE: Final = frozenset({429, 502, 503, 504})


def _version() -> str:
    try:
        return importlib.metadata.version("cronoq")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


VERSION: Final = _version()


# --- encoding ---------------------------------------------------------------------------------

_HEX: Final = frozenset("0123456789abcdef")
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1
_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack


def _varint(n: int) -> bytes:
    """A non-negative int as a protobuf varint (negative ones are passed as n + 2**64)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: tag byte (field numbers here are < 16), length, payload."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _utf8(value: object, where: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{where} must be a str, not {type(value).__name__}")
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{where} is not valid Unicode (a lone surrogate)") from None


def _hex_id(value: object, digits: int, where: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{where} must be a str, not {type(value).__name__}")
    if len(value) != digits or not _HEX.issuperset(value):
        raise ValueError(f"{where} must be {digits} lowercase hex digits")
    return bytes.fromhex(value)


def _int(value: object, low: int, high: int, where: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{where} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{where} must be in [{low}, {high}]")
    return int(value)


def _seq(value: object, where: str) -> Sequence[Any]:
    if not isinstance(value, tuple | list):
        raise TypeError(f"{where} must be a tuple or list, not {type(value).__name__}")
    return value


def _key_value(key: object, value: object, where: str) -> bytes:
    """A KeyValue message: key = 1, value = 2 (an AnyValue)."""
    key_bytes = _utf8(key, f"{where} key")
    if isinstance(value, bool):
        any_value = b"\x10\x01" if value else b"\x10\x00"
    elif isinstance(value, str):
        any_value = _ld(0x0A, _utf8(value, f"{where} value"))
    elif isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"{where} value is out of the int64 range")
        any_value = b"\x18" + _varint(value & _UINT64_MAX)
    elif isinstance(value, float):
        any_value = b"\x21" + _pack_double(value)
    else:
        raise TypeError(
            f"{where} value must be str, int, float or bool, not {type(value).__name__}"
        )
    return (_ld(0x0A, key_bytes) if key_bytes else b"") + _ld(0x12, any_value)


def _span(index: int, record: object) -> bytes:
    where = f"span {index}"
    fields = _seq(record, where)
    if len(fields) != 11:
        raise ValueError(f"{where} must have 11 items, not {len(fields)}")
    (trace_id, span_id, parent, name, kind, start, end, attributes, code, message, links) = fields
    out = bytearray()
    out += _ld(0x0A, _hex_id(trace_id, 32, f"{where} trace_id"))
    out += _ld(0x12, _hex_id(span_id, 16, f"{where} span_id"))
    if not isinstance(parent, str):
        raise TypeError(f"{where} parent_span_id must be a str, not {type(parent).__name__}")
    if parent:
        out += _ld(0x22, _hex_id(parent, 16, f"{where} parent_span_id"))
    name_bytes = _utf8(name, f"{where} name")
    if name_bytes:
        out += _ld(0x2A, name_bytes)
    kind = _int(kind, 0, 5, f"{where} kind")
    if kind:
        out += b"\x30" + _varint(kind)
    start = _int(start, 0, _UINT64_MAX, f"{where} start_ns")
    if start:
        out += b"\x39" + _pack_fixed64(start)
    end = _int(end, 0, _UINT64_MAX, f"{where} end_ns")
    if end:
        out += b"\x41" + _pack_fixed64(end)
    for i, pair in enumerate(_seq(attributes, f"{where} attributes")):
        item = f"{where} attribute {i}"
        key, value = _pair(pair, item)
        out += _ld(0x4A, _key_value(key, value, item))
    for i, pair in enumerate(_seq(links, f"{where} links")):
        item = f"{where} link {i}"
        link_trace, link_span = _pair(pair, item)
        link = _ld(0x0A, _hex_id(link_trace, 32, f"{item} trace_id"))
        link += _ld(0x12, _hex_id(link_span, 16, f"{item} span_id"))
        out += _ld(0x6A, link)
    code = _int(code, 0, 2, f"{where} status_code")
    message_bytes = _utf8(message, f"{where} status_message")
    if code or message_bytes:
        status = _ld(0x12, message_bytes) if message_bytes else b""
        if code:
            status += b"\x18" + _varint(code)
        out += _ld(0x7A, status)
    return bytes(out)


def _pair(value: object, where: str) -> tuple[object, object]:
    pair = _seq(value, where)
    if len(pair) != 2:
        raise ValueError(f"{where} must be a pair, not {len(pair)} items")
    return pair[0], pair[1]


def encode_python(
    resource: dict[str, str], scope: str, scope_version: str, spans: Sequence[Record]
) -> bytes:
    """The pure-Python encoder: the bytes `cronoq._native.otlp_encode` gives (see `encode`)."""
    if not isinstance(resource, dict):
        raise TypeError(f"resource must be a dict, not {type(resource).__name__}")
    attrs = bytearray()
    for key, value in resource.items():
        if not isinstance(value, str):
            raise TypeError(f"resource attribute values must be str, not {type(value).__name__}")
        attrs += _ld(0x0A, _key_value(key, value, "resource attribute"))
    scope_message = b""
    scope_name = _utf8(scope, "scope")
    if scope_name:
        scope_message += _ld(0x0A, scope_name)
    version = _utf8(scope_version, "scope_version")
    if version:
        scope_message += _ld(0x12, version)
    scope_spans = bytearray(_ld(0x0A, scope_message))
    for index, record in enumerate(_seq(spans, "spans")):
        scope_spans += _ld(0x12, _span(index, record))
    resource_spans = _ld(0x0A, bytes(attrs)) + _ld(0x12, bytes(scope_spans))
    return _ld(0x0A, resource_spans)


NativeEncoder: TypeAlias = Callable[[dict[str, str], str, str, Sequence[Record]], bytes]
native_encode: NativeEncoder | None
try:
    from cronoq._native import otlp_encode as native_encode
except ImportError:  # the extension is not built, or is older than its otlp_encode
    native_encode = None


def encode(
    resource: dict[str, str], scope: str, scope_version: str, spans: Sequence[Record]
) -> bytes:
    """One OTLP `ExportTraceServiceRequest` (opentelemetry/proto/collector/trace/v1): one
    ResourceSpans with these resource attributes, holding one ScopeSpans (`scope`,
    `scope_version`) with `spans`. Natively when the extension is built (the GIL released
    while encoding), else in Python: the same bytes. A malformed record raises TypeError or
    ValueError naming its index and field."""
    if native_encode is not None:
        return native_encode(resource, scope, scope_version, spans)
    return encode_python(resource, scope, scope_version, spans)


# --- ids and W3C trace context ----------------------------------------------------------------


def new_trace_id() -> str:
    """A random, nonzero 128-bit trace id as 32 lowercase hex digits."""
    while True:
        n = random.getrandbits(128)
        if n:
            return f"{n:032x}"


def new_span_id() -> str:
    """A random, nonzero 64-bit span id as 16 lowercase hex digits."""
    while True:
        n = random.getrandbits(64)
        if n:
            return f"{n:016x}"


def _is_hex(s: str) -> bool:
    return _HEX.issuperset(s)


def parse_traceparent(value: object) -> tuple[str, str, bool] | None:
    """A W3C `traceparent` header as (trace_id, span_id, sampled), or None when it is
    malformed: not `vv-<32 hex>-<16 hex>-<2 hex>` in lowercase, version ff, an all-zero id, or
    version 00 with anything after the flags. A later version may append `-...` fields, which
    are ignored (W3C Trace Context, "Versioning of traceparent")."""
    if not isinstance(value, str):
        return None
    s = value.strip(" \t")
    if len(s) < 55:
        return None
    version, trace_id, span_id, flags = s[0:2], s[3:35], s[36:52], s[53:55]
    if s[2] != "-" or s[35] != "-" or s[52] != "-":
        return None
    if not (_is_hex(version) and _is_hex(trace_id) and _is_hex(span_id) and _is_hex(flags)):
        return None
    if version == "ff":
        return None
    if version == "00" and len(s) != 55:
        return None
    if len(s) > 55 and s[55] != "-":
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def format_traceparent(trace_id: str, span_id: str, sampled: bool) -> str:
    """A version 00 `traceparent` header; ValueError for ids that are not lowercase hex of the
    right length or are all zeros."""
    for name, value, digits in (("trace_id", trace_id, 32), ("span_id", span_id, 16)):
        if len(value) != digits or not _is_hex(value) or value == "0" * digits:
            raise ValueError(f"{name} must be {digits} lowercase hex digits, not all zero")
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


# --- the exporter -----------------------------------------------------------------------------


class _Flush:
    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = True


class _PermanentError(Exception):
    """An answer not worth retrying (a 4xx other than 429, a redirect, ...)."""


class Exporter:
    """Queues span records (`add`) and exports them from a daemon thread over OTLP/HTTP.

    The thread exports every `interval` seconds, or as soon as `batch` records are queued, in
    requests of at most `batch` spans. Records over `max_queue` are dropped and counted in
    `dropped` (which also counts the spans of batches given up after retries, and records
    added after `shutdown`). Answers 429, 502, 503 and 504 and connection errors are retried
    up to `max_retries` times with exponential backoff from `retry_delay` seconds (doubling,
    at most `max_retry_delay`), or after the answer's Retry-After. Nothing here raises into
    the caller: failures are logged on "cronoq.otlp", once per streak of failed exports.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        resource: Mapping[str, str],
        timeout: float = 10.0,
        max_queue: int = 65536,
        batch: int = 4096,
        interval: float = 1.0,
        ca_file: str | None = None,
        scope: str = "cronoq",
        scope_version: str = VERSION,
        max_retries: int = 5,
        retry_delay: float = 0.5,
        max_retry_delay: float = 30.0,
    ) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the OTLP endpoint must be an http:// or https:// URL: {endpoint!r}")
        if batch < 1 or max_queue < 1:
            raise ValueError("batch and max_queue must be at least 1")
        if not (interval > 0 and timeout > 0):
            raise ValueError("interval and timeout must be positive")
        self.endpoint = endpoint
        self.timeout = timeout
        self.ca_file = ca_file
        self.max_queue = max_queue
        self.batch = batch
        self.interval = interval
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self.headers = {
            "Content-Type": CONTENT_TYPE,
            "User-Agent": f"cronoq/{VERSION}",
            **(headers or {}),
        }
        self.resource = dict(resource)
        self._scope = scope
        self._scope_version = scope_version
        self._max_queue = max_queue  # 0 once shut down
        self._max_retries = max_retries
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._conn: http.client.HTTPConnection | None = None

        # Appended to by add() (list.append is atomic) and cut from its front by the thread
        # (`del queue[:n]`, atomic too): never replaced, so no append can land in a list the
        # thread already took.
        self._queue: list[Record] = []
        self._overflowed = 0
        self._overflow_lock = threading.Lock()
        self._failed = 0  # spans of batches given up (the thread alone writes it)
        self._exported = 0
        self._streak = 0  # spans dropped in the current streak of failed exports
        self._malformed_logged = False
        self._wake = threading.Event()
        self._abort = threading.Event()  # shutdown's timeout passed: stop retrying
        self._flushes: list[_Flush] = []
        self._stopping = False
        self._shutdown_lock = threading.Lock()
        self._shut = False
        self._shut_ok = False
        self._thread = threading.Thread(target=self._run, name="cronoq-otlp", daemon=True)
        self._thread.start()

    # --- the caller's side

    def add(self, record: Record) -> None:
        """Queue one span record. Cheap: one append, no lock, no wake-up (but once per batch)."""
        queue = self._queue
        n = len(queue)
        if n >= self._max_queue:
            with self._overflow_lock:
                self._overflowed += 1
            return
        queue.append(record)
        if n == self.batch:
            self._wake.set()

    @property
    def dropped(self) -> int:
        """Spans dropped: over `max_queue`, added after `shutdown`, or in failed exports."""
        return self._overflowed + self._failed

    @property
    def exported(self) -> int:
        """Spans the collector accepted."""
        return self._exported

    @property
    def queued(self) -> int:
        return len(self._queue)

    def flush(self, timeout: float = 10.0) -> bool:
        """Export what is queued now; True once it was all accepted by the collector, False
        if an export of it failed or `timeout` passed first (the export goes on)."""
        if self._shut:
            return not self._queue
        request = _Flush()
        self._flushes.append(request)
        self._wake.set()
        return request.done.wait(timeout) and request.ok

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Export what is queued and stop the thread; idempotent (a repeat returns the first
        call's result). Records added afterwards are dropped. True if everything queued was
        exported within `timeout`."""
        with self._shutdown_lock:
            if self._shut:
                return self._shut_ok
            self._shut = True
            failed_before = self._failed
            self._max_queue = 0  # from now on add() drops (and counts)
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._abort.set()  # retries end; a request in flight ends at its own timeout
                self._shut_ok = False
            else:
                self._shut_ok = self._failed == failed_before and not self._queue
            return self._shut_ok

    # --- the thread

    def _run(self) -> None:
        while True:
            if len(self._queue) < self.batch and not (self._stopping or self._flushes):
                self._wake.wait(self.interval)
            self._wake.clear()
            stopping = self._stopping
            flushes = self._flushes[:]
            del self._flushes[: len(flushes)]
            try:
                ok = self._drain()
            except Exception:  # never let the thread die
                log.exception("OTLP export failed")
                ok = False
            for request in flushes:
                request.ok = ok
                request.done.set()
            if stopping:
                break
        self._close_connection()
        for request in self._flushes:  # raced with shutdown: answered, not left to time out
            request.ok = not self._queue
            request.done.set()

    def _drain(self) -> bool:
        """Export what is queued now, in requests of at most `batch` spans (what arrives
        meanwhile waits for the next round); True if every export succeeded."""
        ok = True
        remaining = len(self._queue)
        while remaining > 0:
            n = min(remaining, self.batch)
            items = self._queue[:n]
            del self._queue[:n]
            remaining -= n
            ok = self._export(items) and ok
        return ok

    def _export(self, items: list[Record]) -> bool:
        complete = True
        try:
            body = encode(self.resource, self._scope, self._scope_version, items)
        except (TypeError, ValueError) as error:
            # A caller's bug, not the collector's: the batch goes without its bad records.
            good = [r for r in items if _encodes(r)]
            self._failed += len(items) - len(good)
            if not self._malformed_logged:
                self._malformed_logged = True
                log.warning(
                    "dropped %d malformed span records (%s); later ones are dropped and "
                    "counted without a log",
                    len(items) - len(good),
                    error,
                )
            if not good:
                return False
            body = encode(self.resource, self._scope, self._scope_version, good)
            items = good
            complete = False
        try:
            self._post(body)
        except Exception as error:
            self._fail(len(items), str(error) or type(error).__name__)
            return False
        self._exported += len(items)
        if self._streak:
            log.info(
                "OTLP export to %s works again; %d spans were dropped while it failed",
                self.endpoint,
                self._streak,
            )
            self._streak = 0
        return complete

    def _fail(self, count: int, why: str) -> None:
        self._failed += count
        if not self._streak:
            log.warning(
                "OTLP export to %s failed: %s; dropped %d spans (further failures are not "
                "logged until an export succeeds)",
                self.endpoint,
                why,
                count,
            )
        else:
            log.debug("OTLP export failed again: %s; dropped %d spans", why, count)
        self._streak += count

    def _post(self, body: bytes) -> None:
        """POST one request, retrying what is worth it; raises once it gives up."""
        attempt = 0
        while True:
            if self._abort.is_set():
                raise _PermanentError("shutting down")
            retry_after: float | None = None
            try:
                status, retry_after = self._request(body)
                if 200 <= status < 300:
                    return
                if status not in RETRYABLE:
                    raise _PermanentError(f"HTTP {status}")
                problem: str = f"HTTP {status}"
            except (OSError, http.client.HTTPException) as error:
                self._close_connection()
                problem = f"{type(error).__name__}: {error}"
            if attempt >= self._max_retries or self._abort.is_set():
                raise _PermanentError(f"{problem} after {attempt + 1} attempts")
            delay = min(self._retry_delay * 2**attempt, self._max_retry_delay)
            if retry_after is not None:
                delay = min(retry_after, self._max_retry_delay)
            attempt += 1
            log.debug("OTLP export: %s; retry %d in %.2f s", problem, attempt, delay)
            if self._abort.wait(delay):
                raise _PermanentError(f"{problem}; shutting down")

    def _request(self, body: bytes) -> tuple[int, float | None]:
        conn = self._conn
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout, context=self._ssl
                )
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
            self._conn = conn
        conn.request("POST", self._path, body, self.headers)
        response = conn.getresponse()
        response.read()
        if response.will_close:
            self._close_connection()
        return response.status, _retry_after(response.getheader("Retry-After"))

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _encodes(record: Record) -> bool:
    try:
        encode_python({}, "", "", [record])
    except (TypeError, ValueError):
        return False
    return True


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: delay-seconds or an HTTP date; None if absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


# --- configuration from the environment -------------------------------------------------------

PROTOCOL: Final = "http/protobuf"
DEFAULT_ENDPOINT: Final = "http://localhost:4318"


def _get(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, stripped; None when unset or empty (empty means unset in OTel)."""
    value = env.get(name, "").strip()
    return value or None


def _signal(env: Mapping[str, str], name: str) -> str | None:
    """OTEL_EXPORTER_OTLP_TRACES_<name>, else OTEL_EXPORTER_OTLP_<name>."""
    return _get(env, f"OTEL_EXPORTER_OTLP_TRACES_{name}") or _get(env, f"OTEL_EXPORTER_OTLP_{name}")


def parse_pairs(value: str, variable: str) -> dict[str, str]:
    """`k=v,k2=v2` (W3C Baggage-like, as OTEL_EXPORTER_OTLP_HEADERS and
    OTEL_RESOURCE_ATTRIBUTES take it): keys and values url-decoded, whitespace around them
    stripped. ValueError for an entry without `=` or with an empty key."""
    out: dict[str, str] = {}
    for entry in value.split(","):
        if not entry.strip():
            continue
        key, sep, item = entry.partition("=")
        key = urllib.parse.unquote(key.strip())
        if not sep or not key:
            raise ValueError(f"{variable}: {entry.strip()!r} is not key=value")
        out[key] = urllib.parse.unquote(item.strip())
    return out


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() == "true"


def from_env(
    env: Mapping[str, str] = os.environ,
    *,
    service_name: str,
    enabled: bool | None = None,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    certificate: str | None = None,
    protocol: str | None = None,
    resource: Mapping[str, str] | None = None,
    max_queue: int | None = None,
    batch: int | None = None,
    interval: float | None = None,
) -> Exporter | None:
    """An Exporter configured by the standard OpenTelemetry variables in `env`, or None when
    tracing is off: OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none, or no endpoint (none
    given, no OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, and OTEL_TRACES_EXPORTER not set to otlp,
    which alone means the default http://localhost:4318).

    `service_name` is the name used when neither OTEL_SERVICE_NAME nor a `service.name` in
    OTEL_RESOURCE_ATTRIBUTES names one. The other keyword arguments, when not None, win over
    the environment (a server's configuration passes them): `enabled` (True ignores
    OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER), `endpoint` (the full traces URL, as is),
    `headers` (merged over the variables' headers), `timeout` (seconds), `certificate` (a CA
    file), `protocol`, `resource` (merged over every other resource attribute, `service.name`
    included), and the Exporter's `max_queue`, `batch` and `interval` (else
    OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_SCHEDULE_DELAY in ms).

    ValueError, naming the variable, for a protocol other than http/protobuf, an exporter
    other than otlp or none, and malformed values.
    """
    exporter_var = _get(env, "OTEL_TRACES_EXPORTER")
    if enabled is False:
        return None
    if enabled is None:
        if _truthy(_get(env, "OTEL_SDK_DISABLED")):
            return None
        if exporter_var is not None:
            names = {n.strip().lower() for n in exporter_var.split(",") if n.strip()}
            if "none" in names:
                return None
            if names - {"otlp"}:
                raise ValueError(
                    f"OTEL_TRACES_EXPORTER={exporter_var!r} is not supported: cronoq exports "
                    "spans over OTLP only (use otlp, or none to disable)"
                )

    protocol_var = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if protocol is None:
        protocol = _get(env, protocol_var)
        if protocol is None:
            protocol_var = "OTEL_EXPORTER_OTLP_PROTOCOL"
            protocol = _get(env, protocol_var)
    else:
        protocol_var = "protocol"
    if protocol is not None and protocol != PROTOCOL:
        raise ValueError(
            f"{protocol_var}={protocol!r} is not supported: cronoq exports spans over "
            f"OTLP/HTTP with protobuf only ({PROTOCOL}); grpc and http/json are not available"
        )

    if endpoint is None:
        endpoint = _get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if endpoint is None:
        base = _get(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
        if base is None and exporter_var is not None and enabled is None:
            base = DEFAULT_ENDPOINT  # OTEL_TRACES_EXPORTER=otlp asked for it explicitly
        if base is None and enabled:
            base = DEFAULT_ENDPOINT
        if base is not None:
            endpoint = base.rstrip("/") + TRACES_PATH
    if endpoint is None:
        return None

    merged_headers: dict[str, str] = {}
    header_var = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
    header_text = _get(env, header_var)
    if header_text is None:
        header_var = "OTEL_EXPORTER_OTLP_HEADERS"
        header_text = _get(env, header_var)
    if header_text is not None:
        merged_headers = parse_pairs(header_text, header_var)
    merged_headers.update(headers or {})

    if timeout is None:
        timeout_text = _signal(env, "TIMEOUT")
        timeout = 10.0
        if timeout_text is not None:
            timeout = _number(timeout_text, "OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT") / 1000

    if certificate is None:
        certificate = _signal(env, "CERTIFICATE")

    attributes: dict[str, str] = {
        "service.name": service_name,
        "service.version": VERSION,
        "telemetry.sdk.name": "cronoq",
        "telemetry.sdk.language": "python",
        "telemetry.sdk.version": VERSION,
    }
    resource_text = _get(env, "OTEL_RESOURCE_ATTRIBUTES")
    if resource_text is not None:
        attributes.update(parse_pairs(resource_text, "OTEL_RESOURCE_ATTRIBUTES"))
    env_service = _get(env, "OTEL_SERVICE_NAME")
    if env_service is not None:
        attributes["service.name"] = env_service
    attributes.update(resource or {})

    if max_queue is None:
        max_queue = _count(env, "OTEL_BSP_MAX_QUEUE_SIZE", 65536)
    if batch is None:
        batch = _count(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 4096)
    if interval is None:
        delay = _get(env, "OTEL_BSP_SCHEDULE_DELAY")
        interval = 1.0 if delay is None else _number(delay, "OTEL_BSP_SCHEDULE_DELAY") / 1000
    return Exporter(
        endpoint,
        headers=merged_headers,
        resource=attributes,
        timeout=timeout,
        max_queue=max_queue,
        batch=batch,
        interval=interval,
        ca_file=certificate,
    )


def _number(text: str, variable: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} is not a number of milliseconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{variable}={text!r} must be a positive number of milliseconds")
    return value


def _count(env: Mapping[str, str], variable: str, default: int) -> int:
    text = _get(env, variable)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{variable}={text!r} must be at least 1")
    return value
