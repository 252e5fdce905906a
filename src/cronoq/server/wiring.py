"""The server as the command runs it: `build(cfg)` wires into the app (app.py, which knows no
service) its launcher (remote workers), the services, sharding, the webhook scaler and, when
credentials are configured, authentication in front of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web

from ..proto.cronoq.v1 import cronoq_pb2_grpc
from .app import ServerApp
from .auth import (
    Authenticator,
    AuthInterceptor,
    Unauthenticated,
    allowed,
    certificate_dns_names,
    denial,
    use_principal,
)
from .config import ServerConfig
from .decode import DecodeGuard
from .fronts.routes import HttpError, Route
from .holds import bound_request
from .scaler import WebhookScaler
from .services.operations import OperationsService
from .services.sharding import Peers, Router, ShardedOperations, ShardPlan
from .services.tasks import AdminService, TasksService
from .services.worker_stream import WorkService

SHUTDOWN_REASON = "server shutting down"
# Unary calls that wait for a task: bounded by limits.max_wait_s instead (in the services).
WAITING = {"/cronoq.v1.Tasks/Wait", "/cronoq.v1.Tasks/Submit"}


def build(cfg: ServerConfig, *, clock: Callable[[], float] | None = None) -> ServerApp:
    """A ServerApp whose pools are served by remote workers over Workers/Work; `clock` is the
    scheduler's clock (default `time.time`), which the workers' service reads too."""
    clock = time.time if clock is None else clock
    plan = ShardPlan.of(cfg)
    router = None if plan is None else Router(plan, Peers(cfg), cfg.limits)
    work = WorkService(
        pool_max={p.name: p.max for p in cfg.pools},
        pool_slot_caps={p.name: p.max_slots_per_worker for p in cfg.pools},
        slot_cap=cfg.limits.max_slots_per_worker,
        max_message_bytes=cfg.limits.max_message_bytes,
        max_tags=cfg.limits.max_tags,
        max_tag_len=cfg.limits.max_tag_len,
        clock=clock,
        redirect=None if router is None else router.pool_elsewhere,
    )

    def register(app: ServerApp, server: grpc.aio.Server) -> None:
        # (the generated registration functions carry no annotations)
        add = cronoq_pb2_grpc
        add.add_WorkersServicer_to_server(work, server)  # type: ignore[no-untyped-call]
        local_tasks = TasksService(app.scheduler, cfg.limits, app.tracing)
        local_admin = AdminService(app.scheduler, cfg.limits, work.worker_infos)
        local_operations = OperationsService(app.scheduler, cfg.limits)
        tasks: cronoq_pb2_grpc.TasksServicer = local_tasks
        admin: cronoq_pb2_grpc.AdminServicer = local_admin
        operations: cronoq_pb2_grpc.OperationsServicer = local_operations
        if router is not None:  # docs/sharding.md: calls for other shards are routed
            tasks, admin = router.wrap(local_tasks, local_admin)
            operations = ShardedOperations(local_operations, router)
        add.add_TasksServicer_to_server(tasks, server)  # type: ignore[no-untyped-call]
        add.add_AdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]
        add.add_OperationsServicer_to_server(operations, server)  # type: ignore[no-untyped-call]

    # Without credentials every caller is the unrestricted admin, the services' default.
    authenticator = Authenticator(cfg.auth)
    enabled = cfg.auth.enabled
    app = ServerApp(
        cfg,
        launcher_factory=lambda _: work,
        registrars=[register],
        interceptors=[
            DecodeGuard(),  # outermost: later layers only ever see decoded requests
            *([AuthInterceptor(authenticator)] if enabled else []),
            RequestTimeout(cfg.limits.request_timeout_s),
        ],
        http_authorize=_http_authorize(authenticator) if enabled else None,
        clock=clock,
    )

    work.tracing = app.tracing

    async def tell_workers() -> None:
        work.shutdown(SHUTDOWN_REASON, not_leader=False)

    app.on_stop(tell_workers)
    if router is not None:
        app.on_stop(router.peers.close)
    # docs/autoscaling.md, "Webhook scaler": the pools this server serves (with [[shards]], its
    # own shard's; another shard's server posts for the others)
    own = None if cfg.own_shard is None else set(cfg.own_shard.pools)
    scaler = WebhookScaler(app, [p for p in cfg.pools if own is None or p.name in own])
    app.on_ready(scaler.lead)
    app.on_stop(scaler.stop)
    return app


def _http_authorize(
    authenticator: Authenticator,
) -> Callable[[web.Request, Route], Awaitable[None]]:
    """The same credentials and roles on HTTP: 401 without a valid one, 403 for the wrong role."""

    async def authorize(request: web.Request, route: Route) -> None:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        names = certificate_dns_names(peer)
        try:
            principal = authenticator.authenticate(request.headers.get("Authorization"), names)
        except Unauthenticated as e:
            raise HttpError(401, str(e)) from None
        if route.method is not None and not allowed(principal, route.method):
            raise HttpError(403, denial(principal, route.method))
        use_principal(principal)

    return authorize


class RequestTimeout(grpc.aio.ServerInterceptor):
    """limits.request_timeout_s for unary calls: a call still running then ends with
    DEADLINE_EXCEEDED. Waits are exempt (Wait, and Submit with wait=true), and so is a Submit or
    SubmitBatch from the moment a full overflow="wait" pool holds it (holds.py lifts the timer
    of `bound_request`)."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method
        behavior: Any = handler.unary_unary  # an async behavior (grpc.aio)
        seconds = self._seconds

        async def bounded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if method in WAITING and (method.endswith("/Wait") or request.wait):
                return await behavior(request, context)
            try:
                async with asyncio.timeout(seconds) as timer:
                    with bound_request(timer):
                        return await behavior(request, context)
            except TimeoutError:
                if not timer.expired():
                    raise
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the request took longer than limits.request_timeout_s ({seconds:g} s)",
                )

        return grpc.unary_unary_rpc_method_handler(
            bounded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
