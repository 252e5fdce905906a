"""A remote worker for `cronoq-server`, written against the generated cronoq.v1 stubs alone.

It speaks worker protocol v3 (docs/protocol.md): register, then answer every lease with
`complete` (the payload upper-cased), heartbeating nothing because the leases are short.
`--submit N` also submits N tasks through `Tasks.Submit(wait=true)` and prints their results,
then stops: the quick check the README and the tests run.

    cronoq-server &                                   # pool "default" on 127.0.0.1:7070
    python examples/raw_worker.py --submit 3          # -> b'HELLO 0' ...
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
from collections.abc import Iterator

import grpc

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc


def work(channel: grpc.Channel, pool: str, slots: int, stop: threading.Event) -> None:
    """Serve leases until `stop` is set (then half-close the stream)."""
    outbox: queue.Queue[pb.WorkerMessage | None] = queue.Queue()
    register = pb.Register(pool=pool, slots=slots, worker_name="raw-example", protocol_version=3)
    outbox.put(pb.WorkerMessage(register=register))
    threading.Thread(target=lambda: (stop.wait(), outbox.put(None)), daemon=True).start()

    def messages() -> Iterator[pb.WorkerMessage]:
        while (msg := outbox.get()) is not None:
            yield msg

    for msg in cronoq_pb2_grpc.WorkersStub(channel).Work(messages()):
        kind = msg.WhichOneof("msg")
        if kind == "lease":
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
    stop = threading.Event()
    with grpc.insecure_channel(args.server) as channel:
        worker = threading.Thread(target=work, args=(channel, args.pool, args.slots, stop))
        worker.start()
        if args.submit:
            tasks = cronoq_pb2_grpc.TasksStub(channel)
            for i in range(args.submit):
                spec = pb.TaskSpec(payload=f"hello {i}".encode(), pool=args.pool)
                got = tasks.Submit(pb.SubmitRequest(task=spec, wait=True, wait_timeout_s=10))
                print(got.id, got.result.output)
            stop.set()
        worker.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
