"""User code that uses cronoq's typed options correctly: `mypy --strict` accepts it."""

from __future__ import annotations

import cronoq
from cronoq.client import Client, task


async def run(ctx: cronoq.TaskContext, payload: int) -> int:
    return payload * 2


async def library() -> None:
    pool = cronoq.Pool("default", run, max=4, overflow="shed_oldest", unknown_dependency="await")
    async with cronoq.Scheduler([pool]) as sched:
        h = await sched.submit(21, priority="high", key="answer", timeout=5.0, on_miss="skip")
        await sched.enqueue(1, priority=cronoq.Priority.LOW, deps=[cronoq.Dep("answer")])
        await sched.enqueue(2, priority=0, after="answer", start_in=1.0, tolerance=0.5)
        await sched.submit_batch([cronoq.Task(3, tenant="t", tags={"a": 1})])
        await sched.add_recurring("nightly", "0 3 * * *", 4, overlap="queue", priority="low")
        if await sched.status("answer") == "succeeded":
            print(await h)
        async with sched.events(on_lag="raise") as events:
            async for ev in events:
                print(ev.status)
                break


async def client(c: Client) -> None:
    spec = task(1, priority="critical", on_miss="run_late", deps=[("parent", "on_complete")])
    await c.submit_batch([spec])
    done = await c.submit({"x": 1}, wait=True, priority="normal", key="k", tenant="t")
    if done.result is not None and done.result.status == "dead_lettered":
        print(done.id)
    await c.add_recurring("n", "* * * * *", None, overlap="queue_on_success")
