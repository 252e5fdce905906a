"""A private PostgreSQL server in a temporary directory, on a free port: for the benchmarks
(bench/store.py) and the tests (tests/helpers/pg.py, which imports this module).

`Cluster.start()` runs `initdb` and `pg_ctl` from the PostgreSQL binaries (`CRONOQ_PG_BIN`, else
the newest `/usr/lib/postgresql/*/bin`, else `PATH`). `initdb` refuses to run as root, so as root
the cluster belongs to the `postgres` account (`runuser`). `stop()` ends it (`-m immediate`: the
data is thrown away) and removes the directory. A cluster given a URL starts and stops nothing.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "cronoq"
DATABASE = "cronoq"


def _bin_dir() -> Path | None:
    given = os.environ.get("CRONOQ_PG_BIN")
    if given:
        return Path(given)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return None if initdb is None else Path(initdb).parent


def _version(path: str) -> int:
    part = Path(path).parts[-3]
    return int(part) if part.isdigit() else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """One PostgreSQL server: the one at `url`, or (no URL) a private one that start() creates.

    `fsync`: the private server's `fsync` setting. Off, a commit is not flushed to disk (quicker
    tests, nothing to keep); on (PostgreSQL's default), every commit waits for its WAL flush.
    `instead`: how to name a server instead, for the error raised when no binaries are found."""

    def __init__(self, url: str = "", *, fsync: bool = True, instead: str = "") -> None:
        self.url = url
        self.fsync = fsync
        self.instead = instead
        self._dir: Path | None = None
        self._bin: Path | None = None
        self._as: list[str] = []

    @property
    def private(self) -> bool:
        """Is this server one that start() created (and stop() throws away)?"""
        return self._dir is not None

    def start(self) -> None:
        if self.url:
            return
        bin_dir = _bin_dir()
        if bin_dir is None:
            or_url = f", or {self.instead}" if self.instead else ""
            raise RuntimeError(
                "PostgreSQL binaries not found: install PostgreSQL (initdb, pg_ctl), set "
                f"CRONOQ_PG_BIN to their directory{or_url}"
            )
        self._bin = bin_dir
        self._dir = Path(tempfile.mkdtemp(prefix="cronoq-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self._dir, "postgres", "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        port = free_port()
        data, logfile = self._dir / "data", self._dir / "pg.log"
        try:
            self._run("initdb", "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8")
            options = (
                f"-p {port} -k {self._dir} -c listen_addresses=127.0.0.1 "
                f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=300"
            )
            self._run("pg_ctl", "-D", str(data), "-l", str(logfile), "-w", "-o", options, "start")
            self._run("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", USER, DATABASE)
        except BaseException:
            self.stop()
            raise
        self.url = f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"

    def _run(self, tool: str, *args: str) -> None:
        assert self._bin is not None
        done = subprocess.run(
            [*self._as, str(self._bin / tool), *args], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}")

    def stop(self) -> None:
        if self._dir is None:
            return
        try:
            if (self._dir / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self._dir / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
