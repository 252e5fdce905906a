"""Log set-up for cronoq's long-running commands: human text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal

__all__ = ["JsonFormatter", "LogFormat", "setup_logging"]

LogFormat = Literal["text", "json"]
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (`ts`, `level`, `logger`, `msg`, `exc`), so that a log
    shipper never has to join lines, and a traceback stays inside its record."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(fmt: LogFormat, level: str) -> None:
    """Send every record at `level` and above to stderr in `fmt`; ValueError for an unknown
    level name."""
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
