"""`Scheduler`: the library's API, its life cycle and the validation of what callers pass.

Each start() opens a `Session` (the loop that drives the engine) and binds the launcher to it;
every call checks its arguments and then goes to that session's engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from types import TracebackType
from typing import Any, Literal, Unpack

from .._durable import Durable, encode_payload
from .._lifecycle import Lifecycle, table
from .._options import (
    ROUTING,
    Pool,
    RecurringOptions,
    Resource,
    SubmitOptions,
    Task,
    build_task,
    routed_task,
)
from .._tracing import ATTR_TASK_ID, Traced, tracer
from ..core import engine as _engine
from ..core.cron import CronError, parse_cron, zone
from ..core.engine import Engine
from ..core.model import (
    FIRST_TERMINAL,
    SUCCEEDED,
    Observer,
    Snapshot,
    TaskRecord,
    check_seconds,
    resubmission,
)
from ..core.recurring import Recurring
from ..core.vocab import OVERLAPS, STATUSES, MissPolicy, Overlap, Status
from ..errors import SchedulerError, SubmitError
from ..store.base import SHARD_SHIFT, Store, Stored, check_store, first_id
from ..store.codec import Codec, JsonCodec, check_codec
from ..store.rows import record_from_row
from .handles import EventStream, TaskContext, TaskHandle
from .local import LocalLauncher, OutsideLauncher
from .session import Launcher, Session

__all__ = ["SCHEDULER_TRANSITIONS", "Scheduler", "SchedulerState"]

log = logging.getLogger("cronoq")

_NOT_STARTED = "scheduler not started; call `await scheduler.start()` first"
_LOOP_CLOSED = (
    "the scheduler stopped because its asyncio event loop was closed "
    "(call start() again on a running loop)"
)
_RECURRING_OPTIONS = RecurringOptions.__optional_keys__


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
        observer: Observer | None = None,
        tracing: object = None,
    ) -> None:
        """`launcher` (for the server): attempts go to it instead of the pools' executors, and
        every pool starts with no slots (the launcher's workers bring them).

        `shard` (for a sharded server, 0-255): the number every task id carries in its top 8
        bits (docs/sharding.md, "Task ids"). A store that holds another number's ids is
        refused at start: each shard needs a store of its own.

        `clock` (default `time.time`): the scheduler's wall clock in Unix seconds, read for
        every decision (deadlines, backoffs, leases, timestamps). Its seconds must pass as fast
        as the event loop's `loop.time()`, since the scheduler's timers are loop timers.

        `observer` (for the server's metrics): told of every attempt's start and end by the
        engine of each session (`cronoq.core.model.Observer`); None costs nothing more.

        `tracing` (docs/observability.md, "Traces"): spans of submits and attempts through the
        program's OpenTelemetry SDK. None (the default): when one is configured as the scheduler
        starts; False: never; True: always (it needs `opentelemetry-api`); or a tracer provider
        to make them with instead of the global one."""
        if clock is None:
            clock = time.time
        elif not callable(clock):
            raise TypeError(f"clock must be a callable returning Unix seconds (got {clock!r})")
        self._clock: Callable[[], float] = clock
        self._observer = observer
        tracer(False if tracing is None else tracing)  # (a bad setting fails here)
        self._tracing = tracing
        self._traced: Traced | None = None  # the session's tracing, when on
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
        self._launcher = (
            LocalLauncher({p.name: (p.executor, p.is_async) for p in pools}, clock)
            if launcher is None
            else OutsideLauncher(launcher, clock)
        )
        if shard is not None and (
            isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard <= 255
        ):
            raise ValueError(f"shard must be an int from 0 to 255 (got {shard!r})")
        self._shard = shard
        self._resources = [r.core_config() for r in resources or ()]
        self._pool_names = [p.name for p in pools]
        self._default_pool = "default" if "default" in by_name else pools[0].name
        self._core_configs = {p.name: p.core_config() for p in pools}
        self._emit_transitions = bool(emit_transitions)
        self._event_capacity = event_capacity
        self._retention_max = retention_max
        self._session: Session | None = None  # set while RUNNING and STOPPING
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
            elastic=self._launcher.elastic,
            journal=store is not None,
            observer=self._observer,
        )
        self._traced = tracer(self._tracing)
        if isinstance(self._launcher, LocalLauncher):  # (the server traces its own attempts)
            self._launcher.traced = self._traced
        self._session = s = Session(engine, loop, self._launcher, self._clock)
        self._life.move(_S.RUNNING)
        self._launcher.bind(engine, s.reported)
        self._ended = None
        if store is not None:
            assert self._codec is not None and stored is not None
            s.durable = d = Durable(
                store,
                self._codec,
                engine,
                loop,
                s.release,
                lambda reason: self._lose(s, reason),
                clock=self._clock,
            )
            d.recover(stored, now)
            d.start()
        s.pump()  # timers due at start (the first autoscaler evaluation) run now

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
        pending = self._launcher.running()
        eng.abort_running(self._clock())
        s.apply()
        if pending:
            await asyncio.wait(pending, timeout=0.1)
        if s.durable is not None:
            # What was decided before the stop is written; tasks still pending (those aborted
            # by this shutdown included) stay in the file and resume at the next start.
            await s.durable.close(release_lease=True)
        self._close_session(s)
        if self._life.at(_S.STOPPING):  # (LOST if the store failed meanwhile)
            self._life.move(_S.STOPPED)

    def _close_session(self, s: Session) -> None:
        s.close()
        if self._session is s:
            self._session = None

    def _lose(self, s: Session, reason: str) -> None:
        """The store failed or another process took the leadership: stop at once (nothing
        more may be written), abort the running executors and fail the waiting handles."""
        if s.closed:
            return
        log.error("scheduler stopped: %s", reason)
        s.reason = self._ended = reason
        eng = s.engine
        eng.halt()
        eng.abort_running(self._clock())
        self._launcher.abort(eng.take().aborts)
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

    def _live(self) -> Session:
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

    def _admitting(self) -> Session:
        s = self._live()
        if self._life.at(_S.STOPPING):
            raise SchedulerError("scheduler is shutting down; it no longer accepts tasks")
        return s

    # --- submission ------------------------------------------------------------------------

    def _build(self, payload: Any, options: SubmitOptions, now: float) -> TaskRecord:
        """Validate one task's options (the no-option path skips straight to the record)."""
        if not options:
            return TaskRecord(payload, self._default_pool)
        if options.keys() <= ROUTING:  # a kind and a pool only: every task function's submit
            pools, default = self._core_configs, self._default_pool
            return routed_task(
                payload, pools, default, options.get("kind", "default"), options.get("pool")
            )
        rec = build_task(
            payload, pools=self._core_configs, default_pool=self._default_pool, now=now, **options
        )
        return rec

    async def submit(self, payload: Any, **options: Unpack[SubmitOptions]) -> TaskHandle:
        """Submit one task; returns its handle (for a live or retained key: the existing one).
        With a store it returns once the task is on disk.

        A full pool whose overflow policy is "wait" refuses the task with the code "full": the
        caller then waits until the pool has room and tries again."""
        traced = self._traced
        if traced is not None:
            with traced.submit(options.get("pool"), options.get("kind")) as span:
                handle = await self._submit(payload, _with_context(traced, options))
                span.set_attribute(ATTR_TASK_ID, handle.id)
                return handle
        return await self._submit(payload, options)

    async def _submit(self, payload: Any, options: SubmitOptions) -> TaskHandle:
        s = self._admitting()
        d = s.durable
        data = b"" if d is None else encode_payload(d.codec, payload)  # refused before admitted
        while True:
            now = self._clock()
            rec = self._build(payload, options, now)
            try:
                rec, dup = s.engine.submit(rec, now)
            except SubmitError as e:
                if e.code != "full":
                    raise
                await s.park(rec.pool, 1)
                s = self._admitting()
            else:
                break
        if d is not None and not dup:
            d.encoded[rec.id] = data
        s.kick()
        if d is not None:
            await d.ack()
        return TaskHandle(s, rec, dup)

    async def enqueue(self, payload: Any, **options: Unpack[SubmitOptions]) -> int:
        """Submit one task and return only its id."""
        return (await self.submit(payload, **options)).id

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
            await s.park(pool, n)

    async def submit_batch(self, tasks: Iterable[Task]) -> list[TaskHandle]:
        """Admit all tasks or none: every task is validated before the first is admitted."""
        traced = self._traced
        if traced is not None:
            tasks = list(tasks)
            with traced.submit(None, None, len(tasks)):
                return await self._submit_batch(
                    [
                        Task(t.payload, **_with_context(traced, t.options))
                        if isinstance(t, Task)
                        else t
                        for t in tasks
                    ]
                )
        return await self._submit_batch(tasks)

    async def _submit_batch(self, tasks: Iterable[Task]) -> list[TaskHandle]:
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
        s.kick()
        if d is not None:
            for (rec, dup), data in zip(admitted, encoded, strict=True):
                if not dup:
                    d.encoded[rec.id] = data
            await d.ack()
        return [TaskHandle(s, rec, dup) for rec, dup in admitted]

    # --- lookups and control ---------------------------------------------------------------

    async def cancel(self, id_or_key: int | str) -> bool:
        """Cancel a live task in any state; False if unknown or already finished."""
        s = self._live()
        ok = s.cancel(_check_ref(id_or_key))
        if ok and s.durable is not None:
            await s.durable.ack()
        return ok

    async def cancel_many(self, ids: Iterable[int]) -> int:
        """Cancel the live tasks among `ids` (ended or unknown ones are skipped); how many
        were cancelled. One write for all of them: callers pass bounded chunks."""
        s = self._live()
        now = self._clock()
        n = 0
        if not s.closed:
            for task_id in ids:
                n += s.engine.cancel(task_id, now)
        await self._written(s, n)
        return n

    async def resubmit(self, ids: Iterable[int]) -> list[int]:
        """Submit a copy (`core.model.resubmission`: same spec, payload and tags, no key) of
        each task among `ids` that ended without succeeding; the new ids, in order. Stops at a
        pool that is full (its overflow policy would refuse the next copy)."""
        s = self._admitting()
        now = self._clock()
        out = []
        for task_id in ids:
            rec = s.engine.lookup(task_id)
            if rec is None or rec.status < FIRST_TERMINAL or rec.status == SUCCEEDED:
                continue
            try:
                copy, _ = s.engine.submit(resubmission(rec), now)
            except SubmitError as e:
                if e.code != "full":
                    raise
                break
            out.append(copy.id)
        await self._written(s, len(out))
        return out

    async def delete(self, ids: Iterable[int]) -> int:
        """Forget the ended tasks among `ids` now, in memory and in the store (Engine.delete
        says which it keeps); how many were deleted."""
        s = self._live()
        tasks = s.engine.tasks
        n = len(s.engine.delete(rec for rec in map(tasks.get, ids) if rec is not None))
        await self._written(s, n)
        return n

    async def pause(self, pool: str) -> bool:
        """Start nothing new in `pool` until `resume` (submits are still accepted, running
        attempts finish); False if it was paused already. With a store the pause is written
        before this returns, so it survives restarts and failovers."""
        s = self._live()
        self._known(pool)
        changed = s.engine.pause(pool, self._clock())
        await self._written(s, changed)
        return changed

    async def resume(self, pool: str) -> bool:
        """Let a paused pool start tasks again; False if it was not paused."""
        s = self._live()
        self._known(pool)
        changed = s.engine.resume(pool, self._clock())
        await self._written(s, changed)
        return changed

    async def drain(self, pool: str, timeout: float | None = None) -> bool:
        """Pause `pool`, then wait until none of its attempts runs: True once drained, False
        if `timeout` seconds passed first (the pool stays paused either way)."""
        await self.pause(pool)
        s = self._live()
        try:
            await asyncio.wait_for(s.drained(pool), timeout)
        except TimeoutError:
            return False
        return s.engine.pools[pool].busy == 0

    def _known(self, pool: str) -> None:
        if pool not in self._core_configs:
            raise SubmitError("unknown_pool", f"unknown pool {pool!r}")

    @staticmethod
    async def _written(s: Session, n: int) -> None:
        """After `n` changes of an operator's call: dispatch, and with a store, wait until
        they are written."""
        if n:
            s.kick()
            if s.durable is not None:
                await s.durable.ack()

    async def status(self, id_or_key: int | str) -> Status | None:
        """Status name of a live or retained task, or None."""
        rec = self._live().engine.lookup(_check_ref(id_or_key))
        return None if rec is None else STATUSES[rec.status]

    async def handle(self, id_or_key: int | str) -> TaskHandle | None:
        """A handle for a live or retained task, or None."""
        s = self._live()
        rec = s.engine.lookup(_check_ref(id_or_key))
        return None if rec is None else TaskHandle(s, rec, False)

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
            s.pump()
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
        s.kick()

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: Any,
        *,
        tz: str | None = None,
        overlap: Overlap = "skip",
        tolerance: float = 1.0,
        on_miss: MissPolicy = "run_late",
        deadline_in: float | None = None,
        **options: Unpack[RecurringOptions],
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
        if overlap not in OVERLAPS:
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
        s.kick()
        if d is not None:
            await d.ack()

    async def remove_recurring(self, name: str) -> bool:
        """Remove a schedule (and cancel its occurrence that has not started); False if unknown."""
        s = self._live()
        removed = s.engine.remove_recurring(name, self._clock())
        s.kick()
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
        s.kick()

    def events(self, on_lag: Literal["skip", "raise"] = "skip") -> EventStream:
        """A stream of the status events published from now on."""
        s = self._live()
        if on_lag not in ("skip", "raise"):
            raise ValueError("on_lag must be 'skip' or 'raise'")
        st = EventStream(s, self._event_capacity, on_lag == "raise")
        s.streams.append(st)
        s.update_event_level()
        return st


def _with_context(traced: Traced, options: SubmitOptions) -> SubmitOptions:
    """A task's options with the current trace context in its tags (docs/observability.md)."""
    out = options.copy()
    out["tags"] = traced.inject(options.get("tags"))
    return out


def _check_ref(ref: object) -> int | str:
    if isinstance(ref, bool) or not isinstance(ref, (int, str)):
        raise TypeError(f"id_or_key must be a task id (int) or key (str), got {ref!r}")
    return ref
