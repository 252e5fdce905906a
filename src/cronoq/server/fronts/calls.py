"""Calling the app's gRPC handlers from a front that grpcio does not serve (the native
transport, gRPC-Web, the HTTP API, the dashboard): `Call` stands in for the servicer context,
`CallDetails` for what interceptors read, and `resolver` runs the interceptors in grpcio's order,
so every front refuses and answers as the gRPC listener does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from ..decode import Handler
from ..services.sharding.plan import FORWARDED


class Aborted(Exception):
    """What `Call.abort` raises: the status, details and trailers for the front to answer."""

    def __init__(
        self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailers = trailers


class Call:
    """The servicer context of a call that does not come over HTTP/2 gRPC (an HTTP API route,
    a gRPC-Web request): the request's headers as metadata (so a `traceparent` header reaches
    the task, as over gRPC), a deadline of `bound_s` (None: none), an `abort` that raises
    `Aborted` for the caller to answer, and the initial metadata the handler sends, kept for
    gRPC-Web (the HTTP API answers none: docs/sharding.md, "HTTP")."""

    def __init__(
        self,
        headers: Iterable[tuple[str, str]],
        bound_s: float | None,
        *,
        own_shard: bool = False,
    ) -> None:
        metadata = [(k.lower(), v) for k, v in headers]
        if own_shard:  # answered by this server's shard alone (docs/sharding.md)
            metadata.append((FORWARDED, "1"))
        self._metadata = tuple(metadata)
        self.initial_metadata: list[tuple[str, str]] = []
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._deadline = None if bound_s is None else loop.time() + bound_s

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        raise Aborted(code, details, tuple(trailing_metadata or ()))

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        """No client certificate: these calls do not come over TLS gRPC (certificate
        authentication then finds no names and answers UNAUTHENTICATED, as grpcio would)."""
        return {}

    async def send_initial_metadata(self, metadata: Any) -> None:
        self.initial_metadata.extend(metadata)

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())


@dataclass(frozen=True)
class CallDetails:
    """What interceptors read of a call (grpc.HandlerCallDetails), for calls grpcio does not
    serve (gRPC-Web, the native transport)."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable["Handler | None"]]


def resolver(
    interceptors: Iterable[grpc.aio.ServerInterceptor], served: Continuation
) -> Callable[[CallDetails], Awaitable[Handler | None]]:
    """The handler grpcio would run for a call: `served(details)` (the app's own handler, or
    None for an unknown method) through `interceptors` in grpcio's order, outermost first."""
    continuation = served
    for interceptor in reversed(tuple(interceptors)):
        continuation = _link(interceptor, continuation)

    async def resolve(details: CallDetails) -> Handler | None:
        return await continuation(details)  # type: ignore[arg-type]

    return resolve


def _link(interceptor: grpc.aio.ServerInterceptor, inner: Continuation) -> Continuation:
    async def call(details: grpc.HandlerCallDetails) -> Handler | None:
        return await interceptor.intercept_service(inner, details)

    return call
