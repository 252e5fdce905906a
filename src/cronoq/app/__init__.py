"""Task functions: declare work as functions on an `App`, submit it with the functions' own
typed parameters, and run it in-process or on remote workers (docs/app.md).

    app = cronoq.App()

    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    async with app.local():
        print(await (await add.submit(2, 3)))   # 5
"""

from ._app import (
    App,
    AsyncTaskFunction,
    Call,
    CallOptions,
    Context,
    Handle,
    PoolOptions,
    Ref,
    Submitter,
    SyncTaskFunction,
    TaskFunction,
    TaskOptions,
    WireCodec,
    context,
)

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
