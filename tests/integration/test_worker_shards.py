"""`cronoq.client.Worker` against real sharded `cronoq-server` processes (docs/worker.md,
"Shard redirects"; docs/sharding.md, "Workers").

Two shards, a (number 1, pool "pa") and b (number 2, pool "pb"), each a server process with a
memory store. A worker started for one shard's pool at the other shard's address is refused
there with the pool's endpoint and must end up registered at the right shard: b lists it, and
a task submitted through the wrong shard (which forwards it) completes with its output. With a
worker token, the redirect is followed to a loopback http endpoint, and refused to a plain http
endpoint on another host unless `insecure_redirect_http=True`.

"Another host" is `http://0.0.0.0:<b's port>`: not loopback for the worker (nor for the server,
which forwards there only with `insecure_peer_http`), yet on Linux it reaches b's loopback
listener, so a redirect that is followed really registers, and one that is refused cannot pass
for a connection that merely failed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from cronoq.client import MAX_REDIRECTS, ClientError, Lease, Worker
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.services.sharding import FORWARDED
from helpers.servers import Server, write
from helpers.shards import Shard, config
from helpers.waiting import until

FAST = (0.05, 0.2)  # reconnect backoff: a wait the test would notice stays short
WAIT = 8.0  # safety nets for one step, inside the 10 s a test may take (conftest.py)

WORKER = "worker-token-for-the-shard-tests-00001"
CLIENT = "client-token-for-the-shard-tests-00001"
ADMIN = "admin-token-for-the-shard-tests-000001"
AUTH = "".join(
    f'[[auth.tokens]]\ntoken = "{token}"\nrole = "{role}"\n'
    for token, role in ((WORKER, "worker"), (CLIENT, "client"), (ADMIN, "admin"))
)


class Plan:
    """Shards a and b, the server process serving each (started by `start`), and the tokens
    to call them with (none without auth). `server`: more keys of the [server] table. Each
    server reads the plan in `views` (both shards as given, unless a test changes that)."""

    def __init__(
        self, directory: Path, a: Shard, b: Shard, *, auth: bool, server: str = ""
    ) -> None:
        self.directory = directory
        self.a, self.b = a, b
        self.shards = {"a": a, "b": b}
        self.auth = auth
        self.server = server
        self.servers: dict[str, Server] = {}
        self.views: dict[str, list[Shard]] = {"a": [a, b], "b": [a, b]}

    def start(self, name: str) -> None:
        """Start shard `name`'s server (again) and wait until it is ready (blocking)."""
        view = self.views[name]
        own = next(s for s in view if s.name == name)
        text = config(own, view, self.server, AUTH if self.auth else "")
        srv = self.servers[name] = Server(write(self.directory, text, f"{name}.toml"))
        srv.wait_for("event=ready")

    def kill(self, name: str) -> None:
        self.servers.pop(name).kill()

    def md(self, role: str) -> list[tuple[str, str]]:
        token = {"worker": WORKER, "client": CLIENT, "admin": ADMIN}[role]
        return [("authorization", f"Bearer {token}")] if self.auth else []

    @property
    def worker_token(self) -> str | None:
        return WORKER if self.auth else None


@contextlib.contextmanager
def serving(plan: Plan) -> Iterator[Plan]:
    """Start both shards' servers (at once), wait until both are ready, and kill them at the
    end."""
    try:
        with concurrent.futures.ThreadPoolExecutor(len(plan.shards)) as pool:
            starting = [pool.submit(plan.start, name) for name in plan.shards]
        for f in starting:
            f.result()  # the first start that failed fails the fixture
        yield plan
    finally:
        for srv in plan.servers.values():
            srv.kill()


@pytest.fixture(scope="module")
def open_plan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plan]:
    """No credentials, both endpoints on loopback."""
    directory = tmp_path_factory.mktemp("open")
    with serving(Plan(directory, Shard("a", 1, ["pa"]), Shard("b", 2, ["pb"]), auth=False)) as p:
        yield p


@pytest.fixture
def own_plan(tmp_path: Path) -> Iterator[Plan]:
    """As open_plan, for a test of its own that stops and restarts a server."""
    with serving(Plan(tmp_path, Shard("a", 1, ["pa"]), Shard("b", 2, ["pb"]), auth=False)) as p:
        yield p


@pytest.fixture
def disagreeing_plan(tmp_path: Path) -> Iterator[Plan]:
    """Shards whose servers disagree about pool pb: a's plan says b serves it, b's plan says a
    does (and gives b another pool), as during a plan change rolled out halfway."""
    a, b = Shard("a", 1, ["pa"]), Shard("b", 2, ["pb"])
    plan = Plan(tmp_path, a, b, auth=False)
    plan.views["b"] = [
        Shard("a", 1, ["pa", "pb"], grpc_port=a.grpc_port, http_port=a.http_port),
        Shard("b", 2, ["pc"], grpc_port=b.grpc_port, http_port=b.http_port),
    ]
    with serving(plan) as p:
        yield p


@pytest.fixture(scope="module")
def token_plan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plan]:
    """Tokens, both endpoints on loopback: the worker token may follow a plain http redirect."""
    directory = tmp_path_factory.mktemp("token")
    with serving(Plan(directory, Shard("a", 1, ["pa"]), Shard("b", 2, ["pb"]), auth=True)) as p:
        yield p


@pytest.fixture(scope="module")
def remote_plan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plan]:
    """Tokens, and shard b's endpoint a plain http one on a host that is not loopback (the
    servers forward the client's token there with insecure_peer_http)."""
    a, b = Shard("a", 1, ["pa"]), Shard("b", 2, ["pb"], host="0.0.0.0")
    directory = tmp_path_factory.mktemp("remote")
    with serving(Plan(directory, a, b, auth=True, server="insecure_peer_http = true\n")) as p:
        yield p


async def reverse(lease: Lease) -> bytes:
    return lease.payload[::-1]


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """`worker.run()` as a task, stopped at the end of the block; a run() that failed is
    reported when the block waits for the registration."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        if not task.done():
            await worker.stop(0.5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, WAIT)


async def registered(worker: Worker, task: asyncio.Task[None]) -> None:
    """Wait for the worker's registration, or fail with run()'s error if it ended first."""
    waiting = asyncio.ensure_future(worker.wait_registered())
    try:
        await asyncio.wait({waiting, task}, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if task.done():
        task.result()  # raises run()'s error
        raise AssertionError("run() returned before the worker registered")
    assert waiting.done() and not waiting.cancelled(), "the worker did not register in time"


async def workers_at(plan: Plan, shard: str) -> list[tuple[str, str]]:
    """(name, pool) of the workers connected to `shard` itself: a forwarded call is answered
    by the own shard alone, without the other shard's workers merged in."""
    async with grpc.aio.insecure_channel(plan.shards[shard].address) as ch:
        admin = cronoq_pb2_grpc.AdminStub(ch)  # type: ignore[no-untyped-call]
        listed = await admin.ListWorkers(
            pb.Empty(), metadata=[(FORWARDED, "1"), *plan.md("admin")], timeout=WAIT
        )
    return sorted((w.name, w.pool) for w in listed.workers)


async def run_task(plan: Plan, via: str, pool: str, payload: bytes) -> pb.TaskResult:
    """Submit a task to `pool` through shard `via` and wait there for its result."""
    async with grpc.aio.insecure_channel(plan.shards[via].address) as ch:
        tasks = cronoq_pb2_grpc.TasksStub(ch)  # type: ignore[no-untyped-call]
        md = plan.md("client")
        task = pb.TaskSpec(pool=pool, payload=payload)
        sub = await tasks.Submit(pb.SubmitRequest(task=task), metadata=md, timeout=WAIT)
        wait = pb.WaitRequest(task=pb.TaskRef(id=sub.id), timeout_s=WAIT)
        result: pb.TaskResult = await tasks.Wait(wait, metadata=md, timeout=WAIT + 1)
    return result


async def serves_at_the_right_shard(
    plan: Plan, entry: str, home: str, pool: str, name: str, *, insecure_redirect_http: bool = False
) -> None:
    """A worker for `pool` started at shard `entry` registers at shard `home` (after one
    refused stream) and runs a task submitted through `entry`."""
    w = Worker(
        plan.shards[entry].address,
        pool,
        reverse,
        name=name,
        token=plan.worker_token,
        backoff=FAST,
        insecure_redirect_http=insecure_redirect_http,
    )
    async with running(w) as task:
        await registered(w, task)
        assert w.connections == 2  # refused by `entry`, then registered at `home`
        assert (name, pool) in await workers_at(plan, home)
        assert name not in [n for n, _ in await workers_at(plan, entry)]
        result = await run_task(plan, entry, pool, f"via {entry}".encode())
        assert (result.status, result.output) == (
            pb.TASK_STATUS_SUCCEEDED,
            f"via {entry}".encode()[::-1],
        )


@pytest.mark.parametrize(("entry", "home", "pool"), [("a", "b", "pb"), ("b", "a", "pa")])
async def test_a_worker_at_the_wrong_shard_serves_its_pool_at_the_right_one(
    open_plan: Plan, entry: str, home: str, pool: str
) -> None:
    await serves_at_the_right_shard(open_plan, entry, home, pool, f"py-{entry}-to-{home}")


async def test_a_worker_token_follows_a_redirect_to_a_loopback_http_endpoint(
    token_plan: Plan,
) -> None:
    await serves_at_the_right_shard(token_plan, "a", "b", "pb", "py-token")


async def test_a_redirect_to_plain_http_on_another_host_is_refused_with_a_token(
    remote_plan: Plan,
) -> None:
    b = remote_plan.b
    w = Worker(remote_plan.a.address, "pb", reverse, name="py-refused", token=WORKER, backoff=FAST)
    with pytest.raises(ClientError, match="plaintext") as e:
        await asyncio.wait_for(w.run(), WAIT)
    assert (e.value.code, w.connections) == ("failed_precondition", 1)  # never connected to b
    assert f"pool 'pb' is served by shard 'b' at {b.endpoint}" in e.value.message
    assert "py-refused" not in [n for n, _ in await workers_at(remote_plan, "b")]


async def test_insecure_redirect_http_follows_a_redirect_to_another_host(
    remote_plan: Plan, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "cronoq.client"):
        await serves_at_the_right_shard(
            remote_plan, "a", "b", "pb", "py-insecure", insecure_redirect_http=True
        )
    assert f"plaintext to shard endpoint {remote_plan.b.endpoint}" in caplog.text


async def test_when_its_shard_is_gone_the_worker_asks_its_target_again(
    own_plan: Plan, caplog: pytest.LogCaptureFixture
) -> None:
    plan = own_plan

    def redirects() -> int:
        return sum(r.getMessage().startswith("worker redirected") for r in caplog.records)

    w = Worker(plan.a.address, "pb", reverse, name="py-back", backoff=FAST)
    with caplog.at_level(logging.INFO, "cronoq.client"):
        async with running(w) as task:
            await registered(w, task)
            assert redirects() == 1
            await asyncio.to_thread(plan.kill, "b")
            # b unreachable: the worker goes back to a, which sends it to b again, and so on
            await until(lambda: redirects() >= 2, WAIT, "a second redirect")
            await asyncio.to_thread(plan.start, "b")  # on the same port
            await registered(w, task)
            assert ("py-back", "pb") in await workers_at(plan, "b")
            result = await run_task(plan, "a", "pb", b"again")
            assert (result.status, result.output) == (pb.TASK_STATUS_SUCCEEDED, b"niaga")


async def test_shards_that_disagree_about_a_pool_end_run_after_three_redirects(
    disagreeing_plan: Plan,
) -> None:
    plan = disagreeing_plan
    w = Worker(plan.a.address, "pb", reverse, name="py-loop", backoff=FAST)
    with pytest.raises(ClientError, match="4 shard redirects in a row") as e:
        await asyncio.wait_for(w.run(), WAIT)
    assert (e.value.code, w.connections) == ("failed_precondition", 1 + MAX_REDIRECTS)
    # the last refusal, b's, sent it back to a
    assert f"pool 'pb' is served by shard 'a' at {plan.a.endpoint}" in e.value.message
