"""Restoring what a store kept: the engine takes back its tasks before anything is submitted.

Each record carries its stored id, seq, status, attempt, times and extras (deps as submitted,
resources, fixed start); a retrying task's `ready_at` is when it retries. Terminal tasks are
retained (lookups, results, key deduplication). Live ones resume: blocked tasks wait for their
parents again, scheduled and never-started fixed starts arrive again (a start that passed
meanwhile follows its on_miss), retrying tasks keep their retry time. An attempt that was
running when the last holder stopped is counted as used (*lost*): the task retries with the next
attempt number after its retry backoff (not at once: the old holder's executor may still be
finishing), or is dead-lettered when that was its last attempt. Tasks of a pool or
resource that no longer exists fail, as do those whose row could not be read.

Every status change here follows model.RESTORE_TRANSITIONS: a live task is admitted again from
BLOCKED (and moves on by the life-cycle table like a new task), a retrying one stays retrying,
one that cannot resume fails. Totals count only what happens from here (lost attempts included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..errors import SubmitError
from .deps import Dependencies
from .model import (
    BLOCKED,
    DEAD_LETTERED,
    DEFAULT_RETRY,
    FAILED,
    FIRST_TERMINAL,
    READY,
    RETRYING,
    RUNNING,
    Extras,
    TaskRecord,
)
from .parking import unqueue
from .state import State

MSG_LOST = "attempt lost in failover; retries exhausted"
MSG_LOST_RETRY = "attempt lost in failover"


def restore(
    st: State, deps: Dependencies, recs: Iterable[TaskRecord], now: float, broken: Mapping[int, str]
) -> None:
    """See the module docstring."""
    ordered = sorted(recs, key=lambda r: r.id)
    for rec in ordered:
        st.seq = max(st.seq, rec.seq)
    done = sorted((r for r in ordered if r.status >= FIRST_TERMINAL), key=_finished_at)
    for rec in done:
        st.retain(rec)
    lost: list[TaskRecord] = []
    retried: dict[str, int] = {}  # lost attempts retried, by pool
    for rec in ordered:
        if rec.status >= FIRST_TERMINAL:
            continue
        was_running = rec.status == RUNNING
        problem = broken.get(rec.id) or _readmit(st, deps, rec, now)
        if problem is None and was_running and rec.status == RETRYING:
            retried[rec.pool] = retried.get(rec.pool, 0) + 1
        if problem is not None:
            st.reinstate(rec, FAILED, journal=True)
            rec.message, rec.finished_at = problem, now
            rec.extra = None
            st.retain(rec)
        elif rec.extra is not None and rec.extra.lost:
            rec.extra.lost = False
            lost.append(rec)
            if rec.extra.is_empty():
                rec.extra = None
    st.restart_counts(retried)
    for rec in lost:
        pool = st.pools[rec.pool]
        policy = rec.retry or pool.retry or DEFAULT_RETRY
        if rec.attempt >= policy.max_attempts and rec.status == READY:
            unqueue(rec, pool)
            st.finish(rec, DEAD_LETTERED, now, MSG_LOST)


def _readmit(st: State, deps: Dependencies, rec: TaskRecord, now: float) -> str | None:
    """Admit one stored live task again; returns why it cannot run, or None."""
    pool = st.pools.get(rec.pool)
    if pool is None:
        return f"pool {rec.pool!r} is no longer configured"
    status, extra = rec.status, rec.extra
    if extra is not None:
        try:
            st.resolve_resources(extra)
        except SubmitError as e:
            return f"cannot resume: {e.message}"
        if status != BLOCKED:
            extra.deps = None  # satisfied before it was stored
    lost = status == RUNNING
    policy = rec.retry or pool.retry or DEFAULT_RETRY
    # A fixed start lost with its attempt goes back under its fixed-start rules (its time has
    # passed: it runs late within its tolerance, else follows on_miss), attempts permitting.
    fixed_again = (
        lost
        and extra is not None
        and extra.start_at is not None
        and rec.attempt < policy.max_attempts
    )
    if extra is not None and rec.attempt > 0 and not fixed_again:
        extra.start_at = None  # its fixed start happened: it runs as any task
    if lost and not fixed_again:
        if extra is not None and extra.is_empty():
            rec.extra = None
        if rec.attempt >= policy.max_attempts:
            # its last attempt is lost: restore() dead-letters it once it is admitted
            rec.extra = rec.extra or Extras()
            rec.extra.lost = True
        else:
            # a retry after the pool's backoff, like any failed attempt (not at once: a worker
            # may still be finishing it), with the next attempt number
            delay = policy.backoff(rec.attempt + 1)
            if policy.jitter and delay > 0.0:
                delay = st.rng.uniform(0.0, delay)
            rec.ready_at = now + delay
            rec.message = MSG_LOST_RETRY
            status = RETRYING
    if status == RETRYING:
        st.reinstate(rec, RETRYING, journal=lost)  # a lost attempt's retry time is written back
        st.resume_retry(rec, pool)
        return None
    if extra is not None:
        try:
            deps.resolve(rec, extra, None)
        except SubmitError as e:
            return f"cannot resume: {e.message}"
    if rec.extra is not None and rec.extra.is_empty():
        rec.extra = None
    st.reinstate(rec, BLOCKED, journal=False)
    st.admit(rec, pool, now)
    return None


def _finished_at(rec: TaskRecord) -> float:
    return rec.finished_at
