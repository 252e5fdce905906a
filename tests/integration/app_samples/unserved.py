"""Tasks on a pool the test server does not have."""

from __future__ import annotations

import cronoq

app = cronoq.App("unserved")


@app.task(pool="nowhere")
async def lost() -> None:
    return None
