"""A scheduler process on a shared SQLite file, driven line by line by test_store_leader.py.

    python store_leader_child.py DB NAME LEASE_TTL

Several of these open one file; only the leader gets past `start()`. It prints
"starting" before `start()` and "started EPOCH UNIX_TIME" once it leads, then obeys one
command per stdin line and answers on stdout (every line begins with the command's word, so
the test can wait for a given answer whatever else is printed meanwhile):

    submit KEY SECONDS  ->  "submitted KEY ID", later "result KEY JSON" or "failed KEY STATUS MSG"
    result KEY          ->  "result KEY JSON" or "failed KEY STATUS MSG" (waits for the end)
    status KEY          ->  "status KEY STATUS"
    shutdown            ->  "stopped UNIX_TIME" (a clean stop: gives the lease up)
    exit                ->  the process ends

A command that raises answers "error COMMAND TYPE: MESSAGE". Each executor prints
"run KEY ID ATTEMPT" when it starts, sleeps SECONDS and returns {"by": NAME, "attempt": N}.
An attempt after the first (a task taken over from a dead or deposed leader) sleeps a minute
instead, so that its row stays RUNNING while the test looks at the file.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import cronoq


def say(*words: object) -> None:
    print(*words, flush=True)


async def main(db: str, name: str, lease_ttl: float) -> None:
    async def execute(ctx: cronoq.TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        say("run", ctx.key, ctx.id, ctx.attempt)
        await asyncio.sleep(payload["sleep"] if ctx.attempt == 1 else 60.0)
        return {"by": name, "attempt": ctx.attempt}

    store = cronoq.SqliteStore(db, lease_ttl=lease_ttl, lease_renew=lease_ttl / 4, lock_poll=0.05)
    sched = cronoq.Scheduler(
        [cronoq.Pool("default", execute, max=4, autoscale=False)], store=store, shutdown_grace=0.0
    )
    say("starting")
    await sched.start()
    say("started", store.epoch, repr(time.time()))

    async def report(key: str, handle: cronoq.TaskHandle) -> None:
        try:
            say("result", key, json.dumps(await handle, separators=(",", ":")))
        except cronoq.TaskFailed as e:
            say("failed", key, e.status, e.message)

    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    background: set[asyncio.Task[None]] = set()
    while line := (await stdin.readline()).decode():
        command, *args = line.split()
        try:
            if command == "submit":
                handle = await sched.submit({"sleep": float(args[1])}, key=args[0])
                say("submitted", args[0], handle.id)
                task = loop.create_task(report(args[0], handle))
                background.add(task)
                task.add_done_callback(background.discard)
            elif command == "result":
                found = await sched.handle(args[0])
                if found is None:
                    say("result", args[0], "unknown")
                else:
                    await report(args[0], found)
            elif command == "status":
                say("status", args[0], await sched.status(args[0]))
            elif command == "shutdown":
                await sched.shutdown()
                say("stopped", repr(time.time()))
            elif command == "exit":
                break
        except Exception as e:
            say("error", command, f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    db_path, process_name, ttl = sys.argv[1:]
    asyncio.run(main(db_path, process_name, float(ttl)))
