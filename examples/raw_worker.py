"""A remote worker for `cronoq-server`, written against the generated cronoq.v1 stubs alone.

It speaks worker protocol v3 (docs/protocol.md): register, then answer every lease with
`complete` (the payload upper-cased), heartbeating nothing because the leases are short.
`--submit N` also submits N tasks through `Tasks.Submit(wait=true)` and prints their results,
then stops: the quick check the README and the tests run.

    cronoq-server &                                   # pool "default" on 127.0.0.1:7070
    python examples/raw_worker.py --submit 3          # -> b'HELLO 0' ...

As in examples/worker.py, the worker token comes from CRONOQ_WORKER_TOKEN and the client token
(for --submit) from CRONOQ_TOKEN, each sent as `authorization: Bearer <token>` metadata; a
server started without a config needs neither. A refused call ends the program with one line
and exit code 1.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
from collections.abc import Iterator

import grpc

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc


def bearer(variable: str) -> list[tuple[str, str]]:
    """The call metadata for the token in the environment variable `variable`, if it is set."""
    token = os.environ.get(variable)
    return [("authorization", f"Bearer {token}")] if token else []


def work(
    channel: grpc.Channel, pool: str, slots: int, stop: threading.Event, registered: threading.Event
) -> None:
    """Serve leases until `stop` is set (then half-close the stream); set `registered` once
    the server has accepted the registration."""
    outbox: queue.Queue[pb.WorkerMessage | None] = queue.Queue()
    register = pb.Register(pool=pool, slots=slots, worker_name="raw-example", protocol_version=3)
    outbox.put(pb.WorkerMessage(register=register))
    threading.Thread(target=lambda: (stop.wait(), outbox.put(None)), daemon=True).start()

    def messages() -> Iterator[pb.WorkerMessage]:
        while (msg := outbox.get()) is not None:
            yield msg

    stream = cronoq_pb2_grpc.WorkersStub(channel).Work(
        messages(), metadata=bearer("CRONOQ_WORKER_TOKEN")
    )
    for msg in stream:
        kind = msg.WhichOneof("msg")
        if kind == "registered":
            registered.set()
        elif kind == "lease":
            done = pb.Complete(lease=msg.lease.lease, output=msg.lease.payload.upper())
            outbox.put(pb.WorkerMessage(complete=done))
        elif kind == "shutdown":
            return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="127.0.0.1:7070", help="gRPC address of the server")
    ap.add_argument("--pool", default="default")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--submit", type=int, default=0, help="submit N tasks, print, then stop")
    args = ap.parse_args(argv)
    stop, settled = threading.Event(), threading.Event()  # settled: registered, or refused
    refused: list[grpc.RpcError] = []

    def serve(channel: grpc.Channel) -> None:
        try:
            work(channel, args.pool, args.slots, stop, settled)
        except grpc.RpcError as e:  # a wrong token, an unknown pool, the server went away
            refused.append(e)
        finally:
            settled.set()

    with grpc.insecure_channel(args.server) as channel:
        worker = threading.Thread(target=serve, args=(channel,))
        worker.start()
        settled.wait()
        try:
            if args.submit and not refused:
                tasks = cronoq_pb2_grpc.TasksStub(channel)
                for i in range(args.submit):
                    spec = pb.TaskSpec(payload=f"hello {i}".encode(), pool=args.pool)
                    request = pb.SubmitRequest(task=spec, wait=True, wait_timeout_s=10)
                    got = tasks.Submit(request, metadata=bearer("CRONOQ_TOKEN"))
                    print(got.id, got.result.output)
        except grpc.RpcError as e:
            refused.append(e)
        finally:
            if args.submit:
                stop.set()
            worker.join()
    if refused:  # the first refusal says it all: "unauthenticated: unknown token"
        error = refused[0]
        print(f"raw_worker.py: {error.code().name.lower()}: {error.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
