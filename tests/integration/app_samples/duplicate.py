"""Raises at import: two functions declare the same kind."""

from __future__ import annotations

import cronoq

app = cronoq.App("duplicate")


@app.task(kind="same")
async def first() -> None:
    return None


@app.task(kind="same")
async def second() -> None:
    return None
