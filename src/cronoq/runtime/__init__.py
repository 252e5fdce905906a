"""The asyncio driver: runs the engine core on an event loop, and attempts through a launcher.

The driver owns time and I/O; every scheduling rule lives in `cronoq.core.engine`.

    scheduler.py  Scheduler: the API, its life cycle, argument checks
    session.py    Session: one run's loop (the pump, the one timer, waiters, streams); Launcher
    local.py      LocalLauncher (executors in-process) and OutsideLauncher (the server's workers)
    handles.py    TaskHandle, TaskContext, EventStream: what users hold
"""

from .handles import EventStream, TaskContext, TaskHandle
from .scheduler import SCHEDULER_TRANSITIONS, Scheduler, SchedulerState
from .session import Launcher

__all__ = [
    "SCHEDULER_TRANSITIONS",
    "EventStream",
    "Launcher",
    "Scheduler",
    "SchedulerState",
    "TaskContext",
    "TaskHandle",
]
