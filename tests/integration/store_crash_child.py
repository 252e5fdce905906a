"""One life of the process that test_store_crash.py kills over and over.

    python store_crash_child.py DB LOGDIR RUN TOTAL final|killed|start:N|submit:N [SCHEMA]

It leads the store DB (a SQLite file; with SCHEMA, DB is a PostgreSQL URL and the store that
schema of it), submits the tasks of a fixed plan of TOTAL keys that its
predecessors did not acknowledge, runs whatever the file holds and prints "done" once every
task of the plan is terminal. Then the `final` life stops cleanly and exits 0; the others
wait to be SIGKILLed by the test (so no life but the last ends by itself, however fast the
machine). With `start:N` (`submit:N`) a life SIGKILLs itself right after logging its Nth
executor start (acknowledged submit): the moment at which a start or an acknowledgement that
ran ahead of its commit would be lost, which random kills from outside hit only by luck.

Two append-only logs in LOGDIR are the evidence the test checks the file against, so each
line is written with one os.write and fsynced before anything depends on it:

* submits.log, "RUN ID KEY DUP": written once `submit`/`submit_batch` returned, i.e. after
  the store acknowledged the rows. A later life resubmits only the keys missing here; a key
  that was committed but not logged before a kill must come back as the same task (DUP=1).
* starts.log, "RUN ID ATTEMPT": written by the executor before it does any work, so an
  attempt that ran appears here even if its outcome never reached the file.

The plan is deterministic (`plan(i)`): whether attempt n fails depends only on n, so the test
can tell from a task's final attempt number which status it must have ended with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import Any

import cronoq

MAX_ATTEMPTS = 3
SLOW_SECONDS = 5.0  # longer than any life the test lets run before killing it
RETRY = cronoq.RetryPolicy(MAX_ATTEMPTS, initial_backoff=0.02, max_backoff=0.1)
SUBMITTERS = 3
PACE = 0.03  # seconds between a submitter's calls: spreads the submissions over many lives


def key_of(i: int) -> str:
    return f"k{i:05d}"


def plan(i: int) -> dict[str, Any]:
    """Task i's payload. Attempts 1..`fails` raise Retryable (fails=3: every attempt does);
    each attempt sleeps `sleep` seconds, except attempt `slow_at`, which sleeps SLOW_SECONDS,
    so that a kill is sure to catch it running: slow tasks lose their first attempt (and
    retry) or their last one (and are dead-lettered) whenever it starts in a killed life."""
    if i % 101 == 7:
        return {"i": i, "fails": 0, "slow_at": 1, "sleep": 0.0}
    if i % 101 == 57:
        return {"i": i, "fails": 2, "slow_at": 3, "sleep": 0.0}
    fails = (0, 0, 0, 0, 0, 0, 1, 1, 2, 3)[i * 7 % 10]
    return {"i": i, "fails": fails, "slow_at": 0, "sleep": 0.002 + (i * 13 % 11) / 1000}


class Log:
    """An append-only log whose every line is on disk when `write` returns; after its
    `die_after`-th write the process SIGKILLs itself."""

    def __init__(self, path: str, die_after: int = 0) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.writes = 0
        self.die_after = die_after

    def write(self, lines: list[str]) -> None:
        os.write(self.fd, "".join(line + "\n" for line in lines).encode())
        self.writes += 1
        if self.writes == self.die_after:
            # As early as possible; what os.write wrote survives the death of the process.
            os.kill(os.getpid(), signal.SIGKILL)
        os.fsync(self.fd)


def open_store(db: str, schema: str | None) -> cronoq.SqliteStore | cronoq.PostgresStore:
    if schema is not None:
        return cronoq.PostgresStore(db, schema=schema)
    return cronoq.SqliteStore(db, lease_ttl=1.0, lease_renew=0.3, lock_poll=0.05)


async def main(db: str, logdir: str, run: int, total: int, mode: str, schema: str | None) -> None:
    point, _, count = mode.partition(":")
    starts = Log(os.path.join(logdir, "starts.log"), int(count) if point == "start" else 0)
    submits = Log(os.path.join(logdir, "submits.log"), int(count) if point == "submit" else 0)
    submits_path = os.path.join(logdir, "submits.log")
    with open(submits_path) as f:
        acknowledged = {line.split()[2] for line in f if line.endswith("\n")}

    async def execute(ctx: cronoq.TaskContext, payload: dict[str, Any]) -> dict[str, int]:
        starts.write([f"{run} {ctx.id} {ctx.attempt}"])
        slow = ctx.attempt == payload["slow_at"]
        await asyncio.sleep(SLOW_SECONDS if slow else payload["sleep"])
        if ctx.attempt <= payload["fails"]:
            raise cronoq.Retryable(f"planned failure {ctx.attempt}")
        return {"i": payload["i"], "attempt": ctx.attempt}

    store = open_store(db, schema)
    sched = cronoq.Scheduler(
        [
            cronoq.Pool("default", execute, max=8, autoscale=False),
            cronoq.Pool("slow", execute, max=64, autoscale=False),
        ],
        store=store,
        shutdown_grace=0.0,
    )
    await sched.start()
    print("ready", store.epoch, flush=True)

    def options(i: int) -> dict[str, Any]:
        pool = "slow" if plan(i)["slow_at"] else "default"
        return {"key": key_of(i), "pool": pool, "retry": RETRY}

    # Chunks of the keys not yet acknowledged: single submits and batches of 1..7, alternating.
    todo = [i for i in range(total) if key_of(i) not in acknowledged]
    chunks: list[list[int]] = []
    while todo:
        size = 1 if len(chunks) % 2 == 0 else 1 + len(chunks) % 7
        chunks.append(todo[:size])
        todo = todo[size:]
    chunks.reverse()

    async def submitter() -> None:
        while chunks:
            chunk = chunks.pop()
            if len(chunk) == 1:
                handles = [await sched.submit(plan(chunk[0]), **options(chunk[0]))]
            else:
                batch = [cronoq.Task(plan(i), **options(i)) for i in chunk]
                handles = await sched.submit_batch(batch)
            submits.write(
                [
                    f"{run} {h.id} {key_of(i)} {int(h.duplicate)}"
                    for i, h in zip(chunk, handles, strict=True)
                ]
            )
            await asyncio.sleep(PACE)

    await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))
    for i in range(total):
        handle = await sched.handle(key_of(i))
        if handle is None:
            sys.exit(f"acknowledged task {key_of(i)} is unknown after the restart")
        with contextlib.suppress(cronoq.TaskFailed):
            await handle
    print("done", flush=True)
    if mode != "final":
        await asyncio.Event().wait()  # until SIGKILL
    await sched.shutdown()


if __name__ == "__main__":
    db_path, log_dir, run_no, task_count, life_mode, *rest = sys.argv[1:]
    schema_name = rest[0] if rest else None
    asyncio.run(main(db_path, log_dir, int(run_no), int(task_count), life_mode, schema_name))
