"""The asyncio driver: runs the engine core on an event loop and executors as asyncio tasks.

The driver owns time and I/O; every scheduling rule lives in `cronoq.core.engine`. It calls
the engine from one callback (`_pump`) that fires timers, fills free slots and carries out the
resulting actions, and it keeps exactly one loop timer for the engine's next wake-up. Executors
run inside `_run_attempt`, which turns their outcome into one `complete`/`fail` call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping, Sequence
from enum import Enum
from types import TracebackType
from typing import Any, Protocol, cast

from ._attempt import AttemptMembers, CancellationToken
from ._durable import Durable, encode_payload
from ._lifecycle import Lifecycle, table
from ._options import Pool, Resource, Task, build_task
from .core import engine as _engine
from .core.cron import CronError, parse_cron, zone
from .core.engine import Engine
from .core.model import (
    FIRST_TERMINAL,
    STATUS_NAMES,
    SUCCEEDED,
    Attempt,
    Snapshot,
    StatusEvent,
    TaskRecord,
    check_seconds,
)
from .core.recurring import Recurring
from .errors import (
    EventsLagged,
    Permanent,
    Retryable,
    SchedulerError,
    SubmitError,
    TaskFailed,
)
from .store.base import SHARD_SHIFT, Store, Stored, check_store, first_id
from .store.codec import Codec, JsonCodec, check_codec
from .store.rows import record_from_row

__all__ = ["EventStream", "Scheduler", "TaskContext", "TaskHandle"]

log = logging.getLogger("cronoq")

_NOT_STARTED = "scheduler not started; call `await scheduler.start()` first"
_LOOP_CLOSED = (
    "the scheduler stopped because its asyncio event loop was closed "
    "(call start() again on a running loop)"
)
_SELF_CANCELLED = "CancelledError: raised by the executor, not by cronoq"
_SHUTDOWN = "scheduler shut down"
_OVERLAPS = ("skip", "allow", "queue", "queue_on_success")
# submit() options a recurring schedule's template may carry (no deps, fixed start or deadline_at)
_RECURRING_OPTIONS = frozenset(
    {"priority", "pool", "kind", "key", "duration_hint", "timeout", "retry", "resources", "tags"}
    | {"labels", "tenant"}
)


class SchedulerState(Enum):
    """A scheduler's life cycle (docs/library.md, "Life cycle")."""

    NEW = "new"  # built, never started
    STARTING = "starting"  # start(): opening the store, waiting for the leadership, recovering
    RUNNING = "running"  # a session runs
    STOPPING = "stopping"  # shutdown(): no admissions, running attempts get their grace
    STOPPED = "stopped"  # after shutdown(), or its event loop closed; start() may run again
    LOST = "lost"  # stopped on its own (store failed, leadership lost); start() may run again


_S = SchedulerState
SCHEDULER_TRANSITIONS = table(
    SchedulerState,
    {
        _S.NEW: {_S.STARTING},
        # a start() that fails (a bad store file, cancelled while standing by) goes back
        _S.STARTING: {_S.RUNNING, _S.NEW, _S.STOPPED, _S.LOST},
        # RUNNING/STOPPING -> STOPPED without shutdown(): the session's event loop was closed
        _S.RUNNING: {_S.STOPPING, _S.LOST, _S.STOPPED},
        _S.STOPPING: {_S.STOPPED, _S.LOST},
        _S.STOPPED: {_S.STARTING},
        _S.LOST: {_S.STARTING},
    },
)


class Launcher(Protocol):
    """Where started attempts go instead of in-process executors (the server's workers)."""

    def bind(self, engine: Engine, kick: Callable[[], None]) -> None:
        """A session started: report outcomes to `engine`, then call `kick()`."""

    def launch(self, starts: list[Attempt]) -> None:
        """Run these attempts (their RUNNING state is durable when there is a store)."""

    def abort(self, aborts: list[Attempt]) -> None:
        """The engine gave these attempts up (timeout, cancellation, lease expiry, stop)."""

    def lost(self, reason: str) -> None:
        """The session stopped on its own (leadership lost, store failed): tell the workers."""


class _Session:
    """One start()..shutdown() run: the engine, the waiters and the running asyncio tasks."""

    __slots__ = (
        "closed",
        "durable",
        "engine",
        "idle",
        "loop",
        "pump_due",
        "reason",
        "room",
        "streams",
        "tasks",
        "waiters",
        "wake_at",
        "wake_handle",
    )

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.tasks: dict[int, asyncio.Future[Any]] = {}
        self.streams: list[EventStream] = []
        # pool -> (tasks wanted, future) of callers parked until the pool has room for them
        # (submitters of overflow="wait" pools, and Scheduler.room())
        self.room: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self.closed = False
        self.idle: asyncio.Future[None] | None = None
        self.pump_due = False
        self.wake_handle: asyncio.TimerHandle | None = None
        self.wake_at = math.inf
        self.durable: Durable | None = None
        self.reason = _SHUTDOWN  # why unfinished handles fail once the session is closed

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


def _own_ids(stored: Stored, shard: int) -> None:
    """Refuse a store holding ids of another shard than `shard` (its highest id included):
    two shards on one store would issue each other's ids."""
    ids = [row[0] for row in stored.tasks]
    if stored.max_id:
        ids.append(stored.max_id)
    foreign = next((i for i in ids if i >> SHARD_SHIFT != shard), None)
    if foreign is not None:
        raise SchedulerError(
            f"the store holds task id {foreign} of shard number {foreign >> SHARD_SHIFT}, not"
            f" {shard}: a sharded server needs a store (schema or file) of its own"
        )


def _outcome(rec: TaskRecord) -> Any:
    if rec.status == SUCCEEDED:
        return rec.output
    raise TaskFailed(STATUS_NAMES[rec.status], rec.message or "", rec.id)


class TaskHandle:
    """Awaitable result of one task; await it any number of times."""

    __slots__ = ("_rec", "_sched", "_session", "duplicate", "id")

    def __init__(
        self, sched: Scheduler, session: _Session, rec: TaskRecord, duplicate: bool
    ) -> None:
        self.id = rec.id
        self.duplicate = duplicate
        self._rec = rec
        self._sched = sched
        self._session = session

    def done(self) -> bool:
        """True once the task is terminal (or the scheduler shut down before it ended)."""
        return self._session.settled(self._rec) or self._session.closed

    def cancel(self) -> None:
        """Ask for cancellation without waiting (fire and forget)."""
        if not self.done():
            self._sched._cancel_now(self._session, self.id)

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

    # the scheduler's clock and the attempt's token, both set when the attempt is launched
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

    def __init__(self, session: _Session, capacity: int, raise_on_lag: bool) -> None:
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

    def _push(self, ev: StatusEvent) -> None:
        buf = self._buf
        if len(buf) >= self._capacity:
            buf.popleft()
            self.lagged += 1
            self._unreported += 1
        buf.append(ev)
        self._wake()

    def _end(self) -> None:
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


class Scheduler:
    """Runs tasks on pools of executors inside one asyncio event loop."""

    def __init__(
        self,
        pools: Sequence[Pool],
        resources: Sequence[Resource] | None = None,
        emit_transitions: bool = False,
        *,
        shutdown_grace: float = 5.0,
        event_capacity: int = 1024,
        store: Store | None = None,
        codec: Any = None,
        retention: float = _engine.DEFAULT_RETENTION,
        retention_max: int = _engine.DEFAULT_RETENTION_MAX,
        launcher: Launcher | None = None,
        clock: Callable[[], float] | None = None,
        shard: int | None = None,
    ) -> None:
        """`launcher` (for the server): attempts go to it instead of the pools' executors, and
        every pool starts with no slots (the launcher's workers bring them).

        `shard` (for a sharded server, 0-255): the number every task id carries in its top 8
        bits (docs/sharding.md, "Task ids"). A store that holds another number's ids is
        refused at start: each shard needs a store of its own.

        `clock` (default `time.time`): the scheduler's wall clock in Unix seconds, read for
        every decision (deadlines, backoffs, leases, timestamps). Its seconds must pass as fast
        as the event loop's `loop.time()`, since the scheduler's timers are loop timers."""
        if clock is None:
            clock = time.time
        elif not callable(clock):
            raise TypeError(f"clock must be a callable returning Unix seconds (got {clock!r})")
        self._clock: Callable[[], float] = clock
        pools = list(pools)
        if not pools:
            raise ValueError("at least one pool is required")
        by_name: dict[str, Pool] = {}
        for p in pools:
            if not isinstance(p, Pool):
                raise TypeError(f"pools must contain Pool objects (got {type(p).__name__})")
            if p.name in by_name:
                raise ValueError(f"duplicate pool name {p.name!r}")
            by_name[p.name] = p
        names: set[str] = set()
        for r in resources or ():
            if not isinstance(r, Resource):
                raise TypeError(f"resources must contain Resource objects (got {r!r})")
            if r.name in names:
                raise ValueError(f"duplicate resource name {r.name!r}")
            names.add(r.name)
        if isinstance(event_capacity, bool) or not isinstance(event_capacity, int):
            raise TypeError("event_capacity must be an int")
        if event_capacity < 1:
            raise ValueError("event_capacity must be >= 1")
        self._grace = check_seconds("shutdown_grace", shutdown_grace, allow_inf=True)
        self._retention = check_seconds("retention", retention, allow_inf=True)
        if isinstance(retention_max, bool) or not isinstance(retention_max, int):
            raise TypeError("retention_max must be an int")
        if retention_max < 0:
            raise ValueError("retention_max must be >= 0")
        if codec is not None and store is None:
            raise ValueError("codec= needs store=")
        self._store: Store | None = None if store is None else check_store(store)
        self._codec: Codec | None = (
            None if store is None else JsonCodec() if codec is None else check_codec(codec)
        )
        self._ended: str | None = None  # why the last session stopped on its own
        # A lost session closes its store in the background; the next start waits for it.
        self._closing: asyncio.Task[None] | None = None
        self._launcher = launcher
        if shard is not None and (
            isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard <= 255
        ):
            raise ValueError(f"shard must be an int from 0 to 255 (got {shard!r})")
        self._shard = shard
        self._resources = [r.core_config() for r in resources or ()]
        self._pool_names = [p.name for p in pools]
        self._default_pool = "default" if "default" in by_name else pools[0].name
        self._core_configs = {p.name: p.core_config() for p in pools}
        self._executors = {p.name: (p.executor, p.is_async) for p in pools}
        self._emit_transitions = bool(emit_transitions)
        self._event_capacity = event_capacity
        self._retention_max = retention_max
        self._session: _Session | None = None  # set while RUNNING and STOPPING
        self._life = Lifecycle("Scheduler", _S.NEW, SCHEDULER_TRANSITIONS)

    # --- properties ------------------------------------------------------------------------

    @property
    def pools(self) -> list[str]:
        return list(self._pool_names)

    @property
    def default_pool(self) -> str:
        return self._default_pool

    @property
    def clock(self) -> Callable[[], float]:
        """The clock the scheduler reads (Unix seconds); drivers built on it read it too."""
        return self._clock

    @property
    def started(self) -> bool:
        return self._session is not None

    # --- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind to the running loop and begin scheduling."""
        life = self._life
        if self._session is not None:
            if not self._session.loop.is_closed():
                raise RuntimeError("scheduler already started")
            self._session = None
            life.move(_S.STOPPED)
        if life.at(_S.STARTING):
            raise RuntimeError("scheduler is already starting")
        before = life.move(_S.STARTING)
        try:
            await self._begin(asyncio.get_running_loop())
        except BaseException:
            if life.at(_S.STARTING):
                life.move(before)
            raise

    async def _begin(self, loop: asyncio.AbstractEventLoop) -> None:
        store = self._store
        stored = None
        first = first_id(0, self._shard)  # without a store: epoch 0
        closing, self._closing = self._closing, None
        if closing is not None and closing.get_loop() is loop:
            try:
                await closing
            except Exception as e:  # the file is closed whatever went wrong on the way
                log.warning("closing the store after the lost session failed: %s", e)
        if store is not None:
            await store.open()
            try:
                # A standby waits here until the file's leader stops or its lease runs out.
                first = first_id(await store.lead(), self._shard)
                stored = await store.load()
                if self._shard is not None:
                    _own_ids(stored, self._shard)
                # (after the epoch wrapped, its first id is below those issued before)
                first = max(first, stored.max_id + 1)
            except BaseException:
                await store.close()
                raise
        now = self._clock()
        engine = Engine(
            list(self._core_configs.values()),
            now,
            first_id=first,
            rng=random.Random(),
            emit_transitions=self._emit_transitions,
            retention=self._retention,
            retention_max=self._retention_max,
            attempt_class=TaskContext,
            resources=self._resources,
            elastic=self._launcher is None,
            journal=store is not None,
        )
        self._session = s = _Session(engine, loop)
        self._life.move(_S.RUNNING)
        if self._launcher is not None:
            for name in self._pool_names:
                engine.set_capacity(name, 0, now)
            self._launcher.bind(engine, lambda: self._kick(s))
        self._ended = None
        if store is not None:
            assert self._codec is not None and stored is not None
            s.durable = d = Durable(
                store,
                self._codec,
                engine,
                loop,
                lambda starts, finished, events: self._release(s, starts, finished, events),
                lambda reason: self._lose(s, reason),
                clock=self._clock,
            )
            d.recover(stored, now)
            d.start()
        self._pump(s)  # timers due at start (the first autoscaler evaluation) run now

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop admitting and dispatching, let running attempts finish for `grace` seconds,
        then cancel them. Handles of unfinished tasks fail with status "shutdown"."""
        g = self._grace if grace is None else check_seconds("grace", grace, allow_inf=True)
        s = self._session
        if s is None or not self._life.at(_S.RUNNING):
            return
        self._life.move(_S.STOPPING)
        eng = s.engine
        eng.halt()
        if eng.running and g > 0:
            s.idle = s.loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(s.idle), None if math.isinf(g) else g)
        pending = list(s.tasks.values())
        eng.abort_running(self._clock())
        self._apply(s)
        if pending:
            await asyncio.wait(pending, timeout=0.1)
        if s.durable is not None:
            # What was decided before the stop is written; tasks still pending (those aborted
            # by this shutdown included) stay in the file and resume at the next start.
            await s.durable.close(release_lease=True)
        self._close_session(s)
        if self._life.at(_S.STOPPING):  # (LOST if the store failed meanwhile)
            self._life.move(_S.STOPPED)

    def _close_session(self, s: _Session) -> None:
        s.closed = True
        for fut in [*s.waiters.values(), *(f for fs in s.room.values() for _, f in fs)]:
            if not fut.done():
                fut.set_result(None)
        s.waiters.clear()
        s.room.clear()
        if s.wake_handle is not None:
            s.wake_handle.cancel()
        for st in s.streams:
            st._end()
        if self._session is s:
            self._session = None

    def _lose(self, s: _Session, reason: str) -> None:
        """The store failed or another process took the leadership: stop at once (nothing
        more may be written), abort the running executors and fail the waiting handles."""
        if s.closed:
            return
        log.error("scheduler stopped: %s", reason)
        s.reason = self._ended = reason
        eng = s.engine
        eng.halt()
        eng.abort_running(self._clock())
        self._abort_attempts(s, eng.take().aborts)
        if self._launcher is not None:
            self._launcher.lost(reason)
        if self._session is s:
            self._life.move(_S.LOST)
        self._close_session(s)
        if s.durable is not None:
            self._closing = s.loop.create_task(s.durable.close(release_lease=False))

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown(self._grace)

    def _live(self) -> _Session:
        s = self._session
        if s is None:
            if self._ended is not None:
                raise SchedulerError(self._ended)
            raise RuntimeError(_NOT_STARTED)
        if s.loop.is_closed():
            self._session = None
            self._life.move(_S.STOPPED)
            raise SchedulerError(_LOOP_CLOSED)
        return s

    def serving(self) -> Engine:
        """The engine of the running session, for a driver built on this scheduler (the
        server's services): read it, and change it only through its public methods. Raises
        RuntimeError before start() and SchedulerError once stopped or stopping on a lost
        store."""
        s = self._live()
        if s.closed:
            raise SchedulerError("scheduler not serving")
        return s.engine

    def _admitting(self) -> _Session:
        s = self._live()
        if self._life.at(_S.STOPPING):
            raise SchedulerError("scheduler is shutting down; it no longer accepts tasks")
        return s

    # --- submission ------------------------------------------------------------------------

    def _build(self, payload: Any, options: Mapping[str, Any], now: float) -> TaskRecord:
        """Validate one task's options (the no-option path skips straight to the record)."""
        if not options:
            return TaskRecord(payload, self._default_pool)
        rec = build_task(
            payload, pools=self._core_configs, default_pool=self._default_pool, now=now, **options
        )
        return rec

    async def submit(self, payload: Any, **options: Any) -> TaskHandle:
        """Submit one task; returns its handle (for a live or retained key: the existing one).
        With a store it returns once the task is on disk."""
        s = self._admitting()
        if s.durable is not None:
            rec, dup = await self._submit_durable(s, payload, options)
            return TaskHandle(self, s, rec, dup)
        now = self._clock()
        try:
            rec, dup = s.engine.submit(self._build(payload, options, now), now)
        except SubmitError as e:
            if e.code != "full":
                raise
            s, rec, dup = await self._submit_when_room(s, payload, options)
        self._kick(s)
        return TaskHandle(self, s, rec, dup)

    async def enqueue(self, payload: Any, **options: Any) -> int:
        """Submit one task and return only its id (cheapest path)."""
        s = self._admitting()
        if s.durable is not None:
            return (await self._submit_durable(s, payload, options))[0].id
        now = self._clock()
        try:
            rec = s.engine.submit(self._build(payload, options, now), now)[0]
        except SubmitError as e:
            if e.code != "full":
                raise
            s, rec, _ = await self._submit_when_room(s, payload, options)
        self._kick(s)
        return rec.id

    async def _submit_durable(
        self, s: _Session, payload: Any, options: Mapping[str, Any]
    ) -> tuple[TaskRecord, bool]:
        d = s.durable
        assert d is not None
        data = encode_payload(d.codec, payload)
        now = self._clock()
        try:
            rec, dup = s.engine.submit(self._build(payload, options, now), now)
        except SubmitError as e:
            if e.code != "full":
                raise
            s, rec, dup = await self._submit_when_room(s, payload, options)
        if not dup:
            d.encoded[rec.id] = data
        self._kick(s)
        await d.ack()
        return rec, dup

    async def _submit_when_room(
        self, s: _Session, payload: Any, options: Mapping[str, Any]
    ) -> tuple[_Session, TaskRecord, bool]:
        """overflow="wait": park the caller until its pool has room, then try again."""
        while True:
            now = self._clock()
            rec = self._build(payload, options, now)
            try:
                got, dup = s.engine.submit(rec, now)
            except SubmitError as e:
                if e.code != "full":
                    raise
                await self._park(s, rec.pool, 1)
                s = self._admitting()
                continue
            return s, got, dup

    async def room(self, pool: str, n: int = 1) -> None:
        """Wait until `pool` can take `n` more pending tasks without its overflow policy
        (`Engine.has_room(pool, n)`); at once if it can. It also returns when the session ends
        (shutdown, a lost store): the caller's next call then says why. A cancelled wait leaves
        nothing behind. For a driver that holds submitters itself (the server's
        overflow="wait")."""
        s = self._live()
        if pool not in self._core_configs:
            raise SubmitError("unknown_pool", f"unknown pool {pool!r}")
        while not s.closed and not s.engine.has_room(pool, n):
            await self._park(s, pool, n)

    @staticmethod
    async def _park(s: _Session, pool: str, n: int) -> None:
        """Until a turn after which `pool` has room for `n` (see _apply), or the session ends."""
        entry = (n, s.loop.create_future())
        s.room.setdefault(pool, []).append(entry)
        try:
            await entry[1]
        finally:
            parked = s.room.get(pool)
            if parked is not None and entry in parked:  # cancelled: leave nothing behind
                parked.remove(entry)
                if not parked:
                    del s.room[pool]

    async def submit_batch(self, tasks: Iterable[Task]) -> list[TaskHandle]:
        """Admit all tasks or none: every task is validated before the first is admitted."""
        s = self._admitting()
        now = self._clock()
        build = self._build
        recs = []
        d = s.durable
        encoded = []
        for t in tasks:
            if not isinstance(t, Task):
                raise TypeError(f"submit_batch takes cronoq.Task objects (got {type(t).__name__})")
            recs.append(build(t.payload, t.options, now))
            if d is not None:
                encoded.append(encode_payload(d.codec, t.payload))
        admitted = s.engine.submit_batch(recs, now)
        self._kick(s)
        if d is not None:
            for (rec, dup), data in zip(admitted, encoded, strict=True):
                if not dup:
                    d.encoded[rec.id] = data
            await d.ack()
        return [TaskHandle(self, s, rec, dup) for rec, dup in admitted]

    # --- lookups and control ---------------------------------------------------------------

    async def cancel(self, id_or_key: int | str) -> bool:
        """Cancel a live task in any state; False if unknown or already finished."""
        s = self._live()
        ok = self._cancel_now(s, _check_ref(id_or_key))
        if ok and s.durable is not None:
            await s.durable.ack()
        return ok

    def _cancel_now(self, s: _Session, ref: int | str) -> bool:
        if s.closed:
            return False
        ok = s.engine.cancel(ref, self._clock())
        if ok:
            self._kick(s)
        return ok

    async def status(self, id_or_key: int | str) -> str | None:
        """Status name of a live or retained task, or None."""
        rec = self._live().engine.lookup(_check_ref(id_or_key))
        return None if rec is None else STATUS_NAMES[rec.status]

    async def handle(self, id_or_key: int | str) -> TaskHandle | None:
        """A handle for a live or retained task, or None."""
        s = self._live()
        rec = s.engine.lookup(_check_ref(id_or_key))
        return None if rec is None else TaskHandle(self, s, rec, False)

    async def stored(self, task_id: int) -> TaskRecord | None:
        """A finished task that memory no longer holds (past `retention`), read back from the
        store, which keeps finished rows longer (its own retention); None without a store, for
        a live or unknown task, or when the row was pruned. Its result is decoded as at
        recovery (None if the codec cannot)."""
        self._live()
        if self._store is None or isinstance(task_id, bool) or not isinstance(task_id, int):
            return None
        row = await self._store.finished(task_id)
        if row is None:
            return None
        assert self._codec is not None
        rec, _ = record_from_row(row.row, self._codec)
        return rec

    async def snapshot(self) -> Snapshot:
        """The state now, with every decision due at this moment taken first (a task just
        submitted to a pool with a free slot counts as dispatched)."""
        s = self._live()
        if s.pump_due:
            self._pump(s)
        return s.engine.snapshot(self._clock())

    async def set_capacity(self, pool: str, n: int) -> None:
        """Set a pool's (unlabeled) capacity now; not clamped to the pool's max."""
        s = self._live()
        if pool not in self._core_configs:
            raise SubmitError("unknown_pool", f"unknown pool {pool!r}")
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int (got {n!r})")
        if n < 0:
            raise OverflowError(f"n must be >= 0 (got {n})")
        s.engine.set_capacity(pool, n, self._clock())
        self._kick(s)

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: Any,
        *,
        tz: str | None = None,
        overlap: str = "skip",
        tolerance: float = 1.0,
        on_miss: str = "run_late",
        deadline_in: float | None = None,
        **options: Any,
    ) -> None:
        """Run `payload` at every occurrence of a cron expression (5, 6 with leading seconds, or
        7 fields; @aliases) in time zone `tz` (IANA name, default UTC). Adding an existing name
        replaces that schedule. `options` are submit()'s priority, pool, kind, key,
        duration_hint, timeout, retry, resources, tags, labels and tenant."""
        s = self._live()
        if not isinstance(name, str) or "\0" in name:
            raise ValueError(f"name must be a string without NUL characters (got {name!r})")
        if not isinstance(cron, str):
            raise TypeError(f"cron must be a string (got {cron!r})")
        if overlap not in _OVERLAPS:
            raise ValueError("overlap must be 'skip', 'allow', 'queue' or 'queue_on_success'")
        unknown = options.keys() - _RECURRING_OPTIONS
        if unknown:
            raise TypeError(
                f"add_recurring() got unexpected option(s): {', '.join(sorted(unknown))}"
            )
        if deadline_in is not None:
            deadline_in = check_seconds("deadline_in", deadline_in)
        now = self._clock()
        # The template goes through submit()'s validation (with a fixed start for tolerance and
        # on_miss), so a schedule accepts exactly what a task accepts.
        tpl = build_task(
            payload,
            pools=self._core_configs,
            default_pool=self._default_pool,
            now=now,
            start_at=now,
            tolerance=tolerance,
            on_miss=on_miss,
            **options,
        )
        assert tpl.extra is not None
        try:
            spec = parse_cron(cron)
        except CronError as e:
            raise SchedulerError(f"configuration error: invalid cron '{cron}': {e}") from None
        try:
            zone_info = zone(tz)
        except CronError as e:
            raise SchedulerError(f"configuration error: {e}") from None
        resources = tpl.extra.resources
        if resources:
            s.engine.resolve_resources(resources)  # the checks a submit of it would make
        sched = Recurring(
            name=name,
            spec=spec,
            tz=zone_info,
            payload=payload,
            pool=tpl.pool,
            cls=tpl.cls,
            kind=tpl.kind,
            key=tpl.key,
            tenant=tpl.tenant,
            deadline_in=deadline_in,
            duration_hint=tpl.duration_hint,
            timeout=tpl.timeout,
            retry=tpl.retry,
            resources=resources,
            tags=tpl.tags,
            labels=tpl.labels,
            overlap=overlap,
            tolerance=tpl.extra.tolerance,
            on_miss=tpl.extra.on_miss,
            cron=cron,
            tz_name=tz,
        )
        d = s.durable
        if d is not None:
            d.templates[name] = encode_payload(d.codec, payload)
        s.engine.add_recurring(sched, now)
        self._kick(s)
        if d is not None:
            await d.ack()

    async def remove_recurring(self, name: str) -> bool:
        """Remove a schedule (and cancel its occurrence that has not started); False if unknown."""
        s = self._live()
        removed = s.engine.remove_recurring(name, self._clock())
        self._kick(s)
        d = s.durable
        if removed and d is not None:
            d.templates.pop(name, None)
            d.removed.append(name)
            await d.ack()
        return removed

    async def set_group_capacity(self, pool: str, labels: Mapping[str, str], n: int) -> None:
        """Declare or resize the worker group of `pool` carrying exactly `labels`; the pool's
        capacity is its unlabeled slots plus every group's. n=0 removes the group's slots."""
        s = self._live()
        if pool not in self._core_configs:
            raise SubmitError("unknown_pool", f"unknown pool {pool!r}")
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise TypeError(f"labels must be a mapping of str to str (got {labels!r})")
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int (got {n!r})")
        if n < 0:
            raise OverflowError(f"n must be >= 0 (got {n})")
        s.engine.set_group_capacity(pool, dict(labels), n, self._clock())
        self._kick(s)

    def events(self, on_lag: str = "skip") -> EventStream:
        """A stream of the status events published from now on."""
        s = self._live()
        if on_lag not in ("skip", "raise"):
            raise ValueError("on_lag must be 'skip' or 'raise'")
        st = EventStream(s, self._event_capacity, on_lag == "raise")
        s.streams.append(st)
        s.update_event_level()
        return st

    # --- the driver loop -------------------------------------------------------------------

    def _kick(self, s: _Session) -> None:
        """Run the pump once in this loop iteration (coalesces many calls)."""
        if not s.pump_due:
            s.pump_due = True
            s.loop.call_soon(self._pump, s)

    def _pump(self, s: _Session) -> None:
        s.pump_due = False
        if s.closed:
            return
        eng = s.engine
        now = self._clock()
        eng.advance(now)
        eng.dispatch(now)
        self._apply(s)
        wake = eng.next_wake()
        if wake is not None and wake < s.wake_at:
            if s.wake_handle is not None:
                s.wake_handle.cancel()
            s.wake_at = wake
            s.wake_handle = s.loop.call_at(s.loop.time() + (wake - now), self._on_wake, s)

    def _on_wake(self, s: _Session) -> None:
        s.wake_handle = None
        s.wake_at = math.inf
        self._pump(s)

    def _apply(self, s: _Session) -> None:
        """Carry out the engine's actions (with a store: aborts now, the rest once written)."""
        out = s.engine.take()
        if out.aborts:
            self._abort_attempts(s, out.aborts)
        if s.durable is not None:
            waiters = s.waiters
            urgent = bool(
                out.starts
                or (out.events and s.streams)
                or (waiters and any(rec.id in waiters for rec in out.finished))
            )
            s.durable.hold(out, urgent)
        else:
            self._release(s, out.starts, out.finished, out.events)
        if s.idle is not None and not s.engine.running and not s.idle.done():
            s.idle.set_result(None)
        if s.room:
            eng = s.engine
            for pool in [p for p in s.room if eng.has_room(p)]:
                later = []
                for n, fut in s.room.pop(pool):
                    if fut.done():
                        continue
                    if n == 1 or eng.has_room(pool, n):
                        fut.set_result(None)
                    else:
                        later.append((n, fut))
                if later:
                    s.room[pool] = later

    def _release(
        self,
        s: _Session,
        starts: list[Attempt],
        finished: list[TaskRecord],
        events: list[StatusEvent],
    ) -> None:
        if starts:
            self._launch(s, starts)
        if finished and s.waiters:
            self._resolve(s, finished)
        if events:
            for st in s.streams:
                for ev in events:
                    st._push(ev)

    @staticmethod
    def _resolve(s: _Session, finished: list[TaskRecord]) -> None:
        waiters = s.waiters
        for rec in finished:
            fut = waiters.pop(rec.id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _abort_attempts(self, s: _Session, aborts: list[Attempt]) -> None:
        """The engine gave these attempts up: cancel their executors (or tell the launcher)."""
        if self._launcher is not None:
            self._launcher.abort(aborts)
            return
        tasks = s.tasks
        for att in cast("list[TaskContext]", aborts):
            t = tasks.pop(att.lease, None)
            if t is not None:  # launched, so it has its token
                att._token._cancel()
                t.cancel()

    def _launch(self, s: _Session, starts: list[Attempt]) -> None:
        if self._launcher is not None:
            self._launcher.launch([att for att in starts if not att.ended])
            return
        create_task = s.loop.create_task
        tasks = s.tasks
        executors = self._executors
        run = self._run_attempt
        # The engine builds its attempts with attempt_class=TaskContext.
        clock = self._clock
        for att in cast("list[TaskContext]", starts):
            if not att.ended:  # with a store, it may have been aborted while being written
                att._clock = clock
                att._token = CancellationToken()
                tasks[att.lease] = create_task(run(s, att, *executors[att.task.pool]))

    async def _run_attempt(
        self, s: _Session, att: TaskContext, executor: Callable[..., Any], is_async: bool
    ) -> None:
        """Run one attempt and report its outcome (calling the executor here means an attempt
        aborted before its first step never creates the executor's coroutine)."""
        eng = s.engine
        try:
            if is_async:
                result = await executor(att, att.task.payload)
            else:
                result = await s.loop.run_in_executor(None, executor, att, att.task.payload)
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError:
            if att.ended:  # we cancelled it: nothing to report
                return
            eng.fail(att, self._clock(), _SELF_CANCELLED)
        except Permanent as e:
            eng.fail(att, self._clock(), e.message, permanent=True)
        except Retryable as e:
            eng.fail(att, self._clock(), e.message, retry_after=e.retry_after)
        except Exception as e:
            eng.fail(att, self._clock(), _describe(e))
        else:
            eng.complete(att, self._clock(), result)
        finally:
            s.tasks.pop(att.lease, None)
        if s.waiters and s.durable is None:  # wake awaiters now rather than one turn later
            self._resolve(s, s.engine.finished_since_take())
        self._kick(s)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _check_ref(ref: object) -> int | str:
    if isinstance(ref, bool) or not isinstance(ref, (int, str)):
        raise TypeError(f"id_or_key must be a task id (int) or key (str), got {ref!r}")
    return ref
