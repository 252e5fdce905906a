"""The Rust engine core decides exactly as the Python one: hypothesis draws configurations and
operation sequences (parity/engine_ops.py), both engines run them, and every operation's return
value, actions, next wake-up, counters, journal and parking state must be equal, field by field.

A run compares 2,000 sequences of every feature (some 60k operations) and 150 each where every
pool is autoscaled or has fair share, or where fixed starts and recurring schedules abound, or
most tasks have dependencies, or resources and worker groups are everywhere (some 6-10k
operations each), about 40 s on this 2-core machine when it is quiet; CRONOQ_PARITY_SCALE=N: N
times as many; `python tests/parity/long.py --ops 1000000` runs a long one on fresh seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType

import pytest
from hypothesis import given

from cronoq.core.model import TOTALS_KEYS
from parity.budget import examples
from parity.engine_ops import Config, Op, check, run_python, scenarios


@examples(2000)
@given(scenarios(max_ops=120))
def test_engines_make_the_same_decisions(
    core_py: ModuleType, scenario: tuple[Config, list[Op]]
) -> None:
    check(core_py, *scenario)


@examples(150)
@given(scenarios(max_ops=200, focus="autoscale"))
def test_autoscaled_pools_decide_the_same(
    core_py: ModuleType, scenario: tuple[Config, list[Op]]
) -> None:
    """Every pool autoscaled: `desired`, the capacity it sets (elastic) or not, evaluations."""
    check(core_py, *scenario)


@examples(150)
@given(scenarios(max_ops=200, focus="fair"))
def test_fair_share_pools_decide_the_same(
    core_py: ModuleType, scenario: tuple[Config, list[Op]]
) -> None:
    """Every pool with fair share: tenants' turns, weights, idle tenants re-entering."""
    check(core_py, *scenario)


@examples(150)
@given(scenarios(max_ops=200, focus="fixed"))
def test_fixed_starts_and_schedules_decide_the_same(
    core_py: ModuleType, scenario: tuple[Config, list[Op]]
) -> None:
    """Most submits with a fixed start, schedules in every sequence, short steps of time (so
    occurrences are created ahead of their time and overlap) and jumps past tolerances."""
    check(core_py, *scenario)


@examples(150)
@given(scenarios(max_ops=200, focus="deps"))
def test_dependencies_decide_the_same(
    core_py: ModuleType, scenario: tuple[Config, list[Op]]
) -> None:
    """Most tasks with dependencies and every pool awaiting unknown keys: blocking, releases,
    skips and their cascades, await timeouts, batches' forward references and cycles."""
    check(core_py, *scenario)


def _config(
    *,
    elastic: bool = True,
    resources: Sequence[tuple[object, ...]] = (),
    aging_rates: tuple[float, ...] | None = None,
    age_caps: tuple[float, ...] | None = None,
    **pool: object,
) -> Config:
    base = {"name": "p0", "capacity": 1, "ttl": None, "retry": None, "duration": 1.0}
    base |= {"max_pending": None, "overflow": "wait", "cost": 0.5, "min": 1, "max": 10}
    base |= {"autoscale": None, "fair_share": False, "weights": []}
    base |= {"unknown_dependency": "reject", "await_timeout": None, "fraction": 0.5}
    base |= {"max_hold": None, "metrics_window": 60.0} | pool
    scoring = ((10000.0, 1000.0, 100.0, 10.0), 2.0, 800.0, 5.0, 5000.0, 10.0, 4000.0)
    scoring += (aging_rates, age_caps)
    return (7, scoring, 2, 60.0, 100, [tuple(base.values())], elastic, list(resources), True)


def _spec(
    cls: int,
    *,
    key: str | None = None,
    deadline: float | None = None,
    tenant: str | None = None,
    start: tuple[float, float, str] | None = None,
    deps: list[tuple[int | str, str]] | None = None,
    resources: list[tuple[str, int]] | None = None,
    labels: list[tuple[str, str]] | None = None,
) -> tuple[object, ...]:
    return ("p0", cls, "a", key, deadline, None, None, None, tenant, start, deps, resources, labels)


def test_a_retry_with_jitter_and_its_timer(core_py: ModuleType) -> None:
    """Jitter draws from the injected generator: a failed attempt retries at the same time."""
    ops: list[Op] = [
        ("submit", 0.0, *_spec(2)),
        ("dispatch", 0.0),
        ("fail", 1.0, 0, "boom", False, None),
        ("advance", 1.3),
        ("advance", 2.0),
        ("dispatch", 2.0),
        ("complete", 2.5, 0),
        ("advance", 70.0),
    ]
    check(core_py, _config(), ops)
    retried = run_python(_config(), ops)[2][1]
    assert retried == [], "the retry waits for its backoff"


def test_overflow_sheds_and_aging_and_deadlines_order_the_queue(core_py: ModuleType) -> None:
    """A full pool sheds the newest low task; an overdue deadline outranks an older task."""
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 0),
        ("submit", 0.0, *_spec(3)),
        ("submit", 0.5, *_spec(3, key="k0")),
        ("submit", 1.0, *_spec(2)),
        ("submit", 1.5, *_spec(0)),
        ("submit", 2.0, *_spec(2, deadline=3.0)),
        ("set_capacity", 9.0, "p0", 4),
        ("dispatch", 9.0),
        ("lookup", 9.0, "k0"),
        ("snapshot", 9.5),
    ]
    check(core_py, _config(max_pending=3, overflow="shed_lowest"), ops)


def test_max_hold_per_class_aging_and_the_metrics_window(core_py: ModuleType) -> None:
    """The settings the generator draws only sometimes, each where it decides: a hold capped
    at 1 s ahead of its start (its tolerance would make it 5 s), LOW aging at 1000 points a
    second up to 5000 (past a fresh HIGH after 2 s), a 2.5 s metrics window."""
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 0),
        ("submit", 0.0, *_spec(3)),
        ("submit", 2.0, *_spec(1)),
        ("submit", 2.0, *_spec(2)),
        ("submit", 2.0, *_spec(2, start=(10.0, 5.0, "run_late"))),
        ("set_capacity", 2.0, "p0", 2),
        ("dispatch", 2.0),
        ("snapshot", 2.5),
        ("complete", 3.0, 0),
        ("complete", 3.0, 0),
        ("advance", 6.0),
        ("snapshot", 6.0),
        ("advance", 9.0),
        ("advance", 10.0),
        ("dispatch", 10.0),
        ("snapshot", 10.0),
    ]
    config = _config(
        capacity=2,
        max_hold=1.0,
        metrics_window=2.5,
        aging_rates=(2.0, 2.0, 2.0, 1000.0),
        age_caps=(800.0, 800.0, 800.0, 5000.0),
    )
    check(core_py, config, ops)


# AutoscaleSettings field by field (engine_ops._autoscale): 1 s interval, a 2 s drain time, a
# 0.5 s wait objective for class 0, a 3 s window and a 2.5 s cooldown down.
SCALED = (1.0, 0.75, 2.0, [(0, 0.5)], 60.0, 3.0, 2.5, 4, 1, 1.0, 0.5, 0.0)


def test_an_autoscaled_pool_follows_its_backlog(core_py: ModuleType) -> None:
    """Elastic, the targets become the capacity; not elastic, only `desired` moves."""
    ops: list[Op] = [("submit", 0.0, *_spec(c % 4)) for c in range(10)]
    ops += [("advance", 0.0), ("dispatch", 0.0), ("advance", 1.0), ("dispatch", 1.0)]
    ops += [("complete", 1.5, 0), ("complete", 1.5, 0), ("advance", 2.0), ("dispatch", 2.0)]
    ops += [("snapshot", 2.0), ("cancel", 2.5, 9), ("cancel", 2.5, 10), ("advance", 20.0)]
    ops += [("snapshot", 20.0)]
    for elastic in (True, False):
        config = _config(elastic=elastic, capacity=0, min=0, max=6, autoscale=SCALED)
        check(core_py, config, ops)
        pools = [step[8][0] for step in run_python(config, ops)]
        desired = [p[10] for p in pools]
        capacity = [p[0] for p in pools]
        assert max(desired) == 6, "a backlog with a wait objective asks for more"
        assert max(capacity) == (6 if elastic else 0)


def test_fair_share_takes_turns_by_weight(core_py: ModuleType) -> None:
    """Tenant t0 weighs 2: two of its tasks start for one of t1's and of the untenanted."""
    ops: list[Op] = [("set_capacity", 0.0, "p0", 0)]
    ops += [("submit", 0.0, *_spec(2, tenant="t0")) for _ in range(4)]
    ops += [("submit", 0.5, *_spec(2, tenant="t1")) for _ in range(3)]
    ops += [("submit", 1.0, *_spec(2, deadline=60.0)) for _ in range(2)]
    ops += [("set_capacity", 2.0, "p0", 1)]
    for i in range(9):
        ops += [("dispatch", 2.0 + i), ("complete", 2.5 + i, 0)]
    config = _config(fair_share=True, weights=[("t0", 2.0), ("t2", 0.5)])
    check(core_py, config, ops)
    started = [step[1][0][0] for step in run_python(config, ops) if step[1]]
    assert started == [1, 5, 8, 2, 3, 6, 9, 4, 7]


def test_an_idle_tenant_reenters_level_with_the_others(core_py: ModuleType) -> None:
    """t1 arrives after three of t0's tasks started: it starts at their position (no burst
    of catching up), so t0's fourth, older, goes before t1's second."""
    ops: list[Op] = [("submit", 0.0, *_spec(2, tenant="t0")) for _ in range(4)]
    for i in range(3):
        ops += [("dispatch", 1.0 + i), ("complete", 1.5 + i, 0)]
    ops += [("submit", 10.0, *_spec(2, tenant="t1")) for _ in range(2)]
    for i in range(3):
        ops += [("dispatch", 11.0 + i), ("complete", 11.5 + i, 0)]
    config = _config(fair_share=True)
    check(core_py, config, ops)
    started = [step[1][0][0] for step in run_python(config, ops) if step[1]]
    assert started == [1, 2, 3, 5, 4, 6]


def test_a_tenant_weight_is_refused_with_the_same_message(core_py: ModuleType) -> None:
    for weight in (0.0, -1.0, math.inf, math.nan):
        config = _config(fair_share=True, weights=[("t0", 2.0), ("t1", weight)])
        with pytest.raises(ValueError) as python:
            run_python(config, [])
        with pytest.raises(ValueError) as rust:
            core_py.run_engine(config, [])
        assert str(python.value) == str(rust.value) == "tenant weights must be finite and > 0"
    # Without fair share the weights are not read, in either engine.
    check(core_py, _config(weights=[("t0", 0.0)]), [("submit", 0.0, *_spec(2, tenant="t0"))])


def _statuses(config: Config, ops: list[Op]) -> dict[int, str]:
    """Each task's status at the end, from the Python run's journal."""
    out: dict[int, str] = {}
    for step in run_python(config, ops):
        for row in step[9][0] + step[9][1]:
            out[row[0]] = row[10]
    return out


def test_a_fixed_start_holds_its_slot_and_each_on_miss_applies(core_py: ModuleType) -> None:
    """The slot is held from start - lead (plain tasks wait), the start is on time; tasks
    whose start passed beyond their tolerance are missed, failed or run late."""
    ops: list[Op] = [
        ("submit", 0.0, *_spec(2, start=(5.0, 1.0, "skip"))),
        ("submit", 0.0, *_spec(3, start=(2.0, 0.5, "skip"))),
        ("advance", 4.0),
        ("submit", 4.0, *_spec(0)),
        ("dispatch", 4.0),  # the slot is held: the plain task waits
        ("advance", 5.0),
        ("dispatch", 5.0),
        ("snapshot", 5.0),
        ("set_capacity", 5.0, "p0", 0),
        ("submit", 5.0, *_spec(2, start=(6.0, 1.0, "skip"))),
        ("submit", 5.0, *_spec(2, start=(6.0, 1.0, "fail"))),
        ("submit", 5.0, *_spec(2, start=(6.0, 1.0, "run_late"))),
        ("submit", 5.0, *_spec(2, start=(1.0, 1.0, "fail"))),  # past its tolerance already
        ("advance", 6.5),
        ("advance", 60.0),
        ("dispatch", 60.0),
        ("set_capacity", 60.0, "p0", 2),
        ("dispatch", 60.0),
        ("snapshot", 60.0),
    ]
    config = _config(max=10)
    check(core_py, config, ops)
    trace = run_python(config, ops)
    assert trace[4][1] == [] and trace[6][1][0][0] == 1, "held at 4.0, started at 5.0"
    assert _statuses(config, ops) == {
        1: "running",
        2: "missed",
        3: "ready",  # the due run_late task took the second slot first
        4: "missed",
        5: "failed",
        6: "running",
        7: "failed",
    }


def test_reservations_count_batch_mates_and_the_admitted(core_py: ModuleType) -> None:
    """Limit 1 (max 2 x 0.5): overlapping reservations conflict, in a batch and one by one;
    touching ones do not."""
    fixed = [_spec(2, start=(10.0, 1.0, "skip")), _spec(2, start=(11.5, 1.0, "skip"))]
    ops: list[Op] = [
        ("batch", 0.0, fixed),
        ("submit", 0.0, *_spec(2, start=(10.0, 1.0, "skip"))),
        ("submit", 0.0, *_spec(2, start=(12.0, 0.0, "skip"))),  # [9, 12) and [12, 13)
        ("submit", 0.0, *_spec(2, start=(12.5, 0.0, "skip"))),
        ("snapshot", 0.0),
    ]
    config = _config(max=2)
    check(core_py, config, ops)
    results = [step[0] for step in run_python(config, ops)]
    conflict = ("err", "reservation_conflict", "fixed-start reservation conflict")
    assert results[:4] == [conflict, ("ok", 1, False), ("ok", 2, False), conflict]


def _schedule(name: str, cron: str, overlap: str, key: str | None = "s0") -> tuple[object, ...]:
    """(name, cron, zone, template, overlap, tolerance, on_miss) as engine_ops draws them."""
    template = ("p0", 2, "a", key, None, None, None, None, None, None, None)
    return (name, cron, "Asia/Kathmandu", template, overlap, 1.0, "skip")


def test_an_occurrence_overlapping_a_running_one_is_skipped(core_py: ModuleType) -> None:
    """Every 5 s, never completed: with skip the second occurrence is skipped at its start;
    with allow both run (two slots)."""
    for overlap, skipped in (("skip", 1), ("allow", 0)):
        ops: list[Op] = [("add_recurring", 0.0, *_schedule("r0", "*/5 * * * * *", overlap))]
        for i in range(1, 13):
            ops += [("advance", float(i)), ("dispatch", float(i))]
        config = _config(capacity=2)
        check(core_py, config, ops)
        trace = run_python(config, ops)
        assert trace[-1][7][10] == skipped  # totals["skipped"]


def test_schedules_removed_replaced_and_resumed(core_py: ModuleType) -> None:
    """Removing cancels the occurrences not started and frees their keys; adding the name
    again creates them anew; a resumed schedule takes the occurrences of its name over and
    creates a passed occurrence at once; a pause across a start lets it be missed."""
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 0),
        ("add_recurring", 0.0, *_schedule("r0", "*/5 * * * * *", "allow")),
        ("add_recurring", 0.0, *_schedule("r1", "*/2 * * * * *", "skip", key=None)),
        ("advance", 3.0),
        ("dispatch", 3.0),
        ("remove_recurring", 3.0, "r0"),
        ("remove_recurring", 3.0, "r0"),
        ("add_recurring", 3.5, *_schedule("r0", "*/5 * * * * *", "allow")),
        ("advance", 3.5),
        ("dispatch", 3.5),
        ("lookup", 3.5, "s0@1970-01-01T00:00:05Z"),
        ("resume_recurring", 4.0, *_schedule("r1", "*/2 * * * * *", "skip"), 2.0, 2),
        ("advance", 4.0),
        ("dispatch", 4.0),
        ("pause", 4.0, "p0"),
        ("set_capacity", 4.0, "p0", 1),
        ("advance", 30.0),
        ("dispatch", 30.0),
        ("resume", 30.0, "p0"),
        ("dispatch", 30.0),
    ]
    config = _config()
    check(core_py, config, ops)
    trace = run_python(config, ops)
    assert [step[0] for step in trace[5:7]] == [True, False]
    assert trace[10][0] is not None, "the key freed by the removal is taken again"


def test_a_start_checks_the_schedule_that_created_it(core_py: ModuleType) -> None:
    """Occurrence 1 (of a schedule with overlap allow) runs; the name is added again with
    overlap skip, whose occurrence 2 then waits for its start; a resume under the name takes
    both over. At its start occurrence 2 asks the schedule that created it, which never knew
    occurrence 1: it starts (asking the resumed one would skip it)."""
    allow = _schedule("r0", "*/5 * * * * *", "allow", key=None)
    skip = _schedule("r0", "*/5 * * * * *", "skip", key=None)
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 2),
        ("add_recurring", 0.0, *allow),
        ("advance", 4.0),
        ("dispatch", 4.0),
        ("advance", 5.0),
        ("dispatch", 5.0),
        ("add_recurring", 5.5, *skip),
        ("advance", 8.0),
        ("dispatch", 8.0),
        ("resume_recurring", 8.5, *skip, None, None),
        ("advance", 10.0),
        ("dispatch", 10.0),
    ]
    config = _config()
    check(core_py, config, ops)
    trace = run_python(config, ops)
    assert trace[-1][10] == [("r0", None, 2, None, [1, 2])]
    assert [a[0] for a in trace[-1][1]] == [2] and trace[-1][7][10] == 0


def test_dependencies_block_release_and_skip_alike(core_py: ModuleType) -> None:
    """A batch with forward references (parents admitted first, ids in batch order), a
    cycle and a duplicate key refused whole, awaited keys linked or timed out, releases and
    a skip cascade, dependents, and delete keeping what a live task depends on."""
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 0),
        (
            "batch",
            0.0,
            [
                _spec(2, key="a", deps=[("b", "success")]),
                _spec(2, key="b", deps=[("c", "complete"), ("late", "success")]),
                _spec(2, key="c"),
            ],
        ),
        (
            "batch",
            0.0,
            [
                _spec(2, key="d", deps=[("e", "success")]),
                _spec(2, key="e", deps=[("d", "success")]),
            ],
        ),
        ("batch", 0.0, [_spec(2, key="d"), _spec(2, key="d")]),
        ("submit", 0.5, *_spec(1, key="x", deps=[("a", "success")])),
        ("submit", 0.5, *_spec(1, deps=[("never", "complete"), (3, "complete")])),
        ("submit", 0.5, *_spec(1, key="late", deps=[("x", "success")])),
        ("dependents", 0.5, "c"),
        ("set_capacity", 1.0, "p0", 1),
        ("dispatch", 1.0),
        ("complete", 1.5, 0),
        ("submit", 2.0, *_spec(2, key="late")),
        ("dispatch", 2.0),
        ("fail", 2.5, 0, "boom", True, None),
        ("dependents", 2.5, 2),
        ("delete", 3.0, [1, 2, 3, 4, 5, 6, 7]),
        ("advance", 11.0),
        ("dispatch", 11.0),
        ("cancel", 11.0, "c"),
        ("lookup", 11.0, 2),
    ]
    config = _config(unknown_dependency="await", await_timeout=10.0)
    check(core_py, config, ops)
    trace = run_python(config, ops)
    assert trace[1][0] == ("ok", [(1, False), (2, False), (3, False)])
    assert [r[0] for r in trace[1][9][0]] == [3, 2, 1], "parents first"
    assert trace[2][0] == ("err", "cycle", "dependency cycle")
    assert trace[3][0][:2] == ("err", "duplicate_key_in_batch")
    assert trace[6][0] == ("err", "cycle", "dependency cycle"), "late is awaited by b"
    assert trace[7][0] == [(2, "complete"), (5, "complete")]
    assert trace[15][0] == [1, 2, 4, 6], "c (3) stays: 5 depends on it"
    skipped = [(r[0], r[12]) for step in trace for r in step[3] if r[10] == "skipped"]
    assert skipped == [
        (2, "dependency 6 ended as failed"),
        (1, "dependency 2 ended as skipped"),
        (4, "dependency 1 ended as skipped"),
        (5, "timed out awaiting unknown dependency"),
    ]


def test_a_parent_forgotten_during_its_childs_submit_still_decides(core_py: ModuleType) -> None:
    """The victim a submit sheds is its task's parent and is forgotten at once (retention_max
    0); in a batch, a skipped batch-mate parent is forgotten before its child is attached."""
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 0),
        ("submit", 0.0, *_spec(3)),
        ("submit", 1.0, *_spec(0, deps=[(1, "complete")])),
        ("set_capacity", 1.0, "p0", 1),
        ("dispatch", 1.0),
        ("submit", 2.0, *_spec(3)),
        ("submit", 2.0, *_spec(0, deps=[(3, "success")])),
    ]
    base = _config(max_pending=1, overflow="shed_lowest")
    config = (*base[:4], 0, *base[5:])  # retention_max 0
    check(core_py, config, ops)
    trace = run_python(config, ops)
    assert [(r[0], r[10]) for r in trace[2][3]] == [(1, "shed")]
    assert trace[4][1][0][0] == 2, "released: any end will do"
    assert [(r[0], r[10], r[12]) for r in trace[6][3]] == [
        (3, "shed", "shed under overload"),
        (4, "skipped", "dependency ended as shed"),
    ]
    ops = [
        ("submit", 0.0, *_spec(2)),
        ("dispatch", 0.0),
        ("complete", 0.0, 0),
        (
            "batch",
            1.0,
            [
                _spec(2, key="a", deps=[(1, "failure")]),
                _spec(2, key="c", deps=[(1, "failure")]),
                _spec(2, deps=[("a", "complete")]),
            ],
        ),
    ]
    base = _config()
    config = (*base[:4], 1, *base[5:])  # retention_max 1
    check(core_py, config, ops)
    assert run_python(config, ops)[3][9][1][-1][10] == "ready"


def test_fixed_starts_with_dependencies_and_queued_occurrences(core_py: ModuleType) -> None:
    """A fixed start blocked on a parent keeps its reservation, is released to wait for its
    time (or missed, released past its tolerance); queue and queue_on_success occurrences
    depend on the previous one, and the next is not created while one waits."""
    ops: list[Op] = [
        ("submit", 0.0, *_spec(2)),
        ("submit", 0.0, *_spec(2, start=(10.0, 1.0, "skip"), deps=[(1, "success")])),
        ("submit", 0.0, *_spec(2, start=(3.0, 1.0, "skip"), deps=[(1, "complete")])),
        ("dispatch", 0.0),
        ("complete", 5.0, 0),
        ("advance", 10.0),
        ("dispatch", 10.0),
        ("add_recurring", 10.0, *_schedule("r0", "*/5 * * * * *", "queue")),
        ("add_recurring", 10.0, *_schedule("r1", "*/2 * * * * *", "queue_on_success", None)),
    ]
    for i in range(11, 30):
        ops += [("advance", float(i)), ("dispatch", float(i))]
    ops += [("fail", 30.0, 0, "boom", True, None), ("dispatch", 30.0)]
    config = _config(capacity=2, max=10)
    check(core_py, config, ops)
    statuses = _statuses(config, ops)
    # 2 ran at its time once released (and failed at 30), 3 was released past its tolerance
    assert (statuses[2], statuses[3]) == ("failed", "missed")
    assert (statuses[4], statuses[5]) == ("running", "blocked"), "5 queued behind 4"
    assert run_python(config, ops)[-1][7][TOTALS_KEYS.index("recurring_conflicts")] > 0


@examples(300)
@given(scenarios(max_ops=200, focus="park"))
def test_resources_and_worker_groups_decide_the_same(
    core_py: ModuleType, scenario: tuple[Config, list[Op]]
) -> None:
    """Resources in every configuration, tasks asking for them and carrying labels often:
    parking, offers and re-offers, bucket refills, group slots, moves, sheds of parked tasks;
    in some sequences every resource task wants one slow bucket's tokens, mostly more than
    one, and time steps to its refill edges (offers at a level a fraction of a token short)."""
    check(core_py, *scenario)


SEMAPHORE = ("db", "semaphore", 2, None, None)
BUCKET = ("api", "token_bucket", None, 0.5, 2)


def test_tasks_wait_on_short_resources_and_come_back_when_they_can_be_served(
    core_py: ModuleType,
) -> None:
    """A task short of permits parks (the one behind it runs) and starts when an attempt
    returns them; a bucket's task waits for the refill timer, at 2 s for the missing token."""
    ops: list[Op] = [("set_capacity", 0.0, "p0", 4)]
    ops += [("submit", 0.0, *_spec(1, resources=[("db", 2)]))]  # 1
    ops += [("submit", 0.0, *_spec(1, resources=[("db", 1), ("api", 1)]))]  # 2: db short
    ops += [("submit", 0.0, *_spec(2, resources=[("api", 2)]))]  # 3: takes both tokens
    ops += [("submit", 0.0, *_spec(2))]  # 4
    ops += [("dispatch", 0.0), ("snapshot", 0.0)]
    ops += [("complete", 1.0, 0), ("dispatch", 1.0)]  # db back: 2 waits for a token now
    ops += [("advance", 1.5), ("dispatch", 1.5), ("advance", 2.0), ("dispatch", 2.0)]
    ops += [("snapshot", 2.5)]
    config = _config(resources=[SEMAPHORE, BUCKET])
    check(core_py, config, ops)
    trace = run_python(config, ops)
    started = [[a[0] for a in step[1]] for step in trace]
    assert started[5] == [1, 3, 4]
    assert started[8] == started[10] == []
    assert started[12] == [2], "the token missing at 1.0 has refilled by 2.0"
    assert [trace[6][0][1], trace[13][0][1]] == [[0.0, 0.0], [1.0, 0.25]]  # db, api levels


def test_resource_errors_carry_the_same_codes_and_messages(core_py: ModuleType) -> None:
    bad = [
        ([("db", 1), ("gpu", 1)], "unknown_resource", "unknown resource 'gpu'"),
        ([("api", 3)], "resource_exceeds_capacity", "of resource 'api'"),
        ([("db", 0)], "invalid", "invalid task: resource amount must be > 0"),
    ]
    config = _config(resources=[SEMAPHORE, BUCKET])
    for amounts, code, message in bad:
        ops: list[Op] = [
            ("submit", 0.0, *_spec(2, resources=amounts)),
            ("batch", 0.0, [_spec(2, key="k0"), _spec(2, key="k1", resources=amounts)]),
            ("resolve", 0.0, amounts),
        ]
        check(core_py, config, ops)
        trace = run_python(config, ops)
        assert trace[0][0][:2] == trace[1][0][:2] == ("err", code)
        assert message in trace[0][0][2]
        assert trace[0][0] == trace[1][0]
    duplicate = [("db", 3), ("db", 1)]  # a dict keeps the last amount
    ops = [("submit", 0.0, *_spec(2, resources=duplicate)), ("resolve", 0.0, duplicate)]
    check(core_py, config, ops)
    assert run_python(config, ops)[1][0] == ("ok", [("db", 1)])


def test_a_resource_config_is_refused_with_the_same_message(core_py: ModuleType) -> None:
    bad = [
        (("r0", "semaphore", 0, None, None), "permits must be >= 1"),
        (("r0", "token_bucket", None, 0.0, 1), "rate must be a finite number > 0 (got 0)"),
        (("r0", "token_bucket", None, -1.5, 1), "rate must be a finite number > 0 (got -1.5)"),
        (("r0", "token_bucket", None, math.inf, 1), "rate must be a finite number > 0 (got inf)"),
        (("r0", "token_bucket", None, math.nan, 1), "rate must be a finite number > 0 (got nan)"),
        (("r0", "token_bucket", None, 1.0, 0), "burst must be >= 1"),
        (("r\0", "semaphore", 1, None, None), "must not contain NUL characters (got 'r\\x00')"),
    ]
    for resource, message in bad:
        for resources in ([resource], [SEMAPHORE, resource], [SEMAPHORE, SEMAPHORE]):
            config = _config(resources=resources)
            with pytest.raises(ValueError) as python:
                run_python(config, [])
            with pytest.raises(ValueError) as rust:
                core_py.run_engine(config, [])
            assert str(python.value) == str(rust.value)
        assert message in str(python.value) or "duplicate" in str(python.value)
    assert str(rust.value) == "duplicate resource name 'db'"


def test_labeled_tasks_wait_for_a_matching_group_slot(core_py: ModuleType) -> None:
    """Labeled tasks run only on a group carrying their labels (parked until one has a free
    slot); unlabeled ones take unlabeled slots first; an attempt moved to another group keeps
    the counts right, and group_has_room reads them."""
    a, b, ab = [("zone", "a")], [("zone", "b")], [("gpu", "1"), ("zone", "a")]
    ops: list[Op] = [
        ("set_group", 0.0, "p0", ab, 1),
        ("submit", 0.0, *_spec(1, labels=a)),  # 1: on the ab group
        ("submit", 0.0, *_spec(1, labels=b)),  # 2: no zone=b group
        ("submit", 0.0, *_spec(2)),  # 3: the unlabeled slot
        ("submit", 0.0, *_spec(2, labels=a)),  # 4: waits for the ab group
        ("dispatch", 0.0),
        ("group_room", 0.0, "p0", ab),
        ("set_group", 1.0, "p0", b, 1),  # 2 is offered the new slot
        ("dispatch", 1.0),
        ("move", 2.0, 0, b),  # 1's attempt moves to the zone=b group
        ("group_room", 2.0, "p0", ab),
        ("set_group", 2.0, "p0", ab, 0),
        ("complete", 3.0, 0),
        ("dispatch", 3.0),
        ("set_group", 4.0, "p0", ab, 2),
        ("dispatch", 4.0),
        ("snapshot", 4.0),
    ]
    check(core_py, _config(), ops)
    trace = run_python(_config(), ops)
    starts = {a[0]: a[7] for step in trace for a in step[1]}
    assert starts == {1: sorted(ab), 3: None, 2: b, 4: sorted(ab)}
    assert [trace[6][0], trace[10][0]] == [False, True]


def test_a_move_within_a_group_without_slots_keeps_the_group(core_py: ModuleType) -> None:
    """The Python core dropped the group here (found by this suite; tests/unit has the case)."""
    a = [("zone", "a")]
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 0),
        ("set_group", 0.0, "p0", a, 1),
        ("submit", 0.0, *_spec(2, labels=a)),
        ("dispatch", 0.0),
        ("set_group", 1.0, "p0", a, 0),
        ("move", 1.0, 0, a),
        ("set_group", 2.0, "p0", a, 1),
        ("submit", 2.0, *_spec(2, labels=a)),
        ("complete", 3.0, 0),
        ("group_room", 3.0, "p0", a),
        ("dispatch", 3.0),
    ]
    check(core_py, _config(), ops)
    trace = run_python(_config(), ops)
    assert trace[9][0] is True
    assert [s[0] for s in trace[10][1]] == [2]
