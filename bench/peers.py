"""cronoq beside its peers, on one workload, in one run: a bulk of no-op tasks run by one worker
process with 64 at a time on a durable store, and the submit-to-start latency of a steady
200 tasks/s.

Systems (each missing one is a SKIP line with its reason; none is installed by this script):

  cronoq-pg       `python -m cronoq.server.cli` of this tree (native transport), `[store] kind =
                  "postgres"` on a private cluster of bench/_pg.py (fsync on), one Python worker:
                  bench/fleet.py's (`cronoq.client.Worker`, 64 slots, a no-op handler);
  cronoq-sqlite   the same server on a fresh SQLite file (synchronous FULL);
  published-pg, published-sqlite
                  the published `cronoq-server` 0.2.1 (`cronoq-server-published` on PATH, or
                  --published PATH; `cargo install --locked cronoq-server@0.2.1 --root DIR`
                  builds it) on the same two stores, with the same worker;
  bullmq          BullMQ (bench/peers/bullmq: `npm ci` there, pinned by its package-lock) on a
                  Redis server that this script starts on a free port (Debian's redis-server,
                  `--appendonly yes --appendfsync always`: a job is on disk before its write is
                  answered, as cronoq's stores are); one Node worker process, concurrency 64;
  river           River (bench/peers/river, Go, pinned by its go.mod/go.sum, built here) on the
                  same private PostgreSQL cluster, its schema migrated by River; one Go worker
                  process with MaxWorkers 64 and the fetch settings of River's own benchmark
                  (FetchCooldown 2 ms, FetchPollInterval 20 ms).

Phases, each system in turn, the order alternating by round; every round starts a new worker
process (the first, unmeasured, warms each system up):
[p]  bulk: N no-op tasks (20,000) enqueued in batches of 1,000 (cronoq: Tasks.SubmitBatch from
     4 callers, bench/server.py's [b]; BullMQ: Queue.addBulk; River: InsertMany) by a producer
     process of the system's own language, timed from the first enqueue until the worker has
     seen the last one complete: tasks/s (best of `--reps`), and the CPU per task of every
     process involved except the producer (utime + stime from /proc, every thread: the server
     or broker, the worker, and the database: PostgreSQL's postmaster, its children and the
     children it reaped) in the best run.
[l]  latency: 200 tasks/s submitted one at a time for `--window` seconds (cronoq: the Go
     submitter of bench/peers/cronoq, one Tasks.Submit per task; BullMQ: Queue.add; River:
     Insert; each call not awaited before the next is due), each task carrying its submit time;
     the worker notes when each starts and prints the pairs when it stops (cronoq and River on
     the wall clock, BullMQ on CLOCK_MONOTONIC, each one clock for the whole machine).
     Submit-to-start p50/p99/max of all rounds' windows, the first tenth of each left out.

Usage: python bench/peers.py [--systems cronoq-pg,cronoq-sqlite,published-pg,...,river]
                             [--n N] [--reps R] [--rate R] [--window S] [--published PATH]
                             [--quick]

--quick: small sizes, one round. The exit status is 0 whatever the figures are.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import fleet as F
import server as S
from _common import Child, percentile, print_about, print_cpus, proc_cpu
from _pg import Cluster, free_port

PEERS = Path(__file__).resolve().parent / "peers"
SYSTEMS = ("cronoq-pg", "cronoq-sqlite", "published-pg", "published-sqlite", "bullmq", "river")
PUBLISHED = "cronoq-server-published"
EVERY = 100  # the peers' workers print their completed count at each multiple of this
WARMUP_SHARE = F.WARMUP_SHARE


@dataclass
class Sizes:
    n: int
    reps: int
    rate: float
    window: float


FULL = Sizes(n=20_000, reps=3, rate=200.0, window=10.0)
QUICK = Sizes(n=2_000, reps=1, rate=200.0, window=1.0)


class Skip(Exception):
    """A system that cannot run here, and why."""


# --- CPU of the processes involved -------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def postgres_cpu(postmaster: int) -> float:
    """Seconds of CPU of a PostgreSQL server: its postmaster (with the children it reaped) and
    every live child of it."""
    tick = os.sysconf("SC_CLK_TCK")
    own = _stat(postmaster)
    total = sum(int(x) for x in own[11:15])  # utime, stime, cutime, cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = _stat(int(entry))
                if int(fields[1]) == postmaster:
                    total += int(fields[11]) + int(fields[12])
    return total / tick


async def postmaster_of(url: str) -> int:
    """The pid of the postmaster serving `url` (a server on this machine): a backend's parent."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return int(_stat(int(await conn.fetchval("SELECT pg_backend_pid()")))[1])
    finally:
        await conn.close()


# A name and a reader of seconds of CPU so far, per process (or group) involved.
Meter = dict[str, Callable[[], float]]


def _read(meter: Meter) -> dict[str, float]:
    return {name: read() for name, read in meter.items()}


# --- the systems -------------------------------------------------------------------------------


@dataclass
class Bulk:
    rate: float
    cpu: dict[str, float]  # seconds per task, by process


class System(abc.ABC):
    """One system under test: set up once; per round a worker started, [p], [l], stopped."""

    name = ""
    clock = "wall clock"  # the clock of its submit and start times
    meter: Meter  # the processes involved, the producers left out

    @abc.abstractmethod
    async def setup(self, stack: contextlib.AsyncExitStack, ctx: Context) -> None: ...

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def bulk(self, n: int) -> Bulk: ...

    @abc.abstractmethod
    async def steady(self, rate: float, seconds: float) -> float:
        """Submits at `rate` for `seconds`; the rate reached."""

    @abc.abstractmethod
    def stop(self) -> list[tuple[float, float]]:
        """Stops the worker; its (submit, start) pairs."""


@dataclass
class Context:
    """What the systems share: a temporary directory, the private PostgreSQL cluster (or why
    there is none), the built Go programs."""

    tmp: str
    pg: Cluster | None
    no_pg: str
    postmaster: int = 0
    built: dict[str, str] = field(default_factory=dict)

    def pg_url(self) -> str:
        if self.pg is None:
            raise Skip(self.no_pg)
        return self.pg.url

    def go(self, name: str, where: Path) -> str:
        """The Go program at `where`, built once (its modules from the Go proxy if needed)."""
        if name not in self.built:
            exe = os.path.join(self.tmp, name)
            done = subprocess.run(
                ["go", "build", "-o", exe, "."], cwd=where, capture_output=True, text=True
            )
            if done.returncode != 0:
                raise Skip(f"go build in {where.name} failed: {done.stderr.strip()[-300:]}")
            self.built[name] = exe
        return self.built[name]


class Cronoq(System):
    """A cronoq server (this tree's, or the published binary `exe`) with one Python worker."""

    def __init__(self, name: str, store: str, exe: str | None = None) -> None:
        self.name = name
        self.store = store
        self.exe = exe

    async def setup(self, stack: contextlib.AsyncExitStack, ctx: Context) -> None:
        self.submit = ctx.go("submit", F.SUBMITTER)
        side = F.Side(self.name.replace("-", "_"), None)  # its name makes a schema's name
        if self.store == "postgres":
            ctx.pg_url()
        cfg = os.path.join(ctx.tmp, f"{self.name}.toml")
        table = F.store_table(self.store, ctx.tmp, side)
        with open(cfg, "w") as f:
            f.write(S.config(table, "native") if self.exe is None else published_config(table))
        if self.exe is None:
            proc, target = S.start_server(cfg)
        else:
            proc = S.Proc([self.exe, "-c", cfg], self.name)
            try:
                target = proc.expect(r"listening grpc=(\S+)").group(1)
            except BaseException:
                proc.stop()
                raise
        stack.callback(proc.stop)
        client = await stack.enter_async_context(S.connect(target))
        self.server = F.Server(side, self.store, proc, target, client)
        self.meter = {"server": proc.cpu}
        if self.store == "postgres":
            self.meter["postgres"] = lambda: postgres_cpu(ctx.postmaster)
        self.launcher = F.Launcher(ctx.tmp, "")

    async def start(self) -> None:
        self.workers = await self.launcher.start(self.server, "worker", 1)
        self.meter["worker"] = self.workers.cpu

    async def bulk(self, n: int) -> Bulk:
        before = _read(self.meter)
        run = await S.phase_server(self.server.client, n, self.server.proc, self.workers)
        after = _read(self.meter)
        return Bulk(run.rate, {k: (after[k] - before[k]) / n for k in before})

    async def steady(self, rate: float, seconds: float) -> float:
        lat = await F.phase_latency(self.server, "worker", rate, seconds, self.submit, "0s")
        return lat.reached

    def stop(self) -> list[tuple[float, float]]:
        return self.workers.stop()


class Queued(System):
    """A peer whose producer and worker are programs of their own (`argv(mode, *args)`): the
    worker prints "ready", "completed=K at=T" at each multiple of EVERY and "starts=..." when
    stopped; a producer prints "start=T" (bulk) or "submitted=N seconds=S" (rate)."""

    @abc.abstractmethod
    def argv(self, mode: str, *args: str) -> list[str]: ...

    async def start(self) -> None:
        self.worker = Child(self.argv("worker", "--every", str(EVERY)), f"{self.name} worker")
        self.worker.expect(r"^ready$", timeout=60)
        self.completed = 0
        self.meter["worker"] = lambda: proc_cpu(self.worker.pid)

    def _until(self, goal: int, timeout: float) -> float:
        """When the worker's count reached `goal` (its clock)."""
        while True:
            m = self.worker.expect(r"^completed=(\d+) at=([\d.]+)", timeout=timeout)
            if int(m.group(1)) >= goal:
                self.completed = int(m.group(1))
                return float(m.group(2))

    async def bulk(self, n: int) -> Bulk:
        before = _read(self.meter)
        producer = await asyncio.create_subprocess_exec(
            *self.argv("bulk", "--n", str(n)), stdout=subprocess.PIPE
        )
        out, _ = await producer.communicate()
        m = re.search(rb"start=([\d.]+)", out)
        assert producer.returncode == 0 and m, out
        end = await asyncio.to_thread(self._until, self.completed + n, 60 + n / 100)
        after = _read(self.meter)
        return Bulk(n / (end - float(m.group(1))), {k: (after[k] - before[k]) / n for k in before})

    async def steady(self, rate: float, seconds: float) -> float:
        argv = self.argv("rate", "--rate", f"{rate:g}", "--seconds", f"{seconds:g}")
        producer = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE)
        out, _ = await producer.communicate()
        m = re.search(rb"submitted=(\d+) seconds=([\d.]+)", out)
        assert producer.returncode == 0 and m, out
        n = int(m.group(1))
        await asyncio.to_thread(self._until, self.completed + n, 60)
        return n / float(m.group(2))

    def stop(self) -> list[tuple[float, float]]:
        self.worker.p.send_signal(signal.SIGTERM)
        try:
            line = self.worker.expect(r"^starts=(.*)$", timeout=60).group(1)
        finally:
            self.worker.stop()
        return [(float(s), float(e)) for s, e in (x.split(":") for x in line.split())]


class BullMQ(Queued):
    name = "bullmq"
    clock = "CLOCK_MONOTONIC"

    async def setup(self, stack: contextlib.AsyncExitStack, ctx: Context) -> None:
        where = PEERS / "bullmq"
        redis, node = shutil.which("redis-server"), shutil.which("node")
        if redis is None or node is None:
            raise Skip(f"{'redis-server' if redis is None else 'node'} is not installed")
        if not (where / "node_modules" / "bullmq").is_dir():
            raise Skip("bench/peers/bullmq has no node_modules: run `npm ci` there")
        self.port = free_port()
        data = stack.enter_context(tempfile.TemporaryDirectory(prefix="peers-redis-"))
        argv = [redis, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", data]
        argv += ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        self.redis = Child(argv, "redis-server")
        stack.callback(self.redis.stop)
        self.redis.expect(r"Ready to accept connections", timeout=30)
        self.node, self.script = node, str(where / "bench.js")
        self.meter = {"redis": lambda: proc_cpu(self.redis.pid)}

    def argv(self, mode: str, *args: str) -> list[str]:
        return [self.node, self.script, mode, "--port", str(self.port), *args]


class River(Queued):
    name = "river"

    async def setup(self, stack: contextlib.AsyncExitStack, ctx: Context) -> None:
        self.url = ctx.pg_url()
        self.exe = ctx.go("river", PEERS / "river")
        done = subprocess.run(self.argv("migrate"), capture_output=True, text=True)
        if done.returncode != 0:
            raise Skip(f"River's migration failed: {done.stderr.strip()[-300:]}")
        self.meter = {"postgres": lambda: postgres_cpu(ctx.postmaster)}

    def argv(self, mode: str, *args: str) -> list[str]:
        flags = [a.replace("--", "-", 1) if a.startswith("--") else a for a in args]
        return [self.exe, "-mode", mode, "-url", self.url, *flags]


def published_config(store: str) -> str:
    """The published server's configuration (its own keys: no log level, no transport)."""
    return f"""\
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"

[store]
{store}

[[pools]]
name = "{S.POOL}"
max = {S.POOL_MAX}
"""


def published(path: str | None) -> str:
    """The published server's executable; Skip if there is none."""
    exe = path or shutil.which(PUBLISHED)
    if exe is None or not os.access(exe, os.X_OK):
        raise Skip(
            f"{path or PUBLISHED} not found (cargo install --locked cronoq-server@0.2.1 --root "
            "DIR builds it; name DIR/bin/cronoq-server with --published)"
        )
    return exe


def make(name: str, published_path: str | None) -> System:
    if name.startswith("cronoq-"):
        return Cronoq(name, "postgres" if name.endswith("pg") else "sqlite")
    if name.startswith("published-"):
        exe = published(published_path)
        return Cronoq(name, "postgres" if name.endswith("pg") else "sqlite", exe)
    return BullMQ() if name == "bullmq" else River()


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Results:
    bulks: dict[str, list[Bulk]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    reached: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    clocks: dict[str, str] = field(default_factory=dict)


def _latencies(pairs: list[tuple[float, float]], n: int, seconds: float) -> list[float]:
    assert len(pairs) == n, f"{len(pairs)} timed starts noted, {n} submitted"
    skip = min(s for s, _ in pairs) + WARMUP_SHARE * seconds
    return [e - s for s, e in pairs if s >= skip]


async def round_of(system: System, sz: Sizes, n: int, r: Results | None) -> None:
    """One round of a system: a worker started, [p], [l], the worker stopped; recorded in `r`
    unless it is the warm-up."""
    await system.start()
    try:
        bulk = await system.bulk(n)
        reached = await system.steady(sz.rate, sz.window)
    finally:
        pairs = system.stop()
    if r is not None:
        r.bulks[system.name].append(bulk)
        r.reached[system.name].append(reached)
        count = int(sz.rate * sz.window + 0.5)
        r.latencies[system.name] += _latencies(pairs, count, sz.window)


async def measure(sz: Sizes, names: list[str], published_path: str | None) -> Results:
    r = Results()
    async with contextlib.AsyncExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="cronoq-peers-"))
        cluster, no_pg = Cluster(), ""
        try:
            cluster.start()
            stack.callback(cluster.stop)
            os.environ[S.PG_ENV] = cluster.url
        except RuntimeError as e:
            cluster, no_pg = None, str(e)  # type: ignore[assignment]
        ctx = Context(tmp, cluster, no_pg)
        if cluster is not None:
            ctx.postmaster = await postmaster_of(cluster.url)
        print(f"postgres: {'none: ' + no_pg if no_pg else 'a private cluster (fsync on)'}")
        systems: list[System] = []
        for name in names:
            try:
                system = make(name, published_path)
                await system.setup(stack, ctx)
                await round_of(system, sz, min(sz.n, S.CALLERS * S.BATCH), None)
            except Skip as e:
                r.skipped[name] = str(e)
                continue
            systems.append(system)
            r.bulks[name], r.latencies[name], r.reached[name] = [], [], []
            r.clocks[name] = system.clock
        print()
        for rep in range(sz.reps):
            print(f"round {rep + 1}/{sz.reps}", file=sys.stderr)
            for system in systems if rep % 2 == 0 else systems[::-1]:
                await round_of(system, sz, sz.n, r)
    return r


def report(sz: Sizes, names: list[str], r: Results) -> None:
    for name in names:
        label = f"{name:<16}"
        if name in r.skipped:
            print(f"{label} SKIP: {r.skipped[name]}")
            continue
        best = max(r.bulks[name], key=lambda b: b.rate)
        each = ", ".join(f"{k} {v * 1e6:.0f}" for k, v in best.cpu.items())
        runs = " ".join(f"{b.rate / 1000:.1f}k" for b in r.bulks[name])
        total = sum(best.cpu.values()) * 1e6
        print(
            f"{label} [p] N={sz.n:,}: {best.rate:>8,.0f} tasks/s   CPU {total:.0f} us/task "
            f"({each})   (runs {runs})"
        )
        lat = sorted(r.latencies[name])
        reached = statistics.median(r.reached[name])
        print(
            f"{'':16} [l] {sz.rate:g} tasks/s (reached {reached:,.0f}), {len(lat):,} tasks: p50 "
            f"{F.fmt_ms(percentile(lat, 0.5))}  p99 {F.fmt_ms(percentile(lat, 0.99))}  max "
            f"{F.fmt_ms(lat[-1])}   ({r.clocks[name]})"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="which systems (all)")
    ap.add_argument("--n", type=int, default=None, help="tasks per [p] run (20000)")
    ap.add_argument("--reps", type=int, default=None, help="rounds (3)")
    ap.add_argument("--rate", type=float, default=None, help="[l]'s tasks/s (200)")
    ap.add_argument("--window", type=float, default=None, help="[l]'s seconds (10)")
    ap.add_argument("--published", default=None, help=f"the published server ({PUBLISHED})")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    args = ap.parse_args(argv)
    try:
        names = F.parse_names(args.systems, SYSTEMS, "--systems")
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    base = QUICK if args.quick else FULL
    given = {"n": args.n, "reps": args.reps, "rate": args.rate, "window": args.window}
    sz = Sizes(**{**base.__dict__, **{k: v for k, v in given.items() if v is not None}})
    if sz.n < 1 or sz.reps < 1 or sz.rate <= 0 or sz.window <= 0:
        ap.error("--n and --reps must be >= 1, --rate and --window > 0")
    if int(sz.rate * sz.window + 0.5) % EVERY:
        ap.error(f"--rate x --window must be a multiple of {EVERY} tasks")
    print_about("cronoq and its peers" + (" (--quick sizes)" if args.quick else ""))
    print_cpus("this driver, each system's server or broker, worker, producer, database")
    print(
        f"sizes:    [p] N={sz.n:,} in batches of {S.BATCH:,}, best of {sz.reps} rounds; [l] "
        f"{sz.rate:g} tasks/s for {sz.window:g} s per round; one worker process, 64 at a time"
    )
    report(sz, names, asyncio.run(measure(sz, names, args.published)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
