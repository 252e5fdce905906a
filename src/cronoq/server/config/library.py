"""The configuration as the library's types: `library_pools` and `library_resources` build the
server's Scheduler; `core_pools` and `core_resources` are the engine's view of them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NoReturn

from cronoq._options import AutoscaleConfig, Pool, Resource
from cronoq.core.model import PoolConfig, RetryPolicy
from cronoq.core.resources import ResourceConfig

from .settings import (
    PoolSettings,
    ResourceSettings,
    SemaphoreSettings,
    ServerConfig,
)

if TYPE_CHECKING:
    pass


def core_pools(cfg: ServerConfig) -> list[PoolConfig]:
    """The engine's view of each pool, built through the library's Pool.

    Capacity starts at 0: a server pool's capacity is the sum of the slots granted to its
    connected workers, which the runtime sets as they come and go. `min` and
    `max` stay the autoscaler's bounds even without autoscaling (a library pool without
    autoscaling is fixed at `max`), and the cost rate applies either way.
    """
    return [
        dataclasses.replace(
            pool.core_config(),
            capacity=0,
            min=p.min,
            max=p.max,
            cost_per_worker_second=p.cost_per_worker_second,
        )
        for p, pool in zip(_own_pools(cfg), library_pools(cfg), strict=True)
    ]


def core_resources(cfg: ServerConfig) -> list[ResourceConfig]:
    """The engine's view of each resource, built through the library's Resource."""
    return [r.core_config() for r in library_resources(cfg)]


def library_pools(cfg: ServerConfig) -> list[Pool]:
    """Each pool this server serves as the library's Pool, for a Scheduler whose attempts go to
    remote workers: with [[shards]], only its own shard's."""
    return [_library_pool(p) for p in _own_pools(cfg)]


def library_resources(cfg: ServerConfig) -> list[Resource]:
    """Each resource this server counts as the library's Resource: with [[shards]], only its
    own shard's (each shard counts its resources separately)."""
    own = cfg.own_shard
    return [_library_resource(r) for r in cfg.resources if own is None or r.shard == own.name]


def _own_pools(cfg: ServerConfig) -> list[PoolSettings]:
    """The configured pools of this server's shard, in the file's order; every pool without
    [[shards]]. Other shards' pools may be configured too (the same file for every shard),
    but their servers run them (docs/configuration.md, "[[shards]]")."""
    own = cfg.own_shard
    return [p for p in cfg.pools if own is None or p.name in own.pools]


def remote_executor(ctx: object, payload: object) -> NoReturn:
    """The executor of every server pool: attempts run on remote workers, never in-process."""
    raise RuntimeError("server pools run on remote workers")


class _ServerPool(Pool):
    """A server pool: its cost rate applies with or without autoscaling (docs/configuration.md,
    "The engine's view"). The library's Pool carries the rate only in its autoscaler settings
    and prices a pool without autoscaling at 0, which stays the library's behaviour."""

    __slots__ = ("_cost",)

    def __init__(self, *args: Any, cost_per_worker_second: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cost = cost_per_worker_second

    def core_config(self) -> PoolConfig:
        return dataclasses.replace(super().core_config(), cost_per_worker_second=self._cost)


def _library_pool(p: PoolSettings) -> Pool:
    retry = p.retry
    scaling = AutoscaleConfig(
        target_utilization=p.target_utilization,
        drain_time=p.drain_time_s,
        cooldown=p.cooldown_s,
        cost_per_worker_second=p.cost_per_worker_second,
    )
    waits = p.await_unknown_dependencies_s
    return _ServerPool(
        p.name,
        remote_executor,
        cost_per_worker_second=p.cost_per_worker_second,
        min=p.min,
        max=p.max,
        autoscale=scaling if p.autoscale else False,
        lease_ttl=p.lease_ttl_s,
        max_pending=p.max_pending,
        overflow=p.overflow,
        retry=RetryPolicy(
            retry.max_attempts,
            retry.initial_backoff_s,
            retry.multiplier,
            retry.max_backoff_s,
            retry.jitter,
        ),
        unknown_dependency="reject" if waits is None else "await",
        await_timeout=waits,
        default_duration=p.default_duration_s,
        reservable_fraction=p.reservable_fraction,
        tenant_weights=p.tenant_weights,
        fair_share=p.fair_share,
    )


def _library_resource(r: ResourceSettings) -> Resource:
    if isinstance(r, SemaphoreSettings):
        return Resource.semaphore(r.name, r.permits)
    return Resource.token_bucket(r.name, r.rate, r.burst)
