"""Helpers of the deploy/ tests (tests/deploy): the checkout's paths, `cronoq-server --check` on
a configuration file, the `cronoq worker` command line parsed by the real command, and `${VAR}`
interpolation as compose does it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SERVER_CHECK = [sys.executable, "-m", "cronoq.server.cli", "--check"]


def check_config(path: Path, env: Mapping[str, str]) -> None:
    """Assert that `cronoq-server --check -c path` accepts the file with `env` set (and nothing
    else of this process's cronoq variables): it validates without contacting a store."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CRONOQ_", "DATABASE_URL"))}
    done = subprocess.run(
        [*SERVER_CHECK, "-c", str(path)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{path}: {done.stderr}"
    assert done.stdout.strip() == "configuration is valid"


def read_toml(text_or_path: str | Path) -> dict[str, Any]:
    text = text_or_path.read_text() if isinstance(text_or_path, Path) else text_or_path
    return tomllib.loads(text)


def port(addr: str) -> int:
    """The port of a socket address of the configuration (`host:port`, `[v6]:port`)."""
    return int(addr.rsplit(":", 1)[1])


def token_env_names(config: Mapping[str, Any]) -> list[str]:
    return [t["token_env"] for t in config.get("auth", {}).get("tokens", []) if "token_env" in t]


def worker_params(args: Sequence[str]) -> dict[str, Any]:
    """The parameters `cronoq worker` reads from `args` (what follows `worker`), parsed by the
    command itself, so a flag it does not know fails here as it would on the machine."""
    from cronoq.cli._commands import cli

    command = cli.commands["worker"]
    assert isinstance(command, click.Command)
    ctx = command.make_context("worker", list(args))
    return dict(ctx.params)


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """`${VAR}` and `${VAR:-default}` as compose expands them, from `env` (else the default)."""

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        assert default is not None, f"${{{name}}} has no default"
        return default

    return _VAR.sub(sub, value)


# Helm, built from its module at a pinned release and kept in build/tools (git-ignored), so
# that only the first run on a machine pays for the build (a few minutes; then nothing).
HELM_VERSION = "v3.22.1"
# The Kubernetes version helm assumes without a cluster: that of the client-go it is built with
# (v0.37.1), as helm's own Makefile sets it; `go install` alone would leave 1.20.
HELM_KUBE = ("1", "37")
HELM = REPO / "build" / "tools" / f"helm-{HELM_VERSION}" / "helm"


def helm_binary() -> Path | None:
    """The pinned helm, built with `go install` if it is not there yet; None without Go."""
    if HELM.exists():
        return HELM
    go = shutil.which("go")
    if go is None:
        return None
    major, minor = HELM_KUBE
    ldflags = " ".join(
        [
            "-s -w",
            f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
            f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor={major}",
            f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={minor}",
            f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor={major}",
            f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={minor}",
        ]
    )
    # Built beside its final place, then moved there: a build cut short leaves no binary.
    HELM.parent.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".helm-", dir=HELM.parent.parent))
    try:
        subprocess.run(
            [go, "install", "-ldflags", ldflags, f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"],
            env={**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"},
            check=True,
            timeout=1200,
        )
        os.replace(staging, HELM.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return HELM
