"""The `cronoq-server` command: flags, configuration, logs, signals (docs/server.md).

Order of operations (docs/server.md, "Command line"): `--version` and `--print-proto` need nothing
else; then the configuration is read without judging it, `--insecure-no-auth` and `--shard` are
written over it, and it is validated; `--check` stops there, printing `configuration is valid`.
Exit codes (docs/server.md, "Exit codes"): 0 after a valid `--check`, a clean run or a graceful
shutdown; 2 for a bad command line (argparse's usage error); 1 whenever the server cannot run: a
bad configuration (one `Error: <key path>: <rule>` line per problem on stderr, nothing logged),
a missing server extra (one `Error:` line), or a failed start (a taken address, an unusable store
file: logged as `event=failed` before the shutdown's `stopping` and `stopped`, then one last
`Error: <reason>` line).

`cronoq-server backup ...` (a first argument of exactly `backup`) is the online backup of a
SQLite store instead (backup.py, docs/backups.md); every other command line is the server's.

Logs go to stderr, one line per record, as `key=value` pairs (logfmt): `ts`, `level`,
`logger`, then `event=<name>` and the event's fields, or `msg=<text>` for ordinary records.
With `server.log_format = "json"` (or CRONOQ_LOG_FORMAT=json) each line is one JSON object
with the same members instead, written by the worker command's formatter (cronoq._logs). The
format applies from the start: the warnings found while validating the configuration are
written in the format the configuration asks for.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cronoq import __version__
from cronoq._logs import JsonFormatter, current_trace_ids
from cronoq.errors import SchedulerError
from cronoq.proto import proto_text

from .config import (
    ConfigError,
    ServerConfig,
    apply_overrides,
    log_format_of,
    read_config,
    validate,
)
from .logs import event

__all__ = ["LogfmtFormatter", "main"]

log = logging.getLogger("cronoq.server")

# The top-level modules the server extra installs (pyproject.toml, [project.optional-dependencies]).
_SERVER_EXTRA = frozenset({"grpc", "google", "aiohttp", "prometheus_client"})
VALID = "configuration is valid"  # what --check prints on stdout
BACKUP = "backup"  # the one subcommand, recognised only as the very first argument
_BARE = re.compile(r"[A-Za-z0-9_.:/@+\-\[\]]+")  # values that need no quotes


class LogfmtFormatter(logging.Formatter):
    """One `key=value` line per record, so that a record never spans lines (tracebacks too)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        pairs: list[tuple[str, object]] = [
            ("ts", f"{ts}.{int(record.msecs):03d}Z"),
            ("level", record.levelname.lower()),
            ("logger", record.name),
        ]
        ids = current_trace_ids()
        if ids is not None:
            pairs += (("trace_id", ids[0]), ("span_id", ids[1]))
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            pairs.append(("event", record.getMessage()))
            pairs.extend(fields.items())
        else:
            pairs.append(("msg", record.getMessage()))
        if record.exc_info:
            pairs.append(("exc", self.formatException(record.exc_info)))
        return " ".join(f"{key}={_value(value)}" for key, value in pairs)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return text if _BARE.fullmatch(text) else json.dumps(text, ensure_ascii=False)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cronoq-server",
        description="Serve the cronoq scheduler to remote clients and workers (cronoq.v1).",
    )
    p.add_argument(
        "-c",
        "--config",
        metavar="PATH",
        help="TOML configuration file (env CRONOQ_CONFIG); without it, the embedded default",
    )
    p.add_argument("--check", action="store_true", help="validate the configuration and exit")
    p.add_argument("--print-proto", action="store_true", help="print cronoq/v1/cronoq.proto")
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow non-loopback listeners without credentials",
    )
    p.add_argument("--shard", metavar="NAME", help="the shard to serve (env CRONOQ_SHARD)")
    p.add_argument("-V", "--version", action="store_true", help="print the version and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == [BACKUP]:
        # `cronoq-server backup ...` (docs/backups.md). Only a first argument of exactly
        # "backup" leads here: the server's own command line takes no positional argument, so
        # every invocation that worked before parses as it did.
        from .backup import main as backup_main

        return backup_main(words[1:])
    try:
        args = _parser().parse_args(words)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.version:
        print(f"cronoq-server {__version__}")
        return 0
    if args.print_proto:
        sys.stdout.write(proto_text())
        return 0

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)  # until the configuration names its level
    try:
        return _run(args, handler)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _run(args: argparse.Namespace, handler: logging.Handler) -> int:
    path = args.config or os.environ.get("CRONOQ_CONFIG") or None
    shard = args.shard or os.environ.get("CRONOQ_SHARD") or None
    try:
        raw = read_config(None if path is None else Path(path))
        raw = apply_overrides(raw, insecure_no_auth=args.insecure_no_auth, shard=shard)
        # before validating: its warnings (a short token, ...) are records in that format too
        handler.setFormatter(_formatter(log_format_of(raw)))
        cfg = validate(raw)
    except ConfigError as exc:
        return _config_errors(exc)
    handler.setFormatter(_formatter(cfg.server.log_format))  # the same, now validated
    if args.check:
        print(VALID)
        return 0
    missing = _missing_server_extra()
    if missing is not None:
        return _error(f"serving needs the server extra ({missing}): pip install 'cronoq[server]'")
    logging.getLogger().setLevel(cfg.server.log_level.upper())
    try:
        asyncio.run(_serve(cfg))
    except ConfigError as exc:
        return _config_errors(exc)
    except (SchedulerError, OSError) as exc:
        # logged as event=failed, before the shutdown's events; said once more, last
        return _error(str(exc))
    return 0


def _formatter(log_format: str) -> logging.Formatter:
    """`server.log_format`'s formatter: logfmt, or JSON with the server's records carrying
    fields rendered as events (`event` and the fields, as in logfmt)."""
    return JsonFormatter(events=True) if log_format == "json" else LogfmtFormatter()


def _missing_server_extra() -> str | None:
    """What the server extra would bring and is missing ("no module named 'aiohttp'"), or None.

    Only serving needs it (grpcio, protobuf, aiohttp, prometheus_client): `--check`,
    `--print-proto` and `--version` work without it. An ImportError about any other module is
    a broken installation, not a missing extra, and keeps its traceback."""
    try:
        from . import wiring  # noqa: F401  (every module of the server, and so every import)
    except ImportError as exc:
        error: BaseException | None = exc
        while error is not None:
            name = getattr(error, "name", None) or ""
            if name.partition(".")[0] in _SERVER_EXTRA:
                return f"no module named {name!r}"
            error = error.__cause__
        raise
    return None


def _error(message: str) -> int:
    """The server cannot run: `Error: <message>` on stderr, one line per line of it, exit 1."""
    for line in message.splitlines() or [""]:
        print(f"Error: {line}", file=sys.stderr)
    return 1


def _config_errors(exc: ConfigError) -> int:
    """One `Error: <key path>: <rule>` line per problem, exit 1 (nothing was logged)."""
    return _error("\n".join(exc.errors))


async def _serve(cfg: ServerConfig) -> None:
    # Imported here: --check and --print-proto then work without grpcio installed.
    from .wiring import build  # grpc is imported only to serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _on_signal, stop, sig)
    try:
        app = build(cfg)
    except ConfigError:
        raise  # one Error line per problem, exit 1
    except (SchedulerError, OSError) as exc:  # nothing started yet: nothing to stop
        event(log, logging.ERROR, "failed", error=exc)
        raise
    app.on_ready(settle_heap)
    await app.serve(stop)  # logs event=failed itself when the start fails, then stops


def settle_heap() -> None:
    """Leave what the process holds once it leads (modules, the engine and its tables) out of
    every later full garbage collection: those walk every object in sight, and the engine's
    tables hold every retained task, so each one would pause the server longer as it fills.
    The previous freeze is undone first, so what an earlier leadership left is collected."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    event(log, logging.INFO, "signal", signal=sig.name)
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
