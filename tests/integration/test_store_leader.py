"""Leader and standbys on one SQLite file, as separate processes.

docs/durability.md, "Leader and standbys": one process leads, the others wait inside
`start()`; a clean stop hands over at once, and so does the death of a leader on this host (the
kernel frees its lock file), while a lease whose holder may still live (another host, a holder
without the lock) is waited out; each new leader has the next epoch, which is the high 16 bits
of its task ids; a leader whose lease ran out with nobody taking over renews it and goes on,
one whose lease was taken over is fenced ("fenced: leadership lost") and writes nothing more.
Library processes are store_leader_child.py, driven over stdin/stdout; server processes are
`cronoq-server` (helpers/servers.py); the file is read with sqlite3. The last part drives
`SqliteStore` handles in this process (two handles are two processes to the lock file).

Takeovers that must not wait out a lease give it 60 s and allow TAKEOVER (30 s): a bound that
only a takeover that waited for the lease can miss, however slow the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq import Pool, Scheduler, SqliteStore
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.store import Batch
from cronoq.store.sqlite import _SCHEMA_V1, LOCK_SUFFIX, MIGRATIONS, SCHEMA_VERSION
from helpers.servers import PORT0, Server, leader_and_standby, write
from helpers.workers import EchoWorker

CHILD = Path(__file__).with_name("store_leader_child.py")
TTL = 1.0  # lease_ttl of the fencing tests (lease_renew = TTL / 4, lock_poll 0.05)
LOCK_POLL = 0.05
LEASE = 60.0  # the lease of the takeovers that must not wait it out
TAKEOVER = 30.0  # ... and how long they may take at most (see the module's docstring)
FENCED = "fenced: leadership lost"
# Waits for a child's answer are conditions; this bound only fails a hung one (a busy machine
# can take seconds to start a Python process or to commit).
LONG = 60.0


class Child:
    """One scheduler process; its stdout lines arrive on a queue (a thread reads them)."""

    def __init__(self, db: Path, name: str, lease_ttl: float) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(db), name, str(lease_ttl)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []  # every line read so far, in order
        self.unclaimed: list[str] = []  # lines read by `expect` but not the ones it wanted
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.seen.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str | tuple[str, ...], timeout: float = LONG) -> list[str]:
        """The words of the first line not yet claimed that starts with `prefix`."""
        for old in self.unclaimed:
            if old.startswith(prefix):
                self.unclaimed.remove(old)
                return old.split(" ")
        deadline = time.monotonic() + timeout
        while True:
            line: str | None
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                ended = self.proc.poll()
                why = f"exited ({ended})" if ended is not None else f"nothing within {timeout} s"
                raise AssertionError(
                    f"{self.name}: no {prefix!r} line: {why}; unclaimed lines: {self.unclaimed}"
                    + (f"; stderr: {self._stderr()}" if ended is not None else "")
                )
            if line.startswith(prefix):
                return line.split(" ")
            self.unclaimed.append(line)

    def _stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-2000:]

    def ask(self, command: str, answer: str, timeout: float = LONG) -> list[str]:
        self.send(command)
        return self.expect(answer, timeout)

    def started(self, timeout: float = LONG) -> tuple[int, float]:
        """Wait until it leads: (its epoch, the Unix time at which start() returned)."""
        words = self.expect("started", timeout)
        return int(words[1]), float(words[2])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """spawn(name, lease_ttl) starts a child on tmp_path's file; all are killed at the end."""
    children: list[Child] = []

    def start(name: str, lease_ttl: float = TTL) -> Child:
        c = Child(tmp_path / "cronoq.sqlite", name, lease_ttl)
        children.append(c)
        return c

    yield start
    for c in children:
        c.kill()


def read_file(db: Path) -> tuple[dict[int, tuple[Any, ...]], tuple[Any, ...]]:
    """Every task row (by id) and the leader row (epoch, holder, max_id) of the file."""
    with sqlite3.connect(db) as conn:
        tasks = {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT id, key, status, terminal, attempt, updated, message, output "
                "FROM cronoq_tasks"
            )
        }
        leader = conn.execute("SELECT epoch, holder, max_id FROM cronoq_leader").fetchone()
    conn.close()
    return tasks, leader


def lease_expiry(db: Path) -> float:
    """When the lease in the leader row runs out (Unix seconds)."""
    with sqlite3.connect(db) as conn:
        (ns,) = conn.execute("SELECT expires_unix_ns FROM cronoq_leader").fetchone()
    conn.close()
    return int(ns) / 1e9


def write_locked(db: Path) -> bool:
    """Does some connection hold the file's write lock (is a transaction open)?"""
    conn = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return True
    else:
        conn.execute("ROLLBACK")
        return False
    finally:
        conn.close()


def stopped(pid: int) -> bool:
    """Has SIGSTOP taken effect (state T in /proc)?"""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


def pause_between_transactions(child: Child, db: Path) -> float:
    """SIGSTOP the child at a moment it holds no write lock, and return when (Unix time).

    A process stopped inside a transaction keeps SQLite's write lock, and nobody can take the
    lease over until it resumes: no standby can ever lead then. (On a busy machine a commit
    lasts long enough for a pause to land in one now and then.) So pause, look, and if the
    lock is held, let it run on and pause again."""
    deadline = time.monotonic() + 30  # a safety net: it only fails a hung child
    while True:
        child.proc.send_signal(signal.SIGSTOP)
        while not stopped(child.pid):
            time.sleep(0.001)
        if not write_locked(db):
            return time.time()
        child.proc.send_signal(signal.SIGCONT)
        assert time.monotonic() < deadline, "the child never left its transactions"
        time.sleep(0.005)


def holder_pid(db: Path) -> int | None:
    holder = read_file(db)[1][1]
    return None if holder is None else int(holder.split(":")[-2])


def compact(result: dict[str, Any]) -> str:
    """A result as the child prints it."""
    return json.dumps(result, separators=(",", ":"))


def first_id(epoch: int) -> int:
    return epoch << 48 | 1


def test_standby_waits_in_start_and_takes_over_at_once_after_a_clean_stop(
    spawn: Callable[..., Child], tmp_path: Path
) -> None:
    ttl = 2.0
    a = spawn("A", ttl)
    epoch_a, _ = a.started()
    assert epoch_a == 1
    assert int(a.ask("submit a1 0", "submitted a1")[2]) == first_id(epoch_a)
    assert a.expect("result a1")[2] == compact({"by": "A", "attempt": 1})

    b = spawn("B", ttl)
    b.expect("starting")
    time.sleep(1.5 * ttl)  # longer than a lease: A renews it, B keeps waiting in start()
    assert [line for line in b.seen if line.startswith("started")] == []
    assert holder_pid(tmp_path / "cronoq.sqlite") == a.pid

    expiry = lease_expiry(tmp_path / "cronoq.sqlite")  # A's renewals only push it later
    a.ask("shutdown", "stopped")
    epoch_b, started_at = b.started(timeout=LONG)
    assert epoch_b == epoch_a + 1
    assert started_at < expiry, "a clean stop releases the lease: B need not wait it out"
    assert holder_pid(tmp_path / "cronoq.sqlite") == b.pid

    b_id = int(b.ask("submit b1 0", "submitted b1")[2])
    assert b_id == first_id(epoch_b) and b_id >> 48 == epoch_a + 1
    assert b.expect("result b1")[2] == compact({"by": "B", "attempt": 1})
    # B has A's finished task, its result and its key.
    assert b.ask("result a1", "result a1")[2] == compact({"by": "A", "attempt": 1})
    assert b.ask("submit a1 0", "submitted a1")[2] == str(first_id(epoch_a)), "deduplicated"


def test_a_result_is_seen_only_once_it_is_on_disk(
    spawn: Callable[..., Child], tmp_path: Path
) -> None:
    """What a leader shows its callers must survive it: a handle resolves after the commit
    (_durable.py: "handles resolve ... only after the rows of the same turn are committed"),
    so the file has the result by the time the child prints it."""
    a = spawn("A")
    a.started()
    for n in range(5):
        task_id = int(a.ask(f"submit t{n} 0", f"submitted t{n}")[2])
        assert a.expect(f"result t{n}")[2] == compact({"by": "A", "attempt": 1})
        row = read_file(tmp_path / "cronoq.sqlite")[0][task_id]
        assert row[1:4] == ("succeeded", 1, 1), f"t{n} was reported before it was written"


def test_a_killed_leaders_standby_and_successor_on_this_host_do_not_wait_out_its_lease(
    spawn: Callable[..., Child], tmp_path: Path
) -> None:
    db = tmp_path / "cronoq.sqlite"
    a = spawn("A", LEASE)
    epoch_a, _ = a.started()
    a.ask("submit done 0", "result done")
    long_id = a.ask("submit long 60", "submitted long")[2]
    assert a.expect("run long")[2:] == [long_id, "1"]

    b = spawn("B", LEASE)
    b.expect("starting")
    a.proc.send_signal(signal.SIGKILL)
    assert a.proc.wait(timeout=LONG) == -signal.SIGKILL
    expiry = lease_expiry(db)  # A's last renewal: final now

    epoch_b, started_at = b.started(timeout=TAKEOVER)
    assert epoch_b == epoch_a + 1
    assert started_at < expiry, "B waited out the lease of a leader that was gone"
    assert holder_pid(db) == b.pid

    # B has A's tasks: the finished one with its result, the running one counts its attempt
    # as used and runs again as attempt 2.
    assert b.ask("result done", "result done")[2] == compact({"by": "A", "attempt": 1})
    assert b.expect("run long")[2:] == [long_id, "2"]
    assert b.ask("status long", "status long")[2] == "running"
    assert int(b.ask("submit b1 0", "submitted b1")[2]) == first_id(epoch_b)
    assert b.expect("result b1")[2] == compact({"by": "B", "attempt": 1})  # (on disk now)

    # A process started after B's death (a restart) does not wait either.
    b.kill()
    expiry = lease_expiry(db)
    c = spawn("C", LEASE)
    epoch_c, started_at = c.started(timeout=TAKEOVER)
    assert epoch_c == epoch_b + 1 and started_at < expiry
    assert c.ask("result done", "result done")[2] == compact({"by": "A", "attempt": 1})
    assert c.ask("result b1", "result b1")[2] == compact({"by": "B", "attempt": 1})


def test_a_paused_leader_whose_lease_was_taken_is_fenced_and_writes_nothing(
    spawn: Callable[..., Child], tmp_path: Path
) -> None:
    db = tmp_path / "cronoq.sqlite"
    a = spawn("A")
    epoch_a, _ = a.started()
    a.ask("submit done 0", "result done")
    long_id = a.ask("submit long 60", "submitted long")[2]
    assert a.expect("run long")[2:] == [long_id, "1"]
    b = spawn("B")
    b.expect("starting")  # (its start-up is over before "soon" starts)
    # "soon" is still running when A is paused (3 s are far more than the pause takes to
    # land), and its time is up when A wakes (see below): A then tries to write its success.
    soon_id = a.ask("submit soon 3", "submitted soon")[2]
    assert a.expect("run soon")[2:] == [soon_id, "1"]
    soon_done = time.time() + 3.0  # (A started it before it said so)
    pause_between_transactions(a, db)
    expiry = lease_expiry(db)  # A renews no more while paused

    epoch_b, started_at = b.started(timeout=LONG)
    assert epoch_b == epoch_a + 1
    assert started_at >= expiry, "B led before A's lease ran out"
    # Both attempts A was running are counted as lost; B runs them again (for a minute).
    runs = sorted(tuple(b.expect("run")[1:]) for _ in range(2))
    assert runs == [("long", long_id, "2"), ("soon", soon_id, "2")]
    b1_id = int(b.ask("submit b1 0", "submitted b1")[2])
    assert b.expect("result b1")[2] == compact({"by": "B", "attempt": 1})
    settle = time.monotonic() + LONG  # B's own write of b1 may still be on its way
    while read_file(db)[0][b1_id][1] != "succeeded" and time.monotonic() < settle:
        time.sleep(0.01)
    before = read_file(db)
    assert before[1][0] == epoch_b and holder_pid(db) == b.pid
    assert before[0][int(soon_id)][1:4] == ("running", 0, 2)

    assert time.time() > expiry  # (B leads, so A's lease has run out)
    while time.time() < soon_done:  # "soon" has ended in A's time when it wakes
        time.sleep(0.05)
    a.proc.send_signal(signal.SIGCONT)
    # A steps down: the handle of its running task fails, its API refuses with the reason.
    assert " ".join(a.expect(("failed long", "result long"))) == f"failed long shutdown {FENCED}"
    assert " ".join(a.ask("submit late 0", "error submit")) == (
        f"error submit SchedulerError: {FENCED}"
    )
    assert " ".join(a.ask("status done", "error status")) == (
        f"error status SchedulerError: {FENCED}"
    )
    time.sleep(0.3)  # time for any stray write

    after = read_file(db)
    assert after[0] == before[0], "the fenced leader changed task rows"
    assert after[1] == before[1], "the fenced leader changed the leader row"
    assert a.proc.stderr is not None
    a.kill()
    assert FENCED in a.proc.stderr.read()
    # "soon" ended in A's memory, but A could not write that: its handle must fail as well,
    # not report a success that the file does not have (B is running it again).
    assert " ".join(a.expect(("failed soon", "result soon"))) == f"failed soon shutdown {FENCED}"


# --- cronoq-server processes ------------------------------------------------------------------


def server_config(tmp_path: Path, db: Path, lease: float) -> str:
    store = f'[store]\nkind = "sqlite"\npath = "{db}"\nleader_lease_s = {lease}\n'
    return write(tmp_path, PORT0 + store)


def grpc_submit(address: str, key: str, payload: bytes = b"x", wait: bool = False) -> Any:
    with grpc.insecure_channel(address) as ch:
        request = pb.SubmitRequest(task=pb.TaskSpec(key=key, payload=payload), wait=wait)
        return cronoq_pb2_grpc.TasksStub(ch).Submit(request, timeout=LONG)


def grpc_get(address: str, key: str) -> Any:
    with grpc.insecure_channel(address) as ch:
        request = pb.GetRequest(task=pb.TaskRef(key=key))
        return cronoq_pb2_grpc.TasksStub(ch).Get(request, timeout=LONG)


def worker_ids(address: str) -> list[int]:
    with grpc.insecure_channel(address) as ch:
        listed = cronoq_pb2_grpc.AdminStub(ch).ListWorkers(pb.Empty(), timeout=LONG)
        return [w.id for w in listed.workers]


def test_a_server_killed_and_started_again_serves_without_waiting_out_its_lease(
    tmp_path: Path, servers: list[Server]
) -> None:
    db = tmp_path / "q.db"
    config = server_config(tmp_path, db, LEASE)
    first = Server(config)
    servers.append(first)
    first.wait_for("event=ready")
    before = grpc_submit(first.address, "before")
    first.kill()  # SIGKILL
    expiry = lease_expiry(db)

    again = Server(config)
    servers.append(again)
    again.wait_for("event=ready", timeout=TAKEOVER)
    assert time.time() < expiry, "the restart waited out its predecessor's lease"
    info = grpc_get(again.address, "before")
    assert (info.id, info.status) == (before.id, pb.TASK_STATUS_READY)
    assert grpc_submit(again.address, "after").id >> 48 == (before.id >> 48) + 1


def test_a_standby_server_takes_over_from_a_killed_leader_without_waiting_out_its_lease(
    tmp_path: Path, servers: list[Server]
) -> None:
    db = tmp_path / "q.db"
    config = server_config(tmp_path, db, LEASE)
    leader, standby = leader_and_standby(config, servers)
    before = grpc_submit(leader.address, "before")
    leader.kill()
    expiry = lease_expiry(db)

    standby.wait_for("event=ready", timeout=TAKEOVER)
    assert time.time() < expiry, "the standby waited out the dead leader's lease"
    assert grpc_get(standby.address, "before").id == before.id
    assert holder_pid(db) == standby.proc.pid


def test_a_lone_server_stalled_past_its_lease_keeps_leading_and_its_worker(
    tmp_path: Path, servers: list[Server]
) -> None:
    """No other process wants the file: a leader stalled (SIGSTOP: a stalled disk, a busy
    machine) until its lease ran out renews it on waking, keeps its worker streams and serves;
    it does not stand by."""
    db = tmp_path / "q.db"
    server = Server(server_config(tmp_path, db, 1.0))
    servers.append(server)
    server.wait_for("event=ready")
    worker = EchoWorker(server.address, slots=1)
    try:
        registered = worker.registered.get(timeout=LONG)
        assert grpc_submit(server.address, "warm", b"abc", wait=True).result.output == b"cba"
        epoch = read_file(db)[1][0]

        server.proc.send_signal(signal.SIGSTOP)
        while not stopped(server.proc.pid):
            time.sleep(0.001)
        expiry = lease_expiry(db)  # it renews no more while stopped
        while time.time() <= expiry + 0.2:  # until its lease has run out
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGCONT)

        done = grpc_submit(server.address, "after", b"xyz", wait=True)
        assert (done.result.status, done.result.output) == (pb.TASK_STATUS_SUCCEEDED, b"zyx")
        settle = time.monotonic() + LONG
        while lease_expiry(db) <= time.time():  # renewed (each commit and every 0.2 s)
            assert time.monotonic() < settle, "the lease was never renewed"
            time.sleep(0.01)
        assert read_file(db)[1][0] == epoch and holder_pid(db) == server.proc.pid
        assert worker_ids(server.address) == [registered.worker_id]
        assert (done.id, 1) in worker.seen
        assert worker.shutdown is None and worker.ended is None and worker.registered.empty()
    finally:
        worker.stop()
    assert server.terminate(timeout=LONG) == 0
    assert not [line for line in server.lines if "standing_by" in line or "fenced" in line]


# --- SqliteStore handles in this process -------------------------------------------------------

FAST = {"lease_renew": 0.2, "lock_poll": LOCK_POLL}


async def opened(db: Path, lease_ttl: float = LEASE) -> SqliteStore:
    store = SqliteStore(db, lease_ttl=lease_ttl, **FAST)
    await store.open()
    return store


def leader_row(db: Path) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.row_factory = sqlite3.Row
        return dict(conn.execute("SELECT * FROM cronoq_leader").fetchone())


def set_leader(db: Path, **columns: Any) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assignments = ", ".join(f"{name} = ?" for name in columns)
        conn.execute(f"UPDATE cronoq_leader SET {assignments}", tuple(columns.values()))
        conn.commit()


async def until(check: Callable[[], Any], what: str) -> None:
    give_up = time.monotonic() + 5.0
    while not check():
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


async def test_the_leader_row_says_where_the_holder_runs_and_that_it_has_the_lock(
    tmp_path: Path,
) -> None:
    db = tmp_path / "cronoq.sqlite"
    store = await opened(db)
    assert await store.lead() == 1
    row = leader_row(db)
    lock = os.stat(str(db) + LOCK_SUFFIX)
    assert row["host"] == f"{socket.gethostname()} {boot_id()} {lock.st_dev}:{lock.st_ino}"
    assert (row["pid"], row["lock_holder"]) == (os.getpid(), store.holder)
    await store.close()  # a clean stop clears the holder and the lock holder
    row = leader_row(db)
    assert (row["holder"], row["lock_holder"], row["expires_unix_ns"]) == (None, None, 0)


async def test_a_standby_waiting_here_takes_over_the_moment_the_holders_lock_is_freed(
    tmp_path: Path,
) -> None:
    db = tmp_path / "cronoq.sqlite"
    first = await opened(db)
    await first.lead()
    standby = await opened(db)
    waiting = asyncio.create_task(standby.lead())
    await until(lambda: standby._lock._waiting, "the standby to wait for the lock")
    await first.renew()
    assert not waiting.done()
    expiry = lease_expiry(db)
    await first.close(release=False)  # as at a death: the lease stays in the row
    assert await asyncio.wait_for(waiting, 5.0) == 2
    assert time.time() < expiry
    assert leader_row(db)["lock_holder"] == standby.holder
    await standby.close()


def _another_host(row: dict[str, Any]) -> dict[str, Any]:
    _, _, lock = row["host"].split(" ")
    return {"host": f"elsewhere 00000000-0000-0000-0000-000000000000 {lock}"}


def _another_lock_file(row: dict[str, Any]) -> dict[str, Any]:
    name, boot, _ = row["host"].split(" ")
    return {"host": f"{name} {boot} 1:1"}


def _without_the_lock(row: dict[str, Any]) -> dict[str, Any]:
    return {"lock_holder": None}


def _another_holder(row: dict[str, Any]) -> dict[str, Any]:
    return {"holder": "intruder:1:0000"}  # (its lock_holder is the old holder's)


@pytest.mark.parametrize(
    "change", [_another_host, _another_lock_file, _without_the_lock, _another_holder]
)
async def test_a_lease_whose_holder_may_still_live_is_waited_out(
    tmp_path: Path, change: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    """The networked-host rule: the lock file proves a death only for a holder on this host
    that had that very lock; any other unexpired lease is waited out."""
    db = tmp_path / "cronoq.sqlite"
    first = await opened(db)
    await first.lead()
    await first.close(release=False)  # the lock is free, the lease in the row runs on
    expiry = time.time() + 1.0
    set_leader(db, expires_unix_ns=int(expiry * 1e9), **change(leader_row(db)))
    standby = await opened(db)
    assert await asyncio.wait_for(standby.lead(), 5.0) == 2
    assert time.time() >= expiry, "took over a lease whose holder may still live"
    await standby.close()


def _file_at(db: Path, version: int, holder: str, expires: float) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        for statement in _SCHEMA_V1:
            conn.execute(statement)
        for v in range(1, version):
            for statement in MIGRATIONS[v]:
                conn.execute(statement)
        conn.execute(
            "INSERT INTO cronoq_meta VALUES ('application', 'cronoq'), ('schema_version', ?)",
            (str(version),),
        )
        conn.execute(
            "UPDATE cronoq_leader SET epoch = 5, max_id = ?, holder = ?, expires_unix_ns = ?",
            (5 << 48 | 9, holder, int(expires * 1e9)),
        )
        conn.commit()


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_older_files_are_migrated_and_a_lease_they_hold_is_waited_out(
    tmp_path: Path, version: int
) -> None:
    """A holder written before version 4 (a process of an older cronoq, maybe on this very
    host) says nothing of a lock: its lease is waited out."""
    db = tmp_path / "cronoq.sqlite"
    expiry = time.time() + 1.0
    _file_at(db, version, f"{socket.gethostname()}:{os.getpid()}:abcd", expiry)
    store = await opened(db)
    row = leader_row(db)
    assert {"host", "pid", "lock_holder"} <= set(row)
    assert (row["host"], row["pid"], row["lock_holder"]) == (None, None, None)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        meta = dict(conn.execute("SELECT key, value FROM cronoq_meta").fetchall())
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert await asyncio.wait_for(store.lead(), 5.0) == 6
    assert time.time() >= expiry
    assert (await store.load()).max_id == 5 << 48 | 9
    assert leader_row(db)["lock_holder"] == store.holder
    await store.close()


async def test_a_leader_whose_lease_ran_out_unopposed_renews_it_and_goes_on(
    tmp_path: Path,
) -> None:
    db = tmp_path / "cronoq.sqlite"
    store = await opened(db, lease_ttl=1.0)
    await store.lead()
    expiry = lease_expiry(db)
    await until(lambda: time.time() > expiry, "the lease to run out")  # nothing renewed it
    await store.commit_nowait(Batch(schedules=[("nightly", "{}", None, None, None)]))
    assert lease_expiry(db) > time.time()
    await store.renew()
    assert await store.prune(time.time()) == 0
    assert leader_row(db)["epoch"] == 1
    await store.close()


async def test_a_fenced_leader_gives_its_lock_up(tmp_path: Path) -> None:
    """A leader that finds another holder frees the lock file at once, so that the new
    leader (here: one that took over after the lease) gets it at its next commit."""
    db = tmp_path / "cronoq.sqlite"
    old = await opened(db, lease_ttl=1.0)
    await old.lead()
    expiry = lease_expiry(db)
    new = await opened(db)
    await until(lambda: time.time() > expiry, "the lease to run out")
    assert await asyncio.wait_for(new.lead(), 5.0) == 2
    assert leader_row(db)["lock_holder"] is None  # the old leader still has the lock
    with pytest.raises(Exception, match="fenced: leadership lost"):
        await old.renew()
    await new.renew()
    assert leader_row(db)["lock_holder"] == new.holder
    await old.close()
    await new.close()


async def test_a_pool_the_leader_paused_stays_paused_when_a_standby_takes_over(
    tmp_path: Path,
) -> None:
    """The pause is on disk once pause() returns: the leader's file handle then closes as
    at a death (the lease stays in the row, the lock file's lock is freed), and the standby
    that takes over finds the pool paused, with the task the leader left waiting in it."""
    db = tmp_path / "cronoq.sqlite"

    def scheduler(store: SqliteStore) -> Scheduler:
        pool = Pool("default", lambda ctx, payload: payload, max=2, initial=2, autoscale=False)
        return Scheduler([pool], store=store, shutdown_grace=0.0)

    first_store = await opened(db)
    first = scheduler(first_store)
    await first.start()
    standby = scheduler(await opened(db))
    taking_over = asyncio.create_task(standby.start())
    try:
        assert await first.pause("default")
        waiting = await first.submit("after the pause", key="waits")
        await first_store.close(release=False)
        await asyncio.wait_for(taking_over, TAKEOVER)
        pool = (await standby.snapshot()).pool("default")
        assert pool is not None and pool.paused
        assert await standby.status("waits") == "ready"
        await standby.resume("default")
        handle = await standby.handle(waiting.id)
        assert handle is not None
        assert await asyncio.wait_for(handle.result(), LONG) == "after the pause"
    finally:
        taking_over.cancel()
        await first.shutdown()
        await standby.shutdown()
