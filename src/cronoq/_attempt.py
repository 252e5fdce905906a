"""What a library executor's `TaskContext` and a remote worker's `Lease` both offer: the
cancellation token and the tag lookups (docs/library.md, "Cancellation tokens, tags and
traces"). One implementation, so that code written against one works with the other."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = ["TRACEPARENT", "TRACESTATE", "AttemptMembers", "CancellationToken"]

log = logging.getLogger("cronoq")

TRACEPARENT = "traceparent"  # the tag that carries a task's W3C trace context
TRACESTATE = "tracestate"  # and the one beside it with the vendors' trace state


class CancellationToken:
    """Tells whether an attempt was given up (cancel, timeout, lease loss, shutdown, abort),
    as an object that code knowing nothing of cronoq can be handed.

    Only cronoq cancels it. Callbacks may be added from any thread: they run once, on the
    thread that cancels (the event loop's), or at once when added after the cancellation.
    No lock is needed: `list.append` and `list.pop` are atomic, the flag is set before the
    list is drained, and a callback added concurrently is drained by whichever side pops it.
    """

    __slots__ = ("_callbacks", "_cancelled")

    def __init__(self) -> None:
        self._cancelled = False
        self._callbacks: list[Callable[[], object]] = []

    def is_cancelled(self) -> bool:
        return self._cancelled

    async def wait(self) -> None:
        """Return once the token is cancelled (at once if it is already)."""
        if self._cancelled:
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, done)

        self.add_callback(wake)
        try:
            await done
        finally:
            self.remove_callback(wake)

    def add_callback(self, callback: Callable[[], object]) -> None:
        """Call `callback()` once when the token is cancelled; now if it already is.
        An exception it raises is logged, not raised."""
        self._callbacks.append(callback)
        if self._cancelled:
            self._drain()

    def remove_callback(self, callback: Callable[[], object]) -> bool:
        """Forget a callback that has not run yet; False if it was not pending."""
        try:
            self._callbacks.remove(callback)
        except ValueError:
            return False
        return True

    def _cancel(self) -> None:
        self._cancelled = True
        self._drain()

    def _drain(self) -> None:
        callbacks = self._callbacks
        while callbacks:
            try:
                callback = callbacks.pop(0)
            except IndexError:  # another thread took the last one
                return
            try:
                callback()
            except Exception:
                log.exception("cancellation callback %r failed", callback)

    def __repr__(self) -> str:
        return f"CancellationToken(cancelled={self._cancelled})"


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class _HasAttempt(Protocol):
    _token: CancellationToken

    @property
    def tags(self) -> Mapping[str, str]: ...


class AttemptMembers:
    """The members `TaskContext` and `Lease` share; each provides `tags` and `_token`."""

    __slots__ = ()

    def cancellation_token(self: _HasAttempt) -> CancellationToken:
        """The attempt's token, to hand to code that should stop when the attempt does."""
        return self._token

    def tag(self: _HasAttempt, name: str) -> str | None:
        """The value of the task's tag `name`, None without one."""
        return self.tags.get(name)

    def traceparent(self: _HasAttempt) -> str | None:
        """The task's W3C `traceparent` (its tag of that name, set where it was submitted:
        docs/observability.md, "Traces"), None without one."""
        return self.tags.get(TRACEPARENT)

    def tracestate(self: _HasAttempt) -> str | None:
        """The task's W3C `tracestate` (its tag of that name), None without one."""
        return self.tags.get(TRACESTATE)
