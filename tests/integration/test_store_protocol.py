"""The `cronoq.store.Store` protocol, through each of its stores (docs/durability.md, "Stores").

Every test of the first part runs against `SqliteStore` (a file under tmp_path), `MemoryStore`
(a shared `MemoryState`) and `PostgresStore` (a schema of the test's own on the real server of
tests/conftest.py): two handles on one store are two processes on one file. PostgreSQL has no
lease (docs/durability.md, "PostgreSQL"): the leadership lasts as long as the holder's lock
session, so where a test lets a lease run out, its PostgreSQL variant ends that session
(`pg_terminate_backend`), which is what a lease running out stands for. The second part uses
what only `MemoryStore` has: `pause()` (a stalled disk) and `crash()` (the process dying), to
check what a new `Scheduler` recovers from what was committed.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cronoq import (
    Pool,
    PostgresStore,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    SqliteStore,
    TaskContext,
)
from cronoq.runtime import SchedulerState
from cronoq.store import (
    Batch,
    Finished,
    LeadershipLost,
    MemoryState,
    MemoryStore,
    Store,
    Stored,
)
from cronoq.store.base import COLUMN, TASK_COLUMNS, check_store, first_id, to_ns
from helpers import pgstore
from helpers.waiting import deposed

# Leases long enough never to run out by accident; SHORT where a test waits for one to run out
# (a few tenths of a second). The memory tests freeze the state's clock instead.
LEASE: dict[str, Any] = {"lease_ttl": 30.0, "lease_renew": 1.0, "lock_poll": 0.02}
SHORT: dict[str, Any] = {"lease_ttl": 0.3, "lease_renew": 0.1}
# The rows of these tests ended near 1970: a PostgreSQL leader reloads finished tasks of the
# last `reload_finished` seconds only (test_store_postgres.py tests that window), so here it
# covers them all, as the other stores' load() does.
RELOAD_ALL = 1e10
WIDTH = len(TASK_COLUMNS.split(", "))


def row(
    tid: int,
    *,
    status: str = "ready",
    key: str | None = None,
    deps: str | None = None,
    updated: int = 0,
    output: bytes | None = None,
    attempt: int = 0,
) -> tuple[Any, ...]:
    """A task row (TASK_COLUMNS order) with only what these tests look at filled in."""
    values: list[Any] = [None] * WIDTH
    terminal = status not in ("blocked", "scheduled", "ready", "running", "retrying")
    fields = {
        "id": tid,
        "seq": tid,
        "arrival": 0,
        "pool": "default",
        "kind": "",
        "priority": 2,
        "key": key,
        "payload": b'"p"',
        "deps": deps,
        "status": status,
        "terminal": 1 if terminal else 0,
        "attempt": attempt,
        "updated": updated,
        "output": output,
    }
    for name, value in fields.items():
        values[COLUMN[name]] = value
    return tuple(values)


def finish(
    tid: int, status: str, *, updated: int = 5, output: bytes | None = None
) -> tuple[Any, ...]:
    """A Batch.finishes row: (status, attempt, updated, message, output, key, started, worker,
    attempts, id)."""
    return (status, 1, updated, f"{status} message", output, None, 3, None, None, tid)


class Opener:
    """opener(**options) -> a new handle (a new "process") on the one store of a test."""

    def __init__(self, kind: str, path: Path, pg: pgstore.Where | None = None) -> None:
        self.kind = kind
        self.path = path
        self.state = MemoryState()
        self.pg = pg

    def __call__(self, **options: Any) -> Store:
        options = {**LEASE, **options}
        if self.kind == "postgres":
            assert self.pg is not None
            # (no lease options: the lock lasts as long as its session)
            kept = {"retention": options["retention"]} if "retention" in options else {}
            return PostgresStore(
                self.pg.url, schema=self.pg.schema, reload_finished=RELOAD_ALL, **kept
            )
        if self.kind == "sqlite":
            return SqliteStore(self.path, full_sync=False, **options)
        return MemoryStore(self.state, **options)

    async def steal(self) -> None:
        """Another process takes the leadership in the store itself (new epoch, new holder),
        while the handle that led still believes its lease is good."""
        far = to_ns(4e9)
        if self.kind == "postgres":
            assert self.pg is not None
            # (the deposed handle keeps its lock session: only the fencing epoch tells it)
            await pgstore.execute(self.pg, "UPDATE cronoq_leader SET epoch = epoch + 1")
        elif self.kind == "sqlite":
            db = sqlite3.connect(self.path)
            with db:
                db.execute(
                    "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'thief', "
                    "expires_unix_ns = ?",
                    (far,),
                )
            db.close()
        else:
            self.state.epoch += 1
            self.state.holder = "thief"
            self.state.expires = 4e9

    async def end_lease(self) -> None:
        """PostgreSQL: what a lease running out stands for, the holder's lock session ending
        (pg_terminate_backend of it) while its process lives on."""
        assert self.pg is not None
        await pgstore.end_lock_session(self.pg)


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    # (the PostgreSQL server starts with the first test that needs it)
    pg = request.getfixturevalue("pg") if request.param == "postgres" else None
    return Opener(request.param, tmp_path / "store.db", pg)


async def leader(opener: Opener, **options: Any) -> Store:
    store = opener(**options)
    await store.open()
    await store.lead()
    return store


# --- the protocol, with both stores ---------------------------------------------------------------


def test_every_store_implements_the_protocol(tmp_path: Path) -> None:
    # The static check is in cronoq/store/__init__.py (mypy); this is the runtime one.
    pg = PostgresStore("postgresql://nobody@127.0.0.1:1/none")  # (connects at open() only)
    for store in (SqliteStore(tmp_path / "x.db"), MemoryStore(), pg):
        assert isinstance(store, Store)
        assert check_store(store) is store
    assert not (tmp_path / "x.db").exists()


def test_a_store_without_the_methods_is_refused_by_name() -> None:
    class Half:
        retention = 1.0

        async def open(self) -> None: ...

        async def lead(self) -> int:
            return 1

    with pytest.raises(TypeError) as info:
        Scheduler([Pool("default", lambda ctx, p: p)], store=Half())  # type: ignore[arg-type]
    assert str(info.value) == (
        "store must implement cronoq.store.Store, like cronoq.SqliteStore (got Half without "
        "load(), commit_nowait(), renew(), prune(), finished(), close(), lease_renew)"
    )


async def test_commit_load_and_look_up_finished_tasks(opener: Opener) -> None:
    store = opener()
    await store.open()
    assert await store.lead() == 1
    assert await store.load() == Stored([], [], 0)
    batch = Batch(
        inserts=[row(first_id(1)), row(first_id(1) + 1, status="succeeded", output=b'"ok"')],
        schedules=[("nightly", '{"cron": "@daily"}', b"null", 123, None)],
        max_id=first_id(1) + 1,
    )
    await store.commit_nowait(batch)
    one, two = first_id(1), first_id(1) + 1
    # A live task is not "finished"; an unknown id is None.
    assert await store.finished(one) is None
    assert await store.finished(12345) is None
    found = await store.finished(two)
    assert isinstance(found, Finished)
    assert (found.id, found.status, found.output) == (two, "succeeded", b'"ok"')
    # A live update, then the task ends: only then is it found, with its row's new columns.
    await store.commit_nowait(
        Batch(updates=[("running", 1, None, None, None, 2, None, None, one)], max_id=two)
    )
    await store.commit_nowait(Batch(finishes=[finish(one, "failed", updated=77)], max_id=two))
    ended = await store.finished(one)
    assert ended is not None
    assert (ended.status, ended.attempt, ended.message) == ("failed", 1, "failed message")
    assert (ended.finished_ns, ended.output) == (77, None)
    assert len(ended.row) == WIDTH
    # The high-water mark only goes up.
    await store.commit_nowait(Batch(max_id=5))
    await store.close()

    # Another "process" finds all of it, with the next epoch.
    again = opener()
    await again.open()
    assert await again.lead() == 2
    stored = await again.load()
    assert [r[COLUMN["id"]] for r in stored.tasks] == [one, two]
    assert [r[COLUMN["status"]] for r in stored.tasks] == ["failed", "succeeded"]
    assert stored.schedules == [("nightly", '{"cron": "@daily"}', b"null", 123, None)]
    assert stored.max_id == two
    # Schedules are replaced by name and removed by name.
    await again.commit_nowait(Batch(schedules=[("nightly", "{}", None, None, one)]))
    assert (await again.load()).schedules == [("nightly", "{}", None, None, one)]
    await again.commit_nowait(Batch(removed_schedules=["nightly"]))
    assert (await again.load()).schedules == []
    await again.close()


async def test_a_standby_leads_after_a_release_and_after_the_lease_runs_out(
    opener: Opener,
) -> None:
    first = await leader(opener)
    standby = opener()
    await standby.open()
    waiting = asyncio.create_task(standby.lead())
    await first.renew()  # the leader keeps its lease
    assert not waiting.done()
    await first.close(release=True)  # a clean stop gives it up: the standby leads at once
    assert await waiting == 2
    await standby.close()
    # A leader that dies keeps the lease until it runs out; the next epoch follows.
    dying = opener(**SHORT)
    await dying.open()
    assert await dying.lead() == 3
    if opener.kind == "postgres":
        # Its lock session ends while it lives on (and believes it leads): a new leader
        # follows as soon as the session is gone, and the old one learns it lost.
        await opener.end_lease()
    else:
        await dying.close(release=False)
    third = opener()
    await third.open()
    assert await third.lead() == 4
    if opener.kind == "postgres":
        await deposed(dying)
        with pytest.raises(LeadershipLost):
            await dying.commit_nowait(Batch(inserts=[row(first_id(3))], max_id=first_id(3)))
        await dying.close()
    await third.commit_nowait(Batch(inserts=[row(first_id(4))], max_id=first_id(4)))
    assert [r[COLUMN["id"]] for r in (await third.load()).tasks] == [first_id(4)]
    await third.close()


async def test_a_deposed_leader_is_fenced_and_writes_nothing(opener: Opener) -> None:
    old = await leader(opener)
    await old.commit_nowait(Batch(inserts=[row(first_id(1))], max_id=first_id(1)))
    await opener.steal()
    fenced = Batch(inserts=[row(first_id(1) + 1)], finishes=[finish(first_id(1), "succeeded")])
    with pytest.raises(LeadershipLost, match="fenced: leadership lost"):
        await old.commit_nowait(fenced)
    with pytest.raises(LeadershipLost):
        await old.renew()
    with pytest.raises(LeadershipLost):
        await old.prune(4e9)
    assert await old.finished(first_id(1)) is None  # reads still work; nothing was written
    stored = await old.load()
    assert [r[COLUMN["status"]] for r in stored.tasks] == ["ready"]
    await old.close(release=True)  # does not release the thief's lease


async def test_a_leader_whose_lease_ran_out_is_fenced(opener: Opener) -> None:
    old = await leader(opener, **SHORT)
    if opener.kind == "postgres":
        await opener.end_lease()  # (its lock session ends: the lock is free)
    new = opener()
    await new.open()
    assert await new.lead() == 2  # waits until the old lease has run out
    with pytest.raises(LeadershipLost):
        await old.commit_nowait(Batch(inserts=[row(first_id(1))]))
    await new.commit_nowait(Batch(inserts=[row(first_id(2))], max_id=first_id(2)))
    assert [r[COLUMN["id"]] for r in (await new.load()).tasks] == [first_id(2)]
    await old.close()
    await new.close()


async def test_prune_drops_old_finished_rows_but_not_parents_of_blocked_tasks(
    opener: Opener,
) -> None:
    store = await leader(opener, retention=10.0)
    old = to_ns(1000.0)
    recent = to_ns(1995.0)
    await store.commit_nowait(
        Batch(
            inserts=[
                row(1, status="succeeded", updated=old, output=b"1"),  # pruned
                row(2, status="failed", updated=old),  # parent of 5 by id: kept
                row(3, status="succeeded", key="parent", updated=old),  # parent of 5 by key
                row(4, status="succeeded", updated=recent),  # too recent
                row(5, status="blocked", deps='[[2, "success"], ["parent", "success"]]'),
                row(6, status="ready", updated=old),  # live rows are never pruned
                row(7, status="cancelled", updated=old),  # pruned
            ],
            max_id=7,
        )
    )
    assert await store.prune(2000.0) == 2  # before 1990 s
    assert [r[COLUMN["id"]] for r in (await store.load()).tasks] == [2, 3, 4, 5, 6]
    assert await store.finished(1) is None
    assert await store.finished(2) is not None
    assert await store.prune(2000.0) == 0
    await store.close()


# --- MemoryStore: stalls and crashes ----------------------------------------------------------


class FrozenClock:
    """The memory state's lease clock: still until a test moves it."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_store_crash_drops_what_is_not_committed() -> None:
    clock = FrozenClock()
    state = MemoryState(clock)
    store = MemoryStore(state, **LEASE)
    await store.open()
    await store.lead()
    await store.commit_nowait(Batch(inserts=[row(first_id(1))], max_id=first_id(1)))
    store.pause()
    held = store.commit_nowait(Batch(inserts=[row(first_id(1) + 1)], max_id=first_id(1) + 1))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not held.done() and len(state.tasks) == 1  # a stalled disk writes nothing
    store.crash()
    with pytest.raises(SchedulerError, match="crashed"):
        await held
    with pytest.raises(SchedulerError, match="crashed"):
        await store.renew()
    await store.close()  # a dead process closes nothing, and keeps its lease until it runs out
    assert state.holder == store.holder
    after = MemoryStore(state, **LEASE)
    await after.open()
    waiting = asyncio.create_task(after.lead())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()  # the clock stands still: the dead leader's lease holds
    clock.now += LEASE["lease_ttl"]
    assert await waiting == 2
    stored = await after.load()
    assert [r[COLUMN["id"]] for r in stored.tasks] == [first_id(1)]
    assert stored.max_id == first_id(1)
    await after.close()


async def test_memory_store_writes_a_batch_whole_or_not_at_all() -> None:
    store = MemoryStore(**LEASE)
    await store.open()
    await store.lead()
    await store.commit_nowait(Batch(inserts=[row(1)], max_id=1))
    with pytest.raises(ValueError, match="UNIQUE"):
        await store.commit_nowait(Batch(inserts=[row(2), row(1)], max_id=2))
    with pytest.raises(ValueError, match="columns"):
        await store.commit_nowait(Batch(inserts=[row(3)], updates=[("running", 1)]))
    stored = await store.load()
    assert [r[COLUMN["id"]] for r in stored.tasks] == [1]
    assert stored.max_id == 1
    with pytest.raises(SchedulerError, match="not open"):
        MemoryStore().commit_nowait(Batch())
    await store.close()


async def test_a_new_scheduler_recovers_what_a_crashed_one_committed() -> None:
    """Acknowledged tasks survive a crash, an unacknowledged one does not, and the attempt that
    was running when the process died is not run again with its number."""
    clock = FrozenClock()
    state = MemoryState(clock)
    runs: list[tuple[Any, int]] = []
    started = asyncio.Event()
    gate = asyncio.Event()

    async def run(ctx: TaskContext, payload: Any) -> Any:
        runs.append((payload, ctx.attempt))
        if payload == "block":
            started.set()
            await gate.wait()
        return payload

    def scheduler() -> tuple[Scheduler, MemoryStore]:
        store = MemoryStore(state, **LEASE)
        pool = Pool("default", run, max=4, autoscale=False)
        return Scheduler([pool], store=store), store

    first, store = scheduler()
    await first.start()
    done = await first.submit("quick", key="quick")
    assert await done == "quick"
    blocked = await first.submit("block", key="block", retry=RetryPolicy(max_attempts=3))
    later = await first.submit("later", key="later", start_in=3600)
    await started.wait()  # attempt 1 of "block" runs: its start is committed
    store.pause()
    lost = asyncio.create_task(first.submit("lost", key="lost"))
    while await first.status("lost") is None:  # admitted in memory, not yet acknowledged
        await asyncio.sleep(0)
    store.crash()
    with pytest.raises(SchedulerError, match="crashed"):
        await lost
    with pytest.raises(SchedulerError, match="crashed"):
        await first.status("quick")
    assert first._life.state is SchedulerState.LOST
    await first.shutdown()  # nothing left to stop

    gate.set()
    clock.now += LEASE["lease_ttl"]  # the dead leader's lease runs out
    second, _ = scheduler()
    await second.start()
    try:
        assert await second.status("quick") == "succeeded"
        assert await (await second.handle("quick")) == "quick"  # type: ignore[misc]
        assert await second.status("later") == "scheduled"
        assert await second.status("lost") is None
        again = await second.handle(blocked.id)
        assert again is not None
        assert await again == "block"
        assert [a for p, a in runs if p == "block"] == [1, 2]
        assert (await second.handle(later.id)) is not None
        fresh = await second.enqueue("next")
        assert fresh == first_id(2)  # ids of the new epoch never repeat the old ones
    finally:
        await second.shutdown()
    assert second._life.state is SchedulerState.STOPPED
    assert state.holder is None  # a clean shutdown gives the lease up
