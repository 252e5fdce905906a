"""Shared resources: semaphores and token buckets, taken at dispatch, shared by every pool.

A task that cannot get a resource is *parked* on it (out of the ready queues, so it never
blocks tasks behind it) and put back when the resource can serve it again: a semaphore when
permits are released, a token bucket at the time enough tokens will have refilled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappop, heappush

from .model import TaskRecord

# Token counts are floats; this much shortfall still counts as enough (refill rounding).
_EPS = 1e-9


@dataclass(frozen=True)
class ResourceConfig:
    """Core view of a cronoq.Resource: kind is "semaphore" (permits) or "token_bucket"."""

    name: str
    kind: str
    permits: int = 0
    rate: float = 0.0
    burst: int = 0

    @property
    def capacity(self) -> float:
        return self.permits if self.kind == "semaphore" else self.burst


class ResourceState:
    """One resource's level plus the tasks parked on it, best first."""

    __slots__ = (
        "burst",
        "cfg",
        "in_use",
        "is_bucket",
        "last",
        "name",
        "parked",
        "permits",
        "rate",
        "tokens",
        "wake",
    )

    def __init__(self, cfg: ResourceConfig, now: float) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.is_bucket = cfg.kind == "token_bucket"
        self.permits = cfg.permits
        self.in_use = 0
        self.rate = cfg.rate
        self.burst = float(cfg.burst)
        self.tokens = float(cfg.burst)  # buckets start full
        self.last = now
        # (class, eligible_at, seq, generation, task, amount wanted): best first
        self.parked: list[tuple[int, float, int, int, TaskRecord, int]] = []
        self.wake: float | None = None  # refill timer already set for this time

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now

    def available(self, amount: int, now: float) -> bool:
        if self.is_bucket:
            self._refill(now)
            return self.tokens + _EPS >= amount
        return self.in_use + amount <= self.permits

    def take(self, amount: int, now: float) -> None:
        if self.is_bucket:
            self._refill(now)
            self.tokens = max(0.0, self.tokens - amount)
        else:
            self.in_use += amount

    def release(self, amount: int) -> None:
        """End of an attempt: semaphores get their permits back; buckets refill by time only."""
        if not self.is_bucket:
            self.in_use -= amount

    def ready_at(self, amount: int, now: float) -> float:
        """When a bucket will hold `amount` tokens (now for a semaphore or a full enough bucket).
        A bucket that is short is ready strictly later than `now`, even when the shortfall
        refills in less than the float step of `now` (Unix-sized times): a wake-up at `now`
        itself would find it short again, at the same time, forever."""
        if not self.is_bucket:
            return now
        self._refill(now)
        missing = amount - self.tokens
        if missing <= _EPS:
            return now
        return max(now + missing / self.rate, math.nextafter(now, math.inf))

    def level(self, now: float) -> float:
        """Units available now (free permits or whole tokens)."""
        if self.is_bucket:
            self._refill(now)
            return self.tokens
        return float(self.permits - self.in_use)

    def park(self, rec: TaskRecord, amount: int) -> None:
        rec.qgen += 1
        heappush(self.parked, (rec.cls, rec.eligible_at, rec.seq, rec.qgen, rec, amount))

    def unpark(
        self, now: float, fits: Callable[[TaskRecord], bool]
    ) -> tuple[list[TaskRecord], int | None]:
        """Take out, best first, the parked tasks that the current level can serve and that
        `fits` (their pool has a free slot); one that wants more than is left lets smaller
        ones behind it go (work conserving). Also returns the smallest amount still waiting
        for the level to rise (a lower bound: 1 when the level ran out before the scan ended),
        or None."""
        out: list[TaskRecord] = []
        kept = []
        budget = self.level(now)
        parked = self.parked
        short: int | None = None
        while parked:
            entry = parked[0]
            rec = entry[4]
            if rec.qgen != entry[3] or rec.parked is not self:
                heappop(parked)
                continue
            need = entry[5]
            if need > budget + _EPS:
                if budget + _EPS < 1:  # nothing smaller can be served either
                    short = 1
                    break
                short = need if short is None else min(short, need)
                kept.append(heappop(parked))
                continue
            heappop(parked)
            if fits(rec):
                budget -= need
                out.append(rec)
            else:
                kept.append(entry)
        for entry in kept:
            heappush(parked, entry)
        return out, short
