"""The shard plan's maps and the rule of when a caller's credential may be forwarded
(docs/sharding.md, "The plan" and "Forwarding"), without processes: the routing itself runs
through real servers in tests/integration/test_server_shards*.py."""

from __future__ import annotations

import pytest

from cronoq.server.auth import ADMIN, Principal
from cronoq.server.config import ServerConfig, load_config
from cronoq.server.services.sharding import Peers, ShardPlan

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
