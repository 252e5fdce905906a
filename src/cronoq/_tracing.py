"""OpenTelemetry in the processes that run cronoq code: the library's Scheduler, the Python
client and the remote Worker (docs/observability.md, "Traces").

A task's W3C trace context travels as its tags `traceparent` and `tracestate`. A submit made
while an OpenTelemetry SDK is configured gets a `cronoq.submit` span whose context those tags
carry; every attempt runs inside a `cronoq.run` span whose parent they name, so the spans an
executor or handler makes are children of the submitter's across processes and retries.

Everything here goes through the OpenTelemetry API of the program (`opentelemetry-api`, found
at run time, never required): with no SDK configured `tracer()` is None, and the callers keep
their untraced path, so tracing costs nothing when off. The server exports its own spans
without the SDK (server/tracing.py, for speed) under the same names and attributes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from ._attempt import TRACEPARENT, TRACESTATE

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "ATTR_ATTEMPT",
    "ATTR_KIND",
    "ATTR_OUTCOME",
    "ATTR_POOL",
    "ATTR_PRIORITY",
    "ATTR_TASK_ID",
    "TRACESTATE",
    "Traced",
    "tracer",
]

# The spans' attribute names, here and in the server's own spans.
ATTR_TASK_ID = "cronoq.task.id"
ATTR_KIND = "cronoq.task.kind"
ATTR_POOL = "cronoq.pool"
ATTR_PRIORITY = "cronoq.priority"
ATTR_ATTEMPT = "cronoq.attempt"
ATTR_OUTCOME = "cronoq.outcome"
ATTR_BATCH = "cronoq.batch.size"
ATTR_WORKER = "cronoq.worker.id"
ATTR_WORKER_NAME = "cronoq.worker.name"
SCOPE = "cronoq"


_api: tuple[Any, Any] | None = None  # (trace, propagate) once imported
_memo: dict[int, Traced] = {}  # by id(provider): the Traced of each provider used


def _otel() -> tuple[Any, Any] | None:
    """The OpenTelemetry API modules, None when not installed (looked for once)."""
    global _api
    if _api is None:
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            _api = (None, None)
        else:
            _api = (trace, propagate)
    return None if _api[0] is None else _api


def tracer(setting: object = None) -> Traced | None:
    """The program's tracing for a `tracing=` setting: None, when an OpenTelemetry SDK is
    configured (a tracer provider set globally), else off; False, off; True, the global
    provider's (an error without `opentelemetry-api`); or a tracer provider of its own."""
    if setting is False:
        return None
    api = _otel()
    if api is None:
        if setting is None:
            return None
        raise RuntimeError("tracing needs the OpenTelemetry API: pip install opentelemetry-api")
    trace, propagate = api
    if setting is None or setting is True:
        provider = trace.get_tracer_provider()
        if setting is None and isinstance(
            provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
        ):
            return None
    elif callable(getattr(setting, "get_tracer", None)):
        provider = setting
    else:
        raise TypeError(f"tracing must be None, a bool or a tracer provider (got {setting!r})")
    traced = _memo.get(id(provider))
    if traced is None or traced.provider is not provider:
        traced = _memo[id(provider)] = Traced(trace, propagate, provider)
    return traced


class Traced:
    """The spans of one program's cronoq calls, made with a tracer of its provider."""

    def __init__(self, trace: Any, propagate: Any, provider: Any) -> None:
        self.provider = provider
        self._trace = trace
        self._propagate = propagate
        self._tracer: Tracer = provider.get_tracer(SCOPE)
        self._kind = trace.SpanKind

    @contextlib.contextmanager
    def submit(self, pool: str | None, kind: str | None, size: int = 1) -> Iterator[Span]:
        """The `cronoq.submit` span (a producer) around one submit or batch: `fill` puts its
        context in a task's tags."""
        attrs: dict[str, Any] = {}
        if pool:
            attrs[ATTR_POOL] = pool
        if kind:
            attrs[ATTR_KIND] = kind
        if size != 1:
            attrs[ATTR_BATCH] = size
        with self._tracer.start_as_current_span(
            "cronoq.submit", kind=self._kind.PRODUCER, attributes=attrs
        ) as span:
            yield span

    def fill(self, tags: MutableMapping[str, Any]) -> None:
        """Put the current trace context into a task's tags, unless they carry one (the
        caller's own `traceparent` wins)."""
        if TRACEPARENT not in tags:
            carrier: dict[str, str] = {}
            self._propagate.inject(carrier)
            copy_context(carrier, tags)

    def inject(self, tags: Mapping[str, Any] | None) -> dict[str, Any]:
        """A copy of `tags` that `fill` filled."""
        out = dict(tags or {})
        self.fill(out)
        return out

    @contextlib.contextmanager
    def run(
        self,
        tags: Mapping[str, str] | None,
        attrs: dict[str, Any],
        start_ns: int | None = None,
        links: Sequence[Mapping[str, str]] | None = None,
    ) -> Iterator[Span]:
        """The `cronoq.run` span (a consumer) of one attempt, current while it runs, as a
        child of the task's trace context; links to other tasks' contexts (its
        dependencies). The caller sets the outcome with `ended`."""
        parent = self._propagate.extract(tags) if tags else None
        span_links = []
        for other in links or ():
            ctx = self._trace.get_current_span(self._propagate.extract(other)).get_span_context()
            if ctx.is_valid:
                span_links.append(self._trace.Link(ctx))
        with self._tracer.start_as_current_span(
            "cronoq.run",
            context=parent,
            kind=self._kind.CONSUMER,
            attributes=attrs,
            links=span_links,
            start_time=start_ns,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def queued(
        self, tags: Mapping[str, str] | None, attrs: dict[str, Any], start_ns: int, end_ns: int
    ) -> None:
        """The `cronoq.queue_wait` span of a task: from its submit to the start of an attempt."""
        parent = self._propagate.extract(tags) if tags else None
        span = self._tracer.start_span(
            "cronoq.queue_wait", context=parent, attributes=attrs, start_time=start_ns
        )
        span.end(end_time=end_ns)

    def ended(self, span: Span, outcome: str, message: str | None) -> None:
        """Mark a `run` span with the attempt's outcome (an error status unless it succeeded)."""
        span.set_attribute(ATTR_OUTCOME, outcome)
        if outcome != "succeeded":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message or outcome))


def copy_context(source: Mapping[str, str], tags: MutableMapping[str, Any]) -> None:
    """Copy a W3C trace context (`traceparent`, and `tracestate` when set) from `source` (a
    carrier: tags, headers, environment) into a task's tags."""
    tp = source.get(TRACEPARENT)
    if tp:
        tags[TRACEPARENT] = tp
        state = source.get(TRACESTATE)
        if state:
            tags[TRACESTATE] = state
