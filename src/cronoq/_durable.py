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
from typing import Any

from .core.cron import CronError, parse_cron, zone
from .core.engine import Actions, Engine, Journal
from .core.model import FAILED, SUCCEEDED, Attempt, StatusEvent, TaskRecord
from .core.recurring import Recurring
from .errors import SchedulerError
from .store.codec import Codec, encode_with
from .store.rows import insert_row, record_from_row, retry_from, schedule_row, update_row
from .store.sqlite import Batch, SqliteStore, Stored, from_ns

log = logging.getLogger("cronoq")

Release = Callable[[list[Attempt], list[TaskRecord], list[StatusEvent]], None]


def encode_payload(codec: Codec, payload: Any) -> bytes:
    """Encode a payload at submission; what the codec cannot store is the caller's TypeError."""
    try:
        return encode_with(codec, payload)
    except Exception as e:
        raise TypeError(
            f"payload cannot be stored by the scheduler's codec: {type(e).__name__}: {e}"
        ) from None


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
        store: SqliteStore,
        codec: Codec,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        release: Release,
        lost: Callable[[str], None],
    ) -> None:
        self.store = store
        self.codec = codec
        self.engine = engine
        self.loop = loop
        self.release = release
        self.lost = lost
        self.encoded: dict[int, bytes] = {}  # payloads of admitted tasks not yet written
        self.templates: dict[str, bytes] = {}  # encoded template payloads of schedules
        self.removed: list[str] = []  # schedules removed since the last commit
        self.group = _Group()
        self.failed: str | None = None
        self._writer: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        engine.journal = Journal()

    # --- start-up ------------------------------------------------------------------------

    def recover(self, stored: Stored, now: float) -> None:
        """Give the engine back the stored tasks and schedules (see Engine.restore)."""
        eng = self.engine
        recs = []
        broken = []
        for row in stored.tasks:
            rec, problem = record_from_row(row, self.codec)
            if problem is not None:
                log.error("task %d cannot resume: %s", rec.id, problem)
                rec.status, rec.message, rec.finished_at = FAILED, problem, now
                rec.extra = None
                broken.append(rec)
            recs.append(rec)
        eng.restore(recs, now)
        journal = eng.journal
        assert journal is not None
        journal.added.clear()  # their rows exist
        for rec in broken:
            journal.changed[rec.id] = rec
        for name, spec_text, payload, next_ns, last_id in stored.schedules:
            try:
                sched = _schedule(name, spec_text, payload, self.codec)
            except Exception as e:
                log.error("recurring schedule %r removed: cannot read it back: %s", name, e)
                self.removed.append(name)
                continue
            self.templates[name] = payload
            eng.resume_recurring(sched, None if next_ns is None else from_ns(next_ns), last_id, now)

    def start(self) -> None:
        self._keeper = self.loop.create_task(self._keep())

    # --- each turn -----------------------------------------------------------------------

    def hold(self, out: Actions) -> None:
        """Keep a turn's actions (aborts excepted: the driver carries them out at once) until
        its changes are committed."""
        g = self.group
        if out.starts:
            g.starts += out.starts
        if out.finished:
            g.finished += out.finished
        if out.events:
            g.events += out.events
        self.flush()

    def ack(self) -> asyncio.Future[None]:
        """A future that completes when everything decided so far is on disk."""
        fut = self.loop.create_future()
        self.group.acks.append(fut)
        self.flush()
        return fut

    def flush(self) -> None:
        if self._writer is None and self.failed is None:
            self._writer = self.loop.create_task(self._write())

    async def _write(self) -> None:
        eng = self.engine
        try:
            while True:
                journal = eng.journal
                assert journal is not None
                group = self.group
                g_busy = group.starts or group.finished or group.events or group.acks
                if not (journal or self.removed or g_busy):
                    return
                self.group = _Group()
                if journal or self.removed:
                    eng.journal = Journal()
                    batch = self._batch(journal, time.time())
                    try:
                        await self.store.commit(batch)
                    except Exception as e:
                        self._fail(e, group)
                        return
                self._release(group)
        finally:
            self._writer = None

    def _release(self, group: _Group) -> None:
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
        for rec in changed.values():
            batch.updates.append(update_row(rec, self._output(rec), now))
        recurring = self.engine.recurring
        for name, sched in journal.schedules.items():
            if recurring.get(name) is sched:
                batch.schedules.append(schedule_row(sched, self.templates[name]))
        if self.removed:
            batch.removed_schedules, self.removed = self.removed, []
        return batch

    def _output(self, rec: TaskRecord) -> bytes | None:
        if rec.status != SUCCEEDED or rec.output is None:
            return None
        try:
            return encode_with(self.codec, rec.output)
        except Exception as e:
            log.warning("result of task %d not stored: cannot encode it: %s", rec.id, e)
            return None

    def _fail(self, e: Exception, group: _Group) -> None:
        message = str(e) if isinstance(e, SchedulerError) else f"store write failed: {e}"
        self.failed = message
        log.error("scheduler stops: %s", message)
        for fut in group.acks + self.group.acks:
            if not fut.done():
                fut.set_exception(SchedulerError(message))
        self.lost(message)

    async def _keep(self) -> None:
        """Renew the lease while idle and prune old terminal rows now and then."""
        store = self.store
        prune_every = max(1.0, min(60.0, store.retention / 2))
        next_prune = time.monotonic()
        while self.failed is None:
            try:
                if self._writer is None:
                    await store.renew()
                if time.monotonic() >= next_prune:
                    await store.prune(time.time())
                    next_prune = time.monotonic() + prune_every
            except Exception as e:
                self._fail(e, _Group())
                return
            await asyncio.sleep(store.lease_renew)

    # --- shutdown ------------------------------------------------------------------------

    async def close(self, release_lease: bool) -> None:
        """Finish the writes in flight, stop renewing and close the file."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        while self._writer is not None and self.failed is None:
            await asyncio.shield(self._writer)
        await self.store.close(release=release_lease and self.failed is None)


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
