"""`ElasticPriorityScheduler`: the older prototype's synchronous API on a real `Scheduler`.

Code written for the prototype calls `submit(Task(...))`, `start()`, `stop()` and
`get_metrics()` from ordinary threads. This module keeps that API and runs a real
`cronoq.Scheduler` on a private event loop in a daemon thread; a task "runs" by sleeping for
its `duration`. docs/compat.md maps each prototype field to a submit() option and defines the
metrics.

Threading: the facade's state is guarded by one lock that is held only for short sections and
never while waiting for the loop (the executors on the loop take it too). `start()`, `stop()`,
`get_metrics()` and `get_cost()` also hold a second lock, so they never see a half-finished
start or stop. A submission is handed to the loop while the state lock is held; stop() drops
the loop under that lock before it queues the shutdown, and the loop runs what it was handed in
order, so a submission that saw a running scheduler reaches it before the shutdown does.
`Scheduler.submit` does not suspend on a pool without `max_pending`, so each submission runs on
the loop in one step, never interleaved with another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias, TypeVar

from ._options import AutoscaleConfig, Pool, check_instant, check_number
from .core.model import PoolSnapshot, Priority, Snapshot, check_seconds, parse_priority
from .errors import SubmitError
from .runtime import Scheduler, TaskContext

__all__ = ["ElasticPriorityScheduler", "Priority", "QualityMetrics", "Task"]

log = logging.getLogger("cronoq.compat")

TaskId: TypeAlias = int | str
_T = TypeVar("_T")

POOL = "default"
TOLERANCE = 1.0  # seconds a fixed start may be late and still count as on time
STOP_GRACE = 2.0  # seconds stop() lets running tasks finish
MIN_HINT = 0.001  # duration_hint floor: a zero-length task still occupies a slot briefly
RESERVABLE_FRACTION = 0.5  # given to the pool, and used by the local reservation check


# --- argument checks ---------------------------------------------------------------------------


def _task_id(arg: str, value: object) -> TaskId:
    """Ids become scheduler keys, so only str (without NUL) and int are accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{arg} must be a str or an int (got {value!r})")
    if isinstance(value, str) and "\0" in value:
        raise ValueError(f"{arg} must not contain NUL characters (got {value!r})")
    return value


def _workers(arg: str, value: object) -> int:
    """A worker count; unlike Pool's counts a negative one is a ValueError, not OverflowError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg} must be an int (got {value!r})")
    if value < 0:
        raise ValueError(f"{arg} must be >= 0 (got {value})")
    return value


# --- public values -----------------------------------------------------------------------------


@dataclass
class Task:
    """A unit of work of the prototype API; it runs by sleeping `duration` seconds.

    `id` is a str or an int (1 and "1" are different tasks). `priority` is a Priority, an int
    0..3 or a class name, stored as a Priority. `fixed_start` and `deadline` are Unix seconds
    (a datetime is converted); `dependencies` lists ids that must complete first. The scheduler
    works on its own copy: submit() stamps the copy's `arrival_time` with the time of the call,
    and the copies in `completed_tasks` carry `start_time` and `end_time` (Unix seconds).
    """

    id: TaskId
    duration: float
    priority: int = Priority.NORMAL
    arrival_time: float = 0.0
    fixed_start: float | None = None
    deadline: float | None = None
    dependencies: list[TaskId] = field(default_factory=list)
    start_time: float | None = field(default=None, init=False, compare=False)
    end_time: float | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        self.id = _task_id("id", self.id)
        self.duration = check_seconds("duration", self.duration)
        self.priority = Priority(parse_priority(self.priority))
        self.arrival_time = check_instant("arrival_time", self.arrival_time)
        if self.fixed_start is not None:
            self.fixed_start = check_instant("fixed_start", self.fixed_start)
        if self.deadline is not None:
            self.deadline = check_instant("deadline", self.deadline)
        deps: object = self.dependencies
        if isinstance(deps, (str, bytes)) or not isinstance(deps, Iterable):
            raise TypeError(f"dependencies must be a list of task ids (got {deps!r})")
        # A fresh list, so the caller's list and the scheduler's copy never share edits.
        self.dependencies = [_task_id("dependencies item", dep) for dep in deps]


@dataclass(frozen=True)
class QualityMetrics:
    """How well the work so far was scheduled (definitions in docs/compat.md, "Metrics").

    Ratios are in [0, 1] and are 1.0 while there is nothing to judge; `utilization` is 0.0
    then. Everything but `priority_adherence`, `pending_count` and `worker_count` is computed
    from the completed tasks of every run of the scheduler.
    """

    schedule_quality: float
    priority_adherence: float
    fixed_schedule_hits: float
    utilization: float
    avg_wait_time: float
    pending_count: int
    worker_count: int


# --- internal records --------------------------------------------------------------------------


class _Run:
    """One submission of an id: re-submitting a completed id makes a new run with a new key."""

    __slots__ = (
        "after",
        "end_time",
        "finished",
        "key",
        "number",
        "previous",
        "promises",
        "queued_at",
        "start_time",
        "task",
    )

    def __init__(
        self,
        task: Task,
        key: str,
        number: int,
        after: list[str],
        previous: _Run | None,
        promises: dict[TaskId, str],
    ) -> None:
        self.task = task
        self.key = key
        self.number = number  # 1 for an id's first run, 2 for its re-run, ...
        self.after = after  # keys of the runs it waits for (pending or awaited when submitted)
        self.previous = previous  # the id's run before this one, restored if this one is refused
        self.promises = promises  # keys this run's submission promises to ids not submitted yet
        self.queued_at = 0.0  # when a running scheduler last took it
        self.finished = False
        self.start_time = 0.0
        self.end_time = 0.0

    def public(self) -> Task:
        """A copy of the task for callers, with the run's times once it has finished."""
        task = replace(self.task)
        if self.finished:
            task.start_time, task.end_time = self.start_time, self.end_time
        return task


class _Runner:
    """One start()..stop(): a Scheduler and the daemon thread running its event loop."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="cronoq-compat", daemon=True
        )
        self.thread.start()

    def call(self, work: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _reservation(task: Task) -> tuple[float, float]:
    """The interval a fixed-start task reserves, as the scheduler computes it (docs/compat.md,
    "Submitting, starting, stopping")."""
    assert task.fixed_start is not None
    return (task.fixed_start - TOLERANCE, task.fixed_start + _hint(task) + TOLERANCE)


def _most_overlapping(intervals: list[tuple[float, float]], lo: float, hi: float) -> int:
    """Most of the half-open `intervals` covering one instant of [lo, hi): the count can only
    rise at `lo` or where an interval begins, so those instants are the ones to look at."""
    instants = [lo, *(a for a, _ in intervals if lo < a < hi)]
    return max(sum(1 for a, b in intervals if a <= t < b) for t in instants)


def _hint(task: Task) -> float:
    return max(task.duration, MIN_HINT)


def _on_time(run: _Run) -> bool:
    """Started within the tolerance of its fixed start (a task without one always is)."""
    fixed = run.task.fixed_start
    return fixed is None or run.start_time <= fixed + TOLERANCE


def _kept_promises(run: _Run) -> bool:
    deadline = run.task.deadline
    return _on_time(run) and (deadline is None or run.end_time <= deadline)


def _share(hits: int, total: int) -> float:
    return hits / total if total else 1.0


def _default_pool(snapshot: Snapshot) -> PoolSnapshot:
    pool = snapshot.pool(POOL)
    assert pool is not None
    return pool


def _log_rejection(task: Task, error: SubmitError) -> None:
    log.warning("task %r was not submitted: %s (%s)", task.id, error.message, error.code)


# --- the facade --------------------------------------------------------------------------------


class ElasticPriorityScheduler:
    """The prototype's synchronous, thread-safe scheduler, backed by a real cronoq Scheduler.

    One autoscaled pool "default": min 1, initial `max(1, initial_workers)`, max
    `max(initial, max_workers)`; it drains a backlog within 2 s, steps down after a 5 s
    stabilization window at most every 2 s, and costs `worker_cost_per_second` per worker-second.
    `scale_up_threshold` and `scale_down_threshold` are checked to be numbers and otherwise
    ignored: the autoscaler decides from arrival rate, backlog and reservations instead.
    """

    def __init__(
        self,
        initial_workers: int = 2,
        max_workers: int = 10,
        scale_up_threshold: float = 0.8,
        scale_down_threshold: float = 0.3,
        worker_cost_per_second: float = 0.001,
    ) -> None:
        initial = max(1, _workers("initial_workers", initial_workers))
        top = max(initial, _workers("max_workers", max_workers))
        check_number("scale_up_threshold", scale_up_threshold)
        check_number("scale_down_threshold", scale_down_threshold)
        rate = check_number("worker_cost_per_second", worker_cost_per_second)
        if not (math.isfinite(rate) and rate >= 0.0):
            raise ValueError(f"worker_cost_per_second must be a finite number >= 0 (got {rate!r})")
        self._rate = rate
        self._reservation_limit = max(1, math.floor(top * RESERVABLE_FRACTION))
        self._pool = Pool(
            POOL,
            self._execute,
            min=1,
            max=top,
            initial=initial,
            autoscale=AutoscaleConfig(
                drain_time=2.0,
                stabilization_window=5.0,
                cooldown=2.0,
                cost_per_worker_second=rate,
            ),
            unknown_dependency="await",
            reservable_fraction=RESERVABLE_FRACTION,
        )
        self._life = threading.Lock()  # start/stop and the readers that must not see them half-done
        self._lock = threading.Lock()  # everything below; never held while waiting for the loop
        self._runner: _Runner | None = None
        self._pending: dict[TaskId, _Run] = {}  # submitted and not completed, in submission order
        self._completed: list[_Run] = []
        self._latest: dict[TaskId, _Run] = {}  # each id's most recent run
        self._promised: dict[TaskId, str] = {}  # keys already awaited for an id's next run
        self._by_key: dict[str, _Run] = {}
        self._used_keys: set[str] = set()
        self._worker_seconds = 0.0  # provisioned by the scheduler runs that have ended
        self._adherence = 1.0  # priority adherence when the last run ended

    # --- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler thread and hand it every pending task; a no-op while running."""
        with self._life:
            if self._runner is not None:
                return
            runner = _Runner(Scheduler([self._pool]))
            try:
                runner.call(runner.scheduler.start()).result()
            except BaseException:
                runner.close()
                raise
            with self._lock:
                self._runner = runner
                sending = runner.call(self._send_all(runner, list(self._pending.values())))
            sending.result()

    def stop(self) -> None:
        """Stop dispatching, give running tasks 2 s to finish, and keep every task that did not
        complete for the next start(). Harmless when not running."""
        with self._life:
            with self._lock:
                runner, self._runner = self._runner, None
            if runner is None:
                return
            try:
                runner.call(self._wind_down(runner)).result()
            finally:
                runner.close()

    async def _wind_down(self, runner: _Runner) -> None:
        pool = _default_pool(await runner.scheduler.snapshot())
        began = time.time()
        await runner.scheduler.shutdown(STOP_GRACE)
        with self._lock:
            # The snapshot is gone with the scheduler, so the grace period is billed at the
            # capacity the pool had when stop() began.
            self._worker_seconds += pool.worker_seconds + pool.capacity * (time.time() - began)
            self._adherence = pool.priority_adherence

    # --- submission --------------------------------------------------------------------------

    def submit(self, task: Task) -> bool:
        """Queue `task`: True if it was queued or its id is already pending, False (and a
        warning on the "cronoq.compat" logger) if it would close a dependency cycle or exceed
        the fixed-start reservation limit. A completed id runs again."""
        if not isinstance(task, Task):
            raise TypeError(f"task must be a cronoq.compat.Task (got {type(task).__name__})")
        task = replace(task, arrival_time=time.time())
        with self._lock:
            runner = self._runner
            if runner is None:
                return self._queue(task)
            sending = runner.call(self._submit_live(runner, task))
        return sending.result()

    def _queue(self, task: Task) -> bool:
        """Before start(): keep the task here, refusing what the scheduler would refuse."""
        run = self._prepare(task)
        if run is None:
            return True
        try:
            self._check_locally(run)
        except SubmitError as e:
            _log_rejection(task, e)
            return False
        self._commit(run)
        return True

    async def _submit_live(self, runner: _Runner, task: Task) -> bool:
        with self._lock:
            run = self._prepare(task)
            if run is None:
                return True
            self._commit(run)
        return await self._send(runner, run)

    async def _send_all(self, runner: _Runner, runs: list[_Run]) -> None:
        # All in one loop step, so the first dispatch sees every task and honours priorities.
        for run in runs:
            await self._send(runner, run)

    async def _send(self, runner: _Runner, run: _Run) -> bool:
        """Submit a committed run to the scheduler; a refused run is withdrawn."""
        task = run.task
        with self._lock:
            options: dict[str, Any] = {
                "key": run.key,
                "priority": task.priority,
                "duration_hint": _hint(task),
            }
            if task.fixed_start is not None:
                options["start_at"] = task.fixed_start
                options["tolerance"] = TOLERANCE
            if task.deadline is not None:
                options["deadline_at"] = task.deadline
            # Completed runs are left out: after a restart the new scheduler has never seen them.
            after = [key for key in run.after if not self._finished(key)]
            if after:
                options["after"] = after
            run.queued_at = time.time()
        try:
            await runner.scheduler.submit(run, **options)
        except SubmitError as e:
            with self._lock:
                self._withdraw(run)
            _log_rejection(task, e)
            return False
        return True

    def _prepare(self, task: Task) -> _Run | None:
        """The run a submission of `task` would make (reads state only; `_commit` applies it),
        or None if its id is pending. Each dependency is the latest run of its id: a pending one
        is waited for, a completed one is already met, and an id never submitted is awaited
        under the key its first run will get."""
        ident = task.id
        if ident in self._pending:
            return None
        previous = self._latest.get(ident)
        number = 1 if previous is None else previous.number + 1
        taken: set[str] = set()
        key = self._promised.get(ident)
        if key is None:
            key = self._fresh_key(ident, number, taken)
        taken.add(key)
        after: list[str] = []
        promises: dict[TaskId, str] = {}
        for dep in task.dependencies:
            latest = self._latest.get(dep)
            if latest is not None:
                if not latest.finished:
                    after.append(latest.key)
                continue
            if dep == ident:
                after.append(key)  # its own first run: a cycle, refused by the checks
                continue
            dep_key = self._promised.get(dep, promises.get(dep))
            if dep_key is None:
                dep_key = promises[dep] = self._fresh_key(dep, 1, taken)
                taken.add(dep_key)
            after.append(dep_key)
        return _Run(task, key, number, list(dict.fromkeys(after)), previous, promises)

    def _fresh_key(self, ident: TaskId, number: int, taken: set[str]) -> str:
        """`id` for a first run, `id#n` for the n-th; skips keys in use (ids 1 and "1" would
        otherwise share one)."""
        base = str(ident)
        key = base if number == 1 else f"{base}#{number}"
        while key in self._used_keys or key in taken:
            number += 1
            key = f"{base}#{number}"
        return key

    def _check_locally(self, run: _Run) -> None:
        """The scheduler's own submission checks for tasks kept here: the rules of
        docs/compat.md, "Submitting, starting, stopping"."""
        if self._closes_cycle(run):
            raise SubmitError("cycle", "dependency cycle")
        if run.task.fixed_start is not None:
            lo, hi = _reservation(run.task)
            fixed = [r.task for r in self._pending.values() if r.task.fixed_start is not None]
            others = [_reservation(task) for task in fixed]
            if _most_overlapping(others, lo, hi) + 1 > self._reservation_limit:
                raise SubmitError("reservation_conflict", "fixed-start reservation conflict")

    def _closes_cycle(self, run: _Run) -> bool:
        """Does `run` wait, directly or through pending runs, for its own key?"""
        stack = list(run.after)
        seen: set[str] = set()
        while stack:
            key = stack.pop()
            if key == run.key:
                return True
            if key in seen:
                continue
            seen.add(key)
            parent = self._by_key.get(key)
            if parent is not None and not parent.finished:
                stack.extend(parent.after)
        return False

    def _finished(self, key: str) -> bool:
        """Has the run with this key completed? (False for a key only awaited so far.)"""
        run = self._by_key.get(key)
        return run is not None and run.finished

    def _commit(self, run: _Run) -> None:
        ident = run.task.id
        self._promised.pop(ident, None)
        self._promised.update(run.promises)
        self._used_keys.add(run.key)
        self._used_keys.update(run.promises.values())
        self._latest[ident] = run
        self._pending[ident] = run
        self._by_key[run.key] = run

    def _withdraw(self, run: _Run) -> None:
        """Undo `_commit` for a refused run. Its key stays promised to the id's next run,
        since a dependent may already await it."""
        ident = run.task.id
        del self._pending[ident]
        del self._by_key[run.key]
        if run.previous is None:
            del self._latest[ident]
        else:
            self._latest[ident] = run.previous
        self._promised[ident] = run.key

    async def _execute(self, ctx: TaskContext, run: _Run) -> None:
        """The pool's executor: a task's work is to sleep for its duration."""
        started = time.time()
        await asyncio.sleep(run.task.duration)
        with self._lock:
            run.start_time, run.end_time, run.finished = started, time.time(), True
            del self._pending[run.task.id]
            self._completed.append(run)

    # --- observation -------------------------------------------------------------------------

    def _observe(self) -> PoolSnapshot | None:
        """The pool's snapshot now, or None while stopped. Callers hold `_life`."""
        runner = self._runner
        if runner is None:
            return None
        return _default_pool(runner.call(runner.scheduler.snapshot()).result())

    def get_metrics(self) -> QualityMetrics:
        """Scheduling quality over every completed task (see QualityMetrics)."""
        with self._life:
            pool = self._observe()
            with self._lock:
                done = self._completed
                fixed = [run for run in done if run.task.fixed_start is not None]
                provisioned = self._worker_seconds + (0.0 if pool is None else pool.worker_seconds)
                busy = sum(run.end_time - run.start_time for run in done)
                waits = sum(max(0.0, run.start_time - self._ready_at(run)) for run in done)
                return QualityMetrics(
                    schedule_quality=_share(sum(map(_kept_promises, done)), len(done)),
                    priority_adherence=(
                        self._adherence if pool is None else pool.priority_adherence
                    ),
                    fixed_schedule_hits=_share(sum(map(_on_time, fixed)), len(fixed)),
                    utilization=min(1.0, busy / provisioned) if provisioned > 0 else 0.0,
                    avg_wait_time=waits / len(done) if done else 0.0,
                    pending_count=len(self._pending),
                    worker_count=0 if pool is None else pool.capacity,
                )

    def _ready_at(self, run: _Run) -> float:
        """When a completed run could first have started: a running scheduler had it, its fixed
        start had come and its dependencies had completed."""
        times = [run.queued_at, *(self._by_key[key].end_time for key in run.after)]
        if run.task.fixed_start is not None:
            times.append(run.task.fixed_start)
        return max(times)

    def get_cost(self) -> float:
        """Worker-seconds provisioned over every run of the scheduler x worker_cost_per_second."""
        with self._life:
            pool = self._observe()
            with self._lock:
                live = 0.0 if pool is None else pool.worker_seconds
                return (self._worker_seconds + live) * self._rate

    @property
    def completed_count(self) -> int:
        """How many runs have completed (a re-run id counts each time)."""
        with self._lock:
            return len(self._completed)

    @property
    def completed_tasks(self) -> list[Task]:
        """Copies of the completed runs' tasks, in completion order, with their times."""
        with self._lock:
            return [run.public() for run in self._completed]

    @property
    def pending_tasks(self) -> list[Task]:
        """Copies of the tasks submitted and not completed yet (queued, waiting or running)."""
        with self._lock:
            return [run.public() for run in self._pending.values()]
