"""The engine's state of one pool: slots, queues, counters, learned durations, fixed-start
bookkeeping and the autoscaler."""

from __future__ import annotations

import math

from .autoscale import Autoscaler
from .groups import Groups
from .model import (
    NUM_CLASSES,
    READY,
    PoolConfig,
    PoolSnapshot,
    ReadyView,
    Scoring,
    TaskRecord,
)
from .queue import ReadyQueues
from .stats import PoolStats

# Weight of the newest runtime in the learned expected duration of a (pool, kind).
EWMA_ALPHA = 0.2


class PoolState:
    """Engine-side state of one pool."""

    __slots__ = (
        "arrivals",
        "busy",
        "capacity",
        "cfg",
        "dead_lettered",
        "due",
        "durations",
        "groups",
        "holds",
        "learned",
        "lease_ttl",
        "misses",
        "name",
        "paused",
        "pending_by_class",
        "queues",
        "reservation_limit",
        "reservations",
        "retries",
        "retry",
        "retrying_by_class",
        "scaler",
        "stats",
        "unlabeled",
        "unready_by_class",
    )

    def __init__(self, cfg: PoolConfig, sc: Scoring, now: float) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.capacity = cfg.capacity  # unlabeled slots + the slots of every worker group
        self.unlabeled = cfg.capacity
        self.groups: Groups | None = None  # made when a group or a labeled task first appears
        self.busy = 0
        self.queues = ReadyQueues(sc, cfg.tenant_weights if cfg.fair_share else None)
        self.pending_by_class = [0, 0, 0, 0]
        self.stats = PoolStats(now, cfg.capacity, cfg.metrics_window)
        self.retry = cfg.retry
        self.lease_ttl = cfg.lease_ttl
        self.durations: dict[str, float] = {}
        self.learned: float | None = None  # mean runtime of any kind (fixed-start hold lead)
        # Fixed starts: reserved intervals of tasks not started yet, slots held for them
        # (counted from the hold until dispatch) and tasks at their start time.
        self.reservations: dict[TaskRecord, tuple[float, float]] = {}
        self.reservation_limit = max(1, math.floor(cfg.max * cfg.reservable_fraction))
        self.holds = 0
        self.due: list[tuple[float, int, TaskRecord]] = []
        self.misses: list[TaskRecord] = []  # due tasks whose tolerance ran out (skip/fail)
        # Autoscaling: arrivals since the last evaluation and retrying tasks (backlog signal).
        self.scaler = (
            None if cfg.autoscale is None else Autoscaler(cfg.autoscale, cfg.min, cfg.max, now)
        )
        self.arrivals = 0
        self.retrying_by_class = [0, 0, 0, 0]
        # Pending tasks not ready yet (blocked on dependencies, scheduled for a fixed start):
        # only tasks with extras ever are, so a plain task never touches it. Ready tasks are
        # then pending - retrying - unready, per class (ready_view).
        self.unready_by_class = [0, 0, 0, 0]
        self.retries = 0  # retries and dead letters of this pool (Engine totals' per pool)
        self.dead_lettered = 0
        self.paused = False  # by an operator (Engine.pause): dispatch passes it by

    def expected_duration(self, rec: TaskRecord) -> float:
        if rec.duration_hint is not None:
            return rec.duration_hint
        return self.durations.get(rec.kind, self.cfg.default_duration)

    def service_time(self) -> float:
        """The learned mean runtime, or the pool's default before any task succeeded."""
        return self.cfg.default_duration if self.learned is None else self.learned

    def evaluate_scaler(self, now: float, elastic: bool) -> int:
        """One autoscaler evaluation (core/autoscale.py has the formula): the unlabeled slots
        the pool should have. Resets the arrivals counted since the last one.

        Without `elastic` nothing applies the result here: an external scaler (KEDA, a webhook)
        acts on it and workers connect later, if ever. The autoscaler then steps from its own
        last target, as if it had been applied, so the target keeps its course (up by steps,
        down after the stabilization window) instead of being recomputed from a capacity that
        lags; and a backlog with no worker connected asks for `max`."""
        scaler = self.scaler
        assert scaler is not None
        backlog = [q.n for q in self.queues.classes]
        for _, _, rec in self.due:
            if rec.status == READY:
                backlog[rec.cls] += 1
        for c, n in enumerate(self.retrying_by_class):
            backlog[c] += n
        horizon = now + scaler.settings.reservation_horizon
        upcoming = [iv for iv in self.reservations.values() if iv[0] <= horizon]
        new = scaler.evaluate(
            now,
            arrivals=self.arrivals,
            service_time=self.service_time(),
            backlog_by_class=backlog,
            busy=self.busy,
            capacity=self.unlabeled if elastic else scaler.desired,
            reserved=peak_overlap(upcoming, now, math.inf),
            stranded=not elastic and self.unlabeled == 0,
        )
        self.arrivals = 0
        return new

    def reservation(self, rec: TaskRecord) -> tuple[float, float]:
        """The interval a fixed-start task reserves: [start - tol, start + duration + tol)."""
        extra = rec.extra
        assert extra is not None and extra.start_at is not None
        start, tol = extra.start_at, extra.tolerance
        return (start - tol, start + self.expected_duration(rec) + tol)

    def free_for_queue(self) -> int:
        """Slots ready tasks may take: held slots are kept for fixed starts."""
        return self.capacity - self.busy - self.holds

    def pending(self) -> int:
        return sum(self.pending_by_class)

    def has_room(self, n: int = 1) -> bool:
        """Can the pool take `n` more pending tasks without its overflow policy?"""
        cap = self.cfg.max_pending
        return cap is None or self.pending() + n <= cap

    def desired(self) -> int:
        """The target capacity: the autoscaler's last one, or the capacity without it."""
        return self.capacity if self.scaler is None else self.scaler.desired

    def ready_view(self) -> ReadyView:
        """Ready tasks per class and the ready_at of the first in line (model.ReadyView)."""
        ready = tuple(
            p - r - u
            for p, r, u in zip(
                self.pending_by_class, self.retrying_by_class, self.unready_by_class, strict=True
            )
        )
        oldest: list[float | None] = [None] * NUM_CLASSES
        for c, q in enumerate(self.queues.classes):
            if q.n:
                head = q.fifo_head()
                if head is not None:
                    oldest[c] = head.ready_at
        for _, _, rec in self.due:  # fixed starts waiting for their held slot (few)
            extra = rec.extra
            if rec.status == READY and extra is not None and extra.due:
                at = oldest[rec.cls]
                if at is None or rec.ready_at < at:
                    oldest[rec.cls] = rec.ready_at
        return ReadyView(self.name, ready, tuple(oldest), self.retries, self.dead_lettered)

    def snapshot(self, now: float) -> PoolSnapshot:
        m = self.stats.summary(now)
        by_class = list(self.pending_by_class)
        pending = sum(by_class)
        return PoolSnapshot(
            name=self.name,
            capacity=self.capacity,
            busy=self.busy,
            held=min(self.holds, max(0, self.capacity - self.busy)),
            desired=self.desired(),
            pending=pending,
            pending_by_class=by_class,
            ready=self.queues.n,
            reservations=len(self.reservations),
            window=self.stats.window,
            dispatched=int(m["dispatched"]),
            succeeded=int(m["succeeded"]),
            failed=int(m["failed"]),
            retried=int(m["retried"]),
            priority_adherence=m["priority_adherence"],
            fixed_start_hit_rate=m["fixed_start_hit_rate"],
            utilization=m["utilization"],
            schedule_efficiency=m["schedule_efficiency"],
            wait_mean=m["wait_mean"],
            wait_p50=m["wait_p50"],
            wait_p90=m["wait_p90"],
            wait_p99=m["wait_p99"],
            run_p50=m["run_p50"],
            run_p99=m["run_p99"],
            worker_seconds=self.stats.worker_seconds,
            cost=self.stats.worker_seconds * self.cfg.cost_per_worker_second,
            paused=self.paused,
            unserved=pending > 0 and self.capacity == 0,
        )


def peak_overlap(intervals: list[tuple[float, float]], lo: float, hi: float) -> int:
    """Most of the half-open intervals that cover one instant of [lo, hi)."""
    points: list[tuple[float, int]] = []
    for a, b in intervals:
        if a < hi and b > lo:
            points.append((max(a, lo), 1))
            points.append((min(b, hi), -1))
    points.sort()  # at equal times, ends (-1) before starts (+1): touching is no overlap
    peak = level = 0
    for _, step in points:
        level += step
        peak = max(peak, level)
    return peak
