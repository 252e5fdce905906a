"""The engine's public read seams that drivers (the server) use instead of its internals:
paging by id, pool configurations, pending counts, counters and worker-group room; and the
wake-up times it hands drivers."""

from __future__ import annotations

import pytest

from cronoq.core.autoscale import AutoscaleSettings
from cronoq.core.engine import Engine
from cronoq.core.model import Extras, PoolConfig, TaskRecord
from cronoq.core.resources import ResourceConfig


def make(capacity: int = 0, *, retention: float = 3600.0, journal: bool = False) -> Engine:
    pools = [PoolConfig("p", capacity=capacity), PoolConfig("q", capacity=0)]
    return Engine(pools, 0.0, retention=retention, journal=journal)


def submit(eng: Engine, pool: str = "p", labels: dict[str, str] | None = None) -> TaskRecord:
    rec, dup = eng.submit(TaskRecord(None, pool, labels=labels), 0.0)
    assert not dup
    return rec


def ids(recs: list[TaskRecord]) -> list[int]:
    return [r.id for r in recs]


def test_page_walks_ids_in_order_with_a_continuation() -> None:
    eng = make()
    recs = [submit(eng, "p" if i % 2 else "q") for i in range(10)]
    page, more = eng.page(0, 4)
    assert (ids(page), more) == ([1, 2, 3, 4], True)
    page, more = eng.page(4, 4)
    assert (ids(page), more) == ([5, 6, 7, 8], True)
    page, more = eng.page(8, 4)
    assert (ids(page), more) == ([9, 10], False)
    page, more = eng.page(0, 3, lambda r: r.pool == "p")
    assert (ids(page), more) == ([2, 4, 6], True)
    assert eng.page(10, 5) == ([], False)
    # exactly `limit` matches left: no further page
    assert ids(eng.page(6, 4)[0]) == [7, 8, 9, 10] and not eng.page(6, 4)[1]
    assert all(r is eng.lookup(r.id) for r in recs)


def test_page_sees_tasks_admitted_after_the_index_was_built_and_skips_forgotten_ones() -> None:
    eng = make(capacity=1, retention=10.0)
    first = submit(eng)
    assert ids(eng.page(0, 10)[0]) == [first.id]  # builds the index
    eng.dispatch(0.0)
    (att,) = eng.take().starts
    eng.complete(att, 1.0)
    later = [submit(eng) for _ in range(3)]
    assert ids(eng.page(0, 10)[0]) == [first.id, *ids(later)]
    eng.advance(11.0)  # the finished task's retention ran out
    assert eng.lookup(first.id) is None
    assert ids(eng.page(0, 10)[0]) == ids(later)


def test_page_orders_a_batch_admitted_parents_first_by_id() -> None:
    """A batch whose tasks depend on later ones is admitted parents first, but its ids follow
    the batch order: pages are by id, not by admission."""
    eng = make()
    eng.page(0, 1)  # the index exists before the batch
    child = TaskRecord(None, "p", key="c", extra=Extras(deps=[("a", "success")]))
    parent = TaskRecord(None, "p", key="a")
    eng.submit_batch([child, parent], 0.0)
    assert child.id < parent.id
    assert ids(eng.page(0, 10)[0]) == [child.id, parent.id]


def test_page_after_restore_is_in_id_order() -> None:
    old = make()
    recs = [submit(old) for _ in range(5)]
    new = make()
    new.restore(reversed(recs), 0.0)
    assert ids(new.page(0, 10)[0]) == [1, 2, 3, 4, 5]


def test_pool_configs_pending_and_counters() -> None:
    eng = make()
    assert set(eng.configs) == {"p", "q"}
    assert eng.configs["p"].capacity == 0
    with pytest.raises(TypeError):
        eng.configs["x"] = PoolConfig("x")  # type: ignore[index]
    submit(eng)
    submit(eng, "q")
    assert eng.pending() == 2
    before = eng.totals["stale_completions"]
    eng.count("stale_completions")
    assert eng.totals["stale_completions"] == before + 1


def test_group_has_room() -> None:
    eng = make(capacity=1)
    assert eng.group_has_room("p", frozenset())  # no groups: every slot is alike
    eng.set_group_capacity("p", {"gpu": "a100"}, 1, 0.0)
    gpu = frozenset({("gpu", "a100")})
    assert eng.group_has_room("p", gpu)
    assert eng.group_has_room("p", frozenset())  # the one unlabeled slot is free
    assert not eng.group_has_room("p", frozenset({("gpu", "h100")}))  # no such group
    submit(eng, labels={"gpu": "a100"})
    eng.dispatch(0.0)
    assert not eng.group_has_room("p", gpu)
    assert eng.group_has_room("p", frozenset())


def test_an_attempt_moved_within_its_group_without_slots_keeps_the_group() -> None:
    """move_attempt onto the group it runs on, after that group lost its slots: the group
    stays while the attempt runs, so the slots declared for it again outlive the attempt
    (the group used to be dropped, the attempt kept on a detached copy, and its end then
    dropped the redeclared group: labeled tasks waited forever for its slot)."""
    eng = make(capacity=0)
    gpu = {"gpu": "a100"}
    eng.set_group_capacity("p", gpu, 1, 0.0)
    first = submit(eng, labels=gpu)
    eng.dispatch(0.0)
    att = first.running
    assert att is not None
    eng.set_group_capacity("p", gpu, 0, 1.0)
    eng.move_attempt(att, gpu)
    eng.set_group_capacity("p", gpu, 1, 2.0)
    eng.complete(att, 3.0)
    assert eng.group_has_room("p", frozenset(gpu.items()))
    second = submit(eng, labels=gpu)
    eng.dispatch(3.0)
    assert second.status_name == "running"


def test_has_room_for_n_and_desired() -> None:
    """`has_room(pool, n)`: room for n more pending tasks (what a held batch needs); `desired`:
    the target of the pool's snapshot, read without one (the webhook scaler's seam)."""
    scaling = AutoscaleSettings(drain_time=0.1)
    pools = [
        PoolConfig("p", capacity=0, max_pending=3),
        PoolConfig("a", capacity=0, min=1, max=3, autoscale=scaling),
    ]
    eng = Engine(pools, 0.0, elastic=False)
    assert eng.has_room("p", 3) and not eng.has_room("p", 4)
    submit(eng)
    assert eng.has_room("p") and eng.has_room("p", 2) and not eng.has_room("p", 3)
    assert eng.desired("p") == 0  # not autoscaled: the capacity
    eng.advance(0.0)  # the first evaluation: no demand, so `min`
    assert eng.desired("a") == 1
    submit(eng, "a")
    eng.advance(1.0)  # one queued task drains in 10 s at 0.1 s: capped at max
    assert eng.desired("a") == 3
    assert [p.desired for p in eng.snapshot(1.0).pools] == [0, 3]


def test_desired_with_remote_capacity_keeps_its_course() -> None:
    """With capacity from outside (`elastic=False`), a backlog that no connected worker can
    drain asks for `max` and keeps asking, stepping up from the last target as if it had been
    applied; once the demand is gone it steps down as an elastic pool would (after the
    stabilization window, one per cooldown), not straight to 0."""
    eng = Engine(
        [PoolConfig("p", capacity=0, min=0, max=10, autoscale=AutoscaleSettings())],
        0.0,
        elastic=False,
    )
    recs = [submit(eng) for _ in range(20)]
    course = []
    for t in range(0, 121):
        eng.advance(float(t))
        course.append(eng.desired("p"))
    assert course[:4] == [4, 8, 10, 10]
    assert set(course[2:]) == {10}  # the backlog stays and no worker comes: max, and it stays
    for rec in recs:
        eng.cancel(rec.id, 120.5)
    later = {}
    for t in range(121, 400):
        eng.advance(float(t))
        later[t] = eng.desired("p")
    assert later[179] == 10  # the window (60 s) still holds the backlog's target of t=120
    downs = [t for t in range(122, 400) if later[t] < later[t - 1]]
    assert downs[:3] == [180, 210, 240] and later[240] == 7  # -1 per 30 s cooldown


def test_a_connected_worker_ends_the_stranded_demand() -> None:
    """One worker's slot makes the backlog drainable again: the demand is the formula's."""
    scaling = AutoscaleSettings(stabilization_window=0.0, cooldown=0.0, max_step_down=10)
    eng = Engine(
        [PoolConfig("p", capacity=0, min=0, max=10, autoscale=scaling)], 0.0, elastic=False
    )
    submit(eng)
    eng.advance(0.0)
    assert eng.desired("p") == 4  # stranded: towards max
    eng.set_capacity("p", 1, 0.5)
    eng.dispatch(0.5)
    eng.advance(1.0)
    assert eng.desired("p") == 1  # one running task (busy 1), nothing queued: one worker


def test_take_journal_hands_over_what_changed() -> None:
    eng = make(journal=True)
    rec = submit(eng)
    journal = eng.take_journal()
    assert journal.added == [rec]
    assert not eng.take_journal()
    eng.cancel(rec.id, 1.0)
    assert list(eng.take_journal().changed) == [rec.id]
    with pytest.raises(AssertionError):
        make().take_journal()


def test_a_bucket_short_by_less_than_the_float_step_wakes_strictly_later() -> None:
    """At Unix-sized times a tiny shortfall refills in less than the float step of `now`; the
    refill wake-up must still come after `now`, or advance() would fire it forever."""
    now = 1_700_000_000.0
    bucket = ResourceConfig("api", "token_bucket", rate=1000.0, burst=1)
    eng = Engine([PoolConfig("p", capacity=4)], now, resources=[bucket])
    first, _ = eng.submit(TaskRecord(None, "p", extra=Extras(resources={"api": 1})), now)
    eng.dispatch(now)
    assert first.status_name == "running"
    state = eng.resources["api"]
    state.tokens = 1.0 - 1e-8  # short by far less than rate x float step
    second, _ = eng.submit(TaskRecord(None, "p", extra=Extras(resources={"api": 1})), now)
    eng.dispatch(now)
    wake = eng.next_wake()
    assert wake is not None and wake > now
    eng.advance(now)  # returns: nothing is due at `now`
    eng.advance(wake)
    eng.dispatch(wake)
    assert second.status_name == "running"
