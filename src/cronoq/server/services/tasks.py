"""The gRPC services `cronoq.v1.Tasks` and `cronoq.v1.Admin` over a running `cronoq.Scheduler`.

Each RPC follows the check order of docs/server-api.md, "Check order" from step 3 on: is the
scheduler serving (else UNAVAILABLE), is the input valid (`convert`, INVALID_ARGUMENT), then
execute. Steps 1 and 2 (authentication, roles) and routing between shards belong to the layers that
wrap these servicers; every method receives the call's context, so an interceptor or a subclass can
add them without changing what is here. Errors leave through one table (`_status`):
docs/reference/errors.md, "gRPC status codes".

The caller (`auth.current_principal()`) scopes each call (docs/server.md, "Authentication"):
submitting to a pool it may not use is PERMISSION_DENIED, another pool's task is NOT_FOUND like a
missing one, and listings leave other pools out. A tenant-bound caller's tasks get its tenant.

Writes go through the Scheduler's public API (so a store acknowledges them); reads the API
lacks (listing, schedules, full task records) read the engine through `Scheduler.serving()`
and the engine's public read methods. All of it runs on the scheduler's event loop, so a check
followed by a call without an `await` in between cannot race.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from cronoq._attempt import TRACEPARENT
from cronoq._options import Task
from cronoq._tracing import ATTR_TASK_ID, TRACESTATE, copy_context
from cronoq.core.engine import Engine
from cronoq.core.model import FIRST_TERMINAL, TERMINAL_NAMES, RetryPolicy, TaskRecord
from cronoq.errors import EventsLagged, SchedulerError, SubmitError, TaskFailed
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.runtime import Scheduler, TaskHandle
from cronoq.server import convert
from cronoq.server.auth import Principal, current_principal
from cronoq.server.config import LimitsSettings
from cronoq.server.convert import InvalidArgument, TooLarge
from cronoq.server.errors import Refused
from cronoq.server.holds import Holds, exempt_request
from cronoq.server.tracing import ServerTracing

__all__ = ["AdminService", "TasksService", "check_pool", "known_pools", "pool_filter"]

log = logging.getLogger("cronoq.server")

Context = grpc.aio.ServicerContext[Any, Any]
DEFAULT_PAGE = 100  # ListTasks.limit 0 (the Python client's page size)

_S = TypeVar("_S")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

# The pool of a task or template that names none. Always this name, as clients expect: a
# server without a pool of that name refuses such a task (NOT_FOUND "unknown pool 'default'")
# rather than sending it to another pool, as the library's default pool would.
DEFAULT_POOL = "default"

_SUBMIT_CODES = {
    "unknown_pool": grpc.StatusCode.NOT_FOUND,
    "unknown_resource": grpc.StatusCode.NOT_FOUND,
    "unknown_dependency": grpc.StatusCode.NOT_FOUND,
    "full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "reservation_conflict": grpc.StatusCode.FAILED_PRECONDITION,
}


def _status(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code of an error raised while serving a call (docs/reference/errors.md)."""
    if isinstance(exc, Refused):
        return exc.code, exc.message
    if isinstance(exc, TooLarge):
        return grpc.StatusCode.OUT_OF_RANGE, str(exc)
    if isinstance(exc, SubmitError):
        return _SUBMIT_CODES.get(exc.code, grpc.StatusCode.INVALID_ARGUMENT), exc.message
    # Refusals of the library's own argument checks (after ours), e.g. an invalid retry policy.
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    # The scheduler is shutting down or lost its store (cron and zone errors, the other
    # SchedulerErrors, are caught by convert first).
    if isinstance(exc, SchedulerError):
        return grpc.StatusCode.UNAVAILABLE, exc.message
    log.exception("unexpected error serving a call", exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"


def rpc_errors(
    fn: Callable[[_S, _Req, Context], Awaitable[_Resp]],
) -> Callable[[_S, _Req, Context], Awaitable[_Resp]]:
    """End a unary call that raised with the status code of `_status`."""

    @functools.wraps(fn)
    async def call(self: _S, request: _Req, context: Context) -> _Resp:
        try:
            return await fn(self, request, context)
        except Exception as e:
            code, message = _status(e)
            await context.abort(code, message, trailing_metadata=getattr(e, "trailers", ()))

    return call


class ServiceBase:
    """What both services share: the scheduler, the limits and access to the engine."""

    def __init__(
        self, sched: Scheduler, limits: LimitsSettings, tracing: ServerTracing | None = None
    ) -> None:
        self._sched = sched
        self._limits = limits
        self._tracing = tracing

    def _engine(self) -> Engine:
        """The running engine, or UNAVAILABLE (not started, stopping, stopped, store lost)."""
        try:
            return self._sched.serving()
        except RuntimeError as e:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"scheduler not serving: {e}") from None
        except SchedulerError as e:
            message = "scheduler not serving"
            if str(e) != message:
                message = f"{message}: {e}"
            raise Refused(grpc.StatusCode.UNAVAILABLE, message) from None

    def _pool_retry(self, engine: Engine) -> dict[str, RetryPolicy]:
        return {name: cfg.retry for name, cfg in engine.configs.items()}

    def _specs(
        self, specs: Sequence[tuple[str, pb.TaskSpec]], trace: Mapping[str, str]
    ) -> list[tuple[bytes, dict[str, Any]]]:
        """Each (field name, TaskSpec) as submit()'s payload and options, the pool always
        named, the call's trace context (`trace_headers`) in the tags of those without one.
        The caller is looked up once."""
        caller = current_principal()
        out = []
        for field, spec in specs:
            payload, options = convert.spec_to_task(spec, self._limits, field=field)
            if trace:
                tags = options.get("tags") or {}
                if TRACEPARENT not in tags:
                    copy_context(trace, tags)
                options["tags"] = tags
            _scope(options, field, caller)
            out.append((payload, options))
        return out

    def _traced(
        self, trace: Mapping[str, str], tasks: list[dict[str, Any]]
    ) -> contextlib.AbstractContextManager[dict[str, Any]]:
        """The call's `cronoq.submit` span when the server traces (server/tracing.py), which
        yields its attributes; else a dict nobody reads."""
        if self._tracing is None:
            return contextlib.nullcontext({})
        return self._tracing.submit(trace, tasks)

    def _known_pools(self, engine: Engine, pools: set[str]) -> None:
        known_pools(pools, engine.configs.keys())


def check_pool(pool: str, field: str, caller: Principal) -> None:
    """PERMISSION_DENIED unless the caller may use `pool` (`field` names it in the request)."""
    if not caller.sees(pool):
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED, f"{field}: credentials do not allow pool {pool!r}"
        )


def _scope(options: dict[str, Any], field: str, caller: Principal) -> None:
    """The caller's pools and tenant applied to one task's options (docs/server.md,
    "Authentication"); a task without a pool gets DEFAULT_POOL."""
    pool = options.setdefault("pool", DEFAULT_POOL)
    check_pool(pool, f"{field}.pool", caller)
    if caller.tenant is not None:
        tenant = options.setdefault("tenant", caller.tenant)
        if tenant != caller.tenant:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{field}.tenant: you submit for tenant {caller.tenant!r} only",
            )


def pool_filter(pools: set[str], caller: Principal) -> set[str] | None:
    """A listing's `pools` filter for this caller: the pools to list, or None for every pool.
    An empty request filter means every pool the caller sees, and so none at all for a
    credential allowed no pool (`pools = []`); naming one it may not see is PERMISSION_DENIED
    (docs/server.md, "Authentication")."""
    if caller.pools is None:
        return pools or None
    hidden = sorted(pools - caller.pools)
    if hidden:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED, f"pools: credentials do not allow pool {hidden[0]!r}"
        )
    return pools or set(caller.pools)


def known_pools(pools: set[str], known: Collection[str]) -> None:
    """The pools a listing's filter named are known ones, else NOT_FOUND (checked after the
    caller's restriction, which is told first)."""
    unknown = sorted(pools.difference(known))
    if unknown:
        raise Refused(grpc.StatusCode.NOT_FOUND, f"unknown pool {unknown[0]!r}")


def trace_headers(context: Context, limits: LimitsSettings) -> dict[str, str]:
    """The call's `traceparent` and `tracestate` request headers: they become the task tags
    of those names unless the spec has a `traceparent` (docs/server-api.md, "Input rules"),
    so attempts carry the caller's trace."""
    out = {}
    for k, v in context.invocation_metadata() or ():
        if k in (TRACEPARENT, TRACESTATE) and isinstance(v, str):
            out[k] = convert.check_name(k, v, limits.max_tag_len)
    return out


async def _settle(handle: TaskHandle) -> None:
    with contextlib.suppress(TaskFailed):
        await handle


class TasksService(ServiceBase, cronoq_pb2_grpc.TasksServicer):
    """`cronoq.v1.Tasks` (docs/server-api.md, "Tasks")."""

    # --- helpers ---------------------------------------------------------------------------

    def _budget(self, requested: float | None, field: str, context: Context) -> float:
        """The effective wait: the request's, capped by `max_wait_s` and the call deadline."""
        budget = self._limits.max_wait_s
        if requested is not None:
            budget = min(budget, convert.check_duration(field, requested))
        remaining: float | None = context.time_remaining()
        if remaining is not None:
            budget = min(budget, max(remaining, 0.0))
        return budget

    @functools.cached_property
    def _holds(self) -> Holds:
        return Holds(self._sched)

    async def _admit(
        self, engine: Engine, tasks: Sequence[dict[str, Any]], context: Context
    ) -> bool:
        """Bounds the library would not apply as the server does: `max_pending_total`
        (RESOURCE_EXHAUSTED "queue full" at once), and full overflow="wait" pools, which hold
        the call in line until all of its tasks fit (holds.py; docs/overflow-and-fairness.md,
        "On the server"), within the call's deadline (else DEADLINE_EXCEEDED) but exempt from
        `request_timeout_s`. True if the call was held. Admit right after, without an `await`
        in between."""
        fresh = [t for t in tasks if (k := t.get("key")) is None or engine.lookup(k) is None]
        if not fresh:
            return False
        self._check_total(engine, len(fresh))
        need: dict[str, int] = {}
        for t in fresh:
            name = t["pool"]
            cfg = engine.configs.get(name)
            if cfg is not None and cfg.overflow == "wait":
                need[name] = need.get(name, 0) + 1
        for name, n in need.items():
            cap = engine.configs[name].max_pending
            if cap is not None and n > cap:  # it could never fit: no use holding it
                what = "a task" if n == 1 else f"{n} new tasks"
                raise Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"overloaded: {what} for pool {name!r} exceed its max_pending ({cap})",
                )
        if not need or not self._holds.must_hold(engine, need):
            return False
        exempt_request()
        remaining: float | None = context.time_remaining()
        if remaining is not None and not math.isfinite(remaining):
            remaining = None
        try:
            async with asyncio.timeout(remaining):
                await self._holds.hold(engine, need)
        except TimeoutError:
            pools = ", ".join(repr(p) for p in sorted(need))
            raise Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the deadline passed while the call was held: pool {pools} still full",
            ) from None
        self._check_total(engine, len(fresh))  # others may have taken what was left meanwhile
        return True

    def _check_total(self, engine: Engine, fresh: int) -> None:
        if engine.pending() + fresh > self._limits.max_pending_total:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")

    def _lookup(self, engine: Engine, ref: pb.TaskRef) -> TaskRecord | None:
        """The task, or None when there is none the caller may see (another pool's task is
        NOT_FOUND for a pool-restricted caller, never None)."""
        rec = engine.lookup(convert.task_ref(ref, self._limits))
        if rec is not None and not current_principal().sees(rec.pool):
            raise Refused(grpc.StatusCode.NOT_FOUND, "unknown task")
        return rec

    def visible(self, ref: pb.TaskRef) -> TaskRecord | None:
        """The own shard's task `ref` names, if the caller may see it (lookups by key across
        shards, docs/sharding.md, "Keys across shards")."""
        rec = self._engine().lookup(convert.task_ref(ref, self._limits))
        return rec if rec is not None and current_principal().sees(rec.pool) else None

    async def _find(self, engine: Engine, ref: pb.TaskRef) -> TaskRecord:
        """The task the caller may see (else NOT_FOUND "unknown task"); by id also a finished
        task that only the store still keeps (its rows outlive limits.key_retention_s:
        docs/configuration.md, "[store]")."""
        rec = self._lookup(engine, ref)
        if rec is None and ref.WhichOneof("target") == "id":
            rec = await self._sched.stored(ref.id)
            if rec is not None and not current_principal().sees(rec.pool):
                rec = None
        if rec is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, "unknown task")
        return rec

    async def _wait(self, rec: TaskRecord, budget: float) -> pb.TaskResult:
        """Wait for the task's end; the waiting task outlives a timeout (it ends with the task
        or the scheduler), so other waiters on the same task are never disturbed."""
        if rec.status < FIRST_TERMINAL:
            handle = await self._sched.handle(rec.id)
            if handle is None:  # forgotten meanwhile: only a finished task can be
                raise Refused(grpc.StatusCode.NOT_FOUND, f"task {rec.id} no longer retained")
            waiter = asyncio.ensure_future(_settle(handle))
            done, _ = await asyncio.wait({waiter}, timeout=None if math.isinf(budget) else budget)
            if not done:
                raise Refused(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"task {rec.id} still {rec.status_name} after {budget:g} s",
                )
            if rec.status < FIRST_TERMINAL:
                raise Refused(
                    grpc.StatusCode.UNAVAILABLE, "scheduler stopped before the task ended"
                )
        return convert.task_result(rec)

    # --- RPCs ------------------------------------------------------------------------------

    @rpc_errors
    async def Submit(self, request: pb.SubmitRequest, context: Context) -> pb.SubmitResponse:
        engine = self._engine()
        if not request.HasField("task"):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "missing task")
        trace = trace_headers(context, self._limits)
        ((payload, options),) = self._specs([("task", request.task)], trace)
        budget = 0.0
        requested = None
        if request.wait:
            requested = request.wait_timeout_s if request.HasField("wait_timeout_s") else None
            budget = self._budget(requested, "wait_timeout_s", context)
        with self._traced(trace, [options]) as span:
            if await self._admit(engine, [options], context) and request.wait:
                budget = self._budget(requested, "wait_timeout_s", context)  # what is left
            handle = await self._sched.submit(payload, **options)
            span[ATTR_TASK_ID] = handle.id
            resp = pb.SubmitResponse(id=handle.id, duplicate=handle.duplicate)
            if request.wait:
                rec = engine.lookup(handle.id)
                if rec is None:
                    raise Refused(grpc.StatusCode.NOT_FOUND, f"task {handle.id} no longer retained")
                resp.result.CopyFrom(await self._wait(rec, budget))
        return resp

    @rpc_errors
    async def SubmitBatch(
        self, request: pb.SubmitBatchRequest, context: Context
    ) -> pb.SubmitBatchResponse:
        engine = self._engine()
        n = len(request.tasks)
        if n > self._limits.max_tasks_per_batch:
            raise InvalidArgument(
                "tasks", f"at most max_tasks_per_batch={self._limits.max_tasks_per_batch} tasks"
            )
        trace = trace_headers(context, self._limits)
        specs = self._specs([(f"tasks[{i}]", spec) for i, spec in enumerate(request.tasks)], trace)
        tasks = [options for _, options in specs]
        with self._traced(trace, tasks):
            await self._admit(engine, tasks, context)
            handles = await self._sched.submit_batch(
                [Task(payload, **options) for payload, options in specs]
            )
        return pb.SubmitBatchResponse(
            tasks=[pb.SubmitResponse(id=h.id, duplicate=h.duplicate) for h in handles]
        )

    @rpc_errors
    async def Cancel(self, request: pb.CancelRequest, context: Context) -> pb.CancelResponse:
        """An unknown task is `cancelled = false`, as one that had ended; only a
        pool-restricted caller gets NOT_FOUND for it, as for another pool's task, so that
        it cannot tell the two apart."""
        engine = self._engine()
        rec = self._lookup(engine, request.task)
        if rec is None:
            if current_principal().pools is not None:
                raise Refused(grpc.StatusCode.NOT_FOUND, "unknown task")
            return pb.CancelResponse(cancelled=False)
        return pb.CancelResponse(cancelled=await self._sched.cancel(rec.id))

    @rpc_errors
    async def Get(self, request: pb.GetRequest, context: Context) -> pb.TaskInfo:
        engine = self._engine()
        rec = await self._find(engine, request.task)
        config = engine.configs.get(rec.pool)
        return convert.task_info(rec, None if config is None else config.retry)

    @rpc_errors
    async def ListTasks(
        self, request: pb.ListTasksRequest, context: Context
    ) -> pb.ListTasksResponse:
        """Ascending ids after `after`, from the engine's id index (Engine.page)."""
        engine = self._engine()
        named = {convert.check_name(f"pools[{i}]", p) for i, p in enumerate(request.pools)}
        pools = pool_filter(named, current_principal())
        self._known_pools(engine, named)
        statuses = {
            convert.status_from_pb(s, f"statuses[{i}]") for i, s in enumerate(request.statuses)
        }
        limit = min(request.limit or DEFAULT_PAGE, self._limits.max_list)
        after = request.after

        def match(rec: TaskRecord) -> bool:
            return (pools is None or rec.pool in pools) and (not statuses or rec.status in statuses)

        filtered = pools is not None or statuses
        page, more = engine.page(after, limit, match if filtered else None)
        retry = self._pool_retry(engine)
        return pb.ListTasksResponse(
            tasks=[convert.task_info(rec, retry[rec.pool]) for rec in page],
            next_after=page[-1].id if more else 0,
        )

    @rpc_errors
    async def Wait(self, request: pb.WaitRequest, context: Context) -> pb.TaskResult:
        engine = self._engine()
        requested = request.timeout_s if request.HasField("timeout_s") else None
        budget = self._budget(requested, "timeout_s", context)
        rec = await self._find(engine, request.task)
        return await self._wait(rec, budget)

    async def Watch(
        self, request: pb.WatchRequest, context: Context
    ) -> AsyncGenerator[pb.StatusEvent, None]:
        """Events from now on, filtered; DATA_LOSS when the stream overflows, UNAVAILABLE when
        the scheduler stops. A client that goes away simply ends it."""
        try:
            engine = self._engine()
            limits = self._limits
            named = {convert.check_name(f"pools[{i}]", p) for i, p in enumerate(request.pools)}
            pools = pool_filter(named, current_principal())
            self._known_pools(engine, named)
            keys = {
                convert.check_name(f"keys[{i}]", k, limits.max_key_len)
                for i, k in enumerate(request.keys)
            }
            stream = self._sched.events(on_lag="raise")
        except Exception as e:
            code, message = _status(e)
            await context.abort(code, message)
        # the headers now, not with the first event: the client knows it is subscribed (and a
        # browser's fetch over gRPC-Web resolves)
        await context.send_initial_metadata(())
        ids = set(request.ids)
        every = request.all_transitions
        try:
            async for ev in stream:
                if (
                    (every or ev.status in TERMINAL_NAMES)
                    and (pools is None or ev.pool in pools)
                    and (not ids or ev.id in ids)
                    and (not keys or ev.key in keys)
                ):
                    yield convert.event_to_pb(ev)
        except EventsLagged as e:
            await context.abort(grpc.StatusCode.DATA_LOSS, f"watch fell behind: {e}")
        finally:
            stream.close()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "scheduler stopped")


class AdminService(ServiceBase, cronoq_pb2_grpc.AdminServicer):
    """`cronoq.v1.Admin` (docs/server-api.md, "Admin"). `workers` lists the connected remote
    workers; the worker layer supplies it (snapshots derive per-pool worker counts and groups from
    it).

    A pool-restricted caller sees only its pools in snapshots and listings. Schedule names
    are one namespace: such a caller may not replace another pool's schedule, and removing
    one is answered as if there were none.
    """

    def __init__(
        self,
        sched: Scheduler,
        limits: LimitsSettings,
        workers: Callable[[], Sequence[pb.WorkerInfo]],
    ) -> None:
        super().__init__(sched, limits)
        self._workers = workers

    @rpc_errors
    async def Snapshot(self, request: pb.Empty, context: Context) -> pb.SnapshotResponse:
        engine = self._engine()
        caller = current_principal()
        snap = await self._sched.snapshot()
        if caller.pools is not None:
            pools = [p for p in snap.pools if caller.sees(p.name)]
            snap = dataclasses.replace(
                snap,
                pools=pools,
                live_tasks=sum(caller.sees(r.pool) for r in engine.live_tasks()),
                running=sum(p.busy for p in pools),
                pending=sum(p.pending for p in pools),
            )
        workers = [w for w in self._workers() if caller.sees(w.pool)]
        return convert.snapshot_to_pb(snap, workers)

    @rpc_errors
    async def AddRecurring(self, request: pb.RecurringRequest, context: Context) -> pb.Empty:
        """A template for a pool the server does not have is an invalid template
        (INVALID_ARGUMENT), not a missing pool."""
        engine = self._engine()
        args = convert.recurring_from_pb(request, self._limits)
        caller = current_principal()
        _scope(args.options, "template", caller)
        existing = engine.recurring.get(args.name)
        if existing is not None and not caller.sees(existing.pool):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"name: {args.name!r} is a schedule of a pool not allowed for you",
            )
        try:
            await self._sched.add_recurring(args.name, args.cron, args.payload, **args.options)
        except SubmitError as e:
            if e.code != "unknown_pool":
                raise
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid template: {e.message}"
            ) from None
        return pb.Empty()

    @rpc_errors
    async def RemoveRecurring(
        self, request: pb.RemoveRecurringRequest, context: Context
    ) -> pb.RemoveRecurringResponse:
        engine = self._engine()
        name = convert.check_name("name", request.name)
        existing = engine.recurring.get(name)
        if existing is not None and not current_principal().sees(existing.pool):
            return pb.RemoveRecurringResponse(removed=False)
        return pb.RemoveRecurringResponse(removed=await self._sched.remove_recurring(name))

    @rpc_errors
    async def ListWorkers(self, request: pb.Empty, context: Context) -> pb.ListWorkersResponse:
        self._engine()
        caller = current_principal()
        return pb.ListWorkersResponse(workers=[w for w in self._workers() if caller.sees(w.pool)])

    @rpc_errors
    async def ListRecurring(self, request: pb.Empty, context: Context) -> pb.ListRecurringResponse:
        engine = self._engine()
        caller = current_principal()
        schedules = sorted(
            (r for r in engine.recurring.values() if caller.sees(r.pool)), key=lambda r: r.name
        )
        return pb.ListRecurringResponse(schedules=[convert.recurring_to_pb(r) for r in schedules])
