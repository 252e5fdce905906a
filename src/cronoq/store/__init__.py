"""Durable state: the `Store` protocol (store/base.py), its SQLite and in-memory stores, and
the codecs that turn payloads and results into bytes."""

from typing import TYPE_CHECKING

from .base import Batch, Finished, LeadershipLost, Store, Stored
from .codec import Codec, JsonCodec
from .memory import MemoryState, MemoryStore
from .sqlite import SqliteStore

__all__ = [
    "Batch",
    "Codec",
    "Finished",
    "JsonCodec",
    "LeadershipLost",
    "MemoryState",
    "MemoryStore",
    "SqliteStore",
    "Store",
    "Stored",
]


if TYPE_CHECKING:  # mypy (strict) checks here that both stores implement the protocol

    def _implements(sqlite: SqliteStore, memory: MemoryStore) -> tuple[Store, Store]:
        return sqlite, memory
