"""Worker groups: labeled slots inside a pool.

A pool's capacity is its unlabeled slots plus the slots of its groups. A task with labels runs
only on a group whose labels contain all of them (subset match); a task without labels runs on
any slot, unlabeled slots first. A labeled task that finds no free matching slot is parked
here (out of the ready queues, so it blocks nobody) until a matching group has a free slot.
"""

from __future__ import annotations

from heapq import heappop, heappush

from .model import TaskRecord

LabelKey = frozenset[tuple[str, str]]


class Group:
    """Slots that carry exactly `labels`."""

    __slots__ = ("busy", "capacity", "key", "labels")

    def __init__(self, labels: dict[str, str], capacity: int) -> None:
        self.labels = labels
        self.key: LabelKey = frozenset(labels.items())
        self.capacity = capacity
        self.busy = 0

    def serves(self, wanted: LabelKey) -> bool:
        return wanted <= self.key

    def __repr__(self) -> str:
        return f"<Group {self.labels} {self.busy}/{self.capacity}>"


class Groups:
    """The groups of one pool and the labeled tasks waiting for one of them."""

    __slots__ = ("by_key", "parked", "unlabeled_busy")

    def __init__(self) -> None:
        self.by_key: dict[LabelKey, Group] = {}
        self.unlabeled_busy = 0
        self.parked: list[tuple[int, float, int, int, TaskRecord]] = []

    def total(self) -> int:
        return sum(g.capacity for g in self.by_key.values())

    def set(self, labels: dict[str, str], capacity: int) -> Group:
        """Declare or resize the group carrying exactly `labels`."""
        key: LabelKey = frozenset(labels.items())
        g = self.by_key.get(key)
        if g is None:
            g = self.by_key[key] = Group(dict(labels), capacity)
        else:
            g.capacity = capacity
        if capacity == 0 and g.busy == 0:
            del self.by_key[key]
        return g

    def pick(self, rec: TaskRecord, unlabeled_capacity: int) -> Group | bool | None:
        """The slot for a task: None = an unlabeled slot, a Group, or False = none free."""
        labels = rec.labels
        if not labels:
            if self.unlabeled_busy < unlabeled_capacity:
                return None
            for g in self.by_key.values():
                if g.busy < g.capacity:
                    return g
            return False
        wanted: LabelKey = frozenset(labels.items())
        for g in self.by_key.values():
            if g.busy < g.capacity and g.serves(wanted):
                return g
        return False

    def occupy(self, slot: Group | None) -> None:
        if slot is None:
            self.unlabeled_busy += 1
        else:
            slot.busy += 1

    def vacate(self, slot: Group | None) -> None:
        if slot is None:
            self.unlabeled_busy -= 1
            return
        slot.busy -= 1
        if slot.capacity == 0 and slot.busy == 0:
            self.by_key.pop(slot.key, None)

    def park(self, rec: TaskRecord) -> None:
        rec.qgen += 1
        rec.parked = self
        heappush(self.parked, (rec.cls, rec.eligible_at, rec.seq, rec.qgen, rec))

    def unpark(self, g: Group) -> list[TaskRecord]:
        """Parked tasks that group `g` can serve now (as many as it has free slots), best first."""
        free = g.capacity - g.busy
        if free <= 0 or not self.parked:
            return []
        out: list[TaskRecord] = []
        keep = []
        while self.parked and len(out) < free:
            entry = heappop(self.parked)
            rec = entry[4]
            if rec.qgen != entry[3] or rec.parked is not self:
                continue
            assert rec.labels
            if g.serves(frozenset(rec.labels.items())):
                out.append(rec)
            else:
                keep.append(entry)
        for entry in keep:
            heappush(self.parked, entry)
        return out
