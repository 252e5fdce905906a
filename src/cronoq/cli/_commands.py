"""The `cronoq` commands (docs/cli.md) on top of `cronoq.client.Client`.

Each command turns its options into client calls, runs them in one `asyncio.run`, and prints a
table (or JSON with `--json`). Commands do not handle errors: they propagate to `run()`, which
turns each kind into one line on stderr and the exit code docs/cli.md lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar, cast
from urllib.parse import urlsplit

import click
import grpc
import grpc.aio
from rich.console import Console, RenderableType

from cronoq import __version__
from cronoq._attempt import TRACEPARENT
from cronoq._tracing import copy_context
from cronoq.client import (
    BULK_ACTIONS,
    SORTS,
    Client,
    ClientError,
    Payload,
    PoolControl,
    Submitted,
    TaskFilter,
    TaskInfo,
)
from cronoq.client._common import open_channel, strip_target
from cronoq.core.vocab import MISS_POLICIES, OVERLAPS, PRIORITY_NAMES, STATUSES, Overlap

from . import _top
from ._params import DURATION, MOMENT, PAIR, REF, RESOURCE, TIME, credentials, tls_options
from ._render import (
    bulk_text,
    event_line,
    plain,
    recurring_table,
    result_detail,
    task_detail,
    task_table,
    to_json,
    workers_table,
)
from ._worker import worker

__all__ = ["cli", "run"]

EXIT_OK = 0
EXIT_NOT_SUCCEEDED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130

DEFAULT_SERVER = "http://127.0.0.1:7070"
log = logging.getLogger("cronoq.cli")

_REFUSED_RETRY = 0.05  # how often a refused connection is tried again within --connect-timeout
_WAIT_CHECK = 2.0  # how often a waiting command looks whether the task's pool can run it
_STANDBY = "not the leader (standby)"  # a refusal by a server that does not lead (yet)
PIPE_WIDTH = 200
_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


class Unreachable(Exception):
    """No connection to the server within `--connect-timeout`, or the connection failed."""


@dataclass
class Settings:
    """The global options, shared by every command through the click context."""

    server: str = DEFAULT_SERVER
    token: str | None = None
    credentials: grpc.ChannelCredentials | None = None
    connect_timeout: float = 5.0
    json: bool = False
    debug: bool = False

    def call(self, work: Callable[[Client], Awaitable[int]]) -> int:
        """Run `work` with a connected client; fail fast when the server cannot be reached,
        because gRPC calls would otherwise wait for a connection far longer than a person."""

        if self.debug:
            logging.basicConfig(level=logging.DEBUG)

        async def connected() -> int:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.connect_timeout
            await _probe(self)
            async with Client(self.server, token=self.token, credentials=self.credentials) as c:
                while True:
                    try:
                        return await work(c)
                    except ClientError as e:
                        # A server that listens but does not lead yet (it is starting, or
                        # taking over) refused the call before running it: try it again
                        # within --connect-timeout, as a port that refuses connections is.
                        if e.code != "unavailable" or _STANDBY not in e.message:
                            raise
                        if deadline - loop.time() <= _REFUSED_RETRY:
                            raise
                    await asyncio.sleep(_REFUSED_RETRY)

        return asyncio.run(connected())

    def show(self, value: Any, renderable: RenderableType) -> None:
        """Print `value` as JSON with `--json`, otherwise `renderable` for people."""
        if self.json:
            click.echo(to_json(value))
        else:
            _console().print(renderable)


def _console() -> Console:
    """Rich's console for our output. Piped output gets a wide page instead of rich's 80
    columns, so table cells (names, times, cron lines) are not cut or wrapped for `grep`."""
    probe = Console(highlight=False)
    return probe if probe.is_terminal else Console(highlight=False, width=PIPE_WIDTH)


async def _probe(settings: Settings) -> None:
    """Raise Unreachable unless a channel like the client's gets ready in time."""
    server = settings.server
    deadline = asyncio.get_running_loop().time() + settings.connect_timeout
    try:
        async with asyncio.timeout_at(deadline):
            await _listening(server, deadline)
            channel = open_channel(
                server, tls=False, credentials=settings.credentials, options=None
            )
            try:
                await _ready(channel, server)
            finally:
                await channel.close()
    except TimeoutError:
        raise Unreachable(
            f"cannot reach {server}: no connection within {settings.connect_timeout:g}s"
        ) from None


async def _listening(server: str, deadline: float) -> None:
    """Wait while the server's port refuses connections: a server started just before the
    command may not listen yet (the README's server-mode block does exactly that)."""
    try:
        parts = urlsplit("//" + strip_target(server))
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if host is None or port is None:
        return  # a target only gRPC understands (unix:, dns:///): it decides alone
    loop = asyncio.get_running_loop()
    told = False
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except ConnectionRefusedError:
            if deadline - loop.time() <= _REFUSED_RETRY:
                raise _failed(server) from None
            if not told:
                log.debug("%s refuses connections (not listening yet?); trying again", server)
                told = True
            await asyncio.sleep(_REFUSED_RETRY)
        except OSError:
            raise _failed(server) from None
        else:
            writer.close()
            await writer.wait_closed()
            return


async def _ready(channel: grpc.aio.Channel, server: str) -> None:
    """Wait for READY; a failed attempt (TLS mismatch, a refused handshake) is final."""
    state = channel.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise _failed(server)
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)


def _failed(server: str) -> Unreachable:
    return Unreachable(
        f"cannot reach {server}: connection failed (is the server running, with TLS "
        "only if the address says https://?)"
    )


def _set_flag(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and param.name is not None:
        setattr(ctx.ensure_object(Settings), param.name, True)


def _output_flags(f: _F) -> _F:
    """`--json` and `--debug`, accepted before and after the subcommand's name."""
    f = click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        callback=_set_flag,
        help="Show tracebacks and client logs.",
    )(f)
    return click.option(
        "--json",
        is_flag=True,
        expose_value=False,
        callback=_set_flag,
        help="Print JSON for scripts.",
    )(f)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(
    __version__, "-V", "--version", prog_name="cronoq", message="%(prog)s %(version)s"
)
@click.option(
    "--server",
    envvar="CRONOQ_SERVER",
    default=DEFAULT_SERVER,
    show_default=True,
    help="Server address; https:// selects TLS. Env CRONOQ_SERVER.",
)
@click.option("--token", envvar="CRONOQ_TOKEN", help="Bearer token. Env CRONOQ_TOKEN.")
@tls_options
@click.option(
    "--connect-timeout",
    envvar="CRONOQ_CONNECT_TIMEOUT",
    type=DURATION,
    default=5.0,
    show_default=True,
    help="Wait this long for the server to listen and accept a connection. "
    "Env CRONOQ_CONNECT_TIMEOUT.",
)
@_output_flags
@click.pass_context
def cli(
    ctx: click.Context,
    server: str,
    token: str | None,
    ca: Path | None,
    cert: Path | None,
    key_file: Path | None,
    connect_timeout: float,
) -> None:
    """Submit and inspect cronoq tasks, and watch the server live with `cronoq top`.

    Durations are seconds (1.5) or a number with a unit: 500ms, 30s, 5m, 2h, 1d.
    Exit codes: 0 ok, 1 task not succeeded, 2 usage, 3 refused by the server,
    4 server unreachable, 124 timeout.
    """
    settings = ctx.ensure_object(Settings)
    settings.server, settings.token, settings.connect_timeout = server, token, connect_timeout
    settings.credentials = credentials(ca, cert, key_file)


def _task_options(f: _F) -> _F:
    """The task options `submit` and `recurring add` share (docs/client.md, "`task()` options")."""
    options = [
        click.option(
            "--file",
            type=click.File("rb"),
            help="Read the payload from this file ('-' for stdin).",
        ),
        click.option(
            "--json-payload",
            is_flag=True,
            help="The payload is JSON: check it and send it as application/json.",
        ),
        click.option("--content-type", help="Media type of the payload."),
        click.option("--pool", help="Pool (default: the server's first pool)."),
        click.option("--kind", help="Free-form task kind, shown to workers."),
        click.option("--key", help="Unique key: a second submit with it is a duplicate."),
        click.option(
            "--priority",
            type=click.Choice(PRIORITY_NAMES, case_sensitive=False),
            help="Priority class (default normal).",
        ),
        click.option("--tenant", help="Tenant for fair sharing."),
        click.option("--deadline-in", type=DURATION, help="Deadline, relative."),
        click.option("--tolerance", type=DURATION, help="Allowed lateness of a fixed start."),
        click.option(
            "--on-miss",
            type=click.Choice(MISS_POLICIES),
            help="What a missed fixed start does.",
        ),
        click.option("--timeout", type=DURATION, help="Time limit of each attempt."),
        click.option("--max-attempts", type=click.IntRange(min=1), help="Retry budget."),
        click.option("--tag", type=PAIR, multiple=True, help="Tag name=value (repeatable)."),
        click.option("--label", type=PAIR, multiple=True, help="Required worker label name=value."),
        click.option(
            "--resource", type=RESOURCE, multiple=True, help="Resource name=amount to hold."
        ),
        click.option("--duration-hint", type=DURATION, help="Expected run time."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


_PLAIN_OPTIONS = (
    "pool", "kind", "key", "priority", "tenant", "deadline_in", "deadline_at", "start_in",
    "start_at", "tolerance", "on_miss", "timeout", "duration_hint",
)  # fmt: skip


_TRACE_ENV = ("TRACEPARENT", "TRACESTATE")


def _task_kwargs(arg: str | None, options: dict[str, Any]) -> tuple[Payload, dict[str, Any]]:
    """The payload and the `task()` keyword arguments of the given options; unset ones are left
    out so the client's and the server's defaults apply."""
    for relative, absolute in (("deadline_in", "deadline_at"), ("start_in", "start_at")):
        if options.get(relative) is not None and options.get(absolute) is not None:
            raise click.UsageError(
                f"--{relative.replace('_', '-')} and --{absolute.replace('_', '-')} exclude "
                "each other"
            )
    payload, content_type = _payload(
        arg, options["file"], options["json_payload"], options["content_type"]
    )
    kwargs = {n: options[n] for n in _PLAIN_OPTIONS if options.get(n) is not None}
    if content_type:
        kwargs["content_type"] = content_type
    if options["max_attempts"]:
        kwargs["retry"] = {"max_attempts": options["max_attempts"]}
    for option, name in (("tag", "tags"), ("label", "labels"), ("resource", "resources")):
        if options[option]:
            kwargs[name] = dict(options[option])
    if options.get("after"):
        kwargs["after"] = list(options["after"])
    return payload, kwargs


def _payload(
    arg: str | None, file: IO[bytes] | None, as_json: bool, content_type: str | None
) -> tuple[Payload, str | None]:
    """An argument is sent as text, file and stdin bytes as they are; `--json-payload` checks
    the text and sends it unchanged, typed application/json."""
    if arg is not None and file is not None:
        raise click.UsageError("give the payload as an argument or with --file, not both")
    data: str | bytes
    if arg == "-":
        data = sys.stdin.buffer.read()
    elif file is not None:
        data = file.read()
    elif arg is not None:
        data = arg
    elif as_json:
        raise click.UsageError("--json-payload needs a payload")
    else:
        return None, content_type
    if not as_json:
        return data, content_type
    try:
        json.loads(data)
    except ValueError as e:
        raise click.BadParameter(f"not valid JSON: {e}", param_hint="PAYLOAD") from None
    encoded = data.encode("utf-8") if isinstance(data, str) else data
    return encoded, content_type or "application/json"


@cli.command()
@click.argument("payload", required=False)
@_task_options
@click.option("--deadline-at", type=TIME, help="Deadline, RFC 3339 time.")
@click.option("--start-in", type=DURATION, help="Fixed start, relative.")
@click.option("--start-at", type=TIME, help="Fixed start, RFC 3339 time.")
@click.option("--after", type=REF, multiple=True, help="Run after this task succeeds (repeatable).")
@click.option("--wait", is_flag=True, help="Wait for the result; exit 1 unless it succeeded.")
@click.option("--wait-timeout", type=DURATION, help="With --wait: give up after this (exit 124).")
@_output_flags
@click.pass_obj
def submit(
    settings: Settings,
    /,
    payload: str | None,
    wait: bool,
    wait_timeout: float | None,
    **options: Any,
) -> int:
    """Submit a task and print its id (and its result with --wait).

    PAYLOAD is sent as text; '-' reads stdin.
    """
    if wait_timeout is not None and not wait:
        raise click.UsageError("--wait-timeout needs --wait")
    value, kwargs = _task_kwargs(payload, options)
    # A script's trace context, as the environment carries it (TRACEPARENT, TRACESTATE); a
    # --tag traceparent=... wins (docs/observability.md, "Traces").
    tags = kwargs.get("tags") or {}
    if TRACEPARENT not in tags:
        copy_context({k.lower(): v for k, v in os.environ.items() if k in _TRACE_ENV}, tags)
        if tags:
            kwargs["tags"] = tags

    async def work(c: Client) -> int:
        done = await c.submit(value, **kwargs)
        if not settings.json:
            click.echo(str(done.id))
            if done.duplicate:
                click.echo(f"cronoq: task {done.id} has this key already (duplicate)", err=True)
        if wait:
            result = await _waiting(c, done.id, c.wait(done.id, timeout=wait_timeout))
            done = Submitted(done.id, done.duplicate, result)
        if settings.json:
            click.echo(to_json(done))
        elif done.result is not None:
            _console().print(result_detail(done.result))
        failed = done.result is not None and not done.result.ok
        return EXIT_NOT_SUCCEEDED if failed else EXIT_OK

    return settings.call(work)


async def _waiting(c: Client, ref: int | str, wait: Awaitable[_T]) -> _T:
    """`wait`'s answer, with one warning on stderr if, meanwhile, the task's pool cannot run it
    (no worker serves it, or it is paused): otherwise such a wait just looks hung."""
    checker = asyncio.create_task(_warn_if_stuck(c, ref))
    try:
        return await wait
    finally:
        checker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await checker


async def _warn_if_stuck(c: Client, ref: int | str) -> None:
    """Look at the task and its pool's snapshot now and every few seconds; print the first
    reason it waits that a person can act on, once. Best effort: a token that may not read
    snapshots, or any other refusal, ends the checks silently (the wait itself goes on), and a
    published server, whose snapshot has no such flags, never warns."""
    with contextlib.suppress(ClientError):
        while True:
            info = await c.get(ref)
            if info.done:
                return
            if info.status != "running":
                pool = (await c.snapshot()).pool(info.pool)
                if pool is not None and pool.unserved:
                    why = f"no worker serves pool '{pool.name}'; the task waits until one connects"
                elif pool is not None and pool.paused:
                    why = f"pool '{pool.name}' is paused; the task waits until it is resumed"
                else:
                    why = ""
                if why:
                    click.echo(f"cronoq: warning: {why}", err=True)
                    return
            await asyncio.sleep(_WAIT_CHECK)


@cli.command()
@click.argument("ref", type=REF)
@_output_flags
@click.pass_obj
def get(settings: Settings, ref: int | str) -> int:
    """Show a task; REF is its id or, when not a number, its key."""

    async def work(c: Client) -> int:
        info = await c.get(ref)
        settings.show(info, task_detail(info))
        return EXIT_OK

    return settings.call(work)


@cli.command()
@click.argument("ref", type=REF)
@click.option("--timeout", type=DURATION, help="Give up after this (exit 124).")
@click.option("--output", is_flag=True, help="Print only the output bytes.")
@_output_flags
@click.pass_obj
def wait(settings: Settings, ref: int | str, timeout: float | None, output: bool) -> int:
    """Wait until a task ends; exit 0 if it succeeded, 1 otherwise."""

    async def work(c: Client) -> int:
        result = await _waiting(c, ref, c.wait(ref, timeout=timeout))
        if output and not settings.json:
            sys.stdout.buffer.write(result.output or b"")
            sys.stdout.flush()
        else:
            settings.show(result, result_detail(result))
        return EXIT_OK if result.ok else EXIT_NOT_SUCCEEDED

    return settings.call(work)


@cli.command()
@click.argument("ref", type=REF)
@_output_flags
@click.pass_obj
def cancel(settings: Settings, ref: int | str) -> int:
    """Cancel a task; prints whether it was cancelled (not if it had ended or never existed:
    the server answers both alike)."""

    async def work(c: Client) -> int:
        cancelled = await c.cancel(ref)
        text = "cancelled" if cancelled else "not cancelled: no such task, or it had already ended"
        settings.show({"ref": ref, "cancelled": cancelled}, text)
        return EXIT_OK

    return settings.call(work)


@cli.command("list")
@click.option("--pool", "pools", multiple=True, help="Only this pool (repeatable).")
@click.option(
    "--status",
    "statuses",
    type=click.Choice(STATUSES, case_sensitive=False),
    multiple=True,
    help="Only this status (repeatable).",
)
@click.option("--after", type=click.IntRange(min=0), default=0, help="Only ids above this.")
@click.option("--limit", type=click.IntRange(min=0), default=0, help="Page size (server default).")
@click.option("--all", "all_pages", is_flag=True, help="Follow the pages to the end.")
@_output_flags
@click.pass_obj
def list_tasks(
    settings: Settings,
    pools: tuple[str, ...],
    statuses: tuple[str, ...],
    after: int,
    limit: int,
    all_pages: bool,
) -> int:
    """List tasks in id order, one page (or every page with --all)."""

    async def work(c: Client) -> int:
        page = await c.list_tasks(pools=pools, statuses=statuses, after=after, limit=limit)
        tasks: list[TaskInfo] = list(page.tasks)
        missing = set(page.unavailable_shards)
        while all_pages and page.next_after is not None:
            page = await c.list_tasks(
                pools=pools, statuses=statuses, after=page.next_after, limit=limit
            )
            tasks += page.tasks
            missing.update(page.unavailable_shards)
        _warn_missing(missing)
        document = {
            "tasks": tasks,
            "next_after": page.next_after,
            "unavailable_shards": sorted(missing),
        }
        settings.show(document, task_table(tasks))
        if page.next_after is not None and not settings.json:
            click.echo(f"cronoq: more tasks: cronoq list --after {page.next_after}", err=True)
        return EXIT_OK

    return settings.call(work)


def _warn_missing(shards: Iterable[str]) -> None:
    if names := ", ".join(sorted(shards)):
        click.echo(f"cronoq: warning: shards not answering, tasks missing: {names}", err=True)


def _filter_options(f: _F) -> _F:
    """The task filter `search` and `bulk` share (docs/cli.md, "Filters"); a task must match
    every option given, and any value of a repeated one."""
    options = [
        click.option("--pool", "pools", multiple=True, help="Only this pool (repeatable)."),
        click.option(
            "--status",
            "statuses",
            type=click.Choice(STATUSES, case_sensitive=False),
            multiple=True,
            help="Only this status (repeatable).",
        ),
        click.option("--kind", "kinds", multiple=True, help="Only this kind (repeatable)."),
        click.option("--tag", "tags", type=PAIR, multiple=True, help="Has tag name=value (all)."),
        click.option("--key", help="Only the tasks with this key."),
        click.option("--key-prefix", help="Only keys starting with this."),
        click.option(
            "--since",
            "submitted_after",
            type=MOMENT,
            help="Submitted at or after: RFC 3339, or a duration ago (1h).",
        ),
        click.option(
            "--until", "submitted_before", type=MOMENT, help="Submitted before: as --since."
        ),
        click.option(
            "--id", "ids", type=click.IntRange(min=1), multiple=True, help="Only this id."
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _task_filter(options: dict[str, Any]) -> TaskFilter:
    """The client's filter keywords for the options given (unset ones left out)."""
    given = {name: value for name, value in options.items() if value not in (None, ())}
    if "tags" in given:
        given["tags"] = dict(given["tags"])
    return cast("TaskFilter", given)


@cli.command()
@_filter_options
@click.option(
    "--sort",
    type=click.Choice(SORTS, case_sensitive=False),
    default="id",
    show_default=True,
    help="Order by this (started: the latest attempt's start, else the submission).",
)
@click.option("--asc", "ascending", is_flag=True, help="Smallest first (default: largest first).")
@click.option("--limit", type=click.IntRange(min=0), default=0, help="Page size (server default).")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Matches to skip.")
@_output_flags
@click.pass_obj
def search(
    settings: Settings,
    /,
    sort: str,
    ascending: bool,
    limit: int,
    offset: int,
    **options: Any,
) -> int:
    """Find tasks by pool, status, kind, tags, key or submission time, newest first."""
    filters = _task_filter(options)

    async def work(c: Client) -> int:
        page = await c.search_tasks(
            sort=sort, ascending=ascending, limit=limit, offset=offset, **filters
        )
        _warn_missing(page.unavailable_shards)
        document = {
            "tasks": page.tasks,
            "total": page.total,
            "unavailable_shards": page.unavailable_shards,
        }
        settings.show(document, task_table(page.tasks))
        if not settings.json:
            shown = offset + len(page.tasks)
            more = f"; next page: --offset {shown}" if shown < page.total else ""
            click.echo(f"cronoq: {len(page.tasks)} of {page.total} matching tasks{more}", err=True)
        return EXIT_OK

    return settings.call(work)


@cli.command()
@click.argument("action", type=click.Choice(BULK_ACTIONS, case_sensitive=False))
@_filter_options
@click.option("--dry-run", is_flag=True, help="Only count the tasks; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_output_flags
@click.pass_obj
def bulk(settings: Settings, /, action: str, dry_run: bool, yes: bool, **options: Any) -> int:
    """Cancel, retry (submit again) or delete (from the history) every matching task.

    cancel: the tasks not ended. retry: a copy, without its key, of each failed, dead-lettered
    or cancelled one. delete: the ended ones. Without --yes, the count of a dry run is shown
    and confirmed first; with no filter, every task the server holds matches.
    """
    filters = _task_filter(options)
    ask = not (dry_run or yes)
    if ask and not sys.stdin.isatty():
        raise click.UsageError(
            f"bulk {action} changes tasks and there is no terminal to confirm on: "
            "add --yes, or count them first with --dry-run"
        )

    async def work(c: Client) -> int:
        if ask:
            preview = await c.bulk(action, dry_run=True, **filters)
            _warn_missing(preview.unavailable_shards)
            counted = bulk_text(action, preview, dry_run=True)
            if not preview.affected:
                click.echo(f"cronoq: {counted}: nothing changed", err=True)
                return EXIT_OK
            if not click.confirm(f"{counted}. Go ahead?", err=True):
                click.echo("cronoq: nothing changed", err=True)
                return EXIT_OK
        done = await c.bulk(action, dry_run=dry_run, **filters)
        _warn_missing(done.unavailable_shards)
        document = {"action": action, "dry_run": dry_run, **plain(done)}
        settings.show(document, bulk_text(action, done, dry_run=dry_run))
        return EXIT_OK

    return settings.call(work)


def _pool_control(settings: Settings, pool: str, paused: bool) -> int:
    """`pause` and `resume`: one call, and what it changed."""

    async def work(c: Client) -> int:
        state: PoolControl = await (c.pause_pool(pool) if paused else c.resume_pool(pool))
        if state.changed:
            text = f"{'paused' if state.paused else 'resumed'} pool {pool}"
        else:
            text = f"pool {pool} was {'paused already' if state.paused else 'not paused'}"
        settings.show(state, text)
        return EXIT_OK

    return settings.call(work)


@cli.command()
@click.argument("pool")
@_output_flags
@click.pass_obj
def pause(settings: Settings, pool: str) -> int:
    """Start nothing new in POOL until `cronoq resume`; running attempts finish, and submits
    are still accepted."""
    return _pool_control(settings, pool, True)


@cli.command()
@click.argument("pool")
@_output_flags
@click.pass_obj
def resume(settings: Settings, pool: str) -> int:
    """Let POOL start tasks again after `cronoq pause` or `cronoq drain`."""
    return _pool_control(settings, pool, False)


@cli.command()
@click.argument("pool")
@click.option("--timeout", type=DURATION, help="Give up after this (exit 124); POOL stays paused.")
@click.option(
    "--interval", type=DURATION, default=0.5, show_default=True, help="Time between looks."
)
@_output_flags
@click.pass_obj
def drain(settings: Settings, pool: str, timeout: float | None, interval: float) -> int:
    """Pause POOL, then wait until none of its attempts runs (for a deploy, say); resume it
    with `cronoq resume`."""
    if interval <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--interval")

    async def work(c: Client) -> int:
        running = 0

        def progress(busy: int) -> None:
            nonlocal running
            if busy != running:
                click.echo(f"cronoq: pool {pool} paused; {busy} attempt(s) still running", err=True)
            running = busy

        if not await c.drain_pool(pool, timeout, poll=interval, on_wait=progress):
            raise TimeoutError(
                f"pool {pool} still runs {running} attempt(s) after {timeout:g}s; it stays paused"
            )
        text = f"drained pool {pool}: paused, nothing running"
        settings.show({"pool": pool, "paused": True, "drained": True}, text)
        return EXIT_OK

    return settings.call(work)


@cli.command()
@click.option("--pool", "pools", multiple=True, help="Only this pool (repeatable).")
@click.option("--id", "ids", type=click.IntRange(min=1), multiple=True, help="Only this task id.")
@click.option("--key", "keys", multiple=True, help="Only this task key (repeatable).")
@click.option(
    "--all-transitions", "--all", is_flag=True, help="Every status change, not just the ends."
)
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many events.")
@_output_flags
@click.pass_obj
def watch(
    settings: Settings,
    pools: tuple[str, ...],
    ids: tuple[int, ...],
    keys: tuple[str, ...],
    all_transitions: bool,
    count: int | None,
) -> int:
    """Print status events as they happen (terminal ones unless --all-transitions)."""

    async def work(c: Client) -> int:
        seen = 0
        events = c.watch(
            list(pools), ids=list(ids), keys=list(keys), all_transitions=all_transitions
        )
        async for event in events:
            click.echo(to_json(event, lines=True) if settings.json else event_line(event))
            seen += 1
            if count is not None and seen >= count:
                break
        return EXIT_OK

    return settings.call(work)


@cli.command()
@_output_flags
@click.pass_obj
def workers(settings: Settings) -> int:
    """List the connected workers."""

    async def work(c: Client) -> int:
        found = await c.list_workers()
        settings.show(found, workers_table(found))
        return EXIT_OK

    return settings.call(work)


@cli.command()
@_output_flags
@click.pass_obj
def snapshot(settings: Settings) -> int:
    """Print the server's snapshot as JSON (see `cronoq top` for a readable view)."""

    async def work(c: Client) -> int:
        click.echo(to_json(await c.snapshot()))
        return EXIT_OK

    return settings.call(work)


@cli.command()
@click.option(
    "--interval", type=DURATION, default=1.0, show_default=True, help="Time between refreshes."
)
@click.option("--pool", "pools", multiple=True, help="Only this pool (repeatable).")
@click.option("--once", is_flag=True, help="Print one frame and exit (no terminal needed).")
@_output_flags
@click.pass_obj
def top(settings: Settings, interval: float, pools: tuple[str, ...], once: bool) -> int:
    """Live view of pools, workers, totals and failures; quit with q or Ctrl-C."""
    if settings.json:
        raise click.UsageError("top has no JSON output; use `cronoq snapshot`")
    if interval <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--interval")
    console = _console()
    if not once and not console.is_terminal:
        raise click.UsageError("top needs a terminal; use --once for a single frame")

    async def work(c: Client) -> int:
        if once:
            await _top.run_once(c, settings.server, pools, console)
        else:
            await _top.run_live(c, settings.server, interval, pools, console)
        return EXIT_OK

    return settings.call(work)


@cli.group()
def recurring() -> None:
    """Cron schedules that submit a task at each occurrence."""


@recurring.command("add")
@click.argument("name")
@click.argument("cron")
@click.argument("payload", required=False)
@click.option("--tz", help="IANA time zone of the cron expression (default UTC).")
@click.option(
    "--overlap",
    type=click.Choice(OVERLAPS),
    default="skip",
    show_default=True,
    help="What an occurrence does while the previous one still runs.",
)
@_task_options
@_output_flags
@click.pass_obj
def recurring_add(
    settings: Settings,
    /,
    name: str,
    cron: str,
    payload: str | None,
    tz: str | None,
    overlap: Overlap,
    **options: Any,
) -> int:
    """Create or replace the schedule NAME; the task options make the template."""
    value, kwargs = _task_kwargs(payload, options)

    async def work(c: Client) -> int:
        await c.add_recurring(name, cron, value, tz=tz, overlap=overlap, **kwargs)
        settings.show({"name": name, "saved": True}, f"saved schedule {name}")
        return EXIT_OK

    return settings.call(work)


@recurring.command("list")
@_output_flags
@click.pass_obj
def recurring_list(settings: Settings) -> int:
    """List the schedules by name."""

    async def work(c: Client) -> int:
        schedules = await c.list_recurring()
        settings.show(schedules, recurring_table(schedules))
        return EXIT_OK

    return settings.call(work)


@click.command("rm")
@click.argument("name")
@_output_flags
@click.pass_obj
def recurring_rm(settings: Settings, name: str) -> int:
    """Remove the schedule NAME (alias: remove)."""

    async def work(c: Client) -> int:
        removed = await c.remove_recurring(name)
        text = f"removed schedule {name}" if removed else f"no schedule named {name}"
        settings.show({"name": name, "removed": removed}, text)
        return EXIT_OK

    return settings.call(work)


recurring.add_command(recurring_rm)
recurring.add_command(recurring_rm, "remove")


cli.add_command(worker)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code: every failure becomes one stderr line
    (with the traceback before it under `--debug`)."""
    settings = Settings()
    try:
        code = cli.main(args=argv, prog_name="cronoq", standalone_mode=False, obj=settings)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else "", err=True)
        return EXIT_USAGE
    except click.ClickException as e:
        ctx = e.ctx if isinstance(e, click.UsageError) else None
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        return _fail(settings, e, EXIT_USAGE, f"{e.format_message().rstrip('.')}{hint}")
    except Unreachable as e:
        return _fail(settings, e, EXIT_UNREACHABLE, f"unavailable: {e}")
    except ClientError as e:
        refused = e.code != "unavailable"
        return _fail(settings, e, EXIT_REFUSED if refused else EXIT_UNREACHABLE, str(e))
    except TimeoutError as e:
        return _fail(settings, e, EXIT_TIMEOUT, f"timeout: {e}")
    except (KeyboardInterrupt, click.Abort):
        return EXIT_INTERRUPTED
    return code if isinstance(code, int) else EXIT_OK


def _fail(settings: Settings, error: BaseException, code: int, line: str) -> int:
    if settings.debug:
        traceback.print_exception(error)
    click.echo(f"cronoq: error: {line}", err=True)
    return code
