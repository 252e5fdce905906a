"""Routing across shards through real `cronoq-server` processes (docs/sharding.md): every call
of "Forward, refuse or gather" sent to a server that does not own its target, over gRPC (the
generated stubs, and `cronoq.client` where the user sees the result) and over the HTTP API;
the refusals ("Refusals", "Order of checks"), when a caller's token may be forwarded
("Forwarding"), the rules across shards (dependencies, resources, batches), keys in several
shards ("Keys across shards"), merged and paged listings ("Merged listings"), the merged Watch
("Watch across shards"), workers ("Workers") and the `cronoq` command through any shard.

Three clusters, each started once, every server a real process with a memory store:

* `cluster`: shards a (number 1: pools default, pa, qa), b (2: pb, qb) and c (200: pc, qc) on
  loopback, with tokens of every role and a client and a worker token restricted to pool pa;
  resource `cpu` counted by a, `gpu` by b. Pools q* hold only the 10 000 tasks of the paging
  test. Tests share it, each with keys, schedules and worker names of its own.
* `guarded`: shard near (5) on loopback with tokens; far (6) at `http://0.0.0.0:<port>`, a
  plain http endpoint on a host that is not loopback for the servers but that reaches far's
  loopback listener on Linux, so a call that is refused there cannot pass for one that
  merely failed to connect; and void (7) at `http://10.255.255.1:7070`, whose server never
  runs. near refuses to send a bearer token to far or void; near_open, the same shard with
  `insecure_peer_http = true` (its plan has no void), forwards it to far.
* `open_pair` (one test's own): two shards without credentials, one of them stopped by the test.

(Whatever answers at 10.255.255.1:7070 is never relied on: on some networks nothing does, on
others a middlebox accepts the connection. So void is only ever refused, never forwarded to.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import grpc.aio
import pytest

from cronoq.client import Client, ClientError, Lease, Worker
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from helpers.auth import Stubs, connect, md, token
from helpers.servers import Server, write
from helpers.shards import Shard, config
from helpers.waiting import until

Code = grpc.StatusCode
SCALE = 3.0  # how much slower than an idle machine a loaded one may be, unless overridden
TIME_SCALE = float(os.environ.get("CRONOQ_TEST_TIME_SCALE") or SCALE)
WAIT = 5.0 * TIME_SCALE  # a safety net for any condition awaited here; only a hang reaches it
LONG = 60.0 * TIME_SCALE  # the same for the tests that run whole commands or 10 000 tasks
SHIFT = 56  # a task id's top 8 bits are its shard's number (docs/sharding.md, "Task ids")
EPOCH_BITS = 0xFFFF << 40  # the store epoch: 0 for a memory store
FORWARDED = [("cronoq-forwarded", "1")]
SHARD_KEYS = ("cronoq-shard", "cronoq-shard-endpoint")
CLI = [sys.executable, "-m", "cronoq.cli"]
CLI_ENV = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")} | {"COLUMNS": "200"}
NEVER = "0 0 1 1 *"  # a cron line that fires once a year: schedules here never submit a task


def auth(restricted: str) -> str:
    """`[[auth.tokens]]` of every role, and a client and a worker token (`client_pa`,
    `worker_pa`) allowed only the pool `restricted`."""
    tokens = {
        "admin": 'role = "admin"',
        "client": 'role = "client"',
        "client_pa": f'role = "client"\npools = ["{restricted}"]',
        "worker": 'role = "worker"',
        "worker_pa": f'role = "worker"\npools = ["{restricted}"]',
    }
    return "".join(f'[[auth.tokens]]\ntoken = "{token(n)}"\n{keys}\n' for n, keys in tokens.items())


RESOURCES = (
    '[[resources]]\nkind = "semaphore"\nname = "cpu"\npermits = 4\nshard = "a"\n'
    '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 4\nshard = "b"\n'
)

_T = TypeVar("_T")


# --- servers ----------------------------------------------------------------------------------


@dataclass
class Cluster:
    """Shards by name, and the running server of each (by its own name, `near_open` too)."""

    shards: dict[str, Shard]
    servers: dict[str, Server] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Shard:
        return self.shards[name]


def start(directory: Path, files: Mapping[str, str]) -> dict[str, Server]:
    """A server process for each config text, started at once; returned once all are ready.
    Any that started are killed if one fails."""
    paths = {name: write(directory, text, f"{name}.toml") for name, text in files.items()}
    servers: dict[str, Server] = {}
    with ThreadPoolExecutor(len(paths)) as threads:
        futures = {name: threads.submit(Server, path) for name, path in paths.items()}
    try:
        for name, future in futures.items():
            servers[name] = future.result()
        for s in servers.values():
            s.wait_for("event=ready")
    except BaseException:
        for s in servers.values():
            s.kill()
        for future in futures.values():
            if future.exception() is None:
                future.result().kill()
        raise
    return servers


@contextlib.contextmanager
def running(cluster: Cluster, directory: Path, files: Mapping[str, str]) -> Iterator[Cluster]:
    cluster.servers = start(directory, files)
    try:
        yield cluster
    finally:
        for s in cluster.servers.values():
            s.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    shards = [
        Shard("a", 1, ["default", "pa", "qa"]),
        Shard("b", 2, ["pb", "qb"]),
        Shard("c", 200, ["pc", "qc"]),
    ]
    files = {s.name: config(s, shards, rest=auth("pa") + RESOURCES) for s in shards}
    with running(
        Cluster({s.name: s for s in shards}), tmp_path_factory.mktemp("shards"), files
    ) as c:
        yield c


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    near = Shard("near", 5, ["np"])
    far = Shard("far", 6, ["fp"], host="0.0.0.0")
    void = Shard("void", 7, ["vp"], host="10.255.255.1", grpc_port=7070)
    near_open = Shard("near", 5, ["np"])  # the same shard, another server (and endpoint)
    plan = [near, far, void]
    files = {
        "near": config(near, plan, rest=auth("np")),
        "far": config(far, plan, rest=auth("np")),
        "near_open": config(
            near_open, [near_open, far], server="insecure_peer_http = true\n", rest=auth("np")
        ),
    }
    shards = {"near": near, "far": far, "void": void, "near_open": near_open}
    with running(Cluster(shards), tmp_path_factory.mktemp("guarded"), files) as c:
        yield c


@pytest.fixture
def open_pair(tmp_path: Path) -> Iterator[Cluster]:
    """No credentials; shard two's endpoint is plain http on a host that is not loopback."""
    one = Shard("one", 10, ["p1"])
    two = Shard("two", 11, ["p2"], host="0.0.0.0")
    files = {s.name: config(s, [one, two]) for s in (one, two)}
    with running(Cluster({"one": one, "two": two}), tmp_path, files) as c:
        yield c


# --- calls ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def channels(cluster: Cluster, *names: str) -> AsyncIterator[dict[str, Stubs]]:
    """Stubs on a channel to each named shard's server (every server without names)."""
    async with contextlib.AsyncExitStack() as stack:
        out = {}
        for name in names or tuple(cluster.servers):
            out[name] = await stack.enter_async_context(connect(cluster[name].address))
        yield out


def run(coroutine: Coroutine[Any, Any, _T], timeout: float = LONG) -> _T:
    """Run a test body on a fresh loop under `timeout` (for tests longer than the directory's
    default guard of async tests allows)."""

    async def guarded() -> _T:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(guarded())


def spec(pool: str, payload: bytes = b"x", **fields: Any) -> pb.TaskSpec:
    return pb.TaskSpec(payload=payload, pool=pool, **fields)


def by(target: int | str) -> pb.TaskRef:
    return pb.TaskRef(key=target) if isinstance(target, str) else pb.TaskRef(id=target)


def number_of(task_id: int) -> int:
    return task_id >> SHIFT


async def submit(s: Stubs, pool: str, who: str = "client", **fields: Any) -> int:
    reply = await s.tasks.Submit(pb.SubmitRequest(task=spec(pool, **fields)), metadata=md(who))
    task_id: int = reply.id
    return task_id


async def failure(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error a call ends with (it must fail)."""
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e
    raise AssertionError("the call succeeded")


def trailers(e: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: v for k, v in e.trailing_metadata() or () if isinstance(v, str)}


def assert_refused(e: grpc.aio.AioRpcError, what: str, shard: Shard) -> None:
    """docs/sharding.md, "Refusals": the message and both trailers, the endpoint unchanged."""
    assert e.code() is Code.FAILED_PRECONDITION, (e.code(), e.details())
    assert e.details() == f"{what} is served by shard '{shard.name}' at {shard.endpoint}"
    got = trailers(e)
    assert (got.get(SHARD_KEYS[0]), got.get(SHARD_KEYS[1])) == (shard.name, shard.endpoint), got


def assert_no_shard_metadata(e: grpc.aio.AioRpcError) -> None:
    assert not [k for k in trailers(e) if k.startswith("cronoq-shard")], trailers(e)


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any


class Http:
    """JSON requests to the HTTP listeners of a cluster's servers."""

    def __init__(self, session: aiohttp.ClientSession, cluster: Cluster) -> None:
        self.session = session
        self.cluster = cluster

    async def call(
        self,
        at: str,
        verb: str,
        path: str,
        body: Any = None,
        *,
        who: str | None = "admin",
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        sent = dict(headers or {})
        if who is not None:
            sent["Authorization"] = f"Bearer {token(who)}"
        url = f"http://{self.cluster[at].http_address}{path}"
        kw: dict[str, Any] = {} if body is None else {"json": body}
        async with self.session.request(verb, url, headers=sent, **kw) as r:
            raw = await r.read()
            return Answer(r.status, dict(r.headers), json.loads(raw) if raw else None)

    async def ok(self, at: str, verb: str, path: str, body: Any = None, **kw: Any) -> Any:
        answer = await self.call(at, verb, path, body, **kw)
        assert answer.status == 200, (verb, path, answer.status, answer.body)
        return answer.body


@contextlib.asynccontextmanager
async def http(cluster: Cluster) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(session, cluster)


def assert_http_error(answer: Answer, status: int, code: str, message: str) -> None:
    """The error body of docs/http.md, and never a cronoq-shard* header (docs/sharding.md,
    "HTTP")."""
    assert (answer.status, answer.body) == (status, {"code": code, "error": message})
    assert not [h for h in answer.headers if h.lower().startswith("cronoq-")], answer.headers


async def reverse(lease: Lease) -> bytes:
    return lease.payload[::-1]


@contextlib.asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[Worker]:
    """`worker.run()` until the end of the block, once it has registered."""
    task = asyncio.create_task(worker.run())
    try:
        registered = asyncio.ensure_future(worker.wait_registered())
        done, _ = await asyncio.wait(
            {registered, task}, timeout=WAIT, return_when="FIRST_COMPLETED"
        )
        if registered not in done:
            registered.cancel()
            if task.done():
                task.result()  # run()'s own error
            raise AssertionError(f"{worker!r} did not register")
        yield worker
    finally:
        await worker.stop(0.5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, WAIT)


def register(pool: str, name: str = "w") -> pb.WorkerMessage:
    return pb.WorkerMessage(
        register=pb.Register(pool=pool, slots=1, worker_name=name, protocol_version=3)
    )


class RawWorker:
    """A raw Work stream that registers `name` for `pool` and then only stays connected."""

    def __init__(self, s: Stubs, pool: str, name: str, who: str = "worker") -> None:
        self._outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self._outbox.put_nowait(register(pool, name))
        self.call = s.workers.Work(self._messages(), metadata=md(who))

    async def _messages(self) -> AsyncIterator[pb.WorkerMessage]:
        while (msg := await self._outbox.get()) is not None:
            yield msg

    async def registered(self) -> None:
        msg = await asyncio.wait_for(self.call.read(), WAIT)
        assert msg is not grpc.aio.EOF and msg.WhichOneof("msg") == "registered", msg

    def close(self) -> None:
        self._outbox.put_nowait(None)
        self.call.cancel()


# --- 1. forward, refuse or gather ---------------------------------------------------------------

# Each pool, and the shard that owns it, for the tests that send to every other shard.
OWNER = {"default": "a", "pa": "a", "pb": "b", "pc": "c"}


async def test_submit_is_forwarded_to_the_shard_of_its_pool(cluster: Cluster) -> None:
    async with channels(cluster) as s, http(cluster) as h:
        for at in ("a", "b", "c"):
            for pool, owner in OWNER.items():
                if owner == at:
                    continue
                shard = cluster[owner]
                task_id = await submit(s[at], pool)
                assert number_of(task_id) == shard.number, (at, pool, hex(task_id))
                assert task_id & EPOCH_BITS == 0, hex(task_id)
                # it is in the owner's own store: the owner finds it without asking anyone
                info = await s[owner].tasks.Get(
                    pb.GetRequest(task=by(task_id)), metadata=md("client") + FORWARDED
                )
                assert (info.id, info.pool, info.status) == (task_id, pool, pb.TASK_STATUS_READY)

                answer = await h.ok(at, "POST", "/v1/tasks", {"pool": pool, "payload": 1})
                assert number_of(int(answer["id"])) == shard.number, (at, pool, answer)
                assert answer["duplicate"] is False
        # the Python client sees the same: the id of the shard that owns the pool
        async with Client(cluster["a"].address, token=token("client")) as client:
            done = await client.submit(b"x", pool="pc", key="submit-client")
            assert number_of(done.id) == cluster["c"].number
            again = await client.submit(b"x", pool="pc", key="submit-client")
            assert (again.id, again.duplicate) == (done.id, True)  # c's key index answered


async def test_a_batch_for_one_other_shard_is_forwarded(cluster: Cluster) -> None:
    async with channels(cluster, "a") as s, http(cluster) as h:
        batch = pb.SubmitBatchRequest(
            tasks=[spec("pb", key="batch-b1"), spec("pb", deps=[pb.Dep(target=by("batch-b1"))])]
        )
        reply = await s["a"].tasks.SubmitBatch(batch, metadata=md("client"))
        ids = [t.id for t in reply.tasks]
        assert [number_of(i) for i in ids] == [2, 2] and ids[0] < ids[1], ids

        body = {"tasks": [{"pool": "pc", "key": "batch-c1"}, {"pool": "pc"}]}
        answer = await h.ok("b", "POST", "/v1/tasks:batch", body)
        assert [number_of(int(t["id"])) for t in answer["tasks"]] == [200, 200], answer


async def test_a_batch_across_shards_is_invalid(cluster: Cluster) -> None:
    async with channels(cluster, "a") as s, http(cluster) as h:
        batch = pb.SubmitBatchRequest(
            tasks=[spec("pa"), spec("pb", key="across-1"), spec("pc", key="across-2")]
        )
        e = await failure(s["a"].tasks.SubmitBatch(batch, metadata=md("client")))
        assert e.code() is Code.INVALID_ARGUMENT
        assert e.details() == (
            "tasks: a batch is admitted by one shard: tasks[0] is for shard 'a' and tasks[1]"
            " for shard 'b'"
        )
        assert_no_shard_metadata(e)

        body = {"tasks": [{"pool": "pc", "key": "across-3"}, {"pool": "pb"}]}
        answer = await h.call("a", "POST", "/v1/tasks:batch", body)
        assert_http_error(
            answer,
            400,
            "bad_request",
            "tasks: a batch is admitted by one shard: tasks[0] is for shard 'c' and tasks[1]"
            " for shard 'b'",
        )
        # nothing of either batch was admitted anywhere
        for key in ("across-1", "across-2", "across-3"):
            e = await failure(s["a"].tasks.Get(pb.GetRequest(task=by(key)), metadata=md("client")))
            assert e.code() is Code.NOT_FOUND, (key, e.details())


async def test_get_wait_and_cancel_by_id_are_forwarded(cluster: Cluster) -> None:
    b = cluster["b"]
    worker = Worker(b.address, "pb", reverse, name="by-id", token=token("worker"))
    async with channels(cluster, "a", "c") as s, http(cluster) as h, serving(worker):
        done = await submit(s["a"], "pb", payload=b"forward me")
        result = await s["c"].tasks.Wait(pb.WaitRequest(task=by(done)), metadata=md("client"))
        assert (result.id, result.status, result.output) == (
            done,
            pb.TASK_STATUS_SUCCEEDED,
            b"em drawrof",
        )
        info = await s["c"].tasks.Get(pb.GetRequest(task=by(done)), metadata=md("client"))
        assert (info.id, info.pool, info.status) == (done, "pb", pb.TASK_STATUS_SUCCEEDED)

        # a task of c, which nobody serves: cancelled through a, then seen cancelled
        pending = await submit(s["a"], "pc")
        cancel = pb.CancelRequest(task=by(pending))
        assert (await s["a"].tasks.Cancel(cancel, metadata=md("client"))).cancelled is True
        assert (await s["a"].tasks.Cancel(cancel, metadata=md("client"))).cancelled is False
        ended = await s["a"].tasks.Wait(pb.WaitRequest(task=by(pending)), metadata=md("client"))
        assert ended.status == pb.TASK_STATUS_CANCELLED

        # the owner's other errors come back as they are (docs/sharding.md, "Peer errors")
        ready = await submit(s["a"], "pc")
        wait = pb.WaitRequest(task=by(ready), timeout_s=0.05)
        e = await failure(s["a"].tasks.Wait(wait, metadata=md("client")))
        assert (e.code(), e.details()) == (
            Code.DEADLINE_EXCEEDED,
            f"task {ready} still ready after 0.05 s",
        )
        unknown = (b.number << SHIFT) | 999_999
        e = await failure(s["a"].tasks.Get(pb.GetRequest(task=by(unknown)), metadata=md("client")))
        assert (e.code(), e.details()) == (Code.NOT_FOUND, "unknown task")
        # an id whose number no shard has is answered by the server asked
        nobody = (77 << SHIFT) | 1
        e = await failure(s["a"].tasks.Get(pb.GetRequest(task=by(nobody)), metadata=md("client")))
        assert (e.code(), e.details()) == (Code.NOT_FOUND, "unknown task")

        # over HTTP, through a third shard
        posted = await h.ok("a", "POST", "/v1/tasks", {"pool": "pb", "payload": "abc"})
        task_id = posted["id"]
        got = await h.ok("c", "GET", f"/v1/tasks/{task_id}/result")
        assert (got["id"], got["status"], got["output_b64"]) == (task_id, "succeeded", "ImNiYSI=")
        info_json = await h.ok("c", "GET", f"/v1/tasks/{task_id}")
        assert (info_json["pool"], info_json["status"]) == ("pb", "succeeded")
        other = (await h.ok("b", "POST", "/v1/tasks", {"pool": "pc"}))["id"]
        assert await h.ok("a", "DELETE", f"/v1/tasks/{other}") == {"cancelled": True}
        assert (await h.ok("b", "GET", f"/v1/tasks/{other}"))["status"] == "cancelled"
        answer = await h.call("a", "GET", f"/v1/tasks/{ready}/result?timeout_s=0.05")
        assert_http_error(answer, 504, "gateway_timeout", f"task {ready} still ready after 0.05 s")


async def test_get_wait_and_cancel_by_key_go_to_the_one_shard_that_holds_it(
    cluster: Cluster,
) -> None:
    async with channels(cluster, "a", "b", "c") as s, http(cluster) as h:
        held_by_c = await submit(s["b"], "pc", key="solo-c")
        for at in ("a", "b"):  # neither holds it: each asks every shard
            info = await s[at].tasks.Get(pb.GetRequest(task=by("solo-c")), metadata=md("client"))
            assert (info.id, info.key, info.pool) == (held_by_c, "solo-c", "pc")
        wait = pb.WaitRequest(task=by("solo-c"), timeout_s=0.05)
        e = await failure(s["a"].tasks.Wait(wait, metadata=md("client")))
        assert (e.code(), e.details()) == (
            Code.DEADLINE_EXCEEDED,
            f"task {held_by_c} still ready after 0.05 s",
        )
        cancel = pb.CancelRequest(task=by("solo-c"))
        assert (await s["a"].tasks.Cancel(cancel, metadata=md("client"))).cancelled is True
        result = await s["b"].tasks.Wait(pb.WaitRequest(task=by("solo-c")), metadata=md("client"))
        assert (result.id, result.status) == (held_by_c, pb.TASK_STATUS_CANCELLED)

        # a key held by the server asked (and by no other) is its own
        mine = await submit(s["a"], "pa", key="solo-a")
        info = await s["a"].tasks.Get(pb.GetRequest(task=by("solo-a")), metadata=md("client"))
        assert info.id == mine

        # over HTTP, by key
        held_by_b = (await h.ok("c", "POST", "/v1/tasks", {"pool": "pb", "key": "solo-b"}))["id"]
        got = await h.ok("a", "GET", "/v1/tasks/by-key/solo-b")
        assert (got["id"], got["key"], got["pool"]) == (held_by_b, "solo-b", "pb")
        assert await h.ok("c", "DELETE", "/v1/tasks/by-key/solo-b") == {"cancelled": True}
        ended = await h.ok("a", "GET", "/v1/tasks/by-key/solo-b/result")
        assert (ended["id"], ended["status"]) == (held_by_b, "cancelled")


async def test_recurring_schedules_are_added_where_their_pool_is_and_gathered(
    cluster: Cluster,
) -> None:
    async with channels(cluster, "a", "b", "c") as s, http(cluster) as h:
        admin = md("admin")
        for name, pool, at in (("rec-c", "pc", "a"), ("rec-a", "pa", "a"), ("rec-b", "pb", "c")):
            add = pb.RecurringRequest(name=name, cron=NEVER, template=spec(pool))
            await s[at].admin.AddRecurring(add, metadata=admin)
        answer = await h.call(
            "b",
            "POST",
            "/v1/recurring",
            {"name": "rec-ch", "cron": NEVER, "template": {"pool": "pc"}},
        )
        assert (answer.status, answer.body) == (200, {})

        # each schedule lives in the shard of its pool alone...
        for shard, names in (("a", {"rec-a"}), ("b", {"rec-b"}), ("c", {"rec-c", "rec-ch"})):
            own = await s[shard].admin.ListRecurring(pb.Empty(), metadata=admin + FORWARDED)
            assert {r.name for r in own.schedules if r.name.startswith("rec-")} == names, shard
        # ...and every server lists them all, merged by name
        for at in ("a", "b", "c"):
            listed = await s[at].admin.ListRecurring(pb.Empty(), metadata=admin)
            mine = [(r.name, r.pool) for r in listed.schedules if r.name.startswith("rec-")]
            assert mine == [("rec-a", "pa"), ("rec-b", "pb"), ("rec-c", "pc"), ("rec-ch", "pc")]
            assert [r.name for r in listed.schedules] == sorted(r.name for r in listed.schedules)
            assert list(listed.unavailable_shards) == []
        body = await h.ok("a", "GET", "/v1/recurring")
        assert [r["name"] for r in body["schedules"] if r["name"].startswith("rec-")] == [
            "rec-a",
            "rec-b",
            "rec-c",
            "rec-ch",
        ]
        assert "unavailable_shards" not in body

        # removed in whichever shard has it; then nowhere
        remove = pb.RemoveRecurringRequest(name="rec-c")
        assert (await s["b"].admin.RemoveRecurring(remove, metadata=admin)).removed is True
        assert (await s["a"].admin.RemoveRecurring(remove, metadata=admin)).removed is False
        assert await h.ok("a", "DELETE", "/v1/recurring/rec-ch") == {"removed": True}
        assert await h.ok("c", "DELETE", "/v1/recurring/rec-ch") == {"removed": False}
        for name in ("rec-a", "rec-b"):
            assert await h.ok("c", "DELETE", f"/v1/recurring/{name}") == {"removed": True}
        listed = await s["c"].admin.ListRecurring(pb.Empty(), metadata=admin)
        assert not [r.name for r in listed.schedules if r.name.startswith("rec-")]


def sums(snap: pb.SnapshotResponse) -> tuple[int, ...]:
    """What a merged Snapshot adds up: the counts and every totals field."""
    totals = tuple(getattr(snap.totals, f.name) for f in pb.Totals.DESCRIPTOR.fields)
    return (snap.live_tasks, snap.running, snap.pending, snap.workers_connected, *totals)


async def test_listings_and_snapshots_are_gathered_from_every_shard(cluster: Cluster) -> None:
    async with channels(cluster) as s, http(cluster) as h:
        admin = md("admin")
        in_a = await submit(s["c"], "pa", key="gather-a")
        in_b = await submit(s["c"], "pb", key="gather-b")
        in_c = await submit(s["a"], "pc", key="gather-c")
        for at in ("a", "b", "c"):
            page = await s[at].tasks.ListTasks(pb.ListTasksRequest(limit=1000), metadata=admin)
            ids = [t.id for t in page.tasks]
            assert {in_a, in_b, in_c} <= set(ids), at
            assert ids == sorted(ids) and list(page.unavailable_shards) == [], at
            # a pools filter asks only the shards of those pools
            some = pb.ListTasksRequest(pools=["pc", "pb"], limit=1000)
            page = await s[at].tasks.ListTasks(some, metadata=admin)
            assert {t.pool for t in page.tasks} == {"pb", "pc"}, at
            assert {in_b, in_c} <= {t.id for t in page.tasks}, at
        body = await h.ok("b", "GET", "/v1/tasks?pool=pa,pc&limit=1000")
        assert {str(in_a), str(in_c)} <= {t["id"] for t in body["tasks"]}
        assert {t["pool"] for t in body["tasks"]} == {"pa", "pc"}
        assert "unavailable_shards" not in body

        # workers: one registered at b, one at c, and a Python worker sent to a for pool pb,
        # which a refuses with b's endpoint and which then registers at b
        at_b = RawWorker(s["b"], "pb", "gather-wb")
        at_c = RawWorker(s["c"], "pc", "gather-wc")
        redirected = Worker(
            cluster["a"].address, "pb", reverse, name="gather-redirected", token=token("worker")
        )
        try:
            await at_b.registered()
            await at_c.registered()
            async with serving(redirected):
                assert redirected.connections == 2  # refused by a, registered at b
                expected = {
                    ("gather-wb", "pb"),
                    ("gather-wc", "pc"),
                    ("gather-redirected", "pb"),
                }
                for at in ("a", "b", "c"):
                    listed = await s[at].admin.ListWorkers(pb.Empty(), metadata=admin)
                    named = {(w.name, w.pool) for w in listed.workers}
                    assert expected <= named, (at, named)
                    assert list(listed.unavailable_shards) == []
                own_b = await s["b"].admin.ListWorkers(pb.Empty(), metadata=admin + FORWARDED)
                assert {w.name for w in own_b.workers} >= {"gather-wb", "gather-redirected"}
                assert "gather-wc" not in {w.name for w in own_b.workers}
                body = await h.ok("a", "GET", "/v1/workers")
                assert expected <= {(w["name"], w["pool"]) for w in body["workers"]}
                assert "unavailable_shards" not in body

                # Snapshot: each shard's own pools, one after the other, and the sums
                async def parts() -> list[pb.SnapshotResponse]:
                    return [
                        await s[n].admin.Snapshot(pb.Empty(), metadata=admin + FORWARDED)
                        for n in ("a", "b", "c")
                    ]

                async def steady() -> tuple[pb.SnapshotResponse, list[pb.SnapshotResponse]] | None:
                    """A merged snapshot taken while no shard's counts changed."""
                    before = await parts()
                    merged = await s["b"].admin.Snapshot(pb.Empty(), metadata=admin)
                    after = await parts()
                    same = [sums(x) for x in before] == [sums(x) for x in after]
                    return (merged, before) if same else None

                merged, own = await until(steady, WAIT, "a snapshot while nothing changes")
                for shard, part in zip(("a", "b", "c"), own, strict=True):
                    assert [p.name for p in part.pools] == cluster[shard].pools, shard
                assert sorted(p.name for p in merged.pools) == sorted(
                    p.name for part in own for p in part.pools
                )
                assert sums(merged) == tuple(map(sum, zip(*(sums(p) for p in own), strict=True)))
                assert merged.workers_connected >= 3 and merged.live_tasks >= 3
                assert list(merged.unavailable_shards) == []
                body = await h.ok("c", "GET", "/v1/snapshot")
                assert {p["name"] for p in body["pools"]} == {p.name for p in merged.pools}
                assert body["unavailable_shards"] == []  # the snapshot always carries it
        finally:
            at_b.close()
            at_c.close()


async def test_watch_merges_the_events_of_every_shard(cluster: Cluster) -> None:
    """One stream at a shows the submits of a, b and c. The other shards' streams open
    asynchronously, so each shard is first probed until one of its events has arrived."""
    async with channels(cluster, "a", "b") as s:
        call = s["a"].tasks.Watch(pb.WatchRequest(all_transitions=True), metadata=md("client"))
        events: list[pb.StatusEvent] = []

        async def read() -> None:
            async for ev in call:
                events.append(ev)

        reader = asyncio.ensure_future(read())
        try:
            probes = 0
            for pool in ("default", "pb", "pc"):

                async def seen(pool: str = pool) -> bool:
                    nonlocal probes
                    probes += 1
                    await submit(s["b"], pool, key=f"watch-probe-{pool}-{probes}")
                    assert not reader.done(), reader
                    return any(e.key.startswith(f"watch-probe-{pool}-") for e in events)

                await until(seen, WAIT, f"the first event of pool {pool}")

            ids = {pool: await submit(s["b"], pool, key=f"watch-{pool}") for pool in OWNER}

            def arrived() -> bool:
                return set(ids.values()) <= {e.id for e in events}

            await until(arrived, WAIT, "an event of every shard")
            for pool, task_id in ids.items():
                ev = next(e for e in events if e.id == task_id)
                assert (ev.pool, ev.key) == (pool, f"watch-{pool}")
                assert number_of(ev.id) == cluster[OWNER[pool]].number
        finally:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader


async def test_register_for_another_shards_pool_is_refused_with_its_endpoint(
    cluster: Cluster,
) -> None:
    """Workers are never proxied: the refusal names the shard to go to (docs/sharding.md,
    "Workers")."""
    async with channels(cluster, "a", "c") as s:
        for at, pool, owner in (("a", "pb", "b"), ("a", "pc", "c"), ("c", "pa", "a")):
            call = s[at].workers.Work(iter([register(pool)]), metadata=md("worker"))
            assert await call.code() is Code.FAILED_PRECONDITION
            details = await call.details()
            assert f"shard '{owner}'" in details
            assert (
                details
                == f"pool '{pool}' is served by shard '{owner}' at {cluster[owner].endpoint}"
            )
            got = {k: v for k, v in await call.trailing_metadata() or ()}
            assert got[SHARD_KEYS[0]] == owner
            assert got[SHARD_KEYS[1]] == cluster[owner].endpoint


# --- 2. refusals ------------------------------------------------------------------------------


async def test_forwarded_calls_for_another_shard_are_refused_with_where_it_is(
    cluster: Cluster,
) -> None:
    """A call carrying `cronoq-forwarded` (any value) is answered by the own shard alone: for
    another shard's target it is refused (docs/sharding.md, "Refusals")."""
    b = cluster["b"]
    async with channels(cluster, "a") as s, http(cluster) as h:
        of_b = await submit(s["a"], "pb", key="refused-b")
        of_a = await submit(s["a"], "pa")
        for value in ("1", "0", ""):
            fwd = [*md("admin"), ("cronoq-forwarded", value)]
            tasks = s["a"].tasks
            e = await failure(tasks.Submit(pb.SubmitRequest(task=spec("pb")), metadata=fwd))
            assert_refused(e, "pool 'pb'", b)
            batch = pb.SubmitBatchRequest(tasks=[spec("pb"), spec("pb")])
            assert_refused(await failure(tasks.SubmitBatch(batch, metadata=fwd)), "pool 'pb'", b)
            for call in (
                tasks.Get(pb.GetRequest(task=by(of_b)), metadata=fwd),
                tasks.Wait(pb.WaitRequest(task=by(of_b), timeout_s=0), metadata=fwd),
                tasks.Cancel(pb.CancelRequest(task=by(of_b)), metadata=fwd),
            ):
                assert_refused(await failure(call), f"task {of_b}", b)
            add = pb.RecurringRequest(name="refused", cron=NEVER, template=spec("pb"))
            e = await failure(s["a"].admin.AddRecurring(add, metadata=fwd))
            assert_refused(e, "pool 'pb'", b)
            # a key is looked up in the own shard only, where it is not
            e = await failure(tasks.Get(pb.GetRequest(task=by("refused-b")), metadata=fwd))
            assert e.code() is Code.NOT_FOUND
            # listings and the snapshot are the own shard's
            page = await tasks.ListTasks(pb.ListTasksRequest(limit=1000), metadata=fwd)
            assert of_a in {t.id for t in page.tasks}
            assert {number_of(t.id) for t in page.tasks} == {1}
            snap = await s["a"].admin.Snapshot(pb.Empty(), metadata=fwd)
            assert [p.name for p in snap.pools] == cluster["a"].pools
        assert (
            await s["a"].tasks.Cancel(pb.CancelRequest(task=by(of_b)), metadata=md("admin"))
        ).cancelled

        # over HTTP: 409 with the same message, and no shard headers
        forwarded = {"cronoq-forwarded": "1"}
        where = f"is served by shard 'b' at {b.endpoint}"
        for verb, path, body in (
            ("POST", "/v1/tasks", {"pool": "pb"}),
            ("POST", "/v1/tasks:batch", {"tasks": [{"pool": "pb"}]}),
            ("GET", f"/v1/tasks/{of_b}", None),
            ("GET", f"/v1/tasks/{of_b}/result", None),
            ("DELETE", f"/v1/tasks/{of_b}", None),
            ("POST", "/v1/recurring", {"name": "r", "cron": NEVER, "template": {"pool": "pb"}}),
        ):
            answer = await h.call("a", verb, path, body, headers=forwarded)
            what = f"task {of_b}" if "/v1/tasks/" in path else "pool 'pb'"
            assert_http_error(answer, 409, "conflict", f"{what} {where}")


async def test_a_token_refused_a_pool_learns_nothing_of_its_shard(cluster: Cluster) -> None:
    """docs/sharding.md, "Order of checks": the pool permission comes before any routing, so
    the refusal carries no shard metadata, also where the call would otherwise be refused
    with it (marked forwarded); Register likewise."""
    async with channels(cluster, "a", "b", "c") as s, http(cluster) as h:
        assert number_of(await submit(s["b"], "pa", who="client_pa")) == 1  # its own pool works
        for at, extra in (("a", []), ("b", []), ("a", FORWARDED), ("c", FORWARDED)):
            restricted = md("client_pa") + extra
            for pool in ("pb", "pc"):
                request = pb.SubmitRequest(task=spec(pool))
                e = await failure(s[at].tasks.Submit(request, metadata=restricted))
                assert (e.code(), e.details()) == (
                    Code.PERMISSION_DENIED,
                    f"task.pool: credentials do not allow pool '{pool}'",
                ), (at, extra)
                assert_no_shard_metadata(e)
                batch = pb.SubmitBatchRequest(tasks=[spec(pool)])
                e = await failure(s[at].tasks.SubmitBatch(batch, metadata=restricted))
                assert e.code() is Code.PERMISSION_DENIED, (at, extra, e.details())
                assert_no_shard_metadata(e)
                call = s[at].workers.Work(iter([register(pool)]), metadata=md("worker_pa") + extra)
                assert await call.code() is Code.PERMISSION_DENIED, (at, extra)
                got = {k for k, _ in await call.trailing_metadata() or ()}
                assert not [k for k in got if k.startswith("cronoq-shard")], got
                details = await call.details()
                assert details == f"register.pool: credentials do not allow pool '{pool}'"
        for headers in (None, {"cronoq-forwarded": "1"}):
            answer = await h.call(
                "a", "POST", "/v1/tasks", {"pool": "pc"}, who="client_pa", headers=headers
            )
            assert_http_error(
                answer, 403, "forbidden", "task.pool: credentials do not allow pool 'pc'"
            )


# --- 4. rules across shards ---------------------------------------------------------------------


async def test_dependencies_and_resources_of_another_shard_are_invalid(cluster: Cluster) -> None:
    """Refused by whichever server is asked, never forwarded (docs/sharding.md, "Forwarding")."""
    async with channels(cluster, "a", "c") as s, http(cluster) as h:
        of_a = await submit(s["a"], "default", key="dep-of-a")
        of_b = await submit(s["a"], "pb", key="dep-of-b")
        across = (
            f"task.deps[0]: task {of_a} is in shard 'a' and this task in shard 'b':"
            " dependencies across shards are not supported"
        )
        gpu = (
            "task.resources: resource 'gpu' belongs to shard 'b', not to shard 'a' of pool 'pa':"
            " resources are never forwarded"
        )
        for at in ("a", "c"):
            dep = pb.Dep(target=by(of_a))
            e = await failure(
                s[at].tasks.Submit(
                    pb.SubmitRequest(task=spec("pb", deps=[dep])), metadata=md("client")
                )
            )
            assert (e.code(), e.details()) == (Code.INVALID_ARGUMENT, across)
            batch = pb.SubmitBatchRequest(tasks=[spec("pb"), spec("pb", deps=[dep])])
            e = await failure(s[at].tasks.SubmitBatch(batch, metadata=md("client")))
            assert (e.code(), e.details()) == (
                Code.INVALID_ARGUMENT,
                "tasks[1]." + across[len("task.") :],
            )
            e = await failure(
                s[at].tasks.Submit(
                    pb.SubmitRequest(task=spec("pa", resources={"gpu": 1})), metadata=md("client")
                )
            )
            assert (e.code(), e.details()) == (Code.INVALID_ARGUMENT, gpu)
        # within one shard both are fine: a dependency by id or key, and its own resource
        same = [pb.Dep(target=by(of_b)), pb.Dep(target=by("dep-of-b"))]
        ok = await submit(s["c"], "pb", deps=same, resources={"gpu": 1})
        assert number_of(ok) == 2
        assert number_of(await submit(s["c"], "pa", resources={"cpu": 1})) == 1
        # a key is resolved in the task's own shard, which does not know a's keys
        e = await failure(
            s["a"].tasks.Submit(
                pb.SubmitRequest(task=spec("pb", deps=[pb.Dep(target=by("dep-of-a"))])),
                metadata=md("client"),
            )
        )
        assert (e.code(), e.details()) == (Code.NOT_FOUND, "unknown dependency 'dep-of-a'")

        answer = await h.call("c", "POST", "/v1/tasks", {"pool": "pb", "deps": [{"id": str(of_a)}]})
        assert_http_error(answer, 400, "bad_request", across)
        answer = await h.call("c", "POST", "/v1/tasks", {"pool": "pa", "resources": {"gpu": 1}})
        assert_http_error(answer, 400, "bad_request", gpu)


async def test_a_schedule_using_another_shards_resource_is_invalid(cluster: Cluster) -> None:
    async with channels(cluster, "a") as s:
        for pool in ("pa", "pc"):  # the server's own pool, and another shard's
            template = spec(pool, resources={"gpu": 1})
            add = pb.RecurringRequest(name=f"res-{pool}", cron=NEVER, template=template)
            e = await failure(s["a"].admin.AddRecurring(add, metadata=md("admin")))
            owner = OWNER[pool]
            assert (e.code(), e.details()) == (
                Code.INVALID_ARGUMENT,
                f"template.resources: resource 'gpu' belongs to shard 'b', not to shard"
                f" '{owner}' of pool '{pool}': resources are never forwarded",
            )


# --- 5. keys across shards ----------------------------------------------------------------------


async def test_a_key_live_in_two_shards_must_be_named_by_id(cluster: Cluster) -> None:
    async with channels(cluster, "a", "b", "c") as s, http(cluster) as h:
        in_a = await submit(s["c"], "default", key="twin")
        in_b = await submit(s["c"], "pb", key="twin")  # keys are deduplicated per shard
        assert (number_of(in_a), number_of(in_b)) == (1, 2)
        refused = "key 'twin' names tasks in shards a, b: use the task id"
        for at in ("a", "b", "c"):
            for call in (
                s[at].tasks.Get(pb.GetRequest(task=by("twin")), metadata=md("client")),
                s[at].tasks.Wait(
                    pb.WaitRequest(task=by("twin"), timeout_s=0), metadata=md("client")
                ),
                s[at].tasks.Cancel(pb.CancelRequest(task=by("twin")), metadata=md("client")),
            ):
                e = await failure(call)
                assert (e.code(), e.details()) == (Code.FAILED_PRECONDITION, refused), at
            for verb, path in (
                ("GET", "/v1/tasks/by-key/twin"),
                ("GET", "/v1/tasks/by-key/twin/result"),
                ("DELETE", "/v1/tasks/by-key/twin"),
            ):
                assert_http_error(await h.call(at, verb, path), 409, "conflict", refused)
        for task_id in (in_a, in_b):  # neither was cancelled
            info = await s["a"].tasks.Get(pb.GetRequest(task=by(task_id)), metadata=md("client"))
            assert info.status == pb.TASK_STATUS_READY

        # only the tasks the caller may see count: pa's "half" is client_pa's one task
        in_pa = await submit(s["b"], "pa", key="half")
        await submit(s["a"], "pb", key="half")
        e = await failure(s["c"].tasks.Get(pb.GetRequest(task=by("half")), metadata=md("client")))
        assert e.details() == "key 'half' names tasks in shards a, b: use the task id"
        info = await s["c"].tasks.Get(pb.GetRequest(task=by("half")), metadata=md("client_pa"))
        assert info.id == in_pa
        cancel = pb.CancelRequest(task=by("half"))
        assert (await s["b"].tasks.Cancel(cancel, metadata=md("client_pa"))).cancelled is True


async def test_a_key_in_no_shard_is_not_found(cluster: Cluster) -> None:
    async with channels(cluster, "a", "b", "c") as s, http(cluster) as h:
        for at in ("a", "b", "c"):
            for call in (
                s[at].tasks.Get(pb.GetRequest(task=by("nowhere")), metadata=md("client")),
                s[at].tasks.Wait(pb.WaitRequest(task=by("nowhere")), metadata=md("client")),
            ):
                e = await failure(call)
                assert (e.code(), e.details()) == (Code.NOT_FOUND, "unknown task"), at
            # Cancel answers an unknown task as the unsharded server does: nothing cancelled
            cancel = pb.CancelRequest(task=by("nowhere"))
            assert (await s[at].tasks.Cancel(cancel, metadata=md("client"))).cancelled is False
            answer = await h.call(at, "GET", "/v1/tasks/by-key/nowhere")
            assert_http_error(answer, 404, "not_found", "unknown task")
            assert await h.ok(at, "DELETE", "/v1/tasks/by-key/nowhere") == {"cancelled": False}


# --- 6. paging a merged list ----------------------------------------------------------------------

PAGED = {"qa": 3334, "qb": 3333, "qc": 3333}  # 10 000 tasks, in pools nothing else uses
CHUNK = 1000  # limits.max_tasks_per_batch


def test_paging_ten_thousand_tasks_across_shards_returns_each_once_in_id_order(
    cluster: Cluster,
) -> None:
    run(_paging(cluster))


async def _paging(cluster: Cluster) -> None:
    pools = list(PAGED)
    async with channels(cluster, "a", "b", "c") as s, http(cluster) as h:
        submitted: list[int] = []
        for pool, count in PAGED.items():
            for start in range(0, count, CHUNK):
                batch = pb.SubmitBatchRequest(
                    tasks=[spec(pool) for _ in range(min(CHUNK, count - start))]
                )
                reply = await s["b"].tasks.SubmitBatch(batch, metadata=md("client"))
                submitted += [t.id for t in reply.tasks]
        assert len(set(submitted)) == 10_000
        expected = sorted(submitted)

        async def pages(at: str, limit: int, *statuses: pb.TaskStatus) -> list[list[int]]:
            out: list[list[int]] = []
            after = 0
            while True:
                request = pb.ListTasksRequest(
                    pools=pools, statuses=statuses, after=after, limit=limit
                )
                page = await s[at].tasks.ListTasks(request, metadata=md("client"))
                ids = [t.id for t in page.tasks]
                assert len(ids) <= limit and list(page.unavailable_shards) == []
                out.append(ids)
                if page.next_after == 0:
                    return out
                assert ids and page.next_after == ids[-1], (page.next_after, ids[-1:])
                after = page.next_after

        got = await pages("c", 500)
        assert [len(p) for p in got] == [500] * 20
        assert [i for p in got for i in p] == expected
        # a limit that does not divide any shard's count: pages span two shards
        got = await pages("a", 777)
        assert [i for p in got for i in p] == expected
        assert all(len(p) == 777 for p in got[:-1])
        # each shard's page is short of the limit, and yet together they pass it: the cut
        # dropped rows, so another page follows
        cancelled = [ids[:5] for ids in (expected[:3334], expected[3334:6667], expected[6667:])]
        for task_id in (i for five in cancelled for i in five):
            cancel = pb.CancelRequest(task=by(task_id))
            assert (await s["a"].tasks.Cancel(cancel, metadata=md("client"))).cancelled
        got = await pages("b", 10, pb.TASK_STATUS_CANCELLED)
        assert got == [cancelled[0] + cancelled[1], cancelled[2]]

        # every pool: the other tests' tasks too, each once and in order
        everything: list[int] = []
        after = 0
        while True:
            request = pb.ListTasksRequest(after=after, limit=1000)
            page = await s["b"].tasks.ListTasks(request, metadata=md("admin"))
            everything += [t.id for t in page.tasks]
            if page.next_after == 0:
                break
            after = page.next_after
        assert everything == sorted(set(everything))
        assert set(expected) <= set(everything)

        # the Python client's paging, and HTTP's next_after (absent on the last page)
        async with Client(cluster["c"].address, token=token("client")) as client:
            listed = [t.id async for t in client.iter_tasks(pools=pools, page_size=600)]
            assert listed == expected
            first = await client.list_tasks(pools=pools, limit=600)
            assert first.next_after == first.tasks[-1].id and first.unavailable_shards == ()
        seen: list[int] = []
        query = "/v1/tasks?pool=qa,qb,qc&limit=1000"
        body = await h.ok("a", "GET", query, who="client")
        while True:
            seen += [int(t["id"]) for t in body["tasks"]]
            assert "unavailable_shards" not in body
            if "next_after" not in body:
                break
            assert body["next_after"] == body["tasks"][-1]["id"]
            body = await h.ok("a", "GET", f"{query}&after={body['next_after']}", who="client")
        assert seen == expected


# --- 7. the command line through any shard -----------------------------------------------------


async def cronoq(server: Shard, who: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """`cronoq --server http://<shard> [--token T] ARGS`, as a user runs it."""
    where = ["--server", f"http://{server.address}"]
    if who is not None:
        where += ["--token", token(who)]
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *where,
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=CLI_ENV,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


def test_the_cli_through_a_shard_shows_the_other_shards(cluster: Cluster) -> None:
    run(_cli_through_b(cluster))


async def _cli_through_b(cluster: Cluster) -> None:
    b = cluster["b"]
    async with channels(cluster, "a", "c") as s:
        in_a = await submit(s["a"], "default", key="cli-a")
        in_c = await submit(s["a"], "pc", key="cli-c")
        worker = RawWorker(s["c"], "pc", "cli-worker")
        try:
            await worker.registered()
            done = await cronoq(
                b, "admin", "list", "--pool", "default", "--pool", "pc", "--all", "--json"
            )
            assert done.returncode == 0 and done.stderr == "", done.stderr
            listed = json.loads(done.stdout)
            ids = [t["id"] for t in listed["tasks"]]
            assert {in_a, in_c} <= set(ids) and ids == sorted(ids)
            assert listed["unavailable_shards"] == [] and listed["next_after"] is None

            done = await cronoq(b, "admin", "list", "--pool", "pc", "--limit", "1000")
            assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
            assert str(in_c) in done.stdout and "cli-c" in done.stdout

            done = await cronoq(b, "admin", "workers", "--json")
            assert done.returncode == 0, done.stderr
            assert ("cli-worker", "pc") in {(w["name"], w["pool"]) for w in json.loads(done.stdout)}

            done = await cronoq(b, "admin", "snapshot")
            assert done.returncode == 0, done.stderr
            snap = json.loads(done.stdout)
            names = {p["name"] for p in snap["pools"]}
            assert names == {p for shard in cluster.shards.values() for p in shard.pools}
            assert snap["unavailable_shards"] == [] and snap["workers_connected"] >= 1
        finally:
            worker.close()


# --- 3. when a token may be forwarded -------------------------------------------------------------


async def test_a_token_is_not_sent_over_plain_http_to_another_host(guarded: Cluster) -> None:
    """near refuses the calls for far and void without trying them: far serves and yet is
    refused (so this is no failed connection), and void's endpoint is named as configured."""
    async with channels(guarded, "near") as s, http(guarded) as h:
        tasks = s["near"].tasks
        for pool, shard in (("fp", guarded["far"]), ("vp", guarded["void"])):
            e = await failure(
                tasks.Submit(pb.SubmitRequest(task=spec(pool)), metadata=md("client"))
            )
            assert_refused(e, f"pool '{pool}'", shard)
            batch = pb.SubmitBatchRequest(tasks=[spec(pool)])
            assert_refused(
                await failure(tasks.SubmitBatch(batch, metadata=md("client"))),
                f"pool '{pool}'",
                shard,
            )
            some = (shard.number << SHIFT) | 1
            e = await failure(tasks.Get(pb.GetRequest(task=by(some)), metadata=md("client")))
            assert_refused(e, f"task {some}", shard)
            answer = await h.call("near", "POST", "/v1/tasks", {"pool": pool}, who="client")
            assert_http_error(
                answer,
                409,
                "conflict",
                f"pool '{pool}' is served by shard '{shard.name}' at {shard.endpoint}",
            )
        assert guarded["void"].endpoint == "http://10.255.255.1:7070"
        # a token that may not use the pool is refused that before any of this
        for pool in ("fp", "vp"):
            e = await failure(
                tasks.Submit(pb.SubmitRequest(task=spec(pool)), metadata=md("client_pa"))
            )
            assert (e.code(), e.details()) == (
                Code.PERMISSION_DENIED,
                f"task.pool: credentials do not allow pool '{pool}'",
            )
            assert_no_shard_metadata(e)
        # the Python client reports the refusal as it came
        async with Client(guarded["near"].address, token=token("client")) as client:
            with pytest.raises(ClientError) as refused:
                await client.submit(b"x", pool="vp")
            assert refused.value.code == "failed_precondition"
            assert "shard 'void' at http://10.255.255.1:7070" in refused.value.message
        # near's own pool is served as ever
        assert number_of(await submit(s["near"], "np")) == 5


async def test_insecure_peer_http_forwards_a_token_to_another_host(guarded: Cluster) -> None:
    far = guarded["far"]
    async with channels(guarded, "near_open", "far") as s, http(guarded) as h:
        task_id = await submit(s["near_open"], "fp", key="insecure")
        assert number_of(task_id) == far.number
        info = await s["far"].tasks.Get(
            pb.GetRequest(task=by(task_id)), metadata=md("client") + FORWARDED
        )
        assert (info.key, info.pool) == ("insecure", "fp")
        posted = await h.ok("near_open", "POST", "/v1/tasks", {"pool": "fp"}, who="client")
        assert number_of(int(posted["id"])) == far.number
        page = await s["near_open"].tasks.ListTasks(
            pb.ListTasksRequest(pools=["fp"]), metadata=md("client")
        )
        assert {task_id, int(posted["id"])} <= {t.id for t in page.tasks}
        assert list(page.unavailable_shards) == []


async def test_listings_name_the_shards_a_token_cannot_be_sent_to(guarded: Cluster) -> None:
    """docs/sharding.md, "Merged listings": still served, the missing shards named."""
    missing = ["far", "void"]
    async with channels(guarded, "near") as s, http(guarded) as h:
        mine = await submit(s["near"], "np", key="listed")
        admin = md("admin")
        page = await s["near"].tasks.ListTasks(pb.ListTasksRequest(limit=1000), metadata=admin)
        assert mine in {t.id for t in page.tasks} and list(page.unavailable_shards) == missing
        for reply in (
            await s["near"].admin.Snapshot(pb.Empty(), metadata=admin),
            await s["near"].admin.ListWorkers(pb.Empty(), metadata=admin),
            await s["near"].admin.ListRecurring(pb.Empty(), metadata=admin),
        ):
            assert sorted(reply.unavailable_shards) == missing, type(reply).__name__
        async with Client(guarded["near"].address, token=token("admin")) as client:
            listed = await client.list_tasks(limit=1000)
            assert sorted(listed.unavailable_shards) == missing
            assert mine in [t.id for t in listed.tasks]
            snap = await client.snapshot()
            assert sorted(snap.unavailable_shards) == missing
            assert [p.name for p in snap.pools] == ["np"]
        for path in ("/v1/tasks", "/v1/snapshot", "/v1/workers", "/v1/recurring"):
            body = await h.ok("near", "GET", path)
            assert sorted(body["unavailable_shards"]) == missing, path


async def test_lookups_by_key_when_shards_cannot_be_asked(guarded: Cluster) -> None:
    """docs/sharding.md, "Keys across shards": a key found where shards answered, with the
    others named; not found, or a cancel by key, cannot be answered."""
    async with channels(guarded, "near") as s:
        tasks = s["near"].tasks
        mine = await submit(s["near"], "np", key="asked")
        call = tasks.Get(pb.GetRequest(task=by("asked")), metadata=md("client"))
        assert (await call).id == mine
        assert dict(await call.initial_metadata() or ()) == {
            "cronoq-unavailable-shards": "far,void"
        }
        e = await failure(tasks.Get(pb.GetRequest(task=by("unasked")), metadata=md("client")))
        assert (e.code(), e.details()) == (
            Code.UNAVAILABLE,
            "key 'unasked' is not in the shards that answered (far, void could not be asked)",
        )
        e = await failure(tasks.Cancel(pb.CancelRequest(task=by("asked")), metadata=md("client")))
        assert (e.code(), e.details()) == (
            Code.UNAVAILABLE,
            "key 'asked' cannot be changed by key: shards far, void could not be asked; use the"
            " task id",
        )
        cancel = pb.CancelRequest(task=by(mine))
        assert (await tasks.Cancel(cancel, metadata=md("client"))).cancelled is True
    async with http(guarded) as h:  # over HTTP a plain answer, with no header about it
        answer = await h.call("near", "GET", "/v1/tasks/by-key/asked", who="client")
        assert (answer.status, answer.body["id"]) == (200, str(mine))
        assert not [k for k in answer.headers if k.lower().startswith("cronoq-")]
        answer = await h.call("near", "GET", "/v1/tasks/by-key/unasked", who="client")
        assert_http_error(
            answer,
            503,
            "service_unavailable",
            "key 'unasked' is not in the shards that answered (far, void could not be asked)",
        )


async def test_a_watch_gets_no_events_and_no_error_from_shards_it_cannot_reach(
    guarded: Cluster,
) -> None:
    async with channels(guarded, "near") as s:
        call = s["near"].tasks.Watch(pb.WatchRequest(all_transitions=True), metadata=md("client"))
        events: list[pb.StatusEvent] = []

        async def read() -> None:
            async for ev in call:
                events.append(ev)

        reader = asyncio.ensure_future(read())
        try:
            probes: list[int] = []

            async def seen() -> bool:
                probes.append(await submit(s["near"], "np", key=f"unreached-{len(probes)}"))
                assert not reader.done(), reader  # far and void end nothing
                return any(e.id in probes for e in events)

            await until(seen, WAIT, "an event of near")
            assert {number_of(e.id) for e in events} == {5}
        finally:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
        # a watch of nothing but a shard it cannot reach would stay silent forever: refused
        only_far = s["near"].tasks.Watch(pb.WatchRequest(pools=["fp"]), metadata=md("client"))
        e = await failure(only_far.read())
        far = guarded.shards["far"]
        assert (e.code(), e.details()) == (
            Code.FAILED_PRECONDITION,
            f"pool 'fp' is served by shard 'far' at {far.endpoint}",
        )


# --- a stopped shard, through the command line ---------------------------------------------------


def test_without_credentials_any_endpoint_is_forwarded_and_the_cli_names_a_stopped_shard(
    open_pair: Cluster,
) -> None:
    run(_stopped(open_pair))


async def _stopped(pair: Cluster) -> None:
    one, two = pair["one"], pair["two"]
    async with channels(pair, "one") as s:
        # authentication is off: forwarded even to plain http on another host
        there = await submit(s["one"], "p2", who="nobody", key="stopped-two")
        here = await submit(s["one"], "p1", key="stopped-one")
        assert (number_of(there), number_of(here)) == (two.number, one.number)
    done = await cronoq(one, None, "list", "--all", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [t["id"] for t in json.loads(done.stdout)["tasks"]] == [here, there]

    pair.servers["two"].kill()  # kill -9

    done = await cronoq(one, None, "list", "--all", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "cronoq: warning: shards not answering, tasks missing: two\n"
    listed = json.loads(done.stdout)
    assert [t["id"] for t in listed["tasks"]] == [here]
    assert listed["unavailable_shards"] == ["two"]
    done = await cronoq(one, None, "list")
    assert "shards not answering, tasks missing: two" in done.stderr
    assert str(here) in done.stdout and str(there) not in done.stdout
    done = await cronoq(one, None, "snapshot")
    assert done.returncode == 0, done.stderr
    snap = json.loads(done.stdout)
    assert snap["unavailable_shards"] == ["two"] and [p["name"] for p in snap["pools"]] == ["p1"]
    done = await cronoq(one, None, "workers", "--json")
    assert (done.returncode, json.loads(done.stdout)) == (0, [])
