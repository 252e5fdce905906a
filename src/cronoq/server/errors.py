"""Ending a call with a status: the Refused error (auth, tasks, work) and the one handler
that refuses a whole call before any servicer runs (auth, the readiness gate)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import grpc

__all__ = ["FIRST_MESSAGE_WAIT", "Refused", "percent_encode", "refusal"]

# How long a refusal waits for the caller's first message before ending the call anyway.
FIRST_MESSAGE_WAIT = 1.0


class Refused(Exception):
    """An RPC ends with this status code (not found, deadline, unavailable, denied...) and
    these trailers (a shard refusal's name and endpoint)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that ends any call with `code`. Stream-stream fits every method. It reads
    the caller's first message (for a worker, its register) before refusing, waiting at most
    FIRST_MESSAGE_WAIT: a stream refused while that message is still arriving is sometimes
    reported by grpcio to the caller as INTERNAL instead of `code` (grpc/grpc#36066), and a
    worker would take INTERNAL for a reason to reconnect rather than a fatal refusal."""

    async def refuse(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(anext(requests, None), FIRST_MESSAGE_WAIT)
        await context.abort(code, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


def percent_encode(message: str) -> str:
    """gRPC's `grpc-message` encoding: printable ASCII but `%` stays, the rest is `%XX`."""
    return quote(message, safe="".join(chr(c) for c in range(0x20, 0x7F) if c != 0x25))
