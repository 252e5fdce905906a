"""Server mode of an `App`: submitting through a `Client` and serving through `Worker`s.

Imported only when an app connects or serves, so that library mode never needs grpc.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ..client import Client, Lease, Reject, Worker, task
from ..errors import Permanent, TaskFailed
from ._app import JSON, App, Call, Handle, WireCodec, _batch_keys, _Json, _wire_options, invoke

__all__ = ["Handler", "Remote", "worker"]


def _spec_options(call: Call[Any], keys: Mapping[int, str], codec: WireCodec) -> dict[str, Any]:
    options = _wire_options(call, keys)
    return {**options, "content_type": codec.content_type}


class Remote:
    """Submits an app's calls to a cronoq-server and waits for their results."""

    def __init__(self, app: App, target: str, client_options: Mapping[str, Any]) -> None:
        self._app = app
        self._codec = app.codec
        self.client = Client(target, **client_options)

    async def submit(self, call: Call[Any]) -> Handle[Any]:
        codec = self._codec
        sent = await self.client.submit(
            codec.encode(call.payload), **_spec_options(call, {}, codec)
        )
        return Handle(self._app, call.task, sent.id, sent.duplicate, None)

    async def submit_batch(self, calls: Sequence[Call[Any]]) -> list[Handle[Any]]:
        codec = self._codec
        keys = _batch_keys(calls)
        specs = [task(codec.encode(c.payload), **_spec_options(c, keys, codec)) for c in calls]
        sent = await self.client.submit_batch(specs)
        return [
            Handle(self._app, c.task, s.id, s.duplicate, None)
            for c, s in zip(calls, sent, strict=True)
        ]

    async def wait(self, handle: Handle[Any], timeout: float | None) -> Any:
        result = await self.client.wait(handle.id, timeout)
        if not result.ok:
            raise TaskFailed(result.status, result.message, result.id)
        if result.output is None:
            raise LookupError(
                f"task {result.id} succeeded but the server no longer holds its output"
            )
        if not result.output:
            return None
        try:
            return self._codec.decode(result.output)
        except ValueError as e:  # a worker that answered in another encoding
            raise TypeError(
                f"the result of task {result.id} ({handle.kind}) is not"
                f" {self._codec.content_type}: {e}"
            ) from None

    async def cancel(self, id: int) -> bool:
        return await self.client.cancel(id)


def worker(app: App, target: str, pool: str, options: dict[str, Any]) -> Worker:
    """A Worker serving `pool` with the app's functions for it."""
    if pool not in app.pool_names():
        raise ValueError(
            f"app {app.name!r} declares no pool {pool!r} (it has {', '.join(app.pool_names())})"
        )
    if "slots" not in options:
        options = {**options, "slots": app.slots(pool)}
    return Worker(target, pool, Handler(app, pool), **options)


def _media_type(content_type: str) -> str:
    """ "text/plain; charset=utf-8" -> "text/plain"."""
    return content_type.split(";")[0].strip()


class Handler:
    """A Worker handler running the app's function for each lease's kind. A kind it does not
    know is handed back, so that another worker of the pool (a newer version, another
    language) can run it; with none, the server fails the attempt with this reason. It knows
    its running attempts, so that a second signal can abandon them at once (`abandon`)."""

    def __init__(self, app: App, pool: str) -> None:
        self._app = app
        self._pool = pool
        codec = app.codec
        # JSON also for text and no type: what `cronoq submit` and other clients send for a
        # payload given as text; the call's own codec answers it
        json = _Json()
        self._codecs: dict[str, WireCodec] = {
            "": json,
            "text/plain": json,
            JSON: json,
            codec.content_type: codec,
        }
        self._running: set[asyncio.Task[Any]] = set()

    async def __call__(self, lease: Lease) -> bytes:
        task_fn = self._app.tasks.get(lease.kind)
        if task_fn is None or task_fn.pool != self._pool or not task_fn.serve:
            raise Reject(f"no worker here has a task function for kind {lease.kind!r}")
        codecs = self._codecs
        codec = codecs.get(lease.content_type) or codecs.get(_media_type(lease.content_type))
        if codec is None:
            raise Permanent(
                f"the arguments of {lease.kind} are {lease.content_type!r}, which this"
                f" worker's codec ({self._app.codec.content_type}) does not read"
            )
        try:
            payload = codec.decode(lease.payload) if lease.payload else None
        except ValueError as e:  # not the codec's format
            raise Permanent(f"the arguments of {lease.kind} do not decode: {e}") from None
        me = asyncio.current_task()
        assert me is not None
        self._running.add(me)
        try:
            result = await invoke(task_fn, lease, payload)
        finally:
            self._running.discard(me)
        return codec.encode(task_fn.signature.result(result))

    def abandon(self) -> None:
        """Cancel every running attempt: a stopping Worker reports nothing for them, and the
        server gives them to another worker once this one's stream ends."""
        for attempt in list(self._running):
            attempt.cancel()
