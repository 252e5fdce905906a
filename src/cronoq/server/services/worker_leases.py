"""Remote workers, sans I/O: the server's side of worker protocol v3 between streams and engine.

A pool's capacity in server mode is the sum of the slots granted to its connected workers.
Workers with the same labels form one of the engine's worker groups (unlabeled workers give the
pool's unlabeled slots), so the engine's own dispatch rules (priorities, resources, label
matching, unlabeled slots first) decide *which task* runs in *which group*; this module then
picks the worker of that group with the most free slots and keeps the lease bookkeeping:
which worker holds which attempt, heartbeats, outcomes, hand-backs (nack) and stream ends.

Every method takes `now` and changes state; what must be sent is returned or left in the
engine's actions (`assign()` turns the engine's starts into (worker, attempt) pairs and
`aborted()` its aborts into (worker, attempt) pairs). The gRPC layer owns the streams.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...core.engine import Engine
from ...core.groups import Group
from ...core.model import Attempt

PROTOCOL_VERSION = 3
MSG_DISCONNECTED = "worker disconnected"
MSG_NACKED = "handed back by its worker and no other worker could take it"
MSG_NO_WORKER = "no worker of its group had a free slot left when it started"

LabelKey = frozenset[tuple[str, str]]


class WorkerError(Exception):
    """A register or set_slots the server refuses: `code` names the gRPC status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(eq=False)
class RemoteWorker:
    """One registered stream: its grant, labels and the attempts it holds (by lease id)."""

    id: int
    pool: str
    name: str
    labels: dict[str, str]
    requested: int
    granted: int
    registered_at: float
    leases: dict[int, Attempt] = field(default_factory=dict)
    gone: bool = False

    @property
    def key(self) -> LabelKey:
        return frozenset(self.labels.items())

    @functools.cached_property
    def ref(self) -> tuple[str, int]:
        """(name, id): what a task keeps of the worker that ran its attempt (TaskRecord.worker)."""
        return (self.name, self.id)

    @property
    def free(self) -> int:
        return self.granted - len(self.leases)


class Workers:
    """The connected workers of every pool of one engine, and the leases they hold."""

    def __init__(
        self,
        engine: Engine,
        *,
        pool_max: Mapping[str, int],
        pool_slot_caps: Mapping[str, int | None],
        slot_cap: int | None = None,
    ) -> None:
        self.engine = engine
        self._pool_max = dict(pool_max)
        self._pool_caps = dict(pool_slot_caps)
        self._slot_cap = slot_cap
        self._next_id = 0
        self.by_id: dict[int, RemoteWorker] = {}
        # pool -> label set -> workers carrying exactly those labels
        self._sets: dict[str, dict[LabelKey, list[RemoteWorker]]] = {p: {} for p in pool_max}
        self._holder: dict[int, RemoteWorker] = {}  # lease -> worker holding it
        self._refused: dict[int, set[int]] = {}  # lease -> workers that handed it back

    # --- membership ------------------------------------------------------------------------

    def grant(self, pool: str, requested: int) -> int:
        """Slots granted for a request: capped by the pool's max and the per-worker caps."""
        caps = [requested, self._pool_max[pool]]
        for cap in (self._pool_caps.get(pool), self._slot_cap):
            if cap is not None:
                caps.append(cap)
        return min(caps)

    def register(
        self, pool: str, requested: int, name: str, labels: Mapping[str, str], now: float
    ) -> RemoteWorker:
        """A worker that asks for 0 slots is registered with none: it gets no lease until a
        set_slots gives it some."""
        if pool not in self._sets:
            raise WorkerError("NOT_FOUND", f"unknown pool {pool!r}")
        self._next_id += 1
        w = RemoteWorker(
            self._next_id, pool, name, dict(labels), requested, self.grant(pool, requested), now
        )
        self.by_id[w.id] = w
        self._sets[pool].setdefault(w.key, []).append(w)
        self._resize(pool, w.key, now)
        return w

    def set_slots(self, w: RemoteWorker, requested: int, now: float) -> int:
        """Change a worker's grant (0 drains it: running leases go on, no new ones)."""
        w.requested = requested
        w.granted = 0 if requested == 0 else self.grant(w.pool, requested)
        self._resize(w.pool, w.key, now)
        return w.granted

    def drop(self, w: RemoteWorker, now: float) -> None:
        """The worker's stream ended: its slots go, and every attempt it held fails as
        retryable ("worker disconnected") so that it runs again elsewhere."""
        if w.gone:
            return
        w.gone = True
        del self.by_id[w.id]
        members = self._sets[w.pool][w.key]
        members.remove(w)
        if not members:
            del self._sets[w.pool][w.key]
        w.granted = 0
        self._resize(w.pool, w.key, now)
        for lease, att in list(w.leases.items()):
            self._release(w, lease)
            self.engine.fail(att, now, MSG_DISCONNECTED)

    def _resize(self, pool: str, key: LabelKey, now: float) -> None:
        """Keep the engine's capacity for this label set equal to the grants behind it."""
        total = sum(w.granted for w in self._sets[pool].get(key, ()))
        if key:
            self.engine.set_group_capacity(pool, dict(key), total, now)
        else:
            self.engine.set_capacity(pool, total, now)

    def workers(self, pool: str | None = None) -> Iterable[RemoteWorker]:
        return (w for w in self.by_id.values() if pool is None or w.pool == pool)

    # --- leases ----------------------------------------------------------------------------

    def assign(self, starts: Iterable[Attempt], now: float) -> list[tuple[RemoteWorker, Attempt]]:
        """Give each attempt the engine started to a worker of its slot's label set.

        The worker with the most free slots takes it. With a store an attempt is assigned only
        once its start is written; if its group lost the slot meanwhile (a worker drained or
        left), the attempt runs nowhere and fails as retryable, as a leaving worker's do."""
        out = []
        for att in starts:
            slot: Group | None = att.slot
            key: LabelKey = frozenset() if slot is None else slot.key
            members = self._sets[att.task.pool].get(key, ())
            w = max(members, key=lambda o: o.free, default=None)
            if w is None or w.free <= 0:
                self.engine.fail(att, now, MSG_NO_WORKER)
                continue
            self._hold(w, att)
            out.append((w, att))
        return out

    def _hold(self, w: RemoteWorker, att: Attempt) -> None:
        att.task.worker = w.ref
        w.leases[att.lease] = att
        self._holder[att.lease] = w

    def _release(self, w: RemoteWorker, lease: int) -> Attempt | None:
        self._refused.pop(lease, None)
        if self._holder.get(lease) is w:
            del self._holder[lease]
        return w.leases.pop(lease, None)

    def aborted(self, atts: Iterable[Attempt]) -> list[tuple[RemoteWorker, Attempt]]:
        """The engine gave these attempts up (timeout, cancellation, lease expiry): the worker
        gets an abort, and its slot is free at once."""
        out = []
        for att in atts:
            w = self._holder.get(att.lease)
            if w is not None:
                self._release(w, att.lease)
                out.append((w, att))
        return out

    def _held(self, w: RemoteWorker, lease: int) -> Attempt | None:
        att = w.leases.get(lease)
        if att is None:
            self.engine.count("stale_completions")
        return att

    def heartbeat(self, w: RemoteWorker, lease: int, now: float) -> None:
        """Extend a lease; one this worker does not hold is ignored (not counted)."""
        att = w.leases.get(lease)
        if att is not None:
            self.engine.heartbeat(att, now)

    def complete(self, w: RemoteWorker, lease: int, output: object, now: float) -> bool:
        att = self._held(w, lease)
        if att is None:
            return False
        self._release(w, lease)
        return self.engine.complete(att, now, output)

    def fail(
        self,
        w: RemoteWorker,
        lease: int,
        message: str,
        now: float,
        *,
        permanent: bool = False,
        retry_after: float | None = None,
    ) -> bool:
        att = self._held(w, lease)
        if att is None:
            return False
        self._release(w, lease)
        return self.engine.fail(att, now, message, permanent=permanent, retry_after=retry_after)

    def cancelled(self, w: RemoteWorker, lease: int, now: float) -> bool:
        """The worker's handler cancelled the task: it ends cancelled (no abort goes back)."""
        att = self._held(w, lease)
        if att is None:
            return False
        self._release(w, lease)
        return self.engine.cancel(att.task.id, now)

    def _group_has_room(self, pool: str, key: LabelKey) -> bool:
        """Has the engine a free slot in this label group? A worker's `free` misses attempts
        the engine already started there but that are not assigned yet (with a store they
        wait for their commit), so moving an attempt into another group must ask the engine,
        or it takes a slot promised to one of those and their `assign()` finds no worker."""
        return self.engine.group_has_room(pool, key)

    def nack(
        self, w: RemoteWorker, lease: int, now: float, reason: str = ""
    ) -> tuple[RemoteWorker, Attempt] | None:
        """The worker hands the lease back unrun. The same attempt goes to another worker of
        the pool whose labels match and that has a free slot (never back to one that handed
        it back); if there is none, the attempt fails as retryable, with the last worker's
        reason after MSG_NACKED (so that "no worker knows this kind" reaches the submitter)."""
        att = self._held(w, lease)
        if att is None:
            return None
        refused = self._refused.pop(lease, set())
        refused.add(w.id)
        self._release(w, lease)
        wanted: LabelKey = frozenset((att.task.labels or {}).items())
        pool = att.task.pool
        candidates = [
            o
            for key, members in self._sets[pool].items()
            if wanted <= key and (key == w.key or self._group_has_room(pool, key))
            for o in members
            if o.free > 0 and o.id not in refused
        ]
        if not candidates:
            self.engine.fail(att, now, f"{MSG_NACKED}: {reason}" if reason else MSG_NACKED)
            return None
        other = max(candidates, key=lambda o: (o.key == w.key, o.free))
        if other.key != w.key:
            self.engine.move_attempt(att, other.labels)
        self._refused[lease] = refused
        self._hold(other, att)
        return other, att
