"""deploy/systemd: the unit files pass `systemd-analyze verify` and an offline security review,
their settings agree with the example server.toml (which `cronoq-server --check` accepts), and
the worker's command line is one `cronoq worker` takes.

`systemd-analyze verify` checks that each ExecStart= program exists: the test runs it on copies
whose /opt/cronoq/bin (where the units expect the virtualenv) is this test's own virtualenv.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.deploy import DEPLOY, check_config, port, read_toml, token_env_names, worker_params

UNITS = DEPLOY / "systemd"
SERVER = UNITS / "cronoq-server.service"
WORKER = UNITS / "cronoq-worker@.service"
INSTANCE = "cronoq-worker@tasks:app.service"
VENV_BIN = "/opt/cronoq/bin/"
TOKENS = {
    "CRONOQ_CLIENT_TOKEN": "client-token-for-the-check-0123456789",
    "CRONOQ_WORKER_TOKEN": "worker-token-for-the-check-0123456789",
    "CRONOQ_ADMIN_TOKEN": "admin-token-for-the-check-01234567890",
}
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "CapabilityBoundingSet": "",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
}

analyze = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    analyze is None,
    reason="systemd-analyze is not installed (Debian's systemd package, which scripts/test.sh"
    " installs)",
)


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file, each key with all its values in order (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}: keep each setting on one line"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not key=value: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = unit[section].get(key)
    assert values is not None, f"[{section}] {key}= is missing"
    return values[-1]


def seconds(value: str) -> float:
    """A systemd time span without units, or in s/min."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min)?", value)
    assert m, f"unexpected time span {value!r}"
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


@pytest.fixture(scope="module")
def runnable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Copies of the units whose programs are this virtualenv's (they exist, so verify can
    check them)."""
    venv_bin = Path(sys.executable).parent
    for program in ("cronoq-server", "cronoq"):
        if not (venv_bin / program).exists():
            pytest.skip(f"{venv_bin / program} is missing: install cronoq into this virtualenv")
    folder = tmp_path_factory.mktemp("units")
    for unit in (SERVER, WORKER):
        text = unit.read_text()
        assert VENV_BIN in text
        (folder / unit.name).write_text(text.replace(VENV_BIN, f"{venv_bin}/"))
    return folder


def run_analyze(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert analyze is not None
    return subprocess.run([analyze, *args], cwd=folder, capture_output=True, text=True, timeout=120)


@needs_analyze
@pytest.mark.parametrize(
    "target",
    [SERVER.name, f"./{WORKER.name}:{INSTANCE}"],
    ids=["server", "worker-instance"],
)
def test_systemd_analyze_verify_is_clean(runnable: Path, target: str) -> None:
    # The worker template is verified as the instance tasks:app (`FILE:NAME` names the unit
    # the file is loaded as), so %I expands as it will on a machine.
    done = run_analyze(runnable, "verify", "--man=no", target)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # no warning either (unknown keys, ...)


@needs_analyze
def test_verify_catches_a_broken_unit(runnable: Path) -> None:
    """The check above can fail: a misspelt key and a missing program are reported."""
    broken = runnable / "broken.service"
    text = (runnable / SERVER.name).read_text()
    broken.write_text(
        text.replace("NoNewPrivileges=yes", "NoNewPrivilege=yes").replace(
            f"{Path(sys.executable).parent}/cronoq-server -c", "/nonexistent/cronoq-server -c"
        )
    )
    done = run_analyze(runnable, "verify", "--man=no", broken.name)
    assert done.returncode != 0
    assert "NoNewPrivilege" in done.stderr
    assert "/nonexistent/cronoq-server" in done.stderr


@needs_analyze
@pytest.mark.parametrize("target", [SERVER.name, f"./{WORKER.name}:{INSTANCE}"])
def test_security_exposure_is_low(runnable: Path, target: str) -> None:
    # systemd's own rating: 0 (locked down) to 10 (unprotected); "OK" is below 2.
    done = run_analyze(runnable, "security", "--offline=yes", "--no-pager", target)
    assert done.returncode == 0, done.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert m, done.stdout[-2000:]
    assert float(m.group(1)) <= 2.0, done.stdout


@pytest.mark.parametrize("unit_path", [SERVER, WORKER], ids=["server", "worker"])
def test_units_are_hardened(unit_path: Path) -> None:
    unit = parse_unit(unit_path)
    service = unit["Service"]
    for key, value in HARDENING.items():
        assert one(unit, "Service", key) == value, key
    families = set(one(unit, "Service", "RestrictAddressFamilies").split())
    assert {"AF_INET", "AF_INET6", "AF_UNIX"} <= families
    assert not families - {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}
    assert service["SystemCallFilter"][0] == "@system-service"
    assert one(unit, "Service", "User") == "cronoq"
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_server_unit_matches_its_config() -> None:
    unit = parse_unit(SERVER)
    config_path = "/etc/cronoq/server.toml"
    start = shlex.split(one(unit, "Service", "ExecStart"))
    assert start == [f"{VENV_BIN}cronoq-server", "-c", config_path]
    assert one(unit, "Service", "ConfigurationDirectory") == "cronoq"
    config = read_toml(UNITS / "server.toml")
    # The SQLite file is in the StateDirectory, the one place ProtectSystem=strict leaves
    # writable.
    assert config["store"]["kind"] == "sqlite"
    state = Path("/var/lib") / one(unit, "Service", "StateDirectory")
    assert Path(config["store"]["path"]).parent == state
    assert one(unit, "Service", "WorkingDirectory") == str(state)
    # SIGTERM: running attempts get shutdown_grace_s, open calls 5 s more; SIGKILL only after.
    grace = float(config["server"]["shutdown_grace_s"])
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > grace + 5
    # Every token the config reads from the environment comes from the EnvironmentFile.
    assert one(unit, "Service", "EnvironmentFile") == "/etc/cronoq/server.env"
    assert set(token_env_names(config)) == set(TOKENS)
    # The listeners differ, and the metrics one (no credentials) stays on loopback.
    server = config["server"]
    ports = {port(server[k]) for k in ("grpc_addr", "http_addr", "metrics_addr")}
    assert len(ports) == 3
    assert server["metrics_addr"].startswith("127.0.0.1:")


def test_server_config_passes_check() -> None:
    check_config(UNITS / "server.toml", TOKENS)


def test_worker_unit_runs_cronoq_worker_on_its_instance() -> None:
    unit = parse_unit(WORKER)
    start = shlex.split(one(unit, "Service", "ExecStart"))
    assert start[:3] == [f"{VENV_BIN}cronoq", "worker", "%I"]
    # $CRONOQ_WORKER_ARGS expands to extra words (empty by default); the rest is parsed by the
    # real command, with the instance name in place of %I.
    assert start[-1] == "$CRONOQ_WORKER_ARGS"
    assert one(unit, "Service", "Environment").startswith("CRONOQ_")
    params = worker_params(["tasks:app", *start[3:-1]])
    assert params["app_path"] == "tasks:app"
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > params["grace"]
    files = unit["Service"]["EnvironmentFile"]
    assert files[0] == "/etc/cronoq/worker.env"  # CRONOQ_TARGET, CRONOQ_WORKER_TOKEN
    assert all(f == files[0] or f.startswith("-") for f in files)  # the others are optional
    # Exit 3 is a refusal for good (a wrong token): restarting would not help.
    assert one(unit, "Service", "RestartPreventExitStatus") == "3"


def test_sysusers_declares_the_units_user(tmp_path: Path) -> None:
    lines = [
        line.split()
        for line in (UNITS / "cronoq.sysusers.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [fields[:2] for fields in lines] == [["u", "cronoq"]]
    sysusers = shutil.which("systemd-sysusers")
    if sysusers is None:
        return
    done = subprocess.run(
        [sysusers, "--dry-run", f"--root={tmp_path}", str(UNITS / "cronoq.sysusers.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Creating user 'cronoq'" in done.stderr + done.stdout
