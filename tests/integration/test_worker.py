"""The remote `cronoq.client.Worker` over real sockets (docs/worker.md).

Two kinds of peers. The real `cronoq-server` as a subprocess (one per module, plus one that is
restarted on a fixed port) shows that the worker and our server agree end to end; tasks are
submitted there through the raw generated stubs. A scripted fake `Workers` servicer on a
loopback port (a real grpc.aio server) produces what the real server cannot easily be made to
send: v1 registrations, shutdowns, redirects, refusals, exact timings, and it records every
message the worker sends with its arrival time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import shutil
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

import cronoq
from cronoq.client import (
    MAX_REDIRECTS,
    PROTOCOL_VERSION,
    CancelTask,
    ClientError,
    Lease,
    Reject,
    Worker,
)
from cronoq.client._worker import WorkerState
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.ports import free_port
from helpers.servers import PORT0, Server, Serving, serving_process, write

Code = grpc.StatusCode
FAST = (0.05, 0.2)  # backoff for tests: reconnects are quick, and a grown delay stays short
ENDPOINT = "cronoq-shard-endpoint"


# --- the fake Workers servicer ---------------------------------------------------------------


class Conn:
    """One Work stream as the fake server sees it: the worker's messages with their arrival
    times (read by a background task), and a way to answer."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.loop = asyncio.get_running_loop()
        self.at = self.loop.time()
        self.metadata = {m.key: m.value for m in context.invocation_metadata()}
        self.received: list[tuple[float, pb.WorkerMessage]] = []
        self.inbox: asyncio.Queue[pb.WorkerMessage] = asyncio.Queue()
        self.eof = asyncio.Event()  # the worker half-closed its side
        self.writing = asyncio.Lock()  # the script and the test both write: one at a time
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            msg = await self.context.read()
            if msg is grpc.aio.EOF:
                self.eof.set()
                return
            self.received.append((self.loop.time(), msg))
            self.inbox.put_nowait(msg)

    async def recv(self, kind: str | None = None, timeout: float = 3.0) -> pb.WorkerMessage:
        msg = await asyncio.wait_for(self.inbox.get(), timeout)
        if kind is not None:
            assert msg.WhichOneof("msg") == kind, msg
        return msg

    async def send(self, **fields: Any) -> None:
        async with self.writing:
            await self.context.write(pb.ServerMessage(**fields))

    async def register(self, **fields: Any) -> pb.Register:
        """Read the register and answer it; `fields` override a v3 server's defaults."""
        reg = (await self.recv("register")).register
        values = {
            "worker_id": 7,
            "slots": reg.slots,
            "protocol_version": 3,
            "max_message_bytes": 4 << 20,
            **fields,
        }
        await self.send(registered=pb.Registered(**values))
        return reg

    async def lease(self, lease: int, payload: bytes = b"", **fields: Any) -> None:
        await self.send(lease=pb.Lease(lease=lease, task_id=100 + lease, attempt=1,
                                       payload=payload, pool="p", **fields))  # fmt: skip

    async def redirect(self, endpoint: str, *, initial: str | None = None) -> None:
        """Refuse the register as a server whose pool lives on another shard."""
        await self.recv("register")
        if initial is not None:
            await self.context.send_initial_metadata(((ENDPOINT, initial),))
        self.context.set_trailing_metadata(((ENDPOINT, endpoint), ("cronoq-shard", "other")))
        await self.context.abort(Code.FAILED_PRECONDITION, "pool p is served by shard other")

    def kinds(self) -> list[str]:
        return [str(m.WhichOneof("msg")) for _, m in self.received]

    def outcomes(self) -> dict[int, pb.WorkerMessage]:
        """The last report about each lease, by lease id (heartbeats and set_slots left out)."""
        found = {}
        for _, m in self.received:
            kind = m.WhichOneof("msg")
            if kind in ("complete", "fail", "nack", "cancelled"):
                found[getattr(m, kind).lease] = m
        return found


Script = Callable[[Conn], Awaitable[None]]


class Fake(cronoq_pb2_grpc.WorkersServicer):
    """Runs `script` for every stream; the stream ends OK when the script returns."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.conns: list[Conn] = []
        self.connected: asyncio.Queue[Conn] = asyncio.Queue()
        self.address = ""
        self.port = 0

    async def Work(self, request_iterator: Any, context: Any) -> None:
        conn = Conn(context)
        self.conns.append(conn)
        self.connected.put_nowait(conn)
        try:
            await self.script(conn)
        finally:
            conn.reader.cancel()

    async def next(self, timeout: float = 3.0) -> Conn:
        return await asyncio.wait_for(self.connected.get(), timeout)


async def hold(conn: Conn, **registered: Any) -> None:
    """Register the worker, then keep the stream until the worker half-closes it."""
    await conn.register(**registered)
    await conn.eof.wait()


async def silent(conn: Conn) -> None:
    """Read the register and never answer it."""
    await conn.recv("register")
    await conn.eof.wait()


@contextlib.asynccontextmanager
async def fake(
    script: Script = hold, *, port: int = 0, creds: grpc.ServerCredentials | None = None
) -> AsyncIterator[Fake]:
    servicer = Fake(script)
    server = grpc.aio.server()
    cronoq_pb2_grpc.add_WorkersServicer_to_server(servicer, server)
    address = f"127.0.0.1:{port}"
    if creds is None:
        servicer.port = server.add_insecure_port(address)
    else:
        servicer.port = server.add_secure_port(address, creds)
    servicer.address = f"127.0.0.1:{servicer.port}"
    await server.start()
    try:
        yield servicer
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """`worker.run()` as a task; stopped (and its outcome collected) at the end."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        if not task.done():
            await worker.stop(0.5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 6)


async def echo(lease: Lease) -> bytes:
    return lease.payload


class Gate:
    """A handler that blocks until released, recording its leases and how each one ended."""

    def __init__(self, result: Any = "done") -> None:
        self.leases: list[Lease] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled: list[int] = []
        self.result = result

    async def __call__(self, lease: Lease) -> Any:
        self.leases.append(lease)
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(lease.id)
            raise
        return self.result


async def until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def lease_of(msg: pb.WorkerMessage) -> int:
    return int(getattr(msg, str(msg.WhichOneof("msg"))).lease)


# --- construction, register, registered ------------------------------------------------------


def test_slots_must_be_positive_and_labels_become_strings() -> None:
    with pytest.raises(ValueError, match="slots must be >= 1"):
        Worker("h:1", "p", echo, slots=0)
    w = Worker("h:1", "p", echo, labels={"gpu": 1, 2: True})  # type: ignore[dict-item]
    assert w.labels == {"gpu": "1", "2": "True"}
    assert Worker("h:1", "p", echo).labels == {}
    assert (w.slots, w.grace, w.backoff, w.reconnect, w.name) == (1, 10.0, (0.1, 5.0), True, "")
    assert (w.worker_id, w.granted_slots, w.connections, w.running) == (None, None, 0, 0)
    assert (PROTOCOL_VERSION, MAX_REDIRECTS) == (3, 3)


async def test_register_comes_first_with_the_token_and_again_after_a_reconnect() -> None:
    async def once(conn: Conn) -> None:  # registered, then the server ends the stream
        await conn.register()

    async with fake(once) as f:
        w = Worker(f.address, "p", echo, slots=3, token="t" * 16, name="w1",
                   labels={"gpu": 1}, backoff=FAST)  # fmt: skip
        async with running(w):
            first, second = await f.next(), await f.next()
            third = await f.next()
        for conn in (first, second, third):
            assert conn.metadata["authorization"] == "Bearer " + "t" * 16
            reg = conn.received[0][1].register
            assert (reg.pool, reg.slots, reg.worker_name, reg.protocol_version) == ("p", 3, "w1", 3)
            assert dict(reg.labels) == {"gpu": "1"}
        assert w.labels == {"gpu": "1"}
        assert w.connections >= 3


async def test_registered_without_fields_reads_as_a_v1_server() -> None:
    """An empty registered reads as a protocol-1 server (docs/worker.md, "Attributes"); for it
    a Reject goes as a retryable fail, CancelTask as a permanent one (docs/worker.md,
    "Exceptions")."""
    gate = Gate()

    async def handler(lease: Lease) -> Any:
        if lease.payload == b"reject":
            raise Reject("busy here")
        if lease.payload == b"cancel":
            raise CancelTask("stop it")
        if lease.payload == b"cancel0":
            raise CancelTask()
        return await gate(lease)

    async def v1(conn: Conn) -> None:
        await conn.recv("register")
        await conn.send(registered=pb.Registered())
        await conn.eof.wait()

    async with fake(v1) as f:
        w = Worker(f.address, "p", handler, slots=2)
        async with running(w):
            await w.wait_registered(3)
            assert (w.granted_slots, w.server_protocol) == (2, 1)
            assert (w.max_message_bytes, w.lease_ttl, w.worker_id) == (None, None, 0)
            conn = f.conns[0]
            for i, payload in enumerate([b"reject", b"cancel", b"cancel0"], 1):
                await conn.lease(i, payload)  # one at a time: 2 slots hold only two at once
                await conn.recv()
            for i in (4, 5, 6):  # two fill the slots, the third finds none
                await conn.lease(i)
            await conn.recv()
            out = conn.outcomes()
            assert out[1].fail == pb.Fail(lease=1, message="busy here", permanent=False)
            assert out[2].fail == pb.Fail(lease=2, message="stop it", permanent=True)
            fallback = "cancelled by the handler"
            assert out[3].fail == pb.Fail(lease=3, message=fallback, permanent=True)
            assert out[6].fail == pb.Fail(lease=6, message="worker has no free slot")
            assert len(gate.leases) == 2 and w.running == 2
            gate.release.set()
            assert {lease_of(await conn.recv()), lease_of(await conn.recv())} == {4, 5}


async def test_a_lease_beyond_the_grant_is_nacked_and_not_run() -> None:
    gate = Gate()
    async with fake(lambda conn: hold(conn, slots=2)) as f:
        w = Worker(f.address, "p", gate, slots=4)
        async with running(w):
            await w.wait_registered(3)
            assert (w.granted_slots, w.server_protocol, w.worker_id) == (2, 3, 7)
            conn = f.conns[0]
            for i in (1, 2, 3):
                await conn.lease(i)
            nack = (await conn.recv("nack")).nack
            assert (nack.lease, nack.reason) == (3, "worker has no free slot")
            assert [lease.id for lease in gate.leases] == [1, 2] and w.running == 2
            gate.release.set()
            done = [await conn.recv("complete"), await conn.recv("complete")]
            assert sorted(m.complete.lease for m in done) == [1, 2]
            assert done[0].complete.output == b"done"
            assert w.running == 0


async def test_a_grant_above_the_request_is_honoured() -> None:
    gate = Gate()
    async with fake(lambda conn: hold(conn, slots=3)) as f:
        w = Worker(f.address, "p", gate, slots=1)
        async with running(w):
            await w.wait_registered(3)
            conn = f.conns[0]
            for i in (1, 2, 3, 4):
                await conn.lease(i)
            assert lease_of(await conn.recv("nack")) == 4
            assert w.running == 3
            gate.release.set()


# --- outcomes --------------------------------------------------------------------------------


class RejectAndPermanent(cronoq.Permanent, Reject):
    """Inherits two outcomes: Reject has precedence, whatever the base order."""


async def _raise(e: BaseException) -> Any:
    raise e


async def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


OUTCOMES: dict[bytes, Callable[[], Awaitable[Any]]] = {
    b"json": lambda: asyncio.sleep(0, {"a": 1}),
    b"none": lambda: asyncio.sleep(0, None),
    b"bytes": lambda: asyncio.sleep(0, b"x"),
    b"str": lambda: asyncio.sleep(0, "hé"),
    b"list": lambda: asyncio.sleep(0, [1, True, None]),
    b"fits": lambda: asyncio.sleep(0, b"y" * 1024),
    b"big": lambda: asyncio.sleep(0, b"y" * 1025),
    b"object": lambda: asyncio.sleep(0, object()),
    b"circular": _circular,
    b"retry": lambda: _raise(cronoq.Retryable("slow", retry_after=2)),
    b"retry_zero": lambda: _raise(cronoq.Retryable("now", retry_after=0)),
    b"retry0": lambda: _raise(cronoq.Retryable()),
    b"perm": lambda: _raise(cronoq.Permanent("bad")),
    b"perm0": lambda: _raise(cronoq.Permanent()),
    b"reject": lambda: _raise(Reject("no gpu")),
    b"reject0": lambda: _raise(Reject()),
    b"both": lambda: _raise(RejectAndPermanent("either")),
    b"cancel": lambda: _raise(CancelTask("x")),
    b"boom": lambda: _raise(ValueError("boom")),
    b"client": lambda: _raise(ClientError("not_found", "gone")),
    b"selfcancel": lambda: _raise(asyncio.CancelledError()),
}


async def test_outcomes_follow_the_table() -> None:
    """One lease per row of docs/worker.md, "Return values" and "Exceptions", with
    max_message_bytes=2048."""

    async def handler(lease: Lease) -> Any:
        return await OUTCOMES[lease.payload]()

    async with fake(lambda conn: hold(conn, max_message_bytes=2048)) as f:
        w = Worker(f.address, "p", handler, slots=len(OUTCOMES))
        async with running(w):
            await w.wait_registered(3)
            assert w.max_message_bytes == 2048
            conn = f.conns[0]
            ids = {payload: i for i, payload in enumerate(OUTCOMES, 1)}
            for payload, i in ids.items():
                await conn.lease(i, payload)
            for _ in ids:
                await conn.recv()
            out = {payload: conn.outcomes()[i] for payload, i in ids.items()}
            assert w.running == 0

    def complete(payload: bytes) -> tuple[bytes, str]:
        c = out[payload].complete
        return c.output, c.content_type

    def fail(payload: bytes) -> tuple[str, bool, float | None]:
        f = out[payload].fail
        return f.message, f.permanent, f.retry_after_s if f.HasField("retry_after_s") else None

    assert complete(b"json") == (b'{"a": 1}', "application/json")
    assert complete(b"none") == (b"", "")
    assert complete(b"bytes") == (b"x", "application/octet-stream")
    assert complete(b"str") == ("hé".encode(), "text/plain; charset=utf-8")
    assert complete(b"list") == (b"[1, true, null]", "application/json")
    assert complete(b"fits") == (b"y" * 1024, "application/octet-stream")
    message, permanent, _ = fail(b"big")
    assert permanent and "1025 bytes" in message and "message limit of 2048 bytes" in message
    for payload in (b"object", b"circular"):
        message, permanent, _ = fail(payload)
        assert permanent and message.startswith("handler output is not JSON-serialisable: ")
    assert fail(b"retry") == ("slow", False, 2.0)
    assert fail(b"retry_zero") == ("now", False, 0.0)
    assert fail(b"retry0") == ("retryable failure", False, None)
    assert fail(b"perm") == ("bad", True, None)
    assert fail(b"perm0") == ("permanent failure", True, None)
    assert out[b"reject"].nack.reason == "no gpu"
    assert out[b"reject0"].nack.reason == "rejected by the handler"
    assert out[b"both"].nack.reason == "either"
    assert out[b"cancel"].WhichOneof("msg") == "cancelled"
    assert fail(b"boom") == ("ValueError: boom", False, None)
    assert fail(b"client") == ("ClientError: not_found: gone", False, None)
    assert fail(b"selfcancel") == ("CancelledError: raised by the handler", False, None)


# --- heartbeats, abort, shutdown -------------------------------------------------------------


async def test_heartbeats_every_third_of_the_ttl_and_none_without_one() -> None:
    async def handler(lease: Lease) -> None:
        await asyncio.sleep(float(lease.text()))

    async with fake() as f:
        w = Worker(f.address, "p", handler, slots=2)
        async with running(w):
            await w.wait_registered(3)
            conn = f.conns[0]
            await conn.lease(2, b"0.4")  # no TTL anywhere: no heartbeat
            sent = asyncio.get_running_loop().time()
            await conn.lease(1, b"1.0", lease_ttl_s=0.3)
            await until(lambda: len(conn.outcomes()) == 2)
    beats = [t - sent for t, m in conn.received if m.WhichOneof("msg") == "heartbeat"]
    assert all(m.heartbeat.lease == 1 for _, m in conn.received if m.HasField("heartbeat"))
    assert 7 <= len(beats) <= 10, beats
    assert beats[0] >= 0.09, beats
    assert all(0.05 < b - a < 0.2 for a, b in itertools.pairwise(beats)), beats


async def test_an_abort_frees_the_slot_at_once_and_sends_nothing() -> None:
    gate = Gate()
    async with fake() as f:
        w = Worker(f.address, "p", gate)
        async with running(w):
            await w.wait_registered(3)
            conn = f.conns[0]
            await conn.lease(1)
            await asyncio.wait_for(gate.started.wait(), 3)
            await conn.send(abort=pb.Abort(lease=99, reason="unknown"))  # ignored
            await conn.send(abort=pb.Abort(lease=1, reason="cancelled"))
            lease = gate.leases[0]
            await asyncio.wait_for(lease.cancelled.wait(), 3)
            assert w.running == 0
            await asyncio.sleep(0.05)
            assert gate.cancelled == [1]
            gate.release.set()
            await conn.lease(2)  # the freed slot takes the next lease
            assert lease_of(await conn.recv("complete")) == 2
            assert set(conn.outcomes()) == {2}


async def test_shutdown_abandons_leases_and_reconnects_after_the_backoff() -> None:
    gate = Gate()

    async def bye(conn: Conn) -> None:
        await conn.register()
        if len(f.conns) == 1:
            await conn.lease(1)
            await asyncio.wait_for(gate.started.wait(), 3)
            await conn.send(shutdown=pb.Shutdown(reason="bye"))
        else:
            await conn.send(shutdown=pb.Shutdown())
        await conn.eof.wait()

    async with fake(bye) as f:
        w = Worker(f.address, "p", gate, backoff=(0.2, 1.0))
        async with running(w):
            first, second = await f.next(), await f.next()
            assert gate.leases[0].cancelled.is_set() and gate.cancelled == [1]
            assert w.running == 0
            assert second.at - first.at >= 0.2
            assert first.outcomes() == {}
            await f.next()
            assert w.last_shutdown == "shutdown"


async def test_not_leader_resets_the_grown_backoff() -> None:
    async def script(conn: Conn) -> None:
        n = len(f.conns)
        if n <= 4:
            await conn.context.abort(Code.UNAVAILABLE, "standby")
        await conn.register()
        if n == 5:
            await conn.send(shutdown=pb.Shutdown(reason="lost", not_leader=True))
        await conn.eof.wait()

    async with fake(script) as f:
        w = Worker(f.address, "p", echo, backoff=(0.05, 2.0))
        async with running(w):
            conns = [await f.next() for _ in range(6)]
    gaps = [b.at - a.at for a, b in itertools.pairwise(conns)]
    assert gaps[3] >= 0.35, gaps  # 0.05, 0.1, 0.2, 0.4: the delay has grown
    assert gaps[4] < 0.3, gaps  # after not_leader: no grown delay
    assert w.last_shutdown == "lost"


async def test_not_leader_reconnects_without_a_backoff_wait() -> None:
    """A leadership change reconnects right away: with an hour of backoff, the second
    connection could only come without a wait."""

    async def script(conn: Conn) -> None:
        await conn.register()
        if len(f.conns) == 1:
            await conn.send(shutdown=pb.Shutdown(reason="moved", not_leader=True))
        await conn.eof.wait()

    async with fake(script) as f:
        w = Worker(f.address, "p", echo, backoff=(3600.0, 3600.0))
        async with running(w):
            await f.next()
            await f.next()
            await w.wait_registered(5)
            assert (w.connections, w.last_shutdown) == (2, "moved")


async def test_backoff_doubles_up_to_its_maximum() -> None:
    async def unavailable(conn: Conn) -> None:
        # after the register, as a server does: a bidi call ended before the client's first
        # message is read may reach grpcio's client as INTERNAL "Internal error from Core"
        await conn.recv("register")
        await conn.context.abort(Code.UNAVAILABLE, "down")

    async with fake(unavailable) as f:
        w = Worker(f.address, "p", echo, backoff=(0.1, 0.4))
        async with running(w):
            conns = [await f.next() for _ in range(5)]
    gaps = [b.at - a.at for a, b in itertools.pairwise(conns)]
    for gap, want in zip(gaps, (0.1, 0.2, 0.4, 0.4), strict=True):
        assert want - 0.02 <= gap <= want + 0.15, gaps
    assert w.connections >= 5


# --- fatal errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        Code.UNAUTHENTICATED,
        Code.PERMISSION_DENIED,
        Code.NOT_FOUND,
        Code.INVALID_ARGUMENT,
        Code.UNIMPLEMENTED,
        Code.FAILED_PRECONDITION,
    ],
)
async def test_fatal_codes_end_run_after_one_connection(code: Code) -> None:
    async def refuse(conn: Conn) -> None:
        await conn.recv("register")
        await conn.context.abort(code, "no")

    async with fake(refuse) as f:
        w = Worker(f.address, "p", echo, backoff=FAST)
        with pytest.raises(ClientError) as e:
            await w.run()
    assert (e.value.code, e.value.message, w.connections) == (code.name.lower(), "no", 1)


async def test_without_reconnect_any_end_is_an_error() -> None:
    async def once(conn: Conn) -> None:
        await conn.register()

    async with fake(once) as f:
        w = Worker(f.address, "p", echo, reconnect=False)
        with pytest.raises(ClientError) as e:
            await w.run()
        assert (e.value.code, e.value.message) == ("unavailable", "worker stream ended")

    async def unavailable(conn: Conn) -> None:
        # after the register, as a server does: a bidi call ended before the client's first
        # message is read may reach grpcio's client as INTERNAL "Internal error from Core"
        await conn.recv("register")
        await conn.context.abort(Code.UNAVAILABLE, "down")

    async with fake(unavailable) as f:
        w = Worker(f.address, "p", echo, reconnect=False)
        with pytest.raises(ClientError, match="unavailable: down"):
            await w.run()
        assert w.connections == 1


# --- shard redirects -------------------------------------------------------------------------


async def test_a_redirect_is_followed_at_once_with_the_same_token() -> None:
    async with fake() as shard, fake() as other:

        async def send_away(conn: Conn) -> None:
            await conn.redirect(f"http://{shard.address}")

        async with fake(send_away) as home:
            w = Worker(home.address, "p", echo, token="s" * 16, backoff=(5.0, 5.0))
            async with running(w):
                await w.wait_registered(3)  # a backoff wait would exceed the test's time
            assert shard.conns[0].metadata["authorization"] == "Bearer " + "s" * 16
            assert (len(home.conns), w.connections) == (1, 2)

        async def both(conn: Conn) -> None:  # initial metadata wins over the trailer
            await conn.redirect(f"http://{other.address}", initial=f"http://{shard.address}/")

        async with fake(both) as home:
            w = Worker(home.address, "p", echo, backoff=(5.0, 5.0))
            async with running(w):
                await w.wait_registered(3)
            assert (len(shard.conns), len(other.conns)) == (2, 0)


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("grpc://127.0.0.1:1", "not an http(s) endpoint"),
        ("127.0.0.1:1", "not an http(s) endpoint"),
        ("http://u:p@127.0.0.1:1", "not a plain host and port"),
        ("http://127.0.0.1:port", "not a plain host and port"),
        ("http://", "not a plain host and port"),
    ],
)
async def test_redirects_to_odd_endpoints_are_refused(endpoint: str, why: str) -> None:
    async def send_away(conn: Conn) -> None:
        await conn.redirect(endpoint)

    async with fake(send_away) as home:
        w = Worker(home.address, "p", echo, backoff=FAST)
        with pytest.raises(ClientError, match=re.escape(why)) as e:
            await w.run()
    assert (e.value.code, w.connections) == ("failed_precondition", 1)
    assert "pool p is served by shard other" in e.value.message


async def test_a_token_goes_over_plain_http_only_to_loopback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fake() as shard:
        remote = f"http://0.0.0.0:{shard.port}"  # reaches this host, but is not loopback

        async def send_away(conn: Conn) -> None:
            await conn.redirect(remote)

        async with fake(send_away) as home:
            w = Worker(home.address, "p", echo, token="s" * 16, backoff=FAST)
            with pytest.raises(ClientError, match="plaintext") as e:
                await w.run()
            assert (e.value.code, len(shard.conns)) == ("failed_precondition", 0)

            w = Worker(home.address, "p", echo, backoff=FAST)  # no token: nothing to leak
            async with running(w):
                await w.wait_registered(3)
            assert "authorization" not in shard.conns[0].metadata

            w = Worker(home.address, "p", echo, token="s" * 16, insecure_redirect_http=True)
            with caplog.at_level(logging.WARNING, "cronoq.client"):
                async with running(w):
                    await w.wait_registered(3)
            assert shard.conns[1].metadata["authorization"] == "Bearer " + "s" * 16
            assert "plaintext" in caplog.text


async def test_at_most_three_redirects_in_a_row() -> None:
    async def loop_back(conn: Conn) -> None:
        await conn.redirect(f"http://localhost:{home.port}")

    async with fake(loop_back) as home:
        w = Worker(home.address, "p", echo, token="s" * 16, backoff=(5.0, 5.0))
        with pytest.raises(ClientError, match="4 shard redirects in a row") as e:
            await w.run()
    assert e.value.code == "failed_precondition"
    assert len(home.conns) == w.connections == 1 + MAX_REDIRECTS


async def test_an_unavailable_shard_sends_the_worker_back_to_its_target() -> None:
    async def down(conn: Conn) -> None:
        await conn.recv("register")
        await conn.context.abort(Code.UNAVAILABLE, "shard down")

    async with fake(down) as shard:

        async def script(conn: Conn) -> None:
            if len(home.conns) == 1:
                await conn.redirect(f"http://{shard.address}")
            await hold(conn)

        async with fake(script) as home:
            w = Worker(home.address, "p", echo, backoff=FAST)
            async with running(w):
                await w.wait_registered(3)
            assert (len(home.conns), len(shard.conns), w.connections) == (2, 1, 3)
            assert home.conns[1].at - shard.conns[0].at >= FAST[0]


# --- TLS: mTLS, https -> http, server-name options -------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A CA; server certificates for the name x.test and for 127.0.0.1; a client one."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    d = tmp_path_factory.mktemp("pki")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]

    def make(name: str, san: str | None) -> None:
        command = ["openssl", "req", "-x509", *key, "-subj", f"/CN={name}"]
        if san is None:
            command += ["-addext", "basicConstraints=critical,CA:TRUE"]
        else:
            command += ["-addext", f"subjectAltName={san}"]
            command += ["-addext", "basicConstraints=critical,CA:FALSE"]  # a leaf (for rustls)
            command += ["-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key")]
        command += ["-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.pem")]
        subprocess.run(command, check=True, capture_output=True)

    make("ca", None)
    make("named", "DNS:x.test")
    make("ip", "IP:127.0.0.1")
    make("robot", "DNS:robot.example")
    yield d


def server_creds(pki: Path, name: str, *, client_auth: bool = False) -> grpc.ServerCredentials:
    pair = ((pki / f"{name}.key").read_bytes(), (pki / f"{name}.pem").read_bytes())
    return grpc.ssl_server_credentials(
        [pair], root_certificates=(pki / "ca.pem").read_bytes(), require_client_auth=client_auth
    )


async def test_mutual_tls_with_credentials(pki: Path) -> None:
    async with fake(creds=server_creds(pki, "ip", client_auth=True)) as f:
        creds = grpc.ssl_channel_credentials(
            (pki / "ca.pem").read_bytes(),
            (pki / "robot.key").read_bytes(),
            (pki / "robot.pem").read_bytes(),
        )
        w = Worker(f.address, "p", echo, credentials=creds)
        async with running(w):
            await w.wait_registered(3)
            auth = f.conns[0].context.auth_context()
            assert auth["x509_common_name"] == [b"robot"]


async def test_tls_is_never_left_for_plain_http(pki: Path) -> None:
    async with fake() as plain, fake(creds=server_creds(pki, "ip")) as shard:

        async def to_plain(conn: Conn) -> None:
            await conn.redirect(f"http://{plain.address}")

        async def to_tls(conn: Conn) -> None:
            await conn.redirect(f"https://{shard.address}")

        ca = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        async with fake(to_plain, creds=server_creds(pki, "ip")) as home:
            w = Worker(f"https://{home.address}", "p", echo, credentials=ca)
            with pytest.raises(ClientError, match="plaintext") as e:
                await w.run()
            assert (e.value.code, len(plain.conns)) == ("failed_precondition", 0)

        # https -> https is followed; from there, plain http is refused
        async with fake(to_tls, creds=server_creds(pki, "ip")) as home:
            shard.script = to_plain
            w = Worker(home.address, "p", echo, credentials=ca, backoff=FAST)
            with pytest.raises(ClientError, match="plaintext"):
                await w.run()
            assert (len(home.conns), len(shard.conns), len(plain.conns)) == (1, 1, 0)
            assert w.connections == 2


@pytest.mark.parametrize("option", ["grpc.ssl_target_name_override", "grpc.default_authority"])
async def test_server_name_options_are_dropped_for_a_redirect_target(
    pki: Path, option: str
) -> None:
    """The configured server is reached as x.test; the shard's certificate names 127.0.0.1,
    which only verifies when the x.test override is left out for the shard."""
    async with fake(creds=server_creds(pki, "ip")) as shard:

        async def send_away(conn: Conn) -> None:
            await conn.redirect(f"https://{shard.address}")

        async with fake(send_away, creds=server_creds(pki, "named")) as home:
            ca = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
            w = Worker(home.address, "p", echo, credentials=ca, options=[(option, "x.test")],
                       backoff=(5.0, 5.0))  # fmt: skip
            async with running(w):
                await w.wait_registered(3)
            assert (len(home.conns), len(shard.conns)) == (1, 1)


# --- stop() ----------------------------------------------------------------------------------


async def test_stop_lets_a_running_handler_finish_then_half_closes() -> None:
    async def handler(lease: Lease) -> str:
        await asyncio.sleep(0.2)
        return "finished"

    async with fake() as f:
        w = Worker(f.address, "p", handler)
        run = asyncio.create_task(w.run())
        await w.wait_registered(3)
        conn = f.conns[0]
        await conn.lease(1)
        await asyncio.sleep(0.05)
        await w.stop()
        assert await asyncio.wait_for(run, 3) is None
        assert conn.eof.is_set()
    assert conn.kinds() == ["register", "set_slots", "complete"]
    assert conn.received[1][1].set_slots.slots == 0
    assert conn.received[2][1].complete.output == b"finished"


async def test_stop_cancels_what_outlives_the_grace() -> None:
    gate = Gate()
    async with fake() as f:
        w = Worker(f.address, "p", gate)
        run = asyncio.create_task(w.run())
        await w.wait_registered(3)
        conn = f.conns[0]
        await conn.lease(1)
        await asyncio.wait_for(gate.started.wait(), 3)
        t0 = time.monotonic()
        await w.stop(grace=0.2)
        assert time.monotonic() - t0 >= 0.2 - 0.02  # it waited the grace out first
        assert gate.leases[0].cancelled.is_set()
        await asyncio.wait_for(run, 3)
        assert gate.cancelled == [1] and w.running == 0
    assert conn.kinds() == ["register", "set_slots"]


async def test_a_lease_during_stop_is_handed_back_and_stops_are_one() -> None:
    """... and begin_stop() is stop() begun at once, not on the loop's next turn as a task
    would be (the worker command says "draining" right after it)."""
    gate = Gate()
    nacked = asyncio.Event()

    async def script(conn: Conn) -> None:
        await conn.register()
        await conn.lease(1)
        await conn.recv("set_slots")
        await conn.lease(2)
        assert (await conn.recv("nack")).nack == pb.Nack(lease=2, reason="worker is stopping")
        nacked.set()
        await conn.eof.wait()

    async with fake(script) as f:
        w = Worker(f.address, "p", gate, grace=10)
        run = asyncio.create_task(w.run())
        await w.wait_registered(3)
        await asyncio.wait_for(gate.started.wait(), 3)
        shutdown = w.begin_stop()  # the set_slots{0} is queued: the script's lease 2 follows
        assert w.begin_stop() is shutdown and not shutdown.done()
        assert w._ls is not None and w._ls.life.state is WorkerState.DRAINING  # no turn later
        first = asyncio.create_task(w.stop())
        second = asyncio.create_task(w.stop(grace=0))  # a later grace is ignored
        await asyncio.wait_for(nacked.wait(), 3)
        assert not first.done() and not second.done()
        gate.release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 3)
        await w.stop()  # done already: returns at once
        assert shutdown.done() and [lease.id for lease in gate.leases] == [1]
        await asyncio.wait_for(run, 3)
    assert f.conns[0].kinds() == ["register", "set_slots", "nack", "complete"]
    assert gate.cancelled == []


async def test_cancelling_a_stop_caller_does_not_cancel_the_shutdown() -> None:
    gate = Gate()
    async with fake() as f:
        w = Worker(f.address, "p", gate)
        run = asyncio.create_task(w.run())
        await w.wait_registered(3)
        await f.conns[0].lease(1)
        await asyncio.wait_for(gate.started.wait(), 3)
        caller = asyncio.create_task(w.stop(grace=5))
        await asyncio.sleep(0.05)
        caller.cancel()
        gate.release.set()
        await asyncio.wait_for(run, 3)
    assert f.conns[0].kinds() == ["register", "set_slots", "complete"]


async def test_stop_between_sessions_ends_run_and_a_second_run_serves_again() -> None:
    async def unavailable(conn: Conn) -> None:
        # after the register, as a server does: a bidi call ended before the client's first
        # message is read may reach grpcio's client as INTERNAL "Internal error from Core"
        await conn.recv("register")
        await conn.context.abort(Code.UNAVAILABLE, "down")

    async with fake(unavailable) as f:
        w = Worker(f.address, "p", echo, backoff=(5.0, 5.0))
        run = asyncio.create_task(w.run())
        await f.next()
        await asyncio.sleep(0.05)  # in the 5 s backoff wait now
        await asyncio.wait_for(w.stop(), 1)
        await asyncio.wait_for(run, 1)
        assert w.connections == 1
        f.script = hold
        async with running(w):  # a second run() connects and registers again
            await w.wait_registered(3)
        assert w.connections == 2
        assert f.conns[1].kinds() == ["register", "set_slots"]


async def test_stop_does_not_send_set_slots_before_registered_and_wait_times_out() -> None:
    async with fake(silent) as f:
        w = Worker(f.address, "p", echo)
        run = asyncio.create_task(w.run())
        with pytest.raises(TimeoutError):
            await w.wait_registered(timeout=0.1)
        await asyncio.wait_for(w.stop(), 3)
        await asyncio.wait_for(run, 3)
    assert f.conns[0].kinds() == ["register"]
    assert f.conns[0].eof.is_set()


@pytest.mark.realtime  # the worker's real 5 s bound on the closing call
async def test_stop_cancels_a_call_the_server_does_not_end() -> None:
    async def deaf(conn: Conn) -> None:
        await conn.register()
        await asyncio.sleep(30)  # never ends the stream, even after the half-close

    async with fake(deaf) as f:
        w = Worker(f.address, "p", echo)
        run = asyncio.create_task(w.run())
        await w.wait_registered(3)
        t0 = time.monotonic()
        await w.stop()
        assert time.monotonic() - t0 >= 4.9  # it waited for the server before cancelling
        assert await asyncio.wait_for(run, 1) is None


# --- Lease mapping, event loops --------------------------------------------------------------


async def test_lease_fields() -> None:
    leases: list[Lease] = []

    async def handler(lease: Lease) -> None:
        leases.append(lease)

    async with fake(lambda conn: hold(conn, lease_ttl_s=30.0)) as f:
        w = Worker(f.address, "mine", handler, slots=2)
        async with running(w):
            await w.wait_registered(3)
            assert w.lease_ttl == 30.0
            conn = f.conns[0]
            await conn.send(lease=pb.Lease(lease=1, task_id=11, attempt=2, payload=b'{"n": 1}',
                                           content_type="application/json", kind="k", key="y",
                                           tags={"t": "v"}, timeout_s=1.5,
                                           deadline_unix_ns=2 * 10**18))  # fmt: skip
            await conn.send(lease=pb.Lease(lease=2, task_id=12, pool="other",
                                           priority=pb.PRIORITY_HIGH, lease_ttl_s=0.9))  # fmt: skip
            await conn.recv("complete")
            await conn.recv("complete")
    first, second = sorted(leases, key=lambda lease: lease.id)
    assert (first.id, first.task_id, first.attempt, first.kind, first.key) == (1, 11, 2, "k", "y")
    assert (first.payload, first.content_type, first.tags) == (b'{"n": 1}', "application/json",
                                                               {"t": "v"})  # fmt: skip
    assert (first.timeout, first.deadline, first.pool) == (1.5, 2e9, "mine")
    assert (first.priority, first.lease_ttl) == (None, 30.0)
    assert first.json() == {"n": 1} and first.text() == '{"n": 1}'
    assert (second.pool, second.priority, second.lease_ttl) == ("other", "high", 0.9)
    assert (second.timeout, second.deadline, second.json(), second.text()) == (None, None, None, "")
    assert not first.cancelled.is_set()


MODULE_PORT = free_port()
MODULE_WORKER = Worker(f"http://127.0.0.1:{MODULE_PORT}/", "p", echo, backoff=FAST)


def test_a_module_level_worker_serves_under_two_event_loops() -> None:
    async def once() -> None:
        async with fake(port=MODULE_PORT) as f:
            run = asyncio.create_task(MODULE_WORKER.run())
            await MODULE_WORKER.wait_registered(3)
            conn = f.conns[0]
            await conn.lease(1, b"hi")
            assert (await conn.recv("complete")).complete.output == b"hi"
            await MODULE_WORKER.stop()
            await asyncio.wait_for(run, 3)

    asyncio.run(asyncio.wait_for(once(), 8))
    asyncio.run(asyncio.wait_for(once(), 8))
    # one session per loop at least; a loaded machine may add a reconnect (a first connection
    # refused or reset while the fake server on the reused port comes up), which run() rides out
    assert MODULE_WORKER.connections >= 2


# --- against the real cronoq-server ----------------------------------------------------------

ADMIN = "admin-token-for-the-worker-tests-0123"
WORKER = "worker-token-for-the-worker-tests-0123"
CLIENT = "client-token-for-the-worker-tests-0123"
MAX_MESSAGE = 8192
RETRY = "retry = { max_attempts = 2, initial_backoff_s = 0, jitter = false }\n"
POOLS = {
    "out": "",
    "abort": RETRY,
    "slots": "max = 2\n",
    "big": RETRY,
    "rej": RETRY,
    "fate": RETRY,
    "stop": "retry = { max_attempts = 3, initial_backoff_s = 30, jitter = false }\n",
    "ttl": "lease_ttl_s = 0.3\n" + RETRY,
}
REAL = (
    PORT0
    + f"[limits]\nmax_message_bytes = {MAX_MESSAGE}\n"
    + "".join(f'[[pools]]\nname = "{name}"\n{extra}' for name, extra in POOLS.items())
    + "".join(
        f'[[auth.tokens]]\ntoken = "{t}"\nrole = "{role}"\n'
        for t, role in ((ADMIN, "admin"), (WORKER, "worker"), (CLIENT, "client"))
    )
)
MD = (("authorization", f"Bearer {ADMIN}"),)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    with serving_process(tmp_path_factory.mktemp("real"), REAL) as serving:
        yield serving


class Tasks:
    """The raw Tasks and Admin stubs with the admin token."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.tasks = cronoq_pb2_grpc.TasksStub(channel)
        self.admin = cronoq_pb2_grpc.AdminStub(channel)

    async def submit(self, pool: str, payload: bytes = b"", **fields: Any) -> int:
        spec = pb.TaskSpec(pool=pool, payload=payload, **fields)
        reply = await self.tasks.Submit(pb.SubmitRequest(task=spec), metadata=MD, timeout=5)
        return int(reply.id)

    async def wait(self, task: int, timeout: float = 5.0) -> pb.TaskResult:
        request = pb.WaitRequest(task=pb.TaskRef(id=task), timeout_s=timeout)
        result: pb.TaskResult = await self.tasks.Wait(request, metadata=MD, timeout=timeout + 5)
        return result

    async def get(self, task: int) -> pb.TaskInfo:
        request = pb.GetRequest(task=pb.TaskRef(id=task))
        info: pb.TaskInfo = await self.tasks.Get(request, metadata=MD, timeout=5)
        return info

    async def cancel(self, task: int) -> None:
        await self.tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(id=task)), metadata=MD)

    async def totals(self) -> pb.Totals:
        snap = await self.admin.Snapshot(pb.Empty(), metadata=MD, timeout=5)
        return snap.totals


@contextlib.asynccontextmanager
async def stubs(address: str) -> AsyncIterator[Tasks]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield Tasks(channel)


def real_worker(real: Serving, pool: str, handler: Any, **kw: Any) -> Worker:
    return Worker(real.address, pool, handler, token=WORKER, backoff=FAST, **kw)


async def test_real_outputs_and_lease_fields(real: Serving) -> None:
    seen: dict[str, Lease] = {}
    outputs = {"json": {"a": [1, 2]}, "str": "hé", "bytes": b"\x00\x01", "none": None}

    async def handler(lease: Lease) -> Any:
        seen[lease.key] = lease
        return outputs[lease.key]

    w = real_worker(real, "out", handler, slots=4, name="w-out", labels={"zone": "z1"})
    async with running(w), stubs(real.address) as s:
        await w.wait_registered(5)
        assert (w.granted_slots, w.server_protocol) == (4, 3)
        assert (w.max_message_bytes, w.lease_ttl) == (MAX_MESSAGE, 30.0)  # the default TTL
        deadline = int((time.time() + 60) * 1e9)
        ids = {
            key: await s.submit("out", b'{"in": 1}', key=key, content_type="application/json",
                                tags={"t": "1"}, timeout_s=30, deadline_unix_ns=deadline)
            for key in outputs
        }  # fmt: skip
        results = {key: await s.wait(i) for key, i in ids.items()}
        workers = await s.admin.ListWorkers(pb.Empty(), metadata=MD)
        assert [(x.name, x.pool, dict(x.labels)) for x in workers.workers if x.pool == "out"] == [
            ("w-out", "out", {"zone": "z1"})
        ]
    assert all(r.status == pb.TASK_STATUS_SUCCEEDED for r in results.values())
    assert results["json"].output == b'{"a": [1, 2]}'
    assert results["str"].output == "hé".encode()
    assert results["bytes"].output == b"\x00\x01"
    assert results["none"].output == b""
    lease = seen["json"]
    assert (lease.pool, lease.attempt, lease.task_id, lease.priority) == ("out", 1, ids["json"],
                                                                          "normal")  # fmt: skip
    assert (lease.json(), lease.content_type, lease.tags) == ({"in": 1}, "application/json",
                                                              {"t": "1"})  # fmt: skip
    assert lease.timeout == 30.0 and lease.deadline is not None
    assert abs(lease.deadline - deadline / 1e9) < 1e-3
    assert lease.lease_ttl == 30.0


async def test_real_abort_cancels_the_handler_and_sends_nothing(real: Serving) -> None:
    gate = Gate()
    w = real_worker(real, "abort", gate)
    async with running(w), stubs(real.address) as s:
        await w.wait_registered(5)
        task = await s.submit("abort")
        await asyncio.wait_for(gate.started.wait(), 5)
        stale = (await s.totals()).stale_completions
        await s.cancel(task)
        await asyncio.wait_for(gate.leases[0].cancelled.wait(), 5)
        assert w.running == 0
        assert (await s.wait(task)).status == pb.TASK_STATUS_CANCELLED
        await asyncio.sleep(0.1)
        assert gate.cancelled == [gate.leases[0].id]
        assert (await s.totals()).stale_completions == stale  # no outcome reached the server


async def test_real_lease_token_tags_and_traceparent(real: Serving) -> None:
    """The lease offers the library TaskContext's members: tag(), traceparent() from the
    submitter's `traceparent` header, and a token the abort cancels (wait, callbacks)."""
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    gate = Gate()
    plain: list[Lease] = []
    calls: list[str] = []
    watchers: list[asyncio.Task[None]] = []

    async def watch(lease: Lease) -> None:
        await lease.cancellation_token().wait()
        calls.append(f"wait saw is_cancelled={lease.is_cancelled()}")

    async def handler(lease: Lease) -> Any:
        if lease.key == "plain":
            plain.append(lease)
            return None
        lease.cancellation_token().add_callback(lambda: calls.append("callback"))
        watchers.append(asyncio.get_running_loop().create_task(watch(lease)))
        return await gate(lease)

    w = real_worker(real, "abort", handler)
    async with running(w), stubs(real.address) as s:
        await w.wait_registered(5)
        assert (await s.wait(await s.submit("abort", key="plain"))).status == (
            pb.TASK_STATUS_SUCCEEDED
        )
        spec = pb.TaskSpec(pool="abort", tags={"n": "1"})
        traced = await s.tasks.Submit(
            pb.SubmitRequest(task=spec), metadata=(*MD, ("traceparent", trace)), timeout=5
        )
        await asyncio.wait_for(gate.started.wait(), 5)
        lease = gate.leases[0]
        assert (lease.tag("n"), lease.tag("absent"), lease.traceparent()) == ("1", None, trace)
        assert not lease.is_cancelled() and not lease.cancellation_token().is_cancelled()
        await s.cancel(traced.id)
        await asyncio.wait_for(watchers[0], 5)
    assert (plain[0].tag("n"), plain[0].traceparent(), plain[0].is_cancelled()) == (
        None,
        None,
        False,
    )
    assert calls == ["callback", "wait saw is_cancelled=True"]
    assert lease.cancelled.is_set() and lease.cancellation_token().is_cancelled()


async def test_real_granted_slots_are_a_ceiling(real: Serving) -> None:
    now = peak = 0

    async def handler(lease: Lease) -> None:
        nonlocal now, peak
        now += 1
        peak = max(peak, now)
        await asyncio.sleep(0.05)
        now -= 1

    w = real_worker(real, "slots", handler, slots=4)
    async with running(w), stubs(real.address) as s:
        await w.wait_registered(5)
        assert (w.slots, w.granted_slots) == (4, 2)
        ids = [await s.submit("slots") for _ in range(6)]
        for i in ids:
            assert (await s.wait(i)).status == pb.TASK_STATUS_SUCCEEDED
    assert peak == 2


async def test_real_oversize_output_fails_permanently(real: Serving) -> None:
    async def handler(lease: Lease) -> bytes:
        return b"z" * int(lease.text())

    w = real_worker(real, "big", handler)
    fits, too_big = MAX_MESSAGE - 1024, MAX_MESSAGE - 1023
    async with running(w), stubs(real.address) as s:
        ok = await s.submit("big", str(fits).encode())
        bad = await s.submit("big", str(too_big).encode())
        assert (await s.wait(ok)).output == b"z" * fits
        result = await s.wait(bad)
        info = await s.get(bad)
    assert result.status == pb.TASK_STATUS_FAILED and info.attempt == 1
    assert f"output of {too_big} bytes" in result.message
    assert f"message limit of {MAX_MESSAGE} bytes" in result.message


async def test_real_reject_hands_the_lease_to_another_worker(real: Serving) -> None:
    rejected: list[tuple[int, int]] = []
    taken: list[tuple[int, int]] = []

    async def picky(lease: Lease) -> None:
        rejected.append((lease.task_id, lease.attempt))
        raise Reject("not here")

    async def willing(lease: Lease) -> str:
        taken.append((lease.task_id, lease.attempt))
        return "ok"

    a = real_worker(real, "rej", picky, slots=2)  # most free slots: offered the task first
    b = real_worker(real, "rej", willing, slots=1)
    async with running(a), running(b), stubs(real.address) as s:
        await a.wait_registered(5)
        await b.wait_registered(5)
        task = await s.submit("rej")
        result = await s.wait(task)
        info = await s.get(task)
    assert (result.status, result.output, info.attempt) == (pb.TASK_STATUS_SUCCEEDED, b"ok", 1)
    assert rejected == [(task, 1)] and taken == [(task, 1)]


async def test_real_outcome_statuses(real: Serving) -> None:
    async def handler(lease: Lease) -> str:
        op = lease.text()
        if op == "flaky" and lease.attempt == 1:
            raise cronoq.Retryable("later")
        if op == "always":
            raise cronoq.Retryable("nope", retry_after=0.01)
        if op == "perm":
            raise cronoq.Permanent("bad input")
        if op == "boom":
            raise ValueError("boom")
        if op == "cancel":
            raise CancelTask("enough")
        return f"{op}@{lease.attempt}"

    w = real_worker(real, "fate", handler, slots=5)
    async with running(w), stubs(real.address) as s:
        await w.wait_registered(5)
        ops = ["flaky", "always", "perm", "boom", "cancel"]
        ids = {op: await s.submit("fate", op.encode()) for op in ops}
        results = {op: await s.wait(i) for op, i in ids.items()}
        infos = {op: await s.get(i) for op, i in ids.items()}

    def status(op: str) -> tuple[int, int]:
        return results[op].status, infos[op].attempt

    assert status("flaky") == (pb.TASK_STATUS_SUCCEEDED, 2)
    assert results["flaky"].output == b"flaky@2"
    assert status("always") == (pb.TASK_STATUS_DEAD_LETTERED, 2)
    assert "nope" in results["always"].message
    assert status("perm") == (pb.TASK_STATUS_FAILED, 1)
    assert "bad input" in results["perm"].message
    assert status("boom") == (pb.TASK_STATUS_DEAD_LETTERED, 2)
    assert "ValueError: boom" in results["boom"].message
    assert status("cancel") == (pb.TASK_STATUS_CANCELLED, 1)


async def test_real_stop_drains_within_the_grace_and_cancels_after_it(real: Serving) -> None:
    async def handler(lease: Lease) -> str:
        await asyncio.sleep(float(lease.text()))
        return "slept"

    async with stubs(real.address) as s:
        w = real_worker(real, "stop", handler)
        run = asyncio.create_task(w.run())
        await w.wait_registered(5)
        quick = await s.submit("stop", b"0.3")
        while w.running == 0:
            await asyncio.sleep(0.01)
        await w.stop(grace=5)
        await asyncio.wait_for(run, 3)
        result = await s.wait(quick)
        assert (result.status, result.output) == (pb.TASK_STATUS_SUCCEEDED, b"slept")

        gate = Gate()
        w = real_worker(real, "stop", gate)
        run = asyncio.create_task(w.run())
        slow = await s.submit("stop")
        await asyncio.wait_for(gate.started.wait(), 5)
        await w.stop(grace=0.1)
        await asyncio.wait_for(run, 3)
        assert gate.leases[0].cancelled.is_set() and gate.cancelled == [gate.leases[0].id]
        info = await s.get(slow)  # the server failed the attempt as retryable: it waits
        assert info.status == pb.TASK_STATUS_RETRYING and "disconnected" in info.message
        await s.cancel(slow)


async def test_real_refusals_end_run_after_one_connection(real: Serving) -> None:
    """Fatal refusals end run() after exactly one connection (docs/worker.md, "Errors that end
    `run()`"). The server
    reads the register before refusing a credential too: refused while the register was in
    flight, grpcio sometimes reported INTERNAL instead (grpc/grpc#36066), which a worker
    retries."""
    w = Worker(real.address, "nope", echo, token=WORKER, backoff=FAST)
    with pytest.raises(ClientError) as e:
        await w.run()
    assert (e.value.code, w.connections) == ("not_found", 1)
    cases = [
        (Worker(real.address, "out", echo, token="x" * 32, backoff=FAST), "unauthenticated"),
        (Worker(real.address, "out", echo, token=CLIENT, backoff=FAST), "permission_denied"),
        (Worker(real.address, "out", echo, backoff=FAST), "unauthenticated"),
    ]
    for w, code in cases:
        with pytest.raises(ClientError) as e:
            await w.run()
        assert e.value.code == code and w.connections == 1
    await asyncio.sleep(0.05)
    # Each ended session closed its outbox, so grpc's tasks feeding the calls have finished
    # (a session that left them waiting shows here, and as "Task was destroyed" at exit).
    feeders = [t for t in asyncio.all_tasks() if "consume_request_iterator" in repr(t)]
    assert feeders == []


async def test_real_heartbeats_keep_a_lease_past_its_ttl(real: Serving) -> None:
    leases: list[Lease] = []

    async def handler(lease: Lease) -> str:
        leases.append(lease)
        await asyncio.sleep(1.0)
        return "kept"

    w = real_worker(real, "ttl", handler)
    async with running(w), stubs(real.address) as s:
        await w.wait_registered(5)
        assert w.lease_ttl == 0.3
        expiries = (await s.totals()).lease_expiries
        task = await s.submit("ttl")
        result = await s.wait(task)
        assert (result.status, result.output) == (pb.TASK_STATUS_SUCCEEDED, b"kept")
        assert (await s.get(task)).attempt == 1
        assert (await s.totals()).lease_expiries == expiries
    assert leases[0].lease_ttl == 0.3


async def test_real_reconnect_after_a_server_restart(tmp_path: Path) -> None:
    port = free_port()
    config = write(tmp_path, PORT0.replace("127.0.0.1:0", f"127.0.0.1:{port}", 1)
                   + '[[pools]]\nname = "default"\n')  # fmt: skip
    first = await asyncio.to_thread(Server, config)
    try:
        await asyncio.to_thread(first.wait_for, "event=ready")
        w = Worker(f"127.0.0.1:{port}", "default", echo, backoff=FAST)
        async with running(w):
            await w.wait_registered(5)
            before = w.worker_id
            assert await asyncio.to_thread(first.terminate, 10) == 0
            await until(lambda: w.last_shutdown == "server shutting down")
            second = await asyncio.to_thread(Server, config)
            try:
                await asyncio.to_thread(second.wait_for, "event=ready")
                await w.wait_registered(5)
                async with stubs(f"127.0.0.1:{port}") as s:
                    task = await s.submit("default", b"again")
                    assert (await s.wait(task)).output == b"again"
                assert w.connections >= 2 and w.worker_id == before == 1
            finally:
                second.kill()
    finally:
        first.kill()


async def test_real_not_leader_shutdown_when_the_server_is_fenced(tmp_path: Path) -> None:
    """Another process taking the SQLite leadership (here: the test bumping the epoch in the
    file, as a new leader does) fences the server at its next write: it tells its workers
    shutdown{not_leader}, stands by, and leads again once that lease (already expired here)
    is free; the worker reconnects from backoff[0] and is served by the new session."""
    db = tmp_path / "q.db"
    config = write(
        tmp_path, PORT0 + f'[store]\nkind = "sqlite"\npath = "{db}"\n[[pools]]\nname = "default"\n'
    )
    server = await asyncio.to_thread(Server, config)
    try:
        await asyncio.to_thread(server.wait_for, "event=ready")
        w = Worker(server.address, "default", echo, backoff=(0.05, 5.0))
        async with running(w), stubs(server.address) as s:
            await w.wait_registered(5)
            assert (await s.wait(await s.submit("default", b"led"))).output == b"led"
            with sqlite3.connect(db) as other:
                other.execute(
                    "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'other', "
                    "expires_unix_ns = 0"
                )
            with contextlib.suppress(grpc.aio.AioRpcError):
                await s.submit("default", b"fenced")  # its commit finds the lease taken
            await until(lambda: w.last_shutdown is not None)
            assert w.last_shutdown == "this server is no longer the leader"
            await asyncio.to_thread(server.wait_for, "event=ready")  # leading again
            await w.wait_registered(5)
            task = await s.submit("default", b"again")
            assert task >> 48 == 3  # epoch 1, the other's 2, then ours again
            assert (await s.wait(task)).output == b"again"
            assert w.connections >= 2
    finally:
        server.kill()
