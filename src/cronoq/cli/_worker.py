"""`cronoq worker MODULE:APP`: serve an application's task functions (docs/app.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from cronoq._logs import setup_logging

from ._params import DURATION, PAIR, credentials, tls_options

__all__ = ["worker"]


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.option(
    "--target",
    envvar="CRONOQ_TARGET",
    help="Server address (default: the app's target, else the global --server). Env CRONOQ_TARGET.",
)
@click.option(
    "--token",
    envvar="CRONOQ_WORKER_TOKEN",
    help="Worker token (default: the global --token). Env CRONOQ_WORKER_TOKEN.",
)
@click.option("--tls", is_flag=True, help="Use TLS with the system's CAs (https:// does too).")
@tls_options
@click.option("--pool", "pools", multiple=True, help="Serve this pool only (repeatable).")
@click.option(
    "--slots",
    multiple=True,
    help="Leases at a time: N for every pool or POOL=N (repeatable; default: the pool's max).",
)
@click.option("--label", "labels", type=PAIR, multiple=True, help="Worker label name=value.")
@click.option("--name", default="", help="Worker name shown by the server.")
@click.option(
    "--grace",
    type=DURATION,
    default=10.0,
    show_default=True,
    help="On SIGTERM/SIGINT, let running tasks finish for this long.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="CRONOQ_LOG_FORMAT",
    default="text",
    show_default=True,
    help="Text lines or one JSON object per line. Env CRONOQ_LOG_FORMAT.",
)
@click.option(
    "--log-level",
    envvar="CRONOQ_LOG_LEVEL",
    default="info",
    show_default=True,
    help="debug, info, warning or error. Env CRONOQ_LOG_LEVEL.",
)
@click.pass_obj
def worker(
    settings: Any,
    app_path: str,
    target: str | None,
    token: str | None,
    tls: bool,
    ca: Path | None,
    cert: Path | None,
    key_file: Path | None,
    pools: tuple[str, ...],
    slots: tuple[str, ...],
    labels: tuple[tuple[str, str], ...],
    name: str,
    grace: float,
    log_format: str,
    log_level: str,
) -> int:
    """Serve the task functions of the cronoq.App at MODULE:APP (e.g. tasks:app) to a server.

    One worker per pool the app declares (or each --pool), until SIGTERM or SIGINT: then
    running tasks get --grace to finish; a second signal stops at once. Exits 3 with one line
    when the server refuses the worker for good (a wrong token, an unknown pool).
    """
    from cronoq.app._serve import load_app, serve

    try:
        setup_logging("json" if log_format == "json" else "text", log_level)
        app = load_app(app_path)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    options: dict[str, Any] = {
        "token": token or settings.token,
        "tls": tls,
        "credentials": credentials(ca, cert, key_file) or settings.credentials,
        "labels": dict(labels),
        "name": name,
    }
    try:
        asyncio.run(
            serve(
                app,
                target or app.target or settings.server,
                pools=pools,
                slots=slots,
                grace=grace,
                worker_options=options,
            )
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    return 0
