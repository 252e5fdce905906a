"""User code that uses cronoq's task functions (cronoq.App) correctly: `mypy --strict` and
pyright accept it (tests/unit/test_app_typing.py), and it runs in library mode (`main`)."""

# pyright: strict

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import cronoq
from cronoq.app import Call, Handle, TaskFunction

app = cronoq.App("sample")
app.pool("reports", max=4, overflow="shed_oldest", unknown_dependency="await", lease_ttl=30.0)
app.pool("images", min=1, max=2, autoscale=True, retry=cronoq.RetryPolicy(2), fair_share=True)


@dataclass
class Order:
    id: int
    items: list[str]


@dataclass
class Report:
    order: int
    lines: int
    title: str


@app.task
async def add(a: int, b: int) -> int:
    return a + b


@app.task
def slugify(text: str, *, sep: str = "-") -> str:
    return sep.join(text.lower().split())


@app.task(pool="reports", priority="high", timeout=30.0, retry=cronoq.RetryPolicy(3))
async def report(order: Order, title: str = "report") -> Report:
    ctx = cronoq.context()
    attempt: int = ctx.attempt
    task_id: int = ctx.task_id
    key: str | None = ctx.key
    if ctx.is_cancelled():
        raise RuntimeError(f"task {task_id} ({key}) cancelled in attempt {attempt}")
    ctx.heartbeat()
    return Report(order.id, len(order.items), title)


@app.task(kind="thumbnail", pool="images", priority=cronoq.Priority.LOW, tags={"team": "web"})
def thumbnail(path: str, size: int = 128) -> bytes:
    deadline: float | None = cronoq.context().deadline
    return f"{path}@{size}:{deadline is not None}".encode()


async def run_pair(task: TaskFunction[[int, int], object]) -> object:
    """Any task function of two ints, whatever it returns."""
    return await (await task.submit(1, 2))


async def main() -> None:
    async with app.local():
        # positional and keyword arguments; the handle awaits to the function's result
        h: Handle[int] = await add.submit(2, b=3)
        total: int = await h
        slug: str = await (await slugify.submit("Hello World", sep="_"))
        rep: Report = await (await report.submit(Order(7, ["a", "b"]), title="weekly"))
        thumb: bytes = await (await thumbnail.submit("a.png")).result(timeout=10.0)

        # options of one call
        keyed = await add.options(key="sum", priority="critical", timeout=5.0).submit(1, 1)
        later = await add.options(after=keyed, priority=cronoq.Priority.HIGH).submit(3, 4)
        either = await slugify.options(
            deps=[(later, "on_success"), ("sum", "complete"), (keyed.id, "on_complete")],
            tags={"via": "deps"},
        ).submit(text="Either Way")
        fast = report.options(priority=0, deadline_in=60.0, tenant="acme")
        also: Handle[Report] = await fast.submit(Order(8, []))
        after_many = await add.options(after=[keyed, "sum", later.id]).submit(0, 0)

        # an atomic batch: a call may depend on another call of the same batch
        first: Call[int] = add.call(1, 2)
        second = add.options(after=first).call(3, b=4)
        handles: list[Handle[int]] = await app.submit_batch([first, second])
        sums: list[int] = [await one for one in handles]
        mixed = await app.submit_batch([add.call(5, 6), slugify.call("Mixed Batch")])
        results: list[object] = [await one for one in mixed]

        # called directly, a task function is the function it declares
        direct: int = await add(20, 22)
        here: str = slugify("Run Here", sep=".")
        waiting = await thumbnail.options(start_in=3600.0, key="later").submit("b.png", size=64)
        cancelled: bool = await waiting.cancel()
        # a task function is one of a wider result type, as its handles and calls are
        anything = await run_pair(add)

        print(total, slug, rep, thumb, await either, await also, await after_many)
        print(sums, results, direct, here, cancelled, anything, h.id, h.duplicate, h.kind)


if __name__ == "__main__":
    asyncio.run(main())
