"""What the HTTP front's routes share with the dashboard's, which the same listener serves:
the route table's row, the refusal every route may raise, the JSON answer, and `Gateway`, what
a route reads of the listener (so that the dashboard needs no import of the HTTP front)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from aiohttp import hdrs, web

# Untyped for mypy: types-protobuf would type it, but it also makes the generated message
# classes strict, which the code built before it does not yet satisfy.
from google.protobuf.message import Message  # type: ignore[import-untyped]

from ...proto.cronoq.v1 import cronoq_pb2 as pb
from ..metrics import ServerMetrics
from . import json_messages
from .host import HttpHost

JSON_CONTENT_TYPE = "application/json"

# docs/http.md, "Errors": the HTTP status of each gRPC status code; any other is 500.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,  # a payload over limits.max_message_bytes
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class Gateway(Protocol):
    """What a route reads of the listener that serves it (`http_api.HttpListener`)."""

    @property
    def app(self) -> HttpHost: ...

    @property
    def metrics(self) -> ServerMetrics: ...

    async def call(
        self, request: web.Request, method: str, message: Message, *, own_shard: bool = False
    ) -> Message: ...

    async def answer(
        self,
        request: web.Request,
        method: str,
        message: Message,
        shape: Callable[[Any], Any],
    ) -> web.Response: ...

    async def snapshot(self, request: web.Request) -> pb.SnapshotResponse | None: ...


Handler = Callable[[Gateway, web.Request], Awaitable[web.StreamResponse]]


class HttpError(Exception):
    """Ends a request with `status` and `{"error": message, "code": <the status's reason>}`
    (`code` is a function of the status alone); a 401 also carries `WWW-Authenticate: Bearer`.
    With `close`, the answer carries `Connection: close` and the connection ends after it."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
        *,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.close = close

    @property
    def code(self) -> str:
        return json_messages.reason(self.status)

    @classmethod
    def of_grpc(cls, code: grpc.StatusCode, message: str) -> HttpError:
        return cls(HTTP_STATUS.get(code, 500), message)

    def response(self) -> web.Response:
        response = json_answer({"error": self.message, "code": self.code}, status=self.status)
        response.headers.update(self.headers or {})
        if self.status == 401:
            response.headers[hdrs.WWW_AUTHENTICATE] = "Bearer"
        if self.close:
            response.force_close()  # aiohttp then sends `Connection: close`
        return response


def json_answer(data: Any, status: int = 200) -> web.Response:
    """A JSON answer: `content-type: application/json`, keys sorted."""
    return web.Response(
        body=json_messages.dumps(data), status=status, content_type=JSON_CONTENT_TYPE
    )


@dataclass(frozen=True)
class Route:
    """One row of the route table (docs/http.md, "Routes"). `path` is in OpenAPI form (`{id}`
    is a task id, checked by the route: anything else is 400, not 404); `method` is the gRPC
    method it mirrors, whose roles it requires (None: no credentials needed); `api` routes
    answer 503 unless the server serves; `probe` routes (health, readiness) skip every check,
    the Host check included."""

    verb: str
    path: str
    handler: Handler
    method: str | None
    api: bool = True
    probe: bool = False
