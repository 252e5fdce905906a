"""The HTTP listener (docs/http.md) of a real in-process server, over real sockets.

Each test builds the server as the command does (`wiring.build`) on ports 0 and talks to it
with aiohttp's client: our own extras (the `json` field, the older `/batch`, `/cancel` and `/wait`
routes, recurring writes) with the published answers, the Host check, the body limit, a SQLite
standby (503 and `/readyz`), the metrics (parsed with prometheus_client's parser), the
authentication slot, the OpenAPI document and slow clients. The published routes and shapes
field by field are test_server_http_api.py's. A raw gRPC worker stream completes tasks where a
test needs an output.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.app import ServerApp, served_routes
from cronoq.server.config import load_config
from cronoq.server.fronts import http_api as http_listener
from cronoq.server.fronts.http_api import RECYCLE_S, ROUTES, STANDBY_REASON
from cronoq.server.fronts.routes import HttpError, Route
from cronoq.server.hosts import loopback_host
from cronoq.server.wiring import build
from helpers.vclock import VirtualEventLoop
from helpers.waiting import until
from helpers.workers import Worker

PORTS0 = """
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 0.1
"""


class Client:
    """JSON requests to one app's HTTP listener: each answer as (status, decoded body)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def request(self, verb: str, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.request(verb, self.base + path, **kw) as r:
            body = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, body

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return await self.request("POST", path, json=body, **kw)


@contextlib.asynccontextmanager
async def running(app: ServerApp, *, ready: bool = True) -> AsyncIterator[Client]:
    stop = asyncio.Event()
    serving = asyncio.create_task(app.serve(stop))
    while app.http_address is None or (ready and not app.ready):
        assert not serving.done(), serving.exception()
        await asyncio.sleep(0.01)
    try:
        async with aiohttp.ClientSession() as session:
            yield Client(session, f"http://{app.http_address}")
    finally:
        stop.set()
        await serving


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- the routes -------------------------------------------------------------------------------


async def test_health_readiness_and_the_openapi_document() -> None:
    async with running(build(load_config(PORTS0))) as c:
        assert await c.get("/healthz") == (200, "ok")
        assert await c.get("/readyz") == (200, "ready")
        status, doc = await c.get("/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    listed = {(verb.upper(), path) for path, ops in doc["paths"].items() for verb in ops}
    assert listed == {(r.verb, r.path) for r in ROUTES}
    for route in ROUTES:
        op = doc["paths"][route.path][route.verb.lower()]
        assert "200" in op["responses"]
        if route.verb == "POST" and route.path.endswith(("tasks", "batch", "recurring")):
            assert "requestBody" in op, route


async def test_submit_get_list_wait_cancel_and_workers() -> None:
    app = build(load_config(PORTS0))
    async with running(app) as c:
        spec = {"json": {"x": 1}, "key": "k1", "priority": "high", "tags": {"t": "v"}}
        status, first = await c.post("/v1/tasks", spec)
        assert status == 200 and first["duplicate"] is False and set(first) == {"id", "duplicate"}
        assert isinstance(first["id"], str) and int(first["id"]) > 0
        assert await c.post("/v1/tasks", spec) == (200, {**first, "duplicate": True})

        status, info = await c.get(f"/v1/tasks/{first['id']}")
        assert status == 200
        assert (info["id"], info["status"], info["priority"], info["key"]) == (
            first["id"],
            "ready",
            "high",
            "k1",
        )
        assert isinstance(info["created_unix_ns"], str) and "started_unix_ns" not in info
        assert (await c.get("/v1/tasks/by-key/k1"))[1] == info

        batch = {
            "tasks": [
                {"payload_b64": b64(b"raw"), "key": "b1", "priority": "PRIORITY_LOW"},
                {"json": [1], "deps": [{"target": {"key": "b1"}, "cond": "on_complete"}]},
            ]
        }
        status, answer = await c.post("/v1/tasks/batch", batch)
        assert status == 200 and [t["duplicate"] for t in answer["tasks"]] == [False, False]
        b1, b2 = (t["id"] for t in answer["tasks"])
        assert (await c.get(f"/v1/tasks/{b2}"))[1]["status"] == "blocked"

        status, page = await c.get("/v1/tasks", params={"status": "ready", "limit": "1"})
        assert status == 200 and [t["id"] for t in page["tasks"]] == [first["id"]]
        assert page["next_after"] == first["id"] and "unavailable_shards" not in page
        params = {"status": "ready,blocked", "pool": "default"}
        status, page = await c.get("/v1/tasks", params=params)
        assert [t["id"] for t in page["tasks"]] == [first["id"], b1, b2]
        assert "next_after" not in page

        status, error = await c.get(f"/v1/tasks/{first['id']}/wait", params={"timeout_s": "0.05"})
        assert (status, error["code"]) == (504, "gateway_timeout")

        async with grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
            worker = Worker(channel)
            await worker.register("default")
            lease = await worker.lease()  # the high-priority task first
            assert (lease.task_id, lease.payload) == (int(first["id"]), b'{"x":1}')
            assert lease.content_type == "application/json" and lease.tags["t"] == "v"
            status, workers = await c.get("/v1/workers")
            assert status == 200 and len(workers["workers"]) == 1
            assert isinstance(workers["workers"][0]["id"], str)
            assert workers["workers"][0]["busy"] == 1
            worker.send(complete=pb.Complete(lease=lease.lease, output=b"done"))
            status, result = await c.get("/v1/tasks/by-key/k1/wait", params={"timeout_s": "2"})
            assert status == 200
            assert result == {
                "id": first["id"],
                "status": "succeeded",
                "output_b64": b64(b"done"),
                "output_available": True,
            }
            lease = await worker.lease()
            assert lease.task_id == int(b1) and lease.payload == b"raw"

            assert await c.post(f"/v1/tasks/{b2}/cancel") == (200, {"cancelled": True})
            assert await c.post("/v1/tasks/by-key/b1/cancel") == (200, {"cancelled": True})
            assert await c.post(f"/v1/tasks/{b2}/cancel") == (200, {"cancelled": False})
            # an unknown task, as one that has ended (gRPC Cancel answers OK too)
            assert await c.post("/v1/tasks/987654/cancel") == (200, {"cancelled": False})
            status, result = await c.get(f"/v1/tasks/{b2}/wait")
            assert (status, result["status"], "output_b64" in result) == (200, "cancelled", False)
            worker.outbox.put_nowait(None)

        status, snap = await c.get("/v1/snapshot")
        assert status == 200 and [p["name"] for p in snap["pools"]] == ["default"]
        totals = snap["totals"]
        assert (totals["submitted"], totals["succeeded"], totals["cancelled"]) == (3, 1, 2)
        assert len(snap["pools"][0]["pending_by_class"]) == 4
        assert all(isinstance(n, int) for n in snap["pools"][0]["pending_by_class"])


async def test_recurring_schedules() -> None:
    async with running(build(load_config(PORTS0))) as c:
        schedule = {
            "name": "nightly",
            "cron": "0 3 * * *",
            "tz": "Europe/Paris",
            "template": {"json": {"report": True}, "kind": "report"},
            "overlap": "queue",
        }
        assert await c.post("/v1/recurring", schedule) == (200, {})
        status, listing = await c.get("/v1/recurring")
        assert status == 200
        [info] = listing["schedules"]
        assert (info["name"], info["tz"], info["kind"], info["overlap"]) == (
            "nightly",
            "Europe/Paris",
            "report",
            "queue",
        )
        assert isinstance(info["next_unix_ns"], str) and "last_task_id" not in info
        status, error = await c.post("/v1/recurring", {**schedule, "cron": "not a cron"})
        assert (status, error["code"]) == (400, "bad_request")
        assert await c.request("DELETE", "/v1/recurring/nightly") == (200, {"removed": True})
        assert await c.request("DELETE", "/v1/recurring/nightly") == (200, {"removed": False})


@pytest.mark.parametrize(
    ("verb", "path", "body", "status", "code"),
    [
        ("GET", "/v1/tasks/999999", None, 404, "not_found"),
        ("GET", "/v1/tasks/by-key/nobody", None, 404, "not_found"),
        ("GET", "/v1/tasks/99999999999999999999999", None, 400, "bad_request"),
        ("POST", "/v1/tasks", {"pool": "nope"}, 404, "not_found"),
        ("POST", "/v1/tasks", {"priority": "urgent"}, 400, "bad_request"),
        ("POST", "/v1/tasks", {"payload": "eA==", "json": 1}, 400, "bad_request"),
        ("POST", "/v1/tasks", {"tags": {"cronoq.x": "y"}}, 400, "bad_request"),
        ("POST", "/v1/tasks", {"nonsense": 1}, 400, "bad_request"),
        ("POST", "/v1/tasks", [1, 2], 400, "bad_request"),
        ("POST", "/v1/tasks/batch", {"tasks": [{"key": "a"}, {"key": "a"}]}, 400, "bad_request"),
        ("GET", "/v1/tasks?status=sleeping", None, 400, "bad_request"),
        ("GET", "/v1/tasks/1/wait?timeout_s=-1", None, 400, "bad_request"),
        ("GET", "/v1/nowhere", None, 404, "not_found"),
        ("DELETE", "/v1/tasks", None, 405, "method_not_allowed"),
    ],
)
async def test_refusals_are_json_errors(
    verb: str, path: str, body: Any, status: int, code: str
) -> None:
    async with running(build(load_config(PORTS0))) as c:
        got, answer = await c.request(verb, path, json=body)
    assert got == status, answer
    assert set(answer) == {"error", "code"} and isinstance(answer["error"], str)
    assert answer["code"] == code


async def test_a_payload_over_max_message_bytes_is_400_out_of_range() -> None:
    """The HTTP body limit is another: a body it allows may carry a payload over
    `limits.max_message_bytes`, refused as over gRPC (docs/http.md, "Errors")."""
    config = PORTS0 + "[limits]\nmax_message_bytes = 4096\n"
    async with running(build(load_config(config))) as c:
        payload = base64.b64encode(b"x" * 4097).decode()
        status, answer = await c.post("/v1/tasks", {"payload_b64": payload})
    assert (status, answer["code"]) == (400, "bad_request"), answer
    assert "max_message_bytes=4096" in answer["error"]


async def test_a_method_the_path_does_not_take_is_405_with_allow() -> None:
    async with (
        running(build(load_config(PORTS0))) as c,
        c.session.request("DELETE", c.base + "/v1/tasks") as r,
    ):
        assert r.status == 405
        assert (await r.json())["code"] == "method_not_allowed"
        allowed = {m.strip() for m in r.headers["Allow"].split(",")}
    assert {"GET", "POST"} <= allowed and "DELETE" not in allowed


async def test_bad_json_is_400() -> None:
    async with running(build(load_config(PORTS0))) as c:
        headers = {"Content-Type": "application/json"}
        status, answer = await c.request("POST", "/v1/tasks", data=b"{nope", headers=headers)
    assert (status, answer["code"]) == (400, "bad_request")
    assert "not JSON" in answer["error"]


async def test_a_traceparent_header_becomes_the_task_tag() -> None:
    app = build(load_config(PORTS0))
    async with running(app) as c:
        trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        _, first = await c.post("/v1/tasks", {}, headers={"traceparent": trace})
        async with grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
            worker = Worker(channel)
            await worker.register("default")
            lease = await worker.lease()
            worker.outbox.put_nowait(None)
    assert lease.task_id == int(first["id"]) and lease.tags["traceparent"] == trace


# --- Host check, body limit ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("localhost", True),
        ("LOCALHOST:7071", True),
        ("localhost.", True),
        ("app.localhost:3000", True),
        ("127.0.0.1:1", True),
        ("127.1.2.3", True),
        ("[::1]", True),
        ("[::1]:7071", True),
        ("::1", True),  # bare, as no client sends it: still nobody else's name
        ("evil.example", False),
        ("evil.example:7071", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
        ("[::2]:80", False),
        ("localhost:x", False),
        ("[::1", False),
        ("", False),
    ],
)
def test_loopback_host_names(host: str, ok: bool) -> None:
    assert loopback_host(host) is ok


async def test_host_check_with_auth_off_on_loopback() -> None:
    async with running(build(load_config(PORTS0))) as c:
        status, answer = await c.get("/v1/snapshot", headers={"Host": "evil.example"})
        assert (status, answer["code"]) == (403, "forbidden")
        assert await c.get("/healthz", headers={"Host": "evil.example:80"}) == (200, "ok")
        port = c.base.rsplit(":", 1)[1]
        assert (await c.get("/v1/snapshot", headers={"Host": f"127.0.0.1:{port}"}))[0] == 200
        assert (await c.get("/v1/snapshot", headers={"Host": "localhost"}))[0] == 200


async def test_body_limit_refuses_before_parsing() -> None:
    cfg = load_config(PORTS0 + "[limits]\nmax_http_body_bytes = 4096\n")
    async with running(build(cfg)) as c:
        status, answer = await c.request("POST", "/v1/tasks", data=b"x" * 4097)  # nor JSON
        assert (status, answer["code"]) == (413, "payload_too_large")

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: cut off while read
            for _ in range(10):
                yield b"y" * 1024

        headers = {"Content-Type": "application/json"}
        status, answer = await c.request("POST", "/v1/tasks", data=chunks(), headers=headers)
        assert (status, answer["code"]) == (413, "payload_too_large")
        status, _ = await c.post("/v1/tasks", {"json": "x" * 20})
        assert status == 200


# --- standby, metrics ---------------------------------------------------------------------------


async def test_a_standby_answers_503_until_it_leads(tmp_path: Path) -> None:
    cfg = load_config(PORTS0 + f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q.db"\n')
    leader = build(cfg)
    async with running(leader) as lc:
        assert (await lc.post("/v1/tasks", {"key": "before"}))[0] == 200
        standby = build(cfg)
        async with running(standby, ready=False) as sc:
            assert await sc.get("/healthz") == (200, "ok")
            assert await sc.get("/readyz") == (503, "standby")
            api = [("POST", "/v1/tasks"), ("GET", "/v1/snapshot"), ("GET", "/v1/tasks/1")]
            api.append(("GET", "/metrics"))  # a standby's scrape fails
            for verb, path in api:
                status, answer = await sc.request(verb, path, json={})
                assert (status, answer["code"]) == (503, "service_unavailable"), path
                assert "standby" in answer["error"]

            stopping = asyncio.create_task(leader.stop())  # hands the file over at once
            await asyncio.sleep(0)
            assert await lc.get("/readyz") == (503, "standby")
            await stopping
            for _ in range(100):
                if standby.ready:
                    break
                await asyncio.sleep(0.05)
            assert await sc.get("/readyz") == (200, "ready")
            status, info = await sc.get("/v1/tasks/by-key/before")
            assert (status, info["status"]) == (200, "ready")


async def test_a_standby_says_why_and_closes_its_connections(tmp_path: Path) -> None:
    """docs/http.md, "Health and readiness" and "Connections on a standby", on a SQLite
    standby: /readyz keeps its status and body and says why in a header; a connection is closed
    once about a second old, used or idle; the leader's are kept."""
    cfg = load_config(PORTS0 + f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q.db"\n')
    leader = build(cfg)
    async with running(leader) as lc:
        standby = build(cfg)
        async with running(standby, ready=False) as sc:
            async with sc.session.get(sc.base + "/readyz") as r:
                assert (r.status, await r.text()) == (503, "standby")
                assert r.headers[STANDBY_REASON] == "waiting for the leadership"
            async with lc.session.get(lc.base + "/readyz") as r:
                assert r.status == 200 and STANDBY_REASON not in r.headers
            host, port = str(standby.http_address).rsplit(":", 1)
            began = asyncio.get_running_loop().time()
            used = await asyncio.open_connection(host, int(port))
            idle = await asyncio.open_connection(host, int(port))
            used[1].write(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = await asyncio.wait_for(used[0].read(), 3.0)  # all of it, until closed
            assert answer.startswith(b"HTTP/1.1 503 ") and answer.endswith(b"standby")
            assert await asyncio.wait_for(idle[0].read(), 3.0) == b""
            assert asyncio.get_running_loop().time() - began >= RECYCLE_S
            for _, writer in (used, idle):
                writer.close()


async def test_a_server_that_loses_the_leadership_answers_then_closes_its_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait in flight when the leadership goes is answered (503), with `Connection: close`
    on a connection due for recycling (here every one: RECYCLE_S is 0), then closed."""
    monkeypatch.setattr(http_listener, "RECYCLE_S", 0.0)
    db = tmp_path / "q.db"
    store = f'[store]\nkind = "sqlite"\npath = "{db}"\nleader_lease_s = 1\n'
    app = build(load_config(PORTS0 + store))
    async with running(app) as c:
        status, task = await c.post("/v1/tasks", {"key": "waiting"})
        assert status == 200
        host, port = str(app.http_address).rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"GET /v1/tasks/{task['id']}/result?timeout_s=30 HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\n\r\n".encode()
        )
        await writer.drain()
        with sqlite3.connect(db) as other:  # another process takes the file over
            other.execute(
                "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'intruder', "
                "expires_unix_ns = 0"
            )
        answer = await asyncio.wait_for(reader.read(), 5.0)  # until closed
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in answer
        writer.close()


async def test_metrics_exposition() -> None:
    cfg = load_config(
        PORTS0
        + 'metrics_addr = "127.0.0.1:0"\n'
        + '[[pools]]\nname = "default"\n[[pools]]\nname = "gpu"\n'
    )
    app = build(cfg)
    async with running(app) as c:
        for priority in ("high", "high", "low"):
            assert (await c.post("/v1/tasks", {"priority": priority}))[0] == 200
        async with c.session.get(c.base + "/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await r.text()
        metrics_base = f"http://{app.metrics_address}"
        async with c.session.get(metrics_base + "/metrics") as r:
            assert r.status == 200 and "cronoq_pending_tasks 3.0" in await r.text()
        async with c.session.get(metrics_base + "/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok")  # probes on the metrics port too
        async with c.session.get(metrics_base + "/v1/snapshot") as r:
            assert (r.status, await r.read()) == (404, b"")  # and nothing else
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["cronoq_tasks"].type == "counter"  # the parser drops `_total`
    ended = {s.labels["status"]: s.value for s in families["cronoq_tasks"].samples}
    assert ended["succeeded"] == 0 and len(ended) == 7
    assert families["cronoq_tasks_submitted"].samples[0].value == 3
    pending = {
        (s.labels["pool"], s.labels["class"]): s.value
        for s in families["cronoq_pool_pending"].samples
    }
    assert pending[("default", "high")] == 2 and pending[("default", "low")] == 1
    assert pending[("gpu", "critical")] == 0 and len(pending) == 8
    quantiles = {s.labels["quantile"] for s in families["cronoq_pool_wait_seconds"].samples}
    assert quantiles == {"0.5", "0.9", "0.99"}
    for name in ("cronoq_up", "cronoq_leader", "cronoq_live_tasks", "cronoq_workers_connected"):
        assert families[name].type == "gauge"
    assert families["cronoq_leader"].samples[0].value == 1
    for name in ("workers", "busy_workers", "held_workers", "desired_workers", "utilization"):
        assert [s.labels["pool"] for s in families[f"cronoq_pool_{name}"].samples] == [
            "default",
            "gpu",
        ]
    assert families["cronoq_pool_cost"].type == "counter"  # cronoq_pool_cost_total


async def test_metrics_report_worker_groups() -> None:
    app = build(load_config(PORTS0))
    async with running(app) as c, grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
        worker = Worker(channel)
        reg = pb.Register(
            pool="default", slots=2, worker_name="w", protocol_version=3, labels={"gpu": "a100"}
        )
        worker.outbox.put_nowait(pb.WorkerMessage(register=reg))
        await worker.recv()
        _, text = await c.get("/metrics")
        worker.outbox.put_nowait(None)
    samples = {
        (s.name, s.labels.get("labels")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("cronoq_group_capacity", "gpu=a100")] == 2
    assert samples[("cronoq_workers_connected", None)] == 1


# --- the authentication slot --------------------------------------------------------------------


async def test_the_authorize_slot_runs_before_readiness_and_the_body() -> None:
    seen: list[str | None] = []

    async def authorize(request: web.Request, route: Route) -> None:
        seen.append(route.method)
        if request.headers.get("Authorization") != "Bearer good":
            raise HttpError(401, "missing credentials")

    cfg = load_config(PORTS0 + "[limits]\nmax_http_body_bytes = 4096\n")
    app = ServerApp(cfg, http_authorize=authorize)  # no services registered
    async with running(app) as c:
        assert (await c.get("/healthz"))[0] == 200
        status, answer = await c.request("POST", "/v1/tasks", data=b"x" * 5000)
        assert (status, answer["code"]) == (401, "unauthorized")
        good = {"Authorization": "Bearer good"}
        assert (await c.request("POST", "/v1/tasks", data=b"x" * 5000, headers=good))[0] == 413
        status, answer = await c.post("/v1/tasks", {}, headers=good)
        assert (status, answer["code"]) == (501, "not_implemented")
        assert (await c.get("/metrics"))[0] == 401
    assert seen == [
        "/cronoq.v1.Tasks/Submit",
        "/cronoq.v1.Tasks/Submit",
        "/cronoq.v1.Tasks/Submit",
        "/cronoq.v1.Admin/Snapshot",
    ]


# --- slow clients (docs/http.md, "Timeouts") ----------------------------------------------------

# Reading a request gets limits.request_timeout_s: kept short here, so that the tests see it run
# out; what they assert is the outcome (the 408, the close), never how long it took.
SLOW = PORTS0 + 'metrics_addr = "127.0.0.1:0"\n[limits]\nrequest_timeout_s = 0.5\n'
HANG_GUARD_S = 5.0  # far past any timeout configured here: only a hang reaches it


Raw = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def raw_request(verb: str, path: str, body: bytes = b"", length: int | None = None) -> bytes:
    """An HTTP/1.1 request (keep-alive) with a loopback Host; `length` overrides the declared
    Content-Length of `body`."""
    declared = len(body) if length is None else length
    head = f"{verb} {path} HTTP/1.1\r\nHost: localhost\r\n"
    if declared or verb == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {declared}\r\n"
    return (head + "\r\n").encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    """One answer from a raw connection: status, headers (lower-case names), the body decoded
    (JSON, or text)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG_GUARD_S)
    status_line, *lines = head.decode("latin-1").strip().split("\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines)
    }
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), HANG_GUARD_S)
    is_json = headers.get("content-type") == "application/json"
    decoded = (json.loads(body) if is_json else body.decode()) if body else None
    return int(status_line.split()[1]), headers, decoded


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server still sends before it closes the connection (b"" for nothing); fails the
    test if the connection is still open at the hang guard."""
    try:
        return await asyncio.wait_for(reader.read(), HANG_GUARD_S)
    except ConnectionResetError:
        return b""
    except TimeoutError:
        pytest.fail("the server kept the connection open")


@contextlib.asynccontextmanager
async def connection(address: Any) -> AsyncIterator[Raw]:
    reader, writer = await asyncio.open_connection(address.host, address.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def trickle(writer: asyncio.StreamWriter, data: bytes, sent: list[int]) -> None:
    """A slow client: `data` a byte at a time, 20 bytes a second, until the server hangs up."""
    with contextlib.suppress(ConnectionError):
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            await writer.drain()
            sent.append(1)
            await asyncio.sleep(0.05)  # the pace of the slow client, not a wait for anything


def assert_408(status: int, headers: dict[str, str], body: Any, read_s: float = 0.5) -> None:
    assert status == 408
    assert headers["connection"].lower() == "close"
    assert body["code"] == "request_timeout"
    assert f"limits.request_timeout_s ({read_s:g} s)" in body["error"]


async def test_a_declared_body_that_never_comes_is_408_and_the_connection_closes() -> None:
    app = build(load_config(SLOW))
    async with running(app) as c:
        async with connection(app.http_address) as (reader, writer):
            writer.write(raw_request("POST", "/v1/tasks", length=100))  # and no body
            assert_408(*await read_answer(reader))
            assert await closed_by_server(reader) == b""
        assert (await c.get("/v1/tasks"))[1]["tasks"] == []  # nothing was submitted


@pytest.mark.virtual_time
async def test_a_stalled_body_gets_the_408_and_the_close_at_the_timeout_on_every_route() -> None:
    """On every route that reads a body: headers with a Content-Length, part of the body, then
    nothing. The 408 comes at request_timeout_s and the close right with it, not after a
    lingering read of the rest (which kept a connection of the default 30 s for 40 s). On the
    virtual clock, which jumps only for the timers (the server's own starts and stops in real
    time: grpcio's threads are no timers), so the times compared are exact."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualEventLoop)
    read_s = 2.0
    loop.autojump = False
    app = build(load_config(PORTS0 + f"[limits]\nrequest_timeout_s = {read_s}\n"))
    async with running(app) as c:
        routes = [r for r in served_routes(True) if not r.probe]
        assert {"/v1/tasks", "/v1/tasks:batch", "/v1/recurring"} <= {r.path for r in routes}

        async def stall(route: Route) -> tuple[Route, float, float, bytes]:
            path = route.path.replace("{id}", "1").replace("{key}", "k").replace("{name}", "n")
            path = path.replace("{pool}", "p")
            async with connection(app.http_address) as (reader, writer):
                sent = loop.time()
                writer.write(raw_request(route.verb, path, b'{"key": "stall', length=100))
                status, headers, body = await read_answer(reader)
                answered = loop.time()
                assert_408(status, headers, body, read_s)
                rest = await closed_by_server(reader)
                return route, answered - sent, loop.time() - answered, rest

        before = set(_request_handlers())
        loop.autojump = True
        try:
            outcomes = await asyncio.gather(*(stall(route) for route in routes))
        finally:
            loop.autojump = False
        for route, answered_s, closed_s, rest in outcomes:
            assert read_s <= answered_s < read_s * 1.5, (route, answered_s)
            assert closed_s < read_s / 2 and rest == b"", (route, closed_s)  # 0 here, else read_s
        # nothing of those requests is left running, and nothing was carried out
        await until(
            lambda: not set(_request_handlers()) - before,
            what="the stalled connections' handlers to end",
        )
        assert (await c.get("/v1/tasks"))[1]["tasks"] == []
        assert (await c.get("/v1/recurring"))[1]["schedules"] == []


def _request_handlers() -> list[asyncio.Task[Any]]:
    """The asyncio tasks of the server's connection handlers (aiohttp's), one per connection."""
    return [
        t
        for t in asyncio.all_tasks()
        if "RequestHandler.start" in t.get_coro().__qualname__  # type: ignore[union-attr]
    ]


async def test_a_body_trickled_past_the_timeout_is_408() -> None:
    app = build(load_config(SLOW))
    async with running(app) as c, connection(app.http_address) as (reader, writer):
        body = json.dumps({"key": "slow", "kind": " " * 100}).encode()
        writer.write(raw_request("POST", "/v1/tasks", length=len(body)))
        sent: list[int] = []
        slow = asyncio.create_task(trickle(writer, body, sent))
        try:
            assert_408(*await read_answer(reader))
            assert len(sent) < len(body)  # cut off while the body was still coming
            await closed_by_server(reader)
        finally:
            slow.cancel()
        assert (await c.get("/v1/tasks/by-key/slow"))[0] == 404


async def test_headers_that_never_complete_get_the_connection_closed() -> None:
    app = build(load_config(SLOW))
    async with running(app):
        async with connection(app.http_address) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: local")  # and nothing more
            assert await closed_by_server(reader) == b""
        async with connection(app.metrics_address) as (reader, writer):
            writer.write(b"GET /metr")
            assert await closed_by_server(reader) == b""
        # bytes that keep coming do not push the deadline back
        async with connection(app.http_address) as (reader, writer):
            sent: list[int] = []
            header = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200
            slow = asyncio.create_task(trickle(writer, header, sent))
            try:
                assert await closed_by_server(reader) == b""
                assert len(sent) < len(header)
            finally:
                slow.cancel()


async def test_an_idle_keep_alive_connection_is_closed() -> None:
    app = build(load_config(SLOW))
    async with running(app):
        for address, path in ((app.http_address, "/healthz"), (app.metrics_address, "/metrics")):
            async with connection(address) as (reader, writer):
                writer.write(raw_request("GET", path))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG_GUARD_S)
                assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
                # kept alive, then closed while idle: the rest of the answer and nothing more
                rest = await closed_by_server(reader)
                assert b"HTTP/1.1" not in rest


async def test_reading_is_timed_waits_are_not() -> None:
    """Under the same short request_timeout_s: normal requests work, and a wait (GET .../wait,
    Submit with wait) that outlasts it on a keep-alive connection gets its answer there."""
    app = build(load_config(SLOW))
    async with (
        running(app) as c,
        grpc.aio.insecure_channel(str(app.grpc_address)) as channel,
        connection(app.http_address) as (reader, writer),
        connection(app.http_address) as (reader2, writer2),
    ):
        writer.write(raw_request("POST", "/v1/tasks", json.dumps({"key": "a"}).encode()))
        status, headers, first = await read_answer(reader)
        assert status == 200 and "connection" not in headers
        writer.write(raw_request("GET", f"/v1/tasks/{first['id']}/wait?timeout_s=8"))
        submit_wait = {"key": "b", "wait": True, "wait_timeout_s": 8}
        writer2.write(raw_request("POST", "/v1/tasks", json.dumps(submit_wait).encode()))

        worker = Worker(channel)
        await worker.register("default", slots=2)
        leases = [await worker.lease(), await worker.lease()]  # both tasks are in
        for _ in range(2):  # request_timeout_s runs out twice meanwhile, seen on idle connections
            async with connection(app.http_address) as (idle, _):
                assert await closed_by_server(idle) == b""
        for lease in leases:
            worker.send(complete=pb.Complete(lease=lease.lease, output=b"ok"))

        status, _, result = await read_answer(reader)
        assert (status, result["id"], result["status"]) == (200, first["id"], "succeeded")
        status, _, submitted = await read_answer(reader2)
        assert status == 200 and submitted["result"]["status"] == "succeeded"
        writer.write(raw_request("GET", "/healthz"))  # the connection still serves
        assert (await read_answer(reader))[0::2] == (200, "ok")
        assert (await c.get("/v1/tasks/by-key/b"))[1]["status"] == "succeeded"
        worker.close()


async def test_bad_bodies_still_get_clear_errors_under_the_read_timeout() -> None:
    app = build(load_config(SLOW))
    async with running(app) as c, connection(app.http_address) as (reader, writer):
        writer.write(raw_request("POST", "/v1/tasks", b"{nope"))
        status, headers, answer = await read_answer(reader)
        assert (status, answer["code"]) == (400, "bad_request")
        assert "not JSON" in answer["error"] and "connection" not in headers
        # a body in two parts, both in time: read whole, nothing lost
        body = json.dumps({"key": "halves", "json": {"n": 12345}}).encode()
        writer.write(raw_request("POST", "/v1/tasks", body[:10], length=len(body)))
        await writer.drain()
        writer.write(body[10:])
        status, _, submitted = await read_answer(reader)
        assert status == 200
        _, info = await c.get(f"/v1/tasks/{submitted['id']}")
        assert info["key"] == "halves"
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        status, answer = await c.request("POST", "/v1/tasks", data=b"not gzip", headers=headers)
        assert status == 400, answer
        assert answer["code"] == "bad_request"
        assert "gzip" in answer["error"]
