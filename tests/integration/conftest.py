"""Runs the `async def` tests of this directory without pytest-asyncio.

Each coroutine test gets a fresh event loop through `asyncio.run`, under a timeout, so a
scheduler that hangs fails its test instead of blocking the whole run. Fixtures and
parametrize work as for plain tests.

A test marked `virtual_time` (or a module with `pytestmark = pytest.mark.virtual_time`) runs on
a virtual-time loop instead (helpers/vclock.py): sleeps and timers take no real time, durations
are exact, and the timeout is virtual too, so a test that would wait forever fails at once.
Such tests give their schedulers `clock=LoopClock()`.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import transports
from helpers.auth import make_pki
from helpers.servers import Server
from helpers.vclock import run_virtual

# Generous next to the few tenths of a second any test here needs; only a hang gets near it.
TEST_TIMEOUT = 10.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test):
        return None
    params = inspect.signature(test).parameters
    args = {name: pyfuncitem.funcargs[name] for name in params if name in pyfuncitem.funcargs}

    async def guarded() -> None:
        try:
            await asyncio.wait_for(test(**args), TEST_TIMEOUT)
        finally:
            settle()

    if pyfuncitem.get_closest_marker("virtual_time") is not None:
        run_virtual(guarded())
    else:
        asyncio.run(guarded())
    return True


def settle() -> None:
    """Collect the test's cyclic garbage while its event loop still runs, then freeze what
    survives. grpc.aio's Cython objects finalized by a later test's collection, their loop
    closed, crashed the process once (a segfault while garbage-collecting); frozen, the
    survivors are not scanned again, so each collection costs only the last test's objects."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Server processes a test starts (append them): killed at its end, a stopped one too."""
    started: list[Server] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGCONT)
        s.kill()


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA with a server certificate for localhost and client certificates (helpers/auth.py)."""
    return make_pki(tmp_path)


@pytest.fixture(params=transports.TRANSPORTS)
def each_transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test once per transport: `transports.listening` serves on this one."""
    transports.current = request.param
    yield request.param
    transports.current = "grpcio"
