"""Documented facts that several test files check the code against.

They are restated here rather than imported from cronoq, so a test fails if the code drifts
from the documentation.
"""

# The keys of Snapshot.totals (docs/library.md, "Snapshot").
TOTALS_KEYS = frozenset(
    {
        "cancelled",
        "dead_lettered",
        "dispatched",
        "failed",
        "lease_expiries",
        "missed",
        "recurring_conflicts",
        "recurring_invalid",
        "retries",
        "shed",
        "skipped",
        "stale_completions",
        "submitted",
        "succeeded",
        "timeouts",
    }
)
