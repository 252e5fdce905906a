"""A full disk for the store tests: a small tmpfs mounted in a temp dir (`small_fs`), filled
to the last byte by a filler file (`fill`) that the test deletes to give the space back.

Mounting needs root (as the suite runs in CI); where it is not permitted the test is skipped.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = "filler"


@contextlib.contextmanager
def small_fs(directory: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `directory`/fs for the block; unmounted at its end."""
    mount = directory / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"a small tmpfs cannot be mounted here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        # (lazily: a server killed just before may still have files open there)
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(mount: Path) -> Path:
    """Write a filler file until the file system has no byte left; returns its path."""
    path = mount / FILLER
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 16, 1 << 12, 1):  # big writes first, then the last partial block
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    assert os.statvfs(mount).f_bavail == 0
    return path
