"""The last hour of each pool, one point every `step` seconds, for the dashboard's charts
(docs/observability.md, "History"): what Prometheus would give, for a server nobody scrapes.

`History` keeps a fixed-size ring per pool (POINTS points of STEP_S: an hour) and is sans-I/O:
`sample(now, readings)` turns cumulative readings into one point per pool, the difference
from the previous reading, and `series()` answers them as JSON-ready dicts. A pool missing
from a sample is dropped with its ring, so memory stays bounded by the configured pools.

`HistorySampler` feeds it on the server's event loop, only while the server leads: like the
webhook scaler (scaler.py), `lead()` starts one session for the engine that serves then and
the session ends by itself once that engine no longer serves. Each session reads a baseline
first, so a point never spans time the server did not lead: those steps have no point at all,
and the page draws a gap where `t` jumps.

A reading costs nothing per task. It takes the `cronoq.v1.Admin/Snapshot` answer (the
figures /metrics publishes: pending, busy, capacity, connected workers, paused), the serving
engine's per-pool dead-letter count (`Engine.ready_view()`) and the counts the /metrics
observer (metrics.TaskObserver) already keeps per pool: its queue-wait histogram gives the
attempts started and, from the bucket counts added within the step, the wait percentiles,
interpolated within a bucket as Prometheus' histogram_quantile does (so they are as coarse as
its buckets, and agree with the Grafana panels); its attempt-duration histogram gives the
attempts that succeeded and failed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from cronoq.core.model import (
    OUTCOME_FAILED,
    OUTCOME_LEASE_EXPIRED,
    OUTCOME_SUCCEEDED,
    OUTCOME_TIMED_OUT,
    ReadyView,
)

from ..proto.cronoq.v1 import cronoq_pb2 as pb
from .fronts.calls import Aborted, Call
from .leading import LeaderTask
from .metrics import BUCKETS, TaskObserver

if TYPE_CHECKING:
    from .app import ServerApp
    from .fronts.http_api import UnaryHandler

__all__ = [
    "POINTS",
    "STEP_S",
    "History",
    "HistorySampler",
    "Point",
    "Reading",
    "quantile",
    "readings",
]

STEP_S = 10.0  # seconds between two points
POINTS = 360  # points kept per pool: an hour of STEP_S
SNAPSHOT = "/cronoq.v1.Admin/Snapshot"
# Attempt outcomes counted as failed: the attempt's own failure (a cancelled or abandoned
# attempt did not fail)
FAILURES = frozenset((OUTCOME_FAILED, OUTCOME_TIMED_OUT, OUTCOME_LEASE_EXPIRED))
QUANTILES = (0.5, 0.9, 0.99)


class Reading(NamedTuple):
    """One pool at one instant: gauges, and counters that only grow within a session."""

    pool: str
    pending: int
    busy: int
    capacity: int
    workers: int
    paused: bool
    started: int
    succeeded: int
    failed: int
    dead_lettered: int
    waits: tuple[int, ...]  # queue-wait bucket counts (metrics.BUCKETS, then +Inf)


class Point(NamedTuple):
    """One step of one pool; its fields are the JSON keys of `History.series`."""

    t: float
    started: int
    succeeded: int
    failed: int
    dead_lettered: int
    pending: int
    busy: int
    capacity: int
    workers: int
    paused: bool
    wait_p50: float | None
    wait_p90: float | None
    wait_p99: float | None


def quantile(q: float, counts: Sequence[int]) -> float | None:
    """The `q` quantile of bucket counts (not cumulative; the last bucket is +Inf), linear
    within its bucket as histogram_quantile; the largest finite bound when it falls in +Inf;
    None without samples."""
    rank = q * sum(counts)
    if rank == 0:
        return None
    seen = 0
    for i, bound in enumerate(BUCKETS):
        n = counts[i]
        if n and seen + n >= rank:
            low = BUCKETS[i - 1] if i else 0.0
            return low + (bound - low) * (rank - seen) / n
        seen += n
    return BUCKETS[-1]  # in the +Inf bucket


def readings(
    snap: pb.SnapshotResponse, views: Iterable[ReadyView], observer: TaskObserver
) -> list[Reading]:
    """The readings of the snapshot's pools: O(pools + observed series)."""
    dead = {v.pool: v.dead_lettered for v in views}
    waits: dict[str, list[int]] = {}
    for (pool, _), h in observer.waits.items():
        acc = waits.get(pool)
        if acc is None:
            waits[pool] = list(h.counts)
        else:
            for i, n in enumerate(h.counts):
                acc[i] += n
    ended: dict[tuple[str, bool], int] = {}
    for (pool, _, outcome), h in observer.runtimes.items():
        if outcome == OUTCOME_SUCCEEDED or outcome in FAILURES:
            key = (pool, outcome == OUTCOME_SUCCEEDED)
            ended[key] = ended.get(key, 0) + sum(h.counts)
    none = (0,) * (len(BUCKETS) + 1)
    out = []
    for p in snap.pools:
        w = tuple(waits.get(p.name, none))
        out.append(
            Reading(
                pool=p.name,
                pending=sum(p.pending_by_class),
                busy=p.busy,
                capacity=p.capacity,
                workers=p.workers_connected,
                paused=p.paused,
                started=sum(w),
                succeeded=ended.get((p.name, True), 0),
                failed=ended.get((p.name, False), 0),
                dead_lettered=dead.get(p.name, 0),
                waits=w,
            )
        )
    return out


class History:
    """Per pool, the last `points` points, one per `step` seconds; `clock` is the scheduler's
    (Unix seconds), for `series()`'s "now"."""

    def __init__(
        self, clock: Callable[[], float], *, step: float = STEP_S, points: int = POINTS
    ) -> None:
        self.step = step
        self._clock = clock
        self._points = points
        self._rings: dict[str, deque[Point]] = {}
        self._last: dict[str, Reading] = {}  # the previous reading of this session

    def gap(self) -> None:
        """A new session: the next sample is only a baseline (the counters may have been reset,
        and the time since the last point was not sampled)."""
        self._last.clear()

    def sample(self, now: float, pools: Iterable[Reading]) -> None:
        """A point per pool from what it did since its previous reading (none for a pool's
        first); pools not in `pools` are dropped."""
        current = {r.pool: r for r in pools}
        for gone in self._rings.keys() - current.keys():
            del self._rings[gone]
        for pool, r in current.items():
            prev = self._last.get(pool)
            self._last[pool] = r
            if prev is None:
                continue
            waits = [n - m for n, m in zip(r.waits, prev.waits, strict=True)]
            p50, p90, p99 = (quantile(q, waits) for q in QUANTILES)
            ring = self._rings.get(pool)
            if ring is None:
                ring = self._rings[pool] = deque(maxlen=self._points)
            ring.append(
                Point(
                    t=now,
                    started=r.started - prev.started,
                    succeeded=r.succeeded - prev.succeeded,
                    failed=r.failed - prev.failed,
                    dead_lettered=r.dead_lettered - prev.dead_lettered,
                    pending=r.pending,
                    busy=r.busy,
                    capacity=r.capacity,
                    workers=r.workers,
                    paused=r.paused,
                    wait_p50=p50,
                    wait_p90=p90,
                    wait_p99=p99,
                )
            )
        for gone in self._last.keys() - current.keys():
            del self._last[gone]

    def series(self, pool: str | None = None, since: float | None = None) -> dict[str, Any]:
        """{"step", "now", "pools": {name: [point, ...]}}, oldest point first: every pool that
        has points, or `pool` alone if it has, with only the points after `since` (an empty
        list when none is)."""
        rings = self._rings if pool is None else {pool: self._rings.get(pool, deque())}
        out = {
            name: [p._asdict() for p in ring if since is None or p.t > since]
            for name, ring in rings.items()
            if ring
        }
        return {"step": self.step, "now": self._clock(), "pools": out}


class HistorySampler(LeaderTask):
    """Samples `app`'s serving engine into `history` every `history.step` seconds of the
    event loop's clock while the app leads (see the module's docstring)."""

    def __init__(self, app: ServerApp, history: History, observer: TaskObserver) -> None:
        super().__init__(app)
        self._history = history
        self._observer = observer

    async def _snapshot(self) -> pb.SnapshotResponse | None:
        """The Admin snapshot of this server's own pools, as /metrics takes it."""
        handler = self._app.methods.get(SNAPSHOT)
        if handler is None or handler.unary_unary is None:
            return None
        run = cast("UnaryHandler", handler.unary_unary)
        try:
            answer = await run(pb.Empty(), Call((), None, own_shard=True))
        except Aborted:  # (the session is ending: the engine no longer serves)
            return None
        return cast(pb.SnapshotResponse, answer)

    async def _run(self) -> None:
        engine = self._serving()
        if engine is None:
            return
        history = self._history
        history.gap()
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            snap = await self._snapshot()
            if snap is None or self._serving() is not engine:
                return
            history.sample(
                self._app.scheduler.clock(), readings(snap, engine.ready_view(), self._observer)
            )
            # the next step on the loop's clock; one that came too late is not caught up
            due = max(due + history.step, loop.time())
            await asyncio.sleep(due - loop.time())
