"""Task search benchmark of cronoq: the first page of `cronoq.core.search.search` over the tasks
one engine holds, per filter, in two orders.

An engine (virtual clock, no I/O) holds N tasks over two pools, three kinds, keys of two
prefixes (a fifth have none), two tags, four priorities and N/10 distinct submit times; a third
of them ran (succeeded, dead-lettered or failed), one in eleven was cancelled, the rest wait.
For each filter, the time of one `search(..., limit=50)` newest first (the id index walked
backwards, every match still counted for `total`) and sorted by submission time (a heap over
the matches), best of K runs; target: each first page within 200 ms. What the Operations
service adds to it (converting the filter, 50 TaskInfo messages) is not measured.

Usage: python bench/search.py [--n N] [--runs K] [--quick]

--quick uses small sizes (a smoke run). The exit status is 0 whether targets are met or not.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from _common import print_about, print_cpus, verdict
from cronoq.core.engine import Engine
from cronoq.core.model import (
    CANCELLED,
    DEAD_LETTERED,
    FAILED,
    RUNNING,
    PoolConfig,
    RetryPolicy,
    TaskRecord,
)
from cronoq.core.search import TaskFilter, search

TARGET_MS = 200.0
LIMIT = 50


def populate(n: int) -> Engine:
    """`n` tasks over pools a and b, kinds, keys, tags, priorities and submit times varied;
    some run and succeed or fail, some are cancelled, the rest wait."""
    engine = Engine(
        [
            PoolConfig("a", capacity=n, min=0, max=n, retry=RetryPolicy(max_attempts=1)),
            PoolConfig("b", capacity=0, min=0, max=0),
        ],
        0.0,
        elastic=False,
    )
    recs = []
    for i in range(n):
        rec = TaskRecord(
            i,
            "a" if i % 3 else "b",
            cls=i % 4,
            kind="push" if i % 3 == 0 else ("mail", "sms")[i % 2],
            key=None if i % 5 == 0 else f"{'order' if i % 2 else 'user'}-{i}",
            tags={"tenant": f"t{i % 7}", "region": "eu" if i % 2 else "us"},
        )
        recs.append(engine.submit(rec, float(i // 10))[0])
    now = float(n // 10 + 1)
    engine.dispatch(now)
    for j, att in enumerate(list(engine.running.values())):
        if j % 4 == 0:
            engine.complete(att, now + 1)
        elif j % 4 == 1:
            engine.fail(att, now + 2, "boom")
        elif j % 4 == 2:
            engine.fail(att, now + 2, "bad input", permanent=True)
    for rec in recs[::11]:
        engine.cancel(rec.id, now + 3)
    engine.take()
    return engine


def filters(n: int) -> dict[str, TaskFilter]:
    middle = float(n // 20)
    return {
        "everything": TaskFilter(),
        "one pool": TaskFilter(pools=frozenset({"b"})),
        "failed statuses": TaskFilter(statuses=frozenset({FAILED, DEAD_LETTERED, CANCELLED})),
        "running": TaskFilter(statuses=frozenset({RUNNING})),
        "kind": TaskFilter(kinds=frozenset({"sms"})),
        "two tags": TaskFilter(tags={"tenant": "t3", "region": "eu"}),
        "exact key": TaskFilter(key=f"order-{n // 2 + 1}"),
        "key prefix": TaskFilter(key_prefix="user-1"),
        "time range": TaskFilter(submitted_after=middle, submitted_before=middle + 10),
        "ids": TaskFilter(ids=frozenset(range(1, n, max(1, n // 100)))),
        "five tests": TaskFilter(
            pools=frozenset({"a"}),
            kinds=frozenset({"mail", "sms"}),
            key_prefix="order-",
            submitted_after=5.0,
            tags={"region": "eu"},
        ),
    }


def best_ms(call: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="tasks the engine holds")
    parser.add_argument("--runs", type=int, default=5, help="best of this many runs")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    n, runs = (2_000, 2) if args.quick else (args.n, args.runs)
    print_about("cronoq task search: the first page of a search per filter")
    print_cpus()
    start = time.perf_counter()
    engine = populate(n)
    print(
        f"engine:   {len(engine.tasks):,} tasks held, built in {time.perf_counter() - start:.1f} s"
    )
    print(f"page:     limit {LIMIT}; best of {runs}; target {TARGET_MS:.0f} ms per first page")
    met = 0
    cases = filters(n)
    for name, flt in cases.items():
        _, total = search(engine, flt, limit=LIMIT)
        newest = best_ms(lambda f=flt: search(engine, f, limit=LIMIT), runs)
        by_time = best_ms(lambda f=flt: search(engine, f, "submitted", limit=LIMIT), runs)
        ok = max(newest, by_time) <= TARGET_MS
        met += ok
        print(
            f"{name:>16}: {total:>7,} matches  newest first {newest:7.2f} ms"
            f"  by submission {by_time:7.2f} ms  {verdict(ok)}"
        )
    print(f"targets:  {met}/{len(cases)} met")


if __name__ == "__main__":
    main()
