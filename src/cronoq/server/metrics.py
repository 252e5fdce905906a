"""Prometheus metrics of docs/http.md, "Metrics", built at scrape time from the Admin snapshot.

Every figure already lives in the snapshot the `cronoq.v1.Admin/Snapshot` call answers (the
engine's pools and totals plus the worker layer's groups), so the metrics are not kept up to
date as things happen: each scrape takes one snapshot and a custom collector turns it into
families. The family names, types and labels are those of the published cronoq-server 0.2.1,
so dashboards, alerts and KEDA/HPA triggers written for it read ours unchanged; `cronoq_up`,
`cronoq_leader`, `cronoq_pool_succeeded`, `cronoq_pool_failed` and the `cronoq_group_*`
families are our own on top. The counters are the snapshot's totals, which only grow while
this leader runs. Each app has its own `CollectorRegistry`, so two apps in one process (the
tests, a leader and its standby) never mix their figures.

prometheus_client writes every value as a float (`3.0` where the published server writes `3`);
a Prometheus scraper reads both as the same number.

Beside the published families, our own task-queue families (docs/http.md, "Task queue
metrics"): two histograms fed as attempts start and end, by a `TaskObserver` the server hands
the engine (`Engine(observer=...)`, through the Scheduler): the engine calls it with figures
it already has (the wait for a slot at a start, the runtime and outcome at an end), and the
observer adds each to its buckets. Only an engine given an observer calls one (its state is
then `core.state.ObservedState`), so the library path, which has none, is unchanged. The
ready-queue gauges and the per-pool retry and dead-letter counters are read at scrape time
from `Engine.ready_view()`, O(pools x classes). Last come the pools' paused and unserved
flags, as 0/1 gauges.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from cronoq.core.model import (
    ATTEMPT_OUTCOMES,
    FIRST_TERMINAL,
    STATUS_NAMES,
    Attempt,
    ReadyView,
)

from ..proto.cronoq.v1 import cronoq_pb2 as pb

__all__ = ["BUCKETS", "CONTENT_TYPE", "ServerMetrics", "TaskObserver"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # docs/http.md, "Metrics": text exposition 0.0.4

CLASSES = ("critical", "high", "normal", "low")  # PoolSnapshot.pending_by_class order

# (family, PoolSnapshot field, help): one gauge each, one sample per pool
_POOL_GAUGES = (
    ("cronoq_pool_workers", "capacity", "Worker capacity: slots granted by connected workers."),
    ("cronoq_pool_desired_workers", "desired", "Slots the autoscaler aims for (KEDA/HPA input)."),
    ("cronoq_pool_busy_workers", "busy", "Slots running an attempt."),
    ("cronoq_pool_held_workers", "held", "Slots kept free for fixed starts due soon."),
    ("cronoq_pool_workers_connected", "workers_connected", "Remote workers of the pool."),
    ("cronoq_pool_reservations", "reservations", "Fixed-start reservations not yet started."),
    ("cronoq_pool_dispatched_window", "dispatched", "Attempts dispatched within the window."),
    ("cronoq_pool_succeeded", "succeeded", "Attempts that succeeded within the window."),
    ("cronoq_pool_failed", "failed", "Attempts that failed within the window."),
    ("cronoq_pool_priority_adherence", "priority_adherence", "Dispatches in class order, share."),
    ("cronoq_pool_fixed_start_hit_rate", "fixed_start_hit_rate", "Fixed starts on time, share."),
    ("cronoq_pool_utilization", "utilization", "Busy share of the provisioned slot time."),
    (
        "cronoq_pool_schedule_efficiency",
        "schedule_efficiency",
        "Successful share of the slot time.",
    ),
)
# (family, PoolSnapshot field, help): our own 0/1 gauges per pool, exposed last
_POOL_FLAGS = (
    ("cronoq_pool_paused", "paused", "1 while an operator has paused the pool: nothing starts."),
    (
        "cronoq_pool_unserved",
        "unserved",
        "1 while tasks wait and the pool has no capacity at all: no worker serves it.",
    ),
)
_WAIT_QUANTILES = (("0.5", "wait_p50_s"), ("0.9", "wait_p90_s"), ("0.99", "wait_p99_s"))

# Totals fields counted by `cronoq_tasks_total{status}`: the terminal statuses, in order
TERMINAL_STATUSES = STATUS_NAMES[FIRST_TERMINAL:]
# (family, Totals field, help): unlabeled counters
_COUNTERS = (
    ("cronoq_tasks_submitted_total", "submitted", "Tasks accepted by submit."),
    ("cronoq_attempts_dispatched_total", "dispatched", "Attempts handed to a worker."),
    ("cronoq_retries_total", "retries", "Failed attempts whose task will run again."),
    ("cronoq_timeouts_total", "timeouts", "Attempts that ran past their timeout."),
    ("cronoq_lease_expiries_total", "lease_expiries", "Leases that expired without a heartbeat."),
    ("cronoq_stale_completions_total", "stale_completions", "Reports on leases no longer held."),
)
_SINCE = " Counted since this leader started."

# Upper bounds (seconds) of the two histograms' buckets, +Inf after them: 1 ms (an idle
# pool's dispatch) to an hour (a backlog, a long batch job), about 2-2.5x apart.
BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
_LE = [*(repr(b) for b in BUCKETS), "+Inf"]
_OUTCOME_ORDER = {o: i for i, o in enumerate(ATTEMPT_OUTCOMES)}


class _Histogram:
    """Counts per bucket (not cumulative; the last one is +Inf) and the sum of one series."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        if v < 0.0:  # a clock stepped back between the two instants: count it as no time
            v = 0.0
        self.counts[bisect_left(BUCKETS, v)] += 1  # the first bound >= v: `le` is inclusive
        self.total += v

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        n = 0
        for le, c in zip(_LE, self.counts, strict=True):
            n += c
            out.append((le, n))
        return out


class TaskObserver:
    """The engine's observer (cronoq.core.model.Observer) of the server: a histogram of the
    wait for a slot per (pool, class) and one of the attempt runtime per (pool, class,
    outcome). One per server process, handed to every engine its scheduler starts, so the
    histograms count from the process's start (a standby observes nothing)."""

    def __init__(self) -> None:
        self.waits: dict[tuple[str, int], _Histogram] = {}
        self.runtimes: dict[tuple[str, int, str], _Histogram] = {}

    def started(self, att: Attempt, wait: float) -> None:
        rec = att.task
        h = self.waits.get((rec.pool, rec.cls))
        if h is None:
            h = self.waits[rec.pool, rec.cls] = _Histogram()
        h.observe(wait)

    def ended(self, att: Attempt, outcome: str, runtime: float) -> None:
        rec = att.task
        h = self.runtimes.get((rec.pool, rec.cls, outcome))
        if h is None:
            h = self.runtimes[rec.pool, rec.cls, outcome] = _Histogram()
        h.observe(runtime)


class _SnapshotCollector(Collector):
    """Families from the snapshot `ServerMetrics.render` sets just before collecting."""

    def __init__(self, observer: TaskObserver) -> None:
        self.snapshot: pb.SnapshotResponse | None = None
        self.observer = observer
        self.ready: tuple[Sequence[ReadyView], float] | None = None  # with the clock's now

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("cronoq_up", "1 while the server process runs.", value=1)
        # only a serving server answers a scrape (a standby's is 503, docs/http.md, "Metrics")
        yield GaugeMetricFamily("cronoq_leader", "1: this server leads and serves.", value=1)
        snap = self.snapshot
        if snap is None:  # collected outside render(): nothing to report on
            return
        yield from _pool_families(snap.pools)
        yield GaugeMetricFamily(
            "cronoq_workers_connected", "Remote workers connected.", value=snap.workers_connected
        )
        yield GaugeMetricFamily("cronoq_live_tasks", "Tasks not yet ended.", value=snap.live_tasks)
        yield GaugeMetricFamily("cronoq_running_tasks", "Attempts running now.", value=snap.running)
        yield GaugeMetricFamily("cronoq_pending_tasks", "Tasks waiting to run.", value=snap.pending)
        ended = CounterMetricFamily(
            "cronoq_tasks_total",
            "Tasks that ended, by terminal status." + _SINCE,
            labels=["status"],
        )
        for status in TERMINAL_STATUSES:
            ended.add_metric([status], getattr(snap.totals, status))
        yield ended
        for name, field, text in _COUNTERS:
            yield CounterMetricFamily(name, text + _SINCE, value=getattr(snap.totals, field))
        order = {p.name: i for i, p in enumerate(snap.pools)}
        yield from _histogram_families(self.observer, order)
        if self.ready is not None:
            yield from _ready_families(*self.ready)
        for name, field, text in _POOL_FLAGS:
            g = GaugeMetricFamily(name, text, labels=["pool"])
            for p in snap.pools:
                g.add_metric([p.name], getattr(p, field))
            yield g


def _pool_families(pools: Sequence[pb.PoolSnapshot]) -> Iterator[Metric]:
    """The per-pool families; each lists the pools in the snapshot's order, which is the
    configuration's."""
    for name, field, text in _POOL_GAUGES:
        g = GaugeMetricFamily(name, text, labels=["pool"])
        for p in pools:
            g.add_metric([p.name], getattr(p, field))
        yield g
    pending = GaugeMetricFamily(
        "cronoq_pool_pending", "Tasks waiting to run, by priority class.", labels=["pool", "class"]
    )
    wait = GaugeMetricFamily(
        "cronoq_pool_wait_seconds",
        "Queue wait quantiles within the metrics window, in seconds.",
        labels=["pool", "quantile"],
    )
    cost = CounterMetricFamily(
        "cronoq_pool_cost_total",
        "Worker cost accumulated: cost_per_worker_second times provisioned worker seconds."
        + _SINCE,
        labels=["pool"],
    )
    capacity = GaugeMetricFamily(
        "cronoq_group_capacity",
        "Slots granted to the connected workers of one label set.",
        labels=["pool", "labels"],
    )
    busy = GaugeMetricFamily(
        "cronoq_group_busy",
        "Busy slots of the connected workers of one label set.",
        labels=["pool", "labels"],
    )
    for p in pools:
        for cls, n in zip(CLASSES, [*p.pending_by_class, 0, 0, 0, 0], strict=False):
            pending.add_metric([p.name, cls], n)  # always 4 samples, even from a short list
        for q, field in _WAIT_QUANTILES:
            wait.add_metric([p.name, q], getattr(p, field))
        cost.add_metric([p.name], p.cost)
        for group in p.groups:
            labels = ",".join(f"{k}={v}" for k, v in sorted(group.labels.items()))
            capacity.add_metric([p.name, labels], group.capacity)
            busy.add_metric([p.name, labels], group.busy)
    yield from (pending, wait, cost, capacity, busy)


def _histogram_families(obs: TaskObserver, order: dict[str, int]) -> Iterator[Metric]:
    """The two histograms: a series per label set observed so far, pools in configuration
    order (a pool no longer configured last), then by class and outcome."""
    last = len(order)
    wait = HistogramMetricFamily(
        "cronoq_pool_queue_wait_seconds",
        "Seconds from when a task became ready to the start of its attempt, by priority class."
        " Counted since this server started.",
        labels=["pool", "class"],
    )
    waits = sorted(obs.waits.items(), key=lambda kv: (order.get(kv[0][0], last), kv[0]))
    for (pool, cls), h in waits:
        wait.add_metric([pool, CLASSES[cls]], h.buckets(), h.total)
    yield wait
    runtime = HistogramMetricFamily(
        "cronoq_pool_attempt_duration_seconds",
        "Seconds from the start of an attempt to its end, by priority class and outcome."
        " Counted since this server started.",
        labels=["pool", "class", "outcome"],
    )
    for (pool, cls, outcome), h in sorted(
        obs.runtimes.items(),
        key=lambda kv: (order.get(kv[0][0], last), kv[0][1], _OUTCOME_ORDER.get(kv[0][2], 0)),
    ):
        runtime.add_metric([pool, CLASSES[cls], outcome], h.buckets(), h.total)
    yield runtime


def _ready_families(views: Sequence[ReadyView], now: float) -> Iterator[Metric]:
    """The ready-queue gauges and the per-pool retry and dead-letter counters."""
    ready = GaugeMetricFamily(
        "cronoq_pool_ready_tasks",
        "Tasks ready to run and waiting for a slot, by priority class.",
        labels=["pool", "class"],
    )
    oldest = GaugeMetricFamily(
        "cronoq_pool_oldest_ready_age_seconds",
        "Seconds the task first in line of each priority class has been ready; 0 when none waits.",
        labels=["pool", "class"],
    )
    retries = CounterMetricFamily(
        "cronoq_pool_retries_total",
        "Failed attempts whose task will run again." + _SINCE,
        labels=["pool"],
    )
    dead = CounterMetricFamily(
        "cronoq_pool_dead_lettered_total",
        "Tasks dead-lettered: their last attempt failed, timed out or lost its lease." + _SINCE,
        labels=["pool"],
    )
    for v in views:
        for cls, n, at in zip(CLASSES, v.ready_by_class, v.oldest_ready_at, strict=True):
            ready.add_metric([v.pool, cls], n)
            oldest.add_metric([v.pool, cls], 0.0 if at is None else max(0.0, now - at))
        retries.add_metric([v.pool], v.retries)
        dead.add_metric([v.pool], v.dead_lettered)
    yield from (ready, oldest, retries, dead)


class ServerMetrics:
    """One app's registry; `render` is the body of a `/metrics` answer. `observer` is what the
    app hands its scheduler, so the histograms see every attempt."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.observer = TaskObserver()
        self._collector = _SnapshotCollector(self.observer)
        self.registry.register(self._collector)

    def render(
        self,
        snapshot: pb.SnapshotResponse,
        ready: tuple[Sequence[ReadyView], float] | None = None,
    ) -> bytes:
        """The exposition of `snapshot` and of `ready` (the engine's `ready_view()` and the
        scheduler clock's now; None leaves its families out). Synchronous from setting the
        snapshot to the text, so concurrent scrapes on one event loop cannot interleave."""
        self._collector.snapshot = snapshot
        self._collector.ready = ready
        try:
            return generate_latest(self.registry)
        finally:
            self._collector.snapshot = None
            self._collector.ready = None
