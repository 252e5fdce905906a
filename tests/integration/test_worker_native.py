"""The Worker's native transport (docs/worker.md, "Transports") on real sockets.

Against a real `cronoq-server`: TLS with a private CA, mTLS with a worker certificate, a token
refused, and the choice of transport with its grpcio fallback. Against a scripted HTTP/2 server
(python-h2 on a thread of this process), what a real server cannot easily be made to do: the
request's gRPC headers, a stream reset or a connection closed mid-call, a message over the
receive limit, a percent-encoded status message, and a shard redirect in trailing metadata.
Cancelling a call mid-stream leaves no descriptor or thread behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest

from cronoq.client import ClientError, Lease, Worker
from cronoq.client._worker import TRANSPORT_ENV
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.config import native_built
from helpers.auth import PORT0, mtls_config, token
from helpers.servers import Server, write
from helpers.waiting import until

pytestmark = pytest.mark.skipif(not native_built(), reason="the native extension is not built")

WAIT_S = 30.0  # a safety net for a hung exchange only


async def echo(lease: Lease) -> bytes:
    return lease.payload


@contextlib.asynccontextmanager
async def running(w: Worker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(w.run())
    try:
        yield task
    finally:
        await w.stop(grace=0)
        with contextlib.suppress(ClientError):
            await task


# --- a scripted HTTP/2 server ------------------------------------------------------------------


class Peer:
    """One connection of the scripted server, driven by a script on the server's thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self.flush()
        self.buffer = b""
        self.reset: int | None = None  # the client's RST_STREAM code

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def events(self) -> list[h2.events.Event]:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        events = self.conn.receive_data(data)
        self.flush()
        for e in events:
            if isinstance(e, h2.events.DataReceived):
                self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                self.buffer += e.data
            elif isinstance(e, h2.events.StreamReset):
                self.reset = e.error_code
        self.flush()
        return events

    def request(self) -> tuple[int, dict[str, str]]:
        while True:
            for e in self.events():
                if isinstance(e, h2.events.RequestReceived):
                    return e.stream_id, dict(e.headers)

    def message(self) -> bytes:
        """The next whole gRPC message of the request."""
        while (
            len(self.buffer) < 5 or len(self.buffer) < 5 + struct.unpack(">I", self.buffer[1:5])[0]
        ):
            self.events()
        size = struct.unpack(">I", self.buffer[1:5])[0]
        body, self.buffer = self.buffer[5 : 5 + size], self.buffer[5 + size :]
        return body

    def until_reset(self) -> int:
        while self.reset is None:
            self.events()
        return self.reset

    def answer(self, stream: int, *messages: bytes, declared: int | None = None) -> None:
        """Response headers (once), then `messages` framed; `declared` overrides the length
        the last prefix announces."""
        if not getattr(self, "_answered", False):
            self.conn.send_headers(
                stream, [(":status", "200"), ("content-type", "application/grpc")]
            )
            self._answered = True
        for i, m in enumerate(messages):
            size = declared if declared is not None and i == len(messages) - 1 else len(m)
            self.conn.send_data(stream, struct.pack(">BI", 0, size) + m)
        self.flush()

    def trailers_only(self, stream: int, headers: list[tuple[str, str]]) -> None:
        base = [(":status", "200"), ("content-type", "application/grpc")]
        self.conn.send_headers(stream, base + headers, end_stream=True)
        self.flush()


def registered() -> bytes:
    return pb.ServerMessage(
        registered=pb.Registered(worker_id=7, slots=1, protocol_version=3)
    ).SerializeToString()


@contextlib.contextmanager
def scripted(script: Callable[[Peer], None]) -> Iterator[tuple[str, list[Peer]]]:
    """A server on 127.0.0.1 running `script` on each connection (one at a time); yields its
    address and the connections so far."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    peers: list[Peer] = []

    def serve() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:  # closed at the end
                return
            sock.settimeout(WAIT_S)
            with sock:
                peer = Peer(sock)
                peers.append(peer)
                with contextlib.suppress(EOFError, OSError):
                    script(peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", peers
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(WAIT_S)


# --- the call itself ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _default_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the native transport a Worker picks by default: a
    CRONOQ_WORKER_TRANSPORT of the environment (the grpcio pass of the suite) must not choose."""
    monkeypatch.delenv(TRANSPORT_ENV, raising=False)


async def test_headers_are_a_grpc_clients_and_messages_arrive_in_order() -> None:
    seen: dict[str, str] = {}

    def script(peer: Peer) -> None:
        stream, headers = peer.request()
        seen.update(headers)
        assert pb.WorkerMessage.FromString(peer.message()).HasField("register")
        lease = pb.ServerMessage(lease=pb.Lease(lease=5, task_id=9, attempt=1, payload=b"hi"))
        peer.answer(stream, registered(), lease.SerializeToString())
        outcome = pb.WorkerMessage.FromString(peer.message())
        assert (outcome.complete.lease, outcome.complete.output) == (5, b"hi")
        peer.conn.send_headers(stream, [("grpc-status", "0")], end_stream=True)
        peer.flush()
        peer.until_reset()

    with scripted(script) as (address, _):
        w = Worker(address, "p", echo, token="t" * 16, reconnect=False)
        assert w.transport == "native"
        with pytest.raises(ClientError, match="worker stream ended"):
            await w.run()
    assert seen[":method"] == "POST"
    assert seen[":path"] == "/cronoq.v1.Workers/Work"
    assert seen[":scheme"] == "http"
    assert seen[":authority"] == address
    assert seen["content-type"] == "application/grpc"
    assert seen["te"] == "trailers"
    assert seen["user-agent"].startswith("cronoq-python/")
    assert seen["authorization"] == "Bearer " + "t" * 16
    assert w.worker_id == 7


@pytest.mark.parametrize(
    ("ending", "code", "message"),
    [
        ("reset", "internal", "Received RST_STREAM with error code 2"),
        ("close", "unavailable", ""),
        ("status", "aborted", "café 100%"),
    ],
)
async def test_how_a_call_ends_mid_stream(ending: str, code: str, message: str) -> None:
    def script(peer: Peer) -> None:
        stream, _ = peer.request()
        peer.message()
        peer.answer(stream, registered())
        if ending == "reset":
            peer.conn.reset_stream(stream, error_code=2)
            peer.flush()
        elif ending == "close":
            peer.sock.shutdown(socket.SHUT_RDWR)
            return
        else:
            status = [("grpc-status", "10"), ("grpc-message", "caf%C3%A9 100%25")]
            peer.conn.send_headers(stream, status, end_stream=True)
            peer.flush()
        with contextlib.suppress(EOFError, OSError):
            while True:
                peer.events()

    with scripted(script) as (address, _):
        w = Worker(address, "p", echo, reconnect=False)
        with pytest.raises(ClientError) as e:
            await w.run()
    assert e.value.code == code
    assert message in e.value.message
    assert w.worker_id == 7  # the register was answered before the end


async def test_a_message_over_the_receive_limit_cancels_the_call() -> None:
    resets: list[int] = []

    def script(peer: Peer) -> None:
        stream, _ = peer.request()
        peer.message()
        peer.answer(stream, registered(), b"x" * 8, declared=1 << 20)
        resets.append(peer.until_reset())

    with scripted(script) as (address, _):
        w = Worker(
            address, "p", echo, reconnect=False, options=[("grpc.max_receive_message_length", 1000)]
        )
        with pytest.raises(ClientError) as e:
            await w.run()
    assert (e.value.code, e.value.message) == (
        "resource_exhausted",
        "Received message larger than max (1048576 vs. 1000)",
    )
    assert resets == [8]  # CANCEL


async def test_a_redirect_in_trailing_metadata_is_followed(tmp_path: Path) -> None:
    real = Server(write(tmp_path, PORT0 + '[[pools]]\nname = "p"\n'))
    try:
        real.wait_for("event=ready")

        def script(peer: Peer) -> None:
            stream, _ = peer.request()
            redirect = [
                ("grpc-status", "9"),
                ("grpc-message", "pool p is served by another shard"),
                ("cronoq-shard-endpoint", f"http://{real.address}"),
            ]
            peer.trailers_only(stream, redirect)
            with contextlib.suppress(EOFError, OSError):
                while True:
                    peer.events()

        with scripted(script) as (address, peers):
            w = Worker(address, "p", echo)
            async with running(w):
                await w.wait_registered(WAIT_S)
            assert (len(peers), w.connections) == (1, 2)
    finally:
        real.kill()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_cancelling_mid_call_leaves_no_descriptor_or_thread() -> None:
    def script(peer: Peer) -> None:
        stream, _ = peer.request()
        peer.message()
        peer.answer(stream, registered())
        peer.until_reset()

    with scripted(script) as (address, peers):
        gc.collect()  # (earlier tests' garbage is not this one's)
        fds, threads = _fds(), _threads()
        w = Worker(address, "p", echo)
        task = asyncio.create_task(w.run())
        await w.wait_registered(WAIT_S)
        assert _threads() == threads + 1  # the call's own
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _threads() == threads
        await until(lambda: peers[0].reset is not None, WAIT_S, "the client's RST_STREAM")
        assert peers[0].reset == 8  # CANCEL
        # (the server's end of the connection, in this process too, closes after the reset)
        await until(lambda: peers[0].sock.fileno() == -1, WAIT_S, "the server's socket closed")
        gc.collect()
        assert _fds() == fds


# --- against a real server ---------------------------------------------------------------------


@pytest.mark.parametrize("server_transport", ["native", "grpcio"])
async def test_tls_and_mtls_against_a_real_server(
    pki: Path, tmp_path: Path, server_transport: str
) -> None:
    config = mtls_config(pki, transport=server_transport)
    real = Server(write(tmp_path, config))
    try:
        real.wait_for("event=ready")
        port = real.address.rsplit(":", 1)[1]
        ca = (pki / "ca.pem").read_bytes()
        robot = {
            "private_key": (pki / "robot.key").read_bytes(),
            "certificate_chain": (pki / "robot.pem").read_bytes(),
        }
        w = Worker(f"localhost:{port}", "a", echo, root_certificates=ca, **robot)
        assert w.transport == "native"
        async with running(w):
            await w.wait_registered(WAIT_S)
        # the server requires a client certificate: without one, the handshake fails
        bare = Worker(f"localhost:{port}", "a", echo, root_certificates=ca, reconnect=False)
        with pytest.raises(ClientError) as e:
            await bare.run()
        assert e.value.code == "unavailable"
        # a CA that did not sign the server's certificate: refused
        other = Worker(
            f"localhost:{port}", "a", echo, root_certificates=robot["certificate_chain"],
            private_key=robot["private_key"], certificate_chain=robot["certificate_chain"],
            reconnect=False,
        )  # fmt: skip
        with pytest.raises(ClientError, match="unavailable"):
            await other.run()
    finally:
        real.kill()


async def test_a_refused_token_ends_run(tmp_path: Path) -> None:
    config = (
        PORT0
        + '[[pools]]\nname = "p"\n'
        + (f'[[auth.tokens]]\ntoken = "{token("worker")}"\nrole = "worker"\n')
    )
    real = Server(write(tmp_path, config))
    try:
        real.wait_for("event=ready")
        w = Worker(real.address, "p", echo, token="wrong-token-0123456789abcdef")
        with pytest.raises(ClientError) as e:
            await w.run()
        assert e.value.code == "unauthenticated"
        good = Worker(real.address, "p", echo, token=token("worker"))
        async with running(good):
            await good.wait_registered(WAIT_S)
    finally:
        real.kill()


# --- choosing ----------------------------------------------------------------------------------


def test_the_transport_is_chosen_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import grpc

    monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    assert Worker("h:1", "p", echo).transport == "native"
    assert Worker("https://h:1/", "p", echo).transport == "native"
    assert Worker("[::1]:1", "p", echo).transport == "native"
    assert Worker("h:1", "p", echo, transport="grpcio").transport == "grpcio"
    creds = grpc.ssl_channel_credentials()
    # what native cannot do falls back under auto, and is refused when native is asked for
    for kw in (
        {"credentials": creds},
        {"options": [("grpc.enable_retries", 0)]},
    ):
        assert Worker("h:1", "p", echo, **kw).transport == "grpcio"  # type: ignore[arg-type]
        with pytest.raises(ValueError, match='transport "native"'):
            Worker("h:1", "p", echo, transport="native", **kw)  # type: ignore[arg-type]
    assert Worker("dns:///h:1", "p", echo).transport == "grpcio"
    assert Worker("unix:/tmp/s", "p", echo).transport == "grpcio"
    monkeypatch.setenv(TRANSPORT_ENV, "grpcio")
    assert Worker("h:1", "p", echo).transport == "grpcio"
    assert Worker("h:1", "p", echo, transport="native").transport == "native"
    monkeypatch.setenv(TRANSPORT_ENV, "h3")
    with pytest.raises(ValueError, match=f"{TRANSPORT_ENV} must be one of"):
        Worker("h:1", "p", echo)
    with pytest.raises(ValueError, match="not both"):
        Worker("h:1", "p", echo, credentials=creds, root_certificates=b"x")


async def test_grpcio_forced_serves_with_the_same_certificates(pki: Path, tmp_path: Path) -> None:
    real = Server(write(tmp_path, mtls_config(pki, transport="native")))
    try:
        real.wait_for("event=ready")
        port = real.address.rsplit(":", 1)[1]
        w = Worker(
            f"localhost:{port}", "a", echo, transport="grpcio",
            root_certificates=(pki / "ca.pem").read_bytes(),
            private_key=(pki / "robot.key").read_bytes(),
            certificate_chain=(pki / "robot.pem").read_bytes(),
        )  # fmt: skip
        assert w.transport == "grpcio"
        async with running(w):
            await w.wait_registered(WAIT_S)
    finally:
        real.kill()
