"""Ready tasks that wait outside the ready queues: on a resource that is short, or for a free
slot of a worker group that carries their labels.

Dispatch pops the best ready task; if it cannot get its resources or a matching slot it is
*parked* there (so it never blocks the tasks behind it) and offered again when the resource or
group can serve it: the next dispatch after an attempt ended, permits came back, a bucket
refilled or a slot was added. Offered tasks go back into their ready queues (they still compete
by score); `Parking.offered` lets the dispatch loop offer again if one did not start. Requests
for the same resource amounts share one resolved tuple (few distinct requests exist).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import SubmitError
from .groups import Group, Groups
from .model import RUNNING, TaskRecord
from .pool import PoolState
from .resources import ResourceState
from .timers import Timers

# A task's resources resolved at submit: (resource, amount) pairs.
Wanted = tuple[tuple[ResourceState, int], ...]
_WANTED_CACHE = 1024  # distinct resource requests remembered


class Parking:
    """Resource and worker-group parking of the engine (see the module docstring): it needs
    only the engine's pools, resources and timers, never a status change."""

    __slots__ = ("_pools", "_refill", "_resources", "_timers", "_wanted", "offered", "reoffer")

    def __init__(
        self, pools: dict[str, PoolState], resources: dict[str, ResourceState], timers: Timers
    ) -> None:
        self._pools = pools
        self._resources = resources
        self._timers = timers
        self._refill = timers.handler(self._on_tokens)
        self.reoffer = False  # an attempt ended since parked tasks were last offered resources
        self.offered: list[TaskRecord] = []  # put back in a queue by a resource or group
        self._wanted: dict[tuple[tuple[str, int], ...], Wanted] = {}

    # --- resources ------------------------------------------------------------------------

    def resolve(self, amounts: Mapping[str, int]) -> Wanted:
        """Check requested amounts (SubmitError: unknown_resource, resource_exceeds_capacity)
        and return them as (resource, amount) pairs."""
        sig = tuple(amounts.items())
        wanted = self._wanted.get(sig)
        if wanted is None:
            resources = self._resources
            pairs = []
            for name, amount in sig:
                r = resources.get(name)
                if r is None:
                    raise SubmitError("unknown_resource", f"unknown resource {name!r}")
                if amount > r.cfg.capacity:
                    raise SubmitError(
                        "resource_exceeds_capacity",
                        f"requested amount exceeds capacity of resource {name!r}",
                    )
                pairs.append((r, amount))
            wanted = tuple(pairs)
            if len(self._wanted) >= _WANTED_CACHE:
                self._wanted.clear()
            self._wanted[sig] = wanted
        return wanted

    def acquire(self, rec: TaskRecord, now: float, park: bool = True) -> bool:
        """Take the task's resources, or (with park) park it on the first one that is short."""
        extra = rec.extra
        assert extra is not None
        wanted = extra.wanted
        if not wanted:
            return True
        for r, amount in wanted:
            if r.in_use + amount > r.permits if not r.is_bucket else not r.available(amount, now):
                if park:
                    self.park_if_short(rec, wanted, now)
                return False
        for r, amount in wanted:
            r.take(amount, now)
        return True

    def park_if_short(
        self,
        rec: TaskRecord,
        wanted: Wanted,
        now: float,
        park: bool = True,
        behind_waiters: bool = False,
    ) -> bool:
        """Is one of the task's resources short now (or, with behind_waiters, does one have
        tasks waiting)? Then (with park) park it there."""
        for r, amount in wanted:
            # a semaphore inline: this runs twice per resource task (admission, dispatch)
            short = not r.available(amount, now) if r.is_bucket else r.in_use + amount > r.permits
            if short or (behind_waiters and r.parked):
                if park:
                    r.park(rec, amount)
                    rec.parked = r
                    if not short:
                        self.reoffer = True  # the next dispatch offers what is free
                    elif r.is_bucket:
                        self._bucket_wake(r, amount, now)
                return True
        return False

    def _bucket_wake(self, r: ResourceState, amount: int, now: float) -> None:
        """Wake when the bucket holds `amount` tokens, unless an earlier wake is set (a
        superseded later timer is ignored when it fires: its time is no longer `r.wake`)."""
        when = r.ready_at(amount, now)
        if r.wake is None or when < r.wake:
            r.wake = when
            self._timers.set(when, self._refill, r)

    def _on_tokens(self, r: ResourceState, tag: int, when: float, now: float) -> None:
        if r.wake == when:
            r.wake = None
            self._unpark(r, now)

    def _unpark(self, r: ResourceState, now: float) -> None:
        """Put back in their ready queues the parked tasks the resource can serve now, best
        first, skipping tasks whose pool has no free slot (they would only park again)."""
        pools = self._pools
        room: dict[str, int] = {}

        def fits(rec: TaskRecord) -> bool:
            assert rec.extra is not None and rec.extra.wanted is not None
            wanted = rec.extra.wanted
            if len(wanted) > 1 and self.park_if_short(rec, wanted, now):
                return False  # another of its resources is short: it now waits there
            pool = pools[rec.pool]
            left = room.get(pool.name, pool.free_for_queue())
            room[pool.name] = left - 1
            return left > 0

        out, short = r.unpark(now, fits)
        for rec in out:
            rec.parked = None
            pools[rec.pool].queues.push(rec)
        self.offered += out
        if short is not None and r.is_bucket:
            self._bucket_wake(r, short, now)

    # --- worker groups --------------------------------------------------------------------

    def slot_for(self, rec: TaskRecord, pool: PoolState, park: bool) -> Group | bool | None:
        """The worker-group slot a task would run on (None: unlabeled), or False."""
        groups = pool.groups or make_groups(pool)
        slot = groups.pick(rec, pool.unlabeled)
        if slot is False and park:
            groups.park(rec)
        return slot

    def unpark_labeled(self, pool: PoolState, g: Group) -> None:
        assert pool.groups is not None
        out = pool.groups.unpark(g)
        for rec in out:
            rec.parked = None
            pool.queues.push(rec)
        self.offered += out

    # --- offers ---------------------------------------------------------------------------

    def offer(self, now: float) -> None:
        """Offer what resources and groups can serve now to the tasks parked on them."""
        self.reoffer = False
        for r in self._resources.values():
            if r.parked:
                self._unpark(r, now)
        for pool in self._pools.values():
            groups = pool.groups
            if groups is not None and groups.parked:
                for g in list(groups.by_key.values()):
                    if g.busy < g.capacity:
                        self.unpark_labeled(pool, g)

    def unstarted_offers(self) -> bool:
        """Did a task offered since the last call not start? (Forgets the offers.)"""
        offered = self.offered
        if not offered:
            return False
        missed = any(rec.status != RUNNING for rec in offered)
        offered.clear()
        return missed

    def shed_candidate(self, pool: PoolState, cls: int, newest: bool) -> TaskRecord | None:
        """The newest (or oldest) ready task of a class, queued or parked: a scan, only run
        under overload, where max_pending bounds it."""
        q = pool.queues.classes[cls]
        found = [r for r in (q.newest() if newest else q.oldest(),) if r is not None]
        waits: list[Any] = [r.parked for r in self._resources.values()]
        if pool.groups is not None:
            waits.append(pool.groups.parked)
        for parked in waits:
            found.extend(
                e[4]
                for e in parked
                if e[4].qgen == e[3] and e[4].pool == pool.name and e[4].cls == cls
            )
        if not found:
            return None
        if newest:
            return max(found, key=lambda r: r.seq)
        return min(found, key=lambda r: (r.eligible_at, r.seq))


def make_groups(pool: PoolState) -> Groups:
    """First group or labeled task of a pool: every running attempt is on an unlabeled slot."""
    groups = pool.groups = Groups()
    groups.unlabeled_busy = pool.busy
    return groups


def unqueue(rec: TaskRecord, pool: PoolState) -> None:
    """Take a ready task out of wherever it waits: its ready queue or a parking heap (whose
    entry dies with the bumped generation)."""
    if rec.parked is not None:
        rec.parked = None
        rec.qgen += 1
    else:
        pool.queues.discard(rec)
