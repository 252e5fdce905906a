"""Structured log records: the server's log lines are `event=<name>` plus key=value fields, or
with `server.log_format = "json"` a JSON object with `event` and the fields as members (the
command line's formatters, server/cli.py and cronoq._logs, render them)."""

from __future__ import annotations

import logging
from typing import Any


def event(logger: logging.Logger, level: int, name: str, **fields: Any) -> None:
    logger.log(level, name, extra={"fields": fields})
