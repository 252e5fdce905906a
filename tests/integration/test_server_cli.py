"""The `cronoq-server` command as a real process (docs/server.md), and ServerApp in
process with stand-in servicers: flags, config errors, logs, port 0, signals, standby."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import sqlite3
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.core.engine import Engine
from cronoq.core.model import Attempt
from cronoq.proto import proto_text
from cronoq.proto.cronoq.v1 import cronoq_pb2, cronoq_pb2_grpc
from cronoq.server.app import ServerApp
from cronoq.server.config import load_config
from helpers.servers import PORT0, Server, leader_and_standby, led_elsewhere, server_command, write

LOG_LINE = re.compile(r"ts=\S+ level=(debug|info|warning|error) logger=\S+ (event|msg)=\S")
SHARDS = """
[[pools]]
name = "default"
[[shards]]
name = "cpu"
number = 1
pools = ["default"]
endpoint = "http://127.0.0.1:7070"
[[shards]]
name = "gpu"
number = 2
pools = ["llm"]
endpoint = "http://127.0.0.1:7080"
"""


def get_code(address: str) -> grpc.StatusCode:
    """The status of Tasks/Get without a task reference: INVALID_ARGUMENT from a serving
    leader, UNAVAILABLE from a standby."""
    with grpc.insecure_channel(address) as ch:
        grpc.channel_ready_future(ch).result(timeout=5)
        with pytest.raises(grpc.RpcError) as info:
            cronoq_pb2_grpc.TasksStub(ch).Get(cronoq_pb2.GetRequest(), timeout=5)
        code: grpc.StatusCode = info.value.code()
        return code


# --- flags and configuration ----------------------------------------------------------------


def test_version() -> None:
    r = server_command("--version")
    assert (r.returncode, r.stdout) == (0, "cronoq-server 0.2.0\n")
    assert server_command("-V").stdout == r.stdout


def test_print_proto_comes_first_and_needs_no_config(tmp_path: Path) -> None:
    broken = write(tmp_path, "[server]\nfoo = 1\n")
    r = server_command("--print-proto", "-c", broken)
    assert (r.returncode, r.stdout, r.stderr) == (0, proto_text(), "")
    assert "service Workers" in r.stdout


VALID = "configuration is valid\n"  # what --check prints, as the published server does


def test_check_ok(tmp_path: Path) -> None:
    r = server_command("--check")  # the embedded default
    assert (r.returncode, r.stdout, r.stderr) == (0, VALID, "")
    r = server_command("--check", "-c", write(tmp_path, PORT0))
    assert (r.returncode, r.stdout) == (0, VALID)


def test_check_errors_one_error_line_each_exit_1(tmp_path: Path) -> None:
    config = write(tmp_path, '[server]\nfoo = 1\n[[pools]]\nname = "p"\nmin = 5\nmax = 2\n')
    r = server_command("--check", "-c", config)
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == "Error: server.foo: unknown key"
    assert len(lines) == 2 and lines[1].startswith("Error: pools[0].")
    assert "Traceback" not in r.stderr
    # the same without --check: the server does not start, and logs nothing
    served = server_command("-c", config)
    assert (served.returncode, served.stderr) == (1, r.stderr)
    missing = server_command("--check", "-c", str(tmp_path / "nope.toml"))
    assert missing.returncode == 1
    (line,) = missing.stderr.splitlines()
    assert line.startswith(f"Error: {tmp_path / 'nope.toml'}: cannot read the file"), line
    broken = server_command("--check", "-c", write(tmp_path, "[server\n", "broken.toml"))
    assert broken.returncode == 1
    (line,) = broken.stderr.splitlines()
    assert line.startswith(f"Error: {tmp_path / 'broken.toml'}: not valid TOML ("), line


def test_a_usage_error_exits_2(tmp_path: Path) -> None:
    r = server_command("--no-such-option")
    assert r.returncode == 2 and r.stdout == ""
    assert "usage: cronoq-server" in r.stderr and "--no-such-option" in r.stderr
    assert server_command("--check", "-c").returncode == 2  # -c without its PATH


def test_cronoq_config_env_and_the_flag_over_it(tmp_path: Path) -> None:
    bad = write(tmp_path, "[server]\nfoo = 1\n", "bad.toml")
    r = server_command("--check", env={"CRONOQ_CONFIG": bad})
    assert (r.returncode, r.stderr) == (1, "Error: server.foo: unknown key\n")
    r = server_command("--check", "-c", write(tmp_path, PORT0), env={"CRONOQ_CONFIG": bad})
    assert (r.returncode, r.stdout) == (0, VALID)


def test_shard_override_reaches_validation(tmp_path: Path) -> None:
    config = write(tmp_path, SHARDS)
    r = server_command("--check", "-c", config)
    assert r.returncode == 1 and r.stderr.startswith("Error: server.shard: is required")
    assert server_command("--check", "-c", config, "--shard", "cpu").stdout == VALID
    # gpu is a shard, but its pool is not configured here: the validation saw the override
    r = server_command("--check", "-c", config, env={"CRONOQ_SHARD": "gpu"})
    assert r.returncode == 1 and 'pool "llm" of this server\'s shard' in r.stderr
    r = server_command("--check", "-c", config, "--shard", "cpu", env={"CRONOQ_SHARD": "gpu"})
    assert r.stdout == VALID  # the flag wins over the variable
    r = server_command("--check", "-c", config, "--shard", "tpu")
    assert r.returncode == 1 and "Error: server.shard: must name one of" in r.stderr


def test_insecure_no_auth_flag(tmp_path: Path) -> None:
    config = write(tmp_path, '[server]\ngrpc_addr = "0.0.0.0:0"\n')
    r = server_command("--check", "-c", config)
    assert r.returncode == 1 and r.stderr.startswith("Error: server.grpc_addr: 0.0.0.0:0 is not")
    assert server_command("--check", "-c", config, "--insecure-no-auth").stdout == VALID


def test_check_validates_a_postgres_store_without_connecting(tmp_path: Path) -> None:
    """docs/configuration.md, "[store]": --check reaches no database (this address would hold
    a connection attempt for minutes), and its warnings never show the URL's password."""
    url = "postgresql://u:secret-pw@10.255.255.1:5432/db"
    config = write(tmp_path, PORT0 + f'[store]\nkind = "postgres"\nurl = "{url}"\n')
    began = time.monotonic()
    r = server_command("--check", "-c", config)
    assert (r.returncode, r.stdout) == (0, VALID)
    assert time.monotonic() - began < 15  # (server_command() gives up at 20 s)
    warnings = [line for line in r.stderr.splitlines() if "level=warning" in line]
    assert len(warnings) == 2 and "prefer url_env" in warnings[0]
    assert "sslmode=verify-full" in warnings[1]
    assert "secret-pw" not in r.stderr and "10.255.255.1" not in r.stderr
    unset = PORT0 + '[store]\nkind = "postgres"\nurl_env = "CRONOQ_TEST_UNSET_URL"\n'
    r = server_command("--check", "-c", write(tmp_path, unset))
    assert (r.returncode, r.stderr) == (
        1,
        "Error: store.url_env: environment variable CRONOQ_TEST_UNSET_URL (store URL) is not set\n",
    )


def test_a_database_refusal_retrying_cannot_fix_fails_the_start(tmp_path: Path, pg: Any) -> None:
    """A database that does not exist is not waited for: exit 1 after event=failed."""
    url = pg.url.rpartition("/")[0] + "/no_such_database"
    config = write(tmp_path, PORT0 + '[store]\nkind = "postgres"\n')
    r = server_command("-c", config, env={"DATABASE_URL": url})
    assert r.returncode == 1
    assert "event=listening" in r.stderr and "event=failed" in r.stderr
    last = r.stderr.splitlines()[-1]
    assert last.startswith("Error: store ") and "no_such_database" in last, last


def test_address_in_use_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = server_command("-c", write(tmp_path, f'[server]\ngrpc_addr = "127.0.0.1:{port}"\n'))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    # the log line, then the published server's last line
    *logged, last = r.stderr.splitlines()
    (failed,) = [line for line in logged if "event=failed" in line]
    assert f"cannot listen on 127.0.0.1:{port}" in failed and LOG_LINE.match(failed)
    assert last == f"Error: cannot listen on 127.0.0.1:{port}: address already in use", last


def events_of(stderr: str) -> list[str]:
    return [m.group(1) for line in stderr.splitlines() if (m := re.search(r"event=(\w+)", line))]


def test_a_store_that_cannot_open_logs_failed_before_the_shutdown(tmp_path: Path) -> None:
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path}/no-such-directory/q.db"\n'
    config = write(tmp_path, PORT0 + store)
    assert (
        server_command("--check", "-c", config).stdout == VALID
    )  # the file is opened only to serve
    r = server_command("-c", config)
    assert r.returncode == 1, r.stderr
    assert events_of(r.stderr)[-3:] == ["failed", "stopping", "stopped"], r.stderr
    (failed,) = [line for line in r.stderr.splitlines() if "event=failed" in line]
    assert "level=error" in failed and "no-such-directory/q.db" in failed
    assert "Traceback" not in r.stderr
    last = r.stderr.splitlines()[-1]  # after the shutdown's events
    assert last.startswith("Error: ") and "no-such-directory/q.db" in last, r.stderr


# `cronoq-server` as the entry point runs it, in an interpreter where the modules cannot be
# imported: the import fails as it does when their packages are not installed.
WITHOUT = """
import runpy, sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {missing}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
runpy.run_module("cronoq.server.cli", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "missing",
    [("aiohttp", "prometheus_client"), ("grpc", "google", "aiohttp", "prometheus_client")],
    ids=["with-grpcio", "without-grpcio"],
)
def test_without_the_server_extra_one_line_says_what_to_install(
    tmp_path: Path, missing: tuple[str, ...]
) -> None:
    code = WITHOUT.format(missing=set(missing))
    config = write(tmp_path, PORT0)
    served = subprocess.run(
        [sys.executable, "-c", code, "-c", config], capture_output=True, text=True, timeout=20
    )
    assert served.returncode == 1
    (line,) = served.stderr.splitlines()
    named = re.fullmatch(
        r"Error: serving needs the server extra \(no module named '(\w+)'\):"
        r" pip install 'cronoq\[server\]'",
        line,
    )
    assert named is not None and named.group(1) in missing, line
    checked = subprocess.run(
        [sys.executable, "-c", code, "--check", "-c", config],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert (checked.returncode, checked.stdout) == (0, VALID)  # --check needs no extra


# --- serving -------------------------------------------------------------------------------


def test_serve_on_port_0_then_sigterm(tmp_path: Path, servers: list[Server]) -> None:
    s = Server(write(tmp_path, PORT0 + 'log_level = "debug"\n'))
    servers.append(s)
    host, port = s.address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    s.wait_for("event=ready")
    assert get_code(s.address) is grpc.StatusCode.INVALID_ARGUMENT  # serving
    assert s.terminate(timeout=60) == 0  # (the timeout only fails a server that hangs)
    events = [m.group(1) for line in s.lines if (m := re.search(r"event=(\w+)", line))]
    assert events[-3:] == ["signal", "stopping", "stopped"]
    assert all(LOG_LINE.match(line) for line in s.lines), s.lines


def test_sqlite_standby_until_the_leader_stops(tmp_path: Path, servers: list[Server]) -> None:
    config = write(tmp_path, PORT0 + f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q.db"\n')
    leader, standby = leader_and_standby(config, servers)
    assert get_code(standby.address) is grpc.StatusCode.UNAVAILABLE
    assert get_code(leader.address) is grpc.StatusCode.INVALID_ARGUMENT
    assert leader.terminate(timeout=10) == 0  # a clean stop releases the lease at once
    standby.wait_for("event=ready", timeout=5)
    assert get_code(standby.address) is grpc.StatusCode.INVALID_ARGUMENT
    assert standby.terminate(timeout=10) == 0


def _fence(db: Path) -> None:
    """What a new leader does to the file: a higher epoch and another holder (its lease here
    already expired, so whoever asks next takes the leadership)."""
    with sqlite3.connect(db) as other:
        other.execute(
            "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'intruder', expires_unix_ns = 0"
        )


def _submit(address: str, key: str) -> int:
    with grpc.insecure_channel(address) as ch:
        spec = cronoq_pb2.TaskSpec(key=key)
        reply = cronoq_pb2_grpc.TasksStub(ch).Submit(cronoq_pb2.SubmitRequest(task=spec), timeout=5)
        return int(reply.id)


def _get_key(address: str, key: str) -> int:
    with grpc.insecure_channel(address) as ch:
        ref = cronoq_pb2.TaskRef(key=key)
        return int(cronoq_pb2_grpc.TasksStub(ch).Get(cronoq_pb2.GetRequest(task=ref), timeout=5).id)


def test_a_fenced_leader_stands_by_again_and_leads_again(
    tmp_path: Path, servers: list[Server]
) -> None:
    """docs/server.md, "Standby": a leader that finds the leadership taken stops
    serving at once, stands by, and serves again (new epoch, state recovered from the file) once it
    leads again."""
    db = tmp_path / "q.db"
    server = Server(write(tmp_path, PORT0 + f'[store]\nkind = "sqlite"\npath = "{db}"\n'))
    servers.append(server)
    server.wait_for("event=ready")
    first = _submit(server.address, "before")
    _fence(db)
    with contextlib.suppress(grpc.RpcError):
        _submit(server.address, "during")  # its commit finds the leadership taken
    server.wait_for(r"event=standing_by reason=.*fenced")
    server.wait_for("event=awaiting_leadership")
    server.wait_for("event=ready")
    assert _get_key(server.address, "before") == first
    again = _submit(server.address, "after")
    assert again >> 48 == (first >> 48) + 2  # the intruder's epoch, then ours
    assert server.terminate(timeout=10) == 0


def test_failover_between_two_processes_and_back(tmp_path: Path, servers: list[Server]) -> None:
    """A leader fenced while a standby waits: one of the two leads next (the other stands
    by), and when that one stops the other takes over; the task submitted first survives."""
    db = tmp_path / "q.db"
    config = write(tmp_path, PORT0 + f'[store]\nkind = "sqlite"\npath = "{db}"\n')
    a = Server(config)
    servers.append(a)
    a.wait_for("event=ready")
    b = Server(config)
    servers.append(b)
    b.wait_for("event=awaiting_leadership")
    first = _submit(a.address, "first")
    _fence(db)
    with contextlib.suppress(grpc.RpcError):
        _submit(a.address, "during")
    a.wait_for(r"event=standing_by")
    end = time.monotonic() + 10
    while (codes := {get_code(a.address), get_code(b.address)}) != {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAVAILABLE,
    }:
        assert time.monotonic() < end, codes
        time.sleep(0.1)
    leader, standby = (a, b) if get_code(a.address) is grpc.StatusCode.INVALID_ARGUMENT else (b, a)
    assert _get_key(leader.address, "first") == first
    assert leader.terminate(timeout=10) == 0  # a clean stop hands over at once
    standby.wait_for("event=ready", timeout=5)
    assert _get_key(standby.address, "first") == first
    assert standby.terminate(timeout=10) == 0


# --- ServerApp in process -------------------------------------------------------------------


class FakeLauncher:
    """Records what the scheduler hands a launcher."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def bind(self, engine: Engine, kick: Any) -> None:
        self.engine = engine

    def launch(self, starts: list[Attempt]) -> None:
        raise AssertionError("no task is submitted here")

    def abort(self, aborts: list[Attempt]) -> None:
        raise AssertionError("no task is submitted here")


class Recorder(grpc.aio.ServerInterceptor):
    """Stands for authentication: it sees every call, also those a standby refuses."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.methods.append(details.method)
        return await continuation(details)


def fake_tasks(app: ServerApp, server: grpc.aio.Server) -> None:
    """A Tasks servicer with one method, Get, that answers with the task's id."""

    async def get(request: cronoq_pb2.GetRequest, context: Any) -> cronoq_pb2.TaskInfo:
        return cronoq_pb2.TaskInfo(id=request.task.id)

    handler = grpc.unary_unary_rpc_method_handler(
        get,
        request_deserializer=cronoq_pb2.GetRequest.FromString,
        response_serializer=cronoq_pb2.TaskInfo.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("cronoq.v1.Tasks", {"Get": handler}),)
    )


async def test_app_standby_ready_and_stop_order(tmp_path: Path) -> None:
    holder, store = await led_elsewhere(tmp_path / "q.db")  # another process's, held here
    cfg = load_config(PORT0 + store)
    launcher, recorder, order = FakeLauncher(), Recorder(), []
    app = ServerApp(
        cfg,
        launcher_factory=lambda app: launcher,
        registrars=[fake_tasks],
        interceptors=[recorder],
    )

    async def hook() -> None:
        order.append(("hook", app.scheduler.started, app.ready))

    app.on_stop(hook)
    stop = asyncio.Event()
    serving = asyncio.create_task(app.serve(stop))
    while app.grpc_address is None:
        await asyncio.sleep(0.01)
    async with grpc.aio.insecure_channel(str(app.grpc_address)) as ch:
        stub = cronoq_pb2_grpc.TasksStub(ch)
        request = cronoq_pb2.GetRequest(task=cronoq_pb2.TaskRef(id=7))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Get(request)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "not the leader" in (info.value.details() or "")
        assert recorder.methods == ["/cronoq.v1.Tasks/Get"]
        assert not app.ready and launcher.engine is None

        await holder.close()  # the leader leaves: this app takes over
        while not app.ready:
            await asyncio.sleep(0.05)
        assert (await stub.Get(request)).id == 7
        assert launcher.engine is not None
        assert [p.capacity for p in launcher.engine.snapshot(0.0).pools] == [0]  # no workers
        stop.set()
        await serving
    assert order == [("hook", False, False)]  # after the scheduler stopped
    assert not app.scheduler.started


async def test_stop_while_standing_by(tmp_path: Path) -> None:
    holder, store = await led_elsewhere(tmp_path / "q.db")
    app = ServerApp(load_config(PORT0 + store))
    stop = asyncio.Event()
    serving = asyncio.create_task(app.serve(stop))
    while app.grpc_address is None:  # bound: now waiting for the leadership
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(serving, 30)  # the wait for the leadership is given up
    assert not app.ready and holder.epoch == 1
    await holder.close()


async def test_tls_listener(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
               "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]  # fmt: skip
    subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    cfg = load_config(PORT0 + f'[server.tls]\ncert = "{cert}"\nkey = "{key}"\n')
    app = ServerApp(cfg, registrars=[fake_tasks])
    stop = asyncio.Event()
    serving = asyncio.create_task(app.serve(stop))
    while not app.ready:
        await asyncio.sleep(0.01)
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    options = [("grpc.ssl_target_name_override", "localhost")]
    async with grpc.aio.secure_channel(str(app.grpc_address), creds, options) as ch:
        request = cronoq_pb2.GetRequest(task=cronoq_pb2.TaskRef(id=3))
        assert (await cronoq_pb2_grpc.TasksStub(ch).Get(request)).id == 3

    def https(scheme: str) -> str:
        context = ssl.create_default_context(cafile=str(cert))
        port = app.http_address.port if app.http_address else 0
        url = f"{scheme}://localhost:{port}/healthz"
        with urllib.request.urlopen(url, context=context, timeout=5) as r:
            return str(r.read().decode())

    # the HTTP listener speaks TLS too, and only TLS
    assert await asyncio.to_thread(https, "https") == "ok"
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        await asyncio.to_thread(https, "http")
    stop.set()
    await serving


def test_the_server_schedules_by_the_clock_it_is_given() -> None:
    """wiring.build(cfg, clock=...): the scheduler, and the workers' service with it, read
    that clock, so a test can drive the server's time."""
    from cronoq.server.wiring import build

    def clock() -> float:
        return 1_000.0

    app = build(load_config(PORT0 + '[[pools]]\nname = "default"\n'), clock=clock)
    assert app.scheduler.clock is clock
    assert build(load_config(PORT0)).scheduler.clock is time.time
