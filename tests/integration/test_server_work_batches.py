"""What a worker sends together reaches the server together: a raw HTTP/2 peer
(helpers/h2peer.py) writes several WorkerMessages in one socket write, so that the server reads
them in one wake (on the native transport, one drain of the transport's events). They are
handled in the order sent, a report on a lease the worker does not hold is counted and
skipped without disturbing the rest, and a stream reset in the same write leaves no task
behind. The leases one launch gives a worker come as one hand-over, in the engine's order.
Every test runs on each transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

import cronoq
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.services.worker_stream import WorkService
from helpers.h2peer import H2Peer, frame
from helpers.transports import listening
from helpers.waiting import until
from helpers.workers import Worker

pytestmark = pytest.mark.usefixtures("each_transport")

WORK = "/cronoq.v1.Workers/Work"


async def unused(ctx: Any, payload: Any) -> None:
    raise AssertionError("remote pools never run in-process executors")


@asynccontextmanager
async def server(max_: int = 8) -> AsyncIterator[tuple[cronoq.Scheduler, WorkService, str]]:
    svc = WorkService(
        pool_max={"p": max_}, pool_slot_caps={"p": None}, slot_cap=None, max_message_bytes=1 << 20
    )
    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.0, jitter=False)
    sched = cronoq.Scheduler(
        [cronoq.Pool("p", unused, max=max_, lease_ttl=30.0, retry=retry)], launcher=svc
    )
    add = lambda s: cronoq_pb2_grpc.add_WorkersServicer_to_server(svc, s)  # noqa: E731
    async with listening(add) as port, sched:
        yield sched, svc, f"127.0.0.1:{port}"


def register(slots: int) -> pb.WorkerMessage:
    return pb.WorkerMessage(
        register=pb.Register(pool="p", slots=slots, worker_name="raw", protocol_version=3)
    )


class RawWorker:
    """A worker on a raw HTTP/2 connection: `together` writes its messages in one write."""

    def __init__(self, address: str) -> None:
        self.peer = H2Peer(address)
        self.stream = 0

    async def register(self, slots: int) -> pb.Registered:
        def go() -> pb.Registered:
            self.peer.handshake()
            self.stream = self.peer.open(WORK, register(slots))
            msg: pb.ServerMessage = self.peer.read(self.stream, pb.ServerMessage)
            return msg.registered

        return await asyncio.to_thread(go)

    async def leases(self, n: int) -> list[pb.Lease]:
        def go() -> list[pb.Lease]:
            msgs = [self.peer.read(self.stream, pb.ServerMessage) for _ in range(n)]
            assert all(m.WhichOneof("msg") == "lease" for m in msgs), msgs
            return [m.lease for m in msgs]

        return await asyncio.to_thread(go)

    async def together(self, *messages: pb.WorkerMessage, reset: bool = False) -> None:
        """Every message (and with `reset`, the call's RST_STREAM) in one socket write."""
        conn = self.peer.conn
        for m in messages:
            conn.send_data(self.stream, frame(m))
        if reset:
            self.peer.reset(self.stream, send=False)
        await asyncio.to_thread(self.peer.flush)

    def close(self) -> None:
        self.peer.close()


def complete(lease: int) -> pb.WorkerMessage:
    return pb.WorkerMessage(complete=pb.Complete(lease=lease, output=b"ok"))


async def test_messages_written_together_are_handled_in_order() -> None:
    """A nack then a complete of the same lease: handled in that order, the nack hands the
    attempt back (no other worker: it fails as retryable and runs again) and the complete is
    then stale. The other leases of the same write complete as usual."""
    async with server() as (sched, _, address):
        w = RawWorker(address)
        try:
            assert (await w.register(slots=3)).slots == 3
            handles = [await sched.submit(b"t%d" % i) for i in range(3)]
            first, *rest = await w.leases(3)
            await w.together(
                pb.WorkerMessage(nack=pb.Nack(lease=first.lease, reason="not now")),
                complete(first.lease),
                *(complete(lease.lease) for lease in rest),
            )
            again = (await w.leases(1))[0]
            assert (again.task_id, again.attempt) == (first.task_id, 2)
            for h in handles[1:]:
                assert (await h.result()) == b"ok"
            snap = await sched.snapshot()
            assert snap.totals["stale_completions"] == 1
            assert snap.totals["succeeded"] == 2
            await w.together(complete(again.lease))
            assert (await handles[0].result()) == b"ok"
        finally:
            w.close()


async def test_a_report_on_an_unknown_lease_amid_a_write_is_skipped() -> None:
    async with server() as (sched, svc, address):
        w = RawWorker(address)
        try:
            await w.register(slots=4)
            handles = [await sched.submit(b"t%d" % i) for i in range(4)]
            leases = await w.leases(4)
            unknown = max(lease.lease for lease in leases) + 1000
            await w.together(
                complete(leases[0].lease),
                complete(unknown),
                pb.WorkerMessage(fail=pb.Fail(lease=unknown, message="x")),
                pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=unknown)),
                *(complete(lease.lease) for lease in leases[1:]),
            )
            assert [await h.result() for h in handles] == [b"ok"] * 4
            snap = await sched.snapshot()
            assert snap.totals["stale_completions"] == 2  # (a heartbeat is not counted)
            assert [i.busy for i in svc.worker_infos()] == [0]  # still connected, nothing held
        finally:
            w.close()


async def test_a_stream_reset_in_the_same_write_leaves_no_task_behind() -> None:
    """Completes and the reset of their stream in one write: whatever of them the server
    handled before it saw the reset, every task either succeeded or runs again on another
    worker, the reset worker is gone, and no stream of it is left."""
    async with server() as (sched, svc, address):
        w = RawWorker(address)
        try:
            await w.register(slots=4)
            handles = [await sched.submit(b"t%d" % i) for i in range(4)]
            leases = await w.leases(4)
            await w.together(*(complete(lease.lease) for lease in leases[:2]), reset=True)
            await until(lambda: not svc.worker_infos(), 5.0, "the reset worker to be dropped")
            assert not svc._streams
        finally:
            w.close()
        async with grpc.aio.insecure_channel(address) as channel:
            other = Worker(channel)
            await other.register(slots=4)
            for _ in range(4 - (await sched.snapshot()).totals["succeeded"]):
                lease = await other.lease()
                assert lease.attempt == 2
                other.send(complete=pb.Complete(lease=lease.lease, output=b"ok"))
            assert [await h.result() for h in handles] == [b"ok"] * 4
            other.close()


async def test_one_launch_reaches_a_worker_as_one_hand_over_in_order() -> None:
    """Tasks queued before any worker: the worker's register starts them all in one turn, and
    their leases arrive in the engine's order (by priority, then submission)."""
    async with server() as (sched, _, address):
        low = [await sched.submit(b"low%d" % i, priority=cronoq.Priority.LOW) for i in range(3)]
        high = [await sched.submit(b"high%d" % i, priority=cronoq.Priority.HIGH) for i in range(3)]
        w = RawWorker(address)
        try:
            await w.register(slots=6)
            leases = await w.leases(6)
            assert [lease.task_id for lease in leases] == [h.id for h in high + low]
            assert [lease.payload for lease in leases[:3]] == [b"high0", b"high1", b"high2"]
        finally:
            w.close()
