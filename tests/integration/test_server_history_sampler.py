"""The history sampler (cronoq.server.history) of a real server: `wiring.build` served in this
loop.

Its steps: a raw worker stream over gRPC, on the virtual clock (helpers/vclock.py) with the
scheduler reading `LoopClock()`. The server starts and the traffic runs with `autojump` off
(the loop then keeps real time: gRPC's threads are no timers); each step of the sampler is then
taken by letting the virtual clock jump, so the points fall exactly one step apart and each
holds exactly the traffic of its step. The step is shortened to STEP (the test's timeout is
virtual too, and shorter than three default steps).

Its sessions: a server that stands by (a SQLite store another holder leads) samples nothing
until it takes the leadership."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.config import load_config
from cronoq.server.wiring import build
from helpers.servers import PORT0, led_elsewhere, running_app
from helpers.vclock import EPOCH, LoopClock, VirtualEventLoop
from helpers.waiting import until
from helpers.workers import Worker

CONFIG = PORT0 + (
    '[[pools]]\nname = "work"\nautoscale = false\nretry = { max_attempts = 1 }\n'
    '[[pools]]\nname = "idle"\nautoscale = false\n'
)
STEP = 2.0


def _sampling() -> list[asyncio.Task[object]]:
    return [
        t
        for t in asyncio.all_tasks()
        if "HistorySampler" in t.get_coro().__qualname__  # type: ignore[union-attr]
    ]


@pytest.mark.virtual_time
async def test_the_leader_samples_every_pool_once_a_step() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualEventLoop)
    loop.autojump = False
    app = build(load_config(CONFIG), clock=LoopClock())
    history = app.history
    history.step = STEP  # read by the sampler at each step, the first one included

    async def step(n: int) -> list[dict[str, object]]:
        """Let the virtual clock run to the sampler's next step: the n-th point of "work"."""
        loop.autojump = True
        try:
            await asyncio.sleep(STEP)
            await until(lambda: len(history.series("work")["pools"].get("work", [])) == n)
        finally:
            loop.autojump = False
        points: list[dict[str, object]] = history.series()["pools"]["work"]
        return points

    async with running_app(app, ready=True):
        assert len(_sampling()) == 1
        (quiet,) = await step(1)  # before any traffic: a point of zeros
        assert (quiet["started"], quiet["pending"], quiet["capacity"]) == (0, 0, 0)
        async with grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
            tasks = cronoq_pb2_grpc.TasksStub(channel)
            w = Worker(channel)
            await w.register("work", slots=2)

            async def run(fail: bool) -> None:
                tid = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="work")))).id
                lease = await w.lease()
                if fail:  # its only attempt: dead-lettered
                    w.send(fail=pb.Fail(lease=lease.lease, message="no"))
                else:
                    w.send(complete=pb.Complete(lease=lease.lease))
                await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=tid)))

            for fail in (False, True, False):
                await run(fail)
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="idle")))
            assert await app.scheduler.pause("work")
            quiet, busy = await step(2)
            _, _, after = await step(3)
            w.close()

        assert {k: busy[k] for k in busy if not k.startswith("wait_")} == {
            "t": busy["t"],
            "started": 3,
            "succeeded": 2,
            "failed": 1,
            "dead_lettered": 1,
            "pending": 0,
            "busy": 0,
            "capacity": 2,
            "workers": 1,
            "paused": True,
        }
        p50, p90, p99 = busy["wait_p50"], busy["wait_p90"], busy["wait_p99"]
        assert isinstance(p50, float) and isinstance(p90, float) and isinstance(p99, float)
        assert 0 <= p50 <= p90 <= p99
        # the next step: nothing started, so no wait percentiles
        assert (after["started"], after["succeeded"], after["wait_p50"]) == (0, 0, None)
        assert isinstance(quiet["t"], float) and quiet["t"] > EPOCH  # the scheduler's clock
        assert busy["t"] == pytest.approx(quiet["t"] + STEP)
        assert after["t"] == pytest.approx(quiet["t"] + 2 * STEP)
        (idle, *_) = history.series("idle")["pools"]["idle"][1:]
        assert (idle["pending"], idle["capacity"], idle["workers"]) == (1, 0, 0)
        assert (idle["started"], idle["wait_p50"]) == (0, None)
        # since: the points after the first one only
        assert len(history.series("work", since=quiet["t"])["pools"]["work"]) == 2
    assert not _sampling()  # stopping the app ended the sampler
    assert len(history.series()["pools"]["work"]) == 3  # and kept what it sampled


async def test_a_standby_samples_nothing_until_it_leads(tmp_path: Path) -> None:
    holder, store = await led_elsewhere(tmp_path / "h.db")
    app = build(load_config(CONFIG + store))
    app.history.step = 0.05
    async with running_app(app):
        assert not app.ready and not _sampling()
        await holder.close()  # the leadership is free: this server takes it
        await until(lambda: app.ready, 30, "the leadership")
        await until(lambda: "work" in app.history.series()["pools"], 30, "a first point")
        (point, *_) = app.history.series()["pools"]["work"]
        assert (point["started"], point["capacity"], point["paused"]) == (0, 0, False)
    assert not _sampling()
