"""The Rust engine core decides exactly as the Python one: hypothesis draws configurations and
operation sequences (parity/engine_ops.py), both engines run them, and every operation's return
value, actions, next wake-up, counters and journal must be equal, field by field.

A run compares 2,000 sequences (some 70k operations, about 20 s on this 2-core machine when it
is quiet; CRONOQ_PARITY_SCALE=N: N times as many); `python tests/parity/long.py --ops 1000000`
runs a long one on fresh seeds."""

from __future__ import annotations

from types import ModuleType

from hypothesis import given

from parity.budget import examples
from parity.engine_ops import Config, Op, check, run_python, scenarios


@examples(2000)
@given(scenarios())
def test_engines_make_the_same_decisions(
    core_py: ModuleType, scenario: tuple[Config, list[Op]]
) -> None:
    check(core_py, *scenario)


def _config(**pool: object) -> Config:
    base = {"name": "p0", "capacity": 1, "ttl": None, "retry": None, "duration": 1.0}
    base |= {"max_pending": None, "overflow": "wait", "cost": 0.5} | pool
    scoring = ((10000.0, 1000.0, 100.0, 10.0), 2.0, 800.0, 5.0, 5000.0, 10.0, 4000.0)
    return (7, scoring, 2, 60.0, 100, [tuple(base.values())])


def _spec(cls: int, *, key: str | None = None, deadline: float | None = None) -> tuple[object, ...]:
    return ("p0", cls, "a", key, deadline, None, None, None)


def test_a_retry_with_jitter_and_its_timer(core_py: ModuleType) -> None:
    """Jitter draws from the injected generator: a failed attempt retries at the same time."""
    ops: list[Op] = [
        ("submit", 0.0, *_spec(2)),
        ("dispatch", 0.0),
        ("fail", 1.0, 0, "boom", False, None),
        ("advance", 1.3),
        ("advance", 2.0),
        ("dispatch", 2.0),
        ("complete", 2.5, 0),
        ("advance", 70.0),
    ]
    check(core_py, _config(), ops)
    retried = run_python(_config(), ops)[2][1]
    assert retried == [], "the retry waits for its backoff"


def test_overflow_sheds_and_aging_and_deadlines_order_the_queue(core_py: ModuleType) -> None:
    """A full pool sheds the newest low task; an overdue deadline outranks an older task."""
    ops: list[Op] = [
        ("set_capacity", 0.0, "p0", 0),
        ("submit", 0.0, *_spec(3)),
        ("submit", 0.5, *_spec(3, key="k0")),
        ("submit", 1.0, *_spec(2)),
        ("submit", 1.5, *_spec(0)),
        ("submit", 2.0, *_spec(2, deadline=3.0)),
        ("set_capacity", 9.0, "p0", 4),
        ("dispatch", 9.0),
        ("lookup", 9.0, "k0"),
        ("snapshot", 9.5),
    ]
    check(core_py, _config(max_pending=3, overflow="shed_lowest"), ops)
