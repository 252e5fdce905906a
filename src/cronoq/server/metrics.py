"""Prometheus metrics of docs/http.md, "Metrics", built at scrape time from the Admin snapshot.

Every figure already lives in the snapshot the `cronoq.v1.Admin/Snapshot` call answers (the
engine's pools and totals plus the worker layer's groups), so the metrics are not kept up to
date as things happen: each scrape takes one snapshot and a custom collector turns it into
families. `cronoq_tasks_total` is a counter because the snapshot's totals only grow while this
leader runs. Each app has its own `CollectorRegistry`, so two apps in one process (the tests,
a leader and its standby) never mix their figures.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from ..proto.cronoq.v1 import cronoq_pb2 as pb

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # docs/http.md, "Metrics": text exposition 0.0.4

CLASSES = ("critical", "high", "normal", "low")  # PoolSnapshot.pending_by_class order

# (metric suffix, PoolSnapshot field, help): one gauge per pool each
_POOL_GAUGES = (
    ("capacity", "capacity", "Slots granted by the pool's connected workers."),
    ("busy", "busy", "Slots running an attempt."),
    ("held", "held", "Slots held back for fixed starts."),
    ("desired", "desired", "Worker slots the autoscaler wants (the KEDA/HPA target)."),
    ("reservations", "reservations", "Fixed-start reservations ahead."),
    ("workers_connected", "workers_connected", "Remote workers connected to the pool."),
    ("dispatched", "dispatched", "Attempts dispatched in the snapshot window."),
    ("succeeded", "succeeded", "Tasks succeeded in the snapshot window."),
    ("failed", "failed", "Tasks failed in the snapshot window."),
    ("priority_adherence", "priority_adherence", "Share of dispatches that kept class order."),
    ("fixed_start_hit_rate", "fixed_start_hit_rate", "Share of fixed starts on time."),
    ("utilization", "utilization", "Busy share of the capacity in the window."),
    ("schedule_efficiency", "schedule_efficiency", "Schedule efficiency in the window."),
    ("cost", "cost", "Worker cost so far (cost_per_worker_second times worker seconds)."),
)
_WAIT_QUANTILES = (("0.5", "wait_p50_s"), ("0.9", "wait_p90_s"), ("0.99", "wait_p99_s"))
_TOTALS = tuple(f.name for f in pb.Totals.DESCRIPTOR.fields)


class _SnapshotCollector(Collector):
    """Families from the snapshot `ServerMetrics.render` sets just before collecting."""

    def __init__(self) -> None:
        self.snapshot: pb.SnapshotResponse | None = None
        self.leader = False

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("cronoq_up", "1 while the server process runs.", value=1)
        yield GaugeMetricFamily(
            "cronoq_leader", "1 if this server serves, 0 on a standby.", value=int(self.leader)
        )
        snap = self.snapshot
        if snap is None:  # a standby has no scheduler to report on
            return
        for suffix, field, text in _POOL_GAUGES:
            g = GaugeMetricFamily(f"cronoq_pool_{suffix}", text, labels=["pool"])
            for p in snap.pools:
                g.add_metric([p.name], getattr(p, field))
            yield g
        pending = GaugeMetricFamily(
            "cronoq_pool_pending", "Pending tasks by priority class.", labels=["pool", "class"]
        )
        wait = GaugeMetricFamily(
            "cronoq_pool_wait_seconds",
            "Queue wait percentiles in the snapshot window.",
            labels=["pool", "quantile"],
        )
        capacity = GaugeMetricFamily(
            "cronoq_group_capacity",
            "Slots granted to the workers of one label set.",
            labels=["pool", "labels"],
        )
        busy = GaugeMetricFamily(
            "cronoq_group_busy",
            "Busy slots of the workers of one label set.",
            labels=["pool", "labels"],
        )
        for p in snap.pools:
            for cls, n in zip(CLASSES, p.pending_by_class, strict=False):
                pending.add_metric([p.name, cls], n)
            for q, field in _WAIT_QUANTILES:
                wait.add_metric([p.name, q], getattr(p, field))
            for group in p.groups:
                labels = ",".join(f"{k}={v}" for k, v in sorted(group.labels.items()))
                capacity.add_metric([p.name, labels], group.capacity)
                busy.add_metric([p.name, labels], group.busy)
        yield from (pending, wait, capacity, busy)
        yield GaugeMetricFamily("cronoq_tasks_live", "Tasks not yet ended.", value=snap.live_tasks)
        yield GaugeMetricFamily("cronoq_tasks_running", "Attempts running.", value=snap.running)
        yield GaugeMetricFamily(
            "cronoq_tasks_pending", "Tasks not yet running.", value=snap.pending
        )
        yield GaugeMetricFamily(
            "cronoq_workers_connected", "Remote workers connected.", value=snap.workers_connected
        )
        totals = CounterMetricFamily(
            "cronoq_tasks", "Task events since this leader started.", labels=["event"]
        )
        for name in _TOTALS:
            totals.add_metric([name], getattr(snap.totals, name))
        yield totals


class ServerMetrics:
    """One app's registry; `render` is the body of a `/metrics` answer."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._collector = _SnapshotCollector()
        self.registry.register(self._collector)

    def render(self, snapshot: pb.SnapshotResponse | None, *, leader: bool) -> bytes:
        """The exposition of `snapshot` (None on a standby: only `cronoq_up` and
        `cronoq_leader`). Synchronous from setting the snapshot to the text, so concurrent
        scrapes on one event loop cannot interleave."""
        self._collector.snapshot, self._collector.leader = snapshot, leader
        try:
            return generate_latest(self.registry)
        finally:
            self._collector.snapshot = None
