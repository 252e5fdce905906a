"""Serving an app's pools until a signal: what `cronoq worker` runs (docs/app.md, "The worker
command").

One `Worker` per pool, all on one event loop. SIGTERM or SIGINT drains them: no new leases,
running ones get the grace period, then are abandoned (the server retries them elsewhere). A
second signal stops at once. A refusal that reconnecting cannot fix (a wrong token, an unknown
pool) stops every worker and is raised, so the command exits with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..client import Worker
from ._app import App
from ._remote import Handler

__all__ = ["load_app", "serve"]

log = logging.getLogger("cronoq.worker")


def load_app(path: str) -> App:
    """The `App` that `module:attribute` names (the current directory is importable, as for
    `python -m`); ValueError with one line saying what is wrong."""
    module_name, sep, attribute = path.partition(":")
    if not module_name:
        raise ValueError(f"bad application path {path!r}: use MODULE:APP, e.g. tasks:app")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # anything the import raises is the user's one line
        raise ValueError(f"cannot import {module_name!r}: {type(e).__name__}: {e}") from e
    if not sep:
        found = [v for v in vars(module).values() if isinstance(v, App)]
        if len(found) != 1:
            raise ValueError(
                f"module {module_name!r} holds {len(found)} cronoq.App objects:"
                " name one as MODULE:APP"
            )
        return found[0]
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        name = type(app).__name__
        what = "nothing" if app is None else f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"
        raise ValueError(f"{path} is {what}, not a cronoq.App")
    return app


def _slots_by_pool(app: App, pools: Sequence[str], slots: Sequence[str]) -> dict[str, int]:
    """`--slots N` for every pool, `--slots POOL=N` for one; the rest keep the pool's max."""
    chosen: dict[str, int] = {}
    for text in slots:
        name, sep, number = text.rpartition("=")
        if not number.isdigit() or int(number) < 1:
            raise ValueError(f"bad --slots {text!r}: use N or POOL=N with N >= 1")
        if not sep:
            chosen.update(dict.fromkeys(pools, int(number)))
        elif name not in pools:
            raise ValueError(f"--slots {text!r} names a pool this worker does not serve")
        else:
            chosen[name] = int(number)
    return {p: chosen.get(p, app.slots(p)) for p in pools}


async def _announce(worker: Worker, target: str, kinds: Sequence[str]) -> None:
    await worker.wait_registered()
    log.info(
        "registered with %s: pool %s, %d slot(s) granted, kinds %s",
        target,
        worker.pool,
        worker.granted_slots or worker.slots,
        ", ".join(kinds) or "(none)",
        extra={
            "fields": {
                "pool": worker.pool,
                "slots": worker.granted_slots,
                "worker_id": worker.worker_id,
                "kinds": list(kinds),
            }
        },
    )


async def serve(
    app: App,
    target: str,
    *,
    pools: Sequence[str] = (),
    slots: Sequence[str] = (),
    grace: float = 10.0,
    worker_options: Mapping[str, Any] | None = None,
) -> None:
    """Serve `pools` (every pool of the app when empty) until SIGTERM/SIGINT, then drain."""
    names = list(pools) or [p for p in app.pool_names() if app.kinds(p)]
    if not names:
        raise ValueError(f"app {app.name!r} declares no task this worker can serve")
    per_pool = _slots_by_pool(app, names, slots)
    options = dict(worker_options or {})
    workers = [app.worker(target, p, slots=per_pool[p], grace=grace, **options) for p in names]
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig.name)
        signalled.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    runs = [loop.create_task(w.run()) for w in workers]
    announce = [loop.create_task(_announce(w, target, list(app.kinds(w.pool)))) for w in workers]
    waiter = loop.create_task(signalled.wait())
    try:
        await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
        ended = [r for r in runs if r.done()]
        if not ended:
            # Begun before it is said: a task submitted after the line is never run here.
            draining: asyncio.Future[Any] = asyncio.gather(
                *(asyncio.shield(w.begin_stop(grace)) for w in workers)
            )
            log.info("%s: draining for up to %s s", received[0], grace)
            signalled.clear()
            waiter = loop.create_task(signalled.wait())
            either: list[asyncio.Future[Any]] = [draining, waiter]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not draining.done():  # a second signal: abandon the running attempts now
                log.info("%s again: stopping now", received[-1])
                for w in workers:
                    if isinstance(w.handler, Handler):
                        w.handler.abandon()
                await draining
            await asyncio.gather(*runs, return_exceptions=True)
            log.info("stopped")
            return
        await asyncio.gather(*(w.stop(0.0) for w in workers))
        for r in ended:
            r.result()  # a fatal refusal: raised for the command's one line
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for t in (waiter, *announce, *runs):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(waiter, *announce, *runs, return_exceptions=True)
