"""What an engine call leaves for its driver: the actions to carry out and, for a driver with a
store, the journal of what changed since it last persisted."""

from __future__ import annotations

from .model import Attempt, StatusEvent, TaskRecord
from .recurring import Recurring


class Actions:
    """What the driver must do after a call (see the engine's theory of operation)."""

    __slots__ = ("aborts", "events", "finished", "starts")

    def __init__(self) -> None:
        self.starts: list[Attempt] = []
        self.aborts: list[Attempt] = []
        self.finished: list[TaskRecord] = []
        self.events: list[StatusEvent] = []

    def __bool__(self) -> bool:
        return bool(self.starts or self.aborts or self.finished or self.events)


class Journal:
    """What changed since the driver last persisted: tasks admitted (whole rows to write),
    tasks whose status changed, schedules whose next occurrence moved, pools paused or resumed
    (name -> paused now) and ended tasks deleted from the history (ids)."""

    __slots__ = ("added", "changed", "deleted", "pools", "schedules")

    def __init__(self) -> None:
        self.added: list[TaskRecord] = []
        self.changed: dict[int, TaskRecord] = {}
        self.schedules: dict[str, Recurring] = {}
        self.pools: dict[str, bool] = {}
        self.deleted: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.schedules or self.pools or self.deleted)
