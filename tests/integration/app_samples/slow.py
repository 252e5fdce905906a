"""A task of pool slow that runs until the test creates its release file."""

from __future__ import annotations

import asyncio
import logging
import os

import cronoq

app = cronoq.App("slow", default_pool="slow")
log = logging.getLogger("slow")


@app.task
async def hold(release: str) -> int:
    """Log that it runs, wait until the file `release` exists, return the attempt number."""
    attempt = cronoq.context().attempt
    log.info("holding %s attempt %d", release, attempt)
    while not os.path.exists(release):
        await asyncio.sleep(0.02)  # the condition is a file the test creates
    log.info("released %s attempt %d", release, attempt)
    return attempt
