"""The application model: task functions declared on an `App`, submitted with their own typed
parameters, run in-process or by remote workers (docs/app.md).

Everything here is built on the published API and changes none of it: library mode is one
`Scheduler` whose pools come from the declarations, each pool's executor routing attempts to
functions by `kind`; server mode is a `Client` for submitting and one `Worker` per pool for
serving. Which one runs is chosen by how the application is started (`App.local()`,
`App.connect()`, `cronoq worker`), never by the task functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Mapping,
    Sequence,
)
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

from .._attempt import CancellationToken
from .._options import AWAITABLE_EXECUTOR, Pool
from ..core.model import Priority, RetryPolicy
from ..core.vocab import DepCondition, MissPolicy, Overflow, PriorityName, UnknownDependency
from ..errors import Permanent
from ..runtime import Scheduler, TaskContext, TaskHandle
from ..store.codec import Codec, JsonCodec
from ._args import ArgumentError, Bound, Signature

if TYPE_CHECKING:
    from .._options import AutoscaleConfig
    from ..client import Client, Lease, Worker

__all__ = [
    "App",
    "AsyncTaskFunction",
    "Call",
    "CallOptions",
    "Context",
    "Handle",
    "PoolOptions",
    "Ref",
    "Submitter",
    "SyncTaskFunction",
    "TaskFunction",
    "TaskOptions",
    "WireCodec",
    "context",
]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

JSON = "application/json"


class WireCodec(Codec, Protocol):
    """A codec for arguments and results on the wire: `encode`, `decode` and the media type
    its bytes are sent with (the `content_type` of the task)."""

    content_type: str


class _Json(JsonCodec):
    __slots__ = ()
    content_type = JSON


# --- options ------------------------------------------------------------------------------------


class TaskOptions(TypedDict, total=False):
    """What `@app.task(...)` takes: defaults for every call of the task."""

    kind: str
    pool: str
    priority: Priority | int | PriorityName
    timeout: float
    deadline_in: float
    retry: RetryPolicy
    lease_ttl: float
    duration_hint: float
    labels: Mapping[str, str]
    resources: Mapping[str, int]
    tags: Mapping[str, str]
    tenant: str
    serve: bool  # False: declared for typed submits, served by another program


class CallOptions(TypedDict, total=False):
    """What `task.options(...)` takes: options of one call, over the task's defaults."""

    key: str
    priority: Priority | int | PriorityName
    deadline_in: float
    deadline_at: float | datetime
    start_in: float
    start_at: float | datetime
    tolerance: float
    on_miss: MissPolicy
    timeout: float
    retry: RetryPolicy
    duration_hint: float
    after: Ref | Sequence[Ref]
    deps: Sequence[tuple[Ref, DepCondition]]
    labels: Mapping[str, str]
    resources: Mapping[str, int]
    tags: Mapping[str, str]
    tenant: str


class PoolOptions(TypedDict, total=False):
    """What `app.pool(name, ...)` takes: the `Pool` settings of library mode, and `max` as the
    slots a `cronoq worker` offers the pool."""

    min: int
    max: int
    initial: int
    autoscale: bool | AutoscaleConfig
    lease_ttl: float
    max_pending: int
    overflow: Overflow
    retry: RetryPolicy
    unknown_dependency: UnknownDependency
    await_timeout: float
    default_duration: float
    reservable_fraction: float
    tenant_weights: Mapping[str, float]
    fair_share: bool


# Options of which a call gives one or the other: the later given replaces the earlier.
_EITHER = (
    ("deadline_in", "deadline_at"),
    ("deadline_at", "deadline_in"),
    ("start_in", "start_at"),
    ("start_at", "start_in"),
)
_TASK_OPTIONS = TaskOptions.__optional_keys__
_CALL_OPTIONS = CallOptions.__optional_keys__
_POOL_OPTIONS = PoolOptions.__optional_keys__


def _check_names(given: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(given.keys() - known)
    if unknown:
        raise TypeError(f"{where} got unexpected option(s): {', '.join(unknown)}")


# --- the attempt's context ----------------------------------------------------------------------

_current: contextvars.ContextVar[TaskContext | Lease] = contextvars.ContextVar("cronoq_attempt")


class Context:
    """The attempt a task function runs as, in either mode: `cronoq.context()` inside it."""

    __slots__ = ("raw",)

    def __init__(self, raw: TaskContext | Lease) -> None:
        self.raw = raw  # the library's TaskContext or the worker's Lease

    @property
    def task_id(self) -> int:
        raw = self.raw
        return raw.id if isinstance(raw, TaskContext) else raw.task_id

    @property
    def attempt(self) -> int:
        return self.raw.attempt

    @property
    def kind(self) -> str:
        return self.raw.kind

    @property
    def key(self) -> str | None:
        return self.raw.key or None

    @property
    def pool(self) -> str:
        return self.raw.pool

    @property
    def deadline(self) -> float | None:
        """Unix seconds, None without one."""
        return self.raw.deadline

    @property
    def timeout(self) -> float | None:
        return self.raw.timeout

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.raw.tags)

    def is_cancelled(self) -> bool:
        return self.raw.is_cancelled()

    def cancellation_token(self) -> CancellationToken:
        return self.raw.cancellation_token()

    def traceparent(self) -> str | None:
        """The task's W3C trace context (docs/observability.md, "Traces"), None without one."""
        return self.raw.traceparent()

    def tracestate(self) -> str | None:
        return self.raw.tracestate()

    def heartbeat(self) -> None:
        """Extend the attempt's lease. A remote worker does this by itself every third of the
        lease TTL, so it matters only in library mode, for a pool with `lease_ttl`."""
        raw = self.raw
        if isinstance(raw, TaskContext):
            raw.heartbeat()

    def __repr__(self) -> str:
        return f"Context(task_id={self.task_id}, attempt={self.attempt}, kind={self.kind!r})"


def context() -> Context:
    """The attempt of the task function running now; LookupError outside one."""
    try:
        return Context(_current.get())
    except LookupError:
        raise LookupError("cronoq.context() is only available inside a task function") from None


# --- handles and calls --------------------------------------------------------------------------


class Handle(Generic[R_co]):
    """A submitted call: `await handle` is the function's result, typed as it returns."""

    __slots__ = ("_app", "_inner", "_task", "duplicate", "id")

    def __init__(
        self, app: App, task: TaskFunction[Any, Any], id: int, duplicate: bool, inner: Any
    ) -> None:
        self._app = app
        self._task = task
        self.id = id
        self.duplicate = duplicate
        self._inner = inner  # the library's TaskHandle, None in server mode

    @property
    def kind(self) -> str:
        return self._task.kind

    async def result(self, timeout: float | None = None) -> R_co:
        """The result; TaskFailed if the task did not succeed, TimeoutError after `timeout`
        seconds (the task goes on)."""
        value = await self._app._runner().wait(self, timeout)
        return self._task.signature.returned(value)  # type: ignore[no-any-return]

    def __await__(self) -> Generator[Any, None, R_co]:
        inner = self._inner
        if inner is not None and not self._task.signature.converts_result:
            # library mode, a result that needs no building: the scheduler's own handle
            return inner.__await__()  # type: ignore[no-any-return]
        return self._converted().__await__()

    async def _converted(self) -> R_co:
        inner = self._inner
        value = await (self._app._runner().wait(self, None) if inner is None else inner)
        return self._task.signature.returned(value)  # type: ignore[no-any-return]

    async def cancel(self) -> bool:
        """Cancel the task; False once it has ended."""
        return await self._app._runner().cancel(self.id)

    def __repr__(self) -> str:
        return f"Handle(id={self.id}, kind={self.kind!r}, duplicate={self.duplicate})"


class Call(Generic[R_co]):
    """One call of a task function, not yet submitted: for `App.submit_batch`, and as a
    dependency of the other calls of its batch."""

    __slots__ = ("options", "payload", "task")

    def __init__(
        self, task: TaskFunction[Any, Any], payload: dict[str, Any], options: dict[str, Any]
    ) -> None:
        self.task = task
        self.payload = payload  # the envelope object
        self.options = options  # the task's defaults with this call's options over them

    def __repr__(self) -> str:
        return f"Call({self.task.kind!r}, {self.payload!r})"


Ref: TypeAlias = "Handle[Any] | Call[Any] | int | str"
"""A dependency target: a handle, a call of the same batch, a task id or a key."""


# --- task functions -----------------------------------------------------------------------------


class Submitter(Generic[P, R_co]):
    """Submits calls of one task function with a fixed set of options: a task function, or
    what its `options()` returns."""

    __slots__ = ("_options", "_task")

    _task: TaskFunction[Any, Any]
    _options: dict[str, Any]

    def options(self, **options: Unpack[CallOptions]) -> Submitter[P, R_co]:
        """The same task with these options for its calls (each call's arguments stay checked)."""
        _check_names(options, _CALL_OPTIONS, f"{self._task.kind}.options()")
        merged: dict[str, Any] = {**self._options, **options}
        for given, other in _EITHER:  # a relative time replaces an absolute one, and back
            if given in options and other not in options:
                merged.pop(other, None)
        bound = Submitter.__new__(Submitter)
        bound._task = self._task
        bound._options = merged
        return bound

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call[R_co]:
        """One call, for `App.submit_batch`; the arguments are checked now."""
        return Call(self._task, self._task.signature.bind(args, kwargs), self._options)

    def run(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        """Submit one call and wait for its result, from synchronous code (a script, a shell):
        on the app's `target` server if it has one, else in a scheduler of its own in this
        process. Inside async code, `await task.submit(...)` instead."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                f"{self._task.kind}.run() blocks: in async code use `await (await"
                f" {self._task.kind}.submit(...))`"
            )
        task = self._task
        call: Call[R_co] = Call(task, task.signature.bind(args, kwargs), self._options)
        return asyncio.run(_run_once(task.app, call))

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, Handle[R_co]]:
        """Submit one call: `await` it for the handle, and the handle for the result. (A plain
        method returning the runner's coroutine, one frame less per submit: the arguments
        are checked when it is called.)"""
        task = self._task
        call: Call[R_co] = Call(task, task.signature.bind(args, kwargs), self._options)
        return (task.app._runner_now or task.app._runner()).submit(call)


async def _run_once(app: App, call: Call[R]) -> R:
    """One call, submitted and awaited on a runner started for it (`Submitter.run`)."""
    runner = app.connect() if app.target is not None else app.local()
    async with runner:
        handle = await app._runner().submit(call)
        return await handle  # type: ignore[no-any-return]


class TaskFunction(Submitter[P, R_co]):
    """A function declared with `@app.task`: calling it runs it here, as before; `submit`
    runs it as a task of the app."""

    def __init__(
        self, app: App, fn: Callable[..., Any], kind: str, pool: str, options: dict[str, Any]
    ) -> None:
        self.app = app
        self.fn = fn
        self.kind = kind
        self.pool = pool
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = Signature(fn, getattr(fn, "__qualname__", kind))
        self.lease_ttl: float | None = options.pop("lease_ttl", None)
        # False: only declared here (typed submits); a program in another language serves it
        self.serve: bool = options.pop("serve", True)
        self._task = self
        self._options = {"kind": kind, "pool": pool, **options}
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<task {self.kind!r} of pool {self.pool!r}: {self.signature.name}>"


class AsyncTaskFunction(TaskFunction[P, R_co]):
    """A task function declared on an `async def`."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]:
        return self.fn(*args, **kwargs)  # type: ignore[no-any-return]


class SyncTaskFunction(TaskFunction[P, R_co]):
    """A task function declared on a plain function (it runs in a thread as a task)."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        return self.fn(*args, **kwargs)  # type: ignore[no-any-return]


class _Declare(Protocol):
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> AsyncTaskFunction[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> SyncTaskFunction[P, R]: ...


# --- running ------------------------------------------------------------------------------------


class _Runner(Protocol):
    async def submit(self, call: Call[Any]) -> Handle[Any]: ...

    async def submit_batch(self, calls: Sequence[Call[Any]]) -> list[Handle[Any]]: ...

    async def wait(self, handle: Handle[Any], timeout: float | None) -> Any: ...

    async def cancel(self, id: int) -> bool: ...


def _batch_keys(calls: Sequence[Call[Any]]) -> dict[int, str]:
    """A key for every call another call of the batch depends on (a generated one for a call
    that has none), by the call's identity."""
    members = {id(c) for c in calls}
    keys: dict[int, str] = {}
    for c in calls:
        for target in _targets(c.options):
            if isinstance(target, Call):
                if id(target) not in members:
                    raise ValueError(
                        f"a call of {c.task.kind} depends on a call of {target.task.kind}"
                        " that is not in the same batch"
                    )
                keys[id(target)] = target.options.get("key") or f"{target.task.kind}:{uuid.uuid4()}"
    return keys


def _targets(options: Mapping[str, Any]) -> list[Any]:
    after = options.get("after")
    found = (
        []
        if after is None
        else [after]
        if not isinstance(after, Sequence) or isinstance(after, str)
        else list(after)
    )
    found.extend(target for target, _ in options.get("deps") or ())
    return found


def _listed(after: Any) -> list[Any]:
    """`after=` as a list of targets (one target, or a sequence of them)."""
    return [after] if isinstance(after, str) or not isinstance(after, Sequence) else list(after)


def _ref(target: Any, keys: Mapping[int, str]) -> int | str:
    """A dependency target as the id or key the scheduler takes."""
    if isinstance(target, Handle):
        return target.id
    if isinstance(target, Call):
        try:
            return keys[id(target)]
        except KeyError:
            raise ValueError(
                f"a call of {target.task.kind} can be depended on only within its batch"
                " (submit_batch); depend on its handle once it is submitted"
            ) from None
    return target  # type: ignore[no-any-return]


def _wire_options(call: Call[Any], keys: Mapping[int, str]) -> dict[str, Any]:
    """The call's options as `Scheduler.submit` and `Client.submit` both name them."""
    options = call.options
    if id(call) in keys and "key" not in options:
        options = {**options, "key": keys[id(call)]}
    after = options.get("after")
    deps = options.get("deps")
    if after is None and not deps:
        return options
    options = dict(options)
    if after is not None:
        options["after"] = [_ref(t, keys) for t in _listed(after)]
    if deps:
        options["deps"] = [(_ref(t, keys), on) for t, on in deps]
    return options


class App:
    """Task functions and the pools they run on; started in one of two modes (docs/app.md)."""

    def __init__(
        self,
        name: str = "cronoq",
        *,
        target: str | None = None,
        token: str | None = None,
        default_pool: str = "default",
        codec: WireCodec | None = None,
    ) -> None:
        """`target`: the cronoq-server this app submits to and serves by default (connect(),
        run(), `cronoq worker`); None runs `run()` in-process. `token`: the client token
        connect() and run() send (a worker takes its own, --token)."""
        self.name = name
        self.target = target
        self.token = token
        self.default_pool = default_pool
        self.codec: WireCodec = _Json() if codec is None else codec
        if not isinstance(getattr(self.codec, "content_type", None), str):
            raise TypeError("codec must have a content_type (the media type of its bytes)")
        self.tasks: dict[str, TaskFunction[Any, Any]] = {}
        self.pools: dict[str, dict[str, Any]] = {}
        self._runner_now: _Runner | None = None

    def __repr__(self) -> str:
        return f"App({self.name!r}, tasks={sorted(self.tasks)})"

    # --- declaring ---------------------------------------------------------------------------

    @overload
    def task(  # type: ignore[overload-overlap]
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> AsyncTaskFunction[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> SyncTaskFunction[P, R]: ...

    @overload
    def task(self, /, **options: Unpack[TaskOptions]) -> _Declare: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Declare a task function, as `@app.task` or `@app.task(pool=..., ...)`."""
        _check_names(options, _TASK_OPTIONS, "app.task()")
        if fn is None:
            return functools.partial(self._declare, options=options)
        return self._declare(fn, options)

    def _declare(self, fn: Callable[..., Any], options: dict[str, Any]) -> TaskFunction[Any, Any]:
        if isinstance(fn, TaskFunction):
            raise ValueError(f"task {fn.kind!r} is declared twice")
        if not callable(fn):
            raise TypeError(f"@app.task declares functions (got {fn!r})")
        options = dict(options)
        kind = options.pop("kind", None) or getattr(fn, "__name__", None)
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"{fn!r} has no __name__: give the task a kind=")
        pool = options.pop("pool", None) or self.default_pool
        other = self.tasks.get(kind)
        if other is not None:
            what = (
                "is declared twice"
                if other.fn is fn
                else f"is already declared by {other.signature.name}"
            )
            raise ValueError(f"task kind {kind!r} {what}")
        cls = AsyncTaskFunction if inspect.iscoroutinefunction(fn) else SyncTaskFunction
        declared: TaskFunction[Any, Any] = cls(self, fn, kind, pool, options)
        self.tasks[kind] = declared
        return declared

    def pool(self, name: str, **options: Unpack[PoolOptions]) -> None:
        """Settings of one pool (library mode; `max` is also a worker's default slots)."""
        _check_names(options, _POOL_OPTIONS, "app.pool()")
        if name in self.pools:
            raise ValueError(f"pool {name!r} is configured twice")
        Pool(name, _unused, **options)  # refuse bad settings where they are written
        self.pools[name] = dict(options)

    def pool_names(self) -> list[str]:
        """Every pool a task is declared on or that has settings, in declaration order."""
        names = dict.fromkeys(t.pool for t in self.tasks.values())
        names.update(dict.fromkeys(self.pools))
        return list(names) or [self.default_pool]

    def slots(self, pool: str) -> int:
        """The slots a worker offers `pool` unless told otherwise: the pool's `max`."""
        return int(self.pools.get(pool, {}).get("max", 10))

    def kinds(self, pool: str) -> dict[str, TaskFunction[Any, Any]]:
        """The tasks this app serves on `pool` (not those declared with serve=False)."""
        return {k: t for k, t in self.tasks.items() if t.pool == pool and t.serve}

    # --- submitting --------------------------------------------------------------------------

    def _runner(self) -> _Runner:
        runner = self._runner_now
        if runner is None:
            raise RuntimeError(
                f"app {self.name!r} is not started: submit inside `async with app.local():`"
                " (in-process) or `async with app.connect(target):` (a cronoq-server)"
            )
        return runner

    @overload
    async def submit_batch(self, calls: Sequence[Call[R]]) -> list[Handle[R]]: ...

    @overload
    async def submit_batch(self, calls: Sequence[Call[Any]]) -> list[Handle[Any]]: ...

    async def submit_batch(self, calls: Sequence[Call[Any]]) -> list[Handle[Any]]:
        """Submit the calls all or none; a call may depend on others of the batch (`after=`,
        `deps=` naming the `Call`)."""
        for c in calls:
            if not isinstance(c, Call):
                raise TypeError(f"submit_batch takes calls (task.call(...)), not {c!r}")
        return await self._runner().submit_batch(calls)

    # --- starting ----------------------------------------------------------------------------

    def scheduler(self, **settings: Any) -> Scheduler:
        """A library-mode `Scheduler` for these tasks (not started): one pool per declared
        pool, each routing attempts to the functions by kind. `settings` are Scheduler's."""
        pools = []
        for name in self.pool_names():
            options = dict(self.pools.get(name, {}))
            ttls = {t.lease_ttl for t in self.kinds(name).values() if t.lease_ttl is not None}
            if len(ttls) > 1:
                raise ValueError(
                    f"the tasks of pool {name!r} declare different lease_ttl {sorted(ttls)}"
                )
            if ttls:
                options.setdefault("lease_ttl", ttls.pop())
            pools.append(Pool(name, _local_executor(self, name), **options))
        return Scheduler(pools, **settings)

    @contextlib.asynccontextmanager
    async def local(self, **settings: Any) -> AsyncIterator[Scheduler]:
        """Run the tasks in this process while the block runs (library mode); yields the
        started `Scheduler` (`settings` are its own: store, resources, shutdown_grace, ...)."""
        sched = self.scheduler(**settings)
        async with sched:
            with self._running(_Local(self, sched)):
                yield sched

    @contextlib.asynccontextmanager
    async def connect(
        self, target: str | None = None, **client_options: Any
    ) -> AsyncIterator[Client]:
        """Submit to the cronoq-server at `target` (default: the app's) while the block runs
        (server mode); yields the `Client` (`client_options` are its own: token, tls, ...)."""
        from ._remote import Remote

        target = target or self.target
        if target is None:
            raise ValueError(f"app {self.name!r} has no target: connect(target) or App(target=)")
        if self.token is not None:
            client_options = {"token": self.token, **client_options}
        remote = Remote(self, target, client_options)
        async with remote.client:
            with self._running(remote):
                yield remote.client

    @contextlib.contextmanager
    def _running(self, runner: _Runner) -> Generator[None, None, None]:
        if self._runner_now is not None:
            raise RuntimeError(f"app {self.name!r} is already started")
        self._runner_now = runner
        try:
            yield
        finally:
            self._runner_now = None

    def worker(self, target: str, pool: str | None = None, **worker_options: Any) -> Worker:
        """A `Worker` serving `pool` (the default pool if None) of the server at `target` with
        this app's functions; `worker_options` are Worker's (slots, token, tls, labels, ...)."""
        from ._remote import worker

        return worker(self, target, pool or self.default_pool, worker_options)


def _unused(ctx: Any, payload: Any) -> None:
    """The executor a pool's settings are checked with: it never runs."""


# --- library mode -------------------------------------------------------------------------------


def _in_thread(
    attempt: TaskContext | Lease,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
) -> Any:
    token = _current.set(attempt)
    try:
        return fn(*args, **kwargs)
    finally:
        _current.reset(token)


def invoke(task: TaskFunction[Any, Any], attempt: TaskContext | Lease, payload: Any) -> Any:
    """Start `task` for one attempt with the arguments `payload` (an envelope object) stands
    for: the awaitable of its return value (a plain function runs in the loop's executor). A
    payload that does not fit fails the task for good. Not a coroutine itself, so that an
    attempt costs one frame less."""
    sig = task.signature
    if type(payload) is Bound and sig.direct:  # a call of this process, used as it is
        args: Sequence[Any] = ()
        kwargs: dict[str, Any] = payload
    else:
        try:
            args, kwargs = sig.arguments(payload)
        except ArgumentError as e:
            raise Permanent(str(e)) from None
    if task.is_async:
        _current.set(attempt)  # each attempt runs in an asyncio task of its own: no reset
        return task.fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(None, _in_thread, attempt, task.fn, args, kwargs)


def _local_executor(app: App, pool: str) -> Callable[[TaskContext, Any], Awaitable[Any]]:
    """The executor of one library-mode pool: starts the attempt's function, by kind. It
    returns the function's own coroutine when the result needs no converting (marked so that
    the pool awaits it on the loop): an attempt then costs no frame of ours."""
    tasks = app.tasks

    def run(ctx: TaskContext, payload: Any) -> Awaitable[Any]:
        task = tasks.get(ctx.task.kind)
        if task is None or task.pool != pool or not task.serve:
            raise Permanent(_unserved(pool, ctx.task.kind, task))
        started = invoke(task, ctx, payload)
        return _converted(task, started) if task.signature.converts_result else started

    setattr(run, AWAITABLE_EXECUTOR, True)
    return run


def _unserved(pool: str, kind: str, task: TaskFunction[Any, Any] | None) -> str:
    """Why an attempt of `kind` finds no function to run here."""
    if task is not None and task.pool == pool:
        return f"task {kind!r} is declared with serve=False: another program serves it"
    return f"pool {pool!r} has no task function for kind {kind!r}"


async def _converted(task: TaskFunction[Any, Any], started: Awaitable[Any]) -> Any:
    return task.signature.result(await started)


class _Local:
    """Submits to a started library-mode `Scheduler`."""

    def __init__(self, app: App, sched: Scheduler) -> None:
        self._app = app
        self._sched = sched

    async def submit(self, call: Call[Any]) -> Handle[Any]:
        options = call.options
        if "after" in options or "deps" in options:  # (most calls have neither)
            options = _scheduler_options(call, {})
        th = await self._sched.submit(call.payload, **options)
        return Handle(self._app, call.task, th.id, th.duplicate, th)

    async def submit_batch(self, calls: Sequence[Call[Any]]) -> list[Handle[Any]]:
        from .._options import Task

        keys = _batch_keys(calls)
        tasks = []
        for c in calls:
            tasks.append(Task(c.payload, **_scheduler_options(c, keys)))
        handles = await self._sched.submit_batch(tasks)
        return [
            Handle(self._app, c.task, th.id, th.duplicate, th)
            for c, th in zip(calls, handles, strict=True)
        ]

    async def wait(self, handle: Handle[Any], timeout: float | None) -> Any:
        inner: TaskHandle = handle._inner
        waiting = asyncio.ensure_future(inner.result())
        # after a timeout nobody awaits it: its end must not be logged as never retrieved
        waiting.add_done_callback(_retrieved)
        return await asyncio.wait_for(asyncio.shield(waiting), timeout)

    async def cancel(self, id: int) -> bool:
        return await self._sched.cancel(id)


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


def _scheduler_options(call: Call[Any], keys: Mapping[int, str]) -> dict[str, Any]:
    """The call's options as `Scheduler.submit` takes them: `_wire_options`, with the
    `(target, condition)` pairs of `deps` as `Dep`s (a new dict: the call's own is shared)."""
    from .._options import Dep

    options = _wire_options(call, keys)
    deps = options.get("deps")
    if deps:
        options = {**options, "deps": [Dep(target, on=on) for target, on in deps]}
    return options
