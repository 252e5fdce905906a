"""The dashboard of a server with `[[auth.tokens]]` in headless Chromium (docs/dashboard.md): the
page asks for a token, says plainly when it is not accepted, keeps it in the tab's
sessionStorage only, and names the view a token's role does not allow."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dash_support import SHOTS, Api, http_error
from playwright.sync_api import Browser, Page, expect

from helpers.servers import PORT0, serving_process

ADMIN = "admin-token-0123456789abcdef"
METRICS = "metrics-token-0123456789abcdef"  # Admin's read calls only: no task routes
CLIENT = "client-token-0123456789abcdef"  # the task routes only: no snapshot
CONFIG = PORT0 + "".join(
    f'[[auth.tokens]]\ntoken = "{token}"\nrole = "{role}"\n'
    for token, role in ((ADMIN, "admin"), (METRICS, "metrics"), (CLIENT, "client"))
)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with serving_process(tmp_path_factory.mktemp("dash-auth"), CONFIG) as s:
        yield Api(s.http_address, ADMIN)


def _sign_in(page: Page, token: str) -> None:
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Use token").click()


def test_asks_for_a_token_until_one_is_accepted(api: Api, page: Page) -> None:
    """A wrong token: "not accepted" and the form again; the right one: the overview. The
    token lives in this tab's sessionStorage: another tab asks again."""
    api("POST", "/v1/tasks", {"payload": {"to": "ada"}})
    page.goto(api.url("#/overview"))
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.get_by_label("API token")).to_be_focused()
    page.screenshot(path=str(SHOTS / "sign-in.png"))
    _sign_in(page, "wrong-token-0123456789abcdef")
    expect(page.locator("form.token p.error")).to_have_text("the token was not accepted")
    expect(page.get_by_label("API token")).to_be_visible()
    _sign_in(page, ADMIN)
    submitted = api("GET", "/v1/snapshot")["totals"]["submitted"]
    expect(page.locator('[data-total="submitted"]')).to_have_text(str(submitted))
    assert page.evaluate("[sessionStorage.length, localStorage.length]") == [1, 0]
    page.goto(api.url("#/tasks"))
    expect(page.locator('td[data-label="id"]').first).to_be_visible()

    other = page.context.new_page()
    other.goto(api.url("#/overview"))
    expect(other.get_by_role("heading", name="Sign in")).to_be_visible()
    other.close()


@pytest.mark.parametrize(
    ("token", "route", "path", "view"),
    [
        (METRICS, "#/tasks", "POST /v1/tasks/search", "tasks"),
        (METRICS, "#/events", "GET /ui/api/events", "live events"),
        (CLIENT, "#/overview", "GET /v1/snapshot", "the overview"),
        (CLIENT, "#/workers", "GET /v1/workers", "workers"),
        (CLIENT, "#/recurring", "GET /v1/recurring", "recurring schedules"),
    ],
)
def test_a_role_without_the_view_gets_a_plain_403(
    api: Api, page: Page, token: str, route: str, path: str, view: str
) -> None:
    """The route the view reads refuses the token's role, and the page says so plainly."""
    verb, path = path.split()
    assert (
        http_error(lambda: Api(api.address, token)(verb, path, {} if verb == "POST" else None))
        == 403
    )
    page.goto(api.url(route))
    _sign_in(page, token)
    expect(page.locator("main p.error")).to_have_text(f"this token's role does not allow {view}")


def test_a_role_with_the_view_sees_it(api: Api, browser: Browser) -> None:
    """The metrics role reads the overview and the workers, the client role the tasks."""
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(api.url("#/workers"))
        _sign_in(page, METRICS)
        expect(page.get_by_text("No workers connected.")).to_be_visible()
        page.goto(api.url("#/overview"))
        expect(page.locator('[data-total="submitted"]')).to_be_visible()
        page.evaluate("sessionStorage.clear()")
        page.goto(api.url("#/tasks"))
        _sign_in(page, CLIENT)
        expect(page.locator('td[data-label="id"]').first).to_have_text("1")
    finally:
        context.close()


def test_bulk_actions_and_pausing_need_the_admin_role(api: Api, page: Page) -> None:
    """A client token lists and selects tasks, but its bulk cancel is refused (nothing is
    cancelled, and the page says it needs the admin role); a metrics token sees the overview
    but may not pause a pool."""
    waiting = api("POST", "/v1/tasks", {"payload": {"to": "bob"}, "kind": "refused"})["id"]
    bulk = {"action": "cancel", "filter": {"ids": [waiting]}, "dry_run": True}
    assert http_error(lambda: Api(api.address, CLIENT)("POST", "/v1/tasks/bulk", bulk)) == 403
    page.goto(api.url("#/tasks?kind=refused"))
    _sign_in(page, CLIENT)
    page.get_by_label(f"select task {waiting}").check()
    expect(page.locator("#picked")).to_have_text("1 selected")
    page.get_by_role("button", name="Cancel...").click()
    expect(page.locator("p.notice")).to_have_text(
        "this token's role does not allow bulk actions: they need the admin role"
    )
    expect(page.locator("dialog")).to_have_count(0)
    assert api("GET", f"/v1/tasks/{waiting}")["status"] == "ready"

    page.evaluate("sessionStorage.clear()")
    page.goto(api.url("#/overview"))
    _sign_in(page, METRICS)
    assert (
        http_error(lambda: Api(api.address, METRICS)("POST", "/v1/pools/default/pause", {})) == 403
    )
    page.get_by_role("button", name="Pause pool default").click()
    page.get_by_role("dialog").get_by_role("button", name="Pause").click()
    expect(page.locator("p.notice")).to_have_text(
        "this token's role does not allow pausing or resuming pools: that needs the admin role"
    )
    assert not api("GET", "/v1/snapshot")["pools"][0]["paused"]
    page.screenshot(path=str(SHOTS / "pause-refused.png"))
