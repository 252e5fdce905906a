"""Takeover benchmark of cronoq: how soon a SQLite-backed `cronoq-server` serves again after
its leader was killed with `kill -9`, in one run.

Before the lock file (docs/durability.md, "Leader and standbys") both phases below waited out
the dead leader's lease (`[store] leader_lease_s`, 10 s by default); that lease is printed as
the baseline, and phase [0] as the floor that no restart can beat on this machine.

Phases
------
[0]  the floor: a server started on a fresh file (no previous leader): from the spawn of
     `python -m cronoq.server.cli -c CFG` to its first answered gRPC call (Admin.Snapshot, OK).
[1]  restart: a server leads the file, has a task submitted, and is killed with SIGKILL; a new
     server on the same file is spawned at once. From the kill to the new server's first
     answered call (target <= 1 s; its excess over [0] is printed too).
[2]  standby: a leader and a standby (started second, answering UNAVAILABLE) on one file; the
     leader is killed with SIGKILL. From the kill to the standby's first answered call
     (target <= 1 s).

Every run uses a fresh file in a temporary directory, ports 0, the default lease, and polls the
server every 5 ms with a 1 s deadline per call. Medians, minima and maxima of RUNS runs
(interleaved: [0], [1], [2], [0], ...). The exit status is 0 whether targets are met or not.

Usage: python bench/takeover.py [--runs RUNS] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

import grpc

from _common import Child, print_about, print_cpus, verdict
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.config.settings import LEADER_LEASE_S

RUNS = 10
QUICK_RUNS = 2
TARGET_S = 1.0
POLL_S = 0.005
TIMEOUT_S = 120.0  # to wait for a log line or a first answer
SERVER = [sys.executable, "-m", "cronoq.server.cli", "-c"]
CONFIG = """\
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 0.5
log_level = "info"

[store]
kind = "sqlite"
path = "{path}"
"""


class Server(Child):
    """A cronoq-server process; its log lines (stderr) are read by a thread as they come."""

    def __init__(self, config: str) -> None:
        super().__init__([*SERVER, config], "cronoq-server", stderr_only=True)
        self.address = self.expect(r"event=listening grpc=(\S+)", TIMEOUT_S).group(1)
        self.listening_at = time.perf_counter()

    def kill(self) -> float:
        """SIGKILL; returns when it was sent (perf_counter)."""
        t = time.perf_counter()
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()
        return t


def answered(address: str, timeout: float = TIMEOUT_S) -> float:
    """Poll Admin.Snapshot until it succeeds; when it did (perf_counter)."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = cronoq_pb2_grpc.AdminStub(channel)
        while True:
            try:
                stub.Snapshot(pb.Empty(), timeout=1.0)
                return time.perf_counter()
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"{address} never answered")
            time.sleep(POLL_S)


def refuses(address: str) -> bool:
    """Does the server answer UNAVAILABLE (a standby)?"""
    with grpc.insecure_channel(address) as channel:
        try:
            cronoq_pb2_grpc.AdminStub(channel).Snapshot(pb.Empty(), timeout=5.0)
        except grpc.RpcError as e:
            return bool(e.code() == grpc.StatusCode.UNAVAILABLE)
    return False


def submit(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        spec = pb.TaskSpec(key="left-behind", payload=b"x")
        cronoq_pb2_grpc.TasksStub(channel).Submit(pb.SubmitRequest(task=spec), timeout=30)


class Files:
    """A configuration on a fresh database path per run, in one temporary directory."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cronoq-takeover-")
        self.n = 0

    def config(self) -> str:
        self.n += 1
        path = os.path.join(self.dir, f"run{self.n}.toml")
        with open(path, "w") as f:
            f.write(CONFIG.format(path=os.path.join(self.dir, f"run{self.n}.db")))
        return path

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def fresh(files: Files) -> float:
    """[0]: spawn -> first answered call of a server on a new file."""
    t0 = time.perf_counter()
    s = Server(files.config())
    try:
        return answered(s.address) - t0
    finally:
        s.stop()


def restart(files: Files) -> tuple[float, float]:
    """[1]: kill -9 of the leader -> first answered call of its restarted successor, and
    the part of it until the successor listened (its start-up)."""
    config = files.config()
    first = Server(config)
    answered(first.address)
    submit(first.address)
    again: Server | None = None
    try:
        t0 = first.kill()
        again = Server(config)
        return answered(again.address) - t0, again.listening_at - t0
    finally:
        first.stop()
        if again is not None:
            again.stop()


def standby(files: Files) -> float:
    """[2]: kill -9 of the leader -> first answered call of the standby."""
    config = files.config()
    leader = Server(config)
    answered(leader.address)
    submit(leader.address)
    second = Server(config)
    try:
        second.expect("event=awaiting_leadership", TIMEOUT_S)
        if not refuses(second.address):
            raise RuntimeError("the second server does not stand by")
        time.sleep(0.2)  # settled: it has looked at the file and waits
        t0 = leader.kill()
        return answered(second.address) - t0
    finally:
        leader.stop()
        second.stop()


def _spread(xs: list[float]) -> str:
    return (
        f"median {statistics.median(xs) * 1e3:,.0f} ms  "
        f"(min {min(xs) * 1e3:,.0f}, max {max(xs) * 1e3:,.0f})"
    )


def bench(runs: int) -> int:
    files = Files()
    floor: list[float] = []
    restarts: list[float] = []
    startups: list[float] = []  # of [1]: until the successor listened
    standbys: list[float] = []
    try:
        for _ in range(runs):
            floor.append(fresh(files))
            took, started = restart(files)
            restarts.append(took)
            startups.append(started)
            standbys.append(standby(files))
    finally:
        files.close()
    lease = LEADER_LEASE_S
    r, sb, f0 = (statistics.median(xs) for xs in (restarts, standbys, floor))
    ok_restart, ok_standby = r <= TARGET_S, sb <= TARGET_S
    print(f"[0]  fresh start, spawn -> first answer   {_spread(floor)}")
    print(
        f"[1]  restart after kill -9, kill -> answer  {_spread(restarts)}  "
        f"= {r / lease:.3f}x the {lease:g} s lease; {(r - f0) * 1e3:+,.0f} ms over [0]  "
        f"(target <= {TARGET_S:g} s) {verdict(ok_restart)}"
    )
    up = statistics.median(startups)
    print(
        f"     of which kill -> listening (process start-up) median {up * 1e3:,.0f} ms, "
        f"then leading and answering median {(r - up) * 1e3:,.0f} ms"
    )
    print(
        f"[2]  standby after kill -9, kill -> answer  {_spread(standbys)}  "
        f"= {sb / lease:.3f}x the {lease:g} s lease  (target <= {TARGET_S:g} s) "
        f"{verdict(ok_standby)}"
    )
    print(f"     baseline: the dead leader's lease, {lease:g} s, which [1] and [2] waited before")
    print(f"targets:  {int(ok_restart) + int(ok_standby)}/2 met")
    return 0


def _header(title: str, runs: int) -> None:
    print_about(title, f"; grpcio {grpc.__version__}")
    print_cpus()
    print(
        f"sizes:    {runs} interleaved runs of [0]/[1]/[2]; lease {LEADER_LEASE_S:g} s "
        f"(leader_lease_s default); polls every {POLL_S * 1e3:g} ms"
    )
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=None, help=f"runs per phase ({RUNS})")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs (a smoke run)")
    args = ap.parse_args(argv)
    runs = args.runs if args.runs is not None else QUICK_RUNS if args.quick else RUNS
    if runs < 1:
        ap.error("--runs must be >= 1")
    _header("cronoq takeover benchmark" + (" (--quick)" if args.quick else ""), runs)
    return bench(runs)


if __name__ == "__main__":
    sys.exit(main())
