"""Codecs turn payloads and results into bytes for a durable store, and back.

Only a scheduler with a store encodes anything; the executor of the live process always gets
the original object. After a restart it gets what the codec decodes (with `JsonCodec`, a tuple
comes back as a list).
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Codec(Protocol):
    """Anything with `encode(obj) -> bytes` and `decode(bytes) -> obj`."""

    def encode(self, obj: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


# One encoder for every call: json.dumps() with options builds a new one each time.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_decode = json.JSONDecoder().decode


class JsonCodec:
    """Compact UTF-8 JSON. Decoding builds only plain data, so it never runs code from the file."""

    __slots__ = ()

    def encode(self, obj: Any) -> bytes:
        return _encode(obj).encode()

    def decode(self, data: bytes) -> Any:
        return _decode(data.decode())

    def __repr__(self) -> str:
        return "JsonCodec()"


def check_codec(codec: object) -> Codec:
    """Validate a user codec at Scheduler construction (method presence only: the bytes rule
    is checked on each encode)."""
    for method in ("encode", "decode"):
        if not callable(getattr(codec, method, None)):
            article = "an" if method == "encode" else "a"
            raise TypeError(f"codec must have {article} {method}() method")
    return codec  # type: ignore[return-value]


def encode_with(codec: Codec, obj: Any) -> bytes:
    """Encode, insisting on bytes; the codec's own errors propagate unchanged."""
    return must_be_bytes(codec.encode(obj))


def must_be_bytes(data: object) -> bytes:
    """What a codec's encode() returned, if it is bytes (a codec contract error otherwise)."""
    if not isinstance(data, bytes):
        raise TypeError("codec.encode must return bytes")
    return data
