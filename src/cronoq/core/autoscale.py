"""The autoscaler: a pool's target capacity from the signals the engine samples, with no clock.

Theory of operation
-------------------
`Autoscaler` is a plain object like the engine: it never reads a clock, never sleeps and never
starts anything. The driver (or the engine) calls `evaluate(now, ...)` when `now >= next_eval`,
with the signals of one pool, and applies the capacity it returns. The first evaluation is due at
the `now` given to the constructor, i.e. when the pool starts (docs/autoscaling.md, "When").

Signals handed to `evaluate`
----------------------------
* `arrivals`          tasks admitted to the pool since the previous evaluation; a fixed-start
                      task should count when it becomes due, not when it is submitted (the
                      `reserved` term covers it until then; counting it twice would give a
                      min=0 pool with 3 reservations 4 workers instead of the observed 3),
* `service_time`      mean attempt runtime learned by the engine (`default_duration` before any),
* `backlog_by_class`  ready + due + retrying tasks per class, index 0 = critical .. 3 = low,
* `busy`              running attempts,
* `capacity`          the pool's current capacity (its last target when the capacity is
                      managed outside the engine: `PoolState.evaluate_scaler`),
* `reserved`          peak number of concurrent fixed-start reservations starting within
                      `reservation_horizon`,
* `stranded`          the capacity is managed outside the engine (remote workers) and none is
                      connected: no worker can ever drain the backlog, however small it is.

The formula (times in seconds; `S` = settings, `B` = sum(backlog_by_class), `s` = service_time)
------------------------------------------------------------------------------------------------
1. Arrival rate. The first evaluation only sets the baseline: there is no previous evaluation, so
   its `arrivals` give no rate (they still count through the backlog term) and the rate term is
   0 there. At every later evaluation `rate = arrivals / elapsed`, `elapsed = now - t_prev`,
   where `t_prev` is the baseline or the last evaluation that took a sample. The first sample sets
   `ewma = rate`; later ones `ewma = S.ewma_alpha * rate + (1 - S.ewma_alpha) * ewma`.
   If `elapsed <= 1e-9` (two calls at the same instant) no sample is taken: the arrivals are
   carried into the next sample and `ewma` is kept.
2. Demand terms, in workers:
   * load     = ewma * s / S.target_utilization
   * drain    = busy + B * s / S.drain_time              if S.drain_time > 0
                busy + (max if B > 0 else 0)             if S.drain_time == 0
   * slo_c    = sum(backlog_by_class[:c + 1]) * s / S.slo[c]   for every class c in S.slo:
                the workers needed so that the backlog of class c and of all more urgent classes
                drains within c's maximum predicted queue wait; when S.slo[c] == 0 the term is
                `max` if that backlog is non-empty, else 0
   * reserved = reserved
   * stranded = max                                      if `stranded` and B > 0
   `raw = max(load, drain, slo_c..., reserved, stranded)`; each term, and `raw`, is capped at `max`
   (a non-finite term counts as `max`).
3. Target: `target = 0 if raw < 0.01 else ceil(raw - 1e-9)`, then clamped to `[min, max]`.
4. Scale up, when `target > capacity`:
   `new = min(target, capacity + step)`, `step = max(1, S.max_step_up_abs,
   floor(capacity * S.max_step_up_ratio))` (the `1` only matters for a configuration with
   `max_step_up_abs = 0`, where a pool at 0 could otherwise never grow).
5. Scale down, when `target < capacity`. Every evaluation records `(now, target)`. The
   stabilized target is the highest target recorded within the window
   `(now - S.stabilization_window, now]`; the current target always counts (with a window of 0
   it is the only one, even if other evaluations happened at the same instant). A step down happens
   only when all of these hold:
   * the window has history: `now - t_first >= S.stabilization_window`, where `t_first` is the
     first evaluation (so a pool started above demand does not drop a worker at the first
     evaluation, unlike the published package);
   * the stabilized target is below `capacity`;
   * no step down happened within the cooldown: `now - t_last_down >= S.cooldown`.
   Then `new = max(stabilized, capacity - S.max_step_down)`; it never goes below `min`
   because targets are clamped to `[min, max]`. `t_last_down` becomes `now`. Scale-ups do not
   touch the cooldown.
6. Bounds. The result is always in `[min, max]`: a capacity set from outside the bounds
   (`Scheduler.set_capacity`) is brought back at the next evaluation, regardless of step limits
   and cooldown (a move down to `max` counts as a step down for the cooldown).

`evaluate` stores the result in `desired` (which is `min` before the first evaluation) and moves
`next_eval` on by `S.interval`, keeping the evaluation grid fixed; if the driver was so late that
the next grid point has already passed, the missed points are skipped and the next evaluation is
`now + S.interval`. `S.cost_per_worker_second` does not influence decisions (it prices
`PoolSnapshot.cost`).

Time comparisons (`>=` against the window and the cooldown) allow 1e-9 s of float error, so a
grid of `interval = 0.1` still steps exactly on the 60 s / 30 s boundaries.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["AutoscaleSettings", "Autoscaler"]

# demand below this fraction of one worker counts as none
_MIN_DEMAND = 0.01
# float slack for rounding up and for time comparisons
_EPS = 1e-9


@dataclass(frozen=True)
class AutoscaleSettings:
    """Engine-side autoscaler settings (validated by the public `AutoscaleConfig`)."""

    interval: float = 1.0
    target_utilization: float = 0.75
    drain_time: float = 30.0
    # class (0 critical .. 3 low) -> maximum predicted queue wait, seconds
    slo: Mapping[int, float] = field(default_factory=dict)
    reservation_horizon: float = 60.0
    stabilization_window: float = 60.0
    cooldown: float = 30.0
    max_step_up_abs: int = 4
    max_step_down: int = 1
    # +100 % of the current capacity per step
    max_step_up_ratio: float = 1.0
    # weight of the newest arrival-rate sample
    ewma_alpha: float = 0.5
    cost_per_worker_second: float = 0.0


class Autoscaler:
    """Target capacity of one pool; see the module docstring for the exact rules."""

    def __init__(self, settings: AutoscaleSettings, min: int, max: int, now: float) -> None:
        assert 0 <= min <= max, f"autoscaler bounds must satisfy 0 <= min <= max ({min}, {max})"
        self.settings = settings
        self.min = min
        self.max = max
        # when evaluate() is due next; the first evaluation happens at start
        self.next_eval: float = now
        # the last capacity returned by evaluate()
        self.desired: int = min
        # smoothed arrival rate (tasks/s); None until the first sample
        self.ewma: float | None = None
        self._first_eval: float | None = None
        self._rate_since = now
        self._carry = 0
        self._last_down: float | None = None
        # (time, target) with strictly decreasing targets: the front is the window's maximum
        self._window: deque[tuple[float, int]] = deque()

    # -- pieces of the formula -------------------------------------------------------------

    def _sample_rate(self, now: float, arrivals: int) -> None:
        if self._first_eval is None:
            # baseline: no previous evaluation, so no elapsed time and no rate
            self._rate_since = now
            self._carry = 0
            return
        elapsed = now - self._rate_since
        total = self._carry + arrivals
        if elapsed <= _EPS:
            self._carry = total
            return
        rate = total / elapsed
        alpha = self.settings.ewma_alpha
        self.ewma = rate if self.ewma is None else alpha * rate + (1.0 - alpha) * self.ewma
        self._rate_since = now
        self._carry = 0

    def _demand(
        self,
        *,
        service_time: float,
        backlog_by_class: Sequence[int],
        busy: int,
        reserved: int,
        stranded: bool,
    ) -> float:
        """Workers wanted right now (step 2 of the formula), capped at `max`; uses `ewma`."""
        s = self.settings
        cap = float(self.max)
        if stranded and any(backlog_by_class):
            return cap

        def bounded(x: float) -> float:
            return x if x <= cap else cap  # also turns inf and NaN into cap

        def workers_to_drain(tasks: int, within: float) -> float:
            if within > 0:
                return tasks * service_time / within
            return cap if tasks > 0 else 0.0

        rate = self.ewma if self.ewma is not None else 0.0
        raw = max(
            bounded(rate * service_time / s.target_utilization),
            bounded(busy + workers_to_drain(sum(backlog_by_class), s.drain_time)),
            bounded(float(reserved)),
        )
        for cls, wait in s.slo.items():
            raw = max(raw, bounded(workers_to_drain(sum(backlog_by_class[: cls + 1]), wait)))
        return raw

    def _target(self, raw: float) -> int:
        n = 0 if raw < _MIN_DEMAND else math.ceil(raw - _EPS)
        return min(self.max, max(self.min, n))

    def _stabilized(self, now: float, target: int) -> int:
        window = self._window
        while window and window[-1][1] <= target:
            window.pop()
        window.append((now, target))
        horizon = now - self.settings.stabilization_window
        while window[0][0] <= horizon + _EPS and len(window) > 1:
            window.popleft()
        return window[0][1]

    # -- the evaluation ----------------------------------------------------------------------

    def evaluate(
        self,
        now: float,
        *,
        arrivals: int,
        service_time: float,
        backlog_by_class: Sequence[int],
        busy: int,
        capacity: int,
        reserved: int,
        stranded: bool = False,
    ) -> int:
        """Return the new capacity; sets self.desired and advances self.next_eval by interval."""
        s = self.settings
        self._sample_rate(now, arrivals)
        if self._first_eval is None:
            self._first_eval = now
        raw = self._demand(
            service_time=service_time,
            backlog_by_class=backlog_by_class,
            busy=busy,
            reserved=reserved,
            stranded=stranded,
        )
        target = self._target(raw)
        stabilized = self._stabilized(now, target)

        new = capacity
        if target > capacity:
            step = max(1, s.max_step_up_abs, math.floor(capacity * s.max_step_up_ratio))
            new = min(target, capacity + step)
        elif (
            stabilized < capacity
            and now - self._first_eval >= s.stabilization_window - _EPS
            and (self._last_down is None or now - self._last_down >= s.cooldown - _EPS)
        ):
            new = max(stabilized, capacity - s.max_step_down)
        # bounds win over step limits and cooldown (capacity set from outside [min, max])
        new = min(self.max, max(self.min, new))
        if new < capacity:
            self._last_down = now

        self.desired = new
        self.next_eval += s.interval
        if self.next_eval <= now:
            self.next_eval = now + s.interval
        return new
