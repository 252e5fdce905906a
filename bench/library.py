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

Usage: python bench/library.py [--n N] [--quick] [--profile {2a,2b,3}]

--quick uses small sizes (a smoke run of a few seconds). --profile runs one phase once under
cProfile (only the timed region is profiled) and prints the top functions by own time instead
of the benchmark. The exit status is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import math
import os
import platform
import pstats
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import cronoq
from cronoq import Pool, Scheduler, Task
from cronoq.core.engine import Engine
from cronoq.core.model import PoolConfig, TaskRecord

SLOTS = 64
POOL = "default"

# Targets, printed as PASS/MISS next to each figure.
TARGET_SEQ_RATIO = 0.3
TARGET_BATCH_RATIO = 0.4
TARGET_IDLE_P50_US = 50.0
TARGET_CORE_DECISIONS = 300_000.0
TARGET_BYTES_PER_TASK = 1024.0


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
)


async def noop(ctx: Any, p: Any) -> Any:
    return p


async def _trivial(i: int) -> int:
    return i


def _scheduler() -> Scheduler:
    return Scheduler([Pool(POOL, noop, autoscale=False, max=SLOTS)])


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _rate(x: float) -> str:
    return f"{x:,.0f}"


def _us(rate: float) -> str:
    return f"{1e6 / rate:.2f} us each"


def _percentile(sorted_xs: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(p * len(sorted_xs)))
    return sorted_xs[rank - 1]


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


async def phase_sequential(n: int, hook: Any = None) -> float:
    async with _scheduler() as sched:
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


def phase_core(backlog: int, completions: int, hook: Any = None) -> tuple[float, int]:
    """(elapsed seconds, completed cycles) of the virtual-clock engine loop."""
    t_start = 0.0
    eng = Engine([PoolConfig(POOL, capacity=SLOTS, min=SLOTS, max=SLOTS)], t_start)
    submit = eng.submit
    for i in range(backlog):
        submit(TaskRecord(None, POOL, i & 3), t_start)
    nxt = backlog
    done = 0
    step = 0
    advance = eng.advance
    dispatch = eng.dispatch
    take = eng.take
    complete = eng.complete
    with hook or _NoHook():
        t0 = time.perf_counter()
        while done < completions:
            step += 1
            now = t_start + step * 1e-6
            advance(now)
            dispatch(now)
            for att in take().starts:
                complete(att, now, None)
                submit(TaskRecord(None, POOL, nxt & 3), now)
                nxt += 1
                done += 1
        dt = time.perf_counter() - t0
    assert eng.totals["succeeded"] == done and eng.live == backlog, (eng.totals, eng.live)
    return dt, done


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


def _source() -> str:
    """Where cronoq was imported from, and its git commit (+ changed files under src/)."""
    where = os.path.dirname(os.path.abspath(cronoq.__file__))
    desc = f"cronoq {cronoq.__version__} from {where}"
    try:
        git = ["git", "-C", where]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=5
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return desc
    if head:
        changed = [ln[3:] for ln in dirty if ln.strip()]
        desc += f" (git {head}" + (f", uncommitted: {', '.join(changed)})" if changed else ")")
    return desc


def _header(sz: Sizes, quick: bool) -> None:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        affinity = os.cpu_count() or 0
    print("cronoq library benchmark" + (" (--quick sizes)" if quick else ""))
    print(f"python:   {platform.python_implementation()} {sys.version.split()[0]}")
    print(f"platform: {platform.platform()} ({platform.machine()})")
    print(f"source:   {_source()}")
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
        return _verdict(ok)

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
    p50 = _percentile(rt, 0.50) * 1e6
    p99 = _percentile(rt, 0.99) * 1e6
    print(
        f"[2c] idle round trip        {len(rt):,} samples: p50 {p50:.1f} us  p99 {p99:.1f} us  "
        f"target p50 <= {TARGET_IDLE_P50_US:.0f} us  {target(p50 <= TARGET_IDLE_P50_US)}"
    )

    core_runs: list[float] = []
    cycles = 0
    for _ in range(sz.core_reps):
        gc.collect()
        dt, cycles = phase_core(sz.core_backlog, sz.core_completions)
        core_runs.append(cycles / dt)
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
    else:
        gc.collect()
        dt, cycles = phase_core(sz.core_backlog, sz.core_completions, hook)
        what = f"phase 3, {cycles:,} cycles: {cycles / dt:,.0f} cycles/s under cProfile"
    print(f"source: {_source()}")
    print(what)
    print(hook.report(top))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="items for phases 1, 2a, 2b (20000)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument(
        "--profile",
        choices=("2a", "2b", "3"),
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
