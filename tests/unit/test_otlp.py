"""cronoq._otlp: the span encoders (native and Python, byte for byte, and what
opentelemetry-proto serializes), the Exporter against a real OTLP/HTTP receiver
(tests/helpers/otlp.py), from_env's variables and the W3C traceparent helpers."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cronoq import _otlp
from cronoq._otlp import (
    Exporter,
    Record,
    encode,
    encode_python,
    format_traceparent,
    from_env,
    new_span_id,
    new_trace_id,
    parse_traceparent,
)
from helpers.auth import make_pki
from helpers.otlp import OtlpReceiver, decode

native = _otlp.native_encode
needs_native = pytest.mark.skipif(native is None, reason="the native extension is not built")

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = "53995c3f42cd8ad8"


def record(name: str = "work", **fields: Any) -> Record:
    base: dict[str, Any] = {
        "trace_id": TRACE,
        "span_id": new_span_id(),
        "parent_span_id": PARENT,
        "name": name,
        "kind": 2,
        "start_ns": 1_700_000_000_000_000_000,
        "end_ns": 1_700_000_000_123_456_789,
        "attributes": (("cronoq.pool", "default"), ("cronoq.task_id", 42)),
        "status_code": 0,
        "status_message": "",
        "links": (),
    }
    base.update(fields)
    return tuple(base.values())  # type: ignore[return-value]


def test_the_test_run_has_the_native_encoder() -> None:
    """scripts/test.sh sets CRONOQ_REQUIRE_NATIVE: a native build without otlp_encode must fail
    the suite, not skip the comparisons."""
    if os.environ.get("CRONOQ_REQUIRE_NATIVE") == "1":
        assert native is not None


# --- encoding ---------------------------------------------------------------------------------

hex128 = st.integers(1, 2**128 - 1).map(lambda n: f"{n:032x}")
hex64 = st.integers(1, 2**64 - 1).map(lambda n: f"{n:016x}")
texts = st.text(st.characters(codec="utf-8"), max_size=40)
values = st.one_of(
    texts,
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, -1, 1, 127, 128, 2**63 - 1, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
records = st.tuples(
    hex128,
    hex64,
    st.one_of(st.just(""), hex64),
    texts,
    st.integers(0, 5),
    st.one_of(st.just(0), st.integers(0, 2**64 - 1)),
    st.one_of(st.just(0), st.integers(0, 2**64 - 1)),
    st.lists(st.tuples(texts, values), max_size=6).map(tuple),
    st.integers(0, 2),
    texts,
    st.lists(st.tuples(hex128, hex64), max_size=3).map(tuple),
)
resources = st.dictionaries(texts, texts, max_size=5)


@needs_native
@settings(max_examples=300, deadline=None)
@given(resources, texts, texts, st.lists(records, max_size=8))
def test_native_and_python_encoders_give_the_same_bytes(
    resource: dict[str, str], scope: str, version: str, spans: list[Record]
) -> None:
    assert native is not None
    assert native(resource, scope, version, spans) == encode_python(resource, scope, version, spans)


def reference(resource: dict[str, str], scope: str, version: str, spans: list[Record]) -> bytes:
    """The same request built with opentelemetry-proto's classes and serialized by protobuf."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.SetInParent()
    for key, value in resource.items():
        resource_spans.resource.attributes.add(key=key).value.string_value = value
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.SetInParent()
    scope_spans.scope.name = scope
    scope_spans.scope.version = version
    for trace_id, span_id, parent, name, kind, start, end, attrs, code, message, links in spans:
        span = scope_spans.spans.add()
        span.trace_id = bytes.fromhex(trace_id)
        span.span_id = bytes.fromhex(span_id)
        span.parent_span_id = bytes.fromhex(parent)
        span.name = name
        span.kind = kind  # type: ignore[assignment]
        span.start_time_unix_nano = start
        span.end_time_unix_nano = end
        for key, value in attrs:
            pair = span.attributes.add(key=key)
            if isinstance(value, bool):
                pair.value.bool_value = value
            elif isinstance(value, str):
                pair.value.string_value = value
            elif isinstance(value, int):
                pair.value.int_value = value
            else:
                pair.value.double_value = value
        for link_trace, link_span in links:
            span.links.add(trace_id=bytes.fromhex(link_trace), span_id=bytes.fromhex(link_span))
        if code or message:
            span.status.code = code  # type: ignore[assignment]
            span.status.message = message
    return request.SerializeToString()


@settings(max_examples=200, deadline=None)
@given(resources, texts, texts, st.lists(records, max_size=8))
def test_the_encoding_is_what_protobuf_serializes(
    resource: dict[str, str], scope: str, version: str, spans: list[Record]
) -> None:
    body = encode_python(resource, scope, version, spans)
    assert body == reference(resource, scope, version, spans)
    assert encode(resource, scope, version, spans) == body


def test_decoded_fields_round_trip() -> None:
    spans = [
        record(
            "one",
            attributes=(("s", "é✓"), ("i", -5), ("big", 2**63 - 1), ("f", 0.25), ("b", False)),
            status_code=2,
            status_message="boom",
            links=((TRACE, PARENT),),
        ),
        record("root", parent_span_id="", kind=1, attributes=()),
    ]
    body = encode({"service.name": "svc"}, "cronoq", "9.9", spans)
    one, root = decode(body)
    assert (one.trace_id, one.span_id, one.parent_span_id) == (TRACE, spans[0][1], PARENT)
    assert (one.name, one.kind, one.start_ns, one.end_ns) == ("one", 2, *spans[0][5:7])
    assert one.attributes == {"s": "é✓", "i": -5, "big": 2**63 - 1, "f": 0.25, "b": False}
    assert (one.status_code, one.status_message) == (2, "boom")
    assert one.links == [(TRACE, PARENT)]
    assert one.resource == {"service.name": "svc"}
    assert (one.scope_name, one.scope_version) == ("cronoq", "9.9")
    assert (root.parent_span_id, root.kind, root.attributes) == ("", 1, {})


def test_an_empty_batch_encodes() -> None:
    body = encode({}, "", "", [])
    assert body == reference({}, "", "", [])
    assert decode(body) == []


BAD: list[tuple[str, Any, type[Exception]]] = [
    ("not a tuple", "span", TypeError),
    ("too short", record()[:10], ValueError),
    ("trace id uppercase", record(trace_id=TRACE.upper()), ValueError),
    ("trace id short", record(trace_id=TRACE[:30]), ValueError),
    ("trace id not str", record(trace_id=1), TypeError),
    ("span id non-hex", record(span_id="zz" * 8), ValueError),
    ("span id surrogate", record(span_id="\ud800" * 16), ValueError),
    ("parent bytes", record(parent_span_id=b"x"), TypeError),
    ("parent short", record(parent_span_id="abc"), ValueError),
    ("parent surrogate", record(parent_span_id="\udc00"), ValueError),
    ("name not str", record(name=None), TypeError),  # type: ignore[arg-type]
    ("name surrogate", record(name="a\ud800"), ValueError),
    ("kind too big", record(kind=6), ValueError),
    ("kind negative", record(kind=-1), ValueError),
    ("kind huge", record(kind=2**70), ValueError),
    ("kind float", record(kind=2.0), TypeError),
    ("start negative", record(start_ns=-1), ValueError),
    ("end over u64", record(end_ns=2**64), ValueError),
    ("attributes dict", record(attributes={"a": 1}), TypeError),
    ("attribute triple", record(attributes=(("a", 1, 2),)), ValueError),
    ("attribute key int", record(attributes=((1, 1),)), TypeError),
    ("attribute value None", record(attributes=(("a", None),)), TypeError),
    ("attribute value bytes", record(attributes=(("a", b"x"),)), TypeError),
    ("attribute int over int64", record(attributes=(("a", 2**63),)), ValueError),
    ("attribute int under int64", record(attributes=(("a", -(2**63) - 1),)), ValueError),
    ("attribute value surrogate", record(attributes=(("a", "\ud800"),)), ValueError),
    ("link not pair", record(links=((TRACE,),)), ValueError),
    ("link bad span", record(links=((TRACE, "x"),)), ValueError),
    ("status code 3", record(status_code=3), ValueError),
    ("status message int", record(status_message=3), TypeError),
]


@pytest.mark.parametrize(("case", "bad", "error"), BAD, ids=[c for c, _, _ in BAD])
def test_malformed_records_raise_naming_the_index_and_field(
    case: str, bad: Any, error: type[Exception]
) -> None:
    spans = [record(), bad]
    with pytest.raises(error) as python_error:
        encode_python({"k": "v"}, "s", "v", spans)
    assert str(python_error.value).startswith("span 1")
    if native is not None:
        with pytest.raises(error) as native_error:
            native({"k": "v"}, "s", "v", spans)
        assert str(native_error.value) == str(python_error.value)


@pytest.mark.parametrize(
    ("resource", "scope", "spans", "error"),
    [
        ({"k": 1}, "s", [], TypeError),
        ({1: "v"}, "s", [], TypeError),
        ({"k": "\ud800"}, "s", [], ValueError),
        ({}, 1, [], TypeError),
        ({}, "s", None, TypeError),
    ],
)
def test_malformed_arguments_raise(resource: Any, scope: Any, spans: Any, error: type) -> None:
    with pytest.raises(error):
        encode_python(resource, scope, "", spans)
    if native is not None:
        with pytest.raises(error):
            native(resource, scope, "", spans)


@needs_native
def test_the_native_encoder_releases_the_gil() -> None:
    """Another thread runs Python while a large batch is being encoded."""
    assert native is not None
    spans = [record(attributes=tuple((f"k{i}", "v" * 50) for i in range(20)))] * 20000
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    body = native({}, "", "", spans)  # warm up
    counter = threading.Thread(target=count)
    counter.start()
    try:
        for _ in range(3):
            assert native({}, "", "", spans) == body
    finally:
        done.set()
        counter.join()
    assert ticks > 0


# --- the exporter -----------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture
def exporters() -> Iterator[Callable[..., Exporter]]:
    """Makes Exporters that are shut down at the end of the test."""
    made: list[Exporter] = []

    def make(endpoint: str, **options: Any) -> Exporter:
        options.setdefault("resource", {"service.name": "test"})
        exporter = Exporter(endpoint, **options)
        made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.shutdown(timeout=5)


def test_what_the_exporter_sends_the_receiver_decodes(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter]
) -> None:
    exporter = exporters(
        receiver.traces_url,
        headers={"Authorization": "Bearer t0k", "x-tenant": "a b"},
        resource={"service.name": "svc", "deployment.environment": "test"},
        interval=3600,
    )
    sent = [
        record(
            "submit",
            attributes=(("s", "ü"), ("n", -(2**63)), ("f", -1.5), ("b", True)),
            status_code=1,
            status_message="fine",
            links=((new_trace_id(), new_span_id()),),
        ),
        record("root", parent_span_id="", kind=3, status_code=2, status_message="failed"),
    ]
    for r in sent:
        exporter.add(r)
    assert exporter.flush(timeout=10)
    got = {s.name: s for s in receiver.spans}
    assert set(got) == {"submit", "root"}
    for r in sent:
        s = got[r[3]]
        assert (s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind) == r[:5]
        assert (s.start_ns, s.end_ns) == r[5:7]
        assert s.attributes == dict(r[7])
        assert (s.status_code, s.status_message) == r[8:10]
        assert s.links == list(r[10])
        assert s.resource == {"service.name": "svc", "deployment.environment": "test"}
        assert (s.scope_name, s.scope_version) == ("cronoq", _otlp.VERSION)
    [request] = receiver.requests
    assert request.headers["content-type"] == "application/x-protobuf"
    assert request.headers["authorization"] == "Bearer t0k"
    assert request.headers["x-tenant"] == "a b"
    assert request.headers["user-agent"].startswith("cronoq/")
    assert exporter.exported == 2
    assert exporter.dropped == 0


def test_a_full_batch_is_exported_without_waiting_for_the_interval(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter]
) -> None:
    exporter = exporters(receiver.traces_url, batch=10, interval=3600)
    for i in range(25):
        exporter.add(record(f"s{i}"))
    receiver.wait_for(lambda r: len(r.spans) >= 10, what="a full batch")
    assert all(request.spans <= 10 for request in receiver.requests)
    assert exporter.flush(timeout=10)
    assert sorted(s.name for s in receiver.spans) == sorted(f"s{i}" for i in range(25))


def test_the_interval_exports_what_is_queued(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter]
) -> None:
    exporter = exporters(receiver.traces_url, interval=0.05)
    exporter.add(record("tick"))
    receiver.wait_for(lambda r: len(r.spans) == 1, what="the timer's export")


def test_503s_are_retried_and_lose_nothing(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter]
) -> None:
    receiver.fail_next(3, 503, retry_after="0")
    exporter = exporters(receiver.traces_url, interval=3600)
    for i in range(50):
        exporter.add(record(f"s{i}"))
    assert exporter.flush(timeout=30)
    assert [r.status for r in receiver.requests] == [503, 503, 503, 200]
    assert sorted(s.name for s in receiver.spans) == sorted(f"s{i}" for i in range(50))
    assert (exporter.exported, exporter.dropped) == (50, 0)


@pytest.mark.parametrize("status", [429, 502, 504])
def test_other_retryable_answers_back_off_and_retry(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter], status: int
) -> None:
    receiver.fail_next(2, status)
    exporter = exporters(receiver.traces_url, interval=3600, retry_delay=0.01)
    exporter.add(record())
    assert exporter.flush(timeout=30)
    assert [r.status for r in receiver.requests] == [status, status, 200]
    assert len(receiver.spans) == 1


def test_a_permanent_error_drops_the_batch_and_logs_once_per_streak(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cronoq.otlp")
    exporter = exporters(receiver.traces_url, interval=3600, retry_delay=0.01)
    receiver.fail_next(3, 400)
    for _ in range(3):
        exporter.add(record())
        exporter.add(record())
        assert not exporter.flush(timeout=10)
    assert [r.status for r in receiver.requests] == [400, 400, 400]  # not retried
    assert exporter.dropped == 6
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "HTTP 400" in warnings[0].getMessage()
    assert "dropped 2 spans" in warnings[0].getMessage()

    exporter.add(record())
    assert exporter.flush(timeout=10)
    recovered = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(recovered) == 1
    assert "6 spans were dropped" in recovered[0].getMessage()

    receiver.fail_next(1, 500)
    exporter.add(record())
    assert not exporter.flush(timeout=10)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_an_unreachable_collector_is_retried_then_given_up(
    exporters: Callable[..., Exporter], caplog: pytest.LogCaptureFixture
) -> None:
    with OtlpReceiver() as gone:
        url = gone.traces_url  # a port nothing listens on once it is stopped
    exporter = exporters(url, interval=3600, max_retries=2, retry_delay=0.01)
    for _ in range(5):
        exporter.add(record())
    assert not exporter.flush(timeout=30)
    assert exporter.dropped == 5
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "after 3 attempts" in warning.getMessage()
    assert warning.name == "cronoq.otlp"


def test_a_queue_over_max_queue_drops_and_counts(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter]
) -> None:
    exporter = exporters(receiver.traces_url, max_queue=10, batch=1000, interval=3600)
    for i in range(25):
        assert exporter.add(record(f"s{i}")) is None  # type: ignore[func-returns-value]
    assert (exporter.queued, exporter.dropped) == (10, 15)
    assert exporter.flush(timeout=10)
    assert sorted(s.name for s in receiver.spans) == sorted(f"s{i}" for i in range(10))


def test_add_never_blocks_on_a_hung_collector(exporters: Callable[..., Exporter]) -> None:
    """A collector that accepts connections and never answers: the thread waits on it, the
    callers' adds go on (and drop over max_queue)."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/traces"
        exporter = exporters(url, max_queue=100, batch=10, interval=3600, timeout=30)
        for _ in range(1000):
            exporter.add(record())
        assert exporter.dropped >= 900 - 10
        assert exporter.queued <= 100
        # shutdown gives up at its timeout rather than waiting for the collector
        assert not exporter.shutdown(timeout=0.2)
        assert not exporter.shutdown(timeout=0.2)  # a repeat gives the same answer


def test_retry_after() -> None:
    import email.utils
    import time

    assert _otlp._retry_after(None) is None
    assert _otlp._retry_after("") is None
    assert _otlp._retry_after("7") == 7.0
    assert _otlp._retry_after("soon") is None
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    assert _otlp._retry_after(past) == 0.0
    later = _otlp._retry_after(email.utils.formatdate(time.time() + 3600, usegmt=True))
    assert later is not None and 3000 < later <= 3600


def test_shutdown_exports_what_is_queued_and_is_idempotent(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter]
) -> None:
    exporter = exporters(receiver.traces_url, interval=3600, batch=30)
    for i in range(100):
        exporter.add(record(f"s{i}"))
    assert exporter.shutdown(timeout=10)
    assert len(receiver.spans) == 100
    assert all(request.spans <= 30 for request in receiver.requests)
    assert not exporter._thread.is_alive()
    assert exporter.shutdown(timeout=10)  # again: nothing happens, the same answer
    exporter.add(record("late"))
    assert exporter.dropped == 1
    assert exporter.flush(timeout=1)  # nothing queued
    assert len(receiver.spans) == 100


def test_a_malformed_record_is_dropped_alone(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter], caplog: pytest.LogCaptureFixture
) -> None:
    exporter = exporters(receiver.traces_url, interval=3600)
    exporter.add(record("good"))
    exporter.add(record("bad", kind=99))
    exporter.add(record("also good"))
    assert not exporter.flush(timeout=10)  # one span of it was dropped
    assert sorted(s.name for s in receiver.spans) == ["also good", "good"]
    assert exporter.dropped == 1
    assert "span 1 kind" in caplog.text
    exporter.add(record("bad again", kind=99))
    assert not exporter.flush(timeout=10)
    assert exporter.dropped == 2
    assert caplog.text.count("malformed") == 1


def test_https_with_a_ca_file(tmp_path: Path, exporters: Callable[..., Exporter]) -> None:
    pki = make_pki(tmp_path)
    with OtlpReceiver(certfile=str(pki / "server.pem"), keyfile=str(pki / "server.key")) as tls:
        assert tls.traces_url.startswith("https://localhost:")
        exporter = exporters(tls.traces_url, ca_file=str(pki / "ca.pem"), interval=3600)
        exporter.add(record("secure"))
        assert exporter.flush(timeout=10)
        assert tls.span_named("secure").trace_id == TRACE

        untrusting = exporters(tls.traces_url, interval=3600, max_retries=0)
        untrusting.add(record("refused"))
        assert not untrusting.flush(timeout=10)  # the system CAs do not know the test CA
        assert untrusting.dropped == 1


def test_the_receiver_serves_async_tests_too(
    receiver: OtlpReceiver, exporters: Callable[..., Exporter]
) -> None:
    async def scenario() -> None:
        exporter = exporters(receiver.traces_url, interval=0.05)
        exporter.add(record("from a coroutine"))
        await receiver.until(lambda r: len(r.spans) == 1, what="the span")

    asyncio.run(scenario())
    assert receiver.span_named("from a coroutine").kind == 2


# --- from_env ---------------------------------------------------------------------------------


@pytest.fixture
def env_exporter() -> Iterator[Callable[..., Exporter | None]]:
    made: list[Exporter] = []

    def make(env: dict[str, str], **overrides: Any) -> Exporter | None:
        overrides.setdefault("service_name", "cronoq-server")
        exporter = from_env(env, **overrides)
        if exporter is not None:
            made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.shutdown(timeout=1)


BASE = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


def test_no_endpoint_means_no_exporter(env_exporter: Callable[..., Exporter | None]) -> None:
    assert env_exporter({}) is None
    assert env_exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) is None  # empty is unset
    assert env_exporter({"OTEL_SERVICE_NAME": "x"}) is None


def test_endpoints(env_exporter: Callable[..., Exporter | None]) -> None:
    def endpoint(env: dict[str, str], **overrides: Any) -> str:
        exporter = env_exporter(env, **overrides)
        assert exporter is not None
        return exporter.endpoint

    assert endpoint(BASE) == "http://collector:4318/v1/traces"
    assert (
        endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c/otlp/"}) == "https://c/otlp/v1/traces"
    )
    traces = {**BASE, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/custom"}
    assert endpoint(traces) == "http://t:1/custom"  # as is, and over the base
    assert endpoint(traces, endpoint="http://cfg:2/x") == "http://cfg:2/x"  # explicit wins
    assert endpoint({}, endpoint="http://cfg:2/x") == "http://cfg:2/x"
    # OTEL_TRACES_EXPORTER=otlp without an endpoint: the specification's default
    assert endpoint({"OTEL_TRACES_EXPORTER": "otlp"}) == "http://localhost:4318/v1/traces"
    assert endpoint({}, enabled=True) == "http://localhost:4318/v1/traces"


def test_disabled(env_exporter: Callable[..., Exporter | None]) -> None:
    assert env_exporter({**BASE, "OTEL_SDK_DISABLED": "true"}) is None
    assert env_exporter({**BASE, "OTEL_SDK_DISABLED": "TRUE"}) is None
    assert env_exporter({**BASE, "OTEL_SDK_DISABLED": "false"}) is not None
    assert env_exporter({**BASE, "OTEL_SDK_DISABLED": "1"}) is not None  # only "true" disables
    assert env_exporter({**BASE, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert env_exporter({**BASE, "OTEL_TRACES_EXPORTER": "otlp"}) is not None
    assert env_exporter(BASE, enabled=False) is None
    assert env_exporter({**BASE, "OTEL_SDK_DISABLED": "true"}, enabled=True) is not None
    assert env_exporter({**BASE, "OTEL_TRACES_EXPORTER": "none"}, enabled=True) is not None


def test_an_unsupported_exporter_is_an_error(env_exporter: Callable[..., Exporter | None]) -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER='zipkin' is not supported"):
        env_exporter({**BASE, "OTEL_TRACES_EXPORTER": "zipkin"})


def test_protocols(env_exporter: Callable[..., Exporter | None]) -> None:
    ok = {**BASE, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert env_exporter(ok) is not None
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL='grpc' is not supported"):
        env_exporter({**BASE, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'"):
        env_exporter({**ok, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"})
    traces_ok = {**BASE, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    traces_ok["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    assert env_exporter(traces_ok) is not None  # the signal's variable wins
    assert env_exporter({**BASE, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, protocol="http/protobuf")
    with pytest.raises(ValueError, match="protocol='grpc'"):
        env_exporter(BASE, protocol="grpc")


def test_headers(env_exporter: Callable[..., Exporter | None]) -> None:
    def headers(env: dict[str, str], **overrides: Any) -> dict[str, str]:
        exporter = env_exporter({**BASE, **env}, **overrides)
        assert exporter is not None
        return {
            k: v for k, v in exporter.headers.items() if k not in ("Content-Type", "User-Agent")
        }

    generic = {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s%20ecret, x-a = 1 ,,x-eq=a=b"}
    assert headers(generic) == {"api-key": "s ecret", "x-a": "1", "x-eq": "a=b"}
    traces = {**generic, "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-t=2"}
    assert headers(traces) == {"x-t": "2"}  # the signal's variable replaces the generic one
    assert headers(traces, headers={"x-t": "cfg", "x-c": "3"}) == {"x-t": "cfg", "x-c": "3"}
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_HEADERS: 'novalue' is not key=value"):
        headers({"OTEL_EXPORTER_OTLP_HEADERS": "a=1,novalue"})


def test_timeouts_and_certificates(env_exporter: Callable[..., Exporter | None]) -> None:
    def made(env: dict[str, str], **overrides: Any) -> Exporter:
        exporter = env_exporter({**BASE, **env}, **overrides)
        assert exporter is not None
        return exporter

    assert made({}).timeout == 10.0
    assert made({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}).timeout == 2.5
    both = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "500"}
    assert made(both).timeout == 0.5
    assert made(both, timeout=7).timeout == 7
    with pytest.raises(ValueError, match="not a number of milliseconds"):
        made({"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"})
    with pytest.raises(ValueError, match="positive"):
        made({"OTEL_EXPORTER_OTLP_TIMEOUT": "0"})

    assert made({}).ca_file is None
    assert made({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/a.pem"}).ca_file == "/a.pem"
    certs = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/a.pem",
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/b",
    }
    assert made(certs).ca_file == "/b"
    assert made(certs, certificate="/c").ca_file == "/c"


def test_batch_settings(env_exporter: Callable[..., Exporter | None]) -> None:
    bsp = {
        **BASE,
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10",
        "OTEL_BSP_SCHEDULE_DELAY": "250",
    }
    exporter = env_exporter(bsp)
    assert exporter is not None
    assert (exporter.max_queue, exporter.batch, exporter.interval) == (100, 10, 0.25)
    exporter = env_exporter(bsp, max_queue=5, batch=2, interval=3.0)
    assert exporter is not None
    assert (exporter.max_queue, exporter.batch, exporter.interval) == (5, 2, 3.0)
    with pytest.raises(ValueError, match="OTEL_BSP_MAX_QUEUE_SIZE='many' is not an integer"):
        env_exporter({**BASE, "OTEL_BSP_MAX_QUEUE_SIZE": "many"})


def test_the_resource(env_exporter: Callable[..., Exporter | None]) -> None:
    def resource(env: dict[str, str], **overrides: Any) -> dict[str, str]:
        exporter = env_exporter({**BASE, **env}, **overrides)
        assert exporter is not None
        return exporter.resource

    import importlib.metadata

    version = importlib.metadata.version("cronoq")
    assert resource({}) == {
        "service.name": "cronoq-server",
        "service.version": version,
        "telemetry.sdk.name": "cronoq",
        "telemetry.sdk.language": "python",
        "telemetry.sdk.version": version,
    }
    attrs = {
        "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,host.name=h%2C1,service.version=7"
    }
    got = resource(attrs)
    assert (got["service.name"], got["host.name"], got["service.version"]) == (
        "from-attrs",
        "h,1",
        "7",
    )
    named = {**attrs, "OTEL_SERVICE_NAME": "from-name"}
    assert resource(named)["service.name"] == "from-name"  # over OTEL_RESOURCE_ATTRIBUTES
    overridden = resource(named, resource={"service.name": "from-config", "k": "v"})
    assert (overridden["service.name"], overridden["k"]) == ("from-config", "v")
    assert resource({}, service_name="worker")["service.name"] == "worker"


# --- ids and traceparent ----------------------------------------------------------------------


def test_new_ids() -> None:
    traces = {new_trace_id() for _ in range(1000)}
    spans = {new_span_id() for _ in range(1000)}
    assert len(traces) == len(spans) == 1000
    for t in traces:
        assert len(t) == 32 and int(t, 16) != 0 and t == t.lower()
    for s in spans:
        assert len(s) == 16 and int(s, 16) != 0 and s == s.lower()


VALID = f"00-{TRACE}-{SPAN}-01"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (VALID, (TRACE, SPAN, True)),
        (f"00-{TRACE}-{SPAN}-00", (TRACE, SPAN, False)),
        (f"00-{TRACE}-{SPAN}-02", (TRACE, SPAN, False)),  # only bit 0 is "sampled"
        (f"00-{TRACE}-{SPAN}-ff", (TRACE, SPAN, True)),
        (f" {VALID}\t", (TRACE, SPAN, True)),  # optional whitespace around a header value
        (f"01-{TRACE}-{SPAN}-01", (TRACE, SPAN, True)),  # a later version, no extra fields
        (f"cc-{TRACE}-{SPAN}-09-what-the-future-holds", (TRACE, SPAN, True)),
    ],
)
def test_parse_traceparent(header: str, expected: tuple[str, str, bool]) -> None:
    assert parse_traceparent(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        "",
        "00",
        VALID[:-1],
        VALID + "-",  # version 00 has nothing after the flags
        VALID + "0",
        f"01-{TRACE}-{SPAN}-01x",  # a later version's extra fields follow a dash
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"0g-{TRACE}-{SPAN}-01",
        f"00-{TRACE.upper()}-{SPAN}-01",
        f"00-{TRACE}-{SPAN.upper()}-01",
        f"00-{TRACE}-{SPAN}-0A",
        f"00-{'0' * 32}-{SPAN}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00_{TRACE}-{SPAN}-01",
        f"00-{TRACE}_{SPAN}-01",
        f"00-{TRACE}-{SPAN}_01",
        f"00-{TRACE[:-1]}-{SPAN}0-01",
        f"00-{TRACE}-{SPAN[:-1]}-001",
        f"00-{TRACE[:-1]}x-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-0\u0661",  # a non-ASCII digit
    ],
)
def test_parse_traceparent_rejects(header: str) -> None:
    assert parse_traceparent(header) is None


def test_parse_traceparent_rejects_non_strings() -> None:
    assert parse_traceparent(None) is None
    assert parse_traceparent(VALID.encode()) is None


def test_format_traceparent() -> None:
    assert format_traceparent(TRACE, SPAN, True) == VALID
    assert format_traceparent(TRACE, SPAN, False) == f"00-{TRACE}-{SPAN}-00"
    for sampled in (True, False):
        t, s = new_trace_id(), new_span_id()
        assert parse_traceparent(format_traceparent(t, s, sampled)) == (t, s, sampled)
    for trace_id, span_id in [
        (TRACE.upper(), SPAN),
        (TRACE, SPAN[:-1]),
        ("0" * 32, SPAN),
        (TRACE, "0" * 16),
        (TRACE, "g" * 16),
    ]:
        with pytest.raises(ValueError):
            format_traceparent(trace_id, span_id, True)


def test_floats_keep_their_bits() -> None:
    for value in (math.nan, -0.0, math.inf, 5e-324):
        body = encode({}, "", "", [record(attributes=(("f", value),))])
        [span] = decode(body)
        got = span.attributes["f"]
        if math.isnan(value):
            assert math.isnan(got)
        else:
            assert (got, math.copysign(1, got)) == (value, math.copysign(1, value))
