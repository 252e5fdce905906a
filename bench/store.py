"""Durable-store benchmark of cronoq: what acknowledged-means-durable costs, in one run.

Machines here are noisy, so the durable batch is printed as a ratio to the in-memory batch
measured in the same run, PostgreSQL figures as ratios to the SQLite figures of the same run,
and throughput phases take the best of interleaved runs.

Phases
------
[1]  in-memory batch: `await sched.submit_batch([Task(i) for i in range(N)])` on a 64-slot
     fixed pool with a no-op executor, then every handle awaited (as bench/library.py [2b]).
[2]  the same on a scheduler with `SqliteStore` (WAL, synchronous=FULL: every commit is
     fsynced): submit_batch returns once all N rows are committed; each attempt starts after
     its RUNNING row is committed; results are written too. Ratio to [1] (target >= 0.5x).
[2p] the same with `PostgresStore` (a schema of its own on the PostgreSQL server below), run
     interleaved with [1] and [2]. Ratio to [2] (target >= 0.7x).
     [2] and [2p] are broken down from their best run: the batch's insert transaction, then
     per 64-task round the commit (its wall time) and the rest (the loop's own work and the
     wake-ups).
[3a] sequential durable submits: one submitter, `await sched.submit(i)` M times (each returns
     after its commit), then every handle awaited. Tasks/s of the submit loop and of the whole
     run (target: submit loop >= 5,000 tasks/s).
[3b] the same with `SqliteStore(full_sync=False)` (synchronous=NORMAL: a commit is in the WAL,
     and so survives the process being killed, but is fsynced only at checkpoints, so an OS
     crash or power cut may lose the last commits).
[3p] the same with `PostgresStore` (no target; its ceiling is printed as [3a]'s).
[4]  the same M submits from 64 concurrent submitters (asyncio tasks, M/64 each): group commit
     lets them share transactions. Tasks/s and commits per task.
[4p] the same with `PostgresStore` (target >= 10,000 tasks/s).
[5]  the server path: bench/server.py [b] (its fleet and phase, imported) with
     `[store] kind = "sqlite"` (a fresh file, the server's defaults: synchronous=FULL): N no-op
     tasks by Tasks.SubmitBatch, served by a raw worker process with 64 slots, until all
     succeeded. Tasks/s and the server's and the worker's CPU per 1k tasks.
[5p] the same with `[store] kind = "postgres"` (a schema of its own), run interleaved with
     [5]. Ratio to [5] (target >= 0.8x); a server that refuses the configuration or fails to
     start is reported with its error and counts as a miss.
[0]  what this machine allows, measured first: the p50 of a 4 KiB write + fdatasync in the
     benchmark's directory (what a FULL commit waits for) and of a round trip to the store's
     thread (what every commit pays twice: to the thread and back to the loop). One commit per
     acknowledged submit bounds [3a] by 1 / (fdatasync + round trip), printed as its ceiling.
[0p] what the PostgreSQL server allows, measured next on one asyncpg connection from the event
     loop: the p50 of a round trip (`SELECT 1`) and of a one-row transaction (an INSERT of one
     row in autocommit: one round trip and the commit's WAL flush), and of the same INSERT as
     BEGIN + INSERT + COMMIT (three round trips, as asyncpg's `transaction()` sends it). The
     one-row transaction bounds [3p] by 1 / its p50, printed as its ceiling.

The PostgreSQL server is the one `--pg-url URL` (or the environment variable
CRONOQ_BENCH_PG_URL) names, whose database must let its user create schemas; without one, a
private cluster is started for the run (bench/_pg.py: initdb in a temporary directory on the
file system of /tmp, a free port, PostgreSQL's default durability: fsync=on,
synchronous_commit=on) and thrown away at the end. Every schema the run creates is dropped at
the end. Every SQLite phase uses a fresh file in a temporary directory on the same file system
as /tmp. The exit status is 0 whether targets are met or not (2 if no PostgreSQL server can be
had).

Usage: python bench/store.py [--n N] [--m M] [--pg-url URL] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import grpc

import cronoq
from _common import percentile, source, verdict
from _pg import Cluster
from cronoq import Pool, PostgresStore, Scheduler, SqliteStore, Task
from cronoq.store.postgres import redact
from server import BATCH as SERVER_BATCH
from server import Client, Fleet, ServerRun, phase_server

SLOTS = 64
SUBMITTERS = 64
TARGET_BATCH_RATIO = 0.5
TARGET_SEQ_RATE = 5_000.0
TARGET_PG_BATCH_RATIO = 0.7  # [2p] / [2]
TARGET_PG_CONCURRENT_RATE = 10_000.0  # [4p]
TARGET_PG_SERVER_RATIO = 0.8  # [5p] / [5]
PG_ENV = "CRONOQ_BENCH_PG_URL"

Store = SqliteStore | PostgresStore


async def noop(ctx: Any, payload: Any) -> Any:
    return payload


class Files:
    """Fresh database paths in one temporary directory, removed at the end."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cronoq-bench-")
        self.n = 0

    def path(self) -> str:
        self.n += 1
        return os.path.join(self.dir, f"bench{self.n}.db")

    def store(self, full_sync: bool = True) -> SqliteStore:
        return SqliteStore(self.path(), full_sync=full_sync)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Schemas:
    """Fresh schemas of the PostgreSQL database at `url` (each store gets one), dropped at the
    end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.names: list[str] = []

    def name(self) -> str:
        self.names.append(f"cronoq_bench_{os.getpid()}_{len(self.names) + 1}")
        return self.names[-1]

    def store(self) -> PostgresStore:
        return PostgresStore(self.url, schema=self.name())

    async def drop(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            for name in self.names:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()
        self.names.clear()


def _scheduler(store: Store | None) -> Scheduler:
    return Scheduler([Pool("default", noop, autoscale=False, max=SLOTS)], store=store)


class Timing:
    """Times every transaction the store writes in one run (insert, then rounds): on the store
    thread for SQLite, as the wall time of the write's coroutine for PostgreSQL."""

    def __init__(self, store: Store) -> None:
        self.commits: list[tuple[float, int]] = []  # (seconds, rows written)
        if isinstance(store, PostgresStore):
            write = store._write

            async def timed_write(batch: Any) -> None:
                t0 = time.perf_counter()
                await write(batch)
                self._add(time.perf_counter() - t0, batch)

            store._write = timed_write  # type: ignore[method-assign]
            return
        inner = store._commit

        def timed(batch: Any) -> None:
            t0 = time.perf_counter()
            inner(batch)
            self._add(time.perf_counter() - t0, batch)

        store._commit = timed  # type: ignore[method-assign]

    def _add(self, dt: float, batch: Any) -> None:
        self.commits.append((dt, len(batch.inserts) + len(batch.updates) + len(batch.finishes)))


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


async def pg_floor(url: str, schema: str, samples: int) -> tuple[float, float, float]:
    """[0p]: p50 seconds of `SELECT 1`, of a one-row INSERT in autocommit, and of the same
    INSERT as BEGIN + INSERT + COMMIT, on one connection (each statement prepared first)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'CREATE TABLE "{schema}".probe (id bigint PRIMARY KEY)')
        insert = f'INSERT INTO "{schema}".probe (id) VALUES ($1)'
        ids = iter(range(1 << 62))
        perf = time.perf_counter

        async def select() -> None:
            await conn.fetchval("SELECT 1")

        async def autocommit() -> None:
            await conn.execute(insert, next(ids))

        async def three() -> None:
            async with conn.transaction():
                await conn.execute(insert, next(ids))

        out = []
        for probe in (select, autocommit, three):
            for _ in range(max(5, samples // 10)):  # warm-up (and the statement prepared)
                await probe()
            times = []
            for _ in range(samples):
                t0 = perf()
                await probe()
                times.append(perf() - t0)
            out.append(percentile(sorted(times), 0.5))
    finally:
        await conn.close()
    return out[0], out[1], out[2]


async def pg_settings(url: str) -> str:
    """What the server is and how durable its commits are."""
    conn = await asyncpg.connect(url)
    try:
        shown = [
            f"{name}={await conn.fetchval(f'SHOW {name}')}"
            for name in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")
        ]
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return f"PostgreSQL {version.split()[0]} ({', '.join(shown)}); asyncpg {asyncpg.__version__}"


class Counting:
    """Counts the store's commits (transactions) of one run."""

    def __init__(self, store: Store) -> None:
        self.commits = 0
        inner = store.commit_nowait

        def commit_nowait(batch: Any) -> Any:
            self.commits += 1
            return inner(batch)

        store.commit_nowait = commit_nowait  # type: ignore[method-assign]


async def phase_batch(n: int, store: Store | None) -> float:
    async with _scheduler(store) as sched:
        t0 = time.perf_counter()
        handles = await sched.submit_batch([Task(i) for i in range(n)])
        for h in handles:
            await h
        dt = time.perf_counter() - t0
        snap = await sched.snapshot()
        assert snap.totals["succeeded"] == n, snap.totals
    return dt


async def phase_sequential(m: int, store: Store) -> tuple[float, float]:
    """(seconds of the submit loop, seconds until every task ended)."""
    async with _scheduler(store) as sched:
        t0 = time.perf_counter()
        handles = [await sched.submit(i) for i in range(m)]
        t1 = time.perf_counter()
        for h in handles:
            await h
        t2 = time.perf_counter()
    return t1 - t0, t2 - t0


async def phase_concurrent(m: int, store: Store) -> tuple[float, int]:
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


def _runs(n: int, xs: list[float]) -> str:
    return "runs " + " ".join(f"{n / x / 1e3:.0f}k" for x in xs)


def _breakdown(n: int, dt: float, commits: list[tuple[float, int]], mem: float) -> str:
    """The best batch run of `dt` seconds: its insert transaction, then its rounds."""
    insert = sum(t for t, rows in commits if rows >= n)
    rounds = [t for t, rows in commits if 0 < rows < n]
    per_round = (dt - insert) / max(1, len(rounds))
    commit = sum(rounds) / max(1, len(rounds))
    return (
        f"     best run: insert of {n:,} rows {insert:.3f} s; {len(rounds)} rounds of "
        f"{per_round * 1e3:.2f} ms = commit {commit * 1e3:.2f} ms + the rest "
        f"{(per_round - commit) * 1e3:.2f} ms ([1] spends {mem / max(1, len(rounds)) * 1e3:.2f} "
        f"ms per round in all)"
    )


async def phase_servers(
    n: int, reps: int, stores: dict[str, str]
) -> tuple[dict[str, list[ServerRun]], dict[str, str]]:
    """[5] and [5p]: a fleet per `[store]` table of `stores` (name -> its body), warmed up, then
    `reps` interleaved rounds of bench/server.py's [b]. Returns the runs of each fleet that
    started, and why each other one did not."""
    fleets: dict[str, Fleet] = {}
    failed: dict[str, str] = {}
    runs: dict[str, list[ServerRun]] = {}
    try:
        for name, store in stores.items():
            try:
                fleets[name] = Fleet(store=store)
            except RuntimeError as e:
                lines = [ln for ln in str(e).splitlines()[1:] if ln.strip()]
                errors = [ln for ln in lines if "error" in ln.lower()]
                failed[name] = (errors or lines or [str(e)])[-1].strip()
        async with contextlib.AsyncExitStack() as stack:
            clients = {}
            for name, fleet in fleets.items():
                channel = grpc.aio.insecure_channel(fleet.target)
                await stack.enter_async_context(channel)
                clients[name] = Client(channel)
                warm = min(n, 2 * SERVER_BATCH)
                await phase_server(clients[name], warm, fleet.server, fleet.worker)
                runs[name] = []
            for _ in range(reps):
                for name, fleet in fleets.items():
                    gc.collect()
                    run = await phase_server(clients[name], n, fleet.server, fleet.worker)
                    runs[name].append(run)
    finally:
        for fleet in fleets.values():
            fleet.close()
    return runs, failed


async def main_async(
    n: int,
    m: int,
    reps: int,
    floor: tuple[float, float],
    pg: tuple[float, float, float],
    schemas: Schemas,
) -> None:
    files = Files()
    timings: dict[str, list[Timing]] = {"sqlite": [], "postgres": []}

    def timed(kind: str, store: Store) -> Store:
        timings[kind].append(Timing(store))
        return store

    try:
        await phase_batch(min(n, 500), None)  # warm-up
        await phase_batch(min(n, 500), files.store())
        await phase_batch(min(n, 500), schemas.store())
        mem, dur, pgb = await _best(
            reps,
            [
                lambda: phase_batch(n, None),
                lambda: phase_batch(n, timed("sqlite", files.store())),
                lambda: phase_batch(n, timed("postgres", schemas.store())),
            ],
        )
        r_mem = n / min(mem)
        r_dur = n / min(dur)
        r_pg = n / min(pgb)
        ratio = r_dur / r_mem
        pg_ratio = r_pg / r_dur
        print(f"[1]  in-memory batch      N={n:,}: {r_mem:>10,.0f} tasks/s   ({_runs(n, mem)})")
        print(
            f"[2]  SQLite batch         N={n:,}: {r_dur:>10,.0f} tasks/s   {ratio:.2f}x [1]  "
            f"target >= {TARGET_BATCH_RATIO}x  {verdict(ratio >= TARGET_BATCH_RATIO)}   "
            f"({_runs(n, dur)})"
        )
        print(_breakdown(n, min(dur), timings["sqlite"][dur.index(min(dur))].commits, min(mem)))
        print(
            f"[2p] PostgreSQL batch     N={n:,}: {r_pg:>10,.0f} tasks/s   {pg_ratio:.2f}x [2]  "
            f"target >= {TARGET_PG_BATCH_RATIO}x  {verdict(pg_ratio >= TARGET_PG_BATCH_RATIO)}   "
            f"({r_pg / r_mem:.2f}x [1]; {_runs(n, pgb)})"
        )
        print(_breakdown(n, min(pgb), timings["postgres"][pgb.index(min(pgb))].commits, min(mem)))
        met = (ratio >= TARGET_BATCH_RATIO) + (pg_ratio >= TARGET_PG_BATCH_RATIO)

        fsync, trip = floor
        ceiling = 1 / (fsync + trip)
        pg_ceiling = 1 / pg[1]
        sequential: list[tuple[str, Callable[[], Store], float | None]] = [
            ("[3a] sequential, FULL      ", lambda: files.store(True), TARGET_SEQ_RATE),
            ("[3b] sequential, NORMAL    ", lambda: files.store(False), TARGET_SEQ_RATE),
            ("[3p] sequential, PostgreSQL", schemas.store, None),
        ]
        for label, make, target in sequential:
            seq = [await phase_sequential(m, make()) for _ in range(reps)]
            loop_rate = m / min(s[0] for s in seq)
            all_rate = m / min(s[1] for s in seq)
            goal = ""
            if target is not None:
                met += loop_rate >= target
                goal = f"  target >= {target:,.0f}  {verdict(loop_rate >= target)}"
            print(
                f"{label} M={m:,}: {loop_rate:>10,.0f} acknowledged submits/s{goal}   "
                f"({all_rate:,.0f} tasks/s to the last result)"
            )
            if label.startswith("[3a]"):
                print(
                    f"     ceiling here: 1 / (fdatasync + round trip) = {ceiling:,.0f}/s; "
                    f"[3a] reaches {loop_rate / ceiling:.2f}x of it"
                )
            elif label.startswith("[3p]"):
                print(
                    f"     ceiling here: 1 / one-row transaction ([0p]) = {pg_ceiling:,.0f}/s; "
                    f"[3p] reaches {loop_rate / pg_ceiling:.2f}x of it"
                )

        conc = min([await phase_concurrent(m, files.store()) for _ in range(reps)])
        pg_conc = min([await phase_concurrent(m, schemas.store()) for _ in range(reps)])
        print(
            f"[4]  {SUBMITTERS} concurrent submitters M={m:,}: {m / conc[0]:>10,.0f} tasks/s "
            f"to the last result; {conc[1]:,} commits = {conc[1] / m:.3f} per task"
        )
        pg_rate = m / pg_conc[0]
        met += pg_rate >= TARGET_PG_CONCURRENT_RATE
        print(
            f"[4p] {SUBMITTERS} concurrent submitters, PostgreSQL M={m:,}: {pg_rate:>10,.0f} "
            f"tasks/s to the last result  target >= {TARGET_PG_CONCURRENT_RATE:,.0f}  "
            f"{verdict(pg_rate >= TARGET_PG_CONCURRENT_RATE)}; {pg_conc[1]:,} commits = "
            f"{pg_conc[1] / m:.3f} per task"
        )

        stores = {
            "sqlite": f'kind = "sqlite"\npath = "{files.path()}"',
            "postgres": f'kind = "postgres"\nurl_env = "{PG_ENV}"\nschema = "{schemas.name()}"',
        }
        runs, failed = await phase_servers(n, reps, stores)
        best = {name: max(rs, key=lambda r: r.rate) for name, rs in runs.items()}
        for name, label in (
            ("sqlite", "[5]  server SubmitBatch, SQLite    "),
            ("postgres", "[5p] server SubmitBatch, PostgreSQL"),
        ):
            b = best.get(name)
            shown = (
                f"not measured ({failed[name]})"
                if b is None
                else f"{b.rate:>8,.0f} tasks/s ({1e6 / b.rate:.0f} us each)"
            )
            if name == "postgres":
                base = best.get("sqlite")
                r = None if b is None or base is None else b.rate / base.rate
                ok = r is not None and r >= TARGET_PG_SERVER_RATIO
                met += ok
                shown += "" if r is None else f"   {r:.2f}x [5]"
                shown += f"  target >= {TARGET_PG_SERVER_RATIO}x  {verdict(ok)}"
            if b is not None:
                shown += (
                    f"   CPU per 1k tasks: server {b.server_cpu * 1e6:,.0f} ms, worker "
                    f"{b.worker_cpu * 1e6:,.0f} ms   "
                    f"(runs {' '.join(f'{x.rate / 1e3:.1f}k' for x in runs[name])})"
                )
            print(f"{label} N={n:,}: {shown}")
        print(f"\ntargets:  {met}/6 met")
    finally:
        files.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="tasks per batch phase")
    ap.add_argument("--m", type=int, default=5_000, help="tasks per sequential phase")
    ap.add_argument(
        "--pg-url",
        default=os.environ.get(PG_ENV) or "",
        help=f"a PostgreSQL server to use (default: ${PG_ENV}, else a private cluster)",
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = ap.parse_args(argv)
    n, m, reps = (2_000, 500, 1) if args.quick else (args.n, args.m, 3)
    began = time.perf_counter()
    cluster = Cluster(args.pg_url, fsync=True, instead=f"--pg-url URL (or {PG_ENV})")
    try:
        cluster.start()
    except RuntimeError as e:
        print(f"bench/store.py: no PostgreSQL server: {e}", file=sys.stderr)
        return 2
    try:
        os.environ[PG_ENV] = cluster.url  # where [5p]'s server reads it (url_env)
        schemas = Schemas(cluster.url)
        print("cronoq durable-store benchmark" + (" (--quick sizes)" if args.quick else ""))
        print(f"python:   {platform.python_implementation()} {sys.version.split()[0]}")
        print(
            f"platform: {platform.platform()}; sqlite {cronoq.store.sqlite.sqlite3.sqlite_version}"
        )
        print(f"source:   {source()}")
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"cpus:     {os.cpu_count()}; load average {load}")
        print(
            "store:    SqliteStore defaults: journal_mode=WAL, synchronous=FULL (full_sync=True: "
            "each commit fsyncs the WAL); files in " + tempfile.gettempdir()
        )
        where = (
            f"a private cluster started for this run (in {tempfile.gettempdir()}, on loopback)"
            if cluster.private
            else redact(cluster.url)
        )
        print(f"postgres: {asyncio.run(pg_settings(cluster.url))}; {where}")
        print(
            f"sizes:    N={n:,}, M={m:,}, best of {reps} (batch phases interleaved; [5] and [5p] "
            f"too, SubmitBatch of {SERVER_BATCH:,})\n"
        )
        samples = 50 if args.quick else 500
        with tempfile.TemporaryDirectory() as probes:  # another revision's run finds none
            floor = machine_floor(probes, samples)
        fsync, trip = floor
        print(
            f"[0]  this machine: 4 KiB write + fdatasync p50 {fsync * 1e3:.3f} ms; "
            f"store-thread round trip p50 {trip * 1e6:.0f} us"
        )
        pg = asyncio.run(pg_floor(cluster.url, schemas.name(), samples))
        print(
            f"[0p] PostgreSQL: SELECT 1 round trip p50 {pg[0] * 1e6:.0f} us; one-row "
            f"transaction p50 {pg[1] * 1e3:.3f} ms (INSERT in autocommit), {pg[2] * 1e3:.3f} ms "
            f"as BEGIN + INSERT + COMMIT"
        )
        try:
            asyncio.run(main_async(n, m, reps, floor, pg, schemas))
        finally:
            asyncio.run(schemas.drop())
        private = cluster.private
    finally:
        cluster.stop()
    also = " (the private cluster's start and stop included)" if private else ""
    print(f"run time: {time.perf_counter() - began:.0f} s{also}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
