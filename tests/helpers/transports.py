"""Servicers on a real port under either transport (docs/server.md, "Transports"), for the
tests that build their own listener rather than a whole ServerApp: `listening(add)` binds
127.0.0.1:0 with grpc.aio or with the native transport (`current`, which the `each_transport`
fixture of tests/integration sets), the handlers that the generated
`add_*Servicer_to_server(servicer, server)` calls in `add` register, and the same limits.

`TRANSPORTS` is both when the native extension is built, else grpcio alone (the suite's run
of scripts/test.sh requires the build, see test_native_transport.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import grpc

from cronoq.server.config import LimitsSettings, SocketAddress, native_built
from cronoq.server.decode import receive_limit
from cronoq.server.fronts.native import NativeFront
from cronoq.server.inflight import Ledger

TRANSPORTS = ("grpcio", "native") if native_built() else ("grpcio",)
current = "grpcio"  # what `listening` serves on


class _Collected:
    """What `add_*Servicer_to_server` needs of a server: it keeps the handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self.generic: list[grpc.GenericRpcHandler] = []

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.handlers.update({f"/{service}/{name}": h for name, h in handlers.items()})

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.generic.extend(handlers)


@contextlib.asynccontextmanager
async def listening(
    add: Callable[[Any], None],
    *,
    limits: LimitsSettings | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> AsyncIterator[int]:
    """The bound port, while the block runs; the listener stops at its end."""
    limits = limits or LimitsSettings()
    if current == "native":
        table = _Collected()
        add(table)
        front = NativeFront(table.handlers, table.generic, interceptors, limits)
        port = await front.start(SocketAddress("127.0.0.1", 0))
        try:
            yield port
        finally:
            await front.stop(0)
        return
    size = limits.max_message_bytes
    server = grpc.aio.server(
        interceptors=[Ledger(limits), *interceptors],  # as the app's listener
        options=[
            ("grpc.max_receive_message_length", receive_limit(size)),  # as the app's listener
            ("grpc.max_send_message_length", size),
        ],
        maximum_concurrent_rpcs=limits.max_concurrent_requests,
    )
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)
