"""Fair-share ready queue of one priority class: start-time fair queueing between tenants.

`FairClassQueue` is a drop-in alternative to `queue.ClassQueue` for pools with fair share
(docs/overflow-and-fairness.md, "Tenants and fair share"). Priority classes stay strict
(`ReadyQueues` compares class heads as before); inside a class the FIFO head is replaced by the
task fair queueing would dispatch next.

Groups. Every distinct `tenant` is a group; tasks with `tenant=None` form one more group. A
group weighs `weights[tenant]`, or 1.0 when not listed (the `None` group always weighs 1.0).

Virtual time. Each group has a virtual time `vt`:

* it starts at 0 when the group is first seen;
* dispatching one of its tasks (`take`) advances it by `1 / weight`; the group's `vt` just before
  that dispatch is the task's start tag, and the start tag of the most recently dispatched task is
  the *system virtual time* `V`;
* when an idle group (no queued tasks, including a group seen for the first time) gets a task
  again, its `vt` is raised to `max(vt, V)`. A group that sat idle while the others were served
  therefore re-enters level with the current dispatch position instead of at its old, low `vt`:
  it gets its share from now on but no burst that would monopolise the pool to "catch up";
* a task leaving without being dispatched (`discard`: cancel, shed) changes no virtual time.

Order. `fifo_head()` is the oldest task (smallest `(eligible_at, seq)`) of the group with the
smallest `vt`; groups with equal `vt` are ordered by their heads' `(eligible_at, seq)`, i.e. the
earliest submission wins. `dl_head()` is, as in `ClassQueue`, the queued task with the earliest
`latest_start` (ties by `seq`) across all groups. A retried task is pushed again with its original
`eligible_at` and `seq` and so keeps its place inside its group.

Arithmetic. A group's `vt` is kept as `base + count / weight` (`base` is the value it was last
raised to, `count` the dispatches since), not as a running sum: one rounding instead of an
accumulating error, so virtual times that should meet do meet exactly whenever the true value is
representable (three dispatches of a weight-3 group from 0 give exactly 1.0, where a running sum
of 1/3 drifts), and such ties are broken by submission order, not by rounding noise.

Structure. Each group has a heap of its queued tasks keyed `(eligible_at, seq)`. The queue keeps a
heap `fifo` of active groups keyed `(vt, head eligible_at, head seq)` and a heap `dl` of deadline
tasks keyed `(latest_start, seq)`. Entries are invalidated lazily, as in `ClassQueue`: a task entry
is live while its generation equals `rec.qgen` (bumped by every push, discard and take); a group
entry is live while its generation equals the group's, which changes whenever the group's key
changes (new head, new `vt`) or the group goes idle. The top entry of an active group's task heap
is always live. A heap whose stale entries outnumber its live ones (plus a small slack) is rebuilt
from the live ones, so memory stays O(live) under any mix of cancels and retries. Every operation
is O(log n) amortised (n = queued tasks plus active groups); idle groups cost one small record
each (their `vt` must be remembered).

Overload shedding (`oldest()` / `newest()`, as on `ClassQueue`): the oldest queued task by
`(eligible_at, seq)` and the most recently submitted one (largest `seq`) across all groups. Both
use extra lazy heaps that are built on first use only, so pools that never shed pay nothing.

`ReadyQueues` compatibility: the interface is `ClassQueue`'s (`push`, `discard`, `take`,
`fifo_head`, `dl_head`, `oldest`, `newest`, `n`, `dl`, `fifo`). An older `ReadyQueues.pop_best`
fast path did `rec = q.fifo_head(); heappop(q.fifo)` before removing `rec`; that is harmless here
when followed by `take(rec)` or `discard(rec)`: the popped entry is the live entry of `rec`'s
group, and removing a group's head always re-files the group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from heapq import heapify, heappop, heappush
from typing import TypeVar

from .heaps import live_head
from .model import TaskRecord

_TaskEntry = tuple[float, int, int, TaskRecord]
_NewEntry = tuple[int, int, TaskRecord]
_GroupEntry = tuple[float, float, int, int, "_Group"]
_T = TypeVar("_T", _TaskEntry, _NewEntry, _GroupEntry)

WEIGHTS_MESSAGE = "tenant weights must be finite and > 0"

# A lazy heap is rebuilt once it holds more than 2 * live + _SLACK entries.
_SLACK = 64


class _Group:
    """One tenant (or the untenanted group) of one class queue."""

    __slots__ = ("base", "count", "gen", "heap", "n", "vt", "weight")

    def __init__(self, weight: float) -> None:
        self.weight = weight
        # vt = base + count / weight (see "Arithmetic" above).
        self.base = 0.0
        self.count = 0
        self.vt = 0.0
        # Queued tasks: (eligible_at, seq, task generation, task); the top is always live.
        self.heap: list[_TaskEntry] = []
        self.n = 0
        # Generation of the group's live entry in FairClassQueue.fifo; 0 = none (idle).
        self.gen = 0


def _live_task(e: _TaskEntry) -> bool:
    return e[3].qgen == e[2]


def _live_new(e: _NewEntry) -> bool:
    return e[2].qgen == e[1]


def _live_group(e: _GroupEntry) -> bool:
    return e[4].gen == e[3]


class FairClassQueue:
    """Ready tasks of one priority class, ordered by start-time fair queueing between tenants."""

    __slots__ = (
        "_active",
        "_age",
        "_gen",
        "_groups",
        "_new",
        "_weights",
        "dl",
        "fifo",
        "n",
        "vnow",
    )

    def __init__(self, weights: Mapping[str, float]) -> None:
        ws: dict[str, float] = {}
        for tenant, w in weights.items():
            if (
                isinstance(w, bool)
                or not isinstance(w, (int, float))
                or not math.isfinite(w)
                or w <= 0
            ):
                raise ValueError(WEIGHTS_MESSAGE)
            ws[tenant] = float(w)
        self._weights = ws
        self._groups: dict[str | None, _Group] = {}
        self._gen = 0
        self._active = 0
        # Active groups: (vt, head eligible_at, head seq, group generation, group).
        self.fifo: list[_GroupEntry] = []
        # Deadline tasks: (latest_start, seq, task generation, task).
        self.dl: list[_TaskEntry] = []
        # All tasks by age and by -seq, for oldest() / newest(); None until first used.
        self._age: list[_TaskEntry] | None = None
        self._new: list[_NewEntry] | None = None
        self.n = 0
        # System virtual time: the start tag of the most recently dispatched task.
        self.vnow = 0.0

    # --- changes ---------------------------------------------------------------------------

    def push(self, rec: TaskRecord) -> None:
        """Add a ready task (bumps `rec.qgen`)."""
        g = rec.qgen = rec.qgen + 1
        tenant = rec.tenant
        grp = self._groups.get(tenant)
        if grp is None:
            w = 1.0 if tenant is None else self._weights.get(tenant, 1.0)
            grp = self._groups[tenant] = _Group(w)
        entry = (rec.eligible_at, rec.seq, g, rec)
        heappush(grp.heap, entry)
        if grp.n == 0:
            # Idle -> active: never behind the system virtual time.
            if grp.vt < self.vnow:
                grp.base = grp.vt = self.vnow
                grp.count = 0
            grp.n = 1
            self._active += 1
            self._file(grp, rec)
        else:
            grp.n += 1
            if grp.heap[0] is entry:
                self._file(grp, rec)
        if rec.latest_start is not None:
            heappush(self.dl, (rec.latest_start, rec.seq, g, rec))
        if self._age is not None:
            heappush(self._age, entry)
        if self._new is not None:
            heappush(self._new, (-rec.seq, g, rec))
        self.n += 1

    def discard(self, rec: TaskRecord) -> None:
        """A queued task leaves without being dispatched: no virtual time changes."""
        grp, was_head = self._remove(rec)
        if was_head and grp.n:
            self._file(grp, grp.heap[0][3])

    def take(self, rec: TaskRecord) -> None:
        """A queued task was dispatched: remove it and advance its tenant's virtual time."""
        grp, _ = self._remove(rec)
        self.vnow = grp.vt
        grp.count += 1
        grp.vt = grp.base + grp.count / grp.weight
        if grp.n:
            self._file(grp, grp.heap[0][3])

    def _remove(self, rec: TaskRecord) -> tuple[_Group, bool]:
        grp = self._groups[rec.tenant]
        heap = grp.heap
        was_head = heap[0][3] is rec
        rec.qgen += 1
        n = self.n = self.n - 1
        grp.n -= 1
        if grp.n == 0:
            grp.heap = []
            grp.gen = 0
            self._active -= 1
            if n == 0:
                # Nothing queued: drop every stale entry at once.
                self.fifo.clear()
                self.dl.clear()
                if self._age is not None:
                    self._age.clear()
                if self._new is not None:
                    self._new.clear()
                return grp, was_head
        elif was_head:
            while heap[0][3].qgen != heap[0][2]:
                heappop(heap)
        elif len(heap) > 2 * grp.n + _SLACK:
            _compact(heap, _live_task)
        limit = 2 * n + _SLACK
        if len(self.dl) > limit:
            _compact(self.dl, _live_task)
        if self._age is not None and len(self._age) > limit:
            _compact(self._age, _live_task)
        if self._new is not None and len(self._new) > limit:
            _compact(self._new, _live_new)
        return grp, was_head

    def _file(self, grp: _Group, head: TaskRecord) -> None:
        """(Re-)enter an active group in `fifo` under its current key."""
        gen = self._gen = self._gen + 1
        grp.gen = gen
        fifo = self.fifo
        heappush(fifo, (grp.vt, head.eligible_at, head.seq, gen, grp))
        if len(fifo) > 2 * self._active + _SLACK:
            _compact(fifo, _live_group)

    # --- queries ---------------------------------------------------------------------------

    def fifo_head(self) -> TaskRecord | None:
        """The task fair queueing dispatches next, or None when empty."""
        fifo = self.fifo
        while fifo:
            e = fifo[0]
            grp = e[4]
            if grp.gen == e[3]:
                return grp.heap[0][3]
            heappop(fifo)
        return None

    def dl_head(self) -> TaskRecord | None:
        """The queued task with the earliest latest start (ties by seq), or None."""
        return live_head(self.dl)

    def oldest(self) -> TaskRecord | None:
        """The queued task with the smallest (eligible_at, seq), whatever its tenant."""
        age = self._age
        if age is None:
            age = self._age = [e for grp in self._groups.values() for e in grp.heap]
            _compact(age, _live_task)
        return live_head(age)

    def newest(self) -> TaskRecord | None:
        """The most recently submitted queued task (largest seq), whatever its tenant."""
        new = self._new
        if new is None:
            new = self._new = [
                (-e[1], e[2], e[3]) for grp in self._groups.values() for e in grp.heap
            ]
            _compact(new, _live_new)
        while new:
            e = new[0]
            r = e[2]
            if r.qgen == e[1]:
                return r
            heappop(new)
        return None

    def virtual_time(self, tenant: str | None) -> float:
        """The tenant's current virtual time (0.0 if never seen); for tests and diagnostics."""
        grp = self._groups.get(tenant)
        return 0.0 if grp is None else grp.vt


def _compact(heap: list[_T], live: Callable[[_T], bool]) -> None:
    """Rebuild a lazy heap in place from its live entries."""
    heap[:] = [e for e in heap if live(e)]
    heapify(heap)
