"""`inflight.Fullness`: /readyz's view of a gRPC listener whose every place is taken
(docs/http.md, "Health and readiness"), on a clock of the test's own."""

from __future__ import annotations

from cronoq.server.inflight import FULL_S, Fullness


def test_a_listener_is_unready_once_it_stayed_full_for_full_s() -> None:
    now = [100.0]
    fullness = Fullness(2, clock=lambda: now[0])
    fullness.count(2)
    now[0] += FULL_S - 0.5
    assert fullness.unready is None  # full for a moment: a burst, not a listener that is stuck
    fullness.count(2)  # (still full: the time counts from when it filled)
    now[0] += 0.5
    assert fullness.unready == (
        "the gRPC listener is full: 2 calls in flight (limits.max_concurrent_requests)"
    )
    fullness.count(1)
    assert fullness.unready is None
    fullness.count(2)
    assert fullness.unready is None  # full again: the time starts over
