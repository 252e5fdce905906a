"""The store seam: what the durable driver (`cronoq._durable`) asks of any store, and the
store-neutral values it exchanges with one (docs/durability.md, "Stores").

A store keeps the task rows, the recurring schedules, the pools an operator paused and one
leader record (epoch, holder, lease expiry, highest task id issued). `SqliteStore`,
`PostgresStore` and `MemoryStore` implement `Store`, each reusing `Batch`, `Stored`, `Finished`,
`LeadershipLost`, the column order `TASK_COLUMNS` and the time helpers below.

The rows are tuples whose order is `TASK_COLUMNS` (built by `store.rows`): a store moves them,
it never interprets a payload or an output (bytes the scheduler's codec made).
"""

from __future__ import annotations

import asyncio
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from ..errors import SchedulerError

__all__ = [
    "COLUMN",
    "DONE_CHANGE",
    "FENCED",
    "TASK_COLUMNS",
    "Batch",
    "Finished",
    "LIVE_CHANGE",
    "LeadershipLost",
    "QueuedStore",
    "Store",
    "SHARD_SHIFT",
    "SIGN",
    "Stored",
    "check_store",
    "first_id",
    "from_ns",
    "signed",
    "to_ns",
    "unsigned",
]

FENCED = "fenced: leadership lost"

# The columns of a task row, in the order of every row a store takes or gives back.
TASK_COLUMNS = (
    "id, seq, arrival, pool, kind, priority, key, payload, deadline, fixed_start, tolerance, "
    "on_miss, duration_hint, timeout, retry, deps, resources, tags, labels, tenant, status, "
    "terminal, attempt, updated, message, output, eligible, not_before, started, worker, attempts"
)
# column name -> its index in a task row
COLUMN: dict[str, int] = {name: i for i, name in enumerate(TASK_COLUMNS.split(", "))}
# The columns a change row of Batch.updates (a live task) and of Batch.finishes (a task that
# ended: its row becomes terminal) sets, in order; the task id follows them. `worker` (the
# latest attempt's, JSON [name, id]) and `attempts` (the earlier ones, JSON) are NULL for a
# task no remote worker ran that never retried.
LIVE_CHANGE = (
    "status",
    "attempt",
    "message",
    "eligible",
    "not_before",
    "started",
    "worker",
    "attempts",
)
DONE_CHANGE = (
    "status",
    "attempt",
    "updated",
    "message",
    "output",
    "key",
    "started",
    "worker",
    "attempts",
)


class LeadershipLost(SchedulerError):
    """Another process holds the store's leadership now: stop writing and stand down."""

    def __init__(self, message: str = FENCED) -> None:
        super().__init__(message)


@dataclass
class Batch:
    """One group of changes, written in one transaction (all of it or nothing).

    `inserts` are full task rows (TASK_COLUMNS order); `updates` are changes of live tasks
    (the LIVE_CHANGE columns, then the id); `finishes` are tasks that became terminal (the
    DONE_CHANGE columns, then the id; see rows.update_row);
    `schedules` are recurring rows `(name, spec, template_payload, next_unix_ns, last_task_id)`
    to insert or replace by name; `removed_schedules` names to delete; `pools` are
    `(name, paused)` pairs to insert or replace by name; `deletes` ids of ended tasks to forget
    (deleted after everything else of the batch, a live task's row never); `max_id` the highest
    task id issued so far (the store keeps the high-water mark: max of what it has and this)."""

    inserts: list[tuple[Any, ...]] = field(default_factory=list)
    updates: list[tuple[Any, ...]] = field(default_factory=list)
    finishes: list[tuple[Any, ...]] = field(default_factory=list)
    schedules: list[tuple[Any, ...]] = field(default_factory=list)
    removed_schedules: list[str] = field(default_factory=list)
    pools: list[tuple[str, bool]] = field(default_factory=list)
    deletes: list[int] = field(default_factory=list)
    max_id: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.inserts
            or self.updates
            or self.finishes
            or self.schedules
            or self.removed_schedules
            or self.pools
            or self.deletes
        )


@dataclass
class Stored:
    """What `load()` returns: task rows (TASK_COLUMNS order, by id), schedule rows, the highest
    id issued and the names of the pools paused (in no particular order)."""

    tasks: list[tuple[Any, ...]]
    schedules: list[tuple[Any, ...]]
    max_id: int
    paused: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finished:
    """A finished task as stored: its full row (TASK_COLUMNS order), with a few columns named."""

    row: tuple[Any, ...]

    @property
    def id(self) -> int:
        return int(self.row[COLUMN["id"]])

    @property
    def status(self) -> str:
        """The terminal status name ("succeeded", "failed", ...)."""
        return str(self.row[COLUMN["status"]])

    @property
    def attempt(self) -> int:
        return int(self.row[COLUMN["attempt"]])

    @property
    def message(self) -> str | None:
        message: str | None = self.row[COLUMN["message"]]
        return message

    @property
    def output(self) -> bytes | None:
        """The encoded result of a succeeded task (None otherwise, or if it was not stored)."""
        output: bytes | None = self.row[COLUMN["output"]]
        return output

    @property
    def finished_ns(self) -> int:
        """When it ended (Unix ns)."""
        return int(self.row[COLUMN["updated"]])


@runtime_checkable
class Store(Protocol):
    """What the durable driver needs of a store. The driver calls one method at a time per
    store, from one event loop, in this order: `open`, `lead`, `load`, then `commit_nowait`,
    `renew`, `prune` and `finished` while it leads, and `close` once at the end.

    Guarantees a store must give (docs/durability.md, "Stores"):

    * `commit_nowait(batch)` writes the whole batch or nothing, in the order the batches were
      given, and in the same transaction first checks that this handle still holds the
      leadership it got from `lead()` (the epoch is the fencing token): if not, nothing is
      written and the future fails with `LeadershipLost`. A commit also renews the lease.
    * Once a commit's future succeeded, the batch survives this process (and, as far as the
      store promises it, the machine).
    * `lead()` returns a new epoch, greater than every epoch before it on this store, only
      while no other handle holds an unexpired lease.
    """

    @property
    def retention(self) -> float:
        """Seconds a finished row is kept before `prune` may delete it."""
        ...

    @property
    def lease_renew(self) -> float:
        """Seconds between the driver's renewals while idle; shorter than the lease."""
        ...

    async def open(self) -> None:
        """Connect; check (create, migrate) the store's schema. Raises SchedulerError for a
        store that cannot be used, and then leaves it as it was."""
        ...

    async def lead(self) -> int:
        """Wait until this handle holds the leadership lease; return the new epoch. Task ids
        of this leadership are `epoch << 48 | n` (`first_id`)."""
        ...

    async def load(self) -> Stored:
        """Everything the previous leaders left: task rows, schedules, the highest id issued."""
        ...

    def commit_nowait(self, batch: Batch) -> asyncio.Future[None]:
        """Start writing one batch now (the event loop goes on meanwhile); the future ends
        once it is committed, with LeadershipLost if fenced or the store's error."""
        ...

    async def renew(self) -> None:
        """Extend the lease without writing anything else (fenced like a commit)."""
        ...

    async def prune(self, now: float) -> int:
        """Delete finished rows that ended before `now - retention` (Unix seconds), except
        finished parents of blocked tasks; fenced; returns how many it deleted."""
        ...

    async def finished(self, task_id: int) -> Finished | None:
        """The stored row of a finished task (with its output), None if the store has no such
        task, the task is live, or its row was pruned. A read: it needs no leadership."""
        ...

    async def close(self, release: bool = True) -> None:
        """Close; with `release`, give the lease up so a standby takes over at once. Closing a
        closed store does nothing; a closed store may be opened again."""
        ...


# What check_store looks for: (name, must be callable).
_MEMBERS = (
    ("open", True),
    ("lead", True),
    ("load", True),
    ("commit_nowait", True),
    ("renew", True),
    ("prune", True),
    ("finished", True),
    ("close", True),
    ("retention", False),
    ("lease_renew", False),
)


def check_store(store: object) -> Store:
    """`store` if it has everything `Store` names; TypeError naming what it lacks otherwise."""
    missing = []
    for name, method in _MEMBERS:
        value = getattr(store, name, None)
        if value is None or (method and not callable(value)):
            missing.append(f"{name}()" if method else name)
    if missing:
        raise TypeError(
            "store must implement cronoq.store.Store, like cronoq.SqliteStore "
            f"(got {type(store).__name__} without {', '.join(missing)})"
        )
    assert isinstance(store, Store)
    return store


def to_ns(t: float) -> int:
    """Unix seconds to Unix nanoseconds (how stores keep times)."""
    return int(t * 1e9)


def from_ns(ns: int) -> float:
    return ns / 1e9


def first_id(epoch: int, shard: int | None = None) -> int:
    """The first task id of a leadership epoch (docs/sharding.md, "Task ids"): epoch << 48 | 1,
    or with a shard number S, S << 56 | epoch << 40 | 1 (`id >> 56` names the shard)."""
    if shard is None:
        return epoch << 48 | 1
    return shard << SHARD_SHIFT | epoch << 40 | 1


SHARD_SHIFT = 56  # a sharded task id's top 8 bits are its shard's number
SIGN = 1 << 63  # ids are unsigned 64-bit; shards numbered 128-255 issue ids from here on
_WRAP = 1 << 64


def signed(task_id: int) -> int:
    """An unsigned 64-bit id as a signed 64-bit integer column keeps it (two's complement):
    ids below SIGN, every unsharded one included, are stored as themselves."""
    return task_id - _WRAP if task_id >= SIGN else task_id


def unsigned(value: int) -> int:
    """The id a signed 64-bit column value stands for (`signed`'s inverse)."""
    return value + _WRAP if value < 0 else value


T = TypeVar("T")


class QueuedStore(ABC):
    """The Store methods of a store that carries out its operations one at a time, in order,
    away from the caller (SqliteStore on a thread of its own, MemoryStore on a later loop
    turn): each async method queues the matching operation with `_submit` and awaits it."""

    epoch: int
    retention: float
    lock_poll: float

    @abstractmethod
    def _submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue fn(*args); the future ends with its result or its error."""

    @abstractmethod
    def _try_lead(self) -> int | None:
        """Take the leadership if it is free (a new epoch), else None."""

    @abstractmethod
    def _load(self) -> Stored: ...

    @abstractmethod
    def _commit(self, batch: Batch) -> None:
        """Write the batch whole, fenced, renewing the lease (an empty batch only renews)."""

    @abstractmethod
    def _prune(self, before_ns: int) -> int: ...

    @abstractmethod
    def _finished(self, task_id: int) -> Finished | None: ...

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        result: T = await self._submit(fn, *args)
        return result

    async def lead(self) -> int:
        """Wait until this process holds the lease (a standby polls every lock_poll seconds);
        returns the new epoch. Task ids of this leadership are `epoch << 48 | n`."""
        while True:
            epoch = await self._call(self._try_lead)
            if epoch is not None:
                self.epoch = epoch
                return epoch
            await asyncio.sleep(self.lock_poll)

    async def load(self) -> Stored:
        return await self._call(self._load)

    def commit_nowait(self, batch: Batch) -> asyncio.Future[None]:
        """Queue one group for writing in one transaction (renewing the lease) at once; the
        future ends when it is committed, with LeadershipLost if fenced."""
        return self._submit(self._commit, batch)

    async def renew(self) -> None:
        await self._call(self._commit, Batch())

    async def prune(self, now: float) -> int:
        """Delete terminal rows that ended more than `retention` seconds ago (none when it is
        infinite)."""
        if math.isinf(self.retention):
            return 0
        return await self._call(self._prune, to_ns(now - self.retention))

    async def finished(self, task_id: int) -> Finished | None:
        """The stored row of a finished task, output included (None: unknown, live, pruned)."""
        return await self._call(self._finished, task_id)
