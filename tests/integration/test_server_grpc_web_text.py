"""Strings that are not UTF-8 (a lone surrogate's bytes, ED A0 80) in gRPC requests, native and
gRPC-Web: protobuf refuses to decode them without saying where, and the server answers
INVALID_ARGUMENT naming the field (`task.tags.value`, `tasks[0].kind`). Every string field of
every method's request is tried, at every depth, on each transport; gRPC-Web goes through the
same decoding. The HTTP API's JSON: test_server_http_text.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from test_server_grpc_web import OPEN, connect, serving

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.fronts import grpcweb
from helpers.servers import PORT0
from helpers.transports import TRANSPORTS

NOT_UTF8 = b"\xed\xa0\x80"  # what UTF-8 would make of U+D800, which it does not allow
METHODS = [
    (f"/{service.full_name}/{method.name}", method)
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _is_map(field: FieldDescriptor) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def bad_strings(message: Descriptor, seen: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
    """(the field's path, a request whose only field is that string, not UTF-8) for every
    string field under `message`, a message type not entered twice on one path."""
    for field in message.fields:
        name = field.name + ("[0]" if field.is_repeated and not _is_map(field) else "")
        if field.type == FieldDescriptor.TYPE_STRING:
            yield name, _field(field.number, NOT_UTF8)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            inner = field.message_type
            if inner.full_name in seen:
                continue
            for path, data in bad_strings(inner, (*seen, inner.full_name)):
                yield f"{name}.{path}", _field(field.number, data)


def test_the_requests_have_string_fields_to_try() -> None:
    paths = {p for _, m in METHODS for p, _ in bad_strings(m.input_type)}
    assert {"task.kind", "task.tags.key", "task.deps[0].target.key", "tasks[0].pool"} <= paths
    assert {"template.labels.value", "pools[0]", "register.pool"} <= paths


def _same(data: bytes) -> bytes:
    return data


async def _refusal(channel: grpc.aio.Channel, path: str, method: Any, data: bytes) -> Any:
    """The error of one call of `path` whose request is `data`, whatever its kind."""
    try:
        if method.client_streaming:
            call: Any = channel.stream_stream(path, _same, _same)(iter([data]))
            async for _ in call:
                pass
        elif method.server_streaming:
            async for _ in channel.unary_stream(path, _same, _same)(data):
                pass
        else:
            await channel.unary_unary(path, _same, _same)(data)
    except grpc.aio.AioRpcError as e:
        return e
    raise AssertionError(f"{path} took a string that is not UTF-8")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_native_grpc_names_the_field(transport: str) -> None:
    config = PORT0.replace("[server]\n", f'[server]\ntransport = "{transport}"\n')
    async with (
        serving(config) as app,
        grpc.aio.insecure_channel(str(app.grpc_address)) as channel,
    ):
        for path, method in METHODS:
            for field, data in bad_strings(method.input_type):
                e = await _refusal(channel, path, method, data)
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, field)
                assert e.details() == f"{path}: {field}: not valid UTF-8 text"


async def test_grpc_web_names_the_field() -> None:
    async with serving(OPEN) as app, connect(app) as c:
        for path, method in METHODS:
            if method.client_streaming:
                continue  # no bidirectional streams over gRPC-Web
            for field, data in bad_strings(method.input_type):
                headers = {"host": "localhost", "content-type": "application/grpc-web+proto"}
                c.send("POST", path, headers, grpcweb.frame(data))
                answer = await c.answer()
                assert answer.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], (path, field)
                message = unquote(answer.trailers["grpc-message"])
                assert message == f"{path}: {field}: not valid UTF-8 text"
