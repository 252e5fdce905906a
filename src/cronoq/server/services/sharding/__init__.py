"""Sharding (docs/sharding.md): the plan's maps (`plan`), the channels to the other shards
(`peers`), and the servicers that route each call (`routed`).

`ShardedTasks` and `ShardedAdmin` wrap the servicers of tasks.py (`ShardedOperations` that
of operations.py), which know only the own
shard. A call for the own shard goes to them unchanged (the unsharded path, and its cost); a
call for another shard is forwarded to that shard's endpoint with the caller's own credentials
and `cronoq-forwarded: 1`, or refused with the shard's name and endpoint when it may not be
(docs/sharding.md, "Forwarding"). Lookups by key ask every shard; listings, Snapshot and Watch
gather every shard and merge. A call carrying `cronoq-forwarded` is always answered by the own
shard alone, so calls never loop.

Checks come in the order of docs/sharding.md, "Order of checks": the interceptors have
authenticated the caller, checked its role and that this server serves; here the pool
permission comes before any routing, so that a token refused a pool never learns where it
lives, then the rules across shards (dependencies, resources, batches), then the route.
"""

from .operations import ShardedOperations
from .peers import CONNECT_S, Peers
from .plan import ENDPOINT_KEY, FORWARDED, SHARD_KEY, UNAVAILABLE_KEY, ShardPlan
from .routed import Router, ShardedAdmin, ShardedTasks

__all__ = [
    "CONNECT_S",
    "ENDPOINT_KEY",
    "FORWARDED",
    "SHARD_KEY",
    "UNAVAILABLE_KEY",
    "Peers",
    "Router",
    "ShardPlan",
    "ShardedAdmin",
    "ShardedOperations",
    "ShardedTasks",
]
