"""core/search.py against a plain reference: every filter field, every order both ways, pages
and totals, over an engine holding tasks in many states (bench/search.py's, which times the
search on 100k tasks)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cronoq.core.engine import Engine
from cronoq.core.model import (
    CANCELLED,
    DEAD_LETTERED,
    FAILED,
    FIRST_TERMINAL,
    READY,
    RUNNING,
    SUCCEEDED,
    TaskRecord,
)
from cronoq.core.search import SORTS, TaskFilter, matching_ids, search

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _reference_key(sort: str) -> Callable[[TaskRecord], tuple[Any, int]]:
    """The orders as docs/http.md states them, written out plainly."""

    def key(r: TaskRecord) -> tuple[Any, int]:
        value: Any = {
            "id": r.id,
            "status": r.status,
            "pool": r.pool,
            "kind": r.kind,
            "priority": -r.cls,
            "submitted": r.submitted_at,
            "started": r.started_at or r.submitted_at,
            "finished": r.finished_at if r.status >= FIRST_TERMINAL else 0.0,
            "attempt": r.attempt,
        }[sort]
        return (value, r.id)

    return key


def _matches(r: TaskRecord, f: TaskFilter) -> bool:
    return (
        (f.pools is None or r.pool in f.pools)
        and (not f.statuses or r.status in f.statuses)
        and (not f.kinds or r.kind in f.kinds)
        and all((r.tags or {}).get(k) == v for k, v in f.tags.items())
        and (f.key is None or r.key == f.key)
        and (not f.key_prefix or (r.key or "").startswith(f.key_prefix))
        and (f.submitted_after is None or r.submitted_at >= f.submitted_after)
        and (f.submitted_before is None or r.submitted_at < f.submitted_before)
        and (not f.ids or r.id in f.ids)
    )


def _populate(n: int) -> Engine:
    """bench/search.py's engine of `n` tasks in many states (one population for both)."""
    spec = importlib.util.spec_from_file_location("bench_search", BENCH / "search.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))  # for its `_common`
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    engine: Engine = module.populate(n)
    return engine


@pytest.fixture(scope="module")
def engine() -> Engine:
    return _populate(600)


FILTERS = {
    "everything": TaskFilter(),
    "pool": TaskFilter(pools=frozenset({"b"})),
    "no pool": TaskFilter(pools=frozenset()),
    "status": TaskFilter(statuses=frozenset({FAILED, DEAD_LETTERED, CANCELLED})),
    "one status": TaskFilter(statuses=frozenset({RUNNING})),
    "kind": TaskFilter(kinds=frozenset({"sms"})),
    "tags": TaskFilter(tags={"tenant": "t3", "region": "eu"}),
    "key": TaskFilter(key="order-7"),
    "missing key": TaskFilter(key="nobody"),
    "key prefix": TaskFilter(key_prefix="user-1"),
    "time range": TaskFilter(submitted_after=10.0, submitted_before=20.0),
    "ids": TaskFilter(ids=frozenset({1, 2, 3, 50, 599, 10_000})),
    "ids and status": TaskFilter(ids=frozenset(range(1, 100)), statuses=frozenset({READY})),
    "many tests": TaskFilter(
        pools=frozenset({"a"}),
        kinds=frozenset({"mail", "sms"}),
        key_prefix="order-",
        submitted_after=5.0,
        tags={"region": "eu"},
    ),
}


def test_the_engine_holds_tasks_in_every_state_used(engine: Engine) -> None:
    statuses = {r.status for r in engine.tasks.values()}
    assert {READY, RUNNING, SUCCEEDED, FAILED, DEAD_LETTERED, CANCELLED} <= statuses


@pytest.mark.parametrize("name", FILTERS)
def test_search_is_the_reference_for_every_filter_order_and_page(engine: Engine, name: str) -> None:
    flt = FILTERS[name]
    expected = [r for r in engine.tasks.values() if _matches(r, flt)]
    assert matching_ids(engine, flt) == sorted(r.id for r in expected)
    for sort in SORTS:
        for ascending in (False, True):
            ordered = sorted(expected, key=_reference_key(sort), reverse=not ascending)
            for offset, limit in ((0, 25), (7, 10), (0, 0), (len(ordered) - 3, 10)):
                offset = max(offset, 0)
                page, total = search(engine, flt, sort, ascending, limit, offset)
                assert total == len(expected), (name, sort, ascending, offset, limit)
                want = [r.id for r in ordered[offset : offset + limit]]
                assert [r.id for r in page] == want, (name, sort, ascending, offset, limit)


def test_newest_first_is_the_default(engine: Engine) -> None:
    page, total = search(engine, TaskFilter(), limit=3)
    top = sorted(engine.tasks)[-3:]
    assert [r.id for r in page] == top[::-1] and total == len(engine.tasks)


def test_forgotten_and_new_tasks_are_seen_by_the_id_walk() -> None:
    engine = _populate(50)
    search(engine, TaskFilter())  # the id index now exists
    ended = [r for r in engine.tasks.values() if r.status >= FIRST_TERMINAL]
    assert engine.delete(ended[:3]) == ended[:3]
    new = engine.submit(TaskRecord("late", "b", key="order-late"), 100.0)[0]
    page, total = search(engine, TaskFilter(key_prefix="order-"), limit=1)
    assert page == [new]
    assert total == sum(1 for r in engine.tasks.values() if (r.key or "").startswith("order-"))
    ids = {r.id for r in search(engine, TaskFilter(), limit=1000)[0]}
    assert ids == set(engine.tasks) and not ids & {r.id for r in ended[:3]}


def test_bad_arguments_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="unknown sort"):
        search(engine, TaskFilter(), "size")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        search(engine, TaskFilter(), limit=-1)
