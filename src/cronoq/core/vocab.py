"""The words of cronoq's options and answers, each defined once as a type and its values.

The library (`cronoq._options`, `cronoq.runtime`), the client and the CLI check, map and offer
these names; a `Literal` lets a type checker catch a misspelled one in user code, and the
tuples beside them are what the checks at run time accept, so the two cannot disagree. It
imports nothing from the rest of the core, so any module may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

__all__ = [
    "DEP_CONDITIONS",
    "MISS_POLICIES",
    "OVERFLOWS",
    "OVERLAPS",
    "PRIORITY_NAMES",
    "STATUSES",
    "TERMINAL_STATUSES",
    "UNKNOWN_DEPENDENCY",
    "DepCondition",
    "DepOn",
    "MissPolicy",
    "Overflow",
    "Overlap",
    "PriorityName",
    "Status",
    "UnknownDependency",
]

# Priority classes by name, most important first (any case is accepted at run time; the
# numbers and the `Priority` enum are in core/model.py).
PriorityName = Literal["critical", "high", "normal", "low"]
PRIORITY_NAMES: tuple[PriorityName, ...] = get_args(PriorityName)

# What a fixed start that passed its tolerance does (docs/fixed-starts.md).
MissPolicy = Literal["run_late", "skip", "fail"]
MISS_POLICIES: tuple[MissPolicy, ...] = get_args(MissPolicy)

# What a recurring occurrence does while the previous one still runs.
Overlap = Literal["skip", "allow", "queue", "queue_on_success"]
OVERLAPS: tuple[Overlap, ...] = get_args(Overlap)

# What a pool at max_pending does with one more task (docs/overflow-and-fairness.md).
Overflow = Literal["wait", "reject", "shed_lowest", "shed_oldest"]
OVERFLOWS: tuple[Overflow, ...] = get_args(Overflow)

# What a pool does with a dependency on a task it does not know.
UnknownDependency = Literal["reject", "await"]
UNKNOWN_DEPENDENCY: tuple[UnknownDependency, ...] = get_args(UnknownDependency)

# How a dependency must end (`DepOn`); each also has an "on_" form (the wire's name), listed
# first, as the client's error message lists them.
DepOn = Literal["success", "complete", "failure"]
DepCondition = Literal["on_success", "success", "on_complete", "complete", "on_failure", "failure"]
# every DepCondition to its DepOn (keyed by str: a run-time check looks any string up)
DEP_CONDITIONS: Mapping[str, DepOn] = {
    name: on for on in get_args(DepOn) for name in (f"on_{on}", on)
}

# A task's status, in the order of the core's status numbers; the last seven are terminal.
Status = Literal[
    "blocked",
    "scheduled",
    "ready",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "dead_lettered",
    "cancelled",
    "skipped",
    "missed",
    "shed",
]
STATUSES: tuple[Status, ...] = get_args(Status)
TERMINAL_STATUSES: frozenset[Status] = frozenset(STATUSES[STATUSES.index("succeeded") :])
