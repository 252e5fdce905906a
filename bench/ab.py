"""A/B of the library benchmark: this tree against another git revision, in one run.

Machines here are noisy, so a figure from an earlier run says little about a change. This
script checks the other revision out into a temporary worktree and runs `bench/library.py` of
each tree in turn (A, B, A, B, ...), each in its own process with its own `src/` first on the
path, then prints, for the headline phases, the best figure of each side and B's ratio to A.

With `--instructions` it counts instructions instead of timing (valgrind's callgrind, which
gives the same count for the same code whatever else the machine is doing): for [2a], [2b],
[2c] and [3] it runs the phase at two sizes in each tree and prints the instructions per task
of the difference (so start-up and imports cancel out; the process ends with os._exit, so the
collection of what is left at exit does not count either).

Usage: python bench/ab.py [--base REV] [--rounds N] [--quick] [--instructions]
A is REV (default `main`), B is this working tree. The last column is B's speed relative to A
(>1: B is better; for latency, memory and instructions, A's figure over B's). The exit status
is 0 whatever the figures are.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# phase -> (pattern of its figure, unit, True if higher is better)
PHASES: dict[str, tuple[str, str, bool]] = {
    "[2a]": (r"\[2a\].*?:\s+([\d,]+) tasks/s", "tasks/s", True),
    "[2b]": (r"\[2b\].*?:\s+([\d,]+) tasks/s", "tasks/s", True),
    "[2c]": (r"\[2c\].*?p50 ([\d.]+) us", "us p50", False),
    "[3]": (r"\[3\].*?([\d,]+) decisions/s", "decisions/s", True),
    "[4a]": (r"\[4a\].*?(\d+) B/task", "B/task", False),
    "[4b]": (r"\[4b\].*?(\d+) B/task", "B/task", False),
}


def run(tree: Path, quick: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    cmd = [sys.executable, str(tree / "bench" / "library.py"), *(["--quick"] if quick else [])]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    figures = {}
    for phase, (pattern, _, _) in PHASES.items():
        m = re.search(pattern, out)
        if m:
            figures[phase] = float(m.group(1).replace(",", ""))
    return figures


# Runs one phase of a tree's bench/library.py at a size: argv = tree, phase, size.
_ONE_PHASE = """
import asyncio, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import library as L
phase, n = sys.argv[2], int(sys.argv[3])
if phase == "[2a]":
    asyncio.run(L.phase_sequential(n))
elif phase == "[2b]":
    asyncio.run(L.phase_batch(n))
elif phase == "[2c]":
    asyncio.run(L.phase_roundtrip(100, n))
else:
    L.phase_core(20_000, n)
sys.stdout.flush()
os._exit(0)
"""
# phase -> (smaller size, larger size): tasks (or round trips, or completions)
_SIZES = {"[2a]": (1000, 6000), "[2b]": (1000, 6000), "[2c]": (200, 1200), "[3]": (1000, 21000)}


def instructions(tree: Path, phase: str, n: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, "-c", _ONE_PHASE, str(tree), phase, str(n)]
    err = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    m = re.search(r"Collected : (\d+)", err)
    assert m, err
    return int(m.group(1))


def per_task(tree: Path, phase: str) -> float:
    lo, hi = _SIZES[phase]
    return (instructions(tree, phase, hi) - instructions(tree, phase, lo)) / (hi - lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved runs of each side")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--instructions", action="store_true", help="count instructions instead")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cronoq-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base],
            check=True,
        )
        try:
            if args.instructions:
                print(f"A = {args.base}, B = this tree ({ROOT}); instructions per task (callgrind)")
                for phase in _SIZES:
                    a, b = per_task(base, phase), per_task(ROOT, phase)
                    print(
                        f"{phase:5} A {a:>12,.0f}  B {b:>12,.0f} instr/task    B vs A {a / b:.3f}x"
                    )
                return
            sides: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
            for i in range(args.rounds):
                for side, tree in (("A", base), ("B", ROOT)):
                    print(f"round {i + 1}/{args.rounds}: {side}", file=sys.stderr)
                    sides[side].append(run(tree, args.quick))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True
            )
    print(f"A = {args.base}, B = this tree ({ROOT}); best of {args.rounds} interleaved runs each")
    for phase, (_, unit, higher) in PHASES.items():
        a = [r[phase] for r in sides["A"] if phase in r]
        b = [r[phase] for r in sides["B"] if phase in r]
        if not a or not b:
            continue
        best_a, best_b = (max(a), max(b)) if higher else (min(a), min(b))
        ratio = best_b / best_a if higher else best_a / best_b
        print(f"{phase:5} A {best_a:>12,.1f}  B {best_b:>12,.1f} {unit:12}  B vs A {ratio:.3f}x")


if __name__ == "__main__":
    main()
