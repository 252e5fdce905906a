"""The engine core: every scheduling rule of cronoq, with no I/O and no clock.

Theory of operation
-------------------
The engine is a plain object that a *driver* (the asyncio Scheduler, the server's remote-worker
runtime, the stores) calls with the current time. It never reads a clock, never sleeps and
never starts anything itself. Each call changes the state and appends what the driver must do
to the outbox, an `Actions` the driver drains with `take()`:

* `starts`   attempts to run now (the driver runs the executor / sends a lease),
* `aborts`   attempts the engine has given up on (cancel the executor / abort the lease),
* `finished` tasks that reached a terminal status (resolve waiters, persist),
* `events`   `StatusEvent`s, recorded only when `event_level` asks for them.

The driver calls `advance(now)` to fire due timers (retry backoff, attempt timeout, lease expiry,
retention), `dispatch(now)` to fill free slots, drains the outbox with `take()`, and calls back
at `next_wake()`: one timer for the whole engine, never one per task. A driver with a store
also calls `take_journal()` after each turn for the rows to write.

This module holds the life cycle of a task (admission, the ready queues, dispatch, outcomes,
retries, cancellation, retention, restore). The features around it are components in their own
modules, each with its state: `deps.py` (dependencies), `fixed.py` (fixed starts and
reservations), `parking.py` (resources and worker-group slots), `recurring.py` (cron
schedules), `timers.py` (the one timer heap); `pool.py` holds a pool's state. Components call
the underscore primitives below (`_move`, `_finish`, `_release`, `_start`); nothing outside
core/ does.

Every status change goes through `_move()`, which checks the life-cycle table in model.py and
records the event; an illegal change raises `IllegalTransition` (a bug, caught by the simulation
tests). Restore is the one other way a status changes, and it goes through the table of restore
transitions (model.RESTORE_TRANSITIONS). Attempts end exactly once (`Attempt.ended`); an outcome
reported for an attempt that already ended (aborted by timeout, lease loss or cancellation) is
counted in `stale_completions` and changes nothing.

Determinism: the same calls with the same times and the same seeded `random.Random` give the
same decisions. Jitter is the only use of randomness.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from ..errors import SubmitError
from .actions import Actions, Journal
from .deps import Dependencies, parents_first
from .fixed import FixedStarts
from .groups import Group, LabelKey
from .model import (
    BLOCKED,
    CANCELLED,
    DEAD_LETTERED,
    DEFAULT_RETRY,
    FAILED,
    FIRST_TERMINAL,
    HISTORY_MAX,
    OUTCOME_FAILED,
    OUTCOME_LEASE_EXPIRED,
    OUTCOME_TIMED_OUT,
    READY,
    RETRYING,
    RUNNING,
    SHED,
    STATUS_NAMES,
    SUCCEEDED,
    TOTALS_KEYS,
    TRANSITIONS,
    Attempt,
    Extras,
    PastAttempt,
    PoolConfig,
    Scoring,
    Snapshot,
    StatusEvent,
    TaskRecord,
    check_transition,
)
from .parking import Parking, Wanted, make_groups, unqueue
from .pool import EWMA_ALPHA, PoolState
from .recurring import Recurring, Schedules
from .resources import ResourceConfig, ResourceState
from .restore import restore
from .timers import Timers

# event_level values
EVENTS_NONE = 0
EVENTS_TERMINAL = 1
EVENTS_ALL = 2

# abort reasons handed to the driver
ABORT_CANCELLED = "cancelled"
ABORT_TIMEOUT = "attempt timed out"
ABORT_LEASE = "lease expired"
ABORT_SHUTDOWN = "scheduler shut down"

MSG_CANCELLED = "cancelled"
MSG_SHED = "shed under overload"

DEFAULT_RETENTION = 3600.0
DEFAULT_RETENTION_MAX = 100_000


class Engine:
    """The scheduling state machine. See the module docstring for how a driver uses it."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        now: float,
        *,
        rng: random.Random | None = None,
        scoring: Scoring | None = None,
        event_level: int = EVENTS_NONE,
        emit_transitions: bool = False,
        retention: float = DEFAULT_RETENTION,
        retention_max: int = DEFAULT_RETENTION_MAX,
        first_id: int = 1,
        attempt_class: type[Attempt] = Attempt,
        resources: Sequence[ResourceConfig] = (),
        elastic: bool = True,
        journal: bool = False,
    ) -> None:
        """`elastic=False`: capacity comes from outside (remote workers' grants); the
        autoscaler then only computes `desired`, for external scalers to act on.
        `journal=True`: keep a Journal of what changed, for a driver with a store."""
        if not pools:
            raise ValueError("at least one pool is required")
        self.resources: dict[str, ResourceState] = {}
        for rc in resources:
            if rc.name in self.resources:
                raise ValueError(f"duplicate resource name {rc.name!r}")
            self.resources[rc.name] = ResourceState(rc, now)
        self.scoring = scoring or Scoring()
        self.rng = rng or random.Random(0)
        self.pools: dict[str, PoolState] = {}
        for cfg in pools:
            if cfg.name in self.pools:
                raise ValueError(f"duplicate pool name {cfg.name!r}")
            self.pools[cfg.name] = PoolState(cfg, self.scoring, now)
        self._pool_list = list(self.pools.values())
        self.configs: Mapping[str, PoolConfig] = MappingProxyType({c.name: c for c in pools})
        self._bounded = any(p.cfg.max_pending is not None for p in self._pool_list)
        self.emit_transitions = emit_transitions
        self.event_level = event_level
        self.retention = retention
        self.retention_max = retention_max
        self.started_at = now
        self.attempt_class = attempt_class
        self.elastic = elastic

        self.tasks: dict[int, TaskRecord] = {}
        self.keys: dict[str, TaskRecord] = {}
        self.running: dict[int, Attempt] = {}
        self.live = 0
        self.totals: dict[str, int] = dict.fromkeys(TOTALS_KEYS, 0)
        self.dispatching = True
        self.out = Actions()
        # What changed since the last take_journal(); read only for drivers.
        self.journal: Journal | None = Journal() if journal else None

        self.timers = Timers()
        self.deps = Dependencies(self)
        self.fixed = FixedStarts(self)
        self.parking = Parking(self)
        self.schedules = Schedules(self)
        self._next_id = first_id
        self._ids: list[int] | None = None  # task ids in order, built by the first page()
        self._seq = 0
        self._lease = 0
        self._retained: deque[TaskRecord] = deque()
        for pool in self._pool_list:
            if pool.scaler is not None:  # the first evaluation happens at start
                self.timers.set(pool.scaler.next_eval, self._on_scale, pool)

    # --- driver interface ----------------------------------------------------------------

    def take(self) -> Actions:
        """Hand the accumulated actions to the driver and start a fresh outbox."""
        out = self.out
        self.out = Actions()
        return out

    def finished_since_take(self) -> list[TaskRecord]:
        """The tasks that ended since the last take() (a driver may resolve waiters early)."""
        return self.out.finished

    def take_journal(self) -> Journal:
        """Hand what changed since the last call to a driver with a store (journal=True)."""
        journal = self.journal
        assert journal is not None, "the engine keeps no journal (journal=False)"
        self.journal = Journal()
        return journal

    def next_wake(self) -> float | None:
        """When the driver must call `advance()` next (None: only when something happens)."""
        t = self.timers.next_time()
        if self._retained:
            r = self._retained[0].finished_at + self.retention
            if t is None or r < t:
                t = r
        return t

    @property
    def next_id(self) -> int:
        """The id the next admitted task will get."""
        return self._next_id

    @property
    def recurring(self) -> Mapping[str, Recurring]:
        """The schedules by name."""
        return self.schedules.by_name

    def lookup(self, ref: int | str) -> TaskRecord | None:
        """A live or retained task by id (int) or key (str)."""
        if isinstance(ref, str):
            return self.keys.get(ref)
        return self.tasks.get(ref)

    def dependents(self, rec: TaskRecord) -> list[tuple[TaskRecord, str]]:
        """The live or retained tasks submitted with a dependency on `rec` (by its id, or by
        its key while it holds it), each with the edge's condition, in id order. A scan of
        every held task, for readers (the dashboard): `Extras.children` only lists the
        dependents still waiting, and keeping a full index would cost every submit."""
        key = rec.key
        out = []
        for child in self.tasks.values():
            extra = child.extra
            if extra is None or extra.deps is None:
                continue
            for target, cond in extra.deps:
                if target == rec.id or (key is not None and target == key):
                    out.append((child, cond))
                    break
        out.sort(key=lambda pair: pair[0].id)
        return out

    def live_tasks(self) -> Iterable[TaskRecord]:
        return (r for r in self.tasks.values() if r.status < FIRST_TERMINAL)

    def page(
        self, after: int, limit: int, match: Callable[[TaskRecord], bool] | None = None
    ) -> tuple[list[TaskRecord], bool]:
        """Up to `limit` live or retained tasks with ids above `after` that `match` accepts, in
        id order, and whether more follow. O(log n + tasks looked at): the id index is built
        at the first call and kept from then on (a driver that never pages pays nothing)."""
        ids = self._ids
        tasks = self.tasks
        if ids is None or len(ids) > 2 * len(tasks) + 1024:  # drop the ids of forgotten tasks
            ids = self._ids = sorted(tasks)
        out: list[TaskRecord] = []
        for i in range(bisect_right(ids, after), len(ids)):
            rec = tasks.get(ids[i])
            if rec is None or (match is not None and not match(rec)):
                continue
            if len(out) == limit:
                return out, True
            out.append(rec)
        return out, False

    def has_room(self, pool_name: str, n: int = 1) -> bool:
        """Can the pool take `n` more pending tasks without its overflow policy?"""
        return self.pools[pool_name].has_room(n)

    def desired(self, pool_name: str) -> int:
        """The pool's target capacity now (`PoolSnapshot.desired`), without a snapshot."""
        return self.pools[pool_name].desired()

    def pending(self) -> int:
        """Tasks waiting for a slot, in every pool."""
        return sum(p.pending() for p in self._pool_list)

    def count(self, total: str, n: int = 1) -> None:
        """Add to one of the totals (a driver's own: a report for an attempt it dropped)."""
        self.totals[total] += n

    def group_has_room(self, pool_name: str, key: LabelKey) -> bool:
        """Has the worker group with exactly these labels (empty: the unlabeled slots) a free
        slot? A pool without worker groups answers True: all its slots are alike."""
        pool = self.pools[pool_name]
        groups = pool.groups
        if groups is None:
            return True
        if not key:
            return groups.unlabeled_busy < pool.unlabeled
        g = groups.by_key.get(key)
        return g is not None and g.busy < g.capacity

    # --- restoring what a store kept ------------------------------------------------------

    def restore(
        self, recs: Iterable[TaskRecord], now: float, broken: Mapping[int, str] | None = None
    ) -> None:
        """Take back the tasks a store kept, before anything is submitted (core/restore.py;
        `broken`: id -> why that task's row cannot be read, so it fails)."""
        restore(self, recs, now, broken or {})
        self._ids = None  # restored ids come in any order: page() sorts them again

    def _retain(self, rec: TaskRecord) -> None:
        self.tasks[rec.id] = rec
        if rec.key is not None:
            self.keys[rec.key] = rec
        self._retained.append(rec)

    # --- submission ----------------------------------------------------------------------

    def submit(self, rec: TaskRecord, now: float) -> tuple[TaskRecord, bool]:
        """Admit a validated task; a live or retained key returns (existing task, True).

        Raises SubmitError (and changes nothing) when the task cannot be admitted.
        """
        key = rec.key
        if key is not None:
            old = self.keys.get(key)
            if old is not None:
                return old, True
        pool = self.pools[rec.pool]
        if rec.extra is not None:
            self._check(rec, rec.extra, pool, None)
            self.deps.check_await_cycle(rec)
        if pool.cfg.max_pending is not None:
            self._make_room(rec, pool, now)
        self._admit(rec, pool, now)
        return rec, False

    def submit_batch(self, recs: Sequence[TaskRecord], now: float) -> list[tuple[TaskRecord, bool]]:
        """Admit every task of a batch, or none (SubmitError before anything changes).

        Dependencies may name keys defined anywhere in the batch (forward references).
        """
        seen: set[str] = set()
        fresh: dict[str, TaskRecord] = {}
        out: list[tuple[TaskRecord, bool]] = []
        new: list[TaskRecord] = []
        special = False  # any task with options beyond the plain path
        for rec in recs:
            key = rec.key
            if key is not None:
                if key in seen:
                    raise SubmitError("duplicate_key_in_batch", f"duplicate key {key!r} in batch")
                seen.add(key)
                old = self.keys.get(key)
                if old is not None:
                    out.append((old, True))
                    continue
                fresh[key] = rec
            out.append((rec, False))
            new.append(rec)
            if rec.extra is not None:
                special = True
        order = new
        if special or fresh:
            self.fixed.in_batch = True
            try:
                for rec in new:
                    if rec.extra is not None:
                        self._check(rec, rec.extra, self.pools[rec.pool], fresh)
                for rec in new:  # every batch-mate's parents are known now
                    self.deps.check_await_cycle(rec)
            finally:
                self.fixed.end_batch()
            # Parents in the batch come first (ids follow the batch order); raises on a cycle.
            order = parents_first(new)
        if self._bounded:
            per_pool: dict[str, int] = {}
            for rec in new:
                per_pool[rec.pool] = per_pool.get(rec.pool, 0) + 1
            for name, n in per_pool.items():
                pool = self.pools[name]
                cap = pool.cfg.max_pending
                if cap is not None and pool.pending() + n > cap:
                    raise SubmitError("overloaded", "overloaded")
        if order is not new:
            for rec in new:
                self._assign_id(rec)
        pools = self.pools
        admit = self._admit
        for rec in order:
            admit(rec, pools[rec.pool], now)
        return out

    def resolve_resources(self, amounts: Mapping[str, int]) -> Wanted:
        """Check requested amounts (SubmitError: unknown_resource, resource_exceeds_capacity)
        and return them as (resource, amount) pairs."""
        return self.parking.resolve(amounts)

    # --- admission -----------------------------------------------------------------------

    def _check(
        self,
        rec: TaskRecord,
        extra: Extras,
        pool: PoolState,
        batch: dict[str, TaskRecord] | None,
    ) -> None:
        """Resources and dependencies of a task about to be admitted; raises SubmitError."""
        if extra.resources is not None:
            self._resolve_resources(extra)
        if extra.start_at is not None:
            self.fixed.check_reservation(rec, pool)
        if extra.deps is not None:
            self.deps.resolve(rec, extra, batch)

    def _resolve_resources(self, extra: Extras) -> None:
        """Keep the checked (resource, amount) pairs dispatch and release use."""
        if extra.resources:
            extra.wanted = self.parking.resolve(extra.resources)

    def _make_room(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        """Apply the pool's overflow policy when admitting would exceed max_pending."""
        cap = pool.cfg.max_pending
        assert cap is not None
        if pool.pending() < cap:
            return
        policy = pool.cfg.overflow
        if policy == "wait":
            raise SubmitError("full", "queue full")
        victim = None
        if policy == "shed_lowest":
            for c in range(3, rec.cls, -1):
                victim = self.parking.shed_candidate(pool, c, newest=True)
                if victim is not None:
                    break
        elif policy == "shed_oldest":
            victim = self.parking.shed_candidate(pool, 3, newest=False)
        if victim is None:
            raise SubmitError("overloaded", "overloaded")
        unqueue(victim, pool)
        self._finish(victim, SHED, now, MSG_SHED)

    def _assign_id(self, rec: TaskRecord) -> None:
        rec.id = self._next_id
        self._next_id += 1
        if self._ids is not None:
            self._ids.append(rec.id)
        self._seq += 1
        rec.seq = self._seq

    def _admit(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        if not rec.id:
            self._assign_id(rec)
        key = rec.key
        if key is not None:
            self.keys[key] = rec
        if not rec.submitted_at:  # kept when a store restores the task
            rec.submitted_at = now
        self.tasks[rec.id] = rec
        self.live += 1
        self.totals["submitted"] += 1
        pool.pending_by_class[rec.cls] += 1
        if self.journal is not None:
            self.journal.added.append(rec)
        extra = rec.extra
        fixed = extra is not None and extra.start_at is not None
        if not fixed:
            pool.arrivals += 1  # a fixed start arrives at its start time (autoscaler signal)
        if self.event_level == EVENTS_ALL:
            self._event(rec, BLOCKED, now, None)
        if key is not None and key in self.deps.awaiting:
            self.deps.key_admitted(rec, key)
        if extra is None or not (fixed or extra.resolved is not None):
            if not rec.eligible_at:  # a restored task keeps its place in the queue
                rec.eligible_at = now
            self._make_ready(rec, pool, now)
            return
        if fixed:
            pool.reservations[rec] = pool.reservation(rec)
        self.deps.attach(rec, extra, pool, now)

    def _release(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        """Every dependency of a blocked task is satisfied: it may run (or wait for its start)."""
        extra = rec.extra
        if extra is not None:
            extra.resolved = extra.parents = None
            if extra.start_at is not None:
                self.fixed.arrive(rec, extra, pool, now)
                return
        if not rec.eligible_at:
            rec.eligible_at = now
        self._make_ready(rec, pool, now)

    def _make_ready(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        self._move(rec, READY, now, None)
        rec.ready_at = now
        if rec.deadline is not None:
            rec.latest_start = rec.deadline - pool.expected_duration(rec)
        extra = rec.extra
        wanted = None if extra is None else extra.wanted
        # A task whose resource is short, or already has tasks waiting, waits there at once in
        # priority order (dispatch would only pop it to park it).
        if wanted and self.parking.park_if_short(rec, wanted, now, behind_waiters=True):
            return
        pool.queues.push(rec)

    # --- recurring schedules ---------------------------------------------------------------

    def add_recurring(self, sched: Recurring, now: float) -> None:
        """Add or replace a schedule by name (core/recurring.py)."""
        self.schedules.add(sched, now)

    def resume_recurring(
        self, sched: Recurring, next_time: float | None, last_id: int | None, now: float
    ) -> None:
        """Take back a stored schedule after restore (core/recurring.py)."""
        self.schedules.resume(sched, next_time, last_id, now)

    def remove_recurring(self, name: str, now: float) -> bool:
        """Drop a schedule and cancel its occurrences not started yet (core/recurring.py)."""
        return self.schedules.remove(name, now)

    # --- dispatch ------------------------------------------------------------------------

    def dispatch(self, now: float) -> None:
        """Start the best ready tasks on every free slot."""
        if not self.dispatching:
            return
        self._offer_and_dispatch(now)
        # Recurring occurrences are created after the previous one has taken its slot, so its
        # reservation no longer counts against the next.
        if self.schedules.create_due(now):
            self._offer_and_dispatch(now)

    def _offer_and_dispatch(self, now: float) -> None:
        """Offer freed resources and group slots to the tasks parked on them, then fill slots.

        An offered task counts against the resource's level, its pool's room or its group's
        free slots; one that did not start (outranked in its queue, cancelled meanwhile, or
        parked again on a group or another resource) may have held back others, so offer
        again, as when the dispatch itself freed something (a missed fixed start let its held
        slot go). Offered tasks that did not start are no longer parked, so each round offers
        fewer tasks or follows a start: the loop ends."""
        parking = self.parking
        offer = parking.reoffer
        while True:
            if offer:
                parking.offer(now)
            self._dispatch_pools(now)
            if not (parking.unstarted_offers() or parking.reoffer):
                return
            offer = True

    def _dispatch_pools(self, now: float) -> None:
        pools = self._pool_list
        # Fixed starts first, in every pool: one that could not start by its tolerance ends
        # now, and its dependents (in any pool) join the ready queues before those are served.
        for pool in pools:
            if pool.due and pool.busy < pool.capacity:
                pool.stats.level(now, pool.busy, pool.capacity)
                self.fixed.dispatch_due(pool, now)
                pool.stats.level(now, pool.busy, pool.capacity)
            if pool.misses:
                self.fixed.apply_misses(pool, now)
        parking = self.parking
        for pool in pools:
            queues = pool.queues
            free = pool.free_for_queue()
            if free <= 0 or not queues.n:
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
                self._start(rec, pool, now, queues.adherent, slot)
            stats.level(now, pool.busy, pool.capacity)

    def _start(
        self, rec: TaskRecord, pool: PoolState, now: float, adherent: bool, slot: Group | None
    ) -> None:
        pool.busy += 1
        pool.pending_by_class[rec.cls] -= 1
        n = rec.attempt = rec.attempt + 1
        self._lease += 1
        ttl = pool.lease_ttl
        att = self.attempt_class(rec, n, self._lease, now, ttl)
        if pool.groups is not None:
            att.slot = slot
            pool.groups.occupy(slot)
        rec.running = att
        rec.started_at = now
        self.running[att.lease] = att
        self._move(rec, RUNNING, now, None)
        self.totals["dispatched"] += 1
        pool.stats.on_dispatch(now, now - rec.ready_at, adherent)
        if rec.timeout is not None:
            self.timers.set(now + rec.timeout, self._on_timeout, att)
        if ttl is not None:
            self.timers.set(att.lease_expiry, self._on_lease, att)
        self.out.starts.append(att)

    # --- outcomes ------------------------------------------------------------------------

    def complete(self, att: Attempt, now: float, output: object = None) -> bool:
        """The attempt's executor returned `output`. False if the attempt had already ended."""
        if att.ended:
            self.totals["stale_completions"] += 1
            return False
        rec = att.task
        pool = self.pools[rec.pool]
        runtime = self._end_attempt(att, pool, now, True)
        # The learned expected durations (inline: this runs once per task).
        d = pool.durations.get(rec.kind)
        pool.durations[rec.kind] = runtime if d is None else d + EWMA_ALPHA * (runtime - d)
        d = pool.learned
        pool.learned = runtime if d is None else d + EWMA_ALPHA * (runtime - d)
        rec.output = output
        self._finish(rec, SUCCEEDED, now, None)
        return True

    def fail(
        self,
        att: Attempt,
        now: float,
        message: str,
        *,
        permanent: bool = False,
        retry_after: float | None = None,
    ) -> bool:
        """The attempt failed. False if the attempt had already ended."""
        if att.ended:
            self.totals["stale_completions"] += 1
            return False
        pool = self.pools[att.task.pool]
        self._end_attempt(att, pool, now, False)
        self._after_failure(att.task, pool, now, message, permanent, retry_after, OUTCOME_FAILED)
        return True

    def move_attempt(self, att: Attempt, labels: Mapping[str, str]) -> None:
        """A running attempt changed slots: a remote worker of another label set took it over
        (a hand-back). Keeps the worker groups' busy counts right."""
        groups = self.pools[att.task.pool].groups
        if groups is None:  # no labeled slots at all: every slot is alike
            return
        slot = groups.by_key.get(frozenset(labels.items())) if labels else None
        groups.vacate(att.slot)
        groups.occupy(slot)
        att.slot = slot

    def heartbeat(self, att: Attempt, now: float) -> bool:
        """Extend the attempt's lease; False if it already ended."""
        return att.extend(now)

    def _end_attempt(self, att: Attempt, pool: PoolState, now: float, success: bool) -> float:
        att.ended = True
        del self.running[att.lease]
        att.task.running = None
        pool.stats.level(now, pool.busy - 1, pool.capacity)
        pool.busy -= 1
        groups = pool.groups
        if groups is not None:
            slot = att.slot
            groups.vacate(slot)
            if slot is not None and groups.parked:
                self.parking.unpark_labeled(pool, slot)
        runtime = now - att.started_at
        pool.stats.on_attempt_end(now, att.started_at, success)
        extra = att.task.extra
        wanted = None if extra is None else extra.wanted
        if wanted:
            for r, amount in wanted:
                r.release(amount)
        if self.resources:
            # Permits came back, or a slot did for a task that a resource could serve: the next
            # dispatch re-offers them (once for all the attempts that ended meanwhile).
            self.parking.reoffer = True
        return runtime

    def _abort(self, att: Attempt, pool: PoolState, now: float, reason: str) -> None:
        self._end_attempt(att, pool, now, False)
        att.abort_reason = reason
        self.out.aborts.append(att)

    def _after_failure(
        self,
        rec: TaskRecord,
        pool: PoolState,
        now: float,
        message: str,
        permanent: bool,
        retry_after: float | None,
        outcome: str,
    ) -> None:
        if permanent:
            self._finish(rec, FAILED, now, message)
            return
        policy = rec.retry or pool.retry or DEFAULT_RETRY
        if rec.attempt >= policy.max_attempts:
            self._finish(rec, DEAD_LETTERED, now, message)
            return
        delay = policy.backoff(rec.attempt + 1)
        if policy.jitter and delay > 0.0:
            delay = self.rng.uniform(0.0, delay)
        if retry_after is not None and retry_after > delay:
            delay = retry_after
        self.totals["retries"] += 1
        pool.stats.on_retry(now)
        pool.pending_by_class[rec.cls] += 1
        pool.retrying_by_class[rec.cls] += 1
        self._remember(rec, now, outcome, message)
        rec.message = message
        rec.ready_at = now + delay  # when it will be ready again (a store keeps it)
        self._move(rec, RETRYING, now, message)
        self.timers.set(rec.ready_at, self._on_retry, rec, rec.attempt)

    @staticmethod
    def _remember(rec: TaskRecord, now: float, outcome: str, message: str) -> None:
        """Keep the attempt that just ended in the task's history (TaskRecord.past_attempts):
        only a task that retries pays for it, with its Extras and a list of at most
        HISTORY_MAX tuples."""
        extra = rec.extra
        if extra is None:
            extra = rec.extra = Extras()
        history = extra.history
        if history is None:
            history = extra.history = []
        elif len(history) == HISTORY_MAX:
            del history[0]
        history.append(PastAttempt(rec.attempt, rec.started_at, now, outcome, message))

    # --- cancellation --------------------------------------------------------------------

    def cancel(self, ref: int | str, now: float) -> bool:
        """Cancel a live task in any state; False if it is unknown or already terminal."""
        rec = self.lookup(ref)
        if rec is None or rec.status >= FIRST_TERMINAL:
            return False
        pool = self.pools[rec.pool]
        if rec.status == RUNNING:
            if rec.running is not None:  # None after abort_running() at shutdown
                self._abort(rec.running, pool, now, ABORT_CANCELLED)
        elif rec.status == READY and not (rec.extra is not None and rec.extra.due):
            unqueue(rec, pool)  # due tasks are not queued
        self._finish(rec, CANCELLED, now, MSG_CANCELLED)
        return True

    # --- capacity ------------------------------------------------------------------------

    def set_capacity(self, pool_name: str, n: int, now: float) -> None:
        """Set the pool's unlabeled slots (worker groups keep theirs)."""
        pool = self.pools[pool_name]
        capacity = n + (pool.groups.total() if pool.groups is not None else 0)
        pool.stats.level(now, pool.busy, capacity)
        pool.unlabeled = n
        pool.capacity = capacity
        self._reoffer_if_resources()  # new slots for tasks waiting on a resource

    def set_group_capacity(
        self, pool_name: str, labels: dict[str, str], n: int, now: float
    ) -> None:
        """Declare or resize the worker group carrying exactly `labels` (0 removes its slots)."""
        pool = self.pools[pool_name]
        groups = pool.groups or make_groups(pool)
        g = groups.set(labels, n)
        capacity = pool.unlabeled + groups.total()
        pool.stats.level(now, pool.busy, capacity)
        pool.capacity = capacity
        self.parking.unpark_labeled(pool, g)
        self._reoffer_if_resources()

    def _reoffer_if_resources(self) -> None:
        if self.resources:
            self.parking.reoffer = True

    # --- timer handlers ------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Fire every timer due at or before `now` and prune expired retained tasks."""
        self.timers.fire(now)
        self._prune(now)

    def _on_retry(self, rec: TaskRecord, attempt: int, when: float, now: float) -> None:
        if rec.status == RETRYING and rec.attempt == attempt:
            pool = self.pools[rec.pool]
            pool.retrying_by_class[rec.cls] -= 1
            self._make_ready(rec, pool, now)

    def _on_timeout(self, att: Attempt, tag: int, when: float, now: float) -> None:
        if not att.ended:
            pool = self.pools[att.task.pool]
            self.totals["timeouts"] += 1
            self._abort(att, pool, now, ABORT_TIMEOUT)
            self._after_failure(att.task, pool, now, ABORT_TIMEOUT, False, None, OUTCOME_TIMED_OUT)

    def _on_lease(self, att: Attempt, tag: int, when: float, now: float) -> None:
        if att.ended:
            return
        if att.lease_expiry > now:  # a heartbeat extended it
            self.timers.set(att.lease_expiry, self._on_lease, att)
            return
        pool = self.pools[att.task.pool]
        self.totals["lease_expiries"] += 1
        self._abort(att, pool, now, ABORT_LEASE)
        self._after_failure(att.task, pool, now, ABORT_LEASE, False, None, OUTCOME_LEASE_EXPIRED)

    def _on_scale(self, pool: PoolState, tag: int, when: float, now: float) -> None:
        new = pool.evaluate_scaler(now, self.elastic)
        if self.elastic and new != pool.unlabeled:
            self.set_capacity(pool.name, new, now)
        scaler = pool.scaler
        assert scaler is not None
        self.timers.set(scaler.next_eval, self._on_scale, pool)

    # --- terminal states and retention ---------------------------------------------------

    def _finish(self, rec: TaskRecord, status: int, now: float, message: str | None) -> None:
        if rec.status != RUNNING:  # it was pending until now
            pool = self.pools[rec.pool]
            pool.pending_by_class[rec.cls] -= 1
            if rec.status == RETRYING:
                pool.retrying_by_class[rec.cls] -= 1
        self._move(rec, status, now, message)
        rec.message = message
        rec.finished_at = now
        if status == SUCCEEDED:  # an ended task that did not succeed keeps it, to submit again
            rec.payload = None
        self.live -= 1
        self.totals[STATUS_NAMES[status]] += 1
        self.out.finished.append(rec)
        self._retained.append(rec)
        if len(self._retained) > self.retention_max:
            self._forget(self._retained.popleft())
        extra = rec.extra
        if extra is not None:
            extra.resolved = extra.parents = None
            if extra.start_at is not None and not extra.fixed_done:
                self.fixed.drop(rec, extra, self.pools[rec.pool])
            if extra.children:
                self.deps.ended(rec, now)

    def _prune(self, now: float) -> None:
        retained = self._retained
        keep = self.retention
        # Same expression as next_wake(), so a wake-up at that time always prunes.
        while retained and retained[0].finished_at + keep <= now:
            self._forget(retained.popleft())

    def _forget(self, rec: TaskRecord) -> None:
        del self.tasks[rec.id]
        if rec.key is not None and self.keys.get(rec.key) is rec:
            del self.keys[rec.key]

    def _free_key(self, rec: TaskRecord) -> None:
        """The task gives its key up for good (a new task may take it)."""
        if rec.key is not None and self.keys.get(rec.key) is rec:
            del self.keys[rec.key]
        rec.key = None

    # --- the life-cycle table ------------------------------------------------------------

    def _move(self, rec: TaskRecord, new: int, now: float, message: str | None) -> None:
        if new not in TRANSITIONS[rec.status]:  # inline: this runs at every status change
            check_transition(rec, new, TRANSITIONS)
        rec.status = new
        if self.journal is not None:
            self.journal.changed[rec.id] = rec
        level = self.event_level
        if level == EVENTS_ALL or (level == EVENTS_TERMINAL and new >= FIRST_TERMINAL):
            self._event(rec, new, now, message)

    def _event(self, rec: TaskRecord, status: int, now: float, message: str | None) -> None:
        self.out.events.append(
            StatusEvent(rec.id, rec.pool, rec.key, STATUS_NAMES[status], rec.attempt, now, message)
        )

    # --- shutdown ------------------------------------------------------------------------

    def halt(self) -> None:
        """Stop dispatching (shutdown grace); running attempts may still finish."""
        self.dispatching = False

    def abort_running(self, now: float) -> list[Attempt]:
        """End every running attempt without a status change (shutdown after grace)."""
        atts = list(self.running.values())
        for att in atts:
            self._abort(att, self.pools[att.task.pool], now, ABORT_SHUTDOWN)
        return atts

    # --- snapshot ------------------------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        pools = [p.snapshot(now) for p in self._pool_list]
        return Snapshot(
            pools=pools,
            live_tasks=self.live,
            running=len(self.running),
            pending=sum(p.pending for p in pools),
            totals=dict(self.totals),
        )
