"""Library mode's spans: submit, queue wait and every attempt of a task in one trace, the
executor's own spans below its attempt's, dependencies linked, nothing when tracing is off."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cronoq
from cronoq import Pool, RetryPolicy, Scheduler


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_name(done: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in done if s.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


async def test_one_trace_from_the_caller_to_each_attempt_and_the_executors_spans(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    user = provider.get_tracer("user")
    failures = [1]

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        with user.start_as_current_span("inside"):
            assert ctx.traceparent() is not None
            if failures:
                failures.pop()
                raise RuntimeError("once")
        return payload

    async with Scheduler(
        [
            Pool(
                "default",
                run,
                max=2,
                retry=RetryPolicy(max_attempts=3, initial_backoff=0.0, jitter=False),
            )
        ],
        tracing=provider,
    ) as s:
        with user.start_as_current_span("caller") as caller:
            h = await s.submit(7, kind="k")
        assert await h == 7
    done = exporter.get_finished_spans()
    trace_id = caller.get_span_context().trace_id
    assert {sp.context.trace_id for sp in done} == {trace_id}
    (submit,) = by_name(done, "cronoq.submit")
    assert parent_of(submit) == caller.get_span_context().span_id
    assert submit.kind == trace.SpanKind.PRODUCER
    assert submit.attributes is not None and submit.attributes["cronoq.task.id"] == h.id
    runs = sorted(by_name(done, "cronoq.run"), key=lambda sp: sp.attributes["cronoq.attempt"])  # type: ignore[index]
    assert [sp.attributes["cronoq.outcome"] for sp in runs] == ["failed", "succeeded"]  # type: ignore[index]
    assert runs[0].status.status_code == trace.StatusCode.ERROR
    assert "once" in (runs[0].status.description or "")
    for sp in runs:
        assert parent_of(sp) == submit.context.span_id
        assert sp.kind == trace.SpanKind.CONSUMER
        assert sp.attributes is not None
        assert sp.attributes["cronoq.task.kind"] == "k"
        assert sp.attributes["cronoq.pool"] == "default"
        assert sp.attributes["cronoq.priority"] == "normal"
    insides = by_name(done, "inside")
    assert sorted(parent_of(sp) or 0 for sp in insides) == sorted(sp.context.span_id for sp in runs)
    waits = by_name(done, "cronoq.queue_wait")
    assert len(waits) == 2 and all(parent_of(sp) == submit.context.span_id for sp in waits)
    assert all(sp.end_time is not None and sp.start_time <= sp.end_time for sp in waits)  # type: ignore[operator]


async def test_a_sync_executor_s_spans_are_its_attempt_s_children(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    user = provider.get_tracer("user")

    def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        with user.start_as_current_span("in-thread"):
            return payload

    async with Scheduler([Pool("default", run)], tracing=provider) as s:
        assert await (await s.submit(1)) == 1
    done = exporter.get_finished_spans()
    (run_span,) = by_name(done, "cronoq.run")
    (inner,) = by_name(done, "in-thread")
    assert parent_of(inner) == run_span.context.span_id


async def test_batches_and_dependencies_link_the_child_to_its_parent_s_trace(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    user = provider.get_tracer("user")

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        return payload

    async with Scheduler([Pool("default", run)], tracing=provider) as s:
        with user.start_as_current_span("first"):
            parent = await s.submit(1, key="parent")
        with user.start_as_current_span("second"):
            (child, other) = await s.submit_batch(
                [
                    cronoq.Task(2, after="parent"),
                    cronoq.Task(3, tags={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}),
                ]
            )
        await asyncio.gather(parent.result(), child.result(), other.result())
    done = exporter.get_finished_spans()
    runs = {sp.attributes["cronoq.task.id"]: sp for sp in by_name(done, "cronoq.run")}  # type: ignore[index]
    submits = by_name(done, "cronoq.submit")
    batch = next(sp for sp in submits if sp.attributes.get("cronoq.batch.size") == 2)  # type: ignore[union-attr]
    first = next(sp for sp in submits if sp is not batch)
    child_run = runs[child.id]
    assert parent_of(child_run) == batch.context.span_id
    assert [link.context.span_id for link in child_run.links] == [first.context.span_id]
    # the caller's own trace context wins over the batch's
    assert runs[other.id].context.trace_id == int("a" * 32, 16)
    assert parent_of(runs[other.id]) == int("b" * 16, 16)


async def test_off_makes_no_spans_and_adds_no_tags(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    seen: list[str | None] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        seen.append(ctx.traceparent())

    for setting in (False, None):  # None: no SDK is configured globally in this process
        async with Scheduler([Pool("default", run)], tracing=setting) as s:
            with provider.get_tracer("user").start_as_current_span("caller"):
                await (await s.submit(1))
    assert seen == [None, None]
    assert [sp.name for sp in exporter.get_finished_spans()] == ["caller", "caller"]


def test_a_bad_setting_is_refused() -> None:
    with pytest.raises(TypeError, match="tracing must be"):
        Scheduler([Pool("default", lambda ctx, p: p)], tracing="yes")
