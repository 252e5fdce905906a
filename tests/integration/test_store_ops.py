"""What a store keeps of an operator's actions and of ended tasks (docs/durability.md, "What a
store keeps"): paused pools, deletions from the history, the payloads and options of tasks that
ended without succeeding (to submit them again), and the attempts of a retried task with the
worker of each.

Each test of the first part runs with each store: `MemoryStore` (handles on one `MemoryState`),
`SqliteStore` (a file under tmp_path) and `PostgresStore` (a schema of the test's own on the
real server of tests/conftest.py). A restart is a new `Scheduler` on a new handle of the same
store after a clean shutdown. The second part opens stores of the previous schema version.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from cronoq import (
    Permanent,
    Pool,
    PostgresStore,
    Resource,
    Retryable,
    RetryPolicy,
    Scheduler,
    SqliteStore,
    TaskContext,
    TaskFailed,
    TaskHandle,
)
from cronoq.core.model import FAILED, READY, RETRYING, Extras, PastAttempt, TaskRecord
from cronoq.store import Batch, MemoryState, MemoryStore, Store, Stored
from cronoq.store.base import COLUMN, TASK_COLUMNS, first_id
from cronoq.store.codec import JsonCodec
from cronoq.store.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION
from cronoq.store.rows import insert_row, record_from_row, update_row
from cronoq.store.sqlite import _SCHEMA_V1, MIGRATIONS, SCHEMA_VERSION
from helpers import pgstore

LEASE: dict[str, Any] = {"lease_ttl": 30.0, "lease_renew": 1.0, "lock_poll": 0.02}
CODEC = JsonCodec()
T0 = 1_800_000_000.0
ONCE_AGAIN = RetryPolicy(2, 0.01, 2.0, 0.05, jitter=False)  # one retry, almost at once
EU = {"zone": "eu"}  # the labels of the worker group the labeled tasks run in


class Stores:
    """stores() -> a new handle (a new "process") on the one store of a test."""

    def __init__(self, kind: str, path: Path, pg: pgstore.Where | None) -> None:
        self.kind = kind
        self.path = path
        self.state = MemoryState()
        self.pg = pg

    def __call__(self) -> Store:
        if self.kind == "postgres":
            assert self.pg is not None
            return PostgresStore(self.pg.url, schema=self.pg.schema)
        if self.kind == "sqlite":
            return SqliteStore(self.path, full_sync=False, **LEASE)
        return MemoryStore(self.state, **LEASE)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    # (the PostgreSQL server starts with the first test that needs it)
    pg = request.getfixturevalue("pg") if request.param == "postgres" else None
    return Stores(request.param, tmp_path / "store.db", pg)


def scheduler(
    store: Store, executor: Callable[..., Any], pools: Sequence[str] = ("default",)
) -> Scheduler:
    return Scheduler(
        [Pool(name, executor, max=2, initial=2, autoscale=False) for name in pools],
        store=store,
        resources=[Resource.semaphore("db", 4)],
        shutdown_grace=0.1,
    )


@contextlib.asynccontextmanager
async def running(sched: Scheduler) -> AsyncIterator[Scheduler]:
    await sched.start()
    try:
        yield sched
    finally:
        await sched.shutdown()


async def ended(handle: TaskHandle) -> TaskFailed:
    """The failure a task that did not succeed ended with."""
    with pytest.raises(TaskFailed) as info:
        await asyncio.wait_for(handle.result(), 10.0)
    return info.value


async def echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


# --- with each store ---------------------------------------------------------------------------


async def test_a_paused_pool_stays_paused_across_restarts_until_resumed(stores: Stores) -> None:
    async with running(scheduler(stores(), echo, ("default", "other"))) as s1:
        assert await s1.pause("default") is True
        assert await s1.pause("default") is False
        assert await s1.pause("other") is True
    # "other" is not configured this time: its pause is ignored, and kept.
    async with running(scheduler(stores(), echo)) as s2:
        pool = (await s2.snapshot()).pool("default")
        assert pool is not None and pool.paused
        held = await s2.submit("held")
        await s2.snapshot()  # (every decision due now is taken first: nothing starts)
        assert await s2.status(held.id) == "ready"
        assert await s2.resume("default") is True
        assert await asyncio.wait_for(held.result(), 10.0) == "held"
    async with running(scheduler(stores(), echo, ("default", "other"))) as s3:
        snap = await s3.snapshot()
        assert [(p.name, p.paused) for p in snap.pools] == [("default", False), ("other", True)]


async def test_a_task_deleted_from_the_history_stays_deleted(stores: Stores) -> None:
    async def refuse(ctx: TaskContext, payload: Any) -> Any:
        raise Permanent("no")

    async with running(scheduler(stores(), refuse)) as s1:
        gone = await s1.submit("a", key="gone")
        kept = await s1.submit("b", key="kept")
        await ended(gone)
        await ended(kept)
        await s1.pause("default")
        live = await s1.submit("c")
        assert await s1.delete([gone.id, live.id]) == 1  # a live task is never deleted
        assert await s1.status(gone.id) is None
    async with running(scheduler(stores(), refuse)) as s2:
        assert await s2.status(gone.id) is None
        assert await s2.status("gone") is None
        assert await s2.stored(gone.id) is None  # no row left
        assert await s2.status(kept.id) == "failed"
        assert await s2.status(live.id) == "ready"
        # The key is free again.
        again = await s2.submit("d", key="gone")
        assert not again.duplicate


async def test_tasks_that_ended_without_succeeding_are_resubmitted_after_a_restart(
    stores: Stores,
) -> None:
    """One task failed (a permanent error after a retry), one was dead-lettered (its retries
    ran out): after a restart both keep their payload, options and earlier attempts, and
    their copies run with them."""
    options: dict[str, Any] = {
        "priority": "high",
        "kind": "report",
        "tenant": "acme",
        "deadline_in": 600,
        "duration_hint": 0.5,
        "timeout": 30,
        "retry": ONCE_AGAIN,
        "tags": {"team": "ops"},
        "labels": EU,
        "resources": {"db": 2},
    }
    payloads = ({"n": 1, "data": [1, 2]}, {"n": 2})

    async def fail(ctx: TaskContext, payload: Any) -> Any:
        if payload["n"] == 1 and ctx.attempt == 2:
            raise Permanent("attempt 2 refused")
        raise Retryable(f"attempt {ctx.attempt} failed")

    async with running(scheduler(stores(), fail)) as s1:
        await s1.set_group_capacity("default", EU, 2)
        handles = [await s1.submit(p, **options) for p in payloads]
        assert [(await ended(h)).status for h in handles] == ["failed", "dead_lettered"]
    ids = [h.id for h in handles]
    seen: list[TaskContext] = []

    async def record(ctx: TaskContext, payload: Any) -> Any:
        seen.append(ctx)
        return payload

    async with running(scheduler(stores(), record)) as s2:
        await s2.set_group_capacity("default", EU, 2)
        for task_id, payload in zip(ids, payloads, strict=True):
            rec = s2.serving().lookup(task_id)
            assert rec is not None
            assert (rec.payload, rec.attempt) == (payload, 2)
            assert (rec.cls, rec.kind, rec.tenant, rec.duration_hint, rec.timeout) == (
                1,
                "report",
                "acme",
                0.5,
                30,
            )
            assert (rec.tags, rec.labels) == ({"team": "ops"}, EU)
            assert rec.extra is not None and rec.extra.resources == {"db": 2}
            assert rec.retry is not None and rec.retry.max_attempts == 2
            assert rec.deadline is not None and rec.deadline > rec.submitted_at + 599
            (past,) = rec.past_attempts
            assert (past.number, past.outcome, past.message, past.worker) == (
                1,
                "failed",
                "attempt 1 failed",
                None,
            )
            assert past.started_at <= past.ended_at <= rec.finished_at
        copies = await s2.resubmit(ids)
        assert len(copies) == 2 and not set(copies) & set(ids)
        for copy, payload in zip(copies, payloads, strict=True):
            handle = await s2.handle(copy)
            assert handle is not None and await asyncio.wait_for(handle.result(), 10.0) == payload
    assert sorted(ctx.id for ctx in seen) == sorted(copies)
    for ctx in seen:
        assert (ctx.kind, ctx.key, ctx.tags, ctx.timeout, ctx.group) == (
            "report",
            None,
            {"team": "ops"},
            30,
            EU,
        )
        assert (ctx.task.cls, ctx.task.tenant, ctx.task.duration_hint) == (1, "acme", 0.5)


async def test_the_workers_of_a_tasks_attempts_are_kept(stores: Stores) -> None:
    """The rows as the durable driver writes them (store.rows) for a task that two remote
    workers ran: the worker of each attempt comes back with the record."""
    rec = TaskRecord({"p": 1}, "default", retry=RetryPolicy(3))
    rec.id, rec.seq, rec.submitted_at = first_id(1), 1, T0
    rec.status = READY
    store = stores()
    await store.open()
    await store.lead()
    await store.commit_nowait(
        Batch(inserts=[insert_row(rec, CODEC.encode(rec.payload), None, T0)], max_id=rec.id)
    )
    # Attempt 1 ran on w1 and failed: the task retries (a live change).
    rec.status, rec.attempt, rec.started_at, rec.worker = RETRYING, 1, T0 + 1, ("w1", 7)
    rec.ready_at = T0 + 3
    first = PastAttempt(1, T0 + 1, T0 + 2, "failed", "boom", ("w1", 7))
    rec.extra = Extras()
    rec.extra.history = [first]
    change, done = update_row(rec, None)
    assert not done
    await store.commit_nowait(Batch(updates=[change]))
    await store.close()
    store = stores()
    await store.open()
    await store.lead()
    back = _record(await store.load(), rec.id)
    assert (back.status, back.worker, back.past_attempts) == (RETRYING, ("w1", 7), (first,))
    # Attempt 2 ran on w2 and its worker stopped heartbeating; attempt 3 failed on w1: the end.
    second = PastAttempt(2, T0 + 4, T0 + 5, "lease_expired", "lease expired", ("w2", 9))
    rec.extra.history = [first, second]
    rec.status, rec.attempt, rec.started_at, rec.worker = FAILED, 3, T0 + 6, ("w1", 8)
    rec.finished_at, rec.message = T0 + 7, "failed again"
    change, done = update_row(rec, None)
    assert done
    await store.commit_nowait(Batch(finishes=[change]))
    await store.close()
    store = stores()
    await store.open()
    await store.lead()
    stored = await store.load()
    back = _record(stored, rec.id)
    assert (back.status, back.attempt, back.worker) == (FAILED, 3, ("w1", 8))
    assert back.past_attempts == (first, second)
    assert back.payload == {"p": 1}
    # A store forgets an ended task's row when told to, and never a live one's.
    live = TaskRecord("x", "default")
    live.id, live.seq, live.submitted_at, live.status = rec.id + 1, 2, T0, READY
    await store.commit_nowait(Batch(inserts=[insert_row(live, b'"x"', None, T0)], max_id=live.id))
    await store.commit_nowait(Batch(deletes=[rec.id, live.id]))
    assert [row[COLUMN["id"]] for row in (await store.load()).tasks] == [live.id]
    await store.close()


def _record(stored: Stored, task_id: int) -> TaskRecord:
    (row,) = [r for r in stored.tasks if r[COLUMN["id"]] == task_id]
    rec, problem = record_from_row(row, CODEC)
    assert problem is None
    return rec


# --- stores of the previous schema version -----------------------------------------------------

# A version 4 task row: every column but worker and attempts (SQLite), a failed task.
_V4_COLUMNS = ", ".join(TASK_COLUMNS.split(", ")[: COLUMN["worker"]])


def _v4_row(tid: int, status: str, payload: bytes, key: str) -> tuple[Any, ...]:
    terminal = status not in ("ready", "running", "retrying")
    ns = time.time_ns() - 10**9  # (ended a second ago: still within the retention)
    row: list[Any] = [None] * COLUMN["worker"]
    for name, value in {
        "id": tid,
        "seq": tid,
        "arrival": ns,
        "pool": "default",
        "kind": "report",
        "priority": 1,
        "key": key,
        "payload": payload,
        "retry": "[2,0.5,2.0,10.0,false]",
        "tags": '{"team":"ops"}',
        "status": status,
        "terminal": 1 if terminal else 0,
        "attempt": 1 if terminal else 0,
        "updated": ns + 10**8,
        "message": "boom" if terminal else None,
    }.items():
        row[COLUMN[name]] = value
    return tuple(row)


async def test_a_version_4_sqlite_file_is_migrated_with_its_tasks_intact(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    epoch = 2
    failed, ready = first_id(epoch), first_id(epoch) + 1
    marks = ", ".join("?" * COLUMN["worker"])
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for stmt in _SCHEMA_V1:
            db.execute(stmt)
        for version in range(1, 4):
            for stmt in MIGRATIONS[version]:
                db.execute(stmt)
        db.execute(
            "INSERT INTO cronoq_meta (key, value) VALUES ('application', 'cronoq'), "
            "('schema_version', '4')"
        )
        db.execute("UPDATE cronoq_leader SET epoch = ?, max_id = ? WHERE id = 1", (epoch, ready))
        insert = f"INSERT INTO cronoq_tasks ({_V4_COLUMNS}) VALUES ({marks})"
        db.execute(insert, _v4_row(failed, "failed", b'{"old":1}', "f"))
        db.execute(insert, _v4_row(ready, "ready", b'{"old":2}', "r"))
    store = SqliteStore(path, full_sync=False, **LEASE)
    async with running(scheduler(store, echo)) as s1:
        rec = s1.serving().lookup(failed)
        assert rec is not None
        assert (rec.status_name, rec.payload, rec.message, rec.kind, rec.key) == (
            "failed",
            {"old": 1},
            "boom",
            "report",
            "f",
        )
        assert (rec.worker, rec.past_attempts, rec.tags) == (None, (), {"team": "ops"})
        live = await s1.handle("r")
        assert live is not None and await asyncio.wait_for(live.result(), 10.0) == {"old": 2}
        (copy,) = await s1.resubmit([failed])
        again = await s1.handle(copy)
        assert again is not None and await asyncio.wait_for(again.result(), 10.0) == {"old": 1}
        await s1.pause("default")
    with contextlib.closing(sqlite3.connect(path)) as db:
        version = db.execute("SELECT value FROM cronoq_meta WHERE key = 'schema_version'")
        assert version.fetchall() == [(str(SCHEMA_VERSION),)]
        assert db.execute("SELECT name, paused FROM cronoq_pools").fetchall() == [("default", 1)]
        rows = db.execute("SELECT id, worker, attempts FROM cronoq_tasks ORDER BY id").fetchall()
        assert rows == [(failed, None, None), (ready, None, None), (copy, None, None)]


async def test_a_version_5_postgresql_schema_is_migrated_with_its_tasks_intact(
    pg: pgstore.Where,
) -> None:
    """Version 5 is version 6 without the worker and attempts columns and cronoq_pools (and
    with a commit function of its own, which the migration replaces): made here from a fresh
    schema, then opened again."""
    store = PostgresStore(pg.url, schema=pg.schema)
    await store.open()
    await store.lead()
    tid = first_id(1)
    row = _v4_row(tid, "failed", b'{"old":1}', "f")
    await store.commit_nowait(Batch(inserts=[(*row, None, None)], max_id=tid))
    await store.close()
    await pgstore.execute(
        pg,
        "ALTER TABLE cronoq_tasks DROP COLUMN worker, DROP COLUMN attempts",
        "DROP TABLE cronoq_pools",
        "UPDATE cronoq_schema_version SET version = 5",
    )
    async with running(scheduler(PostgresStore(pg.url, schema=pg.schema), echo)) as s1:
        rec = s1.serving().lookup(tid)
        assert rec is not None
        assert (rec.status_name, rec.payload, rec.message, rec.key) == (
            "failed",
            {"old": 1},
            "boom",
            "f",
        )
        assert (rec.worker, rec.past_attempts) == (None, ())
        await s1.pause("default")  # (the new commit function writes the pools)
    assert await pgstore.fetch(pg, "SELECT version FROM cronoq_schema_version") == [
        (PG_SCHEMA_VERSION,)
    ]
    assert await pgstore.fetch(pg, "SELECT name, paused FROM cronoq_pools") == [("default", True)]
    assert await pgstore.fetch(pg, "SELECT worker, attempts FROM cronoq_tasks") == [(None, None)]
