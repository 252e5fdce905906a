"""Library mode in Rust: the crate `cronoq` of sdks/rust ("ours") against the published crate
`cronoq` 0.2.1 ("published") and the Python library (`cronoq.Scheduler`), on one no-op
workload, in the same run, with a tokio floor as the baseline.

Every system runs a scheduler with one fixed pool of 64 slots named "default" whose executor
returns its payload at once (Rust: `Pool::fixed("default", 64).executor_fn(|_ctx, p| async move
{ Ok(*p) })` with `u64` payloads and outputs; Python: bench/library.py's `_scheduler()` and its
`async def noop(ctx, p)`). A new scheduler is built for each phase and shut down after it (both
untimed); the process first runs every throughput phase once on 1,000 tasks (untimed warm-up).

The floor (bench/rust-library/src/floor.rs) is the least a tokio scheduler of this design does
per task, driven by the same bench body: a driver task owns the state, a call sends it a
command and awaits a oneshot reply, each attempt is a spawned task reporting on a channel,
each handle is a oneshot, and a FIFO queue feeds the 64 slots; nothing else (no engine,
priorities, timers, clock, retries, keys, events, output cache or panic catching). What a
crate spends above it is its scheduling and bookkeeping.

[1] One at a time: for i in 0..N, submit task i, await its handle (checking that the output is
    i), repeat. Tasks per second of the whole loop.
[2] Batch: build N tasks, submit them in one `submit_batch`, await every handle in order (the
    time includes building the list). Tasks per second.
[3] Idle round trip: RT_WARMUP untimed submits each awaited, then RT_SAMPLES timed ones, each
    timed alone from just before the submit to the handle's output; p50 and p99
    (nearest rank) in microseconds. For Python this is bench/library.py's `phase_roundtrip`.

[1] and [2] also print the CPU time per task over the same timed region: of every thread of
the Rust program (the sum of /proc/self/task/*/schedstat run times), of the Python process
(`time.process_time`). On a shared machine wall-clock time also counts the time other
processes held the CPU; CPU time does not (though it still moves with cache and SMT sharing).

The Rust phases run in the program of bench/rust-library (a Cargo workspace of its own, so the
published crate never enters sdks/rust's lock file or build), one process per system, runtime
and round, on each of two tokio runtimes, with the bench body in `block_on` on the main thread
as `#[tokio::main]` has it:

* ct: the current-thread runtime (one thread, as Python's one event loop);
* mt: the multi-thread runtime with its default worker count (one per CPU), which
  `#[tokio::main]` builds: attempts, the driver and the submitting code can then be on
  different threads.

Both crates are built without their default feature `otel` (OpenTelemetry metrics and
trace-context capture), so they are compared alike, each at its cheapest (bench/README gives
what the feature costs ours). Both are built in one `cargo build --release --locked` with the
same profile and tokio.

Rounds interleave everything: in each round Python runs [1]-[3], then on each runtime the
floor, ours and the published crate run [1]-[3] each, in an order that rotates by one per
round. Each figure is the best of its rounds (for [3], the lowest p50 and, separately, the
lowest p99; for CPU per task, the lowest), and every round's figure is printed. Targets, per
runtime: ours >= 1.5x the published crate's throughput in [1] and [2], and ours' [3] p50 <= the
published crate's.

Usage: python bench/rust_library.py [--quick] [--n N] [--rounds K] [--instructions]

--instructions counts instead of timing, for figures that the machine's load does not move:
valgrind's callgrind counts the instructions of the bench program (release build, current-thread
runtime, which callgrind runs as it is; the multi-thread one it would serialise) running [1]
and [2] for the floor and each crate at two sizes, 2,000 and 6,000 tasks, and the difference
divided by 4,000 is printed as instructions per task (so set-up, warm-up and shutdown cancel
out, except what grows with the number of tasks, such as dropping the engine's retained
records). No targets are held to these counts.

--quick runs every phase on small sizes with one round, for a smoke run of the script, and
builds the bench program in debug mode. The test command runs it at every CI run, and no build
of sdks/rust can stand in for this one (another workspace, other tokio features, the published
crate and its dependencies, chrono-tz among them), so it is a build of its own either way; the
debug build takes about half the CPU time of the release one (about 1 min against 2 min
here, from scratch). Its figures are not comparable with a full run's. The exit status is 0
whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import cargo_build, percentile, print_about, print_cpus, verdict
from library import _scheduler, phase_batch, phase_roundtrip

ROOT = Path(__file__).resolve().parents[1]
CRATE = ROOT / "bench" / "rust-library"
SDK_CRATES = ROOT / "sdks" / "rust" / "crates"
PROGRAM = "cronoq-bench-rust-library"
WARMUP = 1000  # tasks per warm-up run of each throughput phase (the Rust program's as well)

TARGET_THROUGHPUT = 1.5  # ours / published, [1] and [2]
TARGET_RT = 1.0  # ours' p50 / published's p50, [3]

RUNTIMES = {"ct": "current", "mt": "multi"}
CRATES = ("ours", "published")  # what the targets compare
SYSTEMS = ("floor", *CRATES)  # what the bench program runs


@dataclass(frozen=True)
class Sizes:
    n: int
    rt_warmup: int
    rt_samples: int
    rounds: int


FULL = Sizes(n=20_000, rt_warmup=500, rt_samples=5_000, rounds=7)
QUICK = Sizes(n=500, rt_warmup=50, rt_samples=200, rounds=1)


@dataclass
class Runs:
    """Every round's figures of one system: tasks/s of [1] and [2] and their CPU seconds per
    task, [3]'s p50 and p99 (seconds)."""

    seq: list[float] = field(default_factory=list)
    batch: list[float] = field(default_factory=list)
    seq_cpu: list[float] = field(default_factory=list)
    batch_cpu: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)

    def add(self, phase: str, n: int, wall: float, cpu: float) -> None:
        getattr(self, phase).append(n / wall)
        getattr(self, f"{phase}_cpu").append(cpu / n)

    def add_rt(self, samples: list[float]) -> None:
        samples.sort()
        self.p50.append(percentile(samples, 0.50))
        self.p99.append(percentile(samples, 0.99))


# --- Python ---------------------------------------------------------------------------------


class CpuClock:
    """A hook for bench/library.py's phases: the process's CPU time over the timed region."""

    def __init__(self) -> None:
        self.t0 = self.used = 0.0

    def __enter__(self) -> None:
        self.t0 = time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.used = time.process_time() - self.t0


async def phase_one_at_a_time(n: int, hook: CpuClock | None = None) -> float:
    """[1] for the Python library: seconds for n submits, each awaited before the next."""
    async with _scheduler() as sched:
        submit = sched.submit
        with hook or CpuClock():
            t0 = time.perf_counter()
            for i in range(n):
                out = await (await submit(i))
                assert out == i, (out, i)
            dt = time.perf_counter() - t0
    return dt


async def python_warmup() -> None:
    await phase_one_at_a_time(WARMUP)
    await phase_batch(WARMUP)


async def python_round(sz: Sizes, runs: Runs) -> None:
    gc.collect()
    cpu = CpuClock()
    runs.add("seq", sz.n, await phase_one_at_a_time(sz.n, cpu), cpu.used)
    gc.collect()
    cpu = CpuClock()
    runs.add("batch", sz.n, await phase_batch(sz.n, cpu), cpu.used)
    gc.collect()
    runs.add_rt(await phase_roundtrip(sz.rt_warmup, sz.rt_samples))
    gc.collect()


# --- Rust -----------------------------------------------------------------------------------


def build(quick: bool) -> tuple[Path, float]:
    """The bench program (release; debug for --quick); its path and the build's seconds."""
    t0 = time.monotonic()
    program = cargo_build(CRATE, [], quick, "bench/rust-library") / PROGRAM
    return program, time.monotonic() - t0


def rust_round(program: Path, crate: str, runtime: str, sz: Sizes, runs: Runs) -> int:
    """One process of the bench program: [1]-[3] of one system on one runtime, into `runs`.
    Returns the runtime's worker threads (0 for the current-thread runtime)."""
    out = subprocess.run(
        [str(program), crate, runtime, str(sz.n), str(sz.rt_warmup), str(sz.rt_samples)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        sys.exit(f"{program.name} {crate} {runtime} failed:\n{out.stdout[-2000:]}{out.stderr}")
    threads = -1
    for line in out.stdout.splitlines():
        what, *rest = line.split()
        if what == "threads":
            threads = int(rest[0])
        elif what in ("seq", "batch"):
            runs.add(what, int(rest[0]), float(rest[1]), float(rest[2]))
        elif what == "rt":
            runs.add_rt([int(x) * 1e-9 for x in rest])
    assert threads >= 0 and len(runs.seq) == len(runs.batch) == len(runs.p50), out.stdout[:500]
    return threads


def rust_source() -> str:
    """The measured crate's git commit, and changed files of sdks/rust/crates if any."""
    git = ["git", "-C", str(SDK_CRATES)]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True
    ).stdout.split("\n")
    changed = [ln[3:] for ln in dirty if ln.strip()]
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    return (
        f"ours = sdks/rust/crates/cronoq (git {head}"
        + (f", uncommitted: {', '.join(changed)}" if changed else "")
        + f"); published = cronoq 0.2.1 from crates.io; both with default features off; {rustc}"
    )


# --- instructions (--instructions) ---------------------------------------------------------

COUNT_SIZES = (2_000, 6_000)


def instructions(program: Path, crate: str, phase: str, n: int) -> int:
    """Instructions callgrind counts in one run of the bench program (one phase, N tasks)."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [str(program), crate, "current", str(n), "0", "0", phase]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"Collected : (\d+)", err)
    assert m, err
    return int(m[1])


def count(quick: bool) -> int:
    print_about(
        "cronoq library mode in Rust: instructions per task, ours (sdks/rust) against the "
        "published crate 0.2.1" + (" (quick: debug build)" if quick else "")
    )
    print(f"rust:     {rust_source()}")
    program, secs = build(quick)
    print(f"built:    {'debug' if quick else 'release'} in {secs:.1f} s (bench/rust-library)")
    lo, hi = COUNT_SIZES
    print(
        f"counted:  valgrind --tool=callgrind, current_thread runtime; (instructions at "
        f"{hi:,} tasks - at {lo:,}) / {hi - lo:,}"
    )
    print()
    for num, phase, title in (("1", "seq", "one at a time"), ("2", "batch", "batch")):
        per = {
            c: (instructions(program, c, phase, hi) - instructions(program, c, phase, lo))
            / (hi - lo)
            for c in SYSTEMS
        }
        floor = per["floor"]
        print(
            f"[{num} instructions]  {title + ':':<15}"
            + "  ".join(f"{c} {per[c]:>7,.0f}" for c in SYSTEMS)
            + f" per task;  published / ours = {per['published'] / per['ours']:.2f}x;  above "
            f"the floor: ours {per['ours'] - floor:,.0f}, published {per['published'] - floor:,.0f}"
        )
    return 0


# --- the run --------------------------------------------------------------------------------


def _k(xs: list[float]) -> str:
    return " ".join(f"{x / 1000:,.0f}k" for x in xs)


def _us(xs: list[float]) -> str:
    return " ".join(f"{x * 1e6:.2f}" if x < 1e-5 else f"{x * 1e6:.1f}" for x in xs)


def _throughput(
    tag: str, label: str, runs: Runs, key: str, python: float | None
) -> tuple[float, float]:
    """Prints a [1]/[2] figure line (`key`: "seq" or "batch") and returns its best tasks/s and
    CPU seconds per task; `python`, the Python library's tasks/s, for the ratio to it."""
    rates: list[float] = getattr(runs, key)
    cpus: list[float] = getattr(runs, f"{key}_cpu")
    rate, cpu = max(rates), min(cpus)
    vs = f"  {rate / python:.1f}x python" if python else ""
    print(
        f"{tag:<18}{label:<26}{rate:>10,.0f} tasks/s ({1e6 / rate:.2f} us each)  "
        f"CPU {cpu * 1e6:.2f} us/task{vs}   (runs {_k(rates)}; CPU us/task {_us(cpus)})"
    )
    return rate, cpu


def _latency(tag: str, label: str, runs: Runs) -> float:
    """Prints a [3] figure line and returns its best p50 (seconds)."""
    p50, p99 = min(runs.p50), min(runs.p99)
    print(
        f"{tag:<18}{label:<26}p50 {_us([p50]):>6} us  p99 {_us([p99]):>6} us   "
        f"(runs p50 {_us(runs.p50)}; p99 {_us(runs.p99)})"
    )
    return p50


def run(sz: Sizes, quick: bool) -> int:
    print_about(
        "cronoq library mode in Rust: ours (sdks/rust) against the published crate 0.2.1, the "
        "Python library and a tokio floor"
        + (" (quick: debug build, one round, figures not comparable)" if quick else "")
    )
    print_cpus("this script (the Python library's phases) and one bench program at a time")
    print(f"rust:     {rust_source()}")
    print(
        f"sizes:    N={sz.n:,} tasks per [1]/[2] run; [3] {sz.rt_samples:,} round trips after "
        f"{sz.rt_warmup:,} untimed; {sz.rounds} interleaved round(s), best counted; "
        "64-slot fixed pool, no-op executor"
    )
    program, secs = build(quick)
    print(f"built:    {'debug' if quick else 'release'} in {secs:.1f} s (bench/rust-library)")
    print()

    python = Runs()
    rust = {(c, r): Runs() for c in SYSTEMS for r in RUNTIMES}
    threads: dict[str, int] = {}
    asyncio.run(python_warmup())
    for k in range(sz.rounds):
        asyncio.run(python_round(sz, python))
        for rt, flavor in RUNTIMES.items():
            for j in range(len(SYSTEMS)):
                system = SYSTEMS[(k + j) % len(SYSTEMS)]
                threads[rt] = rust_round(program, system, flavor, sz, rust[(system, rt)])

    met = 0
    total = 0

    def target(ok: bool) -> str:
        nonlocal met, total
        total += 1
        met += ok
        return verdict(ok)

    labels = {
        "ct": "current_thread",
        "mt": f"multi_thread, {threads['mt']} workers",
    }
    for num, key, title in (
        ("1", "seq", "one at a time: submit a task, await its output, repeat"),
        ("2", "batch", "batch: build N tasks, submit_batch, await every handle"),
    ):
        print(f"[{num}] {title}; N={sz.n:,}")

        py, _ = _throughput(f"[{num} python]", "cronoq.Scheduler", python, key, None)
        for rt in RUNTIMES:
            best = {
                c: _throughput(f"[{num} {c} {rt}]", labels[rt], rust[(c, rt)], key, py)
                for c in SYSTEMS
            }
            r = best["ours"][0] / best["published"][0]
            above = {c: 1e6 / best[c][0] - 1e6 / best["floor"][0] for c in CRATES}
            print(
                f"{f'[{num} {rt}]':<18}ours / published = {r:.2f}x  "
                f"target >= {TARGET_THROUGHPUT}x  {target(r >= TARGET_THROUGHPUT)}   "
                f"(by CPU per task: {best['published'][1] / best['ours'][1]:.2f}x; above the "
                f"floor: ours {above['ours']:.2f} us, published {above['published']:.2f} us "
                "per task)"
            )
        print()

    print(
        f"[3] idle round trip: one task submitted and awaited on an idle scheduler; "
        f"{sz.rt_samples:,} samples per round"
    )
    _latency("[3 python]", "cronoq.Scheduler", python)
    for rt in RUNTIMES:
        p50 = {c: _latency(f"[3 {c} {rt}]", labels[rt], rust[(c, rt)]) for c in SYSTEMS}
        r = p50["ours"] / p50["published"]
        print(
            f"{f'[3 {rt}]':<18}ours p50 / published p50 = {r:.2f}x  "
            f"target <= {TARGET_RT:.0f}x  {target(r <= TARGET_RT)}"
        )
    print()
    print(f"targets:  {met}/{total} met")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one round, debug build")
    ap.add_argument("--n", type=int, default=None, help="tasks per [1]/[2] run (20000)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (7)")
    ap.add_argument(
        "--instructions", action="store_true", help="count instructions (callgrind) instead"
    )
    args = ap.parse_args(argv)
    sz = QUICK if args.quick else FULL
    if args.n is not None:
        sz = Sizes(args.n, sz.rt_warmup, sz.rt_samples, sz.rounds)
    if args.rounds is not None:
        sz = Sizes(sz.n, sz.rt_warmup, sz.rt_samples, args.rounds)
    if sz.n < 1 or sz.rounds < 1:
        ap.error("--n and --rounds must be >= 1")
    if args.instructions:
        return count(args.quick)
    return run(sz, args.quick)


if __name__ == "__main__":
    sys.exit(main())
