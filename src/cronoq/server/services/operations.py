"""The gRPC service `cronoq.v1.Operations` (docs/server-api.md, "Operations"): an operator's
controls over a running `cronoq.Scheduler`, an addition to the published protocol.

PausePool and ResumePool go through the Scheduler (durable before they answer when there is a
store). SearchTasks reads the engine (core/search.py) and answers as ListTasks does, scoped to
the caller's pools and capped at `limits.max_list`. BulkTasks matches the filter once, then acts
in chunks of at most BULK_CHUNK ids, giving the event loop back between chunks so that the other
pools keep being served; each chunk is checked again when its turn comes, since its tasks may
have moved on meanwhile. Every pause, resume and bulk action is logged with who asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from cronoq.core.engine import Engine
from cronoq.core.model import FIRST_TERMINAL, SUCCEEDED, TaskRecord
from cronoq.core.search import TaskFilter, matching_ids, search
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server import convert
from cronoq.server.auth import Principal, current_principal
from cronoq.server.logs import event

from .tasks import (
    DEFAULT_PAGE,
    Context,
    ServiceBase,
    check_pool,
    known_pools,
    pool_filter,
    rpc_errors,
)

__all__ = ["BULK_CHUNK", "OperationsService", "info_key"]

log = logging.getLogger("cronoq.server")

# The most ids one step of a bulk action hands the Scheduler (one store write each).
BULK_CHUNK = 500

_ACTIONS = {
    pb.BULK_ACTION_CANCEL: "cancel",
    pb.BULK_ACTION_RETRY: "retry",
    pb.BULK_ACTION_DELETE: "delete",
}


def _live(rec: TaskRecord) -> bool:
    return rec.status < FIRST_TERMINAL


def _retryable(rec: TaskRecord) -> bool:
    return rec.status >= FIRST_TERMINAL and rec.status != SUCCEEDED


def _ended(rec: TaskRecord) -> bool:
    return rec.status >= FIRST_TERMINAL


# Which matching tasks each action applies to (the Scheduler skips the others alike).
_APPLIES: dict[str, Callable[[TaskRecord], bool]] = {
    "cancel": _live,
    "retry": _retryable,
    "delete": _ended,
}


# core/search.py's orders over the TaskInfo each shard answers, to merge their pages alike.
_INFO_KEYS: dict[int, Callable[[pb.TaskInfo], tuple[Any, int]]] = {
    pb.TASK_SORT_UNSPECIFIED: lambda t: (t.id, 0),
    pb.TASK_SORT_ID: lambda t: (t.id, 0),
    pb.TASK_SORT_STATUS: lambda t: (t.status, t.id),
    pb.TASK_SORT_POOL: lambda t: (t.pool, t.id),
    pb.TASK_SORT_KIND: lambda t: (t.kind, t.id),
    pb.TASK_SORT_PRIORITY: lambda t: (-t.priority, t.id),
    pb.TASK_SORT_SUBMITTED: lambda t: (t.created_unix_ns, t.id),
    pb.TASK_SORT_STARTED: lambda t: (t.started_unix_ns or t.created_unix_ns, t.id),
    pb.TASK_SORT_FINISHED: lambda t: (t.finished_unix_ns, t.id),
    pb.TASK_SORT_ATTEMPT: lambda t: (t.attempt, t.id),
}


def info_key(sort: int) -> Callable[[pb.TaskInfo], tuple[Any, int]]:
    """The order of a TaskSort over TaskInfo messages (the sort was checked by the shards)."""
    return _INFO_KEYS.get(sort, _INFO_KEYS[pb.TASK_SORT_ID])


def _who(caller: Principal) -> dict[str, Any]:
    """The caller as a log line names it: its role, what it is narrowed to, and the first
    hex digits of its token's SHA-256 (the digest `[[auth.tokens]]` keeps), never the token."""
    out: dict[str, Any] = {"role": caller.role}
    if caller.bearer is not None:
        out["token_sha256"] = hashlib.sha256(caller.bearer.encode()).hexdigest()[:12]
    if caller.pools is not None:
        out["caller_pools"] = ",".join(sorted(caller.pools))
    if caller.tenant is not None:
        out["tenant"] = caller.tenant
    return out


def _describe(flt: TaskFilter) -> str:
    """The filter's set fields, for the log line."""
    parts = []
    for f in dataclasses.fields(flt):
        value = getattr(flt, f.name)
        if value is None or (not value and f.name != "pools"):
            continue
        if isinstance(value, frozenset):
            value = sorted(value)
        elif not isinstance(value, (str, float)):
            value = dict(value)
        parts.append(f"{f.name}={value}")
    return " ".join(parts) or "all"


class OperationsService(ServiceBase, cronoq_pb2_grpc.OperationsServicer):
    """`cronoq.v1.Operations`. Its roles are in auth.py: admin, SearchTasks also client."""

    def _filter(self, engine: Engine, msg: pb.TaskFilter) -> TaskFilter:
        """The request's filter narrowed to the pools the caller may see (naming another is
        PERMISSION_DENIED, an unknown one NOT_FOUND, as in ListTasks)."""
        flt = convert.task_filter(msg, self._limits)
        named = set(flt.pools or ())
        pools = pool_filter(named, current_principal())
        known_pools(named, engine.configs.keys())
        return dataclasses.replace(flt, pools=None if pools is None else frozenset(pools))

    async def _control(self, request: pb.PoolRequest, pause: bool) -> pb.PoolControlResponse:
        self._engine()
        if not request.pool:
            raise convert.InvalidArgument("pool", "required")
        pool = convert.check_name("pool", request.pool)
        caller = current_principal()
        check_pool(pool, "pool", caller)
        if pause:
            changed = await self._sched.pause(pool)
        else:
            changed = await self._sched.resume(pool)
        action = "pause" if pause else "resume"
        event(log, logging.INFO, f"pool_{action}", pool=pool, changed=changed, **_who(caller))
        return pb.PoolControlResponse(pool=pool, paused=pause, changed=changed)

    @rpc_errors
    async def PausePool(self, request: pb.PoolRequest, context: Context) -> pb.PoolControlResponse:
        return await self._control(request, pause=True)

    @rpc_errors
    async def ResumePool(self, request: pb.PoolRequest, context: Context) -> pb.PoolControlResponse:
        return await self._control(request, pause=False)

    @rpc_errors
    async def SearchTasks(
        self, request: pb.SearchTasksRequest, context: Context
    ) -> pb.SearchTasksResponse:
        engine = self._engine()
        flt = self._filter(engine, request.filter)
        sort = convert.sort_from_pb(request.sort)
        limit = min(request.limit or DEFAULT_PAGE, self._limits.max_list)
        page, total = search(engine, flt, sort, request.ascending, limit, request.offset)
        retry = self._pool_retry(engine)
        return pb.SearchTasksResponse(
            tasks=[convert.task_info(rec, retry.get(rec.pool)) for rec in page], total=total
        )

    @rpc_errors
    async def BulkTasks(self, request: pb.BulkRequest, context: Context) -> pb.BulkResponse:
        engine = self._engine()
        action = _ACTIONS.get(request.action)
        if action is None:
            raise convert.InvalidArgument("action", "must be cancel, retry or delete")
        flt = self._filter(engine, request.filter)
        ids = matching_ids(engine, flt)
        applies = _APPLIES[action]
        if request.dry_run:
            tasks = engine.tasks
            affected = sum(1 for i in ids if applies(tasks[i]))
        else:
            affected = await self._act(action, ids, flt, applies)
        event(
            log,
            logging.INFO,
            "bulk_tasks",
            action=action,
            dry_run=request.dry_run,
            filter=_describe(flt),
            matched=len(ids),
            affected=affected,
            **_who(current_principal()),
        )
        return pb.BulkResponse(matched=len(ids), affected=affected)

    async def _act(
        self,
        action: str,
        ids: Sequence[int],
        flt: TaskFilter,
        applies: Callable[[TaskRecord], bool],
    ) -> int:
        """`action` on the tasks of `ids` that still match and to which it still applies, a
        chunk at a time, the event loop given back after each; how many it was applied to."""
        match = flt.compile()
        done = 0
        for start in range(0, len(ids), BULK_CHUNK):
            if start:
                await asyncio.sleep(0)  # let dispatch and other calls run between chunks
            engine = self._engine()
            chunk = []
            for task_id in ids[start : start + BULK_CHUNK]:
                rec = engine.lookup(task_id)
                if rec is not None and applies(rec) and (match is None or match(rec)):
                    chunk.append(task_id)
            if not chunk:
                continue
            if action == "cancel":
                done += await self._sched.cancel_many(chunk)
            elif action == "retry":
                done += len(await self._sched.resubmit(chunk))
            else:
                done += await self._sched.delete(chunk)
        return done
