"""The README's quick start: task functions declared on a `cronoq.App`, run in this process
(library mode) or by `cronoq worker` processes of a `cronoq-server` (server mode).

    python examples/tasks.py                          # library mode: no server
    cronoq-server &                                   # server mode: a server,
    cronoq worker tasks:app &                         # a worker serving this module's app
    python examples/tasks.py http://127.0.0.1:7070    # and submits to the server

(`cronoq worker` imports `tasks` from the current directory: run it from examples/.)
"""

from __future__ import annotations

import asyncio
import sys

import cronoq

app = cronoq.App()


@app.task
async def add(a: int, b: int) -> int:
    return a + b


@app.task(priority="high", retry=cronoq.RetryPolicy(max_attempts=3))
def greet(name: str) -> str:  # a plain function runs in a thread
    return f"hello {name} (attempt {cronoq.context().attempt})"


async def main(server: str | None) -> None:
    async with app.connect(server) if server else app.local():
        print(await (await add.submit(2, 3)))  # 5
        h = await greet.options(key="greet-ada").submit("ada")
        print(await h.result(timeout=30))  # hello ada (attempt 1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
