"""Plain values shared by the engine core, the library driver, the stores and the server.

Nothing here does I/O or reads a clock. Statuses are small ints inside the core (cheap to compare
and store) and lower-case names at every public edge.
"""

from __future__ import annotations

import ctypes
import enum
import math
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

# Defined with the exceptions (errors.py depends on nothing of cronoq's); the edge modules
# take it from here with the other argument checks (parse_priority).
from ..errors import check_seconds as check_seconds
from .vocab import STATUSES

if TYPE_CHECKING:
    from .autoscale import AutoscaleSettings

# --- statuses ----------------------------------------------------------------------------------

BLOCKED = 0
SCHEDULED = 1
READY = 2
RUNNING = 3
RETRYING = 4
SUCCEEDED = 5
FAILED = 6
DEAD_LETTERED = 7
CANCELLED = 8
SKIPPED = 9
MISSED = 10
SHED = 11

STATUS_NAMES: tuple[str, ...] = STATUSES  # by status number (the names: core/vocab.py)
FIRST_TERMINAL = SUCCEEDED
TERMINAL_NAMES = frozenset(STATUS_NAMES[FIRST_TERMINAL:])


def is_terminal(status: int) -> bool:
    return status >= FIRST_TERMINAL


# The whole life cycle in one table: status -> statuses it may move to. Every change of a task's
# status goes through State.move() (state.py), which checks this table; a missing entry is a bug.
_LIVE_EXITS = (CANCELLED,)
TRANSITIONS: dict[int, frozenset[int]] = {
    BLOCKED: frozenset({SCHEDULED, READY, SKIPPED, *_LIVE_EXITS}),
    # SKIPPED: a recurring occurrence whose previous one is still running at its start time.
    SCHEDULED: frozenset({READY, MISSED, FAILED, SKIPPED, *_LIVE_EXITS}),
    # A fixed-start task is ready from its start time; if no slot comes within its tolerance it
    # ends missed or failed (on_miss) from there.
    # DEAD_LETTERED: restored from a store, its last attempt was lost with the process.
    READY: frozenset({RUNNING, SHED, MISSED, FAILED, DEAD_LETTERED, *_LIVE_EXITS}),
    RUNNING: frozenset({SUCCEEDED, FAILED, DEAD_LETTERED, RETRYING, *_LIVE_EXITS}),
    RETRYING: frozenset({READY, *_LIVE_EXITS}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    DEAD_LETTERED: frozenset(),
    CANCELLED: frozenset(),
    SKIPPED: frozenset(),
    MISSED: frozenset(),
    SHED: frozenset(),
}


# What restoring a stored task may do to the status it was stored with (Engine.restore). A
# terminal task is kept as it is. A live one is admitted again from BLOCKED, and from there moves
# by TRANSITIONS like any new task; a stored RUNNING attempt counts as lost: the task retries after
# its backoff (RUNNING -> RETRYING) or, if that was its last attempt, is admitted and then
# dead-lettered (READY -> DEAD_LETTERED); a retrying task keeps its retry time. Any
# live task that cannot resume (its pool, resource or dependency is gone, its row is unreadable)
# fails.
RESTORE_TRANSITIONS: dict[int, frozenset[int]] = {
    BLOCKED: frozenset({BLOCKED, FAILED}),
    SCHEDULED: frozenset({BLOCKED, FAILED}),
    READY: frozenset({BLOCKED, FAILED}),
    RUNNING: frozenset({BLOCKED, RETRYING, FAILED}),
    RETRYING: frozenset({RETRYING, FAILED}),
    **{s: frozenset({s}) for s in range(FIRST_TERMINAL, len(STATUS_NAMES))},
}


class IllegalTransition(AssertionError):
    """A status change the life-cycle table does not allow: always an engine bug."""


def check_transition(rec: TaskRecord, new: int, table: dict[int, frozenset[int]]) -> None:
    """Raise IllegalTransition unless `table` lets the task move to `new`."""
    if new not in table[rec.status]:
        raise IllegalTransition(f"task {rec.id}: {STATUS_NAMES[rec.status]} -> {STATUS_NAMES[new]}")


# --- priorities --------------------------------------------------------------------------------


class Priority(enum.IntEnum):
    """Four strict classes; a lower value is more important."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3

    def __repr__(self) -> str:
        return f"Priority.{self.name}"

    __str__ = __repr__


NUM_CLASSES = 4


def parse_priority(value: object, arg: str = "priority") -> int:
    """Accept a Priority, an int 0..3 or a class name (any case); None means NORMAL."""
    if value is None:
        return Priority.NORMAL
    if isinstance(value, bool):
        raise TypeError(f"{arg} must be a Priority, int or str")
    if isinstance(value, int):
        if value < 0:
            raise TypeError(f"{arg} must be a Priority, int or str")
        if value > 3:
            raise ValueError(f"{arg} must be 0..=3")
        return int(value)
    if isinstance(value, str):
        try:
            return Priority[value.upper()].value
        except KeyError:
            raise ValueError(f"unknown priority {value!r}") from None
    raise TypeError(f"{arg} must be a Priority, int or str")


# --- retry policy ------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    return repr(int(v)) if float(v).is_integer() else repr(v)


class RetryPolicy:
    """How many attempts a task gets and how long to wait between them (full jitter)."""

    __slots__ = ("_initial_backoff", "_jitter", "_max_attempts", "_max_backoff", "_multiplier")

    def __init__(
        self,
        max_attempts: int = 3,
        initial_backoff: float = 1.0,
        multiplier: float = 2.0,
        max_backoff: float = 60.0,
        jitter: bool = True,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise TypeError(f"max_attempts must be an int (got {max_attempts!r})")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        initial = check_seconds("initial_backoff", initial_backoff)
        maximum = check_seconds("max_backoff", max_backoff)
        if (
            isinstance(multiplier, bool)
            or not isinstance(multiplier, (int, float))
            or not math.isfinite(multiplier)
            or multiplier < 1
        ):
            raise ValueError(f"multiplier must be a finite number >= 1 (got {multiplier!r})")
        self._max_attempts = max_attempts
        self._initial_backoff = initial
        self._multiplier = float(multiplier)
        self._max_backoff = maximum
        self._jitter = bool(jitter)

    @classmethod
    def none(cls) -> RetryPolicy:
        """One attempt, no retries."""
        return cls(max_attempts=1)

    max_attempts = property(lambda self: self._max_attempts)
    initial_backoff = property(lambda self: self._initial_backoff)
    multiplier = property(lambda self: self._multiplier)
    max_backoff = property(lambda self: self._max_backoff)
    jitter = property(lambda self: self._jitter)

    def backoff(self, next_attempt: int) -> float:
        """The un-jittered wait before attempt `next_attempt` (>= 2)."""
        exp = next_attempt - 2
        delay = self._initial_backoff
        if exp > 0 and self._multiplier != 1.0:
            try:
                delay = self._initial_backoff * self._multiplier**exp
            except OverflowError:
                delay = math.inf
        return min(delay, self._max_backoff)

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(max_attempts={self._max_attempts}, "
            f"initial_backoff={_fmt(self._initial_backoff)}, multiplier={_fmt(self._multiplier)}, "
            f"max_backoff={_fmt(self._max_backoff)}, jitter={self._jitter})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            RetryPolicy,
            (
                self._max_attempts,
                self._initial_backoff,
                self._multiplier,
                self._max_backoff,
                self._jitter,
            ),
        )


DEFAULT_RETRY = RetryPolicy()


# --- scoring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scoring:
    """Dispatch score = base[class] + min(aging_rate * wait, age_cap) + urgency(slack).

    Urgency is 0 while the slack (latest start - now) is at least `window`, rises linearly to
    `urgency_max` at slack 0, and past the latest start grows by `overdue_rate` per second up to
    `overdue_cap` more. The cap keeps an overdue LOW task (10 + 800 + 5000 + 4000 = 9810) below
    a fresh CRITICAL one (10000).

    `aging_rates` / `age_caps`, when set, give each class (critical first) its own aging rate /
    cap in place of `aging_rate` / `age_cap`. Within a class every task still ages alike, which
    is what keeps each class's FIFO order valid as time passes (see queue.py).
    """

    base: tuple[float, float, float, float] = (10000.0, 1000.0, 100.0, 10.0)
    aging_rate: float = 2.0
    age_cap: float = 800.0
    window: float = 5.0
    urgency_max: float = 5000.0
    overdue_rate: float = 10.0
    overdue_cap: float = 4000.0
    aging_rates: tuple[float, float, float, float] | None = None
    age_caps: tuple[float, float, float, float] | None = None

    def ages(self) -> list[tuple[float, float]]:
        """Each class's (aging rate, age cap), critical first."""
        rates = self.aging_rates or (self.aging_rate,) * NUM_CLASSES
        caps = self.age_caps or (self.age_cap,) * NUM_CLASSES
        return list(zip(rates, caps, strict=True))


# --- pool configuration (core view) ------------------------------------------------------------


@dataclass
class PoolConfig:
    """What the core needs to know about a pool; built from cronoq.Pool at the edge."""

    name: str
    capacity: int = 1
    min: int = 1
    max: int = 10
    lease_ttl: float | None = None
    retry: RetryPolicy = DEFAULT_RETRY
    default_duration: float = 1.0
    max_pending: int | None = None
    overflow: str = "wait"
    unknown_dependency: str = "reject"
    await_timeout: float | None = None
    reservable_fraction: float = 0.5
    fair_share: bool = False
    tenant_weights: dict[str, float] = field(default_factory=dict)
    cost_per_worker_second: float = 0.0
    autoscale: AutoscaleSettings | None = None
    # Fixed starts: a slot is held at most this long before the start (None: no cap).
    max_hold: float | None = None
    # The window (seconds) of the snapshot's quality metrics.
    metrics_window: float = 60.0


# --- tasks and attempts ------------------------------------------------------------------------


# How many ended attempts of a retried task its record keeps (TaskRecord.past_attempts).
HISTORY_MAX = 20

# How an attempt ended. PastAttempt.outcome (an attempt that the task retried after) is one of
# the first three; `Observer.ended` is told any of ATTEMPT_OUTCOMES.
OUTCOME_FAILED = "failed"  # its executor or worker reported a failure
OUTCOME_TIMED_OUT = "timed_out"  # it ran past the task's timeout
OUTCOME_LEASE_EXPIRED = "lease_expired"  # its worker stopped heartbeating
OUTCOME_SUCCEEDED = "succeeded"
OUTCOME_CANCELLED = "cancelled"  # the task was cancelled while it ran
OUTCOME_ABANDONED = "abandoned"  # the scheduler shut down with it still running
ATTEMPT_OUTCOMES: tuple[str, ...] = (
    OUTCOME_SUCCEEDED,
    OUTCOME_FAILED,
    OUTCOME_TIMED_OUT,
    OUTCOME_LEASE_EXPIRED,
    OUTCOME_CANCELLED,
    OUTCOME_ABANDONED,
)


class Observer(Protocol):
    """What a driver may watch of attempts as they start and end (`Engine(observer=...)`, the
    server's histograms): called synchronously inside the engine call that starts or ends the
    attempt, so it must be quick and must not call back into the engine. Times are seconds.

    `started`: the attempt `att` (of `att.task`, in its pool, at `att.started_at`) started
    after waiting `wait` = start - `TaskRecord.ready_at`, the instant the task last became
    ready (admitted with nothing to wait for, its dependencies met, its fixed start come, its
    retry backoff over): the time it waited for a slot, not for its dependencies, its start
    time or a backoff. `ended`: the attempt ended with `outcome` (one of ATTEMPT_OUTCOMES)
    after `runtime` = end - `Attempt.started_at`."""

    def started(self, att: Attempt, wait: float) -> None: ...

    def ended(self, att: Attempt, outcome: str, runtime: float) -> None: ...


class PastAttempt(NamedTuple):
    """An attempt that ended without ending its task (the task retried); times in Unix seconds.

    A tuple, so that keeping one costs a retried task no more than it needs."""

    number: int
    started_at: float
    ended_at: float
    outcome: str  # OUTCOME_FAILED, OUTCOME_TIMED_OUT or OUTCOME_LEASE_EXPIRED
    message: str
    worker: tuple[str, int] | None = None  # the remote worker that ran it (name, id)


class Extras:
    """A task's rarely used options and the engine state they need; a plain task has none
    (`TaskRecord.extra` is None), so it stays small.

    The first five fields are the spec as submitted (a store keeps them); the rest is engine
    state, set and cleared by the core's dependency, resource and fixed-start code, and the
    attempt history of a task that retried (which is why a retried plain task has extras)."""

    __slots__ = (
        "awaits",
        "children",
        "deps",
        "due",
        "fixed_done",
        "held",
        "history",
        "lost",
        "on_miss",
        "parents",
        "recurring",
        "resolved",
        "resources",
        "start_at",
        "tolerance",
        "waiting",
        "wanted",
    )

    def __init__(
        self,
        *,
        start_at: float | None = None,
        tolerance: float = 1.0,
        on_miss: str = "run_late",
        deps: list[tuple[int | str, str]] | None = None,
        resources: dict[str, int] | None = None,
    ) -> None:
        self.start_at = start_at  # a fixed start (Unix seconds), with tolerance and on_miss
        self.tolerance = tolerance
        self.on_miss = on_miss
        self.deps = deps  # (parent id or key, condition) edges as submitted
        self.resources = resources  # resource name -> amount
        # (resources.ResourceState, amount) pairs checked at admission (parking.Wanted)
        self.wanted: tuple[tuple[Any, int], ...] | None = None
        # (parent, awaited key, condition) edges resolved at admission; kept while blocked only
        # as long as some task awaits a key (the await-cycle check walks them)
        self.resolved: list[tuple[TaskRecord | None, str | None, str]] | None = None
        self.waiting = 0  # unmet dependency edges of a blocked task
        self.awaits: set[str] | None = None  # keys awaited (unknown_dependency="await")
        self.parents: list[TaskRecord] | None = None  # awaited parents submitted since
        self.children: list[tuple[TaskRecord, str]] | None = None  # dependents waiting on it
        self.held = False  # a slot of its pool is held for its fixed start
        self.due = False  # its fixed start came: it waits ahead of the ready queues
        self.fixed_done = False  # its reservation and held slot are gone
        self.lost = False  # restored: its attempt was running when the last holder stopped
        self.recurring: Overlap | None = None  # overlap="skip": checked at its start time
        # the attempts that ended with a retry, oldest first (at most HISTORY_MAX; in memory only)
        self.history: list[PastAttempt] | None = None

    def is_empty(self) -> bool:
        """Nothing left that a plain task lacks (the record may drop its extras)."""
        return all(getattr(self, f) == getattr(_PLAIN, f) for f in self.__slots__)

    def spec(self) -> dict[str, Any]:
        """The submitted options that are set, by name (for reading and comparing)."""
        out: dict[str, Any] = {}
        if self.start_at is not None:
            out.update(start_at=self.start_at, tolerance=self.tolerance, on_miss=self.on_miss)
        if self.deps is not None:
            out["deps"] = self.deps
        if self.resources is not None:
            out["resources"] = self.resources
        return out

    def __repr__(self) -> str:
        return f"Extras({self.spec()!r})"


_PLAIN = Extras()


class Overlap(Protocol):
    """What a fixed start asks its recurring schedule (recurring.Recurring) at its start time."""

    def earlier_live(self, rec: TaskRecord) -> bool: ...


class TaskRecord:
    """One task: its spec (fixed at submit) and its engine state.

    The spec fields are fixed at submit; the rest is engine state. Rarely used options and
    their state (dependencies, resources, fixed start) live in `extra` (an `Extras`, None on
    a plain task) so that a plain queued task stays small.
    """

    __slots__ = (
        "attempt",
        "cls",
        "deadline",
        "duration_hint",
        "eligible_at",
        "extra",
        "finished_at",
        "id",
        "key",
        "kind",
        "labels",
        "latest_start",
        "message",
        "output",
        "parked",
        "payload",
        "pool",
        "qgen",
        "ready_at",
        "retry",
        "running",
        "seq",
        "started_at",
        "status",
        "submitted_at",
        "tags",
        "tenant",
        "timeout",
        "worker",
    )

    def __init__(
        self,
        payload: Any,
        pool: str,
        cls: int = 2,
        kind: str = "default",
        key: str | None = None,
        tenant: str | None = None,
        deadline: float | None = None,
        duration_hint: float | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        tags: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        extra: Extras | None = None,
    ) -> None:
        self.payload = payload
        self.pool = pool
        self.cls = cls
        self.kind = kind
        self.key = key
        self.tenant = tenant
        self.deadline = deadline
        self.duration_hint = duration_hint
        self.timeout = timeout
        self.retry = retry
        self.tags = tags
        self.labels = labels
        self.extra = extra
        self.id = 0
        self.seq = 0
        self.status = BLOCKED
        self.attempt = 0
        self.message: str | None = None
        self.output: Any = None
        self.submitted_at = 0.0
        self.eligible_at = 0.0
        self.ready_at = 0.0
        self.started_at = 0.0  # when its latest attempt started (0: never)
        self.latest_start: float | None = None
        self.finished_at = 0.0
        self.running: Attempt | None = None
        self.qgen = 0
        # What a ready task waits for outside the ready queues (a resource), else None.
        self.parked: Any = None
        # The remote worker (name, id) given its latest attempt; set by the server's driver.
        self.worker: tuple[str, int] | None = None

    @property
    def status_name(self) -> str:
        return STATUS_NAMES[self.status]

    @property
    def past_attempts(self) -> tuple[PastAttempt, ...]:
        """The attempts after which the task retried, oldest first: the last HISTORY_MAX of
        them (a store keeps them too). The latest attempt is the record's
        own (`attempt`, `started_at`, `status`, `message`) unless it too ended with a retry,
        in which case it is the last entry here. Empty for a task that never retried, which
        allocates nothing for it."""
        extra = self.extra
        if extra is None or extra.history is None:
            return ()
        return tuple(extra.history)

    def __repr__(self) -> str:
        return f"<TaskRecord id={self.id} {STATUS_NAMES[self.status]} attempt={self.attempt}>"


def resubmission(rec: TaskRecord) -> TaskRecord:
    """A new task with `rec`'s spec, payload and tags but no key (the key may be taken again,
    and the copy must not collide with it): what "submit again" submits for a task that ended
    without succeeding (its payload is kept for this, see State.finish)."""
    extra = rec.extra
    copy = None
    if extra is not None:
        spec = extra.spec()
        if spec:
            copy = Extras(**spec)
    return TaskRecord(
        rec.payload,
        rec.pool,
        cls=rec.cls,
        kind=rec.kind,
        tenant=rec.tenant,
        deadline=rec.deadline,
        duration_hint=rec.duration_hint,
        timeout=rec.timeout,
        retry=rec.retry,
        tags=None if rec.tags is None else dict(rec.tags),
        labels=None if rec.labels is None else dict(rec.labels),
        extra=copy,
    )


def gc_untrack(native: bool = True) -> Any:
    """CPython's PyObject_GC_UnTrack: from the native extension where it was built (the
    cheaper call), else through ctypes; None on other interpreters, where nothing is done."""
    if sys.implementation.name != "cpython":
        return None
    if native:
        try:
            from .._native import gc_untrack as untrack
        except ImportError:
            pass
        else:
            return untrack
    untrack = ctypes.pythonapi.PyObject_GC_UnTrack
    untrack.argtypes = (ctypes.py_object,)
    untrack.restype = None
    return untrack


_UNTRACK = gc_untrack()
# What an ended task's payload and output may be for it to leave the collector: values that
# cannot refer back to the task (so it can never be part of a reference cycle).
_LEAVES = frozenset({type(None), bytes, str, int, float, bool})


def leave_collector(rec: TaskRecord) -> None:
    """Take an ended task out of the cyclic garbage collector's sight, when it can be no part of
    a cycle (no options that link it to other tasks, a payload and output of plain values).

    Ended tasks stay in memory for their retention (an hour, up to a million of them), and
    CPython's full collections walk every tracked object, each time the long-lived heap grew
    by a quarter: 25 ms per 100k tasks here, pauses of hundreds of ms on a busy server. Such a
    task is still freed by reference counting as soon as nothing holds it."""
    if (
        _UNTRACK is not None
        and rec.extra is None
        and rec.running is None
        and rec.parked is None
        and rec.payload.__class__ in _LEAVES
        and rec.output.__class__ in _LEAVES
    ):
        _UNTRACK(rec)


class Attempt:
    """One dispatch of a task to a slot (a lease). `ended` is set exactly once.

    A driver may pass a subclass to the Engine (the asyncio driver's TaskContext is one), so
    the object an executor receives is the attempt itself, not a wrapper around it.
    """

    __slots__ = (
        "abort_reason",
        "ended",
        "lease",
        "lease_expiry",
        "lease_ttl",
        "number",
        "slot",
        "started_at",
        "task",
    )

    def __init__(
        self, task: TaskRecord, number: int, lease: int, started_at: float, lease_ttl: float | None
    ) -> None:
        self.slot: Any = None  # the worker group whose slot runs it (None: an unlabeled slot)
        self.task = task
        self.number = number
        self.lease = lease
        self.started_at = started_at
        self.lease_ttl = lease_ttl
        self.lease_expiry = math.inf if lease_ttl is None else started_at + lease_ttl
        self.ended = False
        self.abort_reason: str | None = None

    def extend(self, now: float) -> bool:
        """Heartbeat: the lease now runs until now + lease_ttl. False if the attempt ended."""
        if self.ended:
            return False
        if self.lease_ttl is not None:
            self.lease_expiry = now + self.lease_ttl
        return True

    def __repr__(self) -> str:
        return f"<Attempt task={self.task.id} n={self.number} lease={self.lease}>"


# --- public value types produced by the core ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """One status change of one task; `at` is Unix seconds."""

    id: int
    pool: str
    key: str | None
    status: str
    attempt: int
    at: float
    message: str | None


@dataclass(frozen=True)
class PoolSnapshot:
    """State of one pool now, plus quality metrics over the last `window` seconds."""

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending: int
    pending_by_class: list[int]
    ready: int
    reservations: int
    window: float
    dispatched: int
    succeeded: int
    failed: int
    retried: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_mean: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    run_p50: float
    run_p99: float
    worker_seconds: float
    cost: float
    paused: bool = False  # by an operator (Engine.pause): nothing new starts
    unserved: bool = False  # tasks wait and the pool has no capacity at all to run them


@dataclass(frozen=True, slots=True)
class ReadyView:
    """The ready tasks of one pool, per priority class (index: the class, CRITICAL first), and
    the pool's retry and dead-letter counts; `Engine.ready_view()`.

    `ready_by_class`: tasks in status READY, waiting for a slot wherever they wait (the ready
    queue, a short resource, a worker-group slot, a held slot of their fixed start).
    `oldest_ready_at`: the `ready_at` of the task first in line of each class (its queue's
    head, or a fixed start that is due), None when the class has none. Queue order is by first
    eligibility, so after a retry the head may not be the task that became ready earliest;
    tasks parked on a resource or a worker-group slot are not looked at (finding theirs would
    walk every parked task). `retries`, `dead_lettered`: counted as `Snapshot.totals` counts
    them, for this pool."""

    pool: str
    ready_by_class: tuple[int, ...]
    oldest_ready_at: tuple[float | None, ...]
    retries: int
    dead_lettered: int


@dataclass(frozen=True)
class Snapshot:
    """Point-in-time view of the whole scheduler."""

    pools: list[PoolSnapshot]
    live_tasks: int
    running: int
    pending: int
    totals: dict[str, int]

    def pool(self, name: str) -> PoolSnapshot | None:
        for p in self.pools:
            if p.name == name:
                return p
        return None


TOTALS_KEYS: tuple[str, ...] = (
    "cancelled",
    "dead_lettered",
    "dispatched",
    "failed",
    "lease_expiries",
    "missed",
    "recurring_conflicts",
    "recurring_invalid",
    "retries",
    "shed",
    "skipped",
    "stale_completions",
    "submitted",
    "succeeded",
    "timeouts",
)
