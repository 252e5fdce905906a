"""The shard plan (docs/sharding.md): `[[shards]]` as maps from pools, resources and task ids
to shards, and the metadata keys shards and clients exchange."""

from __future__ import annotations

from collections.abc import (
    Mapping,
)
from dataclasses import dataclass

from ....store.base import SHARD_SHIFT
from ...auth import Principal
from ...config import ServerConfig, ShardSettings

FORWARDED = "cronoq-forwarded"
SHARD_KEY = "cronoq-shard"
ENDPOINT_KEY = "cronoq-shard-endpoint"
UNAVAILABLE_KEY = "cronoq-unavailable-shards"


@dataclass(frozen=True)
class ShardPlan:
    """`[[shards]]` as maps: which shard serves a pool, a resource, a task id's number."""

    own: ShardSettings
    shards: tuple[ShardSettings, ...]
    by_pool: Mapping[str, ShardSettings]
    by_number: Mapping[int, ShardSettings]
    by_resource: Mapping[str, ShardSettings]

    @classmethod
    def of(cls, cfg: ServerConfig) -> ShardPlan | None:
        """The plan of a sharded configuration, None without `[[shards]]`."""
        own = cfg.own_shard
        if own is None:
            return None
        by_name = {s.name: s for s in cfg.shards}
        return cls(
            own,
            cfg.shards,
            {pool: s for s in cfg.shards for pool in s.pools},
            {s.number: s for s in cfg.shards},
            {r.name: by_name[r.shard] for r in cfg.resources if r.shard is not None},
        )

    @property
    def others(self) -> list[ShardSettings]:
        return [s for s in self.shards if s is not self.own]

    def of_id(self, task_id: int) -> ShardSettings | None:
        """The shard of a task id (its top 8 bits), None for a number no shard has."""
        return self.by_number.get(task_id >> SHARD_SHIFT)

    def pools_of(self, shard: ShardSettings, caller: Principal) -> list[str]:
        return [p for p in shard.pools if caller.sees(p)]
