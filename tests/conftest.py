"""Fixtures every test directory may use: a real PostgreSQL server (helpers/pg.py), started at
the first test that asks for it and stopped at the end of the session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from helpers.pg import Cluster


@dataclass(frozen=True)
class Pg:
    """Where a test's PostgreSQL store lives: the server's URL and a schema of its own."""

    url: str
    schema: str


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg(pg_cluster: Cluster) -> Pg:
    return Pg(pg_cluster.url, pg_cluster.schema())
