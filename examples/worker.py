"""A remote Python worker for `cronoq-server`, as the "Remote workers: Python" guide writes one:
the handler decodes its lease, hands back what it cannot run, and tells retryable failures from
permanent ones.

    python examples/worker.py                  # serve pool "default" of http://127.0.0.1:7070
    python examples/worker.py --submit 4       # ... and submit 4 tasks, print results, stop

The worker token comes from CRONOQ_WORKER_TOKEN and the client token (for --submit) from
CRONOQ_TOKEN; a server started without a config needs neither. A refusal that trying again
cannot fix (a wrong token, an unknown pool) ends the program with one line and exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import Any

import cronoq
from cronoq.client import CancelTask, Client, ClientError, Lease, Reject, Worker


class TransientError(Exception):
    """What a flaky backend raises: worth another attempt a little later."""


async def process(job: dict[str, Any], lease: Lease) -> dict[str, int]:
    await asyncio.sleep(job.get("seconds", 0.01))  # stands in for real work
    if job.get("flaky") and lease.attempt == 1:
        raise TransientError("backend timed out")
    if not isinstance(job.get("n"), int):
        raise ValueError("the payload needs an integer 'n'")
    return {"square": job["n"] ** 2, "attempt": lease.attempt}


async def handle(lease: Lease) -> Any:
    job = lease.json() or {}
    if job.get("needs") == "gpu":
        raise Reject("no GPU on this worker")  # another worker of the pool may take it
    if job.get("cancel"):
        raise CancelTask("the payload asked to cancel the task")
    try:
        return await process(job, lease)
    except TransientError as e:
        raise cronoq.Retryable(str(e), retry_after=0.1) from e
    except ValueError as e:
        raise cronoq.Permanent(str(e)) from e


async def submit_some(server: str, pool: str, count: int) -> None:
    """Submit `count` tasks (one flaky, one invalid when there are enough) and print results."""
    jobs: list[dict[str, Any]] = [{"n": i} for i in range(count)]
    if count > 1:
        jobs[1]["flaky"] = True
    if count > 2:
        jobs[2] = {"oops": "no n"}
    async with Client(server, token=os.environ.get("CRONOQ_TOKEN")) as client:
        submitted = [await client.submit(job, pool=pool) for job in jobs]
        for s in submitted:
            result = await client.wait(s.id, timeout=30)
            detail = result.text() if result.ok else result.message
            print(f"task {s.id}: {result.status} {detail}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--server", default=os.environ.get("CRONOQ_SERVER", "http://127.0.0.1:7070")
    )
    parser.add_argument("--pool", default="default")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--submit", type=int, default=0, metavar="N")
    args = parser.parse_args()

    worker = Worker(
        args.server,
        args.pool,
        handle,
        slots=args.slots,
        token=os.environ.get("CRONOQ_WORKER_TOKEN"),
        name="example-worker",
        grace=5,
    )
    serving = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, worker.begin_stop)  # no lease taken from then on
    if args.submit:
        registered = asyncio.ensure_future(worker.wait_registered(10))
        await asyncio.wait([registered, serving], return_when=asyncio.FIRST_COMPLETED)
        if registered.done():
            await registered
            print(f"worker {worker.worker_id} registered with {worker.granted_slots} slots")
            try:
                await submit_some(args.server, args.pool, args.submit)
            finally:
                await worker.stop()
        else:
            registered.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await registered
    await serving  # returns after stop(); raises ClientError on a fatal refusal


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except ClientError as e:  # e.g. "unauthenticated: unknown token"
        sys.exit(f"worker.py: {e}")
