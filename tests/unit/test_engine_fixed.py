"""Unit tests of the engine core: fixed starts, worker groups, recurring schedules, autoscaling.

docs/fixed-starts.md (fixed starts, reservations, held workers, recurring schedules),
docs/groups.md (worker groups and labels), docs/autoscaling.md, the snapshot fields of
docs/library.md, "Snapshot" that belong to them (held, desired, reservations, fixed_start_hit_rate,
cost), on a virtual clock: times are plain floats handed to every engine call, nothing sleeps and
nothing touches asyncio. `Driver` (tests/helpers/engine.py) plays a punctual driver: it fires every
timer at its own time, fills free slots, ends attempts after the runtime their payload asks for and
logs every start.

Decisions of ours tested as such (the published package leaves them open or we differ on purpose;
docs/library.md, "Differences from the published package"):

* at its start time a fixed-start task becomes `ready` and runs on its held slot ahead of the
  ready queues; past start + tolerance with on_miss skip/fail it ends missed/failed (from ready
  or scheduled) with the message "fixed start missed";
* a held slot counts from `start - max(tolerance, learned mean runtime of the pool or
  default_duration)`; `held` in the snapshot is min(holds, free slots);
* the reservation interval is [start - tolerance, start + expected + tolerance) with expected =
  duration_hint, else the pool's learned runtime of that kind, else default_duration; the limit
  is max(1, floor(max * reservable_fraction)), also for 0.0;
* removing or replacing a recurring schedule cancels its occurrence that has not started.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from cronoq.core.autoscale import AutoscaleSettings
from cronoq.core.cron import parse_cron, zone
from cronoq.core.engine import EVENTS_ALL, Engine
from cronoq.core.model import (
    Extras,
    PoolConfig,
    PoolSnapshot,
    Priority,
    RetryPolicy,
    TaskRecord,
)
from cronoq.core.recurring import Recurring
from cronoq.core.resources import ResourceConfig
from cronoq.errors import SubmitError
from helpers.engine import Driver, Job, make_engine

CRIT = int(Priority.CRITICAL)
NORMAL = int(Priority.NORMAL)

MISSED_MSG = "fixed start missed"
OVERLAP_MSG = "previous occurrence still running"
CONFLICT = ("reservation_conflict", "fixed-start reservation conflict")
RECURRING_TAG = "cronoq.recurring"

# 2023-11-14T22:13:20Z: a whole second, so a 6-field cron fires at T0 + 1, T0 + 2, ...
T0 = 1_700_000_000.0


# --- helpers -----------------------------------------------------------------------------------


def fixed(
    start: float,
    tolerance: float = 1.0,
    on_miss: str = "run_late",
    *,
    payload: Any = None,
    deps: Sequence[tuple[int | str, str]] = (),
    **kw: Any,
) -> TaskRecord:
    """A fixed-start record with the options as build_task stores them."""
    extra: dict[str, Any] = {"start_at": start, "tolerance": tolerance, "on_miss": on_miss}
    if deps:
        extra["deps"] = list(deps)
    return TaskRecord(payload, "p", extra=Extras(**extra), **kw)


def plain(payload: Any = None, **kw: Any) -> TaskRecord:
    return TaskRecord(payload, "p", **kw)


def sub(eng: Engine, now: float, rec: TaskRecord) -> TaskRecord:
    got, dup = eng.submit(rec, now)
    assert not dup
    return got


def snap(eng: Engine, now: float) -> PoolSnapshot:
    return eng.snapshot(now).pools[0]


def rejected(call: Callable[[], Any]) -> tuple[str, str]:
    """(code, message) of the SubmitError the call raises."""
    with pytest.raises(SubmitError) as info:
        call()
    return info.value.code, info.value.message


def recurring(
    expr: str = "* * * * * *",
    payload: Any = None,
    *,
    name: str = "r",
    tz: str | None = None,
    key: str | None = "tk",
    **kw: Any,
) -> Recurring:
    return Recurring(name, parse_cron(expr), zone(tz), payload, "p", key=key, **kw)


def utc_key(key: str, t: float) -> str:
    return f"{key}@{datetime.fromtimestamp(t, UTC).strftime('%Y-%m-%dT%H:%M:%S')}Z"


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# --- fixed starts: status, dispatch time, held slots (docs/fixed-starts.md, "Fixed starts") -------


def test_fixed_start_is_scheduled_until_its_time_then_runs_exactly_then() -> None:
    """Scheduled until the start time, ready and running exactly at it."""
    eng = make_engine(1)
    run = Driver(eng)
    f = sub(eng, 0.0, fixed(10.0, payload=Job(0.5)))
    run.run_until(0.0)
    assert f.status_name == "scheduled"
    run.run_until(9.999)
    assert f.status_name == "scheduled"
    assert run.starts == []
    run.run_until(10.0)
    assert f.status_name == "running"
    assert run.started(f) == [10.0]
    assert f.running is not None and f.running.started_at == 10.0
    run.run_until(11.0)
    assert f.status_name == "succeeded"
    assert run.statuses(f) == [
        ("blocked", 0.0, None),
        ("scheduled", 0.0, None),
        ("ready", 10.0, None),
        ("running", 10.0, None),
        ("succeeded", 10.5, None),
    ]
    p = snap(eng, 11.0)
    assert (p.fixed_start_hit_rate, p.reservations, p.held, p.pending) == (1.0, 0, 0, 0)


def test_fixed_start_runs_on_its_held_slot_ahead_of_ready_tasks() -> None:
    """A ready CRITICAL task submitted during the hold does not take the held slot; the fixed
    task starts at its time and the CRITICAL one only when a slot frees."""
    eng = make_engine(2)
    run = Driver(eng)
    long = sub(eng, 0.0, plain(Job(100.0)))
    f = sub(eng, 0.0, fixed(10.0, 0.0, payload=Job(5.0)))  # lead max(0, 1.0) -> hold from 9.0
    run.run_until(9.5)
    crit = sub(eng, 9.5, plain(Job(1.0), cls=CRIT))
    run.run_until(9.5)
    assert run.started(long) == [0.0]
    assert crit.status_name == "ready"
    p = snap(eng, 9.5)
    assert (p.capacity, p.busy, p.held, p.ready, p.reservations) == (2, 1, 1, 1, 1)
    run.run_until(10.0)
    assert run.started(f) == [10.0]
    assert crit.status_name == "ready"
    p = snap(eng, 10.0)
    assert (p.busy, p.held, p.ready, p.reservations) == (2, 0, 1, 0)
    run.run_until(20.0)
    assert run.started(crit) == [15.0]  # when the fixed task's slot frees


def test_ready_task_submitted_before_the_hold_runs_even_if_it_overruns() -> None:
    """Ready tasks submitted before the hold starts are dispatched normally."""
    eng = make_engine(1)
    run = Driver(eng)
    f = sub(eng, 0.0, fixed(10.0, 1.0, payload=Job(1.0)))  # hold from 9.0
    run.run_until(8.5)
    r = sub(eng, 8.5, plain(Job(3.5)))
    run.run_until(8.5)
    assert run.started(r) == [8.5]
    run.run_until(9.5)
    assert eng.pools["p"].holds == 1
    assert snap(eng, 9.5).held == 0  # one hold, but no free slot
    run.run_until(13.0)
    assert f.status_name == "succeeded"
    assert run.started(f) == [12.0]  # run_late: as soon as the slot frees
    assert snap(eng, 13.0).fixed_start_hit_rate == 0.0


def test_a_ready_task_submitted_just_before_the_hold_takes_the_slot() -> None:
    eng = make_engine(1)
    run = Driver(eng)
    sub(eng, 0.0, fixed(10.0, 0.0))
    run.run_until(8.999)
    r = sub(eng, 8.999, plain())
    run.run_until(8.999)
    assert r.status_name == "running"
    eng2 = make_engine(1)
    run2 = Driver(eng2)
    sub(eng2, 0.0, fixed(10.0, 0.0))
    run2.run_until(9.0)
    r2 = sub(eng2, 9.0, plain())
    run2.run_until(9.0)
    assert r2.status_name == "ready"


@pytest.mark.parametrize(
    ("tolerance", "default_duration", "observed", "hint", "lead"),
    [
        (0.0, 1.0, None, None, 1.0),  # no runtimes observed yet: default_duration
        (2.0, 1.0, None, None, 2.0),
        (0.0, 3.0, None, None, 3.0),
        (0.0, 0.1, None, None, 0.1),
        (0.0, 1.0, 0.5, None, 0.5),  # after observing 0.5 s runtimes
        (2.0, 1.0, 0.5, None, 2.0),  # the larger of tolerance and the learned runtime
        (0.0, 1.0, None, 5.0, 1.0),  # the task's own duration_hint does not change the lead
    ],
)
def test_hold_begins_at_start_minus_lead(
    tolerance: float,
    default_duration: float,
    observed: float | None,
    hint: float | None,
    lead: float,
) -> None:
    eng = make_engine(2, default_duration=default_duration)
    run = Driver(eng)
    if observed is not None:
        for _ in range(3):
            sub(eng, 0.0, plain(Job(observed)))
        run.run_until(5.0)
        assert eng.totals["succeeded"] == 3
    start = 20.0
    run.submit(5.0, fixed(start, tolerance, duration_hint=hint))
    before = start - lead - 0.001
    run.run_until(before)
    assert snap(eng, before).held == 0
    run.run_until(start - lead)
    assert snap(eng, start - lead).held == 1
    # A ready task now gets only the slot that is not held.
    a, b = sub(eng, start - lead, plain()), sub(eng, start - lead, plain())
    run.run_until(start - lead)
    assert (a.status_name, b.status_name) == ("running", "ready")


@pytest.mark.parametrize(("max_hold", "lead"), [(None, 5.0), (2.0, 2.0), (5.0, 5.0), (30.0, 5.0)])
def test_max_hold_caps_the_lead(max_hold: float | None, lead: float) -> None:
    """PoolConfig.max_hold: a 5 s tolerance holds from 5 s ahead, or from max_hold ahead."""
    eng = make_engine(2, max_hold=max_hold)
    run = Driver(eng)
    start = 20.0
    run.submit(1.0, fixed(start, 5.0))
    before = start - lead - 0.001
    run.run_until(before)
    assert snap(eng, before).held == 0
    run.run_until(start - lead)
    assert snap(eng, start - lead).held == 1


def test_held_is_min_of_holds_and_free_slots() -> None:
    eng = make_engine(3, max=10)
    run = Driver(eng)
    for _ in range(2):
        sub(eng, 0.0, fixed(10.0, 0.0))
    run.run_until(9.0)
    assert snap(eng, 9.0).held == 2
    x, y = sub(eng, 9.0, plain()), sub(eng, 9.0, plain())
    run.run_until(9.0)
    assert (x.status_name, y.status_name) == ("running", "ready")
    p = snap(eng, 9.0)
    assert (p.busy, p.held) == (1, 2)
    eng.set_capacity("p", 2, 9.5)
    assert snap(eng, 9.5).held == 1  # two holds, one free slot
    eng.set_capacity("p", 1, 9.6)
    assert snap(eng, 9.6).held == 0


# --- reservations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_", "fraction", "limit"),
    [
        (2, 0.5, 1),
        (4, 0.5, 2),
        (4, 0.1, 1),
        (4, 0.25, 1),
        (4, 0.99, 3),
        (4, 1.0, 4),
        (6, 0.5, 3),
        (10, 0.5, 5),
        (10, 1.0, 10),
        (4, 0.0, 1),  # we honour 0.0 (the published package treats it like 0.5)
        (10, 0.0, 1),
    ],
)
def test_reservation_limit(max_: int, fraction: float, limit: int) -> None:
    """limit = max(1, floor(max * fraction)), taken from max, not from the capacity."""
    eng = make_engine(1, max=max_, reservable_fraction=fraction)
    for i in range(limit):
        sub(eng, 0.0, fixed(10.0 + 0.01 * i))
    assert snap(eng, 0.0).reservations == limit
    assert rejected(lambda: eng.submit(fixed(10.0), 0.0)) == CONFLICT
    assert snap(eng, 0.0).reservations == limit
    # a start whose interval no longer overlaps is accepted
    sub(eng, 0.0, fixed(100.0))
    assert snap(eng, 0.0).reservations == limit + 1


def test_overlapping_start_conflicts_a_later_one_is_accepted() -> None:
    eng = make_engine(2, max=2)
    sub(eng, 0.0, fixed(1.0, duration_hint=0.5))
    assert rejected(lambda: eng.submit(fixed(1.2, duration_hint=0.5), 0.0)) == CONFLICT
    sub(eng, 0.0, fixed(5.0, duration_hint=0.5))


def test_rejected_reservation_leaves_no_trace() -> None:
    eng = make_engine(1, max=2)
    a = sub(eng, 0.0, fixed(10.0, key="a"))
    totals = dict(eng.totals)
    assert rejected(lambda: eng.submit(fixed(10.0, key="b"), 0.0)) == CONFLICT
    assert eng.totals == totals
    assert eng.lookup("b") is None
    assert sorted(eng.tasks) == [a.id]
    assert sub(eng, 0.0, plain()).id == a.id + 1  # no id consumed
    assert sub(eng, 0.0, fixed(10.0, key="b", duration_hint=0.0, tolerance=0.0)).key == "b"


@pytest.mark.parametrize(
    ("first", "second", "conflict"),
    [
        # [start - tol, start + hint + tol): [9, 13) against [13, 15): touching is no overlap
        ({"start": 10.0, "duration_hint": 2.0}, {"start": 14.0}, False),
        ({"start": 10.0, "duration_hint": 2.0}, {"start": 13.99}, True),
        # the lower end: [9, 12) against [6, 9) and [6.01, 9.01)
        ({"start": 10.0}, {"start": 7.0}, False),
        ({"start": 10.0}, {"start": 7.01}, True),
        # tolerance 0: [10, 11) against [11, 12) and [10.99, 11.99)
        ({"start": 10.0, "tolerance": 0.0}, {"start": 11.0, "tolerance": 0.0}, False),
        ({"start": 10.0, "tolerance": 0.0}, {"start": 10.99, "tolerance": 0.0}, True),
        # a long tolerance widens both ends: [5, 16)
        ({"start": 10.0, "tolerance": 5.0}, {"start": 15.5, "tolerance": 0.0}, True),
        ({"start": 10.0, "tolerance": 5.0}, {"start": 16.0, "tolerance": 0.0}, False),
    ],
)
def test_reservation_interval(
    first: dict[str, Any], second: dict[str, Any], conflict: bool
) -> None:
    eng = make_engine(1, max=2)  # limit 1

    def rec(spec: dict[str, Any]) -> TaskRecord:
        spec = dict(spec)
        return fixed(spec.pop("start"), spec.pop("tolerance", 1.0), **spec)

    sub(eng, 0.0, rec(first))
    if conflict:
        assert rejected(lambda: eng.submit(rec(second), 0.0)) == CONFLICT
    else:
        sub(eng, 0.0, rec(second))
        assert snap(eng, 0.0).reservations == 2


@pytest.mark.parametrize(("kind", "conflict"), [("k", True), ("other", False)])
def test_reservation_uses_the_learned_runtime_of_the_kind(kind: str, conflict: bool) -> None:
    """Kind "k" was observed to run 3 s: its interval is [10, 13); other kinds use 1.0 s."""
    eng = make_engine(1, max=2)
    run = Driver(eng)
    sub(eng, 0.0, plain(Job(3.0), kind="k"))
    run.run_until(3.0)
    sub(eng, 3.0, fixed(10.0, 0.0, kind=kind))
    second = fixed(12.5, 0.0, kind="other")
    if conflict:
        assert rejected(lambda: eng.submit(second, 3.0)) == CONFLICT
        sub(eng, 3.0, fixed(13.0, 0.0, kind="k"))  # [13, 16) touches [10, 13)
    else:
        sub(eng, 3.0, second)


def test_reservation_uses_default_duration() -> None:
    eng = make_engine(1, max=2, default_duration=3.0)
    sub(eng, 0.0, fixed(10.0, 0.0))  # [10, 13)
    assert rejected(lambda: eng.submit(fixed(12.9, 0.0), 0.0)) == CONFLICT
    sub(eng, 0.0, fixed(13.0, 0.0))


def test_batch_mates_count_against_the_limit() -> None:
    eng = make_engine(1, max=4)  # limit 2
    batch = [fixed(10.0, key=f"b{i}") for i in range(3)]
    assert rejected(lambda: eng.submit_batch(batch, 0.0)) == CONFLICT
    assert eng.tasks == {}
    assert snap(eng, 0.0).reservations == 0
    got = eng.submit_batch([fixed(10.0), fixed(10.5)], 0.0)
    assert [dup for _, dup in got] == [False, False]
    assert snap(eng, 0.0).reservations == 2
    assert rejected(lambda: eng.submit(fixed(10.2), 0.0)) == CONFLICT
    # a batch whose one task overlaps the existing reservations is rejected as a whole
    late = [fixed(50.0, key="ok"), fixed(10.0, key="clash")]
    assert rejected(lambda: eng.submit_batch(late, 0.0)) == CONFLICT
    assert eng.lookup("ok") is None
    # non-overlapping batch-mates are fine
    eng.submit_batch([fixed(50.0), fixed(60.0), fixed(70.0)], 0.0)
    assert snap(eng, 0.0).reservations == 5


# --- missing the start ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("late", "on_miss", "status", "message", "hit_rate"),
    [
        (1.1, "skip", "missed", MISSED_MSG, 0.0),
        (1.1, "fail", "failed", MISSED_MSG, 0.0),
        (1.1, "run_late", "running", None, 0.0),
        (0.9, "skip", "running", None, 1.0),
        (0.9, "fail", "running", None, 1.0),
        (0.9, "run_late", "running", None, 1.0),
        (0.0, "skip", "running", None, 1.0),
    ],
)
def test_start_at_in_the_past(
    late: float, on_miss: str, status: str, message: str | None, hit_rate: float
) -> None:
    """Within tolerance it runs at once, beyond it on_miss applies at once."""
    now = 100.0
    eng = make_engine(1, now=now)
    run = Driver(eng, now)
    f = sub(eng, now, fixed(now - late, 1.0, on_miss))
    run.run_until(now)
    assert f.status_name == status
    assert f.message == message
    assert snap(eng, now).fixed_start_hit_rate == hit_rate
    assert snap(eng, now).reservations == 0
    if status == "running":
        assert run.started(f) == [now]
    else:
        assert [s for s, _, _ in run.statuses(f)] == ["blocked", "scheduled", status]
        assert eng.totals[status] == 1


@pytest.mark.parametrize(
    ("on_miss", "status"), [("skip", "missed"), ("fail", "failed"), ("run_late", "succeeded")]
)
def test_only_worker_busy_past_start_plus_tolerance(on_miss: str, status: str) -> None:
    """The only worker is taken before the hold and runs until 8.0."""
    eng = make_engine(1)
    run = Driver(eng)
    long = sub(eng, 0.0, plain(Job(8.0)))
    f = sub(eng, 0.0, fixed(5.0, 1.0, on_miss, payload=Job(1.0)))
    run.run_until(5.5)
    assert run.started(long) == [0.0]
    assert f.status_name == "ready"  # due: ready from its start time
    assert snap(eng, 5.5).ready == 0  # waits ahead of the queues, not in them
    run.run_until(6.0)
    if on_miss == "run_late":
        assert f.status_name == "ready"
    else:
        assert (f.status_name, f.message) == (status, MISSED_MSG)
        assert [s for s, _, _ in run.statuses(f)] == ["blocked", "scheduled", "ready", status]
        assert run.statuses(f)[-1] == (status, 6.0, MISSED_MSG)
        assert snap(eng, 6.0).reservations == 0
    run.run_until(10.0)
    assert f.status_name == status
    if on_miss == "run_late":
        assert run.started(f) == [8.0]
    else:
        assert run.started(f) == []
    assert snap(eng, 10.0).fixed_start_hit_rate == 0.0


def test_a_slot_freeing_within_tolerance_starts_it_as_a_hit() -> None:
    eng = make_engine(1)
    run = Driver(eng)
    sub(eng, 0.0, plain(Job(5.5)))
    f = sub(eng, 0.0, fixed(5.0, 1.0, "skip", payload=Job(1.0)))
    run.run_until(10.0)
    assert run.started(f) == [5.5]
    assert f.status_name == "succeeded"
    assert snap(eng, 10.0).fixed_start_hit_rate == 1.0


def test_submitted_exactly_at_start_plus_tolerance_runs_as_a_hit() -> None:
    """Lateness equal to the tolerance is not "past" it: the engine admits the task as in time
    (ready, not missed) and counts a start at start + tolerance as a hit, so the task must run
    on the idle pool rather than be missed by its own miss timer at the same instant."""
    eng = make_engine(1, now=11.0)
    run = Driver(eng, 11.0)
    f = sub(eng, 11.0, fixed(10.0, 1.0, "skip"))
    assert f.status_name == "ready"
    run.run_until(11.0)
    assert f.status_name == "running"
    assert snap(eng, 11.0).fixed_start_hit_rate == 1.0


def test_fixed_start_hit_rate() -> None:
    """Three starts on time, one late (run_late) and one missed (skip): 3 / 5."""
    eng = make_engine(1)
    run = Driver(eng)
    assert snap(eng, 0.0).fixed_start_hit_rate == 1.0  # none yet
    for start in (10.0, 20.0, 30.0):
        sub(eng, 0.0, fixed(start, payload=Job(1.0)))
    sub(eng, 0.0, fixed(40.0, payload=Job(1.0)))
    sub(eng, 0.0, fixed(50.0, on_miss="skip", payload=Job(1.0)))
    run.run_until(38.5)
    assert snap(eng, 38.5).fixed_start_hit_rate == 1.0
    sub(eng, 38.5, plain(Job(6.5)))  # busy 38.5-45: the 40.0 start runs late
    run.run_until(48.5)
    assert snap(eng, 48.5).fixed_start_hit_rate == pytest.approx(3 / 4)
    sub(eng, 48.5, plain(Job(6.5)))  # busy 48.5-55: the 50.0 start is missed
    run.run_until(56.0)
    assert snap(eng, 56.0).fixed_start_hit_rate == pytest.approx(3 / 5)
    assert eng.totals["missed"] == 1


def test_reservations_and_held_drop_when_started_or_cancelled() -> None:
    eng = make_engine(3)
    run = Driver(eng)
    a = sub(eng, 0.0, fixed(10.0, 0.0))
    b = sub(eng, 0.0, fixed(10.0, 0.0))
    c = sub(eng, 0.0, fixed(30.0, 0.0))
    assert snap(eng, 0.0).reservations == 3
    run.run_until(9.5)
    p = snap(eng, 9.5)
    assert (p.reservations, p.held) == (3, 2)
    assert eng.cancel(b.id, 9.5)
    p = snap(eng, 9.5)
    assert (p.reservations, p.held) == (2, 1)
    run.run_until(10.0)
    assert a.status_name == "running"
    p = snap(eng, 10.0)
    assert (p.reservations, p.held) == (1, 0)
    assert eng.cancel(c.id, 10.0)  # before its hold (from 29.0)
    run.run_until(29.5)
    p = snap(eng, 29.5)
    assert (p.reservations, p.held) == (0, 0)
    assert eng.pools["p"].holds == 0
    run.run_until(40.0)
    assert c.status_name == "cancelled"
    assert run.started(c) == []


def test_a_missed_task_drops_its_reservation_and_hold() -> None:
    eng = make_engine(1)
    run = Driver(eng)
    sub(eng, 0.0, plain(Job(20.0)))
    sub(eng, 0.0, fixed(5.0, 1.0, "skip"))
    run.run_until(5.5)
    assert (snap(eng, 5.5).reservations, eng.pools["p"].holds) == (1, 1)
    run.run_until(6.0)
    assert (snap(eng, 6.0).reservations, eng.pools["p"].holds) == (0, 0)


def test_deps_then_fixed_start_go_blocked_scheduled_ready() -> None:
    """A task with deps and a fixed start goes blocked -> scheduled -> ready."""
    eng = make_engine(2)
    run = Driver(eng)
    parent = sub(eng, 0.0, plain(Job(3.0), key="parent"))
    child = sub(eng, 0.0, fixed(10.0, payload=Job(1.0), deps=[("parent", "success")]))
    run.run_until(1.0)
    assert child.status_name == "blocked"
    assert snap(eng, 1.0).reservations == 1  # reserved from submission
    run.run_until(5.0)
    assert parent.status_name == "succeeded"
    assert child.status_name == "scheduled"
    run.run_until(12.0)
    assert [(s, t) for s, t, _ in run.statuses(child)] == [
        ("blocked", 0.0),
        ("scheduled", 3.0),
        ("ready", 10.0),
        ("running", 10.0),
        ("succeeded", 11.0),
    ]


@pytest.mark.parametrize(
    ("parent_runtime", "on_miss", "ends", "started"),
    [
        (10.5, "skip", "succeeded", [10.5]),  # released within tolerance: runs at once
        (12.0, "skip", "missed", []),  # released after start + tolerance: on_miss applies
        (12.0, "fail", "failed", []),
        (12.0, "run_late", "succeeded", [12.0]),
    ],
)
def test_deps_released_after_the_start_time(
    parent_runtime: float, on_miss: str, ends: str, started: list[float]
) -> None:
    eng = make_engine(2)
    run = Driver(eng)
    sub(eng, 0.0, plain(Job(parent_runtime), key="parent"))
    child = sub(eng, 0.0, fixed(10.0, 1.0, on_miss, payload=Job(1.0), deps=[("parent", "success")]))
    run.run_until(20.0)
    assert child.status_name == ends
    assert run.started(child) == started
    statuses = [s for s, _, _ in run.statuses(child)]
    assert statuses[0] == "blocked"
    if ends in ("missed", "failed"):
        assert statuses == ["blocked", "scheduled", ends]
        assert child.message == MISSED_MSG


def test_a_retried_fixed_start_task_retries_like_any_task() -> None:
    eng = make_engine(1)
    run = Driver(eng)
    policy = RetryPolicy(2, 1.0, 1.0, 1.0, jitter=False)
    f = sub(eng, 0.0, fixed(10.0, 0.5, "skip", retry=policy))
    run.run_until(10.5)
    assert f.status_name == "running"
    assert f.running is not None
    eng.fail(f.running, 10.5, "flaky")
    run.run_until(11.4)
    assert f.status_name == "retrying"
    run.run_until(11.5)  # past start + tolerance, but on_miss only concerns the first start
    assert f.status_name == "running"
    assert run.started(f) == [10.0, 11.5]
    assert snap(eng, 12.0).fixed_start_hit_rate == 1.0


# --- a skip task never starts past its tolerance --------------------------------------------------


def drive_lazily(eng: Engine, until: float, at: dict[float, Callable[[float], None]]) -> None:
    """Step only when the engine asks (next_wake) or when `at` has something to do, like the
    asyncio driver, which pumps on its timer and on outside events only."""
    pending = sorted(at.items())
    for _ in range(10_000):
        w = eng.next_wake()
        nxt = pending[0][0] if pending else None
        if nxt is not None and (w is None or nxt <= w):
            t, act = pending.pop(0)
            act(t)
        elif w is not None and w <= until:
            t = w
        else:
            break
        eng.advance(t)
        eng.dispatch(t)
        eng.take()


def test_two_fixed_starts_at_one_instant_on_one_slot_with_tolerance_zero() -> None:
    """The second cannot start within tolerance 0: with on_miss=skip it is missed at its start
    time and must not run when the slot frees later."""
    eng = make_engine(1)
    a = sub(eng, 0.0, fixed(5.0, 0.0, "skip"))
    b = sub(eng, 0.0, fixed(5.0, 0.0, "skip"))

    def finish_a(t: float) -> None:
        assert a.running is not None
        eng.complete(a.running, t)

    drive_lazily(eng, 100.0, {8.0: finish_a})
    assert a.status_name == "succeeded"
    assert (b.status_name, b.message) == ("missed", MISSED_MSG)
    assert 5.0 <= b.finished_at <= 5.01
    assert b.attempt == 0


def test_a_skip_task_without_its_worker_group_is_missed_after_its_tolerance() -> None:
    eng = make_engine(1)
    f = sub(eng, 0.0, fixed(5.0, 1.0, "skip", labels={"gpu": "h100"}))
    drive_lazily(eng, 100.0, {})
    assert (f.status_name, f.message) == ("missed", MISSED_MSG)
    assert 6.0 <= f.finished_at <= 6.01
    assert eng.live == 0


def test_a_skip_task_waiting_for_a_resource_is_missed_after_its_tolerance() -> None:
    eng = Engine(
        [PoolConfig("p", capacity=1), PoolConfig("q", capacity=1)],
        0.0,
        event_level=EVENTS_ALL,
        resources=[ResourceConfig("db", "semaphore", permits=1)],
    )
    holder = sub(eng, 0.0, TaskRecord(None, "q", extra=Extras(resources={"db": 1})))
    eng.dispatch(0.0)
    assert holder.running is not None
    extra = Extras(start_at=5.0, tolerance=1.0, on_miss="skip", resources={"db": 1})
    f = sub(eng, 0.0, TaskRecord(None, "p", extra=extra))

    def release(t: float) -> None:
        assert holder.running is not None
        eng.complete(holder.running, t)

    drive_lazily(eng, 100.0, {10.0: release})
    assert (f.status_name, f.message) == ("missed", MISSED_MSG)
    assert 6.0 <= f.finished_at <= 6.01
    assert f.attempt == 0


# --- worker groups and labels (docs/groups.md) ----------------------------------------------------


def test_group_capacity_adds_slots_and_runs_labeled_tasks() -> None:
    """Capacity grows by n; a matching labeled task runs on the group."""
    eng = make_engine(1)
    run = Driver(eng)
    assert snap(eng, 0.0).capacity == 1
    eng.set_group_capacity("p", {"gpu": "a100"}, 1, 0.0)
    assert snap(eng, 0.0).capacity == 2
    t = sub(eng, 0.0, plain(labels={"gpu": "a100"}))
    run.run_until(0.0)
    assert t.status_name == "running"
    assert t.running is not None and t.running.slot is not None
    assert t.running.slot.labels == {"gpu": "a100"}
    p = snap(eng, 0.0)
    assert (p.capacity, p.busy) == (2, 1)


def test_labeled_task_without_a_group_waits_uncounted_in_ready() -> None:
    """A labeled task without a group: status ready, not in PoolSnapshot.ready, blocks nobody."""
    eng = make_engine(1)
    run = Driver(eng)
    t = sub(eng, 0.0, plain(labels={"gpu": "h100"}, cls=CRIT))
    other = sub(eng, 0.0, plain(Job(1.0)))
    run.run_until(0.5)
    assert t.status_name == "ready"
    assert run.started(other) == [0.0]
    p = snap(eng, 0.5)
    assert (p.ready, p.pending, p.pending_by_class) == (0, 1, [1, 0, 0, 0])
    run.run_until(2.0)
    eng.set_group_capacity("p", {"gpu": "a100"}, 2, 2.0)  # not a match
    run.run_until(2.0)
    assert t.status_name == "ready"
    assert snap(eng, 2.0).ready == 0
    run.run_until(3.0)
    eng.set_group_capacity("p", {"gpu": "h100"}, 1, 3.0)
    run.run_until(3.0)
    assert run.started(t) == [3.0]
    assert t.running is not None and t.running.slot.labels == {"gpu": "h100"}
    assert snap(eng, 3.0).capacity == 4


@pytest.mark.parametrize(
    ("labels", "runs"),
    [
        ({"gpu": "a100"}, True),
        ({"zone": "eu"}, True),
        ({"gpu": "a100", "zone": "eu"}, True),
        ({"gpu": "a100", "zone": "us"}, False),
        ({"gpu": "a100", "zone": "eu", "ram": "big"}, False),
        ({"gpu": "h100"}, False),
    ],
)
def test_labels_match_a_group_by_subset(labels: dict[str, str], runs: bool) -> None:
    """A task runs on a group whose labels contain all of its own (subset match)."""
    eng = make_engine(1)
    run = Driver(eng)
    eng.set_group_capacity("p", {"gpu": "a100", "zone": "eu"}, 1, 0.0)
    t = sub(eng, 0.0, plain(labels=labels))
    run.run_until(0.0)
    assert t.status_name == ("running" if runs else "ready")
    if runs:
        assert t.running is not None
        assert t.running.slot.labels == {"gpu": "a100", "zone": "eu"}


def test_unlabeled_tasks_take_unlabeled_slots_first() -> None:
    eng = make_engine(1)
    run = Driver(eng)
    eng.set_group_capacity("p", {"gpu": "a100"}, 1, 0.0)
    a = sub(eng, 0.0, plain(Job(5.0)))
    run.run_until(0.0)
    assert a.running is not None and a.running.slot is None
    b = run.submit(1.0, plain(Job(2.0)))  # the unlabeled slot is busy: the group's slot
    run.run_until(1.0)
    assert b.running is not None and b.running.slot.labels == {"gpu": "a100"}
    g = run.submit(1.5, plain(Job(1.0), labels={"gpu": "a100"}))
    c = sub(eng, 1.5, plain(Job(1.0)))
    run.run_until(1.5)
    assert (g.status_name, c.status_name) == ("ready", "ready")
    run.run_until(3.0)  # b ends: the labeled task (first in line) takes the group slot
    assert run.started(g) == [3.0]
    assert g.running is not None and g.running.slot.labels == {"gpu": "a100"}
    assert c.status_name == "ready"
    run.run_until(4.0)  # g ends: c may use the group slot, as the unlabeled one is busy
    assert run.started(c) == [4.0]
    assert c.running is not None and c.running.slot.labels == {"gpu": "a100"}
    d = sub(eng, 4.0, plain())
    run.run_until(5.0)  # a ends: the unlabeled slot takes d
    assert run.started(d) == [5.0]
    assert d.running is not None and d.running.slot is None


def test_set_group_capacity_zero_removes_the_slots() -> None:
    eng = make_engine(1)
    run = Driver(eng)
    eng.set_group_capacity("p", {"gpu": "a100"}, 2, 0.0)
    first = sub(eng, 0.0, plain(Job(5.0), labels={"gpu": "a100"}))
    run.run_until(0.0)
    assert snap(eng, 0.0).capacity == 3
    run.run_until(1.0)
    eng.set_group_capacity("p", {"gpu": "a100"}, 0, 1.0)
    p = snap(eng, 1.0)
    assert (p.capacity, p.busy) == (1, 1)
    assert first.status_name == "running"  # a running attempt is not taken away
    second = sub(eng, 1.0, plain(labels={"gpu": "a100"}))
    run.run_until(8.0)
    assert first.status_name == "succeeded"
    assert second.status_name == "ready"
    assert snap(eng, 8.0).ready == 0
    run.run_until(9.0)
    eng.set_group_capacity("p", {"gpu": "a100"}, 1, 9.0)
    run.run_until(9.0)
    assert run.started(second) == [9.0]
    assert snap(eng, 9.0).capacity == 2


def test_a_group_added_while_an_unlabeled_task_runs_keeps_the_slots_apart() -> None:
    """One unlabeled slot and one group slot: two unlabeled tasks at once cannot both run on
    the unlabeled slot, even if an unlabeled attempt was running when the group appeared."""
    eng = make_engine(1)
    run = Driver(eng)
    sub(eng, 0.0, plain(Job(1.0)))
    run.run_until(0.5)
    eng.set_group_capacity("p", {"gpu": "a100"}, 1, 0.5)
    run.run_until(2.0)  # the first task ended at 1.0
    b, c = sub(eng, 2.0, plain()), sub(eng, 2.0, plain())
    run.run_until(2.0)
    assert (b.status_name, c.status_name) == ("running", "running")
    assert b.running is not None and c.running is not None
    slots = sorted(
        [{} if att.slot is None else att.slot.labels for att in (b.running, c.running)],
        key=len,
    )
    assert slots == [{}, {"gpu": "a100"}]


# --- recurring schedules (docs/fixed-starts.md, "Recurring schedules") ----------------------------


@pytest.mark.parametrize("max_", [10, 2])
def test_every_second_schedule_in_utc(max_: int) -> None:
    """One task per second, keys tk@<UTC>Z, tag cronoq.recurring; also on a
    small pool (max 2: reservation limit 1), where an occurrence must not collide with the
    reservation of the one before it."""
    eng = make_engine(2, max=max_, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring(payload=Job(0.2), tags={"team": "ops"}), T0)
    run.run_until(T0 + 5.5)
    assert run.start_times() == [T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 5]
    recs = [att.task for _, att in run.starts]
    assert [r.key for r in recs] == [utc_key("tk", T0 + i) for i in range(1, 6)]
    assert recs[0].key == "tk@2023-11-14T22:13:21Z"
    assert all(r.tags == {"team": "ops", RECURRING_TAG: "r"} for r in recs)
    assert all(r.status_name == "succeeded" for r in recs)
    assert snap(eng, T0 + 5.5).fixed_start_hit_rate == 1.0
    assert eng.totals["recurring_conflicts"] == 0
    assert eng.totals["skipped"] == 0


def test_an_occurrence_is_an_ordinary_fixed_start_task() -> None:
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    sched = recurring(
        "*/10 * * * * *",
        key=None,
        tolerance=0.5,
        on_miss="skip",
        cls=CRIT,
        kind="report",
        deadline_in=30.0,
        duration_hint=2.0,
    )
    eng.add_recurring(sched, T0)
    run.run_until(T0 + 9.0)
    (occ,) = [r for r in eng.tasks.values() if r.status_name == "scheduled"]
    assert occ.key is None  # no key on the schedule, none on the occurrence
    assert occ.tags == {RECURRING_TAG: "r"}
    assert (occ.cls, occ.kind, occ.pool) == (CRIT, "report", "p")
    assert occ.extra is not None
    assert (occ.extra.start_at, occ.extra.tolerance, occ.extra.on_miss) == (
        T0 + 10,
        0.5,
        "skip",
    )
    assert occ.deadline == T0 + 40  # deadline_in counts from each occurrence
    assert occ.duration_hint == 2.0
    assert snap(eng, T0 + 9.0).reservations == 1


@pytest.mark.parametrize(
    ("expr", "tolerance", "times"),
    [
        ("*/10 * * * * *", 1.0, (10.0, 20.0, 30.0)),  # 2 s ahead with tolerance 1
        ("*/30 * * * * *", 5.0, (40.0, 70.0)),  # 10 s ahead with tolerance 5
        ("*/30 * * * * *", 0.0, (10.0, 40.0)),  # tolerance 0: at the occurrence's time
    ],
)
def test_occurrences_are_materialized_two_tolerances_ahead(
    expr: str, tolerance: float, times: tuple[float, ...]
) -> None:
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring(expr, Job(0.1), tolerance=tolerance), T0)
    for offset in times:
        at = T0 + offset
        run.run_until(at - 2 * tolerance - 0.01)
        assert eng.lookup(utc_key("tk", at)) is None
        run.run_until(at - 2 * tolerance)
        occ = eng.lookup(utc_key("tk", at))
        assert occ is not None
        assert occ.status_name == ("scheduled" if tolerance else "running")
        assert occ.submitted_at == at - 2 * tolerance
    assert {T0 + o for o in times[:-1]} <= set(run.start_times())


def test_the_first_occurrence_is_materialized_at_once_if_it_is_near() -> None:
    eng = make_engine(2, now=T0 + 9.5)
    run = Driver(eng, T0 + 9.5)
    eng.add_recurring(recurring("*/10 * * * * *", Job(0.1)), T0 + 9.5)
    run.run_until(T0 + 9.5)
    occ = eng.lookup(utc_key("tk", T0 + 10))
    assert occ is not None and occ.status_name == "scheduled"
    run.run_until(T0 + 10.5)
    assert run.start_times() == [T0 + 10]


def test_at_most_one_future_occurrence_is_materialized() -> None:
    """The next occurrence is created when the previous one fires or 2 x tolerance
    before its own time, whichever is later - never two future occurrences at once."""
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring(payload=Job(0.1)), T0)  # every second, tolerance 1
    for t in (T0, T0 + 0.5, T0 + 1.5, T0 + 2.5):
        run.run_until(t)
        waiting = [r.key for r in eng.tasks.values() if r.status_name == "scheduled"]
        assert len(waiting) == 1, (t - T0, waiting)


@pytest.mark.parametrize(
    ("expr", "tolerance", "period"),
    [
        ("*/2 * * * * *", 1.0, 2.0),  # period == 2 x tolerance
        ("*/10 * * * * *", 5.0, 10.0),  # "10 s ahead with tolerance 5"
        ("*/4 * * * * *", 1.0, 4.0),
    ],
)
def test_a_short_job_never_conflicts_with_the_next_occurrence(
    expr: str, tolerance: float, period: float
) -> None:
    """overlap=skip drops an occurrence only if the previous one is still live at its time;
    a 0.1 s job is long finished when the next occurrence is due."""
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring(expr, Job(0.1), tolerance=tolerance), T0)
    run.run_until(T0 + 6 * period + 0.5)
    assert run.start_times() == [T0 + n * period for n in range(1, 7)]
    assert eng.totals["recurring_conflicts"] == 0
    assert eng.totals["skipped"] == 0


@pytest.mark.parametrize(
    ("expr", "tz", "since", "until", "runs"),
    [
        # Berlin moves to CEST on 2025-03-30: 09:00 local is 08:00Z, then 07:00Z
        (
            "0 0 9 * * *",
            "Europe/Berlin",
            "2025-03-28T12:00:00",
            "2025-03-31T12:00:00",
            ["2025-03-29T08:00:00", "2025-03-30T07:00:00", "2025-03-31T07:00:00"],
        ),
        # 02:30 does not exist in New York on 2025-03-09: it runs at 03:00 EDT (07:00Z)
        (
            "0 30 2 * * *",
            "America/New_York",
            "2025-03-08T12:00:00",
            "2025-03-10T12:00:00",
            ["2025-03-09T07:00:00", "2025-03-10T06:30:00"],
        ),
        # 01:30 happens twice on 2025-11-02: a fixed-time job runs at the first one
        (
            "0 30 1 * * *",
            "America/New_York",
            "2025-11-01T12:00:00",
            "2025-11-03T12:00:00",
            ["2025-11-02T05:30:00", "2025-11-03T06:30:00"],
        ),
        # an hourly job keeps real-time hours across the fall-back (01:00 EDT and 01:00 EST)
        (
            "@hourly",
            "America/New_York",
            "2025-11-02T04:30:00",
            "2025-11-02T07:30:00",
            ["2025-11-02T05:00:00", "2025-11-02T06:00:00", "2025-11-02T07:00:00"],
        ),
    ],
)
def test_schedule_in_a_dst_zone(
    expr: str, tz: str, since: str, until: str, runs: list[str]
) -> None:
    start = utc(since)
    eng = make_engine(2, now=start)
    run = Driver(eng, start)
    eng.add_recurring(recurring(expr, Job(0.5), name="d", key="d", tz=tz), start)
    run.run_until(utc(until))
    assert run.start_times() == [utc(r) for r in runs]
    assert [att.task.key for _, att in run.starts] == [f"d@{r}Z" for r in runs]


def test_overlap_skip_drops_an_occurrence_while_the_previous_runs() -> None:
    """A 15 s job every 10 s; the occurrence due while one runs is dropped (ended
    "skipped" with "previous occurrence still running": our way of the two the published package
    allows)."""
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(15.0)), T0)
    run.run_until(T0 + 31.0)
    assert run.start_times() == [T0 + 10, T0 + 30]
    occ = eng.lookup(utc_key("tk", T0 + 20))
    assert occ is not None and (occ.status_name, occ.message) == ("skipped", OVERLAP_MSG)
    run.run_until(T0 + 51.0)
    assert run.start_times() == [T0 + 10, T0 + 30, T0 + 50]
    assert eng.totals["skipped"] == 2


def test_overlap_skip_looks_past_skipped_occurrences() -> None:
    """A 25 s job every 10 s: the occurrence at +30 is dropped too, because the one at +10
    still runs (the +20 one in between was skipped)."""
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(25.0)), T0)
    run.run_until(T0 + 41.0)
    assert run.start_times() == [T0 + 10, T0 + 40]
    assert eng.totals["skipped"] == 2


def test_overlap_skip_every_second_with_a_longer_job() -> None:
    """A 1.5 s job every second runs every other second; each overlapping
    occurrence is either skipped ("previous occurrence still running") or not created."""
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring(payload=Job(1.5)), T0)
    run.run_until(T0 + 6.5)
    assert run.start_times() == [T0 + 1, T0 + 3, T0 + 5]
    for at in (T0 + 2, T0 + 4, T0 + 6):
        occ = eng.lookup(utc_key("tk", at))
        assert occ is None or (occ.status_name, occ.message) == ("skipped", OVERLAP_MSG)
    dropped = eng.totals["skipped"] + eng.totals["recurring_conflicts"]
    assert dropped == 3


def test_overlap_allow_runs_occurrences_concurrently() -> None:
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(15.0), overlap="allow"), T0)
    run.run_until(T0 + 41.0)
    assert run.start_times() == [T0 + 10, T0 + 20, T0 + 30, T0 + 40]
    assert snap(eng, T0 + 21.0).busy == 2
    assert eng.totals["recurring_conflicts"] == 0


def test_overlap_queue_runs_back_to_back() -> None:
    """overlap="queue": each occurrence starts when the previous ends; one can be queued."""
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(15.0), overlap="queue"), T0)
    run.run_until(T0 + 61.0)
    assert run.start_times() == [T0 + 10, T0 + 25, T0 + 40, T0 + 55]
    keys = [att.task.key for _, att in run.starts]
    assert keys == [utc_key("tk", T0 + s) for s in (10, 20, 30, 50)]
    assert eng.lookup(utc_key("tk", T0 + 40)) is None  # a second one could not be queued
    assert eng.totals["recurring_conflicts"] == 1
    queued = eng.lookup(utc_key("tk", T0 + 60))
    assert queued is not None and queued.status_name == "blocked"


def test_overlap_queue_runs_after_a_failed_occurrence_too() -> None:
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(15.0, fail=True), overlap="queue"), T0)
    run.run_until(T0 + 41.0)
    assert run.start_times() == [T0 + 10, T0 + 25, T0 + 40]
    assert eng.totals["failed"] == 2
    assert eng.totals["skipped"] == 0


def test_overlap_queue_on_success_skips_every_later_occurrence_after_a_failure() -> None:
    """overlap="queue_on_success": after a failure the queued and every later occurrence end
    skipped."""
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(
        recurring("*/10 * * * * *", Job(15.0, fail=True), overlap="queue_on_success"), T0
    )
    run.run_until(T0 + 61.0)
    assert run.start_times() == [T0 + 10]
    first = run.starts[0][1].task
    assert first.status_name == "failed"
    queued = eng.lookup(utc_key("tk", T0 + 20))
    assert queued is not None
    assert (queued.status_name, queued.message) == (
        "skipped",
        f"dependency {first.id} ended as failed",
    )
    assert queued.finished_at == T0 + 25
    for s in (30, 40, 50, 60):
        later = eng.lookup(utc_key("tk", T0 + s))
        assert later is not None
        assert (later.status_name, later.message) == ("skipped", "dependency ended as skipped")


def test_overlap_queue_on_success_keeps_running_while_occurrences_succeed() -> None:
    eng = make_engine(3, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(1.0), overlap="queue_on_success"), T0)
    run.run_until(T0 + 41.0)
    assert run.start_times() == [T0 + 10, T0 + 20, T0 + 30, T0 + 40]


def test_remove_recurring_true_false_and_cancels_the_pending_occurrence() -> None:
    """remove_recurring is True, then False; the occurrence that has not started is cancelled."""
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(0.1)), T0)
    run.run_until(T0 + 9.0)
    occ = eng.lookup(utc_key("tk", T0 + 10))
    assert occ is not None and occ.status_name == "scheduled"
    assert eng.remove_recurring("r", T0 + 9.0) is True
    assert (occ.status_name, occ.message) == ("cancelled", "cancelled")
    assert snap(eng, T0 + 9.0).reservations == 0
    assert eng.remove_recurring("r", T0 + 9.0) is False
    assert eng.remove_recurring("never", T0 + 9.0) is False
    run.run_until(T0 + 60.0)
    assert run.starts == []
    assert eng.live == 0


def test_remove_recurring_leaves_a_running_occurrence_alone() -> None:
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", Job(5.0)), T0)
    run.run_until(T0 + 11.0)
    occ = eng.lookup(utc_key("tk", T0 + 10))
    assert occ is not None and occ.status_name == "running"
    assert eng.remove_recurring("r", T0 + 11.0) is True
    run.run_until(T0 + 40.0)
    assert occ.status_name == "succeeded"
    assert run.start_times() == [T0 + 10]


def test_remove_recurring_right_after_adding_an_every_second_schedule() -> None:
    """No occurrence of a removed schedule may run, however many were materialized."""
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring(payload=Job(0.1)), T0)
    run.run_until(T0 + 0.5)
    assert eng.remove_recurring("r", T0 + 0.5) is True
    run.run_until(T0 + 5.0)
    assert run.starts == []
    assert eng.live == 0


def test_remove_recurring_cancels_an_occurrence_waiting_for_its_slot() -> None:
    """An occurrence that is due (ready) but has no slot yet has not started: it goes too."""
    eng = make_engine(1, now=T0)
    run = Driver(eng, T0)
    sub(eng, T0, plain(Job(30.0)))
    eng.add_recurring(recurring("*/10 * * * * *", Job(0.1)), T0)
    run.run_until(T0 + 10.5)
    occ = eng.lookup(utc_key("tk", T0 + 10))
    assert occ is not None and occ.status_name == "ready"
    assert eng.remove_recurring("r", T0 + 10.5) is True
    assert occ.status_name == "cancelled"
    run.run_until(T0 + 40.0)
    assert run.started(occ) == []


def test_replacing_a_schedule_cancels_the_old_occurrence_and_applies_the_new_one() -> None:
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", "old", key=None), T0)
    run.run_until(T0 + 9.0)
    (old,) = [r for r in eng.tasks.values() if r.status_name == "scheduled"]
    eng.add_recurring(recurring("*/10 * * * * *", Job(0.1), key=None, tags={"v": "2"}), T0 + 9.0)
    assert old.status_name == "cancelled"
    run.run_until(T0 + 20.5)
    assert run.start_times() == [T0 + 10, T0 + 20]
    assert all(att.task.tags == {"v": "2", RECURRING_TAG: "r"} for _, att in run.starts)


def test_replacing_a_schedule_with_the_same_key_still_runs_its_next_occurrence() -> None:
    """The cancelled old occurrence keeps its key; the new schedule's occurrence for the same
    time must not be swallowed as a duplicate of it."""
    eng = make_engine(2, now=T0)
    run = Driver(eng, T0)
    eng.add_recurring(recurring("*/10 * * * * *", "old"), T0)
    run.run_until(T0 + 9.0)
    (old,) = [r for r in eng.tasks.values() if r.status_name == "scheduled"]
    eng.add_recurring(recurring("*/10 * * * * *", Job(0.1)), T0 + 9.0)
    assert old.status_name == "cancelled"
    run.run_until(T0 + 10.5)
    assert run.start_times() == [T0 + 10]
    # (payloads are dropped when a task ends, so tell the new occurrence by identity)
    assert run.starts[0][1].task is not old
    assert run.starts[0][1].task.key == utc_key("tk", T0 + 10)


def test_an_occurrence_rejected_by_the_reservation_limit_is_a_recurring_conflict() -> None:
    eng = make_engine(2, max=2, now=T0)  # limit 1
    run = Driver(eng, T0)
    blocker = sub(eng, T0, fixed(T0 + 10, payload=Job(0.5)))
    eng.add_recurring(recurring("*/10 * * * * *", Job(0.5)), T0)
    run.run_until(T0 + 20.5)
    assert eng.totals["recurring_conflicts"] == 1
    assert eng.lookup(utc_key("tk", T0 + 10)) is None
    assert run.started(blocker) == [T0 + 10]
    assert [att.task.key for _, att in run.starts] == [None, utc_key("tk", T0 + 20)]


# --- autoscaling (docs/autoscaling.md) ------------------------------------------------------------


def scaled_engine(
    capacity: int, *, min_: int = 1, max_: int = 8, now: float = 0.0, **settings: Any
) -> Engine:
    cost = settings.pop("cost_per_worker_second", 0.0)
    return make_engine(
        capacity,
        now=now,
        min=min_,
        max=max_,
        autoscale=AutoscaleSettings(cost_per_worker_second=cost, **settings),
        cost_per_worker_second=cost,
    )


def test_autoscale_forty_queued_tasks_grow_the_pool_1_5_8() -> None:
    """1 -> 5 at t=1 -> 8 at t=2; desired follows; cost = ws x rate."""
    eng = scaled_engine(1, cost_per_worker_second=2.0)
    run = Driver(eng)
    run.run_until(0.0)  # the first evaluation, at start
    for _ in range(40):
        sub(eng, 0.0, plain(Job(0.5)))
    expected = {0.0: 1, 0.5: 1, 0.999: 1, 1.0: 5, 1.5: 5, 1.999: 5, 2.0: 8, 3.0: 8}
    for t, capacity in expected.items():
        run.run_until(t)
        p = snap(eng, t)
        assert (p.capacity, p.desired, p.busy) == (capacity, capacity, capacity), t
    p = snap(eng, 3.0)
    assert p.worker_seconds == pytest.approx(1 * 1 + 5 * 1 + 8 * 1)
    assert p.cost == pytest.approx(2.0 * 14.0)
    assert p.cost == p.worker_seconds * 2.0


def test_autoscale_idle_pool_at_8_waits_for_the_window_then_steps_down_per_cooldown() -> None:
    """8 for 60 s, then 7, then -1 every 30 s."""
    eng = scaled_engine(8)
    run = Driver(eng)
    for t, capacity in [
        (0.0, 8),
        (30.0, 8),
        (59.0, 8),
        (60.0, 7),
        (89.0, 7),
        (90.0, 6),
        (119.0, 6),
        (120.0, 5),
        (210.0, 2),
        (240.0, 1),
        (400.0, 1),
    ]:
        run.run_until(t)
        p = snap(eng, t)
        assert (p.capacity, p.desired) == (capacity, capacity), t


def test_autoscale_min_zero_pool_starts_empty_and_grows_at_the_next_evaluation() -> None:
    """A min=0 pool starts with no workers; a submission gets one at the next evaluation."""
    eng = scaled_engine(0, min_=0, max_=4)
    run = Driver(eng)
    run.run_until(0.0)
    assert snap(eng, 0.0).capacity == 0
    t = run.submit(0.3, plain(Job(0.5)))
    run.run_until(0.999)
    assert t.status_name == "ready"
    assert snap(eng, 0.999).capacity == 0
    run.run_until(1.0)
    assert snap(eng, 1.0).capacity >= 1
    assert run.started(t) == [1.0]


def test_autoscale_counts_reservations_within_the_horizon() -> None:
    """A min=0 pool with 3 reservations 4 s ahead goes to 3 at once."""
    eng = scaled_engine(0, min_=0, max_=6)  # reservation limit 3
    run = Driver(eng)
    for _ in range(3):
        sub(eng, 0.0, fixed(4.0, payload=Job(0.5)))
    run.run_until(0.0)
    p = snap(eng, 0.0)
    assert (p.capacity, p.desired, p.reservations) == (3, 3, 3)
    run.run_until(4.0)
    assert run.start_times() == [4.0, 4.0, 4.0]
    assert snap(eng, 4.0).fixed_start_hit_rate == 1.0


def test_autoscale_ignores_reservations_beyond_the_horizon() -> None:
    eng = scaled_engine(0, min_=0, max_=6)
    run = Driver(eng)
    sub(eng, 0.0, fixed(100.0, payload=Job(0.5)))  # reserves [99, 101.5)
    run.run_until(38.0)
    assert snap(eng, 38.0).capacity == 0
    run.run_until(39.0)  # 99 <= 39 + 60
    assert snap(eng, 39.0).capacity == 1
    run.run_until(101.0)
    assert run.start_times() == [100.0]


def test_desired_is_the_capacity_without_autoscaling() -> None:
    eng = make_engine(3)
    assert snap(eng, 0.0).desired == 3
    eng.set_capacity("p", 5, 1.0)
    assert snap(eng, 1.0).desired == 5
    eng.set_group_capacity("p", {"gpu": "a100"}, 2, 2.0)
    p = snap(eng, 2.0)
    assert (p.capacity, p.desired) == (7, 7)


def test_cost_is_worker_seconds_times_rate_across_capacity_changes() -> None:
    """cost = worker_seconds x cost_per_worker_second while the capacity changes."""
    eng = make_engine(2, cost_per_worker_second=2.0)
    eng.set_capacity("p", 4, 5.0)
    eng.set_group_capacity("p", {"gpu": "a100"}, 1, 7.0)
    p = snap(eng, 10.0)
    assert p.worker_seconds == pytest.approx(2 * 5 + 4 * 2 + 5 * 3)
    assert p.cost == pytest.approx(2.0 * p.worker_seconds)
    assert math.isclose(make_engine(2).snapshot(10.0).pools[0].cost, 0.0)
