"""The Python side of tests/python.rs: cronoq's Python SqliteStore on a file the Rust store
shares.

    python_store.py read PATH   load the file, print every task as the Python store reads it,
                                then lead (printing the epoch) and release
    python_store.py write PATH  lead, write tasks of every status through rows.insert_row and
                                rows.update_row (two batches) and a schedule with every
                                option through rows.schedule_row, release, then print as `read`

Schedules are printed as the Python scheduler reads them back (`_durable._schedule`), with the
stored definition and the one the Python store would write for what it read.

The printed JSON is what tests/python.rs compares, field by field, with what the Rust store
wrote or reads.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from cronoq._durable import _schedule
from cronoq.core.model import (
    CANCELLED,
    DEAD_LETTERED,
    READY,
    RETRYING,
    RUNNING,
    STATUS_NAMES,
    SUCCEEDED,
    RetryPolicy,
    TaskRecord,
)
from cronoq.store.base import COLUMN, Batch, first_id
from cronoq.store.rows import insert_row, record_from_row, schedule_row, update_row
from cronoq.store.sqlite import SqliteStore

T0 = 1_700_000_000.0  # Unix seconds


class Raw:
    """Payloads and outputs are bytes already."""

    def encode(self, obj: Any) -> bytes:
        return bytes(obj)

    def decode(self, data: bytes) -> Any:
        return data


def _hex(value: bytes | None) -> str | None:
    return None if value is None else value.hex()


async def dump(store: SqliteStore) -> dict[str, Any]:
    stored = await store.load()
    tasks = []
    for row in stored.tasks:
        rec, problem = record_from_row(row, Raw())
        r = rec.retry
        tasks.append(
            {
                "id": rec.id,
                "seq": rec.seq,
                "arrival": row[COLUMN["arrival"]],
                "pool": rec.pool,
                "kind": rec.kind,
                "priority": rec.cls,
                "key": rec.key,
                "payload": _hex(row[COLUMN["payload"]]),
                "deadline": row[COLUMN["deadline"]],
                "duration_hint": rec.duration_hint,
                "timeout": rec.timeout,
                "retry": None
                if r is None
                else [r.max_attempts, r.initial_backoff, r.multiplier, r.max_backoff, r.jitter],
                "tags": rec.tags,
                "tenant": rec.tenant,
                "status": STATUS_NAMES[rec.status],
                "attempt": rec.attempt,
                "message": rec.message,
                "output": _hex(row[COLUMN["output"]]),
                "updated": row[COLUMN["updated"]],
                "problem": problem,
            }
        )
    schedules = []
    for name, spec, payload, next_ns, last_id in stored.schedules:
        sched = _schedule(name, spec, payload, Raw())
        r = sched.retry
        schedules.append(
            {
                "name": sched.name,
                "spec": spec,
                "rewritten": schedule_row(sched, payload)[1],
                "cron": sched.cron,
                "tz": sched.tz_name,
                "pool": sched.pool,
                "priority": sched.cls,
                "kind": sched.kind,
                "key": sched.key,
                "tenant": sched.tenant,
                "deadline_in": sched.deadline_in,
                "duration_hint": sched.duration_hint,
                "timeout": sched.timeout,
                "retry": None
                if r is None
                else [r.max_attempts, r.initial_backoff, r.multiplier, r.max_backoff, r.jitter],
                "resources": sched.resources,
                "tags": sched.tags,
                "labels": sched.labels,
                "overlap": sched.overlap,
                "tolerance": sched.tolerance,
                "on_miss": sched.on_miss,
                "payload": _hex(sched.payload),
                "next": next_ns,
                "last": last_id,
            }
        )
    return {"max_id": stored.max_id, "tasks": tasks, "schedules": schedules}


def task(tid: int, seq: int, status: int, attempt: int, **spec: Any) -> TaskRecord:
    rec = TaskRecord(spec.pop("payload", b"p%d" % seq), spec.pop("pool", "default"), **spec)
    rec.id, rec.seq, rec.status, rec.attempt = tid, seq, status, attempt
    rec.submitted_at = T0 + seq
    rec.eligible_at = T0 + seq
    return rec


async def write(store: SqliteStore) -> None:
    epoch = await store.lead()
    base = first_id(epoch)
    full = task(
        base,
        1,
        READY,
        0,
        pool="io",
        cls=1,
        kind="report",
        key="nightly",
        tenant="acme",
        deadline=T0 + 60,
        duration_hint=1.5,
        timeout=2.25,
        retry=RetryPolicy(5, 0.25, 1.5, 30.0, False),
        tags={"team": "data", "region": "eu"},
    )
    running = task(base + 1, 2, READY, 0, key="running")
    retrying = task(base + 2, 3, RETRYING, 1)
    retrying.ready_at = T0 + 30
    done = task(base + 3, 4, RUNNING, 1, key="done")
    dead = task(base + 4, 5, RUNNING, 3)
    gone = task(base + 5, 6, READY, 0, key="gone")
    now = T0 + 10
    spec = {
        "cron": "0 2 * * *",
        "tz": "Europe/Berlin",
        "pool": "io",
        "priority": 1,
        "kind": "report",
        "key": "nightly",
        "tenant": "acme",
        "deadline_in": 60.0,
        "duration_hint": 1.5,
        "timeout": 2.25,
        "retry": "[5,0.25,1.5,30.0,false]",
        "resources": {"db": 1},
        "tags": {"team": "data", "region": "eu"},
        "labels": {"zone": "eu"},
        "overlap": "queue",
        "tolerance": 3.0,
        "on_miss": "skip",
    }
    sched = _schedule("nightly", json.dumps(spec), b"sched", Raw())
    sched.next_time, sched.last = T0 + 3600, full
    first = Batch(
        inserts=[
            insert_row(r, r.payload, None, now) for r in (full, running, retrying, done, dead, gone)
        ],
        schedules=[schedule_row(sched, b"sched")],
        max_id=base + 5,
    )
    await store.commit_nowait(first)
    # The second batch: a live change and three ends, through update_row as the driver does.
    running.status, running.attempt, running.started_at = RUNNING, 2, T0 + 11
    done.status, done.finished_at = SUCCEEDED, T0 + 12
    dead.status, dead.message, dead.finished_at = DEAD_LETTERED, "retries exhausted", T0 + 13
    gone.status, gone.message, gone.finished_at = CANCELLED, "cancelled", T0 + 14
    second = Batch(max_id=base + 5)
    for rec, output in ((running, None), (done, b"out"), (dead, None), (gone, None)):
        row, ended = update_row(rec, output)
        (second.finishes if ended else second.updates).append(row)
    await store.commit_nowait(second)
    await store.close()


async def main(mode: str, path: str) -> None:
    store = SqliteStore(path, lease_ttl=2.0, lease_renew=0.5, lock_poll=0.05)
    if mode == "write":
        await store.open()
        await write(store)
    await store.open()
    out = await dump(store)
    out["epoch"] = await store.lead()
    await store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
