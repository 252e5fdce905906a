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
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
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


# Variables that would choose for `cronoq-server` in a test: a developer's config, shard or
# log format.
_CHOOSERS = ("CRONOQ_CONFIG", "CRONOQ_SHARD", "CRONOQ_LOG_FORMAT")


def server_command(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`cronoq-server ARGS` run to its end, in this environment less the variables that would
    choose for it, plus `env`. The timeout only fails a hung process."""
    environ = {k: v for k, v in os.environ.items() if k not in _CHOOSERS}
    return subprocess.run(
        [*COMMAND, *args],
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class LoggedProcess:
    """A process whose output lines (stderr, or stdout and stderr together with `merged`) are
    collected by a thread as they come, so a test can wait for one without blocking on a pipe.
    `env`, when given, is the process's whole environment."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        merged: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if merged else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._ended = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout if self.proc.stdout is not None else self.proc.stderr
        assert out is not None
        for line in out:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first new line matching `pattern`. The timeout is only a safety net that fails a
        hung process; a busy machine may take seconds to start one."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._new.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} in {self.lines}") from None
            if line is None:
                self._ended = True
                raise AssertionError(f"exited before {pattern!r}: {self.lines}")
            self.lines.append(line)
            if match := re.search(pattern, line):
                return match

    def seen(self) -> list[str]:
        """Every line so far, without waiting."""
        with contextlib.suppress(queue.Empty):
            while (line := self._new.get_nowait()) is not None:
                self.lines.append(line)
            self._ended = True
        return self.lines

    def wait(self, timeout: float = 60.0) -> int:
        """The exit code, once the process has ended and its last lines are read."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout} s later: {self.seen()}") from None
        while not self._ended and (line := self._new.get(timeout=timeout)) is not None:
            self.lines.append(line)
        self._ended = True
        return code

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code with every line it wrote in `lines`."""
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Server(LoggedProcess):
    """A cronoq-server process whose log lines are collected by a thread as they come.
    `env`: variables set for it on top of this process's (a store URL, say)."""

    def __init__(self, config: str, env: Mapping[str, str] | None = None) -> None:
        super().__init__(
            [*COMMAND, "-c", config], env=None if env is None else {**os.environ, **env}
        )
        # the gRPC listener's line, in logfmt or (server.log_format = "json") as JSON
        match = self.wait_for(r'event=listening grpc=(\S+)|"event": "listening", "grpc": "([^"]+)"')
        self.address = match.group(1) or match.group(2)


def leader_and_standby(config: str, servers: list[Server]) -> tuple[Server, Server]:
    """Two servers of one store's `config`: the first leading, the second standing by (both
    appended to `servers`, the `servers` fixture's list, to be killed at the test's end)."""
    leader = Server(config)
    servers.append(leader)
    leader.wait_for("event=ready")
    standby = Server(config)
    servers.append(standby)
    standby.wait_for("event=awaiting_leadership")
    return leader, standby


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
