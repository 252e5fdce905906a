"""What the benchmarks share: verdicts, percentiles, where the measured cronoq came from (and
the header lines saying so), and child processes whose output lines are awaited by pattern."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cronoq


def source() -> str:
    """Where cronoq was imported from, and its git commit (+ changed files under src/)."""
    where = os.path.dirname(os.path.abspath(cronoq.__file__))
    desc = f"cronoq {cronoq.__version__} from {where}"
    try:
        git = ["git", "-C", where]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=5
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return desc
    if head:
        changed = [ln[3:] for ln in dirty if ln.strip()]
        desc += f" (git {head}" + (f", uncommitted: {', '.join(changed)})" if changed else ")")
    return desc


def print_about(title: str, platform_note: str = "") -> None:
    """The first lines of a report: its title, then the Python, platform and cronoq measured,
    so that figures of two runs can be told apart."""
    print(title)
    print(f"python:   {platform.python_implementation()} {sys.version.split()[0]}")
    print(f"platform: {platform.platform()} ({platform.machine()}){platform_note}")
    print(f"source:   {source()}")


def print_cpus(processes: str = "") -> None:
    """The header line of the machine's CPUs and load, and which processes share them."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    usable = len(os.sched_getaffinity(0))
    line = f"cpus:     {os.cpu_count()} (usable: {usable}); load average {load}"
    print(line + (f"; processes: {processes}" if processes else ""))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def cargo_build(root: Path, args: list[str], quick: bool, what: str) -> Path:
    """`cargo build --locked ARGS` in `root`, in release mode (debug for --quick, a smoke run),
    incremental (quick when nothing changed); exits naming `what` if it fails. Returns the
    profile's directory of `root`'s target dir."""
    done = subprocess.run(
        ["cargo", "build", "--locked", *args] + ([] if quick else ["--release"]),
        cwd=root,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"cargo build of {what} failed:\n{done.stderr[-4000:]}")
    return root / "target" / ("debug" if quick else "release")


def percentile(sorted_xs: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return sorted_xs[max(1, math.ceil(p * len(sorted_xs))) - 1]


class Child:
    """A child process whose output lines are read by a thread as they come, so that it never
    blocks on a full pipe and its lines can be awaited by pattern. The lines are stdout and
    stderr merged, or with `stderr_only` stderr alone (stdout dropped)."""

    def __init__(self, argv: list[str], name: str, *, stderr_only: bool = False) -> None:
        self.name = name
        if stderr_only:
            self.p = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            self._out = self.p.stderr
        else:
            self.p = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
            )
            self._out = self.p.stdout
        self.pid = self.p.pid
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._out is not None
        for line in self._out:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first new line matching `pattern`; the process's output so far if none comes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                tail = "\n".join(self.lines[-20:])
                raise RuntimeError(f"{self.name}: no line matching {pattern!r}\n{tail}")
            self.lines.append(line)
            if m := re.search(pattern, line):
                return m

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def proc_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) a process has used so far: the whole thread group's, as
    /proc/<pid>/stat counts it (every thread, a runtime's helper threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


NATIVE_TARGET = "/tmp/cronoq-bench-native-target"  # cargo's cache for the builds of revisions


@contextlib.contextmanager
def revision_tree(root: Path, rev: str) -> Iterator[Path]:
    """A temporary git worktree of `rev` whose `src/` runs with this venv (PYTHONPATH), with a
    `cronoq._native` that matches its own `native/`: this tree's built module copied in when
    `native/` is the same in both, else `rev`'s crate built with cargo (release, a target
    directory kept in /tmp between runs, so a second build of a revision is quick). A worktree
    with its own venv would rebuild every dependency; only the extension differs by revision."""
    with tempfile.TemporaryDirectory(prefix="cronoq-rev-") as tmp:
        tree = Path(tmp) / "rev"
        git = ["git", "-C", str(root)]
        subprocess.run([*git, "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
        try:
            built = sorted((root / "src" / "cronoq").glob("_native*.so"))
            same = subprocess.run([*git, "diff", "--quiet", rev, "--", "native"]).returncode == 0
            if same or not built:
                for so in built:
                    shutil.copy2(so, tree / "src" / "cronoq" / so.name)
                how = "this tree's build copied" if built else "none built here"
            else:
                manifest = tree / "native" / "Cargo.toml"
                cargo = ["cargo", "build", "--release", "--locked", "--manifest-path"]
                env = dict(os.environ, CARGO_TARGET_DIR=NATIVE_TARGET)
                subprocess.run([*cargo, str(manifest)], env=env, check=True)
                lib = Path(NATIVE_TARGET) / "release" / "lib_native.so"
                shutil.copy2(lib, tree / "src" / "cronoq" / built[0].name)
                how = f"built from {rev}'s native/"
            print(f"revision: {rev} in {tree} (PYTHONPATH), cronoq._native {how}")
            yield tree
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=True)
