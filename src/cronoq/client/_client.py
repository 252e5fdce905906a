"""The `Client` of `cronoq-server`, `task()` and the data classes its calls return.

docs/client.md is the contract: programs written for the published
`cronoq.client` must run unchanged, and the server must see the same messages on the wire.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, NamedTuple, TypedDict, Unpack, cast

# `_common` comes first: without grpc it raises the ImportError that says what to install.
from ._common import (
    ClientError,
    Payload,
    TaskRef,
    encode_payload,
    enum_name,
    metadata,
    open_channel,
    priority_name,
)

# isort: split
import grpc
import grpc.aio

from cronoq._tracing import ATTR_TASK_ID, tracer
from cronoq.core.vocab import (
    DEP_CONDITIONS,
    MISS_POLICIES,
    OVERLAPS,
    PRIORITY_NAMES,
    TERMINAL_STATUSES,
    DepCondition,
    MissPolicy,
    Overlap,
    PriorityName,
    Status,
)
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc

__all__ = [
    "BULK_ACTIONS",
    "BulkResult",
    "Client",
    "Event",
    "PoolControl",
    "PoolSnapshot",
    "RecurringInfo",
    "Result",
    "SORTS",
    "SearchPage",
    "Snapshot",
    "Submitted",
    "TaskFilter",
    "TaskInfo",
    "TaskPage",
    "Totals",
    "WorkerGroup",
    "WorkerInfo",
    "task",
]

log = logging.getLogger("cronoq.client")

# A wait's RPC deadline is the server-side wait plus this, so the server's own answer (a result
# or DEADLINE_EXCEEDED) normally arrives before the client gives up.
WAIT_MARGIN = 5.0

# The vocabulary's names (cronoq.core.vocab), in its order, to their wire values. Integer
# priorities are class indexes (0 = critical), as `int(cronoq.Priority.X)` gives them.
_PRIORITY_BY_INDEX = (pb.PRIORITY_CRITICAL, pb.PRIORITY_HIGH, pb.PRIORITY_NORMAL, pb.PRIORITY_LOW)
_PRIORITIES: dict[str, pb.Priority] = dict(zip(PRIORITY_NAMES, _PRIORITY_BY_INDEX, strict=True))
_MISS: dict[str, pb.MissPolicy] = dict(
    zip(
        MISS_POLICIES,
        (pb.MISS_POLICY_RUN_LATE, pb.MISS_POLICY_SKIP, pb.MISS_POLICY_FAIL),
        strict=True,
    )
)
_EDGE_CONDS: dict[str, pb.EdgeCond] = {
    "success": pb.EDGE_COND_ON_SUCCESS,
    "complete": pb.EDGE_COND_ON_COMPLETE,
    "failure": pb.EDGE_COND_ON_FAILURE,
}
_CONDS = {name: _EDGE_CONDS[on] for name, on in DEP_CONDITIONS.items()}
_OVERLAPS: dict[str, pb.Overlap] = dict(
    zip(
        OVERLAPS,
        (pb.OVERLAP_SKIP, pb.OVERLAP_ALLOW, pb.OVERLAP_QUEUE, pb.OVERLAP_QUEUE_ON_SUCCESS),
        strict=True,
    )
)
# The orders of `search_tasks` and the actions of `bulk`, by their lower-case wire names.
_SORT_VALUES: dict[str, pb.TaskSort] = {
    enum_name(pb.TaskSort, v, "TASK_SORT_"): pb.TaskSort.ValueType(v)
    for v in pb.TaskSort.values()
    if v != pb.TASK_SORT_UNSPECIFIED
}
SORTS = tuple(_SORT_VALUES)
_BULK_VALUES: dict[str, pb.BulkAction] = {
    enum_name(pb.BulkAction, v, "BULK_ACTION_"): pb.BulkAction.ValueType(v)
    for v in pb.BulkAction.values()
    if v != pb.BULK_ACTION_UNSPECIFIED
}
BULK_ACTIONS = tuple(_BULK_VALUES)
# (wire field, source name) of the backoff fields; a missing or None value sends 0.0
_RETRY_FIELDS = (
    ("initial_backoff_s", "initial_backoff"),
    ("multiplier", "multiplier"),
    ("max_backoff_s", "max_backoff"),
)


# --- data classes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """How a task ended: from `wait`, or from `submit(wait=True)`."""

    id: int
    status: Status
    output: bytes | None
    message: str = ""
    output_available: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def json(self) -> Any:
        """The output decoded as JSON; an empty output (a handler that returned None) is None."""
        if self.output is None:
            raise ValueError(f"task {self.id} has no output")
        return json.loads(self.output) if self.output else None

    def text(self) -> str:
        return (self.output or b"").decode("utf-8")


@dataclass(frozen=True)
class Submitted:
    """A submission's answer; `duplicate` means the key named a task that already existed."""

    id: int
    duplicate: bool
    result: Result | None = None


@dataclass(frozen=True)
class TaskInfo:
    """The state of one task; times are Unix seconds, None where the server has none."""

    id: int
    status: Status
    pool: str = ""
    key: str = ""
    kind: str = ""
    attempt: int = 0
    max_attempts: int = 0
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    message: str = ""
    output_available: bool = False
    tenant: str = ""
    priority: str | None = None
    # The worker of the latest attempt; "" and 0 when unknown (a published server sends none).
    worker_name: str = ""
    worker_id: int = 0

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class TaskPage:
    """One page of `list_tasks`; pass `next_after` as `after` for the next one (None: last)."""

    tasks: tuple[TaskInfo, ...]
    next_after: int | None
    unavailable_shards: tuple[str, ...] = ()


@dataclass(frozen=True)
class SearchPage:
    """One page of `search_tasks`; `total` counts every match, not only this page's."""

    tasks: tuple[TaskInfo, ...]
    total: int
    unavailable_shards: tuple[str, ...] = ()


@dataclass(frozen=True)
class BulkResult:
    """What a `bulk` action covered: the tasks matched, and those it applied (or, in a dry
    run, would apply) to."""

    matched: int
    affected: int
    unavailable_shards: tuple[str, ...] = ()


@dataclass(frozen=True)
class PoolControl:
    """A pool's state after `pause_pool` or `resume_pool`; `changed` is False when it already
    was in that state."""

    pool: str
    paused: bool
    changed: bool


@dataclass(frozen=True)
class Event:
    """One status change from `watch`; `at` is Unix seconds."""

    id: int
    pool: str
    key: str
    status: Status
    attempt: int
    at: float
    message: str


@dataclass(frozen=True)
class WorkerInfo:
    """One connected remote worker; `slots` is what the server granted."""

    id: int
    name: str
    pool: str
    labels: dict[str, str]
    slots: int
    busy: int
    connected_at: float


@dataclass(frozen=True)
class RecurringInfo:
    """One recurring schedule; an empty `tz` means UTC."""

    name: str
    cron: str
    tz: str
    pool: str
    kind: str
    overlap: str
    next_at: float | None
    last_task_id: int | None


@dataclass(frozen=True)
class WorkerGroup:
    """The connected workers of a pool that share one label set."""

    labels: Mapping[str, str]
    capacity: int
    busy: int


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool in a server snapshot (not the library's `cronoq.PoolSnapshot`)."""

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending_by_class: tuple[int, ...]
    reservations: int
    dispatched: int
    succeeded: int
    failed: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    cost: float
    workers_connected: int = 0
    groups: tuple[WorkerGroup, ...] = ()
    # Paused by an operator; tasks waiting with no capacity to take them. Both False from a
    # published server, which has neither.
    paused: bool = False
    unserved: bool = False

    @property
    def pending(self) -> int:
        return sum(self.pending_by_class)


@dataclass(frozen=True)
class Totals:
    """Counters kept by the current leader since it started."""

    submitted: int = 0
    dispatched: int = 0
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    skipped: int = 0
    missed: int = 0
    shed: int = 0
    retries: int = 0
    timeouts: int = 0
    lease_expiries: int = 0
    stale_completions: int = 0


@dataclass(frozen=True)
class Snapshot:
    """A server snapshot (not the library's `cronoq.Snapshot`)."""

    pools: tuple[PoolSnapshot, ...]
    live_tasks: int
    running: int
    pending: int
    totals: Totals = field(default_factory=Totals)
    workers_connected: int = 0
    unavailable_shards: tuple[str, ...] = ()

    def pool(self, name: str) -> PoolSnapshot | None:
        return next((p for p in self.pools if p.name == name), None)


class TaskFilter(TypedDict, total=False):
    """The filter of `search_tasks` and `bulk`: every keyword given must match; a sequence
    matches any of its values. Times are datetimes or Unix seconds."""

    pools: Sequence[str]
    statuses: Sequence[str]
    kinds: Sequence[str]
    tags: Mapping[str, str]
    key: str
    key_prefix: str
    submitted_after: datetime | float | None
    submitted_before: datetime | float | None
    ids: Sequence[int]


# --- task() -------------------------------------------------------------------------------------


class TaskOptions(TypedDict, total=False):
    """`task()`'s options (also `Client.submit`'s), for a type checker: a misspelled name or a
    value outside a vocabulary (`priority="urgent"`) is its error; task() checks them at run
    time."""

    pool: str | None
    kind: str | None
    priority: int | PriorityName | None
    key: str | None
    deadline_in: float | None
    deadline_at: datetime | float | None
    start_in: float | None
    start_at: datetime | float | None
    tolerance: float | None
    on_miss: MissPolicy | None
    duration_hint: float | None
    timeout: float | None
    retry: Any
    after: TaskRef | Iterable[TaskRef] | None
    deps: Iterable[tuple[TaskRef, DepCondition] | Mapping[str, Any]]
    resources: Mapping[str, int] | None
    tags: Mapping[str, str] | None
    labels: Mapping[str, str] | None
    tenant: str | None
    content_type: str | None


def task(
    payload: Payload = None,
    *,
    pool: str | None = None,
    kind: str | None = None,
    priority: int | PriorityName | None = None,
    key: str | None = None,
    deadline_in: float | None = None,
    deadline_at: datetime | float | None = None,
    start_in: float | None = None,
    start_at: datetime | float | None = None,
    tolerance: float | None = None,
    on_miss: MissPolicy | None = None,
    duration_hint: float | None = None,
    timeout: float | None = None,
    retry: Any = None,
    after: TaskRef | Iterable[TaskRef] | None = None,
    deps: Iterable[tuple[TaskRef, DepCondition] | Mapping[str, Any]] = (),
    resources: Mapping[str, int] | None = None,
    tags: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    tenant: str | None = None,
    content_type: str | None = None,
) -> pb.TaskSpec:
    """A wire TaskSpec for `submit_batch` and `add_recurring`; contacts nothing (docs/client.md,
    "`task()` options").

    PRIORITY_NORMAL is always sent explicitly. Zero values count as given.
    """
    if deadline_in is not None and deadline_at is not None:
        raise ValueError("give deadline_in or deadline_at, not both")
    if start_in is not None and start_at is not None:
        raise ValueError("give start_in or start_at, not both")
    data, media_type = encode_payload(payload, content_type)
    spec = pb.TaskSpec(
        payload=data,
        content_type=media_type,
        kind=kind or "",
        pool=pool or "",
        key=key or "",
        tenant=tenant or "",
        priority=_priority(priority),
    )
    if deadline_in is not None:
        spec.deadline_in_s = float(deadline_in)
    if deadline_at is not None:
        spec.deadline_unix_ns = _unix_ns(deadline_at)
    if start_in is not None:
        spec.start_in_s = float(start_in)
    if start_at is not None:
        spec.start_unix_ns = _unix_ns(start_at)
    if tolerance is not None:
        spec.tolerance_s = float(tolerance)
    if on_miss:  # "" is "not given", like None
        if on_miss not in _MISS:
            raise ValueError(f"unknown on_miss policy {on_miss!r}; expected one of {list(_MISS)}")
        spec.on_miss = _MISS[on_miss]
    if duration_hint is not None:
        spec.duration_hint_s = float(duration_hint)
    if timeout is not None:
        spec.timeout_s = float(timeout)
    if retry is not None:
        spec.retry.CopyFrom(_retry(retry))
    if after is not None:
        refs = [after] if isinstance(after, str | int) else list(after)
        spec.deps.extend(pb.Dep(target=_ref(r), cond=pb.EDGE_COND_ON_SUCCESS) for r in refs)
    spec.deps.extend(_dep(entry) for entry in deps)
    for name, amount in (resources or {}).items():
        spec.resources[name] = int(amount)
    for k, v in (tags or {}).items():
        spec.tags[k] = str(v)
    for k, v in (labels or {}).items():
        spec.labels[k] = str(v)
    return spec


def _priority(value: Any) -> pb.Priority:
    if value is None:
        return pb.PRIORITY_NORMAL
    if isinstance(value, str):
        try:
            return _PRIORITIES[value.lower()]
        except KeyError:
            raise ValueError(f"unknown priority {value!r}") from None
    index = int(value)
    if not 0 <= index < len(_PRIORITY_BY_INDEX):
        raise ValueError(f"priority index must be 0..3 (critical..low), got {value!r}")
    return _PRIORITY_BY_INDEX[index]


def _unix_ns(at: datetime | float) -> int:
    """Truncates exactly as the published client does, so both send bit-identical times."""
    seconds = at.timestamp() if isinstance(at, datetime) else float(at)
    return int(seconds * 1e9)


def _retry(policy: Any) -> pb.RetryPolicy:
    """From a mapping (by key) or any object (by attribute), e.g. `cronoq.RetryPolicy`."""
    if isinstance(policy, Mapping):
        get: Callable[[str, Any], Any] = policy.get
    else:

        def get(name: str, default: Any) -> Any:
            return getattr(policy, name, default)

    msg = pb.RetryPolicy(max_attempts=int(get("max_attempts", 3)), jitter=bool(get("jitter", True)))
    for wire, source in _RETRY_FIELDS:
        setattr(msg, wire, float(get(source, 0.0) or 0.0))
    return msg


def _ref(ref: TaskRef) -> pb.TaskRef:
    if isinstance(ref, bool) or not isinstance(ref, int | str):
        raise TypeError(f"a task reference must be an id or a key, not {type(ref).__name__}")
    return pb.TaskRef(key=ref) if isinstance(ref, str) else pb.TaskRef(id=ref)


def _dep(entry: tuple[TaskRef, str] | Mapping[str, Any]) -> pb.Dep:
    if isinstance(entry, Mapping):
        ref, cond = entry["ref"], entry.get("cond", "on_success")
    else:
        ref, cond = entry
    if cond not in _CONDS:
        raise ValueError(f"unknown dependency condition {cond!r}; expected one of {list(_CONDS)}")
    return pb.Dep(target=_ref(ref), cond=_CONDS[cond])


# --- reading responses --------------------------------------------------------------------------


def _status(value: int) -> Status:
    return cast("Status", enum_name(pb.TaskStatus, value, "TASK_STATUS_"))


def _seconds(msg: Any, name: str) -> float | None:
    return getattr(msg, name) / 1e9 if msg.HasField(name) else None


def _result(r: pb.TaskResult) -> Result:
    output = r.output if r.HasField("output") else None
    return Result(r.id, _status(r.status), output, r.message, r.output_available)


def _task_info(t: pb.TaskInfo) -> TaskInfo:
    return TaskInfo(
        id=t.id,
        status=_status(t.status),
        pool=t.pool,
        key=t.key,
        kind=t.kind,
        attempt=t.attempt,
        max_attempts=t.max_attempts,
        created_at=_seconds(t, "created_unix_ns"),
        started_at=_seconds(t, "started_unix_ns"),
        finished_at=_seconds(t, "finished_unix_ns"),
        message=t.message,
        output_available=t.output_available,
        tenant=t.tenant,
        priority=priority_name(t.priority),
        worker_name=t.worker_name,
        worker_id=t.worker_id,
    )


def _event(e: pb.StatusEvent) -> Event:
    return Event(e.id, e.pool, e.key, _status(e.status), e.attempt, e.at_unix_ns / 1e9, e.message)


def _pool_snapshot(p: pb.PoolSnapshot) -> PoolSnapshot:
    return PoolSnapshot(
        name=p.name,
        capacity=p.capacity,
        busy=p.busy,
        held=p.held,
        desired=p.desired,
        pending_by_class=tuple(p.pending_by_class),
        reservations=p.reservations,
        dispatched=p.dispatched,
        succeeded=p.succeeded,
        failed=p.failed,
        priority_adherence=p.priority_adherence,
        fixed_start_hit_rate=p.fixed_start_hit_rate,
        utilization=p.utilization,
        schedule_efficiency=p.schedule_efficiency,
        wait_p50=p.wait_p50_s,
        wait_p90=p.wait_p90_s,
        wait_p99=p.wait_p99_s,
        cost=p.cost,
        workers_connected=p.workers_connected,
        groups=tuple(WorkerGroup(dict(g.labels), g.capacity, g.busy) for g in p.groups),
        paused=p.paused,
        unserved=p.unserved,
    )


def _snapshot(s: pb.SnapshotResponse) -> Snapshot:
    # An unset `totals` reads as all zeros, which is exactly Totals().
    totals = Totals(**{f.name: getattr(s.totals, f.name) for f in fields(Totals)})
    return Snapshot(
        pools=tuple(_pool_snapshot(p) for p in s.pools),
        live_tasks=s.live_tasks,
        running=s.running,
        pending=s.pending,
        totals=totals,
        workers_connected=s.workers_connected,
        unavailable_shards=tuple(s.unavailable_shards),
    )


def _worker_info(w: pb.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(
        w.id, w.name, w.pool, dict(w.labels), w.slots, w.busy, w.connected_unix_ns / 1e9
    )


def _recurring_info(r: pb.RecurringInfo) -> RecurringInfo:
    overlap = r.overlap or pb.OVERLAP_SKIP  # UNSPECIFIED means SKIP on the server
    return RecurringInfo(
        name=r.name,
        cron=r.cron,
        tz=r.tz,
        pool=r.pool,
        kind=r.kind,
        overlap=enum_name(pb.Overlap, overlap, "OVERLAP_"),
        next_at=_seconds(r, "next_unix_ns"),
        last_task_id=r.last_task_id if r.HasField("last_task_id") else None,
    )


def _statuses(statuses: Sequence[str]) -> list[pb.TaskStatus]:
    """Status names (any case) as enum numbers; `unspecified` is no status to filter by."""
    out = []
    for name in statuses:
        try:
            value = pb.TaskStatus.Value("TASK_STATUS_" + name.upper())
        except ValueError:
            value = pb.TASK_STATUS_UNSPECIFIED
        if value == pb.TASK_STATUS_UNSPECIFIED:
            raise ValueError(f"unknown task status {name!r}")
        out.append(value)
    return out


def _task_filter(f: TaskFilter) -> pb.TaskFilter:
    """The wire filter; a single string where a sequence goes raises TypeError (`pools="a"`
    would otherwise match pools named by its letters)."""
    names = ("pools", "statuses", "kinds")
    if any(isinstance(f.get(name), str) for name in names):
        raise TypeError("pools, statuses and kinds must be sequences of names, not one string")
    msg = pb.TaskFilter(
        pools=list(f.get("pools", ())),
        statuses=_statuses(f.get("statuses", ())),
        kinds=list(f.get("kinds", ())),
        key=f.get("key", ""),
        key_prefix=f.get("key_prefix", ""),
        ids=[int(i) for i in f.get("ids", ())],
    )
    for k, v in f.get("tags", {}).items():
        msg.tags[k] = str(v)
    after, before = f.get("submitted_after"), f.get("submitted_before")
    if after is not None:
        msg.submitted_after_unix_ns = _unix_ns(after)
    if before is not None:
        msg.submitted_before_unix_ns = _unix_ns(before)
    return msg


def _choice(table: Mapping[str, Any], value: str, what: str) -> Any:
    try:
        return table[value.lower()]
    except KeyError:
        raise ValueError(f"unknown {what} {value!r}; expected one of {list(table)}") from None


def _is_timeout(e: grpc.aio.AioRpcError) -> bool:
    code = e.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    return code == grpc.StatusCode.CANCELLED and "timeout expired" in (e.details() or "").lower()


# --- the client ---------------------------------------------------------------------------------


class _Stubs(NamedTuple):
    tasks: Any
    admin: Any
    operations: Any


class Client:
    """Talks to `cronoq-server` over gRPC; one instance may serve many calls at once.

    Nothing connects in the constructor. The channel opens on first use inside the running
    event loop, and a new one opens when the client is used from another loop (gRPC channels
    are bound to the loop that made them).
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        self.target = target
        self._tls = tls
        self._credentials = credentials
        self._options = options
        self._metadata = metadata(token)
        self._channel: grpc.aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stub_pair: _Stubs | None = None

    def __repr__(self) -> str:
        return f"Client({self.target!r})"

    # --- channel ---------------------------------------------------------------------------

    def _stubs(self) -> _Stubs:
        loop = asyncio.get_running_loop()
        if self._stub_pair is None or self._loop is not loop:
            # A channel of another loop cannot be closed from this one; it is just dropped.
            self._channel = open_channel(
                self.target, tls=self._tls, credentials=self._credentials, options=self._options
            )
            self._loop = loop
            # The generated stubs carry no annotations; the calls below are typed by hand.
            tasks = cronoq_pb2_grpc.TasksStub(self._channel)  # type: ignore[no-untyped-call]
            admin = cronoq_pb2_grpc.AdminStub(self._channel)  # type: ignore[no-untyped-call]
            operations = cronoq_pb2_grpc.OperationsStub(self._channel)  # type: ignore[no-untyped-call]
            self._stub_pair = _Stubs(tasks, admin, operations)
            log.debug("channel opened to %s", self.target)
        return self._stub_pair

    async def __aenter__(self) -> Client:
        self._stubs()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; a later call opens a new one. Calling it again does nothing."""
        channel, loop = self._channel, self._loop
        self._channel = self._loop = self._stub_pair = None
        if channel is not None and loop is asyncio.get_running_loop():
            await channel.close()

    async def _unary(
        self,
        method: Callable[..., Awaitable[Any]],
        request: Any,
        *,
        timeout: float | None = None,
        timeout_message: str | None = None,
    ) -> Any:
        """One unary call with the error mapping of docs/client.md, "Errors" (no gRPC error
        chained)."""
        try:
            return await method(request, metadata=self._metadata, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if _is_timeout(e):
                message = timeout_message or e.details() or "no response within the timeout"
                raise TimeoutError(message) from None
            raise ClientError.from_rpc(e) from None

    # --- Tasks -----------------------------------------------------------------------------

    async def submit(
        self,
        payload: Payload = None,
        *,
        wait: bool = False,
        wait_timeout: float | None = None,
        call_timeout: float | None = None,
        **opts: Unpack[TaskOptions],
    ) -> Submitted:
        """Submit one task (`opts` are `task()`'s); with `wait=True`, answer once it ended.

        `call_timeout` bounds the RPC; without it a bounded wait gets `wait_timeout` + 5 s.
        """
        spec = task(payload, **opts)
        if wait_timeout is not None and not wait:
            raise ValueError("wait_timeout requires wait=True")
        request = pb.SubmitRequest(task=spec, wait=wait)
        deadline = call_timeout
        if wait_timeout is not None:
            request.wait_timeout_s = float(wait_timeout)
            if deadline is None:
                deadline = wait_timeout + WAIT_MARGIN
        call = self._stubs().tasks.Submit
        traced = tracer()
        if traced is None:
            resp: pb.SubmitResponse = await self._unary(call, request, timeout=deadline)
        else:
            with traced.submit(spec.pool, spec.kind) as span:
                traced.fill(request.task.tags)  # (the request holds a copy of `spec`)
                resp = await self._unary(call, request, timeout=deadline)
                span.set_attribute(ATTR_TASK_ID, resp.id)
        result = _result(resp.result) if resp.HasField("result") else None
        return Submitted(resp.id, resp.duplicate, result)

    async def submit_batch(self, tasks: Sequence[pb.TaskSpec]) -> list[Submitted]:
        """Submit specs built with `task()` all or none; they may name each other's keys."""
        request = pb.SubmitBatchRequest(tasks=list(tasks))
        call = self._stubs().tasks.SubmitBatch
        traced = tracer()
        if traced is None:
            resp: pb.SubmitBatchResponse = await self._unary(call, request)
        else:
            with traced.submit(None, None, len(request.tasks)):
                for spec in request.tasks:
                    traced.fill(spec.tags)
                resp = await self._unary(call, request)
        return [Submitted(r.id, r.duplicate) for r in resp.tasks]

    async def cancel(self, ref: TaskRef) -> bool:
        """Cancel a task by id or key; False when it had already ended."""
        request = pb.CancelRequest(task=_ref(ref))
        resp: pb.CancelResponse = await self._unary(self._stubs().tasks.Cancel, request)
        return resp.cancelled

    async def get(self, ref: TaskRef) -> TaskInfo:
        request = pb.GetRequest(task=_ref(ref))
        resp: pb.TaskInfo = await self._unary(self._stubs().tasks.Get, request)
        return _task_info(resp)

    async def list_tasks(
        self,
        *,
        pools: Sequence[str] = (),
        statuses: Sequence[str] = (),
        after: int = 0,
        limit: int = 0,
    ) -> TaskPage:
        """One page of tasks in id order; `limit=0` lets the server choose the page size."""
        if isinstance(pools, str) or isinstance(statuses, str):
            raise TypeError("pools and statuses must be sequences of names, not one string")
        request = pb.ListTasksRequest(
            pools=list(pools), statuses=_statuses(statuses), after=after, limit=limit
        )
        resp: pb.ListTasksResponse = await self._unary(self._stubs().tasks.ListTasks, request)
        return TaskPage(
            tuple(_task_info(t) for t in resp.tasks),
            resp.next_after or None,
            tuple(resp.unavailable_shards),
        )

    async def iter_tasks(
        self, *, pools: Sequence[str] = (), statuses: Sequence[str] = (), page_size: int = 0
    ) -> AsyncIterator[TaskInfo]:
        """Every matching task, page by page (`async for`, no await)."""
        after = 0
        while True:
            page = await self.list_tasks(
                pools=pools, statuses=statuses, after=after, limit=page_size
            )
            for info in page.tasks:
                yield info
            if page.next_after is None:
                return
            after = page.next_after

    async def wait(self, ref: TaskRef, timeout: float | None = None) -> Result:
        """The task's end; TimeoutError if it has not ended after `timeout` seconds.

        The task keeps running after a timeout.
        """
        request = pb.WaitRequest(task=_ref(ref))
        deadline = None
        message = None
        if timeout is not None:
            request.timeout_s = float(timeout)
            deadline = timeout + WAIT_MARGIN
            message = f"task {ref!r} has not ended after {timeout} s"
        resp: pb.TaskResult = await self._unary(
            self._stubs().tasks.Wait, request, timeout=deadline, timeout_message=message
        )
        return _result(resp)

    async def watch(
        self,
        pools: Iterable[str] | None = None,
        *,
        ids: Iterable[int] | None = None,
        keys: Iterable[str] | None = None,
        all_transitions: bool = False,
    ) -> AsyncIterator[Event]:
        """Status events from now on (`async for`, no await); only terminal ones by default.

        A server that cancels the stream just ends it; leaving the loop cancels the RPC.
        """
        request = pb.WatchRequest(
            pools=list(pools or []),
            ids=[int(i) for i in ids or []],
            keys=list(keys or []),
            all_transitions=all_transitions,
        )
        call = self._stubs().tasks.Watch(request, metadata=self._metadata)
        try:
            async for msg in call:
                yield _event(msg)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise ClientError.from_rpc(e) from None
        finally:
            call.cancel()

    # --- Admin -----------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """The server's pools, counters and totals (needs a metrics or admin token)."""
        resp: pb.SnapshotResponse = await self._unary(self._stubs().admin.Snapshot, pb.Empty())
        return _snapshot(resp)

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: Payload | pb.TaskSpec = None,
        *,
        tz: str | None = None,
        overlap: Overlap = "skip",
        **opts: Any,
    ) -> None:
        """Add or replace the schedule `name`, submitting a task at each `cron` occurrence.

        The template is `task(payload, **opts)`, or `payload` itself when it is a TaskSpec.
        """
        if isinstance(payload, pb.TaskSpec):
            if opts:
                raise TypeError("task options cannot be combined with a prebuilt TaskSpec")
            template = payload
        else:
            template = task(payload, **opts)
        if overlap not in _OVERLAPS:
            raise ValueError(f"unknown overlap {overlap!r}; expected one of {list(_OVERLAPS)}")
        request = pb.RecurringRequest(
            name=name, cron=cron, tz=tz or "", template=template, overlap=_OVERLAPS[overlap]
        )
        await self._unary(self._stubs().admin.AddRecurring, request)

    async def remove_recurring(self, name: str) -> bool:
        """Remove the schedule `name`; False when there was none."""
        request = pb.RemoveRecurringRequest(name=name)
        resp: pb.RemoveRecurringResponse = await self._unary(
            self._stubs().admin.RemoveRecurring, request
        )
        return resp.removed

    async def list_workers(self) -> list[WorkerInfo]:
        resp: pb.ListWorkersResponse = await self._unary(
            self._stubs().admin.ListWorkers, pb.Empty()
        )
        return [_worker_info(w) for w in resp.workers]

    async def list_recurring(self) -> list[RecurringInfo]:
        resp: pb.ListRecurringResponse = await self._unary(
            self._stubs().admin.ListRecurring, pb.Empty()
        )
        return [_recurring_info(r) for r in resp.schedules]

    # --- Operations (this server's additions to the published protocol) -------------------

    async def pause_pool(self, pool: str) -> PoolControl:
        """Start nothing new in `pool` until `resume_pool`; submits are still accepted and
        running attempts finish (needs an admin token)."""
        resp: pb.PoolControlResponse = await self._unary(
            self._stubs().operations.PausePool, pb.PoolRequest(pool=pool)
        )
        return PoolControl(resp.pool, resp.paused, resp.changed)

    async def resume_pool(self, pool: str) -> PoolControl:
        """Let `pool` start tasks again (needs an admin token)."""
        resp: pb.PoolControlResponse = await self._unary(
            self._stubs().operations.ResumePool, pb.PoolRequest(pool=pool)
        )
        return PoolControl(resp.pool, resp.paused, resp.changed)

    async def drain_pool(
        self,
        pool: str,
        timeout: float | None = None,
        *,
        poll: float = 0.5,
        on_wait: Callable[[int], object] | None = None,
    ) -> bool:
        """Pause `pool`, then wait until none of its attempts runs; False if some still run
        after `timeout` seconds. The pool stays paused either way.

        The server has no call that waits for this, so the pool's snapshot is read every
        `poll` seconds (it needs a token that may read snapshots: admin); `on_wait` gets the
        number of attempts still running each time there are some.
        """
        await self.pause_pool(pool)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            found = (await self.snapshot()).pool(pool)
            busy = 0 if found is None else found.busy
            if found is not None and busy == 0:
                return True
            if on_wait is not None:
                on_wait(busy)
            if deadline is not None and loop.time() + poll > deadline:
                return False
            await asyncio.sleep(poll)

    async def search_tasks(
        self,
        *,
        sort: str = "id",
        ascending: bool = False,
        limit: int = 0,
        offset: int = 0,
        **filters: Unpack[TaskFilter],
    ) -> SearchPage:
        """One page of the tasks matching `filters`, newest (largest) first unless
        `ascending`; `sort` is one of SORTS, `limit=0` lets the server choose the page size."""
        request = pb.SearchTasksRequest(
            filter=_task_filter(filters),
            sort=_choice(_SORT_VALUES, sort, "sort"),
            ascending=ascending,
            limit=limit,
            offset=offset,
        )
        resp: pb.SearchTasksResponse = await self._unary(
            self._stubs().operations.SearchTasks, request
        )
        return SearchPage(
            tuple(_task_info(t) for t in resp.tasks), resp.total, tuple(resp.unavailable_shards)
        )

    async def bulk(
        self, action: str, *, dry_run: bool = False, **filters: Unpack[TaskFilter]
    ) -> BulkResult:
        """Cancel the live tasks, retry (submit a copy of) the failed, dead-lettered or
        cancelled ones, or delete the ended ones among those matching `filters`; with
        `dry_run`, only count them. An empty filter matches every task (needs an admin
        token)."""
        request = pb.BulkRequest(
            action=_choice(_BULK_VALUES, action, "bulk action"),
            filter=_task_filter(filters),
            dry_run=dry_run,
        )
        resp: pb.BulkResponse = await self._unary(self._stubs().operations.BulkTasks, request)
        return BulkResult(resp.matched, resp.affected, tuple(resp.unavailable_shards))
