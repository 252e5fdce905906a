"""Building the Go programs the cross-language tests run (the Go toolchain on PATH)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

GO = shutil.which("go")
# A safety net only: a cold module cache compiles grpc-go (and OpenTelemetry) first.
BUILD_TIMEOUT = 600.0


def go_build(module: Path, package: str, binary: Path) -> Path:
    """`go build -o binary package` in the module directory `module`; the binary's path."""
    assert GO is not None, "the Go toolchain (`go` on PATH) is needed"
    built = subprocess.run(
        [GO, "build", "-o", str(binary), package],
        cwd=module,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert built.returncode == 0, built.stderr
    return binary
