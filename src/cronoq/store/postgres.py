"""PostgresStore: durable state in a PostgreSQL schema, shared by a leader and its standbys.

The `cronoq.store.Store` protocol (store/base.py) on asyncpg, from the event loop itself (no
thread: every wait is on the network). docs/durability.md, "PostgreSQL", states what it
guarantees; the rules it follows:

* Election: a session advisory lock `(1668444017, <schema OID>)` taken on a connection of its
  own (not from the pool), tried every 500 ms; holding it, the leader increments the epoch in
  `cronoq_leader` and keeps it as its fencing token. The lock goes when that session ends: the
  process died (PostgreSQL sees the socket close), the connection was terminated, or we closed
  it.
* Keeper: `SELECT 1` on the lock connection every second, with a 10 s timeout. A failed probe,
  a lock connection that ends, or a probe not answered for 10 s (a process that was paused)
  loses the leadership: the next commit or renewal fails with LeadershipLost, and the lock
  connection is closed, which frees the lock for a standby.
* Fencing: the first statement of every write transaction locks the leader row and reads the
  epoch; another epoch rolls the transaction back ("fenced: leadership lost"). A new leader's
  epoch update needs the same row lock, so an old leader's commit in flight either commits
  before the takeover (and is recovered) or is fenced.
* Retries: a commit that fails for a transient reason (connection lost, SQLSTATE classes 08 and
  53, 57P*, serialization failure, deadlock, lock not available, or the 30 s commit timeout) is
  retried with backoff up to 5 s for at most 300 s of continuous outage; other errors 5 times.
  Commits are idempotent (inserts skip ids already written), so a retry of a commit whose
  answer was lost leaves the same rows.

Ids are unsigned 64-bit; a `bigint` column keeps them in two's complement (an id below 2^63,
every unsharded one, is stored as itself), and the store orders and takes maxima by the
unsigned value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..core.model import check_seconds
from ..errors import SchedulerError
from .base import (
    FENCED,
    Batch,
    Finished,
    LeadershipLost,
    Stored,
    signed,
    to_ns,
    unsigned,
)
from .pg_sql import (
    COLUMNS,
    COMMIT,
    COMMIT_FUNCTION,
    DONE_IDS,
    DONE_JSON,
    DONE_TEXT,
    FENCE,
    FENCED_STATE,
    ID_AT,
    INSERTED,
    JSON_AT,
    LIVE_IDS,
    LIVE_JSON,
    LIVE_TEXT,
    LOAD,
    MIGRATIONS,
    POOLS,
    PRUNE,
    PRUNE_ROWS,
    REPLACE_COMMIT_FUNCTION,
    SCHEDULE,
    SCHEMA,
    SECONDS_AT,
    TERMINAL_AT,
    TEXT_AT,
)

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    _Conn = asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]

__all__ = ["SCHEMA_VERSION", "PostgresStore", "redact"]

log = logging.getLogger("cronoq")

SCHEMA_VERSION = 6
LOCK_CLASS = 1668444017  # "croq": the leadership lock (with the schema's OID)
MIGRATION_CLASS = 1668444013  # "crom": migrations (with hashtext(schema))
MAX_EPOCH = 32767  # then 1 again (ids keep the epoch below 2^15)

LOCK_POLL_S = 0.5
KEEPER_INTERVAL_S = 1.0
KEEPER_TIMEOUT_S = 10.0
CONNECT_BACKOFF_S = (0.5, 5.0)  # first, at most (doubling)
POOL_SIZE = 8
COMMIT_TIMEOUT_S = 30.0
COMMIT_BACKOFF_S = (0.05, 5.0)
TRANSIENT_BUDGET_S = 300.0
OTHER_RETRIES = 5
# Lock connection keepalives (PostgreSQL's side of the socket: it ends a session whose client
# vanished after 10 s idle plus three 1 s probes, which frees the lock).
LOCK_SESSION = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "1",
    "tcp_keepalives_count": "3",
}

T = TypeVar("T")

_SECRETS = ("password", "sslpassword")  # URL parameters that redact() leaves out


def redact(url: str) -> str:
    """The URL without its password (in the user part or a `password=` parameter) or the
    client key's (`sslpassword=`)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.partition(':')[0]}@{host}"
        query = urlencode(
            [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in _SECRETS]
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return "<unparsable URL>"


def _clean_text(v: str | None) -> str | None:
    """PostgreSQL text has no NUL: it is stored as U+FFFD."""
    return v if v is None or "\0" not in v else v.replace("\0", "\ufffd")


def _clean_json(v: str | None) -> str | None:
    """jsonb has no NUL either (written "\\u0000" by JSON): each one becomes U+FFFD."""
    if v is None or "\\u0000" not in v:
        return v
    return json.dumps(_replace_nul(json.loads(v)), separators=(",", ":"), ensure_ascii=False)


def _replace_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\0", "\ufffd")
    if isinstance(value, list):
        return [_replace_nul(v) for v in value]
    if isinstance(value, dict):
        return {_replace_nul(k): _replace_nul(v) for k, v in value.items()}
    return value


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else to_ns(seconds)


def _to_pg(row: Sequence[Any]) -> list[Any]:
    """A task row (TASK_COLUMNS order) as the table stores it."""
    out = list(row)
    out[ID_AT] = signed(out[ID_AT])
    for i in SECONDS_AT:
        out[i] = _ns(out[i])
    for i in TEXT_AT:
        out[i] = _clean_text(out[i])
    for i in JSON_AT:
        out[i] = _clean_json(out[i])
    out[TERMINAL_AT] = bool(out[TERMINAL_AT])
    return out


def _from_pg(record: asyncpg.Record | Sequence[Any]) -> tuple[Any, ...]:
    """A table row back in TASK_COLUMNS order, as every store gives it."""
    out = list(record)
    out[ID_AT] = unsigned(out[ID_AT])
    for i in SECONDS_AT:
        if out[i] is not None:
            out[i] = out[i] / 1e9
    out[TERMINAL_AT] = 1 if out[TERMINAL_AT] else 0
    return tuple(out)


def _connection_lost(e: BaseException) -> bool:
    import asyncpg

    # (InternalClientError: a connection whose session was ended under it, seen as a protocol
    # state it cannot switch from)
    lost = (OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.InternalClientError)
    return isinstance(e, lost) or (
        isinstance(e, asyncpg.PostgresError) and _transient_state(e.sqlstate)
    )


def _transient_state(state: str | None) -> bool:
    """SQLSTATEs worth retrying: connection trouble, no resources, the server shutting down,
    serialization failure, deadlock, lock not available."""
    if not state:
        return False
    return (
        state[:2] in ("08", "53")
        or state.startswith("57P")
        or state
        in (
            "40001",
            "40P01",
            "55P03",
        )
    )


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


class PostgresStore:
    """Durable scheduler state in one schema of a PostgreSQL database; one leader per schema.

    `dsn`: a `postgres://` or `postgresql://` URL (with its password, if any: it never appears in
    logs or in repr). `schema`: created if missing; servers and schedulers on the same schema of
    the same database share tasks and leadership, other schemas share nothing. `retention`:
    seconds a finished row is kept (default 7 days). `reload_finished`: seconds of finished
    tasks a new leader loads back for key deduplication and lookups (default one hour; older
    ones stay readable through `finished()`)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        retention: float = 604_800.0,
        reload_finished: float = 3600.0,
    ) -> None:
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str (got {type(dsn).__name__})")
        if urlsplit(dsn).scheme.lower() not in ("postgres", "postgresql"):
            raise ValueError("dsn must be a postgres:// or postgresql:// URL")
        if not isinstance(schema, str):
            raise TypeError(f"schema must be a str (got {type(schema).__name__})")
        if not (
            1 <= len(schema) <= 63
            and schema.isascii()
            and (schema[0].isalpha() or schema[0] == "_")
            and all(c.isalnum() or c == "_" for c in schema)
        ):
            raise ValueError(
                "schema must be 1-63 ASCII letters, digits or '_', not starting with a digit "
                f"(got {schema!r})"
            )
        self._dsn = dsn
        self.schema = schema
        self.retention = check_seconds("retention", retention, allow_inf=True)
        self.reload_finished = check_seconds("reload_finished", reload_finished, allow_inf=True)
        self.lease_renew = KEEPER_INTERVAL_S  # the driver's renewals check the keeper's verdict
        self.epoch = 0
        self.status = "not open"  # what it is doing or waiting for (the server's /readyz)
        self._pool: asyncpg.Pool | None = None
        # the pool's connection that commits go through, held between commits (no acquire and
        # release per commit); given back when its state is unknown, and at close
        self._writer: PoolConnectionProxy[asyncpg.Record] | None = None
        self._lock_conn: asyncpg.Connection | None = None
        self._lock_key = 0  # the schema's OID as a signed 32-bit integer
        self._keeper: asyncio.Task[None] | None = None
        self._lost: str | None = None  # why the leadership is lost (the keeper's verdict)
        self._probed = 0.0  # time.monotonic() of the last probe the lock connection answered
        self._order = asyncio.Lock()  # commits are written one at a time, in order

    @property
    def location(self) -> str:
        """Where the store is, for logs: the URL without its password, and the schema."""
        return f"{redact(self._dsn)} schema={self.schema}"

    def __repr__(self) -> str:
        return (
            f"PostgresStore({redact(self._dsn)!r}, schema={self.schema!r}, "
            f"retention={self.retention}, reload_finished={self.reload_finished})"
        )

    # --- opening ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (retrying while the database cannot be reached), then check, create or
        migrate the schema. A schema of a newer version, or tables owned by a role that is
        neither ours nor a superuser, raise SchedulerError."""
        asyncpg = _asyncpg()
        if self._pool is not None:
            return
        self._order = asyncio.Lock()  # (bound to this loop: a store may be reopened on another)
        delay = CONNECT_BACKOFF_S[0]
        while True:
            pool = await self._retrying(
                "connect",
                lambda: asyncpg.create_pool(
                    self._dsn,
                    min_size=1,
                    max_size=POOL_SIZE,
                    server_settings={"search_path": _quote(self.schema)},
                    reset=_no_reset,
                ),
            )
            try:
                async with pool.acquire() as conn:
                    await self._prepare_schema(conn)
                    oid = await conn.fetchval(
                        "SELECT oid::bigint FROM pg_namespace WHERE nspname = $1", self.schema
                    )
                break
            except SchedulerError:
                pool.terminate()
                raise
            except Exception as e:
                # (a refusal, such as a missing privilege, is a SchedulerError like any other
                # reason not to use the store; a connection lost meanwhile is retried)
                pool.terminate()
                if not _connection_lost(e):
                    raise self._fail(f"cannot prepare the schema: {_describe(e)}") from None
                self._unreachable("prepare the schema", e, delay)
            except BaseException:
                pool.terminate()
                raise
            await asyncio.sleep(delay)
            delay = min(CONNECT_BACKOFF_S[1], delay * 2)
        self._lock_key = int(oid) - (1 << 32) if int(oid) >= 1 << 31 else int(oid)
        self._pool = pool
        self.status = "open"

    async def _retrying(self, what: str, connect: Callable[[], Awaitable[T]]) -> T:
        """connect() until it works, with backoff while the database cannot be reached;
        a refusal retrying cannot fix (a wrong password, no such database) raises at once."""
        delay, cap = CONNECT_BACKOFF_S
        while True:
            try:
                return await connect()
            except Exception as e:
                if not _connection_lost(e):
                    raise self._fail(f"cannot {what}: {_describe(e)}") from None
                self._unreachable(what, e, delay)
            await asyncio.sleep(delay)
            delay = min(cap, delay * 2)

    def _unreachable(self, what: str, e: Exception, delay: float) -> None:
        """The database cannot be reached (yet): say so (`status`, the log) before a retry."""
        self.status = f"database unreachable: {_describe(e)}"
        log.warning(
            "store %s: cannot %s (%s); retrying in %.1f s", self.location, what, _describe(e), delay
        )

    def _fail(self, reason: str) -> SchedulerError:
        return SchedulerError(f"store {self.location}: {reason}")

    async def _prepare_schema(self, conn: asyncpg.Connection) -> None:
        async with _transaction(conn):
            await conn.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))", MIGRATION_CLASS, self.schema
            )
            # (CREATE SCHEMA needs the database's CREATE privilege even with IF NOT EXISTS: a
            # role given only an existing schema must not need it)
            if not await conn.fetchval(
                "SELECT 1 FROM pg_namespace WHERE nspname = $1", self.schema
            ):
                await conn.execute(f"CREATE SCHEMA {_quote(self.schema)}")
            await self._check_owners(conn)
            tables = {
                r[0]
                for r in await conn.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = $1", self.schema
                )
            }
            if "cronoq_schema_version" not in tables:
                if "cronoq_tasks" in tables:
                    raise self._fail("cronoq_tasks exists without cronoq_schema_version")
                for stmt in (*SCHEMA, COMMIT_FUNCTION):
                    await conn.execute(stmt)
                await conn.execute(
                    "INSERT INTO cronoq_schema_version (id, version) VALUES (1, $1)",
                    SCHEMA_VERSION,
                )
                return
            version = await conn.fetchval("SELECT version FROM cronoq_schema_version WHERE id = 1")
            if version is None or version > SCHEMA_VERSION:
                raise self._fail(
                    f"schema version {version} is newer than this cronoq supports "
                    f"({SCHEMA_VERSION})"
                    if version is not None
                    else "cronoq_schema_version has no row"
                )
            if version < SCHEMA_VERSION:  # (version 5 is the first PostgreSQL schema)
                for v in range(version, SCHEMA_VERSION):
                    for stmt in MIGRATIONS[v]:
                        await conn.execute(stmt)
                for stmt in (REPLACE_COMMIT_FUNCTION, COMMIT_FUNCTION):
                    await conn.execute(stmt)
                await conn.execute(
                    "UPDATE cronoq_schema_version SET version = $1 WHERE id = 1", SCHEMA_VERSION
                )

    async def _check_owners(self, conn: asyncpg.Connection) -> None:
        """Refuse tables that a role other than ours (or a superuser) owns: it could have
        planted triggers on them."""
        foreign = await conn.fetch(
            "SELECT t.tablename, t.tableowner FROM pg_tables AS t "
            "JOIN pg_roles AS r ON r.rolname = t.tableowner "
            "WHERE t.schemaname = $1 AND t.tablename LIKE 'cronoq\\_%' "
            "AND t.tableowner <> current_user AND NOT r.rolsuper",
            self.schema,
        )
        if foreign:
            names = ", ".join(f"{r[0]} (owned by {r[1]})" for r in foreign)
            raise self._fail(
                f"tables owned by a role that is neither this connection's nor a superuser: {names}"
            )

    def _pool_or_fail(self) -> asyncpg.Pool:
        if self._pool is None:
            raise self._fail("not open")
        return self._pool

    # --- leadership ---------------------------------------------------------------------------

    async def lead(self) -> int:
        """Wait until this process holds the schema's advisory lock (trying every 500 ms,
        reconnecting with backoff while the database cannot be reached); return the new
        epoch."""
        asyncpg = _asyncpg()
        self._pool_or_fail()
        self.status = "standing by: another server leads"
        while True:
            known = self._lock_conn
            if known is not None and not known.is_closed():
                conn = known
            else:
                conn = await self._retrying(
                    "open the lock connection",
                    lambda: asyncpg.connect(
                        self._dsn,
                        server_settings={"search_path": _quote(self.schema), **LOCK_SESSION},
                    ),
                )
                self._lock_conn = conn
                self.status = "standing by: another server leads"
            try:
                if await conn.fetchval(
                    "SELECT pg_try_advisory_lock($1, $2)", LOCK_CLASS, self._lock_key
                ):
                    break
            except Exception as e:
                if not _connection_lost(e):
                    raise
                log.warning("store %s: the lock connection failed: %s", self.location, e)
                await _close(conn)
                continue
            await asyncio.sleep(LOCK_POLL_S)
        try:
            epoch = await conn.fetchval(
                "UPDATE cronoq_leader SET epoch = CASE WHEN epoch >= $1 THEN 1 ELSE epoch + 1 END "
                "WHERE id = 1 RETURNING epoch",
                MAX_EPOCH,
            )
        except BaseException:
            await _close(conn)  # the lock goes with the session
            self._lock_conn = None
            raise
        self.epoch = int(epoch)
        self._lost = None
        self._probed = time.monotonic()
        conn.add_termination_listener(self._on_lock_closed)
        old, self._keeper = self._keeper, asyncio.get_running_loop().create_task(self._keep(conn))
        if old is not None:
            old.cancel()  # (the keeper of a leadership lost before: it ends on its own anyway)
        self.status = "leading"
        return self.epoch

    def _on_lock_closed(self, conn: object) -> None:
        # (called soon after, not at once: only the lock connection of the leadership we hold
        # now counts, not one closed by an earlier loss)
        if conn is self._lock_conn:
            self._lose("the lock connection was closed")

    def _lose(self, why: str) -> None:
        if self._lost is None and self.epoch:
            self._lost = f"leadership lost: {why}"
            log.error("store %s: %s", self.location, self._lost)
            self.status = self._lost
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()  # the lock is free for a standby at once

    async def _keep(self, conn: asyncpg.Connection) -> None:
        """The keeper: probe the lock connection every second, as long as it is the one of
        the leadership we hold (a keeper that outlives its leadership must not judge the next
        one by its closed connection)."""
        while self._lost is None and conn is self._lock_conn:
            try:
                await conn.fetchval("SELECT 1", timeout=KEEPER_TIMEOUT_S)
            except Exception as e:
                if conn is self._lock_conn:
                    self._lose(f"the lock connection's probe failed: {_describe(e)}")
                return
            if self._stale():
                return
            self._probed = time.monotonic()
            await asyncio.sleep(KEEPER_INTERVAL_S)

    def _stale(self) -> bool:
        """No probe succeeded for the keeper timeout (this process was paused, or its loop
        stalled: a standby may have taken over since, or may once our lock connection is
        closed): the leadership is lost."""
        if self._lost is None and time.monotonic() - self._probed > KEEPER_TIMEOUT_S:
            self._lose(f"no probe answered for {KEEPER_TIMEOUT_S:g} s")
        return self._lost is not None

    def _check_keeper(self) -> None:
        """Raise LeadershipLost if the keeper found the lock gone or the probes stale."""
        if self._stale():
            assert self._lost is not None
            raise LeadershipLost(self._lost)

    # --- reading ------------------------------------------------------------------------------

    async def load(self) -> Stored:
        pool = self._pool_or_fail()
        since = (
            0 if math.isinf(self.reload_finished) else time.time_ns() - to_ns(self.reload_finished)
        )
        async with pool.acquire() as conn:
            records = await conn.fetch(LOAD, since)
            schedules = await conn.fetch(
                "SELECT name, spec::text, template_payload, next_unix_ns, last_task_id "
                "FROM cronoq_recurring"
            )
            max_id = await conn.fetchval("SELECT max_id FROM cronoq_leader WHERE id = 1")
            paused = await conn.fetch("SELECT name FROM cronoq_pools WHERE paused")
            top = await conn.fetchval(
                "SELECT coalesce((SELECT max(id) FROM cronoq_tasks WHERE id < 0), "
                "(SELECT max(id) FROM cronoq_tasks))"
            )
        tasks = sorted((_from_pg(r) for r in records), key=lambda r: r[ID_AT])
        rows = [
            (name, spec, payload, next_ns, None if last is None else unsigned(last))
            for name, spec, payload, next_ns, last in schedules
        ]
        highest = max(unsigned(max_id or 0), 0 if top is None else unsigned(top))
        return Stored(tasks, rows, highest, [r[0] for r in paused])

    async def finished(self, task_id: int) -> Finished | None:
        """The stored row of a finished task, output included (None: unknown, live, pruned)."""
        record = await self._pool_or_fail().fetchrow(
            f"SELECT {COLUMNS} FROM cronoq_tasks WHERE id = $1 AND terminal", signed(task_id)
        )
        return None if record is None else Finished(_from_pg(record))

    # --- writing ------------------------------------------------------------------------------

    def commit_nowait(self, batch: Batch) -> asyncio.Future[None]:
        """Start writing one batch in one fenced transaction; batches are written in the order
        given. The future fails with LeadershipLost when fenced (or when the keeper lost the
        lock), with SchedulerError when the retry budget is spent."""
        return asyncio.ensure_future(self._ordered(self._write, batch))

    async def renew(self) -> None:
        """Nothing to extend (the lock lasts as long as its session): report the keeper's
        verdict."""
        self._check_keeper()

    async def prune(self, now: float) -> int:
        """Delete finished rows that ended more than `retention` seconds ago, PRUNE_ROWS per
        fenced transaction, never a finished task a live task depends on."""
        if math.isinf(self.retention):
            return 0  # finished rows are kept for ever
        before = to_ns(now - self.retention)
        total = 0
        while True:
            deleted = await self._ordered(self._prune_some, before)
            total += deleted
            if deleted < PRUNE_ROWS:
                return total

    async def _ordered(self, write: Callable[[Any], Awaitable[T]], arg: Any) -> T:
        async with self._order:
            return await self._retried(write, arg)

    async def _retried(self, write: Callable[[Any], Awaitable[T]], arg: Any) -> T:
        """write(arg) in a transaction, retried by the budgets of the module docstring."""
        delay, cap = COMMIT_BACKOFF_S
        outage_began: float | None = None
        others = 0
        while True:
            self._check_keeper()
            try:
                async with asyncio.timeout(COMMIT_TIMEOUT_S):
                    return await write(arg)
            except SchedulerError:  # fenced, or the store is closed: no retry helps
                raise
            except Exception as e:
                now = time.monotonic()
                if _connection_lost(e):
                    outage_began = now if outage_began is None else outage_began
                    if now - outage_began >= TRANSIENT_BUDGET_S:
                        raise self._fail(
                            f"the database was unreachable for {TRANSIENT_BUDGET_S:g} s: "
                            f"{_describe(e)}"
                        ) from None
                else:
                    outage_began = None
                    others += 1
                    if others > OTHER_RETRIES:
                        raise self._fail(f"write failed: {_describe(e)}") from None
                log.warning(
                    "store %s: write failed (%s); retrying in %.2f s",
                    self.location,
                    _describe(e),
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(cap, delay * 2)

    async def _fenced(self, conn: _Conn) -> None:
        """A transaction's first statement: lock the leader row, check the epoch (the commit
        function does the same inside itself)."""
        epoch = await conn.fetchval(FENCE)
        if epoch != self.epoch:
            raise self._deposed(f"epoch {epoch}, ours {self.epoch}")

    def _deposed(self, detail: str) -> LeadershipLost:
        self._lose(f"another server leads ({detail})")
        return LeadershipLost(FENCED)

    async def _write(self, batch: Batch) -> None:
        """One call of cronoq_commit: one round trip, one transaction."""
        asyncpg = _asyncpg()
        updates = _columns([_change(r, LIVE_TEXT, LIVE_JSON) for r in batch.updates], len(LIVE_IDS))
        finishes = _columns(
            [_change(r, DONE_TEXT, DONE_JSON) for r in batch.finishes], len(DONE_IDS)
        )
        inserts = _columns([_to_pg(r) for r in batch.inserts], len(INSERTED))
        schedules = _columns(
            [
                (_clean_text(n), _clean_json(spec), p, t, None if last is None else signed(last))
                for n, spec, p, t, last in batch.schedules
            ],
            len(SCHEDULE),
        )
        # (a name with NUL was stored with U+FFFD: removed by that name)
        removed = [_clean_text(n) for n in batch.removed_schedules] or None
        pools = _columns([(_clean_text(n), paused) for n, paused in batch.pools], len(POOLS))
        deletes = [signed(i) for i in batch.deletes] or None
        max_id = signed(batch.max_id) if batch.inserts else None
        pool = self._pool_or_fail()
        conn = self._writer
        if conn is None:
            conn = self._writer = await pool.acquire()
        try:
            await conn.execute(
                COMMIT,
                self.epoch,
                max_id,
                *updates,
                *finishes,
                *inserts,
                *schedules,
                removed,
                *pools,
                deletes,
            )
        except asyncpg.PostgresError as e:  # the server's answer: the connection is fine
            if e.sqlstate == FENCED_STATE:
                raise self._deposed(str(e)) from None
            raise
        except BaseException:
            # lost, timed out or cancelled during the call: a new connection for the next one
            self._writer = None
            conn.terminate()
            await pool.release(conn)
            raise

    async def _prune_some(self, before: int) -> int:
        async with self._pool_or_fail().acquire() as conn, _transaction(conn):
            await self._fenced(conn)
            status = await conn.execute(PRUNE, before)
        return int(status.rpartition(" ")[2])

    # --- closing ------------------------------------------------------------------------------

    async def close(self, release: bool = True) -> None:
        """Close the pool and the lock connection (which frees the lock: a standby takes over
        at once). `release` changes nothing here: the lock never outlives its session."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        pool, self._pool = self._pool, None
        writer, self._writer = self._writer, None
        if pool is not None:
            if writer is not None:
                await pool.release(writer)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), COMMIT_TIMEOUT_S)
            pool.terminate()
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            conn.remove_termination_listener(self._on_lock_closed)
            await _close(conn)
        self.epoch = 0
        self.status = "closed"


def _columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any] | None]:
    """Rows as `width` column arrays (the commit function's parameters); all NULL for none.
    A column of NULLs only is sent as one NULL, which the function's unnest pads with NULLs
    to the others' length all the same: asyncpg checks every element of an array it sends
    (two isinstance calls against abstract classes each), and a plain task's row has many."""
    if not rows:
        return [None] * width
    n = len(rows)
    return [None if column.count(None) == n else list(column) for column in zip(*rows, strict=True)]


def _change(row: tuple[Any, ...], text: tuple[int, ...], jsons: tuple[int, ...]) -> tuple[Any, ...]:
    """A Batch change row (LIVE_CHANGE or DONE_CHANGE columns, then the id) for the table: its
    text and JSON columns (`text`, `jsons`: their places) without NUL, the id signed."""
    out = list(row)
    for i in text:
        out[i] = _clean_text(out[i])
    for i in jsons:
        out[i] = _clean_json(out[i])
    out[-1] = signed(out[-1])
    return tuple(out)


@contextlib.asynccontextmanager
async def _transaction(conn: _Conn) -> AsyncIterator[None]:
    """conn.transaction(), except on a connection lost inside it: the transaction is gone with
    the session, and the error that says why propagates (asyncpg's own would raise the failed
    rollback's "the underlying connection is closed" instead). It stays a managed transaction,
    so a pool that gets the connection back mid-transaction (a cancelled task) rolls it back
    without a warning."""
    failed: BaseException | None = None
    try:
        async with conn.transaction():
            try:
                yield
            except BaseException as e:
                failed = e
                raise
    except Exception as e:
        if failed is not None and e is not failed and _connection_lost(e):
            raise failed from None
        raise


async def _no_reset(conn: object) -> None:
    """The pool's reset on release: nothing to undo (no connection changes its session, and a
    transaction always ends before the release), so no extra round trip per commit."""


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5.0)
    except Exception:
        conn.terminate()


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError:
        raise SchedulerError(
            "PostgresStore needs asyncpg: pip install 'cronoq[postgres]'"
        ) from None
    return asyncpg
