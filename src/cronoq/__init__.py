"""cronoq: an elastic, priority-aware task scheduler.

Library mode runs `async def run(ctx, payload)` executors in-process on an asyncio event loop:

    async with cronoq.Scheduler([cronoq.Pool("default", run, max=8)]) as sched:
        handle = await sched.submit({"to": "ada"}, priority="high", key="welcome-ada")
        print(await handle)
"""

from ._attempt import CancellationToken
from ._options import AutoscaleConfig, Dep, Pool, Resource, Task
from .app import App, Handle, context
from .core.model import PoolSnapshot, Priority, RetryPolicy, Snapshot, StatusEvent
from .errors import (
    CronoqError,
    EventsLagged,
    Permanent,
    Retryable,
    SchedulerError,
    SubmitError,
    TaskFailed,
)
from .runtime import EventStream, Scheduler, TaskContext, TaskHandle
from .store import Codec, JsonCodec, PostgresStore, SqliteStore

__version__ = "0.2.0"

__all__ = [
    "App",
    "AutoscaleConfig",
    "CancellationToken",
    "Codec",
    "CronoqError",
    "Dep",
    "EventStream",
    "EventsLagged",
    "Handle",
    "JsonCodec",
    "Permanent",
    "Pool",
    "PoolSnapshot",
    "PostgresStore",
    "Priority",
    "Resource",
    "Retryable",
    "RetryPolicy",
    "Scheduler",
    "SchedulerError",
    "Snapshot",
    "SqliteStore",
    "StatusEvent",
    "SubmitError",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskHandle",
    "__version__",
    "context",
]


def __getattr__(name: str) -> object:
    """`cronoq.client` imports on first use, so `import cronoq` never needs grpc."""
    if name == "client":
        import importlib

        return importlib.import_module("cronoq.client")
    raise AttributeError(f"module 'cronoq' has no attribute {name!r}")
