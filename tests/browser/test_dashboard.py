"""Every view of the dashboard in headless Chromium against a real cronoq-server with real
traffic (docs/dashboard.md): tasks submitted over HTTP and gRPC, run by a real remote worker
process (dash_worker_child.py) so that some succeed, fail, retry or are dead-lettered, and
recurring schedules. What the page shows is compared with what the API answers at the same
quiescent moment."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dash_support import SHOTS, Api, until
from playwright.sync_api import Browser, Page, expect

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.servers import PORT0, serving_process

CONFIG = (
    PORT0
    + '[[pools]]\nname = "default"\nmax = 8\nautoscale = false\n'
    + '[[pools]]\nname = "batch"\nmax = 4\nautoscale = false\n'
)
WORKER = Path(__file__).with_name("dash_worker_child.py")
# Two attempts, retried at once: a "boom" task is dead-lettered within a few milliseconds.
RETRY = {"max_attempts": 2, "initial_backoff_s": 0.01, "jitter": False}
LIVE = "blocked,scheduled,ready,running,retrying"


@dataclass
class Traffic:
    api: Api
    ids: dict[str, str]  # the tasks submitted at the start: "ok", "fail", "flaky", "boom", ...
    soon: str  # the task the recurring schedule "soon" started


def quiet(api: Api) -> dict[str, object]:
    """Wait until nothing moves (no live task but those of the worker-less pool "batch", the
    worker holds no lease) and answer the snapshot of that moment."""

    def still() -> dict[str, object] | None:
        live = api("GET", f"/v1/tasks?pool=default&status={LIVE}")["tasks"]
        busy = any(w["busy"] for w in api("GET", "/v1/workers")["workers"])
        snap: dict[str, object] = api("GET", "/v1/snapshot")
        return None if live or busy or snap["running"] else snap

    snap: dict[str, object] = until(still, "the server to be quiescent")
    return snap


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    with serving_process(tmp_path_factory.mktemp("dash"), CONFIG) as s:
        api = Api(s.http_address)
        nightly = {"payload": {"do": "ok"}, "kind": "nightly"}
        berlin = {"name": "nightly", "cron": "0 30 2 * * *", "tz": "Europe/Berlin"}
        api("POST", "/v1/recurring", {**berlin, "template": nightly})
        # Daily, a few seconds from now: it runs once while the worker starts, then stays quiet.
        at = time.gmtime(time.time() + 4)
        cron = f"{at.tm_sec} {at.tm_min} {at.tm_hour} * * *"
        tick = {"payload": {"do": "ok"}, "kind": "tick"}
        api("POST", "/v1/recurring", {"name": "soon", "cron": cron, "template": tick})
        worker = subprocess.Popen(
            [sys.executable, str(WORKER), s.address], stdout=subprocess.PIPE, text=True
        )
        try:
            assert worker.stdout is not None and worker.stdout.readline() == "registered\n"
            ids = {}
            for do in ("ok", "fail", "flaky", "boom"):
                body = {"payload": {"do": do}, "kind": "mail", "key": f"k-{do}", "retry": RETRY}
                ids[do] = api("POST", "/v1/tasks", body)["id"]
            spec = pb.TaskSpec(payload=b'{"do": "ok"}', kind="grpc", key="k-grpc")
            reply = cronoq_pb2_grpc.TasksStub(s.channel).Submit(pb.SubmitRequest(task=spec))
            ids["grpc"] = str(reply.id)
            batch = [{"payload": {"do": "ok"}, "kind": "report", "pool": "batch"}] * 2
            ids["batch"] = api("POST", "/v1/tasks:batch", {"tasks": batch})["tasks"][0]["id"]

            def ran() -> str | None:
                for r in api("GET", "/v1/recurring")["schedules"]:
                    if r["name"] == "soon" and "last_task_id" in r:
                        return str(r["last_task_id"])
                return None

            soon = until(ran, "the schedule 'soon' to run")
            until(lambda: api("GET", f"/v1/tasks/{soon}")["status"] == "succeeded", "its task")
            quiet(api)
            yield Traffic(api, ids, soon)
        finally:
            worker.terminate()
            worker.wait(30)


def test_overview_equals_the_snapshot(traffic: Traffic, page: Page) -> None:
    """Totals, the summary and each pool's figures are the snapshot's of that quiet moment."""
    snap = quiet(traffic.api)
    page.goto(traffic.api.url("#/overview"))
    totals = snap["totals"]
    assert isinstance(totals, dict) and totals["dead_lettered"] and totals["retries"]
    for name, value in totals.items():
        expect(page.locator(f'[data-total="{name}"]')).to_have_text(str(value))
    for name in ("live_tasks", "running", "pending", "workers_connected"):
        expect(page.locator(f'[data-summary="{name}"]')).to_have_text(str(snap[name]))
    pools = snap["pools"]
    assert isinstance(pools, list)
    expect(page.locator("article.pool")).to_have_count(len(pools))
    for p in pools:
        card = page.locator(f'article.pool[data-pool="{p["name"]}"]')
        for field in ("capacity", "busy", "desired", "held"):
            expect(card.locator(f'[data-field="{field}"]')).to_have_text(str(p[field]))
        expect(card.locator('[data-field="workers"]')).to_have_text(str(p["workers_connected"]))
        c = p["pending_by_class"]
        expect(card.locator('[data-field="pending"]')).to_have_text(
            f"{p['pending']} (critical {c[0]}, high {c[1]}, normal {c[2]}, low {c[3]})"
        )
    page.screenshot(path=str(SHOTS / "overview.png"), full_page=True)


def test_tasks_filters_find_and_pages(traffic: Traffic, page: Page) -> None:
    """Pool, status and kind list what the search answers, newest first; find by id and by
    key open the task; small pages go Next to the last one (no Next there), then Previous
    back."""
    api, ids = traffic.api, traffic.ids
    quiet(api)

    def listed(**f: object) -> list[str]:
        return [t["id"] for t in api("POST", "/v1/tasks/search", {"filter": f})["tasks"]]

    page.goto(api.url("#/tasks?pool=batch"))
    expect(page.locator('td[data-label="id"]')).to_have_text(listed(pools=["batch"]))
    page.goto(api.url("#/tasks"))
    page.locator("#f-status").select_option("dead_lettered")
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(api.url("#/tasks?status=dead_lettered"))
    dead = listed(statuses=["dead_lettered"])
    expect(page.locator('td[data-label="id"]')).to_have_text(dead)
    assert ids["boom"] in dead
    page.locator("#f-status").select_option("")
    page.locator("#f-kind").fill("tick")
    page.get_by_role("button", name="Search").click()
    expect(page.locator('td[data-label="id"]')).to_have_text([traffic.soon])
    expect(page.locator('td[data-label="kind"]')).to_have_text(["tick"])
    expect(page.locator('td[data-label="worker"]')).to_have_text([re.compile("^dash-worker")])
    page.screenshot(path=str(SHOTS / "tasks.png"), full_page=True)

    page.locator("#f-find").fill(ids["flaky"])
    page.get_by_role("button", name="Find").click()
    expect(page.get_by_role("heading", name=f"Task {ids['flaky']}")).to_be_visible()
    page.goto(api.url("#/tasks"))
    page.locator("#f-by").select_option("key")
    page.locator("#f-find").fill("k-grpc")
    page.get_by_role("button", name="Find").click()
    expect(page).to_have_url(api.url(f"#/tasks/{ids['grpc']}"))
    expect(page.locator('[data-field="status"]')).to_have_text("succeeded")
    page.goto(api.url("#/tasks"))
    page.locator("#f-find").fill("999999")
    page.get_by_role("button", name="Find").click()
    expect(page.locator("p.error")).to_have_text("unknown task")

    every = listed()
    assert every == sorted(every, key=int, reverse=True)  # newest first
    pages = [every[i : i + 2] for i in range(0, len(every), 2)]
    assert len(pages) >= 3
    page.goto(api.url("#/tasks?limit=2"))
    expect(page.locator("#total")).to_have_text(f"{len(every)} tasks match")
    for i, ids_on in enumerate(pages):
        expect(page.locator('td[data-label="id"]')).to_have_text(ids_on)
        expect(page.locator(".pager")).to_contain_text(f"page {i + 1} of {len(pages)}")
        if i + 1 < len(pages):
            page.get_by_role("link", name="Next").click()
    expect(page.get_by_role("link", name="Next")).to_have_count(0)
    for ids_on in reversed(pages[:-1]):
        page.get_by_role("link", name="Previous").click()
        expect(page.locator('td[data-label="id"]')).to_have_text(ids_on)
    expect(page.get_by_role("link", name="Previous")).to_have_count(0)


def test_task_page_shows_attempts_outputs_and_previews(traffic: Traffic, page: Page) -> None:
    """A retried task's page: its facts, every attempt the route lists, its output."""
    api = traffic.api
    task_id = traffic.ids["flaky"]
    detail = api("GET", f"/ui/api/tasks/{task_id}")
    page.goto(api.url(f"#/tasks/{task_id}"))
    expect(page.locator('[data-field="status"]')).to_have_text("succeeded")
    expect(page.locator("dl.facts")).to_contain_text("2 of 2")
    attempts = page.get_by_role("table", name="attempts").locator("tbody tr")
    expect(attempts).to_have_count(len(detail["attempts"]))
    (w,) = api("GET", "/v1/workers")["workers"]
    for n, a in enumerate(detail["attempts"]):
        row = attempts.nth(n)
        expect(row.locator('td[data-label="attempt"]')).to_have_text(str(a["attempt"]))
        expect(row.locator('td[data-label="status"]')).to_have_text(a["status"])
        expect(row.locator('td[data-label="message"]')).to_have_text(a["message"])
        expect(row.locator('td[data-label="worker"]')).to_have_text("dash-worker")
        expect(row.locator('td[data-label="worker id"]')).to_have_text(w["id"])
    expect(attempts.locator('td[data-label="status"]')).to_have_text(["failed", "succeeded"])
    expect(page.locator(".output pre")).to_contain_text('"done": "flaky"')
    expect(page.locator(".payload")).to_have_text("none")  # a succeeded task's is dropped
    expect(page.get_by_role("button", name="Submit again")).to_have_count(0)
    page.screenshot(path=str(SHOTS / "task.png"), full_page=True)


@pytest.mark.parametrize("do", ["boom", "fail"])
def test_submit_again_copies_the_task(traffic: Traffic, page: Page, do: str) -> None:
    """Submit again on a dead-lettered or failed task creates a task with the same spec and
    payload, and the page goes to it."""
    api = traffic.api
    old = traffic.ids[do]
    page.goto(api.url(f"#/tasks/{old}"))
    expect(page.locator('[data-field="status"]')).to_have_text(
        api("GET", f"/v1/tasks/{old}")["status"]
    )
    expect(page.locator(".payload pre")).to_contain_text(f'"do": "{do}"')
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    page.get_by_role("button", name="Submit again").click()
    expect(page).not_to_have_url(api.url(f"#/tasks/{old}"))
    new = page.url.split("#/tasks/")[1].split("?")[0]
    assert int(new) > int(old)
    expect(page.get_by_role("heading", name=f"Task {new}")).to_be_visible()
    expect(page.locator("p.notice")).to_contain_text(f"copy of task {old}")
    before, after = api("GET", f"/ui/api/tasks/{old}"), api("GET", f"/ui/api/tasks/{new}")
    assert after["spec"] == before["spec"]
    assert after["task"]["kind"] == before["task"]["kind"]
    assert after["task"]["pool"] == before["task"]["pool"]
    assert "key" not in after["task"]
    quiet(api)
    assert api("GET", f"/v1/tasks/{new}")["status"] == before["task"]["status"]


def test_cancel_a_waiting_task(traffic: Traffic, page: Page) -> None:
    """Cancel on a task that waits (its pool has no worker) cancels it, and says so."""
    api = traffic.api
    task = api("POST", "/v1/tasks", {"payload": {"to": "ada"}, "pool": "batch", "kind": "mail"})
    page.goto(api.url(f"#/tasks/{task['id']}"))
    expect(page.locator('[data-field="status"]')).to_have_text("ready")
    expect(page.locator(".payload pre")).to_contain_text('"to": "ada"')
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator('[data-field="status"]')).to_have_text("cancelled")
    expect(page.locator("p.notice")).to_have_text("Cancelled.")
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    assert api("GET", f"/v1/tasks/{task['id']}")["status"] == "cancelled"


def _live(page: Page) -> None:
    expect(page.locator("#stream-state")).to_have_attribute("data-state", "live")


def test_live_events_show_new_tasks_and_filter(traffic: Traffic, page: Page) -> None:
    """A task submitted while the view is open appears with each status change; the kind,
    pool and status filters let only theirs through. An event that is filtered out is
    submitted first: the stream is in order, so by the time the later task shows, the earlier
    one would have shown."""
    api = traffic.api
    page.goto(api.url("#/events"))
    _live(page)
    new = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "ev"})["id"]
    for status in ("ready", "running", "succeeded"):
        expect(page.locator(f'tr[data-id="{new}"][data-status="{status}"]')).to_have_count(1)
    expect(
        page.locator(f'tr[data-id="{new}"]').first.locator('td[data-label="kind"]')
    ).to_have_text("ev")
    page.screenshot(path=str(SHOTS / "events.png"), full_page=True)

    page.locator("#e-kind").fill("wanted")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(api.url("#/events?kind=wanted"))
    _live(page)
    other = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "unwanted"})["id"]
    wanted = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "wanted"})["id"]
    expect(page.locator(f'tr[data-id="{wanted}"][data-status="succeeded"]')).to_have_count(1)
    expect(page.locator(f'tr[data-id="{other}"]')).to_have_count(0)

    page.goto(api.url("#/events?pool=batch"))
    _live(page)
    other = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "kind": "x"})["id"]
    wanted = api("POST", "/v1/tasks", {"payload": {"do": "ok"}, "pool": "batch"})["id"]
    expect(page.locator(f'tr[data-id="{wanted}"][data-status="ready"]')).to_have_count(1)
    expect(page.locator(f'tr[data-id="{other}"]')).to_have_count(0)
    expect(page.locator('td[data-label="pool"]').filter(has_not_text="batch")).to_have_count(0)

    page.goto(api.url("#/events?status=failed"))
    _live(page)
    failing = api("POST", "/v1/tasks", {"payload": {"do": "fail"}, "kind": "x"})["id"]
    expect(page.locator(f'tr[data-id="{failing}"][data-status="failed"]')).to_have_count(1)
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator('td[data-label="message"]')).to_have_text(["no such mailbox"])
    quiet(api)


def test_workers_view_equals_the_api(traffic: Traffic, page: Page) -> None:
    """Name, pool, labels, slots, leases held and connected since, as /v1/workers has them
    while the worker holds a lease."""
    api = traffic.api
    quiet(api)
    held = api("POST", "/v1/tasks", {"payload": {"do": "hold"}, "kind": "hold"})["id"]
    (w,) = until(
        lambda: [w for w in api("GET", "/v1/workers")["workers"] if w["busy"] == 1],
        "the worker to hold the lease",
    )
    page.goto(api.url("#/workers"))
    expect(page.get_by_role("columnheader", name="leases held")).to_be_visible()
    expect(page.locator('td[data-label="id"]')).to_have_text([w["id"]])
    expect(page.locator('td[data-label="name"]')).to_have_text(["dash-worker"])
    expect(page.locator('td[data-label="pool"]')).to_have_text([w["pool"]])
    expect(page.locator('td[data-label="labels"]')).to_have_text(["zone=eu"])
    expect(page.locator('td[data-label="slots"]')).to_have_text([str(w["slots"])])
    expect(page.locator('td[data-label="leases held"]')).to_have_text([str(w["busy"])])
    since = page.evaluate(
        "ns => new Date(Number(BigInt(ns) / 1000000n)).toLocaleString()", w["connected_unix_ns"]
    )
    expect(page.locator('td[data-label="connected since"]')).to_contain_text(since)
    page.screenshot(path=str(SHOTS / "workers.png"), full_page=True)
    assert api("DELETE", f"/v1/tasks/{held}")["cancelled"]
    quiet(api)
    page.reload()
    expect(page.locator('td[data-label="leases held"]')).to_have_text(["0"])


def test_recurring_view_equals_the_api(traffic: Traffic, page: Page) -> None:
    """Each schedule as /v1/recurring has it; the last task links to that task."""
    api = traffic.api
    schedules = api("GET", "/v1/recurring")["schedules"]
    page.goto(api.url("#/recurring"))
    expect(page.locator('td[data-label="name"]')).to_have_text([s["name"] for s in schedules])
    expect(page.locator('td[data-label="cron"]')).to_have_text([s["cron"] for s in schedules])
    expect(page.locator('td[data-label="time zone"]')).to_have_text(
        [s.get("tz", "UTC") for s in schedules]
    )
    expect(page.locator('td[data-label="kind"]')).to_have_text([s["kind"] for s in schedules])
    expect(page.locator('td[data-label="overlap"]')).to_have_text(["skip", "skip"])
    for row, s in zip(page.locator("tbody tr").all(), schedules, strict=True):
        at = page.evaluate(
            "ns => new Date(Number(BigInt(ns) / 1000000n)).toLocaleString()", s["next_unix_ns"]
        )
        expect(row.locator('td[data-label="next occurrence"]')).to_contain_text(at)
        expect(row.locator('td[data-label="last task"]')).to_have_text(s.get("last_task_id", ""))
    page.screenshot(path=str(SHOTS / "recurring.png"), full_page=True)
    page.get_by_role("link", name=traffic.soon, exact=True).click()
    expect(page.get_by_role("heading", name=f"Task {traffic.soon}")).to_be_visible()
    expect(page.locator("dl.facts")).to_contain_text("tick")


def test_shards_view_on_a_server_that_is_not_sharded(traffic: Traffic, page: Page) -> None:
    page.goto(traffic.api.url("#/shards"))
    expect(page.get_by_text("This server is not sharded.")).to_be_visible()
    expect(page.locator("#nav-shards")).to_be_hidden()


def test_phone_menu_and_views(traffic: Traffic, browser: Browser) -> None:
    """At 390x844 the menu opens and closes, and a view fits the width (rows become cards)."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    try:
        page.goto(traffic.api.url("#/overview"))
        toggle = page.get_by_role("button", name="Menu")
        expect(page.get_by_role("link", name="Tasks")).to_be_hidden()
        toggle.click()
        expect(toggle).to_have_attribute("aria-expanded", "true")
        page.get_by_role("link", name="Tasks").click()
        expect(toggle).to_have_attribute("aria-expanded", "false")
        expect(page.get_by_role("link", name="Tasks")).to_be_hidden()
        expect(page.locator('td[data-label="id"]').first).to_be_visible()
        page.get_by_role("link", name=traffic.ids["boom"], exact=True).click()
        expect(page.get_by_role("button", name="Submit again")).to_be_visible()
        page.goto(traffic.api.url("#/tasks"))
        expect(page.locator('td[data-label="id"]').first).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.screenshot(path=str(SHOTS / "phone.png"), full_page=True)
    finally:
        context.close()


def test_dark_mode(traffic: Traffic, browser: Browser) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="dark")
    page = context.new_page()
    try:
        page.goto(traffic.api.url("#/overview"))
        expect(page.locator('[data-total="submitted"]')).to_be_visible()
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(15, 23, 42)"
        page.screenshot(path=str(SHOTS / "dark.png"), full_page=True)
    finally:
        context.close()


def test_keyboard_reaches_nav_and_filters_and_skips(traffic: Traffic, page: Page) -> None:
    """Tab goes skip link, every nav link, then the filter form; the skip link moves the focus
    to the content and leaves the view as it was."""
    page.goto(traffic.api.url("#/tasks"))
    expect(page.locator('td[data-label="id"]').first).to_be_visible()
    seen = []
    for _ in range(20):
        page.keyboard.press("Tab")
        seen.append(
            page.evaluate(
                "document.activeElement.getAttribute('href') || document.activeElement.id"
            )
        )
        if seen[-1] == "f-key":
            break
    views = ["#/overview", "#/tasks", "#/events", "#/workers", "#/recurring"]
    assert seen == ["#main", *views, "f-key"]
    page.keyboard.press("Shift+Tab")
    for _ in views:
        page.keyboard.press("Shift+Tab")
    expect(page.locator("a.skip")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    expect(page).to_have_url(traffic.api.url("#/tasks"))
    expect(page.get_by_role("heading", name="Tasks")).to_be_visible()
