"""deploy/grafana and deploy/prometheus (docs/observability.md): the dashboard and the alert
rules, checked by Prometheus's own tools and against a real cronoq-server scraped by a real
Prometheus.

Static: the dashboard's shape (uid, the `datasource`, `job` and `pool` variables, every panel on
`${datasource}`, every per-pool series filtered by `$pool`), Grafana's provisioning files
agreeing with it, every rule with a severity and its annotations, `promtool check rules`,
`promtool test rules alerts_test.yml` and `promtool check config` of the example prometheus.yml.

Live (one module fixture): a `cronoq-server` process with pools "work" (a worker, retries) and
"stuck" (no worker); a thread that keeps putting traffic through "work" with a
`cronoq.client.Client` and a `cronoq.client.Worker` (tasks that succeed, fail once and succeed
on the retry, fail every attempt and are dead-lettered, fail permanently); and `prometheus`
scraping the server's /metrics every second and evaluating a copy of alerts.yml every second.
The copy differs from the shipped file in its `for:` durations alone, shortened to seconds so
that an alert fires within the test (the expressions are the shipped ones, which the test
asserts). Then: every PromQL expression of every dashboard panel, with `$pool` as `.*` and as
"work", `$job` as the scrape job and `$__rate_interval` as 15s, returns a finite value through
/api/v1/query; a backlog in "stuck" fires CronoqBacklogNoWorkers and the traffic's dead letters
CronoqDeadLetters; stopping the server fires CronoqNoLeader and CronoqTargetDown.

Every wait polls a condition with a generous timeout (never a fixed sleep, never a wall-clock
assertion), so the test holds on a loaded machine. With CRONOQ_OBSERVABILITY_SHOTS=DIR set, the
panel test also saves screenshots of Prometheus's graph page for the key panel queries into DIR
(how docs/img/dashboard-*.png were made; headless Chromium through Playwright).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from cronoq import Permanent
from cronoq.client import Client, Lease, Worker
from helpers.deploy import DEPLOY
from helpers.prometheus import MISSING, PROMETHEUS, PROMTOOL, Prometheus, until
from helpers.servers import PORT0, Serving, serving_process

GRAFANA = DEPLOY / "grafana"
PROM = DEPLOY / "prometheus"
DASHBOARD = GRAFANA / "cronoq.json"
ALERTS = PROM / "alerts.yml"

needs_prometheus = pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason=MISSING)

JOB = "cronoq"  # the scrape job of the rules and the dashboard's default
RATE_INTERVAL = "15s"  # what Grafana makes of $__rate_interval for a 1 s scrape, about
SHORT_FOR = "2s"  # every rule's `for:` in the test's copy of alerts.yml
WAIT = 180.0  # the longest condition wait: only a broken stack gets near it
CONFIG = PORT0 + (
    '[[pools]]\nname = "work"\nautoscale = false\n'
    "retry = { max_attempts = 2, initial_backoff_s = 0, jitter = false }\n"
    '[[pools]]\nname = "stuck"\nautoscale = false\n'
)


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def load_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel."""
    return [(p["title"], t["expr"]) for p in graph_panels(dashboard) for t in p["targets"]]


def substitute(expr: str, pool: str) -> str:
    """`expr` as Grafana sends it with the variables set: `$pool` a regex (".*" for All)."""
    for name, value in (("__rate_interval", RATE_INTERVAL), ("pool", pool), ("job", JOB)):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"a variable left in {expr}"
    return expr


# --- static checks ------------------------------------------------------------------------------


def test_dashboard_variables_and_datasource() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "cronoq"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "job", "pool"}
    source = variables["datasource"]
    assert (source["type"], source["query"], source["current"]["value"]) == (
        "datasource",
        "prometheus",
        "prometheus",
    )
    pool = variables["pool"]
    assert pool["type"] == "query"
    assert pool["definition"].startswith("label_values(") and pool["definition"].endswith(", pool)")
    assert pool["includeAll"] and pool["multi"] and pool["allValue"] == ".*"
    assert variables["job"]["definition"] == "label_values(cronoq_up, job)"
    assert variables["job"]["current"]["value"] == JOB
    ours = {"type": "prometheus", "uid": "${datasource}"}
    assert variables["job"]["datasource"] == variables["pool"]["datasource"] == ours
    panels = graph_panels(dashboard)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["datasource"] == ours, p["title"]
        assert p["targets"], p["title"]
        assert all(t["datasource"] == ours for t in p["targets"]), p["title"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]), p["title"]


def test_dashboard_covers_the_topics_per_pool() -> None:
    queries = panel_queries(load_dashboard())
    text = "\n".join(expr for _, expr in queries)
    for needed in (
        "cronoq_tasks_submitted_total",
        "cronoq_tasks_total",
        "cronoq_pool_ready_tasks",
        "cronoq_pool_oldest_ready_age_seconds",
        "cronoq_pool_retries_total",
        "cronoq_pool_dead_lettered_total",
        "cronoq_pool_workers{",
        "cronoq_pool_desired_workers",
        "cronoq_leader",
        "up{",
    ):
        assert needed in text, needed
    for histogram in ("cronoq_pool_queue_wait_seconds", "cronoq_pool_attempt_duration_seconds"):
        for q in ("0.5", "0.95", "0.99"):
            assert f"histogram_quantile({q}, sum by (pool, le) (rate({histogram}_bucket" in text
    # every series of a family with a pool label is filtered by the pool variable
    for title, expr in queries:
        for selector in re.findall(r"cronoq_pool_\w+\{[^}]*\}", expr):
            assert 'pool=~"$pool"' in selector, (title, selector)
        for selector in re.findall(r"(?:cronoq_\w+|up)\{[^}]*\}", expr):
            assert 'job=~"$job"' in selector, (title, selector)


def test_grafana_provisioning_matches_the_dashboard() -> None:
    provisioning = GRAFANA / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert source["uid"] == variables["datasource"]["current"]["value"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "cronoq.yaml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/cronoq"
    # the compose stack mounts deploy/grafana where this provider reads
    compose = (DEPLOY / "compose" / "compose.yaml").read_text()
    assert f"../grafana:{provider['options']['path']}" in compose


def test_every_rule_has_severity_and_annotations() -> None:
    rules = load_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for needed in (
        "CronoqBacklogNoWorkers",
        "CronoqOldestTaskAge",
        "CronoqHighFailureRate",
        "CronoqDeadLetters",
        "CronoqNoLeader",
        "CronoqTargetDown",
    ):
        assert needed in names
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
        # docs/observability.md explains each rule
    doc = (DEPLOY.parent / "docs" / "observability.md").read_text()
    for name in names:
        assert f"`{name}`" in doc, name


def promtool(*args: str, cwd: Path = PROM) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@needs_prometheus
def test_promtool_check_rules() -> None:
    out = promtool("check", "rules", "alerts.yml")
    assert f"SUCCESS: {len(load_rules())} rules found" in out


@needs_prometheus
def test_promtool_rule_unit_tests() -> None:
    out = promtool("test", "rules", "alerts_test.yml")
    assert "SUCCESS" in out
    # every rule has a unit test in which it fires
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == {r["alert"] for r in load_rules()}


@needs_prometheus
def test_promtool_check_example_config() -> None:
    out = promtool("check", "config", "prometheus.yml")
    assert "SUCCESS" in out
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert [job["job_name"] for job in config["scrape_configs"]] == [JOB]


# --- the live stack -----------------------------------------------------------------------------


async def handle(lease: Lease) -> Any:
    """The worker of pool "work": what the payload says, after a few milliseconds of work."""
    what = lease.json()["do"]
    await asyncio.sleep(0.005 * (1 + lease.task_id % 8))
    if what == "doomed" or (what == "flaky" and lease.attempt == 1):
        raise RuntimeError(f"{what} attempt {lease.attempt}")  # retried, or dead-lettered
    if what == "permanent":
        raise Permanent("no retry for this one")
    return {"done": what}


class Traffic:
    """A thread with its own event loop that serves pool "work" with a Worker and submits a
    round of tasks about five times a second until `stop()`: three that succeed, one that fails
    its first attempt, and every fifth round one that fails both attempts (dead-lettered) and
    one that fails permanently. Priorities alternate between high and normal."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.rounds = 0
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._started.wait(60), "the traffic thread did not start"

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as e:  # reported by the tests that wait on the traffic
            self.error = e
        finally:
            self._started.set()
            self._loop.close()

    async def _main(self) -> None:
        stop = self._stop = asyncio.Event()
        self._started.set()
        worker = Worker(self.address, "work", handle, slots=4, backoff=(0.05, 0.5))
        serving = asyncio.create_task(worker.run())
        try:
            async with Client(self.address) as client:
                while not stop.is_set():
                    self.rounds += 1
                    kinds = ["ok", "ok", "ok", "flaky"]
                    if self.rounds % 5 == 0:
                        kinds += ["doomed", "permanent"]
                    priority: Literal["high", "normal"] = "high" if self.rounds % 2 else "normal"
                    for kind in kinds:
                        await client.submit({"do": kind}, pool="work", priority=priority)
                    # the pace of the traffic, not a wait for anything
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.2)
        finally:
            await worker.stop(grace=1.0)
            await serving

    def stop(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def check(self) -> str:
        return f"traffic: {self.rounds} rounds, error {self.error!r}"


@dataclass
class Stack:
    serving: Serving
    traffic: Traffic
    prometheus: Prometheus


def short_rules(directory: Path) -> Path:
    """A copy of alerts.yml whose rules wait SHORT_FOR instead of their `for:`, nothing else
    changed."""
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR
    path = directory / "alerts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    shipped = load_rules()
    copied = load_rules(path)
    assert [(r["alert"], r["expr"], r["labels"]) for r in copied] == [
        (r["alert"], r["expr"], r["labels"]) for r in shipped
    ]
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not (PROMETHEUS and PROMTOOL):
        pytest.skip(MISSING)
    directory = tmp_path_factory.mktemp("observability")
    with serving_process(directory, CONFIG) as serving:
        traffic = Traffic(serving.address)
        try:
            short_rules(directory)
            config = {
                "global": {
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "evaluation_interval": "1s",
                },
                "rule_files": ["alerts.yml"],
                "scrape_configs": [
                    {
                        "job_name": JOB,
                        "metrics_path": "/metrics",
                        "static_configs": [{"targets": [serving.http_address]}],
                    }
                ],
            }
            prometheus = Prometheus(directory, config)
            try:
                yield Stack(serving, traffic, prometheus)
            finally:
                prometheus.stop()
        finally:
            traffic.stop()


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def test_every_panel_query_returns_data(stack: Stack) -> None:
    prom = stack.prometheus
    queries = panel_queries(load_dashboard())
    waiting = {
        (title, substitute(expr, pool)) for title, expr in queries for pool in (".*", "work")
    }
    seen: dict[str, list[dict[str, Any]]] = {}

    def all_answered() -> bool:
        for item in sorted(waiting):
            seen[item[1]] = result = prom.query(item[1])
            if finite(result):
                waiting.discard(item)
        return not waiting

    until(
        all_answered,
        WAIT,
        lambda: (
            f"data for {sorted(waiting)}; last answers "
            f"{ {e: seen.get(e) for _, e in waiting} }; {stack.traffic.check()}"
        ),
    )
    # the panels' series are the pools': "work" has its own, and "stuck" is listed too
    workers = prom.query(substitute('cronoq_pool_workers{job=~"$job", pool=~"$pool"}', ".*"))
    assert {s["metric"]["pool"] for s in workers} == {"work", "stuck"}
    if shots := os.environ.get("CRONOQ_OBSERVABILITY_SHOTS"):
        screenshots(stack, Path(shots))


def test_backlog_without_workers_and_dead_letters_fire(stack: Stack) -> None:
    prom = stack.prometheus
    rules = {
        r["name"]: r for g in prom.api("/api/v1/rules")["groups"] for r in g["rules"]
    }  # loaded from the copy: the shipped rules with the short `for:`
    assert set(rules) == {r["alert"] for r in load_rules()}
    assert {r["duration"] for r in rules.values() if r["duration"]} == {2.0}

    async def backlog() -> None:
        async with Client(stack.serving.address) as client:
            for _ in range(3):
                await client.submit({"do": "ok"}, pool="stuck", priority="low")

    asyncio.run(backlog())
    until(
        lambda: prom.firing("CronoqBacklogNoWorkers", pool="stuck"),
        WAIT,
        lambda: f"CronoqBacklogNoWorkers{{pool=stuck}} to fire: {prom.alerts()}",
    )
    (alert,) = prom.firing("CronoqBacklogNoWorkers")  # "work" has its worker: no alert
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == (
        "cronoq pool stuck: 3 ready tasks and no worker capacity"
    )
    until(
        lambda: prom.firing("CronoqDeadLetters", pool="work"),
        WAIT,
        lambda: f"CronoqDeadLetters{{pool=work}} to fire: {prom.alerts()}; {stack.traffic.check()}",
    )


def test_stopped_server_fires_no_leader_and_target_down(stack: Stack) -> None:
    """Last of the module: it stops the fixture's server."""
    prom = stack.prometheus
    stack.traffic.stop()
    assert stack.traffic.error is None, stack.traffic.check()
    assert stack.serving.server.terminate() == 0
    until(
        lambda: prom.firing("CronoqNoLeader") and prom.firing("CronoqTargetDown", job=JOB),
        WAIT,
        lambda: f"CronoqNoLeader and CronoqTargetDown to fire: {prom.alerts()}",
    )
    (down,) = prom.firing("CronoqTargetDown")
    assert down["labels"]["instance"] == stack.serving.http_address


# --- screenshots for docs/observability.md ------------------------------------------------------

# file name: (panel title, refId) of the query shown
SHOTS = {
    "throughput": ("Attempts started and ended per second, per pool", "B"),
    "queue-wait": ("Queue wait p99, per pool and priority class", "A"),
    "failures": ("Failed attempts and retries per second, per pool", "A"),
}


def screenshots(stack: Stack, directory: Path) -> None:
    """Prometheus's graph page for a few panel queries, once two minutes of data are in."""
    from playwright.sync_api import sync_playwright

    prom = stack.prometheus
    until(
        lambda: finite(prom.query("count_over_time(cronoq_up[3m]) >= 120")),
        600,
        lambda: "two minutes of scrapes",
    )
    targets = {
        (p["title"], t["refId"]): t["expr"]
        for p in graph_panels(load_dashboard())
        for t in p["targets"]
    }
    directory.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 960, "height": 600})
        for name, target in SHOTS.items():
            expr = targets[target]
            params = {
                "g0.expr": substitute(expr, ".*"),
                "g0.tab": "0",
                "g0.range_input": "2m",
            }
            page.goto(f"{prom.url}/graph?{urllib.parse.urlencode(params)}")
            page.wait_for_selector(".graph_area svg", timeout=60_000)
            page.screenshot(path=str(directory / f"dashboard-{name}.png"), full_page=True)
        browser.close()
