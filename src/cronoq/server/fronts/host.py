"""What a front reads of the app that hosts it, as Protocols: the fronts depend on these and not
on `app.ServerApp`, which builds them (so the app can import the fronts, and no front the app)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import grpc

from cronoq.runtime import Scheduler

from ..config import ServerConfig, SocketAddress


class Host(Protocol):
    """What the gRPC-Web front reads: the configuration and the unary handlers by method path."""

    @property
    def cfg(self) -> ServerConfig: ...

    @property
    def methods(self) -> Mapping[str, grpc.RpcMethodHandler[Any, Any]]: ...


class Charted(Protocol):
    """The per-pool history the dashboard's charts read (`history.History`, a layer above)."""

    def series(self, pool: str | None, since: float | None) -> dict[str, Any]: ...


class HttpHost(Host, Protocol):
    """What the HTTP listener and its routes (the dashboard's included) read besides."""

    @property
    def ready(self) -> bool: ...

    @property
    def standing_by(self) -> bool: ...

    @property
    def unready_reason(self) -> str | None: ...

    @property
    def grpc_address(self) -> SocketAddress | None: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def history(self) -> Charted: ...
