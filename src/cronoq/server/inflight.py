"""What the gRPC port holds (docs/server.md, "Transports"), kept alike on both transports.

Calls in flight: `Fullness` notes since when every place under limits.max_concurrent_requests
has been taken; a listener full for longer than FULL_S makes /readyz fail (docs/http.md, "Health
and readiness"), so that traffic goes to another server while this one cannot take a call.

Answers a client has not read: a connection may make the server hold at most
limits.max_unsent_bytes_per_connection of them. Past it, its new calls are refused with
RESOURCE_EXHAUSTED (UNREAD), and so is a unary call whose answer would take it over (one answer
always goes while the connection holds nothing). The native transport counts the bytes queued
for each connection itself (native/). On grpcio, `Ledger` counts, by peer (one per connection),
the unary answers whose calls have not ended: grpcio ends a unary call only once its answer is
out, and a streaming answer waits for the client's window before the next one anyway.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import grpc

from .config import LimitsSettings
from .decode import Context, Handler, streaming_handler

# How long the gRPC listener may stay full (refusing every new call) and still be ready.
FULL_S = 10.0
# The refusal's words on both transports (native/src/server.rs has the same).
UNREAD = (
    "this connection holds too many answers its client has not read"
    " (limits.max_unsent_bytes_per_connection)"
)


class Fullness:
    """Since when a listener has had `limit` calls in flight (its transport reports each change
    of the count); `unready` says so once that has lasted FULL_S."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._since: float | None = None
        self._count = 0

    def count(self, inflight: int) -> None:
        self._count = inflight
        if inflight < self._limit:
            self._since = None
        elif self._since is None:
            self._since = self._clock()

    @property
    def unready(self) -> str | None:
        """Why the listener cannot take calls, or None while it can (or only just stopped)."""
        if self._since is None or self._clock() - self._since < FULL_S:
            return None
        return (
            f"the gRPC listener is full: {self._count} calls in flight"
            " (limits.max_concurrent_requests)"
        )


class Load(Protocol):
    """A gRPC listener's own accounting: `NativeFront`, or grpcio's `Ledger`."""

    fullness: Fullness

    @property
    def unsent_bytes(self) -> int:
        """Answers held for clients that have not read them yet, over every connection."""
        ...


class Ledger(grpc.aio.ServerInterceptor):
    """grpcio's side of what the native transport counts itself (see the module docstring):
    calls in flight, and by peer the bytes of unary answers whose calls have not ended. It
    goes first in the chain, so that it wraps whatever handler the others give, refusals
    included."""

    def __init__(self, limits: LimitsSettings) -> None:
        self.fullness = Fullness(limits.max_concurrent_requests)
        self._budget = limits.max_unsent_bytes_per_connection
        self._inflight = 0
        self._unsent: dict[str, int] = {}

    @property
    def unsent_bytes(self) -> int:
        return sum(self._unsent.values())

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        decode = handler.request_deserializer
        if handler.unary_stream is not None or handler.stream_stream is not None:
            kind = "unary_stream" if handler.unary_stream is not None else "stream_stream"
            make: Any = getattr(grpc, f"{kind}_rpc_method_handler")
            streaming: Handler = make(
                streaming_handler(getattr(handler, kind), self._admitted),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
            return streaming
        inner: Any = handler.unary_unary or handler.stream_unary
        encode = handler.response_serializer

        async def answer(request: Any, context: Context) -> Any:
            await self._admitted(request, context)
            result = await inner(request, context)
            # sized, not serialized: a refused answer costs no copy (raw bytes without one)
            await self._hold(context, len(result) if encode is None else result.ByteSize())
            return result

        make = (
            grpc.unary_unary_rpc_method_handler
            if handler.unary_unary is not None
            else grpc.stream_unary_rpc_method_handler
        )
        unary: Handler = make(answer, request_deserializer=decode, response_serializer=encode)
        return unary

    async def _admitted(self, request: Any, context: Context) -> Any:
        """Count the call in flight until it ends; refuse it if its connection is over budget."""
        self._inflight += 1
        self.fullness.count(self._inflight)
        context.add_done_callback(cast(Any, self._ended))  # (the stubs want a class of theirs)
        if self._unsent.get(context.peer(), 0) > self._budget:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, UNREAD)
        return request

    def _ended(self, _: Any) -> None:
        self._inflight -= 1
        self.fullness.count(self._inflight)

    async def _hold(self, context: Context, size: int) -> None:
        """Count a unary answer of `size` bytes against its connection until its call ends."""
        peer = context.peer()
        held = self._unsent.get(peer, 0)
        if held and held + size > self._budget:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, UNREAD)
        self._unsent[peer] = held + size

        def sent(_: Any) -> None:
            left = self._unsent[peer] - size
            if left:
                self._unsent[peer] = left
            else:
                del self._unsent[peer]

        context.add_done_callback(cast(Any, sent))
