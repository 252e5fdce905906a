"""The dashboard's routes over a real listener (docs/dashboard.md, "The dashboard's API")."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import aiohttp
import grpc
import pytest
from test_server_http import PORTS0, b64, running

from cronoq.client import Lease
from cronoq.client import Worker as ClientWorker
from cronoq.core.engine import EVENTS_NONE
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server import app as app_module
from cronoq.server.config import ConfigError, load_config
from cronoq.server.history import Reading
from cronoq.server.metrics import BUCKETS
from cronoq.server.wiring import build
from helpers.auth import CONFIG as AUTH_CONFIG
from helpers.auth import token
from helpers.waiting import until
from helpers.workers import Worker

OCTET = "application/octet-stream"


async def test_static_files_carry_the_security_headers() -> None:
    async with running(build(load_config(PORTS0))) as c:
        async with c.session.get(c.base + "/") as r:
            assert r.status == 200 and r.content_type == "text/html"
            assert r.headers["Cache-Control"] == "no-cache"
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            assert r.headers["Referrer-Policy"] == "no-referrer"
        for path in ("/ui/missing.js", "/ui/__init__.py", "/ui/..%2Fhttp.py", "/ui/.x.js"):
            status, _ = await c.get(path)
            assert status == 404, path
        status, _ = await c.get("/ui/index.html", headers={"Host": "evil.example"})
        assert status == 403


async def test_info_and_shards_without_sharding() -> None:
    async with running(build(load_config(PORTS0))) as c:
        status, body = await c.get("/ui/api/info")
        assert status == 200 and body["auth"] is False and body["dashboard"] is True
        assert await c.get("/ui/api/shards") == (200, {"shard": None, "shards": []})


async def test_dashboard_off_answers_404() -> None:
    off = PORTS0.replace("[server]\n", "[server]\ndashboard = false\n")
    async with running(build(load_config(off))) as c:
        for path in ("/", "/ui/index.html", "/ui/api/info"):
            status, _ = await c.get(path)
            assert status == 404, path


def test_dashboard_must_be_a_boolean() -> None:
    bad = PORTS0.replace("[server]\n", '[server]\ndashboard = "yes"\n')
    with pytest.raises(ConfigError, match="dashboard"):
        load_config(bad)


# --- task detail --------------------------------------------------------------------------------


async def test_detail_previews_json_text_and_bytes_payloads() -> None:
    async with running(build(load_config(PORTS0))) as c:
        _, j = await c.post("/v1/tasks", {"payload": {"a": [1, 2]}, "kind": "k"})
        _, t = await c.post("/v1/tasks", {"payload_b64": b64(b"hi"), "content_type": "text/plain"})
        raw = bytes(range(256)) * 3
        _, b = await c.post("/v1/tasks", {"payload_b64": b64(raw)})
        status, detail = await c.get(f"/ui/api/tasks/{j['id']}")
        assert status == 200
        assert detail["task"] == (await c.get(f"/v1/tasks/{j['id']}"))[1]
        assert detail["payload"] == {
            "size": 11,
            "content_type": "application/json",
            "json": {"a": [1, 2]},
            "hex": b'{"a":[1,2]}'.hex(),
            "truncated": False,
        }
        assert detail["output"] is None and detail["attempts"] == []
        assert detail["parents"] == [] and detail["children"] == []
        assert detail["spec"]["content_type"] == "application/json"
        assert detail["spec"]["priority"] == "normal" and detail["spec"]["retry"] is None
        _, text = await c.get(f"/ui/api/tasks/{t['id']}")
        assert text["payload"]["text"] == "hi" and "json" not in text["payload"]
        _, data = await c.get(f"/ui/api/tasks/{b['id']}")
        preview = data["payload"]
        assert preview["size"] == 768 and preview["truncated"] is True
        assert preview["hex"] == raw[:512].hex() and preview["content_type"] == OCTET
        assert "text" not in preview and "json" not in preview
        assert (await c.get("/ui/api/tasks/987654"))[0] == 404
        assert (await c.get("/ui/api/tasks/nope"))[0] == 400


async def test_detail_of_dependencies_outputs_and_attempts() -> None:
    app = build(load_config(PORTS0))
    async with running(app) as c, grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
        _, parent = await c.post("/v1/tasks", {"key": "p", "payload": 1})
        _, child = await c.post(
            "/v1/tasks", {"key": "c", "payload": 2, "deps": [{"key": "p", "cond": "on_complete"}]}
        )
        _, up = await c.get(f"/ui/api/tasks/{parent['id']}")
        assert up["children"] == [
            {"id": child["id"], "key": "c", "condition": "on_complete", "status": "blocked"}
        ]
        _, down = await c.get(f"/ui/api/tasks/{child['id']}")
        assert down["parents"] == [
            {"id": parent["id"], "key": "p", "condition": "on_complete", "status": "ready"}
        ]
        assert down["spec"]["depends_on"] == [{"key": "p", "cond": "on_complete"}]
        worker = Worker(channel)
        await worker.register("default")
        lease = await worker.lease()
        assert lease.task_id == int(parent["id"])
        worker.send(complete=pb.Complete(lease=lease.lease, output=b'{"r":2}'))
        assert (await c.get(f"/v1/tasks/{parent['id']}/wait"))[0] == 200
        _, done = await c.get(f"/ui/api/tasks/{parent['id']}")
        assert done["output"]["json"] == {"r": 2} and done["output"]["size"] == 7
        assert done["payload"] is None and done["resubmit"] is None
        [attempt] = done["attempts"]
        assert attempt["attempt"] == 1 and attempt["status"] == "succeeded"
        assert attempt["finished_unix_ns"] == done["task"]["finished_unix_ns"]
        lease = await worker.lease()  # the child, now ready
        worker.send(complete=pb.Complete(lease=lease.lease))
        retry = {"max_attempts": 2, "initial_backoff_s": 0.001, "max_backoff_s": 0.001}
        _, flaky = await c.post("/v1/tasks", {"payload": 3, "retry": retry})
        for _ in range(2):
            lease = await worker.lease()
            assert lease.task_id == int(flaky["id"])
            worker.send(fail=pb.Fail(lease=lease.lease, message="boom"))
        assert (await c.get(f"/v1/tasks/{flaky['id']}/wait"))[0] == 200
        _, dead = await c.get(f"/ui/api/tasks/{flaky['id']}")
        assert [(a["attempt"], a["status"], a["message"]) for a in dead["attempts"]] == [
            (1, "failed", "boom"),
            (2, "dead_lettered", "boom"),
        ]
        assert dead["output"] is None
        # a dead-lettered task keeps its payload, so that it can be submitted again
        assert dead["payload"]["json"] == 3 and dead["resubmit"]["payload_b64"] == "Mw=="
        worker.close()


def _timeline(attempts: list[dict[str, Any]]) -> list[int]:
    """Each attempt's start and end (Unix ns), in the order listed."""
    return [int(a[k]) for a in attempts for k in ("started_unix_ns", "finished_unix_ns")]


async def test_detail_lists_every_attempt_of_a_task_a_remote_worker_retried() -> None:
    app = build(load_config(PORTS0))

    async def handler(lease: Lease) -> dict[str, int]:
        if lease.attempt < 3:
            raise ValueError(f"boom {lease.attempt}")
        return {"n": lease.attempt}

    retry = {"max_attempts": 3, "initial_backoff_s": 0.001, "max_backoff_s": 0.001}
    async with running(app) as c:
        worker = ClientWorker(str(app.grpc_address), "default", handler)
        serving = asyncio.create_task(worker.run())
        try:
            _, sent = await c.post("/v1/tasks", {"payload": 1, "retry": retry})
            status, done = await c.get(f"/v1/tasks/{sent['id']}/wait")
            assert status == 200 and done["status"] == "succeeded", done
        finally:
            await worker.stop(0.5)
            await serving
        _, detail = await c.get(f"/ui/api/tasks/{sent['id']}")
        attempts = detail["attempts"]
        assert [(a["attempt"], a["status"], a["message"]) for a in attempts] == [
            (1, "failed", "ValueError: boom 1"),
            (2, "failed", "ValueError: boom 2"),
            (3, "succeeded", ""),
        ]
        times = _timeline(attempts)
        assert times == sorted(times)
        assert attempts[-1]["finished_unix_ns"] == detail["task"]["finished_unix_ns"]


async def test_a_retrying_task_lists_its_ended_attempt_once() -> None:
    """While it waits for its retry, the attempt that failed is the last entry, with its end."""
    app = build(load_config(PORTS0))
    async with running(app) as c, grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
        retry = {"max_attempts": 2, "initial_backoff_s": 3600, "jitter": False}
        _, sent = await c.post("/v1/tasks", {"payload": 1, "retry": retry})
        worker = Worker(channel)
        await worker.register("default")
        lease = await worker.lease()
        worker.send(fail=pb.Fail(lease=lease.lease, message="later"))

        async def retrying() -> bool:
            return (await c.get(f"/v1/tasks/{sent['id']}"))[1]["status"] == "retrying"

        await until(retrying, 10, "the task to retry")
        _, detail = await c.get(f"/ui/api/tasks/{sent['id']}")
        [attempt] = detail["attempts"]
        assert (attempt["attempt"], attempt["status"], attempt["message"]) == (1, "failed", "later")
        assert int(attempt["finished_unix_ns"]) >= int(attempt["started_unix_ns"])
        worker.close()


async def test_resubmit_creates_a_task_with_the_same_spec() -> None:
    async with running(build(load_config(PORTS0))) as c:
        _, parent = await c.post("/v1/tasks", {"key": "first", "payload": 0})
        original = {
            "payload": {"x": [1, 2]},
            "kind": "k",
            "key": "orig",
            "priority": "high",
            "tenant": "t",
            "tags": {"a": "b"},
            "deadline_in_s": 3600,
            "timeout_s": 5,
            "start_in_s": 3600,
            "tolerance_s": 2,
            "on_miss": "skip",
            "duration_hint_s": 3,
            "retry": {"max_attempts": 4, "initial_backoff_s": 0.5, "jitter": False},
            "deps": [{"id": parent["id"], "cond": "on_failure"}],
        }
        _, sent = await c.post("/v1/tasks", original)
        _, detail = await c.get(f"/ui/api/tasks/{sent['id']}")
        spec = detail["spec"]
        assert spec["on_miss"] == "skip" and spec["timeout_s"] == 5 and spec["tenant"] == "t"
        assert spec["retry"]["max_attempts"] == 4 and spec["retry"]["jitter"] is False
        assert spec["depends_on"] == [{"id": parent["id"], "cond": "on_failure"}]
        assert "key" not in detail["resubmit"]
        status, again = await c.post("/v1/tasks", detail["resubmit"])
        assert status == 200 and again["id"] != sent["id"]
        _, copy = await c.get(f"/ui/api/tasks/{again['id']}")
        assert copy["spec"] == spec and copy["payload"] == detail["payload"]
        assert copy["resubmit"] == detail["resubmit"]
        same = ("kind", "pool", "priority", "tenant", "max_attempts")
        assert {k: copy["task"][k] for k in same} == {k: detail["task"][k] for k in same}
        assert "key" not in copy["task"]


async def test_detail_names_each_attempts_worker_and_why_its_pool_waits() -> None:
    """Every attempt carries the worker that ran it (name and the id it registered with); the
    pool of the task is given paused and unserved, as its snapshot has them."""
    config = PORTS0 + '[[pools]]\nname = "default"\n[[pools]]\nname = "idle"\nautoscale = false\n'
    app = build(load_config(config))
    async with running(app) as c, grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
        retry = {"max_attempts": 2, "initial_backoff_s": 0.001, "max_backoff_s": 0.001}
        _, sent = await c.post("/v1/tasks", {"payload": 1, "retry": retry})
        _, fresh = await c.get(f"/ui/api/tasks/{sent['id']}")
        assert fresh["attempts"] == []
        worker = Worker(channel)
        registered = await worker.register("default")
        lease = await worker.lease()
        worker.send(fail=pb.Fail(lease=lease.lease, message="once"))
        lease = await worker.lease()
        _, running_now = await c.get(f"/ui/api/tasks/{sent['id']}")
        assert running_now["attempts"][-1]["worker_name"] == "w"
        assert running_now["attempts"][-1]["finished_unix_ns"] is None
        worker.send(complete=pb.Complete(lease=lease.lease))
        assert (await c.get(f"/v1/tasks/{sent['id']}/wait"))[0] == 200
        _, done = await c.get(f"/ui/api/tasks/{sent['id']}")
        who = str(registered.worker_id)
        assert [
            (a["attempt"], a["status"], a["worker_name"], a["worker_id"]) for a in done["attempts"]
        ] == [
            (1, "failed", "w", who),
            (2, "succeeded", "w", who),
        ]
        assert done["task"]["worker_name"] == "w"
        assert done["pool"] == {"paused": False, "unserved": False, "pending": 0}
        worker.close()

        _, waiting = await c.post("/v1/tasks", {"payload": 2, "pool": "idle"})
        _, idle = await c.get(f"/ui/api/tasks/{waiting['id']}")
        assert idle["pool"] == {"paused": False, "unserved": True, "pending": 1}
        assert idle["attempts"] == []
        assert (await c.post("/v1/pools/idle/pause", {}))[0] == 200
        _, paused = await c.get(f"/ui/api/tasks/{waiting['id']}")
        assert paused["pool"] == {"paused": True, "unserved": True, "pending": 1}


# --- history ------------------------------------------------------------------------------------


def _reading(pool: str, started: int, pending: int) -> Reading:
    waits = (started,) + (0,) * len(BUCKETS)  # every start waited less than the first bound
    return Reading(pool, pending, 1, 2, 1, False, started, started, 0, 0, waits)


async def test_history_answers_each_pools_points_since_a_time() -> None:
    """The route answers `ServerApp.history` (the sampler's own steps are an hour apart here,
    so the points are those sampled below): a session's first reading is a baseline, and the
    steps a new session skipped have no point, which the page draws as a gap."""
    app = build(load_config(PORTS0 + '[[pools]]\nname = "default"\n[[pools]]\nname = "b"\n'))
    app.history.step = 3600.0
    async with running(app) as c:
        history = app.history
        history.gap()
        for t, started in ((100.0, 0), (110.0, 4), (120.0, 10)):
            history.sample(t, [_reading("default", started, 3), _reading("b", 0, 0)])
        history.gap()  # a new leader's session: the next reading is a baseline again
        for t, started in ((150.0, 0), (160.0, 7)):
            history.sample(t, [_reading("default", started, 1), _reading("b", 0, 0)])
        status, body = await c.get("/ui/api/history")
        assert status == 200 and body["step"] == 3600.0 and body["now"] > 160
        points = body["pools"]["default"]
        assert [(p["t"], p["started"], p["pending"]) for p in points] == [
            (110.0, 4, 3),
            (120.0, 6, 3),
            (160.0, 7, 1),
        ]
        assert set(points[0]) == {
            "t", "started", "succeeded", "failed", "dead_lettered", "pending", "busy",
            "capacity", "workers", "paused", "wait_p50", "wait_p90", "wait_p99",
        }  # fmt: skip
        assert points[0]["wait_p50"] is not None and set(body["pools"]) == {"default", "b"}
        status, since = await c.get("/ui/api/history?pool=default&since=110")
        assert status == 200 and [p["t"] for p in since["pools"]["default"]] == [120.0, 160.0]
        assert set(since["pools"]) == {"default"}
        for query, code in (
            ("pool=nope", 404),
            ("since=soon", 400),
            ("since=nan", 400),
            ("x=1", 400),
        ):
            assert (await c.get(f"/ui/api/history?{query}"))[0] == code, query


async def test_history_needs_the_roles_of_snapshot_and_keeps_to_the_callers_pools() -> None:
    app = build(load_config(AUTH_CONFIG))
    app.history.step = 3600.0
    async with running(app) as c:
        app.history.gap()
        for t in (1.0, 2.0):
            app.history.sample(t, [_reading("a", 0, 0), _reading("b", 0, 0)])

        async def get(who: str | None, query: str = "") -> tuple[int, Any]:
            headers = {} if who is None else {"Authorization": f"Bearer {token(who)}"}
            return await c.get(f"/ui/api/history{query}", headers=headers)

        assert (await get(None))[0] == 401
        for who in ("client", "worker"):
            assert (await get(who))[0] == 403, who
        for who in ("admin", "metrics"):
            status, body = await get(who)
            assert status == 200 and set(body["pools"]) == {"a", "b"}, who
        status, body = await get("metrics_a")
        assert status == 200 and set(body["pools"]) == {"a"}
        assert (await get("metrics_a", "?pool=b"))[0] == 403
        assert set((await get("admin_a", "?pool=a"))[1]["pools"]) == {"a"}


# --- the event stream ---------------------------------------------------------------------------


async def _data(r: aiohttp.ClientResponse) -> dict[str, Any]:
    """The next event of a stream (skipping comments and blank lines)."""
    while True:
        line = await asyncio.wait_for(r.content.readline(), 10)
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            assert (await r.content.readline()) == b"\n"
            return cast(dict[str, Any], json.loads(line[6:]))


async def _opened(r: aiohttp.ClientResponse) -> None:
    """Past the first comment: the Watch behind the stream is registered by then."""
    assert r.status == 200
    assert r.headers["Content-Type"] == "text/event-stream"
    assert r.headers["Cache-Control"] == "no-cache"
    assert await asyncio.wait_for(r.content.readline(), 10) == b": ping\n"
    assert await asyncio.wait_for(r.content.readline(), 10) == b"\n"


async def test_events_filter_by_status_and_kind_and_clean_up_on_disconnect() -> None:
    app = build(load_config(PORTS0))
    async with running(app) as c:
        engine = app.scheduler.serving()
        url = c.base + "/ui/api/events?status=ready&kind=b,c&pool=default"
        async with c.session.get(url) as r:
            await _opened(r)
            assert engine.event_level != EVENTS_NONE
            await c.post("/v1/tasks", {"kind": "a", "payload": 1})
            _, b = await c.post("/v1/tasks", {"kind": "b", "payload": 2, "key": "kb"})
            _, cancelled = await c.post("/v1/tasks", {"kind": "c", "payload": 3})
            await c.post(f"/v1/tasks/{cancelled['id']}/cancel")
            _, last = await c.post("/v1/tasks", {"kind": "c", "payload": 4})
            first = await _data(r)
            assert first == {
                "id": b["id"],
                "pool": "default",
                "key": "kb",
                "kind": "b",
                "status": "ready",
                "attempt": 0,
                "at_unix_ns": first["at_unix_ns"],
                "message": "",
            }
            assert (await _data(r))["id"] == cancelled["id"]
            assert (await _data(r))["id"] == last["id"]  # not the cancellation
        await until(lambda: engine.event_level == EVENTS_NONE, 10, "the Watch to close")
        status, error = await c.get("/ui/api/events?status=nope")
        assert status == 400 and "nope" in error["error"]
        status, error = await c.get("/ui/api/events?pool=nope")
        assert status == 404
        assert engine.event_level == EVENTS_NONE


async def test_events_end_when_the_server_stops(monkeypatch: Any) -> None:
    monkeypatch.setattr(app_module, "DRAIN_S", 3600.0)  # a held stream would hold the stop
    app = build(load_config(PORTS0))
    async with running(app) as c, c.session.get(c.base + "/ui/api/events") as r:
        await _opened(r)
        await app.stop()
        assert await asyncio.wait_for(r.content.read(), 10) == b""


# --- credentials --------------------------------------------------------------------------------


async def test_detail_and_events_need_the_roles_of_get_and_watch() -> None:
    async with running(build(load_config(AUTH_CONFIG))) as c:

        def bearer(who: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token(who)}"}

        status, sent = await c.post("/v1/tasks", {"pool": "a"}, headers=bearer("client"))
        assert status == 200
        detail = f"/ui/api/tasks/{sent['id']}"
        assert (await c.get(detail))[0] == 401
        assert (await c.get(detail, headers=bearer("metrics")))[0] == 403
        assert (await c.get(detail, headers=bearer("client")))[0] == 200
        assert (await c.get("/ui/api/tasks/987654", headers=bearer("client")))[0] == 404
        assert (await c.get("/ui/api/events"))[0] == 401
        assert (await c.get("/ui/api/events", headers=bearer("metrics")))[0] == 403
        async with c.session.get(c.base + "/ui/api/events", headers=bearer("client")) as r:
            await _opened(r)
