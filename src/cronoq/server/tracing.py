"""The server's spans (docs/observability.md, "Traces"): a `cronoq.submit` span per Submit or
SubmitBatch call, and per attempt a `cronoq.queue_wait`, a `cronoq.attempt` and its
`cronoq.dispatch` (the hand-over of the lease to a worker), exported over OTLP.

Spans are made as plain tuples for the lean exporter of `cronoq._otlp` rather than through
the OpenTelemetry SDK, whose ~50 us per span would cost the server more than the task itself
(docs/third-party.md). Sampling is parent-based: a task whose trace context says "not
sampled" makes no span; a task without one starts a trace of its own, sampled at `ratio`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._attempt import TRACEPARENT
from .._logs import trace_ids
from .._otlp import (
    Exporter,
    format_traceparent,
    from_env,
    new_span_id,
    new_trace_id,
    parse_traceparent,
)
from .._tracing import (
    ATTR_ATTEMPT,
    ATTR_BATCH,
    ATTR_KIND,
    ATTR_OUTCOME,
    ATTR_POOL,
    ATTR_PRIORITY,
    ATTR_TASK_ID,
    ATTR_WORKER,
    ATTR_WORKER_NAME,
    TRACESTATE,
)
from ..core.model import OUTCOME_SUCCEEDED, Attempt, Observer, TaskRecord
from ..core.vocab import PRIORITY_NAMES
from .config import ConfigError, TracingSettings

__all__ = ["ServerTracing", "sample_ratio", "server_tracing"]

log = logging.getLogger("cronoq.server")

# OTLP span kinds and status codes
_INTERNAL, _SERVER = 1, 2
_ERROR = 2
# Attribute pairs are kept (by value) for reuse: every tuple a span holds until it is exported
# is one more object for the garbage collector's counts, and the collections they cause cost the
# server more than the span code itself (bench/README.md, "Tracing overhead"). At most this many
# per attribute, then started over.
_PAIRS_MAX = 4096


def server_tracing(
    cfg: TracingSettings,
    inner: Observer,
    lookup: Callable[[int | str], TaskRecord | None],
    env: Mapping[str, str] = os.environ,
) -> ServerTracing | None:
    """The server's tracing as `[tracing]` and the standard OTEL_* variables set it up, None
    when off (docs/observability.md, "Traces"); ConfigError for a setting it cannot use."""
    if cfg.enabled is False:
        return None
    try:
        ratio = sample_ratio(env) if cfg.sample_ratio is None else cfg.sample_ratio
        exporter = from_env(
            env,
            service_name="cronoq-server",
            enabled=cfg.enabled,
            endpoint=cfg.endpoint,
            resource=None if cfg.service_name is None else {"service.name": cfg.service_name},
        )
    except ValueError as e:
        raise ConfigError([f"tracing: {e}"]) from None
    if exporter is None:
        return None
    return ServerTracing(exporter, ratio=ratio, inner=inner, lookup=lookup)


def sample_ratio(env: Mapping[str, str]) -> float:
    """The share of new traces sampled by OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG: the
    standard samplers' names, each parent-based here (a caller's decision is kept)."""
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    base = name.removeprefix("parentbased_")
    if base == "always_on":
        return 1.0
    if base == "always_off":
        return 0.0
    if base == "traceidratio":
        arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1 (got {arg!r})")
        return ratio
    raise ValueError(
        f"OTEL_TRACES_SAMPLER {name!r} is not supported: use always_on, always_off or"
        " traceidratio (each may be parentbased_)"
    )


class ServerTracing:
    """The spans of one server process; also the engine's observer (it hands what it is told
    on to `inner`, the metrics' observer). `lookup(ref)` finds a task of the running engine
    (for a dependency's trace context), None once it is gone."""

    def __init__(
        self,
        exporter: Exporter,
        *,
        ratio: float,
        inner: Observer,
        lookup: Callable[[int | str], TaskRecord | None],
    ) -> None:
        self.exporter = exporter
        self._ratio = ratio
        self._inner = inner
        self._lookup = lookup
        # lease -> (trace id, parent span id, attempt span id, attributes) of sampled attempts
        # (a list, so that dispatched() updates the attributes in place)
        self._live: dict[int, list[Any]] = {}
        self._add = exporter.add
        # The last traceparent tag parsed by started() and what it parsed to: the tasks of one
        # SubmitBatch call share their call's, so most attempts skip the parse.
        self._last_ctx: str | None = None
        self._last_parsed: tuple[str, str, bool] | None = None
        # attribute -> value -> its (attribute, value) pair (see _PAIRS_MAX)
        self._pairs: dict[str, dict[Any, tuple[str, Any]]] = {
            a: {} for a in (ATTR_KIND, ATTR_POOL, ATTR_ATTEMPT, ATTR_WORKER, ATTR_WORKER_NAME)
        }
        self._priorities = tuple((ATTR_PRIORITY, name) for name in PRIORITY_NAMES)  # by class
        self._outcomes: dict[str, tuple[str, Any]] = {}

    def _pair(self, attribute: str, value: Any) -> tuple[str, Any]:
        """The (attribute, value) pair, the same tuple each time."""
        pairs = self._pairs[attribute]
        pair = pairs.get(value)
        if pair is None:
            if len(pairs) >= _PAIRS_MAX:
                pairs.clear()
            pair = pairs[value] = (attribute, value)
        return pair

    # --- submits

    @contextlib.contextmanager
    def submit(
        self, headers: Mapping[str, str], tasks: list[dict[str, Any]]
    ) -> Iterator[dict[str, Any]]:
        """The `cronoq.submit` span of one call, current for the call's log lines: a child of
        the caller's trace context (its `traceparent` header, else the first task's tag), or
        a new trace. Tasks without a trace context get the span's, so that their attempts
        join it. Yields the attributes, for the caller to add the task id to."""
        parent = headers.get(TRACEPARENT)
        if parent is None:
            parent = next((t["tags"][TRACEPARENT] for t in tasks if _tag(t) is not None), None)
        ctx = None if parent is None else parse_traceparent(parent)
        if ctx is None:
            trace_id, parent_id, sampled = new_trace_id(), "", random.random() < self._ratio
        else:
            trace_id, parent_id, sampled = ctx
        span_id = new_span_id()
        own = format_traceparent(trace_id, span_id, sampled)
        state = headers.get(TRACESTATE)
        for t in tasks:
            if _tag(t) is None:
                tags = t.get("tags") or {}
                tags[TRACEPARENT] = own
                if state:
                    tags[TRACESTATE] = state
                t["tags"] = tags
        attrs: dict[str, Any] = {}
        if len(tasks) == 1:
            attrs[ATTR_POOL] = tasks[0]["pool"]
            attrs[ATTR_KIND] = tasks[0].get("kind", "default")
        else:
            attrs[ATTR_BATCH] = len(tasks)
        start = time.time_ns()
        token = trace_ids.set((trace_id, span_id))
        status, message = 0, ""
        try:
            yield attrs
        except BaseException as e:
            status, message = _ERROR, str(e) or type(e).__name__
            raise
        finally:
            trace_ids.reset(token)
            if sampled:
                self._add(
                    (
                        trace_id,
                        span_id,
                        parent_id,
                        "cronoq.submit",
                        _SERVER,
                        start,
                        time.time_ns(),
                        tuple(attrs.items()),
                        status,
                        message,
                        (),
                    )
                )

    # --- attempts (the engine's observer)

    def started(self, att: Attempt, wait: float) -> None:
        self._inner.started(att, wait)
        rec = att.task
        tags = rec.tags
        ctx = None if tags is None else tags.get(TRACEPARENT)
        if ctx is None:
            parsed = None
        elif ctx == self._last_ctx:
            parsed = self._last_parsed
        else:
            parsed = self._last_parsed = parse_traceparent(ctx)
            self._last_ctx = ctx
        if parsed is None:  # (a recurring occurrence, a task from before tracing was on)
            if random.random() >= self._ratio:
                return
            trace_id, parent_id = new_trace_id(), ""
        else:
            trace_id, parent_id, sampled = parsed
            if not sampled:
                return
        pair = self._pair
        attrs = (
            (ATTR_TASK_ID, rec.id),
            pair(ATTR_KIND, rec.kind),
            pair(ATTR_POOL, rec.pool),
            self._priorities[rec.cls],
            pair(ATTR_ATTEMPT, att.number),
        )
        self._live[att.lease] = [trace_id, parent_id, new_span_id(), attrs]
        start = int(att.started_at * 1e9)
        wait_from = int(rec.ready_at * 1e9)
        self._add(
            (
                trace_id,
                new_span_id(),
                parent_id,
                "cronoq.queue_wait",
                _INTERNAL,
                min(wait_from, start),
                start,
                attrs,
                0,
                "",
                (),
            )
        )

    def dispatched(self, att: Attempt, worker: int, name: str, now: float) -> None:
        """The lease of `att` was queued on the stream of `worker` (its id and name)."""
        live = self._live.get(att.lease)
        if live is None:
            return
        trace_id, _, span_id, attrs = live
        attrs = live[3] = (
            *attrs,
            self._pair(ATTR_WORKER, worker),
            self._pair(ATTR_WORKER_NAME, name),
        )
        self._add(
            (
                trace_id,
                new_span_id(),
                span_id,
                "cronoq.dispatch",
                _INTERNAL,
                int(att.started_at * 1e9),
                int(now * 1e9),
                attrs,
                0,
                "",
                (),
            )
        )

    def ended(self, att: Attempt, outcome: str, runtime: float) -> None:
        self._inner.ended(att, outcome, runtime)
        live = self._live.pop(att.lease, None)
        if live is None:
            return
        trace_id, parent_id, span_id, attrs = live
        start = att.started_at
        ok = outcome == OUTCOME_SUCCEEDED
        done = self._outcomes.get(outcome)
        if done is None:
            done = self._outcomes[outcome] = (ATTR_OUTCOME, outcome)
        self._add(
            (
                trace_id,
                span_id,
                parent_id,
                "cronoq.attempt",
                _INTERNAL,
                int(start * 1e9),
                int((start + runtime) * 1e9),
                (*attrs, done),
                0 if ok else _ERROR,
                "" if ok else outcome,
                self._links(att.task),
            )
        )

    def _links(self, rec: TaskRecord) -> tuple[tuple[str, str], ...]:
        """The trace contexts of the task's dependencies still known."""
        deps = None if rec.extra is None else rec.extra.deps
        if not deps:
            return ()
        out = []
        for ref, _ in deps:
            parent = self._lookup(ref)
            tags = None if parent is None else parent.tags
            ctx = None if not tags else parse_traceparent(tags.get(TRACEPARENT))
            if ctx is not None:
                out.append((ctx[0], ctx[1]))
        return tuple(out)

    def close(self, timeout: float = 5.0) -> None:
        """Export what is queued (at the server's stop)."""
        if not self.exporter.shutdown(timeout):
            log.warning("traces not all exported at stop (%d dropped)", self.exporter.dropped)


def _tag(task: Mapping[str, Any]) -> str | None:
    tags = task.get("tags")
    return None if not tags else tags.get(TRACEPARENT)
