"""A seeded random soak of `cronoq.client` (Client and Worker) against the real `cronoq-server`.

Unit and method tests show each call on its own; this drives them together, as an application
does, while the system is disturbed: a worker is stopped and replaced, the server is killed
with SIGKILL and restarted on the same port and SQLite file, then stopped with SIGTERM and
restarted once more. The workers reconnect by themselves; the client keeps its channel.

Each handler picks its behaviour deterministically from (payload, attempt) and records every
start. At the end every acknowledged task must be terminal, and what the server reports must
agree with what the handlers did (see `Soak.check` for the invariants and the one relaxation),
and no server process may log an error.
The run is bounded by conditions, never by sleeps, so the only randomness left is timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import cronoq
from cronoq.client import (
    CancelTask,
    Client,
    ClientError,
    Lease,
    Reject,
    Result,
    Submitted,
    TaskInfo,
    Worker,
    task,
)
from helpers.ports import free_port
from helpers.servers import PORT0, Server, write

SEEDS = (11, 22, 33)
TASKS = 180
BUDGET = 50.0  # seconds for one seed, everything included; only a hang gets near it
POOL_ATTEMPTS = 3
RETRY = f"retry = {{ max_attempts = {POOL_ATTEMPTS}, initial_backoff_s = 0.05, jitter = false }}\n"
POOLS = (
    f'[[pools]]\nname = "main"\nmax = 4\n{RETRY}'
    f'[[pools]]\nname = "ttl"\nmax = 3\nlease_ttl_s = 0.5\n{RETRY}'
)
# name, pool, slots, labels; a task's labels (LABEL[pool]) match only the labelled worker
WORKERS = (
    ("main-a", "main", 3, {"zone": "a"}),
    ("main", "main", 2, {}),
    ("ttl-b", "ttl", 2, {"zone": "b"}),
    ("ttl", "ttl", 1, {}),
)
LABEL = {"main": {"zone": "a"}, "ttl": {"zone": "b"}}
BACKOFF = (0.05, 0.5)
TIMEOUT = 1.0  # per-attempt timeout of some tasks: far above what a returning handler takes
# (behaviour, weight); "hang" only for tasks that a timeout or a cancel is sure to end
BEHAVIOURS = (
    ("json", 5),
    ("bytes", 2),
    ("none", 2),
    ("sleep", 3),
    ("retry", 3),
    ("retry_after", 1),
    ("permanent", 1),
    ("reject", 1),
    ("cancel", 1),
    ("boom", 2),
    ("hang", 3),
)
# outcomes that end a task when the server hears of them, by the status they must lead to
ENDING = {"returned": "succeeded", "permanent": "failed", "cancel": "cancelled"}
SLACK = 1.0  # seconds added around a disruption in which an outcome may be lost


def behaviour(payload: dict[str, Any], attempt: int) -> tuple[str, random.Random]:
    """What a handler does for this attempt: the same on every worker and every run."""
    rng = random.Random(f"{payload['salt']}/{attempt}")
    names = [b for b, w in BEHAVIOURS for _ in range(w) if b != "hang" or payload["hang"]]
    return rng.choice(names), rng


@dataclass
class Plan:
    """One task to submit, drawn in advance from the seed."""

    n: int
    pool: str
    salt: int
    priority: str
    key: str | None = None
    after: list[str] = field(default_factory=list)
    labels: dict[str, str] | None = None
    timeout: float | None = None
    attempts: int | None = None  # task-level retry={"max_attempts": ...}; None: the pool's
    cancel: bool = False  # cancelled by the client at the next sweep
    id: int = 0  # once acknowledged
    phase: int = 0

    @property
    def max_attempts(self) -> int:
        return self.attempts or POOL_ATTEMPTS

    def payload(self) -> dict[str, Any]:
        return {"n": self.n, "salt": self.salt, "hang": self.cancel or self.timeout is not None}

    def opts(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"pool": self.pool, "priority": self.priority, "key": self.key}
        if self.after:
            opts["after"] = self.after
        if self.labels:
            opts["labels"] = self.labels
        if self.timeout is not None:
            opts["timeout"] = self.timeout
        if self.attempts is not None:
            opts["retry"] = {"max_attempts": self.attempts}
        return opts


@dataclass
class Dup:
    """A resubmission of an earlier key: the server must answer with the first task's id."""

    key: str
    pool: str


@dataclass
class Start:
    """One handler call, as the handler saw it (times are time.monotonic())."""

    task_id: int
    attempt: int
    worker: str
    pool: str
    labels: dict[str, str]
    what: str
    began: float
    outcome: str = ""  # returned, rejected, permanent, cancel, retryable, aborted
    value: Any = None
    ended: float = 0.0


def draw(seed: int) -> tuple[list[Plan], list[list[list[Plan | Dup]]]]:
    """The seed's tasks, and the submission steps (one submit or batch each) of 4 phases."""
    rng = random.Random(seed)
    plans: list[Plan] = []
    keyed: list[Plan] = []
    for n in range(TASKS):
        pool = rng.choice(("main", "main", "ttl"))
        p = Plan(n, pool, rng.randrange(1 << 30), rng.choice(("critical", "high", "normal", "low")))
        if rng.random() < 0.6:
            p.key = f"s{seed}-k{n}"
        if keyed and rng.random() < 0.25:
            p.after = [str(q.key) for q in rng.sample(keyed, min(len(keyed), rng.randint(1, 2)))]
        if rng.random() < 0.25:
            p.labels = LABEL[pool]
        if rng.random() < 0.15:
            p.timeout = TIMEOUT
        if rng.random() < 0.3:
            p.attempts = rng.randint(1, 4)
        p.cancel = rng.random() < 0.1
        plans.append(p)
        if p.key is not None:
            keyed.append(p)
    phases: list[list[list[Plan | Dup]]] = [[], [], [], []]
    cuts = [0, TASKS * 35 // 100, TASKS * 60 // 100, TASKS * 80 // 100, TASKS]
    earlier: list[Plan] = []  # keyed plans of earlier steps: safe to resubmit
    for phase in range(4):
        i = cuts[phase]
        while i < cuts[phase + 1]:
            size = 1 if rng.random() < 0.5 else rng.randint(2, 6)
            step: list[Plan | Dup] = plans[i : min(i + size, cuts[phase + 1])]
            for p in step:
                assert isinstance(p, Plan)
                p.phase = phase
            if earlier and rng.random() < 0.15:
                old = rng.choice(earlier)
                assert old.key is not None
                step.insert(rng.randint(0, len(step)), Dup(old.key, old.pool))
            phases[phase].append(step)
            earlier.extend(p for p in step if isinstance(p, Plan) and p.key is not None)
            i += size
    return plans, phases


async def until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition`; False (not an error) if it does not hold within `timeout`."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.01)
    return True


class Soak:
    """One seed's run: the server process, the workers, the client, and what they did."""

    def __init__(self, seed: int, directory: Path) -> None:
        self.seed = seed
        self.db = directory / "q.db"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        text = PORT0.replace("127.0.0.1:0", self.address, 1)
        self.config = write(directory, f'{text}[store]\nkind = "sqlite"\npath = "{self.db}"\n'
                            + POOLS)  # fmt: skip
        self.rng = random.Random(seed * 7919)  # disruptions, apart from the plan's draws
        self.plans, self.phases = draw(seed)
        self.starts: list[Start] = []
        self.workers: dict[str, tuple[Worker, asyncio.Task[None]]] = {}
        self.server: Server | None = None
        self.client = Client(self.address)
        self.by_id: dict[int, Plan] = {}
        self.key_ids: dict[str, int] = {}
        self.cancelled: dict[int, bool] = {}  # task id -> what Client.cancel answered
        self.windows: list[tuple[float, float]] = []  # when outcomes may be lost
        self.problems: list[str] = []

    # --- processes -------------------------------------------------------------------------

    async def start_server(self) -> None:
        self.server = await asyncio.to_thread(Server, self.config)
        await asyncio.to_thread(self.server.wait_for, "event=ready")

    def logged(self, server: Server) -> None:
        """(10) A server that ended logged no error: the server's own invariants (asserts,
        exceptions in callbacks) fail there, while the client may only see a delay."""
        self.problems += [f"server log: {line}" for line in server.lines if "level=error" in line]

    async def api_ready(self) -> None:
        """The client's own channel reconnects: wait until a harmless call goes through, so a
        submission never meets UNAVAILABLE (whose effect would be unknown)."""
        end = time.monotonic() + 15
        while True:
            try:
                await self.client.snapshot()
                return
            except ClientError as e:
                assert e.retryable and time.monotonic() < end, e
                await asyncio.sleep(0.05)

    def start_worker(self, name: str, pool: str, slots: int, labels: dict[str, str]) -> None:
        w = Worker(self.address, pool, self.handler(name, pool, labels), slots=slots, name=name,
                   labels=labels, backoff=BACKOFF)  # fmt: skip
        self.workers[name] = (w, asyncio.create_task(w.run()))

    async def stop_worker(self, name: str, grace: float) -> None:
        w, run = self.workers.pop(name)
        await w.stop(grace)
        await asyncio.wait_for(run, 10)  # run() ends cleanly (a raise fails the test here)
        assert w.running == 0

    # --- the handler -----------------------------------------------------------------------

    def handler(
        self, worker: str, pool: str, labels: dict[str, str]
    ) -> Callable[[Lease], Awaitable[Any]]:
        async def handle(lease: Lease) -> Any:
            payload = lease.json()
            what, rng = behaviour(payload, lease.attempt)
            s = Start(lease.task_id, lease.attempt, worker, pool, labels, what, time.monotonic())
            self.starts.append(s)
            try:
                s.value = await act(what, rng, payload["n"], lease.attempt, bool(labels))
                s.outcome = "returned"
                return s.value
            except Reject:
                s.outcome = "rejected"
                raise
            except CancelTask:
                s.outcome = "cancel"
                raise
            except cronoq.Permanent:
                s.outcome = "permanent"
                raise
            except asyncio.CancelledError:
                s.outcome = "aborted"
                raise
            except Exception:
                s.outcome = "retryable"
                raise
            finally:
                s.ended = time.monotonic()

        return handle

    # --- the workload ----------------------------------------------------------------------

    async def submit(self, step: list[Plan | Dup]) -> None:
        if len(step) == 1 and self.rng.random() < 0.7:
            item = step[0]
            if isinstance(item, Plan):
                answers = [await self.client.submit(item.payload(), **item.opts())]
            else:
                answers = [await self.client.submit({"dup": 1}, pool=item.pool, key=item.key)]
        else:
            specs = [
                task(x.payload(), **x.opts())
                if isinstance(x, Plan)
                else task({"dup": 1}, pool=x.pool, key=x.key)
                for x in step
            ]
            answers = await self.client.submit_batch(specs)
        assert len(answers) == len(step)
        for item, got in zip(step, answers, strict=True):
            self.acknowledged(item, got)

    def acknowledged(self, item: Plan | Dup, got: Submitted) -> None:
        if isinstance(item, Dup):  # (5)
            if not got.duplicate or got.id != self.key_ids[item.key]:
                self.problems.append(f"resubmitted key {item.key}: {got}, first id "
                                     f"{self.key_ids[item.key]}")  # fmt: skip
            return
        if got.duplicate or got.id in self.by_id:
            self.problems.append(f"new task {item.n} answered {got}")
            return
        item.id = got.id
        self.by_id[got.id] = item
        if item.key is not None:
            self.key_ids[item.key] = got.id

    async def sweep(self) -> None:
        """Cancel the submitted tasks drawn for it, preferably while one of them runs."""
        due = [p for p in self.by_id.values() if p.cancel and p.id not in self.cancelled]
        ids = {p.id for p in due}
        await until(lambda: any(s.task_id in ids and not s.outcome for s in self.starts), 1.0)
        for p in due:
            self.cancelled[p.id] = await self.client.cancel(p.id)

    async def busy(self) -> None:
        """Let some attempts be running before a disruption (best effort, never an error)."""
        await until(lambda: sum(w.running for w, _ in self.workers.values()) >= 2, 2.0)

    async def restart(self, how: str) -> None:
        assert self.server is not None
        await self.busy()
        began = time.monotonic()
        if how == "kill":
            await asyncio.to_thread(self.server.kill)
            # A SIGKILLed leader keeps its SQLite lease for 10 s: expire it, as waiting would.
            with contextlib.closing(sqlite3.connect(self.db)) as db, db:
                db.execute("UPDATE cronoq_leader SET expires_unix_ns = 0")
            with contextlib.suppress(AssertionError):  # read its log to the end (never matches)
                await asyncio.to_thread(self.server.wait_for, "(?!)", 5.0)
        else:
            assert await asyncio.to_thread(self.server.terminate, 15) == 0
        self.logged(self.server)
        await self.start_server()
        await self.api_ready()
        self.windows.append((began - SLACK, time.monotonic() + SLACK))

    async def run(self) -> None:
        outer = asyncio.all_tasks()  # this one, and wait_for's caller on Python 3.11
        monitor = asyncio.create_task(self.monitor())
        await self.start_server()
        for spec in WORKERS:
            self.start_worker(*spec)
        for w, _ in self.workers.values():
            await w.wait_registered(10)
        for phase, steps in enumerate(self.phases):
            for step in steps:
                await self.submit(step)
            await self.sweep()
            if phase == 0:
                await self.busy()
                name = self.rng.choice(sorted(self.workers))
                pool, slots, labels = next(w[1:] for w in WORKERS if w[0] == name)
                await self.stop_worker(name, self.rng.choice((0.05, 0.2, 0.5)))
                self.start_worker(f"{name}-2", pool, slots, labels)
            elif phase == 1:
                await self.restart("kill")
            elif phase == 2:
                await self.restart("term")
        await self.sweep()
        results, infos = await self.finish()
        # every worker alive now lived through both restarts and reconnected by itself
        sessions = {name: w.connections for name, (w, _) in self.workers.items()}
        assert all(c >= 3 for c in sessions.values()), sessions
        for name in sorted(self.workers):
            await self.stop_worker(name, 1.0)
        await self.client.close()
        assert self.server is not None
        assert await asyncio.to_thread(self.server.terminate, 15) == 0
        self.logged(self.server)
        monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor
        await until(lambda: asyncio.all_tasks() <= outer, 5.0)
        leftovers = asyncio.all_tasks() - outer
        assert not leftovers, f"seed {self.seed}: tasks left running: {leftovers}"  # (8)
        self.check(results, infos)

    async def monitor(self) -> None:
        """Record stalls of this process's loop: while it does not run, heartbeats and
        outcomes are late, and the server may fairly give an attempt up."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.02)
            after = time.monotonic()
            if after - before > 0.15:
                self.windows.append((before - SLACK, after + SLACK))

    async def finish(self) -> tuple[dict[int, Result], dict[int, TaskInfo]]:
        """Every acknowledged task reaches a terminal status; then what the server says."""
        end = time.monotonic() + 30

        async def wait(i: int) -> Result:
            return await self.client.wait(i, timeout=max(1.0, end - time.monotonic()))

        ids = sorted(self.by_id)
        results = dict(zip(ids, await asyncio.gather(*map(wait, ids)), strict=True))
        infos = dict(zip(ids, await asyncio.gather(*map(self.client.get, ids)), strict=True))
        return results, infos

    # --- the invariants --------------------------------------------------------------------

    def lost(self, s: Start) -> bool:
        """Could the server have missed this outcome? Only near a disruption."""
        return any(a <= s.ended <= b for a, b in self.windows)

    def check(self, results: dict[int, Result], infos: dict[int, TaskInfo]) -> None:
        """(1)-(9) below, for every acknowledged task.

        The one relaxation: an outcome that ends a task (a return, Permanent, CancelTask) but
        that the handler produced during a disruption (a server kill or stop, or a stall of
        this process, plus SLACK on both sides) may never have reached the server, or not
        before the server gave the attempt up (timeout, lease expiry, disconnect, failover).
        The server then counts the attempt as used: either a later attempt decides the task,
        or this was the last one and the task is dead_lettered. Outside those windows every
        such outcome must decide the task, on exactly that attempt.
        """
        p_ = self.problems
        by_task: dict[int, list[Start]] = {}
        workers = {name: (pool, labels) for name, pool, _, labels in WORKERS}
        workers |= {f"{name}-2": v for name, v in workers.items()}
        for s in self.starts:
            by_task.setdefault(s.task_id, []).append(s)
            if s.task_id not in self.by_id:
                p_.append(f"a start for an unknown task: {s}")
        relaxed = 0
        epochs = [sorted({p.id >> 48 for p in self.by_id.values() if p.phase == ph})
                  for ph in range(4)]  # fmt: skip
        # (7) ids of new tasks: phases 0 and 1 share the first leader's epoch, then each
        # restart (kill, then SIGTERM) gives a new, higher one
        if not (len(epochs[0]) == 1 and epochs[0] == epochs[1]
                and epochs[0][0] < epochs[2][0] and epochs[2] == [epochs[2][0]]
                and epochs[2][0] < epochs[3][0] and len(epochs[3]) == 1):  # fmt: skip
            p_.append(f"epochs by phase: {epochs}")
        for i, plan in self.by_id.items():
            info, result = infos[i], results[i]
            where = f"task {i} (n={plan.n}, {plan.pool}, {info.status} on {info.attempt}"
            where += f"/{plan.max_attempts}: {info.message!r})"
            starts = by_task.get(i, [])
            ran = [s for s in starts if s.outcome != "rejected"]
            if info.status != result.status or not info.done:
                p_.append(f"{where}: get says {info.status}, wait says {result.status}")
            # (1) no (task, attempt) ran twice; a hand-back (Reject) goes to another worker
            seen = Counter((s.attempt, s.worker) for s in starts)
            runs = Counter(s.attempt for s in ran)
            if any(c > 1 for c in (*seen.values(), *runs.values())):
                p_.append(f"{where}: an attempt started twice: {starts}")
            # (2) attempts within max_attempts, as the server also reports them
            top = max((s.attempt for s in starts), default=0)
            if not top <= info.attempt <= plan.max_attempts or (
                info.max_attempts not in (0, plan.max_attempts)
            ):
                p_.append(f"{where}: attempts {top}, max_attempts {info.max_attempts}")
            # (9) only workers of the task's pool whose labels include the task's ran it
            for s in starts:
                pool, labels = workers[s.worker]
                if pool != plan.pool or not (plan.labels or {}).items() <= labels.items():
                    p_.append(f"{where}: ran on {s.worker}")
            # (3), (4): outcomes that end a task decide it, on their attempt
            if self.cancelled.get(i):
                if info.status != "cancelled":
                    p_.append(f"{where}: Client.cancel said True")
                continue
            for s in ran:
                if s.outcome not in ENDING:
                    continue
                if s.attempt == info.attempt and info.status == ENDING[s.outcome]:
                    continue
                if self.lost(s) and (
                    s.attempt < info.attempt
                    or (
                        s.attempt == info.attempt == plan.max_attempts
                        and info.status == "dead_lettered"
                    )
                ):
                    relaxed += 1
                    continue
                p_.append(f"{where}: attempt {s.attempt} {s.outcome}: {s.what} at "
                          f"{s.ended:.3f}, windows {self.windows}")  # fmt: skip
            last = [s for s in ran if s.attempt == info.attempt]
            final = last[0] if last else None
            if info.status == "succeeded":
                if final is None or final.outcome != "returned":
                    p_.append(f"{where}: succeeded without a return: {starts}")
                elif not same_output(result, final.value):
                    p_.append(f"{where}: output {result.output!r} for {final.value!r}")
            elif info.status == "failed":
                if final is None or final.outcome != "permanent":
                    p_.append(f"{where}: failed without Permanent: {starts}")
                elif info.message != f"bad {plan.n}":
                    p_.append(f"{where}: the Permanent's message is lost")
            elif info.status == "cancelled":
                if final is None or final.outcome != "cancel":
                    p_.append(f"{where}: cancelled by nobody: {starts}")
            elif info.status == "dead_lettered":
                if info.attempt != plan.max_attempts:
                    p_.append(f"{where}: dead_lettered with attempts left")
            elif info.status != "skipped":
                p_.append(f"{where}: unexpected status")
            # (6) dependents: run only after every parent succeeded; skipped otherwise
            parents = [self.by_id[self.key_ids[k]] for k in plan.after]
            failed = [q.id for q in parents if infos[q.id].status != "succeeded"]
            if failed:
                if starts or info.status != "skipped":
                    p_.append(f"{where}: parents {failed} did not succeed, yet it ran or "
                              f"was not skipped: {starts}")  # fmt: skip
            elif info.status == "skipped":
                p_.append(f"{where}: skipped though its parents succeeded")
            elif starts and parents:
                done = max(
                    s.ended
                    for q in parents
                    for s in by_task[q.id]
                    if s.attempt == infos[q.id].attempt and s.outcome == "returned"
                )
                if min(s.began for s in starts) < done:
                    p_.append(f"{where}: started before its parents ended")
        statuses = Counter(info.status for info in infos.values())
        print(f"seed {self.seed}: {len(self.by_id)} tasks {dict(statuses)}, "
              f"{len(self.starts)} starts, {relaxed} outcomes lost in "
              f"{len(self.windows)} windows")  # fmt: skip
        assert not p_, f"seed {self.seed}:\n" + "\n".join(p_)


async def act(what: str, rng: random.Random, n: int, attempt: int, labelled: bool) -> Any:
    """Do what `behaviour` drew; the value, if any, is what the task must end with."""
    if what == "json":
        return {"n": n, "attempt": attempt, "x": rng.randrange(1000), "é": [True, None]}
    if what == "bytes":
        return f"{n}/{attempt}".encode() + bytes([rng.randrange(256)])
    if what == "sleep":
        await asyncio.sleep(rng.uniform(0.01, 0.15))
        return f"slept {n}"
    if what == "retry":
        raise cronoq.Retryable(f"again {n}")
    if what == "retry_after":
        raise cronoq.Retryable("later", retry_after=rng.uniform(0.01, 0.1))
    if what == "permanent":
        raise cronoq.Permanent(f"bad {n}")
    if what == "reject" and labelled:
        raise Reject("not on a labelled worker")
    if what == "reject":
        return [n, attempt]
    if what == "cancel":
        raise CancelTask("enough")
    if what == "boom":
        raise ValueError(f"boom {n}")
    if what == "hang":
        await asyncio.sleep(60)
        return "late"
    return None  # "none"


def same_output(result: Result, value: Any) -> bool:
    """The output decodes to what the handler returned (the client's own encoding)."""
    if result.output != task(value).payload:
        return False
    if isinstance(value, bytes):
        return True
    if isinstance(value, str):
        return result.text() == value
    return bool(result.json() == value)


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("seed", SEEDS)
def test_soak(seed: int, tmp_path: Path) -> None:
    soak = Soak(seed, tmp_path)
    captured = Captured()
    logger = logging.getLogger("asyncio")
    logger.addHandler(captured)
    try:
        asyncio.run(asyncio.wait_for(soak.run(), BUDGET))
        gc.collect()  # "Task was destroyed but it is pending" shows when the task is freed
    finally:
        logger.removeHandler(captured)
        if soak.server is not None:
            soak.server.kill()
    messages = [r.getMessage() for r in captured.records]
    assert not messages, f"seed {seed}: asyncio logged {messages}"  # (8)
