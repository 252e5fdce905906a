"""How the command line shows the client's data classes: rich tables for people, JSON for
scripts. Pure functions from values to renderables or strings, so tests need no server."""

from __future__ import annotations

import base64
import dataclasses
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from cronoq.client import BulkResult, Event, RecurringInfo, Result, TaskInfo, WorkerInfo

__all__ = [
    "bulk_text",
    "clock",
    "event_line",
    "labels_text",
    "plain",
    "recurring_table",
    "result_detail",
    "seconds",
    "task_detail",
    "task_table",
    "to_json",
    "worker_text",
    "workers_table",
]


def plain(value: Any) -> Any:
    """`value` as JSON-ready data: data classes become objects with their fields, tuples lists.

    Output bytes become text: UTF-8 when they decode, base64 otherwise, with `output_encoding`
    saying which, so a script never has to guess.
    """
    if isinstance(value, Result):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        fields["output"], fields["output_encoding"] = _output_text(value.output)
        return fields
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _output_text(output: bytes | None) -> tuple[str | None, str | None]:
    if output is None:
        return None, None
    try:
        return output.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(output).decode("ascii"), "base64"


def to_json(value: Any, *, lines: bool = False) -> str:
    """A JSON document (indented) or, with `lines`, one compact line (for `watch`)."""
    if lines:
        return json.dumps(plain(value), separators=(",", ":"))
    return json.dumps(plain(value), indent=2)


def clock(at: float | None) -> str:
    """A Unix time as local date and time to the second; `-` when unknown."""
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def seconds(value: float) -> str:
    """A short duration for tables: `850ms`, `12.3s`, `4m05s`, `2h10m`."""
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"


def labels_text(labels: Mapping[str, str]) -> str:
    """`gpu=a100,zone=b`, sorted; `-` for none."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def _table(*columns: str, right: Iterable[str] = ()) -> Table:
    aligned = set(right)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in aligned else "left")
    return table


def _detail(rows: Sequence[tuple[str, str]]) -> Text:
    """`name  value` lines with the values aligned (no table padding to trail the lines)."""
    width = max(len(name) for name, _ in rows)
    text = Text()
    for i, (name, value) in enumerate(rows):
        text.append("\n" if i else "")
        text.append(name.ljust(width + 2), style="bold")
        text.append(value)
    return text


def worker_text(t: TaskInfo) -> str:
    """The worker of the task's latest attempt as `name#id` (the id `workers` lists while it
    is connected); `-` when the server does not know it."""
    if not (t.worker_name or t.worker_id):
        return "-"
    return f"{t.worker_name}#{t.worker_id}" if t.worker_id else t.worker_name


def task_table(tasks: Sequence[TaskInfo]) -> Table:
    """The `list` and `search` table, one row per task in the order given."""
    table = _table(
        "id", "status", "pool", "key", "kind", "attempt", "worker", "created",
        right=("id", "attempt"),
    )  # fmt: skip
    for t in tasks:
        attempts = f"{t.attempt}/{t.max_attempts}" if t.max_attempts else str(t.attempt)
        table.add_row(
            str(t.id),
            t.status,
            t.pool,
            Text(t.key or "-"),
            t.kind or "-",
            attempts,
            Text(worker_text(t)),
            clock(t.created_at),
        )
    return table


def task_detail(t: TaskInfo) -> Text:
    """Every field of one task (`get`), one per line."""
    return _detail(
        [
            ("id", str(t.id)),
            ("status", t.status),
            ("pool", t.pool),
            ("key", t.key or "-"),
            ("kind", t.kind or "-"),
            ("priority", t.priority or "-"),
            ("tenant", t.tenant or "-"),
            ("attempt", f"{t.attempt} of {t.max_attempts or '?'}"),
            ("worker", worker_text(t)),
            ("created", clock(t.created_at)),
            ("started", clock(t.started_at)),
            ("finished", clock(t.finished_at)),
            ("message", t.message or "-"),
            ("output", "held" if t.output_available else "-"),
        ]
    )


def result_detail(r: Result) -> Text:
    """A finished task's result (`wait`, `submit --wait`): the output shown when it is text."""
    if r.output is None:
        output = "evicted" if r.status == "succeeded" and not r.output_available else "-"
    else:
        text, encoding = _output_text(r.output)
        printable = encoding == "utf-8" and text is not None and text.isprintable()
        output = text if printable and text else f"{len(r.output)} bytes"
    rows = [("id", str(r.id)), ("status", r.status)]
    if r.message:
        rows.append(("message", r.message))
    rows.append(("output", output))
    return _detail(rows)


# action: (what a dry run says it would do, what the action says it did)
_BULK_VERBS = {
    "cancel": ("would be cancelled", "cancelled"),
    "retry": ("would be submitted again", "submitted again"),
    "delete": ("would be deleted from the history", "deleted from the history"),
}


def bulk_text(action: str, result: BulkResult, *, dry_run: bool) -> str:
    """What `bulk` did, or with `dry_run` would do: `12 tasks match; 10 cancelled`."""
    would, did = _BULK_VERBS[action]
    matched = "1 task matches" if result.matched == 1 else f"{result.matched} tasks match"
    return f"{matched}; {result.affected} {would if dry_run else did}"


def event_line(e: Event) -> str:
    """One `watch` line: time, id, status, pool, key, attempt and message."""
    parts = [clock(e.at), str(e.id), e.status, f"pool={e.pool}"]
    if e.key:
        parts.append(f"key={e.key}")
    parts.append(f"attempt={e.attempt}")
    if e.message:
        parts.append(e.message)
    return "  ".join(parts)


def workers_table(workers: Sequence[WorkerInfo]) -> Table:
    """The `workers` table: who is connected, with what labels, how busy."""
    table = _table(
        "id", "name", "pool", "labels", "busy/slots", "connected", right=("id", "busy/slots")
    )
    for w in workers:
        table.add_row(
            str(w.id),
            Text(w.name or "-"),
            w.pool,
            Text(labels_text(w.labels)),
            f"{w.busy}/{w.slots}",
            clock(w.connected_at),
        )
    return table


def recurring_table(schedules: Sequence[RecurringInfo]) -> Table:
    """The `recurring list` table; an empty zone is UTC, as the server reads it."""
    table = _table("name", "cron", "tz", "pool", "kind", "overlap", "next", "last task")
    for s in schedules:
        last = "-" if s.last_task_id is None else str(s.last_task_id)
        table.add_row(
            Text(s.name),
            Text(s.cron),
            s.tz or "UTC",
            s.pool,
            s.kind or "-",
            s.overlap,
            clock(s.next_at),
            last,
        )
    return table
