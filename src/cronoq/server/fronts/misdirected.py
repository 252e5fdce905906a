"""A gRPC client pointed at the HTTP listener's port (docs/http.md, "gRPC on the HTTP port").

A gRPC client opens with the HTTP/2 connection preface, which an HTTP/1.1 parser can only take
for a broken request: the client would report a failed connection ("is the server running?")
and aiohttp would log a traceback per attempt. So the listener looks at each connection's first
bytes (`Site`, `_Sniffer`): the preface gets `_GrpcHere`, just enough HTTP/2 for any gRPC client
to show why: the server's SETTINGS, then every call answered as soon as its request has come,
trailers only, with `UNAVAILABLE` and a message naming the gRPC address. Anything else goes to
aiohttp as it came. The server logs one warning per peer and `WARN_EVERY_S`, not one per
attempt.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from ..errors import percent_encode
from ..logs import event
from .preface import HTTP2_PREFACE, preface_pending

__all__ = ["Site"]

WARN_EVERY_S = 60.0  # a peer that keeps trying is logged again after this long
_HEADER_SIZE = 9
_MAX_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE's default, which the client must respect
_DATA, _HEADERS, _SETTINGS, _PING = 0x0, 0x1, 0x4, 0x6
_END_STREAM, _ACK, _END_HEADERS = 0x1, 0x1, 0x4
_STATUS_200 = b"\x88"  # HPACK: `:status: 200`, entry 8 of the static table
_UNAVAILABLE = "14"

log = logging.getLogger("cronoq.server")


class Site(web.BaseSite):
    """aiohttp's TCP site, every connection behind a `_Sniffer`. `grpc_address()` names where
    gRPC is served, for the message."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        grpc_address: Callable[[], object],
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._grpc_address = grpc_address
        self._warned: dict[str, float] = {}

    @property
    def name(self) -> str:
        return f"{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Sniffer(server(), self._misdirected),
            self._host,
            self._port,
            ssl=self._ssl_context,
        )

    def _misdirected(self, transport: asyncio.Transport) -> _GrpcHere:
        """The HTTP/2 answer for a gRPC client on this port; a warning unless this peer had
        one within WARN_EVERY_S."""
        where = self._grpc_address()
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else "?"
        now = asyncio.get_running_loop().time()
        if now - self._warned.get(host, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned = {h: t for h, t in self._warned.items() if now - t < WARN_EVERY_S}
            self._warned[host] = now
            event(log, logging.WARNING, "grpc_on_http_port", peer=host, grpc=where)
        return _GrpcHere(transport, f"this is cronoq's HTTP port; gRPC is on {where}")


class _Sniffer(asyncio.Protocol):
    """One connection: aiohttp's handler has it from the start (its timers run, the standby
    recycling sees it), and gets its bytes unless they open with the HTTP/2 preface; then
    `misdirected` answers them instead, and aiohttp's header timeout still closes it."""

    def __init__(
        self,
        inner: RequestHandler,
        misdirected: Callable[[asyncio.Transport], _GrpcHere],
    ) -> None:
        self._inner = inner
        self._misdirected = misdirected
        self._head = b""
        self._transport: asyncio.Transport | None = None
        self._grpc: _GrpcHere | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._grpc is not None:
            self._grpc.data_received(data)
            return
        head = self._head + data
        if preface_pending(head):
            self._head = head
            return
        assert self._transport is not None
        if head.startswith(HTTP2_PREFACE):
            self._grpc = self._misdirected(self._transport)
            self._grpc.data_received(head[len(HTTP2_PREFACE) :])
            return
        self._transport.set_protocol(self._inner)  # HTTP/1: aiohttp's from now on
        self._inner.data_received(head)

    def eof_received(self) -> None:
        self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _GrpcHere:
    """The HTTP/2 side of a misdirected gRPC connection: SETTINGS, the acknowledgements the
    client waits for (its SETTINGS, its PINGs), and to each new stream, once its request has
    come (its first DATA frame, or headers that end the stream), a HEADERS frame that ends it:
    `:status 200`, `content-type: application/grpc`, `grpc-status: 14` and `grpc-message`.
    (Answered before its first message, a stream's status may reach grpcio's client as
    INTERNAL: grpc/grpc#36066.) Everything else the client sends is read and dropped; a frame
    larger than the client may send closes the connection."""

    def __init__(self, transport: asyncio.Transport, message: str) -> None:
        self._transport = transport
        self._answer = _STATUS_200 + b"".join(
            _literal(name, value)
            for name, value in (
                ("content-type", "application/grpc"),
                ("grpc-status", _UNAVAILABLE),
                ("grpc-message", percent_encode(message)),
            )
        )
        self._buffer = bytearray()
        self._opened: set[int] = set()  # streams whose request message has not come yet
        transport.write(_frame(_SETTINGS, 0, 0, b""))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _HEADER_SIZE:
            size = int.from_bytes(self._buffer[:3], "big")
            if size > _MAX_FRAME:
                self._transport.close()
                return
            if len(self._buffer) < _HEADER_SIZE + size:
                return
            kind, flags = self._buffer[3], self._buffer[4]
            stream = int.from_bytes(self._buffer[5:9], "big") & 0x7FFF_FFFF
            payload = bytes(self._buffer[_HEADER_SIZE : _HEADER_SIZE + size])
            del self._buffer[: _HEADER_SIZE + size]
            if kind == _SETTINGS and not flags & _ACK:
                self._transport.write(_frame(_SETTINGS, _ACK, 0, b""))
            elif kind == _PING and not flags & _ACK:
                self._transport.write(_frame(_PING, _ACK, 0, payload))
            elif kind == _HEADERS and not flags & _END_STREAM:
                self._opened.add(stream)  # answered once its message comes
            elif kind == _HEADERS or (kind == _DATA and stream in self._opened):
                self._opened.discard(stream)
                answer = _END_STREAM | _END_HEADERS
                self._transport.write(_frame(_HEADERS, answer, stream, self._answer))


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    )


def _literal(name: str, value: str) -> bytes:
    """HPACK's literal header field without indexing, new name, no Huffman coding."""
    return b"\x00" + _string(name.encode("ascii")) + _string(value.encode("ascii"))


def _string(data: bytes) -> bytes:
    """An HPACK string: its length as a 7-bit-prefix integer, then the bytes."""
    if len(data) < 0x7F:
        return bytes([len(data)]) + data
    rest, out = len(data) - 0x7F, bytearray([0x7F])
    while rest >= 0x80:
        out.append(rest & 0x7F | 0x80)
        rest >>= 7
    out.append(rest)
    return bytes(out) + data
