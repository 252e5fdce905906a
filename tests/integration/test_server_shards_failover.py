"""Shards that fail (docs/sharding.md, "Task ids", "Failure modes", "Peer errors", "Merged
listings", "Keys across shards"), with real `cronoq-server` processes on loopback, real Python
workers (`cronoq.client.Worker`) and real stores:

* shard "a", number 1, on PostgreSQL (tests/conftest.py), with a leader and a standby on its
  schema; its endpoint in the plan is a TCP proxy (helpers/tcpproxy.py) in front of the leader;
* shard "b", number 2, on a SQLite file in the test's directory;
* shard "c", number 200, in memory.

Every server of a test keeps its ports across restarts, so the plan stays true. Waits are
conditions polled against LONG, which only fails a hung process; nothing here asserts how long
anything took (the takeover and the time until the other shards see a restarted shard again
are printed, for the record).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from cronoq.client import Lease, Worker
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers import pgstore
from helpers.pg import Cluster
from helpers.ports import free_ports
from helpers.servers import Server, write
from helpers.shards import Shard, config
from helpers.tcpproxy import TcpProxy

LONG = 60.0  # a safety net for every wait: only a hung process gets near it
ACKS = 20  # submits acknowledged per pool in each phase of a load before the test moves on
PACE_S = 0.01  # between one acknowledged submit and the next, per load thread (a client's pace)
# Lost attempts (a server killed while its worker ran them) are retried soon, many times.
POOL_KEYS = "max = 64\nretry = { max_attempts = 20, initial_backoff_s = 0.05, jitter = false }\n"
CRON = "0 0 1 1 *"  # a schedule that does not fire during a test
PG_URL_ENV = "CRONOQ_TEST_SHARD_PG_URL"
OWN_STORE = "a sharded server needs a store (schema or file) of its own"
UNAVAILABLE_SHARDS = "cronoq-unavailable-shards"
SUCCEEDED = pb.TASK_STATUS_SUCCEEDED
EPOCH_SHIFT = 40  # a sharded id: number << 56 | epoch << 40 | sequence


def shard_of(task_id: int) -> int:
    return task_id >> 56


def epoch_of(task_id: int) -> int:
    return (task_id >> EPOCH_SHIFT) & 0xFFFF


def first_id(number: int, epoch: int) -> int:
    """docs/sharding.md, "Task ids": the first id a leader of `epoch` issues."""
    return number << 56 | epoch << EPOCH_SHIFT | 1


_T = TypeVar("_T")


def until(check: Callable[[], _T], what: str, timeout: float = LONG) -> _T:
    """Poll `check` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s: {what}"
        time.sleep(0.02)
    return value


# --- clients ---------------------------------------------------------------------------------


class Api:
    """The Tasks and Admin services of one server, on a channel of their own."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.tasks: Any = cronoq_pb2_grpc.TasksStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin: Any = cronoq_pb2_grpc.AdminStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.channel.close()

    def submit(self, pool: str, key: str, payload: bytes = b"") -> pb.SubmitResponse:
        spec = pb.TaskSpec(pool=pool, key=key, payload=payload or key.encode())
        reply: pb.SubmitResponse = self.tasks.Submit(pb.SubmitRequest(task=spec), timeout=LONG)
        return reply

    def get(self, ref: pb.TaskRef) -> pb.TaskInfo:
        info: pb.TaskInfo = self.tasks.Get(pb.GetRequest(task=ref), timeout=LONG)
        return info

    def get_with_metadata(self, ref: pb.TaskRef) -> tuple[pb.TaskInfo, dict[str, str]]:
        info, call = self.tasks.Get.with_call(pb.GetRequest(task=ref), timeout=LONG)
        return info, {m.key: m.value for m in call.initial_metadata()}

    def cancel(self, ref: pb.TaskRef) -> pb.CancelResponse:
        reply: pb.CancelResponse = self.tasks.Cancel(pb.CancelRequest(task=ref), timeout=LONG)
        return reply

    def wait(self, task_id: int) -> pb.TaskResult:
        request = pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=LONG)
        result: pb.TaskResult = self.tasks.Wait(request, timeout=LONG + 5)
        return result

    def page(self, after: int = 0, limit: int = 1000) -> pb.ListTasksResponse:
        request = pb.ListTasksRequest(after=after, limit=limit)
        reply: pb.ListTasksResponse = self.tasks.ListTasks(request, timeout=LONG)
        return reply

    def every_task(self) -> tuple[dict[int, pb.TaskInfo], set[str]]:
        """Every task of every shard that answered, paged in id order; the shards that did
        not answer (on any page)."""
        tasks: dict[int, pb.TaskInfo] = {}
        missing: set[str] = set()
        after = 0
        while True:
            page = self.page(after)
            missing.update(page.unavailable_shards)
            ids = [t.id for t in page.tasks]
            assert ids == sorted(ids) and all(i > after for i in ids), "a page out of id order"
            tasks.update((t.id, t) for t in page.tasks)
            if not page.next_after:
                return tasks, missing
            after = page.next_after

    def workers(self) -> pb.ListWorkersResponse:
        reply: pb.ListWorkersResponse = self.admin.ListWorkers(pb.Empty(), timeout=LONG)
        return reply

    def recurring(self) -> pb.ListRecurringResponse:
        reply: pb.ListRecurringResponse = self.admin.ListRecurring(pb.Empty(), timeout=LONG)
        return reply

    def snapshot(self) -> pb.SnapshotResponse:
        reply: pb.SnapshotResponse = self.admin.Snapshot(pb.Empty(), timeout=LONG)
        return reply

    def remove_recurring(self, name: str) -> bool:
        request = pb.RemoveRecurringRequest(name=name)
        reply: pb.RemoveRecurringResponse = self.admin.RemoveRecurring(request, timeout=LONG)
        return reply.removed

    def watch(self, pools: Sequence[str] = ()) -> Watching:
        return Watching(self.tasks.Watch(pb.WatchRequest(pools=pools), timeout=LONG * 2))

    def add_recurring(self, name: str, pool: str) -> None:
        template = pb.TaskSpec(pool=pool, payload=name.encode())
        request = pb.RecurringRequest(name=name, cron=CRON, template=template)
        self.admin.AddRecurring(request, timeout=LONG)


class Watching:
    """A Watch stream read by a thread: its events in `events`, then how it ended."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.events: queue.Queue[pb.StatusEvent] = queue.Queue()
        self.ended: tuple[grpc.StatusCode, str] | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for event in self.call:
                self.events.put(event)
        except grpc.RpcError as e:
            self.ended = (e.code(), e.details() or "")
        else:
            self.ended = (grpc.StatusCode.OK, "")

    def cancel(self) -> None:
        self.call.cancel()


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status code and message `call` fails with (it must fail)."""
    try:
        got = call()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    raise AssertionError(f"expected an error, got {got!r}")


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: dict[str, Any]


def http_call(address: str, method: str, path: str, body: object = None) -> HttpAnswer:
    """One request to a server's HTTP listener, on a connection of its own."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=LONG)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"content-type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        answer = json.loads(response.read())
        return HttpAnswer(response.status, {k.lower(): v for k, v in response.getheaders()}, answer)
    finally:
        conn.close()


def http_json(address: str, path: str) -> dict[str, Any]:
    """The JSON body of a GET of `path` (which must answer 200)."""
    answer = http_call(address, "GET", path)
    assert answer.status == 200, (path, answer)
    return answer.body


# --- servers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """A PostgreSQL schema, as helpers/pgstore.py reaches it."""

    url: str
    schema: str


@dataclass
class Place:
    """One server's place: its shard entry (its own listener ports), its config file and the
    process there now."""

    shard: Shard
    config: str
    env: dict[str, str]
    server: Server | None = None

    @property
    def address(self) -> str:
        return self.shard.address

    @property
    def http(self) -> str:
        return self.shard.http_address

    def start(self) -> Server:
        assert self.server is None or self.server.proc.poll() is not None
        self.server = Server(self.config, env=self.env)
        return self.server

    def serve(self) -> Server:
        """Start and wait until it leads."""
        server = self.start()
        server.wait_for("event=ready")
        return server

    def kill9(self) -> None:
        assert self.server is not None
        self.server.proc.send_signal(signal.SIGKILL)
        assert self.server.proc.wait(LONG) == -signal.SIGKILL

    def sigterm(self) -> None:
        assert self.server is not None
        assert self.server.terminate(LONG) == 0

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()


class Shards:
    """Three shards: "a" (1) on PostgreSQL behind a proxy, with servers a1 and a2; "b" (2) on
    SQLite; "c" (200) in memory. Nothing runs until a test starts it."""

    def __init__(self, tmp_path: Path, url: str, schema: str) -> None:
        self.tmp = tmp_path
        self.url = url
        self.schema_a = Schema(url, f"{schema}_a")
        # The plan's endpoint of shard "a" is the proxy, which forwards to whichever of its
        # servers leads (switched by the test when the leader dies, as a load balancer or a
        # virtual IP would). The proxy is the simplest way: both servers bind their own ports
        # at start (a standby listens too), so they cannot share one, and the leader's port
        # cannot be handed to the standby once it runs.
        ports = iter(free_ports(9))
        self.proxy = TcpProxy(("127.0.0.1", 1))  # aimed at a1 below, once its port is known
        self.proxy.port = next(ports)
        pg_store = (
            f'[store]\nkind = "postgres"\nurl_env = "{PG_URL_ENV}"\nschema = "{schema}_{{shard}}"\n'
        )
        sqlite_store = f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q-{{shard}}.db"\n'
        # (its http_port is never used: only a1 and a2 listen)
        self.a = Shard("a", 1, ["pa", "pa_idle"], pg_store, self.proxy.port, 0, pool_keys=POOL_KEYS)
        self.b = Shard("b", 2, ["pb"], sqlite_store, next(ports), next(ports), pool_keys=POOL_KEYS)
        self.c = Shard("c", 200, ["pc"], "", next(ports), next(ports), pool_keys=POOL_KEYS)
        self.plan = [self.a, self.b, self.c]
        a1 = dataclasses.replace(self.a, grpc_port=next(ports), http_port=next(ports))
        a2 = dataclasses.replace(self.a, grpc_port=next(ports), http_port=next(ports))
        self.proxy.target = ("127.0.0.1", a1.grpc_port)
        self.proxy.start()
        self.a1 = self.place(a1, "a1")
        self.a2 = self.place(a2, "a2")
        self.pb = self.place(self.b, "b")
        self.pc = self.place(self.c, "c")
        self.workers: Workers | None = None
        self.loads: list[Load] = []
        self.apis: list[Api] = []

    def place(self, own: Shard, name: str, plan: Sequence[Shard] | None = None) -> Place:
        """A server of shard `own` (listening on its ports) reading `plan` (default the
        three shards)."""
        path = write(self.tmp, config(own, plan or self.plan), f"{name}.toml")
        return Place(own, path, {PG_URL_ENV: self.url})

    def start(self, *, standby: bool = False) -> None:
        """a1 (leading shard a), optionally a2 (standing by), b and c, and a worker per
        pool with tasks to run (pa_idle has none)."""
        self.a1.serve()
        if standby:
            self.a2.start().wait_for("event=awaiting_leadership")
        self.pb.serve()
        self.pc.serve()
        # Each worker connects to its own shard: shard a's through the plan's endpoint.
        self.workers = Workers({"pa": self.a.address, "pb": self.b.address, "pc": self.c.address})

    def api(self, place: Place) -> Api:
        api = Api(place.address)
        self.apis.append(api)
        return api

    def load(self, entry: Place, pools: Sequence[str]) -> Load:
        load = Load(entry.address, pools)
        self.loads.append(load)
        load.start()
        return load

    def close(self) -> None:
        for load in self.loads:
            load.stop()
        if self.workers is not None:
            self.workers.stop()
        for api in self.apis:
            api.close()
        for place in (self.a1, self.a2, self.pb, self.pc):
            place.kill()
        self.proxy.stop()

    def epoch_a(self) -> int:
        rows = asyncio.run(pgstore.fetch(self.schema_a, "SELECT epoch FROM cronoq_leader"))
        return int(rows[0][0])


@pytest.fixture
def shards(tmp_path: Path, pg_cluster: Cluster) -> Iterator[Shards]:
    made = Shards(tmp_path, pg_cluster.url, pg_cluster.schema())
    try:
        yield made
    finally:
        made.close()


# --- workers and load ------------------------------------------------------------------------


class Workers:
    """A `cronoq.client.Worker` per pool, on an event loop in a thread of their own: each
    records the (task id, attempt) of every lease, then answers with the payload reversed.
    They reconnect soon after a server comes back."""

    def __init__(self, targets: dict[str, str]) -> None:
        self.ran: list[tuple[int, int]] = []
        self._targets = targets
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._started.wait(LONG), "the workers did not start"

    async def _handle(self, lease: Lease) -> bytes:
        self.ran.append((lease.task_id, lease.attempt))
        return lease.payload[::-1]

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        workers = [
            Worker(target, pool, self._handle, slots=4, backoff=(0.05, 0.5), grace=1.0)
            for pool, target in self._targets.items()
        ]
        runs = [asyncio.create_task(w.run()) for w in workers]
        self._started.set()
        await self._stop.wait()
        await asyncio.gather(*(w.stop() for w in workers))
        await asyncio.gather(*runs)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(LONG)
        assert not self._thread.is_alive(), "the workers did not stop"

    def repeated(self) -> list[tuple[int, int]]:
        """(task, attempt) pairs that were leased more than once."""
        return sorted(r for r, n in Counter(self.ran).items() if n > 1)


@dataclass(frozen=True)
class Ack:
    pool: str
    key: str
    id: int
    duplicate: bool
    phase: int  # Load.phase when the answer came


@dataclass(frozen=True)
class Failure:
    pool: str
    code: grpc.StatusCode
    details: str
    phase: int


class Load:
    """A thread per pool submitting keyed tasks through one server, one after another. A submit
    that fails is sent again with the same key until it is acknowledged (a task the server
    stored before its answer was lost is then found by its key, not submitted twice). `phase`
    is set by the test; each answer and failure records the phase it came in."""

    def __init__(self, entry: str, pools: Sequence[str]) -> None:
        self.entry = entry
        self.phase = 0
        self.acked: list[Ack] = []
        self.failed: list[Failure] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(pool,), daemon=True) for pool in pools
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(LONG)
            assert not t.is_alive(), "a submitting thread hangs"

    def count(self, pool: str, phase: int | None = None, epoch: int | None = None) -> int:
        """Fresh tasks acknowledged for `pool` (in `phase`, with ids of `epoch`)."""
        with self._lock:
            return sum(
                1
                for a in self.acked
                if a.pool == pool
                and not a.duplicate
                and (phase is None or a.phase == phase)
                and (epoch is None or epoch_of(a.id) == epoch)
            )

    def acks(self, pool: str | None = None) -> list[Ack]:
        with self._lock:
            return [a for a in self.acked if pool is None or a.pool == pool]

    def _run(self, pool: str) -> None:
        api = Api(self.entry)
        seq = 0
        try:
            while not self._stop.is_set():
                key = f"{pool}-{seq}"
                while not self._stop.is_set():
                    try:
                        reply = api.submit(pool, key)
                    except grpc.RpcError as e:
                        with self._lock:
                            failure = Failure(pool, e.code(), e.details() or "", self.phase)
                            self.failed.append(failure)
                        self._stop.wait(PACE_S)  # a client's retry pace
                        continue
                    with self._lock:
                        self.acked.append(Ack(pool, key, reply.id, reply.duplicate, self.phase))
                    break
                seq += 1
                self._stop.wait(PACE_S)
        finally:
            api.close()


def all_succeeded(api: Api, acks: Sequence[Ack]) -> Callable[[], bool]:
    """A check: every acknowledged task is listed (by the shards through `api`) and succeeded,
    with its key."""

    def check() -> bool:
        tasks, _ = api.every_task()
        for ack in acks:
            info = tasks.get(ack.id)
            if info is None or info.status != SUCCEEDED:
                return False
            assert info.key == ack.key, (ack, info)
        return True

    return check


def ordered(acks: Sequence[Ack]) -> None:
    """Each pool's thread submitted one key after the other: its fresh ids only grow."""
    for pool in {a.pool for a in acks}:
        ids = [a.id for a in acks if a.pool == pool and not a.duplicate]
        assert ids == sorted(ids) and len(set(ids)) == len(ids), pool


# --- 1. ids ------------------------------------------------------------------------------------


def test_ids_carry_the_shard_number_and_a_restart_keeps_them(shards: Shards) -> None:
    """Each shard's ids carry its number in `id >> 56`, whichever server took the submit; a
    fresh SQLite or PostgreSQL store starts at epoch 1 (`S << 56 | 1 << 40 | 1`), memory at
    epoch 0. A SIGTERM and restart of the SQLite shard keeps every task with its id, key and
    output, and its next id is the first of epoch 2."""
    shards.start()
    a, b, c = shards.a, shards.b, shards.c
    via = {name: shards.api(place) for name, place in (("a", shards.a1), ("b", shards.pb))}
    via["c"] = shards.api(shards.pc)
    numbers = {"pa": a.number, "pb": b.number, "pc": c.number}

    # The first task of each shard, submitted through another shard's server.
    first = {
        "pa": via["c"].submit("pa", "first-pa").id,
        "pb": via["a"].submit("pb", "first-pb").id,
        "pc": via["b"].submit("pc", "first-pc").id,
    }
    assert first == {"pa": first_id(1, 1), "pb": first_id(2, 1), "pc": 200 << 56 | 1}

    # Through every server to every pool: the owning shard's number, its ids growing.
    submitted: dict[str, list[int]] = {pool: [first[pool]] for pool in numbers}
    for entry, api in via.items():
        for pool in numbers:
            for n in range(3):
                reply = api.submit(pool, f"{pool}-via-{entry}-{n}")
                assert not reply.duplicate
                assert shard_of(reply.id) == numbers[pool], (pool, hex(reply.id))
                submitted[pool].append(reply.id)
    for pool, ids in submitted.items():
        assert ids == sorted(ids), pool
        assert {epoch_of(i) for i in ids} == {0 if pool == "pc" else 1}, pool

    # Every server lists the same tasks, merged in id order (shard a's first, c's last).
    everything = sorted(i for ids in submitted.values() for i in ids)
    for api in via.values():
        tasks, missing = api.every_task()
        assert (sorted(tasks), missing) == (everything, set())
        for info in tasks.values():
            assert shard_of(info.id) == numbers[info.pool]
    before = {i: via["c"].get(pb.TaskRef(id=i)) for i in submitted["pb"]}
    until(
        lambda: all(via["c"].get(pb.TaskRef(id=i)).status == SUCCEEDED for i in everything),
        "every task to succeed",
    )

    # SIGTERM and start again: shard b's tasks are all there, by id and by key, with outputs.
    shards.pb.sigterm()
    shards.pb.serve()
    for task_id, info in before.items():
        after = via["c"].get(pb.TaskRef(id=task_id))
        assert (after.id, after.key, after.pool) == (task_id, info.key, "pb")
        assert after.status == SUCCEEDED
        assert via["c"].get(pb.TaskRef(key=info.key)).id == task_id
        result = via["c"].wait(task_id)
        assert result.output == info.key.encode()[::-1], "the output was not kept"
    again = shards.api(shards.pb).submit("pb", "after-restart").id
    assert again == first_id(2, 2), hex(again)
    assert again > max(submitted["pb"]) and shard_of(again) == 2 and epoch_of(again) == 2
    # The other shards were not restarted: their sequences go on.
    assert via["b"].submit("pa", "after-restart-a").id == max(submitted["pa"]) + 1
    assert via["b"].submit("pc", "after-restart-c").id == max(submitted["pc"]) + 1


# --- 2. a shard killed while the others run ---------------------------------------------------

BEFORE, OUTAGE, AFTER = 0, 1, 2  # the load's phases


def test_a_killed_shard_is_named_unavailable_and_the_others_keep_serving(
    shards: Shards,
) -> None:
    """kill -9 of shard b under a steady submit load through shard c: listings and Snapshot
    name it in `unavailable_shards` (over HTTP too, only while it is down), a submit for its
    pool is UNAVAILABLE naming it, a Get by key of shard a's task says which shard was not
    asked, Cancel by key is refused and Cancel by id works, a schedule only b could remove is
    not removed, a Watch of every pool ends and one of a's and c's pools goes on; shards a and
    c acknowledge and run every submit for their pools meanwhile. Restarted, b has lost
    nothing it acknowledged (its tasks, its schedule), its new ids are of epoch 2, and the
    listings stop naming it."""
    shards.start()
    c = shards.api(shards.pc)
    for name, pool in (("ra", "pa"), ("rb", "pb"), ("rc", "pc")):
        c.add_recurring(name, pool)
    idle = [c.submit("pa_idle", f"idle-{n}").id for n in range(2)]  # no worker serves pa_idle
    load = shards.load(shards.pc, ["pa", "pb", "pc"])
    until(lambda: all(load.count(p) >= ACKS for p in ("pa", "pb", "pc")), "acks before the kill")

    shards.pb.kill9()
    load.phase = OUTAGE
    killed = time.monotonic()

    # gRPC listings and Snapshot, through c and through a: served, naming b.
    until(lambda: list(c.page(limit=1).unavailable_shards) == ["b"], "b to be missed")
    tasks, missing = c.every_task()
    assert missing == {"b"}
    assert {shard_of(i) for i in tasks} == {1, 200}, "only a's and c's tasks"
    assert set(idle) <= set(tasks)
    workers = c.workers()
    assert list(workers.unavailable_shards) == ["b"]
    assert sorted(w.pool for w in workers.workers) == ["pa", "pc"]
    recurring = c.recurring()
    assert list(recurring.unavailable_shards) == ["b"]
    assert [s.name for s in recurring.schedules] == ["ra", "rc"]
    for api in (c, shards.api(shards.a1)):
        snap = api.snapshot()
        assert list(snap.unavailable_shards) == ["b"]
        assert sorted(p.name for p in snap.pools) == ["pa", "pa_idle", "pc"]

    # HTTP listings and snapshot: the same, with "unavailable_shards" in the body.
    http = shards.pc.http
    assert http_json(http, "/v1/tasks?limit=1")["unavailable_shards"] == ["b"]
    assert http_json(http, "/v1/workers")["unavailable_shards"] == ["b"]
    assert http_json(http, "/v1/recurring")["unavailable_shards"] == ["b"]
    assert http_json(http, "/v1/snapshot")["unavailable_shards"] == ["b"]
    # docs/sharding.md, "HTTP": a submit for b is 503 naming it; a key found elsewhere is a
    # plain 200 (no header names b); cancelling by key is 503.
    answer = http_call(http, "POST", "/v1/tasks", {"pool": "pb", "key": "http-while-b-is-down"})
    assert answer.status == 503, answer
    assert answer.body["error"].startswith("shard 'b' is unavailable: "), answer
    answer = http_call(http, "GET", "/v1/tasks/by-key/idle-0")
    assert (answer.status, answer.body["id"]) == (200, str(idle[0])), answer
    assert not any(name.startswith("cronoq-") for name in answer.headers), answer.headers
    answer = http_call(http, "DELETE", "/v1/tasks/by-key/idle-0")
    assert answer.status == 503 and "shards b could not be asked" in answer.body["error"], answer

    # A submit for b's pool: UNAVAILABLE, naming b.
    code, details = refused(lambda: c.submit("pb", "while-b-is-down"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details.startswith("shard 'b' is unavailable: "), details

    # A key of shard a's: found, with b named as not asked; unknown keys cannot be told apart.
    info, metadata = c.get_with_metadata(pb.TaskRef(key="idle-0"))
    assert info.id == idle[0] and metadata.get(UNAVAILABLE_SHARDS) == "b", metadata
    code, details = refused(lambda: c.get(pb.TaskRef(key="nowhere")))
    assert code == grpc.StatusCode.UNAVAILABLE and "b could not be asked" in details, details

    # Cancel by key is refused (b might hold the key too); by id it works, forwarded to a.
    code, details = refused(lambda: c.cancel(pb.TaskRef(key="idle-0")))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details.endswith("shards b could not be asked; use the task id"), details
    assert c.get(pb.TaskRef(id=idle[0])).status == pb.TASK_STATUS_READY
    assert c.cancel(pb.TaskRef(id=idle[0])).cancelled
    assert c.get(pb.TaskRef(id=idle[0])).status == pb.TASK_STATUS_CANCELLED

    # Schedules: one of a's is removed (b might have had it too: a's answer is enough); one
    # only b has cannot be, nor can b get a new one.
    assert c.remove_recurring("ra")
    code, details = refused(lambda: c.remove_recurring("rb"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details == "schedule 'rb' was not removed: shards b could not be asked", details
    code, details = refused(lambda: c.add_recurring("rb2", "pb"))
    assert code == grpc.StatusCode.UNAVAILABLE and details.startswith("shard 'b' is unavailable")

    # A Watch of every pool ends at once, naming b; one of a's and c's pools goes on and gets
    # the events of a's tasks (its stream from a opens in the background: keep submitting).
    everywhere = c.watch()
    until(lambda: everywhere.ended, "the watch of every pool to end")
    assert everywhere.ended is not None
    code, details = everywhere.ended
    assert code == grpc.StatusCode.UNAVAILABLE and details.startswith("shard 'b' is unavailable")
    others = c.watch(["pa", "pc"])
    try:
        watched: set[int] = set()

        def event_of_a() -> bool:
            watched.add(c.submit("pa", f"watched-{len(watched)}").id)
            with contextlib.suppress(queue.Empty):
                while True:
                    if others.events.get(timeout=0.2).id in watched:
                        return True
            return False

        until(event_of_a, "an event of shard a's pool on the watch of a's and c's pools")
        assert others.ended is None, others.ended
    finally:
        others.cancel()

    # Shards a and c keep taking their pools' submits.
    until(
        lambda: load.count("pa", OUTAGE) >= ACKS and load.count("pc", OUTAGE) >= ACKS,
        "acks for a's and c's pools while b is down",
    )

    # b again, on its file: nothing it acknowledged is lost; its next ids are of epoch 2.
    shards.pb.serve()
    load.phase = AFTER
    back = time.monotonic()
    until(lambda: not c.page(limit=1).unavailable_shards, "b to be listed again")
    print(
        f"\nshard b: down {back - killed:.2f} s; listed again by c"
        f" {time.monotonic() - back:.2f} s after its event=ready"
    )
    until(lambda: load.count("pb", AFTER) >= ACKS, "acks for b's pool after its restart")
    load.stop()

    acked = load.acks()
    until(all_succeeded(c, acked), "every acknowledged task to succeed", timeout=LONG * 2)
    tasks, missing = c.every_task()
    assert missing == set()
    assert {shard_of(i) for i in tasks} == {1, 2, 200}
    for ack in acked:
        assert shard_of(ack.id) == {"pa": 1, "pb": 2, "pc": 200}[ack.pool], ack
    pb_acks = load.acks("pb")
    assert all(epoch_of(a.id) == 1 for a in pb_acks if a.phase == BEFORE)
    assert {epoch_of(a.id) for a in pb_acks if a.phase == AFTER and not a.duplicate} == {2}
    ordered(acked)
    assert [f for f in load.failed if f.pool != "pb"] == [], "a's or c's pool refused a submit"
    assert load.failed, "no submit for b's pool failed while it was down"
    for failure in load.failed:
        assert failure.code == grpc.StatusCode.UNAVAILABLE, failure
        assert failure.details.startswith("shard 'b' is unavailable: "), failure
    assert shards.workers is not None
    assert shards.workers.repeated() == [], "a (task, attempt) ran twice"

    # The reads no longer name b; HTTP bodies leave the field out.
    assert not c.workers().unavailable_shards and not c.snapshot().unavailable_shards
    recurring = c.recurring()
    assert not recurring.unavailable_shards
    assert [s.name for s in recurring.schedules] == ["rb", "rc"], "b's schedule was lost"
    for path in ("/v1/tasks?limit=1", "/v1/workers", "/v1/recurring"):
        assert "unavailable_shards" not in http_json(http, path), path
    # docs/sharding.md, "HTTP": the snapshot always has the field, [] while every shard answers.
    assert http_json(http, "/v1/snapshot")["unavailable_shards"] == []
    assert c.get(pb.TaskRef(id=idle[1])).status == pb.TASK_STATUS_READY


# --- 3. the PostgreSQL shard's standby takes over ------------------------------------------------


def test_the_postgres_shards_standby_takes_over_with_shard_numbered_ids(shards: Shards) -> None:
    """kill -9 of shard a's leader under a submit load through shard c (forwarded to a's
    endpoint, the proxy, aimed at the standby once the leader died): the standby leads with
    the next epoch and issues ids with number 1 and epoch 2, starting at `1 << 56 | 2 << 40 |
    1`; every acknowledged submit succeeds, no (task, attempt) runs twice, and a's tasks of
    before are still reached through the plan's endpoint."""
    shards.start(standby=True)
    c = shards.api(shards.pc)
    b = shards.api(shards.pb)
    assert shards.epoch_a() == 1
    load = shards.load(shards.pc, ["pa", "pc"])
    until(lambda: load.count("pa") >= ACKS and load.count("pc") >= ACKS, "acks before the kill")

    began = time.monotonic()
    shards.a1.kill9()
    shards.proxy.target = ("127.0.0.1", shards.a2.shard.grpc_port)
    assert shards.a2.server is not None
    shards.a2.server.wait_for("event=ready")
    led = time.monotonic() - began
    until(lambda: load.count("pa", epoch=2) >= ACKS, "acks of the new leader")
    print(
        f"\nshard a: kill -9 to the standby's event=ready: {led:.2f} s; "
        f"failed submits meanwhile: {len(load.failed)}"
    )
    load.stop()

    assert shards.epoch_a() == 2
    pa = load.acks("pa")
    assert {shard_of(a.id) for a in pa} == {1}
    fresh = [a.id for a in pa if not a.duplicate]
    assert {epoch_of(i) for i in fresh} == {1, 2}
    old = [i for i in fresh if epoch_of(i) == 1]
    new = [i for i in fresh if epoch_of(i) == 2]
    assert min(new) == first_id(1, 2), hex(min(new))
    assert min(new) > max(old)
    ordered(pa)
    print("failures:", sorted({f.details for f in load.failed}))
    for failure in load.failed:
        assert failure.pool == "pa", failure  # c's own pool never failed
        assert failure.code == grpc.StatusCode.UNAVAILABLE, failure
        assert failure.details.startswith("shard 'a' is unavailable: "), failure

    acked = load.acks()
    until(all_succeeded(c, acked), "every acknowledged task to succeed")
    assert shards.workers is not None
    assert shards.workers.repeated() == [], "a (task, attempt) ran twice"
    # Through b too, which reaches a only by the plan's endpoint: a task the dead leader took.
    info = b.get(pb.TaskRef(id=old[0]))
    assert (info.id, info.status, info.pool) == (old[0], SUCCEEDED, "pa")
    assert b.wait(old[0]).output == pa[0].key.encode()[::-1]
    assert shard_of(b.submit("pa", "through-b").id) == 1


# --- 4. a store of another shard ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_store_holding_another_shards_ids_refuses_the_start(shards: Shards, kind: str) -> None:
    """The shard's store holds its tasks (number 2 on SQLite, 1 on PostgreSQL); a server whose
    plan gives that shard another number, on the same file or schema, listens, then exits 1
    with an error ending with the rule; the store is left as it was, and the right server
    starts on it again."""
    place = shards.pb if kind == "sqlite" else shards.a1
    own = place.shard
    place.serve()
    api = Api(place.address)
    try:
        task_id = api.submit(own.pools[0], "kept").id
    finally:
        api.close()
    assert shard_of(task_id) == own.number
    place.sigterm()

    renumbered = dataclasses.replace(own, number=7)
    plan = [renumbered if s.name == own.name else s for s in shards.plan]
    wrong = shards.place(renumbered, f"{own.name}-as-7", plan)
    server = wrong.start()
    failed = server.wait_for(r"event=failed").string
    error = server.wait_for(r"^Error: ").string
    assert server.proc.wait(LONG) == 1
    assert error.endswith(OWN_STORE), error
    assert f"task id {task_id} of shard number {own.number}, not 7" in error, error
    assert failed.endswith(f'{OWN_STORE}"'), failed
    assert not any("event=ready" in line for line in server.lines), server.lines

    place.serve()
    api = Api(place.address)
    try:
        assert api.get(pb.TaskRef(key="kept")).id == task_id
        assert shard_of(api.submit(own.pools[0], "after").id) == own.number
    finally:
        api.close()
