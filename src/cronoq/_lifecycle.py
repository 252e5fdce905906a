"""One explicit life cycle per long-lived component (Scheduler, Durable, Worker, ServerApp).

A component names its states in an Enum and writes down, in one table, the states each state
may move to. It keeps a `Lifecycle` and changes state only through `move()`, which checks the
table: a move the table does not allow raises `IllegalStateChange`, which like the engine's
`IllegalTransition` (core/model.py) is always a bug of cronoq, never of its caller.

The tables live next to the components they describe, and docs/ lists them (docs/library.md,
docs/durability.md, docs/worker.md, docs/server.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Generic, TypeVar

__all__ = ["IllegalStateChange", "Lifecycle", "Table", "table"]

S = TypeVar("S", bound=Enum)

Table = Mapping[S, frozenset[S]]


class IllegalStateChange(AssertionError):
    """A state change the component's table does not allow: always a bug of cronoq."""

    def __init__(self, component: str, old: Enum, new: Enum) -> None:
        super().__init__(f"{component}: illegal state change {old.name} -> {new.name}")
        self.component = component
        self.old = old
        self.new = new


def table(states: type[S], moves: Mapping[S, Iterable[S]]) -> dict[S, frozenset[S]]:
    """A transition table with an entry for every state of `states` (final states: empty);
    raises ValueError for a state it leaves out, so a state added later cannot be forgotten."""
    missing = [s.name for s in states if s not in moves]
    if missing:
        raise ValueError(f"{states.__name__}: no table entry for {', '.join(missing)}")
    return {s: frozenset(moves[s]) for s in states}


class Lifecycle(Generic[S]):
    """The current state of one component, changed only by `move()`."""

    __slots__ = ("_table", "component", "state")

    def __init__(self, component: str, initial: S, transitions: Table[S]) -> None:
        self.component = component
        self.state = initial
        self._table = transitions

    def move(self, new: S) -> S:
        """Change to `new` if the table allows it (IllegalStateChange otherwise); returns the
        state it left."""
        old = self.state
        if new not in self._table[old]:
            raise IllegalStateChange(self.component, old, new)
        self.state = new
        return old

    def at(self, *states: S) -> bool:
        """Is the current state one of `states`? (A call, not `state is X`, so that a type
        checker does not carry a narrowed state across an await or a move.)"""
        return self.state in states

    def __repr__(self) -> str:
        return f"Lifecycle({self.component!r}, {self.state.name})"
