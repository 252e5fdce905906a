"""`GrpcWebFront`, the gRPC port's listener while gRPC-Web is on (see the package docstring):
each connection relayed to grpcio or served as HTTP/1.1 gRPC-Web, whose calls run the app's
handlers through its interceptor chain."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc

from ...config import SocketAddress
from ...decode import Handler, size_checked
from ...errors import refusal
from ...hosts import loopback_host
from ..calls import Aborted, Call, CallDetails, resolver
from ..host import Host
from ..preface import HTTP2_PREFACE, preface_pending
from .framing import (
    MESSAGE,
    answer_type,
    cors_headers,
    frame,
    grpc_timeout,
    grpc_web_mode,
    origin_key,
    split_frames,
    status_headers,
    text_chunk,
    trailer_frame,
)
from .http1 import RELAY_CHUNK, Closed, Input, OverLimit, Request, Writer, head, read_request, send
from .relay import relay
from .tls import Peer, TlsEnd, client_hello_alpn, read_hello

NOT_GRPC_WEB = "HTTP/1.1 carries only gRPC-Web requests; use HTTP/2 for gRPC"
NOT_BIDI = "Workers/Work needs HTTP/2 gRPC (bidirectional streaming)"
NOT_LOOPBACK = "without auth, gRPC-Web only answers requests for a loopback host"

log = logging.getLogger("cronoq.server")


class GrpcWebFront:
    """The public gRPC port while gRPC-Web is on (see the module docstring).

    `interceptors`: the chain grpcio runs (the app's, then its readiness gate), run here over a
    call made of the request's path and headers; its last continuation returns the handler of
    `app.methods`, size-checked as grpcio's are. `tls`: the context of `[server.tls]`
    (http_api.ssl_context) when grpcio's internal port has TLS; the front offers `http/1.1` alone.
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
                await relay(head, reader, writer, self._internal)
            else:
                await self._http1(Input(reader, head), writer, {})
        except (Closed, ConnectionError, TimeoutError, asyncio.CancelledError):
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
                head, hello = await read_hello(reader)
            offered = client_hello_alpn(hello)
        except (ValueError, asyncio.IncompleteReadError) as e:
            log.debug("closing a connection to the gRPC port that sent no ClientHello: %s", e)
            return
        if offered is not None and "http/1.1" not in offered:
            await relay(head, reader, writer, self._internal)
            return
        tls = TlsEnd(self._tls, reader, writer, head)
        try:
            async with asyncio.timeout(timeout):
                await tls.handshake()
            await self._http1(Input(tls, b""), tls, tls.peer())
        finally:
            tls.close()

    async def _http1(self, source: Input, writer: Writer, peer: Peer) -> None:
        """Requests one after another (keep-alive); reading each, headers and body, is bounded
        by limits.request_timeout_s, and a client that goes away cancels its call. `peer`: the
        client certificate's facts for the interceptors."""
        limits = self._app.cfg.limits
        while True:
            try:
                async with asyncio.timeout(limits.request_timeout_s):
                    request = await read_request(source, limits.max_http_body_bytes)
            except OverLimit as over:  # answered, with CORS as every answer, then closed
                message = (
                    f"the request body is over limits.max_http_body_bytes"
                    f" ({limits.max_http_body_bytes})"
                )
                headers = {
                    **cors_headers(over.headers.get("origin"), self._allowed),
                    **status_headers(grpc.StatusCode.OUT_OF_RANGE, message),
                }
                await send(writer, 200, headers, b"", close=True)
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

    async def _answer(self, request: Request, writer: Writer, peer: Peer) -> None:
        cors = cors_headers(request.headers.get("origin"), self._allowed)
        close = not request.keep_alive
        if request.verb == "OPTIONS":
            await send(writer, 204, cors, b"", close=close)
            return
        mode = grpc_web_mode(request.headers.get("content-type"))
        if self._guarded and not loopback_host(request.headers.get("host", "")):
            headers = status_headers(grpc.StatusCode.PERMISSION_DENIED, NOT_LOOPBACK)
            await send(writer, 200, {**cors, **headers}, b"", close=close)
            return
        if mode is None:
            headers = status_headers(grpc.StatusCode.UNIMPLEMENTED, NOT_GRPC_WEB)
            await send(writer, 200, {**cors, **headers}, b"", close=close)
            return
        body = request.body
        try:
            if mode == "text":
                body = base64.b64decode(body, validate=False)
            frames = split_frames(body)
        except ValueError as e:
            headers = status_headers(grpc.StatusCode.INVALID_ARGUMENT, f"bad gRPC-Web body: {e}")
            await send(writer, 200, {**cors, **headers}, b"", close=close)
            return
        call = _WebCall(self, request, mode, cors, writer, peer)
        await call.run(frames)


class _WebCall:
    """One gRPC-Web call: resolve its handler, run it, answer its messages and status."""

    def __init__(
        self,
        front: GrpcWebFront,
        request: Request,
        mode: str,
        cors: Mapping[str, str],
        writer: Writer,
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
        deadline = grpc_timeout(request.headers.get("grpc-timeout"))
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
            self._writer.write(head(200, headers, close=not self._request.keep_alive))
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
            headers.update(status_headers(code, message))
            headers.update(trailers)
            await send(self._writer, 200, headers, b"", close=close)
            return
        body = b"".join(frame(self._encode(a)) for a in answers)
        body += trailer_frame(status, message, trailers)
        if self._mode == "text":
            body = text_chunk(body)
        headers["content-type"] = answer_type(self._mode)
        await send(self._writer, 200, headers, body, close=close)


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


def _initial(metadata: list[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in metadata if isinstance(v, str)}
