"""Shards that call each other over TLS (docs/sharding.md, "Forwarding"): two real servers with
mutual TLS, the calling one presenting `server.peer_tls`. A bearer token is forwarded to an
https:// peer; a caller known only by its client certificate never is (no token to send), so it
is refused with the shard's endpoint and its listings name that shard as unavailable."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from helpers.auth import Stubs, make_pki, md, over_mtls, token
from helpers.servers import Server, write
from helpers.shards import Shard, config


def _tls(pki: Path) -> str:
    return (
        f'[server.tls]\ncert = "{pki}/server.pem"\nkey = "{pki}/server.key"\n'
        f'client_ca = "{pki}/ca.pem"\n'
    )


def _auth() -> str:
    return (
        f'[[auth.tokens]]\ntoken = "{token("admin")}"\nrole = "admin"\n'
        '[[auth.certs]]\ndns_name = "ops.example"\nrole = "client"\n'
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Shard, Shard]]:
    tmp = tmp_path_factory.mktemp("tls-shards")
    pki = make_pki(tmp)
    a = Shard("a", 3, ["default"], host="localhost", scheme="https")
    b = Shard("b", 4, ["pb"], host="localhost", scheme="https")
    shards = [a, b]
    peer = f'[server.peer_tls]\nca = "{pki}/ca.pem"\ncert = "{pki}/robot.pem"\n'
    peer += f'key = "{pki}/robot.key"\n'
    servers = []
    try:
        for own in shards:
            text = config(own, shards, rest=_tls(pki) + peer + _auth())
            s = Server(write(tmp, text, f"{own.name}.toml"))
            servers.append(s)
        for s in servers:
            s.wait_for("event=ready")
        yield pki, a, b
    finally:
        for s in servers:
            s.kill()


@contextlib.asynccontextmanager
async def at(pki: Path, shard: Shard, client: str = "ops") -> AsyncIterator[Stubs]:
    async with over_mtls(pki, client, shard.grpc_port) as stubs:
        yield stubs


async def test_a_bearer_token_is_forwarded_over_tls(pair: tuple[Path, Shard, Shard]) -> None:
    pki, a, b = pair
    async with at(pki, a) as s:
        resp = await s.tasks.Submit(
            pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", pool="pb", key="over-tls")),
            metadata=md("admin"),
        )
        assert resp.id >> 56 == b.number
        info = await s.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=resp.id)), metadata=md("admin"))
        assert (info.pool, info.key) == ("pb", "over-tls")
        page = await s.tasks.ListTasks(pb.ListTasksRequest(), metadata=md("admin"))
        assert resp.id in [t.id for t in page.tasks]
        assert list(page.unavailable_shards) == []


async def test_a_certificate_caller_is_never_forwarded(pair: tuple[Path, Shard, Shard]) -> None:
    pki, a, b = pair
    async with at(pki, a) as s:
        call = s.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", pool="pb")))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.value.details() == f"pool 'pb' is served by shard 'b' at {b.endpoint}"
        trailers = dict(info.value.trailing_metadata() or ())
        assert trailers == {"cronoq-shard": "b", "cronoq-shard-endpoint": b.endpoint}
        mine = await s.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"x")))
        assert mine.id >> 56 == a.number
        page = await s.tasks.ListTasks(pb.ListTasksRequest())
        assert list(page.unavailable_shards) == ["b"]
        assert mine.id in [t.id for t in page.tasks]
        snap = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        assert [p.name for p in snap.pools] == ["default", "pb"]
