"""The server's span records (server/tracing.py) as an engine makes its decisions: one trace
per task from its trace context, parent-based sampling, dependencies linked, the failure of an
attempt marked, and nothing for a task whose context says "not sampled"."""

from __future__ import annotations

import random
from typing import Any

import pytest

from cronoq._otlp import Record, parse_traceparent
from cronoq.core.engine import Engine
from cronoq.core.model import Attempt, Extras, PoolConfig, RetryPolicy, TaskRecord
from cronoq.server.tracing import ServerTracing, sample_ratio

SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = "00-11112f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


class Sink:
    """What the exporter would send: the records, in order."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, record: Record) -> None:
        self.records.append(record)

    def named(self, name: str) -> list[Record]:
        return [r for r in self.records if r[3] == name]


class Quiet:
    def started(self, att: Attempt, wait: float) -> None: ...

    def ended(self, att: Attempt, outcome: str, runtime: float) -> None: ...


def engine(ratio: float = 1.0) -> tuple[Engine, ServerTracing, Sink]:
    sink = Sink()
    holder: list[Engine] = []
    tracing = ServerTracing(
        sink,  # type: ignore[arg-type]
        ratio=ratio,
        inner=Quiet(),
        lookup=lambda ref: holder[0].lookup(ref),
    )
    retry = RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    eng = Engine(
        [PoolConfig("p", capacity=4, retry=retry)], 0.0, rng=random.Random(0), observer=tracing
    )
    holder.append(eng)
    return eng, tracing, sink


def run_all(eng: Engine, now: float, *, fail: bool = False) -> list[Attempt]:
    eng.advance(now)
    eng.dispatch(now)
    starts = eng.take().starts
    for att in starts:
        if fail:
            eng.fail(att, now + 1, "boom")
        else:
            eng.complete(att, now + 1, None)
    eng.take()
    return starts


def attrs(record: Record) -> dict[str, Any]:
    return dict(record[7])


def test_attempts_are_children_of_the_task_s_context_and_retries_share_its_trace() -> None:
    eng, _, sink = engine()
    rec, _ = eng.submit(TaskRecord(b"", "p", kind="k", tags={"traceparent": SAMPLED}), 0.0)
    run_all(eng, 0.0, fail=True)
    run_all(eng, 5.0)
    trace_id, parent, _ = parse_traceparent(SAMPLED)  # type: ignore[misc]
    attempts = sink.named("cronoq.attempt")
    waits = sink.named("cronoq.queue_wait")
    assert len(attempts) == 2 and len(waits) == 2
    for r in (*attempts, *waits):
        assert (r[0], r[2]) == (trace_id, parent)
        assert attrs(r)["cronoq.task.id"] == rec.id and attrs(r)["cronoq.task.kind"] == "k"
    assert [attrs(r)["cronoq.attempt"] for r in attempts] == [1, 2]
    assert [attrs(r)["cronoq.outcome"] for r in attempts] == ["failed", "succeeded"]
    assert [r[8] for r in attempts] == [2, 0]  # an error status on the failed one
    assert attempts[1][5] == 5 * 10**9 and attempts[1][6] == 6 * 10**9


def test_a_dependent_s_attempt_links_to_its_parent_s_trace() -> None:
    eng, _, sink = engine()
    eng.submit(TaskRecord(b"", "p", key="a", tags={"traceparent": SAMPLED}), 0.0)
    own = "00-" + "2" * 32 + "-" + "3" * 16 + "-01"
    child = TaskRecord(b"", "p", tags={"traceparent": own}, extra=Extras(deps=[("a", "success")]))
    eng.submit(child, 0.0)
    run_all(eng, 0.0)
    run_all(eng, 2.0)
    (first, second) = sink.named("cronoq.attempt")
    assert first[10] == ()
    assert second[0] == "2" * 32
    assert second[10] == (parse_traceparent(SAMPLED)[:2],)  # type: ignore[index]


def test_an_unsampled_context_makes_nothing_and_a_task_without_one_starts_a_trace() -> None:
    eng, _, sink = engine()
    eng.submit(TaskRecord(b"", "p", tags={"traceparent": UNSAMPLED}), 0.0)
    run_all(eng, 0.0)
    assert sink.records == []
    eng.submit(TaskRecord(b"", "p"), 1.0)
    run_all(eng, 1.0)
    (attempt,) = sink.named("cronoq.attempt")
    assert attempt[2] == "" and len(attempt[0]) == 32  # a root of a trace of its own
    eng, _, sink = engine(ratio=0.0)
    eng.submit(TaskRecord(b"", "p"), 0.0)
    run_all(eng, 0.0)
    assert sink.records == []


def test_the_server_s_submit_span_gives_its_context_to_tasks_without_one() -> None:
    _, tracing, sink = engine()
    tasks: list[dict[str, Any]] = [{"pool": "p"}, {"pool": "p", "tags": {"traceparent": SAMPLED}}]
    with tracing.submit({}, tasks) as span:
        span["cronoq.task.id"] = 7
    (record,) = sink.named("cronoq.submit")
    assert record[2] == parse_traceparent(SAMPLED)[1]  # type: ignore[index]
    assert tasks[0]["tags"]["traceparent"] == f"00-{record[0]}-{record[1]}-01"
    assert tasks[1]["tags"] == {"traceparent": SAMPLED}
    assert attrs(record) == {"cronoq.batch.size": 2, "cronoq.task.id": 7}


def test_the_sampler_variables() -> None:
    assert sample_ratio({}) == 1.0
    assert sample_ratio({"OTEL_TRACES_SAMPLER": "always_off"}) == 0.0
    env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    assert sample_ratio(env) == 0.25
    for bad in ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, {**env, "OTEL_TRACES_SAMPLER_ARG": "2"}):
        with pytest.raises(ValueError):
            sample_ratio(bad)
