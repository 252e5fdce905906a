"""Authentication, roles and pool/tenant scoping over real channels (docs/server.md,
"Authentication").

Each test runs the server as `cronoq-server` assembles it (`wiring.build(cfg)`) in this process
on a free loopback port, with tokens of every role and pool-restricted and tenant-bound ones, and
calls it through the generated stubs: the role of every method, the rows of
docs/reference/errors.md about auth and scoping, the check order on a standby, and with mTLS the
mapping of client certificates by DNS name. Unary, server-streaming (Watch) and bidirectional
(Work) calls all see their own caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq import client as cq
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.app import ServerApp
from cronoq.server.config import load_config, native_built
from cronoq.server.wiring import build
from helpers.auth import (
    CONFIG,
    HOW,
    METHODS,
    POOLS,
    PORT0,
    ROLE_OF,
    Code,
    Stubs,
    code_of,
    connect,
    details_of,
    md,
    mtls_config,
    over_mtls,
    ref,
    token,
)
from helpers.servers import led_elsewhere, running_app
from helpers.transports import TRANSPORTS
from helpers.waiting import until


def running(text: str) -> contextlib.AbstractAsyncContextManager[ServerApp]:
    return running_app(build(load_config(text)))


@contextlib.asynccontextmanager
async def serving(text: str = CONFIG) -> AsyncIterator[Stubs]:
    app = build(load_config(text))
    async with running_app(app, ready=True), connect(app.grpc_address) as s:
        yield s


# --- roles ------------------------------------------------------------------------------------


def call(stubs: Stubs, method: str, metadata: Sequence[tuple[str, str]]) -> Any:
    service, request = METHODS[method]
    return getattr(getattr(stubs, service), method)(request, metadata=metadata, timeout=5)


async def test_every_role_against_every_method() -> None:
    async with serving() as s:
        for method in METHODS:
            for role in ("client", "worker", "metrics", "admin"):
                code = await code_of(call(s, method, md(role)))
                if role in (ROLE_OF[method], "admin"):
                    assert code in (Code.OK, Code.INVALID_ARGUMENT), (method, role, code)
                else:
                    assert code is Code.PERMISSION_DENIED, (method, role, code)
            assert await code_of(call(s, method, [])) is Code.UNAUTHENTICATED, method


async def test_unknown_or_malformed_credentials_are_unauthenticated() -> None:
    async with serving() as s:
        for header in (
            "Bearer unknown-token-0123456789abcdef",
            f"Basic {token('admin')}",
            "Bearer",
            "",
            token("admin"),  # no scheme
        ):
            c = s.tasks.ListTasks(pb.ListTasksRequest(), metadata=[("authorization", header)])
            assert await code_of(c) is Code.UNAUTHENTICATED, header
        for scheme in ("bearer", "BEARER", "Bearer"):  # the scheme in any case
            meta = [("authorization", f"{scheme} {token('client')}")]
            assert await code_of(s.tasks.ListTasks(pb.ListTasksRequest(), metadata=meta)) is Code.OK
        for header in (f"Bearer  {token('client')}", f"Bearer   {token('client')}"):
            # blanks around the token are ignored, as the published server does
            meta = [("authorization", header)]
            assert await code_of(s.tasks.ListTasks(pb.ListTasksRequest(), metadata=meta)) is Code.OK
        # the published words first, then how to pass a token (and the roles, when denied)
        basic = [("authorization", f"Basic {token('admin')}")]
        assert await details_of(s.tasks.ListTasks(pb.ListTasksRequest(), metadata=basic)) == (
            f"missing credentials (bearer token or client certificate); {HOW}"
        )
        assert await details_of(s.tasks.ListTasks(pb.ListTasksRequest())) == (
            f"missing credentials (bearer token or client certificate); {HOW}"
        )
        unknown = [("authorization", "Bearer unknown-token-0123456789abcdef")]
        c = s.tasks.ListTasks(pb.ListTasksRequest(), metadata=unknown)
        assert await details_of(c) == f"invalid token: the server knows no such token; {HOW}"
        c = s.tasks.ListTasks(pb.ListTasksRequest(), metadata=md("worker"))
        assert await details_of(c) == (
            'credentials lack the required role: this call needs role "client" or "admin", '
            f'these credentials have role "worker"; {HOW}'
        )
        c = s.admin.Snapshot(pb.Empty(), metadata=md("client"))
        assert await details_of(c) == (
            'credentials lack the required role: this call needs role "metrics" or "admin", '
            f'these credentials have role "client"; {HOW}'
        )
        nope = s.channel.unary_unary("/cronoq.v1.Tasks/Nope")
        assert await details_of(nope(b"", metadata=md("client"))) == (
            'credentials lack the required role: this call needs role "admin", these '
            f'credentials have role "client"; {HOW}'
        )


async def test_unknown_methods_are_for_the_admin_alone() -> None:
    async with serving() as s:
        nope = s.channel.unary_unary("/cronoq.v1.Tasks/Nope")
        for who, code in ((None, Code.UNAUTHENTICATED), ("client", Code.PERMISSION_DENIED),
                          ("admin", Code.UNIMPLEMENTED)):  # fmt: skip
            assert await code_of(nope(b"", metadata=md(who))) is code, who


# --- the check order on a standby (docs/server-api.md, "Check order", steps 1-3) ------------------


async def test_standby_authenticates_before_it_refuses(tmp_path: Path) -> None:
    holder, store = await led_elsewhere(tmp_path / "q.db")  # another server's leadership
    try:
        text = CONFIG + store
        async with running(text) as app, grpc.aio.insecure_channel(str(app.grpc_address)) as ch:
            s = Stubs(ch)
            get = pb.GetRequest(task=ref(1))
            assert await code_of(s.tasks.Get(get)) is Code.UNAUTHENTICATED
            assert await code_of(s.tasks.Get(get, metadata=md("worker"))) is (
                Code.PERMISSION_DENIED
            )
            assert await code_of(s.tasks.Get(get, metadata=md("client"))) is Code.UNAVAILABLE
            watch = s.tasks.Watch(pb.WatchRequest(), metadata=[])
            assert await code_of(watch) is Code.UNAUTHENTICATED
            work = s.workers.Work(iter(()), metadata=md("worker"))
            assert await code_of(work) is Code.UNAVAILABLE
            assert not app.ready
    finally:
        await holder.close()


# --- pool scoping (docs/server.md, "Authentication") ----------------------------------------------


async def test_restricted_client_submits_only_to_its_pools() -> None:
    async with serving() as s:
        assert await s.submit("client_a", "a") > 0
        for request in (
            s.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="b")), metadata=md("client_a")),
            s.tasks.SubmitBatch(
                pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="a"), pb.TaskSpec(pool="b")]),
                metadata=md("client_a"),
            ),
        ):
            assert await code_of(request) is Code.PERMISSION_DENIED
        # the refused batch admitted nothing
        listed = await s.tasks.ListTasks(pb.ListTasksRequest(), metadata=md("admin"))
        assert [t.pool for t in listed.tasks] == ["a"]


async def test_other_pools_tasks_do_not_exist_for_a_restricted_client() -> None:
    async with serving() as s:
        hidden = await s.submit("admin", "b", key="kb")
        mine = await s.submit("client_a", "a", key="ka")
        who = md("client_a")
        for target in (hidden, "kb"):
            for c in (
                s.tasks.Get(pb.GetRequest(task=ref(target)), metadata=who),
                s.tasks.Wait(pb.WaitRequest(task=ref(target), timeout_s=5), metadata=who),
                s.tasks.Cancel(pb.CancelRequest(task=ref(target)), metadata=who),
            ):
                assert await code_of(c) is Code.NOT_FOUND
        missing = await details_of(s.tasks.Get(pb.GetRequest(task=ref("nope")), metadata=who))
        assert await details_of(s.tasks.Get(pb.GetRequest(task=ref("kb")), metadata=who)) == (
            missing.replace("nope", "kb")  # the same answer as for a task that is not there
        )
        info = await s.tasks.Get(pb.GetRequest(task=ref(hidden)), metadata=md("admin"))
        assert info.status == pb.TASK_STATUS_READY  # not cancelled by the refused call
        assert (await s.tasks.Get(pb.GetRequest(task=ref(mine)), metadata=who)).id == mine

        listed = await s.tasks.ListTasks(pb.ListTasksRequest(), metadata=who)
        assert [t.id for t in listed.tasks] == [mine]
        every = await s.tasks.ListTasks(pb.ListTasksRequest(), metadata=md("client"))
        assert [t.id for t in every.tasks] == [hidden, mine]
        only_b = s.tasks.ListTasks(pb.ListTasksRequest(pools=["b"]), metadata=who)
        assert await code_of(only_b) is Code.PERMISSION_DENIED


async def test_concurrent_callers_keep_their_own_principal() -> None:
    async with serving() as s:
        hidden = await s.submit("admin", "b")
        get = pb.GetRequest(task=ref(hidden))
        whos = ["client_a", "admin"] * 20
        codes = await asyncio.gather(*(code_of(s.tasks.Get(get, metadata=md(w))) for w in whos))
        assert codes == [Code.NOT_FOUND, Code.OK] * 20


async def test_watch_filters_other_pools_out() -> None:
    async with serving() as s:
        watch = s.tasks.Watch(pb.WatchRequest(all_transitions=True), metadata=md("client_a"))
        everything = s.tasks.Watch(pb.WatchRequest(all_transitions=True), metadata=md("admin"))
        pools_seen: set[str] = set()
        while not {"a", "b"} <= pools_seen:  # until the watches surely subscribed
            await s.submit("admin", "b")
            await s.submit("admin", "a")
            with contextlib.suppress(TimeoutError):
                pools_seen.add((await asyncio.wait_for(everything.read(), 0.1)).pool)
        first = await asyncio.wait_for(watch.read(), 2)
        assert first.pool == "a"
        await s.submit("admin", "b")
        last = await s.submit("admin", "a")
        while (ev := await asyncio.wait_for(watch.read(), 2)).id != last:
            assert ev.pool == "a"
        watch.cancel()
        everything.cancel()
        denied = s.tasks.Watch(pb.WatchRequest(pools=["b"]), metadata=md("client_a"))
        assert await code_of(denied) is Code.PERMISSION_DENIED


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_restricted_client_watches_its_pools_tasks_end(transport: str) -> None:
    """The Python client's Watch (terminal events, no pool filter) with a pool-restricted
    token sees each of its pool's tasks end, and nothing of the other pools, on both
    transports."""
    app = build(load_config(CONFIG.replace("[server]\n", f'[server]\ntransport = "{transport}"\n')))
    async with running_app(app, ready=True):
        address = str(app.grpc_address)

        async def done(lease: Any) -> bytes:
            return b"ok"

        workers = [cq.Worker(address, p, done, token=token("worker")) for p in ("a", "b")]
        running = [asyncio.ensure_future(w.run()) for w in workers]
        async with (
            cq.Client(address, token=token("client_a")) as mine,
            cq.Client(address, token=token("admin")) as admin,
        ):
            seen: list[cq.Event] = []
            watching = asyncio.Event()

            async def watch() -> None:
                async for ev in mine.watch():
                    seen.append(ev)
                    watching.set()

            watcher = asyncio.ensure_future(watch())
            while not watching.is_set():  # until the Watch surely subscribed
                await mine.submit(b"x", pool="a")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watching.wait(), 0.1)
            other = await admin.submit(b"x", pool="b")
            last = await mine.submit(b"x", pool="a")
            await until(lambda: any(ev.id == last.id for ev in seen), 10, "the last task's end")
            watcher.cancel()
            assert {ev.pool for ev in seen} == {"a"} and other.id not in {ev.id for ev in seen}
            assert {ev.status for ev in seen} == {"succeeded"}
        for w in workers:
            await w.stop()
        await asyncio.gather(*running)


# --- tenants (docs/server.md, "Authentication") ---------------------------------------------------


async def test_tenant_bound_token() -> None:
    async with serving() as s:
        plain = await s.submit("tenant")
        same = await s.submit("tenant", tenant="t1")
        for tid in (plain, same):
            info = await s.tasks.Get(pb.GetRequest(task=ref(tid)), metadata=md("tenant"))
            assert info.tenant == "t1"
        other = s.tasks.Submit(
            pb.SubmitRequest(task=pb.TaskSpec(pool="a", tenant="t2")), metadata=md("tenant")
        )
        assert await code_of(other) is Code.PERMISSION_DENIED
        batch = s.tasks.SubmitBatch(
            pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="a"), pb.TaskSpec(tenant="t2")]),
            metadata=md("tenant"),
        )
        assert await code_of(batch) is Code.PERMISSION_DENIED
        free = await s.submit("client", tenant="t2")  # an unbound token names the tenant
        info = await s.tasks.Get(pb.GetRequest(task=ref(free)), metadata=md("client"))
        assert info.tenant == "t2"


# --- workers ----------------------------------------------------------------------------------


def register(pool: str, **labels: str) -> pb.WorkerMessage:
    reg = pb.Register(pool=pool, slots=1, worker_name="w", protocol_version=3, labels=labels)
    return pb.WorkerMessage(register=reg)


class Worker:
    """A raw Work stream that stays open until closed."""

    def __init__(self, stubs: Stubs, metadata: Sequence[tuple[str, str]]) -> None:
        self.outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self.call = stubs.workers.Work(self._messages(), metadata=metadata)

    async def _messages(self) -> AsyncIterator[pb.WorkerMessage]:
        while (msg := await self.outbox.get()) is not None:
            yield msg

    async def register(self, pool: str, **labels: str) -> Any:
        """The `registered` message, or the status the stream ended with."""
        self.outbox.put_nowait(register(pool, **labels))
        try:
            msg = await asyncio.wait_for(self.call.read(), 5)
        except grpc.aio.AioRpcError as e:
            return e.code()
        assert msg is not grpc.aio.EOF
        return msg.registered

    def close(self) -> None:
        self.outbox.put_nowait(None)


async def test_worker_registration_is_scoped() -> None:
    async with serving() as s:
        assert await Worker(s, md("worker_a")).register("b") is Code.PERMISSION_DENIED
        denied = Worker(s, md("worker_a"))
        assert await denied.register("a", gpu="h100") is Code.PERMISSION_DENIED
        assert "labels" in await denied.call.details()
        assert await Worker(s, md("worker_a")).register("a", gpu="a100", x="1") is (
            Code.PERMISSION_DENIED  # every label claimed must be allowed
        )
        assert await Worker(s, md("client")).register("a") is Code.PERMISSION_DENIED
        a, b = Worker(s, md("worker_a")), Worker(s, md("worker"))
        assert (await a.register("a", gpu="a100")).slots == 1
        assert (await b.register("b", anything="goes")).slots == 1
        admin = Worker(s, md("admin"))
        assert (await admin.register("b")).slots == 1  # admin may do everything

        # what a restricted metrics token sees: its pools only
        restricted = await s.admin.ListWorkers(pb.Empty(), metadata=md("metrics_a"))
        assert [w.pool for w in restricted.workers] == ["a"]
        every = await s.admin.ListWorkers(pb.Empty(), metadata=md("metrics"))
        assert sorted(w.pool for w in every.workers) == ["a", "b", "b"]
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("metrics_a"))
        assert [p.name for p in snap.pools] == ["a"] and snap.workers_connected == 1
        assert snap.pools[0].capacity == 1
        full = await s.admin.Snapshot(pb.Empty(), metadata=md("metrics"))
        assert [p.name for p in full.pools] == ["a", "b"] and full.workers_connected == 3
        for w in (a, b, admin):
            w.close()
            assert await w.call.code() is Code.OK

        await s.submit("admin", "b")  # no worker takes it now: it stays pending
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("metrics_a"))
        assert (snap.live_tasks, snap.pending, snap.running) == (0, 0, 0)
        full = await s.admin.Snapshot(pb.Empty(), metadata=md("metrics"))
        assert (full.live_tasks, full.pending, full.running) == (1, 1, 0)


# --- schedules --------------------------------------------------------------------------------


def schedule(name: str, pool: str, **fields: Any) -> pb.RecurringRequest:
    return pb.RecurringRequest(
        name=name, cron="0 0 1 1 *", template=pb.TaskSpec(pool=pool, **fields)
    )


async def test_recurring_for_a_restricted_admin() -> None:
    async with serving() as s:
        await s.admin.AddRecurring(schedule("nightly-b", "b"), metadata=md("admin"))
        await s.admin.AddRecurring(schedule("nightly-a", "a"), metadata=md("admin_a"))
        who = md("admin_a")
        for request in (schedule("other", "b"), schedule("nightly-b", "a")):
            assert await code_of(s.admin.AddRecurring(request, metadata=who)) is (
                Code.PERMISSION_DENIED
            )
        gone = await s.admin.RemoveRecurring(
            pb.RemoveRecurringRequest(name="nightly-b"), metadata=who
        )
        assert not gone.removed
        mine = await s.admin.ListRecurring(pb.Empty(), metadata=who)
        assert [r.name for r in mine.schedules] == ["nightly-a"]
        mine = await s.admin.ListRecurring(pb.Empty(), metadata=md("metrics_a"))
        assert [r.name for r in mine.schedules] == ["nightly-a"]
        every = await s.admin.ListRecurring(pb.Empty(), metadata=md("metrics"))
        assert [(r.name, r.pool) for r in every.schedules] == [
            ("nightly-a", "a"),
            ("nightly-b", "b"),
        ]


async def test_tenant_bound_recurring_template() -> None:
    text = CONFIG + '[[auth.tokens]]\ntoken = "tenant-admin-0123456789abcdef"\nrole = "admin"\n'
    text += 'tenant = "t9"\n'
    async with serving(text) as s:
        who = [("authorization", "Bearer tenant-admin-0123456789abcdef")]
        bad = s.admin.AddRecurring(schedule("x", "a", tenant="t1"), metadata=who)
        assert await code_of(bad) is Code.PERMISSION_DENIED
        await s.admin.AddRecurring(schedule("x", "a"), metadata=who)


# --- auth disabled ----------------------------------------------------------------------------


async def test_without_credentials_everyone_is_an_unrestricted_admin() -> None:
    async with serving(PORT0 + POOLS) as s:
        meta = [("authorization", "Bearer whatever-it-says-here")]
        assert await s.submit("admin", "b") > 0
        assert (await s.admin.Snapshot(pb.Empty(), metadata=meta)).pools[1].name == "b"
        await s.admin.AddRecurring(schedule("n", "b"))
        w = Worker(s, [])
        assert (await w.register("b", gpu="x")).slots == 1
        w.close()


# --- mTLS: client certificates by DNS name ----------------------------------------------------


def channel(
    app: ServerApp, pki: Path, client: str
) -> contextlib.AbstractAsyncContextManager[Stubs]:
    return over_mtls(pki, client, app.grpc_address.port if app.grpc_address else 0)


@pytest.mark.parametrize("transport", ["grpcio", "native"])
async def test_client_certificates_map_to_principals(pki: Path, transport: str) -> None:
    if transport == "native" and not native_built():
        pytest.skip("the native transport is not built")
    async with running(mtls_config(pki, transport=transport)) as app:
        assert app.transport == transport
        while not app.ready:
            await asyncio.sleep(0.01)
        async with (
            channel(app, pki, "ops") as ops,
            channel(app, pki, "robot") as robot,
            channel(app, pki, "stranger") as stranger,
            channel(app, pki, "ip") as ip,
        ):
            hidden = await ops.submit("admin", "b")  # a token still works over mTLS
            # unary: the certificate's principal (client, pool a), matched case-insensitively
            mine = (await ops.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="a")))).id
            get = ops.tasks.Get(pb.GetRequest(task=ref(hidden)))
            assert await code_of(get) is Code.NOT_FOUND
            assert (await ops.tasks.Get(pb.GetRequest(task=ref(mine)))).pool == "a"
            denied = ops.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="b")))
            assert await code_of(denied) is Code.PERMISSION_DENIED
            assert await code_of(ops.admin.Snapshot(pb.Empty())) is Code.PERMISSION_DENIED
            # a header decides alone: an unknown token is not rescued by a mapped certificate
            bad = [("authorization", "Bearer unknown-token-0123456789abcdef")]
            assert await code_of(ops.tasks.Get(pb.GetRequest(task=ref(mine)), metadata=bad)) is (
                Code.UNAUTHENTICATED
            )
            # server streaming
            watch = ops.tasks.Watch(pb.WatchRequest(pools=["b"]))
            assert await code_of(watch) is Code.PERMISSION_DENIED
            watch = ops.tasks.Watch(pb.WatchRequest(ids=[hidden, mine], all_transitions=True))
            await asyncio.sleep(0.2)  # let the watch subscribe
            await ops.tasks.Cancel(pb.CancelRequest(task=ref(hidden)), metadata=md("admin"))
            await ops.tasks.Cancel(pb.CancelRequest(task=ref(mine)))
            assert (await asyncio.wait_for(watch.read(), 2)).id == mine
            watch.cancel()
            # bidirectional
            assert await Worker(robot, []).register("b") is Code.PERMISSION_DENIED
            w = Worker(robot, [])
            assert (await w.register("a")).slots == 1
            w.close()
            assert await code_of(w.call) is Code.OK
            # not mapped; an IP SAN never matches a `dns` entry
            for stubs in (stranger, ip):
                c = stubs.tasks.ListTasks(pb.ListTasksRequest())
                assert await code_of(c) is Code.UNAUTHENTICATED
            assert await details_of(stranger.tasks.ListTasks(pb.ListTasksRequest())) == (
                f"the client certificate is not mapped to a role; {HOW}"
            )
            # an unknown method is still authenticated and role-checked first
            for stubs, code in ((stranger, Code.UNAUTHENTICATED), (ops, Code.PERMISSION_DENIED)):
                nope = stubs.channel.unary_unary("/cronoq.v1.Tasks/Nope")
                assert await code_of(nope(b"")) is code


async def test_certificate_check_comes_before_the_standby_refusal(
    pki: Path, tmp_path: Path
) -> None:
    holder, store = await led_elsewhere(tmp_path / "q.db")
    try:
        async with (
            running(mtls_config(pki, store)) as app,
            channel(app, pki, "stranger") as stranger,
            channel(app, pki, "ops") as ops,
        ):
            listing = pb.ListTasksRequest()
            assert await code_of(stranger.tasks.ListTasks(listing)) is Code.UNAUTHENTICATED
            assert await code_of(ops.admin.Snapshot(pb.Empty())) is Code.PERMISSION_DENIED
            assert await code_of(ops.tasks.ListTasks(listing)) is Code.UNAVAILABLE
            assert await code_of(ops.tasks.Watch(pb.WatchRequest())) is Code.UNAVAILABLE
            nope = stranger.channel.unary_unary("/cronoq.v1.Tasks/Nope")
            assert await code_of(nope(b"")) is Code.UNAUTHENTICATED
            await holder.close()
            while not app.ready:
                await asyncio.sleep(0.05)
            assert await code_of(ops.tasks.ListTasks(listing)) is Code.OK
    finally:
        await holder.close()


async def test_http_uses_the_same_credentials_and_roles() -> None:
    """HTTP routes: no or unknown credential -> 401, wrong role -> 403, pool scoping as on gRPC;
    health and readiness need no credential."""
    import json
    import urllib.error
    import urllib.request

    def get(app: ServerApp, path: str, who: str | None) -> tuple[int, Any]:
        headers = dict(md(who))
        url = f"http://{app.http_address}{path}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as r:
                body = r.read()
                return r.status, json.loads(body) if body.startswith(b"{") else body
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    async with running(CONFIG) as app:
        while not app.ready:
            await asyncio.sleep(0.01)

        def probe() -> list[tuple[int, Any]]:
            return [
                get(app, "/healthz", None),
                get(app, "/v1/snapshot", None),
                get(app, "/v1/snapshot", "nobody"),
                get(app, "/v1/snapshot", "client"),
                get(app, "/v1/snapshot", "metrics"),
                get(app, "/v1/snapshot", "metrics_a"),
            ]

        health, anonymous, unknown, client, metrics, metrics_a = await asyncio.to_thread(probe)
    assert health[0] == 200
    assert (anonymous[0], anonymous[1]["code"]) == (401, "unauthorized")
    assert (unknown[0], unknown[1]["code"]) == (401, "unauthorized")
    assert (client[0], client[1]["code"]) == (403, "forbidden")
    assert metrics[0] == 200 and {p["name"] for p in metrics[1]["pools"]} == {"a", "b"}
    assert metrics_a[0] == 200 and [p["name"] for p in metrics_a[1]["pools"]] == ["a"]


async def test_request_timeout_bounds_unary_calls_but_not_waits() -> None:
    """limits.request_timeout_s: a unary call that takes longer ends DEADLINE_EXCEEDED; Wait and
    Submit(wait=true) are bounded by max_wait_s instead."""
    from cronoq.server.services import tasks as tasks_module

    config = PORT0 + "[limits]\nrequest_timeout_s = 0.2\n"
    slow_calls = 0
    original = tasks_module.TasksService.Get

    async def slow_get(self: Any, request: Any, context: Any) -> Any:
        nonlocal slow_calls
        slow_calls += 1
        await asyncio.sleep(1.0)
        return await original(self, request, context)

    tasks_module.TasksService.Get = slow_get  # type: ignore[method-assign]
    try:
        async with serving(config) as stubs:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stubs.tasks.Get(pb.GetRequest(task=ref(1)))
            assert e.value.code() == Code.DEADLINE_EXCEEDED
            assert "request_timeout_s" in (e.value.details() or "")
            # a wait longer than the request timeout is fine (nobody serves the pool: it times
            # out by its own wait bound, not the request timeout)
            task = pb.TaskSpec(payload=b"x")
            got = await stubs.tasks.Submit(pb.SubmitRequest(task=task))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stubs.tasks.Wait(pb.WaitRequest(task=ref(got.id), timeout_s=0.5))
            assert e.value.code() == Code.DEADLINE_EXCEEDED
            assert "request_timeout_s" not in (e.value.details() or "")
    finally:
        tasks_module.TasksService.Get = original  # type: ignore[method-assign]
    assert slow_calls == 1
