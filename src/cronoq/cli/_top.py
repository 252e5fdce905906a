"""`cronoq top`: the server at a glance, redrawn every interval until `q` or Ctrl-C.

Theory of operation: a loop polls `Admin.Snapshot`; a background `Watch` of terminal events
keeps the last few failed and dead-lettered tasks. `render` is a pure function from those
values (the current and the previous snapshot, for rates, and the failures) to one rich
renderable, so a frame can be tested, or printed once with `--once`, without a live screen.
The renderable fits itself to the height it is given when it is drawn (the screen's): the
list of failures shows as many as there is room for, one line each.
Keys are read from the terminal in cbreak mode through the event loop's reader callbacks, so
waiting for a key never blocks the refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import time
import tty
from collections import deque
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cronoq.client import Client, ClientError, Event, PoolSnapshot, Snapshot

from ._render import labels_text, seconds

__all__ = ["FAILURES_KEPT", "FailureLog", "Sample", "render", "run_live", "run_once"]

FAILURES_KEPT = 8
_FAILED = frozenset({"failed", "dead_lettered"})
# The Totals shown in the header, in this order, with a rate each.
_TOTALS = (
    "submitted", "dispatched", "succeeded", "failed", "dead_lettered", "cancelled", "retries",
    "timeouts", "lease_expiries",
)  # fmt: skip
_T = TypeVar("_T")


@dataclass(frozen=True)
class Sample:
    """A snapshot and the monotonic time it was taken: two of them give rates."""

    snapshot: Snapshot
    at: float


@dataclass
class FailureLog:
    """The latest failed or dead-lettered tasks seen by top's watch, newest first; `error`
    says why the watch is not delivering (a metrics token may not watch, for example)."""

    events: deque[Event] = field(default_factory=lambda: deque(maxlen=FAILURES_KEPT))
    error: str = ""


def render(
    server: str,
    current: Sample,
    previous: Sample | None = None,
    failures: FailureLog | None = None,
    *,
    pools: Sequence[str] = (),
    state: str = "serving",
) -> RenderableType:
    """One frame: header and totals, pool tables (with the paused pools and those no worker
    serves), worker groups, failures, missing shards.

    `pools` limits the pool rows to those names. Rates need `previous`; without it (the first
    frame, or `--once`) they are left blank. `failures=None` leaves the section out.
    """
    snap = current.snapshot
    shown = [p for p in snap.pools if not pools or p.name in pools]
    head: list[RenderableType] = [
        Text.assemble(("cronoq top", "bold"), f"  {server}  ", (state, "bold")),
        Text(
            f"tasks: {snap.live_tasks} live, {snap.running} running, {snap.pending} pending"
            f"    workers: {snap.workers_connected} connected"
        ),
        _totals(current, previous),
    ]
    pools_section = Group(_pool_table(shown), *_pool_notes(shown))
    sections: list[RenderableType] = [pools_section, _window_table(shown)]
    groups = _groups_table(shown)
    if groups.row_count:
        sections.append(groups)
    after: list[RenderableType] = []
    if snap.unavailable_shards:
        missing = ", ".join(snap.unavailable_shards)
        after.append(Text(f"unavailable shards: {missing}", style="bold red"))
    return _Frame(head, sections, failures, after)


class _Frame:
    """A frame that fits the height it is drawn in (a full screen's; else the console's).

    The sections are separated by blank lines when the frame has room for them with a full
    list of failures, and follow each other without them otherwise (a 24-line terminal):
    whether they do depends on the screen and the pools, not on how many failures came, so
    the layout does not jump when one arrives. The list of failures then gets the lines left,
    one line per failure, newest first. What still does not fit (more pools than lines) is cut
    at the bottom of the screen."""

    def __init__(
        self,
        head: Sequence[RenderableType],
        sections: Sequence[RenderableType],
        failures: FailureLog | None,
        after: Sequence[RenderableType],
    ) -> None:
        self.head, self.sections, self.after = list(head), list(sections), list(after)
        self.failures = failures

    def _group(self, spaced: bool, failures: RenderableType | None) -> Group:
        middle = [*self.sections, *([] if failures is None else [failures]), *self.after]
        parts = list(self.head)
        for section in middle:
            parts += [Text(""), section] if spaced else [section]
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = options.height or options.max_height
        free = options.update(height=None)

        def lines(renderable: RenderableType) -> int:
            return len(console.render_lines(renderable, free, pad=False))

        log = self.failures
        if log is None:
            yield self._group(True, None)
            return
        full = lines(_failures_table([], 0)) + FAILURES_KEPT  # each failure takes one line
        spaced = lines(self._group(True, None)) + 1 + full <= height
        room = height - lines(self._group(spaced, None)) - (1 if spaced else 0)
        kept = list(log.events)
        section: RenderableType | None = _failures_line(log)
        if section is None:
            table = _failures_table(kept, len(kept))
            fit = len(kept) - max(0, lines(table) - room)
            if fit <= 0:
                section = Text(f"recent failures: {len(kept)}, no room to list them", style="dim")
            else:
                section = table if fit == len(kept) else _failures_table(kept[:fit], len(kept))
        yield self._group(spaced, section if room > 0 else None)


def _rate(name: str, current: Sample, previous: Sample | None) -> str:
    if previous is None or current.at <= previous.at:
        return ""
    now = getattr(current.snapshot.totals, name)
    before = getattr(previous.snapshot.totals, name)
    if now < before:  # a new leader started counting again
        return ""
    return f"{(now - before) / (current.at - previous.at):.1f}/s"


def _totals(current: Sample, previous: Sample | None) -> Table:
    per_row = 3
    grid = Table.grid(padding=(0, 1))
    for _ in range(per_row):
        grid.add_column()
        grid.add_column(justify="right")
        grid.add_column(justify="right", style="dim", min_width=8)
    cells: list[str] = []
    for name in _TOTALS:
        value = getattr(current.snapshot.totals, name)
        cells += [name.replace("_", " "), str(value), _rate(name, current, previous)]
    for start in range(0, len(cells), per_row * 3):
        grid.add_row(*cells[start : start + per_row * 3])
    return grid


def _table(title: str, *columns: str) -> Table:
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False
    )
    table.add_column("pool")
    for name in columns:
        table.add_column(name, justify="right")
    return table


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def _pool_table(pools: Sequence[PoolSnapshot]) -> Table:
    table = _table(
        "pools", "cap", "desired", "busy", "held", "util", "pending C/H/N/L", "resv", "workers"
    )
    for p in pools:
        table.add_row(
            Text(p.name),
            str(p.capacity),
            str(p.desired),
            str(p.busy),
            str(p.held),
            _percent(p.utilization),
            "/".join(str(n) for n in p.pending_by_class),
            str(p.reservations),
            str(p.workers_connected),
        )
    return table


def _pool_notes(pools: Sequence[PoolSnapshot]) -> list[Text]:
    """Lines under the pools table for the pools whose tasks wait for a person to act: the
    paused ones, and those with tasks pending and no capacity. Lines, not a column: the table
    already takes 80 columns, and a normal server shows none of them."""
    notes = []
    if paused := [p.name for p in pools if p.paused]:
        notes.append(Text(f"paused: {', '.join(paused)} (cronoq resume POOL)", style="bold"))
    for p in pools:
        if p.unserved:
            waiting = "1 task waits" if p.pending == 1 else f"{p.pending} tasks wait"
            line = f"pool {p.name}: no worker serves this pool; {waiting}"
            notes.append(Text(line, style="bold"))
    return notes


def _window_table(pools: Sequence[PoolSnapshot]) -> Table:
    table = _table(
        "metrics window", "disp", "ok", "errors", "wait p50/p90/p99", "adherence", "fixed hit",
        "cost",
    )  # fmt: skip
    for p in pools:
        waits = "/".join(seconds(w) for w in (p.wait_p50, p.wait_p90, p.wait_p99))
        table.add_row(
            Text(p.name),
            str(p.dispatched),
            str(p.succeeded),
            str(p.failed),  # attempts that ended without success, retried ones too: `errors`
            waits,
            _percent(p.priority_adherence),
            _percent(p.fixed_start_hit_rate),
            f"{p.cost:.1f}",
        )
    return table


def _groups_table(pools: Sequence[PoolSnapshot]) -> Table:
    table = _table("worker groups", "labels", "busy/capacity")
    table.columns[1].justify = "left"
    for p in pools:
        for g in p.groups:
            table.add_row(Text(p.name), Text(labels_text(g.labels)), f"{g.busy}/{g.capacity}")
    return table


def _failures_line(log: FailureLog) -> Text | None:
    """The failures section when it is one line: no list to show; None when there is one."""
    if log.error:
        return Text(f"recent failures: not available ({log.error})", style="dim")
    if not log.events:
        return Text("recent failures: none", style="dim")
    return None


def _failures_table(events: Sequence[Event], of: int) -> Table:
    """The newest failures, `events` out of the `of` kept: one line each, whatever the width."""
    title = "recent failures" if len(events) == of else f"recent failures ({len(events)} of {of})"
    table = _table(title, "id", "status", "at", "message")
    for column in table.columns[2:]:
        column.justify = "left"
    # No cell wraps: the message takes the room left and ends in an ellipsis, a long pool name
    # too. A message's line breaks (a traceback's) become spaces.
    table.expand = True
    for column in table.columns:
        column.no_wrap = True
        column.overflow = "ellipsis"
    table.columns[0].max_width = 20
    table.columns[-1].ratio = 1
    for e in events:
        at = time.strftime("%H:%M:%S", time.localtime(e.at))
        message = " ".join(e.message.split())
        table.add_row(Text(e.pool), str(e.id), e.status, at, Text(message))
    return table


async def run_once(client: Client, server: str, pools: Sequence[str], console: Console) -> None:
    """Print one frame (no rates, no failures) and return: `top --once`."""
    snap = await client.snapshot()
    console.print(render(server, Sample(snap, time.monotonic()), pools=pools))


async def run_live(
    client: Client, server: str, interval: float, pools: Sequence[str], console: Console
) -> None:
    """The full-screen view until `q` or Ctrl-C. A retryable error (the server is away or busy)
    is shown in the header while the last frame stays; any other error ends the view."""
    stop = asyncio.Event()
    failures = FailureLog()
    watcher = asyncio.create_task(_watch_failures(client, pools, failures, interval))
    previous: Sample | None = None
    current: Sample | None = None
    try:
        with _quit_keys(stop), Live(console=console, screen=True, auto_refresh=False) as view:
            while not stop.is_set():
                state = "serving"
                try:
                    snap = await _until(stop, client.snapshot())
                except ClientError as e:
                    if not e.retryable:
                        raise
                    state = f"{e} (retrying)"
                else:
                    if snap is None:
                        break
                    previous, current = current, Sample(snap, time.monotonic())
                if current is None:
                    view.update(Text(f"cronoq top  {server}  {state}"), refresh=True)
                else:
                    frame = render(server, current, previous, failures, pools=pools, state=state)
                    view.update(frame, refresh=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _until(stop: asyncio.Event, call: Awaitable[_T]) -> _T | None:
    """The call's result, or None as soon as `stop` is set: `q` must not wait for a slow
    server."""
    work = asyncio.ensure_future(call)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not work.done():
        work.cancel()
        return None
    return work.result()


async def _watch_failures(
    client: Client, pools: Sequence[str], log: FailureLog, retry_after: float
) -> None:
    """Feed `log` from a watch of terminal events; resubscribe when the server comes back."""
    while True:
        try:
            async for event in client.watch(list(pools) or None):
                log.error = ""
                if event.status in _FAILED:
                    log.events.appendleft(event)
        except ClientError as e:
            log.error = str(e)
            if not e.retryable:
                return
        await asyncio.sleep(retry_after)


@contextlib.contextmanager
def _quit_keys(stop: asyncio.Event) -> Iterator[None]:
    """Set `stop` on `q` (read from stdin in cbreak mode when it is a terminal) and on Ctrl-C,
    and put the terminal back afterwards whatever happens."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    if fd is not None:
        tty.setcbreak(fd)
        loop.add_reader(fd, _on_key, fd, stop)
    try:
        yield
    finally:
        if fd is not None and saved is not None:
            loop.remove_reader(fd)
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        loop.remove_signal_handler(signal.SIGINT)


def _on_key(fd: int, stop: asyncio.Event) -> None:
    if b"q" in os.read(fd, 64).lower():
        stop.set()
