"""App-layer benchmark: task functions (`cronoq.App`) against what they wrap, in one run.

The app layer (src/cronoq/app) is built on the published API: in library mode one `Scheduler`
whose pool executor routes each attempt to its function by kind, in server mode a
`cronoq.client.Worker` whose handler decodes the JSON envelope, calls the function and encodes
its result. Each phase measures what the layer adds: the same work through the app and
through the plain API it wraps, side by side in the same process or against the same server,
in interleaved rounds (the order alternating from one round to the next), because machines
here are noisy.

Phases
------
[1a] library mode, submit all then await all: CPU time (time.process_time, which counts this
     process's every thread) per task of N tasks submitted one by one and then every handle
     awaited, as bench/library.py [2a] does. Plain: `Scheduler([Pool("default", run, max=64,
     autoscale=False)])` with `async def run(ctx, payload): return None`, submitting
     `await sched.submit(i)`. App: `app.local()` of an app with `app.pool("default", max=64,
     autoscale=False)` and one `@app.task async def noop(n: int) -> None`, submitting
     `await noop.submit(i)` (the envelope {"n": i}). The scheduler's start and stop are not
     timed. Median CPU per task of each side, and the median of the rounds' app/plain ratios
     (target <= 1.2x).
[1b] library mode, one at a time: the same two sides, each task submitted and awaited before
     the next (bench/library.py [2c]'s pattern), N tasks after a warm-up of N / 10. Median
     CPU per task and ratio (target <= 1.2x).
[2]  server mode: one `cronoq-server` process (bench/server.py's configuration: memory store,
     pool `default` of max 256, its default transport) serves the whole phase. Each round, each
     worker in turn (a process of its own, 64 slots, connected alone): the plain
     `cronoq.client.Worker` with a no-op handler (`async def handle(lease): return None`), and
     `app.worker(target, "default", slots=64)` of the app above. N tasks of kind "noop" with
     the payload {"n": 1} (content type application/json: what the app's `noop.submit(1)`
     sends; the plain worker ignores it) are submitted by Tasks.SubmitBatch with the raw stubs,
     in batches of limits.max_tasks_per_batch from 4 concurrent callers (requests built before
     timing), and the round ends when N more have succeeded. Leases/s, the worker process's
     CPU per lease (utime + stime from /proc) and the server's CPU per task. Medians over the
     rounds, and the median of the rounds' app/plain leases/s ratios (target >= 0.9x).

Usage: python bench/app.py [--n N] [--server-n N] [--rounds R] [--quick] [--only library,server]
       python bench/app.py --profile [--n N] [--rounds R] [--top K]
       python bench/app.py --instructions

--quick uses small sizes (a smoke run, one round). --profile runs [1a] for each side under
cProfile (only the timed region; --rounds interleaved runs, 3 unless told, medians per
function) and prints, per task, the time in the garbage collector, the functions whose own
time differs most between the two sides and the app layer's own functions, instead of the
benchmark.
--instructions counts instructions per task of [1a] and [1b] with valgrind's callgrind (as
bench/ab.py --instructions does: each side at two sizes, the difference divided by the
difference of sizes, so start-up cancels out), which the machine's load does not change. The
exit status is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import gc
import os
import pstats
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import grpc

from _common import print_about, print_cpus, verdict
from cronoq import App, Pool, Scheduler
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from server import (
    BATCH,
    POOL,
    SLOTS,
    Client,
    Proc,
    ServerRun,
    config,
    connect,
    phase_server,
    start_server,
    workers_connected,
)

TARGET_LIBRARY_RATIO = 1.2  # [1a], [1b]: app CPU per task / plain
TARGET_SERVER_RATIO = 0.9  # [2]: app worker leases/s / plain worker's
KIND = "noop"
ENVELOPE = b'{"n": 1}'
JSON = "application/json"

APP = App("bench")
APP.pool(POOL, max=SLOTS, autoscale=False)


@APP.task
async def noop(n: int) -> None:
    return None


async def run(ctx: Any, payload: Any) -> None:
    return None


def plain_scheduler() -> Scheduler:
    return Scheduler([Pool(POOL, run, max=SLOTS, autoscale=False)])


@dataclass
class Sizes:
    n: int  # library mode tasks per run
    server_n: int  # server mode tasks per worker per round
    rounds: int


FULL = Sizes(n=20_000, server_n=20_000, rounds=5)
QUICK = Sizes(n=2_000, server_n=1_000, rounds=1)


# --- library mode --------------------------------------------------------------------------------
#
# Each body returns CPU seconds per task of its timed region; `hook` (optional) is entered right
# before and left right after it (the profile mode profiles exactly what is timed).


class _NoHook:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


Side = Callable[[], AbstractAsyncContextManager[tuple[Scheduler, Callable[[int], Any]]]]


@contextlib.asynccontextmanager
async def plain_side() -> AsyncIterator[tuple[Scheduler, Callable[[int], Any]]]:
    """A plain Scheduler and its `submit`."""
    async with plain_scheduler() as sched:
        yield sched, sched.submit


@contextlib.asynccontextmanager
async def app_side() -> AsyncIterator[tuple[Scheduler, Callable[[int], Any]]]:
    """The app's scheduler and the task function's `submit`."""
    async with APP.local() as sched:
        yield sched, noop.submit


async def submit_all(side: Side, n: int, hook: Any = None) -> float:
    async with side() as (sched, submit):
        with hook or _NoHook():
            c0 = time.process_time()
            handles = [await submit(i) for i in range(n)]
            for h in handles:
                await h
            cpu = time.process_time() - c0
        snap = await sched.snapshot()
    assert snap.totals["succeeded"] == n, snap.totals
    return cpu / n


async def one_at_a_time(side: Side, n: int, hook: Any = None) -> float:
    async with side() as (_, submit):
        for i in range(n // 10):
            await (await submit(i))
        with hook or _NoHook():
            c0 = time.process_time()
            for i in range(n):
                await (await submit(i))
            cpu = time.process_time() - c0
    return cpu / n


plain_all = functools.partial(submit_all, plain_side)
app_all = functools.partial(submit_all, app_side)
plain_one = functools.partial(one_at_a_time, plain_side)
app_one = functools.partial(one_at_a_time, app_side)

Body = Callable[..., Awaitable[float]]
LIBRARY: dict[str, tuple[str, Body, Body]] = {
    "1a": ("submit all, then await all", plain_all, app_all),
    "1b": ("one at a time", plain_one, app_one),
}


@dataclass
class Pair:
    """One phase's rounds: seconds per task of each side, in round order."""

    plain: list[float]
    app: list[float]

    def ratios(self) -> list[float]:
        return [a / p for p, a in zip(self.plain, self.app, strict=True)]


async def measure_library(sz: Sizes) -> dict[str, Pair]:
    out = {phase: Pair([], []) for phase in LIBRARY}
    for _, plain, app in LIBRARY.values():  # warm-up: imports, code objects, allocator pools
        await plain(min(sz.n, 1000))
        await app(min(sz.n, 1000))
    for r in range(sz.rounds):
        for phase, (_, plain, app) in LIBRARY.items():
            order = [("plain", plain), ("app", app)]
            for side, body in order if r % 2 == 0 else order[::-1]:
                gc.collect()
                getattr(out[phase], side).append(await body(sz.n))
    return out


# --- server mode ---------------------------------------------------------------------------------


async def plain_worker_main(target: str) -> None:
    """The plain `cronoq.client.Worker` with a no-op handler, until SIGTERM."""
    from cronoq.client import Lease, Worker

    async def handle(lease: Lease) -> None:
        return None

    await _serve(Worker(target, POOL, handle, slots=SLOTS, name="bench", reconnect=False))


async def app_worker_main(target: str) -> None:
    """The app's worker for the pool (the `noop` task function), until SIGTERM."""
    await _serve(APP.worker(target, POOL, slots=SLOTS, name="bench", reconnect=False))


async def _serve(worker: Any) -> None:
    serving = asyncio.create_task(worker.run())
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop())
    )
    await worker.wait_registered(30)
    print(f"registered slots={worker.granted_slots}", flush=True)
    await serving


def _me(role: str, target: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--role", role, "--target", target]


async def phase_worker(client: Client, server: Proc, role: str, target: str, n: int) -> ServerRun:
    """N "noop" tasks with the envelope payload by SubmitBatch, served by the worker `role`."""
    worker = Proc(_me(role, target), role)
    try:
        granted = int(worker.expect(r"^registered slots=(\d+)").group(1))
        assert granted == SLOTS, granted
        await asyncio.wait_for(workers_connected(client, 1), 120)
        spec = pb.TaskSpec(kind=KIND, payload=ENVELOPE, content_type=JSON)
        run = await phase_server(client, n, server, worker, spec)
        snap = await client.admin.Snapshot(pb.Empty())
        assert snap.totals.failed == 0, snap.totals  # the app worker ran every envelope
    finally:
        worker.stop()
        await asyncio.wait_for(workers_connected(client, 0), 120)
    return run


@dataclass
class ServerPair:
    plain: list[ServerRun]
    app: list[ServerRun]


async def measure_server(sz: Sizes) -> ServerPair:
    out = ServerPair([], [])
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-") as tmp:
        cfg = os.path.join(tmp, "server.toml")
        with open(cfg, "w") as f:
            f.write(config())
        server, target = start_server(cfg)
        try:
            async with connect(target) as client:
                warm = min(sz.server_n, 2 * BATCH)
                await phase_worker(client, server, "plain-worker", target, warm)
                await phase_worker(client, server, "app-worker", target, warm)
                for r in range(sz.rounds):
                    order = [("plain", "plain-worker"), ("app", "app-worker")]
                    for side, role in order if r % 2 == 0 else order[::-1]:
                        got = await phase_worker(client, server, role, target, sz.server_n)
                        getattr(out, side).append(got)
        finally:
            server.stop()
    return out


# --- the report ----------------------------------------------------------------------------------


def _us(xs: list[float]) -> str:
    return " ".join(f"{x * 1e6:.1f}" for x in xs)


def report_library(sz: Sizes, res: dict[str, Pair]) -> tuple[int, int]:
    met = 0
    for phase, (what, _, _) in LIBRARY.items():
        pair = res[phase]
        plain = statistics.median(pair.plain)
        app = statistics.median(pair.app)
        ratio = statistics.median(pair.ratios())
        ok = ratio <= TARGET_LIBRARY_RATIO
        met += ok
        label = f"[{phase}] library, {what}"
        print(
            f"{label:<40} N={sz.n:,}: plain {plain * 1e6:.1f} us, app {app * 1e6:.1f} us CPU "
            f"per task = {ratio:.2f}x  target <= {TARGET_LIBRARY_RATIO}x  {verdict(ok)}"
        )
        print(
            f"     rounds (us per task): plain {_us(pair.plain)}; app {_us(pair.app)}; "
            f"ratios {' '.join(f'{x:.2f}' for x in pair.ratios())}; app - plain "
            f"{(app - plain) * 1e6:+.1f} us per task"
        )
    return met, len(LIBRARY)


def report_server(sz: Sizes, res: ServerPair) -> tuple[int, int]:
    ratios = [a.rate / p.rate for p, a in zip(res.plain, res.app, strict=True)]
    ratio = statistics.median(ratios)
    ok = ratio >= TARGET_SERVER_RATIO
    for side, runs in (("plain Worker", res.plain), ("app worker", res.app)):
        print(
            f"     {side:<13} {statistics.median(r.rate for r in runs):>7,.0f} leases/s   "
            f"worker CPU {statistics.median(r.worker_cpu for r in runs) * 1e6:>5.0f} us/lease   "
            f"server {statistics.median(r.server_cpu for r in runs) * 1e6:>4.0f} us/task   "
            f"runs {' '.join(f'{r.rate / 1000:.2f}k' for r in runs)}"
        )
    cpu = [a.worker_cpu / p.worker_cpu for p, a in zip(res.plain, res.app, strict=True)]
    print(
        f"[2]  server, app worker vs plain Worker N={sz.server_n:,}: {ratio:.2f}x leases/s "
        f"(rounds {' '.join(f'{x:.2f}' for x in ratios)})  target >= {TARGET_SERVER_RATIO}x  "
        f"{verdict(ok)}; worker CPU per lease {statistics.median(cpu):.2f}x"
    )
    return int(ok), 1


def _header(title: str, sz: Sizes, only: list[str]) -> None:
    print_about(title, f"; grpcio {grpc.__version__}")
    print_cpus("this process" + (", the server, one worker at a time" if "server" in only else ""))
    print(
        f"sizes:    library N={sz.n:,} per run; server N={sz.server_n:,} per worker per round, "
        f"SubmitBatch of {BATCH:,}; {sz.rounds} interleaved round(s), medians; pool "
        f"{POOL!r}, {SLOTS} slots\n"
    )


async def bench(sz: Sizes, only: list[str]) -> int:
    met = total = 0
    if "library" in only:
        m, t = report_library(sz, await measure_library(sz))
        met, total = met + m, total + t
    if "server" in only:
        m, t = report_server(sz, await measure_server(sz))
        met, total = met + m, total + t
    print(f"\ntargets:  {met}/{total} met")
    return 0


# --- --profile -----------------------------------------------------------------------------------


class _Profiled:
    def __init__(self, prof: cProfile.Profile) -> None:
        self.prof = prof

    def __enter__(self) -> None:
        self.prof.enable()

    def __exit__(self, *exc: object) -> None:
        self.prof.disable()


class _GcTime:
    """CPU seconds spent in the garbage collector, and its collections by generation, while
    the block runs (cProfile charges a collection to the function whose allocation set it
    off)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t0 = 0.0

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds += time.process_time() - self._t0
            self.collections[info["generation"]] += 1

    def __enter__(self) -> _GcTime:
        gc.callbacks.append(self._on)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on)


Key = tuple[str, int, str]


def _own(stats: pstats.Stats) -> dict[Key, tuple[int, float, float]]:
    """(calls, own seconds, cumulative seconds) by function."""
    raw: dict[Key, Any] = stats.stats  # type: ignore[attr-defined]
    return {k: (v[1], v[2], v[3]) for k, v in raw.items()}


def _name(key: Key) -> str:
    file, line, func = key
    if file == "~":
        return func
    src = file.split("/src/", 1)[-1] if "/src/cronoq/" in file else os.path.basename(file)
    return f"{src}:{line}({func})"


def _median_stats(runs: list[dict[Key, tuple[int, float, float]]]) -> dict[Key, Any]:
    """Per function: its calls, and the medians of its own and cumulative times over runs."""
    keys = set().union(*runs)
    zero = (0, 0.0, 0.0)
    return {
        k: (
            max(r.get(k, zero)[0] for r in runs),
            statistics.median(r.get(k, zero)[1] for r in runs),
            statistics.median(r.get(k, zero)[2] for r in runs),
        )
        for k in keys
    }


async def profile(n: int, top: int, rounds: int) -> int:
    await plain_all(min(n, 1000))
    await app_all(min(n, 1000))
    runs: dict[str, list[dict[Key, tuple[int, float, float]]]] = {"plain": [], "app": []}
    collector: dict[str, list[_GcTime]] = {"plain": [], "app": []}
    for r in range(rounds):
        order = [("plain", plain_all), ("app", app_all)]
        for side, body in order if r % 2 == 0 else order[::-1]:
            gc.collect()
            prof = cProfile.Profile()
            with _GcTime() as g:
                await body(n, _Profiled(prof))
            collector[side].append(g)
            runs[side].append(_own(pstats.Stats(prof)))
    sides = {side: _median_stats(rs) for side, rs in runs.items()}
    totals = {
        s: statistics.median(sum(v[1] for v in f.values()) for f in rs) for s, rs in runs.items()
    }
    plain, app = totals["plain"] / n * 1e6, totals["app"] / n * 1e6
    print(
        f"[1a] under cProfile, N={n:,}, medians of {rounds} interleaved runs: own time per task "
        f"plain {plain:.1f} us, app {app:.1f} us ({app - plain:+.1f} us; cProfile inflates both)"
    )
    for side, gs in collector.items():
        g = gs[0]
        print(
            f"     garbage collector, {side:<5} "
            f"{statistics.median(x.seconds for x in gs) / n * 1e6:.2f} us per task "
            f"(collections of generations 0/1/2: {'/'.join(map(str, g.collections))}; "
            "counted in the functions that allocated when it ran)"
        )
    print()
    keys = set(sides["plain"]) | set(sides["app"])
    zero = (0, 0.0, 0.0)
    delta = sorted(
        keys, key=lambda k: sides["app"].get(k, zero)[1] - sides["plain"].get(k, zero)[1]
    )[::-1]
    print("functions by own time per task, app minus plain (calls per task: plain / app)")
    print(f"{'delta us':>9} {'plain us':>9} {'app us':>9} {'calls':>11}  function")
    for k in delta[:top]:
        p, a = sides["plain"].get(k, zero), sides["app"].get(k, zero)
        print(
            f"{(a[1] - p[1]) / n * 1e6:>+9.2f} {p[1] / n * 1e6:>9.2f} {a[1] / n * 1e6:>9.2f} "
            f"{p[0] / n:>5.2f}/{a[0] / n:<5.2f}  {_name(k)}"
        )
    print("\nthe app layer's own functions (src/cronoq/app), per task: own and cumulative time")
    print(f"{'own us':>9} {'cum us':>9} {'calls':>6}  function")
    mine = [k for k in sides["app"] if "/cronoq/app/" in k[0]]
    for k in sorted(mine, key=lambda k: -sides["app"][k][1]):
        calls, own, cum = sides["app"][k]
        print(f"{own / n * 1e6:>9.2f} {cum / n * 1e6:>9.2f} {calls / n:>6.2f}  {_name(k)}")
    return 0


# --- --instructions ------------------------------------------------------------------------------

_INSTR_SIZES = (1_000, 6_000)


def _count(phase: str, side: str, n: int) -> int:
    """Instructions of one run of this file's `--role count` under callgrind."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    cmd += [os.path.abspath(__file__), "--role", "count", "--phase", phase, "--side", side]
    cmd += ["--n", str(n)]
    err = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    m = re.search(r"Collected : (\d+)", err)
    assert m, err
    return int(m.group(1))


def count_main(phase: str, side: str, n: int) -> None:
    _, plain, app = LIBRARY[phase]
    asyncio.run((plain if side == "plain" else app)(n))
    sys.stdout.flush()
    os._exit(0)  # the collection of what is left at exit does not count


def instructions() -> int:
    lo, hi = _INSTR_SIZES
    print(f"instructions per task (callgrind), of N={hi:,} minus N={lo:,}")
    for phase, (what, _, _) in LIBRARY.items():
        per = {}
        for side in ("plain", "app"):
            per[side] = (_count(phase, side, hi) - _count(phase, side, lo)) / (hi - lo)
        ratio = per["app"] / per["plain"]
        label = f"[{phase}] library, {what}"
        print(
            f"{label:<40} plain {per['plain']:>9,.0f}  app {per['app']:>9,.0f} instructions "
            f"per task = {ratio:.2f}x  target <= {TARGET_LIBRARY_RATIO}x  "
            f"{verdict(ratio <= TARGET_LIBRARY_RATIO)}"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="library-mode tasks per run (20000)")
    ap.add_argument("--server-n", type=int, default=None, help="server-mode tasks (20000)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (5)")
    ap.add_argument("--quick", action="store_true", help="small sizes, one round (a smoke run)")
    ap.add_argument("--only", default="library,server", help="library, server or both")
    ap.add_argument("--profile", action="store_true", help="[1a] under cProfile, per function")
    ap.add_argument("--top", type=int, default=25, help="functions shown with --profile (25)")
    ap.add_argument("--instructions", action="store_true", help="[1a], [1b] by callgrind")
    # The helper processes: this file is also both workers of [2] and the --instructions runs.
    ap.add_argument(
        "--role", choices=("plain-worker", "app-worker", "count"), help=argparse.SUPPRESS
    )
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=tuple(LIBRARY), help=argparse.SUPPRESS)
    ap.add_argument("--side", choices=("plain", "app"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role in ("plain-worker", "app-worker"):
        main_fn = plain_worker_main if args.role == "plain-worker" else app_worker_main
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main_fn(args.target))
        return 0
    if args.role == "count":
        count_main(args.phase, args.side, args.n)
    base = QUICK if args.quick else FULL
    sz = Sizes(
        n=args.n if args.n is not None else base.n,
        server_n=args.server_n if args.server_n is not None else base.server_n,
        rounds=args.rounds if args.rounds is not None else base.rounds,
    )
    if min(sz.n, sz.server_n, sz.rounds) < 1:
        ap.error("--n, --server-n and --rounds must be >= 1")
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if unknown := set(only) - {"library", "server"}:
        ap.error(f"--only: unknown {', '.join(sorted(unknown))}")
    if args.instructions:
        print_about("cronoq app-layer benchmark, instructions")
        print()
        return instructions()
    if args.profile:
        print_about("cronoq app-layer benchmark, profile of [1a]")
        print()
        return asyncio.run(profile(sz.n, args.top, args.rounds or 3))
    _header("cronoq app-layer benchmark" + (" (--quick sizes)" if args.quick else ""), sz, only)
    return asyncio.run(bench(sz, only))


if __name__ == "__main__":
    sys.exit(main())
