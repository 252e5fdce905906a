"""The server's per-pool history (cronoq.server.history) without I/O: an engine on explicit
times with the server's metrics observer, its snapshot converted as the Admin service does, and
`History` fed by hand, so every point and percentile is exact."""

from __future__ import annotations

import random

import pytest

from cronoq.core.engine import Engine
from cronoq.core.model import PoolConfig, RetryPolicy, TaskRecord
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.convert import snapshot_to_pb
from cronoq.server.history import POINTS, STEP_S, History, Reading, quantile, readings
from cronoq.server.metrics import BUCKETS, TaskObserver

NO_BUCKETS = (0,) * (len(BUCKETS) + 1)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reading(pool: str = "p", **fields: object) -> Reading:
    base: dict[str, object] = dict(
        pool=pool,
        pending=0,
        busy=0,
        capacity=0,
        workers=0,
        paused=False,
        started=0,
        succeeded=0,
        failed=0,
        dead_lettered=0,
        waits=NO_BUCKETS,
    )
    return Reading(**(base | fields))  # type: ignore[arg-type]


def waits(**at: int) -> tuple[int, ...]:
    """Bucket counts: `b<i>=n` puts n samples in bucket i (the last index is +Inf)."""
    counts = list(NO_BUCKETS)
    for name, n in at.items():
        counts[int(name[1:])] = n
    return tuple(counts)


# --- percentiles -------------------------------------------------------------------------------


def test_quantile_interpolates_within_a_bucket_as_histogram_quantile() -> None:
    # 10 samples in (0.01, 0.025] (bucket 4) and 10 in (0.1, 0.25] (bucket 7)
    counts = waits(b4=10, b7=10)
    assert BUCKETS[3:5] == (0.01, 0.025) and BUCKETS[6:8] == (0.1, 0.25)
    assert quantile(0.5, counts) == pytest.approx(0.025)  # rank 10: the top of bucket 4
    assert quantile(0.25, counts) == pytest.approx(0.01 + 0.015 * 0.5)  # rank 5 of 10 in it
    assert quantile(0.9, counts) == pytest.approx(0.1 + 0.15 * 0.8)  # rank 18: 8 of 10 in 7
    assert quantile(0.99, counts) == pytest.approx(0.1 + 0.15 * 0.98)


def test_quantile_of_the_first_bucket_starts_at_zero_and_inf_gives_the_last_bound() -> None:
    assert quantile(0.5, waits(b0=4)) == pytest.approx(0.0005)
    assert quantile(0.99, waits(b0=1, **{f"b{len(BUCKETS)}": 9})) == BUCKETS[-1]


def test_no_samples_no_quantile() -> None:
    assert quantile(0.5, NO_BUCKETS) is None


# --- the rings ---------------------------------------------------------------------------------


def test_a_first_reading_is_a_baseline_and_each_next_one_a_point_of_differences() -> None:
    h = History(Clock(100.0))
    h.sample(0.0, [reading(started=5, succeeded=3, failed=1, dead_lettered=1, waits=waits(b2=5))])
    assert h.series() == {"step": STEP_S, "now": 100.0, "pools": {}}
    h.sample(
        10.0,
        [
            reading(
                pending=7,
                busy=2,
                capacity=4,
                workers=2,
                paused=True,
                started=9,
                succeeded=6,
                failed=2,
                dead_lettered=1,
                waits=waits(b2=5, b4=4),
            )
        ],
    )
    (point,) = h.series()["pools"]["p"]
    assert point == {
        "t": 10.0,
        "started": 4,
        "succeeded": 3,
        "failed": 1,
        "dead_lettered": 0,
        "pending": 7,
        "busy": 2,
        "capacity": 4,
        "workers": 2,
        "paused": True,
        # only the 4 waits of the step, all in (0.01, 0.025]: not the 5 before it
        "wait_p50": pytest.approx(0.01 + 0.015 * 0.5),
        "wait_p90": pytest.approx(0.01 + 0.015 * 0.9),
        "wait_p99": pytest.approx(0.01 + 0.015 * 0.99),
    }


def test_a_step_without_starts_has_no_wait_percentiles() -> None:
    h = History(Clock(0.0))
    h.sample(0.0, [reading(started=2, waits=waits(b1=2))])
    h.sample(10.0, [reading(started=2, waits=waits(b1=2), pending=3)])
    (point,) = h.series()["pools"]["p"]
    assert point["started"] == 0 and point["pending"] == 3
    assert point["wait_p50"] is point["wait_p90"] is point["wait_p99"] is None


def test_the_ring_keeps_the_last_points_only() -> None:
    assert POINTS * STEP_S >= 3600  # at least an hour by default
    h = History(Clock(0.0), points=3)
    for i in range(6):
        h.sample(10.0 * i, [reading(started=i)])
    points = h.series()["pools"]["p"]
    assert [p["t"] for p in points] == [30.0, 40.0, 50.0]
    assert [p["started"] for p in points] == [1, 1, 1]


def test_a_gap_has_no_points_and_the_next_session_starts_with_a_baseline() -> None:
    """After gap() (a new leadership: a new engine whose counters start again), the first
    reading is a baseline even though its counters are lower than the last one's."""
    h = History(Clock(0.0))
    h.sample(0.0, [reading(started=10, dead_lettered=4)])
    h.sample(10.0, [reading(started=12, dead_lettered=5)])
    h.gap()
    h.sample(70.0, [reading(started=12, dead_lettered=0)])  # the new engine's own count
    h.sample(80.0, [reading(started=15, dead_lettered=1)])
    points = h.series()["pools"]["p"]
    assert [(p["t"], p["started"], p["dead_lettered"]) for p in points] == [
        (10.0, 2, 1),
        (80.0, 3, 1),  # nothing for 20..70: the page draws a gap where t jumps
    ]


def test_a_pool_missing_from_a_sample_is_dropped_and_starts_again_if_it_comes_back() -> None:
    h = History(Clock(0.0))
    h.sample(0.0, [reading("a"), reading("b")])
    h.sample(10.0, [reading("a", started=1), reading("b", started=2)])
    h.sample(20.0, [reading("a", started=3)])
    assert set(h.series()["pools"]) == {"a"}
    assert len(h.series()["pools"]["a"]) == 2
    h.sample(30.0, [reading("a", started=3), reading("b", started=9)])  # a baseline for b
    h.sample(40.0, [reading("a", started=3), reading("b", started=10)])
    assert [p["started"] for p in h.series()["pools"]["b"]] == [1]


def test_series_of_one_pool_and_since() -> None:
    clock = Clock(0.0)
    h = History(clock, step=5.0)
    for i in range(4):
        h.sample(5.0 * i, [reading("a", started=i), reading("b", started=2 * i)])
    clock.now = 17.5
    got = h.series("b", since=5.0)
    assert got["step"] == 5.0 and got["now"] == 17.5
    assert list(got["pools"]) == ["b"]
    assert [(p["t"], p["started"]) for p in got["pools"]["b"]] == [(10.0, 2), (15.0, 2)]
    assert h.series("b", since=15.0)["pools"] == {"b": []}  # known, nothing newer
    assert h.series("nope")["pools"] == {}
    assert len(h.series()["pools"]["a"]) == 3


# --- readings of a real engine ------------------------------------------------------------------


def test_readings_of_an_engine_with_the_metrics_observer() -> None:
    """What the sampler reads: the Admin snapshot (pending, busy, capacity, workers, paused),
    the engine's dead letters and the observer's starts, ends and waits, per pool."""
    obs = TaskObserver()
    pools = [
        PoolConfig("p", capacity=2, retry=RetryPolicy.none()),
        PoolConfig("idle", capacity=0),
    ]
    eng = Engine(pools, 0.0, rng=random.Random(0), observer=obs)
    h = History(Clock(0.0))

    def sample(now: float, workers: list[pb.WorkerInfo]) -> None:
        snap = snapshot_to_pb(eng.snapshot(now), workers)
        h.sample(now, readings(snap, eng.ready_view(), obs))

    worker = pb.WorkerInfo(pool="p", slots=2)
    sample(0.0, [worker])
    for _ in range(3):
        eng.submit(TaskRecord(None, "p"), 1.0)
    eng.submit(TaskRecord(None, "idle"), 1.0)
    eng.dispatch(1.0)
    first, second = eng.take().starts
    assert eng.complete(first, 2.0)
    assert eng.fail(second, 2.0, "boom")  # no retry: dead-lettered
    eng.dispatch(3.0)  # the third waited 2 s for a slot
    (third,) = eng.take().starts
    assert eng.pause("p", 3.0)
    sample(10.0, [worker])
    assert eng.complete(third, 11.0)
    sample(20.0, [])
    p = h.series("p")["pools"]["p"]
    assert [(x["started"], x["succeeded"], x["failed"], x["dead_lettered"]) for x in p] == [
        (3, 1, 1, 1),
        (0, 1, 0, 0),
    ]
    assert [(x["busy"], x["capacity"], x["workers"], x["paused"]) for x in p] == [
        (1, 2, 1, True),
        (0, 2, 0, True),
    ]
    # waits 0, 0 and 2 s: the median in the first bucket, the p90 and p99 in (1, 2.5]
    assert p[0]["wait_p50"] == pytest.approx(0.001 * 1.5 / 2)
    assert 1.0 < p[0]["wait_p90"] < p[0]["wait_p99"] <= 2.5
    idle = h.series("idle")["pools"]["idle"]
    assert [(x["pending"], x["capacity"], x["started"], x["wait_p50"]) for x in idle] == [
        (1, 0, 0, None),
        (1, 0, 0, None),
    ]
