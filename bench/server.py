"""Server benchmark of cronoq: `cronoq-server` under both of its transports against a bare gRPC
ceiling, in one run.

Machines here are noisy and gRPC's own cost per message dominates, so the server's throughput is
printed as a ratio to a bare grpc.aio echo measured in the same run, and every throughput figure
is the best of interleaved runs (the transports interleaved too). So that the load is not the
bottleneck, the worker of [a], [b], [c] and [f] is the Go raw worker of bench/workers/go
(`-mode raw`: it answers each Lease with a Complete at once), built with `go build` into a
temporary directory at the start, with 256 slots. Every process (this client, the server or echo
servicer, the worker) is a separate process on loopback; the echo servicer and the Python workers
are this file run with the hidden `--role echo|worker|client-worker`. CPU is utime + stime from
/proc/<pid>/stat, every thread of the process (the native transport's Rust thread included).

Phases
------
[a]  the ceiling: a bare grpc.aio servicer of `Workers/Work` (Python, no scheduler) answers the
     worker's register, then sends N Lease messages over the one stream, keeping as many in
     flight as the worker has slots (256), and counts the Complete replies. Pairs/s, timed by
     the servicer from its first lease to its last complete, and the CPU per pair of the
     servicer (its own process clock over that window) and of the worker (from its
     registration to the servicer's last complete).
[b]  the server under each transport, [b grpcio] and [b native] (`[server] transport`):
     `python -m cronoq.server.cli -c CFG` (one pool `default`, max 256, memory store, ports 0,
     log level info so that `event=listening` is printed) with the Go worker connected. N no-op
     tasks (empty TaskSpec) are submitted by Tasks.SubmitBatch in batches of
     limits.max_tasks_per_batch from 4 concurrent callers (a channel and a connection each,
     its batches one after the other), each then calls Tasks.Wait on its last task, and
     Admin.Snapshot is polled until N more have succeeded (by then nearly all have: a poll or
     two). The requests are built before timing. Tasks/s, ratio to [a] (target for native
     >= 3x), and the server's (target for native <= 80 us) and the worker's CPU per task.
[c]  sequential Tasks.Submit(wait=true) round trips under each transport, after a warm-up:
     p50 and p99 (target for native: p50 <= 2 ms).
[d]  [a] with `cronoq.client.Worker` (64 slots, a no-op handler) in place of the Go worker, and
     with this file's Python raw worker (the Go one's protocol minimum, 64 slots): the Worker's
     CPU per lease over the Python raw worker's of the same round (target <= 1.5x), which is
     what the Worker adds over the protocol in its own language; the Go raw worker's CPU per
     lease in [a] is printed beside them.
[e]  the client path: `cronoq.client.Client.submit_batch` of 10k tasks (`task()` specs built
     before timing, batches of limits.max_tasks_per_batch, one caller), `Client.wait` on the
     last and `Client.snapshot` until all succeeded, served by a server (the native transport
     when built, else grpcio) whose only worker is `cronoq.client.Worker` with 64 slots.
     Tasks/s and the Worker's and the server's CPU per task.
[f]  the durable stores: [b] on that transport with `[store] kind = "sqlite"` (a fresh file,
     the server's defaults: synchronous=FULL) and with `kind = "postgres"` (a private cluster
     started for the run by bench/_pg.py, fsync on; skipped, with the reason, when none can be
     started). Tasks/s and the ratio to that transport's in-memory [b] of the same run, beside
     the store's own ceiling: the library-mode Scheduler in this process with that store (a
     fresh file or schema each run), one pool of max 256 with a no-op executor, N tasks by
     submit_batch in the same batches from 4 concurrent submitters until all have succeeded:
     the engine path of [b] without the transport. (bench/store.py's batch phase is one
     submit_batch of all N on a pool of 64, so it is not reused.) Target >= 0.8x [b] where the
     store allows it: >= 0.8x the lower of [b] and the store's ceiling.

When the native transport is not built (`cronoq.server.config.native_built()`), its rows are
skipped with a line saying so, [e] and [f] run on grpcio, and the native targets are SKIP.

Usage: python bench/server.py [--n N] [--quick] [--profile [--transport T]] [--top K]

--quick uses small sizes (a smoke run, one run of each). --profile runs [b] once with the server
of one transport (--transport grpcio|native; native when built) under cProfile (enabled by a
signal right before the timed run and saved right after it, so start-up and warm-up are left
out) and prints the top functions by own time and own time by source area instead of the
benchmark; the native transport's Rust thread is outside cProfile's view but in the /proc CPU.
The Go build time is printed and not measured. The exit status is 0 whether targets are met or
not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from _common import Child, percentile, print_about, print_cpus, verdict
from _pg import Cluster
from cronoq import Pool, PostgresStore, Scheduler, SqliteStore, Task
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.config import LimitsSettings, native_built

SLOTS = 64  # the Python workers' (bench/workers.py, shards.py and bridge.py use them too)
GO_SLOTS = 256  # the Go raw worker's: enough in flight that the worker is not the limit
POOL = "default"
POOL_MAX = GO_SLOTS
LEASE_TTL_S = 30.0  # the default pool's, so the echo's leases are as big as the server's
BATCH = LimitsSettings().max_tasks_per_batch
CALLERS = 4  # concurrent SubmitBatch callers of [b] and [f], submitters of the store ceiling
TRANSPORTS = ("grpcio", "native")
TICK = os.sysconf("SC_CLK_TCK")
GO_WORKER = Path(__file__).resolve().parent / "workers" / "go"
PG_ENV = "CRONOQ_BENCH_PG_URL"  # where [f]'s PostgreSQL server reads the URL (url_env)

TARGET_RATIO = 3.0  # [b native] / [a]
TARGET_CPU_US = 80.0  # [b native] server CPU per task
TARGET_P50_MS = 2.0  # [c native]
TARGET_WORKER_CPU = 1.5  # cronoq.client.Worker CPU per lease / the Python raw worker's
TARGET_STORE_RATIO = 0.8  # [f] / the lower of [b] and the store's ceiling
CLIENT_N = 10_000

MEMORY_STORE = 'kind = "memory"'
# Each channel its own connection: grpcio would otherwise share one between equal channels.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def config(store: str = MEMORY_STORE, transport: str = "auto") -> str:
    """The server's configuration, with `store` as the body of its `[store]` table."""
    return f"""\
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
log_level = "info"
transport = "{transport}"

[store]
{store}

[[pools]]
name = "{POOL}"
max = {POOL_MAX}
"""


# The server's command line under --profile: SIGUSR1 starts cProfile, SIGUSR2 stops it and
# saves the stats to the file named by the first argument.
PROFILED_SERVER = """\
import cProfile, signal, sys
from cronoq.server.cli import main
prof = cProfile.Profile()
out = sys.argv.pop(1)
def start(*_):
    prof.enable()
    print("bench_profile=on", file=sys.stderr, flush=True)
def stop(*_):
    prof.disable()
    prof.dump_stats(out)
    print("bench_profile=saved", file=sys.stderr, flush=True)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Sizes:
    n: int
    reps: int
    rt_warmup: int
    rt_samples: int
    client_n: int


FULL = Sizes(n=20_000, reps=3, rt_warmup=200, rt_samples=2_000, client_n=CLIENT_N)
QUICK = Sizes(n=2_000, reps=1, rt_warmup=20, rt_samples=200, client_n=1_000)


# --- the helper processes: this file run with --role ----------------------------------------


def _lease(i: int) -> pb.ServerMessage:
    """A lease with the fields the server fills for a no-op task of the default pool."""
    return pb.ServerMessage(
        lease=pb.Lease(
            lease=i,
            task_id=i,
            attempt=1,
            pool=POOL,
            priority=pb.PRIORITY_NORMAL,
            lease_ttl_s=LEASE_TTL_S,
        )
    )


class EchoServicer(cronoq_pb2_grpc.WorkersServicer):
    """[a]: per stream, `n` leases with as many in flight as the worker asked slots for; prints
    time and CPU per stream, then ends it."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def Work(self, request_iterator: Any, context: Any) -> None:
        slots = (await context.read()).register.slots
        await context.write(
            pb.ServerMessage(
                registered=pb.Registered(
                    worker_id=1,
                    slots=slots,
                    protocol_version=3,
                    max_message_bytes=LimitsSettings().max_message_bytes,
                    lease_ttl_s=LEASE_TTL_S,
                )
            )
        )
        n = self.n
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        sent = done = 0
        while sent < min(slots, n):
            sent += 1
            await context.write(_lease(sent))
        while done < n:
            msg = await context.read()
            assert msg.WhichOneof("msg") == "complete", msg
            done += 1
            if sent < n:
                sent += 1
                await context.write(_lease(sent))
        dt = time.perf_counter() - t0
        print(f"pairs={n} seconds={dt:.6f} cpu={time.process_time() - cpu0:.6f}", flush=True)


async def echo_main(n: int) -> None:
    server = grpc.aio.server()
    cronoq_pb2_grpc.add_WorkersServicer_to_server(EchoServicer(n), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"port={port}", flush=True)
    await server.wait_for_termination()


async def worker_main(target: str, slots: int, pool: str = POOL) -> None:
    """A raw protocol-v3 worker of `pool`: registers and completes every lease at once."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = cronoq_pb2_grpc.WorkersStub(channel).Work()
        await call.write(
            pb.WorkerMessage(
                register=pb.Register(
                    pool=pool, slots=slots, worker_name="bench", protocol_version=3
                )
            )
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    break
                kind = msg.WhichOneof("msg")
                if kind == "lease":
                    await call.write(pb.WorkerMessage(complete=pb.Complete(lease=msg.lease.lease)))
                elif kind == "registered":
                    print(f"registered slots={msg.registered.slots}", flush=True)
                elif kind == "shutdown":
                    break


async def client_worker_main(target: str, slots: int) -> None:
    """The same as worker_main with `cronoq.client.Worker` and a no-op handler, until the stream
    ends (the echo servicer ends it after its N pairs) or SIGTERM (against the server)."""
    from cronoq.client import ClientError, Lease, Worker

    async def handle(lease: Lease) -> None:
        return None

    worker = Worker(target, POOL, handle, slots=slots, name="bench", reconnect=False)
    serving = asyncio.create_task(worker.run())
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop())
    )
    await worker.wait_registered(30)
    print(f"registered slots={worker.granted_slots}", flush=True)
    with contextlib.suppress(ClientError):  # the echo servicer ends the stream: run() raises
        await serving


# --- child processes -------------------------------------------------------------------------


class Proc(Child):
    """A child process (stdout and stderr merged) whose CPU time can be read."""

    def cpu(self) -> float:
        """Seconds of CPU (user + system, every thread) the process has used so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


# Starts a worker process connected to a target and returns it once it has registered.
Launch = Callable[[str], Proc]


def _me(role: str, *args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--role", role, *args]


def _registered(worker: Proc, slots: int) -> Proc:
    granted = int(worker.expect(r"^registered slots=(\d+)").group(1))
    assert granted == slots, granted
    return worker


def start_worker(target: str, role: str = "worker", pool: str = POOL) -> Proc:
    """A Python worker process of `pool` (the raw one unless told) connected to `target`, once
    it has registered."""
    extra = () if pool == POOL else ("--pool", pool)  # --pool: the raw worker role only
    return _registered(Proc(_me(role, "--target", target, *extra), role), SLOTS)


def build_go_worker(out: str) -> Launch:
    """Builds the Go raw worker into the directory `out`; returns how to start it."""
    exe = os.path.join(out, "go-workers")
    subprocess.run(["go", "build", "-o", exe, "."], cwd=GO_WORKER, check=True)

    def start(target: str) -> Proc:
        argv = [exe, "-mode", "raw", "-target", target, "-slots", str(GO_SLOTS)]
        return _registered(Proc(argv, "go raw worker"), GO_SLOTS)

    return start


def start_server(cfg: str, profile_to: str | None = None) -> tuple[Proc, str]:
    """The server process and its gRPC address, once it has started its scheduler."""
    if profile_to is None:
        argv = [sys.executable, "-m", "cronoq.server.cli", "-c", cfg]
    else:
        argv = [sys.executable, "-c", PROFILED_SERVER, profile_to, "-c", cfg]
    server = Proc(argv, "cronoq-server")
    try:
        target = server.expect(r"event=listening grpc=(\S+)").group(1)
        server.expect(r"event=ready")
    except BaseException:
        server.stop()
        raise
    return server, target


class Fleet:
    """The server and its worker (started by `worker`: the Python raw worker unless told), on a
    temporary configuration file whose `[store]` table is `store` (the memory store unless
    told) and whose gRPC port `transport` serves; stopped on close()."""

    def __init__(
        self,
        worker: Launch = start_worker,
        *,
        transport: str = "auto",
        store: str = MEMORY_STORE,
        profile_to: str | None = None,
    ) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="cronoq-bench-")
        try:
            cfg = os.path.join(self.dir.name, "server.toml")
            with open(cfg, "w") as f:
                f.write(config(store, transport))
            self.server, self.target = start_server(cfg, profile_to)
        except BaseException:
            self.dir.cleanup()
            raise
        try:
            self.worker = worker(self.target)
        except BaseException:
            self.server.stop()
            self.dir.cleanup()
            raise

    def close(self) -> None:
        self.worker.stop()
        self.server.stop()
        self.dir.cleanup()


# --- phases ------------------------------------------------------------------------------------


@dataclass
class EchoRun:
    rate: float
    servicer_cpu: float  # seconds per pair
    worker_cpu: float


def phase_echo(echo: Proc, target: str, n: int, worker: Launch) -> EchoRun:
    w = worker(target)
    try:
        cpu_w = w.cpu()
        m = echo.expect(r"^pairs=(\d+) seconds=([\d.]+) cpu=([\d.]+)", timeout=60 + n / 500)
        # Read at once: the worker exits when the stream ends. Until it is reaped, its /proc
        # entry still holds its times.
        dw = w.cpu() - cpu_w
    finally:
        w.stop()
    assert int(m.group(1)) == n, m.group(0)
    return EchoRun(n / float(m.group(2)), float(m.group(3)) / n, dw / n)


@dataclass
class ServerRun:
    rate: float
    server_cpu: float  # seconds per task
    worker_cpu: float


class Client:
    """The benchmark's gRPC client of the server: a Tasks stub per caller (one per channel);
    the first channel also serves Admin and the round trips."""

    def __init__(self, *channels: grpc.aio.Channel) -> None:
        self.callers = [cronoq_pb2_grpc.TasksStub(c) for c in channels]
        self.tasks = self.callers[0]
        self.admin = cronoq_pb2_grpc.AdminStub(channels[0])

    async def succeeded(self) -> int:
        snap = await self.admin.Snapshot(pb.Empty())
        return int(snap.totals.succeeded)


@contextlib.asynccontextmanager
async def connect(target: str, callers: int = CALLERS) -> AsyncIterator[Client]:
    """A Client of `callers` channels to `target`, each on a connection of its own."""
    async with contextlib.AsyncExitStack() as stack:
        channels = [
            await stack.enter_async_context(
                grpc.aio.insecure_channel(target, options=OWN_CONNECTION)
            )
            for _ in range(callers)
        ]
        yield Client(*channels)


async def phase_server(
    client: Client, n: int, server: Proc, worker: Proc, spec: pb.TaskSpec | None = None
) -> ServerRun:
    """N tasks like `spec` (default: no-op tasks) by SubmitBatch, the batches dealt out to the
    client's callers."""
    spec = pb.TaskSpec() if spec is None else spec
    requests = [
        pb.SubmitBatchRequest(tasks=[spec for _ in range(min(BATCH, n - i))])
        for i in range(0, n, BATCH)
    ]
    k = len(client.callers)
    shares = [(tasks, requests[i::k]) for i, tasks in enumerate(client.callers) if requests[i::k]]

    async def caller(tasks: cronoq_pb2_grpc.TasksStub, share: list[pb.SubmitBatchRequest]) -> None:
        last = 0
        for req in share:
            last = (await tasks.SubmitBatch(req)).tasks[-1].id
        await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=last)))

    goal = await client.succeeded() + n
    cpu_s, cpu_w = server.cpu(), worker.cpu()
    t0 = time.perf_counter()
    await asyncio.gather(*(caller(tasks, share) for tasks, share in shares))
    while await client.succeeded() < goal:
        await asyncio.sleep(0.001)
    dt = time.perf_counter() - t0
    return ServerRun(n / dt, (server.cpu() - cpu_s) / n, (worker.cpu() - cpu_w) / n)


async def workers_connected(client: Client, want: int) -> None:
    """Until `want` workers are connected (1: the new one has registered with its slots; 0:
    the previous one has gone)."""
    while True:
        workers = (await client.admin.ListWorkers(pb.Empty())).workers
        if len(workers) == want and all(w.slots == SLOTS for w in workers):
            return
        await asyncio.sleep(0.01)


async def phase_client(n: int, fleet: Fleet) -> ServerRun:
    """[e]: the [b] measurement through `cronoq.client.Client` (built on the loop it runs on)."""
    from cronoq.client import Client as PyClient
    from cronoq.client import task

    specs = [task() for _ in range(n)]
    async with PyClient(fleet.target) as client:
        goal = (await client.snapshot()).totals.succeeded + n
        cpu_s, cpu_w = fleet.server.cpu(), fleet.worker.cpu()
        t0 = time.perf_counter()
        last = 0
        for i in range(0, n, BATCH):
            last = (await client.submit_batch(specs[i : i + BATCH]))[-1].id
        await client.wait(last)
        while (await client.snapshot()).totals.succeeded < goal:
            await asyncio.sleep(0.001)
        dt = time.perf_counter() - t0
    return ServerRun(n / dt, (fleet.server.cpu() - cpu_s) / n, (fleet.worker.cpu() - cpu_w) / n)


async def phase_roundtrip(client: Client, warmup: int, samples: int) -> list[float]:
    """Seconds per Submit(wait=true) of a no-op task, one at a time, after `warmup` of them."""
    request = pb.SubmitRequest(task=pb.TaskSpec(), wait=True)
    perf = time.perf_counter
    out: list[float] = []
    for i in range(warmup + samples):
        t0 = perf()
        resp = await client.tasks.Submit(request)
        dt = perf() - t0
        assert resp.result.status == pb.TASK_STATUS_SUCCEEDED, resp
        if i >= warmup:
            out.append(dt)
    out.sort()
    return out


async def _noop(ctx: Any, payload: Any) -> Any:
    return payload


async def phase_store_ceiling(n: int, store: SqliteStore | PostgresStore) -> float:
    """[f]'s ceiling: tasks/s of the library-mode Scheduler with `store` and a no-op executor,
    submitted as [b] submits them (batches of BATCH from CALLERS concurrent submitters)."""
    pools = [Pool(POOL, _noop, autoscale=False, max=POOL_MAX)]
    batches = [[Task(j) for j in range(i, min(i + BATCH, n))] for i in range(0, n, BATCH)]
    async with Scheduler(pools, store=store) as sched:

        async def submitter(share: list[list[Task]]) -> None:
            handles = [h for batch in share for h in await sched.submit_batch(batch)]
            for h in handles:
                await h

        t0 = time.perf_counter()
        await asyncio.gather(*(submitter(batches[i::CALLERS]) for i in range(CALLERS)))
        return n / (time.perf_counter() - t0)


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Durable:
    """A store of [f]: the body of the server's `[store]` table, and how to make a fresh store
    of the same kind for the library-mode ceiling."""

    table: str
    make: Callable[[], SqliteStore | PostgresStore]


def _durable(tmp: str, stack: contextlib.AsyncExitStack) -> tuple[dict[str, Durable], str]:
    """[f]'s stores (files in `tmp`; PostgreSQL on a private cluster stopped by `stack`), and
    why PostgreSQL is missing if it is."""
    files = itertools.count(1)
    stores = {
        "sqlite": Durable(
            f'kind = "sqlite"\npath = "{os.path.join(tmp, "server.db")}"',
            lambda: SqliteStore(os.path.join(tmp, f"ceiling{next(files)}.db")),
        )
    }
    cluster = Cluster()
    try:
        cluster.start()
    except RuntimeError as e:
        return stores, str(e)
    stack.callback(cluster.stop)
    os.environ[PG_ENV] = cluster.url  # the server's store reads it (url_env)
    schemas = itertools.count(1)
    stores["postgres"] = Durable(
        f'kind = "postgres"\nurl_env = "{PG_ENV}"',
        lambda: PostgresStore(cluster.url, schema=f"ceiling{next(schemas)}"),
    )
    return stores, ""


def _refused(e: RuntimeError) -> str:
    """The line saying why a server did not start, from the output expect() raised with."""
    lines = [ln for ln in str(e).splitlines()[1:] if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or [str(e)])[-1].strip()


def _runs(xs: list[float]) -> str:
    return "runs " + " ".join(f"{x / 1000:.1f}k" for x in xs)


R = TypeVar("R", EchoRun, ServerRun)


def _best(runs: list[R]) -> R:
    return max(runs, key=lambda r: r.rate)


def _header(title: str, sz: Sizes) -> None:
    print_about(title, f"; grpcio {grpc.__version__}")
    print_cpus("this client, the server (or echo servicer), one worker")
    print(
        f"sizes:    N={sz.n:,} ([e]: {sz.client_n:,}), best of {sz.reps} interleaved runs of "
        f"[a]/[b]/[d]/[e]/[f]; SubmitBatch of {BATCH:,} from {CALLERS} callers; round trips "
        f"{sz.rt_samples:,} after {sz.rt_warmup:,} warm-up; Go raw worker {GO_SLOTS} slots, "
        f"Python workers {SLOTS}"
    )


@dataclass
class Results:
    """Every run of [a]-[f], for the report."""

    transports: tuple[str, ...]  # measured: grpcio, and native when built
    durable: str  # the transport of [e] and [f]
    echo: list[EchoRun]  # [a]
    servers: dict[str, list[ServerRun]]  # [b] by transport, [f] by store
    round_trips: dict[str, list[float]]  # [c] by transport, sorted
    raw: list[EchoRun]  # [d]: the Python raw worker
    worker: list[EchoRun]  # [d]: cronoq.client.Worker
    client: list[ServerRun]  # [e]
    ceilings: dict[str, list[float]]  # [f]: tasks/s by store
    refused: dict[str, str]  # [f]: why the server of a store did not start
    no_pg: str  # why [f postgres] is not measured, if it is not


async def measure(sz: Sizes, transports: tuple[str, ...], durable: str) -> Results:
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            t0 = time.perf_counter()
            go = build_go_worker(tmp)
            print(f"built:    the Go raw worker in {time.perf_counter() - t0:.1f} s")
            stores, no_pg = _durable(tmp, stack)
            print(f"postgres: {'not measured: ' + no_pg if no_pg else 'a private cluster'}\n")
            echo = Proc(_me("echo", "--n", str(sz.n)), "echo servicer")
            stack.callback(echo.stop)
            echo_target = "127.0.0.1:" + echo.expect(r"^port=(\d+)").group(1)

            def fleet(worker: Launch, transport: str, store: str = MEMORY_STORE) -> Fleet:
                f = Fleet(worker, transport=transport, store=store)
                stack.callback(f.close)
                return f

            def client_worker(target: str) -> Proc:
                return start_worker(target, "client-worker")

            fleets = {t: fleet(go, t) for t in transports}
            refused: dict[str, str] = {}
            for name, store in stores.items():
                try:
                    fleets[name] = fleet(go, durable, store.table)
                except RuntimeError as e:
                    refused[name] = _refused(e)
            py_fleet = fleet(client_worker, durable)
            clients = {
                name: await stack.enter_async_context(connect(f.target))
                for name, f in fleets.items()
            }

            warm = min(sz.n, CALLERS * BATCH)
            for name, f in fleets.items():
                await phase_server(clients[name], warm, f.server, f.worker)
            await phase_client(min(sz.client_n, 2 * BATCH), py_fleet)
            for store in stores.values():
                await phase_store_ceiling(warm, store.make())
            r = Results(
                transports=transports,
                durable=durable,
                echo=[],
                servers={name: [] for name in fleets},
                round_trips={},
                raw=[],
                worker=[],
                client=[],
                ceilings={name: [] for name in stores},
                refused=refused,
                no_pg=no_pg,
            )
            for _ in range(sz.reps):
                r.echo.append(phase_echo(echo, echo_target, sz.n, go))
                for name, f in fleets.items():
                    r.servers[name].append(
                        await phase_server(clients[name], sz.n, f.server, f.worker)
                    )
                for name, store in stores.items():
                    r.ceilings[name].append(await phase_store_ceiling(sz.n, store.make()))
                r.raw.append(phase_echo(echo, echo_target, sz.n, start_worker))
                r.worker.append(phase_echo(echo, echo_target, sz.n, client_worker))
                r.client.append(await phase_client(sz.client_n, py_fleet))
            for t in transports:
                r.round_trips[t] = await phase_roundtrip(clients[t], sz.rt_warmup, sz.rt_samples)
    return r


def _rows(
    phase: str, r: Results, targets: dict[str, bool | None], keys: tuple[str, ...]
) -> Iterator[tuple[str, str]]:
    """(transport, label) of each measured row of `phase`; a skipped one is printed here, and
    its targets (`keys`) are not measured."""
    for t in TRANSPORTS:
        label = f"[{phase} {t}]".ljust(12)
        if t in r.transports:
            yield t, label
            continue
        print(f"{label} skipped: cronoq._native is not built")
        targets.update(dict.fromkeys(keys))


def report(sz: Sizes, r: Results) -> None:
    targets: dict[str, bool | None] = {}  # None: not measured
    ea = _best(r.echo)
    print(
        f"[a]          bare grpc.aio echo, Go raw worker  N={sz.n:,}: {ea.rate:>8,.0f} pairs/s "
        f"({1e6 / ea.rate:.0f} us each)   CPU per pair: servicer {ea.servicer_cpu * 1e6:.0f} us, "
        f"worker {ea.worker_cpu * 1e6:.1f} us   ({_runs([x.rate for x in r.echo])})"
    )
    for t, label in _rows("b", r, targets, ("[b native] ratio", "[b native] CPU")):
        b = _best(r.servers[t])
        ratio, cpu = b.rate / ea.rate, b.server_cpu * 1e6
        goal_ratio = goal_cpu = ""
        if t == "native":
            targets["[b native] ratio"] = ratio >= TARGET_RATIO
            targets["[b native] CPU"] = cpu <= TARGET_CPU_US
            goal_ratio = f"  target >= {TARGET_RATIO:g}x  {verdict(ratio >= TARGET_RATIO)}"
            goal_cpu = f"  target <= {TARGET_CPU_US:g} us  {verdict(cpu <= TARGET_CPU_US)}"
        print(
            f"{label} server, SubmitBatch x{CALLERS}     N={sz.n:,}: {b.rate:>8,.0f} tasks/s "
            f"({1e6 / b.rate:.0f} us each)   {ratio:.2f}x [a]{goal_ratio}   "
            f"({_runs([x.rate for x in r.servers[t]])})"
        )
        print(
            f"{'':12} CPU per task: server {cpu:.0f} us{goal_cpu}; worker "
            f"{b.worker_cpu * 1e6:.1f} us (best run)"
        )
    for t, label in _rows("c", r, targets, ("[c native] p50",)):
        rt = r.round_trips[t]
        p50, p99 = percentile(rt, 0.50) * 1e3, percentile(rt, 0.99) * 1e3
        goal = ""
        if t == "native":
            targets["[c native] p50"] = p50 <= TARGET_P50_MS
            goal = f"  target p50 <= {TARGET_P50_MS:g} ms  {verdict(p50 <= TARGET_P50_MS)}"
        print(
            f"{label} Submit(wait=true) round trip  {len(rt):,} samples: p50 {p50:.2f} ms  "
            f"p99 {p99:.2f} ms{goal}"
        )
    # The Worker's CPU per lease is compared run by run with the Python raw worker's of the same
    # round (each is its own process's CPU, so the load of the other processes matters little).
    worker_ratios = [d.worker_cpu / a.worker_cpu for a, d in zip(r.raw, r.worker, strict=True)]
    wr = min(worker_ratios)
    pd, pr = _best(r.worker), _best(r.raw)
    targets["[d]"] = wr <= TARGET_WORKER_CPU
    print(
        f"[d]          echo, cronoq.client.Worker  N={sz.n:,}: {pd.rate:>8,.0f} pairs/s   CPU per "
        f"lease {pd.worker_cpu * 1e6:.0f} us = {wr:.2f}x the Python raw worker's  target <= "
        f"{TARGET_WORKER_CPU}x  {verdict(wr <= TARGET_WORKER_CPU)}   "
        f"(runs {' '.join(f'{x:.2f}x' for x in worker_ratios)})"
    )
    print(
        f"{'':12} Python raw worker {pr.worker_cpu * 1e6:.0f} us per lease ({pr.rate:,.0f} "
        f"pairs/s); the Go raw worker's in [a]: {ea.worker_cpu * 1e6:.1f} us"
    )
    ce = _best(r.client)
    print(
        f"{f'[e {r.durable}]':12} Client.submit_batch + Worker  N={sz.client_n:,}: "
        f"{ce.rate:>8,.0f} tasks/s   CPU per task: Worker {ce.worker_cpu * 1e6:.0f} us, server "
        f"{ce.server_cpu * 1e6:.0f} us   ({_runs([x.rate for x in r.client])})"
    )
    memory = _best(r.servers[r.durable]).rate
    for name in ("sqlite", "postgres"):
        label = f"[f {name}]".ljust(12)
        if name not in r.ceilings:
            print(f"{label} skipped: {r.no_pg}")
            targets[f"[f {name}]"] = None
            continue
        ceiling = max(r.ceilings[name])
        at = f"store ceiling {ceiling:,.0f} tasks/s ({_runs(r.ceilings[name])})"
        if name in r.refused:
            targets[f"[f {name}]"] = False
            print(f"{label} server not measured ({r.refused[name]})  {verdict(False)}; {at}")
            continue
        f = _best(r.servers[name])
        ok = f.rate >= TARGET_STORE_RATIO * min(memory, ceiling)
        targets[f"[f {name}]"] = ok
        print(
            f"{label} server ({r.durable}), SubmitBatch x{CALLERS}  N={sz.n:,}: {f.rate:>8,.0f} "
            f"tasks/s   {f.rate / memory:.2f}x [b {r.durable}], {f.rate / ceiling:.2f}x its "
            f"ceiling  target >= {TARGET_STORE_RATIO}x the lower  {verdict(ok)}   "
            f"({_runs([x.rate for x in r.servers[name]])})"
        )
        print(
            f"{'':12} CPU per task: server {f.server_cpu * 1e6:.0f} us, worker "
            f"{f.worker_cpu * 1e6:.1f} us; {at}, library Scheduler, no transport"
        )
    judged = {k: v for k, v in targets.items() if v is not None}
    print(
        f"\ntargets:  {sum(judged.values())}/{len(judged)} met: "
        + ", ".join(f"{k} {'SKIP' if v is None else verdict(v)}" for k, v in targets.items())
    )


async def bench(sz: Sizes) -> int:
    native = native_built()
    if not native:
        print(
            "native:   cronoq._native is not built: the [b native] and [c native] rows are "
            "skipped; [e] and [f] run on grpcio"
        )
    print(
        f"targets:  [b native] >= {TARGET_RATIO:g}x [a] and server CPU <= {TARGET_CPU_US:g} us "
        f"per task; [c native] p50 <= {TARGET_P50_MS:g} ms; [d] <= {TARGET_WORKER_CPU}x the "
        f"Python raw worker's CPU;\n          [f] >= {TARGET_STORE_RATIO}x the lower of [b] and "
        "the store's ceiling"
    )
    transports = TRANSPORTS if native else ("grpcio",)
    report(sz, await measure(sz, transports, transports[-1]))
    return 0


# --- profile mode ------------------------------------------------------------------------------

# Own time is summed by where the function lives; C functions ("~") by the type they belong to.
# Compiled code has no Python frame, so its time is the own time of the nearest profiled caller:
# grpc.aio's Cython coroutines and callbacks and asyncio's C tasks are stepped by the event loop
# through Context.run, and protobuf (upb) builds and parses messages inside its callers.
AREAS = (
    ("C and Cython under loop callbacks: grpc.aio, C tasks (Context.run)", "_contextvars.Context"),
    ("cronoq.core", "/cronoq/core/"),
    ("cronoq.server", "/cronoq/server/"),
    ("cronoq (runtime, options)", "/cronoq/"),
    ("asyncio (Python)", "/asyncio/"),
    ("grpc (Python)", "grpc"),
    ("protobuf (Python)", "protobuf"),
    ("logging", "/logging/"),
)


def _area(file: str, name: str) -> str:
    where = name if file == "~" else file
    for label, marker in AREAS:
        if marker in where:
            return label
    return "other (stdlib, builtins)"


def _areas(stats: pstats.Stats) -> list[tuple[str, float]]:
    own: dict[str, float] = {}
    for (file, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        area = _area(file, name)
        own[area] = own.get(area, 0.0) + tt
    return sorted(own.items(), key=lambda kv: -kv[1])


async def profile(sz: Sizes, top: int, transport: str) -> int:
    with tempfile.TemporaryDirectory(prefix="cronoq-prof-") as tmp:
        go = build_go_worker(tmp)
        out = os.path.join(tmp, "server.prof")
        fleet = Fleet(go, transport=transport, profile_to=out)
        try:
            async with connect(fleet.target) as client:
                await phase_server(client, min(sz.n, CALLERS * BATCH), fleet.server, fleet.worker)
                fleet.server.p.send_signal(signal.SIGUSR1)
                fleet.server.expect(r"^bench_profile=on")
                run = await phase_server(client, sz.n, fleet.server, fleet.worker)
                fleet.server.p.send_signal(signal.SIGUSR2)
                fleet.server.expect(r"^bench_profile=saved")
        finally:
            fleet.close()
        stats = pstats.Stats(out, stream=sys.stdout)
    total = stats.total_tt
    print(
        f"[b {transport}] under cProfile, N={sz.n:,}: {run.rate:,.0f} tasks/s; server CPU "
        f"{run.server_cpu * 1e6:,.0f} us per task (/proc, every thread), of which cProfile saw "
        f"{total / sz.n * 1e6:,.0f} us of Python (own times, profiler overhead included)"
    )
    print("\nown time by source area (compiled code counts in its nearest profiled caller):")
    for area, tt in _areas(stats):
        print(f"  {tt / total:6.1%}  {tt / sz.n * 1e6:8.1f} us/task  {area}")
    print()
    stats.sort_stats("tottime").print_stats(top)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="tasks and pairs per run (20000)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="run [b] once with the server under cProfile and print where its time goes",
    )
    ap.add_argument(
        "--transport", choices=TRANSPORTS, help="the server's transport under --profile"
    )
    ap.add_argument("--top", type=int, default=25, help="functions shown with --profile (25)")
    # The helper processes: this file is also the echo servicer of [a] and the Python workers.
    ap.add_argument("--role", choices=("echo", "worker", "client-worker"), help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--pool", default=POOL, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    base = QUICK if args.quick else FULL
    sz = Sizes(**{**base.__dict__, **({"n": args.n} if args.n is not None else {})})
    if sz.n < 1:
        ap.error("--n must be >= 1")
    if args.role == "echo":
        asyncio.run(echo_main(sz.n))
        return 0
    if args.role == "worker":
        asyncio.run(worker_main(args.target, SLOTS, args.pool))
        return 0
    if args.role == "client-worker":
        asyncio.run(client_worker_main(args.target, SLOTS))
        return 0
    if args.transport and not args.profile:
        ap.error("--transport goes with --profile")
    if args.profile:
        transport = args.transport or ("native" if native_built() else "grpcio")
        if transport == "native" and not native_built():
            ap.error("--transport native: cronoq._native is not built")
        _header(f"cronoq server benchmark, profile of [b {transport}]", sz)
        print()
        return asyncio.run(profile(sz, args.top, transport))
    _header("cronoq server benchmark" + (" (--quick sizes)" if args.quick else ""), sz)
    return asyncio.run(bench(sz))


if __name__ == "__main__":
    sys.exit(main())
