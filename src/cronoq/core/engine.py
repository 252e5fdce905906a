"""The engine core: every scheduling rule of cronoq, with no I/O and no clock.

Theory of operation
-------------------
The engine is a plain object that a *driver* (the asyncio Scheduler, later the server's
remote-worker runtime and the stores) calls with the current time. It never reads a clock,
never sleeps and never starts anything itself. Each call changes the state and appends what the
driver must do to `engine.out` (an `Actions`):

* `starts`   attempts to run now (the driver runs the executor / sends a lease),
* `aborts`   attempts the engine has given up on (cancel the executor / abort the lease),
* `finished` tasks that reached a terminal status (resolve waiters, persist),
* `events`   `StatusEvent`s, recorded only when `event_level` asks for them.

The driver calls `advance(now)` to fire due timers (retry backoff, attempt timeout, lease expiry,
retention), `dispatch(now)` to fill free slots, drains `out` with `take()`, and calls back at
`next_wake()`: one timer for the whole engine, never one per task.

Every status change goes through `_move()`, which checks the life-cycle table in model.py and
records the event; an illegal change raises `IllegalTransition` (a bug, caught by the simulation
tests). Attempts end exactly once (`Attempt.ended`); an outcome reported for an attempt that
already ended (aborted by timeout, lease loss or cancellation) is counted in
`stale_completions` and changes nothing.

Determinism: the same calls with the same times and the same seeded `random.Random` give the
same decisions. Jitter is the only use of randomness.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from heapq import heappop, heappush
from typing import Any

from ..errors import SubmitError
from .autoscale import Autoscaler
from .groups import Group, Groups
from .model import (
    BLOCKED,
    CANCELLED,
    DEAD_LETTERED,
    DEFAULT_RETRY,
    FAILED,
    FIRST_TERMINAL,
    MISSED,
    READY,
    RETRYING,
    RUNNING,
    SCHEDULED,
    SHED,
    SKIPPED,
    STATUS_NAMES,
    SUCCEEDED,
    TOTALS_KEYS,
    TRANSITIONS,
    Attempt,
    IllegalTransition,
    PoolConfig,
    PoolSnapshot,
    Scoring,
    Snapshot,
    StatusEvent,
    TaskRecord,
)
from .queue import ReadyQueues
from .recurring import RECURRING_TAG, Recurring, occurrence_key
from .resources import ResourceConfig, ResourceState
from .stats import PoolStats

# A task's resources resolved at submit: (resource, amount) pairs.
Wanted = tuple[tuple[ResourceState, int], ...]
_WANTED_CACHE = 1024  # distinct resource requests remembered

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
MSG_MISSED = "fixed start missed"
MSG_AWAIT_TIMEOUT = "timed out awaiting unknown dependency"

_T_RETRY = 0
_T_TIMEOUT = 1
_T_LEASE = 2
_T_AWAIT = 3
_T_TOKENS = 4
_T_HOLD = 5
_T_START = 6
_T_MISS = 7
_T_SCALE = 8
_T_CRON = 9

MSG_OVERLAP = "previous occurrence still running"
MSG_LOST = "attempt lost in failover; retries exhausted"

DEFAULT_RETENTION = 3600.0
DEFAULT_RETENTION_MAX = 100_000
# Weight of the newest runtime in the learned expected duration of a (pool, kind).
_EWMA_ALPHA = 0.2


class Actions:
    """What the driver must do after a call; see the module docstring."""

    __slots__ = ("aborts", "events", "finished", "starts")

    def __init__(self) -> None:
        self.starts: list[Attempt] = []
        self.aborts: list[Attempt] = []
        self.finished: list[TaskRecord] = []
        self.events: list[StatusEvent] = []

    def __bool__(self) -> bool:
        return bool(self.starts or self.aborts or self.finished or self.events)


class PoolState:
    """Engine-side state of one pool."""

    __slots__ = (
        "arrivals",
        "busy",
        "capacity",
        "cfg",
        "due",
        "durations",
        "groups",
        "holds",
        "learned",
        "lease_ttl",
        "misses",
        "name",
        "pending_by_class",
        "queues",
        "reservation_limit",
        "reservations",
        "retry",
        "retrying_by_class",
        "scaler",
        "stats",
        "unlabeled",
    )

    def __init__(self, cfg: PoolConfig, sc: Scoring, now: float) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.capacity = cfg.capacity  # unlabeled slots + the slots of every worker group
        self.unlabeled = cfg.capacity
        self.groups: Groups | None = None  # made when a group or a labeled task first appears
        self.busy = 0
        self.queues = ReadyQueues(sc, cfg.tenant_weights if cfg.fair_share else None)
        self.pending_by_class = [0, 0, 0, 0]
        self.stats = PoolStats(now, cfg.capacity)
        self.retry = cfg.retry
        self.lease_ttl = cfg.lease_ttl
        self.durations: dict[str, float] = {}
        self.learned: float | None = None  # mean runtime of any kind (fixed-start hold lead)
        # Fixed starts: reserved intervals of tasks not started yet, slots held for them
        # (counted from the hold until dispatch) and tasks at their start time.
        self.reservations: dict[TaskRecord, tuple[float, float]] = {}
        self.reservation_limit = max(1, math.floor(cfg.max * cfg.reservable_fraction))
        self.holds = 0
        self.due: list[tuple[float, int, TaskRecord]] = []
        self.misses: list[TaskRecord] = []  # due tasks whose tolerance ran out (skip/fail)
        # Autoscaling: arrivals since the last evaluation and retrying tasks (backlog signal).
        self.scaler = (
            None if cfg.autoscale is None else Autoscaler(cfg.autoscale, cfg.min, cfg.max, now)
        )
        self.arrivals = 0
        self.retrying_by_class = [0, 0, 0, 0]

    def expected_duration(self, rec: TaskRecord) -> float:
        if rec.duration_hint is not None:
            return rec.duration_hint
        return self.durations.get(rec.kind, self.cfg.default_duration)

    def reservation(self, rec: TaskRecord) -> tuple[float, float]:
        """The interval a fixed-start task reserves: [start - tol, start + duration + tol)."""
        assert rec.extra is not None
        start, tol = rec.extra["start_at"], rec.extra["tolerance"]
        return (start - tol, start + self.expected_duration(rec) + tol)

    def free_for_queue(self) -> int:
        """Slots ready tasks may take: held slots are kept for fixed starts."""
        return self.capacity - self.busy - self.holds


class Journal:
    """What changed since the driver last persisted: tasks admitted (whole rows to write),
    tasks whose status changed, and schedules whose next occurrence moved."""

    __slots__ = ("added", "changed", "schedules")

    def __init__(self) -> None:
        self.added: list[TaskRecord] = []
        self.changed: dict[int, TaskRecord] = {}
        self.schedules: dict[str, Recurring] = {}

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.schedules)


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
    ) -> None:
        """`elastic=False`: capacity comes from outside (remote workers' grants); the
        autoscaler then only computes `desired`, for external scalers to act on."""
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

        self._next_id = first_id
        self._seq = 0
        self._lease = 0
        self._timers: list[tuple[float, int, int, Any, int]] = []
        self._tseq = 0
        self._retained: deque[TaskRecord] = deque()
        # key -> (dependent, condition) edges waiting for a task with that key to be submitted
        self._awaiting: dict[str, list[tuple[TaskRecord, str]]] = {}
        self._cascade: deque[TaskRecord] = deque()
        self._settling = False
        self._in_batch = False
        self._batch_reservations: dict[str, list[tuple[float, float]]] = {}
        self.recurring: dict[str, Recurring] = {}
        self._reoffer = False  # an attempt ended since parked tasks were last offered resources
        self._offered: list[TaskRecord] = []  # put back in a queue by a resource or group
        self._wanted: dict[tuple[tuple[str, int], ...], Wanted] = {}
        self._cron_due: list[Recurring] = []
        self.journal: Journal | None = None  # kept only for a driver with a store
        for pool in self._pool_list:
            if pool.scaler is not None:  # the first evaluation happens at start
                self._timer(pool.scaler.next_eval, _T_SCALE, pool, 0)

    # --- driver interface ----------------------------------------------------------------

    def take(self) -> Actions:
        """Hand the accumulated actions to the driver and start a fresh outbox."""
        out = self.out
        self.out = Actions()
        return out

    def next_wake(self) -> float | None:
        """When the driver must call `advance()` next (None: only when something happens)."""
        t = self._timers[0][0] if self._timers else None
        if self._retained:
            r = self._retained[0].finished_at + self.retention
            if t is None or r < t:
                t = r
        return t

    @property
    def next_id(self) -> int:
        """The id the next admitted task will get."""
        return self._next_id

    def lookup(self, ref: int | str) -> TaskRecord | None:
        """A live or retained task by id (int) or key (str)."""
        if isinstance(ref, str):
            return self.keys.get(ref)
        return self.tasks.get(ref)

    # --- restoring what a store kept ------------------------------------------------------

    def restore(self, recs: Iterable[TaskRecord], now: float) -> None:
        """Take back the tasks a store kept, before anything is submitted.

        Each record carries its stored id, seq, status, attempt, times and `extra` (deps as
        submitted, resources, fixed start); a retrying task's `ready_at` is when it retries.
        Terminal tasks are retained (lookups, results, key deduplication); live ones resume:
        blocked tasks wait for their parents again, scheduled and never-started fixed starts
        arrive again (a start that passed meanwhile follows its on_miss), retrying tasks keep
        their retry time. An attempt that was running when the last holder stopped is counted
        as used: the task runs again with the next attempt number, or is dead-lettered when
        that was its last attempt. Tasks of a pool or resource that no longer exists fail.
        Totals count only what happens from here (the lost attempts included)."""
        ordered = sorted(recs, key=lambda r: r.id)
        for rec in ordered:
            self._seq = max(self._seq, rec.seq)
        done = sorted((r for r in ordered if r.status >= FIRST_TERMINAL), key=_finished_at)
        for rec in done:
            self._retain(rec)
        lost: list[TaskRecord] = []
        for rec in ordered:
            if rec.status < FIRST_TERMINAL:
                problem = self._readmit(rec, now)
                if problem is not None:
                    rec.status, rec.message, rec.finished_at = FAILED, problem, now
                    rec.extra = None
                    self._retain(rec)
                    if self.journal is not None:
                        self.journal.changed[rec.id] = rec
                elif rec.extra is not None and rec.extra.pop("_lost", False):
                    lost.append(rec)
                    if not rec.extra:
                        rec.extra = None
        self.totals = dict.fromkeys(TOTALS_KEYS, 0)
        for pool in self._pool_list:
            pool.arrivals = 0
        for rec in lost:
            pool = self.pools[rec.pool]
            policy = rec.retry or pool.retry or DEFAULT_RETRY
            if rec.attempt >= policy.max_attempts and rec.status == READY:
                if rec.parked is not None:
                    rec.parked = None
                    rec.qgen += 1
                else:
                    pool.queues.discard(rec)
                self._finish(rec, DEAD_LETTERED, now, MSG_LOST)

    def _retain(self, rec: TaskRecord) -> None:
        self.tasks[rec.id] = rec
        if rec.key is not None:
            self.keys[rec.key] = rec
        self._retained.append(rec)

    def _readmit(self, rec: TaskRecord, now: float) -> str | None:
        """Admit one stored live task again; returns why it cannot run, or None."""
        pool = self.pools.get(rec.pool)
        if pool is None:
            return f"pool {rec.pool!r} is no longer configured"
        status, extra = rec.status, rec.extra
        rec.status = BLOCKED
        if extra is not None:
            try:
                self._resolve_resources(extra)
            except SubmitError as e:
                return f"cannot resume: {e.message}"
            started = rec.attempt > 0
            if status != BLOCKED:
                extra.pop("deps", None)  # satisfied before it was stored
            if started:
                extra.pop("start_at", None)  # its fixed start happened: it runs as any task
            if status == RUNNING:
                extra["_lost"] = True
            elif status == RETRYING:
                self._resume_retry(rec, pool)
                return None
            try:
                self._resolve_deps(rec, extra, None)
            except SubmitError as e:
                return f"cannot resume: {e.message}"
            if not extra:
                rec.extra = None
        elif status == RUNNING:
            rec.extra = {"_lost": True}
        elif status == RETRYING:
            self._resume_retry(rec, pool)
            return None
        self._admit(rec, pool, now)
        return None

    def _resume_retry(self, rec: TaskRecord, pool: PoolState) -> None:
        self.tasks[rec.id] = rec
        if rec.key is not None:
            self.keys[rec.key] = rec
        self.live += 1
        pool.pending_by_class[rec.cls] += 1
        pool.retrying_by_class[rec.cls] += 1
        rec.status = RETRYING
        self._timer(rec.ready_at, _T_RETRY, rec, rec.attempt)

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
            self._check(rec, None)
            self._check_await_cycle(rec)
        if pool.cfg.max_pending is not None:
            self._make_room(rec, pool, 1, now)
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
            self._in_batch = True
            try:
                for rec in new:
                    if rec.extra is not None:
                        self._check(rec, fresh)
                for rec in new:  # every batch-mate's parents are known now
                    self._check_await_cycle(rec)
            finally:
                self._in_batch = False
                self._batch_reservations.clear()
            # Parents in the batch come first (ids follow the batch order); raises on a cycle.
            order = _parents_first(new)
        if self._bounded:
            per_pool: dict[str, int] = {}
            for rec in new:
                per_pool[rec.pool] = per_pool.get(rec.pool, 0) + 1
            for name, n in per_pool.items():
                pool = self.pools[name]
                cap = pool.cfg.max_pending
                if cap is not None and sum(pool.pending_by_class) + n > cap:
                    raise SubmitError("overloaded", "overloaded")
        if order is not new:
            for rec in new:
                self._assign_id(rec)
        pools = self.pools
        admit = self._admit
        for rec in order:
            admit(rec, pools[rec.pool], now)
        return out

    # --- admission -----------------------------------------------------------------------

    def _check(self, rec: TaskRecord, batch: dict[str, TaskRecord] | None) -> None:
        """Resources and dependencies of a task about to be admitted; raises SubmitError."""
        extra = rec.extra
        assert extra is not None
        if "resources" in extra:
            self._resolve_resources(extra)
        if "start_at" in extra:
            self._check_reservation(rec)
        if "deps" in extra:
            self._resolve_deps(rec, extra, batch)

    def _resolve_resources(self, extra: dict[str, Any]) -> None:
        """Keep the checked (resource, amount) pairs dispatch and release use."""
        res = extra.get("resources")
        if res:
            extra["_res"] = self.resolve_resources(res)

    def resolve_resources(self, amounts: Mapping[str, int]) -> Wanted:
        """Check requested amounts (SubmitError: unknown_resource, resource_exceeds_capacity)
        and return them as (resource, amount) pairs; requests for the same amounts share one
        tuple (few distinct requests exist)."""
        sig = tuple(amounts.items())
        wanted = self._wanted.get(sig)
        if wanted is None:
            pairs = []
            for name, amount in sig:
                r = self.resources.get(name)
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

    def _resolve_deps(
        self, rec: TaskRecord, extra: dict[str, Any], batch: dict[str, TaskRecord] | None
    ) -> None:
        deps = extra.get("deps")
        if not deps:
            return
        resolved: list[tuple[TaskRecord | None, str | None, str]] = []
        for target, on in deps:
            if isinstance(target, str):
                if target == rec.key:
                    raise SubmitError("cycle", "dependency cycle")
                parent = self.keys.get(target)
                if parent is None and batch is not None:
                    parent = batch.get(target)
                if parent is None:
                    if self.pools[rec.pool].cfg.unknown_dependency != "await":
                        raise SubmitError("unknown_dependency", f"unknown dependency {target!r}")
                    resolved.append((None, target, on))
                    continue
            else:
                parent = self.tasks.get(target)
                if parent is None:
                    raise SubmitError("unknown_dependency", f"unknown dependency '{target}'")
            resolved.append((parent, None, on))
        extra["_deps"] = resolved

    def _check_await_cycle(self, rec: TaskRecord) -> None:
        """A task whose key others await must not depend on any of them (after _check)."""
        key = rec.key
        if key is None or key not in self._awaiting or rec.extra is None:
            return
        waiting = {
            id(child)
            for child, _ in self._awaiting[key]
            if child.status == BLOCKED and child.extra and key in child.extra.get("_awaits", ())
        }
        if waiting and _reaches(rec.extra.get("_deps", []), waiting):
            raise SubmitError("cycle", "dependency cycle")

    def _check_reservation(self, rec: TaskRecord) -> None:
        """Fixed starts may overlap at most reservation_limit at a time (batch-mates included)."""
        pool = self.pools[rec.pool]
        lo, hi = pool.reservation(rec)
        others = list(pool.reservations.values()) + self._batch_reservations.get(pool.name, [])
        if _peak_overlap(others, lo, hi) + 1 > pool.reservation_limit:
            raise SubmitError("reservation_conflict", "fixed-start reservation conflict")
        if self._in_batch:
            self._batch_reservations.setdefault(pool.name, []).append((lo, hi))

    def _make_room(self, rec: TaskRecord, pool: PoolState, n: int, now: float) -> None:
        """Apply the pool's overflow policy when admitting would exceed max_pending."""
        cap = pool.cfg.max_pending
        assert cap is not None
        if sum(pool.pending_by_class) + n <= cap:
            return
        policy = pool.cfg.overflow
        if policy == "wait":
            raise SubmitError("full", "queue full")
        victim = None
        if policy == "shed_lowest":
            for c in range(3, rec.cls, -1):
                victim = self._shed_candidate(pool, c, newest=True)
                if victim is not None:
                    break
        elif policy == "shed_oldest":
            victim = self._shed_candidate(pool, 3, newest=False)
        if victim is None:
            raise SubmitError("overloaded", "overloaded")
        if victim.parked is not None:
            victim.parked = None
            victim.qgen += 1  # its parking entry dies
        else:
            pool.queues.discard(victim)
        self._finish(victim, SHED, now, MSG_SHED)

    def _shed_candidate(self, pool: PoolState, cls: int, newest: bool) -> TaskRecord | None:
        """The newest (or oldest) ready task of a class, queued or parked: a scan, only run
        under overload, where max_pending bounds it."""
        q = pool.queues.classes[cls]
        found = [r for r in (q.newest() if newest else q.oldest(),) if r is not None]
        waits: list[Any] = [r.parked for r in self.resources.values()]
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

    def has_room(self, pool_name: str) -> bool:
        """Can the pool take one more pending task without its overflow policy?"""
        pool = self.pools[pool_name]
        cap = pool.cfg.max_pending
        return cap is None or sum(pool.pending_by_class) < cap

    def _assign_id(self, rec: TaskRecord) -> None:
        rec.id = self._next_id
        self._next_id += 1
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
        fixed = extra is not None and "start_at" in extra
        if not fixed:
            pool.arrivals += 1  # a fixed start arrives at its start time (autoscaler signal)
        if self.event_level == EVENTS_ALL:
            self._event(rec, BLOCKED, now, None)
        if key is not None and self._awaiting and key in self._awaiting:
            for child, on in self._awaiting.pop(key):
                if child.status == BLOCKED:
                    _children(rec).append((child, on))
                    child_extra = child.extra
                    assert child_extra is not None
                    child_extra["_awaits"].discard(key)
                    child_extra.setdefault("_parents", []).append(rec)
        if extra is None or not (fixed or "_deps" in extra):
            if not rec.eligible_at:  # a restored task keeps its place in the queue
                rec.eligible_at = now
            self._make_ready(rec, pool, now)
            return
        if fixed:
            pool.reservations[rec] = pool.reservation(rec)
        waiting = 0
        dead: str | None = None
        # "_deps" stays while the task is blocked if some task awaits a key: the await-cycle
        # check walks it to find ancestors. Without awaits it goes at once (fewer objects for
        # the garbage collector): a path from a task submitted later to one that awaits a key
        # only passes through tasks admitted after that one started waiting.
        for parent, awaited, on in extra.get("_deps", ()):
            if parent is None:
                assert awaited is not None
                self._awaiting.setdefault(awaited, []).append((rec, on))
                extra.setdefault("_awaits", set()).add(awaited)
                timeout = self.pools[rec.pool].cfg.await_timeout
                if timeout is not None:
                    self._timer(rec.submitted_at + max(0.0, timeout), _T_AWAIT, rec, 0)
                waiting += 1
            elif parent.status < FIRST_TERMINAL:
                _children(parent).append((rec, on))
                waiting += 1
            elif not _edge_met(parent.status, on):
                dead = STATUS_NAMES[parent.status]
        if dead is not None:
            self._finish(rec, SKIPPED, now, f"dependency ended as {dead}")
        elif waiting:
            extra["_waiting"] = waiting
            if not self._awaiting:
                del extra["_deps"]
        else:
            self._release(rec, pool, now)

    def _release(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        """Every dependency of a blocked task is satisfied: it may run (or wait for its start)."""
        extra = rec.extra
        if extra is not None:
            extra.pop("_deps", None)
            extra.pop("_parents", None)
            if "start_at" in extra:
                self._arrive_fixed(rec, pool, now)
                return
        if not rec.eligible_at:
            rec.eligible_at = now
        self._make_ready(rec, pool, now)

    # --- recurring schedules ---------------------------------------------------------------

    def add_recurring(self, sched: Recurring, now: float) -> None:
        """Add or replace a schedule by name; a replaced schedule's pending occurrences are
        cancelled. Each occurrence is created 2 x tolerance ahead of its time, or when the
        previous one fires if that is later."""
        self.remove_recurring(sched.name, now)
        self.recurring[sched.name] = sched
        self._plan_next(sched, now, now)

    def resume_recurring(
        self, sched: Recurring, next_time: float | None, last_id: int | None, now: float
    ) -> None:
        """Take back a stored schedule (after restore): its next occurrence is the stored one,
        created at once if its time passed meanwhile (then its on_miss applies); the
        occurrences that passed after it are not created."""
        self.recurring[sched.name] = sched
        tag = sched.name
        for rec in sorted(self.tasks.values(), key=lambda r: r.seq):
            if rec.tags and rec.tags.get(RECURRING_TAG) == tag:
                sched.created(rec)
        if last_id is not None and last_id in self.tasks:
            sched.last = self.tasks[last_id]
        if next_time is not None:
            self._plan_next(sched, next_time - 0.5, now)

    def remove_recurring(self, name: str, now: float) -> bool:
        """Drop a schedule and cancel its occurrences that have not started yet (their keys are
        freed, so a schedule added again under the same name creates them anew)."""
        sched = self.recurring.pop(name, None)
        if sched is None:
            return False
        sched.gen += 1
        for rec in sched.unstarted():
            self.cancel(rec.id, now)
            if rec.key is not None and self.keys.get(rec.key) is rec:
                del self.keys[rec.key]
            rec.key = None  # for good: a store writes the cancelled task without it
        return True

    def _plan_next(self, sched: Recurring, after: float, not_before: float) -> None:
        """Find the next occurrence strictly after `after` and set the timer that creates it."""
        t = sched.spec.next_after(after, sched.tz)
        sched.next_time = t
        if self.journal is not None:
            self.journal.schedules[sched.name] = sched
        if t is not None:
            self._timer(max(not_before, t - 2 * sched.tolerance), _T_CRON, sched, sched.gen)

    def _materialize(self, sched: Recurring, now: float) -> None:
        """Create the occurrence at sched.next_time as an ordinary fixed-start task."""
        t = sched.next_time
        assert t is not None
        prev = sched.last
        prev_live = prev is not None and prev.status < FIRST_TERMINAL
        overlap = sched.overlap
        conflict = False
        if overlap in ("queue", "queue_on_success"):
            queued = sched.queued
            conflict = queued is not None and queued.status == BLOCKED
        if conflict:
            self.totals["recurring_conflicts"] += 1
        else:
            rec = sched.occurrence(t, occurrence_key(sched.key, t))
            assert rec.extra is not None
            if overlap == "skip":
                rec.extra["_recurring"] = sched  # checked at its start time
            elif prev is not None and (
                overlap == "queue_on_success" or (overlap == "queue" and prev_live)
            ):
                on = "success" if overlap == "queue_on_success" else "complete"
                rec.extra["deps"] = [(prev.id, on)]
            try:
                got, _ = self.submit(rec, now)
            except SubmitError:
                self.totals["recurring_conflicts"] += 1
            else:
                sched.created(got)
        # Occurrences whose time passed before this one was created (a stalled or stopped
        # driver) are not created: the schedule goes on from now.
        self._plan_next(sched, max(t, now), t)

    # --- fixed start times -----------------------------------------------------------------

    def _arrive_fixed(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        """A fixed-start task may run: wait for its time, run now, or apply on_miss."""
        assert rec.extra is not None
        start, tol = rec.extra["start_at"], rec.extra["tolerance"]
        if now > start + tol and rec.extra["on_miss"] != "run_late":
            self._move(rec, SCHEDULED, now, None)
            self._fixed_missed(rec, pool, now)
        elif now >= start:
            self._make_due(rec, pool, now)
        else:
            self._move(rec, SCHEDULED, now, None)
            lead = max(tol, pool.cfg.default_duration if pool.learned is None else pool.learned)
            self._timer(start - lead, _T_HOLD, rec, 0)
            self._timer(start, _T_START, rec, 0)

    @staticmethod
    def _too_late(rec: TaskRecord, now: float) -> bool:
        """Past start + tolerance with an on_miss other than run_late."""
        extra = rec.extra
        assert extra is not None
        return bool(extra["on_miss"] != "run_late" and now > extra["start_at"] + extra["tolerance"])

    def _hold(self, rec: TaskRecord, pool: PoolState) -> None:
        assert rec.extra is not None
        if not rec.extra.get("_held"):
            rec.extra["_held"] = True
            pool.holds += 1

    def _make_due(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        """The start time has come: the task waits, ahead of the ready queues, for its slot."""
        assert rec.extra is not None
        self._move(rec, READY, now, None)
        rec.eligible_at = rec.ready_at = now
        pool.arrivals += 1
        self._hold(rec, pool)
        rec.extra["_due"] = True
        start, tol = rec.extra["start_at"], rec.extra["tolerance"]
        heappush(pool.due, (start, rec.seq, rec))
        if now <= start + tol:
            self._timer(start + tol, _T_MISS, rec, 0)

    def _fixed_missed(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        """Not started within tolerance and on_miss is skip or fail."""
        assert rec.extra is not None
        pool.stats.on_fixed_start(now, False)
        status = MISSED if rec.extra["on_miss"] == "skip" else FAILED
        self._finish(rec, status, now, MSG_MISSED)

    def _drop_fixed(self, rec: TaskRecord, pool: PoolState) -> None:
        """The task started or ended: its reservation and held slot go."""
        extra = rec.extra
        assert extra is not None
        pool.reservations.pop(rec, None)
        if extra.pop("_held", False):
            pool.holds -= 1
            self._reoffer = bool(self.resources)  # a held slot is free for others again
        extra["_due"] = False
        extra["_fixed_done"] = True

    def _dispatch_due(self, pool: PoolState, now: float) -> None:
        """Start tasks at their fixed start time on the slots held for them, in start order;
        one that lacks a matching slot or a resource lets the next one try."""
        due = pool.due
        waiting = []
        while due and pool.busy < pool.capacity:
            entry = heappop(due)
            rec = entry[2]
            extra = rec.extra
            assert extra is not None
            if rec.status != READY or not extra.get("_due"):
                continue
            found = None
            if pool.groups is not None or rec.labels:
                found = self._slot_for(rec, pool, park=False)
            if isinstance(found, bool) or not self._acquire(rec, now, park=False):
                waiting.append(entry)
                continue
            start, tol = extra["start_at"], extra["tolerance"]
            pool.stats.on_fixed_start(now, now <= start + tol)
            self._drop_fixed(rec, pool)
            self._start(rec, pool, now, True, found)
        for entry in waiting:
            heappush(due, entry)

    def _apply_misses(self, pool: PoolState, now: float) -> None:
        """Due tasks past their tolerance (skip/fail) that dispatch could not start end now."""
        for rec in pool.misses:
            if rec.status == READY and rec.extra is not None and rec.extra.get("_due"):
                self._fixed_missed(rec, pool, now)
        pool.misses.clear()

    def _settle_dependents(self, now: float) -> None:
        """Apply finished tasks to the edges of their dependents (iteratively: skips cascade)."""
        cascade = self._cascade
        self._settling = True
        try:
            self._settle(cascade, now)
        finally:
            self._settling = False

    def _settle(self, cascade: deque[TaskRecord], now: float) -> None:
        while cascade:
            parent = cascade.popleft()
            assert parent.extra is not None
            status = parent.status
            for child, on in parent.extra.pop("_children", ()):
                if child.status != BLOCKED:
                    continue
                if _edge_met(status, on):
                    extra = child.extra
                    assert extra is not None
                    extra["_waiting"] -= 1
                    if not extra["_waiting"]:
                        self._release(child, self.pools[child.pool], now)
                else:
                    msg = f"dependency {parent.id} ended as {STATUS_NAMES[status]}"
                    self._finish(child, SKIPPED, now, msg)

    def _make_ready(self, rec: TaskRecord, pool: PoolState, now: float) -> None:
        self._move(rec, READY, now, None)
        rec.ready_at = now
        if rec.deadline is not None:
            rec.latest_start = rec.deadline - pool.expected_duration(rec)
        extra = rec.extra
        wanted = None if extra is None else extra.get("_res")
        # A task whose resource is short, or already has tasks waiting, waits there at once in
        # priority order (dispatch would only pop it to park it).
        if wanted and self._park_if_short(rec, wanted, now, behind_waiters=True):
            return
        pool.queues.push(rec)

    # --- dispatch ------------------------------------------------------------------------

    def dispatch(self, now: float) -> None:
        """Start the best ready tasks on every free slot."""
        if not self.dispatching:
            return
        self._offer_and_dispatch(now)
        if self._cron_due:
            # Recurring occurrences are created after the previous one has taken its slot, so
            # its reservation no longer counts against the next.
            for sched in self._cron_due:
                if self.recurring.get(sched.name) is sched:
                    self._materialize(sched, now)
            self._cron_due.clear()
            self._offer_and_dispatch(now)

    def _offer_and_dispatch(self, now: float) -> None:
        """Offer freed resources and group slots to the tasks parked on them, then fill slots.

        An offered task counts against the resource's level, its pool's room or its group's
        free slots; one that did not start (outranked in its queue, cancelled meanwhile, or
        parked again on a group or another resource) may have held back others, so offer
        again, as when the dispatch itself freed something (a missed fixed start let its held
        slot go). Offered tasks that did not start are no longer parked, so each round offers
        fewer tasks or follows a start: the loop ends."""
        offer = self._reoffer
        offered = self._offered
        while True:
            if offer:
                self._reoffer = False
                self._offer(now)
            self._dispatch_pools(now)
            again = self._reoffer
            if offered:
                for rec in offered:
                    if rec.status != RUNNING:
                        again = True
                        break
                offered.clear()
            if not again:
                return
            offer = True

    def _offer(self, now: float) -> None:
        for r in self.resources.values():
            if r.parked:
                self._unpark(r, now)
        for pool in self._pool_list:
            groups = pool.groups
            if groups is not None and groups.parked:
                for g in list(groups.by_key.values()):
                    if g.busy < g.capacity:
                        self._unpark_labeled(pool, g)

    def _dispatch_pools(self, now: float) -> None:
        pools = self._pool_list
        # Fixed starts first, in every pool: one that could not start by its tolerance ends
        # now, and its dependents (in any pool) join the ready queues before those are served.
        for pool in pools:
            if pool.due and pool.busy < pool.capacity:
                pool.stats.level(now, pool.busy, pool.capacity)
                self._dispatch_due(pool, now)
                pool.stats.level(now, pool.busy, pool.capacity)
            if pool.misses:
                self._apply_misses(pool, now)
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
                    found = self._slot_for(rec, pool, park=True)
                    if isinstance(found, bool):
                        continue  # parked until a matching group has a free slot
                    slot = found
                if rec.extra is not None and not self._acquire(rec, now):
                    if slot is not None and pool.groups is not None and pool.groups.parked:
                        self._unpark_labeled(pool, slot)  # the group slot it found is free
                    continue  # parked on a resource; the next task may run
                free -= 1
                self._start(rec, pool, now, queues.adherent, slot)
            stats.level(now, pool.busy, pool.capacity)

    def _slot_for(self, rec: TaskRecord, pool: PoolState, park: bool) -> Group | bool | None:
        """The worker-group slot a task would run on (None: unlabeled), or False."""
        groups = pool.groups or self._make_groups(pool)
        slot = groups.pick(rec, pool.unlabeled)
        if slot is False and park:
            groups.park(rec)
        return slot

    def _acquire(self, rec: TaskRecord, now: float, park: bool = True) -> bool:
        """Take the task's resources, or (with park) park it on the first one that is short."""
        assert rec.extra is not None
        wanted = rec.extra.get("_res")
        if not wanted:
            return True
        for r, amount in wanted:
            if r.in_use + amount > r.permits if not r.is_bucket else not r.available(amount, now):
                if park:
                    self._park_if_short(rec, wanted, now)
                return False
        for r, amount in wanted:
            r.take(amount, now)
        return True

    def _park_if_short(
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
                        self._reoffer = True  # the next dispatch offers what is free
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
            self._timer(when, _T_TOKENS, r, 0)

    def _unpark(self, r: ResourceState, now: float) -> None:
        """Put back in their ready queues the parked tasks the resource can serve now, best
        first, skipping tasks whose pool has no free slot (they would only park again)."""
        room: dict[str, int] = {}

        def fits(rec: TaskRecord) -> bool:
            assert rec.extra is not None
            wanted = rec.extra["_res"]
            if len(wanted) > 1 and self._park_if_short(rec, wanted, now):
                return False  # another of its resources is short: it now waits there
            pool = self.pools[rec.pool]
            left = room.get(pool.name, pool.free_for_queue())
            room[pool.name] = left - 1
            return left > 0

        out, short = r.unpark(now, fits)
        for rec in out:
            rec.parked = None
            self.pools[rec.pool].queues.push(rec)
        self._offered += out
        if short is not None and r.is_bucket:
            self._bucket_wake(r, short, now)

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
            self._timer(now + rec.timeout, _T_TIMEOUT, att, 0)
        if ttl is not None:
            self._timer(att.lease_expiry, _T_LEASE, att, 0)
        self.out.starts.append(att)

    # --- outcomes ------------------------------------------------------------------------

    def complete(self, att: Attempt, now: float, output: Any = None) -> bool:
        """The attempt's executor returned `output`. False if the attempt had already ended."""
        if att.ended:
            self.totals["stale_completions"] += 1
            return False
        rec = att.task
        pool = self.pools[rec.pool]
        runtime = self._end_attempt(att, pool, now, True)
        d = pool.durations.get(rec.kind)
        pool.durations[rec.kind] = runtime if d is None else d + _EWMA_ALPHA * (runtime - d)
        d = pool.learned
        pool.learned = runtime if d is None else d + _EWMA_ALPHA * (runtime - d)
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
        self._after_failure(att.task, pool, now, message, permanent, retry_after)
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
                self._unpark_labeled(pool, slot)
        runtime = now - att.started_at
        pool.stats.on_attempt_end(now, att.started_at, success)
        extra = att.task.extra
        wanted = None if extra is None else extra.get("_res")
        if wanted:
            for r, amount in wanted:
                r.release(amount)
        if self.resources:
            # Permits came back, or a slot did for a task that a resource could serve: the next
            # dispatch re-offers them (once for all the attempts that ended meanwhile).
            self._reoffer = True
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
        rec.message = message
        rec.ready_at = now + delay  # when it will be ready again (a store keeps it)
        self._move(rec, RETRYING, now, message)
        self._timer(rec.ready_at, _T_RETRY, rec, rec.attempt)

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
        elif rec.status == READY:
            if rec.parked is not None:
                rec.parked = None
                rec.qgen += 1  # its entry in the resource's parking heap dies
            elif not (rec.extra and rec.extra.get("_due")):  # due tasks are not queued
                pool.queues.discard(rec)
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
        self._reoffer = bool(self.resources)  # new slots for tasks waiting on a resource

    def set_group_capacity(
        self, pool_name: str, labels: dict[str, str], n: int, now: float
    ) -> None:
        """Declare or resize the worker group carrying exactly `labels` (0 removes its slots)."""
        pool = self.pools[pool_name]
        g = (pool.groups or self._make_groups(pool)).set(labels, n)
        assert pool.groups is not None
        capacity = pool.unlabeled + pool.groups.total()
        pool.stats.level(now, pool.busy, capacity)
        pool.capacity = capacity
        self._unpark_labeled(pool, g)
        self._reoffer = bool(self.resources)

    @staticmethod
    def _make_groups(pool: PoolState) -> Groups:
        """First group or labeled task of a pool: every running attempt is on an unlabeled slot."""
        groups = pool.groups = Groups()
        groups.unlabeled_busy = pool.busy
        return groups

    def _unpark_labeled(self, pool: PoolState, g: Group) -> None:
        assert pool.groups is not None
        out = pool.groups.unpark(g)
        for rec in out:
            rec.parked = None
            pool.queues.push(rec)
        self._offered += out

    def _autoscale(self, pool: PoolState, now: float) -> None:
        """One autoscaler evaluation of a pool (see core/autoscale.py for the formula)."""
        scaler = pool.scaler
        assert scaler is not None
        backlog = [q.n for q in pool.queues.classes]
        for _, _, rec in pool.due:
            if rec.status == READY:
                backlog[rec.cls] += 1
        for c, n in enumerate(pool.retrying_by_class):
            backlog[c] += n
        horizon = now + scaler.settings.reservation_horizon
        upcoming = [iv for iv in pool.reservations.values() if iv[0] <= horizon]
        new = scaler.evaluate(
            now,
            arrivals=pool.arrivals,
            service_time=pool.cfg.default_duration if pool.learned is None else pool.learned,
            backlog_by_class=backlog,
            busy=pool.busy,
            capacity=pool.unlabeled,
            reserved=_peak_overlap(upcoming, now, math.inf),
        )
        pool.arrivals = 0
        if self.elastic and new != pool.unlabeled:
            self.set_capacity(pool.name, new, now)
        self._timer(scaler.next_eval, _T_SCALE, pool, 0)

    # --- timers --------------------------------------------------------------------------

    def _timer(self, when: float, kind: int, obj: Any, tag: int) -> None:
        self._tseq += 1
        heappush(self._timers, (when, self._tseq, kind, obj, tag))

    def advance(self, now: float) -> None:
        """Fire every timer due at or before `now` and prune expired retained tasks."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, _, kind, obj, tag = heappop(timers)
            if kind == _T_RETRY:
                rec = obj
                if rec.status == RETRYING and rec.attempt == tag:
                    pool = self.pools[rec.pool]
                    pool.retrying_by_class[rec.cls] -= 1
                    self._make_ready(rec, pool, now)
            elif kind == _T_SCALE:
                self._autoscale(obj, now)
            elif kind == _T_CRON:
                sched: Recurring = obj
                if self.recurring.get(sched.name) is sched and sched.gen == tag:
                    self._cron_due.append(sched)  # created by the dispatch that follows
            elif kind == _T_TOKENS:
                if obj.wake == when:
                    obj.wake = None
                    self._unpark(obj, now)
            elif kind == _T_HOLD:
                if obj.status == SCHEDULED:
                    self._hold(obj, self.pools[obj.pool])
            elif kind == _T_START:
                if obj.status == SCHEDULED:
                    sched = obj.extra.get("_recurring")
                    pool = self.pools[obj.pool]
                    if sched is not None and sched.earlier_live(obj):
                        self._finish(obj, SKIPPED, now, MSG_OVERLAP)
                    elif self._too_late(obj, now):  # the driver woke after the tolerance
                        self._fixed_missed(obj, pool, now)
                    else:
                        self._make_due(obj, pool, now)
            elif kind == _T_MISS:
                rec = obj
                # Without a free slot it ends now; with one, the dispatch that follows this
                # advance() starts it or, if it cannot (resource, labels), ends it.
                pool = self.pools[rec.pool]
                due = rec.status == READY and rec.extra.get("_due")
                if due and rec.extra["on_miss"] != "run_late":
                    if pool.busy >= pool.capacity:
                        self._fixed_missed(rec, pool, now)
                    else:
                        pool.misses.append(rec)
            elif kind == _T_AWAIT:
                rec = obj
                extra = rec.extra
                if rec.status == BLOCKED and extra is not None and extra.get("_awaits"):
                    self._finish(rec, SKIPPED, now, MSG_AWAIT_TIMEOUT)
            elif not obj.ended:
                att = obj
                pool = self.pools[att.task.pool]
                if kind == _T_TIMEOUT:
                    self.totals["timeouts"] += 1
                    self._abort(att, pool, now, ABORT_TIMEOUT)
                    self._after_failure(att.task, pool, now, ABORT_TIMEOUT, False, None)
                elif att.lease_expiry > now:
                    self._timer(att.lease_expiry, _T_LEASE, att, 0)
                else:
                    self.totals["lease_expiries"] += 1
                    self._abort(att, pool, now, ABORT_LEASE)
                    self._after_failure(att.task, pool, now, ABORT_LEASE, False, None)
        self._prune(now)

    # --- terminal states and retention ---------------------------------------------------

    def _finish(self, rec: TaskRecord, status: int, now: float, message: str | None) -> None:
        if rec.status != RUNNING:  # it was pending until now
            self.pools[rec.pool].pending_by_class[rec.cls] -= 1
            if rec.status == RETRYING:
                self.pools[rec.pool].retrying_by_class[rec.cls] -= 1
        self._move(rec, status, now, message)
        rec.message = message
        rec.finished_at = now
        rec.payload = None
        self.live -= 1
        self.totals[STATUS_NAMES[status]] += 1
        self.out.finished.append(rec)
        self._retained.append(rec)
        if len(self._retained) > self.retention_max:
            self._forget(self._retained.popleft())
        extra = rec.extra
        if extra is not None:
            extra.pop("_deps", None)
            extra.pop("_parents", None)
            if "start_at" in extra and not extra.get("_fixed_done"):
                self._drop_fixed(rec, self.pools[rec.pool])
            if extra.get("_children"):
                self._cascade.append(rec)
                if not self._settling:
                    self._settle_dependents(now)

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

    # --- the life-cycle table ------------------------------------------------------------

    def _move(self, rec: TaskRecord, new: int, now: float, message: str | None) -> None:
        if new not in TRANSITIONS[rec.status]:
            raise IllegalTransition(
                f"task {rec.id}: {STATUS_NAMES[rec.status]} -> {STATUS_NAMES[new]}"
            )
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

    def live_tasks(self) -> Iterable[TaskRecord]:
        return (r for r in self.tasks.values() if r.status < FIRST_TERMINAL)

    # --- snapshot ------------------------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        pools = []
        pending = 0
        for p in self._pool_list:
            m = p.stats.summary(now)
            by_class = list(p.pending_by_class)
            pending += sum(by_class)
            pools.append(
                PoolSnapshot(
                    name=p.name,
                    capacity=p.capacity,
                    busy=p.busy,
                    held=min(p.holds, max(0, p.capacity - p.busy)),
                    desired=p.capacity if p.scaler is None else p.scaler.desired,
                    pending=sum(by_class),
                    pending_by_class=by_class,
                    ready=p.queues.n,
                    reservations=len(p.reservations),
                    window=p.stats.window,
                    dispatched=int(m["dispatched"]),
                    succeeded=int(m["succeeded"]),
                    failed=int(m["failed"]),
                    retried=int(m["retried"]),
                    priority_adherence=m["priority_adherence"],
                    fixed_start_hit_rate=m["fixed_start_hit_rate"],
                    utilization=m["utilization"],
                    schedule_efficiency=m["schedule_efficiency"],
                    wait_mean=m["wait_mean"],
                    wait_p50=m["wait_p50"],
                    wait_p90=m["wait_p90"],
                    wait_p99=m["wait_p99"],
                    run_p50=m["run_p50"],
                    run_p99=m["run_p99"],
                    worker_seconds=p.stats.worker_seconds,
                    cost=p.stats.worker_seconds * p.cfg.cost_per_worker_second,
                )
            )
        return Snapshot(
            pools=pools,
            live_tasks=self.live,
            running=len(self.running),
            pending=pending,
            totals=dict(self.totals),
        )


# --- dependency graph helpers -----------------------------------------------------------------


def _edge_met(status: int, on: str) -> bool:
    """Does a parent that ended with `status` satisfy an edge with condition `on`?"""
    if on == "complete":
        return True
    if on == "success":
        return status == SUCCEEDED
    return status in (FAILED, DEAD_LETTERED)


def _children(rec: TaskRecord) -> list[tuple[TaskRecord, str]]:
    if rec.extra is None:
        rec.extra = {}
    children: list[tuple[TaskRecord, str]] = rec.extra.setdefault("_children", [])
    return children


def _parents(rec: TaskRecord) -> list[TaskRecord]:
    """Known parents of a task that is being admitted or is blocked: those resolved at
    admission ("_deps") and awaited keys resolved since ("_parents")."""
    extra = rec.extra
    if not extra:
        return []
    out = [p for p, _, _ in extra.get("_deps", ()) if p is not None]
    out.extend(extra.get("_parents", ()))
    return out


def _reaches(resolved: list[tuple[TaskRecord | None, str | None, str]], targets: set[int]) -> bool:
    """Does any live ancestor reachable from these parents belong to `targets` (by id())?"""
    stack = [p for p, _, _ in resolved if p is not None]
    seen: set[int] = set()
    while stack:
        p = stack.pop()
        if id(p) in targets:
            return True
        if id(p) in seen or p.status != BLOCKED:  # only blocked tasks wait on parents
            continue
        seen.add(id(p))
        stack.extend(_parents(p))
    return False


def _batch_parents(rec: TaskRecord, batch: set[int]) -> list[TaskRecord]:
    extra = rec.extra
    if not extra:
        return []
    return [p for p, _, _ in extra.get("_deps", ()) if p is not None and id(p) in batch]


def _parents_first(new: list[TaskRecord]) -> list[TaskRecord]:
    """The batch in an order where each task comes after its parents in the batch (stable);
    SubmitError("cycle") if there is none."""
    batch = {id(r) for r in new}
    order: list[TaskRecord] = []
    state: dict[int, int] = {}  # 1 = on the current path, 2 = placed
    for root in new:
        if state.get(id(root)) == 2:
            continue
        stack: list[tuple[TaskRecord, int]] = [(root, 0)]
        state[id(root)] = 1
        while stack:
            rec, i = stack[-1]
            parents = _batch_parents(rec, batch)
            if i < len(parents):
                stack[-1] = (rec, i + 1)
                p = parents[i]
                st = state.get(id(p))
                if st == 1:
                    raise SubmitError("cycle", "dependency cycle")
                if st is None:
                    state[id(p)] = 1
                    stack.append((p, 0))
            else:
                stack.pop()
                state[id(rec)] = 2
                order.append(rec)
    return order


def _finished_at(rec: TaskRecord) -> float:
    return rec.finished_at


def _peak_overlap(intervals: list[tuple[float, float]], lo: float, hi: float) -> int:
    """Most of the half-open intervals that cover one instant of [lo, hi)."""
    points: list[tuple[float, int]] = []
    for a, b in intervals:
        if a < hi and b > lo:
            points.append((max(a, lo), 1))
            points.append((min(b, hi), -1))
    points.sort()  # at equal times, ends (-1) before starts (+1): touching is no overlap
    peak = level = 0
    for _, step in points:
        level += step
        peak = max(peak, level)
    return peak
