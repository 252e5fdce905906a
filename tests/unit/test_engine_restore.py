"""The restore transitions (model.RESTORE_TRANSITIONS): what restoring may do to a stored
status, and that nothing else gets through."""

from __future__ import annotations

import pytest

from cronoq.core.engine import Engine
from cronoq.core.model import (
    BLOCKED,
    FAILED,
    FIRST_TERMINAL,
    RESTORE_TRANSITIONS,
    RETRYING,
    RUNNING,
    STATUS_NAMES,
    SUCCEEDED,
    Extras,
    IllegalTransition,
    PoolConfig,
    RetryPolicy,
    TaskRecord,
    check_transition,
)


def stored(status: int, tid: int = 1, pool: str = "p", attempt: int = 0) -> TaskRecord:
    rec = TaskRecord(None, pool)
    rec.id, rec.seq, rec.status, rec.attempt = tid, tid, status, attempt
    rec.submitted_at = rec.finished_at = 1.0
    return rec


def test_every_status_has_restore_moves_and_terminal_ones_stay() -> None:
    assert set(RESTORE_TRANSITIONS) == set(range(len(STATUS_NAMES)))
    for status in range(FIRST_TERMINAL, len(STATUS_NAMES)):
        assert RESTORE_TRANSITIONS[status] == {status}
    for status in range(FIRST_TERMINAL):
        assert FAILED in RESTORE_TRANSITIONS[status]  # whatever cannot resume fails


def test_a_move_outside_the_table_raises() -> None:
    with pytest.raises(IllegalTransition, match="task 1: succeeded -> failed"):
        check_transition(stored(SUCCEEDED), FAILED, RESTORE_TRANSITIONS)
    with pytest.raises(IllegalTransition, match="task 1: retrying -> blocked"):
        check_transition(stored(RETRYING), BLOCKED, RESTORE_TRANSITIONS)


def test_restore_fails_broken_and_orphaned_tasks_and_retries_a_lost_attempt() -> None:
    eng = Engine([PoolConfig("p", capacity=0)], 10.0, journal=True)
    running = stored(RUNNING, 1, attempt=1)
    orphan = stored(BLOCKED, 2, pool="gone")
    broken = stored(RUNNING, 3, attempt=1)
    done = stored(SUCCEEDED, 4)
    eng.restore([running, orphan, broken, done], 10.0, {3: "row unreadable"})
    # a retry after the default backoff (1 s, jittered), then as attempt 2
    assert (running.status_name, running.attempt) == ("retrying", 1)
    assert running.message == "attempt lost in failover"
    assert 10.0 <= running.ready_at <= 11.0
    assert eng.totals["retries"] == 1
    assert (orphan.status_name, orphan.message) == ("failed", "pool 'gone' is no longer configured")
    assert (broken.status_name, broken.message) == ("failed", "row unreadable")
    assert done.status_name == "succeeded"
    journal = eng.take_journal()
    assert journal.added == []  # the rows exist
    assert set(journal.changed) == {1, 2, 3}  # the retry time is written back too
    eng.advance(running.ready_at)
    assert running.status_name == "ready"


@pytest.mark.parametrize(
    ("on_miss", "tolerance", "expected"),
    [("skip", 1.0, "missed"), ("fail", 1.0, "failed"), ("run_late", 1.0, "ready")],
)
def test_a_lost_fixed_start_goes_back_under_its_fixed_start_rules(
    on_miss: str, tolerance: float, expected: str
) -> None:
    # started at 5.0 and lost; restored at 10.0, past its tolerance: on_miss decides
    eng = Engine([PoolConfig("p", capacity=0)], 10.0, journal=True)
    rec = stored(RUNNING, 1, attempt=1)
    rec.extra = Extras(start_at=5.0, tolerance=tolerance, on_miss=on_miss)
    eng.restore([rec], 10.0)
    assert rec.status_name == expected
    assert rec.attempt == 1  # a next attempt is attempt 2


def test_a_lost_fixed_start_within_its_tolerance_runs_late() -> None:
    eng = Engine([PoolConfig("p", capacity=0)], 10.0, journal=True)
    rec = stored(RUNNING, 1, attempt=1)
    rec.extra = Extras(start_at=9.5, tolerance=2.0, on_miss="skip")
    eng.restore([rec], 10.0)
    assert rec.status_name == "ready"


def test_a_lost_last_attempt_of_a_fixed_start_is_dead_lettered() -> None:
    eng = Engine([PoolConfig("p", capacity=0, retry=RetryPolicy.none())], 10.0, journal=True)
    rec = stored(RUNNING, 1, attempt=1)
    rec.extra = Extras(start_at=9.5, tolerance=2.0, on_miss="skip")
    eng.restore([rec], 10.0)
    assert (rec.status_name, rec.message) == (
        "dead_lettered",
        "attempt lost in failover; retries exhausted",
    )
