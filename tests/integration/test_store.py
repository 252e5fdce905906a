"""The durable SqliteStore through the public API: real files under tmp_path, real schedulers.

docs/durability.md, plus issue 4's recovery rules. A "restart" shuts one
scheduler down and starts a new one (with a new SqliteStore) on the same file, inside one test;
what the file holds is checked with plain `sqlite3` where that is the clearest evidence.

Leases are short (lease_ttl=2, lease_renew=0.5, lock_poll=0.05) so that standby and retention
tests take about a second; every wait is bounded, so a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cronoq import (
    Codec,
    Dep,
    JsonCodec,
    Permanent,
    Pool,
    Retryable,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    SqliteStore,
    Task,
    TaskContext,
    TaskFailed,
)
from cronoq.store.base import signed
from cronoq.store.sqlite import _SCHEMA_V1, SCHEMA_VERSION
from helpers.waiting import until

LEASE: dict[str, Any] = {"lease_ttl": 2.0, "lease_renew": 0.5, "lock_poll": 0.05}
MSG_LOST = "attempt lost in failover; retries exhausted"
NEWER = SCHEMA_VERSION + 1  # a schema version this cronoq does not know
TOO_NEW = f"schema version {NEWER} is newer than this cronoq supports ({SCHEMA_VERSION})"
MSG_MISSED = "fixed start missed"
NO_RETRY = RetryPolicy(max_attempts=1)


def epoch_id(epoch: int, n: int = 1) -> int:
    """The n-th task id of a leadership epoch: epoch << 48 | n."""
    return epoch << 48 | n


# --- helpers -----------------------------------------------------------------------------------


class Recorder:
    """Executor: logs (id, attempt, payload, start time, end time) and returns the payload.

    `behave(ctx, payload)` (optional, async) runs first and may raise, block or return a value
    that replaces the payload as the result."""

    def __init__(self, behave: Callable[[TaskContext, Any], Awaitable[Any]] | None = None) -> None:
        self.behave = behave
        self.runs: list[dict[str, Any]] = []
        self.cancelled: list[tuple[int, int]] = []

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        run = {"id": ctx.id, "attempt": ctx.attempt, "payload": payload, "start": time.time()}
        self.runs.append(run)
        try:
            result = payload if self.behave is None else await self.behave(ctx, payload)
        except asyncio.CancelledError:
            self.cancelled.append((ctx.id, ctx.attempt))
            raise
        finally:
            run["end"] = time.time()
        return result

    def attempts(self, task_id: int) -> list[int]:
        return [r["attempt"] for r in self.runs if r["id"] == task_id]

    def run_of(self, task_id: int) -> dict[str, Any]:
        (run,) = [r for r in self.runs if r["id"] == task_id]
        return run


def make(
    path: Path,
    executor: Callable[..., Any],
    *,
    slots: int = 2,
    codec: Any = None,
    shard: int | None = None,
    **store_options: Any,
) -> Scheduler:
    store = SqliteStore(path, **{**LEASE, **store_options})
    pool = Pool("default", executor, max=slots, initial=slots, autoscale=False)
    return Scheduler([pool], store=store, codec=codec, shutdown_grace=0.1, shard=shard)


@contextlib.asynccontextmanager
async def running(sched: Scheduler) -> AsyncIterator[Scheduler]:
    await sched.start()
    try:
        yield sched
    finally:
        await sched.shutdown()


def query(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the file with a connection of our own (WAL lets it read beside the scheduler)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql, params).fetchall()


def execute(path: Path, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        for st in statements:
            sql, params = (st, ()) if isinstance(st, str) else st
            db.execute(sql, params)
        db.commit()


async def failure(awaitable: Awaitable[Any]) -> TaskFailed:
    with pytest.raises(TaskFailed) as info:
        await awaitable
    return info.value


# --- restart recovery --------------------------------------------------------------------------


async def test_pending_tasks_resume_after_restart(tmp_path: Path) -> None:
    """Queued, scheduled (fixed start in the future) and blocked tasks (on a key and on an id)
    are written before submit returns and resume in the next run; their dependencies, fixed
    start time and keys still hold there."""
    path = tmp_path / "cronoq.db"
    rec1 = Recorder()
    async with running(make(path, rec1)) as s1:
        await s1.set_capacity("default", 0)  # nothing starts in this run
        queued = await s1.submit({"q": 1}, key="queued")
        start_at = time.time() + 0.8
        parent = await s1.submit("parent", key="parent", start_at=start_at, tolerance=0.5)
        by_key = await s1.submit("by-key", after="parent")
        by_id = await s1.submit("by-id", deps=[Dep(parent.id, on="complete")])
        assert [queued.id, parent.id, by_key.id, by_id.id] == [epoch_id(1, n) for n in (1, 2, 3, 4)]
        assert [await s1.status(h.id) for h in (queued, parent, by_key, by_id)] == [
            "ready",
            "scheduled",
            "blocked",
            "blocked",
        ]
        doomed = await s1.submit("doomed", key="doomed")
        assert await s1.cancel("doomed") is True
        # acknowledged means on disk: the rows exist before the run ends
        stored = dict(query(path, "SELECT id, status FROM cronoq_tasks"))
        assert stored == {
            queued.id: "ready",
            parent.id: "scheduled",
            by_key.id: "blocked",
            by_id.id: "blocked",
            doomed.id: "cancelled",
        }
    assert rec1.runs == []

    rec2 = Recorder()
    async with running(make(path, rec2, slots=1)) as s2:
        assert await s2.status("parent") == "scheduled"
        assert await s2.status(by_key.id) == "blocked"
        assert await s2.status(by_id.id) == "blocked"
        assert await s2.status("doomed") == "cancelled"
        # the restored live key still deduplicates
        dup = await s2.submit("another payload", key="parent")
        assert dup.duplicate and dup.id == parent.id
        h = await s2.handle("queued")
        assert h is not None and h.id == queued.id and not h.duplicate
        assert await h == {"q": 1}
        # a new task gets an id of the second epoch
        fresh = await s2.submit("fresh")
        assert fresh.id == epoch_id(2, 1)  # the duplicate above took no id
        for ref in (parent.id, by_key.id, by_id.id):
            got = await s2.handle(ref)
            assert got is not None
            await asyncio.wait_for(got.result(), 2.0)
        assert await s2.status("parent") == "succeeded"

    p = rec2.run_of(parent.id)
    assert start_at - 0.01 <= p["start"] <= start_at + 0.2  # at its fixed time, not at restart
    for child in (by_key.id, by_id.id):
        assert rec2.run_of(child)["start"] >= p["end"]  # dependencies still held
        assert rec2.attempts(child) == [1]
    assert rec2.run_of(by_key.id)["payload"] == "by-key"
    assert doomed.id not in [r["id"] for r in rec2.runs]


async def test_fixed_start_that_passed_while_down_follows_on_miss(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    start_at = time.time() + 0.3
    # six slots: three fixed starts at one time fit in the reservable half of the pool
    async with running(make(path, Recorder(), slots=6)) as s1:
        handles = {
            miss: await s1.submit(miss, key=miss, start_at=start_at, tolerance=0.05, on_miss=miss)
            for miss in ("run_late", "skip", "fail")
        }
        assert {await s1.status(k) for k in handles} == {"scheduled"}
    await asyncio.sleep(max(0.0, start_at + 0.15 - time.time()))  # start + tolerance passed

    rec = Recorder()
    async with running(make(path, rec, slots=6)) as s2:
        late = await s2.handle("run_late")
        assert late is not None and await late == "run_late"
        skipped = await s2.handle("skip")
        assert skipped is not None
        e = await failure(skipped)
        assert (e.status, e.message, e.task_id) == ("missed", MSG_MISSED, handles["skip"].id)
        failed = await s2.handle("fail")
        assert failed is not None
        e = await failure(failed)
        assert (e.status, e.message) == ("failed", MSG_MISSED)
        assert await s2.status("skip") == "missed"
        assert await s2.status("fail") == "failed"
    assert [r["payload"] for r in rec.runs] == ["run_late"]
    assert rec.runs[0]["start"] > start_at + 0.05  # it did run late
    rows = dict(query(path, "SELECT key, status FROM cronoq_tasks"))
    assert rows == {"run_late": "succeeded", "skip": "missed", "fail": "failed"}


async def test_retrying_task_keeps_its_retry_time_and_attempt_number(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    failed_at: list[float] = []

    async def flaky(ctx: TaskContext, payload: Any) -> Any:
        if ctx.attempt == 1:
            failed_at.append(time.time())
            raise Retryable("try later", retry_after=1.0)
        return f"ok on attempt {ctx.attempt}"

    retry = RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    rec1 = Recorder(flaky)
    async with running(make(path, rec1)) as s1:
        h = await s1.submit("x", key="flaky", retry=retry)
        await until(
            lambda: query(path, "SELECT 1 FROM cronoq_tasks WHERE status = 'retrying'"),
            what="the retrying row",
        )
    ((attempt, message, not_before),) = query(
        path, "SELECT attempt, message, not_before FROM cronoq_tasks"
    )
    assert (attempt, message) == (1, "try later")
    assert abs(not_before / 1e9 - (failed_at[0] + 1.0)) < 0.05

    rec2 = Recorder(flaky)
    async with running(make(path, rec2)) as s2:
        assert await s2.status(h.id) == "retrying"
        got = await s2.handle("flaky")
        assert got is not None
        assert await asyncio.wait_for(got.result(), 3.0) == "ok on attempt 2"
    assert rec1.attempts(h.id) == [1]
    assert rec2.attempts(h.id) == [2]  # attempt numbers continue across the restart
    waited = rec2.run_of(h.id)["start"] - failed_at[0]
    assert 0.95 <= waited <= 1.3, waited  # at the stored retry time, not at once nor reset


async def test_results_and_keys_of_finished_tasks_survive_restart(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"

    async def outcome(ctx: TaskContext, payload: Any) -> Any:
        if payload == "permanent":
            raise Permanent("nope")
        if payload == "crash":
            raise ValueError("bad")
        return {"echo": payload, "attempt": ctx.attempt}

    rec1 = Recorder(outcome)
    async with running(make(path, rec1)) as s1:
        a = await s1.submit("a", key="a")
        b = await s1.submit(["b", 2])
        c = await s1.submit("permanent", key="c")
        d = await s1.submit("crash", key="d", retry=NO_RETRY)
        assert await a == {"echo": "a", "attempt": 1}
        await b
        await failure(c)
        await failure(d)

    rec2 = Recorder(outcome)
    async with running(make(path, rec2)) as s2:
        for ref in (a.id, "a"):
            h = await s2.handle(ref)
            assert h is not None and h.id == a.id and h.done()
            assert await h == {"echo": "a", "attempt": 1}
        hb = await s2.handle(b.id)
        assert hb is not None and await hb == {"echo": ["b", 2], "attempt": 1}
        assert await s2.status("a") == "succeeded"
        assert await s2.status(b.id) == "succeeded"
        assert await s2.status("c") == "failed"
        assert await s2.status(d.id) == "dead_lettered"
        hc = await s2.handle("c")
        assert hc is not None
        e = await failure(hc)
        assert (e.status, e.message, e.task_id) == ("failed", "nope", c.id)
        hd = await s2.handle("d")
        assert hd is not None
        e = await failure(hd)
        assert (e.status, e.message) == ("dead_lettered", "ValueError: bad")
        # key deduplication across the restart: the stored task, its stored result
        again = await s2.submit("a different payload", key="a")
        assert again.duplicate and again.id == a.id
        assert await again == {"echo": "a", "attempt": 1}
        assert await s2.enqueue("other", key="c") == c.id
        assert await s2.handle(epoch_id(1, 99)) is None
        assert await s2.status("never-submitted") is None
    assert rec2.runs == []  # nothing ran again
    assert query(path, "SELECT count(*) FROM cronoq_tasks") == [(4,)]


async def test_each_run_leads_a_new_epoch(tmp_path: Path) -> None:
    """The same Scheduler object started three times on one file: each run's ids come from the
    next epoch, and the ids and rows of earlier runs stay."""
    path = tmp_path / "cronoq.db"
    sched = make(path, Recorder())
    ids = []
    for run in range(3):
        async with running(sched) as s:
            h = await s.submit(run)
            ids.append(h.id)
            assert await h == run
            for earlier in ids:
                assert await s.status(earlier) == "succeeded"
    assert ids == [epoch_id(1), epoch_id(2), epoch_id(3)]
    assert ids == [2**48 + 1, 2**49 + 1, 3 * 2**48 + 1]
    ((epoch, max_id, holder),) = query(path, "SELECT epoch, max_id, holder FROM cronoq_leader")
    assert (epoch, max_id, holder) == (3, epoch_id(3), None)  # released at the clean stop


async def test_a_shard_numbers_its_ids_and_refuses_another_shards_store(tmp_path: Path) -> None:
    """docs/sharding.md, "Task ids": shard S issues S << 56 | epoch << 40 | 1 on, in memory
    (epoch 0) and on a file (epoch 1, then 2); a scheduler of another shard number refuses that
    file at start, released for the next leader, and writes nothing to it."""
    pool = Pool("default", Recorder(), max=1, initial=1, autoscale=False)
    async with running(Scheduler([pool], shard=200, shutdown_grace=0.1)) as s:
        assert (await s.submit(1)).id == 200 << 56 | 1
    path = tmp_path / "a.db"
    sharded = Scheduler([pool], store=SqliteStore(path, **LEASE), shard=7, shutdown_grace=0.1)
    ids = []
    for _ in range(2):
        async with running(sharded) as s:
            h = await s.submit(1)
            assert await h == 1
            ids.append(h.id)
    assert ids == [7 << 56 | 1 << 40 | 1, 7 << 56 | 2 << 40 | 1]
    assert all(i >> 56 == 7 for i in ids)
    stranger = Scheduler([pool], store=SqliteStore(path, **LEASE), shard=8)
    with pytest.raises(SchedulerError) as info:
        await stranger.start()
    assert str(info.value).endswith("a sharded server needs a store (schema or file) of its own")
    assert f"task id {ids[0]} of shard number 7, not 8" in str(info.value)
    assert not stranger.started
    ((holder,),) = query(path, "SELECT holder FROM cronoq_leader")
    assert holder is None  # given up at once, for the next leader
    async with running(make(path, Recorder())) as s:  # unsharded: reads the file as it is
        assert await s.status(ids[0]) == "succeeded"
    for bad in (256, -1, True, "1"):
        with pytest.raises(ValueError, match="shard must be an int from 0 to 255"):
            Scheduler([pool], shard=bad)  # type: ignore[arg-type]


async def test_recurring_schedule_survives_restart_and_removal_is_durable(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    rec1 = Recorder()
    async with running(make(path, rec1)) as s1:
        await s1.add_recurring("tick", "* * * * * *", {"n": 1}, tags={"team": "ops"})
        await until(lambda: rec1.runs, what="a first occurrence")
    assert [name for (name,) in query(path, "SELECT name FROM cronoq_recurring")] == ["tick"]

    rec2 = Recorder()
    async with running(make(path, rec2)) as s2:
        # the schedule keeps creating occurrences in the new run (ids of epoch 2)
        await until(
            lambda: [r for r in rec2.runs if r["id"] >> 48 == 2], 3.0, "an occurrence of run 2"
        )
        assert all(r["payload"] == {"n": 1} for r in rec1.runs + rec2.runs)
        assert await s2.remove_recurring("tick") is True
        assert query(path, "SELECT name FROM cronoq_recurring") == []

    rec3 = Recorder()
    async with running(make(path, rec3)) as s3:
        await asyncio.sleep(1.2)
        assert await s3.remove_recurring("tick") is False  # it did not come back
    # no occurrence was created in the third run
    assert query(path, "SELECT id FROM cronoq_tasks WHERE id >> 48 = 3") == []
    assert all(r["id"] >> 48 < 3 for r in rec3.runs)
    # every occurrence time was created once, over all three runs
    starts = [
        t for (t,) in query(path, "SELECT fixed_start FROM cronoq_tasks WHERE tags LIKE '%tick%'")
    ]
    assert len(starts) >= 2
    assert len(starts) == len(set(starts))
    # the tags of the template are kept with each occurrence
    tags = {t for (t,) in query(path, "SELECT tags FROM cronoq_tasks")}
    assert all(json.loads(t)["team"] == "ops" for t in tags)


# --- attempts running at a clean shutdown ------------------------------------------------------


async def _block_first_attempt(ctx: TaskContext, payload: Any) -> Any:
    if ctx.attempt == 1:
        await asyncio.Event().wait()  # runs until the shutdown cancels it
    return f"attempt {ctx.attempt}"


async def test_attempt_running_at_shutdown_counts_as_used(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    rec1 = Recorder(_block_first_attempt)
    async with running(make(path, rec1)) as s1:
        h = await s1.submit("job", key="job")
        await until(lambda: rec1.runs, what="the first attempt")
    e = await failure(h)
    assert (e.status, e.message) == ("shutdown", "scheduler shut down")
    assert rec1.cancelled == [(h.id, 1)]
    assert query(path, "SELECT status, attempt FROM cronoq_tasks") == [("running", 1)]

    rec2 = Recorder(_block_first_attempt)
    async with running(make(path, rec2)) as s2:
        got = await s2.handle("job")
        assert got is not None
        assert await asyncio.wait_for(got.result(), 2.0) == "attempt 2"
    assert rec2.attempts(h.id) == [2]
    assert query(path, "SELECT status, attempt FROM cronoq_tasks") == [("succeeded", 2)]


async def test_lost_last_attempt_is_dead_lettered(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    rec1 = Recorder(_block_first_attempt)
    async with running(make(path, rec1)) as s1:
        h = await s1.submit("job", key="job", retry=NO_RETRY)
        await until(lambda: rec1.runs, what="the first attempt")

    rec2 = Recorder(_block_first_attempt)
    async with running(make(path, rec2)) as s2:
        assert await s2.status("job") == "dead_lettered"
        got = await s2.handle(h.id)
        assert got is not None
        e = await failure(got)
        assert (e.status, e.message, e.task_id) == ("dead_lettered", MSG_LOST, h.id)
    assert rec2.runs == []
    assert query(path, "SELECT status, attempt, message FROM cronoq_tasks") == [
        ("dead_lettered", 1, MSG_LOST)
    ]


# --- codecs ------------------------------------------------------------------------------------


async def test_json_codec_round_trip_tuple_becomes_list_after_restart(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    seen: list[Any] = []

    async def echo(ctx: TaskContext, payload: Any) -> Any:
        seen.append(payload)
        return payload

    async with running(make(path, echo)) as s1:
        live = await s1.submit((1, "a"))
        assert await live == (1, "a")  # the live handle returns the object itself
        await s1.set_capacity("default", 0)
        later = await s1.submit((2, "b"), key="later")
    assert seen == [(1, "a")]
    assert type(seen[0]) is tuple  # the live executor got the original object
    assert query(path, "SELECT payload FROM cronoq_tasks WHERE key = 'later'") == [(b'[2,"b"]',)]

    async with running(make(path, echo)) as s2:
        h = await s2.handle(later.id)
        assert h is not None and await h == [2, "b"]
        old = await s2.handle(live.id)
        assert old is not None and await old == [1, "a"]
    assert seen[1] == [2, "b"] and type(seen[1]) is list


async def test_unencodable_payload_is_rejected_and_nothing_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    rec = Recorder()
    message = (
        "payload cannot be stored by the scheduler's codec: "
        "TypeError: Object of type set is not JSON serializable"
    )
    async with running(make(path, rec)) as s:
        with pytest.raises(TypeError) as info:
            await s.submit({1, 2}, key="k")
        assert str(info.value) == message
        with pytest.raises(TypeError, match="payload cannot be stored"):
            await s.enqueue({"nested": {3}}, key="k")
        # a batch is admitted whole or not at all
        with pytest.raises(TypeError, match="payload cannot be stored"):
            await s.submit_batch([Task("fine", key="b1"), Task({4}, key="b2")])
        with pytest.raises(TypeError, match="payload cannot be stored"):
            await s.add_recurring("bad", "* * * * *", {5})
        assert await s.status("k") is None
        assert await s.status("b1") is None
        assert query(path, "SELECT count(*) FROM cronoq_tasks") == [(0,)]
        assert query(path, "SELECT count(*) FROM cronoq_recurring") == [(0,)]
        assert await s.remove_recurring("bad") is False
        # the key stays free
        h = await s.submit("ok", key="k")
        assert not h.duplicate and await h == "ok"
    assert [r["payload"] for r in rec.runs] == ["ok"]


async def test_unencodable_result_is_logged_and_live_handle_still_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cronoq.db"

    async def make_set(ctx: TaskContext, payload: Any) -> Any:
        return {1, 2}

    with caplog.at_level(logging.WARNING, logger="cronoq"):
        async with running(make(path, make_set)) as s1:
            h = await s1.submit("x", key="set")
            assert await h == {1, 2}
            ok = await s1.submit("x")
    msgs = [r.getMessage() for r in caplog.records if r.name == "cronoq"]
    assert any(m.startswith(f"result of task {h.id} not stored: cannot encode it") for m in msgs)
    assert query(path, "SELECT status, output FROM cronoq_tasks WHERE id = ?", (h.id,)) == [
        ("succeeded", None)
    ]

    async with running(make(path, make_set)) as s2:
        assert await s2.status("set") == "succeeded"
        again = await s2.handle("set")
        assert again is not None and await again is None  # unavailable after the restart
        # a duplicate submit of the key returns the stored task and does not run it again
        dup = await s2.submit("y", key="set")
        assert dup.duplicate and await dup is None
        assert await s2.status(ok.id) == "succeeded"


class PickleCodec:
    """Stores any picklable object (a set stays a set across restarts)."""

    def encode(self, obj: Any) -> bytes:
        return pickle.dumps(obj)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)


class PrefixCodec:
    """JSON behind a format marker; refuses bytes without it."""

    PREFIX = b"cq1:"

    def encode(self, obj: Any) -> bytes:
        return self.PREFIX + json.dumps(obj).encode()

    def decode(self, data: bytes) -> Any:
        if not data.startswith(self.PREFIX):
            raise ValueError("unknown format")
        return json.loads(data[len(self.PREFIX) :])


@pytest.mark.parametrize(
    ("codec_class", "payload", "after_restart"),
    [
        (PickleCodec, {"s": {1, 2}, "t": (3, 4)}, {"s": {1, 2}, "t": (3, 4)}),
        (PrefixCodec, {"t": (3, 4)}, {"t": [3, 4]}),
    ],
)
async def test_custom_codec(
    tmp_path: Path, codec_class: type[Any], payload: Any, after_restart: Any
) -> None:
    path = tmp_path / "cronoq.db"
    codec = codec_class()
    assert isinstance(codec, Codec)
    seen: list[Any] = []

    async def echo(ctx: TaskContext, p: Any) -> Any:
        seen.append(p)
        return p

    async with running(make(path, echo, codec=codec)) as s1:
        done = await s1.submit(payload, key="done")
        assert await done == payload
        await s1.set_capacity("default", 0)
        await s1.submit(payload, key="pending")
    ((stored,),) = query(path, "SELECT payload FROM cronoq_tasks WHERE key = 'pending'")
    assert stored == codec.encode(payload)  # the file holds what this codec wrote

    async with running(make(path, echo, codec=codec_class())) as s2:
        h = await s2.handle("pending")
        assert h is not None and await h == after_restart
        old = await s2.handle("done")
        assert old is not None and await old == after_restart
    assert seen == [payload, after_restart]


def test_codec_validation(tmp_path: Path) -> None:
    pool = Pool("default", Recorder())

    def store() -> SqliteStore:
        return SqliteStore(tmp_path / "x.db", **LEASE)

    class EncodeOnly:
        def encode(self, obj: Any) -> bytes:
            return b""

    class NotCallable:
        encode = b"x"
        decode = b"y"

    with pytest.raises(TypeError) as info:
        Scheduler([pool], store=store(), codec=object())
    assert str(info.value) == "codec must have an encode() method"
    with pytest.raises(TypeError) as info:
        Scheduler([pool], store=store(), codec=NotCallable())
    assert str(info.value) == "codec must have an encode() method"
    with pytest.raises(TypeError) as info:
        Scheduler([pool], store=store(), codec=EncodeOnly())
    assert str(info.value) == "codec must have a decode() method"
    with pytest.raises(ValueError) as vinfo:
        Scheduler([pool], codec=JsonCodec())
    assert str(vinfo.value) == "codec= needs store="
    with pytest.raises(TypeError) as info:
        Scheduler([pool], store=str(tmp_path / "x.db"))
    assert str(info.value) == (
        "store must implement cronoq.store.Store, like cronoq.SqliteStore (got str without "
        "open(), lead(), load(), commit_nowait(), renew(), prune(), finished(), close(), "
        "retention, lease_renew)"
    )
    assert repr(JsonCodec()) == "JsonCodec()"
    assert isinstance(JsonCodec(), Codec)
    assert not (tmp_path / "x.db").exists()  # constructing never touches the file


async def test_codec_encode_must_return_bytes(tmp_path: Path) -> None:
    class TextCodec:
        def encode(self, obj: Any) -> Any:
            return json.dumps(obj)  # str, not bytes

        def decode(self, data: bytes) -> Any:
            return json.loads(data)

    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder(), codec=TextCodec())) as s:
        with pytest.raises(TypeError) as info:
            await s.submit("x", key="k")
        assert str(info.value).endswith("codec.encode must return bytes")
        assert await s.status("k") is None
    assert query(path, "SELECT count(*) FROM cronoq_tasks") == [(0,)]


# --- SqliteStore arguments ---------------------------------------------------------------------


def test_store_repr_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    st = SqliteStore(path)
    assert repr(st) == (
        f"SqliteStore({str(path)!r}, lease_ttl=10.0, lease_renew=2.0, lock_poll=0.5, "
        "retention=3600.0, full_sync=True)"
    )
    st = SqliteStore(
        str(path), lease_ttl=3, lease_renew=1, lock_poll=0.1, retention=0, full_sync=False
    )
    assert repr(st) == (
        f"SqliteStore({str(path)!r}, lease_ttl=3.0, lease_renew=1.0, lock_poll=0.1, "
        "retention=0.0, full_sync=False)"
    )
    assert SqliteStore(path, retention=float("inf")).retention == float("inf")
    assert not path.exists()


RENEW = "lease_renew must be > 0 and shorter than lease_ttl"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"lease_ttl": 1, "lease_renew": 2}, ValueError, RENEW),
        ({"lease_ttl": 2, "lease_renew": 2}, ValueError, RENEW),
        ({"lease_renew": 0}, ValueError, RENEW),
        ({"lease_renew": -1}, ValueError, RENEW),
        ({"lease_renew": float("nan")}, ValueError, RENEW),
        ({"lease_renew": True}, ValueError, RENEW),
        ({"lease_renew": "1"}, ValueError, RENEW),
        ({"lease_ttl": "10"}, TypeError, "lease_ttl must be a number of seconds (got '10')"),
        ({"lease_ttl": True}, TypeError, "lease_ttl must be a number of seconds (got True)"),
        (
            {"lease_ttl": 0},
            ValueError,
            "lease_ttl must be a finite number of seconds > 0 (got 0)",
        ),
        (
            {"lease_ttl": float("inf")},
            ValueError,
            "lease_ttl must be a finite number of seconds > 0 (got inf)",
        ),
        (
            {"lease_ttl": float("nan")},
            ValueError,
            "lease_ttl must be a finite number of seconds > 0 (got nan)",
        ),
        ({"lock_poll": None}, TypeError, "lock_poll must be a number of seconds (got None)"),
        (
            {"lock_poll": -0.5},
            ValueError,
            "lock_poll must be a finite number of seconds > 0 (got -0.5)",
        ),
        ({"retention": "1h"}, TypeError, "retention must be a number of seconds (got '1h')"),
        ({"retention": False}, TypeError, "retention must be a number of seconds (got False)"),
        ({"retention": -1}, ValueError, "retention must be >= 0 seconds (got -1)"),
        (
            {"retention": float("nan")},
            ValueError,
            "retention must be >= 0 seconds (got nan)",
        ),
        ({"full_sync": 1}, TypeError, "full_sync must be a bool (got 1)"),
        ({"full_sync": None}, TypeError, "full_sync must be a bool (got None)"),
    ],
)
def test_store_rejects_bad_options(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        SqliteStore(tmp_path / "a.db", **options)
    assert str(info.value) == message
    assert not (tmp_path / "a.db").exists()


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        (123, TypeError, "path must be a str or os.PathLike (got int)"),
        (None, TypeError, "path must be a str or os.PathLike (got NoneType)"),
        (b"a.db", TypeError, "path must be a str or os.PathLike (got bytes)"),
        ("", ValueError, "path must be a non-empty file name without NUL characters"),
        ("a\0b.db", ValueError, "path must be a non-empty file name without NUL characters"),
    ],
)
def test_store_rejects_bad_paths(path: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        SqliteStore(path)
    assert str(info.value) == message


# --- files that cannot be used -----------------------------------------------------------------


def _text_file(path: Path) -> None:
    path.write_text("this is not a database\n" * 40)


def _other_sqlite(path: Path) -> None:
    execute(
        path,
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
        "INSERT INTO users (name) VALUES ('ada')",
    )


def _foreign_meta(path: Path) -> None:
    execute(
        path,
        "CREATE TABLE cronoq_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO cronoq_meta VALUES ('application', 'someone-else'), ('schema_version', '1')",
    )


def _newer_schema(path: Path) -> None:
    execute(path, *_SCHEMA_V1)
    execute(
        path,
        (
            "INSERT INTO cronoq_meta VALUES ('application', 'cronoq'), ('schema_version', ?)",
            (str(NEWER),),
        ),
    )


@pytest.mark.parametrize(
    ("prepare", "reason"),
    [
        (_text_file, "not a cronoq database (file is not a database)"),
        (_other_sqlite, "not a cronoq database (no cronoq_meta table)"),
        (_foreign_meta, "not a cronoq database (cronoq_meta has no cronoq schema version)"),
        (_newer_schema, TOO_NEW),
    ],
)
async def test_unusable_file_is_refused_and_left_unchanged(
    tmp_path: Path, prepare: Callable[[Path], None], reason: str
) -> None:
    path = tmp_path / "cronoq.db"
    prepare(path)
    before = path.read_bytes()
    files = sorted(os.listdir(tmp_path))
    rec = Recorder()
    sched = make(path, rec)
    with pytest.raises(SchedulerError) as info:
        await sched.start()
    assert str(info.value) == f"store {str(path)!r}: {reason}"
    assert not sched.started
    with pytest.raises(RuntimeError, match="not started"):
        await sched.submit("x")
    # a second try fails the same way (the first left nothing half open)
    with pytest.raises(SchedulerError) as again:
        await sched.start()
    assert str(again.value) == str(info.value)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == files  # no -wal / -shm left behind


async def test_a_newer_schema_written_by_a_real_store_is_refused(tmp_path: Path) -> None:
    """A file made by a scheduler, then marked as a newer version: refused, bytes untouched."""
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder())) as s:
        await s.submit("x")
    execute(path, ("UPDATE cronoq_meta SET value = ? WHERE key = 'schema_version'", (str(NEWER),)))
    before = path.read_bytes()
    with pytest.raises(SchedulerError) as info:
        await make(path, Recorder()).start()
    assert str(path) in str(info.value)
    assert TOO_NEW in str(info.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize("where", ["missing-dir", "a-directory", "under-a-file"])
async def test_path_that_cannot_be_opened(tmp_path: Path, where: str) -> None:
    # (A read-only directory would not do: the tests run as root in CI, and root writes there.)
    if where == "missing-dir":
        path = tmp_path / "no" / "such" / "dir" / "cronoq.db"
    elif where == "a-directory":
        path = tmp_path / "sub"
        path.mkdir()
    else:
        (tmp_path / "plain").write_text("not a directory")
        path = tmp_path / "plain" / "cronoq.db"
    sched = make(path, Recorder())
    with pytest.raises(SchedulerError) as info:
        await sched.start()
    assert str(info.value).startswith(f"store {str(path)!r}: ")
    assert "unable to open database file" in str(info.value)
    assert not sched.started
    if where == "missing-dir":
        assert not (tmp_path / "no").exists()  # nothing created on the way
    if where == "a-directory":
        assert os.listdir(path) == []


async def test_empty_file_is_initialized(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    path.touch()
    async with running(make(path, Recorder())) as s:
        assert await (await s.submit("x")) == "x"
    assert dict(query(path, "SELECT key, value FROM cronoq_meta")) == {
        "application": "cronoq",
        "schema_version": str(SCHEMA_VERSION),
    }
    assert query(path, "PRAGMA journal_mode") == [("wal",)]


# --- migration ---------------------------------------------------------------------------------

_V1_COLUMNS = (
    "id, seq, arrival, pool, kind, priority, key, payload, deadline, fixed_start, tolerance, "
    "on_miss, duration_hint, timeout, retry, deps, resources, tags, labels, tenant, status, "
    "terminal, attempt, updated, message, output"
)


def _v1_task(
    tid: int,
    seq: int,
    key: str,
    payload: bytes | None,
    status: str,
    attempt: int = 0,
    output: bytes | None = None,
    retry: str | None = None,
) -> tuple[str, tuple[Any, ...]]:
    now = time.time_ns()
    terminal = 1 if status in ("succeeded", "failed", "dead_lettered") else 0
    row = (tid, seq, now - 10**9, "default", "default", 2, key, payload, None, None, None)
    row += (None, None, None, retry, None, None, None, None, None, status, terminal, attempt)
    row += (now - 10**8, None, output)
    marks = ", ".join("?" * len(row))
    return f"INSERT INTO cronoq_tasks ({_V1_COLUMNS}) VALUES ({marks})", row


async def test_version_1_file_is_migrated_and_its_tasks_run(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    e = 3 << 48
    execute(
        path,
        *_SCHEMA_V1,
        "INSERT INTO cronoq_meta VALUES ('application', 'cronoq'), ('schema_version', '1')",
        f"UPDATE cronoq_leader SET epoch = 3, max_id = {e | 3} WHERE id = 1",
        _v1_task(e | 1, 1, "v1-done", b'{"p":0}', "succeeded", 1, b'"old result"'),
        _v1_task(e | 2, 2, "v1-ready", b'{"from":"v1"}', "ready"),
        _v1_task(e | 3, 3, "v1-retry", b"[7]", "retrying", 1, retry="[3,1.0,2.0,60.0,false]"),
    )
    rec = Recorder()
    async with running(make(path, rec)) as s:
        h = await s.handle("v1-ready")
        assert h is not None and h.id == e | 2
        assert await asyncio.wait_for(h.result(), 2.0) == {"from": "v1"}
        # a v1 file has no retry times: the retrying task retries at once, as attempt 2
        r = await s.handle("v1-retry")
        assert r is not None and await asyncio.wait_for(r.result(), 2.0) == [7]
        done = await s.handle("v1-done")
        assert done is not None and await done == "old result"
        dup = await s.submit("again", key="v1-done")
        assert dup.duplicate and dup.id == e | 1
        fresh = await s.submit("new")
        assert fresh.id == epoch_id(4)  # the stored epoch goes on
    assert rec.attempts(e | 2) == [1]
    assert rec.attempts(e | 3) == [2]
    assert rec.attempts(e | 1) == []
    meta = dict(query(path, "SELECT key, value FROM cronoq_meta"))
    assert meta == {"application": "cronoq", "schema_version": str(SCHEMA_VERSION)}
    columns = [c[1] for c in query(path, "PRAGMA table_info(cronoq_tasks)")]
    assert columns[-5:] == ["eligible", "not_before", "started", "worker", "attempts"]
    assert dict(query(path, "SELECT key, status FROM cronoq_tasks WHERE key IS NOT NULL")) == {
        "v1-done": "succeeded",
        "v1-ready": "succeeded",
        "v1-retry": "succeeded",
    }


# --- corrupt rows ------------------------------------------------------------------------------


async def test_corrupt_payload_fails_that_task_only(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder())) as s1:
        await s1.set_capacity("default", 0)
        good1 = await s1.submit("one", key="one")
        bad = await s1.submit("two", key="two")
        good2 = await s1.submit("three", key="three")
        finished_ok = await s1.submit("four", key="four", start_in=30)  # stays scheduled
    execute(path, ("UPDATE cronoq_tasks SET payload = ? WHERE id = ?", (b"{not json", bad.id)))
    prefix = "payload cannot be decoded by the scheduler's codec: JSONDecodeError: "

    rec = Recorder()
    async with running(make(path, rec)) as s2:
        h = await s2.handle("two")
        assert h is not None
        e = await failure(h)
        assert e.status == "failed" and e.message.startswith(prefix), e.message
        for ref, payload in (("one", "one"), ("three", "three")):
            other = await s2.handle(ref)
            assert other is not None
            assert await asyncio.wait_for(other.result(), 2.0) == payload
        assert await s2.status(finished_ok.id) == "scheduled"
    assert sorted(r["id"] for r in rec.runs) == [good1.id, good2.id]
    # the failure is in the file: a third run sees it as well
    ((status, message),) = query(
        path, "SELECT status, message FROM cronoq_tasks WHERE id = ?", (bad.id,)
    )
    assert status == "failed" and message.startswith(prefix)
    async with running(make(path, rec)) as s3:
        assert await s3.status("two") == "failed"
        assert await s3.status("four") == "scheduled"


async def test_rows_that_cannot_be_decoded_fail_their_task_only(tmp_path: Path) -> None:
    """A JSON column of the wrong shape, unreadable JSON, an unknown status: the task fails
    with "corrupt task row: ...", written back, and the other tasks run."""
    path = tmp_path / "cronoq.db"
    bad = {
        "bad-retry": "retry = '\"x\"'",
        "bad-deps": "deps = '{\"a\": 1}'",
        "bad-tags": "tags = '[1, 2]'",
        "bad-labels": "labels = '{nope'",
        "bad-status": "status = 'exploded'",
    }
    async with running(make(path, Recorder())) as s1:
        await s1.set_capacity("default", 0)
        await s1.submit("good", key="good")
        for key in bad:
            await s1.submit(key, key=key, tags={"t": "v"})
        child = await s1.submit("child", deps=[Dep("bad-retry", on="failure")])
    execute(path, *(f"UPDATE cronoq_tasks SET {set_} WHERE key = '{k}'" for k, set_ in bad.items()))
    rec = Recorder()
    async with running(make(path, rec)) as s2:
        for key in bad:
            h = await s2.handle(key)
            assert h is not None
            e = await failure(asyncio.wait_for(h.result(), 2.0))
            assert e.status == "failed" and e.message.startswith("corrupt task row: "), e.message
        good = await s2.handle("good")
        assert good is not None and await asyncio.wait_for(good.result(), 2.0) == "good"
        c = await s2.handle(child.id)
        assert c is not None and await asyncio.wait_for(c.result(), 2.0) == "child"
    assert sorted(r["payload"] for r in rec.runs) == ["child", "good"]
    stored = query(
        path, "SELECT key, status, terminal, message FROM cronoq_tasks WHERE key LIKE 'bad-%'"
    )
    assert sorted((k, s, t) for k, s, t, _ in stored) == [(k, "failed", 1) for k in sorted(bad)]
    assert all(m.startswith("corrupt task row: ") for *_, m in stored), stored
    # Not loaded as live again: the next run finds them failed, their messages unchanged.
    async with running(make(path, rec)) as s3:
        for key in bad:
            assert await s3.status(key) == "failed"
    assert sorted(r["payload"] for r in rec.runs) == ["child", "good"]
    assert sorted(query(path, "SELECT key, message FROM cronoq_tasks WHERE key LIKE 'bad-%'")) == (
        sorted((k, m) for k, *_, m in stored)
    )


async def test_corrupt_stored_result_reads_as_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder())) as s1:
        h = await s1.submit({"v": 1}, key="done")
        assert await h == {"v": 1}
        other = await s1.submit([1], key="other")
        await other
    execute(path, ("UPDATE cronoq_tasks SET output = ? WHERE id = ?", (b"\xff\xfe", h.id)))
    async with running(make(path, Recorder())) as s2:
        assert await s2.status("done") == "succeeded"
        got = await s2.handle("done")
        assert got is not None and await got is None
        o = await s2.handle("other")
        assert o is not None and await o == [1]


# --- retention ---------------------------------------------------------------------------------


async def test_terminal_rows_are_pruned_but_ids_are_never_reused(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder(), retention=0.0)) as s1:
        done = [await s1.submit(i, key=f"k{i}") for i in range(3)]
        for h in done:
            await h
        await s1.set_capacity("default", 0)
        live = await s1.submit("live", key="live")
        # pruning runs about once a second (see _durable.Durable._keep)
        await until(
            lambda: query(path, "SELECT count(*) FROM cronoq_tasks WHERE terminal = 1") == [(0,)],
            3.0,
            "the terminal rows to be pruned",
        )
        # in memory the scheduler still answers for them (its own retention is separate)
        assert await s1.status("k0") == "succeeded"
        assert query(path, "SELECT id, status FROM cronoq_tasks") == [(live.id, "ready")]
        assert query(path, "SELECT max_id FROM cronoq_leader") == [(live.id,)]
    assert live.id == epoch_id(1, 4)

    rec = Recorder()
    async with running(make(path, rec, retention=0.0)) as s2:
        assert await s2.status("k0") is None  # pruned rows are not reloaded
        assert await s2.handle(done[0].id) is None
        h = await s2.submit("new", key="k0")  # the key is free again ...
        assert not h.duplicate
        assert h.id == epoch_id(2, 1) and h.id > live.id  # ... but the id is a new one
        assert await h == "new"
        got = await s2.handle("live")
        assert got is not None and await asyncio.wait_for(got.result(), 2.0) == "live"
    assert query(path, "SELECT max_id FROM cronoq_leader") == [(epoch_id(2, 1),)]


# --- leader and standby ------------------------------------------------------------------------


async def test_standby_waits_in_start_until_the_leader_stops(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    rec1, rec2 = Recorder(), Recorder()
    leader = make(path, rec1)
    standby = make(path, rec2)
    await leader.start()
    try:
        waiting = asyncio.create_task(standby.start())
        await asyncio.sleep(0.4)  # many lock_poll periods
        assert not waiting.done() and not standby.started
        # the leader keeps working (and writing) while the standby polls
        h = await leader.submit("from leader", key="shared")
        assert h.id == epoch_id(1)
        assert await h == "from leader"
        await leader.submit("left pending", key="pending", start_in=0.5)
        assert not waiting.done()
    finally:
        t0 = time.monotonic()
        await leader.shutdown()
    await asyncio.wait_for(waiting, 1.5)
    took = time.monotonic() - t0
    assert took < LEASE["lease_ttl"], took  # a clean stop hands over at once, not after lease_ttl
    try:
        assert standby.started
        s = await standby.handle("shared")
        assert s is not None and await s == "from leader"
        h2 = await standby.submit("from standby")
        assert h2.id == epoch_id(2)  # the next epoch
        assert await h2 == "from standby"
        p = await standby.handle("pending")
        assert p is not None and await asyncio.wait_for(p.result(), 2.0) == "left pending"
    finally:
        await standby.shutdown()
    assert [r["payload"] for r in rec1.runs] == ["from leader"]
    assert sorted(r["payload"] for r in rec2.runs) == ["from standby", "left pending"]
    assert query(path, "SELECT epoch, holder FROM cronoq_leader") == [(2, None)]


async def test_cancelled_standby_leaves_the_leader_alone(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder())) as leader:
        standby = make(path, Recorder())
        waiting = asyncio.create_task(standby.start())
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not standby.started
        ((epoch, holder),) = query(path, "SELECT epoch, holder FROM cronoq_leader")
        assert epoch == 1 and holder is not None  # still the leader's lease
        h = await leader.submit("still leading")
        assert await h == "still leading"
    # and the cancelled standby can start later, as the next leader
    async with running(standby) as s:
        assert (await s.submit("x")).id == epoch_id(2)


# --- more recovery details ---------------------------------------------------------------------


async def test_full_task_spec_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    retry = RetryPolicy(5, 0.5, 3.0, 10.0, jitter=False)
    async with running(make(path, Recorder())) as s1:
        await s1.set_capacity("default", 0)
        before = time.time()
        h = await s1.submit(
            {"spec": True},
            priority="high",
            kind="report",
            key="full",
            tenant="acme",
            deadline_in=60,
            duration_hint=0.5,
            timeout=30,
            retry=retry,
            tags={"team": "ops"},
        )
    seen: list[TaskContext] = []

    async def capture(ctx: TaskContext, payload: Any) -> Any:
        seen.append(ctx)
        return payload

    async with running(make(path, capture)) as s2:
        got = await s2.handle("full")
        assert got is not None and await asyncio.wait_for(got.result(), 2.0) == {"spec": True}
    (ctx,) = seen
    assert (ctx.id, ctx.attempt, ctx.kind, ctx.key, ctx.pool) == (
        h.id,
        1,
        "report",
        "full",
        "default",
    )
    assert ctx.tags == {"team": "ops"}
    assert ctx.timeout == 30
    assert ctx.deadline is not None and before + 60 <= ctx.deadline <= before + 61
    t = ctx.task
    assert (t.cls, t.tenant, t.duration_hint) == (1, "acme", 0.5)
    assert t.retry is not None
    assert (t.retry.max_attempts, t.retry.initial_backoff, t.retry.multiplier) == (5, 0.5, 3.0)
    assert (t.retry.max_backoff, t.retry.jitter) == (10.0, False)


async def test_task_of_a_pool_no_longer_configured_fails(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    rec = Recorder()
    pools = [
        Pool("default", rec, max=1, initial=1, autoscale=False),
        Pool("extra", rec, max=1, initial=1, autoscale=False),
    ]
    s1 = Scheduler(pools, store=SqliteStore(path, **LEASE), shutdown_grace=0.1)
    async with running(s1):
        await s1.set_capacity("extra", 0)
        h = await s1.submit("stranded", pool="extra", key="stranded")
        await s1.set_capacity("default", 0)
        kept = await s1.submit("kept", key="kept")
    async with running(make(path, rec)) as s2:
        got = await s2.handle("stranded")
        assert got is not None
        e = await failure(got)
        assert (e.status, e.message, e.task_id) == (
            "failed",
            "pool 'extra' is no longer configured",
            h.id,
        )
        k = await s2.handle(kept.id)
        assert k is not None and await asyncio.wait_for(k.result(), 2.0) == "kept"
    assert [r["payload"] for r in rec.runs] == ["kept"]
    assert query(path, "SELECT status FROM cronoq_tasks WHERE key = 'stranded'") == [("failed",)]


async def test_dependents_of_a_corrupt_task_settle_as_after_any_failure(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder())) as s1:
        await s1.set_capacity("default", 0)
        parent = await s1.submit("parent", key="parent")
        on_success = await s1.submit("on-success", deps=[Dep(parent.id)])
        on_failure = await s1.submit("on-failure", deps=[Dep("parent", on="failure")])
    execute(path, ("UPDATE cronoq_tasks SET payload = X'00ff' WHERE id = ?", (parent.id,)))
    rec = Recorder()
    async with running(make(path, rec)) as s2:
        assert await s2.status("parent") == "failed"
        h = await s2.handle(on_failure.id)
        assert h is not None and await asyncio.wait_for(h.result(), 2.0) == "on-failure"
        assert await s2.status(on_success.id) == "skipped"
    assert [r["payload"] for r in rec.runs] == ["on-failure"]


async def test_unreadable_schedule_is_dropped_and_others_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder())) as s1:
        await s1.add_recurring("broken", "0 0 1 1 *", {"x": 1})
        await s1.add_recurring("yearly", "0 0 1 1 *", {"y": 2})
    execute(path, "UPDATE cronoq_recurring SET template_payload = X'ff' WHERE name = 'broken'")
    with caplog.at_level(logging.ERROR, logger="cronoq"):
        async with running(make(path, Recorder())) as s2:
            assert await s2.remove_recurring("broken") is False
            await asyncio.sleep(0.05)
    msgs = [r.getMessage() for r in caplog.records if r.name == "cronoq"]
    assert any(
        m.startswith("recurring schedule 'broken' removed: cannot read it back") for m in msgs
    )
    assert query(path, "SELECT name FROM cronoq_recurring") == [("yearly",)]
    async with running(make(path, Recorder())) as s3:
        assert await s3.remove_recurring("yearly") is True


@pytest.mark.parametrize("shard", [None, 200])
async def test_finished_parent_of_a_blocked_task_outlives_retention(
    tmp_path: Path, shard: int | None
) -> None:
    """A blocked task waits for two parents; one has finished. Retention prunes finished rows,
    but not a parent a blocked task names (by key or id): after a restart the task must still
    wait for the other parent and then run. Once nothing waits for it the row goes. Shard 200's
    ids are 2^63 and more, which the file keeps in their signed form (docs/sharding.md, "Task
    ids")."""
    path = tmp_path / "cronoq.db"

    def row(task_id: int, column: str = "1") -> list[tuple[Any, ...]]:
        return query(path, f"SELECT {column} FROM cronoq_tasks WHERE id = ?", (signed(task_id),))

    async with running(make(path, Recorder(), retention=0.0, shard=shard)) as s1:
        a = await s1.submit("a", key="a")
        assert await a == "a"
        gone = await s1.submit("gone")  # finished, nobody depends on it: pruned
        assert await gone == "gone"
        await s1.set_capacity("default", 0)
        b = await s1.submit("b", key="b")
        by_key = await s1.submit("by-key", after=["a", "b"])
        by_id = await s1.submit("by-id", deps=[Dep(a.id), Dep(b.id)])
        assert await s1.status(by_key.id) == "blocked"
        await until(
            lambda: not row(gone.id),
            3.0,
            "a finished row nobody depends on to be pruned",
        )
        assert row(a.id, "status") == [("succeeded",)]
        assert (a.id >> 56, by_id.id >> 56) == (shard or 0, shard or 0)
    rec = Recorder()
    async with running(make(path, rec, retention=0.0, shard=shard)) as s2:
        for child in (by_key, by_id):
            h = await s2.handle(child.id)
            assert h is not None
            assert await asyncio.wait_for(h.result(), 2.0) == (
                "by-key" if child is by_key else "by-id"
            )
        await until(
            lambda: not row(a.id),
            3.0,
            "the parent's row to be pruned once its dependents ended",
        )
    assert sorted(r["payload"] for r in rec.runs) == ["b", "by-id", "by-key"]


async def test_fenced_leader_stops_and_a_new_one_takes_over_after_the_lease(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process takes the file's leadership (simulated by writing the leader row): the
    old leader notices at its next write or renewal, stops without writing anything more, and
    a scheduler started afterwards waits for that holder's lease to run out."""
    path = tmp_path / "cronoq.db"
    rec1 = Recorder(_block_first_attempt)
    s1 = make(path, rec1)
    await s1.start()
    try:
        running_task = await s1.submit("job", key="job")
        await until(lambda: rec1.runs, what="the first attempt")
        expires = time.time() + 0.6
        execute(
            path,
            (
                "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'thief', "
                "expires_unix_ns = ? WHERE id = 1",
                (int(expires * 1e9),),
            ),
        )
        rows_before = query(path, "SELECT * FROM cronoq_tasks ORDER BY id")
        with caplog.at_level(logging.ERROR, logger="cronoq"):
            # the keeper renews every lease_renew (0.5 s): it finds the lease gone
            await until(lambda: not s1.started, 2.0, "the fenced leader to stop")
        e = await failure(running_task)
        assert (e.status, e.message) == ("shutdown", "fenced: leadership lost")
        assert rec1.cancelled == [(running_task.id, 1)]
        with pytest.raises(SchedulerError) as info:
            await s1.submit("after fencing")
        assert str(info.value) == "fenced: leadership lost"
        assert query(path, "SELECT * FROM cronoq_tasks ORDER BY id") == rows_before
        assert query(path, "SELECT holder FROM cronoq_leader") == [("thief",)]
    finally:
        await s1.shutdown()  # harmless after the stop
    assert any("fenced: leadership lost" in r.getMessage() for r in caplog.records)

    rec2 = Recorder(_block_first_attempt)
    s2 = make(path, rec2)
    await s2.start()  # waits for the thief's lease to expire
    try:
        assert time.time() >= expires
        assert time.time() <= expires + 0.5
        h = await s2.handle("job")
        assert h is not None and await asyncio.wait_for(h.result(), 2.0) == "attempt 2"
        assert (await s2.submit("x")).id == epoch_id(3)  # thief had epoch 2
    finally:
        await s2.shutdown()


async def test_the_same_scheduler_leads_again_after_it_was_fenced(tmp_path: Path) -> None:
    """start() right after a lost session (the server's "stand by again"): the new session
    waits for the lost one's file to close, then leads with a new epoch and resumes."""
    path = tmp_path / "cronoq.db"
    rec = Recorder()
    s = make(path, rec)
    await s.start()
    try:
        first = await s.submit("one", key="one")
        assert await asyncio.wait_for(first.result(), 2.0) == "one"
        execute(path, "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'thief', "
                      "expires_unix_ns = 0 WHERE id = 1")  # fmt: skip
        with pytest.raises(SchedulerError):
            await s.submit("lost")  # its commit finds the leadership taken
        assert not s.started
        await s.start()  # at once: the thief's lease has already expired
        h = await s.handle("one")
        assert h is not None and await asyncio.wait_for(h.result(), 2.0) == "one"
        assert (await s.submit("two")).id == epoch_id(3)
    finally:
        await s.shutdown()


async def test_what_is_decided_while_closing_is_written_before_the_file_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """shutdown() writes what was decided before it, and what is decided while that last
    write is in flight (a pump, a worker's report): at once, not after a DEFER that would
    fire on a closed file ("store ... is not open" in a timer callback)."""
    path = tmp_path / "cronoq.db"
    s = make(path, Recorder())
    await s.start()
    h = await s.submit("one")
    assert await asyncio.wait_for(h.result(), 2.0) == "one"
    session = s._session
    assert session is not None and session.durable is not None
    durable, engine = session.durable, session.engine
    journal = engine.journal
    assert journal is not None
    rec = engine.tasks[h.id]
    store = durable.store
    inner = store.commit_nowait

    def decide_later() -> None:  # what a pump does: change a task, then flush
        rec.message = "decided while closing"
        current = engine.journal
        assert current is not None
        current.changed[rec.id] = rec
        durable.flush(False)

    def commit_nowait(batch: Any) -> Any:
        store.commit_nowait = inner  # type: ignore[method-assign]
        session.loop.call_soon(decide_later)  # while this, the last commit, is in flight
        return inner(batch)

    journal.changed[rec.id] = rec  # decided before the stop, not written yet
    store.commit_nowait = commit_nowait  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        await s.shutdown()
        await asyncio.sleep(0.05)  # past the 2 ms a deferred commit would have waited
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert query(path, "SELECT message FROM cronoq_tasks WHERE id = ?", (h.id,)) == [
        ("decided while closing",)
    ]


async def test_recurring_key_freed_by_removal_is_free_after_restart(tmp_path: Path) -> None:
    """remove_recurring cancels the occurrence created ahead and frees its key, so adding the
    schedule again creates that occurrence anew; a restart in between must not change that."""
    path = tmp_path / "cronoq.db"
    rec1 = Recorder()
    async with running(make(path, rec1)) as s1:
        await s1.add_recurring("r", "* * * * * *", "tick", key="tk")
        await until(lambda: rec1.runs, what="a first occurrence")
        first = rec1.runs[0]["start"]
        assert await s1.remove_recurring("r") is True
    rec2 = Recorder()
    async with running(make(path, rec2)) as s2:
        await s2.add_recurring("r", "* * * * * *", "tick", key="tk")
        added = time.time()
        await until(lambda: rec2.runs, 2.5, "an occurrence after the restart")
        assert await s2.remove_recurring("r") is True
    nxt = int(first) + 1  # the occurrence that was cancelled by the removal
    if added >= nxt - 0.05:
        pytest.skip("restart took too long to probe the cancelled occurrence's time")
    assert abs(rec2.runs[0]["start"] - nxt) < 0.3, (rec2.runs[0]["start"], nxt)


async def test_unawaited_results_and_those_finished_during_grace_are_stored(
    tmp_path: Path,
) -> None:
    """Results nobody awaits (enqueue) and a result that arrives during the shutdown grace are
    all in the file after a clean shutdown."""
    path = tmp_path / "cronoq.db"

    async def work(ctx: TaskContext, payload: Any) -> Any:
        if payload == "slow":
            await asyncio.sleep(0.2)
        return {"done": payload}

    s1 = make(path, work, slots=4)
    async with running(s1):
        ids = [await s1.enqueue(i) for i in range(10)]
        # acknowledged means on disk, for enqueue and for a batch
        assert query(path, "SELECT count(*) FROM cronoq_tasks") == [(10,)]
        batch = await s1.submit_batch([Task(f"b{i}", key=f"b{i}") for i in range(5)])
        assert {k for (k,) in query(path, "SELECT key FROM cronoq_tasks WHERE key LIKE 'b%'")} == {
            f"b{i}" for i in range(5)
        }
        for h in batch:
            await h

        async def all_done() -> bool:
            return [await s1.status(i) for i in ids] == ["succeeded"] * len(ids)

        await until(all_done, 2.0, "the enqueued tasks to finish")
        slow = await s1.submit("slow", key="slow")
        await asyncio.sleep(0.05)  # it is running now
        await s1.shutdown(grace=2.0)  # finishes within the grace
    assert await slow == {"done": "slow"}

    async with running(make(path, work)) as s2:
        for i, tid in enumerate(ids):
            h = await s2.handle(tid)
            assert h is not None and await h == {"done": i}
        for i in range(len(batch)):
            assert await s2.status(f"b{i}") == "succeeded"
        got = await s2.handle("slow")
        assert got is not None and await got == {"done": "slow"}


async def test_finished_and_running_tasks_keep_their_start_time_across_a_restart(
    tmp_path: Path,
) -> None:
    """When the latest attempt started is stored with the task: a finished task reports it
    after a restart, as before it."""
    path = tmp_path / "cronoq.db"
    async with running(make(path, Recorder())) as s1:
        h = await s1.submit("a")
        await h
        rec = s1.serving().lookup(h.id)
        assert rec is not None and rec.started_at > 0
        started = rec.started_at
    async with running(make(path, Recorder())) as s2:
        back = s2.serving().lookup(h.id)
        assert back is not None and back.status_name == "succeeded"
        assert back.started_at == pytest.approx(started, abs=1e-6)
    (stored,) = query(path, "SELECT started FROM cronoq_tasks WHERE id = ?", (h.id,))
    assert stored[0] is not None
