"""The engine's recurring schedules by name: each creates its next occurrence (recurring.py)
when its timer fires, at the dispatch that follows.

Occurrences are submitted and cancelled like any task, through the engine's own `submit` and
`cancel`, which the engine hands over as callables (so this module needs no engine).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import SubmitError
from .model import BLOCKED, FIRST_TERMINAL, TaskRecord
from .recurring import RECURRING_TAG, Recurring, occurrence_key
from .state import State

Submit = Callable[[TaskRecord, float], tuple[TaskRecord, bool]]
Cancel = Callable[[int | str, float], bool]


class Schedules:
    """The engine's recurring schedules by name (see the module docstring)."""

    __slots__ = ("_cancel", "_due", "_occurrence", "_st", "_submit", "by_name")

    def __init__(self, st: State, submit: Submit, cancel: Cancel) -> None:
        self._st = st
        self._submit = submit
        self._cancel = cancel
        self._occurrence = st.timers.handler(self._on_cron)
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
        tasks = self._st.tasks
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
        for rec in sched.unstarted():
            self._cancel(rec.id, now)
            self._st.free_key(rec)  # for good: a store writes the cancelled task without it
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
        journal = self._st.journal
        if journal is not None:
            journal.schedules[sched.name] = sched
        if t is not None:
            when = max(not_before, t - 2 * sched.tolerance)
            self._st.timers.set(when, self._occurrence, sched, sched.gen)

    def _on_cron(self, sched: Recurring, gen: int, when: float, now: float) -> None:
        if self.by_name.get(sched.name) is sched and sched.gen == gen:
            self._due.append(sched)  # created by the dispatch that follows

    def _materialize(self, sched: Recurring, now: float) -> None:
        """Create the occurrence at sched.next_time as an ordinary fixed-start task."""
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
            self._st.totals["recurring_conflicts"] += 1
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
                got, _ = self._submit(rec, now)
            except SubmitError:
                self._st.totals["recurring_conflicts"] += 1
            else:
                sched.created(got)
        # Occurrences whose time passed before this one was created (a stalled or stopped
        # driver) are not created: the schedule goes on from now.
        self._plan_next(sched, max(t, now), t)
