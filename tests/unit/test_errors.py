"""cronoq.errors: hierarchy, messages, attributes and pickling (docs/reference/errors.md,
"Exceptions")."""

from __future__ import annotations

import pickle

import pytest

from cronoq.errors import (
    SUBMIT_ERROR_CODES,
    CronoqError,
    EventsLagged,
    Permanent,
    Retryable,
    SchedulerError,
    SubmitError,
    TaskFailed,
)


def roundtrip(exc: BaseException) -> BaseException:
    copy: BaseException = pickle.loads(pickle.dumps(exc))
    return copy


@pytest.mark.parametrize(
    "cls", [SubmitError, SchedulerError, TaskFailed, EventsLagged, Retryable, Permanent]
)
def test_every_error_is_a_cronoq_error(cls: type[Exception]) -> None:
    assert issubclass(cls, CronoqError)
    assert issubclass(CronoqError, Exception)


def test_submit_error_codes_are_the_complete_documented_list() -> None:
    assert (
        frozenset(
            {
                "unknown_pool",
                "unknown_resource",
                "resource_exceeds_capacity",
                "reservation_conflict",
                "cycle",
                "unknown_dependency",
                "full",
                "overloaded",
                "duplicate_key_in_batch",
                "invalid",
            }
        )
        == SUBMIT_ERROR_CODES
    )
    assert isinstance(SUBMIT_ERROR_CODES, frozenset)


def test_submit_error_message_and_code() -> None:
    e = SubmitError("unknown_pool", "unknown pool 'nope'")
    assert e.code == "unknown_pool"
    assert e.message == "unknown pool 'nope'"
    assert str(e) == "unknown pool 'nope'"


def test_scheduler_error_message() -> None:
    e = SchedulerError("configuration error: unknown time zone 'Mars/Olympus'")
    assert str(e) == "configuration error: unknown time zone 'Mars/Olympus'"
    assert e.message == str(e)


def test_task_failed_message_and_attributes() -> None:
    e = TaskFailed("cancelled", "cancelled", 7)
    assert (e.status, e.message, e.task_id) == ("cancelled", "cancelled", 7)
    assert str(e) == "task 7 ended as cancelled: cancelled"


def test_task_failed_without_id() -> None:
    e = TaskFailed("shutdown", "scheduler shut down")
    assert e.task_id is None
    assert str(e) == "task ended as shutdown: scheduler shut down"


def test_events_lagged_message() -> None:
    e = EventsLagged(3)
    assert e.skipped == 3
    assert str(e) == "event stream fell behind; 3 events were dropped"


def test_retryable_defaults_and_message() -> None:
    e = Retryable()
    assert (e.message, e.retry_after, str(e)) == ("", None, "")
    e = Retryable("429", retry_after=2)
    assert str(e) == "429"
    assert e.retry_after == 2.0
    assert isinstance(e.retry_after, float)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_retryable_rejects_bad_retry_after(bad: float) -> None:
    with pytest.raises(ValueError, match="retry_after must be a finite, non-negative"):
        Retryable("x", retry_after=bad)


def test_retryable_and_permanent_keep_str_of_any_message() -> None:
    cause = KeyError("k")
    assert Retryable(cause).message == str(cause)
    assert str(Permanent(cause)) == str(cause)


def test_permanent_message() -> None:
    assert str(Permanent("bad input")) == "bad input"
    assert Permanent().message == ""


def test_pickle_submit_error() -> None:
    e = roundtrip(SubmitError("cycle", "dependency cycle"))
    assert isinstance(e, SubmitError)
    assert (e.code, e.message, str(e)) == ("cycle", "dependency cycle", "dependency cycle")


def test_pickle_scheduler_error() -> None:
    e = roundtrip(SchedulerError("boom"))
    assert isinstance(e, SchedulerError)
    assert (e.message, str(e)) == ("boom", "boom")


def test_pickle_task_failed() -> None:
    e = roundtrip(TaskFailed("failed", "bad input", 42))
    assert isinstance(e, TaskFailed)
    assert (e.status, e.message, e.task_id) == ("failed", "bad input", 42)
    assert str(e) == "task 42 ended as failed: bad input"


def test_pickle_events_lagged() -> None:
    e = roundtrip(EventsLagged(5))
    assert isinstance(e, EventsLagged)
    assert e.skipped == 5
    assert str(e) == "event stream fell behind; 5 events were dropped"


def test_pickle_retryable() -> None:
    e = roundtrip(Retryable("429", retry_after=2.0))
    assert isinstance(e, Retryable)
    assert (e.message, e.retry_after) == ("429", 2.0)


def test_pickle_permanent() -> None:
    e = roundtrip(Permanent("bad input"))
    assert isinstance(e, Permanent)
    assert e.message == "bad input"


def test_pickle_keeps_subclass() -> None:
    class MyFailure(TaskFailed):
        pass

    # Local classes cannot be pickled by reference; check the reduce recipe instead.
    fn, args = MyFailure("failed", "x", 1).__reduce__()
    assert fn is MyFailure
    assert args == ("failed", "x", 1)
