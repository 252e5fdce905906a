"""Filling free slots: fixed starts on the slots held for them, then the best ready tasks of
every pool that is not paused, offering freed resources and worker-group slots to the tasks
parked on them."""

from __future__ import annotations

from .fixed import FixedStarts
from .state import State


def fill(st: State, fixed: FixedStarts, now: float) -> None:
    """Offer freed resources and group slots to the tasks parked on them, then fill slots.

    An offered task counts against the resource's level, its pool's room or its group's free
    slots; one that did not start (outranked in its queue, cancelled meanwhile, or parked again
    on a group or another resource) may have held back others, so offer again, as when the
    dispatch itself freed something (a missed fixed start let its held slot go). Offered tasks
    that did not start are no longer parked, so each round offers fewer tasks or follows a
    start: the loop ends."""
    parking = st.parking
    offer = parking.reoffer
    while True:
        if offer:
            parking.offer(now)
        _dispatch_pools(st, fixed, now)
        if not (parking.unstarted_offers() or parking.reoffer):
            return
        offer = True


def _dispatch_pools(st: State, fixed: FixedStarts, now: float) -> None:
    pools = st.pool_list
    # Fixed starts first, in every pool: one that could not start by its tolerance ends now,
    # and its dependents (in any pool) join the ready queues before those are served.
    for pool in pools:
        if pool.due and pool.busy < pool.capacity and not pool.paused:
            pool.stats.level(now, pool.busy, pool.capacity)
            fixed.dispatch_due(pool, now)
            pool.stats.level(now, pool.busy, pool.capacity)
        if pool.misses:
            fixed.apply_misses(pool, now)
    parking = st.parking
    for pool in pools:
        queues = pool.queues
        free = pool.free_for_queue()
        if free <= 0 or not queues.n or pool.paused:
            continue
        stats = pool.stats
        stats.level(now, pool.busy, pool.capacity)  # close the interval before the change
        while free > 0 and queues.n:
            rec = queues.pop_best(now)
            assert rec is not None
            slot = None
            if pool.groups is not None or rec.labels:
                found = parking.slot_for(rec, pool, park=True)
                if isinstance(found, bool):
                    continue  # parked until a matching group has a free slot
                slot = found
            if rec.extra is not None and not parking.acquire(rec, now):
                if slot is not None and pool.groups is not None and pool.groups.parked:
                    parking.unpark_labeled(pool, slot)  # the group slot it found is free
                continue  # parked on a resource; the next task may run
            free -= 1
            st.start(rec, pool, now, queues.adherent, slot)
        stats.level(now, pool.busy, pool.capacity)
