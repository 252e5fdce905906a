"""Servers for tests: `cronoq-server` started as a real process, its log lines read by a
thread as they come, and helpers that wait until it serves; or an app served in the test's own
event loop (`running_app`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from cronoq.server.app import ServerApp
from cronoq.store import SqliteStore

COMMAND = [sys.executable, "-m", "cronoq.server.cli"]
PORT0 = '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 0.5\n'


def write(tmp_path: Path, text: str, name: str = "server.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def free_port() -> int:
    """A loopback TCP port nobody listens on now (for a server that must keep its port across
    restarts; SO_REUSEADDR lets it bind again while old connections are in TIME_WAIT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A cronoq-server process whose log lines are collected by a thread as they come.
    `env`: variables set for it on top of this process's (a store URL, say)."""

    def __init__(self, config: str, env: Mapping[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*COMMAND, "-c", config],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        match = self.wait_for(r"event=listening grpc=(\S+)")
        self.address = match.group(1)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first new log line matching `pattern`. The timeout is only a safety net that
        fails a hung server; a busy machine may take seconds to start one."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._new.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} in {self.lines}") from None
            if line is None:
                raise AssertionError(f"exited before {pattern!r}: {self.lines}")
            self.lines.append(line)
            if match := re.search(pattern, line):
                return match

    def terminate(self, timeout: float) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        while (line := self._new.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Serving:
    """A server process that is ready: its addresses and a channel to its gRPC listener."""

    server: Server
    address: str
    http_address: str
    channel: grpc.Channel


@contextlib.contextmanager
def serving_process(directory: Path, config: str) -> Iterator[Serving]:
    """Start a server with `config` (its HTTP address on port 0 too), wait until it serves,
    and kill it at the end: the module-scoped fixtures of the process-level test files."""
    s = Server(write(directory, config))
    try:
        http_address = s.wait_for(r"event=listening http=(\S+)").group(1)
        s.wait_for("event=ready")
        with grpc.insecure_channel(s.address) as channel:
            yield Serving(s, s.address, http_address, channel)
    finally:
        s.kill()


@contextlib.asynccontextmanager
async def running_app(app: ServerApp, *, ready: bool = False) -> AsyncIterator[ServerApp]:
    """Serve `app` in this loop: the block runs once its gRPC listener is bound (with `ready`,
    once it leads too), and the app is stopped and awaited at its end."""
    stop = asyncio.Event()
    served = asyncio.create_task(app.serve(stop))
    try:
        while app.grpc_address is None or (ready and not app.ready):
            await asyncio.sleep(0.01)  # polls the app's state; nothing to await for it
        yield app
    finally:
        stop.set()
        await served


async def led_elsewhere(path: Path) -> tuple[SqliteStore, str]:
    """A SQLite store file whose leadership another holder (opened here, in this process) has,
    and the `[store]` table naming it: a server started on it stands by until the holder is
    closed, which the caller does."""
    holder = SqliteStore(path)
    await holder.open()
    await holder.lead()
    return holder, f'[store]\nkind = "sqlite"\npath = "{path}"\n'
