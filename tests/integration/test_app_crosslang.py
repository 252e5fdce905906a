"""The cross-language example (examples/crosslang) against a real server: its Go program
serves the "images" pool and `cronoq worker tasks:app` serves the Python one,
each as a process of its own. Python submits `resize` and gets Go's JSON back as the declared
type; Go submits `add` and gets the Python worker's result. Both sides speak only the envelope:
one JSON object with a member per argument, the kind being the function's name."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from cronoq.errors import TaskFailed
from helpers.golang import GO, go_build
from helpers.servers import PORT0, LoggedProcess, serving_process

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crosslang"

pytestmark = pytest.mark.skipif(
    GO is None, reason="the Go toolchain (`go` on PATH) builds the example's Go program"
)

CONFIG = PORT0 + '\n[[pools]]\nname = "default"\n\n[[pools]]\nname = "images"\n'

# A safety net only: each waits on a condition that a working setup meets in well under a
# second.
TIMEOUT = 60.0


def environment() -> dict[str, str]:
    """This process's environment without CRONOQ_* (a developer's target or tokens)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def process(argv: list[str]) -> LoggedProcess:
    """A long-running program of the example, its stdout and stderr lines read together."""
    return LoggedProcess(argv, cwd=EXAMPLE, env=environment(), merged=True)


@pytest.fixture(scope="module")
def go_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's Go program, built once (as `go run .` would)."""
    return go_build(EXAMPLE, ".", tmp_path_factory.mktemp("crosslang-go") / "crosslang")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving_process(tmp_path_factory.mktemp("crosslang"), CONFIG) as s:
        yield f"http://{s.address}"


@pytest.fixture(scope="module")
def go_worker(go_program: Path, target: str) -> Iterator[LoggedProcess]:
    """`go run . -serve`: the "images" pool, registered."""
    p = process([str(go_program), "-serve", "-target", target])
    try:
        p.wait_for(r"cronoq worker registered .*pool=images")
        yield p
    finally:
        p.kill()


@pytest.fixture(scope="module")
def python_worker(target: str) -> Iterator[LoggedProcess]:
    """`cronoq worker tasks:app`, registered (for pool "default" only: `resize` is declared
    with serve=False)."""
    argv = [sys.executable, "-m", "cronoq.cli", "worker", "tasks:app"]
    p = process([*argv, "--target", target])
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
    tasks: ModuleType, target: str, go_worker: LoggedProcess
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
    go_program: Path, target: str, python_worker: LoggedProcess
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
    target: str, go_worker: LoggedProcess, python_worker: LoggedProcess
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


def test_both_workers_drain_and_exit_on_sigterm(
    go_worker: LoggedProcess, python_worker: LoggedProcess
) -> None:
    assert python_worker.terminate(TIMEOUT) == 0, python_worker.lines
    assert python_worker.lines[-1].endswith("stopped"), python_worker.lines
    assert go_worker.terminate(TIMEOUT) == 0, go_worker.lines
