"""Worker SDK benchmark: every SDK's worker against the same `cronoq-server`, in one run.

Each language's SDK worker is measured beside a raw worker of the same language: a program on
that language's generated stubs (or, for TypeScript, grpc-js with the loaded schema) that
registers and answers each Lease with a Complete at once, with no handler machinery. The ratio
of the two CPU figures is what the SDK adds per lease; comparing across languages would mostly
measure the languages.

One server process (memory store; the configuration of bench/server.py, on its default
transport) serves the whole run. In every round each worker in turn connects alone with 64
slots, N no-op tasks are submitted by Tasks.SubmitBatch (requests built before timing) and the
round ends when N more have succeeded; the worker is then stopped and the next one starts.
Rounds interleave the workers, and each figure is the best of its rounds, because machines here
are noisy.

Per worker: leases/s, the worker process's CPU per lease (utime + stime from /proc, every
thread) and that figure over its raw worker's (target <= 1.5x), the server's CPU per task, and
the cores the server kept busy (its CPU per task times leases/s). A worker saturates the server
when the server is as busy with it as with any worker of the run (>= 0.9x the most cores it
used): the server, not that worker, is then the bottleneck (target for the Go and Rust SDK
workers). Leases/s alone would not tell: how a worker packs its messages changes the server's
cost per task, and the machine's load moves every figure between rounds.

Usage: python bench/workers.py [--n N] [--quick] [--only go,python,...]

The Go programs are built from bench/workers/go, the TypeScript worker needs the SDK built
(`npm ci && npm run build` in sdks/ts), the Rust ones are built from sdks/rust with
`cargo build --release --examples`. Build time is printed and not measured. The exit status
is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from _common import print_about, print_cpus, verdict
from server import (
    BATCH,
    POOL,
    SLOTS,
    Client,
    Proc,
    ServerRun,
    config,
    phase_server,
    start_server,
    workers_connected,
)

REPO = Path(__file__).resolve().parents[1]
SERVER_BENCH = REPO / "bench" / "server.py"
TARGET_SDK_CPU = 1.5  # an SDK worker's CPU per lease / its raw worker's
SATURATED = 0.9  # the server's busy cores with a worker / the most of the run: it is the limit
MUST_SATURATE = ("go", "rust")
LANGUAGES = ("python", "go", "typescript", "rust")


@dataclass
class Program:
    """One worker program: its language, raw or sdk, and its command line for a target."""

    language: str
    mode: str
    argv: Callable[[str], list[str]]

    @property
    def name(self) -> str:
        return f"{self.language} {self.mode}"


def _build(language: str, out: Path) -> list[Program]:
    """Builds `language`'s worker programs into `out` and returns them (raw first)."""
    if language == "python":
        py = [sys.executable, str(SERVER_BENCH), "--role"]
        return [
            Program("python", "raw", lambda t: [*py, "worker", "--target", t]),
            Program("python", "sdk", lambda t: [*py, "client-worker", "--target", t]),
        ]
    if language == "go":
        exe = out / "go-workers"
        subprocess.run(
            ["go", "build", "-o", str(exe), "."], cwd=REPO / "bench" / "workers" / "go", check=True
        )
        return [
            Program("go", m, lambda t, m=m: [str(exe), "-mode", m, "-target", t])
            for m in ("raw", "sdk")
        ]
    if language == "typescript":
        if not (REPO / "sdks" / "ts" / "dist").is_dir():
            raise SystemExit("typescript: first run npm ci && npm run build in sdks/ts")
        script = str(REPO / "bench" / "workers" / "ts" / "worker.mjs")
        return [
            Program("typescript", m, lambda t, m=m: ["node", script, "--mode", m, "--target", t])
            for m in ("raw", "sdk")
        ]
    crate = REPO / "sdks" / "rust"
    subprocess.run(
        ["cargo", "build", "-q", "--release", "--example", "bench_worker"], cwd=crate, check=True
    )
    exe = crate / "target" / "release" / "examples" / "bench_worker"
    return [
        Program("rust", m, lambda t, m=m: [str(exe), "--mode", m, "--target", t])
        for m in ("raw", "sdk")
    ]


async def _one(client: Client, server: Proc, program: Program, target: str, n: int) -> ServerRun:
    worker = Proc(program.argv(target), program.name)
    try:
        await asyncio.wait_for(workers_connected(client, 1), 120)
        return await phase_server(client, n, server, worker)
    finally:
        worker.stop()
        await asyncio.wait_for(workers_connected(client, 0), 120)


async def bench(n: int, reps: int, programs: list[Program]) -> None:
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-") as tmp:
        cfg = os.path.join(tmp, "server.toml")
        with open(cfg, "w") as f:
            f.write(config())
        server, target = start_server(cfg)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                client = Client(channel)
                await _one(client, server, programs[0], target, min(n, 2 * BATCH))  # warm-up
                runs: dict[str, list[ServerRun]] = {p.name: [] for p in programs}
                for _ in range(reps):
                    for p in programs:
                        runs[p.name].append(await _one(client, server, p, target, n))
        finally:
            server.stop()
    best = {name: max(rs, key=lambda r: r.rate) for name, rs in runs.items()}
    busiest = max(r.rate * r.server_cpu for r in best.values())
    met = total = 0
    for p in programs:
        r = best[p.name]
        cores = r.rate * r.server_cpu
        line = (
            f"{p.name:<16} {r.rate:>8,.0f} leases/s   worker CPU {r.worker_cpu * 1e6:>6.1f} "
            f"us/lease   server {r.server_cpu * 1e6:>4.0f} us/task, {cores:.2f} cores busy   "
            f"runs {' '.join(f'{x.rate / 1000:.1f}k' for x in runs[p.name])}"
        )
        if p.mode == "sdk":
            # Run by run against the raw worker of the same round, as the load varies.
            raw = runs[f"{p.language} raw"]
            # (a --quick round may end within one clock tick of the raw worker's CPU)
            rounds = [(s, a) for s, a in zip(runs[p.name], raw, strict=True) if a.worker_cpu > 0]
            ratio = min((s.worker_cpu / a.worker_cpu for s, a in rounds), default=math.nan)
            ok = ratio <= TARGET_SDK_CPU
            met, total = met + ok, total + 1
            line += (
                f"\n{'':<17}CPU {ratio:.2f}x its raw worker's  target <= {TARGET_SDK_CPU}x  "
                f"{verdict(ok)}"
            )
            if p.language in MUST_SATURATE:
                sat = cores / busiest >= SATURATED
                met, total = met + sat, total + 1
                line += (
                    f"   server {cores / busiest:.2f}x its busiest: saturated "
                    f"(>= {SATURATED}x)  {verdict(sat)}"
                )
        print(line)
    print(f"\ntargets:  {met}/{total} met")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--n", type=int, default=20_000, help="tasks per worker per round")
    ap.add_argument("--quick", action="store_true", help="small sizes, one round (a smoke run)")
    ap.add_argument("--only", default=",".join(LANGUAGES), help="comma-separated languages")
    args = ap.parse_args()
    languages = [x.strip() for x in args.only.split(",") if x.strip()]
    if unknown := set(languages) - set(LANGUAGES):
        ap.error(f"--only: unknown {', '.join(sorted(unknown))}; choose of {', '.join(LANGUAGES)}")
    n, reps = (1_000, 1) if args.quick else (args.n, 3)
    print_about("cronoq worker SDK benchmark", f"; grpcio {grpc.__version__}")
    print_cpus("this client, the server, one worker at a time")
    with tempfile.TemporaryDirectory(prefix="cronoq-workers-") as out:
        programs: list[Program] = []
        for lang in languages:
            t0 = time.perf_counter()
            programs += _build(lang, Path(out))
            print(f"built:    {lang} in {time.perf_counter() - t0:.1f} s")
        print(
            f"sizes:    N={n:,} no-op tasks per worker, best of {reps} interleaved rounds; "
            f"SubmitBatch of {BATCH:,}; {SLOTS} slots; pool {POOL!r}, memory store\n"
        )
        asyncio.run(bench(n, reps, programs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
