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


async def parked(sched: Scheduler, pool: str, n: int) -> None:
    """Until `n` callers are parked for room in `pool`."""
    while len(sched._live().room.get(pool, ())) < n:
        await asyncio.sleep(0)


async def test_room_waits_for_room_for_n_and_a_cancelled_wait_leaves_nothing() -> None:
    """`room(pool, n)`: at once with room for n; else until a cancel makes it, or until the
    session ends; a cancelled wait is gone from the scheduler's parked callers."""
    bounded = [Pool("b", hold, max=1, autoscale=False, max_pending=2)]
    sched = Scheduler(bounded, shutdown_grace=0)
    async with sched:
        await sched.submit(None, pool="b")
        assert (await sched.snapshot()).pool("b").busy == 1  # type: ignore[union-attr]
        await sched.room("b", 2)  # nothing pending: at once
        first = await sched.submit(None, pool="b")
        await sched.room("b")  # one pending of two: at once
        two = asyncio.ensure_future(sched.room("b", 2))
        gone = asyncio.ensure_future(sched.room("b", 2))
        second = await sched.submit(None, pool="b")
        one = asyncio.ensure_future(sched.room("b"))
        assert (await sched.snapshot()).pool("b").pending == 2  # type: ignore[union-attr]
        await parked(sched, "b", 3)
        assert not (two.done() or gone.done() or one.done())
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert len(sched._live().room["b"]) == 2  # the cancelled one left
        await sched.cancel(first.id)
        await one  # room for one task now, not for two
        assert not two.done()
        await sched.cancel(second.id)
        await two
        assert not sched._live().room  # nothing parked any more
        last = asyncio.ensure_future(sched.room("b", 3))  # more than max_pending: never room
        await parked(sched, "b", 1)
    await last  # the session ended
    with pytest.raises((RuntimeError, SchedulerError)):
        await sched.room("b")
