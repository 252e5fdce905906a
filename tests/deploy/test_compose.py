"""deploy/compose: compose.yaml is valid (`docker-compose config`, where installed), every file it
mounts exists, its ports and variables agree with server.toml, prometheus.yml and Grafana's
provisioning (the shipped deploy/grafana/provisioning), its Prometheus loads the shipped alert
rules (deploy/prometheus/alerts.yml) under the job name they select, server.toml passes
`cronoq-server --check`, and the worker's command line and example app are what `cronoq worker`
takes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from cronoq.app._serve import load_app
from helpers.deploy import (
    DEPLOY,
    REPO,
    check_config,
    interpolate,
    port,
    read_toml,
    token_env_names,
    worker_params,
)

COMPOSE = DEPLOY / "compose"
FILE = COMPOSE / "compose.yaml"
CONFIG_IN_CONTAINER = "/etc/cronoq/server.toml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return read_toml(COMPOSE / "server.toml")


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment with `${VAR:-default}` expanded from the defaults, as compose
    does with none of the variables set."""
    environment = service.get("environment", {})
    assert isinstance(environment, dict), "write environment: as a mapping"
    return {k: interpolate(str(v), {}) for k, v in environment.items()}


def mounts(service: dict[str, Any]) -> dict[Path, str]:
    """Bind mounts (host path resolved against deploy/compose -> container path)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            found[(COMPOSE / source).resolve()] = target
    return found


def seconds(value: str) -> float:
    assert value.endswith("s") and value[:-1].isdigit(), value
    return float(value[:-1])


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "server", "worker", "prometheus", "grafana"}
    assert "version" not in compose  # the Compose Specification: no version key


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    sources = [s for service in compose["services"].values() for s in mounts(service)]
    assert sorted(str(s.relative_to(DEPLOY)) for s in sources) == [
        "compose/app",
        "compose/prometheus.yml",
        "compose/server.toml",
        "grafana",
        "grafana/provisioning",
        "prometheus/alerts.yml",
    ]
    for source in sources:
        assert source.exists(), source
        assert source.is_relative_to(DEPLOY), f"{source}: mount only files of deploy/"


def test_server_and_worker_are_built_from_the_root_dockerfile(compose: dict[str, Any]) -> None:
    for name in ("server", "worker"):
        build = compose["services"][name]["build"]
        context = (COMPOSE / build["context"]).resolve()
        assert context == REPO
        # The Dockerfile path is relative to the context: ../../Dockerfile from here. It is
        # written separately; `docker compose build` needs it, `config` does not.
        assert (context / build["dockerfile"]).resolve() == REPO / "Dockerfile"
    assert compose["services"]["server"]["image"] == compose["services"]["worker"]["image"]


def test_postgres_is_15_with_a_healthcheck(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["image"].split(":")[1].split("-")[0] == "15"
    test = postgres["healthcheck"]["test"]
    assert "pg_isready" in " ".join(test)
    assert compose["services"]["server"]["depends_on"]["postgres"]["condition"] == (
        "service_healthy"
    )


def test_server_runs_the_mounted_config(compose: dict[str, Any]) -> None:
    server = compose["services"]["server"]
    assert server["entrypoint"] == ["cronoq-server"]
    assert server["command"] == ["-c", CONFIG_IN_CONTAINER]
    assert mounts(server)[COMPOSE / "server.toml"] == CONFIG_IN_CONTAINER


def test_server_env_feeds_the_config(compose: dict[str, Any], config: dict[str, Any]) -> None:
    server_env = env_of(compose["services"]["server"])
    postgres_env = env_of(compose["services"]["postgres"])
    store = config["store"]
    assert store["kind"] == "postgres"
    url = urlsplit(server_env[store["url_env"]])
    assert url.scheme in ("postgres", "postgresql")
    assert (url.hostname, url.port) == ("postgres", 5432)  # the postgres service
    assert url.username == postgres_env["POSTGRES_USER"]
    assert url.password == postgres_env["POSTGRES_PASSWORD"]
    assert url.path == "/" + postgres_env["POSTGRES_DB"]
    names = token_env_names(config)
    assert names and set(names) <= set(server_env)
    # The listeners bind every interface, so the config must have credentials: it does.
    assert all(len(server_env[n]) >= 32 for n in names)
    assert len({server_env[n] for n in names}) == len(names)


def test_ports_agree_with_the_config(compose: dict[str, Any], config: dict[str, Any]) -> None:
    server = compose["services"]["server"]
    listeners = config["server"]
    grpc, http, metrics = (port(listeners[k]) for k in ("grpc_addr", "http_addr", "metrics_addr"))
    published = {int(p.split(":")[-1]) for p in server["ports"]}
    assert published == {grpc, http}
    assert [int(p) for p in server["expose"]] == [metrics]
    # The healthcheck asks the metrics listener's /readyz (no credentials, no Host check).
    check = " ".join(server["healthcheck"]["test"])
    assert f"http://127.0.0.1:{metrics}/readyz" in check
    # Prometheus scrapes it.
    prometheus = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": [f"server:{metrics}"]}]
    assert mounts(compose["services"]["prometheus"])[COMPOSE / "prometheus.yml"] in {
        arg.split("=", 1)[1]
        for arg in compose["services"]["prometheus"]["command"]
        if arg.startswith("--config.file=")
    }


def test_stop_grace_covers_the_drain(compose: dict[str, Any], config: dict[str, Any]) -> None:
    server, worker = compose["services"]["server"], compose["services"]["worker"]
    assert server["stop_signal"] == worker["stop_signal"] == "SIGTERM"
    grace = float(config["server"]["shutdown_grace_s"])
    assert seconds(server["stop_grace_period"]) > grace + 5
    params = worker_params(worker["command"][1:])
    assert seconds(worker["stop_grace_period"]) > params["grace"]


def test_worker_serves_the_example_app(compose: dict[str, Any], config: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert worker["entrypoint"] == ["cronoq"]
    assert worker["command"][0] == "worker"
    params = worker_params(worker["command"][1:])
    env = env_of(worker)
    server_env = env_of(compose["services"]["server"])
    assert env["CRONOQ_TARGET"] == f"http://server:{port(config['server']['grpc_addr'])}"
    assert env["CRONOQ_WORKER_TOKEN"] == server_env["CRONOQ_WORKER_TOKEN"]
    worker_token = [t for t in config["auth"]["tokens"] if t["role"] == "worker"]
    assert [t["token_env"] for t in worker_token] == ["CRONOQ_WORKER_TOKEN"]
    # The app directory is the working directory, so MODULE:APP imports from it.
    assert mounts(worker)[COMPOSE / "app"] == worker["working_dir"]
    pools = [p["name"] for p in config["pools"]]
    assert set(params["pools"]) <= set(pools)
    module = params["app_path"].split(":")[0]
    assert (COMPOSE / "app" / f"{module}.py").exists()
    # Imported as the worker does (from its working directory), then forgotten again, so that
    # no other test's `tasks` module is this one.
    cwd, path, before = Path.cwd(), list(sys.path), sys.modules.pop(module, None)
    os.chdir(COMPOSE / "app")
    try:
        app = load_app(params["app_path"])
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        sys.modules.pop(module, None)
        if before is not None:
            sys.modules[module] = before
    assert app.tasks, "the example app declares a task"
    assert {t.pool for t in app.tasks.values()} <= set(params["pools"])
    # The app runs: its task, in library mode (the worker runs the same function).
    add = app.tasks["add"]

    async def submit() -> object:
        async with app.local():
            return await (await add.submit(2, 3)).result(timeout=10)

    assert asyncio.run(submit()) == 5


def test_prometheus_loads_the_shipped_rules(compose: dict[str, Any]) -> None:
    service = compose["services"]["prometheus"]
    prometheus = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    config_file = mounts(service)[COMPOSE / "prometheus.yml"]
    # rule_files are relative to the configuration file's directory in the container.
    config_dir = PurePosixPath(config_file).parent
    rule_files = {str(config_dir / f) for f in prometheus["rule_files"]}
    shipped = DEPLOY / "prometheus" / "alerts.yml"
    assert rule_files == {mounts(service)[shipped]}
    # The rules and the dashboard filter by the job name: compose scrapes under that name.
    (job,) = prometheus["scrape_configs"]
    jobs = set(re.findall(r'job="([^"]*)"', shipped.read_text()))
    assert jobs == {job["job_name"]} == {"cronoq"}
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["job"]["current"]["value"] in ("cronoq", ["cronoq"])


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (scripts/test.sh installs Debian's prometheus)",
)
def test_prometheus_config_checks_with_its_mounts(compose: dict[str, Any], tmp_path: Path) -> None:
    # The files laid out as the container sees them under /etc/prometheus, then checked with
    # the rule file they name.
    for source, target in mounts(compose["services"]["prometheus"]).items():
        assert target.startswith("/etc/prometheus/"), target
        shutil.copy(source, tmp_path / target.removeprefix("/etc/prometheus/"))
    done = subprocess.run(
        ["promtool", "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout + done.stderr


def dashboard() -> dict[str, Any]:
    loaded = json.loads((DEPLOY / "grafana" / "cronoq.json").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_grafana_provisioning(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    # The shipped provisioning, not a copy of it.
    provisioning = DEPLOY / "grafana" / "provisioning"
    assert mounts(grafana)[provisioning] == "/etc/grafana/provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    prometheus_port = int(compose["services"]["prometheus"]["ports"][0].split(":")[-1])
    assert source["url"] == f"http://prometheus:{prometheus_port}"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "cronoq.yaml").read_text())
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file"
    # The provider reads the folder where deploy/grafana (the cronoq dashboard) is mounted.
    assert mounts(grafana)[DEPLOY / "grafana"] == provider["options"]["path"]
    board = dashboard()
    assert isinstance(board.get("title"), str)
    assert isinstance(board.get("panels"), list)
    # The data source's minimum interval is the compose Prometheus's scrape interval.
    scrape = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())["global"]["scrape_interval"]
    assert source.get("jsonData", {}).get("timeInterval") == scrape


def test_server_config_passes_check(compose: dict[str, Any]) -> None:
    # --check validates the postgres store without reaching it (docs/configuration.md).
    check_config(COMPOSE / "server.toml", env_of(compose["services"]["server"]))


COMPOSE_TOOLS = [t for t in ("docker-compose", "podman-compose") if shutil.which(t)]


@pytest.mark.skipif(
    not COMPOSE_TOOLS,
    reason="neither docker-compose nor podman-compose is installed (scripts/test.sh installs "
    "Debian's docker-compose)",
)
def test_compose_config_validates() -> None:
    tool = COMPOSE_TOOLS[0]
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CRONOQ_", "POSTGRES_", "GRAFANA_", "COMPOSE_"))
    }
    done = subprocess.run(
        [tool, "-f", str(FILE), "config"],
        cwd=COMPOSE,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert set(resolved["services"]) == {"postgres", "server", "worker", "prometheus", "grafana"}
    # The tool's own interpolation gives what this test computes.
    assert {k: str(v) for k, v in resolved["services"]["server"]["environment"].items()} == (
        env_of(yaml.safe_load(FILE.read_text())["services"]["server"])
    )
