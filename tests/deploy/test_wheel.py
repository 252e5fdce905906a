"""The wheel: `pip wheel . --no-deps -w dist/` (deploy/README.md, "The wheel") gives one wheel
for CPython 3.11 and up (the stable ABI, abi3) with the native transport, the dashboard's
assets, the typing marker and the server's data files in it; installed into a fresh venv with
its `server` and `client` extras from the package index, its `cronoq-server --check` passes and
`cronoq._native` imports from the venv, not from this checkout.

The wheel is built into a temporary directory once per state of the sources and kept in
build/wheel-cache (tests/helpers/wheel.py): a few seconds on a warm cargo cache, nothing when
the sources did not change since the last run.
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from helpers.wheel import REPO, cached_wheel

SRC = REPO / "src" / "cronoq"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
UI_SUFFIXES = {".html", ".js", ".css", ".svg", ".png", ".ico", ".json", ".map"}


@pytest.fixture(scope="module")
def wheel() -> Path:
    return cached_wheel()


@pytest.fixture(scope="module")
def names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def read_member(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(name).decode()


def test_abi3_tags(wheel: Path) -> None:
    # name-version-python-abi-platform.whl
    _, version, python, abi, platform = wheel.stem.split("-")
    assert (version, python, abi) == (VERSION, "cp311", "abi3")
    assert platform.startswith("linux_") or platform.startswith("manylinux")
    info = email.parser.Parser().parsestr(read_member(wheel, f"cronoq-{VERSION}.dist-info/WHEEL"))
    assert info["Root-Is-Purelib"] == "false"
    assert info.get_all("Tag") == [f"cp311-abi3-{platform}"]


def test_native_module_inside(names: set[str]) -> None:
    # The stable-ABI module and its stub, and no interpreter-specific build of it.
    assert {n for n in names if n.startswith("cronoq/_native")} == {
        "cronoq/_native.abi3.so",
        "cronoq/_native.pyi",
    }


def test_package_data_inside(names: set[str]) -> None:
    assert "cronoq/py.typed" in names
    assert "cronoq/server/openapi.json" in names
    assert "cronoq/proto/cronoq/v1/cronoq.proto" in names
    ui = {
        f"cronoq/server/ui/{p.name}"
        for p in (SRC / "server" / "ui").iterdir()
        if p.suffix in UI_SUFFIXES
    }
    assert {"cronoq/server/ui/index.html", "cronoq/server/ui/app.js"} <= ui
    assert ui <= names, f"dashboard assets missing from the wheel: {sorted(ui - names)}"


def test_metadata(wheel: Path) -> None:
    meta = email.parser.Parser().parsestr(
        read_member(wheel, f"cronoq-{VERSION}.dist-info/METADATA")
    )
    assert meta["Name"] == "cronoq"
    assert meta["Version"] == VERSION
    assert meta["Requires-Python"] == PYPROJECT["project"]["requires-python"]
    assert {"server", "client"} <= set(meta.get_all("Provides-Extra") or [])
    entry_points = read_member(wheel, f"cronoq-{VERSION}.dist-info/entry_points.txt")
    assert "cronoq-server = cronoq.server.cli:main" in entry_points
    assert "cronoq = cronoq.cli:main" in entry_points


def clean_env() -> Mapping[str, str]:
    """This process's environment without what would point Python at the checkout."""
    drop = ("CRONOQ_", "PYTHON", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def test_installs_into_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = clean_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    bin_ = venv / "bin"
    done = subprocess.run(
        [str(bin_ / "python"), "-m", "pip", "install", "-q", f"{wheel}[server,client]"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    check = subprocess.run(
        [str(bin_ / "cronoq-server"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "configuration is valid"

    version = subprocess.run(
        [str(bin_ / "cronoq-server"), "--version"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert version.stdout.strip() == f"cronoq-server {VERSION}"

    imported = subprocess.run(
        [
            str(bin_ / "python"),
            "-c",
            "import cronoq, cronoq._native, cronoq.client, cronoq.server.cli; "
            "print(cronoq.__file__); print(cronoq._native.__file__)",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr
    package, native = (Path(line) for line in imported.stdout.split())
    # From the venv's site-packages, not from this checkout's src/.
    assert package.is_relative_to(venv) and native.is_relative_to(venv)
    assert native.name == "_native.abi3.so"
