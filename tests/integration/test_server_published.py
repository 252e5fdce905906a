"""Answers a program written against the published cronoq-server 0.2.1 relies on, on the real
`cronoq-server` process (one per module): one test per case where this server once answered
otherwise. The codes are those of docs/reference/errors.md, "gRPC status codes"; the inputs
those of docs/server-api.md, "Input rules"; the worker cases docs/protocol.md, "Opening".

The server has no pool named `default`, so a task that names no pool has nowhere to go. Tests
share the server: each uses its own pools or keys and cancels what it leaves pending.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cronoq.client import Client, ClientError
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.convert import is_occurrence_key
from helpers import workers
from helpers.auth import AUTH, Stubs, connect, md, ref, token
from helpers.servers import PORT0, Serving, serving_process

Code = grpc.StatusCode

MAX_MESSAGE = 65536
# a safety net for waits on the server, never a wait in itself: a busy machine may be slow
# (below the 10 s every async test gets in tests/integration/conftest.py)
PATIENCE = 8.0
BACKOFF_0 = "retry = { max_attempts = 5, initial_backoff_s = 0, jitter = true }\n"
POOLS = "".join(
    f'[[pools]]\nname = "{name}"\n{extra}'
    for name, extra in [
        ("a", ""),  # "a" and "b" are the pools of the scoped tokens (helpers.auth)
        ("b", ""),
        ("jobs", ""),
        ("tick", ""),
        ("retry", BACKOFF_0),  # no wait between attempts, unless the task says otherwise
        ("zero", ""),
        ("proto", ""),
        ("big", ""),
    ]
)
CONFIG = (
    PORT0
    + f"[limits]\nmax_message_bytes = {MAX_MESSAGE}\n"
    + POOLS
    + '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 2\n'
    + AUTH
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    with serving_process(tmp_path_factory.mktemp("published"), CONFIG) as serving:
        yield serving


class AuthWorker(workers.AuthWorker):
    """helpers.workers.AuthWorker (the worker token) that waits up to PATIENCE for what the
    server sends."""

    async def recv(self, timeout: float = PATIENCE) -> pb.ServerMessage:
        return await super().recv(timeout)

    async def lease(self, timeout: float = PATIENCE) -> pb.Lease:
        return await super().lease(timeout)


def spec(pool: str | None = "jobs", **fields: Any) -> pb.TaskSpec:
    if pool is not None:
        fields["pool"] = pool
    fields.setdefault("payload", b"x")
    return pb.TaskSpec(**fields)


async def refused(call: Any) -> tuple[Code, str]:
    code: Code = await call.code()
    details: str = await call.details()
    return code, details


async def submit(s: Stubs, task: pb.TaskSpec, who: str = "client") -> int:
    return (await s.tasks.Submit(pb.SubmitRequest(task=task), metadata=md(who))).id


async def cancel(s: Stubs, *targets: int | str) -> None:
    for t in targets:
        await s.tasks.Cancel(pb.CancelRequest(task=ref(t)), metadata=md("admin"))


# --- Tasks ---------------------------------------------------------------------------------


async def test_cancel_of_an_unknown_task_is_not_cancelled(target: Serving) -> None:
    """Case 1: OK with `cancelled = false`, by id or key, also through the Python client; only
    a pool-restricted caller gets NOT_FOUND, as for another pool's task."""
    async with connect(target.address) as s:
        for t in (987654321, "never-submitted"):
            got = await s.tasks.Cancel(pb.CancelRequest(task=ref(t)), metadata=md("client"))
            assert got.cancelled is False, t
        client = Client(target.address, token=token("client"))
        try:
            assert await client.cancel(987654321) is False
            assert await client.cancel("never-submitted") is False
        finally:
            await client.close()
        theirs = await submit(s, spec("b"))
        mine = await submit(s, spec("a"), who="client_a")
        try:
            for t in (987654321, "never-submitted", theirs):
                c = s.tasks.Cancel(pb.CancelRequest(task=ref(t)), metadata=md("client_a"))
                assert await refused(c) == (Code.NOT_FOUND, "unknown task"), t
            c = s.tasks.Cancel(pb.CancelRequest(task=ref(mine)), metadata=md("client_a"))
            assert (await c).cancelled is True
        finally:
            await cancel(s, theirs)


async def test_get_and_wait_of_an_unknown_task_say_unknown_task(target: Serving) -> None:
    async with connect(target.address) as s:
        for t in (987654321, "never-submitted"):
            for c in (
                s.tasks.Get(pb.GetRequest(task=ref(t)), metadata=md("client")),
                s.tasks.Wait(pb.WaitRequest(task=ref(t), timeout_s=1), metadata=md("client")),
            ):
                assert await refused(c) == (Code.NOT_FOUND, "unknown task"), t


async def test_an_unknown_resource_is_not_found(target: Serving) -> None:
    """Case 2: NOT_FOUND naming it, for Submit and SubmitBatch; an amount of 0 for a known
    resource stays INVALID_ARGUMENT."""
    async with connect(target.address) as s:
        c = s.tasks.Submit(
            pb.SubmitRequest(task=spec(resources={"nope": 1})), metadata=md("client")
        )
        assert await refused(c) == (Code.NOT_FOUND, "unknown resource 'nope'")
        batch = pb.SubmitBatchRequest(tasks=[spec(), spec(resources={"nope": 1})])
        c = s.tasks.SubmitBatch(batch, metadata=md("client"))
        assert await refused(c) == (Code.NOT_FOUND, "unknown resource 'nope'")
        c = s.tasks.Submit(pb.SubmitRequest(task=spec(resources={"gpu": 0})), metadata=md("client"))
        code, details = await refused(c)
        assert code is Code.INVALID_ARGUMENT and "amount must be > 0" in details, details


async def test_a_request_over_max_message_bytes_is_out_of_range(target: Serving) -> None:
    """Case 3: OUT_OF_RANGE naming the limit (RESOURCE_EXHAUSTED would be retried forever), for
    the stubs and the Python client, whose ClientError is then not retryable. A request of more
    than twice the limit is refused by gRPC itself before it is read, as RESOURCE_EXHAUSTED
    (docs/server.md, "Listener")."""
    async with connect(target.address) as s:
        for size in (MAX_MESSAGE + 1, 2 * MAX_MESSAGE - 64):
            big = pb.SubmitRequest(task=spec(payload=b"x" * size))
            code, details = await refused(s.tasks.Submit(big, metadata=md("client")))
            assert code is Code.OUT_OF_RANGE, (size, code, details)
            assert f"max_message_bytes={MAX_MESSAGE}" in details, details
        batch = pb.SubmitBatchRequest(tasks=[spec(payload=b"x" * (MAX_MESSAGE // 2))] * 3)
        code, details = await refused(s.tasks.SubmitBatch(batch, metadata=md("client")))
        assert code is Code.OUT_OF_RANGE, details
        huge = pb.SubmitRequest(task=spec(payload=b"x" * (2 * MAX_MESSAGE + 1)))
        assert await s.tasks.Submit(huge, metadata=md("client")).code() is Code.RESOURCE_EXHAUSTED
        client = Client(target.address, token=token("client"))
        try:
            with pytest.raises(ClientError) as err:
                await client.submit(b"x" * (MAX_MESSAGE + 1), pool="jobs")
        finally:
            await client.close()
        assert err.value.code == "out_of_range" and not err.value.retryable
        page = await s.tasks.ListTasks(pb.ListTasksRequest(pools=["jobs"]), metadata=md("admin"))
        assert list(page.tasks) == []  # nothing was admitted


async def test_a_template_for_an_unknown_pool_is_an_invalid_template(target: Serving) -> None:
    """Case 4 (and case 5 for a template that names no pool)."""
    async with connect(target.address) as s:
        for pool, name in (("nope", "nope"), (None, "default")):
            req = pb.RecurringRequest(name="r", cron="0 0 1 1 *", template=spec(pool))
            c = s.admin.AddRecurring(req, metadata=md("admin"))
            assert await refused(c) == (
                Code.INVALID_ARGUMENT,
                f"invalid template: unknown pool '{name}'",
            ), pool
        listed = await s.admin.ListRecurring(pb.Empty(), metadata=md("admin"))
        assert list(listed.schedules) == []


async def test_a_task_without_a_pool_needs_a_pool_named_default(target: Serving) -> None:
    """Case 5: the task goes to `default`, which this server lacks, not to another pool."""
    async with connect(target.address) as s:
        c = s.tasks.Submit(pb.SubmitRequest(task=spec(None, key="nowhere")), metadata=md("client"))
        assert await refused(c) == (Code.NOT_FOUND, "unknown pool 'default'")
        batch = pb.SubmitBatchRequest(tasks=[spec(), spec(None)])
        c = s.tasks.SubmitBatch(batch, metadata=md("client"))
        assert await refused(c) == (Code.NOT_FOUND, "unknown pool 'default'")
        c = s.tasks.Get(pb.GetRequest(task=ref("nowhere")), metadata=md("client"))
        assert await c.code() is Code.NOT_FOUND  # nothing was admitted


async def test_listing_or_watching_an_unknown_pool_is_not_found(target: Serving) -> None:
    """Case 6: ListTasks and Watch answer NOT_FOUND at once (a Watch that opened and never
    sent would leave its client hanging)."""
    async with connect(target.address) as s:
        req = pb.ListTasksRequest(pools=["jobs", "nope"])
        c = s.tasks.ListTasks(req, metadata=md("client"))
        assert await refused(c) == (Code.NOT_FOUND, "unknown pool 'nope'")
        watch = s.tasks.Watch(pb.WatchRequest(pools=["jobs", "nope"]), metadata=md("client"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(watch.read(), PATIENCE)
        assert (err.value.code(), err.value.details()) == (Code.NOT_FOUND, "unknown pool 'nope'")
        # a restricted caller naming a pool it may not see is still told so first
        c = s.tasks.ListTasks(pb.ListTasksRequest(pools=["nope"]), metadata=md("client_a"))
        assert await c.code() is Code.PERMISSION_DENIED


async def test_submit_without_a_task_is_invalid(target: Serving) -> None:
    """Case 7: `missing task`, with or without `wait`; an empty SubmitBatch stays OK."""
    async with connect(target.address) as s:
        for req in (pb.SubmitRequest(), pb.SubmitRequest(wait=True, wait_timeout_s=1)):
            c = s.tasks.Submit(req, metadata=md("client"))
            assert await refused(c) == (Code.INVALID_ARGUMENT, "missing task")
        empty = await s.tasks.SubmitBatch(pb.SubmitBatchRequest(), metadata=md("client"))
        assert list(empty.tasks) == []


async def test_occurrence_keys_are_reserved_for_the_servers_own_occurrences(
    target: Serving,
) -> None:
    """Case 8: a key ending in `@YYYY-MM-DDTHH:MM:SSZ` (after its last `@`) is refused from a
    client, alone or in a batch; other forms are allowed; the occurrences of a recurring
    schedule, whose keys have that form, are still made and can be looked up by key."""
    async with connect(target.address) as s:
        for key in ("nightly@2025-06-01T09:30:00Z", "a@b@2025-06-01T09:30:00Z"):
            for c in (
                s.tasks.Submit(pb.SubmitRequest(task=spec(key=key)), metadata=md("client")),
                s.tasks.SubmitBatch(
                    pb.SubmitBatchRequest(tasks=[spec(), spec(key=key)]), metadata=md("client")
                ),
            ):
                code, details = await refused(c)
                assert code is Code.INVALID_ARGUMENT and "reserved" in details, (key, details)
        allowed = [
            "nightly@2025-06-01T09:30:00.5Z",
            "nightly@2025-06-01T09:30:00Z@x",
            "nightly@2025-06-01T09:30Z",
        ]
        ids = [await submit(s, spec(key=key)) for key in allowed]
        await cancel(s, *ids)

        watch = s.tasks.Watch(
            pb.WatchRequest(pools=["tick"], all_transitions=True), metadata=md("client")
        )
        every_second = pb.RecurringRequest(
            name="every-second", cron="* * * * * *", template=spec("tick", key="tick")
        )
        await s.admin.AddRecurring(every_second, metadata=md("admin"))
        try:
            event = await asyncio.wait_for(watch.read(), PATIENCE)
            assert isinstance(event, pb.StatusEvent)
            assert event.key.startswith("tick@") and is_occurrence_key(event.key), event
            info = await s.tasks.Get(pb.GetRequest(task=ref(event.key)), metadata=md("client"))
            assert (info.id, info.pool, info.key) == (event.id, "tick", event.key)
        finally:
            watch.cancel()
            rm = pb.RemoveRecurringRequest(name="every-second")
            await s.admin.RemoveRecurring(rm, metadata=md("admin"))


async def test_tolerance_needs_a_start_time(target: Serving) -> None:
    """Case 9."""
    async with connect(target.address) as s:
        c = s.tasks.Submit(pb.SubmitRequest(task=spec(tolerance_s=1.0)), metadata=md("client"))
        code, details = await refused(c)
        assert code is Code.INVALID_ARGUMENT, details
        assert "tolerance_s requires a start time" in details, details
        fixed = [
            await submit(s, spec(tolerance_s=1.0, start_in_s=3600.0)),
            await submit(s, spec(tolerance_s=1.0, start_unix_ns=time.time_ns() + 3600 * 10**9)),
        ]
        await cancel(s, *fixed)


async def test_retry_zero_fields_take_the_defaults(target: Serving) -> None:
    """Case 10: `max_attempts` 0 is one attempt; backoff fields and multiplier 0 are 1 s, 60 s
    and 2.0 (not the pool's: pool `retry` waits 0 s), `jitter` is false when unset; a
    multiplier in (0, 1) counts as 1, one below 0 or above 1000 is refused."""
    async with connect(target.address) as s:
        for multiplier in (-0.5, 1000.5):
            task = spec("retry", retry=pb.RetryPolicy(max_attempts=2, multiplier=multiplier))
            c = s.tasks.Submit(pb.SubmitRequest(task=task), metadata=md("client"))
            code, details = await refused(c)
            assert code is Code.INVALID_ARGUMENT and "retry.multiplier" in details, details
        w = AuthWorker(s)
        await w.register("retry", slots=1)
        try:
            once = await submit(s, spec("retry", retry=pb.RetryPolicy(max_attempts=0)))
            info = await s.tasks.Get(pb.GetRequest(task=ref(once)), metadata=md("client"))
            assert info.max_attempts == 1
            lease = await w.lease()
            w.send(fail=pb.Fail(lease=lease.lease, message="once is enough"))
            end = await s.tasks.Wait(pb.WaitRequest(task=ref(once)), metadata=md("client"))
            assert end.status == pb.TASK_STATUS_DEAD_LETTERED  # no second attempt

            slow = spec("retry", retry=pb.RetryPolicy(max_attempts=2, multiplier=0.5))
            tid = await submit(s, slow)
            lease = await w.lease()
            assert lease.task_id == tid
            w.send(fail=pb.Fail(lease=lease.lease, message="again"))
            failed_at = time.monotonic()
            again = await w.lease()
            waited = time.monotonic() - failed_at
            assert (again.task_id, again.attempt) == (tid, 2)
            # the default 1 s, without jitter: never sooner (a busy machine only makes it later)
            assert waited >= 0.95, waited
            w.send(complete=pb.Complete(lease=again.lease))
        finally:
            w.close()


# --- Work streams ------------------------------------------------------------------------------


async def test_workers_of_an_older_protocol_are_told_to_upgrade(target: Serving) -> None:
    """Case 11: versions 0 (reported as 1), 1 and 2 are FAILED_PRECONDITION, which workers
    take as fatal; a newer worker is served as version 3."""
    async with connect(target.address) as s:
        for sent, named in ((0, 1), (1, 1), (2, 2)):
            w = AuthWorker(s)
            w.send(register=pb.Register(pool="proto", slots=1, protocol_version=sent))
            assert await refused(w.call) == (
                Code.FAILED_PRECONDITION,
                f"worker protocol version {named} is not supported: this server needs"
                " version 3 (upgrade the worker)",
            ), sent
            w.close()
        w = AuthWorker(s)
        w.send(register=pb.Register(pool="proto", slots=1, protocol_version=4))
        msg = await w.recv()
        assert msg.registered.protocol_version == 3
        w.close()
        assert await w.call.code() is Code.OK


async def test_a_worker_with_zero_slots_gets_leases_once_it_sets_some(target: Serving) -> None:
    """Case 12 (and case 13: an empty kind is `default`): `Registered.slots = 0`, the pool has
    no capacity from it, and a SetSlots brings its first lease."""
    async with connect(target.address) as s:
        w = AuthWorker(s)
        w.send(register=pb.Register(pool="zero", slots=0, worker_name="z", protocol_version=3))
        reg = (await w.recv()).registered
        assert reg.slots == 0
        listed = await s.admin.ListWorkers(pb.Empty(), metadata=md("admin"))
        assert [(i.name, i.slots) for i in listed.workers if i.pool == "zero"] == [("z", 0)]
        tid = await submit(s, spec("zero"))
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        assert [(p.capacity, p.workers_connected) for p in snap.pools if p.name == "zero"] == [
            (0, 1)
        ]
        info = await s.tasks.Get(pb.GetRequest(task=ref(tid)), metadata=md("client"))
        assert (info.status, info.kind) == (pb.TASK_STATUS_READY, "default")
        w.send(set_slots=pb.SetSlots(slots=1))
        lease = await w.lease()
        assert (lease.task_id, lease.kind) == (tid, "default")
        w.send(complete=pb.Complete(lease=lease.lease))
        end = await s.tasks.Wait(pb.WaitRequest(task=ref(tid)), metadata=md("client"))
        assert end.status == pb.TASK_STATUS_SUCCEEDED
        w.close()


async def test_a_worker_message_over_max_message_bytes_ends_its_stream_out_of_range(
    target: Serving,
) -> None:
    """Case 3 on the Work stream: the worker's stream ends OUT_OF_RANGE naming the limit, and
    the attempt it held runs again elsewhere."""
    async with connect(target.address) as s:
        w = AuthWorker(s)
        await w.register("big", slots=1)
        tid = await submit(s, spec("big"))
        lease = await w.lease()
        w.send(complete=pb.Complete(lease=lease.lease, output=b"o" * (MAX_MESSAGE + 1)))
        code, details = await refused(w.call)
        assert code is Code.OUT_OF_RANGE and f"max_message_bytes={MAX_MESSAGE}" in details
        w.close()
        other = AuthWorker(s)
        await other.register("big", slots=1)
        again = await other.lease()
        assert (again.task_id, again.attempt) == (tid, 2)
        other.send(complete=pb.Complete(lease=again.lease, output=b"fits"))
        end = await s.tasks.Wait(pb.WaitRequest(task=ref(tid)), metadata=md("client"))
        assert (end.status, end.output) == (pb.TASK_STATUS_SUCCEEDED, b"fits")
        other.close()
