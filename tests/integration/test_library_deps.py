"""Dependencies, atomic batches, resources and overflow through the public asyncio API.

docs/dependencies.md, docs/resources.md, docs/overflow-and-fairness.md, "max_pending and overflow"
and docs/reference/errors.md, with real executors, plus dependencies combined with resources and
the handle of a task skipped during its own submission (which reports the real reason, not the
published package's "task already finished").

Tasks are driven by one `Probe` executor: the payload "name:action" names the task and says what
to do (hold until released, fail, crash, sleep). Every wait is bounded; timing assertions allow
~50 ms.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from cronoq import (
    Dep,
    Permanent,
    Pool,
    Priority,
    Resource,
    RetryPolicy,
    Scheduler,
    SubmitError,
    Task,
    TaskContext,
    TaskFailed,
    TaskHandle,
)
from helpers.vclock import LoopClock, vtime

NO_RETRY = RetryPolicy.none()
# Every async test runs on a virtual-time loop (helpers/vclock.py); the schedulers read CLOCK.
pytestmark = pytest.mark.virtual_time
CLOCK = LoopClock()
SLACK = 1e-6  # virtual time: only float rounding


# --- helpers -----------------------------------------------------------------------------------


class Probe:
    """The executor of every pool here; logs when each task starts and how many run at once.

    The payload is "name" followed by actions, e.g. "a:hold:fail": "hold" waits until
    `release("a")`, "fail" raises Permanent, "crash" raises RuntimeError, "sleep0.1" sleeps.
    The task returns its name.
    """

    def __init__(self) -> None:
        self.t0 = vtime()
        self.started: dict[str, float] = {}
        self.order: list[str] = []
        self.running = 0
        self.peak = 0
        self.gates: collections.defaultdict[str, asyncio.Event] = collections.defaultdict(
            asyncio.Event
        )

    async def run(self, ctx: TaskContext, payload: str) -> str:
        name, *actions = payload.split(":")
        self.started[name] = vtime() - self.t0
        self.order.append(name)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            for action in actions:
                if action == "hold":
                    await self.gates[name].wait()
                elif action == "fail":
                    raise Permanent(f"{name} failed")
                elif action == "crash":
                    raise RuntimeError(f"{name} crashed")
                else:
                    await asyncio.sleep(float(action.removeprefix("sleep")))
            return name
        finally:
            self.running -= 1

    def release(self, *names: str) -> None:
        for name in names:
            self.gates[name].set()

    def release_all(self) -> None:
        self.release(*list(self.gates))


def fixed(name: str, probe: Probe, slots: int = 1, **options: Any) -> Pool:
    """A pool of exactly `slots` workers."""
    return Pool(name, probe.run, max=slots, initial=slots, autoscale=False, **options)


def scheduler(
    probe: Probe,
    *pools: Pool,
    resources: list[Resource] | None = None,
    slots: int = 2,
    **options: Any,
) -> Scheduler:
    """The given pools, or one pool "default" with `slots` workers and `options`."""
    return Scheduler(
        list(pools) or [fixed("default", probe, slots, **options)],
        resources=resources,
        shutdown_grace=0.1,
        clock=CLOCK,
    )


@contextlib.contextmanager
def submit_error(code: str, message: str | None = None) -> Iterator[None]:
    with pytest.raises(SubmitError) as info:
        yield
    assert info.value.code == code
    if message is not None:
        assert (info.value.message, str(info.value)) == (message, message)


async def within(aw: Awaitable[Any], seconds: float = 2.0) -> Any:
    return await asyncio.wait_for(aw, seconds)


async def failure(handle: TaskHandle, seconds: float = 2.0) -> tuple[str, str, int | None]:
    """(status, message, task_id) of the TaskFailed that awaiting the handle raises."""
    with pytest.raises(TaskFailed) as info:
        await within(handle.result(), seconds)
    e = info.value
    assert str(e) == f"task {e.task_id} ended as {e.status}: {e.message}"
    return (e.status, e.message, e.task_id)


def skipped(task_id: int, parent: int | None, status: str) -> tuple[str, str, int]:
    """What awaiting a skipped task raises (parent None: it ended before the submission)."""
    if parent is None:
        return ("skipped", f"dependency ended as {status}", task_id)
    return ("skipped", f"dependency {parent} ended as {status}", task_id)


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 2.0) -> None:
    deadline = vtime() + seconds
    while not await check():
        if vtime() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def status_is(sched: Scheduler, ref: int | str, status: str) -> None:
    async def check() -> bool:
        return await sched.status(ref) == status

    await until(check)


async def started(probe: Probe, *names: str) -> None:
    async def check() -> bool:
        return all(name in probe.started for name in names)

    await until(check)


# --- dependencies (docs/dependencies.md, "Edges") -------------------------------------------------


async def test_b_after_a_is_blocked_until_a_succeeds() -> None:
    """B after A stays blocked until A succeeds, then runs."""
    probe = Probe()
    async with scheduler(probe) as sched:
        a = await sched.submit("a:hold", key="A")
        b = await sched.submit("b", after="A")
        await started(probe, "a")
        await asyncio.sleep(0.05)
        assert await sched.status(b.id) == "blocked"
        assert "b" not in probe.started and not b.done()
        probe.release("a")
        assert await within(b.result()) == "b"
        assert await a == "a"
        assert probe.order == ["a", "b"]


async def test_a_failed_parent_skips_its_dependents_and_theirs() -> None:
    """A parent that ends failed skips its dependents, and skips cascade to theirs."""
    probe = Probe()
    async with scheduler(probe) as sched:
        events = sched.events()
        a = await sched.submit("a:hold:fail")
        c = await sched.submit("c", after=a.id, key="C")
        d = await sched.submit("d", after="C")
        e = await sched.submit("e", deps=[Dep("C", on="complete")])
        await started(probe, "a")
        assert [await sched.status(h.id) for h in (c, d, e)] == ["blocked"] * 3
        probe.release("a")
        assert await failure(a) == ("failed", "a failed", a.id)
        assert await failure(c) == skipped(c.id, a.id, "failed")
        assert await failure(d) == skipped(d.id, c.id, "skipped")
        assert await within(e.result()) == "e"
        seen = []
        async for ev in events:
            seen.append((ev.id, ev.status, ev.message))
            if len(seen) == 4:
                break
        assert seen == [
            (a.id, "failed", "a failed"),
            (c.id, "skipped", f"dependency {a.id} ended as failed"),
            (d.id, "skipped", f"dependency {c.id} ended as skipped"),
            (e.id, "succeeded", None),
        ]
        assert probe.order == ["a", "e"]
        assert (await sched.snapshot()).totals["skipped"] == 2


ENDS = ["succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"]
SATISFIES = {
    "succeeded": {"success", "complete"},
    "failed": {"failure", "complete"},
    "dead_lettered": {"failure", "complete"},
    "cancelled": {"complete"},
    "skipped": {"complete"},
    "missed": {"complete"},
    "shed": {"complete"},
}


async def _parent_ending_as(
    sched: Scheduler, probe: Probe, end: str
) -> tuple[int, Callable[[], Awaitable[None]] | None]:
    """A parent task that will end as `end`, and what ends it (None: it already has)."""
    if end == "missed":  # a fixed start already beyond its tolerance
        h = await sched.submit("m", start_at=CLOCK() - 5.0, tolerance=1.0, on_miss="skip")
        return h.id, None
    if end == "shed":  # pool "z": its slot is taken, room for one pending task, shed_lowest
        await sched.submit("zgate:hold", pool="z")
        await started(probe, "zgate")
        h = await sched.submit("victim", pool="z", priority=Priority.LOW)

        async def shed() -> None:
            await sched.submit("newcomer", pool="z", priority=Priority.NORMAL)

        return h.id, shed
    if end == "skipped":
        g = await sched.submit("g:hold:fail")
        h = await sched.submit("s", after=g.id)
    else:
        action = {"failed": ":fail", "dead_lettered": ":crash"}.get(end, "")
        g = h = await sched.submit(f"g:hold{action}", retry=NO_RETRY)
    await started(probe, "g")

    async def finish() -> None:
        if end == "cancelled":
            assert await sched.cancel(g.id)
        else:
            probe.release("g")

    return h.id, finish


@pytest.mark.parametrize("on", ["success", "failure", "complete"])
@pytest.mark.parametrize("end", ENDS)
async def test_edge_table(end: str, on: str) -> None:
    """Which parent outcomes satisfy a success, failure or complete edge and which skip the
    child (docs/dependencies.md, "Edges")."""
    probe = Probe()
    pools = [
        fixed("default", probe, 2),
        fixed("z", probe, 1, max_pending=1, overflow="shed_lowest"),
    ]
    async with scheduler(probe, *pools) as sched:
        parent, finish = await _parent_ending_as(sched, probe, end)
        child = await sched.submit("child", deps=[Dep(parent, on=on)])
        if finish is not None:
            assert await sched.status(child.id) == "blocked"
            await finish()
        await status_is(sched, parent, end)
        if on in SATISFIES[end]:
            assert await within(child.result()) == "child"
        else:
            by = None if finish is None else parent
            assert await failure(child) == skipped(child.id, by, end)
        probe.release_all()


async def test_a_handle_of_a_task_skipped_at_submission_reports_the_real_reason() -> None:
    """The published package says "task already finished"; we give status and reason."""
    probe = Probe()
    async with scheduler(probe) as sched:
        bad = await sched.submit("bad:fail", key="bad")
        assert await failure(bad) == ("failed", "bad failed", bad.id)
        child = await sched.submit("child", after="bad")
        assert child.done() and not child.duplicate
        assert await sched.status(child.id) == "skipped"
        assert await failure(child) == skipped(child.id, None, "failed")
        assert await failure(child) == skipped(child.id, None, "failed")  # awaitable again
        assert "child" not in probe.started


async def test_depending_on_a_finished_task_runs_at_once() -> None:
    probe = Probe()
    async with scheduler(probe) as sched:
        a = await sched.submit("a", key="A")
        assert await within(a.result()) == "a"
        b = await sched.submit("b", after=["A", a.id])
        assert await within(b.result()) == "b"


# --- unknown keys, cycles (docs/dependencies.md, "Unknown dependencies and cycles") ---------------


async def test_unknown_dependencies_are_rejected() -> None:
    """An unknown key is rejected unless the pool awaits keys; an unknown id always is."""
    probe = Probe()
    pools = [fixed("default", probe), fixed("aw", probe, unknown_dependency="await")]
    async with scheduler(probe, *pools) as sched:
        with submit_error("unknown_dependency", "unknown dependency 'nope'"):
            await sched.submit("x", after="nope")
        with submit_error("unknown_dependency", "unknown dependency 'nope'"):
            await sched.submit("x", deps=[Dep("nope", on="complete")])
        for pool in ("default", "aw"):
            with submit_error("unknown_dependency", "unknown dependency '424242'"):
                await sched.submit("x", after=424242, pool=pool)
            with submit_error("unknown_dependency", "unknown dependency '424242'"):
                await sched.enqueue("x", deps=[Dep(424242, on="failure")], pool=pool)
        assert await sched.enqueue("first") == 1  # no id was used up
        waiting = await sched.submit("w", after="nope", pool="aw")
        assert await sched.status(waiting.id) == "blocked"
        probe.release_all()


async def test_await_timeout_skips_a_task_waiting_for_a_key() -> None:
    """With await_timeout=0.5 a task after a never-submitted key ends skipped after 0.5 s."""
    probe = Probe()
    async with scheduler(probe, unknown_dependency="await", await_timeout=0.5) as sched:
        t0 = vtime()
        h = await sched.submit("x", after="never")
        assert await sched.status(h.id) == "blocked"
        assert await failure(h) == ("skipped", "timed out awaiting unknown dependency", h.id)
        assert vtime() - t0 == pytest.approx(0.5, abs=SLACK)
        assert "x" not in probe.started


async def test_an_awaited_key_runs_the_dependent_once_submitted() -> None:
    """In await mode, closing a cycle through the awaited key fails; plain B lets A run."""
    probe = Probe()
    async with scheduler(probe, unknown_dependency="await") as sched:
        a = await sched.submit("a", key="A", after="B")
        with submit_error("cycle", "dependency cycle"):
            await sched.submit("b", key="B", after="A")
        assert await sched.status("B") is None
        await asyncio.sleep(0.05)
        assert await sched.status(a.id) == "blocked"
        b = await sched.submit("b:sleep0.05", key="B")
        assert b.id == a.id + 1
        assert await within(a.result()) == "a"
        assert probe.order == ["b", "a"]


async def test_a_task_that_timed_out_awaiting_a_key_closes_no_cycle() -> None:
    """A waited for "B" and was skipped by await_timeout; nothing waits for B any more, so B
    after A is no cycle: it is skipped because A ended as skipped (docs/dependencies.md,
    "Edges")."""
    probe = Probe()
    async with scheduler(probe, unknown_dependency="await", await_timeout=0.1) as sched:
        a = await sched.submit("a", key="A", after="B")
        assert await failure(a) == ("skipped", "timed out awaiting unknown dependency", a.id)
        b = await sched.submit("b", key="B", after="A")
        assert await failure(b) == skipped(b.id, None, "skipped")


async def test_a_task_after_its_own_key_is_a_cycle() -> None:
    """A task after its own key is a cycle, alone or in a batch, and leaves the key free."""
    probe = Probe()
    async with scheduler(probe) as sched:
        with submit_error("cycle", "dependency cycle"):
            await sched.submit("k", key="k", after="k")
        with submit_error("cycle", "dependency cycle"):
            await sched.submit_batch([Task("k", key="k", deps=[Dep("k", on="complete")])])
        assert await sched.status("k") is None
        h = await sched.submit("k", key="k")  # the key is free
        assert (h.id, await within(h.result())) == (1, "k")


# --- atomic batches (docs/dependencies.md, "Atomic batches") --------------------------------------


async def test_batch_with_a_forward_reference() -> None:
    """A batch task may depend on a key defined later in the same batch; all of them run."""
    probe = Probe()
    async with scheduler(probe) as sched:
        handles = await sched.submit_batch(
            [Task("x", after="z"), Task("y", deps=[Dep("z", on="complete")]), Task("z", key="z")]
        )
        assert [h.id for h in handles] == [1, 2, 3]
        assert [await within(h.result()) for h in handles] == ["x", "y", "z"]
        assert probe.order[0] == "z"


async def test_batch_duplicate_key_and_invalid_task_admit_nothing() -> None:
    """A key twice in a batch, or one invalid task, rejects the whole batch: nothing is admitted."""
    probe = Probe()
    async with scheduler(probe) as sched:
        with submit_error("duplicate_key_in_batch", "duplicate key 'dd' in batch"):
            await sched.submit_batch([Task("a", key="dd"), Task("b"), Task("c", key="dd")])
        bad_ones: list[tuple[Task, type[Exception], str | None]] = [
            (Task("x", pool="nope"), SubmitError, "unknown_pool"),
            (Task("x", after="nope"), SubmitError, "unknown_dependency"),
            (Task("x", key="c1", after="c2"), SubmitError, None),  # with the next one: a cycle
            (Task("x", resources={"zzz": 1}), SubmitError, "unknown_resource"),
            (Task("x", priority=7), ValueError, None),
        ]
        for bad, exc_type, code in bad_ones:
            batch = [Task("a", key="k1"), Task("b", key="k2", after="k1"), bad]
            if bad.options.get("key") == "c1":
                batch.append(Task("y", key="c2", after="c1"))
            with pytest.raises(exc_type) as info:
                await sched.submit_batch(batch)
            if isinstance(info.value, SubmitError):
                assert info.value.code == (code or "cycle")
            for key in ("k1", "k2", "c1", "c2", "dd"):
                assert await sched.status(key) is None
        assert await sched.enqueue("probe") == 1
        snap = await sched.snapshot()
        assert snap.totals["submitted"] == 1


async def test_batch_with_an_existing_key_yields_a_duplicate() -> None:
    probe = Probe()
    async with scheduler(probe) as sched:
        old = await sched.submit("old:hold", key="old")
        handles = await sched.submit_batch([Task("n", after="old"), Task("o2", key="old")])
        assert [(h.id, h.duplicate) for h in handles] == [(2, False), (old.id, True)]
        assert await sched.submit_batch([]) == []
        probe.release("old")
        assert await within(handles[0].result()) == "n"
        assert await within(handles[1].result()) == "old"


# --- resources (docs/resources.md) ----------------------------------------------------------------


async def test_a_semaphore_bounds_concurrency_across_pools() -> None:
    """A 2-permit semaphore runs at most 2 of 6 tasks at once across two pools."""
    probe = Probe()
    pools = [fixed("a", probe, 3), fixed("b", probe, 3)]
    async with scheduler(probe, *pools, resources=[Resource.semaphore("db", 2)]) as sched:
        handles = [
            await sched.submit(f"t{i}:sleep0.1", pool="ab"[i % 2], resources={"db": 1})
            for i in range(6)
        ]
        free = await sched.submit("free:sleep0.1", pool="a")
        await within(asyncio.gather(*handles, free))
        starts = sorted(v for k, v in probe.started.items() if k != "free")
    assert probe.peak == 3  # two holders of the semaphore and the free task
    first = starts[0]
    offsets = [s - first for s in starts]
    for got, want in zip(offsets, [0, 0, 0.1, 0.1, 0.2, 0.2], strict=True):
        assert want - SLACK <= got < want + SLACK, offsets


async def test_semaphore_concurrency_never_above_the_permits() -> None:
    """Sampled while it runs, concurrency on a 2-permit semaphore never exceeds 2."""
    probe = Probe()
    pools = [fixed("a", probe, 3), fixed("b", probe, 3)]
    samples = []
    async with scheduler(probe, *pools, resources=[Resource.semaphore("db", 2)]) as sched:
        handles = [
            await sched.submit(f"t{i}:sleep0.03", pool="ab"[i % 2], resources={"db": 1})
            for i in range(6)
        ]
        done = asyncio.ensure_future(asyncio.gather(*handles))
        while not done.done():
            samples.append(probe.running)
            await asyncio.sleep(0.002)
        await within(done)
    assert max(samples) == 2 and probe.peak == 2


async def test_token_bucket_start_times() -> None:
    """A token bucket of rate 5, burst 3: 8 one-token tasks start at 0, 0, 0, 0.2 ... 1.0 s."""
    probe = Probe()
    bucket = Resource.token_bucket("api", rate=5, burst=3)
    sched = scheduler(probe, slots=8, resources=[bucket])
    async with sched:
        t0 = vtime() - probe.t0
        handles = [await sched.submit(f"t{i}", resources={"api": 1}) for i in range(8)]
        await within(asyncio.gather(*handles))
    offsets = [probe.started[f"t{i}"] - t0 for i in range(8)]
    for got, want in zip(offsets, [0, 0, 0, 0.2, 0.4, 0.6, 0.8, 1.0], strict=True):
        assert abs(got - want) < SLACK, offsets


async def test_a_high_task_waiting_for_a_semaphore_lets_a_low_task_run() -> None:
    """A HIGH task waiting for a semaphore does not hold back a LOW task that needs none."""
    probe = Probe()
    async with scheduler(probe, slots=2, resources=[Resource.semaphore("db", 1)]) as sched:
        await sched.submit("holder:hold", resources={"db": 1})
        await started(probe, "holder")
        high = await sched.submit("high", priority="high", resources={"db": 1})
        low = await sched.submit("low", priority="low")
        assert await within(low.result(), 0.5) == "low"
        assert await sched.status(high.id) == "ready"
        assert "high" not in probe.started
        probe.release("holder")
        assert await within(high.result()) == "high"


async def test_resource_submission_checks() -> None:
    """Amounts above a resource's capacity, unknown resources and zero amounts are rejected."""
    probe = Probe()
    async with scheduler(probe, resources=[Resource.semaphore("sem", 2)]) as sched:
        with submit_error(
            "resource_exceeds_capacity", "requested amount exceeds capacity of resource 'sem'"
        ):
            await sched.submit("x", resources={"sem": 3})
        with submit_error("unknown_resource", "unknown resource 'zzz'"):
            await sched.submit("x", resources={"zzz": 1})
        with submit_error("invalid", "invalid task: resource amount must be > 0"):
            await sched.submit("x", resources={"sem": 0})
        with submit_error("unknown_resource", "unknown resource 'zzz'"):
            await sched.submit_batch([Task("ok"), Task("x", resources={"zzz": 1})])
        h = await sched.submit("ok", resources={"sem": 2})
        assert (h.id, await within(h.result())) == (1, "ok")


async def test_dependencies_and_resources_together() -> None:
    """A dependent waits for its parent, then competes for the permit its parent held: the
    permit goes to the best ready task (here the CRITICAL dependent, not the earlier NORMAL)."""
    probe = Probe()
    async with scheduler(probe, slots=3, resources=[Resource.semaphore("db", 1)]) as sched:
        a = await sched.submit("a:hold", key="A", resources={"db": 1})
        b = await sched.submit("b:hold", after="A", resources={"db": 1}, priority="critical")
        c = await sched.submit("c", resources={"db": 1})
        await started(probe, "a")
        await asyncio.sleep(0.05)
        assert (await sched.status(b.id), await sched.status(c.id)) == ("blocked", "ready")
        probe.release("a")
        await started(probe, "b")
        await asyncio.sleep(0.05)
        assert await sched.status(c.id) == "ready" and "c" not in probe.started
        probe.release("b")
        assert await within(c.result()) == "c"
        assert await a == "a" and await b == "b"
        assert probe.order == ["a", "b", "c"] and probe.peak == 1


# --- bounds and overflow (docs/overflow-and-fairness.md, "max_pending and overflow") --------------


async def _fill(sched: Scheduler, probe: Probe, priorities: list[str]) -> list[TaskHandle]:
    """Take the pool's only slot with a held task, then queue one task per priority."""
    await sched.submit("gate:hold", priority="critical")
    await started(probe, "gate")
    return [await sched.submit(f"{p}{i}", priority=p) for i, p in enumerate(priorities)]


@pytest.mark.parametrize("priority", ["critical", "high", "normal", "low"])
async def test_reject_when_full(priority: str) -> None:
    """overflow="reject": a full pool refuses submit and enqueue of any priority (overloaded)."""
    probe = Probe()
    async with scheduler(probe, slots=1, max_pending=3, overflow="reject") as sched:
        queued = await _fill(sched, probe, ["low", "low", "low"])
        with submit_error("overloaded", "overloaded"):
            await sched.submit("x", priority=priority)
        with submit_error("overloaded", "overloaded"):
            await sched.enqueue("x", priority=priority)
        probe.release("gate")
        assert await within(asyncio.gather(*queued)) == ["low0", "low1", "low2"]
        assert await sched.enqueue("after") == 5


async def test_shed_lowest() -> None:
    """shed_lowest: an incoming LOW is refused; an incoming NORMAL evicts the newest LOW (shed)."""
    probe = Probe()
    async with scheduler(probe, slots=1, max_pending=3, overflow="shed_lowest") as sched:
        normal, low1, low2 = await _fill(sched, probe, ["normal", "low", "low"])
        with submit_error("overloaded", "overloaded"):
            await sched.submit("x", priority="low")
        incoming = await sched.submit("incoming", priority="normal")
        assert await failure(low2) == ("shed", "shed under overload", low2.id)
        assert await sched.status(low1.id) == "ready"
        assert (await sched.snapshot()).totals["shed"] == 1
        probe.release("gate")
        assert await within(asyncio.gather(normal, incoming, low1)) == [
            "normal0",
            "incoming",
            "low1",
        ]


async def test_shed_oldest() -> None:
    """shed_oldest: any incoming task evicts the oldest pending LOW; with none left, overloaded."""
    probe = Probe()
    async with scheduler(probe, slots=1, max_pending=3, overflow="shed_oldest") as sched:
        low0, normal, low2 = await _fill(sched, probe, ["low", "normal", "low"])
        low3 = await sched.submit("low3", priority="low")  # even a LOW evicts the oldest LOW
        assert await failure(low0) == ("shed", "shed under overload", low0.id)
        await sched.submit("crit", priority="critical")
        assert await failure(low2) == ("shed", "shed under overload", low2.id)
        await sched.submit("high", priority="high")
        assert await failure(low3) == ("shed", "shed under overload", low3.id)
        for priority in ("critical", "low"):
            with submit_error("overloaded", "overloaded"):
                await sched.submit("x", priority=priority)
        assert (await sched.snapshot()).totals["shed"] == 3
        probe.release("gate")
        assert await within(normal.result()) == "normal1"


async def test_wait_parks_submit_and_enqueue_until_there_is_room() -> None:
    """overflow="wait": submit and enqueue wait for room; submit_batch is refused (overloaded)."""
    probe = Probe()
    async with scheduler(probe, slots=1, max_pending=2) as sched:
        queued = await _fill(sched, probe, ["normal", "normal"])
        parked_submit = asyncio.ensure_future(sched.submit("s"))
        parked_enqueue = asyncio.ensure_future(sched.enqueue("e"))
        await asyncio.sleep(0.1)
        assert not parked_submit.done() and not parked_enqueue.done()
        with submit_error("overloaded", "overloaded"):
            await sched.submit_batch([Task("b1")])
        snap = await sched.snapshot()
        assert (snap.pending, snap.live_tasks, snap.totals["submitted"]) == (2, 3, 3)
        probe.release("gate")
        handle = await within(parked_submit)
        task_id = await within(parked_enqueue)
        assert sorted([handle.id, task_id]) == [4, 5]
        assert await within(handle.result()) == "s"
        assert await within(asyncio.gather(*queued)) == ["normal0", "normal1"]
        await status_is(sched, task_id, "succeeded")
        batch = await sched.submit_batch([Task("b1"), Task("b2")])  # exactly at the bound
        assert [h.id for h in batch] == [6, 7]
        assert await within(asyncio.gather(*batch)) == ["b1", "b2"]
