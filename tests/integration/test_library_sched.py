"""The asyncio Scheduler end to end: fixed starts, worker groups, recurring schedules, autoscaling.

docs/fixed-starts.md, docs/groups.md, docs/autoscaling.md and the snapshot fields held, desired,
reservations, fixed_start_hit_rate and cost (docs/library.md, "Snapshot"), with real executors and
short real times. The exact rules are pinned down on a virtual clock in
tests/unit/test_engine_fixed.py; here each feature is shown to work through the public API.

Timing assertions are loose (a fixed start within 50 ms of its time) and every wait is bounded,
so a regression fails quickly instead of hanging. Each test takes well under 3 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from cronoq import (
    AutoscaleConfig,
    Pool,
    PoolSnapshot,
    Scheduler,
    SchedulerError,
    SubmitError,
    TaskContext,
    TaskFailed,
    TaskHandle,
)
from helpers.vclock import LoopClock, vtime

# Every async test runs on a virtual-time loop (helpers/vclock.py); the schedulers read CLOCK,
# so starts, backoffs and timeouts land exactly on their virtual times.
pytestmark = pytest.mark.virtual_time
CLOCK = LoopClock()
MISSED_MSG = "fixed start missed"
CONFLICT_MSG = "fixed-start reservation conflict"
SLACK = 1e-6  # virtual time: a fixed start begins exactly on time (float rounding aside)


# --- helpers -----------------------------------------------------------------------------------


class Recorder:
    """An executor that logs (start time, ctx) and sleeps for `payload` seconds if it is a
    number; it returns ctx.group."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, TaskContext]] = []
        self.keys: list[str | None] = []
        self.tags: list[dict[str, str]] = []

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        self.runs.append((CLOCK(), ctx))
        self.keys.append(ctx.key)
        self.tags.append(ctx.tags)
        if isinstance(payload, (int, float)):
            await asyncio.sleep(payload)
        return ctx.group

    def started(self, task_id: int) -> list[float]:
        return [t for t, ctx in self.runs if ctx.id == task_id]


def fixed_pool(name: str, executor: Callable[..., Any], slots: int = 1, **options: Any) -> Pool:
    """A pool of exactly `slots` workers (no autoscaling)."""
    return Pool(name, executor, max=slots, initial=slots, autoscale=False, **options)


def make(executor: Callable[..., Any], slots: int = 1, **pool_options: Any) -> Scheduler:
    return Scheduler(
        [fixed_pool("default", executor, slots, **pool_options)], shutdown_grace=0.1, clock=CLOCK
    )


@contextlib.contextmanager
def raises_exactly(exc_type: type[BaseException], message: str) -> Iterator[Any]:
    """Like pytest.raises, but the whole str() of the exception must equal `message`."""
    with pytest.raises(exc_type) as info:
        yield info
    assert str(info.value) == message


async def within(aw: Awaitable[Any], seconds: float = 2.0) -> Any:
    return await asyncio.wait_for(aw, seconds)


async def failure(handle: TaskHandle, seconds: float = 2.0) -> TaskFailed:
    with pytest.raises(TaskFailed) as info:
        await within(handle.result(), seconds)
    return info.value


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 2.0) -> None:
    """Poll `check` until it is true."""
    deadline = vtime() + seconds
    while not await check():
        if vtime() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def pool_of(sched: Scheduler, name: str = "default") -> PoolSnapshot:
    snap = await sched.snapshot()
    p = snap.pool(name)
    assert p is not None
    return p


async def _is(sched: Scheduler, ref: int | str, status: str) -> bool:
    return await sched.status(ref) == status


async def sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - CLOCK()))


def utc_second(key: str, prefix: str) -> float:
    """The Unix time named by an occurrence key '<prefix>@YYYY-MM-DDTHH:MM:SSZ'."""
    assert key.startswith(prefix + "@") and key.endswith("Z"), key
    stamp = key[len(prefix) + 1 : -1]
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()


# --- fixed starts (docs/fixed-starts.md, "Fixed starts") ------------------------------------------


async def test_fixed_start_is_scheduled_then_runs_at_its_time() -> None:
    """A start_at task on an idle pool is scheduled until its time and starts right at it."""
    rec = Recorder()
    async with make(rec) as sched:
        at = CLOCK() + 0.3
        handle = await sched.submit("x", start_at=at)
        assert await sched.status(handle.id) == "scheduled"
        await sleep_until(at - 0.1)
        assert await sched.status(handle.id) == "scheduled"
        assert rec.runs == []
        assert await within(handle) == {}
        (started,) = rec.started(handle.id)
        assert at - 0.002 <= started <= at + SLACK
        p = await pool_of(sched)
        assert (p.fixed_start_hit_rate, p.reservations, p.held) == (1.0, 0, 0)


async def test_start_in_runs_within_tolerance() -> None:
    rec = Recorder()
    async with make(rec, 2, reservable_fraction=1.0) as sched:
        t0 = CLOCK()
        handles = [await sched.submit(f"t{i}", start_in=0.2 + 0.1 * i) for i in range(2)]
        for h in handles:
            await within(h)
        for i, h in enumerate(handles):
            (started,) = rec.started(h.id)
            assert t0 + 0.2 + 0.1 * i - 0.002 <= started <= t0 + 0.2 + 0.1 * i + SLACK + 0.01
        assert (await pool_of(sched)).fixed_start_hit_rate == 1.0


async def test_held_slot_is_visible_before_the_start() -> None:
    """The slot is held from max(tolerance, default_duration) before the start."""
    rec = Recorder()
    async with make(rec, default_duration=0.3) as sched:
        t0 = CLOCK()
        # lead = max(tolerance 0.1, default_duration 0.3): the hold starts at t0 + 0.3
        fixed = await sched.submit(0.1, start_at=t0 + 0.6, tolerance=0.1)
        await sleep_until(t0 + 0.15)
        p = await pool_of(sched)
        assert (p.held, p.reservations, p.capacity, p.busy) == (0, 1, 1, 0)
        await sleep_until(t0 + 0.4)
        p = await pool_of(sched)
        assert (p.held, p.reservations) == (1, 1)
        plain = await sched.submit("plain")  # must not take the held slot
        await asyncio.sleep(0.05)
        assert await sched.status(plain.id) == "ready"
        await within(fixed)
        await within(plain)
        (fixed_start,) = rec.started(fixed.id)
        (plain_start,) = rec.started(plain.id)
        assert t0 + 0.6 - 0.002 <= fixed_start <= t0 + 0.6 + SLACK
        assert plain_start >= fixed_start + 0.1 - 0.002
        p = await pool_of(sched)
        assert (p.held, p.reservations, p.fixed_start_hit_rate) == (0, 0, 1.0)


@pytest.mark.parametrize(
    ("on_miss", "status"), [("skip", "missed"), ("fail", "failed"), ("run_late", None)]
)
async def test_only_worker_busy_past_the_tolerance(on_miss: str, status: str | None) -> None:
    """The only worker is busy past start + tolerance: on_miss decides (skip, fail, run_late)."""
    rec = Recorder()
    async with make(rec) as sched:
        blocker = await sched.submit(0.5)
        await until(lambda: _is(sched, blocker.id, "running"))
        t0 = CLOCK()
        handle = await sched.submit(0.0, start_in=0.1, tolerance=0.1, on_miss=on_miss)
        if status is None:
            await within(handle)
            (started,) = rec.started(handle.id)
            assert started >= rec.started(blocker.id)[0] + 0.5 - 0.002
        else:
            err = await failure(handle)
            assert (err.status, err.message, err.task_id) == (status, MISSED_MSG, handle.id)
            assert str(err) == f"task {handle.id} ended as {status}: {MISSED_MSG}"
            assert 0.2 - 0.002 <= CLOCK() - t0 < 0.45  # at start + tolerance, not later
            assert rec.started(handle.id) == []
            assert (await sched.snapshot()).totals[status] == 1
        p = await pool_of(sched)
        assert (p.fixed_start_hit_rate, p.reservations) == (0.0, 0)


@pytest.mark.parametrize(
    ("late", "on_miss", "status"),
    [
        (1.1, "skip", "missed"),
        (1.1, "fail", "failed"),
        (1.1, "run_late", "succeeded"),
        (0.9, "skip", "succeeded"),
    ],
)
async def test_start_at_in_the_past(late: float, on_miss: str, status: str) -> None:
    """A start 0.9 s late runs at once; 1.1 s late, on_miss applies at once (awaiting reports
    the real status and reason, not "task already finished")."""
    rec = Recorder()
    async with make(rec) as sched:
        handle = await sched.submit("x", start_at=CLOCK() - late, on_miss=on_miss)
        if status == "succeeded":
            assert await within(handle) == {}
        else:
            err = await failure(handle)
            assert (err.status, err.message) == (status, MISSED_MSG)
        assert await sched.status(handle.id) == status


async def test_start_at_accepts_an_aware_datetime() -> None:
    rec = Recorder()
    async with make(rec) as sched:
        at = CLOCK() + 0.2
        handle = await sched.submit("x", start_at=datetime.fromtimestamp(at, UTC))
        assert await sched.status(handle.id) == "scheduled"
        await within(handle)
        (started,) = rec.started(handle.id)
        assert at - 0.002 <= started <= at + SLACK


async def test_reservation_conflict_and_limits() -> None:
    """One overlapping reservation too many is a conflict, a later start is accepted; the limit
    is max(1, floor(max * reservable_fraction)), with 0.0 honoured as a limit of 1."""
    rec = Recorder()
    sched = Scheduler(
        [
            fixed_pool("two", rec, 2),
            fixed_pool("ten", rec, 10),
            fixed_pool("all", rec, 4, reservable_fraction=1.0),
            fixed_pool("none", rec, 4, reservable_fraction=0.0),
        ],
        shutdown_grace=0.1,
        clock=CLOCK,
    )
    async with sched:
        await sched.submit("a", pool="two", start_in=1.0, duration_hint=0.5)
        with raises_exactly(SubmitError, CONFLICT_MSG) as info:
            await sched.submit("b", pool="two", start_in=1.2, duration_hint=0.5)
        assert info.value.code == "reservation_conflict"
        await sched.submit("c", pool="two", start_in=5.0, duration_hint=0.5)
        for name, limit in (("ten", 5), ("all", 4), ("none", 1)):
            for _ in range(limit):
                await sched.submit("x", pool=name, start_in=2.0)
            with pytest.raises(SubmitError) as info:
                await sched.submit("x", pool=name, start_in=2.0)
            assert info.value.code == "reservation_conflict"
            assert (await pool_of(sched, name)).reservations == limit
        assert (await pool_of(sched, "two")).reservations == 2


async def test_cancelling_a_scheduled_task_drops_its_reservation() -> None:
    rec = Recorder()
    async with make(rec, 2) as sched:
        handle = await sched.submit("x", start_in=1.0, key="k")
        assert (await pool_of(sched)).reservations == 1
        assert await sched.cancel("k") is True
        assert (await pool_of(sched)).reservations == 0
        err = await failure(handle)
        assert (err.status, err.message) == ("cancelled", "cancelled")
        assert rec.runs == []


async def test_deps_and_fixed_start_go_blocked_scheduled_ready() -> None:
    rec = Recorder()
    sched = Scheduler(
        [fixed_pool("default", rec, 2)], emit_transitions=True, shutdown_grace=0.1, clock=CLOCK
    )
    async with sched:
        events = sched.events()
        parent = await sched.submit(0.1, key="parent")
        at = CLOCK() + 0.3
        child = await sched.submit("c", after="parent", start_at=at)
        assert await sched.status(child.id) == "blocked"
        await within(child)
        seen: list[str] = []
        async for ev in events:
            if ev.id == child.id:
                seen.append(ev.status)
                if ev.status == "succeeded":
                    break
        assert seen == ["blocked", "scheduled", "ready", "running", "succeeded"]
        assert rec.started(parent.id)[0] + 0.1 <= at
        assert at - 0.002 <= rec.started(child.id)[0] <= at + SLACK


# --- worker groups (docs/groups.md) ---------------------------------------------------------------


async def test_group_capacity_labels_and_ctx_group() -> None:
    """A labeled task waits (not counted as ready) until a matching group
    appears, runs there (subset match) and sees the group's labels in ctx.group."""
    rec = Recorder()
    async with make(rec) as sched:
        labeled = await sched.submit("l", labels={"gpu": "a100"})
        await asyncio.sleep(0.05)
        assert await sched.status(labeled.id) == "ready"
        p = await pool_of(sched)
        assert (p.capacity, p.ready, p.pending) == (1, 0, 1)
        unlabeled = await sched.submit("u")
        assert await within(unlabeled) == {}  # the waiting labeled task blocks nobody
        await sched.set_group_capacity("default", {"gpu": "a100", "zone": "eu"}, 1)
        assert await within(labeled) == {"gpu": "a100", "zone": "eu"}
        assert (await pool_of(sched)).capacity == 2
        plain = await sched.submit("plain")
        assert await within(plain) == {}  # unlabeled slots first
        await sched.set_group_capacity("default", {"gpu": "a100", "zone": "eu"}, 0)
        assert (await pool_of(sched)).capacity == 1
        again = await sched.submit("again", labels={"zone": "eu"})
        await asyncio.sleep(0.05)
        assert await sched.status(again.id) == "ready"
        await sched.set_group_capacity("default", {"zone": "eu"}, 2)
        assert await within(again) == {"zone": "eu"}
        assert (await pool_of(sched)).capacity == 3


async def test_unlabeled_tasks_use_group_slots_when_the_unlabeled_ones_are_busy() -> None:
    rec = Recorder()
    async with make(rec) as sched:
        await sched.set_group_capacity("default", {"gpu": "a100"}, 1)
        first = await sched.submit(0.2)
        second = await sched.submit(0.2)
        assert sorted([await within(first), await within(second)], key=len) == [
            {},
            {"gpu": "a100"},
        ]
        assert abs(rec.started(first.id)[0] - rec.started(second.id)[0]) < SLACK


async def test_set_group_capacity_validation() -> None:
    rec = Recorder()
    async with make(rec) as sched:
        with raises_exactly(SubmitError, "unknown pool 'nope'") as info:
            await sched.set_group_capacity("nope", {"gpu": "a100"}, 1)
        assert info.value.code == "unknown_pool"
        with pytest.raises(TypeError):
            await sched.set_group_capacity("default", {"gpu": 1}, 1)  # type: ignore[dict-item]
        with pytest.raises(OverflowError):
            await sched.set_group_capacity("default", {"gpu": "a100"}, -1)
        with pytest.raises(TypeError):
            await sched.submit("x", labels={"gpu": 1})
        assert (await pool_of(sched)).capacity == 1


# --- recurring schedules (docs/fixed-starts.md, "Recurring schedules") ----------------------------


async def test_every_second_schedule_keys_tags_and_remove() -> None:
    """One task per second keyed '<key>@<UTC time>Z' with the tag cronoq.recurring; a schedule
    in another zone also keys in UTC; remove_recurring says whether the schedule existed."""
    rec = Recorder()
    # Each occurrence reserves [t - 1, t + expected + 1): room for both schedules.
    async with make(rec, 8, reservable_fraction=1.0) as sched:
        await sched.add_recurring("r", "* * * * * *", 0.05, key="tk", tags={"team": "ops"})
        await sched.add_recurring("b", "* * * * * *", 0.05, key="bk", tz="Europe/Berlin")

        async def two_each() -> bool:
            keys = [k for k in rec.keys if k]
            return (
                sum(k.startswith("tk@") for k in keys) >= 2
                and sum(k.startswith("bk@") for k in keys) >= 2
            )

        await until(two_each, 2.6)
        assert await sched.remove_recurring("r") is True
        assert await sched.remove_recurring("b") is True
        assert await sched.remove_recurring("r") is False
        for (started, ctx), key, tags in zip(rec.runs, rec.keys, rec.tags, strict=True):
            assert key is not None
            prefix, _, _ = key.partition("@")
            second = utc_second(key, prefix)
            assert second - 0.002 <= started <= second + SLACK  # runs at the keyed second
            expected = {"team": "ops"} if prefix == "tk" else {}
            assert tags == {**expected, "cronoq.recurring": "r" if prefix == "tk" else "b"}
            assert ctx.pool == "default"
        tk = sorted(utc_second(k, "tk") for k in rec.keys if k and k.startswith("tk@"))
        assert all(b - a == 1.0 for a, b in itertools.pairwise(tk))
        totals = (await sched.snapshot()).totals
        assert totals["submitted"] >= 4


async def test_every_second_schedule_on_a_one_slot_pool_runs_every_second() -> None:
    """An every-second schedule on the smallest pool (reservation limit 1): a 50 ms job must
    not collide with its own next occurrence."""
    rec = Recorder()
    async with make(rec) as sched:
        await sched.add_recurring("r", "* * * * * *", 0.05, key="tk")

        async def two() -> bool:
            return len(rec.runs) >= 2

        await until(two, 2.3)
        assert await sched.remove_recurring("r") is True
        first, second = (utc_second(k or "", "tk") for k in rec.keys[:2])
        assert second - first == 1.0
        assert (await sched.snapshot()).totals["recurring_conflicts"] == 0


async def test_remove_recurring_cancels_the_occurrence_that_has_not_started() -> None:
    """Our decision (docs/library.md, "Differences from the published package"): nothing of a
    removed schedule runs afterwards."""
    rec = Recorder()
    async with make(rec, 4, reservable_fraction=1.0) as sched:
        await sched.add_recurring("r", "* * * * * *", "x", key="tk")
        await asyncio.sleep(0.05)  # the scheduler has planned what comes next
        assert await sched.remove_recurring("r") is True
        await asyncio.sleep(1.2)  # past the next whole second
        assert rec.runs == []
        snap = await sched.snapshot()
        assert snap.live_tasks == 0
        assert snap.totals["cancelled"] == snap.totals["submitted"]


async def test_add_recurring_validation() -> None:
    """Cron expressions, time zones, overlap and on_miss are checked (docs/fixed-starts.md,
    "Recurring schedules")."""
    rec = Recorder()
    async with make(rec) as sched:
        with raises_exactly(
            SchedulerError,
            "configuration error: invalid cron '* * * *': Invalid pattern: Pattern must have "
            "between 5 and 7 fields.",
        ):
            await sched.add_recurring("r", "* * * *", "x")
        with raises_exactly(
            SchedulerError, "configuration error: unknown time zone 'Mars/Olympus'"
        ):
            await sched.add_recurring("r", "* * * * *", "x", tz="Mars/Olympus")
        with raises_exactly(
            ValueError, "overlap must be 'skip', 'allow', 'queue' or 'queue_on_success'"
        ):
            await sched.add_recurring("r", "* * * * *", "x", overlap="never")
        with pytest.raises(ValueError):
            await sched.add_recurring("r", "* * * * *", "x", on_miss="later")
        with pytest.raises(TypeError):
            await sched.add_recurring("r", "* * * * *", "x", after="a")
        assert await sched.remove_recurring("r") is False  # nothing was added
        for expr in ("* * * * *", "0 0 * * * * 2099", "@hourly", "0 0 30 2 *"):
            await sched.add_recurring("ok", expr, "x")  # replaces the previous one
        assert await sched.remove_recurring("ok") is True
        assert await sched.remove_recurring("ok") is False
        assert rec.runs == []


# --- autoscaling (docs/autoscaling.md) ------------------------------------------------------------


async def test_autoscaled_pool_grows_under_load() -> None:
    """On a fast grid (interval 0.25 s) 40 queued tasks grow the pool 1 -> 5 -> 8, desired
    follows capacity, and cost = worker_seconds x cost_per_worker_second."""
    rec = Recorder()
    scaling = AutoscaleConfig(interval=0.25, cost_per_worker_second=2.0)
    sched = Scheduler(
        [Pool("default", rec, max=8, autoscale=scaling)], shutdown_grace=0.1, clock=CLOCK
    )
    async with sched:
        p = await pool_of(sched)
        assert (p.capacity, p.desired) == (1, 1)
        t0 = CLOCK()
        handles = [await sched.submit(0.2) for _ in range(40)]
        seen: list[int] = []

        async def full() -> bool:
            q = await pool_of(sched)
            assert q.desired == q.capacity
            if not seen or seen[-1] != q.capacity:
                seen.append(q.capacity)
            return q.capacity == 8

        await until(full, 1.5)
        assert seen[0] == 1 and seen[-1] == 8
        assert 5 in seen  # one step of +4 before the second one
        assert CLOCK() - t0 < 1.0
        for h in handles:
            await within(h, 2.0)
        assert CLOCK() - t0 < 2.0
        p = await pool_of(sched)
        assert p.worker_seconds > 0
        assert p.cost == pytest.approx(2.0 * p.worker_seconds, rel=1e-9)


async def test_min_zero_pool_starts_empty_and_grows_for_a_submission() -> None:
    """A min=0 pool starts with no workers; a submission gets one at the next evaluation."""
    rec = Recorder()
    scaling = AutoscaleConfig(interval=0.3)
    sched = Scheduler(
        [Pool("default", rec, min=0, max=2, autoscale=scaling)], shutdown_grace=0.1, clock=CLOCK
    )
    async with sched:
        p = await pool_of(sched)
        assert (p.capacity, p.desired) == (0, 0)
        t0 = CLOCK()
        handle = await sched.submit("x")
        await asyncio.sleep(0.05)
        assert await sched.status(handle.id) == "ready"
        await within(handle, 1.0)
        assert CLOCK() - t0 < 0.3 + SLACK + 0.05
        assert (await pool_of(sched)).capacity >= 1


async def test_reservations_raise_the_capacity_of_an_autoscaled_pool() -> None:
    """Three reservations 0.8 s ahead bring a min=0 pool to 3 before they start."""
    rec = Recorder()
    scaling = AutoscaleConfig(interval=0.2)
    sched = Scheduler(
        [Pool("default", rec, min=0, max=6, autoscale=scaling)], shutdown_grace=0.1, clock=CLOCK
    )
    async with sched:
        t0 = CLOCK()
        handles = [await sched.submit(0.05, start_at=t0 + 0.8) for _ in range(3)]

        async def three() -> bool:
            return (await pool_of(sched)).capacity == 3

        await until(three, 0.5)
        p = await pool_of(sched)
        assert (p.desired, p.reservations) == (3, 3)
        for h in handles:
            await within(h)
        for h in handles:
            (started,) = rec.started(h.id)
            assert t0 + 0.8 - 0.002 <= started <= t0 + 0.8 + SLACK
        assert (await pool_of(sched)).fixed_start_hit_rate == 1.0


async def test_cost_is_worker_seconds_times_rate() -> None:
    """cost = worker_seconds x cost_per_worker_second; a pool without autoscaling has no rate,
    so no cost."""
    rec = Recorder()
    scaling = AutoscaleConfig(cost_per_worker_second=2.0)
    sched = Scheduler(
        [Pool("a", rec, min=2, max=2, autoscale=scaling), fixed_pool("f", rec, 3)],
        shutdown_grace=0.1,
        clock=CLOCK,
    )
    async with sched:
        await asyncio.sleep(0.2)
        a = await pool_of(sched, "a")
        assert a.capacity == 2
        assert 0.3 <= a.worker_seconds < 0.3 + 2 * 0.2
        assert a.cost == pytest.approx(2.0 * a.worker_seconds, rel=1e-9)
        f = await pool_of(sched, "f")
        assert f.worker_seconds > 0
        assert f.cost == 0.0
