"""User code with the mistakes cronoq's typed options catch: `mypy --strict` rejects each line
whose comment names its error (tests/unit/test_typing.py), and no other line."""

from __future__ import annotations

import cronoq
from cronoq.client import Client, task


async def run(ctx: cronoq.TaskContext, payload: int) -> int:
    return payload


async def library() -> None:
    pool = cronoq.Pool("default", run, overflow="drop")  # E: "overflow" to "Pool"
    async with cronoq.Scheduler([pool]) as sched:
        await sched.submit(1, priority="urgent")  # E: "priority" to "submit" of "Scheduler"
        await sched.submit(1, pirority="high")  # E: Unexpected keyword argument "pirority"
        await sched.enqueue(1, on_miss="run-late")  # E: "on_miss" to "enqueue" of "Scheduler"
        await sched.enqueue(1, timeout="5s")  # E: "timeout" to "enqueue" of "Scheduler"
        cronoq.Task(1, priorty="low")  # E: Unexpected keyword argument "priorty"
        cronoq.Dep("x", on="succeeded")  # E: Argument "on" to "Dep"
        await sched.add_recurring("n", "* * * * *", 1, overlap="never")  # E: "overlap"
        await sched.add_recurring("n", "* * * * *", 1, after="x")  # E: Unexpected keyword
        sched.events(on_lag="drop")  # E: "on_lag" to "events" of "Scheduler"
        if await sched.status(1) == "sucess":  # E: Non-overlapping equality check
            pass


async def client(c: Client) -> None:
    task(1, priority="urgent")  # E: "priority" to "task"
    task(1, deps=[(1, "succeeded")])  # E: List item 0 has incompatible type
    await c.submit(1, pirority="high")  # E: Unexpected keyword argument "pirority"
    await c.submit(1, on_miss="late")  # E: "on_miss" to "submit" of "Client"
    await c.add_recurring("n", "* * * * *", None, overlap="never")  # E: "overlap"
