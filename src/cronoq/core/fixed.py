"""Fixed start times: reservations at admission, held slots ahead of the start, the start on a
held slot, and what happens when the start is missed.

A fixed-start task reserves [start - tolerance, start + expected duration + tolerance) when it
is admitted; at most `reservation_limit` reservations of a pool may overlap. Once its
dependencies are met it is *scheduled*: a slot is held for it from `start - lead` (lead: the
tolerance or the learned mean runtime, whichever is longer, and at most the pool's `max_hold`),
and at the start time it becomes *due*: ready, ahead of the ready queues, started by the next
dispatch on the slot held for it. If it has not started by start + tolerance, `on_miss`
decides: `run_late` keeps it due, `skip` ends it missed, `fail` ends it failed. A recurring
occurrence with overlap="skip" is skipped at its start time while an earlier occurrence is
still live.
"""

from __future__ import annotations

from heapq import heappop, heappush

from ..errors import SubmitError
from .model import FAILED, MISSED, READY, SCHEDULED, SKIPPED, Extras, TaskRecord
from .pool import PoolState, peak_overlap
from .state import State

MSG_MISSED = "fixed start missed"
MSG_OVERLAP = "previous occurrence still running"


class FixedStarts:
    """The engine's fixed-start bookkeeping (see the module docstring)."""

    __slots__ = ("_batch", "_hold", "_miss", "_st", "_start", "in_batch")

    def __init__(self, st: State) -> None:
        self._st = st
        self._hold = st.timers.handler(self._on_hold)
        self._start = st.timers.handler(self._on_start)
        self._miss = st.timers.handler(self._on_miss)
        self.in_batch = False  # checking a batch: its reservations count against each other
        self._batch: dict[str, list[tuple[float, float]]] = {}

    def end_batch(self) -> None:
        self.in_batch = False
        self._batch.clear()

    def check_reservation(self, rec: TaskRecord, pool: PoolState) -> None:
        """Fixed starts may overlap at most reservation_limit at a time (batch-mates included)."""
        lo, hi = pool.reservation(rec)
        others = list(pool.reservations.values()) + self._batch.get(pool.name, [])
        if peak_overlap(others, lo, hi) + 1 > pool.reservation_limit:
            raise SubmitError("reservation_conflict", "fixed-start reservation conflict")
        if self.in_batch:
            self._batch.setdefault(pool.name, []).append((lo, hi))

    def arrive(self, rec: TaskRecord, extra: Extras, pool: PoolState, now: float) -> None:
        """The task may run: wait for its time, run now, or apply on_miss."""
        st = self._st
        start = extra.start_at
        assert start is not None
        if _too_late(extra, now):
            st.move(rec, SCHEDULED, now, None)
            self.missed(rec, extra, pool, now)
        elif now >= start:
            self._make_due(rec, extra, pool, now)
        else:
            st.move(rec, SCHEDULED, now, None)
            lead = max(extra.tolerance, pool.service_time())
            if pool.cfg.max_hold is not None:
                lead = min(lead, pool.cfg.max_hold)
            st.timers.set(start - lead, self._hold, rec)
            st.timers.set(start, self._start, rec)

    def missed(self, rec: TaskRecord, extra: Extras, pool: PoolState, now: float) -> None:
        """Not started within tolerance and on_miss is skip or fail."""
        pool.stats.on_fixed_start(now, False)
        status = MISSED if extra.on_miss == "skip" else FAILED
        self._st.finish(rec, status, now, MSG_MISSED)

    def drop(self, rec: TaskRecord, extra: Extras, pool: PoolState) -> None:
        """The task started or ended: its reservation and held slot go."""
        pool.reservations.pop(rec, None)
        if extra.held:
            extra.held = False
            pool.holds -= 1
            self._st.reoffer_if_resources()  # a held slot is free for others again
        extra.due = False
        extra.fixed_done = True

    def dispatch_due(self, pool: PoolState, now: float) -> None:
        """Start tasks at their fixed start time on the slots held for them, in start order;
        one that lacks a matching slot or a resource lets the next one try."""
        st = self._st
        due = pool.due
        waiting = []
        while due and pool.busy < pool.capacity:
            entry = heappop(due)
            rec = entry[2]
            extra = rec.extra
            assert extra is not None and extra.start_at is not None
            if rec.status != READY or not extra.due:
                continue
            found = None
            if pool.groups is not None or rec.labels:
                found = st.parking.slot_for(rec, pool, park=False)
            if isinstance(found, bool) or not st.parking.acquire(rec, now, park=False):
                waiting.append(entry)
                continue
            pool.stats.on_fixed_start(now, now <= extra.start_at + extra.tolerance)
            self.drop(rec, extra, pool)
            st.start(rec, pool, now, True, found)
        for entry in waiting:
            heappush(due, entry)

    def apply_misses(self, pool: PoolState, now: float) -> None:
        """Due tasks past their tolerance (skip/fail) that dispatch could not start end now."""
        for rec in pool.misses:
            extra = rec.extra
            if rec.status == READY and extra is not None and extra.due:
                self.missed(rec, extra, pool, now)
        pool.misses.clear()

    def _make_due(self, rec: TaskRecord, extra: Extras, pool: PoolState, now: float) -> None:
        """The start time has come: the task waits, ahead of the ready queues, for its slot."""
        start = extra.start_at
        assert start is not None
        self._st.move(rec, READY, now, None)
        pool.unready_by_class[rec.cls] -= 1
        rec.eligible_at = rec.ready_at = now
        pool.arrivals += 1
        _hold(extra, pool)
        extra.due = True
        heappush(pool.due, (start, rec.seq, rec))
        if now <= start + extra.tolerance:
            self._st.timers.set(start + extra.tolerance, self._miss, rec)

    # --- timer handlers -------------------------------------------------------------------

    def _on_hold(self, rec: TaskRecord, tag: int, when: float, now: float) -> None:
        if rec.status == SCHEDULED:
            assert rec.extra is not None
            _hold(rec.extra, self._st.pools[rec.pool])

    def _on_start(self, rec: TaskRecord, tag: int, when: float, now: float) -> None:
        if rec.status != SCHEDULED:
            return
        extra = rec.extra
        assert extra is not None
        pool = self._st.pools[rec.pool]
        sched = extra.recurring
        if sched is not None and sched.earlier_live(rec):
            self._st.finish(rec, SKIPPED, now, MSG_OVERLAP)
        elif _too_late(extra, now):  # the driver woke after the tolerance
            self.missed(rec, extra, pool, now)
        else:
            self._make_due(rec, extra, pool, now)

    def _on_miss(self, rec: TaskRecord, tag: int, when: float, now: float) -> None:
        # Without a free slot it ends now; with one, the dispatch that follows this advance()
        # starts it or, if it cannot (resource, labels), ends it.
        extra = rec.extra
        assert extra is not None
        if rec.status == READY and extra.due and extra.on_miss != "run_late":
            pool = self._st.pools[rec.pool]
            if pool.busy >= pool.capacity:
                self.missed(rec, extra, pool, now)
            else:
                pool.misses.append(rec)


def _too_late(extra: Extras, now: float) -> bool:
    """Past start + tolerance with an on_miss other than run_late."""
    start = extra.start_at
    assert start is not None
    return extra.on_miss != "run_late" and now > start + extra.tolerance


def _hold(extra: Extras, pool: PoolState) -> None:
    if not extra.held:
        extra.held = True
        pool.holds += 1
