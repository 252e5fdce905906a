"""The listeners' connection guarantees (docs/server.md, "Connections"), on real processes and
real sockets.

Taken addresses: a second `cronoq-server` on an address a running server holds (its gRPC, HTTP
or metrics address) exits 1 with one `failed` line naming the address, in the log format and
before any `listening`, and the first server keeps all the traffic. In process: when the HTTP
listener cannot bind after the gRPC one did, the gRPC one is closed again.

HTTP/2 pings, with a frame-level client (helpers/h2peer.py): a client pinging every second
keeps its connection, with idle `Work` and `Watch` streams open and with no call at all (gRPC's
defaults would end both with GOAWAY "too_many_pings" by the fourth ping). And the server's own
pings: a peer that stops acknowledging them is disconnected after keepalive_interval_s plus
keepalive_timeout_s, its worker with it, also when it has no call open.

The ping tests take about 12 s each: one ping a second, a dozen times, is the rate under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server import app as app_module
from cronoq.server.app import ServerApp
from cronoq.server.config import load_config
from helpers.auth import AUTH, POOLS
from helpers.h2peer import H2Peer
from helpers.ports import free_port
from helpers.servers import COMMAND, PORT0, Serving, serving_process, write

LOG_LINE = re.compile(r"ts=\S+ level=(debug|info|warning|error) logger=\S+ (event|msg)=\S")
WAIT_S = 60.0  # safety nets only: a busy machine may take seconds to start a server

WORK = "/cronoq.v1.Workers/Work"
WATCH = "/cronoq.v1.Tasks/Watch"
LIST_WORKERS = "/cronoq.v1.Admin/ListWorkers"


def eventually(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll `check` until it holds; AssertionError after `timeout` (a safety net)."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not {what} within {timeout} s")
        time.sleep(0.05)


def register(pool: str, name: str = "h2") -> pb.WorkerMessage:
    return pb.WorkerMessage(
        register=pb.Register(pool=pool, slots=1, worker_name=name, protocol_version=3)
    )


# --- (1) a taken address refuses the start -------------------------------------------------------


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serving, str]]:
    """The server holding the addresses: SQLite, tokens, a metrics listener; and its metrics
    address."""
    directory = tmp_path_factory.mktemp("first")
    config = (
        PORT0
        + 'metrics_addr = "127.0.0.1:0"\n'
        + f'[store]\nkind = "sqlite"\npath = "{directory / "cronoq.db"}"\n'
        + POOLS
        + AUTH
    )
    with serving_process(directory, config) as serving:
        metrics = next(
            m.group(1)
            for line in serving.server.lines
            if (m := re.search(r"event=listening metrics=(\S+)", line))
        )
        yield serving, metrics


def second_server(tmp_path: Path, **addresses: str) -> subprocess.CompletedProcess[str]:
    """Run an in-memory server without credentials on `addresses` (the others on port 0)
    until it exits by itself."""
    listeners = {"grpc_addr": "127.0.0.1:0", "http_addr": "127.0.0.1:0", **addresses}
    text = "[server]\n" + "".join(f'{key} = "{value}"\n' for key, value in listeners.items())
    environ = {k: v for k, v in os.environ.items() if k not in ("CRONOQ_CONFIG", "CRONOQ_SHARD")}
    return subprocess.run(
        [*COMMAND, "-c", write(tmp_path, text + "shutdown_grace_s = 0\n", "second.toml")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=WAIT_S,  # a second server that starts instead of refusing fails here
    )


def tokenless_submit(address: str) -> grpc.StatusCode:
    """A Submit without credentials on a connection of its own (so that the system could hand
    each one to another process sharing the port)."""
    with grpc.insecure_channel(address) as channel:
        try:
            cronoq_pb2_grpc.TasksStub(channel).Submit(
                pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", pool="a")), timeout=10
            )
        except grpc.RpcError as e:
            code: grpc.StatusCode = e.code()
            return code
    return grpc.StatusCode.OK


def tokenless_snapshot(http_address: str) -> int:
    request = urllib.request.Request(f"http://{http_address}/v1/snapshot")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("key", ["grpc_addr", "http_addr", "metrics_addr"])
def test_a_second_server_on_a_taken_address_exits_1(
    first: tuple[Serving, str], tmp_path: Path, key: str
) -> None:
    serving, metrics = first
    taken = {"grpc_addr": serving.address, "http_addr": serving.http_address}.get(key, metrics)
    r = second_server(tmp_path, **{key: taken})
    assert r.returncode == 1, r.stderr
    # the log, then one last line as the published server prints it (docs/server.md, "Exit codes")
    *lines, last = r.stderr.splitlines()
    assert last == f"Error: cannot listen on {taken}: address already in use", r.stderr
    assert lines and all(LOG_LINE.match(line) for line in lines), lines  # no gRPC C-core line
    errors = [line for line in lines if "level=error" in line]
    assert len(errors) == 1 and "event=failed" in errors[0], lines
    assert f'error="cannot listen on {taken}: address already in use"' in errors[0], errors
    assert [line for line in lines if taken in line] == errors
    assert not [line for line in lines if "event=listening" in line or "event=ready" in line]
    # the first server alone still serves both addresses, and it asks for credentials
    codes = [tokenless_submit(serving.address) for _ in range(10)]
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 10
    assert [tokenless_snapshot(serving.http_address) for _ in range(3)] == [401] * 3
    assert serving.server.proc.poll() is None


async def test_the_grpc_listener_is_closed_when_http_cannot_bind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The HTTP address is taken only after the check (here: the check is skipped), so gRPC is
    bound when HTTP fails: listen() closes it again, logs no `listening` and raises OSError."""
    monkeypatch.setattr(app_module, "ensure_free", lambda *a, **kw: None, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http = f"127.0.0.1:{taken.getsockname()[1]}"
        grpc_port = free_port()
        text = f'[server]\ngrpc_addr = "127.0.0.1:{grpc_port}"\nhttp_addr = "{http}"\n'
        app = ServerApp(load_config(Path(write(tmp_path, text))))
        caplog.set_level(logging.INFO, logger="cronoq.server")
        with pytest.raises(OSError, match=f"cannot listen on {re.escape(http)}"):
            await app.serve(asyncio.Event())
    assert app.grpc_address is None and app.http_address is None
    assert not [r for r in caplog.records if r.getMessage() in ("listening", "stopping")]
    with socket.socket() as again:  # the gRPC port is free again: nothing listens there
        again.bind(("127.0.0.1", grpc_port))
        again.listen()


# --- (2) client pings are accepted -------------------------------------------------------------

PINGS = 12  # gRPC's defaults (pings 5 min apart, 2 strikes) end the connection at the 4th


@pytest.fixture(scope="module")
def pinged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    """A server with the default keepalive settings (its own pings every 20 s)."""
    config = PORT0 + '[[pools]]\nname = "keep"\n'
    with serving_process(tmp_path_factory.mktemp("pinged"), config) as serving:
        yield serving


def ping_every_second(peer: H2Peer) -> None:
    for _ in range(PINGS):
        peer.ping()  # waits for the ACK (and fails on a GOAWAY)
        # The pace under test. Counted from the ACK, so that the server, however late it
        # handled this ping, sees the next one at least a second after it.
        peer.idle(1.0)
    assert (peer.goaway, peer.ended, peer.eof) == (None, None, False)


def test_pings_every_second_keep_idle_work_and_watch_streams(pinged: Serving) -> None:
    peer = H2Peer(pinged.address)
    try:
        peer.handshake()
        work = peer.open(WORK, register("keep"))
        worker_id = peer.read(work, pb.ServerMessage).registered.worker_id
        watch = peer.open(WATCH, pb.WatchRequest(pools=["keep"]), end=True)
        ping_every_second(peer)

        # the worker is still the one registered on that stream, and still gets leases there
        admin = cronoq_pb2_grpc.AdminStub(pinged.channel)
        workers = admin.ListWorkers(pb.Empty(), timeout=10).workers
        assert [(w.id, w.name) for w in workers if w.pool == "keep"] == [(worker_id, "h2")]
        tasks = cronoq_pb2_grpc.TasksStub(pinged.channel)
        spec = pb.TaskSpec(payload=b"after the pings", pool="keep")
        task = tasks.Submit(pb.SubmitRequest(task=spec), timeout=10).id
        lease = peer.read(work, pb.ServerMessage).lease
        assert (lease.task_id, lease.payload) == (task, b"after the pings")
        peer.send(work, pb.WorkerMessage(complete=pb.Complete(lease=lease.lease, output=b"ok")))
        # and the watch, idle all along, reports the end of that task
        ended = peer.read(watch, pb.StatusEvent)
        assert (ended.id, ended.status) == (task, pb.TASK_STATUS_SUCCEEDED)
        assert (peer.goaway, peer.ended, peer.eof) == (None, None, False)
    finally:
        peer.close()


def test_pings_every_second_keep_a_connection_without_calls(pinged: Serving) -> None:
    peer = H2Peer(pinged.address)
    try:
        peer.handshake()
        ping_every_second(peer)
        call = peer.open(LIST_WORKERS, pb.Empty(), end=True)  # the connection still serves
        peer.read(call, pb.ListWorkersResponse)
        assert peer.finish(call).get("grpc-status") == "0"
    finally:
        peer.close()


# --- (3) our pings drop peers that stop answering ----------------------------------------------

# the configuration's smallest values are not smaller than this (durations > 0)
EVICTING = (
    PORT0
    + "[limits]\nkeepalive_interval_s = 0.5\nkeepalive_timeout_s = 0.5\n"
    + '[[pools]]\nname = "half"\n'
)


def listed(serving: Serving) -> set[int] | None:
    """The ids of the connected workers; None if the call failed (under load, our client's
    own connection may miss a 0.5 s ping deadline too: then the next poll reconnects)."""
    try:
        answer = cronoq_pb2_grpc.AdminStub(serving.channel).ListWorkers(pb.Empty(), timeout=10)
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None
        raise
    return {w.id for w in answer.workers}


def test_peers_that_stop_acknowledging_pings_are_disconnected(tmp_path: Path) -> None:
    with serving_process(tmp_path, EVICTING) as serving, contextlib.ExitStack() as peers:
        worker = H2Peer(serving.address)
        peers.callback(worker.close)
        worker.handshake()
        work = worker.open(WORK, register("half"))
        worker_id = worker.read(work, pb.ServerMessage).registered.worker_id
        silent = H2Peer(serving.address)  # no call at all on this one
        peers.callback(silent.close)
        silent.handshake()
        eventually(lambda: worker_id in (listed(serving) or ()), "listed")

        # From here on neither peer reads its socket: the server's pings go unacknowledged.
        eventually(lambda: (ids := listed(serving)) is not None and worker_id not in ids, "gone")
        worker.drain_raw_until_closed()  # (still not acknowledging anything)
        silent.drain_raw_until_closed()
