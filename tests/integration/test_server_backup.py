"""`cronoq-server backup` (docs/backups.md): an online copy of a SQLite store taken while a real
server commits submits to it, checked task by task, and the command's refusals.

The tests are plain functions that run their own event loops: starting two servers and a
backup process may take longer than the async tests' time limit on a loaded machine. Nothing
waits on time: each step waits for a log line, a process's exit or a submit's answer."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cronoq.client import Client, task
from cronoq.store import SqliteStore
from cronoq.store.base import COLUMN
from cronoq.store.sqlite import SCHEMA_VERSION
from helpers.servers import COMMAND, PORT0, Server, server_command, write

PRELOAD = 2000  # tasks in the store before the backup starts (a few MiB: many backup steps)
PRELOAD_PAYLOAD = 1500  # bytes each
SAFETY_S = 300.0  # only a hang gets near it

pytestmark = pytest.mark.realtime


_run = functools.partial(server_command, timeout=SAFETY_S)


def _store_config(tmp_path: Path, path: Path, name: str = "server.toml") -> str:
    return write(tmp_path, PORT0 + f'[store]\nkind = "sqlite"\npath = "{path}"\n', name)


def _stored(path: Path) -> tuple[dict[int, bytes], Any]:
    """The tasks of a store file as cronoq's SqliteStore opens and loads it (id: payload), and
    its leader row."""

    async def load() -> dict[int, bytes]:
        store = SqliteStore(path)
        await store.open()
        try:
            stored = await store.load()
        finally:
            await store.close(release=False)
        return {row[COLUMN["id"]]: row[COLUMN["payload"]] for row in stored.tasks}

    tasks = asyncio.run(load())
    db = sqlite3.connect(path)
    try:
        leader = db.execute("SELECT epoch, holder, expires_unix_ns FROM cronoq_leader").fetchone()
    finally:
        db.close()
    return tasks, leader


def _integrity(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("PRAGMA integrity_check")]
    finally:
        db.close()


class Run:
    """What happened around one backup: the submits acknowledged before it began and while it
    ran, and the backup process's answer."""

    preloaded: dict[int, bytes]
    before: dict[int, bytes]
    during: dict[int, bytes]
    acked: dict[int, bytes]
    code: int
    stdout: str
    stderr: str


async def _submit_during_backup(address: str, config: str, out: Path) -> Run:
    run = Run()
    acked: list[tuple[int, bytes]] = []
    stop = asyncio.Event()
    started = asyncio.Event()
    async with Client(address) as client:
        # A store of a few MiB, so that the copy takes many steps of one page.
        run.preloaded = {}
        for batch in range(PRELOAD // 500):
            payloads = [
                f"pre-{batch}-{i}-".encode().ljust(PRELOAD_PAYLOAD, b"x") for i in range(500)
            ]
            answers = await client.submit_batch([task(p) for p in payloads])
            run.preloaded.update((a.id, p) for a, p in zip(answers, payloads, strict=True))

        async def submit_forever() -> None:
            i = 0
            while not stop.is_set():
                payload = f"live-{i}".encode()
                answer = await client.submit(payload, key=payload.decode(), call_timeout=SAFETY_S)
                acked.append((answer.id, payload))
                started.set()
                i += 1

        submitter = asyncio.create_task(submit_forever())
        try:
            await asyncio.wait_for(started.wait(), SAFETY_S)
            # Every submit answered by now was acknowledged before the backup began.
            before = len(acked)
            proc = await asyncio.create_subprocess_exec(
                *COMMAND,
                "backup",
                "-c",
                config,
                "--step",
                "1",
                str(out),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k != "CRONOQ_CONFIG"},
            )
            stdout, stderr = await asyncio.wait_for(proc.communicate(), SAFETY_S)
            ended = len(acked)
        finally:
            stop.set()
            await asyncio.wait_for(submitter, SAFETY_S)
        # The server still leads and answers after the backup.
        after = await client.submit(b"after", call_timeout=SAFETY_S)
        acked.append((after.id, b"after"))
    run.before = dict(acked[:before])
    run.during = dict(acked[before:ended])
    run.acked = {**run.preloaded, **dict(acked)}
    run.code = proc.returncode if proc.returncode is not None else -1
    run.stdout, run.stderr = stdout.decode(), stderr.decode()
    return run


def test_backup_while_a_server_commits(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    config = _store_config(tmp_path, db)
    out = tmp_path / "backups" / "store-backup.db"
    out.parent.mkdir()
    server = Server(config)
    try:
        server.wait_for("event=ready")
        run = asyncio.run(_submit_during_backup(server.address, config, out))
    finally:
        server.kill()

    assert run.code == 0, run.stderr
    assert run.stderr == ""
    lines = run.stdout.splitlines()
    assert len(lines) == 1, lines
    match = re.fullmatch(
        rf"backed up {re.escape(str(db))} to {re.escape(str(out))}: (\d+) tasks, (\d+) bytes, "
        rf"schema version {SCHEMA_VERSION}",
        lines[0],
    )
    assert match, lines[0]
    # The server went on answering submits while the copy was taken.
    assert run.during, "no submit was answered while the backup ran"
    # OUT is one file, and no temp file is left next to it.
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]

    assert _integrity(out) == ["ok"]
    tasks, leader = _stored(out)
    assert int(match.group(1)) == len(tasks)
    assert int(match.group(2)) == out.stat().st_size
    # Every submit acknowledged before the backup began is in it, with its payload.
    for task_id, payload in {**run.preloaded, **run.before}.items():
        assert tasks.get(task_id) == payload, task_id
    # And nothing else than what was submitted: the copy is the store as of one commit.
    for task_id, payload in tasks.items():
        assert run.acked.get(task_id) == payload, task_id
    # The copy names no leader: a server started on it leads at once.
    epoch, holder, expires = leader
    assert epoch >= 1 and holder is None and expires == 0

    # Restored: a second server on the copy serves the tasks acknowledged before the backup.
    restored = Server(_store_config(tmp_path, out, "restored.toml"))
    try:
        restored.wait_for("event=ready")

        async def look() -> None:
            async with Client(restored.address) as client:
                for task_id, payload in run.before.items():
                    info = await client.get(task_id)
                    assert (info.key, info.done) == (payload.decode(), False)
                # New ids do not repeat the copy's.
                fresh = await client.submit(b"fresh", call_timeout=SAFETY_S)
                assert fresh.id not in tasks

        asyncio.run(look())
    finally:
        restored.kill()


# --- refusals -----------------------------------------------------------------------------------


def _empty_store(path: Path) -> None:
    async def create() -> None:
        store = SqliteStore(path)
        await store.open()
        await store.close()

    asyncio.run(create())


def _refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    """One `Error:` line matching `message`, nothing on stdout, exit code 1."""
    assert result.returncode == 1, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(f"Error: {message}", lines[0]), lines[0]


def test_no_store_configured(tmp_path: Path) -> None:
    out = tmp_path / "out.db"
    _refused(_run("backup", str(out)), r"no store configured: give -c CONFIG .*--store PATH")
    memory = write(tmp_path, PORT0)
    _refused(
        _run("backup", "-c", memory, str(out)),
        rf"no store configured: {re.escape(memory)} keeps tasks in memory .*",
    )
    # CRONOQ_CONFIG stands for -c, as for the server.
    _refused(
        _run("backup", str(out), env={"CRONOQ_CONFIG": memory}),
        "no store configured: .* keeps tasks in memory .*",
    )
    assert not out.exists()


def test_postgres_store_names_pg_dump(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        PORT0 + '[store]\nkind = "postgres"\nurl_env = "TEST_PG_URL"\nschema = "cronoq_jobs"\n',
    )
    url = "postgresql://cronoq:secret@localhost/cronoq"
    result = _run("backup", "-c", config, "/srv/backups/jobs.dump", env={"TEST_PG_URL": url})
    _refused(
        result,
        re.escape(
            f"the store of {config} is PostgreSQL (schema cronoq_jobs): this command copies "
            "SQLite files; back it up with pg_dump: pg_dump --format=custom "
            '--schema=cronoq_jobs --file=/srv/backups/jobs.dump --dbname="$TEST_PG_URL"'
        ),
    )
    assert "secret" not in result.stderr  # the URL is named by its variable only


@pytest.mark.skipif(
    shutil.which("pg_dump") is None or shutil.which("pg_restore") is None,
    reason="needs pg_dump and pg_restore",
)
def test_the_pg_dump_command_backs_up_and_restores(tmp_path: Path, pg: Any) -> None:
    """The command printed for a PostgreSQL store dumps its schema while the server runs, and
    docs/backups.md's pg_restore command puts it back."""
    config = write(
        tmp_path,
        PORT0 + f'[store]\nkind = "postgres"\nurl_env = "TEST_PG_URL"\nschema = "{pg.schema}"\n',
    )
    env = {"TEST_PG_URL": pg.url}
    dump = tmp_path / "store.dump"

    async def submit(address: str, keys: list[str]) -> list[int]:
        async with Client(address) as client:
            return [
                (await client.submit(k.encode(), key=k, call_timeout=SAFETY_S)).id for k in keys
            ]

    server = Server(config, env=env)
    try:
        server.wait_for("event=ready")
        kept = asyncio.run(submit(server.address, [f"kept-{i}" for i in range(5)]))
        result = _run("backup", "-c", config, str(dump), env=env)
        assert result.returncode == 1
        command = result.stderr.partition("back it up with pg_dump: ")[2].strip()
        assert command.startswith("pg_dump "), result.stderr
        done = subprocess.run(
            ["sh", "-c", command], env={**os.environ, **env}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        lost = asyncio.run(submit(server.address, ["after-the-dump"]))
    finally:
        server.kill()

    restore = (
        "pg_restore --clean --if-exists --single-transaction --exit-on-error "
        f'--dbname="$TEST_PG_URL" {dump}'
    )
    done = subprocess.run(
        ["sh", "-c", restore], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr

    restored = Server(config, env=env)
    try:
        restored.wait_for("event=ready")

        async def look() -> None:
            async with Client(restored.address) as client:
                for i, task_id in enumerate(kept):
                    assert (await client.get(task_id)).key == f"kept-{i}"
                # The task submitted after the dump is not in the restored store.
                page = await client.list_tasks()
                assert {t.id for t in page.tasks} == set(kept), lost

        asyncio.run(look())
    finally:
        restored.kill()


def test_existing_out_is_refused_unless_force(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    _empty_store(db)
    out = tmp_path / "out.db"
    out.write_bytes(b"an older backup")
    _refused(
        _run("backup", "--store", str(db), str(out)),
        f"{re.escape(str(out))} exists: give --force to replace it",
    )
    assert out.read_bytes() == b"an older backup"
    result = _run("backup", "--store", str(db), "--force", str(out))
    assert result.returncode == 0, result
    size = out.stat().st_size
    assert (
        result.stdout
        == f"backed up {db} to {out}: 0 tasks, {size} bytes, schema version {SCHEMA_VERSION}\n"
    )
    assert _integrity(out) == ["ok"]
    assert _stored(out)[0] == {}


def test_unreadable_store_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.db"
    missing = tmp_path / "missing.db"
    _refused(
        _run("backup", "--store", str(missing), str(out)),
        f"cannot read the store {re.escape(str(missing))}: no such file",
    )
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all, but long enough to look like one? " * 100)
    _refused(
        _run("backup", "--store", str(junk), str(out)),
        f"cannot read the store {re.escape(str(junk))}: file is not a database",
    )
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    _refused(
        _run("backup", "--store", str(other), str(out)),
        f"cannot read the store {re.escape(str(other))}: not a cronoq database",
    )
    # A store named by the configuration: the same refusal.
    config = _store_config(tmp_path, missing)
    _refused(
        _run("backup", "-c", config, str(out)),
        f"cannot read the store {re.escape(str(missing))}: no such file",
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []
    assert not out.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_store_without_read_permission_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    _empty_store(db)
    db.chmod(0)
    out = tmp_path / "out.db"
    result = _run("backup", "--store", str(db), str(out))
    _refused(result, f"cannot read the store {re.escape(str(db))}: .*")
    assert not out.exists()


def test_the_server_command_line_is_unchanged(tmp_path: Path) -> None:
    """Only a first argument of exactly `backup` is the subcommand: anywhere else it is the
    server's usage error, as before."""
    config = write(tmp_path, PORT0)
    result = _run("-c", config, "backup")
    assert result.returncode == 2
    assert "unrecognized arguments: backup" in result.stderr
    result = _run("--check", "-c", config)
    assert (result.returncode, result.stdout) == (0, "configuration is valid\n")
    result = _run("backup", "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: cronoq-server backup")
