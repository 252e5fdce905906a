"""`cronoq.client`'s additions for operators without a server: the filter, sort and action a
search or a bulk call sends, and the arguments refused before anything is sent."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

import cronoq.client
from cronoq.client import BULK_ACTIONS, SORTS, Client, PoolSnapshot, TaskInfo
from cronoq.client import _client as impl
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb

NOWHERE = "127.0.0.1:1"  # nothing listens: the checks below must fail before connecting


def test_the_vocabularies_follow_the_wire_enums() -> None:
    assert SORTS == (
        "id", "status", "pool", "kind", "priority", "submitted", "started", "finished", "attempt",
    )  # fmt: skip
    assert BULK_ACTIONS == ("cancel", "retry", "delete")
    for name in ("BULK_ACTIONS", "BulkResult", "PoolControl", "SearchPage", "SORTS"):
        assert hasattr(cronoq.client, name) and name not in cronoq.client.__all__
    assert repr(cronoq.client.BulkResult(1, 0)) == "BulkResult(matched=1, affected=0, " + (
        "unavailable_shards=())"
    )
    assert cronoq.client.BulkResult.__module__ == "cronoq.client"


def test_a_filter_carries_every_keyword_given() -> None:
    when = datetime(2030, 1, 2, 9, tzinfo=UTC)
    sent = impl._task_filter(
        {
            "pools": ["a", "b"],
            "statuses": ["READY", "dead_lettered"],
            "kinds": ["mail"],
            "tags": {"team": "ops", "n": 3},
            "key": "k1",
            "key_prefix": "nightly@",
            "submitted_after": when,
            "submitted_before": 1_900_000_000.5,
            "ids": [4, 5],
        }
    )
    assert sent == pb.TaskFilter(
        pools=["a", "b"],
        statuses=[pb.TASK_STATUS_READY, pb.TASK_STATUS_DEAD_LETTERED],
        kinds=["mail"],
        tags={"team": "ops", "n": "3"},
        key="k1",
        key_prefix="nightly@",
        submitted_after_unix_ns=int(when.timestamp() * 1e9),
        submitted_before_unix_ns=int(1_900_000_000.5 * 1e9),
        ids=[4, 5],
    )
    empty = impl._task_filter({})
    assert empty == pb.TaskFilter()  # matches every task
    assert not empty.HasField("submitted_after_unix_ns")


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda c: c.search_tasks(pools="a"), TypeError, "not one string"),
        (lambda c: c.bulk("cancel", kinds="mail"), TypeError, "not one string"),
        (lambda c: c.search_tasks(statuses=["done"]), ValueError, "unknown task status"),
        (lambda c: c.search_tasks(sort="age"), ValueError, "unknown sort 'age'"),
        (lambda c: c.bulk("purge"), ValueError, "unknown bulk action 'purge'"),
    ],
)
def test_bad_arguments_are_refused_before_sending(call: Any, error: type, words: str) -> None:
    async def attempt() -> None:
        async with Client(NOWHERE) as c:
            await call(c)

    with pytest.raises(error, match=words):
        asyncio.run(attempt())


def test_a_published_server_s_messages_read_as_unknown_and_not_paused() -> None:
    info = impl._task_info(pb.TaskInfo(id=3, status=pb.TASK_STATUS_READY, pool="a"))
    assert (info.worker_name, info.worker_id) == ("", 0)
    ran = impl._task_info(pb.TaskInfo(id=3, status=pb.TASK_STATUS_RUNNING, worker_name="w",
                                      worker_id=9))  # fmt: skip
    assert (ran.worker_name, ran.worker_id) == ("w", 9)
    pool = impl._pool_snapshot(pb.PoolSnapshot(name="a", pending_by_class=[0, 0, 2, 0]))
    assert (pool.paused, pool.unserved) == (False, False)
    both = impl._pool_snapshot(pb.PoolSnapshot(name="a", paused=True, unserved=True))
    assert (both.paused, both.unserved) == (True, True)
    # the new fields come last, with defaults: the published positional order still builds
    assert TaskInfo(1, "ready", "a").worker_id == 0
    assert PoolSnapshot("a", *([0] * 4), (), *([0] * 4), *([0.0] * 8)).unserved is False
