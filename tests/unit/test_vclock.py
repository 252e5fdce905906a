"""The virtual-time event loop of tests/helpers/vclock.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from helpers.vclock import EPOCH, LoopClock, VirtualEventLoop, run_virtual, vtime


def test_a_long_sleep_returns_at_once_with_the_time_advanced() -> None:
    async def main() -> tuple[float, float]:
        t0 = vtime()
        await asyncio.sleep(3600)
        return t0, vtime()

    began = time.monotonic()
    t0, t1 = run_virtual(main())
    assert t1 - t0 == 3600
    assert time.monotonic() - began < 60  # not an hour: only a hang gets near this


def test_timers_fire_in_order_at_their_virtual_times() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[str, float]] = []
        done = loop.create_future()
        for name, delay in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("a2", 1.0)]:
            loop.call_later(delay, lambda n=name: fired.append((n, loop.time())))
        loop.call_later(5.0, done.set_result, None)
        await done
        return fired

    assert run_virtual(main()) == [("a", 1.0), ("a2", 1.0), ("b", 2.0), ("c", 3.0)]


def test_ready_callbacks_run_before_time_jumps() -> None:
    async def main() -> tuple[int, float]:
        n = 0

        async def spin() -> None:
            nonlocal n
            for _ in range(100):
                n += 1
                await asyncio.sleep(0)

        t0 = vtime()
        task = asyncio.ensure_future(spin())
        await asyncio.sleep(10)
        await task
        return n, vtime() - t0

    assert run_virtual(main()) == (100, 10.0)


def test_wait_for_timeouts_are_virtual() -> None:
    async def main() -> float:
        t0 = vtime()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 30)
        return vtime() - t0

    assert run_virtual(main()) == 30


def test_gather_of_sleeps_takes_the_longest() -> None:
    async def main() -> float:
        t0 = vtime()
        await asyncio.gather(asyncio.sleep(0.1), asyncio.sleep(0.25), asyncio.sleep(0.2))
        return vtime() - t0

    assert run_virtual(main()) == pytest.approx(0.25, abs=1e-9)


def test_executor_jobs_are_waited_for_in_real_time() -> None:
    """While a thread runs, time follows the real clock (no jump past the job's end)."""

    async def main() -> tuple[str, list[str]]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        loop.call_later(0.02, seen.append, "timer during the job")

        def job() -> str:
            time.sleep(0.1)
            return "job"

        result = await loop.run_in_executor(None, job)
        seen.append("job done")
        return result, seen

    assert run_virtual(main()) == ("job", ["timer during the job", "job done"])


def test_call_soon_threadsafe_wakes_a_loop_without_timers() -> None:
    async def main() -> str:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        threading.Thread(target=lambda: loop.call_soon_threadsafe(fut.set_result, "woken")).start()
        return await fut

    assert run_virtual(main()) == "woken"


def test_sockets_already_readable_are_served_before_a_jump() -> None:
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        with a, b:
            b.send(b"ping")
            return await loop.sock_recv(a, 4)

    assert run_virtual(main()) == b"ping"


def test_the_loop_clock_follows_the_loop() -> None:
    clock = LoopClock()

    async def main() -> tuple[float, float]:
        t0 = clock()
        await asyncio.sleep(7.5)
        return t0, clock()

    t0, t1 = run_virtual(main())
    assert t0 == EPOCH
    assert t1 - t0 == 7.5
    assert clock() == t1  # read outside the loop: the loop it was last read on
    with pytest.raises(RuntimeError):
        LoopClock()()


def test_advance_moves_time_forward_only() -> None:
    loop = VirtualEventLoop(start=5.0)
    try:
        loop.advance(2.5)
        assert loop.time() == 7.5
        with pytest.raises(ValueError):
            loop.advance(-1)
    finally:
        loop.close()


@pytest.mark.realtime
def test_without_autojump_the_loop_waits_in_real_time() -> None:
    loop = VirtualEventLoop(autojump=False)
    try:
        began = time.monotonic()
        loop.run_until_complete(asyncio.sleep(0.05))
        assert time.monotonic() - began >= 0.04
        assert loop.time() >= 0.05
        assert loop.jumped == 0
    finally:
        loop.close()
