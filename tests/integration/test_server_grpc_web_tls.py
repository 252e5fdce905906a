"""gRPC-Web over TLS on the gRPC port (docs/grpc-web.md, "TLS") of a real in-process server,
with certificates made for the test (helpers/auth.py) and raw HTTP/1.1 over `ssl` sockets.

The front reads each ClientHello: `http/1.1` in ALPN, or no ALPN, is answered as gRPC-Web
with TLS ended by the front (unary binary and text, Watch, client certificates deciding as on
native gRPC); `h2` alone is relayed to grpcio's TLS, so native and mTLS clients are unchanged.
What is not a ClientHello is closed without harm to later connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from test_server_grpc_web import (
    GET,
    POOLS,
    PORTS,
    SUBMIT,
    WATCH,
    WEB,
    Conn,
    first_event,
    serving,
    submit,
)

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.app import ServerApp
from cronoq.server.errors import percent_encode
from cronoq.server.fronts import grpcweb
from helpers.auth import Stubs, code_of, mtls_config, over_mtls

Code = grpc.StatusCode
BROWSER = ["h2", "http/1.1"]  # what browsers (and curl) offer


def tls_config(pki: Path) -> str:
    """TLS without client certificates, no credentials: the loopback Host guard applies."""
    tls = f'[server.tls]\ncert = "{pki}/server.pem"\nkey = "{pki}/server.key"\n'
    return PORTS + tls + WEB + POOLS


def client_context(
    pki: Path, alpn: list[str] | None = BROWSER, cert: str | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    if cert is not None:
        context.load_cert_chain(pki / f"{cert}.pem", pki / f"{cert}.key")
    return context


def port(app: ServerApp) -> int:
    assert app.grpc_address is not None
    return app.grpc_address.port


@contextlib.asynccontextmanager
async def connect_tls(app: ServerApp, context: ssl.SSLContext) -> AsyncIterator[Conn]:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port(app), ssl=context, server_hostname="localhost"
    )
    try:
        yield Conn(reader, writer)
    finally:
        writer.close()


def alpn_of(c: Conn) -> str | None:
    selected: str | None = c.writer.get_extra_info("ssl_object").selected_alpn_protocol()
    return selected


@contextlib.asynccontextmanager
async def native_tls(pki: Path, app: ServerApp) -> AsyncIterator[Stubs]:
    """Stubs on grpcio's TLS channel (ALPN `h2` alone), trusting the test CA."""
    creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
    async with grpc.aio.secure_channel(f"localhost:{port(app)}", creds) as channel:
        yield Stubs(channel)


async def test_unary_binary_and_text_with_and_without_alpn(pki: Path) -> None:
    async with serving(tls_config(pki)) as app:
        for alpn, selected in ((BROWSER, "http/1.1"), (["http/1.1"], "http/1.1"), (None, None)):
            async with connect_tls(app, client_context(pki, alpn)) as c:
                assert alpn_of(c) == selected
                sent = await c.call(SUBMIT, submit(), mode="binary")
                assert sent.code == 0 and sent.headers["content-type"] == grpcweb.answer_type(
                    "binary"
                )
                task_id = pb.SubmitResponse.FromString(sent.messages[0]).id
                got = await c.call(GET, pb.GetRequest(task=pb.TaskRef(id=task_id)), mode="text")
                assert got.code == 0 and got.headers["content-type"] == grpcweb.answer_type("text")
                assert pb.TaskInfo.FromString(got.messages[0]).id == task_id
                # the connection is kept alive over TLS; the guard still reads the Host header
                refused = await c.call(SUBMIT, submit(), host="evil.example")
                assert refused.code == Code.PERMISSION_DENIED.value[0]


async def test_application_grpc_over_tls_http1_is_unimplemented(pki: Path) -> None:
    async with serving(tls_config(pki)) as app, connect_tls(app, client_context(pki)) as c:
        body = grpcweb.frame(submit(payload=b"never").SerializeToString())
        c.send("POST", SUBMIT, {"host": "localhost", "content-type": "application/grpc"}, body)
        refused = await c.answer()
        assert refused.code == Code.UNIMPLEMENTED.value[0]
        assert refused.trailers["grpc-message"] == percent_encode(grpcweb.NOT_GRPC_WEB)


async def test_watch_streams_over_tls(pki: Path) -> None:
    async with (
        serving(tls_config(pki)) as app,
        connect_tls(app, client_context(pki)) as watcher,
        connect_tls(app, client_context(pki, None)) as c,
    ):
        request = pb.WatchRequest(pools=["a"], all_transitions=True)
        headers = {"host": "localhost", "content-type": "application/grpc-web+proto"}
        watcher.send("POST", WATCH, headers, grpcweb.frame(request.SerializeToString()))
        _, chunk, sent = await first_event(watcher, c, "a")
        [(flag, data)] = grpcweb.split_frames(chunk)
        assert flag == grpcweb.MESSAGE and pb.StatusEvent.FromString(data).id in sent


async def test_native_tls_clients_are_relayed_to_grpcio(pki: Path) -> None:
    async with serving(tls_config(pki)) as app:
        async with native_tls(pki, app) as stubs:
            sent = await stubs.tasks.Submit(submit(payload=b"native"), timeout=30)
            got = await stubs.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=sent.id)), timeout=30)
            assert got.id == sent.id and got.pool == "a"
        # `h2` alone: the handshake is grpcio's, which selects h2 (the front offers http/1.1)
        async with connect_tls(app, client_context(pki, ["h2"])) as c:
            assert alpn_of(c) == "h2"
    async with serving(mtls_config(pki) + WEB) as app, over_mtls(pki, "ops", port(app)) as ops:
        mine = await ops.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="a")), timeout=30)
        assert mine.id > 0
        denied = ops.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="b")), timeout=30)
        assert await code_of(denied) is Code.PERMISSION_DENIED


async def test_client_certificates_decide_as_on_native_grpc(pki: Path) -> None:
    """The codes the certificate gives over gRPC-Web are those grpcio's path gives (the same
    calls, side by side): ops is a client of pool a, robot a worker, stranger and an IP SAN
    are not mapped."""
    calls = [
        ("ops", SUBMIT, submit(pool="a"), Code.OK),
        ("ops", SUBMIT, submit(pool="b"), Code.PERMISSION_DENIED),
        ("ops", "/cronoq.v1.Admin/Snapshot", pb.Empty(), Code.PERMISSION_DENIED),
        ("robot", SUBMIT, submit(pool="a"), Code.PERMISSION_DENIED),
        ("stranger", "/cronoq.v1.Tasks/ListTasks", pb.ListTasksRequest(), Code.UNAUTHENTICATED),
        ("ip", "/cronoq.v1.Tasks/ListTasks", pb.ListTasksRequest(), Code.UNAUTHENTICATED),
    ]
    async with serving(mtls_config(pki) + WEB) as app:
        for who, method, request, code in calls:
            async with connect_tls(app, client_context(pki, cert=who)) as c:
                assert alpn_of(c) == "http/1.1"
                web = await c.call(method, request)
                assert web.code == code.value[0], (who, method, web.trailers)
            async with over_mtls(pki, who, port(app)) as stubs:
                native = stubs.channel.unary_unary(
                    method, request_serializer=type(request).SerializeToString
                )
                assert await code_of(native(request, timeout=30)) is code, (who, method)
        # a bearer token still works over a certificate, as natively
        async with connect_tls(app, client_context(pki, cert="stranger")) as c:
            assert (await c.call(SUBMIT, submit(pool="b"), who="admin")).code == 0
        # the certificate is the call's principal: ops sees its own task in pool a
        async with connect_tls(app, client_context(pki, cert="ops")) as c:
            listed = await c.call("/cronoq.v1.Tasks/ListTasks", pb.ListTasksRequest())
            pools = {t.pool for t in pb.ListTasksResponse.FromString(listed.messages[0]).tasks}
            assert pools == {"a"}


async def test_without_a_client_certificate_tls_refuses_as_natively(pki: Path) -> None:
    """`client_ca` requires a certificate on both paths: the handshake fails, no call is made
    (over TLS 1.3 the client learns it at its first read)."""
    async with serving(mtls_config(pki) + WEB) as app:
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            async with connect_tls(app, client_context(pki)) as c:
                await c.call(SUBMIT, submit())
        async with native_tls(pki, app) as stubs:
            refused = stubs.tasks.Submit(submit(), timeout=30)
            assert await code_of(refused) is Code.UNAVAILABLE
        async with connect_tls(app, client_context(pki, cert="ops")) as c:
            assert (await c.call(SUBMIT, submit())).code == 0


async def raw_exchange(app: ServerApp, data: bytes) -> bytes:
    """Send `data` on a plain TCP connection to the TLS port, half-close, read to the end (a
    reset, when the server closed with some of `data` unread, is an end without answer too)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port(app))
    try:
        writer.write(data)
        writer.write_eof()
        return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def client_hello(alpn: list[str] | None) -> bytes:
    """The first flight of a real TLS client: its ClientHello record(s)."""
    context = ssl.create_default_context()
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def test_what_is_not_a_client_hello_is_closed_and_harms_nothing(
    pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cronoq.server")
    hello = client_hello(BROWSER)
    async with serving(tls_config(pki)) as app:
        body = grpcweb.frame(submit().SerializeToString())
        plain = b"POST %s HTTP/1.1\r\nhost: localhost\r\ncontent-length: %d\r\n\r\n" % (
            SUBMIT.encode(),
            len(body),
        )
        for data in (
            plain + body,  # plain HTTP on the TLS port
            b"\x16\x03\x01\xff\xff" + bytes(range(256)) * 300,  # a record over the bound
            b"\x16\x03\x01\x00\x10" + b"\x01\x00\x00\x0c" + b"\x00" * 12,  # a malformed ClientHello
            hello[: len(hello) // 2],  # a truncated ClientHello
            b"\x00" * 64,  # garbage
        ):
            assert await raw_exchange(app, data) == b""
        closed = [r for r in caplog.records if "sent no ClientHello" in r.getMessage()]
        assert len(closed) == 5 and {r.levelno for r in closed} == {logging.DEBUG}
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        async with connect_tls(app, client_context(pki)) as c:
            assert (await c.call(SUBMIT, submit())).code == 0
        async with native_tls(pki, app) as stubs:
            assert (await stubs.tasks.Submit(submit(), timeout=30)).id > 0
