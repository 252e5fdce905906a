"""A gRPC client pointed at the HTTP port by mistake (docs/http.md, "gRPC on the HTTP port"):
the listener sees the HTTP/2 connection preface and answers in HTTP/2, every call UNAVAILABLE
with a message saying where gRPC is; the real `cronoq` command line and the Python client show
it, and so does a Python worker, whose stream is answered once its first message has come; the
server logs one warning line for the peer, not a traceback per attempt. HTTP on the same port
is unaffected.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import urllib.request
from pathlib import Path

from test_cli import COMMAND, ENV, one_error_line

from cronoq.client import Client, ClientError, Lease, Worker
from helpers.servers import PORT0, serving_process
from helpers.waiting import until


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def worker_failure(address: str) -> str:
    """What a Python worker on `address` logs of its first failed stream (its Work stream
    sends a message before it reads an answer)."""

    async def handle(lease: Lease) -> bytes:
        raise AssertionError("no lease comes from the HTTP port")

    logger = logging.getLogger("cronoq.client")
    lines = _Lines()
    logger.addHandler(lines)
    running = asyncio.create_task(Worker(address, "default", handle).run())
    try:
        return str(await until(lambda: lines.lines and lines.lines[0], 30, "a worker log line"))
    finally:
        logger.removeHandler(lines)
        running.cancel()
        await asyncio.wait([running])


def test_grpc_clients_on_the_http_port_are_told_where_grpc_is(tmp_path: Path) -> None:
    with serving_process(tmp_path, PORT0) as s:
        told = f"this is cronoq's HTTP port; gRPC is on {s.address}"
        for args in (["list"], ["submit", "{}"]):  # two attempts, two connections
            done = subprocess.run(
                [*COMMAND, "--server", f"http://{s.http_address}", *args],
                capture_output=True,
                text=True,
                env=ENV,
                timeout=60,
            )
            assert done.returncode == 4, done.stderr  # unreachable: nothing was done
            assert one_error_line(done) == f"cronoq: error: unavailable: {told}"

        async def submit() -> ClientError:
            async with Client(s.http_address) as client:
                try:
                    await client.submit(b"x")
                except ClientError as e:
                    return e
            raise AssertionError("the HTTP port took a gRPC submit")

        error = asyncio.run(submit())
        assert (error.code, error.message) == ("unavailable", told)
        assert asyncio.run(worker_failure(s.http_address)) == (
            f"worker stream failed: UNAVAILABLE: {told}"
        )

        with urllib.request.urlopen(f"http://{s.http_address}/v1/tasks", timeout=30) as r:
            assert r.status == 200  # HTTP goes on, and nothing was submitted
            assert r.read() == b'{"tasks": []}'
        server = s.server
        server.terminate(timeout=60)  # every line it logged is in, up to its last
    warned = [line for line in server.lines if "event=grpc_on_http_port" in line]
    assert len(warned) == 1, server.lines
    assert "level=warning" in warned[0] and f"grpc={s.address}" in warned[0]
    assert "peer=127.0.0.1" in warned[0]
    assert not [line for line in server.lines if "Traceback" in line or "level=error" in line]
