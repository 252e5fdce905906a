"""The life cycles of Scheduler, Durable, Worker and ServerApp (cronoq/_lifecycle.py).

Each table is walked along the paths the component takes (docs/library.md, docs/durability.md,
docs/worker.md, docs/server.md, "Life cycle"), an illegal move raises, every state is reachable
from the first one, and the real components go through their tables as documented.
"""

from __future__ import annotations

import asyncio
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from cronoq import Pool, Scheduler, SchedulerError, SqliteStore
from cronoq._durable import DURABLE_TRANSITIONS, DurableState
from cronoq._lifecycle import IllegalStateChange, Lifecycle, table
from cronoq.client._worker import WORKER_TRANSITIONS, Worker, WorkerState
from cronoq.runtime import SCHEDULER_TRANSITIONS, SchedulerState
from cronoq.server.app import APP_TRANSITIONS, AppState
from cronoq.store import MemoryState, MemoryStore

S, D, W, A = SchedulerState, DurableState, WorkerState, AppState

TABLES: list[tuple[str, Any, Any]] = [
    ("Scheduler", SCHEDULER_TRANSITIONS, S.NEW),
    ("Durable", DURABLE_TRANSITIONS, D.NEW),
    ("Worker", WORKER_TRANSITIONS, W.NEW),
    ("ServerApp", APP_TRANSITIONS, A.STANDBY),
]

# Paths each component takes, from its first state.
PATHS: list[tuple[str, list[Enum]]] = [
    # start, shutdown, start again, lose the store, start again, fail to start, start
    (
        "Scheduler",
        [
            *(S.STARTING, S.RUNNING, S.STOPPING, S.STOPPED),
            *(S.STARTING, S.RUNNING, S.LOST),
            *(S.STARTING, S.LOST, S.STARTING, S.RUNNING),
        ],
    ),
    ("Scheduler", [S.STARTING, S.NEW]),  # the first start() fails
    ("Scheduler", [S.STARTING, S.RUNNING, S.STOPPING, S.LOST]),  # the store fails in shutdown
    ("Scheduler", [S.STARTING, S.RUNNING, S.STOPPED, S.STARTING]),  # its loop was closed
    ("Durable", [D.RUNNING, D.CLOSING, D.CLOSED]),
    ("Durable", [D.RUNNING, D.FAILED, D.CLOSED]),
    ("Durable", [D.RUNNING, D.CLOSING, D.FAILED, D.CLOSED]),
    ("Worker", [W.RUNNING, W.DRAINING, W.STOPPING, W.ENDED, W.NEW, W.RUNNING, W.ENDED]),
    ("Worker", [W.DRAINING, W.STOPPING, W.ENDED]),  # stop() before run()
    ("Worker", [W.RUNNING, W.DRAINING, W.ENDED]),  # run() returned while stop() drained
    ("ServerApp", [A.READY, A.STANDBY, A.READY, A.STOPPING, A.STOPPED]),
    ("ServerApp", [A.STOPPING, A.STOPPED]),  # stopped while standing by
]

ILLEGAL: list[tuple[str, list[Enum], Enum]] = [
    ("Scheduler", [], S.RUNNING),  # never running without starting
    ("Scheduler", [S.STARTING, S.RUNNING], S.STARTING),  # already started
    ("Scheduler", [S.STARTING, S.RUNNING, S.STOPPING], S.RUNNING),
    ("Durable", [D.RUNNING, D.CLOSING, D.CLOSED], D.RUNNING),
    ("Durable", [D.RUNNING, D.FAILED], D.CLOSING),
    ("Worker", [W.RUNNING], W.STOPPING),  # the grace comes first
    ("Worker", [W.RUNNING, W.ENDED], W.RUNNING),  # through NEW (a reset) only
    ("ServerApp", [A.READY, A.STOPPING, A.STOPPED], A.STANDBY),
    ("ServerApp", [A.STOPPING], A.READY),
]


def life(component: str) -> Lifecycle[Any]:
    for name, transitions, first in TABLES:
        if name == component:
            return Lifecycle(name, first, transitions)
    raise KeyError(component)


@pytest.mark.parametrize(("component", "path"), PATHS)
def test_legal_paths(component: str, path: list[Enum]) -> None:
    lc = life(component)
    for state in path:
        before = lc.state
        assert lc.move(state) is before
        assert lc.state is state and lc.at(state)


@pytest.mark.parametrize(("component", "path", "bad"), ILLEGAL)
def test_an_illegal_move_raises_and_changes_nothing(
    component: str, path: list[Enum], bad: Enum
) -> None:
    lc = life(component)
    for state in path:
        lc.move(state)
    before = lc.state
    with pytest.raises(IllegalStateChange) as info:
        lc.move(bad)
    assert isinstance(info.value, AssertionError)
    assert str(info.value) == f"{component}: illegal state change {before.name} -> {bad.name}"
    assert (info.value.component, info.value.old, info.value.new) == (component, before, bad)
    assert lc.state is before


@pytest.mark.parametrize(("component", "transitions", "first"), TABLES)
def test_every_state_has_an_entry_and_is_reachable(
    component: str, transitions: Any, first: Enum
) -> None:
    assert set(transitions) == set(type(first))
    seen, todo = {first}, [first]
    while todo:
        for nxt in transitions[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(type(first))


def test_a_table_must_name_every_state() -> None:
    class Light(Enum):
        OFF = 1
        ON = 2

    with pytest.raises(ValueError, match="Light: no table entry for ON"):
        table(Light, {Light.OFF: {Light.ON}})
    assert table(Light, {Light.OFF: [Light.ON], Light.ON: ()}) == {
        Light.OFF: frozenset({Light.ON}),
        Light.ON: frozenset(),
    }


# --- the real components --------------------------------------------------------------------------


async def _echo(ctx: Any, payload: Any) -> Any:
    return payload


def test_a_scheduler_goes_through_its_table(tmp_path: Path) -> None:
    async def main() -> None:
        sched = Scheduler([Pool("default", _echo)])
        assert sched._life.state is S.NEW
        await sched.start()
        assert sched._life.state is S.RUNNING
        with pytest.raises(RuntimeError, match="already started"):
            await sched.start()
        await sched.shutdown()
        assert sched._life.state is S.STOPPED
        await sched.shutdown()  # again: nothing to do
        await sched.start()
        assert sched._life.state is S.RUNNING
        await sched.shutdown()

        # A start that fails goes back to where it came from.
        bad = Scheduler([Pool("default", _echo)], store=SqliteStore(tmp_path / "no" / "x.db"))
        with pytest.raises(SchedulerError, match="cannot open"):
            await bad.start()
        assert bad._life.state is S.NEW

        # A store that fails stops the scheduler on its own (LOST), with its durable FAILED and
        # then CLOSED; start() may run again (and here fails, back to LOST).
        store = MemoryStore(MemoryState())
        lost = Scheduler([Pool("default", _echo)], store=store)
        await lost.start()
        assert lost._session is not None and lost._session.durable is not None
        durable = lost._session.durable
        assert durable.life.state is D.RUNNING
        store.crash()
        with pytest.raises(SchedulerError, match="crashed"):
            await lost.submit("x")
        assert lost._life.state is S.LOST
        assert durable.life.state in (D.FAILED, D.CLOSED)
        assert lost._closing is not None
        await lost._closing
        assert durable.life.state is D.CLOSED
        with pytest.raises(SchedulerError, match="crashed"):
            await lost.start()
        assert lost._life.state is S.LOST

        # A clean shutdown closes the durable session: RUNNING -> CLOSING -> CLOSED.
        clean = Scheduler([Pool("default", _echo)], store=MemoryStore())
        await clean.start()
        assert clean._session is not None and clean._session.durable is not None
        durable = clean._session.durable
        await clean.shutdown()
        assert durable.life.state is D.CLOSED
        assert clean._life.state is S.STOPPED

    asyncio.run(main())


def test_a_worker_stopped_before_it_runs_ends_at_once() -> None:
    async def handle(lease: Any) -> None:
        return None

    async def main() -> None:
        worker = Worker("127.0.0.1:1", "default", handle, reconnect=False)
        await worker.stop()
        ls = worker._ls
        assert ls is not None and ls.life.state is W.STOPPING
        assert ls.draining and ls.stopping
        await worker.run()  # returns at once: stop() came first
        assert ls.life.state is W.ENDED
        assert not ls.draining and not ls.stopping

    asyncio.run(main())
