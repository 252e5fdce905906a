"""Finding tasks among those an engine holds (live and retained) by a filter, for operators:
a page of a search in any order with the count of every match, and the ids a bulk action
covers. Sans-I/O like the rest of the core: it only reads the engine.

A filter is compiled once per request into a predicate that runs only the tests that are set,
and the candidates are narrowed first where an index answers directly (an exact key, a list of
ids). Newest first by id walks the engine's id index backwards and keeps only the page, still
counting the rest; other orders keep the best `offset + limit` matches in a heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from .engine import Engine
from .model import FIRST_TERMINAL, TaskRecord

__all__ = ["SORTS", "Sort", "TaskFilter", "matching_ids", "search"]

Sort = Literal[
    "id", "status", "pool", "kind", "priority", "submitted", "started", "finished", "attempt"
]
SORTS: tuple[Sort, ...] = get_args(Sort)

Match = Callable[[TaskRecord], bool]


def _started(rec: TaskRecord) -> float:
    return rec.started_at or rec.submitted_at


def _finished(rec: TaskRecord) -> float:
    return rec.finished_at if rec.status >= FIRST_TERMINAL else 0.0


# Each order's key; ties go by id, in the same direction. Priority ranks by urgency (critical
# is the largest, so first newest-first-style); a task that has not ended has finished at 0.
_KEYS: dict[str, Callable[[TaskRecord], tuple[Any, int]]] = {
    "id": lambda r: (r.id, 0),
    "status": lambda r: (r.status, r.id),
    "pool": lambda r: (r.pool, r.id),
    "kind": lambda r: (r.kind, r.id),
    "priority": lambda r: (-r.cls, r.id),
    "submitted": lambda r: (r.submitted_at, r.id),
    "started": lambda r: (_started(r), r.id),
    "finished": lambda r: (_finished(r), r.id),
    "attempt": lambda r: (r.attempt, r.id),
}


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks: every field set must match. `pools` None is any pool and an empty set
    none (a caller allowed no pool); the other collections match anything when empty, else any
    of their values; `tags` must all be among the task's; times are Unix seconds, `after`
    inclusive and `before` exclusive, against the submission time."""

    pools: frozenset[str] | None = None
    statuses: frozenset[int] = frozenset()
    kinds: frozenset[str] = frozenset()
    tags: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None
    key_prefix: str | None = None
    submitted_after: float | None = None
    submitted_before: float | None = None
    ids: frozenset[int] = frozenset()

    def compile(self) -> Match | None:
        """The predicate of the tests that are set, each bound to its values (None: every
        task matches). `key` and `ids` are tested too, so candidates may come from anywhere."""
        tests: list[Match] = []
        if self.pools is not None:
            tests.append(_member("pool", self.pools))
        if self.statuses:
            tests.append(_member("status", self.statuses))
        if self.kinds:
            tests.append(_member("kind", self.kinds))
        if self.ids:
            tests.append(_member("id", self.ids))
        if self.key is not None:
            key = self.key
            tests.append(lambda r: r.key == key)
        if self.key_prefix:
            prefix = self.key_prefix
            tests.append(lambda r: r.key is not None and r.key.startswith(prefix))
        if self.submitted_after is not None:
            after = self.submitted_after
            tests.append(lambda r: r.submitted_at >= after)
        if self.submitted_before is not None:
            before = self.submitted_before
            tests.append(lambda r: r.submitted_at < before)
        tests.extend(_tag(k, v) for k, v in self.tags.items())
        return _all(tests)

    def candidates(self, engine: Engine) -> Collection[TaskRecord] | None:
        """The few tasks an index names (by key, by ids; none for no pool at all), or None
        when every task is one."""
        if self.pools is not None and not self.pools:
            return ()
        if self.key is not None:
            rec = engine.lookup(self.key)
            return () if rec is None else (rec,)
        if self.ids:
            found = (engine.lookup(i) for i in sorted(self.ids))
            return [r for r in found if r is not None]
        return None


def _member(attr: str, values: frozenset[Any]) -> Match:
    if len(values) == 1:
        (only,) = values
        if attr == "pool":
            return lambda r: r.pool == only
        if attr == "status":
            return lambda r: r.status == only
        if attr == "kind":
            return lambda r: r.kind == only
        return lambda r: r.id == only
    if attr == "pool":
        return lambda r: r.pool in values
    if attr == "status":
        return lambda r: r.status in values
    if attr == "kind":
        return lambda r: r.kind in values
    return lambda r: r.id in values


def _tag(k: str, v: str) -> Match:
    return lambda r: r.tags is not None and r.tags.get(k) == v


def _all(tests: list[Match]) -> Match | None:
    """One predicate of all `tests`, nested pairwise rather than looped: fewer calls for the
    usual one to three tests."""
    if not tests:
        return None
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        a, b = tests
        return lambda r: a(r) and b(r)
    if len(tests) == 3:
        a, b, c = tests
        return lambda r: a(r) and b(r) and c(r)
    head, rest = tests[0], _all(tests[1:])
    assert rest is not None
    return lambda r: head(r) and rest(r)


def search(
    engine: Engine,
    flt: TaskFilter,
    sort: Sort = "id",
    ascending: bool = False,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[TaskRecord], int]:
    """One page of the tasks matching `flt` in `sort` order (largest first unless
    `ascending`), after skipping `offset` of them, and the count of all matches."""
    if sort not in _KEYS:
        raise ValueError(f"unknown sort {sort!r}: one of {', '.join(SORTS)}")
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must not be negative")
    match = flt.compile()
    candidates = flt.candidates(engine)
    want = offset + limit
    if candidates is None and sort == "id":
        return _by_id(engine, match, ascending, offset, want)
    pool: Iterable[TaskRecord] = engine.tasks.values() if candidates is None else candidates
    matches = list(pool) if match is None else [r for r in pool if match(r)]
    pick = heapq.nsmallest if ascending else heapq.nlargest
    return pick(want, matches, key=_KEYS[sort])[offset:], len(matches)


def _by_id(
    engine: Engine, match: Match | None, ascending: bool, offset: int, want: int
) -> tuple[list[TaskRecord], int]:
    """Walk the id index in the order asked, keep matches `offset` to `want`, count them all."""
    tasks = engine.tasks
    ids = engine.id_index()
    order = iter(ids) if ascending else reversed(ids)
    page: list[TaskRecord] = []
    seen = 0
    for i in order:
        rec = tasks.get(i)
        if rec is None or (match is not None and not match(rec)):
            continue
        seen += 1
        if seen > want:  # past the page: the rest is only counted
            break
        if seen > offset:
            page.append(rec)
    else:
        return page, seen
    if match is None:
        return page, len(tasks)
    get = tasks.get
    return page, seen + sum(1 for i in order if (r := get(i)) is not None and match(r))


def matching_ids(engine: Engine, flt: TaskFilter) -> list[int]:
    """The ids of every task matching `flt`, ascending (what a bulk action works through)."""
    match = flt.compile()
    candidates = flt.candidates(engine)
    pool: Iterable[TaskRecord] = engine.tasks.values() if candidates is None else candidates
    return sorted(r.id for r in pool if match is None or match(r))
