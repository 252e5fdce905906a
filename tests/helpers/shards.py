"""Sharded servers for tests: a plan of shards on loopback ports known in advance (every server
of a plan must know every shard's endpoint before any starts), and each shard's config.

    a = Shard("a", 1, ["default"])
    b = Shard("b", 200, ["p2"], store='[store]\\nkind = "sqlite"\\npath = "..."\\n')
    text = config(a, [a, b])       # the whole file for shard a's server
    server = Server(write(tmp_path, text, "a.toml"))

A shard's `grpc_port` is chosen once (`free_port()`), so a restarted process keeps its endpoint;
`http_port` likewise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .ports import free_port

__all__ = ["Shard", "config", "plan"]

_given: set[int] = set()  # ports handed out in this process (free_port may repeat one)


def _port() -> int:
    while (port := free_port()) in _given:
        pass
    _given.add(port)
    return port


@dataclass
class Shard:
    """One `[[shards]]` entry and what its servers need: a store table (TOML text, memory by
    default), and `pool_keys`, extra keys for every pool of the shard."""

    name: str
    number: int
    pools: list[str]
    store: str = ""
    grpc_port: int = field(default_factory=_port)
    http_port: int = field(default_factory=_port)
    host: str = "127.0.0.1"  # the endpoint's host (another than the listener's: never served)
    scheme: str = "http"  # https: the shard's servers listen with TLS
    pool_keys: str = "max = 64\n"

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://{self.host}:{self.grpc_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"


def plan(shards: Sequence[Shard]) -> str:
    """The `[[pools]]` and `[[shards]]` tables every server of these shards reads."""
    out = []
    for s in shards:
        for pool in s.pools:
            out.append(f'[[pools]]\nname = "{pool}"\n{s.pool_keys}')
    for s in shards:
        pools = ", ".join(f'"{p}"' for p in s.pools)
        out.append(
            f'[[shards]]\nname = "{s.name}"\nnumber = {s.number}\npools = [{pools}]\n'
            f'endpoint = "{s.endpoint}"\n'
        )
    return "\n".join(out)


def config(own: Shard, shards: Sequence[Shard], server: str = "", rest: str = "") -> str:
    """The file of a server of shard `own`: `[server]` on its ports (plus `server`, more keys of
    that table), its store, `rest` (auth, limits, resources...) and the plan."""
    return (
        f'[server]\ngrpc_addr = "{own.address}"\nhttp_addr = "{own.http_address}"\n'
        f'shard = "{own.name}"\nshutdown_grace_s = 0.5\n{server}\n'
        f"{own.store}\n{rest}\n{plan(shards)}"
    )
