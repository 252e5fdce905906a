"""A real PostgreSQL server for the tests: a private cluster in a temp dir, on a free port.

`CRONOQ_TEST_PG_URL` names an existing server instead (its database must let the user create
schemas). Otherwise `Cluster.start()` starts a private cluster with `fsync=off` (bench/_pg.py,
which the benchmarks share: the binaries it looks for, and the `postgres` account as root);
`stop()` ends it and throws its data away.

Each test gets a schema of its own (`Cluster.schema()`), so tests never share tasks, keys or
leadership.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import _pg  # bench/_pg.py, found through the path just added

ENV_URL = "CRONOQ_TEST_PG_URL"

_schemas = itertools.count(1)


class Cluster(_pg.Cluster):
    """One PostgreSQL server for the whole test session."""

    def __init__(self) -> None:
        super().__init__(
            os.environ.get(ENV_URL) or "", fsync=False, instead=f"{ENV_URL} to a server's URL"
        )

    def schema(self) -> str:
        """A schema name no other test of this session uses (nothing creates it yet)."""
        return f"t{os.getpid()}_{next(_schemas)}"
