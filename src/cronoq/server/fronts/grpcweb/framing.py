"""The gRPC-Web wire format (docs/grpc-web.md): content types, message and trailer frames, the
text mode's base64 chunks, the status headers, `grpc-timeout`, and the CORS answer."""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Mapping
from typing import TypeAlias

import grpc
from yarl import URL

from ...errors import percent_encode

MESSAGE = 0x00
TRAILER = 0x80
_HEADER = struct.Struct(">BI")
_BINARY = frozenset({"application/grpc-web", "application/grpc-web+proto"})
_TEXT = frozenset({"application/grpc-web-text", "application/grpc-web-text+proto"})
ALLOW_HEADERS = "authorization, content-type, x-grpc-web, x-user-agent, grpc-timeout"
EXPOSE_HEADERS = "grpc-status, grpc-message, grpc-status-details-bin"
MAX_AGE = "600"
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")


def grpc_web_mode(content_type: str | None) -> str | None:
    """ "binary", "text", or None for a content type that is not gRPC-Web (parameters such as
    `; charset=` are ignored, case-insensitively)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in _BINARY:
        return "binary"
    if kind in _TEXT:
        return "text"
    return None


def answer_type(mode: str) -> str:
    """The answer's content type for a request in `mode`."""
    return "application/grpc-web-text+proto" if mode == "text" else "application/grpc-web+proto"


def frame(data: bytes, flag: int = MESSAGE) -> bytes:
    """One frame: the flag byte, the 4-byte big-endian length, the bytes."""
    return _HEADER.pack(flag, len(data)) + data


def trailer_frame(code: int, message: str = "", extra: Mapping[str, str] | None = None) -> bytes:
    """The final frame: `grpc-status`, `grpc-message` (percent-encoded as gRPC does: every byte
    outside printable ASCII, and `%` itself) and any `extra` trailers, as CRLF-ended lines."""
    lines = [f"grpc-status:{code}"]
    if message:
        lines.append("grpc-message:" + percent_encode(message))
    lines.extend(f"{k}:{v}" for k, v in (extra or {}).items())
    return frame("".join(line + "\r\n" for line in lines).encode("ascii"), TRAILER)


def text_chunk(data: bytes) -> bytes:
    """A chunk of a text-mode answer: base64 with its own padding, so a client decodes each
    chunk as it arrives."""
    return base64.b64encode(data)


def split_frames(body: bytes) -> list[tuple[int, bytes]]:
    """The (flag, bytes) frames of a whole request body; ValueError for a truncated one."""
    frames, at = [], 0
    while at < len(body):
        if len(body) - at < _HEADER.size:
            raise ValueError("truncated gRPC-Web frame header")
        flag, size = _HEADER.unpack_from(body, at)
        at += _HEADER.size
        if len(body) - at < size:
            raise ValueError("truncated gRPC-Web frame")
        frames.append((flag, body[at : at + size]))
        at += size
    return frames


Origin: TypeAlias = "tuple[str, str, int | None]"


def origin_key(origin: str) -> Origin | None:
    """An origin as origins compare: scheme and host in lower case, the port (the scheme's
    default when none is given); None for what is no origin (`null`, a bare word)."""
    try:
        url = URL(origin)
    except ValueError:
        return None
    if not url.absolute or not url.host:
        return None
    return url.scheme.lower(), url.host.lower(), url.port


def cors_headers(origin: str | None, allowed: frozenset[Origin]) -> dict[str, str]:
    """The CORS headers of an answer (a preflight or an actual request): the request's origin
    is echoed as it came, only if it is one of the `allowed` (`origin_key`s); never
    `access-control-allow-credentials`."""
    headers = {
        "access-control-allow-methods": "POST",
        "access-control-allow-headers": ALLOW_HEADERS,
        "access-control-expose-headers": EXPOSE_HEADERS,
        "access-control-max-age": MAX_AGE,
    }
    if origin is not None and origin_key(origin) in allowed:
        headers["access-control-allow-origin"] = origin
    return headers


def status_headers(code: grpc.StatusCode, message: str) -> dict[str, str]:
    """The headers of an answer without messages, whose status travels in them."""
    headers = {"content-type": answer_type("binary"), "grpc-status": str(code.value[0])}
    if message:
        headers["grpc-message"] = percent_encode(message)
    return headers


def grpc_timeout(header: str | None) -> float | None:
    """The `grpc-timeout` header in seconds (None: absent or not understood)."""
    match = _TIMEOUT.fullmatch((header or "").strip())
    return None if match is None else int(match[1]) * _TIMEOUT_UNITS[match[2]]
