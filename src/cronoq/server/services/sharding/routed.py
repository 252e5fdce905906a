"""The servicers that route each call between shards (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc

# Untyped for mypy, as in fronts/routes.py.
from google.protobuf.message import Message  # type: ignore[import-untyped]

from ....proto.cronoq.v1 import cronoq_pb2 as pb
from ....proto.cronoq.v1 import cronoq_pb2_grpc
from ... import convert
from ...auth import Principal, current_principal
from ...config import LimitsSettings, ShardSettings
from ...convert import InvalidArgument
from ...errors import Refused
from ...holds import exempt_request
from ..tasks import (
    DEFAULT_PAGE,
    DEFAULT_POOL,
    AdminService,
    TasksService,
    check_pool,
    known_pools,
    pool_filter,
)
from .peers import Context, Peers
from .plan import ENDPOINT_KEY, FORWARDED, SHARD_KEY, UNAVAILABLE_KEY, ShardPlan

__all__ = ["Router", "ShardedAdmin", "ShardedTasks"]

_M = TypeVar("_M", bound=Message)
_R = TypeVar("_R", pb.GetRequest, pb.WaitRequest, pb.CancelRequest)

# What a gathered part may fail with and still leave the call served, the shard named in
# `unavailable_shards`: unreachable, not forwardable for this caller, or too slow.
_MISSING = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
# A gathered part's share of the call's own bound (limits.request_timeout_s), so that a shard
# that does not answer is named in time rather than failing the whole call.
GATHER_SHARE = 0.5

_T = "/cronoq.v1.Tasks/"
_A = "/cronoq.v1.Admin/"


def _forwarded(context: Context) -> bool:
    return any(k == FORWARDED for k, _ in context.invocation_metadata() or ())


def _unavailable(names: Iterable[str]) -> list[str]:
    return sorted(set(names))


def _routed(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """End a routed unary call that raised Refused or InvalidArgument with its status (the
    local servicers end their own calls)."""

    @functools.wraps(fn)
    async def call(self: Any, request: Any, context: Context) -> Any:
        try:
            return await fn(self, request, context)
        except (Refused, InvalidArgument) as e:
            await _abort(context, e)

    return call


async def _abort(context: Context, e: Refused | InvalidArgument) -> NoReturn:
    if isinstance(e, InvalidArgument):
        e = Refused(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    await context.abort(e.code, e.message, trailing_metadata=e.trailers)


class Router:
    """The routing decisions both services share."""

    def __init__(self, plan: ShardPlan, peers: Peers, limits: LimitsSettings) -> None:
        self.plan = plan
        self.peers = peers
        self.limits = limits
        self.by_name = {s.name: s for s in plan.shards}

    def wrap(self, tasks: TasksService, admin: AdminService) -> tuple[ShardedTasks, ShardedAdmin]:
        """The servicers that route calls around the own shard's `tasks` and `admin`."""
        return ShardedTasks(tasks, self), ShardedAdmin(admin, self)

    def pool_elsewhere(self, pool: str) -> Refused | None:
        """A worker's Register for another shard's pool: refused with where to go (workers
        are never proxied)."""
        shard = self.plan.by_pool.get(pool)
        if shard is None or shard is self.plan.own:
            return None
        return self.refusal(f"pool '{pool}'", shard)

    def refusal(self, what: str, shard: ShardSettings) -> Refused:
        """FAILED_PRECONDITION naming where `what` is served (docs/sharding.md,
        "Refusals"): workers and clients read the trailers."""
        return Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{what} is served by shard '{shard.name}' at {shard.endpoint}",
            ((SHARD_KEY, shard.name), (ENDPOINT_KEY, shard.endpoint)),
        )

    def task_shard(self, field: str, spec: pb.TaskSpec, caller: Principal) -> ShardSettings:
        """The shard of a task, after the caller's permission for its pool and the rules
        across shards. A pool no shard serves is the own shard's (which refuses it)."""
        pool = spec.pool or DEFAULT_POOL
        shard = self.plan.by_pool.get(pool)
        if shard is None:
            return self.plan.own
        check_pool(pool, f"{field}.pool", caller)
        for j, dep in enumerate(spec.deps):
            if dep.target.WhichOneof("target") != "id":
                continue  # a key is resolved in the task's own shard
            other = self.plan.of_id(dep.target.id)
            if other is not None and other is not shard:
                raise InvalidArgument(
                    f"{field}.deps[{j}]",
                    f"task {dep.target.id} is in shard '{other.name}' and this task in shard"
                    f" '{shard.name}': dependencies across shards are not supported",
                )
        for name in sorted(spec.resources):
            other = self.plan.by_resource.get(name)
            if other is not None and other is not shard:
                raise InvalidArgument(
                    f"{field}.resources",
                    f"resource '{name}' belongs to shard '{other.name}', not to shard"
                    f" '{shard.name}' of pool '{pool}': resources are never forwarded",
                )
        return shard

    async def forward(
        self,
        shard: ShardSettings,
        what: str,
        method: str,
        request: Message,
        reply: type[_M],
        context: Context,
    ) -> _M:
        """Send the call to `shard`, or refuse it: a forwarded call is not forwarded again,
        and a caller whose credential may not go there is told where to go."""
        caller = current_principal()
        if _forwarded(context) or not self.peers.may_forward(caller, shard):
            raise self.refusal(what, shard)
        exempt_request()  # the peer's bound applies (Peers._timeout), not this server's
        return await self.peers.call(shard, method, request, reply, caller, context)

    def asked(self, caller: Principal) -> list[ShardSettings]:
        """The other shards a gathering call asks: those with a pool the caller may see."""
        return [s for s in self.plan.others if self.plan.pools_of(s, caller)]

    def split(
        self, pools: Sequence[str], caller: Principal, context: Context
    ) -> dict[str, list[str]] | None:
        """A filter's pools by shard name (an empty list: every pool the caller may see
        there), after the caller's permission (and NOT_FOUND for a pool no shard serves);
        None when only the own shard answers (a forwarded call)."""
        if _forwarded(context):
            return None
        named = {convert.check_name(f"pools[{i}]", p) for i, p in enumerate(pools)}
        pool_filter(named, caller)
        known_pools(named, self.plan.by_pool)
        if not pools:
            parts: dict[str, list[str]] = {self.plan.own.name: []}
            parts.update((s.name, []) for s in self.asked(caller))
            return parts
        parts = {}
        for p in pools:
            parts.setdefault(self.plan.by_pool[p].name, []).append(p)
        return parts

    async def gather(
        self,
        requests: Mapping[str, Message],
        method: str,
        reply: type[_M],
        context: Context,
        *,
        absent: frozenset[grpc.StatusCode] = frozenset(),
    ) -> tuple[dict[str, _M | None], list[str]]:
        """Ask each shard named in `requests` at once: the replies by shard name (None for a
        reply whose error is in `absent`, NOT_FOUND for a lookup), and the shards that
        could not be asked, or did not answer within GATHER_SHARE of limits.request_timeout_s
        (a paused or overloaded shard is named, and the call still answers in time). Any other
        error fails the call."""
        caller = current_principal()
        by_name = self.by_name
        missing: list[str] = []
        names: list[str] = []
        calls = []
        for name, request in requests.items():
            shard = by_name[name]
            if not self.peers.may_forward(caller, shard):
                missing.append(name)
                continue
            names.append(name)
            bound = self.limits.request_timeout_s * GATHER_SHARE
            calls.append(
                self.peers.call(shard, method, request, reply, caller, context, bound=bound)
            )
        replies: dict[str, _M | None] = {}
        results = await asyncio.gather(*calls, return_exceptions=True)
        for name, result in zip(names, results, strict=True):
            if isinstance(result, Refused) and result.code in _MISSING:
                missing.append(name)
            elif isinstance(result, Refused) and result.code in absent:
                replies[name] = None
            elif isinstance(result, BaseException):
                raise result
            else:
                replies[name] = result
        return replies, missing


class ShardedTasks(cronoq_pb2_grpc.TasksServicer):
    """`cronoq.v1.Tasks` across shards (docs/sharding.md, "Forwarding")."""

    def __init__(self, local: TasksService, router: Router) -> None:
        self._local = local
        self._r = router

    @_routed
    async def Submit(self, request: pb.SubmitRequest, context: Context) -> pb.SubmitResponse:
        if request.HasField("task"):
            shard = self._r.task_shard("task", request.task, current_principal())
            if shard is not self._r.plan.own:
                what = f"pool '{request.task.pool or DEFAULT_POOL}'"
                return await self._r.forward(
                    shard, what, _T + "Submit", request, pb.SubmitResponse, context
                )
        return await self._local.Submit(request, context)

    @_routed
    async def SubmitBatch(
        self, request: pb.SubmitBatchRequest, context: Context
    ) -> pb.SubmitBatchResponse:
        tasks = request.tasks
        if tasks and len(tasks) <= self._r.limits.max_tasks_per_batch:
            caller = current_principal()
            first: tuple[int, ShardSettings] | None = None
            for i, spec in enumerate(tasks):
                shard = self._r.task_shard(f"tasks[{i}]", spec, caller)
                if first is None:
                    first = (i, shard)
                elif shard is not first[1]:
                    raise InvalidArgument(
                        "tasks",
                        f"a batch is admitted by one shard: tasks[{first[0]}] is for shard"
                        f" '{first[1].name}' and tasks[{i}] for shard '{shard.name}'",
                    )
            assert first is not None
            if first[1] is not self._r.plan.own:
                what = f"pool '{tasks[0].pool or DEFAULT_POOL}'"
                return await self._r.forward(
                    first[1], what, _T + "SubmitBatch", request, pb.SubmitBatchResponse, context
                )
        return await self._local.SubmitBatch(request, context)

    async def _route(
        self, method: str, request: _R, reply: type[_M], context: Context
    ) -> tuple[_M | None, _R]:
        """A call naming one task (Get, Wait, Cancel): the reply of the shard it went to, or
        None and the request for the own shard (by id once a key was found here).

        By id, the id's shard answers. By key, every shard is asked where the key is
        (docs/sharding.md, "Keys across shards"); the call then goes there by id. Cancel
        changes a task, so it never goes ahead while a shard could not be asked."""
        ref: pb.TaskRef = request.task
        if ref.WhichOneof("target") == "id":
            shard = self._r.plan.of_id(ref.id)
            if shard is None or shard is self._r.plan.own:
                return None, request
            what = f"task {ref.id}"
            return await self._r.forward(shard, what, method, request, reply, context), request
        found = await self._by_key(ref, context)
        if found is None:
            return None, request
        if found.missing and method.endswith("/Cancel"):
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"key '{found.key}' cannot be changed by key: shards"
                f" {', '.join(found.missing)} could not be asked; use the task id",
            )
        await found.readable(context)
        by_id = type(request)()
        by_id.CopyFrom(request)
        if found.remote is not None:
            shard, info = found.remote
            by_id.task.CopyFrom(pb.TaskRef(id=info.id))
            what = f"task {info.id}"
            return await self._r.forward(shard, what, method, by_id, reply, context), by_id
        if found.local is not None:
            by_id.task.CopyFrom(pb.TaskRef(id=found.local))
        return None, by_id

    async def _by_key(self, ref: pb.TaskRef, context: Context) -> _Found | None:
        """Where a key names a task (docs/sharding.md, "Keys across shards"); None when the
        call is the own shard's alone (forwarded, or no key)."""
        if ref.WhichOneof("target") != "key" or _forwarded(context) or not ref.key:
            return None
        caller = current_principal()
        rec = self._local.visible(ref)
        requests = {s.name: pb.GetRequest(task=ref) for s in self._r.asked(caller)}
        replies, missing = await self._r.gather(
            requests,
            _T + "Get",
            pb.TaskInfo,
            context,
            absent=frozenset({grpc.StatusCode.NOT_FOUND}),
        )
        remote = [(name, info) for name, info in replies.items() if info is not None]
        names = sorted(
            [name for name, _ in remote] + ([] if rec is None else [self._r.plan.own.name])
        )
        if len(names) > 1:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"key '{ref.key}' names tasks in shards {', '.join(names)}: use the task id",
            )
        there = None
        if remote:
            name, info = remote[0]
            there = (self._r.by_name[name], info)
        return _Found(ref.key, None if rec is None else rec.id, there, _unavailable(missing))

    @_routed
    async def Cancel(self, request: pb.CancelRequest, context: Context) -> pb.CancelResponse:
        done, request = await self._route(_T + "Cancel", request, pb.CancelResponse, context)
        return done if done is not None else await self._local.Cancel(request, context)

    @_routed
    async def Get(self, request: pb.GetRequest, context: Context) -> pb.TaskInfo:
        done, request = await self._route(_T + "Get", request, pb.TaskInfo, context)
        return done if done is not None else await self._local.Get(request, context)

    @_routed
    async def Wait(self, request: pb.WaitRequest, context: Context) -> pb.TaskResult:
        done, request = await self._route(_T + "Wait", request, pb.TaskResult, context)
        return done if done is not None else await self._local.Wait(request, context)

    @_routed
    async def ListTasks(
        self, request: pb.ListTasksRequest, context: Context
    ) -> pb.ListTasksResponse:
        """Each shard's page after `after`, merged in id order and cut to the limit
        (docs/sharding.md, "Merged listings")."""
        parts = self._r.split(request.pools, current_principal(), context)
        if parts is None:
            return await self._local.ListTasks(request, context)
        limit = min(request.limit or DEFAULT_PAGE, self._r.limits.max_list)

        def part(pools: list[str]) -> pb.ListTasksRequest:
            return pb.ListTasksRequest(
                pools=pools, statuses=request.statuses, after=request.after, limit=limit
            )

        own = self._r.plan.own.name
        local_pools = parts.pop(own, None)
        remote = self._r.gather(
            {name: part(pools) for name, pools in parts.items()},
            _T + "ListTasks",
            pb.ListTasksResponse,
            context,
        )
        if local_pools is None:
            replies, missing = await remote
            pages = list(replies.values())
        else:
            mine, (replies, missing) = await asyncio.gather(
                self._local.ListTasks(part(local_pools), context), remote
            )
            pages = [mine, *replies.values()]
        rows = sorted((t for page in pages if page for t in page.tasks), key=lambda t: t.id)
        more = len(rows) > limit or any(page.next_after for page in pages if page)
        del rows[limit:]
        missing.extend(n for page in pages if page for n in page.unavailable_shards)
        return pb.ListTasksResponse(
            tasks=rows,
            next_after=rows[-1].id if more and rows else 0,
            unavailable_shards=_unavailable(missing),
        )

    async def Watch(
        self, request: pb.WatchRequest, context: Context
    ) -> AsyncIterator[pb.StatusEvent]:
        """The own shard's events and every other shard's, on one stream (docs/sharding.md,
        "Watch across shards"); the first part to fail ends it."""
        caller = current_principal()
        try:
            parts = self._r.split(request.pools, caller, context)
        except (Refused, InvalidArgument) as e:
            await _abort(context, e)
        if parts is None:
            async with contextlib.aclosing(self._local.Watch(request, context)) as events:
                async for ev in events:
                    yield ev
            return
        sources: list[AsyncGenerator[pb.StatusEvent, None]] = []
        by_name = self._r.by_name
        for name, pools in parts.items():
            part = pb.WatchRequest()
            part.CopyFrom(request)
            part.ClearField("pools")
            part.pools.extend(pools)
            if name == self._r.plan.own.name:
                sources.append(self._local.Watch(part, context))
            elif self._r.peers.may_forward(caller, by_name[name]):
                sources.append(
                    self._r.peers.stream(
                        by_name[name], _T + "Watch", part, pb.StatusEvent, caller, context
                    )
                )
        if not sources:  # only pools of shards this caller's credential may not go to
            name, pools = next(iter(parts.items()))
            await _abort(context, self._r.refusal(f"pool '{pools[0]}'", by_name[name]))
        queue: asyncio.Queue[pb.StatusEvent | BaseException] = asyncio.Queue()

        async def pump(source: AsyncGenerator[pb.StatusEvent, None]) -> None:
            try:
                async with contextlib.aclosing(source):
                    async for ev in source:
                        queue.put_nowait(ev)
            except BaseException as e:  # the merged stream ends with it
                queue.put_nowait(e)
                if isinstance(e, asyncio.CancelledError):
                    raise

        pumps = [asyncio.ensure_future(pump(s)) for s in sources]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Refused):
                    await _abort(context, item)
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)


@dataclass
class _Found:
    """Where a key names a task the caller may see: the own shard's id, or another shard and
    the TaskInfo it answered (at most one of them); the shards that could not be asked."""

    key: str
    local: int | None
    remote: tuple[ShardSettings, pb.TaskInfo] | None
    missing: list[str]

    async def readable(self, context: Context) -> None:
        """Get and Wait: a key found with shards missing is still an answer, which says
        which shards were not asked; not found anywhere that answered, UNAVAILABLE."""
        if not self.missing:
            return
        names = ", ".join(self.missing)
        if self.local is None and self.remote is None:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"key '{self.key}' is not in the shards that answered ({names} could not be asked)",
            )
        await context.send_initial_metadata(((UNAVAILABLE_KEY, ",".join(self.missing)),))


class ShardedAdmin(cronoq_pb2_grpc.AdminServicer):
    """`cronoq.v1.Admin` across shards (docs/sharding.md, "Merged listings")."""

    def __init__(self, local: AdminService, router: Router) -> None:
        self._local = local
        self._r = router

    async def _everywhere(
        self, method: str, local: Callable[[], Awaitable[_M]], reply: type[_M], context: Context
    ) -> tuple[list[_M], list[str]]:
        """The own shard's reply and every other shard's the caller may see; the shards
        that could not be asked (and those the replies name)."""
        if _forwarded(context):
            return [await local()], []
        caller = current_principal()
        requests = {s.name: pb.Empty() for s in self._r.asked(caller)}
        mine, (replies, missing) = await asyncio.gather(
            local(), self._r.gather(requests, method, reply, context)
        )
        parts = [mine, *(r for r in replies.values() if r is not None)]
        missing.extend(n for p in parts for n in p.unavailable_shards)
        return parts, missing

    @_routed
    async def Snapshot(self, request: pb.Empty, context: Context) -> pb.SnapshotResponse:
        """Each shard's own pools, one after the other, and the sums of the counts."""
        parts, missing = await self._everywhere(
            _A + "Snapshot",
            lambda: self._local.Snapshot(request, context),
            pb.SnapshotResponse,
            context,
        )
        out = pb.SnapshotResponse()
        for snap in parts:
            out.pools.extend(snap.pools)
            out.live_tasks += snap.live_tasks
            out.running += snap.running
            out.pending += snap.pending
            out.workers_connected += snap.workers_connected
            for f in pb.Totals.DESCRIPTOR.fields:
                setattr(
                    out.totals, f.name, getattr(out.totals, f.name) + getattr(snap.totals, f.name)
                )
        out.unavailable_shards.extend(_unavailable(missing))
        return out

    @_routed
    async def ListWorkers(self, request: pb.Empty, context: Context) -> pb.ListWorkersResponse:
        parts, missing = await self._everywhere(
            _A + "ListWorkers",
            lambda: self._local.ListWorkers(request, context),
            pb.ListWorkersResponse,
            context,
        )
        return pb.ListWorkersResponse(
            workers=[w for p in parts for w in p.workers], unavailable_shards=_unavailable(missing)
        )

    @_routed
    async def ListRecurring(self, request: pb.Empty, context: Context) -> pb.ListRecurringResponse:
        parts, missing = await self._everywhere(
            _A + "ListRecurring",
            lambda: self._local.ListRecurring(request, context),
            pb.ListRecurringResponse,
            context,
        )
        schedules = sorted((s for p in parts for s in p.schedules), key=lambda s: s.name)
        return pb.ListRecurringResponse(
            schedules=schedules, unavailable_shards=_unavailable(missing)
        )

    @_routed
    async def AddRecurring(self, request: pb.RecurringRequest, context: Context) -> pb.Empty:
        shard = self._r.task_shard("template", request.template, current_principal())
        if shard is not self._r.plan.own:
            pool = request.template.pool or DEFAULT_POOL
            return await self._r.forward(
                shard, f"pool '{pool}'", _A + "AddRecurring", request, pb.Empty, context
            )
        return await self._local.AddRecurring(request, context)

    @_routed
    async def RemoveRecurring(
        self, request: pb.RemoveRecurringRequest, context: Context
    ) -> pb.RemoveRecurringResponse:
        """The own shard first, then every other: removed if any shard removed it."""
        mine = await self._local.RemoveRecurring(request, context)
        if _forwarded(context):
            return mine
        caller = current_principal()
        requests = {s.name: request for s in self._r.asked(caller)}
        replies, missing = await self._r.gather(
            requests, _A + "RemoveRecurring", pb.RemoveRecurringResponse, context
        )
        removed = mine.removed or any(r is not None and r.removed for r in replies.values())
        if not removed and missing:
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"schedule '{request.name}' was not removed: shards"
                f" {', '.join(_unavailable(missing))} could not be asked",
            )
        return pb.RemoveRecurringResponse(removed=removed)
