"""Two pools: async and plain task functions, one that fails, one that logs."""

from __future__ import annotations

import logging
import threading
from typing import Any

import cronoq

app = cronoq.App("served")
app.pool("other", max=3)
log = logging.getLogger("served")


@app.task
async def add(a: int, b: int) -> int:
    return a + b


@app.task
async def where() -> dict[str, Any]:
    ctx = cronoq.context()
    return {"pool": ctx.pool, "kind": ctx.kind, "attempt": ctx.attempt}


@app.task(pool="other")
def shout(text: str) -> dict[str, Any]:
    """A plain function: the worker runs it in a thread, with the attempt's context."""
    ctx = cronoq.context()
    log.info("shouting %s", text)
    return {
        "text": text.upper(),
        "pool": ctx.pool,
        "main_thread": threading.current_thread() is threading.main_thread(),
    }


@app.task(kind="explode")
async def explode_now(reason: str) -> int:
    raise RuntimeError(f"boom: {reason}")
