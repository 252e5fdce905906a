"""How much the differential suite compares in a run: the counts each test names, times
CRONOQ_PARITY_SCALE (default 1; the long runs reported in notes set it higher). Examples come
from fixed seeds, so a run in CI is reproducible; `long.py` draws fresh ones."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALE = int(os.environ.get("CRONOQ_PARITY_SCALE", "1"))


def examples(count: int) -> settings:
    """`count` examples (times SCALE) from fixed seeds, and no per-example deadline."""
    return settings(
        max_examples=count * SCALE,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
