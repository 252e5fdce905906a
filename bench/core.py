"""The engine core in Rust (crate `cronoq-core`) against the Python core, on the same loop in the
same run.

The loop is bench/library.py's [3] ("core, virtual clock"): one pool of 64 slots, a backlog
queued up front (classes cycling 0..3), then per step: time += 1 us, advance(), dispatch(),
take(), complete every started attempt and submit a replacement (the task built in the loop).
One cycle = one task submitted, dispatched and completed = 3 decisions. The Python figure runs
bench/library.py's own loop (`phase_core`); the Rust one is the crate's example `core_loop`
(sdks/rust/crates/cronoq-core/examples/core_loop.rs), built here with `cargo build --release`
and timed inside its process (the backlog queued before its clock starts, as in Python). The
two alternate for `reps` rounds; each figure is the best of its rounds.

[1] Python core: cycles/s and decisions/s.
[2] Rust core: cycles/s and decisions/s; target >= 1,000,000 decisions/s.
[3] Rust / Python, the ratio of [2] to [1]; target >= 20x.

Usage: python bench/core.py [--quick]

--quick uses small sizes and the example's debug build (a smoke run of the script: the test
command's later `cargo test` of sdks/rust reuses that build, where a release one would cost a
second build of the crate and its dependencies). The exit status is 0 whether targets are met
or not.
"""

from __future__ import annotations

import argparse
import gc
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from _common import cargo_build, print_about, print_cpus, verdict
from library import phase_core

SDK = Path(__file__).resolve().parents[1] / "sdks" / "rust"
TARGET_DECISIONS = 1_000_000.0
TARGET_RATIO = 20.0


@dataclass(frozen=True)
class Sizes:
    backlog: int
    py_completions: int
    rs_completions: int
    reps: int


FULL = Sizes(backlog=100_000, py_completions=300_000, rs_completions=3_000_000, reps=3)
QUICK = Sizes(backlog=5_000, py_completions=10_000, rs_completions=100_000, reps=1)


def build(quick: bool) -> Path:
    """The example's executable (release; debug for --quick)."""
    args = ["-p", "cronoq-core", "--example", "core_loop"]
    return cargo_build(SDK, args, quick, "the core_loop example") / "examples" / "core_loop"


def rust_round(example: Path, sz: Sizes) -> float:
    """Cycles per second of one run of the Rust loop."""
    out = subprocess.run(
        [str(example), str(sz.backlog), str(sz.rs_completions), "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"cycles (\d+) seconds ([\d.]+)", out)
    assert m is not None, out
    return int(m[1]) / float(m[2])


def python_round(sz: Sizes) -> float:
    gc.collect()
    dt, done = phase_core(sz.backlog, sz.py_completions)
    return done / dt


def _runs(xs: list[float]) -> str:
    return "runs " + " ".join(f"{x / 1000:,.0f}k" for x in xs)


def run(sz: Sizes, quick: bool) -> int:
    print_about(
        "cronoq engine core: Rust (cronoq-core) against Python"
        + (" (quick: Rust's debug build, figures not comparable)" if quick else "")
    )
    print_cpus()
    print(
        f"sizes:    backlog {sz.backlog:,}; {sz.py_completions:,} completions per Python round, "
        f"{sz.rs_completions:,} per Rust round; {sz.reps} round(s) each, alternating"
    )
    print()
    example = build(quick)
    py: list[float] = []
    rs: list[float] = []
    for _ in range(sz.reps):
        py.append(python_round(sz))
        rs.append(rust_round(example, sz))
    py_best, rs_best = max(py), max(rs)
    ratio = rs_best / py_best
    ok_rate = 3 * rs_best >= TARGET_DECISIONS
    ok_ratio = ratio >= TARGET_RATIO
    print(
        f"[1] Python core, virtual clock  {py_best:>12,.0f} cycles/s  "
        f"{3 * py_best:>12,.0f} decisions/s   ({_runs(py)} cycles/s)"
    )
    print(
        f"[2] Rust core, virtual clock    {rs_best:>12,.0f} cycles/s  "
        f"{3 * rs_best:>12,.0f} decisions/s  target >= {TARGET_DECISIONS:,.0f} decisions/s  "
        f"{verdict(ok_rate)}   ({_runs(rs)} cycles/s)"
    )
    print(
        f"[3] Rust / Python               {ratio:.1f}x  "
        f"target >= {TARGET_RATIO:.0f}x  {verdict(ok_ratio)}"
    )
    print(
        "    decision = one engine operation: a submit, the start of one task by dispatch, or a "
        "complete; cycle = 3 decisions (64 slots, 1 us of virtual time per loop; advance()/take() "
        "and building each task are counted in the time)"
    )
    print()
    print(f"targets:  {int(ok_rate) + int(ok_ratio)}/2 met")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    args = ap.parse_args(argv)
    return run(QUICK if args.quick else FULL, args.quick)


if __name__ == "__main__":
    sys.exit(main())
