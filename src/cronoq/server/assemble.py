"""The server as the command runs it: the app with its launcher (remote workers), services and,
when credentials are configured, authentication in front of them."""

from __future__ import annotations

import grpc

from ..proto.cronoq.v1 import cronoq_pb2_grpc
from .app import ServerApp
from .auth import Authenticator, AuthInterceptor
from .config import ServerConfig
from .tasks import AdminService, TasksService
from .work import WorkService

SHUTDOWN_REASON = "server shutting down"


def build(cfg: ServerConfig) -> ServerApp:
    """A ServerApp whose pools are served by remote workers over Workers/Work."""
    work = WorkService(
        pool_max={p.name: p.max for p in cfg.pools},
        pool_slot_caps={p.name: p.max_slots_per_worker for p in cfg.pools},
        slot_cap=cfg.limits.max_slots_per_worker,
        max_message_bytes=cfg.limits.max_message_bytes,
    )

    def register(app: ServerApp, server: grpc.aio.Server) -> None:
        # (the generated registration functions carry no annotations)
        add = cronoq_pb2_grpc
        add.add_WorkersServicer_to_server(work, server)  # type: ignore[no-untyped-call]
        tasks = TasksService(app.scheduler, cfg.limits)
        add.add_TasksServicer_to_server(tasks, server)  # type: ignore[no-untyped-call]
        admin = AdminService(app.scheduler, cfg.limits, work.worker_infos)
        add.add_AdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]

    # Without credentials every caller is the unrestricted admin, the services' default.
    auth = [AuthInterceptor(Authenticator(cfg.auth))] if cfg.auth.enabled else []
    app = ServerApp(cfg, launcher_factory=lambda _: work, registrars=[register], interceptors=auth)

    async def tell_workers() -> None:
        work.shutdown(SHUTDOWN_REASON, not_leader=False)

    app.on_stop(tell_workers)
    return app
