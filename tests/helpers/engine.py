"""The engine test driver: engines on a virtual clock, and a `Driver` that plays the asyncio
Scheduler's part for the core's unit tests (fire due timers, fill free slots, drain the outbox,
end attempts after the runtime their payload asks for). Times are plain floats handed to every
engine call; nothing sleeps and nothing touches asyncio."""

from __future__ import annotations

import random
from collections.abc import Sequence
from heapq import heappop, heappush
from typing import Any, NamedTuple

from cronoq.core.actions import Actions
from cronoq.core.engine import DEFAULT_RETENTION, DEFAULT_RETENTION_MAX, EVENTS_ALL, Engine
from cronoq.core.model import Attempt, PoolConfig, StatusEvent, TaskRecord
from cronoq.core.resources import ResourceConfig


def engine_of(
    *pools: PoolConfig,
    resources: Sequence[ResourceConfig] = (),
    now: float = 0.0,
    seed: int = 0,
    level: int = EVENTS_ALL,
    **engine_kw: Any,
) -> Engine:
    """An engine with these pools, a seeded rng and every status change as an event."""
    return Engine(
        list(pools),
        now,
        rng=random.Random(seed),
        event_level=level,
        resources=resources,
        **engine_kw,
    )


def make_engine(
    capacity: int = 1,
    *,
    now: float = 0.0,
    seed: int = 0,
    level: int = EVENTS_ALL,
    retention: float = DEFAULT_RETENTION,
    retention_max: int = DEFAULT_RETENTION_MAX,
    **pool_kw: Any,
) -> Engine:
    """An engine with one pool "p" of `capacity` slots (`pool_kw`: the rest of its config)."""
    return engine_of(
        PoolConfig("p", capacity=capacity, **pool_kw),
        now=now,
        seed=seed,
        level=level,
        retention=retention,
        retention_max=retention_max,
    )


class Job(NamedTuple):
    """A payload the Driver understands: run for `runtime` seconds, then succeed or fail."""

    runtime: float
    fail: bool = False


class Driver:
    """A driver on a virtual clock. An attempt whose payload is a `Job` (or a number of seconds)
    ends by itself after that runtime, a failing Job for good; any other payload runs until the
    test ends it.

    `run_until` first steps at the time of the last step, so that what the test did there (a
    submit, a completion) is dispatched at that time; `catch_up=False` leaves that out, for
    tests that call the engine at later times of their own between steps."""

    def __init__(self, eng: Engine, now: float = 0.0, *, catch_up: bool = True) -> None:
        self.eng = eng
        self.now = now
        self.catch_up = catch_up
        self.starts: list[tuple[float, Attempt]] = []
        self.aborts: list[Attempt] = []
        self.finished: list[TaskRecord] = []
        self.events: list[StatusEvent] = []
        self.peak = 0  # most attempts running at once
        self._ends: list[tuple[float, int, Attempt, bool]] = []

    def drain(self) -> Actions:
        """Take the outbox into the logs; timed attempts get their end scheduled."""
        out = self.eng.take()
        now = self.now
        self.aborts += out.aborts
        self.finished += out.finished
        self.events += out.events
        for att in out.starts:
            self.starts.append((now, att))
            job = att.task.payload
            if isinstance(job, (int, float)) and not isinstance(job, bool):
                job = Job(float(job))
            if isinstance(job, Job):
                heappush(self._ends, (now + job.runtime, att.lease, att, job.fail))
        self.peak = max(self.peak, len(self.eng.running))
        return out

    def step(self, now: float) -> Actions:
        """End the attempts due by `now`, advance and dispatch at `now`; returns what this step
        produced."""
        eng = self.eng
        self.now = now
        while self._ends and self._ends[0][0] <= now:
            end, _, att, fail = heappop(self._ends)
            if fail:
                eng.fail(att, end, "RuntimeError: boom", permanent=True)
            else:
                eng.complete(att, end)
        eng.advance(now)
        eng.dispatch(now)
        return self.drain()

    def run_until(self, t: float) -> Actions:
        """Step at every timer and attempt end due up to `t`, each at its own time, then at `t`;
        returns everything produced."""
        acc = Actions()
        if self.catch_up:
            _add(acc, self.step(self.now))
        for _ in range(100_000):
            w = self.eng.next_wake()
            if self._ends and (w is None or self._ends[0][0] < w):
                w = self._ends[0][0]
            if w is None or w > t:
                break
            _add(acc, self.step(max(w, self.now)))
        else:  # pragma: no cover - a timer that never moves forward
            raise AssertionError("the driver does not move forward")
        _add(acc, self.step(t))
        return acc

    def start_one(self, now: float) -> Attempt:
        """Step at `now`, which must start exactly one attempt."""
        (att,) = self.step(now).starts
        return att

    def submit(self, now: float, rec: TaskRecord) -> TaskRecord:
        """Bring the driver to `now` first, then submit (as a caller at that time would)."""
        self.run_until(now)
        got, dup = self.eng.submit(rec, now)
        assert not dup
        return got

    def started(self, rec: TaskRecord) -> list[float]:
        return [t for t, att in self.starts if att.task is rec]

    def start_times(self) -> list[float]:
        return [t for t, _ in self.starts]

    def start_order(self) -> list[int]:
        return [att.task.id for _, att in self.starts]

    def start_by_id(self) -> dict[int, float]:
        """Each task's latest start time, by id."""
        return {att.task.id: t for t, att in self.starts}

    def statuses(self, rec: TaskRecord) -> list[tuple[str, float, str | None]]:
        return [(e.status, e.at, e.message) for e in self.events if e.id == rec.id]


def _add(acc: Actions, out: Actions) -> None:
    acc.starts += out.starts
    acc.aborts += out.aborts
    acc.finished += out.finished
    acc.events += out.events
