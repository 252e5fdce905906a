"""A worker of pool `shared` that knows kind `y`."""

from __future__ import annotations

import cronoq

app = cronoq.App("knows_y")


@app.task(pool="shared")
async def y(n: int) -> dict[str, int]:
    return {"n": n, "attempt": cronoq.context().attempt}
