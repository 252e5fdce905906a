"""A worker of pools `shared` and `solo` that knows kinds `x` and `s` only."""

from __future__ import annotations

import cronoq

app = cronoq.App("knows_x")


@app.task(pool="shared")
async def x() -> str:
    return "x"


@app.task(pool="solo")
async def s() -> str:
    return "s"
