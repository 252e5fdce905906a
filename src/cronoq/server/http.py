"""The HTTP listener (docs/http.md): health, readiness, metrics, the Admin snapshot and a JSON
API that mirrors the gRPC calls.

The API runs no logic of its own. Each route builds the request message of the gRPC method it
mirrors (proto3 JSON via `google.protobuf.json_format`) and calls the very handler the app's
registrars gave the gRPC listener (`ServerApp.methods`), with `_Call` standing in for the
servicer context: what tasks.py uses of it (`abort`, `invocation_metadata`, `time_remaining`).
The answer goes back as JSON, and a gRPC status as `{"error": {"code", "message"}}` with the
HTTP status of docs/http.md, "Errors". So both listeners validate, refuse and answer alike.

JSON shapes (docs/http.md, "JSON"): the proto field names; task and worker ids as strings (u64 ids
exceed JavaScript's integers), other 64-bit integers (times in ns, counters) as numbers; enums by
their lower-case short names (`"succeeded"`, `"high"`; requests may also use the full names or
numbers); bytes in base64; every field present, an unset optional one as null. A TaskSpec may carry
`json` (any JSON value, sent as the payload with content type `application/json`) instead of
`payload`.

Checks run as middlewares in the order of docs/http.md, "Checks, in order", all before the body
is read: the Host header (only with auth disabled on a loopback listener), authentication (the
`authorize` slot), readiness for API routes (503 on a standby or while stopping), then the body
limit (`limits.max_http_body_bytes`, 413).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, NoReturn, cast

import grpc
from aiohttp import hdrs, web

# Untyped for mypy: types-protobuf would type them, but it also makes the generated message
# classes strict, which the code built before it does not yet satisfy.
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import Message  # type: ignore[import-untyped]

from ..proto.cronoq.v1 import cronoq_pb2 as pb
from .config import ConfigError, SocketAddress, TlsSettings
from .metrics import CONTENT_TYPE, ServerMetrics

if TYPE_CHECKING:
    from .app import ServerApp

__all__ = ["ROUTES", "Authorize", "HttpError", "HttpListener", "Route", "ssl_context"]

Handler = Callable[["HttpListener", web.Request], Awaitable[web.StreamResponse]]
Authorize = Callable[[web.Request, "Route"], Awaitable[None]]
"""The authentication slot, where `cronoq.server.auth` plugs in: resolve the request's
credentials (`Authenticator.authenticate` of the `Authorization` header, or of the client
certificate's DNS names from `request.transport.get_extra_info("peercert")`), check
`auth.allowed(principal, route.method)` (the gRPC method whose roles the route shares), raise
HttpError 401 or 403 to refuse, else `auth.use_principal(principal)`: the middleware runs in
the handler's task, so the servicers see that caller. It runs after the Host check and before
readiness and the body. Routes whose `method` is None (health, readiness, the OpenAPI
document) skip it, and so does the metrics listener (docs/http.md, "Checks, in order")."""

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
JSON_CONTENT_TYPE = "application/json"

# docs/http.md, "Errors": the HTTP status of each gRPC status code (error bodies name the code).
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# aiohttp's own refusals, by the code their error bodies carry
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


class HttpError(Exception):
    """Ends a request with `{"error": {"code": code, "message": message}}` and `status`."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers

    @classmethod
    def of_grpc(cls, code: grpc.StatusCode, message: str) -> HttpError:
        return cls(HTTP_STATUS.get(code, 500), code.name.lower(), message)

    def response(self) -> web.Response:
        body = {"error": {"code": self.code, "message": self.message}}
        return web.json_response(body, status=self.status, headers=self.headers)


def _invalid(message: str) -> HttpError:
    return HttpError(400, "invalid_argument", message)


@dataclass(frozen=True)
class Route:
    """One row of the route table (docs/http.md). `path` is in OpenAPI form (`{id}` is a task
    id, digits only); `method` is the gRPC method it mirrors, whose roles it requires (None:
    no credentials needed); `api` routes answer 503 unless the server serves."""

    verb: str
    path: str
    handler: Handler
    method: str | None
    api: bool = True

    @property
    def aiohttp_path(self) -> str:
        return self.path.replace("{id}", r"{id:\d+}")


# --- JSON <-> messages ------------------------------------------------------------------------


def _enum_prefix(enum: Any) -> str:
    """`TASK_STATUS_` for TaskStatus: what its UNSPECIFIED value's name starts with."""
    return str(enum.values_by_number[0].name).removesuffix("UNSPECIFIED")


def _is_id(field: Any) -> bool:
    return field.name in ("id", "next_after") or field.name.endswith("_id")


def _is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _in(desc: Any, data: Mapping[str, Any]) -> dict[str, Any]:
    """Short enum names (`"high"`) to their proto3 JSON names (`"PRIORITY_HIGH"`), through
    nested messages; everything else as it is, for ParseDict to judge."""
    fields = {**{f.json_name: f for f in desc.fields}, **desc.fields_by_name}
    out: dict[str, Any] = {}
    for key, value in data.items():
        f = fields.get(key)
        if f is not None and not _is_map(f):
            convert = _value_in(f)
            repeated = f.is_repeated and isinstance(value, list)
            value = [convert(v) for v in value] if repeated else convert(value)
        out[key] = value
    return out


def _value_in(field: Any) -> Callable[[Any], Any]:
    if field.enum_type is not None:
        prefix = _enum_prefix(field.enum_type)
        names = field.enum_type.values_by_name

        def enum(v: Any) -> Any:
            if isinstance(v, str) and v not in names and prefix + v.upper() in names:
                return prefix + v.upper()
            return v

        return enum
    if field.message_type is not None:
        desc = field.message_type
        return lambda v: _in(desc, v) if isinstance(v, Mapping) else v
    return lambda v: v


def parse(data: Any, cls: type[Message]) -> Message:
    """A request message from JSON; HttpError 400 naming the problem."""
    if not isinstance(data, Mapping):
        raise _invalid(f"expected a JSON object, not {type(data).__name__}")
    try:
        return json_format.ParseDict(_in(cls.DESCRIPTOR, data), cls())
    except (json_format.ParseError, ValueError, TypeError) as e:
        raise _invalid(str(e)) from None


def to_json(msg: Message) -> dict[str, Any]:
    """The JSON form of a response message (the shapes of the module docstring)."""
    data = json_format.MessageToDict(
        msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    return _out(msg.DESCRIPTOR, data)


def _out(desc: Any, data: dict[str, Any]) -> dict[str, Any]:
    for f in desc.fields:
        if f.name not in data:
            if f.has_presence:
                data[f.name] = None
            continue
        convert = None if _is_map(f) else _value_out(f)
        if convert is not None:
            value = data[f.name]
            data[f.name] = (
                [convert(v) for v in value] if isinstance(value, list) else convert(value)
            )
    return data


def _value_out(field: Any) -> Callable[[Any], Any] | None:
    if field.enum_type is not None:
        cut = len(_enum_prefix(field.enum_type))
        return lambda v: v[cut:].lower() if isinstance(v, str) else v
    if field.message_type is not None:
        desc = field.message_type
        return lambda v: _out(desc, v)
    wide = field.cpp_type in (field.CPPTYPE_INT64, field.CPPTYPE_UINT64)
    return int if wide and not _is_id(field) else None


def _spec(data: Any, where: str) -> Any:
    """A TaskSpec's `json` value becomes its payload, with content type `application/json`
    unless one is given."""
    if not isinstance(data, Mapping) or "json" not in data:
        return data
    spec = dict(data)
    if "payload" in spec:
        raise _invalid(f"{where}: give either payload or json, not both")
    text = json.dumps(spec.pop("json"), separators=(",", ":"), ensure_ascii=False)
    spec["payload"] = base64.b64encode(text.encode()).decode("ascii")
    if "content_type" not in spec and "contentType" not in spec:
        spec["content_type"] = JSON_CONTENT_TYPE
    return spec


# --- calling the gRPC handlers ----------------------------------------------------------------


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Call:
    """The servicer context of a call from HTTP: the request's headers as metadata (so a
    `traceparent` header reaches the task, as over gRPC), no deadline (the servicers cap
    waits with `limits.max_wait_s`), and an `abort` that raises what the route answers."""

    def __init__(self, request: web.Request) -> None:
        self._metadata = tuple((k.lower(), v) for k, v in request.headers.items())

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        raise _Aborted(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None


UnaryHandler = Callable[[Message, _Call], Awaitable[Message]]
Endpoint = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- the listener -----------------------------------------------------------------------------


class HttpListener:
    """The HTTP listener of one ServerApp, and its metrics listener when `metrics_addr` is set.

    Started by `ServerApp.listen()` (on a standby too), stopped by `ServerApp.stop()` after the
    gRPC drain. `authorize` is the authentication slot (see `Authorize`); None while no
    credentials are configured.
    """

    def __init__(
        self,
        app: ServerApp,
        *,
        authorize: Authorize | None = None,
        ssl_context: ssl.SSLContext | None = None,
        drain_s: float = 5.0,
    ) -> None:
        self.app = app
        self.metrics = ServerMetrics()
        self._authorize = authorize
        self._ssl = ssl_context
        self._drain_s = drain_s
        self._runners: list[web.AppRunner] = []

    # --- life cycle ---

    async def start(self) -> tuple[SocketAddress, SocketAddress | None]:
        """Bind `http_addr` (and `metrics_addr`, plain HTTP: it is meant for an internal
        network); their addresses with the bound ports. OSError if one cannot be bound, with
        nothing left listening."""
        server = self.app.cfg.server
        try:
            http = await self._bind(ROUTES, server.http_addr, ssl_context=self._ssl)
            metrics = None
            if server.metrics_addr is not None:
                only = [r for r in ROUTES if r.path == "/metrics"]
                metrics = await self._bind(only, server.metrics_addr, metrics_only=True)
        except BaseException:
            await self.stop()
            raise
        return http, metrics

    async def stop(self) -> None:
        """Close the listeners; requests still open get `drain_s` to finish."""
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
        runner = web.AppRunner(web_app, access_log=None, shutdown_timeout=self._drain_s)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, address.host, address.port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(f"cannot listen on {address}: {exc.strerror or exc}") from None
        return SocketAddress(address.host, runner.addresses[0][1])

    def _web_app(
        self, routes: Iterable[Route], address: SocketAddress, metrics_only: bool
    ) -> web.Application:
        middlewares = [self._errors]
        if address.is_loopback and not self.app.cfg.auth.enabled:
            middlewares.append(self._host_check)
        if self._authorize is not None and not metrics_only:
            middlewares.append(self._authenticate)
        middlewares += [self._ready_gate, self._body_limit]
        limit = self.app.cfg.limits.max_http_body_bytes
        web_app = web.Application(middlewares=middlewares, client_max_size=limit)
        for route in routes:
            web_app.router.add_route(route.verb, route.aiohttp_path, self._endpoint(route))
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
            return e.response()
        except web.HTTPException as e:
            if e.status < 400:
                raise
            fallback = "invalid_argument" if e.status < 500 else "internal"
            # A 405 keeps aiohttp's Allow header: the methods the path does take.
            allow = {"Allow": e.headers[hdrs.ALLOW]} if hdrs.ALLOW in e.headers else None
            code = _HTTP_CODES.get(e.status, fallback)
            return HttpError(e.status, code, e.reason, allow).response()

    @web.middleware
    async def _host_check(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """With auth off, only a loopback Host, so that a web page cannot reach the API through DNS
        rebinding (docs/http.md, "Checks, in order")."""
        host = request.headers.get(hdrs.HOST)
        if host is None or not loopback_host(host):
            message = f"Host {host!r} is not a loopback name (authentication is off)"
            raise HttpError(403, "permission_denied", message)
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
            why = "shutting down" if self.app.stopping else "not the leader (standby)"
            raise HttpError.of_grpc(grpc.StatusCode.UNAVAILABLE, f"this server is {why}")
        return await handler(request)

    @web.middleware
    async def _body_limit(self, request: web.Request, handler: Endpoint) -> web.StreamResponse:
        """Refuse a declared oversized body unread; a chunked one is cut off by aiohttp's
        `client_max_size` (the same limit) as it is read."""
        limit = self.app.cfg.limits.max_http_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HttpError(413, "body_too_large", f"the body exceeds {limit} bytes")
        return await handler(request)

    # --- for the routes ---

    async def call(self, request: web.Request, method: str, message: Message) -> Message:
        """Run the gRPC handler of `method` on `message`; a refusal becomes an HttpError."""
        handler = self.app.methods.get(method)
        if handler is None or handler.unary_unary is None:
            raise HttpError.of_grpc(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served")
        run = cast(UnaryHandler, handler.unary_unary)
        try:
            return await run(message, _Call(request))
        except _Aborted as e:
            raise HttpError.of_grpc(e.code, e.details) from None

    async def answer(self, request: web.Request, method: str, message: Message) -> web.Response:
        return web.json_response(to_json(await self.call(request, method, message)))

    async def snapshot(self, request: web.Request) -> pb.SnapshotResponse | None:
        """The Admin snapshot; None unless serving (a standby, or a stop racing the scrape)."""
        if not self.app.ready:
            return None
        try:
            snap = await self.call(request, "/cronoq.v1.Admin/Snapshot", pb.Empty())
        except HttpError:
            return None
        return cast(pb.SnapshotResponse, snap)


def _route_of(request: web.Request) -> Route | None:
    return getattr(request.match_info.handler, "route", None)


def loopback_host(host: str) -> bool:
    """A Host header naming localhost, 127.0.0.1 or [::1], with or without a port."""
    host = host.lower()
    if host.startswith("["):
        end = host.find("]") + 1
        name, rest = host[:end], host[end:]
    else:
        name, sep, port = host.partition(":")
        rest = sep + port
    return name in LOOPBACK_HOSTS and (rest == "" or (rest[0] == ":" and rest[1:].isdigit()))


async def _body(request: web.Request) -> Any:
    """The request's JSON body (413 past the limit while reading, 400 if it is not JSON)."""
    raw = await request.read()
    try:
        return json.loads(raw or b"{}")
    except ValueError as e:
        raise _invalid(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise _invalid("the body is not JSON this server reads: nested too deeply") from None


def _task_ref(request: web.Request) -> dict[str, str]:
    info = request.match_info
    return {"id": info["id"]} if "id" in info else {"key": info["key"]}


def _query(request: web.Request, name: str) -> str | None:
    return request.query.get(name) or None


# --- routes -----------------------------------------------------------------------------------


async def healthz(gw: HttpListener, request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(gw: HttpListener, request: web.Request) -> web.Response:
    if gw.app.ready:
        return web.json_response({"status": "ready"})
    status = "stopping" if gw.app.stopping else "standby"
    return web.json_response({"status": status}, status=503)


async def metrics(gw: HttpListener, request: web.Request) -> web.Response:
    body = gw.metrics.render(await gw.snapshot(request), leader=gw.app.ready)
    response = web.Response(body=body)
    response.headers[hdrs.CONTENT_TYPE] = CONTENT_TYPE
    return response


async def openapi(gw: HttpListener, request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def snapshot(gw: HttpListener, request: web.Request) -> web.Response:
    return await gw.answer(request, "/cronoq.v1.Admin/Snapshot", pb.Empty())


async def submit(gw: HttpListener, request: web.Request) -> web.Response:
    """The body is a TaskSpec plus the SubmitRequest's own `wait` and `wait_timeout_s`."""
    body = await _body(request)
    if not isinstance(body, Mapping):
        raise _invalid("expected a JSON object (a TaskSpec plus wait, wait_timeout_s)")
    own = ("wait", "wait_timeout_s", "waitTimeoutS")
    data = {k: v for k, v in body.items() if k in own}
    data["task"] = _spec({k: v for k, v in body.items() if k not in own}, "task")
    return await gw.answer(request, "/cronoq.v1.Tasks/Submit", parse(data, pb.SubmitRequest))


async def submit_batch(gw: HttpListener, request: web.Request) -> web.Response:
    body = await _body(request)
    if isinstance(body, Mapping) and isinstance(body.get("tasks"), list):
        body = {**body, "tasks": [_spec(t, f"tasks[{i}]") for i, t in enumerate(body["tasks"])]}
    message = parse(body, pb.SubmitBatchRequest)
    return await gw.answer(request, "/cronoq.v1.Tasks/SubmitBatch", message)


async def list_tasks(gw: HttpListener, request: web.Request) -> web.Response:
    data: dict[str, Any] = {
        "pools": request.query.getall("pool", []),
        "statuses": request.query.getall("status", []),
    }
    for name in ("after", "limit"):
        if (value := _query(request, name)) is not None:
            data[name] = value
    return await gw.answer(request, "/cronoq.v1.Tasks/ListTasks", parse(data, pb.ListTasksRequest))


async def get_task(gw: HttpListener, request: web.Request) -> web.Response:
    message = parse({"task": _task_ref(request)}, pb.GetRequest)
    return await gw.answer(request, "/cronoq.v1.Tasks/Get", message)


async def cancel_task(gw: HttpListener, request: web.Request) -> web.Response:
    message = parse({"task": _task_ref(request)}, pb.CancelRequest)
    return await gw.answer(request, "/cronoq.v1.Tasks/Cancel", message)


async def wait_task(gw: HttpListener, request: web.Request) -> web.Response:
    data: dict[str, Any] = {"task": _task_ref(request)}
    if (timeout := _query(request, "timeout_s")) is not None:
        data["timeout_s"] = timeout
    return await gw.answer(request, "/cronoq.v1.Tasks/Wait", parse(data, pb.WaitRequest))


async def list_workers(gw: HttpListener, request: web.Request) -> web.Response:
    return await gw.answer(request, "/cronoq.v1.Admin/ListWorkers", pb.Empty())


async def list_recurring(gw: HttpListener, request: web.Request) -> web.Response:
    return await gw.answer(request, "/cronoq.v1.Admin/ListRecurring", pb.Empty())


async def add_recurring(gw: HttpListener, request: web.Request) -> web.Response:
    body = await _body(request)
    if isinstance(body, Mapping) and "template" in body:
        body = {**body, "template": _spec(body["template"], "template")}
    message = parse(body, pb.RecurringRequest)
    return await gw.answer(request, "/cronoq.v1.Admin/AddRecurring", message)


async def remove_recurring(gw: HttpListener, request: web.Request) -> web.Response:
    message = pb.RemoveRecurringRequest(name=request.match_info["name"])
    return await gw.answer(request, "/cronoq.v1.Admin/RemoveRecurring", message)


_T = "/cronoq.v1.Tasks/"
_A = "/cronoq.v1.Admin/"

# /metrics shares Snapshot's roles (metrics, admin): it publishes the snapshot's figures.
ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", healthz, None, api=False),
    Route("GET", "/readyz", readyz, None, api=False),
    Route("GET", "/metrics", metrics, _A + "Snapshot", api=False),
    Route("GET", "/v1/openapi.json", openapi, None, api=False),
    Route("GET", "/v1/snapshot", snapshot, _A + "Snapshot"),
    Route("POST", "/v1/tasks", submit, _T + "Submit"),
    Route("POST", "/v1/tasks/batch", submit_batch, _T + "SubmitBatch"),
    Route("GET", "/v1/tasks", list_tasks, _T + "ListTasks"),
    Route("GET", "/v1/tasks/{id}", get_task, _T + "Get"),
    Route("GET", "/v1/tasks/by-key/{key}", get_task, _T + "Get"),
    Route("POST", "/v1/tasks/{id}/cancel", cancel_task, _T + "Cancel"),
    Route("POST", "/v1/tasks/by-key/{key}/cancel", cancel_task, _T + "Cancel"),
    Route("GET", "/v1/tasks/{id}/wait", wait_task, _T + "Wait"),
    Route("GET", "/v1/tasks/by-key/{key}/wait", wait_task, _T + "Wait"),
    Route("GET", "/v1/workers", list_workers, _A + "ListWorkers"),
    Route("GET", "/v1/recurring", list_recurring, _A + "ListRecurring"),
    Route("POST", "/v1/recurring", add_recurring, _A + "AddRecurring"),
    Route("DELETE", "/v1/recurring/{name}", remove_recurring, _A + "RemoveRecurring"),
)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3 description of ROUTES, shipped as package data (openapi.json)."""
    text = resources.files(__package__).joinpath("openapi.json").read_text(encoding="utf-8")
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
