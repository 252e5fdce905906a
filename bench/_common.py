"""What the benchmarks share: verdicts, percentiles, and where the measured cronoq came from."""

from __future__ import annotations

import math
import os
import subprocess

import cronoq


def source() -> str:
    """Where cronoq was imported from, and its git commit (+ changed files under src/)."""
    where = os.path.dirname(os.path.abspath(cronoq.__file__))
    desc = f"cronoq {cronoq.__version__} from {where}"
    try:
        git = ["git", "-C", where]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=5
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return desc
    if head:
        changed = [ln[3:] for ln in dirty if ln.strip()]
        desc += f" (git {head}" + (f", uncommitted: {', '.join(changed)})" if changed else ")")
    return desc


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def percentile(sorted_xs: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return sorted_xs[max(1, math.ceil(p * len(sorted_xs))) - 1]
