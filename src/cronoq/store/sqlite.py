"""SqliteStore: durable state in one SQLite file, shared by a leader and its standbys.

How it is driven: a scheduler (library mode) or the server calls the async methods below from
its event loop; every call runs on one dedicated thread that owns the connection, so the loop
never waits on disk. `open()` validates (and creates or migrates) the file, `lead()` waits until
this process holds the leadership lease, `load()` returns what the previous leaders left,
`commit_nowait()` writes one group of changes in one transaction (and renews the lease in it),
`renew()` keeps the lease while idle, `prune()` drops old terminal rows, `finished()` reads a
finished task's row, `close()` ends, giving the lease up at once after a clean stop. These are
the methods of the `cronoq.store.Store` protocol (store/base.py).

Fencing: every transaction that writes tasks first updates the leader row *where the epoch and
holder are still ours*; if another process took over meanwhile that update matches no row, the
transaction is rolled back and `LeadershipLost` is raised, so a deposed leader never writes. A
lease that ran out while nobody took over is simply renewed by that update (a stalled disk or a
paused process does not depose a leader that has no rival).

Takeover on the same host (docs/durability.md, "Leader and standbys"): the leading process also
holds an exclusive `flock` on a lock file next to the database (`<path>-leader`), which the
kernel releases when the process dies. The leader row records where the holder runs (host name,
boot id and the lock file's device and inode: `host`) and, while the holder has that lock,
its holder string again (`lock_holder`). A standby that finds an unexpired lease whose holder
is on its own host and had the lock, and that can take the lock itself, knows the holder is
gone and takes over at once; in every other case (another host, a file shared over a network,
a holder that never had the lock) it waits the lease out.

A full disk (docs/durability.md, "A full disk"): SQLite rolls a transaction back by itself when
it runs out of space, so the store rolls back only a transaction still open, and the caller sees
SQLite's own error. The store notes the outage (`status`, for the server's /readyz); `open()`
and `lead()` then wait, polling, until the file can be read and the file system has ROOM free
again, instead of failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import shutil
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

from ..errors import SchedulerError
from .base import (
    COLUMN,
    DONE_CHANGE,
    LIVE_CHANGE,
    SIGN,
    TASK_COLUMNS,
    Batch,
    Finished,
    LeadershipLost,
    QueuedStore,
    Stored,
    signed,
    to_ns,
    unsigned,
)

if sys.platform != "win32":
    import fcntl

SCHEMA_VERSION = 5
APPLICATION = "cronoq"
LOCK_SUFFIX = "-leader"  # the lock file: the database's path with this appended
# The free space a store that ran out of it waits for before it leads again: leading with a
# few pages free would only fail the next commits the same way.
ROOM = 1 << 20

log = logging.getLogger("cronoq")

# Version 1: the tables every cronoq store has.
_SCHEMA_V1 = (
    "CREATE TABLE cronoq_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE cronoq_leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch INTEGER NOT NULL,
        max_id INTEGER NOT NULL,
        holder TEXT,
        expires_unix_ns INTEGER NOT NULL)""",
    "INSERT INTO cronoq_leader (id, epoch, max_id, holder, expires_unix_ns) "
    "VALUES (1, 0, 0, NULL, 0)",
    """CREATE TABLE cronoq_tasks (
        id INTEGER PRIMARY KEY,
        seq INTEGER NOT NULL,
        arrival INTEGER NOT NULL,
        pool TEXT NOT NULL,
        kind TEXT NOT NULL,
        priority INTEGER NOT NULL,
        key TEXT,
        payload BLOB,
        deadline INTEGER,
        fixed_start INTEGER,
        tolerance REAL,
        on_miss TEXT,
        duration_hint REAL,
        timeout REAL,
        retry TEXT,
        deps TEXT,
        resources TEXT,
        tags TEXT,
        labels TEXT,
        tenant TEXT,
        status TEXT NOT NULL,
        terminal INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        updated INTEGER NOT NULL,
        message TEXT,
        output BLOB)""",
    # Partial indexes: tasks without a key, and live tasks, cost no index entry.
    "CREATE UNIQUE INDEX cronoq_tasks_live_key ON cronoq_tasks (key) "
    "WHERE terminal = 0 AND key IS NOT NULL",
    "CREATE INDEX cronoq_tasks_done ON cronoq_tasks (updated) WHERE terminal = 1",
    """CREATE TABLE cronoq_recurring (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        template_payload BLOB,
        next_unix_ns INTEGER,
        last_task_id INTEGER)""",
)

# MIGRATIONS[v] takes a file from version v to v + 1.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: a ready task's place in its queue (aging) and a retrying task's retry time survive.
    1: (
        "ALTER TABLE cronoq_tasks ADD COLUMN eligible INTEGER",
        "ALTER TABLE cronoq_tasks ADD COLUMN not_before INTEGER",
    ),
    # 3: when a task's latest attempt started (finished tasks report it after a restart).
    2: ("ALTER TABLE cronoq_tasks ADD COLUMN started INTEGER",),
    # 4: where the holder runs and whether it holds the lock file (same-host takeover). A
    # holder written by an older version has neither, so its lease is always waited out.
    3: (
        "ALTER TABLE cronoq_leader ADD COLUMN host TEXT",
        "ALTER TABLE cronoq_leader ADD COLUMN pid INTEGER",
        "ALTER TABLE cronoq_leader ADD COLUMN lock_holder TEXT",
    ),
    # 5: the worker of a task's latest attempt and its earlier attempts (JSON, NULL for none),
    # and the pools an operator paused.
    4: (
        "ALTER TABLE cronoq_tasks ADD COLUMN worker TEXT",
        "ALTER TABLE cronoq_tasks ADD COLUMN attempts TEXT",
        "CREATE TABLE cronoq_pools (name TEXT PRIMARY KEY, paused INTEGER NOT NULL)",
    ),
}

_INSERT_TASK = f"INSERT INTO cronoq_tasks ({TASK_COLUMNS}) VALUES ({', '.join('?' * len(COLUMN))})"
# A live task's changes touch no column the indexes use (key, terminal, updated): updating
# those costs about twice as much.
_UPDATE_LIVE = f"UPDATE cronoq_tasks SET {', '.join(f'{c} = ?' for c in LIVE_CHANGE)} WHERE id = ?"
_UPDATE_DONE = (
    f"UPDATE cronoq_tasks SET terminal = 1, {', '.join(f'{c} = ?' for c in DONE_CHANGE)} "
    "WHERE id = ?"
)
# Terminal rows that ended before a time, except parents of blocked tasks: restoring a blocked
# task resolves its dependencies again, by id or key (deps are [[target, on], ...]).
# The parent's id as JSON text against the edge's first element as JSON text: an id from 2^63
# on (shards 128-255) is stored signed, and JSON reads it as a float (`signed`).
_PRUNE = """
DELETE FROM cronoq_tasks WHERE terminal = 1 AND updated < ?1 AND NOT EXISTS (
    SELECT 1 FROM cronoq_tasks AS child, json_each(child.deps) AS edge
    WHERE child.status = 'blocked'
      AND (edge.value -> 0 = printf('%u', cronoq_tasks.id) OR edge.value ->> 0 = cronoq_tasks.key))
"""
_UPSERT_POOL = (
    "INSERT INTO cronoq_pools (name, paused) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET paused = excluded.paused"
)
_DELETE_DONE = "DELETE FROM cronoq_tasks WHERE id = ? AND terminal = 1"
_UPSERT_RECURRING = (
    "INSERT INTO cronoq_recurring (name, spec, template_payload, next_unix_ns, last_task_id) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
    "template_payload = excluded.template_payload, next_unix_ns = excluded.next_unix_ns, "
    "last_task_id = excluded.last_task_id"
)

# The lease renewal that fences every commit, raising the highest id issued: compared unsigned
# (two signed values of one sign compare as their ids do; a negative one is the larger id).
_RENEW = """
UPDATE cronoq_leader SET expires_unix_ns = ?1, lock_holder = ?3,
    max_id = CASE WHEN (max_id < 0) = (?2 < 0) THEN max(max_id, ?2)
                  WHEN max_id < 0 THEN max_id ELSE ?2 END
WHERE id = 1 AND epoch = ?4 AND holder = ?5
"""

T = TypeVar("T")


def _ids(rows: list[Any], at: int, convert: Callable[[int], int]) -> list[Any]:
    """Rows with `convert` applied to the id at place `at` (negative: from the end; None
    stays): `signed` for what is written, `unsigned` for what is read back."""
    out = []
    for row in rows:
        v = row[at]
        if v is not None and (c := convert(v)) != v:
            i = at % len(row)
            row = (*row[:i], c, *row[i + 1 :])
        out.append(row)
    return out


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds (got {value!r})")
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a finite number of seconds > 0 (got {value!r})")
    return v


class SqliteStore(QueuedStore):
    """Durable scheduler state in a SQLite file (WAL mode); one leader per file at a time."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease_ttl: float = 10.0,
        lease_renew: float = 2.0,
        lock_poll: float = 0.5,
        retention: float = 3600.0,
        full_sync: bool = True,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike (got {type(path).__name__})")
        self.path = os.fspath(path)
        if not self.path or "\0" in self.path:
            raise ValueError("path must be a non-empty file name without NUL characters")
        self.lease_ttl = _positive("lease_ttl", lease_ttl)
        if (
            isinstance(lease_renew, bool)
            or not isinstance(lease_renew, (int, float))
            or not (0 < lease_renew < self.lease_ttl)
        ):
            raise ValueError("lease_renew must be > 0 and shorter than lease_ttl")
        self.lease_renew = float(lease_renew)
        self.lock_poll = _positive("lock_poll", lock_poll)
        if isinstance(retention, bool) or not isinstance(retention, (int, float)):
            raise TypeError(f"retention must be a number of seconds (got {retention!r})")
        if math.isnan(retention) or retention < 0:
            raise ValueError(f"retention must be >= 0 seconds (got {retention!r})")
        self.retention = float(retention)
        if not isinstance(full_sync, bool):
            raise TypeError(f"full_sync must be a bool (got {full_sync!r})")
        self.full_sync = full_sync
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.epoch = 0
        self._db: sqlite3.Connection | None = None
        self._jobs: SimpleQueue[_Job | None] | None = None  # the store thread's inbox
        self._expires = 0  # our lease's expiry (Unix ns) as last written
        self._lock = _LockFile(self.path)
        # Set by _try_lead when it waited because a holder on this host has the lock file:
        # lead() then waits for that lock in a thread, to take over the moment it is freed.
        self._lock_busy = False
        # Why the store cannot go on for now (the server's /readyz says it), else "".
        self.status = ""
        self._full = False  # it ran out of disk space: it leads again only once there is ROOM

    @property
    def location(self) -> str:
        """Where the store is, for logs: the file's path (as PostgresStore.location)."""
        return self.path

    def __repr__(self) -> str:
        return (
            f"SqliteStore({self.path!r}, lease_ttl={self.lease_ttl}, "
            f"lease_renew={self.lease_renew}, lock_poll={self.lock_poll}, "
            f"retention={self.retention}, full_sync={self.full_sync})"
        )

    # --- the driver's interface (async, one caller at a time) --------------------------------

    async def open(self) -> None:
        """Open the file, check it is a cronoq store of a version we know, create or migrate
        it. A bad file raises SchedulerError and is left exactly as it was."""
        if self._jobs is None:
            self._jobs = SimpleQueue()
            threading.Thread(
                target=_serve, args=(self._jobs,), name="cronoq-sqlite", daemon=True
            ).start()
        try:
            await self._until_room(self._open)
        except BaseException:
            await self.close(release=False)
            raise

    async def lead(self) -> int:
        """Wait until this process holds the lease; return the new epoch. A standby tries
        every lock_poll seconds, and, while the holder runs on this host, also the moment
        the holder's lock file is freed (its process exited or closed the store)."""
        loop = asyncio.get_running_loop()
        freed = asyncio.Event()

        def wake() -> None:  # on the lock file's waiting thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(freed.set)

        try:
            while True:
                freed.clear()  # before trying: a lock freed meanwhile is seen next round
                epoch = await self._until_room(self._try_lead)
                if epoch is not None:
                    self.epoch = epoch
                    return epoch
                if self._lock_busy:
                    self._lock.wait(wake)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), self.lock_poll)
        finally:
            self._lock.unwait()

    async def close(self, release: bool = True) -> None:
        """Close the file; with release, give up the lease so a standby takes over at once."""
        if self._jobs is None:
            return
        try:
            await self._call(self._close, release)
        finally:
            jobs, self._jobs = self._jobs, None
            jobs.put(None)  # the thread ends

    async def _until_room(self, fn: Callable[[], T]) -> T:
        """fn() on the store thread, tried again every lock_poll seconds while it fails for
        want of disk space (a full disk is no reason to give up: it is freed sooner or later)."""
        while True:
            try:
                return await self._call(fn)
            except sqlite3.Error as e:
                if not _no_room(e):
                    raise
            await asyncio.sleep(self.lock_poll)

    # --- on the store's thread ---------------------------------------------------------------

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue fn(*args) for the store thread. (A plain queue and call_soon_threadsafe: no
        executor bookkeeping on a round trip, which every commit makes.)"""
        if self._jobs is None:
            raise SchedulerError(f"store {self.path!r} is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, fut, self._noting, (fn, *args)))
        return fut

    def _noting(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), noting a failure for want of disk space, whichever call met it: the
        server's /readyz says so from the moment the session is lost, until it leads again."""
        try:
            return fn(*args)
        except sqlite3.Error as e:
            if _no_room(e):
                if not self._full:
                    log.warning(
                        "store %r: %s: waiting for %d bytes free to go on", self.path, e, ROOM
                    )
                self._full = True
                self.status = f"disk full: {e}"
            raise

    def _room(self) -> bool:
        """Has the file system of the database ROOM free (or can nobody tell)?"""
        try:
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(self.path))).free
        except OSError:
            return True  # (the write will tell)
        return free >= ROOM

    def _fail(self, reason: str) -> SchedulerError:
        return SchedulerError(f"store {self.path!r}: {reason}")

    def _open(self) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, timeout=self.lease_ttl)
        except sqlite3.Error as e:
            raise self._fail(f"cannot open: {e}") from None
        try:
            version = self._inspect(db)  # before anything that could write to the file
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if self.full_sync else 'NORMAL'}")
            if version is None:
                self._create(db)
            elif version < SCHEMA_VERSION:
                self._migrate(db)
        except sqlite3.Error as e:
            db.close()
            if _no_room(e):
                raise  # (open() waits for room)
            raise self._fail(f"cannot use it: {e}") from None
        except BaseException:
            db.close()
            raise
        self._db = db

    def _inspect(self, db: sqlite3.Connection) -> int | None:
        """The file's schema version (None for an empty file); reads only."""
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as e:
            if _no_room(e):  # (SQLite could not make its WAL index: the file may be fine)
                raise
            raise self._fail(f"not a cronoq database ({e})") from None
        if not tables:
            return None
        if "cronoq_meta" not in tables:
            raise self._fail("not a cronoq database (no cronoq_meta table)")
        meta = dict(db.execute("SELECT key, value FROM cronoq_meta").fetchall())
        if meta.get("application") != APPLICATION or not meta.get("schema_version", "").isdigit():
            raise self._fail("not a cronoq database (cronoq_meta has no cronoq schema version)")
        version = int(meta["schema_version"])
        if version > SCHEMA_VERSION:
            raise self._fail(
                f"schema version {version} is newer than this cronoq supports ({SCHEMA_VERSION})"
            )
        return version

    @staticmethod
    def _create(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                db.execute("ROLLBACK")  # another process created it first
                return
            for stmt in _SCHEMA_V1:
                db.execute(stmt)
            db.execute(
                "INSERT INTO cronoq_meta (key, value) VALUES ('application', ?), "
                "('schema_version', '1')",
                (APPLICATION,),
            )
            SqliteStore._upgrade(db, 1)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            current = int(
                db.execute("SELECT value FROM cronoq_meta WHERE key='schema_version'").fetchone()[0]
            )
            if current < SCHEMA_VERSION:  # not done by another process meanwhile
                SqliteStore._upgrade(db, current)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    @staticmethod
    def _upgrade(db: sqlite3.Connection, version: int) -> None:
        for v in range(version, SCHEMA_VERSION):
            for stmt in MIGRATIONS[v]:
                db.execute(stmt)
        db.execute(
            "UPDATE cronoq_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
        )

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise self._fail("not open")
        return self._db

    def _try_lead(self) -> int | None:
        db = self._conn()
        where = self._lock.where()  # (opens the lock file the first time)
        self._lock_busy = False
        if self._full and not self._room():
            return None
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            # The leader holds the write lock longer than our busy timeout (a slow commit, or
            # a process paused inside one): not leading yet, so poll again instead of failing.
            if _locked(e):
                return None
            raise
        try:
            now = time.time_ns()
            epoch, holder, expires, host, lock_holder = db.execute(
                "SELECT epoch, holder, expires_unix_ns, host, lock_holder FROM cronoq_leader "
                "WHERE id = 1"
            ).fetchone()
            if holder and expires > now:
                # Its lease runs: take over now only if the holder is provably gone. It ran
                # on this host and held the lock file from before its lease was written
                # until its file closed: if we can take that lock now, it has exited (or
                # closed the store), whatever the lease says.
                here = where is not None and host == where and lock_holder == holder
                if not (here and self._lock.take()):
                    db.execute("ROLLBACK")
                    self._lock.release()  # (one a waiting thread got: the leader may want it)
                    self._lock_busy = here
                    return None
                log.info(
                    "store %r: its holder %s on this host is gone: taking over without "
                    "waiting for its lease to run out",
                    self.path,
                    holder,
                )
            # The lock before the new epoch is written (a standby on this host must never see
            # lock_holder = us before we have the lock), and kept as long as we lead. If a
            # stalled former leader on this host still has it, we lead without it for now
            # (lock_holder NULL: our lease is then always waited out) and try again at each
            # commit.
            locked = self._lock.take()
            epoch += 1
            self._expires = now + to_ns(self.lease_ttl)
            db.execute(
                "UPDATE cronoq_leader SET epoch = ?, holder = ?, expires_unix_ns = ?, host = ?, "
                "pid = ?, lock_holder = ? WHERE id = 1",
                (
                    epoch,
                    self.holder,
                    self._expires,
                    where,
                    os.getpid(),
                    self.holder if locked else None,
                ),
            )
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            self._lock.release()
            raise
        # (Also set here, on this thread: if lead() was cancelled meanwhile, close() still
        # gives up what we took.)
        self.epoch = int(epoch)
        self._lock.keep = True
        if self._full:
            log.info("store %r: there is room again", self.path)
            self._full, self.status = False, ""
        return int(epoch)

    def _load(self) -> Stored:
        db = self._conn()
        tasks = db.execute(f"SELECT {TASK_COLUMNS} FROM cronoq_tasks ORDER BY id").fetchall()
        schedules = db.execute(
            "SELECT name, spec, template_payload, next_unix_ns, last_task_id FROM cronoq_recurring"
        ).fetchall()
        max_id = db.execute("SELECT max_id FROM cronoq_leader WHERE id = 1").fetchone()[0]
        paused = [n for (n,) in db.execute("SELECT name FROM cronoq_pools WHERE paused = 1")]
        return Stored(
            _ids(tasks, 0, unsigned), _ids(schedules, 4, unsigned), unsigned(int(max_id)), paused
        )

    def _commit(self, batch: Batch) -> None:
        db = self._conn()
        # A leader that took over without the lock file's lock tries again (only then).
        locked = self._lock.held or (self._lock.keep and self._lock.take())
        db.execute("BEGIN IMMEDIATE")
        try:
            # Our lease may have run out (a stalled disk, a paused process): then this update
            # renews it if no other process took over meanwhile, and matches nothing if one
            # did. Writers are serialized, so a takeover and this renewal cannot both win.
            expires = time.time_ns() + to_ns(self.lease_ttl)
            cur = db.execute(
                _RENEW,
                (
                    expires,
                    signed(batch.max_id),
                    self.holder if locked else None,
                    self.epoch,
                    self.holder,
                ),
            )
            if cur.rowcount != 1:
                raise self._fenced()
            wide = batch.max_id >= SIGN  # some id needs its signed form (else none does)
            if batch.inserts:
                db.executemany(
                    _INSERT_TASK, _ids(batch.inserts, 0, signed) if wide else batch.inserts
                )
            if batch.updates:
                db.executemany(
                    _UPDATE_LIVE, _ids(batch.updates, -1, signed) if wide else batch.updates
                )
            if batch.finishes:
                db.executemany(
                    _UPDATE_DONE, _ids(batch.finishes, -1, signed) if wide else batch.finishes
                )
            if batch.schedules:
                db.executemany(
                    _UPSERT_RECURRING, _ids(batch.schedules, 4, signed) if wide else batch.schedules
                )
            if batch.removed_schedules:
                db.executemany(
                    "DELETE FROM cronoq_recurring WHERE name = ?",
                    [(n,) for n in batch.removed_schedules],
                )
            if batch.pools:
                db.executemany(_UPSERT_POOL, batch.pools)
            if batch.deletes:  # last: a task may end and be deleted in one batch
                db.executemany(_DELETE_DONE, [(signed(i),) for i in batch.deletes])
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        self._expires = expires

    def _check_lease(self, db: sqlite3.Connection) -> None:
        """Inside a write transaction: do we still lead? (Fencing for writes that do not
        renew the lease: the epoch and holder are ours, however late the lease.)"""
        row = db.execute(
            "SELECT 1 FROM cronoq_leader WHERE id = 1 AND epoch = ? AND holder = ?",
            (self.epoch, self.holder),
        ).fetchone()
        if row is None:
            raise self._fenced()

    def _fenced(self) -> LeadershipLost:
        """Another process leads: give the lock file's lock up (nothing more is written)."""
        self._lock.release()
        return LeadershipLost()

    def _prune(self, before_ns: int) -> int:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            self._check_lease(db)
            cur = db.execute(_PRUNE, (before_ns,))
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        return cur.rowcount

    def _finished(self, task_id: int) -> Finished | None:
        row = (
            self._conn()
            .execute(
                f"SELECT {TASK_COLUMNS} FROM cronoq_tasks WHERE id = ? AND terminal = 1",
                (signed(task_id),),
            )
            .fetchone()
        )
        return None if row is None else Finished(_ids([row], 0, unsigned)[0])

    def _close(self, release: bool) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        try:
            if release and self.epoch:
                db.execute(
                    "UPDATE cronoq_leader SET holder = NULL, expires_unix_ns = 0, "
                    "lock_holder = NULL WHERE id = 1 AND epoch = ? AND holder = ?",
                    (self.epoch, self.holder),
                )
        except sqlite3.Error:
            pass  # the lease then simply expires
        finally:
            db.close()
            # Only now that this handle can write nothing more: a standby on this host may
            # take over the moment the lock is free.
            self._lock.release()
            self.epoch = 0


def _boot_id() -> str | None:
    """This boot's random id (Linux): with the host name, it tells this host from others."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


class _LockFile:
    """The exclusive `flock` on `<database>-leader` that the leading process holds.

    flock, not fcntl/lockf: POSIX record locks belong to the process and vanish when any of its
    descriptors of the file closes (and SQLite takes them on the database itself); an flock
    belongs to one open file description and goes only when that is closed, by us or by the
    kernel when the process dies. The store thread takes and releases it without blocking; a
    standby may also wait for it in a thread of its own (`wait`), which hands it over."""

    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.path: str | None = None  # known at the first where()
        self._where: str | None = None
        self._mutex = threading.Lock()
        self._fd: int | None = None  # the descriptor that holds the lock
        self._waiting = False  # a thread blocks in flock
        self._wake: Callable[[], None] | None = None  # who wants what that thread gets
        # We lead (until release()): we want the lock, also when a waiting thread gets it.
        self.keep = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def where(self) -> str | None:
        """This host and this lock file: "hostname boot-id device:inode"; None without a
        lock file (it cannot be created, no boot id, no flock): then no lease of ours is ever
        cut short, and we never cut another's short."""
        if self.path is None:
            self.path = os.path.realpath(self.db_path) + LOCK_SUFFIX
            boot = _boot_id()
            fd = self._open()
            if fd is not None:
                try:
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                if boot is not None:
                    self._where = f"{socket.gethostname()} {boot} {st.st_dev}:{st.st_ino}"
        return self._where

    def _open(self) -> int | None:
        if sys.platform == "win32" or self.path is None:
            return None
        # Read-write where we may (NFS emulates flock with record locks, which need it for an
        # exclusive lock), else read-only (enough for a local flock; a file of another user).
        for mode in (os.O_RDWR, os.O_RDONLY):
            try:
                return os.open(self.path, mode | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except PermissionError:
                continue
            except OSError:
                return None
        return None

    def take(self) -> bool:
        """Take the lock if it is free (or already ours); never blocks."""
        if self._where is None:
            return False
        with self._mutex:
            if self._fd is not None:
                return True
            fd = self._open()
            if fd is None or sys.platform == "win32":
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._fd = fd
            return True

    def release(self) -> None:
        with self._mutex:
            fd, self._fd = self._fd, None
            self.keep = False
        if fd is not None:
            os.close(fd)

    def wait(self, wake: Callable[[], None]) -> None:
        """Until unwait(): once the lock is free, take it and call `wake` (from a thread that
        blocks in flock meanwhile; one at a time, reused by later waits)."""
        with self._mutex:
            self._wake = wake
            if self._waiting or self._fd is not None or self._where is None:
                return
            self._waiting = True
        threading.Thread(target=self._block, name="cronoq-sqlite-lock", daemon=True).start()

    def unwait(self) -> None:
        with self._mutex:
            self._wake = None

    def _block(self) -> None:
        fd = self._open()
        if fd is not None and sys.platform != "win32":
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # (retried by Python when a signal interrupts)
            except OSError:
                os.close(fd)
                fd = None
        with self._mutex:
            self._waiting = False
            wake = self._wake
            if fd is not None and (wake is not None or self.keep) and self._fd is None:
                self._fd, fd = fd, None
            else:
                wake = None
        if fd is not None:
            os.close(fd)  # nobody wants it any more (or we have it already)
        if wake is not None:
            wake()


_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _serve(jobs: SimpleQueue[_Job | None]) -> None:
    """The store thread: run jobs in order until told to stop."""
    while True:
        job = jobs.get()
        if job is None:
            return
        loop, fut, fn, args = job
        try:
            result, error = fn(*args), None
        except BaseException as e:
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(_settle, fut, result, error)


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back the transaction if it is still open: after some errors (a full disk) SQLite
    already did, and a ROLLBACK would then only replace the error with its own."""
    if db.in_transaction:
        db.execute("ROLLBACK")


def _no_room(e: BaseException) -> bool:
    """Did SQLite fail for want of disk space (a write, or the WAL index of a file it opens)?"""
    code = getattr(e, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_SHMSIZE)


def _locked(e: sqlite3.OperationalError) -> bool:
    """Did the busy timeout run out on another connection's lock (SQLITE_BUSY/LOCKED)?"""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(e) or "busy" in str(e)
