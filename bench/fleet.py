"""Python workers the way users run them: a real `cronoq-server` served by N worker processes,
each `cronoq.client.Worker` (64 slots, a no-op handler) or the `cronoq worker MODULE:APP`
command, at peak and at half of it, in one run.

Machines here are noisy, so every figure that is judged is a ratio or a best of interleaved
runs: the peak of each configuration is the best of `--reps` runs, in an order that alternates
by round, beside the Go raw worker on the same server (what the server costs per task when the
worker costs nothing) and, with `--base REV`, the same fleets of another revision.

The server is `python -m cronoq.server.cli` (bench/server.py's configuration: one pool
`default` of max 256, the native transport when built) on each store of `--store`: `memory`,
`sqlite` (a fresh file, synchronous FULL) and `postgres` (a private cluster of bench/_pg.py,
fsync on). One server per store and side stays up for the whole run; each measured run starts
its own worker processes and stops them (SIGTERM) at its end. The Python workers are:

  worker  this file run with the hidden `--role worker`: `cronoq.client.Worker(target,
          "default", handle, slots=64)`, `handle` returning None;
  app     `python -m cronoq.cli worker fleet_app:app --slots 64` (the `cronoq worker` command,
          docs/app.md) on a module written to a temporary directory: one `@app.task async def
          noop(t: float = 0.0) -> None`; its tasks are of kind `noop` with a JSON envelope.

Phases, for each store, side, worker kind and N in `--workers` (1, 2, 4):
[a]  peak: N no-op tasks by Tasks.SubmitBatch in batches of 1,000 from 4 callers, until all
     have succeeded (bench/server.py's [b]): leases/s, worker CPU per lease (the sum over the
     worker processes of /proc utime + stime, every thread) and the server's CPU per task.
     Target: one worker process >= 25k leases/s, or >= 2.5x REV's in the same run.
[b]  latency at half the peak: tasks submitted at a fixed rate, half of the best [a] of that
     configuration so far, for `--window` seconds, by the Go submitter of bench/peers/cronoq
     (the tasks falling due within each millisecond in one Tasks.SubmitBatch, each call on a
     goroutine of its own, 4 connections in turn: a call per task would cost the server more
     than the tasks at these rates, and a Python submitter cannot hold thousands of calls a
     second on the spare CPU). Each payload carries the wall-clock time taken just before its
     call; the handler notes time.time() when it starts, and each worker process prints its
     pairs when it stops (every process on one machine: one CLOCK_REALTIME). The first tenth
     of the window is warm-up. Submit-to-start p50/p99/max of the window whose p99 is lowest,
     the rate the submitter reached (below the rate asked: the server took the calls no
     faster) and the server's CPU per task so submitted. Target p99 <= 2 ms (memory store),
     <= 5 ms (SQLite, PostgreSQL).
[g]  the Go raw worker of bench/workers/go (`-mode raw -slots 64`: a Complete for each Lease
     at once), [a] on the same server: the server's CPU per task; printed beside it, the
     Python worker's server CPU per task over the Go worker's, medians of the runs (target
     <= 1.3x, one worker process).
[c]  with a durable store: bench/server.py's store ceiling (the library-mode Scheduler on a
     fresh store of that kind, one pool of max 256, the same batches, no transport), and [a]
     over it where the fleet has as many slots (N = 4: 256; target >= 0.9x).

Usage: python bench/fleet.py [--store memory,sqlite,postgres] [--workers 1,2,4]
                             [--kinds worker,app] [--n N] [--reps R] [--window S]
                             [--base REV] [--quick]

--quick: small sizes, one run (a smoke run). --base REV also runs every fleet on REV's server
and workers (a worktree of REV, its src/ first on PYTHONPATH with this venv; bench/_common.py's
revision_tree). The exit status is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import server as S
from _common import percentile, print_about, print_cpus, revision_tree, verdict
from tracing import environ

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 64
KINDS = ("worker", "app")
STORES = ("memory", "sqlite", "postgres")
TARGET_LEASES = 25_000  # [a]: one worker process, leases/s
TARGET_VS_BASE = 2.5  # [a]: or this many times REV's
TARGET_SERVER_CPU = 1.3  # [g]: server CPU per task, one Python worker over the Go worker
TARGET_P99_MS = {"memory": 2.0, "sqlite": 5.0, "postgres": 5.0}  # [b]
TARGET_CEILING = 0.9  # [c]
APP_MODULE = "fleet_app"
SUBMITTER = Path(__file__).resolve().parent / "peers" / "cronoq"  # [b]'s Go submitter
WARMUP_SHARE = 0.1  # [b]: the first tenth of a window is not counted

# The app of the `app` kind, written to a temporary directory on the workers' PYTHONPATH.
APP_SOURCE = f'''\
"""bench/fleet.py's app: one no-op task function that notes when each timed call starts."""

import atexit
import time

import cronoq

app = cronoq.App("fleet")
app.pool("default", max={SLOTS}, autoscale=False)
_starts: list[tuple[float, float]] = []


@app.task
async def noop(t: float = 0.0) -> None:
    if t:
        _starts.append((t, time.time()))


@atexit.register
def _print() -> None:
    print("starts=" + " ".join(f"{{s:.6f}}:{{e:.6f}}" for s, e in _starts), flush=True)
'''
APP_PEAK = b'{"t": 0.0}'
JSON = "application/json"


@dataclass
class Sizes:
    n: int
    reps: int
    window: float  # [b]'s seconds


FULL = Sizes(n=20_000, reps=3, window=3.0)
QUICK = Sizes(n=2_000, reps=1, window=0.5)


# --- the worker role ---------------------------------------------------------------------------


async def worker_main(target: str) -> None:
    """`cronoq.client.Worker` with a no-op handler that notes the start of each timed task (the
    payload holds its submit time), until SIGTERM; then prints the (submit, start) pairs."""
    from cronoq.client import Lease, Worker

    starts: list[tuple[bytes, float]] = []
    now = time.time

    async def handle(lease: Lease) -> None:
        if lease.payload:
            starts.append((lease.payload, now()))

    worker = Worker(target, S.POOL, handle, slots=SLOTS, name="fleet", reconnect=False)
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop())
    )
    await worker.run()
    print("starts=" + " ".join(f"{p.decode()}:{t:.6f}" for p, t in starts), flush=True)


# --- fleets ------------------------------------------------------------------------------------


@dataclass
class Side:
    """What one side runs: this tree (no PYTHONPATH of its own) or a revision's src/."""

    name: str
    pythonpath: str | None

    def env(self, *extra: str) -> dict[str, str | None]:
        parts = [*extra, *([self.pythonpath] if self.pythonpath else [])]
        return {"PYTHONPATH": os.pathsep.join(parts) if parts else None}


@dataclass
class Server:
    side: Side
    store: str
    proc: S.Proc
    target: str
    client: S.Client


class Workers:
    """N worker processes of one kind connected to a server, their CPU summed."""

    def __init__(self, procs: list[S.Proc], timed: bool) -> None:
        self.procs = procs
        self.timed = timed  # Python workers that print their (submit, start) pairs at exit

    def cpu(self) -> float:
        return sum(p.cpu() for p in self.procs)

    def stop(self) -> list[tuple[float, float]]:
        """Stops every process; the (submit, start) pairs the Python workers noted."""
        for p in self.procs:
            if p.p.poll() is None:
                p.p.send_signal(signal.SIGTERM)
        pairs: list[tuple[float, float]] = []
        try:
            for p in self.procs:
                if self.timed:
                    line = p.expect(r"^starts=(.*)$", timeout=60).group(1)
                    for item in line.split():
                        s, e = item.split(":")
                        pairs.append((float(s), float(e)))
        finally:
            for p in self.procs:
                p.stop()
        return pairs


class Launcher:
    """Starts the worker processes of a kind for a side."""

    def __init__(self, app_dir: str, go_exe: str) -> None:
        self.app_dir = app_dir
        self.go_exe = go_exe

    def argv(self, kind: str, target: str) -> list[str]:
        if kind == "worker":
            return [
                sys.executable,
                os.path.abspath(__file__),
                "--role",
                "worker",
                "--target",
                target,
            ]
        if kind == "app":
            return [
                sys.executable, "-m", "cronoq.cli", "worker", f"{APP_MODULE}:app",
                "--target", target, "--slots", str(SLOTS), "--name", "fleet",
            ]  # fmt: skip
        return [self.go_exe, "-mode", "raw", "-target", target, "-slots", str(SLOTS)]

    async def start(self, server: Server, kind: str, n: int) -> Workers:
        with environ(**server.side.env(self.app_dir)):
            procs = [S.Proc(self.argv(kind, server.target), f"{kind} {i}") for i in range(n)]
        workers = Workers(procs, kind != "go")
        try:
            await connected(server.client, n, procs)
        except BaseException:
            workers.stop()
            raise
        return workers


async def connected(
    client: S.Client, want: int, procs: Sequence[S.Proc] = (), timeout: float = 120
) -> None:
    """Until `want` workers of SLOTS slots are connected (0: every one has gone); raises with
    its output if one of `procs` (the workers awaited) ends first, and with what the server
    lists after `timeout` seconds."""
    give_up = time.monotonic() + timeout
    while True:
        for p in procs:
            if p.p.poll() is not None:
                p.expect(r"$^", timeout=5)  # raises with the process's last lines
        workers = (await client.admin.ListWorkers(S.pb.Empty())).workers
        if len(workers) == want and all(w.slots == SLOTS for w in workers):
            return
        if time.monotonic() > give_up:
            listed = ", ".join(f"{w.name} ({w.slots} slots)" for w in workers) or "none"
            raise TimeoutError(f"waiting for {want} workers of {SLOTS} slots; listed: {listed}")
        await asyncio.sleep(0.01)


def store_table(store: str, tmp: str, side: Side) -> str:
    """The server's `[store]` table: a file or schema of each side's own."""
    if store == "memory":
        return S.MEMORY_STORE
    if store == "sqlite":
        return f'kind = "sqlite"\npath = "{os.path.join(tmp, side.name + ".db")}"'
    return f'kind = "postgres"\nurl_env = "{S.PG_ENV}"\nschema = "fleet_{side.name}"'


# --- phases ------------------------------------------------------------------------------------


@dataclass
class Latency:
    rate: float  # asked
    reached: float
    server_cpu: float  # seconds per task
    samples: list[float]  # seconds, sorted

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)


@dataclass
class Run:
    peak: S.ServerRun
    latency: Latency | None = None


def _spec(kind: str, payload: bytes) -> S.pb.TaskSpec:
    if kind == "app":
        return S.pb.TaskSpec(kind="noop", payload=payload, content_type=JSON)
    return S.pb.TaskSpec(payload=payload)


async def phase_peak(server: Server, workers: Workers, kind: str, n: int) -> S.ServerRun:
    """[a]: bench/server.py's [b] with these workers."""
    spec = _spec(kind, APP_PEAK) if kind == "app" else None
    return await S.phase_server(server.client, n, server.proc, workers, spec)


async def phase_latency(
    server: Server, kind: str, rate: float, seconds: float, submit: str, tick: str
) -> Latency:
    """[b]'s submissions, by the Go submitter of bench/peers/cronoq (at `rate` for `seconds`,
    each payload its submit time; `tick`: the tasks due within each such period in one
    SubmitBatch, "0s" one Submit per task); returns once all have succeeded (the samples are
    filled in by the caller, from the workers)."""
    n = _count(rate, seconds)
    goal = await server.client.succeeded() + n
    cpu = server.proc.cpu()
    argv = [submit, "-target", server.target, "-rate", f"{rate:.3f}", "-seconds", f"{seconds}"]
    argv += ["-tick", tick]
    if kind == "app":
        argv += ["-kind", "noop", "-envelope"]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    m = re.search(rb"submitted=(\d+) seconds=([\d.]+)", out)
    assert proc.returncode == 0 and m and int(m.group(1)) == n, out
    while await server.client.succeeded() < goal:
        await asyncio.sleep(0.001)
    return Latency(rate, n / float(m.group(2)), (server.proc.cpu() - cpu) / n, [])


def _count(rate: float, seconds: float) -> int:
    """The tasks of a window, as the submitter counts them."""
    return int(rate * seconds + 0.5)


def _window(pairs: list[tuple[float, float]], n: int, seconds: float) -> list[float]:
    """The latencies of a window's pairs, its warm-up share left out."""
    assert len(pairs) == n, f"{len(pairs)} timed starts noted, {n} submitted"
    first = min(s for s, _ in pairs)
    skip = first + WARMUP_SHARE * seconds
    return sorted(e - s for s, e in pairs if s >= skip)


# --- the run -----------------------------------------------------------------------------------


Key = tuple[str, str, str, int]  # side, store, kind, N


@dataclass
class Results:
    sides: list[str]
    stores: list[str]
    kinds: list[str]
    counts: list[int]
    runs: dict[Key, list[Run]] = field(default_factory=dict)
    ceilings: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # store: why


async def measure(
    sz: Sizes, stores: list[str], kinds: list[str], counts: list[int], base: str | None
) -> Results:
    async with contextlib.AsyncExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="cronoq-fleet-"))
        with open(os.path.join(tmp, APP_MODULE + ".py"), "w") as f:
            f.write(APP_SOURCE)
        go_exe, submit = os.path.join(tmp, "go-raw"), os.path.join(tmp, "submit")
        t0 = time.perf_counter()
        subprocess.run(["go", "build", "-o", go_exe, "."], cwd=S.GO_WORKER, check=True)
        subprocess.run(["go", "build", "-o", submit, "."], cwd=SUBMITTER, check=True)
        print(f"built:    the Go raw worker and submitter in {time.perf_counter() - t0:.1f} s")
        launcher = Launcher(tmp, go_exe)
        sides = [Side("this", None)]
        if base is not None:
            tree = stack.enter_context(revision_tree(ROOT, base))
            sides.append(Side(base, str(tree / "src")))
        durable, no_pg = S._durable(tmp, stack) if set(stores) - {"memory"} else ({}, "")
        if "postgres" in stores:
            print(f"postgres: {'not measured: ' + no_pg if no_pg else 'a private cluster'}")
        r = Results([s.name for s in sides], [], kinds, counts)
        servers: dict[tuple[str, str], Server] = {}
        for store in stores:
            if store not in ("memory", *durable):
                r.skipped[store] = no_pg
                continue
            r.stores.append(store)
            for side in sides:
                cfg = os.path.join(tmp, f"{side.name}-{store}.toml")
                with open(cfg, "w") as f:
                    f.write(S.config(store_table(store, tmp, side)))
                with environ(**side.env()):
                    proc, target = S.start_server(cfg)
                stack.callback(proc.stop)
                client = await stack.enter_async_context(S.connect(target))
                servers[side.name, store] = Server(side, store, proc, target, client)
        print()

        async def one(key: Key, n: int, timed: bool) -> Run:
            side, store, kind, count = key
            server = servers[side, store]
            workers = await launcher.start(server, kind, count)
            lat: Latency | None = None
            pairs: list[tuple[float, float]] = []
            try:
                run = Run(await phase_peak(server, workers, kind, n))
                if timed:
                    best = max(x.peak.rate for x in [*r.runs.get(key, []), run])
                    lat = await phase_latency(server, kind, best / 2, sz.window, submit, "1ms")
            finally:
                pairs = workers.stop()
                await connected(server.client, 0)
            if lat is not None:
                lat.samples = _window(pairs, _count(lat.rate, sz.window), sz.window)
                run.latency = lat
            return run

        keys = [
            (side.name, store, kind, count)
            for store in r.stores
            for side in sides
            for kind in [*kinds, "go"]
            for count in (counts if kind != "go" else [1])
        ]
        warm = min(sz.n, S.CALLERS * S.BATCH)
        for key in keys:  # each configuration once, unmeasured
            await one(key, warm, timed=False)
        for store in (x for x in r.stores if x in durable):
            await S.phase_store_ceiling(warm, durable[store].make())
            r.ceilings[store] = []
        for rep in range(sz.reps):
            print(f"round {rep + 1}/{sz.reps}", file=sys.stderr)
            for key in keys if rep % 2 == 0 else keys[::-1]:
                r.runs.setdefault(key, []).append(await one(key, sz.n, timed=key[2] != "go"))
            for store in r.ceilings:
                r.ceilings[store].append(await S.phase_store_ceiling(sz.n, durable[store].make()))
    return r


# --- the report --------------------------------------------------------------------------------


def fmt_ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def _rates(runs: list[Run]) -> str:
    return "runs " + " ".join(f"{x.peak.rate / 1000:.1f}k" for x in runs)


def _median_server_cpu(runs: list[Run]) -> float:
    return statistics.median(x.peak.server_cpu for x in runs)


def report(sz: Sizes, r: Results) -> None:
    targets: dict[str, bool] = {}
    base = r.sides[1] if len(r.sides) > 1 else None
    for store in r.stores:
        for side in r.sides:
            go = max(r.runs[side, store, "go", 1], key=lambda x: x.peak.rate).peak
            tag = "" if side == "this" else f" {side}"
            print(f"--- store {store}{tag}")
            for kind in r.kinds:
                for count in r.counts:
                    runs = r.runs[side, store, kind, count]
                    a = max(runs, key=lambda x: x.peak.rate).peak
                    label = f"[a {store} {kind} x{count}]".ljust(24)
                    goal = ""
                    if count == 1 and side == "this":
                        ok = a.rate >= TARGET_LEASES
                        if base is not None:
                            was = max(x.peak.rate for x in r.runs[base, store, kind, 1])
                            ok = ok or a.rate >= TARGET_VS_BASE * was
                            goal = f" = {a.rate / was:.2f}x {base}"
                        targets[f"[a {store} {kind}]"] = ok
                        goal += (
                            f"  target >= {TARGET_LEASES / 1000:g}k or >= {TARGET_VS_BASE}x "
                            f"base  {verdict(ok)}"
                        )
                    print(
                        f"{label} N={sz.n:,}: {a.rate:>8,.0f} leases/s{goal}   CPU: workers "
                        f"{a.worker_cpu * 1e6:.0f} us/lease, server {a.server_cpu * 1e6:.0f} "
                        f"us/task ({a.server_cpu / go.server_cpu:.2f}x [g])   ({_rates(runs)})"
                    )
                    timed = [x.latency for x in runs if x.latency is not None]
                    lat = min(timed, key=lambda x: x.p99)
                    ok = lat.p99 * 1e3 <= TARGET_P99_MS[store]
                    if side == "this":
                        targets[f"[b {store} {kind} x{count}]"] = ok
                    print(
                        f"{'[b]'.rjust(len(label) - 1)} at {lat.rate:,.0f} tasks/s (reached "
                        f"{lat.reached:,.0f}; server {lat.server_cpu * 1e6:.0f} us/task), "
                        f"{len(lat.samples):,} tasks: p50 "
                        f"{fmt_ms(percentile(lat.samples, 0.5))}  p99 {fmt_ms(lat.p99)}  max "
                        f"{fmt_ms(lat.samples[-1])}  target p99 <= {TARGET_P99_MS[store]:g} ms  "
                        f"{verdict(ok)}   (window p99s "
                        + " ".join(fmt_ms(x.p99) for x in timed)
                        + ")"
                    )
                    if count == 4 and store in r.ceilings:
                        ceiling = max(r.ceilings[store])
                        each = " ".join(f"{c / 1000:.1f}k" for c in r.ceilings[store])
                        ok = a.rate >= TARGET_CEILING * ceiling
                        if side == "this":
                            targets[f"[c {store} {kind}]"] = ok
                        print(
                            f"{'[c]'.rjust(len(label) - 1)} {a.rate / ceiling:.2f}x the store's "
                            f"ceiling, {ceiling:,.0f} tasks/s (library Scheduler, 256 slots, no "
                            f"transport; runs {each})"
                            f"  target >= {TARGET_CEILING}x  {verdict(ok)}"
                        )
            gos = r.runs[side, store, "go", 1]
            print(
                f"{f'[g {store}]'.ljust(24)} N={sz.n:,}: {go.rate:>8,.0f} tasks/s   CPU: Go raw "
                f"worker {go.worker_cpu * 1e6:.1f} us/lease, server {go.server_cpu * 1e6:.0f} "
                f"us/task (median {_median_server_cpu(gos) * 1e6:.0f})"
                f"   ({_rates(gos)})"
            )
            for kind in r.kinds:
                py = _median_server_cpu(r.runs[side, store, kind, 1])
                x = py / _median_server_cpu(gos)
                ok = x <= TARGET_SERVER_CPU
                if side == "this":
                    targets[f"[g {store} {kind}]"] = ok
                print(
                    f"{'':24} server CPU per task, {kind} x1 / Go raw worker: {x:.2f}x  "
                    f"target <= {TARGET_SERVER_CPU}x  {verdict(ok)}   (medians of the runs: "
                    f"{py * 1e6:.1f} / {_median_server_cpu(gos) * 1e6:.1f} us)"
                )
    for store, why in r.skipped.items():
        print(f"[{store}] skipped: {why}")
    print(
        f"\ntargets:  {sum(targets.values())}/{len(targets)} met: "
        + ", ".join(f"{k} {verdict(v)}" for k, v in targets.items())
    )


def parse_names(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [x for x in value.split(",") if x]
    bad = [x for x in names if x not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{what}: {', '.join(allowed)} (got {value!r})")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="memory", help="memory,sqlite,postgres (memory)")
    ap.add_argument("--workers", default="1,2,4", help="worker processes per fleet (1,2,4)")
    ap.add_argument("--kinds", default="worker,app", help="worker,app (both)")
    ap.add_argument("--n", type=int, default=None, help="tasks per [a] run (20000)")
    ap.add_argument("--reps", type=int, default=None, help="interleaved runs of each (3)")
    ap.add_argument("--window", type=float, default=None, help="[b]'s seconds (3)")
    ap.add_argument("--base", default=None, help="also the server and workers of this revision")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "worker":
        asyncio.run(worker_main(args.target))
        return 0
    try:
        stores = parse_names(args.store, STORES, "--store")
        kinds = parse_names(args.kinds, KINDS, "--kinds")
        counts = [int(x) for x in args.workers.split(",") if x]
    except (argparse.ArgumentTypeError, ValueError) as e:
        ap.error(str(e))
    if not counts or min(counts) < 1:
        ap.error("--workers: counts >= 1")
    base = QUICK if args.quick else FULL
    given = {"n": args.n, "reps": args.reps, "window": args.window}
    sz = Sizes(**{**base.__dict__, **{k: v for k, v in given.items() if v is not None}})
    if sz.n < 1 or sz.reps < 1 or sz.window <= 0:
        ap.error("--n and --reps must be >= 1, --window > 0")
    print_about("cronoq worker fleet benchmark" + (" (--quick sizes)" if args.quick else ""))
    print_cpus("this client, the servers, N worker processes")
    print(
        f"sizes:    [a] N={sz.n:,} (SubmitBatch of {S.BATCH:,} from {S.CALLERS} callers); [b] "
        f"{sz.window:g} s windows at half the best [a]; best of {sz.reps} interleaved runs; "
        f"workers {SLOTS} slots each, N = {', '.join(map(str, counts))}"
    )
    report(sz, asyncio.run(measure(sz, stores, kinds, counts, args.base)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
