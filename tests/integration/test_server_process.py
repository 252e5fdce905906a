"""The real `cronoq-server` process, one per module, over real sockets (issue 5).

One subprocess server on free ports (gRPC and HTTP at port 0) with several pools, a semaphore,
tokens of every role (also pool-restricted and tenant-bound ones), a small lease TTL on one pool
and small limits, so that every row of docs/reference/errors.md, "gRPC status codes" is cheap to
reach. Covered here: the role of every method for every role and without credentials
(docs/server.md, "Authentication"), one check per applicable row of that table, each RPC's happy
path once, and worker protocol v3 over raw `Work` streams (heartbeats and the lease TTL, nack,
set_slots 0, a dropped stream).

Tests share the server, so each one uses its own pools or keys and cancels what it leaves
pending (the total pending bound is small and global).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.auth import AUTH, METHODS, ROLE_OF, Stubs, code_of, connect, md, ref
from helpers.servers import PORT0, Serving, serving_process
from helpers.workers import AuthWorker

Code = grpc.StatusCode

MAX_PENDING_TOTAL = 40
MAX_BATCH = 20
MAX_LIST = 3
TTL = 0.6
RETRY = "retry = { max_attempts = 5, initial_backoff_s = 0, jitter = false }\n"


def _pool(name: str, extra: str = "") -> str:
    return f'[[pools]]\nname = "{name}"\n{extra}'


POOLS = "".join(
    [
        _pool("a"),  # "a" and "b" are the pools of the scoped tokens of test_server_auth
        _pool("b"),
        _pool("ttl", f"lease_ttl_s = {TTL}\n{RETRY}"),
        _pool("nack", RETRY),
        _pool("drain", RETRY),
        _pool("drop", RETRY),
        _pool("echo", RETRY),
        _pool("tiny", 'max_pending = 2\noverflow = "wait"\n'),
        _pool("rej", 'max_pending = 1\noverflow = "reject"\n'),
        _pool("resv", "max = 1\n"),
        _pool("bulk"),
        _pool("page"),
        _pool("watch"),
        _pool("misc"),
    ]
)
RESOURCES = '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 2\n'
LIMITS = f"""[limits]
max_tasks_per_batch = {MAX_BATCH}
max_pending_total = {MAX_PENDING_TOTAL}
max_key_len = 16
max_tags = 2
max_deps = 2
max_resources = 1
max_wait_s = 5
max_list = {MAX_LIST}
max_message_bytes = 65536
"""
CONFIG = PORT0 + LIMITS + POOLS + RESOURCES + AUTH


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    with serving_process(tmp_path_factory.mktemp("process"), CONFIG) as serving:
        yield serving


def spec(pool: str = "misc", **fields: Any) -> pb.TaskSpec:
    return pb.TaskSpec(**{"payload": b"x", "pool": pool, **fields})


async def submit(s: Stubs, pool: str = "misc", *, who: str = "admin", **fields: Any) -> int:
    return await s.submit(who, pool, **fields)


async def get(s: Stubs, target: int | str, who: str = "admin") -> pb.TaskInfo:
    info: pb.TaskInfo = await s.tasks.Get(pb.GetRequest(task=ref(target)), metadata=md(who))
    return info


async def cancel(s: Stubs, *targets: int | str) -> None:
    for t in targets:
        await s.tasks.Cancel(pb.CancelRequest(task=ref(t)), metadata=md("admin"))


async def refused(call: Any) -> tuple[Code, str]:
    code: Code = await call.code()
    details: str = await call.details()
    return code, details


# --- (1) the role of every method (docs/server.md, "Authentication") ------------------------------

CALLERS: dict[str, list[tuple[str, str]]] = {
    "client": md("client"),
    "worker": md("worker"),
    "metrics": md("metrics"),
    "admin": md("admin"),
    "none": [],
    "unknown": [("authorization", "Bearer unknown-token-0123456789abcdef")],
}
DENIED = (Code.UNAUTHENTICATED, Code.PERMISSION_DENIED)


def sync_code(channel: grpc.Channel, method: str, metadata: Sequence[tuple[str, str]]) -> Code:
    """The status `method` ends with (requests that pass the role check are harmless)."""
    service, request = METHODS[method]
    stubs: dict[str, Any] = {
        "tasks": cronoq_pb2_grpc.TasksStub,
        "workers": cronoq_pb2_grpc.WorkersStub,
        "admin": cronoq_pb2_grpc.AdminStub,
    }
    stub = stubs[service](channel)
    if method == "Work":
        request = iter(request)
    try:
        answer = getattr(stub, method)(request, metadata=metadata, timeout=5)
        if method in ("Watch", "Work"):
            list(answer)
    except grpc.RpcError as e:
        code: Code = e.code()
        return code
    return Code.OK


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("method", list(METHODS))
def test_role_matrix(target: Serving, method: str, caller: str) -> None:
    assert len(METHODS) == 13
    code = sync_code(target.channel, method, CALLERS[caller])
    if caller in ("none", "unknown"):
        assert code is Code.UNAUTHENTICATED, code
    elif caller in (ROLE_OF[method], "admin"):
        assert code not in DENIED, code
    else:
        assert code is Code.PERMISSION_DENIED, code


# --- (2) the rows of docs/reference/errors.md, "gRPC status codes" --------------------------------


async def test_not_found_unknown_task(target: Serving) -> None:
    """Get and Wait; Cancel answers `cancelled = false` instead (test_server_published)."""
    async with connect(target.address) as s:
        who = md("client")
        for t in (987654321, "no-such-key"):
            for c in (
                s.tasks.Get(pb.GetRequest(task=ref(t)), metadata=who),
                s.tasks.Wait(pb.WaitRequest(task=ref(t), timeout_s=1), metadata=who),
            ):
                assert await code_of(c) is Code.NOT_FOUND, t
            got = await s.tasks.Cancel(pb.CancelRequest(task=ref(t)), metadata=who)
            assert not got.cancelled


async def test_not_found_unknown_pool(target: Serving) -> None:
    async with connect(target.address) as s:
        c = s.tasks.Submit(pb.SubmitRequest(task=spec("nope")), metadata=md("client"))
        code, details = await refused(c)
        assert code is Code.NOT_FOUND and "nope" in details
        c = s.tasks.ListTasks(pb.ListTasksRequest(pools=["nope"]), metadata=md("client"))
        assert await code_of(c) is Code.NOT_FOUND
        w = AuthWorker(s)
        w.send(register=pb.Register(pool="nope", slots=1, worker_name="w", protocol_version=3))
        assert await code_of(w.call) is Code.NOT_FOUND
        w.close()


async def test_not_found_unknown_resource(target: Serving) -> None:
    async with connect(target.address) as s:
        c = s.tasks.Submit(
            pb.SubmitRequest(task=spec(resources={"nope": 1})), metadata=md("client")
        )
        assert await refused(c) == (Code.NOT_FOUND, "unknown resource 'nope'")


async def test_not_found_unknown_dependency(target: Serving) -> None:
    async with connect(target.address) as s:
        for dep in (pb.TaskRef(key="nobody"), pb.TaskRef(id=987654321)):
            c = s.tasks.Submit(
                pb.SubmitRequest(task=spec(deps=[pb.Dep(target=dep)])), metadata=md("client")
            )
            assert await code_of(c) is Code.NOT_FOUND, dep


async def test_resource_exhausted_full_pool(target: Serving) -> None:
    async with connect(target.address) as s:
        held = [await submit(s, "tiny"), await submit(s, "tiny")]
        try:
            # overflow "wait" holds the call until there is room, here until its deadline
            # (docs/overflow-and-fairness.md, "On the server")
            code, _ = await refused(
                s.tasks.Submit(
                    pb.SubmitRequest(task=spec("tiny")), metadata=md("client"), timeout=0.5
                )
            )
            assert code is Code.DEADLINE_EXCEEDED
            held.append(await submit(s, "rej"))
            code, details = await refused(
                s.tasks.Submit(pb.SubmitRequest(task=spec("rej")), metadata=md("client"))
            )
            assert code is Code.RESOURCE_EXHAUSTED and "overloaded" in details
        finally:
            await cancel(s, *held)


async def test_resource_exhausted_total_pending(target: Serving) -> None:
    async with connect(target.address) as s:
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        room = MAX_PENDING_TOTAL - snap.pending
        assert room > 1, snap.pending
        held: list[int] = []
        try:
            while len(held) < room:
                n = min(MAX_BATCH, room - len(held))
                got = await s.tasks.SubmitBatch(
                    pb.SubmitBatchRequest(tasks=[spec("bulk")] * n), metadata=md("client")
                )
                held += [t.id for t in got.tasks]
            code, details = await refused(
                s.tasks.Submit(pb.SubmitRequest(task=spec("bulk")), metadata=md("client"))
            )
            assert (code, details) == (Code.RESOURCE_EXHAUSTED, "queue full")
        finally:
            await cancel(s, *held)
        # and room again once they are gone
        await cancel(s, await submit(s, "bulk"))


async def test_failed_precondition_reservation_conflict(target: Serving) -> None:
    async with connect(target.address) as s:
        fixed: dict[str, Any] = {"start_in_s": 3600.0, "duration_hint_s": 60.0}
        first = await submit(s, "resv", **fixed)
        try:
            c = s.tasks.Submit(pb.SubmitRequest(task=spec("resv", **fixed)), metadata=md("client"))
            assert await code_of(c) is Code.FAILED_PRECONDITION
        finally:
            await cancel(s, first)


BAD_SPECS: dict[str, pb.TaskSpec] = {
    "nul": spec(kind="a\0b"),
    "key length": spec(key="k" * 17),
    "tag count": spec(tags={"a": "1", "b": "2", "c": "3"}),
    "reserved tag": spec(tags={"cronoq.x": "1"}),
    "negative duration": spec(timeout_s=-1.0),
    "infinite duration": spec(deadline_in_s=float("inf")),
    "both deadlines": spec(deadline_in_s=1.0, deadline_unix_ns=time.time_ns() + 10**9),
    "both starts": spec(start_in_s=1.0, start_unix_ns=time.time_ns() + 10**9),
    "unknown priority": spec(priority=99),
    "unknown condition": spec(deps=[pb.Dep(target=pb.TaskRef(id=1), cond=99)]),  # type: ignore[arg-type]
    "too many deps": spec(deps=[pb.Dep(target=pb.TaskRef(id=i)) for i in (1, 2, 3)]),
    "amount over capacity": spec(resources={"gpu": 3}),
    "zero amount": spec(resources={"gpu": 0}),
    "multiplier over 1000": spec(retry=pb.RetryPolicy(max_attempts=2, multiplier=1001)),
    "tolerance without a start": spec(tolerance_s=1.0),
}


# what each refusal names (the field path or the rule), so that it is refused for that reason
REASONS = {
    "nul": "task.kind: must not contain NUL",
    "key length": "task.key: must be at most 16 bytes",
    "tag count": "max_tags=2",
    "reserved tag": "are reserved",
    "negative duration": "task.timeout_s: invalid duration",
    "infinite duration": "task.deadline_in_s: invalid duration",
    "both deadlines": "mutually exclusive",
    "both starts": "mutually exclusive",
    "unknown priority": "task.priority: unknown enum value",
    "unknown condition": "task.deps[0].cond: unknown enum value",
    "too many deps": "max_deps=2",
    "amount over capacity": "exceeds capacity",
    "zero amount": "amount must be > 0",
    "multiplier over 1000": "task.retry.multiplier",
    "tolerance without a start": "tolerance_s requires a start time",
    "template for an unknown pool": "invalid template: unknown pool 'nope'",
    "dependency cycle": "cycle",
    "duplicate key": "duplicate key 'twice'",
    "too many tasks": "max_tasks_per_batch=20",
    "one bad spec": "tasks[1].kind",
    "empty task ref (Get)": "task: must name a task",
    "empty task ref (Cancel)": "task: must name a task",
    "bad wait timeout": "timeout_s: invalid duration",
    "unknown status filter": "statuses[0]",
    "bad cron": "cron: invalid cron expression",
    "long cron": "cron: must be at most 256",
    "bad timezone": "tz: unknown time zone",
    "empty name": "name: must be 1-256",
    "template with deps": "template.deps",
    "template with a fixed start": "template.start_in_s",
    "template with an absolute deadline": "template.deadline_unix_ns",
    "NUL in a schedule name": "name: must not contain NUL",
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
async def test_invalid_argument_submit(target: Serving, case: str) -> None:
    async with connect(target.address) as s:
        c = s.tasks.Submit(pb.SubmitRequest(task=BAD_SPECS[case]), metadata=md("client"))
        code, details = await refused(c)
        assert code is Code.INVALID_ARGUMENT, (code, details)
        assert REASONS[case] in details


def _cycle() -> pb.SubmitBatchRequest:
    x = spec(key="cyc-x", deps=[pb.Dep(target=pb.TaskRef(key="cyc-y"))])
    y = spec(key="cyc-y", deps=[pb.Dep(target=pb.TaskRef(key="cyc-x"))])
    return pb.SubmitBatchRequest(tasks=[x, y])


BAD_BATCHES: dict[str, pb.SubmitBatchRequest] = {
    "dependency cycle": _cycle(),
    "duplicate key": pb.SubmitBatchRequest(tasks=[spec(key="twice"), spec(key="twice")]),
    "too many tasks": pb.SubmitBatchRequest(tasks=[spec()] * (MAX_BATCH + 1)),
    "one bad spec": pb.SubmitBatchRequest(tasks=[spec(), spec(kind="\0")]),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
async def test_invalid_argument_batch(target: Serving, case: str) -> None:
    async with connect(target.address) as s:
        before = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        c = s.tasks.SubmitBatch(BAD_BATCHES[case], metadata=md("client"))
        code, details = await refused(c)
        assert code is Code.INVALID_ARGUMENT and REASONS[case] in details, details
        after = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        assert after.pending == before.pending  # nothing admitted


def _recurring(**kw: Any) -> pb.RecurringRequest:
    fields: dict[str, Any] = {"name": "bad", "cron": "0 0 1 1 *", "template": spec()}
    return pb.RecurringRequest(**{**fields, **kw})


BAD_OTHERS: dict[str, tuple[str, str, Any]] = {
    "empty task ref (Get)": ("tasks", "Get", pb.GetRequest()),
    "empty task ref (Cancel)": ("tasks", "Cancel", pb.CancelRequest(task=pb.TaskRef())),
    "bad wait timeout": ("tasks", "Wait", pb.WaitRequest(task=ref(1), timeout_s=-1)),
    "unknown status filter": ("tasks", "ListTasks", pb.ListTasksRequest(statuses=[99])),  # type: ignore[list-item]
    "bad cron": ("admin", "AddRecurring", _recurring(cron="not a cron")),
    "long cron": ("admin", "AddRecurring", _recurring(cron="*" * 257)),
    "bad timezone": ("admin", "AddRecurring", _recurring(tz="Mars/Olympus")),
    "empty name": ("admin", "AddRecurring", _recurring(name="")),
    "template with deps": (
        "admin",
        "AddRecurring",
        _recurring(template=spec(deps=[pb.Dep(target=pb.TaskRef(id=1))])),
    ),
    "template with a fixed start": (
        "admin",
        "AddRecurring",
        _recurring(template=spec(start_in_s=5)),
    ),
    "template with an absolute deadline": (
        "admin",
        "AddRecurring",
        _recurring(template=spec(deadline_unix_ns=time.time_ns() + 10**12)),
    ),
    "NUL in a schedule name": (
        "admin",
        "RemoveRecurring",
        pb.RemoveRecurringRequest(name="a\0"),
    ),
    "template for an unknown pool": ("admin", "AddRecurring", _recurring(template=spec("nope"))),
}


@pytest.mark.parametrize("case", list(BAD_OTHERS))
async def test_invalid_argument_other(target: Serving, case: str) -> None:
    service, method, request = BAD_OTHERS[case]
    async with connect(target.address) as s:
        c = getattr(getattr(s, service), method)(request, metadata=md("admin"))
        code, details = await refused(c)
        assert code is Code.INVALID_ARGUMENT and REASONS[case] in details, details


async def test_out_of_range_message_too_large(target: Serving) -> None:
    async with connect(target.address) as s:
        big = pb.SubmitRequest(task=spec(payload=b"x" * 70_000))  # over max_message_bytes
        assert await code_of(s.tasks.Submit(big, metadata=md("client"))) is Code.OUT_OF_RANGE


async def test_deadline_exceeded_waits(target: Serving) -> None:
    async with connect(target.address) as s:
        tid = await submit(s)
        try:
            c = s.tasks.Wait(pb.WaitRequest(task=ref(tid), timeout_s=0.2), metadata=md("client"))
            assert await code_of(c) is Code.DEADLINE_EXCEEDED
            req = pb.SubmitRequest(task=spec(key="waited"), wait=True, wait_timeout_s=0.2)
            c = s.tasks.Submit(req, metadata=md("client"))
            assert await code_of(c) is Code.DEADLINE_EXCEEDED
            assert (await get(s, "waited")).status == pb.TASK_STATUS_READY  # stays submitted
        finally:
            await cancel(s, tid, "waited")


async def test_data_loss_for_a_lagging_watch(target: Serving) -> None:
    """A Watch that is not read while many events come falls behind the scheduler's event
    buffer (1024 events) and ends DATA_LOSS. The client keeps HTTP/2's initial 64 KiB window
    (no BDP probing, which would let the window grow and gRPC buffer every event), so the
    server's writes stall after some 2,000 events whatever the machine's speed."""
    options = [("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(target.address, options=options) as ch:
        s = Stubs(ch)
        watch = s.tasks.Watch(pb.WatchRequest(all_transitions=True), metadata=md("client"))
        # let it subscribe: read one event of ours. One read stays in flight meanwhile: a
        # grpc.aio read cancelled by a timeout leaves the call unable to read again.
        first = asyncio.ensure_future(watch.read())
        for _ in range(50):
            await cancel(s, await submit(s, "watch"))
            done, _ = await asyncio.wait([first], timeout=0.1)
            if done:
                assert isinstance(first.result(), pb.StatusEvent)
                break
        else:
            raise AssertionError("the watch never subscribed")
        batch = pb.SubmitBatchRequest(tasks=[spec("watch")] * MAX_BATCH)
        for _ in range(100):  # 100 x 20 x (blocked + ready + cancelled) events
            got = await s.tasks.SubmitBatch(batch, metadata=md("admin"))
            await asyncio.gather(*(cancel(s, t.id) for t in got.tasks))
        with pytest.raises(grpc.aio.AioRpcError) as e:  # what was sent, then the status
            while (msg := await asyncio.wait_for(watch.read(), 5)) is not grpc.aio.EOF:
                assert isinstance(msg, pb.StatusEvent)
        assert e.value.code() is Code.DATA_LOSS, e.value
        assert "fell behind" in (e.value.details() or "")


async def test_scoping(target: Serving) -> None:
    async with connect(target.address) as s:
        hidden = await submit(s, "b", key="scoped-b")
        try:
            who = md("client_a")
            for t in (hidden, "scoped-b"):
                for c in (
                    s.tasks.Get(pb.GetRequest(task=ref(t)), metadata=who),
                    s.tasks.Wait(pb.WaitRequest(task=ref(t), timeout_s=1), metadata=who),
                    s.tasks.Cancel(pb.CancelRequest(task=ref(t)), metadata=who),
                ):
                    assert await code_of(c) is Code.NOT_FOUND
            assert (await get(s, hidden)).status == pb.TASK_STATUS_READY  # not cancelled
            c = s.tasks.Submit(pb.SubmitRequest(task=spec("b")), metadata=who)
            assert await code_of(c) is Code.PERMISSION_DENIED
            c = s.tasks.ListTasks(pb.ListTasksRequest(pools=["b"]), metadata=who)
            assert await code_of(c) is Code.PERMISSION_DENIED
            other = AuthWorker(s, "worker_a")
            other.send(register=pb.Register(pool="b", slots=1, protocol_version=3))
            assert await code_of(other.call) is Code.PERMISSION_DENIED
            labels = AuthWorker(s, "worker_a")
            reg = pb.Register(pool="a", slots=1, protocol_version=3, labels={"gpu": "h100"})
            labels.send(register=reg)
            assert await code_of(labels.call) is Code.PERMISSION_DENIED
        finally:
            await cancel(s, hidden)


async def test_tenant_permission_denied(target: Serving) -> None:
    async with connect(target.address) as s:
        c = s.tasks.Submit(pb.SubmitRequest(task=spec(tenant="t2")), metadata=md("tenant"))
        assert await code_of(c) is Code.PERMISSION_DENIED
        mine = await s.submit("tenant", "misc")
        try:
            assert (await get(s, mine)).tenant == "t1"
        finally:
            await cancel(s, mine)


# --- (3) each RPC's happy path -------------------------------------------------------------


async def test_submit_and_duplicate(target: Serving) -> None:
    async with connect(target.address) as s:
        req = pb.SubmitRequest(task=spec(key="happy"))
        first = await s.tasks.Submit(req, metadata=md("client"))
        again = await s.tasks.Submit(req, metadata=md("client"))
        try:
            assert first.id > 0 and not first.duplicate
            assert (again.id, again.duplicate) == (first.id, True)
        finally:
            await cancel(s, first.id)


async def test_submit_wait_with_a_raw_worker(target: Serving) -> None:
    async with connect(target.address) as s:
        w = AuthWorker(s)
        assert (await w.register("echo", slots=1)).slots == 1
        req = pb.SubmitRequest(task=spec("echo", payload=b"ping"), wait=True, wait_timeout_s=4)
        call = s.tasks.Submit(req, metadata=md("client"))
        lease = await w.lease()
        assert (lease.payload, lease.attempt, lease.pool) == (b"ping", 1, "echo")
        w.send(complete=pb.Complete(lease=lease.lease, output=b"pong"))
        resp = await call
        assert resp.id == lease.task_id and not resp.duplicate
        assert resp.result.status == pb.TASK_STATUS_SUCCEEDED
        assert resp.result.output == b"pong"
        w.close()


async def test_submit_batch(target: Serving) -> None:
    async with connect(target.address) as s:
        batch = pb.SubmitBatchRequest(
            tasks=[
                spec(key="bat-1"),
                spec(key="bat-2", deps=[pb.Dep(target=pb.TaskRef(key="bat-1"))]),
            ]
        )
        got = await s.tasks.SubmitBatch(batch, metadata=md("client"))
        ids = [t.id for t in got.tasks]
        try:
            assert len(ids) == 2 and ids[0] < ids[1]
            assert (await get(s, "bat-1")).status == pb.TASK_STATUS_READY
            assert (await get(s, "bat-2")).status == pb.TASK_STATUS_BLOCKED
        finally:
            await cancel(s, *ids)


async def test_cancel(target: Serving) -> None:
    async with connect(target.address) as s:
        tid = await submit(s)
        req = pb.CancelRequest(task=ref(tid))
        assert (await s.tasks.Cancel(req, metadata=md("client"))).cancelled
        assert not (await s.tasks.Cancel(req, metadata=md("client"))).cancelled
        assert (await get(s, tid)).status == pb.TASK_STATUS_CANCELLED


async def test_get_by_id_and_key(target: Serving) -> None:
    async with connect(target.address) as s:
        tid = await submit(s, key="get-me", kind="k1")
        try:
            by_id = await get(s, tid, "client")
            by_key = await get(s, "get-me", "client")
            assert by_id == by_key
            assert (by_id.id, by_id.key, by_id.kind, by_id.pool) == (tid, "get-me", "k1", "misc")
        finally:
            await cancel(s, tid)


async def test_list_tasks_paging(target: Serving) -> None:
    async with connect(target.address) as s:
        ids = [await submit(s, "page") for _ in range(5)]
        try:
            seen: list[int] = []
            after = 0
            while True:
                page = await s.tasks.ListTasks(
                    pb.ListTasksRequest(pools=["page"], limit=2, after=after),
                    metadata=md("client"),
                )
                assert len(page.tasks) <= 2
                seen += [t.id for t in page.tasks]
                if not page.next_after:
                    break
                assert page.next_after == page.tasks[-1].id
                after = page.next_after
            assert seen == ids
            capped = await s.tasks.ListTasks(
                pb.ListTasksRequest(pools=["page"], limit=100), metadata=md("client")
            )
            assert [t.id for t in capped.tasks] == ids[:MAX_LIST]
            assert capped.next_after == ids[MAX_LIST - 1]
            ready = await s.tasks.ListTasks(
                pb.ListTasksRequest(pools=["page"], statuses=[pb.TASK_STATUS_SUCCEEDED]),
                metadata=md("client"),
            )
            assert list(ready.tasks) == []
        finally:
            await cancel(s, *ids)


async def test_wait(target: Serving) -> None:
    async with connect(target.address) as s:
        tid = await submit(s)
        waiting = s.tasks.Wait(pb.WaitRequest(task=ref(tid), timeout_s=4), metadata=md("client"))
        await asyncio.sleep(0.1)
        await cancel(s, tid)
        result = await waiting
        assert (result.id, result.status) == (tid, pb.TASK_STATUS_CANCELLED)
        assert not result.HasField("output")


async def test_watch_receives_an_event(target: Serving) -> None:
    async with connect(target.address) as s:
        watch = s.tasks.Watch(pb.WatchRequest(pools=["watch"]), metadata=md("client"))
        event = None
        for _ in range(50):  # until the watch surely subscribed
            tid = await submit(s, "watch")
            await cancel(s, tid)
            with contextlib.suppress(TimeoutError):
                event = await asyncio.wait_for(watch.read(), 0.1)
                break
        assert isinstance(event, pb.StatusEvent)
        assert event.pool == "watch" and event.status == pb.TASK_STATUS_CANCELLED
        watch.cancel()


async def test_snapshot(target: Serving) -> None:
    async with connect(target.address) as s:
        tid = await submit(s, "misc")
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("metrics"))
        await cancel(s, tid)
        names = [p.name for p in snap.pools]
        assert {"a", "b", "ttl", "tiny", "resv"} <= set(names)
        misc = next(p for p in snap.pools if p.name == "misc")
        assert sum(misc.pending_by_class) == 1 and len(misc.pending_by_class) == 4
        assert snap.pending >= 1 and snap.live_tasks >= 1 and snap.totals.submitted >= 1
        after = await s.admin.Snapshot(pb.Empty(), metadata=md("metrics"))
        assert after.totals.cancelled == snap.totals.cancelled + 1
        scoped = await s.admin.Snapshot(pb.Empty(), metadata=md("metrics_a"))
        assert [p.name for p in scoped.pools] == ["a"]


async def test_recurring(target: Serving) -> None:
    async with connect(target.address) as s:
        req = pb.RecurringRequest(
            name="yearly", cron="0 0 1 1 *", tz="Europe/Paris", template=spec(kind="y")
        )
        await s.admin.AddRecurring(req, metadata=md("admin"))
        listed = await s.admin.ListRecurring(pb.Empty(), metadata=md("metrics"))
        mine = [r for r in listed.schedules if r.name == "yearly"]
        assert len(mine) == 1
        assert (mine[0].pool, mine[0].cron, mine[0].kind, mine[0].tz) == (
            "misc",
            "0 0 1 1 *",
            "y",
            "Europe/Paris",
        )
        assert mine[0].overlap == pb.OVERLAP_SKIP and mine[0].next_unix_ns > time.time_ns()
        rm = pb.RemoveRecurringRequest(name="yearly")
        assert (await s.admin.RemoveRecurring(rm, metadata=md("admin"))).removed
        assert not (await s.admin.RemoveRecurring(rm, metadata=md("admin"))).removed
        listed = await s.admin.ListRecurring(pb.Empty(), metadata=md("metrics"))
        assert "yearly" not in [r.name for r in listed.schedules]


async def test_list_workers(target: Serving) -> None:
    async with connect(target.address) as s:
        w = AuthWorker(s)
        w.send(
            register=pb.Register(
                pool="misc", slots=3, worker_name="lw", protocol_version=3, labels={"x": "1"}
            )
        )
        reg = (await w.recv()).registered
        listed = await s.admin.ListWorkers(pb.Empty(), metadata=md("metrics"))
        mine = [i for i in listed.workers if i.id == reg.worker_id]
        assert len(mine) == 1
        info = mine[0]
        assert (info.name, info.pool, dict(info.labels), info.slots, info.busy) == (
            "lw",
            "misc",
            {"x": "1"},
            3,
            0,
        )
        w.close()
        assert await code_of(w.call) is Code.OK


# --- (4) worker protocol over raw streams (docs/protocol.md) --------------------------------------


async def test_heartbeats_keep_a_lease_past_the_ttl(target: Serving) -> None:
    async with connect(target.address) as s:
        w = AuthWorker(s)
        reg = await w.register("ttl", slots=1)
        assert reg.lease_ttl_s == pytest.approx(TTL)
        tid = await submit(s, "ttl")
        lease = await w.lease()
        assert lease.task_id == tid and lease.lease_ttl_s == pytest.approx(TTL)
        end = time.monotonic() + 3 * TTL
        while time.monotonic() < end:
            w.send(heartbeat=pb.Heartbeat(lease=lease.lease))
            await asyncio.sleep(TTL / 4)
        w.send(complete=pb.Complete(lease=lease.lease, output=b"done"))
        result = await s.tasks.Wait(
            pb.WaitRequest(task=ref(tid), timeout_s=2), metadata=md("client")
        )
        assert (result.status, result.output) == (pb.TASK_STATUS_SUCCEEDED, b"done")
        assert (await get(s, tid)).attempt == 1
        w.close()


async def test_no_heartbeat_aborts_and_retries(target: Serving) -> None:
    async with connect(target.address) as s:
        w = AuthWorker(s)
        await w.register("ttl", slots=1)
        tid = await submit(s, "ttl")
        lease = await w.lease()
        msg = await w.recv(timeout=3 * TTL + 1)
        assert msg.WhichOneof("msg") == "abort"
        assert (msg.abort.lease, msg.abort.reason) == (lease.lease, "lease expired")
        retry = await w.lease()
        assert (retry.task_id, retry.attempt) == (tid, 2) and retry.lease != lease.lease
        w.send(complete=pb.Complete(lease=retry.lease))
        result = await s.tasks.Wait(
            pb.WaitRequest(task=ref(tid), timeout_s=2), metadata=md("client")
        )
        assert result.status == pb.TASK_STATUS_SUCCEEDED
        w.close()


async def test_nack_goes_to_another_worker_with_the_same_lease(target: Serving) -> None:
    async with connect(target.address) as s:
        a = AuthWorker(s)
        await a.register("nack", slots=1)
        tid = await submit(s, "nack")
        lease = await a.lease()
        b = AuthWorker(s)
        await b.register("nack", slots=1)
        a.send(nack=pb.Nack(lease=lease.lease, reason="busy"))
        again = await b.lease()
        assert (again.lease, again.task_id, again.attempt) == (lease.lease, tid, 1)
        b.send(complete=pb.Complete(lease=again.lease, output=b"b"))
        result = await s.tasks.Wait(
            pb.WaitRequest(task=ref(tid), timeout_s=2), metadata=md("client")
        )
        assert (result.status, result.output) == (pb.TASK_STATUS_SUCCEEDED, b"b")
        a.close()
        b.close()


async def test_set_slots_zero_drains(target: Serving) -> None:
    async with connect(target.address) as s:
        w = AuthWorker(s)
        await w.register("drain", slots=2)
        first = await submit(s, "drain")
        lease = await w.lease()
        w.send(set_slots=pb.SetSlots(slots=0))
        await asyncio.sleep(0.2)
        second = await submit(s, "drain")
        await asyncio.sleep(0.3)
        assert (await get(s, second)).status == pb.TASK_STATUS_READY  # no new lease
        assert (await get(s, first)).status == pb.TASK_STATUS_RUNNING  # the running one goes on
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        assert [p.capacity for p in snap.pools if p.name == "drain"] == [0]
        w.send(complete=pb.Complete(lease=lease.lease))
        result = await s.tasks.Wait(
            pb.WaitRequest(task=ref(first), timeout_s=2), metadata=md("client")
        )
        assert result.status == pb.TASK_STATUS_SUCCEEDED
        w.send(set_slots=pb.SetSlots(slots=1))
        nxt = await w.lease()
        assert nxt.task_id == second
        w.send(complete=pb.Complete(lease=nxt.lease))
        w.close()


async def test_disconnect_retries_on_another_worker(target: Serving) -> None:
    async with connect(target.address) as s:
        a = AuthWorker(s)
        await a.register("drop", slots=1)
        tid = await submit(s, "drop")
        lease = await a.lease()
        a.call.cancel()  # the connection drops
        b = AuthWorker(s)
        await b.register("drop", slots=1)
        again = await b.lease()
        assert (again.task_id, again.attempt) == (tid, lease.attempt + 1)
        b.send(complete=pb.Complete(lease=again.lease))
        result = await s.tasks.Wait(
            pb.WaitRequest(task=ref(tid), timeout_s=2), metadata=md("client")
        )
        assert result.status == pb.TASK_STATUS_SUCCEEDED
        b.close()


def test_server_still_serving(target: Serving) -> None:
    assert target.server.proc.poll() is None
    assert sync_code(target.channel, "ListWorkers", md("admin")) is Code.OK
    assert not any("level=error" in line for line in target.server.lines)
