"""Recurring schedules: a cron expression in a time zone that materializes one fixed-start task
per occurrence.

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
from typing import TYPE_CHECKING, Any

from ..errors import SubmitError
from .cron import CronSpec
from .model import BLOCKED, FIRST_TERMINAL, READY, SCHEDULED, Extras, RetryPolicy, TaskRecord

if TYPE_CHECKING:
    from .engine import Engine

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
    overlap: str = "skip"
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


class Schedules:
    """The engine's recurring schedules by name (see the module docstring)."""

    __slots__ = ("_due", "_eng", "by_name")

    def __init__(self, eng: Engine) -> None:
        self._eng = eng
        self.by_name: dict[str, Recurring] = {}
        self._due: list[Recurring] = []  # occurrences to create at the next dispatch

    def add(self, sched: Recurring, now: float) -> None:
        """Add or replace a schedule by name; a replaced schedule's pending occurrences are
        cancelled."""
        self.remove(sched.name, now)
        self.by_name[sched.name] = sched
        self._plan_next(sched, now, now)

    def resume(
        self, sched: Recurring, next_time: float | None, last_id: int | None, now: float
    ) -> None:
        """Take back a stored schedule (after restore): its next occurrence is the stored one,
        created at once if its time passed meanwhile (then its on_miss applies); the
        occurrences that passed after it are not created."""
        tasks = self._eng.tasks
        self.by_name[sched.name] = sched
        tag = sched.name
        for rec in sorted(tasks.values(), key=lambda r: r.seq):
            if rec.tags and rec.tags.get(RECURRING_TAG) == tag:
                sched.created(rec)
        if last_id is not None and last_id in tasks:
            sched.last = tasks[last_id]
        if next_time is not None:
            self._plan_next(sched, next_time - 0.5, now)

    def remove(self, name: str, now: float) -> bool:
        """Drop a schedule and cancel its occurrences that have not started yet (their keys are
        freed, so a schedule added again under the same name creates them anew)."""
        sched = self.by_name.pop(name, None)
        if sched is None:
            return False
        sched.gen += 1
        eng = self._eng
        for rec in sched.unstarted():
            eng.cancel(rec.id, now)
            eng._free_key(rec)  # for good: a store writes the cancelled task without it
        return True

    def create_due(self, now: float) -> bool:
        """Create the occurrences whose timers fired; True if there were any."""
        if not self._due:
            return False
        for sched in self._due:
            if self.by_name.get(sched.name) is sched:
                self._materialize(sched, now)
        self._due.clear()
        return True

    def _plan_next(self, sched: Recurring, after: float, not_before: float) -> None:
        """Find the next occurrence strictly after `after` and set the timer that creates it."""
        t = sched.spec.next_after(after, sched.tz)
        sched.next_time = t
        journal = self._eng.journal
        if journal is not None:
            journal.schedules[sched.name] = sched
        if t is not None:
            when = max(not_before, t - 2 * sched.tolerance)
            self._eng.timers.set(when, self._on_cron, sched, sched.gen)

    def _on_cron(self, sched: Recurring, gen: int, when: float, now: float) -> None:
        if self.by_name.get(sched.name) is sched and sched.gen == gen:
            self._due.append(sched)  # created by the dispatch that follows

    def _materialize(self, sched: Recurring, now: float) -> None:
        """Create the occurrence at sched.next_time as an ordinary fixed-start task."""
        eng = self._eng
        t = sched.next_time
        assert t is not None
        prev = sched.last
        prev_live = prev is not None and prev.status < FIRST_TERMINAL
        overlap = sched.overlap
        conflict = False
        if overlap in ("queue", "queue_on_success"):
            queued = sched.queued
            conflict = queued is not None and queued.status == BLOCKED
        if conflict:
            eng.totals["recurring_conflicts"] += 1
        else:
            rec = sched.occurrence(t, occurrence_key(sched.key, t))
            assert rec.extra is not None
            if overlap == "skip":
                rec.extra.recurring = sched  # checked at its start time
            elif prev is not None and (
                overlap == "queue_on_success" or (overlap == "queue" and prev_live)
            ):
                on = "success" if overlap == "queue_on_success" else "complete"
                rec.extra.deps = [(prev.id, on)]
            try:
                got, _ = eng.submit(rec, now)
            except SubmitError:
                eng.totals["recurring_conflicts"] += 1
            else:
                sched.created(got)
        # Occurrences whose time passed before this one was created (a stalled or stopped
        # driver) are not created: the schedule goes on from now.
        self._plan_next(sched, max(t, now), t)
