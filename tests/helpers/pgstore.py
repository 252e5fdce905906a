"""Beside a PostgresStore under test: SQL on a connection of our own, and the sessions a store
runs (its lock session, its pool's), found in `pg_locks` and `pg_stat_activity` to be ended
with `pg_terminate_backend` as an operator (or a failing network) would.

`where` is anything with the server's `url` and the test's `schema` (tests/conftest.py `Pg`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import urlsplit

import asyncpg

LOCK_CLASS = 1668444017  # the leadership lock: (LOCK_CLASS, the schema's OID)
MIGRATION_CLASS = 1668444013  # migrations: (MIGRATION_CLASS, hashtext(schema))


class Where(Protocol):
    @property
    def url(self) -> str: ...

    @property
    def schema(self) -> str: ...


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


@contextlib.asynccontextmanager
async def connected(where: Where, **options: Any) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own, with `search_path` on the test's schema."""
    conn = await asyncpg.connect(
        where.url, server_settings={"search_path": quote(where.schema)}, **options
    )
    try:
        yield conn
    finally:
        await conn.close()


async def execute(where: Where, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    async with connected(where) as conn:
        for st in statements:
            sql, args = (st, ()) if isinstance(st, str) else st
            await conn.execute(sql, *args)


async def fetch(where: Where, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    async with connected(where) as conn:
        return [tuple(r) for r in await conn.fetch(sql, *args)]


async def lock_pids(where: Where) -> list[int]:
    """The backends holding the schema's leadership lock (one at most, while a store leads)."""
    async with connected(where) as conn:
        rows = await conn.fetch(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid = $1 AND objid = (SELECT oid FROM pg_namespace WHERE nspname = $2)",
            LOCK_CLASS,
            where.schema,
        )
        return [r[0] for r in rows]


async def lock_pid(where: Where) -> int:
    (pid,) = await lock_pids(where)
    return pid


async def terminate(where: Where, pids: list[int]) -> None:
    async with connected(where) as conn:
        for pid in pids:
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid), pid


async def end_lock_session(where: Where) -> int:
    """pg_terminate_backend of the leader's lock session; returns its pid."""
    pid = await lock_pid(where)
    await terminate(where, [pid])
    return pid


async def sessions(where: Where, application: str) -> list[int]:
    """The backends of an `application_name` (besides the caller's own)."""
    async with connected(where) as conn:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
            "AND pid <> pg_backend_pid()",
            application,
        )
        return [r[0] for r in rows]


def with_params(url: str, **params: str) -> str:
    sep = "&" if urlsplit(url).query else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in params.items())


def address(url: str) -> tuple[str, int]:
    """The host and port of a server's TCP URL."""
    parts = urlsplit(url)
    assert parts.hostname is not None, url
    return parts.hostname, parts.port or 5432
