"""The HTTP/1.1 side of the gRPC port: reading requests (keep-alive, chunked bodies, bounded
heads and bodies) from a connection's bytes, and writing answers."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

MAX_HEAD_BYTES = 64 * 1024  # request line and headers of one HTTP/1.1 request
RELAY_CHUNK = 256 * 1024


class Closed(Exception):
    """The client closed the connection (or sent what cannot be answered): close it too."""


class OverLimit(Exception):
    """A request whose body is over limits.max_http_body_bytes: answered, then closed."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("request body over the limit")
        self.headers = headers


class Reader(Protocol):
    async def read(self, n: int, /) -> bytes: ...


class Writer(Protocol):
    def write(self, data: bytes, /) -> None: ...

    async def drain(self) -> None: ...


@dataclass
class Request:
    verb: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class Input:
    """A connection's incoming bytes, starting with those read to tell HTTP/2 from HTTP/1.1."""

    def __init__(self, reader: Reader, head: bytes) -> None:
        self._reader = reader
        self._buf = bytearray(head)

    async def _more(self) -> None:
        data = await self._reader.read(RELAY_CHUNK)
        if not data:
            raise Closed
        self._buf += data

    async def until(self, separator: bytes, limit: int) -> bytes:
        while (at := self._buf.find(separator)) < 0:
            if len(self._buf) > limit:
                raise Closed
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
        with contextlib.suppress(Closed, ConnectionError, ssl.SSLError):
            while True:
                await self._more()


def head(status: int, headers: Mapping[str, str], *, close: bool) -> bytes:
    reason = {200: "OK", 204: "No Content"}.get(status, "")
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def send(
    writer: Writer,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    close: bool,
) -> None:
    writer.write(head(status, {**headers, "content-length": str(len(body))}, close=close) + body)
    await writer.drain()


async def read_request(source: Input, max_body: int) -> Request:
    """The next request; OverLimit when its body is over `max_body`, Closed at the end of
    the connection or for what is not HTTP/1.1."""
    head = (await source.until(b"\r\n\r\n", MAX_HEAD_BYTES)).decode("latin-1")
    line, *fields = head[:-4].split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Closed
    verb, path, version = parts
    headers: dict[str, str] = {}
    for field in fields:
        name, sep, value = field.partition(":")
        if not sep:
            raise Closed
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
                raise Closed from None
            if len(body) + size > max_body:
                raise OverLimit(headers)
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
            raise Closed from None
        if length > max_body:
            raise OverLimit(headers)
        data = await source.exactly(length) if length > 0 else b""
    return Request(verb, path, headers, data, keep_alive)
