"""cronoq.App in library mode (`app.local()`): task functions run by a real in-process Scheduler.

Declaring (`@app.task`, `app.pool`), submitting (`fn.submit`, `fn.options(...)`, `fn.call` with
`app.submit_batch`), typed results and `TaskFailed`, `cronoq.context()`, arguments that do not
fit (a raw `sched.submit` payload), and a durable run on a SQLite store where the arguments and
results go through JSON.

The tests run on a virtual-time loop (helpers/vclock.py), except those with a SQLite store (its
thread wakes the loop from outside, which belongs on a real loop): ordering is asserted through
events and recorded starts, never through wall-clock windows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import gc
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import cronoq
from cronoq import Permanent, Retryable, RetryPolicy, TaskFailed
from helpers.vclock import LoopClock

VIRTUAL = pytest.mark.virtual_time
CLOCK = LoopClock()
NO_RETRY = RetryPolicy(max_attempts=1)
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)


def local(app: cronoq.App, **settings: Any) -> Any:
    """`app.local()` on the virtual clock, ending quickly."""
    return app.local(clock=CLOCK, shutdown_grace=0.1, **settings)


def fixed(app: cronoq.App, name: str = "default", slots: int = 1, **options: Any) -> None:
    """Exactly `slots` workers for pool `name` (no autoscaling)."""
    app.pool(name, max=slots, initial=slots, autoscale=False, **options)


async def failure(handle: Any) -> TaskFailed:
    with pytest.raises(TaskFailed) as info:
        await handle
    return info.value


# --- types the task functions use (annotations are resolved in this module's namespace) ---------


class Shape(enum.Enum):
    SQUARE = "square"
    CIRCLE = "circle"


@dataclasses.dataclass(frozen=True)
class Pt:
    x: int
    y: int


@dataclasses.dataclass
class Drawing:
    title: str
    points: list[Pt]
    shape: Shape
    at: datetime
    scale: float = 1.0


@dataclasses.dataclass
class Seen:
    """What `cronoq.context()` showed a task function."""

    task_id: int
    attempt: int
    kind: str
    key: str | None
    pool: str
    deadline: float | None
    timeout: float | None
    tags: dict[str, str]
    cancelled: bool
    thread: str


def seen() -> Seen:
    c = cronoq.context()
    c.heartbeat()  # no lease_ttl: nothing to extend, and no error
    assert c.cancellation_token() is not None
    return Seen(
        c.task_id,
        c.attempt,
        c.kind,
        c.key,
        c.pool,
        c.deadline,
        c.timeout,
        c.tags,
        c.is_cancelled(),
        threading.current_thread().name,
    )


# --- running functions --------------------------------------------------------------------------


@VIRTUAL
async def test_async_and_sync_functions_run_and_return_their_results() -> None:
    app = cronoq.App()
    threads: list[str] = []

    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task
    def shout(text: str, times: int = 2) -> str:
        threads.append(threading.current_thread().name)
        return "!".join([text.upper()] * times)

    async with local(app):
        h1 = await add.submit(2, 3)
        h2 = await shout.submit("hi")
        h3 = await shout.submit(text="yo", times=3)
        assert (h1.kind, h2.kind) == ("add", "shout")
        assert not h1.duplicate
        assert len({h1.id, h2.id, h3.id}) == 3
        assert await h1 == 5
        assert await h2 == "HI!HI"
        assert await h3.result(timeout=5) == "YO!YO!YO"
    # the plain function ran in a worker thread, not on the loop's
    assert threads and threading.main_thread().name not in threads
    # calling a task function still calls the function
    assert await add(1, 1) == 2
    assert shout("a", 1) == "A"
    wrapped: list[Any] = [add, shout]
    assert [w.__name__ for w in wrapped] == ["add", "shout"]


@VIRTUAL
async def test_kinds_route_to_their_functions_in_one_pool_and_across_pools() -> None:
    app = cronoq.App()

    @app.task
    async def first(n: int) -> str:
        return f"first {n} in {cronoq.context().pool}"

    @app.task(kind="renamed")
    async def second(n: int) -> str:
        return f"second {n} in {cronoq.context().pool}"

    @app.task(pool="io")
    def third(n: int) -> str:
        return f"third {n} in {cronoq.context().pool}"

    @app.task(pool="io", kind="io.fourth")
    async def fourth(n: int) -> str:
        return f"fourth {n} in {cronoq.context().pool}"

    assert (first.kind, second.kind, third.kind, fourth.kind) == (
        "first",
        "renamed",
        "third",
        "io.fourth",
    )
    assert app.pool_names() == ["default", "io"]
    async with local(app) as sched:
        assert sorted(sched.pools) == ["default", "io"]
        handles = []
        for n in range(3):
            for fn in (first, second, third, fourth):
                handles.append(await fn.submit(n))
        results = [await h for h in handles]
    assert results == [
        text
        for n in range(3)
        for text in (
            f"first {n} in default",
            f"second {n} in default",
            f"third {n} in io",
            f"fourth {n} in io",
        )
    ]


@VIRTUAL
async def test_results_come_back_as_the_declared_types() -> None:
    app = cronoq.App()
    moment = datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=UTC)

    @app.task
    async def draw(title: str, points: list[Pt], shape: Shape) -> Drawing:
        assert all(isinstance(p, Pt) for p in points) and isinstance(shape, Shape)
        return Drawing(title, points, shape, moment, 2.0)

    @app.task
    def mirror(d: Drawing) -> tuple[Drawing, Shape]:
        assert isinstance(d, Drawing) and isinstance(d.at, datetime)
        flipped = [Pt(p.y, p.x) for p in d.points]
        return dataclasses.replace(d, points=flipped), d.shape

    async with local(app):
        drawing = await (await draw.submit("t", [Pt(1, 2), Pt(3, 4)], Shape.CIRCLE))
        assert drawing == Drawing("t", [Pt(1, 2), Pt(3, 4)], Shape.CIRCLE, moment, 2.0)
        assert type(drawing) is Drawing and type(drawing.points[0]) is Pt
        back, shape = await (await mirror.submit(drawing))
    assert back == dataclasses.replace(drawing, points=[Pt(2, 1), Pt(4, 3)])
    assert shape is Shape.CIRCLE


# --- failures -----------------------------------------------------------------------------------


@VIRTUAL
async def test_a_raising_function_fails_its_task_after_its_retries() -> None:
    app = cronoq.App()
    attempts: list[int] = []

    @app.task(retry=FAST_RETRY)
    async def boom(n: int) -> int:
        attempts.append(cronoq.context().attempt)
        raise ValueError(f"boom {n}")

    @app.task(retry=FAST_RETRY)
    def sync_boom() -> None:
        raise KeyError("nope")

    async with local(app):
        err = await failure(await boom.submit(7))
        assert "ValueError: boom 7" in err.message
        assert attempts == [1, 2, 3]
        h = await sync_boom.submit()
        err = await failure(h)
        assert err.task_id == h.id
        assert "KeyError" in err.message and "nope" in err.message


@VIRTUAL
async def test_permanent_fails_at_once_and_retryable_is_retried() -> None:
    app = cronoq.App()
    attempts: dict[str, list[int]] = {"permanent": [], "retryable": [], "flaky": []}

    @app.task(retry=FAST_RETRY)
    async def permanent() -> None:
        attempts["permanent"].append(cronoq.context().attempt)
        raise Permanent("bad input, do not retry")

    @app.task(retry=FAST_RETRY)
    def retryable() -> None:
        attempts["retryable"].append(cronoq.context().attempt)
        raise Retryable("try later", retry_after=0.05)

    @app.task(retry=FAST_RETRY)
    async def flaky() -> str:
        n = cronoq.context().attempt
        attempts["flaky"].append(n)
        if n < 3:
            raise Retryable("not yet")
        return "done"

    async with local(app):
        err = await failure(await permanent.submit())
        assert err.message == "bad input, do not retry"
        err = await failure(await retryable.submit())
        assert "try later" in err.message
        assert await (await flaky.submit()) == "done"
    assert attempts == {"permanent": [1], "retryable": [1, 2, 3], "flaky": [1, 2, 3]}


@VIRTUAL
async def test_arguments_that_do_not_fit_fail_permanently_naming_the_parameter() -> None:
    app = cronoq.App()
    ran: list[Any] = []

    @app.task(retry=FAST_RETRY)
    async def place(at: Pt, shape: Shape, count: int = 1) -> None:
        ran.append((at, shape, count))

    async with local(app) as sched:
        good = await sched.submit({"at": {"x": 1, "y": 2}, "shape": "square"}, kind="place")
        await good
        cases = [
            ({"at": {"x": 1, "y": 2}, "shape": "square", "count": "3"}, r"^parameter 'count' of "),
            ({"at": {"x": 1}, "shape": "square"}, r"^parameter 'at' of \S*place: Pt"),
            (
                {"at": {"x": 1, "y": "2"}, "shape": "square"},
                r"^parameter 'at' of \S*place: \['y'\]",
            ),
            ({"at": {"x": 1, "y": 2}, "shape": "hexagon"}, r"^parameter 'shape' of .*hexagon"),
            ({"at": {"x": 1, "y": 2}}, r"^missing parameter 'shape' of "),
            ({"at": {"x": 1, "y": 2}, "shape": "square", "color": 1}, r"has no parameter 'color'$"),
            ([1, 2], r"must be a JSON object"),
        ]
        for payload, expected in cases:
            h = await sched.submit(payload, kind="place", retry=FAST_RETRY)
            err = await failure(h)
            assert re.search(expected, err.message), (payload, err.message)
        # each bad payload failed on its first attempt: nothing was retried
        pool = (await sched.snapshot()).pool("default")
        assert pool is not None and pool.failed == len(cases) and pool.retried == 0
    assert ran == [(Pt(1, 2), Shape.SQUARE, 1)]


@VIRTUAL
async def test_a_kind_without_a_function_fails_permanently_naming_the_kind() -> None:
    app = cronoq.App()

    @app.task(retry=FAST_RETRY)
    async def known() -> int:
        return 1

    @app.task(pool="other")
    async def elsewhere() -> int:
        return 2

    async with local(app) as sched:
        err = await failure(await sched.submit({}, kind="unknown.kind", retry=FAST_RETRY))
        assert "'unknown.kind'" in err.message
        # a kind declared on another pool is not run by this one
        err = await failure(await sched.submit({}, kind="elsewhere", pool="default"))
        assert "'elsewhere'" in err.message
        assert await (await sched.submit({}, kind="elsewhere", pool="other")) == 2
        assert await (await known.submit()) == 1


# --- options ------------------------------------------------------------------------------------


@VIRTUAL
async def test_a_key_submitted_twice_is_a_duplicate_of_the_first() -> None:
    app = cronoq.App()
    runs: list[int] = []
    gate = asyncio.Event()

    @app.task
    async def once(n: int) -> int:
        runs.append(n)
        await gate.wait()
        return n

    async with local(app):
        first = await once.options(key="only-one").submit(1)
        again = await once.options(key="only-one").submit(2)
        other = await once.options(key="another").submit(3)
        assert not first.duplicate and again.duplicate and not other.duplicate
        assert again.id == first.id != other.id
        gate.set()
        assert await first == 1
        assert await again == 1  # the first call's result
        assert await other == 3
    assert sorted(runs) == [1, 3]


@VIRTUAL
async def test_priority_orders_waiting_calls() -> None:
    app = cronoq.App()
    fixed(app)
    order: list[str] = []
    started = asyncio.Event()
    gate = asyncio.Event()

    @app.task
    async def block() -> None:
        started.set()
        await gate.wait()

    @app.task(priority="low")
    async def job(name: str) -> None:
        order.append(name)

    async with local(app):
        blocker = await block.submit()
        await started.wait()  # the only slot is taken: everything below waits
        handles = [
            await job.submit("low-1"),
            await job.options(priority="normal").submit("normal"),
            await job.options(priority="critical").submit("critical"),
            await job.submit("low-2"),
            await job.options(priority="high").submit("high"),
        ]
        gate.set()
        await blocker
        for h in handles:
            await h
    assert order == ["critical", "high", "normal", "low-1", "low-2"]


@VIRTUAL
async def test_after_and_deps_between_handles() -> None:
    app = cronoq.App()
    fixed(app, slots=4)
    order: list[str] = []
    gate = asyncio.Event()

    @app.task(retry=NO_RETRY)
    async def step(name: str, fail: bool = False) -> str:
        if name == "a":
            await gate.wait()
        order.append(name)
        if fail:
            raise Permanent(f"{name} failed")
        return name

    async with local(app) as sched:
        a = await step.submit("a")
        b = await step.options(after=a).submit("b")
        c = await step.options(after=[a, b]).submit("c")
        # with free slots, b and c still wait for a
        assert await sched.status(b.id) == "blocked"
        assert await sched.status(c.id) == "blocked"
        gate.set()
        assert [await a, await b, await c] == ["a", "b", "c"]
        assert order == ["a", "b", "c"]

        bad = await step.submit("bad", fail=True)
        on_failure = await step.options(deps=[(bad, "on_failure")]).submit("cleanup")
        on_success = await step.options(deps=[(bad, "on_success")]).submit("never")
        by_key = await step.options(key="k-bad2").submit("bad2", fail=True)
        after_key = await step.options(deps=[("k-bad2", "on_failure")]).submit("by-key")
        await failure(bad)
        await failure(by_key)
        assert await on_failure == "cleanup"
        assert await after_key == "by-key"
        err = await failure(on_success)
        assert err.status == "skipped"
    assert "never" not in order


@VIRTUAL
async def test_a_batch_with_dependencies_inside_it() -> None:
    app = cronoq.App()
    fixed(app, slots=4)
    keys: dict[str, str | None] = {}  # the call's argument: the key its attempt saw
    order: list[str] = []
    gate = asyncio.Event()

    @app.task
    async def fetch(url: str) -> str:
        keys[url] = cronoq.context().key
        if url == "b":
            await gate.wait()
        order.append(url)
        return f"<{url}>"

    @app.task
    def parse(name: str) -> str:
        keys[name] = cronoq.context().key
        order.append(name)
        return name

    async with local(app) as sched:
        a = fetch.call("a")
        b = fetch.options(key="fetch-b").call("b")
        p = parse.options(after=[a, b]).call("both")
        q = parse.options(deps=[(a, "on_success")]).call("only-a")
        handles = await app.submit_batch([p, a, q, b])
        assert [h.kind for h in handles] == ["parse", "fetch", "parse", "fetch"]
        h_p, _, h_q, _ = handles
        assert await h_q == "only-a"  # a is done, b still waits for the gate
        assert await sched.status(h_p.id) == "blocked"
        gate.set()
        assert [await h for h in handles] == ["both", "<a>", "only-a", "<b>"]
    assert order.index("a") < order.index("only-a") < order.index("b") < order.index("both")
    # the depended-on call without a key got a generated one, the one with a key kept its own
    generated = keys["a"]
    assert generated is not None and generated.startswith("fetch")
    assert keys["b"] == "fetch-b"
    # calls nothing depends on get no key
    assert keys["both"] is None and keys["only-a"] is None


@VIRTUAL
async def test_a_call_depended_on_outside_its_batch_is_refused() -> None:
    app = cronoq.App()

    @app.task
    async def one() -> None:
        pass

    async with local(app):
        lone = one.call()
        with pytest.raises(ValueError, match="same batch"):
            await app.submit_batch([one.options(after=lone).call()])
        with pytest.raises(ValueError, match="submit_batch"):
            await one.options(after=lone).submit()
        with pytest.raises(TypeError, match="submit_batch takes calls"):
            await app.submit_batch([lone, "not a call"])  # type: ignore[arg-type]


@VIRTUAL
async def test_start_in_delays_the_start() -> None:
    app = cronoq.App()
    starts: list[float] = []

    @app.task
    async def later() -> None:
        starts.append(CLOCK())

    async with local(app) as sched:
        submitted = CLOCK()
        h = await later.options(start_in=0.25).submit()
        assert await sched.status(h.id) == "scheduled"
        await h
    assert starts[0] >= submitted + 0.25


@VIRTUAL
async def test_call_options_override_the_declared_ones() -> None:
    app = cronoq.App()

    @app.task(timeout=30, tags={"team": "core"}, priority="low", retry=NO_RETRY)
    async def look() -> Seen:
        return seen()

    async with local(app):
        declared = await (await look.submit())
        assert (declared.timeout, declared.tags) == (30.0, {"team": "core"})
        over = await (
            await look.options(timeout=5, tags={"team": "web"}, key="k1", priority="high").submit()
        )
        assert (over.timeout, over.tags, over.key) == (5.0, {"team": "web"}, "k1")
        # options() chains: the later call wins, the earlier ones stay
        chained = look.options(timeout=7, key="k2").options(timeout=9)
        again = await (await chained.submit())
        assert (again.timeout, again.key, again.tags) == (9.0, "k2", {"team": "core"})


@VIRTUAL
async def test_a_call_deadline_at_overrides_the_declared_deadline_in() -> None:
    app = cronoq.App()

    @app.task(deadline_in=60)
    async def look() -> Seen:
        return seen()

    async with local(app):
        at = CLOCK() + 10
        result = await (await look.options(deadline_at=at).submit())
    assert result.deadline == pytest.approx(at)


@VIRTUAL
async def test_unknown_options_are_refused_where_they_are_written() -> None:
    app = cronoq.App()
    with pytest.raises(TypeError, match="unexpected option"):
        app.task(colour="red")  # type: ignore[call-overload]

    @app.task
    async def f() -> None:
        pass

    with pytest.raises(TypeError, match="unexpected option"):
        f.options(pool="other")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected option"):
        app.pool("p", size=3)  # type: ignore[call-arg]


# --- cronoq.context() ---------------------------------------------------------------------------


@VIRTUAL
async def test_context_in_async_and_sync_functions() -> None:
    app = cronoq.App()

    @app.task(pool="work", deadline_in=100, timeout=20, tags={"t": "1"})
    async def in_loop() -> Seen:
        await asyncio.sleep(0)  # still its attempt after a switch
        return seen()

    @app.task(pool="work")
    def in_thread() -> Seen:
        return seen()

    with pytest.raises(LookupError, match="only available inside a task function"):
        cronoq.context()
    async with local(app):
        submitted = CLOCK()
        h1 = await in_loop.options(key="loop-1").submit()
        h2 = await in_thread.submit()
        s1, s2 = await h1, await h2
        # nothing leaks into the code that awaited them
        with pytest.raises(LookupError):
            cronoq.context()
    assert (s1.task_id, s1.attempt, s1.kind, s1.key, s1.pool) == (
        h1.id,
        1,
        "in_loop",
        "loop-1",
        "work",
    )
    assert s1.deadline == pytest.approx(submitted + 100)
    assert (s1.timeout, s1.tags, s1.cancelled) == (20.0, {"t": "1"}, False)
    assert s1.thread == threading.current_thread().name
    assert (s2.task_id, s2.attempt, s2.kind, s2.key, s2.pool) == (
        h2.id,
        1,
        "in_thread",
        None,
        "work",
    )
    assert (s2.deadline, s2.timeout, s2.tags, s2.cancelled) == (None, None, {}, False)
    assert s2.thread != threading.current_thread().name
    # a sync function called directly is not an attempt either
    with pytest.raises(LookupError):
        in_thread()


@VIRTUAL
async def test_context_attempt_counts_retries_and_threads_do_not_keep_it() -> None:
    app = cronoq.App()
    fixed(app, slots=1)

    @app.task(retry=FAST_RETRY)
    def flaky() -> int:
        ctx = cronoq.context()
        if ctx.attempt < 3:
            raise Retryable("again")
        return ctx.attempt

    @app.task
    def outside() -> bool:
        try:
            cronoq.context()
        except LookupError:
            return False
        return True

    async with local(app):
        assert await (await flaky.submit()) == 3
        assert await (await outside.submit()) is True
        # the executor's threads do not keep an attempt once it ended
        loop = asyncio.get_running_loop()
        for _ in range(4):
            with pytest.raises(LookupError):
                await loop.run_in_executor(None, cronoq.context)


@VIRTUAL
async def test_a_cancelled_task_sees_it_and_its_handle_fails() -> None:
    app = cronoq.App()
    started = asyncio.Event()

    saw_cancel: list[bool] = []

    @app.task
    async def wait_forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            saw_cancel.append(cronoq.context().is_cancelled())

    async with local(app):
        h = await wait_forever.submit()
        await started.wait()
        with pytest.raises(TimeoutError):
            await h.result(timeout=0.5)
        assert await h.cancel() is True
        err = await failure(h)
        assert err.status == "cancelled"
        assert await h.cancel() is False
    assert saw_cancel == [True]


# --- starting and declaring ---------------------------------------------------------------------


@VIRTUAL
async def test_submitting_before_the_app_is_started() -> None:
    app = cronoq.App("mine")

    @app.task
    async def f(a: int) -> int:
        return a

    with pytest.raises(RuntimeError, match="app 'mine' is not started"):
        await f.submit(1)
    with pytest.raises(RuntimeError, match="is not started"):
        await app.submit_batch([f.call(1)])
    async with local(app):
        h = await f.submit(1)
        assert await h == 1
    with pytest.raises(RuntimeError, match="is not started"):
        await f.submit(1)


@VIRTUAL
async def test_starting_twice_is_refused_and_the_first_keeps_running() -> None:
    app = cronoq.App("twice")

    @app.task
    async def f(a: int) -> int:
        return a

    async with local(app):
        with pytest.raises(RuntimeError, match="app 'twice' is already started"):
            async with local(app):
                pass
        assert await (await f.submit(4)) == 4
    # and it can be started again once stopped
    async with local(app):
        assert await (await f.submit(5)) == 5


@VIRTUAL
async def test_bad_calls_are_refused_at_submit() -> None:
    app = cronoq.App()

    @app.task
    async def f(a: int, *, b: str = "") -> int:
        return a

    async with local(app) as sched:
        with pytest.raises(TypeError, match="missing required argument 'a'"):
            await f.submit()  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
            await f.submit(1, c=2)  # type: ignore[call-arg]
        assert (await sched.snapshot()).live_tasks == 0


def test_declaration_errors() -> None:
    app = cronoq.App()

    async def job() -> None:
        pass

    declared = app.task(job)
    redos: list[Callable[[], object]] = [lambda: app.task(job), lambda: app.task(declared)]
    for redo in redos:
        with pytest.raises(ValueError) as info:
            redo()
        assert "'job'" in str(info.value) and "declared twice" in str(info.value)
        assert "\n" not in str(info.value)

    def other() -> None:
        pass

    with pytest.raises(ValueError) as info:
        app.task(kind="job")(other)
    assert "'job'" in str(info.value) and "already declared" in str(info.value)
    assert "\n" not in str(info.value)
    assert list(app.tasks) == ["job"]

    with pytest.raises(TypeError):
        app.task(42)  # type: ignore[call-overload]

    app.pool("p", max=2)
    with pytest.raises(ValueError, match="configured twice"):
        app.pool("p", max=3)
    with pytest.raises((ValueError, TypeError)):
        app.pool("q", min=5, max=2)
    assert "q" not in app.pools


@VIRTUAL
async def test_different_lease_ttls_in_one_pool_are_refused_at_start() -> None:
    app = cronoq.App()

    @app.task(lease_ttl=5)
    async def a() -> None:
        pass

    @app.task(lease_ttl=6)
    async def b() -> None:
        pass

    with pytest.raises(ValueError, match="different lease_ttl"):
        async with local(app):
            pass


@VIRTUAL
async def test_pool_settings_are_applied() -> None:
    app = cronoq.App(default_pool="main")
    fixed(app, "main", slots=3)
    fixed(app, "idle", slots=2)  # a pool with settings and no task
    running = 0
    most = 0
    gate = asyncio.Event()
    three = asyncio.Event()

    @app.task
    async def busy() -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 3:
            three.set()
        await gate.wait()
        running -= 1

    async with local(app) as sched:
        assert sorted(sched.pools) == ["idle", "main"]
        assert busy.pool == "main"
        handles = [await busy.submit() for _ in range(5)]
        await three.wait()
        snap = await sched.snapshot()
        main, idle = snap.pool("main"), snap.pool("idle")
        assert main is not None and idle is not None
        assert (main.capacity, main.busy, main.pending) == (3, 3, 2)
        assert idle.capacity == 2
        gate.set()
        for h in handles:
            await h
    assert most == 3


# --- a durable run ------------------------------------------------------------------------------


async def test_a_durable_run_sends_arguments_and_results_through_json(tmp_path: Path) -> None:
    app = cronoq.App()
    moment = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    got: list[Drawing] = []

    @app.task
    async def store_drawing(d: Drawing, extra: dict[str, Pt] | None = None) -> Drawing:
        got.append(d)
        assert extra is None or all(type(p) is Pt for p in extra.values())
        return dataclasses.replace(d, title=d.title + "!")

    @app.task
    def count(points: list[Pt]) -> int:
        return len(points)

    drawing = Drawing("d", [Pt(1, 2)], Shape.SQUARE, moment, 0.5)
    path = tmp_path / "tasks.db"
    async with local(app, store=cronoq.SqliteStore(path)) as sched:
        h = await store_drawing.options(key="durable-1").submit(drawing, extra={"o": Pt(0, 0)})
        result = await h
        assert result == dataclasses.replace(drawing, title="d!")
        assert type(result) is Drawing and type(result.points[0]) is Pt
        assert type(result.at) is datetime and result.shape is Shape.SQUARE
        # a payload written by hand (what another language would send) is read the same way
        raw = await sched.submit({"points": [{"x": 1, "y": 1}, {"x": 2, "y": 2}]}, kind="count")
        assert await raw == 2
        bad = await sched.submit({"points": [{"x": "one", "y": 1}]}, kind="count")
        err = await failure(bad)
        assert re.search(
            r"^parameter 'points' of \S*count: \[0\] \['x'\] expected an integer", err.message
        )
    assert got == [drawing]
    assert type(got[0].points[0]) is Pt
    # the store kept the task: a new session on the same file knows the key
    async with local(app, store=cronoq.SqliteStore(path)) as sched:
        again = await store_drawing.options(key="durable-1").submit(drawing)
        assert again.duplicate and again.id == h.id
    assert got == [drawing]


# --- arguments that work in a direct call work as a task too ------------------------------------


@VIRTUAL
async def test_var_positional_arguments_in_library_mode() -> None:
    app = cronoq.App()

    @app.task(retry=NO_RETRY)
    async def total(*values: int) -> int:
        return sum(values)

    async with local(app):
        assert await (await total.submit(1, 2, 3)) == 6


@VIRTUAL
async def test_a_parameter_before_var_positional() -> None:
    app = cronoq.App()

    @app.task(retry=NO_RETRY)
    async def scaled(factor: int, *values: int) -> list[int]:
        return [factor * v for v in values]

    async with local(app) as sched:
        # the envelope as JSON data sends it (another language, or `cronoq submit --kind`)
        h = await sched.submit({"factor": 2, "values": [1, 2]}, kind="scaled")
        assert await h == [2, 4]


async def test_var_keyword_values_are_stored_as_json(tmp_path: Path) -> None:
    app = cronoq.App()

    @app.task
    async def paint(**shapes: Shape) -> list[str]:
        return sorted(f"{k}={v.value}" for k, v in shapes.items())

    async with local(app, store=cronoq.SqliteStore(tmp_path / "db")):
        assert await (await paint.submit(a=Shape.SQUARE)) == ["a=square"]


async def test_positional_only_keyword_only_and_var_keyword_in_library_mode(tmp_path: Path) -> None:
    app = cronoq.App()

    @app.task
    async def mixed(a: int, /, b: Shape, *, c: Pt, **more: int) -> list[Any]:
        return [a, b.value, c.x, sorted(more.items())]

    async with local(app):
        assert await (await mixed.submit(1, Shape.CIRCLE, c=Pt(3, 4), z=5, y=6)) == [
            1,
            "circle",
            3,
            [("y", 6), ("z", 5)],
        ]
    async with local(app, store=cronoq.SqliteStore(tmp_path / "db")):
        assert await (await mixed.submit(1, b=Shape.SQUARE, c=Pt(3, 4))) == [1, "square", 3, []]


# --- run(): one call from synchronous code --------------------------------------------------------


def test_run_without_a_target_runs_in_a_scheduler_of_its_own() -> None:
    app = cronoq.App()
    seen: list[str] = []

    @app.task
    def greet(name: str, punctuation: str = "!") -> str:
        seen.append(cronoq.context().kind)
        return f"hello {name}{punctuation}"

    assert greet.run("ada") == "hello ada!"
    assert greet.options(priority="high").run("bob", punctuation="?") == "hello bob?"
    assert seen == ["greet", "greet"]
    with pytest.raises(TypeError, match=r"missing required argument 'name'"):
        greet.run()  # type: ignore[call-arg]


def test_run_refuses_to_block_an_event_loop() -> None:
    app = cronoq.App()

    @app.task
    async def noop() -> None:
        return None

    async def inside() -> None:
        with pytest.raises(RuntimeError, match=r"noop.run\(\) blocks: in async code use"):
            noop.run()

    asyncio.run(inside())


def test_a_result_given_up_on_does_not_log_a_lost_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After `result(timeout=)` gave up, the task's later failure is nobody's to log."""
    app = cronoq.App()
    release = asyncio.Event()

    @app.task
    async def late() -> None:
        await release.wait()
        raise RuntimeError("too late")

    async def body() -> None:
        async with app.local(shutdown_grace=0):
            handle = await late.submit()
            with pytest.raises(TimeoutError):
                await handle.result(timeout=0)
            release.set()
            with pytest.raises(TaskFailed, match="too late"):
                await handle

    asyncio.run(body())
    gc.collect()
    assert "never retrieved" not in caplog.text
