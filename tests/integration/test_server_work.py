"""Worker protocol v3 end to end in one process: a real listener (grpc.aio, and the native
transport when it is built: every test runs on each) with WorkService as the scheduler's
launcher, and raw workers speaking the generated stubs over real sockets."""

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
from helpers.transports import listening
from helpers.workers import Worker

pytestmark = pytest.mark.usefixtures("each_transport")  # every test, once per transport


def _add(svc: WorkService) -> Any:
    return lambda server: cronoq_pb2_grpc.add_WorkersServicer_to_server(svc, server)


async def unused(ctx: Any, payload: Any) -> None:
    raise AssertionError("remote pools never run in-process executors")


@asynccontextmanager
async def server(
    *, lease_ttl: float | None = None, register_timeout: float = 10.0, max_: int = 4
) -> AsyncIterator[tuple[cronoq.Scheduler, grpc.aio.Channel]]:
    svc = WorkService(
        pool_max={"p": max_},
        pool_slot_caps={"p": None},
        slot_cap=None,
        max_message_bytes=4 << 20,
        register_timeout=register_timeout,
    )
    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.0, jitter=False)
    sched = cronoq.Scheduler(
        [cronoq.Pool("p", unused, max=max_, lease_ttl=lease_ttl, retry=retry)], launcher=svc
    )
    async with (
        listening(_add(svc)) as port,
        sched,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield sched, channel


async def test_register_lease_complete() -> None:
    async with server(lease_ttl=30.0) as (sched, channel):
        w = Worker(channel)
        reg = await w.register(slots=9)
        assert (reg.worker_id, reg.slots, reg.protocol_version) == (1, 4, 3)  # capped by max
        assert reg.lease_ttl_s == 30.0 and reg.max_message_bytes == 4 << 20
        h = await sched.submit(
            b"payload", key="k", tags={"cronoq.content_type": "text/plain", "a": "1"}
        )
        lease = await w.lease()
        assert (lease.task_id, lease.attempt, lease.payload, lease.key) == (
            h.id,
            1,
            b"payload",
            "k",
        )
        assert lease.content_type == "text/plain" and dict(lease.tags) == {"a": "1"}
        assert lease.pool == "p" and lease.priority == pb.PRIORITY_NORMAL
        assert lease.lease_ttl_s == 30.0 and not lease.HasField("timeout_s")
        w.send(complete=pb.Complete(lease=lease.lease, output=b"out"))
        assert await asyncio.wait_for(h.result(), 2.0) == b"out"
        assert (await sched.snapshot()).pool("p").capacity == 4
        w.close()


async def test_failure_retries_on_the_next_attempt_and_permanent_fails() -> None:
    async with server() as (sched, channel):
        w = Worker(channel)
        await w.register(slots=1)
        h = await sched.submit(b"x")
        first = await w.lease()
        w.send(fail=pb.Fail(lease=first.lease, message="boom"))
        second = await w.lease()
        assert (second.task_id, second.attempt) == (first.task_id, 2)
        assert second.lease != first.lease
        w.send(fail=pb.Fail(lease=second.lease, message="bad" * 5000, permanent=True))
        with pytest.raises(cronoq.TaskFailed) as e:
            await asyncio.wait_for(h.result(), 2.0)
        assert e.value.status == "failed" and len(e.value.message) == 8192
        w.close()


async def test_nack_goes_to_another_worker_with_the_same_attempt() -> None:
    async with server() as (sched, channel):
        a = Worker(channel)
        await a.register(slots=1)
        h = await sched.submit(b"x")
        lease = await a.lease()
        b = Worker(channel)
        await b.register(slots=1)
        a.send(nack=pb.Nack(lease=lease.lease, reason="busy"))
        again = await b.lease()
        assert (again.lease, again.attempt, again.task_id) == (lease.lease, 1, lease.task_id)
        b.send(complete=pb.Complete(lease=again.lease, output=b"ok"))
        assert await asyncio.wait_for(h.result(), 2.0) == b"ok"
        a.close()
        b.close()


async def test_a_dropped_stream_retries_its_leases_on_another_worker() -> None:
    async with server() as (sched, channel):
        a = Worker(channel)
        await a.register(slots=1)
        h = await sched.submit(b"x")
        lease = await a.lease()
        a.call.cancel()  # the connection drops
        b = Worker(channel)
        await b.register(slots=1)
        again = await b.lease()
        assert (again.task_id, again.attempt) == (lease.task_id, 2)
        assert await sched.status(h.id) == "running"
        b.close()


async def test_lease_expiry_sends_an_abort_and_retries() -> None:
    async with server(lease_ttl=0.3) as (sched, channel):
        w = Worker(channel)
        await w.register(slots=1)
        await sched.submit(b"x")
        lease = await w.lease()
        msg = await w.recv(timeout=3.0)
        assert msg.WhichOneof("msg") == "abort"
        assert (msg.abort.lease, msg.abort.reason) == (lease.lease, "lease expired")
        retry = await w.lease()
        assert retry.attempt == 2
        w.send(complete=pb.Complete(lease=lease.lease))  # stale now: ignored
        w.close()
        assert (await sched.snapshot()).totals["lease_expiries"] == 1


async def test_cancel_sends_an_abort() -> None:
    async with server() as (sched, channel):
        w = Worker(channel)
        await w.register(slots=1)
        h = await sched.submit(b"x")
        lease = await w.lease()
        assert await sched.cancel(h.id)
        msg = await w.recv()
        assert (msg.abort.lease, msg.abort.reason) == (lease.lease, "cancelled")
        w.close()


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=1)), grpc.StatusCode.INVALID_ARGUMENT),
        (
            pb.WorkerMessage(register=pb.Register(pool="nope", slots=1, protocol_version=3)),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            pb.WorkerMessage(register=pb.Register(pool="p", slots=1, protocol_version=2)),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
    ],
)
async def test_bad_first_messages_are_refused(
    first: pb.WorkerMessage, code: grpc.StatusCode
) -> None:
    async with server() as (_, channel):
        call = cronoq_pb2_grpc.WorkersStub(channel).Work(iter([first]))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
        assert e.value.code() == code


async def test_register_must_come_in_time() -> None:
    async with server(register_timeout=0.2) as (_, channel):
        w = Worker(channel)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await w.call.read()
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        w.close()


async def test_set_slots_zero_drains_and_capacity_follows() -> None:
    async with server() as (sched, channel):
        w = Worker(channel)
        await w.register(slots=2)
        w.send(set_slots=pb.SetSlots(slots=0))
        await asyncio.sleep(0.1)
        h = await sched.submit(b"x")
        await asyncio.sleep(0.1)
        assert await sched.status(h.id) == "ready"
        assert (await sched.snapshot()).pool("p").capacity == 0
        w.send(set_slots=pb.SetSlots(slots=1))
        assert (await w.lease()).task_id == h.id
        w.close()


async def test_losing_the_leadership_sends_shutdown_not_leader(tmp_path: Any) -> None:
    import sqlite3
    import time

    from cronoq.server.app import BytesCodec

    svc = WorkService(
        pool_max={"p": 2}, pool_slot_caps={"p": None}, slot_cap=None, max_message_bytes=1 << 20
    )
    path = tmp_path / "q.db"
    store = cronoq.SqliteStore(path, lease_ttl=1.0, lease_renew=0.1, lock_poll=0.05)
    sched = cronoq.Scheduler(
        [cronoq.Pool("p", unused, max=2)], store=store, codec=BytesCodec(), launcher=svc
    )
    async with listening(_add(svc)) as port:
        await sched.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            w = Worker(channel)
            await w.register(slots=1)
            # another process takes the file over (as after this one was paused past its lease)
            db = sqlite3.connect(path)
            db.execute(
                "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'other', "
                "expires_unix_ns = ? WHERE id = 1",
                (int((time.time() + 60) * 1e9),),
            )
            db.commit()
            db.close()
            msg = await w.recv(timeout=3.0)
            assert msg.WhichOneof("msg") == "shutdown"
            assert msg.shutdown.not_leader
            assert msg.shutdown.reason == "this server is no longer the leader"
            assert await w.call.read() is grpc.aio.EOF  # and the stream ends
            with pytest.raises(cronoq.SchedulerError, match="fenced"):
                await sched.submit(b"x")


async def test_a_full_outbound_buffer_ends_that_stream() -> None:
    """The outbound buffer is bounded (2 x slots + 8). (A real gRPC client keeps reading its
    socket into its own buffer whatever the application does, so the overflow is driven here
    through the service's own send path.)"""
    from cronoq.server.services.worker_leases import RemoteWorker
    from cronoq.server.services.worker_stream import _Stream

    svc = WorkService(
        pool_max={"p": 4}, pool_slot_caps={"p": None}, slot_cap=None, max_message_bytes=1 << 20
    )
    w = RemoteWorker(1, "p", "w", {}, requested=1, granted=1, registered_at=0.0)
    st = svc._streams[w.id] = _Stream(w)
    assert st.limit == 2 * 1 + 8
    ping = pb.ServerMessage(abort=pb.Abort(lease=1, reason="x"))
    for _ in range(st.limit - 2):
        svc._send(w, [ping])
    svc._send(w, [ping, ping])  # a batch counts by its messages
    assert not st.overflowed and w.id in svc._streams and st.pending == st.limit
    svc._send(w, [ping])  # one too many: the stream ends instead of dropping a message
    assert st.overflowed and w.id not in svc._streams and st.cut
    assert st.queue.qsize() == 1 and st.queue.get_nowait() is None  # the writer stops at once
    # a batch that does not fit whole ends the stream too, even with room for part of it
    st = svc._streams[w.id] = _Stream(w)
    svc._send(w, [ping] * (st.limit - 1))
    svc._send(w, [ping, ping])
    assert st.overflowed and st.cut and w.id not in svc._streams
    assert st.queue.qsize() == 1 and st.queue.get_nowait() is None


async def test_raising_the_grant_grows_the_outbound_buffer() -> None:
    """The buffer follows the current grant: a worker that registers with one slot and then
    raises it to 16 gets 16 leases at once (more than the 2 x 1 + 8 of its first grant)
    without being cut off as a worker that does not read."""
    async with server(max_=16) as (sched, channel):
        w = Worker(channel)
        assert (await w.register(slots=1)).slots == 1
        for i in range(20):
            await sched.submit(b"t%d" % i)
        first = await w.lease()
        w.send(set_slots=pb.SetSlots(slots=16))
        leases = [first] + [await w.lease() for _ in range(15)]
        assert len({lease.lease for lease in leases}) == 16 > 1
        assert (await sched.snapshot()).pool("p").capacity == 16
        # the stream is still open and serving: a finished lease frees a slot for the next one
        w.send(complete=pb.Complete(lease=first.lease, output=b"ok"))
        assert (await w.lease()).task_id not in {lease.task_id for lease in leases}
        assert not w.call.done()
        w.close()
