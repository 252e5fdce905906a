"""What is PostgreSQL's own in `PostgresStore` (docs/durability.md, "PostgreSQL"), on the real
server of tests/conftest.py, each test in a schema of its own.

The protocol every store keeps is tested in test_store_protocol.py (PostgreSQL included); here:
the schema's shape and the start-up refusals, schemas as separate clusters, the migration lock,
unsigned 64-bit ids, NUL characters, pruning and what a new leader reloads, the epoch wrap, the
keeper (a terminated lock session), retried commits, a database that is down at open(), and
corrupt rows. What the store does is checked by reading the schema with a connection of the
test's own (helpers/pgstore.py), and by ending the store's sessions with pg_terminate_backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from cronoq import (
    Dep,
    Pool,
    PostgresStore,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    TaskContext,
    TaskFailed,
)
from cronoq.runtime import SchedulerState
from cronoq.store import Batch, LeadershipLost, Stored
from cronoq.store.base import COLUMN, TASK_COLUMNS, first_id, to_ns
from cronoq.store.postgres import SCHEMA_VERSION, _columns
from helpers import pgstore
from helpers.pgstore import Where, execute, fetch
from helpers.ports import free_port
from helpers.waiting import deposed, until

WIDTH = len(TASK_COLUMNS.split(", "))
JSON_COLUMNS = ("retry", "deps", "resources", "tags", "labels", "worker", "attempts")
SHARD_200 = 200 << 56  # the first id bits of shard number 200: bit 63 is set
CORRUPT = "corrupt task row: "


def row(tid: int, **values: Any) -> tuple[Any, ...]:
    """A full task row (TASK_COLUMNS order): every column filled, `values` replacing some."""
    status = values.get("status", "ready")
    terminal = status not in ("blocked", "scheduled", "ready", "running", "retrying")
    fields: dict[str, Any] = {
        "id": tid,
        "seq": 7,
        "arrival": 1_700_000_000_123_456_789,
        "pool": "default",
        "kind": "report",
        "priority": 1,
        "key": None,
        "payload": b'{"p": 1}',
        "deadline": 1_700_000_100_000_000_000,
        "fixed_start": 1_700_000_050_000_000_000,
        "tolerance": 2.5,
        "on_miss": "skip",
        "duration_hint": 0.25,
        "timeout": 30.0,
        "retry": "[3,0.5,2.0,10.0,true]",
        "deps": None,
        "resources": '{"gpu":1}',
        "tags": '{"team":"a"}',
        "labels": '{"env":"test"}',
        "tenant": "acme",
        "status": status,
        "terminal": 1 if terminal else 0,
        "attempt": 1,
        "updated": 1_700_000_000_000_000_001,
        "message": None,
        "output": None,
        "eligible": 1_700_000_000_500_000_000,
        "not_before": None,
        "started": 1_700_000_000_600_000_000,
        **values,
    }
    out: list[Any] = [None] * WIDTH
    for name, value in fields.items():
        out[COLUMN[name]] = value
    return tuple(out)


def parsed(r: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row with its JSON columns parsed (jsonb keeps the value, not the spelling)."""
    out = list(r)
    for name in JSON_COLUMNS:
        i = COLUMN[name]
        out[i] = None if out[i] is None else json.loads(out[i])
    return tuple(out)


def ids(stored: Stored) -> list[int]:
    return [r[COLUMN["id"]] for r in stored.tasks]


@contextlib.asynccontextmanager
async def opened(where: Where, **options: Any) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(where.url, schema=where.schema, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def leading(where: Where, **options: Any) -> AsyncIterator[PostgresStore]:
    async with opened(where, **options) as store:
        await store.lead()
        yield store


async def snapshot(where: Where) -> dict[str, Any]:
    """Everything of the schema that a refused open() must leave as it was."""
    objects = await fetch(
        where,
        "SELECT c.relname, c.relkind, pg_get_userbyid(c.relowner) FROM pg_class AS c "
        "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1",
        where.schema,
    )
    out: dict[str, Any] = {"objects": objects}
    for table in sorted(name for name, kind, _ in objects if kind == "r"):
        out[table] = sorted(map(repr, await fetch(where, f"SELECT * FROM {table}")))
    out["locks"] = await pgstore.lock_pids(where)
    return out


# --- the schema ------------------------------------------------------------------------------


async def test_a_fresh_schema_has_the_documented_shape(pg: Where) -> None:
    async with opened(pg) as store:
        assert store.status == "open"
        # Before anyone leads: the current version, the leader row (1, 0, 0), no lock held.
        assert await fetch(pg, "SELECT id, version FROM cronoq_schema_version") == [
            (1, SCHEMA_VERSION)
        ]
        assert await fetch(pg, "SELECT id, epoch, max_id FROM cronoq_leader") == [(1, 0, 0)]
        assert await pgstore.lock_pids(pg) == []
        columns = await fetch(
            pg,
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = $1 "
            "ORDER BY table_name, ordinal_position",
            pg.schema,
        )
        by_table: dict[str, list[tuple[Any, ...]]] = {}
        for table, *rest in columns:
            by_table.setdefault(table, []).append(tuple(rest))
        assert sorted(by_table) == [
            "cronoq_leader",
            "cronoq_pools",
            "cronoq_recurring",
            "cronoq_schema_version",
            "cronoq_tasks",
        ]
        assert by_table["cronoq_schema_version"] == [
            ("id", "smallint", "NO", None),
            ("version", "integer", "NO", None),
        ]
        assert by_table["cronoq_leader"] == [
            ("id", "smallint", "NO", None),
            ("epoch", "integer", "NO", None),
            ("max_id", "bigint", "NO", "0"),
        ]
        tasks = {name: (kind, default) for name, kind, _, default in by_table["cronoq_tasks"]}
        assert list(tasks) == [
            "id", "seq", "arrival_unix_ns", "pool", "kind", "priority", "key", "payload",
            "deadline_unix_ns", "fixed_at_unix_ns", "fixed_tolerance_ns", "fixed_on_miss",
            "duration_hint_ns", "timeout_ns", "retry", "deps", "resources", "tags", "labels",
            "tenant", "status", "terminal", "attempt", "updated_unix_ns", "message", "output",
            "eligible_unix_ns", "not_before_unix_ns", "started_unix_ns", "worker", "attempts",
        ]  # fmt: skip
        assert tasks["id"] == ("bigint", None)
        assert tasks["priority"] == ("smallint", None)
        assert tasks["payload"] == tasks["output"] == ("bytea", None)
        assert {tasks[c][0] for c in JSON_COLUMNS} == {"jsonb"}
        assert tasks["labels"][1] == "'[]'::jsonb"
        assert (tasks["tenant"], tasks["terminal"], tasks["attempt"]) == (
            ("text", None),
            ("boolean", None),
            ("integer", None),
        )
        assert {kind for name, (kind, _) in tasks.items() if name.endswith("_ns")} == {"bigint"}
        assert [c[:2] for c in by_table["cronoq_recurring"]] == [
            ("name", "text"),
            ("spec", "jsonb"),
            ("template_payload", "bytea"),
            ("next_unix_ns", "bigint"),
            ("last_task_id", "bigint"),
        ]
        assert by_table["cronoq_pools"] == [
            ("name", "text", "NO", None),
            ("paused", "boolean", "NO", None),
        ]
        keys = await fetch(
            pg,
            "SELECT tc.table_name, kcu.column_name FROM information_schema.table_constraints tc "
            "JOIN information_schema.key_column_usage kcu USING (constraint_schema, "
            "constraint_name) WHERE tc.table_schema = $1 AND tc.constraint_type = 'PRIMARY KEY' "
            "ORDER BY 1",
            pg.schema,
        )
        assert keys == [
            ("cronoq_leader", "id"),
            ("cronoq_pools", "name"),
            ("cronoq_recurring", "name"),
            ("cronoq_schema_version", "id"),
            ("cronoq_tasks", "id"),
        ]
        indexes = dict(
            await fetch(
                pg,
                "SELECT indexname, regexp_replace(indexdef, ' ON \\S+', ' ON') FROM pg_indexes "
                "WHERE schemaname = $1 AND tablename = 'cronoq_tasks' "
                "AND indexname <> 'cronoq_tasks_pkey'",
                pg.schema,
            )
        )
        # (key, id): keyed rows only, or all of them
        assert indexes.pop("cronoq_tasks_key_id") in (
            "CREATE INDEX cronoq_tasks_key_id ON USING btree (key, id)",
            "CREATE INDEX cronoq_tasks_key_id ON USING btree (key, id) WHERE (key IS NOT NULL)",
        )
        assert indexes == {
            "cronoq_tasks_live_key": "CREATE UNIQUE INDEX cronoq_tasks_live_key ON USING btree "
            "(key) WHERE ((key IS NOT NULL) AND (NOT terminal))",
            "cronoq_tasks_live": "CREATE INDEX cronoq_tasks_live ON USING btree (id) "
            "WHERE (NOT terminal)",
            "cronoq_tasks_done": "CREATE INDEX cronoq_tasks_done ON USING btree "
            "(updated_unix_ns) WHERE terminal",
        }
        # Leading: the epoch goes to 1, and the lock (1668444017, the schema's OID) is held.
        assert await store.lead() == 1
        assert store.status == "leading"
        assert await fetch(pg, "SELECT id, epoch, max_id FROM cronoq_leader") == [(1, 1, 0)]
        held = await fetch(
            pg,
            "SELECT pid, objsubid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid = $1 AND objid = $2::bigint::oid",
            pgstore.LOCK_CLASS,
            await oid(pg),
        )
        assert held == [(await pgstore.lock_pid(pg), 2)]  # (2: the two-int4 form of the key)
    assert store.status == "closed"
    assert await pgstore.lock_pids(pg) == []  # closing frees it


async def oid(where: Where) -> int:
    ((value,),) = await fetch(
        where, "SELECT oid::bigint FROM pg_namespace WHERE nspname = $1", where.schema
    )
    return int(value)


async def test_a_newer_schema_version_is_refused_and_left_unchanged(pg: Where) -> None:
    async with leading(pg) as store:
        await store.commit_nowait(Batch(inserts=[row(first_id(1))], max_id=first_id(1)))
    newer_version = SCHEMA_VERSION + 1
    await execute(pg, ("UPDATE cronoq_schema_version SET version = $1", (newer_version,)))
    before = await snapshot(pg)
    newer = PostgresStore(pg.url, schema=pg.schema)
    with pytest.raises(SchedulerError) as info:
        await asyncio.wait_for(newer.open(), 5.0)
    assert str(info.value) == (
        f"store {pg.url} schema={pg.schema}: schema version {newer_version} is newer than this "
        f"cronoq supports ({SCHEMA_VERSION})"
    )
    assert await snapshot(pg) == before
    with pytest.raises(SchedulerError, match="not open"):
        await newer.lead()
    await newer.close()  # (nothing to close)


@contextlib.asynccontextmanager
async def role(where: Where, name: str) -> AsyncIterator[str]:
    """A login role that is not a superuser; yields the server's URL as that role."""
    await execute(where, f"CREATE ROLE {name} LOGIN")
    parts = urlsplit(where.url)
    host = parts.netloc.rpartition("@")[2]
    try:
        yield urlunsplit((parts.scheme, f"{name}@{host}", parts.path, parts.query, ""))
    finally:
        await execute(where, f"DROP OWNED BY {name} CASCADE", f"DROP ROLE {name}")


class As:
    """The test's schema on the server, as another role."""

    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.schema = schema


async def test_tables_owned_by_another_role_are_refused_and_a_superusers_are_not(
    pg: Where,
) -> None:
    name = f"mallory_{pg.schema}"
    async with role(pg, name) as url:
        mallory = As(url, pg.schema)
        # (a role that may not create the schema: refused as any unusable store is)
        with pytest.raises(SchedulerError, match="cannot prepare the schema: Insufficient"):
            await asyncio.wait_for(PostgresStore(url, schema=pg.schema).open(), 5.0)
        # Another role plants a table with a trigger in the schema before cronoq ever ran.
        await execute(
            pg, f"CREATE SCHEMA {pg.schema}", f"GRANT USAGE, CREATE ON SCHEMA {pg.schema} TO {name}"
        )
        await execute(
            mallory,
            "CREATE TABLE cronoq_tasks (id bigint PRIMARY KEY)",
            "CREATE FUNCTION steal() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RETURN NEW; END $$",
            "CREATE TRIGGER steal BEFORE INSERT ON cronoq_tasks FOR EACH ROW "
            "EXECUTE FUNCTION steal()",
        )
        before = await snapshot(pg)
        store = PostgresStore(pg.url, schema=pg.schema)
        with pytest.raises(SchedulerError) as info:
            await asyncio.wait_for(store.open(), 5.0)
        assert str(info.value).endswith(
            "tables owned by a role that is neither this connection's nor a superuser: "
            f"cronoq_tasks (owned by {name})"
        )
        assert await snapshot(pg) == before

        # Tables a superuser owns are accepted, also by a role that is not one: the superuser
        # (this test's role) sets the schema up, the other role runs the scheduler on it.
        await execute(pg, "DROP TABLE cronoq_tasks")
        async with leading(pg) as store:
            await store.commit_nowait(Batch(inserts=[row(first_id(1))], max_id=first_id(1)))
        await execute(
            pg,
            f"REVOKE CREATE ON SCHEMA {pg.schema} FROM {name}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {pg.schema} TO {name}",
        )
        async with leading(mallory) as store:
            assert store.epoch == 2
            assert ids(await store.load()) == [first_id(1)]
            await store.commit_nowait(Batch(inserts=[row(first_id(2))], max_id=first_id(2)))
            assert ids(await store.load()) == [first_id(1), first_id(2)]


async def test_two_schemas_of_one_database_share_nothing(pg: Where) -> None:
    other = As(pg.url, pg.schema + "_b")
    everything = {"reload_finished": 1e10}
    async with leading(pg, **everything) as a, leading(other, **everything) as b:
        # Two leaders at once, each with its own lock and epoch.
        assert (a.epoch, b.epoch) == (1, 1)
        assert len(await pgstore.lock_pids(pg)) == len(await pgstore.lock_pids(other)) == 1
        assert await pgstore.lock_pids(pg) != await pgstore.lock_pids(other)
        # The same live key in both, and ids that do not collide.
        await a.commit_nowait(Batch(inserts=[row(first_id(1), key="k")], max_id=first_id(1)))
        await b.commit_nowait(
            Batch(inserts=[row(first_id(1), key="k", status="succeeded")], max_id=first_id(1))
        )
        await b.commit_nowait(
            Batch(inserts=[row(first_id(1) + 1, key="k")], max_id=first_id(1) + 1)
        )
        assert [r[COLUMN["status"]] for r in (await a.load()).tasks] == ["ready"]
        assert [r[COLUMN["status"]] for r in (await b.load()).tasks] == ["succeeded", "ready"]
        assert await a.finished(first_id(1)) is None  # live here, finished there
        found = await b.finished(first_id(1))
        assert found is not None and found.status == "succeeded"
        assert (await a.load()).max_id == first_id(1)
        assert (await b.load()).max_id == first_id(1) + 1
        # A standby of one schema does not take the other's leadership.
        standby = PostgresStore(pg.url, schema=other.schema)
        await standby.open()
        try:
            waiting = asyncio.create_task(standby.lead())
            await until(lambda: standby.status.startswith("standing by"), what="the standby")
            await a.close()
            assert await pgstore.lock_pids(pg) == []
            await a.open()
            assert await a.lead() == 2  # the schema's own next epoch
            assert not waiting.done()
        finally:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            await standby.close()


async def test_concurrent_opens_of_a_fresh_schema_wait_for_the_migration_lock(pg: Where) -> None:
    stores = [PostgresStore(pg.url, schema=pg.schema) for _ in range(6)]
    async with pgstore.connected(pg) as holder:
        # Hold the migration lock (1668444013, hashtext(schema)): every open() waits for it.
        await holder.execute(
            "SELECT pg_advisory_lock($1, hashtext($2))", pgstore.MIGRATION_CLASS, pg.schema
        )
        opening = [asyncio.create_task(s.open()) for s in stores]

        async def all_waiting() -> bool:
            rows = await fetch(
                pg,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND classid = $1",
                pgstore.MIGRATION_CLASS,
            )
            return rows == [(len(stores),)]

        await until(all_waiting, 5.0, "every open() to wait for the migration lock")
        assert not any(t.done() for t in opening)
        assert await fetch(pg, "SELECT 1 FROM pg_namespace WHERE nspname = $1", pg.schema) == []
        await holder.execute(
            "SELECT pg_advisory_unlock($1, hashtext($2))", pgstore.MIGRATION_CLASS, pg.schema
        )
        await asyncio.wait_for(asyncio.gather(*opening), 5.0)  # one creates, the others check
    try:
        assert await fetch(pg, "SELECT * FROM cronoq_schema_version") == [(1, SCHEMA_VERSION)]
        assert await fetch(pg, "SELECT * FROM cronoq_leader") == [(1, 0, 0)]
        # Each leads in turn with the next epoch.
        for n, store in enumerate(stores, 1):
            assert await store.lead() == n
            await store.close()
    finally:
        for store in stores:
            await store.close()


# --- values ----------------------------------------------------------------------------------


async def test_ids_with_bit_63_set_round_trip_and_order_by_unsigned_value(pg: Where) -> None:
    one, two, top = SHARD_200 | 1, SHARD_200 | 2, (1 << 64) - 1
    small = first_id(1)
    parent = row(two, status="succeeded", output=b'"out"', updated=5)
    rows = [
        row(top, key="top"),
        row(one, deps=f'[[{two},"success"]]', status="blocked"),
        parent,
        row(small),
    ]
    async with leading(pg, reload_finished=1e10) as store:
        await store.commit_nowait(
            Batch(
                inserts=rows,
                schedules=[("nightly", '{"cron":"@daily"}', b"t", 123, one)],
                max_id=top,
            )
        )
        # (stored in two's complement: the raw column is negative)
        assert await fetch(pg, "SELECT max_id FROM cronoq_leader") == [(-1,)]
        stored = await store.load()
        assert ids(stored) == [small, one, two, top]  # unsigned order
        assert [parsed(r) for r in stored.tasks] == [parsed(r) for r in sorted(rows)]
        assert stored.max_id == top
        assert stored.schedules == [("nightly", '{"cron": "@daily"}', b"t", 123, one)]
        found = await store.finished(two)
        assert found is not None and (found.id, found.output) == (two, b'"out"')
        assert found.row == stored.tasks[2]

    # The high-water mark follows the unsigned value: a smaller id never lowers it, even one
    # whose signed value is greater.
    await execute(pg, "DELETE FROM cronoq_tasks")  # (max_id stays -1, that is 2^64 - 1)
    async with leading(pg, reload_finished=1e10) as store:
        await store.commit_nowait(Batch(inserts=[row(one)], max_id=one))
        assert (await store.load()).max_id == top
    await execute(pg, ("UPDATE cronoq_leader SET max_id = $1", (SHARD_200 - (1 << 64),)))
    async with leading(pg, reload_finished=1e10) as store:
        await store.commit_nowait(Batch(inserts=[row(small + 1)], max_id=small + 1))
        assert (await store.load()).max_id == SHARD_200 | 1  # the stored row's id
        await store.commit_nowait(Batch(inserts=[row(two)], max_id=two))
        assert (await store.load()).max_id == two
        await store.commit_nowait(Batch(inserts=[row(small + 2)], max_id=small + 2))
        assert (await store.load()).max_id == two
        # Updates and finishes find bit-63 rows by their id.
        await store.commit_nowait(
            Batch(
                updates=[("running", 2, "m", None, None, 9, None, None, one)],
                finishes=[("failed", 1, 11, "f", None, None, 3, None, None, two)],
            )
        )
        by_id = {r[COLUMN["id"]]: r for r in (await store.load()).tasks}
        assert by_id[one][COLUMN["status"]] == "running"
        assert by_id[one][COLUMN["attempt"]] == 2
        assert (by_id[two][COLUMN["status"]], by_id[two][COLUMN["terminal"]]) == ("failed", 1)
        assert list(by_id) == [small + 1, small + 2, one, two]


async def test_nul_characters_are_stored_as_replacement_characters(pg: Where) -> None:
    payload = b"\x00binary\x00"
    nul = row(
        first_id(1),
        key="k\0ey",
        kind="ki\0nd",
        tenant="te\0nant",
        message="m\0",
        tags='{"t\\u0000":"x\\u0000"}',
        labels='{"l":"\\u0000"}',
        payload=payload,
    )
    async with leading(pg, reload_finished=1e10) as store:
        await store.commit_nowait(
            Batch(
                inserts=[nul, row(first_id(1) + 1, key="live\0")],
                schedules=[("sch\0ed", '{"key":"k\\u0000"}', b"\x00", None, None)],
                max_id=first_id(1) + 1,
            )
        )
        (got, live) = (await store.load()).tasks
        assert got[COLUMN["key"]] == "k\ufffdey"
        assert got[COLUMN["kind"]] == "ki\ufffdnd"
        assert got[COLUMN["tenant"]] == "te\ufffdnant"
        assert got[COLUMN["message"]] == "m\ufffd"
        assert json.loads(got[COLUMN["tags"]]) == {"t\ufffd": "x\ufffd"}
        assert json.loads(got[COLUMN["labels"]]) == {"l": "\ufffd"}
        assert got[COLUMN["payload"]] == payload  # bytes are bytes
        assert (await store.load()).schedules == [
            ("sch\ufffded", '{"key": "k\ufffd"}', b"\x00", None, None)
        ]
        # Changes of live and finished tasks too (message, a finished task's key, workers and
        # the messages of earlier attempts).
        worker = '["w\\u0000",3]'
        attempts = '[[1,5,6,"failed","m\\u0000",["w\\u0000",2]]]'
        await store.commit_nowait(
            Batch(
                updates=[("running", 1, "up\0", None, None, None, worker, None, first_id(1))],
                finishes=[
                    (
                        "failed",
                        1,
                        5,
                        "done\0",
                        None,
                        "live\0x",
                        None,
                        None,
                        attempts,
                        first_id(1) + 1,
                    )
                ],
                pools=[("po\0ol", True)],
            )
        )
        stored = await store.load()
        (got, live) = stored.tasks
        assert got[COLUMN["message"]] == "up\ufffd"
        assert json.loads(got[COLUMN["worker"]]) == ["w\ufffd", 3]
        assert (live[COLUMN["message"]], live[COLUMN["key"]]) == ("done\ufffd", "live\ufffdx")
        assert json.loads(live[COLUMN["attempts"]]) == [
            [1, 5, 6, "failed", "m\ufffd", ["w\ufffd", 2]]
        ]
        assert stored.paused == ["po\ufffdol"]
        # A schedule is replaced and removed by its name as given.
        await store.commit_nowait(Batch(schedules=[("sch\0ed", "{}", None, 1, None)]))
        assert (await store.load()).schedules == [("sch\ufffded", "{}", None, 1, None)]
        await store.commit_nowait(Batch(removed_schedules=["sch\0ed"]))
        assert (await store.load()).schedules == []


# --- retention -------------------------------------------------------------------------------


async def test_prune_deletes_1000_rows_per_statement_and_keeps_parents_of_live_tasks(
    pg: Where,
) -> None:
    now = time.time()
    old, recent = to_ns(now - 3600), to_ns(now - 10)
    done = {"status": "succeeded", "updated": old}
    by_id, by_key, of_finished = SHARD_200 | 1, first_id(1) + 1, first_id(1) + 2
    rows = [row(n, **done) for n in range(1, 2501)]  # pruned
    rows += [
        row(by_id, **done),  # parent by id (bit 63 set) of a blocked task: kept
        row(by_key, **done, key="parent"),  # parent by key of a ready task: kept
        row(first_id(1) + 3, **done, key="parent"),  # another finished "parent": kept too
        row(of_finished, **done),  # parent of a finished task only: pruned
        row(first_id(1) + 4, status="failed", updated=recent),  # too recent: kept
        row(first_id(1) + 5, status="ready", updated=old),  # live: kept
        row(first_id(1) + 6, status="blocked", deps=f'[[{by_id},"success"]]'),
        row(first_id(1) + 7, status="ready", deps='[["parent","failure"]]'),
        row(first_id(1) + 8, **done, deps=f'[[{of_finished},"success"]]'),  # pruned
    ]
    async with leading(pg, retention=60.0, reload_finished=1e10) as store:
        await store.commit_nowait(Batch(inserts=rows, max_id=by_id))
        # Each DELETE statement logs how many rows it took.
        await execute(
            pg,
            "CREATE TABLE prune_log (n bigint, at serial)",
            "CREATE FUNCTION log_prune() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO prune_log (n) SELECT count(*) FROM gone; RETURN NULL; END $$",
            "CREATE TRIGGER log_prune AFTER DELETE ON cronoq_tasks REFERENCING OLD TABLE AS "
            "gone FOR EACH STATEMENT EXECUTE FUNCTION log_prune()",
        )
        assert await store.prune(now) == 2502
        assert await fetch(pg, "SELECT n FROM prune_log ORDER BY at") == [(1000,), (1000,), (502,)]
        assert ids(await store.load()) == [
            first_id(1) + 1,
            first_id(1) + 3,
            first_id(1) + 4,
            first_id(1) + 5,
            first_id(1) + 6,
            first_id(1) + 7,
            by_id,
        ]
        assert await store.prune(now) == 0
        assert await fetch(pg, "SELECT n FROM prune_log ORDER BY at") == [
            (1000,), (1000,), (502,), (0,)
        ]  # fmt: skip
        # Once its children have ended, a parent goes as any old row.
        await store.commit_nowait(
            Batch(
                finishes=[
                    ("succeeded", 1, old, None, None, None, None, None, None, first_id(1) + 6),
                    ("succeeded", 1, old, None, None, None, None, None, None, first_id(1) + 7),
                ]
            )
        )
        assert await store.prune(now) == 5
        assert ids(await store.load()) == [first_id(1) + 4, first_id(1) + 5]
        assert (await store.load()).max_id == by_id  # pruning never lowers the mark


async def test_a_new_leader_reloads_live_recent_and_needed_finished_tasks_only(
    pg: Where,
) -> None:
    now = time.time()
    old, recent = to_ns(now - 3600), to_ns(now - 10)
    n = first_id(1)
    rows = [
        row(n, status="ready", updated=old),  # live: loaded
        row(n + 1, status="succeeded", updated=recent, output=b"1"),  # recent: loaded
        row(n + 2, status="succeeded", updated=old, output=b'"old"'),  # old: not loaded
        row(n + 3, status="failed", updated=old),  # parent by id of n + 6: loaded
        row(n + 4, status="succeeded", updated=old, key="pk"),  # parent by key of n + 7
        row(SHARD_200 | 9, status="cancelled", updated=old),  # parent by id of n + 7
        row(n + 5, status="failed", updated=old),  # parent of a finished task: not loaded
        row(n + 6, status="blocked", deps=f'[[{n + 3},"failure"]]'),
        row(n + 7, status="retrying", deps=f'[["pk","success"],[{SHARD_200 | 9},"always"]]'),
        row(n + 8, status="skipped", updated=old, deps=f'[[{n + 5},"success"]]'),
    ]
    async with leading(pg, reload_finished=60.0) as store:
        await store.commit_nowait(Batch(inserts=rows, max_id=SHARD_200 | 9))
    async with leading(pg, reload_finished=60.0) as store:
        stored = await store.load()
        assert ids(stored) == [n, n + 1, n + 3, n + 4, n + 6, n + 7, SHARD_200 | 9]
        assert stored.max_id == SHARD_200 | 9
        # What is not loaded is still there to read.
        for tid, status, output in ((n + 2, "succeeded", b'"old"'), (n + 5, "failed", None)):
            found = await store.finished(tid)
            assert found is not None
            assert (found.id, found.status, found.output, found.finished_ns) == (
                tid,
                status,
                output,
                old,
            )
            assert parsed(found.row) == parsed(rows[[r[0] for r in rows].index(tid)])
        assert await store.finished(n) is None  # live
        assert await store.finished(n + 99) is None  # unknown


async def test_load_and_prune_survive_dependencies_of_any_shape(pg: Where) -> None:
    """A live row whose deps column holds something else than a list of edges (a corrupt
    row, which recovery then fails) must not make every load and prune fail."""
    now = time.time()
    old = to_ns(now - 3600)
    n = first_id(1)
    odd = ('{"a":1}', '"x"', "[1]", '[[1,2],{"b":2},null]', "3")
    rows = [row(n + i, status="blocked", deps=deps) for i, deps in enumerate(odd)]
    rows += [
        row(n + 10, status="succeeded", updated=old),  # nobody's parent: pruned
        row(n + 11, status="succeeded", updated=old, key="p"),  # parent by key: kept
        row(n + 12, status="ready", deps='[["p","success"]]'),
    ]
    async with leading(pg, retention=60.0, reload_finished=60.0) as store:
        await store.commit_nowait(Batch(inserts=rows, max_id=n + 12))
        assert ids(await store.load()) == [*(n + i for i in range(len(odd))), n + 11, n + 12]
        assert await store.prune(now) == 1
        assert await store.finished(n + 10) is None
        assert await store.finished(n + 11) is not None


# --- leadership --------------------------------------------------------------------------------


def make(
    where: Where, run: Callable[[TaskContext, Any], Awaitable[Any]], **options: Any
) -> Scheduler:
    store = PostgresStore(where.url, schema=where.schema, **options)
    retry = RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.1)
    pool = Pool("default", run, max=4, initial=4, autoscale=False, retry=retry)
    return Scheduler([pool], store=store, shutdown_grace=0.1)


async def echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


def store_of(sched: Scheduler) -> PostgresStore:
    store = sched._store
    assert isinstance(store, PostgresStore)
    return store


async def test_the_epoch_wraps_from_32767_to_1_and_ids_keep_growing(pg: Where) -> None:
    issued: list[int] = []

    async def session(expect_epoch: int, n: int) -> None:
        sched = make(pg, echo)
        await sched.start()
        try:
            assert store_of(sched).epoch == expect_epoch
            for i in range(n):
                h = await sched.submit(i)
                assert await asyncio.wait_for(h.result(), 3.0) == i
                issued.append(h.id)
        finally:
            await sched.shutdown()

    await session(1, 3)
    assert issued == [first_id(1), first_id(1) + 1, first_id(1) + 2]
    await execute(pg, "UPDATE cronoq_leader SET epoch = 32767")
    await session(1, 2)  # 32767 is followed by 1: its first id was issued already
    assert issued[3:] == [first_id(1) + 3, first_id(1) + 4]
    await execute(pg, "UPDATE cronoq_leader SET epoch = 32766")
    await session(32767, 2)
    assert issued[5:] == [first_id(32767), first_id(32767) + 1]
    await session(1, 2)  # wrapped again: ids go on from the highest one issued
    await session(2, 1)
    assert issued[7:] == [first_id(32767) + 2, first_id(32767) + 3, first_id(32767) + 4]
    assert issued == sorted(issued) and len(set(issued)) == len(issued)
    assert await fetch(pg, "SELECT epoch, max_id FROM cronoq_leader") == [(2, issued[-1])]
    # (the epoch stays below 2^15: every unsharded id fits a positive bigint)
    assert max(issued) < 1 << 63


async def test_a_terminated_lock_session_loses_the_leadership_to_a_standby(pg: Where) -> None:
    async with leading(pg) as first, opened(pg) as standby:
        await first.commit_nowait(Batch(inserts=[row(first_id(1))], max_id=first_id(1)))
        waiting = asyncio.create_task(standby.lead())
        await until(lambda: standby.status.startswith("standing by"), what="the standby")
        await first.renew()  # still leading
        pid = await pgstore.end_lock_session(pg)
        t0 = time.monotonic()
        await deposed(first, 3.0)  # the keeper (or the ended connection) tells it at once
        assert time.monotonic() - t0 < 3.0
        assert first.status.startswith("leadership lost: "), first.status
        with pytest.raises(LeadershipLost):
            await first.commit_nowait(Batch(inserts=[row(first_id(1) + 1)], max_id=0))
        with pytest.raises(LeadershipLost):
            await first.prune(4e9)
        assert await asyncio.wait_for(waiting, 3.0) == 2
        assert standby.status == "leading"
        assert await pgstore.lock_pid(pg) != pid
        assert ids(await standby.load()) == [first_id(1)]  # the fenced commit wrote nothing
        await standby.commit_nowait(Batch(inserts=[row(first_id(2))], max_id=first_id(2)))
        # The deposed store leads again once the new leader is gone.
        await standby.close()
        assert await asyncio.wait_for(first.lead(), 3.0) == 3
        led = time.monotonic()
        assert ids(await first.load()) == [first_id(1), first_id(2)]
        # Once its new keeper probed twice (the old keeper's last sleep has ended by then),
        # it still leads: nothing of the lost leadership deposes the new one.
        await until(
            lambda: first._probed > led + 0.5 or first.status != "leading",
            3.0,
            "the new keeper's second probe",
        )
        await first.renew()
        await first.commit_nowait(Batch(inserts=[row(first_id(3))], max_id=first_id(3)))
        assert first.status == "leading"


async def test_a_store_that_leads_again_is_not_deposed_by_its_lost_leadership(pg: Where) -> None:
    """The keeper of a lost leadership sleeps between probes; if the store leads again
    meanwhile, that keeper (and the closed connection's listener) must leave the new
    leadership alone."""
    async with leading(pg) as store:
        probed = store._probed
        await until(lambda: store._probed != probed, 3.0, "a keeper probe")
        # Right after a probe: the keeper sleeps for a second.
        await pgstore.end_lock_session(pg)
        await deposed(store, 0.9)
        assert await asyncio.wait_for(store.lead(), 0.9) == 2  # the lock is free at once
        led = time.monotonic()
        # Once the new keeper probed twice, the old one has woken up long since.
        await until(
            lambda: store._probed > led + 0.5 or store.status != "leading",
            3.0,
            "the new keeper's second probe",
        )
        assert store.status == "leading"
        await store.renew()
        await store.commit_nowait(Batch(inserts=[row(first_id(2))], max_id=first_id(2)))
        assert len(await pgstore.lock_pids(pg)) == 1


async def test_a_scheduler_whose_lock_session_ends_stops_and_a_standby_resumes_its_work(
    pg: Where,
) -> None:
    gate = asyncio.Event()
    runs: list[tuple[str, int]] = []

    async def run(ctx: TaskContext, payload: Any) -> Any:
        runs.append((payload, ctx.attempt))
        if ctx.attempt == 1 and payload == "slow":
            await gate.wait()
        return f"{payload} {ctx.attempt}"

    first, second = make(pg, run), make(pg, run)
    await first.start()
    standby = asyncio.create_task(second.start())
    try:
        slow = await first.submit("slow", key="slow")
        await until(lambda: runs == [("slow", 1)], what="the first attempt")
        await until(lambda: store_of(second).status.startswith("standing by"), what="standby")
        await pgstore.end_lock_session(pg)
        await until(lambda: first._life.state is SchedulerState.LOST, 3.0, "the leader to stop")
        with pytest.raises(TaskFailed):
            await slow
        with pytest.raises(SchedulerError):
            await first.submit("refused")
        await asyncio.wait_for(standby, 3.0)
        assert store_of(second).epoch == 2
        again = await second.handle("slow")
        assert again is not None
        # The attempt that ran when the leadership was lost counts as used.
        assert await asyncio.wait_for(again.result(), 3.0) == "slow 2"
        later = await second.submit("later")
        assert later.id == first_id(2) and await later == "later 1"
    finally:
        gate.set()
        standby.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await standby
        await first.shutdown()
        await second.shutdown()
    assert runs == [("slow", 1), ("slow", 2), ("later", 1)]


# --- the database's failures -------------------------------------------------------------------


async def test_commits_are_retried_when_the_pools_sessions_are_terminated(
    pg: Where, caplog: pytest.LogCaptureFixture
) -> None:
    app = f"cronoq_{pg.schema}"
    where = As(pgstore.with_params(pg.url, application_name=app), pg.schema)
    caplog.set_level(logging.WARNING, logger="cronoq")
    async with leading(where) as store:
        lock = await pgstore.lock_pid(pg)
        await store.commit_nowait(Batch(inserts=[row(first_id(1))], max_id=first_id(1)))
        # Between commits: every session of the store's pool ends.
        pool = [pid for pid in await pgstore.sessions(pg, app) if pid != lock]
        assert pool
        await pgstore.terminate(pg, pool)
        await store.commit_nowait(Batch(inserts=[row(first_id(1) + 1)], max_id=first_id(1) + 1))
        assert ids(await store.load()) == [first_id(1), first_id(1) + 1]

        # During a commit: it waits for the leader row (which the test holds), its session is
        # terminated, and the commit is retried on a new one.
        async def waiting() -> list[int]:
            return await lock_waiters(pg, app)

        async with pgstore.connected(pg) as blocker, blocker.transaction():
            await blocker.execute("SELECT 1 FROM cronoq_leader FOR UPDATE")
            commit = store.commit_nowait(
                Batch(inserts=[row(first_id(1) + 2)], max_id=first_id(1) + 2)
            )
            (victim,) = await until(waiting, 3.0, "the commit to wait for the leader row")
            await pgstore.terminate(pg, [victim])

            async def retried() -> list[int]:
                return [pid for pid in await waiting() if pid != victim]

            await until(retried, 3.0, "the commit to wait again, on another session")
            assert not commit.done()
        await asyncio.wait_for(commit, 3.0)
        assert ids(await store.load()) == [first_id(1), first_id(1) + 1, first_id(1) + 2]
        await store.renew()  # the lock session was never touched: still leading
        assert await pgstore.lock_pid(pg) == lock
    retried = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert any("terminating connection due to administrator command" in m for m in retried)


async def test_a_session_lost_inside_a_transaction_is_retried_with_its_own_error(
    pg: Where, caplog: pytest.LogCaptureFixture
) -> None:
    """prune() runs a transaction of several statements: when its session ends inside it, the
    retry's warning says why the session ended, not that the rollback found it closed."""
    app = f"cronoq_{pg.schema}"
    where = As(pgstore.with_params(pg.url, application_name=app), pg.schema)
    caplog.set_level(logging.WARNING, logger="cronoq")
    async with leading(where, retention=60.0) as store:
        async with pgstore.connected(pg) as blocker, blocker.transaction():
            await blocker.execute("SELECT 1 FROM cronoq_leader FOR UPDATE")
            pruning = asyncio.ensure_future(store.prune(time.time()))
            # (its fenced check waits for the leader row, which the test holds)
            (victim,) = await until(
                lambda: lock_waiters(pg, app), 3.0, "the prune to wait for the leader row"
            )
            await pgstore.terminate(pg, [victim])

            async def retried() -> list[int]:
                return [pid for pid in await lock_waiters(pg, app) if pid != victim]

            await until(retried, 3.0, "the prune to wait again, on another session")
        assert await asyncio.wait_for(pruning, 3.0) == 0
    warnings = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert warnings
    assert all("terminating connection due to administrator command" in m for m in warnings), (
        warnings
    )


async def lock_waiters(pg: Where, app: str) -> list[int]:
    """The sessions of `app` waiting for a lock (the leader row the test holds)."""
    rows = await fetch(
        pg,
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
        app,
    )
    return [pid for (pid,) in rows]


async def proxy(listen: int, target: tuple[str, int]) -> asyncio.Server:
    """A TCP proxy from 127.0.0.1:listen to target (the real server)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*target)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, "127.0.0.1", listen)


def moved(url: str, netloc_host: str) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@{netloc_host}" if user else netloc_host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


async def test_open_retries_while_the_database_is_unreachable(
    pg: Where, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens here until the proxy starts
    where = As(moved(pg.url, f"127.0.0.1:{port}"), pg.schema)
    store = PostgresStore(where.url, schema=where.schema)
    caplog.set_level(logging.WARNING, logger="cronoq")
    opening = asyncio.create_task(store.open())
    server = None
    try:
        await until(lambda: store.status.startswith("database unreachable: "), what="a retry")
        assert not opening.done()
        server = await proxy(port, pgstore.address(pg.url))
        await asyncio.wait_for(opening, 5.0)
        assert store.status == "open"
        assert await store.lead() == 1
        await store.commit_nowait(Batch(inserts=[row(first_id(1))], max_id=first_id(1)))
        assert ids(await store.load()) == [first_id(1)]
    finally:
        opening.cancel()
        await store.close()
        if server is not None:
            server.close()
    assert any("cannot connect" in r.getMessage() for r in caplog.records)
    assert await fetch(pg, "SELECT id FROM cronoq_tasks") == [(first_id(1),)]


async def test_a_wrong_database_name_fails_at_once(pg: Where) -> None:
    parts = urlsplit(pg.url)
    url = urlunsplit((parts.scheme, parts.netloc, "/no_such_db", "password=secret", ""))
    store = PostgresStore(url, schema=pg.schema)
    t0 = time.monotonic()
    with pytest.raises(SchedulerError) as info:
        await asyncio.wait_for(store.open(), 5.0)
    assert time.monotonic() - t0 < 2.0  # not retried (the first retry waits 0.5 s)
    message = str(info.value)
    assert message.startswith(f"store {parts.scheme}://{parts.netloc}/no_such_db schema=")
    assert 'database "no_such_db" does not exist' in message
    assert "secret" not in message
    assert not store.status.startswith("database unreachable")


def test_a_column_of_nulls_only_is_sent_as_one_null() -> None:
    """The commit function's unnest pads a NULL array with NULLs to the others' length, so a
    batch's column of NULLs goes as one NULL (asyncpg checks every element it sends); the
    round trips of such rows are those of test_store_protocol.py, run on PostgreSQL too."""
    rows = [(1, None, "a", None), (2, None, None, 0)]
    assert _columns(rows, 4) == [[1, 2], None, ["a", None], [None, 0]]
    assert _columns([], 4) == [None, None, None, None]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:secret@db.example:5432/app", "postgresql://u@db.example:5432/app"),
        (
            "postgres://u@db.example/app?password=secret&sslmode=verify-full",
            "postgres://u@db.example/app?sslmode=verify-full",
        ),
        (
            "postgresql://u:s%40cret@h1:5432,h2:5433/app?sslpassword=secret",
            "postgresql://u@h1:5432,h2:5433/app",
        ),
    ],
)
def test_repr_and_location_never_show_the_password(url: str, shown: str) -> None:
    store = PostgresStore(url, schema="s1", retention=60, reload_finished=30)
    assert repr(store) == (
        f"PostgresStore({shown!r}, schema='s1', retention=60.0, reload_finished=30.0)"
    )
    assert store.location == f"{shown} schema=s1"
    assert "secret" not in repr(store) and "cret" not in store.location


# --- corrupt rows ------------------------------------------------------------------------------


async def test_corrupt_task_rows_fail_their_task_only(pg: Where) -> None:
    runs: list[Any] = []

    async def run(ctx: TaskContext, payload: Any) -> Any:
        runs.append(payload)
        return payload

    first = make(pg, run, retention=60.0)
    await first.start()
    try:
        done = await first.submit("done", key="done")  # (a finished row is reloaded too)
        assert await done == "done"
        await first.set_capacity("default", 0)
        for key in ("good", "bad-retry", "bad-deps", "bad-tags"):
            await first.submit(key, key=key)
        child = await first.submit("child", key="child", deps=[Dep("bad-retry", on="failure")])
    finally:
        await first.shutdown()
    await execute(
        pg,
        "UPDATE cronoq_tasks SET retry = '\"x\"' WHERE key = 'bad-retry'",
        "UPDATE cronoq_tasks SET deps = '{\"a\": 1}' WHERE key = 'bad-deps'",
        "UPDATE cronoq_tasks SET tags = '[1, 2]' WHERE key = 'bad-tags'",
    )
    # (and one old enough to be pruned: the pruner looks at the corrupt rows' deps too)
    await execute(pg, "UPDATE cronoq_tasks SET updated_unix_ns = 0 WHERE key = 'done'")
    second = make(pg, run, retention=60.0)
    await second.start()
    try:

        async def pruned() -> bool:
            return await fetch(pg, "SELECT 1 FROM cronoq_tasks WHERE key = 'done'") == []

        await until(pruned, what="the old finished row to be pruned")
        for key in ("bad-retry", "bad-deps", "bad-tags"):
            h = await second.handle(key)
            assert h is not None
            with pytest.raises(TaskFailed) as info:
                await asyncio.wait_for(h.result(), 3.0)
            assert info.value.status == "failed"
            assert info.value.message.startswith(CORRUPT), info.value.message
        good = await second.handle("good")
        assert good is not None and await asyncio.wait_for(good.result(), 3.0) == "good"
        # A dependent of a corrupt task settles as after any failure.
        c = await second.handle(child.id)
        assert c is not None and await asyncio.wait_for(c.result(), 3.0) == "child"
    finally:
        await second.shutdown()
    assert sorted(runs) == ["child", "done", "good"]
    failed = await fetch(
        pg, "SELECT key, status, terminal, message FROM cronoq_tasks WHERE key LIKE 'bad-%' "
        "ORDER BY key"
    )  # fmt: skip
    assert [(k, s, t) for k, s, t, _ in failed] == [
        ("bad-deps", "failed", True),
        ("bad-retry", "failed", True),
        ("bad-tags", "failed", True),
    ]
    assert all(m.startswith(CORRUPT) for *_, m in failed), failed
    # Not loaded as live again: a third leader finds them failed and runs nothing.
    third = make(pg, run)
    await third.start()
    try:
        for key in ("bad-retry", "bad-deps", "bad-tags"):
            assert await third.status(key) == "failed"
    finally:
        await third.shutdown()
    assert sorted(runs) == ["child", "done", "good"]
    assert await fetch(
        pg, "SELECT key, message FROM cronoq_tasks WHERE key LIKE 'bad-%' ORDER BY key"
    ) == [(k, m) for k, *_, m in failed]
