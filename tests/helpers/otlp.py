"""A real OTLP/HTTP trace receiver for tests: what a collector sees of cronoq's spans.

`OtlpReceiver()` serves HTTP (or HTTPS, given a certificate and key) on 127.0.0.1 and a free
port from a thread of its own, so sync and async tests alike can use it. Each
`POST /v1/traces` with `application/x-protobuf` is decoded with opentelemetry-proto's generated
classes and answered 200 with an empty ExportTraceServiceResponse; its spans are kept as
`ReceivedSpan`s in `spans` and its headers in `requests`. `fail_next(n)` answers the next `n`
requests with 503 (or another status) instead, keeping nothing of them. Wait for what a test
expects with `wait_for(predicate)` (or `await until(predicate)`), never with sleeps.

    with OtlpReceiver() as receiver:
        exporter = Exporter(receiver.traces_url, resource={"service.name": "t"})
        ...
        receiver.wait_for(lambda r: len(r.spans) == 10)
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One decoded span, ids as lowercase hex ('' for no parent), attributes by key."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    links: list[tuple[str, str]]
    resource: dict[str, Any]
    scope_name: str = ""
    scope_version: str = ""
    flags: int = 0


@dataclass
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    status: int  # what the receiver answered
    spans: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind)


def attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pair: KeyValue
    for pair in pairs:
        out[pair.key] = any_value(pair.value)
    return out


def decode(body: bytes) -> list[ReceivedSpan]:
    """Every span of one ExportTraceServiceRequest body."""
    request = ExportTraceServiceRequest.FromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=span.kind,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=attributes(span.attributes),
                        status_code=span.status.code,
                        status_message=span.status.message,
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        resource=resource,
                        scope_name=scope_spans.scope.name,
                        scope_version=scope_spans.scope.version,
                        flags=span.flags,
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self, *, certfile: str | None = None, keyfile: str | None = None) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests: list[ReceivedRequest] = []
        self._failures: list[tuple[int, str | None]] = []
        self._cond = threading.Condition()
        self._tls = certfile is not None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a collector does

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                receiver._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if certfile is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread: threading.Thread | None = None

    # --- lifecycle

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    # --- where

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """The base URL (what OTEL_EXPORTER_OTLP_ENDPOINT takes); `localhost` under TLS, the
        name test certificates carry."""
        if self._tls:
            return f"https://localhost:{self.port}"
        return f"http://127.0.0.1:{self.port}"

    @property
    def traces_url(self) -> str:
        return self.endpoint + TRACES_PATH

    # --- behaviour

    def fail_next(self, count: int, status: int = 503, retry_after: str | None = None) -> None:
        """Answer the next `count` requests with `status` (and this Retry-After, if given)."""
        with self._cond:
            self._failures.extend([(status, retry_after)] * count)

    # --- waiting

    def wait_for(
        self, predicate: Callable[[OtlpReceiver], Any], timeout: float = 10.0, what: str = ""
    ) -> None:
        """Block until `predicate(self)` holds (checked at each request); AssertionError after
        `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what or 'the receiver'}: "
                    f"{len(self.spans)} spans in {len(self.requests)} requests"
                )

    async def until(
        self, predicate: Callable[[OtlpReceiver], Any], timeout: float = 10.0, what: str = ""
    ) -> None:
        """`wait_for` for async tests, without blocking the event loop."""
        await asyncio.to_thread(self.wait_for, predicate, timeout, what)

    def span_named(self, name: str) -> ReceivedSpan:
        with self._cond:
            found = [s for s in self.spans if s.name == name]
        assert len(found) == 1, f"{len(found)} spans named {name!r}"
        return found[0]

    # --- serving

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        path = handler.path.split("?")[0]
        status, retry_after, spans = 200, None, None
        with self._cond:
            if self._failures:
                status, retry_after = self._failures.pop(0)
        if status == 200:
            if path != TRACES_PATH:
                status = 404
            elif headers.get("content-type") != "application/x-protobuf":
                status = 415
            else:
                if headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                try:
                    spans = decode(body)
                except Exception:
                    status = 400
        # Kept before answering: once the exporter has its answer, the spans are here.
        with self._cond:
            self.requests.append(ReceivedRequest(path, headers, status, len(spans or ())))
            if spans:
                self.spans.extend(spans)
            self._cond.notify_all()
        answer = ExportTraceServiceResponse().SerializeToString() if status == 200 else b""
        handler.send_response(status)
        handler.send_header("Content-Type", "application/x-protobuf")
        handler.send_header("Content-Length", str(len(answer)))
        if retry_after is not None:
            handler.send_header("Retry-After", retry_after)
        handler.end_headers()
        handler.wfile.write(answer)
        handler.wfile.flush()
