"""A long differential run of the engines (tests/parity/engine_ops.py), on demand:

    python tests/parity/long.py --ops 1000000 [--focus autoscale|fair|fixed|deps|park]

builds the Rust module as the suite does, then compares sequences drawn by the suite's
strategies until at least that many operations were compared (`--focus`: every pool autoscaled,
or with fair share, or fixed starts and recurring schedules in every sequence, or most tasks
with dependencies, or resources and worker groups everywhere); prints the counts and the first
difference, if any (exit status 1)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings

from parity.conftest import core_module
from parity.engine_ops import Config, Op, check, scenarios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations to compare")
    parser.add_argument("--max-ops", type=int, default=200, help="longest sequence")
    parser.add_argument(
        "--focus",
        choices=("autoscale", "fair", "fixed", "deps", "park"),
        help="one feature throughout",
    )
    args = parser.parse_args()
    core_py = core_module()
    counts = {"sequences": 0, "ops": 0}
    started = time.monotonic()

    # Batches of fresh random sequences (no example database, a new seed each call) until
    # enough operations were compared; a difference fails the batch, shrunk by hypothesis.
    @settings(
        max_examples=BATCH,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios(max_ops=args.max_ops, focus=args.focus))
    def batch(scenario: tuple[Config, list[Op]]) -> None:
        check(core_py, *scenario)
        counts["sequences"] += 1
        counts["ops"] += len(scenario[1])

    while counts["ops"] < args.ops:
        try:
            batch()
        except AssertionError as e:
            print(f"DIFFERENCE after {counts['ops']:,} operations:\n{e}")
            return 1
        print(f"  {counts['ops']:,} operations, {counts['sequences']:,} sequences", flush=True)
    secs = time.monotonic() - started
    print(
        f"no difference: {counts['ops']:,} operations in {counts['sequences']:,} sequences "
        f"({secs:.0f} s)"
    )
    return 0


BATCH = 2000  # sequences per hypothesis run


if __name__ == "__main__":
    sys.exit(main())
