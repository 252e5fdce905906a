"""User code with the mistakes cronoq's typed task functions (cronoq.App) catch: `mypy --strict`
rejects each line whose comment names its error (tests/unit/test_app_typing.py), and no other
line; pyright rejects the same lines."""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass

import cronoq
from cronoq.app import Handle

app = cronoq.App("sample")
app.pool("reports", mx=4)  # E: Unexpected keyword argument "mx"
app.pool("reports", overflow="drop")  # E: Argument "overflow" to "pool" of "App"
app.pool("images", max="4")  # E: Argument "max" to "pool" of "App"


@dataclass
class Order:
    id: int
    items: list[str]


@app.task
async def add(a: int, b: int) -> int:
    return a + b


@app.task
def slugify(text: str, *, sep: str = "-") -> str:
    return sep.join(text.lower().split())


@app.task(pool="reports", timeout=30.0)
async def report(order: Order, title: str = "report") -> int:
    return order.id


@app.task(priority="urgent")  # E: No overload variant of "task" of "App"
async def urgent(n: int) -> int:
    return n


@app.task(pirority="high")  # E: Unexpected keyword argument "pirority"
async def misspelled(n: int) -> int:
    return n


@app.task(timeout="5s")  # E: No overload variant of "task" of "App"
def slow(n: int) -> int:
    return n


@app.task(key="once")  # E: Unexpected keyword argument "key"
def keyed(n: int) -> int:
    return n


async def submitting() -> None:
    await add.submit(1, "2")  # E: Argument 2 to "submit" of "Submitter"
    await add.submit(1)  # E: Missing positional argument "b" in call to "submit"
    await add.submit(1, 2, 3)  # E: Too many arguments for "submit"
    await add.submit(1, c=2)  # E: Unexpected keyword argument "c" for "submit"
    await slugify.submit("x", "-")  # E: Too many positional arguments for "submit"
    await report.submit({"id": 1, "items": []})  # E: has incompatible type "dict[str, object]"
    await add.options(priority="urgent").submit(1, 2)  # E: Argument "priority" to "options"
    await add.options(pirority="high").submit(1, 2)  # E: Unexpected keyword argument "pirority"
    await add.options(timeout="5s").submit(1, 2)  # E: Argument "timeout" to "options"
    await add.options(after=1.5).submit(1, 2)  # E: Argument "after" to "options" of "Submitter"
    await add.options(deps=[("sum", "succeeded")]).submit(1, 2)  # E: Literal['succeeded']
    await add.options(key="k").submit(1, "2")  # E: Argument 2 to "submit" of "Submitter"
    await add.options(pool="reports").submit(1, 2)  # E: Unexpected keyword argument "pool"
    await add.options(key="k").options(on_miss="late").submit(1, 2)  # E: Argument "on_miss"


async def awaiting() -> None:
    handle = await add.submit(1, 2)
    text: str = await handle  # E: expression has type "int", variable has type "str"
    other: Handle[str] = await add.submit(1, 2)  # E: variable has type "Handle[str]"
    number: int = await (await slugify.submit("x"))  # E: has type "str", variable has type "int"
    late: int = await handle.result(timeout="soon")  # E: Argument "timeout" to "result" of "Handle"
    forgot: int = await add.submit(1, 2)  # E: "Handle[int]", variable has type "int"
    await slugify("x")  # E: Incompatible types in "await" (actual type "str"
    print(text, other, number, late, forgot)


async def batching() -> None:
    await app.submit_batch([add.call(1, "2")])  # E: Argument 2 to "call" of "Submitter"
    await app.submit_batch([add.call(1, 2), slugify.call(text=3)])  # E: Argument "text" to "call"
    await app.submit_batch([add.options(tenat="t").call(1, 2)])  # E: keyword argument "tenat"
    handles = await app.submit_batch([add.call(1, 2), add.call(3, 4)])
    strings: list[Handle[str]] = handles  # E: variable has type "list[Handle[str]]"
    await app.submit_batch([add])  # E: Argument 1 to "submit_batch" of "App"
    mixed = await app.submit_batch([add.call(1, 2), slugify.call("x")])
    ints: list[Handle[int]] = mixed  # E: has type "list[Handle[object]]"
    print(strings, ints)


async def directly() -> None:
    slugify(3)  # E: Argument 1 to "__call__" of "SyncTaskFunction"
    slugify("x", sep=None)  # E: Argument "sep" to "__call__" of "SyncTaskFunction"
    number: int = slugify("x")  # E: has type "str", variable has type "int"
    result: int = add(1, 2)  # E: "Coroutine[Any, Any, int]", variable has type "int"
    attempt: str = cronoq.context().attempt  # E: expression has type "int", variable has type "str"
    print(number, result, attempt)
