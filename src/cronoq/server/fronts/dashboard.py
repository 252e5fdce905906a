"""The dashboard's routes on the main HTTP listener (docs/dashboard.md, "The dashboard's API").

Static files from the `cronoq.server.ui` package directory, and a few read routes built on the
registered gRPC handlers (so sharding and pool scoping behave as for /v1/tasks). Bound only
when `[server] dashboard` is true, never on the metrics listener, and not in the published
OpenAPI document: the page is their only client.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
from collections.abc import AsyncGenerator
from importlib import resources
from typing import Any, cast

from aiohttp import web
from multidict import MultiDict

from ... import __version__
from ...core.engine import Engine
from ...core.model import FIRST_TERMINAL, STATUS_NAMES, SUCCEEDED, Priority, TaskRecord
from ...errors import SchedulerError
from ...proto.cronoq.v1 import cronoq_pb2 as pb
from ..auth import current_principal
from ..convert import CONTENT_TYPE_TAG, RESERVED_PREFIX, output_bytes, to_ns
from ..errors import Refused
from ..services.sharding.plan import ShardPlan
from ..services.tasks import known_pools, pool_filter
from . import json_messages
from .calls import Aborted, Call
from .routes import Gateway, HttpError, Route, json_answer

_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
    ".map": "application/json",
}
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
}
# A payload or output preview shows at most this many bytes as hex.
PREVIEW_BYTES = 512
# /ui/api/events: a comment this often keeps proxies from closing an idle stream.
PING_S = 15.0
PING = b": ping\n\n"
_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "X-Accel-Buffering": "no",  # nginx would otherwise hold events back
}


def _file(name: str) -> web.Response:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if not _NAME.fullmatch(name) or suffix not in _TYPES or name.startswith("."):
        raise HttpError(404, "not found")
    entry = resources.files("cronoq.server.ui").joinpath(name)
    if not entry.is_file():
        raise HttpError(404, "not found")
    response = web.Response(body=entry.read_bytes(), headers=_HEADERS)
    response.headers["Content-Type"] = _TYPES[suffix]
    return response


async def index(gw: Gateway, request: web.Request) -> web.Response:
    return _file("index.html")


async def static(gw: Gateway, request: web.Request) -> web.Response:
    return _file(request.match_info["name"])


async def info(gw: Gateway, request: web.Request) -> web.Response:
    """Enough for the page to know whether to ask for a token; no addresses."""
    cfg = gw.app.cfg
    return json_answer({"version": __version__, "auth": cfg.auth.enabled, "dashboard": True})


async def shards(gw: Gateway, request: web.Request) -> web.Response:
    """The shard plan with each shard's reachability as the Snapshot merge saw it."""
    cfg = gw.app.cfg
    own = cfg.own_shard
    down: set[str] = set()
    if cfg.shards:
        snap = await gw.call(request, "/cronoq.v1.Admin/Snapshot", pb.Empty())
        down = set(cast(pb.SnapshotResponse, snap).unavailable_shards)
    listed = [
        {
            "name": s.name,
            "endpoint": s.endpoint,
            "up": s.name not in down,
            "own": own is not None and s.name == own.name,
        }
        for s in cfg.shards
    ]
    return json_answer({"shard": None if own is None else own.name, "shards": listed})


# --- task detail -------------------------------------------------------------------------------


def _ns(t: float | None) -> str | None:
    return None if t is None else str(to_ns(t))


def _json_type(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def preview(data: bytes, content_type: str, *, sniff: bool = False) -> dict[str, Any]:
    """What the page shows of a payload or an output: `json` when the content type is JSON
    (or, with `sniff`, for any bytes that are one JSON text) and it parses, else `text` when
    the bytes are UTF-8; always the hex of the first PREVIEW_BYTES bytes."""
    out: dict[str, Any] = {
        "size": len(data),
        "content_type": content_type,
        "hex": data[:PREVIEW_BYTES].hex(),
        "truncated": len(data) > PREVIEW_BYTES,
    }
    if sniff or _json_type(content_type):
        try:
            out["json"] = json_messages.loads(data)
            return out
        except (ValueError, RecursionError):
            pass
    with contextlib.suppress(UnicodeDecodeError):
        out["text"] = data.decode("utf-8")
    return out


def _payload(rec: TaskRecord) -> bytes | None:
    """The payload's bytes; None once the task succeeded (the engine drops it then) and for a
    finished task restored from a store, which keeps no payload in memory."""
    payload = rec.payload
    if payload is None:
        return None
    if isinstance(payload, str):
        return payload.encode()
    return bytes(payload)


def _cond(on: str) -> str:
    """The library's edge condition (`success`) by its wire name (`on_success`)."""
    return "on_" + on


def _ref(target: int | str) -> dict[str, str]:
    return {"id": str(target)} if isinstance(target, int) else {"key": target}


def _spec(rec: TaskRecord) -> dict[str, Any]:
    tags = rec.tags or {}
    extra = rec.extra
    start = None if extra is None else extra.start_at
    retry = rec.retry
    return {
        "content_type": tags.get(CONTENT_TYPE_TAG, ""),
        "priority": Priority(rec.cls).name.lower(),
        "tenant": rec.tenant or "",
        "tags": {k: v for k, v in tags.items() if not k.startswith(RESERVED_PREFIX)},
        "labels": dict(rec.labels or {}),
        "deadline_unix_ns": _ns(rec.deadline),
        "timeout_s": rec.timeout,
        "start_unix_ns": _ns(start),
        "tolerance_s": None if extra is None or start is None else extra.tolerance,
        "on_miss": None if extra is None or start is None else extra.on_miss,
        "duration_hint_s": rec.duration_hint,
        "retry": None
        if retry is None
        else {
            "max_attempts": retry.max_attempts,
            "initial_backoff_s": retry.initial_backoff,
            "multiplier": retry.multiplier,
            "max_backoff_s": retry.max_backoff,
            "jitter": retry.jitter,
        },
        "resources": dict((None if extra is None else extra.resources) or {}),
        "depends_on": [
            {**_ref(target), "cond": _cond(on)}
            for target, on in ((None if extra is None else extra.deps) or ())
        ],
    }


def _resubmit(rec: TaskRecord, spec: dict[str, Any], payload: bytes) -> dict[str, Any]:
    """A task object for POST /v1/tasks with the same spec and no key: the payload as
    `payload_b64` with `content_type` after it (so the bytes and the type stay exactly)."""
    out: dict[str, Any] = {
        "pool": rec.pool,
        "kind": rec.kind,
        "payload_b64": base64.b64encode(payload).decode("ascii"),
        "content_type": spec["content_type"],
        "priority": spec["priority"],
    }
    for name in ("tenant", "tags", "labels", "resources"):
        if spec[name]:
            out[name] = spec[name]
    for name in (
        "deadline_unix_ns",
        "timeout_s",
        "start_unix_ns",
        "tolerance_s",
        "on_miss",
        "duration_hint_s",
        "retry",
    ):
        if spec[name] is not None:
            out[name] = spec[name]
    if spec["depends_on"]:
        out["deps"] = spec["depends_on"]
    return out


def _edge(rec: TaskRecord | None, target: int | str | None, on: str) -> dict[str, Any]:
    """One parent or child: the task as held now (`status` null once it is forgotten)."""
    if rec is None:
        return {
            "id": str(target) if isinstance(target, int) else None,
            "key": target if isinstance(target, str) else None,
            "condition": _cond(on),
            "status": None,
        }
    return {"id": str(rec.id), "key": rec.key, "condition": _cond(on), "status": rec.status_name}


def _worker(worker: tuple[str, int] | None) -> dict[str, str | None]:
    """The remote worker of an attempt (null without one: library mode, not yet known)."""
    name, number = (None, None) if worker is None else worker
    return {"worker_name": name, "worker_id": None if number is None else str(number)}


def _attempts(rec: TaskRecord) -> list[dict[str, Any]]:
    """Oldest first: the attempts the task retried after (`TaskRecord.past_attempts`, with
    their outcome as `status`), then the latest one as the record holds it, unless that is
    already the last of them (a retrying task's); each with the worker that ran it."""
    out = [
        {
            "attempt": past.number,
            "started_unix_ns": _ns(past.started_at),
            "finished_unix_ns": _ns(past.ended_at),
            "status": past.outcome,
            "message": past.message,
            **_worker(past.worker),
        }
        for past in rec.past_attempts
    ]
    if rec.attempt and not (out and out[-1]["attempt"] == rec.attempt):
        ended = rec.status >= FIRST_TERMINAL
        out.append(
            {
                "attempt": rec.attempt,
                "started_unix_ns": _ns(rec.started_at or None),
                "finished_unix_ns": _ns(rec.finished_at) if ended else None,
                "status": rec.status_name,
                "message": rec.message or "",
                **_worker(rec.worker),
            }
        )
    return out


def _pool(gw: Gateway, engine: Engine, name: str) -> dict[str, Any] | None:
    """The task's pool as its snapshot has it now: paused, and unserved (tasks wait and no
    slot can take them), so the page can say why a task does not start."""
    pool = engine.pools.get(name)
    if pool is None:
        return None
    snap = pool.snapshot(gw.app.scheduler.clock())
    return {"paused": snap.paused, "unserved": snap.unserved, "pending": snap.pending}


def _engine(gw: Gateway) -> Engine:
    """The running engine (a stop may race the route: 503 then, as the ready gate answers)."""
    try:
        return gw.app.scheduler.serving()
    except (RuntimeError, SchedulerError):
        raise HttpError(503, "scheduler not serving") from None


async def _record(gw: Gateway, engine: Engine, task_id: int) -> TaskRecord:
    """The own shard's record of a task Get has just answered for."""
    rec = engine.lookup(task_id)
    if rec is None:
        try:
            rec = await gw.app.scheduler.stored(task_id)
        except (RuntimeError, SchedulerError):
            raise HttpError(503, "scheduler not serving") from None
    if rec is None:
        # Get forwarded the call: only the owning shard's record holds the rest, and the plan
        # names that shard's gRPC endpoint, not its dashboard, so the page cannot be forwarded.
        plan = ShardPlan.of(gw.app.cfg)
        shard = None if plan is None else plan.of_id(task_id)
        if plan is not None and shard is not None and shard is not plan.own:
            raise HttpError(
                409,
                f"task {task_id} is served by shard '{shard.name}' at {shard.endpoint}:"
                " open that shard's dashboard",
            )
        raise HttpError(404, "unknown task")
    return rec


async def task_detail(gw: Gateway, request: web.Request) -> web.Response:
    """Get's answer (its 404, pool scoping and shard refusals) plus what only the record holds."""
    task_id = json_messages.path_id(request.match_info["id"])
    info = await gw.call(request, _T + "Get", pb.GetRequest(task=pb.TaskRef(id=task_id)))
    engine = _engine(gw)
    rec = await _record(gw, engine, task_id)
    spec = _spec(rec)
    payload = _payload(rec)
    parents = []
    for target, on in (None if rec.extra is None else rec.extra.deps) or ():
        parents.append(_edge(engine.lookup(target), target, on))
    return json_answer(
        {
            "task": json_messages.task_info(cast(pb.TaskInfo, info)),
            "spec": spec,
            "payload": None if payload is None else preview(payload, spec["content_type"]),
            "output": preview(output_bytes(rec.output), "", sniff=True)
            if rec.status == SUCCEEDED
            else None,
            "parents": parents,
            "children": [_edge(child, None, on) for child, on in engine.dependents(rec)],
            "attempts": _attempts(rec),
            "resubmit": None if payload is None else _resubmit(rec, spec, payload),
            "pool": _pool(gw, engine, rec.pool),
        }
    )


# --- history ------------------------------------------------------------------------------------


def _since(text: str) -> float:
    try:
        since = float(text)
    except ValueError:
        raise HttpError(400, f"since: {text!r} is not Unix seconds") from None
    if since != since:  # NaN
        raise HttpError(400, "since: NaN is not Unix seconds")
    return since


async def history(gw: Gateway, request: web.Request) -> web.Response:
    """Each pool's last hour (`ServerApp.history`, sampled every `step` s while this server
    leads) for the charts, limited to the pools the caller may see, as Snapshot is."""
    query = request.query
    for name in query:
        if name not in ("pool", "since"):
            raise HttpError(400, f"unknown query parameter {name!r}")
    pool = query.get("pool") or None
    since = _since(query["since"]) if query.get("since") else None
    try:
        seen = pool_filter(set() if pool is None else {pool}, current_principal())
        known_pools(set() if pool is None else {pool}, gw.app.scheduler.pools)
    except Refused as e:
        raise HttpError.of_grpc(e.code, e.message) from None
    out = gw.app.history.series(pool, since)
    if seen is not None:
        out["pools"] = {name: pts for name, pts in out["pools"].items() if name in seen}
    return json_answer(out)


# --- the event stream ----------------------------------------------------------------------------


def _names(query: MultiDict[str], name: str) -> set[str]:
    return {item.strip() for v in query.getall(name, []) for item in v.split(",") if item.strip()}


def _event(ev: pb.StatusEvent, kind: str) -> bytes:
    data = {
        "id": str(ev.id),
        "pool": ev.pool,
        "key": ev.key,
        "kind": kind,
        "status": STATUS_NAMES[ev.status - 1],
        "attempt": ev.attempt,
        "at_unix_ns": str(ev.at_unix_ns),
        "message": ev.message,
    }
    return b"data: " + json.dumps(data, sort_keys=True, ensure_ascii=False).encode() + b"\n\n"


async def events(gw: Gateway, request: web.Request) -> web.StreamResponse:
    """Server-sent events from the registered Watch (so shards merge) with every transition,
    filtered by status and kind here; ends when the client leaves (aiohttp cancels the route,
    which closes the Watch) or when the scheduler stops (which ends the Watch)."""
    query: MultiDict[str] = MultiDict(request.query)
    for name in query:
        if name not in ("pool", "kind", "status"):
            raise HttpError(400, f"unknown query parameter {name!r}")
    wanted = ",".join(sorted(_names(query, "status")))
    statuses = set(json_messages.list_request(MultiDict(status=wanted)).statuses)
    kinds = _names(query, "kind")
    handler = gw.app.methods.get(_T + "Watch")
    if handler is None or handler.unary_stream is None:
        raise HttpError(501, "Watch is not served")
    message = pb.WatchRequest(pools=sorted(_names(query, "pool")), all_transitions=True)
    # no deadline: the stream lasts as long as the client stays
    context = cast(Any, Call(request.headers.items(), None))
    watch = cast(AsyncGenerator[pb.StatusEvent, None], handler.unary_stream(message, context))
    async with contextlib.aclosing(watch):
        following: asyncio.Future[pb.StatusEvent] = asyncio.ensure_future(anext(watch))
        try:
            # The Watch refuses (403, 404 for an unknown pool, 503) in its first step, before it
            # waits for events: let that step run, so that a refusal is still an HTTP status.
            await asyncio.sleep(0)
            if following.done() and following.exception() is not None:
                try:
                    following.result()
                except Aborted as e:
                    raise HttpError.of_grpc(e.code, e.details) from None
            engine = _engine(gw)
            response = web.StreamResponse(headers=_SSE_HEADERS)
            await response.prepare(request)
            await response.write(PING)
            try:
                while True:
                    done, _ = await asyncio.wait({following}, timeout=PING_S)
                    if not done:
                        await response.write(PING)
                        continue
                    ev = following.result()
                    following = asyncio.ensure_future(anext(watch))
                    kind = _kind(engine, ev)
                    if (not statuses or ev.status in statuses) and (not kinds or kind in kinds):
                        await response.write(_event(ev, kind))
            except (StopAsyncIteration, Aborted, ConnectionError):
                pass  # the Watch ended (the scheduler stopped, it fell behind) or the client left
        finally:
            if not following.done():
                following.cancel()
                with contextlib.suppress(BaseException):
                    await following
    return response


def _kind(engine: Engine, ev: pb.StatusEvent) -> str:
    """The kind of the event's task from the own shard's record ("" for another shard's)."""
    rec = engine.lookup(ev.id)
    return "" if rec is None else rec.kind


_T = "/cronoq.v1.Tasks/"
_A = "/cronoq.v1.Admin/"

ROUTES: tuple[Route, ...] = (
    Route("GET", "/", index, None, api=False),
    Route("GET", "/ui/api/info", info, None, api=False),
    Route("GET", "/ui/api/shards", shards, _A + "Snapshot"),
    Route("GET", "/ui/api/tasks/{id}", task_detail, _T + "Get"),
    Route("GET", "/ui/api/events", events, _T + "Watch"),
    Route("GET", "/ui/api/history", history, _A + "Snapshot"),
    Route("GET", "/ui/{name}", static, None, api=False),
)
