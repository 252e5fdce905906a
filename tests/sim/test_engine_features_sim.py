"""Simulation of the engine core's features: rich random workloads checked by invariants.

`test_engine_sim.py` predicts every event of plain workloads exactly. This file drives the
engine with the features that make exact prediction impractical (docs/dependencies.md to
docs/overflow-and-fairness.md):
dependencies by id and by key with all three conditions (parents succeed, fail, are cancelled or
skipped), awaited keys, atomic batches with forward references (and rejected ones: duplicate key,
unknown dependency, cycles), a semaphore and a token bucket shared by two pools, fixed starts
(past and future, various tolerances and on_miss), tenants in a fair-share pool, labeled tasks
with worker groups appearing and resizing, completes, retryable/permanent failures, cancels and
clock moves driven through `next_wake()` like the asyncio driver (advance then dispatch at each
wake time).

Instead of predicting events, a `Sim` observes every `Actions` the engine hands out and checks:

* life cycle: every task's first event is `blocked`, each next event is allowed by
  `core.model.TRANSITIONS`, attempt numbers go up by one per dispatch, each task's status in the
  engine matches its last event and it sits in exactly one place (running in `engine.running`;
  ready either queued, parked or due; counted in `pending_by_class` while pending); every
  terminal task appears exactly once in `finished`;
* resources: the amounts of running attempts never exceed a semaphore's permits; a token
  bucket never hands out more than `burst + rate x (t - s)` in any window [s, t];
* dependencies: a task leaves `blocked` (and is first dispatched) only when every parent is
  terminal with a status that satisfies its edge; a `skipped` dependent has a parent whose
  status cannot satisfy its edge (or timed out awaiting a key); a blocked task is waiting for
  something;
* capacity: when an attempt starts its pool, its worker group (or the unlabeled slots) stay
  within capacity, a labeled task runs on a group whose labels contain its own, an unlabeled
  task uses a group slot only when the unlabeled slots are full;
* waiting: after every dispatch no queued task is left with a free slot, and no task parked on
  a resource or waiting for a worker group could run now (free slot it may take, matching
  group slot, every resource it wants available: docs/resources.md, docs/groups.md);
* priority: no task of a lower class is dispatched while a higher-class task of the same pool
  is queued (ready, not parked, not due, no deadline) unless aging explains it with the default
  `Scoring` (score = base[class] + min(2 x wait, 800)); in a fair-share pool the class head is
  chosen by fairness, so the bound uses the least-aged candidate head;
* fixed starts: never before the start time; with on_miss skip/fail never after the tolerance;
  "missed" only after the tolerance; admitted reservations that have not started or ended
  overlap at most max(1, floor(max x reservable_fraction)) per pool;
* submission: the model predicts which rejections apply (duplicate key in batch, unknown
  dependency, cycle, reservation conflict, resource over capacity); a rejected submit or batch
  changes nothing (tasks, keys, totals, next id, queues, timers);
* drain: at the end of every example and workload, with slots for every label set and every
  running attempt completed, every task ends except those waiting forever for a key.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cronoq.core.actions import Actions
from cronoq.core.deps import MSG_AWAIT_TIMEOUT
from cronoq.core.engine import EVENTS_ALL, MSG_CANCELLED, Engine
from cronoq.core.fixed import MSG_MISSED
from cronoq.core.groups import Groups
from cronoq.core.model import (
    DEFAULT_RETRY,
    STATUS_NAMES,
    TERMINAL_NAMES,
    TRANSITIONS,
    Attempt,
    Extras,
    PoolConfig,
    RetryPolicy,
    Scoring,
    TaskRecord,
)
from cronoq.core.resources import ResourceConfig, ResourceState
from cronoq.errors import SubmitError

SCORING = Scoring()
STATUS_OF = {name: i for i, name in enumerate(STATUS_NAMES)}
PENDING = frozenset({"blocked", "scheduled", "ready", "retrying"})
ON = ("success", "failure", "complete")
LABEL_SETS: tuple[dict[str, str], ...] = ({"gpu": "1"}, {"zone": "x"}, {"gpu": "1", "zone": "x"})
GROUP_LABELS: tuple[dict[str, str], ...] = (
    {"gpu": "1"},
    {"gpu": "1", "zone": "x"},
    {"zone": "x", "disk": "ssd"},
)
TENANTS = (None, "t1", "t2", "t3")
KEY_NAMES = tuple(f"k{i}" for i in range(6))
FRESH = "<fresh>"  # stands for a key never used before
KEY_CHOICES = (None,) * 5 + (FRESH,) * 5 + KEY_NAMES[:3]
UNKNOWN_ID = 10**9
RETENTION = 1e9  # nothing is forgotten: parents stay inspectable
EPS = 1e-6

LabelKey = frozenset[tuple[str, str]]


def edge_met(status: str, on: str) -> bool:
    """The edge table of docs/dependencies.md, "Edges": does a parent that ended with `status`
    satisfy `on`?"""
    if on == "complete":
        return True
    if on == "success":
        return status == "succeeded"
    return status in ("failed", "dead_lettered")


def nodl_score(cls: int, eligible_at: float, now: float) -> float:
    """Dispatch score without deadline urgency (docs/library.md, "Choosing the next task")."""
    return SCORING.base[cls] + min(SCORING.aging_rate * (now - eligible_at), SCORING.age_cap)


def peak_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """Most half-open intervals [lo, hi) covering one instant (touching ends don't overlap)."""
    points: list[tuple[float, int]] = []
    for lo, hi in intervals:
        if hi > lo:
            points.append((lo, 1))
            points.append((hi, -1))
    points.sort()
    level = peak = 0
    for _, step in points:
        level += step
        peak = max(peak, level)
    return peak


def lkey(labels: dict[str, str] | None) -> LabelKey:
    return frozenset((labels or {}).items())


# --- workload description --------------------------------------------------------------------

Ref = int | str


@dataclass
class Spec:
    """One task to submit (deps already resolved to concrete ids / keys)."""

    pool: str
    cls: int = 2
    key: str | None = None
    tenant: str | None = None
    labels: dict[str, str] | None = None
    resources: dict[str, int] = field(default_factory=dict)
    deps: list[tuple[Ref, str]] = field(default_factory=list)
    fixed: tuple[float, float, str] | None = None  # (offset from now, tolerance, on_miss)
    duration_hint: float | None = None
    deadline_in: float | None = None
    retry: RetryPolicy | None = None
    kind: str = "x"


# --- the model -------------------------------------------------------------------------------


@dataclass
class Edge:
    on: str
    parent: int | None  # id of the parent once known
    awaits: str | None  # key awaited while the parent is unknown


@dataclass
class Fixed:
    start: float
    tol: float
    on_miss: str


@dataclass(eq=False)
class MRun:
    att: Attempt
    task: MTask
    slot: LabelKey | None  # labels of the worker group, None: an unlabeled slot


@dataclass(eq=False)
class MTask:
    rec: TaskRecord
    id: int
    pool: str
    cls: int
    key: str | None
    labels: LabelKey
    resources: dict[str, int]
    edges: list[Edge]
    fixed: Fixed | None
    deadline: float | None
    policy: RetryPolicy
    submitted_at: float
    reservation: tuple[float, float] | None
    status: str = ""
    attempt: int = 0
    events: list[tuple[str, int, float, str | None]] = field(default_factory=list)
    finished_seen: int = 0
    eligible_at: float | None = None
    first_start: float | None = None
    run: MRun | None = None


class Sim:
    """Engine + virtual clock + an observer model; every method is one driver step."""

    def __init__(
        self,
        pools: list[PoolConfig],
        resources: list[ResourceConfig],
        start: float,
        seed: int,
        *,
        auto_pump: bool,
    ) -> None:
        self.now = self.start = start
        self.cfg = {p.name: p for p in pools}
        self.pool_names = [p.name for p in pools]
        self.res = {r.name: r for r in resources}
        self.engine = Engine(
            pools,
            start,
            rng=random.Random(seed),
            event_level=EVENTS_ALL,
            retention=RETENTION,
            resources=resources,
        )
        self.auto_pump = auto_pump
        self.tasks: dict[int, MTask] = {}
        self.keys: dict[str, int] = {}
        self.next_id = 1
        self.running: dict[int, MRun] = {}  # lease -> run
        self.unlabeled = {p.name: p.capacity for p in pools}
        self.groups: dict[str, dict[LabelKey, int]] = {p.name: {} for p in pools}
        self.bucket_log: dict[str, list[tuple[float, int]]] = {r.name: [] for r in resources}
        self.counts: dict[str, int] = {}
        self.log: list[tuple[int, str, int, float, str | None]] = []
        self.fixed_kinds = 0
        self.batches = 0
        self.fresh_keys = 0
        self.in_step = False  # set while a step runs: a failed step leaves it set

    # --- small helpers -----------------------------------------------------------------------

    def bump(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def capacity(self, pool: str) -> int:
        return self.unlabeled[pool] + sum(self.groups[pool].values())

    def limit(self, pool: str) -> int:
        cfg = self.cfg[pool]
        return max(1, math.floor(cfg.max * cfg.reservable_fraction))

    def fair(self, pool: str) -> bool:
        cfg = self.cfg[pool]
        return cfg.fair_share or bool(cfg.tenant_weights)

    def running_list(self) -> list[MRun]:
        return [self.running[k] for k in sorted(self.running)]

    def live(self) -> list[MTask]:
        return [t for t in self.tasks.values() if t.status not in TERMINAL_NAMES]

    @staticmethod
    def not_due(t: MTask) -> bool:
        return not (t.rec.extra is not None and t.rec.extra.due)

    def queued(self, t: MTask) -> bool:
        """Ready and in the ready queues (not parked on a resource or group, not due)."""
        return t.status == "ready" and t.rec.parked is None and self.not_due(t)

    def score(self, t: MTask) -> float:
        assert t.eligible_at is not None
        return nodl_score(t.cls, t.eligible_at, self.now)

    def take(self) -> Actions:
        return self.engine.take()

    def fingerprint(self) -> tuple[Any, ...]:
        eng = self.engine
        return (
            sorted((r.id, r.status, r.attempt, r.key) for r in eng.tasks.values()),
            sorted((k, r.id) for k, r in eng.keys.items()),
            dict(eng.totals),
            eng.next_id,
            eng.live,
            sorted(eng.running),
            [
                (
                    p.busy,
                    p.capacity,
                    tuple(p.pending_by_class),
                    p.queues.n,
                    len(p.reservations),
                    p.holds,
                    len(p.due),
                )
                for p in eng.pools.values()
            ],
            sorted((r.name, r.in_use, r.tokens, len(r.parked)) for r in eng.resources.values()),
            sorted((k, len(v)) for k, v in eng.deps.awaiting.items()),
            len(eng.timers),
            eng.next_wake(),
        )

    # --- building and predicting submissions --------------------------------------------------

    def build(self, spec: Spec) -> TaskRecord:
        extra: dict[str, Any] = {}
        if spec.deps:
            extra["deps"] = list(spec.deps)
        if spec.resources:
            extra["resources"] = dict(spec.resources)
        if spec.fixed is not None:
            off, tol, on_miss = spec.fixed
            extra.update(start_at=self.now + off, tolerance=tol, on_miss=on_miss)
            if spec.duration_hint is None:
                # a kind of its own: its expected duration is the pool default at admission
                self.fixed_kinds += 1
                spec.kind = f"fixed{self.fixed_kinds}"
        return TaskRecord(
            {"spec": spec},
            spec.pool,
            spec.cls,
            kind=spec.kind,
            key=spec.key,
            tenant=spec.tenant,
            deadline=None if spec.deadline_in is None else self.now + spec.deadline_in,
            duration_hint=spec.duration_hint,
            retry=spec.retry,
            labels=spec.labels,
            extra=Extras(**extra) if extra else None,
        )

    def interval(self, spec: Spec, rec: TaskRecord) -> tuple[float, float] | None:
        if spec.fixed is None:
            return None
        assert rec.extra is not None
        start, tol = rec.extra.start_at, rec.extra.tolerance
        assert start is not None
        dur = spec.duration_hint
        if dur is None:
            dur = self.cfg[spec.pool].default_duration
        return (start - tol, start + dur + tol)

    def predict(self, specs: list[Spec], recs: list[TaskRecord], batch: bool) -> set[str]:
        """The rejection codes that apply to this submission (empty: it must be admitted)."""
        if batch:
            seen: set[str] = set()
            for s in specs:
                if s.key is not None:
                    if s.key in seen:
                        return {"duplicate_key_in_batch"}
                    seen.add(s.key)
        new = [i for i, s in enumerate(specs) if s.key is None or s.key not in self.keys]
        fresh = {specs[i].key: i for i in new if specs[i].key is not None}
        codes: set[str] = set()
        for i in new:
            s = specs[i]
            for name, amount in s.resources.items():
                if amount > self.res[name].capacity:
                    codes.add("resource_exceeds_capacity")
            for ref, _ in s.deps:
                if isinstance(ref, str):
                    if ref == s.key:
                        codes.add("cycle")
                    elif ref in self.keys or ref in fresh:
                        pass
                    elif self.cfg[s.pool].unknown_dependency != "await":
                        codes.add("unknown_dependency")
                elif ref not in self.tasks:
                    codes.add("unknown_dependency")
        for p in self.pool_names:
            ivs = [t.reservation for t in self.tasks.values() if t.pool == p and t.reservation]
            added = [self.interval(specs[i], recs[i]) for i in new if specs[i].pool == p]
            ivs.extend(iv for iv in added if iv is not None)
            if peak_overlap(ivs) > self.limit(p):
                codes.add("reservation_conflict")
        if self.batch_cycle(specs, new, fresh) or self.await_cycle(specs, new, fresh):
            codes.add("cycle")
        return codes

    def spec_parents(self, s: Spec, fresh: dict[str, int]) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for ref, _ in s.deps:
            if isinstance(ref, str):
                if ref in self.keys:
                    out.append(("t", self.keys[ref]))
                elif ref in fresh and ref != s.key:
                    out.append(("s", fresh[ref]))
            elif ref in self.tasks:
                out.append(("t", ref))
        return out

    def batch_cycle(self, specs: list[Spec], new: list[int], fresh: dict[str, int]) -> bool:
        state: dict[int, int] = {}

        def visit(i: int) -> bool:
            state[i] = 1
            for kind, j in self.spec_parents(specs[i], fresh):
                if kind != "s":
                    continue
                if state.get(j) == 1 or (state.get(j) is None and visit(j)):
                    return True
            state[i] = 2
            return False

        return any(state.get(i) is None and visit(i) for i in new)

    def await_cycle(self, specs: list[Spec], new: list[int], fresh: dict[str, int]) -> bool:
        """Would a new task's key close a cycle with tasks that await it (docs/dependencies.md,
        "Unknown dependencies and cycles")?"""
        for i in new:
            key = specs[i].key
            if key is None:
                continue
            waiting = {
                t.id
                for t in self.tasks.values()
                if t.status == "blocked"
                and any(e.parent is None and e.awaits == key for e in t.edges)
            }
            if not waiting:
                continue
            stack = self.spec_parents(specs[i], fresh)
            seen: set[tuple[str, int]] = set()
            while stack:
                node = stack.pop()
                kind, n = node
                if kind == "t" and n in waiting:
                    return True
                if node in seen:
                    continue
                seen.add(node)
                if kind == "s":
                    stack.extend(self.spec_parents(specs[n], fresh))
                elif self.tasks[n].status == "blocked":
                    stack.extend(("t", e.parent) for e in self.tasks[n].edges if e.parent)
        return False

    def adopt(self, pairs: list[tuple[Spec, TaskRecord]]) -> None:
        """Model the tasks an accepted submission admitted (in submission order)."""
        fresh: dict[str, int] = {}
        ids = []
        for spec, rec in pairs:
            assert rec.id == self.next_id, f"ids must follow submission order: {rec.id}"
            self.next_id += 1
            ids.append(rec.id)
            if spec.key is not None:
                fresh[spec.key] = rec.id
        for spec, rec in pairs:
            edges = []
            for ref, on in spec.deps:
                if isinstance(ref, str):
                    if ref in self.keys:
                        edges.append(Edge(on, self.keys[ref], None))
                    elif ref in fresh:
                        edges.append(Edge(on, fresh[ref], None))
                    else:
                        edges.append(Edge(on, None, ref))
                else:
                    edges.append(Edge(on, ref, None))
            fixed = None
            if spec.fixed is not None:
                assert rec.extra is not None
                fixed = Fixed(rec.extra.start_at, rec.extra.tolerance, rec.extra.on_miss)
            self.tasks[rec.id] = MTask(
                rec=rec,
                id=rec.id,
                pool=spec.pool,
                cls=spec.cls,
                key=spec.key,
                labels=lkey(spec.labels),
                resources=dict(spec.resources),
                edges=edges,
                fixed=fixed,
                deadline=rec.deadline,
                policy=spec.retry or self.cfg[spec.pool].retry or DEFAULT_RETRY,
                submitted_at=self.now,
                reservation=self.interval(spec, rec),
            )
        new_ids = set(ids)
        for key, tid in fresh.items():
            for t in self.tasks.values():
                if t.id in new_ids or t.status != "blocked":
                    continue
                for e in t.edges:
                    if e.parent is None and e.awaits == key:
                        e.parent, e.awaits = tid, None
        self.keys.update(fresh)
        self.bump("admitted", len(pairs))

    # --- observing the engine's actions -------------------------------------------------------

    def absorb(self, out: Actions, where: str) -> list[MTask]:
        """Check and apply one call's actions; returns the tasks started, in order."""
        now = self.now
        if where != "dispatch":
            assert not out.starts, f"{where} must not start attempts: {out.starts}"
        starts: dict[tuple[int, int], Attempt] = {}
        for att in out.starts:
            k = (att.task.id, att.number)
            assert k not in starts, f"attempt {k} started twice"
            starts[k] = att
        aborted = {att.lease: att for att in out.aborts}
        assert len(aborted) == len(out.aborts), "an attempt aborted twice"
        matched: set[int] = set()
        started: list[MTask] = []
        for e in out.events:
            t = self.tasks.get(e.id)
            assert t is not None, f"event for an unknown task: {e}"
            assert e.at == now, f"{e} not stamped with now={now}"
            assert e.pool == t.pool and e.key == t.key, e
            new, prev = e.status, t.status
            if not t.events:
                assert (new, e.attempt, e.message) == ("blocked", 0, None), f"first event {e}"
            else:
                assert STATUS_OF[new] in TRANSITIONS[STATUS_OF[prev]], (
                    f"task {t.id}: illegal {prev} -> {new} ({e})"
                )
                want = t.attempt + 1 if new == "running" else t.attempt
                assert e.attempt == want, f"task {t.id}: attempt {e.attempt} after {t.attempt}"
            if prev == "running":
                run = t.run
                assert run is not None and run.att.ended, f"task {t.id} left running: {e}"
                if run.att.lease in aborted:
                    matched.add(run.att.lease)
                    assert new == "cancelled" and e.message == MSG_CANCELLED, e
                else:
                    assert where in ("complete", "fail"), f"{e} during {where}"
                self.end_run(run)
            if new == "running":
                att = starts.pop((t.id, e.attempt), None)
                assert att is not None, f"running event without a start: {e}"
                self.on_start(t, att)
                started.append(t)
            elif prev == "blocked" and new in ("ready", "scheduled"):
                self.check_released(t, new)
            elif new == "skipped":
                assert prev == "blocked", e
                self.check_skipped(t, e.message)
            if e.message == MSG_MISSED:
                self.check_missed(t, new)
            if new == "retrying":
                assert e.message, e
                self.bump("retries")
            if new == "ready" and t.eligible_at is None:
                t.eligible_at = now
            if new in TERMINAL_NAMES:
                t.reservation = None
                self.bump(new)
            t.status, t.attempt = new, e.attempt
            t.events.append((new, e.attempt, e.at, e.message))
            self.log.append((e.id, new, e.attempt, e.at, e.message))
        assert not starts, f"starts without a running event: {list(starts.values())}"
        assert matched == set(aborted), f"unexplained aborts {set(aborted) - matched}"
        for rec in out.finished:
            t = self.tasks[rec.id]
            assert rec is t.rec
            assert t.status in TERMINAL_NAMES, f"finished task {t.id} is {t.status}"
            assert rec.finished_at == now
            t.finished_seen += 1
            assert t.finished_seen == 1, f"task {t.id} reported finished twice"
        return started

    def end_run(self, run: MRun) -> None:
        del self.running[run.att.lease]
        run.task.run = None

    def on_start(self, t: MTask, att: Attempt) -> None:
        now = self.now
        assert att.task is t.rec and att.started_at == now and not att.ended
        assert att.lease not in self.running
        slot = None if att.slot is None else lkey(att.slot.labels)
        run = MRun(att, t, slot)
        self.running[att.lease] = run
        t.run = run
        self.bump("dispatched")
        p = t.pool
        mine = [r for r in self.running.values() if r.task.pool == p]
        assert len(mine) <= self.capacity(p), (
            f"pool {p}: {len(mine)} running > capacity {self.capacity(p)} at start of {t.id}"
        )
        n_unlabeled = sum(1 for r in mine if r.slot is None)
        if slot is None:
            assert not t.labels, f"labeled task {t.id} {set(t.labels)} on an unlabeled slot"
            assert n_unlabeled <= self.unlabeled[p], (
                f"pool {p}: task {t.id} started on an unlabeled slot while {n_unlabeled - 1} "
                f"of {self.unlabeled[p]} unlabeled slots were busy (groups {self.groups[p]})"
            )
        else:
            assert t.labels <= slot, f"task {t.id} {set(t.labels)} on group {set(slot)}"
            n_group = sum(1 for r in mine if r.slot == slot)
            cap = self.groups[p].get(slot, 0)
            assert n_group <= cap, f"group {set(slot)}: {n_group} busy > capacity {cap}"
            if not t.labels:
                assert n_unlabeled >= self.unlabeled[p], (
                    f"unlabeled task {t.id} on group {set(slot)} with an unlabeled slot free"
                )
        for name, amount in t.resources.items():
            cfg = self.res[name]
            if cfg.kind == "semaphore":
                held = sum(r.task.resources.get(name, 0) for r in self.running.values())
                assert held <= cfg.permits, f"semaphore {name}: {held} > {cfg.permits} permits"
            else:
                log = self.bucket_log[name]
                log.append((now, amount))
                used = 0
                for at, n in reversed(log):
                    used += n
                    allowed = cfg.burst + cfg.rate * (now - at)
                    assert used <= allowed + EPS, (
                        f"bucket {name}: {used} tokens in [{at}, {now}] > {allowed}"
                    )
        if att.number == 1:
            t.first_start = now
            t.reservation = None
            for e in t.edges:
                assert e.parent is not None, f"task {t.id} dispatched awaiting {e.awaits!r}"
                ps = self.tasks[e.parent].status
                assert ps in TERMINAL_NAMES and edge_met(ps, e.on), (
                    f"task {t.id} dispatched while parent {e.parent} is {ps} (edge {e.on})"
                )
            f = t.fixed
            if f is not None:
                assert now >= f.start, f"fixed task {t.id} started at {now} before {f.start}"
                if f.on_miss != "run_late":
                    assert now <= f.start + f.tol, (
                        f"fixed task {t.id} (on_miss={f.on_miss}) started at {now}, after its "
                        f"start {f.start} + tolerance {f.tol}"
                    )
                    self.bump("fixed_hit")

    def check_released(self, t: MTask, new: str) -> None:
        for e in t.edges:
            assert e.parent is not None, f"task {t.id} {new} while awaiting {e.awaits!r}"
            ps = self.tasks[e.parent].status
            assert ps in TERMINAL_NAMES and edge_met(ps, e.on), (
                f"task {t.id} became {new} while parent {e.parent} is {ps} (edge {e.on})"
            )
        if new == "scheduled":
            assert t.fixed is not None, f"task {t.id} scheduled without a fixed start"
        if t.edges:
            self.bump("released")

    def check_skipped(self, t: MTask, message: str | None) -> None:
        if message == MSG_AWAIT_TIMEOUT:
            timeout = self.cfg[t.pool].await_timeout
            assert timeout is not None, f"task {t.id}: await timeout without await_timeout"
            assert any(e.parent is None for e in t.edges), f"task {t.id}: nothing awaited"
            assert self.now >= t.submitted_at + max(0.0, timeout), f"task {t.id}: early timeout"
            self.bump("await_timeouts")
            return
        dead = [
            e
            for e in t.edges
            if e.parent is not None
            and self.tasks[e.parent].status in TERMINAL_NAMES
            and not edge_met(self.tasks[e.parent].status, e.on)
        ]
        assert dead, f"task {t.id} skipped ({message}) with every edge still satisfiable"
        assert message is not None and message.startswith("dependency "), message
        words = message.split()
        status = words[-1]
        assert any(self.tasks[e.parent].status == status for e in dead if e.parent), message
        if words[1] != "ended":
            pid = int(words[1])
            assert any(e.parent == pid for e in dead), f"task {t.id}: {message}"
        self.bump("skipped_dep")

    def check_missed(self, t: MTask, new: str) -> None:
        f = t.fixed
        assert f is not None, f"task {t.id} missed without a fixed start"
        assert (f.on_miss, new) in (("skip", "missed"), ("fail", "failed")), (f.on_miss, new)
        assert t.first_start is None, f"task {t.id} missed after it started"
        assert self.now >= f.start + f.tol, f"task {t.id} missed at {self.now} within tolerance"
        self.bump("missed_fixed")

    # --- driver steps ------------------------------------------------------------------------

    def after_op(self) -> None:
        if self.auto_pump:
            self.pump(self.now)

    def submit(self, spec: Spec) -> str:
        rec = self.build(spec)
        codes = self.predict([spec], [rec], batch=False)
        before = self.fingerprint()
        try:
            got, dup = self.engine.submit(rec, self.now)
        except SubmitError as err:
            self.rejected(err, codes, before)
            return err.code
        out = self.take()
        assert not codes, f"submit should have been rejected with one of {codes}"
        if spec.key is not None and spec.key in self.keys:
            old = self.tasks[self.keys[spec.key]]
            assert dup is True and got is old.rec, "an existing key must deduplicate"
            assert not out and self.fingerprint() == before, "a duplicate changed something"
            self.bump("duplicates")
            return "duplicate"
        assert dup is False and got is rec
        self.adopt([(spec, rec)])
        self.absorb(out, "submit")
        self.after_op()
        return "ok"

    def submit_batch(self, specs: list[Spec]) -> str:
        recs = [self.build(s) for s in specs]
        codes = self.predict(specs, recs, batch=True)
        before = self.fingerprint()
        try:
            res = self.engine.submit_batch(recs, self.now)
        except SubmitError as err:
            self.rejected(err, codes, before)
            return err.code
        out = self.take()
        assert not codes, f"batch should have been rejected with one of {codes}"
        assert len(res) == len(recs)
        pairs = []
        for spec, rec, (got, dup) in zip(specs, recs, res, strict=True):
            if spec.key is not None and spec.key in self.keys:
                assert dup is True and got is self.tasks[self.keys[spec.key]].rec
                self.bump("duplicates")
            else:
                assert dup is False and got is rec
                pairs.append((spec, rec))
        self.adopt(pairs)
        self.absorb(out, "submit")
        self.bump("batches")
        self.after_op()
        return "ok"

    def rejected(self, err: SubmitError, codes: set[str], before: tuple[Any, ...]) -> None:
        out = self.take()
        assert codes, f"unexpected rejection {err.code}: {err.message}"
        assert err.code in codes, f"rejected with {err.code}, expected one of {codes}"
        assert not out, f"a rejected submission produced actions: {out.events}"
        assert self.fingerprint() == before, "a rejected submission changed the engine"
        self.bump(f"rejected_{err.code}")

    def dispatch(self) -> None:
        now = self.now
        # Ready and not due: queued, or parked (dispatch may first put parked tasks back).
        before = {t.id: t for t in self.tasks.values() if t.status == "ready" and self.not_due(t)}
        self.engine.dispatch(now)
        started = self.absorb(self.take(), "dispatch")
        after = {t.id for t in self.tasks.values() if self.queued(t)}
        for i, s in enumerate(started):
            if s.id not in before or s.deadline is not None:
                continue  # a due fixed start, or deadline urgency may explain anything
            s_score = self.score(s)
            earlier = {x.id for x in started[:i]}
            for c in range(s.cls):
                same = [o for o in before.values() if o.pool == s.pool and o.cls == c]
                # queued from before the first pop to after the last: passed over for s
                left = [o for o in same if o.id in after and o.deadline is None]
                if not left:
                    continue
                if self.fair(s.pool):
                    # Fairness picks the class head among the tasks still waiting: the
                    # least-aged of them bounds the score s had to beat.
                    bound = [min((o for o in same if o.id not in earlier), key=self.score)]
                else:
                    bound = left  # the FIFO head is the most aged: s beat every one
                for o in bound:
                    assert s_score + EPS >= self.score(o), (
                        f"pool {s.pool} at {now}: class {s.cls} task {s.id} (score {s_score}) "
                        f"dispatched while class {c} task {o.id} (score {self.score(o)}) "
                        "was queued"
                    )
        for p in self.pool_names:
            pool = self.engine.pools[p]
            free = pool.capacity - pool.busy - pool.holds
            waiting = [x for x in after if self.tasks[x].pool == p]
            assert free <= 0 or not waiting, (
                f"pool {p}: {free} free slots after dispatch with queued tasks {waiting}"
            )
        self.check_parked()

    def has_amounts(self, t: MTask) -> bool:
        """Could every resource of the task serve it now (with a margin for buckets)?"""
        for name, amount in t.resources.items():
            cfg = self.res[name]
            if cfg.kind == "semaphore":
                held = sum(r.task.resources.get(name, 0) for r in self.running.values())
                if held + amount > cfg.permits:
                    return False
            elif self.bucket_level(name) < min(amount + EPS, cfg.burst):  # full: exact
                return False
        return True

    def bucket_level(self, name: str) -> float:
        """Tokens in a bucket now, from its config and the consumptions seen so far."""
        cfg = self.res[name]
        level, last = float(cfg.burst), self.start
        for at, amount in self.bucket_log[name]:
            level = max(0.0, min(float(cfg.burst), level + (at - last) * cfg.rate) - amount)
            last = at
        return min(float(cfg.burst), level + (self.now - last) * cfg.rate)

    def has_slot(self, t: MTask) -> bool:
        """Is a slot that may run the task free (model counts)?"""
        mine = [r for r in self.running.values() if r.task.pool == t.pool]
        free_groups = [
            key
            for key, cap in self.groups[t.pool].items()
            if sum(1 for r in mine if r.slot == key) < cap
        ]
        if t.labels:
            return any(t.labels <= key for key in free_groups)
        n_unlabeled = sum(1 for r in mine if r.slot is None)
        return n_unlabeled < self.unlabeled[t.pool] or bool(free_groups)

    def check_parked(self) -> None:
        """After a dispatch no ready task is left parked that could run now: its pool has a
        slot ready tasks may take, a slot matching its labels is free and every resource it
        wants can serve it (docs/resources.md: a task waiting for a resource does not stop
        lower-ranked tasks that can run; 2.14: a labeled task waits until a matching group has
        a slot)."""
        for t in self.tasks.values():
            parked = t.rec.parked
            if t.status != "ready" or parked is None:
                continue
            pool = self.engine.pools[t.pool]
            if pool.capacity - pool.busy - pool.holds <= 0 or not self.has_slot(t):
                continue
            if isinstance(parked, Groups):
                raise AssertionError(
                    f"at {self.now}: task {t.id} with labels {dict(t.labels)} parked while a "
                    f"matching worker group of pool {t.pool} has a free slot (groups "
                    f"{ {tuple(sorted(k)): v for k, v in self.groups[t.pool].items()} })"
                )
            assert not self.has_amounts(t), (
                f"at {self.now}: task {t.id} parked on {parked.name!r} while {t.resources} is "
                f"available and pool {t.pool} has a free slot"
            )

    def pump(self, t: float) -> None:
        """One turn of the driver loop at time t: fire timers, then fill free slots."""
        assert t >= self.now
        self.now = t
        self.engine.advance(t)
        self.absorb(self.take(), "advance")
        self.dispatch()
        for task in self.tasks.values():
            if task.status == "blocked" and any(e.parent is None for e in task.edges):
                timeout = self.cfg[task.pool].await_timeout
                assert timeout is None or t < task.submitted_at + max(0.0, timeout), (
                    f"task {task.id} still awaits a key after its await_timeout"
                )

    def advance(self, dt: float) -> None:
        """Move the clock by dt, waking at every next_wake() on the way like the driver."""
        target = self.now + dt
        last, spins = None, 0
        while True:
            w = self.engine.next_wake()
            if w is None or w > target:
                break
            t = max(w, self.now)
            spins = spins + 1 if t == last else 0
            assert spins < 50, f"next_wake() stays at {w} (now {self.now})"
            last = t
            self.pump(t)
        self.pump(target)

    def complete(self, run: MRun) -> None:
        ok = self.engine.complete(run.att, self.now, run.task.id)
        assert ok is True
        self.absorb(self.take(), "complete")
        assert run.task.status == "succeeded"
        self.after_op()

    def fail(self, run: MRun, *, permanent: bool, retry_after: float | None) -> None:
        t = run.task
        if permanent:
            want = "failed"
        elif t.attempt >= t.policy.max_attempts:
            want = "dead_lettered"
        else:
            want = "retrying"
        ok = self.engine.fail(
            run.att, self.now, "boom", permanent=permanent, retry_after=retry_after
        )
        assert ok is True
        self.absorb(self.take(), "fail")
        assert t.status == want, f"task {t.id}: {t.status} after failure, expected {want}"
        self.after_op()

    def cancel(self, ref: int | str) -> None:
        tid = self.keys.get(ref) if isinstance(ref, str) else ref
        t = None if tid is None else self.tasks.get(tid)
        live = t is not None and t.status not in TERMINAL_NAMES
        ok = self.engine.cancel(ref, self.now)
        out = self.take()
        assert ok is live, f"cancel({ref!r}) returned {ok}, live={live}"
        if not live:
            assert not out
            return
        assert t is not None
        self.absorb(out, "cancel")
        assert t.status == "cancelled"
        self.bump("cancels")
        self.after_op()

    def set_group(self, pool: str, labels: dict[str, str], n: int) -> None:
        self.engine.set_group_capacity(pool, dict(labels), n, self.now)
        assert not self.take(), "set_group_capacity must not produce actions"
        self.groups[pool][lkey(labels)] = n
        self.after_op()

    def set_capacity(self, pool: str, n: int) -> None:
        self.engine.set_capacity(pool, n, self.now)
        assert not self.take(), "set_capacity must not produce actions"
        self.unlabeled[pool] = n
        self.after_op()

    # --- whole-state invariants --------------------------------------------------------------

    def check_all(self) -> None:
        eng = self.engine
        assert set(eng.tasks) == set(self.tasks), "engine and model disagree on the tasks"
        assert {k: r.id for k, r in eng.keys.items()} == self.keys
        assert set(eng.running) == set(self.running), "engine and model disagree on attempts"
        for lease, run in self.running.items():
            assert eng.running[lease] is run.att and not run.att.ended
        live = 0
        pending = {p: [0, 0, 0, 0] for p in self.pool_names}
        queued = dict.fromkeys(self.pool_names, 0)
        ready = {p: [0, 0, 0, 0] for p in self.pool_names}
        for t in self.tasks.values():
            rec = t.rec
            assert t.events, f"task {t.id} was never reported"
            assert rec.status_name == t.status, f"task {t.id}: {rec.status_name} != {t.status}"
            assert rec.attempt == t.attempt
            terminal = t.status in TERMINAL_NAMES
            assert t.finished_seen == (1 if terminal else 0), f"task {t.id} finished count"
            if t.status == "running":
                assert t.run is not None and rec.running is t.run.att
            else:
                assert t.run is None and rec.running is None, f"task {t.id} holds an attempt"
            due = rec.extra is not None and rec.extra.due
            if t.status == "ready":
                ready[t.pool][t.cls] += 1
                assert not (due and rec.parked is not None), f"task {t.id} due and parked"
                if isinstance(rec.parked, ResourceState):
                    assert rec.parked.name in t.resources, f"task {t.id} parked on a stranger"
                elif rec.parked is not None:
                    assert isinstance(rec.parked, Groups) and t.labels, f"task {t.id} parked"
                if due:
                    assert t.fixed is not None and t.first_start is None
                if self.queued(t):
                    queued[t.pool] += 1
            else:
                assert rec.parked is None and not due, f"{t.status} task {t.id} still parked/due"
            if t.status in PENDING:
                pending[t.pool][t.cls] += 1
            if not terminal:
                live += 1
            if t.status == "blocked":
                assert t.edges, f"task {t.id} blocked without dependencies"
                waits = [
                    e
                    for e in t.edges
                    if e.parent is None or self.tasks[e.parent].status not in TERMINAL_NAMES
                ]
                assert waits, f"task {t.id} blocked although every parent has ended"
                for e in t.edges:
                    if e.parent is not None and self.tasks[e.parent].status in TERMINAL_NAMES:
                        ps = self.tasks[e.parent].status
                        assert edge_met(ps, e.on), f"task {t.id} blocked on a dead edge ({ps})"
            if t.status == "scheduled":
                assert t.fixed is not None and self.now < t.fixed.start, (
                    f"task {t.id} still scheduled at {self.now}"
                )
        assert eng.live == live
        # the metrics' ready counts (pending - retrying - blocked or scheduled) are exact
        views = {v.pool: v for v in eng.ready_view()}
        for p in self.pool_names:
            assert list(views[p].ready_by_class) == ready[p], (p, views[p], ready[p])
        snap = eng.snapshot(self.now)
        for p in self.pool_names:
            pool = eng.pools[p]
            assert pool.queues.n == queued[p], (
                f"pool {p}: ready queues count {pool.queues.n}, queued tasks {queued[p]}"
            )
            assert list(pool.pending_by_class) == pending[p], (p, pool.pending_by_class)
            n_running = sum(1 for r in self.running.values() if r.task.pool == p)
            assert pool.busy == n_running, f"pool {p}: busy {pool.busy} != {n_running}"
            assert pool.capacity == self.capacity(p)
            active = [t.reservation for t in self.tasks.values() if t.pool == p and t.reservation]
            assert peak_overlap(active) <= self.limit(p), f"pool {p}: reservations overlap"
            ps = snap.pool(p)
            assert ps is not None and ps.reservations == len(active)
        for name, cfg in self.res.items():
            if cfg.kind == "semaphore":
                held = sum(r.task.resources.get(name, 0) for r in self.running.values())
                assert eng.resources[name].in_use == held, f"semaphore {name} accounting"
        totals = eng.totals
        assert totals["submitted"] == len(self.tasks)
        assert totals["dispatched"] == self.counts.get("dispatched", 0)
        assert totals["retries"] == self.counts.get("retries", 0)
        for status in TERMINAL_NAMES:
            assert totals[status] == self.counts.get(status, 0), status

    # --- drain ---------------------------------------------------------------------------------

    def excused(self) -> set[int]:
        """Blocked tasks that may wait forever: awaiting a key with no await_timeout."""
        out: set[int] = set()
        changed = True
        while changed:
            changed = False
            for t in self.tasks.values():
                if t.status != "blocked" or t.id in out:
                    continue
                if any(
                    (e.parent is None and self.cfg[t.pool].await_timeout is None)
                    or (e.parent is not None and e.parent in out)
                    for e in t.edges
                ):
                    out.add(t.id)
                    changed = True
        return out

    def drain(self, rounds: int = 400) -> None:
        """Give every task a slot, complete everything and run the clock until all end."""
        for p in self.pool_names:
            if self.unlabeled[p] == 0:
                self.set_capacity(p, 1)
        for t in self.live():
            if t.labels and not any(
                cap > 0 and t.labels <= key for key, cap in self.groups[t.pool].items()
            ):
                self.set_group(t.pool, dict(t.labels), 1)
        for _ in range(rounds):
            self.pump(self.now)
            for run in self.running_list():
                if run.att.lease in self.running:
                    self.complete(run)
            self.check_all()
            excused = self.excused()
            if all(t.status in TERMINAL_NAMES or t.id in excused for t in self.tasks.values()):
                break
            w = self.engine.next_wake()
            dt = 1.0 if w is None else min(max(w - self.now, 0.01), 60.0)
            self.advance(dt)
        else:
            stuck = [
                (t.id, t.status, t.rec.parked, t.rec.extra is not None and t.rec.extra.due)
                for t in self.live()
            ]
            raise AssertionError(f"drain did not end these tasks: {stuck[:10]}")
        self.check_all()


# --- generating workloads ----------------------------------------------------------------------

RawDep = tuple[str, int, str]


def resolve_dep(sim: Sim, raw: RawDep) -> tuple[Ref, str] | None:
    kind, pick, on = raw
    if kind == "id":
        ids = sorted(sim.tasks)[-12:]
        return (ids[pick % len(ids)], on) if ids else None
    if kind == "key":
        keys = sorted(sim.keys)
        return (keys[pick % len(keys)], on) if keys else None
    if kind == "name":
        return (KEY_NAMES[pick % len(KEY_NAMES)], on)
    if kind == "badid":
        return (UNKNOWN_ID + pick % 3, on)
    return (f"nope{pick % 3}", on)


def make_spec(sim: Sim, raw: dict[str, Any]) -> Spec:
    deps = [d for d in (resolve_dep(sim, r) for r in raw["deps"]) if d is not None]
    resources = dict(raw["resources"])
    if not raw["over"]:  # mostly within capacity; sometimes more (resource_exceeds_capacity)
        resources = {n: min(a, sim.res[n].capacity) for n, a in resources.items()}
    key = raw["key"]
    if key == FRESH:
        sim.fresh_keys += 1
        key = f"u{sim.fresh_keys}"
    return Spec(
        pool=raw["pool"],
        cls=raw["cls"],
        key=key,
        tenant=raw["tenant"],
        labels=raw["labels"],
        resources=resources,
        deps=deps,
        fixed=raw["fixed"],
        duration_hint=raw["duration_hint"],
        deadline_in=raw["deadline_in"],
        retry=raw["retry"],
        kind=raw["kind"],
    )


def make_batch(sim: Sim, raws: list[dict[str, Any]], links: list[Any], variant: str) -> list[Spec]:
    """A batch with keys of its own, forward/backward references and an optional flaw."""
    sim.batches += 1
    specs = [make_spec(sim, r) for r in raws]
    for i, s in enumerate(specs):
        s.key = f"b{sim.batches}.{i}"
    n = len(specs)
    for child, parent, on in links:
        c, p = child % n, parent % n
        if c != p:
            specs[c].deps.append((f"b{sim.batches}.{p}", on))
    if variant == "dup_key":
        if n == 1:
            specs.append(make_spec(sim, raws[0]))
        specs[-1].key = specs[0].key
    elif variant == "unknown_dep":
        specs[0].deps.append((f"nope-b{sim.batches}", "success"))
    elif variant == "unknown_id":
        specs[-1].deps.append((UNKNOWN_ID, "complete"))
    elif variant == "cycle":
        if n == 1:
            specs[0].deps.append((specs[0].key or "", "complete"))
        else:
            specs[0].deps.append((f"b{sim.batches}.1", "complete"))
            specs[1].deps.append((f"b{sim.batches}.0", "success"))
    elif variant == "existing_key" and sim.keys:
        specs[0].key = sorted(sim.keys)[sim.batches % len(sim.keys)]
    return specs


def random_raw(r: random.Random) -> dict[str, Any]:
    """The same shape as the `raw_tasks` strategy, from a seeded Random (plain workloads)."""
    deps: list[RawDep] = []
    if r.random() < 0.45:
        for _ in range(r.randint(1, 3)):
            deps.append((r.choice(DEP_KINDS), r.randrange(10**6), r.choice(DEP_ONS)))
    fixed = None
    if r.random() < 0.2:
        fixed = (
            r.choice([-5.0, -1.0, -0.3, 0.0, 0.5, 1.5, 3.0, 8.0]),
            r.choice([0.0, 0.5, 1.0, 2.0]),
            r.choice(["run_late", "skip", "fail"]),
        )
    retry = None
    if r.random() < 0.3:
        retry = RetryPolicy(
            max_attempts=r.randint(1, 3),
            initial_backoff=r.choice([0.0, 0.5, 2.0]),
            max_backoff=r.choice([1.0, 4.0]),
            jitter=r.random() < 0.5,
        )
    return {
        "pool": r.choice(["a", "b"]),
        "cls": r.choice([0, 1, 2, 2, 3, 3]),
        "key": r.choice(KEY_CHOICES),
        "tenant": r.choice(TENANTS),
        "labels": r.choice([None, None, None, None, *LABEL_SETS]),
        "resources": r.choice(RESOURCE_CHOICES) if r.random() < 0.4 else {},
        "over": r.random() < 0.1,
        "deps": deps,
        "fixed": fixed,
        "duration_hint": r.choice([None, None, 0.5, 2.0]),
        "deadline_in": r.choice([None] * 6 + [1.0, 10.0]),
        "retry": retry,
        "kind": r.choice(["x", "y"]),
    }


RESOURCE_CHOICES: tuple[dict[str, int], ...] = (
    *({} for _ in range(6)),
    {"sem": 1},
    {"sem": 2},
    {"sem": 3},
    {"tb": 1},
    {"tb": 2},
    {"tb": 3},
    {"sem": 1, "tb": 1},
)

on_st = st.sampled_from(ON)
DEP_KINDS = ("id",) * 12 + ("key",) * 6 + ("name",) * 4 + ("badid", "badkey")
DEP_ONS = ("success",) * 5 + ("complete",) * 3 + ("failure",) * 2
dep_st = st.tuples(st.sampled_from(DEP_KINDS), st.integers(0, 10**6), st.sampled_from(DEP_ONS))
retry_st = st.one_of(
    st.none(),
    st.none(),
    st.builds(
        RetryPolicy,
        max_attempts=st.integers(1, 3),
        initial_backoff=st.sampled_from([0.0, 0.5, 2.0]),
        max_backoff=st.sampled_from([1.0, 4.0]),
        jitter=st.booleans(),
    ),
)
raw_tasks = st.fixed_dictionaries(
    {
        "pool": st.sampled_from(["a", "b"]),
        "cls": st.sampled_from([0, 1, 2, 2, 3, 3]),
        "key": st.sampled_from(KEY_CHOICES),
        "tenant": st.sampled_from(TENANTS),
        "labels": st.sampled_from([None, None, None, *LABEL_SETS]),
        "resources": st.sampled_from(RESOURCE_CHOICES),
        "over": st.sampled_from([False] * 9 + [True]),
        "deps": st.one_of(st.just([]), st.lists(dep_st, min_size=1, max_size=3)),
        "fixed": st.one_of(
            st.none(),
            st.none(),
            st.none(),
            st.tuples(
                st.sampled_from([-5.0, -1.0, -0.3, 0.0, 0.5, 1.5, 3.0, 8.0]),
                st.sampled_from([0.0, 0.5, 1.0, 2.0]),
                st.sampled_from(["run_late", "skip", "fail"]),
            ),
        ),
        "duration_hint": st.sampled_from([None, None, 0.5, 2.0]),
        "deadline_in": st.sampled_from([None] * 6 + [1.0, 10.0]),
        "retry": retry_st,
        "kind": st.sampled_from(["x", "y"]),
    }
)


def make_pools(
    cap_a: int,
    cap_b: int,
    max_a: int,
    fraction: float,
    weights: dict[str, float],
    await_b: bool,
    await_timeout: float | None,
    default_duration: float,
) -> list[PoolConfig]:
    return [
        PoolConfig(
            "a",
            capacity=cap_a,
            max=max_a,
            reservable_fraction=fraction,
            fair_share=True,
            tenant_weights=weights,
            retry=RetryPolicy(max_attempts=3, initial_backoff=0.5, max_backoff=2.0),
            default_duration=default_duration,
        ),
        PoolConfig(
            "b",
            capacity=cap_b,
            max=4,
            unknown_dependency="await" if await_b else "reject",
            await_timeout=await_timeout,
            retry=RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False),
            default_duration=1.0,
        ),
    ]


def make_resources(permits: int, rate: float, burst: int) -> list[ResourceConfig]:
    return [
        ResourceConfig("sem", "semaphore", permits=permits),
        ResourceConfig("tb", "token_bucket", rate=rate, burst=burst),
    ]


# --- hypothesis state machine --------------------------------------------------------------------


class FeatureMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim: Sim | None = None

    @property
    def s(self) -> Sim:
        assert self.sim is not None
        return self.sim

    def step(self) -> Sim:
        s = self.s
        s.in_step = True
        return s

    def done(self) -> None:
        self.s.in_step = False

    def has_running(self) -> bool:
        return self.sim is not None and bool(self.sim.running)

    @initialize(
        cap_a=st.integers(1, 3),
        cap_b=st.integers(0, 2),
        max_a=st.integers(2, 6),
        fraction=st.sampled_from([0.25, 0.5, 1.0]),
        weights=st.sampled_from([{}, {"t1": 2.0}, {"t2": 0.5, "t3": 3.0}]),
        await_b=st.booleans(),
        await_timeout=st.sampled_from([None, 0.5, 3.0]),
        default_duration=st.sampled_from([0.5, 1.0, 3.0]),
        permits=st.integers(1, 3),
        rate=st.sampled_from([0.5, 1.0, 4.0]),
        burst=st.integers(1, 3),
        seed=st.integers(0, 2**32 - 1),
        start=st.sampled_from([0.0, 1_700_000_000.25]),
        auto_pump=st.booleans(),
    )
    def setup(
        self,
        cap_a: int,
        cap_b: int,
        max_a: int,
        fraction: float,
        weights: dict[str, float],
        await_b: bool,
        await_timeout: float | None,
        default_duration: float,
        permits: int,
        rate: float,
        burst: int,
        seed: int,
        start: float,
        auto_pump: bool,
    ) -> None:
        pools = make_pools(
            cap_a, cap_b, max_a, fraction, weights, await_b, await_timeout, default_duration
        )
        self.sim = Sim(
            pools, make_resources(permits, rate, burst), start, seed, auto_pump=auto_pump
        )

    @rule(raws=st.lists(raw_tasks, min_size=1, max_size=3))
    def submit(self, raws: list[dict[str, Any]]) -> None:
        s = self.step()
        for raw in raws:
            s.submit(make_spec(s, raw))
        self.done()

    @rule(
        raws=st.lists(raw_tasks, min_size=1, max_size=4),
        links=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), on_st), max_size=4),
        variant=st.sampled_from(
            ["ok", "ok", "ok", "dup_key", "unknown_dep", "unknown_id", "cycle", "existing_key"]
        ),
    )
    def submit_batch(self, raws: list[dict[str, Any]], links: list[Any], variant: str) -> None:
        s = self.step()
        s.submit_batch(make_batch(s, raws, links, variant))
        self.done()

    @rule()
    def dispatch(self) -> None:
        self.step().dispatch()
        self.done()

    @precondition(has_running)
    @rule(pick=st.integers(0, 1000))
    def complete(self, pick: int) -> None:
        s = self.step()
        runs = s.running_list()
        s.complete(runs[pick % len(runs)])
        self.done()

    @precondition(has_running)
    @rule(
        pick=st.integers(0, 1000),
        permanent=st.booleans(),
        retry_after=st.sampled_from([None, None, 0.0, 1.0, 5.0]),
    )
    def fail(self, pick: int, permanent: bool, retry_after: float | None) -> None:
        s = self.step()
        runs = s.running_list()
        s.fail(runs[pick % len(runs)], permanent=permanent, retry_after=retry_after)
        self.done()

    @rule(pick=st.integers(0, 1000), by_key=st.booleans())
    def cancel(self, pick: int, by_key: bool) -> None:
        s = self.step()
        if by_key and s.keys:
            keys = sorted(s.keys)
            s.cancel(keys[pick % len(keys)])
        elif s.tasks:
            ids = sorted(s.tasks)
            s.cancel(ids[-1 - pick % len(ids)])
        else:
            s.cancel(UNKNOWN_ID)
        self.done()

    @rule(pool=st.sampled_from(["a", "b"]), which=st.integers(0, 2), n=st.integers(0, 2))
    def set_group(self, pool: str, which: int, n: int) -> None:
        self.step().set_group(pool, GROUP_LABELS[which], n)
        self.done()

    @rule(pool=st.sampled_from(["a", "b"]), n=st.integers(0, 3))
    def set_capacity(self, pool: str, n: int) -> None:
        self.step().set_capacity(pool, n)
        self.done()

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.0, 2.0, 5.0, 20.0]))
    def advance(self, dt: float) -> None:
        self.step().advance(dt)
        self.done()

    @invariant()
    def engine_invariants(self) -> None:
        if self.sim is not None and not self.sim.in_step:
            self.sim.check_all()

    def teardown(self) -> None:
        # Only after a clean run: a failed step's own error must stay the reported one.
        if self.sim is not None and not self.sim.in_step:
            self.sim.drain()


FeatureMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFeatureMachine = FeatureMachine.TestCase


# --- seeded long workloads -----------------------------------------------------------------------


def run_workload(
    seed: int,
    ops: int,
    *,
    auto_pump: bool,
    permits: int = 2,
    rate: float = 1.0,
    burst: int = 2,
) -> Sim:
    r = random.Random(seed)
    pools = make_pools(2, 2, 4, 0.5, {"t1": 2.0}, True, 3.0 if seed % 2 else None, 1.0)
    resources = make_resources(permits, rate, burst)
    sim = Sim(pools, resources, 1_700_000_000.5, seed, auto_pump=auto_pump)
    for i in range(ops):
        x = r.random()
        if x < 0.25:
            sim.submit(make_spec(sim, random_raw(r)))
        elif x < 0.30:
            raws = [random_raw(r) for _ in range(r.randint(1, 4))]
            links = [(r.randrange(4), r.randrange(4), r.choice(ON)) for _ in range(r.randint(0, 4))]
            variant = r.choice(["ok"] * 6 + ["dup_key", "unknown_dep", "cycle", "existing_key"])
            sim.submit_batch(make_batch(sim, raws, links, variant))
        elif x < 0.40:
            sim.dispatch()
        elif x < 0.55 and sim.running:
            sim.complete(r.choice(sim.running_list()))
        elif x < 0.63 and sim.running:
            sim.fail(
                r.choice(sim.running_list()),
                permanent=r.random() < 0.3,
                retry_after=r.choice([None, None, 0.0, 2.0]),
            )
        elif x < 0.67 and sim.tasks:
            sim.cancel(r.choice(sorted(sim.tasks)[-30:]))
        elif x < 0.70:
            sim.set_group(r.choice(["a", "b"]), r.choice(GROUP_LABELS), r.randint(0, 2))
        elif x < 0.71:
            sim.set_capacity(r.choice(["a", "b"]), r.randint(1, 3))
        else:
            sim.advance(r.choice([0.0, 0.1, 0.5, 1.0, 2.0, 5.0]))
        if i % 25 == 0:
            sim.check_all()
    sim.check_all()
    sim.drain()
    return sim


@pytest.mark.parametrize(("seed", "auto_pump"), [(101, False), (202, True)])
def test_long_feature_workload(seed: int, auto_pump: bool) -> None:
    sim = run_workload(seed, 2500, auto_pump=auto_pump)
    c = sim.counts
    # the workload really exercised the features whose invariants it checks
    assert c.get("admitted", 0) > 500
    assert c.get("batches", 0) > 20
    assert c.get("skipped_dep", 0) > 10 and c.get("released", 0) > 50
    assert c.get("rejected_unknown_dependency", 0) > 0
    assert c.get("rejected_duplicate_key_in_batch", 0) > 0
    assert c.get("rejected_cycle", 0) > 0
    assert c.get("missed_fixed", 0) > 0 and c.get("fixed_hit", 0) > 0
    assert c.get("cancels", 0) > 20 and c.get("retries", 0) > 20


def test_long_feature_workload_is_reproducible() -> None:
    a = run_workload(303, 1200, auto_pump=True)
    b = run_workload(303, 1200, auto_pump=True)
    assert len(a.log) > 1000 and a.log == b.log
