"""The server's remote-worker layer (cronoq.server.services.worker_leases) on a real engine and
virtual clock: grants, label groups, lease bookkeeping and every outcome of worker protocol v3
(docs/protocol.md)."""

from __future__ import annotations

import pytest

from cronoq.core.engine import Engine
from cronoq.core.model import PoolConfig, RetryPolicy, TaskRecord
from cronoq.server.services.worker_leases import (
    MSG_DISCONNECTED,
    MSG_NACKED,
    MSG_NO_WORKER,
    WorkerError,
    Workers,
)

T0 = 1_700_000_000.0


def setup(
    *, max_: int = 8, cap: int | None = None, slot_cap: int | None = None, ttl: float | None = None
) -> tuple[Engine, Workers]:
    pool = PoolConfig(
        "p",
        capacity=0,
        min=0,
        max=max_,
        lease_ttl=ttl,
        retry=RetryPolicy(max_attempts=3, initial_backoff=0.0, jitter=False),
    )
    eng = Engine([pool], T0)
    return eng, Workers(eng, pool_max={"p": max_}, pool_slot_caps={"p": cap}, slot_cap=slot_cap)


def submit(eng: Engine, n: int = 1, **kw: object) -> list[TaskRecord]:
    out = []
    for i in range(n):
        rec, _ = eng.submit(TaskRecord(i, "p", **kw), T0)  # type: ignore[arg-type]
        out.append(rec)
    return out


def dispatch(eng: Engine, ws: Workers, now: float = T0) -> list[tuple[str, int, int]]:
    """(worker name, task id, attempt) of every lease the engine hands out now."""
    eng.advance(now)
    eng.dispatch(now)
    return [(w.name, a.task.id, a.number) for w, a in ws.assign(eng.take().starts, now)]


def test_grant_is_capped_by_the_pool_and_both_per_worker_caps() -> None:
    _, ws = setup(max_=8, cap=5, slot_cap=3)
    assert ws.register("p", 10, "a", {}, T0).granted == 3
    _, ws2 = setup(max_=8, cap=5)
    assert ws2.register("p", 10, "a", {}, T0).granted == 5
    eng3, ws3 = setup(max_=4)
    assert ws3.register("p", 10, "a", {}, T0).granted == 4
    assert ws3.register("p", 2, "b", {}, T0).granted == 2
    assert eng3.pools["p"].capacity == 6  # capacity is the sum of the grants


def test_register_refuses_an_unknown_pool() -> None:
    _, ws = setup()
    with pytest.raises(WorkerError) as e:
        ws.register("nope", 1, "a", {}, T0)
    assert (e.value.code, e.value.message) == ("NOT_FOUND", "unknown pool 'nope'")
    assert list(ws.workers()) == []


def test_a_worker_registered_with_zero_slots_gets_leases_once_it_sets_some() -> None:
    eng, ws = setup()
    w = ws.register("p", 0, "a", {}, T0)
    assert (w.granted, eng.pools["p"].capacity) == (0, 0)
    (rec,) = submit(eng, 1)
    assert dispatch(eng, ws) == []
    assert ws.set_slots(w, 2, T0) == 2
    assert [(name, task) for name, task, _ in dispatch(eng, ws)] == [("a", rec.id)]
    # the same with labels: a worker group of no slots until then
    g = ws.register("p", 0, "g", {"gpu": "x"}, T0)
    (labeled,) = submit(eng, 1, labels={"gpu": "x"})
    assert dispatch(eng, ws) == [] and g.granted == 0
    ws.set_slots(g, 1, T0)
    assert [(name, task) for name, task, _ in dispatch(eng, ws)] == [("g", labeled.id)]


def test_leases_go_to_the_worker_with_most_free_slots_and_never_beyond_grants() -> None:
    eng, ws = setup()
    a = ws.register("p", 2, "a", {}, T0)
    b = ws.register("p", 1, "b", {}, T0)
    recs = submit(eng, 5)
    leases = dispatch(eng, ws)
    assert sorted(name for name, _, _ in leases) == ["a", "a", "b"]
    assert (a.free, b.free) == (0, 0)
    assert [t for _, t, _ in leases] == [r.id for r in recs[:3]]
    assert dispatch(eng, ws) == []  # no free slot anywhere
    assert eng.pools["p"].busy == 3


def test_labeled_tasks_go_to_matching_workers_unlabeled_ones_to_unlabeled_workers_first() -> None:
    eng, ws = setup()
    ws.register("p", 1, "plain", {}, T0)
    ws.register("p", 2, "gpu", {"gpu": "1", "zone": "x"}, T0)
    (labeled,) = submit(eng, 1, labels={"gpu": "1"})
    (plain,) = submit(eng, 1)
    got = {task: name for name, task, _ in dispatch(eng, ws)}
    assert got == {labeled.id: "gpu", plain.id: "plain"}
    (second_plain,) = submit(eng, 1)  # unlabeled slots are full: a group slot is used
    assert dispatch(eng, ws) == [("gpu", second_plain.id, 1)]


def test_complete_and_stale_reports() -> None:
    eng, ws = setup()
    a = ws.register("p", 1, "a", {}, T0)
    b = ws.register("p", 1, "b", {}, T0)
    (rec,) = submit(eng)
    dispatch(eng, ws)
    holder, other = (a, b) if a.leases else (b, a)
    lease = next(iter(holder.leases))
    assert ws.complete(other, lease, "x", T0 + 1) is False  # not its lease
    assert eng.totals["stale_completions"] == 1
    assert ws.complete(holder, lease, "out", T0 + 1) is True
    assert (rec.status_name, rec.output) == ("succeeded", "out")
    assert holder.free == 1
    assert ws.complete(holder, lease, "again", T0 + 2) is False
    assert eng.totals["stale_completions"] == 2


def test_failures_retry_dead_letter_or_fail_permanently() -> None:
    eng, ws = setup()
    w = ws.register("p", 1, "w", {}, T0)
    (rec,) = submit(eng)
    for attempt in (1, 2, 3):
        assert dispatch(eng, ws, T0 + attempt) == [("w", rec.id, attempt)]
        assert ws.fail(w, next(iter(w.leases)), f"boom {attempt}", T0 + attempt)
    assert (rec.status_name, rec.message) == ("dead_lettered", "boom 3")
    (rec2,) = submit(eng)
    dispatch(eng, ws, T0 + 5)
    assert ws.fail(w, next(iter(w.leases)), "bad input", T0 + 5, permanent=True)
    assert rec2.status_name == "failed" and rec2.attempt == 1


def test_nack_offers_the_same_attempt_to_another_worker_once() -> None:
    eng, ws = setup()
    a = ws.register("p", 1, "a", {}, T0)
    (rec,) = submit(eng)
    ((_, _, attempt),) = dispatch(eng, ws)
    b = ws.register("p", 1, "b", {}, T0)
    lease = next(iter(a.leases))
    moved = ws.nack(a, lease, T0 + 1)
    assert moved is not None
    assert (moved[0].name, moved[1].lease, moved[1].number) == ("b", lease, attempt)
    assert (a.free, b.free) == (1, 0)
    assert rec.status_name == "running" and eng.totals["dispatched"] == 1
    # b hands it back too; a refused it already: nobody is left, so it fails as retryable
    assert ws.nack(b, lease, T0 + 2, "no task function for kind 'k'") is None
    assert (rec.status_name, rec.message) == (
        "retrying",
        f"{MSG_NACKED}: no task function for kind 'k'",
    )
    assert eng.pools["p"].busy == 0


def test_nack_may_move_an_unlabeled_attempt_to_a_labeled_worker() -> None:
    eng, ws = setup()
    plain = ws.register("p", 1, "plain", {}, T0)
    (rec,) = submit(eng)
    dispatch(eng, ws)
    gpu = ws.register("p", 1, "gpu", {"gpu": "1"}, T0)
    moved = ws.nack(plain, next(iter(plain.leases)), T0 + 1)
    assert moved is not None and moved[0] is gpu
    groups = eng.pools["p"].groups
    assert groups is not None
    assert groups.unlabeled_busy == 0 and groups.by_key[gpu.key].busy == 1
    # the unlabeled slot is free again for the next task
    (nxt,) = submit(eng)
    assert dispatch(eng, ws, T0 + 2) == [("plain", nxt.id, 1)]
    assert ws.complete(gpu, next(iter(gpu.leases)), None, T0 + 3)
    assert rec.status_name == "succeeded" and groups.by_key[gpu.key].busy == 0


def test_nack_never_moves_an_attempt_into_a_group_slot_the_engine_already_gave_away() -> None:
    """With a store, started attempts are assigned only after their commit; a hand-back in
    between must not take their slot (assign() then found no worker, and the server lost the
    whole commit group: leases until their TTL, unanswered submits)."""
    eng, ws = setup()
    gpu = ws.register("p", 1, "gpu", {"gpu": "1"}, T0)
    submit(eng)
    dispatch(eng, ws)  # no unlabeled slot yet: the gpu slot runs it
    ws.register("p", 1, "plain", {}, T0)
    (nxt,) = submit(eng)
    eng.dispatch(T0)
    held = eng.take().starts  # nxt got plain's slot; not assigned yet (its commit is in flight)
    assert ws.nack(gpu, next(iter(gpu.leases)), T0 + 1) is None  # plain's slot is taken
    assert [(w.name, a.task.id) for w, a in ws.assign(held, T0 + 1)] == [("plain", nxt.id)]
    groups = eng.pools["p"].groups
    assert groups is not None and groups.unlabeled_busy == 1


def test_an_attempt_whose_slot_went_before_it_was_assigned_fails_as_retryable() -> None:
    """A worker drains (its stop()) while a start on its free slot is being written: that
    attempt runs nowhere; it is retried, and assign() no longer raises (which lost the rest of
    the commit group on the server)."""
    eng, ws = setup()
    ws.register("p", 1, "a", {}, T0)
    b = ws.register("p", 1, "b", {}, T0)
    submit(eng)
    dispatch(eng, ws)
    (rec,) = submit(eng)
    eng.dispatch(T0)
    held = eng.take().starts
    ws.set_slots(b, 0, T0)
    assert ws.assign(held, T0 + 1) == []
    assert (rec.status_name, rec.attempt, rec.message) == ("retrying", 1, MSG_NO_WORKER)
    assert eng.pools["p"].busy == 1


def test_a_dropped_worker_loses_its_slots_and_its_attempts_retry_elsewhere() -> None:
    eng, ws = setup()
    a = ws.register("p", 2, "a", {}, T0)
    recs = submit(eng, 2)
    dispatch(eng, ws)
    ws.drop(a, T0 + 1)
    assert eng.pools["p"].capacity == 0
    assert [(r.status_name, r.message) for r in recs] == [("retrying", MSG_DISCONNECTED)] * 2
    ws.register("p", 2, "b", {}, T0 + 1)
    leases = dispatch(eng, ws, T0 + 2)
    assert sorted(leases) == sorted(("b", r.id, 2) for r in recs)
    ws.drop(a, T0 + 3)  # twice is harmless
    assert [w.name for w in ws.workers()] == ["b"]


def test_set_slots_zero_drains_without_revoking() -> None:
    eng, ws = setup()
    w = ws.register("p", 2, "w", {}, T0)
    (first,) = submit(eng)
    dispatch(eng, ws)
    assert ws.set_slots(w, 0, T0 + 1) == 0
    assert eng.pools["p"].capacity == 0
    submit(eng)
    assert dispatch(eng, ws, T0 + 1) == []
    assert first.status_name == "running"
    assert ws.complete(w, next(iter(w.leases)), None, T0 + 2)
    assert ws.set_slots(w, 50, T0 + 3) == 8  # capped like a registration
    assert len(dispatch(eng, ws, T0 + 3)) == 1


def test_lease_expiry_aborts_the_attempt_and_frees_the_slot() -> None:
    eng, ws = setup(ttl=10.0)
    w = ws.register("p", 1, "w", {}, T0)
    (rec,) = submit(eng)
    dispatch(eng, ws)
    lease = next(iter(w.leases))
    ws.heartbeat(w, lease, T0 + 8)  # the lease now runs until T0 + 18
    eng.advance(T0 + 15)
    assert ws.aborted(eng.take().aborts) == []
    eng.advance(T0 + 18.5)
    out = eng.take()
    aborted = ws.aborted(out.aborts)
    assert [(x.name, att.lease, att.abort_reason) for x, att in aborted] == [
        ("w", lease, "lease expired")
    ]
    assert w.free == 1
    # failed as retryable (zero backoff here: ready again at once)
    assert (rec.status_name, rec.attempt, eng.totals["retries"]) == ("ready", 1, 1)
    assert eng.totals["lease_expiries"] == 1
    assert ws.complete(w, lease, "late", T0 + 19) is False  # stale now


def test_cancelled_by_the_worker_ends_the_task_without_an_abort() -> None:
    eng, ws = setup()
    w = ws.register("p", 1, "w", {}, T0)
    (rec,) = submit(eng)
    dispatch(eng, ws)
    assert ws.cancelled(w, next(iter(w.leases)), T0 + 1)
    assert rec.status_name == "cancelled"
    assert ws.aborted(eng.take().aborts) == []  # nothing to send back
    assert w.free == 1
