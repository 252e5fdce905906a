"""The server as a user runs it: a `cronoq-server` process, a remote worker speaking worker
protocol v3 and a client, each over its own real gRPC connection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.servers import PORT0, Server, write
from helpers.workers import EchoWorker


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    retry = "[pools.retry]\nmax_attempts = 3\ninitial_backoff_s = 0\n"
    config = PORT0 + '[[pools]]\nname = "default"\nmax = 4\n' + retry
    s = Server(write(tmp_path, config))
    s.wait_for("event=ready")
    yield s
    s.kill()


def test_submit_and_wait_through_a_remote_worker(server: Server) -> None:
    worker = EchoWorker(server.address, slots=2)
    registered = worker.registered.get(timeout=5)
    assert (registered.slots, registered.protocol_version) == (2, 3)
    with grpc.insecure_channel(server.address) as ch:
        tasks = cronoq_pb2_grpc.TasksStub(ch)
        got = tasks.Submit(
            pb.SubmitRequest(
                task=pb.TaskSpec(payload=b"hello", key="greet"), wait=True, wait_timeout_s=5
            ),
            timeout=10,
        )
        assert got.result.output == b"olleh"
        assert got.result.status == pb.TASK_STATUS_SUCCEEDED
        flaky = tasks.Submit(
            pb.SubmitRequest(task=pb.TaskSpec(payload=b"flaky"), wait=True, wait_timeout_s=5),
            timeout=10,
        )
        assert flaky.result.output == b"ykalf"
        dup = tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", key="greet")), timeout=5)
        assert dup.duplicate and dup.id == got.id
        workers = cronoq_pb2_grpc.AdminStub(ch).ListWorkers(pb.Empty(), timeout=5)
        assert [(w.name, w.slots) for w in workers.workers] == [("echo", 2)]
    assert worker.seen == [(got.id, 1), (flaky.id, 1), (flaky.id, 2)]
    worker.stop()
    assert server.terminate(timeout=10) == 0


def test_workers_get_a_shutdown_when_the_server_stops(server: Server) -> None:
    worker = EchoWorker(server.address)
    worker.registered.get(timeout=5)
    assert server.terminate(timeout=10) == 0
    worker.thread.join(5)
    assert worker.shutdown is not None and not worker.shutdown.not_leader
    assert worker.shutdown.reason == "server shutting down"
    worker.stop()


def test_a_task_submitted_before_a_restart_runs_after_it(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        PORT0 + f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q.db"\n'
        '[[pools]]\nname = "default"\nmax = 2\n',
    )
    first = Server(config)
    try:
        first.wait_for("event=ready")
        with grpc.insecure_channel(first.address) as ch:
            got = cronoq_pb2_grpc.TasksStub(ch).Submit(
                pb.SubmitRequest(task=pb.TaskSpec(payload=b"durable", key="d")), timeout=5
            )
        assert first.terminate(timeout=10) == 0  # no worker ever came: the task is pending
    finally:
        first.kill()
    second = Server(config)
    try:
        second.wait_for("event=ready")
        worker = EchoWorker(second.address)
        with grpc.insecure_channel(second.address) as ch:
            tasks = cronoq_pb2_grpc.TasksStub(ch)
            done = tasks.Wait(pb.WaitRequest(task=pb.TaskRef(key="d"), timeout_s=5), timeout=10)
            assert (done.id, done.output) == (got.id, b"elbarud")
            again = tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(key="d")), timeout=5)
            assert again.duplicate and again.id == got.id
        assert worker.seen == [(got.id, 1)]
        worker.stop()
        assert second.terminate(timeout=10) == 0
    finally:
        second.kill()


def test_the_raw_worker_example_runs_against_the_server(server: Server) -> None:
    """examples/raw_worker.py, as the README runs it."""
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "raw_worker.py"
    done = subprocess.run(
        [sys.executable, str(example), "--server", server.address, "--submit", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    outputs = [line.split(" ", 1)[1] for line in done.stdout.splitlines()]
    assert outputs == ["b'HELLO 0'", "b'HELLO 1'"]
