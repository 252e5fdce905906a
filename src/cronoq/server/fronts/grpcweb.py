"""gRPC-Web on the gRPC port (docs/grpc-web.md): the wire format (frames, text mode, trailers,
CORS headers) and `GrpcWebFront`, the listener that serves it.

grpcio cannot answer HTTP/1.1, so with `[server.grpc_web]` the app binds grpcio on an internal
loopback port and `GrpcWebFront` owns the public one: a connection that opens with the HTTP/2
preface is relayed byte for byte to grpcio (native gRPC, unchanged), any other is read as
HTTP/1.1 gRPC-Web and answered here by calling the very handlers the registrars gave grpcio,
through the app's own interceptor chain (authentication, roles, readiness, request timeout,
decoding), so both paths refuse and answer alike.

With `[server.tls]` (docs/grpc-web.md, "TLS") grpcio's internal port has the same TLS, and the
front reads each connection's ClientHello first: a client offering only `h2` is relayed as it
came (its TLS is grpcio's); one offering `http/1.1`, or no ALPN, gets its TLS ended here
(`_Tls`) and HTTP/1.1 gRPC-Web, its client certificate reaching the interceptors as grpcio's
`auth_context` would give it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
import re
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc
from yarl import URL

from ..auth import certificate_dns_names
from ..config import SocketAddress
from ..decode import Handler, size_checked
from ..errors import percent_encode, refusal
from ..hosts import loopback_host
from .calls import Aborted, Call, CallDetails, resolver
from .host import Host
from .misdirected import HTTP2_PREFACE, preface_pending

__all__ = [
    "HTTP2_PREFACE",
    "MESSAGE",
    "NOT_BIDI",
    "NOT_GRPC_WEB",
    "TRAILER",
    "answer_type",
    "client_hello_alpn",
    "cors_headers",
    "frame",
    "GrpcWebFront",
    "grpc_web_mode",
    "origin_key",
    "percent_encode",
    "split_frames",
    "text_chunk",
    "trailer_frame",
]

MESSAGE = 0x00
TRAILER = 0x80
_HEADER = struct.Struct(">BI")
NOT_GRPC_WEB = "HTTP/1.1 carries only gRPC-Web requests; use HTTP/2 for gRPC"
_BINARY = frozenset({"application/grpc-web", "application/grpc-web+proto"})
_TEXT = frozenset({"application/grpc-web-text", "application/grpc-web-text+proto"})
ALLOW_HEADERS = "authorization, content-type, x-grpc-web, x-user-agent, grpc-timeout"
EXPOSE_HEADERS = "grpc-status, grpc-message, grpc-status-details-bin"
MAX_AGE = "600"
NOT_BIDI = "Workers/Work needs HTTP/2 gRPC (bidirectional streaming)"
NOT_LOOPBACK = "without auth, gRPC-Web only answers requests for a loopback host"
MAX_HEAD_BYTES = 64 * 1024  # request line and headers of one HTTP/1.1 request
MAX_HELLO_BYTES = 64 * 1024  # the TLS records read for one ClientHello
RELAY_CHUNK = 256 * 1024
_RECORD = struct.Struct(">BHH")  # a TLS record header: content type, version, length
_HANDSHAKE = 22  # the content type of handshake records
_CLIENT_HELLO = 1
_ALPN = 16  # the extension type of application_layer_protocol_negotiation

log = logging.getLogger("cronoq.server")


def grpc_web_mode(content_type: str | None) -> str | None:
    """ "binary", "text", or None for a content type that is not gRPC-Web (parameters such as
    `; charset=` are ignored, case-insensitively)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in _BINARY:
        return "binary"
    if kind in _TEXT:
        return "text"
    return None


def answer_type(mode: str) -> str:
    """The answer's content type for a request in `mode`."""
    return "application/grpc-web-text+proto" if mode == "text" else "application/grpc-web+proto"


def frame(data: bytes, flag: int = MESSAGE) -> bytes:
    """One frame: the flag byte, the 4-byte big-endian length, the bytes."""
    return _HEADER.pack(flag, len(data)) + data


def trailer_frame(code: int, message: str = "", extra: Mapping[str, str] | None = None) -> bytes:
    """The final frame: `grpc-status`, `grpc-message` (percent-encoded as gRPC does: every byte
    outside printable ASCII, and `%` itself) and any `extra` trailers, as CRLF-ended lines."""
    lines = [f"grpc-status:{code}"]
    if message:
        lines.append("grpc-message:" + percent_encode(message))
    lines.extend(f"{k}:{v}" for k, v in (extra or {}).items())
    return frame("".join(line + "\r\n" for line in lines).encode("ascii"), TRAILER)


def text_chunk(data: bytes) -> bytes:
    """A chunk of a text-mode answer: base64 with its own padding, so a client decodes each
    chunk as it arrives."""
    return base64.b64encode(data)


def split_frames(body: bytes) -> list[tuple[int, bytes]]:
    """The (flag, bytes) frames of a whole request body; ValueError for a truncated one."""
    frames, at = [], 0
    while at < len(body):
        if len(body) - at < _HEADER.size:
            raise ValueError("truncated gRPC-Web frame header")
        flag, size = _HEADER.unpack_from(body, at)
        at += _HEADER.size
        if len(body) - at < size:
            raise ValueError("truncated gRPC-Web frame")
        frames.append((flag, body[at : at + size]))
        at += size
    return frames


Origin: TypeAlias = "tuple[str, str, int | None]"


def origin_key(origin: str) -> Origin | None:
    """An origin as origins compare: scheme and host in lower case, the port (the scheme's
    default when none is given); None for what is no origin (`null`, a bare word)."""
    try:
        url = URL(origin)
    except ValueError:
        return None
    if not url.absolute or not url.host:
        return None
    return url.scheme.lower(), url.host.lower(), url.port


def cors_headers(origin: str | None, allowed: frozenset[Origin]) -> dict[str, str]:
    """The CORS headers of an answer (a preflight or an actual request): the request's origin
    is echoed as it came, only if it is one of the `allowed` (`origin_key`s); never
    `access-control-allow-credentials`."""
    headers = {
        "access-control-allow-methods": "POST",
        "access-control-allow-headers": ALLOW_HEADERS,
        "access-control-expose-headers": EXPOSE_HEADERS,
        "access-control-max-age": MAX_AGE,
    }
    if origin is not None and origin_key(origin) in allowed:
        headers["access-control-allow-origin"] = origin
    return headers


def client_hello_alpn(message: bytes) -> tuple[str, ...] | None:
    """The protocols a TLS ClientHello offers in ALPN, in its order (None: no ALPN extension).
    `message` is the handshake message, its 4-byte header first; ValueError for what is not a
    well-formed ClientHello."""
    hello = _Cursor(message)
    if hello.take(1) != bytes([_CLIENT_HELLO]):
        raise ValueError("not a ClientHello")
    body = _Cursor(hello.vector(3))
    body.take(2 + 32)  # legacy_version, random
    body.vector(1)  # legacy_session_id
    body.vector(2)  # cipher_suites
    body.vector(1)  # legacy_compression_methods
    if body.done():  # no extensions at all (TLS 1.2 allows it)
        return None
    extensions = _Cursor(body.vector(2))
    body.end()
    offered: tuple[str, ...] | None = None
    while not extensions.done():
        kind = int.from_bytes(extensions.take(2), "big")
        data = _Cursor(extensions.vector(2))
        if kind == _ALPN:
            names = _Cursor(data.vector(2))
            data.end()
            found = []
            while not names.done():
                found.append(names.vector(1).decode("latin-1"))
            offered = tuple(found)
    return offered


class _Cursor:
    """Reads a TLS structure: fixed fields and length-prefixed vectors; ValueError past its end."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def take(self, size: int) -> bytes:
        if self._at + size > len(self._data):
            raise ValueError("truncated TLS handshake message")
        self._at += size
        return self._data[self._at - size : self._at]

    def vector(self, length_bytes: int) -> bytes:
        return self.take(int.from_bytes(self.take(length_bytes), "big"))

    def done(self) -> bool:
        return self._at == len(self._data)

    def end(self) -> None:
        if not self.done():
            raise ValueError("trailing bytes in a TLS handshake message")


# --- the listener -----------------------------------------------------------------------------

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")


class _Closed(Exception):
    """The client closed the connection (or sent what cannot be answered): close it too."""


class _OverLimit(Exception):
    """A request whose body is over limits.max_http_body_bytes: answered, then closed."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("request body over the limit")
        self.headers = headers


class _Reader(Protocol):
    async def read(self, n: int, /) -> bytes: ...


class _Writer(Protocol):
    def write(self, data: bytes, /) -> None: ...

    async def drain(self) -> None: ...


_T = TypeVar("_T")
Peer: TypeAlias = "Mapping[str, list[bytes]]"
"""What grpcio's `auth_context()` would say of a call's client certificate (auth.py reads it)."""


@dataclass
class _Request:
    verb: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class _Input:
    """A connection's incoming bytes, starting with those read to tell HTTP/2 from HTTP/1.1."""

    def __init__(self, reader: _Reader, head: bytes) -> None:
        self._reader = reader
        self._buf = bytearray(head)

    async def _more(self) -> None:
        data = await self._reader.read(RELAY_CHUNK)
        if not data:
            raise _Closed
        self._buf += data

    async def until(self, separator: bytes, limit: int) -> bytes:
        while (at := self._buf.find(separator)) < 0:
            if len(self._buf) > limit:
                raise _Closed
            await self._more()
        end = at + len(separator)
        data = bytes(self._buf[:end])
        del self._buf[:end]
        return data

    async def exactly(self, size: int) -> bytes:
        while len(self._buf) < size:
            await self._more()
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data

    async def closed(self) -> None:
        """Return once the client closes its side (what it sends meanwhile stays buffered)."""
        with contextlib.suppress(_Closed, ConnectionError, ssl.SSLError):
            while True:
                await self._more()


class _Tls:
    """TLS ended here on a connection whose ClientHello the front has already read (asyncio
    cannot start TLS over bytes its stream consumed): an ssl.SSLObject between memory buffers,
    fed from the connection and flushed to it. A reader and writer for `_Input` and the
    answers; an SSLError for what TLS refuses (a missing or untrusted client certificate)."""

    def __init__(
        self,
        context: ssl.SSLContext,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: bytes,
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._incoming.write(head)
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._reader = reader
        self._writer = writer

    async def handshake(self) -> None:
        await self._run(self._tls.do_handshake)

    def peer(self) -> Peer:
        """The client certificate's DNS names as `peer_dns`, as grpcio gives them."""
        names = [n.encode() for n in certificate_dns_names(self._tls.getpeercert())]
        return {"peer_dns": names} if names else {}

    async def read(self, n: int, /) -> bytes:
        try:
            return await self._run(lambda: self._tls.read(n))
        except ssl.SSLZeroReturnError:  # the client's close_notify
            return b""

    def write(self, data: bytes, /) -> None:
        self._tls.write(data)
        self._flush()

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        """Send close_notify (or the alert of a failed handshake) before the socket closes."""
        with contextlib.suppress(ssl.SSLError):
            self._tls.unwrap()
        self._flush()

    async def _run(self, step: Callable[[], _T]) -> _T:
        while True:
            try:
                result = step()
            except ssl.SSLWantReadError:
                self._flush()
                data = await self._reader.read(RELAY_CHUNK)
                if not data:
                    raise _Closed from None
                self._incoming.write(data)
            else:
                self._flush()
                return result

    def _flush(self) -> None:
        if pending := self._outgoing.read():
            self._writer.write(pending)


class GrpcWebFront:
    """The public gRPC port while gRPC-Web is on (see the module docstring).

    `interceptors`: the chain grpcio runs (the app's, then its readiness gate), run here over a
    call made of the request's path and headers; its last continuation returns the handler of
    `app.methods`, size-checked as grpcio's are. `tls`: the context of `[server.tls]`
    (http.ssl_context) when grpcio's internal port has TLS; the front offers `http/1.1` alone.
    """

    def __init__(
        self,
        app: Host,
        interceptors: Sequence[grpc.aio.ServerInterceptor],
        internal: SocketAddress,
        allowed_origins: tuple[str, ...],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._app = app
        self._tls = tls
        if tls is not None:
            tls.set_alpn_protocols(["http/1.1"])
        max_bytes = app.cfg.limits.max_message_bytes

        async def served(d: grpc.HandlerCallDetails) -> Handler | None:
            handler = app.methods.get(d.method)
            if handler is None:
                return None
            if handler.request_streaming:
                return refusal(grpc.StatusCode.UNIMPLEMENTED, NOT_BIDI)
            return size_checked(handler, max_bytes)

        # the handler grpcio would run for a call, through the app's interceptors
        self.resolve = resolver(interceptors, served)
        self._internal = internal
        self._allowed = frozenset(k for o in allowed_origins if (k := origin_key(o)) is not None)
        cfg = app.cfg
        self._guarded = not (cfg.auth.enabled or cfg.server.insecure_no_auth)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, address: SocketAddress) -> int:
        """Listen on `address`; the bound port."""
        try:
            self._server = await asyncio.start_server(
                self._connection, address.host, address.port, limit=RELAY_CHUNK
            )
        except OSError as exc:
            raise OSError(f"cannot listen on {address}: {exc.strerror or exc}") from None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def stop_listening(self) -> None:
        """No new connections; open ones (relays draining grpcio's calls) stay."""
        if self._server is not None:
            self._server.close()

    async def stop(self) -> None:
        """Close every connection still open (after grpcio's drain)."""
        self.stop_listening()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections))

    # --- connections ---

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if self._tls is not None:
                await self._tls_connection(reader, writer)
                return
            head = b""
            # read until the bytes are the whole HTTP/2 preface or stop matching it
            while preface_pending(head):
                async with asyncio.timeout(self._app.cfg.limits.request_timeout_s):
                    data = await reader.read(len(HTTP2_PREFACE) - len(head))
                if not data:
                    return
                head += data
            if head == HTTP2_PREFACE:
                await self._relay(head, reader, writer)
            else:
                await self._http1(_Input(reader, head), writer, {})
        except (_Closed, ConnectionError, TimeoutError, asyncio.CancelledError):
            pass
        except ssl.SSLError as e:  # a handshake refused, a bad record: the client's doing
            log.debug("TLS failed on the gRPC port: %s", e)
        except Exception:
            log.exception("unexpected error on a gRPC-Web connection")
        finally:
            self._connections.discard(task)
            writer.close()

    async def _tls_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """The ClientHello's ALPN decides: `h2` without `http/1.1` is relayed to grpcio as it
        came; else TLS ends here and HTTP/1.1 gRPC-Web follows. What is not a ClientHello
        (plain HTTP, garbage, a truncated one) closes the connection."""
        assert self._tls is not None
        timeout = self._app.cfg.limits.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                head, hello = await _read_hello(reader)
            offered = client_hello_alpn(hello)
        except (ValueError, asyncio.IncompleteReadError) as e:
            log.debug("closing a connection to the gRPC port that sent no ClientHello: %s", e)
            return
        if offered is not None and "http/1.1" not in offered:
            await self._relay(head, reader, writer)
            return
        tls = _Tls(self._tls, reader, writer, head)
        try:
            async with asyncio.timeout(timeout):
                await tls.handshake()
            await self._http1(_Input(tls, b""), tls, tls.peer())
        finally:
            tls.close()

    async def _relay(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Native gRPC: both directions copied as they come until either side closes."""
        inner_reader, inner_writer = await asyncio.open_connection(
            self._internal.host, self._internal.port, limit=RELAY_CHUNK
        )
        inner_writer.write(head)
        pumps = [
            asyncio.create_task(_pump(reader, inner_writer)),
            asyncio.create_task(_pump(inner_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.wait(pumps)
            inner_writer.close()

    async def _http1(self, source: _Input, writer: _Writer, peer: Peer) -> None:
        """Requests one after another (keep-alive); reading each, headers and body, is bounded
        by limits.request_timeout_s, and a client that goes away cancels its call. `peer`: the
        client certificate's facts for the interceptors."""
        limits = self._app.cfg.limits
        while True:
            try:
                async with asyncio.timeout(limits.request_timeout_s):
                    request = await _read_request(source, limits.max_http_body_bytes)
            except _OverLimit as over:  # answered, with CORS as every answer, then closed
                message = (
                    f"the request body is over limits.max_http_body_bytes"
                    f" ({limits.max_http_body_bytes})"
                )
                headers = {
                    **cors_headers(over.headers.get("origin"), self._allowed),
                    **_status_headers(grpc.StatusCode.OUT_OF_RANGE, message),
                }
                await _send(writer, 200, headers, b"", close=True)
                return
            # a task of its own: the principal an interceptor sets stays with this call
            answering = asyncio.create_task(self._answer(request, writer, peer))
            gone = asyncio.create_task(source.closed())
            await asyncio.wait([answering, gone], return_when=asyncio.FIRST_COMPLETED)
            if not answering.done():
                answering.cancel()
                await asyncio.wait([answering])
                return
            gone.cancel()
            await asyncio.wait([gone])
            answering.result()
            if not request.keep_alive:
                return

    # --- one request ---

    async def _answer(self, request: _Request, writer: _Writer, peer: Peer) -> None:
        cors = cors_headers(request.headers.get("origin"), self._allowed)
        close = not request.keep_alive
        if request.verb == "OPTIONS":
            await _send(writer, 204, cors, b"", close=close)
            return
        mode = grpc_web_mode(request.headers.get("content-type"))
        if self._guarded and not loopback_host(request.headers.get("host", "")):
            headers = _status_headers(grpc.StatusCode.PERMISSION_DENIED, NOT_LOOPBACK)
            await _send(writer, 200, {**cors, **headers}, b"", close=close)
            return
        if mode is None:
            headers = _status_headers(grpc.StatusCode.UNIMPLEMENTED, NOT_GRPC_WEB)
            await _send(writer, 200, {**cors, **headers}, b"", close=close)
            return
        body = request.body
        try:
            if mode == "text":
                body = base64.b64decode(body, validate=False)
            frames = split_frames(body)
        except ValueError as e:
            headers = _status_headers(grpc.StatusCode.INVALID_ARGUMENT, f"bad gRPC-Web body: {e}")
            await _send(writer, 200, {**cors, **headers}, b"", close=close)
            return
        call = _WebCall(self, request, mode, cors, writer, peer)
        await call.run(frames)


class _WebCall:
    """One gRPC-Web call: resolve its handler, run it, answer its messages and status."""

    def __init__(
        self,
        front: GrpcWebFront,
        request: _Request,
        mode: str,
        cors: Mapping[str, str],
        writer: _Writer,
        peer: Peer,
    ) -> None:
        self._front = front
        self._peer = peer
        self._request = request
        self._mode = mode
        self._cors = cors
        self._writer = writer
        self._streaming = False  # the chunked answer's headers are sent
        self._answers: list[Any] = []  # a unary answer, sent with the status
        self._encode: Callable[[Any], bytes] = bytes

    async def run(self, frames: list[tuple[int, bytes]]) -> None:
        request = self._request
        metadata = tuple((k, v) for k, v in request.headers.items() if k not in _HOP_HEADERS)
        deadline = _timeout(request.headers.get("grpc-timeout"))
        context = _WebContext(metadata, deadline, self._peer)
        code, message = grpc.StatusCode.OK, ""
        trailers: tuple[tuple[str, str], ...] = ()
        try:
            async with asyncio.timeout(deadline):
                await self._call(frames, context, CallDetails(request.path, metadata))
        except Aborted as e:
            code, message, trailers = e.code, e.details, e.trailers
        except TimeoutError:
            code, message = grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as e:
            log.exception("unexpected error serving a gRPC-Web call", exc_info=e)
            code, message = grpc.StatusCode.UNKNOWN, f"internal error: {type(e).__name__}"
        await self._finish(code, message, dict(trailers), context.initial_metadata)

    async def _call(
        self, frames: list[tuple[int, bytes]], context: _WebContext, details: CallDetails
    ) -> None:
        messages = [data for flag, data in frames if flag == MESSAGE]
        if len(messages) != 1 or len(frames) != 1:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a gRPC-Web request carries one uncompressed message frame",
            )
        handler = await self._front.resolve(details)
        if handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {details.method}")
        decode = handler.request_deserializer
        request = messages[0] if decode is None else decode(messages[0])
        if handler.response_serializer is not None:
            self._encode = handler.response_serializer
        # grpc.aio behaviors, which the stubs type as grpcio's synchronous ones
        behaviors: Any = handler
        if handler.unary_unary is not None:
            self._answers.append(await behaviors.unary_unary(request, context))
            return
        result: Any
        if handler.unary_stream is not None:
            result = behaviors.unary_stream(request, context)
        elif handler.stream_unary is not None:
            result = behaviors.stream_unary(_once(request), context)
        else:
            assert handler.stream_stream is not None
            result = behaviors.stream_stream(_once(request), context)
        if inspect.isasyncgen(result):
            context.opened = lambda: self._open(context)
            async with contextlib.aclosing(result) as answers:
                async for answer in answers:
                    await self._stream(frame(self._encode(answer)), context)
        else:
            answer = await result
            if answer is not None:
                self._answers.append(answer)

    async def _open(self, context: Call) -> None:
        """The headers of a streaming answer (chunked), with the handler's initial metadata:
        once, when the handler sends that metadata or its first message."""
        if not self._streaming:
            self._streaming = True
            headers = {**self._cors, **_initial(context.initial_metadata)}
            headers["content-type"] = answer_type(self._mode)
            headers["transfer-encoding"] = "chunked"
            self._writer.write(_head(200, headers, close=not self._request.keep_alive))
            await self._writer.drain()

    async def _stream(self, data: bytes, context: Call) -> None:
        """One frame of a streaming answer, written and drained as it comes."""
        await self._open(context)
        await self._chunk(data)

    async def _chunk(self, data: bytes) -> None:
        if self._mode == "text":
            data = text_chunk(data)
        self._writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self._writer.drain()

    async def _finish(
        self,
        code: grpc.StatusCode,
        message: str,
        trailers: dict[str, str],
        initial: list[tuple[str, str]],
    ) -> None:
        close = not self._request.keep_alive
        status = code.value[0]
        if self._streaming:
            await self._chunk(trailer_frame(status, message, trailers))
            self._writer.write(b"0\r\n\r\n")
            await self._writer.drain()
            return
        answers = self._answers if code == grpc.StatusCode.OK else []
        headers = {**self._cors, **_initial(initial)}
        if not answers:  # no message: the status in the headers (docs/grpc-web.md)
            headers.update(_status_headers(code, message))
            headers.update(trailers)
            await _send(self._writer, 200, headers, b"", close=close)
            return
        body = b"".join(frame(self._encode(a)) for a in answers)
        body += trailer_frame(status, message, trailers)
        if self._mode == "text":
            body = text_chunk(body)
        headers["content-type"] = answer_type(self._mode)
        await _send(self._writer, 200, headers, body, close=close)


class _WebContext(Call):
    """calls.Call with the client certificate of the connection, if any, in `auth_context()`
    (over plain HTTP/1.1 there is none, as for the HTTP API). The initial metadata of a
    streaming call goes out at once (`opened`), as over HTTP/2; a unary call's waits for its
    answer."""

    def __init__(self, headers: Sequence[tuple[str, str]], bound_s: float | None, peer: Peer):
        super().__init__(headers, bound_s)
        self._peer = peer
        self.opened: Callable[[], Awaitable[None]] | None = None

    def auth_context(self) -> dict[str, list[bytes]]:
        return dict(self._peer)

    async def send_initial_metadata(self, metadata: Any) -> None:
        await super().send_initial_metadata(metadata)
        if self.opened is not None:
            await self.opened()


_HOP_HEADERS = frozenset(
    {"host", "connection", "content-length", "transfer-encoding", "keep-alive", "grpc-timeout"}
)


async def _once(item: Any) -> AsyncIterator[Any]:
    yield item


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(RELAY_CHUNK):
            sink.write(data)
            await sink.drain()


def _timeout(header: str | None) -> float | None:
    """The `grpc-timeout` header in seconds (None: absent or not understood)."""
    match = _TIMEOUT.fullmatch((header or "").strip())
    return None if match is None else int(match[1]) * _TIMEOUT_UNITS[match[2]]


def _status_headers(code: grpc.StatusCode, message: str) -> dict[str, str]:
    headers = {"content-type": answer_type("binary"), "grpc-status": str(code.value[0])}
    if message:
        headers["grpc-message"] = percent_encode(message)
    return headers


def _initial(metadata: list[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in metadata if isinstance(v, str)}


def _head(status: int, headers: Mapping[str, str], *, close: bool) -> bytes:
    reason = {200: "OK", 204: "No Content"}.get(status, "")
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send(
    writer: _Writer,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    close: bool,
) -> None:
    writer.write(_head(status, {**headers, "content-length": str(len(body))}, close=close) + body)
    await writer.drain()


async def _read_hello(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The bytes of the TLS records that carry a connection's ClientHello, as they came, and
    the handshake message they carry; ValueError past MAX_HELLO_BYTES or for a record that is
    not a handshake one (plain HTTP, say)."""
    raw, message = bytearray(), bytearray()
    while len(message) < 4 or len(message) < 4 + int.from_bytes(message[1:4], "big"):
        header = await reader.readexactly(_RECORD.size)
        kind, _, size = _RECORD.unpack(header)
        if kind != _HANDSHAKE or size == 0:
            raise ValueError("not a TLS handshake record")
        if len(raw) + _RECORD.size + size > MAX_HELLO_BYTES:
            raise ValueError(f"a ClientHello over {MAX_HELLO_BYTES} bytes")
        fragment = await reader.readexactly(size)
        raw += header + fragment
        message += fragment
    return bytes(raw), bytes(message)


async def _read_request(source: _Input, max_body: int) -> _Request:
    """The next request; _OverLimit when its body is over `max_body`, _Closed at the end of
    the connection or for what is not HTTP/1.1."""
    head = (await source.until(b"\r\n\r\n", MAX_HEAD_BYTES)).decode("latin-1")
    line, *fields = head[:-4].split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Closed
    verb, path, version = parts
    headers: dict[str, str] = {}
    for field in fields:
        name, sep, value = field.partition(":")
        if not sep:
            raise _Closed
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size_line = await source.until(b"\r\n", MAX_HEAD_BYTES)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _Closed from None
            if len(body) + size > max_body:
                raise _OverLimit(headers)
            if size == 0:  # then trailer fields, which are not used, up to an empty line
                while await source.until(b"\r\n", MAX_HEAD_BYTES) != b"\r\n":
                    pass
                break
            body += await source.exactly(size)
            await source.exactly(2)
        data = bytes(body)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise _Closed from None
        if length > max_body:
            raise _OverLimit(headers)
        data = await source.exactly(length) if length > 0 else b""
    return _Request(verb, path, headers, data, keep_alive)
