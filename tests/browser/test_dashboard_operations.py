"""The dashboard's operational controls in headless Chromium against a real cronoq-server
(its history sampled every STEP_S, dash_server_child.py) and a real remote worker
(dash_worker_child.py) serving the pool "default"; the pool "batch" has no worker. Each
control is checked against what the HTTP API answers: sorting, every search field, bulk
cancel, retry and delete with the dry run's count, pause and resume, the no-worker warning,
the charts of the server's history and the worker of each attempt."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dash_support import SHOTS, Api, until
from playwright.sync_api import Page, Route, expect

from helpers.servers import PORT0, LoggedProcess, write

STEP_S = 0.5
CONFIG = (
    PORT0
    + '[[pools]]\nname = "default"\nmax = 8\nautoscale = false\n'
    + '[[pools]]\nname = "batch"\nmax = 4\nautoscale = false\n'
)
HERE = Path(__file__).parent
RETRY = {"max_attempts": 2, "initial_backoff_s": 0.01, "jitter": False}


def search(api: Api, **body: Any) -> dict[str, Any]:
    answer: dict[str, Any] = api("POST", "/v1/tasks/search", body)
    return answer


def ids_of(api: Api, **body: Any) -> list[str]:
    return [t["id"] for t in search(api, **body)["tasks"]]


def settled(api: Api) -> None:
    """Wait until no task of the pool "default" is live and the worker holds no lease."""
    live = ["blocked", "scheduled", "ready", "running", "retrying"]

    def still() -> bool:
        busy = any(w["busy"] for w in api("GET", "/v1/workers")["workers"])
        return not busy and not ids_of(api, filter={"pools": ["default"], "statuses": live})

    until(still, "the pool 'default' to settle")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    config = write(tmp_path_factory.mktemp("dash-ops"), CONFIG)
    server = LoggedProcess(
        [sys.executable, str(HERE / "dash_server_child.py"), str(STEP_S), "-c", config]
    )
    worker = None
    try:
        grpc = server.wait_for(r"event=listening grpc=(\S+)").group(1)
        http = server.wait_for(r"event=listening http=(\S+)").group(1)
        server.wait_for("event=ready")
        worker = subprocess.Popen(
            [sys.executable, str(HERE / "dash_worker_child.py"), grpc],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert worker.stdout is not None and worker.stdout.readline() == "registered\n"
        api = Api(http)
        for n, (do, kind, team) in enumerate(
            [("ok", "mail", "red"), ("fail", "mail", "blue"), ("flaky", "report", "red"),
             ("boom", "report", "blue"), ("ok", "invoice", "red"), ("fail", "invoice", "red")]
        ):  # fmt: skip
            body = {"payload": {"do": do}, "kind": kind, "key": f"order-{n}", "retry": RETRY}
            api("POST", "/v1/tasks", {**body, "tags": {"team": team}})
        api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "nightly", "key": "cron-1"})
        settled(api)
        yield api
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        server.kill()


def listed(page: Page) -> Any:
    return expect(page.locator('td[data-label="id"]'))


def test_sorting_by_a_column_is_kept_in_the_hash(api: Api, page: Page) -> None:
    """Newest first by default; a header sorts by its column, descending, then ascending on a
    second click; the order is the search's, and the header says which way it sorts."""
    page.goto(api.url("#/tasks"))
    listed(page).to_have_text(ids_of(api))
    expect(page.locator('th[aria-sort="descending"]')).to_have_text("id \u25bc")
    page.locator('a[data-sort="kind"]').click()
    expect(page).to_have_url(api.url("#/tasks?sort=kind&dir=desc"))
    listed(page).to_have_text(ids_of(api, sort="kind", ascending=False))
    expect(page.locator('th[aria-sort="descending"]')).to_have_text("kind \u25bc")
    kinds = page.locator('td[data-label="kind"]').all_inner_texts()
    assert kinds == sorted(kinds, reverse=True)
    page.locator('a[data-sort="kind"]').click()
    expect(page).to_have_url(api.url("#/tasks?sort=kind&dir=asc"))
    listed(page).to_have_text(ids_of(api, sort="kind", ascending=True))
    expect(page.locator('th[aria-sort="ascending"]')).to_have_text("kind \u25b2")
    for key in ("status", "attempt", "finished"):
        page.locator(f'a[data-sort="{key}"]').click()
        listed(page).to_have_text(ids_of(api, sort=key, ascending=False))
    page.reload()  # the hash keeps the order
    listed(page).to_have_text(ids_of(api, sort="finished", ascending=False))


@pytest.mark.parametrize(
    ("fill", "hash_", "filter_"),
    [
        ({"key": "order-3"}, "key=order-3", {"key": "order-3"}),
        ({"prefix": "order-"}, "prefix=order-", {"key_prefix": "order-"}),
        ({"tag": "team=red"}, "tag=team%3Dred", {"tags": {"team": "red"}}),
        ({"kind": "report, invoice"}, "kind=report%2C+invoice", {"kinds": ["report", "invoice"]}),
        ({"status": "failed"}, "status=failed", {"statuses": ["failed"]}),
        ({"pool": "default", "prefix": "cron"}, "prefix=cron&pool=default",
         {"pools": ["default"], "key_prefix": "cron"}),
    ],
)  # fmt: skip
def test_each_search_field(
    api: Api, page: Page, fill: dict[str, str], hash_: str, filter_: dict[str, Any]
) -> None:
    """A field filled and searched: the hash holds it, and the rows and the total are what the
    search API answers for the same filter."""
    expected = search(api, filter=filter_)
    assert 0 < expected["total"] < search(api)["total"]
    page.goto(api.url("#/tasks"))
    for name, value in fill.items():
        field = page.locator(f"#f-{name}")
        if name == "status":
            field.select_option(value)
        else:
            field.fill(value)
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(api.url(f"#/tasks?{hash_}"))
    listed(page).to_have_text([t["id"] for t in expected["tasks"]])
    expect(page.locator("#total")).to_have_attribute("data-total", str(expected["total"]))
    for name, value in fill.items():
        expect(page.locator(f"#f-{name}")).to_have_value(value)


def test_search_by_submission_time(api: Api, page: Page) -> None:
    """From and before (local times, to the second) bound when the tasks were submitted."""
    first = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "early"})
    settled(api)
    created = int(api("GET", f"/v1/tasks/{first['id']}")["created_unix_ns"]) / 1e9
    # the next whole second: tasks submitted from then on are "late"
    cut = int(created) + 1
    until(lambda: time.time() > cut, "the clock to pass the cut")
    late = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "late"})["id"]
    settled(api)
    local = page.evaluate(
        "t => { const d = new Date(t * 1000); d.setMinutes(d.getMinutes() - d.getTimezoneOffset());"
        " return d.toISOString().slice(0, 19); }",
        cut,
    )
    page.goto(api.url("#/tasks?kind=early,late"))
    listed(page).to_have_text([late, first["id"]])
    page.locator("#f-from").fill(local)
    page.get_by_role("button", name="Search").click()
    listed(page).to_have_text([late])
    assert ids_of(api, filter={"kinds": ["early", "late"], "submitted_after": cut}) == [late]
    page.locator("#f-from").fill("")
    page.locator("#f-to").fill(local)
    page.get_by_role("button", name="Search").click()
    listed(page).to_have_text([first["id"]])


def _confirm(page: Page, count: int, button: str) -> None:
    dialog = page.get_by_role("dialog")
    expect(dialog.locator("#dlg-count")).to_have_text(str(count))
    dialog.get_by_role("button", name=button).click()
    expect(page.locator("dialog")).to_have_count(0)


def test_bulk_cancel_of_the_selected_rows(api: Api, page: Page) -> None:
    """Rows checked one by one: the dry run counts the tasks that have not ended (not the one
    that has), Back changes nothing, the confirmed action cancels exactly those."""
    waiting = [
        api("POST", "/v1/tasks", {"payload": {}, "pool": "batch", "kind": "cancel-me"})["id"]
        for _ in range(3)
    ]
    done = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "cancel-me"})["id"]
    settled(api)
    page.goto(api.url("#/tasks?kind=cancel-me"))
    listed(page).to_have_text([done, *reversed(waiting)])
    for task in (done, waiting[0], waiting[2]):
        page.get_by_label(f"select task {task}").check()
    expect(page.locator("#picked")).to_have_text("3 selected")
    page.screenshot(path=str(SHOTS / "tasks-selected.png"))
    page.get_by_role("button", name="Cancel...").click()
    expect(page.get_by_role("dialog")).to_contain_text("2 of the 3 selected tasks have not ended")
    page.get_by_role("dialog").get_by_role("button", name="Back").click()
    assert api("GET", f"/v1/tasks/{waiting[0]}")["status"] == "ready"
    page.get_by_role("button", name="Cancel...").click()
    page.screenshot(path=str(SHOTS / "bulk-confirm.png"))
    _confirm(page, 2, "Cancel: 2 tasks")
    expect(page.locator("p.notice")).to_have_text("Cancelled: 2 of 3 tasks.")
    statuses = {t: api("GET", f"/v1/tasks/{t}")["status"] for t in waiting}
    assert statuses == {waiting[0]: "cancelled", waiting[1]: "ready", waiting[2]: "cancelled"}
    expect(page.locator("#picked")).to_have_text("0 selected")
    expect(page.locator(f'tr[data-id="{waiting[0]}"] td[data-label="status"]')).to_have_text(
        "cancelled"
    )


def test_bulk_retry_of_every_match_across_pages(api: Api, page: Page) -> None:
    """This page checked, then every match of the filter (more than a page): the retry
    submits a copy of each failed task, and the copies run."""
    failed = ids_of(
        api,
        filter={"statuses": ["failed", "dead_lettered"], "kinds": ["mail", "report", "invoice"]},
    )
    assert len(failed) >= 3
    page.goto(api.url("#/tasks?status=failed,dead_lettered&kind=mail,report,invoice&limit=2"))
    listed(page).to_have_text(failed[:2])
    page.locator("#pick-page").check()
    expect(page.locator("#picked")).to_have_text("2 selected")
    page.get_by_role("button", name=f"Select all {len(failed)} matching").click()
    expect(page.locator("#picked")).to_have_text(f"all {len(failed)} matching tasks selected")
    page.get_by_role("link", name="Next").click()
    expect(page.get_by_label(f"select task {failed[2]}")).to_be_checked()
    before = search(api)["total"]
    page.get_by_role("button", name="Retry...").click()
    _confirm(page, len(failed), f"Retry: {len(failed)} tasks")
    expect(page.locator("p.notice")).to_have_text(
        f"Submitted again: {len(failed)} of {len(failed)} tasks."
    )
    assert search(api)["total"] == before + len(failed)
    copies = search(api, limit=len(failed))["tasks"]
    assert sorted(t["kind"] for t in copies) == sorted(
        api("GET", f"/v1/tasks/{task}")["kind"] for task in failed
    )
    assert all("key" not in t for t in copies)
    settled(api)


def test_bulk_delete_from_history(api: Api, page: Page) -> None:
    """Every ended task of a filter is forgotten; the live one is not (it is not counted)."""
    gone = [
        api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "scratch"})["id"]
        for _ in range(2)
    ]
    live = api("POST", "/v1/tasks", {"payload": {}, "pool": "batch", "kind": "scratch"})["id"]
    settled(api)
    page.goto(api.url("#/tasks?kind=scratch"))
    listed(page).to_have_text([live, *reversed(gone)])
    page.locator("#pick-page").check()
    page.get_by_role("button", name="Delete from history...").click()
    expect(page.get_by_role("dialog")).to_contain_text("2 of the 3 selected tasks have ended")
    _confirm(page, 2, "Delete from history: 2 tasks")
    expect(page.locator("p.notice")).to_have_text("Deleted from history: 2 of 3 tasks.")
    listed(page).to_have_text([live])
    assert ids_of(api, filter={"kinds": ["scratch"]}) == [live]
    page.screenshot(path=str(SHOTS / "tasks-search.png"))


def test_pause_holds_new_tasks_until_resume(api: Api, page: Page) -> None:
    """Pause (confirmed) shows the badge; a task submitted meanwhile waits, for at least one
    whole step of the server's history, with the worker idle; Resume lets it run."""
    settled(api)
    page.goto(api.url("#/overview"))
    card = page.locator('article.pool[data-pool="default"]')
    card.get_by_role("button", name="Pause pool default").click()
    page.get_by_role("dialog").get_by_role("button", name="Pause").click()
    expect(page.locator("p.notice")).to_have_text("Paused pool default.")
    expect(card.locator('[data-badge="paused"]')).to_have_text("paused")
    assert api("GET", "/v1/snapshot")["pools"][0]["paused"]
    held = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "held"})
    submitted = int(api("GET", f"/v1/tasks/{held['id']}")["created_unix_ns"]) / 1e9

    def sampled_after() -> list[dict[str, Any]]:
        points = api("GET", f"/ui/api/history?pool=default&since={submitted}")["pools"]
        return points.get("default", [])

    later = until(lambda: len(sampled_after()) >= 2 and sampled_after(), "two steps sampled")
    assert all(p["paused"] and p["pending"] == 1 and p["started"] == 0 for p in later)
    assert api("GET", f"/v1/tasks/{held['id']}")["status"] == "ready"
    page.goto(api.url(f"#/tasks/{held['id']}"))
    expect(page.locator('[data-warning="paused"]')).to_have_text(
        "pool default is paused: nothing new starts in it until it is resumed"
    )
    page.goto(api.url("#/overview"))
    card.get_by_role("button", name="Resume pool default").click()
    page.get_by_role("dialog").get_by_role("button", name="Resume").click()
    expect(page.locator("p.notice")).to_have_text("Resumed pool default.")
    expect(card.locator('[data-badge="paused"]')).to_have_count(0)
    until(lambda: api("GET", f"/v1/tasks/{held['id']}")["status"] == "succeeded", "the held task")


def test_no_worker_warning(api: Api, page: Page) -> None:
    """The pool without a worker says so, with its waiting tasks, on the overview and on the
    page of a task waiting in it; the served pool does not."""
    api("POST", "/v1/tasks", {"payload": {}, "pool": "batch", "kind": "unserved"})
    waiting = search(api, filter={"pools": ["batch"], "statuses": ["ready"]})["total"]
    page.goto(api.url("#/overview"))
    warning = page.locator('article.pool[data-pool="batch"] [data-warning="unserved"]')
    expect(warning).to_have_text(
        f"no worker serves this pool: {waiting} {'task' if waiting == 1 else 'tasks'} waiting"
    )
    expect(page.locator('article.pool[data-pool="default"] [data-warning]')).to_have_count(0)
    task = ids_of(api, filter={"pools": ["batch"], "statuses": ["ready"]})[0]
    page.goto(api.url(f"#/tasks/{task}"))
    expect(page.locator('[data-warning="unserved"]')).to_have_text(
        f"no worker serves this pool: {waiting} {'task' if waiting == 1 else 'tasks'} waiting"
    )


def test_charts_draw_the_servers_history(api: Api, page: Page) -> None:
    """Four charts per pool from /ui/api/history as soon as the page opens: labelled value and
    time axes, and a line through the points of each series."""
    until(
        lambda: len(api("GET", "/ui/api/history?pool=default")["pools"]["default"]) >= 4, "points"
    )
    page.goto(api.url("#/overview"))
    for pool in ("default", "batch"):
        charts = page.locator(f'article.pool-charts[data-pool="{pool}"] svg.chart')
        expect(charts).to_have_count(4)
        for n in range(4):
            chart = charts.nth(n)
            expect(chart.locator("text.tick.y").first).to_have_text("0")
            expect(chart.locator("text.tick.x").first).to_have_text(
                re.compile(r"^\d\d:\d\d(:\d\d)?$")
            )
    queue = page.locator('article.pool-charts[data-pool="default"] svg[data-chart="queue"]')
    capacity = queue.locator('path[data-line="capacity"]').get_attribute("d")
    assert capacity is not None and capacity.startswith("M") and capacity.count(",") >= 4
    throughput = page.locator(
        'article.pool-charts[data-pool="default"] svg[data-chart="throughput"]'
    )
    started = throughput.locator('path[data-line="started"]').get_attribute("d")
    assert started is not None and started.count(",") >= 4
    page.screenshot(path=str(SHOTS / "overview-charts.png"), full_page=True)


def test_chart_gaps_values_and_times(api: Api, page: Page) -> None:
    """From a known history: a missing step and a step without a value break the line (a lone
    point is a dot); counts per step are drawn per second; the axes' labels follow."""
    now = 1_800_000_000.0
    step = 10.0

    def point(t: float, started: int, p50: float | None) -> dict[str, Any]:
        zero = {
            k: 0
            for k in (
                "succeeded",
                "failed",
                "dead_lettered",
                "pending",
                "busy",
                "capacity",
                "workers",
            )
        }
        return {
            **zero,
            "t": t,
            "started": started,
            "paused": False,
            "wait_p50": p50,
            "wait_p90": p50,
            "wait_p99": p50,
        }

    # 30 minutes of steps, the step at -600 s missing; no start (no wait) at -300, -20 and 0 s
    times = [now - 1800 + step * i for i in range(181) if now - 1800 + step * i != now - 600]
    waitless = (now - 300, now - 20, now)
    points = [point(t, 40 if t == now else 20, None if t in waitless else 0.25) for t in times]
    body = json.dumps({"step": step, "now": now, "pools": {"fake": points}})

    def fulfil(route: Route) -> None:
        route.fulfill(status=200, content_type="application/json", body=body)

    page.route("**/ui/api/history*", fulfil)
    page.goto(api.url("#/overview"))
    charts = page.locator('article.pool-charts[data-pool="fake"]')
    started = charts.locator('svg[data-chart="throughput"] path[data-line="started"]')
    expect(started).to_have_attribute("d", re.compile(r"^M[^M]+ M[^M]+$"))  # one gap: two runs
    d = started.get_attribute("d") or ""
    assert d.count(",") == len(points)
    # 40 per 10 s step is 4/s at most: the axis goes to 5, halfway is 2.5
    throughput = charts.locator('svg[data-chart="throughput"] text.tick.y')
    expect(throughput).to_have_text(["0", "2.5", "5"])
    latency = charts.locator('svg[data-chart="latency"] path[data-line="wait_p50"]')
    runs = (latency.get_attribute("d") or "").split("M")[1:]
    assert len(runs) == 3  # broken by the missing step and the two steps without a wait
    lone = charts.locator('svg[data-chart="latency"] circle.dot[data-line="wait_p50"]')
    expect(lone).to_have_count(1)  # the point at -10 s, between two steps without a wait
    end = float(runs[-1].split()[-1].lstrip("L").split(",")[0])  # the last run ends at -30 s
    assert float(lone.get_attribute("cx") or 0) > end
    times_shown = charts.locator('svg[data-chart="queue"] text.tick.x')
    labels = page.evaluate(
        "ts => ts.map(t => new Date(t * 1000).toLocaleTimeString("
        "[], {hour: '2-digit', minute: '2-digit', hourCycle: 'h23'}))",
        [now - 1800 + 600 * i for i in range(4)],
    )
    expect(times_shown).to_have_text(labels)
