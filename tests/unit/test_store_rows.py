"""Task records and schedules to store rows and back (cronoq.store.rows), through a real table.

Each round trip writes with the store's own INSERT/UPDATE statements into an in-memory SQLite
database made from the version 1 schema plus the migrations, then reads with TASK_COLUMNS, so
a column order that drifts between the row builders and the SQL fails here.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from cronoq._durable import _schedule
from cronoq.core.cron import parse_cron, zone
from cronoq.core.model import (
    BLOCKED,
    CANCELLED,
    DEAD_LETTERED,
    FAILED,
    READY,
    RETRYING,
    SUCCEEDED,
    Extras,
    PastAttempt,
    RetryPolicy,
    TaskRecord,
    resubmission,
)
from cronoq.core.recurring import Recurring
from cronoq.store.base import TASK_COLUMNS, first_id, from_ns, to_ns
from cronoq.store.codec import JsonCodec, check_codec, encode_with
from cronoq.store.rows import (
    insert_row,
    record_from_row,
    retry_from,
    retry_json,
    schedule_row,
    update_row,
)
from cronoq.store.sqlite import (
    _INSERT_TASK,
    _SCHEMA_V1,
    _UPDATE_DONE,
    _UPDATE_LIVE,
    _UPSERT_RECURRING,
    MIGRATIONS,
    SCHEMA_VERSION,
)

CODEC = JsonCodec()
T0 = 1_800_000_000.25  # a Unix time with a fraction
US = 1e-6  # what a nanosecond round trip may lose at this magnitude (float spacing ~2e-7)


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for stmt in _SCHEMA_V1:
            conn.execute(stmt)
        for version in range(1, SCHEMA_VERSION):
            for stmt in MIGRATIONS[version]:
                conn.execute(stmt)
        yield conn


def write(db: sqlite3.Connection, rec: TaskRecord, output: bytes | None = None) -> None:
    payload = None if rec.payload is None else CODEC.encode(rec.payload)
    db.execute(_INSERT_TASK, insert_row(rec, payload, output, T0 + 5))


def read(db: sqlite3.Connection, tid: int, codec: Any = CODEC) -> tuple[TaskRecord, str | None]:
    row = db.execute(f"SELECT {TASK_COLUMNS} FROM cronoq_tasks WHERE id = ?", (tid,)).fetchone()
    return record_from_row(row, codec)


def task(status: int, tid: int = first_id(1), **fields: Any) -> TaskRecord:
    rec = TaskRecord(fields.pop("payload", {"p": [1, 2]}), "default", **fields)
    rec.id = tid
    rec.seq = 7
    rec.status = status
    rec.submitted_at = T0
    return rec


def test_full_ready_task_round_trip(db: sqlite3.Connection) -> None:
    retry = RetryPolicy(4, 0.5, 3.0, 9.0, jitter=False)
    rec = task(
        READY,
        cls=1,
        kind="report",
        key="k",
        tenant="acme",
        deadline=T0 + 60,
        duration_hint=0.25,
        timeout=30.0,
        retry=retry,
        tags={"a": "b"},
        labels={"gpu": "yes"},
        extra=Extras(
            start_at=T0 + 10,
            tolerance=2.0,
            on_miss="skip",
            deps=[(5, "success"), ("parent", "failure")],
            resources={"db": 2},
        ),
    )
    rec.eligible_at = T0 + 1
    write(db, rec)
    back, problem = read(db, rec.id)
    assert problem is None
    assert (back.id, back.seq, back.status, back.attempt) == (rec.id, 7, READY, 0)
    assert (back.pool, back.cls, back.kind, back.key, back.tenant) == (
        "default",
        1,
        "report",
        "k",
        "acme",
    )
    assert back.payload == {"p": [1, 2]}
    assert back.deadline == pytest.approx(T0 + 60, abs=US)
    assert back.submitted_at == pytest.approx(T0, abs=US)
    assert back.eligible_at == pytest.approx(T0 + 1, abs=US)
    assert (back.duration_hint, back.timeout) == (0.25, 30.0)
    assert back.retry is not None
    assert (back.retry.max_attempts, back.retry.initial_backoff, back.retry.multiplier) == (
        4,
        0.5,
        3.0,
    )
    assert (back.retry.max_backoff, back.retry.jitter) == (9.0, False)
    assert (back.tags, back.labels) == ({"a": "b"}, {"gpu": "yes"})
    assert back.extra is not None
    assert back.extra.start_at == pytest.approx(T0 + 10, abs=US)
    assert (back.extra.tolerance, back.extra.on_miss) == (2.0, "skip")
    assert back.extra.deps == [(5, "success"), ("parent", "failure")]
    assert back.extra.resources == {"db": 2}


def test_plain_task_has_no_extra_and_null_columns(db: sqlite3.Connection) -> None:
    rec = task(BLOCKED, payload=None)
    write(db, rec)
    row = db.execute(
        "SELECT payload, fixed_start, deps, retry, tags, worker, attempts FROM cronoq_tasks"
    ).fetchone()
    assert row == (None, None, None, None, None, None, None)
    back, problem = read(db, rec.id)
    assert problem is None
    assert back.extra is None and back.payload is None and back.retry is None
    assert back.eligible_at == 0.0


def test_retrying_task_keeps_its_retry_time(db: sqlite3.Connection) -> None:
    rec = task(RETRYING)
    rec.attempt = 2
    rec.message = "boom"
    rec.ready_at = T0 + 42.5
    write(db, rec)
    assert db.execute("SELECT status, terminal, attempt, message FROM cronoq_tasks").fetchone() == (
        "retrying",
        0,
        2,
        "boom",
    )
    back, _ = read(db, rec.id)
    assert back.status == RETRYING and back.attempt == 2
    assert back.ready_at == pytest.approx(T0 + 42.5, abs=US)


def test_retrying_row_without_retry_time_retries_at_once(db: sqlite3.Connection) -> None:
    """A version 1 file has no not_before: the retry is due from the task's arrival."""
    rec = task(RETRYING)
    rec.attempt = 1
    write(db, rec)
    db.execute("UPDATE cronoq_tasks SET not_before = NULL, eligible = NULL")
    back, _ = read(db, rec.id)
    assert back.ready_at == back.submitted_at
    assert back.eligible_at == 0.0


def test_finished_task_row_round_trip(db: sqlite3.Connection) -> None:
    rec = task(SUCCEEDED, key="k")
    rec.attempt = 1
    rec.finished_at = T0 + 3
    rec.output = {"r": 1}
    rec.payload = None  # the engine drops a finished task's payload
    write(db, rec, output=encode_with(CODEC, rec.output))
    row = db.execute("SELECT status, terminal, attempt, updated, output FROM cronoq_tasks")
    assert row.fetchone() == ("succeeded", 1, 1, to_ns(T0 + 3), b'{"r":1}')
    back, problem = read(db, rec.id)
    assert problem is None
    assert back.status == SUCCEEDED and back.output == {"r": 1}
    assert back.finished_at == pytest.approx(T0 + 3, abs=US)
    # The payload its row still holds is not read back: nothing submits a success again.
    db.execute("UPDATE cronoq_tasks SET payload = ?", (b'{"p":1}',))
    assert read(db, rec.id)[0].payload is None


@pytest.mark.parametrize("status", [FAILED, DEAD_LETTERED, CANCELLED])
def test_a_task_that_ended_without_succeeding_reads_back_whole(
    db: sqlite3.Connection, status: int
) -> None:
    extra = Extras(start_at=T0 + 10, tolerance=2.0, on_miss="skip", deps=[(5, "success")])
    extra.resources = {"db": 2}
    rec = task(status, cls=0, kind="report", key="k", tenant="acme", deadline=T0 + 60, extra=extra)
    rec.duration_hint, rec.timeout, rec.retry = 0.25, 30.0, RetryPolicy(4, 0.5, 3.0, 9.0)
    rec.tags, rec.labels = {"a": "b"}, {"gpu": "yes"}
    rec.attempt, rec.finished_at, rec.message = 1, T0 + 3, "ended"
    write(db, rec)
    back, problem = read(db, rec.id)
    assert problem is None
    assert (back.status, back.payload, back.message) == (status, {"p": [1, 2]}, "ended")
    copy = resubmission(back)
    assert (copy.payload, copy.pool, copy.cls, copy.kind, copy.key, copy.tenant) == (
        {"p": [1, 2]},
        "default",
        0,
        "report",
        None,
        "acme",
    )
    assert copy.deadline == pytest.approx(T0 + 60, abs=US)
    assert (copy.duration_hint, copy.timeout, copy.tags, copy.labels) == (
        0.25,
        30.0,
        {"a": "b"},
        {"gpu": "yes"},
    )
    assert copy.retry is not None and retry_json(copy.retry) == retry_json(rec.retry)
    assert copy.extra is not None
    assert copy.extra.spec() == {
        "start_at": pytest.approx(T0 + 10, abs=US),
        "tolerance": 2.0,
        "on_miss": "skip",
        "deps": [(5, "success")],
        "resources": {"db": 2},
    }


def test_an_undecodable_payload_of_an_ended_task_reads_as_none(db: sqlite3.Connection) -> None:
    rec = task(FAILED)
    rec.finished_at = T0 + 1
    write(db, rec)
    db.execute("UPDATE cronoq_tasks SET payload = ?", (b"{oops",))
    back, problem = read(db, rec.id)
    assert problem is None  # it ended already: nothing fails it
    assert (back.status, back.payload) == (FAILED, None)


def same_attempts(got: Sequence[PastAttempt], want: Sequence[PastAttempt]) -> None:
    """Equal, the times within what a nanosecond round trip may lose."""
    assert [(a.number, a.outcome, a.message, a.worker) for a in got] == [
        (a.number, a.outcome, a.message, a.worker) for a in want
    ]
    for a, b in zip(got, want, strict=True):
        assert a.started_at == pytest.approx(b.started_at, abs=US)
        assert a.ended_at == pytest.approx(b.ended_at, abs=US)


def test_the_workers_of_the_attempts_round_trip_through_each_change(
    db: sqlite3.Connection,
) -> None:
    """Written by the insert, a live change and an end (the store's own statements)."""
    rec = task(READY)
    write(db, rec)
    first = PastAttempt(1, T0 + 1, T0 + 2.5, "failed", "boom", ("w1", 7))
    rec.status, rec.attempt, rec.worker, rec.ready_at = RETRYING, 1, ("w1", 7), T0 + 4
    rec.extra = Extras()
    rec.extra.history = [first]
    change, done = update_row(rec, None)
    assert not done
    db.execute(_UPDATE_LIVE, change)
    row = db.execute("SELECT worker, attempts FROM cronoq_tasks").fetchone()
    assert row == (
        '["w1",7]',
        f'[[1,{to_ns(T0 + 1)},{to_ns(T0 + 2.5)},"failed","boom",["w1",7]]]',
    )
    back, _ = read(db, rec.id)
    assert back.worker == ("w1", 7)
    same_attempts(back.past_attempts, [first])
    # Attempt 2 in library mode (no worker) timed out; attempt 3 ends the task on w2.
    second = PastAttempt(2, T0 + 5, T0 + 6, "timed_out", "timed out", None)
    rec.extra.history.append(second)
    rec.status, rec.attempt, rec.worker, rec.finished_at = FAILED, 3, ("w2", 9), T0 + 8
    change, done = update_row(rec, None)
    assert done
    db.execute(_UPDATE_DONE, change)
    back, _ = read(db, rec.id)
    assert (back.status, back.attempt, back.worker) == (FAILED, 3, ("w2", 9))
    same_attempts(back.past_attempts, [first, second])
    assert back.extra is not None and back.extra.spec() == {}  # only the history


def test_live_row_updated_time_is_now(db: sqlite3.Connection) -> None:
    rec = task(READY)
    write(db, rec)
    assert db.execute("SELECT updated FROM cronoq_tasks").fetchone() == (to_ns(T0 + 5),)


def test_undecodable_payload_is_reported_not_raised(db: sqlite3.Connection) -> None:
    rec = task(READY, key="bad")
    write(db, rec)
    db.execute("UPDATE cronoq_tasks SET payload = ?", (b"{oops",))
    back, problem = read(db, rec.id)
    assert back.id == rec.id and back.key == "bad"
    assert problem is not None
    assert problem.startswith(
        "payload cannot be decoded by the scheduler's codec: JSONDecodeError: "
    )


def test_undecodable_output_reads_as_none(db: sqlite3.Connection) -> None:
    rec = task(FAILED)
    rec.finished_at = T0 + 1
    rec.message = "no"
    write(db, rec, output=b"\xff")
    back, problem = read(db, rec.id)
    assert problem is None
    assert back.status == FAILED and back.output is None and back.message == "no"


def test_custom_codec_is_used_both_ways(db: sqlite3.Connection) -> None:
    class Reverse:
        def encode(self, obj: Any) -> bytes:
            return str(obj).encode()[::-1]

        def decode(self, data: bytes) -> Any:
            return data[::-1].decode()

    codec = check_codec(Reverse())
    rec = task(READY, payload="abc")
    db.execute(_INSERT_TASK, insert_row(rec, encode_with(codec, "abc"), None, T0))
    assert db.execute("SELECT payload FROM cronoq_tasks").fetchone() == (b"cba",)
    back, problem = read(db, rec.id, codec)
    assert problem is None and back.payload == "abc"


def test_encode_with_insists_on_bytes() -> None:
    class Text:
        def encode(self, obj: Any) -> Any:
            return "text"

        def decode(self, data: bytes) -> Any:
            return data

    with pytest.raises(TypeError) as info:
        encode_with(check_codec(Text()), 1)
    assert str(info.value) == "codec.encode must return bytes"
    assert encode_with(CODEC, (1, "é")) == '[1,"é"]'.encode()
    with pytest.raises(ValueError):
        encode_with(CODEC, float("nan"))  # allow_nan=False: NaN is not JSON


def test_retry_json_round_trip() -> None:
    assert retry_json(None) is None and retry_from(None) is None
    p = RetryPolicy(2, 1.5, 2.5, 30.0, jitter=True)
    text = retry_json(p)
    assert text == "[2,1.5,2.5,30.0,true]"
    back = retry_from(text)
    assert back is not None
    assert (back.max_attempts, back.initial_backoff, back.multiplier) == (2, 1.5, 2.5)
    assert (back.max_backoff, back.jitter) == (30.0, True)


def test_schedule_row_round_trip(db: sqlite3.Connection) -> None:
    sched = Recurring(
        name="nightly",
        spec=parse_cron("0 3 * * *"),
        tz=zone("Europe/Paris"),
        payload={"job": "backup"},
        pool="default",
        cls=0,
        kind="backup",
        key="nb",
        tenant="ops",
        deadline_in=600.0,
        duration_hint=30.0,
        timeout=900.0,
        retry=RetryPolicy(5, jitter=False),
        resources={"disk": 1},
        tags={"t": "v"},
        labels={"zone": "a"},
        overlap="queue",
        tolerance=5.0,
        on_miss="fail",
        cron="0 3 * * *",
        tz_name="Europe/Paris",
    )
    sched.next_time = T0 + 100
    payload = CODEC.encode(sched.payload)
    db.execute(_UPSERT_RECURRING, schedule_row(sched, payload))
    name, spec, stored, next_ns, last = db.execute(
        "SELECT name, spec, template_payload, next_unix_ns, last_task_id FROM cronoq_recurring"
    ).fetchone()
    assert (name, stored, next_ns, last) == ("nightly", payload, to_ns(T0 + 100), None)
    back = _schedule(name, spec, stored, CODEC)
    for attr in (
        "name",
        "payload",
        "pool",
        "cls",
        "kind",
        "key",
        "tenant",
        "deadline_in",
        "duration_hint",
        "timeout",
        "resources",
        "tags",
        "labels",
        "overlap",
        "tolerance",
        "on_miss",
        "cron",
        "tz_name",
    ):
        assert getattr(back, attr) == getattr(sched, attr), attr
    assert back.retry is not None and back.retry.max_attempts == 5
    assert back.spec.next_after(T0, back.tz) == sched.spec.next_after(T0, sched.tz)
    # upsert: writing the schedule again replaces its row
    sched.next_time = None
    db.execute(_UPSERT_RECURRING, schedule_row(sched, payload))
    assert db.execute("SELECT count(*), max(next_unix_ns) FROM cronoq_recurring").fetchone() == (
        1,
        None,
    )


def test_time_and_id_helpers() -> None:
    assert to_ns(1.5) == 1_500_000_000
    assert from_ns(1_500_000_000) == 1.5
    assert abs(from_ns(to_ns(T0)) - T0) <= US
    assert first_id(1) == 2**48 + 1
    assert first_id(2) == 2**49 + 1
    assert first_id(3) >> 48 == 3
