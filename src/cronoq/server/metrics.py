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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from cronoq.core.model import FIRST_TERMINAL, STATUS_NAMES

from ..proto.cronoq.v1 import cronoq_pb2 as pb

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

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


class _SnapshotCollector(Collector):
    """Families from the snapshot `ServerMetrics.render` sets just before collecting."""

    def __init__(self) -> None:
        self.snapshot: pb.SnapshotResponse | None = None

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


class ServerMetrics:
    """One app's registry; `render` is the body of a `/metrics` answer."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._collector = _SnapshotCollector()
        self.registry.register(self._collector)

    def render(self, snapshot: pb.SnapshotResponse) -> bytes:
        """The exposition of `snapshot`. Synchronous from setting the snapshot to the text, so
        concurrent scrapes on one event loop cannot interleave."""
        self._collector.snapshot = snapshot
        try:
            return generate_latest(self.registry)
        finally:
            self._collector.snapshot = None
