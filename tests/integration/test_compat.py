"""cronoq.compat.ElasticPriorityScheduler end to end (docs/compat.md): a real Scheduler on its
own thread, driven from plain test threads.

The `sent` fixture records the options of every submission the facade makes to the real
scheduler, so the id -> key mapping and the option mapping are checked where they take
effect. Tasks are short (tens of milliseconds) and every wait is bounded; the only slow test
waits out stop()'s 2 s grace period on purpose.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cronoq import Scheduler
from cronoq.compat import ElasticPriorityScheduler, Priority, QualityMetrics, Task

CONFLICT = "fixed-start reservation conflict"
CYCLE = "dependency cycle"

Make = Callable[..., ElasticPriorityScheduler]


@pytest.fixture
def make() -> Iterator[Make]:
    """Builds facades and stops every one of them when the test ends."""
    made: list[ElasticPriorityScheduler] = []

    def build(**options: Any) -> ElasticPriorityScheduler:
        sched = ElasticPriorityScheduler(**options)
        made.append(sched)
        return sched

    yield build
    for sched in made:
        sched.stop()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The options of each Scheduler.submit() call, in call order."""
    calls: list[dict[str, Any]] = []
    real = Scheduler.submit

    async def spy(self: Scheduler, payload: Any, **options: Any) -> Any:
        calls.append(options)
        return await real(self, payload, **options)

    monkeypatch.setattr(Scheduler, "submit", spy)
    return calls


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    limit = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < limit, "condition not met in time"
        time.sleep(0.01)


def wait_for_completed(sched: ElasticPriorityScheduler, n: int) -> list[Task]:
    wait_until(lambda: sched.completed_count >= n)
    return sched.completed_tasks


def ids(tasks: list[Task]) -> list[object]:
    return [t.id for t in tasks]


def keys(calls: list[dict[str, Any]]) -> list[str]:
    return [c["key"] for c in calls]


# --- life cycle --------------------------------------------------------------------------------


def test_tasks_queued_before_start_run_in_priority_order(make: Make) -> None:
    sched = make(initial_workers=1, max_workers=1)
    for name, prio in [("low", 3), ("normal", Priority.NORMAL), ("high", 1), ("crit", 0)]:
        assert sched.submit(Task(name, 0.02, priority=prio))
    assert ids(sched.pending_tasks) == ["low", "normal", "high", "crit"]
    assert sched.completed_count == 0
    sched.start()
    done = wait_for_completed(sched, 4)
    assert ids(done) == ["crit", "high", "normal", "low"]
    assert sched.pending_tasks == []
    assert sched.get_metrics().priority_adherence == 1.0


def test_waiting_tasks_run_in_priority_order_after_a_running_one(make: Make) -> None:
    sched = make(initial_workers=1, max_workers=1)
    sched.start()
    assert sched.submit(Task("blocker", 0.3))
    time.sleep(0.05)  # the blocker holds the only worker now
    for name, prio in [("normal", 2), ("low", 3), ("crit", 0), ("high", 1)]:
        assert sched.submit(Task(name, 0.02, priority=prio))
    done = wait_for_completed(sched, 5)
    assert ids(done) == ["blocker", "crit", "high", "normal", "low"]
    blocker_end = done[0].end_time
    assert blocker_end is not None
    assert all(t.start_time is not None and t.start_time >= blocker_end for t in done[1:])


def test_stop_keeps_queued_tasks_and_restart_runs_them_under_the_same_keys(
    make: Make, sent: list[dict[str, Any]]
) -> None:
    sched = make(initial_workers=1, max_workers=1)
    for task in [Task("long", 0.3), Task("q1", 0.02), Task("q2", 0.02)]:
        assert sched.submit(task)
    sched.start()
    time.sleep(0.1)  # "long" runs, q1 and q2 wait behind it
    sched.stop()
    assert ids(sched.completed_tasks) == ["long"]  # it finished inside the grace period
    assert ids(sched.pending_tasks) == ["q1", "q2"]
    time.sleep(0.1)
    assert sched.completed_count == 1  # nothing runs while stopped
    assert sched.get_metrics().worker_count == 0

    sched.start()
    assert ids(wait_for_completed(sched, 3)) == ["long", "q1", "q2"]
    assert keys(sent) == ["long", "q1", "q2", "q1", "q2"]


@pytest.mark.realtime  # cronoq.compat runs its own real-time loop: a real 2 s grace period
def test_a_task_cut_off_by_the_grace_period_is_kept_for_the_next_start(make: Make) -> None:
    sched = make(initial_workers=1, max_workers=1)
    sched.start()
    assert sched.submit(Task("slow", 2.6))
    time.sleep(0.1)
    began = time.monotonic()
    sched.stop()
    assert time.monotonic() - began >= 1.9  # stop() waited for the grace period first
    assert sched.completed_count == 0
    assert ids(sched.pending_tasks) == ["slow"]
    assert sched.get_metrics().pending_count == 1


def test_start_and_stop_twice_are_harmless(make: Make) -> None:
    def compat_threads() -> int:
        return sum(t.name == "cronoq-compat" for t in threading.enumerate())

    sched = make()
    sched.stop()  # never started
    sched.start()
    sched.start()
    assert compat_threads() == 1
    assert sched.submit(Task("a", 0.01))
    wait_for_completed(sched, 1)
    sched.stop()
    sched.stop()
    assert compat_threads() == 0
    assert sched.completed_count == 1


# --- ids, keys and dependencies ----------------------------------------------------------------


def test_a_pending_id_is_queued_once(make: Make, sent: list[dict[str, Any]]) -> None:
    sched = make(initial_workers=1, max_workers=1)
    assert sched.submit(Task("a", 0.02))
    assert sched.submit(Task("a", 0.5))  # pending: accepted, not queued again
    assert ids(sched.pending_tasks) == ["a"]
    sched.start()
    assert sched.submit(Task("slow", 0.3))
    assert sched.submit(Task("slow", 0.3))  # pending while it waits or runs
    wait_for_completed(sched, 2)
    time.sleep(0.1)
    assert sched.completed_count == 2
    assert keys(sent) == ["a", "slow"]
    assert sched.completed_tasks[0].duration == 0.02  # the first submission is the one kept


def test_a_completed_id_runs_again_under_a_new_key(make: Make, sent: list[dict[str, Any]]) -> None:
    sched = make()
    sched.start()
    for n in range(1, 4):
        assert sched.submit(Task("a", 0.02))
        wait_for_completed(sched, n)
    assert keys(sent) == ["a", "a#2", "a#3"]
    assert ids(sched.completed_tasks) == ["a", "a", "a"]
    starts = [t.start_time for t in sched.completed_tasks if t.start_time is not None]
    assert len(starts) == 3 and starts == sorted(starts)


def test_dependencies_wait_for_the_latest_run_of_each_id(
    make: Make, sent: list[dict[str, Any]]
) -> None:
    sched = make(initial_workers=2, max_workers=2)
    sched.start()
    assert sched.submit(Task("child", 0.02, dependencies=["parent"]))  # parent not known yet
    time.sleep(0.2)
    assert sched.completed_count == 0  # the child awaits its parent
    assert sched.submit(Task("parent", 0.1))
    parent, child = wait_for_completed(sched, 2)
    assert ids([parent, child]) == ["parent", "child"]
    assert child.start_time is not None and parent.end_time is not None
    assert child.start_time >= parent.end_time
    assert sent[0]["after"] == ["parent"]

    # A completed dependency is already met; a re-run pending again is waited for.
    assert sched.submit(Task("late", 0.01, dependencies=["parent"]))
    wait_for_completed(sched, 3)
    assert "after" not in sent[2]
    assert sched.submit(Task("parent", 0.1))
    assert sched.submit(Task("next", 0.01, dependencies=["parent", "parent"]))
    assert sent[-1]["after"] == ["parent#2"]
    done = wait_for_completed(sched, 5)
    assert ids(done[3:]) == ["parent", "next"]


def test_int_and_str_ids_are_distinct_tasks(make: Make, sent: list[dict[str, Any]]) -> None:
    sched = make(initial_workers=2, max_workers=2)
    assert sched.submit(Task(2, 0.01, dependencies=[1]))
    assert sched.submit(Task(1, 0.05))
    assert sched.submit(Task("1", 0.01))  # a different task from 1
    sched.start()
    done = wait_for_completed(sched, 3)
    assert sorted(map(str, ids(done))) == ["1", "1", "2"]
    assert {c["key"]: c.get("after") for c in sent} == {"2": ["1"], "1": None, "1#2": None}
    by_id = {(type(t.id), t.id): t for t in done}
    one, two = by_id[(int, 1)], by_id[(int, 2)]
    assert two.start_time is not None and one.end_time is not None
    assert two.start_time >= one.end_time


@pytest.mark.parametrize("started", [False, True], ids=["queued", "running"])
def test_a_dependency_cycle_is_refused_and_leaves_no_trace(
    make: Make, sent: list[dict[str, Any]], caplog: pytest.LogCaptureFixture, started: bool
) -> None:
    sched = make()
    if started:
        sched.start()
    with caplog.at_level(logging.WARNING, logger="cronoq.compat"):
        assert sched.submit(Task("a", 0.01, dependencies=["b"]))
        assert not sched.submit(Task("b", 0.01, dependencies=["a"]))
        assert not sched.submit(Task("self", 0.01, dependencies=["self"]))
    assert ids(sched.pending_tasks) == ["a"]
    assert [r.getMessage() for r in caplog.records] == [
        f"task 'b' was not submitted: {CYCLE} (cycle)",
        f"task 'self' was not submitted: {CYCLE} (cycle)",
    ]
    # The refused ids can be submitted again, under their first keys.
    assert sched.submit(Task("b", 0.01))
    assert sched.submit(Task("self", 0.01))
    sched.start()
    done = ids(wait_for_completed(sched, 3))
    assert sorted(map(str, done)) == ["a", "b", "self"]
    assert done.index("b") < done.index("a")
    assert set(keys(sent)) == {"a", "b", "self"}  # refusals used up no key


# --- fixed starts and deadlines ----------------------------------------------------------------


def test_a_fixed_start_runs_at_its_time(make: Make, sent: list[dict[str, Any]]) -> None:
    sched = make(initial_workers=2, max_workers=2)
    sched.start()
    at = time.time() + 0.4
    deadline = at + 30
    assert sched.submit(Task("f", 0.05, fixed_start=at, deadline=deadline))
    assert sched.submit(Task("zero", 0.0))
    fixed = wait_for_completed(sched, 2)[-1]
    assert fixed.id == "f"
    assert fixed.start_time is not None
    assert fixed.start_time >= at - 0.01  # not before its time (and on time: hits == 1.0)
    assert sent[0] == {
        "key": "f",
        "priority": Priority.NORMAL,
        "duration_hint": 0.05,
        "start_at": at,
        "tolerance": 1.0,
        "deadline_at": deadline,
    }
    assert sent[1]["duration_hint"] == 0.001  # a zero duration still gets a hint
    metrics = sched.get_metrics()
    assert metrics.fixed_schedule_hits == 1.0
    assert metrics.schedule_quality == 1.0


@pytest.mark.parametrize("started", [False, True], ids=["queued", "running"])
def test_reservation_conflicts_are_refused(
    make: Make, caplog: pytest.LogCaptureFixture, started: bool
) -> None:
    sched = make(initial_workers=1, max_workers=2)  # limit max(1, floor(2 * 0.5)) = 1
    if started:
        sched.start()
    at = time.time() + 30
    with caplog.at_level(logging.WARNING, logger="cronoq.compat"):
        assert sched.submit(Task("r1", 0.1, fixed_start=at))  # reserves [at - 1, at + 1.1)
        assert not sched.submit(Task("r2", 0.1, fixed_start=at + 0.5))
        assert sched.submit(Task("r3", 0.1, fixed_start=at + 2.1))  # touches r1: no overlap
        # No fixed start, no reservation (it waits for r3, so it is still pending below).
        assert sched.submit(Task("plain", 0.1, dependencies=["r3"]))
    assert ids(sched.pending_tasks) == ["r1", "r3", "plain"]
    assert [r.getMessage() for r in caplog.records] == [
        f"task 'r2' was not submitted: {CONFLICT} (reservation_conflict)"
    ]

    wide = make(initial_workers=1, max_workers=4)  # limit 2
    if started:
        wide.start()
    assert wide.submit(Task("w1", 0.1, fixed_start=at))
    assert wide.submit(Task("w2", 0.1, fixed_start=at))
    assert not wide.submit(Task("w3", 0.1, fixed_start=at + 0.5))


# --- metrics and cost --------------------------------------------------------------------------


def test_metrics_and_cost(make: Make) -> None:
    sched = make(initial_workers=2, max_workers=2, worker_cost_per_second=0.5)
    assert sched.get_metrics() == QualityMetrics(1.0, 1.0, 1.0, 0.0, 0.0, 0, 0)
    assert sched.get_cost() == 0.0

    now = time.time()
    tasks = [
        Task("a", 0.1),
        Task("b", 0.1, priority=1),
        Task("met", 0.05, deadline=now + 60),
        Task("missed", 0.05, deadline=now - 1),  # cannot end before its deadline
        Task("fixed", 0.05, fixed_start=now + 0.3),
    ]
    assert all(sched.submit(t) for t in tasks)
    assert sched.get_metrics().pending_count == 5
    began = time.time()
    sched.start()
    wait_for_completed(sched, 5)
    running = sched.get_metrics()
    assert running.schedule_quality == pytest.approx(4 / 5)
    assert running.fixed_schedule_hits == 1.0
    assert 0.0 <= running.priority_adherence <= 1.0
    assert 0.0 < running.utilization <= 1.0
    assert running.pending_count == 0
    assert running.worker_count in (1, 2)
    cost = sched.get_cost()
    elapsed = time.time() - began  # measured last: it bounds what was measured before it
    assert 0.0 <= running.avg_wait_time < elapsed
    assert 0.0 < cost <= 2 * elapsed * 0.5 + 0.01  # at most 2 workers at 0.5 per second

    sched.stop()
    stopped = sched.get_metrics()
    assert stopped.worker_count == 0
    assert stopped.schedule_quality == running.schedule_quality
    assert stopped.priority_adherence == running.priority_adherence
    assert stopped.utilization <= running.utilization
    assert sched.get_cost() >= cost
    assert sched.completed_count == 5
    times = {t.id: t for t in sched.completed_tasks}
    assert all(
        t.start_time is not None and t.end_time is not None and t.start_time <= t.end_time
        for t in times.values()
    )


# --- threads -----------------------------------------------------------------------------------


def test_concurrent_submissions_each_run_once(make: Make, sent: list[dict[str, Any]]) -> None:
    sched = make(initial_workers=4, max_workers=4)
    sched.start()
    assert sched.submit(Task("shared", 0.5))
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def submitter(n: int) -> None:
        barrier.wait()
        for i in range(25):
            results.append(sched.submit(Task(f"t{n}-{i}", 0.0, priority=i % 4)))
            results.append(sched.submit(Task("shared", 0.5)))  # pending: not queued again

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 400
    done = wait_for_completed(sched, 201)
    assert collections.Counter(ids(done)).most_common(1)[0][1] == 1
    assert len(sent) == 201
    assert sched.get_metrics().pending_count == 0


def test_submissions_racing_start_and_stop_each_run_once(make: Make) -> None:
    sched = make(initial_workers=2, max_workers=4)
    go = threading.Event()

    def submitter(n: int) -> None:
        go.wait()
        for i in range(40):
            assert sched.submit(Task(f"t{n}-{i}", 0.0))
            time.sleep(0.001)

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    go.set()
    sched.start()
    sched.stop()
    sched.start()
    for t in threads:
        t.join()
    done = wait_for_completed(sched, 160)
    assert sorted(map(str, ids(done))) == sorted(f"t{n}-{i}" for n in range(4) for i in range(40))
    assert sched.pending_tasks == []


# --- the task copy and argument checks ---------------------------------------------------------


def test_the_scheduler_works_on_a_copy_of_the_task(make: Make) -> None:
    sched = make()
    deps: list[int | str] = []
    task = Task("a", 0.5, priority=1, dependencies=deps)
    before = time.time()
    assert sched.submit(task)
    task.duration = 9.0
    deps.append("b")
    (queued,) = sched.pending_tasks
    assert (queued.duration, queued.dependencies, queued.priority) == (0.5, [], Priority.HIGH)
    assert queued.arrival_time >= before
    assert task.arrival_time == 0.0
    assert queued.start_time is None and queued.end_time is None


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        ({"id": 1.5, "duration": 1}, TypeError, "id"),
        ({"id": True, "duration": 1}, TypeError, "id"),
        ({"id": "a\0b", "duration": 1}, ValueError, "id"),
        ({"id": "a", "duration": -1}, ValueError, "duration"),
        ({"id": "a", "duration": "1"}, TypeError, "duration"),
        ({"id": "a", "duration": float("inf")}, ValueError, "duration"),
        ({"id": "a", "duration": 1, "priority": 4}, ValueError, "priority"),
        ({"id": "a", "duration": 1, "priority": 1.0}, TypeError, "priority"),
        ({"id": "a", "duration": 1, "fixed_start": "soon"}, TypeError, "fixed_start"),
        ({"id": "a", "duration": 1, "deadline": float("nan")}, ValueError, "deadline"),
        ({"id": "a", "duration": 1, "arrival_time": None}, TypeError, "arrival_time"),
        ({"id": "a", "duration": 1, "dependencies": "b"}, TypeError, "dependencies"),
        ({"id": "a", "duration": 1, "dependencies": [None]}, TypeError, "dependencies"),
    ],
)
def test_bad_task_fields_are_named(
    args: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        Task(**args)


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        ({"initial_workers": -1}, ValueError, "initial_workers"),
        ({"initial_workers": 1.5}, TypeError, "initial_workers"),
        ({"max_workers": -2}, ValueError, "max_workers"),
        ({"scale_up_threshold": "high"}, TypeError, "scale_up_threshold"),
        ({"scale_down_threshold": None}, TypeError, "scale_down_threshold"),
        ({"worker_cost_per_second": -0.1}, ValueError, "worker_cost_per_second"),
        ({"worker_cost_per_second": float("nan")}, ValueError, "worker_cost_per_second"),
    ],
)
def test_bad_constructor_arguments_are_named(
    args: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        ElasticPriorityScheduler(**args)


def test_submit_takes_only_compat_tasks(make: Make) -> None:
    sched = make()
    with pytest.raises(TypeError, match=r"task must be a cronoq\.compat\.Task \(got dict\)"):
        sched.submit({"id": "a", "duration": 1})  # type: ignore[arg-type]
    assert sched.pending_tasks == []
