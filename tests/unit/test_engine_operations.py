"""The engine's operator controls: pausing and resuming a pool, deleting ended tasks from the
history, the copy "submit again" submits, and the worker each attempt is remembered with.

On a virtual clock, driving the engine directly (take() after each call), as the drivers do.
"""

from __future__ import annotations

from cronoq.core.engine import Engine
from cronoq.core.model import (
    CANCELLED,
    FAILED,
    READY,
    RUNNING,
    SUCCEEDED,
    Extras,
    PoolConfig,
    RetryPolicy,
    TaskRecord,
    resubmission,
)
from helpers.engine import engine_of


def two_pools(**kw: object) -> Engine:
    return engine_of(PoolConfig("a", capacity=2), PoolConfig("b", capacity=2), **kw)


def submit(eng: Engine, pool: str, now: float = 0.0, **kw: object) -> TaskRecord:
    rec, dup = eng.submit(TaskRecord(f"payload-{pool}", pool, **kw), now)  # type: ignore[arg-type]
    assert not dup
    return rec


def test_a_paused_pool_admits_but_starts_nothing_until_resumed() -> None:
    eng = two_pools()
    running = submit(eng, "a")
    eng.dispatch(0.0)
    assert running.status == RUNNING
    assert eng.pause("a", 1.0) is True
    assert eng.pause("a", 1.0) is False  # already paused
    queued = [submit(eng, "a", 1.0) for _ in range(3)]
    other = submit(eng, "b", 1.0)
    eng.dispatch(1.0)
    assert [r.status for r in queued] == [READY] * 3
    assert other.status == RUNNING  # other pools go on
    assert running.status == RUNNING  # what runs finishes
    eng.complete(running.running, 2.0)  # type: ignore[arg-type]
    eng.dispatch(2.0)
    assert [r.status for r in queued] == [READY] * 3  # a freed slot stays free
    snap = {p.name: p for p in eng.snapshot(2.0).pools}
    assert snap["a"].paused and not snap["b"].paused
    assert eng.resume("a", 3.0) is True
    assert eng.resume("a", 3.0) is False
    eng.dispatch(3.0)
    assert sum(r.status == RUNNING for r in queued) == 2  # the pool's two slots
    assert not eng.snapshot(3.0).pools[0].paused


def test_pause_and_resume_are_journaled_for_a_store() -> None:
    eng = two_pools(journal=True)
    eng.take_journal()
    eng.pause("a", 0.0)
    eng.pause("b", 0.0)
    eng.resume("b", 0.0)
    journal = eng.take_journal()
    assert journal.pools == {"a": True, "b": False}
    assert bool(journal)
    eng.pause("a", 1.0)  # no change: nothing to write
    assert not eng.take_journal()


def test_a_fixed_start_in_a_paused_pool_is_missed_as_usual() -> None:
    eng = two_pools()
    eng.pause("a", 0.0)
    rec = submit(eng, "a", extra=Extras(start_at=10.0, tolerance=1.0, on_miss="skip"))
    for t in (9.0, 10.0, 10.5, 11.5):
        eng.advance(t)
        eng.dispatch(t)
    assert rec.status != RUNNING and rec.status != READY
    assert rec.attempt == 0


def test_unserved_flags_a_backlog_without_capacity() -> None:
    eng = engine_of(PoolConfig("a", capacity=0), PoolConfig("b", capacity=1))
    assert not any(p.unserved for p in eng.snapshot(0.0).pools)  # no backlog yet
    submit(eng, "a")
    submit(eng, "b")
    submit(eng, "b")
    eng.dispatch(0.0)
    snap = {p.name: p for p in eng.snapshot(0.0).pools}
    assert snap["a"].unserved  # waits, and nothing can run it
    assert not snap["b"].unserved  # waits, but a slot will take it
    eng.set_capacity("a", 1, 1.0)
    assert not eng.snapshot(1.0).pools[0].unserved


def ended(eng: Engine, pool: str, status: int, now: float = 0.0, **kw: object) -> TaskRecord:
    rec = submit(eng, pool, now, **kw)
    if status == CANCELLED:
        eng.cancel(rec.id, now)
        return rec
    eng.dispatch(now)
    att = rec.running
    assert att is not None
    if status == SUCCEEDED:
        eng.complete(att, now)
    else:
        eng.fail(att, now, "boom", permanent=True)
    assert rec.status == status
    return rec


def test_delete_forgets_ended_tasks_and_journals_them() -> None:
    eng = engine_of(PoolConfig("a", capacity=1), journal=True)
    done = ended(eng, "a", SUCCEEDED, key="k1")
    failed = ended(eng, "a", FAILED, 1.0)
    live = submit(eng, "a", 2.0)
    eng.take_journal()
    deleted = eng.delete([done, failed, live])
    assert deleted == [done, failed]  # a live task is not deleted
    assert eng.lookup(done.id) is None and eng.lookup("k1") is None
    assert eng.lookup(failed.id) is None
    assert eng.lookup(live.id) is live
    assert eng.take_journal().deleted == [done.id, failed.id]
    assert eng.delete([done]) == []  # gone already
    # retention still prunes what it holds, the deleted ones included, without error
    eng.advance(10_000.0)
    assert eng.lookup(live.id) is live


def test_delete_keeps_an_ended_task_a_live_task_depends_on() -> None:
    eng = engine_of(PoolConfig("a", capacity=1), PoolConfig("b", capacity=0))
    parent = ended(eng, "a", FAILED, key="parent")
    other = ended(eng, "a", FAILED)
    child = submit(eng, "b", extra=Extras(deps=[(parent.id, "completed")]))
    by_key = submit(eng, "b", extra=Extras(deps=[("parent", "completed")]))
    assert child.status < SUCCEEDED and by_key.status < SUCCEEDED
    assert eng.delete([parent, other]) == [other]


def test_mass_deletion_compacts_what_retention_holds() -> None:
    eng = engine_of(PoolConfig("a", capacity=1))
    recs = [ended(eng, "a", CANCELLED, float(i)) for i in range(3000)]
    assert len(eng.delete(recs[:2900])) == 2900
    assert len(eng._st.retained) < 3000  # rebuilt without the deleted
    assert [r.id for r in eng._st.retained] == [r.id for r in recs[2900:]]


def test_resubmission_copies_spec_payload_and_tags_but_not_the_key() -> None:
    eng = engine_of(PoolConfig("a", capacity=1))
    rec = ended(
        eng,
        "a",
        FAILED,
        key="once",
        cls=1,
        kind="mail",
        tenant="t1",
        timeout=5.0,
        tags={"team": "x"},
    )
    copy = resubmission(rec)
    assert copy.payload == rec.payload == "payload-a"  # kept by a task that did not succeed
    assert (copy.pool, copy.cls, copy.kind, copy.tenant, copy.timeout) == (
        "a",
        1,
        "mail",
        "t1",
        5.0,
    )
    assert copy.tags == {"team": "x"} and copy.tags is not rec.tags
    assert copy.key is None
    new, dup = eng.submit(copy, 1.0)
    assert not dup and new.id != rec.id


def test_resubmission_copies_the_options_kept_in_extras() -> None:
    rec = TaskRecord(
        b"x",
        "a",
        labels={"gpu": "1"},
        extra=Extras(resources={"db": 1}, deps=[(7, "completed")], start_at=5.0, tolerance=2.0),
    )
    copy = resubmission(rec)
    assert copy.extra is not None and copy.extra is not rec.extra
    assert copy.extra.spec() == rec.extra.spec()  # type: ignore[union-attr]
    assert copy.labels == {"gpu": "1"}
    assert resubmission(TaskRecord(b"y", "a")).extra is None


def test_each_attempt_remembers_its_worker() -> None:
    eng = engine_of(
        PoolConfig("a", capacity=1, retry=RetryPolicy(max_attempts=3, initial_backoff=0.0))
    )
    rec = submit(eng, "a")
    for n, worker in enumerate([("w1", 1), ("w2", 2)]):
        eng.dispatch(float(n))
        att = rec.running
        assert att is not None and rec.worker is None  # a new attempt: no worker yet
        rec.worker = worker  # the server's driver, when it hands the lease out
        eng.fail(att, float(n), f"fail {n}")
        eng.advance(float(n) + 0.5)
    eng.dispatch(5.0)
    rec.worker = ("w3", 3)
    eng.complete(rec.running, 6.0)  # type: ignore[arg-type]
    assert [(p.number, p.worker) for p in rec.past_attempts] == [(1, ("w1", 1)), (2, ("w2", 2))]
    assert rec.worker == ("w3", 3)  # the latest attempt's
