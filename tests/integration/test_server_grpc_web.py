"""gRPC-Web on the gRPC port (docs/grpc-web.md) of a real in-process server, over real sockets.

A raw HTTP/1.1 client (asyncio streams) sends gRPC-Web requests to the gRPC port: binary and
text unary calls, the auth codes, CORS preflights, the Host guard, `application/grpc` over
HTTP/1.1, a Watch event arriving on an open stream, and nothing served when it is off. Native
gRPC and a Python worker keep working on the same port through the relay. Then a standby's
14, a Watch's status frame when the server stops, the body-limit answer's CORS headers and
`grpc-timeout` as the deadline. TLS: test_server_grpc_web_tls.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from cronoq.client import Lease, Worker
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.app import ServerApp
from cronoq.server.config import load_config
from cronoq.server.errors import percent_encode
from cronoq.server.fronts import grpcweb
from cronoq.server.wiring import build
from helpers.auth import AUTH, token
from helpers.servers import led_elsewhere, running_app

ORIGIN = "https://app.example"
PORTS = '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 0.1\n'
WEB = f'[server.grpc_web]\nallowed_origins = ["{ORIGIN}"]\n'
POOLS = '[[pools]]\nname = "a"\n[[pools]]\nname = "b"\n'
OPEN = PORTS + WEB + POOLS
SECURED = PORTS + WEB + POOLS + AUTH
SUBMIT = "/cronoq.v1.Tasks/Submit"
GET = "/cronoq.v1.Tasks/Get"
WATCH = "/cronoq.v1.Tasks/Watch"
WAIT = "/cronoq.v1.Tasks/Wait"
TIMEOUT = {"grpc-timeout": "200m"}
BINARY = "application/grpc-web+proto"
TEXT = "application/grpc-web-text+proto"


@contextlib.asynccontextmanager
async def serving(text: str) -> AsyncIterator[ServerApp]:
    async with running_app(build(load_config(text)), ready=True) as app:
        yield app


class Answer:
    """One HTTP/1.1 answer: status, headers (lower-cased) and the body, text mode decoded."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        if headers.get("content-type") == TEXT:
            body = base64.b64decode(body)
        self.frames = grpcweb.split_frames(body)

    @property
    def messages(self) -> list[bytes]:
        return [data for flag, data in self.frames if flag == grpcweb.MESSAGE]

    @property
    def trailers(self) -> dict[str, str]:
        """The status: from the trailer frame, else from the headers (both forms allowed)."""
        for flag, data in self.frames:
            if flag == grpcweb.TRAILER:
                lines = data.decode().split("\r\n")
                return dict(line.split(":", 1) for line in lines if line)
        return {k: v for k, v in self.headers.items() if k.startswith("grpc-")}

    @property
    def code(self) -> int:
        return int(self.trailers["grpc-status"])


class Conn:
    """A keep-alive HTTP/1.1 connection to the gRPC port."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def send(self, verb: str, path: str, headers: dict[str, str], body: bytes = b"") -> None:
        lines = [f"{verb} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
        lines.append(f"content-length: {len(body)}")
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    async def head(self) -> tuple[int, dict[str, str]]:
        raw = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line, *fields = raw[:-4].split("\r\n")
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(line.split(" ")[1]), headers

    async def chunk(self) -> bytes:
        size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def answer(self) -> Answer:
        status, headers = await self.head()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while data := await self.chunk():
                body += base64.b64decode(data) if headers["content-type"] == TEXT else data
            await self.reader.readuntil(b"\r\n")
            headers = {**headers, "content-type": BINARY}
        else:
            body = await self.reader.readexactly(int(headers["content-length"]))
        return Answer(status, headers, body)

    async def call(
        self,
        path: str,
        message: Any,
        *,
        mode: str = "binary",
        who: str | None = None,
        **headers: str,
    ) -> Answer:
        body = grpcweb.frame(message.SerializeToString())
        ctype = BINARY
        if mode == "text":
            body, ctype = base64.b64encode(body), TEXT
        sent = {"host": "localhost", "content-type": ctype, "x-grpc-web": "1", **headers}
        if who is not None:
            sent["authorization"] = f"Bearer {token(who)}"
        self.send("POST", path, sent, body)
        return await self.answer()


@contextlib.asynccontextmanager
async def connect(app: ServerApp) -> AsyncIterator[Conn]:
    assert app.grpc_address is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", app.grpc_address.port)
    try:
        yield Conn(reader, writer)
    finally:
        writer.close()


def submit(pool: str = "a", payload: bytes = b"x") -> pb.SubmitRequest:
    return pb.SubmitRequest(task=pb.TaskSpec(payload=payload, pool=pool))


# --- unary calls ------------------------------------------------------------------------------


async def test_binary_and_text_unary_calls() -> None:
    async with serving(OPEN) as app, connect(app) as c:
        for mode in ("binary", "text"):
            sent = await c.call(SUBMIT, submit(), mode=mode)
            assert sent.status == 200 and sent.code == 0, sent.trailers
            assert sent.headers["content-type"] == grpcweb.answer_type(mode)
            [raw] = sent.messages
            task_id = pb.SubmitResponse.FromString(raw).id
            got = await c.call(GET, pb.GetRequest(task=pb.TaskRef(id=task_id)), mode=mode)
            assert got.code == 0
            info = pb.TaskInfo.FromString(got.messages[0])
            assert (info.id, info.pool) == (task_id, "a")


async def test_auth_codes_are_those_of_native_grpc() -> None:
    async with serving(SECURED) as app, connect(app) as c:
        assert (await c.call(SUBMIT, submit())).code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        denied = await c.call(SUBMIT, submit(), who="worker")
        assert denied.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        assert denied.messages == []
        unknown = await c.call(GET, pb.GetRequest(task=pb.TaskRef(id=999_999)), who="client")
        assert unknown.code == grpc.StatusCode.NOT_FOUND.value[0]
        ok = await c.call(SUBMIT, submit(), who="client")
        assert ok.code == 0 and len(ok.messages) == 1
        work = await c.call("/cronoq.v1.Workers/Work", pb.WorkerMessage(), who="worker")
        assert work.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
        assert work.trailers["grpc-message"] == percent_encode(grpcweb.NOT_BIDI)


async def test_chunked_request_body_and_keep_alive() -> None:
    async with serving(OPEN) as app, connect(app) as c:
        body = grpcweb.frame(submit().SerializeToString())
        head = "POST {} HTTP/1.1\r\nhost: localhost\r\ncontent-type: {}\r\n"
        head += "transfer-encoding: chunked\r\n\r\n"
        chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (3, body[:3], len(body) - 3, body[3:])
        c.writer.write(head.format(SUBMIT, BINARY).encode() + chunks)
        first = await c.answer()
        assert first.code == 0 and len(first.messages) == 1
        again = await c.call(SUBMIT, submit())  # the same connection
        assert again.code == 0


# --- CORS and the guard -----------------------------------------------------------------------


async def test_preflights_from_listed_and_unlisted_origins() -> None:
    preflight = {
        "host": "localhost",
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type,x-grpc-web",
    }
    common = {
        "access-control-allow-methods": "POST",
        "access-control-allow-headers": grpcweb.ALLOW_HEADERS,
        "access-control-expose-headers": grpcweb.EXPOSE_HEADERS,
        "access-control-max-age": "600",
    }
    async with serving(OPEN) as app, connect(app) as c:
        for origin, expected in (
            (ORIGIN, {**common, "access-control-allow-origin": ORIGIN}),
            ("https://evil.example", common),
        ):
            c.send("OPTIONS", SUBMIT, {**preflight, "origin": origin})
            status, headers = await c.head()
            assert status == 204 and headers["content-length"] == "0"
            cors = {k: v for k, v in headers.items() if k.startswith("access-control-")}
            assert cors == expected
            assert "grpc-status" not in headers


async def test_an_unlisted_origin_is_still_served() -> None:
    async with serving(OPEN) as app, connect(app) as c:
        listed = await c.call(SUBMIT, submit(), origin=ORIGIN)
        assert listed.code == 0 and listed.headers["access-control-allow-origin"] == ORIGIN
        unlisted = await c.call(SUBMIT, submit(), origin="https://evil.example")
        assert unlisted.code == 0 and len(unlisted.messages) == 1
        assert "access-control-allow-origin" not in unlisted.headers


async def test_host_guard_without_auth() -> None:
    async with serving(OPEN) as app, connect(app) as c:
        refused = await c.call(SUBMIT, submit(), host="evil.example")
        assert refused.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        assert refused.messages == []
        for host in ("127.0.0.1:7070", "[::1]", "localhost:1"):
            assert (await c.call(SUBMIT, submit(), host=host)).code == 0


async def test_application_grpc_over_http1_has_no_effect() -> None:
    async with serving(OPEN) as app, connect(app) as c:
        body = grpcweb.frame(submit(payload=b"never").SerializeToString())
        c.send("POST", SUBMIT, {"host": "localhost", "content-type": "application/grpc"}, body)
        refused = await c.answer()
        assert refused.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
        assert refused.trailers["grpc-message"] == percent_encode(grpcweb.NOT_GRPC_WEB)
        listed = await c.call("/cronoq.v1.Tasks/ListTasks", pb.ListTasksRequest())
        assert listed.code == 0
        assert pb.ListTasksResponse.FromString(listed.messages[0]).tasks == []


# --- streaming --------------------------------------------------------------------------------


async def first_event(watcher: Conn, c: Conn, pool: str) -> tuple[dict[str, str], bytes, set[int]]:
    """The headers and first chunk of the open Watch on `watcher`, while `c` submits to `pool`:
    a submit made before the watch subscribed makes no event, so submit until one arrives
    (each wait is on the stream itself, not on a clock)."""

    async def read() -> tuple[dict[str, str], bytes]:
        status, headers = await watcher.head()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        return headers, await watcher.chunk()

    reading = asyncio.create_task(read())
    sent: set[int] = set()
    while not reading.done() and len(sent) < 200:
        answer = await c.call(SUBMIT, submit(pool=pool))
        sent.add(pb.SubmitResponse.FromString(answer.messages[0]).id)
        await asyncio.wait([reading], timeout=0.05)
    headers, chunk = await reading
    return headers, chunk, sent


async def test_watch_event_arrives_on_the_open_stream() -> None:
    async with serving(OPEN) as app, connect(app) as watcher, connect(app) as c:
        request = pb.WatchRequest(pools=["a"], all_transitions=True)
        headers = {"host": "localhost", "content-type": BINARY}
        watcher.send("POST", WATCH, headers, grpcweb.frame(request.SerializeToString()))
        head, chunk, sent = await first_event(watcher, c, "a")
        assert head["content-type"] == BINARY
        [(flag, data)] = grpcweb.split_frames(chunk)
        event = pb.StatusEvent.FromString(data)
        assert flag == grpcweb.MESSAGE and event.id in sent and event.pool == "a"


async def test_text_mode_watch_chunks_decode_on_their_own() -> None:
    async with serving(OPEN) as app, connect(app) as watcher, connect(app) as c:
        request = pb.WatchRequest(all_transitions=True)
        body = base64.b64encode(grpcweb.frame(request.SerializeToString()))
        watcher.send("POST", WATCH, {"host": "localhost", "content-type": TEXT}, body)
        head, chunk, sent = await first_event(watcher, c, "b")
        assert head["content-type"] == TEXT
        [(_, data)] = grpcweb.split_frames(base64.b64decode(chunk))
        assert pb.StatusEvent.FromString(data).id in sent


# --- off, and native gRPC on the same port ----------------------------------------------------


async def test_off_serves_no_grpc_web() -> None:
    async with serving(PORTS + POOLS) as app, connect(app) as c:
        body = grpcweb.frame(submit().SerializeToString())
        c.send("POST", SUBMIT, {"host": "localhost", "content-type": BINARY}, body)
        try:  # what is not HTTP/2 is closed: by grpcio, or reset by the native transport
            c.writer.write_eof()
            received = await c.reader.read()
        except OSError:  # (reset, or not connected any more)
            received = b""
        assert b"grpc-status" not in received.lower()


async def native_echo(lease: Lease) -> bytes:
    return lease.payload + b"!"


async def test_native_grpc_and_a_worker_share_the_port() -> None:
    async with serving(OPEN) as app:
        address = str(app.grpc_address)
        worker = Worker(address, "a", native_echo, slots=1)
        running = asyncio.create_task(worker.run())
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                tasks = cronoq_pb2_grpc.TasksStub(channel)
                sent = await tasks.Submit(submit(payload=b"hi"), timeout=30)
                done = await tasks.Wait(
                    pb.WaitRequest(task=pb.TaskRef(id=sent.id), timeout_s=30), timeout=40
                )
                assert done.output == b"hi!"
                async with connect(app) as c:
                    got = await c.call(GET, pb.GetRequest(task=pb.TaskRef(id=sent.id)))
                    assert (
                        pb.TaskInfo.FromString(got.messages[0]).status == pb.TASK_STATUS_SUCCEEDED
                    )
        finally:
            await worker.stop(0.5)
            await asyncio.wait_for(running, 10)


# --- standby, shutdown, limits and deadlines --------------------------------------------------


async def test_a_standby_answers_unavailable(tmp_path: Path) -> None:
    """A durable store another process leads: the server binds and stands by (docs/server.md,
    "Standby"), and a gRPC-Web call gets 14 as a native one would."""
    holder, store = await led_elsewhere(tmp_path / "q.db")
    try:
        async with running_app(build(load_config(OPEN + store))) as app, connect(app) as c:
            assert not app.ready
            refused = await c.call(SUBMIT, submit())
            assert refused.code == grpc.StatusCode.UNAVAILABLE.value[0]
            assert refused.messages == []
            assert "standby" in refused.trailers["grpc-message"]
    finally:
        await holder.close()


async def test_a_watch_ends_with_a_status_frame_when_the_server_stops() -> None:
    async with serving(OPEN) as app, connect(app) as watcher, connect(app) as c:
        request = pb.WatchRequest(pools=["a"], all_transitions=True)
        headers = {"host": "localhost", "content-type": BINARY}
        watcher.send("POST", WATCH, headers, grpcweb.frame(request.SerializeToString()))
        await first_event(watcher, c, "a")  # the watch is subscribed and streaming
        stopping = asyncio.create_task(app.stop())
        while True:  # events still queued, then the status frame, then the last chunk
            chunk = await watcher.chunk()
            [(flag, data)] = grpcweb.split_frames(chunk)
            if flag == grpcweb.TRAILER:
                break
        assert b"grpc-status:%d\r\n" % grpc.StatusCode.UNAVAILABLE.value[0] in data
        assert await watcher.chunk() == b""
        await stopping


async def test_a_body_over_the_limit_carries_cors_headers() -> None:
    limits = "[limits]\nmax_http_body_bytes = 4096\n"
    async with serving(OPEN + limits) as app, connect(app) as c:
        large = submit(payload=b"x" * 5000)
        answer = await c.call(SUBMIT, large, origin=ORIGIN)
        assert answer.code == grpc.StatusCode.OUT_OF_RANGE.value[0]
        assert answer.headers["access-control-allow-origin"] == ORIGIN
        assert answer.headers["access-control-expose-headers"] == grpcweb.EXPOSE_HEADERS
        assert answer.headers["connection"] == "close"
        assert await c.reader.read() == b""  # then the connection is closed


async def test_grpc_timeout_is_the_deadline() -> None:
    """A Wait on a task no worker takes, for 30 s, under `grpc-timeout: 200m`: the status is
    DEADLINE_EXCEEDED (asserted on the status only, not on how long it took)."""
    async with serving(OPEN) as app, connect(app) as c:
        sent = await c.call(SUBMIT, submit())
        task = pb.TaskRef(id=pb.SubmitResponse.FromString(sent.messages[0]).id)
        waited = await c.call(WAIT, pb.WaitRequest(task=task, timeout_s=30), **TIMEOUT)
        assert waited.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert waited.messages == []
        # the task itself is untouched, and the connection still serves
        got = await c.call(GET, pb.GetRequest(task=task))
        assert pb.TaskInfo.FromString(got.messages[0]).status == pb.TASK_STATUS_READY
