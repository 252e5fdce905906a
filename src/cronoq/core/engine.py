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

This module is the driver interface: admission checks (overflow, batches), outcomes,
cancellation, capacity, retention and the read-only views. The tables and the transition
primitives every status change goes through (admit, release, start, end an attempt, retry,
finish) are in `state.py`, shared with the components around it, each in its own module with
its state: `deps.py` (dependencies), `fixed.py` (fixed starts and reservations), `parking.py`
(resources and worker-group slots), `schedules.py` (recurring schedules), `dispatch.py`
(filling free slots), `restore.py` (what a store kept); `pool.py` holds a pool's state. None of
them imports this module.

Every status change goes through `State.move()`, which checks the life-cycle table in model.py
and records the event; an illegal change raises `IllegalTransition` (a bug, caught by the
simulation tests). Restore is the one other way a status changes, and it goes through the table
of restore transitions (model.RESTORE_TRANSITIONS). Attempts end exactly once
(`Attempt.ended`); an outcome reported for an attempt that already ended (aborted by timeout,
lease loss or cancellation) is counted in `stale_completions` and changes nothing.

Determinism: the same calls with the same times and the same seeded `random.Random` give the
same decisions. Jitter is the only use of randomness.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from ..errors import SubmitError
from .actions import Actions, Journal
from .deps import Dependencies, parents_first
from .dispatch import fill
from .fixed import FixedStarts
from .groups import LabelKey
from .model import (
    CANCELLED,
    FIRST_TERMINAL,
    OUTCOME_FAILED,
    READY,
    RUNNING,
    SHED,
    SUCCEEDED,
    Attempt,
    Extras,
    Observer,
    PoolConfig,
    ReadyView,
    Scoring,
    Snapshot,
    TaskRecord,
)
from .parking import Wanted, make_groups, unqueue
from .pool import EWMA_ALPHA, PoolState
from .recurring import Recurring
from .resources import ResourceConfig
from .restore import restore
from .schedules import Schedules
from .state import (
    ABORT_CANCELLED,
    ABORT_LEASE,
    ABORT_SHUTDOWN,
    ABORT_TIMEOUT,
    EVENTS_ALL,
    EVENTS_NONE,
    EVENTS_TERMINAL,
    ObservedState,
    State,
)

__all__ = [
    "ABORT_CANCELLED",
    "ABORT_LEASE",
    "ABORT_SHUTDOWN",
    "ABORT_TIMEOUT",
    "DEFAULT_RETENTION",
    "DEFAULT_RETENTION_MAX",
    "EVENTS_ALL",
    "EVENTS_NONE",
    "EVENTS_TERMINAL",
    "MSG_CANCELLED",
    "MSG_SHED",
    "Engine",
]


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
        observer: Observer | None = None,
    ) -> None:
        """`elastic=False`: capacity comes from outside (remote workers' grants); the
        autoscaler then only computes `desired`, for external scalers to act on.
        `journal=True`: keep a Journal of what changed, for a driver with a store.
        `observer`: told of every attempt's start (its wait for a slot) and end (its runtime
        and outcome), see model.Observer; with None (the default) the engine's State is the
        plain one, whose start and end of an attempt test for no observer."""
        self.scoring = scoring or Scoring()
        kw = {} if observer is None else {"observer": observer}
        st = self._st = (State if observer is None else ObservedState)(
            pools,
            resources,
            now,
            rng=rng or random.Random(0),
            scoring=self.scoring,
            event_level=event_level,
            retention_max=retention_max,
            first_id=first_id,
            attempt_class=attempt_class,
            journal=journal,
            **kw,
        )
        # The shared tables, under the names drivers and tests read them by.
        self.rng = st.rng
        self.resources = st.resources
        self.pools = st.pools
        self.tasks = st.tasks
        self.keys = st.keys
        self.running = st.running
        self.totals = st.totals
        self.timers = st.timers
        self.parking = st.parking
        self.configs: Mapping[str, PoolConfig] = MappingProxyType({c.name: c for c in pools})
        self._bounded = any(p.cfg.max_pending is not None for p in st.pool_list)
        self.emit_transitions = emit_transitions
        self.retention = retention
        self.started_at = now
        self.elastic = elastic
        self.dispatching = True
        self.deps = st.deps = Dependencies(st)
        self.fixed = st.fixed = FixedStarts(st)
        self.schedules = Schedules(st, self.submit, self.cancel)
        self._scale = self.timers.handler(self._on_scale)
        for pool in st.pool_list:
            if pool.scaler is not None:  # the first evaluation happens at start
                self.timers.set(pool.scaler.next_eval, self._scale, pool)

    @property
    def event_level(self) -> int:
        """Which status changes become events (EVENTS_*); a driver may change it any time."""
        return self._st.event_level

    @event_level.setter
    def event_level(self, level: int) -> None:
        self._st.event_level = level

    @property
    def live(self) -> int:
        """Tasks not ended yet."""
        return self._st.live

    @property
    def journal(self) -> Journal | None:
        """What changed since the last take_journal() (journal=True); read only for drivers."""
        return self._st.journal

    # --- driver interface ----------------------------------------------------------------

    def take(self) -> Actions:
        """Hand the accumulated actions to the driver and start a fresh outbox."""
        out = self._st.out
        self._st.out = Actions()
        return out

    def finished_since_take(self) -> list[TaskRecord]:
        """The tasks that ended since the last take() (a driver may resolve waiters early)."""
        return self._st.out.finished

    def take_journal(self) -> Journal:
        """Hand what changed since the last call to a driver with a store (journal=True)."""
        journal = self._st.journal
        assert journal is not None, "the engine keeps no journal (journal=False)"
        self._st.journal = Journal()
        return journal

    def next_wake(self) -> float | None:
        """When the driver must call `advance()` next (None: only when something happens)."""
        t = self.timers.next_time()
        retained = self._st.retained
        if retained:
            r = retained[0].finished_at + self.retention
            if t is None or r < t:
                t = r
        return t

    @property
    def next_id(self) -> int:
        """The id the next admitted task will get."""
        return self._st.next_id

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

    def id_index(self) -> list[int]:
        """The ids of the held tasks, ascending, for readers that walk them in order (pages,
        searches): built at the first call and kept up to date from then on, it may still name
        forgotten tasks (look each one up), at most about as many as it holds."""
        ids = self._st.ids
        tasks = self.tasks
        if ids is None or len(ids) > 2 * len(tasks) + 1024:  # drop the ids of forgotten tasks
            ids = self._st.ids = sorted(tasks)
        return ids

    def page(
        self, after: int, limit: int, match: Callable[[TaskRecord], bool] | None = None
    ) -> tuple[list[TaskRecord], bool]:
        """Up to `limit` live or retained tasks with ids above `after` that `match` accepts, in
        id order, and whether more follow. O(log n + tasks looked at): the id index is built
        at the first call and kept from then on (a driver that never pages pays nothing)."""
        ids = self.id_index()
        tasks = self.tasks
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
        return sum(p.pending() for p in self._st.pool_list)

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
        restore(self._st, self.deps, recs, now, broken or {})
        self._st.ids = None  # restored ids come in any order: page() sorts them again

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
        self._st.admit(rec, pool, now)
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
                self._st.assign_id(rec)
        pools = self.pools
        admit = self._st.admit
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
            self._st.resolve_resources(extra)
        if extra.start_at is not None:
            self.fixed.check_reservation(rec, pool)
        if extra.deps is not None:
            self.deps.resolve(rec, extra, batch)

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
        self._st.finish(victim, SHED, now, MSG_SHED)

    # --- recurring schedules ---------------------------------------------------------------

    def add_recurring(self, sched: Recurring, now: float) -> None:
        """Add or replace a schedule by name (core/schedules.py)."""
        self.schedules.add(sched, now)

    def resume_recurring(
        self, sched: Recurring, next_time: float | None, last_id: int | None, now: float
    ) -> None:
        """Take back a stored schedule after restore (core/schedules.py)."""
        self.schedules.resume(sched, next_time, last_id, now)

    def remove_recurring(self, name: str, now: float) -> bool:
        """Drop a schedule and cancel its occurrences not started yet (core/schedules.py)."""
        return self.schedules.remove(name, now)

    # --- dispatch ------------------------------------------------------------------------

    def dispatch(self, now: float) -> None:
        """Start the best ready tasks on every free slot."""
        if not self.dispatching:
            return
        fill(self._st, self.fixed, now)
        # Recurring occurrences are created after the previous one has taken its slot, so its
        # reservation no longer counts against the next.
        if self.schedules.create_due(now):
            fill(self._st, self.fixed, now)

    # --- outcomes ------------------------------------------------------------------------

    def complete(self, att: Attempt, now: float, output: object = None) -> bool:
        """The attempt's executor returned `output`. False if the attempt had already ended."""
        if att.ended:
            self.totals["stale_completions"] += 1
            return False
        rec = att.task
        pool = self.pools[rec.pool]
        runtime = self._st.end_attempt(att, pool, now, True)
        # The learned expected durations (inline: this runs once per task).
        d = pool.durations.get(rec.kind)
        pool.durations[rec.kind] = runtime if d is None else d + EWMA_ALPHA * (runtime - d)
        d = pool.learned
        pool.learned = runtime if d is None else d + EWMA_ALPHA * (runtime - d)
        rec.output = output
        self._st.finish(rec, SUCCEEDED, now, None)
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
        self._st.end_attempt(att, pool, now, False)
        self._st.after_failure(att.task, pool, now, message, permanent, retry_after, OUTCOME_FAILED)
        return True

    def move_attempt(self, att: Attempt, labels: Mapping[str, str]) -> None:
        """A running attempt changed slots: a remote worker of another label set took it over
        (a hand-back). Keeps the worker groups' busy counts right."""
        groups = self.pools[att.task.pool].groups
        if groups is None:  # no labeled slots at all: every slot is alike
            return
        slot = groups.by_key.get(frozenset(labels.items())) if labels else None
        # Onto the new slot first: a move within a group without slots must not drop it.
        groups.occupy(slot)
        groups.vacate(att.slot)
        att.slot = slot

    def heartbeat(self, att: Attempt, now: float) -> bool:
        """Extend the attempt's lease; False if it already ended."""
        return att.extend(now)

    # --- cancellation --------------------------------------------------------------------

    def cancel(self, ref: int | str, now: float) -> bool:
        """Cancel a live task in any state; False if it is unknown or already terminal."""
        rec = self.lookup(ref)
        if rec is None or rec.status >= FIRST_TERMINAL:
            return False
        pool = self.pools[rec.pool]
        if rec.status == RUNNING:
            if rec.running is not None:  # None after abort_running() at shutdown
                self._st.abort(rec.running, pool, now, ABORT_CANCELLED)
        elif rec.status == READY and not (rec.extra is not None and rec.extra.due):
            unqueue(rec, pool)  # due tasks are not queued
        self._st.finish(rec, CANCELLED, now, MSG_CANCELLED)
        return True

    # --- operator controls ---------------------------------------------------------------

    def pause(self, pool_name: str, now: float) -> bool:
        """Start nothing new in the pool (submits are still admitted, running attempts go
        on) until `resume`; False if it was paused already. Timers keep firing: a fixed start
        that passes its tolerance meanwhile is missed as usual."""
        return self._set_paused(self.pools[pool_name], True)

    def resume(self, pool_name: str, now: float) -> bool:
        """Let the pool start tasks again (the driver dispatches next); False if it was not
        paused."""
        if not self._set_paused(self.pools[pool_name], False):
            return False
        self._st.reoffer_if_resources()  # its parked tasks may take what others left free
        return True

    def _set_paused(self, pool: PoolState, paused: bool) -> bool:
        if pool.paused == paused:
            return False
        pool.paused = paused
        journal = self._st.journal
        if journal is not None:
            journal.pools[pool.name] = paused
        return True

    def delete(self, recs: Iterable[TaskRecord]) -> list[TaskRecord]:
        """Forget ended tasks now rather than at the end of their retention (an operator's
        clean-up); returns those deleted. Skipped: live tasks, tasks no longer held, and
        ended tasks that a live task names as a dependency (it needs their outcome, also
        after a restart)."""
        st = self._st
        needed = self._depended_on()
        out = []
        for rec in recs:
            if rec.status < FIRST_TERMINAL or st.tasks.get(rec.id) is not rec:
                continue
            if rec.id in needed or (rec.key is not None and rec.key in needed):
                continue
            st.forget(rec)
            out.append(rec)
        if out:
            if st.journal is not None:
                st.journal.deleted.extend(rec.id for rec in out)
            retained = st.retained
            if len(retained) > 2 * len(st.tasks) + 1024:  # drop the deleted ones it still holds
                st.retained = type(retained)(r for r in retained if st.tasks.get(r.id) is r)
        return out

    def _depended_on(self) -> set[int | str]:
        """The ids and keys live tasks name as dependencies: a scan of the live tasks with
        options, which only a deletion pays for."""
        out: set[int | str] = set()
        for rec in self.tasks.values():
            extra = rec.extra
            if rec.status < FIRST_TERMINAL and extra is not None and extra.deps is not None:
                out.update(target for target, _ in extra.deps)
        return out

    # --- capacity ------------------------------------------------------------------------

    def set_capacity(self, pool_name: str, n: int, now: float) -> None:
        """Set the pool's unlabeled slots (worker groups keep theirs)."""
        pool = self.pools[pool_name]
        capacity = n + (pool.groups.total() if pool.groups is not None else 0)
        pool.stats.level(now, pool.busy, capacity)
        pool.unlabeled = n
        pool.capacity = capacity
        self._st.reoffer_if_resources()  # new slots for tasks waiting on a resource

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
        self._st.reoffer_if_resources()

    # --- timer handlers ------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Fire every timer due at or before `now` and prune expired retained tasks."""
        self.timers.fire(now)
        self._prune(now)

    def _on_scale(self, pool: PoolState, tag: int, when: float, now: float) -> None:
        new = pool.evaluate_scaler(now, self.elastic)
        if self.elastic and new != pool.unlabeled:
            self.set_capacity(pool.name, new, now)
        scaler = pool.scaler
        assert scaler is not None
        self.timers.set(scaler.next_eval, self._scale, pool)

    # --- retention --------------------------------------------------------------------------

    def _prune(self, now: float) -> None:
        retained = self._st.retained
        keep = self.retention
        # Same expression as next_wake(), so a wake-up at that time always prunes.
        while retained and retained[0].finished_at + keep <= now:
            self._st.forget(retained.popleft())

    # --- shutdown ------------------------------------------------------------------------

    def halt(self) -> None:
        """Stop dispatching (shutdown grace); running attempts may still finish."""
        self.dispatching = False

    def abort_running(self, now: float) -> list[Attempt]:
        """End every running attempt without a status change (shutdown after grace)."""
        atts = list(self.running.values())
        for att in atts:
            self._st.abort(att, self.pools[att.task.pool], now, ABORT_SHUTDOWN)
        return atts

    # --- snapshot ------------------------------------------------------------------------

    def ready_view(self) -> list[ReadyView]:
        """Each pool's ready tasks per class, the `ready_at` of the first in line and its
        retry and dead-letter counts (model.ReadyView), in configuration order: O(pools x
        classes) plus the due fixed starts, for a metrics scrape."""
        return [p.ready_view() for p in self._st.pool_list]

    def snapshot(self, now: float) -> Snapshot:
        pools = [p.snapshot(now) for p in self._st.pool_list]
        return Snapshot(
            pools=pools,
            live_tasks=self.live,
            running=len(self.running),
            pending=sum(p.pending for p in pools),
            totals=dict(self.totals),
        )
