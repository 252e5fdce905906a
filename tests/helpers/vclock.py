"""A virtual-time asyncio event loop (the idea of trio's MockClock with autojump).

`VirtualEventLoop.time()` is virtual. Whenever the loop would block waiting for its next timer,
with no callback ready, no I/O ready and no executor job running, it jumps its time to that
timer instead of sleeping: `await asyncio.sleep(3600)` returns at once in real time with
`loop.time()` 3600 s later, and a 0.1 s backoff takes exactly 0.1 virtual seconds, however busy
the machine is.

Real work is waited for in real time: while a `run_in_executor` job (`asyncio.to_thread`
included) runs, the loop blocks in its selector as a normal loop does and its time advances
by the real time it waited, so a timer set during the job fires about when it would on a real
loop. Sockets the loop watches are polled before each jump, but a jump does not wait for a
reply that has not arrived yet: code that waits on a server, a subprocess or a thread the loop
does not know about (`call_soon_threadsafe` from a foreign thread) belongs on a real loop.

`run_virtual(coro)` runs a coroutine on a fresh virtual loop; `LoopClock()` is a scheduler
clock consistent with whatever loop runs it (EPOCH + loop.time()). Tests opt in with the
`virtual_time` marker (see tests/integration/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

# Virtual Unix time 0 of loop time 0: 2023-11-14 22:13:20 UTC, a round, recent, fixed instant.
EPOCH = 1_700_000_000.0


class _JumpingSelector(selectors.BaseSelector):
    """The real selector, with `select` replaced by the autojump rule."""

    def __init__(self, loop: VirtualEventLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        loop = self._loop
        if timeout is not None and loop.autojump and loop.executor_jobs == 0:
            loop.advance(timeout)  # nothing else can happen before the next timer
            loop.jumped += timeout
            return []
        # No timer to jump to (only another thread can wake us), or real work in flight:
        # wait for real, the loop's time running at the real rate meanwhile.
        loop.follow_real_time(True)
        try:
            return self._real.select(timeout)
        finally:
            loop.follow_real_time(False)


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is virtual and jumps to the next timer when idle."""

    def __init__(self, *, start: float = 0.0, autojump: bool = True) -> None:
        # (virtual time, monotonic time it started following the real clock, or None):
        # one tuple, replaced whole, so that other threads (heartbeats) read it consistently
        self._base: tuple[float, float | None] = (float(start), None)
        self.autojump = autojump
        self._jobs = 0
        self._jobs_lock = threading.Lock()
        self.jumped = 0.0  # virtual seconds skipped without waiting (for tests of the loop)
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        vt, since = self._base
        return vt if since is None else vt + (time.monotonic() - since)

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (also usable by a test to let time pass at once)."""
        if seconds < 0:
            raise ValueError("virtual time only moves forward")
        following = self._base[1] is not None
        self._base = (self.time() + seconds, time.monotonic() if following else None)

    def follow_real_time(self, on: bool) -> None:
        """While on, the loop's time advances with the real clock (a real wait)."""
        now = self.time()
        self._base = (now, time.monotonic() if on else None)

    def run_in_executor(
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        # A job counts until both its thread has returned and its future is done. The future
        # alone is not enough: one cancelled (an attempt aborted by its timeout) leaves the
        # thread running on. The thread alone is not enough either: its result reaches the
        # loop a moment after it returns, and a jump in between could fire a timeout first.
        lock = self._jobs_lock
        ends = {"thread": False, "future": False}
        with lock:
            self._jobs += 1

        def end(side: str) -> None:
            with lock:
                ends[side] = True
                if ends["thread"] and ends["future"]:
                    ends["thread"] = ends["future"] = False  # counted once
                    self._jobs -= 1

        def job() -> T:
            try:
                return func(*args)
            finally:
                end("thread")
                with contextlib.suppress(RuntimeError):  # the loop may be closed by now
                    self.call_soon_threadsafe(_nothing)  # wake the selector to jump again

        def future_done(fut: asyncio.Future[T]) -> None:
            if fut.cancelled() and not started.is_set():
                end("thread")  # cancelled before its thread began: it never runs
            end("future")

        started = threading.Event()

        def starting() -> T:
            started.set()
            return job()

        fut = super().run_in_executor(executor, starting)
        fut.add_done_callback(future_done)
        return fut

    @property
    def executor_jobs(self) -> int:
        """run_in_executor jobs whose thread has not returned yet."""
        return self._jobs


def _nothing() -> None:
    pass


def new_virtual_loop() -> VirtualEventLoop:
    return VirtualEventLoop()


def run_virtual(coro: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run `coro` to completion on a fresh virtual-time loop (like asyncio.run)."""
    with asyncio.Runner(debug=debug, loop_factory=new_virtual_loop) as runner:
        return runner.run(coro)


class LoopClock:
    """A scheduler clock (Unix seconds) that moves with the event loop's time: `epoch` (EPOCH
    by default) plus the `time()` of the loop it is read on. On a virtual loop it is virtual;
    on a normal loop it advances like time.time. Read from another thread (an executor's
    heartbeat), it uses the loop it was last read on."""

    __slots__ = ("_loop", "epoch")

    def __init__(
        self, loop: asyncio.AbstractEventLoop | None = None, *, epoch: float = EPOCH
    ) -> None:
        self._loop = loop
        self.epoch = epoch

    def __call__(self) -> float:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is None:
                raise RuntimeError("LoopClock read outside a running loop before any") from None
        return self.epoch + self._loop.time()


def vtime() -> float:
    """The running loop's time (virtual seconds on a virtual loop)."""
    return asyncio.get_running_loop().time()
