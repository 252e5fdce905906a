"""Raw workers for server tests, speaking worker protocol v3 through the generated stubs:
`EchoWorker` (a thread on a blocking channel, for server processes) and `Worker` (one
grpc.aio stream, driven message by message; `AuthWorker` opens it with a token)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from queue import Queue
from typing import Any

import grpc

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.auth import Stubs, md


class EchoWorker:
    """A worker thread: registers for `pool` with `slots`, answers each lease with its payload
    reversed (or fails it once, for payloads starting with b"flaky"), until stopped. With
    `hold`, it answers nothing by itself: each lease waits in `held` until `complete(lease)`."""

    def __init__(
        self, address: str, slots: int = 2, *, pool: str = "default", hold: bool = False
    ) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outbox: Queue[pb.WorkerMessage | None] = Queue()
        self.outbox.put(
            pb.WorkerMessage(
                register=pb.Register(pool=pool, slots=slots, worker_name="echo", protocol_version=3)
            )
        )
        self.hold = hold
        self.held: Queue[pb.Lease] = Queue()
        self.seen: list[tuple[int, int]] = []  # (task id, attempt)
        self.tags: dict[int, dict[str, str]] = {}  # task id -> the tags its leases carried
        self.registered: Queue[pb.Registered] = Queue()
        self.shutdown: pb.Shutdown | None = None
        self.ended: grpc.StatusCode | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _messages(self) -> Iterator[pb.WorkerMessage]:
        while (msg := self.outbox.get()) is not None:
            yield msg

    def _run(self) -> None:
        try:
            self._serve()
        except grpc.RpcError as e:  # the connection went away with the server
            self.ended = e.code()

    def _serve(self) -> None:
        stub = cronoq_pb2_grpc.WorkersStub(self.channel)
        for msg in stub.Work(self._messages()):
            kind = msg.WhichOneof("msg")
            if kind == "registered":
                self.registered.put(msg.registered)
            elif kind == "lease":
                lease = msg.lease
                self.seen.append((lease.task_id, lease.attempt))
                self.tags[lease.task_id] = dict(lease.tags)
                if self.hold:
                    self.held.put(lease)
                elif lease.payload.startswith(b"flaky") and lease.attempt == 1:
                    self.outbox.put(
                        pb.WorkerMessage(fail=pb.Fail(lease=lease.lease, message="try again"))
                    )
                else:
                    self.outbox.put(
                        pb.WorkerMessage(
                            complete=pb.Complete(lease=lease.lease, output=lease.payload[::-1])
                        )
                    )
            elif kind == "shutdown":
                self.shutdown = msg.shutdown
                break

    def complete(self, lease: pb.Lease, output: bytes) -> None:
        """Report a held lease done with `output`."""
        self.outbox.put(pb.WorkerMessage(complete=pb.Complete(lease=lease.lease, output=output)))

    def stop(self) -> None:
        self.outbox.put(None)
        self.thread.join(5)
        self.channel.close()


class Worker:
    """A raw stream: send WorkerMessages, read ServerMessages."""

    def __init__(
        self, channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]] | None = None
    ) -> None:
        self.outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self.call = cronoq_pb2_grpc.WorkersStub(channel).Work(self._messages(), metadata=metadata)

    async def _messages(self) -> AsyncIterator[pb.WorkerMessage]:
        while (msg := await self.outbox.get()) is not None:
            yield msg

    def send(self, **kw: Any) -> None:
        self.outbox.put_nowait(pb.WorkerMessage(**kw))

    async def recv(self, timeout: float = 2.0) -> pb.ServerMessage:
        msg = await asyncio.wait_for(self.call.read(), timeout)
        assert msg is not grpc.aio.EOF, "the stream ended"
        return msg

    async def register(self, pool: str = "p", slots: int = 1, **labels: str) -> pb.Registered:
        self.send(
            register=pb.Register(
                pool=pool, slots=slots, worker_name="w", protocol_version=3, labels=labels
            )
        )
        msg = await self.recv()
        assert msg.WhichOneof("msg") == "registered"
        return msg.registered

    async def lease(self, timeout: float = 2.0) -> pb.Lease:
        msg = await self.recv(timeout)
        assert msg.WhichOneof("msg") == "lease", msg
        return msg.lease

    def close(self) -> None:
        self.outbox.put_nowait(None)


class AuthWorker(Worker):
    """A raw stream on the channel of `stubs`, opened with the token of `who` (helpers.auth)."""

    def __init__(self, stubs: Stubs, who: str = "worker") -> None:
        super().__init__(stubs.channel, md(who))
