"""Writes from other sites (docs/http.md, "Cross-site requests"), over real sockets: a body
must be declared JSON (415 otherwise), and a state-changing request that a browser marks as
coming from another origin (`Origin`, `Sec-Fetch-Site`) is 403, on every such route of the
listener, the dashboard's included. Clients that are not browsers send neither header and are
unaffected; the dashboard's own page sends its own origin. The browser side of it, a page of
another origin in Chromium, is tests/browser/test_cross_site.py's.
"""

from __future__ import annotations

import re

import pytest
from test_server_http import PORTS0, running

from cronoq.server.app import served_routes
from cronoq.server.config import load_config
from cronoq.server.wiring import build

# Every route that changes something, a path of it with a real task's id or key.
WRITES = [r for r in served_routes(True) if r.verb not in ("GET", "HEAD")]


def _path(template: str, task_id: str) -> str:
    return (
        template.replace("{id}", task_id)
        .replace("{key}", "victim")
        .replace("{name}", "n")
        .replace("{pool}", "default")
    )


def test_every_write_route_is_covered() -> None:
    assert {r.verb for r in WRITES} == {"POST", "DELETE"}
    assert len(WRITES) >= 8  # submits, batches, cancels, recurring writes


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame, a file:// page
        {"Origin": "http://127.0.0.1:1"},  # loopback, another port: another origin all the same
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
async def test_a_write_from_another_origin_is_403_and_does_nothing(
    headers: dict[str, str],
) -> None:
    async with running(build(load_config(PORTS0))) as c:
        _, victim = await c.post("/v1/tasks", {"key": "victim"})
        for route in WRITES:
            path = _path(route.path, victim["id"])
            status, answer = await c.request(route.verb, path, json={}, headers=headers)
            assert (status, answer["code"]) == (403, "forbidden"), (route, answer)
            assert "another origin" in answer["error"]
        _, listing = await c.get("/v1/tasks")
        assert [(t["key"], t["status"]) for t in listing["tasks"]] == [("victim", "ready")]
        assert (await c.get("/v1/recurring"))[1]["schedules"] == []
        # reads stay open to any origin: the browser keeps their answers from the page
        assert (await c.get("/v1/tasks/by-key/victim", headers=headers))[0] == 200


async def test_a_write_from_the_listener_s_own_origin_is_served() -> None:
    """The dashboard's page sends its own origin: scheme, host and port of the Host header,
    compared case-insensitively, a default port implied."""
    async with running(build(load_config(PORTS0))) as c:
        port = c.base.rsplit(":", 1)[1]
        own = {"Origin": f"HTTP://LocalHost:{port}", "Host": f"localhost:{port}"}
        status, first = await c.post("/v1/tasks", {"key": "a"}, headers=own)
        assert status == 200, first
        same = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        status, answer = await c.request("DELETE", f"/v1/tasks/{first['id']}", headers=same)
        assert (status, answer) == (200, {"cancelled": True})
        implied = {"Origin": "http://localhost", "Host": "localhost:80"}
        assert (await c.post("/v1/tasks", {"key": "b"}, headers=implied))[0] == 200
        typed = {"Sec-Fetch-Site": "none"}  # a request the user made, not a page
        assert (await c.post("/v1/tasks", {"key": "c"}, headers=typed))[0] == 200


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ],
)
async def test_a_body_not_declared_json_is_415(content_type: str | None) -> None:
    """What a page may send another origin without asking first is never JSON; nor is a body
    with no type at all."""
    async with running(build(load_config(PORTS0))) as c:
        _, victim = await c.post("/v1/tasks", {"key": "victim"})
        headers = {} if content_type is None else {"Content-Type": content_type}
        for route in WRITES:
            path = _path(route.path, victim["id"])
            body = b'{"tasks": [], "key": "forged", "name": "forged", "cron": "* * * * *"}'
            async with c.session.request(
                route.verb, c.base + path, data=body, headers=headers
            ) as r:
                answer = await r.json()
                assert (r.status, answer["code"]) == (415, "unsupported_media_type"), route
                assert re.search(r"Content-Type: application/json", answer["error"])
        _, listing = await c.get("/v1/tasks")
        assert [(t["key"], t["status"]) for t in listing["tasks"]] == [("victim", "ready")]


async def test_json_bodies_and_bodiless_writes_are_served() -> None:
    async with running(build(load_config(PORTS0))) as c:
        for content_type in ("application/json", "Application/JSON; charset=utf-8"):
            headers = {"Content-Type": content_type}
            async with c.session.post(c.base + "/v1/tasks", data=b"{}", headers=headers) as r:
                assert r.status == 200, await r.text()
        async with c.session.post(c.base + "/v1/tasks") as r:  # no body, no type: `{}`
            assert r.status == 200
            task = await r.json()
        async with c.session.post(f"{c.base}/v1/tasks/{task['id']}/cancel") as r:
            assert (r.status, await r.json()) == (200, {"cancelled": True})


async def test_the_checks_hold_with_credentials_too() -> None:
    """A browser also sends a client certificate on its own: the checks do not depend on auth."""
    token = "admin-token-0123456789abcdef"
    config = PORTS0 + f'[[auth.tokens]]\ntoken = "{token}"\nrole = "admin"\n'
    async with running(build(load_config(config))) as c:
        bearer = {"Authorization": f"Bearer {token}"}
        forged = {**bearer, "Origin": "https://evil.example"}
        status, answer = await c.post("/v1/tasks", {}, headers=forged)
        assert (status, answer["code"]) == (403, "forbidden")
        async with c.session.post(
            c.base + "/v1/tasks", data=b"{}", headers={**bearer, "Content-Type": "text/plain"}
        ) as r:
            assert r.status == 415
        assert (await c.post("/v1/tasks", {}, headers=bearer))[0] == 200
