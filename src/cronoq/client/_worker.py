"""The remote worker: serves one pool of `cronoq-server` over `Workers/Work` (docs/worker.md).

A `Worker` runs *sessions*: each opens a channel and one bidirectional stream, sends `register`
first, runs every leased attempt as its own asyncio task and reports exactly one outcome per
attempt it finishes. Sessions repeat with backoff until `stop()` or a fatal error; a shard
redirect is followed only when it is safe to send the worker's credential there.

The stream runs on one of two transports (docs/worker.md, "Transports"): the native one, a Rust
HTTP/2 client of `cronoq._native` that hands over the messages read once per wake of the event
loop and takes each loop turn's outgoing messages in one batch, or grpcio. Only `_GrpcioWork`
and `_NativeWork` differ: the session logic (`_dispatch`, leases, outcomes, redirects, stop) is
one for both.

The per-lease path is kept lean on purpose (one task per attempt, a timer handle instead of a
task for heartbeats, one batch of outgoing messages per loop turn): a worker must cost about
what a hand-written stub loop costs per lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlsplit

import grpc
import grpc.aio

from cronoq import __version__
from cronoq._attempt import AttemptMembers, CancellationToken
from cronoq._lifecycle import Lifecycle, table
from cronoq._net import loopback
from cronoq._tracing import (
    ATTR_ATTEMPT,
    ATTR_KIND,
    ATTR_POOL,
    ATTR_PRIORITY,
    ATTR_TASK_ID,
    Traced,
    tracer,
)
from cronoq.core.model import (
    OUTCOME_ABANDONED,
    OUTCOME_CANCELLED,
    OUTCOME_FAILED,
    OUTCOME_SUCCEEDED,
)
from cronoq.errors import Permanent, Retryable
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb

from ._common import (
    CancelTask,
    ClientError,
    Payload,
    Reject,
    encode_payload,
    is_secure,
    metadata,
    open_channel,
    priority_name,
    strip_target,
)

if TYPE_CHECKING:
    from cronoq import _native

__all__ = ["MAX_REDIRECTS", "PROTOCOL_VERSION", "TRANSPORT_ENV", "Handler", "Lease", "Worker"]

log = logging.getLogger("cronoq.client")

PROTOCOL_VERSION = 3
MAX_REDIRECTS = 3

Handler: TypeAlias = Callable[["Lease"], Awaitable[Payload]]

_OVERHEAD = 1024  # bytes of a Complete besides its output: outputs must leave room for them
_BEAT_EARLY = 0.25  # a sweep sends the beats due within this part of their period
_CLOSE_WAIT = 5.0  # how long stop() lets the server end the stream after the half-close
_POLL = 0.1  # stop() re-checks the running leases at least this often while draining
_HEALTHY = 10  # a session longer than this many backoff maxima resets the reconnect delay
_SHARD_ENDPOINT = "cronoq-shard-endpoint"
# Options that name the configured server: wrong for any other host a redirect leads to.
_SERVER_NAME_OPTIONS = frozenset({"grpc.ssl_target_name_override", "grpc.default_authority"})
_FATAL = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
_WORK = "/cronoq.v1.Workers/Work"
TRANSPORT_ENV = "CRONOQ_WORKER_TRANSPORT"  # the transport of a Worker not given one
_TRANSPORTS = ("auto", "native", "grpcio")
# The grpcio options the native transport implements; any other keeps a worker on grpcio.
_NATIVE_OPTIONS = frozenset(
    {
        *_SERVER_NAME_OPTIONS,
        "grpc.max_receive_message_length",
        "grpc.keepalive_time_ms",
        "grpc.keepalive_timeout_ms",
        "grpc.primary_user_agent",
    }
)
_MAX_RECEIVE = 4 << 20  # grpcio's default receive limit
_KEEPALIVE_TIMEOUT_MS = 20_000  # grpcio's default wait for a keepalive ping's answer
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_CANCELLED = grpc.StatusCode.CANCELLED.value[0]
_USER_AGENT = f"cronoq-python/{__version__} (native)"
# By wire value; a value newer than these stubs reads as no priority rather than failing.
_PRIORITIES = {value: priority_name(value) for value in pb.Priority.values()}

_MSG_STOPPING = "worker is stopping"
_MSG_NO_SLOT = "worker has no free slot"
# a span's outcome by the case of the attempt's one message besides a completion or a failure
# (a nack: handed back unrun)
_OUTCOMES = {"cancelled": OUTCOME_CANCELLED, "nack": "handed_back"}


@dataclass
class Lease(AttemptMembers):
    """One attempt handed to the handler: the task's data plus `cancelled`, set when the
    attempt is abandoned (abort, end of the stream, stop), so a handler can notice it.

    `cancelled` stays the published asyncio.Event, so the library's `cancelled()` coroutine
    has no namesake here: `await lease.cancelled.wait()` is it, and `cancellation_token()`,
    `is_cancelled()`, `tag()` and `traceparent()` are the library TaskContext's."""

    id: int
    task_id: int
    attempt: int
    payload: bytes
    content_type: str
    kind: str
    key: str
    tags: dict[str, str]
    timeout: float | None
    deadline: float | None
    pool: str = ""
    priority: str | None = None
    lease_ttl: float | None = None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    _token: CancellationToken = field(
        default_factory=CancellationToken, init=False, repr=False, compare=False
    )

    def is_cancelled(self) -> bool:
        """True once the attempt was abandoned (`cancelled` is set)."""
        return self.cancelled.is_set()

    def json(self) -> Any:
        """The payload decoded as JSON; an empty payload is None (a task submitted without)."""
        return json.loads(self.payload) if self.payload else None

    def text(self) -> str:
        """The payload decoded as UTF-8 (strict)."""
        return self.payload.decode("utf-8")


# A message for the server: a WorkerMessage, or the bytes of one for the per-lease messages
# (completions, heartbeats), which are encoded by hand: building the nested protobuf objects
# cost several times what the whole encoding does.
Outgoing: TypeAlias = pb.WorkerMessage | bytes


def _wire(msg: Outgoing) -> bytes:
    """The serialized form of an outgoing message."""
    return msg if type(msg) is bytes else msg.SerializeToString()  # type: ignore[union-attr]


_BYTES = [bytes((i,)) for i in range(0x80)]  # the one-byte varints


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of an unsigned `n`."""
    if n < 0x80:
        return _BYTES[n]
    out = []
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _lease_body(lease: int) -> bytes:
    """A message whose field 1 is the uint64 lease id: the proto3 default 0 is not written."""
    return b"\x08" + _varint(lease) if lease else b""


def _complete_message(lease: int, output: bytes, content_type: str) -> bytes:
    """WorkerMessage{complete: Complete{lease, output, content_type}}, byte for byte what
    protobuf writes (fields in number order, defaults left out; the oneof case even when its
    message is empty), with the output copied once."""
    head = _lease_body(lease)
    if not output and not content_type:  # (a handler's None: the most common outcome)
        return b"\x1a" + _BYTES[len(head)] + head  # WorkerMessage.complete = 3
    if output:
        head += b"\x12" + _varint(len(output))  # Complete.output = 2
    tail = b""
    if content_type:
        encoded = content_type.encode()
        tail = b"\x1a" + _varint(len(encoded)) + encoded  # Complete.content_type = 3
    size = len(head) + len(output) + len(tail)
    return b"".join((b"\x1a", _varint(size), head, output, tail))


def _heartbeat_message(lease: int) -> bytes:
    """WorkerMessage{heartbeat: Heartbeat{lease}}, as protobuf writes it."""
    body = _lease_body(lease)
    return b"\x12" + _BYTES[len(body)] + body  # WorkerMessage.heartbeat = 2 (< 12 bytes)


class _Outbox:
    """What a grpcio session sends, in order; `None` half-closes the request stream.

    A deque and one waiter future: cheaper than an asyncio.Queue for a message per lease.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Outgoing | None] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, msg: Outgoing | None) -> None:
        self._items.append(msg)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        """Drop what is unsent and end the stream: the session is over, and grpc's task that
        feeds the call from `messages()` must finish rather than wait forever."""
        self._items.clear()
        self.put(None)

    async def messages(self) -> AsyncIterator[Outgoing]:
        items = self._items
        loop = asyncio.get_running_loop()
        while True:
            if not items:
                waiter = self._waiter = loop.create_future()
                await waiter
                continue
            msg = items.popleft()
            if msg is None:
                return
            yield msg


class _NativeOutbox:
    """What a native session sends, in order; `None` half-closes the request stream.

    Each loop turn's messages go to Rust in one `send`, which frames them and writes them
    together: one hand-over and about one DATA frame per turn, not per message.
    """

    __slots__ = ("_call", "_ended", "_items", "_loop")

    def __init__(self, call: _native.ClientCall, loop: asyncio.AbstractEventLoop) -> None:
        self._call = call
        self._loop = loop
        self._items: list[Outgoing] = []
        self._ended = False  # half-closed or closed: nothing more is sent

    def put(self, msg: Outgoing | None) -> None:
        if self._ended:
            return
        if msg is None:
            self._ended = True
            self._call.send([_wire(m) for m in self._items], end=True)
            self._items.clear()
            return
        items = self._items
        if not items:
            self._loop.call_soon(self._flush)
        items.append(msg)

    def _flush(self) -> None:
        items = self._items
        if items and not self._ended:
            self._items = []
            self._call.send([_wire(m) for m in items])

    def close(self) -> None:
        """Drop what is unsent: the session is over."""
        self._ended = True
        self._items.clear()


class _CallEnded(Exception):
    """The Work call ended with a status other than OK, whichever transport carried it;
    `metadata` is its initial metadata followed by its trailing metadata."""

    def __init__(
        self, status: grpc.StatusCode, message: str, metadata: Sequence[tuple[str, Any]]
    ) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message
        self.metadata = tuple(metadata)

    @classmethod
    def of(cls, e: grpc.aio.AioRpcError) -> _CallEnded:
        return cls(
            e.code(),
            e.details() or "",
            (*(e.initial_metadata() or ()), *(e.trailing_metadata() or ())),
        )


# What a session makes of each ServerMessage: None to go on, else the session's end (True when
# the server said it lost its leadership).
Dispatch: TypeAlias = Callable[[pb.ServerMessage], bool | None]


class _GrpcioWork:
    """The Work call on a grpcio channel of its own (the fallback transport)."""

    __slots__ = ("_call", "_channel", "_dispatch", "_metadata", "cut", "outbox")

    def __init__(self, channel: grpc.aio.Channel, md: Any, dispatch: Dispatch) -> None:
        self._channel = channel
        self._metadata = md
        self._dispatch = dispatch
        self._call: grpc.aio.StreamStreamCall[Outgoing, pb.ServerMessage] | None = None
        self.outbox = _Outbox()
        self.cut = False  # stop() cancelled the call itself: its CancelledError ends the session

    async def serve(self) -> bool:
        """Reads and dispatches to the call's end; False for an OK end or a cut, else raises
        _CallEnded."""
        work = self._channel.stream_stream(
            _WORK,
            request_serializer=_wire,
            response_deserializer=pb.ServerMessage.FromString,
        )
        call = self._call = work(self.outbox.messages(), metadata=self._metadata)
        dispatch = self._dispatch
        while True:
            try:
                msg = await call.read()
            except grpc.aio.AioRpcError as e:
                raise _CallEnded.of(e) from e
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self.cut and (task is None or not task.cancelling()):
                    return False
                raise
            if not isinstance(msg, pb.ServerMessage):  # grpc.aio.EOF: the server ended it
                return False
            ended = dispatch(msg)
            if ended is not None:
                return ended

    def cancel(self) -> None:
        self.cut = True
        if self._call is not None:
            self._call.cancel()

    async def close(self) -> None:
        self.outbox.close()
        await self._channel.close()


class _NativeWork:
    """The Work call on `cronoq._native`'s HTTP/2 client, which runs on a thread of its own
    until the call ends: each wake of the loop dispatches every message read since the last."""

    __slots__ = ("_call", "_dispatch", "_fd", "_finished", "_loop", "_result", "cut", "outbox")

    def __init__(
        self, call: _native.ClientCall, loop: asyncio.AbstractEventLoop, dispatch: Dispatch
    ) -> None:
        self._call = call
        self._loop = loop
        self._dispatch = dispatch
        self._result: asyncio.Future[bool] = loop.create_future()
        self._finished = asyncio.Event()  # the call's thread is done: nothing more will come
        self.outbox = _NativeOutbox(call, loop)
        self.cut = False
        self._fd = call.fileno()
        loop.add_reader(self._fd, self._wake)

    async def serve(self) -> bool:
        """As `_GrpcioWork.serve`."""
        return await self._result

    def _wake(self) -> None:
        messages, end, finished = self._call.drain()
        result = self._result
        if not result.done():
            try:
                self._deliver(messages, end)
            except Exception as e:  # (dispatch's bugs end the session, as over grpcio)
                if not result.done():
                    result.set_exception(e)
        if finished:
            self._loop.remove_reader(self._fd)
            self._finished.set()

    def _deliver(self, messages: list[bytes], end: _native.CallEnd | None) -> None:
        result = self._result
        dispatch = self._dispatch
        parse = pb.ServerMessage.FromString
        for data in messages:
            try:
                msg = parse(data)
            except Exception:  # (protobuf's DecodeError: the bytes are no ServerMessage)
                self._call.cancel()
                # (grpcio's words for a response its deserializer refuses)
                refused = "Exception deserializing response!"
                result.set_exception(_CallEnded(grpc.StatusCode.INTERNAL, refused, ()))
                return
            stop = dispatch(msg)
            if stop is not None:
                result.set_result(stop)
                return
        if end is None:
            return
        code, message, initial, trailing = end
        if code == 0 or (self.cut and code == _CANCELLED):
            result.set_result(False)
        else:
            status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
            result.set_exception(_CallEnded(status, message, (*initial, *trailing)))

    def cancel(self) -> None:
        self.cut = True
        self._call.cancel()

    async def close(self) -> None:
        """Cancels the call unless it ended, and waits for its thread (its connection closed)."""
        self.outbox.close()
        self._call.cancel()
        try:
            await self._finished.wait()
        finally:
            if not self._finished.is_set():  # cancelled while waiting: stop reading anyway
                self._loop.remove_reader(self._fd)
            self._call.close()


_Work: TypeAlias = _GrpcioWork | _NativeWork


class _Session:
    """One stream: its transport, its outbox, its heartbeats, and whether the server answered
    the register."""

    __slots__ = ("beats", "closed", "outbox", "registered", "work")

    def __init__(self, beats: _Heartbeats) -> None:
        self.work: _Work
        self.outbox: _Outbox | _NativeOutbox
        self.beats = beats
        self.registered = False
        self.closed = asyncio.Event()


class _Attempt:
    """A running lease: the handler's task, the outbox its outcome goes to, and with a TTL its
    heartbeat period and the loop time its next beat is due."""

    __slots__ = ("due", "lease", "outbox", "period", "task")

    def __init__(self, lease: Lease, outbox: _Outbox | _NativeOutbox) -> None:
        self.lease = lease
        self.outbox = outbox
        self.period = 0.0  # no TTL: no heartbeats
        self.due = 0.0
        self.task: asyncio.Task[Any] | None = None

    def abandon(self) -> None:
        """The server gave this attempt up (or will): tell the handler, report nothing (it has
        left the running leases, so it gets no more heartbeats either)."""
        self.lease.cancelled.set()
        self.lease._token._cancel()
        if self.task is not None:
            self.task.cancel()


class _Heartbeats:
    """The heartbeats of a session's running leases (docs/worker.md, "Heartbeats") on one
    timer, armed for the earliest beat due: most leases end before their first beat, and a
    timer per lease, armed and cancelled, cost more than the rest of its bookkeeping.

    A lease leaves `running` when it ends or is abandoned, which is all it takes to stop its
    beats. A sweep also sends the beats due within `_BEAT_EARLY` of a period from now, so
    leases started close together share sweeps: a beat may be that much early, never late.
    """

    __slots__ = ("_at", "_handle", "_loop", "_running")

    def __init__(self, loop: asyncio.AbstractEventLoop, running: dict[int, _Attempt]) -> None:
        self._loop = loop
        self._running = running
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0

    def add(self, att: _Attempt, ttl: float) -> None:
        """Beat `att` every third of `ttl` (at least every 10 ms), the first a period from now."""
        period = att.period = max(ttl / 3, 0.01)
        due = att.due = self._loop.time() + period
        if self._handle is None or due < self._at:
            self._arm(due)

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = at
        self._handle = self._loop.call_at(at, self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        now = self._loop.time()
        earliest = None
        for att in self._running.values():
            period = att.period
            if not period:
                continue
            due = att.due
            if due - now <= period * _BEAT_EARLY:
                att.outbox.put(_heartbeat_message(att.lease.id))
                due = att.due = now + period
            if earliest is None or due < earliest:
                earliest = due
        if earliest is not None:
            self._arm(earliest)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class WorkerState(Enum):
    """A worker's life cycle on one event loop (docs/worker.md, "Life cycle")."""

    NEW = "new"  # no run() yet (or since the last run() ended)
    RUNNING = "running"  # run(): sessions, reconnecting with backoff
    DRAINING = "draining"  # stop(): no new leases; running ones get `grace` seconds
    STOPPING = "stopping"  # the grace is over: leases abandoned, the stream closing
    ENDED = "ended"  # run() returned or raised; the next run() starts over from NEW


_W = WorkerState
_STOP_BEGUN = frozenset({_W.DRAINING, _W.STOPPING})
WORKER_TRANSITIONS = table(
    WorkerState,
    {
        # stop() before run(): that run() returns at once
        _W.NEW: {_W.RUNNING, _W.DRAINING},
        _W.RUNNING: {_W.DRAINING, _W.ENDED},
        # run() may return while stop() drains (no session to drain); stop() then finishes alone
        _W.DRAINING: {_W.STOPPING, _W.ENDED},
        _W.STOPPING: {_W.ENDED},
        _W.ENDED: {_W.NEW},
    },
)


class _LoopState:
    """What belongs to one event loop: asyncio objects cannot move between loops, so a worker
    used under several `asyncio.run()` calls gets a fresh set on each loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.registered = asyncio.Event()
        self.wake = asyncio.Event()  # ends a backoff wait when stop() begins
        self.idle = asyncio.Event()  # a lease ended while draining
        self.life = Lifecycle("Worker", _W.NEW, WORKER_TRANSITIONS)
        self.shutdown: asyncio.Task[None] | None = None

    def reset(self) -> None:
        """Ready for a new run() after one ended: the events stay the same objects, so
        waiters keep working."""
        self.life.move(_W.NEW)
        self.shutdown = None
        self.wake.clear()
        self.idle.clear()

    @property
    def draining(self) -> bool:
        """stop() has begun (no new leases)."""
        return self.life.state in _STOP_BEGUN  # (read twice per lease: no call of `at`)

    @property
    def stopping(self) -> bool:
        """stop()'s grace is over: what still runs is abandoned."""
        return self.life.at(_W.STOPPING)


def _shard_endpoint(md: Sequence[tuple[str, Any]]) -> str | None:
    for key, value in md:
        if key == _SHARD_ENDPOINT and isinstance(value, str):
            return value
    return None


def _address(target: str) -> tuple[str, int] | None:
    """`(host, port)` of a `host:port` target (scheme and trailing slashes allowed, IPv6 in
    brackets); None for anything else grpcio resolves (`dns:`, `unix:`, no port...)."""
    host, colon, port = strip_target(target).rpartition(":")
    if not colon or not port.isdigit() or not host or int(port) > 65535:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or "/" in host:  # another scheme, or IPv6 without brackets
        return None
    return host, int(port)


def _native_refusal(
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]] | None,
    target: str,
) -> str | None:
    """Why the native transport cannot serve these settings; None when it can."""
    try:
        from cronoq import _native
    except ImportError:
        return "the native extension (cronoq._native) is not built"
    if not hasattr(_native, "ClientCall"):
        return "this build of cronoq._native has no client"
    if credentials is not None:
        return (
            "a grpc.ChannelCredentials object cannot be read outside grpcio"
            " (root_certificates, private_key and certificate_chain can)"
        )
    unknown = sorted({key for key, _ in options or ()} - _NATIVE_OPTIONS)
    if unknown:
        return f"grpcio options it does not implement: {', '.join(unknown)}"
    if _address(target) is None:
        return f"target {target!r} is not host:port"
    return None


def _choose(
    transport: str | None,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]] | None,
    target: str,
) -> str:
    """The transport a worker uses (docs/worker.md, "Transports"): `transport`, else
    CRONOQ_WORKER_TRANSPORT, else auto, which is native wherever native can serve."""
    asked = transport or os.environ.get(TRANSPORT_ENV) or "auto"
    if asked not in _TRANSPORTS:
        source = "transport" if transport else TRANSPORT_ENV
        raise ValueError(f"{source} must be one of {', '.join(_TRANSPORTS)}, not {asked!r}")
    if asked == "grpcio":
        return asked
    refusal = _native_refusal(credentials, options, target)
    if refusal is None:
        return "native"
    if asked == "native":
        raise ValueError(f'transport "native": {refusal}')
    return "grpcio"


def _fail(lease: int, message: str, permanent: bool) -> pb.WorkerMessage:
    return pb.WorkerMessage(fail=pb.Fail(lease=lease, message=message, permanent=permanent))


class Worker:
    """Serves `pool` of the server at `target` with `handler`, `slots` leases at a time."""

    def __init__(
        self,
        target: str,
        pool: str,
        handler: Handler,
        *,
        slots: int = 1,
        token: str | None = None,
        name: str = "",
        tls: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.1, 5.0),
        grace: float = 10.0,
        options: Sequence[tuple[str, Any]] | None = None,
        labels: Mapping[str, str] | None = None,
        insecure_redirect_http: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        transport: str | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, not {slots}")
        pem = (root_certificates, private_key, certificate_chain)
        if credentials is not None and any(p is not None for p in pem):
            raise ValueError("give either credentials or the certificates, not both")
        if (private_key is None) != (certificate_chain is None):
            raise ValueError("a client certificate needs both private_key and certificate_chain")
        self.target = target
        self.pool = pool
        self.handler = handler
        self.slots = slots
        self.name = name
        self.reconnect = reconnect
        self.backoff = backoff
        self.grace = grace
        self.labels = {str(k): str(v) for k, v in (labels or {}).items()}
        self.insecure_redirect_http = insecure_redirect_http
        self._token = token
        self._pem = pem
        self._tls = tls or any(p is not None for p in pem)
        self._credentials = credentials
        self._options = options
        self.transport = _choose(transport, credentials, options, target)
        self._metadata = metadata(token)
        self.worker_id: int | None = None
        self.lease_ttl: float | None = None
        self.granted_slots: int | None = None
        self.server_protocol: int | None = None
        self.max_message_bytes: int | None = None
        self.last_shutdown: str | None = None
        self.connections = 0
        self._running: dict[int, _Attempt] = {}
        self._session: _Session | None = None
        self._ls: _LoopState | None = None
        self._traced: Traced | None = None  # the program's tracing, read as run() starts

    def __repr__(self) -> str:
        return f"Worker({self.target!r}, {self.pool!r}, slots={self.slots})"

    @property
    def running(self) -> int:
        """Leases held now: handler started, no outcome yet, not abandoned."""
        return len(self._running)

    # --- public API ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until `stop()`; raises ClientError for what reconnecting cannot fix
        (docs/worker.md, "Errors that end `run()`")."""
        ls = self._state()
        self._traced = tracer()
        life = ls.life
        if life.at(_W.ENDED):
            ls.reset()
        if life.at(_W.NEW):
            life.move(_W.RUNNING)
        try:
            await self._serve(ls)  # at once when stop() came first (DRAINING, STOPPING)
        finally:
            if not life.at(_W.ENDED):  # (another run() on this loop may have ended it)
                life.move(_W.ENDED)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking leases, let running ones finish for up to `grace` seconds (default
        `self.grace`), cancel the rest and close the stream. Every caller awaits the one
        shutdown, which a caller's cancellation does not interrupt."""
        await asyncio.shield(self.begin_stop(grace))

    def begin_stop(self, grace: float | None = None) -> asyncio.Task[None]:
        """stop() without waiting: no lease is taken from this call on (a coroutine or task
        would only begin on a later turn of the loop, and a lease read meanwhile would run);
        returns the shutdown, which stop() awaits."""
        ls = self._state()
        if ls.shutdown is None:
            life = ls.life
            if life.at(_W.NEW, _W.RUNNING):
                life.move(_W.DRAINING)  # (after run() ended there is nothing to drain)
            ls.wake.set()
            session = self._session
            if session is not None and session.registered:
                session.outbox.put(pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)))
            ls.shutdown = ls.loop.create_task(
                self._shutdown(ls, self.grace if grace is None else grace)
            )
        return ls.shutdown

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Wait for the current session's `registered`; TimeoutError after `timeout` s."""
        await asyncio.wait_for(self._state().registered.wait(), timeout)

    # --- sessions --------------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        ls = self._ls
        if ls is None or ls.loop is not loop:
            ls = self._ls = _LoopState(loop)
            self._running = {}
        return ls

    async def _serve(self, ls: _LoopState) -> None:
        loop = ls.loop
        first, most = self.backoff
        endpoint, redirected = self.target, False
        delay = first
        redirects = 0
        while not (ls.draining or ls.stopping):
            started = loop.time()
            not_leader = False
            try:
                not_leader = await self._session_run(ls, endpoint, redirected)
            except _CallEnded as e:
                if ls.stopping:
                    return
                follow = self._redirect(e, endpoint, redirects)
                if follow is not None:
                    redirects += 1
                    log.info("worker redirected to shard %s (%s)", follow, e.message)
                    endpoint, redirected = follow, True
                    continue
                redirects = 0
                code = e.status
                if code == grpc.StatusCode.UNAVAILABLE and redirected:
                    endpoint, redirected = self.target, False
                if code in _FATAL or not self.reconnect:
                    raise ClientError(code.name.lower(), e.message) from e
                if ls.draining:
                    return
                log.warning("worker stream failed: %s: %s", code.name, e.message)
            else:
                redirects = 0
                if ls.stopping or ls.draining:
                    return
                if not self.reconnect:
                    raise ClientError("unavailable", "worker stream ended")
                log.info("worker stream ended (%s); reconnecting", self.last_shutdown or "closed")
            if not_leader:
                # A leadership change: the new leader is (or is about to be) there, so
                # reconnect at once; a failure after that backs off from the start.
                delay = first
                continue
            if loop.time() - started > _HEALTHY * most:
                delay = first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ls.wake.wait(), delay)
            delay = min(delay * 2, most)

    async def _session_run(self, ls: _LoopState, endpoint: str, redirected: bool) -> bool:
        """One stream, to its end; True when the server said it lost its leadership."""
        register = pb.WorkerMessage(
            register=pb.Register(
                pool=self.pool,
                slots=self.slots,
                worker_name=self.name,
                protocol_version=PROTOCOL_VERSION,
                labels=self.labels,
            )
        )
        options = self._options
        if redirected and options is not None:
            options = [o for o in options if o[0] not in _SERVER_NAME_OPTIONS]
        session = _Session(_Heartbeats(ls.loop, self._running))
        dispatch = functools.partial(self._dispatch, ls, session)
        work: _Work
        if self.transport == "native":
            work = _NativeWork(self._native_call(endpoint, options), ls.loop, dispatch)
        else:
            credentials = self._credentials
            if credentials is None and self._tls:
                credentials = grpc.ssl_channel_credentials(*self._pem)
            channel = open_channel(
                endpoint, tls=self._tls, credentials=credentials, options=options
            )
            work = _GrpcioWork(channel, self._metadata, dispatch)
        session.work = work
        session.outbox = work.outbox
        work.outbox.put(register)
        try:
            self._session = session
            self.connections += 1
            return await work.serve()
        finally:
            self._session = None
            ls.registered.clear()
            self._abandon_all(ls)
            session.beats.close()
            work.outbox.close()
            session.closed.set()
            await work.close()

    def _native_call(
        self, endpoint: str, options: Sequence[tuple[str, Any]] | None
    ) -> _native.ClientCall:
        """The native Work call to `endpoint`, with the grpcio `options` it implements."""
        from cronoq import _native

        address = _address(endpoint)
        assert address is not None, endpoint  # (checked by _choose, and by _redirect)
        opts = dict(options or ())
        override = opts.get("grpc.ssl_target_name_override")
        agent = _USER_AGENT
        if opts.get("grpc.primary_user_agent"):
            agent = f"{opts['grpc.primary_user_agent']} {agent}"
        limit = int(opts.get("grpc.max_receive_message_length", _MAX_RECEIVE))
        root_certificates, private_key, certificate_chain = self._pem
        return _native.ClientCall(
            *address,
            _WORK,
            list(self._metadata or ()),
            authority=opts.get("grpc.default_authority") or override or strip_target(endpoint),
            user_agent=agent,
            max_receive_bytes=limit if limit >= 0 else 1 << 32,
            tls=is_secure(endpoint, self._tls, None),
            server_name=override,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            keepalive_time_s=int(opts.get("grpc.keepalive_time_ms", 0)) / 1000,
            keepalive_timeout_s=int(opts.get("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS))
            / 1000,
        )

    def _dispatch(self, ls: _LoopState, session: _Session, msg: pb.ServerMessage) -> bool | None:
        """Acts on one ServerMessage: None to go on, else the session's end (True when the
        server said it lost its leadership)."""
        kind = msg.WhichOneof("msg")
        if kind == "lease":
            self._on_lease(ls, session, msg.lease)
        elif kind == "abort":
            att = self._running.pop(msg.abort.lease, None)
            if att is not None:
                att.abandon()
                if ls.draining:
                    ls.idle.set()
        elif kind == "registered":
            self._on_registered(ls, session, msg.registered)
        elif kind == "shutdown":
            self.last_shutdown = msg.shutdown.reason or "shutdown"
            return bool(msg.shutdown.not_leader)
        return None

    def _on_registered(self, ls: _LoopState, session: _Session, r: pb.Registered) -> None:
        self.worker_id = r.worker_id
        self.lease_ttl = r.lease_ttl_s if r.HasField("lease_ttl_s") else None
        self.granted_slots = r.slots or self.slots  # a v1 server grants nothing explicitly
        self.server_protocol = r.protocol_version or 1
        self.max_message_bytes = r.max_message_bytes or None
        session.registered = True
        ls.registered.set()

    def _abandon_all(self, ls: _LoopState) -> None:
        running = self._running
        if running:
            attempts = list(running.values())
            running.clear()
            for att in attempts:
                att.abandon()
            ls.idle.set()

    # --- leases ----------------------------------------------------------------------------

    def _hand_back(self, lease: int, reason: str) -> pb.WorkerMessage:
        """Give a lease back unrun: a nack since protocol 2, a retryable fail before."""
        if (self.server_protocol or 1) >= 2:
            return pb.WorkerMessage(nack=pb.Nack(lease=lease, reason=reason))
        return _fail(lease, reason, False)

    def _on_lease(self, ls: _LoopState, session: _Session, m: pb.Lease) -> None:
        running = self._running
        if ls.draining:
            session.outbox.put(self._hand_back(m.lease, _MSG_STOPPING))
            return
        if len(running) >= (self.granted_slots or self.slots):
            session.outbox.put(self._hand_back(m.lease, _MSG_NO_SLOT))
            return
        tags = m.tags
        lease = Lease(
            m.lease,
            m.task_id,
            m.attempt,
            m.payload,
            m.content_type,
            m.kind,
            m.key,
            dict(tags) if tags else {},  # (copying even an empty map costs a microsecond)
            m.timeout_s if m.HasField("timeout_s") else None,
            m.deadline_unix_ns / 1e9 if m.HasField("deadline_unix_ns") else None,
            m.pool or self.pool,
            _PRIORITIES.get(m.priority),
            m.lease_ttl_s if m.HasField("lease_ttl_s") else self.lease_ttl,
        )
        att = _Attempt(lease, session.outbox)
        if lease.lease_ttl:
            session.beats.add(att, lease.lease_ttl)
        running[lease.id] = att
        traced = self._traced
        att.task = ls.loop.create_task(
            self._attempt(ls, att) if traced is None else self._traced_attempt(ls, att, traced)
        )

    async def _traced_attempt(self, ls: _LoopState, att: _Attempt, traced: Traced) -> None:
        """`_attempt` inside the attempt's `cronoq.run` span, a child of the task's trace."""
        lease = att.lease
        attrs = {
            ATTR_TASK_ID: lease.task_id,
            ATTR_KIND: lease.kind,
            ATTR_POOL: lease.pool,
            ATTR_ATTEMPT: lease.attempt,
        }
        if lease.priority is not None:
            attrs[ATTR_PRIORITY] = lease.priority
        with traced.run(lease.tags, attrs) as span:
            msg = await self._attempt(ls, att)
            if msg is None:
                traced.ended(span, OUTCOME_ABANDONED, None)
            elif type(msg) is bytes:
                traced.ended(span, OUTCOME_SUCCEEDED, None)
            elif (case := msg.WhichOneof("msg")) == "fail":  # type: ignore[union-attr]
                traced.ended(span, OUTCOME_FAILED, msg.fail.message)  # type: ignore[union-attr]
            else:
                traced.ended(span, _OUTCOMES[case], None)

    async def _attempt(self, ls: _LoopState, att: _Attempt) -> Outgoing | None:
        """Run the handler and queue its one outcome (docs/worker.md, "Exceptions"), or none if
        abandoned; returns it (a completion as its bytes, the other outcomes as messages)."""
        lease = att.lease
        msg: Outgoing | None
        try:
            try:
                value = await self.handler(lease)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if (
                    lease.cancelled.is_set()
                    or ls.stopping
                    or (task is not None and task.cancelling())
                ):
                    msg = None
                else:
                    msg = _fail(lease.id, "CancelledError: raised by the handler", False)
            except Reject as e:
                msg = self._hand_back(lease.id, str(e) or "rejected by the handler")
            except CancelTask as e:
                if (self.server_protocol or 1) >= 2:
                    msg = pb.WorkerMessage(cancelled=pb.Cancelled(lease=lease.id))
                else:
                    msg = _fail(lease.id, str(e) or "cancelled by the handler", True)
            except Permanent as e:
                msg = _fail(lease.id, str(e) or "permanent failure", True)
            except Retryable as e:
                msg = _fail(lease.id, str(e) or "retryable failure", False)
                if e.retry_after is not None:
                    msg.fail.retry_after_s = float(e.retry_after)
            except Exception as e:
                msg = _fail(lease.id, f"{type(e).__name__}: {e}", False)
            else:
                msg = self._complete(lease.id, value)
        finally:
            running = self._running
            if running.get(lease.id) is att:
                del running[lease.id]
                if ls.draining:
                    ls.idle.set()
        if msg is not None:
            att.outbox.put(msg)
        return msg

    def _complete(self, lease: int, value: Any) -> Outgoing:
        """The completion reporting `value`, or the failure when it cannot be sent."""
        try:
            output, content_type = encode_payload(value)
        except (TypeError, ValueError) as e:
            return _fail(lease, f"handler output is not JSON-serialisable: {e}", True)
        limit = self.max_message_bytes
        if limit is not None and len(output) + _OVERHEAD > limit:
            return _fail(
                lease,
                f"output of {len(output)} bytes exceeds the server's message limit"
                f" of {limit} bytes",
                True,
            )
        return _complete_message(lease, output, content_type)

    # --- redirects -------------------------------------------------------------------------

    def _redirect(self, e: _CallEnded, endpoint: str, redirects: int) -> str | None:
        """The shard endpoint to follow for this error, None when it is no redirect; raises
        ClientError("failed_precondition") for a redirect it must not follow (docs/worker.md,
        "Shard redirects")."""
        if e.status != grpc.StatusCode.FAILED_PRECONDITION:
            return None
        to = _shard_endpoint(e.metadata)
        if to is None:
            return None

        def refuse(why: str) -> ClientError:
            return ClientError("failed_precondition", f"{why}: {e.message}")

        if redirects >= MAX_REDIRECTS:
            raise refuse(f"{redirects + 1} shard redirects in a row (at most {MAX_REDIRECTS})")
        if not to.startswith(("http://", "https://")):
            raise refuse(f"shard endpoint {to!r} is not an http(s) endpoint")
        try:
            parts = urlsplit(to)
            host = parts.hostname
            _ = parts.port
        except ValueError:
            host = None
        if host is None or "@" in parts.netloc:
            raise refuse(f"shard endpoint {to!r} is not a plain host and port")
        if to.startswith("http://"):
            if is_secure(endpoint, self._tls, self._credentials):
                raise refuse(f"refusing to leave TLS for the plaintext shard endpoint {to!r}")
            if self._token and not loopback(host):
                if not self.insecure_redirect_http:
                    raise refuse(
                        f"refusing to send the token in plaintext to shard endpoint {to!r}"
                        " (insecure_redirect_http=True allows it)"
                    )
                log.warning("sending the worker token in plaintext to shard endpoint %s", to)
        return to

    # --- stop ------------------------------------------------------------------------------

    async def _shutdown(self, ls: _LoopState, grace: float) -> None:
        life = ls.life
        loop = ls.loop
        end = loop.time() + grace
        while self._running:
            left = end - loop.time()
            if left <= 0:
                break
            ls.idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ls.idle.wait(), min(left, _POLL))
        if life.at(_W.DRAINING):
            life.move(_W.STOPPING)
        self._abandon_all(ls)
        session = self._session
        if session is None:
            return
        session.outbox.put(None)
        try:
            await asyncio.wait_for(session.closed.wait(), _CLOSE_WAIT)
        except TimeoutError:
            session.work.cancel()
