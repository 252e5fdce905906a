"""The dashboard's routes on a sharded server (docs/dashboard.md, "The dashboard's API"), and
the search its tasks view lists with, with real `cronoq-server` processes: shard a (number 1:
pools default, pa) and shard b (2: pb), no credentials, memory stores. `pair` is shared by the
tests, each with kinds and keys of its own; `stopping` is one test's own pair, whose shard b it
kills."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_server_dashboard_api import _data, _opened
from test_server_shards import WAIT, Cluster, Http, assert_http_error, http, running

from helpers.shards import Shard, config
from helpers.waiting import until

FORWARDED = {"cronoq-forwarded": "1"}


def _pair(directory: Path) -> contextlib.AbstractContextManager[Cluster]:
    a = Shard("a", 1, ["default", "pa"])
    b = Shard("b", 2, ["pb"])
    files = {s.name: config(s, [a, b]) for s in (a, b)}
    return running(Cluster({"a": a, "b": b}), directory, files)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with _pair(tmp_path_factory.mktemp("dashboard-shards")) as c:
        yield c


@pytest.fixture
def stopping(tmp_path: Path) -> Iterator[Cluster]:
    with _pair(tmp_path) as c:
        yield c


async def get(h: Http, at: str, path: str) -> Any:
    return await h.ok(at, "GET", path, who=None)


async def search(h: Http, at: str, **body: Any) -> Any:
    return await h.ok(at, "POST", "/v1/tasks/search", body, who=None)


async def submit(h: Http, at: str, pool: str, kind: str, key: str | None = None) -> str:
    body: dict[str, Any] = {"pool": pool, "kind": kind, "payload": {"k": kind}}
    if key is not None:
        body["key"] = key
    sent = await h.ok(at, "POST", "/v1/tasks", body, who=None)
    return str(sent["id"])


def _entries(c: Cluster, own: str, down: str = "") -> list[dict[str, Any]]:
    return [
        {"name": n, "endpoint": c[n].endpoint, "up": n != down, "own": n == own} for n in ("a", "b")
    ]


async def test_shards_lists_the_plan_with_each_shard_up(pair: Cluster) -> None:
    async with http(pair) as h:
        for own in ("a", "b"):
            assert await get(h, own, "/ui/api/shards") == {
                "shard": own,
                "shards": _entries(pair, own),
            }


async def test_a_stopped_shard_is_listed_down(stopping: Cluster) -> None:
    async with http(stopping) as h:
        await submit(h, "a", "pa", "here")
        await submit(h, "a", "pb", "there")  # forwarded to b
        stopping.servers["b"].kill()

        async def b_down() -> bool:
            return (await get(h, "a", "/ui/api/shards"))["shards"][1]["up"] is False

        await until(b_down, WAIT, "shard b to be listed down")
        assert await get(h, "a", "/ui/api/shards") == {
            "shard": "a",
            "shards": _entries(stopping, "a", down="b"),
        }
        found = await search(h, "a", filter={"kinds": ["here", "there"]})
        assert [t["kind"] for t in found["tasks"]] == ["here"]
        assert (found["total"], found["unavailable_shards"]) == (1, ["b"])


async def test_search_by_kind_answers_alike_through_either_shard(pair: Cluster) -> None:
    """A kind filter is asked of both shards, a pool filter of the pool's shard alone."""
    async with http(pair) as h:
        ids = [
            await submit(h, "a", "pa", "list-x"),
            await submit(h, "b", "pb", "list-x"),  # b's ids are above a's (number 2 > 1)
            await submit(h, "a", "pa", "list-y"),
            await submit(h, "a", "pb", "list-y"),  # forwarded to b
        ]
        for at in ("a", "b"):
            xs = await search(h, at, filter={"kinds": ["list-x"]}, sort="id", ascending=True)
            assert [(t["id"], t["pool"]) for t in xs["tasks"]] == [(ids[0], "pa"), (ids[1], "pb")]
            assert xs["total"] == 2 and "unavailable_shards" not in xs
            ys = await search(h, at, filter={"kinds": ["list-y"], "pools": ["pb"]})
            assert [t["id"] for t in ys["tasks"]] == [ids[3]] and ys["total"] == 1


async def test_the_detail_of_another_shards_task_names_that_shard(pair: Cluster) -> None:
    """Get is forwarded, but the rest of the page is the owning shard's record: 409 with the
    shard and its endpoint; that shard's own dashboard answers the page."""
    async with http(pair) as h:
        there = await submit(h, "a", "pb", "detail", key="detail-b")
        answer = await h.call("a", "GET", f"/ui/api/tasks/{there}", who=None)
        endpoint = pair["b"].endpoint
        message = f"task {there} is served by shard 'b' at {endpoint}: open that shard's dashboard"
        assert_http_error(answer, 409, "conflict", message)
        # Get itself refuses a call it may not forward: the sharding refusal, same shard
        answer = await h.call("a", "GET", f"/ui/api/tasks/{there}", who=None, headers=FORWARDED)
        assert_http_error(
            answer, 409, "conflict", f"task {there} is served by shard 'b' at {endpoint}"
        )
        detail = await get(h, "b", f"/ui/api/tasks/{there}")
        assert detail["task"]["key"] == "detail-b" and detail["payload"]["json"] == {"k": "detail"}
        here = await submit(h, "a", "pa", "detail")
        assert (await get(h, "a", f"/ui/api/tasks/{here}"))["task"]["id"] == here
        answer = await h.call("a", "GET", f"/ui/api/tasks/{int(here) + 10**6}", who=None)
        assert_http_error(answer, 404, "not_found", "unknown task")


@contextlib.asynccontextmanager
async def stream(h: Http, at: str, query: str = "") -> AsyncIterator[list[dict[str, Any]]]:
    """The events of `at`'s /ui/api/events, collected as they come until the block ends."""
    url = f"http://{h.cluster[at].http_address}/ui/api/events{query}"
    async with h.session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as r:
        await _opened(r)
        events: list[dict[str, Any]] = []

        async def read() -> None:
            while True:
                events.append(await _data(r))

        reader = asyncio.ensure_future(read())
        try:
            yield events
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def test_events_carry_the_other_shards_events(pair: Cluster) -> None:
    """A stream at a shows b's transitions with kind "" (only b's record knows it); a kind
    filter then passes a's tasks only. b's part of the stream opens asynchronously, so it is
    first probed until one of b's events has arrived."""
    async with http(pair) as h, stream(h, "a") as events, stream(h, "a", "?kind=ev") as kinds:
        probes = 0

        async def b_seen() -> bool:
            nonlocal probes
            probes += 1
            await submit(h, "b", "pb", "probe", key=f"ev-probe-{probes}")
            return any(e["key"].startswith("ev-probe-") for e in events)

        await until(b_seen, WAIT, "the first event of shard b")
        there = await submit(h, "b", "pb", "ev", key="ev-b")
        here = await submit(h, "a", "pa", "ev", key="ev-a")

        def arrived() -> bool:
            return {there, here} <= {e["id"] for e in events}

        await until(arrived, WAIT, "the events of both shards")
        first = {e["id"]: e for e in reversed(events)}  # each task's first event
        assert (first[there]["pool"], first[there]["kind"]) == ("pb", "")
        assert (first[there]["status"], first[there]["key"]) == ("blocked", "ev-b")
        assert (first[here]["pool"], first[here]["kind"]) == ("pa", "ev")
        await until(lambda: any(e["id"] == here for e in kinds), WAIT, "a's event, by kind")
        assert {e["id"] for e in kinds} == {here}
