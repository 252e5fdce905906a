"""The dashboard in headless Chromium against a real cronoq-server (docs/dashboard.md)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from helpers.servers import PORT0, Serving, serving_process

SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    with serving_process(tmp_path_factory.mktemp("dash"), PORT0) as s:
        yield s


@pytest.fixture
def page() -> Iterator[Page]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        yield browser.new_page(viewport={"width": 1280, "height": 800})
        browser.close()


def test_overview_renders(server: Serving, page: Page) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"http://{server.http_address}/#/overview")
    expect(page.locator('[data-total="submitted"]')).to_be_visible()
    page.screenshot(path=str(SHOTS / "overview.png"))


def _api(server: Serving, method: str, path: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.http_address}{path}", data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def test_task_page_shows_the_task_and_cancels_it(server: Serving, page: Page) -> None:
    """Numbers the server answers appear on the page; Cancel changes the task."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    task = _api(server, "POST", "/v1/tasks", {"payload": {"to": "ada"}, "kind": "mail"})
    submitted = _api(server, "GET", "/v1/snapshot")["totals"]["submitted"]
    page.goto(f"http://{server.http_address}/#/overview")
    expect(page.locator('[data-total="submitted"]')).to_have_text(str(submitted))
    page.goto(f"http://{server.http_address}/#/tasks/{task['id']}")
    status = _api(server, "GET", f"/v1/tasks/{task['id']}")["status"]
    expect(page.locator('[data-field="status"]')).to_have_text(status)
    expect(page.locator("pre").first).to_contain_text('"to": "ada"')
    page.screenshot(path=str(SHOTS / "task.png"))
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator('[data-field="status"]')).to_have_text("cancelled")
    assert _api(server, "GET", f"/v1/tasks/{task['id']}")["status"] == "cancelled"
