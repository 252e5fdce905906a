"""A full overflow="wait" pool holds Submit and SubmitBatch until there is room
(docs/overflow-and-fairness.md, "On the server"), over real gRPC and HTTP sockets.

Each test runs the server as `cronoq-server` assembles it (`wiring.build(cfg)`) in this process,
with pools that have no workers: their tasks stay pending, so `max_pending` fills up with one
submit and frees with one cancel. That a call is held is read from the server's own line of held
calls (`held()`), so no test guesses how long the server takes to get there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.app import ServerApp
from cronoq.server.config import load_config
from cronoq.server.wiring import build
from helpers.auth import PORT0, Code, Stubs, code_of, connect, details_of, ref
from helpers.servers import running_app

POOLS = """
[[pools]]
name = "w"
max_pending = 1
overflow = "wait"

[[pools]]
name = "w2"
max_pending = 2
overflow = "wait"

[[pools]]
name = "r"
max_pending = 1
overflow = "reject"
"""


@contextlib.asynccontextmanager
async def serving(limits: str = "") -> AsyncIterator[tuple[ServerApp, Stubs]]:
    app = build(load_config(PORT0 + POOLS + limits))
    async with running_app(app, ready=True), connect(app.grpc_address) as s:
        yield app, s


def held(app: ServerApp, pool: str) -> int:
    """Calls the server holds for `pool` now (the Tasks service's line, holds.py)."""
    submit: Any = app.methods["/cronoq.v1.Tasks/Submit"].unary_unary
    n: int = submit.__self__._holds.held(pool)
    return n


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def request(pool: str, **fields: Any) -> pb.SubmitRequest:
    return pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", pool=pool, **fields))


async def submit(s: Stubs, pool: str, **fields: Any) -> int:
    resp = await s.tasks.Submit(request(pool, **fields))
    return int(resp.id)


async def cancel(s: Stubs, task: int) -> None:
    assert (await s.tasks.Cancel(pb.CancelRequest(task=ref(task)))).cancelled


async def ids_in(s: Stubs, pool: str) -> list[int]:
    listed = await s.tasks.ListTasks(pb.ListTasksRequest(pools=[pool]))
    return [t.id for t in listed.tasks]


async def test_held_submit_is_admitted_once_room_frees() -> None:
    async with serving() as (app, s):
        first = await submit(s, "w")
        second = asyncio.ensure_future(s.tasks.Submit(request("w")))
        await until(lambda: held(app, "w") == 1)
        info = await s.tasks.Get(pb.GetRequest(task=ref(first)))
        assert info.status == pb.TASK_STATUS_READY
        assert not second.done()  # still held after a round trip behind it
        await cancel(s, first)
        resp = await second
        assert resp.id > first and not resp.duplicate
        assert held(app, "w") == 0
        assert (await s.tasks.Get(pb.GetRequest(task=ref(resp.id)))).status == (
            pb.TASK_STATUS_READY
        )
        # "reject" still answers at once
        rejected = await submit(s, "r")
        call = s.tasks.Submit(request("r"))
        assert await code_of(call) is Code.RESOURCE_EXHAUSTED
        assert "overloaded" in await details_of(call)
        assert held(app, "r") == 0
        await cancel(s, rejected)


async def test_held_submits_are_admitted_in_arrival_order() -> None:
    async with serving() as (app, s):
        first = await submit(s, "w")
        second = asyncio.ensure_future(s.tasks.Submit(request("w", key="second")))
        await until(lambda: held(app, "w") == 1)
        third = asyncio.ensure_future(s.tasks.Submit(request("w", key="third")))
        await until(lambda: held(app, "w") == 2)
        await cancel(s, first)
        got = await second
        assert held(app, "w") == 1 and not third.done()
        await cancel(s, got.id)
        last = await third
        assert last.id > got.id
        assert await ids_in(s, "w") == [first, got.id, last.id]


async def test_held_submit_ends_at_its_deadline_and_admits_nothing() -> None:
    async with serving() as (app, s):
        first = await submit(s, "w")
        call = s.tasks.Submit(request("w", key="late"), timeout=0.5)
        assert await code_of(call) is Code.DEADLINE_EXCEEDED
        await until(lambda: held(app, "w") == 0)
        await cancel(s, first)  # room again: nothing of the late call may take it
        after = await submit(s, "w")
        assert await ids_in(s, "w") == [first, after]
        missing = s.tasks.Get(pb.GetRequest(task=ref("late")))
        assert await code_of(missing) is Code.NOT_FOUND


async def test_cancelled_held_call_leaves_no_task_and_no_waiter() -> None:
    async with serving() as (app, s):
        first = await submit(s, "w")
        call = s.tasks.Submit(request("w", key="gone"))
        await until(lambda: held(app, "w") == 1)
        call.cancel()
        await until(lambda: held(app, "w") == 0)
        assert not app.scheduler._live().room  # nobody parked for room either
        await cancel(s, first)
        after = await submit(s, "w")
        assert await ids_in(s, "w") == [first, after]


async def test_request_timeout_does_not_cut_a_held_submit() -> None:
    async with serving("[limits]\nrequest_timeout_s = 0.5\nmax_wait_s = 5\n") as (app, s):
        first = await submit(s, "w")
        second = asyncio.ensure_future(s.tasks.Submit(request("w")))
        await until(lambda: held(app, "w") == 1)
        # A Wait (exempt from request_timeout_s) that outlasts request_timeout_s: the held call
        # has been held longer than that when it ends.
        wait = s.tasks.Wait(pb.WaitRequest(task=ref(first), timeout_s=1.0))
        assert await code_of(wait) is Code.DEADLINE_EXCEEDED
        assert not second.done() and held(app, "w") == 1
        await cancel(s, first)
        assert (await second).id > first


async def test_batch_is_held_until_all_of_it_fits() -> None:
    async with serving() as (app, s):
        first = await submit(s, "w2")  # 1 of 2 pending
        batch = asyncio.ensure_future(
            s.tasks.SubmitBatch(
                pb.SubmitBatchRequest(
                    tasks=[pb.TaskSpec(payload=b"x", pool="w2", key=k) for k in ("b1", "b2")]
                )
            )
        )
        await until(lambda: held(app, "w2") == 1)
        # one more task would fit, but it is behind the batch
        single = asyncio.ensure_future(s.tasks.Submit(request("w2", key="single")))
        await until(lambda: held(app, "w2") == 2)
        await cancel(s, first)
        got = await batch
        b1, b2 = (t.id for t in got.tasks)
        assert held(app, "w2") == 1 and not single.done()
        await cancel(s, b1)
        last = await single
        assert await ids_in(s, "w2") == [first, b1, b2, last.id]
        # a batch that could never fit is refused at once
        too_big = s.tasks.SubmitBatch(
            pb.SubmitBatchRequest(tasks=[pb.TaskSpec(payload=b"x", pool="w")] * 2)
        )
        assert await code_of(too_big) is Code.RESOURCE_EXHAUSTED
        assert held(app, "w") == 0


async def test_http_submit_is_held_like_grpc() -> None:
    limits = "[limits]\nrequest_timeout_s = 0.3\nmax_wait_s = 0.3\n"
    async with serving(limits) as (app, s), aiohttp.ClientSession() as http:
        url = f"http://{app.http_address}/v1/tasks"
        first = await submit(s, "w")
        # bounded by request_timeout_s + max_wait_s: 504, and nothing admitted afterwards
        async with http.post(url, json={"pool": "w", "key": "late", "payload": ""}) as resp:
            assert resp.status == 504, await resp.text()
            assert (await resp.json())["code"] == "gateway_timeout"
        assert held(app, "w") == 0
        held_post = asyncio.ensure_future(http.post(url, json={"pool": "w", "payload": ""}))
        await until(lambda: held(app, "w") == 1)
        await cancel(s, first)
        async with await held_post as resp:
            assert resp.status == 200, await resp.text()
            second = int((await resp.json())["id"])
        assert await ids_in(s, "w") == [first, second]
