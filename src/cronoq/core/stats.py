"""Windowed quality metrics of one pool, kept in one-second slots.

Counters, worker-seconds and latency histograms are added to the slot of the current second; a
snapshot sums the slots of the last `window` seconds (the current, partial second plus the 59
before it for the default 60 s window). Nothing here allocates per sample except the first
sample of a histogram bucket in a slot.

Percentiles come from a log-bucketed histogram with 256 buckets per power of two: a sample x is
counted in bucket (exponent, 256 * (mantissa - 0.5) * 2) of math.frexp(x), and a percentile is
the geometric middle of the bucket that holds the nearest-rank sample, so the reported value is
within 0.2 % of the exact nearest-rank percentile. Zero-length waits have a bucket of their own
and report exactly 0. Means are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

SUB_BUCKETS = 256
_ZERO_BUCKET = -(1 << 30)


def bucket_of(x: float) -> int:
    """Histogram bucket of a non-negative sample."""
    if x <= 0.0:
        return _ZERO_BUCKET
    m, e = math.frexp(x)
    return e * SUB_BUCKETS + int((m - 0.5) * 2 * SUB_BUCKETS)


def bucket_value(b: int) -> float:
    """Representative (geometric middle) value of a bucket."""
    if b == _ZERO_BUCKET:
        return 0.0
    e, sub = divmod(b, SUB_BUCKETS)
    lo = (0.5 + sub / (2 * SUB_BUCKETS)) * 2.0**e
    hi = (0.5 + (sub + 1) / (2 * SUB_BUCKETS)) * 2.0**e
    return math.sqrt(lo * hi)


def percentiles(hists: Iterable[dict[int, int]], ps: tuple[float, ...]) -> list[float]:
    """Nearest-rank percentiles of the merged histograms (0.0 when there are no samples)."""
    merged: dict[int, int] = {}
    for h in hists:
        for b, n in h.items():
            merged[b] = merged.get(b, 0) + n
    total = sum(merged.values())
    if total == 0:
        return [0.0] * len(ps)
    ordered = sorted(merged.items())
    out = []
    for p in ps:
        rank = max(1, math.ceil(p * total))
        seen = 0
        for b, n in ordered:
            seen += n
            if seen >= rank:
                out.append(bucket_value(b))
                break
    return out


class _Slot:
    """One second of metrics. Samples of the current second are kept raw (a list append is the
    cheapest thing to do per dispatch) and folded into the histograms when the second ends."""

    __slots__ = (
        "adherent",
        "busy_s",
        "cap_s",
        "dispatched",
        "failed",
        "fixed",
        "fixed_hits",
        "retried",
        "run_hist",
        "runs",
        "sec",
        "succeeded",
        "success_s",
        "wait_hist",
        "wait_sum",
        "waits",
    )

    def __init__(self) -> None:
        self.reset(-1)

    def reset(self, sec: int) -> None:
        self.sec = sec
        self.dispatched = 0
        self.adherent = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.fixed = 0
        self.fixed_hits = 0
        self.busy_s = 0.0
        self.cap_s = 0.0
        self.success_s = 0.0
        self.wait_sum = 0.0
        self.wait_hist: dict[int, int] = {}
        self.run_hist: dict[int, int] = {}
        self.waits: list[float] = []
        self.runs: list[float] = []

    def seal(self) -> None:
        """Fold the raw samples into the histograms."""
        for raw, hist in ((self.waits, self.wait_hist), (self.runs, self.run_hist)):
            for x in raw:
                b = bucket_of(x)
                hist[b] = hist.get(b, 0) + 1
            raw.clear()


class PoolStats:
    """Metrics of one pool: call `level()` before busy or capacity change, `on_*` per event."""

    __slots__ = (
        "_busy",
        "_cap",
        "_cur",
        "_last",
        "_n",
        "_slots",
        "window",
        "worker_seconds",
    )

    def __init__(self, now: float, capacity: int, window: float = 60.0) -> None:
        self.window = window
        self._n = max(1, math.ceil(window))
        self._slots = [_Slot() for _ in range(self._n)]
        self._cur = self._slot_at(now)
        self._last = now
        self._busy = 0
        self._cap = capacity
        self.worker_seconds = 0.0

    def _slot_at(self, t: float) -> _Slot:
        sec = int(t)
        s = self._slots[sec % self._n]
        if s.sec != sec:
            s.reset(sec)
        return s

    def _slot(self, now: float) -> _Slot:
        """The slot of the current second; moving to a new second seals the previous one."""
        cur = self._cur
        if cur.sec == int(now):
            return cur
        cur.seal()
        cur = self._cur = self._slot_at(now)
        return cur

    def _spans(self, start: float, end: float) -> Iterator[tuple[_Slot, float]]:
        """(slot, seconds) pieces of [start, end) within the last window, one per second. The
        window's first second is floor(end) - n + 1: the one before shares the slot of the
        current second, which that piece would reset (and lose what it counted)."""
        t = max(start, math.floor(end) - self._n + 1)
        while t < end:
            stop = min(end, math.floor(t) + 1.0)
            yield self._slot_at(t), stop - t
            t = stop

    def level(self, now: float, busy: int, capacity: int) -> None:
        """Account worker-seconds up to `now` at the old levels, then switch to the new ones."""
        last = self._last
        if now > last:
            cap, was_busy = self._cap, self._busy
            self.worker_seconds += cap * (now - last)
            if not (cap or was_busy):
                pass
            elif int(now) == int(last):  # the common case: one slot
                s = self._slot(now)
                dt = now - last
                s.busy_s += was_busy * dt
                s.cap_s += cap * dt
            else:
                for s, dt in self._spans(last, now):
                    s.busy_s += was_busy * dt
                    s.cap_s += cap * dt
            self._last = now
        self._busy = busy
        self._cap = capacity

    def on_dispatch(self, now: float, wait: float, adherent: bool) -> None:
        s = self._slot(now)
        s.dispatched += 1
        if adherent:
            s.adherent += 1
        s.wait_sum += wait
        s.waits.append(wait)

    def on_attempt_end(self, now: float, started_at: float, success: bool) -> None:
        s = self._slot(now)
        runtime = now - started_at
        if success:
            s.succeeded += 1
            # Spread the attempt's worker-seconds over the seconds it ran, like busy time.
            if int(started_at) == int(now):
                s.success_s += runtime
            else:
                for slot, dt in self._spans(started_at, now):
                    slot.success_s += dt
        else:
            s.failed += 1
        s.runs.append(runtime)

    def on_retry(self, now: float) -> None:
        self._slot(now).retried += 1

    def on_fixed_start(self, now: float, hit: bool) -> None:
        s = self._slot(now)
        s.fixed += 1
        if hit:
            s.fixed_hits += 1

    def window_slots(self, now: float) -> list[_Slot]:
        self.level(now, self._busy, self._cap)
        self._cur.seal()
        first = int(now) - self._n + 1
        return [s for s in self._slots if first <= s.sec <= now]

    def summary(self, now: float) -> dict[str, float]:
        """The windowed fields of PoolSnapshot."""
        slots = self.window_slots(now)
        dispatched = adherent = fixed = hits = succeeded = failed = retried = 0
        # (added left to right, not by sum(): CPython 3.12's sum() of floats is compensated,
        # and the Rust core must report the same bits on every version)
        cap_s = busy_s = success_s = wait_sum = 0.0
        for s in slots:
            dispatched += s.dispatched
            adherent += s.adherent
            fixed += s.fixed
            hits += s.fixed_hits
            succeeded += s.succeeded
            failed += s.failed
            retried += s.retried
            cap_s += s.cap_s
            busy_s += s.busy_s
            success_s += s.success_s
            wait_sum += s.wait_sum
        w50, w90, w99 = percentiles((s.wait_hist for s in slots), (0.5, 0.9, 0.99))
        r50, r99 = percentiles((s.run_hist for s in slots), (0.5, 0.99))
        return {
            "dispatched": dispatched,
            "succeeded": succeeded,
            "failed": failed,
            "retried": retried,
            "priority_adherence": adherent / dispatched if dispatched else 1.0,
            "fixed_start_hit_rate": hits / fixed if fixed else 1.0,
            "utilization": min(1.0, busy_s / cap_s) if cap_s > 0 else 0.0,
            "schedule_efficiency": min(1.0, success_s / cap_s) if cap_s > 0 else 0.0,
            "wait_mean": wait_sum / dispatched if dispatched else 0.0,
            "wait_p50": w50,
            "wait_p90": w90,
            "wait_p99": w99,
            "run_p50": r50,
            "run_p99": r99,
        }
