"""Log lines written inside a traced call carry its trace and span ids: the server's own span
(`cronoq._logs.trace_ids`) or the program's current OpenTelemetry span; others carry none."""

from __future__ import annotations

import json
import logging

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from cronoq._logs import JsonFormatter, trace_ids
from cronoq.server.cli import LogfmtFormatter

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def record() -> logging.LogRecord:
    return logging.LogRecord("cronoq.server", logging.INFO, __file__, 1, "submitted", None, None)


def test_the_server_s_span_s_ids_are_on_json_and_logfmt_lines() -> None:
    token = trace_ids.set((TRACE, SPAN))
    try:
        line = json.loads(JsonFormatter(events=True).format(record()))
        text = LogfmtFormatter().format(record())
    finally:
        trace_ids.reset(token)
    assert list(line)[:5] == ["ts", "level", "logger", "trace_id", "span_id"]
    assert (line["trace_id"], line["span_id"]) == (TRACE, SPAN)
    assert f"trace_id={TRACE} span_id={SPAN} msg=submitted" in text


def test_the_current_opentelemetry_span_s_ids_are_on_a_worker_s_lines() -> None:
    span = TracerProvider().get_tracer("t").start_span("handler")
    with trace.use_span(span, end_on_exit=True):
        line = json.loads(JsonFormatter().format(record()))
    ctx = span.get_span_context()
    assert line["trace_id"] == f"{ctx.trace_id:032x}" and line["span_id"] == f"{ctx.span_id:016x}"


def test_lines_outside_a_traced_call_have_no_ids() -> None:
    line = json.loads(JsonFormatter().format(record()))
    assert "trace_id" not in line and "span_id" not in line
    assert "trace_id" not in LogfmtFormatter().format(record())
