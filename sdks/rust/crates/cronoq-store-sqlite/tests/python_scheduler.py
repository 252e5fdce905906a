"""The Python side of tests/scheduler.rs: a Python `cronoq.Scheduler` on a SQLite file that a
Rust scheduler wrote or will take over.

    python_scheduler.py write PATH        lead; a task that succeeds (key "py-done", b"abc"),
                                          one that never ends (b"stuck") and one queued
                                          behind it (key "py-queued", b"xyz"); stop with the
                                          last two live; print their ids
    python_scheduler.py run PATH KEY...   lead; await each key's task; print how it ended
    python_scheduler.py recurring PATH    lead; add the schedule "py-tick" (every second, key
                                          "py-tick", b"tick", overlap allow); stop once an
                                          occurrence ran and the latest created is not started;
                                          print the keys run and that pending occurrence
    python_scheduler.py resume PATH NAME ID
                                          lead; wait until task ID (an occurrence of schedule
                                          NAME that a Rust scheduler left) and the one after it
                                          ran; print the keys run and the schedule's state

Executors return their payload reversed (b"stuck" never returns), as the Rust side's do.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import cronoq


class Raw:
    """Payloads and outputs are bytes already."""

    def encode(self, obj: Any) -> bytes:
        return bytes(obj)

    def decode(self, data: bytes) -> Any:
        return data


RAN: list[list[Any]] = []  # [task id, key] of each attempt, in order


async def execute(ctx: cronoq.TaskContext, payload: bytes) -> bytes:
    RAN.append([ctx.id, ctx.key])
    if payload == b"stuck":
        await asyncio.Event().wait()
    return payload[::-1]


def scheduler(path: str) -> cronoq.Scheduler:
    store = cronoq.SqliteStore(path, lock_poll=0.05, retention=1e9)
    pool = cronoq.Pool("default", execute, max=1, autoscale=False)
    return cronoq.Scheduler([pool], store=store, codec=Raw(), shutdown_grace=0.0)


async def write(path: str) -> dict[str, Any]:
    sched = scheduler(path)
    await sched.start()
    done = await sched.submit(b"abc", key="py-done")
    assert await done == b"cba"
    stuck = await sched.submit(b"stuck")
    while await sched.status(stuck.id) != "running":
        await asyncio.sleep(0.01)
    queued = await sched.submit(b"xyz", key="py-queued")
    await sched.shutdown()
    return {"done": done.id, "stuck": stuck.id, "queued": queued.id}


async def run(path: str, keys: list[str]) -> dict[str, Any]:
    sched = scheduler(path)
    await sched.start()
    out: dict[str, Any] = {}
    for key in keys:
        handle = await sched.handle(key)
        assert handle is not None, key
        try:
            out[key] = {"id": handle.id, "output": (await handle).hex()}
        except cronoq.TaskFailed as e:
            out[key] = {"id": handle.id, "failed": str(e)}
    await sched.shutdown()
    return out


async def recurring(path: str) -> dict[str, Any]:
    sched = scheduler(path)
    await sched.start()
    await sched.add_recurring(
        "py-tick", "* * * * * *", b"tick", key="py-tick", overlap="allow", pool="default"
    )
    engine = sched.serving()
    while True:
        await asyncio.sleep(0.05)
        last = engine.recurring["py-tick"].last
        if RAN and last is not None and await sched.status(last.id) == "scheduled":
            break
    await sched.shutdown()
    return {"ran": RAN, "pending": {"id": last.id, "key": last.key}}


async def resume(path: str, name: str, task_id: int) -> dict[str, Any]:
    sched = scheduler(path)
    await sched.start()
    engine = sched.serving()
    while not any(i == task_id for i, _ in RAN) or RAN[-1][0] == task_id:
        await asyncio.sleep(0.05)
    state = engine.recurring[name]
    status = await sched.status(task_id)
    await sched.shutdown()
    return {"ran": RAN, "status": status, "cron": state.cron, "key": state.key}


if __name__ == "__main__":
    mode, db, *rest = sys.argv[1:]
    modes = {
        "write": lambda: write(db),
        "run": lambda: run(db, rest),
        "recurring": lambda: recurring(db),
        "resume": lambda: resume(db, rest[0], int(rest[1])),
    }
    result = asyncio.run(modes[mode]())
    print(json.dumps(result))
