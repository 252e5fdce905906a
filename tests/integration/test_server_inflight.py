"""Calls in flight on the gRPC port (docs/server.md, "Transports"), on each transport, with real
sockets: whatever ends a call (its client's reset, in the same read as its opening or later,
its deadline, its connection dropped, or its answer), its place under
limits.max_concurrent_requests comes back, and each call is answered at most once. The check
is the limit itself: afterwards the listener takes exactly max_concurrent_requests calls at
once again (helpers/h2peer.py drives the frames).

And /readyz of a server whose gRPC listener has been full (every place taken) for longer than
`inflight.FULL_S`: 503, with the reason in its header.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import random
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server import inflight
from cronoq.server.config import LimitsSettings, load_config
from cronoq.server.fronts.native import TOO_MANY_CALLS
from cronoq.server.wiring import build
from helpers import transports
from helpers.h2peer import H2Peer
from helpers.servers import PORT0, running_app
from helpers.waiting import until

LIMIT = 6  # limits.max_concurrent_requests of these listeners
HOLD = "/t.T/Hold"  # answers once released (each capacity probe releases its own)
ECHO = "/t.T/Echo"  # answers at once
RESETS_PER_CONNECTION = 15  # under the HTTP/2 servers' limits on streams reset before accepted
EMPTY = pb.Empty()


class Service:
    """Raw-bytes handlers that count who is inside them."""

    def __init__(self) -> None:
        self.entered = 0
        self.inside = 0
        self.release = asyncio.Event()  # the current probe's; the flood's calls never get one

    async def hold(self, request: bytes, context: Any) -> bytes:
        release = self.release
        self.entered += 1
        self.inside += 1
        try:
            await release.wait()
        finally:
            self.inside -= 1
        return request

    async def echo(self, request: bytes, context: Any) -> bytes:
        return request

    def add(self, server: Any) -> None:
        methods = {
            "Hold": grpc.unary_unary_rpc_method_handler(self.hold),
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", methods),))


@contextlib.asynccontextmanager
async def listener() -> AsyncIterator[tuple[Service, str]]:
    service = Service()
    limits = LimitsSettings(max_concurrent_requests=LIMIT)
    async with transports.listening(service.add, limits=limits) as port:
        yield service, f"127.0.0.1:{port}"


async def taken(service: Service, address: str) -> int:
    """How many of LIMIT + 1 Hold calls opened at once the listener lets in (the others are
    refused with TOO_MANY_CALLS); every one is over when this returns."""
    service.release = release = asyncio.Event()
    before = service.entered
    async with grpc.aio.insecure_channel(address) as channel:
        hold = channel.unary_unary(HOLD)
        calls = [asyncio.ensure_future(hold(b"")) for _ in range(LIMIT + 1)]
        refused = lambda: sum(c.done() for c in calls)  # noqa: E731 (nothing is released yet)
        await until(lambda: service.entered - before + refused() == LIMIT + 1, 5.0, "the calls")
        inside = service.entered - before
        release.set()
        for call in calls:
            try:
                await call
            except grpc.aio.AioRpcError as e:
                assert (e.code(), e.details()) == (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    TOO_MANY_CALLS,
                )
    return inside


async def every_place_back(service: Service, address: str) -> None:
    """Until the listener takes exactly LIMIT calls at once: the calls of the test are over
    (their ends are reported to the listener soon after their clients act)."""

    async def full() -> bool:
        return service.inside == 0 and await taken(service, address) == LIMIT

    await until(full, 5.0, f"{LIMIT} places free again")


def seeded() -> random.Random:
    """The test's randomness: CRONOQ_TEST_SEED, else a fresh seed, printed to replay a failure."""
    seed = int(os.environ.get("CRONOQ_TEST_SEED") or random.randrange(2**32))
    print(f"CRONOQ_TEST_SEED={seed}")
    return random.Random(seed)


async def in_threads(work: Callable[[int], None], count: int) -> None:
    """`work(i)` for each i < count, in count threads (blocking peers), the loop serving."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    await until(lambda: not any(t.is_alive() for t in threads), 8.0, "the peers")
    if errors:
        raise errors[0]


# --- the invariant ----------------------------------------------------------------------------


async def test_opens_reset_in_the_same_read_give_their_places_back(each_transport: str) -> None:
    """The flood of issue 27: HEADERS and RST_STREAM of each call in one write, on many
    connections; the native transport lost the place of a call cancelled before its task ran."""
    async with listener() as (service, address):
        assert await taken(service, address) == LIMIT

        def flood(_: int) -> None:
            for _ in range(4):
                peer = H2Peer(address)
                try:
                    for _ in range(RESETS_PER_CONNECTION):
                        peer.reset(peer.open(HOLD, EMPTY, end=True, send=False), send=False)
                    peer.flush()
                    peer.ping()  # the server has read every frame before it
                finally:
                    peer.close()

        await in_threads(flood, 10)
        await every_place_back(service, address)


async def test_any_mix_of_call_endings_gives_every_place_back(each_transport: str) -> None:
    """Seeded random mixes of openings and endings on raw HTTP/2 connections, and grpc.aio
    calls with deadlines of 1 to 11 ms; each call that its client does not give up on is
    answered once."""
    rng = seeded()
    plans = [[rng.random() for _ in range(RESETS_PER_CONNECTION + 1)] for _ in range(24)]
    deadlines = [rng.uniform(0.001, 0.011) for _ in range(200)]
    async with listener() as (service, address):

        def mix(i: int) -> None:
            *draws, ending = plans[i]
            peer = H2Peer(address)
            answered: list[int] = []  # the calls whose end the peer waits for
            echoes: list[int] = []  # those answered (OK, or refused while every place is taken)
            later: list[int] = []  # to reset after the others were sent
            try:
                for draw in draws:
                    if draw < 0.3:  # opened and reset in one write
                        peer.reset(peer.open(HOLD, EMPTY, end=True, send=False))
                    elif draw < 0.45:
                        later.append(peer.open(HOLD, EMPTY, end=True))
                    elif draw < 0.6:  # the server's deadline, 1 to 20 ms
                        timeout = (("grpc-timeout", f"{1 + int(draw * 1000) % 20}m"),)
                        answered.append(peer.open(HOLD, EMPTY, end=True, metadata=timeout))
                    elif draw < 0.85:
                        echoes.append(peer.open(ECHO, EMPTY, end=True))
                    else:  # never half-closed: waits for a request that does not come
                        later.append(peer.open(HOLD, EMPTY))
                for stream_id in later[: len(later) // 2]:
                    peer.reset(stream_id)
                if ending < 0.5:  # the connection dropped with calls open
                    return
                # (h2 itself refuses a second end of a stream: the connection would fail)
                for stream_id in answered:
                    stream = peer.streams[stream_id]
                    peer.until(lambda s=stream: s.ended or s.reset is not None, "the deadlines")
                for stream_id in echoes:
                    assert peer.finish(stream_id)["grpc-status"] in ("0", "8")  # (8: no place)
                for stream_id in later[len(later) // 2 :]:
                    peer.reset(stream_id)
                peer.ping()
            finally:
                peer.close()

        async def impatient() -> None:
            async with grpc.aio.insecure_channel(address) as channel:
                hold, echo = channel.unary_unary(HOLD), channel.unary_unary(ECHO)
                calls = [(hold if n % 2 else echo)(b"", timeout=d) for n, d in enumerate(deadlines)]
                for call in calls:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await call

        await asyncio.gather(in_threads(mix, len(plans)), impatient())
        await every_place_back(service, address)


# --- readiness --------------------------------------------------------------------------------


def readyz(address: str) -> tuple[int, str | None]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        return response.status, response.getheader("Cronoq-Standby-Reason")
    finally:
        conn.close()


@pytest.mark.parametrize("transport", transports.TRANSPORTS)
async def test_readyz_fails_while_the_grpc_listener_stays_full(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kubernetes routes traffic away from a server that is not ready; its liveness (/healthz)
    stays: a full listener is overload, which a restart does not cure."""
    monkeypatch.setattr(inflight, "FULL_S", 0.0)
    text = (
        PORT0
        + f'transport = "{transport}"\n[limits]\nmax_concurrent_requests = 2\n'
        + '[[pools]]\nname = "p"\n'
    )
    async with running_app(build(load_config(text)), ready=True) as app:
        http_address = str(app.http_address)
        assert await asyncio.to_thread(readyz, http_address) == (200, None)
        async with grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
            tasks = cronoq_pb2_grpc.TasksStub(channel)
            held = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p")))
            wait = pb.WaitRequest(task=pb.TaskRef(id=held.id), timeout_s=60)
            waits = [tasks.Wait(wait) for _ in range(2)]

            async def unready() -> bool:
                status, reason = await asyncio.to_thread(readyz, http_address)
                return status == 503 and reason == (
                    "the gRPC listener is full: 2 calls in flight (limits.max_concurrent_requests)"
                )

            await until(unready, 5.0, "/readyz 503")
            for call in waits:
                call.cancel()

            async def ready() -> bool:
                return await asyncio.to_thread(readyz, http_address) == (200, None)

            await until(ready, 5.0, "/readyz 200 again")
