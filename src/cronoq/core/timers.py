"""The engine's one timer heap: every wake-up the engine needs (retry backoff, attempt timeout,
lease expiry, awaited keys, token refills, fixed starts, autoscaler evaluations, cron
occurrences) is an entry here, so the driver keeps a single timer for the whole engine.

An entry names its handler: `advance()` calls `handler(obj, tag, when, now)` for each due
entry in time order (ties in the order they were set). A handler checks whether its timer still
applies (the task may have moved on): entries are never removed, only outlived.

Handlers are registered once and entries name them by number, so an entry about a plain value
holds nothing the garbage collector tracks: an attempt's lease and timeout entries name it by
its lease id, not the attempt, and outlive it by up to the lease's TTL (30 s of attempts at
10k a second would otherwise stay alive, and be walked by every full collection)."""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

# (obj, tag, when, now): what the timer is about, the tag it was set with, when it was due
# and the time of the advance() that fires it.
Handler = Callable[[Any, int, float, float], None]


class Timers:
    __slots__ = ("_handlers", "_heap", "_seq")

    def __init__(self) -> None:
        self._handlers: list[Handler] = []
        self._heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def handler(self, fn: Handler) -> int:
        """Register a handler; entries name it by the number returned."""
        self._handlers.append(fn)
        return len(self._handlers) - 1

    def set(self, when: float, handler: int, obj: Any, tag: int = 0) -> None:
        self._seq += 1
        heappush(self._heap, (when, self._seq, handler, obj, tag))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def fire(self, now: float) -> None:
        """Run every handler due at or before `now`, also those set meanwhile."""
        heap = self._heap
        handlers = self._handlers
        while heap and heap[0][0] <= now:
            when, _, handler, obj, tag = heappop(heap)
            handlers[handler](obj, tag, when, now)
