"""`cronoq-server backup [-c CONFIG | --store PATH] [--force] [--shard NAME] OUT`: an online
copy of a SQLite store, safe while a server writes it (docs/backups.md).

The command reads the store's file from the configuration the server uses (or from `--store`)
and copies it with SQLite's online backup API, never as bytes: a live WAL-mode store is the
database file plus its `-wal` file, and a plain copy of the two taken while the server commits
can be torn. How the copy goes:

* The source is opened read-only (`mode=ro`): the backup takes no leadership, touches neither
  the leader row nor the lock file, and writes nothing to the store.
* In WAL mode (every file a cronoq store has opened) one read transaction is held for the
  whole copy, which SQLite's backup copies `--step` pages at a time: the copy is the store as
  of one commit, and the server's commits go on meanwhile (a WAL reader blocks no writer).
  Without that snapshot, each step would read the file afresh and any commit between two steps
  would restart the copy from its first page: under a steady stream of submits, it would never
  end. Without WAL (a file no cronoq process has opened, so no server writes it) the copy is
  one step.
* The copy's leader row names no holder (its epoch and highest id issued are kept): a server
  started on the restored file leads at once instead of waiting out the copied lease.
* The copy goes to a temp file next to OUT, which is checked (`PRAGMA integrity_check`, and
  cronoq's own schema check: `SqliteStore.open()` on it), fsync'd, and only then linked into
  place as OUT (then the directory is fsync'd): OUT is never half written. An existing OUT is
  refused unless `--force`, which replaces it atomically.

Output: one line on stdout naming what was written (`backed up <store> to <OUT>: N tasks,
B bytes, schema version V`), exit 0. Any refusal or failure: one `Error: <reason>` line on
stderr and exit 1 (a bad command line: argparse's usage, exit 2), as `cronoq-server` itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote as url_quote

from cronoq.errors import SchedulerError
from cronoq.store.sqlite import APPLICATION, SCHEMA_VERSION, SqliteStore

from .config import ConfigError, StoreSettings, apply_overrides, read_config, validate

__all__ = ["BackupError", "Copied", "backup", "main", "pg_dump_command"]

DEFAULT_STEP = 1024  # pages per backup step (4 MiB with SQLite's default 4 KiB pages)
BUSY_TIMEOUT_S = 10.0  # waiting for a lock on the source (a rollback-journal file only)


class BackupError(Exception):
    """Why no backup was written: one line, said as `Error: <it>`."""


@dataclass(frozen=True)
class Copied:
    """What a backup wrote."""

    source: str
    out: str
    tasks: int
    bytes: int
    schema_version: int

    def line(self) -> str:
        return (
            f"backed up {self.source} to {self.out}: {self.tasks} tasks, {self.bytes} bytes, "
            f"schema version {self.schema_version}"
        )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cronoq-server backup",
        description="Copy a SQLite store while a server uses it (SQLite's online backup), "
        "check the copy and put it in place as OUT.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "-c",
        "--config",
        metavar="PATH",
        help="the server's TOML configuration (env CRONOQ_CONFIG): its [store] names the file",
    )
    source.add_argument("--store", metavar="PATH", help="the SQLite store file itself")
    p.add_argument(
        "--shard",
        metavar="NAME",
        help="the shard whose store to copy, for a [store] path with {shard} (env CRONOQ_SHARD)",
    )
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument(
        "--step",
        metavar="PAGES",
        type=_pages,
        default=DEFAULT_STEP,
        help=f"pages copied per backup step (default {DEFAULT_STEP})",
    )
    p.add_argument("out", metavar="OUT", help="the backup file to write")
    return p


def _pages(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of pages >= 1 (got {text!r})")
    return n


def main(argv: Sequence[str]) -> int:
    """`cronoq-server backup ...` (the arguments after `backup`): the exit code."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    # Nothing of the server's logging: configuration warnings (a URL written in the file) are
    # the server's business, and this command says everything in its one line.
    quiet = logging.NullHandler()
    root = logging.getLogger()
    root.addHandler(quiet)
    try:
        path = args.store if args.store is not None else _configured_path(args)
        copied = backup(path, args.out, force=args.force, step=args.step)
    except BackupError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        for line in exc.errors:
            print(f"Error: {line}", file=sys.stderr)
        return 1
    finally:
        root.removeHandler(quiet)
    print(copied.line())
    return 0


def _configured_path(args: argparse.Namespace) -> str:
    """The SQLite file the server's configuration names; BackupError for any other store."""
    config = args.config or os.environ.get("CRONOQ_CONFIG") or None
    if config is None:
        raise BackupError(
            "no store configured: give -c CONFIG (or CRONOQ_CONFIG) naming the server's "
            "configuration, or --store PATH"
        )
    shard = args.shard or os.environ.get("CRONOQ_SHARD") or None
    cfg = validate(apply_overrides(read_config(Path(config)), shard=shard))
    store = cfg.store
    if store.kind == "memory":
        raise BackupError(
            f'no store configured: {config} keeps tasks in memory ([store] kind = "memory"), '
            "so there is nothing to back up"
        )
    if store.kind == "postgres":
        raise BackupError(
            f"the store of {config} is PostgreSQL (schema {store.schema}): this command copies "
            f"SQLite files; back it up with pg_dump: {pg_dump_command(store, args.out)}"
        )
    assert store.path is not None  # validated
    return store.path


def pg_dump_command(store: StoreSettings, out: str) -> str:
    """The pg_dump command line that dumps a PostgreSQL store's schema (and nothing else) to
    `out`, in pg_dump's custom format (for pg_restore). The URL is named by its variable, never
    written out: it may hold a password."""
    assert store.schema is not None
    # pg_dump folds an unquoted name to lower case: a name with capitals is quoted for it.
    name = store.schema if store.schema == store.schema.lower() else f'"{store.schema}"'
    url = f'"${store.url_env}"' if store.url_env else "'<store.url>'"
    return f"pg_dump --format=custom --schema={_shell(name)} --file={_shell(out)} --dbname={url}"


def _shell(word: str) -> str:
    """`word` as one shell word (quoted only when it needs to be)."""
    if word and all(c.isalnum() or c in "._-/+:@%=," for c in word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


# --- the copy -----------------------------------------------------------------------------------


def backup(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    force: bool = False,
    step: int = DEFAULT_STEP,
) -> Copied:
    """Copy the SQLite store `source` to `out` online (see the module's docstring); BackupError
    says why not."""
    src_path, out_path = os.fspath(source), os.fspath(out)
    if step < 1:
        raise ValueError(f"step must be >= 1 page (got {step})")
    if os.path.lexists(out_path) and not force:
        raise BackupError(f"{out_path} exists: give --force to replace it")
    if os.path.isdir(out_path):
        raise BackupError(f"{out_path} is a directory")
    if not os.path.isfile(src_path):
        reason = "is not a file" if os.path.exists(src_path) else "no such file"
        raise BackupError(f"cannot read the store {src_path}: {reason}")
    if os.path.realpath(src_path) == os.path.realpath(out_path):
        raise BackupError(f"{out_path} is the store itself")
    directory = os.path.dirname(os.path.abspath(out_path))
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(out_path)}.", suffix=".part", dir=directory
        )
    except OSError as e:
        raise BackupError(f"cannot write in {directory}: {e.strerror or e}") from None
    os.close(fd)
    try:
        # The copy holds what the store holds: as readable as the store, no more (mkstemp
        # makes it private to its owner).
        os.chmod(tmp, os.stat(src_path).st_mode & 0o666)
        version = _copy(src_path, tmp, step)
        tasks = _check(src_path, tmp, version)
        _fsync(tmp)
        _place(tmp, out_path, force)
        _fsync(directory)
        size = os.path.getsize(out_path)
    except OSError as e:
        raise BackupError(f"cannot write {out_path}: {e.strerror or e}") from None
    finally:
        _remove(tmp)
    return Copied(src_path, out_path, tasks, size, version)


def _copy(src_path: str, tmp: str, step: int) -> int:
    """Back the store up into `tmp`; the store's schema version."""
    uri = f"file:{url_quote(os.path.abspath(src_path))}?mode=ro"
    try:
        src = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as e:
        raise BackupError(f"cannot read the store {src_path}: {e}") from None
    try:
        try:
            wal = src.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            if wal:
                # One snapshot for the whole copy (taken by the first read below): the server's
                # commits go on (a WAL reader blocks no writer) and never restart the copy.
                src.execute("BEGIN")
            else:
                step = -1  # (nobody writes it: see the module's docstring)
            version = _schema_version(src, src_path)
        except sqlite3.Error as e:
            raise BackupError(f"cannot read the store {src_path}: {e}") from None
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            src.backup(dst, pages=step, sleep=0.01)
            # The copy has no leader: the live one's lease, copied, would make a server started
            # on the restored file wait it out. The epoch and the highest id issued stay, so
            # ids and attempt numbers still never repeat. (These columns are in every version.)
            dst.execute("UPDATE cronoq_leader SET holder = NULL, expires_unix_ns = 0 WHERE id = 1")
        except sqlite3.Error as e:
            raise BackupError(f"cannot copy the store {src_path}: {e}") from None
        finally:
            dst.close()
        return version
    finally:
        src.close()


def _schema_version(db: sqlite3.Connection, path: str) -> int:
    """The cronoq schema version of an open store file, by SqliteStore's rules."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "cronoq_meta" not in tables:
        raise BackupError(f"cannot read the store {path}: not a cronoq database")
    meta = dict(db.execute("SELECT key, value FROM cronoq_meta").fetchall())
    version = str(meta.get("schema_version", ""))
    if meta.get("application") != APPLICATION or not version.isdigit():
        raise BackupError(f"cannot read the store {path}: not a cronoq database")
    return int(version)


def _check(src_path: str, tmp: str, version: int) -> int:
    """Check the copy: SQLite's integrity check, then cronoq's own opening of it; the number
    of tasks in it."""
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        problems = [r[0] for r in db.execute("PRAGMA integrity_check").fetchall()]
        if problems != ["ok"]:
            raise BackupError(
                f"the copy of {src_path} fails SQLite's integrity check: {problems[0]}"
                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            )
        tasks = int(db.execute("SELECT count(*) FROM cronoq_tasks").fetchone()[0])
    except sqlite3.Error as e:
        raise BackupError(f"the copy of {src_path} cannot be read: {e}") from None
    finally:
        db.close()
    if version > SCHEMA_VERSION:
        raise BackupError(
            f"the store {src_path} has schema version {version}, newer than this cronoq "
            f"supports ({SCHEMA_VERSION}): run the backup with the cronoq the server runs"
        )
    if version == SCHEMA_VERSION:
        # As the server opens a store (this writes nothing to a file of its own version: no
        # migration, no lease). An older file is left as it was: opening it would migrate it,
        # and the backup taken before an upgrade must stay what the older version wrote.
        try:
            asyncio.run(_open_close(tmp))
        except SchedulerError as e:
            raise BackupError(f"the copy of {src_path} does not open as a store: {e}") from None
    return tasks


async def _open_close(path: str) -> None:
    store = SqliteStore(path)
    await store.open()
    await store.close(release=False)


def _place(tmp: str, out: str, force: bool) -> None:
    """Put the finished copy in place as `out`, atomically: link it there (which fails if
    `out` exists: refused without `force`), or replace `out` with it (`force`)."""
    if force:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise BackupError(f"{out} exists: give --force to replace it") from None
    except OSError:
        # (a file system without hard links: check, then rename)
        if os.path.lexists(out):
            raise BackupError(f"{out} exists: give --force to replace it") from None
        os.replace(tmp, out)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(tmp: str) -> None:
    """The temp file and whatever SQLite left next to it."""
    for name in (tmp, f"{tmp}-journal", f"{tmp}-wal", f"{tmp}-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
