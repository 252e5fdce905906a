"""The cross-language example (examples/crosslang) against a real server: its Go program
serves the "images" pool and `cronoq worker tasks:app` serves the Python one,
each as a process of its own. Python submits `resize` and gets Go's JSON back as the declared
type; Go submits `add` and gets the Python worker's result. Both sides speak only the envelope:
one JSON object with a member per argument, the kind being the function's name."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from cronoq.errors import TaskFailed
from helpers.servers import PORT0, Server, write

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crosslang"
GO = shutil.which("go")

pytestmark = pytest.mark.skipif(
    GO is None, reason="the Go toolchain (`go` on PATH) builds the example's Go program"
)

CONFIG = PORT0 + '\n[[pools]]\nname = "default"\n\n[[pools]]\nname = "images"\n'

# Safety nets only: each waits on a condition that a working setup meets in well under a
# second, apart from the Go build, which compiles grpc-go on a cold cache.
BUILD_TIMEOUT = 600.0
TIMEOUT = 60.0


def environment() -> dict[str, str]:
    """This process's environment without CRONOQ_* (a developer's target or tokens)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


class Process:
    """A long-running program of the example whose output lines (stdout and stderr together)
    a thread collects as they come."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            cwd=EXAMPLE,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, pattern: str, timeout: float = TIMEOUT) -> re.Match[str]:
        """The first new output line matching `pattern`."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._new.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} from {self.argv}: {self.lines}") from None
            if line is None:
                raise AssertionError(f"{self.argv} exited before {pattern!r}: {self.lines}")
            self.lines.append(line)
            if match := re.search(pattern, line):
                return match

    def stop(self) -> int:
        """SIGTERM, then the exit code once it has drained; every line it wrote is in `lines`."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(TIMEOUT)
        while (line := self._new.get(timeout=TIMEOUT)) is not None:
            self.lines.append(line)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def go_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's Go program, built once (as `go run .` would)."""
    assert GO is not None
    binary = tmp_path_factory.mktemp("crosslang-go") / "crosslang"
    built = subprocess.run(
        [GO, "build", "-o", str(binary), "."],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert built.returncode == 0, built.stderr
    return binary


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(write(tmp_path_factory.mktemp("crosslang"), CONFIG))
    try:
        s.wait_for("event=ready")
        yield s
    finally:
        s.kill()


@pytest.fixture(scope="module")
def target(server: Server) -> str:
    return f"http://{server.address}"


@pytest.fixture(scope="module")
def go_worker(go_program: Path, target: str) -> Iterator[Process]:
    """`go run . -serve`: the "images" pool, registered."""
    p = Process([str(go_program), "-serve", "-target", target])
    try:
        p.wait_for(r"cronoq worker registered .*pool=images")
        yield p
    finally:
        p.kill()


@pytest.fixture(scope="module")
def python_worker(target: str) -> Iterator[Process]:
    """`cronoq worker tasks:app`, registered (for pool "default" only: `resize` is declared
    with serve=False)."""
    argv = [sys.executable, "-m", "cronoq.cli", "worker", "tasks:app"]
    p = Process([*argv, "--target", target])
    try:
        p.wait_for(r"registered with \S+: pool default, \d+ slot\(s\) granted, kinds add$")
        yield p
    finally:
        p.kill()


@pytest.fixture(scope="module")
def tasks() -> ModuleType:
    """examples/crosslang/tasks.py, imported here under a name of its own."""
    spec = importlib.util.spec_from_file_location("crosslang_tasks", EXAMPLE / "tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_python_gets_gos_result_as_the_declared_type(
    tasks: ModuleType, target: str, go_worker: Process
) -> None:
    async def main() -> tuple[object, TaskFailed]:
        async with tasks.app.connect(target):
            image = await (await tasks.resize.submit("cat.png", width=320)).result(TIMEOUT)
            refused = await tasks.resize.submit("cat.png", 0)
            with pytest.raises(TaskFailed) as failed:
                await refused.result(TIMEOUT)
        return image, failed.value

    image, failed = asyncio.run(main())
    assert type(image) is dict
    assert image == {"path": "cat_320.png", "width": 320, "worker": "go"}
    # Go's cronoq.Permanent: failed at once, with the Go handler's message
    assert failed.status == "failed", failed
    assert "resize: need a path and a positive width" in failed.message, failed
    assert '{"path":"cat.png","width":0}' in failed.message, failed  # the envelope


def test_go_submits_add_and_the_python_worker_computes_it(
    go_program: Path, target: str, python_worker: Process
) -> None:
    done = subprocess.run(
        [str(go_program), "-add", "-target", target],
        cwd=EXAMPLE,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "add(2, 3) = 5\n"


def test_submit_script_prints_both_typed_results(
    target: str, go_worker: Process, python_worker: Process
) -> None:
    done = subprocess.run(
        [sys.executable, "submit.py", target],
        cwd=EXAMPLE,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "resize -> dict {'path': 'cat_320.png', 'width': 320, 'worker': 'go'}",
        "add -> int 5",
    ]


def test_both_workers_drain_and_exit_on_sigterm(go_worker: Process, python_worker: Process) -> None:
    assert python_worker.stop() == 0, python_worker.lines
    assert python_worker.lines[-1].endswith("stopped"), python_worker.lines
    assert go_worker.stop() == 0, go_worker.lines
