"""The differential suite's Rust side: `core_py`, the test-only PyO3 module over the Rust engine
core (tests/parity/rust), built with `cargo build --release` into its git-ignored target dir
(incremental, so a warm build costs a second) and imported from the built library. The suite
fails, never skips, when the build fails: parity unchecked must not look like parity held."""

from __future__ import annotations

import fcntl
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

CRATE = Path(__file__).resolve().parent / "rust"
TARGET = CRATE / "target"
_SUFFIX = {"darwin": "dylib", "win32": "dll"}.get(sys.platform, "so")
_BUILT = TARGET / "release" / f"{'' if sys.platform == 'win32' else 'lib'}cronoq_core_py.{_SUFFIX}"


def build() -> Path:
    """Build the module (serialized by a lock beside the target dir) and return its library."""
    TARGET.mkdir(parents=True, exist_ok=True)
    with open(TARGET / ".parity-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(
            ["cargo", "build", "--release", "--locked", "--quiet"],
            cwd=CRATE,
            capture_output=True,
            text=True,
            env={**os.environ, "CARGO_TARGET_DIR": str(TARGET)},
            timeout=1800,
        )
    if done.returncode != 0:
        pytest.fail(
            f"cargo build of tests/parity/rust failed:\n{done.stdout[-4000:]}{done.stderr[-8000:]}",
            pytrace=False,
        )
    return _BUILT


def load(library: Path) -> ModuleType:
    """Import the built library as `cronoq_core_py` from a private copy, so a rebuild while
    this process runs never rewrites the file it has mapped."""
    copy = Path(tempfile.mkdtemp(prefix="cronoq-parity-")) / "cronoq_core_py.so"
    copy.write_bytes(library.read_bytes())
    loader = importlib.machinery.ExtensionFileLoader("cronoq_core_py", str(copy))
    spec = importlib.util.spec_from_file_location("cronoq_core_py", copy, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["cronoq_core_py"] = module
    return module


_loaded: ModuleType | None = None


def core_module() -> ModuleType:
    """The built and imported module, once per process (also for scripts outside pytest)."""
    global _loaded
    if _loaded is None:
        _loaded = load(build())
    return _loaded


@pytest.fixture(scope="session")
def core_py() -> ModuleType:
    """The Rust engine core's test-only Python module, freshly built."""
    return core_module()
