"""cronoq._options: Pool, AutoscaleConfig, Resource, Dep, Task and build_task validation.

Covers docs/reference/errors.md, "Argument errors", docs/dependencies.md, docs/resources.md,
docs/groups.md, docs/overflow-and-fairness.md and docs/autoscaling.md, "Settings".
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from typing import Any

import pytest

from cronoq._options import AutoscaleConfig, Dep, Pool, Resource, Task, build_task
from cronoq.core.model import DEFAULT_RETRY, PoolConfig, Priority, RetryPolicy, TaskRecord
from cronoq.errors import SubmitError

NOW = 1_700_000_000.0
POOLS = {"default": PoolConfig("default"), "gpu": PoolConfig("gpu")}
NUL_MESSAGE = "invalid task: kind, pool, key and tenant must not contain NUL characters"


def run(ctx: Any, payload: Any) -> Any:
    return payload


async def arun(ctx: Any, payload: Any) -> Any:
    return payload


def kw(arg: str, value: object) -> dict[str, Any]:
    """One keyword argument chosen by a test parameter."""
    return {arg: value}


def build(payload: Any = "p", **options: Any) -> TaskRecord:
    return build_task(payload, pools=POOLS, default_pool="default", now=NOW, **options)


# --- Pool ------------------------------------------------------------------------------------


def test_pool_defaults_and_repr() -> None:
    p = Pool("p", run)
    assert repr(p) == 'Pool("p", min=1, max=10, initial=1, autoscale=True)'
    assert (p.name, p.executor, p.min, p.max, p.initial) == ("p", run, 1, 10, 1)
    assert isinstance(p.autoscale, AutoscaleConfig)
    assert p.lease_ttl is None
    assert p.max_pending is None
    assert p.overflow == "wait"
    assert p.retry is None
    assert p.unknown_dependency == "reject"
    assert p.await_timeout is None
    assert p.default_duration == 1.0
    assert p.reservable_fraction == 0.5
    assert p.tenant_weights == {}
    assert p.fair_share is False


def test_pool_fixed_without_initial_uses_max() -> None:
    p = Pool("p", run, autoscale=False)
    assert (p.min, p.initial, p.max) == (10, 10, 10)
    assert p.autoscale is None
    assert repr(p) == 'Pool("p", min=10, max=10, initial=10, autoscale=False)'


def test_pool_fixed_with_initial() -> None:
    p = Pool("p", run, initial=4, autoscale=False)
    assert (p.min, p.initial, p.max) == (4, 4, 4)
    assert p.core_config().capacity == 4


def test_pool_autoscale_true_and_instance() -> None:
    assert isinstance(Pool("p", run, autoscale=True).autoscale, AutoscaleConfig)
    cfg = AutoscaleConfig(interval=2.0)
    assert Pool("p", run, autoscale=cfg).autoscale is cfg


def test_pool_autoscale_wrong_type() -> None:
    with pytest.raises(TypeError, match="autoscale"):
        Pool("p", run, autoscale="yes")  # type: ignore[arg-type]


def test_pool_min_above_max() -> None:
    with pytest.raises(ValueError, match=r"^min must be <= max$"):
        Pool("p", run, min=5, max=2)


def test_pool_max_zero() -> None:
    with pytest.raises(ValueError, match=r"^max must be >= 1$"):
        Pool("p", run, max=0)


def test_pool_executor_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"^executor must be callable$"):
        Pool("p", 5)  # type: ignore[arg-type]


@pytest.mark.parametrize("arg", ["min", "max", "initial", "max_pending"])
def test_pool_negative_counts_overflow(arg: str) -> None:
    with pytest.raises(OverflowError, match=arg):
        Pool("p", run, **kw(arg, -1))


@pytest.mark.parametrize("arg", ["min", "max", "initial", "max_pending"])
def test_pool_counts_must_be_ints(arg: str) -> None:
    with pytest.raises(TypeError, match=arg):
        Pool("p", run, **kw(arg, 2.5))


@pytest.mark.parametrize(
    ("options", "initial"),
    [({}, 1), ({"initial": 20}, 10), ({"min": 3, "initial": 1}, 3), ({"min": 0}, 0)],
)
def test_pool_initial_defaults_to_min_and_is_clamped(options: dict[str, Any], initial: int) -> None:
    assert Pool("p", run, **options).initial == initial


def test_pool_max_pending_zero_accepted() -> None:
    assert Pool("p", run, max_pending=0).max_pending == 0


@pytest.mark.parametrize("ttl", [0, -1, 0.0])
def test_pool_lease_ttl_must_be_positive(ttl: float) -> None:
    with pytest.raises(ValueError, match=r"^lease_ttl must be > 0$"):
        Pool("p", run, lease_ttl=ttl)


def test_pool_lease_ttl_rejects_nan_and_inf() -> None:
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="lease_ttl"):
            Pool("p", run, lease_ttl=bad)
    assert Pool("p", run, lease_ttl=0.3).lease_ttl == 0.3


def test_pool_overflow_values() -> None:
    for value in ("wait", "reject", "shed_lowest", "shed_oldest"):
        assert Pool("p", run, overflow=value).overflow == value
    with pytest.raises(
        ValueError, match=r"^overflow must be wait, reject, shed_lowest or shed_oldest$"
    ):
        Pool("p", run, overflow="drop")


def test_pool_unknown_dependency_values() -> None:
    assert Pool("p", run, unknown_dependency="await").unknown_dependency == "await"
    with pytest.raises(ValueError, match=r"^unknown_dependency must be 'reject' or 'await'$"):
        Pool("p", run, unknown_dependency="ignore")


def test_pool_reservable_fraction() -> None:
    with pytest.raises(ValueError) as info:
        Pool("p", run, reservable_fraction=1.5)
    assert str(info.value) == "reservable_fraction must be in [0, 1] (got 1.5)"
    with pytest.raises(ValueError, match="reservable_fraction"):
        Pool("p", run, reservable_fraction=math.nan)
    assert Pool("p", run, reservable_fraction=0.0).reservable_fraction == 0.0
    assert Pool("p", run, reservable_fraction=1).reservable_fraction == 1.0


def test_pool_default_duration() -> None:
    assert Pool("p", run, default_duration=0).default_duration == 0.0
    with pytest.raises(ValueError, match=r"^default_duration must be a finite, non-negative"):
        Pool("p", run, default_duration=-1)


@pytest.mark.parametrize("weight", [0, -1, math.inf, math.nan])
def test_pool_tenant_weights_must_be_finite_positive(weight: float) -> None:
    with pytest.raises(ValueError, match=r"^tenant weights must be finite and > 0$"):
        Pool("p", run, tenant_weights={"a": weight})


def test_pool_tenant_weights_kept_as_floats_and_copied() -> None:
    p = Pool("p", run, tenant_weights={"a": 3, "b": 1})
    assert p.tenant_weights == {"a": 3.0, "b": 1.0}
    p.tenant_weights["a"] = 99.0
    assert p.tenant_weights["a"] == 3.0
    with pytest.raises(TypeError):
        Pool("p", run, tenant_weights={1: 1.0})  # type: ignore[dict-item]


def test_pool_retry_must_be_a_policy() -> None:
    policy = RetryPolicy(max_attempts=5)
    assert Pool("p", run, retry=policy).retry is policy
    with pytest.raises(TypeError, match="retry"):
        Pool("p", run, retry=3)  # type: ignore[arg-type]


def test_pool_await_timeout() -> None:
    assert Pool("p", run, await_timeout=0.5).await_timeout == 0.5
    assert Pool("p", run, await_timeout=-1).await_timeout == 0.0  # accepted: times out at once
    assert Pool("p", run, await_timeout=math.inf).await_timeout is None
    with pytest.raises(ValueError, match="await_timeout"):
        Pool("p", run, await_timeout=math.nan)


def test_pool_name_checks() -> None:
    with pytest.raises(TypeError, match="pool name"):
        Pool(5, run)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        Pool("a\0b", run)


def test_pool_attributes_are_read_only() -> None:
    p = Pool("p", run)
    with pytest.raises(AttributeError):
        p.max = 3  # type: ignore[misc]


class AsyncCallable:
    async def __call__(self, ctx: Any, payload: Any) -> Any:
        return payload


class SyncCallable:
    def __call__(self, ctx: Any, payload: Any) -> Any:
        return payload


class Worker:
    async def handle(self, ctx: Any, payload: Any) -> Any:
        return payload


@pytest.mark.parametrize(
    ("executor", "expected"),
    [
        (arun, True),
        (run, False),
        (functools.partial(arun), True),
        (functools.partial(functools.partial(arun)), True),
        (AsyncCallable(), True),
        (functools.partial(AsyncCallable()), True),
        (SyncCallable(), False),
        (Worker().handle, True),
        (AsyncCallable, False),  # calling the class builds an instance
        (print, False),
    ],
)
def test_pool_is_async(executor: Any, expected: bool) -> None:
    assert Pool("p", executor).is_async is expected


def test_pool_core_config() -> None:
    policy = RetryPolicy(max_attempts=2)
    p = Pool(
        "p",
        run,
        min=2,
        max=8,
        initial=3,
        autoscale=AutoscaleConfig(cost_per_worker_second=2.0),
        lease_ttl=1.5,
        max_pending=7,
        overflow="reject",
        retry=policy,
        unknown_dependency="await",
        await_timeout=0.5,
        default_duration=3.0,
        reservable_fraction=0.25,
        tenant_weights={"a": 3},
    )
    c = p.core_config()
    assert isinstance(c, PoolConfig)
    assert (c.name, c.capacity, c.min, c.max) == ("p", 3, 2, 8)
    assert (c.lease_ttl, c.retry, c.default_duration) == (1.5, policy, 3.0)
    assert (c.max_pending, c.overflow, c.unknown_dependency) == (7, "reject", "await")
    assert (c.await_timeout, c.reservable_fraction) == (0.5, 0.25)
    assert c.tenant_weights == {"a": 3.0}
    assert c.fair_share is True  # weights alone switch fair sharing on
    assert c.cost_per_worker_second == 2.0


def test_pool_core_config_defaults() -> None:
    c = Pool("p", run, autoscale=False, max=4).core_config()
    assert c.retry is DEFAULT_RETRY
    assert c.fair_share is False
    assert c.cost_per_worker_second == 0.0
    assert c.capacity == 4
    assert Pool("p", run, fair_share=True).core_config().fair_share is True


# --- AutoscaleConfig -------------------------------------------------------------------------


def test_autoscale_defaults() -> None:
    a = AutoscaleConfig()
    assert a.interval == 1.0
    assert a.target_utilization == 0.75
    assert a.drain_time == 30.0
    assert a.reservation_horizon == 60.0
    assert a.stabilization_window == 60.0
    assert a.cooldown == 30.0
    assert a.max_step_up_abs == 4
    assert a.max_step_down == 1
    assert a.cost_per_worker_second == 0.0
    assert a.slo == {}


@pytest.mark.parametrize("value", [0, -0.5, 1.5, math.nan])
def test_autoscale_target_utilization_range(value: float) -> None:
    with pytest.raises(ValueError, match=r"^target_utilization must be in \(0, 1\]"):
        AutoscaleConfig(target_utilization=value)


def test_autoscale_target_utilization_one_accepted() -> None:
    assert AutoscaleConfig(target_utilization=1).target_utilization == 1.0


@pytest.mark.parametrize("value", [0, -1])
def test_autoscale_interval_positive(value: float) -> None:
    with pytest.raises(ValueError, match=r"^interval must be > 0$"):
        AutoscaleConfig(interval=value)


def test_autoscale_slo_normalised() -> None:
    a = AutoscaleConfig(slo={"high": 2, Priority.LOW: 30, 0: 1})
    assert a.slo == {"critical": 1.0, "high": 2.0, "low": 30.0}
    assert list(a.slo) == ["critical", "high", "low"]


def test_autoscale_slo_errors() -> None:
    with pytest.raises(ValueError, match=r"^unknown priority 'urgent'$"):
        AutoscaleConfig(slo={"urgent": 1})
    with pytest.raises(ValueError, match=r"0\.\.=3"):
        AutoscaleConfig(slo={4: 1})
    with pytest.raises(ValueError, match="finite, non-negative"):
        AutoscaleConfig(slo={"high": -1})
    with pytest.raises(TypeError):
        AutoscaleConfig(slo={None: 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        AutoscaleConfig(slo=[1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "arg", ["drain_time", "reservation_horizon", "stabilization_window", "cooldown"]
)
def test_autoscale_durations(arg: str) -> None:
    with pytest.raises(ValueError, match=f"^{arg} must be a finite, non-negative"):
        AutoscaleConfig(**kw(arg, -1))
    assert getattr(AutoscaleConfig(**kw(arg, 0)), arg) == 0.0


def test_autoscale_steps_and_cost() -> None:
    with pytest.raises(OverflowError, match="max_step_down"):
        AutoscaleConfig(max_step_down=-1)
    with pytest.raises(OverflowError, match="max_step_up_abs"):
        AutoscaleConfig(max_step_up_abs=-1)
    with pytest.raises(ValueError, match="cost_per_worker_second"):
        AutoscaleConfig(cost_per_worker_second=-1)
    with pytest.raises(ValueError, match="cost_per_worker_second"):
        AutoscaleConfig(cost_per_worker_second=math.inf)


def test_autoscale_repr() -> None:
    text = repr(AutoscaleConfig(slo={"high": 2}))
    assert text.startswith("AutoscaleConfig(interval=1.0, target_utilization=0.75, ")
    assert "slo={'high': 2.0}" in text
    assert text.endswith("max_step_down=1, cost_per_worker_second=0.0)")


# --- Resource --------------------------------------------------------------------------------


def test_semaphore() -> None:
    r = Resource.semaphore("s", 2)
    assert (r.name, r.kind, r.permits, r.rate, r.burst) == ("s", "semaphore", 2, None, None)
    assert repr(r) == 'Resource(ResourceConfig { name: "s", kind: Semaphore { permits: 2 } })'


def test_token_bucket() -> None:
    r = Resource.token_bucket("t", 5, 3)
    assert (r.name, r.kind, r.permits, r.rate, r.burst) == ("t", "token_bucket", None, 5.0, 3)
    assert repr(r) == (
        'Resource(ResourceConfig { name: "t", kind: TokenBucket { rate: 5.0, burst: 3 } })'
    )


def test_semaphore_permits() -> None:
    with pytest.raises(ValueError, match=r"^permits must be >= 1$"):
        Resource.semaphore("s", 0)
    with pytest.raises(OverflowError):
        Resource.semaphore("s", -1)


@pytest.mark.parametrize("rate", [0, 0.0])
def test_token_bucket_rate_zero(rate: float) -> None:
    with pytest.raises(ValueError) as info:
        Resource.token_bucket("t", rate, 3)
    assert str(info.value) == "rate must be a finite number > 0 (got 0)"


@pytest.mark.parametrize("rate", [-1, math.inf, math.nan])
def test_token_bucket_rate_finite_positive(rate: float) -> None:
    with pytest.raises(ValueError, match=r"^rate must be a finite number > 0"):
        Resource.token_bucket("t", rate, 3)


def test_token_bucket_burst() -> None:
    with pytest.raises(ValueError, match=r"^burst must be >= 1$"):
        Resource.token_bucket("t", 1.0, 0)
    with pytest.raises(OverflowError):
        Resource.token_bucket("t", 1.0, -1)


def test_resource_names() -> None:
    with pytest.raises(ValueError, match="NUL"):
        Resource.semaphore("a\0", 1)
    with pytest.raises(TypeError):
        Resource.token_bucket(1, 1.0, 1)  # type: ignore[arg-type]


def test_resource_cannot_be_constructed_directly() -> None:
    with pytest.raises(TypeError, match="semaphore"):
        Resource()


# --- Dep -------------------------------------------------------------------------------------


def test_dep_default_and_repr() -> None:
    d = Dep("a")
    assert (d.target, d.on) == ("a", "success")
    assert repr(d) == 'Dep(Key("a"), on=OnSuccess)'
    assert repr(Dep(5, on="failure")) == "Dep(Id(5), on=OnFailure)"
    assert repr(Dep(5, on="complete")) == "Dep(Id(5), on=OnComplete)"


@pytest.mark.parametrize(
    ("on", "normalised"),
    [
        ("success", "success"),
        ("failure", "failure"),
        ("complete", "complete"),
        ("on_success", "success"),
        ("on_failure", "failure"),
        ("on_complete", "complete"),
    ],
)
def test_dep_on_aliases(on: str, normalised: str) -> None:
    assert Dep(1, on=on).on == normalised


@pytest.mark.parametrize("on", ["done", "SUCCESS", 1])
def test_dep_bad_on(on: Any) -> None:
    with pytest.raises(ValueError, match=r"^on must be 'success', 'failure' or 'complete'$"):
        Dep("a", on=on)


def test_dep_targets() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        Dep(0)
    with pytest.raises(OverflowError):
        Dep(-1)
    for bad in (True, 1.0, None):
        with pytest.raises(TypeError):
            Dep(bad)  # type: ignore[arg-type]


# --- Task ------------------------------------------------------------------------------------


def test_task_holds_the_options_as_given() -> None:
    t = Task({"x": 1}, priority="high", key="k", tags=None)
    assert t.payload == {"x": 1}
    assert t.options == {"priority": "high", "key": "k", "tags": None}
    assert Task(1).options == {}


def test_task_keeps_a_non_default_kind() -> None:
    assert Task(1, kind="email").options == {"kind": "email"}
    # kind=None is an error for submit(), so the batch path must see it too.
    assert Task(1, kind=None).options == {"kind": None}
    with pytest.raises(TypeError, match="kind"):
        build(1, **Task(1, kind=None).options)


def test_task_rejects_unknown_options() -> None:
    with pytest.raises(TypeError, match="priorty"):
        Task(1, priorty="high")


def test_task_options_feed_build_task() -> None:
    t = Task("x", pool="gpu", key="k", after=["a"], start_in=5)
    rec = build(t.payload, **t.options)
    assert (rec.payload, rec.pool, rec.key) == ("x", "gpu", "k")
    assert rec.extra.spec() == {
        "deps": [("a", "success")],
        "start_at": NOW + 5,
        "tolerance": 1.0,
        "on_miss": "run_late",
    }


def test_task_repr() -> None:
    assert repr(Task("x", key="k")) == "Task('x', key='k')"


# --- build_task: defaults and names ----------------------------------------------------------


def test_build_plain_task() -> None:
    payload = object()
    rec = build(payload)
    assert rec.payload is payload
    assert (rec.pool, rec.cls, rec.kind, rec.key, rec.tenant) == (
        "default",
        2,
        "default",
        None,
        None,
    )
    assert (rec.deadline, rec.duration_hint, rec.timeout, rec.retry) == (None, None, None, None)
    assert (rec.tags, rec.labels, rec.extra) == (None, None, None)


@pytest.mark.parametrize(
    ("priority", "cls"),
    [(None, 2), ("HIGH", 1), ("critical", 0), (3, 3), (Priority.HIGH, 1), ("Low", 3)],
)
def test_build_priority(priority: Any, cls: int) -> None:
    rec = build(priority=priority)
    assert rec.cls == cls
    assert type(rec.cls) is int


def test_build_priority_errors() -> None:
    with pytest.raises(ValueError, match=r"^priority must be 0..=3$"):
        build(priority=4)
    for bad in (1.0, -1, True):
        with pytest.raises(TypeError, match=r"^priority must be a Priority, int or str$"):
            build(priority=bad)
    with pytest.raises(ValueError, match=r"^unknown priority 'urgent'$"):
        build(priority="urgent")


def test_build_pool() -> None:
    assert build(pool="gpu").pool == "gpu"
    assert build(pool="default").pool == "default"
    with pytest.raises(SubmitError) as info:
        build(pool="nope")
    assert info.value.code == "unknown_pool"
    assert str(info.value) == "unknown pool 'nope'"
    with pytest.raises(TypeError, match="pool"):
        build(pool=3)


@pytest.mark.parametrize("arg", ["pool", "kind", "key", "tenant"])
def test_build_nul_in_names(arg: str) -> None:
    with pytest.raises(SubmitError) as info:
        build(**{arg: "a\0b"})
    assert info.value.code == "invalid"
    assert str(info.value) == NUL_MESSAGE


@pytest.mark.parametrize("arg", ["kind", "key", "tenant"])
def test_build_names_must_be_str(arg: str) -> None:
    with pytest.raises(TypeError, match=f"^{arg} must be a str"):
        build(**{arg: 5})


def test_build_names_kept() -> None:
    rec = build(kind="email", key="k1", tenant="acme")
    assert (rec.kind, rec.key, rec.tenant) == ("email", "k1", "acme")


# --- build_task: times -----------------------------------------------------------------------


def test_build_deadline_in() -> None:
    assert build(deadline_in=2).deadline == NOW + 2


def test_build_deadline_at() -> None:
    assert build(deadline_at=NOW - 100).deadline == NOW - 100  # past deadlines are accepted
    aware = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert build(deadline_at=aware).deadline == aware.timestamp()
    naive = datetime(2030, 1, 2, 3, 4, 5)
    assert build(deadline_at=naive).deadline == naive.timestamp()  # local time


def test_build_deadline_both() -> None:
    with pytest.raises(ValueError, match=r"^use either deadline_in or deadline_at$"):
        build(deadline_in=1, deadline_at=NOW + 5)


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf])
def test_build_deadline_in_bad(bad: float) -> None:
    with pytest.raises(ValueError) as info:
        build(deadline_in=bad)
    assert str(info.value) == (
        f"deadline_in must be a finite, non-negative number of seconds (got {bad!r})"
    )


def test_build_absolute_time_errors() -> None:
    with pytest.raises(ValueError, match="deadline_at"):
        build(deadline_at=math.nan)
    with pytest.raises(TypeError, match="start_at"):
        build(start_at="tomorrow")


@pytest.mark.parametrize("arg", ["duration_hint", "timeout", "start_in", "tolerance"])
@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf])
def test_build_durations_rejected(arg: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"^{arg} must be a finite, non-negative number"):
        build(**{arg: bad})


def test_build_duration_hint_and_timeout() -> None:
    rec = build(duration_hint=2, timeout=0)
    assert rec.duration_hint == 2.0
    assert rec.timeout == 0.0  # 0 is a real timeout, not "none"
    assert type(rec.duration_hint) is float


def test_build_fixed_start() -> None:
    assert build(start_in=3).extra.spec() == {
        "start_at": NOW + 3,
        "tolerance": 1.0,
        "on_miss": "run_late",
    }
    when = datetime(2030, 1, 1, tzinfo=UTC)
    rec = build(start_at=when, tolerance=0, on_miss="skip")
    assert rec.extra.spec() == {"start_at": when.timestamp(), "tolerance": 0.0, "on_miss": "skip"}
    assert build(start_at=NOW - 50, on_miss="fail").extra.spec() == {
        "start_at": NOW - 50,
        "tolerance": 1.0,
        "on_miss": "fail",
    }


def test_build_start_both() -> None:
    with pytest.raises(ValueError, match=r"^use either start_in or start_at$"):
        build(start_in=1, start_at=NOW + 1)


def test_build_on_miss_values() -> None:
    with pytest.raises(ValueError, match=r"^on_miss must be 'run_late', 'skip' or 'fail'$"):
        build(start_in=1, on_miss="retry")


def test_build_tolerance_and_on_miss_without_fixed_start() -> None:
    assert build(tolerance=2, on_miss="skip").extra is None  # accepted and ignored
    with pytest.raises(ValueError, match=r"^on_miss must be"):
        build(on_miss="never")
    with pytest.raises(ValueError, match=r"^tolerance must be"):
        build(tolerance=-1)


# --- build_task: retry, tags, labels ---------------------------------------------------------


def test_build_retry() -> None:
    policy = RetryPolicy.none()
    assert build(retry=policy).retry is policy
    with pytest.raises(TypeError, match="retry"):
        build(retry={"max_attempts": 1})


def test_build_tags_stringified() -> None:
    assert build(tags={"n": 1, "s": "x", "f": 1.5}).tags == {"n": "1", "s": "x", "f": "1.5"}
    assert build(tags={}).tags is None
    with pytest.raises(TypeError, match="tag"):
        build(tags={1: "x"})
    with pytest.raises(TypeError, match="tags"):
        build(tags=["a"])


def test_build_labels() -> None:
    labels = {"gpu": "a100"}
    rec = build(labels=labels)
    assert rec.labels == labels
    assert rec.labels is not labels  # the caller may mutate its dict later
    assert build(labels={}).labels is None
    with pytest.raises(TypeError, match="labels"):
        build(labels={"a": 1})
    with pytest.raises(TypeError, match="labels"):
        build(labels={1: "a"})
    with pytest.raises(TypeError, match="labels"):
        build(labels="gpu")


# --- build_task: resources -------------------------------------------------------------------


def test_build_resources() -> None:
    rec = build(resources={"sem": 2, "anything": 1})  # names are the scheduler's to check
    assert rec.extra.spec() == {"resources": {"sem": 2, "anything": 1}}
    assert build(resources={}).extra is None


def test_build_resource_amount_zero() -> None:
    with pytest.raises(SubmitError) as info:
        build(resources={"sem": 0})
    assert info.value.code == "invalid"
    assert str(info.value) == "invalid task: resource amount must be > 0"


def test_build_resource_amount_negative_and_types() -> None:
    with pytest.raises(OverflowError):
        build(resources={"sem": -1})
    with pytest.raises(TypeError):
        build(resources={"sem": 1.5})
    with pytest.raises(TypeError):
        build(resources={1: 1})
    with pytest.raises(TypeError):
        build(resources=["sem"])


# --- build_task: dependencies ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "edges"),
    [
        ("a", [("a", "success")]),
        (5, [(5, "success")]),
        (["a", 3], [("a", "success"), (3, "success")]),
        (("a",), [("a", "success")]),
    ],
)
def test_build_after(after: Any, edges: list[tuple[Any, str]]) -> None:
    assert build(after=after).extra.spec() == {"deps": edges}


def test_build_after_empty_list() -> None:
    assert build(after=[]).extra is None


def test_build_after_bad_items() -> None:
    with pytest.raises(TypeError, match="after"):
        build(after=[1.5])
    with pytest.raises(ValueError, match="after"):
        build(after=0)
    with pytest.raises(TypeError, match="after"):
        build(after={"a"})


def test_build_deps_combined_with_after() -> None:
    rec = build(after="a", deps=[Dep(7, on="on_failure"), Dep("b", on="complete")])
    assert rec.extra.spec() == {"deps": [("a", "success"), (7, "failure"), ("b", "complete")]}


def test_build_deps_must_be_deps() -> None:
    with pytest.raises(TypeError, match="deps"):
        build(deps=["a"])
    with pytest.raises(TypeError, match="deps"):
        build(deps=Dep("a"))


def test_build_unknown_option() -> None:
    with pytest.raises(TypeError):
        build(prio=1)
