"""What the Scheduler offers drivers built on it, and a snapshot that reflects every decision
due when it is taken."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cronoq import Pool, Scheduler, SchedulerError, TaskContext


async def hold(ctx: TaskContext, payload: Any) -> None:
    await asyncio.Event().wait()  # runs until cancelled


def pools() -> list[Pool]:
    return [Pool("default", hold, max=2, initial=2, autoscale=False)]


async def test_a_snapshot_counts_a_dispatch_decided_by_the_submit_before_it() -> None:
    async with Scheduler(pools(), shutdown_grace=0) as sched:
        await sched.submit(None)
        snap = await sched.snapshot()
        assert snap.totals["dispatched"] == 1
        assert snap.running == 1
        assert snap.pool("default").busy == 1  # type: ignore[union-attr]


async def test_serving_gives_the_running_engine_and_refuses_otherwise() -> None:
    sched = Scheduler(pools(), shutdown_grace=0)
    with pytest.raises(RuntimeError, match="not started"):
        sched.serving()
    async with sched:
        engine = sched.serving()
        h = await sched.submit(None)
        assert engine.lookup(h.id) is not None
    with pytest.raises((RuntimeError, SchedulerError)):
        sched.serving()
