"""A client that never reads its answers (docs/server.md, "Transports"), on each transport: a
raw HTTP/2 peer with a zero flow-control window (helpers/h2peer.py) asks for a task's 3 MiB
output many times at once on one connection. The server holds at most
limits.max_unsent_bytes_per_connection of answers for it (or one answer, if larger), refuses
the rest and then its new calls with RESOURCE_EXHAUSTED, serves other connections as before,
and lets go of every byte once the connection closes.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote

import grpc

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.config import load_config
from cronoq.server.inflight import UNREAD
from cronoq.server.wiring import build
from helpers.h2peer import H2Peer
from helpers.servers import PORT0, running_app
from helpers.waiting import until
from helpers.workers import Worker

OUTPUT = b"x" * (3 << 20)  # (grpc.aio clients take at most 4 MiB)
WAIT = "/cronoq.v1.Tasks/Wait"
CALLS = 20
BUDGET = 4096  # the least limits.max_unsent_bytes_per_connection: one answer at a time


def refused(peer: H2Peer, stream_id: int) -> bool:
    stream = peer.streams[stream_id]
    status = {**stream.headers, **stream.trailers}
    message = unquote(status.get("grpc-message", ""))
    return stream.ended and (status.get("grpc-status"), message) == ("8", UNREAD)


def held(peer: H2Peer, stream_id: int) -> bool:
    """Answered, its message waiting at the server for a window the peer never opens."""
    stream = peer.streams[stream_id]
    return bool(stream.headers) and not stream.ended and stream.reset is None


async def test_a_connection_that_never_reads_holds_one_budget(each_transport: str) -> None:
    text = (
        PORT0
        + f'transport = "{each_transport}"\n'
        + f"[limits]\nmax_unsent_bytes_per_connection = {BUDGET}\n"
        + '[[pools]]\nname = "p"\n'
    )
    async with running_app(build(load_config(text)), ready=True) as app:
        assert app.grpc_load is not None
        address = str(app.grpc_address)
        async with grpc.aio.insecure_channel(address) as channel:
            tasks = cronoq_pb2_grpc.TasksStub(channel)
            worker = Worker(channel)
            await worker.register()
            task = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p")))
            lease = await worker.lease()
            worker.send(complete=pb.Complete(lease=lease.lease, output=OUTPUT))
            wait = pb.WaitRequest(task=pb.TaskRef(id=task.id), timeout_s=5)
            assert (await tasks.Wait(wait)).output == OUTPUT

            peer = H2Peer(address, window=0)
            try:
                calls: list[int] = []

                def burst() -> None:
                    peer.handshake()
                    calls.extend(peer.open(WAIT, wait, end=True, send=False) for _ in range(CALLS))
                    peer.flush()

                    def all_ended_or_held() -> bool:
                        return all(refused(peer, c) or held(peer, c) for c in calls)

                    peer.until(all_ended_or_held, "every Wait answered or refused")

                await asyncio.to_thread(burst)
                assert [held(peer, c) for c in calls].count(True) == 1
                assert len(OUTPUT) <= app.grpc_load.unsent_bytes <= len(OUTPUT) + 64

                def one_more() -> Any:
                    late = peer.open(WAIT, wait, end=True)
                    peer.until(lambda: peer.streams[late].ended, "the late Wait's end")
                    return refused(peer, late)

                assert await asyncio.to_thread(one_more)
                # another connection is served as ever
                assert (await tasks.Wait(wait)).output == OUTPUT
            finally:
                peer.close()
            await until(lambda: app.grpc_load.unsent_bytes == 0, 5.0, "the held bytes let go")
            worker.close()
