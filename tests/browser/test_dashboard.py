"""The dashboard in headless Chromium against a real cronoq-server (docs/dashboard.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
