"""Native gRPC on the gRPC-Web port: a connection that opens with the HTTP/2 preface (or offers
only `h2` over TLS) is copied byte for byte to grpcio's internal port, both ways."""

from __future__ import annotations

import asyncio
import contextlib

from ...config import SocketAddress
from .http1 import RELAY_CHUNK


async def relay(
    head: bytes,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    internal: SocketAddress,
) -> None:
    """Both directions copied as they come, `head` (what was read to decide) first, until
    either side closes."""
    inner_reader, inner_writer = await asyncio.open_connection(
        internal.host, internal.port, limit=RELAY_CHUNK
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


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(RELAY_CHUNK):
            sink.write(data)
            await sink.drain()
