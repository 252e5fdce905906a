"""Durable state: the SQLite store and the codecs that turn payloads and results into bytes."""

from .codec import Codec, JsonCodec
from .sqlite import SqliteStore

__all__ = ["Codec", "JsonCodec", "SqliteStore"]
