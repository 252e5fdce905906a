"""The Worker's heartbeats when many leases run at once (docs/worker.md, "Heartbeats"): one
timer serves them all, so each running lease with a TTL must still get its own beats, at its
own period, and a lease that ended, was aborted or has a long TTL must get none meanwhile.
Peers: the scripted fake Workers server of test_worker.py, on a real loopback port."""

from __future__ import annotations

import asyncio

from test_worker import Conn, fake, running

from cronoq.client import Lease, Worker
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from helpers.waiting import until


def beats(conn: Conn, lease: int, since: int = 0) -> int:
    """Heartbeats for `lease` among the messages received from the `since`-th on."""
    return sum(
        1
        for _, m in conn.received[since:]
        if m.HasField("heartbeat") and m.heartbeat.lease == lease
    )


async def test_one_timer_beats_each_running_lease_at_its_own_period() -> None:
    held = {1: asyncio.Event(), 2: asyncio.Event(), 3: asyncio.Event()}

    async def handler(lease: Lease) -> None:
        if lease.id in held:
            await held[lease.id].wait()

    async with fake() as f:
        w = Worker(f.address, "p", handler, slots=4)
        async with running(w):
            await w.wait_registered(3)
            conn = f.conns[0]
            await conn.lease(1, lease_ttl_s=300.0)  # first beat in 100 s: the timer's first aim
            await conn.lease(2, lease_ttl_s=0.3)  # in 0.1 s: the timer must be aimed earlier
            await conn.lease(4, lease_ttl_s=0.3)  # ends at once, before its first beat
            await until(lambda: 4 in conn.outcomes())
            await until(lambda: beats(conn, 2) >= 2)
            await conn.lease(3, lease_ttl_s=0.3)  # joins the running sweeps
            await until(lambda: beats(conn, 3) >= 2)
            aborted = len(conn.received)
            await conn.send(abort=pb.Abort(lease=2, reason="cancelled"))
            await until(lambda: beats(conn, 3, aborted) >= 3)
            for gate in held.values():
                gate.set()
            await until(lambda: {1, 3} <= conn.outcomes().keys())
    assert beats(conn, 1) == 0
    assert beats(conn, 4) == 0
    # at most the one beat already on its way as the abort was sent
    assert beats(conn, 2, aborted) <= 1
    assert [conn.outcomes()[n].WhichOneof("msg") for n in (1, 3, 4)] == ["complete"] * 3
