"""The HTTP listener (docs/http.md): health, readiness, metrics, the Admin snapshot and a JSON
API that mirrors the gRPC calls, with the routes and shapes of the published cronoq-server 0.2.1.

The API runs no logic of its own. Each route builds the request message of the gRPC method it
mirrors (json_messages.py turns the JSON into it) and calls the very handler the app's
registrars gave the gRPC listener (`Host.methods`), with `calls.Call` standing in for the
servicer context: what the services use of it (`abort`, `invocation_metadata`,
`time_remaining`). The answer goes back in the JSON shape of its route (json_messages.py again),
and every refusal, a gRPC status or the listener's own, as `{"error": "<text>", "code":
"<reason>"}` whose code is a function of the HTTP status alone (docs/http.md, "Errors"). So both
listeners validate, refuse and answer alike. The routes and the refusal type are in routes.py,
shared with the dashboard.

Checks run as middlewares in the order of docs/http.md, "Checks, in order", all before the body
is read: the Host header (only while no credential is configured and insecure_no_auth is off),
authentication (the `authorize` slot), readiness for API routes (503 on a standby or while
stopping), then the body limit (`limits.max_http_body_bytes`, 413). The last middleware reads the
body whole before the route runs. Health and readiness skip them all, and so do the 404 and 405
of paths and methods that no route serves.

Standby (docs/http.md, "Connections on a standby"): while the app stands by, `_Recycler` closes
every connection once it is about RECYCLE_S old, so that clients and load balancers pick a server
again; a request already received still gets its answer (with `Connection: close`). A leader and
a server in its graceful shutdown keep their connections.

Slow clients (docs/http.md, "Timeouts"): reading a request is bounded by
`limits.request_timeout_s`, what the route then does (a wait) is not. Headers: aiohttp's keep-alive
timer (`keepalive_timeout`), armed when a connection opens and again after each response and not
pushed back by bytes that arrive, closes a connection still waiting for complete headers, an idle
one included, at that time; no answer is sent. Body: `_read_body` gives it `request_timeout_s`,
then answers 408, ends its side of the connection and closes it after at most CLOSE_LINGER_S more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from importlib import resources
from typing import Any, cast

import grpc
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler

# Untyped for mypy: types-protobuf would type it, but it also makes the generated message
# classes strict, which the code built before it does not yet satisfy.
from google.protobuf.message import Message  # type: ignore[import-untyped]
from yarl import URL

from ...core.model import ReadyView
from ...errors import SchedulerError
from ...proto.cronoq.v1 import cronoq_pb2 as pb
from ..config import ConfigError, SocketAddress, TlsSettings
from ..hosts import loopback_host
from ..metrics import CONTENT_TYPE, ServerMetrics
from . import json_messages, misdirected
from .calls import Aborted, Call
from .host import HttpHost
from .routes import JSON_CONTENT_TYPE, Gateway, HttpError, Route, json_answer

__all__ = [
    "ROUTES",
    "Authorize",
    "HttpError",
    "HttpListener",
    "Route",
    "loopback_host",
    "ssl_context",
]

log = logging.getLogger("cronoq.server")

Authorize = Callable[[web.Request, "Route"], Awaitable[None]]
"""The authentication slot, where `cronoq.server.auth` plugs in: resolve the request's
credentials (`Authenticator.authenticate` of the `Authorization` header, or of the client
certificate's DNS names from `request.transport.get_extra_info("peercert")`), check
`auth.allowed(principal, route.method)` (the gRPC method whose roles the route shares), raise
HttpError 401 or 403 to refuse, else `auth.use_principal(principal)`: the middleware runs in
the handler's task, so the servicers see that caller. It runs after the Host check and before
readiness and the body. Routes whose `method` is None (health, readiness, the OpenAPI
document) skip it, and so does the metrics listener (docs/http.md, "Checks, in order")."""

TEXT_CONTENT_TYPE = "text/plain"

# The texts of the listener's own refusals (docs/http.md, "Errors").
NO_ROUTE = "no such route"
NO_METHOD = "method not allowed"
NOT_LEADER = "not the leader (standby or shutting down)"
NOT_LOOPBACK = "without auth the API only answers requests for a loopback host"
CROSS_SITE = "a page of another origin may not change anything here"
NOT_JSON = "a request body must be sent as Content-Type: application/json"
# The methods that change something: refused from another origin (docs/http.md, "Cross-site
# requests"). Reads stay open: without CORS headers the browser keeps their answers from the page.
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# aiohttp's default lingering time: after answering a request whose body was not read (a 401 or
# a 413 sent before it), how long the server reads and discards what more arrives before it
# closes the connection (so that a client still sending sees the answer rather than a reset).
# Capped at limits.request_timeout_s.
LINGER_S = 10.0
# After an answer that closes the connection (a 408 for a body that did not arrive in time, a
# 400 for a body that cannot be read): how long the server still reads and discards what
# arrives, its own side already closed, before it closes (`_answer_and_close`). Capped at
# limits.request_timeout_s.
CLOSE_LINGER_S = 1.0
# A standby's connections (docs/http.md, "Connections on a standby"): closed once this old, as
# seen by a sweep every RECYCLE_EVERY_S (so between RECYCLE_S and RECYCLE_S + RECYCLE_EVERY_S).
RECYCLE_S = 1.0
RECYCLE_EVERY_S = 0.2
# The /readyz header of a standby: why it does not serve (printable ASCII, at most this long).
STANDBY_REASON = "Cronoq-Standby-Reason"
MAX_REASON_LEN = 256


def _invalid(message: str) -> HttpError:
    return HttpError(400, message)


# Every route's call runs under limits.request_timeout_s; these may also wait, so theirs is
# request_timeout_s + max_wait_s: a wait (capped by max_wait_s) or a submit held by a full
# overflow="wait" pool (docs/http.md, "Timeouts"). Over gRPC, the call's own deadline does.
WAITING = frozenset(
    {"/cronoq.v1.Tasks/Submit", "/cronoq.v1.Tasks/SubmitBatch", "/cronoq.v1.Tasks/Wait"}
)


UnaryHandler = Callable[[Message, Call], Awaitable[Message]]
Endpoint = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- the listener -----------------------------------------------------------------------------


class HttpListener:
    """The HTTP listener of one ServerApp, and its metrics listener when `metrics_addr` is set.

    Started by `ServerApp.listen()` (on a standby too), stopped by `ServerApp.stop()` after the
    gRPC drain. `routes`: what `http_addr` serves (ROUTES, and the dashboard's when it is on).
    `authorize` is the authentication slot (see `Authorize`); None while no credentials are
    configured.
    """

    def __init__(
        self,
        app: HttpHost,
        routes: Sequence[Route],
        *,
        authorize: Authorize | None = None,
        ssl_context: ssl.SSLContext | None = None,
        drain_s: float = 5.0,
    ) -> None:
        self.app = app
        self.routes = tuple(routes)
        self.metrics = ServerMetrics()
        self._authorize = authorize
        self._ssl = ssl_context
        self._drain_s = drain_s
        self._runners: list[web.AppRunner] = []
        self._recycler = _Recycler(lambda: app.standing_by)
        self._sweeping: asyncio.Task[None] | None = None

    # --- life cycle ---

    async def start(self) -> tuple[SocketAddress, SocketAddress | None]:
        """Bind `http_addr` (and `metrics_addr`, plain HTTP: it is meant for an internal
        network); their addresses with the bound ports. OSError if one cannot be bound, with
        nothing left listening."""
        server = self.app.cfg.server
        try:
            http = await self._bind(self.routes, server.http_addr, ssl_context=self._ssl)
            metrics = None
            if server.metrics_addr is not None:
                metrics = await self._bind(METRICS_ROUTES, server.metrics_addr, metrics_only=True)
        except BaseException:
            await self.stop()
            raise
        self._sweeping = asyncio.get_running_loop().create_task(
            self._recycler.sweep([r.server for r in self._runners if r.server is not None])
        )
        return http, metrics

    async def stop(self) -> None:
        """Close the listeners; requests still open get `drain_s` to finish."""
        sweeping, self._sweeping = self._sweeping, None
        if sweeping is not None:
            sweeping.cancel()
            await asyncio.wait([sweeping])
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    async def _bind(
        self,
        routes: Iterable[Route],
        address: SocketAddress,
        *,
        ssl_context: ssl.SSLContext | None = None,
        metrics_only: bool = False,
    ) -> SocketAddress:
        web_app = self._web_app(routes, address, metrics_only)
        read_s = self.app.cfg.limits.request_timeout_s
        runner = web.AppRunner(
            web_app,
            access_log=None,
            shutdown_timeout=self._drain_s,
            # the header timeout and the idle limit (see the module docstring)
            keepalive_timeout=read_s,
            lingering_time=min(LINGER_S, read_s),
            # a client that goes away cancels its route, as over gRPC: a submit held by a full
            # pool then leaves its line instead of admitting a task nobody waits for
            handler_cancellation=True,
        )
        await runner.setup()
        self._runners.append(runner)
        # a gRPC client on this port is told where gRPC is (docs/http.md, "gRPC on the HTTP port")
        site = misdirected.Site(
            runner,
            address.host,
            address.port,
            lambda: self.app.grpc_address,
            ssl_context=ssl_context,
        )
        try:
            await site.start()
        except OSError as exc:
            raise OSError(f"cannot listen on {address}: {exc.strerror or exc}") from None
        return SocketAddress(address.host, runner.addresses[0][1])

    def _web_app(
        self, routes: Iterable[Route], address: SocketAddress, metrics_only: bool
    ) -> web.Application:
        """The metrics listener (`metrics_only`) has neither the Host check nor credentials, and
        answers a path it does not serve with a bare 404."""
        middlewares = [self._recycler.middleware, self._bare_404 if metrics_only else self._errors]
        cfg = self.app.cfg
        if not (metrics_only or cfg.auth.enabled or cfg.server.insecure_no_auth):
            middlewares.append(self._host_check)
        if not metrics_only:
            middlewares.append(self._same_origin)
        if self._authorize is not None and not metrics_only:
            middlewares.append(self._authenticate)
        middlewares += [self._ready_gate, self._body_checks, self._read_body]
        limit = cfg.limits.max_http_body_bytes
        web_app = web.Application(middlewares=middlewares, client_max_size=limit)
        for route in routes:
            web_app.router.add_route(route.verb, route.path, self._endpoint(route))
        return web_app

    def _endpoint(self, route: Route) -> Endpoint:
        async def endpoint(request: web.Request) -> web.StreamResponse:
            return await route.handler(self, request)

        endpoint.route = route  # type: ignore[attr-defined]  # for the middlewares
        return endpoint

    # --- middlewares, outermost first ---

    @web.middleware
    async def _errors(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """Every refusal as a JSON error, aiohttp's own (404, 405, 413) included."""
        try:
            return await handler(request)
        except HttpError as e:
            if e.close:
                linger_s = min(CLOSE_LINGER_S, self.app.cfg.limits.request_timeout_s)
                return await _answer_and_close(request, e.response(), linger_s)
            return e.response()
        except json_messages.BadRequest as e:
            return HttpError(400, str(e)).response()
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return _of_aiohttp(e, self.app.cfg.limits.max_http_body_bytes).response()
        except Exception as e:  # a bug: still a JSON answer, and logged
            log.exception("unexpected error serving an HTTP request", exc_info=e)
            return HttpError(500, f"internal error: {type(e).__name__}").response()

    @web.middleware
    async def _bare_404(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """The metrics listener's `_errors`: a path it does not serve is a 404 with no body."""
        unserved = request.match_info.http_exception
        if unserved is not None and unserved.status == 404:
            return web.Response(status=404)
        return await self._errors(request, handler)

    @web.middleware
    async def _host_check(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """With no credential configured, only a loopback Host, so that a web page cannot reach
        the API through DNS rebinding (docs/http.md, "Host check"). Probes and the 404 and 405
        of unserved paths and methods are exempt."""
        if _checked(request):
            host = request.headers.get(hdrs.HOST)
            if host is None or not loopback_host(host):
                raise HttpError(403, NOT_LOOPBACK)
        return await handler(request)

    @web.middleware
    async def _same_origin(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """A write that a browser says comes from a page of another origin is 403, credentials
        or not (a browser sends a client certificate on its own): no "simple" request from
        another site, which a browser sends without asking the server first, changes anything
        (docs/http.md, "Cross-site requests")."""
        if request.method in WRITES and _checked(request) and _cross_origin(request):
            raise HttpError(403, CROSS_SITE)
        return await handler(request)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        route = _route_of(request)
        if route is not None and route.method is not None and self._authorize is not None:
            await self._authorize(request, route)
        return await handler(request)

    @web.middleware
    async def _ready_gate(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        route = _route_of(request)
        if route is not None and route.api and not self.app.ready:
            raise HttpError(503, NOT_LEADER)
        return await handler(request)

    @web.middleware
    async def _body_checks(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """Refuse a declared oversized body unread (413; a chunked one is cut off by aiohttp's
        `client_max_size`, the same limit, as it is read), then a body not declared JSON (415):
        the types a page may send another origin without a CORS preflight are not JSON."""
        limit = self.app.cfg.limits.max_http_body_bytes
        declared = request.content_length
        if _checked(request) and declared is not None and declared > limit:
            raise HttpError(413, _too_large(limit))
        if _checked(request) and request.body_exists and not _json_declared(request):
            raise HttpError(415, NOT_JSON)
        return await handler(request)

    @web.middleware
    async def _read_body(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """Read the body whole within `limits.request_timeout_s`, else 408 and the connection
        closed. aiohttp keeps what `read()` returned, so the route's own `read()` gets the same
        bytes at once; the route's work after that (a wait) is not timed."""
        if request.body_exists and _checked(request):
            seconds = self.app.cfg.limits.request_timeout_s
            try:
                async with asyncio.timeout(seconds):
                    await request.read()
            except TimeoutError:
                message = (
                    f"the request body did not arrive within limits.request_timeout_s"
                    f" ({seconds:g} s)"
                )
                raise HttpError(408, message, close=True) from None
            except web.RequestPayloadError as e:  # bad chunked framing or compression
                message = "the body cannot be read: " + " ".join(str(e).split())
                raise HttpError(400, message, close=True) from None
            except ConnectionResetError:  # the client left; nobody reads the answer
                message = "the connection closed before the body arrived"
                raise HttpError(400, message, close=True) from None
        return await handler(request)

    # --- for the routes ---

    async def call(
        self, request: web.Request, method: str, message: Message, *, own_shard: bool = False
    ) -> Message:
        """Run the gRPC handler of `method` on `message`; a refusal becomes an HttpError.
        `own_shard`: answered from this server's shard only, as a forwarded call is."""
        handler = self.app.methods.get(method)
        if handler is None or handler.unary_unary is None:
            raise HttpError.of_grpc(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served")
        run = cast(UnaryHandler, handler.unary_unary)
        limits = self.app.cfg.limits
        bound = limits.request_timeout_s + (limits.max_wait_s if method in WAITING else 0.0)
        timer = asyncio.timeout(bound)
        try:
            async with timer:
                return await run(message, Call(request.headers.items(), bound, own_shard=own_shard))
        except Aborted as e:
            raise HttpError.of_grpc(e.code, e.details) from None
        except TimeoutError:
            if not timer.expired():
                raise  # not our bound: a handler's own, an error like any other
            raise HttpError(504, "request timed out") from None

    async def answer(
        self,
        request: web.Request,
        method: str,
        message: Message,
        shape: Callable[[Any], Any],
    ) -> web.Response:
        """Call `method` and answer its response in the JSON `shape` of the route."""
        return json_answer(shape(await self.call(request, method, message)))

    async def snapshot(self, request: web.Request) -> pb.SnapshotResponse | None:
        """The Admin snapshot of this server's own pools (a sharded server's metrics do not ask
        the other shards); None unless serving (a standby, or a stop racing the scrape)."""
        if not self.app.ready:
            return None
        try:
            snap = await self.call(request, "/cronoq.v1.Admin/Snapshot", pb.Empty(), own_shard=True)
        except HttpError:
            return None
        return cast(pb.SnapshotResponse, snap)


class _Recycler:
    """A standby's connection recycling (docs/http.md, "Connections on a standby").

    `sweep` looks at the listeners' connections every RECYCLE_EVERY_S and notes when it first
    saw each one (also while leading: a server that becomes a standby then closes its older
    connections at its first sweep); it forgets those that have gone. While `standing_by()`, a
    connection at least RECYCLE_S old is closed: at once if no request of it is being answered
    (an idle one, or one whose request is not complete yet), else once its answer is sent
    (`RequestHandler.close`, which aiohttp honours after the current request). The middleware
    counts the requests being answered on each connection, and gives an answer that goes out on
    a connection due for closing the header `Connection: close`. (A request pipelined behind
    one just answered may be cut when a sweep falls between the two.)
    """

    def __init__(self, standing_by: Callable[[], bool]) -> None:
        self._standing_by = standing_by
        # (plain dicts: aiohttp's RequestHandler takes no weak references)
        self._seen: dict[RequestHandler, float] = {}
        self._busy: dict[RequestHandler, int] = {}

    def _due(self, conn: RequestHandler, now: float) -> bool:
        return self._standing_by() and now - self._seen.setdefault(conn, now) >= RECYCLE_S

    async def sweep(self, servers: list[web.Server]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._sweep_once(servers, loop.time())
            except Exception:  # a bug: logged, and the next sweep tries again
                log.exception("recycling the standby's HTTP connections failed")
            await asyncio.sleep(RECYCLE_EVERY_S)

    def _sweep_once(self, servers: list[web.Server], now: float) -> None:
        conns = [conn for server in servers for conn in server.connections]
        self._seen = {conn: self._seen.get(conn, now) for conn in conns}
        for conn in conns:
            if self._due(conn, now):
                if self._busy.get(conn, 0):
                    conn.close()  # after the answer being written
                else:
                    conn.force_close()  # idle, or its request not complete yet

    @web.middleware
    async def middleware(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        conn = request.protocol
        if not isinstance(conn, RequestHandler):  # (always one, for aiohttp's web server)
            return await handler(request)
        self._busy[conn] = self._busy.get(conn, 0) + 1
        try:
            response = await handler(request)
        finally:
            if self._busy[conn] > 1:
                self._busy[conn] -= 1
            else:
                del self._busy[conn]
        if self._due(conn, asyncio.get_running_loop().time()) and not response.prepared:
            response.force_close()
        return response


async def _answer_and_close(
    request: web.Request, response: web.Response, linger_s: float
) -> web.Response:
    """Send `response`, end the sending side (a TCP half-close; TLS has none), then read and
    discard what more arrives until the client closes or for `linger_s`, and close. Closing
    with unread bytes would reset the connection, and a reset can destroy the answer before a
    client still sending reads it; the short bound keeps a stalled body from holding the
    connection much past its 408 (docs/http.md, "Timeouts")."""
    await response.prepare(request)
    await response.write_eof()
    transport = request.transport
    if transport is not None and transport.can_write_eof():
        transport.write_eof()
    with contextlib.suppress(TimeoutError, web.RequestPayloadError, ConnectionError):
        async with asyncio.timeout(linger_s):
            while await request.content.readany():
                pass
    request.protocol.force_close()  # the transport sends what it holds, then closes
    return response


def _route_of(request: web.Request) -> Route | None:
    """The request's route; None for aiohttp's 404 and 405 of unserved paths and methods."""
    return getattr(request.match_info.handler, "route", None)


def _checked(request: web.Request) -> bool:
    """Does the request go through the checks? Not a probe's, nor an unserved one's."""
    route = _route_of(request)
    return route is not None and not route.probe


def _cross_origin(request: web.Request) -> bool:
    """Does the browser that sent `request` say a page of another origin made it? Its
    `Sec-Fetch-Site` is not `same-origin` (nor `none`, a request the user made), or its `Origin`
    (`null` included) names another host or port than the request's `Host` (whose port, if it
    has none, is the default of the origin's scheme: a proxy may end TLS). Clients other than
    browsers send neither header."""
    site = request.headers.get("Sec-Fetch-Site", "none").lower()
    if site not in ("same-origin", "none"):
        return True
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None:
        return False
    try:
        theirs = URL(origin)
        # the Host as the origin's scheme would name it: a default port implied alike
        ours = URL.build(scheme=theirs.scheme, authority=request.host)
    except ValueError:
        return True
    return not theirs.absolute or (theirs.host, theirs.port) != (ours.host, ours.port)


def _json_declared(request: web.Request) -> bool:
    """`Content-Type: application/json`, with parameters (`; charset=utf-8`) or not."""
    declared = request.headers.get(hdrs.CONTENT_TYPE, "")
    return declared.split(";", 1)[0].strip().lower() == JSON_CONTENT_TYPE


def _too_large(limit: int) -> str:
    return f"the body exceeds limits.max_http_body_bytes ({limit} bytes)"


def _of_aiohttp(e: web.HTTPException, limit: int) -> HttpError:
    """aiohttp's own refusal as ours: no route (404), another method (405, keeping the Allow
    header: the methods the path does take), a chunked body past the limit (413)."""
    if e.status == 404:
        return HttpError(404, NO_ROUTE)
    if e.status == 405:
        allow = {"Allow": e.headers[hdrs.ALLOW]} if hdrs.ALLOW in e.headers else None
        return HttpError(405, NO_METHOD, allow)
    if e.status == 413:
        return HttpError(413, _too_large(limit))
    return HttpError(e.status, e.reason)


async def _body(request: web.Request) -> Any:
    """The request's JSON body, any content type (an empty body reads as `{}`); 413 past the
    limit while reading, 400 if it is not strict JSON (json_messages.loads)."""
    raw = await request.read()
    try:
        return json_messages.loads(raw) if raw else {}
    except json_messages.BadRequest:
        raise
    except ValueError as e:
        raise _invalid(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise _invalid("the body is not JSON this server reads: nested too deeply") from None


def _task_ref(request: web.Request) -> pb.TaskRef:
    """The task of a `{id}` or `{key}` route; `{key}` arrives percent-decoded."""
    info = request.match_info
    if "id" in info:
        return pb.TaskRef(id=json_messages.path_id(info["id"]))
    return pb.TaskRef(key=info["key"])


# --- routes -----------------------------------------------------------------------------------


def _text(text: str, status: int = 200) -> web.Response:
    """A probe's plain-text answer (no trailing newline); aiohttp sends no body to a HEAD."""
    return web.Response(text=text, status=status, content_type=TEXT_CONTENT_TYPE)


async def healthz(gw: Gateway, request: web.Request) -> web.Response:
    return _text("ok")


async def readyz(gw: Gateway, request: web.Request) -> web.Response:
    """`ready`, or 503 `standby` with the reason in a header (the body stays as scripts grep)."""
    reason = gw.app.unready_reason
    if reason is None:
        return _text("ready")
    response = _text("standby", 503)
    response.headers[STANDBY_REASON] = header_text(reason)
    return response


def header_text(text: str) -> str:
    """`text` fit for a header value: printable ASCII (anything else becomes `?`, line breaks
    and tabs a space), at most MAX_REASON_LEN characters."""
    cleaned = "".join(
        c if " " <= c <= "~" else (" " if c in "\t\r\n" else "?") for c in text
    ).strip()
    if len(cleaned) > MAX_REASON_LEN:
        cleaned = cleaned[: MAX_REASON_LEN - 3] + "..."
    return cleaned


async def metrics(gw: Gateway, request: web.Request) -> web.Response:
    """503 unless this server serves: a standby's scrape fails, as the published server's."""
    snap = await gw.snapshot(request)
    if snap is None:
        raise HttpError(503, NOT_LEADER)
    response = web.Response(body=gw.metrics.render(snap, _ready(gw)))
    response.headers[hdrs.CONTENT_TYPE] = CONTENT_TYPE
    return response


def _ready(gw: Gateway) -> tuple[list[ReadyView], float] | None:
    """The serving engine's ready queues (Engine.ready_view) and the scheduler's now, read
    after the snapshot in the same scrape; None if the session ended meanwhile."""
    scheduler = gw.app.scheduler
    try:
        return scheduler.serving().ready_view(), scheduler.clock()
    except (RuntimeError, SchedulerError):
        return None


async def openapi(gw: Gateway, request: web.Request) -> web.Response:
    return json_answer(openapi_document())


async def snapshot(gw: Gateway, request: web.Request) -> web.Response:
    return await gw.answer(
        request, "/cronoq.v1.Admin/Snapshot", pb.Empty(), json_messages.snapshot_answer
    )


async def submit(gw: Gateway, request: web.Request) -> web.Response:
    """A task object plus `wait` and `wait_timeout_s`; `result` only when it waited."""
    message = json_messages.submit_request(await _body(request))
    return await gw.answer(
        request,
        "/cronoq.v1.Tasks/Submit",
        message,
        lambda resp: json_messages.submit_answer(resp, waited=message.wait),
    )


async def submit_batch(gw: Gateway, request: web.Request) -> web.Response:
    limit = gw.app.cfg.limits.max_tasks_per_batch
    message = json_messages.batch_request(await _body(request), limit)
    return await gw.answer(
        request, "/cronoq.v1.Tasks/SubmitBatch", message, json_messages.batch_answer
    )


async def list_tasks(gw: Gateway, request: web.Request) -> web.Response:
    message = json_messages.list_request(request.query)
    return await gw.answer(
        request, "/cronoq.v1.Tasks/ListTasks", message, json_messages.list_answer
    )


async def get_task(gw: Gateway, request: web.Request) -> web.Response:
    message = pb.GetRequest(task=_task_ref(request))
    return await gw.answer(request, "/cronoq.v1.Tasks/Get", message, json_messages.task_info)


async def cancel_task(gw: Gateway, request: web.Request) -> web.Response:
    """`{"cancelled": false}` for a task that has ended and for one that does not exist
    (which a pool-restricted caller's Cancel answers NOT_FOUND)."""
    message = pb.CancelRequest(task=_task_ref(request))
    try:
        response = await gw.call(request, "/cronoq.v1.Tasks/Cancel", message)
    except HttpError as e:
        if e.status != 404:
            raise
        return json_answer({"cancelled": False})
    return json_answer({"cancelled": response.cancelled})


async def wait_task(gw: Gateway, request: web.Request) -> web.Response:
    """Waits up to `timeout_s`, capped by (and by default) `limits.max_wait_s`; 504 when it
    runs out, the task left as it is."""
    message = pb.WaitRequest(task=_task_ref(request))
    timeout = json_messages.timeout_query(request.query)
    if timeout is not None:
        message.timeout_s = timeout
    return await gw.answer(request, "/cronoq.v1.Tasks/Wait", message, json_messages.task_result)


async def list_workers(gw: Gateway, request: web.Request) -> web.Response:
    return await gw.answer(
        request, "/cronoq.v1.Admin/ListWorkers", pb.Empty(), json_messages.workers_answer
    )


async def list_recurring(gw: Gateway, request: web.Request) -> web.Response:
    return await gw.answer(
        request, "/cronoq.v1.Admin/ListRecurring", pb.Empty(), json_messages.recurring_answer
    )


async def add_recurring(gw: Gateway, request: web.Request) -> web.Response:
    message = json_messages.recurring_request(await _body(request))
    return await gw.answer(request, "/cronoq.v1.Admin/AddRecurring", message, lambda _: {})


async def remove_recurring(gw: Gateway, request: web.Request) -> web.Response:
    message = pb.RemoveRecurringRequest(name=request.match_info["name"])
    return await gw.answer(
        request,
        "/cronoq.v1.Admin/RemoveRecurring",
        message,
        lambda resp: {"removed": resp.removed},
    )


async def pause_pool(gw: Gateway, request: web.Request) -> web.Response:
    message = json_messages.pool_request(request.match_info["pool"], await _body(request))
    return await gw.answer(request, _O + "PausePool", message, json_messages.pool_control_answer)


async def resume_pool(gw: Gateway, request: web.Request) -> web.Response:
    message = json_messages.pool_request(request.match_info["pool"], await _body(request))
    return await gw.answer(request, _O + "ResumePool", message, json_messages.pool_control_answer)


async def search_tasks(gw: Gateway, request: web.Request) -> web.Response:
    message = json_messages.search_request(await _body(request))
    return await gw.answer(request, _O + "SearchTasks", message, json_messages.search_answer)


async def bulk_tasks(gw: Gateway, request: web.Request) -> web.Response:
    message = json_messages.bulk_request(await _body(request))
    return await gw.answer(
        request,
        _O + "BulkTasks",
        message,
        lambda resp: json_messages.bulk_answer(resp, message),
    )


_T = "/cronoq.v1.Tasks/"
_A = "/cronoq.v1.Admin/"
_O = "/cronoq.v1.Operations/"

# The routes of docs/http.md, "Routes": the published server's, then our extras (the OpenAPI
# document, recurring writes, the older task routes as aliases with the same answers, and the
# Operations service's).
# aiohttp tries paths in this order, so `/v1/tasks/by-key/...` comes before `/v1/tasks/{id}`.
# /metrics shares Snapshot's roles (metrics, admin): it publishes the snapshot's figures.
ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", healthz, None, api=False, probe=True),
    Route("HEAD", "/healthz", healthz, None, api=False, probe=True),
    Route("GET", "/readyz", readyz, None, api=False, probe=True),
    Route("HEAD", "/readyz", readyz, None, api=False, probe=True),
    Route("GET", "/metrics", metrics, _A + "Snapshot"),
    Route("GET", "/v1/snapshot", snapshot, _A + "Snapshot"),
    Route("GET", "/v1/workers", list_workers, _A + "ListWorkers"),
    Route("GET", "/v1/recurring", list_recurring, _A + "ListRecurring"),
    Route("POST", "/v1/tasks", submit, _T + "Submit"),
    Route("GET", "/v1/tasks", list_tasks, _T + "ListTasks"),
    Route("POST", "/v1/tasks:batch", submit_batch, _T + "SubmitBatch"),
    Route("GET", "/v1/tasks/by-key/{key}", get_task, _T + "Get"),
    Route("DELETE", "/v1/tasks/by-key/{key}", cancel_task, _T + "Cancel"),
    Route("GET", "/v1/tasks/by-key/{key}/result", wait_task, _T + "Wait"),
    Route("GET", "/v1/tasks/{id}", get_task, _T + "Get"),
    Route("DELETE", "/v1/tasks/{id}", cancel_task, _T + "Cancel"),
    Route("GET", "/v1/tasks/{id}/result", wait_task, _T + "Wait"),
    # ours
    Route("GET", "/v1/openapi.json", openapi, None, api=False),
    Route("POST", "/v1/recurring", add_recurring, _A + "AddRecurring"),
    Route("DELETE", "/v1/recurring/{name}", remove_recurring, _A + "RemoveRecurring"),
    Route("POST", "/v1/tasks/batch", submit_batch, _T + "SubmitBatch"),
    Route("POST", "/v1/tasks/by-key/{key}/cancel", cancel_task, _T + "Cancel"),
    Route("GET", "/v1/tasks/by-key/{key}/wait", wait_task, _T + "Wait"),
    Route("POST", "/v1/tasks/{id}/cancel", cancel_task, _T + "Cancel"),
    Route("GET", "/v1/tasks/{id}/wait", wait_task, _T + "Wait"),
    Route("POST", "/v1/tasks/search", search_tasks, _O + "SearchTasks"),
    Route("POST", "/v1/tasks/bulk", bulk_tasks, _O + "BulkTasks"),
    Route("POST", "/v1/pools/{pool}/pause", pause_pool, _O + "PausePool"),
    Route("POST", "/v1/pools/{pool}/resume", resume_pool, _O + "ResumePool"),
)


# The metrics listener's (docs/http.md, "Metrics listener").
METRICS_ROUTES = tuple(r for r in ROUTES if r.path in ("/metrics", "/healthz", "/readyz"))


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3 description of ROUTES, shipped as package data (openapi.json)."""
    text = resources.files("cronoq.server").joinpath("openapi.json").read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))


def ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """TLS for the HTTP listener from `[server.tls]`; with `client_ca`, client certificates
    are required (docs/configuration.md, "[server]"). ConfigError for files that cannot be used,
    found before anything is bound."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            [f"server.tls: cannot use {tls.cert!r} and {tls.key!r} ({exc})"]
        ) from None
    if tls.client_ca is not None:
        try:
            context.load_verify_locations(tls.client_ca)
        except (OSError, ssl.SSLError) as exc:
            message = f"server.tls.client_ca: cannot use {tls.client_ca!r} ({exc})"
            raise ConfigError([message]) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context
