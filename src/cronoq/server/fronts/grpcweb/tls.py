"""TLS on the gRPC port with gRPC-Web on (docs/grpc-web.md, "TLS"): the ClientHello read and
parsed before anything is answered (its ALPN decides between the relay and gRPC-Web), and
`TlsEnd`, TLS ended here for the connections served as HTTP/1.1."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Callable, Mapping
from typing import TypeAlias, TypeVar

from ...auth import certificate_dns_names
from .http1 import RELAY_CHUNK, Closed

MAX_HELLO_BYTES = 64 * 1024  # the TLS records read for one ClientHello
_RECORD = struct.Struct(">BHH")  # a TLS record header: content type, version, length
_HANDSHAKE = 22  # the content type of handshake records
_CLIENT_HELLO = 1
_ALPN = 16  # the extension type of application_layer_protocol_negotiation

_T = TypeVar("_T")
Peer: TypeAlias = "Mapping[str, list[bytes]]"
"""What grpcio's `auth_context()` would say of a call's client certificate (auth.py reads it)."""


async def read_hello(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
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


class TlsEnd:
    """TLS ended here on a connection whose ClientHello the front has already read (asyncio
    cannot start TLS over bytes its stream consumed): an ssl.SSLObject between memory buffers,
    fed from the connection and flushed to it. A reader and writer for `http1.Input` and the
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
                    raise Closed from None
                self._incoming.write(data)
            else:
                self._flush()
                return result

    def _flush(self) -> None:
        if pending := self._outgoing.read():
            self._writer.write(pending)
