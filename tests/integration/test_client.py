"""`cronoq.client.Client` over real sockets (docs/client.md).

Most tests talk to real `cronoq-server` processes, one per module: a plaintext one without
credentials, served by a raw-stub worker thread, and a TLS one with tokens of every role. A
few facts the server cannot reveal (the exact metadata, the RPC deadline, a stream the server
ends with CANCELLED, the server seeing a watch cancelled) are checked against a small recording
servicer that runs in the test's own event loop, over a real port as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from queue import Queue
from typing import Any

import grpc
import pytest

import cronoq
from cronoq.client import Client, ClientError, Event, Result, Submitted, TaskInfo, task
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.servers import PORT0, serving_process

# "default" is served by the worker thread; nothing ever serves "idle" and "page", so their
# tasks stay pending for as long as a test needs.
PLAIN = (
    PORT0
    + '[[pools]]\nname = "default"\nmax = 8\n'
    + "[pools.retry]\nmax_attempts = 3\ninitial_backoff_s = 0\n"
    + '[[pools]]\nname = "idle"\n[[pools]]\nname = "page"\n'
    + '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 2\n'
)


def token(role: str) -> str:
    return f"{role}-token-for-the-client-tests-0123456789"


ROLES = ("client", "worker", "admin", "metrics")
AUTH = "".join(f'[[auth.tokens]]\ntoken = "{token(r)}"\nrole = "{r}"\n' for r in ROLES)


class LeaseWorker:
    """A worker thread on raw stubs (the pattern of test_server_e2e.EchoWorker) that keeps every
    lease it gets and completes it with the payload reversed; payloads starting with b"fail"
    fail permanently, and b"hold" ones are never answered."""

    def __init__(self, address: str, pool: str, labels: dict[str, str]) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outbox: Queue[pb.WorkerMessage | None] = Queue()
        register = pb.Register(
            pool=pool, slots=8, worker_name="lease-worker", protocol_version=3, labels=labels
        )
        self.outbox.put(pb.WorkerMessage(register=register))
        self.leases: dict[int, pb.Lease] = {}  # by task id
        self.registered: Queue[pb.Registered] = Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _messages(self) -> Iterator[pb.WorkerMessage]:
        while (msg := self.outbox.get()) is not None:
            yield msg

    def _run(self) -> None:
        with contextlib.suppress(grpc.RpcError):  # the server went away first
            for msg in cronoq_pb2_grpc.WorkersStub(self.channel).Work(self._messages()):
                if msg.WhichOneof("msg") == "registered":
                    self.registered.put(msg.registered)
                elif msg.WhichOneof("msg") == "lease":
                    self._answer(msg.lease)

    def _answer(self, lease: pb.Lease) -> None:
        self.leases[lease.task_id] = lease
        if lease.payload.startswith(b"hold"):
            return
        if lease.payload.startswith(b"fail"):
            fail = pb.Fail(lease=lease.lease, message="it broke", permanent=True)
            self.outbox.put(pb.WorkerMessage(fail=fail))
            return
        done = pb.Complete(lease=lease.lease, output=lease.payload[::-1])
        self.outbox.put(pb.WorkerMessage(complete=done))

    def stop(self) -> None:
        self.outbox.put(None)
        self.thread.join(5)
        self.channel.close()


@dataclass
class Plain:
    address: str
    worker: LeaseWorker


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plain]:
    with serving_process(tmp_path_factory.mktemp("plain"), PLAIN) as serving:
        worker = LeaseWorker(serving.address, "default", {"zone": "a"})
        worker.registered.get(timeout=5)
        yield Plain(serving.address, worker)
        worker.stop()


@dataclass
class Secure:
    address: str
    cert: bytes

    def client(self, role: str | None, target: str | None = None, **kw: Any) -> Client:
        """A client that trusts the server's self-signed certificate, with `role`'s token."""
        creds = grpc.ssl_channel_credentials(root_certificates=self.cert)
        kw.setdefault("token", None if role is None else token(role))
        return Client(
            target or self.address,
            credentials=creds,
            options=[("grpc.ssl_target_name_override", "localhost")],
            **kw,
        )


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    directory = tmp_path_factory.mktemp("secure")
    key, cert = directory / "key.pem", directory / "cert.pem"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
               "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]  # fmt: skip
    subprocess.run([*command, "-keyout", key, "-out", cert], check=True, capture_output=True)
    config = (
        PORT0
        + f'[server.tls]\ncert = "{cert}"\nkey = "{key}"\n'
        + '[[pools]]\nname = "default"\n'
        + AUTH
    )
    with serving_process(directory, config) as serving:
        yield Secure(serving.address, cert.read_bytes())


async def raises(code: str, call: Any) -> ClientError:
    with pytest.raises(ClientError) as info:
        await call
    assert info.value.code == code, info.value
    assert info.value.__cause__ is None and info.value.__suppress_context__
    return info.value


async def until(check: Any, timeout: float = 3.0) -> None:
    """Poll an async predicate: for states the test does not drive itself."""
    end = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


# --- Tasks against the real server --------------------------------------------------------------


async def test_submit_and_wait_for_the_result(plain: Plain) -> None:
    async with Client(plain.address) as client:
        got = await client.submit({"n": 1}, wait=True, wait_timeout=5)
        assert isinstance(got, Submitted) and not got.duplicate
        assert got.result is not None
        assert got.result.ok and got.result.status == "succeeded"
        assert got.result.output == b'}1 :"n"{' and got.result.text() == '}1 :"n"{'
        assert got.result.id == got.id
        later = await client.submit(b"x")
        assert later.result is None
        done = await client.wait(later.id, timeout=5)
        assert done == Result(later.id, "succeeded", b"x", "", done.output_available)
        failed = await client.wait((await client.submit(b"fail")).id)
        assert (failed.status, failed.ok, failed.message) == ("failed", False, "it broke")
        assert failed.output is None and failed.text() == ""


async def test_every_task_option_reaches_the_server(plain: Plain) -> None:
    async with Client(plain.address) as client:
        got = await client.submit(
            "hé",
            pool="default",
            kind="mail",
            priority="critical",
            key="all-options",
            deadline_at=4_000_000_000.5,
            timeout=30,
            retry={"max_attempts": 7, "initial_backoff": 0},
            resources={"gpu": 1},
            tags={"n": 1},
            labels={"zone": "a"},
            tenant="acme",
            wait=True,
            wait_timeout=5,
        )
        assert got.result is not None and got.result.ok
        info = await client.get("all-options")
        assert info.id == got.id and info.done
        assert (info.pool, info.key, info.kind, info.tenant) == (
            "default",
            "all-options",
            "mail",
            "acme",
        )
        assert (info.priority, info.max_attempts, info.attempt) == ("critical", 7, 1)
        assert info.created_at is not None and info.finished_at is not None
        assert abs(info.created_at - time.time()) < 60
        lease = plain.worker.leases[got.id]
        assert (lease.payload, lease.content_type) == (b"h\xc3\xa9", "text/plain; charset=utf-8")
        assert (lease.kind, lease.key, dict(lease.tags)) == ("mail", "all-options", {"n": "1"})
        assert lease.timeout_s == 30.0 and lease.priority == pb.PRIORITY_CRITICAL
        assert lease.deadline_unix_ns == int(4_000_000_000.5 * 1e9)
        again = await client.submit("other", key="all-options")
        assert again == Submitted(got.id, True)
        # a fixed start in the future, not yet due
        later = await client.submit(None, pool="idle", start_in=60, tolerance=1, on_miss="skip")
        assert (await client.get(later.id)).status == "scheduled"
        assert await client.cancel(later.id)


async def test_submit_batch_with_keys_naming_each_other(plain: Plain) -> None:
    async with Client(plain.address) as client:
        first, second = await client.submit_batch(
            [task(b"2", key="batch-b", after="batch-a"), task(b"1", key="batch-a")]
        )
        assert first.result is None and second.result is None
        assert (await client.wait("batch-b", timeout=5)).ok
        a, b = await client.get("batch-a"), await client.get("batch-b")
        assert (a.id, b.id) == (second.id, first.id)
        assert b.started_at is not None and a.finished_at is not None
        assert b.started_at >= a.finished_at
        assert [s.duplicate for s in await client.submit_batch([task(key="batch-a")])] == [True]


async def test_wait_timeouts(plain: Plain) -> None:
    async with Client(plain.address) as client:
        # the server ends the wait with DEADLINE_EXCEEDED
        start = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            await client.submit(b"x", pool="idle", key="tw-1", wait=True, wait_timeout=0.3)
        assert info.value.__cause__ is None and info.value.__suppress_context__
        assert time.monotonic() - start > 0.25  # ended by the server's deadline, not before
        # the task stays submitted
        assert (await client.get("tw-1")).status == "ready"
        # the client's own deadline
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await client.submit(b"x", pool="idle", key="tw-2", wait=True, call_timeout=0.3)
        with pytest.raises(TimeoutError, match="'tw-1'"):
            await client.wait("tw-1", timeout=0.2)
        assert await client.cancel("tw-1") and await client.cancel("tw-2")
        assert not await client.cancel("tw-1")  # already ended
        ended = await client.wait("tw-1", timeout=1)
        assert (ended.status, ended.output) == ("cancelled", None)


async def test_get_and_cancel_and_errors(plain: Plain) -> None:
    async with Client(plain.address) as client:
        held = await client.submit(b"hold", key="held")

        async def running() -> bool:
            return (await client.get("held")).status == "running"

        await until(running)
        info = await client.get(held.id)
        assert isinstance(info, TaskInfo) and not info.done and info.attempt == 1
        assert await client.cancel("held")
        assert (await client.get("held")).status == "cancelled"
        err = await raises("not_found", client.get(10**12))
        assert err.message == "unknown task" and str(err).startswith("not_found: ")
        assert await client.cancel("no-such-key") is False  # as for a task that had ended
        assert await client.cancel(10**12) is False
        await raises("not_found", client.wait(10**12))
        await raises("not_found", client.submit(b"x", pool="nope"))
        await raises("invalid_argument", client.submit(b"x", pool="\0"))
        await raises("invalid_argument", client.list_tasks(pools=["\0"]))


async def test_list_tasks_and_iter_tasks_page_through(plain: Plain) -> None:
    async with Client(plain.address) as client:
        subs = await client.submit_batch([task(i, pool="page") for i in range(5)])
        ids = [s.id for s in subs]
        first = await client.list_tasks(pools=["page"], limit=2)
        assert [t.id for t in first.tasks] == ids[:2] and first.next_after == ids[1]
        assert first.unavailable_shards == ()
        second = await client.list_tasks(pools=["page"], after=ids[1], limit=2)
        third = await client.list_tasks(pools=["page"], after=ids[3], limit=2)
        assert [t.id for t in second.tasks] == ids[2:4] and second.next_after == ids[3]
        assert [t.id for t in third.tasks] == ids[4:] and third.next_after is None
        walked = [t async for t in client.iter_tasks(pools=["page"], page_size=2)]
        assert [t.id for t in walked] == ids
        assert {t.status for t in walked} == {"ready"} and {t.pool for t in walked} == {"page"}
        everything = [t.id async for t in client.iter_tasks(statuses=["READY"], page_size=0)]
        assert set(ids) <= set(everything) and everything == sorted(everything)
        await client.cancel(ids[0])
        page = await client.list_tasks(pools=["page"], statuses=["cancelled"])
        assert [t.id for t in page.tasks] == ids[:1] and page.next_after is None
        for i in ids[1:]:
            await client.cancel(i)


def probes(name: str) -> list[str]:
    return [f"probe-{name}-{i}" for i in range(50)]


async def _watch_started(client: Client, seen: list[Event], keys: list[str]) -> None:
    """Cancel probe tasks until the watch reports one: the stream is subscribed from then on."""
    for key in keys:
        probe = await client.submit(None, pool="idle", key=key)
        await client.cancel(probe.id)
        for _ in range(10):
            if any(e.id == probe.id for e in seen):
                return
            await asyncio.sleep(0.02)
    raise AssertionError("the watch never started")


async def _collect(stream: AsyncIterator[Event], seen: list[Event]) -> None:
    async for event in stream:
        seen.append(event)


async def test_watch_terminal_only_and_all_transitions(plain: Plain) -> None:
    async with Client(plain.address) as client:
        terminal: list[Event] = []
        every: list[Event] = []
        consumers = [
            asyncio.create_task(_collect(client.watch(["default", "idle"]), terminal)),
            asyncio.create_task(_collect(client.watch(all_transitions=True), every)),
        ]
        await _watch_started(client, terminal, probes("terminal"))
        await _watch_started(client, every, probes("every"))
        got = await client.submit(b"w", key="watched", wait=True, wait_timeout=5)

        async def both_saw_the_end() -> bool:
            return all(
                any(e.id == got.id and e.status == "succeeded" for e in s)
                for s in (terminal, every)
            )

        await until(both_saw_the_end)
        mine = [e for e in terminal if e.id == got.id]
        assert [e.status for e in mine] == ["succeeded"]
        assert (mine[0].pool, mine[0].key, mine[0].attempt) == ("default", "watched", 1)
        assert abs(mine[0].at - time.time()) < 60
        statuses = [e.status for e in every if e.id == got.id]
        assert statuses[-1] == "succeeded" and "running" in statuses and len(statuses) >= 2
        assert all(e.status in ("cancelled", "succeeded") for e in terminal)
        for consumer in consumers:
            consumer.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)


async def test_watch_by_keys(plain: Plain) -> None:
    async with Client(plain.address) as client:
        seen: list[Event] = []
        keys = probes("keys")
        stream = client.watch(keys=[*keys, "watch-key"], all_transitions=True)
        consumer = asyncio.create_task(_collect(stream, seen))
        await _watch_started(client, seen, keys)
        pending = await client.submit(None, pool="idle", key="watch-key")
        await client.submit(None, pool="idle", key="not-watched")
        assert await client.cancel(pending.id)
        assert await client.cancel("not-watched")

        async def ended() -> bool:
            return any(e.id == pending.id and e.status == "cancelled" for e in seen)

        await until(ended)
        assert {e.key for e in seen} <= {*keys, "watch-key"}
        assert [e.status for e in seen if e.key == "watch-key"][-1] == "cancelled"
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        # the client is still usable after the stream ended
        assert (await client.get(pending.id)).status == "cancelled"


# --- Admin against the real server --------------------------------------------------------------


async def test_snapshot(plain: Plain) -> None:
    async with Client(plain.address) as client:
        await client.submit(b"s", wait=True, wait_timeout=5)
        snap = await client.snapshot()
        default = snap.pool("default")
        assert default is not None and snap.pool("nope") is None
        assert {p.name for p in snap.pools} >= {"default", "idle", "page"}
        assert default.workers_connected == 1 and default.succeeded >= 1
        assert len(default.pending_by_class) == 4 and default.pending == sum(
            default.pending_by_class
        )
        assert [dict(g.labels) for g in default.groups] == [{"zone": "a"}]
        assert snap.totals.submitted >= 1 and snap.totals.succeeded >= 1
        assert snap.workers_connected == 1 and snap.unavailable_shards == ()


async def test_recurring_schedules(plain: Plain) -> None:
    async with Client(plain.address) as client:
        await client.add_recurring("hourly", "0 * * * *", {"r": 1}, pool="idle", kind="k")
        template = task(b"t", pool="idle", kind="prebuilt")
        await client.add_recurring(
            "paris", "30 6 * * *", template, tz="Europe/Paris", overlap="queue_on_success"
        )
        schedules = {s.name: s for s in await client.list_recurring()}
        hourly, paris = schedules["hourly"], schedules["paris"]
        assert (hourly.cron, hourly.tz, hourly.pool, hourly.kind, hourly.overlap) == (
            "0 * * * *",
            "",
            "idle",
            "k",
            "skip",
        )
        assert hourly.next_at is not None and hourly.next_at > time.time()
        assert hourly.last_task_id is None
        assert (paris.tz, paris.kind, paris.overlap) == (
            "Europe/Paris",
            "prebuilt",
            "queue_on_success",
        )
        await client.add_recurring("hourly", "15 * * * *", overlap="allow")  # replaces it
        replaced = [s for s in await client.list_recurring() if s.name == "hourly"]
        assert [(s.cron, s.overlap) for s in replaced] == [("15 * * * *", "allow")]
        assert await client.remove_recurring("hourly")
        assert not await client.remove_recurring("hourly")
        assert await client.remove_recurring("paris")
        assert [s.name for s in await client.list_recurring()] == []
        await raises("invalid_argument", client.add_recurring("bad", "not a cron"))


async def test_list_workers(plain: Plain) -> None:
    async with Client(plain.address) as client:
        (worker,) = await client.list_workers()
        assert (worker.name, worker.pool, worker.labels, worker.slots) == (
            "lease-worker",
            "default",
            {"zone": "a"},
            8,
        )
        assert 0 <= worker.busy <= worker.slots and worker.id > 0
        assert abs(worker.connected_at - time.time()) < 120


# --- connecting -----------------------------------------------------------------------------


async def test_http_targets_and_close(plain: Plain) -> None:
    for target in (
        f"http://{plain.address}/",
        f"grpc://{plain.address}",
        f"http://{plain.address}",
    ):
        client = Client(target)
        assert client.target == target
        assert (await client.submit(b"t", wait=True, wait_timeout=5)).result is not None
        await client.close()
        await client.close()  # a no-op
        # used again after close(): a new channel
        assert (await client.list_tasks(pools=["idle"], limit=1)).tasks is not None
        await client.close()


def test_one_client_across_two_event_loops(plain: Plain) -> None:
    client = Client(plain.address)
    first = asyncio.run(client.submit(b"a", wait=True, wait_timeout=5))
    second = asyncio.run(client.submit(b"b", wait=True, wait_timeout=5))
    assert first.result is not None and second.result is not None
    assert (first.result.output, second.result.output) == (b"a", b"b")

    async def leave() -> None:
        async with client as c:
            assert c is client
            await c.get(first.id)

    asyncio.run(leave())
    asyncio.run(client.close())


async def test_context_manager_does_not_swallow_errors(plain: Plain) -> None:
    with pytest.raises(ZeroDivisionError):
        async with Client(plain.address) as client:
            await client.get(1)
            _ = 1 / 0


async def test_tls_true_against_a_plaintext_server_fails(plain: Plain) -> None:
    for client in (Client(plain.address, tls=True), Client(f"https://{plain.address}", tls=False)):
        err = await raises("unavailable", client.get(1))
        assert err.retryable
        await client.close()


async def test_tls_with_credentials_and_tokens(secure: Secure) -> None:
    async with secure.client("client") as client:
        got = await client.submit(b"x", key="tls")
        assert (await client.get("tls")).id == got.id
        await raises("permission_denied", client.snapshot())
    async with secure.client("metrics", target=f"https://{secure.address}/") as metrics:
        assert (await metrics.snapshot()).pool("default") is not None
        assert await metrics.list_workers() == []
        assert await metrics.list_recurring() == []
        await raises("permission_denied", metrics.add_recurring("r", "* * * * *"))
    async with secure.client("admin") as admin:
        assert (await admin.get("tls")).id == got.id
        await admin.add_recurring("r", "* * * * *", pool="default")
        assert await admin.remove_recurring("r")
    async with secure.client("worker") as worker:
        err = await raises("permission_denied", worker.get(got.id))
        assert err.message
    async with secure.client(None) as anonymous:
        await raises("unauthenticated", anonymous.get(got.id))
    async with secure.client(None, token="x" * 40) as wrong:
        await raises("unauthenticated", wrong.get(got.id))
    # plaintext against the TLS listener does not get through either
    plaintext = Client(secure.address, token=token("client"))
    await raises("unavailable", plaintext.get(got.id))
    await plaintext.close()


# --- wire facts, against a recording servicer -------------------------------------------------


class Recorder(cronoq_pb2_grpc.TasksServicer, cronoq_pb2_grpc.AdminServicer):
    """Notes each request with its metadata and remaining deadline, answers what tests need."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, list[tuple[str, str]], float | None]] = []
        self.watch_cancelled = asyncio.Event()

    def _note(self, name: str, request: Any, context: Any) -> None:
        md = [(k, v) for k, v in context.invocation_metadata() if not k.startswith(("user-", ":"))]
        self.calls.append((name, request, md, context.time_remaining()))

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        self._note("Submit", request, context)
        if request.task.payload == b"hang":
            await asyncio.sleep(30)
        result = pb.TaskResult(id=1, status=pb.TASK_STATUS_SUCCEEDED) if request.wait else None
        return pb.SubmitResponse(id=1, result=result)

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskInfo:
        self._note("Get", request, context)
        return pb.TaskInfo(id=request.task.id, status=pb.TASK_STATUS_READY)

    async def Wait(self, request: pb.WaitRequest, context: Any) -> pb.TaskResult:
        self._note("Wait", request, context)
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "still ready")

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.StatusEvent]:
        self._note("Watch", request, context)
        if request.keys == ["unavailable"]:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "leader lost")
        if request.keys == ["cancelled"]:
            await context.abort(grpc.StatusCode.CANCELLED, "going away")
        if request.keys == ["deadline"]:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "too slow")
        try:
            for i in range(1, 10**6):
                yield pb.StatusEvent(id=i, status=pb.TASK_STATUS_SUCCEEDED, at_unix_ns=i * 10**9)
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.watch_cancelled.set()
            raise

    async def AddRecurring(self, request: pb.RecurringRequest, context: Any) -> pb.Empty:
        self._note("AddRecurring", request, context)
        return pb.Empty()


@contextlib.asynccontextmanager
async def recording() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()
    server = grpc.aio.server()
    cronoq_pb2_grpc.add_TasksServicer_to_server(recorder, server)
    cronoq_pb2_grpc.add_AdminServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield recorder, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_bearer_metadata_on_every_call() -> None:
    async with recording() as (rec, address):
        async with Client(address, token="t" * 16) as client:
            await client.get(3)
            await client.add_recurring("n", "* * * * *")
            async for _ in client.watch():
                break
        async with Client(address, token="") as anonymous:
            await anonymous.get(4)
        async with Client(address) as anonymous:
            await anonymous.get(5)
    assert [(name, md) for name, _, md, _ in rec.calls] == [
        ("Get", [("authorization", "Bearer tttttttttttttttt")]),
        ("AddRecurring", [("authorization", "Bearer tttttttttttttttt")]),
        ("Watch", [("authorization", "Bearer tttttttttttttttt")]),
        ("Get", []),
        ("Get", []),
    ]


async def test_requests_and_deadlines_on_the_wire() -> None:
    options: dict[str, Any] = {
        "pool": "p", "kind": "k", "priority": 1, "key": "key", "deadline_in": 0,
        "start_at": 1.5, "tolerance": 2, "on_miss": "fail", "duration_hint": 3, "timeout": 4,
        "retry": cronoq.RetryPolicy(), "after": 9, "deps": [("x", "failure")],
        "resources": {"r": 1}, "tags": {"t": "v"}, "labels": {"l": "w"}, "tenant": "te",
        "content_type": "a/b",
    }  # fmt: skip
    async with recording() as (rec, address), Client(address) as client:
        assert await client.submit(b"p", **options) == Submitted(1, False)
        got = await client.submit(b"p", wait=True, wait_timeout=3)
        assert got.result == Result(1, "succeeded", None)
        await client.submit(b"p", wait=True)
        await client.submit(b"p", wait=True, wait_timeout=30, call_timeout=2)
        with pytest.raises(TimeoutError, match="2"):
            await client.wait(2, timeout=2)
        with pytest.raises(TimeoutError):
            await client.wait("k")
        await client.add_recurring("n", "* * * * *", b"t", pool="p")
        await client.add_recurring("m", "* * * * *", task(b"t"), tz="UTC", overlap="queue")
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await client.submit(b"hang", wait=True, wait_timeout=30, call_timeout=0.5)
        assert 0.4 < time.monotonic() - start < 25  # call_timeout ended it, not wait_timeout
    (plain_submit, waited, unbounded, capped, wait_bounded, wait_open, rec_n, rec_m, _) = rec.calls
    assert plain_submit[1] == pb.SubmitRequest(task=task(b"p", **options), wait=False)
    assert plain_submit[3] is None  # no deadline
    assert waited[1] == pb.SubmitRequest(task=task(b"p"), wait=True, wait_timeout_s=3)
    assert waited[3] is not None and abs(waited[3] - 8) < 0.5  # wait_timeout + 5 s
    assert unbounded[1] == pb.SubmitRequest(task=task(b"p"), wait=True) and unbounded[3] is None
    assert capped[3] is not None and abs(capped[3] - 2) < 0.5  # call_timeout wins
    assert wait_bounded[1] == pb.WaitRequest(task=pb.TaskRef(id=2), timeout_s=2)
    assert wait_bounded[3] is not None and abs(wait_bounded[3] - 7) < 0.5
    assert wait_open[1] == pb.WaitRequest(task=pb.TaskRef(key="k")) and wait_open[3] is None
    assert rec_n[1] == pb.RecurringRequest(
        name="n", cron="* * * * *", tz="", template=task(b"t", pool="p"), overlap=pb.OVERLAP_SKIP
    )
    assert rec_m[1].overlap == pb.OVERLAP_QUEUE and rec_m[1].tz == "UTC"
    assert rec_m[1].template == task(b"t")


async def test_watch_stream_endings() -> None:
    async with recording() as (rec, address), Client(address) as client:
        with pytest.raises(ClientError) as info:
            async for _ in client.watch(keys=["unavailable"]):
                pass
        assert (info.value.code, info.value.message) == ("unavailable", "leader lost")
        assert info.value.__cause__ is None
        assert [e async for e in client.watch(keys=["cancelled"])] == []
        with pytest.raises(ClientError) as info:  # not turned into TimeoutError
            async for _ in client.watch(keys=["deadline"]):
                pass
        assert info.value.code == "deadline_exceeded"
        events = []
        async for event in client.watch(["p"], ids=[1, "2"], all_transitions=True):  # type: ignore[list-item]
            events.append(event)
            if len(events) == 3:
                break
        assert [(e.id, e.status, e.at) for e in events] == [
            (1, "succeeded", 1.0),
            (2, "succeeded", 2.0),
            (3, "succeeded", 3.0),
        ]
        await asyncio.wait_for(rec.watch_cancelled.wait(), 3)
        assert rec.calls[-1][1] == pb.WatchRequest(pools=["p"], ids=[1, 2], all_transitions=True)
        assert rec.calls[0][1] == pb.WatchRequest(keys=["unavailable"])


# --- Operations (this server's additions) -------------------------------------------------------


async def test_search_tasks_filters_sorts_and_pages(plain: Plain) -> None:
    async with Client(plain.address) as client:
        specs = [
            task(n, pool="idle", kind=kind, key=f"find-{n}", tags={"run": "f1", "n": n})
            for n, kind in enumerate("abab")
        ]
        ids = [s.id for s in await client.submit_batch(specs)]
        run: dict[str, Any] = {"tags": {"run": "f1"}}
        newest = await client.search_tasks(**run)
        assert ([t.id for t in newest.tasks], newest.total) == (ids[::-1], 4)
        assert newest.unavailable_shards == ()
        kind_a = await client.search_tasks(kinds=["a"], ascending=True, **run)
        assert [t.id for t in kind_a.tasks] == [ids[0], ids[2]]
        by_kind = await client.search_tasks(sort="KIND", ascending=True, **run)
        assert [t.id for t in by_kind.tasks] == [ids[0], ids[2], ids[1], ids[3]]
        assert [t.id for t in (await client.search_tasks(key="find-1")).tasks] == [ids[1]]
        prefixed = await client.search_tasks(key_prefix="find-", tags={"n": "3"})
        assert [t.id for t in prefixed.tasks] == [ids[3]]
        only = await client.search_tasks(ids=[ids[2], ids[0]], pools=["idle"], statuses=["ready"])
        assert [t.id for t in only.tasks] == [ids[2], ids[0]]
        now = time.time()
        recent = await client.search_tasks(submitted_after=now - 3600, **run)
        assert recent.total == 4
        assert (await client.search_tasks(submitted_before=now - 3600, **run)).total == 0
        page = await client.search_tasks(limit=2, offset=1, **run)
        assert ([t.id for t in page.tasks], page.total) == ([ids[2], ids[1]], 4)
        await raises("not_found", client.search_tasks(pools=["nope"]))
        for i in ids:
            await client.cancel(i)


async def test_bulk_dry_run_cancel_retry_and_delete(plain: Plain) -> None:
    async with Client(plain.address) as client:
        ids = [s.id for s in await client.submit_batch([task(n, pool="idle", tags={"run": "k1"})
                                                         for n in range(3)])]  # fmt: skip
        run: dict[str, Any] = {"tags": {"run": "k1"}}
        dry = await client.bulk("cancel", dry_run=True, **run)
        assert (dry.matched, dry.affected, dry.unavailable_shards) == (3, 3, ())
        assert {(await client.get(i)).status for i in ids} == {"ready"}
        assert (await client.bulk("retry", dry_run=True, **run)).affected == 0  # none ended
        cancelled = await client.bulk("cancel", pools=["idle"], ids=ids[:2], **run)
        assert (cancelled.matched, cancelled.affected) == (2, 2)
        assert [(await client.get(i)).status for i in ids] == ["cancelled", "cancelled", "ready"]
        retried = await client.bulk("retry", statuses=["cancelled"], **run)
        assert (retried.matched, retried.affected) == (2, 2)
        copies = await client.search_tasks(statuses=["ready"], ascending=True, **run)
        assert copies.total == 3 and copies.tasks[0].id == ids[2]
        assert all(t.id > ids[2] for t in copies.tasks[1:])
        deleted = await client.bulk("delete", **run)
        assert (deleted.matched, deleted.affected) == (5, 2)
        for gone in ids[:2]:
            await raises("not_found", client.get(gone))
        assert (await client.bulk("cancel", **run)).affected == 3


async def test_pause_resume_and_drain_a_pool(plain: Plain) -> None:
    async with Client(plain.address) as client:
        held = await client.submit(b"hold-drain", pool="default")

        async def leased() -> bool:
            return held.id in plain.worker.leases

        await until(leased)
        try:
            seen: list[int] = []
            assert not await client.drain_pool("default", 0.3, poll=0.05, on_wait=seen.append)
            assert seen and set(seen) == {1}  # the held attempt, every look
            snap = (await client.snapshot()).pool("default")
            assert snap is not None and (snap.paused, snap.busy) == (True, 1)
            assert await client.pause_pool("default") == cronoq.client.PoolControl(
                "default", True, False
            )
            queued = await client.submit(b"after", pool="default")
            lease = plain.worker.leases[held.id]
            done = pb.Complete(lease=lease.lease, output=b"ok")
            plain.worker.outbox.put(pb.WorkerMessage(complete=done))
            assert await client.drain_pool("default", 10, poll=0.05)
            assert (await client.get(queued.id)).status == "ready"  # paused: not started
        finally:
            resumed = await client.resume_pool("default")
        assert resumed == cronoq.client.PoolControl("default", False, True)
        result = await client.wait(queued.id, timeout=10)
        assert result.output == b"retfa"
        info = await client.get(queued.id)
        (worker,) = [w for w in await client.list_workers() if w.pool == "default"]
        assert (info.worker_name, info.worker_id) == ("lease-worker", worker.id)
        assert (await client.resume_pool("default")).changed is False
        await raises("not_found", client.pause_pool("nope"))


async def test_operations_need_an_admin_token_except_search(secure: Secure) -> None:
    async with secure.client("client") as client:
        await raises("permission_denied", client.pause_pool("default"))
        await raises("permission_denied", client.resume_pool("default"))
        await raises("permission_denied", client.bulk("cancel", dry_run=True))
        await raises("permission_denied", client.drain_pool("default", 1))
        assert (await client.search_tasks(limit=1)).total >= 0
    async with secure.client("admin") as admin:
        assert (await admin.bulk("delete", dry_run=True, pools=["default"])).matched >= 0
        assert (await admin.pause_pool("default")).paused
        assert (await admin.resume_pool("default")).changed
