"""The operator's commands of `cronoq` as a user runs them: pause, resume and drain a pool,
search tasks, act on them in bulk, and the warnings of a wait on a pool that cannot run its
task; each a real process against a real `cronoq-server` process with raw workers.

Pools: `default` is served by an echo worker; the others get a worker only in the test that
needs one (`idle` never does, so its tasks stay pending)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.auth import CONFIG as AUTH_CONFIG
from helpers.auth import token
from helpers.servers import PORT0, LoggedProcess, serving_process
from helpers.workers import EchoWorker

COMMAND = [sys.executable, "-m", "cronoq.cli"]
POOLS = ("default", "idle", "calm", "slow", "spare")
CONFIG = PORT0 + "".join(f'[[pools]]\nname = "{name}"\nmax = 4\n' for name in POOLS)
ENV = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")} | {"COLUMNS": "100"}
NO_WORKER = "cronoq: warning: no worker serves pool '{}'; the task waits until one connects"
PAUSED = "cronoq: warning: pool '{}' is paused; the task waits until it is resumed"


def cronoq(server: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """`cronoq --server SERVER ARGS` run to its end, with no terminal on stdin."""
    return subprocess.run(
        [*COMMAND, "--server", server, *args],
        input="",
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        timeout=60,
    )


def submit(server: str, *args: str) -> int:
    done = cronoq(server, "submit", *args)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def status(server: str, task: int) -> str:
    shown = cronoq(server, "--json", "get", str(task))
    assert shown.returncode == 0, shown.stderr
    return str(json.loads(shown.stdout)["status"])


def statuses(server: str, *args: str) -> dict[int, str]:
    """The status of each task `cronoq search ARGS` finds, by id."""
    return {t["id"]: t["status"] for t in searched(server, *args, "--limit", "1000")["tasks"]}


def searched(server: str, *args: str) -> dict[str, Any]:
    done = cronoq(server, "--json", "search", *args)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def ids_of(document: dict[str, Any]) -> list[int]:
    return [t["id"] for t in document["tasks"]]


def pool_state(server: str, pool: str) -> dict[str, Any]:
    snapshot = json.loads(cronoq(server, "snapshot").stdout)
    found: dict[str, Any] = next(p for p in snapshot["pools"] if p["name"] == pool)
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the server as the command takes it, its gRPC address for raw workers)."""
    with serving_process(tmp_path_factory.mktemp("ops"), CONFIG) as s:
        worker = EchoWorker(s.address, slots=2)
        worker.registered.get(timeout=30)
        yield f"http://{s.address}", s.address
        worker.stop()


@pytest.fixture(scope="module")
def server(served: tuple[str, str]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def address(served: tuple[str, str]) -> str:
    return served[1]


# --- pause, resume, drain ---------------------------------------------------------------------


def test_a_paused_pool_starts_nothing_until_resumed(server: str, address: str) -> None:
    worker = EchoWorker(address, slots=1, pool="calm")
    worker.registered.get(timeout=30)
    try:
        paused = cronoq(server, "pause", "calm")
        assert (paused.returncode, paused.stdout) == (0, "paused pool calm\n")
        again = cronoq(server, "--json", "pause", "calm")
        assert json.loads(again.stdout) == {"pool": "calm", "paused": True, "changed": False}
        task = submit(server, "x", "--pool", "calm")
        # a worker with a free slot is there, and the task still waits: one warning says why
        waited = cronoq(server, "wait", str(task), "--timeout", "2s")
        assert waited.returncode == 124
        warning, error = waited.stderr.splitlines()
        assert warning == PAUSED.format("calm")
        assert error.startswith("cronoq: error: timeout: ")
        assert status(server, task) == "ready" and worker.seen == []
        frame = cronoq(server, "top", "--once")
        assert "paused: calm (cronoq resume POOL)" in frame.stdout
        resumed = cronoq(server, "resume", "calm")
        assert (resumed.returncode, resumed.stdout) == (0, "resumed pool calm\n")
        done = cronoq(server, "--json", "wait", str(task), "--timeout", "30s")
        assert (done.returncode, json.loads(done.stdout)["output"]) == (0, "x")
        assert cronoq(server, "resume", "calm").stdout == "pool calm was not paused\n"
        unknown = cronoq(server, "pause", "nosuch")
        assert unknown.returncode == 3 and "nosuch" in unknown.stderr
    finally:
        worker.stop()


def test_drain_waits_until_the_running_attempts_end(server: str, address: str) -> None:
    worker = EchoWorker(address, slots=1, pool="slow", hold=True)
    worker.registered.get(timeout=30)
    try:
        submit(server, "job", "--pool", "slow")
        lease = worker.held.get(timeout=30)
        short = cronoq(server, "drain", "slow", "--timeout", "300ms", "--interval", "100ms")
        assert short.returncode == 124
        assert short.stderr.splitlines() == [  # one progress line per change, not per look
            "cronoq: pool slow paused; 1 attempt(s) still running",
            "cronoq: error: timeout: pool slow still runs 1 attempt(s) after 0.3s; it stays paused",
        ]
        assert pool_state(server, "slow")["paused"] is True
        drain = LoggedProcess(
            [*COMMAND, "--server", server, "drain", "slow", "--interval", "100ms"],
            env=ENV,
            merged=True,
        )
        try:
            drain.wait_for(r"^cronoq: pool slow paused; 1 attempt\(s\) still running$")
            worker.complete(lease, b"done")
            drain.wait_for(r"^drained pool slow: paused, nothing running$")
            assert drain.wait() == 0
        finally:
            drain.kill()
        assert pool_state(server, "slow")["busy"] == 0
        drained = cronoq(server, "--json", "drain", "slow")  # nothing runs: at once
        assert json.loads(drained.stdout) == {"pool": "slow", "paused": True, "drained": True}
    finally:
        cronoq(server, "resume", "slow")
        worker.stop()


# --- search -----------------------------------------------------------------------------------


def test_search_filters_sorts_and_pages(server: str) -> None:
    """The options reach the server (test_client.py covers each filter's meaning)."""
    ids = [
        submit(server, "s", "--pool", "idle", "--kind", f"s-{kind}", "--key", f"search-{n}",
               "--tag", "run=s1")
        for n, kind in enumerate("aba")
    ]  # fmt: skip
    run = ("--tag", "run=s1", "--pool", "idle", "--status", "ready", "--key-prefix", "search-")
    newest = searched(server, *run, "--since", "1h", "--until", "2200-01-01T00:00:00Z")
    assert (ids_of(newest), newest["total"]) == (ids[::-1], 3)  # newest first by default
    assert ids_of(searched(server, *run, "--sort", "kind", "--asc")) == [ids[0], ids[2], ids[1]]
    assert ids_of(searched(server, "--kind", "s-b", "--key", "search-1")) == [ids[1]]
    assert searched(server, *run, "--until", "1h")["total"] == 0
    first = cronoq(server, "search", *run, "--limit", "1", "--offset", "1", "--asc")
    assert first.returncode == 0, first.stderr
    rows = [line.split() for line in first.stdout.splitlines()[2:]]
    assert [row[:7] for row in rows] == [
        [str(ids[1]), "ready", "idle", "search-1", "s-b", "0/3", "-"]
    ]
    assert first.stderr == "cronoq: 1 of 3 matching tasks; next page: --offset 2\n"
    bad = cronoq(server, "search", "--since", "last week")
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_search_shows_the_worker_of_the_latest_attempt(server: str) -> None:
    done = json.loads(cronoq(server, "--json", "submit", "w", "--wait").stdout)
    (echo,) = [w for w in json.loads(cronoq(server, "--json", "workers").stdout)
               if w["pool"] == "default"]  # fmt: skip
    (row,) = searched(server, "--id", str(done["id"]))["tasks"]
    assert (row["worker_name"], row["worker_id"]) == ("echo", echo["id"])
    table = cronoq(server, "search", "--id", str(done["id"]))
    assert table.stdout.splitlines()[0].split()[6] == "worker"
    assert table.stdout.splitlines()[2].split()[6] == f"echo#{echo['id']}"


# --- bulk -------------------------------------------------------------------------------------


def test_bulk_counts_first_then_cancels_retries_and_deletes(server: str) -> None:
    ids = [submit(server, "b", "--pool", "idle", "--tag", "batch=b1") for _ in range(3)]
    other = submit(server, "b", "--pool", "idle", "--tag", "batch=b9")
    batch = ("--tag", "batch=b1")
    dry = cronoq(server, "bulk", "cancel", *batch, "--dry-run")
    assert (dry.returncode, dry.stdout) == (0, "3 tasks match; 3 would be cancelled\n")
    refused = cronoq(server, "bulk", "cancel", *batch)  # no terminal to confirm on
    assert refused.returncode == 2
    assert "add --yes, or count them first with --dry-run" in refused.stderr
    assert statuses(server, *batch) == dict.fromkeys(ids, "ready")
    done = cronoq(server, "--json", "bulk", "cancel", "--pool", "idle", *batch, "--yes")
    assert json.loads(done.stdout) == {
        "action": "cancel", "dry_run": False, "matched": 3, "affected": 3,
        "unavailable_shards": [],
    }  # fmt: skip
    assert statuses(server, *batch) == dict.fromkeys(ids, "cancelled")
    assert status(server, other) == "ready"
    retried = cronoq(server, "bulk", "retry", *batch, "--yes")
    assert retried.stdout == "3 tasks match; 3 submitted again\n"
    deleted = cronoq(server, "bulk", "delete", *batch, "-y")
    assert deleted.stdout == "6 tasks match; 3 deleted from the history\n"  # the copies live on
    copies = searched(server, *batch)["tasks"]
    assert len(copies) == 3 and min(t["id"] for t in copies) > max(ids)
    assert {(t["pool"], t["key"], t["status"]) for t in copies} == {("idle", "", "ready")}
    gone = cronoq(server, "get", str(ids[0]))
    assert gone.returncode == 3 and "not_found" in gone.stderr
    cronoq(server, "bulk", "cancel", *batch, "--yes")


def in_terminal(server: str, answer: bytes, *args: str) -> tuple[int, str]:
    """`cronoq ARGS` on a terminal, answering its question, if it asks one, with `answer`: its
    exit code and everything it wrote."""
    screen, terminal = pty.openpty()
    proc = subprocess.Popen(
        [*COMMAND, "--server", server, *args], stdin=terminal, stdout=terminal, stderr=terminal,
        env=ENV,
    )  # fmt: skip
    os.close(terminal)
    out = b""
    asked = False
    try:
        end = time.monotonic() + 30  # a safety net for a hung command only
        while time.monotonic() < end:
            if select.select([screen], [], [], 0.1)[0]:
                try:
                    chunk = os.read(screen, 4096)
                except OSError:  # the command ended: its side of the terminal is closed
                    break
                out += chunk
            if not asked and b"[y/N]" in out:
                os.write(screen, answer + b"\n")
                asked = True
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
        os.close(screen)
    return code, out.decode().replace("\r\n", "\n")


def test_bulk_asks_on_a_terminal_with_the_count_of_a_dry_run(server: str) -> None:
    ids = [submit(server, "c", "--pool", "idle", "--tag", "batch=b2") for _ in range(2)]
    code, out = in_terminal(server, b"n", "bulk", "cancel", "--tag", "batch=b2")
    assert code == 0
    assert "2 tasks match; 2 would be cancelled. Go ahead? [y/N]" in out
    assert "cronoq: nothing changed" in out
    assert statuses(server, "--tag", "batch=b2") == dict.fromkeys(ids, "ready")
    code, out = in_terminal(server, b"y", "bulk", "cancel", "--tag", "batch=b2")
    assert code == 0 and out.rstrip().endswith("2 tasks match; 2 cancelled")
    assert statuses(server, "--tag", "batch=b2") == dict.fromkeys(ids, "cancelled")
    code, out = in_terminal(server, b"", "bulk", "cancel", "--tag", "batch=b2")
    assert code == 0 and "[y/N]" not in out  # nothing to cancel: nothing asked
    assert out.strip() == "cronoq: 2 tasks match; 0 would be cancelled: nothing changed"


# --- warnings ---------------------------------------------------------------------------------


def test_top_notes_the_pools_no_worker_serves(server: str) -> None:
    submit(server, "t", "--pool", "idle")
    frame = cronoq(server, "top", "--once")
    assert frame.returncode == 0, frame.stderr
    notes = [line.strip() for line in frame.stdout.splitlines() if "no worker serves" in line]
    assert len(notes) == 1
    assert re.fullmatch(r"pool idle: no worker serves this pool; \d+ tasks? waits?", notes[0])


def test_a_wait_on_a_pool_no_worker_serves_warns_once(server: str) -> None:
    # (longer than the checks' period: checked again, and still said once)
    waited = cronoq(server, "submit", "u", "--pool", "idle", "--wait", "--wait-timeout", "3s")
    assert waited.returncode == 124
    task, _ = waited.stdout.split("\n", 1)
    warning, error = waited.stderr.splitlines()
    assert warning == NO_WORKER.format("idle")
    assert error == f"cronoq: error: timeout: task {task} has not ended after 3.0 s"
    again = cronoq(server, "wait", task, "--timeout", "2500ms", "--output")
    assert again.returncode == 124
    assert again.stderr.splitlines()[0] == NO_WORKER.format("idle")
    assert len(again.stderr.splitlines()) == 2
    served = cronoq(server, "submit", "s", "--wait")
    assert (served.returncode, served.stderr) == (0, "")


def test_the_warning_comes_when_the_only_worker_leaves_during_the_wait(
    server: str, address: str
) -> None:
    worker = EchoWorker(address, slots=1, pool="spare", hold=True)
    worker.registered.get(timeout=30)
    waiting = LoggedProcess(
        [*COMMAND, "--server", server, "submit", "v", "--pool", "spare", "--wait"], env=ENV
    )
    try:
        worker.held.get(timeout=30)  # running: nothing to warn about yet
        worker.stop()
        waiting.wait_for(re.escape(NO_WORKER.format("spare")))
        back = EchoWorker(address, slots=1, pool="spare")
        try:
            assert waiting.wait() == 0
        finally:
            back.stop()
        assert waiting.lines.count(NO_WORKER.format("spare")) == 1
        assert len(waiting.lines) == 1
    finally:
        waiting.kill()


# --- roles ------------------------------------------------------------------------------------


def test_a_client_token_may_search_but_not_pause_drain_or_act_in_bulk(tmp_path: Path) -> None:
    with serving_process(tmp_path, AUTH_CONFIG) as s:
        client = {"CRONOQ_TOKEN": token("client")}
        admin = {"CRONOQ_TOKEN": token("admin")}
        for args in (
            ("pause", "a"),
            ("resume", "a"),
            ("drain", "a", "--timeout", "1s"),
            ("bulk", "cancel", "--dry-run"),
            ("bulk", "delete", "--pool", "a", "--yes"),
        ):
            refused = cronoq(s.address, *args, env=client)
            assert refused.returncode == 3, args
            assert refused.stderr.startswith("cronoq: error: permission_denied: "), args
        assert cronoq(s.address, "search", env=client).returncode == 0
        # a client may not read snapshots: its wait on a pool no worker serves stays silent
        quiet = cronoq(s.address, "submit", "q", "--pool", "b", "--wait", "--wait-timeout",
                       "1s", env=client)  # fmt: skip
        assert quiet.returncode == 124
        assert quiet.stderr.startswith("cronoq: error: timeout: ")
        told = cronoq(s.address, "submit", "q", "--pool", "b", "--wait", "--wait-timeout",
                      "2s", env=admin)  # fmt: skip
        assert told.stderr.splitlines()[0] == NO_WORKER.format("b")
        assert cronoq(s.address, "pause", "a", env=admin).stdout == "paused pool a\n"
