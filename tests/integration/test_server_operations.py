"""The Operations service (docs/http.md, "Operations"; docs/server-api.md, "Operations") over
every interface: gRPC on both transports, HTTP/JSON, gRPC-Web, and a sharded pair.

Servers run as `cronoq-server` assembles them (`wiring.build`) in this process on loopback
ports (the shards as real processes), with the tokens of helpers.auth where roles matter and
raw gRPC workers (helpers.workers) taking leases. The HTTP test runs its server on a clock it
sets, so that submit times are exact and a time range has clear edges.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from test_server_grpc_web import OPEN
from test_server_grpc_web import connect as web_connect
from test_server_grpc_web import serving as web_serving
from test_server_shards import Cluster, http
from test_server_shards import running as running_shards

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.app import ServerApp
from cronoq.server.config import load_config
from cronoq.server.wiring import build
from helpers.auth import CONFIG, PORT0, Code, Stubs, connect, md, token
from helpers.servers import running_app
from helpers.shards import Shard
from helpers.shards import config as shard_config
from helpers.transports import TRANSPORTS
from helpers.workers import AuthWorker

OPS = "/cronoq.v1.Operations/"
JSON = {"Content-Type": "application/json"}


def on(transport: str, text: str = CONFIG) -> str:
    return text.replace("[server]\n", f'[server]\ntransport = "{transport}"\n', 1)


@contextlib.asynccontextmanager
async def serving(text: str) -> AsyncIterator[tuple[Stubs, cronoq_pb2_grpc.OperationsStub]]:
    app = build(load_config(text))
    async with running_app(app, ready=True), connect(app.grpc_address) as s:
        yield s, cronoq_pb2_grpc.OperationsStub(s.channel)


async def code(call: Any) -> Code:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code()
    return Code.OK


def pool(name: str) -> pb.PoolRequest:
    return pb.PoolRequest(pool=name)


# --- gRPC: roles, scoping, pause --------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_roles_and_pool_scoping(transport: str) -> None:
    """Pause, resume and bulk actions are the admin's; SearchTasks also the client's. A caller
    restricted to pools acts and searches within them only."""
    async with serving(on(transport)) as (s, ops):
        bulk = pb.BulkRequest(action=pb.BULK_ACTION_CANCEL, dry_run=True)
        for who in ("client", "worker", "metrics"):
            for call in (
                ops.PausePool(pool("a"), metadata=md(who)),
                ops.ResumePool(pool("a"), metadata=md(who)),
                ops.BulkTasks(bulk, metadata=md(who)),
            ):
                assert await code(call) == Code.PERMISSION_DENIED, who
        search = pb.SearchTasksRequest()
        assert await code(ops.SearchTasks(search, metadata=md("worker"))) == Code.PERMISSION_DENIED
        assert await code(ops.SearchTasks(search, metadata=md("client"))) == Code.OK

        admin = md("admin")
        paused = await ops.PausePool(pool("a"), metadata=admin)
        assert (paused.pool, paused.paused, paused.changed) == ("a", True, True)
        assert (await ops.PausePool(pool("a"), metadata=admin)).changed is False
        snap = await s.admin.Snapshot(pb.Empty(), metadata=admin)
        assert {p.name: p.paused for p in snap.pools} == {"a": True, "b": False}
        resumed = await ops.ResumePool(pool("a"), metadata=admin)
        assert (resumed.paused, resumed.changed) == (False, True)
        assert await code(ops.PausePool(pool("nope"), metadata=admin)) == Code.NOT_FOUND
        assert await code(ops.PausePool(pool(""), metadata=admin)) == Code.INVALID_ARGUMENT
        assert await code(ops.PausePool(pool("b"), metadata=md("admin_a"))) == (
            Code.PERMISSION_DENIED
        )
        assert (await ops.PausePool(pool("a"), metadata=md("admin_a"))).changed is True

        mine = await s.submit("client_a", "a")
        await s.submit("admin", "b")
        found = await ops.SearchTasks(search, metadata=md("client_a"))
        assert [t.id for t in found.tasks] == [mine] and found.total == 1
        other = pb.SearchTasksRequest(filter=pb.TaskFilter(pools=["b"]))
        assert await code(ops.SearchTasks(other, metadata=md("client_a"))) == (
            Code.PERMISSION_DENIED
        )
        everything = await ops.BulkTasks(bulk, metadata=md("admin_a"))
        assert (everything.matched, everything.affected) == (1, 1)  # pool a's task alone
        bad = pb.SearchTasksRequest(filter=pb.TaskFilter(statuses=[99]))
        assert await code(ops.SearchTasks(bad, metadata=admin)) == Code.INVALID_ARGUMENT
        assert await code(ops.BulkTasks(pb.BulkRequest(), metadata=admin)) == (
            Code.INVALID_ARGUMENT
        )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_paused_pool_accepts_tasks_and_starts_them_on_resume(transport: str) -> None:
    """A task submitted to a paused pool waits while another pool's task, submitted after it,
    is leased; on resume a real worker takes it, and the task then names that worker."""
    async with serving(on(transport)) as (s, ops):
        wa, wb = AuthWorker(s), AuthWorker(s)
        await wa.register(pool="a")
        await wb.register(pool="b")
        await ops.PausePool(pool("a"), metadata=md("admin"))
        held = await s.submit("client", "a")
        other = await s.submit("client", "b")
        assert (await wb.lease()).task_id == other  # dispatch ran after both submits
        info = await s.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=held)), metadata=md("client"))
        assert info.status == pb.TASK_STATUS_READY and not info.worker_name

        await ops.ResumePool(pool("a"), metadata=md("admin"))
        lease = await wa.lease()
        assert lease.task_id == held
        wa.send(complete=pb.Complete(lease=lease.lease, output=b"done"))
        wait = pb.WaitRequest(task=pb.TaskRef(id=held), timeout_s=5)
        assert (await s.tasks.Wait(wait, metadata=md("client"))).status == (
            pb.TASK_STATUS_SUCCEEDED
        )
        workers = await s.admin.ListWorkers(pb.Empty(), metadata=md("admin"))
        worker_a = next(w for w in workers.workers if w.pool == "a")
        info = await s.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=held)), metadata=md("client"))
        assert (info.worker_name, info.worker_id) == (worker_a.name, worker_a.id)
        found = await ops.SearchTasks(
            pb.SearchTasksRequest(filter=pb.TaskFilter(ids=[held])), metadata=md("client")
        )
        assert list(found.tasks) == [info]
        wa.close()
        wb.close()


async def test_a_pause_survives_a_restart_with_a_sqlite_store(tmp_path: Path) -> None:
    text = CONFIG + f'[store]\nkind = "sqlite"\npath = "{tmp_path / "q.db"}"\n'
    async with serving(text) as (s, ops):
        await ops.PausePool(pool("a"), metadata=md("admin"))
        held = await s.submit("client", "a")
    async with serving(text) as (s, ops):
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        assert {p.name: p.paused for p in snap.pools} == {"a": True, "b": False}
        assert (await ops.PausePool(pool("a"), metadata=md("admin"))).changed is False
        worker = AuthWorker(s)
        await worker.register(pool="a")
        await ops.ResumePool(pool("a"), metadata=md("admin"))
        assert (await worker.lease()).task_id == held
        worker.close()


# --- HTTP/JSON ---------------------------------------------------------------------------------

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Http:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(self, verb: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        async with self.session.request(verb, self.base + path, json=body, **kw) as r:
            return r.status, await r.json()

    async def ok(self, verb: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, answer = await self.call(verb, path, body, **kw)
        assert status == 200, (path, body, answer)
        return answer

    async def search(self, **body: Any) -> tuple[list[int], int]:
        answer = await self.ok("POST", "/v1/tasks/search", body)
        return [int(t["id"]) for t in answer["tasks"]], answer["total"]

    async def bulk(self, action: str, flt: dict[str, Any], dry_run: bool = False) -> Any:
        body = {"action": action, "filter": flt, "dry_run": dry_run}
        return await self.ok("POST", "/v1/tasks/bulk", body)


@contextlib.asynccontextmanager
async def over_http(text: str, clock: Clock | None = None) -> AsyncIterator[Http]:
    app: ServerApp = build(load_config(text), clock=clock)
    async with running_app(app, ready=True), aiohttp.ClientSession() as session:
        yield Http(session, f"http://{app.http_address}")


async def test_search_and_bulk_actions_over_http(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    async with over_http(PORT0 + '[[pools]]\nname = "a"\n[[pools]]\nname = "b"\n', clock) as h:

        async def submit(pool: str, kind: str, key: str, team: str) -> int:
            body = {"pool": pool, "kind": kind, "key": key, "tags": {"team": team}}
            return int((await h.ok("POST", "/v1/tasks", body))["id"])

        mail = [await submit("a", "mail", f"order-{i}", "x") for i in range(3)]
        sms = [await submit("b", "sms", f"user-{i}", "y") for i in range(2)]
        clock.now = T0 + 100
        late = [await submit("a", "mail", f"order-late-{i}", "x") for i in range(2)]
        every = mail + sms + late

        assert await h.search() == (every[::-1], 7)  # newest first
        assert await h.search(filter={"pools": ["a"]}) == ((mail + late)[::-1], 5)
        assert await h.search(filter={"kinds": ["sms"]}) == (sms[::-1], 2)
        assert await h.search(filter={"tags": {"team": "y"}}) == (sms[::-1], 2)
        assert await h.search(filter={"key_prefix": "order-late"}) == (late[::-1], 2)
        assert await h.search(filter={"key": "user-1"}) == ([sms[1]], 1)
        assert await h.search(filter={"submitted_after": T0 + 50}) == (late[::-1], 2)
        assert await h.search(filter={"submitted_before": T0 + 50}) == ((mail + sms)[::-1], 5)
        assert await h.search(filter={"ids": [str(mail[0]), sms[0]]}) == ([sms[0], mail[0]], 2)
        assert await h.search(sort="id", ascending=True, limit=2, offset=1) == (every[1:3], 7)
        assert await h.search(sort="pool", ascending=True, limit=1) == ([mail[0]], 7)
        answer = await h.ok("POST", "/v1/tasks/search", {"filter": {"ids": [late[0]]}})
        assert answer["tasks"] == [await h.ok("GET", f"/v1/tasks/{late[0]}")]

        # a dry run counts and changes nothing
        sms_filter = {"kinds": ["sms"]}
        assert await h.bulk("cancel", sms_filter, dry_run=True) == {
            "action": "cancel",
            "dry_run": True,
            "matched": 2,
            "affected": 2,
        }
        assert await h.search(filter={"statuses": ["cancelled"]}) == ([], 0)
        with caplog.at_level(logging.INFO, logger="cronoq.server"):
            cancelled = await h.bulk("cancel", sms_filter)
        assert (cancelled["matched"], cancelled["affected"]) == (2, 2)
        [line] = [r for r in caplog.records if r.getMessage() == "bulk_tasks"]
        fields = line.fields  # type: ignore[attr-defined]
        assert (fields["role"], fields["action"], fields["matched"], fields["affected"]) == (
            "admin",
            "cancel",
            2,
            2,
        )
        assert fields["filter"] == "kinds=['sms']" and fields["dry_run"] is False
        assert await h.search(filter={"statuses": ["cancelled"]}) == (sms[::-1], 2)
        again = await h.bulk("cancel", sms_filter)
        assert (again["matched"], again["affected"]) == (2, 0)  # ended already

        # retry: a copy without the key of each cancelled task
        retried = await h.bulk("retry", {"statuses": ["cancelled"], "pools": ["b"]})
        assert (retried["matched"], retried["affected"]) == (2, 2)
        copies, total = await h.search(filter={"kinds": ["sms"], "statuses": ["ready"]})
        assert total == 2 and min(copies) > max(every)
        for copy in copies:
            info = await h.ok("GET", f"/v1/tasks/{copy}")
            assert "key" not in info and info["pool"] == "b"
        assert (await h.bulk("retry", {"pools": ["a"]}))["affected"] == 0  # all still live

        # delete: the ended tasks only, gone from the history
        assert (await h.bulk("delete", {}, dry_run=True))["affected"] == 2
        deleted = await h.bulk("delete", {"submitted_before": T0 + 50})
        assert (deleted["matched"], deleted["affected"]) == (5, 2)
        status, _ = await h.call("GET", f"/v1/tasks/{sms[0]}")
        assert status == 404
        assert (await h.search())[1] == 7  # 5 of the first 7, then 2 copies

        # a page of another origin may not change anything
        status, _ = await h.call(
            "POST",
            "/v1/tasks/bulk",
            {"action": "cancel"},
            headers={"Origin": "https://evil.example"},
        )
        assert status == 403
        assert (await h.bulk("cancel", {}, dry_run=True))["affected"] == 7
        status, _ = await h.call(
            "POST", "/v1/pools/a/pause", headers={"Origin": "https://evil.example"}
        )
        assert status == 403

        paused = await h.ok("POST", "/v1/pools/a/pause")
        assert paused == {"pool": "a", "paused": True, "changed": True}
        assert (await h.ok("POST", "/v1/pools/a/pause", {}))["changed"] is False
        snap = await h.ok("GET", "/v1/snapshot")
        assert {p["name"]: (p["paused"], p["unserved"]) for p in snap["pools"]} == {
            "a": (True, True),  # tasks wait and no worker serves it
            "b": (False, True),
        }
        assert await h.ok("POST", "/v1/pools/a/resume") == {
            "pool": "a",
            "paused": False,
            "changed": True,
        }


async def test_bad_input_over_http() -> None:
    async with over_http(PORT0 + '[[pools]]\nname = "a"\n') as h:
        cases: list[tuple[str, Any, int, str]] = [
            ("/v1/tasks/search", {"filter": {"statuses": ["done"]}}, 400, "filter.statuses[0]"),
            ("/v1/tasks/search", {"limit": -1}, 400, "limit: -1 is out of range"),
            ("/v1/tasks/search", {"offset": "3"}, 400, "offset: must be an integer"),
            ("/v1/tasks/search", {"filter": "a"}, 400, "filter: must be a JSON object"),
            ("/v1/tasks/search", {"filter": {"pools": "a"}}, 400, "filter.pools: must be an array"),
            ("/v1/tasks/search", {"filter": {"size": 1}}, 400, "filter.size: unknown field"),
            ("/v1/tasks/search", {"sort": "size"}, 400, "sort: "),
            ("/v1/tasks/search", {"filter": {"pools": ["zz"]}}, 404, "unknown pool 'zz'"),
            ("/v1/tasks/search", {"filter": {"submitted_after": "1"}}, 400, "a number"),
            ("/v1/tasks/bulk", {}, 400, "action: required"),
            ("/v1/tasks/bulk", {"action": "purge"}, 400, "action: "),
            ("/v1/tasks/bulk", {"action": "cancel", "dry_run": 1}, 400, "dry_run"),
            ("/v1/pools/a/pause", {"force": True}, 400, "force: unknown field"),
            ("/v1/pools/zz/resume", None, 404, "unknown pool 'zz'"),
        ]
        for path, body, status, words in cases:
            got, answer = await h.call("POST", path, body)
            assert got == status and words in answer["error"], (path, body, answer)


async def test_roles_over_http() -> None:
    async with over_http(CONFIG) as h:

        def bearer(who: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token(who)}"}

        for path, body in (
            ("/v1/pools/a/pause", None),
            ("/v1/pools/a/resume", None),
            ("/v1/tasks/bulk", {"action": "cancel", "dry_run": True}),
        ):
            for who in ("client", "worker", "metrics"):
                status, answer = await h.call("POST", path, body, headers=bearer(who))
                assert status == 403 and 'needs role "admin"' in answer["error"], (path, who)
            status, _ = await h.call("POST", path, body, headers=bearer("admin"))
            assert status == 200, path
        status, _ = await h.call("POST", "/v1/tasks/search", {}, headers=bearer("client"))
        assert status == 200
        status, _ = await h.call("POST", "/v1/tasks/search", {}, headers=bearer("worker"))
        assert status == 403
        status, _ = await h.call("POST", "/v1/tasks/search", {})
        assert status == 401


async def test_the_log_names_the_token_without_showing_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(CONFIG) as (_, ops):
        with caplog.at_level(logging.INFO, logger="cronoq.server"):
            await ops.PausePool(pool("a"), metadata=md("admin_a"))
    [line] = [r for r in caplog.records if r.getMessage() == "pool_pause"]
    fields = line.fields  # type: ignore[attr-defined]
    digest = hashlib.sha256(token("admin_a").encode()).hexdigest()
    assert fields == {
        "pool": "a",
        "changed": True,
        "role": "admin",
        "token_sha256": digest[:12],
        "caller_pools": "a",
    }
    assert token("admin_a") not in caplog.text


# --- gRPC-Web ---------------------------------------------------------------------------------


async def test_operations_over_grpc_web() -> None:
    async with web_serving(OPEN) as app, web_connect(app) as c:
        paused = await c.call(OPS + "PausePool", pool("a"))
        assert paused.code == 0
        assert pb.PoolControlResponse.FromString(paused.messages[0]).changed is True
        sent = await c.call("/cronoq.v1.Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="a")))
        task_id = pb.SubmitResponse.FromString(sent.messages[0]).id
        found = await c.call(OPS + "SearchTasks", pb.SearchTasksRequest(), mode="text")
        answer = pb.SearchTasksResponse.FromString(found.messages[0])
        assert [t.id for t in answer.tasks] == [task_id] and answer.total == 1
        refused = await c.call(OPS + "BulkTasks", pb.BulkRequest())
        assert refused.code == Code.INVALID_ARGUMENT.value[0]


# --- shards ----------------------------------------------------------------------------------


async def test_operations_across_shards(tmp_path: Path) -> None:
    """Shard a (pools pa) forwards a pause of shard b's pool; a search through a merges both
    shards' matches in order with the sum of their totals; a bulk dry run counts on both."""
    a = Shard("a", 1, ["pa"])
    b = Shard("b", 2, ["pb"])
    files = {s.name: shard_config(s, [a, b]) for s in (a, b)}
    with running_shards(Cluster({"a": a, "b": b}), tmp_path, files) as cluster:
        async with http(cluster) as h:
            paused = await h.ok("a", "POST", "/v1/pools/pb/pause", who=None)
            assert paused == {"pool": "pb", "paused": True, "changed": True}
            on_b = await h.ok("b", "POST", "/v1/pools/pb/pause", who=None)
            assert on_b["changed"] is False  # b holds the state
            ids = []
            for p in ("pa", "pb", "pa", "pb"):
                sent = await h.ok("a", "POST", "/v1/tasks", {"pool": p}, who=None)
                ids.append(int(sent["id"]))
            body = {"sort": "submitted", "limit": 3}
            found = await h.ok("a", "POST", "/v1/tasks/search", body, who=None)
            assert found["total"] == 4 and len(found["tasks"]) == 3
            times = [int(t["created_unix_ns"]) for t in found["tasks"]]
            assert times == sorted(times, reverse=True)
            assert {int(t["id"]) for t in found["tasks"]} <= set(ids)
            body = {"filter": {"pools": ["pb"]}, "sort": "id", "ascending": True}
            only_b = await h.ok("a", "POST", "/v1/tasks/search", body, who=None)
            assert [int(t["id"]) for t in only_b["tasks"]] == [ids[1], ids[3]]
            dry = {"action": "cancel", "dry_run": True}
            counted = await h.ok("a", "POST", "/v1/tasks/bulk", dry, who=None)
            assert (counted["matched"], counted["affected"]) == (4, 4)
