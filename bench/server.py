"""Server benchmark of cronoq: `cronoq-server` against a bare gRPC ceiling, in one run.

Machines here are noisy and gRPC's own cost per message dominates, so the server's throughput is
printed as a ratio to a bare grpc.aio echo measured in the same run, and both take the best of
interleaved runs. Every process (this client, the server or echo servicer, the worker) is a
separate Python process on loopback; the echo servicer and the worker are this file run with
the hidden `--role echo|worker|client-worker`.

Phases
------
[a]  the ceiling: a bare grpc.aio servicer of `Workers/Work` (no scheduler) answers the
     worker's register, then sends N Lease messages over the one stream, keeping up to 64 in
     flight (64 slots), and counts the Complete replies. The worker process is the one [b]
     uses: it answers each Lease with a Complete at once. Pairs/s, timed by the servicer from
     the first lease to the last complete, and the CPU of each side per pair.
[b]  the server: `python -m cronoq.server.cli -c CFG` (one pool `default`, max 64, memory
     store, ports 0, log level info so that `event=listening` is printed) with that worker
     process (64 slots) connected; N no-op tasks (empty TaskSpec) are submitted by
     Tasks.SubmitBatch in batches of limits.max_tasks_per_batch, one call after the other,
     then Tasks.Wait on the last task and Admin.Snapshot polled until N more have succeeded.
     The requests are built before timing. Tasks/s, ratio to [a] (target >= 0.5x), and the
     server's and the worker's CPU (utime + stime from /proc/<pid>/stat, every thread) per
     1k tasks.
[c]  sequential Tasks.Submit(wait=true) round trips with the same worker, after a warm-up:
     p50 and p99 (target p50 <= 2 ms).
[d]  [a] again with `cronoq.client.Worker` (64 slots, a no-op handler) in place of the raw
     worker: its CPU per lease against the raw worker's in [a] (target <= 1.5x).
[e]  the client path: `cronoq.client.Client.submit_batch` of 10k tasks (`task()` specs built
     before timing, batches of limits.max_tasks_per_batch), `Client.wait` on the last and
     `Client.snapshot` until all succeeded, served by a second server whose only worker is
     `cronoq.client.Worker` with 64 slots. Tasks/s and the Worker's CPU per 1k tasks.

Usage: python bench/server.py [--n N] [--quick] [--profile] [--top K]

--quick uses small sizes (a smoke run). --profile runs [b] once with the server under cProfile
(enabled by a signal right before the timed run and saved right after it, so start-up and
warm-up are left out) and prints the top functions by own time and own time by source area
instead of the benchmark. The exit status is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pstats
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import grpc

from _common import Child, percentile, print_about, print_cpus, verdict
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.config import LimitsSettings

SLOTS = 64
POOL = "default"
LEASE_TTL_S = 30.0  # the default pool's, so the echo's leases are as big as the server's
BATCH = LimitsSettings().max_tasks_per_batch
TICK = os.sysconf("SC_CLK_TCK")

TARGET_RATIO = 0.5
TARGET_P50_MS = 2.0
TARGET_WORKER_CPU = 1.5  # cronoq.client.Worker CPU per lease / the raw worker's
CLIENT_N = 10_000

MEMORY_STORE = 'kind = "memory"'


def config(store: str = MEMORY_STORE) -> str:
    """The server's configuration, with `store` as the body of its `[store]` table."""
    return f"""\
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
log_level = "info"

[store]
{store}

[[pools]]
name = "{POOL}"
max = {SLOTS}
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


# --- the two helper processes: this file run with --role ----------------------------------


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
    """[a]: per stream, `n` leases with up to SLOTS in flight; prints time and CPU per stream."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def Work(self, request_iterator: Any, context: Any) -> None:
        await context.read()  # the register
        await context.write(
            pb.ServerMessage(
                registered=pb.Registered(
                    worker_id=1,
                    slots=SLOTS,
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
        while sent < min(SLOTS, n):
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
    """A raw protocol-v3 worker of `pool`: registers, completes every lease at once, and prints
    the CPU it spent from its registration to the end of the stream."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = cronoq_pb2_grpc.WorkersStub(channel).Work()
        await call.write(
            pb.WorkerMessage(
                register=pb.Register(
                    pool=pool, slots=slots, worker_name="bench", protocol_version=3
                )
            )
        )
        leases = 0
        cpu0 = time.process_time()
        with contextlib.suppress(grpc.aio.AioRpcError):
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    break
                kind = msg.WhichOneof("msg")
                if kind == "lease":
                    await call.write(pb.WorkerMessage(complete=pb.Complete(lease=msg.lease.lease)))
                    leases += 1
                elif kind == "registered":
                    cpu0 = time.process_time()
                    print(f"registered slots={msg.registered.slots}", flush=True)
                elif kind == "shutdown":
                    break
        print(f"done leases={leases} cpu={time.process_time() - cpu0:.6f}", flush=True)


async def client_worker_main(target: str, slots: int) -> None:
    """The same as worker_main with `cronoq.client.Worker` and a no-op handler. It prints the
    CPU spent from its registration to the end of the stream (against the echo servicer,
    which ends the stream after its N pairs), or to SIGTERM (against the server)."""
    from cronoq.client import ClientError, Lease, Worker

    leases = 0

    async def handle(lease: Lease) -> None:
        nonlocal leases
        leases += 1

    worker = Worker(target, POOL, handle, slots=slots, name="bench", reconnect=False)
    serving = asyncio.create_task(worker.run())
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop())
    )
    await worker.wait_registered(30)
    cpu0 = time.process_time()
    print(f"registered slots={worker.granted_slots}", flush=True)
    with contextlib.suppress(ClientError):  # the echo servicer ends the stream: run() raises
        await serving
    print(f"done leases={leases} cpu={time.process_time() - cpu0:.6f}", flush=True)


# --- child processes -------------------------------------------------------------------------


class Proc(Child):
    """A child process (stdout and stderr merged) whose CPU time can be read."""

    def cpu(self) -> float:
        """Seconds of CPU (user + system, every thread) the process has used so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


def _me(role: str, *args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--role", role, *args]


def start_worker(target: str, role: str = "worker", pool: str = POOL) -> Proc:
    """A worker process of `pool` (the raw one unless told) connected to `target`, once it
    has registered."""
    extra = () if pool == POOL else ("--pool", pool)  # --pool: the raw worker role only
    w = Proc(_me(role, "--target", target, *extra), role)
    slots = int(w.expect(r"^registered slots=(\d+)").group(1))
    assert slots == SLOTS, slots
    return w


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


# --- phases ------------------------------------------------------------------------------------


@dataclass
class EchoRun:
    rate: float
    servicer_cpu: float  # seconds per pair
    worker_cpu: float


def phase_echo(echo: Proc, target: str, n: int, role: str = "worker") -> EchoRun:
    worker = Proc(_me(role, "--target", target), f"echo {role}")
    try:
        m = echo.expect(r"^pairs=(\d+) seconds=([\d.]+) cpu=([\d.]+)", timeout=60 + n / 500)
        w = worker.expect(r"^done leases=(\d+) cpu=([\d.]+)")
    finally:
        worker.stop()
    assert int(m.group(1)) == n and int(w.group(1)) == n, (m.group(0), w.group(0))
    return EchoRun(n / float(m.group(2)), float(m.group(3)) / n, float(w.group(2)) / n)


@dataclass
class ServerRun:
    rate: float
    server_cpu: float  # seconds per task
    worker_cpu: float


class Client:
    """The benchmark's gRPC client of the server."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.tasks = cronoq_pb2_grpc.TasksStub(channel)
        self.admin = cronoq_pb2_grpc.AdminStub(channel)

    async def succeeded(self) -> int:
        snap = await self.admin.Snapshot(pb.Empty())
        return int(snap.totals.succeeded)


async def phase_server(client: Client, n: int, server: Proc, worker: Proc) -> ServerRun:
    requests = [
        pb.SubmitBatchRequest(tasks=[pb.TaskSpec() for _ in range(min(BATCH, n - i))])
        for i in range(0, n, BATCH)
    ]
    goal = await client.succeeded() + n
    cpu_s, cpu_w = server.cpu(), worker.cpu()
    t0 = time.perf_counter()
    last = 0
    for req in requests:
        last = (await client.tasks.SubmitBatch(req)).tasks[-1].id
    await client.tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=last)))
    while await client.succeeded() < goal:
        await asyncio.sleep(0.001)
    dt = time.perf_counter() - t0
    return ServerRun(n / dt, (server.cpu() - cpu_s) / n, (worker.cpu() - cpu_w) / n)


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


# --- the run -----------------------------------------------------------------------------------


def _runs(xs: list[float]) -> str:
    return "runs " + " ".join(f"{x / 1000:.1f}k" for x in xs)


def _header(title: str, sz: Sizes) -> None:
    print_about(title, f"; grpcio {grpc.__version__}")
    print_cpus("this client, the server (or echo servicer), one worker")
    print(
        f"sizes:    N={sz.n:,} ([e]: {sz.client_n:,}), best of {sz.reps} interleaved runs of "
        f"[a]/[b]/[d]/[e]; SubmitBatch of {BATCH:,}; round trips {sz.rt_samples:,} after "
        f"{sz.rt_warmup:,} warm-up; {SLOTS} slots"
    )
    print()


class Fleet:
    """The server and its worker (the raw one, or `cronoq.client.Worker` with
    role="client-worker"), on a temporary configuration file whose `[store]` table is `store`
    (the memory store unless told); stopped on exit."""

    def __init__(
        self, profile_to: str | None = None, role: str = "worker", store: str = MEMORY_STORE
    ) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="cronoq-bench-")
        try:
            cfg = os.path.join(self.dir.name, "server.toml")
            with open(cfg, "w") as f:
                f.write(config(store))
            self.server, self.target = start_server(cfg, profile_to)
        except BaseException:
            self.dir.cleanup()
            raise
        try:
            self.worker = start_worker(self.target, role)
        except BaseException:
            self.server.stop()
            self.dir.cleanup()
            raise

    def close(self) -> None:
        self.worker.stop()
        self.server.stop()
        self.dir.cleanup()


async def bench(sz: Sizes) -> int:
    echo = Proc(_me("echo", "--n", str(sz.n)), "echo servicer")
    echo_port = echo.expect(r"^port=(\d+)").group(1)
    echo_target = f"127.0.0.1:{echo_port}"
    fleet = Fleet()
    py_fleet = Fleet(role="client-worker")
    try:
        async with grpc.aio.insecure_channel(fleet.target) as channel:
            client = Client(channel)
            await phase_server(client, min(sz.n, 2 * BATCH), fleet.server, fleet.worker)  # warm-up
            await phase_client(min(sz.client_n, 2 * BATCH), py_fleet)  # warm-up
            echo_runs: list[EchoRun] = []
            server_runs: list[ServerRun] = []
            py_echo_runs: list[EchoRun] = []
            client_runs: list[ServerRun] = []
            for _ in range(sz.reps):
                echo_runs.append(phase_echo(echo, echo_target, sz.n))
                server_runs.append(await phase_server(client, sz.n, fleet.server, fleet.worker))
                py_echo_runs.append(phase_echo(echo, echo_target, sz.n, "client-worker"))
                client_runs.append(await phase_client(sz.client_n, py_fleet))
            rt = await phase_roundtrip(client, sz.rt_warmup, sz.rt_samples)
    finally:
        py_fleet.close()
        fleet.close()
        echo.stop()

    ea = max(echo_runs, key=lambda r: r.rate)
    sb = max(server_runs, key=lambda r: r.rate)
    ratio = sb.rate / ea.rate
    p50 = percentile(rt, 0.50) * 1e3
    p99 = percentile(rt, 0.99) * 1e3
    print(
        f"[a]  bare grpc.aio echo     N={sz.n:,}: {ea.rate:>8,.0f} pairs/s "
        f"({1e6 / ea.rate:.0f} us each)   CPU per pair: servicer {ea.servicer_cpu * 1e6:.0f} us, "
        f"worker {ea.worker_cpu * 1e6:.0f} us   ({_runs([r.rate for r in echo_runs])})"
    )
    print(
        f"[b]  server, SubmitBatch    N={sz.n:,}: {sb.rate:>8,.0f} tasks/s "
        f"({1e6 / sb.rate:.0f} us each)   {ratio:.2f}x [a]  target >= {TARGET_RATIO}x  "
        f"{verdict(ratio >= TARGET_RATIO)}   ({_runs([r.rate for r in server_runs])})"
    )
    print(
        f"     CPU per 1k tasks: server {sb.server_cpu * 1e6:,.0f} ms, worker "
        f"{sb.worker_cpu * 1e6:,.0f} ms (best run; /proc utime+stime); [a] per 1k pairs: "
        f"servicer {ea.servicer_cpu * 1e6:,.0f} ms, worker {ea.worker_cpu * 1e6:,.0f} ms"
    )
    print(
        f"[c]  Submit(wait=true) round trip  {len(rt):,} samples: p50 {p50:.2f} ms  "
        f"p99 {p99:.2f} ms  target p50 <= {TARGET_P50_MS:g} ms  {verdict(p50 <= TARGET_P50_MS)}"
    )
    # The Worker's CPU per lease is compared run by run with the raw worker's of the same round
    # (each is its own process's CPU, so the load of the other processes matters little).
    worker_ratios = [
        d.worker_cpu / a.worker_cpu for a, d in zip(echo_runs, py_echo_runs, strict=True)
    ]
    wr = min(worker_ratios)
    pd = max(py_echo_runs, key=lambda r: r.rate)
    print(
        f"[d]  echo, cronoq.client.Worker  N={sz.n:,}: {pd.rate:>8,.0f} pairs/s   CPU per lease "
        f"{pd.worker_cpu * 1e6:.0f} us = {wr:.2f}x the raw worker's  target <= "
        f"{TARGET_WORKER_CPU}x  {verdict(wr <= TARGET_WORKER_CPU)}   "
        f"(runs {' '.join(f'{r:.2f}x' for r in worker_ratios)})"
    )
    ce = max(client_runs, key=lambda r: r.rate)
    print(
        f"[e]  Client.submit_batch + Worker  N={sz.client_n:,}: {ce.rate:>8,.0f} tasks/s   "
        f"CPU per 1k tasks: Worker {ce.worker_cpu * 1e6:,.0f} ms, server "
        f"{ce.server_cpu * 1e6:,.0f} ms   ({_runs([r.rate for r in client_runs])})"
    )
    met = (ratio >= TARGET_RATIO) + (p50 <= TARGET_P50_MS) + (wr <= TARGET_WORKER_CPU)
    print(f"\ntargets:  {met}/3 met")
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


async def profile(sz: Sizes, top: int) -> int:
    with tempfile.TemporaryDirectory(prefix="cronoq-prof-") as tmp:
        out = os.path.join(tmp, "server.prof")
        fleet = Fleet(profile_to=out)
        try:
            async with grpc.aio.insecure_channel(fleet.target) as channel:
                client = Client(channel)
                await phase_server(client, min(sz.n, 2 * BATCH), fleet.server, fleet.worker)
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
        f"[b] under cProfile, N={sz.n:,}: {run.rate:,.0f} tasks/s; server CPU "
        f"{run.server_cpu * 1e6:,.0f} ms per 1k tasks (/proc, every thread), of which cProfile "
        f"saw {total / sz.n * 1e6:,.0f} ms of Python (own times, profiler overhead included)"
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
    ap.add_argument("--top", type=int, default=25, help="functions shown with --profile (25)")
    # The helper processes: this file is also the echo servicer of [a] and the worker.
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
    if args.profile:
        _header("cronoq server benchmark, profile of [b]", sz)
        return asyncio.run(profile(sz, args.top))
    _header("cronoq server benchmark" + (" (--quick sizes)" if args.quick else ""), sz)
    return asyncio.run(bench(sz))


if __name__ == "__main__":
    sys.exit(main())
