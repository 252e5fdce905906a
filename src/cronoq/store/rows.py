"""Task records and schedules to store rows and back: the one place where the engine's types
meet the file's columns (see `base.TASK_COLUMNS`; times are Unix nanoseconds, options JSON)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ..core.model import (
    FIRST_TERMINAL,
    RETRYING,
    STATUS_NAMES,
    SUCCEEDED,
    Extras,
    PastAttempt,
    RetryPolicy,
    TaskRecord,
)
from ..core.recurring import Recurring
from .base import from_ns, to_ns
from .codec import Codec

_STATUS = {name: i for i, name in enumerate(STATUS_NAMES)}


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _json(value: Any) -> str | None:
    return None if value is None else _dumps(value)


def _ns(t: float | None) -> int | None:
    return None if t is None else to_ns(t)


def _sec(ns: int | None) -> float | None:
    return None if ns is None else from_ns(ns)


def retry_json(policy: RetryPolicy | None) -> str | None:
    if policy is None:
        return None
    return _json(
        [
            policy.max_attempts,
            policy.initial_backoff,
            policy.multiplier,
            policy.max_backoff,
            policy.jitter,
        ]
    )


def retry_from(text: str | None) -> RetryPolicy | None:
    if text is None:
        return None
    attempts, initial, multiplier, maximum, jitter = json.loads(text)
    return RetryPolicy(attempts, initial, multiplier, maximum, jitter)


def _eligible(rec: TaskRecord) -> int | None:
    return to_ns(rec.eligible_at) if rec.eligible_at else None


def _started(rec: TaskRecord) -> int | None:
    return to_ns(rec.started_at) if rec.started_at else None


def _not_before(rec: TaskRecord) -> int | None:
    return to_ns(rec.ready_at) if rec.status == RETRYING else None


def _attempts(extra: Extras | None) -> str | None:
    """The earlier attempts (Extras.history) as JSON [[number, started_ns, ended_ns, outcome,
    message, worker], ...]; None for a task that never retried."""
    if extra is None or not extra.history:
        return None
    return _dumps(
        [
            [a.number, to_ns(a.started_at), to_ns(a.ended_at), a.outcome, a.message, a.worker]
            for a in extra.history
        ]
    )


def _history(text: str) -> list[PastAttempt]:
    return [
        PastAttempt(n, from_ns(started), from_ns(ended), outcome, message, _worker(worker))
        for n, started, ended, outcome, message, worker in json.loads(text)
    ]


def _worker(value: list[Any] | None) -> tuple[str, int] | None:
    """A worker as JSON decoded it ([name, id]) back as the (name, id) the engine keeps."""
    if value is None:
        return None
    name, wid = value
    return name, wid


_NO_EXTRAS = Extras()  # read only: what a plain task's extras read as


def insert_row(
    rec: TaskRecord, payload: bytes | None, output: bytes | None, now: float
) -> tuple[Any, ...]:
    """A new task's full row (TASK_COLUMNS order)."""
    extra = rec.extra or _NO_EXTRAS
    worker = rec.worker
    terminal = rec.status >= FIRST_TERMINAL
    start = extra.start_at
    deps = extra.deps
    head = (
        rec.id,
        rec.seq,
        to_ns(rec.submitted_at),
        rec.pool,
        rec.kind,
        rec.cls,
        rec.key,
        payload,
        _ns(rec.deadline),
        _ns(start),
        None if start is None else extra.tolerance,
        None if start is None else extra.on_miss,
        rec.duration_hint,
        rec.timeout,
        retry_json(rec.retry),
        None if not deps else _json([list(d) for d in deps]),
        _json(extra.resources),
        _json(rec.tags),
        _json(rec.labels),
        rec.tenant,
        STATUS_NAMES[rec.status],
        1 if terminal else 0,
        rec.attempt,
        to_ns(rec.finished_at if terminal else now),
        rec.message,
        output,
        _eligible(rec),
        _not_before(rec),
        _started(rec),
    )
    # Joined, not one display (nor unpacked): CPython builds a tuple display of more than 30
    # items through a list, which makes a plain task's row a third slower to build.
    return head + (  # noqa: RUF005
        None if worker is None else _dumps(worker),
        None if extra.history is None else _attempts(extra),
    )


def update_row(rec: TaskRecord, output: bytes | None) -> tuple[tuple[Any, ...], bool]:
    """A known task's changed columns and whether it ended (base.DONE_CHANGE's columns, then
    the id) or not (base.LIVE_CHANGE's)."""
    worker = None if rec.worker is None else _dumps(rec.worker)
    extra = rec.extra
    attempts = None if extra is None else _attempts(extra)
    if rec.status >= FIRST_TERMINAL:
        done = (
            STATUS_NAMES[rec.status],
            rec.attempt,
            to_ns(rec.finished_at),
            rec.message,
            output,
            rec.key,  # None once freed (a removed schedule's cancelled occurrence)
            _started(rec),
            worker,
            attempts,
            rec.id,
        )
        return done, True
    live = (
        STATUS_NAMES[rec.status],
        rec.attempt,
        rec.message,
        _eligible(rec),
        _not_before(rec),
        _started(rec),
        worker,
        attempts,
        rec.id,
    )
    return live, False


def record_from_row(row: tuple[Any, ...], codec: Codec) -> tuple[TaskRecord, str | None]:
    """The engine record of a stored task, and why it cannot run (a payload the codec cannot
    decode) or None. Results of finished tasks are decoded too, and the payloads of those that
    did not succeed (to submit them again); one that cannot be is None."""
    (
        tid,
        seq,
        arrival,
        pool,
        kind,
        priority,
        key,
        payload,
        deadline,
        fixed_start,
        tolerance,
        on_miss,
        duration_hint,
        timeout,
        retry,
        deps,
        resources,
        tags,
        labels,
        tenant,
        status,
        _terminal,
        attempt,
        updated,
        message,
        output,
        eligible,
        not_before,
        started,
        worker,
        attempts,
    ) = row
    extra = None
    if fixed_start is not None or deps or resources or attempts:
        extra = Extras(
            deps=[tuple(d) for d in json.loads(deps)] if deps else None,
            resources=json.loads(resources) if resources else None,
        )
        if fixed_start is not None:
            extra.start_at = from_ns(fixed_start)
            extra.tolerance, extra.on_miss = tolerance, on_miss
        if attempts:
            extra.history = _history(attempts)
    rec = TaskRecord(
        None,
        pool,
        cls=priority,
        kind=kind,
        key=key,
        tenant=tenant,
        deadline=_sec(deadline),
        duration_hint=duration_hint,
        timeout=timeout,
        retry=retry_from(retry),
        tags=None if tags is None else json.loads(tags),
        labels=None if labels is None else json.loads(labels),
        extra=extra,
    )
    rec.id = tid
    rec.seq = seq
    rec.status = _STATUS[status]
    rec.attempt = attempt
    rec.submitted_at = from_ns(arrival)
    rec.message = message
    rec.eligible_at = 0.0 if eligible is None else from_ns(eligible)
    rec.started_at = 0.0 if started is None else from_ns(started)
    rec.worker = None if worker is None else _worker(json.loads(worker))
    problem = None
    if rec.status >= FIRST_TERMINAL:
        rec.finished_at = from_ns(updated)
        if output is not None:
            try:
                rec.output = codec.decode(output)
            except Exception:  # an undecodable result reads as unavailable
                rec.output = None
        if rec.status != SUCCEEDED and payload is not None:
            # kept whole so that it can be submitted again; unreadable, it reads as None
            with contextlib.suppress(Exception):
                rec.payload = codec.decode(payload)
    else:
        if not_before is not None:
            rec.ready_at = from_ns(not_before)
        elif rec.status == RETRYING:
            rec.ready_at = rec.submitted_at  # a file without retry times: retry at once
        try:
            rec.payload = None if payload is None else codec.decode(payload)
        except Exception as e:
            problem = f"payload cannot be decoded by the scheduler's codec: {type(e).__name__}: {e}"
    return rec, problem


def schedule_row(sched: Recurring, payload: bytes) -> tuple[Any, ...]:
    """A schedule's row: its definition as JSON, its template payload, next time, last task."""
    spec = {
        "cron": sched.cron,
        "tz": sched.tz_name,
        "pool": sched.pool,
        "priority": sched.cls,
        "kind": sched.kind,
        "key": sched.key,
        "tenant": sched.tenant,
        "deadline_in": sched.deadline_in,
        "duration_hint": sched.duration_hint,
        "timeout": sched.timeout,
        "retry": retry_json(sched.retry),
        "resources": sched.resources,
        "tags": sched.tags,
        "labels": sched.labels,
        "overlap": sched.overlap,
        "tolerance": sched.tolerance,
        "on_miss": sched.on_miss,
    }
    last = sched.last
    return (
        sched.name,
        _json(spec),
        payload,
        _ns(sched.next_time),
        None if last is None else last.id,
    )
