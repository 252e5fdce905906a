"""Unit tests of the engine core: dependencies, atomic batches, resources and overflow.

docs/dependencies.md (dependencies, atomic batches), docs/resources.md,
docs/overflow-and-fairness.md, "max_pending and overflow" and the matching rows of
docs/reference/errors.md, "Submission errors", on a virtual clock: times are plain floats handed to
every engine call, nothing sleeps and nothing touches asyncio. `Driver` (tests/helpers/engine.py)
plays the driver (fires timers at `next_wake()`, fills free slots, ends attempts after the runtime
their payload asks for) and logs every start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from cronoq.core.engine import Engine
from cronoq.core.model import (
    Attempt,
    Extras,
    PoolConfig,
    Priority,
    RetryPolicy,
    TaskRecord,
)
from cronoq.core.resources import ResourceConfig
from cronoq.errors import SubmitError
from helpers.engine import Driver, engine_of

CRIT = int(Priority.CRITICAL)
HIGH = int(Priority.HIGH)
NORMAL = int(Priority.NORMAL)
LOW = int(Priority.LOW)

NO_RETRY = RetryPolicy.none()
SLOW_RETRY = RetryPolicy(3, 10.0, 1.0, 10.0, jitter=False)

Edge = tuple[int | str, str]


# --- helpers -----------------------------------------------------------------------------------


def pool(name: str = "p", capacity: int = 4, **kw: Any) -> PoolConfig:
    return PoolConfig(name, capacity=capacity, **kw)


def semaphore(name: str, permits: int) -> ResourceConfig:
    return ResourceConfig(name, "semaphore", permits=permits)


def bucket(name: str, rate: float, burst: int) -> ResourceConfig:
    return ResourceConfig(name, "token_bucket", rate=rate, burst=burst)


def task(
    pool: str = "p",
    cls: int = NORMAL,
    *,
    key: str | None = None,
    after: Iterable[int | str] = (),
    deps: Iterable[Edge] = (),
    resources: dict[str, int] | None = None,
    start_at: float | None = None,
    tolerance: float = 1.0,
    on_miss: str = "run_late",
    payload: Any = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
) -> TaskRecord:
    """A core record with the options as build_task would store them in `extra`."""
    extra: dict[str, Any] = {}
    edges = [(t, "success") for t in after] + list(deps)
    if edges:
        extra["deps"] = edges
    if resources:
        extra["resources"] = dict(resources)
    if start_at is not None:
        extra.update(start_at=start_at, tolerance=tolerance, on_miss=on_miss)
    return TaskRecord(
        payload,
        pool,
        cls=cls,
        key=key,
        retry=retry,
        timeout=timeout,
        extra=Extras(**extra) if extra else None,
    )


def sub(eng: Engine, now: float, **kw: Any) -> TaskRecord:
    rec, dup = eng.submit(task(**kw), now)
    assert not dup
    return rec


def status(rec: TaskRecord) -> str:
    return rec.status_name


def rejected(call: Callable[[], Any]) -> tuple[str, str]:
    """(code, message) of the SubmitError the call raises."""
    with pytest.raises(SubmitError) as info:
        call()
    return info.value.code, info.value.message


def start(eng: Engine, rec: TaskRecord, now: float) -> Attempt:
    """Dispatch at `now` and return the attempt of `rec` (which must have started)."""
    eng.dispatch(now)
    att = rec.running
    assert att is not None, f"{rec} did not start"
    return att


def advance_through(eng: Engine, t: float) -> None:
    """Fire every timer due up to `t` at its own time (as a punctual driver does), then at t."""
    for _ in range(100_000):
        w = eng.next_wake()
        if w is None or w > t:
            break
        eng.advance(w)
    eng.advance(t)


def pending(eng: Engine, name: str = "p") -> list[int]:
    return list(eng.pools[name].pending_by_class)


def fingerprint(eng: Engine) -> tuple[Any, ...]:
    """Everything a rejected submission must leave untouched."""
    return (
        sorted(eng.tasks),
        sorted(eng.keys),
        dict(eng.totals),
        eng.live,
        {name: list(p.pending_by_class) for name, p in eng.pools.items()},
        {name: p.queues.n for name, p in eng.pools.items()},
        {name: (r.in_use, r.tokens) for name, r in eng.resources.items()},
    )


# --- the edge table (docs/dependencies.md, "Edges") -----------------------------------------------

TERMINAL = ["succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"]
SATISFIES: dict[str, set[str]] = {
    "succeeded": {"success", "complete"},
    "failed": {"failure", "complete"},
    "dead_lettered": {"failure", "complete"},
    "cancelled": {"complete"},
    "skipped": {"complete"},
    "missed": {"complete"},
    "shed": {"complete"},
}
FINISH_AT = 2.0


def edge_engine() -> Engine:
    """Pool "p" does the work, "z" (no slots, shed_lowest at 1) sheds, "m" (no slots) misses."""
    return engine_of(
        pool("p", 100),
        pool("z", 0, max_pending=1, overflow="shed_lowest"),
        pool("m", 0),
    )


def parent_ending_as(eng: Engine, end: str) -> tuple[TaskRecord, Callable[[], None]]:
    """A live task at time 0 plus the call that ends it with status `end` (by FINISH_AT)."""
    if end in ("succeeded", "failed", "dead_lettered", "skipped"):
        grand = sub(eng, 0.0, key="grand")
        rec = sub(eng, 0.0, retry=NO_RETRY, after=["grand"] if end == "skipped" else ())
        att = start(eng, grand if end == "skipped" else rec, 0.0)

        def finish() -> None:
            if end == "succeeded":
                assert eng.complete(att, FINISH_AT)
            else:  # "skipped": its own parent fails
                assert eng.fail(att, FINISH_AT, "boom", permanent=end != "dead_lettered")

        return rec, finish
    if end == "cancelled":
        rec = sub(eng, 0.0, pool="m")
        return rec, lambda: None if eng.cancel(rec.id, FINISH_AT) else pytest.fail("not live")
    if end == "missed":  # a fixed start at 1.0 (tolerance 0.5) in a pool without slots
        rec = sub(eng, 0.0, pool="m", start_at=1.0, tolerance=0.5, on_miss="skip")
        return rec, lambda: advance_through(eng, FINISH_AT)
    assert end == "shed"
    rec = sub(eng, 0.0, pool="z", cls=LOW)

    def shed() -> None:
        sub(eng, FINISH_AT, pool="z", cls=NORMAL)

    return rec, shed


@pytest.mark.parametrize("on", ["success", "failure", "complete"])
@pytest.mark.parametrize("end", TERMINAL)
def test_edge_table_parent_ending_while_the_dependent_waits(end: str, on: str) -> None:
    eng = edge_engine()
    parent, finish = parent_ending_as(eng, end)
    child = sub(eng, 0.5, deps=[(parent.id, on)])
    assert status(child) == "blocked"
    eng.take()
    finish()
    assert status(parent) == end
    events = [(e.status, e.attempt, e.message) for e in eng.take().events if e.id == child.id]
    if on in SATISFIES[end]:
        assert (status(child), child.message) == ("ready", None)
        assert events == [("ready", 0, None)]
    else:
        message = f"dependency {parent.id} ended as {end}"
        assert (status(child), child.message) == ("skipped", message)
        assert child.finished_at == parent.finished_at
        assert events == [("skipped", 0, message)]
    assert pending(eng) == ([0, 0, 1, 0] if on in SATISFIES[end] else [0, 0, 0, 0])


@pytest.mark.parametrize("on", ["success", "failure", "complete"])
@pytest.mark.parametrize("end", TERMINAL)
def test_edge_table_parent_already_terminal_at_submission(end: str, on: str) -> None:
    eng = edge_engine()
    parent, finish = parent_ending_as(eng, end)
    finish()
    assert status(parent) == end
    eng.take()
    child = sub(eng, 3.0, deps=[(parent.id, on)])
    events = [(e.status, e.attempt, e.message) for e in eng.take().events if e.id == child.id]
    if on in SATISFIES[end]:
        assert status(child) == "ready"
        assert events == [("blocked", 0, None), ("ready", 0, None)]
    else:
        message = f"dependency ended as {end}"
        assert (status(child), child.message, child.finished_at) == ("skipped", message, 3.0)
        assert events == [("blocked", 0, None), ("skipped", 0, message)]


def test_skip_event_carries_the_parent_id() -> None:
    eng = engine_of(pool())
    parent = sub(eng, 0.0, key="a")
    att = start(eng, parent, 0.0)
    child = sub(eng, 0.0, after=["a"])
    eng.take()
    eng.fail(att, 1.0, "no", permanent=True)
    events = [(e.id, e.status, e.attempt, e.message) for e in eng.take().events]
    assert events == [
        (parent.id, "failed", 1, "no"),
        (child.id, "skipped", 0, f"dependency {parent.id} ended as failed"),
    ]
    assert eng.totals["skipped"] == 1 and eng.totals["failed"] == 1


def test_dependent_waits_for_every_edge() -> None:
    eng = engine_of(pool())
    a = sub(eng, 0.0, key="a")
    b = sub(eng, 0.0, key="b", retry=NO_RETRY)
    c = sub(eng, 0.0, key="c")
    eng.dispatch(0.0)
    child = sub(eng, 0.0, deps=[("a", "success"), (b.id, "failure"), ("c", "complete")])
    assert status(child) == "blocked" and pending(eng) == [0, 0, 1, 0]
    assert a.running and b.running and c.running
    eng.complete(a.running, 1.0)
    assert status(child) == "blocked"
    eng.fail(b.running, 2.0, "x")  # dead_lettered satisfies a failure edge
    assert status(child) == "blocked"
    eng.fail(c.running, 3.0, "y", permanent=True)
    assert status(child) == "ready"
    assert (child.eligible_at, child.ready_at) == (3.0, 3.0)
    assert start(eng, child, 3.0).task is child


def test_one_dead_edge_skips_at_once_without_waiting_for_the_rest() -> None:
    eng = engine_of(pool())
    a = sub(eng, 0.0, key="a")
    b = sub(eng, 0.0, key="b")
    eng.dispatch(0.0)
    assert a.running is not None and b.running is not None
    att_b = b.running
    child = sub(eng, 0.0, after=["a", "b"])
    eng.fail(a.running, 1.0, "bad", permanent=True)
    assert (status(child), child.message) == ("skipped", f"dependency {a.id} ended as failed")
    assert child.finished_at == 1.0
    eng.complete(att_b, 2.0)  # the other parent ending later changes nothing
    assert status(child) == "skipped" and eng.totals["skipped"] == 1


def test_skips_cascade_through_a_chain() -> None:
    eng = engine_of(pool())
    a = sub(eng, 0.0, key="a")
    att = start(eng, a, 0.0)
    b = sub(eng, 0.0, key="b", after=["a"])
    c = sub(eng, 0.0, key="c", after=[b.id])
    d = sub(eng, 0.0, after=["c"])
    e = sub(eng, 0.0, deps=[("c", "complete")])  # a complete edge on a skipped task is met
    f = sub(eng, 0.0, deps=[("c", "failure")])  # a failure edge is not
    assert pending(eng) == [0, 0, 5, 0]
    eng.fail(att, 1.0, "root cause", permanent=True)
    assert [(status(r), r.message) for r in (b, c, d, f)] == [
        ("skipped", f"dependency {a.id} ended as failed"),
        ("skipped", f"dependency {b.id} ended as skipped"),
        ("skipped", f"dependency {c.id} ended as skipped"),
        ("skipped", f"dependency {c.id} ended as skipped"),
    ]
    assert status(e) == "ready"
    assert eng.totals["skipped"] == 4 and eng.live == 1 and pending(eng) == [0, 0, 1, 0]


CHAIN = 5000


def test_a_long_chain_skips_without_recursion() -> None:
    eng = engine_of(pool())
    root = sub(eng, 0.0, key="t0")
    recs = [root] + [sub(eng, 0.0, key=f"t{i}", after=[f"t{i - 1}"]) for i in range(1, CHAIN)]
    att = start(eng, root, 0.0)
    eng.fail(att, 1.0, "x", permanent=True)
    assert all(status(r) == "skipped" for r in recs[1:])
    assert recs[-1].message == f"dependency {recs[-2].id} ended as skipped"
    assert eng.totals["skipped"] == CHAIN - 1 and eng.live == 0


def test_a_long_chain_runs_in_order() -> None:
    eng = engine_of(pool())
    recs = [sub(eng, 0.0, key="t0", payload=0.001)]
    recs += [sub(eng, 0.0, key=f"t{i}", after=[f"t{i - 1}"], payload=0.001) for i in range(1, 200)]
    run = Driver(eng)
    run.run_until(10.0)
    assert run.start_order() == [r.id for r in recs]
    assert all(status(r) == "succeeded" for r in recs)


def test_a_long_chain_in_a_batch_with_forward_references() -> None:
    eng = engine_of(pool())
    # child first: every task names a key defined later in the batch
    batch = [task(key=f"t{i}", after=[f"t{i - 1}"]) for i in range(CHAIN - 1, 0, -1)]
    batch.append(task(key="t0"))
    admitted = eng.submit_batch(batch, 0.0)
    assert [r.id for r, _ in admitted] == list(range(1, CHAIN + 1))
    root = eng.lookup("t0")
    assert root is not None and status(root) == "ready"
    assert sum(status(r) == "blocked" for r, _ in admitted) == CHAIN - 1
    eng.fail(start(eng, root, 0.0), 1.0, "x", permanent=True)
    assert eng.totals["skipped"] == CHAIN - 1


def test_depending_on_a_retained_finished_task_resolves_at_once() -> None:
    eng = engine_of(pool())
    a = sub(eng, 0.0, key="a")
    eng.complete(start(eng, a, 0.0), 1.0)
    by_key = sub(eng, 5.0, after=["a"])
    by_id = sub(eng, 5.0, after=[a.id])
    for rec in (by_key, by_id):
        assert status(rec) == "ready" and rec.eligible_at == 5.0


# --- unknown dependencies (docs/dependencies.md, "Unknown dependencies and cycles") ---------------


@pytest.mark.parametrize("policy", ["reject", "await"])
def test_unknown_id_is_always_rejected(policy: str) -> None:
    eng = engine_of(pool(unknown_dependency=policy))
    before = fingerprint(eng)
    assert rejected(lambda: sub(eng, 0.0, after=[424242])) == (
        "unknown_dependency",
        "unknown dependency '424242'",
    )
    assert rejected(lambda: sub(eng, 0.0, deps=[(424242, "complete")])) == (
        "unknown_dependency",
        "unknown dependency '424242'",
    )
    assert fingerprint(eng) == before


def test_unknown_key_is_rejected_by_default() -> None:
    eng = engine_of(pool())
    assert eng.pools["p"].cfg.unknown_dependency == "reject"
    assert rejected(lambda: sub(eng, 0.0, after=["nope"])) == (
        "unknown_dependency",
        "unknown dependency 'nope'",
    )
    assert not eng.tasks


def test_awaited_key_resolves_when_submitted_later() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    a = sub(eng, 0.0, key="a", after=["b"])
    assert status(a) == "blocked" and pending(eng) == [0, 0, 1, 0]
    eng.dispatch(1.0)
    assert a.running is None
    b = sub(eng, 3.0, key="b")
    assert status(a) == "blocked"
    att = start(eng, b, 3.0)
    assert status(a) == "blocked"
    eng.complete(att, 4.0)
    assert status(a) == "ready" and a.eligible_at == 4.0


def test_awaited_key_failing_skips_with_its_id() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    a = sub(eng, 0.0, after=["b"])
    b = sub(eng, 1.0, key="b")
    eng.fail(start(eng, b, 1.0), 2.0, "no", permanent=True)
    assert (status(a), a.message) == ("skipped", f"dependency {b.id} ended as failed")


def test_the_dependents_pool_decides_about_unknown_keys() -> None:
    eng = engine_of(pool("aw", unknown_dependency="await"), pool("rj"))
    assert rejected(lambda: sub(eng, 0.0, pool="rj", after=["k"]))[0] == "unknown_dependency"
    waiting = sub(eng, 0.0, pool="aw", after=["k"])
    k = sub(eng, 1.0, pool="rj", key="k")  # the parent's pool does not matter
    eng.complete(start(eng, k, 1.0), 2.0)
    assert status(waiting) == "ready"


def test_await_timeout_skips_exactly_at_submission_plus_timeout() -> None:
    eng = engine_of(pool(unknown_dependency="await", await_timeout=2.5))
    a = sub(eng, 1.0, after=["never"])
    assert eng.next_wake() == 3.5
    eng.advance(3.4999)
    assert status(a) == "blocked"
    eng.take()
    eng.advance(3.5)
    assert (status(a), a.message, a.finished_at) == (
        "skipped",
        "timed out awaiting unknown dependency",
        3.5,
    )
    events = [(e.id, e.status, e.message) for e in eng.take().events]
    assert events == [(a.id, "skipped", "timed out awaiting unknown dependency")]
    assert eng.totals["skipped"] == 1 and pending(eng) == [0, 0, 0, 0]
    late = sub(eng, 4.0, key="never")  # the key may still be used; nothing waits on it now
    assert status(late) == "ready" and status(a) == "skipped"


def test_await_timeout_does_not_fire_once_the_key_exists() -> None:
    eng = engine_of(pool(unknown_dependency="await", await_timeout=1.0))
    a = sub(eng, 0.0, after=["b"])
    b = sub(eng, 0.5, key="b")
    att = start(eng, b, 0.5)
    advance_through(eng, 5.0)
    assert status(a) == "blocked"
    eng.complete(att, 6.0)
    assert status(a) == "ready"


def test_await_timeout_fires_while_another_awaited_key_is_missing() -> None:
    eng = engine_of(pool(unknown_dependency="await", await_timeout=1.0))
    a = sub(eng, 0.0, after=["b", "c"])
    sub(eng, 0.5, key="b")
    advance_through(eng, 1.0)
    assert (status(a), a.message) == ("skipped", "timed out awaiting unknown dependency")


def test_await_without_timeout_waits_forever() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    a = sub(eng, 0.0, after=["b"])
    assert eng.next_wake() is None
    eng.advance(1e9)
    assert status(a) == "blocked"


# --- cycles (docs/dependencies.md, "Unknown dependencies and cycles") -----------------------------

CYCLE = ("cycle", "dependency cycle")


@pytest.mark.parametrize("on", ["success", "failure", "complete"])
def test_depending_on_its_own_key_is_a_cycle(on: str) -> None:
    for policy in ("reject", "await"):
        eng = engine_of(pool(unknown_dependency=policy))
        assert rejected(lambda: sub(eng, 0.0, key="k", deps=[("k", on)])) == CYCLE  # noqa: B023
        k = sub(eng, 0.0, key="k")  # the key is still free
        assert k.id == 1


def test_cycle_through_an_awaited_key() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    a = sub(eng, 0.0, key="A", after=["B"])
    before = fingerprint(eng)
    assert rejected(lambda: sub(eng, 1.0, key="B", after=["A"])) == CYCLE
    assert fingerprint(eng) == before
    b = sub(eng, 2.0, key="B")  # plain B is fine and A runs after it
    assert (b.id, status(a)) == (2, "blocked")
    eng.complete(start(eng, b, 2.0), 3.0)
    assert status(a) == "ready"


def test_cycle_through_an_awaited_key_and_a_known_task() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    sub(eng, 0.0, key="A", after=["B"])
    sub(eng, 0.0, key="C", after=["A"])
    assert rejected(lambda: sub(eng, 1.0, key="B", after=["C"])) == CYCLE
    assert rejected(lambda: sub(eng, 1.0, key="B", deps=[("C", "complete")])) == CYCLE


def test_cycle_through_two_awaited_keys_resolved_one_after_the_other() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    sub(eng, 0.0, key="X", after=["Y"])
    sub(eng, 0.0, key="Y", after=["Z"])  # X's awaited key resolves to Y
    assert rejected(lambda: sub(eng, 0.0, key="Z", after=["X"])) == CYCLE


def test_cycle_through_a_long_awaited_chain_without_recursion() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    sub(eng, 0.0, key="t0", after=["closing"])
    for i in range(1, CHAIN):
        sub(eng, 0.0, key=f"t{i}", after=[f"t{i - 1}"])
    assert rejected(lambda: sub(eng, 0.0, key="closing", after=[f"t{CHAIN - 1}"])) == CYCLE
    assert sub(eng, 0.0, key="closing").id == CHAIN + 1


def test_no_cycle_when_the_awaiting_task_is_elsewhere_in_the_graph() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    sub(eng, 0.0, key="A", after=["B"])
    other = sub(eng, 0.0, key="other")
    b = sub(eng, 0.0, key="B", after=["other"])  # B -> other, A -> B: no cycle
    assert status(b) == "blocked" and other.id == 2


@pytest.mark.parametrize(
    "batch",
    [
        [("x", ["y"]), ("y", ["x"])],
        [("x", ["x"])],
        [("a", ["c"]), ("b", ["a"]), ("c", ["b"]), ("d", [])],
    ],
    ids=["two", "self", "three"],
)
def test_cycle_inside_a_batch(batch: list[tuple[str, list[str]]]) -> None:
    eng = engine_of(pool())
    before = fingerprint(eng)
    recs = [task(key=k, after=after) for k, after in batch]
    assert rejected(lambda: eng.submit_batch(recs, 0.0)) == CYCLE
    assert fingerprint(eng) == before
    assert sub(eng, 0.0, key="x").id == 1


@pytest.mark.parametrize("first", ["C", "B"])
def test_a_batch_closing_a_cycle_through_an_awaited_key_is_rejected(first: str) -> None:
    """A waits for "B"; the batch defines B after C and C after A: A -> B -> C -> A.

    Whatever the order of the batch, this is a cycle (docs/dependencies.md,
    "Unknown dependencies and cycles")."""
    eng = engine_of(pool(unknown_dependency="await"))
    a = sub(eng, 0.0, key="A", after=["B"])
    defs = {"B": task(key="B", after=["C"]), "C": task(key="C", after=["A"])}
    recs = [defs[first], defs["C" if first == "B" else "B"]]
    before = fingerprint(eng)
    assert rejected(lambda: eng.submit_batch(recs, 0.0)) == CYCLE
    assert fingerprint(eng) == before
    assert status(a) == "blocked"


@pytest.mark.parametrize("how", ["await_timeout", "cancel"])
def test_a_task_that_stopped_awaiting_a_key_does_not_make_a_cycle(how: str) -> None:
    """A awaited "B" but ended (timed out, cancelled): B after A is no cycle, it just follows
    the edge table with A's terminal status."""
    eng = engine_of(pool(unknown_dependency="await", await_timeout=1.0))
    a = sub(eng, 0.0, key="A", after=["B"])
    if how == "cancel":
        assert eng.cancel("A", 0.5)
        end = "cancelled"
    else:
        advance_through(eng, 1.0)
        end = "skipped"
    assert status(a) == end
    b = sub(eng, 2.0, key="B", after=["A"])
    assert (status(b), b.message) == ("skipped", f"dependency ended as {end}")


# --- rejected submissions leave no trace ----------------------------------------------------------


def _rejections() -> list[tuple[str, Callable[[Engine], Any], str]]:
    def one(**kw: Any) -> Callable[[Engine], Any]:
        return lambda eng: eng.submit(task(**kw), 1.0)

    def batch(*recs: Callable[[], TaskRecord]) -> Callable[[Engine], Any]:
        return lambda eng: eng.submit_batch([make() for make in recs], 1.0)

    return [
        ("unknown id", one(key="n", after=[424242]), "unknown_dependency"),
        ("unknown key", one(pool="r", key="n", after=["zz"]), "unknown_dependency"),
        ("self cycle", one(key="n", after=["n"]), "cycle"),
        ("awaited cycle", one(key="B", after=["A"]), "cycle"),
        ("unknown resource", one(key="n", resources={"zzz": 1}), "unknown_resource"),
        ("too much", one(key="n", resources={"sem": 3}), "resource_exceeds_capacity"),
        ("overloaded", one(pool="r", key="n"), "overloaded"),
        ("full", one(pool="w", key="n"), "full"),
        (
            "batch duplicate",
            batch(lambda: task(key="n"), lambda: task(key="m"), lambda: task(key="n")),
            "duplicate_key_in_batch",
        ),
        (
            "batch cycle",
            batch(lambda: task(key="n", after=["m"]), lambda: task(key="m", after=["n"])),
            "cycle",
        ),
        (
            "batch unknown",
            batch(lambda: task(key="n"), lambda: task(key="m", after=[424242])),
            "unknown_dependency",
        ),
        (
            "batch resource",
            batch(lambda: task(key="n"), lambda: task(key="m", resources={"zzz": 1})),
            "unknown_resource",
        ),
        (
            "batch overloaded",
            batch(lambda: task(key="n", pool="w"), lambda: task(key="m", pool="w")),
            "overloaded",
        ),
    ]


@pytest.mark.parametrize(("what", "call", "code"), _rejections(), ids=[r[0] for r in _rejections()])
def test_a_rejected_submission_leaves_no_trace(
    what: str, call: Callable[[Engine], Any], code: str
) -> None:
    eng = engine_of(
        pool("p", 0, unknown_dependency="await"),
        pool("r", 0, max_pending=1, overflow="reject"),
        pool("w", 0, max_pending=2, overflow="wait"),
        resources=[semaphore("sem", 2)],
    )
    sub(eng, 0.0, key="A", after=["B"])  # awaits "B"
    sub(eng, 0.0, pool="r", key="r1")  # "r" is full
    sub(eng, 0.0, pool="w", key="w1")  # "w" has room for one more task
    assert (eng.has_room("r"), eng.has_room("w")) == (False, True)
    if what == "full":
        sub(eng, 0.0, pool="w", key="w2")
    eng.take()
    before = fingerprint(eng)
    next_id = max(eng.tasks) + 1
    with pytest.raises(SubmitError) as info:
        call(eng)
    assert info.value.code == code
    assert fingerprint(eng) == before
    assert not eng.take()  # no events, starts or terminal tasks
    # No id was used up, and the keys of the rejected tasks are free.
    probe = sub(eng, 2.0, key="n")
    assert probe.id == next_id
    assert eng.lookup("m") is None


def test_a_rejected_awaiting_task_leaves_no_awaited_key_behind() -> None:
    eng = engine_of(pool(unknown_dependency="await"))
    assert rejected(lambda: sub(eng, 0.0, key="A", after=["B", 424242]))[0] == (
        "unknown_dependency"
    )
    # Had A been left waiting for "B", B after "A" would close a cycle; instead A is unknown
    # and B simply awaits it.
    b = sub(eng, 1.0, key="B", after=["A"])
    a = sub(eng, 2.0, key="A")
    assert (a.id, b.id) == (2, 1)
    eng.complete(start(eng, a, 2.0), 3.0)
    assert status(b) == "ready"


# --- batches (docs/dependencies.md, "Atomic batches") ---------------------------------------------


def test_batch_forward_references_and_ids_in_batch_order() -> None:
    eng = engine_of(pool())
    recs = [
        task(after=["z"]),
        task(key="m", deps=[("z", "complete")]),
        task(key="z"),
        task(after=["m"]),
    ]
    admitted = eng.submit_batch(recs, 0.0)
    assert [(r.id, dup) for r, dup in admitted] == [(1, False), (2, False), (3, False), (4, False)]
    assert [r is rec for (r, _), rec in zip(admitted, recs, strict=True)] == [True] * 4
    assert [status(r) for r in recs] == ["blocked", "blocked", "ready", "blocked"]
    z = recs[2]
    eng.complete(start(eng, z, 0.0), 1.0)
    assert [status(r) for r in recs] == ["ready", "ready", "succeeded", "blocked"]
    assert eng.totals["submitted"] == 4


def test_batch_duplicate_key_in_batch() -> None:
    eng = engine_of(pool())
    recs = [task(key="dd"), task(), task(key="dd")]
    assert rejected(lambda: eng.submit_batch(recs, 0.0)) == (
        "duplicate_key_in_batch",
        "duplicate key 'dd' in batch",
    )
    assert not eng.tasks and not eng.keys


def test_batch_with_an_existing_key_returns_a_duplicate_and_admits_the_rest() -> None:
    eng = engine_of(pool())
    old = sub(eng, 0.0, key="old")
    admitted = eng.submit_batch(
        [task(key="new", after=["old"]), task(key="old"), task(after=["new"])], 1.0
    )
    assert [(r.id, dup) for r, dup in admitted] == [(2, False), (1, True), (3, False)]
    assert admitted[1][0] is old
    new = eng.lookup("new")
    assert new is not None and status(new) == "blocked"
    eng.complete(start(eng, old, 1.0), 2.0)
    assert status(new) == "ready"
    assert eng.totals["submitted"] == 3


def test_empty_batch() -> None:
    eng = engine_of(pool())
    assert eng.submit_batch([], 0.0) == []
    assert sub(eng, 0.0).id == 1


def test_batch_depending_on_a_skipped_batch_mate() -> None:
    eng = engine_of(pool())
    bad = sub(eng, 0.0, key="bad")
    eng.fail(start(eng, bad, 0.0), 1.0, "x", permanent=True)
    late, first = task(key="late", after=["first"]), task(key="first", after=["bad"])
    eng.submit_batch([late, first], 2.0)
    assert (status(first), first.message) == ("skipped", "dependency ended as failed")
    assert status(late) == "skipped"
    assert late.message is not None and late.message.endswith("ended as skipped")


# --- semaphores (docs/resources.md) ---------------------------------------------------------------


def test_semaphore_permits_are_never_exceeded_across_pools() -> None:
    eng = engine_of(pool("a", 3), pool("b", 3), resources=[semaphore("db", 2)])
    recs = [sub(eng, 0.0, pool=name, payload=1.0, resources={"db": 1}) for name in "ababab"]
    run = Driver(eng)
    held = []
    for t in [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]:
        run.run_until(t)
        held.append(eng.resources["db"].in_use)
        assert eng.resources["db"].in_use == len(eng.running) <= 2
    assert run.peak == 2
    assert held == [2, 2, 2, 2, 2, 2, 0, 0]
    assert sorted(run.start_by_id().values()) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert all(status(r) == "succeeded" for r in recs)


def test_semaphore_amounts_above_one() -> None:
    eng = engine_of(pool("p", 4), resources=[semaphore("s", 3)])
    big = sub(eng, 0.0, payload=1.0, resources={"s": 2})
    big2 = sub(eng, 0.0, payload=1.0, resources={"s": 2})
    small = sub(eng, 0.0, payload=1.0, resources={"s": 1})
    run = Driver(eng)
    run.run_until(0.0)
    assert (status(big), status(big2), status(small)) == ("running", "ready", "running")
    run.run_until(1.0)
    assert run.start_by_id()[big2.id] == 1.0


def _end_holder(how: str) -> tuple[Engine, TaskRecord, TaskRecord]:
    """A holder of the only permit, ended at t=1 by `how`, and a waiter parked since t=0."""
    eng = engine_of(
        pool("p", 2, lease_ttl=1.0 if how == "lease" else None), resources=[semaphore("s", 1)]
    )
    holder = sub(
        eng,
        0.0,
        resources={"s": 1},
        retry=SLOW_RETRY if how == "retryable" else NO_RETRY,
        timeout=1.0 if how == "timeout" else None,
    )
    att = start(eng, holder, 0.0)
    waiter = sub(eng, 0.0, resources={"s": 1})
    eng.dispatch(0.0)
    assert status(waiter) == "ready" and waiter.running is None
    if how == "complete":
        eng.complete(att, 1.0)
    elif how in ("retryable", "permanent"):
        eng.fail(att, 1.0, "x", permanent=how == "permanent")
    elif how == "cancel":
        assert eng.cancel(holder.id, 1.0)
    else:  # timeout and lease expiry fire as timers
        assert eng.next_wake() == 1.0
        eng.advance(1.0)
    assert att.ended
    return eng, holder, waiter


@pytest.mark.parametrize(
    ("how", "holder_status"),
    [
        ("complete", "succeeded"),
        ("retryable", "retrying"),
        ("permanent", "failed"),
        ("timeout", "dead_lettered"),
        ("lease", "dead_lettered"),
        ("cancel", "cancelled"),
    ],
)
def test_semaphore_is_released_when_the_attempt_ends(how: str, holder_status: str) -> None:
    eng, holder, waiter = _end_holder(how)
    assert status(holder) == holder_status
    assert eng.resources["s"].in_use == 0
    eng.dispatch(1.0)
    assert status(waiter) == "running" and waiter.running is not None
    assert waiter.running.started_at == 1.0
    assert eng.resources["s"].in_use == 1


def test_a_retried_holder_takes_its_permit_again() -> None:
    eng, holder, waiter = _end_holder("retryable")
    eng.dispatch(1.0)
    advance_through(eng, 11.0)
    eng.dispatch(11.0)
    assert status(holder) == "ready" and holder.running is None  # parked behind the waiter
    assert waiter.running is not None
    eng.complete(waiter.running, 12.0)
    eng.dispatch(12.0)
    assert status(holder) == "running" and eng.resources["s"].in_use == 1


def test_a_high_task_parked_on_a_semaphore_does_not_block_a_low_task() -> None:
    eng = engine_of(pool("p", 2), resources=[semaphore("db", 1)])
    holder = sub(eng, 0.0, resources={"db": 1})
    start(eng, holder, 0.0)
    high = sub(eng, 1.0, cls=HIGH, resources={"db": 1})
    low = sub(eng, 1.0, cls=LOW)
    eng.dispatch(1.0)
    assert (status(high), status(low)) == ("ready", "running")
    assert eng.pools["p"].busy == 2
    assert pending(eng) == [0, 1, 0, 0]


def test_parked_tasks_keep_priority_then_fifo_order() -> None:
    eng = engine_of(pool("p", 8), resources=[semaphore("db", 1)])
    run = Driver(eng)
    holder = sub(eng, 0.0, payload=1.0, resources={"db": 1})
    run.step(0.0)
    waiters = [
        sub(eng, 0.1, cls=cls, payload=1.0, resources={"db": 1})
        for cls in (LOW, NORMAL, HIGH, LOW, CRIT, NORMAL)
    ]
    run.step(0.1)
    assert all(status(w) == "ready" and w.running is None for w in waiters)
    free = sub(eng, 0.2, cls=LOW, payload=1.0)
    run.step(0.2)
    run.run_until(10.0)
    starts = run.start_by_id()
    assert (starts[holder.id], starts[free.id]) == (0.0, 0.2)
    by_time = sorted(waiters, key=lambda r: starts[r.id])
    assert [w.cls for w in by_time] == [CRIT, HIGH, NORMAL, NORMAL, LOW, LOW]
    assert [starts[w.id] for w in by_time] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [w.id for w in by_time if w.cls == LOW] == [waiters[0].id, waiters[3].id]
    assert run.peak == 2  # the semaphore holder and the LOW task without resources


def test_cancel_a_parked_task() -> None:
    eng = engine_of(pool("p", 4), resources=[semaphore("db", 1)])
    holder = sub(eng, 0.0, resources={"db": 1})
    att = start(eng, holder, 0.0)
    high = sub(eng, 0.0, cls=HIGH, resources={"db": 1})
    normal = sub(eng, 0.0, resources={"db": 1})
    eng.dispatch(0.0)
    assert pending(eng) == [0, 1, 1, 0]
    assert eng.cancel(high.id, 0.5)
    assert (status(high), high.message) == ("cancelled", "cancelled")
    assert not eng.cancel(high.id, 0.6)
    assert pending(eng) == [0, 0, 1, 0]
    eng.complete(att, 1.0)
    eng.dispatch(1.0)
    assert status(normal) == "running" and status(high) == "cancelled"
    assert eng.resources["db"].in_use == 1


def test_a_blocked_task_takes_no_resources_until_it_runs() -> None:
    eng = engine_of(pool("p", 4), resources=[semaphore("db", 1)])
    a = sub(eng, 0.0, key="a")
    child = sub(eng, 0.0, after=["a"], resources={"db": 1})
    other = sub(eng, 0.0, resources={"db": 1})
    eng.dispatch(0.0)
    assert status(other) == "running" and status(child) == "blocked"
    assert a.running is not None and other.running is not None
    eng.complete(a.running, 1.0)
    eng.dispatch(1.0)
    assert status(child) == "ready"  # ready but short of the permit
    eng.complete(other.running, 2.0)
    eng.dispatch(2.0)
    assert status(child) == "running"


def test_a_freed_permit_goes_to_a_task_that_can_start() -> None:
    """Pool A's parked task is first in line for the permit but A has no free slot; pool B has
    one and a task parked on the same semaphore: the permit must not sit idle (a task can run
    as soon as every amount is available, and resources are shared by all pools)."""
    eng = engine_of(pool("A", 1), pool("B", 2), resources=[semaphore("db", 1)])
    holder = sub(eng, 0.0, pool="B", resources={"db": 1})
    att = start(eng, holder, 0.0)
    parked_a = sub(eng, 0.1, pool="A", resources={"db": 1})
    eng.dispatch(0.1)  # A's slot was free: parked on the semaphore
    busy_a = sub(eng, 0.2, pool="A")
    eng.dispatch(0.2)  # now A's only slot is busy
    parked_b = sub(eng, 0.3, pool="B", resources={"db": 1})
    eng.dispatch(0.3)
    assert [status(r) for r in (parked_a, busy_a, parked_b)] == ["ready", "running", "ready"]
    eng.complete(att, 1.0)
    eng.advance(1.0)
    eng.dispatch(1.0)
    assert status(parked_a) == "ready"  # no slot in A
    assert status(parked_b) == "running"  # B has a slot and the permit is free
    assert eng.resources["db"].in_use == 1


# --- token buckets (docs/resources.md) ------------------------------------------------------------


def test_token_bucket_starts_full_and_refills_at_rate() -> None:
    eng = engine_of(pool("p", 8), resources=[bucket("tb", 5.0, 3)])
    recs = [sub(eng, 0.0, resources={"tb": 1}) for _ in range(8)]
    run = Driver(eng)
    run.step(0.0)
    assert eng.next_wake() == pytest.approx(0.2, abs=1e-9)
    run.run_until(2.0)
    starts = run.start_by_id()
    assert [starts[r.id] for r in recs] == pytest.approx(
        [0.0, 0.0, 0.0, 0.2, 0.4, 0.6, 0.8, 1.0], abs=1e-9
    )


def test_token_bucket_amount_two() -> None:
    eng = engine_of(pool("p", 8), resources=[bucket("tb", 5.0, 3)])
    recs = [sub(eng, 0.0, resources={"tb": 2}) for _ in range(4)]
    run = Driver(eng)
    run.run_until(2.0)
    starts = run.start_by_id()
    # 3 -> 1 token at 0; then 2 tokens are there at 0.2, 0.6, 1.0 (every 0.4 s once empty)
    assert [starts[r.id] for r in recs] == pytest.approx([0.0, 0.2, 0.6, 1.0], abs=1e-9)


def test_token_bucket_tokens_do_not_come_back_when_attempts_end() -> None:
    eng = engine_of(pool("p", 8), resources=[bucket("tb", 5.0, 3)])
    first = [sub(eng, 0.0, payload=0.01, resources={"tb": 1}) for _ in range(3)]
    run = Driver(eng)
    run.run_until(0.05)
    assert all(status(r) == "succeeded" for r in first)
    late = sub(eng, 0.05, resources={"tb": 1})
    run.run_until(1.0)
    assert run.start_by_id()[late.id] == pytest.approx(0.2, abs=1e-9)


def test_token_bucket_holds_at_most_burst_tokens() -> None:
    eng = engine_of(pool("p", 8), resources=[bucket("tb", 5.0, 3)])
    recs = [sub(eng, 10.0, resources={"tb": 1}) for _ in range(5)]
    run = Driver(eng, 10.0)
    run.run_until(12.0)
    starts = run.start_by_id()
    assert [starts[r.id] for r in recs] == pytest.approx([10.0, 10.0, 10.0, 10.2, 10.4], abs=1e-9)


def test_token_bucket_shared_by_two_pools_and_priority_order() -> None:
    eng = engine_of(pool("a", 4), pool("b", 4), resources=[bucket("tb", 10.0, 1)])
    low = sub(eng, 0.0, pool="a", cls=LOW, resources={"tb": 1})
    first = sub(eng, 0.0, pool="b", resources={"tb": 1})
    high = sub(eng, 0.0, pool="b", cls=HIGH, resources={"tb": 1})
    run = Driver(eng)
    run.run_until(1.0)
    starts = run.start_by_id()
    # pool a is dispatched first at t=0 and takes the only token; then HIGH before the NORMAL
    assert starts[low.id] == 0.0
    assert starts[high.id] == pytest.approx(0.1, abs=1e-9)
    assert starts[first.id] == pytest.approx(0.2, abs=1e-9)


# --- resource submission checks (docs/resources.md) -----------------------------------------------


def test_unknown_resource_and_amount_above_capacity() -> None:
    eng = engine_of(pool(), resources=[semaphore("sem", 2), bucket("tb", 5.0, 3)])
    assert rejected(lambda: sub(eng, 0.0, resources={"zzz": 1})) == (
        "unknown_resource",
        "unknown resource 'zzz'",
    )
    assert rejected(lambda: sub(eng, 0.0, resources={"sem": 3})) == (
        "resource_exceeds_capacity",
        "requested amount exceeds capacity of resource 'sem'",
    )
    assert rejected(lambda: sub(eng, 0.0, resources={"tb": 4})) == (
        "resource_exceeds_capacity",
        "requested amount exceeds capacity of resource 'tb'",
    )
    assert not eng.tasks
    ok = sub(eng, 0.0, resources={"sem": 2, "tb": 3})
    assert ok.id == 1


# --- max_pending and overflow (docs/overflow-and-fairness.md, "max_pending and overflow") ---------


def test_max_pending_counts_blocked_ready_and_retrying_but_not_running() -> None:
    eng = engine_of(pool("p", 1, max_pending=3, overflow="reject"))
    x = sub(eng, 0.0, key="x", retry=SLOW_RETRY)
    att = start(eng, x, 0.0)
    assert pending(eng) == [0, 0, 0, 0] and eng.has_room("p")
    sub(eng, 0.0, after=["x"])  # blocked
    sub(eng, 0.0)  # ready
    assert eng.has_room("p")
    eng.fail(att, 1.0, "again")  # retrying
    assert status(x) == "retrying" and pending(eng) == [0, 0, 3, 0]
    assert not eng.has_room("p")
    assert rejected(lambda: sub(eng, 1.0)) == ("overloaded", "overloaded")
    advance_through(eng, 11.0)
    eng.dispatch(11.0)
    assert status(x) == "running" and pending(eng) == [0, 0, 2, 0]
    assert eng.has_room("p")
    sub(eng, 11.0)


def test_has_room_without_a_bound() -> None:
    eng = engine_of(pool("p", 0))
    for _ in range(100):
        sub(eng, 0.0)
    assert eng.has_room("p")


@pytest.mark.parametrize("cls", [CRIT, HIGH, NORMAL, LOW])
def test_reject_refuses_any_priority_when_full(cls: int) -> None:
    eng = engine_of(pool("p", 0, max_pending=3, overflow="reject"))
    for c in (LOW, LOW, LOW):
        sub(eng, 0.0, cls=c)
    before = fingerprint(eng)
    assert rejected(lambda: sub(eng, 1.0, cls=cls)) == ("overloaded", "overloaded")
    assert fingerprint(eng) == before


def test_a_duplicate_key_needs_no_room() -> None:
    eng = engine_of(pool("p", 0, max_pending=1, overflow="reject"))
    a = sub(eng, 0.0, key="a")
    rec, dup = eng.submit(task(key="a"), 1.0)
    assert (rec, dup) == (a, True)


def test_shed_lowest() -> None:
    eng = engine_of(pool("p", 0, max_pending=3, overflow="shed_lowest"))
    normal = sub(eng, 0.0, cls=NORMAL)
    low1 = sub(eng, 1.0, cls=LOW)
    low2 = sub(eng, 2.0, cls=LOW)
    # an incoming LOW has no class strictly below it
    assert rejected(lambda: sub(eng, 3.0, cls=LOW)) == ("overloaded", "overloaded")
    eng.take()
    n2 = sub(eng, 4.0, cls=NORMAL)  # evicts the newest LOW
    assert (status(low2), low2.message, low2.finished_at) == ("shed", "shed under overload", 4.0)
    assert [(e.id, e.status, e.message) for e in eng.take().events] == [
        (low2.id, "shed", "shed under overload"),
        (n2.id, "blocked", None),
        (n2.id, "ready", None),
    ]
    assert status(low1) == "ready" and eng.totals["shed"] == 1
    # an incoming NORMAL finds no class below NORMAL once the LOWs are gone
    h1 = sub(eng, 5.0, cls=HIGH)
    assert status(low1) == "shed"
    assert rejected(lambda: sub(eng, 6.0, cls=NORMAL)) == ("overloaded", "overloaded")
    sub(eng, 7.0, cls=HIGH)  # evicts the newest of the lowest class below HIGH: n2
    assert (status(n2), status(normal)) == ("shed", "ready")
    sub(eng, 8.0, cls=CRIT)
    assert status(normal) == "shed"
    assert rejected(lambda: sub(eng, 9.0, cls=HIGH)) == ("overloaded", "overloaded")
    sub(eng, 10.0, cls=CRIT)  # HIGH is below CRITICAL: the newest HIGH goes
    assert status(h1) == "ready"
    assert eng.totals["shed"] == 5 and pending(eng) == [2, 1, 0, 0]


def test_shed_lowest_takes_the_lowest_class_first() -> None:
    eng = engine_of(pool("p", 0, max_pending=3, overflow="shed_lowest"))
    low = sub(eng, 0.0, cls=LOW)
    n1 = sub(eng, 1.0, cls=NORMAL)
    n2 = sub(eng, 2.0, cls=NORMAL)
    sub(eng, 3.0, cls=HIGH)
    assert [status(r) for r in (low, n1, n2)] == ["shed", "ready", "ready"]


def test_shed_oldest() -> None:
    eng = engine_of(pool("p", 0, max_pending=3, overflow="shed_oldest"))
    low1 = sub(eng, 0.0, cls=LOW)
    normal = sub(eng, 1.0, cls=NORMAL)
    low2 = sub(eng, 2.0, cls=LOW)
    low3 = sub(eng, 3.0, cls=LOW)  # even an incoming LOW evicts the oldest LOW
    assert (status(low1), low1.message) == ("shed", "shed under overload")
    crit = sub(eng, 4.0, cls=CRIT)
    assert status(low2) == "shed" and status(low3) == "ready"
    sub(eng, 5.0, cls=HIGH)
    assert status(low3) == "shed"
    for cls in (CRIT, HIGH, NORMAL, LOW):  # no LOW left
        assert rejected(lambda: sub(eng, 6.0, cls=cls)) == ("overloaded", "overloaded")  # noqa: B023
    assert status(normal) == "ready" and status(crit) == "ready"
    assert eng.totals["shed"] == 3


def test_shed_victims_are_ready_tasks_only() -> None:
    """Blocked and running tasks are not evicted (only queued ready tasks are)."""
    eng = engine_of(pool("p", 1, max_pending=2, overflow="shed_oldest"))
    run_low = sub(eng, 0.0, cls=LOW, key="r")
    start(eng, run_low, 0.0)
    blocked_low = sub(eng, 0.0, cls=LOW, after=["r"])
    ready_low = sub(eng, 1.0, cls=LOW)
    sub(eng, 2.0, cls=NORMAL)
    assert [status(r) for r in (run_low, blocked_low, ready_low)] == [
        "running",
        "blocked",
        "shed",
    ]
    assert rejected(lambda: sub(eng, 3.0))[0] == "overloaded"


def test_shed_oldest_evicts_a_low_task_parked_on_a_resource() -> None:
    """A LOW task waiting for a permit is pending (status ready) like any queued LOW task, so
    shed_oldest evicts it (docs/overflow-and-fairness.md, "max_pending and overflow")."""
    eng = engine_of(
        pool("p", 2, max_pending=1, overflow="shed_oldest"), resources=[semaphore("s", 1)]
    )
    holder = sub(eng, 0.0, resources={"s": 1})
    start(eng, holder, 0.0)
    low = sub(eng, 1.0, cls=LOW, resources={"s": 1})
    eng.dispatch(1.0)
    assert status(low) == "ready" and pending(eng) == [0, 0, 0, 1]
    incoming = sub(eng, 2.0, cls=NORMAL)
    assert (status(low), low.message) == ("shed", "shed under overload")
    assert status(incoming) in ("ready", "running")


def test_dependents_of_a_shed_task_are_skipped() -> None:
    eng = engine_of(pool("z", 0, max_pending=1, overflow="shed_lowest"), pool("p", 4))
    victim = sub(eng, 0.0, pool="z", cls=LOW, key="v")
    child = sub(eng, 0.0, after=["v"])
    sub(eng, 1.0, pool="z", cls=HIGH)
    assert (status(child), child.message) == ("skipped", f"dependency {victim.id} ended as shed")
    assert eng.totals["shed"] == 1 and eng.totals["skipped"] == 1


def test_wait_policy_is_full_from_the_engine() -> None:
    eng = engine_of(pool("p", 1, max_pending=2))
    assert eng.pools["p"].cfg.overflow == "wait"
    first = sub(eng, 0.0)
    sub(eng, 0.0)
    assert not eng.has_room("p")
    before = fingerprint(eng)
    assert rejected(lambda: sub(eng, 0.0, cls=CRIT)) == ("full", "queue full")
    assert fingerprint(eng) == before
    start(eng, first, 0.0)  # a dispatch makes room
    assert eng.has_room("p")
    assert sub(eng, 0.0).id == 3


@pytest.mark.parametrize("overflow", ["wait", "reject", "shed_lowest", "shed_oldest"])
def test_a_batch_over_max_pending_is_overloaded(overflow: str) -> None:
    eng = engine_of(pool("p", 0, max_pending=3, overflow=overflow), pool("q", 0))
    sub(eng, 0.0, cls=LOW)
    before = fingerprint(eng)
    recs = [task(cls=HIGH), task(cls=HIGH, pool="q"), task(cls=HIGH), task(cls=HIGH)]
    assert rejected(lambda: eng.submit_batch(recs, 1.0)) == ("overloaded", "overloaded")
    assert fingerprint(eng) == before
    fits = eng.submit_batch(recs[:3], 1.0)  # two more for "p": exactly at the bound
    assert [r.id for r, _ in fits] == [2, 3, 4]
    assert pending(eng) == [0, 2, 0, 1]


def test_a_batch_duplicate_takes_no_room() -> None:
    eng = engine_of(pool("p", 0, max_pending=2, overflow="reject"))
    sub(eng, 0.0, key="a")
    admitted = eng.submit_batch([task(key="a"), task(key="b")], 1.0)
    assert [(r.id, dup) for r, dup in admitted] == [(1, True), (2, False)]


def test_dependents_lists_every_child_by_id_or_key_even_once_resolved() -> None:
    eng = engine_of(pool(capacity=0))
    parent = sub(eng, 0.0, key="root")
    by_id = sub(eng, 0.0, deps=[(parent.id, "complete")])
    sub(eng, 0.0)  # no dependency
    by_key = sub(eng, 0.0, after=["root"])
    both = sub(eng, 0.0, deps=[(parent.id, "failure"), ("root", "success")])
    expected = [(by_id, "complete"), (by_key, "success"), (both, "failure")]
    assert eng.dependents(parent) == expected
    assert eng.dependents(by_id) == []
    assert eng.cancel(parent.id, 1.0)  # the waiting edges resolve; the spec edges stay
    assert eng.dependents(parent) == expected
