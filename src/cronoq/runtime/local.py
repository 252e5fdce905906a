"""The two launchers a `Scheduler` drives: its pools' executors in this process, or an outside
launcher (the server's remote workers).

Both offer what the scheduler needs beyond the `Launcher` seam, so that it never asks which
one it has: `elastic` (whether the engine sizes the pools itself) and `running()` (what a
shutdown gives a moment to unwind after cancelling it).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable, Mapping
from typing import Any, cast

from .._tracing import ATTR_ATTEMPT, ATTR_KIND, ATTR_POOL, ATTR_PRIORITY, ATTR_TASK_ID, Traced
from ..core.engine import Engine
from ..core.model import Attempt
from ..core.state import attempt_outcome
from ..core.vocab import PRIORITY_NAMES
from ..errors import Permanent, Retryable
from .handles import TaskContext
from .session import Launcher

__all__ = ["LocalLauncher", "OutsideLauncher"]

SELF_CANCELLED = "CancelledError: raised by the executor, not by cronoq"

# pool -> (executor, whether it is an `async def`)
Executors = Mapping[str, tuple[Callable[..., Any], bool]]


class LocalLauncher:
    """Runs each attempt as an asyncio task calling its pool's executor, and turns the
    executor's outcome into one `complete`/`fail` call. The engine builds its attempts as
    `TaskContext`s (`attempt_class`), the object each executor gets."""

    elastic = True  # in-process slots are the pools' own: the autoscaler sets them
    traced: Traced | None = None  # the session's tracing (Scheduler), when on

    def __init__(self, executors: Executors, clock: Callable[[], float]) -> None:
        self._executors = executors
        self._clock = clock
        self._engine: Engine | None = None
        self._kick: Callable[[], None] = lambda: None
        self._tasks: dict[int, asyncio.Future[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, engine: Engine, kick: Callable[[], None]) -> None:
        """A session started on the running loop: its attempts run there."""
        self._engine = engine
        self._kick = kick
        self._tasks = {}  # an earlier session's attempts keep (and empty) their own
        self._loop = asyncio.get_running_loop()

    def launch(self, starts: list[Attempt]) -> None:
        assert self._loop is not None
        create_task = self._loop.create_task
        tasks = self._tasks
        executors = self._executors
        run = self._run if self.traced is None else self._traced_run
        clock = self._clock
        for att in cast("list[TaskContext]", starts):
            if not att.ended:  # with a store, it may have been aborted while being written
                att._launched(clock)
                tasks[att.lease] = create_task(run(att, *executors[att.task.pool]))

    def abort(self, aborts: list[Attempt]) -> None:
        """Cancel the attempts' tokens and executors."""
        tasks = self._tasks
        for att in cast("list[TaskContext]", aborts):
            t = tasks.pop(att.lease, None)
            if t is not None:  # launched, so it has its token
                att._given_up()
                t.cancel()

    def lost(self, reason: str) -> None:
        """Nobody to tell: the aborts already cancelled every executor."""

    def running(self) -> list[asyncio.Future[Any]]:
        return list(self._tasks.values())

    async def _traced_run(
        self, att: TaskContext, executor: Callable[..., Any], is_async: bool
    ) -> bool:
        """`_run` inside the attempt's `cronoq.run` span (after its `cronoq.queue_wait` one),
        linked to its dependencies' traces."""
        traced = self.traced
        assert traced is not None and self._engine is not None
        rec = att.task
        attrs = {
            ATTR_TASK_ID: rec.id,
            ATTR_KIND: rec.kind,
            ATTR_POOL: rec.pool,
            ATTR_PRIORITY: PRIORITY_NAMES[rec.cls],
            ATTR_ATTEMPT: att.number,
        }
        start = int(att.started_at * 1e9)
        tags = rec.tags
        traced.queued(tags, attrs, int(rec.ready_at * 1e9), start)
        deps = None if rec.extra is None else rec.extra.deps
        links = None
        if deps:
            lookup = self._engine.lookup
            links = [p.tags for p in map(lookup, (ref for ref, _ in deps)) if p and p.tags]
        with traced.run(tags, attrs, start, links) as span:
            ok = await self._run(att, executor, is_async)
            traced.ended(span, attempt_outcome(att, ok), rec.message)
        return ok

    async def _run(self, att: TaskContext, executor: Callable[..., Any], is_async: bool) -> bool:
        """Run one attempt and report its outcome (calling the executor here means an attempt
        aborted before its first step never creates the executor's coroutine); True if the
        executor returned."""
        # the first step runs in the session that launched the attempt: keep its engine
        eng, tasks, kick, loop = self._engine, self._tasks, self._kick, self._loop
        assert eng is not None and loop is not None
        ok = False
        try:
            if is_async:
                result = await executor(att, att.task.payload)
            else:
                # (in the caller's context: its span is the parent of the executor's)
                run = contextvars.copy_context().run
                result = await loop.run_in_executor(None, run, executor, att, att.task.payload)
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError:
            if att.ended:  # we cancelled it: nothing to report
                return False
            eng.fail(att, self._clock(), SELF_CANCELLED)
        except Permanent as e:
            eng.fail(att, self._clock(), e.message, permanent=True)
        except Retryable as e:
            eng.fail(att, self._clock(), e.message, retry_after=e.retry_after)
        except Exception as e:
            eng.fail(att, self._clock(), f"{type(e).__name__}: {e}")
        else:
            eng.complete(att, self._clock(), result)
            ok = True
        finally:
            tasks.pop(att.lease, None)
        kick()
        return ok


class OutsideLauncher:
    """An outside `Launcher` as the scheduler drives it: its workers bring the pools' slots
    (each pool starts with none), and nothing of it runs in this process."""

    elastic = False

    def __init__(self, inner: Launcher, clock: Callable[[], float]) -> None:
        self._inner = inner
        self._clock = clock
        self.abort = inner.abort
        self.lost = inner.lost

    def bind(self, engine: Engine, kick: Callable[[], None]) -> None:
        now = self._clock()
        for name in engine.configs:
            engine.set_capacity(name, 0, now)
        self._inner.bind(engine, kick)

    def launch(self, starts: list[Attempt]) -> None:
        self._inner.launch([att for att in starts if not att.ended])

    def running(self) -> list[asyncio.Future[Any]]:
        return []
