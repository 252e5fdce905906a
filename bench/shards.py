"""Sharding benchmark of cronoq: two shards against one unsharded server, in one run.

N no-op tasks are spread over two pools, p1 and p2. They run on one unsharded server, then on two
shards (a serves p1, b serves p2: two server processes), submitted to each pool's own shard or
all through shard a, which forwards b's half. Machines here are noisy, so each figure is a ratio
to the one it is compared with in the same run, and every figure is the best of K interleaved
runs. Every process (this client, each server, each worker) is a separate Python process on
loopback; servers, workers, CPU accounting and the gRPC client are bench/server.py's.

Phases
------
[s1] baseline: one unsharded server (`python -m cronoq.server.cli -c CFG`, memory store) with
     pools p1 and p2 (max 64 each) and two raw workers of bench/server.py (`--role worker`:
     each Lease answered with a Complete at once), one per pool with 64 slots. N tasks, half
     in each pool, sent as Tasks.SubmitBatch calls of limits.max_tasks_per_batch tasks of one
     pool (built before timing) by two concurrent senders, one per pool, each sending its
     batches one after the other and then Tasks.Wait on its last task; then Admin.Snapshot is
     polled until N more have succeeded. Tasks/s.
[s2] sharded, direct: the same N and batches on shards a (p1) and b (p2), two server processes
     with a raw worker each on its own shard; each sender sends its pool's batches to that
     pool's shard. Tasks/s in all and the ratio to [s1] (target >= 1.5x). Completion is polled
     on each shard with `cronoq-forwarded: 1` (the shard's own Snapshot, not a merged one).
[s3] sharded, forwarded: the same with both senders on shard a, which forwards every p2 batch
     (and the Wait on p2's last task) to b. Tasks/s and the ratio to [s2] (target >= 0.5x).
[s4] the overhead of a forward per call: sequential calls of one task of pool p2, after a
     warm-up, sent to b (direct) and to a (forwarded to b), alternately: Tasks.Submit of one
     no-op task without waiting, and Tasks.Get by id of a task of b. p50 and p99 of each, and
     the difference of the p50s (what a forward adds to a call).

For [s1]-[s3], the CPU (utime + stime from /proc/<pid>/stat, every thread) of each server, of
the workers and of this client per 1k tasks (best run), and their sum per second of the run
against the cores there are: where the time goes.

Usage: python bench/shards.py [--n N] [--quick] [--runs K]

--quick uses small sizes (a smoke run). The exit status is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from _common import percentile, print_about, print_cpus, verdict
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from server import BATCH, MEMORY_STORE, SLOTS, Client, Proc, start_server, start_worker

POOLS = ("p1", "p2")
# The shards of [s2]-[s4]: name, number (the top 8 bits of its task ids), its one pool.
SHARDS = (("a", 1, "p1"), ("b", 2, "p2"))
FORWARDED = (("cronoq-forwarded", "1"),)  # asks a shard for its own part only (no gather)

TARGET_SHARDED = 1.5  # [s2] / [s1]
TARGET_FORWARDED = 0.5  # [s3] / [s2]


@dataclass
class Sizes:
    n: int
    runs: int
    rt_warmup: int
    rt_samples: int


FULL = Sizes(n=20_000, runs=3, rt_warmup=200, rt_samples=2_000)
QUICK = Sizes(n=2_000, runs=1, rt_warmup=20, rt_samples=200)


# --- configuration and processes ---------------------------------------------------------------


def _free_port() -> int:
    """A loopback port free now (the shards' endpoints must be known before any starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(grpc_addr: str = "127.0.0.1:0", shard: str = "", plan: str = "") -> str:
    """A server's configuration: pools p1 and p2 (max SLOTS each), the memory store; with
    `shard`, the server of that shard of `plan` (the `[[shards]]` tables)."""
    own = f'shard = "{shard}"\n' if shard else ""
    pools = "".join(f'\n[[pools]]\nname = "{p}"\nmax = {SLOTS}\n' for p in POOLS)
    return f"""\
[server]
grpc_addr = "{grpc_addr}"
http_addr = "127.0.0.1:0"
log_level = "info"
shutdown_grace_s = 0.5
{own}
[store]
{MEMORY_STORE}
{pools}
{plan}"""


def shard_plan(ports: dict[str, int]) -> str:
    return "".join(
        f'\n[[shards]]\nname = "{name}"\nnumber = {number}\npools = ["{pool}"]\n'
        f'endpoint = "http://127.0.0.1:{ports[name]}"\n'
        for name, number, pool in SHARDS
    )


@dataclass
class Server:
    name: str  # "single", or the shard's name
    proc: Proc
    target: str
    channel: grpc.aio.Channel | None = None

    @property
    def client(self) -> Client:
        assert self.channel is not None
        return Client(self.channel)

    async def own_succeeded(self) -> int:
        """Tasks succeeded on this server's own shard (the whole server when unsharded)."""
        snap = await self.client.admin.Snapshot(pb.Empty(), metadata=FORWARDED)
        return int(snap.totals.succeeded)


@dataclass
class Group:
    """Servers, and a raw worker per pool on the server of that pool; stopped by close()."""

    servers: list[Server]
    workers: dict[str, Proc] = field(default_factory=dict)  # by pool
    dir: tempfile.TemporaryDirectory[str] = field(
        default_factory=lambda: tempfile.TemporaryDirectory(prefix="cronoq-bench-")
    )

    def procs(self) -> dict[str, Proc]:
        out = {f"server {s.name}": s.proc for s in self.servers}
        out.update((f"worker {p}", w) for p, w in self.workers.items())
        return out

    def open(self) -> None:
        for s in self.servers:
            s.channel = grpc.aio.insecure_channel(s.target)

    async def close(self) -> None:
        for w in self.workers.values():
            w.stop()
        for s in self.servers:
            if s.channel is not None:
                await s.channel.close()
            s.proc.stop()
        self.dir.cleanup()


def _write(group: Group, name: str, text: str) -> str:
    path = os.path.join(group.dir.name, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def start_single() -> Group:
    """[s1]'s unsharded server with both pools and a worker of each."""
    group = Group([])
    try:
        proc, target = start_server(_write(group, "single.toml", config()))
        group.servers.append(Server("single", proc, target))
        for pool in POOLS:
            group.workers[pool] = start_worker(target, pool=pool)
    except BaseException:
        _stop(group)
        raise
    return group


def start_sharded(tries: int = 3) -> Group:
    """Shards a and b (a server each, on ports chosen in advance), each with the worker of its
    pool. A port taken between its choice and the server's bind is retried."""
    for attempt in range(tries):
        group = Group([])
        ports = {name: _free_port() for name, _, _ in SHARDS}
        plan = shard_plan(ports)
        try:
            for name, _, _ in SHARDS:
                cfg = config(f"127.0.0.1:{ports[name]}", name, plan)
                proc, target = start_server(_write(group, f"{name}.toml", cfg))
                group.servers.append(Server(name, proc, target))
            for (_, _, pool), server in zip(SHARDS, group.servers, strict=True):
                group.workers[pool] = start_worker(server.target, pool=pool)
        except RuntimeError:
            _stop(group)
            if attempt == tries - 1:
                raise
            continue
        except BaseException:
            _stop(group)
            raise
        return group
    raise AssertionError("unreachable")


def _stop(group: Group) -> None:
    """Stop what a group started before it failed to start (no channel is open yet)."""
    for w in group.workers.values():
        w.stop()
    for s in group.servers:
        s.proc.stop()
    group.dir.cleanup()


# --- phases ------------------------------------------------------------------------------------


def batches(n: int) -> dict[str, list[pb.SubmitBatchRequest]]:
    """N no-op tasks, half in each pool (p1 takes the odd one), in batches of one pool."""
    out: dict[str, list[pb.SubmitBatchRequest]] = {}
    for i, pool in enumerate(POOLS):
        count = n // len(POOLS) + (1 if i < n % len(POOLS) else 0)
        out[pool] = [
            pb.SubmitBatchRequest(
                tasks=[pb.TaskSpec(pool=pool) for _ in range(min(BATCH, count - j))]
            )
            for j in range(0, count, BATCH)
        ]
    return out


@dataclass
class Run:
    rate: float  # tasks/s
    seconds: float
    cpu: dict[str, float]  # seconds per task, by process ("client": this process)

    def busy(self, n: int) -> float:
        """Cores in use on average during the run: every process's CPU over the wall time."""
        return sum(self.cpu.values()) * n / self.seconds


async def phase_throughput(group: Group, senders: dict[str, Server], n: int) -> Run:
    """N tasks: each pool's batches sent by its own sender to `senders[pool]`, concurrently,
    then Wait on its last task; done when every server has N more succeeded."""
    requests = batches(n)
    procs = group.procs()
    goal = sum([await s.own_succeeded() for s in group.servers]) + n
    cpu0 = {name: p.cpu() for name, p in procs.items()}
    client0 = time.process_time()
    t0 = time.perf_counter()

    async def send(server: Server, reqs: list[pb.SubmitBatchRequest]) -> None:
        tasks = server.client.tasks
        last = 0
        for req in reqs:
            last = (await tasks.SubmitBatch(req)).tasks[-1].id
        await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=last)))

    await asyncio.gather(*(send(senders[pool], reqs) for pool, reqs in requests.items() if reqs))
    while sum([await s.own_succeeded() for s in group.servers]) < goal:
        await asyncio.sleep(0.001)
    dt = time.perf_counter() - t0
    cpu = {name: (p.cpu() - cpu0[name]) / n for name, p in procs.items()}
    cpu["client"] = (time.process_time() - client0) / n
    return Run(n / dt, dt, cpu)


@dataclass
class Calls:
    direct: list[float]  # seconds per call, ascending
    forwarded: list[float]


async def phase_calls(
    a: Server, b: Server, warmup: int, samples: int
) -> tuple[Calls, Calls, float]:
    """[s4]: Submit of one p2 task and Get of a b task by id, to b and through a, alternately;
    and a's CPU per call it forwarded (it serves nothing else meanwhile)."""
    submit = pb.SubmitRequest(task=pb.TaskSpec(pool=POOLS[1]))
    known = (await b.client.tasks.Submit(submit)).id
    get = pb.GetRequest(task=pb.TaskRef(id=known))
    perf = time.perf_counter
    sub = Calls([], [])
    got = Calls([], [])
    cpu_a = a.proc.cpu()
    for i in range(warmup + samples):
        times = []
        for server in (b, a):
            t0 = perf()
            await server.client.tasks.Submit(submit)
            t1 = perf()
            info = await server.client.tasks.Get(get)
            t2 = perf()
            assert info.id == known, info
            times.append((t1 - t0, t2 - t1))
        if i >= warmup:
            (sd, gd), (sf, gf) = times
            sub.direct.append(sd)
            sub.forwarded.append(sf)
            got.direct.append(gd)
            got.forwarded.append(gf)
    cpu_a = (a.proc.cpu() - cpu_a) / (2 * (warmup + samples))
    for c in (sub, got):
        c.direct.sort()
        c.forwarded.sort()
    return sub, got, cpu_a


# --- the run -----------------------------------------------------------------------------------


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _header(title: str, sz: Sizes) -> None:
    print_about(title, f"; grpcio {grpc.__version__}")
    print_cpus("this client, 1 or 2 servers, 2 raw workers")
    print(
        f"sizes:    N={sz.n:,} (half in p1, half in p2), best of {sz.runs} interleaved runs of "
        f"[s1]/[s2]/[s3]; SubmitBatch of {BATCH:,}; [s4] {sz.rt_samples:,} calls of each kind "
        f"after {sz.rt_warmup:,} warm-up; {SLOTS} slots per worker"
    )
    print()


def _runs(xs: Sequence[Run]) -> str:
    return "runs " + " ".join(f"{r.rate / 1000:.1f}k" for r in xs)


def _cpu(run: Run, n: int) -> str:
    parts = ", ".join(f"{name} {s * 1e6:,.0f} ms" for name, s in run.cpu.items())
    total = sum(run.cpu.values())
    cores = len(os.sched_getaffinity(0))
    return (
        f"     CPU per 1k tasks: {parts}; all {total * 1e6:,.0f} ms: {run.busy(n):.2f} cores "
        f"busy, {cores} cores allow {cores / total:,.0f} tasks/s"
    )


def _ms(xs: list[float], p: float) -> float:
    return percentile(xs, p) * 1e3


async def bench(sz: Sizes) -> int:
    single = start_single()
    try:
        sharded = start_sharded()
    except BaseException:
        await single.close()
        raise
    try:
        single.open()
        sharded.open()
        one = single.servers[0]
        a, b = sharded.servers
        direct = {POOLS[0]: a, POOLS[1]: b}
        through_a = {POOLS[0]: a, POOLS[1]: a}
        warm = min(sz.n, 2 * BATCH)
        await phase_throughput(single, {p: one for p in POOLS}, warm)  # warm-up
        await phase_throughput(sharded, direct, warm)
        await phase_throughput(sharded, through_a, warm)
        s1: list[Run] = []
        s2: list[Run] = []
        s3: list[Run] = []
        for _ in range(sz.runs):
            s1.append(await phase_throughput(single, {p: one for p in POOLS}, sz.n))
            s2.append(await phase_throughput(sharded, direct, sz.n))
            s3.append(await phase_throughput(sharded, through_a, sz.n))
        sub, got, fwd_cpu = await phase_calls(a, b, sz.rt_warmup, sz.rt_samples)
    finally:
        await sharded.close()
        await single.close()

    n = sz.n
    b1 = max(s1, key=lambda r: r.rate)
    b2 = max(s2, key=lambda r: r.rate)
    b3 = max(s3, key=lambda r: r.rate)
    r2 = b2.rate / b1.rate
    r3 = b3.rate / b2.rate
    print(
        f"[s1] one server, 2 pools    N={n:,}: {b1.rate:>8,.0f} tasks/s "
        f"({1e6 / b1.rate:.0f} us each)   baseline   ({_runs(s1)})"
    )
    print(_cpu(b1, n))
    print(
        f"[s2] 2 shards, direct       N={n:,}: {b2.rate:>8,.0f} tasks/s "
        f"({1e6 / b2.rate:.0f} us each)   {r2:.2f}x [s1]  target >= {TARGET_SHARDED}x  "
        f"{verdict(r2 >= TARGET_SHARDED)}   ({_runs(s2)})"
    )
    print(_cpu(b2, n))
    print(
        f"[s3] 2 shards, all through a  N={n:,}: {b3.rate:>8,.0f} tasks/s "
        f"({1e6 / b3.rate:.0f} us each)   {r3:.2f}x [s2]  target >= {TARGET_FORWARDED}x  "
        f"{verdict(r3 >= TARGET_FORWARDED)}   ({_runs(s3)})"
    )
    print(_cpu(b3, n))
    for label, calls in (("Submit of 1 task", sub), ("Get by id       ", got)):
        d50, f50 = _ms(calls.direct, 0.5), _ms(calls.forwarded, 0.5)
        print(
            f"[s4] {label}  {len(calls.direct):,} each: to b p50 {d50:.2f} ms "
            f"p99 {_ms(calls.direct, 0.99):.2f} ms; through a p50 {f50:.2f} ms "
            f"p99 {_ms(calls.forwarded, 0.99):.2f} ms; forward overhead p50 "
            f"{(f50 - d50) * 1e3:+,.0f} us per call"
        )
    print(f"     shard a's CPU per call it forwards: {fwd_cpu * 1e6:,.0f} us (both kinds)")
    met = (r2 >= TARGET_SHARDED) + (r3 >= TARGET_FORWARDED)
    print(f"\ntargets:  {met}/2 met   (load average at the end {_load()})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="tasks per run (20000)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--runs", type=int, default=None, help="interleaved runs, best taken (3)")
    args = ap.parse_args(argv)
    base = QUICK if args.quick else FULL
    sz = Sizes(
        n=base.n if args.n is None else args.n,
        runs=base.runs if args.runs is None else args.runs,
        rt_warmup=base.rt_warmup,
        rt_samples=base.rt_samples,
    )
    if sz.n < 2:
        ap.error("--n must be >= 2 (one task per pool)")
    if sz.runs < 1:
        ap.error("--runs must be >= 1")
    _header("cronoq sharding benchmark" + (" (--quick sizes)" if args.quick else ""), sz)
    return asyncio.run(bench(sz))


if __name__ == "__main__":
    sys.exit(main())
