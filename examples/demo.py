"""Library-mode demo: 400 tasks of mixed priorities on an 8-slot pool, some failing and retried,
with a live one-line summary from `Scheduler.snapshot()` and a final report."""

from __future__ import annotations

import asyncio
import random
import sys
import time

import cronoq

TASKS = 400


async def work(ctx: cronoq.TaskContext, payload: dict[str, float]) -> str:
    """Pretend to do I/O; about one attempt in five fails and is retried."""
    await asyncio.sleep(payload["seconds"])
    if random.random() < payload["flakiness"]:
        raise cronoq.Retryable(f"flaky backend on attempt {ctx.attempt}")
    return f"{ctx.id} done on attempt {ctx.attempt}"


def summary(snap: cronoq.Snapshot, elapsed: float) -> str:
    p = snap.pool("default")
    assert p is not None
    t = snap.totals
    c, h, n, lo = p.pending_by_class
    return (
        f"{elapsed:5.1f}s  busy {p.busy}/{p.capacity}  pending C{c} H{h} N{n} L{lo}  "
        f"ok {t['succeeded']}  retries {t['retries']}  dead {t['dead_lettered']}  "
        f"wait p50 {p.wait_p50 * 1000:.0f} ms p99 {p.wait_p99 * 1000:.0f} ms"
    )


async def main() -> None:
    rng = random.Random(7)
    pool = cronoq.Pool(
        "default",
        work,
        max=8,
        autoscale=False,
        retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.5),
    )
    classes = list(cronoq.Priority)
    async with cronoq.Scheduler([pool]) as sched:
        started = time.monotonic()
        handles = []
        for i in range(TASKS):
            prio = rng.choices(classes, weights=[1, 3, 10, 6])[0]
            payload = {"seconds": rng.uniform(0.005, 0.03), "flakiness": 0.2}
            handles.append((prio, await sched.submit(payload, priority=prio, key=f"job-{i}")))
        live = sys.stdout.isatty()
        while not all(h.done() for _, h in handles):
            line = summary(await sched.snapshot(), time.monotonic() - started)
            print(f"\r{line}", end="", flush=True) if live else print(line)
            await asyncio.sleep(0.25 if live else 0.5)
        snap = await sched.snapshot()
        print(("\r" if live else "") + summary(snap, time.monotonic() - started))

        finished: dict[cronoq.Priority, list[str]] = {p: [] for p in classes}
        for prio, h in handles:
            try:
                await h
                finished[prio].append("succeeded")
            except cronoq.TaskFailed as e:
                finished[prio].append(e.status)
        print("\nby class:")
        for prio in classes:
            outcomes = finished[prio]
            ok = outcomes.count("succeeded")
            print(
                f"  {prio.name:<8} {len(outcomes):4d} tasks  {ok:4d} succeeded  "
                f"{len(outcomes) - ok:3d} dead-lettered after 3 attempts"
            )
        p = snap.pool("default")
        assert p is not None
        print(
            f"utilization {p.utilization:.2f}  priority adherence {p.priority_adherence:.3f}  "
            f"dispatched {snap.totals['dispatched']} attempts for {TASKS} tasks"
        )


if __name__ == "__main__":
    asyncio.run(main())
