"""Structured log records: the server's log lines are `event=<name>` plus key=value fields (the
command line's formatter, server/cli.py, renders them)."""

from __future__ import annotations

import logging
from typing import Any


def event(logger: logging.Logger, level: int, name: str, **fields: Any) -> None:
    logger.log(level, name, extra={"fields": fields})
