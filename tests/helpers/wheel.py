"""The checkout's wheel for tests/deploy (test_wheel.py, test_image.py): `pip wheel . --no-deps`
built into a temporary directory once per state of the sources and kept in build/wheel-cache
(git-ignored), keyed by a digest of every file the build reads; and a wheelhouse, that wheel
with the wheels of its `server` and `client` dependencies, for an image built offline."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "wheel-cache"
# What `pip wheel .` reads: the metadata, the package and the crate of the native transport.
SOURCE_FILES = ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE")
SOURCE_DIRS = ("src", "native")
# Build output and caches inside those directories, which the wheel does not take from there.
SKIP_DIRS = {"__pycache__", "target", ".mypy_cache", ".pytest_cache"}


def _sources() -> Iterator[Path]:
    for name in SOURCE_FILES:
        yield REPO / name
    for top in SOURCE_DIRS:
        for root, dirs, files in os.walk(REPO / top):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            for f in sorted(files):
                if f.endswith((".pyc", ".so")):
                    continue
                yield Path(root) / f


def source_key() -> str:
    """A digest of the paths, modes and contents of the build's inputs."""
    h = hashlib.sha256()
    for path in _sources():
        h.update(str(path.relative_to(REPO)).encode() + b"\0")
        h.update(b"x" if os.access(path, os.X_OK) else b"-")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:20]


@contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _one(directory: Path, pattern: str = "cronoq-*.whl") -> Path | None:
    found = sorted(directory.glob(pattern)) if directory.is_dir() else []
    return found[0] if len(found) == 1 else None


def _pip(*args: str, timeout: float) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"pip {' '.join(args)}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    )


def build_wheel(out: Path) -> Path:
    """`pip wheel . --no-deps -w out`: the documented step, into `out`; the wheel's path."""
    _pip("wheel", str(REPO), "--no-deps", "-w", str(out), timeout=1200)
    wheel = _one(out)
    assert wheel is not None, f"no single cronoq wheel in {out}: {sorted(os.listdir(out))}"
    return wheel


def cached_wheel() -> Path:
    """The wheel of the sources as they are now: built into a temporary directory unless
    build/wheel-cache already holds one for the same sources. Older entries are removed."""
    with _locked():
        key = source_key()
        entry = CACHE / key
        wheel = _one(entry / "wheel")
        if wheel is not None:
            return wheel
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=CACHE))
        build_wheel(staging / "wheel")
        # Sources edited during the build: the wheel is of neither state, so it is not kept.
        assert source_key() == key, "the sources changed while the wheel was being built"
        for old in CACHE.iterdir():
            if old.is_dir() and old != staging:
                shutil.rmtree(old)
        os.replace(staging, entry)
        wheel = _one(entry / "wheel")
        assert wheel is not None
        return wheel


def cached_wheelhouse() -> Path:
    """A directory with the cached wheel and the wheels of everything its `server` and
    `client` extras need (binary wheels for this interpreter and platform, from the index)."""
    wheel = cached_wheel()
    house = wheel.parent.parent / "wheelhouse"
    with _locked():
        if (house / ".complete").exists():
            return house
        staging = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=house.parent))
        _pip(
            "download",
            "--only-binary=:all:",
            "--dest",
            str(staging),
            f"{wheel}[server,client]",
            timeout=600,
        )
        assert _one(staging) is not None, f"the wheelhouse lacks cronoq: {os.listdir(staging)}"
        (staging / ".complete").touch()
        shutil.rmtree(house, ignore_errors=True)
        os.replace(staging, house)
        return house
