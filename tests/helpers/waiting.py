"""Waiting on conditions instead of sleeping: the store tests poll what they wait for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cronoq.store import LeadershipLost, Store


async def until(
    check: Callable[[], Any | Awaitable[Any]], timeout: float = 3.0, what: str = "condition"
) -> Any:
    """Poll `check` (sync or async) every 10 ms until it returns something truthy."""
    give_up = time.monotonic() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def deposed(store: Store, timeout: float = 3.0) -> None:
    """Wait until `store` knows it lost the leadership: renew() raises LeadershipLost."""

    async def lost() -> bool:
        try:
            await store.renew()
        except LeadershipLost:
            return True
        return False

    await until(lost, timeout, "the leadership to be lost")
