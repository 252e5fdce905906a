"""Text that is not Unicode in the HTTP API (docs/http.md, "JSON"): a JSON string may spell a
lone surrogate (`"\\ud800"`), which no encoder takes. Every route that reads a JSON body answers
it 400 naming the field, wherever the string is (a value, an object's key, deep in a payload);
never a 500. Paths and query strings cannot carry one (percent-decoding replaces bytes that are
not UTF-8). gRPC and gRPC-Web: test_server_grpc_web_text.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_server_http import PORTS0, running

from cronoq.server.app import served_routes
from cronoq.server.config import load_config
from cronoq.server.wiring import build

MARK = "@@lone@@"  # where the surrogate goes, replaced in the JSON text by the escape `\ud800`
LONE = json.dumps(MARK).replace(MARK, "\\ud800")

# Every place of a task object that holds a string, and the field path the 400 names; a path
# ending in ":" names an object one of whose keys is the surrogate.
TASK: list[tuple[dict[str, Any], str]] = [
    *(
        ({name: MARK}, name)
        for name in (
            "kind",
            "pool",
            "key",
            "tenant",
            "content_type",
            "payload_b64",
            "priority",
            "on_miss",
            "deadline_unix_ns",
            "payload",
        )
    ),
    ({"payload": {"a": [1, {"b": MARK}]}}, "payload.a[1].b"),
    ({"json": {MARK: 1}}, "json:"),
    ({"tags": {"t": MARK}}, "tags.t"),
    ({"tags": {MARK: "v"}}, "tags:"),
    ({"labels": {"zone": MARK}}, "labels.zone"),
    ({"resources": {MARK: 1}}, "resources:"),
    ({"after": [MARK]}, "after[0]"),
    ({"deps": [{"key": MARK}]}, "deps[0].key"),
    ({"deps": [{"id": 1, "cond": MARK}]}, "deps[0].cond"),
    ({"deps": [{"target": {"key": MARK}}]}, "deps[0].target.key"),
    ({"retry": {"max_attempts": 1, MARK: 2}}, "retry:"),
    ({MARK: 1}, "the body:"),
]
SCHEDULE = [
    ({"name": MARK, "cron": "* * * * *"}, "name"),
    ({"name": "s", "cron": MARK}, "cron"),
    ({"name": "s", "cron": "* * * * *", "tz": MARK}, "tz"),
    ({"name": "s", "cron": "* * * * *", "overlap": MARK}, "overlap"),
    *(
        ({"name": "s", "cron": "* * * * *", "template": body}, f"template.{where}")
        for body, where in TASK
        if where != "the body:"
    ),
]


BATCH = [
    (
        {"tasks": [{"kind": "fine"}, body]},
        f"tasks[1].{where}" if where != "the body:" else "tasks[1]:",
    )
    for body, where in TASK
]
# The JSON bodies of each route that reads one, by path.
BODIES: dict[str, list[tuple[dict[str, Any], str]]] = {
    "/v1/tasks": [({**body, "wait": False}, where) for body, where in TASK]
    + [({"wait_timeout_s": 1, "key": MARK}, "key")],
    "/v1/tasks:batch": BATCH,
    "/v1/tasks/batch": BATCH,
    "/v1/recurring": SCHEDULE,
    "/v1/tasks/search": [
        ({"filter": {"key": MARK}}, "filter.key"),
        ({"filter": {"tags": {"t": MARK}}}, "filter.tags.t"),
        ({"sort": MARK}, "sort"),
    ],
    "/v1/tasks/bulk": [
        ({"action": "cancel", "filter": {"key_prefix": MARK}}, "filter.key_prefix"),
        ({"action": MARK}, "action"),
    ],
    "/v1/pools/{pool}/pause": [({MARK: 1}, "the body:")],
    "/v1/pools/{pool}/resume": [({MARK: 1}, "the body:")],
}


def test_every_route_that_reads_a_body_is_covered() -> None:
    reading = {r.path for r in served_routes(True) if r.verb == "POST" and "cancel" not in r.path}
    assert reading == set(BODIES)


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).replace(json.dumps(MARK), LONE).encode()


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_lone_surrogate_in_a_body_is_400_naming_the_field(path: str) -> None:
    async with running(build(load_config(PORTS0))) as c:
        for body, where in BODIES[path]:
            data = _json(body)
            assert b"\\ud800" in data
            headers = {"Content-Type": "application/json"}
            url = c.base + path.replace("{pool}", "default")
            async with c.session.post(url, data=data, headers=headers) as r:
                answer = await r.json()
                assert (r.status, answer["code"]) == (400, "bad_request"), (data, answer)
            named = f"{where} a field name" if where.endswith(":") else f"{where}:"
            assert answer["error"].startswith(named), (data, answer)
            assert "lone surrogate (\\ud800)" in answer["error"]
        assert (await c.get("/v1/tasks"))[1]["tasks"] == []
        assert (await c.get("/v1/recurring"))[1]["schedules"] == []


async def test_paired_surrogates_are_text() -> None:
    """An escaped pair is one character (U+1F600): taken, and kept as it came."""
    async with running(build(load_config(PORTS0))) as c:
        data = b'{"key": "smile-\\ud83d\\ude00", "payload": {"\\ud83d\\ude00": 1}}'
        headers = {"Content-Type": "application/json"}
        async with c.session.post(c.base + "/v1/tasks", data=data, headers=headers) as r:
            assert r.status == 200, await r.text()
        status, info = await c.get("/v1/tasks/by-key/smile-\U0001f600")
        assert (status, info["key"]) == (200, "smile-\U0001f600")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/tasks/by-key/%ED%A0%80",
        "/v1/tasks/by-key/%ED%A0%80/result?timeout_s=0",
        "/v1/tasks?pool=%ED%A0%80",
        "/v1/tasks?status=%ED%A0%80",
        "/v1/tasks/1/result?timeout_s=%ED%A0%80",
        "/ui/api/history?pool=%ED%A0%80",
        "/ui/api/events?status=%ED%A0%80",
    ],
)
async def test_paths_and_queries_carry_no_surrogate(path: str) -> None:
    """A percent-encoded surrogate (not UTF-8) decodes to U+FFFD: an unknown key, pool or
    status like any other, never a 500."""
    async with running(build(load_config(PORTS0))) as c:
        status, answer = await c.get(path, allow_redirects=False)
    assert status in (400, 404), answer
