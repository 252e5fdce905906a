"""Runs the `async def` tests of this directory without pytest-asyncio.

Each coroutine test gets a fresh event loop through `asyncio.run`, under a timeout, so a
scheduler that hangs fails its test instead of blocking the whole run. Fixtures and
parametrize work as for plain tests.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

# Generous next to the few tenths of a second any test here needs; only a hang gets near it.
TEST_TIMEOUT = 10.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def guarded() -> None:
        await asyncio.wait_for(test(**args), TEST_TIMEOUT)

    asyncio.run(guarded())
    return True
