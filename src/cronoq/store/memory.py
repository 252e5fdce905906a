"""MemoryStore: a `Store` that keeps its committed state in memory, for tests.

A `MemoryState` plays the database: the task rows, the schedules, the paused pools and the
leader record (epoch, holder, lease expiry, highest id issued). Each `MemoryStore` is one
process's handle on it, so two handles on one state behave like two processes on one SQLite
file: one leads, the other waits in `lead()` until the lease is released or runs out, and a
deposed leader's commits fail with `LeadershipLost` without writing anything.

Nothing is written synchronously: like `SqliteStore`, which writes on its own thread, every call
is queued and carried out, in order, on a later turn of the event loop. That makes what is
acknowledged and what is not observable:

* `pause()` holds the queue (a stalled disk): commits wait and nothing is written until
  `resume()`;
* `crash()` is the process dying: what is queued is dropped, never written (its futures fail
  with SchedulerError, so the dead scheduler stops instead of hanging), every later call but
  `close()` fails, and the lease stays with the dead handle until it runs out. A new
  `MemoryStore` on the same state then recovers exactly what was committed.

The lease's clock is the state's `clock` (default `time.time`): tests on a virtual-time loop
pass one that follows the loop so that waiting for a lease takes no real time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import SchedulerError
from .base import (
    COLUMN,
    DONE_CHANGE,
    LIVE_CHANGE,
    TASK_COLUMNS,
    Batch,
    Finished,
    LeadershipLost,
    QueuedStore,
    Stored,
)

__all__ = ["MemoryState", "MemoryStore"]


_WIDTH = len(TASK_COLUMNS.split(", "))
_ID = COLUMN["id"]
_KEY = COLUMN["key"]
_DEPS = COLUMN["deps"]
_STATUS = COLUMN["status"]
_TERMINAL = COLUMN["terminal"]
_UPDATED = COLUMN["updated"]
_LIVE = tuple(COLUMN[c] for c in LIVE_CHANGE)  # Batch.updates
_DONE = tuple(COLUMN[c] for c in DONE_CHANGE)  # Batch.finishes (terminal becomes 1)

_handles = itertools.count(1)


class MemoryState:
    """What every handle on one in-memory store shares: the committed state."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # Unix seconds, for the leader's lease
        self.tasks: dict[int, tuple[Any, ...]] = {}  # id -> row (TASK_COLUMNS order)
        self.schedules: dict[str, tuple[Any, ...]] = {}  # name -> recurring row
        self.pools: dict[str, bool] = {}  # name -> paused
        self.epoch = 0
        self.holder: str | None = None
        self.expires = 0.0  # the holder's lease expiry (Unix seconds)
        self.max_id = 0
        self.commits = 0  # transactions that wrote (renewals included)

    def __repr__(self) -> str:
        return (
            f"MemoryState(tasks={len(self.tasks)}, schedules={len(self.schedules)}, "
            f"epoch={self.epoch}, holder={self.holder!r})"
        )


def _seconds(name: str, value: object, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds (got {value!r})")
    v = float(value)
    if math.isnan(v) or v < 0 or (v == 0 and not zero) or (math.isinf(v) and not zero):
        raise ValueError(f"{name} must be a finite number of seconds > 0 (got {value!r})")
    return v


class MemoryStore(QueuedStore):
    """One handle (one "process") on a `MemoryState`; a new state if none is given."""

    def __init__(
        self,
        state: MemoryState | None = None,
        *,
        lease_ttl: float = 10.0,
        lease_renew: float = 2.0,
        lock_poll: float = 0.05,
        retention: float = 3600.0,
    ) -> None:
        self.state = MemoryState() if state is None else state
        self.lease_ttl = _seconds("lease_ttl", lease_ttl)
        self.lease_renew = _seconds("lease_renew", lease_renew)
        if self.lease_renew >= self.lease_ttl:
            raise ValueError("lease_renew must be > 0 and shorter than lease_ttl")
        self.lock_poll = _seconds("lock_poll", lock_poll)
        self.retention = _seconds("retention", retention, zero=True)
        self.holder = f"memory:{next(_handles)}"
        self.epoch = 0
        self.opened = False
        self.crashed = False
        self.paused = False
        self._expires = 0.0  # our lease's expiry as last written
        self._jobs: deque[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]]
        self._jobs = deque()
        self._due: asyncio.Handle | None = None  # the queued run of the jobs

    def __repr__(self) -> str:
        return f"MemoryStore(holder={self.holder!r}, epoch={self.epoch}, state={self.state!r})"

    # --- the Store protocol ------------------------------------------------------------------

    async def open(self) -> None:
        await self._call(self._open)

    async def close(self, release: bool = True) -> None:
        if self.crashed or not self.opened:
            return
        await self._call(self._close, release)

    # --- for tests ---------------------------------------------------------------------------

    def pause(self) -> None:
        """Hold every call from now on (a stalled disk) until resume()."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._schedule()

    def crash(self) -> None:
        """The process dies: drop what is not written, keep the lease, refuse every call."""
        self.crashed = True
        self.paused = False
        if self._due is not None:
            self._due.cancel()
            self._due = None
        jobs, self._jobs = self._jobs, deque()
        for _fn, _args, fut in jobs:
            if not fut.done():
                fut.set_exception(self._dead())

    # --- the queue ---------------------------------------------------------------------------

    def _dead(self) -> SchedulerError:
        return SchedulerError(f"store {self.holder}: crashed (simulated)")

    def _submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        if not self.opened and not self.crashed and fn != self._open:
            raise SchedulerError(f"store {self.holder}: not open")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.crashed:  # a failed future, not a raise: the caller learns it like a failed write
            fut.set_exception(self._dead())
            return fut
        self._jobs.append((fn, args, fut))
        self._schedule()
        return fut

    def _schedule(self) -> None:
        if self._due is None and self._jobs and not self.paused and not self.crashed:
            self._due = asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        """Carry out the queued calls in order (each is all or nothing)."""
        self._due = None
        jobs = self._jobs
        while jobs and not self.paused and not self.crashed:
            fn, args, fut = jobs.popleft()
            try:
                result, error = fn(*args), None
            except Exception as e:
                result, error = None, e
            if fut.done():
                continue
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    # --- the calls, carried out --------------------------------------------------------------

    def _open(self) -> None:
        self.opened = True

    def _try_lead(self) -> int | None:
        st = self.state
        now = st.clock()
        if st.holder is not None and st.expires > now:
            return None
        st.epoch += 1
        st.holder = self.holder
        st.expires = self._expires = now + self.lease_ttl
        return st.epoch

    def _load(self) -> Stored:
        st = self.state
        return Stored(
            [st.tasks[i] for i in sorted(st.tasks)],
            list(st.schedules.values()),
            st.max_id,
            [name for name, paused in st.pools.items() if paused],
        )

    def _fence(self, now: float) -> None:
        """Raise LeadershipLost unless this handle's lease is the state's and unexpired."""
        st = self.state
        if now > self._expires or st.epoch != self.epoch or st.holder != self.holder:
            raise LeadershipLost()

    def _commit(self, batch: Batch) -> None:
        st = self.state
        now = st.clock()
        self._fence(now)
        tasks = st.tasks
        # Check everything before changing anything: a batch is written whole or not at all.
        new_ids = set()
        for row in batch.inserts:
            if len(row) != _WIDTH:
                raise ValueError(f"a task row has {_WIDTH} columns (got {len(row)})")
            if row[_ID] in tasks or row[_ID] in new_ids:
                raise ValueError(f"UNIQUE constraint failed: task id {row[_ID]}")
            new_ids.add(row[_ID])
        for rows, width in ((batch.updates, len(_LIVE) + 1), (batch.finishes, len(_DONE) + 1)):
            for row in rows:
                if len(row) != width:
                    raise ValueError(f"a change row has {width} columns (got {len(row)})")
        for sched in batch.schedules:
            if len(sched) != 5:
                raise ValueError(f"a schedule row has 5 columns (got {len(sched)})")
        for row in batch.inserts:
            tasks[row[_ID]] = tuple(row)
        for cols, changes, terminal in (
            (_LIVE, batch.updates, False),
            (_DONE, batch.finishes, True),
        ):
            for change in changes:
                old = tasks.get(change[-1])
                if old is None:
                    continue  # like an UPDATE that matches no row
                values = list(old)
                for col, value in zip(cols, change[:-1], strict=True):
                    values[col] = value
                if terminal:
                    values[_TERMINAL] = 1
                tasks[change[-1]] = tuple(values)
        for sched in batch.schedules:
            st.schedules[sched[0]] = tuple(sched)
        for name in batch.removed_schedules:
            st.schedules.pop(name, None)
        st.pools.update(batch.pools)
        for tid in batch.deletes:  # last: a task may end and be deleted in one batch
            if tid in tasks and tasks[tid][_TERMINAL] == 1:
                del tasks[tid]
        st.max_id = max(st.max_id, batch.max_id)
        st.expires = self._expires = now + self.lease_ttl
        st.commits += 1

    def _prune(self, before_ns: int) -> int:
        st = self.state
        now = st.clock()
        self._fence(now)
        parents: set[Any] = set()  # what blocked tasks wait for, by id or key
        for row in st.tasks.values():
            if row[_STATUS] == "blocked" and row[_DEPS]:
                parents.update(edge[0] for edge in json.loads(row[_DEPS]))
        old = [
            tid
            for tid, row in st.tasks.items()
            if row[_TERMINAL] == 1
            and row[_UPDATED] < before_ns
            and tid not in parents
            and (row[_KEY] is None or row[_KEY] not in parents)
        ]
        for tid in old:
            del st.tasks[tid]
        return len(old)

    def _finished(self, task_id: int) -> Finished | None:
        row = self.state.tasks.get(task_id)
        return None if row is None or row[_TERMINAL] != 1 else Finished(row)

    def _close(self, release: bool) -> None:
        st = self.state
        if release and self.epoch and st.epoch == self.epoch and st.holder == self.holder:
            st.holder = None
            st.expires = 0.0
        self.epoch = 0
        self.opened = False
