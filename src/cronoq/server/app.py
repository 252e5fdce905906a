"""One server process put together from a ServerConfig: the scheduler, its store, the gRPC
listener and the HTTP listener (docs/server.md, docs/http.md).

The services themselves come from outside: `launcher_factory` gives the scheduler the workers
layer's Launcher, each of `registrars` adds servicers to the gRPC server, and `interceptors`
(authentication) run before the readiness check, in the order of docs/server-api.md, "Check order"
(authenticate, check the role, then check that this instance serves). Keeping the app ignorant of
the services lets each be built and tested on its own.

The fronts (fronts/) serve what the registrars added: `listen()` hands the registrars a
`grpcio.MethodTable` that forwards to the gRPC server and keeps each handler in `methods` by its
path, which the HTTP API, gRPC-Web and the native transport call, so every front runs one logic
whatever the registrars register. The fronts see the app only through fronts/host.py.
`http_authorize` is the HTTP counterpart of the authentication interceptors
(`fronts.http_api.Authorize`).

Life cycle (docs/server.md, "Standby"): `listen()` binds the listeners at once, even on a
standby; `lead()` starts the scheduler, which with a durable store (SQLite or PostgreSQL) waits
there until this process holds the leadership, and stands by again whenever the leadership is
lost: after RECONTEND_S (a standby that was already waiting gets its turn first), the same
scheduler starts a new session once this process leads again, recovering from the store what the
leader in between left there. `stop()` is the graceful shutdown. Until `ready`, every gRPC call is
refused with UNAVAILABLE by the readiness interceptor, whatever method it names, and every HTTP API
route with 503; `standby_reason` says why (the `/readyz` header, docs/http.md, "Health and
readiness"), and the HTTP listener recycles its connections (docs/http.md, "Connections on a
standby").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import Enum
from typing import Any, cast

import grpc

from cronoq._lifecycle import Lifecycle, table
from cronoq.core.engine import Engine
from cronoq.core.model import TaskRecord
from cronoq.runtime import Launcher, Scheduler
from cronoq.store import PostgresStore, SqliteStore

from .config import (
    ConfigError,
    ServerConfig,
    SocketAddress,
    library_pools,
    library_resources,
    transport_of,
)
from .fronts import dashboard as dashboard_front
from .fronts.grpcio import MethodTable, ReadyGate, credentials, grpc_options
from .fronts.grpcweb import GrpcWebFront
from .fronts.http_api import ROUTES, Authorize, HttpListener, ssl_context
from .fronts.native import NativeFront
from .fronts.routes import Route
from .history import History, HistorySampler
from .inflight import Ledger, Load
from .logs import event
from .ports import ensure_free
from .tracing import server_tracing

__all__ = ["DRAIN_S", "BytesCodec", "Registrar", "ServerApp", "served_routes"]

log = logging.getLogger(__name__)

DRAIN_S = 5.0  # how long the listener drains calls still open (docs/server.md, "Shutdown" step 4)
# After losing the leadership, how long the server waits before it contends again (docs/server.md,
# "Standby"): two PostgreSQL lock polls, so that a standby that was already waiting takes over
# rather than the server that just lost (whose loss may come from a sick connection or a pause).
RECONTEND_S = 1.0
# What /readyz says of a standby whose store has nothing to say (docs/http.md, "Health and
# readiness"), and how the store's own words are shown.
WAITING = "waiting for the leadership"
_STORE_STATUS = {
    "not open": "connecting to the store",
    "open": "connecting to the store",
    "closed": "connecting to the store",
    "leading": "taking over: recovering the store's state",
}

DurableStore = SqliteStore | PostgresStore

Registrar = Callable[["ServerApp", grpc.aio.Server], None]
LauncherFactory = Callable[["ServerApp"], Launcher]
StopHook = Callable[[], Awaitable[None]]


class AppState(Enum):
    """A server process's life cycle (docs/server.md, "Life cycle")."""

    STANDBY = "standby"  # not leading (yet, or again after the leadership was lost)
    READY = "ready"  # leading: the scheduler runs and calls are served
    STOPPING = "stopping"  # stop() began: calls are refused, the scheduler shuts down
    STOPPED = "stopped"  # stop() finished: the listeners are closed


_A = AppState
APP_TRANSITIONS = table(
    AppState,
    {
        _A.STANDBY: {_A.READY, _A.STOPPING},
        _A.READY: {_A.STANDBY, _A.STOPPING},
        _A.STOPPING: {_A.STOPPED},
        _A.STOPPED: set(),
    },
)


class BytesCodec:
    """Payloads and outputs are bytes on the wire, so the store keeps them as they are."""

    __slots__ = ()

    def encode(self, obj: Any) -> bytes:
        if not isinstance(obj, bytes):
            raise TypeError(f"server payloads are bytes (got {type(obj).__name__})")
        return obj

    def decode(self, data: bytes) -> bytes:
        return data


def served_routes(dashboard: bool) -> tuple[Route, ...]:
    """The HTTP API's routes, and the dashboard's after them when `[server] dashboard` is on
    (docs/dashboard.md, "The dashboard's API"); those stay out of the OpenAPI document."""
    return ROUTES + dashboard_front.ROUTES if dashboard else ROUTES


class ServerApp:
    """The scheduler and the gRPC listener of one server process."""

    def __init__(
        self,
        cfg: ServerConfig,
        *,
        launcher_factory: LauncherFactory | None = None,
        registrars: Sequence[Registrar] = (),
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        http_authorize: Authorize | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """ConfigError for TLS files it cannot read, found before anything is bound (the store
        is only built here: it connects once the listeners are bound, in `lead()`).
        `launcher_factory(app)` is called before the scheduler exists (the scheduler needs the
        launcher): only `cfg` and `store` are set. `clock`: the scheduler's clock (see
        `Scheduler`; default `time.time`)."""
        self.cfg = cfg
        tls = cfg.server.tls
        self._credentials = None if tls is None else credentials(tls)
        # the front's own TLS, for the gRPC-Web connections it answers (docs/grpc-web.md, "TLS")
        self._grpc_web_tls = (
            None if tls is None or cfg.server.grpc_web is None else ssl_context(tls)
        )
        self._http = HttpListener(
            self,
            served_routes(cfg.server.dashboard),
            authorize=http_authorize,
            ssl_context=None if tls is None else ssl_context(tls),
            drain_s=DRAIN_S,
        )
        self.store = _store(cfg)
        # the spans, when on: the engine's observer, before the task-queue histograms of
        # /metrics (docs/observability.md)
        self.tracing = server_tracing(cfg.tracing, self._http.metrics.observer, self._lookup)
        self._lost: asyncio.Future[str] | None = None  # set when a leading session is lost
        self.launcher = (
            None if launcher_factory is None else _Reporting(launcher_factory(self), self._on_lost)
        )
        self.scheduler = Scheduler(
            library_pools(cfg),
            library_resources(cfg),
            shutdown_grace=cfg.server.shutdown_grace_s,
            emit_transitions=True,  # Watch may ask for every transition
            store=self.store,
            codec=None if self.store is None else BytesCodec(),
            retention=cfg.limits.key_retention_s,
            retention_max=cfg.limits.key_retention_max,
            launcher=self.launcher,
            clock=clock,
            shard=None if cfg.own_shard is None else cfg.own_shard.number,
            observer=self.tracing or self._http.metrics.observer,
            tracing=False,  # (the server's own spans are `self.tracing`'s)
        )
        self.grpc_address: SocketAddress | None = None  # with the bound port, once listening
        self.http_address: SocketAddress | None = None
        self.metrics_address: SocketAddress | None = None
        # the unary gRPC handlers by method path ("/cronoq.v1.Tasks/Submit"), for the HTTP API
        self.methods: Mapping[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self._registrars = tuple(registrars)
        self._interceptors = tuple(interceptors)
        self._server: grpc.aio.Server | None = None
        self._front: GrpcWebFront | None = None  # the public gRPC port with gRPC-Web on
        self._native: NativeFront | None = None  # the gRPC port on the native transport
        self.grpc_load: Load | None = None  # what the gRPC listener holds, once it listens
        self._on_stop: list[StopHook] = []
        self._on_ready: list[Callable[[], None]] = []
        self._life = Lifecycle("ServerApp", _A.STANDBY, APP_TRANSITIONS)
        # the dashboard's charts: each pool's last hour, sampled while this server leads
        self.history = History(self.scheduler.clock)
        sampler = HistorySampler(self, self.history, self._http.metrics.observer)
        self.on_ready(sampler.lead)
        self.on_stop(sampler.stop)

    @property
    def transport(self) -> str:
        """What serves the gRPC port: "native" or "grpcio" (docs/server.md, "Transports"):
        `server.transport`, where "auto" is the native transport when it is built and the
        configuration does not need grpcio's (gRPC-Web)."""
        return transport_of(self.cfg.server)

    @property
    def ready(self) -> bool:
        """Serving: leading, started, not stopping (a deposed leader's scheduler has stopped)."""
        return self._life.at(_A.READY) and self.scheduler.started

    @property
    def stopping(self) -> bool:
        """The graceful shutdown has begun (or is over)."""
        return self._life.at(_A.STOPPING, _A.STOPPED)

    @property
    def standing_by(self) -> bool:
        """Not serving and not shutting down: waiting for (or taking) the leadership. Its HTTP
        listener then recycles connections (a leader and a stopping server keep theirs)."""
        return not self.ready and not self.stopping

    @property
    def standby_reason(self) -> str:
        """Why this server does not serve, in a few words (`/readyz` of a standby): what the
        store waits for (PostgreSQL: the database, another server's lock; SQLite: room on a
        full disk), else a fixed text."""
        if self.stopping:
            return "shutting down"
        status = getattr(self.store, "status", None)
        if not isinstance(status, str) or not status:
            return WAITING
        return _STORE_STATUS.get(status, status)

    @property
    def unready_reason(self) -> str | None:
        """Why `/readyz` fails, or None: a standby's `standby_reason`, or a gRPC listener that
        has stayed full (inflight.FULL_S), which cannot take a call, workers' included."""
        if not self.ready:
            return self.standby_reason
        return None if self.grpc_load is None else self.grpc_load.fullness.unready

    def on_ready(self, hook: Callable[[], None]) -> None:
        """Call `hook()` each time the app becomes ready (it leads, the scheduler runs): where
        what only the leader does starts (the webhook scaler, scaler.py). It ends by itself
        once `ready` is false again."""
        self._on_ready.append(hook)

    def on_stop(self, hook: StopHook) -> None:
        """Run `hook` once the scheduler has stopped and before the listener drains: where the
        workers layer sends `shutdown` to its streams (docs/server.md, "Shutdown" step 3)."""
        self._on_stop.append(hook)

    async def listen(self) -> SocketAddress:
        """Bind and start the gRPC listener, then the HTTP listener (and the metrics listener
        when `metrics_addr` is set); returns the gRPC address with the bound port."""
        limits = self.cfg.limits
        address = self.cfg.server.grpc_addr
        # A taken address (or one this host cannot bind) refuses the start here, before anything
        # is bound and before gRPC could print its own error line (ports.py).
        ensure_free(address, dual_stack=True)
        ensure_free(self.cfg.server.http_addr)
        if self.cfg.server.metrics_addr is not None:
            ensure_free(self.cfg.server.metrics_addr)
        ledger = Ledger(limits)  # (grpcio's own accounting: the native transport has its own)
        server = grpc.aio.server(
            interceptors=[ledger, *self._interceptors, ReadyGate(self)],
            options=grpc_options(limits),
            maximum_concurrent_rpcs=limits.max_concurrent_requests,
        )
        table = MethodTable(server, limits.max_message_bytes)
        for register in self._registrars:
            register(self, cast(grpc.aio.Server, table))
        self.methods = table.handlers
        chain = [*self._interceptors, ReadyGate(self)]
        if self.transport == "native":  # grpcio's server only collected the handlers
            native = NativeFront(table.checked, table.generic, chain, limits, self.cfg.server.tls)
            try:
                port = await native.start(address)
                self.http_address, self.metrics_address = await self._http.start()
            except BaseException:
                await native.stop(0)
                raise
            self._native = self.grpc_load = native
            self._listening(SocketAddress(address.host, port))
            return SocketAddress(address.host, port)
        # gRPC-Web (docs/grpc-web.md): grpcio on an internal loopback port, with the same TLS
        # if any, the public one served by the front, which relays native gRPC to grpcio and
        # answers HTTP/1.1 itself (ending TLS for it: docs/grpc-web.md, "TLS").
        grpc_web = self.cfg.server.grpc_web
        bind = address if grpc_web is None else SocketAddress("127.0.0.1", 0)
        try:
            if self._credentials is None:
                port = server.add_insecure_port(str(bind))
            else:
                port = server.add_secure_port(str(bind), self._credentials)
        except RuntimeError as exc:  # grpcio's way of saying the address is taken or invalid
            raise OSError(f"cannot listen on {bind}: {exc}") from None
        await server.start()
        front = None
        try:
            if grpc_web is not None:
                front = GrpcWebFront(
                    self,
                    chain,
                    SocketAddress("127.0.0.1", port),
                    grpc_web.allowed_origins,
                    self._grpc_web_tls,
                )
                port = await front.start(address)
            self.http_address, self.metrics_address = await self._http.start()
        except BaseException:  # (taken since the check): nothing stays bound, nothing is logged
            if front is not None:
                await front.stop()
            await server.stop(None)
            raise
        self._server = server
        self._front = front
        self.grpc_load = ledger
        self._listening(SocketAddress(address.host, port))
        return SocketAddress(address.host, port)

    def _listening(self, grpc_address: SocketAddress) -> None:
        self.grpc_address = grpc_address
        tls = self._credentials is not None
        transport = self.transport
        event(log, logging.INFO, "listening", grpc=grpc_address, tls=tls, transport=transport)
        event(log, logging.INFO, "listening", http=self.http_address, tls=tls)
        if self.metrics_address is not None:
            event(log, logging.INFO, "listening", metrics=self.metrics_address, tls=False)

    async def lead(self) -> None:
        """Start the scheduler (a standby waits here for the leadership) and serve; when the
        leadership is lost, stand by again and serve once it is regained, until stop()."""
        while True:
            if self.store is not None:
                event(log, logging.INFO, "awaiting_leadership", store=self.store.location)
            self._lost = lost = asyncio.get_running_loop().create_future()
            await self.scheduler.start()
            if not self._life.at(_A.STANDBY):
                return
            self._life.move(_A.READY)
            event(log, logging.INFO, "ready")
            for ready in self._on_ready:
                ready()
            if self.store is None or self.launcher is None:
                return  # nothing to lose without a store; nobody to tell without a launcher
            reason = await lost
            if not self._life.at(_A.READY):
                return
            self._life.move(_A.STANDBY)
            event(log, logging.WARNING, "standing_by", reason=reason)
            await asyncio.sleep(RECONTEND_S)  # a waiting standby's turn first (see RECONTEND_S)

    def _lookup(self, ref: int | str) -> TaskRecord | None:
        """A task of the running engine (for the spans' links to a task's dependencies)."""
        return self.scheduler.serving().lookup(ref)

    def _on_lost(self, reason: str) -> None:
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(reason)

    async def stop(self) -> None:
        """Graceful shutdown (docs/server.md, "Shutdown"): refuse new calls, let running attempts
        finish for `shutdown_grace_s` (which also ends waits and watches, writes what was decided
        and releases the leadership), run the stop hooks, then drain the gRPC listener and close
        the HTTP ones (which answer 503 and `/readyz` 503 until then)."""
        if self._life.at(_A.STOPPING, _A.STOPPED):
            return
        self._life.move(_A.STOPPING)
        grace = self.cfg.server.shutdown_grace_s
        event(log, logging.INFO, "stopping", grace_s=grace)
        await self.scheduler.shutdown(grace)
        for hook in self._on_stop:
            try:
                await hook()
            except Exception:
                log.exception("a stop hook failed")
        if self._native is not None:
            await self._native.stop(DRAIN_S)
        if self._server is not None:
            if self._front is not None:  # no new connections; relays carry the drain
                self._front.stop_listening()
            await self._server.stop(DRAIN_S)
            if self._front is not None:
                await self._front.stop()
        await self._http.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.close)
        self._life.move(_A.STOPPED)
        event(log, logging.INFO, "stopped")

    async def serve(self, stop: asyncio.Event) -> None:
        """Listen, lead, and serve until `stop` is set; stopping also ends a standby's wait.
        A listen that fails (OSError: an address is taken) raises at once: it left nothing
        bound and nothing was started, so there is no shutdown to run. A failed start logs
        `event=failed` with its error first, before the shutdown's `stopping` and `stopped`."""
        try:
            await self.listen()
        except Exception as exc:
            _failed(exc)
            raise
        try:
            leading = asyncio.ensure_future(self.lead())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({leading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not leading.done():
                leading.cancel()  # still standing by: give the wait up
                await asyncio.wait({leading})
            elif leading.cancelled() or leading.exception() is None:
                await stopping
            else:
                stopping.cancel()
                leading.result()  # a failed start (the store cannot open) ends the server
        except Exception as exc:
            _failed(exc)
            raise
        finally:
            await self.stop()


def _failed(exc: Exception) -> None:
    """Log a failed start (docs/server.md, "Logs"); a ConfigError is not logged: the command
    prints it as configuration lines and exits 2."""
    if not isinstance(exc, ConfigError):
        event(log, logging.ERROR, "failed", error=exc)


class _Reporting:
    """The scheduler's launcher, passed through, that also tells the app when the scheduler
    lost its session (leadership or store), so that the app can stand by again."""

    def __init__(self, inner: Launcher, on_lost: Callable[[str], None]) -> None:
        self._inner = inner
        self._on_lost = on_lost
        self.launch = inner.launch
        self.abort = inner.abort

    def bind(self, engine: Engine, kick: Callable[[], None]) -> None:
        self._inner.bind(engine, kick)

    def lost(self, reason: str) -> None:
        self._inner.lost(reason)
        self._on_lost(reason)


def _store(cfg: ServerConfig) -> DurableStore | None:
    """The configured store; it connects to nothing yet (a PostgreSQL database may be down at
    start-up: the store retries once the listeners are bound)."""
    store = cfg.store
    if store.kind == "memory":
        return None
    assert store.keep_finished_s is not None  # validated
    if store.kind == "sqlite":
        lease = store.leader_lease_s
        assert store.path is not None and lease is not None
        return SqliteStore(
            store.path, retention=store.keep_finished_s, lease_ttl=lease, lease_renew=lease / 5
        )
    assert store.kind == "postgres" and store.url is not None and store.schema is not None
    return PostgresStore(
        store.url,
        schema=store.schema,
        retention=store.keep_finished_s,
        reload_finished=cfg.limits.key_retention_s,
    )
