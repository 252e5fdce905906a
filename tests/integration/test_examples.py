"""The example programs of the seed's snippets, run as a user runs them: the README's task
functions in library mode and served by `cronoq worker`, a Python executor in library mode, and
the remote workers with a few submitted tasks against a real server (one without
authentication, one with tokens)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import auth
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


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Pools `a` and `b`, and a token for each role (helpers/auth.py)."""
    s = Server(write(tmp_path_factory.mktemp("examples-auth"), auth.CONFIG))
    try:
        s.wait_for("event=ready")
        yield s
    finally:
        s.kill()


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=EXAMPLES,
        env={**environ, **(env or {})},
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a program that ended with exit code 1, and no traceback."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


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


def test_remote_worker_refused_says_why_in_one_line(auth_server: Server) -> None:
    server = f"http://{auth_server.address}"
    wrong = run("worker.py", "--server", server, "--pool", "a", env={"CRONOQ_WORKER_TOKEN": "x"})
    assert one_line(wrong).startswith("worker.py: unauthenticated: ")
    assert wrong.stdout == ""
    # the worker's token is right, the client's (for --submit) is not: the worker stops too
    tokens = {"CRONOQ_WORKER_TOKEN": auth.token("worker"), "CRONOQ_TOKEN": "x"}
    submit = run("worker.py", "--server", server, "--pool", "a", "--submit", "1", env=tokens)
    assert one_line(submit).startswith("worker.py: unauthenticated: ")
    assert re.fullmatch(r"worker \d+ registered with 8 slots\n", submit.stdout), submit.stdout


def test_raw_worker_sends_its_tokens(auth_server: Server) -> None:
    tokens = {"CRONOQ_WORKER_TOKEN": auth.token("worker"), "CRONOQ_TOKEN": auth.token("client")}
    argv = ["raw_worker.py", "--server", auth_server.address, "--pool", "a", "--submit", "2"]
    done = run(*argv, env=tokens)
    assert done.returncode == 0, done.stderr
    outputs = [line.split(" ", 1)[1] for line in done.stdout.splitlines()]
    assert outputs == ["b'HELLO 0'", "b'HELLO 1'"]
    # each token goes where it belongs: the worker's one cannot submit
    swapped = run(*argv, env={**tokens, "CRONOQ_TOKEN": auth.token("worker")})
    assert one_line(swapped).startswith("raw_worker.py: permission_denied: ")
    assert swapped.stdout == ""
    wrong = run(*argv, env={**tokens, "CRONOQ_WORKER_TOKEN": "x"})
    assert one_line(wrong).startswith("raw_worker.py: unauthenticated: ")
    assert wrong.stdout == ""


README_SUBMIT = """cronoq submit --kind add --json-payload --wait '{"a": 2, "b": 3}'"""


def readme_submit_output() -> list[str]:
    """The output README.md shows for its `cronoq submit --kind add ... --wait`: the text block
    that follows the command."""
    text = (EXAMPLES.parent / "README.md").read_text()
    _, after = text.split(README_SUBMIT, 1)
    block = re.search(r"```text\n(.*?)```", after, re.DOTALL)
    assert block is not None, "README.md shows no output for cronoq submit --wait"
    return block.group(1).splitlines()


def test_task_functions_in_library_mode() -> None:
    """The README's library-mode quick start: examples/tasks.py without a server."""
    done = run("tasks.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["5", "hello ada (attempt 1)"]


def test_task_functions_served_by_cronoq_worker(server: Server) -> None:
    """The README's server-mode commands: `cronoq worker tasks:app` serving, then
    examples/tasks.py submitting to the server, and `cronoq submit --kind add --wait`."""
    address = f"http://{server.address}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    worker = subprocess.Popen(
        [sys.executable, "-m", "cronoq.cli", "--server", address, "worker", "tasks:app"],
        cwd=EXAMPLES,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        submitted = run("tasks.py", address)
        argv = README_SUBMIT.split(" ", 1)[1]
        done = run("-m", "cronoq.cli", "--server", address, *shlex.split(argv))
    finally:
        worker.send_signal(signal.SIGTERM)
        _, errors = worker.communicate(timeout=60)
    assert worker.returncode == 0, errors
    registered = r"registered with \S+: pool default, \d+ slot\(s\) granted, kinds add, greet"
    assert re.search(registered, errors), errors
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.splitlines() == ["5", "hello ada (attempt 1)"]
    assert done.returncode == 0, done.stderr
    task = done.stdout.splitlines()[0]
    shown = readme_submit_output()
    # the README's task is the first of a fresh server: put this one's id in its place
    shown[0], shown[1] = task, re.sub(r"\d+$", task, shown[1])
    assert done.stdout.splitlines() == shown
