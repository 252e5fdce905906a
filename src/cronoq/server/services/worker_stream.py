"""`cronoq.v1.Workers/Work`: worker protocol v3 over one bidirectional stream per worker.

`WorkService` is both the gRPC servicer and the scheduler's launcher (`cronoq.runtime.Launcher`):
the scheduler hands it the attempts it started (after they are durable, with a store) and the
ones it gave up; the service turns them into `lease` and `abort` messages on the right worker's
stream, and turns what workers send into `worker_leases.Workers` calls, then kicks the scheduler
so it decides what follows. Each stream has a bounded outbound queue sized for its
current grant (resized as the grant changes): a worker that stops reading is disconnected (its
leases retry elsewhere) rather than allowed to miss a lease or an abort. A worker registers
only for pools and with labels its credential allows (`auth.current_principal()`,
docs/server.md, "Authentication"), else PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from ...core.engine import Engine
from ...core.model import Attempt
from ...proto.cronoq.v1 import cronoq_pb2 as pb
from ...proto.cronoq.v1 import cronoq_pb2_grpc
from ..auth import Principal, current_principal
from ..convert import CONTENT_TYPE_TAG, priority_to_pb
from ..decode import Undecodable
from ..errors import Refused
from ..logs import event
from ..tracing import ServerTracing
from .worker_leases import PROTOCOL_VERSION, RemoteWorker, WorkerError, Workers

log = logging.getLogger("cronoq.server")


REGISTER_TIMEOUT = 10.0
# What workers are told when this server loses the leadership, and how long their streams stay
# open after it.
NOT_LEADER = "this server is no longer the leader"
NOT_LEADER_LINGER_S = 1.0
MAX_FAIL_MESSAGE = 8192
# Durations from clients: at most 100 years (docs/reference/limits.md, "Fixed limits").
MAX_DURATION = 100 * 365 * 86400.0
_CODES = {
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
}


class _Stream:
    """One worker's outbound side: batches of messages the stream's writer drains, at most
    `limit` messages not yet taken by it.

    A batch is what one hand-over queued for this worker (the leases of one launch): the
    writer wakes once per batch rather than once per message."""

    def __init__(self, worker: RemoteWorker) -> None:
        self.worker = worker
        # (unbounded for asyncio: `send` enforces `limit`, which follows the grant)
        self.queue: asyncio.Queue[list[pb.ServerMessage] | None] = asyncio.Queue()
        self.pending = 0  # messages queued and not yet taken by the writer
        self.limit = 0
        self.resize()
        self.overflowed = False
        self.cut = False  # ended with its queue dropped: the writer sends nothing more

    def resize(self) -> None:
        """Bound the buffer by the worker's current grant; call whenever the grant changes.

        Two messages (a lease and its abort) per granted slot, or per lease still held when
        the grant shrinks below them, plus 8 for the rest (registered, shutdown)."""
        w = self.worker
        self.limit = 2 * max(w.granted, len(w.leases)) + 8

    def full(self) -> bool:
        return self.pending >= self.limit

    def send(self, msgs: list[pb.ServerMessage]) -> bool:
        """Queue `msgs` as one batch, unless that takes the stream over its limit."""
        if self.pending + len(msgs) > self.limit:
            self.overflowed = True
            return False
        self.pending += len(msgs)
        self.queue.put_nowait(msgs)
        return True


class WorkService(cronoq_pb2_grpc.WorkersServicer):
    """Remote workers for one scheduler: servicer of Workers/Work and its Launcher."""

    def __init__(
        self,
        *,
        pool_max: Mapping[str, int],
        pool_slot_caps: Mapping[str, int | None],
        slot_cap: int | None,
        max_message_bytes: int,
        register_timeout: float = REGISTER_TIMEOUT,
        max_tags: int = 32,
        max_tag_len: int = 256,
        clock: Callable[[], float] = time.time,
        redirect: Callable[[str], Refused | None] | None = None,
    ) -> None:
        """`max_tags`/`max_tag_len`: limits.max_tags and max_tag_len, which bound the labels and
        the name a worker registers with, as they bound a task's tags. `clock`: the scheduler's
        clock (`Scheduler.clock`), read for every report to the engine. `redirect(pool)`: the
        refusal of a Register for a pool another shard serves (docs/sharding.md, "Workers")."""
        self._clock = clock
        self._redirect = redirect
        self._pool_max = dict(pool_max)
        self._pool_caps = dict(pool_slot_caps)
        self._slot_cap = slot_cap
        self._max_message_bytes = max_message_bytes
        self._register_timeout = register_timeout
        self._max_tags = max_tags
        self._max_tag_len = max_tag_len
        self.workers: Workers | None = None
        self._kick: Callable[[], None] = lambda: None
        self._streams: dict[int, _Stream] = {}
        self._ttl: dict[str, float | None] = {}
        self.tracing: ServerTracing | None = None  # the server's spans, when on

    # --- Launcher ------------------------------------------------------------------------

    def bind(self, engine: Engine, kick: Callable[[], None]) -> None:
        """A scheduler session started: workers of an earlier session are gone with it."""
        for st in list(self._streams.values()):
            self._close(st)
        self.workers = Workers(
            engine,
            pool_max=self._pool_max,
            pool_slot_caps=self._pool_caps,
            slot_cap=self._slot_cap,
        )
        self._ttl = {name: cfg.lease_ttl for name, cfg in engine.configs.items()}
        self._kick = kick

    def launch(self, starts: list[Attempt]) -> None:
        assert self.workers is not None
        now = self._clock()
        assigned = self.workers.assign(starts, now)
        batches: dict[RemoteWorker, list[pb.ServerMessage]] = {}
        for w, att in assigned:
            batch = batches.get(w)
            if batch is None:
                batch = batches[w] = []
            batch.append(self._lease(att))
        for w, batch in batches.items():
            self._send(w, batch)
        tracing = self.tracing
        if tracing is not None:
            for w, att in assigned:
                tracing.dispatched(att, w.id, w.name, now)
        if len(assigned) < len(starts):
            self._kick()  # some failed for want of a worker: the scheduler retries them

    def abort(self, aborts: list[Attempt]) -> None:
        if self.workers is None:
            return
        for w, att in self.workers.aborted(aborts):
            reason = att.abort_reason or "aborted"
            self._send(w, [pb.ServerMessage(abort=pb.Abort(lease=att.lease, reason=reason))])

    def lost(self, reason: str) -> None:
        """Leadership lost (or the store failed): workers reconnect at once, to the new leader
        (docs/server.md, "Standby"). They get the one reason of a lost leadership (why it was
        lost is in the server's log) and a second to read it before their streams end."""
        self.shutdown(NOT_LEADER, not_leader=True, linger=NOT_LEADER_LINGER_S)

    def shutdown(self, reason: str, *, not_leader: bool, linger: float = 0.0) -> None:
        """Tell every worker the server goes away, then end their streams (`linger` seconds
        later: they leave this server's set at once either way)."""
        for st in list(self._streams.values()):
            st.send([pb.ServerMessage(shutdown=pb.Shutdown(reason=reason, not_leader=not_leader))])
            if linger:
                self._streams.pop(st.worker.id, None)
                asyncio.get_running_loop().call_later(linger, self._close, st)
            else:
                self._close(st)

    def worker_infos(self, pool: str | None = None) -> list[pb.WorkerInfo]:
        """The connected workers (Admin.ListWorkers), oldest first."""
        if self.workers is None:
            return []
        return [
            pb.WorkerInfo(
                id=w.id,
                name=w.name,
                pool=w.pool,
                labels=w.labels,
                slots=w.granted,
                busy=len(w.leases),
                connected_unix_ns=int(w.registered_at * 1e9),
            )
            for w in self.workers.workers(pool)
        ]

    @staticmethod
    def _lease(att: Attempt) -> pb.ServerMessage:
        """The lease message of an attempt, filled in place (a Lease built apart and passed
        to ServerMessage is copied), setting only what differs from proto3's defaults: the
        same bytes for a third of the cost."""
        rec = att.task
        out = pb.ServerMessage()
        msg = out.lease
        msg.lease = att.lease  # (leases count from 1: this sets the oneof)
        msg.task_id = rec.id
        msg.attempt = att.number
        if rec.payload and isinstance(rec.payload, bytes):
            msg.payload = rec.payload
        if rec.kind:
            msg.kind = rec.kind
        if rec.key:
            msg.key = rec.key
        msg.pool = rec.pool
        msg.priority = priority_to_pb(rec.cls)
        tags = rec.tags
        if tags:  # (a map argument costs even when empty: set it only when there are tags)
            msg.content_type = tags.get(CONTENT_TYPE_TAG, "")
            msg.tags.update({k: v for k, v in tags.items() if not k.startswith("cronoq.")})
        if rec.timeout is not None:
            msg.timeout_s = rec.timeout
        if rec.deadline is not None:
            msg.deadline_unix_ns = int(rec.deadline * 1e9)
        if att.lease_ttl is not None:
            msg.lease_ttl_s = att.lease_ttl
        return out

    def _send(self, w: RemoteWorker, msgs: list[pb.ServerMessage]) -> None:
        st = self._streams.get(w.id)
        if st is not None and not st.send(msgs):
            event(log, logging.WARNING, "worker_overflow", worker=w.id, pool=w.pool)
            self._close(st)

    def _close(self, st: _Stream) -> None:
        """End a stream from the server's side (its writer stops; the reader then drops it)."""
        self._streams.pop(st.worker.id, None)
        if st.overflowed or st.full():  # the end marker goes first: what is queued goes unsent
            st.cut = True
            while not st.queue.empty():
                st.queue.get_nowait()
            st.pending = 0
        st.queue.put_nowait(None)

    # --- the stream ----------------------------------------------------------------------

    async def Work(
        self, request_iterator: AsyncIterator[pb.WorkerMessage], context: Any
    ) -> AsyncIterator[pb.ServerMessage]:
        if self.workers is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is not serving")
        caller = current_principal()
        try:
            first = await asyncio.wait_for(anext(request_iterator), self._register_timeout)
        except (TimeoutError, StopAsyncIteration):
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"register was not sent within {self._register_timeout:g} s",
            )
        except Undecodable as e:
            await context.abort(e.code, str(e))
        try:
            st = self._register(first, caller)
        except Refused as cut:
            await context.abort(cut.code, cut.message, trailing_metadata=cut.trailers)
        reader = asyncio.ensure_future(self._read(st, request_iterator, context))
        try:
            while (batch := await st.queue.get()) is not None:
                for msg in batch:
                    if st.cut:  # (ended while full: the rest of this batch goes unsent too)
                        break
                    st.pending -= 1
                    yield msg
            if st.overflowed:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "the worker does not read its stream: its outbound buffer is full",
                )
            # (a reader cancelled before its first step has no result: only a CancelledError)
            violation = reader.result() if reader.done() and not reader.cancelled() else None
            if violation is not None:
                await context.abort(violation.code, violation.message)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._drop(st)

    def _register(self, first: pb.WorkerMessage, caller: Principal) -> _Stream:
        if first.WhichOneof("msg") != "register":
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be register")
        reg = first.register
        if reg.protocol_version < PROTOCOL_VERSION:  # a newer worker is served as version 3
            version = reg.protocol_version or 1  # (a worker of version 1 did not send it)
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker protocol version {version} is not supported: this server needs"
                f" version {PROTOCOL_VERSION} (upgrade the worker)",
            )
        texts = [reg.worker_name, *reg.labels.keys(), *reg.labels.values()]
        if any("\0" in t for t in texts):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "register: NUL in a name or label")
        if len(reg.labels) > self._max_tags:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"register.labels: at most limits.max_tags={self._max_tags} labels",
            )
        if any(len(t.encode()) > self._max_tag_len for t in texts):
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"register: a name or label longer than limits.max_tag_len={self._max_tag_len}",
            )
        if not caller.sees(reg.pool):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"register.pool: credentials do not allow pool {reg.pool!r}",
            )
        if not caller.may_claim(reg.labels):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "register.labels: claims labels your credential does not allow",
            )
        elsewhere = None if self._redirect is None else self._redirect(reg.pool)
        if elsewhere is not None:
            raise elsewhere
        assert self.workers is not None
        try:
            w = self.workers.register(
                reg.pool, reg.slots, reg.worker_name, dict(reg.labels), self._clock()
            )
        except WorkerError as e:
            raise Refused(_CODES[e.code], e.message) from None
        st = self._streams[w.id] = _Stream(w)
        registered = pb.Registered(
            worker_id=w.id,
            slots=w.granted,
            protocol_version=PROTOCOL_VERSION,
            max_message_bytes=self._max_message_bytes,
        )
        ttl = self._ttl.get(w.pool)
        if ttl is not None:
            registered.lease_ttl_s = ttl
        st.send([pb.ServerMessage(registered=registered)])  # before any lease can be queued
        event(log, logging.INFO, "worker_registered", worker=w.id, pool=w.pool, slots=w.granted)
        self._kick()
        return st

    async def _read(
        self, st: _Stream, request_iterator: AsyncIterator[pb.WorkerMessage], context: Any
    ) -> Refused | None:
        """Handle the worker's messages until its stream ends; a violation ends it early.

        The call can end under the reader (the worker went away, the server is stopping):
        grpcio then raises from the request iterator whatever it raises for a read after
        the end (a cancellation, UsageError, a server-stopped error). That is the stream's
        end, not a failure of ours, and is not logged as one."""
        try:
            async for msg in request_iterator:
                self._handle(st, msg)
        except Refused as cut:
            self._close(st)
            return cut
        except Undecodable as e:  # not a WorkerMessage, or over limits.max_message_bytes
            self._close(st)
            return Refused(e.code, str(e))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception as e:
            if not (context.done() or context.cancelled()):
                # a bug of ours: end this stream (never leave a ghost worker)
                log.exception("worker_stream_failed", extra={"fields": {"worker": st.worker.id}})
                self._close(st)
                return Refused(grpc.StatusCode.INTERNAL, "the server failed handling this stream")
            log.debug("worker stream %d ended during a read: %r", st.worker.id, e)
        self._close(st)
        return None

    def _handle(self, st: _Stream, msg: pb.WorkerMessage) -> None:
        w = st.worker
        ws = self.workers
        assert ws is not None
        now = self._clock()
        kind = msg.WhichOneof("msg")
        if kind == "heartbeat":
            ws.heartbeat(w, msg.heartbeat.lease, now)
            return
        if kind == "complete":
            ws.complete(w, msg.complete.lease, msg.complete.output, now)
        elif kind == "fail":
            f = msg.fail
            message = f.message.encode()[:MAX_FAIL_MESSAGE].decode(errors="ignore")
            retry_after = f.retry_after_s if f.HasField("retry_after_s") else None
            if retry_after is not None and not 0.0 <= retry_after <= MAX_DURATION:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"fail.retry_after_s: invalid duration {retry_after!r}"
                    " (must be finite and within [0, 100 years])",
                )
            ws.fail(w, f.lease, message, now, permanent=f.permanent, retry_after=retry_after)
        elif kind == "set_slots":
            ws.set_slots(w, msg.set_slots.slots, now)
            st.resize()  # before the kick below can queue leases for the new grant
        elif kind == "nack":
            reason = msg.nack.reason.encode()[:MAX_FAIL_MESSAGE].decode(errors="ignore")
            moved = ws.nack(w, msg.nack.lease, now, reason)
            if moved is not None:
                other, att = moved
                self._send(other, [self._lease(att)])
        elif kind == "cancelled":
            ws.cancelled(w, msg.cancelled.lease, now)
        elif kind == "register":
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "register was already sent")
        else:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "a worker message without a case set")
        self._kick()

    def _drop(self, st: _Stream) -> None:
        """The stream ended: the worker's slots go and its leases retry elsewhere."""
        self._streams.pop(st.worker.id, None)
        if self.workers is not None and not st.worker.gone:
            self.workers.drop(st.worker, self._clock())
            event(log, logging.INFO, "worker_gone", worker=st.worker.id, pool=st.worker.pool)
            self._kick()
