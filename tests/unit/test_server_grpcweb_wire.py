"""The gRPC-Web wire format of cronoq.server.fronts.grpcweb (docs/grpc-web.md)."""

from __future__ import annotations

import base64
import ssl

import pytest

from cronoq.server.fronts import grpcweb


@pytest.mark.parametrize(
    ("content_type", "mode"),
    [
        ("application/grpc-web", "binary"),
        ("application/grpc-web+proto", "binary"),
        ("Application/GRPC-Web+proto; charset=utf-8", "binary"),
        ("application/grpc-web-text", "text"),
        ("application/grpc-web-text+proto", "text"),
        ("application/grpc", None),
        ("application/json", None),
        (None, None),
    ],
)
def test_modes(content_type: str | None, mode: str | None) -> None:
    assert grpcweb.grpc_web_mode(content_type) == mode


def test_answer_types() -> None:
    assert grpcweb.answer_type("binary") == "application/grpc-web+proto"
    assert grpcweb.answer_type("text") == "application/grpc-web-text+proto"


def test_frames_round_trip() -> None:
    body = grpcweb.frame(b"abc") + grpcweb.frame(b"")
    assert body[:5] == b"\x00\x00\x00\x00\x03"
    assert grpcweb.split_frames(body) == [(0, b"abc"), (0, b"")]
    with pytest.raises(ValueError):
        grpcweb.split_frames(body[:-1] + b"\x00\x00")
    with pytest.raises(ValueError):
        grpcweb.split_frames(grpcweb.frame(b"abc")[:-1])


def test_trailer_frame() -> None:
    raw = grpcweb.trailer_frame(5, "no task 100% «x»", {"cronoq-shard": "b"})
    [(flag, text)] = grpcweb.split_frames(raw)
    assert flag == grpcweb.TRAILER
    assert (
        text == b"grpc-status:5\r\ngrpc-message:no task 100%25 %C2%ABx%C2%BB\r\ncronoq-shard:b\r\n"
    )
    [(_, ok)] = grpcweb.split_frames(grpcweb.trailer_frame(0))
    assert ok == b"grpc-status:0\r\n"


def test_text_chunks_decode_on_their_own() -> None:
    chunks = [grpcweb.text_chunk(grpcweb.frame(b"x")), grpcweb.text_chunk(grpcweb.trailer_frame(0))]
    assert all(len(c) % 4 == 0 for c in chunks)
    decoded = b"".join(base64.b64decode(c) for c in chunks)
    assert [f for f, _ in grpcweb.split_frames(decoded)] == [0, grpcweb.TRAILER]


def test_cors_headers() -> None:
    allowed = frozenset({grpcweb.origin_key("https://app.example")})
    listed = grpcweb.cors_headers("https://app.example", allowed)
    assert listed == {
        "access-control-allow-origin": "https://app.example",
        "access-control-allow-methods": "POST",
        "access-control-allow-headers": (
            "authorization, content-type, x-grpc-web, x-user-agent, grpc-timeout"
        ),
        "access-control-expose-headers": "grpc-status, grpc-message, grpc-status-details-bin",
        "access-control-max-age": "600",
    }
    for origin in ("https://evil.example", "null", None):
        unlisted = grpcweb.cors_headers(origin, allowed)
        assert "access-control-allow-origin" not in unlisted
        assert "access-control-allow-credentials" not in unlisted


def hello_message(alpn: list[str] | None) -> bytes:
    """The ClientHello handshake message a real TLS client (Python's ssl) sends first: its one
    record, less the 5-byte record header."""
    context = ssl.create_default_context()
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="x")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    record = outgoing.read()
    assert record[0] == 22 and int.from_bytes(record[3:5], "big") == len(record) - 5
    return record[5:]


@pytest.mark.parametrize(
    "alpn", [["h2", "http/1.1"], ["h2"], ["http/1.1"], ["grpc-exp", "h2"], None]
)
def test_client_hello_alpn(alpn: list[str] | None) -> None:
    expected = None if alpn is None else tuple(alpn)
    assert grpcweb.client_hello_alpn(hello_message(alpn)) == expected


def test_a_client_hello_without_extensions_offers_no_alpn() -> None:
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x00\x2f" + b"\x01\x00"
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    assert grpcweb.client_hello_alpn(message) is None


def test_a_malformed_client_hello_is_refused() -> None:
    message = hello_message(["h2", "http/1.1"])
    longer = message[4:] + b"\x00"
    for bad in (
        message[: len(message) // 2],  # truncated
        b"\x02" + message[1:],  # a ServerHello
        message[:4],  # the header alone
        b"",
        b"\x01" + len(longer).to_bytes(3, "big") + longer,  # a byte after the extensions
    ):
        with pytest.raises(ValueError):
            grpcweb.client_hello_alpn(bad)


def test_origin_keys_compare_as_origins() -> None:
    key = grpcweb.origin_key("https://Dash.Example.com")
    assert key == ("https", "dash.example.com", 443)
    assert grpcweb.origin_key("HTTPS://dash.example.COM:443") == key
    assert grpcweb.origin_key("https://dash.example.com:8443") != key
    assert grpcweb.origin_key("http://dash.example.com") != key
    assert grpcweb.origin_key("null") is None
    assert grpcweb.origin_key("http://[::1") is None
