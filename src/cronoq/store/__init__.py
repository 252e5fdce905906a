"""Durable state: the `Store` protocol (store/base.py), its SQLite, PostgreSQL and in-memory
stores, and the codecs that turn payloads and results into bytes."""

from typing import TYPE_CHECKING

from .base import Batch, Finished, LeadershipLost, Store, Stored
from .codec import Codec, JsonCodec
from .memory import MemoryState, MemoryStore
from .postgres import PostgresStore
from .sqlite import SqliteStore

__all__ = [
    "Batch",
    "Codec",
    "Finished",
    "JsonCodec",
    "LeadershipLost",
    "MemoryState",
    "MemoryStore",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "Stored",
]


if TYPE_CHECKING:  # mypy (strict) checks here that the stores implement the protocol

    def _implements(
        sqlite: SqliteStore, postgres: PostgresStore, memory: MemoryStore
    ) -> tuple[Store, Store, Store]:
        return sqlite, postgres, memory
