"""Deterministic simulation of the sans-I/O engine core against a virtual clock.

A `Sim` owns a virtual `now`, an `Engine` and an independent model of what the engine must do.
Every driver call (submit, dispatch, complete, fail, heartbeat, stale outcome, cancel,
set_capacity, advance) goes through the Sim, which drains `engine.take()` and checks the
Actions against the model:

* calls whose outcome is fully determined (submit, dispatch, complete, fail, cancel, stale
  outcomes, heartbeats, set_capacity) must produce exactly the predicted starts, aborts,
  finished records and events;
* `advance()` may only fire timers that are due (retry backoff window, attempt timeout, lease
  expiry), and after `advance(t)` nothing may be overdue and `next_wake()` must lie after `t`;
* `check_all()` compares the whole engine state (statuses, live count, running attempts, busy,
  pending_by_class, totals, keys, retention) with the model.

The hypothesis `RuleBasedStateMachine` drives the Sim with random rules; the plain tests run a
long seeded workload and check the same invariants plus reproducibility.

Rules come from docs/library.md ("Life cycle of a task" to "Retention") and the engine module
docstring.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
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
from cronoq.core.engine import (
    ABORT_CANCELLED,
    ABORT_LEASE,
    ABORT_TIMEOUT,
    EVENTS_ALL,
    MSG_CANCELLED,
    Engine,
)
from cronoq.core.model import (
    DEFAULT_RETRY,
    STATUS_NAMES,
    TERMINAL_NAMES,
    TOTALS_KEYS,
    TRANSITIONS,
    Attempt,
    PoolConfig,
    RetryPolicy,
    Scoring,
    StatusEvent,
    TaskRecord,
)

SCORING = Scoring()
STATUS_OF = {name: i for i, name in enumerate(STATUS_NAMES)}
PENDING = frozenset({"blocked", "scheduled", "ready", "retrying"})
KEYS = ("k0", "k1", "k2", "k3")
UNKNOWN_ID = 10**9

Ev = tuple[int, str, int, float, str | None]


def ev_tuple(e: StatusEvent) -> Ev:
    return (e.id, e.status, e.attempt, e.at, e.message)


def score(cls: int, eligible_at: float, now: float) -> float:
    """Dispatch score of a task without a deadline (docs/library.md, "Choosing the next task"),
    computed from the documented formula."""
    age = SCORING.aging_rate * (now - eligible_at)
    return SCORING.base[cls] + min(age, SCORING.age_cap)


# --- the model -------------------------------------------------------------------------------


@dataclass(eq=False)
class MAtt:
    att: Attempt
    task: MTask
    started: float
    timeout_due: float | None
    lease_expiry: float | None


@dataclass(eq=False)
class MTask:
    rec: TaskRecord
    id: int
    pool: str
    cls: int
    key: str | None
    eligible_at: float
    deadline: float | None
    timeout: float | None
    policy: RetryPolicy
    status: str = "blocked"
    attempt: int = 0
    events: list[Ev] = field(default_factory=list)
    finished_seen: int = 0
    finished_at: float | None = None
    forgotten: bool = False
    retry_lo: float = 0.0
    retry_hi: float = 0.0
    running: MAtt | None = None
    attempts_started: list[int] = field(default_factory=list)


class Sim:
    """Engine + virtual clock + model; every method is one driver step followed by checks."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        start: float,
        seed: int,
        *,
        retention: float = 3600.0,
        retention_max: int = 100_000,
        auto_dispatch: bool = False,
    ) -> None:
        self.now = start
        self.cfg = {p.name: p for p in pools}
        self.pool_names = [p.name for p in pools]
        self.capacity = {p.name: p.capacity for p in pools}
        self.retention = retention
        self.retention_max = retention_max
        self.auto_dispatch = auto_dispatch
        self.engine = Engine(
            list(pools),
            start,
            rng=random.Random(seed),
            event_level=EVENTS_ALL,
            retention=retention,
            retention_max=retention_max,
        )
        self.tasks: dict[int, MTask] = {}
        self.by_key: dict[str, int] = {}
        self.retained: deque[int] = deque()
        self.running: dict[int, MAtt] = {}  # lease -> attempt
        self.ended: list[Attempt] = []
        self.log: list[Ev] = []
        self.totals: dict[str, int] = dict.fromkeys(TOTALS_KEYS, 0)
        self.known = 0  # tasks the engine still knows (live or retained)
        self.next_id = 1
        self.last_lease = 0
        self.steps = 0

    # --- helpers ---------------------------------------------------------------------------

    def policy_for(self, rec: TaskRecord) -> RetryPolicy:
        return rec.retry or self.cfg[rec.pool].retry or DEFAULT_RETRY

    def running_list(self) -> list[MAtt]:
        return [self.running[k] for k in sorted(self.running)]

    def busy(self, pool: str) -> int:
        return sum(1 for ma in self.running.values() if ma.task.pool == pool)

    def ready_in(self, pool: str) -> list[MTask]:
        return [t for t in self.tasks.values() if t.pool == pool and t.status == "ready"]

    def _take(self) -> Actions:
        self.steps += 1
        return self.engine.take()

    def _expect_nothing(self, out: Actions, what: str) -> None:
        assert not out.starts, f"{what}: unexpected starts {out.starts}"
        assert not out.aborts, f"{what}: unexpected aborts {out.aborts}"
        assert not out.finished, f"{what}: unexpected finished {out.finished}"
        assert not out.events, f"{what}: unexpected events {out.events}"

    def _record(self, ev: Ev) -> MTask:
        """Apply one event to the model after checking it is a legal next event of its task."""
        tid, status, attempt, at, message = ev
        assert at == self.now, f"event {ev} not stamped with now={self.now}"
        t = self.tasks[tid]
        assert not t.forgotten, f"event for forgotten task {ev}"
        if not t.events:
            assert status == "blocked" and attempt == 0 and message is None, ev
        else:
            prev = t.events[-1]
            assert STATUS_OF[status] in TRANSITIONS[STATUS_OF[prev[1]]], (
                f"illegal order {prev} -> {ev}"
            )
            if status == "running":
                assert attempt == prev[2] + 1, f"attempt not next: {prev} -> {ev}"
            else:
                assert attempt == prev[2], f"attempt changed: {prev} -> {ev}"
            if status == "retrying":
                assert prev[1] == "running" and message, f"bad retry: {prev} -> {ev}"
            if prev[1] == "retrying" and status == "ready":
                assert message is None, ev
        assert attempt <= t.policy.max_attempts, f"{ev} beyond max_attempts"
        t.events.append(ev)
        t.status = status
        t.attempt = attempt
        self.log.append(ev)
        if status == "retrying":
            self.totals["retries"] += 1
        if status in TERMINAL_NAMES:
            self.totals[status] += 1
            t.finished_at = at
            self.retained.append(tid)
            if len(self.retained) > self.retention_max:
                self._forget(self.retained.popleft())
        return t

    def _retained_until(self, tid: int) -> float:
        fa = self.tasks[tid].finished_at
        assert fa is not None
        return fa + self.retention

    def _forget(self, tid: int) -> None:
        t = self.tasks[tid]
        t.forgotten = True
        self.known -= 1
        if t.key is not None and self.by_key.get(t.key) == tid:
            del self.by_key[t.key]

    def _check_finished(self, out: Actions, expected_ids: list[int]) -> None:
        assert [r.id for r in out.finished] == expected_ids, (out.finished, expected_ids)
        for r in out.finished:
            t = self.tasks[r.id]
            assert r is t.rec
            assert r.status_name in TERMINAL_NAMES
            assert r.finished_at == self.now
            t.finished_seen += 1

    def _end_model_attempt(self, ma: MAtt) -> None:
        del self.running[ma.att.lease]
        ma.task.running = None
        self.ended.append(ma.att)

    def _set_retry_window(self, t: MTask, retry_after: float | None) -> None:
        pol = t.policy
        backoff = pol.backoff(t.attempt + 1)
        lo = 0.0 if (pol.jitter and backoff > 0.0) else backoff
        hi = backoff
        if retry_after is not None:
            lo = max(lo, retry_after)
            hi = max(hi, retry_after)
        t.retry_lo = self.now + lo
        t.retry_hi = self.now + hi

    def _expected_failure_status(self, t: MTask, permanent: bool) -> str:
        if permanent:
            return "failed"
        if t.attempt >= t.policy.max_attempts:
            return "dead_lettered"
        return "retrying"

    def _after(self) -> None:
        if self.auto_dispatch:
            self.dispatch()

    # --- driver steps ----------------------------------------------------------------------

    def submit(
        self,
        pool: str,
        cls: int,
        key: str | None = None,
        timeout: float | None = None,
        deadline_in: float | None = None,
        retry: RetryPolicy | None = None,
        duration_hint: float | None = None,
    ) -> TaskRecord:
        deadline = None if deadline_in is None else self.now + deadline_in
        rec = TaskRecord(
            {"n": self.steps},
            pool,
            cls,
            key=key,
            deadline=deadline,
            timeout=timeout,
            retry=retry,
            duration_hint=duration_hint,
        )
        got, dup = self.engine.submit(rec, self.now)
        out = self._take()
        if key is not None and key in self.by_key:
            old = self.tasks[self.by_key[key]]
            assert dup is True and got is old.rec, "live/retained key must deduplicate"
            self._expect_nothing(out, "duplicate submit")
            self._after()
            return got
        assert dup is False and got is rec
        assert rec.id == self.next_id, f"ids must be sequential: {rec.id} != {self.next_id}"
        self.next_id += 1
        self.totals["submitted"] += 1
        t = MTask(
            rec=rec,
            id=rec.id,
            pool=pool,
            cls=cls,
            key=key,
            eligible_at=self.now,
            deadline=deadline,
            timeout=timeout,
            policy=self.policy_for(rec),
        )
        self.tasks[rec.id] = t
        self.known += 1
        if key is not None:
            self.by_key[key] = rec.id
        want = [(rec.id, "blocked", 0, self.now, None), (rec.id, "ready", 0, self.now, None)]
        got_evs = [ev_tuple(e) for e in out.events]
        assert got_evs == want, got_evs
        assert not out.starts and not out.aborts and not out.finished
        for ev in got_evs:
            self._record(ev)
        self._after()
        return rec

    def dispatch(self) -> None:
        now = self.now
        busy_before = {p: self.busy(p) for p in self.pool_names}
        remaining = {p: self.ready_in(p) for p in self.pool_names}
        self.engine.dispatch(now)
        out = self._take()
        assert not out.aborts and not out.finished
        want_evs = [(a.task.id, "running", a.number, now, None) for a in out.starts]
        assert [ev_tuple(e) for e in out.events] == want_evs
        n_started = dict.fromkeys(self.pool_names, 0)
        for att in out.starts:
            t = self.tasks[att.task.id]
            assert att.task is t.rec
            assert t.status == "ready", f"started task {t.id} was {t.status}"
            assert att.number == t.attempt + 1
            assert att.lease > self.last_lease, "leases must increase"
            self.last_lease = att.lease
            assert att.started_at == now and not att.ended
            assert att.number not in t.attempts_started
            t.attempts_started.append(att.number)
            self._check_order(t, remaining[t.pool], now)
            remaining[t.pool].remove(t)
            n_started[t.pool] += 1
            self._record((t.id, "running", att.number, now, None))
            ttl = self.cfg[t.pool].lease_ttl
            ma = MAtt(
                att=att,
                task=t,
                started=now,
                timeout_due=None if t.timeout is None else now + t.timeout,
                lease_expiry=None if ttl is None else now + ttl,
            )
            t.running = ma
            self.running[att.lease] = ma
            self.totals["dispatched"] += 1
        for p in self.pool_names:
            free = max(0, self.capacity[p] - busy_before[p])
            n_ready = n_started[p] + len(remaining[p])
            assert n_started[p] == min(free, n_ready), (
                f"pool {p}: started {n_started[p]} with {free} free and {n_ready} ready"
            )
            if n_started[p]:
                assert self.engine.pools[p].busy <= self.capacity[p]

    def _check_order(self, s: MTask, queued: list[MTask], now: float) -> None:
        """The started task must be explainable by the scoring rule (no-deadline cases)."""
        if s.deadline is not None:
            return
        s_score = score(s.cls, s.eligible_at, now)
        for o in queued:
            if o is s or o.deadline is not None:
                continue
            if o.cls < s.cls:
                o_score = score(o.cls, o.eligible_at, now)
                assert s_score >= o_score, (
                    f"started task {s.id} (class {s.cls}, score {s_score}) before task "
                    f"{o.id} (class {o.cls}, score {o_score}) at {now}"
                )
            elif o.cls == s.cls:
                # Same class, no deadline on the started one: it must be the FIFO head.
                assert (s.eligible_at, s.id) <= (o.eligible_at, o.id), (
                    f"task {s.id} started before older same-class task {o.id}"
                )

    def complete(self, ma: MAtt, output: Any) -> None:
        t = ma.task
        ok = self.engine.complete(ma.att, self.now, output)
        out = self._take()
        assert ok is True
        assert ma.att.ended and ma.att.abort_reason is None
        assert not out.starts and not out.aborts
        assert [ev_tuple(e) for e in out.events] == [(t.id, "succeeded", t.attempt, self.now, None)]
        self._end_model_attempt(ma)
        self._record((t.id, "succeeded", t.attempt, self.now, None))
        self._check_finished(out, [t.id])
        assert t.rec.output is output
        self._after()

    def fail(self, ma: MAtt, message: str, *, permanent: bool, retry_after: float | None) -> None:
        t = ma.task
        want = self._expected_failure_status(t, permanent)
        ok = self.engine.fail(
            ma.att, self.now, message, permanent=permanent, retry_after=retry_after
        )
        out = self._take()
        assert ok is True
        assert ma.att.ended and ma.att.abort_reason is None
        assert not out.starts and not out.aborts
        ev = (t.id, want, t.attempt, self.now, message)
        assert [ev_tuple(e) for e in out.events] == [ev]
        self._end_model_attempt(ma)
        self._record(ev)
        if want == "retrying":
            self._set_retry_window(t, retry_after)
            self._check_finished(out, [])
        else:
            self._check_finished(out, [t.id])
        self._after()

    def heartbeat(self, ma: MAtt) -> None:
        ok = self.engine.heartbeat(ma.att, self.now)
        out = self._take()
        assert ok is True
        self._expect_nothing(out, "heartbeat")
        ttl = self.cfg[ma.task.pool].lease_ttl
        if ttl is not None:
            ma.lease_expiry = self.now + ttl

    def _fingerprint(self) -> tuple[Any, ...]:
        eng = self.engine
        totals = {k: v for k, v in eng.totals.items() if k != "stale_completions"}
        return (
            sorted((r.id, r.status, r.attempt) for r in eng.tasks.values()),
            sorted(eng.running),
            [
                (p.busy, p.capacity, list(p.pending_by_class), p.queues.n)
                for p in eng.pools.values()
            ],
            eng.live,
            totals,
            eng.next_wake(),
        )

    def stale(self, att: Attempt, kind: str) -> None:
        assert att.ended
        before = self._fingerprint()
        if kind == "complete":
            ok = self.engine.complete(att, self.now, "late")
            self.totals["stale_completions"] += 1
        elif kind == "fail":
            ok = self.engine.fail(att, self.now, "late failure")
            self.totals["stale_completions"] += 1
        elif kind == "permanent":
            ok = self.engine.fail(att, self.now, "late failure", permanent=True)
            self.totals["stale_completions"] += 1
        else:
            ok = self.engine.heartbeat(att, self.now)
        out = self._take()
        assert ok is False, f"stale {kind} on an ended attempt must return False"
        self._expect_nothing(out, f"stale {kind}")
        assert self._fingerprint() == before, f"stale {kind} changed the engine state"
        assert self.engine.totals["stale_completions"] == self.totals["stale_completions"]

    def cancel(self, ref: int | str) -> None:
        if isinstance(ref, str):
            tid = self.by_key.get(ref)
            t = None if tid is None else self.tasks[tid]
        else:
            t = self.tasks.get(ref)
            if t is not None and t.forgotten:
                t = None
        live = t is not None and t.status not in TERMINAL_NAMES
        ok = self.engine.cancel(ref, self.now)
        out = self._take()
        assert ok is live, f"cancel({ref!r}) returned {ok}, model says live={live}"
        if not live:
            self._expect_nothing(out, "cancel of a non-live task")
            self._after()
            return
        assert t is not None
        assert not out.starts
        ma = t.running
        if ma is not None:
            assert out.aborts == [ma.att]
            assert ma.att.ended and ma.att.abort_reason == ABORT_CANCELLED
            self._end_model_attempt(ma)
        else:
            assert not out.aborts
        ev = (t.id, "cancelled", t.attempt, self.now, MSG_CANCELLED)
        assert [ev_tuple(e) for e in out.events] == [ev]
        self._record(ev)
        self._check_finished(out, [t.id])
        self._after()

    def set_capacity(self, pool: str, n: int) -> None:
        self.engine.set_capacity(pool, n, self.now)
        out = self._take()
        self._expect_nothing(out, "set_capacity")
        self.capacity[pool] = n
        self._after()

    def advance(self, dt: float, *, stepwise: bool) -> None:
        """Move the clock; stepwise calls advance() at every wake time on the way."""
        target = self.now + dt
        if stepwise:
            while True:
                w = self.engine.next_wake()
                if w is None or w > target:
                    break
                assert w >= self.now, f"next_wake {w} is before the last advance {self.now}"
                self._advance_to(w, exact=True)
        self._advance_to(target, exact=stepwise)
        self._after()

    def _advance_to(self, t: float, *, exact: bool) -> None:
        self.now = t
        self.engine.advance(t)
        out = self._take()
        assert not out.starts, "advance() must not dispatch"
        aborts = {a.lease: a for a in out.aborts}
        assert len(aborts) == len(out.aborts), "an attempt aborted twice"
        matched: set[int] = set()
        terminal: list[int] = []
        for e in out.events:
            ev = ev_tuple(e)
            task = self.tasks[e.id]
            if e.status == "ready":
                assert task.status == "retrying", f"{ev} but task was {task.status}"
                assert t >= task.retry_lo, f"retry fired early: {ev}, earliest {task.retry_lo}"
                if exact:
                    assert t <= task.retry_hi, f"retry fired late: {ev}, latest {task.retry_hi}"
                self._record(ev)
                continue
            assert e.status in ("retrying", "dead_lettered"), f"unexpected event in advance {ev}"
            ma = task.running
            assert ma is not None, f"{ev} for a task that is not running"
            att = aborts.get(ma.att.lease)
            assert att is ma.att, f"{ev} without an abort of its attempt"
            assert att.ended and att.abort_reason == e.message
            if e.message == ABORT_TIMEOUT:
                due = ma.timeout_due
                self.totals["timeouts"] += 1
            else:
                assert e.message == ABORT_LEASE, ev
                due = ma.lease_expiry
                self.totals["lease_expiries"] += 1
            assert due is not None and due <= t, f"{ev} fired before it was due ({due})"
            if exact:
                assert due == t, f"{ev} fired late, due {due}"
            assert e.status == self._expected_failure_status(task, False), ev
            matched.add(att.lease)
            self._end_model_attempt(ma)
            self._record(ev)
            if e.status == "retrying":
                self._set_retry_window(task, None)
            else:
                terminal.append(task.id)
        assert matched == set(aborts), f"unexplained aborts {set(aborts) - matched}"
        self._check_finished(out, terminal)
        # Retention: a finished task is forgotten by the first advance() at or after
        # finished_at + retention, the time next_wake() announces for it.
        while self.retained and self._retained_until(self.retained[0]) <= t:
            self._forget(self.retained.popleft())
        assert len(self.engine.tasks) == self.known, "engine and model disagree on retention"
        # nothing may be overdue, and the next wake must be in the future
        for ma in self.running.values():
            assert ma.timeout_due is None or ma.timeout_due > t, f"timeout overdue: {ma.att}"
            assert ma.lease_expiry is None or ma.lease_expiry > t, f"lease overdue: {ma.att}"
        for task in self.tasks.values():
            if task.status == "retrying":
                assert task.retry_hi > t, f"retry of task {task.id} overdue at {t}"
        w = self.engine.next_wake()
        assert w is None or w > t, (
            f"after advance({t!r}) next_wake() is {w!r}: a driver calling back at "
            "next_wake() would spin without progress"
        )

    # --- whole-state invariants ------------------------------------------------------------

    def earliest_due(self) -> float | None:
        dues: list[float] = []
        for ma in self.running.values():
            if ma.timeout_due is not None:
                dues.append(ma.timeout_due)
            if ma.lease_expiry is not None:
                dues.append(ma.lease_expiry)
        for task in self.tasks.values():
            if task.status == "retrying":
                dues.append(task.retry_hi)
        if self.retained:
            dues.append(self._retained_until(self.retained[0]))
        return min(dues) if dues else None

    def check_all(self) -> None:
        eng = self.engine
        known = {tid for tid, t in self.tasks.items() if not t.forgotten}
        assert set(eng.tasks) == known, "engine and model disagree on known tasks"
        live = 0
        pending = {p: [0, 0, 0, 0] for p in self.pool_names}
        for tid, t in self.tasks.items():
            if not t.forgotten:
                rec = eng.tasks[tid]
                assert rec is t.rec
                assert rec.status_name == t.status, f"task {tid}: {rec.status_name} != {t.status}"
                assert rec.attempt == t.attempt
                assert eng.lookup(tid) is rec
            else:
                assert eng.lookup(tid) is None
            assert t.attempt <= t.policy.max_attempts
            assert t.attempts_started == list(range(1, len(t.attempts_started) + 1))
            if t.status in TERMINAL_NAMES:
                assert t.finished_seen == 1, f"task {tid} finished {t.finished_seen} times"
                assert t.events[-1][1] == t.status
                assert t.running is None
            else:
                live += 1
                assert t.finished_seen == 0
                assert t.events and t.events[-1][1] == t.status
                assert (t.running is not None) == (t.status == "running")
            if t.status in PENDING:
                pending[t.pool][t.cls] += 1
        assert eng.live == live
        assert {k: rec.id for k, rec in eng.keys.items()} == self.by_key
        assert set(eng.running) == set(self.running)
        for lease, ma in self.running.items():
            assert eng.running[lease] is ma.att and not ma.att.ended
            assert ma.task.rec.running is ma.att
        for p in self.pool_names:
            n = self.busy(p)
            assert eng.pools[p].busy == n, f"pool {p}: busy {eng.pools[p].busy} != {n}"
            assert eng.pools[p].capacity == self.capacity[p]
        for att in self.ended:
            assert att.ended
        snap = eng.snapshot(self.now)
        assert snap.live_tasks == live
        assert snap.running == len(self.running)
        for p in self.pool_names:
            ps = snap.pool(p)
            assert ps is not None
            assert ps.pending_by_class == pending[p], (p, ps.pending_by_class, pending[p])
            assert ps.busy == eng.pools[p].busy
            assert ps.ready == len(self.ready_in(p))
            assert 0.0 <= ps.utilization <= 1.0
        assert snap.pending == sum(sum(v) for v in pending.values())
        assert snap.totals == self.totals, (snap.totals, self.totals)
        due = self.earliest_due()
        if due is not None:
            w = eng.next_wake()
            assert w is not None and w <= due, f"next_wake {w} later than a due timer {due}"


# --- hypothesis state machine ----------------------------------------------------------------

policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 4),
    initial_backoff=st.sampled_from([0.0, 0.25, 1.0, 2.0]),
    multiplier=st.sampled_from([1.0, 2.0, 3.0]),
    max_backoff=st.sampled_from([0.0, 0.5, 1.5, 5.0]),
    jitter=st.booleans(),
)


task_specs = st.fixed_dictionaries(
    {
        "pool": st.integers(0, 1),
        "cls": st.sampled_from([0, 1, 2, 2, 3, 3]),
        "key": st.one_of(st.none(), st.sampled_from(KEYS)),
        "timeout": st.sampled_from([None, None, 0.0, 0.5, 1.0, 3.0]),
        "deadline_in": st.sampled_from([*[None] * 8, -5.0, 0.0, 1.0, 3.0, 10.0, 100.0]),
        "retry": st.one_of(st.none(), policies),
        "duration_hint": st.sampled_from([None, None, 0.5, 2.0]),
    }
)


@st.composite
def pool_configs(draw: st.DrawFn) -> list[PoolConfig]:
    n = draw(st.integers(1, 2))
    return [
        PoolConfig(
            name=f"p{i}",
            capacity=draw(st.integers(1, 3)),
            lease_ttl=draw(st.sampled_from([None, None, 0.5, 2.0, 5.0])),
            retry=draw(st.one_of(st.just(DEFAULT_RETRY), policies)),
            default_duration=draw(st.sampled_from([0.5, 1.0, 4.0])),
        )
        for i in range(n)
    ]


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim: Sim | None = None

    @property
    def s(self) -> Sim:
        assert self.sim is not None
        return self.sim

    def has_running(self) -> bool:
        return self.sim is not None and bool(self.sim.running)

    def has_ended(self) -> bool:
        return self.sim is not None and bool(self.sim.ended)

    @initialize(
        pools=pool_configs(),
        seed=st.integers(0, 2**32 - 1),
        start=st.sampled_from([0.0, 1000.0, 1_700_000_000.123]),
        retention=st.sampled_from([3600.0, 30.0, 2.5]),
        retention_max=st.sampled_from([100_000, 100_000, 3, 0]),
        auto_dispatch=st.booleans(),
    )
    def setup(
        self,
        pools: list[PoolConfig],
        seed: int,
        start: float,
        retention: float,
        retention_max: int,
        auto_dispatch: bool,
    ) -> None:
        self.sim = Sim(
            pools,
            start,
            seed,
            retention=retention,
            retention_max=retention_max,
            auto_dispatch=auto_dispatch,
        )

    @rule(specs=st.lists(task_specs, min_size=1, max_size=4))
    def submit(self, specs: list[dict[str, Any]]) -> None:
        s = self.s
        for spec in specs:
            s.submit(pool=s.pool_names[spec.pop("pool") % len(s.pool_names)], **spec)

    @rule()
    def dispatch(self) -> None:
        self.s.dispatch()

    @precondition(has_running)
    @rule(pick=st.integers(0, 1000))
    def complete(self, pick: int) -> None:
        atts = self.s.running_list()
        self.s.complete(atts[pick % len(atts)], object())

    @precondition(has_running)
    @rule(
        pick=st.integers(0, 1000),
        permanent=st.booleans(),
        retry_after=st.sampled_from([None, None, 0.0, 0.3, 2.0, 10.0]),
    )
    def fail(self, pick: int, permanent: bool, retry_after: float | None) -> None:
        atts = self.s.running_list()
        self.s.fail(atts[pick % len(atts)], "boom", permanent=permanent, retry_after=retry_after)

    @precondition(has_running)
    @rule(pick=st.integers(0, 1000))
    def heartbeat(self, pick: int) -> None:
        atts = self.s.running_list()
        self.s.heartbeat(atts[pick % len(atts)])

    @precondition(has_ended)
    @rule(
        pick=st.integers(0, 1000),
        kind=st.sampled_from(["complete", "fail", "permanent", "heartbeat"]),
    )
    def stale_outcome(self, pick: int, kind: str) -> None:
        ended = self.s.ended
        self.s.stale(ended[-1 - pick % len(ended)], kind)

    @rule(pick=st.integers(0, 1000), by_key=st.booleans())
    def cancel(self, pick: int, by_key: bool) -> None:
        s = self.s
        ref: int | str
        if by_key:
            ref = (*KEYS, "never-used")[pick % (len(KEYS) + 1)]
        else:
            ids = [*sorted(s.tasks), UNKNOWN_ID]
            ref = ids[-1 - pick % len(ids)]
        s.cancel(ref)

    @rule(pool=st.integers(0, 1), n=st.sampled_from([0, 0, 1, 2, 3, 5, 50]))
    def set_capacity(self, pool: int, n: int) -> None:
        s = self.s
        s.set_capacity(s.pool_names[pool % len(s.pool_names)], n)

    @rule(
        dt=st.sampled_from(
            [0.0, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 30.0, 60.0, 100.0, 4000.0]
        ),
        stepwise=st.booleans(),
    )
    def advance(self, dt: float, stepwise: bool) -> None:
        self.s.advance(dt, stepwise=stepwise)

    @invariant()
    def engine_matches_model(self) -> None:
        if self.sim is not None:
            self.sim.check_all()


EngineMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineMachine = EngineMachine.TestCase


# --- plain deterministic workloads -----------------------------------------------------------


UNIX_START = 1_700_000_000.5


def workload_pools() -> list[PoolConfig]:
    return [
        PoolConfig(
            "p0",
            capacity=2,
            lease_ttl=2.0,
            retry=RetryPolicy(max_attempts=3, initial_backoff=0.5, max_backoff=4.0),
        ),
        PoolConfig("p1", capacity=3, retry=RetryPolicy(max_attempts=2, jitter=False)),
    ]


def run_workload(
    seed: int,
    ops: int,
    *,
    stepwise: float,
    start: float = UNIX_START,
    retention: float = 20.0,
    check_every: int = 200,
) -> Sim:
    """A fixed random workload of `ops` driver steps; `stepwise` is the share of clock
    advances that call advance() at every wake time (the rest jump to the final time)."""
    r = random.Random(seed)
    sim = Sim(
        workload_pools(),
        start,
        seed,
        retention=retention,
        retention_max=300,
        auto_dispatch=False,
    )
    for i in range(ops):
        x = r.random()
        if x < 0.30:
            retry = None
            if r.random() < 0.3:
                retry = RetryPolicy(
                    max_attempts=r.randint(1, 4),
                    initial_backoff=r.choice([0.0, 0.2, 1.0]),
                    multiplier=r.choice([1.0, 2.0]),
                    max_backoff=r.choice([0.5, 3.0]),
                    jitter=r.random() < 0.5,
                )
            sim.submit(
                r.choice(sim.pool_names),
                r.randrange(4),
                key=r.choice([None, None, None, *(f"w{j}" for j in range(8))]),
                timeout=r.choice([None, None, None, 0.5, 2.0]),
                deadline_in=r.choice([None, None, None, 0.5, 3.0, 20.0]),
                retry=retry,
            )
        elif x < 0.45:
            sim.dispatch()
        elif x < 0.60 and sim.running:
            atts = sim.running_list()
            sim.complete(r.choice(atts), i)
        elif x < 0.70 and sim.running:
            atts = sim.running_list()
            sim.fail(
                r.choice(atts),
                f"error {i}",
                permanent=r.random() < 0.15,
                retry_after=r.choice([None, None, 0.0, 1.5]),
            )
        elif x < 0.75 and sim.running:
            sim.heartbeat(r.choice(sim.running_list()))
        elif x < 0.78 and sim.ended:
            sim.stale(r.choice(sim.ended), r.choice(["complete", "fail", "heartbeat"]))
        elif x < 0.82 and sim.tasks:
            if r.random() < 0.5:
                sim.cancel(r.choice(list(sim.tasks)))
            else:
                sim.cancel(f"w{r.randrange(9)}")
        elif x < 0.84:
            sim.set_capacity(r.choice(sim.pool_names), r.choice([0, 1, 2, 3, 4, 12]))
        else:
            dt = r.choice([0.0, 0.05, 0.3, 1.0, 2.5, 8.0, 40.0])
            sim.advance(dt, stepwise=r.random() < stepwise)
        if i % check_every == 0:
            sim.check_all()
    sim.check_all()
    return sim


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_workload_jumping_clock(seed: int) -> None:
    """Advance only at the final time of each clock move."""
    sim = run_workload(seed, 10_000, stepwise=0.0)
    assert sim.totals["submitted"] > 500
    assert sim.totals["succeeded"] > 100 and sim.totals["retries"] > 50


@pytest.mark.parametrize(
    ("seed", "start", "retention"),
    [
        pytest.param(11, UNIX_START, 20.0, id="unix-clock"),
        pytest.param(12, UNIX_START, 3600.0, id="unix-clock-default-retention"),
        pytest.param(13, 0.0, 3600.0, id="monotonic-clock-default-retention"),
    ],
)
def test_long_workload_stepwise_clock(seed: int, start: float, retention: float) -> None:
    """Advance at every wake time on the way, like a driver sleeping until next_wake()."""
    sim = run_workload(seed, 10_000, stepwise=1.0, start=start, retention=retention)
    assert sim.totals["timeouts"] + sim.totals["lease_expiries"] > 0


def test_long_workload_is_reproducible() -> None:
    """Same seed (workload and engine rng), same event sequence; another seed differs."""
    a = run_workload(7, 8000, stepwise=0.5, check_every=1000)
    b = run_workload(7, 8000, stepwise=0.5, check_every=1000)
    assert len(a.log) > 5000
    assert a.log == b.log
    assert a.engine.totals == b.engine.totals
    c = run_workload(8, 8000, stepwise=0.5, check_every=1000)
    assert c.log != a.log


def test_next_wake_after_advance_is_in_the_future() -> None:
    """Regression (found by this simulation): a wake-up at next_wake() must prune.

    A task finished at `f` is due for pruning at `next_wake() == f + retention`. advance() used
    to prune with `finished_at <= now - retention`, and `(f + R) - R < f` in floating point for
    many `f` (here 0.1 + 3600 - 3600 == 0.09999999999990905): the task stayed, next_wake()
    returned the same time again, and a driver sleeping until next_wake() spun without
    progress.
    """
    eng = Engine([PoolConfig("p", capacity=1)], 0.0, retention=3600.0)
    rec, _ = eng.submit(TaskRecord(None, "p"), 0.0)
    eng.advance(0.1)
    eng.dispatch(0.1)
    (att,) = eng.take().starts
    eng.complete(att, 0.1)
    eng.take()
    wake = eng.next_wake()
    assert wake == 0.1 + 3600.0
    eng.advance(wake)
    after = eng.next_wake()
    assert after is None or after > wake, f"next_wake() stuck at {after!r}"
    assert eng.lookup(rec.id) is None
