"""`cronoq.CancellationToken` on its own (docs/library.md, "Cancellation tokens, tags and
traces"); how attempts cancel it is tested with the scheduler and the worker."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from cronoq import CancellationToken


def test_a_wait_that_is_given_up_leaves_no_callback_behind() -> None:
    token = CancellationToken()

    async def main() -> None:
        waiter = asyncio.ensure_future(token.wait())
        await asyncio.sleep(0)
        assert len(token._callbacks) == 1
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert token._callbacks == []

    asyncio.run(main())
    assert not token.is_cancelled()


def test_a_wait_on_another_threads_loop_is_woken() -> None:
    """The canceller's thread is not the waiter's: the wake-up goes through that loop."""
    token = CancellationToken()
    waiting = threading.Event()
    woke: list[bool] = []

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(waiting.set)
        await token.wait()
        woke.append(token.is_cancelled())

    thread = threading.Thread(target=asyncio.run, args=(wait(),))
    thread.start()
    assert waiting.wait(30)
    token._cancel()
    thread.join(30)
    assert woke == [True]


def test_each_callback_runs_once_when_threads_add_them_during_the_cancel() -> None:
    token = CancellationToken()
    counts = [0] * 400
    go = threading.Barrier(5)

    def adder(part: int) -> None:
        go.wait()
        for i in range(part * 100, part * 100 + 100):
            token.add_callback(lambda i=i: counts.__setitem__(i, counts[i] + 1))

    threads = [threading.Thread(target=adder, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    go.wait()
    token._cancel()
    for t in threads:
        t.join(30)
    assert counts == [1] * 400
