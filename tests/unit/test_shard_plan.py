"""The shard plan's maps, the rule of when a caller's credential may be forwarded and a peer
call's errors (docs/sharding.md, "The plan", "Forwarding", "Peer errors"), without processes:
the routing itself runs through real servers in tests/integration/test_server_shards*.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.auth import ADMIN, Principal
from cronoq.server.config import ServerConfig, load_config
from cronoq.server.errors import Refused
from cronoq.server.services.sharding import Peers, ShardPlan
from cronoq.server.services.sharding.peers import CLOSED

LIST = "/cronoq.v1.Tasks/ListTasks"
SUBMIT = "/cronoq.v1.Tasks/Submit"

TOKEN = "a-token-of-the-client-0123456789"


def _config(endpoint_b: str, *, auth: bool = True, insecure: bool = False) -> ServerConfig:
    text = f"""
[server]
shard = "a"
insecure_peer_http = {"true" if insecure else "false"}
[[pools]]
name = "default"
[[pools]]
name = "gpu"
[[resources]]
kind = "semaphore"
name = "licence"
permits = 2
shard = "b"
[[shards]]
name = "a"
number = 0
pools = ["default"]
endpoint = "http://127.0.0.1:7070"
[[shards]]
name = "b"
number = 200
pools = ["gpu"]
endpoint = "{endpoint_b}"
"""
    if auth:
        text += f'[[auth.tokens]]\ntoken = "{TOKEN}"\nrole = "client"\n'
    return load_config(text, env={})


def test_the_plan_maps_pools_numbers_and_resources_to_shards() -> None:
    plan = ShardPlan.of(_config("http://127.0.0.1:7071"))
    assert plan is not None
    assert plan.own.name == "a"
    assert [s.name for s in plan.others] == ["b"]
    assert {p: s.name for p, s in plan.by_pool.items()} == {"default": "a", "gpu": "b"}
    assert {r: s.name for r, s in plan.by_resource.items()} == {"licence": "b"}
    assert plan.of_id(200 << 56 | 1 << 40 | 1) is plan.by_number[200]
    assert plan.of_id(1) is plan.own  # shard number 0
    assert plan.of_id(7 << 56 | 1) is None  # no shard has number 7: handled locally
    assert ShardPlan.of(load_config("", env={})) is None


BEARER = Principal("client", bearer=TOKEN)
BY_CERT = Principal("client")  # authenticated by its certificate: nothing to forward


@pytest.mark.parametrize(
    ("endpoint", "auth", "insecure", "caller", "forwarded"),
    [
        ("http://10.1.2.3:7070", False, False, ADMIN, True),  # no authentication here
        ("https://gpu.internal:7070", True, False, BEARER, True),
        ("http://localhost:7070", True, False, BEARER, True),
        ("http://127.9.9.9:7070", True, False, BEARER, True),
        ("http://[::1]:7070", True, False, BEARER, True),
        ("http://gpu.localhost:7070", True, False, BEARER, False),  # a name, not loopback
        ("http://10.255.255.1:7070", True, False, BEARER, False),
        ("http://10.255.255.1:7070", True, True, BEARER, True),  # insecure_peer_http
        ("https://gpu.internal:7070", True, True, BY_CERT, False),  # never
        ("http://127.0.0.1:7071", True, True, BY_CERT, False),
    ],
)
def test_when_a_callers_credential_may_be_forwarded(
    endpoint: str, auth: bool, insecure: bool, caller: Principal, forwarded: bool
) -> None:
    cfg = _config(endpoint, auth=auth, insecure=insecure)
    plan = ShardPlan.of(cfg)
    assert plan is not None
    assert Peers(cfg).may_forward(caller, plan.by_number[200]) is forwarded


class _Context:
    """The two members of a call's context that Peers reads."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> None:
        return None


async def _peer_b() -> tuple[grpc.aio.Server, int, asyncio.Event, asyncio.Event]:
    """A stand-in for shard b on a real port: ListTasks sets `arrived`, then answers once
    `release` is set; Submit answers UNAVAILABLE as a standby does (so Peers closes the
    channel, as when b's leader changes)."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def list_tasks(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        arrived.set()
        await release.wait()
        empty: bytes = pb.ListTasksResponse().SerializeToString()
        return empty

    async def submit(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "this server is not the leader (standby)")
        raise AssertionError("abort returned")

    server = grpc.aio.server()
    methods: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        "ListTasks": grpc.unary_unary_rpc_method_handler(list_tasks),
        "Submit": grpc.unary_unary_rpc_method_handler(submit),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("cronoq.v1.Tasks", methods),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, arrived, release


def test_a_call_whose_channel_is_closed_under_it_names_the_shard_unavailable() -> None:
    """A merged call's part to b that is still running when another call's UNAVAILABLE makes
    Peers close b's channel ends UNAVAILABLE naming b (so the listing names b unavailable),
    not CANCELLED; the caller's own cancellation of a part still cancels it."""

    async def main() -> None:
        server, port, arrived, release = await _peer_b()
        cfg = _config(f"http://127.0.0.1:{port}", auth=False)
        plan = ShardPlan.of(cfg)
        assert plan is not None
        b = plan.by_number[200]
        peers = Peers(cfg)
        caller, context = ADMIN, cast(Any, _Context())

        def listing() -> asyncio.Task[pb.ListTasksResponse]:
            request = pb.ListTasksRequest(limit=1)
            return asyncio.ensure_future(
                peers.call(b, LIST, request, pb.ListTasksResponse, caller, context)
            )

        async def running() -> None:
            await arrived.wait()
            arrived.clear()

        try:
            closed_under = listing()
            await running()
            with pytest.raises(Refused) as standby:
                submit = pb.SubmitRequest()
                await peers.call(b, SUBMIT, submit, pb.SubmitResponse, caller, context)
            assert standby.value.code == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(Refused) as part:
                await closed_under
            assert part.value.code == grpc.StatusCode.UNAVAILABLE
            assert part.value.message == f"shard 'b' is unavailable: {CLOSED}"

            mine = listing()  # on a new channel
            await running()
            mine.cancel()
            with pytest.raises(asyncio.CancelledError):
                await mine
            release.set()
            assert isinstance(await listing(), pb.ListTasksResponse)  # the peer still serves
        finally:
            await peers.close()
            await server.stop(None)

    asyncio.run(main())
