"""The store side of a scheduler session: nothing the engine decides is seen before it is on disk.

With a store the driver holds the engine's actions back: attempts start, handles resolve, events
are published and submits return only after the rows of the same turn are committed. One writer
task commits a group at a time; everything decided while it writes joins the next group, so
concurrent submitters share transactions (group commit) and a slow disk slows throughput
gently instead of serializing every task behind its own fsync.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from ._lifecycle import Lifecycle, table
from .core.actions import Actions, Journal
from .core.cron import CronError, parse_cron, zone
from .core.engine import Engine
from .core.model import (
    FIRST_TERMINAL,
    READY,
    STATUS_NAMES,
    SUCCEEDED,
    Attempt,
    StatusEvent,
    TaskRecord,
)
from .core.recurring import Recurring
from .errors import SchedulerError
from .store.base import COLUMN, Batch, Store, Stored, from_ns
from .store.codec import Codec, encode_with, must_be_bytes
from .store.rows import insert_row, record_from_row, retry_from, schedule_row, update_row

log = logging.getLogger("cronoq")

Release = Callable[[list[Attempt], list[TaskRecord], list[StatusEvent]], None]

# How long a commit nobody waits for (results nobody awaits yet) may wait for company.
DEFER = 0.002
# The message of a task whose stored row cannot be read back (docs/durability.md).
CORRUPT = "corrupt task row: "


def encode_payload(codec: Codec, payload: Any) -> bytes:
    """Encode a payload at submission; what the codec cannot store is the caller's TypeError."""
    try:
        data = codec.encode(payload)
    except Exception as e:
        raise TypeError(
            f"payload cannot be stored by the scheduler's codec: {type(e).__name__}: {e}"
        ) from None
    return must_be_bytes(data)


class DurableState(Enum):
    """A durable session's life cycle (docs/durability.md, "Life cycle of a durable session")."""

    NEW = "new"  # built; recovering what the store holds
    RUNNING = "running"  # start(): committing each turn, renewing the lease, pruning
    CLOSING = "closing"  # close() began: write what was decided, at once (no deferring)
    FAILED = "failed"  # a write failed or the leadership was lost: nothing more is written
    CLOSED = "closed"  # the store is closed: what is decided now is dropped


_D = DurableState
DURABLE_TRANSITIONS = table(
    DurableState,
    {
        _D.NEW: {_D.RUNNING, _D.CLOSING, _D.FAILED},
        _D.RUNNING: {_D.CLOSING, _D.FAILED},
        _D.CLOSING: {_D.CLOSED, _D.FAILED},
        # close() after a failure writes nothing more: FAILED goes straight to CLOSED
        _D.FAILED: {_D.CLOSED},
        _D.CLOSED: set(),
    },
)


class _Group:
    """Actions waiting for the commit of one group of changes."""

    __slots__ = ("acks", "events", "finished", "starts")

    def __init__(self) -> None:
        self.starts: list[Attempt] = []
        self.finished: list[TaskRecord] = []
        self.events: list[StatusEvent] = []
        self.acks: list[asyncio.Future[None]] = []


class Durable:
    """Per-session persistence: collects what each turn changed, commits it, then releases
    the turn's actions through `release`; `lost` is called once if the store fails or the
    leadership is lost (the session must then stop)."""

    def __init__(
        self,
        store: Store,
        codec: Codec,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        release: Release,
        lost: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.clock = clock  # the scheduler's clock (Unix seconds)
        self.codec = codec
        self.engine = engine
        self.loop = loop
        self.release = release
        self.lost = lost
        self.encoded: dict[int, bytes] = {}  # payloads of admitted tasks not yet written
        self.templates: dict[str, bytes] = {}  # encoded template payloads of schedules
        self.removed: list[str] = []  # schedules removed since the last commit
        # Tasks terminal in memory whose terminal row is not committed yet: their handles
        # wait (and fail if the session is lost before the write).
        self.unwritten: set[int] = set()
        self.group = _Group()
        self.life = Lifecycle("Durable", _D.NEW, DURABLE_TRANSITIONS)
        self.failed: str | None = None  # why it failed (FAILED), else None
        self._inflight: asyncio.Future[None] | None = None  # the commit being written
        self._urgent = False  # something decided during that commit waits for the next
        self._keeper: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        assert engine.journal is not None, "a durable session's engine keeps a journal"

    # --- start-up ------------------------------------------------------------------------

    def recover(self, stored: Stored, now: float) -> None:
        """Give the engine back the stored pauses, tasks and schedules (see Engine.restore).
        A pause of a pool no longer configured is ignored."""
        eng = self.engine
        for name in stored.paused:
            if name in eng.pools:
                eng.pause(name, now)
        recs = []
        broken = {}
        for row in stored.tasks:
            rec, problem = self._read(row)
            if rec.status >= FIRST_TERMINAL:
                # A finished task keeps its end; one marked corrupt before is only retained.
                if problem is not None and not (rec.message or "").startswith(CORRUPT):
                    log.warning("finished task %d: %s", rec.id, problem)
            elif problem is not None:
                # It fails (its row is written back as failed: not loaded as live again).
                log.error("task %d cannot resume: %s", rec.id, problem)
                broken[rec.id] = problem
            recs.append(rec)
        eng.restore(recs, now, broken)
        for name, spec_text, payload, next_ns, last_id in stored.schedules:
            try:
                sched = _schedule(name, spec_text, payload, self.codec)
            except Exception as e:
                log.error("recurring schedule %r removed: cannot read it back: %s", name, e)
                self.removed.append(name)
                continue
            self.templates[name] = payload
            eng.resume_recurring(sched, None if next_ns is None else from_ns(next_ns), last_id, now)

    def _read(self, row: tuple[Any, ...]) -> tuple[TaskRecord, str | None]:
        """The record of a stored row and why it cannot run (None: it can). A row that cannot
        be decoded (a JSON column of the wrong shape, an unknown status ...) gives a stand-in
        record of what it still tells, with "corrupt task row: <detail>"."""
        try:
            rec, problem = record_from_row(row, self.codec)
            wrong = _misshapen(rec)
        except Exception as e:
            rec, problem, wrong = _stand_in(row, self.codec), None, f"{type(e).__name__}: {e}"
        if wrong is not None:
            return rec, f"{CORRUPT}{wrong}"
        return rec, problem

    def written(self, rec: TaskRecord) -> bool:
        """Is the task's current state committed (not in the journal, held or in flight)?"""
        journal = self.engine.journal
        return rec.id not in self.unwritten and (journal is None or rec.id not in journal.changed)

    def start(self) -> None:
        self.life.move(_D.RUNNING)
        self._keeper = self.loop.create_task(self._keep())

    # --- each turn -----------------------------------------------------------------------

    def hold(self, out: Actions, urgent: bool) -> None:
        """Keep a turn's actions (aborts excepted: the driver carries them out at once) until
        its changes are committed. Not urgent (nobody waits for what it released: no attempt
        to start, no awaited result, no event listener) means the commit may wait DEFER
        seconds to share a transaction with what comes next."""
        g = self.group
        if out.starts:
            g.starts += out.starts
        if out.finished:
            g.finished += out.finished
            self.unwritten.update(rec.id for rec in out.finished)
        if out.events:
            g.events += out.events
        self.flush(urgent)

    def ack(self) -> asyncio.Future[None]:
        """A future that completes when everything decided so far is on disk. (The write
        starts after the callbacks already queued: the driver's pump, kicked by the caller,
        then adds what it decides, such as the start of a task just submitted.)"""
        fut = self.loop.create_future()
        self.group.acks.append(fut)
        self.loop.call_soon(self.flush, True)
        return fut

    def flush(self, urgent: bool) -> None:
        state = self.life.state
        if state is _D.CLOSED:
            self._discard()
            return
        if self._inflight is not None or state is _D.FAILED:
            self._urgent = self._urgent or urgent  # taken when the commit in flight ends
            return
        if urgent or state is _D.CLOSING:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._commit_next()
        elif self._timer is None:
            self._timer = self.loop.call_later(DEFER, self._deferred)

    def _discard(self) -> None:
        """After close: the session is stopping and its file is closed, so what it decides
        now (a worker's late report of an aborted attempt) is dropped; no caller waits for
        it, and one that did would be told the scheduler stopped."""
        self.engine.take_journal()
        group, self.group = self.group, _Group()
        for fut in group.acks:
            if not fut.done():
                fut.set_exception(SchedulerError("scheduler stopped"))

    def _deferred(self) -> None:
        self._timer = None
        self.flush(True)

    def _commit_next(self) -> None:
        """Hand everything decided so far to the store thread now (not at the next loop
        turn: the thread then writes while the loop goes on deciding the next group)."""
        eng = self.engine
        journal = eng.take_journal()
        group = self.group
        self._urgent = False
        if not (journal or self.removed):
            if group.starts or group.finished or group.events or group.acks:
                self.group = _Group()
                self._release(group)
            return
        self.group = _Group()
        fut = self.store.commit_nowait(self._batch(journal, self.clock()))
        self._inflight = fut
        fut.add_done_callback(lambda f: self._committed(f, group))

    def _committed(self, fut: asyncio.Future[None], group: _Group) -> None:
        self._inflight = None
        error = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or error is not None:
            self._fail(error or SchedulerError("store write cancelled"), group)
            return
        self._release(group)
        if self._urgent:
            self._commit_next()
        elif self.engine.journal or self.removed:
            self.flush(False)

    def _release(self, group: _Group) -> None:
        if group.finished:
            self.unwritten.difference_update(rec.id for rec in group.finished)
        self.release(group.starts, group.finished, group.events)
        for fut in group.acks:
            if not fut.done():
                fut.set_result(None)

    def _batch(self, journal: Journal, now: float) -> Batch:
        codec = self.codec
        encoded = self.encoded
        changed = journal.changed
        batch = Batch(max_id=self.engine.next_id - 1)
        for rec in journal.added:
            changed.pop(rec.id, None)
            payload = encoded.pop(rec.id, None)
            if payload is None:  # a recurring occurrence: its template was checked when added
                payload = encode_with(codec, rec.payload)
            batch.inserts.append(insert_row(rec, payload, self._output(rec), now))
        updates, finishes = batch.updates, batch.finishes
        for rec in changed.values():
            row, done = update_row(rec, self._output(rec))
            (finishes if done else updates).append(row)
        recurring = self.engine.recurring
        for name, sched in journal.schedules.items():
            if recurring.get(name) is sched:
                batch.schedules.append(schedule_row(sched, self.templates[name]))
        if self.removed:
            batch.removed_schedules, self.removed = self.removed, []
        if journal.pools:
            batch.pools = list(journal.pools.items())
        batch.deletes = journal.deleted
        return batch

    def _output(self, rec: TaskRecord) -> bytes | None:
        if rec.status != SUCCEEDED or rec.output is None:
            return None
        try:
            return encode_with(self.codec, rec.output)
        except Exception as e:
            log.warning("result of task %d not stored: cannot encode it: %s", rec.id, e)
            return None

    def _fail(self, e: BaseException, group: _Group) -> None:
        message = str(e) if isinstance(e, SchedulerError) else f"store write failed: {e}"
        self.failed = message
        if self.life.at(_D.NEW, _D.RUNNING, _D.CLOSING):
            self.life.move(_D.FAILED)  # (a late failure once FAILED or CLOSED changes nothing)
        log.error("scheduler stops: %s", message)
        for fut in group.acks + self.group.acks:
            if not fut.done():
                fut.set_exception(SchedulerError(message))
        self.lost(message)

    async def _keep(self) -> None:
        """Renew the lease while idle and prune old terminal rows now and then."""
        store = self.store
        prune_every = max(1.0, min(60.0, store.retention / 2))
        next_prune = self.loop.time()
        while not self.life.at(_D.FAILED):
            try:
                if self._inflight is None:
                    await store.renew()
                if self.loop.time() >= next_prune:
                    await store.prune(self.clock())
                    next_prune = self.loop.time() + prune_every
            except Exception as e:
                self._fail(e, _Group())
                return
            await asyncio.sleep(store.lease_renew)

    # --- shutdown ------------------------------------------------------------------------

    async def close(self, release_lease: bool) -> None:
        """Write what was decided (also while closing: nothing waits DEFER any more), stop
        renewing and close the file; later decisions are not written (see _discard)."""
        if self.life.at(_D.NEW, _D.RUNNING):
            self.life.move(_D.CLOSING)  # (FAILED stays FAILED; a second close changes nothing)
        keeper, self._keeper = self._keeper, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush(True)
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        while (fut := self._inflight) is not None and self.life.at(_D.CLOSING):
            # wait() never raises (a failure is reported by _committed); a done future's
            # callback, which may start the next commit, runs on the next loop turn.
            await (asyncio.wait([fut]) if not fut.done() else asyncio.sleep(0))
        if not self.life.at(_D.CLOSED):
            self.life.move(_D.CLOSED)
        self._discard()
        await self.store.close(release=release_lease and self.failed is None)


_DEP_CONDITIONS = ("success", "failure", "complete")


def _misshapen(rec: TaskRecord) -> str | None:
    """What of a decoded record has a shape no submitted task has (None: nothing), for the
    parts recovery would trip over later (tags, labels, dependencies, resources)."""
    for name, value in (("tags", rec.tags), ("labels", rec.labels)):
        if value is not None and not (
            isinstance(value, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            return f"{name} is not a mapping of str to str: {value!r}"
    extra = rec.extra
    if extra is None:
        return None
    for dep in extra.deps or ():
        if not (
            len(dep) == 2
            and isinstance(dep[0], (int, str))
            and not isinstance(dep[0], bool)
            and dep[1] in _DEP_CONDITIONS
        ):
            return f"deps is not a list of [id or key, condition]: {extra.deps!r}"
    resources = extra.resources
    if resources is not None and not (
        isinstance(resources, dict)
        and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
            for k, v in resources.items()
        )
    ):
        return f"resources is not a mapping of name to amount: {resources!r}"
    return None


def _stand_in(row: tuple[Any, ...], codec: Codec) -> TaskRecord:
    """A record of what an undecodable row still tells (id, pool, key, status, attempt,
    times): enough to fail it, or to retain it when it had ended already. An unknown status
    reads as a live one (READY), so that the task fails."""

    def get(name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = row[COLUMN[name]]
        return value if isinstance(value, kind) and not isinstance(value, bool) else default

    rec = TaskRecord(
        None,
        get("pool", str, ""),
        cls=get("priority", int, 2),
        kind=get("kind", str, ""),
        key=get("key", str, None),
        tenant=get("tenant", str, None),
    )
    rec.id = row[COLUMN["id"]]
    rec.seq = get("seq", int, 0)
    rec.attempt = max(0, get("attempt", int, 0))
    rec.message = get("message", str, None)
    status = get("status", str, "")
    rec.status = STATUS_NAMES.index(status) if status in STATUS_NAMES else READY
    arrival, updated, started = (
        get("arrival", int, 0),
        get("updated", int, 0),
        get("started", int, 0),
    )
    rec.submitted_at = from_ns(arrival)
    rec.started_at = from_ns(started) if started else 0.0
    if rec.status >= FIRST_TERMINAL:
        rec.finished_at = from_ns(updated)
        output = row[COLUMN["output"]]
        if isinstance(output, bytes) and rec.status == SUCCEEDED:
            with contextlib.suppress(Exception):
                rec.output = codec.decode(output)
    return rec


def _schedule(name: str, spec_text: str, payload: bytes | None, codec: Codec) -> Recurring:
    """A stored schedule's definition back as a Recurring (state comes from resume_recurring)."""
    spec = json.loads(spec_text)
    try:
        cron = parse_cron(spec["cron"])
        tz = zone(spec["tz"])
    except CronError as e:
        raise ValueError(str(e)) from None
    return Recurring(
        name=name,
        spec=cron,
        tz=tz,
        payload=None if payload is None else codec.decode(payload),
        pool=spec["pool"],
        cls=spec["priority"],
        kind=spec["kind"],
        key=spec["key"],
        tenant=spec["tenant"],
        deadline_in=spec["deadline_in"],
        duration_hint=spec["duration_hint"],
        timeout=spec["timeout"],
        retry=retry_from(spec["retry"]),
        resources=spec["resources"],
        tags=spec["tags"],
        labels=spec["labels"],
        overlap=spec["overlap"],
        tolerance=spec["tolerance"],
        on_miss=spec["on_miss"],
        cron=spec["cron"],
        tz_name=spec["tz"],
    )
