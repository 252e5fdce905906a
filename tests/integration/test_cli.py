"""The `cronoq` command line as a user runs it: every command a real process against a real
`cronoq-server` process, with a raw echo worker serving pool `default` (pool `idle` has none,
so its tasks stay pending)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pty
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.auth import mtls_config
from helpers.ports import free_port
from helpers.servers import (
    PORT0,
    LoggedProcess,
    Server,
    leader_and_standby,
    serving_process,
    write,
)
from helpers.workers import EchoWorker

COMMAND = [sys.executable, "-m", "cronoq.cli"]
CONFIG = (
    PORT0
    + '[[pools]]\nname = "default"\nmax = 4\n[[pools]]\nname = "idle"\nmax = 2\n'
    + '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 2\n'
)
ENV = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")} | {"COLUMNS": "100"}


def cronoq(
    server: str | None, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `cronoq [--server S] ARGS` (with `env` on top of ENV) and return what it did."""
    where = ["--server", server] if server else []
    return subprocess.run(
        [*COMMAND, *where, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        timeout=30,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line a failure must print (and no traceback)."""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("cronoq: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EchoWorker]]:
    with serving_process(tmp_path_factory.mktemp("cli"), CONFIG) as s:
        worker = EchoWorker(s.address, slots=2)
        worker.registered.get(timeout=5)
        yield f"http://{s.address}", worker
        worker.stop()


@pytest.fixture(scope="module")
def server(served: tuple[str, EchoWorker]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def echo(served: tuple[str, EchoWorker]) -> EchoWorker:
    """The server's worker of the default pool, which keeps each task's tags."""
    return served[1]


def submit_idle(server: str, *args: str) -> int:
    done = cronoq(server, "submit", "--pool", "idle", *args)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_submit_an_argument_and_wait(server: str) -> None:
    done = cronoq(server, "submit", "hello", "--key", "cli-arg", "--wait", "--wait-timeout", "5s")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.isdigit()
    assert "succeeded" in done.stdout and "olleh" in done.stdout
    again = cronoq(server, "submit", "other", "--key", "cli-arg")
    assert (again.returncode, again.stdout.strip()) == (0, first)
    assert "duplicate" in again.stderr


def test_submit_json_and_a_failed_task_exits_1(server: str) -> None:
    done = cronoq(server, "--json", "submit", "hi", "--wait")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["duplicate"] is False
    assert answer["result"]["status"] == "succeeded"
    assert (answer["result"]["output"], answer["result"]["output_encoding"]) == ("ih", "utf-8")
    # the echo worker fails "flaky..." once; with one attempt that is the end
    failed = cronoq(server, "submit", "flaky", "--max-attempts", "1", "--wait", "--json")
    assert failed.returncode == 1, failed.stderr
    assert json.loads(failed.stdout)["result"]["status"] in ("failed", "dead_lettered")


def test_submit_from_a_file_and_from_stdin(server: str, tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text('{"n": 1}')
    by_file = cronoq(server, "submit", "--file", str(payload), "--json-payload")
    assert by_file.returncode == 0, by_file.stderr
    output = cronoq(server, "wait", by_file.stdout.strip(), "--output", "--timeout", "5")
    assert (output.returncode, output.stdout) == (0, '}1 :"n"{')
    by_stdin = cronoq(server, "submit", "-", stdin="from stdin")
    assert by_stdin.returncode == 0, by_stdin.stderr
    output = cronoq(server, "wait", by_stdin.stdout.strip(), "--output")
    assert (output.returncode, output.stdout) == (0, "nidts morf")


def test_task_options_reach_the_server(server: str) -> None:
    task = submit_idle(
        server, "x", "--kind", "report", "--priority", "HIGH", "--key", "cli-opts",
        "--tenant", "acme", "--deadline-in", "1h", "--timeout", "30s", "--max-attempts", "2",
        "--tag", "team=ops", "--label", "zone=b", "--resource", "gpu=1",
        "--duration-hint", "500ms", "--content-type", "text/x-report", "--on-miss", "skip",
    )  # fmt: skip
    info = json.loads(cronoq(server, "get", "cli-opts", "--json").stdout)
    assert (info["id"], info["pool"], info["kind"]) == (task, "idle", "report")
    assert (info["priority"], info["tenant"], info["max_attempts"]) == ("high", "acme", 2)
    later = submit_idle(server, "--start-at", "2099-01-01T00:00:00Z", "--after", str(task))
    assert json.loads(cronoq(server, "--json", "get", str(later)).stdout)["status"] == "blocked"
    start_in = submit_idle(server, "--start-in", "1h", "--tolerance", "2s")  # (needs a start)
    assert json.loads(cronoq(server, "--json", "get", str(start_in)).stdout)["status"] == (
        "scheduled"
    )


def test_submit_carries_the_trace_context_of_its_environment(server: str, echo: EchoWorker) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = {"TRACEPARENT": parent, "TRACESTATE": "vendor=1"}
    done = cronoq(server, "--json", "submit", "t", "--wait", env=env)
    task = json.loads(done.stdout)["id"]
    assert echo.tags[task] == {"traceparent": parent, "tracestate": "vendor=1"}
    own = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"  # a --tag traceparent wins
    done = cronoq(server, "--json", "submit", "t", "--wait", "--tag", f"traceparent={own}", env=env)
    assert echo.tags[json.loads(done.stdout)["id"]] == {"traceparent": own}


def test_get_shows_a_task_and_refuses_an_unknown_one(server: str) -> None:
    task = submit_idle(server, "y", "--key", "cli-get")
    shown = cronoq(server, "get", str(task))
    assert shown.returncode == 0
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert (fields["id"], fields["status"], fields["pool"], fields["key"]) == (
        str(task), "ready", "idle", "cli-get"
    )  # fmt: skip
    unknown = cronoq(server, "get", "987654321")
    assert unknown.returncode == 3
    assert one_error_line(unknown).startswith("cronoq: error: not_found: ")
    assert unknown.stdout == ""
    debug = cronoq(server, "--debug", "get", "987654321")
    assert debug.returncode == 3
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("cronoq: error: not_found: ")


def test_wait_times_out_with_124_and_cancel(server: str) -> None:
    task = submit_idle(server, "z")
    waited = cronoq(server, "wait", str(task), "--timeout", "300ms")
    assert waited.returncode == 124
    # (before it: the warning that no worker serves pool idle, if it came in time; see
    # test_cli_operations.py)
    assert waited.stderr.splitlines()[-1].startswith("cronoq: error: timeout: ")
    cancelled = cronoq(server, "cancel", str(task))
    assert (cancelled.returncode, cancelled.stdout.strip()) == (0, "cancelled")
    again = cronoq(server, "cancel", str(task), "--json")
    assert json.loads(again.stdout) == {"ref": task, "cancelled": False}
    unknown = cronoq(server, "cancel", "999999999")  # answered like an ended task
    assert (unknown.returncode, unknown.stdout.strip()) == (
        0,
        "not cancelled: no such task, or it had already ended",
    )
    ended = cronoq(server, "wait", str(task), "--json")
    assert ended.returncode == 1
    assert json.loads(ended.stdout)["status"] == "cancelled"


def test_list_filters_pages_and_json(server: str) -> None:
    ids = [submit_idle(server, "p") for _ in range(3)]
    table = cronoq(server, "list", "--pool", "idle", "--status", "ready", "--after", str(ids[0]))
    assert table.returncode == 0
    rows = [line.split() for line in table.stdout.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == ids[1:]
    assert {(r[1], r[2]) for r in rows} == {("ready", "idle")}
    page = cronoq(server, "list", "--pool", "idle", "--after", str(ids[0] - 1), "--limit", "1")
    assert f"--after {ids[0]}" in page.stderr
    every = cronoq(server, "--json", "list", "--pool", "idle", "--limit", "1", "--all")
    document = json.loads(every.stdout)
    assert set(ids) <= {t["id"] for t in document["tasks"]}
    assert (document["next_after"], document["unavailable_shards"]) == (None, [])


def test_watch_stops_after_count(server: str) -> None:
    lines = subprocess.Popen(
        [*COMMAND, "--server", server, "watch", "--pool", "default", "--count", "2"],
        stdout=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    jsons = subprocess.Popen(
        [*COMMAND, "--server", server, "watch", "--json", "--all", "--count", "3"],
        stdout=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    end = time.monotonic() + 20
    while (lines.poll() is None or jsons.poll() is None) and time.monotonic() < end:
        cronoq(server, "submit", "w", "--wait")  # until both watchers have subscribed and seen
    out, _ = lines.communicate(timeout=5)
    events, _ = jsons.communicate(timeout=5)
    assert (lines.returncode, jsons.returncode) == (0, 0)
    assert [line.split()[3] for line in out.splitlines()] == ["succeeded", "succeeded"]
    statuses = [json.loads(line)["status"] for line in events.splitlines()]
    assert len(statuses) == 3 and {"ready", "running"} & set(statuses)


def test_workers_and_snapshot(server: str) -> None:
    table = cronoq(server, "workers")
    assert table.returncode == 0
    assert table.stdout.splitlines()[2].split()[1:5] == ["echo", "default", "-", "0/2"]
    (worker,) = json.loads(cronoq(server, "--json", "workers").stdout)
    assert (worker["name"], worker["pool"], worker["slots"]) == ("echo", "default", 2)
    snapshot = json.loads(cronoq(server, "snapshot").stdout)
    assert [p["name"] for p in snapshot["pools"]] == ["default", "idle"]
    assert snapshot["workers_connected"] == 1 and snapshot["totals"]["submitted"] >= 0


def test_top_once_shows_pools_and_totals(server: str) -> None:
    cronoq(server, "submit", "t", "--wait")
    frame = cronoq(server, "top", "--once")
    assert frame.returncode == 0, frame.stderr
    assert f"cronoq top  {server}  serving" in frame.stdout
    rows = {line.split()[0]: line.split() for line in frame.stdout.splitlines() if line.strip()}
    assert {"default", "idle", "submitted"} <= set(rows)
    assert int(rows["submitted"][1]) >= 1 and "lease expiries" in frame.stdout
    assert "\x1b[" not in frame.stdout  # no colours without a terminal
    only = cronoq(server, "top", "--once", "--pool", "idle")
    assert "default " not in only.stdout.split("worker groups")[0].split("pools")[1]
    live = cronoq(server, "top")  # not a terminal, no --once
    assert live.returncode == 2 and "--once" in one_error_line(live)


def test_top_live_in_a_terminal_quits_on_q(server: str) -> None:
    screen_fd, terminal = pty.openpty()
    top = subprocess.Popen(
        [*COMMAND, "--server", server, "top", "--interval", "0.2"],
        stdin=terminal, stdout=terminal, stderr=terminal, env=ENV,
    )  # fmt: skip
    os.close(terminal)
    try:
        screen = b""
        end = time.monotonic() + 10
        while b"recent failures" not in screen and time.monotonic() < end:
            if select.select([screen_fd], [], [], 0.1)[0]:
                screen += os.read(screen_fd, 65536)
        assert b"recent failures" in screen and b"\x1b[?1049h" in screen  # the full screen
        os.write(screen_fd, b"q")
        assert top.wait(timeout=5) == 0
    finally:
        top.kill()
        os.close(screen_fd)


def test_recurring_add_list_and_remove(server: str) -> None:
    added = cronoq(
        server, "recurring", "add", "cli-nightly", "0 3 * * *", "job", "--pool", "idle",
        "--tz", "Europe/Paris", "--overlap", "queue", "--key", "nightly", "--priority", "low",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    table = cronoq(server, "recurring", "list")
    row = next(line.split() for line in table.stdout.splitlines() if "cli-nightly" in line)
    assert row[:6] == ["cli-nightly", "0", "3", "*", "*", "*"]
    assert row[6:9] == ["Europe/Paris", "idle", "default"] and row[9] == "queue"
    (schedule,) = [
        s
        for s in json.loads(cronoq(server, "recurring", "list", "--json").stdout)
        if s["name"] == "cli-nightly"
    ]
    assert (schedule["overlap"], schedule["tz"]) == ("queue", "Europe/Paris")
    assert schedule["next_at"] > time.time()
    removed = cronoq(server, "recurring", "rm", "cli-nightly")
    assert (removed.returncode, removed.stdout.strip()) == (0, "removed schedule cli-nightly")
    gone = cronoq(server, "--json", "recurring", "remove", "cli-nightly")
    assert json.loads(gone.stdout) == {"name": "cli-nightly", "removed": False}
    bad = cronoq(server, "recurring", "add", "cli-bad", "not a cron")
    assert bad.returncode == 3
    assert one_error_line(bad).startswith("cronoq: error: invalid_argument: ")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["submit", "--deadline-in", "5x"], "--deadline-in"),
        (["wait", "1", "--timeout", "soon"], "--timeout"),
        (["submit", "--file", "/no/such/payload"], "--file"),
        (["submit", "--bogus"], "--bogus"),
        (["--bogus", "list"], "--bogus"),
        (["submit", "x", "--wait-timeout", "1"], "--wait"),
        (["submit", "--start-at", "2030-01-01T00:00:00"], "--start-at"),
        (["submit", "--tag", "novalue"], "--tag"),
        (["submit", "{", "--json-payload"], "JSON"),
        (["top", "--once", "--json"], "snapshot"),
        (["nosuch"], "nosuch"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], names: str) -> None:
    done = cronoq("http://127.0.0.1:9", *args)
    assert done.returncode == 2
    assert names in one_error_line(done)


def test_version_and_help() -> None:
    from cronoq import __version__

    assert cronoq(None, "-V").stdout == f"cronoq {__version__}\n"
    assert "recurring" in cronoq(None, "-h").stdout
    assert "--all-transitions" in cronoq(None, "watch", "--help").stdout


def test_an_unreachable_server_fails_with_4() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = cronoq(f"http://127.0.0.1:{port}", "--connect-timeout", "300ms", "list")
    assert done.returncode == 4
    assert one_error_line(done) == (
        f"cronoq: error: unavailable: cannot reach http://127.0.0.1:{port}: connection failed "
        "(is the server running, with TLS only if the address says https://?)"
    )
    with socket.socket() as silent:  # accepts TCP, never speaks HTTP/2
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        hung = cronoq(address, "--connect-timeout", "500ms", "get", "1")
    assert hung.returncode == 4
    assert "no connection within 0.5s" in one_error_line(hung)


def test_a_refused_connection_is_tried_again_until_the_connect_timeout() -> None:
    port = free_port()
    env = ENV | {"CRONOQ_CONNECT_TIMEOUT": "300ms"}
    done = subprocess.run([*COMMAND, "--server", f"127.0.0.1:{port}", "--debug", "list"],
                          capture_output=True, text=True, env=env, timeout=30)  # fmt: skip
    assert done.returncode == 4
    assert f"127.0.0.1:{port} refuses connections (not listening yet?)" in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.endswith("connection failed (is the server running, with TLS only if the "
                         "address says https://?)")  # fmt: skip


def test_a_standby_s_refusal_is_tried_again_until_the_connect_timeout(
    tmp_path: Path, servers: list[Server]
) -> None:
    config = write(tmp_path, PORT0 + f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q.db"\n')
    leader, standby = leader_and_standby(config, servers)
    env = {"CRONOQ_CONNECT_TIMEOUT": "300ms"}
    done = cronoq(standby.address, "--debug", "list", env=env)
    assert done.returncode == 4
    assert "not the leader (standby)" in done.stderr.splitlines()[-1]
    assert cronoq(leader.address, "list", env=env).returncode == 0


def test_the_command_waits_for_a_server_that_is_starting(tmp_path: Path) -> None:
    """The README's server-mode block: the command runs before the server listens."""
    port = free_port()
    env = ENV | {"CRONOQ_CONNECT_TIMEOUT": "60"}
    command = [*COMMAND, "--server", f"127.0.0.1:{port}", "--debug", "list", "--json"]
    early = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)  # fmt: skip
    try:
        assert early.stderr is not None
        for line in early.stderr:  # the command was refused at least once: start the server
            if "refuses connections" in line:
                break
        else:
            raise AssertionError("the command ended without waiting for the server")
        config = PORT0.replace('grpc_addr = "127.0.0.1:0"', f'grpc_addr = "127.0.0.1:{port}"')
        with serving_process(tmp_path, config + '[[pools]]\nname = "default"\n'):
            out, err = early.communicate(timeout=60)
        assert early.returncode == 0, err
        assert json.loads(out)["tasks"] == []
    finally:
        early.kill()


def test_a_bad_connect_timeout_is_a_usage_error() -> None:
    bad = subprocess.run([*COMMAND, "list"], capture_output=True, text=True, timeout=30,
                         env=ENV | {"CRONOQ_CONNECT_TIMEOUT": "soon"})  # fmt: skip
    assert bad.returncode == 2
    assert "--connect-timeout" in one_error_line(bad) and "bad duration 'soon'" in bad.stderr


def test_localhost_works_for_the_server_the_command_the_client_and_the_worker(
    tmp_path: Path,
) -> None:
    """A host name where an address goes: the server's listeners resolve it (to 127.0.0.1),
    and the command, the client and the worker connect by it."""
    from cronoq.client import Client, Lease, Worker

    config = PORT0.replace('"127.0.0.1:0"', '"localhost:0"') + '[[pools]]\nname = "default"\n'
    with serving_process(tmp_path, config) as s:
        assert s.address.startswith("127.0.0.1:") and s.http_address.startswith("127.0.0.1:")
        local = "localhost:" + s.address.rsplit(":", 1)[1]

        async def handle(lease: Lease) -> bytes:
            return lease.payload

        async def submit() -> str | None:
            worker = Worker(local, "default", handle)
            run = asyncio.create_task(worker.run())
            await worker.wait_registered(30)
            async with Client(f"http://{local}") as client:
                done = await client.submit(b"hi", wait=True, wait_timeout=30)
            await worker.stop()
            await run
            return None if done.result is None else done.result.status

        assert asyncio.run(submit()) == "succeeded"
        listed = cronoq(local, "--json", "list")
        assert listed.returncode == 0, listed.stderr
        assert [t["status"] for t in json.loads(listed.stdout)["tasks"]] == ["succeeded"]


def test_a_bad_token_is_refused_with_3(tmp_path: Path) -> None:
    config = PORT0 + '[[auth.tokens]]\ntoken = "cli-admin-token-0123456789abcdef"\nrole = "admin"\n'
    with serving_process(tmp_path, config) as s:
        good = cronoq(s.address, "--token", "cli-admin-token-0123456789abcdef", "list")
        assert good.returncode == 0, good.stderr
        bad = cronoq(s.address, "--token", "wrong-token-0123456789abcdef", "list")
        assert bad.returncode == 3
        assert one_error_line(bad).startswith("cronoq: error: unauthenticated")


def test_mutual_tls_with_pem_files(pki: Path, tmp_path: Path) -> None:
    with serving_process(tmp_path, mtls_config(pki)) as s:
        server = "https://localhost:" + s.address.rsplit(":", 1)[1]
        ca, ops = ["--ca", str(pki / "ca.pem")], ["--cert", str(pki / "ops.pem")]
        mine = cronoq(server, *ca, *ops, "--key", str(pki / "ops.key"), "list", "--pool", "a")
        assert mine.returncode == 0, mine.stderr
        other = cronoq(server, *ca, *ops, "--key", str(pki / "ops.key"), "list", "--pool", "b")
        assert other.returncode == 3  # the certificate maps to a client of pool "a" only
        anonymous = cronoq(server, *ca, "list")  # the server asks for a client certificate
        assert anonymous.returncode == 4 and "connection failed" in one_error_line(anonymous)
        half = cronoq(server, *ca, *ops, "list")
        assert half.returncode == 2 and "--key" in one_error_line(half)


def test_the_worker_command_takes_its_own_tls_files(pki: Path, tmp_path: Path) -> None:
    """`cronoq worker ... --ca --cert --key` (not only the global options): a worker
    certificate of pool "a" registers over mutual TLS, and a SIGTERM ends it cleanly."""
    (tmp_path / "tls_app.py").write_text(
        "import cronoq\napp = cronoq.App()\n@app.task(pool='a')\nasync def ping() -> str:\n"
        "    return 'pong'\n"
    )
    with serving_process(tmp_path, mtls_config(pki)) as s:
        server = "https://localhost:" + s.address.rsplit(":", 1)[1]
        files = ["--ca", str(pki / "ca.pem"), "--cert", str(pki / "robot.pem")]
        argv = [sys.executable, "-m", "cronoq.cli", "worker", "tls_app:app", "--target", server]
        worker = LoggedProcess(
            [*argv, *files, "--key", str(pki / "robot.key")], cwd=tmp_path, env=ENV
        )
        try:
            worker.wait_for(r"registered with \S+: pool a, \d+ slot\(s\) granted, kinds ping$")
            assert worker.terminate() == 0, worker.lines
        finally:
            worker.kill()


def test_without_grpc_the_command_says_what_to_install() -> None:
    code = "import sys; sys.modules['grpc'] = None; from cronoq.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "list"], capture_output=True, text=True, env=ENV, timeout=30
    )
    assert done.returncode == 2
    assert "pip install 'cronoq[client]'" in one_error_line(done)


class _Ready(logging.Handler):
    """Sets `ready` on the server's `event=ready` log record."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "ready":
            self.ready.set()


@contextlib.contextmanager
def server_whose_clock_stands_still(config: str) -> Iterator[str]:
    """The server cronoq-server runs (wiring.build), serving in a thread of this process on
    a clock that does not move: everything it counts stays in its metrics window."""
    from cronoq.server.config import load_config
    from cronoq.server.wiring import build

    app = build(load_config(config), clock=lambda: 1_000_000.0)
    logger, ready = logging.getLogger("cronoq.server.app"), _Ready()
    logger.addHandler(ready)
    level = logger.level
    logger.setLevel(logging.INFO)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    serving = threading.Thread(target=loop.run_until_complete, args=(app.serve(stop),))
    serving.start()
    try:
        assert ready.ready.wait(60), "the server did not start"
        yield f"http://{app.grpc_address}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        serving.join(60)
        loop.close()
        logger.removeHandler(ready)
        logger.setLevel(level)


def test_top_counts_errors_per_attempt_and_failed_tasks_in_the_totals() -> None:
    """docs/cli.md, "cronoq top": the metrics window counts attempts, the totals tasks."""
    retry = "retry = { max_attempts = 2, initial_backoff_s = 0, jitter = false }"
    config = PORT0 + f'[[pools]]\nname = "default"\nmax = 2\n{retry}\n'
    with server_whose_clock_stands_still(config) as server:
        worker = EchoWorker(server.removeprefix("http://"))  # fails each "flaky" task once
        try:
            for payload in ("flaky-1", "flaky-2"):  # retried, then succeeded
                done = cronoq(server, "submit", payload, "--wait")
                assert done.returncode == 0 and "succeeded" in done.stdout, done.stderr
            last = cronoq(server, "submit", "flaky-3", "--max-attempts", "1", "--wait")
            assert last.returncode == 1 and "dead_lettered" in last.stdout, last.stderr
            frame = cronoq(server, "top", "--once")
        finally:
            worker.stop()
    assert frame.returncode == 0, frame.stderr
    lines = [line.rstrip() for line in frame.stdout.splitlines()]
    window = lines.index("metrics window")
    assert lines[window + 1].split()[:4] == ["pool", "disp", "ok", "errors"]
    assert lines[window + 3].split()[:4] == ["default", "5", "2", "3"]  # 5 attempts, 3 failed
    totals = " ".join(" ".join(line.split()) for line in lines[2:5])
    assert "failed 0" in totals and "dead lettered 1" in totals and "retries 2" in totals
