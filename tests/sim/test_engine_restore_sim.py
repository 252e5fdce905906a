"""Crash and restore, simulated: random submits (keys, dependencies, fixed starts), dispatches,
outcomes, clock jumps, commits and crashes, against the engine core on a virtual clock.

The machine plays a durable driver. Its "store" is a table of rows built by the same row
functions as the SQLite store (insert_row for a new task, update_row's columns for a change),
written at each commit from `Engine.take_journal()`. As a durable driver does, it releases a
started attempt to its executor only once the commit that holds it is done, so a crash loses
what was not committed: the machine then builds a new engine from the committed rows alone
(`Engine.restore`) and goes on with it.

Invariants, after every step:
- no acknowledged task is lost: every committed task is known to the current engine, and a
  task committed as ended is still ended with the same status;
- attempt numbers never repeat: each attempt released to an executor has a higher number than
  every earlier attempt of its task, across crashes;
- every status change follows the life-cycle tables (the engine raises IllegalTransition
  otherwise, which fails the run) and the engine's counters match its tasks.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cronoq.core.engine import Engine
from cronoq.core.model import (
    FIRST_TERMINAL,
    STATUS_NAMES,
    Attempt,
    Extras,
    PoolConfig,
    RetryPolicy,
    TaskRecord,
)
from cronoq.errors import SubmitError
from cronoq.store.base import COLUMN, DONE_CHANGE, LIVE_CHANGE
from cronoq.store.codec import JsonCodec
from cronoq.store.rows import insert_row, record_from_row, update_row

T0 = 1_700_000_000.0
CODEC = JsonCodec()
STATUS, TERMINAL = COLUMN["status"], COLUMN["terminal"]
LIVE_COLUMNS = tuple(COLUMN[c] for c in LIVE_CHANGE)
DONE_COLUMNS = tuple(COLUMN[c] for c in DONE_CHANGE)


def engine(now: float, first_id: int) -> Engine:
    pools = [
        PoolConfig("p", capacity=2, retry=RetryPolicy(max_attempts=3, initial_backoff=0.5)),
        PoolConfig("q", capacity=1, retry=RetryPolicy(max_attempts=1)),
    ]
    return Engine(pools, now, rng=random.Random(7), first_id=first_id, journal=True, retention=1e9)


class CrashRestore(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.eng = engine(self.now, 1)
        self.rows: dict[int, list[Any]] = {}  # the committed table
        self.max_id = 0  # the store's high-water mark of issued ids
        self.held: list[Attempt] = []  # started, waiting for their commit
        self.released: dict[int, Attempt] = {}  # lease -> attempt an executor runs
        self.top_attempt: dict[int, int] = {}  # task id -> highest attempt number released
        self.ended: dict[int, int] = {}  # task id -> terminal status committed
        self.crashes = 0

    # --- the driver's turn ---------------------------------------------------------------

    def turn(self) -> None:
        self.eng.advance(self.now)
        self.eng.dispatch(self.now)
        out = self.eng.take()
        self.held += out.starts
        for att in out.aborts:
            self.released.pop(att.lease, None)

    @rule(
        pool=st.sampled_from(["p", "q"]),
        key=st.none() | st.sampled_from(["a", "b", "c", "d"]),
        dep=st.none() | st.integers(0, 30),
        on=st.sampled_from(["success", "failure", "complete"]),
        start_in=st.none() | st.floats(0.0, 3.0),
    )
    def submit(
        self, pool: str, key: str | None, dep: int | None, on: str, start_in: float | None
    ) -> None:
        extra = None
        if dep is not None or start_in is not None:
            extra = Extras(
                deps=None if dep is None else [(dep, on)],
                start_at=None if start_in is None else self.now + start_in,
            )
        # an unknown dependency or a reservation conflict is refused and changes nothing
        with contextlib.suppress(SubmitError):
            self.eng.submit(TaskRecord({"n": 1}, pool, key=key, extra=extra), self.now)
        self.turn()

    @rule(dt=st.floats(0.0, 2.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.turn()

    @precondition(lambda self: self.released)
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "fail", "permanent"]))
    def report(self, data: st.DataObject, outcome: str) -> None:
        lease = data.draw(st.sampled_from(sorted(self.released)))
        att = self.released.pop(lease)
        if outcome == "ok":
            self.eng.complete(att, self.now, {"done": att.number})
        else:
            self.eng.fail(att, self.now, "boom", permanent=outcome == "permanent")
        self.turn()

    @precondition(lambda self: self.eng.live)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = sorted(r.id for r in self.eng.live_tasks())
        self.eng.cancel(data.draw(st.sampled_from(live)), self.now)
        self.turn()

    @rule()
    def commit(self) -> None:
        """Write the journal as the SQLite store would, then release what it held."""
        journal = self.eng.take_journal()
        for rec in journal.added:
            journal.changed.pop(rec.id, None)
            self.rows[rec.id] = list(insert_row(rec, CODEC.encode(rec.payload), None, self.now))
        for rec in journal.changed.values():
            values, done = update_row(rec, None)
            row = self.rows[rec.id]
            columns = DONE_COLUMNS if done else LIVE_COLUMNS
            for column, value in zip(columns, values[:-1], strict=True):
                row[column] = value
            if done:
                row[TERMINAL] = 1
        self.max_id = max(self.max_id, self.eng.next_id - 1)
        for rec_id, row in self.rows.items():
            if row[TERMINAL]:
                self.ended.setdefault(rec_id, _status(row[STATUS]))
        for att in self.held:
            if att.ended:
                continue
            tid = att.task.id
            assert att.number > self.top_attempt.get(tid, 0), (
                f"task {tid}: attempt {att.number} after attempt {self.top_attempt.get(tid)}"
            )
            self.top_attempt[tid] = att.number
            self.released[att.lease] = att
        self.held.clear()

    @rule(dt=st.floats(0.0, 5.0))
    def crash(self, dt: float) -> None:
        """The process dies: what was not committed is gone; a new engine restores the rows."""
        self.now += dt
        self.crashes += 1
        self.eng = engine(self.now, self.max_id + 1)
        self.held.clear()
        self.released.clear()
        recs = [record_from_row(tuple(row), CODEC)[0] for row in self.rows.values()]
        self.eng.restore(recs, self.now)
        self.turn()

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def no_acknowledged_task_is_lost(self) -> None:
        for rec_id in self.rows:
            rec = self.eng.lookup(rec_id)
            assert rec is not None, f"committed task {rec_id} is gone"
            if rec_id in self.ended:
                assert rec.status == self.ended[rec_id], (
                    f"task {rec_id} was committed {STATUS_NAMES[self.ended[rec_id]]}, "
                    f"now {rec.status_name}"
                )

    @invariant()
    def counters_match_the_tasks(self) -> None:
        eng = self.eng
        live = [r for r in eng.tasks.values() if r.status < FIRST_TERMINAL]
        assert eng.live == len(live)
        assert len(eng.running) == sum(p.busy for p in eng.pools.values())
        for name, pool in eng.pools.items():
            assert pool.busy <= pool.capacity
            assert pool.pending() == sum(
                1 for r in live if r.pool == name and r.status_name != "running"
            )


def _status(name: str) -> int:
    return STATUS_NAMES.index(name)


TestCrashRestore = CrashRestore.TestCase
TestCrashRestore.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
