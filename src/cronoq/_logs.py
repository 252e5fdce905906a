"""Log set-up for cronoq's long-running commands: human text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from contextvars import ContextVar
from typing import Literal

__all__ = [
    "FIELD_PREFIX",
    "RESERVED",
    "JsonFormatter",
    "LogFormat",
    "current_trace_ids",
    "setup_logging",
    "trace_ids",
]

LogFormat = Literal["text", "json"]
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The members a JSON line has of its own; a structured field named like one of them is written
# under FIELD_PREFIX + its name instead (again while that is taken), never over them.
RESERVED = frozenset({"ts", "level", "logger", "trace_id", "span_id", "event", "msg", "exc"})
FIELD_PREFIX = "field_"
# (trace id, span id) of the span the server is in (server/tracing.py sets it for a call)
trace_ids: ContextVar[tuple[str, str] | None] = ContextVar("cronoq_trace_ids", default=None)


def current_trace_ids() -> tuple[str, str] | None:
    """The trace and span ids (hex) a log line written now belongs to: the server's own span,
    else the current OpenTelemetry span when the program uses OpenTelemetry (looked up only
    once it is imported, so logging costs no import)."""
    ids = trace_ids.get()
    if ids is None:
        trace = sys.modules.get("opentelemetry.trace")
        if trace is not None:
            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                ids = (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    return ids


class JsonFormatter(logging.Formatter):
    """One JSON object per record, so that a log shipper never has to join lines, and a
    traceback stays inside its record (docs/server.md, "Logs"; docs/app.md for the worker).

    Members, in this order: `ts` (RFC 3339, UTC, milliseconds), `level`, `logger`; inside a
    traced call `trace_id` and `span_id` (current_trace_ids); `msg`, the
    message, or for an event `event`, its name; the record's structured fields (the `fields`
    dict of `extra`), each a member of its own (a field named like a member above or `exc` is
    renamed `field_<name>`); and `exc`, the traceback, when the record has one.

    With `events` (the server's convention, server/logs.py: its `event()` helper gives the
    event's name as the message and its fields as `fields`), a record that carries fields is
    an event; without it (the worker command's), its message stays a `msg`. Records without
    fields have the same shape either way.
    """

    def __init__(self, *, events: bool = False) -> None:
        super().__init__()
        self.events = events

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        ids = current_trace_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        fields = getattr(record, "fields", None)
        if not isinstance(fields, dict):
            fields = None
        line["event" if self.events and fields is not None else "msg"] = record.getMessage()
        for key, value in (fields or {}).items():
            name = str(key)
            while name in RESERVED or name in line:
                name = FIELD_PREFIX + name
            line[name] = _plain(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _plain(value: object) -> object:
    """`value` as JSON can hold it: an infinite or NaN float as its text (JSON has no such
    number); anything else json.dumps cannot encode becomes its str() there."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def setup_logging(fmt: LogFormat, level: str) -> None:
    """Send every record at `level` and above to stderr in `fmt`; ValueError for an unknown
    level name."""
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
