"""The asyncio Scheduler driven end to end with real executors (library mode I).

Covers docs/library.md (all but "Durable state"), plain-task batches (docs/dependencies.md, "Atomic
batches") and docs/reference/errors.md. The durable store is not built yet: store= must raise
NotImplementedError.

Timing assertions are loose (a gap of x seconds must lie in [0.9x, x + 0.15)) and every wait is
bounded, so a regression fails quickly instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import pickle
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from cronoq import (
    EventsLagged,
    EventStream,
    Permanent,
    Pool,
    Priority,
    Resource,
    Retryable,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    StatusEvent,
    SubmitError,
    Task,
    TaskContext,
    TaskFailed,
    TaskHandle,
)
from helpers.facts import TOTALS_KEYS
from helpers.vclock import LoopClock, vtime

NOT_STARTED = "scheduler not started; call `await scheduler.start()` first"
SELF_CANCELLED = "CancelledError: raised by the executor, not by cronoq"
NO_RETRY = RetryPolicy.none()


# --- helpers -----------------------------------------------------------------------------------

# Every async test runs on a virtual-time loop (helpers/vclock.py): timers and sleeps take no
# real time, so durations below are exact virtual seconds, whatever the machine's load.
pytestmark = pytest.mark.virtual_time


async def echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


def fixed_pool(name: str, executor: Callable[..., Any], slots: int = 1, **options: Any) -> Pool:
    """A pool of exactly `slots` workers (no autoscaling)."""
    return Pool(name, executor, max=slots, initial=slots, autoscale=False, **options)


def make(
    executor: Callable[..., Any] = echo,
    *,
    slots: int = 1,
    emit_transitions: bool = False,
    event_capacity: int = 1024,
    **pool_options: Any,
) -> Scheduler:
    """A one-pool scheduler ("default") with a short shutdown grace."""
    return Scheduler(
        [fixed_pool("default", executor, slots, **pool_options)],
        emit_transitions=emit_transitions,
        shutdown_grace=0.1,
        event_capacity=event_capacity,
        clock=LoopClock(),
    )


@contextlib.contextmanager
def raises_exactly(exc_type: type[BaseException], message: str) -> Iterator[Any]:
    """Like pytest.raises, but the whole str() of the exception must equal `message`."""
    with pytest.raises(exc_type) as info:
        yield info
    assert str(info.value) == message


async def within(aw: Awaitable[Any], seconds: float = 2.0) -> Any:
    return await asyncio.wait_for(aw, seconds)


async def outcome(handle: TaskHandle, seconds: float = 2.0) -> Any:
    """The handle's result, bounded in time."""
    return await within(handle.result(), seconds)


async def failure(handle: TaskHandle, seconds: float = 2.0) -> TaskFailed:
    """The TaskFailed that awaiting the handle raises, bounded in time."""
    with pytest.raises(TaskFailed) as info:
        await within(handle.result(), seconds)
    return info.value


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 2.0) -> None:
    """Poll `check` until it is true (for `seconds` of loop time)."""
    deadline = vtime() + seconds
    while not await check():
        if vtime() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def status_is(sched: Scheduler, ref: int | str, status: str) -> None:
    async def check() -> bool:
        return await sched.status(ref) == status

    await until(check)


async def drain(stream: EventStream, seconds: float = 2.0) -> list[StatusEvent]:
    """Every event left in a stream that is going to end (after shutdown or close)."""

    async def collect() -> list[StatusEvent]:
        return [event async for event in stream]

    return await within(collect(), seconds)


def brief(events: list[StatusEvent]) -> list[tuple[int, str, int, str | None]]:
    return [(e.id, e.status, e.attempt, e.message) for e in events]


def assert_gap(gap: float, expected: float) -> None:
    """Exactly `expected` virtual seconds (up to float rounding)."""
    assert gap == pytest.approx(expected, abs=1e-6), (gap, expected)


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def assert_not_started(sched: Scheduler) -> None:
    """Every API of a scheduler that is not running raises the same RuntimeError."""
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: sched.submit("p"),
        lambda: sched.enqueue("p"),
        lambda: sched.submit_batch([Task("p")]),
        lambda: sched.status(1),
        lambda: sched.handle(1),
        lambda: sched.cancel(1),
        lambda: sched.snapshot(),
        lambda: sched.set_capacity("default", 2),
    ]
    for call in calls:
        with raises_exactly(RuntimeError, NOT_STARTED):
            await call()
    with raises_exactly(RuntimeError, NOT_STARTED):
        sched.events()


# --- constructor and properties (docs/library.md, "Objects") --------------------------------------


def _two_pools_named_a() -> Scheduler:
    return Scheduler([fixed_pool("a", echo), fixed_pool("a", echo)])


@pytest.mark.parametrize(
    ("build", "exc_type", "message"),
    [
        (lambda: Scheduler([]), ValueError, "at least one pool is required"),
        (_two_pools_named_a, ValueError, "duplicate pool name 'a'"),
        (
            lambda: Scheduler([object()]),  # type: ignore[list-item]
            TypeError,
            "pools must contain Pool objects (got object)",
        ),
        (
            lambda: Scheduler([fixed_pool("a", echo)], event_capacity=0),
            ValueError,
            "event_capacity must be >= 1",
        ),
        (
            lambda: Scheduler([fixed_pool("a", echo)], shutdown_grace=-1),
            ValueError,
            "shutdown_grace must be a finite, non-negative number of seconds (got -1)",
        ),
        (
            lambda: Scheduler([fixed_pool("a", echo)], shutdown_grace=math.nan),
            ValueError,
            "shutdown_grace must be a finite, non-negative number of seconds (got nan)",
        ),
        (
            lambda: Scheduler([fixed_pool("a", echo)], codec=object()),
            ValueError,
            "codec= needs store=",
        ),
        (
            lambda: Scheduler(
                [fixed_pool("a", echo)],
                resources=[Resource.semaphore("db", 1), Resource.semaphore("db", 2)],
            ),
            ValueError,
            "duplicate resource name 'db'",
        ),
    ],
    ids=[
        "no-pools",
        "duplicate-pool",
        "not-a-pool",
        "event-capacity-0",
        "negative-grace",
        "nan-grace",
        "codec-without-store",
        "duplicate-resource",
    ],
)
def test_constructor_rejects_bad_configuration(
    build: Callable[[], Scheduler], exc_type: type[Exception], message: str
) -> None:
    with raises_exactly(exc_type, message):
        build()


def test_clock_must_be_callable_and_is_exposed() -> None:
    with raises_exactly(TypeError, "clock must be a callable returning Unix seconds (got 12.5)"):
        Scheduler([fixed_pool("a", echo)], clock=12.5)  # type: ignore[arg-type]
    assert Scheduler([fixed_pool("a", echo)]).clock is time.time

    def clock() -> float:
        return 1_000.0

    assert Scheduler([fixed_pool("a", echo)], clock=clock).clock is clock


async def test_every_decision_reads_the_injected_clock() -> None:
    """A clock far from the real one: deadlines, contexts and events all use it."""
    seen: list[float | None] = []

    async def record(ctx: TaskContext, payload: Any) -> None:
        seen.append(ctx.deadline)

    loop_clock = LoopClock()

    def clock() -> float:
        return loop_clock() - 1e9  # 1993, whatever the host's clock says

    sched = Scheduler([fixed_pool("default", record)], clock=clock)
    async with sched:
        events = sched.events()
        t0 = clock()
        await outcome(await sched.submit("x", deadline_in=30, start_in=2.5), 5)
        assert clock() - t0 == pytest.approx(2.5, abs=1e-6)  # start_in: virtual seconds
    (ev,) = await drain(events)
    assert seen == [pytest.approx(t0 + 30, abs=1e-6)]
    assert ev.at == pytest.approx(t0 + 2.5, abs=1e-6)


def test_pools_and_default_pool() -> None:
    sched = Scheduler([fixed_pool("a", echo), fixed_pool("b", echo)])
    assert sched.pools == ["a", "b"]
    assert sched.default_pool == "a"
    sched.pools.append("c")  # a copy: the scheduler's own list is unchanged
    assert sched.pools == ["a", "b"]
    assert not sched.started

    with_default = Scheduler([fixed_pool("a", echo), fixed_pool("default", echo)])
    assert with_default.default_pool == "default"
    assert with_default.pools == ["a", "default"]
    # An infinite grace is allowed (wait as long as needed).
    Scheduler([fixed_pool("a", echo)], shutdown_grace=math.inf)


# --- life cycle (docs/library.md, "Objects") ------------------------------------------------------


async def test_every_api_raises_runtime_error_before_start() -> None:
    await assert_not_started(make())


async def test_start_twice_shutdown_and_restart() -> None:
    sched = make()
    await sched.start()
    assert sched.started
    with raises_exactly(RuntimeError, "scheduler already started"):
        await sched.start()
    assert sched.started
    assert await outcome(await sched.submit("first run")) == "first run"

    await sched.shutdown()
    assert not sched.started
    await assert_not_started(sched)
    await sched.shutdown()  # a second shutdown is harmless
    assert not sched.started

    await sched.start()
    assert sched.started
    assert await outcome(await sched.submit("second run")) == "second run"
    await sched.shutdown()
    assert not sched.started


async def test_async_with_returns_the_scheduler_and_shuts_down() -> None:
    sched = make()
    async with sched as entered:
        assert entered is sched
        assert sched.started
        handle = await sched.submit(7)
        assert await outcome(handle) == 7
    assert not sched.started
    assert handle.done()
    assert await handle == 7  # results of finished tasks outlive the session
    await assert_not_started(sched)


async def test_leaving_async_with_uses_shutdown_grace() -> None:
    entered = asyncio.Event()

    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        await asyncio.sleep(5)

    sched = make(slow)  # shutdown_grace=0.1
    async with sched:
        handle = await sched.submit("x")
        await within(entered.wait())
        t0 = vtime()
    assert vtime() - t0 == pytest.approx(0.1, abs=1e-6)  # shutdown_grace, then cancelled
    err = await failure(handle)
    assert (err.status, err.message) == ("shutdown", "scheduler shut down")


async def test_restart_right_after_shutdown_dispatches_new_tasks() -> None:
    # The first session ends with a task submitted but not yet dispatched.
    sched = make()
    async with sched:
        await sched.submit("left behind")
    async with sched:
        handle = await sched.submit("after restart")
        assert await outcome(handle, 0.5) == "after restart"


def test_loop_closed_without_shutdown_then_start_again() -> None:
    async def flaky(ctx: TaskContext, payload: Any) -> Any:
        if payload == "retry" and ctx.attempt == 1:
            raise RuntimeError("first attempt")
        return payload

    sched = make(flaky)

    async def first_loop() -> None:
        await sched.start()
        # A timer (this attempt's timeout) is still armed when the loop goes away.
        assert await outcome(await sched.submit("x", timeout=0.05)) == "x"

    asyncio.run(first_loop())
    with pytest.raises(SchedulerError) as info:
        sched.events()
    assert "its asyncio event loop was closed (call start() again on a running loop)" in str(
        info.value
    )

    async def second_loop() -> None:
        await sched.start()
        handle = await sched.submit("retry", retry=RetryPolicy(2, 0.05, jitter=False))
        assert await outcome(handle, 0.5) == "retry"
        await sched.shutdown()

    asyncio.run(asyncio.wait_for(second_loop(), 5))


# --- submission options (docs/reference/errors.md, "Argument errors") -----------------------------


async def test_priority_forms_at_submit() -> None:
    order: list[str] = []

    async def record(ctx: TaskContext, payload: str) -> None:
        order.append(payload)

    sched = make(record)
    async with sched:
        await sched.set_capacity("default", 0)
        forms: list[tuple[str, Any]] = [
            ("none", None),
            ("low-int", 3),
            ("HIGH", "HIGH"),
            ("critical", "critical"),
            ("enum-high", Priority.HIGH),
            ("critical-int", 0),
            ("Normal", "Normal"),
            ("enum-low", Priority.LOW),
        ]
        handles = [await sched.submit("default")]
        handles += [await sched.submit(name, priority=prio) for name, prio in forms]
        snap = await sched.snapshot()
        pool = snap.pool("default")
        assert pool is not None
        assert pool.pending_by_class == [2, 2, 3, 2]
        assert (pool.pending, pool.ready) == (9, 9)

        await sched.set_capacity("default", 1)
        for handle in handles:
            await outcome(handle)
    assert order == [
        "critical",
        "critical-int",
        "HIGH",
        "enum-high",
        "default",
        "none",
        "Normal",
        "low-int",
        "enum-low",
    ]


@pytest.mark.parametrize(
    ("priority", "exc_type", "message"),
    [
        (4, ValueError, "priority must be 0..=3"),
        (1.0, TypeError, "priority must be a Priority, int or str"),
        (-1, TypeError, "priority must be a Priority, int or str"),
        (True, TypeError, "priority must be a Priority, int or str"),
        ("urgent", ValueError, "unknown priority 'urgent'"),
    ],
)
async def test_bad_priority_is_rejected_without_trace(
    priority: Any, exc_type: type[Exception], message: str
) -> None:
    sched = make()
    async with sched:
        with raises_exactly(exc_type, message):
            await sched.submit("p", priority=priority, key="k")
        with raises_exactly(exc_type, message):
            await sched.enqueue("p", priority=priority, key="k")
        with raises_exactly(exc_type, message):
            await sched.submit_batch([Task("ok"), Task("p", priority=priority)])
        snap = await sched.snapshot()
        assert snap.totals["submitted"] == 0
        handle = await sched.submit("fine", key="k")
        assert (handle.id, handle.duplicate) == (1, False)


def _seconds_message(name: str, shown: str) -> str:
    return f"{name} must be a finite, non-negative number of seconds (got {shown})"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"deadline_in": 1, "deadline_at": time.time() + 60},
            "use either deadline_in or deadline_at",
        ),
        ({"deadline_in": -1}, _seconds_message("deadline_in", "-1")),
        ({"deadline_in": math.nan}, _seconds_message("deadline_in", "nan")),
        ({"deadline_in": math.inf}, _seconds_message("deadline_in", "inf")),
        ({"timeout": -0.5}, _seconds_message("timeout", "-0.5")),
        ({"timeout": math.inf}, _seconds_message("timeout", "inf")),
        ({"duration_hint": -2}, _seconds_message("duration_hint", "-2")),
        ({"tolerance": math.nan}, _seconds_message("tolerance", "nan")),
        ({"start_in": 1, "start_at": time.time() + 60}, "use either start_in or start_at"),
        ({"start_in": -1}, _seconds_message("start_in", "-1")),
    ],
    ids=[
        "both-deadlines",
        "negative-deadline",
        "nan-deadline",
        "inf-deadline",
        "negative-timeout",
        "inf-timeout",
        "negative-hint",
        "nan-tolerance",
        "both-starts",
        "negative-start",
    ],
)
@pytest.mark.parametrize("method", ["submit", "enqueue"])
async def test_bad_durations_raise_value_error(
    method: str, options: dict[str, Any], message: str
) -> None:
    sched = make()
    async with sched:
        with raises_exactly(ValueError, message):
            await getattr(sched, method)("p", **options)
        assert (await sched.snapshot()).totals["submitted"] == 0


async def test_zero_and_past_deadlines_are_accepted() -> None:
    deadlines: list[float | None] = []

    async def record(ctx: TaskContext, payload: Any) -> None:
        deadlines.append(ctx.deadline)

    sched = make(record)
    past = datetime.now() - timedelta(hours=1)  # naive: local time
    async with sched:
        before = sched.clock()
        await outcome(await sched.submit("zero", deadline_in=0))
        await outcome(await sched.submit("past", deadline_at=past))
        await outcome(await sched.submit("unix", deadline_at=1_000.5))
        await outcome(await sched.submit("none"))
    assert deadlines[0] == before  # no virtual time passed
    assert deadlines[1:] == [past.timestamp(), 1_000.5, None]


async def test_unknown_pool_is_a_submit_error() -> None:
    sched = Scheduler([fixed_pool("a", echo), fixed_pool("b", echo)], clock=LoopClock())
    async with sched:
        for call in (
            lambda: sched.submit("p", pool="nope"),
            lambda: sched.enqueue("p", pool="nope"),
            lambda: sched.submit_batch([Task("p", pool="b"), Task("p", pool="nope")]),
            lambda: sched.set_capacity("nope", 1),
        ):
            with raises_exactly(SubmitError, "unknown pool 'nope'") as info:
                await call()
            assert info.value.code == "unknown_pool"
            assert info.value.message == "unknown pool 'nope'"
        snap = await sched.snapshot()
        assert snap.totals["submitted"] == 0
        assert [p.name for p in snap.pools] == ["a", "b"]
        assert await outcome(await sched.submit("to b", pool="b")) == "to b"
        with raises_exactly(OverflowError, "n must be >= 0 (got -1)"):
            await sched.set_capacity("a", -1)


# --- TaskContext, tags and labels (docs/library.md, "Objects") ------------------------------------


async def test_task_context_fields_and_repr() -> None:
    contexts: list[dict[str, Any]] = []

    async def record(ctx: TaskContext, payload: Any) -> None:
        contexts.append(
            {
                "id": ctx.id,
                "attempt": ctx.attempt,
                "kind": ctx.kind,
                "key": ctx.key,
                "pool": ctx.pool,
                "tags": ctx.tags,
                "group": ctx.group,
                "timeout": ctx.timeout,
                "deadline": ctx.deadline,
                "cancelled": ctx.is_cancelled(),
                "repr": repr(ctx),
            }
        )
        ctx.heartbeat()  # no lease_ttl: a harmless no-op

    sched = Scheduler(
        [fixed_pool("default", record), fixed_pool("mail", record)], clock=LoopClock()
    )
    async with sched:
        await outcome(await sched.submit("plain"))
        before = sched.clock()
        await outcome(
            await sched.submit(
                "full",
                pool="mail",
                kind="email",
                key="welcome-ada",
                tags={"n": 1, "s": "x", "f": 1.5},
                timeout=5,
                deadline_in=10,
            )
        )
    plain, full = contexts
    assert plain == {
        "id": 1,
        "attempt": 1,
        "kind": "default",
        "key": None,
        "pool": "default",
        "tags": {},
        "group": {},
        "timeout": None,
        "deadline": None,
        "cancelled": False,
        "repr": 'TaskContext(id=1, attempt=1, pool="default", kind="default", key=None)',
    }
    deadline = full.pop("deadline")
    assert deadline == before + 10
    assert full == {
        "id": 2,
        "attempt": 1,
        "kind": "email",
        "key": "welcome-ada",
        "pool": "mail",
        "tags": {"n": "1", "s": "x", "f": "1.5"},
        "group": {},
        "timeout": 5.0,
        "cancelled": False,
        "repr": 'TaskContext(id=2, attempt=1, pool="mail", kind="email", key="welcome-ada")',
    }


async def test_tag_and_label_types() -> None:
    sched = make()
    async with sched:
        with raises_exactly(TypeError, "labels must map str to str (got 'a': 1)"):
            await sched.submit("p", labels={"a": 1})
        with pytest.raises(TypeError):
            await sched.submit("p", tags=["not", "a", "mapping"])
        with pytest.raises(TypeError):
            await sched.submit("p", tags={1: "x"})
        # Empty labels and tags mean "none" and are accepted.
        assert await outcome(await sched.submit("p", labels={}, tags={})) == "p"
        assert (await sched.snapshot()).totals["submitted"] == 1


async def test_tag_and_traceparent() -> None:
    seen: list[tuple[str | None, str | None, str | None]] = []

    async def record(ctx: TaskContext, payload: Any) -> None:
        seen.append((ctx.tag("n"), ctx.tag("absent"), ctx.traceparent()))

    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with make(record) as sched:
        await outcome(await sched.submit("traced", tags={"n": 1, "traceparent": trace}))
        await outcome(await sched.submit("plain"))
    assert seen == [("1", None, trace), (None, None, None)]


async def test_cancellation_token_cancelled_and_callbacks_on_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The token outlives the executor's task: work it started elsewhere learns of the
    cancellation through `ctx.cancelled()`, `token.wait()` and callbacks."""
    contexts: list[TaskContext] = []
    calls: list[str] = []
    helpers: list[asyncio.Task[None]] = []
    started = asyncio.Event()

    def fails() -> None:
        raise RuntimeError("callback bug")

    async def watch(ctx: TaskContext) -> None:
        await ctx.cancelled()
        calls.append("cancelled()")

    async def slow(ctx: TaskContext, payload: Any) -> None:
        token = ctx.cancellation_token()
        assert token is ctx.cancellation_token() and not token.is_cancelled()
        token.add_callback(lambda: calls.append("first"))
        token.add_callback(fails)  # logged; the others still run
        token.add_callback(lambda: calls.append("second"))
        removed = lambda: calls.append("removed")  # noqa: E731
        token.add_callback(removed)
        assert token.remove_callback(removed) and not token.remove_callback(removed)
        helpers.append(asyncio.get_running_loop().create_task(watch(ctx)))
        contexts.append(ctx)
        started.set()
        await asyncio.sleep(60)

    async with make(slow) as sched:
        handle = await sched.submit("x")
        await within(started.wait())
        assert await sched.cancel(handle.id)
        assert (await failure(handle)).status == "cancelled"
        await within(helpers[0])
    ctx = contexts[0]
    token = ctx.cancellation_token()
    assert token.is_cancelled() and ctx.is_cancelled()
    assert calls == ["first", "second", "cancelled()"]
    assert "cancellation callback" in caplog.text and "callback bug" in caplog.text
    token.add_callback(lambda: calls.append("late"))  # after the cancellation: at once
    await within(token.wait())  # returns at once
    await within(ctx.cancelled())
    assert calls[-1] == "late"
    assert repr(token) == "CancellationToken(cancelled=True)"


async def test_cancellation_token_callback_added_from_a_thread() -> None:
    """A plain executor runs in a thread: it adds its callback there, and the cancellation
    (on the loop) runs it, which ends the thread's wait."""
    added = threading.Event()
    fired = threading.Event()
    tokens: list[Any] = []

    def blocking(ctx: TaskContext, payload: Any) -> None:
        token = ctx.cancellation_token()
        tokens.append(token)
        token.add_callback(fired.set)
        added.set()
        fired.wait(30)

    async with make(blocking) as sched:
        handle = await sched.submit("x")
        await asyncio.to_thread(added.wait, 30)
        assert await sched.cancel(handle.id)
        assert (await failure(handle)).status == "cancelled"
        assert fired.is_set() and tokens[0].is_cancelled()


async def test_a_completed_attempt_keeps_an_uncancelled_token() -> None:
    contexts: list[TaskContext] = []

    async def keep(ctx: TaskContext, payload: Any) -> None:
        contexts.append(ctx)

    async with make(keep) as sched:
        await outcome(await sched.submit("x"))
    assert not contexts[0].cancellation_token().is_cancelled()


# --- timeouts (docs/library.md, "What happens to a running attempt") ------------------------------


async def test_timeout_aborts_the_attempt_and_dead_letters() -> None:
    aborted = asyncio.Event()
    seen: dict[str, Any] = {}

    async def slow(ctx: TaskContext, payload: Any) -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen.update(cancelled=ctx.is_cancelled(), timeout=ctx.timeout)
            aborted.set()
            raise

    sched = make(slow)
    async with sched:
        t0 = vtime()
        handle = await sched.submit("x", timeout=0.1, retry=NO_RETRY)
        err = await failure(handle)
        elapsed = vtime() - t0
        assert (err.status, err.message, err.task_id) == (
            "dead_lettered",
            "attempt timed out",
            handle.id,
        )
        assert str(err) == "task 1 ended as dead_lettered: attempt timed out"
        assert elapsed == pytest.approx(0.1, abs=1e-6)
        await within(aborted.wait())
        assert seen == {"cancelled": True, "timeout": 0.1}
        totals = (await sched.snapshot()).totals
        assert (totals["timeouts"], totals["dead_lettered"], totals["dispatched"]) == (1, 1, 1)


async def test_timeouts_are_retryable() -> None:
    async def slow(ctx: TaskContext, payload: Any) -> None:
        await asyncio.sleep(5)

    sched = make(slow, emit_transitions=True)
    async with sched:
        events = sched.events()
        handle = await sched.submit("x", timeout=0.05, retry=RetryPolicy(2, 0.01, jitter=False))
        err = await failure(handle)
        assert (err.status, err.message) == ("dead_lettered", "attempt timed out")
        totals = (await sched.snapshot()).totals
        assert (totals["timeouts"], totals["retries"], totals["dispatched"]) == (2, 1, 2)
    assert [(e.status, e.attempt, e.message) for e in await drain(events)] == [
        ("blocked", 0, None),
        ("ready", 0, None),
        ("running", 1, None),
        ("retrying", 1, "attempt timed out"),
        ("ready", 1, None),
        ("running", 2, None),
        ("dead_lettered", 2, "attempt timed out"),
    ]


async def test_zero_timeout_times_out_at_once() -> None:
    async def slow(ctx: TaskContext, payload: Any) -> None:
        await asyncio.sleep(1)

    sched = make(slow)
    async with sched:
        t0 = vtime()
        err = await failure(await sched.submit("x", timeout=0, retry=NO_RETRY))
        assert vtime() == t0
        assert (err.status, err.message) == ("dead_lettered", "attempt timed out")
        assert (await sched.snapshot()).totals["timeouts"] == 1


async def test_sync_executor_timeout_ends_the_attempt_while_the_thread_runs_on() -> None:
    starts: list[tuple[int, bool]] = []  # (attempt, had every earlier thread finished?)
    cancelled_after_sleep: dict[int, bool] = {}

    def blocking(ctx: TaskContext, payload: Any) -> None:
        starts.append((ctx.attempt, len(cancelled_after_sleep) == len(starts)))
        time.sleep(0.15)
        cancelled_after_sleep[ctx.attempt] = ctx.is_cancelled()

    sched = make(blocking)
    async with sched:
        handle = await sched.submit("x", timeout=0.05, retry=RetryPolicy(2, 0, jitter=False))
        err = await failure(handle)
        assert (err.status, err.message) == ("dead_lettered", "attempt timed out")
        # The second attempt started while the first one's thread was still sleeping.
        assert starts == [(1, True), (2, False)]

        async def threads_done() -> bool:
            return len(cancelled_after_sleep) == 2

        await until(threads_done)
        assert cancelled_after_sleep == {1: True, 2: True}


# --- retries (docs/library.md, "Retries") ---------------------------------------------------------


async def test_retry_backoff_grows_without_jitter() -> None:
    starts: list[float] = []

    async def flaky(ctx: TaskContext, payload: Any) -> int:
        starts.append(vtime())
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt}")
        return ctx.attempt

    sched = make(flaky)
    async with sched:
        handle = await sched.submit("x", retry=RetryPolicy(3, 0.1, 2, 10, jitter=False))
        assert await outcome(handle) == 3
        totals = (await sched.snapshot()).totals
        assert (totals["retries"], totals["dispatched"], totals["succeeded"]) == (2, 3, 1)
    first, second = gaps(starts)
    assert_gap(first, 0.1)
    assert_gap(second, 0.2)


async def test_retry_backoff_is_capped_and_exhaustion_dead_letters() -> None:
    starts: list[float] = []

    async def always(ctx: TaskContext, payload: Any) -> None:
        starts.append(vtime())
        raise RuntimeError("always")

    sched = make(always)
    async with sched:
        policy = RetryPolicy(4, 0.05, 2, max_backoff=0.15, jitter=False)
        err = await failure(await sched.submit("x", retry=policy))
        assert (err.status, err.message) == ("dead_lettered", "RuntimeError: always")
    assert len(starts) == 4
    for gap, expected in zip(gaps(starts), (0.05, 0.1, 0.15), strict=True):
        assert_gap(gap, expected)


async def test_jittered_gaps_stay_within_the_backoff() -> None:
    starts: list[float] = []

    async def always(ctx: TaskContext, payload: Any) -> None:
        starts.append(vtime())
        raise RuntimeError("always")

    sched = make(always)
    async with sched:
        err = await failure(await sched.submit("x", retry=RetryPolicy(5, 0.1, 1.0, jitter=True)))
        assert err.status == "dead_lettered"
    assert len(starts) == 5
    for gap in gaps(starts):
        assert 0 <= gap <= 0.1 + 1e-6  # full jitter: uniform in [0, backoff]


async def test_retryable_retry_after_sets_a_minimum_delay() -> None:
    starts: list[float] = []

    async def limited(ctx: TaskContext, payload: Any) -> str:
        starts.append(vtime())
        if ctx.attempt == 1:
            raise Retryable("429", retry_after=0.3)  # beyond max_backoff: still honoured
        if ctx.attempt == 2:
            raise Retryable("again", retry_after=0.01)  # shorter than the backoff
        return "done"

    sched = make(limited, emit_transitions=True)
    async with sched:
        events = sched.events()
        policy = RetryPolicy(3, 0.2, 1.0, max_backoff=0.2, jitter=False)
        assert await outcome(await sched.submit("x", retry=policy)) == "done"
    first, second = gaps(starts)
    assert_gap(first, 0.3)
    assert_gap(second, 0.2)
    retrying = [(e.attempt, e.message) for e in await drain(events) if e.status == "retrying"]
    assert retrying == [(1, "429"), (2, "again")]


async def test_permanent_fails_at_once() -> None:
    calls: list[int] = []

    async def picky(ctx: TaskContext, payload: Any) -> None:
        calls.append(ctx.attempt)
        raise Permanent("bad input")

    sched = make(picky)  # default policy: 3 attempts
    async with sched:
        handle = await sched.submit("x")
        err = await failure(handle)
        assert (err.status, err.message, err.task_id) == ("failed", "bad input", handle.id)
        assert str(err) == "task 1 ended as failed: bad input"
        assert await sched.status(handle.id) == "failed"
        totals = (await sched.snapshot()).totals
        assert (totals["failed"], totals["retries"], totals["dispatched"]) == (1, 0, 1)
    assert calls == [1]


async def test_pool_retry_policy_applies_and_task_policy_overrides_it() -> None:
    calls: dict[str, int] = {}

    async def always(ctx: TaskContext, payload: str) -> None:
        calls[payload] = ctx.attempt
        raise RuntimeError("always")

    sched = make(always, retry=RetryPolicy(3, 0.01, 1.0, jitter=False))
    async with sched:
        err = await failure(await sched.submit("pool policy"))
        assert (err.status, err.message) == ("dead_lettered", "RuntimeError: always")
        assert str(err) == "task 1 ended as dead_lettered: RuntimeError: always"
        err = await failure(await sched.submit("task policy", retry=NO_RETRY))
        assert (err.status, err.message) == ("dead_lettered", "RuntimeError: always")
        snap = await sched.snapshot()
        assert (snap.totals["dispatched"], snap.totals["retries"]) == (4, 2)
        assert snap.totals["dead_lettered"] == 2
        pool = snap.pool("default")
        assert pool is not None
        assert (pool.dispatched, pool.failed, pool.retried, pool.succeeded) == (4, 4, 2, 0)
    assert calls == {"pool policy": 3, "task policy": 1}


async def test_self_raised_cancelled_error_is_a_retryable_failure() -> None:
    async def cancels_itself(ctx: TaskContext, payload: str) -> str:
        if payload == "always" or ctx.attempt == 1:
            raise asyncio.CancelledError()
        return f"attempt {ctx.attempt}"

    sched = make(cancels_itself, emit_transitions=True)
    async with sched:
        events = sched.events()
        policy = RetryPolicy(2, 0.01, jitter=False)
        assert await outcome(await sched.submit("once", retry=policy)) == "attempt 2"
        err = await failure(await sched.submit("always", retry=policy))
        assert (err.status, err.message) == ("dead_lettered", SELF_CANCELLED)
        assert (await sched.snapshot()).totals["cancelled"] == 0
    retrying = [(e.id, e.message) for e in await drain(events) if e.status == "retrying"]
    assert retrying == [(1, SELF_CANCELLED), (2, SELF_CANCELLED)]


async def test_retried_task_keeps_its_place_in_the_queue() -> None:
    order: list[tuple[str, int]] = []
    release_a = asyncio.Event()

    async def run(ctx: TaskContext, payload: str) -> None:
        order.append((payload, ctx.attempt))
        if payload == "A" and ctx.attempt == 1:
            await release_a.wait()
            raise RuntimeError("once")
        if payload == "B":
            await asyncio.sleep(0.15)  # A's backoff (0.05 s) ends while B runs

    sched = make(run, retry=RetryPolicy(2, 0.05, jitter=False))
    async with sched:
        a = await sched.submit("A")
        await status_is(sched, a.id, "running")
        b = await sched.submit("B")
        c = await sched.submit("C")
        release_a.set()
        for handle in (a, b, c):
            await outcome(handle)
    assert order == [("A", 1), ("B", 1), ("A", 2), ("C", 1)]


# --- cancellation (docs/library.md, "Cancellation") -----------------------------------------------


async def test_cancel_a_running_task_by_key() -> None:
    entered = asyncio.Event()
    aborted = asyncio.Event()
    seen: list[bool] = []

    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen.append(ctx.is_cancelled())
            aborted.set()
            raise

    sched = make(slow)
    async with sched:
        events = sched.events()
        handle = await sched.submit("x", key="job")
        await within(entered.wait())
        assert await sched.status("job") == "running"
        assert await sched.cancel("job") is True
        assert await sched.status("job") == "cancelled"
        err = await failure(handle)
        assert (err.status, err.message, err.task_id) == ("cancelled", "cancelled", handle.id)
        assert str(err) == f"task {handle.id} ended as cancelled: cancelled"
        await within(aborted.wait())
        assert seen == [True]
        assert await sched.cancel("job") is False  # already finished
        snap = await sched.snapshot()
        assert (snap.totals["cancelled"], snap.live_tasks, snap.running) == (1, 0, 0)
    assert brief(await drain(events)) == [(1, "cancelled", 1, "cancelled")]


async def test_swallowed_cancellation_still_ends_cancelled() -> None:
    entered = asyncio.Event()
    returned = asyncio.Event()

    async def stubborn(ctx: TaskContext, payload: Any) -> str:
        entered.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            await asyncio.sleep(0.02)
            returned.set()
        return "discarded"

    sched = make(stubborn)
    async with sched:
        handle = await sched.submit("x")
        await within(entered.wait())
        assert await sched.cancel(handle.id) is True
        await within(returned.wait())

        async def stale_counted() -> bool:
            return (await sched.snapshot()).totals["stale_completions"] == 1

        await until(stale_counted)
        assert await sched.status(handle.id) == "cancelled"
        err = await failure(handle)
        assert (err.status, err.message) == ("cancelled", "cancelled")
        totals = (await sched.snapshot()).totals
        assert (totals["cancelled"], totals["succeeded"]) == (1, 0)


async def test_cancel_a_queued_task() -> None:
    ran: list[str] = []

    async def record(ctx: TaskContext, payload: str) -> str:
        ran.append(payload)
        return payload

    sched = make(record)
    async with sched:
        await sched.set_capacity("default", 0)
        doomed = await sched.submit("doomed", key="d")
        kept = await sched.submit("kept")
        assert await sched.status("d") == "ready"
        assert await sched.cancel(doomed.id) is True
        assert await sched.status("d") == "cancelled"
        assert doomed.done()
        pool = (await sched.snapshot()).pool("default")
        assert pool is not None
        assert (pool.pending, pool.ready) == (1, 1)
        await sched.set_capacity("default", 1)
        assert await outcome(kept) == "kept"
        err = await failure(doomed)
        assert (err.status, err.message) == ("cancelled", "cancelled")
    assert ran == ["kept"]


async def test_cancel_a_retrying_task() -> None:
    attempts: list[int] = []

    async def failing(ctx: TaskContext, payload: Any) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError("boom")

    sched = make(failing)
    async with sched:
        handle = await sched.submit("x", retry=RetryPolicy(2, 10, jitter=False))
        await status_is(sched, handle.id, "retrying")
        assert await sched.cancel(handle.id) is True
        err = await failure(handle)
        assert (err.status, err.message) == ("cancelled", "cancelled")
        snap = await sched.snapshot()
        pool = snap.pool("default")
        assert pool is not None
        assert (snap.live_tasks, snap.pending, pool.pending_by_class) == (0, 0, [0, 0, 0, 0])
    assert attempts == [1]


async def test_cancel_unknown_or_finished_returns_false() -> None:
    sched = make()
    async with sched:
        handle = await sched.submit("x", key="done")
        await outcome(handle)
        assert await sched.cancel(handle.id) is False
        assert await sched.cancel("done") is False
        assert await sched.cancel(999) is False
        assert await sched.cancel("never-submitted") is False
        assert await sched.status("done") == "succeeded"
        assert (await sched.snapshot()).totals["cancelled"] == 0


async def test_handle_cancel_is_fire_and_forget() -> None:
    entered = asyncio.Event()

    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        await asyncio.sleep(5)

    sched = make(slow)
    async with sched:
        handle = await sched.submit("x")
        await within(entered.wait())
        assert handle.cancel() is None
        err = await failure(handle)
        assert (err.status, err.message) == ("cancelled", "cancelled")
        handle.cancel()  # on a finished task: nothing happens
        assert await sched.status(handle.id) == "cancelled"
        assert (await sched.snapshot()).totals["cancelled"] == 1


# --- keys, duplicates, handles, lookups (docs/library.md, "Keys, handles and duplicates") ---------


async def test_duplicate_key_while_live_and_after_finish() -> None:
    gate = asyncio.Event()
    calls: list[str] = []

    async def run(ctx: TaskContext, payload: str) -> str:
        calls.append(payload)
        await gate.wait()
        return f"result of {payload}"

    sched = make(run)
    async with sched:
        first = await sched.submit("first", key="k")
        second = await sched.submit("second", key="k")
        assert (first.id, first.duplicate) == (1, False)
        assert (second.id, second.duplicate) == (1, True)
        assert repr(second) == "TaskHandle(id=1, duplicate=True)"
        assert await sched.enqueue("third", key="k") == 1
        gate.set()
        assert await outcome(first) == "result of first"
        assert await outcome(second) == "result of first"

        again = await sched.submit("again", key="k")  # retained after it finished
        assert (again.id, again.duplicate) == (1, True)
        assert again.done()
        assert await again == "result of first"
        assert await sched.enqueue("again", key="k") == 1
        batch = await sched.submit_batch([Task("batch", key="k"), Task("new", key="n")])
        assert [(h.id, h.duplicate) for h in batch] == [(1, True), (2, False)]
        await outcome(batch[1])
        # Duplicates use no ids.
        fresh = await sched.submit("fresh")
        assert (fresh.id, fresh.duplicate) == (3, False)
        await outcome(fresh)
        assert (await sched.snapshot()).totals["submitted"] == 3
    assert calls == ["first", "new", "fresh"]


async def test_duplicate_of_a_failed_or_cancelled_task_yields_its_failure() -> None:
    async def run(ctx: TaskContext, payload: str) -> None:
        if payload == "bad":
            raise Permanent("boom")
        await asyncio.sleep(5)

    sched = make(run, slots=2)
    async with sched:
        await failure(await sched.submit("bad", key="bad"))
        cancelled = await sched.submit("slow", key="slow")
        await status_is(sched, "slow", "running")
        await sched.cancel("slow")
        await failure(cancelled)

        dup = await sched.submit("other", key="bad")
        assert (dup.id, dup.duplicate) == (1, True)
        err = await failure(dup)
        assert (err.status, err.message, err.task_id) == ("failed", "boom", 1)
        dup = await sched.submit("other", key="slow")
        assert (dup.id, dup.duplicate) == (2, True)
        err = await failure(dup)
        assert (err.status, err.message, err.task_id) == ("cancelled", "cancelled", 2)


async def test_enqueue_returns_ids() -> None:
    seen: list[int] = []

    async def record(ctx: TaskContext, payload: Any) -> None:
        seen.append(ctx.id)

    sched = make(record)
    async with sched:
        ids = [await sched.enqueue(n) for n in range(3)]
        assert ids == [1, 2, 3]
        assert all(type(i) is int for i in ids)
        assert await sched.enqueue("keyed", key="k") == 4
        assert await sched.enqueue("dup", key="k") == 4
        for i in [*ids, 4]:
            handle = await sched.handle(i)
            assert handle is not None
            assert handle.id == i
            await outcome(handle)
        assert await sched.status(4) == "succeeded"
    assert seen == [1, 2, 3, 4]


async def test_status_and_handle_lookups() -> None:
    gate = asyncio.Event()

    async def run(ctx: TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    sched = make(run)
    async with sched:
        assert await sched.status(1) is None
        assert await sched.status("nope") is None
        assert await sched.handle(1) is None
        assert await sched.handle("nope") is None
        with pytest.raises(TypeError):
            await sched.status(1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await sched.handle(None)  # type: ignore[arg-type]

        running = await sched.submit({"n": 1}, key="a")
        queued = await sched.submit({"n": 2})
        await status_is(sched, "a", "running")
        assert await sched.status(running.id) == "running"
        assert await sched.status(queued.id) == "ready"
        by_key = await sched.handle("a")
        by_id = await sched.handle(queued.id)
        assert by_key is not None and by_id is not None
        assert (by_key.id, by_key.duplicate) == (running.id, False)
        assert (by_id.id, by_id.duplicate) == (queued.id, False)
        assert not by_key.done() and not running.done()
        gate.set()
        assert await outcome(by_key) == {"n": 1}
        assert await outcome(by_id) == {"n": 2}
        assert await sched.status("a") == "succeeded"
        assert running.done() and by_key.done()


async def test_awaiting_a_handle_many_times() -> None:
    gate = asyncio.Event()
    produced: list[object] = []

    async def run(ctx: TaskContext, payload: Any) -> object:
        await gate.wait()
        result = object()
        produced.append(result)
        return result

    sched = make(run)
    async with sched:
        handle = await sched.submit("x")
        assert not handle.done()
        waiters = [asyncio.ensure_future(handle.result()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters)
        gate.set()
        first = await outcome(handle)
        assert first is produced[0]  # the very object the executor returned
        assert await handle is first
        assert await handle.result() is first
        assert [await within(w) for w in waiters] == [first] * 3
        assert handle.done()


# --- submit_batch of plain tasks (docs/dependencies.md, "Atomic batches") -------------------------


async def test_submit_batch_admits_every_task() -> None:
    sched = make(slots=2)
    async with sched:
        handles = await sched.submit_batch(
            [Task("a", key="ka"), Task("b", priority="high"), Task("c", kind="k", tags={"x": 1})]
        )
        assert [(h.id, h.duplicate) for h in handles] == [(1, False), (2, False), (3, False)]
        assert [await outcome(h) for h in handles] == ["a", "b", "c"]
        assert await sched.submit_batch([]) == []
        (last,) = await sched.submit_batch(iter([Task("d")]))  # any iterable of Task
        assert (last.id, await outcome(last)) == (4, "d")
        assert (await sched.snapshot()).totals["submitted"] == 4


async def test_batch_with_a_duplicate_key_admits_nothing() -> None:
    sched = make()
    async with sched:
        batch = [Task("a", key="a"), Task("b", key="b"), Task("a again", key="a")]
        with raises_exactly(SubmitError, "duplicate key 'a' in batch") as info:
            await sched.submit_batch(batch)
        assert info.value.code == "duplicate_key_in_batch"
        assert await sched.status("a") is None
        assert await sched.status("b") is None
        assert (await sched.snapshot()).totals["submitted"] == 0
        # The keys stay free and no id was used.
        handle = await sched.submit("a", key="a")
        assert (handle.id, handle.duplicate) == (1, False)
        assert (await sched.submit("b", key="b")).duplicate is False


@pytest.mark.parametrize(
    ("bad", "exc_type"),
    [
        (Task("bad", pool="nope"), SubmitError),
        (Task("bad", priority=9), ValueError),
        (Task("bad", timeout=-1), ValueError),
        (Task("bad", key="nul\0"), SubmitError),
        (Task("bad", kind=None), TypeError),  # type: ignore[arg-type]
        ("not a Task", TypeError),
    ],
    ids=["unknown-pool", "priority", "timeout", "nul-key", "kind-none", "not-a-task"],
)
async def test_batch_with_one_invalid_task_admits_nothing(bad: Any, exc_type: type) -> None:
    sched = make()
    async with sched:
        with pytest.raises(exc_type):
            await sched.submit_batch([Task("ok", key="ok"), bad, Task("after", key="after")])
        snap = await sched.snapshot()
        assert (snap.totals["submitted"], snap.live_tasks) == (0, 0)
        assert await sched.status("ok") is None
        handle = await sched.submit("ok", key="ok")
        assert (handle.id, handle.duplicate) == (1, False)


# --- library mode II options (not built yet) ---------------------------------------------------


async def test_options_that_mean_nothing_yet_are_accepted() -> None:
    # No edges, no amounts and no fixed start: nothing of library mode II is asked for.
    sched = make()
    async with sched:
        handle = await sched.submit("p", after=[], resources={}, tolerance=2, on_miss="fail")
        assert await outcome(handle) == "p"


def test_store_must_implement_the_store_protocol() -> None:
    with pytest.raises(TypeError, match=r"store must implement cronoq\.store\.Store"):
        Scheduler([fixed_pool("a", echo)], store=object())


# --- leases and heartbeats (docs/library.md, "What happens to a running attempt") -----------------


async def test_lease_expires_without_heartbeats() -> None:
    aborted: list[bool] = []
    starts: list[float] = []

    async def silent(ctx: TaskContext, payload: Any) -> None:
        starts.append(vtime())
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            aborted.append(ctx.is_cancelled())
            raise

    sched = make(silent, lease_ttl=0.1, emit_transitions=True)
    async with sched:
        events = sched.events()
        t0 = vtime()
        handle = await sched.submit("x", retry=RetryPolicy(2, 0.05, jitter=False))
        err = await failure(handle)
        elapsed = vtime() - t0
        assert (err.status, err.message) == ("dead_lettered", "lease expired")
        assert elapsed == pytest.approx(0.25, abs=1e-6)  # ttl + backoff + ttl
        totals = (await sched.snapshot()).totals
        assert (totals["lease_expiries"], totals["dispatched"]) == (2, 2)
        await asyncio.sleep(0.01)
        assert aborted == [True, True]
    assert_gap(starts[1] - starts[0], 0.15)
    messages = [(e.status, e.message) for e in await drain(events) if e.message]
    assert messages == [("retrying", "lease expired"), ("dead_lettered", "lease expired")]


async def test_heartbeats_keep_the_lease() -> None:
    async def beating(ctx: TaskContext, payload: Any) -> str:
        for _ in range(10):  # 0.3 s in all, three times the ttl
            await asyncio.sleep(0.03)
            ctx.heartbeat()
        return "alive"

    sched = make(beating, lease_ttl=0.1)
    async with sched:
        assert await outcome(await sched.submit("x", retry=NO_RETRY)) == "alive"
        totals = (await sched.snapshot()).totals
        assert (totals["lease_expiries"], totals["succeeded"]) == (0, 1)


async def test_sync_executor_heartbeats_from_its_thread() -> None:
    threads: list[int] = []

    def beating(ctx: TaskContext, payload: Any) -> str:
        threads.append(threading.get_ident())
        for _ in range(10):
            time.sleep(0.03)
            ctx.heartbeat()
        return "alive"

    sched = make(beating, lease_ttl=0.1)
    async with sched:
        assert await outcome(await sched.submit("x", retry=NO_RETRY)) == "alive"
        assert (await sched.snapshot()).totals["lease_expiries"] == 0
    assert threads != [threading.get_ident()]


async def test_sync_executor_without_heartbeats_loses_its_lease() -> None:
    cancelled_after: list[bool] = []

    def silent(ctx: TaskContext, payload: Any) -> str:
        time.sleep(0.2)
        cancelled_after.append(ctx.is_cancelled())
        ctx.heartbeat()  # too late: harmless
        return "too late"

    sched = make(silent, lease_ttl=0.05)
    async with sched:
        handle = await sched.submit("x", retry=NO_RETRY)
        err = await failure(handle)
        assert (err.status, err.message) == ("dead_lettered", "lease expired")

        async def thread_done() -> bool:
            return bool(cancelled_after)

        await until(thread_done)
        assert (await sched.snapshot()).totals["lease_expiries"] == 1
        assert cancelled_after == [True]
        assert await sched.status(handle.id) == "dead_lettered"


# --- status events (docs/library.md, "Events") ----------------------------------------------------


async def test_default_streams_carry_terminal_events_only() -> None:
    async def run(ctx: TaskContext, payload: str) -> str:
        if payload == "bad":
            raise Permanent("nope")
        return payload

    sched = Scheduler([fixed_pool("default", run), fixed_pool("other", run)], clock=LoopClock())
    async with sched:
        events = sched.events()
        before = sched.clock()
        await outcome(await sched.submit("good", key="g"))
        await failure(await sched.submit("bad", pool="other"))
        after = sched.clock()
    got = await drain(events)
    assert [(e.id, e.pool, e.key, e.status, e.attempt, e.message) for e in got] == [
        (1, "default", "g", "succeeded", 1, None),
        (2, "other", None, "failed", 1, "nope"),
    ]
    assert all(before <= e.at <= after and type(e.at) is float for e in got)
    assert events.closed


async def test_transition_events_of_a_simple_and_a_retried_task() -> None:
    async def run(ctx: TaskContext, payload: str) -> str:
        if payload == "retried" and ctx.attempt == 1:
            raise RuntimeError("boom")
        return payload

    sched = make(run, emit_transitions=True)
    async with sched:
        events = sched.events()
        await outcome(await sched.submit("simple"))
        await outcome(await sched.submit("retried", retry=RetryPolicy(2, 0.01, jitter=False)))
    assert brief(await drain(events)) == [
        (1, "blocked", 0, None),
        (1, "ready", 0, None),
        (1, "running", 1, None),
        (1, "succeeded", 1, None),
        (2, "blocked", 0, None),
        (2, "ready", 0, None),
        (2, "running", 1, None),
        (2, "retrying", 1, "RuntimeError: boom"),
        (2, "ready", 1, None),
        (2, "running", 2, None),
        (2, "succeeded", 2, None),
    ]


async def test_full_streams_drop_the_oldest_events() -> None:
    sched = make(event_capacity=3)
    async with sched:
        skipping = sched.events()
        raising = sched.events(on_lag="raise")
        for n in range(6):
            await outcome(await sched.submit(n))
        assert (skipping.lagged, raising.lagged) == (3, 3)

        kept = [await within(anext(skipping)) for _ in range(3)]
        assert brief(kept) == [(n, "succeeded", 1, None) for n in (4, 5, 6)]

        lag_message = "event stream fell behind; 3 events were dropped"
        with raises_exactly(EventsLagged, lag_message) as info:
            await within(anext(raising))
        assert info.value.skipped == 3
        kept = [await within(anext(raising)) for _ in range(3)]
        assert brief(kept) == [(n, "succeeded", 1, None) for n in (4, 5, 6)]
        assert raising.lagged == 3

        # Lag is cumulative and reported again on a raise stream.
        for n in range(4):
            await outcome(await sched.submit(n))
        assert (skipping.lagged, raising.lagged) == (4, 4)
        with raises_exactly(EventsLagged, "event stream fell behind; 1 events were dropped"):
            await within(anext(raising))
    assert [e.id for e in await drain(skipping)] == [8, 9, 10]
    assert [e.id for e in await drain(raising)] == [8, 9, 10]


async def test_a_stream_sees_only_later_events() -> None:
    sched = make()
    async with sched:
        early = sched.events()
        await outcome(await sched.submit("before"))
        late = sched.events()
        await outcome(await sched.submit("after"))
    assert [e.id for e in await drain(early)] == [1, 2]
    assert [e.id for e in await drain(late)] == [2]


async def test_closing_streams() -> None:
    sched = make()
    async with sched:
        stream = sched.events()
        assert not stream.closed
        reader = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.01)
        assert not reader.done()
        stream.close()
        assert stream.closed
        with pytest.raises(StopAsyncIteration):
            await within(reader)
        stream.close()  # again: harmless

        other = sched.events()
        await outcome(await sched.submit("buffered"))
        await other.aclose()
        assert other.closed
        with pytest.raises(StopAsyncIteration):
            await within(anext(other))  # buffered events are dropped by close()

        async with sched.events() as scoped:
            assert isinstance(scoped, EventStream)
            await outcome(await sched.submit("seen"))
            assert (await within(anext(scoped))).id == 2
        assert scoped.closed
        await outcome(await sched.submit("unseen"))
        assert [e async for e in scoped] == []


async def test_streams_end_after_shutdown_once_buffered_events_are_read() -> None:
    sched = make()
    await sched.start()
    buffered = sched.events()
    listening = sched.events()
    received: list[int] = []

    async def listen() -> None:
        async for event in listening:
            received.append(event.id)

    listener = asyncio.ensure_future(listen())
    for n in range(2):
        await outcome(await sched.submit(n))
    await sched.shutdown()
    await within(listener)
    assert received == [1, 2]
    assert [e.id for e in await drain(buffered)] == [1, 2]
    with pytest.raises(StopAsyncIteration):
        await within(anext(buffered))


async def test_events_argument_and_state_checks() -> None:
    sched = make()
    with raises_exactly(RuntimeError, NOT_STARTED):
        sched.events()
    async with sched:
        with raises_exactly(ValueError, "on_lag must be 'skip' or 'raise'"):
            sched.events(on_lag="drop")
        assert isinstance(sched.events(on_lag="skip"), EventStream)
        assert isinstance(sched.events("raise"), EventStream)
    with raises_exactly(RuntimeError, NOT_STARTED):
        sched.events()


# --- snapshot (docs/library.md, "Snapshot") -------------------------------------------------------


async def test_snapshot_counts_states_and_totals() -> None:
    release = asyncio.Event()

    async def run(ctx: TaskContext, payload: str) -> str:
        if payload == "crit":
            raise RuntimeError("retry me later")
        if payload == "high":
            await release.wait()
        return payload

    sched = make(run)
    async with sched:
        snap = await sched.snapshot()
        assert set(snap.totals) == TOTALS_KEYS
        assert all(v == 0 for v in snap.totals.values())
        assert (snap.live_tasks, snap.running, snap.pending) == (0, 0, 0)

        crit = await sched.submit(
            "crit", priority="critical", retry=RetryPolicy(2, 10, jitter=False)
        )
        await status_is(sched, crit.id, "retrying")
        high = await sched.submit("high", priority="high")
        await status_is(sched, high.id, "running")
        normal = await sched.submit("normal")
        low = await sched.submit("low", priority="low")

        snap = await sched.snapshot()
        assert (snap.live_tasks, snap.running, snap.pending) == (4, 1, 3)
        assert snap.pool("nope") is None
        pool = snap.pool("default")
        assert pool is not None and snap.pools == [pool]
        assert (pool.name, pool.capacity, pool.busy, pool.held, pool.desired) == (
            "default",
            1,
            1,
            0,
            1,
        )
        assert (pool.pending, pool.pending_by_class, pool.ready, pool.reservations) == (
            3,
            [1, 0, 1, 1],
            2,
            0,
        )
        assert pool.window == 60.0
        assert (pool.dispatched, pool.succeeded, pool.failed, pool.retried) == (2, 0, 1, 1)
        expected = dict.fromkeys(TOTALS_KEYS, 0)
        expected.update(submitted=4, dispatched=2, retries=1)
        assert snap.totals == expected

        release.set()
        for handle in (high, normal, low):
            await outcome(handle)
        assert await sched.cancel(crit.id) is True
        snap = await sched.snapshot()
        assert (snap.live_tasks, snap.running, snap.pending) == (0, 0, 0)
        pool = snap.pool("default")
        assert pool is not None
        assert (pool.busy, pool.pending_by_class, pool.ready) == (0, [0, 0, 0, 0], 0)
        assert (pool.dispatched, pool.succeeded, pool.failed, pool.retried) == (4, 3, 1, 1)
        expected.update(dispatched=4, succeeded=3, cancelled=1)
        assert snap.totals == expected
        assert 0.0 <= pool.utilization <= 1.0
        assert pool.worker_seconds > 0.0
        assert pool.cost == 0.0

        await sched.set_capacity("default", 20)  # not clamped to max
        assert (await sched.snapshot()).pools[0].capacity == 20


# --- shutdown (docs/library.md, "Shutdown") -------------------------------------------------------


async def test_shutdown_with_grace_cancels_running_and_drops_queued() -> None:
    entered = asyncio.Event()
    seen: dict[str, Any] = {}

    async def run(ctx: TaskContext, payload: str) -> None:
        if payload == "queued":
            seen["queued ran"] = True
            return
        entered.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen["cancelled"] = ctx.is_cancelled()
            raise

    sched = make(run)
    await sched.start()
    events = sched.events()
    running = await sched.submit("long")
    queued = await sched.submit("queued")
    await within(entered.wait())
    awaiting = asyncio.ensure_future(running.result())

    t0 = vtime()
    await sched.shutdown(grace=0.2)
    elapsed = vtime() - t0
    seen_when_shutdown_returned = dict(seen)
    assert elapsed == pytest.approx(0.2, abs=1e-6)
    assert not sched.started
    for handle in (running, queued):
        assert handle.done()
        err = await failure(handle)
        assert (err.status, err.message, err.task_id) == (
            "shutdown",
            "scheduler shut down",
            handle.id,
        )
        assert str(err) == f"task {handle.id} ended as shutdown: scheduler shut down"
    with pytest.raises(TaskFailed) as info:
        await within(awaiting)
    assert info.value.status == "shutdown"
    assert await drain(events) == []  # no events for tasks cut short
    await sched.shutdown()  # twice: harmless
    await sched.shutdown(grace=0)
    # The executor saw its cancellation before shutdown() returned; the queued task never ran.
    assert seen_when_shutdown_returned == {"cancelled": True}
    assert seen == {"cancelled": True}


async def test_shutdown_stops_dispatching_during_grace() -> None:
    entered = asyncio.Event()
    finish = asyncio.Event()
    started: list[str] = []

    async def run(ctx: TaskContext, payload: str) -> str:
        started.append(payload)
        if payload == "running":
            entered.set()
            await finish.wait()
        return payload

    sched = make(run)
    await sched.start()
    running = await sched.submit("running")
    queued = await sched.submit("queued")
    await within(entered.wait())

    async def finish_soon() -> None:
        await asyncio.sleep(0.05)
        # The API keeps working during the grace period, but admits nothing new.
        assert sched.started
        assert await sched.status(running.id) == "running"
        with pytest.raises(SchedulerError):
            await sched.submit("late")
        finish.set()

    helper = asyncio.ensure_future(finish_soon())
    t0 = vtime()
    await sched.shutdown(grace=1.0)
    elapsed = vtime() - t0
    await within(helper)
    assert elapsed == pytest.approx(0.05, abs=1e-6)  # returned once the running attempt ended
    assert await outcome(running) == "running"
    err = await failure(queued)
    assert (err.status, err.message) == ("shutdown", "scheduler shut down")
    assert started == ["running"]


async def test_shutdown_with_infinite_grace_waits_for_running_attempts() -> None:
    entered = asyncio.Event()

    async def run(ctx: TaskContext, payload: Any) -> str:
        entered.set()
        await asyncio.sleep(0.15)
        return "finished"

    sched = make(run, slots=2)
    await sched.start()
    handles = [await sched.submit(n) for n in range(2)]
    await within(entered.wait())
    t0 = vtime()
    await sched.shutdown(math.inf)
    assert vtime() - t0 == pytest.approx(0.15, abs=1e-6)
    assert [await outcome(h) for h in handles] == ["finished", "finished"]


async def test_shutdown_argument_checks() -> None:
    sched = make()
    await sched.shutdown()  # never started: nothing to do
    await sched.start()
    with raises_exactly(
        ValueError, "grace must be a finite, non-negative number of seconds (got -1)"
    ):
        await sched.shutdown(grace=-1)
    assert sched.started
    await sched.shutdown(grace=0)
    assert not sched.started


# --- executors (docs/library.md, "What happens to a running attempt") -----------------------------


async def test_sync_executor_runs_in_a_worker_thread() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def blocking(ctx: TaskContext, payload: int) -> int:
        threads.append(threading.get_ident())
        return payload * 2

    sched = make(blocking)
    async with sched:
        assert await outcome(await sched.submit(21)) == 42
    assert len(threads) == 1 and threads[0] != loop_thread


async def test_sync_executor_returning_a_coroutine() -> None:
    loop_thread = threading.get_ident()
    threads: dict[str, int] = {}

    async def finish(payload: int) -> int:
        threads["coroutine"] = threading.get_ident()
        await asyncio.sleep(0)
        return payload + 1

    def starts_in_a_thread(ctx: TaskContext, payload: int) -> Any:
        threads["function"] = threading.get_ident()
        return finish(payload)

    sched = make(starts_in_a_thread)
    async with sched:
        assert await outcome(await sched.submit(41)) == 42
    assert threads["function"] != loop_thread
    assert threads["coroutine"] == loop_thread


async def test_partial_of_a_coroutine_function_runs_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    async def scaled(factor: int, ctx: TaskContext, payload: int) -> int:
        threads.append(threading.get_ident())
        return factor * payload

    sched = make(functools.partial(scaled, 3))
    async with sched:
        assert await outcome(await sched.submit(5)) == 15
    assert threads == [loop_thread]


def _one_arg_sync(payload: Any) -> Any:
    return payload


async def _one_arg_async(payload: Any) -> Any:
    return payload


@pytest.mark.parametrize(
    ("executor", "name"),
    [(_one_arg_async, "_one_arg_async"), (_one_arg_sync, "_one_arg_sync")],
    ids=["async", "sync"],
)
async def test_wrong_executor_signature_fails_every_attempt(
    executor: Callable[..., Any], name: str
) -> None:
    sched = make(executor, emit_transitions=True)
    async with sched:
        events = sched.events()
        handle = await sched.submit("x", retry=RetryPolicy(2, 0, jitter=False))
        err = await failure(handle)
        message = f"TypeError: {name}() takes 1 positional argument but 2 were given"
        assert (err.status, err.message) == ("dead_lettered", message)
        totals = (await sched.snapshot()).totals
        assert (totals["dispatched"], totals["retries"]) == (2, 1)
    failures = [(e.status, e.message) for e in await drain(events) if e.message]
    assert failures == [("retrying", message), ("dead_lettered", message)]


# --- errors from a live scheduler pickle (docs/reference/errors.md, "Exceptions") -----------------


async def test_errors_from_a_live_scheduler_pickle() -> None:
    async def picky(ctx: TaskContext, payload: Any) -> None:
        raise Permanent("bad input")

    sched = make(picky, event_capacity=1)
    async with sched:
        lagging = sched.events(on_lag="raise")
        failed = await failure(await sched.submit("x"))
        with pytest.raises(SubmitError) as submit_info:
            await sched.submit("x", pool="nope")
        await failure(await sched.submit("y"))
        with pytest.raises(EventsLagged) as lag_info:
            await within(anext(lagging))

    copy = pickle.loads(pickle.dumps(failed))
    assert type(copy) is TaskFailed
    assert (copy.status, copy.message, copy.task_id) == ("failed", "bad input", 1)
    assert str(copy) == str(failed) == "task 1 ended as failed: bad input"

    submit_copy = pickle.loads(pickle.dumps(submit_info.value))
    assert (submit_copy.code, submit_copy.message) == ("unknown_pool", "unknown pool 'nope'")

    lag_copy = pickle.loads(pickle.dumps(lag_info.value))
    assert lag_copy.skipped == lag_info.value.skipped == 1

    retry_copy = pickle.loads(pickle.dumps(Retryable("429", retry_after=2.0)))
    assert (retry_copy.message, retry_copy.retry_after) == ("429", 2.0)
