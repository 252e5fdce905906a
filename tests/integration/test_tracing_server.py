"""`cronoq-server` tracing against a real OTLP/HTTP receiver (helpers/otlp.py decodes what
arrives on the wire): a Python client's trace through the server to a Go worker and a Python
worker and back, retries as attempts of one trace, a trace context kept by a SQLite store
across a restart, an HTTP/JSON submit's `traceparent` header, and no export when off."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.golang import GO, go_build
from helpers.otlp import OtlpReceiver, ReceivedSpan
from helpers.servers import PORT0, LoggedProcess, Server, write

ROOT = Path(__file__).resolve().parents[2]
GO_SDK = ROOT / "sdks" / "go"
CHILD = Path(__file__).with_name("otel_child.py")
# A safety net: a working setup meets each condition in about a second.
TIMEOUT = 60.0
SERVER = 2  # OTLP SpanKind
PRODUCER, CONSUMER = 4, 5
ERROR = 2  # OTLP status code
HEADER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HEADER_PARENT = "00f067aa0ba902b7"


def env_for(receiver: OtlpReceiver, service: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRONOQ_", "OTEL_"))}
    return {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        "PYTHONUNBUFFERED": "1",
    }


def served(tmp_path: Path, receiver: OtlpReceiver, extra: str = "", name: str = "s") -> Server:
    config = write(tmp_path, PORT0 + extra, f"{name}.toml")
    s = Server(config, env=env_for(receiver, "cronoq-server"))
    s.http = s.wait_for(r"event=listening http=(\S+)").group(1)  # type: ignore[attr-defined]
    s.wait_for("event=ready")
    return s


def child(receiver: OtlpReceiver, service: str, *args: str) -> LoggedProcess:
    return LoggedProcess(
        [sys.executable, str(CHILD), *args], env=env_for(receiver, service), merged=True
    )


def submit_and_wait(receiver: OtlpReceiver, target: str, payload: object) -> object:
    p = child(receiver, "py-client", "client", target, json.dumps(payload))
    assert p.wait(TIMEOUT) == 0, p.lines
    return json.loads(p.lines[-1])


def in_trace(receiver: OtlpReceiver, trace_id: str) -> list[ReceivedSpan]:
    return [s for s in receiver.spans if s.trace_id == trace_id]


def one(spans: list[ReceivedSpan], name: str, service: str | None = None) -> ReceivedSpan:
    found = [
        s
        for s in spans
        if s.name == name and (service is None or s.resource.get("service.name") == service)
    ]
    assert len(found) == 1, (name, service, [(s.name, s.resource) for s in spans])
    return found[0]


@pytest.fixture(scope="module")
def otelworker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GO is None:
        pytest.skip("the Go toolchain (`go` on PATH) builds the Go worker")
    return go_build(GO_SDK, "./examples/otelworker", tmp_path_factory.mktemp("go") / "otelworker")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def test_one_trace_from_a_python_client_through_the_server_to_a_go_worker_and_back(
    tmp_path: Path, receiver: OtlpReceiver, otelworker: Path
) -> None:
    s = served(tmp_path, receiver)
    target = f"http://{s.address}"
    worker = LoggedProcess(
        [str(otelworker), "--target", target], env=env_for(receiver, "go-worker"), merged=True
    )
    try:
        worker.wait_for("ready", TIMEOUT)
        assert submit_and_wait(receiver, target, {"n": 7}) == {"n": 7}
        call = one(receiver.spans, "client-call")
        names = {"cronoq.queue_wait", "cronoq.attempt", "cronoq.dispatch", "cronoq.run", "work"}

        def complete(r: OtlpReceiver) -> bool:
            got = {x.name for x in in_trace(r, call.trace_id)}
            return names <= got and "cronoq.submit" in got

        receiver.wait_for(complete, TIMEOUT, "the trace's spans from every process")
    finally:
        worker.terminate()
        s.terminate()
    spans = in_trace(receiver, call.trace_id)
    produce = one(spans, "cronoq.submit", "py-client")
    assert produce.kind == PRODUCER and produce.parent_span_id == call.span_id
    task_id = produce.attributes["cronoq.task.id"]
    serve = one(spans, "cronoq.submit", "cronoq-server")
    assert serve.kind == SERVER and serve.parent_span_id == produce.span_id
    assert serve.attributes["cronoq.task.id"] == task_id
    assert serve.attributes["cronoq.pool"] == "default"
    wait = one(spans, "cronoq.queue_wait")
    attempt = one(spans, "cronoq.attempt")
    dispatch = one(spans, "cronoq.dispatch")
    for span in (wait, attempt):
        assert span.parent_span_id == produce.span_id
        assert span.attributes["cronoq.task.id"] == task_id
        assert span.attributes["cronoq.attempt"] == 1
        assert span.attributes["cronoq.priority"] == "normal"
    assert attempt.attributes["cronoq.outcome"] == "succeeded"
    assert dispatch.parent_span_id == attempt.span_id
    assert dispatch.attributes["cronoq.worker.id"] > 0
    run = one(spans, "cronoq.run", "go-worker")
    assert run.kind == CONSUMER and run.parent_span_id == produce.span_id
    assert run.attributes["cronoq.task.id"] == task_id
    assert one(spans, "work").parent_span_id == run.span_id
    assert wait.end_ns <= attempt.end_ns and attempt.start_ns <= run.start_ns


def test_a_retry_is_another_attempt_of_the_same_trace_in_a_python_worker(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    retry = (
        '\n[[pools]]\nname = "default"\n[pools.retry]\nmax_attempts = 2\ninitial_backoff_s = 0.01\n'
    )
    s = served(tmp_path, receiver, retry)
    target = f"http://{s.address}"
    worker = child(receiver, "py-worker", "worker", target, "default")
    try:
        worker.wait_for("ready", TIMEOUT)
        assert submit_and_wait(receiver, target, {"fail_once": True}) == {"fail_once": True}
        call = one(receiver.spans, "client-call")

        def both_attempts(r: OtlpReceiver) -> bool:
            got = [x.name for x in in_trace(r, call.trace_id)]
            return got.count("cronoq.attempt") == 2 and got.count("cronoq.run") == 2

        receiver.wait_for(both_attempts, TIMEOUT, "two attempts' spans")
    finally:
        worker.terminate()
        s.terminate()
    spans = in_trace(receiver, call.trace_id)
    produce = one(spans, "cronoq.submit", "py-client")
    attempts = sorted(
        (x for x in spans if x.name == "cronoq.attempt"),
        key=lambda x: x.attributes["cronoq.attempt"],
    )
    assert [a.attributes["cronoq.outcome"] for a in attempts] == ["failed", "succeeded"]
    assert attempts[0].status_code == ERROR
    runs = sorted(
        (x for x in spans if x.name == "cronoq.run"), key=lambda x: x.attributes["cronoq.attempt"]
    )
    assert [r.attributes["cronoq.outcome"] for r in runs] == ["failed", "succeeded"]
    assert "first attempt fails" in runs[0].status_message
    for span in (*attempts, *runs):
        assert span.parent_span_id == produce.span_id
    handler_parents = sorted(x.parent_span_id for x in spans if x.name == "handler-work")
    assert handler_parents == sorted(r.span_id for r in runs)


def test_an_http_submit_s_trace_context_survives_a_restart_with_a_sqlite_store(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    store = f'\n[store]\nkind = "sqlite"\npath = "{tmp_path / "tasks.db"}"\n'
    s = served(tmp_path, receiver, store, "first")
    http = s.http  # type: ignore[attr-defined]
    request = urllib.request.Request(
        f"http://{http}/v1/tasks",
        data=json.dumps({"kind": "late", "payload": {"x": 1}}).encode(),
        headers={
            "Content-Type": "application/json",
            "traceparent": f"00-{HEADER_TRACE}-{HEADER_PARENT}-01",
            "tracestate": "vendor=kept",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
        task_id = int(json.load(answer)["id"])
    receiver.wait_for(lambda r: in_trace(r, HEADER_TRACE), TIMEOUT, "the submit span")
    serve = one(in_trace(receiver, HEADER_TRACE), "cronoq.submit", "cronoq-server")
    assert serve.parent_span_id == HEADER_PARENT and serve.kind == SERVER
    assert serve.attributes["cronoq.task.id"] == task_id
    assert s.terminate() == 0  # no worker came: the task waits in the file
    s = served(tmp_path, receiver, store, "second")
    worker = child(receiver, "py-worker", "worker", f"http://{s.address}", "default")
    try:
        worker.wait_for("ready", TIMEOUT)

        def ran(r: OtlpReceiver) -> bool:
            got = {x.name for x in in_trace(r, HEADER_TRACE)}
            return {"cronoq.attempt", "cronoq.run"} <= got

        receiver.wait_for(ran, TIMEOUT, "the attempt's spans after the restart")
    finally:
        worker.terminate()
        s.terminate()
    spans = in_trace(receiver, HEADER_TRACE)
    run = one(spans, "cronoq.run", "py-worker")
    assert run.parent_span_id == HEADER_PARENT  # the caller's span, as the tag keeps it
    assert run.attributes["cronoq.task.id"] == task_id
    assert one(spans, "cronoq.attempt").attributes["cronoq.outcome"] == "succeeded"


def test_tracing_off_sends_nothing_and_adds_no_tag(tmp_path: Path, receiver: OtlpReceiver) -> None:
    s = served(tmp_path, receiver, "\n[tracing]\nenabled = false\n")
    target = f"http://{s.address}"
    worker = child(receiver, "py-worker", "worker", target, "default")
    try:
        worker.wait_for("ready", TIMEOUT)
        assert submit_and_wait(receiver, target, 5) == 5
        # the two children export what they make; the server exported nothing
        receiver.wait_for(
            lambda r: any(x.name == "cronoq.run" for x in r.spans), TIMEOUT, "the worker's span"
        )
    finally:
        worker.terminate()
        s.terminate()
    services = {x.resource.get("service.name") for x in receiver.spans}
    assert services == {"py-client", "py-worker"}
