"""A worker process for the failover tests (test_server_ha.py): `python ha_worker_child.py
RECORD TARGET...` runs one `cronoq.client.Worker` per target on the pool "default".

Each lease is recorded in the file RECORD as the line `ran <task id> <attempt>` (written and
flushed before the handler's work starts), then answered after a few milliseconds with its
payload reversed. "started" is printed on stdout once every worker runs; SIGTERM stops them.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys

from cronoq.client import Lease, Worker

SLOTS = 4
BACKOFF = (0.05, 0.5)  # reconnect soon: the leader changes often in these tests


async def main(record: str, targets: list[str]) -> None:
    with open(record, "a", encoding="utf-8") as out:

        async def handler(lease: Lease) -> bytes:
            out.write(f"ran {lease.task_id} {lease.attempt}\n")
            out.flush()
            await asyncio.sleep(random.uniform(0.0, 0.02))  # some attempts run at each kill
            return lease.payload[::-1]

        workers = [
            Worker(target, "default", handler, slots=SLOTS, backoff=BACKOFF, grace=1.0)
            for target in targets
        ]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runs = [asyncio.create_task(w.run()) for w in workers]
        print("started", flush=True)
        await stop.wait()
        await asyncio.gather(*(w.stop() for w in workers))
        await asyncio.gather(*runs)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
