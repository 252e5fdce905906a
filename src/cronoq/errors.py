"""Exceptions raised to users of cronoq and by executors to steer retries, and the check of
duration arguments that `Retryable` shares with the core (which imports it from here, so this
module depends on nothing of cronoq's).

Every class keeps its constructor arguments in `args` and defines `__reduce__`, so instances
cross process boundaries (pickle, multiprocessing) with all their attributes intact.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "SUBMIT_ERROR_CODES",
    "CronoqError",
    "EventsLagged",
    "Permanent",
    "Retryable",
    "SchedulerError",
    "SubmitError",
    "TaskFailed",
]

SUBMIT_ERROR_CODES: frozenset[str] = frozenset(
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


def check_seconds(name: str, value: object, *, allow_inf: bool = False) -> float:
    """A duration argument: finite (or inf where allowed) and non-negative, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds (got {value!r})")
    v = float(value)
    if math.isnan(v) or v < 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be a finite, non-negative number of seconds (got {value!r})")
    return v


class CronoqError(Exception):
    """Base class of every exception cronoq defines."""


class SubmitError(CronoqError):
    """A submission was refused; `code` (one of SUBMIT_ERROR_CODES) says why, for programs."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, self.message))


class SchedulerError(CronoqError):
    """The scheduler itself cannot go on (configuration, store or event-loop trouble)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))


class TaskFailed(CronoqError):
    """Awaiting a task that did not succeed: its terminal status (or "shutdown") and reason."""

    def __init__(self, status: str, message: str, task_id: int | None = None) -> None:
        super().__init__(status, message, task_id)
        self.status = status
        self.message = message
        self.task_id = task_id

    def __str__(self) -> str:
        # Without an id (a TaskFailed built by hand) there is nothing sensible to print there.
        who = "task" if self.task_id is None else f"task {self.task_id}"
        return f"{who} ended as {self.status}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.message, self.task_id))


class EventsLagged(CronoqError):
    """An `on_lag="raise"` event stream overflowed and lost its `skipped` oldest events."""

    def __init__(self, skipped: int) -> None:
        super().__init__(skipped)
        self.skipped = skipped

    def __str__(self) -> str:
        return f"event stream fell behind; {self.skipped} events were dropped"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.skipped,))


class Retryable(CronoqError):
    """Raised by an executor: retry this task, waiting at least `retry_after` seconds if given.

    Any other exception is retryable too; this one exists to carry `retry_after` (e.g. from an
    HTTP 429) and a clean message without the exception type in front. `message` may be any
    object (`raise Retryable(exc)` is common); it is kept as its str().
    """

    def __init__(self, message: object = "", retry_after: float | None = None) -> None:
        after = None if retry_after is None else check_seconds("retry_after", retry_after)
        self.message = str(message)
        self.retry_after = after
        super().__init__(self.message, after)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.retry_after))


class Permanent(CronoqError):
    """Raised by an executor: fail this task now (status `failed`), without further attempts.

    `message` may be any object and is kept as its str(), like Retryable's.
    """

    def __init__(self, message: object = "") -> None:
        self.message = str(message)
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))
