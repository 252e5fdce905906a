"""Requests whose bytes are not a valid message for their method: INVALID_ARGUMENT, not UNKNOWN.

grpcio turns a deserializer's exception into an UNKNOWN status (and logs a traceback) before
any of our code runs. `DecodeGuard` gives every handler a deserializer that never raises: a bad
message becomes an `_Bad` marker, and the handler's wrapper answers INVALID_ARGUMENT for a
unary request, or raises `Undecodable` from the request iterator of a streaming one (the Work
stream then ends that worker's stream alone).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Context = grpc.aio.ServicerContext[Any, Any]


class Undecodable(Exception):
    """A streamed request message that is not valid protobuf for its method."""


class _Bad:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(deserializer: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:
            return _Bad(f"{method}: the request is not a valid message ({type(e).__name__})")

    return decode


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Bad):
            raise Undecodable(request.error)
        yield request


async def _refuse_bad(request: Any, context: Context) -> None:
    if isinstance(request, _Bad):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)


def _streaming(inner: Callable[..., Any], guard: Callable[[Any, Context], Any]) -> Any:
    """Wrap a response-streaming behavior, whether an async generator or a coroutine that
    writes with context.write()."""

    async def behavior(request: Any, context: Context) -> AsyncIterator[Any]:
        request = await guard(request, context)
        result = inner(request, context)
        if inspect.isasyncgen(result):
            async for item in result:
                yield item
        else:
            await result

    return behavior


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Give every handler a deserializer that never raises (see the module docstring)."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = _lenient(handler.request_deserializer, details.method)
        out = handler.response_serializer
        inner: Any

        async def unary_request(request: Any, context: Context) -> Any:
            await _refuse_bad(request, context)
            return request

        async def stream_request(requests: Any, context: Context) -> Any:
            return _checked(requests)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: Context) -> Any:
                await _refuse_bad(request, context)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=decode, response_serializer=out
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _streaming(handler.unary_stream, unary_request),
                request_deserializer=decode,
                response_serializer=out,
            )
        if handler.stream_unary is not None:
            inner = handler.stream_unary

            async def collect(requests: Any, context: Context) -> Any:
                return await inner(_checked(requests), context)

            return grpc.stream_unary_rpc_method_handler(
                collect, request_deserializer=decode, response_serializer=out
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            _streaming(handler.stream_stream, stream_request),
            request_deserializer=decode,
            response_serializer=out,
        )
