"""The grpcio front: what the gRPC listener grpcio serves is built with. Registrars get a
`MethodTable` instead of the server (the native transport serves what it collects), `ReadyGate`
refuses every call while the app does not serve, and `grpc_options` and `credentials` are the
listener's channel arguments and TLS."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import grpc

from ..config import ConfigError, LimitsSettings, TlsSettings
from ..decode import receive_limit, size_checked
from ..errors import refusal

# Client pings (docs/server.md, "Connections"): gRPC counts a ping that comes sooner than this
# after the previous one as a strike, and ends the connection (GOAWAY "too_many_pings") at the
# strike after MAX_PING_STRIKES. Half a second: a client pinging every second, late or early by
# a good part of that, never gets a strike, while a ping flood is still cut off.
MIN_CLIENT_PING_INTERVAL_MS = 500
MAX_PING_STRIKES = 2


class Gated(Protocol):
    """What `ReadyGate` reads of the app."""

    @property
    def ready(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...


class MethodTable:
    """What registrars get instead of the gRPC server: every call goes through to the server,
    and the handlers of each service the generated `add_*Servicer_to_server` registers are
    kept by method path for the HTTP API.

    Every handler goes to the server with its deserializer size-checked against
    `max_message_bytes` (`decode.size_checked`): the listener lets gRPC receive more than the
    limit (`decode.receive_limit`), so that an oversized request is answered OUT_OF_RANGE by
    us rather than RESOURCE_EXHAUSTED by gRPC, and this is where the limit is kept. The
    generated code registers each service twice (by method path, and as a generic handler):
    both are wrapped."""

    def __init__(self, server: grpc.aio.Server, max_message_bytes: int) -> None:
        self._server = server
        self._max = max_message_bytes
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        # what the server got (the native transport serves those)
        self.checked: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self.generic: list[grpc.GenericRpcHandler] = []

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        checked = {name: size_checked(h, self._max) for name, h in method_handlers.items()}
        for name, handler in method_handlers.items():
            self.handlers[f"/{service_name}/{name}"] = handler
            self.checked[f"/{service_name}/{name}"] = checked[name]
        self._server.add_registered_method_handlers(service_name, checked)

    def add_generic_rpc_handlers(self, generic_handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        checked = [_SizeChecked(g, self._max) for g in generic_handlers]
        self.generic.extend(checked)
        self._server.add_generic_rpc_handlers(tuple(checked))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _SizeChecked(grpc.GenericRpcHandler):
    """A generic handler whose method handlers are `decode.size_checked`."""

    def __init__(self, inner: grpc.GenericRpcHandler, max_message_bytes: int) -> None:
        self._inner = inner
        self._max = max_message_bytes

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = self._inner.service(handler_call_details)
        return None if handler is None else size_checked(handler, self._max)


class ReadyGate(grpc.aio.ServerInterceptor):
    """UNAVAILABLE for every call while standing by or stopping (docs/server.md, "Shutdown").

    The refusal is errors.refusal, the same handler authentication refuses with.
    """

    def __init__(self, app: Gated) -> None:
        self._app = app

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if self._app.ready:
            return await continuation(handler_call_details)
        why = "shutting down" if self._app.stopping else "not the leader (standby)"
        return refusal(grpc.StatusCode.UNAVAILABLE, f"this server is {why}")


def grpc_options(limits: LimitsSettings) -> list[tuple[str, int]]:
    """The gRPC listener's channel arguments (docs/server.md, "Listener" and "Connections")."""

    def ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    return [
        # a second server on the same port must fail to bind, not share the port's connections
        ("grpc.so_reuseport", 0),
        # more than the limit: the services refuse what is over it, with OUT_OF_RANGE (see
        # MethodTable; decode.receive_limit says how much more and why)
        ("grpc.max_receive_message_length", receive_limit(limits.max_message_bytes)),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        # our pings: every keepalive_interval_s on every connection, calls in flight or not; a
        # ping not acknowledged within keepalive_timeout_s closes the connection (and so ends
        # its streams: a half-open worker is dropped)
        ("grpc.keepalive_time_ms", ms(limits.keepalive_interval_s)),
        ("grpc.keepalive_timeout_ms", ms(limits.keepalive_timeout_s)),
        # grpcio 1.85 does not close the connection at keepalive_timeout_ms by itself: an
        # unacknowledged ping ends it at the ping timeout (one minute unless set), so that one
        # gets keepalive_timeout_s too (it applies to every ping the server sends)
        ("grpc.http2.ping_timeout_ms", ms(limits.keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # no cap on our pings while no data flows
        # the client's pings: accepted down to MIN_CLIENT_PING_INTERVAL_MS apart, also on a
        # connection without calls (which permit_without_calls above allows too; without it,
        # gRPC would want two hours between those)
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
    ]


def credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """TLS for the listener; with `client_ca`, mutual TLS (docs/configuration.md, "[server]")."""

    def read(key: str, path: str) -> bytes:
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as exc:
            raise ConfigError([f"server.tls.{key}: cannot read {path!r} ({exc})"]) from None

    ca = None if tls.client_ca is None else read("client_ca", tls.client_ca)
    return grpc.ssl_server_credentials(
        [(read("key", tls.key), read("cert", tls.cert))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )
