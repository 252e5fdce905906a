"""Fuzzing a real `cronoq-server` process (issue 5): random bytes and valid-but-absurd messages
to every gRPC method, absurd worker streams next to a well-behaved worker, and random bodies to
the HTTP API.

Bad input must be answered with OK or one of the refusals of docs/reference/errors.md (never
INTERNAL or UNKNOWN, never a 5xx), must end at most the stream that sent it, and must leave the
server serving. Hypothesis runs derandomized with a few examples per method, so a run is
deterministic and quick; the deterministic tables pin the INVALID_ARGUMENT row of that table case
by case.
"""

from __future__ import annotations

import http.client
import json
import math
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from helpers.servers import PORT0, Serving, serving_process

MAX_MESSAGE = 65_536
MAX_BATCH = 20
CONFIG = (
    PORT0
    + f"""
[limits]
max_message_bytes = {MAX_MESSAGE}
max_http_body_bytes = {MAX_MESSAGE}
max_tasks_per_batch = {MAX_BATCH}
max_deps = 8
max_tags = 8
max_tag_len = 256
max_resources = 4
max_wait_s = 0.2
max_list = 50

# where absurd tasks land
[[pools]]
name = "default"
max = 8

# the absurd workers' pool, and the tasks they lease
[[pools]]
name = "fodder"
max = 8
lease_ttl_s = 2
retry = {{ max_attempts = 1000, initial_backoff_s = 0.0, max_backoff_s = 0.0, jitter = false }}

# the well-behaved worker's pool: no fuzzed message names it
[[pools]]
name = "good"
max = 4

# the deterministic worker checks
[[pools]]
name = "edge"
max = 4
retry = {{ max_attempts = 5, initial_backoff_s = 0.0, max_backoff_s = 0.0, jitter = false }}

# a worker sending an undecodable message
[[pools]]
name = "corrupt"
max = 2

[[resources]]
kind = "semaphore"
name = "sem"
permits = 2
"""
)

Code = grpc.StatusCode
# docs/reference/errors.md, "gRPC status codes": what bad input may be answered with.
# UNAVAILABLE is not among them: this server leads and does not stop, so it would mean the
# scheduler died on the input.
REFUSALS = frozenset(
    {
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.RESOURCE_EXHAUSTED,
        Code.OUT_OF_RANGE,
        Code.FAILED_PRECONDITION,
        Code.DEADLINE_EXCEEDED,
        Code.PERMISSION_DENIED,
        Code.UNAUTHENTICATED,
    }
)
ACCEPTABLE = REFUSALS | {Code.OK}
# How a worker stream that half-closed may end (docs/protocol.md, "Opening" and
# "Messages from the worker"): OK, or cut for a refused register (an old protocol version:
# FAILED_PRECONDITION), a protocol violation, an oversized message (OUT_OF_RANGE) or an outbound
# buffer that overflowed (RESOURCE_EXHAUSTED). Never the call's own 5 s timeout.
STREAM_ENDINGS = frozenset(
    {
        Code.OK,
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.PERMISSION_DENIED,
        Code.RESOURCE_EXHAUSTED,
        Code.OUT_OF_RANGE,
        Code.FAILED_PRECONDITION,
    }
)

SETTINGS: dict[str, Any] = {
    "derandomize": True,
    "database": None,
    "deadline": None,
    "suppress_health_check": list(HealthCheck),
}

WORK = "/cronoq.v1.Workers/Work"
WATCH = "/cronoq.v1.Tasks/Watch"
METHODS = {
    f"/{service.full_name}/{method.name}": method
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    with serving_process(tmp_path_factory.mktemp("fuzz"), CONFIG) as serving:
        yield serving


# --- calling any method with bytes -----------------------------------------------------------


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    responses: list[bytes]

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details!r}"


def invoke(
    channel: grpc.Channel, path: str, requests: Sequence[bytes], watch_s: float = 0.2
) -> Outcome:
    """Call `path` with serialized request(s), no stubs in between. A Watch the server accepts
    stays open: it ends with the call's timeout `watch_s` (DEADLINE_EXCEEDED)."""
    method = METHODS[path]
    responses: list[bytes] = []
    try:
        if method.client_streaming:
            call = channel.stream_stream(path)(iter(requests), timeout=5)
            responses.extend(call)
        elif method.server_streaming:
            call = channel.unary_stream(path)(requests[0], timeout=watch_s)
            responses.extend(call)
        else:
            responses.append(channel.unary_unary(path)(requests[0], timeout=5))
    except grpc.RpcError as e:
        return Outcome(e.code(), e.details() or "", responses)
    return Outcome(Code.OK, "", responses)


def check_answer(path: str, outcome: Outcome) -> None:
    """OK (with answers that parse as the method's output type) or a refusal of
    docs/reference/errors.md; a worker stream, which half-closes, never runs into the call's
    timeout."""
    allowed = STREAM_ENDINGS if path == WORK else ACCEPTABLE
    assert outcome.code in allowed, f"{path} answered {outcome}"
    output = getattr(pb, METHODS[path].output_type.name)
    for raw in outcome.responses:
        output.FromString(raw)


# --- 1. random bytes to every method ---------------------------------------------------------

RAW = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(
        [
            b"\x80",  # a varint cut short
            b"\x0a\xff\xff\xff\xff\x0f",  # a length far past the end
            b"\x0a\x02\xc3\x28",  # field 1 as invalid UTF-8 (or a broken submessage)
            b"\x00",  # field number 0
            b"\xff" * 16,
            b"\x12\x03\x0a\x01\x00",
        ]
    ),
)


@pytest.mark.parametrize("path", sorted(METHODS))
@settings(max_examples=20, **SETTINGS)
@given(bodies=st.lists(RAW, min_size=1, max_size=3))
def test_random_bytes(target: Serving, path: str, bodies: list[bytes]) -> None:
    """Bytes that are no message of the method's type are the client's fault: INVALID_ARGUMENT
    (or another refusal), never INTERNAL or UNKNOWN."""
    check_answer(path, invoke(target.channel, path, bodies))


# --- 2. valid messages with absurd values ----------------------------------------------------

NAN, INF = math.nan, math.inf
DURATIONS = st.one_of(
    st.sampled_from([NAN, INF, -INF, -1.0, -0.0, 0.0, 5e-324, 0.05, 3.2e9, 1e300, -1e300]),
    st.floats(),
)
INT64 = st.one_of(
    st.sampled_from([-(2**63), -1, 0, 1, 2**63 - 1]), st.integers(-(2**63), 2**63 - 1)
)
UINT64 = st.one_of(
    st.integers(0, 5), st.sampled_from([2**63, 2**64 - 1]), st.integers(0, 2**64 - 1)
)
UINT32 = st.one_of(
    st.integers(0, 3), st.sampled_from([2**31, 2**32 - 1]), st.integers(0, 2**32 - 1)
)
ENUMS = st.one_of(st.integers(-1, 14), st.sampled_from([-(2**31), 2**31 - 1, 99]))
ABSURD_TEXT = ["", "\0", "a\0b", "cronoq.content_type", "cronoq.", "k" * 257, "é" * 129, " ", "sem"]
STRINGS = st.one_of(st.sampled_from(ABSURD_TEXT), st.text(max_size=8))
BYTES = st.one_of(st.binary(max_size=16), st.sampled_from([b"\0" * 1000, b"x" * (MAX_MESSAGE + 1)]))
POOLS = st.sampled_from(["", "default", "default", "nope", "\0", "default\0", "p" * 300])
# few keys and ids, so that references meet each other (and form cycles)
KEYS = st.sampled_from(["", "a", "b", "c", "\0", "k" * 257])
PARSABLE_CRONS = st.sampled_from(
    [
        "* * * * *",
        "0 0 30 2 *",  # February 30th: never
        "0 0 29 2 *",  # leap days only
        "59 23 31 12 *",
        "*/7 * * * *",
        "0 0 * * 0",
    ]
)
CRONS = st.one_of(
    PARSABLE_CRONS,
    PARSABLE_CRONS,
    PARSABLE_CRONS,
    PARSABLE_CRONS,
    st.sampled_from(
        ["*/0 * * * *", "0-59/1000 * * * *", "60 * * * *", "* * * * * * *", "", "\0", "*" * 300]
    ),
    st.text(max_size=12),
)
ZONES = st.one_of(
    st.sampled_from(["", "UTC", "Europe/Paris", "Australia/Lord_Howe"]),
    st.sampled_from(
        ["Nowhere/Nope", "../../etc/passwd", "/etc/localtime", "\0", "z" * 300, "UTC\0"]
    ),
)
BY_NAME: dict[str, st.SearchStrategy[Any]] = {
    "pool": POOLS,
    "pools": POOLS,
    "key": KEYS,
    "keys": KEYS,
    "cron": CRONS,
    "tz": ZONES,
    "wait": st.sampled_from([False, False, False, True]),
    "name": st.one_of(
        st.sampled_from(["fuzz", "fuzz", "x" * 256]),
        st.sampled_from(["fuzz", "fuzz", "é" * 200]),
        st.sampled_from(["", "\0", "n" * 257]),
        st.text(min_size=1, max_size=6),
    ),
}
# fields always drawn (an absent one would refuse the whole message every time)
ALWAYS = {"RecurringRequest": ("name", "cron")}
# fields where plain values must come often enough for the rest to be reached
BY_FIELD: dict[str, st.SearchStrategy[Any]] = {
    "RecurringRequest.template": st.one_of(
        st.sampled_from([pb.TaskSpec(), pb.TaskSpec(pool="default", kind="k", payload=b"p")]),
        st.deferred(lambda: absurd(pb.TaskSpec.DESCRIPTOR)),
    ),
}
# repeated fields with a limit: sometimes exactly at it, sometimes one past it
COUNT_LIMITS = {"tasks": MAX_BATCH, "deps": 8, "tags": 8, "labels": 8, "resources": 4}
RESOURCE_NAMES = st.sampled_from(["sem", "sem", "nope", "", "\0", "cronoq.x", "r" * 300])


def _is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _scalar(field: Any) -> st.SearchStrategy[Any]:
    if field.full_name.removeprefix("cronoq.v1.") in BY_FIELD:
        return BY_FIELD[field.full_name.removeprefix("cronoq.v1.")]
    if field.name in BY_NAME:
        return BY_NAME[field.name]
    if field.enum_type is not None:
        return ENUMS
    if field.message_type is not None:
        return absurd(field.message_type)
    by_type: dict[int, st.SearchStrategy[Any]] = {
        field.TYPE_DOUBLE: DURATIONS,
        field.TYPE_INT64: INT64,
        field.TYPE_UINT64: UINT64,
        field.TYPE_UINT32: UINT32,
        field.TYPE_BOOL: st.booleans(),
        field.TYPE_STRING: STRINGS,
        field.TYPE_BYTES: BYTES,
    }
    return by_type[field.type]


def _sizes(name: str) -> st.SearchStrategy[int]:
    limit = COUNT_LIMITS.get(name)
    big = [limit, limit + 1] if limit is not None else [300]
    return st.one_of(st.integers(0, 2), st.sampled_from(big))


def _field(field: Any) -> st.SearchStrategy[Any]:
    if _is_map(field):
        entry = field.message_type.fields_by_name
        keys = RESOURCE_NAMES if field.name == "resources" else _scalar(entry["key"])
        values = _scalar(entry["value"])
        small = st.dictionaries(keys, values, max_size=2)
        # many entries at once: distinct keys, one value
        many = st.tuples(_sizes(field.name), values).map(
            lambda nv: {f"k{i}": nv[1] for i in range(nv[0])}
        )
        return st.one_of(small, many)
    element = _scalar(field)
    if field.is_repeated:
        # a big list repeats one element: enormous, yet cheap to draw
        return st.one_of(
            st.lists(element, max_size=2),
            st.tuples(_sizes(field.name), element).map(lambda ne: [ne[1]] * ne[0]),
        )
    return element


def _build(cls: type[Message], values: dict[str, Any]) -> Message:
    msg = cls()
    for name, value in values.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        if _is_map(field):
            getattr(msg, name).update(value)
        elif field.is_repeated:
            getattr(msg, name).extend(value)
        elif field.message_type is not None:
            getattr(msg, name).CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


def absurd(descriptor: Any) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`'s type, every field absent or absurd (NaN and infinite
    durations, NUL bytes, over-long strings, lists at and past their limits, unknown enum
    numbers, empty references, extreme ids)."""
    cls = getattr(pb, descriptor.name)
    fields = {f.name: st.deferred(lambda f=f: _field(f)) for f in descriptor.fields}
    always = ALWAYS.get(descriptor.name, ())
    required = {name: fields.pop(name) for name in always}
    return st.fixed_dictionaries(required, optional=fields).map(lambda v: _build(cls, v))


def _absurd_test(path: str, examples: int) -> Callable[[Serving], None]:
    method = METHODS[path]

    @settings(max_examples=examples, **SETTINGS)
    @given(msg=absurd(method.input_type))
    def test(target: Serving, msg: Message) -> None:
        check_answer(path, invoke(target.channel, path, [msg.SerializeToString()]))

    return test


test_absurd_submit = _absurd_test("/cronoq.v1.Tasks/Submit", 80)
test_absurd_submit_batch = _absurd_test("/cronoq.v1.Tasks/SubmitBatch", 40)
test_absurd_cancel = _absurd_test("/cronoq.v1.Tasks/Cancel", 25)
test_absurd_get = _absurd_test("/cronoq.v1.Tasks/Get", 25)
test_absurd_list_tasks = _absurd_test("/cronoq.v1.Tasks/ListTasks", 30)
test_absurd_wait = _absurd_test("/cronoq.v1.Tasks/Wait", 25)
test_absurd_watch = _absurd_test(WATCH, 20)
test_absurd_add_recurring = _absurd_test("/cronoq.v1.Admin/AddRecurring", 60)
test_absurd_remove_recurring = _absurd_test("/cronoq.v1.Admin/RemoveRecurring", 20)


@pytest.mark.parametrize(
    "path",
    ["/cronoq.v1.Admin/Snapshot", "/cronoq.v1.Admin/ListWorkers", "/cronoq.v1.Admin/ListRecurring"],
)
def test_empty_requests_after_the_fuzzing(target: Serving, path: str) -> None:
    """The Admin views still answer, and their answers parse, whatever the fuzzing added."""
    outcome = invoke(target.channel, path, [b""])
    assert outcome.code is Code.OK, outcome
    check_answer(path, outcome)


# --- the INVALID_ARGUMENT row of docs/reference/errors.md, case by case ---------------------------


def _submit(**spec: Any) -> pb.SubmitRequest:
    return pb.SubmitRequest(task=pb.TaskSpec(**spec))


def _recurring(**kw: Any) -> pb.RecurringRequest:
    return pb.RecurringRequest(**{"name": "r", "cron": "* * * * *", **kw})


def _cases() -> Iterator[tuple[str, str, Message]]:
    bad_durations = [NAN, INF, -INF, -1.0, 1e300]
    for name in ("deadline_in_s", "start_in_s", "tolerance_s", "duration_hint_s", "timeout_s"):
        for v in bad_durations:
            yield f"{name}={v}", "Submit", _submit(**{name: v})
    for name in ("initial_backoff_s", "max_backoff_s"):
        for v in bad_durations:
            yield (
                f"retry.{name}={v}",
                "Submit",
                _submit(retry=pb.RetryPolicy(max_attempts=2, **{name: v})),
            )
    for v in (NAN, INF, -1.0, 1000.5):
        yield (
            f"retry.multiplier={v}",
            "Submit",
            _submit(retry=pb.RetryPolicy(max_attempts=2, multiplier=v)),
        )
    yield "no task", "Submit", pb.SubmitRequest()
    yield "tolerance_s without a start", "Submit", _submit(tolerance_s=1.0)
    yield "occurrence key", "Submit", _submit(key="k@2025-06-01T09:30:00Z")
    for v in (NAN, INF, -1.0):
        yield (
            f"wait_timeout_s={v}",
            "Submit",
            pb.SubmitRequest(task=pb.TaskSpec(), wait=True, wait_timeout_s=v),
        )
        yield f"Wait.timeout_s={v}", "Wait", pb.WaitRequest(task=pb.TaskRef(id=1), timeout_s=v)
    yield "both deadlines", "Submit", _submit(deadline_in_s=1.0, deadline_unix_ns=1)
    yield "both starts", "Submit", _submit(start_in_s=1.0, start_unix_ns=1)
    for v in (5, 99, -1, 2**31 - 1):
        yield f"priority={v}", "Submit", _submit(priority=v)
    yield "on_miss=4", "Submit", _submit(on_miss=4)
    yield "deps[0].cond=9", "Submit", _submit(deps=[pb.Dep(target=pb.TaskRef(id=1), cond=9)])
    for v in (0, 13, -1):
        yield f"statuses=[{v}]", "ListTasks", pb.ListTasksRequest(statuses=[v])
    for name in ("key", "kind", "pool", "tenant", "content_type"):
        yield f"{name} with NUL", "Submit", _submit(**{name: "x\0"})
    yield "tags key NUL", "Submit", _submit(tags={"a\0": "1"})
    yield "labels value NUL", "Submit", _submit(labels={"a": "\0"})
    yield "resources name NUL", "Submit", _submit(resources={"s\0": 1})
    yield "deps key NUL", "Submit", _submit(deps=[pb.Dep(target=pb.TaskRef(key="\0"))])
    yield "key too long", "Submit", _submit(key="k" * 257)
    yield "key too long in UTF-8", "Submit", _submit(key="é" * 129)
    yield "kind too long", "Submit", _submit(kind="k" * 129)
    yield "content_type too long", "Submit", _submit(content_type="t" * 129)
    yield "tag value too long", "Submit", _submit(tags={"a": "v" * 257})
    yield "reserved tag", "Submit", _submit(tags={"cronoq.content_type": "x"})
    yield "empty tag key", "Submit", _submit(tags={"": "x"})
    yield "9 tags", "Submit", _submit(tags={f"t{i}": "" for i in range(9)})
    yield "9 labels", "Submit", _submit(labels={f"l{i}": "" for i in range(9)})
    yield "9 deps", "Submit", _submit(deps=[pb.Dep(target=pb.TaskRef(id=1))] * 9)
    yield "5 resources", "Submit", _submit(resources={f"r{i}": 1 for i in range(5)})
    yield "resource amount 0", "Submit", _submit(resources={"sem": 0})
    yield "resource over capacity", "Submit", _submit(resources={"sem": 3})
    yield "resource amount 2**32-1", "Submit", _submit(resources={"sem": 2**32 - 1})
    yield "empty dep ref", "Submit", _submit(deps=[pb.Dep()])
    yield "dep id 0", "Submit", _submit(deps=[pb.Dep(target=pb.TaskRef(id=0))])
    for method, cls in (
        ("Get", pb.GetRequest),
        ("Cancel", pb.CancelRequest),
        ("Wait", pb.WaitRequest),
    ):
        yield f"{method} no ref", method, cls()
        yield f"{method} id 0", method, cls(task=pb.TaskRef(id=0))
        yield f"{method} empty key", method, cls(task=pb.TaskRef(key=""))
        yield f"{method} key NUL", method, cls(task=pb.TaskRef(key="\0"))
        yield f"{method} key too long", method, cls(task=pb.TaskRef(key="k" * 257))
    cycle = [
        pb.TaskSpec(key="cycle-a", deps=[pb.Dep(target=pb.TaskRef(key="cycle-b"))]),
        pb.TaskSpec(key="cycle-b", deps=[pb.Dep(target=pb.TaskRef(key="cycle-a"))]),
    ]
    yield "dependency cycle", "SubmitBatch", pb.SubmitBatchRequest(tasks=cycle)
    twice = [pb.TaskSpec(key="twice"), pb.TaskSpec(key="twice")]
    yield "duplicate key in a batch", "SubmitBatch", pb.SubmitBatchRequest(tasks=twice)
    yield (
        "batch past the limit",
        "SubmitBatch",
        pb.SubmitBatchRequest(tasks=[pb.TaskSpec()] * (MAX_BATCH + 1)),
    )
    yield (
        "batch with a NUL in task 3",
        "SubmitBatch",
        pb.SubmitBatchRequest(tasks=[pb.TaskSpec()] * 3 + [pb.TaskSpec(kind="\0")]),
    )
    yield "ListTasks pool NUL", "ListTasks", pb.ListTasksRequest(pools=["\0"])
    yield "Watch pool NUL", "Watch", pb.WatchRequest(pools=["\0"])
    yield "Watch key NUL", "Watch", pb.WatchRequest(keys=["\0"])
    yield "Watch key too long", "Watch", pb.WatchRequest(keys=["k" * 257])
    yield "recurring name empty", "AddRecurring", _recurring(name="")
    yield "recurring name too long", "AddRecurring", _recurring(name="n" * 257)
    yield "recurring name NUL", "AddRecurring", _recurring(name="\0")
    for cron in ("", "bad", "*/0 * * * *", "60 * * * *", "\0", "*" * 300):
        yield f"cron {cron[:10]!r}", "AddRecurring", _recurring(cron=cron)
    for tz in ("Nowhere/Nope", "../../etc/passwd", "\0", "z" * 300):
        yield f"tz {tz[:10]!r}", "AddRecurring", _recurring(tz=tz)
    yield "overlap=9", "AddRecurring", _recurring(overlap=9)
    yield (
        "template deps",
        "AddRecurring",
        _recurring(template=pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(id=1))])),
    )
    yield "template start_in_s", "AddRecurring", _recurring(template=pb.TaskSpec(start_in_s=1.0))
    yield (
        "template start_unix_ns",
        "AddRecurring",
        _recurring(template=pb.TaskSpec(start_unix_ns=1)),
    )
    yield (
        "template deadline_unix_ns",
        "AddRecurring",
        _recurring(template=pb.TaskSpec(deadline_unix_ns=1)),
    )
    yield "template timeout NaN", "AddRecurring", _recurring(template=pb.TaskSpec(timeout_s=NAN))
    yield "RemoveRecurring NUL", "RemoveRecurring", pb.RemoveRecurringRequest(name="\0")


CASES = list(_cases())


@pytest.mark.parametrize(("method", "request_"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_absurd_value_is_invalid_argument(target: Serving, method: str, request_: Message) -> None:
    service = "Admin" if "Recurring" in method else "Tasks"
    path = f"/cronoq.v1.{service}/{method}"
    outcome = invoke(target.channel, path, [request_.SerializeToString()], watch_s=3.0)
    assert outcome.code is Code.INVALID_ARGUMENT, f"{path} {request_!r}: {outcome}"
    assert outcome.details, "the refusal names the field and the rule"


def test_self_dependency_and_far_times_are_refused_or_harmless(target: Serving) -> None:
    """A task depending on its own key, and start/deadline times at the ends of int64."""
    stub = target.channel.unary_unary("/cronoq.v1.Tasks/Submit")
    own = _submit(key="self-dep", deps=[pb.Dep(target=pb.TaskRef(key="self-dep"))])
    with pytest.raises(grpc.RpcError) as info:
        stub(own.SerializeToString(), timeout=5)
    assert info.value.code() in (Code.INVALID_ARGUMENT, Code.NOT_FOUND), info.value.details()
    for ns in (-(2**63), -1, 0, 2**63 - 1):
        for name in ("start_unix_ns", "deadline_unix_ns"):
            request = _submit(pool="default", **{name: ns})
            check_answer(
                "/cronoq.v1.Tasks/Submit",
                invoke(target.channel, "/cronoq.v1.Tasks/Submit", [request.SerializeToString()]),
            )


def test_oversized_message_is_out_of_range(target: Serving) -> None:
    request = _submit(payload=b"x" * (MAX_MESSAGE + 1))
    outcome = invoke(target.channel, "/cronoq.v1.Tasks/Submit", [request.SerializeToString()])
    assert outcome.code is Code.OUT_OF_RANGE, outcome


# --- 3. absurd worker streams next to a well-behaved worker ----------------------------------


def _messages(outbox: queue.Queue[Any]) -> Iterator[Any]:
    while (msg := outbox.get()) is not None:
        yield msg


class GoodWorker:
    """A raw worker of pool "good" on its own connection: answers every lease with its payload
    reversed, until stopped. `ended` is how its stream ended, if it did."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outbox: queue.Queue[pb.WorkerMessage | None] = queue.Queue()
        register = pb.Register(pool="good", slots=2, worker_name="good", protocol_version=3)
        self.outbox.put(pb.WorkerMessage(register=register))
        self.registered = threading.Event()
        self.completed: list[int] = []  # task ids
        self.ended: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        call = self.channel.stream_stream(
            WORK,
            request_serializer=pb.WorkerMessage.SerializeToString,
            response_deserializer=pb.ServerMessage.FromString,
        )(_messages(self.outbox))
        try:
            for msg in call:
                kind = msg.WhichOneof("msg")
                if kind == "registered":
                    self.registered.set()
                elif kind == "lease":
                    self.completed.append(msg.lease.task_id)
                    done = pb.Complete(lease=msg.lease.lease, output=msg.lease.payload[::-1])
                    self.outbox.put(pb.WorkerMessage(complete=done))
                else:
                    self.ended = f"unexpected {msg}"
                    return
            self.ended = "OK"
        except grpc.RpcError as e:
            self.ended = f"{e.code().name}: {e.details()}"

    def stop(self) -> None:
        self.outbox.put(None)
        self.thread.join(5)
        self.channel.close()


class Client:
    """Submits tasks to pool "good" one after the other on its own connection and records how
    each ended: (task id, payload, status, output or the error)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.results: list[tuple[int, bytes, int, bytes | str]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def run_one(self, payload: bytes) -> tuple[int, bytes, int, bytes | str]:
        submit = self.channel.unary_unary(
            "/cronoq.v1.Tasks/Submit",
            request_serializer=pb.SubmitRequest.SerializeToString,
            response_deserializer=pb.SubmitResponse.FromString,
        )
        wait = self.channel.unary_unary(
            "/cronoq.v1.Tasks/Wait",
            request_serializer=pb.WaitRequest.SerializeToString,
            response_deserializer=pb.TaskResult.FromString,
        )
        task_id = 0
        try:
            task_id = submit(_submit(pool="good", payload=payload), timeout=5).id
            end = time.monotonic() + 5
            while True:  # the server caps each wait at max_wait_s
                try:
                    result = wait(pb.WaitRequest(task=pb.TaskRef(id=task_id)), timeout=5)
                    return task_id, payload, result.status, result.output
                except grpc.RpcError as e:
                    if e.code() is not Code.DEADLINE_EXCEEDED or time.monotonic() > end:
                        raise
        except grpc.RpcError as e:
            return task_id, payload, -1, f"{e.code().name}: {e.details()}"

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.results.append(self.run_one(b"good-%d" % i))
            i += 1
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def _register(**fields: Any) -> pb.Register:
    """A register of worker protocol v3, unless `protocol_version` says otherwise."""
    fields.setdefault("protocol_version", 3)
    return pb.Register(**fields)


LEASE_IDS = st.one_of(st.integers(0, 300), st.sampled_from([2**63, 2**64 - 1]))
FUZZ_POOLS = st.sampled_from(["fodder", "fodder", "fodder", "default", "", "nope", "\0", "p" * 300])
REGISTERS = st.builds(
    pb.Register,
    pool=FUZZ_POOLS,
    slots=st.sampled_from([0, 1, 3, 2**31, 2**32 - 1]),
    worker_name=STRINGS,
    protocol_version=st.sampled_from([0, 1, 2, 3, 4, 2**32 - 1]),
    labels=st.dictionaries(STRINGS, STRINGS, max_size=2),
)
RETRY_AFTER = st.one_of(st.none(), DURATIONS)


def _fail(lease: int, message: str, permanent: bool, retry_after: float | None) -> pb.Fail:
    fail = pb.Fail(lease=lease, message=message, permanent=permanent)
    if retry_after is not None:
        fail.retry_after_s = retry_after
    return fail


FAIL_MESSAGES = st.one_of(STRINGS, st.just("m\0" * 9000))
# messages a registered worker may send (about leases it may or may not hold)...
LAWFUL = st.one_of(
    st.builds(pb.WorkerMessage, heartbeat=st.builds(pb.Heartbeat, lease=LEASE_IDS)),
    st.builds(
        pb.WorkerMessage,
        complete=st.builds(
            pb.Complete, lease=LEASE_IDS, output=st.binary(max_size=8), content_type=STRINGS
        ),
    ),
    st.builds(
        pb.WorkerMessage,
        fail=st.builds(_fail, LEASE_IDS, FAIL_MESSAGES, st.booleans(), RETRY_AFTER),
    ),
    st.builds(pb.WorkerMessage, set_slots=st.builds(pb.SetSlots, slots=UINT32)),
    st.builds(pb.WorkerMessage, nack=st.builds(pb.Nack, lease=LEASE_IDS, reason=STRINGS)),
    st.builds(pb.WorkerMessage, cancelled=st.builds(pb.Cancelled, lease=LEASE_IDS)),
)
# ...and violations: a second register, no case set, a message over max_message_bytes
VIOLATIONS = st.one_of(
    st.builds(pb.WorkerMessage, register=REGISTERS),
    st.just(pb.WorkerMessage()),
    st.builds(
        pb.WorkerMessage,
        complete=st.builds(pb.Complete, lease=LEASE_IDS, output=st.just(b"o" * MAX_MESSAGE)),
    ),
)
WORKER_MESSAGES = st.one_of(LAWFUL, LAWFUL, LAWFUL, LAWFUL, LAWFUL, VIOLATIONS)
SAFE_TEXT = st.text(st.characters(blacklist_characters="\0"), max_size=8)
# a register the server accepts, into the fodder pool
GOOD_REGISTERS = st.builds(
    pb.Register,
    pool=st.just("fodder"),
    slots=st.sampled_from([1, 3, 2**32 - 1]),
    worker_name=SAFE_TEXT,
    protocol_version=st.sampled_from([3, 4, 2**32 - 1]),
    labels=st.dictionaries(SAFE_TEXT, SAFE_TEXT, max_size=2),
)
# what an absurd worker does with a lease it receives
REACTIONS = st.sampled_from(
    ["complete", "fail", "fail_forever", "nack", "cancelled", "heartbeat", "ignore", "drain",
     "register", "empty", "huge"]
)  # fmt: skip


def _react(reaction: str, lease: int) -> pb.WorkerMessage | None:
    return {
        "complete": pb.WorkerMessage(complete=pb.Complete(lease=lease, output=b"?")),
        "fail": pb.WorkerMessage(fail=pb.Fail(lease=lease, message="\0")),
        "fail_forever": pb.WorkerMessage(fail=_fail(lease, "", False, INF)),
        "nack": pb.WorkerMessage(nack=pb.Nack(lease=lease)),
        "cancelled": pb.WorkerMessage(cancelled=pb.Cancelled(lease=lease)),
        "heartbeat": pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=lease)),
        "ignore": None,
        "drain": pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)),
        "register": pb.WorkerMessage(register=_register(pool="fodder", slots=1)),
        "empty": pb.WorkerMessage(),
        "huge": pb.WorkerMessage(complete=pb.Complete(lease=lease, output=b"h" * MAX_MESSAGE)),
    }[reaction]


def absurd_stream(
    channel: grpc.Channel, plan: list[pb.WorkerMessage], reactions: list[str], open_s: float
) -> tuple[Outcome, list[pb.ServerMessage]]:
    """Send `plan`, answer leases with `reactions` in turn, half-close after `open_s`; how the
    stream ended and what the server sent."""
    outbox: queue.Queue[pb.WorkerMessage | None] = queue.Queue()
    for msg in plan:
        outbox.put(msg)
    closer = threading.Timer(open_s, outbox.put, [None])
    closer.start()
    call = channel.stream_stream(
        WORK,
        request_serializer=pb.WorkerMessage.SerializeToString,
        response_deserializer=pb.ServerMessage.FromString,
    )(_messages(outbox), timeout=5)
    got: list[pb.ServerMessage] = []
    try:
        for msg in call:
            got.append(msg)
            if msg.WhichOneof("msg") == "lease":
                answer = _react(reactions[len(got) % len(reactions)], msg.lease.lease)
                if answer is not None:
                    outbox.put(answer)
    except grpc.RpcError as e:
        return Outcome(e.code(), e.details() or "", []), got
    finally:
        closer.cancel()
        outbox.put(None)
    return Outcome(Code.OK, "", []), got


def _list_workers(channel: grpc.Channel) -> list[pb.WorkerInfo]:
    raw = channel.unary_unary("/cronoq.v1.Admin/ListWorkers")(b"", timeout=5)
    return list(pb.ListWorkersResponse.FromString(raw).workers)


def _workers_of(channel: grpc.Channel, *pools: str) -> list[str]:
    return [w.name for w in _list_workers(channel) if w.pool in pools]


def test_absurd_worker_streams_end_only_themselves(target: Serving) -> None:
    submit = target.channel.unary_unary("/cronoq.v1.Tasks/Submit")
    good = GoodWorker(target.address)
    assert good.registered.wait(5), good.ended
    client = Client(target.address)
    fuzz_channel = grpc.insecure_channel(target.address)
    streams: list[tuple[Outcome, list[str | None]]] = []

    # one stream of each ending the last assertion asks for, whatever the timing makes of the
    # generated ones: served until its half-close, refused as malformed, an unknown pool
    ok = pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=1))
    good_register = pb.Register(pool="fodder", slots=1, protocol_version=3)

    @settings(max_examples=50, **SETTINGS)
    @example(plan=[ok], registered_first=True, register=good_register, reactions=["ignore"])
    @example(plan=[ok], registered_first=False, register=good_register, reactions=["ignore"])
    @example(
        plan=[ok],
        registered_first=True,
        register=pb.Register(pool="nope", slots=1, protocol_version=3),
        reactions=["ignore"],
    )
    @given(
        plan=st.lists(WORKER_MESSAGES, min_size=1, max_size=6),
        registered_first=st.sampled_from([True, True, True, False]),
        register=st.one_of(GOOD_REGISTERS, GOOD_REGISTERS, GOOD_REGISTERS, REGISTERS),
        reactions=st.lists(REACTIONS, min_size=1, max_size=3),
    )
    def fuzz(
        plan: list[pb.WorkerMessage],
        registered_first: bool,
        register: pb.Register,
        reactions: list[str],
    ) -> None:
        for _ in range(3):  # leases for it to get: what earlier streams leave does not last
            submit(_submit(pool="fodder", payload=b"fodder").SerializeToString(), timeout=5)
        if registered_first:  # a proper start, then nonsense
            plan = [pb.WorkerMessage(register=register), *plan]
        outcome, got = absurd_stream(fuzz_channel, plan, reactions, open_s=0.1)
        kinds = [m.WhichOneof("msg") for m in got]
        streams.append((outcome, kinds))
        assert outcome.code in STREAM_ENDINGS, f"absurd stream ended {outcome}"
        assert kinds[:1] in ([], ["registered"]), kinds
        assert "registered" not in kinds[1:] and "shutdown" not in kinds, kinds
        assert good.ended is None, f"the good worker's stream ended: {good.ended}"
        assert target.server.proc.poll() is None, "the server died"

    try:
        fuzz()
    finally:
        client.stop()
        fuzz_channel.close()
    try:
        assert good.ended is None, f"the good worker's stream ended: {good.ended}"
        assert len(client.results) >= 5, client.results
        for task_id, payload, status, output in client.results:
            assert (status, output) == (pb.TASK_STATUS_SUCCEEDED, payload[::-1]), payload
            assert task_id in good.completed  # run by the good worker, none other
        # and after it all: the good worker still serves, and every absurd worker is gone
        after = client.run_one(b"after")
        assert after[1:] == (b"after", pb.TASK_STATUS_SUCCEEDED, b"retfa")
        deadline = time.monotonic() + 3
        while (left := _workers_of(target.channel, "fodder", "default", "good")) != ["good"]:
            assert time.monotonic() < deadline, f"workers left: {left}"
            time.sleep(0.05)
    finally:
        good.stop()
    assert good.ended == "OK"  # a half-close ends the stream with OK
    # some absurd streams were refused, some served until their half-close, some got leases
    assert {o.code for o, _ in streams} >= {Code.OK, Code.INVALID_ARGUMENT, Code.NOT_FOUND}
    assert sum("lease" in kinds for _, kinds in streams) >= 10


def _reg(pool: str = "edge", slots: int = 1, **kw: Any) -> pb.WorkerMessage:
    return pb.WorkerMessage(register=_register(pool=pool, slots=slots, **kw))


HUGE_COMPLETE = pb.WorkerMessage(complete=pb.Complete(lease=1, output=b"x" * MAX_MESSAGE))
STREAM_REFUSALS: list[tuple[str, list[pb.WorkerMessage], grpc.StatusCode]] = [
    (
        "first not register",
        [pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=1))],
        Code.INVALID_ARGUMENT,
    ),
    ("no case set", [pb.WorkerMessage()], Code.INVALID_ARGUMENT),
    ("set_slots first", [pb.WorkerMessage(set_slots=pb.SetSlots(slots=1))], Code.INVALID_ARGUMENT),
    ("unknown pool", [_reg("nope")], Code.NOT_FOUND),
    ("empty pool", [_reg("")], Code.NOT_FOUND),
    ("protocol version unset", [_reg(protocol_version=0)], Code.FAILED_PRECONDITION),
    ("protocol version 2", [_reg(protocol_version=2)], Code.FAILED_PRECONDITION),
    ("NUL in the name", [_reg(worker_name="\0")], Code.INVALID_ARGUMENT),
    ("NUL in a label", [_reg(labels={"a": "\0"})], Code.INVALID_ARGUMENT),
    ("label over max_tag_len", [_reg(labels={"a": "v" * 257})], Code.INVALID_ARGUMENT),
    ("labels over max_tags", [_reg(labels={f"l{i}": "" for i in range(9)})], Code.INVALID_ARGUMENT),
    ("second register", [_reg(), _reg()], Code.INVALID_ARGUMENT),
    ("no case set after register", [_reg(), pb.WorkerMessage()], Code.INVALID_ARGUMENT),
    ("oversized complete", [_reg(), HUGE_COMPLETE], Code.OUT_OF_RANGE),
]


@pytest.mark.parametrize(
    ("name", "plan", "code"), STREAM_REFUSALS, ids=[c[0] for c in STREAM_REFUSALS]
)
def test_worker_stream_refusals(
    target: Serving, name: str, plan: list[pb.WorkerMessage], code: grpc.StatusCode
) -> None:
    """docs/protocol.md, "Opening" and "Messages from the worker": a refused register or a protocol
    violation cuts the stream with its code (and a stream without a violation would end OK on the
    half-close)."""
    with grpc.insecure_channel(target.address) as channel:
        outcome, got = absurd_stream(channel, plan, ["ignore"], open_s=1.0)
    assert outcome.code is code, f"{name}: {outcome}"
    assert [m.WhichOneof("msg") for m in got] in ([], ["registered"])


@pytest.mark.parametrize("retry_after", [INF, NAN, -1.0, 1e300])
def test_fail_with_an_absurd_retry_after(target: Serving, retry_after: float) -> None:
    """A worker's `fail.retry_after_s` is a duration it sends: finite and within [0, 100 years]
    (docs/server-api.md, "Input rules"), else the stream is cut with INVALID_ARGUMENT; the attempt
    then fails as retryable like any of a dropped stream, so the task is offered again, never
    parked forever."""
    submit = target.channel.unary_unary("/cronoq.v1.Tasks/Submit")
    raw = submit(_submit(pool="edge", payload=b"edge").SerializeToString(), timeout=5)
    task_id = pb.SubmitResponse.FromString(raw).id
    with grpc.insecure_channel(target.address) as channel:
        register = pb.WorkerMessage(register=_register(pool="edge", slots=1))
        outbox: queue.Queue[pb.WorkerMessage | None] = queue.Queue()
        outbox.put(register)
        call = channel.stream_stream(
            WORK,
            request_serializer=pb.WorkerMessage.SerializeToString,
            response_deserializer=pb.ServerMessage.FromString,
        )(_messages(outbox), timeout=3)
        code = Code.OK
        try:
            for msg in call:
                if msg.WhichOneof("msg") == "lease":
                    outbox.put(
                        pb.WorkerMessage(fail=_fail(msg.lease.lease, "x", False, retry_after))
                    )
                    threading.Timer(1.0, outbox.put, [None]).start()
        except grpc.RpcError as e:
            code = e.code()
        finally:
            outbox.put(None)
    get = target.channel.unary_unary("/cronoq.v1.Tasks/Get")
    ref = pb.TaskRef(id=task_id)
    info = pb.TaskInfo.FromString(get(pb.GetRequest(task=ref).SerializeToString(), timeout=5))
    cancel = target.channel.unary_unary("/cronoq.v1.Tasks/Cancel")
    cancel(pb.CancelRequest(task=ref).SerializeToString(), timeout=5)  # leave "edge" empty
    status = pb.TaskStatus.Name(info.status)
    assert code is Code.INVALID_ARGUMENT, (
        f"retry_after_s={retry_after} answered {code.name}; the task is then {status}"
    )


def test_undecodable_message_after_register_ends_that_stream(target: Serving) -> None:
    """A registered worker whose next message does not decode: its stream ends at once (not at
    the client's deadline), the worker is unregistered, and no lease goes to it any more."""
    register = pb.WorkerMessage(register=_register(pool="corrupt", slots=2))
    outbox: queue.Queue[bytes | None] = queue.Queue()
    outbox.put(register.SerializeToString())
    outbox.put(b"\x80")  # a varint cut short
    with grpc.insecure_channel(target.address) as channel:
        started = time.monotonic()
        call = channel.stream_stream(WORK)(_messages(outbox), timeout=3)
        kinds = []
        code = Code.OK
        try:
            for raw in call:
                kinds.append(pb.ServerMessage.FromString(raw).WhichOneof("msg"))
        except grpc.RpcError as e:
            code = e.code()
        finally:
            outbox.put(None)
        elapsed = time.monotonic() - started
    time.sleep(0.3)
    workers = [(w.id, w.slots) for w in _list_workers(target.channel) if w.pool == "corrupt"]
    submit = target.channel.unary_unary("/cronoq.v1.Tasks/Submit")
    raw = submit(_submit(pool="corrupt").SerializeToString(), timeout=5)
    ref = pb.TaskRef(id=pb.SubmitResponse.FromString(raw).id)
    time.sleep(0.3)
    get = target.channel.unary_unary("/cronoq.v1.Tasks/Get")
    info = pb.TaskInfo.FromString(get(pb.GetRequest(task=ref).SerializeToString(), timeout=5))
    cancel = target.channel.unary_unary("/cronoq.v1.Tasks/Cancel")
    cancel(pb.CancelRequest(task=ref).SerializeToString(), timeout=5)
    assert kinds == ["registered"]
    assert (code, workers) == (Code.INVALID_ARGUMENT, []), (
        f"the stream ended {code.name} after {elapsed:.1f} s; still registered: {workers}; "
        f"a new task of its pool is {pb.TaskStatus.Name(info.status)}"
    )
    assert info.status == pb.TASK_STATUS_READY  # nobody holds it


# --- 4. the HTTP API -------------------------------------------------------------------------


def http_call(address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def check_http(route: str, status: int, body: bytes) -> None:
    """2xx with a JSON object, or 4xx with `{"error": "<text>", "code": "<reason>"}`; never
    5xx."""
    assert status < 500, f"{route}: {status} {body[:300]!r}"
    data = json.loads(body)
    assert isinstance(data, dict), body
    if status >= 400:
        assert set(data) == {"error", "code"}, body
        assert isinstance(data["code"], str) and isinstance(data["error"], str), body


JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(
        ["\0", "k" * 300, "PRIORITY_HIGH", "high", "bogus", "-1", "18446744073709551616", "!!"]
    ),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
SPEC_KEYS = [f.name for f in pb.TaskSpec.DESCRIPTOR.fields] + [
    "payload_b64",
    "after",
    "json",
    "contentType",
    "deadlineInS",
]
SPECS = st.fixed_dictionaries({}, optional={k: JSON_VALUES for k in SPEC_KEYS})
SUBMITS = st.fixed_dictionaries(
    {},
    optional={
        **{k: JSON_VALUES for k in SPEC_KEYS},
        "wait": JSON_VALUES,
        "wait_timeout_s": JSON_VALUES,
    },
)
BATCHES = st.fixed_dictionaries(
    {}, optional={"tasks": st.one_of(st.lists(SPECS, max_size=3), JSON_VALUES)}
)
RECURRINGS = st.fixed_dictionaries(
    {
        "name": st.one_of(st.just("http-fuzz"), st.just("http-fuzz"), JSON_VALUES),
        "cron": st.one_of(PARSABLE_CRONS, PARSABLE_CRONS, JSON_VALUES),
    },
    optional={
        "tz": JSON_VALUES,
        "template": st.one_of(SPECS, JSON_VALUES),
        "overlap": JSON_VALUES,
    },
)
ROUTE_BODIES = {
    "/v1/tasks": SUBMITS,
    "/v1/tasks:batch": BATCHES,
    "/v1/tasks/batch": BATCHES,
    "/v1/recurring": RECURRINGS,
    "/v1/tasks/1/cancel": JSON_VALUES,
}


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize("route", sorted(ROUTE_BODIES))
@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_http_post_random_bodies(target: Serving, route: str, data: st.DataObject) -> None:
    """Random bytes, random JSON and absurd objects of the route's shape: 2xx or a 4xx JSON
    error, never a 5xx."""
    shaped = ROUTE_BODIES[route].map(_dumps)
    body = data.draw(st.one_of(st.binary(max_size=64), JSON_VALUES.map(_dumps), shaped))
    status, answer = http_call(target.http_address, "POST", route, body)
    check_http(route, status, answer)


DEEP = b"[" * 5000 + b"]" * 5000
MALFORMED = {
    "nested 5000 deep": DEEP,
    "json nested 5000 deep": b'{"json": ' + DEEP + b"}",
    "template nested 5000 deep": b'{"template": ' + DEEP + b"}",
    "5000 digits": b"1" * 5000,
    "not UTF-8": b"\xff\xfe",
    "NaN": b"NaN",
    "tasks not a list": b'{"tasks": 5}',
    "id 1e999": b'{"deps": [{"target": {"id": 1e999}}]}',
    "dep id 1e999": b'{"deps": [{"id": 1e999}], "after": [1e999]}',
    "payload_b64 not base64": b'{"payload_b64": "!!!"}',
    "payload and payload_b64": b'{"payload": "", "payload_b64": ""}',
    "payload and json": b'{"payload": "", "json": 1}',
    "priority 99": b'{"priority": 99}',
    "empty": b"",
}


@pytest.mark.parametrize("route", sorted(ROUTE_BODIES))
@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_http_post_malformed_bodies(target: Serving, route: str, body: bytes) -> None:
    status, answer = http_call(target.http_address, "POST", route, body)
    check_http(route, status, answer)


PATH_KEYS = st.one_of(
    st.sampled_from(["\0", "k" * 300, "%", "a/b", "..", " ", "é"]), st.text(min_size=1, max_size=8)
)
PATH_IDS = st.one_of(st.sampled_from([0, 1, 2**64 - 1, 2**64, 10**40]), st.integers(0, 2**70))


@settings(max_examples=40, **SETTINGS)
@given(key=PATH_KEYS, task_id=PATH_IDS, body=st.one_of(st.none(), st.binary(max_size=16)))
def test_http_absurd_paths(target: Serving, key: str, task_id: int, body: bytes | None) -> None:
    """Cancel and read by absurd id or key, and DELETE an absurd schedule name: never a 5xx."""
    quoted = urllib.parse.quote(key, safe="")
    for method, path in (
        ("DELETE", f"/v1/tasks/{task_id}"),
        ("DELETE", f"/v1/tasks/by-key/{quoted}"),
        ("GET", f"/v1/tasks/{task_id}"),
        ("GET", f"/v1/tasks/by-key/{quoted}"),
        ("POST", f"/v1/tasks/{task_id}/cancel"),
        ("POST", f"/v1/tasks/by-key/{quoted}/cancel"),
        ("DELETE", f"/v1/recurring/{quoted}"),
    ):
        status, answer = http_call(target.http_address, method, path, body)
        check_http(path, status, answer)


# --- last: the server survived it all --------------------------------------------------------


def test_server_survived_the_fuzzing(target: Serving) -> None:
    assert target.server.proc.poll() is None, "the server process died"
    status, body = http_call(target.http_address, "GET", "/healthz")
    assert (status, body) == (200, b"ok")
    submit = target.channel.unary_unary("/cronoq.v1.Tasks/Submit")
    task_id = pb.SubmitResponse.FromString(
        submit(_submit(pool="good", key="survivor").SerializeToString(), timeout=5)
    ).id
    get = target.channel.unary_unary("/cronoq.v1.Tasks/Get")
    info = pb.TaskInfo.FromString(
        get(pb.GetRequest(task=pb.TaskRef(id=task_id)).SerializeToString(), timeout=5)
    )
    assert (info.id, info.key, info.pool) == (task_id, "survivor", "good")
    assert target.server.terminate(timeout=15) == 0
    # the services' own errors ("unexpected error serving a call" and the like); grpc's
    # logs of undecodable requests are test_random_bytes's
    errors = [line for line in target.server.lines if "level=error logger=cronoq" in line]
    assert not errors, "\n".join(errors[:5])
