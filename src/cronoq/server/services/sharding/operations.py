"""`cronoq.v1.Operations` across shards: pool controls go to the pool's shard, searches and bulk
actions ask every shard with a pool the filter covers and add up (docs/server-api.md,
"Operations")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

# Untyped for mypy, as in fronts/routes.py.
from google.protobuf.message import Message  # type: ignore[import-untyped]

from ....proto.cronoq.v1 import cronoq_pb2 as pb
from ....proto.cronoq.v1 import cronoq_pb2_grpc
from ...auth import current_principal
from ..operations import OperationsService, info_key
from ..tasks import DEFAULT_PAGE
from .peers import Context
from .routed import Router, _routed, _unavailable

__all__ = ["ShardedOperations"]

_O = "/cronoq.v1.Operations/"
_Q = TypeVar("_Q", pb.SearchTasksRequest, pb.BulkRequest)
_M = TypeVar("_M", bound=Message)


class ShardedOperations(cronoq_pb2_grpc.OperationsServicer):
    """PausePool and ResumePool are forwarded to the pool's shard like a submit. SearchTasks asks
    each shard for its first `offset + limit` matches (each shard caps that at its
    `limits.max_list`), merges them in the order asked and cuts the page; `total` is the sum.
    BulkTasks runs on each shard at once and adds the counts. A shard that could not be asked
    is named in `unavailable_shards`."""

    def __init__(self, local: OperationsService, router: Router) -> None:
        self._local = local
        self._r = router

    async def _pool(
        self,
        method: str,
        request: pb.PoolRequest,
        context: Context,
        local: Callable[[pb.PoolRequest, Context], Awaitable[pb.PoolControlResponse]],
    ) -> pb.PoolControlResponse:
        shard = self._r.plan.by_pool.get(request.pool)
        if shard is None or shard is self._r.plan.own:
            return await local(request, context)
        what = f"pool '{request.pool}'"
        return await self._r.forward(
            shard, what, _O + method, request, pb.PoolControlResponse, context
        )

    @_routed
    async def PausePool(self, request: pb.PoolRequest, context: Context) -> pb.PoolControlResponse:
        return await self._pool("PausePool", request, context, self._local.PausePool)

    @_routed
    async def ResumePool(self, request: pb.PoolRequest, context: Context) -> pb.PoolControlResponse:
        return await self._pool("ResumePool", request, context, self._local.ResumePool)

    async def _everywhere(
        self,
        method: str,
        request: _Q,
        reply: type[_M],
        context: Context,
        local: Callable[[_Q, Context], Awaitable[_M]],
        adapt: Callable[[_Q], None] = lambda _: None,
    ) -> tuple[list[_M], list[str]] | None:
        """Each shard's reply to `request` narrowed to its pools (`adapt` changes the rest),
        and the shards that could not be asked; None when the own shard answers alone."""
        parts = self._r.split(request.filter.pools, current_principal(), context)
        if parts is None:
            return None
        requests: dict[str, Any] = {}
        for name, pools in parts.items():
            part = type(request)()
            part.CopyFrom(request)
            del part.filter.pools[:]
            part.filter.pools.extend(pools)
            adapt(part)
            requests[name] = part
        own = requests.pop(self._r.plan.own.name, None)
        remote = self._r.gather(requests, _O + method, reply, context)
        mine: list[_M] = []
        replies: dict[str, _M | None]
        missing: list[str]
        if own is None:
            replies, missing = await remote
        else:
            first, (replies, missing) = await asyncio.gather(local(own, context), remote)
            mine.append(first)
        return [*mine, *(r for r in replies.values() if r is not None)], missing

    @_routed
    async def SearchTasks(
        self, request: pb.SearchTasksRequest, context: Context
    ) -> pb.SearchTasksResponse:
        limit = min(request.limit or DEFAULT_PAGE, self._r.limits.max_list)
        offset = request.offset

        def first_matches(part: pb.SearchTasksRequest) -> None:
            part.offset = 0
            part.limit = min(offset + limit, self._r.limits.max_list)

        got = await self._everywhere(
            "SearchTasks",
            request,
            pb.SearchTasksResponse,
            context,
            self._local.SearchTasks,
            first_matches,
        )
        if got is None:
            return await self._local.SearchTasks(request, context)
        pages, missing = got
        rows = sorted(
            (t for page in pages for t in page.tasks),
            key=info_key(request.sort),
            reverse=not request.ascending,
        )
        missing.extend(n for page in pages for n in page.unavailable_shards)
        return pb.SearchTasksResponse(
            tasks=rows[offset : offset + limit],
            total=sum(page.total for page in pages),
            unavailable_shards=_unavailable(missing),
        )

    @_routed
    async def BulkTasks(self, request: pb.BulkRequest, context: Context) -> pb.BulkResponse:
        got = await self._everywhere(
            "BulkTasks", request, pb.BulkResponse, context, self._local.BulkTasks
        )
        if got is None:
            return await self._local.BulkTasks(request, context)
        parts, missing = got
        missing.extend(n for p in parts for n in p.unavailable_shards)
        return pb.BulkResponse(
            matched=sum(p.matched for p in parts),
            affected=sum(p.affected for p in parts),
            unavailable_shards=_unavailable(missing),
        )
