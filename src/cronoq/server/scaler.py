"""The webhook scaler (docs/autoscaling.md, "Webhook scaler"): a pool configured with
`scaler = { kind = "webhook", url = ..., token_env = ... }` has its desired capacity POSTed to
the url as `{"pool": <name>, "desired": <n>}` whenever it changes.

Only the leader posts. `lead()` runs when the app becomes ready (`ServerApp.on_ready`) and starts
one session for the engine that serves then; the session ends by itself once the app no longer
serves that engine (the leadership or the store was lost, or the shutdown began), and `stop()`
ends it for good. A new leadership starts a new session, which posts the value of then again.

A session reads each webhook pool's target (`Engine.desired`, the value of
`PoolSnapshot.desired`) every `poll_s`; the engine's autoscaler moves it at most once a second.
Each pool has its own poster task, fed by the latest value, so a slow or failing receiver never
delays scheduling nor another pool. A poster posts one value at a time and always the latest: a
value that changes while a post is in flight or waiting to be retried is sent next, the ones in
between never. A failed post (no connection, no answer within `timeout_s`, a status other than
2xx; redirects are not followed) is retried after an exponential backoff with jitter, from
`backoff[0]` doubling up to `backoff[1]`. Failures are logged as `scaler_failed` with the pool,
the url without query, the status and the error; the token is sent, never logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import aiohttp

from .config import PoolSettings
from .leading import LeaderTask
from .logs import event

if TYPE_CHECKING:
    from .app import ServerApp

__all__ = ["BACKOFF_S", "POLL_S", "TIMEOUT_S", "WebhookScaler"]

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often a session reads the desired capacities
TIMEOUT_S = 10.0  # the bound of one POST, connecting included
BACKOFF_S = (0.5, 30.0)  # the first wait before a retry, and the longest


def display_url(url: str) -> str:
    """The url as logged: scheme, host, port and path (no user info, query or fragment)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


class WebhookScaler(LeaderTask):
    """The posters of every pool whose `scaler.kind` is "webhook"."""

    def __init__(
        self,
        app: ServerApp,
        pools: Sequence[PoolSettings],
        *,
        poll_s: float = POLL_S,
        timeout_s: float = TIMEOUT_S,
        backoff: tuple[float, float] = BACKOFF_S,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(app)
        self._pools = [p for p in pools if p.scaler.kind == "webhook" and p.scaler.url]
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._backoff = backoff
        self._rng = rng or random.Random()

    def lead(self) -> None:
        """Start posting for the engine that serves now (the app just became ready)."""
        if self._pools:
            super().lead()

    async def _run(self) -> None:
        engine = self._serving()
        if engine is None:
            return
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            posters = [Poster(p, http, self._backoff, self._rng) for p in self._pools]
            tasks = [asyncio.ensure_future(p.run()) for p in posters]
            try:
                while self._serving() is engine:
                    for p in posters:
                        p.offer(engine.desired(p.pool))
                    await asyncio.sleep(self._poll_s)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


class Poster:
    """One pool's posts: the latest desired capacity, posted until the receiver takes it."""

    def __init__(
        self,
        settings: PoolSettings,
        http: aiohttp.ClientSession,
        backoff: tuple[float, float],
        rng: random.Random,
    ) -> None:
        scaler = settings.scaler
        assert scaler.url is not None
        self.pool = settings.name
        self._url = scaler.url
        self._shown = display_url(scaler.url)
        self._token = scaler.token
        self._headers = {} if scaler.token is None else {"Authorization": f"Bearer {scaler.token}"}
        self._http = http
        self._backoff = backoff
        self._rng = rng
        self._latest: int | None = None
        self._changed = asyncio.Event()

    def offer(self, desired: int) -> None:
        if desired != self._latest:
            self._latest = desired
            self._changed.set()

    async def run(self) -> None:
        posted: int | None = None
        while True:
            await self._changed.wait()
            self._changed.clear()
            delay, failures = self._backoff[0], 0
            while (value := self._latest) is not None and value != posted:
                problem = await self._post(value)
                if problem is None:
                    posted = value
                    level = logging.INFO if failures else logging.DEBUG
                    event(log, level, "scaler_posted", pool=self.pool, desired=value)
                    break
                failures += 1
                wait = delay * (0.5 + 0.5 * self._rng.random())  # jitter: [delay/2, delay]
                status, error = problem
                event(
                    log,
                    logging.WARNING,
                    "scaler_failed",
                    pool=self.pool,
                    url=self._shown,
                    status=status,
                    error=error,
                    desired=value,
                    retry_in_s=round(wait, 3),
                )
                await asyncio.sleep(wait)
                delay = min(delay * 2, self._backoff[1])

    async def _post(self, desired: int) -> tuple[int | str, str] | None:
        """None once the receiver answered 2xx, else (status or "-", what went wrong)."""
        body = {"pool": self.pool, "desired": desired}
        try:
            async with self._http.post(
                self._url, json=body, headers=self._headers, allow_redirects=False
            ) as resp:
                if 200 <= resp.status < 300:
                    return None
                return resp.status, f"HTTP {resp.status}"
        except TimeoutError:
            return "-", "timeout"
        except Exception as e:  # aiohttp's errors and whatever else: retried, never the end
            return "-", self._scrub(f"{type(e).__name__}: {e}")

    def _scrub(self, text: str) -> str:
        """Never the token, whatever an error message might quote."""
        token = self._token
        return text.replace(token, "***") if token else text
