"""The scheduler loop: one start()..shutdown() run of the engine on an event loop.

A `Session` calls the engine from one callback (`pump`) that fires timers, fills free slots
and carries out the resulting actions: attempts go to the launcher, finished tasks wake their
handles, events feed the streams. It keeps exactly one loop timer, for the engine's next
wake-up. With a store, `Durable` holds each turn's actions until they are written and then
hands them to `release`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .._durable import Durable
from ..core import engine as _engine
from ..core.engine import Engine
from ..core.model import FIRST_TERMINAL, Attempt, StatusEvent, TaskRecord

if TYPE_CHECKING:
    from .handles import EventStream

__all__ = ["Launcher", "Session"]


class Launcher(Protocol):
    """Where started attempts run: in-process executors (`local.LocalLauncher`) or the
    server's remote workers."""

    def bind(self, engine: Engine, kick: Callable[[], None]) -> None:
        """A session started: report outcomes to `engine`, then call `kick()`."""

    def launch(self, starts: list[Attempt]) -> None:
        """Run these attempts (their RUNNING state is durable when there is a store)."""

    def abort(self, aborts: list[Attempt]) -> None:
        """The engine gave these attempts up (timeout, cancellation, lease expiry, stop)."""

    def lost(self, reason: str) -> None:
        """The session stopped on its own (leadership lost, store failed): tell the workers."""


class Session:
    """One start()..shutdown() run: the engine, its timer, the waiters and the streams."""

    __slots__ = (
        "clock",
        "closed",
        "drains",
        "durable",
        "early",
        "engine",
        "idle",
        "launcher",
        "loop",
        "pump_due",
        "reason",
        "room",
        "streams",
        "waiters",
        "wake_at",
        "wake_handle",
    )

    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        launcher: Launcher,
        clock: Callable[[], float],
    ) -> None:
        self.engine = engine
        self.loop = loop
        self.launcher = launcher
        self.clock = clock
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.streams: list[EventStream] = []
        # pool -> (tasks wanted, future) of callers parked until the pool has room for them
        # (submitters of overflow="wait" pools, and Scheduler.room())
        self.room: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self.closed = False
        # pool -> futures of callers waiting until none of its attempts runs (Scheduler.drain)
        self.drains: dict[str, list[asyncio.Future[None]]] = {}
        self.idle: asyncio.Future[None] | None = None
        self.pump_due = False
        self.wake_handle: asyncio.TimerHandle | None = None
        self.wake_at = math.inf
        self.durable: Durable | None = None
        # The engine's list of tasks ended since its last take() and how many of them
        # `reported` has resolved already (so each report resolves only what is new).
        self.early: tuple[list[TaskRecord], int] = ([], 0)
        self.reason = "scheduler shut down"  # why unfinished handles fail once it is closed

    # --- handles and streams ---------------------------------------------------------------

    def update_event_level(self) -> None:
        """Build event objects only while a stream listens."""
        eng = self.engine
        if not self.streams:
            eng.event_level = _engine.EVENTS_NONE
        elif eng.emit_transitions:
            eng.event_level = _engine.EVENTS_ALL
        else:
            eng.event_level = _engine.EVENTS_TERMINAL

    def drop_stream(self, st: EventStream) -> None:
        if st in self.streams:
            self.streams.remove(st)
            self.update_event_level()

    def waiter(self, rec: TaskRecord) -> asyncio.Future[None]:
        fut = self.waiters.get(rec.id)
        if fut is None:
            fut = self.waiters[rec.id] = self.loop.create_future()
            d = self.durable
            if d is not None and rec.id in d.unwritten:
                d.flush(True)  # its end waited for company: now someone waits for it
        return fut

    def settled(self, rec: TaskRecord) -> bool:
        """Has the task ended, as far as anyone may see (with a store: on disk)?"""
        if rec.status < FIRST_TERMINAL:
            return False
        d = self.durable
        return d is None or d.written(rec)

    def cancel(self, ref: int | str) -> bool:
        """Cancel a live task now (a handle's cancel() cannot wait for a store's write)."""
        if self.closed:
            return False
        ok = self.engine.cancel(ref, self.clock())
        if ok:
            self.kick()
        return ok

    async def park(self, pool: str, n: int) -> None:
        """Until a turn after which `pool` has room for `n` (see apply), or the session ends."""
        entry = (n, self.loop.create_future())
        self.room.setdefault(pool, []).append(entry)
        try:
            await entry[1]
        finally:
            parked = self.room.get(pool)
            if parked is not None and entry in parked:  # cancelled: leave nothing behind
                parked.remove(entry)
                if not parked:
                    del self.room[pool]

    def close(self) -> None:
        """Wake every waiter and parked caller, stop the timer and end the streams."""
        self.closed = True
        parked = (f for fs in self.room.values() for _, f in fs)
        draining = (f for fs in self.drains.values() for f in fs)
        for fut in [*self.waiters.values(), *parked, *draining]:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()
        self.room.clear()
        self.drains.clear()
        if self.wake_handle is not None:
            self.wake_handle.cancel()
        for st in self.streams:
            st._end()

    # --- the loop --------------------------------------------------------------------------

    def kick(self) -> None:
        """Run the pump once in this loop iteration (coalesces many calls)."""
        if not self.pump_due:
            self.pump_due = True
            self.loop.call_soon(self.pump)

    def reported(self) -> None:
        """What the launcher calls after reporting to the engine: without a store, wake the
        awaiters of tasks that just ended now rather than one turn later; then pump.

        Only the tasks that ended since the previous report are looked at: a worker's reports
        arriving together would otherwise walk the turn's growing list once per report."""
        if self.waiters and self.durable is None:
            finished = self.engine.finished_since_take()
            seen, done = self.early
            if seen is not finished:  # a take() since: a fresh list
                done = 0
            if len(finished) > done:
                self.resolve(finished[done:] if done else finished)
            self.early = (finished, len(finished))
        self.kick()

    def pump(self) -> None:
        self.pump_due = False
        if self.closed:
            return
        eng = self.engine
        now = self.clock()
        eng.advance(now)
        eng.dispatch(now)
        self.apply()
        wake = eng.next_wake()
        if wake is not None and wake < self.wake_at:
            if self.wake_handle is not None:
                self.wake_handle.cancel()
            self.wake_at = wake
            self.wake_handle = self.loop.call_at(self.loop.time() + (wake - now), self._on_wake)

    def _on_wake(self) -> None:
        self.wake_handle = None
        self.wake_at = math.inf
        self.pump()

    def apply(self) -> None:
        """Carry out the engine's actions (with a store: aborts now, the rest once written)."""
        out = self.engine.take()
        if out.aborts:
            self.launcher.abort(out.aborts)
        if self.durable is not None:
            waiters = self.waiters
            urgent = bool(
                out.starts
                or (out.events and self.streams)
                or (waiters and any(rec.id in waiters for rec in out.finished))
            )
            self.durable.hold(out, urgent)
        else:
            self.release(out.starts, out.finished, out.events)
        if self.idle is not None and not self.engine.running and not self.idle.done():
            self.idle.set_result(None)
        if self.room:
            self._wake_parked()
        if self.drains:
            self._wake_drained()

    async def drained(self, pool: str) -> None:
        """Until none of `pool`'s attempts runs (at once if none does), or the session ends."""
        if self.closed or self.engine.pools[pool].busy == 0:
            return
        fut = self.loop.create_future()
        waiting = self.drains.setdefault(pool, [])
        waiting.append(fut)
        try:
            await fut
        finally:
            if self.drains.get(pool) is waiting:  # cancelled (a timeout): leave nothing behind
                waiting.remove(fut)
                if not waiting:
                    del self.drains[pool]

    def _wake_drained(self) -> None:
        pools = self.engine.pools
        for pool in [p for p in self.drains if pools[p].busy == 0]:
            for fut in self.drains.pop(pool):
                if not fut.done():
                    fut.set_result(None)

    def _wake_parked(self) -> None:
        eng = self.engine
        room = self.room
        for pool in [p for p in room if eng.has_room(p)]:
            later = []
            for n, fut in room.pop(pool):
                if fut.done():
                    continue
                if n == 1 or eng.has_room(pool, n):
                    fut.set_result(None)
                else:
                    later.append((n, fut))
            if later:
                room[pool] = later

    def release(
        self, starts: list[Attempt], finished: list[TaskRecord], events: list[StatusEvent]
    ) -> None:
        """Launch the started attempts, wake the finished tasks' awaiters, publish events."""
        if starts:
            self.launcher.launch(starts)
        if finished and self.waiters:
            self.resolve(finished)
        if events:
            for st in self.streams:
                st._feed(events)

    def resolve(self, finished: list[TaskRecord]) -> None:
        waiters = self.waiters
        for rec in finished:
            fut = waiters.pop(rec.id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
