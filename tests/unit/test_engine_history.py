"""The attempt history of a retried task (`TaskRecord.past_attempts`): what each way an attempt
ends and the task retries records, its bound, and that a task which never retries keeps no
extras. Every call gets an explicit `now`."""

from __future__ import annotations

from cronoq.core.engine import ABORT_LEASE, ABORT_TIMEOUT, EVENTS_NONE
from cronoq.core.model import (
    CANCELLED,
    DEAD_LETTERED,
    HISTORY_MAX,
    RETRYING,
    SUCCEEDED,
    Extras,
    PastAttempt,
    RetryPolicy,
    TaskRecord,
)
from helpers.engine import Driver, make_engine

NO_JITTER = RetryPolicy(max_attempts=5, initial_backoff=1.0, multiplier=1.0, jitter=False)


def test_a_task_that_never_retries_allocates_no_extras() -> None:
    eng = make_engine(level=EVENTS_NONE)
    drv = Driver(eng, catch_up=False)
    ok = eng.submit(TaskRecord(None, "p"), 0.0)[0]
    eng.complete(drv.start_one(0.0), 1.0)
    failed = eng.submit(TaskRecord(None, "p", retry=RetryPolicy.none()), 1.0)[0]
    eng.fail(drv.start_one(1.0), 2.0, "once")
    permanent = eng.submit(TaskRecord(None, "p"), 2.0)[0]
    eng.fail(drv.start_one(2.0), 3.0, "never again", permanent=True)
    for rec in (ok, failed, permanent):
        assert rec.extra is None and rec.past_attempts == ()
    assert (ok.status, failed.status) == (SUCCEEDED, DEAD_LETTERED)


def test_failures_that_retry_are_kept_with_their_times_and_messages() -> None:
    eng = make_engine(level=EVENTS_NONE, retry=NO_JITTER)
    drv = Driver(eng, catch_up=False)
    rec = eng.submit(TaskRecord(None, "p"), 0.0)[0]
    eng.fail(drv.start_one(0.5), 2.0, "boom 1")
    assert rec.status == RETRYING
    assert rec.past_attempts == (PastAttempt(1, 0.5, 2.0, "failed", "boom 1"),)
    eng.fail(drv.start_one(3.0), 3.25, "boom 2", retry_after=4.0)
    eng.complete(drv.start_one(7.25), 8.0)
    assert rec.status == SUCCEEDED and rec.attempt == 3
    assert rec.past_attempts == (
        PastAttempt(1, 0.5, 2.0, "failed", "boom 1"),
        PastAttempt(2, 3.0, 3.25, "failed", "boom 2"),
    )
    assert rec.extra is not None and rec.extra.spec() == {}  # history only


def test_the_last_attempt_is_not_history() -> None:
    """A dead-lettered or cancelled task's final attempt is the record's own."""
    eng = make_engine(
        level=EVENTS_NONE, retry=RetryPolicy(max_attempts=2, initial_backoff=0.0, jitter=False)
    )
    drv = Driver(eng, catch_up=False)
    dead = eng.submit(TaskRecord(None, "p"), 0.0)[0]
    eng.fail(drv.start_one(0.0), 1.0, "first")
    eng.fail(drv.start_one(1.0), 2.0, "last")
    assert dead.status == DEAD_LETTERED and dead.message == "last"
    assert [p.number for p in dead.past_attempts] == [1]
    cancelled = eng.submit(TaskRecord(None, "p"), 2.0)[0]
    drv.start_one(2.0)
    eng.cancel(cancelled.id, 3.0)
    assert cancelled.status == CANCELLED and cancelled.past_attempts == ()


def test_timeouts_and_lease_expiries_that_retry_are_kept() -> None:
    eng = make_engine(level=EVENTS_NONE, retry=NO_JITTER, lease_ttl=2.0)
    drv = Driver(eng, catch_up=False)
    rec = eng.submit(TaskRecord(None, "p", timeout=1.0), 0.0)[0]
    drv.start_one(0.0)
    eng.advance(1.0)  # the attempt's timeout
    assert eng.take().aborts
    drv.start_one(2.0)
    eng.advance(3.0)  # times out again (within its lease)
    third = drv.start_one(5.0)
    assert third.number == 3
    eng.complete(third, 5.5)
    assert rec.past_attempts == (
        PastAttempt(1, 0.0, 1.0, "timed_out", ABORT_TIMEOUT),
        PastAttempt(2, 2.0, 3.0, "timed_out", ABORT_TIMEOUT),
    )
    lost = eng.submit(TaskRecord(None, "p"), 6.0)[0]
    att = drv.start_one(6.0)
    eng.heartbeat(att, 7.0)  # the lease now runs until 9.0
    eng.advance(8.0)
    assert lost.past_attempts == ()
    eng.advance(9.0)
    assert lost.status == RETRYING
    assert lost.past_attempts == (PastAttempt(1, 6.0, 9.0, "lease_expired", ABORT_LEASE),)


def test_the_history_keeps_the_last_history_max_attempts() -> None:
    many = RetryPolicy(max_attempts=HISTORY_MAX + 6, initial_backoff=0.0, jitter=False)
    eng = make_engine(level=EVENTS_NONE, retry=many)
    drv = Driver(eng, catch_up=False)
    rec = eng.submit(TaskRecord(None, "p"), 0.0)[0]
    for n in range(1, HISTORY_MAX + 6):
        eng.fail(drv.start_one(float(n)), n + 0.5, f"boom {n}")
    past = rec.past_attempts
    assert len(past) == HISTORY_MAX
    assert [p.number for p in past] == list(range(6, HISTORY_MAX + 6))
    last = HISTORY_MAX + 5
    assert past[-1] == PastAttempt(last, float(last), last + 0.5, "failed", f"boom {last}")


def test_history_sits_next_to_the_options_of_a_task_with_extras() -> None:
    eng = make_engine(level=EVENTS_NONE, retry=NO_JITTER)
    drv = Driver(eng, catch_up=False)
    options = Extras(start_at=None, resources={})
    rec = eng.submit(TaskRecord(None, "p", extra=options), 0.0)[0]
    eng.fail(drv.start_one(0.0), 1.0, "boom")
    assert rec.extra is options and rec.extra.resources == {}
    assert rec.past_attempts == (PastAttempt(1, 0.0, 1.0, "failed", "boom"),)
    assert not rec.extra.is_empty()
