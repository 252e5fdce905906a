"""The library Scheduler's operator controls: pause, resume and drain a pool; cancel, submit
again and delete tasks by id in bulk (docs/library.md, "Operating a scheduler").

On a virtual-time loop: executors block on events the test sets, nothing waits on wall time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cronoq import Permanent, Pool, RetryPolicy, Scheduler, SubmitError, TaskContext, TaskFailed

pytestmark = pytest.mark.virtual_time


class Gate:
    """An executor whose attempts run until the test opens the gate; it records what ran."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.ran: list[Any] = []

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        self.ran.append(payload)
        await self.open.wait()
        if payload == "fail":
            raise Permanent("asked to fail")
        return payload


def pools(gate: Gate) -> list[Pool]:
    return [
        Pool("a", gate, max=1, initial=1, autoscale=False, retry=RetryPolicy.none()),
        Pool("b", gate, max=1, initial=1, autoscale=False, retry=RetryPolicy.none()),
    ]


async def test_pause_holds_new_starts_and_resume_lets_them_run() -> None:
    gate = Gate()
    gate.open.set()
    async with Scheduler(pools(gate)) as s:
        assert await s.pause("a") is True
        assert await s.pause("a") is False
        held = await s.submit("held", pool="a")
        other = await s.submit("other", pool="b")
        assert await asyncio.wait_for(other.result(), 5) == "other"  # another pool goes on
        assert await s.status(held.id) == "ready"
        snap = {p.name: p for p in (await s.snapshot()).pools}
        assert snap["a"].paused and not snap["b"].paused
        assert await s.resume("a") is True
        assert await asyncio.wait_for(held.result(), 5) == "held"
        assert await s.resume("a") is False


async def test_unknown_pools_are_refused() -> None:
    async with Scheduler(pools(Gate())) as s:
        for control in (s.pause, s.resume, s.drain):
            with pytest.raises(SubmitError) as e:
                await control("nope")
            assert e.value.code == "unknown_pool"


async def test_drain_pauses_and_returns_when_nothing_runs() -> None:
    gate = Gate()
    async with Scheduler(pools(gate)) as s:
        running = await s.submit("running", pool="a")
        queued = await s.submit("queued", pool="a")
        while gate.ran != ["running"]:
            await asyncio.sleep(0.01)
        assert await s.drain("a", timeout=1.0) is False  # still running after a second
        drained = asyncio.ensure_future(s.drain("a"))
        await asyncio.sleep(0.1)
        assert not drained.done()
        gate.open.set()
        assert await drained is True
        assert await asyncio.wait_for(running.result(), 5) == "running"
        assert await s.status(queued.id) == "ready"  # paused: it did not start
        assert gate.ran == ["running"]
        assert await s.drain("b") is True  # an idle pool drains at once


async def test_a_drain_that_times_out_leaves_no_waiter() -> None:
    gate = Gate()
    async with Scheduler(pools(gate)) as s:
        await s.submit("running", pool="a")
        while not gate.ran:
            await asyncio.sleep(0.01)
        for _ in range(3):
            assert await s.drain("a", timeout=0.5) is False
        assert s._live().drains == {}
        gate.open.set()


async def test_cancel_many_resubmit_and_delete() -> None:
    gate = Gate()
    gate.open.set()
    async with Scheduler(pools(gate)) as s:
        failed = [await s.submit("fail", pool="a", kind="k", tags={"n": str(i)}) for i in range(3)]
        for h in failed:
            with pytest.raises(TaskFailed):
                await asyncio.wait_for(h.result(), 5)
        ok = await s.submit("ok", pool="a")
        assert await asyncio.wait_for(ok.result(), 5) == "ok"
        await s.pause("b")
        waiting = [await s.submit(f"w{i}", pool="b") for i in range(2)]
        ids = [h.id for h in failed]

        # cancel: only the live ones count
        assert await s.cancel_many([*ids, ok.id, *(h.id for h in waiting)]) == 2
        assert [await s.status(h.id) for h in waiting] == ["cancelled", "cancelled"]

        # submit again: copies of the ended tasks that did not succeed, in order
        new = await s.resubmit([ok.id, *ids, 10**9])
        assert len(new) == 3 and not set(new) & set(ids)
        engine = s.serving()
        for i, (new_id, original) in enumerate(zip(new, failed, strict=True)):
            rec = engine.lookup(new_id)
            assert rec is not None and (rec.kind, rec.tags) == ("k", {"n": str(i)})
            copy = await s.handle(new_id)
            assert copy is not None and original.id not in new
            with pytest.raises(TaskFailed):  # it fails as its original did
                await asyncio.wait_for(copy.result(), 5)

        # delete: ended tasks only; they are gone from lookups
        assert await s.delete([*ids, ok.id, 10**9]) == 4
        assert [await s.status(i) for i in ids] == [None, None, None]
        assert await s.status(ok.id) is None
