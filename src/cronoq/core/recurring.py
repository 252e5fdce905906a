"""Recurring schedules: a cron expression in a time zone that materializes one fixed-start task
per occurrence (`Recurring`, one schedule; the engine's component that keeps them and creates
their occurrences is `schedules.Schedules`).

Each occurrence is created 2 x tolerance ahead of its time (or when the previous one fires, if
that is later) as an ordinary fixed-start task with the key `<key>@<UTC time>Z`. Overlap with
the previous occurrence: `allow` runs both, `skip` skips the new one at its start time while an
earlier one is live, `queue` makes it depend on the previous one (any end) while that is live,
`queue_on_success` makes it depend on the previous one succeeding. In the queue modes an
occurrence still waiting for its predecessor means the next one is not created (a conflict,
counted in totals["recurring_conflicts"], as is an occurrence whose submit is refused).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import Any

from .cron import CronSpec
from .model import BLOCKED, FIRST_TERMINAL, READY, SCHEDULED, Extras, RetryPolicy, TaskRecord
from .vocab import Overlap

RECURRING_TAG = "cronoq.recurring"


def occurrence_key(key: str | None, t: float) -> str | None:
    """`<key>@<UTC time of the occurrence>Z`, or None for a schedule without a key."""
    if key is None:
        return None
    return f"{key}@{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t))}Z"


@dataclass(eq=False)
class Recurring:
    """One schedule: when (spec, tz), what (the task template) and how overlaps are handled."""

    name: str
    spec: CronSpec
    tz: tzinfo
    payload: Any
    pool: str
    cls: int = 2
    kind: str = "default"
    key: str | None = None
    tenant: str | None = None
    deadline_in: float | None = None
    duration_hint: float | None = None
    timeout: float | None = None
    retry: RetryPolicy | None = None
    resources: dict[str, int] | None = None
    tags: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    overlap: Overlap = "skip"
    tolerance: float = 1.0
    on_miss: str = "run_late"
    cron: str = ""  # the expression and zone as given (stores and listings show them)
    tz_name: str | None = None
    # state
    gen: int = 0
    next_time: float | None = None
    last: TaskRecord | None = None  # the latest occurrence created
    queued: TaskRecord | None = None  # an occurrence waiting for the previous one (queue modes)
    recent: list[TaskRecord] = field(default_factory=list)  # occurrences still live

    def created(self, rec: TaskRecord) -> None:
        """Remember a new occurrence (and forget those that have ended)."""
        self.last = rec
        self.queued = rec if rec.status == BLOCKED else None
        self.recent = [r for r in self.recent if r.status < FIRST_TERMINAL]
        self.recent.append(rec)

    def earlier_live(self, rec: TaskRecord) -> bool:
        """Is an occurrence created before `rec` still live (overlap="skip" drops `rec`)?"""
        return any(r.seq < rec.seq and r.status < FIRST_TERMINAL for r in self.recent)

    def unstarted(self) -> list[TaskRecord]:
        """Occurrences created and not started: blocked, scheduled, or ready (due)."""
        return [r for r in self.recent if r.status in (BLOCKED, SCHEDULED, READY)]

    def occurrence(self, t: float, key: str | None) -> TaskRecord:
        """A fresh task for the occurrence at Unix time t."""
        tags = dict(self.tags or {})
        tags[RECURRING_TAG] = self.name
        extra = Extras(
            start_at=t,
            tolerance=self.tolerance,
            on_miss=self.on_miss,
            resources=dict(self.resources) if self.resources else None,
        )
        return TaskRecord(
            self.payload,
            self.pool,
            cls=self.cls,
            kind=self.kind,
            key=key,
            tenant=self.tenant,
            deadline=None if self.deadline_in is None else t + self.deadline_in,
            duration_hint=self.duration_hint,
            timeout=self.timeout,
            retry=self.retry,
            tags=tags,
            labels=None if not self.labels else dict(self.labels),
            extra=extra,
        )
