"""Background work a server does only while it leads (the webhook scaler's posts, the history
sampler): one task per leadership, started when the app becomes ready and ended on its own once
the engine it began with no longer serves."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from cronoq.core.engine import Engine
from cronoq.errors import SchedulerError

if TYPE_CHECKING:
    from .app import ServerApp


class LeaderTask(ABC):
    """`lead()` at each leadership starts `_run()` afresh; `stop()` ends it."""

    def __init__(self, app: ServerApp) -> None:
        self._app = app
        self._session: asyncio.Task[None] | None = None

    def lead(self) -> None:
        """Start the work for the engine that serves now (the app just became ready)."""
        if self._session is not None:
            self._session.cancel()  # (it ends by itself once its engine no longer serves)
        self._session = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End the session, whatever it has in flight included."""
        session, self._session = self._session, None
        if session is not None:
            session.cancel()
            await asyncio.gather(session, return_exceptions=True)

    def _serving(self) -> Engine | None:
        """The engine this server leads with now, or None once it no longer does."""
        if not self._app.ready:
            return None
        try:
            return self._app.scheduler.serving()
        except (RuntimeError, SchedulerError):
            return None

    @abstractmethod
    async def _run(self) -> None:
        """One leadership's work; return once `_serving()` is no longer its engine."""
