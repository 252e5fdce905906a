"""Submit calls held by full overflow="wait" pools (docs/overflow-and-fairness.md, "On the
server").

The library parks a submitter of a full overflow="wait" pool until the pool has room; the server
holds the call the same way, with two differences: held calls are admitted in the order they
arrived (one line per pool: a call that finds others held for one of its pools queues behind
them even while there is room), and a batch is held until all of it fits.

A call that must wait takes a ticket: its place in the line of each pool it needs room in, with
how many tasks it brings to each. It goes on when it is first in every one of its lines and each
of those pools can take its tasks (`Engine.has_room(pool, n)`); until then the first of a line
waits on `Scheduler.room(pool, n)` and the others wait for their turn. `hold()` returns in the
same step as that check, so the caller admits before anything else runs. Leaving the line in any
way (admitted, deadline, the caller gone, the scheduler stopped) hands the turn on, so a held
call that is cancelled leaves neither a task nor a waiter behind.

While it is held, the call is exempt from `limits.request_timeout_s` (`exempt_request()`: the
RequestTimeout interceptor of wiring.py bounds a call with `bound_request()`); its own deadline
still applies.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar

import grpc

from cronoq.core.engine import Engine
from cronoq.errors import SchedulerError
from cronoq.runtime import Scheduler

from .errors import Refused

__all__ = ["Holds", "bound_request", "exempt_request"]

_request_timer: ContextVar[asyncio.Timeout | None] = ContextVar("request_timer", default=None)


@contextmanager
def bound_request(timer: asyncio.Timeout) -> Iterator[None]:
    """Within this block, `exempt_request()` lifts `timer` (the call's request timeout)."""
    token = _request_timer.set(timer)
    try:
        yield
    finally:
        _request_timer.reset(token)


def exempt_request() -> None:
    """Lift the request timeout of the running call, if it has one: it is being held."""
    timer = _request_timer.get()
    if timer is not None:
        timer.reschedule(None)


class _Ticket:
    __slots__ = ("need", "turn")

    def __init__(self, need: Mapping[str, int]) -> None:
        self.need = dict(need)
        self.turn: asyncio.Future[None] | None = None  # set while waiting for its turn

    def wake(self) -> None:
        if self.turn is not None and not self.turn.done():
            self.turn.set_result(None)


class Holds:
    """The lines of held calls, one per pool, of one scheduler (across its sessions)."""

    def __init__(self, sched: Scheduler) -> None:
        self._sched = sched
        self._lines: dict[str, deque[_Ticket]] = {}

    def held(self, pool: str) -> int:
        """Calls held for `pool` now."""
        line = self._lines.get(pool)
        return 0 if line is None else len(line)

    def must_hold(self, engine: Engine, need: Mapping[str, int]) -> bool:
        """Must a call bringing `need` (pool -> new tasks, overflow="wait" pools only) wait?"""
        return any(p in self._lines or not engine.has_room(p, n) for p, n in need.items())

    async def hold(self, engine: Engine, need: Mapping[str, int]) -> None:
        """Wait in line until every pool of `need` can take its tasks; admit right after, with
        no `await` in between. UNAVAILABLE if `engine`'s session ends meanwhile."""
        ticket = _Ticket(need)
        for pool in ticket.need:
            self._lines.setdefault(pool, deque()).append(ticket)
        try:
            while True:
                self._check_serving(engine)
                if any(self._lines[p][0] is not ticket for p in ticket.need):
                    ticket.turn = asyncio.get_running_loop().create_future()
                    await ticket.turn
                    continue
                full = [(p, n) for p, n in ticket.need.items() if not engine.has_room(p, n)]
                if not full:
                    return
                pool, n = full[0]
                # (raises once the session is gone: the check above says so)
                with suppress(RuntimeError, SchedulerError):
                    await self._sched.room(pool, n)
        finally:
            self._leave(ticket)

    def _check_serving(self, engine: Engine) -> None:
        try:
            current = self._sched.serving()
        except (RuntimeError, SchedulerError):
            current = None
        if current is not engine:
            raise Refused(grpc.StatusCode.UNAVAILABLE, "scheduler stopped while the call was held")

    def _leave(self, ticket: _Ticket) -> None:
        for pool in ticket.need:
            line = self._lines[pool]
            first = line[0] is ticket
            line.remove(ticket)
            if not line:
                del self._lines[pool]
            elif first:
                line[0].wake()
