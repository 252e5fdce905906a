"""The engine's observation seams for metrics, on a virtual clock: the observer told of each
attempt's wait for a slot and of its runtime and outcome (`Engine(observer=...)`), and the
ready queues read at scrape time (`Engine.ready_view()`). Every time is a float handed to the
engine, so each observation is exact."""

from __future__ import annotations

import random

from cronoq.core.engine import Engine
from cronoq.core.model import (
    ATTEMPT_OUTCOMES,
    READY,
    Attempt,
    Extras,
    PoolConfig,
    Priority,
    RetryPolicy,
    TaskRecord,
)
from cronoq.core.state import ObservedState, State

NORMAL, HIGH, LOW = int(Priority.NORMAL), int(Priority.HIGH), int(Priority.LOW)
NO_JITTER = RetryPolicy(max_attempts=2, initial_backoff=4.0, jitter=False)


class Recorder:
    """An Observer that keeps what it is told."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, int, float]] = []
        self.ends: list[tuple[str, int, str, float]] = []

    def started(self, att: Attempt, wait: float) -> None:
        assert att.task.running is att and not att.ended
        self.starts.append((att.task.pool, att.task.cls, wait))

    def ended(self, att: Attempt, outcome: str, runtime: float) -> None:
        assert outcome in ATTEMPT_OUTCOMES and att.ended
        self.ends.append((att.task.pool, att.task.cls, outcome, runtime))


def make(capacity: int = 1, **pool_kw: object) -> tuple[Engine, Recorder]:
    obs = Recorder()
    pools = [PoolConfig("p", capacity=capacity, **pool_kw), PoolConfig("q", capacity=0)]  # type: ignore[arg-type]
    return Engine(pools, 0.0, rng=random.Random(0), observer=obs), obs


def sub(eng: Engine, now: float, cls: int = NORMAL, **kw: object) -> TaskRecord:
    extra = kw.pop("extra", None)
    rec, dup = eng.submit(TaskRecord(None, "p", cls=cls, extra=extra, **kw), now)  # type: ignore[arg-type]
    assert not dup
    return rec


def start(eng: Engine, now: float) -> list[TaskRecord]:
    eng.advance(now)
    eng.dispatch(now)
    return [att.task for att in eng.take().starts]


def test_wait_is_from_ready_to_start_and_runtime_from_start_to_end() -> None:
    eng, obs = make(capacity=0)
    sub(eng, 10.0, HIGH)  # submitted at 10, no slot until 12.5
    eng.set_capacity("p", 1, 12.5)
    eng.dispatch(12.5)
    (att,) = eng.take().starts
    assert obs.starts == [("p", HIGH, 2.5)]
    assert eng.complete(att, 15.75)
    assert obs.ends == [("p", HIGH, "succeeded", 3.25)]


def test_dependencies_and_fixed_starts_do_not_count_as_waiting() -> None:
    eng, obs = make(capacity=1)
    parent = sub(eng, 0.0)
    child = sub(eng, 0.0, extra=Extras(deps=[(parent.id, "success")]))
    fixed = sub(eng, 0.0, LOW, extra=Extras(start_at=20.0, tolerance=5.0))
    (p,) = eng.dispatch(0.0) or eng.take().starts
    assert eng.complete(p, 7.0)  # the child is ready from 7, the slot free at 7
    assert [t.id for t in start(eng, 7.0)] == [child.id]
    eng.advance(20.0)  # the fixed start comes due (its timer) while the child runs
    (c,) = [a for a in eng.running.values() if a.task is child]
    assert eng.complete(c, 23.0)  # the fixed start (due at 20) waits 3 s for the slot
    assert [t.id for t in start(eng, 23.0)] == [fixed.id]
    assert obs.starts == [("p", NORMAL, 0.0), ("p", NORMAL, 0.0), ("p", LOW, 3.0)]
    assert [e[2:] for e in obs.ends] == [("succeeded", 7.0), ("succeeded", 16.0)]


def test_a_retry_waits_from_the_end_of_its_backoff() -> None:
    eng, obs = make(capacity=1, retry=NO_JITTER)
    sub(eng, 0.0)
    (att,) = eng.dispatch(0.0) or eng.take().starts
    assert eng.fail(att, 1.0, "boom")  # ready again at 1 + 4 = 5
    eng.advance(5.0)  # the backoff's timer: ready at 5
    assert start(eng, 6.5)  # the next dispatch: 1.5 s of waiting
    (again,) = eng.running.values()
    assert eng.fail(again, 8.0, "boom")  # the second and last attempt: dead-lettered
    assert obs.starts == [("p", NORMAL, 0.0), ("p", NORMAL, 1.5)]
    assert obs.ends == [("p", NORMAL, "failed", 1.0), ("p", NORMAL, "failed", 1.5)]
    (view, _) = eng.ready_view()
    assert (view.retries, view.dead_lettered) == (1, 1)


def test_every_outcome_of_an_attempt() -> None:
    eng, obs = make(capacity=4, lease_ttl=3.0, retry=RetryPolicy.none())
    timed = sub(eng, 0.0, timeout=2.0)
    lost, cancelled, running = sub(eng, 0.0), sub(eng, 0.0), sub(eng, 0.0)
    assert len(start(eng, 0.0)) == 4
    for att in eng.running.values():
        if att.task is lost:
            continue
        assert eng.heartbeat(att, 2.5)  # all but `lost` keep their lease
    eng.advance(2.0)  # timed's timeout
    assert eng.cancel(cancelled.id, 2.5)
    eng.advance(3.0)  # lost's lease
    eng.halt()
    eng.abort_running(4.0)
    assert obs.ends == [
        ("p", NORMAL, "timed_out", 2.0),
        ("p", NORMAL, "cancelled", 2.5),
        ("p", NORMAL, "lease_expired", 3.0),
        ("p", NORMAL, "abandoned", 4.0),
    ]
    assert timed.status_name == lost.status_name == "dead_lettered"
    assert running.status_name == "running"  # abort_running changes no status


def test_no_observer_by_default() -> None:
    """Without an observer the engine's state is the plain one: nothing on its path changes."""
    eng = Engine([PoolConfig("p", capacity=1)], 0.0)
    assert type(eng._st) is State
    assert type(make()[0]._st) is ObservedState
    eng.submit(TaskRecord(None, "p"), 0.0)
    eng.dispatch(0.0)
    (att,) = eng.take().starts
    assert eng.complete(att, 1.0)
    assert eng.totals["succeeded"] == 1


def test_ready_view_counts_ready_tasks_only_and_the_first_in_line() -> None:
    eng, _ = make(capacity=1, retry=NO_JITTER)
    head = sub(eng, 1.0)
    assert start(eng, 1.0) == [head]  # running: not ready
    sub(eng, 2.0)
    sub(eng, 3.0)
    sub(eng, 4.0, HIGH)
    blocked = sub(eng, 4.0, extra=Extras(deps=[(head.id, "success")]))
    sub(eng, 4.0, LOW, extra=Extras(start_at=50.0))  # scheduled: not ready until 50
    p, q = eng.ready_view()
    assert (p.pool, q.pool) == ("p", "q")
    assert p.ready_by_class == (0, 1, 2, 0)
    assert p.oldest_ready_at == (None, 4.0, 2.0, None)
    assert q.ready_by_class == (0, 0, 0, 0) and q.oldest_ready_at == (None,) * 4
    # the head fails: it retries (not ready during its backoff), the blocked task stays blocked
    (att,) = eng.running.values()
    assert eng.fail(att, 5.0, "boom")
    assert start(eng, 5.0)[0].cls == HIGH
    assert eng.ready_view()[0].ready_by_class == (0, 0, 2, 0)
    eng.advance(9.0)  # the retry is ready at 9; first in line by eligibility, not by ready_at
    view = eng.ready_view()[0]
    assert view.ready_by_class == (0, 0, 3, 0)
    assert view.oldest_ready_at[NORMAL] == 9.0
    assert blocked.status_name == "blocked"
    # the fixed start comes due at 50 with no free slot: ready, first in its class
    eng.advance(50.0)
    view = eng.ready_view()[0]
    assert view.ready_by_class == (0, 0, 3, 1) and view.oldest_ready_at[LOW] == 50.0
    # cancelling ready, blocked and due tasks keeps the counts right
    for rec in list(eng.tasks.values()):
        if rec.status == READY or rec.status_name == "blocked":
            assert eng.cancel(rec.id, 51.0)
    view = eng.ready_view()[0]
    assert view.ready_by_class == (0, 0, 0, 0) and view.oldest_ready_at == (None,) * 4
    assert eng.pools["p"].unready_by_class == [0, 0, 0, 0]
    assert (view.retries, view.dead_lettered) == (1, 0)
