"""What library users hold: a task's handle, an executor's context, a stream of events.

They are views of one session (`session.Session`): a handle reads the engine's record of its
task and waits on the session's waiters, a stream is fed by the session's pump. Their
underscore methods are the driver's (the session and the launcher), kept out of the API.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from .._attempt import AttemptMembers, CancellationToken
from ..core.model import FIRST_TERMINAL, STATUS_NAMES, SUCCEEDED, Attempt, StatusEvent, TaskRecord
from ..errors import EventsLagged, TaskFailed

if TYPE_CHECKING:
    from .._durable import Durable


class Session(Protocol):
    """What the handles use of their session (`session.Session`, which holds them), so that
    this module does not import it back."""

    closed: bool
    reason: str
    durable: Durable | None

    def settled(self, rec: TaskRecord) -> bool: ...
    def waiter(self, rec: TaskRecord) -> asyncio.Future[None]: ...
    def cancel(self, ref: int | str) -> bool: ...
    def drop_stream(self, st: EventStream) -> None: ...


__all__ = ["EventStream", "TaskContext", "TaskHandle"]


def _outcome(rec: TaskRecord) -> Any:
    if rec.status == SUCCEEDED:
        return rec.output
    raise TaskFailed(STATUS_NAMES[rec.status], rec.message or "", rec.id)


class TaskHandle:
    """Awaitable result of one task; await it any number of times."""

    __slots__ = ("_rec", "_session", "duplicate", "id")

    def __init__(self, session: Session, rec: TaskRecord, duplicate: bool) -> None:
        self.id = rec.id
        self.duplicate = duplicate
        self._rec = rec
        self._session = session

    def done(self) -> bool:
        """True once the task is terminal (or the scheduler shut down before it ended)."""
        return self._session.settled(self._rec) or self._session.closed

    def cancel(self) -> None:
        """Ask for cancellation without waiting (fire and forget)."""
        if not self.done():
            self._session.cancel(self.id)

    async def result(self) -> Any:
        """The executor's return value, or TaskFailed."""
        return await self

    def __await__(self) -> Generator[Any, None, Any]:
        rec = self._rec
        s = self._session
        if rec.status >= FIRST_TERMINAL and s.durable is None:
            return _outcome(rec)  # the common case, without a call
        if not s.settled(rec):
            if not s.closed:
                yield from s.waiter(rec).__await__()
            if not s.settled(rec):
                raise TaskFailed("shutdown", s.reason, rec.id)
        return _outcome(rec)

    def __repr__(self) -> str:
        return f"TaskHandle(id={self.id}, duplicate={self.duplicate})"


class TaskContext(Attempt, AttemptMembers):
    """First argument of every executor: who this attempt is, and its cancellation state.

    It is the engine's attempt record itself (the engine creates it), so handing it to the
    executor costs nothing extra. `cancellation_token()`, `tag()` and `traceparent()` are
    shared with the remote worker's `Lease` (docs/library.md, "Cancellation tokens, tags and
    traces").
    """

    # the scheduler's clock and the attempt's token, both set by `_launched` when it starts
    __slots__ = ("_clock", "_token")
    _clock: Callable[[], float]
    _token: CancellationToken

    id = property(lambda self: self.task.id)
    attempt = property(lambda self: self.number)
    kind = property(lambda self: self.task.kind)
    key = property(lambda self: self.task.key)
    pool = property(lambda self: self.task.pool)
    timeout = property(lambda self: self.task.timeout)
    deadline = property(lambda self: self.task.deadline)

    def _launched(self, clock: Callable[[], float]) -> None:
        """Arm the attempt as its executor starts (only then does it need a token)."""
        self._clock = clock
        self._token = CancellationToken()

    def _given_up(self) -> None:
        """The engine gave the attempt up: cancel its token (the launcher cancels the task)."""
        self._token._cancel()

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.task.tags or {})

    @property
    def group(self) -> dict[str, str]:
        """Labels of the worker group running this attempt ({} for unlabeled slots)."""
        return {} if self.slot is None else dict(self.slot.labels)

    def is_cancelled(self) -> bool:
        """True once the engine gave up on this attempt (cancel, timeout, lease loss, shutdown)."""
        return self.abort_reason is not None

    async def cancelled(self) -> None:
        """Return once the engine gives up on this attempt. The executor's own task is
        cancelled then too, so this serves work the executor started elsewhere."""
        await self._token.wait()

    def heartbeat(self) -> None:
        """Extend the attempt's lease (no-op without lease_ttl); safe from executor threads,
        since it only writes the lease's expiry time."""
        self.extend(self._clock())

    def __repr__(self) -> str:
        t = self.task
        key = "None" if t.key is None else f'"{t.key}"'
        return (
            f'TaskContext(id={t.id}, attempt={self.number}, pool="{t.pool}", '
            f'kind="{t.kind}", key={key})'
        )


class EventStream:
    """Status events published after the stream was made; drops the oldest when full."""

    def __init__(self, session: Session, capacity: int, raise_on_lag: bool) -> None:
        self._session = session
        self._capacity = capacity
        self._raise = raise_on_lag
        self._buf: collections.deque[StatusEvent] = collections.deque()
        self._unreported = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._ended = False
        self.lagged = 0

    @property
    def closed(self) -> bool:
        return self._closed or (self._ended and not self._buf)

    def _feed(self, events: list[StatusEvent]) -> None:
        """The session published these events (it calls this, not the user)."""
        buf = self._buf
        for ev in events:
            if len(buf) >= self._capacity:
                buf.popleft()
                self.lagged += 1
                self._unreported += 1
            buf.append(ev)
        self._wake()

    def _end(self) -> None:
        """The session ended: iteration stops once the buffered events are read."""
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def close(self) -> None:
        """Stop receiving events; iteration ends at once."""
        if not self._closed:
            self._closed = True
            self._buf.clear()
            self._session.drop_stream(self)
            self._wake()

    async def aclose(self) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[StatusEvent]:
        return self

    async def __anext__(self) -> StatusEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._raise and self._unreported:
                n, self._unreported = self._unreported, 0
                raise EventsLagged(n)
            if self._buf:
                return self._buf.popleft()
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
