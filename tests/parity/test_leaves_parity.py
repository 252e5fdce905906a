"""Differential tests of the autoscaler and the pool statistics: `cronoq.core.autoscale` and
`cronoq.core.stats` against their Rust ports (`cronoq_core::autoscale`, `cronoq_core::stats`).

Compared, floats bit for bit: the settings checks of `AutoscaleConfig` (valid and invalid
values, message for message); sequences of `Autoscaler.evaluate` with random signals (each
result, `desired`, `next_eval`, `ewma`); `frexp`, buckets and percentiles; and `PoolStats` driven
by random calls at increasing times with snapshots at arbitrary times (every slot of the window,
every summary field, `worker_seconds`). Each hypothesis example is a batch of sequences that one
call into Rust runs; a seeded bulk run adds volume. CRONOQ_PARITY_SCALE=N runs N times as many.
"""

from __future__ import annotations

import dataclasses
import math
import random
from types import ModuleType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cronoq._options import AutoscaleConfig
from cronoq.core.autoscale import Autoscaler, AutoscaleSettings
from cronoq.core.stats import PoolStats, bucket_of, bucket_value, percentiles
from parity.budget import SCALE, examples

SUMMARY_COUNTS = ("dispatched", "succeeded", "failed", "retried")
SUMMARY_FLOATS = (
    "priority_adherence",
    "fixed_start_hit_rate",
    "utilization",
    "schedule_efficiency",
    "wait_mean",
    "wait_p50",
    "wait_p90",
    "wait_p99",
    "run_p50",
    "run_p99",
)


def assert_same(py: Any, rs: Any, case: Any) -> None:
    """Equal to the bit: the results are built alike (tuples where Rust gives tuples, lists for
    its Vecs), and repr() tells every float apart (-0.0 from 0.0, and by its shortest digits)."""
    assert repr(py) == repr(rs), f"Python and Rust differ for {case!r}"


# --- autoscaler settings ------------------------------------------------------------------------

FIELDS = (
    "interval",
    "target_utilization",
    "drain_time",
    "slo",
    "reservation_horizon",
    "stabilization_window",
    "cooldown",
    "max_step_up_abs",
    "max_step_down",
    "max_step_up_ratio",
    "ewma_alpha",
    "cost_per_worker_second",
)
# AutoscaleConfig's parameters: the settings less the two the engine fixes
CONFIG_FIELDS = tuple(f for f in FIELDS if f not in ("max_step_up_ratio", "ewma_alpha"))


def as_fields(s: AutoscaleSettings) -> tuple[Any, ...]:
    """The settings as `leaves.rs` takes them (slo as (class, seconds) pairs)."""
    return tuple(sorted(s.slo.items()) if name == "slo" else getattr(s, name) for name in FIELDS)


odd_seconds = st.sampled_from([-1.0, -0.0, 0.0, 1e-300, 0.5, math.inf, -math.inf, math.nan])
any_seconds = st.one_of(odd_seconds, st.floats(-10.0, 1e9), st.floats(allow_nan=True))


@st.composite
def config_settings(draw: st.DrawFn) -> AutoscaleSettings:
    """Settings with each field valid most of the time, so every check gets its turn."""

    def seconds() -> float:
        return draw(st.one_of(st.floats(0.0, 120.0), any_seconds))

    def count() -> int:
        return draw(st.one_of(st.integers(0, 10), st.integers(-5, 2**40)))

    slo = draw(st.dictionaries(st.integers(0, 5), st.one_of(st.floats(0.0, 60.0), any_seconds)))
    return AutoscaleSettings(
        interval=draw(st.one_of(st.floats(0.01, 10.0), any_seconds)),
        target_utilization=draw(st.one_of(st.floats(0.0, 1.0), any_seconds)),
        drain_time=seconds(),
        slo=dict(sorted(slo.items())),  # Rust keeps slo sorted; Python checks in dict order
        reservation_horizon=seconds(),
        stabilization_window=seconds(),
        cooldown=seconds(),
        max_step_up_abs=count(),
        max_step_down=count(),
        cost_per_worker_second=draw(st.one_of(st.floats(0.0, 5.0), any_seconds)),
    )


def config_error(s: AutoscaleSettings) -> str | None:
    try:
        AutoscaleConfig(**{name: getattr(s, name) for name in CONFIG_FIELDS})
    except (ValueError, OverflowError) as e:
        return str(e)
    return None


@examples(100)
@given(batch=st.lists(config_settings(), min_size=1, max_size=20))
def test_settings_checks_match(core_py: ModuleType, batch: list[AutoscaleSettings]) -> None:
    rs = core_py.autoscale_validate([as_fields(s) for s in batch])
    for s, got in zip(batch, rs, strict=True):
        assert_same(config_error(s), got, s)


def random_settings(r: random.Random) -> AutoscaleSettings:
    odd = [-1.0, -0.0, 0.0, 1e-300, 0.5, 1.0, 1e16, math.inf, -math.inf, math.nan]

    def value(lo: float, hi: float) -> float:
        return r.choice(odd) if r.random() < 0.08 else r.uniform(lo, hi)

    def count() -> int:
        return r.randint(-3, 10) if r.random() < 0.05 else r.randint(0, 10)

    slo = {c: value(0.0, 60.0) for c in range(6) if r.random() < (0.3 if c < 4 else 0.02)}
    return AutoscaleSettings(
        interval=value(0.0, 10.0),
        target_utilization=value(0.0, 1.0),
        drain_time=value(0.0, 100.0),
        slo=slo,
        reservation_horizon=value(0.0, 100.0),
        stabilization_window=value(0.0, 100.0),
        cooldown=value(0.0, 100.0),
        max_step_up_abs=count(),
        max_step_down=count(),
        cost_per_worker_second=value(0.0, 5.0),
    )


def test_settings_checks_bulk(core_py: ModuleType) -> None:
    r = random.Random(34)
    batch = [random_settings(r) for _ in range(3000 * SCALE)]
    rs = core_py.autoscale_validate([as_fields(s) for s in batch])
    errors = 0
    for s, got in zip(batch, rs, strict=True):
        assert_same(config_error(s), got, s)
        errors += got is not None
    assert 0.2 < errors / len(batch) < 0.8  # both the checks and the valid path are exercised


# --- autoscaler evaluations ---------------------------------------------------------------------

# settings the engine may hold (the core checks none; these are the ones that cannot divide by 0)
engine_settings = st.builds(
    AutoscaleSettings,
    interval=st.one_of(st.sampled_from([0.1, 0.1, 0.3, 1.0, 5.0]), st.floats(0.01, 10.0)),
    target_utilization=st.one_of(st.sampled_from([0.75, 1.0]), st.floats(1e-3, 1.0)),
    drain_time=st.one_of(st.sampled_from([0.0, 0.5, 5.0, 30.0]), st.floats(0.0, 100.0)),
    slo=st.dictionaries(
        st.integers(0, 5), st.one_of(st.sampled_from([0.0, 0.5, 2.0]), st.floats(0, 60))
    ),
    stabilization_window=st.one_of(
        st.sampled_from([0.0, 0.5, 3.0, 10.0, 60.0]), st.floats(0.0, 100.0)
    ),
    cooldown=st.one_of(st.sampled_from([0.0, 1.0, 2.5, 30.0]), st.floats(0.0, 60.0)),
    max_step_up_abs=st.integers(0, 8),
    max_step_down=st.integers(0, 4),
    max_step_up_ratio=st.one_of(st.just(1.0), st.floats(0.0, 3.0)),
    ewma_alpha=st.one_of(st.just(0.5), st.floats(0.0, 1.0)),
)

few = st.sampled_from([0, 0, 0, 0, 1, 2, 5, 40])
step_st = st.tuples(
    # time to this evaluation: None is when it is due (`next_eval`, as the engine calls it);
    # else the same instant, within the 1e-9 slack, late, ...
    st.one_of(
        st.none(),
        st.none(),
        st.sampled_from([0.0, 1e-10, 0.1, 0.5, 1.0, 2.5, 7.0]),
        st.floats(0, 100),
    ),
    st.one_of(few, st.integers(0, 10**6)),  # arrivals
    st.one_of(  # service time
        st.sampled_from([0.0, 0.5, 1.0, 1e-9, 1e12, math.inf, math.nan]), st.floats(0.0, 600.0)
    ),
    st.lists(st.one_of(few, st.integers(0, 10**5)), min_size=4, max_size=4),  # backlog
    st.one_of(few, st.integers(0, 100)),  # busy
    st.one_of(st.none(), st.none(), st.integers(0, 60)),  # capacity set from outside
    st.one_of(st.just(0), few, st.integers(0, 60)),  # reserved
    st.sampled_from([False, False, False, True]),  # stranded
)


# (start, interval, spans): evaluations on that grid come within 1e-9 s below those spans of
# time after the start, where the float slack of the window and cooldown comparisons decides.
GRIDS = [
    (100.0, 0.1, (0.5, 1.0, 2.5, 3.0, 10.0)),
    (0.0, 0.1, (1.0, 10.0)),
    (0.0, 0.3, (3.0, 60.0)),
    (100.0, 0.3, (3.0, 30.0)),
    (12345.678, 0.3, (3.0, 30.0, 60.0)),
]


def on_grid(s: AutoscaleSettings, hi: int, steps: list[Any], pick: Any) -> tuple[Any, ...]:
    """The case moved onto a grid: evaluations when due, settings whose boundaries fall within
    the slack, a pool that starts at `max` and calm signals after the first step (so that it
    steps down as soon as the window and the cooldown allow)."""
    start, interval, spans = pick(GRIDS)
    s = dataclasses.replace(
        s, interval=interval, stabilization_window=pick(spans), cooldown=pick(spans)
    )
    first = (None, *steps[0][1:5], hi, *steps[0][6:])
    # long enough to pass a window of 10 s at 0.1 s, and cooldowns after it
    calm = [(None, 0, 1.0, [0, 0, 0, 0], 0, None, 0, False)] * max(len(steps) - 1, 120)
    return s, start, [first, *calm]


@st.composite
def scaler_case(draw: st.DrawFn) -> tuple[Any, ...]:
    s = draw(engine_settings)
    lo = draw(st.integers(0, 6))
    hi = lo + draw(st.integers(0, 30))
    start = draw(st.one_of(st.sampled_from([0.0, 100.0, 1.7e9 + 0.3]), st.floats(0, 1e6)))
    steps = draw(st.lists(step_st, min_size=1, max_size=80))
    if draw(st.booleans()):
        hi = max(hi, lo + 2)  # room to step down
        s, start, steps = on_grid(s, hi, steps, lambda xs: draw(st.sampled_from(xs)))
    return s, lo, hi, start, steps


def run_scaler(s: AutoscaleSettings, lo: int, hi: int, start: float, steps: list[Any]) -> Any:
    """Drive the Python autoscaler like the engine (capacity follows the result unless set
    from outside); return its results and the signals for the Rust run."""
    a = Autoscaler(s, lo, hi, start)
    now, cap = start, lo
    results, signals = [], []
    for dt, arrivals, service, backlog, busy, override, reserved, stranded in steps:
        now = a.next_eval if dt is None else now + dt
        if override is not None:
            cap = override
        sig = (now, arrivals, service, backlog, busy, cap, reserved, stranded)
        cap = a.evaluate(
            now,
            arrivals=arrivals,
            service_time=service,
            backlog_by_class=backlog,
            busy=busy,
            capacity=cap,
            reserved=reserved,
            stranded=stranded,
        )
        results.append((cap, a.desired, a.next_eval, a.ewma))
        signals.append(sig)
    return results, signals


def check_scalers(core_py: ModuleType, cases: list[tuple[Any, ...]]) -> None:
    runs = [run_scaler(*case) for case in cases]
    rs = core_py.autoscale_runs(
        [
            (as_fields(s), lo, hi, start, signals)
            for (s, lo, hi, start, _), (_, signals) in zip(cases, runs, strict=True)
        ]
    )
    for case, (py, _), got in zip(cases, runs, rs, strict=True):
        assert_same(py, got, case)


@examples(120)
@given(cases=st.lists(scaler_case(), min_size=1, max_size=6))
def test_autoscaler_decisions_match(core_py: ModuleType, cases: list[tuple[Any, ...]]) -> None:
    check_scalers(core_py, cases)


def random_scaler_case(r: random.Random) -> tuple[Any, ...]:
    slo = {
        c: r.choice([0.0, 0.5, 2.0, 30.0, r.uniform(0, 60)]) for c in range(6) if r.random() < 0.3
    }
    s = AutoscaleSettings(
        interval=r.choice([0.1, 0.1, 0.3, 1.0, r.uniform(0.01, 5.0)]),
        target_utilization=r.choice([0.75, 1.0, r.uniform(1e-3, 1.0)]),
        drain_time=r.choice([0.0, 5.0, 30.0, r.uniform(0, 100)]),
        slo=slo,
        stabilization_window=r.choice([0.0, 3.0, 60.0, r.uniform(0, 100)]),
        cooldown=r.choice([0.0, 2.5, 30.0, r.uniform(0, 60)]),
        max_step_up_abs=r.randint(0, 8),
        max_step_down=r.randint(0, 4),
        max_step_up_ratio=r.choice([1.0, r.uniform(0, 3)]),
        ewma_alpha=r.choice([0.5, r.random()]),
    )
    lo = r.randint(0, 6)
    hi = lo + r.randint(0, 30)
    quiet = [0, 0, 0, 0, 1, 2, 5, 40]
    steps = [
        (
            r.choice([None, None, None, 0.0, 1e-10, 0.1, 1.0, 2.5, r.uniform(0, 100)]),
            r.choice([*quiet, r.randint(0, 10**6)]),
            r.choice([0.0, 0.5, 1.0, r.uniform(0, 600)]),
            [r.choice(quiet) for _ in range(4)],
            r.choice([*quiet, r.randint(0, 100)]),
            r.randint(0, hi + 10) if r.random() < 0.2 else None,
            r.choice([0, 0, r.randint(0, 60)]),
            r.random() < 0.2,
        )
        for _ in range(r.randint(1, 250))
    ]
    start = r.choice([0.0, r.uniform(0, 1e6)])
    if r.random() < 0.5:
        hi = max(hi, lo + 2)
        s, start, steps = on_grid(s, hi, steps, r.choice)
    return s, lo, hi, start, steps


def test_autoscaler_bulk(core_py: ModuleType) -> None:
    r = random.Random(34)
    for _ in range(4 * SCALE):
        check_scalers(core_py, [random_scaler_case(r) for _ in range(250)])


# --- buckets and percentiles ----------------------------------------------------------------------

samples = st.one_of(
    st.sampled_from([0.0, -0.0, -1.0, 5e-324, 2.2250738585072014e-308, 0.5, 1.0, 1e300]),
    st.floats(0.0, 8e307),
    st.floats(0.0, 10.0),
    st.floats(-1e3, 0.0),
)


@examples(100)
@given(xs=st.lists(samples, max_size=50))
def test_frexp_and_buckets_match(core_py: ModuleType, xs: list[float]) -> None:
    assert_same([math.frexp(x) for x in xs], core_py.stats_frexp(xs), xs)
    py = [(bucket_of(x), bucket_value(bucket_of(x))) for x in xs]
    assert_same(py, core_py.stats_buckets(xs), xs)


@examples(100)
@given(
    cases=st.lists(
        st.tuples(
            st.lists(st.lists(st.tuples(samples, st.integers(1, 50)), max_size=8), max_size=4),
            st.lists(st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]), st.floats(0, 1))),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_percentiles_match(core_py: ModuleType, cases: list[Any]) -> None:
    batch = []
    for hists, ps in cases:
        dicts = []
        for pairs in hists:
            h: dict[int, int] = {}
            for x, n in pairs:
                h[bucket_of(x)] = h.get(bucket_of(x), 0) + n
            dicts.append(h)
        batch.append((dicts, ps))
    rs = core_py.stats_percentiles([([list(h.items()) for h in d], ps) for d, ps in batch])
    for (dicts, ps), got in zip(batch, rs, strict=True):
        assert_same(percentiles(dicts, tuple(ps)), got, (dicts, ps))


# --- pool statistics ---------------------------------------------------------------------------

LEVEL, DISPATCH, END, RETRY, FIXED, SNAPSHOT = range(6)


def run_stats(start: float, cap: int, window: float, ops: list[Any]) -> list[Any]:
    """Drive a Python PoolStats with `ops` (as leaves.rs reads them); its snapshots."""
    s = PoolStats(start, cap, window)
    out = []
    for op, now, x, a, b, flag in ops:
        if op == LEVEL:
            s.level(now, a, b)
        elif op == DISPATCH:
            s.on_dispatch(now, x, flag)
        elif op == END:
            s.on_attempt_end(now, x, flag)
        elif op == RETRY:
            s.on_retry(now)
        elif op == FIXED:
            s.on_fixed_start(now, flag)
        else:
            slots = [
                (
                    sl.sec,
                    [
                        sl.dispatched,
                        sl.adherent,
                        sl.succeeded,
                        sl.failed,
                        sl.retried,
                        sl.fixed,
                        sl.fixed_hits,
                    ],
                    [sl.busy_s, sl.cap_s, sl.success_s, sl.wait_sum],
                    sorted(sl.wait_hist.items()),
                    sorted(sl.run_hist.items()),
                )
                for sl in s.window_slots(now)
            ]
            m = s.summary(now)
            counts = [m[k] for k in SUMMARY_COUNTS]
            out.append((slots, counts, [m[k] for k in SUMMARY_FLOATS], s.worker_seconds))
    return out


def check_stats(core_py: ModuleType, cases: list[tuple[float, int, float, list[Any]]]) -> None:
    rs = core_py.stats_runs(cases)
    for case, got in zip(cases, rs, strict=True):
        assert_same(run_stats(*case), got, case)


gap = st.one_of(
    st.sampled_from(
        [0.0, 0.0, 1e-7, 0.05, 0.25, 0.5, 0.999, 1.0, 1.5, 2.5, 59.5, 60.0, 61.0, 130.3]
    ),
    st.floats(0.0, 200.0),
)
wait = st.one_of(
    st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 0.001, 0.5, 1.0, 1e300]),
    st.floats(0.0, 1e6),
    st.floats(-1.0, 0.0),
)
runtime = st.one_of(
    st.sampled_from([0.0, 0.2, 0.7, 1.3, 59.9, 60.0, 61.5, 130.25, -0.5]), st.floats(0.0, 300.0)
)
# (kind, time to it, wait, runtime, busy, capacity, flag, snapshot offset)
op_st = st.tuples(
    st.sampled_from([LEVEL, LEVEL, DISPATCH, DISPATCH, DISPATCH, END, END, RETRY, FIXED, SNAPSHOT]),
    gap,
    wait,
    runtime,
    st.integers(0, 20),
    st.integers(0, 20),
    st.booleans(),
    st.one_of(st.just(0.0), st.just(0.0), st.floats(-90.0, 90.0)),
)


@st.composite
def stats_case(draw: st.DrawFn) -> tuple[float, int, float, list[Any]]:
    start = draw(
        st.one_of(
            st.sampled_from([0.0, 0.3, 59.9, 1e6 + 0.25, 1.7e9 + 0.123]),
            st.floats(0.0, 2e9),
            st.floats(-200.0, 0.0),
        )
    )
    window = draw(
        st.one_of(
            st.just(60.0), st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.5, 61.0]), st.floats(0, 120)
        )
    )
    ops = []
    now = start
    for kind, dt, x, ran, busy, cap, flag, offset in draw(st.lists(op_st, max_size=60)):
        now += dt
        if kind == END:
            x = now - ran  # started_at
        # snapshots at arbitrary times (events go on from `now`, maybe before a snapshot)
        ops.append((kind, now + offset if kind == SNAPSHOT else now, x, busy, cap, flag))
    ops.append((SNAPSHOT, now, 0.0, 0, 0, False))
    return start, draw(st.integers(0, 20)), window, ops


@examples(150)
@given(cases=st.lists(stats_case(), min_size=1, max_size=6))
def test_pool_stats_match(core_py: ModuleType, cases: list[Any]) -> None:
    check_stats(core_py, cases)


def random_stats_case(r: random.Random) -> tuple[float, int, float, list[Any]]:
    start = r.choice([0.0, 0.3, 1.7e9 + 0.123, r.uniform(0, 2e9), r.uniform(-200, 0)])
    window = r.choice([60.0, 60.0, 0.5, 2.5, r.uniform(0, 120)])
    gaps = [0.0, 0.0, 1e-7, 0.05, 0.25, 0.5, 1.0, 1.5, 59.5, 60.0, 61.0]
    now, ops = start, []
    for _ in range(r.randint(0, 120)):
        now += r.choice(gaps) if r.random() < 0.7 else r.uniform(0, 150)
        kind = r.choice([LEVEL, LEVEL, DISPATCH, DISPATCH, DISPATCH, END, END, RETRY, FIXED])
        if r.random() < 0.05:
            kind = SNAPSHOT
        x = r.choice([0.0, 0.5, r.uniform(0, 1e4), r.uniform(0, 2)])
        if kind == END:
            x = now - r.choice([0.2, 1.3, 60.0, 61.5, r.uniform(0, 300)])
        at = now + r.uniform(-90, 90) if kind == SNAPSHOT and r.random() < 0.3 else now
        ops.append((kind, at, x, r.randint(0, 20), r.randint(0, 20), r.random() < 0.5))
    ops.append((SNAPSHOT, now, 0.0, 0, 0, False))
    return start, r.randint(0, 20), window, ops


def test_pool_stats_bulk(core_py: ModuleType) -> None:
    r = random.Random(34)
    for _ in range(3 * SCALE):
        check_stats(core_py, [random_stats_case(r) for _ in range(250)])
