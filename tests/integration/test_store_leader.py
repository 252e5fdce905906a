"""Leader and standbys on one SQLite file, as separate processes (issue 4).

docs/durability.md, "Leader and standbys": one process leads, the others wait inside
`start()`; a clean stop hands over at once, a killed leader's lease runs out after lease_ttl;
each new leader has the next epoch, which is the high 16 bits of its task ids; a leader whose
lease was taken over is fenced ("fenced: leadership lost") and writes nothing more. Each
process is store_leader_child.py, driven over stdin/stdout; the file is read with sqlite3.
"""

from __future__ import annotations

import json
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHILD = Path(__file__).with_name("store_leader_child.py")
TTL = 1.0  # lease_ttl of the kill and fencing tests (lease_renew = TTL / 4, lock_poll 0.05)
LOCK_POLL = 0.05
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


def test_standby_takes_over_within_the_lease_after_the_leader_is_killed(
    spawn: Callable[..., Child], tmp_path: Path
) -> None:
    a = spawn("A")
    epoch_a, _ = a.started()
    a.ask("submit done 0", "result done")
    long_id = a.ask("submit long 60", "submitted long")[2]
    assert a.expect("run long")[2:] == [long_id, "1"]

    b = spawn("B")
    b.expect("starting")
    a.proc.send_signal(signal.SIGKILL)
    assert a.proc.wait(timeout=LONG) == -signal.SIGKILL
    expiry = lease_expiry(tmp_path / "cronoq.sqlite")  # A's last renewal: final now

    epoch_b, started_at = b.started(timeout=LONG)
    assert epoch_b == epoch_a + 1
    assert started_at >= expiry, "B led before A's lease ran out"
    assert holder_pid(tmp_path / "cronoq.sqlite") == b.pid

    # B has A's tasks: the finished one with its result, the running one counts its attempt
    # as used and runs again as attempt 2.
    assert b.ask("result done", "result done")[2] == compact({"by": "A", "attempt": 1})
    assert b.expect("run long")[2:] == [long_id, "2"]
    assert b.ask("status long", "status long")[2] == "running"
    assert int(b.ask("submit b1 0", "submitted b1")[2]) == first_id(epoch_b)


def test_a_paused_leader_whose_lease_was_taken_is_fenced_and_writes_nothing(
    spawn: Callable[..., Child], tmp_path: Path
) -> None:
    db = tmp_path / "cronoq.sqlite"
    a = spawn("A")
    epoch_a, _ = a.started()
    a.ask("submit done 0", "result done")
    long_id = a.ask("submit long 60", "submitted long")[2]
    assert a.expect("run long")[2:] == [long_id, "1"]
    # "soon" finishes while A is paused: on waking, A tries to write its success.
    soon_id = a.ask("submit soon 0.5", "submitted soon")[2]
    assert a.expect("run soon")[2:] == [soon_id, "1"]
    b = spawn("B")
    b.expect("starting")
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
