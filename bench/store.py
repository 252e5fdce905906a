"""Durable-store benchmark of cronoq: what acknowledged-means-durable costs, in one run.

Machines here are noisy, so the durable batch is printed as a ratio to the in-memory batch
measured in the same run, and throughput phases take the best of interleaved runs.

Phases
------
[1]  in-memory batch: `await sched.submit_batch([Task(i) for i in range(N)])` on a 64-slot
     fixed pool with a no-op executor, then every handle awaited (as bench/library.py [2b]).
[2]  the same on a scheduler with `SqliteStore` (WAL, synchronous=FULL: every commit is
     fsynced): submit_batch returns once all N rows are committed; each attempt starts after
     its RUNNING row is committed; results are written too. Ratio to [1] (target >= 0.5x).
[3a] sequential durable submits: one submitter, `await sched.submit(i)` M times (each returns
     after its commit), then every handle awaited. Tasks/s of the submit loop and of the whole
     run (target: submit loop >= 5,000 tasks/s).
[3b] the same with `SqliteStore(full_sync=False)` (synchronous=NORMAL: a commit is in the WAL,
     and so survives the process being killed, but is fsynced only at checkpoints, so an OS
     crash or power cut may lose the last commits).
[4]  the same M submits from 64 concurrent submitters (asyncio tasks, M/64 each): group commit
     lets them share transactions. Tasks/s and commits per task.
[0]  what this machine allows, measured first: the p50 of a 4 KiB write + fdatasync in the
     benchmark's directory (what a FULL commit waits for) and of a round trip to the store's
     thread (what every commit pays twice: to the thread and back to the loop). One commit per
     acknowledged submit bounds [3a] by 1 / (fdatasync + round trip), printed as its ceiling.
     [2] is broken down from the best run: the batch's insert transaction, then per 64-task
     round the commit and the rest (the loop's own work and the wake-ups).

Every durable phase uses a fresh file in a temporary directory on the same file system as
/tmp. The exit status is 0 whether targets are met or not.

Usage: python bench/store.py [--n N] [--m M] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import cronoq
from _common import percentile, verdict
from cronoq import Pool, Scheduler, SqliteStore, Task

SLOTS = 64
SUBMITTERS = 64
TARGET_BATCH_RATIO = 0.5
TARGET_SEQ_RATE = 5_000.0


async def noop(ctx: Any, payload: Any) -> Any:
    return payload


class Files:
    """Fresh database paths in one temporary directory, removed at the end."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cronoq-bench-")
        self.n = 0

    def store(self, full_sync: bool = True) -> SqliteStore:
        self.n += 1
        return SqliteStore(os.path.join(self.dir, f"bench{self.n}.db"), full_sync=full_sync)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _scheduler(store: SqliteStore | None) -> Scheduler:
    return Scheduler([Pool("default", noop, autoscale=False, max=SLOTS)], store=store)


class Timing:
    """Times every transaction the store thread writes in one run (insert, then rounds)."""

    def __init__(self, store: SqliteStore) -> None:
        self.commits: list[tuple[float, int]] = []  # (seconds, rows written)
        inner = store._commit

        def timed(batch: Any) -> None:
            t0 = time.perf_counter()
            inner(batch)
            rows = len(batch.inserts) + len(batch.updates) + len(batch.finishes)
            self.commits.append((time.perf_counter() - t0, rows))

        store._commit = timed  # type: ignore[method-assign]


def machine_floor(directory: str, samples: int) -> tuple[float, float]:
    """[0]: p50 seconds of a 4 KiB write + fdatasync, and of a store-thread round trip."""
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    block = b"\0" * 4096
    syncs = []
    try:
        for i in range(samples):
            t0 = time.perf_counter()
            os.pwrite(fd, block, (i % 16) * 4096)
            os.fdatasync(fd)
            syncs.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.remove(path)

    async def round_trips() -> list[float]:
        store = SqliteStore(os.path.join(directory, "probe.db"))
        await store.open()
        out = []
        try:
            for _ in range(samples):
                t0 = time.perf_counter()
                await store._call(int)  # an empty job: the hand-over and the wake-up only
                out.append(time.perf_counter() - t0)
        finally:
            await store.close()
        return out

    trips = asyncio.run(round_trips())
    return percentile(sorted(syncs), 0.5), percentile(sorted(trips), 0.5)


class Counting:
    """Counts the store's commits (transactions) of one run."""

    def __init__(self, store: SqliteStore) -> None:
        self.commits = 0
        inner = store.commit_nowait

        def commit_nowait(batch: Any) -> Any:
            self.commits += 1
            return inner(batch)

        store.commit_nowait = commit_nowait  # type: ignore[method-assign]


async def phase_batch(n: int, store: SqliteStore | None) -> float:
    async with _scheduler(store) as sched:
        t0 = time.perf_counter()
        handles = await sched.submit_batch([Task(i) for i in range(n)])
        for h in handles:
            await h
        dt = time.perf_counter() - t0
        snap = await sched.snapshot()
        assert snap.totals["succeeded"] == n, snap.totals
    return dt


async def phase_sequential(m: int, store: SqliteStore) -> tuple[float, float]:
    """(seconds of the submit loop, seconds until every task ended)."""
    async with _scheduler(store) as sched:
        t0 = time.perf_counter()
        handles = [await sched.submit(i) for i in range(m)]
        t1 = time.perf_counter()
        for h in handles:
            await h
        t2 = time.perf_counter()
    return t1 - t0, t2 - t0


async def phase_concurrent(m: int, store: SqliteStore) -> tuple[float, int]:
    """(seconds until every task ended, commits) with SUBMITTERS concurrent submitters."""
    counting = Counting(store)
    async with _scheduler(store) as sched:

        async def submitter(k: int) -> list[Any]:
            return [await sched.submit(i) for i in range(k, m, SUBMITTERS)]

        t0 = time.perf_counter()
        per = await asyncio.gather(*(submitter(k) for k in range(SUBMITTERS)))
        for handles in per:
            for h in handles:
                await h
        dt = time.perf_counter() - t0
    return dt, counting.commits


async def _best(reps: int, runs: list[Callable[[], Awaitable[float]]]) -> list[list[float]]:
    """Interleaved runs of each phase, `reps` rounds; returns seconds per phase per round."""
    out: list[list[float]] = [[] for _ in runs]
    for _ in range(reps):
        for i, run in enumerate(runs):
            gc.collect()
            out[i].append(await run())
    return out


async def main_async(n: int, m: int, reps: int, floor: tuple[float, float]) -> None:
    files = Files()
    timings: list[Timing] = []

    def timed_store() -> SqliteStore:
        store = files.store()
        timings.append(Timing(store))
        return store

    try:
        await phase_batch(min(n, 500), None)  # warm-up
        await phase_batch(min(n, 500), files.store())
        mem, dur = await _best(
            reps,
            [lambda: phase_batch(n, None), lambda: phase_batch(n, timed_store())],
        )
        r_mem = n / min(mem)
        r_dur = n / min(dur)
        ratio = r_dur / r_mem
        print(
            f"[1]  in-memory batch      N={n:,}: {r_mem:>10,.0f} tasks/s   "
            f"(runs {' '.join(f'{n / x / 1e3:.0f}k' for x in mem)})"
        )
        print(
            f"[2]  SQLite batch         N={n:,}: {r_dur:>10,.0f} tasks/s   {ratio:.2f}x [1]  "
            f"target >= {TARGET_BATCH_RATIO}x  {verdict(ratio >= TARGET_BATCH_RATIO)}   "
            f"(runs {' '.join(f'{n / x / 1e3:.0f}k' for x in dur)})"
        )
        best = timings[dur.index(min(dur))].commits
        insert = sum(dt for dt, rows in best if rows >= n)
        rounds = [dt for dt, rows in best if 0 < rows < n]
        per_round = (min(dur) - insert) / max(1, len(rounds))
        commit = sum(rounds) / max(1, len(rounds))
        print(
            f"     best run: insert of {n:,} rows {insert:.3f} s; {len(rounds)} rounds of "
            f"{per_round * 1e3:.2f} ms = commit {commit * 1e3:.2f} ms + the rest "
            f"{(per_round - commit) * 1e3:.2f} ms ([1] spends {min(mem) / len(rounds) * 1e3:.2f} "
            f"ms per round in all)"
        )
        fsync, trip = floor
        ceiling = 1 / (fsync + trip)
        met = ratio >= TARGET_BATCH_RATIO
        for label, full in (("[3a] sequential, FULL  ", True), ("[3b] sequential, NORMAL", False)):
            seq = [await phase_sequential(m, files.store(full)) for _ in range(reps)]
            loop_rate = m / min(s[0] for s in seq)
            all_rate = m / min(s[1] for s in seq)
            met += loop_rate >= TARGET_SEQ_RATE
            print(
                f"{label} M={m:,}: {loop_rate:>10,.0f} acknowledged submits/s  "
                f"target >= {TARGET_SEQ_RATE:,.0f}  {verdict(loop_rate >= TARGET_SEQ_RATE)}   "
                f"({all_rate:,.0f} tasks/s to the last result)"
            )
            if full:
                print(
                    f"     ceiling here: 1 / (fdatasync + round trip) = {ceiling:,.0f}/s; "
                    f"[3a] reaches {loop_rate / ceiling:.2f}x of it"
                )
        conc = [await phase_concurrent(m, files.store()) for _ in range(reps)]
        best = min(conc)
        print(
            f"[4]  {SUBMITTERS} concurrent submitters M={m:,}: {m / best[0]:>10,.0f} tasks/s "
            f"to the last result; {best[1]:,} commits = {best[1] / m:.3f} per task"
        )
        print(f"\ntargets:  {met}/3 met")
    finally:
        files.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="tasks per batch phase")
    ap.add_argument("--m", type=int, default=5_000, help="tasks per sequential phase")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = ap.parse_args(argv)
    n, m, reps = (2_000, 500, 1) if args.quick else (args.n, args.m, 3)
    print("cronoq durable-store benchmark" + (" (--quick sizes)" if args.quick else ""))
    print(f"python:   {platform.python_implementation()} {sys.version.split()[0]}")
    print(f"platform: {platform.platform()}; sqlite {cronoq.store.sqlite.sqlite3.sqlite_version}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"cpus:     {os.cpu_count()}; load average {load}")
    print(
        "store:    SqliteStore defaults: journal_mode=WAL, synchronous=FULL (full_sync=True: "
        "each commit fsyncs the WAL); files in " + tempfile.gettempdir()
    )
    print(f"sizes:    N={n:,}, M={m:,}, best of {reps} (batch phases interleaved)\n")
    floor = machine_floor(tempfile.gettempdir(), 50 if args.quick else 500)
    fsync, trip = floor
    print(
        f"[0]  this machine: 4 KiB write + fdatasync p50 {fsync * 1e3:.3f} ms; "
        f"store-thread round trip p50 {trip * 1e6:.0f} us"
    )
    asyncio.run(main_async(n, m, reps, floor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
