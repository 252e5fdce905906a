"""The two transports of the gRPC port (docs/server.md, "Transports"), on real sockets.

Choosing: `server.transport`, CRONOQ_TRANSPORT, "auto" and its fallback to grpcio, and the
errors of an impossible choice (mTLS on each transport: test_server_auth.py). Serving: for what
the transports themselves decide (not the servicers, which every other server test runs on the
default transport), the same call is made to a whole server on each transport and the outcomes,
status codes and messages, must be equal: an unknown method, a refused Register with its
message, calls past limits.max_concurrent_requests, a client deadline, messages over the limit
and over twice the limit, an error's trailing metadata; and on the native transport, a
cancelled Work stream and a graceful stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.app import ServerApp
from cronoq.server.config import ConfigError, load_config, native_built
from cronoq.server.config import reader as config_reader
from cronoq.server.fronts.native import TOO_MANY_CALLS
from cronoq.server.wiring import build
from helpers.servers import PORT0, Server, running_app, write
from helpers.waiting import until

pytestmark = pytest.mark.skipif(not native_built(), reason="the native transport is not built")

Outcome = tuple[grpc.StatusCode, str]


def test_the_test_run_has_the_native_transport() -> None:
    """scripts/test.sh sets CRONOQ_REQUIRE_NATIVE: a native build that failed in its install
    step (the extension is optional for `pip install`) must fail the suite, not skip tests."""
    if os.environ.get("CRONOQ_REQUIRE_NATIVE") == "1":
        assert native_built()


# --- choosing ---------------------------------------------------------------------------------


def app_of(text: str, env: dict[str, str] | None = None) -> ServerApp:
    return ServerApp(load_config(text, env=env or {}))


def test_auto_is_native_when_built_and_grpcio_with_tls_or_grpc_web(pki: Path) -> None:
    assert app_of(PORT0).transport == "native"
    web = PORT0 + '[server.grpc_web]\nallowed_origins = ["https://a.example"]\n'
    assert app_of(web).transport == "grpcio"
    tls = f'[server.tls]\ncert = "{pki}/server.pem"\nkey = "{pki}/server.key"\n'
    assert app_of(PORT0 + tls).transport == "grpcio"
    assert app_of(PORT0 + 'transport = "native"\n' + tls).transport == "native"
    assert app_of(PORT0 + 'transport = "grpcio"\n').transport == "grpcio"


def test_the_environment_chooses_when_the_file_does_not() -> None:
    assert app_of(PORT0, {"CRONOQ_TRANSPORT": "grpcio"}).transport == "grpcio"
    assert app_of(PORT0 + 'transport = "native"\n', {"CRONOQ_TRANSPORT": "grpcio"}).transport == (
        "native"
    )
    with pytest.raises(ConfigError, match=r'CRONOQ_TRANSPORT must be one of .* \(got "h3"\)'):
        load_config(PORT0, env={"CRONOQ_TRANSPORT": "h3"})


def test_impossible_choices_are_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r'server\.transport: must be one of "auto", "native"'):
        load_config(PORT0 + 'transport = "tonic"\n')
    web = PORT0 + 'transport = "native"\n[server.grpc_web]\nallowed_origins = ["https://a.b"]\n'
    with pytest.raises(ConfigError, match='"native" does not serve gRPC-Web'):
        load_config(web)
    # an installation without the extension (a machine without Rust at install time)
    monkeypatch.setattr(config_reader, "native_built", lambda: False)
    with pytest.raises(ConfigError, match=r"cronoq\._native\) is not built in this installation"):
        load_config(PORT0 + 'transport = "native"\n')
    assert app_of(PORT0).transport == "grpcio"  # and "auto" falls back


def test_the_listening_line_names_the_transport(tmp_path: Path) -> None:
    for transport in ("native", "grpcio"):
        s = Server(write(tmp_path, PORT0 + f'transport = "{transport}"\n'))
        try:
            s.wait_for("event=ready")
            listening = next(line for line in s.lines if "event=listening grpc=" in line)
            assert listening.endswith(f" tls=false transport={transport}")
        finally:
            s.kill()


# --- serving alike ----------------------------------------------------------------------------

POOL = '[[pools]]\nname = "p"\nmax = 4\n'


@contextlib.asynccontextmanager
async def serving(
    transport: str, extra: str = ""
) -> AsyncIterator[tuple[ServerApp, grpc.aio.Channel]]:
    text = PORT0 + f'transport = "{transport}"\n' + extra + POOL
    async with running_app(build(load_config(text)), ready=True) as app:
        assert app.transport == transport and app.grpc_address is not None
        async with grpc.aio.insecure_channel(str(app.grpc_address)) as channel:
            yield app, channel


async def outcome(call: Awaitable[Any]) -> Outcome:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


async def both(scenario: Any, extra: str = "") -> tuple[Any, Any]:
    """`scenario(channel)` against a server on each transport: (grpcio's, native's)."""
    results = []
    for transport in ("grpcio", "native"):
        async with serving(transport, extra) as (_, channel):
            results.append(await scenario(channel))
    return results[0], results[1]


def register(pool: str = "p", version: int = 3) -> pb.WorkerMessage:
    return pb.WorkerMessage(register=pb.Register(pool=pool, slots=1, protocol_version=version))


async def test_an_unknown_method_and_a_refused_register_answer_alike() -> None:
    async def scenario(channel: grpc.aio.Channel) -> list[Outcome]:
        unknown = channel.unary_unary("/cronoq.v1.Tasks/Nope")(b"")
        work = cronoq_pb2_grpc.WorkersStub(channel).Work()
        await work.write(register(version=2))
        return [await outcome(unknown), await outcome(work.read())]

    grpcio, native = await both(scenario)
    assert grpcio == native
    assert native[0][0] == grpc.StatusCode.UNIMPLEMENTED
    assert native[1] == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "worker protocol version 2 is not supported: this server needs version 3 (upgrade the"
        " worker)",
    )


async def test_calls_past_max_concurrent_requests_are_refused_alike() -> None:
    async def scenario(channel: grpc.aio.Channel) -> set[Outcome]:
        tasks = cronoq_pb2_grpc.TasksStub(channel)
        held = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p")))
        # six waits of a second at once (no worker: each runs out) for a limit of two
        wait = pb.WaitRequest(task=pb.TaskRef(id=held.id), timeout_s=1)
        return set(await asyncio.gather(*(outcome(tasks.Wait(wait)) for _ in range(6))))

    grpcio, native = await both(scenario, "[limits]\nmax_concurrent_requests = 2\n")
    assert (
        grpcio
        == native
        == {
            (grpc.StatusCode.RESOURCE_EXHAUSTED, TOO_MANY_CALLS),
            (grpc.StatusCode.DEADLINE_EXCEEDED, "task 1 still ready after 1 s"),
        }
    )


async def test_message_limits_and_deadlines_answer_alike() -> None:
    async def scenario(channel: grpc.aio.Channel) -> list[Outcome]:
        tasks = cronoq_pb2_grpc.TasksStub(channel)
        held = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p")))
        big = pb.SubmitRequest(task=pb.TaskSpec(pool="p", payload=b"x" * 6000))
        huge = pb.SubmitRequest(task=pb.TaskSpec(pool="p", payload=b"x" * 9000))
        wait = pb.WaitRequest(task=pb.TaskRef(id=held.id), timeout_s=30)
        late, _ = await outcome(tasks.Wait(wait, timeout=0.3))  # (the client's own words)
        return [await outcome(tasks.Submit(big)), await outcome(tasks.Submit(huge)), (late, "")]

    grpcio, native = await both(scenario, "[limits]\nmax_message_bytes = 4096\n")
    assert grpcio == native
    assert [code for code, _ in native] == [
        grpc.StatusCode.OUT_OF_RANGE,  # over the limit: ours (docs/server.md, "Listener")
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # over twice the limit: the transport's own
        grpc.StatusCode.DEADLINE_EXCEEDED,  # the client's deadline (grpc-timeout)
    ]


async def test_trailing_metadata_of_a_refusal_arrives_alike() -> None:
    """A shard's redirect carries where to go in trailers (docs/sharding.md, "Refusals"): here
    the refusal of a Register for a pool of another shard."""
    plan = (
        'shard = "a"\n[[shards]]\nname = "a"\nnumber = 0\nendpoint = "http://127.0.0.1:1"\n'
        'pools = ["p"]\n[[shards]]\nname = "b"\nnumber = 1\nendpoint = "http://127.0.0.1:2"\n'
        'pools = ["q"]\n'
        '[[pools]]\nname = "q"\n'
    )

    async def scenario(channel: grpc.aio.Channel) -> tuple[Outcome, Any]:
        work = cronoq_pb2_grpc.WorkersStub(channel).Work()
        await work.write(register("q"))
        result = await outcome(work.read())
        return result, tuple(await work.trailing_metadata())

    grpcio, native = await both(scenario, plan)
    assert grpcio == native
    assert native[0][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert ("cronoq-shard", "b") in native[1]


async def test_a_cancelled_work_stream_drops_its_worker() -> None:
    async with serving("native") as (_, channel):
        admin = cronoq_pb2_grpc.AdminStub(channel)
        work = cronoq_pb2_grpc.WorkersStub(channel).Work()
        await work.write(register())
        assert (await work.read()).WhichOneof("msg") == "registered"
        assert len((await admin.ListWorkers(pb.Empty())).workers) == 1
        work.cancel()

        async def gone() -> bool:
            return not (await admin.ListWorkers(pb.Empty())).workers

        await until(gone, what="the worker gone")


async def test_stop_tells_workers_then_ends_their_streams() -> None:
    async with serving("native") as (app, channel):
        work = cronoq_pb2_grpc.WorkersStub(channel).Work()
        await work.write(register())
        assert (await work.read()).WhichOneof("msg") == "registered"
        await app.stop()
        message = await work.read()
        assert message.WhichOneof("msg") == "shutdown" and not message.shutdown.not_leader
        assert await work.read() is grpc.aio.EOF
        assert await work.code() == grpc.StatusCode.OK
