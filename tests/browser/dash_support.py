"""What the dashboard's browser tests share besides fixtures: where screenshots go, how
Chromium is started, a JSON client for the server's HTTP API, and polling until a state holds
(never a sleep as a wait: the machine may be busy)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass
class Api:
    """The server's HTTP API at `address`, with `token` as the bearer when given."""

    address: str
    token: str | None = None

    def __call__(self, method: str, path: str, body: object | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{self.address}{path}", data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def url(self, route: str) -> str:
        return f"http://{self.address}/{route}"


def until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll `check` until it answers something truthy; the timeout only fails a hang."""
    end = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # the poll's period, not a wait for the state itself
    return got


def http_error(call: Callable[[], Any]) -> int:
    """The HTTP status `call` fails with."""
    try:
        call()
    except urllib.error.HTTPError as e:
        return e.code
    raise AssertionError("the call succeeded")
