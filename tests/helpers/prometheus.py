"""A real `prometheus` process for tests (tests/deploy/test_observability.py): started on a free
loopback port with a configuration and a data directory of the test's own, queried through its
HTTP API (/api/v1/query, /api/v1/alerts, /api/v1/rules), and polled until a condition holds
rather than slept on."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from helpers.ports import free_port
from helpers.servers import LoggedProcess

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = (
    "prometheus and promtool are not installed (Debian's `prometheus` package; scripts/test.sh "
    "installs it with apt-get)"
)

T = TypeVar("T")


def until(check: Callable[[], T | None], timeout: float, what: Callable[[], str]) -> T:
    """Poll `check` every 0.2 s until it returns something truthy; `what()` says, on timeout,
    what was awaited and what was seen last. The timeout is a safety net for a loaded machine,
    not a measure."""
    give_up = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout} s waiting for {what()}")
        time.sleep(0.2)


class Prometheus:
    """`prometheus` serving `config` (a dict written as prometheus.yml into `directory`, where
    the files it names, rule files too, must be), its TSDB in `directory/data`."""

    def __init__(self, directory: Path, config: Mapping[str, Any], *, ready: float = 120) -> None:
        assert PROMETHEUS is not None, MISSING
        (directory / "prometheus.yml").write_text(yaml.safe_dump(dict(config)))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = LoggedProcess(
            [
                PROMETHEUS,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ]
        )
        until(self._ready, ready, lambda: f"prometheus to be ready: {self.process.seen()[-20:]}")

    def _ready(self) -> bool:
        if self.process.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.process.seen()[-20:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=10) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a successful answer of the HTTP API at `path`."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # a bad query is 400 with the parser's error
            raise AssertionError(f"{path} {params}: {e.code} {e.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now (a scalar as a one-sample vector)."""
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now: labels, annotations, state."""
        alerts: list[dict[str, Any]] = self.api("/api/v1/alerts")["alerts"]
        return alerts

    def firing(self, name: str, **labels: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.alerts()
            if a["state"] == "firing"
            and a["labels"].get("alertname") == name
            and all(a["labels"].get(k) == v for k, v in labels.items())
        ]

    def stop(self) -> None:
        if self.process.proc.poll() is None:
            self.process.terminate()
