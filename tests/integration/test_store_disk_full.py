"""A full disk under the SQLite store (docs/durability.md, "A full disk"): a real `cronoq-server`
process and library schedulers on a small tmpfs (helpers/diskfull.py) filled to the last byte,
then given its space back.

What must hold: the store's own error is reported ("database or disk is full", not the
rollback SQLite already did), writes are refused while the disk is full (the server stands by:
UNAVAILABLE, HTTP 503, `/readyz` 503 saying the disk is full), the store leads again by itself
once there is room, and every task acknowledged before or after the outage is still there and
runs. Waits are conditions polled against LONG, which only a hung process reaches.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from cronoq import Pool, Scheduler, SchedulerError, SqliteStore, TaskContext
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.fronts.http_api import STANDBY_REASON
from helpers.diskfull import fill, small_fs
from helpers.servers import PORT0, Server, write
from helpers.waiting import until
from helpers.workers import EchoWorker

LONG = 60.0
DISK_FULL = "database or disk is full"
BIG = b"b" * (256 << 10)  # more than any slack the WAL file may have left
LEASE: dict[str, Any] = {"lease_ttl": 2.0, "lease_renew": 0.5, "lock_poll": 0.05}

_T = TypeVar("_T")


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Path]:
    with small_fs(tmp_path) as path:
        yield path


def poll(check: Callable[[], _T], what: str) -> _T:
    """Poll `check` (in a test without a loop) until it returns something true."""
    deadline = time.monotonic() + LONG
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {LONG:g} s: {what}"
        time.sleep(0.01)
    return value


def request(address: str, method: str, path: str, body: Any = None) -> tuple[int, str, Any]:
    """One HTTP request on a fresh connection: (status, the standby reason header, body)."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=LONG)
    try:
        headers = {"content-type": "application/json"}
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        response = conn.getresponse()
        return response.status, response.getheader(STANDBY_REASON) or "", response.read()
    finally:
        conn.close()


def submit(
    tasks: cronoq_pb2_grpc.TasksStub, key: str, payload: bytes
) -> tuple[grpc.StatusCode, str]:
    """Submit over gRPC: (OK, the id) or (the refusal's code, its message)."""
    try:
        reply = tasks.Submit(
            pb.SubmitRequest(task=pb.TaskSpec(key=key, payload=payload)), timeout=LONG
        )
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, str(reply.id)


def test_server_stands_by_while_the_disk_is_full_and_serves_again(mount: Path) -> None:
    """The real error in the log, UNAVAILABLE and 503 while full (the process keeps running,
    `/readyz` 503 with the reason `disk full: ...`), serving again by itself once the filler is
    deleted, with every task acknowledged before and after the outage kept and run."""
    config = PORT0 + f'[store]\nkind = "sqlite"\npath = "{mount / "cronoq.db"}"\n'
    server = Server(write(mount.parent, config))
    try:
        http_address = server.wait_for(r"event=listening http=(\S+)").group(1)
        server.wait_for("event=ready")
        with grpc.insecure_channel(server.address) as channel:
            tasks = cronoq_pb2_grpc.TasksStub(channel)
            acked = {}
            for i in range(5):
                code, task_id = submit(tasks, f"before-{i}", f"before-{i}".encode())
                assert code is grpc.StatusCode.OK, task_id
                acked[int(task_id)] = f"before-{i}".encode()

            filler = fill(mount)
            code, message = submit(tasks, "while-full", BIG)
            assert code is grpc.StatusCode.UNAVAILABLE, message
            assert "rollback" not in message
            lost = server.wait_for(r"event=standing_by reason=(.*)").group(1)
            assert DISK_FULL in lost and "rollback" not in lost, lost
            # it contends again, and waits for room instead of exiting
            server.wait_for("event=awaiting_leadership")
            readyz = poll(
                lambda: (r := request(http_address, "GET", "/readyz"))[1] != "" and r,
                "/readyz to give a reason",
            )
            assert readyz == (503, f"disk full: {DISK_FULL}", b"standby")
            assert submit(tasks, "while-full", b"small")[0] is grpc.StatusCode.UNAVAILABLE
            status, _, _ = request(http_address, "POST", "/v1/tasks", {"key": "http", "payload": 1})
            assert status == 503
            assert server.proc.poll() is None

            os.remove(filler)
            server.wait_for("event=ready")
            assert request(http_address, "GET", "/readyz")[:2] == (200, "")
            for i in range(3):
                code, task_id = submit(tasks, f"after-{i}", f"after-{i}".encode())
                assert code is grpc.StatusCode.OK, task_id
                acked[int(task_id)] = f"after-{i}".encode()

            worker = EchoWorker(server.address)
            try:
                for task_id, payload in acked.items():
                    result = tasks.Wait(
                        pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=LONG),
                        timeout=LONG + 5,
                    )
                    assert (result.status, result.output) == (
                        pb.TASK_STATUS_SUCCEEDED,
                        payload[::-1],
                    )
            finally:
                worker.stop()
        assert server.terminate(LONG) == 0
    finally:
        server.kill()


async def _echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


def _scheduler(path: Path) -> tuple[Scheduler, SqliteStore]:
    store = SqliteStore(path, **LEASE)
    return Scheduler([Pool("default", _echo, max=2)], store=store), store


async def test_scheduler_on_a_full_disk_raises_the_disk_error_and_starts_again(
    mount: Path,
) -> None:
    """Library mode: the submit that cannot be written raises SchedulerError with SQLite's own
    error and the scheduler stops; start() again waits while the disk is full (the store's
    status says so) and leads once there is room, with every acknowledged task."""
    sched, store = _scheduler(mount / "cronoq.db")
    await sched.start()
    try:
        acked = [await sched.submit(f"before-{i}", key=f"before-{i}") for i in range(3)]
        for handle in acked:
            await asyncio.wait_for(handle.result(), LONG)
        filler = fill(mount)
        with pytest.raises(SchedulerError) as info:
            await sched.submit(BIG.decode())
        assert str(info.value) == f"store write failed: {DISK_FULL}"
        assert not sched.started

        assert store.status == f"disk full: {DISK_FULL}"
        # lead() asks whether there is room before it writes: count the times it was told no
        refused = 0
        room = store._room

        def spied() -> bool:
            nonlocal refused
            free = room()
            refused += not free
            return free

        store._room = spied  # type: ignore[method-assign]
        starting = asyncio.create_task(sched.start())
        await until(lambda: refused >= 2, LONG, "start() to wait for room, lead after lead")
        assert not starting.done()
        os.remove(filler)
        await asyncio.wait_for(starting, LONG)
        assert store.status == ""
        for i, handle in enumerate(acked):
            again = await sched.handle(f"before-{i}")
            assert again is not None and again.id == handle.id
            assert await asyncio.wait_for(again.result(), LONG) == f"before-{i}"
        after = await sched.submit("after", key="after")
        assert await asyncio.wait_for(after.result(), LONG) == "after"
    finally:
        await sched.shutdown()


async def test_a_closed_file_on_a_full_disk_opens_once_there_is_room(mount: Path) -> None:
    """A file closed cleanly (SQLite removed its WAL index) cannot even be read on a full
    disk: start() waits, saying the disk is full, instead of calling it "not a cronoq
    database"; once there is room it leads with the tasks acknowledged before."""
    path = mount / "cronoq.db"
    sched, _ = _scheduler(path)
    await sched.start()
    try:
        task_id = (await sched.submit("kept", key="kept")).id
    finally:
        await sched.shutdown()
    filler = fill(mount)
    sched, store = _scheduler(path)
    starting = asyncio.create_task(sched.start())
    try:
        await until(lambda: store.status.startswith("disk full"), LONG, "the status to say so")
        assert not starting.done()
        os.remove(filler)
        await asyncio.wait_for(starting, LONG)
        handle = await sched.handle("kept")
        assert handle is not None and handle.id == task_id
        assert await asyncio.wait_for(handle.result(), LONG) == "kept"
    finally:
        starting.cancel()
        await sched.shutdown()
