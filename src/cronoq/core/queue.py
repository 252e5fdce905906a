"""Ready queues of one pool: one per priority class, each with a FIFO heap and a deadline heap.

Why this shape: within a class every task ages at the same rate (classes may differ:
Scoring.aging_rates), so the oldest eligible task always has the highest aging term and the FIFO
order never needs re-sorting as time passes (linear aging folds into the static key
`(eligible_at, seq)`). Classes are compared by scoring each one's heads at `now` with its own
rate and cap. Deadline urgency depends on `latest_start`, so tasks with a deadline also sit in a
second heap keyed by it. Choosing the next task compares at most two heads per class:
O(classes + log n) per decision.

Heap entries are removed lazily: each push stamps the task with a new generation number and an
entry is live only while its generation matches the task's (a dispatched, cancelled or re-queued
task simply bumps it).
"""

from __future__ import annotations

from collections.abc import Mapping
from heapq import heappop, heappush

from .fair import FairClassQueue
from .heaps import live_head
from .model import NUM_CLASSES, Scoring, TaskRecord

_Entry = tuple[float, int, int, TaskRecord]


class ClassQueue:
    __slots__ = ("dl", "fifo", "n")

    def __init__(self) -> None:
        self.fifo: list[_Entry] = []
        self.dl: list[_Entry] = []
        self.n = 0

    def push(self, rec: TaskRecord) -> None:
        g = rec.qgen = rec.qgen + 1
        heappush(self.fifo, (rec.eligible_at, rec.seq, g, rec))
        if rec.latest_start is not None:
            heappush(self.dl, (rec.latest_start, rec.seq, g, rec))
        self.n += 1

    def discard(self, rec: TaskRecord) -> None:
        """Take a queued task out (its heap entries die lazily)."""
        rec.qgen += 1
        self.n -= 1

    def take(self, rec: TaskRecord) -> None:
        """The task was dispatched (usually the FIFO head: drop its entry at once)."""
        rec.qgen += 1
        self.n -= 1
        fifo = self.fifo
        if fifo and fifo[0][3] is rec:
            heappop(fifo)

    def oldest(self) -> TaskRecord | None:
        return self.fifo_head()

    def newest(self) -> TaskRecord | None:
        """The most recently submitted queued task: a scan, only used under overload."""
        live = [e for e in self.fifo if e[3].qgen == e[2]]
        return max(live, key=lambda e: e[3].seq)[3] if live else None

    def fifo_head(self) -> TaskRecord | None:
        return live_head(self.fifo)

    def dl_head(self) -> TaskRecord | None:
        return live_head(self.dl)


def urgency(latest_start: float, now: float, sc: Scoring) -> float:
    slack = latest_start - now
    if slack >= sc.window:
        return 0.0
    if slack >= 0.0:
        return sc.urgency_max * (1.0 - slack / sc.window)
    return sc.urgency_max + min(sc.overdue_rate * -slack, sc.overdue_cap)


class ReadyQueues:
    """The ready tasks of one pool, ordered by dispatch score."""

    __slots__ = ("_age", "_bound", "adherent", "classes", "n", "sc")

    def __init__(self, sc: Scoring, fair_weights: Mapping[str, float] | None = None) -> None:
        # With fair share, tenants take turns within each class (classes stay strict).
        self.classes: list[ClassQueue | FairClassQueue] = (
            [ClassQueue() for _ in range(NUM_CLASSES)]
            if fair_weights is None
            else [FairClassQueue(fair_weights) for _ in range(NUM_CLASSES)]
        )
        self.n = 0
        self.sc = sc
        # Whether the last pop_best took from the most important non-empty class.
        self.adherent = True
        # Each class's (aging rate, age cap): classes may age differently, tasks of one class
        # alike, so comparing classes means scoring each class's heads at `now` with its own.
        self._age = sc.ages()
        # Highest score a class can reach without / with deadline urgency.
        self._bound = [
            (b + cap, b + cap + sc.urgency_max + sc.overdue_cap)
            for b, (_, cap) in zip(sc.base, self._age, strict=True)
        ]

    def push(self, rec: TaskRecord) -> None:
        self.classes[rec.cls].push(rec)
        self.n += 1

    def discard(self, rec: TaskRecord) -> None:
        self.classes[rec.cls].discard(rec)
        self.n -= 1

    def pop_best(self, now: float) -> TaskRecord | None:
        """Remove and return the task with the highest score at `now`."""
        if self.n == 0:
            return None
        for q in self.classes:
            if q.n:
                if q.n == self.n and not q.dl:
                    # Only one class has tasks and none has a deadline: its FIFO head wins.
                    rec = q.fifo_head()
                    assert rec is not None
                    q.take(rec)
                    self.n -= 1
                    self.adherent = True
                    return rec
                break
        base = self.sc.base
        ages = self._age
        best: TaskRecord | None = None
        best_score = -1.0
        best_dl = 0.0
        first = -1
        for c, q in enumerate(self.classes):
            if not q.n:
                continue
            if first < 0:
                first = c
            bound = self._bound[c][1 if q.dl else 0]
            if bound < best_score:
                continue
            head = q.fifo_head()
            assert head is not None
            rate, cap = ages[c]
            age = rate * (now - head.eligible_at)
            s = base[c] + (age if age < cap else cap)
            ls = head.latest_start
            if ls is not None:
                s += urgency(ls, now, self.sc)
            cand, cand_s = head, s
            if q.dl:
                d = q.dl_head()
                if d is not None and d is not head:
                    age = rate * (now - d.eligible_at)
                    ds = base[c] + (age if age < cap else cap)
                    assert d.latest_start is not None
                    ds += urgency(d.latest_start, now, self.sc)
                    if ds > s or (ds == s and (ls is None or d.latest_start < ls)):
                        cand, cand_s = d, ds
            if best is None or cand_s > best_score:
                best, best_score = cand, cand_s
                best_dl = cand.latest_start if cand.latest_start is not None else float("inf")
            elif cand_s == best_score:
                cdl = cand.latest_start if cand.latest_start is not None else float("inf")
                if cdl < best_dl or (
                    cdl == best_dl and (cand.eligible_at, cand.seq) < (best.eligible_at, best.seq)
                ):
                    best, best_dl = cand, cdl
        assert best is not None
        self.classes[best.cls].take(best)
        self.n -= 1
        self.adherent = best.cls == first
        return best
