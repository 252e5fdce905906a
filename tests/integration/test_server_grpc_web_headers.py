"""gRPC-Web's response headers (docs/grpc-web.md): `allowed_origins` matched as origins are
compared (scheme and host case-insensitively, a default port implied), the browser's own
`Origin` echoed; and a Watch's headers sent as soon as it is subscribed, before any event, as a
browser's `fetch` resolves on them (over native gRPC alike: the initial metadata)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from test_server_grpc_web import BINARY, POOLS, PORTS, SUBMIT, WATCH, connect, serving, submit

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.fronts import grpcweb

LISTED = """[server.grpc_web]
allowed_origins = ["https://Dash.Example.com:443", "HTTP://LOCALHOST:3000"]
"""
HANG_GUARD_S = 5.0  # far past anything here: only a hang reaches it


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://dash.example.com", True),
        ("https://DASH.example.com:443", True),
        ("http://localhost:3000", True),
        ("http://localhost", False),  # another port
        ("http://dash.example.com", False),  # another scheme
        ("https://dash.example.com:8443", False),
        ("https://dash.example.com.evil.example", False),
        ("null", False),
    ],
)
async def test_allowed_origins_match_as_origins(origin: str, allowed: bool) -> None:
    preflight = {"host": "localhost", "origin": origin, "access-control-request-method": "POST"}
    async with serving(PORTS + LISTED + POOLS) as app, connect(app) as c:
        c.send("OPTIONS", SUBMIT, preflight)
        status, headers = await c.head()
        assert status == 204
        assert headers.get("access-control-allow-origin") == (origin if allowed else None)
        answer = await c.call(SUBMIT, submit(), origin=origin)  # the actual request: the same
        assert answer.code == 0
        assert answer.headers.get("access-control-allow-origin") == (origin if allowed else None)


async def test_a_watch_sends_its_headers_before_any_event() -> None:
    """The headers come while no event has happened, and mean the stream is subscribed: the
    task submitted after them is the first event."""
    async with serving(PORTS + LISTED + POOLS) as app, connect(app) as watcher, connect(app) as c:
        request = pb.WatchRequest(pools=["a"], all_transitions=True)
        headers = {"host": "localhost", "content-type": BINARY}
        watcher.send("POST", WATCH, headers, grpcweb.frame(request.SerializeToString()))
        status, head = await asyncio.wait_for(watcher.head(), HANG_GUARD_S)
        assert (status, head["transfer-encoding"], head["content-type"]) == (200, "chunked", BINARY)
        assert "grpc-status" not in head
        answer = await c.call(SUBMIT, submit(pool="a"))
        task_id = pb.SubmitResponse.FromString(answer.messages[0]).id
        [(flag, data)] = grpcweb.split_frames(await watcher.chunk())
        event = pb.StatusEvent.FromString(data)
        assert (flag, event.id) == (grpcweb.MESSAGE, task_id)


async def test_a_native_watch_sends_its_initial_metadata_before_any_event() -> None:
    async with (
        serving(PORTS + POOLS) as app,
        grpc.aio.insecure_channel(str(app.grpc_address)) as channel,
    ):
        tasks = cronoq_pb2_grpc.TasksStub(channel)
        call = tasks.Watch(pb.WatchRequest(pools=["b"], all_transitions=True))
        await asyncio.wait_for(call.initial_metadata(), HANG_GUARD_S)
        sent = await tasks.Submit(submit(pool="b"))
        event = await call.read()
        assert event.id == sent.id
        call.cancel()
