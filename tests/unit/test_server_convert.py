"""convert.py: TaskSpec checks and options, enum tables, records, events and snapshots."""

from __future__ import annotations

import math
from typing import Any

import pytest

from cronoq._options import Dep
from cronoq.core.model import (
    CANCELLED,
    READY,
    SUCCEEDED,
    PoolSnapshot,
    RetryPolicy,
    Snapshot,
    StatusEvent,
    TaskRecord,
)
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server import convert
from cronoq.server.config import LimitsSettings
from cronoq.server.convert import InvalidArgument, TooLarge

LIMITS = LimitsSettings(
    max_key_len=4,
    max_kind_len=3,
    max_tags=2,
    max_tag_len=5,
    max_deps=1,
    max_resources=1,
    max_message_bytes=10,
)


def options(**fields: Any) -> dict[str, Any]:
    return convert.spec_to_task(pb.TaskSpec(**fields), LIMITS)[1]


def refused(**fields: Any) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        options(**fields)
    return err.value


def test_plain_spec_has_no_options() -> None:
    assert convert.spec_to_task(pb.TaskSpec(payload=b"abc"), LIMITS) == (b"abc", {})


def test_spec_options() -> None:
    got = options(
        pool="p",
        priority=pb.PRIORITY_LOW,
        kind="k",
        key="key",
        tenant="t",
        content_type="text/plain",
        tags={"a": "1"},
        labels={"gpu": "x"},
        deadline_unix_ns=2_500_000_000,
        start_in_s=3.0,
        tolerance_s=0.5,
        on_miss=pb.MISS_POLICY_SKIP,
        timeout_s=0.0,
        duration_hint_s=2.0,
        resources={"sem": 1},
        deps=[pb.Dep(target=pb.TaskRef(key="a"), cond=pb.EDGE_COND_ON_FAILURE)],
    )
    deps = got.pop("deps")
    assert [(d.target, d.on) for d in deps] == [("a", "failure")]
    assert all(isinstance(d, Dep) for d in deps)
    assert got == {
        "pool": "p",
        "priority": 3,
        "kind": "k",
        "key": "key",
        "tenant": "t",
        "tags": {"a": "1", "cronoq.content_type": "text/plain"},
        "labels": {"gpu": "x"},
        "deadline_at": 2.5,
        "start_in": 3.0,
        "tolerance": 0.5,
        "on_miss": "skip",
        "timeout": 0.0,
        "duration_hint": 2.0,
        "resources": {"sem": 1},
    }


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"key": "12345"}, "task.key"),
        ({"key": "a\0"}, "task.key"),
        ({"kind": "long"}, "task.kind"),
        ({"pool": "p\0"}, "task.pool"),
        ({"tenant": "t\0"}, "task.tenant"),
        ({"tags": {"a": "1", "b": "2", "c": "3"}}, "task.tags"),
        ({"tags": {"a": "123456"}}, "task.tags['a']"),
        ({"tags": {"cronoq.x": "1"}}, "task.tags['cronoq.x']"),
        ({"tags": {"": "1"}}, "task.tags"),
        ({"labels": {"toolong": "1"}}, "task.labels['toolong']"),
        ({"content_type": "x" * 129}, "task.content_type"),
        ({"deps": [pb.Dep(), pb.Dep()]}, "task.deps"),
        ({"deps": [pb.Dep()]}, "task.deps[0].target"),
        ({"deps": [pb.Dep(target=pb.TaskRef(id=0))]}, "task.deps[0].target.id"),
        ({"deps": [pb.Dep(target=pb.TaskRef(id=1), cond=9)]}, "task.deps[0].cond"),
        ({"resources": {"a": 1, "b": 1}}, "task.resources"),
        ({"resources": {"a": 0}}, "task.resources['a']"),
        ({"priority": 5}, "task.priority"),
        ({"on_miss": 4}, "task.on_miss"),
        ({"timeout_s": math.nan}, "task.timeout_s"),
        ({"timeout_s": math.inf}, "task.timeout_s"),
        ({"tolerance_s": -1.0}, "task.tolerance_s"),
        ({"duration_hint_s": 1e12}, "task.duration_hint_s"),
        ({"deadline_in_s": 1.0, "deadline_unix_ns": 1}, "task.deadline_in_s"),
        ({"start_in_s": 1.0, "start_unix_ns": 1}, "task.start_in_s"),
        ({"retry": pb.RetryPolicy(multiplier=-0.5)}, "task.retry.multiplier"),
        ({"retry": pb.RetryPolicy(multiplier=1000.5)}, "task.retry.multiplier"),
        ({"retry": pb.RetryPolicy(multiplier=math.nan)}, "task.retry.multiplier"),
        ({"tolerance_s": 1.0}, "task.tolerance_s"),
        ({"retry": pb.RetryPolicy(max_attempts=1, max_backoff_s=-1)}, "task.retry.max_backoff_s"),
    ],
)
def test_spec_refusals_name_the_field(fields: dict[str, Any], field: str) -> None:
    err = refused(**fields)
    assert err.field == field and str(err).startswith(f"{field}: ")


def test_duration_message_and_payload_size() -> None:
    assert "invalid duration" in refused(timeout_s=-1.0).rule
    with pytest.raises(TooLarge):
        options(payload=b"x" * 11)


def retry_of(**fields: Any) -> RetryPolicy:
    policy: RetryPolicy = options(retry=pb.RetryPolicy(**fields))["retry"]
    return policy


def test_retry_zero_fields_take_the_library_defaults() -> None:
    """docs/server-api.md, "Input rules": 0 attempts is one; a backoff field or the multiplier
    0 is the library's default (1 s, 60 s, 2.0); jitter is what was sent."""
    unset = retry_of()
    assert (unset.max_attempts, unset.initial_backoff, unset.max_backoff) == (1, 1.0, 60.0)
    assert (unset.multiplier, unset.jitter) == (2.0, False)
    sent = retry_of(max_attempts=4, initial_backoff_s=2.0, max_backoff_s=9.0, jitter=True)
    assert (sent.max_attempts, sent.initial_backoff, sent.max_backoff) == (4, 2.0, 9.0)
    assert (sent.multiplier, sent.jitter) == (2.0, True)
    assert retry_of(multiplier=0.25).multiplier == 1.0  # (0, 1): no growth
    assert retry_of(multiplier=1000.0).multiplier == 1000.0


KEYS = LimitsSettings(max_key_len=64)


def test_occurrence_keys_are_reserved_for_submits_only() -> None:
    reserved = ["daily@2025-06-01T09:30:00Z", "@2025-06-01T09:30:00Z", "a@b@9999-99-99T99:99:99Z"]
    allowed = [
        "daily@2025-06-01T09:30:00.5Z",  # fractional seconds
        "daily@2025-06-01T09:30:00",
        "daily@2025-06-01T09:30:00Z@x",  # the last '@' decides
        "daily@2025-06-01 09:30:00Z",
        "daily@2025-06-01T09:30:0xZ",
        "2025-06-01T09:30:00Z",  # no '@'
        "daily@\uff12025-06-01T09:30:00Z",
    ]
    for key in reserved:
        assert convert.is_occurrence_key(key), key
        with pytest.raises(InvalidArgument) as err:
            convert.spec_to_task(pb.TaskSpec(key=key), KEYS)
        assert err.value.field == "task.key" and "reserved" in err.value.rule
        template = convert.spec_to_task(pb.TaskSpec(key=key), KEYS, template=True)[1]
        assert template["key"] == key
    for key in allowed:
        assert not convert.is_occurrence_key(key), key
        assert convert.spec_to_task(pb.TaskSpec(key=key), KEYS)[1]["key"] == key


def test_tolerance_needs_a_start_except_in_a_template() -> None:
    assert refused(tolerance_s=1.0).rule == "tolerance_s requires a start time"
    assert options(tolerance_s=1.0, start_unix_ns=1)["tolerance"] == 1.0
    assert options(tolerance_s=1.0, start_in_s=0.0)["tolerance"] == 1.0
    spec = pb.TaskSpec(tolerance_s=1.0)
    assert convert.spec_to_task(spec, LIMITS, template=True)[1] == {"tolerance": 1.0}


def test_task_ref() -> None:
    assert convert.task_ref(pb.TaskRef(id=7), LIMITS) == 7
    assert convert.task_ref(pb.TaskRef(key="k"), LIMITS) == "k"
    for bad in (pb.TaskRef(), pb.TaskRef(key=""), pb.TaskRef(id=0), pb.TaskRef(key="12345")):
        with pytest.raises(InvalidArgument):
            convert.task_ref(bad, LIMITS)


def test_enums_both_ways() -> None:
    assert convert.priority_from_pb(pb.PRIORITY_UNSPECIFIED) == 2
    for cls in range(4):
        assert convert.priority_from_pb(convert.priority_to_pb(cls)) == cls
    for status in range(12):
        assert convert.status_from_pb(convert.status_to_pb(status)) == status
    assert convert.status_to_pb("dead_lettered") == pb.TASK_STATUS_DEAD_LETTERED
    with pytest.raises(InvalidArgument):
        convert.status_from_pb(pb.TASK_STATUS_UNSPECIFIED)
    for on in ("success", "complete", "failure"):
        assert convert.edge_from_pb(convert.edge_to_pb(on)) == on
    for miss in ("run_late", "skip", "fail"):
        assert convert.miss_from_pb(convert.miss_to_pb(miss)) == miss
    for overlap in ("skip", "allow", "queue", "queue_on_success"):
        assert convert.overlap_from_pb(convert.overlap_to_pb(overlap)) == overlap
    assert convert.edge_from_pb(0) == "success"
    assert convert.miss_from_pb(0) == "run_late"
    assert convert.overlap_from_pb(0) == "skip"


def test_times() -> None:
    assert convert.to_ns(1.5) == 1_500_000_000
    assert convert.from_ns(2_000_000_000) == 2.0


def record(status: int, output: Any = None) -> TaskRecord:
    rec = TaskRecord(b"p", "default", cls=1, kind="k", key="key", tenant="t")
    rec.id, rec.status, rec.attempt, rec.output = 5, status, 1, output
    rec.submitted_at, rec.finished_at, rec.message = 1.0, 2.0, None
    return rec


def test_task_info_and_result() -> None:
    info = convert.task_info(record(SUCCEEDED, b"out"), RetryPolicy(max_attempts=4))
    assert (info.id, info.pool, info.key, info.kind, info.tenant) == (5, "default", "key", "k", "t")
    assert (info.status, info.priority, info.max_attempts) == (
        pb.TASK_STATUS_SUCCEEDED,
        pb.PRIORITY_HIGH,
        4,
    )
    assert (info.created_unix_ns, info.finished_unix_ns) == (10**9, 2 * 10**9)
    assert info.output_available and not info.HasField("started_unix_ns")
    live = convert.task_info(record(READY))
    assert not live.HasField("finished_unix_ns") and live.max_attempts == 0

    assert convert.task_result(record(SUCCEEDED, b"out")).output == b"out"
    assert convert.task_result(record(SUCCEEDED, None)).HasField("output")
    cancelled = record(CANCELLED)
    cancelled.message = "cancelled"
    res = convert.task_result(cancelled)
    assert not res.HasField("output") and not res.output_available and res.message == "cancelled"


def test_output_bytes() -> None:
    assert convert.output_bytes(None) == b""
    assert convert.output_bytes(bytearray(b"ab")) == b"ab"
    assert convert.output_bytes("é") == "é".encode()
    assert convert.output_bytes({"a": [1]}) == b'{"a":[1]}'


def test_event() -> None:
    ev = convert.event_to_pb(StatusEvent(3, "p", None, "running", 2, 1.25, None))
    assert (ev.id, ev.pool, ev.key, ev.status, ev.attempt) == (
        3,
        "p",
        "",
        pb.TASK_STATUS_RUNNING,
        2,
    )
    assert (ev.at_unix_ns, ev.message) == (1_250_000_000, "")


def test_snapshot() -> None:
    pool = PoolSnapshot(
        **{
            **dict.fromkeys(PoolSnapshot.__dataclass_fields__, 0),
            "name": "default",
            "capacity": 3,
            "pending_by_class": [1, 0, 2, 0],
            "wait_p99": 0.5,
            "cost": 1.5,
        }
    )
    snap = Snapshot([pool], live_tasks=3, running=0, pending=3, totals={"submitted": 7, "shed": 1})
    workers = [
        pb.WorkerInfo(id=1, pool="default", slots=2, busy=1),
        pb.WorkerInfo(id=2, pool="default", slots=1, labels={"gpu": "a"}),
        pb.WorkerInfo(id=3, pool="other", slots=5),
    ]
    got = convert.snapshot_to_pb(snap, workers)
    assert (got.live_tasks, got.pending, got.workers_connected) == (3, 3, 3)
    assert (got.totals.submitted, got.totals.shed, got.totals.retries) == (7, 1, 0)
    (p,) = got.pools
    assert (p.name, p.capacity, list(p.pending_by_class)) == ("default", 3, [1, 0, 2, 0])
    assert (p.wait_p99_s, p.cost, p.workers_connected) == (0.5, 1.5, 2)
    assert sorted((dict(g.labels).get("gpu", ""), g.capacity, g.busy) for g in p.groups) == [
        ("", 2, 1),
        ("a", 1, 0),
    ]


def test_recurring_request() -> None:
    req = pb.RecurringRequest(
        name="r",
        cron="*/5 * * * *",
        tz="UTC",
        template=pb.TaskSpec(payload=b"p", key="k", deadline_in_s=3.0),
        overlap=pb.OVERLAP_ALLOW,
    )
    args = convert.recurring_from_pb(req, LIMITS)
    assert (args.name, args.cron, args.payload) == ("r", "*/5 * * * *", b"p")
    assert args.options == {"key": "k", "deadline_in": 3.0, "overlap": "allow", "tz": "UTC"}
    for bad, field in (
        ({"name": ""}, "name"),
        ({"name": "x" * 257}, "name"),
        ({"cron": "* " * 200}, "cron"),
        ({"cron": "nope"}, "cron"),
        ({"tz": "No/Where"}, "tz"),
        ({"template": pb.TaskSpec(start_unix_ns=1)}, "template.start_unix_ns"),
        ({"template": pb.TaskSpec(deps=[pb.Dep()])}, "template.deps"),
        ({"overlap": 9}, "overlap"),
    ):
        broken = pb.RecurringRequest()
        broken.CopyFrom(req)
        for name, value in bad.items():
            if isinstance(value, pb.TaskSpec):
                broken.template.CopyFrom(value)
            else:
                setattr(broken, name, value)
        with pytest.raises(InvalidArgument) as err:
            convert.recurring_from_pb(broken, LIMITS)
        assert err.value.field == field
