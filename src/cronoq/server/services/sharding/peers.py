"""The channels to the other shards (docs/sharding.md, "Forwarding"): one lazily connected
channel per peer, what may be forwarded on it, and how a peer's errors reach the caller."""

from __future__ import annotations

import asyncio
import math
from collections.abc import (
    AsyncGenerator,
)
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc

# Untyped for mypy, as in fronts/routes.py.
from google.protobuf.message import Message  # type: ignore[import-untyped]

from ...._attempt import TRACEPARENT
from ...._net import loopback
from ...._tracing import TRACESTATE
from ...auth import Principal
from ...config import ServerConfig, ShardSettings
from ...errors import Refused
from .plan import FORWARDED

Context = grpc.aio.ServicerContext[Any, Any]
_M = TypeVar("_M", bound=Message)

CONNECT_S = 5.0  # how long a call waits for a peer's connection
KEEPALIVE_MS = 20_000  # HTTP/2 pings on a peer channel
RECONNECT_MS = 2_000  # the longest wait between connection attempts to a peer
CLOSED = "its connection was closed to reach a new leader"  # see _cancelling
# Peer errors that mean "that shard cannot answer now" (docs/sharding.md, "Peer errors").
_DOWN = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN}


def _target(endpoint: str) -> tuple[str, bool]:
    """The gRPC target (host:port) of an endpoint URL, and whether it is https."""
    url = urlsplit(endpoint)
    tls = url.scheme == "https"
    host = url.hostname or ""
    port = url.port or (443 if tls else 80)
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}"), tls


class Peers:
    """One lazily connected channel per other shard, and the rules of what may be sent on it
    (docs/sharding.md, "Forwarding")."""

    def __init__(self, cfg: ServerConfig) -> None:
        self._auth = cfg.auth.enabled
        self._insecure_http = cfg.server.insecure_peer_http
        self._limits = cfg.limits
        tls = cfg.server.peer_tls
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Future[None]] = set()

    def may_forward(self, caller: Principal, shard: ShardSettings) -> bool:
        """Whether this caller's credential may be sent to `shard`: always without auth;
        a bearer token to https, to a loopback http, or anywhere with insecure_peer_http;
        never a caller known by its client certificate alone."""
        if not self._auth:
            return True
        if caller.bearer is None:
            return False
        url = urlsplit(shard.endpoint)
        return url.scheme == "https" or self._insecure_http or loopback(url.hostname or "")

    def _channel(self, shard: ShardSettings) -> grpc.aio.Channel:
        ch = self._channels.get(shard.name)
        if ch is None:
            target, tls = _target(shard.endpoint)
            size = self._limits.max_message_bytes
            options = [
                ("grpc.keepalive_time_ms", KEEPALIVE_MS),
                # a shard back from an outage is asked again within RECONNECT_MS (gRPC's
                # default backoff grows to two minutes)
                ("grpc.initial_reconnect_backoff_ms", RECONNECT_MS // 4),
                ("grpc.max_reconnect_backoff_ms", RECONNECT_MS),
                ("grpc.max_receive_message_length", size),
                ("grpc.max_send_message_length", size),
            ]
            if tls:
                ch = grpc.aio.secure_channel(target, self._credentials(), options=options)
            else:
                ch = grpc.aio.insecure_channel(target, options=options)
            self._channels[shard.name] = ch
        return ch

    def _credentials(self) -> grpc.ChannelCredentials:
        tls = self._tls

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        if tls is None:
            return grpc.ssl_channel_credentials()
        return grpc.ssl_channel_credentials(read(tls.ca), read(tls.key), read(tls.cert))

    async def _connected(self, shard: ShardSettings, ch: grpc.aio.Channel) -> None:
        """Wait up to CONNECT_S for the channel to connect or fail (a failed one fails the
        call at once, with gRPC's own reason)."""
        done = (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE)
        state = ch.get_state(try_to_connect=True)
        if state in done:
            return
        try:
            async with asyncio.timeout(CONNECT_S):
                while state not in done:
                    await ch.wait_for_state_change(state)
                    state = ch.get_state(try_to_connect=True)
        except TimeoutError:
            raise down(shard, f"no connection within {CONNECT_S:g} s") from None

    def _metadata(self, caller: Principal, context: Context) -> list[tuple[str, str]]:
        md = [(FORWARDED, "1")]
        if self._auth and caller.bearer is not None:
            md.append(("authorization", f"Bearer {caller.bearer}"))
        md.extend(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if k in (TRACEPARENT, TRACESTATE) and isinstance(v, str)
        )
        return md

    def _timeout(self, context: Context, bound: float | None) -> float:
        """`bound` (default limits.max_wait_s + request_timeout_s), or what is left of the
        caller's deadline."""
        if bound is None:
            bound = self._limits.max_wait_s + self._limits.request_timeout_s
        remaining: float | None = context.time_remaining()
        if remaining is not None and math.isfinite(remaining):
            bound = min(bound, max(remaining, 0.0))
        return bound

    async def call(
        self,
        shard: ShardSettings,
        method: str,
        request: Message,
        reply: type[_M],
        caller: Principal,
        context: Context,
        *,
        bound: float | None = None,
    ) -> _M:
        """One unary call to `shard` within `bound` seconds (see `_timeout`); its errors as
        docs/sharding.md, "Peer errors" says."""
        ch = self._channel(shard)
        await self._connected(shard, ch)
        stub = ch.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply.FromString,
        )
        try:
            result: _M = await stub(
                request,
                metadata=self._metadata(caller, context),
                timeout=self._timeout(context, bound),
            )
        except grpc.aio.AioRpcError as e:
            raise self._failed(shard, e) from None
        except asyncio.CancelledError:
            if _cancelling():
                raise
            raise down(shard, CLOSED) from None
        return result

    def _failed(self, shard: ShardSettings, e: grpc.aio.AioRpcError) -> Refused:
        """The error of a call to `shard`. A shard that answered UNAVAILABLE itself (a standby,
        or a leader stepping down) loses its connection, so that the next call connects
        afresh and may reach the shard's new leader behind the same endpoint."""
        ch = self._channels.get(shard.name)
        if (
            e.code() == grpc.StatusCode.UNAVAILABLE
            and ch is not None
            and ch.get_state() == grpc.ChannelConnectivity.READY  # (not: no connection)
        ):
            del self._channels[shard.name]
            self._closing.add(task := asyncio.ensure_future(ch.close()))
            task.add_done_callback(self._closing.discard)
        return peer_error(shard, e)

    async def stream(
        self,
        shard: ShardSettings,
        method: str,
        request: Message,
        reply: type[_M],
        caller: Principal,
        context: Context,
    ) -> AsyncGenerator[_M, None]:
        """A server stream from `shard` (Watch); its end is UNAVAILABLE "... reconnect"."""
        ch = self._channel(shard)
        await self._connected(shard, ch)
        call = ch.unary_stream(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply.FromString,
        )(request, metadata=self._metadata(caller, context))
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as e:
            raise self._failed(shard, e) from None
        except asyncio.CancelledError:
            if _cancelling():
                raise
            raise down(shard, CLOSED) from None
        finally:
            call.cancel()
        raise Refused(
            grpc.StatusCode.UNAVAILABLE, f"shard '{shard.name}' ended its event stream; reconnect"
        )

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()
        await asyncio.gather(*self._closing, return_exceptions=True)


def _cancelling() -> bool:
    """Whether this task is being cancelled. A call to a peer also ends in CancelledError when
    `_failed` closes its channel under it (gRPC cancels the calls still running there); that
    one is the peer's outage (UNAVAILABLE, CLOSED), not the caller's cancellation."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def down(shard: ShardSettings, detail: str) -> Refused:
    return Refused(grpc.StatusCode.UNAVAILABLE, f"shard '{shard.name}' is unavailable: {detail}")


def peer_error(shard: ShardSettings, e: grpc.aio.AioRpcError) -> Refused:
    """UNAVAILABLE naming the shard when it could not answer; any other error as it came,
    with its cronoq-* trailers (a peer's own refusal)."""
    code = e.code()
    if code in _DOWN:
        return down(shard, e.details() or code.name.lower())
    trailers = tuple(
        (k, v)
        for k, v in e.trailing_metadata() or ()
        if isinstance(v, str) and k.startswith("cronoq-")
    )
    return Refused(code, e.details() or "", trailers)
