"""The Tasks and Admin services over real gRPC channels, on a real Scheduler.

Each test starts a listener (grpc.aio, and the native transport when it is built: every test
runs on each) on a free loopback port with the servicers over a Scheduler
whose pools run in-process executors, and calls it through the generated stubs: every method, the
status codes of docs/reference/errors.md that apply without auth and shards, limits, paging, Watch
filters, wait timeouts, batch atomicity, recurring schedules and snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import cronoq
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.app import BytesCodec
from cronoq.server.config import LimitsSettings
from cronoq.server.services.tasks import AdminService, TasksService
from helpers.transports import listening

Code = grpc.StatusCode
pytestmark = pytest.mark.usefixtures("each_transport")  # every test, once per transport


async def echo(ctx: cronoq.TaskContext, payload: bytes) -> Any:
    """b"fail" fails for good, b"none" returns None, anything else comes back unchanged."""
    if payload == b"fail":
        raise cronoq.Permanent("bad")
    if payload == b"none":
        return None
    await asyncio.sleep(0.01)
    return payload


async def hang(ctx: cronoq.TaskContext, payload: bytes) -> None:
    await asyncio.Event().wait()


@dataclass
class Env:
    sched: cronoq.Scheduler
    tasks: cronoq_pb2_grpc.TasksStub
    admin: cronoq_pb2_grpc.AdminStub


@contextlib.asynccontextmanager
async def serve(
    limits: LimitsSettings | None = None,
    workers: Callable[[], Sequence[pb.WorkerInfo]] = list,
    extra_pools: Sequence[cronoq.Pool] = (),
    store: cronoq.store.Store | None = None,
) -> AsyncIterator[Env]:
    """Pools: `default` (echo, 4 slots) and `slow` (1 slot that never frees), plus extras. With
    `store`, the scheduler keeps no finished task in memory (everything is read back from it)."""
    limits = limits or LimitsSettings()
    pools = [
        cronoq.Pool("default", echo, max=4, autoscale=False),
        cronoq.Pool("slow", hang, max=1, autoscale=False),
        *extra_pools,
    ]
    durable: dict[str, Any] = {}
    if store is not None:
        durable = {"store": store, "codec": BytesCodec(), "retention_max": 0}
    sched = cronoq.Scheduler(
        pools,
        [cronoq.Resource.semaphore("sem", 2)],
        emit_transitions=True,
        shutdown_grace=0,
        **durable,
    )
    await sched.start()
    tasks, admin = TasksService(sched, limits), AdminService(sched, limits, workers)

    def add(server: Any) -> None:
        cronoq_pb2_grpc.add_TasksServicer_to_server(tasks, server)
        cronoq_pb2_grpc.add_AdminServicer_to_server(admin, server)

    try:
        async with (
            listening(add, limits=limits) as port,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch,
        ):
            yield Env(sched, cronoq_pb2_grpc.TasksStub(ch), cronoq_pb2_grpc.AdminStub(ch))
    finally:
        await sched.shutdown(0)


async def test_get_and_wait_by_id_read_a_finished_task_from_the_store(tmp_path: Path) -> None:
    # Finished tasks outlive memory in the store (docs/configuration.md, "[store]"): by id,
    # Get and Wait read them back, with the output; a key is deduplicated only in memory.
    async with serve(store=cronoq.SqliteStore(tmp_path / "q.db")) as env:
        t = env.tasks
        sub = await t.Submit(pb.SubmitRequest(task=spec(b"kept", key="k")))
        # until memory forgot it and its finished row is committed
        while await env.sched.status(sub.id) is not None or not await env.sched.stored(sub.id):
            await asyncio.sleep(0.01)
        info = await t.Get(pb.GetRequest(task=ref(sub.id)))
        assert (info.id, info.status, info.key, info.attempt) == (
            sub.id,
            pb.TASK_STATUS_SUCCEEDED,
            "k",
            1,
        )
        assert info.output_available and info.max_attempts == 3
        res = await t.Wait(pb.WaitRequest(task=ref(sub.id), timeout_s=5))
        assert res.status == pb.TASK_STATUS_SUCCEEDED and res.output == b"kept"
        assert await code_of(t.Get(pb.GetRequest(task=ref("k")))) is Code.NOT_FOUND
        assert await code_of(t.Get(pb.GetRequest(task=ref(sub.id + 1)))) is Code.NOT_FOUND


async def code_of(call: Awaitable[Any]) -> Code:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code()


def spec(payload: bytes = b"x", **fields: Any) -> pb.TaskSpec:
    fields.setdefault("content_type", "application/octet-stream")
    return pb.TaskSpec(payload=payload, **fields)


def ref(target: int | str) -> pb.TaskRef:
    return pb.TaskRef(key=target) if isinstance(target, str) else pb.TaskRef(id=target)


# --- Submit, Get, Wait -------------------------------------------------------------------------


async def test_submit_wait_get_and_duplicates() -> None:
    async with serve() as env:
        t = env.tasks
        done = await t.Submit(
            pb.SubmitRequest(task=spec(b"hello", key="k1", priority=pb.PRIORITY_HIGH), wait=True)
        )
        assert done.id > 0 and not done.duplicate
        assert done.result.status == pb.TASK_STATUS_SUCCEEDED
        assert done.result.HasField("output") and done.result.output == b"hello"
        assert done.result.output_available

        dup = await t.Submit(pb.SubmitRequest(task=spec(b"other", key="k1")))
        assert dup.id == done.id and dup.duplicate

        info = await t.Get(pb.GetRequest(task=ref("k1")))
        assert (info.id, info.key, info.pool, info.attempt) == (done.id, "k1", "default", 1)
        assert info.status == pb.TASK_STATUS_SUCCEEDED and info.output_available
        assert info.priority == pb.PRIORITY_HIGH and info.max_attempts == 3
        assert info.created_unix_ns <= info.finished_unix_ns <= time.time_ns()

        plain = await t.Submit(pb.SubmitRequest(task=spec(b"none")))
        res = await t.Wait(pb.WaitRequest(task=ref(plain.id), timeout_s=5))
        assert res.HasField("output") and res.output == b""
        assert (await t.Get(pb.GetRequest(task=ref(plain.id)))).priority == pb.PRIORITY_NORMAL

        failed = await t.Submit(pb.SubmitRequest(task=spec(b"fail"), wait=True))
        assert failed.result.status == pb.TASK_STATUS_FAILED
        assert not failed.result.HasField("output") and "bad" in failed.result.message


async def test_submit_options_reach_the_task() -> None:
    async with serve() as env:
        sub = await env.tasks.Submit(
            pb.SubmitRequest(
                task=spec(
                    kind="mail",
                    tenant="t1",
                    timeout_s=5,
                    deadline_in_s=60,
                    tags={"a": "1"},
                    retry=pb.RetryPolicy(max_attempts=7),
                ),
                wait=True,
            ),
            metadata=[("traceparent", "00-abc-def-01")],
        )
        info = await env.tasks.Get(pb.GetRequest(task=ref(sub.id)))
        assert (info.kind, info.tenant, info.max_attempts) == ("mail", "t1", 7)
        rec = env.sched._live().engine.lookup(sub.id)
        assert rec is not None and rec.tags is not None
        assert rec.tags["cronoq.content_type"] == "application/octet-stream"
        assert rec.tags["traceparent"] == "00-abc-def-01" and rec.tags["a"] == "1"
        assert rec.retry is not None and rec.retry.initial_backoff == 1.0  # pool default


async def test_submit_invalid_input() -> None:
    limits = LimitsSettings(max_key_len=8, max_tags=2, max_message_bytes=64 * 1024)
    async with serve(limits) as env:

        async def submit(**fields: Any) -> Code:
            return await code_of(env.tasks.Submit(pb.SubmitRequest(task=spec(**fields))))

        invalid = Code.INVALID_ARGUMENT
        assert await submit(key="a\0b") == invalid
        assert await submit(key="123456789") == invalid
        assert await submit(tags={"a": "1", "b": "2", "c": "3"}) == invalid
        assert await submit(tags={"cronoq.x": "1"}) == invalid
        assert await submit(timeout_s=math.nan) == invalid
        assert await submit(timeout_s=-1) == invalid
        assert await submit(start_in_s=1, start_unix_ns=1) == invalid
        assert await submit(priority=9) == invalid
        assert await submit(retry=pb.RetryPolicy(max_attempts=1, multiplier=-1)) == invalid
        assert await submit(tolerance_s=1) == invalid
        assert await submit(resources={"sem": 3}) == invalid
        assert await submit(content_type="x" * 129) == invalid
        assert await submit(deps=[pb.Dep(target=pb.TaskRef())]) == invalid
        assert await submit(pool="nope") == Code.NOT_FOUND
        assert await submit(resources={"nope": 1}) == Code.NOT_FOUND
        assert await submit(deps=[pb.Dep(target=ref("missing"))]) == Code.NOT_FOUND
        assert await submit(payload=b"x" * (64 * 1024 + 1)) == Code.OUT_OF_RANGE
        assert await code_of(env.tasks.Submit(pb.SubmitRequest())) == invalid
        assert not env.sched._live().engine.tasks  # nothing was admitted


async def test_full_pools_and_total_bound() -> None:
    pools = [
        cronoq.Pool("bounded", hang, max=1, autoscale=False, max_pending=1),
        cronoq.Pool("strict", hang, max=1, autoscale=False, max_pending=1, overflow="reject"),
    ]
    async with serve(LimitsSettings(max_pending_total=4), extra_pools=pools) as env:
        # overflow "wait" holds the call until room or its deadline; "reject" refuses at once
        for pool, code in (
            ("bounded", Code.DEADLINE_EXCEEDED),
            ("strict", Code.RESOURCE_EXHAUSTED),
        ):
            for _ in range(2):  # one runs, one waits
                await env.tasks.Submit(pb.SubmitRequest(task=spec(pool=pool)))
            full = env.tasks.Submit(pb.SubmitRequest(task=spec(pool=pool)), timeout=0.3)
            assert await code_of(full) == code
        for _ in range(3):  # pending: 1 + 1 above, 2 here
            await env.tasks.Submit(pb.SubmitRequest(task=spec(pool="slow")))
        over = env.tasks.Submit(pb.SubmitRequest(task=spec()))
        assert await code_of(over) == Code.RESOURCE_EXHAUSTED


async def test_wait_timeouts_and_not_found() -> None:
    async with serve(LimitsSettings(max_wait_s=0.3)) as env:
        t = env.tasks
        sub = await t.Submit(pb.SubmitRequest(task=spec(pool="slow")))
        started = time.monotonic()
        assert await code_of(t.Wait(pb.WaitRequest(task=ref(sub.id), timeout_s=0.1))) == (
            Code.DEADLINE_EXCEEDED
        )
        assert await code_of(t.Wait(pb.WaitRequest(task=ref(sub.id), timeout_s=30))) == (
            Code.DEADLINE_EXCEEDED
        )
        assert time.monotonic() - started < 20  # capped by max_wait_s, not 30 s
        waiting = t.Submit(pb.SubmitRequest(task=spec(pool="slow"), wait=True, wait_timeout_s=0.1))
        assert await code_of(waiting) == Code.DEADLINE_EXCEEDED
        listed = await t.ListTasks(pb.ListTasksRequest(pools=["slow"]))
        assert [i.status for i in listed.tasks] == [pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_READY]
        assert await code_of(t.Wait(pb.WaitRequest(task=ref(999999), timeout_s=1))) == (
            Code.NOT_FOUND
        )
        assert await code_of(t.Get(pb.GetRequest(task=ref(999999)))) == Code.NOT_FOUND
        assert await code_of(t.Get(pb.GetRequest(task=pb.TaskRef()))) == Code.INVALID_ARGUMENT
        bad = t.Wait(pb.WaitRequest(task=ref(sub.id), timeout_s=math.inf))
        assert await code_of(bad) == Code.INVALID_ARGUMENT


# --- SubmitBatch -------------------------------------------------------------------------------


async def test_batch_orders_and_links_tasks() -> None:
    async with serve() as env:
        t = env.tasks
        batch = await t.SubmitBatch(
            pb.SubmitBatchRequest(
                tasks=[spec(b"a", key="a"), spec(b"b", key="b", deps=[pb.Dep(target=ref("a"))])]
            )
        )
        a, b = batch.tasks
        assert b.id > a.id and not a.duplicate
        rb = await t.Wait(pb.WaitRequest(task=ref(b.id), timeout_s=5))
        assert rb.status == pb.TASK_STATUS_SUCCEEDED
        again = await t.SubmitBatch(pb.SubmitBatchRequest(tasks=[spec(key="a"), spec(key="c")]))
        assert [r.duplicate for r in again.tasks] == [True, False]


async def test_batch_is_atomic() -> None:
    async with serve(LimitsSettings(max_tasks_per_batch=3)) as env:
        t = env.tasks

        async def batch(*specs: pb.TaskSpec) -> Code:
            return await code_of(t.SubmitBatch(pb.SubmitBatchRequest(tasks=specs)))

        assert await batch(spec(key="x"), spec(key="x")) == Code.INVALID_ARGUMENT
        assert await batch(*(spec(key=f"n{i}") for i in range(4))) == Code.INVALID_ARGUMENT
        assert await batch(spec(key="y"), spec(key="z", pool="nope")) == Code.NOT_FOUND
        assert await batch(spec(key="y"), spec(key="z", tags={"": "v"})) == Code.INVALID_ARGUMENT
        assert not env.sched._live().engine.tasks


# --- Cancel ------------------------------------------------------------------------------------


async def test_cancel() -> None:
    async with serve() as env:
        t = env.tasks
        await t.Submit(pb.SubmitRequest(task=spec(pool="slow")))  # takes the only slot
        queued = await t.Submit(pb.SubmitRequest(task=spec(pool="slow", key="q")))
        assert (await t.Cancel(pb.CancelRequest(task=ref("q")))).cancelled
        res = await t.Wait(pb.WaitRequest(task=ref(queued.id)))
        assert res.status == pb.TASK_STATUS_CANCELLED and not res.HasField("output")
        assert not (await t.Cancel(pb.CancelRequest(task=ref(queued.id)))).cancelled
        for unknown in (999999, "nobody"):  # as if it had ended
            assert not (await t.Cancel(pb.CancelRequest(task=ref(unknown)))).cancelled


# --- ListTasks ---------------------------------------------------------------------------------


async def test_list_tasks_pages_and_filters() -> None:
    async with serve(LimitsSettings(max_list=3)) as env:
        t = env.tasks
        ids = [(await t.Submit(pb.SubmitRequest(task=spec(), wait=True))).id for _ in range(5)]
        slow = (await t.Submit(pb.SubmitRequest(task=spec(pool="slow")))).id

        seen, after, pages = [], 0, 0
        while True:
            page = await t.ListTasks(pb.ListTasksRequest(pools=["default"], after=after, limit=2))
            seen += [i.id for i in page.tasks]
            pages += 1
            if not page.next_after:
                break
            assert page.next_after == page.tasks[-1].id
            after = page.next_after
        assert seen == ids and pages == 3

        capped = await t.ListTasks(pb.ListTasksRequest(limit=1000))
        assert [i.id for i in capped.tasks] == ids[:3] and capped.next_after == ids[2]
        running = await t.ListTasks(pb.ListTasksRequest(statuses=[pb.TASK_STATUS_RUNNING]))
        assert [i.id for i in running.tasks] == [slow] and running.next_after == 0
        bad = t.ListTasks(pb.ListTasksRequest(statuses=[pb.TASK_STATUS_UNSPECIFIED]))
        assert await code_of(bad) == Code.INVALID_ARGUMENT


# --- Watch -------------------------------------------------------------------------------------


async def collect(call: Any, n: int) -> list[pb.StatusEvent]:
    out = []
    async for ev in call:
        out.append(ev)
        if len(out) == n:
            call.cancel()
            break
    return out


async def test_watch_filters() -> None:
    async with serve() as env:
        t = env.tasks
        by_key = t.Watch(pb.WatchRequest(keys=["w"], all_transitions=True))
        by_pool = t.Watch(pb.WatchRequest(pools=["default"]))
        # Both streams are open once a task's events arrive on them.
        await t.Submit(pb.SubmitRequest(task=spec(pool="slow")))
        await asyncio.sleep(0.2)
        sub = await t.Submit(pb.SubmitRequest(task=spec(key="w"), wait=True))
        by_id = t.Watch(pb.WatchRequest(ids=[sub.id + 1]))
        await asyncio.sleep(0.2)
        other = await t.Submit(pb.SubmitRequest(task=spec(), wait=True))
        assert other.id == sub.id + 1

        events = await collect(by_key, 4)
        assert [e.status for e in events] == [
            pb.TASK_STATUS_BLOCKED,
            pb.TASK_STATUS_READY,
            pb.TASK_STATUS_RUNNING,
            pb.TASK_STATUS_SUCCEEDED,
        ]
        assert events[2].attempt == 1 and {e.id for e in events} == {sub.id}
        assert events[-1].at_unix_ns <= time.time_ns() and events[-1].key == "w"
        pooled = await collect(by_pool, 2)  # terminal only, no event of pool "slow"
        assert [(e.id, e.status) for e in pooled] == [
            (sub.id, pb.TASK_STATUS_SUCCEEDED),
            (other.id, pb.TASK_STATUS_SUCCEEDED),
        ]
        assert [e.id for e in await collect(by_id, 1)] == [other.id]


async def test_watch_and_wait_end_unavailable_when_the_scheduler_stops() -> None:
    async with serve() as env:
        t = env.tasks
        sub = await t.Submit(pb.SubmitRequest(task=spec(pool="slow")))
        watch = t.Watch(pb.WatchRequest())
        wait = asyncio.ensure_future(t.Wait(pb.WaitRequest(task=ref(sub.id), timeout_s=5)))
        await asyncio.sleep(0.2)
        await env.sched.shutdown(0)
        assert await code_of(wait) == Code.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in watch:
                pass
        assert err.value.code() == Code.UNAVAILABLE
        assert await code_of(t.Submit(pb.SubmitRequest(task=spec()))) == Code.UNAVAILABLE
        assert await code_of(t.Get(pb.GetRequest(task=ref(sub.id)))) == Code.UNAVAILABLE
        assert await code_of(env.admin.Snapshot(pb.Empty())) == Code.UNAVAILABLE


# --- Admin -------------------------------------------------------------------------------------


def worker(wid: int, slots: int, busy: int, **labels: str) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        id=wid, name=f"w{wid}", pool="default", labels=labels, slots=slots, busy=busy
    )


async def test_snapshot_and_workers() -> None:
    workers = [worker(1, 4, 1), worker(2, 2, 0, gpu="a100"), worker(3, 3, 2, gpu="a100")]
    async with serve(workers=lambda: workers) as env:
        t = env.tasks
        for _ in range(3):
            await t.Submit(pb.SubmitRequest(task=spec(), wait=True))
        await t.Submit(pb.SubmitRequest(task=spec(pool="slow")))
        for _ in range(2):
            await t.Submit(pb.SubmitRequest(task=spec(pool="slow", priority=pb.PRIORITY_HIGH)))
        snap = await env.admin.Snapshot(pb.Empty())
        assert snap.totals.submitted == 6 and snap.totals.succeeded == 3
        assert snap.totals.dispatched == 4 and snap.running == 1 and snap.pending == 2
        assert snap.live_tasks == 3 and snap.workers_connected == 3
        by_name = {p.name: p for p in snap.pools}
        assert list(by_name["slow"].pending_by_class) == [0, 2, 0, 0]
        default = by_name["default"]
        assert (default.capacity, default.desired, default.succeeded) == (4, 4, 3)
        assert default.workers_connected == 3
        groups = {tuple(sorted(g.labels.items())): (g.capacity, g.busy) for g in default.groups}
        assert groups == {(): (4, 1), (("gpu", "a100"),): (5, 2)}
        listed = await env.admin.ListWorkers(pb.Empty())
        assert list(listed.workers) == workers


async def test_recurring_add_list_remove() -> None:
    async with serve() as env:
        a = env.admin
        await a.AddRecurring(
            pb.RecurringRequest(
                name="r1", cron="* * * * * *", template=spec(key="tick", kind="k"), overlap=0
            )
        )
        await a.AddRecurring(
            pb.RecurringRequest(
                name="r0",
                cron="0 0 * * *",
                tz="Europe/Paris",
                template=spec(pool="slow", deadline_in_s=5),
                overlap=pb.OVERLAP_QUEUE,
            )
        )
        listed = (await a.ListRecurring(pb.Empty())).schedules
        assert [s.name for s in listed] == ["r0", "r1"]
        r0, r1 = listed
        assert (r0.tz, r0.pool, r0.overlap) == ("Europe/Paris", "slow", pb.OVERLAP_QUEUE)
        assert (r1.tz, r1.kind, r1.overlap, r1.cron) == ("", "k", pb.OVERLAP_SKIP, "* * * * * *")
        assert r1.next_unix_ns > time.time_ns() - 10**9
        deadline = time.monotonic() + 4
        while not r1.HasField("last_task_id") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            r1 = (await a.ListRecurring(pb.Empty())).schedules[1]
        info = await env.tasks.Get(pb.GetRequest(task=ref(r1.last_task_id)))
        assert info.key.startswith("tick@") and info.key.endswith("Z")

        assert (await a.RemoveRecurring(pb.RemoveRecurringRequest(name="r1"))).removed
        assert not (await a.RemoveRecurring(pb.RemoveRecurringRequest(name="r1"))).removed
        assert [s.name for s in (await a.ListRecurring(pb.Empty())).schedules] == ["r0"]


async def test_recurring_invalid() -> None:
    async with serve() as env:

        async def add(**fields: Any) -> Code:
            req = pb.RecurringRequest(**{"name": "r", "cron": "* * * * *", **fields})
            return await code_of(env.admin.AddRecurring(req))

        invalid = Code.INVALID_ARGUMENT
        assert await add(cron="not a cron") == invalid
        assert await add(cron="*" + " *" * 200) == invalid
        assert await add(name="") == invalid
        assert await add(tz="Mars/Base") == invalid
        assert await add(template=spec(deps=[pb.Dep(target=ref("x"))])) == invalid
        assert await add(template=spec(start_in_s=1)) == invalid
        assert await add(template=spec(deadline_unix_ns=1)) == invalid
        assert await add(overlap=17) == invalid
        assert await add(template=spec(pool="nope")) == invalid
        assert not (await env.admin.ListRecurring(pb.Empty())).schedules
