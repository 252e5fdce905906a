"""User-facing option values and the one place where submit options become a core TaskRecord.

`Pool`, `AutoscaleConfig`, `Resource` and `Dep` validate their arguments when built, so a bad
configuration fails where it is written. `build_task` checks every `submit()` option and is
shared by submit, enqueue and submit_batch (through `Task`), so all of them report identical
errors. It is also the library's hottest Python path: a plain `submit(payload)` must cost a
handful of `is None` tests, which is why rarely used options are looked at only when given.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict, Unpack

from cronoq.core.autoscale import AutoscaleSettings
from cronoq.core.model import (
    DEFAULT_RETRY,
    Extras,
    PoolConfig,
    Priority,
    RetryPolicy,
    TaskRecord,
    check_seconds,
    parse_priority,
)
from cronoq.core.resources import ResourceConfig
from cronoq.core.vocab import (
    DEP_CONDITIONS,
    MISS_POLICIES,
    OVERFLOWS,
    UNKNOWN_DEPENDENCY,
    DepCondition,
    DepOn,
    MissPolicy,
    Overflow,
    PriorityName,
    UnknownDependency,
)
from cronoq.errors import SubmitError

__all__ = [
    "AutoscaleConfig",
    "Dep",
    "Pool",
    "RecurringOptions",
    "Resource",
    "SubmitOptions",
    "Task",
    "build_task",
    "check_instant",
    "check_number",
]

_DEP_ON_REPR = {"success": "OnSuccess", "failure": "OnFailure", "complete": "OnComplete"}
_NUL_IN_NAMES = "invalid task: kind, pool, key and tenant must not contain NUL characters"


# --- small argument checks ---------------------------------------------------------------------


def _quote(text: str) -> str:
    """A double-quoted string, as the published package's reprs print names."""
    return json.dumps(text, ensure_ascii=False)


def _shown(value: float) -> str:
    """A number for an error message: 0.0 prints as 0, like the published messages."""
    return repr(int(value)) if value.is_integer() else repr(value)


def _count(name: str, value: object) -> int:
    """An unsigned int argument; negatives raise OverflowError, as the published package does."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (got {value!r})")
    if value < 0:
        raise OverflowError(f"{name} must not be negative (got {value})")
    return value


def check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number (got {value!r})")
    return float(value)


def _positive_seconds(name: str, value: object) -> float:
    """A duration where 0 makes no sense (a lease that is always expired, a busy-looping timer)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
        raise ValueError(f"{name} must be > 0")
    return check_seconds(name, value)


def _name(arg: str, value: object) -> str:
    """kind/pool/key/tenant: a str without NUL (stores and the wire format cannot carry NUL)."""
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str (got {value!r})")
    if "\0" in value:
        raise SubmitError("invalid", _NUL_IN_NAMES)
    return value


def check_instant(arg: str, value: object) -> float:
    """An absolute time: Unix seconds or a datetime (naive means local time)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{arg} must be Unix seconds or a datetime (got {value!r})")
    if not math.isfinite(value):
        raise ValueError(f"{arg} must be a finite number of Unix seconds (got {value!r})")
    return float(value)


def _target(arg: str, value: object) -> int | str:
    """A dependency target: a task id (int >= 1) or a key (str)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg} must be a task id (int) or a key (str) (got {value!r})")
    if value < 1:
        error = OverflowError if value < 0 else ValueError
        raise error(f"{arg} must be a task id >= 1 (got {value})")
    return value


AWAITABLE_EXECUTOR = "_cronoq_returns_awaitable"


def _is_coroutine_function(fn: object) -> bool:
    """True if calling `fn` returns a coroutine by construction (so it must run on the loop),
    or if `fn` says so with the AWAITABLE_EXECUTOR attribute: a plain function that returns
    an awaitable (the app layer's routers hand back the task function's own coroutine)."""
    if getattr(fn, AWAITABLE_EXECUTOR, False):
        return True
    while isinstance(fn, functools.partial):
        fn = fn.func
    # Look __call__ up on the type, as a call does: for a class that finds type.__call__ (which
    # builds an instance), not an `async def __call__` meant for the instances.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


# --- autoscaling -------------------------------------------------------------------------------


class AutoscaleConfig:
    """How an autoscaled pool picks its capacity (each field: docs/autoscaling.md, "Settings")."""

    __slots__ = (
        "_cooldown",
        "_cost_per_worker_second",
        "_drain_time",
        "_interval",
        "_max_step_down",
        "_max_step_up_abs",
        "_reservation_horizon",
        "_slo",
        "_stabilization_window",
        "_target_utilization",
    )

    def __init__(
        self,
        interval: float = 1.0,
        target_utilization: float = 0.75,
        drain_time: float = 30.0,
        slo: Mapping[Priority | int | str, float] | None = None,
        reservation_horizon: float = 60.0,
        stabilization_window: float = 60.0,
        cooldown: float = 30.0,
        max_step_up_abs: int = 4,
        max_step_down: int = 1,
        cost_per_worker_second: float = 0.0,
    ) -> None:
        self._interval = _positive_seconds("interval", interval)
        utilization = check_number("target_utilization", target_utilization)
        if not 0.0 < utilization <= 1.0:
            raise ValueError(f"target_utilization must be in (0, 1] (got {_shown(utilization)})")
        self._target_utilization = utilization
        self._drain_time = check_seconds("drain_time", drain_time)
        self._slo = _slo_by_class(slo)
        self._reservation_horizon = check_seconds("reservation_horizon", reservation_horizon)
        self._stabilization_window = check_seconds("stabilization_window", stabilization_window)
        self._cooldown = check_seconds("cooldown", cooldown)
        self._max_step_up_abs = _count("max_step_up_abs", max_step_up_abs)
        self._max_step_down = _count("max_step_down", max_step_down)
        cost = check_number("cost_per_worker_second", cost_per_worker_second)
        if not (math.isfinite(cost) and cost >= 0.0):
            raise ValueError(
                f"cost_per_worker_second must be a finite number >= 0 (got {_shown(cost)})"
            )
        self._cost_per_worker_second = cost

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def target_utilization(self) -> float:
        return self._target_utilization

    @property
    def drain_time(self) -> float:
        return self._drain_time

    @property
    def slo(self) -> dict[str, float]:
        """Maximum predicted queue wait per class, keyed by lower-case class name."""
        return {Priority(cls).name.lower(): seconds for cls, seconds in self._slo.items()}

    def core_settings(self) -> AutoscaleSettings:
        """The engine's view of these settings."""
        return AutoscaleSettings(
            interval=self._interval,
            target_utilization=self._target_utilization,
            drain_time=self._drain_time,
            slo=dict(self._slo),
            reservation_horizon=self._reservation_horizon,
            stabilization_window=self._stabilization_window,
            cooldown=self._cooldown,
            max_step_up_abs=self._max_step_up_abs,
            max_step_down=self._max_step_down,
            cost_per_worker_second=self._cost_per_worker_second,
        )

    @property
    def reservation_horizon(self) -> float:
        return self._reservation_horizon

    @property
    def stabilization_window(self) -> float:
        return self._stabilization_window

    @property
    def cooldown(self) -> float:
        return self._cooldown

    @property
    def max_step_up_abs(self) -> int:
        return self._max_step_up_abs

    @property
    def max_step_down(self) -> int:
        return self._max_step_down

    @property
    def cost_per_worker_second(self) -> float:
        return self._cost_per_worker_second

    def __repr__(self) -> str:
        return (
            f"AutoscaleConfig(interval={self._interval!r}, "
            f"target_utilization={self._target_utilization!r}, "
            f"drain_time={self._drain_time!r}, slo={self.slo!r}, "
            f"reservation_horizon={self._reservation_horizon!r}, "
            f"stabilization_window={self._stabilization_window!r}, "
            f"cooldown={self._cooldown!r}, max_step_up_abs={self._max_step_up_abs}, "
            f"max_step_down={self._max_step_down}, "
            f"cost_per_worker_second={self._cost_per_worker_second!r})"
        )


def _slo_by_class(slo: Mapping[Priority | int | str, float] | None) -> dict[int, float]:
    """Normalise SLO keys (Priority, int or name) to class numbers, in class order."""
    if slo is None:
        return {}
    if not isinstance(slo, Mapping):
        raise TypeError(f"slo must be a mapping of priority to seconds (got {slo!r})")
    by_class: dict[int, float] = {}
    for key, seconds in slo.items():
        if key is None:  # parse_priority reads None as NORMAL; as a key it is a mistake
            raise TypeError("slo key must be a Priority, int or str")
        cls = parse_priority(key, "slo key")
        by_class[cls] = check_seconds(f"slo[{Priority(cls).name.lower()!r}]", seconds)
    return dict(sorted(by_class.items()))


# --- pools -------------------------------------------------------------------------------------


class Pool:
    """A set of worker slots and the executor that runs the tasks submitted to it.

    `initial` defaults to `min` and is clamped into [min, max]. `autoscale=False` makes a fixed
    pool: min == initial == max, at `initial` if given, else at `max`. A negative
    `await_timeout` (accepted, as by the published package) times out at once; an infinite one
    waits forever, like None.
    """

    __slots__ = (
        "_autoscale",
        "_await_timeout",
        "_default_duration",
        "_executor",
        "_fair_share",
        "_initial",
        "_is_async",
        "_lease_ttl",
        "_max",
        "_max_pending",
        "_min",
        "_name",
        "_overflow",
        "_reservable_fraction",
        "_retry",
        "_tenant_weights",
        "_unknown_dependency",
    )

    def __init__(
        self,
        name: str,
        executor: Callable[..., Any],
        *,
        min: int = 1,
        max: int = 10,
        initial: int | None = None,
        autoscale: bool | AutoscaleConfig | None = None,
        lease_ttl: float | None = None,
        max_pending: int | None = None,
        overflow: Overflow = "wait",
        retry: RetryPolicy | None = None,
        unknown_dependency: UnknownDependency = "reject",
        await_timeout: float | None = None,
        default_duration: float = 1.0,
        reservable_fraction: float = 0.5,
        tenant_weights: Mapping[str, float] | None = None,
        fair_share: bool = False,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"pool name must be a str (got {name!r})")
        if "\0" in name:
            raise ValueError(f"pool name must not contain NUL characters (got {name!r})")
        if not callable(executor):
            raise TypeError("executor must be callable")
        low = _count("min", min)
        high = _count("max", max)
        if high < 1:
            raise ValueError("max must be >= 1")
        if low > high:
            raise ValueError("min must be <= max")
        start = low if initial is None else _count("initial", initial)
        start = low if start < low else high if start > high else start

        scaling: AutoscaleConfig | None
        if autoscale is None or autoscale is True:
            scaling = AutoscaleConfig()
        elif autoscale is False:
            scaling = None
            if initial is None:
                start = high
            low = high = start
        elif isinstance(autoscale, AutoscaleConfig):
            scaling = autoscale
        else:
            raise TypeError(
                f"autoscale must be a bool, an AutoscaleConfig or None (got {autoscale!r})"
            )

        if overflow not in OVERFLOWS:
            raise ValueError("overflow must be wait, reject, shed_lowest or shed_oldest")
        if unknown_dependency not in UNKNOWN_DEPENDENCY:
            raise ValueError("unknown_dependency must be 'reject' or 'await'")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy or None (got {retry!r})")
        fraction = check_number("reservable_fraction", reservable_fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"reservable_fraction must be in [0, 1] (got {_shown(fraction)})")

        self._name = name
        self._executor = executor
        self._min = low
        self._max = high
        self._initial = start
        self._autoscale = scaling
        self._lease_ttl = None if lease_ttl is None else _positive_seconds("lease_ttl", lease_ttl)
        self._max_pending = None if max_pending is None else _count("max_pending", max_pending)
        self._overflow = overflow
        self._retry = retry
        self._unknown_dependency = unknown_dependency
        self._await_timeout = _await_timeout(await_timeout)
        self._default_duration = check_seconds("default_duration", default_duration)
        self._reservable_fraction = fraction
        self._tenant_weights = _weights(tenant_weights)
        self._fair_share = bool(fair_share)
        self._is_async = _is_coroutine_function(executor)

    @property
    def name(self) -> str:
        return self._name

    @property
    def executor(self) -> Callable[..., Any]:
        return self._executor

    @property
    def min(self) -> int:
        return self._min

    @property
    def max(self) -> int:
        return self._max

    @property
    def initial(self) -> int:
        return self._initial

    @property
    def autoscale(self) -> AutoscaleConfig | None:
        """The autoscaling settings, or None for a fixed pool."""
        return self._autoscale

    @property
    def lease_ttl(self) -> float | None:
        return self._lease_ttl

    @property
    def max_pending(self) -> int | None:
        return self._max_pending

    @property
    def overflow(self) -> Overflow:
        return self._overflow

    @property
    def retry(self) -> RetryPolicy | None:
        return self._retry

    @property
    def unknown_dependency(self) -> UnknownDependency:
        return self._unknown_dependency

    @property
    def await_timeout(self) -> float | None:
        return self._await_timeout

    @property
    def default_duration(self) -> float:
        return self._default_duration

    @property
    def reservable_fraction(self) -> float:
        return self._reservable_fraction

    @property
    def tenant_weights(self) -> dict[str, float]:
        return dict(self._tenant_weights)

    @property
    def fair_share(self) -> bool:
        return self._fair_share

    @property
    def is_async(self) -> bool:
        """Whether the executor is a coroutine function: run it on the loop, not in a thread."""
        return self._is_async

    def core_config(self) -> PoolConfig:
        """The engine's view of this pool, starting at `initial` workers."""
        scaling = self._autoscale
        return PoolConfig(
            name=self._name,
            capacity=self._initial,
            min=self._min,
            max=self._max,
            lease_ttl=self._lease_ttl,
            retry=DEFAULT_RETRY if self._retry is None else self._retry,
            default_duration=self._default_duration,
            max_pending=self._max_pending,
            overflow=self._overflow,
            unknown_dependency=self._unknown_dependency,
            await_timeout=self._await_timeout,
            reservable_fraction=self._reservable_fraction,
            # Weights alone switch fair sharing on (docs/overflow-and-fairness.md,
            # "Tenants and fair share").
            fair_share=self._fair_share or bool(self._tenant_weights),
            tenant_weights=dict(self._tenant_weights),
            cost_per_worker_second=0.0 if scaling is None else scaling.cost_per_worker_second,
            autoscale=None if scaling is None else scaling.core_settings(),
        )

    def __repr__(self) -> str:
        return (
            f"Pool({_quote(self._name)}, min={self._min}, max={self._max}, "
            f"initial={self._initial}, autoscale={self._autoscale is not None})"
        )


def _await_timeout(value: object) -> float | None:
    if value is None:
        return None
    seconds = check_number("await_timeout", value)
    if math.isnan(seconds):
        raise ValueError(f"await_timeout must be a number of seconds (got {value!r})")
    return None if seconds == math.inf else max(seconds, 0.0)


def _weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    if weights is None:
        return {}
    if not isinstance(weights, Mapping):
        raise TypeError(f"tenant_weights must be a mapping of tenant to weight (got {weights!r})")
    out: dict[str, float] = {}
    for tenant, weight in weights.items():
        if not isinstance(tenant, str):
            raise TypeError(f"tenant_weights keys must be str (got {tenant!r})")
        value = check_number(f"tenant_weights[{tenant!r}]", weight)
        if not (math.isfinite(value) and value > 0.0):
            raise ValueError("tenant weights must be finite and > 0")
        out[tenant] = value
    return out


# --- resources ---------------------------------------------------------------------------------


class Resource:
    """A semaphore or token bucket shared by every pool; build it with the two classmethods."""

    __slots__ = ("_burst", "_kind", "_name", "_permits", "_rate")

    _name: str
    _kind: str
    _permits: int | None
    _rate: float | None
    _burst: int | None

    def __init__(self) -> None:
        raise TypeError("use Resource.semaphore() or Resource.token_bucket()")

    @classmethod
    def _make(
        cls, name: str, kind: str, permits: int | None, rate: float | None, burst: int | None
    ) -> Resource:
        self = cls.__new__(cls)
        self._name = name
        self._kind = kind
        self._permits = permits
        self._rate = rate
        self._burst = burst
        return self

    @classmethod
    def semaphore(cls, name: str, permits: int) -> Resource:
        """At most `permits` units held at once; taken at dispatch, returned when it ends."""
        _check_resource_name(name)
        if _count("permits", permits) < 1:
            raise ValueError("permits must be >= 1")
        return cls._make(name, "semaphore", permits, None, None)

    @classmethod
    def token_bucket(cls, name: str, rate: float, burst: int) -> Resource:
        """Starts with `burst` tokens and refills at `rate` per second up to `burst`."""
        _check_resource_name(name)
        per_second = check_number("rate", rate)
        if not (math.isfinite(per_second) and per_second > 0.0):
            raise ValueError(f"rate must be a finite number > 0 (got {_shown(per_second)})")
        if _count("burst", burst) < 1:
            raise ValueError("burst must be >= 1")
        return cls._make(name, "token_bucket", None, per_second, burst)

    @property
    def name(self) -> str:
        return self._name

    @property
    def kind(self) -> str:
        """ "semaphore" or "token_bucket"."""
        return self._kind

    @property
    def permits(self) -> int | None:
        """Semaphore permits; None for a token bucket."""
        return self._permits

    @property
    def rate(self) -> float | None:
        """Token bucket refill per second; None for a semaphore."""
        return self._rate

    @property
    def burst(self) -> int | None:
        """Token bucket size; None for a semaphore."""
        return self._burst

    def core_config(self) -> ResourceConfig:
        """The engine's view of this resource."""
        return ResourceConfig(
            self._name,
            self._kind,
            permits=self._permits or 0,
            rate=self._rate or 0.0,
            burst=self._burst or 0,
        )

    def __repr__(self) -> str:
        if self._kind == "semaphore":
            kind = f"Semaphore {{ permits: {self._permits} }}"
        else:
            kind = f"TokenBucket {{ rate: {self._rate!r}, burst: {self._burst} }}"
        return f"Resource(ResourceConfig {{ name: {_quote(self._name)}, kind: {kind} }})"


def _check_resource_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(f"resource name must be a str (got {name!r})")
    if "\0" in name:
        raise ValueError(f"resource name must not contain NUL characters (got {name!r})")


# --- dependencies ------------------------------------------------------------------------------


class Dep:
    """An edge to a task (id or key) that must end as `on` before this task may start."""

    __slots__ = ("_on", "_target")

    def __init__(self, target: int | str, on: DepCondition = "success") -> None:
        self._target = _target("Dep target", target)
        condition = DEP_CONDITIONS.get(on) if isinstance(on, str) else None
        if condition is None:
            raise ValueError("on must be 'success', 'failure' or 'complete'")
        self._on = condition

    @property
    def target(self) -> int | str:
        return self._target

    @property
    def on(self) -> DepOn:
        """'success', 'failure' or 'complete' (aliases are normalised)."""
        return self._on

    def __repr__(self) -> str:
        target = self._target
        shown = f"Key({_quote(target)})" if isinstance(target, str) else f"Id({target})"
        return f"Dep({shown}, on={_DEP_ON_REPR[self._on]})"


# --- tasks -------------------------------------------------------------------------------------


class RecurringOptions(TypedDict, total=False):
    """The submit() options a recurring schedule's template may carry (no dependencies, fixed
    start or deadline_at): what `Scheduler.add_recurring` takes besides its own arguments."""

    priority: Priority | int | PriorityName | None
    pool: str | None
    kind: str
    key: str | None
    duration_hint: float | None
    timeout: float | None
    retry: RetryPolicy | None
    resources: Mapping[str, int] | None
    tags: Mapping[str, object] | None
    labels: Mapping[str, str] | None
    tenant: str | None


class SubmitOptions(RecurringOptions, total=False):
    """The options of `Scheduler.submit`, `enqueue` and `Task` (docs/library.md), for a type
    checker: a misspelled name or a value outside a vocabulary (`priority="urgent"`) is its
    error. At run time build_task checks them (docs/reference/errors.md)."""

    deadline_in: float | None
    deadline_at: float | datetime | None
    start_in: float | None
    start_at: float | datetime | None
    tolerance: float | None
    on_miss: MissPolicy | None
    after: int | str | Sequence[int | str] | None
    deps: Sequence[Dep] | None


class Task:
    """A task for submit_batch: the payload and the submit() options exactly as given.

    The options are those of Scheduler.submit(); unknown names raise TypeError here, values are
    checked by build_task when the batch is submitted, exactly like submit() checks them.
    """

    __slots__ = ("options", "payload")

    def __init__(self, payload: Any, **options: Unpack[SubmitOptions]) -> None:
        if options and not options.keys() <= TASK_OPTIONS:
            unknown = sorted(options.keys() - TASK_OPTIONS)
            raise TypeError(f"Task() got unexpected option(s): {', '.join(unknown)}")
        self.payload = payload
        self.options = options

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"Task({self.payload!r}{options})"


ROUTING = frozenset({"kind", "pool"})


def routed_task(
    payload: Any,
    pools: Mapping[str, PoolConfig],
    default_pool: str,
    kind: str,
    pool: str | None,
) -> TaskRecord:
    """`build_task` for a task given only a kind and a pool (every submit of a task function):
    the same checks, without looking at the twenty other options."""
    kind = kind if kind == "default" else _name("kind", kind)
    return TaskRecord(payload, _pool(pools, default_pool, pool), kind=kind)


def _pool(pools: Mapping[str, PoolConfig], default_pool: str, pool: object) -> str:
    if pool is None:
        return default_pool
    if pool.__class__ is not str or pool not in pools:
        pool = _name("pool", pool)
        if pool not in pools:
            raise SubmitError("unknown_pool", f"unknown pool '{pool}'")
    return pool


def build_task(
    payload: Any,
    *,
    pools: Mapping[str, PoolConfig],
    default_pool: str,
    now: float,
    priority: Priority | int | str | None = None,
    pool: str | None = None,
    kind: str = "default",
    key: str | None = None,
    deadline_in: float | None = None,
    deadline_at: float | datetime | None = None,
    start_in: float | None = None,
    start_at: float | datetime | None = None,
    tolerance: float | None = None,
    on_miss: str | None = None,
    duration_hint: float | None = None,
    timeout: float | None = None,
    retry: RetryPolicy | None = None,
    after: int | str | Sequence[int | str] | None = None,
    deps: Sequence[Dep] | None = None,
    resources: Mapping[str, int] | None = None,
    tags: Mapping[str, object] | None = None,
    labels: Mapping[str, str] | None = None,
    tenant: str | None = None,
) -> TaskRecord:
    """Check submit() options and build the core record; `now` is Unix seconds.

    Raises the exception types and messages of docs/reference/errors.md, "Argument errors" and
    "Submission errors". Resource names and dependency
    targets are only checked for shape here; whether they exist is the scheduler's business.
    """
    cls = 2 if priority is None else parse_priority(priority)
    pool = _pool(pools, default_pool, pool)
    if kind != "default":
        kind = _name("kind", kind)
    if key is not None:
        _name("key", key)
    if tenant is not None:
        _name("tenant", tenant)

    deadline = None
    if deadline_in is not None:
        if deadline_at is not None:
            raise ValueError("use either deadline_in or deadline_at")
        deadline = now + check_seconds("deadline_in", deadline_in)
    elif deadline_at is not None:
        deadline = check_instant("deadline_at", deadline_at)
    if duration_hint is not None:
        duration_hint = check_seconds("duration_hint", duration_hint)
    if timeout is not None:
        timeout = check_seconds("timeout", timeout)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy (got {retry!r})")

    extra = None
    if (
        start_in is not None
        or start_at is not None
        or tolerance is not None
        or on_miss is not None
        or after is not None
        or deps is not None
        or resources is not None
    ):
        extra = _extra(now, start_in, start_at, tolerance, on_miss, after, deps, resources)

    return TaskRecord(
        payload,
        pool,
        cls,
        kind,
        key,
        tenant,
        deadline,
        duration_hint,
        timeout,
        retry,
        None if tags is None else _tags(tags),
        None if labels is None else _labels(labels),
        extra,
    )


def _extra(
    now: float,
    start_in: object,
    start_at: object,
    tolerance: object,
    on_miss: object,
    after: object,
    deps: object,
    resources: object,
) -> Extras | None:
    """The rarely used options, kept in TaskRecord.extra (None when none applies)."""
    extra = Extras()

    start = None
    if start_in is not None:
        if start_at is not None:
            raise ValueError("use either start_in or start_at")
        start = now + check_seconds("start_in", start_in)
    elif start_at is not None:
        start = check_instant("start_at", start_at)
    # Checked even without a fixed start (where they are ignored), as the published package does.
    slack = 1.0 if tolerance is None else check_seconds("tolerance", tolerance)
    miss = "run_late" if on_miss is None else on_miss
    if miss not in MISS_POLICIES:
        raise ValueError("on_miss must be 'run_late', 'skip' or 'fail'")
    if start is not None:
        extra.start_at, extra.tolerance, extra.on_miss = start, slack, miss

    edges: list[tuple[int | str, str]] = []
    if after is not None:
        targets = after if isinstance(after, (list, tuple)) else (after,)
        edges.extend((_target("after", target), "success") for target in targets)
    if deps is not None:
        if not isinstance(deps, (list, tuple)):
            raise TypeError(f"deps must be a list of Dep (got {deps!r})")
        for dep in deps:
            if not isinstance(dep, Dep):
                raise TypeError(f"deps must be a list of Dep (got an item {dep!r})")
            edges.append((dep.target, dep.on))
    if edges:
        extra.deps = edges

    if resources is not None:
        amounts = _amounts(resources)
        if amounts:
            extra.resources = amounts
    return None if extra.is_empty() else extra


def _amounts(resources: object) -> dict[str, int]:
    if not isinstance(resources, Mapping):
        raise TypeError(
            f"resources must be a mapping of resource name to amount (got {resources!r})"
        )
    amounts: dict[str, int] = {}
    for name, amount in resources.items():
        if not isinstance(name, str):
            raise TypeError(f"resource names must be str (got {name!r})")
        if _count(f"resources[{name!r}]", amount) == 0:
            raise SubmitError("invalid", "invalid task: resource amount must be > 0")
        amounts[name] = amount
    return amounts


def _tags(tags: object) -> dict[str, str] | None:
    """Tags are free-form: values are stringified (ctx.tags is always str -> str)."""
    if not isinstance(tags, Mapping):
        raise TypeError(f"tags must be a mapping (got {tags!r})")
    out: dict[str, str] = {}
    for name, value in tags.items():
        if not isinstance(name, str):
            raise TypeError(f"tag names must be str (got {name!r})")
        out[name] = value if value.__class__ is str else str(value)
    return out or None


def _labels(labels: object) -> dict[str, str] | None:
    """Labels are matched against worker groups, so unlike tags they must already be str."""
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of str to str (got {labels!r})")
    for name, value in labels.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"labels must map str to str (got {name!r}: {value!r})")
    return dict(labels) or None


# The submit() options: the keyword arguments of build_task that a caller supplies.
TASK_OPTIONS = frozenset(inspect.signature(build_task).parameters) - {
    "payload",
    "pools",
    "default_pool",
    "now",
}
