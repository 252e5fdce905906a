"""A remote worker process for the browser tests: `python dash_worker_child.py TARGET` runs one
`cronoq.client.Worker` (pool "default", 3 slots, labels zone=eu) whose handler does what the
payload's "do" says, so the dashboard shows every outcome: "ok" succeeds, "fail" fails for
good, "flaky" fails its first attempt then succeeds, "boom" fails every attempt (a task with
a retry policy is then dead-lettered), "hold" keeps its lease until the attempt is abandoned
(the task cancelled). "registered" is printed on stdout once it is
registered; SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import cronoq
from cronoq.client import Lease, Worker

NAME = "dash-worker"
SLOTS = 3
LABELS = {"zone": "eu"}


async def handle(lease: Lease) -> Any:
    what = (lease.json() or {}).get("do", "ok")
    if what == "hold":
        await lease.cancelled.wait()
    if what == "fail":
        raise cronoq.Permanent("no such mailbox")
    if what == "boom" or (what == "flaky" and lease.attempt == 1):
        raise cronoq.Retryable(f"attempt {lease.attempt} blew up")
    return {"done": what, "attempt": lease.attempt}


async def main(target: str) -> None:
    worker = Worker(target, "default", handle, slots=SLOTS, name=NAME, labels=LABELS, grace=1.0)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    run = asyncio.create_task(worker.run())
    await worker.wait_registered()
    print("registered", flush=True)
    await stop.wait()
    await worker.stop()
    await run


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
