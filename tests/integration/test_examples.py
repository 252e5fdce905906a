"""The example programs of the seed's snippets, run as a user runs them: a Python executor in
library mode, and a Python remote worker with a few submitted tasks against a real server."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.servers import PORT0, Server, write

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = (
    PORT0
    + """
[[pools]]
name = "default"
max = 8
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
"""
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(write(tmp_path_factory.mktemp("examples"), CONFIG))
    try:
        s.wait_for("event=ready")
        yield s
    finally:
        s.kill()


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, cwd=EXAMPLES
    )


def test_library_executor_retries_and_heartbeats() -> None:
    done = run("executor.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "steady: sum 4950 on attempt 1",
        "flaky: sum 780 on attempt 2",
    ]
    assert re.search(r"retrying \d+ \(attempt 2\)", done.stderr), done.stderr


def test_remote_worker_serves_submitted_tasks(server: Server) -> None:
    done = run("worker.py", "--server", f"http://{server.address}", "--submit", "4")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"worker \d+ registered with 8 slots", lines[0]), lines
    results = [re.sub(r"^task \d+: ", "", line) for line in lines[1:]]
    assert results == [
        'succeeded {"square": 0, "attempt": 1}',
        'succeeded {"square": 1, "attempt": 2}',  # the flaky one, retried
        "failed the payload needs an integer 'n'",  # Permanent
        'succeeded {"square": 9, "attempt": 1}',
    ]
