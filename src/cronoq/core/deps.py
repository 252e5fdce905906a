"""Dependencies between tasks: resolving edges at admission, blocking a task until its parents
end, releasing or skipping it when they do, and refusing cycles.

An edge is (parent, condition): `success`, `failure` (failed or dead-lettered) or `complete`
(any end). A blocked task counts its unmet edges (`Extras.waiting`); each parent keeps its
waiting children (`Extras.children`). When a parent ends, every child's edge is settled: met
edges count down and release the child at zero, an unmet edge skips it, and a skipped child
settles its own children in turn (iteratively, through one cascade queue, so long chains do
not recurse). A key that names no task yet is awaited (`unknown_dependency="await"`): the edge
is linked when a task with that key is admitted, and an `await_timeout` skips the child.
"""

from __future__ import annotations

from collections import deque

from ..errors import SubmitError
from .model import (
    BLOCKED,
    DEAD_LETTERED,
    FAILED,
    FIRST_TERMINAL,
    SKIPPED,
    STATUS_NAMES,
    SUCCEEDED,
    Extras,
    TaskRecord,
)
from .pool import PoolState
from .state import State

MSG_AWAIT_TIMEOUT = "timed out awaiting unknown dependency"

Resolved = list[tuple[TaskRecord | None, str | None, str]]


class Dependencies:
    """The engine's dependency graph (see the module docstring)."""

    __slots__ = ("_await_timer", "_cascade", "_settling", "_st", "awaiting")

    def __init__(self, st: State) -> None:
        self._st = st
        self._await_timer = st.timers.handler(self._await_expired)
        # key -> (dependent, condition) edges waiting for a task with that key to be submitted
        self.awaiting: dict[str, list[tuple[TaskRecord, str]]] = {}
        self._cascade: deque[TaskRecord] = deque()
        self._settling = False

    def resolve(self, rec: TaskRecord, extra: Extras, batch: dict[str, TaskRecord] | None) -> None:
        """Find the parents the task's edges name (in the engine, or in its batch by key);
        SubmitError for an unknown one unless its pool awaits unknown keys."""
        deps = extra.deps
        if not deps:
            return
        st = self._st
        resolved: Resolved = []
        for target, on in deps:
            if isinstance(target, str):
                if target == rec.key:
                    raise SubmitError("cycle", "dependency cycle")
                parent = st.keys.get(target)
                if parent is None and batch is not None:
                    parent = batch.get(target)
                if parent is None:
                    if st.pools[rec.pool].cfg.unknown_dependency != "await":
                        raise SubmitError("unknown_dependency", f"unknown dependency {target!r}")
                    resolved.append((None, target, on))
                    continue
            else:
                parent = st.tasks.get(target)
                if parent is None:
                    raise SubmitError("unknown_dependency", f"unknown dependency '{target}'")
            resolved.append((parent, None, on))
        extra.resolved = resolved

    def check_await_cycle(self, rec: TaskRecord) -> None:
        """A task whose key others await must not depend on any of them (after resolve)."""
        key = rec.key
        if key is None or key not in self.awaiting or rec.extra is None:
            return
        waiting = {
            id(child)
            for child, _ in self.awaiting[key]
            if child.status == BLOCKED
            and child.extra is not None
            and child.extra.awaits
            and key in child.extra.awaits
        }
        if waiting and _reaches(rec.extra.resolved or [], waiting):
            raise SubmitError("cycle", "dependency cycle")

    def key_admitted(self, rec: TaskRecord, key: str) -> None:
        """A task with `key` was admitted: it becomes the parent of the tasks awaiting it."""
        for child, on in self.awaiting.pop(key):
            if child.status == BLOCKED:
                _children(rec).append((child, on))
                child_extra = child.extra
                assert child_extra is not None and child_extra.awaits is not None
                child_extra.awaits.discard(key)
                if child_extra.parents is None:
                    child_extra.parents = []
                child_extra.parents.append(rec)

    def attach(self, rec: TaskRecord, extra: Extras, pool: PoolState, now: float) -> None:
        """Link a task being admitted to its parents: it waits for the live ones, is skipped
        if an ended one did not meet its edge, and is released if every edge is met."""
        st = self._st
        waiting = 0
        dead: str | None = None
        # `resolved` stays while the task is blocked if some task awaits a key: the await-cycle
        # check walks it to find ancestors. Without awaits it goes at once (fewer objects for
        # the garbage collector): a path from a task submitted later to one that awaits a key
        # only passes through tasks admitted after that one started waiting.
        for parent, awaited, on in extra.resolved or ():
            if parent is None:
                assert awaited is not None
                self.awaiting.setdefault(awaited, []).append((rec, on))
                if extra.awaits is None:
                    extra.awaits = set()
                extra.awaits.add(awaited)
                timeout = pool.cfg.await_timeout
                if timeout is not None:
                    st.timers.set(rec.submitted_at + max(0.0, timeout), self._await_timer, rec)
                waiting += 1
            elif parent.status < FIRST_TERMINAL:
                _children(parent).append((rec, on))
                waiting += 1
            elif not edge_met(parent.status, on):
                dead = STATUS_NAMES[parent.status]
        if dead is not None:
            st.finish(rec, SKIPPED, now, f"dependency ended as {dead}")
        elif waiting:
            extra.waiting = waiting
            if not self.awaiting:
                extra.resolved = None
        else:
            st.release(rec, pool, now)

    def ended(self, rec: TaskRecord, now: float) -> None:
        """A task with waiting children ended: settle their edges (skips cascade)."""
        self._cascade.append(rec)
        if self._settling:
            return  # the loop below, already running, takes it
        cascade = self._cascade
        st = self._st
        self._settling = True
        try:
            while cascade:
                parent = cascade.popleft()
                extra = parent.extra
                assert extra is not None
                status = parent.status
                children, extra.children = extra.children or [], None
                for child, on in children:
                    if child.status != BLOCKED:
                        continue
                    if edge_met(status, on):
                        child_extra = child.extra
                        assert child_extra is not None
                        child_extra.waiting -= 1
                        if not child_extra.waiting:
                            st.release(child, st.pools[child.pool], now)
                    else:
                        msg = f"dependency {parent.id} ended as {STATUS_NAMES[status]}"
                        st.finish(child, SKIPPED, now, msg)
        finally:
            self._settling = False

    def _await_expired(self, rec: TaskRecord, tag: int, when: float, now: float) -> None:
        extra = rec.extra
        if rec.status == BLOCKED and extra is not None and extra.awaits:
            self._st.finish(rec, SKIPPED, now, MSG_AWAIT_TIMEOUT)


def edge_met(status: int, on: str) -> bool:
    """Does a parent that ended with `status` satisfy an edge with condition `on`?"""
    if on == "complete":
        return True
    if on == "success":
        return status == SUCCEEDED
    return status in (FAILED, DEAD_LETTERED)


def _children(rec: TaskRecord) -> list[tuple[TaskRecord, str]]:
    extra = rec.extra
    if extra is None:
        extra = rec.extra = Extras()
    if extra.children is None:
        extra.children = []
    return extra.children


def _parents(rec: TaskRecord) -> list[TaskRecord]:
    """Known parents of a task that is being admitted or is blocked: those resolved at
    admission and awaited keys resolved since."""
    extra = rec.extra
    if extra is None:
        return []
    out = [p for p, _, _ in extra.resolved or () if p is not None]
    out.extend(extra.parents or ())
    return out


def _reaches(resolved: Resolved, targets: set[int]) -> bool:
    """Does any live ancestor reachable from these parents belong to `targets` (by id())?"""
    stack = [p for p, _, _ in resolved if p is not None]
    seen: set[int] = set()
    while stack:
        p = stack.pop()
        if id(p) in targets:
            return True
        if id(p) in seen or p.status != BLOCKED:  # only blocked tasks wait on parents
            continue
        seen.add(id(p))
        stack.extend(_parents(p))
    return False


def _batch_parents(rec: TaskRecord, batch: set[int]) -> list[TaskRecord]:
    extra = rec.extra
    if extra is None:
        return []
    return [p for p, _, _ in extra.resolved or () if p is not None and id(p) in batch]


def parents_first(new: list[TaskRecord]) -> list[TaskRecord]:
    """The batch in an order where each task comes after its parents in the batch (stable);
    SubmitError("cycle") if there is none."""
    batch = {id(r) for r in new}
    order: list[TaskRecord] = []
    state: dict[int, int] = {}  # 1 = on the current path, 2 = placed
    for root in new:
        if state.get(id(root)) == 2:
            continue
        stack: list[tuple[TaskRecord, int]] = [(root, 0)]
        state[id(root)] = 1
        while stack:
            rec, i = stack[-1]
            parents = _batch_parents(rec, batch)
            if i < len(parents):
                stack[-1] = (rec, i + 1)
                p = parents[i]
                st = state.get(id(p))
                if st == 1:
                    raise SubmitError("cycle", "dependency cycle")
                if st is None:
                    state[id(p)] = 1
                    stack.append((p, 0))
            else:
                stack.pop()
                state[id(rec)] = 2
                order.append(rec)
    return order
