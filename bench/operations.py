"""Operations benchmark of cronoq: what a bulk retry costs the other pools of a `cronoq-server`,
and how fast the server answers a task search over 100k tasks.

Every process runs on loopback on the same machine: the server (`python -m cronoq.server.cli`,
the memory store unless `--store sqlite`: a fresh file, synchronous FULL), a worker process of
this file (`--role worker`: `cronoq.client.Worker`, 64 slots, whose handler fails a task with an
empty payload, completes one whose payload is `ok` and fails permanently one whose payload is
`permanent`), and this process (the load, the operator's calls and the "live" worker).

Phases
------
[o1] bulk retry beside a steady stream. The server has pools "dead" (retry max_attempts = 1,
     served by the worker process) and "live" (served by a `cronoq.client.Worker` of 64 slots
     in this process, a no-op handler that notes when each task starts). D tasks are submitted
     to "dead" (SubmitBatch) and all end dead-lettered; then "dead" is paused, so that the
     copies a retry submits wait there instead of running: what is measured is the bulk action
     itself, not the copies' execution. A window of W seconds submits R tasks/s to "live" by
     Tasks.Submit at fixed times (each call its own coroutine, so a slow answer delays no later
     submit); a task's latency runs from just before its Submit to the start of its handler.
     Baseline windows have no bulk action; in the other windows Operations.BulkTasks (retry,
     filter pool "dead" and status dead_lettered) is called as the window starts, from a
     client of its own, and timed to its answer. After each such window the copies are
     cancelled and deleted (two more bulk actions, untimed), so each window starts alike.
     Baseline and bulk windows alternate (which goes first alternates too), N of each after one
     untimed warm-up window; for each kind the window with the lowest p99 counts. Printed: p50,
     p99 and max of the "live" latency of both, p99(bulk) / p99(baseline) (target <= 2x), the
     p99 of the tasks submitted while the bulk action ran, and the bulk action's time and
     tasks/s (its best run).
[o2] search on the server. A second server holds S tasks submitted by SubmitBatch: pool "b"
     (two thirds; no worker, so they wait, and one in eleven is then cancelled by a bulk
     cancel of their ids) and pool "a" (the rest, run by the worker process: a third each
     succeeded, dead-lettered and failed), in three kinds, four priorities, keys `order-*` and
     `user-*` (a fifth without), tags `tenant` (7 values) and `region` (2), in batches of
     1,000. For each filter (none, pool, status, kind, tag, exact key, key prefix, the time
     range of the middle batch's call, and no filter sorted by submission time instead of by
     id) the round trip of the first page (limit 50) of Operations.SearchTasks through
     `cronoq.client.Client.search_tasks`, best of K; target <= 200 ms each. The floor beside
     them is a `Client.get` of one task by id. The engine's own search over 100k tasks, without
     the service and the transport, is bench/search.py's.

Usage: python bench/operations.py [--store memory|sqlite] [--reps N] [--quick]

--quick uses small sizes (a smoke run). The exit status is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import grpc

from _common import percentile, print_about, print_cpus, verdict
from cronoq.client import Client, Lease, Permanent, Worker, task
from cronoq.core.vocab import PRIORITY_NAMES
from server import BATCH, OWN_CONNECTION, SLOTS, Proc, start_server

TARGET_P99_RATIO = 2.0  # [o1] p99 with the bulk action / without
TARGET_SEARCH_MS = 200.0  # [o2] each first page
PAGE = 50


@dataclass
class Sizes:
    dead: int  # [o1] dead letters retried by each bulk action
    rate: float  # [o1] "live" submits per second
    window: float  # [o1] seconds per window
    reps: int  # [o1] windows of each kind
    held: int  # [o2] tasks the search server holds
    runs: int  # [o2] searches per filter (best of)


FULL = Sizes(dead=10_000, rate=200.0, window=5.0, reps=3, held=100_000, runs=5)
QUICK = Sizes(dead=1_000, rate=100.0, window=1.0, reps=1, held=3_000, runs=2)


def config(store: str, pools: Mapping[str, str]) -> str:
    """The server's configuration: `store` is the body of its `[store]` table, `pools` each
    pool's name and extra keys."""
    tables = "".join(
        f'\n[[pools]]\nname = "{name}"\nmax = {SLOTS}\n{extra}\n' for name, extra in pools.items()
    )
    return f"""\
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
log_level = "info"

[store]
{store}

[limits]
max_pending_per_pool = 1000000
{tables}"""


ONE_ATTEMPT = "retry = { max_attempts = 1 }"


@contextlib.contextmanager
def serving(tmp: str, name: str, store: str, pools: Mapping[str, str]) -> Iterator[str]:
    """A server on a fresh configuration (and store file) in `tmp`; its gRPC address."""
    body = 'kind = "memory"'
    if store == "sqlite":
        body = f'kind = "sqlite"\npath = "{os.path.join(tmp, name + ".db")}"'
    cfg = os.path.join(tmp, name + ".toml")
    with open(cfg, "w") as f:
        f.write(config(body, pools))
    server, target = start_server(cfg)
    try:
        yield target
    finally:
        server.stop()


def start_worker(target: str, pool: str) -> Proc:
    """This file's worker process of `pool`, once it has registered."""
    argv = [sys.executable, os.path.abspath(__file__), "--role", "worker"]
    worker = Proc([*argv, "--target", target, "--pool", pool], f"worker of {pool}")
    worker.expect(r"^registered")
    return worker


async def outcome(lease: Lease) -> None:
    """The worker process's handler: the payload says how the attempt ends."""
    if lease.payload == b"ok":
        return None
    if lease.payload == b"permanent":
        raise Permanent("bad input")
    raise RuntimeError("boom")


async def worker_main(target: str, pool: str) -> None:
    worker = Worker(target, pool, outcome, slots=SLOTS, name="bench", reconnect=False)
    running = asyncio.create_task(worker.run())
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGTERM, lambda: asyncio.ensure_future(worker.stop())
    )
    await worker.wait_registered(30)
    print("registered", flush=True)
    await running


@contextlib.asynccontextmanager
async def client(target: str) -> AsyncIterator[Client]:
    """A Client on a connection of its own."""
    async with Client(target, options=OWN_CONNECTION) as c:
        yield c


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 300.0) -> None:
    """Poll the coroutine function `check` until it answers true."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def submit_all(c: Client, specs: list[Any]) -> tuple[list[int], list[tuple[float, float]]]:
    """The ids of `specs` submitted by SubmitBatch, and the Unix times around each batch."""
    ids: list[int] = []
    times = []
    for i in range(0, len(specs), BATCH):
        t0 = time.time()
        ids += [s.id for s in await c.submit_batch(specs[i : i + BATCH])]
        times.append((t0, time.time()))
    return ids, times


async def ended(c: Client, n: int) -> bool:
    """Whether `n` tasks have ended since the server started (succeeded, failed or dead)."""
    t = (await c.snapshot()).totals
    return t.succeeded + t.failed + t.dead_lettered >= n


# --- [o1] ---------------------------------------------------------------------------------------


class Live:
    """The "live" pool's worker in this process: notes when each task's handler starts."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}

    async def handle(self, lease: Lease) -> None:
        self.started[lease.task_id] = time.perf_counter()


@dataclass
class Window:
    latencies: list[float]  # seconds, ascending
    bulk_s: float = 0.0  # the bulk action's round trip (0: a baseline window)
    retried: int = 0
    during: list[float] | None = None  # latencies of the tasks submitted while it ran

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


async def window(producer: Client, operator: Client, live: Live, sz: Sizes, bulk: bool) -> Window:
    """One window of the steady stream, with the bulk retry issued as it starts if `bulk`."""
    perf = time.perf_counter
    sent: dict[int, float] = {}
    calls: list[asyncio.Task[None]] = []

    async def one() -> None:
        t = perf()
        sent[(await producer.submit(pool="live")).id] = t

    retry: asyncio.Task[tuple[float, float, int]] | None = None
    if bulk:

        async def timed() -> tuple[float, float, int]:
            t0 = perf()
            r = await operator.bulk("retry", pools=["dead"], statuses=["dead_lettered"])
            return t0, perf(), r.affected

        retry = asyncio.create_task(timed())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(round(sz.rate * sz.window)):
        delay = t0 + i / sz.rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        calls.append(asyncio.create_task(one()))
    await asyncio.gather(*calls)

    async def all_started() -> bool:
        return all(i in live.started for i in sent)

    await until(all_started, "the live tasks to start", 60)
    lat = sorted(live.started[i] - t for i, t in sent.items())
    if retry is None:
        return Window(lat)
    b0, b1, affected = await retry
    if affected != sz.dead:
        raise RuntimeError(f"the bulk retry copied {affected} tasks, not {sz.dead}")
    during = sorted(live.started[i] - t for i, t in sent.items() if b0 <= t <= b1)
    cancelled = await operator.bulk("cancel", pools=["dead"])
    deleted = await operator.bulk("delete", pools=["dead"], statuses=["cancelled"])
    if cancelled.affected != sz.dead or deleted.affected != sz.dead:
        raise RuntimeError(f"cleanup: {cancelled} {deleted}")
    return Window(lat, b1 - b0, affected, during)


async def phase_bulk(target: str, sz: Sizes) -> tuple[list[Window], list[Window]]:
    """[o1]: (baseline windows, bulk windows)."""
    dead = start_worker(target, "dead")
    live = Live()
    worker = Worker(target, "live", live.handle, slots=SLOTS, name="live", reconnect=False)
    running = asyncio.create_task(worker.run())
    try:
        await worker.wait_registered(30)
        async with client(target) as producer, client(target) as operator:
            await submit_all(producer, [task(pool="dead") for _ in range(sz.dead)])

            async def dead_lettered() -> bool:
                return (await producer.snapshot()).totals.dead_lettered >= sz.dead

            await until(dead_lettered, "the dead letters")
            await operator.pause_pool("dead")
            await window(producer, operator, live, replace(sz, window=min(sz.window, 1.0)), True)
            base: list[Window] = []
            with_bulk: list[Window] = []
            for rep in range(sz.reps):
                for bulk in (False, True) if rep % 2 == 0 else (True, False):
                    w = await window(producer, operator, live, sz, bulk)
                    (with_bulk if bulk else base).append(w)
            return base, with_bulk
    finally:
        await worker.stop()
        await running
        dead.stop()


def _ms(xs: list[float]) -> str:
    return (
        f"p50 {percentile(xs, 0.5) * 1e3:6.2f} ms  p99 {percentile(xs, 0.99) * 1e3:6.2f} ms  "
        f"max {xs[-1] * 1e3:7.2f} ms"
    )


def report_bulk(sz: Sizes, base: list[Window], with_bulk: list[Window]) -> bool:
    b = min(base, key=lambda w: w.p99)
    w = min(with_bulk, key=lambda w: w.p99)
    ratio = w.p99 / b.p99
    ok = ratio <= TARGET_P99_RATIO
    runs = " ".join(f"{x.p99 * 1e3:.2f}" for x in base)
    print(f"[o1] live, no bulk action    {len(b.latencies):,} tasks: {_ms(b.latencies)}")
    print(f"     p99 of each window (ms): {runs}")
    runs = " ".join(f"{x.p99 * 1e3:.2f}" for x in with_bulk)
    print(f"[o1] live, bulk retry of {sz.dead:,}  {len(w.latencies):,} tasks: {_ms(w.latencies)}")
    print(f"     p99 of each window (ms): {runs}")
    print(f"[o1] p99 bulk / no bulk = {ratio:.2f}x  target <= {TARGET_P99_RATIO:g}x  {verdict(ok)}")
    during = f"{len(w.during):,} tasks, {_ms(w.during)}" if w.during else "none"
    print(f"     submitted while the bulk action ran: {during}")
    fast = min(with_bulk, key=lambda x: x.bulk_s)
    secs = " ".join(f"{x.bulk_s:.2f}" for x in with_bulk)
    print(
        f"[o1] bulk retry of {fast.retried:,} dead letters: {fast.bulk_s:.2f} s = "
        f"{fast.retried / fast.bulk_s:,.0f} tasks/s (runs {secs} s); pool dead paused, so the "
        "copies wait"
    )
    return ok


# --- [o2] ---------------------------------------------------------------------------------------

KINDS = ("mail", "sms", "push")
OUTCOMES = (b"ok", b"", b"permanent")  # succeeded, dead-lettered, failed


def held_task(i: int) -> Any:
    """The i-th task of [o2]: pool a one in three (its outcome by payload), else b."""
    served = i % 3 == 0
    return task(
        OUTCOMES[(i // 3) % 3] if served else None,
        pool="a" if served else "b",
        kind=KINDS[(i // 7) % 3],
        priority=PRIORITY_NAMES[i % 4],
        key=None if i % 5 == 0 else f"{'order' if i % 2 else 'user'}-{i}",
        tags={"tenant": f"t{i % 7}", "region": "eu" if i % 2 else "us"},
    )


async def populate(c: Client, n: int) -> list[tuple[float, float]]:
    """[o2]'s tasks on the server, the served ones ended; the Unix times around each batch."""
    ids, times = await submit_all(c, [held_task(i) for i in range(n)])
    await until(lambda: ended(c, len(range(0, n, 3))), "pool a's tasks to end")
    cancel = [task_id for i, task_id in enumerate(ids) if i % 3 and i % 11 == 0]
    for i in range(0, len(cancel), BATCH):
        await c.bulk("cancel", ids=cancel[i : i + BATCH])
    return times


def searches(n: int, times: list[tuple[float, float]]) -> dict[str, dict[str, Any]]:
    """Each line of [o2]: the search_tasks keywords; the time range is the middle batch's."""
    after, before = times[len(times) // 2]
    return {
        "none": {},
        "pool": {"pools": ["a"]},
        "status": {"statuses": ["dead_lettered", "failed", "cancelled"]},
        "kind": {"kinds": ["sms"]},
        "tag": {"tags": {"tenant": "t3"}},
        "exact key": {"key": f"order-{n // 2 + 1}"},
        "key prefix": {"key_prefix": "user-1"},
        "time range": {"submitted_after": after, "submitted_before": before},
        "none, by submission": {"sort": "submitted"},
    }


async def best_ms(call: Callable[[], Awaitable[object]], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        await call()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


async def phase_search(target: str, sz: Sizes) -> bool:
    worker = start_worker(target, "a")
    try:
        async with client(target) as c:
            t0 = time.perf_counter()
            times = await populate(c, sz.held)
            print(
                f"[o2] server holds {sz.held:,} tasks, submitted in "
                f"{times[-1][1] - times[0][0]:.1f} s, ready "
                f"in {time.perf_counter() - t0:.1f} s; first page of {PAGE}, best of {sz.runs}, "
                f"through Client.search_tasks"
            )
            some = (await c.search_tasks(limit=1)).tasks[0].id
            floor = await best_ms(lambda: c.get(some), sz.runs)
            print(f"     floor: Client.get of one task {floor:.2f} ms")
            met = 0
            lines = searches(sz.held, times)
            for name, kw in lines.items():
                total = (await c.search_tasks(limit=PAGE, **kw)).total
                ms = await best_ms(functools.partial(c.search_tasks, limit=PAGE, **kw), sz.runs)
                ok = ms <= TARGET_SEARCH_MS
                met += ok
                print(
                    f"[o2] {name:>20}: {total:>7,} matches  {ms:7.2f} ms  target <= "
                    f"{TARGET_SEARCH_MS:g} ms  {verdict(ok)}"
                )
            return met == len(lines)
    finally:
        worker.stop()


# --- the run ------------------------------------------------------------------------------------


async def bench(sz: Sizes, store: str) -> None:
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-") as tmp:
        with serving(tmp, "bulk", store, {"dead": ONE_ATTEMPT, "live": ""}) as target:
            base, with_bulk = await phase_bulk(target, sz)
        bulk_ok = report_bulk(sz, base, with_bulk)
        print()
        with serving(tmp, "search", store, {"a": ONE_ATTEMPT, "b": ""}) as target:
            search_ok = await phase_search(target, sz)
    print(
        f"\ntargets:  {bulk_ok + search_ok}/2 met: [o1] {verdict(bulk_ok)}, "
        f"[o2] {verdict(search_ok)}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    ap.add_argument("--reps", type=int, default=None, help="[o1] windows of each kind (3)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--pool", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "worker":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(worker_main(args.target, args.pool))
        return 0
    sz = QUICK if args.quick else FULL
    if args.reps is not None:
        if args.reps < 1:
            ap.error("--reps must be >= 1")
        sz = replace(sz, reps=args.reps)
    print_about(
        "cronoq operations benchmark" + (" (--quick sizes)" if args.quick else ""),
        f"; grpcio {grpc.__version__}",
    )
    print_cpus("this process (load, operator, live worker), the server, one worker process")
    print(
        f"sizes:    [o1] {sz.dead:,} dead letters, {sz.rate:g} live tasks/s for {sz.window:g} s "
        f"windows, {sz.reps} of each kind, store {args.store}; [o2] {sz.held:,} tasks"
    )
    print(
        f"targets:  [o1] p99 with a bulk retry <= {TARGET_P99_RATIO:g}x without; "
        f"[o2] each first page <= {TARGET_SEARCH_MS:g} ms\n"
    )
    asyncio.run(bench(sz, args.store))
    return 0


if __name__ == "__main__":
    sys.exit(main())
