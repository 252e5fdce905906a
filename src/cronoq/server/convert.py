"""Protobuf messages <-> cronoq values: the one place where the wire and the library meet.

Inbound, every field a client sends is checked here against docs/server-api.md, "Input rules" and
the `[limits]` before anything reaches the scheduler, and a refusal is an `InvalidArgument` naming
the field path (`tasks[3].tags["cronoq.x"]`) and the rule, which the services turn into
INVALID_ARGUMENT (`TooLarge`: OUT_OF_RANGE). What the library checks again (unknown pools,
resources and dependencies, cycles) is left to it, so the two can never disagree. Outbound,
records, events and snapshots become their messages; times go on the wire as Unix nanoseconds.

Payloads and outputs are bytes. A payload's content type travels as the reserved task tag
`cronoq.content_type`, which is why client tags may not start with `cronoq.`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, get_args

from cronoq._options import Dep
from cronoq.core.cron import CronError, parse_cron, zone
from cronoq.core.model import (
    DEFAULT_RETRY,
    FIRST_TERMINAL,
    STATUS_NAMES,
    SUCCEEDED,
    PoolSnapshot,
    RetryPolicy,
    Snapshot,
    StatusEvent,
    TaskRecord,
)
from cronoq.core.recurring import Recurring
from cronoq.core.search import Sort, TaskFilter
from cronoq.core.vocab import MISS_POLICIES, OVERLAPS, DepOn, MissPolicy, Overlap
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.config import LimitsSettings
from cronoq.server.config.settings import MAX_MULTIPLIER

__all__ = [
    "CONTENT_TYPE_TAG",
    "InvalidArgument",
    "RecurringArgs",
    "TooLarge",
    "check_duration",
    "check_name",
    "edge_from_pb",
    "edge_to_pb",
    "event_to_pb",
    "from_ns",
    "is_occurrence_key",
    "miss_from_pb",
    "miss_to_pb",
    "output_bytes",
    "overlap_from_pb",
    "overlap_to_pb",
    "priority_from_pb",
    "priority_to_pb",
    "recurring_from_pb",
    "recurring_to_pb",
    "snapshot_to_pb",
    "sort_from_pb",
    "spec_to_task",
    "status_from_pb",
    "status_to_pb",
    "task_filter",
    "task_info",
    "task_ref",
    "task_result",
    "to_ns",
]

CONTENT_TYPE_TAG = "cronoq.content_type"
RESERVED_PREFIX = "cronoq."
# docs/reference/limits.md, "Fixed limits":
MAX_CONTENT_TYPE = 128  # bytes
MAX_SCHEDULE_TEXT = 256  # recurring name and cron expression, in characters
MAX_SECONDS = 100 * 365 * 86_400.0  # the longest duration a client may send


class InvalidArgument(ValueError):
    """A field breaks a rule; `field` is its path in the request, `rule` what it must be."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class TooLarge(InvalidArgument):
    """A payload over `limits.max_message_bytes`: OUT_OF_RANGE, like a request message over
    that limit (docs/reference/errors.md, "gRPC status codes"). Over gRPC the request is refused
    before this check can see it; over HTTP, whose body limit is another, it is this check."""


# --- enums -------------------------------------------------------------------------------------

# Indexed by the core's class number (CRITICAL 0 .. LOW 3).
_CLASSES: tuple[pb.Priority, ...] = (
    pb.PRIORITY_CRITICAL,
    pb.PRIORITY_HIGH,
    pb.PRIORITY_NORMAL,
    pb.PRIORITY_LOW,
)
# Indexed by the core's status number (BLOCKED 0 .. SHED 11); the wire numbers are one higher.
_STATUSES: tuple[pb.TaskStatus, ...] = tuple(
    pb.TaskStatus.Value(f"TASK_STATUS_{name.upper()}") for name in STATUS_NAMES
)
_STATUS_BY_NAME = dict(zip(STATUS_NAMES, _STATUSES, strict=True))

_N = TypeVar("_N", bound=str)


def _wire_names(
    value: Callable[[str], int], prefix: str, names: Sequence[_N], default: _N
) -> tuple[dict[int, _N], dict[_N, Any]]:
    """A wire enum beside the vocabulary's names (`on_miss` "run_late" is MISS_POLICY_RUN_LATE):
    number to name, UNSPECIFIED (0) meaning `default`, and name to number."""
    to_pb = {name: value(f"{prefix}{name.upper()}") for name in names}
    from_pb = {number: name for name, number in to_pb.items()}
    from_pb[0] = default
    return from_pb, to_pb


_EDGES, _EDGES_PB = _wire_names(pb.EdgeCond.Value, "EDGE_COND_ON_", get_args(DepOn), "success")
_MISSES, _MISSES_PB = _wire_names(pb.MissPolicy.Value, "MISS_POLICY_", MISS_POLICIES, "run_late")
_OVERLAPS, _OVERLAPS_PB = _wire_names(pb.Overlap.Value, "OVERLAP_", OVERLAPS, "skip")


def _enum(table: Mapping[int, Any], value: int, field: str) -> Any:
    """Look a wire enum value up; a number this server does not know is a client error (proto3
    keeps unknown enum numbers as plain ints)."""
    try:
        return table[value]
    except KeyError:
        raise InvalidArgument(field, f"unknown enum value {value}") from None


def priority_from_pb(value: int, field: str = "priority") -> int:
    """The core's class number; UNSPECIFIED means NORMAL."""
    if value == pb.PRIORITY_UNSPECIFIED:
        return 2
    if pb.PRIORITY_CRITICAL <= value <= pb.PRIORITY_LOW:
        return value - 1
    raise InvalidArgument(field, f"unknown enum value {value}")


def priority_to_pb(cls: int) -> pb.Priority:
    return _CLASSES[cls]


def status_from_pb(value: int, field: str = "status") -> int:
    """The core's status number; UNSPECIFIED names no status, so it is refused like any
    unknown value."""
    if pb.TASK_STATUS_BLOCKED <= value <= pb.TASK_STATUS_SHED:
        return value - 1
    raise InvalidArgument(field, f"unknown enum value {value}")


# TaskSort by number; UNSPECIFIED is by id.
_SORTS: dict[int, Sort] = {
    pb.TASK_SORT_UNSPECIFIED: "id",
    **{pb.TaskSort.Value(f"TASK_SORT_{name.upper()}"): name for name in get_args(Sort)},
}


def sort_from_pb(value: int, field: str = "sort") -> Sort:
    result: Sort = _enum(_SORTS, value, field)
    return result


def status_to_pb(status: int | str) -> pb.TaskStatus:
    """From the core's status number or its name (events carry names)."""
    return _STATUS_BY_NAME[status] if isinstance(status, str) else _STATUSES[status]


def edge_from_pb(value: int, field: str = "cond") -> DepOn:
    result: DepOn = _enum(_EDGES, value, field)
    return result


def edge_to_pb(on: DepOn) -> pb.EdgeCond:
    result: pb.EdgeCond = _EDGES_PB[on]
    return result


def miss_from_pb(value: int, field: str = "on_miss") -> MissPolicy:
    result: MissPolicy = _enum(_MISSES, value, field)
    return result


def miss_to_pb(policy: MissPolicy) -> pb.MissPolicy:
    result: pb.MissPolicy = _MISSES_PB[policy]
    return result


def overlap_from_pb(value: int, field: str = "overlap") -> Overlap:
    result: Overlap = _enum(_OVERLAPS, value, field)
    return result


def overlap_to_pb(overlap: Overlap) -> pb.Overlap:
    result: pb.Overlap = _OVERLAPS_PB[overlap]
    return result


# --- times -------------------------------------------------------------------------------------


def to_ns(t: float) -> int:
    """Unix seconds (the library's clock) to Unix nanoseconds (the wire's)."""
    return round(t * 1e9)


def from_ns(ns: int) -> float:
    return ns / 1e9


# --- scalar checks -----------------------------------------------------------------------------


def check_name(field: str, value: str, max_bytes: int | None = None) -> str:
    """A string a client sent: no NUL (stores cannot keep it), at most `max_bytes` in UTF-8."""
    if "\0" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    if max_bytes is not None and len(value.encode()) > max_bytes:
        raise InvalidArgument(field, f"must be at most {max_bytes} bytes")
    return value


def check_duration(field: str, value: float) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= MAX_SECONDS):
        raise InvalidArgument(
            field, f"invalid duration {value!r}: must be finite and within [0, 100 years]"
        )
    return value


def task_ref(ref: pb.TaskRef, limits: LimitsSettings, field: str = "task") -> int | str:
    """A task id (>= 1) or key; an empty reference names nothing and is refused."""
    which = ref.WhichOneof("target")
    if which == "id":
        if ref.id == 0:
            raise InvalidArgument(f"{field}.id", "must be >= 1")
        return ref.id
    if which == "key":
        if not ref.key:
            raise InvalidArgument(f"{field}.key", "must not be empty")
        return check_name(f"{field}.key", ref.key, limits.max_key_len)
    raise InvalidArgument(field, "must name a task by id or key")


def task_filter(msg: pb.TaskFilter, limits: LimitsSettings, field: str = "filter") -> TaskFilter:
    """A search's or bulk action's filter; `pools` is None when it names none (the services
    then narrow it to the caller's pools)."""
    pools = {check_name(f"{field}.pools[{i}]", p) for i, p in enumerate(msg.pools)}
    statuses = {status_from_pb(s, f"{field}.statuses[{i}]") for i, s in enumerate(msg.statuses)}
    kinds = {
        check_name(f"{field}.kinds[{i}]", k, limits.max_kind_len) for i, k in enumerate(msg.kinds)
    }
    tags = {
        check_name(f"{field}.tags", k, limits.max_tag_len): check_name(
            f"{field}.tags[{k!r}]", v, limits.max_tag_len
        )
        for k, v in msg.tags.items()
    }
    return TaskFilter(
        pools=frozenset(pools) or None,
        statuses=frozenset(statuses),
        kinds=frozenset(kinds),
        tags=tags,
        key=check_name(f"{field}.key", msg.key, limits.max_key_len) if msg.key else None,
        key_prefix=check_name(f"{field}.key_prefix", msg.key_prefix, limits.max_key_len) or None,
        submitted_after=(
            from_ns(msg.submitted_after_unix_ns)
            if msg.HasField("submitted_after_unix_ns")
            else None
        ),
        submitted_before=(
            from_ns(msg.submitted_before_unix_ns)
            if msg.HasField("submitted_before_unix_ns")
            else None
        ),
        ids=frozenset(msg.ids),
    )


# --- TaskSpec -> submit() options --------------------------------------------------------------


# The key of a recurring occurrence ends with `@` and its UTC start to the second (core.recurring,
# `occurrence_key`): a key whose part after its last `@` has exactly that form is reserved.
_OCCURRENCE_SUFFIX = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


def is_occurrence_key(key: str) -> bool:
    """Has `key` the form of a recurring occurrence's key (`<prefix>@2025-06-01T09:30:00Z`)?"""
    _, at, suffix = key.rpartition("@")
    return bool(at) and _OCCURRENCE_SUFFIX.fullmatch(suffix) is not None


def spec_to_task(
    spec: pb.TaskSpec,
    limits: LimitsSettings,
    *,
    field: str = "task",
    template: bool = False,
) -> tuple[bytes, dict[str, Any]]:
    """The payload and the `Scheduler.submit()` options of one spec.

    A `template` (of a recurring schedule) is a spec whose occurrences the server submits: its
    key is their prefix, and each occurrence is a fixed start, so the rules of a task a client
    submits itself (a reserved key, `tolerance_s` without a start) do not apply to it.
    """
    if len(spec.payload) > limits.max_message_bytes:
        raise TooLarge(
            f"{field}.payload", f"must be at most max_message_bytes={limits.max_message_bytes}"
        )
    options: dict[str, Any] = {}
    if spec.pool:
        options["pool"] = check_name(f"{field}.pool", spec.pool)
    if spec.priority != pb.PRIORITY_UNSPECIFIED:
        options["priority"] = priority_from_pb(spec.priority, f"{field}.priority")
    if spec.kind:
        options["kind"] = check_name(f"{field}.kind", spec.kind, limits.max_kind_len)
    if spec.key:
        options["key"] = check_name(f"{field}.key", spec.key, limits.max_key_len)
        if not template and is_occurrence_key(spec.key):
            raise InvalidArgument(
                f"{field}.key",
                "a key ending in '@YYYY-MM-DDTHH:MM:SSZ' is reserved for the occurrences of"
                " recurring schedules",
            )
    if spec.tenant:
        options["tenant"] = check_name(f"{field}.tenant", spec.tenant, limits.max_key_len)
    _times(spec, field, options)
    if not template and "tolerance" in options and not ({"start_in", "start_at"} & options.keys()):
        raise InvalidArgument(f"{field}.tolerance_s", "tolerance_s requires a start time")
    if spec.HasField("retry"):
        options["retry"] = _retry(spec.retry, f"{field}.retry")
    if spec.deps:
        if len(spec.deps) > limits.max_deps:
            raise InvalidArgument(f"{field}.deps", f"at most max_deps={limits.max_deps} entries")
        options["deps"] = [
            Dep(
                task_ref(d.target, limits, f"{field}.deps[{i}].target"),
                edge_from_pb(d.cond, f"{field}.deps[{i}].cond"),
            )
            for i, d in enumerate(spec.deps)
        ]
    if spec.resources:
        options["resources"] = _resources(spec.resources, limits, f"{field}.resources")
    tags = _pairs(spec.tags, limits, f"{field}.tags")
    if spec.content_type:
        check_name(f"{field}.content_type", spec.content_type, MAX_CONTENT_TYPE)
        tags[CONTENT_TYPE_TAG] = spec.content_type
    if tags:
        options["tags"] = tags
    labels = _pairs(spec.labels, limits, f"{field}.labels")
    if labels:
        options["labels"] = labels
    return spec.payload, options


def _times(spec: pb.TaskSpec, field: str, options: dict[str, Any]) -> None:
    """Deadline, fixed start and durations; `*_in_s` and `*_unix_ns` exclude each other."""
    for name in ("deadline", "start"):
        relative, absolute = f"{name}_in_s", f"{name}_unix_ns"
        if spec.HasField(relative):
            if spec.HasField(absolute):
                raise InvalidArgument(
                    f"{field}.{relative}", f"{relative} and {absolute} are mutually exclusive"
                )
            value = getattr(spec, relative)
            options[f"{name}_in"] = check_duration(f"{field}.{relative}", value)
        elif spec.HasField(absolute):
            options[f"{name}_at"] = from_ns(getattr(spec, absolute))
    for wire, option in (
        ("tolerance_s", "tolerance"),
        ("duration_hint_s", "duration_hint"),
        ("timeout_s", "timeout"),
    ):
        if spec.HasField(wire):
            options[option] = check_duration(f"{field}.{wire}", getattr(spec, wire))
    if spec.on_miss != pb.MISS_POLICY_UNSPECIFIED:
        options["on_miss"] = miss_from_pb(spec.on_miss, f"{field}.on_miss")


def _retry(msg: pb.RetryPolicy, field: str) -> RetryPolicy:
    """A task's own policy (docs/server-api.md, "Input rules"): `max_attempts` 0 is one
    attempt; a backoff field or the multiplier 0 takes the library's default (1 s, 60 s, 2.0),
    not the pool's; a multiplier between 0 and 1 is 1; `jitter` is what was sent."""
    initial = check_duration(f"{field}.initial_backoff_s", msg.initial_backoff_s)
    maximum = check_duration(f"{field}.max_backoff_s", msg.max_backoff_s)
    multiplier = msg.multiplier
    if not (math.isfinite(multiplier) and 0.0 <= multiplier <= MAX_MULTIPLIER):
        raise InvalidArgument(
            f"{field}.multiplier", f"must be a finite number within [0, {MAX_MULTIPLIER:g}]"
        )
    return RetryPolicy(
        max_attempts=max(msg.max_attempts, 1),
        initial_backoff=initial or DEFAULT_RETRY.initial_backoff,
        multiplier=max(multiplier, 1.0) if multiplier else DEFAULT_RETRY.multiplier,
        max_backoff=maximum or DEFAULT_RETRY.max_backoff,
        jitter=msg.jitter,
    )


def _resources(res: Mapping[str, int], limits: LimitsSettings, field: str) -> dict[str, int]:
    if len(res) > limits.max_resources:
        raise InvalidArgument(field, f"at most max_resources={limits.max_resources} entries")
    out = {}
    for name, amount in res.items():
        check_name(f"{field}[{name!r}]", name, limits.max_key_len)
        if amount == 0:
            raise InvalidArgument(f"{field}[{name!r}]", "amount must be > 0")
        out[name] = amount
    return out


def _pairs(pairs: Mapping[str, str], limits: LimitsSettings, field: str) -> dict[str, str]:
    """Tags or labels: counted against max_tags, each key and value against max_tag_len; the
    `cronoq.` prefix is the server's own."""
    if len(pairs) > limits.max_tags:
        raise InvalidArgument(field, f"at most max_tags={limits.max_tags} entries")
    out = {}
    for k, v in pairs.items():
        where = f"{field}[{k!r}]"
        if not k:
            raise InvalidArgument(field, "keys must not be empty")
        if k.startswith(RESERVED_PREFIX):
            raise InvalidArgument(where, f"keys starting with {RESERVED_PREFIX!r} are reserved")
        check_name(where, k, limits.max_tag_len)
        check_name(where, v, limits.max_tag_len)
        out[k] = v
    return out


# --- recurring schedules -----------------------------------------------------------------------


class RecurringArgs:
    """`Scheduler.add_recurring()`'s arguments for one RecurringRequest."""

    __slots__ = ("cron", "name", "options", "payload")

    def __init__(self, name: str, cron: str, payload: bytes, options: dict[str, Any]) -> None:
        self.name = name
        self.cron = cron
        self.payload = payload
        self.options = options


def recurring_from_pb(req: pb.RecurringRequest, limits: LimitsSettings) -> RecurringArgs:
    """Check a schedule: name 1-256 characters, a cron of at most 256 that parses, a known
    zone, and a template without deps, fixed start or absolute deadline (each occurrence is
    the fixed start; `deadline_in_s` counts from it)."""
    if not 1 <= len(req.name) <= MAX_SCHEDULE_TEXT:
        raise InvalidArgument("name", f"must be 1-{MAX_SCHEDULE_TEXT} characters")
    check_name("name", req.name)
    if len(req.cron) > MAX_SCHEDULE_TEXT:
        raise InvalidArgument("cron", f"must be at most {MAX_SCHEDULE_TEXT} characters")
    check_name("cron", req.cron)
    try:
        parse_cron(req.cron)
    except CronError as e:
        raise InvalidArgument("cron", f"invalid cron expression: {e}") from None
    check_name("tz", req.tz)
    try:
        zone(req.tz or None)
    except CronError as e:
        raise InvalidArgument("tz", str(e)) from None
    tpl = req.template
    for absent in ("start_in_s", "start_unix_ns", "deadline_unix_ns"):
        if tpl.HasField(absent):
            raise InvalidArgument(f"template.{absent}", "not allowed in a recurring template")
    if tpl.deps:
        raise InvalidArgument("template.deps", "not allowed in a recurring template")
    payload, options = spec_to_task(tpl, limits, field="template", template=True)
    options["overlap"] = overlap_from_pb(req.overlap)
    if req.tz:
        options["tz"] = req.tz
    return RecurringArgs(req.name, req.cron, payload, options)


def recurring_to_pb(sched: Recurring) -> pb.RecurringInfo:
    info = pb.RecurringInfo(
        name=sched.name,
        cron=sched.cron,
        tz=sched.tz_name or "",
        pool=sched.pool,
        kind=sched.kind,
        overlap=overlap_to_pb(sched.overlap),
    )
    if sched.next_time is not None:
        info.next_unix_ns = to_ns(sched.next_time)
    if sched.last is not None:
        info.last_task_id = sched.last.id
    return info


# --- records, results, events ------------------------------------------------------------------


def output_bytes(output: object) -> bytes:
    """A task's output as bytes: remote workers return bytes; an in-process executor's str is
    sent as UTF-8, None as empty, anything else as JSON (what the clients decode)."""
    if output is None:
        return b""
    if isinstance(output, (bytes, bytearray, memoryview)):
        return bytes(output)
    if isinstance(output, str):
        return output.encode()
    return json.dumps(output, separators=(",", ":")).encode()


def task_info(rec: TaskRecord, pool_retry: RetryPolicy | None = None) -> pb.TaskInfo:
    """`pool_retry`: the policy of the task's pool, for `max_attempts` (0 when unknown)."""
    policy = rec.retry or pool_retry
    info = pb.TaskInfo(
        id=rec.id,
        status=status_to_pb(rec.status),
        pool=rec.pool,
        key=rec.key or "",
        kind=rec.kind,
        attempt=rec.attempt,
        max_attempts=0 if policy is None else policy.max_attempts,
        message=rec.message or "",
        output_available=rec.status == SUCCEEDED,
        tenant=rec.tenant or "",
        priority=priority_to_pb(rec.cls),
    )
    if rec.submitted_at:
        info.created_unix_ns = to_ns(rec.submitted_at)
    if rec.started_at:
        info.started_unix_ns = to_ns(rec.started_at)
    if rec.status >= FIRST_TERMINAL:
        info.finished_unix_ns = to_ns(rec.finished_at)
    if rec.worker is not None:
        info.worker_name, info.worker_id = rec.worker
    return info


def task_result(rec: TaskRecord) -> pb.TaskResult:
    """`output` is present (possibly empty) only for a succeeded task."""
    res = pb.TaskResult(
        id=rec.id,
        status=status_to_pb(rec.status),
        message=rec.message or "",
        output_available=rec.status == SUCCEEDED,
    )
    if rec.status == SUCCEEDED:
        res.output = output_bytes(rec.output)
    return res


def event_to_pb(ev: StatusEvent) -> pb.StatusEvent:
    return pb.StatusEvent(
        id=ev.id,
        pool=ev.pool,
        key=ev.key or "",
        status=status_to_pb(ev.status),
        attempt=ev.attempt,
        at_unix_ns=to_ns(ev.at),
        message=ev.message or "",
    )


# --- snapshots ---------------------------------------------------------------------------------

# The engine's totals that cronoq.v1.Totals carries: its field names.
_TOTALS = tuple(f.name for f in pb.Totals.DESCRIPTOR.fields)


def snapshot_to_pb(snap: Snapshot, workers: Sequence[pb.WorkerInfo] = ()) -> pb.SnapshotResponse:
    """The engine's snapshot plus what only the worker layer knows: connected workers per pool
    and one group per distinct label set (capacity = granted slots)."""
    by_pool: dict[str, list[pb.WorkerInfo]] = {}
    for w in workers:
        by_pool.setdefault(w.pool, []).append(w)
    return pb.SnapshotResponse(
        pools=[_pool_to_pb(p, by_pool.get(p.name, [])) for p in snap.pools],
        live_tasks=snap.live_tasks,
        running=snap.running,
        pending=snap.pending,
        totals=pb.Totals(**{k: snap.totals.get(k, 0) for k in _TOTALS}),
        workers_connected=len(workers),
    )


def _pool_to_pb(p: PoolSnapshot, workers: list[pb.WorkerInfo]) -> pb.PoolSnapshot:
    groups: dict[frozenset[tuple[str, str]], pb.WorkerGroup] = {}
    for w in workers:
        labels = frozenset(w.labels.items())
        g = groups.get(labels)
        if g is None:
            g = groups[labels] = pb.WorkerGroup(labels=dict(w.labels))
        g.capacity += w.slots
        g.busy += w.busy
    return pb.PoolSnapshot(
        name=p.name,
        capacity=p.capacity,
        busy=p.busy,
        held=p.held,
        desired=p.desired,
        pending_by_class=p.pending_by_class,
        reservations=p.reservations,
        dispatched=p.dispatched,
        succeeded=p.succeeded,
        failed=p.failed,
        priority_adherence=p.priority_adherence,
        fixed_start_hit_rate=p.fixed_start_hit_rate,
        utilization=p.utilization,
        schedule_efficiency=p.schedule_efficiency,
        wait_p50_s=p.wait_p50,
        wait_p90_s=p.wait_p90,
        wait_p99_s=p.wait_p99,
        cost=p.cost,
        workers_connected=len(workers),
        groups=list(groups.values()),
        paused=p.paused,
        unserved=p.unserved,
    )
