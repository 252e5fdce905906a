"""`cronoq.client` without a server: `task()`, the response mappings, the argument checks made
before any RPC, the error classes and the import rules (docs/client.md)."""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

import cronoq
import cronoq.client
from cronoq.client import (
    CancelTask,
    Client,
    ClientError,
    Event,
    PoolSnapshot,
    RecurringInfo,
    Reject,
    Result,
    Snapshot,
    Submitted,
    TaskInfo,
    TaskPage,
    Totals,
    WorkerGroup,
    WorkerInfo,
    task,
)
from cronoq.client import _client as impl
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb

# A port nothing listens on: the checks below must fail before any connection is attempted.
NOWHERE = "127.0.0.1:1"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- module, errors ---------------------------------------------------------------------------


def test_public_names() -> None:
    assert cronoq.client.__all__ == [
        "CancelTask", "Client", "ClientError", "Event", "Lease", "PROTOCOL_VERSION",
        "PoolSnapshot", "RecurringInfo", "Reject", "Result", "Snapshot", "Submitted", "TaskInfo",
        "TaskPage", "Totals", "Worker", "WorkerGroup", "WorkerInfo", "task",
    ]  # fmt: skip
    assert cronoq.client.PROTOCOL_VERSION == 3 and cronoq.client.MAX_REDIRECTS == 3
    assert cronoq.client.Retryable is cronoq.Retryable
    assert cronoq.client.Permanent is cronoq.Permanent
    for cls in (ClientError, Reject, CancelTask):
        assert issubclass(cls, cronoq.CronoqError)
    assert cronoq.client.Snapshot is not cronoq.Snapshot
    assert cronoq.client.PoolSnapshot is not cronoq.PoolSnapshot
    assert Result.__module__ == "cronoq.client"


def test_client_error() -> None:
    e = ClientError("not_found", "no task 7")
    assert (str(e), e.code, e.message, e.retryable) == (
        "not_found: no task 7",
        "not_found",
        "no task 7",
        False,
    )
    assert e.args == ("not_found: no task 7",)
    assert ClientError("unavailable", "").retryable
    assert ClientError("resource_exhausted", "").retryable
    for code in ("unknown", "deadline_exceeded", "failed_precondition", "internal"):
        assert not ClientError(code, "").retryable


class _Rpc(Exception):
    """Just enough of grpc.RpcError's surface for `from_rpc`."""

    def __init__(self, code: Any, details: str | None) -> None:
        super().__init__("rpc failed")
        self._code, self._details = code, details

    def code(self) -> Any:
        return self._code

    def details(self) -> str | None:
        return self._details


def test_client_error_from_rpc() -> None:
    import grpc

    e = ClientError.from_rpc(_Rpc(grpc.StatusCode.PERMISSION_DENIED, "role"))  # type: ignore[arg-type]
    assert (e.code, e.message) == ("permission_denied", "role")
    e = ClientError.from_rpc(_Rpc(None, None))  # type: ignore[arg-type]
    assert (e.code, e.message) == ("unknown", "")
    e = ClientError.from_rpc(Exception("plain"))  # type: ignore[arg-type]
    assert (e.code, e.message) == ("unknown", "plain")


def test_errors_pickle() -> None:
    for original, attrs in (
        (ClientError("a", "b"), ("code", "message", "args")),
        (Reject("r"), ("reason", "args")),
        (cronoq.Retryable("m", retry_after=2.5), ("message", "retry_after", "args")),
    ):
        copy = pickle.loads(pickle.dumps(original))
        assert type(copy) is type(original)
        assert str(copy) == str(original)
        for a in attrs:
            assert getattr(copy, a) == getattr(original, a)
    assert str(Reject("no gpu")) == "no gpu" and Reject().reason == ""


def test_import_cronoq_does_not_import_grpc() -> None:
    code = (
        "import sys, cronoq\n"
        "assert 'grpc' not in sys.modules and 'cronoq.client' not in sys.modules\n"
        "assert cronoq.client.Client\n"
        "assert 'grpc' in sys.modules\n"
        "try:\n    cronoq.nope\nexcept AttributeError:\n    print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


def test_missing_grpc_gives_a_helpful_import_error() -> None:
    code = (
        "import sys\n"
        "sys.modules['grpc'] = None\n"
        "try:\n    import cronoq.client\n"
        "except ImportError as e:\n"
        "    assert isinstance(e.__cause__, ImportError), e.__cause__\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "grpcio" in done.stdout and "protobuf" in done.stdout
    assert "pip install 'cronoq[client]'" in done.stdout


# --- task(): payload ------------------------------------------------------------------------


def test_task_returns_a_wire_task_spec() -> None:
    assert type(task()) is pb.TaskSpec
    assert task().DESCRIPTOR.full_name == "cronoq.v1.TaskSpec"


@pytest.mark.parametrize(
    ("value", "data", "content_type"),
    [
        (b"\x00\x01", b"\x00\x01", "application/octet-stream"),
        (bytearray(b"ab"), b"ab", "application/octet-stream"),
        (memoryview(b"cd"), b"cd", "application/octet-stream"),
        ("hé", b"h\xc3\xa9", "text/plain; charset=utf-8"),
        ("", b"", "text/plain; charset=utf-8"),
        ({"a": 1}, b'{"a": 1}', "application/json"),
        ([1, "é"], b'[1, "\\u00e9"]', "application/json"),
        ((1, 2), b"[1, 2]", "application/json"),
        (True, b"true", "application/json"),
        (0, b"0", "application/json"),
        (float("nan"), b"NaN", "application/json"),
        (None, b"", ""),
    ],
)
def test_task_payload_encoding(value: Any, data: bytes, content_type: str) -> None:
    spec = task(value)
    assert (spec.payload, spec.content_type) == (data, content_type)


def test_task_explicit_content_type_wins() -> None:
    assert task(b"x", content_type="image/png").content_type == "image/png"
    assert (
        task(None, content_type="x/y").payload,
        task(None, content_type="x/y").content_type,
    ) == (
        b"",
        "x/y",
    )
    assert task("s", content_type="").content_type == "text/plain; charset=utf-8"


def test_task_payload_that_json_cannot_encode() -> None:
    with pytest.raises(TypeError):
        task({1, 2})  # type: ignore[arg-type]
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError):
        task(loop)
    with pytest.raises(UnicodeEncodeError):
        task("\ud800")


def test_task_defaults() -> None:
    spec = task()
    assert (spec.payload, spec.content_type) == (b"", "")
    assert spec.priority == pb.PRIORITY_NORMAL
    for name in (
        "deadline_in_s",
        "deadline_unix_ns",
        "start_in_s",
        "start_unix_ns",
        "tolerance_s",
        "duration_hint_s",
        "timeout_s",
        "retry",
    ):
        assert not spec.HasField(name), name
    assert spec.on_miss == 0 and not spec.deps
    assert (spec.kind, spec.pool, spec.key, spec.tenant) == ("", "", "", "")
    assert not spec.resources and not spec.tags and not spec.labels


def test_task_strings_and_maps() -> None:
    spec = task(
        pool="p",
        kind="k",
        key="the-key",
        tenant="t",
        tags={"n": 1},  # type: ignore[dict-item]
        resources={"gpu": "2"},  # type: ignore[dict-item]
        labels={"zone": 3},  # type: ignore[dict-item]
    )
    assert (spec.pool, spec.kind, spec.key, spec.tenant) == ("p", "k", "the-key", "t")
    assert dict(spec.tags) == {"n": "1"}
    assert dict(spec.resources) == {"gpu": 2}
    assert dict(spec.labels) == {"zone": "3"}


def test_task_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        task(b"x", priorty="high")  # type: ignore[call-arg]


# --- task(): priority -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "wire"),
    [
        ("HIGH", pb.PRIORITY_HIGH),
        ("critical", pb.PRIORITY_CRITICAL),
        ("Low", pb.PRIORITY_LOW),
        (0, pb.PRIORITY_CRITICAL),
        (1, pb.PRIORITY_HIGH),
        (3, pb.PRIORITY_LOW),
        (True, pb.PRIORITY_HIGH),
        (2.9, pb.PRIORITY_NORMAL),
        (cronoq.Priority.LOW, pb.PRIORITY_LOW),
        (cronoq.Priority.CRITICAL, pb.PRIORITY_CRITICAL),
        (None, pb.PRIORITY_NORMAL),
    ],
)
def test_task_priority(given: Any, wire: int) -> None:
    assert int(cronoq.Priority.LOW) == 3
    assert task(priority=given).priority == wire


@pytest.mark.parametrize("given", ["urgent", 4, -1, ""])
def test_task_bad_priority(given: Any) -> None:
    with pytest.raises(ValueError):
        task(priority=given)


# --- task(): times --------------------------------------------------------------------------


def test_task_relative_and_absolute_are_exclusive() -> None:
    with pytest.raises(ValueError):
        task(deadline_in=1, deadline_at=2)
    with pytest.raises(ValueError):
        task(start_in=1, start_at=2)
    # checked before the payload is encoded
    with pytest.raises(ValueError, match="deadline"):
        task({1}, deadline_in=1, deadline_at=2)  # type: ignore[arg-type]


def test_task_absolute_times() -> None:
    spec = task(deadline_at=datetime(2030, 1, 1, tzinfo=UTC))
    assert spec.deadline_unix_ns == 1893456000 * 10**9
    assert not spec.HasField("deadline_in_s")
    # a number is truncated after the float multiplication, as the published client does
    at = 1700000000.123456789
    assert task(start_at=at).start_unix_ns == int(at * 1e9)
    assert task(start_at=1).start_unix_ns == 10**9
    naive = datetime(2030, 1, 1, 12, 30)
    assert task(deadline_at=naive).deadline_unix_ns == int(naive.timestamp() * 1e9)


def test_task_zero_values_count_as_given() -> None:
    spec = task(start_in=0, deadline_in=0, timeout=0, tolerance=0, duration_hint=0)
    for name in ("start_in_s", "deadline_in_s", "timeout_s", "tolerance_s", "duration_hint_s"):
        assert spec.HasField(name) and getattr(spec, name) == 0.0, name
    spec = task(deadline_in=2, start_in=1.5, tolerance=3, duration_hint=4, timeout=5)
    assert (
        spec.deadline_in_s,
        spec.start_in_s,
        spec.tolerance_s,
        spec.duration_hint_s,
        spec.timeout_s,
    ) == (2.0, 1.5, 3.0, 4.0, 5.0)


def test_task_on_miss() -> None:
    assert task(on_miss="skip").on_miss == pb.MISS_POLICY_SKIP
    assert task(on_miss="run_late").on_miss == pb.MISS_POLICY_RUN_LATE
    assert task(on_miss="fail").on_miss == pb.MISS_POLICY_FAIL
    for bad in ("late", "SKIP"):
        with pytest.raises(ValueError):
            task(on_miss=bad)


# --- task(): retry --------------------------------------------------------------------------


def _retry_tuple(spec: pb.TaskSpec) -> tuple[Any, ...]:
    r = spec.retry
    return (r.max_attempts, r.initial_backoff_s, r.multiplier, r.max_backoff_s, r.jitter)


def test_task_retry() -> None:
    assert _retry_tuple(task(retry={})) == (3, 0.0, 0.0, 0.0, True)
    assert task(retry={}).HasField("retry")
    assert _retry_tuple(task(retry=cronoq.RetryPolicy())) == (3, 1.0, 2.0, 60.0, True)
    given = {"max_attempts": "5", "initial_backoff": None, "max_backoff": 9, "jitter": 0}
    assert _retry_tuple(task(retry=given)) == (5, 0.0, 0.0, 9.0, False)

    class Partial:
        multiplier = 1.5

    assert _retry_tuple(task(retry=Partial())) == (3, 0.0, 1.5, 0.0, True)


# --- task(): dependencies -------------------------------------------------------------------


def _deps(spec: pb.TaskSpec) -> list[tuple[str, Any, int]]:
    out = []
    for d in spec.deps:
        which = d.target.WhichOneof("target")
        assert which is not None
        out.append((which, getattr(d.target, which), d.cond))
    return out


def test_task_after() -> None:
    assert _deps(task(after="a")) == [("key", "a", pb.EDGE_COND_ON_SUCCESS)]
    assert _deps(task(after=7)) == [("id", 7, pb.EDGE_COND_ON_SUCCESS)]
    assert _deps(task(after=[1, "b"])) == [
        ("id", 1, pb.EDGE_COND_ON_SUCCESS),
        ("key", "b", pb.EDGE_COND_ON_SUCCESS),
    ]
    assert _deps(task(after=iter(["x"]))) == [("key", "x", pb.EDGE_COND_ON_SUCCESS)]


def test_task_deps_come_after_after_in_order() -> None:
    spec = task(after=["a"], deps=[("b", "complete"), {"ref": 5, "cond": "on_failure"}])
    assert _deps(spec) == [
        ("key", "a", pb.EDGE_COND_ON_SUCCESS),
        ("key", "b", pb.EDGE_COND_ON_COMPLETE),
        ("id", 5, pb.EDGE_COND_ON_FAILURE),
    ]
    names = ["on_success", "success", "on_complete", "complete", "on_failure", "failure"]
    conds = [c for _, _, c in _deps(task(deps=[("k", n) for n in names]))]
    assert conds == [1, 1, 2, 2, 3, 3]
    assert _deps(task(deps=[{"ref": "k"}])) == [("key", "k", pb.EDGE_COND_ON_SUCCESS)]


def test_task_bad_deps() -> None:
    with pytest.raises(ValueError):
        task(deps=[("a", "sometimes")])
    with pytest.raises(ValueError):
        task(deps=[("a", "ON_SUCCESS")])
    with pytest.raises(KeyError):
        task(deps=[{"cond": "success"}])
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError, match="id or a key"):
            task(after=[bad])  # type: ignore[list-item]


def test_bad_refs_fail_before_any_rpc() -> None:
    client = Client(NOWHERE)
    for bad in (True, 1.5):
        for method in (client.get, client.cancel, client.wait):
            with pytest.raises(TypeError, match="id or a key"):
                run(method(bad))  # type: ignore[arg-type]


# --- Client: checks before any RPC ----------------------------------------------------------


def test_client_constructor_connects_nothing() -> None:
    client = Client("http://127.0.0.1:1/", token="t" * 16, tls=False)
    assert client.target == "http://127.0.0.1:1/"
    run(client.close())  # nothing opened: a no-op
    run(client.close())


def test_submit_wait_timeout_needs_wait() -> None:
    with pytest.raises(ValueError, match="wait=True"):
        run(Client(NOWHERE).submit("x", wait_timeout=1))
    with pytest.raises(ValueError, match="on_miss"):  # task() checks come first
        run(Client(NOWHERE).submit("x", wait_timeout=1, on_miss="late"))
    with pytest.raises(TypeError):
        run(Client(NOWHERE).submit("x", bogus=1))


def test_list_tasks_argument_checks() -> None:
    client = Client(NOWHERE)
    with pytest.raises(TypeError):
        run(client.list_tasks(pools="a"))
    with pytest.raises(TypeError):
        run(client.list_tasks(statuses="running"))
    for bad in (["bogus"], ["unspecified"]):
        with pytest.raises(ValueError, match="unknown task status"):
            run(client.list_tasks(statuses=bad))
    assert impl._statuses(["RUNNING", "dead_lettered"]) == [
        pb.TASK_STATUS_RUNNING,
        pb.TASK_STATUS_DEAD_LETTERED,
    ]


def test_add_recurring_argument_checks() -> None:
    client = Client(NOWHERE)
    with pytest.raises(TypeError):
        run(client.add_recurring("n", "* * * * *", task("x"), kind="k"))
    with pytest.raises(ValueError, match="overlap"):
        run(client.add_recurring("n", "* * * * *", "x", overlap="never"))
    with pytest.raises(ValueError, match="on_miss"):  # the template is built before overlap
        run(client.add_recurring("n", "* * * * *", "x", overlap="never", on_miss="late"))


# --- response mappings ----------------------------------------------------------------------


def test_submitted_and_result_mapping() -> None:
    assert not pb.SubmitResponse(id=3).HasField("result")
    r = impl._result(
        pb.TaskResult(id=3, status=pb.TASK_STATUS_SUCCEEDED, output=b'{"a": 1}', message="m")
    )
    assert r == Result(3, "succeeded", b'{"a": 1}', "m", False)
    assert r.ok and r.json() == {"a": 1} and r.text() == '{"a": 1}'
    assert Submitted(3, False) == Submitted(3, False, None)


def test_result_without_output() -> None:
    r = impl._result(pb.TaskResult(id=1, status=pb.TASK_STATUS_DEAD_LETTERED, message="boom"))
    assert r.output is None and not r.ok and r.status == "dead_lettered"
    with pytest.raises(ValueError):
        r.json()
    assert r.text() == ""
    empty = impl._result(pb.TaskResult(id=1, status=pb.TASK_STATUS_SUCCEEDED, output=b""))
    assert empty.output == b"" and empty.json() is None
    with pytest.raises(json.JSONDecodeError):
        Result(1, "succeeded", b"{").json()


def test_task_info_mapping() -> None:
    info = impl._task_info(
        pb.TaskInfo(
            id=9,
            status=pb.TASK_STATUS_RUNNING,
            pool="p",
            key="k",
            kind="kd",
            attempt=2,
            max_attempts=5,
            created_unix_ns=1_500_000_000_000_000_000,
            message="m",
            output_available=True,
            tenant="t",
            priority=pb.PRIORITY_CRITICAL,
        )
    )
    assert info == TaskInfo(
        9, "running", "p", "k", "kd", 2, 5, 1.5e9, None, None, "m", True, "t", "critical"
    )
    assert not info.done
    bare = impl._task_info(pb.TaskInfo(id=1, status=pb.TASK_STATUS_SHED))
    assert bare.done and bare.priority is None and bare.created_at is None
    assert TaskInfo(1, "succeeded").done and not TaskInfo(1, "blocked").done


def test_task_page_next_after() -> None:
    assert TaskPage((), None).unavailable_shards == ()
    # list_tasks turns next_after=0 into None (the same expression as the method uses)
    assert (pb.ListTasksResponse().next_after or None) is None


def test_event_mapping() -> None:
    ev = impl._event(
        pb.StatusEvent(
            id=4,
            pool="p",
            key="k",
            status=pb.TASK_STATUS_SUCCEEDED,
            attempt=1,
            at_unix_ns=1_500_000_000_000_000_000,
            message="done",
        )
    )
    assert ev == Event(4, "p", "k", "succeeded", 1, 1.5e9, "done")
    assert ev.at == 1.5e9


def test_snapshot_mapping() -> None:
    reply = pb.SnapshotResponse(
        pools=[
            pb.PoolSnapshot(
                name="p",
                capacity=4,
                busy=1,
                pending_by_class=[1, 2, 3, 4],
                wait_p50_s=0.5,
                wait_p90_s=0.9,
                wait_p99_s=0.99,
                workers_connected=2,
                groups=[pb.WorkerGroup(labels={"gpu": "a"}, capacity=3, busy=1)],
            )
        ],
        live_tasks=10,
        running=1,
        pending=9,
        workers_connected=2,
        unavailable_shards=["s2"],
    )
    snap = impl._snapshot(reply)
    assert snap.totals == Totals() and isinstance(snap, Snapshot)
    p = snap.pool("p")
    assert p is not None and isinstance(p, PoolSnapshot)
    assert (p.wait_p50, p.wait_p90, p.wait_p99) == (0.5, 0.9, 0.99)
    assert p.pending_by_class == (1, 2, 3, 4) and p.pending == 10
    assert p.groups == (WorkerGroup({"gpu": "a"}, 3, 1),)
    assert type(p.groups[0].labels) is dict
    assert snap.pool("nope") is None
    assert (snap.live_tasks, snap.running, snap.pending, snap.workers_connected) == (10, 1, 9, 2)
    assert snap.unavailable_shards == ("s2",)
    reply.totals.CopyFrom(pb.Totals(submitted=5, stale_completions=2))
    assert impl._snapshot(reply).totals == Totals(submitted=5, stale_completions=2)
    # a fresh Totals per Snapshot
    a, b = Snapshot((), 0, 0, 0), Snapshot((), 0, 0, 0)
    assert a.totals == b.totals and a.totals is not b.totals


def test_worker_and_recurring_mapping() -> None:
    w = impl._worker_info(
        pb.WorkerInfo(
            id=1,
            name="w",
            pool="p",
            labels={"a": "b"},
            slots=2,
            busy=1,
            connected_unix_ns=3 * 10**9,
        )
    )
    assert w == WorkerInfo(1, "w", "p", {"a": "b"}, 2, 1, 3.0)
    bare = impl._recurring_info(pb.RecurringInfo(name="n", cron="* * * * *"))
    assert bare == RecurringInfo("n", "* * * * *", "", "", "", "skip", None, None)
    full = impl._recurring_info(
        pb.RecurringInfo(
            name="n",
            cron="0 * * * *",
            tz="Europe/Paris",
            pool="p",
            kind="k",
            overlap=pb.OVERLAP_QUEUE_ON_SUCCESS,
            next_unix_ns=2 * 10**9,
            last_task_id=0,
        )
    )
    assert full == RecurringInfo(
        "n", "0 * * * *", "Europe/Paris", "p", "k", "queue_on_success", 2.0, 0
    )


def test_data_classes_are_frozen() -> None:
    r = Result(1, "succeeded", None)
    with pytest.raises(AttributeError):
        r.status = "failed"  # type: ignore[misc]
    assert (r.message, r.output_available) == ("", False)


def test_stubs_under_the_published_private_name() -> None:
    """`cronoq._proto` names the same modules, so specs built either way are one class."""
    import cronoq._proto.cronoq_pb2 as published

    from cronoq._proto import cronoq_pb2_grpc
    from cronoq.proto.cronoq.v1 import cronoq_pb2 as ours
    from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc as ours_grpc

    assert published is ours and cronoq_pb2_grpc is ours_grpc
    assert isinstance(task("x"), published.TaskSpec)
