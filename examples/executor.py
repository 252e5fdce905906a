"""A Python executor in library mode, as the "Python executors" guide writes one: it logs
retries, works through its payload in chunks, heartbeats its lease between chunks, and lets
cronoq retry a flaky first attempt.

    python examples/executor.py
"""

from __future__ import annotations

import asyncio
import logging

import cronoq

log = logging.getLogger("example")


def work(payload: dict[str, int]) -> list[range]:
    """Split the job into chunks of at most 10 items."""
    n = payload["items"]
    return [range(i, min(i + 10, n)) for i in range(0, n, 10)]


async def process(chunk: range) -> int:
    await asyncio.sleep(0.01)  # stands in for real I/O
    return sum(chunk)


async def run(ctx: cronoq.TaskContext, payload: dict[str, int]) -> str:
    if ctx.attempt > 1:
        log.info("retrying %s (attempt %d)", ctx.id, ctx.attempt)
    elif payload.get("flaky"):
        raise cronoq.Retryable("backend busy", retry_after=0.05)
    total = 0
    for chunk in work(payload):
        total += await process(chunk)
        ctx.heartbeat()  # keeps the lease alive: this pool has lease_ttl=0.5
    return f"sum {total} on attempt {ctx.attempt}"


async def main() -> None:
    pool = cronoq.Pool(
        "default",
        run,
        max=4,
        autoscale=False,
        lease_ttl=0.5,
        retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.05),
    )
    async with cronoq.Scheduler([pool]) as sched:
        steady = await sched.submit({"items": 100})
        flaky = await sched.submit({"items": 40, "flaky": 1})
        print("steady:", await steady)  # sum 4950 on attempt 1
        print("flaky:", await flaky)  # sum 780 on attempt 2


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    asyncio.run(main())
