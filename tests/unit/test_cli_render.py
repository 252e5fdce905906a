"""The `cronoq` command line without a server: parameter parsing, JSON and table rendering, and
frames of `cronoq top` built from hand-made snapshots."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console, RenderableType
from rich.screen import Screen

from cronoq.cli._params import parse_duration, parse_moment, parse_ref, parse_time
from cronoq.cli._render import (
    bulk_text,
    event_line,
    result_detail,
    seconds,
    task_detail,
    task_table,
    to_json,
)
from cronoq.cli._top import FAILURES_KEPT, FailureLog, Sample, render
from cronoq.client import (
    BulkResult,
    Event,
    PoolSnapshot,
    Result,
    Snapshot,
    TaskInfo,
    Totals,
    WorkerGroup,
)


def text(renderable: RenderableType, width: int = 100, height: int = 100) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, color_system=None, highlight=False)
    console.print(renderable)
    return out.getvalue()


@pytest.mark.parametrize(
    ("given", "seconds_"),
    [
        ("1.5", 1.5),
        ("0", 0.0),
        (".25", 0.25),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        (" 3s ", 3.0),
    ],
)
def test_durations(given: str, seconds_: float) -> None:
    assert parse_duration(given) == pytest.approx(seconds_)


@pytest.mark.parametrize("given", ["", "5x", "-1", "1e3", "inf", "nan", "1h30m", "ms", "1 s"])
def test_bad_durations_say_what_is_accepted(given: str) -> None:
    with pytest.raises(ValueError, match=r"bad duration .*\(500ms"):
        parse_duration(given)


def test_times_need_a_zone() -> None:
    assert parse_time("2030-01-02T09:00:00Z") == datetime(2030, 1, 2, 9, tzinfo=UTC)
    with pytest.raises(ValueError, match="zone offset"):
        parse_time("2030-01-02T09:00:00")
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time("tomorrow")
    assert parse_time("2262-04-11T00:00:00Z").year == 2262
    with pytest.raises(ValueError, match="the protocol carries times before 2262-04-11"):
        parse_time("2262-04-12T00:00:00Z")  # past a signed 64-bit count of nanoseconds


def test_moments_are_times_or_durations_back_from_now() -> None:
    assert parse_moment("2030-01-02T09:00:00Z") == datetime(2030, 1, 2, 9, tzinfo=UTC)
    before = datetime.now(UTC)
    ago = parse_moment("2h")
    after = datetime.now(UTC)
    assert before - timedelta(hours=2) <= ago <= after - timedelta(hours=2)
    assert ago.tzinfo is not None  # an aware time: the client sends it as it is
    for bad in ("yesterday", "2030-01-02T09:00:00", "-1h"):
        with pytest.raises(ValueError, match=r"RFC 3339 .* or a duration back from now"):
            parse_moment(bad)


def test_refs_are_ids_when_numeric() -> None:
    assert parse_ref("42") == 42
    assert parse_ref("nightly-42") == "nightly-42"
    with pytest.raises(ValueError):
        parse_ref("")


def test_short_durations() -> None:
    assert [seconds(v) for v in (0.0123, 12.34, 245, 7800)] == ["12ms", "12.3s", "4m05s", "2h10m"]


def test_json_output_is_text_or_base64() -> None:
    assert json.loads(to_json(Result(7, "succeeded", b"hi", "", True))) == {
        "id": 7,
        "status": "succeeded",
        "output": "hi",
        "message": "",
        "output_available": True,
        "output_encoding": "utf-8",
    }
    binary = json.loads(to_json(Result(7, "succeeded", b"\xff\x00")))
    assert (binary["output"], binary["output_encoding"]) == ("/wA=", "base64")
    none = json.loads(to_json(Result(8, "failed", None, "boom")))
    assert (none["output"], none["output_encoding"]) == (None, None)


def test_watch_json_is_one_line_per_event() -> None:
    event = Event(5, "default", "k", "succeeded", 1, 1.5, "")
    line = to_json(event, lines=True)
    assert "\n" not in line
    assert json.loads(line) == {
        "id": 5, "pool": "default", "key": "k", "status": "succeeded", "attempt": 1, "at": 1.5,
        "message": "",
    }  # fmt: skip
    assert "5  succeeded  pool=default  key=k  attempt=1" in event_line(event)


def test_tables_show_text_output_and_sizes_otherwise() -> None:
    assert "olleh" in text(result_detail(Result(1, "succeeded", b"olleh")))
    assert "2 bytes" in text(result_detail(Result(1, "succeeded", b"\xff\x00")))
    shown = text(task_table([TaskInfo(3, "ready", "default", "k3", "", 0, 3)]))
    assert shown.splitlines()[0].split() == [
        "id", "status", "pool", "key", "kind", "attempt", "worker", "created",
    ]  # fmt: skip
    assert shown.splitlines()[2].split()[:7] == ["3", "ready", "default", "k3", "-", "0/3", "-"]


def test_the_worker_of_the_latest_attempt_is_shown_by_name_and_id() -> None:
    ran = TaskInfo(4, "succeeded", "default", attempt=1, worker_name="echo", worker_id=7)
    nameless = replace(ran, worker_name="")
    idless = replace(ran, worker_id=0)  # known by name only (after a failover, say)
    rows = text(task_table([ran, nameless, idless])).splitlines()[2:]
    assert [row.split()[6] for row in rows] == ["echo#7", "#7", "echo"]
    lines = dict(line.split(None, 1) for line in text(task_detail(ran)).splitlines())
    assert lines["worker"] == "echo#7"
    assert json.loads(to_json(ran))["worker_name"] == "echo"


@pytest.mark.parametrize(
    ("action", "dry_run", "said"),
    [
        ("cancel", True, "12 tasks match; 10 would be cancelled"),
        ("cancel", False, "12 tasks match; 10 cancelled"),
        ("retry", True, "12 tasks match; 10 would be submitted again"),
        ("retry", False, "12 tasks match; 10 submitted again"),
        ("delete", True, "12 tasks match; 10 would be deleted from the history"),
        ("delete", False, "12 tasks match; 10 deleted from the history"),
    ],
)
def test_bulk_says_what_it_did_or_would_do(action: str, dry_run: bool, said: str) -> None:
    assert bulk_text(action, BulkResult(12, 10), dry_run=dry_run) == said
    assert bulk_text(action, BulkResult(1, 0), dry_run=dry_run).startswith("1 task matches; 0 ")


def pool(
    name: str, *, capacity: int = 4, busy: int = 1, groups: tuple[WorkerGroup, ...] = ()
) -> PoolSnapshot:
    return PoolSnapshot(
        name=name,
        capacity=capacity,
        busy=busy,
        held=0,
        desired=capacity + 2,
        pending_by_class=(1, 2, 3, 4),
        reservations=1,
        dispatched=40,
        succeeded=37,
        failed=3,
        priority_adherence=0.95,
        fixed_start_hit_rate=1.0,
        utilization=0.25,
        schedule_efficiency=0.9,
        wait_p50=0.012,
        wait_p90=0.2,
        wait_p99=1.5,
        cost=12.0,
        workers_connected=len(groups),
        groups=groups,
    )


def snapshot(submitted: int, succeeded: int, *, shards: tuple[str, ...] = ()) -> Snapshot:
    gpu = WorkerGroup({"gpu": "a100"}, 2, 1)
    return Snapshot(
        pools=(pool("default", groups=(gpu, WorkerGroup({}, 2, 0))), pool("batch", busy=0)),
        live_tasks=12,
        running=1,
        pending=10,
        totals=Totals(submitted=submitted, dispatched=40, succeeded=succeeded, failed=3),
        workers_connected=2,
        unavailable_shards=shards,
    )


def test_a_top_frame_shows_header_pools_groups_and_totals() -> None:
    frame = text(render("http://cq:7070", Sample(snapshot(100, 37), 10.0)))
    assert "cronoq top  http://cq:7070  serving" in frame
    assert "tasks: 12 live, 1 running, 10 pending    workers: 2 connected" in frame
    rows: dict[str, list[str]] = {}
    for line in frame.splitlines():  # the first row of each name: the pools table
        if line.strip():
            rows.setdefault(line.split()[0], line.split())
    assert rows["default"][:9] == ["default", "4", "6", "1", "0", "25%", "1/2/3/4", "1", "2"]
    assert rows["batch"][:6] == ["batch", "4", "6", "0", "0", "25%"]
    assert "12ms/200ms/1.5s" in frame and "95%" in frame and "12.0" in frame
    assert "gpu=a100" in frame and "1/2" in frame
    assert rows["submitted"][:2] == ["submitted", "100"]
    assert "/s" not in frame  # no rates from a single snapshot
    assert "recent failures" not in frame and "unavailable shards" not in frame


def test_rates_come_from_the_previous_snapshot() -> None:
    before, after = Sample(snapshot(100, 30), 10.0), Sample(snapshot(120, 35), 12.0)
    frame = text(render("cq", after, before))
    assert "10.0/s" in frame  # submitted: 20 in 2 s
    assert "2.5/s" in frame  # succeeded: 5 in 2 s
    restarted = text(render("cq", Sample(snapshot(5, 1), 14.0), after))
    assert "/s" not in restarted.replace("0.0/s", "")  # counters went back: no negative rate


def test_pool_filter_failures_and_missing_shards() -> None:
    log = FailureLog()
    log.events.appendleft(Event(41, "default", "", "dead_lettered", 3, 0.0, "boom: disk full"))
    frame = text(
        render("cq", Sample(snapshot(1, 1, shards=("gpu",)), 1.0), failures=log, pools=["batch"])
    )
    rows = [line.split()[0] for line in frame.splitlines() if line.strip()]
    assert "batch" in rows and "gpu=a100" not in frame
    assert "recent failures" in frame and "dead_lettered" in frame and "boom: disk full" in frame
    assert "unavailable shards: gpu" in frame
    assert "none" in text(render("cq", Sample(snapshot(1, 1), 1.0), failures=FailureLog()))
    denied = FailureLog(error="permission_denied: metrics token")
    assert "not available (permission_denied" in text(
        render("cq", Sample(snapshot(1, 1), 1.0), failures=denied)
    )


def test_top_marks_paused_pools_and_those_no_worker_serves() -> None:
    paused = replace(pool("default"), paused=True)
    unserved = replace(pool("batch", capacity=0, busy=0), unserved=True)
    both = replace(pool("night", capacity=0, busy=0), paused=True, unserved=True)
    snap = replace(snapshot(1, 1), pools=(paused, unserved, both, pool("plain")))
    lines = text(render("cq", Sample(snap, 1.0)), width=80).splitlines()
    top = lines.index(next(x for x in lines if x.startswith("pools")))
    window = lines.index(next(x for x in lines if x.startswith("metrics window")))
    below = [line.rstrip() for line in lines[top + 7 : window] if line.strip()]
    assert below == [
        "paused: default, night (cronoq resume POOL)",
        "pool batch: no worker serves this pool; 10 tasks wait",
        "pool night: no worker serves this pool; 10 tasks wait",
    ]
    assert max(len(line) for line in lines) <= 80
    only = text(render("cq", Sample(snap, 1.0), pools=["batch"]))
    assert "paused:" not in only and "pool batch: no worker serves this pool" in only
    plain = text(render("cq", Sample(snapshot(1, 1), 1.0)))
    assert "paused:" not in plain and "no worker serves" not in plain


def test_a_frame_fits_eighty_columns() -> None:
    frame = text(render("cq", Sample(snapshot(1, 1), 1.0), failures=FailureLog()), width=80)
    assert "pending C/H/N/L" in frame  # the widest header is not wrapped


def many_failures() -> FailureLog:
    """A full list of failures whose messages are long, and of several lines."""
    log = FailureLog()
    for n in range(FAILURES_KEPT + 3):  # the oldest fall off the list
        message = f"RuntimeError: failure {n}\n  " + "while talking to the backend " * 8
        status = "dead_lettered" if n % 2 else "failed"
        log.events.appendleft(Event(100 + n, "default", "", status, 3, 1_700_000_000.0, message))
    return log


def screen(renderable: RenderableType, width: int, height: int) -> list[str]:
    """What a full screen of width x height shows (rich's Screen: what `Live(screen=True)`
    draws), and the same frame printed to a console of that size: they must agree."""
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, color_system=None)
    console.print(Screen(renderable))
    printed = text(renderable, width=width, height=height).splitlines()
    shown = [line.rstrip() for line in out.getvalue().splitlines()]
    assert [line.rstrip() for line in printed] == shown[: len(printed)]
    assert all(not line for line in shown[len(printed) :])  # the rest of the screen is blank
    return printed


@pytest.mark.parametrize(
    ("pools", "shown"),
    [(("batch",), FAILURES_KEPT), (("default",), 3), ((), 1)],
    ids=["one-pool", "one-pool-two-groups", "two-pools-two-groups"],
)
def test_top_fits_80x24_with_as_many_failures_as_there_is_room_for(
    pools: tuple[str, ...], shown: int
) -> None:
    frame = render("cq", Sample(snapshot(100, 37), 10.0), failures=many_failures(), pools=pools)
    lines = screen(frame, 80, 24)
    assert len(lines) == 24 and max(len(line) for line in lines) <= 80
    titles = [line.split()[0] for line in lines if line.strip()]
    assert titles[:2] == ["cronoq", "tasks:"]  # the head and every section, in order
    assert [t for t in titles if t in ("pools", "metrics", "recent")] == [
        "pools", "metrics", "recent",
    ]  # fmt: skip
    first = next(i for i, line in enumerate(lines) if line.startswith("recent failures"))
    title = "recent failures" if shown == FAILURES_KEPT else f"recent failures ({shown} of 8)"
    assert lines[first].rstrip() == title
    assert lines[first + 1].split() == ["pool", "id", "status", "at", "message"]
    rows = lines[first + 3 :]
    assert len(rows) == shown  # one line per failure, the newest first, down to the last line
    assert [row.split()[1] for row in rows] == [str(110 - n) for n in range(shown)]
    for n, row in enumerate(rows):
        assert row.rstrip().endswith("…") and f"RuntimeError: failure {10 - n} while" in row


def test_a_tall_screen_lists_every_failure_with_blank_lines_between_sections() -> None:
    frame = render("cq", Sample(snapshot(100, 37), 10.0), failures=many_failures())
    lines = screen(frame, 100, 60)
    assert len(lines) < 60
    first = lines.index(next(line for line in lines if line.startswith("recent failures")))
    assert lines[first].rstrip() == "recent failures" and lines[first - 1].strip() == ""
    assert len(lines[first + 3 :]) == FAILURES_KEPT
    assert "" in [line.strip() for line in lines[:first]]  # blank lines between the sections


def test_the_window_counts_attempts_as_errors_not_failed_tasks() -> None:
    frame = text(render("cq", Sample(snapshot(1, 1), 1.0)), width=80)
    lines = frame.splitlines()
    header = lines[lines.index(next(x for x in lines if x.startswith("metrics window"))) + 1]
    assert header.split()[:4] == ["pool", "disp", "ok", "errors"]
    assert "failed" not in header
