"""The webhook scaler (docs/autoscaling.md, "Webhook scaler") against a real HTTP receiver.

The receiver is an aiohttp app on 127.0.0.1 (port 0) in the test's loop: it keeps every POST
(body, Authorization header, what it answered, whether the server led at that moment) and can
fail the first posts with 500, fail until told otherwise, or hang. The server runs as
`cronoq-server` assembles it (`wiring.build(cfg)`), in this process, so its log records can be
kept; its pool `auto` has no workers, so one submitted task stays queued and moves the desired
capacity from `min` (1) to `max` (3) at the next evaluation (`drain_time_s` 0.1: the drain term
of one queued task is far above `max`). Every wait is for a condition of the receiver or the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.app import ServerApp
from cronoq.server.cli import LogfmtFormatter
from cronoq.server.config import PoolSettings, ScalerSettings, load_config
from cronoq.server.scaler import Poster
from cronoq.server.wiring import build
from helpers.auth import PORT0, Stubs, connect
from helpers.servers import led_elsewhere, running_app
from helpers.workers import Worker

TOKEN = "hook-secret-0123456789abcdef"
ENV = {"HOOK_TOKEN": TOKEN}


@dataclass
class Post:
    pool: str
    desired: int
    authorization: str | None
    status: int  # what the receiver answered
    leading: bool | None  # the server's `ready` when the post arrived (None: no server known)


class Receiver:
    """The webhook's other end."""

    def __init__(self) -> None:
        self.posts: list[Post] = []
        self.failures = 0  # answer this many posts with 500 first
        self.failing = False  # answer 500 while set
        self.hang = False  # hold each answer until `released` is set
        self.released = asyncio.Event()
        self.app: ServerApp | None = None
        self._changed = asyncio.Condition()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        status = 500 if self.failing or len(self.posts) < self.failures else 200
        leading = None if self.app is None else self.app.ready
        post = Post(
            body["pool"], body["desired"], request.headers.get("Authorization"), status, leading
        )
        async with self._changed:
            self.posts.append(post)
            self._changed.notify_all()
        if self.hang:
            await self.released.wait()
        return web.Response(status=status)

    async def until(self, predicate: Callable[[list[Post]], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self.posts))

    def values(self) -> list[int]:
        return [p.desired for p in self.posts]


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[tuple[Receiver, str]]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield receiver, f"http://127.0.0.1:{port}/hook"
    finally:
        receiver.released.set()
        await runner.cleanup()


def config(url: str, extra: str = "") -> str:
    return (
        PORT0
        + f"""
[[pools]]
name = "auto"
min = 1
max = 3
autoscale = true
drain_time_s = 0.1
scaler = {{ kind = "webhook", url = "{url}", token_env = "HOOK_TOKEN" }}
"""
        + extra
    )


def running(text: str, receiver: Receiver) -> contextlib.AbstractAsyncContextManager[ServerApp]:
    app = build(load_config(text, env=ENV))
    receiver.app = app
    return running_app(app)


def stubs(app: ServerApp) -> contextlib.AbstractAsyncContextManager[Stubs]:
    return connect(app.grpc_address)


@contextlib.contextmanager
def kept_logs() -> Iterator[list[str]]:
    """Every log line of this process, at debug level, as the command formats them."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    keep = Keep()
    keep.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(keep)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(keep)
        root.setLevel(level)


async def logged(lines: list[str], *parts: str) -> None:
    while not any(all(p in line for p in parts) for line in lines):
        await asyncio.sleep(0.01)


def queue_one() -> pb.SubmitRequest:
    return pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", pool="auto"))


async def test_webhook_posts_the_initial_desired_and_each_change() -> None:
    async with receiving() as (receiver, url), running(config(url), receiver) as app:
        await receiver.until(lambda posts: len(posts) >= 1)
        first = receiver.posts[0]
        assert (first.pool, first.desired, first.leading) == ("auto", 1, True)
        assert first.authorization == f"Bearer {TOKEN}"
        async with stubs(app) as s:
            await s.tasks.Submit(queue_one())
            await receiver.until(lambda posts: posts[-1].desired == 3)
            snap = await s.admin.Snapshot(pb.Empty())
        assert [p.desired for p in snap.pools if p.name == "auto"] == [3]
        assert receiver.values() == [1, 3]  # each value once
        assert all(p.status == 200 and p.leading for p in receiver.posts)


async def test_failed_posts_are_retried_until_the_latest_value_is_delivered() -> None:
    with kept_logs() as lines:
        async with receiving() as (receiver, url):
            receiver.failures = 2
            async with running(config(url), receiver) as app:
                await receiver.until(lambda posts: len(posts) >= 1)  # the first one failed
                async with stubs(app) as s:
                    await s.tasks.Submit(queue_one())
                await receiver.until(
                    lambda posts: (posts[-1].status, posts[-1].desired) == (200, 3)
                )
    posts = receiver.posts
    assert [p.status for p in posts[:2]] == [500, 500] and len(posts) >= 3
    values = receiver.values()
    assert values == sorted(values)  # never an older value after a newer one
    failed = [line for line in lines if "event=scaler_failed" in line]
    assert len(failed) >= 2
    for line in failed:
        assert "pool=auto" in line and "status=500" in line and f"url={url}" in line, line
    assert not any(TOKEN in line for line in lines)


async def test_the_token_is_sent_but_never_logged() -> None:
    with socket.socket() as probe:  # a port nobody listens on: every post fails to connect
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/hook"
    dead_pool = f"""
[[pools]]
name = "dead"
autoscale = true
scaler = {{ kind = "webhook", url = "{dead}", token_env = "HOOK_TOKEN" }}
"""
    with kept_logs() as lines:
        async with receiving() as (receiver, url):
            receiver.failures = 1
            async with running(config(url, dead_pool), receiver):
                await receiver.until(lambda posts: any(p.status == 200 for p in posts))
                await logged(lines, "event=scaler_failed", "pool=dead")
                await logged(lines, "event=scaler_failed", "pool=auto", "status=500")
    assert {p.authorization for p in receiver.posts} == {f"Bearer {TOKEN}"}
    assert lines and not any(TOKEN in line for line in lines)


async def test_a_hanging_webhook_does_not_hold_up_scheduling() -> None:
    async with receiving() as (receiver, url):
        receiver.hang = True
        async with running(config(url), receiver) as app, stubs(app) as s:
            await receiver.until(lambda posts: len(posts) >= 1)  # and it never gets an answer
            worker = Worker(s.channel)
            await worker.register(pool="auto", slots=1)
            for i in range(3):
                payload = f"task {i}".encode()
                submitted = asyncio.ensure_future(
                    s.tasks.Submit(
                        pb.SubmitRequest(task=pb.TaskSpec(payload=payload, pool="auto"), wait=True)
                    )
                )
                lease = await worker.lease()
                worker.send(complete=pb.Complete(lease=lease.lease, output=payload))
                resp = await submitted
                assert resp.result.status == pb.TASK_STATUS_SUCCEEDED
                assert resp.result.output == payload
            assert len(receiver.posts) == 1  # the first post is still in flight
            worker.close()


async def test_only_the_leader_posts(tmp_path: Path) -> None:
    holder, store = await led_elsewhere(tmp_path / "q.db")  # another server leads at first
    async with receiving() as (receiver, url), running(config(url) + store, receiver) as app:
        assert not app.ready
        await holder.close()  # the leadership is free: this server takes it
        await receiver.until(lambda posts: len(posts) >= 1)
        assert [(p.desired, p.leading) for p in receiver.posts] == [(1, True)]


async def test_poster_sends_only_the_latest_value() -> None:
    """While a post is in flight, and while it is being retried, newer values replace the
    waiting one: the receiver sees each superseded value never, and no value after a newer
    one."""
    async with receiving() as (receiver, url), aiohttp.ClientSession() as http:
        settings = PoolSettings("p", scaler=ScalerSettings("webhook", url, "HOOK_TOKEN", TOKEN))
        poster = Poster(settings, http, (0.01, 0.05), random.Random(1))
        running_poster = asyncio.ensure_future(poster.run())
        try:
            receiver.hang = True
            poster.offer(1)
            await receiver.until(lambda posts: len(posts) == 1)  # in flight
            poster.offer(2)
            poster.offer(3)
            receiver.hang = False
            receiver.released.set()
            await receiver.until(lambda posts: posts[-1].desired == 3)
            assert receiver.values() == [1, 3]

            receiver.failing = True
            poster.offer(4)
            await receiver.until(lambda posts: posts[-1].desired == 4)
            poster.offer(5)
            poster.offer(6)
            await receiver.until(lambda posts: posts[-1].desired == 6)  # retried: the latest
            receiver.failing = False
            await receiver.until(lambda posts: (posts[-1].status, posts[-1].desired) == (200, 6))
            later = receiver.values()[2:]
            assert 5 not in later and later == sorted(later)
            assert {p.authorization for p in receiver.posts} == {f"Bearer {TOKEN}"}
        finally:
            running_poster.cancel()
            await asyncio.gather(running_poster, return_exceptions=True)
