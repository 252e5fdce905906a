"""Lazily invalidated heaps of ready tasks.

Entries are tuples `(key, seq, gen, task)`: an entry is live while `task.qgen == gen`; a task
that leaves a queue just bumps its `qgen`, and dead entries are dropped when they reach the top.
"""

from __future__ import annotations

from heapq import heappop
from typing import Any

from .model import TaskRecord


def live_head(heap: list[tuple[Any, int, int, TaskRecord]]) -> TaskRecord | None:
    """The task of the first live entry, dropping dead entries above it."""
    while heap:
        e = heap[0]
        r = e[3]
        if r.qgen == e[2]:
            return r
        heappop(heap)
    return None
