"""Unit tests of the sans-I/O autoscaler (docs/autoscaling.md).

Everything runs on a virtual clock. `PoolSim` plays a pool with fixed-duration tasks and the
driver: at every `next_eval` it hands the autoscaler the signals such a pool would report
(arrivals since the previous evaluation, learned mean runtime, backlog per class, busy workers,
capacity, reservations) and applies the capacity it returns.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core.autoscale import Autoscaler, AutoscaleSettings

CRITICAL, HIGH, NORMAL, LOW = 0, 1, 2, 3


class PoolSim:
    """A pool of identical tasks (`duration` seconds each), strict priority, FIFO per class."""

    def __init__(
        self,
        scaler: Autoscaler,
        capacity: int,
        duration: float,
        default_duration: float = 1.0,
        reserved: Callable[[float], int] = lambda now: 0,
    ) -> None:
        self.scaler = scaler
        self.capacity = capacity
        self.duration = duration
        self.default_duration = default_duration
        self.reserved = reserved
        self.t = scaler.next_eval
        self.ready = [0, 0, 0, 0]
        self.running: list[float] = []  # end times (heap)
        self.done = 0
        self.runtime = 0.0
        self.arrivals = 0
        self.trace: dict[float, int] = {}
        self.starts: list[float] = []

    def _fill(self) -> None:
        while sum(self.ready) and len(self.running) < self.capacity:
            cls = next(c for c, n in enumerate(self.ready) if n)
            self.ready[cls] -= 1
            heapq.heappush(self.running, self.t + self.duration)
            self.starts.append(self.t)

    def _advance(self, t: float) -> None:
        self._fill()
        while self.running and self.running[0] <= t:
            self.t = heapq.heappop(self.running)
            self.done += 1
            self.runtime += self.duration
            self._fill()
        self.t = t
        self._fill()

    def submit(self, t: float, n: int, cls: int = NORMAL) -> None:
        self.run_until(t)
        self.ready[cls] += n
        self.arrivals += n
        self._fill()

    def service_time(self) -> float:
        return self.runtime / self.done if self.done else self.default_duration

    def _evaluate(self, now: float) -> None:
        self._advance(now)
        self.capacity = self.scaler.evaluate(
            now,
            arrivals=self.arrivals,
            service_time=self.service_time(),
            backlog_by_class=list(self.ready),
            busy=len(self.running),
            capacity=self.capacity,
            reserved=self.reserved(now),
        )
        self.arrivals = 0
        self.trace[now] = self.capacity
        self._fill()

    def run_until(self, t: float) -> None:
        """Process everything up to and including time t (evaluations due at t included)."""
        while self.scaler.next_eval <= t:
            self._evaluate(self.scaler.next_eval)
        self._advance(t)


def make(min: int, max: int, **kw: Any) -> Autoscaler:
    return Autoscaler(AutoscaleSettings(**kw), min, max, 0.0)


def ev(
    a: Autoscaler,
    now: float,
    *,
    capacity: int,
    arrivals: int = 0,
    service_time: float = 1.0,
    backlog: Sequence[int] = (0, 0, 0, 0),
    busy: int = 0,
    reserved: int = 0,
) -> int:
    """evaluate() with the signals of an idle pool unless told otherwise."""
    return a.evaluate(
        now,
        arrivals=arrivals,
        service_time=service_time,
        backlog_by_class=backlog,
        busy=busy,
        capacity=capacity,
        reserved=reserved,
    )


def capacity_at(sim: PoolSim, t: float) -> int:
    """Capacity set by the last evaluation at or before t."""
    return sim.trace[max(k for k in sim.trace if k <= t)]


# -- settings ------------------------------------------------------------------------------


def test_defaults_match_published_autoscale_config() -> None:
    s = AutoscaleSettings()
    assert (s.interval, s.target_utilization, s.drain_time) == (1.0, 0.75, 30.0)
    assert (s.reservation_horizon, s.stabilization_window, s.cooldown) == (60.0, 60.0, 30.0)
    assert (s.max_step_up_abs, s.max_step_down, s.cost_per_worker_second) == (4, 1, 0.0)
    assert s.slo == {}
    assert (s.max_step_up_ratio, s.ewma_alpha) == (1.0, 0.5)
    assert AutoscaleSettings().slo is not s.slo  # no shared mutable default


def test_constructor_asserts_min_le_max() -> None:
    with pytest.raises(AssertionError):
        Autoscaler(AutoscaleSettings(), 5, 2, 0.0)


def test_first_evaluation_is_at_start_then_every_interval() -> None:
    a = Autoscaler(AutoscaleSettings(interval=0.5), 1, 4, 10.0)
    assert a.next_eval == 10.0
    assert a.desired == 1  # before any evaluation
    assert ev(a, 10.0, capacity=3) == 3
    assert a.desired == 3  # the starting capacity: nothing to scale yet
    assert a.next_eval == 10.5
    ev(a, 10.5, capacity=3)
    assert a.next_eval == 11.0
    # a driver late by several intervals skips the missed grid points
    ev(a, 13.2, capacity=3)
    assert a.next_eval == pytest.approx(13.7)


# -- 40 queued 0.5 s tasks -----------------------------------------------------------------


def test_burst_of_40_short_tasks_scales_1_5_8_then_back_down() -> None:
    sim = PoolSim(make(1, 8), capacity=1, duration=0.5)
    sim.run_until(0.0)
    assert sim.trace == {0.0: 1}
    sim.submit(0.001, 40)  # counted as 40 arrivals by the evaluation at t=1
    sim.run_until(2.0)
    assert sim.trace == {0.0: 1, 1.0: 5, 2.0: 8}
    sim.run_until(400.0)
    assert sim.done == 40
    # t=1, 2 and 3 wanted 8 (t=3: 8 busy plus backlog), t=4 wanted 4: the stabilization
    # window (60 s) keeps 8 until the 8s of t<=3 have left it
    assert capacity_at(sim, 62.0) == 8
    assert sim.trace[63.0] == 7  # window (3, 63]: max target 4, at most 1 down per step
    assert capacity_at(sim, 92.0) == 7  # cooldown 30 s
    assert sim.trace[93.0] == 6
    assert sim.trace[123.0] == 5
    assert sim.trace[243.0] == 1
    assert capacity_at(sim, 400.0) == 1


# -- idle pool ------------------------------------------------------------------------------


def test_idle_pool_at_8_holds_60s_then_drops_one_per_cooldown() -> None:
    sim = PoolSim(make(1, 8), capacity=8, duration=0.5)
    sim.run_until(300.0)
    assert {t: c for t, c in sim.trace.items() if t < 60.0} == {float(t): 8 for t in range(60)}
    expected = {60.0: 7, 90.0: 6, 120.0: 5, 150.0: 4, 180.0: 3, 210.0: 2, 240.0: 1}
    for t, c in sim.trace.items():
        if t >= 60.0:
            last = max(k for k in expected if k <= t)
            assert c == expected[last], t


def test_window_and_cooldown_on_a_fine_grid() -> None:
    # interval 0.1: 600 float additions must still land on the 60 s and 30 s boundaries
    sim = PoolSim(make(1, 8, interval=0.1), capacity=8, duration=0.5)
    sim.run_until(95.0)
    downs = [t for t, c in sim.trace.items() if c < 8]
    assert downs[0] == pytest.approx(60.0)
    changes = sorted({c: t for t, c in sorted(sim.trace.items(), reverse=True)}.items())
    assert [(c, round(t, 6)) for c, t in changes] == [(6, 90.0), (7, 60.0), (8, 0.0)]


# -- the published quirk, done better --------------------------------------------------------


@pytest.mark.parametrize("initial", [8, 2])
def test_no_step_down_at_first_evaluation(initial: int) -> None:
    sim = PoolSim(make(1, 8), capacity=initial, duration=0.5)
    sim.run_until(0.0)
    assert sim.trace == {0.0: initial}  # the published package: 8 -> 7, 2 -> 1 at t=0
    sim.run_until(59.0)
    assert set(sim.trace.values()) == {initial}
    sim.run_until(60.0)
    assert sim.trace[60.0] == initial - 1


# -- min=0 -------------------------------------------------------------------------------------


def test_min0_pool_starts_at_0_and_rises_at_next_evaluation() -> None:
    sim = PoolSim(make(0, 10), capacity=0, duration=0.5)
    sim.run_until(0.0)
    assert sim.trace == {0.0: 0}
    sim.submit(0.3, 1)
    sim.run_until(0.999)
    assert sim.capacity == 0 and sim.starts == []  # waits for the next evaluation
    sim.run_until(1.0)
    # 1 arrival/s x 1.0 s (default_duration, nothing learned yet) / 0.75 -> 2 workers
    assert sim.trace[1.0] == 2
    assert sim.starts == [1.0]
    sim.run_until(200.0)
    assert capacity_at(sim, 60.0) == 2  # window (0, 60] still holds the 2 of t=1
    assert sim.trace[61.0] == 1
    assert capacity_at(sim, 90.0) == 1
    assert sim.trace[91.0] == 0
    assert capacity_at(sim, 200.0) == 0


# -- reservations ----------------------------------------------------------------------------


def test_reservations_raise_capacity_at_once() -> None:
    # three overlapping fixed starts at t=4.2 submitted at t=0.2 (fixed-start tasks are not
    # ready work: they count as arrivals only when they become due, not at submission)
    sim = PoolSim(
        make(0, 10), capacity=0, duration=0.5, reserved=lambda now: 3 if 0.2 <= now < 4.2 else 0
    )
    sim.run_until(0.0)
    assert sim.trace == {0.0: 0}
    sim.run_until(1.0)
    assert sim.trace[1.0] == 3
    sim.run_until(4.0)
    assert set(sim.trace.values()) == {0, 3}
    assert sim.trace[4.0] == 3


def test_reservations_beyond_step_limit_still_step_limited() -> None:
    a = make(0, 50)
    assert ev(a, 0.0, capacity=0, reserved=20) == 4  # +max(4, 0 x 100 %)
    assert ev(a, 1.0, capacity=4, reserved=20) == 8
    assert ev(a, 2.0, capacity=8, reserved=20) == 16  # +max(4, 8 x 100 %)
    assert ev(a, 3.0, capacity=16, reserved=20) == 20


# -- SLO -------------------------------------------------------------------------------------


def _first(slo: dict[int, float], backlog: Sequence[int], busy: int = 2, **kw: Any) -> int:
    a = Autoscaler(AutoscaleSettings(slo=slo, **kw), 2, 10, 0.0)
    # a pool restored with a backlog: at the first evaluation only backlog and busy count
    return a.evaluate(
        0.0,
        arrivals=0,
        service_time=1.0,
        backlog_by_class=backlog,
        busy=busy,
        capacity=2,
        reserved=0,
    )


def test_slo_term_raises_capacity() -> None:
    # drain term alone: 2 busy + 10 x 1 s / 30 s = 2.33 -> 3
    assert _first({}, [10, 0, 0, 0]) == 3
    # critical tasks must not wait more than 2 s: 10 x 1 s / 2 s = 5 workers
    assert _first({CRITICAL: 2.0}, [10, 0, 0, 0]) == 5
    # a HIGH SLO counts the CRITICAL and HIGH backlog, not NORMAL/LOW: (4 + 8) x 1 / 2 = 6
    assert _first({HIGH: 2.0}, [4, 8, 30, 0]) == 6
    assert _first({}, [4, 8, 30, 0]) == 4  # 2 + 42/30
    # an SLO of a class without backlog (and of less urgent classes) adds nothing
    assert _first({CRITICAL: 0.5}, [0, 0, 30, 30], busy=0) == 2
    # the largest SLO term wins; a LOW SLO counts the whole backlog: 42 / 7 = 6
    assert _first({CRITICAL: 1.0, LOW: 7.0}, [4, 8, 30, 0]) == 6


def test_slo_zero_means_max_when_there_is_backlog() -> None:
    assert _first({NORMAL: 0.0}, [0, 0, 1, 0], busy=0) == 6  # max 10, step-limited 2 -> 6
    assert _first({NORMAL: 0.0}, [0, 0, 0, 5], busy=0) == 2  # LOW backlog is not ahead


def test_slo_raises_capacity_in_a_running_pool() -> None:
    def run(slo: dict[int, float]) -> PoolSim:
        a = Autoscaler(AutoscaleSettings(slo=slo, ewma_alpha=0.1), 1, 10, 0.0)
        sim = PoolSim(a, capacity=1, duration=1.0)
        sim.run_until(0.0)
        for k in range(20):  # a steady 1 task/s of 1 s: 2 workers (1 x 1 / 0.75 -> 2)
            sim.submit(k + 0.5, 1, NORMAL)
        sim.submit(20.5, 12, CRITICAL)  # then a burst the smoothed rate barely notices
        sim.run_until(25.0)
        return sim

    plain, with_slo = run({}), run({CRITICAL: 2.0})
    assert plain.trace[20.0] == with_slo.trace[20.0] == 2
    # t=21: 2 busy, 10 CRITICAL queued, ewma 0.1 x 12 + 0.9 x 1 = 2.1 -> load 2.8, drain 2.33
    assert plain.trace[21.0] == 3
    # ... and the SLO term: 10 x 1 s / 2 s = 5
    assert with_slo.trace[21.0] == 5
    assert max(plain.starts) == 23.0
    assert max(with_slo.starts) == 22.5  # the burst is through sooner


# -- drain term ------------------------------------------------------------------------------


def test_drain_term_and_zero_drain_time() -> None:
    # 1 busy + 90 x 1 s / 30 s = 4
    assert ev(make(1, 20), 0.0, capacity=1, busy=1, backlog=[0, 0, 90, 0]) == 4
    # drain_time 0 and a backlog: max (20), step-limited to 1 + 4
    assert ev(make(1, 20, drain_time=0.0), 0.0, capacity=1, busy=1, backlog=[0, 0, 1, 0]) == 5
    assert ev(make(1, 20, drain_time=0.0), 0.0, capacity=1, busy=1) == 1


def test_tiny_demand_counts_as_none() -> None:
    a = make(0, 10)
    ev(a, 0.0, capacity=0)
    # 0.005 arrivals/s x 1 s / 0.75 = 0.0067 of a worker: below 0.01 -> 0
    assert ev(a, 200.0, capacity=0, arrivals=1) == 0
    b = make(0, 10)
    ev(b, 0.0, capacity=0)
    # 0.01 arrivals/s -> 0.0133 of a worker -> 1
    assert ev(b, 100.0, capacity=0, arrivals=1) == 1


def test_arrival_rate_is_smoothed() -> None:
    a = make(0, 100, max_step_up_abs=100)
    # service 0.75 s / utilization 0.75: the load term equals the smoothed rate
    assert ev(a, 0.0, capacity=0, service_time=0.75, arrivals=50) == 0
    assert a.ewma is None  # the first evaluation is only the baseline
    assert ev(a, 2.0, capacity=0, service_time=0.75, arrivals=20) == 10
    assert a.ewma == 10.0
    assert ev(a, 3.0, capacity=0, service_time=0.75, arrivals=30) == 20  # 0.5x30 + 0.5x10
    # two calls at the same instant: no sample, the arrivals are carried to the next one
    assert ev(a, 3.0, capacity=0, service_time=0.75, arrivals=7) == 20
    assert ev(a, 4.0, capacity=0, service_time=0.75, arrivals=13) == 20  # 0.5x20 + 0.5x20


# -- capacity set from outside ----------------------------------------------------------------


def test_external_capacity_is_subject_to_cooldown_inside_bounds_and_clamped_outside() -> None:
    a = make(1, 8)
    for t in range(60):
        assert ev(a, float(t), capacity=8) == 8
    assert ev(a, 60.0, capacity=8) == 7
    # set_capacity(6) inside the bounds: no further step down during the cooldown
    assert ev(a, 61.0, capacity=6) == 6
    # set_capacity(20) on a max-8 pool: back to max at the next evaluation
    assert ev(a, 62.0, capacity=20) == 8
    # ... which counts as a step down for the cooldown
    assert ev(a, 91.0, capacity=8) == 8
    assert ev(a, 92.0, capacity=8) == 7
    # set_capacity(0) on a min-1 pool: back to min at once
    assert ev(a, 93.0, capacity=0) == 1


def test_scale_up_ignores_cooldown_and_window() -> None:
    a = make(1, 20)
    cap = 8
    for t in range(61):
        cap = ev(a, float(t), capacity=cap)
    assert cap == 7  # stepped down at t=60
    # 7 busy + 300 x 1 s / 30 s = 17: up at once, +max(4, 7) per step
    assert ev(a, 61.0, capacity=cap, busy=7, backlog=[0, 0, 300, 0]) == 14
    assert ev(a, 62.0, capacity=14, busy=7, backlog=[0, 0, 300, 0]) == 17


def test_zero_abs_step_still_grows_from_zero() -> None:
    a = make(0, 5, max_step_up_abs=0)
    assert ev(a, 0.0, capacity=0, reserved=5) == 1
    assert ev(a, 1.0, capacity=1, reserved=5) == 2
    assert ev(a, 2.0, capacity=2, reserved=5) == 4


# -- properties ------------------------------------------------------------------------------

settings_st = st.builds(
    AutoscaleSettings,
    interval=st.floats(0.1, 5.0),
    target_utilization=st.floats(0.05, 1.0),
    drain_time=st.sampled_from([0.0, 0.5, 5.0, 30.0]),
    slo=st.dictionaries(st.integers(0, 3), st.sampled_from([0.0, 0.5, 2.0, 30.0]), max_size=4),
    stabilization_window=st.sampled_from([0.0, 0.5, 3.0, 10.0, 60.0]),
    cooldown=st.sampled_from([0.0, 1.0, 2.5, 30.0]),
    max_step_up_abs=st.integers(0, 6),
    max_step_down=st.integers(1, 3),
    max_step_up_ratio=st.floats(0.0, 2.0),
    ewma_alpha=st.floats(0.01, 1.0),
)

# mostly quiet signals with occasional load, so that shrinks (and cooldowns) happen often
few = st.sampled_from([0, 0, 0, 0, 1, 2, 5, 40])
step_st = st.tuples(
    st.sampled_from([0.0, 0.05, 0.5, 1.0, 1.0, 1.0, 2.5, 7.0]),  # time to the next evaluation
    st.one_of(few, st.integers(0, 200)),  # arrivals
    st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 10.0)),  # service time
    st.lists(few, min_size=4, max_size=4),  # backlog per class
    few,  # busy
    st.one_of(st.just(0), st.integers(0, 25)),  # reserved
    st.one_of(st.none(), st.none(), st.none(), st.floats(0.0, 1.0)),  # set_capacity in bounds
)


class Reference:
    """The documented formula, written the slow and obvious way (full history, no deque)."""

    def __init__(self, s: AutoscaleSettings, lo: int, hi: int) -> None:
        self.s, self.lo, self.hi = s, lo, hi
        self.history: list[tuple[float, int]] = []
        self.first: float | None = None
        self.since = 0.0
        self.carry = 0
        self.ewma: float | None = None
        self.last_down: float | None = None

    def evaluate(
        self,
        now: float,
        arrivals: int,
        service: float,
        backlog: Sequence[int],
        busy: int,
        reserved: int,
        cap: int,
    ) -> int:
        s, hi = self.s, float(self.hi)
        if self.first is None:
            self.first, self.since = now, now
        elif now - self.since > 1e-9:
            rate = (self.carry + arrivals) / (now - self.since)
            a = s.ewma_alpha
            self.ewma = rate if self.ewma is None else a * rate + (1 - a) * self.ewma
            self.since, self.carry = now, 0
        else:
            self.carry += arrivals
        terms = [(self.ewma or 0.0) * service / s.target_utilization, float(reserved)]
        total = sum(backlog)
        if s.drain_time > 0:
            terms.append(busy + total * service / s.drain_time)
        else:
            terms.append(busy + (hi if total else 0.0))
        for c, w in s.slo.items():
            ahead = sum(backlog[: c + 1])
            terms.append(ahead * service / w if w > 0 else (hi if ahead else 0.0))
        raw = max(min(t, hi) for t in terms)
        target = min(self.hi, max(self.lo, 0 if raw < 0.01 else math.ceil(raw - 1e-9)))
        # window (now - W, now]; the current target counts even when W == 0
        recent = [x for t, x in self.history if t > now - s.stabilization_window + 1e-9]
        stab = max([target, *recent])
        self.history.append((now, target))
        new = cap
        if target > cap:
            new = min(target, cap + max(1, s.max_step_up_abs, int(cap * s.max_step_up_ratio)))
        elif (
            stab < cap
            and now - self.first >= s.stabilization_window - 1e-9
            and (self.last_down is None or now - self.last_down >= s.cooldown - 1e-9)
        ):
            new = max(stab, cap - s.max_step_down)
        new = min(self.hi, max(self.lo, new))
        if new < cap:
            self.last_down = now
        return new


@settings(max_examples=300, deadline=None)
@given(
    s=settings_st,
    lo=st.integers(0, 5),
    extra=st.integers(0, 15),
    start=st.floats(0.0, 1.0),
    steps=st.lists(step_st, min_size=1, max_size=150),
)
def test_property_bounds_steps_and_cooldown(
    s: AutoscaleSettings,
    lo: int,
    extra: int,
    start: float,
    steps: list[tuple[float, int, float, list[int], int, int, float | None]],
) -> None:
    hi = max(1, lo + extra)
    a = Autoscaler(s, lo, hi, 100.0)
    ref = Reference(s, lo, hi)
    cap = lo + round(start * (hi - lo))
    now = a.next_eval
    first = now
    last_shrink: float | None = None
    for dt, arrivals, service, backlog, busy, reserved, override in steps:
        if override is not None:
            cap = lo + round(override * (hi - lo))
        new = a.evaluate(
            now,
            arrivals=arrivals,
            service_time=service,
            backlog_by_class=backlog,
            busy=busy,
            capacity=cap,
            reserved=reserved,
        )
        assert new == ref.evaluate(now, arrivals, service, backlog, busy, reserved, cap)
        assert a.desired == new
        assert lo <= new <= hi
        assert new - cap <= max(1, s.max_step_up_abs, math.floor(cap * s.max_step_up_ratio))
        assert cap - new <= s.max_step_down
        if new < cap:
            assert now - first >= s.stabilization_window - 1e-9
            if last_shrink is not None:
                assert now - last_shrink >= s.cooldown - 1e-9
            last_shrink = now
        assert a.next_eval > now
        cap = new
        now += dt
