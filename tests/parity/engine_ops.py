"""The differential suite's operation vocabulary for the engine: hypothesis strategies that
draw a configuration and a sequence of driver calls, the Python adapter that runs them on
`cronoq.core.engine.Engine`, and the comparison with the Rust engine's run of the same list
(`cronoq_core_py.run_engine`, tests/parity/rust/src/engine.rs).

An operation is a plain tuple `(kind, now, *args)`; times are absolute, computed once here, so
both engines see the same floats. Both sides return one trace entry per operation: the call's
return value (or the SubmitError's code and message), the Actions drained after it (starts,
aborts, finished records, events, field by field), next_wake, the live count, the totals, each
pool's counters, the journal taken after it and the parking state (each resource's level,
its parked tasks, each pool's worker groups and the tasks waiting for them, the pending
re-offer). Attempts are picked by index among the running ones (in start order) or, for stale
outcomes, among every lease issued so far.

Hypothesis draws the configuration, each sequence's mix of operation kinds, its length and a
seed; the operations themselves are expanded from that seed (`_Ops`), which keeps a sequence
cheap to draw. What is drawn: 1 to 3 pools (capacity 0-4, lease ttl, retry policy, default
duration, max_pending with an overflow policy, price per slot-second, min/max and autoscaler
settings, fair share with tenant weights, unknown dependencies rejected or awaited with an
await timeout, the reservable fraction), the scoring, the event level, retention, whether the
engine is elastic (the autoscalers set the capacity), resources (semaphores and token buckets),
and operations: submit with random options (class, kind, key, deadline, duration hint, timeout,
retry policy, tenant, a fixed start in the past, now, near or far, with a tolerance and an
on_miss, dependency edges on recent ids and on keys, some never submitted, with every
condition; a fixed start may have dependencies too; resource amounts, unknown, zero and over
capacity ones included; labels), submit_batch (keys may repeat: the batch error; fixed starts
reserve against each other; edges may name batch-mates' keys, forward, backward, in cycles or
their own), dispatch, complete, fail (permanent, with retry_after), heartbeat, stale outcomes,
cancel by id or key, lookup, dependents, set_capacity, set_group_capacity, move_attempt (to
another group or the unlabeled slots), group_has_room, resolve_resources, pause/resume, delete,
snapshot (the quality metrics and the resources' levels), recurring schedules added, replaced,
resumed and removed (cron expressions and intervals in a few zones, every overlap mode,
templates with resources and labels), advance by steps drawn to cross timers and tolerances
(bucket refills among them), halt and abort_running, and restart: a failover, where every
task's row as a store keeps it (running attempts lost) is read back by a fresh engine whose
configuration may have lost a pool or a resource, with some rows broken, the pauses and the
schedules taken back (the rows are the operation's result, so both engines are seen restoring
from the same ones), and ready_view. Half the engines have an observer, whose calls (each
attempt's start with its wait, its end with its outcome and runtime) are part of every
operation's trace. Under "park" the first resource is a slow token bucket, amounts of 2 and 3
are common, half the steps of time go to its refill edges (fractions and multiples of its time
per token, a float step off), and in some sequences every resource task wants only that bucket.
Each operation's trace also holds the fixed-start state of every pool (reservations, holds, due
tasks, misses), the schedules (next occurrence, latest, the one queued, live occurrences) and
the parking state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from cronoq._options import Resource, _amounts, _labels
from cronoq.core.autoscale import AutoscaleSettings
from cronoq.core.cron import parse_cron, zone
from cronoq.core.engine import Engine
from cronoq.core.groups import Groups
from cronoq.core.model import (
    DEFAULT_RETRY,
    FIRST_TERMINAL,
    RETRYING,
    STATUS_NAMES,
    TOTALS_KEYS,
    Attempt,
    Extras,
    PastAttempt,
    PoolConfig,
    ReadyView,
    RetryPolicy,
    Scoring,
    Snapshot,
    TaskRecord,
)
from cronoq.core.recurring import RECURRING_TAG, Recurring
from cronoq.core.resources import ResourceConfig
from cronoq.errors import SubmitError

Op = tuple[Any, ...]
Config = tuple[Any, ...]
Trace = list[tuple[Any, ...]]

FIELDS = (
    "result",
    "starts",
    "aborts",
    "finished",
    "events",
    "next_wake",
    "live",
    "totals",
    "pools",
    "journal",
    "recurring",
    "parking",
    "observed",
)
KEYS = ("k0", "k1", "k2", "k3", "k4")
DEP_KEYS = (*KEYS, "k5")  # dependencies also name a key no task takes (awaited or unknown)
CONDITIONS = ("success", "complete", "failure")
KINDS = ("a", "b")
TENANTS = ("t0", "t1", "t2")
RESOURCES = ("r0", "r1", "r2", "r3")  # configs name at most three: r3 is always unknown
# Label sets of worker groups and of tasks (a task is served by a group carrying all its
# labels; os=x by none, the empty set of a group by unlabeled tasks only).
GROUP_LABELS = (
    [("zone", "a")],
    [("zone", "b")],
    [("gpu", "1"), ("zone", "a")],
    [("gpu", "1")],
    [],
)
TASK_LABELS = (
    [("zone", "a")],
    [("zone", "b")],
    [("gpu", "1")],
    [("zone", "a"), ("gpu", "1")],
    [("os", "x")],
    [],
)
MAX_ID = 40  # cancel, lookup and delete name ids up to this (some never exist)

# Operation kinds, with the range of their weights: each sequence draws its own mix, so some
# are submit-heavy, others fail-, cancel- or timer-heavy.
OP_WEIGHTS = {
    "submit": (2, 10),
    "batch": (0, 3),
    "dispatch": (1, 8),
    "advance": (1, 8),
    "complete": (0, 6),
    "fail": (0, 5),
    "heartbeat": (0, 3),
    "cancel": (0, 3),
    "lookup": (0, 2),
    "dependents": (0, 2),
    "set_capacity": (0, 2),
    "set_group": (0, 3),
    "move": (0, 2),
    "group_room": (0, 1),
    "resolve": (0, 1),
    "pause": (0, 1),
    "resume": (0, 2),
    "delete": (0, 2),
    "snapshot": (0, 2),
    "add_recurring": (0, 2),
    "remove_recurring": (0, 1),
    "resume_recurring": (0, 1),
    "restart": (0, 1),
    "ready_view": (0, 2),
}
# Shutdown ends what a sequence can show: about one sequence in five has one of these.
RARE_KINDS = ("halt", "abort_running")

# Steps of time: round ones that land on timers (backoffs of 0.1-60 s, ttls, retention) and
# arbitrary ones that exercise the float arithmetic.
ROUND_STEPS = (0.001, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 4000.0)
SHORT_STEPS = (0.001, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0)
# Steps to a token bucket's refill edge ("park"): in tokens' worth of time, and offsets of it.
EDGE_TOKENS = (0.25, 0.5, 0.6, 0.75, 0.9, 1.0, 1.5, 2.0)
EDGE_OFFSETS = (0.0, 0.0, 1e-9, -1e-9, 1e-12, -0.01)

# Fixed starts, relative to the submit: past (beyond a tolerance or inside it), now, near, far.
START_OFFSETS = (-60.0, -5.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 30.0, 600.0)
TOLERANCES = (0.0, 0.5, 1.0, 5.0, 30.0)
ON_MISS = ("run_late", "skip", "fail")
# Recurring schedules: names (re-adding one replaces it), template keys (two schedules with
# one key share occurrences), expressions (intervals of seconds to hours, minutes the zone's
# offset moves) and zones (offsets of quarter and half hours, DST).
SCHEDULES = ("r0", "r1", "r2")
SCHEDULE_KEYS = ("s0", "s1")
OVERLAPS = ("skip", "allow", "queue", "queue_on_success")
FAST_CRONS = 3  # the first ones: several occurrences in a sequence's minutes
CRONS = (
    "*/5 * * * * *",
    "*/2 * * * * *",
    "7,37 * * * * *",
    "0 * * * * *",
    "*/3 * * * *",
    "30 * * * *",
    "@hourly",
    "15 */2 * * * *",
)
ZONES = (None, "UTC", "Asia/Kathmandu", "America/St_Johns", "Europe/Berlin", "Pacific/Chatham")


def _retry() -> st.SearchStrategy[tuple[int, float, float, float, bool]]:
    return st.tuples(
        st.integers(1, 4),
        st.sampled_from((0.0, 0.1, 1.0, 2.5)),
        st.sampled_from((1.0, 1.5, 2.0, 3.0)),
        st.sampled_from((0.0, 0.5, 5.0, 60.0)),
        st.booleans(),
    )


def _scoring() -> st.SearchStrategy[tuple[Any, ...]]:
    default = Scoring()
    plain = (
        default.base,
        default.aging_rate,
        default.age_cap,
        default.window,
        default.urgency_max,
        default.overdue_rate,
        default.overdue_cap,
        None,
        None,
    )
    f = st.floats
    # Per-class aging (Scoring.aging_rates / age_caps), either or both: fast aging with high
    # caps lets a lower class overtake a higher one, at a rate the higher one may lack.
    per_class = st.tuples(
        st.one_of(st.none(), st.tuples(*(st.sampled_from((0.0, 2.0, 50.0, 1000.0)),) * 4)),
        st.one_of(st.none(), st.tuples(*(st.sampled_from((0.0, 800.0, 5000.0, 20000.0)),) * 4)),
    )
    drawn = st.tuples(
        st.tuples(*(f(0.0, 20000.0) for _ in range(4))),
        f(0.0, 10.0),
        f(0.0, 2000.0),
        f(0.1, 20.0),
        f(0.0, 10000.0),
        f(0.0, 50.0),
        f(0.0, 5000.0),
        st.none(),
        st.none(),
    )
    return st.one_of(
        st.just(plain),
        drawn,
        per_class.map(lambda ages: (*plain[:7], *ages)),
        st.tuples(drawn, per_class).map(lambda t: (*t[0][:7], *t[1])),
    )


def _autoscale(rnd: random.Random) -> tuple[Any, ...]:
    """AutoscaleSettings field by field, in the dataclass's order (slo as (class, seconds)
    pairs). Intervals stay >= 1 s: an advance of 4000 s fires every evaluation on the way."""
    c = rnd.choice
    slo = [(rnd.randrange(4), c((0.0, 0.5, 5.0))) for _ in range(rnd.randint(0, 2))]
    return (
        c((1.0, 2.5, 10.0, 30.0)),
        c((0.5, 0.75, 1.0)),
        c((0.0, 2.0, 30.0)),
        slo,
        60.0,
        c((0.0, 3.0, 10.0, 60.0)),
        c((0.0, 2.5, 30.0)),
        rnd.randint(0, 4),
        rnd.randint(0, 2),
        c((0.5, 1.0)),
        c((0.5, 0.3)),
        0.0,
    )


def _extras(seed: int, focus: str | None) -> tuple[Any, ...]:
    """A pool's (min, max, autoscale, fair_share, tenant weights as (tenant, weight) pairs,
    unknown_dependency, await_timeout, reservable fraction, max_hold, metrics_window), expanded
    from one drawn seed:
    drawing each through hypothesis doubles a sequence's cost. `focus` ("autoscale", "fair")
    gives every pool that feature; "deps" makes every pool await unknown keys; "fixed" leaves
    room for more reservations."""
    rnd = random.Random(seed)
    lo = rnd.randint(0, 2)
    weights = [
        (rnd.choice(TENANTS), rnd.choice((0.5, 1.0, 2.0, 3.0)))
        for _ in range(rnd.randint(focus == "fair", 3))
    ]
    scaled = focus == "autoscale" or rnd.random() < 0.4
    fair = focus == "fair" or rnd.random() < 0.5
    hi = lo + rnd.randint(0, 6) + (4 if focus == "fixed" else 0)
    unknown = "await" if focus == "deps" or rnd.random() < 0.5 else "reject"
    timeout = rnd.choice((None, None, -1.0, 0.0, 0.5, 3.0, 30.0))
    fraction = rnd.choice((0.0, 0.25, 0.5, 1.0))
    # A held slot's lead is at most max_hold; metrics over windows of a second or a few.
    max_hold = rnd.choice((None, None, 0.0, 0.25, 1.0, 3.0))
    window = rnd.choice((60.0, 60.0, 0.5, 1.0, 2.5, 10.0))
    return (
        lo,
        hi,
        _autoscale(rnd) if scaled else None,
        fair,
        weights,
        unknown,
        timeout,
        fraction,
        max_hold,
        window,
    )


def _pool(i: int, focus: str | None) -> st.SearchStrategy[tuple[Any, ...]]:
    """(name, capacity, ttl, retry, duration, max_pending, overflow, cost, min, max,
    autoscale, fair_share, tenant weights, unknown_dependency, await_timeout, reservable
    fraction, max_hold, metrics_window): the last ten from `_extras`."""
    return st.tuples(
        st.just(f"p{i}"),
        st.integers(0, 4),
        st.one_of(st.none(), st.sampled_from((0.5, 1.0, 3.0, 10.0))),
        st.one_of(st.none(), _retry()),
        st.sampled_from((0.1, 1.0, 5.0)),
        st.one_of(st.none(), st.integers(0, 8)),
        st.sampled_from(("wait", "reject", "shed_lowest", "shed_oldest")),
        st.sampled_from((0.0, 0.25, 1.5)),
        st.integers(0, 2**32).map(lambda seed: _extras(seed, focus)),
    ).map(lambda t: (*t[:-1], *t[-1]))


def _resources(seed: int, focus: str | None) -> list[tuple[Any, ...]]:
    """(name, kind, permits, rate, burst) of up to three resources, expanded from one drawn
    seed: none in half the configurations, at least one with `focus` "park"."""
    rnd = random.Random(seed)
    if focus != "park" and rnd.random() < 0.5:
        return []
    names = list(RESOURCES[:3])
    rnd.shuffle(names)
    out = []
    for i, name in enumerate(names[: rnd.randint(1, 3)]):
        # "park": the first one a bucket (their refill edges are where the rules are subtle)
        if not (focus == "park" and i == 0) and rnd.random() < 0.5:
            out.append((name, "semaphore", rnd.randint(1, 4), None, None))
        else:
            rate = rnd.choice((0.1, 0.5, 1.0, 2.5)) if rnd.random() < 0.6 else rnd.uniform(0.05, 5)
            if focus == "park" and i == 0:  # slow: a level stays between tokens for a while
                rate = rnd.choice((0.1, 0.25, 0.5))
            burst = rnd.randint(2 if focus == "park" and i == 0 else 1, 4)
            out.append((name, "token_bucket", None, rate, burst))
    return out


@st.composite
def configs(draw: st.DrawFn, focus: str | None = None) -> Config:
    """(seed, scoring, event level, retention, retention_max, pools, elastic, resources,
    observed: the engine has an observer)."""
    n = draw(st.integers(1, 2 if focus == "fair" else 3))
    return (
        draw(st.integers(0, 2**40)),
        draw(_scoring()),
        draw(st.integers(0, 2)),
        draw(st.sampled_from((0.0, 0.5, 5.0, 60.0, 3600.0))),
        draw(st.sampled_from((0, 1, 3, 10, 100_000))),
        [draw(_pool(i, focus)) for i in range(n)],
        draw(st.booleans()),
        draw(st.integers(0, 2**32).map(lambda seed: _resources(seed, focus))),
        draw(st.booleans()),
    )


class _Ops:
    """Draws operations from a seeded random.Random: hypothesis draws the configuration, the
    seed, the length and the mix, and this expands them (drawing every operation through
    hypothesis costs some 50 ms per sequence, which would allow only hundreds per run). A
    difference is reported at its first operation, with the operations before it."""

    def __init__(
        self,
        rnd: random.Random,
        pools: int,
        classes: Sequence[int],
        focus: str | None,
        resources: Sequence[str] = (),
        labels: float = 0.0,
    ) -> None:
        self.rnd = rnd
        self.pools = [f"p{i}" for i in range(pools)]  # the pools configured now
        self.classes = classes
        self.focus = focus
        self.fixed = 0.6 if focus == "fixed" else 0.15  # the share of fixed-start submits
        # the share of tasks submitted with dependencies
        self.dep_rate = 0.6 if focus == "deps" else 0.3 if focus == "fixed" else 0.2
        self.submitted = 0  # tasks submitted so far, at most: ids to depend on
        self.names = resources or RESOURCES  # the resources configured
        # the share of tasks asking for resources (some ask for unknown ones in any case)
        self.resources = rnd.choice((0.3, 0.6, 0.9)) if resources else 0.05
        self.labels = labels  # the share of tasks with labels
        # the usual amounts: under "park" mostly more than one, so that tasks wait on a bucket
        # whose level is a fraction of a token short of them all
        self.usual = (1, 2, 2, 3) if focus == "park" else (1, 2)
        self.config: Config = ()  # the configuration now (restarts change it)
        # "park", some sequences: the one token bucket every resource task asks for
        self.edge: str | None = None

    def target(self) -> int | str:
        """A task to depend on or to ask the dependents of: a recent id (about 3/5 of the
        tasks submitted get one, the others fail or find their key taken; some ids named are
        not given yet) or a key (taken, awaited or never taken)."""
        rnd = self.rnd
        if rnd.random() < 0.4:
            return rnd.choice(DEP_KEYS)
        recent = self.submitted * 3 // 5
        return rnd.randint(max(1, recent - 6), recent + 1)

    def deps(self, mates: Sequence[str]) -> list[tuple[int | str, str]] | None:
        """1-3 edges (mostly one), on `target()`s or on batch-mates' keys (`mates`, their
        own included: a cycle), with any condition."""
        rnd = self.rnd
        if rnd.random() >= self.dep_rate:
            return None
        out: list[tuple[int | str, str]] = []
        for _ in range(rnd.choice((1, 1, 1, 2, 3))):
            target = rnd.choice(mates) if mates and rnd.random() < 0.4 else self.target()
            out.append((target, rnd.choice(CONDITIONS)))
        return out

    def opt(self, values: Sequence[Any]) -> Any:
        return None if self.rnd.random() < 0.5 else self.rnd.choice(values)

    def seconds(self) -> float | None:
        r = self.rnd.random()
        if r < 0.4:
            return None
        return self.rnd.choice((0.0, 0.5, 1.0, 2.0, 7.5)) if r < 0.7 else self.rnd.uniform(0, 30)

    def step(self) -> float:
        rnd = self.rnd
        r = rnd.random()
        if self.focus == "fixed":
            # Mostly short steps, so that occurrences are created ahead of their time and
            # overlap; now and then a jump past every tolerance.
            if r < 0.05:
                return rnd.choice((30.0, 60.0, 4000.0))
            return rnd.choice(SHORT_STEPS) if r < 0.7 else rnd.uniform(0.0, 8.0)
        rates = [res[3] for res in self.config[7] if res[1] == "token_bucket"]
        if self.focus == "park" and rates and r < (0.8 if self.edge else 0.5):
            # To a bucket's refill edge: fractions and multiples of its time per token, a
            # float step off (levels just short of or past a token, and of _EPS).
            edge = rnd.choice(EDGE_TOKENS) / rnd.choice(rates)
            return max(0.0, edge + rnd.choice(EDGE_OFFSETS))
        return rnd.choice(ROUND_STEPS) if r < 0.6 else rnd.uniform(0.0, 50.0)

    def retry(self) -> tuple[int, float, float, float, bool] | None:
        rnd = self.rnd
        if rnd.random() < 0.6:
            return None
        return (
            rnd.randint(1, 4),
            rnd.choice((0.0, 0.1, 1.0, 2.5)),
            rnd.choice((1.0, 1.5, 2.0, 3.0)),
            rnd.choice((0.0, 0.5, 5.0, 60.0)),
            rnd.random() < 0.5,
        )

    def pool(self) -> str:
        return self.rnd.choice(self.pools)

    def restart(self, config: Config) -> Config:
        """The configuration a restart comes back with: a new seed, now and then a pool (not
        the last) or a resource no longer configured. Later operations name the pools left."""
        rnd = self.rnd
        _, sc, level, retention, retention_max, pools, elastic, resources, observed = config
        if len(pools) > 1 and rnd.random() < 0.2:
            gone = pools[rnd.randrange(len(pools))][0]
            pools = [p for p in pools if p[0] != gone]
            self.pools.remove(gone)
        if resources and rnd.random() < 0.2:
            gone = rnd.choice(resources)[0]
            resources = [r for r in resources if r[0] != gone]
        seed = rnd.randrange(2**40)
        return (seed, sc, level, retention, retention_max, pools, elastic, resources, observed)

    def broken(self) -> list[tuple[int, str]]:
        """Rows a restart cannot read: recent ids (some not held, or ended) with a reason (an
        empty one counts as none)."""
        rnd = self.rnd
        if rnd.random() < 0.7:
            return []
        recent = max(1, self.submitted)
        return [
            (rnd.randint(max(1, recent - 8), recent), rnd.choice(("corrupt task row", "")))
            for _ in range(rnd.randint(1, 2))
        ]

    def amounts(self) -> list[tuple[str, int]]:
        """Resource amounts as (name, amount) pairs: mostly known names and amounts a
        resource can give, some unknown, zero or over its capacity, a name twice or none."""
        rnd = self.rnd
        if self.edge is not None:
            return [(self.edge, rnd.choice((1, 2, 2, 2, 3)))]
        n = rnd.choice((0, 1, 1, 1, 2, 2, 3))
        pairs = []
        for _ in range(n):
            name = rnd.choice(RESOURCES) if rnd.random() < 0.05 else rnd.choice(self.names)
            r = rnd.random()
            usual = rnd.choice(self.usual)
            amount = usual if r < 0.8 else (0 if r < 0.85 else rnd.randint(3, 5))
            pairs.append((name, amount))
        return pairs

    def spec(self, now: float, key: str | None, mates: Sequence[str] = ()) -> tuple[Any, ...]:
        """(pool, class, kind, key, deadline, duration hint, timeout, retry, tenant, fixed
        start as (start_at, tolerance, on_miss) or None, deps, resources, labels)."""
        rnd = self.rnd
        deadline = self.seconds()
        return (
            self.pool(),
            rnd.choice(self.classes),
            rnd.choice(KINDS),
            key,
            None if deadline is None else now + deadline,
            self.opt((0.0, 0.5, 2.0)),
            self.opt((0.5, 1.0, 4.0)),
            self.retry(),
            None if rnd.random() < 0.25 else rnd.choice(TENANTS),
            self.start(now),
            self.deps(mates),
            self.amounts() if rnd.random() < self.resources else None,
            rnd.choice(TASK_LABELS) if rnd.random() < self.labels else None,
        )

    def start(self, now: float) -> tuple[float, float, str] | None:
        rnd = self.rnd
        if rnd.random() >= self.fixed:
            return None
        offset = rnd.choice(START_OFFSETS) if rnd.random() < 0.7 else rnd.uniform(-40.0, 100.0)
        return (now + offset, rnd.choice(TOLERANCES), rnd.choice(ON_MISS))

    def schedule(self) -> tuple[Any, ...]:
        """(name, cron, zone, template as (pool, class, kind, key, deadline_in, duration
        hint, timeout, retry, tenant, resources, labels), overlap, tolerance, on_miss). The
        template's amounts are > 0, as the edge (cronoq.Recurring) checks."""
        rnd = self.rnd
        template = (
            self.pool(),
            rnd.choice(self.classes),
            rnd.choice(KINDS),
            self.opt(SCHEDULE_KEYS),
            self.opt((0.5, 5.0)),
            self.opt((0.0, 0.5, 2.0)),
            self.opt((0.5, 1.0, 4.0)),
            self.retry(),
            None if rnd.random() < 0.25 else rnd.choice(TENANTS),
            [(n, a) for n, a in self.amounts() if a > 0] if rnd.random() < self.resources else None,
            rnd.choice(TASK_LABELS) if rnd.random() < self.labels else None,
        )
        return (
            rnd.choice(SCHEDULES),
            rnd.choice(CRONS[:FAST_CRONS] if rnd.random() < 0.6 else CRONS),
            rnd.choice(ZONES),
            template,
            rnd.choice(OVERLAPS),
            rnd.choice((0.0, 0.5, 1.0, 3.0, 10.0)),
            rnd.choice(ON_MISS),
        )

    def pick(self) -> int:
        """>= 0: a running attempt by index; < 0: any lease issued so far (stale outcomes)."""
        return self.rnd.randint(0, 7) if self.rnd.random() < 0.8 else self.rnd.randint(-12, -1)

    def ref(self) -> int | str:
        return self.rnd.randint(1, MAX_ID) if self.rnd.random() < 0.6 else self.rnd.choice(KEYS)

    def op(self, kind: str, now: float) -> Op:
        rnd = self.rnd
        if kind == "submit":
            spec = self.spec(now, self.opt(KEYS))
            self.submitted += 1
            return ("submit", now, *spec)
        if kind == "batch":
            keys = [self.opt(KEYS) for _ in range(rnd.randint(0, 4))]
            mates = [k for k in keys if k is not None]
            specs = [self.spec(now, key, mates) for key in keys]
            self.submitted += len(specs)
            return ("batch", now, specs)
        if kind in ("complete", "heartbeat"):
            return (kind, now, self.pick())
        if kind == "fail":
            retry_after = self.opt((0.0, 1.0, 3.0))
            message = rnd.choice(("boom", "bust"))
            return ("fail", now, self.pick(), message, rnd.random() < 0.3, retry_after)
        if kind in ("cancel", "lookup"):
            return (kind, now, self.ref())
        if kind == "dependents":
            return (kind, now, self.target())
        if kind == "set_capacity":
            return (kind, now, self.pool(), rnd.randint(0, 4))
        if kind == "set_group":
            return (kind, now, self.pool(), rnd.choice(GROUP_LABELS), rnd.randint(0, 3))
        if kind == "move":
            return (kind, now, rnd.randint(0, 7), rnd.choice(GROUP_LABELS))
        if kind == "group_room":
            return (kind, now, self.pool(), rnd.choice(GROUP_LABELS))
        if kind == "resolve":
            return (kind, now, self.amounts())
        if kind in ("pause", "resume"):
            return (kind, now, self.pool())
        if kind == "delete":
            return (kind, now, [rnd.randint(1, MAX_ID) for _ in range(rnd.randint(0, 4))])
        if kind == "add_recurring":
            return (kind, now, *self.schedule())
        if kind == "resume_recurring":
            # as a store gives it back: the next occurrence it kept (maybe passed meanwhile)
            # and the latest created (maybe gone)
            next_time = self.opt((-30.0, -1.0, 0.0, 0.5, 5.0, 60.0))
            last = self.opt(range(1, MAX_ID + 1))
            at = None if next_time is None else now + next_time
            return (kind, now, *self.schedule(), at, last)
        if kind == "remove_recurring":
            return (kind, now, rnd.choice(SCHEDULES))
        if kind == "restart":
            self.config = self.restart(self.config)
            return (kind, now, self.config, self.broken(), rnd.choice((0, 0, 3)))
        return (kind, now)  # dispatch, advance, halt, abort_running


@st.composite
def scenarios(
    draw: st.DrawFn, max_ops: int = 80, focus: str | None = None
) -> tuple[Config, list[Op]]:
    """A configuration and the operations to run on it. `focus`: "autoscale" or "fair" in
    every pool (`_extras`), "fixed": most submits with a fixed start, a schedule in every
    sequence, dispatches enough to create occurrences, short steps of time (`_Ops.step`), or
    "park": every configuration has resources (some sequences near a token bucket's refill
    edges), and tasks ask for them and carry labels often."""
    config = draw(configs(focus))
    kinds = list(OP_WEIGHTS)
    weights: list[float] = [draw(st.integers(lo, hi)) for lo, hi in OP_WEIGHTS.values()]
    for kind in RARE_KINDS:
        kinds.append(kind)
        weights.append(0.1 if draw(st.integers(0, 9)) == 0 else 0.0)
    if focus == "fixed":  # a schedule in every sequence, and dispatches to create occurrences
        weights[kinds.index("add_recurring")] = draw(st.integers(1, 2))
        weights[kinds.index("dispatch")] = draw(st.integers(3, 8))
    n = draw(st.integers(1, max_ops))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    # Fair share: tenants contend within a class, so crowd the tasks into two.
    classes = (1, 2) if focus == "fair" else range(4)
    park = focus == "park"
    gen = _Ops(
        rnd,
        len(config[5]),
        classes,
        focus,
        resources=[r[0] for r in config[7]],
        labels=rnd.choice((0.0, 0.3, 0.6)) if park else rnd.choice((0.0, 0.0, 0.2)),
    )
    gen.config = config
    if park and rnd.random() < 0.4:
        # Near a bucket's refill edges: tasks that all want its tokens, mostly more than one
        # (an offer that finds its level a fraction of a token short of them all), steps of
        # time to those edges, and outcomes and dispatches to offer them.
        gen.edge = config[7][0][0]
        gen.resources = 0.9
        for kind in ("complete", "dispatch"):
            weights[kinds.index(kind)] += 4
    now = 0.0
    ops: list[Op] = []
    for kind in rnd.choices(kinds, weights, k=n):
        if kind == "advance" or rnd.random() < 0.1:
            now += gen.step()
        ops.append(gen.op(kind, now))
    return config, ops


# --- the Python side -----------------------------------------------------------------------


def _policy(r: Sequence[Any] | None) -> RetryPolicy | None:
    return None if r is None else RetryPolicy(*r)


def _settings(fields: Sequence[Any] | None) -> AutoscaleSettings | None:
    if fields is None:
        return None
    return AutoscaleSettings(*fields[:3], dict(fields[3]), *fields[4:])


def _resource(r: Sequence[Any]) -> ResourceConfig:
    """Through cronoq.Resource, whose checks the Rust ResourceConfig makes."""
    name, kind, permits, rate, burst = r
    if kind == "semaphore":
        return Resource.semaphore(name, permits).core_config()
    return Resource.token_bucket(name, rate, burst).core_config()


class Recorder:
    """The engine's observer (model.Observer): its calls since the trace last took them."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def started(self, att: Attempt, wait: float) -> None:
        self.calls.append(("started", att.lease, att.task.id, att.number, wait))

    def ended(self, att: Attempt, outcome: str, runtime: float) -> None:
        self.calls.append(("ended", att.lease, att.task.id, att.number, outcome, runtime))

    def take(self) -> list[tuple[Any, ...]]:
        calls, self.calls = self.calls, []
        return calls


def make_engine(config: Config, recorder: Recorder, first_id: int = 1) -> Engine:
    seed, sc, level, retention, retention_max, pools, elastic, resources, observed = config
    cfgs = [
        PoolConfig(
            p[0],
            capacity=p[1],
            lease_ttl=p[2],
            retry=_policy(p[3]) or DEFAULT_RETRY,
            default_duration=p[4],
            max_pending=p[5],
            overflow=p[6],
            cost_per_worker_second=p[7],
            min=p[8],
            max=p[9],
            autoscale=_settings(p[10]),
            fair_share=p[11],
            tenant_weights=dict(p[12]),
            unknown_dependency=p[13],
            await_timeout=p[14],
            reservable_fraction=p[15],
            max_hold=p[16],
            metrics_window=p[17],
        )
        for p in pools
    ]
    scoring = Scoring(tuple(sc[0]), *sc[1:7], *(None if a is None else tuple(a) for a in sc[7:]))
    return Engine(
        cfgs,
        0.0,
        rng=random.Random(seed),
        scoring=scoring,
        event_level=level,
        retention=retention,
        retention_max=retention_max,
        journal=True,
        elastic=elastic,
        resources=[_resource(r) for r in resources],
        first_id=first_id,
        observer=recorder if observed else None,
    )


def _parked(r: TaskRecord) -> str | None:
    """What a ready task waits for outside its queue: a resource's name, or "group"."""
    if r.parked is None:
        return None
    return "group" if isinstance(r.parked, Groups) else r.parked.name


def deps_row(e: Extras | None) -> tuple[Any, ...]:
    """The dependency fields of a record's extras: the edges as submitted, the unmet count,
    the keys awaited (sorted: a set), the resolved edges (parent id or None, awaited key or
    None, condition) or None, the awaited keys' parents and the waiting children."""
    if e is None:
        return (None, 0, (), None, (), ())
    return (
        None if e.deps is None else tuple(e.deps),
        e.waiting,
        tuple(sorted(e.awaits or ())),
        None
        if e.resolved is None
        else tuple((None if p is None else p.id, k, on) for p, k, on in e.resolved),
        tuple(p.id for p in e.parents or ()),
        tuple((c.id, on) for c, on in e.children or ()),
    )


def record_row(r: TaskRecord) -> tuple[Any, ...]:
    history = tuple(
        (p.number, p.started_at, p.ended_at, p.outcome, p.message) for p in r.past_attempts
    )
    extra = r.extra
    fixed = None
    if extra is not None and extra.start_at is not None:
        fixed = (
            extra.start_at,
            extra.tolerance,
            extra.on_miss,
            extra.held,
            extra.due,
            extra.fixed_done,
            extra.recurring is not None,
        )
    return (
        r.id,
        r.seq,
        r.pool,
        r.cls,
        r.kind,
        r.key,
        r.deadline,
        r.duration_hint,
        r.timeout,
        r.tenant,
        STATUS_NAMES[r.status],
        r.attempt,
        r.message,
        r.submitted_at,
        r.eligible_at,
        r.ready_at,
        r.started_at,
        r.latest_start,
        r.finished_at,
        None if r.running is None else r.running.lease,
        history,
        fixed,
        None if r.tags is None else r.tags.get(RECURRING_TAG),
        deps_row(r.extra),
        None if r.labels is None else list(r.labels.items()),
        None if extra is None or extra.resources is None else list(extra.resources.items()),
        _parked(r),
    )


def stored_row(r: TaskRecord) -> tuple[Any, ...]:
    """A task as a store keeps it (cronoq.store.rows): its spec, status, attempt, times (its
    retry time only while it retries, its end only once ended), message, extras as submitted
    and attempt history, and its schedule's name; the engine state is not kept."""
    extra = r.extra
    policy = r.retry
    fixed = deps = resources = None
    if extra is not None:
        if extra.start_at is not None:
            fixed = (extra.start_at, extra.tolerance, extra.on_miss)
        deps = None if not extra.deps else [tuple(d) for d in extra.deps]
        resources = None if not extra.resources else list(extra.resources.items())
    return (
        r.id,
        r.seq,
        r.pool,
        r.cls,
        r.kind,
        r.key,
        r.deadline,
        r.duration_hint,
        r.timeout,
        None
        if policy is None
        else (
            policy.max_attempts,
            policy.initial_backoff,
            policy.multiplier,
            policy.max_backoff,
            policy.jitter,
        ),
        r.tenant,
        STATUS_NAMES[r.status],
        r.attempt,
        r.message,
        r.submitted_at,
        r.eligible_at,
        r.ready_at if r.status == RETRYING else 0.0,
        r.started_at,
        r.finished_at if r.status >= FIRST_TERMINAL else 0.0,
        fixed,
        deps,
        resources,
        None if r.labels is None else list(r.labels.items()),
        [(p.number, p.started_at, p.ended_at, p.outcome, p.message) for p in r.past_attempts],
        None if r.tags is None else r.tags.get(RECURRING_TAG),
    )


def from_stored(row: Sequence[Any]) -> TaskRecord:
    """The record a store reads back from a `stored_row` (cronoq.store.rows.record_from_row)."""
    (
        tid,
        seq,
        pool,
        cls,
        kind,
        key,
        deadline,
        hint,
        timeout,
        retry,
        tenant,
        status,
        attempt,
        message,
        submitted_at,
        eligible_at,
        ready_at,
        started_at,
        finished_at,
        fixed,
        deps,
        resources,
        labels,
        history,
        tag,
    ) = row
    extra = None
    if fixed is not None or deps or resources or history:
        extra = Extras(deps=deps and list(deps), resources=resources and dict(resources))
        if fixed is not None:
            extra.start_at, extra.tolerance, extra.on_miss = fixed
        if history:
            extra.history = [PastAttempt(*h) for h in history]
    rec = TaskRecord(
        None,
        pool,
        cls,
        kind=kind,
        key=key,
        tenant=tenant,
        deadline=deadline,
        duration_hint=hint,
        timeout=timeout,
        retry=_policy(retry),
        tags=None if tag is None else {RECURRING_TAG: tag},
        labels=None if labels is None else dict(labels),
        extra=extra,
    )
    rec.id, rec.seq, rec.status, rec.attempt = tid, seq, STATUS_NAMES.index(status), attempt
    rec.message, rec.submitted_at, rec.eligible_at = message, submitted_at, eligible_at
    rec.ready_at, rec.started_at, rec.finished_at = ready_at, started_at, finished_at
    return rec


def ready_row(v: ReadyView) -> tuple[Any, ...]:
    return (v.pool, list(v.ready_by_class), list(v.oldest_ready_at), v.retries, v.dead_lettered)


def attempt_row(a: Attempt) -> tuple[Any, ...]:
    slot = None if a.slot is None else sorted(a.slot.labels.items())
    return (
        a.task.id,
        a.number,
        a.lease,
        a.started_at,
        a.lease_ttl,
        a.lease_expiry,
        a.abort_reason,
        slot,
    )


def parking_row(eng: Engine) -> tuple[Any, ...]:
    """Each resource's level and parked tasks (live ones with their amounts, and how many
    entries the heap holds), each pool's unlabeled slots and worker groups with the tasks
    parked for them, the pending re-offer and the tasks offered since the dispatch loop last
    looked. Read without refilling any bucket; None while the engine has neither resources
    nor worker groups (nothing is parked or offered then, and every slot is unlabeled)."""
    pool_list = eng.pools.values()
    if not eng.resources and all(p.groups is None for p in pool_list):
        return None
    resources = [
        (
            r.name,
            r.in_use,
            r.tokens,
            r.last,
            r.wake,
            len(r.parked),
            sorted((e[4].id, e[5]) for e in r.parked if e[4].qgen == e[3] and e[4].parked is r),
        )
        for r in eng.resources.values()
    ]
    pools = []
    for p in pool_list:
        g = p.groups
        groups = None
        if g is not None:
            groups = (
                g.unlabeled_busy,
                [(list(x.labels.items()), x.capacity, x.busy) for x in g.by_key.values()],
                len(g.parked),
                sorted(e[4].id for e in g.parked if e[4].qgen == e[3] and e[4].parked is g),
            )
        pools.append((p.unlabeled, groups))
    offered = [r.id for r in eng.parking.offered]
    return (resources, pools, eng.parking.reoffer, offered)


def snapshot_row(s: Snapshot) -> tuple[Any, ...]:
    """The snapshot's fields that the Rust core has (all but those of worker groups)."""
    pools = [
        (
            p.name,
            p.capacity,
            p.busy,
            p.held,
            p.desired,
            p.pending,
            list(p.pending_by_class),
            p.ready,
            p.reservations,
            p.window,
            p.dispatched,
            p.succeeded,
            p.failed,
            p.retried,
            p.priority_adherence,
            p.fixed_start_hit_rate,
            p.utilization,
            p.schedule_efficiency,
            p.wait_mean,
            p.wait_p50,
            p.wait_p90,
            p.wait_p99,
            p.run_p50,
            p.run_p99,
            p.worker_seconds,
            p.cost,
            p.paused,
            p.unserved,
        )
        for p in s.pools
    ]
    return (pools, s.live_tasks, s.running, s.pending, [s.totals[k] for k in TOTALS_KEYS])


def _record(spec: Sequence[Any]) -> TaskRecord:
    """The record the edge (cronoq._options) builds: amounts checked (0 is invalid), an
    empty mapping of resources or labels dropped."""
    pool, cls, kind, key, deadline, hint, timeout, retry, tenant, start, deps, resources, labels = (
        spec
    )
    amounts = None if resources is None else _amounts(dict(resources))
    extra = None
    if start is not None or deps is not None or amounts:
        extra = Extras(deps=None if deps is None else list(deps), resources=amounts or None)
        if start is not None:
            extra.start_at, extra.tolerance, extra.on_miss = start
    return TaskRecord(
        None,
        pool,
        cls,
        kind=kind,
        key=key,
        deadline=deadline,
        duration_hint=hint,
        timeout=timeout,
        retry=_policy(retry),
        tenant=tenant,
        labels=None if labels is None else _labels(dict(labels)),
        extra=extra,
    )


def _schedule(op: Sequence[Any]) -> Recurring:
    """The schedule of an add_recurring or resume_recurring operation (`_Ops.schedule`)."""
    name, expr, tz, template, overlap, tolerance, on_miss = op[:7]
    pool, cls, kind, key, deadline_in, hint, timeout, retry, tenant, resources, labels = template
    return Recurring(
        name=name,
        spec=parse_cron(expr),
        tz=zone(tz),
        payload=None,
        pool=pool,
        cls=cls,
        kind=kind,
        key=key,
        tenant=tenant,
        deadline_in=deadline_in,
        duration_hint=hint,
        timeout=timeout,
        retry=_policy(retry),
        resources=dict(resources) if resources else None,
        labels=dict(labels) if labels else None,
        overlap=overlap,
        tolerance=tolerance,
        on_miss=on_miss,
    )


def run_python(config: Config, ops: Sequence[Op]) -> Trace:
    """Run the operations on the Python engine; its trace (see the module docstring)."""
    recorder = Recorder()
    eng = make_engine(config, recorder)
    attempts: dict[int, Attempt] = {}
    issued = 0
    trace: Trace = []
    defined: dict[str, Op] = {}  # each schedule's latest definition (restarts resume it)

    def pick(r: int) -> Attempt | None:
        if r >= 0:
            running = list(eng.running.values())
            return running[r % len(running)] if running else None
        return attempts[(-r - 1) % issued + 1] if issued else None

    for op in ops:
        kind, now = op[0], op[1]
        result: Any = None
        try:
            if kind == "submit":
                rec, existed = eng.submit(_record(op[2:]), now)
                result = ("ok", rec.id, existed)
            elif kind == "batch":
                got = eng.submit_batch([_record(s) for s in op[2]], now)
                result = ("ok", [(rec.id, existed) for rec, existed in got])
            elif kind == "resolve":
                wanted = eng.resolve_resources(dict(op[2]))
                result = ("ok", [(r.name, amount) for r, amount in wanted])
        except SubmitError as e:
            result = ("err", e.code, e.message)
        if kind == "dispatch":
            eng.dispatch(now)
        elif kind == "advance":
            eng.advance(now)
        elif kind in ("complete", "fail", "heartbeat"):
            att = pick(op[2])
            if att is None:
                result = "noop"
            elif kind == "complete":
                result = eng.complete(att, now)
            elif kind == "fail":
                result = eng.fail(att, now, op[3], permanent=op[4], retry_after=op[5])
            else:
                result = eng.heartbeat(att, now)
        elif kind == "cancel":
            result = eng.cancel(op[2], now)
        elif kind == "lookup":
            found = eng.lookup(op[2])
            result = None if found is None else record_row(found)
        elif kind == "dependents":
            found = eng.lookup(op[2])
            result = None if found is None else [(c.id, on) for c, on in eng.dependents(found)]
        elif kind == "set_capacity":
            eng.set_capacity(op[2], op[3], now)
        elif kind == "set_group":
            eng.set_group_capacity(op[2], dict(op[3]), op[4], now)
        elif kind == "move":
            att = pick(op[2])
            if att is None:
                result = "noop"
            else:
                eng.move_attempt(att, dict(op[3]))
        elif kind == "group_room":
            result = eng.group_has_room(op[2], frozenset(dict(op[3]).items()))
        elif kind == "pause":
            result = eng.pause(op[2], now)
        elif kind == "resume":
            result = eng.resume(op[2], now)
        elif kind == "delete":
            held = [eng.tasks[i] for i in op[2] if i in eng.tasks]
            result = [rec.id for rec in eng.delete(held)]
        elif kind == "halt":
            eng.halt()
        elif kind == "abort_running":
            result = [attempt_row(a) for a in eng.abort_running(now)]
        elif kind == "ready_view":
            result = [ready_row(v) for v in eng.ready_view()]
        elif kind == "snapshot":
            levels = [r.level(now) for r in eng.resources.values()]
            result = (snapshot_row(eng.snapshot(now)), levels)
        elif kind == "add_recurring":
            eng.add_recurring(_schedule(op[2:]), now)
            defined[op[2]] = op
        elif kind == "resume_recurring":
            eng.resume_recurring(_schedule(op[2:]), op[9], op[10], now)
            defined[op[2]] = op
        elif kind == "restart":
            eng, result = restart(eng, op, defined, recorder)
            attempts.clear()
            issued = 0
        elif kind == "remove_recurring":
            result = eng.remove_recurring(op[2], now)
        acts = eng.take()
        for a in acts.starts:
            attempts[a.lease] = a
        if acts.starts:
            issued = acts.starts[-1].lease
        journal = eng.take_journal()
        trace.append(
            (
                result,
                [attempt_row(a) for a in acts.starts],
                [attempt_row(a) for a in acts.aborts],
                [record_row(r) for r in acts.finished],
                [(e.id, e.pool, e.key, e.status, e.attempt, e.at, e.message) for e in acts.events],
                eng.next_wake(),
                eng.live,
                [eng.totals[k] for k in TOTALS_KEYS],
                [
                    (
                        p.capacity,
                        p.busy,
                        list(p.pending_by_class),
                        list(p.retrying_by_class),
                        p.queues.n,
                        p.retries,
                        p.dead_lettered,
                        p.paused,
                        p.learned,
                        sorted(p.durations.items()),
                        p.desired(),
                        p.arrivals,
                        p.reservation_limit,
                        p.holds,
                        list(p.unready_by_class),
                        sorted((rec.id, lo, hi) for rec, (lo, hi) in p.reservations.items()),
                        sorted((start, seq, rec.id) for start, seq, rec in p.due),
                        [rec.id for rec in p.misses],
                    )
                    for p in eng.pools.values()
                ],
                (
                    [record_row(r) for r in journal.added],
                    [record_row(r) for r in journal.changed.values()],
                    [
                        (name, s.next_time, _id(s.last))
                        for name, s in journal.schedules.items()
                        if eng.recurring.get(name) is s
                    ],
                    list(journal.pools.items()),
                    list(journal.deleted),
                ),
                [
                    (s.name, s.next_time, _id(s.last), _id(s.queued), [r.id for r in s.recent])
                    for s in eng.recurring.values()
                ],
                parking_row(eng),
                recorder.take(),
            )
        )
    return trace


def restart(old: Engine, op: Op, defined: dict[str, Op], recorder: Recorder) -> tuple[Engine, Any]:
    """A failover, as cronoq._durable.recover does it: a fresh engine of the op's
    configuration (ids from the old one's next, maybe past a gap) takes back the pauses, the
    stored rows (some marked broken) and the schedules whose pool is still configured. The
    result is the rows, so that both engines are seen restoring from the same ones."""
    _, now, config, broken, gap = op
    rows = [stored_row(r) for r in sorted(old.tasks.values(), key=lambda r: r.id)]
    eng = make_engine(config, recorder, old.next_id + gap)
    for name, pool in old.pools.items():
        if pool.paused and name in eng.pools:
            eng.pause(name, now)
    eng.restore([from_stored(row) for row in rows], now, dict(broken))
    for name, s in old.recurring.items():
        sched = _schedule(defined[name][2:])
        if sched.pool in eng.pools:
            eng.resume_recurring(sched, s.next_time, _id(s.last), now)
    return eng, rows


def _id(rec: TaskRecord | None) -> int | None:
    return None if rec is None else rec.id


# --- comparing --------------------------------------------------------------------------------


def first_difference(ops: Sequence[Op], python: Trace, rust: Trace) -> str | None:
    """None when the traces agree; else the first differing operation with both sides."""
    if len(python) != len(rust):
        return f"trace lengths differ: python {len(python)}, rust {len(rust)}"
    for i, (p, r) in enumerate(zip(python, rust, strict=True)):
        if tuple(p) == tuple(r):
            continue
        lines = [f"operation {i}: {ops[i]!r}"]
        for name, a, b in zip(FIELDS, p, r, strict=True):
            if a != b:
                lines += [f"  {name}:", f"    python: {a!r}", f"    rust:   {b!r}"]
        lines.append("operations before it:")
        lines += [f"  {j}: {op!r}" for j, op in enumerate(ops[:i])]
        return "\n".join(lines)
    return None


def check(core_py: Any, config: Config, ops: list[Op]) -> None:
    """Run both engines and fail with the first difference."""
    python = run_python(config, ops)
    rust = core_py.run_engine(config, ops)
    diff = first_difference(ops, python, rust)
    assert diff is None, f"the engines disagree (config {config!r}):\n{diff}"
