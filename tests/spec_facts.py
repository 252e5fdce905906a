"""Facts from the specification (ENGINE.md) that several test files check the code against.

They are restated here rather than imported from cronoq, so a test fails if the code drifts.
"""

# ENGINE.md 2.19: the keys of Snapshot.totals.
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
