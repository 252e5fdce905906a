"""deploy/helm/cronoq: `helm lint` passes and `helm template` renders, with the default values
(SQLite in a StatefulSet) and with PostgreSQL, KEDA and a ServiceMonitor; the rendered objects
agree with each other (ports, probes, secrets, the worker's target) and the ConfigMap's
server.toml passes `cronoq-server --check`.

helm is built from its Go module at a pinned release the first time (tests/helpers/deploy.py)
and kept in build/tools; the test skips only where neither that binary nor Go is there.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.deploy import (
    DEPLOY,
    check_config,
    helm_binary,
    port,
    read_toml,
    token_env_names,
    worker_params,
)

CHART = DEPLOY / "helm" / "cronoq"
RELEASE = "demo"
NAMESPACE = "jobs"
FULLNAME = "demo-cronoq"
PG_URL = "postgresql://cronoq:secret@db.example.internal:5432/cronoq"
# The worker needs an image with the application (the chart refuses it without one).
WORKER = ["--set", "worker.enabled=true", "--set", "worker.image.repository=registry.example/shop"]
FULL = [
    *WORKER,
    "--set",
    f"store.postgres.url={PG_URL}",
    "--set",
    "store.postgres.schema=cronoq_prod",
    "--set",
    "server.replicas=3",
    "--set",
    "keda.enabled=true",
    "--set",
    "keda.prometheus.serverAddress=http://prometheus.monitoring.svc:9090",
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "worker.pool=images",
    "--set",
    "worker.slots=6",
    "--set-json",
    'config.pools=[{"name": "default"}, {"name": "images", "min": 0, "max": 24,'
    ' "target_utilization": 0.5, "retry": {"max_attempts": 5, "jitter": true},'
    ' "tenant_weights": {"team a": 2, "b": 0.5}}]',
    "--set-json",
    'config.limits={"max_pending_total": 1000000, "request_timeout_s": 12.5}',
]


@pytest.fixture(scope="module")
def helm() -> Path:
    found = helm_binary()
    if found is None:
        pytest.skip("no helm in build/tools and no Go toolchain to build it (go install)")
    return found


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


class Rendered:
    """The objects `helm template` printed, by kind and name."""

    def __init__(self, text: str) -> None:
        self.objects = [d for d in yaml.safe_load_all(text) if d]
        keys = [(o["kind"], o["metadata"]["name"]) for o in self.objects]
        assert len(keys) == len(set(keys)), f"an object is rendered twice: {keys}"

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        return found

    def secret_value(self, name: str, key: str) -> str:
        secret = self.get("Secret", name)
        if key in secret.get("stringData", {}):
            return str(secret["stringData"][key])
        return base64.b64decode(secret["data"][key]).decode()

    def config_text(self) -> str:
        return str(self.get("ConfigMap", f"{FULLNAME}-config")["data"]["server.toml"])


def render(helm: Path, *args: str) -> Rendered:
    done = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode == 0, done.stderr
    return Rendered(done.stdout)


@pytest.fixture(scope="module")
def default(helm: Path) -> Rendered:
    return render(helm)


@pytest.fixture(scope="module")
def with_worker(helm: Path) -> Rendered:
    """The defaults and a worker Deployment."""
    return render(helm, *WORKER)


@pytest.fixture(scope="module")
def full(helm: Path) -> Rendered:
    return render(helm, *FULL)


def server_workload(r: Rendered) -> dict[str, Any]:
    (found,) = [
        o
        for o in r.all("StatefulSet") + r.all("Deployment")
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
    ]
    return found


def containers(r: Rendered) -> Iterator[dict[str, Any]]:
    for o in r.all("StatefulSet") + r.all("Deployment"):
        yield from o["spec"]["template"]["spec"]["containers"]


def env_refs(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def server_env(r: Rendered) -> dict[str, str]:
    """The server container's environment as the cluster would give it, from the Secrets."""
    (container,) = server_workload(r)["spec"]["template"]["spec"]["containers"]
    return {name: r.secret_value(*ref) for name, ref in env_refs(container).items()}


@pytest.mark.parametrize("values", [[], FULL], ids=["default", "postgres-keda-servicemonitor"])
def test_lint(helm: Path, values: list[str]) -> None:
    done = run_helm(helm, "lint", "--strict", str(CHART), *values)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_helm_is_the_pinned_release(helm: Path) -> None:
    done = run_helm(helm, "version", "--template", "{{ .Version }}")
    assert done.stdout == "v3.22.1"


def test_default_is_sqlite_in_a_statefulset(default: Rendered) -> None:
    workload = server_workload(default)
    assert workload["kind"] == "StatefulSet"
    assert workload["spec"]["replicas"] == 1
    (claim,) = workload["spec"]["volumeClaimTemplates"]
    config = read_toml(default.config_text())
    assert config["store"]["kind"] == "sqlite"
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == str(Path(config["store"]["path"]).parent)
    # Its governing Service exists.
    assert default.get("Service", workload["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    assert not default.all("ScaledObject")
    assert not default.all("ServiceMonitor")
    assert "DATABASE_URL" not in server_env(default)


def test_postgres_is_a_deployment_of_leader_and_standbys(full: Rendered) -> None:
    workload = server_workload(full)
    assert workload["kind"] == "Deployment"
    assert workload["spec"]["replicas"] == 3
    assert not full.all("StatefulSet")
    # Only the leader is ready, so a rollout must not wait for new pods to become ready.
    assert workload["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    pod = workload["spec"]["template"]["spec"]
    assert "data" not in {v["name"] for v in pod["volumes"]}
    config = read_toml(full.config_text())
    assert config["store"] == {
        "kind": "postgres",
        "url_env": "DATABASE_URL",
        "schema": "cronoq_prod",
    }
    assert server_env(full)["DATABASE_URL"] == PG_URL


@pytest.mark.parametrize("which", ["default", "full"])
def test_probes_ports_and_service(which: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(which)
    config = read_toml(r.config_text())["server"]
    workload = server_workload(r)
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "grpc": port(config["grpc_addr"]),
        "http": port(config["http_addr"]),
        "metrics": port(config["metrics_addr"]),
    }
    for key in ("grpc_addr", "http_addr", "metrics_addr"):
        assert config[key].startswith("0.0.0.0:")
    liveness, readiness = container["livenessProbe"], container["readinessProbe"]
    assert liveness["httpGet"] == {"path": "/healthz", "port": "http"}
    assert readiness["httpGet"] == {"path": "/readyz", "port": "http"}
    service = r.get("Service", FULLNAME)
    assert (
        service["spec"]["selector"].items()
        <= workload["spec"]["template"]["metadata"]["labels"].items()
    )
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        (name, number, name) for name, number in ports.items()
    }
    # The config is the ConfigMap's, mounted where the command reads it; a change of it
    # changes the pods' annotation, so that they roll.
    assert container["command"] == ["cronoq-server", "-c", "/etc/cronoq/server.toml"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/cronoq"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == f"{FULLNAME}-config"
    checksum = workload["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum == hashlib.sha256(r.config_text().rstrip("\n").encode()).hexdigest()
    # SIGTERM: shutdown_grace_s for running attempts, 5 s for open calls, then SIGKILL.
    assert pod["terminationGracePeriodSeconds"] > config["shutdown_grace_s"] + 5
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("which", ["default", "full"])
def test_config_passes_check(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    r: Rendered = request.getfixturevalue(which)
    config = read_toml(r.config_text())
    env = server_env(r)
    # Every token the config reads from the environment is given to the server by a Secret.
    assert set(token_env_names(config)) == {
        "CRONOQ_CLIENT_TOKEN",
        "CRONOQ_WORKER_TOKEN",
        "CRONOQ_ADMIN_TOKEN",
    }
    assert set(token_env_names(config)) <= set(env)
    path = tmp_path / "server.toml"
    path.write_text(r.config_text())
    check_config(path, env)


@pytest.mark.parametrize("which", ["default", "with_worker", "full"])
def test_every_secret_reference_resolves(which: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(which)
    refs = [ref for c in containers(r) for ref in env_refs(c).values()]
    # the server's three tokens, the worker's token, and the PostgreSQL URL in "full"
    assert len(refs) == {"default": 3, "with_worker": 4, "full": 5}[which]
    for name, key in refs:
        assert len(r.secret_value(name, key)) >= 16, (name, key)


def test_no_worker_by_default_and_none_without_its_image(helm: Path, default: Rendered) -> None:
    assert not [d for d in default.all("Deployment") if d["metadata"]["name"].endswith("-worker")]
    done = run_helm(helm, "template", RELEASE, str(CHART), "--set", "worker.enabled=true")
    assert done.returncode != 0
    assert "worker.enabled needs worker.image.repository" in done.stderr


@pytest.mark.parametrize("which", ["with_worker", "full"])
def test_worker_runs_cronoq_worker(which: str, request: pytest.FixtureRequest) -> None:
    r: Rendered = request.getfixturevalue(which)
    worker = r.get("Deployment", f"{FULLNAME}-worker")
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["cronoq", "worker"]
    params = worker_params(command[2:])
    assert params["app_path"] == "tasks:app"
    config = read_toml(r.config_text())
    assert set(params["pools"]) <= {p["name"] for p in config["pools"]}
    assert pod["terminationGracePeriodSeconds"] > params["grace"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    service = r.get("Service", FULLNAME)
    grpc = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert env["CRONOQ_TARGET"] == f"http://{FULLNAME}.{NAMESPACE}.svc:{grpc}"
    assert env_refs(container)["CRONOQ_WORKER_TOKEN"] == (f"{FULLNAME}-tokens", "worker-token")
    # The worker's token is the one the server knows as its worker token.
    worker_token = [t for t in config["auth"]["tokens"] if t["role"] == "worker"]
    (server_var,) = [t["token_env"] for t in worker_token]
    assert r.secret_value(*env_refs(container)["CRONOQ_WORKER_TOKEN"]) == server_env(r)[server_var]
    # With KEDA the Deployment leaves its replicas to the ScaledObject.
    assert ("replicas" in worker["spec"]) == (which == "with_worker")


def test_keda_scales_workers_on_desired_slots(full: Rendered) -> None:
    (scaled,) = full.all("ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"{FULLNAME}-worker",
    }
    full.get("Deployment", f"{FULLNAME}-worker")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    metadata = trigger["metadata"]
    assert metadata["query"] == 'max(cronoq_pool_desired_workers{pool="images"})'
    # desired is in slots: one worker per worker.slots of them.
    assert metadata["threshold"] == "6"
    assert metadata["serverAddress"] == "http://prometheus.monitoring.svc:9090"
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["maxReplicaCount"] >= 1


def test_service_monitor_scrapes_the_metrics_port(full: Rendered) -> None:
    (monitor,) = full.all("ServiceMonitor")
    service = full.get("Service", FULLNAME)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    metrics = next(p for p in service["spec"]["ports"] if p["name"] == "metrics")
    config = read_toml(full.config_text())["server"]
    assert metrics["port"] == port(config["metrics_addr"])


def test_values_become_toml_of_the_right_types(full: Rendered) -> None:
    # Helm reads YAML numbers as floats; counts must still be TOML integers.
    config = read_toml(full.config_text())
    images = next(p for p in config["pools"] if p["name"] == "images")
    assert images == {
        "name": "images",
        "min": 0,
        "max": 24,
        "target_utilization": 0.5,
        "retry": {"max_attempts": 5, "jitter": True},
        "tenant_weights": {"team a": 2, "b": 0.5},
    }
    assert isinstance(images["max"], int)
    assert config["limits"] == {"max_pending_total": 1000000, "request_timeout_s": 12.5}


def test_existing_secrets_are_referenced_not_made(helm: Path) -> None:
    r = render(
        helm,
        "--set",
        "auth.existingSecret=my-tokens",
        "--set",
        "store.postgres.existingSecret=my-db",
        "--set",
        "store.postgres.existingSecretKey=dsn",
    )
    assert not r.all("Secret")
    refs = {ref for c in containers(r) for ref in env_refs(c).values()}
    assert refs == {
        ("my-tokens", "client-token"),
        ("my-tokens", "worker-token"),
        ("my-tokens", "admin-token"),
        ("my-db", "dsn"),
    }
    assert server_workload(r)["kind"] == "Deployment"


def test_given_tokens_are_used_and_short_ones_refused(helm: Path) -> None:
    token = "given-client-token-0123456789abcdef"
    r = render(helm, "--set", f"auth.clientToken={token}")
    assert r.secret_value(f"{FULLNAME}-tokens", "client-token") == token
    done = run_helm(helm, "template", RELEASE, str(CHART), "--set", "auth.workerToken=too-short")
    assert done.returncode != 0
    assert "auth.workerToken: must be at least 16 characters" in done.stderr


def test_notes_render(helm: Path, tmp_path: Path) -> None:
    # `helm install --dry-run` needs a cluster, and `helm template` leaves NOTES.txt out (lint
    # renders it, without showing it): a copy of the chart renders it into a ConfigMap.
    chart = tmp_path / "cronoq"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}\n'
    )
    done = run_helm(
        helm,
        "template",
        RELEASE,
        str(chart),
        "--namespace",
        NAMESPACE,
        *FULL,
        "--show-only",
        "templates/zz-notes.yaml",
    )
    assert done.returncode == 0, done.stderr
    notes = yaml.safe_load(done.stdout)["data"]["notes"]
    assert f"gRPC:  http://{FULLNAME}.{NAMESPACE}.svc:7070" in notes
    assert f"get secret {FULLNAME}-tokens" in notes
    assert "PostgreSQL (schema cronoq_prod), 3 servers" in notes
    assert "scaled by KEDA between 0 and 10" in notes
    assert "secret@" not in notes  # the database password stays out
