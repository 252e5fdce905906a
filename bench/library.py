"""Library-mode benchmark of cronoq: throughput, latency, core speed and memory in one run.

Machines here are noisy, so every throughput figure is printed next to a baseline measured in the
same run (the asyncio floor), and throughput phases take the best of several interleaved runs.

Phases
------
[1]  asyncio floor: N items, one `asyncio.ensure_future` of a trivial coroutine per item, then
     every future awaited in order. This is the least an asyncio driver can spend per item.
[2a] `await sched.submit(i)` N times, then every handle awaited (64-slot fixed pool, no-op
     executor). Ratio to [1].
[2b] `await sched.submit_batch([Task(i) for i in range(N)])`, then every handle awaited; the time
     includes building the Task list. Ratio to [1].
[2c] idle round trip: submit one task and await its handle, one at a time, after a warm-up;
     p50 and p99 in microseconds.
[3]  the engine core alone on a virtual clock: one pool of 64 slots, a backlog queued up front
     (classes cycling 0..3), then per loop: time += 1 us, advance(), dispatch(), take(), complete
     every started attempt and submit a replacement (TaskRecord built in the loop). One cycle =
     one task submitted, dispatched and completed; one decision = one engine operation among
     submit, the start of one task by dispatch, and complete, so decisions = 3 x cycles.
[4]  memory per queued task with tracemalloc: traced bytes after queueing minus before, divided
     by the number queued (payload None, default options), once through Engine.submit with a
     TaskRecord and once through Scheduler.enqueue on a pool set to capacity 0.

[5a] fair share: the [3] loop on a pool with fair_share=True and 10,000 tenants; task i (backlog
     and replacements alike) belongs to tenant (i // 4) mod 10,000 and class i mod 4, so every
     tenant has tasks in every class and the tenant mix never changes. Ratio to [3].
[5b] dependency chains: 100,000 tasks in chains of 10, each task after the previous one of its
     chain by id (extra=Extras(deps=[(parent_id, "success")])), all submitted up front with plain
     submits chain by chain, then run to completion on 64 slots with the [3] loop (without
     replacements). Timed from the first submit to the last complete (building each TaskRecord
     included); decisions = submits + dispatches + completes. Ratio per decision to [3].
[5c] semaphore: the [3] loop where every task needs 1 permit of a semaphore resource of 8
     permits (extra=Extras(resources={"sem": 1})), so at most 8 of the 64 slots are busy. The first
     dispatch parks the whole backlog on the semaphore; it runs once before timing (its time is
     printed) so that the timed loop starts in the steady state, as [3] starts with the backlog
     queued. Ratio to [3].
[6]  O(log n) scaling: the [3] loop at backlogs of 10k, 100k and 1M queued tasks. To keep the
     run affordable each backlog is queued once (untimed), then each engine runs a few timed
     segments of 100,000 completions (interleaved across sizes, best segment counted, each capped
     at 10 s); replacements keep every backlog constant. Decisions/s at each size, its ratio to
     [3], and the ratio of the largest backlog to the smallest (target: >= 0.5x; a flat or gently
     falling series is O(log n) per decision).

[3], [5a], [5b] and [5c] run in interleaved rounds (best of `core_reps` each), so the ratios
compare figures measured side by side.

Usage: python bench/library.py [--n N] [--quick] [--profile {2a,2b,3,5a,5b,5c,6}]

--quick uses small sizes (a smoke run of a few seconds). --profile runs one phase once under
cProfile (only the timed region is profiled; for 6, one segment at the largest backlog) and
prints the top functions by own time instead of the benchmark. The exit status is 0 whether
targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import os
import pstats
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from _common import percentile, print_about, source, verdict
from cronoq import Pool, Scheduler, Task
from cronoq.core.engine import Engine
from cronoq.core.model import Extras, PoolConfig, TaskRecord
from cronoq.core.resources import ResourceConfig

SLOTS = 64
POOL = "default"

# Targets, printed as PASS/MISS next to each figure.
TARGET_SEQ_RATIO = 0.3
TARGET_BATCH_RATIO = 0.4
TARGET_IDLE_P50_US = 50.0
TARGET_CORE_DECISIONS = 300_000.0
TARGET_BYTES_PER_TASK = 1024.0
TARGET_CORE_RATIO = 0.5  # [5a]-[5c]: x [3]; [6]: largest backlog / smallest

SEM = "sem"
SEM_PERMITS = 8


@dataclass
class Sizes:
    n: int
    reps: int
    rt_warmup: int
    rt_samples: int
    core_backlog: int
    core_completions: int
    core_reps: int
    mem_engine: int
    mem_sched: int
    fair_tenants: int
    chain_tasks: int
    chain_len: int
    scale_backlogs: tuple[int, ...]
    scale_completions: int
    scale_segments: int
    scale_cap: float


FULL = Sizes(
    n=20_000,
    reps=3,
    rt_warmup=500,
    rt_samples=5_000,
    core_backlog=100_000,
    core_completions=300_000,
    core_reps=3,
    mem_engine=1_000_000,
    mem_sched=1_000_000,
    fair_tenants=10_000,
    chain_tasks=100_000,
    chain_len=10,
    scale_backlogs=(10_000, 100_000, 1_000_000),
    scale_completions=100_000,
    scale_segments=3,
    scale_cap=10.0,
)
QUICK = Sizes(
    n=2_000,
    reps=1,
    rt_warmup=100,
    rt_samples=500,
    core_backlog=5_000,
    core_completions=10_000,
    core_reps=1,
    mem_engine=20_000,
    mem_sched=20_000,
    fair_tenants=500,
    chain_tasks=5_000,
    chain_len=10,
    scale_backlogs=(1_000, 5_000, 20_000),
    scale_completions=5_000,
    scale_segments=1,
    scale_cap=10.0,
)


async def noop(ctx: Any, p: Any) -> Any:
    return p


async def _trivial(i: int) -> int:
    return i


def _scheduler(tracing: object = None) -> Scheduler:
    return Scheduler([Pool(POOL, noop, autoscale=False, max=SLOTS)], tracing=tracing)


def _rate(x: float) -> str:
    return f"{x:,.0f}"


def _us(rate: float) -> str:
    return f"{1e6 / rate:.2f} us each"


# --- phase bodies: each returns elapsed seconds of its timed region -------------------------
#
# `hook` (optional) is entered right before and left right after the timed region; the profile
# mode uses it to profile exactly what the benchmark times.


class _NoHook:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def phase_floor(n: int, hook: Any = None) -> float:
    ensure_future = asyncio.ensure_future
    with hook or _NoHook():
        t0 = time.perf_counter()
        futs = [ensure_future(_trivial(i)) for i in range(n)]
        for f in futs:
            await f
        dt = time.perf_counter() - t0
    assert all(f.done() for f in futs)
    return dt


async def phase_sequential(n: int, hook: Any = None, tracing: object = None) -> float:
    """Seconds for n sequential submits and their awaits (`tracing`: the Scheduler's)."""
    async with _scheduler(tracing) as sched:
        submit = sched.submit
        with hook or _NoHook():
            t0 = time.perf_counter()
            handles = [await submit(i) for i in range(n)]
            for h in handles:
                await h
            dt = time.perf_counter() - t0
        snap = await sched.snapshot()
        assert snap.totals["succeeded"] == n, snap.totals
    return dt


async def phase_batch(n: int, hook: Any = None) -> float:
    async with _scheduler() as sched:
        with hook or _NoHook():
            t0 = time.perf_counter()
            handles = await sched.submit_batch([Task(i) for i in range(n)])
            for h in handles:
                await h
            dt = time.perf_counter() - t0
        snap = await sched.snapshot()
        assert snap.totals["succeeded"] == n, snap.totals
    return dt


async def phase_roundtrip(warmup: int, samples: int) -> list[float]:
    """Seconds per idle submit + await, one task at a time (after `warmup` untimed ones)."""
    perf = time.perf_counter
    out: list[float] = []
    async with _scheduler() as sched:
        submit = sched.submit
        for i in range(warmup):
            await (await submit(i))
        for i in range(samples):
            t0 = perf()
            h = await submit(i)
            await h
            out.append(perf() - t0)
    out.sort()
    return out


def _steady(
    eng: Engine, make: Callable[[int], TaskRecord], first: int, completions: int, hook: Any
) -> tuple[float, int, int]:
    """(elapsed seconds, completed cycles, most starts in one step) of the steady loop that
    [3], [5a] and [5c] time: each step advances the virtual clock 1 us, dispatches, completes
    every start at once and submits `make(n)` in its place, so the backlog stays constant."""
    submit = eng.submit
    advance = eng.advance
    dispatch = eng.dispatch
    take = eng.take
    complete = eng.complete
    nxt = first
    done = 0
    step = 0
    peak = 0
    with hook or _NoHook():
        t0 = time.perf_counter()
        while done < completions:
            step += 1
            now = step * 1e-6
            advance(now)
            dispatch(now)
            starts = take().starts
            if len(starts) > peak:
                peak = len(starts)
            for att in starts:
                complete(att, now, None)
                submit(make(nxt), now)
                nxt += 1
                done += 1
        dt = time.perf_counter() - t0
    return dt, done, peak


def phase_core(backlog: int, completions: int, hook: Any = None) -> tuple[float, int]:
    """(elapsed seconds, completed cycles) of the virtual-clock engine loop."""
    eng = _core_engine()

    def make(i: int) -> TaskRecord:
        return TaskRecord(None, POOL, i & 3)

    for i in range(backlog):
        eng.submit(make(i), 0.0)
    dt, done, _ = _steady(eng, make, backlog, completions, hook)
    assert eng.totals["succeeded"] == done and eng.live == backlog, (eng.totals, eng.live)
    return dt, done


def _core_engine(**kw: Any) -> Engine:
    """An engine with one pool of 64 fixed slots, as in [3]; `kw` goes to PoolConfig."""
    return Engine([PoolConfig(POOL, capacity=SLOTS, min=SLOTS, max=SLOTS, **kw)], 0.0)


def phase_fair(backlog: int, completions: int, tenants: int, hook: Any = None) -> tuple[float, int]:
    """[5a]: the [3] loop on a fair-share pool; task i -> tenant (i // 4) % tenants, class i % 4."""
    names = [f"tenant-{j}" for j in range(tenants)]
    eng = _core_engine(fair_share=True)

    def make(i: int) -> TaskRecord:
        return TaskRecord(None, POOL, i & 3, tenant=names[(i >> 2) % tenants])

    for i in range(backlog):
        eng.submit(make(i), 0.0)
    dt, done, _ = _steady(eng, make, backlog, completions, hook)
    assert eng.totals["succeeded"] == done and eng.live == backlog, (eng.totals, eng.live)
    assert all(q.n for q in eng.pools[POOL].queues.classes)  # every class stayed populated
    return dt, done


@dataclass
class ChainRun:
    """[5b] result: elapsed seconds (total and the submit part) and decisions."""

    dt: float
    submit_dt: float
    decisions: int


def phase_chains(tasks: int, length: int, hook: Any = None) -> ChainRun:
    """[5b]: `tasks` tasks in chains of `length` (by id), submitted up front, run to the end."""
    t_start = 0.0
    chains = tasks // length
    eng = _core_engine()
    submit = eng.submit
    advance = eng.advance
    dispatch = eng.dispatch
    take = eng.take
    complete = eng.complete
    done = 0
    step = 0
    with hook or _NoHook():
        t0 = time.perf_counter()
        for c in range(chains):
            cls = c & 3
            prev = TaskRecord(None, POOL, cls)
            submit(prev, t_start)
            for _ in range(length - 1):
                rec = TaskRecord(None, POOL, cls, extra=Extras(deps=[(prev.id, "success")]))
                submit(rec, t_start)
                prev = rec
        t1 = time.perf_counter()
        total = chains * length
        while done < total:
            step += 1
            now = t_start + step * 1e-6
            advance(now)
            dispatch(now)
            starts = take().starts
            assert starts, "no task started: the chains are stuck"
            for att in starts:
                complete(att, now, None)
                done += 1
        dt = time.perf_counter() - t0
    tot = eng.totals
    assert tot["succeeded"] == total and eng.live == 0, (tot, eng.live)
    return ChainRun(dt, t1 - t0, tot["submitted"] + tot["dispatched"] + tot["succeeded"])


def phase_semaphore(backlog: int, completions: int, hook: Any = None) -> tuple[float, int, float]:
    """[5c]: (elapsed seconds, completed cycles, seconds of the untimed first dispatch) of the
    [3] loop where every task needs one permit of an 8-permit semaphore."""
    eng = Engine(
        [PoolConfig(POOL, capacity=SLOTS, min=SLOTS, max=SLOTS)],
        0.0,
        resources=[ResourceConfig(SEM, "semaphore", permits=SEM_PERMITS)],
    )

    def make(i: int) -> TaskRecord:
        return TaskRecord(None, POOL, i & 3, extra=Extras(resources={SEM: 1}))

    for i in range(backlog):
        eng.submit(make(i), 0.0)
    # The first dispatch starts 8 tasks and parks the rest of the backlog on the semaphore:
    # setup, like queueing the backlog. Its starts are taken by the first timed loop.
    t0 = time.perf_counter()
    eng.dispatch(0.0)
    prime = time.perf_counter() - t0
    sem = eng.resources[SEM]
    dt, done, peak = _steady(eng, make, backlog, completions, hook)
    assert eng.totals["succeeded"] == done and eng.live == backlog, (eng.totals, eng.live)
    assert peak == SEM_PERMITS and sem.in_use <= SEM_PERMITS, (peak, sem.in_use)
    return dt, done, prime


class ScaleEngine:
    """[6]: a [3] engine with `backlog` queued tasks, kept between timed segments of the loop."""

    def __init__(self, backlog: int) -> None:
        t0 = time.perf_counter()
        self.backlog = backlog
        self.eng = eng = _core_engine()
        submit = eng.submit
        for i in range(backlog):
            submit(TaskRecord(None, POOL, i & 3), 0.0)
        self.build = time.perf_counter() - t0
        self.nxt = backlog
        self.step = 0
        self.done = 0

    def run(self, completions: int, cap: float, hook: Any = None) -> tuple[float, int]:
        """(elapsed seconds, completed cycles) of one segment; stops early after `cap` seconds."""
        eng = self.eng
        submit = eng.submit
        advance = eng.advance
        dispatch = eng.dispatch
        take = eng.take
        complete = eng.complete
        perf = time.perf_counter
        nxt = self.nxt
        step = self.step
        done = 0
        with hook or _NoHook():
            t0 = perf()
            while done < completions:
                step += 1
                now = step * 1e-6
                advance(now)
                dispatch(now)
                for att in take().starts:
                    complete(att, now, None)
                    submit(TaskRecord(None, POOL, nxt & 3), now)
                    nxt += 1
                    done += 1
                if perf() - t0 >= cap:
                    break
            dt = perf() - t0
        self.nxt = nxt
        self.step = step
        self.done += done
        assert eng.totals["succeeded"] == self.done and eng.live == self.backlog
        return dt, done


@dataclass
class ScalePoint:
    """[6] result at one backlog: untimed queueing time, cycles/s and cycles of each segment."""

    backlog: int
    build: float
    rates: list[float]
    cycles: list[int]


def phase_scale(
    backlogs: tuple[int, ...], completions: int, segments: int, cap: float
) -> list[ScalePoint]:
    """[6]: every backlog's engine is built once, then segments run interleaved across sizes."""
    engines: list[ScaleEngine] = []
    points: list[ScalePoint] = []
    for b in backlogs:
        gc.collect()
        se = ScaleEngine(b)
        engines.append(se)
        points.append(ScalePoint(b, se.build, [], []))
    for _ in range(segments):
        for se, pt in zip(engines, points, strict=True):
            gc.collect()
            dt, done = se.run(completions, cap)
            pt.rates.append(done / dt)
            pt.cycles.append(done)
    del engines, se
    gc.collect()
    return points


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def phase_mem_engine(n: int) -> tuple[float, float]:
    """(bytes per queued task, seconds) through Engine.submit with a fresh TaskRecord each."""
    tracemalloc.start()
    try:
        eng = Engine([PoolConfig(POOL, capacity=0, min=0, max=SLOTS)], 0.0)
        submit = eng.submit
        base = _traced()
        t0 = time.perf_counter()
        for i in range(n):
            # A distinct time per submit, as a real clock would give.
            submit(TaskRecord(None, POOL), i * 1e-6)
        dt = time.perf_counter() - t0
        used = _traced() - base
        assert eng.pools[POOL].queues.n == n
    finally:
        tracemalloc.stop()
    del eng
    return used / n, dt


async def phase_mem_scheduler(n: int) -> tuple[float, float]:
    """(bytes per queued task, seconds) through Scheduler.enqueue on a capacity-0 pool."""
    tracemalloc.start()
    try:
        async with _scheduler() as sched:
            await sched.set_capacity(POOL, 0)
            await asyncio.sleep(0)  # let the capacity change's pump run before the baseline
            enqueue = sched.enqueue
            base = _traced()
            t0 = time.perf_counter()
            for i in range(n):
                await enqueue(None)
                del i
            dt = time.perf_counter() - t0
            used = _traced() - base
            snap = await sched.snapshot()
            assert snap.pending == n and snap.running == 0, (snap.pending, snap.running)
    finally:
        tracemalloc.stop()
    return used / n, dt


# --- the run -------------------------------------------------------------------------------


def _header(sz: Sizes, quick: bool) -> None:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        affinity = os.cpu_count() or 0
    print_about("cronoq library benchmark" + (" (--quick sizes)" if quick else ""))
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):  # not on every platform
        load = "n/a"
    print(f"cpus:     {os.cpu_count()} (usable by this process: {affinity}); load average {load}")
    print(
        f"sizes:    N={sz.n:,}, best of {sz.reps} interleaved runs for [1]/[2a]/[2b]; "
        f"round trips {sz.rt_samples:,} after {sz.rt_warmup:,} warm-up; "
        f"core backlog {sz.core_backlog:,}, {sz.core_completions:,} completions, "
        f"best of {sz.core_reps}"
    )
    print("clock:    time.perf_counter; gc.collect() between phases; gc stays on while timing")
    print()


async def _async_phases(sz: Sizes) -> dict[str, Any]:
    n = sz.n
    runs: dict[str, list[float]] = {"floor": [], "seq": [], "batch": []}
    phases: list[tuple[str, Callable[[int], Awaitable[float]]]] = [
        ("floor", phase_floor),
        ("seq", phase_sequential),
        ("batch", phase_batch),
    ]
    # Warm-up: one small run of each so imports, code objects and allocator pools are hot.
    for _, fn in phases:
        await fn(min(n, 1000))
    for _ in range(sz.reps):
        for name, fn in phases:
            gc.collect()
            runs[name].append(n / await fn(n))
    gc.collect()
    rt = await phase_roundtrip(sz.rt_warmup, sz.rt_samples)
    gc.collect()
    return {"runs": runs, "rt": rt}


def _fmt_runs(xs: list[float]) -> str:
    return "runs " + " ".join(f"{x / 1000:.0f}k" for x in xs)


def run(sz: Sizes, quick: bool) -> int:
    _header(sz, quick)
    res = asyncio.run(_async_phases(sz))
    runs = res["runs"]
    floor = max(runs["floor"])
    seq = max(runs["seq"])
    batch = max(runs["batch"])
    misses = 0
    total = 0

    def target(ok: bool) -> str:
        nonlocal misses, total
        total += 1
        misses += not ok
        return verdict(ok)

    n = sz.n
    print(
        f"[1]  asyncio floor          N={n:,}: {_rate(floor):>10} items/s ({_us(floor)})   "
        f"({_fmt_runs(runs['floor'])})"
    )
    r = seq / floor
    print(
        f"[2a] sequential submit      N={n:,}: {_rate(seq):>10} tasks/s ({_us(seq)})   "
        f"{r:.2f}x floor  "
        f"target >= {TARGET_SEQ_RATIO}x  {target(r >= TARGET_SEQ_RATIO)}   "
        f"({_fmt_runs(runs['seq'])})"
    )
    r = batch / floor
    print(
        f"[2b] submit_batch           N={n:,}: {_rate(batch):>10} tasks/s ({_us(batch)})   "
        f"{r:.2f}x floor  "
        f"target >= {TARGET_BATCH_RATIO}x  {target(r >= TARGET_BATCH_RATIO)}   "
        f"({_fmt_runs(runs['batch'])})"
    )
    rt = res["rt"]
    p50 = percentile(rt, 0.50) * 1e6
    p99 = percentile(rt, 0.99) * 1e6
    print(
        f"[2c] idle round trip        {len(rt):,} samples: p50 {p50:.1f} us  p99 {p99:.1f} us  "
        f"target p50 <= {TARGET_IDLE_P50_US:.0f} us  {target(p50 <= TARGET_IDLE_P50_US)}"
    )

    # [3] and its variants [5a]-[5c] in interleaved rounds, so their ratios compare figures
    # measured side by side; [5] is printed after [4].
    core_runs: list[float] = []
    fair_runs: list[float] = []
    chain_runs: list[ChainRun] = []
    sem_runs: list[float] = []
    sem_primes: list[float] = []
    cycles = fair_cycles = sem_cycles = 0
    for _ in range(sz.core_reps):
        gc.collect()
        dt, cycles = phase_core(sz.core_backlog, sz.core_completions)
        core_runs.append(cycles / dt)
        gc.collect()
        dt, fair_cycles = phase_fair(sz.core_backlog, sz.core_completions, sz.fair_tenants)
        fair_runs.append(fair_cycles / dt)
        gc.collect()
        chain_runs.append(phase_chains(sz.chain_tasks, sz.chain_len))
        gc.collect()
        dt, sem_cycles, prime = phase_semaphore(sz.core_backlog, sz.core_completions)
        sem_runs.append(sem_cycles / dt)
        sem_primes.append(prime)
    gc.collect()
    cyc = max(core_runs)
    dec = 3 * cyc
    print(
        f"[3]  core, virtual clock    {cycles:,} completions: "
        f"{_rate(cyc):>10} cycles/s ({_us(cyc)})  {_rate(dec)} decisions/s  "
        f"target >= {TARGET_CORE_DECISIONS:,.0f} decisions/s  "
        f"{target(dec >= TARGET_CORE_DECISIONS)}   ({_fmt_runs(core_runs)} cycles/s)"
    )
    print(
        "     decision = one engine operation: a submit, the start of one task by dispatch, or a "
        "complete; cycle = submit + dispatch + complete of one task = 3 decisions "
        f"({SLOTS} slots, backlog {sz.core_backlog:,}, 1 us of virtual time per loop; "
        "advance()/take() and building each TaskRecord are counted in the time)"
    )

    per, secs = phase_mem_engine(sz.mem_engine)
    gc.collect()
    print(
        f"[4a] memory, Engine.submit  {sz.mem_engine:,} queued: {per:,.0f} B/task  "
        f"target <= {TARGET_BYTES_PER_TASK:.0f} B  {target(per <= TARGET_BYTES_PER_TASK)}   "
        f"(queued in {secs:.1f} s under tracemalloc)"
    )
    per, secs = asyncio.run(phase_mem_scheduler(sz.mem_sched))
    gc.collect()
    print(
        f"[4b] memory, sched.enqueue  {sz.mem_sched:,} queued: {per:,.0f} B/task  "
        f"target <= {TARGET_BYTES_PER_TASK:.0f} B  {target(per <= TARGET_BYTES_PER_TASK)}   "
        f"(queued in {secs:.1f} s under tracemalloc; pool capacity 0)"
    )

    def vs_core(label: str, r: float) -> str:
        return (
            f"{r:.3f}x [3]{label}  target >= {TARGET_CORE_RATIO}x  {target(r >= TARGET_CORE_RATIO)}"
        )

    fair = max(fair_runs)
    print(
        f"[5a] core, fair share       {fair_cycles:,} completions: "
        f"{_rate(fair):>10} cycles/s ({_us(fair)})  {_rate(3 * fair)} decisions/s  "
        f"{vs_core('', fair / cyc)}   ({_fmt_runs(fair_runs)} cycles/s)"
    )
    print(
        f"     one pool, {SLOTS} slots, fair_share=True, {sz.fair_tenants:,} tenants: task i "
        f"(backlog {sz.core_backlog:,} and replacements) is tenant (i // 4) mod "
        f"{sz.fair_tenants:,}, class i mod 4; otherwise the [3] loop"
    )
    best = max(chain_runs, key=lambda c: c.decisions / c.dt)
    chain_dec = [c.decisions / c.dt for c in chain_runs]
    crate = best.decisions / best.dt
    print(
        f"[5b] core, dependency chains {sz.chain_tasks:,} tasks in chains of {sz.chain_len}: "
        f"{_rate(crate):>10} decisions/s ({1e6 / crate:.2f} us per decision)  "
        f"{vs_core(' per decision', crate / dec)}   ({_fmt_runs(chain_dec)} decisions/s)"
    )
    print(
        f"     decisions = submits + dispatches + completes = {best.decisions:,}; every task "
        "after the previous of its chain by id (extra=Extras(deps=[(parent_id, 'success')])), "
        f"plain submits chain by chain, then run to the end on {SLOTS} slots; best run: "
        f"submits {best.submit_dt:.2f} s + run {best.dt - best.submit_dt:.2f} s, "
        "TaskRecord building included"
    )
    sem = max(sem_runs)
    print(
        f"[5c] core, semaphore        {sem_cycles:,} completions: "
        f"{_rate(sem):>10} cycles/s ({_us(sem)})  {_rate(3 * sem)} decisions/s  "
        f"{vs_core('', sem / cyc)}   ({_fmt_runs(sem_runs)} cycles/s)"
    )
    print(
        f"     one pool, {SLOTS} slots; every task needs 1 permit of a semaphore of "
        f"{SEM_PERMITS} permits (extra=Extras(resources={{'{SEM}': 1}})), "
        f"so {SEM_PERMITS} run at a time; "
        f"the first dispatch parks the backlog of {sz.core_backlog:,} on the semaphore and runs "
        f"before timing ({min(sem_primes):.2f} s); otherwise the [3] loop"
    )

    points = phase_scale(sz.scale_backlogs, sz.scale_completions, sz.scale_segments, sz.scale_cap)
    lo, hi = points[0], points[-1]
    r = max(hi.rates) / max(lo.rates)
    print(
        f"[6]  core, O(log n) scaling backlog {lo.backlog:,} -> {hi.backlog:,}: "
        f"decisions/s at {hi.backlog:,} / at {lo.backlog:,} = {r:.3f}x  "
        f"target >= {TARGET_CORE_RATIO}x  {target(r >= TARGET_CORE_RATIO)}"
    )
    for pt in points:
        best_rate = max(pt.rates)
        print(
            f"     backlog {pt.backlog:>10,}: {_rate(3 * best_rate):>10} decisions/s "
            f"({1e6 / (3 * best_rate):.2f} us per decision)  {best_rate / cyc:.2f}x [3]   "
            f"({_fmt_runs([3 * x for x in pt.rates])} decisions/s; "
            f"{sum(pt.cycles):,} completions; queued untimed in {pt.build:.1f} s)"
        )
    capped = any(c < sz.scale_completions for pt in points for c in pt.cycles)
    print(
        f"     kept affordable: each backlog queued once, then {sz.scale_segments} timed "
        f"segment(s) of {sz.scale_completions:,} completions per size, interleaved across "
        f"sizes, best segment counted, each capped at {sz.scale_cap:.0f} s"
        + (" (the cap cut some segments short)" if capped else " (no segment hit the cap)")
        + "; otherwise the [3] loop"
    )
    print()
    print(f"targets:  {total - misses}/{total} met")
    return 0


# --- profile mode --------------------------------------------------------------------------


class _Profiling:
    def __init__(self) -> None:
        self.prof = cProfile.Profile()

    def __enter__(self) -> None:
        self.prof.enable()

    def __exit__(self, *exc: object) -> None:
        self.prof.disable()

    def report(self, top: int) -> str:
        buf = io.StringIO()
        st = pstats.Stats(self.prof, stream=buf)
        st.sort_stats("tottime").print_stats(top)
        return buf.getvalue()


def profile(phase: str, sz: Sizes, top: int) -> int:
    hook = _Profiling()
    if phase in ("2a", "2b"):
        fn = phase_sequential if phase == "2a" else phase_batch

        async def go() -> float:
            await fn(min(sz.n, 1000))  # warm-up, not profiled
            gc.collect()
            return await fn(sz.n, hook)

        dt = asyncio.run(go())
        what = f"phase {phase}, N={sz.n:,}: {sz.n / dt:,.0f} tasks/s under cProfile"
    elif phase == "3":
        gc.collect()
        dt, cycles = phase_core(sz.core_backlog, sz.core_completions, hook)
        what = f"phase 3, {cycles:,} cycles: {cycles / dt:,.0f} cycles/s under cProfile"
    elif phase == "5a":
        gc.collect()
        dt, cycles = phase_fair(sz.core_backlog, sz.core_completions, sz.fair_tenants, hook)
        what = f"phase 5a, {cycles:,} cycles: {cycles / dt:,.0f} cycles/s under cProfile"
    elif phase == "5b":
        gc.collect()
        cr = phase_chains(sz.chain_tasks, sz.chain_len, hook)
        what = (
            f"phase 5b, {cr.decisions:,} decisions: {cr.decisions / cr.dt:,.0f} decisions/s "
            "under cProfile"
        )
    elif phase == "5c":
        gc.collect()
        dt, cycles, _ = phase_semaphore(sz.core_backlog, sz.core_completions, hook)
        what = f"phase 5c, {cycles:,} cycles: {cycles / dt:,.0f} cycles/s under cProfile"
    else:
        gc.collect()
        se = ScaleEngine(sz.scale_backlogs[-1])
        se.run(sz.scale_completions, sz.scale_cap)  # warm-up segment, not profiled
        gc.collect()
        dt, cycles = se.run(sz.scale_completions, sz.scale_cap, hook)
        what = (
            f"phase 6, backlog {se.backlog:,}, {cycles:,} cycles: {cycles / dt:,.0f} cycles/s "
            "under cProfile"
        )
    print(f"source: {source()}")
    print(what)
    print(hook.report(top))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="items for phases 1, 2a, 2b (20000)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument(
        "--profile",
        choices=("2a", "2b", "3", "5a", "5b", "5c", "6"),
        default=None,
        help="profile one phase with cProfile and print the top functions by own time",
    )
    ap.add_argument("--top", type=int, default=15, help="functions shown with --profile (15)")
    args = ap.parse_args(argv)
    base = QUICK if args.quick else FULL
    sz = Sizes(**{**base.__dict__, **({"n": args.n} if args.n is not None else {})})
    if sz.n < 1:
        ap.error("--n must be >= 1")
    if args.profile:
        return profile(args.profile, sz, args.top)
    return run(sz, args.quick)


if __name__ == "__main__":
    sys.exit(main())
