"""The tables the engine and its components share, and the transition primitives that change
them: admitting, releasing, making ready, starting, ending and retrying attempts, finishing,
retaining and forgetting tasks.

Every status change goes through `State.move()`, which checks the life-cycle table
(model.TRANSITIONS) and records the event; restore's changes go through `State.reinstate()`
and the restore table (model.RESTORE_TRANSITIONS). The engine and every component (deps.py,
fixed.py, schedules.py, restore.py) hold the same `State` and call these primitives, so none of
them needs the engine. The primitives reach back into the dependency graph and the fixed-start
bookkeeping through the two small interfaces below (`DepsHooks`, `FixedHooks`), which the
engine binds to its components once they exist.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from .actions import Actions, Journal
from .groups import Group
from .model import (
    BLOCKED,
    DEAD_LETTERED,
    DEFAULT_RETRY,
    FAILED,
    FIRST_TERMINAL,
    HISTORY_MAX,
    OUTCOME_ABANDONED,
    OUTCOME_CANCELLED,
    OUTCOME_FAILED,
    OUTCOME_LEASE_EXPIRED,
    OUTCOME_SUCCEEDED,
    OUTCOME_TIMED_OUT,
    READY,
    RESTORE_TRANSITIONS,
    RETRYING,
    RUNNING,
    SCHEDULED,
    STATUS_NAMES,
    SUCCEEDED,
    TOTALS_KEYS,
    TRANSITIONS,
    Attempt,
    Extras,
    Observer,
    PastAttempt,
    PoolConfig,
    Scoring,
    StatusEvent,
    TaskRecord,
    check_transition,
    leave_collector,
)
from .parking import Parking
from .pool import PoolState
from .resources import ResourceConfig, ResourceState
from .timers import Timers

# event_level values
EVENTS_NONE = 0
EVENTS_TERMINAL = 1
EVENTS_ALL = 2

# abort reasons handed to the driver
ABORT_TIMEOUT = "attempt timed out"
ABORT_LEASE = "lease expired"
ABORT_CANCELLED = "cancelled"
ABORT_SHUTDOWN = "scheduler shut down"
# the outcome an observer is told of an aborted attempt (model.ATTEMPT_OUTCOMES)
_ABORT_OUTCOMES = {
    ABORT_TIMEOUT: OUTCOME_TIMED_OUT,
    ABORT_LEASE: OUTCOME_LEASE_EXPIRED,
    ABORT_CANCELLED: OUTCOME_CANCELLED,
    ABORT_SHUTDOWN: OUTCOME_ABANDONED,
}


class DepsHooks(Protocol):
    """What the primitives need of the dependency graph (deps.Dependencies)."""

    awaiting: dict[str, list[tuple[TaskRecord, str]]]

    def key_admitted(self, rec: TaskRecord, key: str) -> None: ...

    def attach(self, rec: TaskRecord, extra: Extras, pool: PoolState, now: float) -> None: ...

    def ended(self, rec: TaskRecord, now: float) -> None: ...


class FixedHooks(Protocol):
    """What the primitives need of the fixed-start bookkeeping (fixed.FixedStarts)."""

    def arrive(self, rec: TaskRecord, extra: Extras, pool: PoolState, now: float) -> None: ...

    def drop(self, rec: TaskRecord, extra: Extras, pool: PoolState) -> None: ...


class State:
    """The engine's tables and the primitives every status change goes through (see the module
    docstring). `deps` and `fixed` are bound by the engine right after construction."""

    deps: DepsHooks
    fixed: FixedHooks

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        resources: Sequence[ResourceConfig],
        now: float,
        *,
        rng: random.Random,
        scoring: Scoring,
        event_level: int,
        retention_max: int,
        first_id: int,
        attempt_class: type[Attempt],
        journal: bool,
    ) -> None:
        if not pools:
            raise ValueError("at least one pool is required")
        self.resources: dict[str, ResourceState] = {}
        for rc in resources:
            if rc.name in self.resources:
                raise ValueError(f"duplicate resource name {rc.name!r}")
            self.resources[rc.name] = ResourceState(rc, now)
        self.pools: dict[str, PoolState] = {}
        for cfg in pools:
            if cfg.name in self.pools:
                raise ValueError(f"duplicate pool name {cfg.name!r}")
            self.pools[cfg.name] = PoolState(cfg, scoring, now)
        self.pool_list = list(self.pools.values())
        self.rng = rng
        self.event_level = event_level
        self.retention_max = retention_max
        self.attempt_class = attempt_class
        self.tasks: dict[int, TaskRecord] = {}
        self.keys: dict[str, TaskRecord] = {}
        self.running: dict[int, Attempt] = {}
        self.live = 0
        self.totals: dict[str, int] = dict.fromkeys(TOTALS_KEYS, 0)
        self.out = Actions()
        self.journal: Journal | None = Journal() if journal else None
        self.retained: deque[TaskRecord] = deque()  # ended tasks, oldest first
        self.timers = Timers()
        self._timeout = self.timers.handler(self._on_timeout)
        self._lease_due = self.timers.handler(self._on_lease)
        self._retry = self.timers.handler(self._on_retry)
        self.parking = Parking(self.pools, self.resources, self.timers)
        self.next_id = first_id
        self.ids: list[int] | None = None  # task ids in order, built by Engine.page()
        self.seq = 0
        self.lease = 0

    # --- admission -------------------------------------------------------------------------

    def assign_id(self, rec: TaskRecord) -> None:
        rec.id = self.next_id
        self.next_id += 1
        if self.ids is not None:
            self.ids.append(rec.id)
        self.seq += 1
        rec.seq = self.seq

    def admit(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        if not rec.id:
            self.assign_id(rec)
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
            self.event(rec, BLOCKED, now, None)
        if key is not None and key in self.deps.awaiting:
            self.deps.key_admitted(rec, key)
        if extra is None or not (fixed or extra.resolved is not None):
            if not rec.eligible_at:  # a restored task keeps its place in the queue
                rec.eligible_at = now
            self.make_ready(rec, pool, now)
            return
        pool.unready_by_class[rec.cls] += 1  # until make_ready, fixed.make_due or finish
        if fixed:
            pool.reservations[rec] = pool.reservation(rec)
        self.deps.attach(rec, extra, pool, now)

    def resolve_resources(self, extra: Extras) -> None:
        """Keep the checked (resource, amount) pairs dispatch and release use (SubmitError)."""
        if extra.resources:
            extra.wanted = self.parking.resolve(extra.resources)

    def release(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        """Every dependency of a blocked task is satisfied: it may run (or wait for its start)."""
        extra = rec.extra
        if extra is not None:
            extra.resolved = extra.parents = None
            if extra.start_at is not None:
                self.fixed.arrive(rec, extra, pool, now)
                return
        pool.unready_by_class[rec.cls] -= 1
        if not rec.eligible_at:
            rec.eligible_at = now
        self.make_ready(rec, pool, now)

    def make_ready(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        self.move(rec, READY, now, None)
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

    # --- attempts ----------------------------------------------------------------------------

    def start(
        self, rec: TaskRecord, pool: PoolState, now: float, adherent: bool, slot: Group | None
    ) -> None:
        pool.busy += 1
        pool.pending_by_class[rec.cls] -= 1
        n = rec.attempt = rec.attempt + 1
        self.lease += 1
        ttl = pool.lease_ttl
        att = self.attempt_class(rec, n, self.lease, now, ttl)
        if pool.groups is not None:
            att.slot = slot
            pool.groups.occupy(slot)
        rec.running = att
        rec.started_at = now
        rec.worker = None  # until the driver gives the attempt to a worker
        self.running[att.lease] = att
        self.move(rec, RUNNING, now, None)
        self.totals["dispatched"] += 1
        pool.stats.on_dispatch(now, now - rec.ready_at, adherent)
        if rec.timeout is not None:  # (by lease id: the entry must not keep the attempt alive)
            self.timers.set(now + rec.timeout, self._timeout, None, att.lease)
        if ttl is not None:
            self.timers.set(att.lease_expiry, self._lease_due, None, att.lease)
        self.out.starts.append(att)

    def end_attempt(self, att: Attempt, pool: PoolState, now: float, success: bool) -> float:
        """Free the attempt's slot and resources; returns its runtime."""
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

    def abort(self, att: Attempt, pool: PoolState, now: float, reason: str) -> None:
        att.abort_reason = reason  # first: an ObservedState's end_attempt reads it
        self.end_attempt(att, pool, now, False)
        self.out.aborts.append(att)

    def reoffer_if_resources(self) -> None:
        if self.resources:
            self.parking.reoffer = True

    def after_failure(
        self,
        rec: TaskRecord,
        pool: PoolState,
        now: float,
        message: str,
        permanent: bool,
        retry_after: float | None,
        outcome: str,
    ) -> None:
        """An attempt ended badly: the task fails, is dead-lettered or retries after backoff."""
        if permanent:
            self.finish(rec, FAILED, now, message)
            return
        policy = rec.retry or pool.retry or DEFAULT_RETRY
        if rec.attempt >= policy.max_attempts:
            self.finish(rec, DEAD_LETTERED, now, message)
            return
        delay = policy.backoff(rec.attempt + 1)
        if policy.jitter and delay > 0.0:
            delay = self.rng.uniform(0.0, delay)
        if retry_after is not None and retry_after > delay:
            delay = retry_after
        self.totals["retries"] += 1
        pool.retries += 1
        pool.stats.on_retry(now)
        pool.pending_by_class[rec.cls] += 1
        pool.retrying_by_class[rec.cls] += 1
        _remember(rec, now, outcome, message)
        rec.message = message
        rec.ready_at = now + delay  # when it will be ready again (a store keeps it)
        self.move(rec, RETRYING, now, message)
        self.timers.set(rec.ready_at, self._retry, rec, rec.attempt)

    def _on_retry(self, rec: TaskRecord, attempt: int, when: float, now: float) -> None:
        if rec.status == RETRYING and rec.attempt == attempt:
            pool = self.pools[rec.pool]
            pool.retrying_by_class[rec.cls] -= 1
            self.make_ready(rec, pool, now)

    def _on_timeout(self, _: None, lease: int, when: float, now: float) -> None:
        att = self.running.get(lease)  # None: the attempt has ended
        if att is not None:
            pool = self.pools[att.task.pool]
            self.totals["timeouts"] += 1
            self.abort(att, pool, now, ABORT_TIMEOUT)
            self.after_failure(att.task, pool, now, ABORT_TIMEOUT, False, None, OUTCOME_TIMED_OUT)

    def _on_lease(self, _: None, lease: int, when: float, now: float) -> None:
        att = self.running.get(lease)
        if att is None:  # it has ended
            return
        if att.lease_expiry > now:  # a heartbeat extended it
            self.timers.set(att.lease_expiry, self._lease_due, None, lease)
            return
        pool = self.pools[att.task.pool]
        self.totals["lease_expiries"] += 1
        self.abort(att, pool, now, ABORT_LEASE)
        self.after_failure(att.task, pool, now, ABORT_LEASE, False, None, OUTCOME_LEASE_EXPIRED)

    # --- terminal states and retention -----------------------------------------------------

    def finish(self, rec: TaskRecord, status: int, now: float, message: str | None) -> None:
        if rec.status != RUNNING:  # it was pending until now
            pool = self.pools[rec.pool]
            pool.pending_by_class[rec.cls] -= 1
            if rec.status == RETRYING:
                pool.retrying_by_class[rec.cls] -= 1
            elif rec.status == BLOCKED or rec.status == SCHEDULED:
                pool.unready_by_class[rec.cls] -= 1
        self.move(rec, status, now, message)
        rec.message = message
        rec.finished_at = now
        if status == SUCCEEDED:  # an ended task that did not succeed keeps it, to submit again
            rec.payload = None
        elif status == DEAD_LETTERED:
            self.pools[rec.pool].dead_lettered += 1
        self.live -= 1
        self.totals[STATUS_NAMES[status]] += 1
        self.out.finished.append(rec)
        self.retained.append(rec)
        if len(self.retained) > self.retention_max:
            self.forget(self.retained.popleft())
        extra = rec.extra
        if extra is not None:
            extra.resolved = extra.parents = None
            if extra.start_at is not None and not extra.fixed_done:
                self.fixed.drop(rec, extra, self.pools[rec.pool])
            if extra.children:
                self.deps.ended(rec, now)
        else:
            leave_collector(rec)

    def retain(self, rec: TaskRecord) -> None:
        """Keep an ended task a store gave back (lookups, results, key deduplication)."""
        self._index(rec)
        self.retained.append(rec)
        leave_collector(rec)

    def forget(self, rec: TaskRecord) -> None:
        """Drop an ended task from memory. One deleted from the history before (Engine.delete)
        is gone already and still queued in `retained`: nothing is left to drop."""
        if self.tasks.get(rec.id) is not rec:
            return
        del self.tasks[rec.id]
        if rec.key is not None and self.keys.get(rec.key) is rec:
            del self.keys[rec.key]

    def free_key(self, rec: TaskRecord) -> None:
        """The task gives its key up for good (a new task may take it)."""
        if rec.key is not None and self.keys.get(rec.key) is rec:
            del self.keys[rec.key]
        rec.key = None

    # --- restore ---------------------------------------------------------------------------

    def reinstate(self, rec: TaskRecord, status: int, journal: bool) -> None:
        """Restore's status change (model.RESTORE_TRANSITIONS), written back if `journal`."""
        check_transition(rec, status, RESTORE_TRANSITIONS)
        rec.status = status
        if journal and self.journal is not None:
            self.journal.changed[rec.id] = rec

    def resume_retry(self, rec: TaskRecord, pool: PoolState) -> None:
        """Take back a restored retrying task: it retries at its `ready_at`."""
        self._index(rec)
        self.live += 1
        pool.pending_by_class[rec.cls] += 1
        pool.retrying_by_class[rec.cls] += 1
        self.timers.set(rec.ready_at, self._retry, rec, rec.attempt)

    def _index(self, rec: TaskRecord) -> None:
        """Make a restored task findable by id and key (admit does it inline for new ones)."""
        self.tasks[rec.id] = rec
        if rec.key is not None:
            self.keys[rec.key] = rec

    def restart_counts(self, retried: dict[str, int]) -> None:
        """After restore, totals and arrivals count only what happens from here, but for the
        lost attempts restore retried (`retried`: how many, by pool)."""
        self.totals.update(dict.fromkeys(TOTALS_KEYS, 0), retries=sum(retried.values()))
        for pool in self.pools.values():
            pool.arrivals = pool.dead_lettered = 0
            pool.retries = retried.get(pool.name, 0)
        if self.journal is not None:
            self.journal.added.clear()  # their rows exist

    # --- the life-cycle table --------------------------------------------------------------

    def move(self, rec: TaskRecord, new: int, now: float, message: str | None) -> None:
        if new not in TRANSITIONS[rec.status]:  # inline: this runs at every status change
            check_transition(rec, new, TRANSITIONS)
        rec.status = new
        if self.journal is not None:
            self.journal.changed[rec.id] = rec
        level = self.event_level
        if level == EVENTS_ALL or (level == EVENTS_TERMINAL and new >= FIRST_TERMINAL):
            self.event(rec, new, now, message)

    def event(self, rec: TaskRecord, status: int, now: float, message: str | None) -> None:
        self.out.events.append(
            StatusEvent(rec.id, rec.pool, rec.key, STATUS_NAMES[status], rec.attempt, now, message)
        )


class ObservedState(State):
    """A State that tells an observer (model.Observer) of every attempt's start and end: the
    engine's State when it is given one. Overriding the two primitives, rather than testing
    for an observer inside them, leaves the path of an engine nobody observes as it was."""

    def __init__(self, *args: Any, observer: Observer, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.observer = observer

    def start(
        self, rec: TaskRecord, pool: PoolState, now: float, adherent: bool, slot: Group | None
    ) -> None:
        super().start(rec, pool, now, adherent, slot)
        att = rec.running
        assert att is not None  # the attempt just started
        self.observer.started(att, now - rec.ready_at)

    def end_attempt(self, att: Attempt, pool: PoolState, now: float, success: bool) -> float:
        runtime = super().end_attempt(att, pool, now, success)
        self.observer.ended(att, attempt_outcome(att, success), runtime)
        return runtime


def attempt_outcome(att: Attempt, success: bool) -> str:
    """How an ended attempt ended (one of model.ATTEMPT_OUTCOMES): its abort's reason, else
    whether its executor succeeded."""
    reason = att.abort_reason
    if reason is not None:
        return _ABORT_OUTCOMES.get(reason, OUTCOME_ABANDONED)
    return OUTCOME_SUCCEEDED if success else OUTCOME_FAILED


def _remember(rec: TaskRecord, now: float, outcome: str, message: str) -> None:
    """Keep the attempt that just ended in the task's history (TaskRecord.past_attempts): only
    a task that retries pays for it, with its Extras and a list of at most HISTORY_MAX tuples."""
    extra = rec.extra
    if extra is None:
        extra = rec.extra = Extras()
    history = extra.history
    if history is None:
        history = extra.history = []
    elif len(history) == HISTORY_MAX:
        del history[0]
    history.append(PastAttempt(rec.attempt, rec.started_at, now, outcome, message, rec.worker))
