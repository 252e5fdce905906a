"""Requests whose bytes are not a valid message for their method: INVALID_ARGUMENT, not UNKNOWN;
requests over `limits.max_message_bytes`: OUT_OF_RANGE, not gRPC's RESOURCE_EXHAUSTED.

grpcio turns a deserializer's exception into an UNKNOWN status (and logs a traceback) before
any of our code runs. `DecodeGuard` gives every handler a deserializer that never raises: a bad
message becomes an `_Bad` marker, and the handler's wrapper answers INVALID_ARGUMENT for a
unary request, or raises `Undecodable` from the request iterator of a streaming one (the Work
stream then ends that worker's stream alone).

A string field that is not UTF-8 (a lone surrogate, say) fails protobuf's decoding without
saying where; `text_error` finds it on the wire, so the refusal names the field (`task.kind`,
`tasks[2].tags.key`) for every method alike.

The size limit (docs/server.md, "Listener"): gRPC's own receive limit would
answer RESOURCE_EXHAUSTED, which clients take for "busy, try again" and retry forever. So the
app lets gRPC read somewhat more than the limit (`receive_limit`) and checks each message's
serialized size itself, in the deserializer of every handler it registers (`size_checked`): a
message over the limit raises `Oversized` there, which `DecodeGuard` turns into OUT_OF_RANGE
naming the limit (a unary call is refused; a stream ends).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc

# Untyped for mypy (see fronts/routes.py).
from google.protobuf import descriptor_pool  # type: ignore[import-untyped]
from google.protobuf.descriptor import Descriptor, FieldDescriptor  # type: ignore[import-untyped]

from .config.settings import GRPC_MAX_MESSAGE_BYTES

Context = grpc.aio.ServicerContext[Any, Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic only in the stubs

# How much more than limits.max_message_bytes gRPC reads of one message (`receive_limit`).
RECEIVE_FACTOR = 2


def receive_limit(max_message_bytes: int) -> int:
    """The gRPC listener's receive limit for a server whose limit is `max_message_bytes`.

    gRPC refuses a message over its receive limit from the length the message declares, before
    reading it, and answers RESOURCE_EXHAUSTED; what it accepts it buffers whole before any
    deserializer sees it. Twice our limit is the trade-off: a request up to twice the limit (a
    payload somewhat too large, the common mistake) is read and answered OUT_OF_RANGE, and no
    request makes the server buffer more than twice what it would accept anyway. A request
    larger still keeps gRPC's RESOURCE_EXHAUSTED, without being read. Sends keep the limit
    itself (a larger answer fails on our side)."""
    return min(max_message_bytes * RECEIVE_FACTOR, GRPC_MAX_MESSAGE_BYTES)


class Oversized(Exception):
    """A request message over limits.max_message_bytes (raised by a `size_checked`
    deserializer; DecodeGuard answers it OUT_OF_RANGE)."""


class Undecodable(Exception):
    """A streamed request message that is not valid protobuf for its method (`code`
    INVALID_ARGUMENT), or that is over limits.max_message_bytes (`code` OUT_OF_RANGE)."""

    def __init__(
        self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT
    ) -> None:
        super().__init__(message)
        self.code = code


class _Bad:
    __slots__ = ("code", "error")

    def __init__(self, error: str, code: grpc.StatusCode) -> None:
        self.error = error
        self.code = code


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]  # IndexError past the end: not a message
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def text_error(message: Descriptor, data: bytes, where: str = "") -> str | None:
    """The path of the first string field of `data`, a `message` on the wire, whose bytes are
    not UTF-8 (`tasks[2].kind`; a map's `tags.key`), or None when there is none (or `data`
    is not even well framed: the generic refusal then stands)."""
    seen: dict[int, int] = {}
    at = 0
    try:
        while at < len(data):
            key, at = _varint(data, at)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, at = _varint(data, at)
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
            elif wire == 2:
                size, at = _varint(data, at)
                chunk, at = data[at : at + size], at + size
                field = message.fields_by_number.get(number)
                if field is None:
                    continue
                index = seen[number] = seen.get(number, -1) + 1
                name = f"{where}{field.name}"
                if field.is_repeated and not _is_map(field):
                    name += f"[{index}]"
                if field.type == FieldDescriptor.TYPE_STRING and not _utf8(chunk):
                    return name
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    inner = text_error(field.message_type, chunk, name + ".")
                    if inner is not None:
                        return inner
            else:
                return None  # groups: no cronoq message has them
    except IndexError:
        return None
    return None


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _is_map(field: FieldDescriptor) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def _lenient(deserializer: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Oversized as e:
            return _Bad(f"{method}: {e}", grpc.StatusCode.OUT_OF_RANGE)
        except Exception as e:
            field = _text_error_of(method, data)
            what = (
                f"{field}: not valid UTF-8 text"
                if field is not None
                else f"the request is not a valid message ({type(e).__name__})"
            )
            return _Bad(f"{method}: {what}", grpc.StatusCode.INVALID_ARGUMENT)

    return decode


def _text_error_of(method: str, data: bytes) -> str | None:
    """`text_error` of a request of `method` (`/cronoq.v1.Tasks/Submit`)."""
    try:
        found = descriptor_pool.Default().FindMethodByName(method.strip("/").replace("/", "."))
    except KeyError:
        return None
    return text_error(found.input_type, data)


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Bad):
            raise Undecodable(request.error, request.code)
        yield request


async def _refuse_bad(request: Any, context: Context) -> None:
    if isinstance(request, _Bad):
        await context.abort(request.code, request.error)


def size_checked(handler: Handler, max_message_bytes: int) -> Handler:
    """`handler` whose deserializer first checks the message's serialized size: over
    `max_message_bytes` it raises `Oversized`, naming the limit, without decoding."""
    inner = handler.request_deserializer
    if inner is None:
        return handler

    def deserialize(data: bytes) -> Any:
        if len(data) > max_message_bytes:
            raise Oversized(
                f"the request is {len(data)} bytes, more than"
                f" limits.max_message_bytes={max_message_bytes}"
            )
        return inner(data)

    kind = ("stream" if handler.request_streaming else "unary") + (
        "_stream" if handler.response_streaming else "_unary"
    )
    make: Any = getattr(grpc, f"{kind}_rpc_method_handler")
    result: Handler = make(
        getattr(handler, kind),
        request_deserializer=deserialize,
        response_serializer=handler.response_serializer,
    )
    return result


def streaming_handler(inner: Callable[..., Any], guard: Callable[[Any, Context], Any]) -> Any:
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
                streaming_handler(handler.unary_stream, unary_request),
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
            streaming_handler(handler.stream_stream, stream_request),
            request_deserializer=decode,
            response_serializer=out,
        )
