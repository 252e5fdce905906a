"""The server's defaults, as the published cronoq-server 0.2.1 has them (docs/configuration.md),
each seen from outside a real `cronoq-server` process that is not told otherwise.

Each test gets its own server (ports 0 and nothing else it does not need), started by a
fixture, outside the test's own time limit, so what one test's workers and tasks do cannot
change what another observes. The settings themselves are checked key by key in
tests/unit/test_server_config.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.servers import Serving, serving_process
from helpers.workers import Worker

Code = grpc.StatusCode

# Only the ports: every other setting is the default under test. (No shutdown_grace_s either:
# with no attempt running, a SIGTERM does not wait for it.)
PORTS = '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\n'
MIB = 1 << 20
# a safety net for waits on the server, never a wait in itself: a busy machine may be slow
# (below the 10 s every async test gets in tests/integration/conftest.py)
PATIENCE = 8.0


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Serving]:
    """A server with nothing configured but its ports."""
    with serving_process(tmp_path, PORTS) as s:
        yield s


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[Serving]:
    """A pool `wide` of max 5000, so that only limits.max_slots_per_worker caps a grant."""
    with serving_process(tmp_path, PORTS + '[[pools]]\nname = "wide"\nmax = 5000\n') as s:
        yield s


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Serving]:
    """The default pool, with room for one pending task (it takes limits.max_pending_per_pool)."""
    with serving_process(tmp_path, PORTS + "[limits]\nmax_pending_per_pool = 1\n") as s:
        yield s


@pytest.fixture
def fixed(tmp_path: Path) -> Iterator[Serving]:
    """A pool `fixed` without autoscaling, at a cost per worker second."""
    pool = '[[pools]]\nname = "fixed"\nautoscale = false\ncost_per_worker_second = 1000\n'
    with serving_process(tmp_path, PORTS + pool) as s:
        yield s


@contextlib.asynccontextmanager
async def stubs(serving: Serving) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(serving.address) as ch:
        yield ch


async def until(probe: Callable[[], Any], what: str) -> Any:
    """Ask `probe()` (a coroutine function) again until it returns something true; fail after
    PATIENCE. Each round is one call to the server, answered when it is answered."""
    end = time.monotonic() + PATIENCE
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < end, f"never {what}"
        await asyncio.sleep(0.05)  # between two calls, not a wait for the outcome


def http(serving: Serving, verb: str, path: str, body: object = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{serving.http_address}{path}", data, method=verb)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=PATIENCE) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def pool(snapshot: pb.SnapshotResponse, name: str = "default") -> pb.PoolSnapshot:
    (found,) = [p for p in snapshot.pools if p.name == name]
    return found


def metrics(serving: Serving) -> str:
    with urllib.request.urlopen(f"http://{serving.http_address}/metrics", timeout=PATIENCE) as r:
        assert r.status == 200
        return str(r.read().decode())


def metric(text: str, family: str, name: str = "default") -> float:
    """The value of `cronoq_pool_<family>{pool="<name>"}` in a /metrics text, -1 if absent."""
    found = re.search(rf'^cronoq_pool_{family}\{{pool="{name}"\}} (\S+)$', text, re.M)
    return -1.0 if found is None else float(found.group(1))


# --- pools ------------------------------------------------------------------------------------


async def test_a_worker_asking_for_64_slots_gets_10_in_the_default_pool(serving: Serving) -> None:
    async with stubs(serving) as ch:
        w = Worker(ch)
        registered = await w.register("default", slots=64)
        assert registered.slots == 10  # pools[].max
        assert registered.max_message_bytes == 16 * MIB  # limits.max_message_bytes
        admin = cronoq_pb2_grpc.AdminStub(ch)
        (info,) = (await admin.ListWorkers(pb.Empty())).workers
        assert (info.pool, info.slots) == ("default", 10)
        assert pool(await admin.Snapshot(pb.Empty())).capacity == 10
        w.close()


async def test_a_worker_gets_at_most_1024_slots(wide: Serving) -> None:
    async with stubs(wide) as ch:
        w = Worker(ch)
        assert (await w.register("wide", slots=5000)).slots == 1024  # max_slots_per_worker
        w.close()


async def test_the_default_pool_autoscales(serving: Serving) -> None:
    """Pending tasks and no worker: the autoscaler asks for workers (`desired`, what KEDA or an
    HPA reads), up to the pool's max, since no connected worker can drain the backlog (that it
    keeps asking is tested in tests/unit/test_engine_seams.py). Without autoscaling, `desired`
    would stay the capacity: 0."""
    async with stubs(serving) as ch:
        tasks = cronoq_pb2_grpc.TasksStub(ch)
        for _ in range(3):
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"x")))
        admin = cronoq_pb2_grpc.AdminStub(ch)

        async def desired() -> int:
            p = pool(await admin.Snapshot(pb.Empty()))
            assert p.capacity == 0
            return p.desired

        async def at_max() -> bool:
            return await desired() == 10  # pools[].max

        await until(at_max, "the desired capacity at the pool's max")

        async def exported() -> bool:
            return metric(await asyncio.to_thread(metrics, serving), "desired_workers") == 10

        await until(exported, "cronoq_pool_desired_workers == 10")


async def test_a_full_default_pool_refuses_at_once(small: Serving) -> None:
    """overflow "reject": the second task for a pool of max_pending 1 is RESOURCE_EXHAUSTED
    (HTTP 429), not held until the deadline."""
    async with stubs(small) as ch:
        tasks = cronoq_pb2_grpc.TasksStub(ch)
        await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"first")))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            # the deadline only fails a server that holds the call instead
            second = pb.SubmitRequest(task=pb.TaskSpec(payload=b"second"))
            await tasks.Submit(second, timeout=PATIENCE / 2)
        assert info.value.code() is Code.RESOURCE_EXHAUSTED, info.value
    status, _ = await asyncio.to_thread(http, small, "POST", "/v1/tasks", {"payload_b64": "eA=="})
    assert status == 429


# --- limits -----------------------------------------------------------------------------------


async def test_a_5_mib_payload_over_grpc_and_over_http(serving: Serving) -> None:
    big = bytes(range(256)) * (5 * MIB // 256)
    async with stubs(serving) as ch:
        tasks = cronoq_pb2_grpc.TasksStub(ch)
        done = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=big)))
        assert done.id > 0
    body = {"payload_b64": base64.b64encode(big).decode()}  # a 7 MB body
    status, answer = await asyncio.to_thread(http, serving, "POST", "/v1/tasks", body)
    assert status == 200, answer
    assert int(answer["id"]) > done.id


async def test_long_tags_and_many_dependencies(serving: Serving) -> None:
    """max_tag_len 1024 and max_deps 256: a 1 KiB tag and 100 dependencies are accepted."""
    async with stubs(serving) as ch:
        tasks = cronoq_pb2_grpc.TasksStub(ch)
        tag = pb.TaskSpec(payload=b"x", tags={"note": "n" * 1024})
        await tasks.Submit(pb.SubmitRequest(task=tag))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            too_long = pb.TaskSpec(payload=b"x", tags={"note": "n" * 1025})
            await tasks.Submit(pb.SubmitRequest(task=too_long))
        assert info.value.code() is Code.INVALID_ARGUMENT
        parents = [pb.TaskSpec(payload=b"p", key=f"parent-{i}") for i in range(100)]
        deps = [pb.Dep(target=pb.TaskRef(key=f"parent-{i}")) for i in range(100)]
        child = pb.TaskSpec(payload=b"c", key="child", deps=deps)
        answer = await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[*parents, child]))
        assert len(answer.tasks) == 101


# --- the cost of a pool without autoscaling ----------------------------------------------------


async def test_a_pool_without_autoscaling_still_counts_its_cost(fixed: Serving) -> None:
    """docs/configuration.md, "[[pools]]": cost_per_worker_second applies with or without
    autoscaling, in snapshots and as cronoq_pool_cost_total."""
    async with stubs(fixed) as ch:
        w = Worker(ch)
        assert (await w.register("fixed", slots=2)).slots == 2
        admin = cronoq_pb2_grpc.AdminStub(ch)

        async def snapshot_cost() -> float:
            return float(pool(await admin.Snapshot(pb.Empty()), "fixed").cost)

        await until(snapshot_cost, "a cost in the snapshot")

        async def exported() -> bool:
            return metric(await asyncio.to_thread(metrics, fixed), "cost_total", "fixed") > 0

        await until(exported, "cronoq_pool_cost_total > 0")
        w.close()


# --- shutdown ---------------------------------------------------------------------------------


def test_sigterm_gives_running_attempts_10_s(serving: Serving) -> None:
    assert serving.server.terminate(timeout=60) == 0  # (the timeout only fails a hung server)
    stopping = [line for line in serving.server.lines if "event=stopping" in line]
    assert len(stopping) == 1 and re.search(r" grace_s=10(\.0)?( |$)", stopping[0]), stopping
