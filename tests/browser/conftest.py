"""Fixtures of the dashboard's browser tests: one headless Chromium per test module and a
fresh context per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dash_support import ARGS, SHOTS
from playwright.sync_api import Browser, Page, expect, sync_playwright

# A safety net for a loaded machine, not a measure: expect() returns as soon as a check holds.
expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Module-scoped, not session-scoped: Playwright's sync API runs an asyncio loop in this
    thread while it is open, and the suite's other tests start loops of their own."""
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    yield context.new_page()
    context.close()
