"""The native transport (docs/server.md, "Transports"): the gRPC port served by `cronoq._native`.

grpcio spends most of a Python server's time on its own per-message work. With the native
transport, a Rust thread of this process (tokio and h2, `native/`) speaks HTTP/2 and gRPC's
framing, and hands this module, once per wake of the event loop, every call opened, request
message read, half-close and cancellation since the last wake. Protobuf, the interceptors
(decoding, authentication, roles, readiness, request timeout) and the servicers stay in
Python and are the very ones grpcio runs: `NativeFront` resolves each call's handler through
the app's interceptor chain (`calls.resolver`), runs it in a task of its own (so that the
principal the interceptors set is the call's alone) and hands the serialized answers back: a
streaming call's once per loop turn (`_Outbox`), a unary call's at once, within its connection's
budget of unsent answers (inflight.py). However a call's task ends, even cancelled before it
ever ran, `_ended` frees its place and answers it (unless its client is gone) exactly once.

What grpcio does for its servicers is done here the same way: limits.max_concurrent_requests
(RESOURCE_EXHAUSTED past it), the send limit (limits.max_message_bytes), `grpc-timeout`
deadlines, an UNIMPLEMENTED "Method not found!" for a path no service has, UNKNOWN for a
handler's exception, and the drain of `stop()`. The Rust side keeps the receive limit
(`decode.receive_limit`), the server's keepalive pings and the HTTP/2 stream limit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from ..config import LimitsSettings, SocketAddress, TlsSettings
from ..decode import Handler, receive_limit
from ..inflight import UNREAD, Fullness
from .calls import Aborted, Call, CallDetails, resolver

if TYPE_CHECKING:
    from cronoq import _native

log = logging.getLogger("cronoq.server")

# Event kinds of `Transport.drain()` (native/src/lib.rs).
_CALL, _MESSAGE, _HALF_CLOSE, _GONE, _WRITABLE = 0, 1, 2, 3, 4
# grpcio's own words for what it refuses itself, so that clients see the same statuses.
METHOD_NOT_FOUND = "Method not found!"
TOO_MANY_CALLS = "Concurrent RPC limit exceeded!"
DEADLINE = "Deadline Exceeded"
OVER_BUDGET = -2  # `Transport.send` of an answer its connection cannot hold (inflight.py)

Serializer = Callable[[Any], bytes]
_Status = tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]  # code, details, trailers
_CANCELLED: _Status = (grpc.StatusCode.CANCELLED, "Cancelled", ())


def _identity(data: Any) -> Any:
    return data


class _Inbox:
    """A call's request messages, as the transport read them, until the client half-closes."""

    __slots__ = ("_items", "_waiter", "closed")

    def __init__(self) -> None:
        self._items: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def put(self, data: bytes) -> None:
        self._items.append(data)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> bytes | None:
        """The next message; None once the client half-closed and every message was read."""
        while not self._items:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()


class _NativeContext(Call):
    """The servicer context of a native call: calls.Call (metadata, deadline, `abort`) with
    the call's peer, its client certificate's DNS names, and its initial metadata sent at once."""

    def __init__(
        self,
        front: NativeFront,
        call_id: int,
        metadata: Sequence[tuple[str, Any]],
        timeout_s: float | None,
        peer: str,
        dns_names: Sequence[str],
    ) -> None:
        super().__init__(metadata, timeout_s)
        self._front = front
        self._id = call_id
        self._peer = peer
        self._auth = {"peer_dns": [n.encode() for n in dns_names]} if dns_names else {}
        self.finished = False
        self.gone = False

    def auth_context(self) -> dict[str, list[bytes]]:
        return dict(self._auth)

    def peer(self) -> str:
        return self._peer

    def done(self) -> bool:
        return self.finished or self.gone

    def cancelled(self) -> bool:
        return self.gone

    async def send_initial_metadata(self, metadata: Any) -> None:
        self._front.outbox.flush_call(self._id)
        self._front.transport.headers(self._id, list(metadata))


class _Outbox:
    """Answers waiting for the end of the loop turn, by call: one `Transport.send` per call
    per turn, whatever number of messages its handler yielded meanwhile.

    Backpressure, as grpcio's awaited writes give it: a streaming handler whose client reads
    slower than it answers waits in `answer` while more than HIGH_WATER bytes of its answers
    wait in the transport (for the client's HTTP/2 window), until they are down to LOW_WATER
    (the transport's WRITABLE event). So a lagging Watch falls behind the scheduler's events,
    and a worker that stops reading fills its stream's queue, as over grpcio."""

    def __init__(self, transport: _native.Transport, high_water: int) -> None:
        self._transport = transport
        self._high = high_water
        self._pending: dict[int, list[bytes]] = {}
        self._sizes: dict[int, int] = {}
        self._full: dict[int, asyncio.Future[None] | None] = {}  # over HIGH_WATER, by call
        self._loop = asyncio.get_running_loop()

    def send(self, call_id: int, data: bytes) -> int:
        """Queue `data`; the bytes of the call's answers queued here so far this turn."""
        queued = self._pending.get(call_id)
        if queued is not None:
            queued.append(data)
            size = self._sizes[call_id] = self._sizes[call_id] + len(data)
            return size
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending[call_id] = [data]
        self._sizes[call_id] = len(data)
        return len(data)

    async def answer(self, call_id: int, data: bytes) -> None:
        """Queue one answer of a streaming call, and wait while its client lags."""
        if self.send(call_id, data) <= self._high and call_id not in self._full:
            return
        self.flush_call(call_id)
        if call_id in self._full:
            waiter = self._full[call_id] = self._loop.create_future()
            await waiter

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        self._sizes.clear()
        for call_id, messages in pending.items():
            self._sent(call_id, messages)

    def flush_call(self, call_id: int) -> None:
        messages = self._pending.pop(call_id, None)
        self._sizes.pop(call_id, None)
        if messages:
            self._sent(call_id, messages)

    def _sent(self, call_id: int, messages: list[bytes]) -> None:
        if self._transport.send(call_id, messages) > self._high:
            self._full.setdefault(call_id, None)

    def writable(self, call_id: int) -> None:
        """The transport's WRITABLE event (or the call's end): a waiting answer goes on."""
        waiter = self._full.pop(call_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class NativeFront:
    """The public gRPC port on the native transport (see the module docstring).

    `methods` and `generic`: the handlers by method path and the generic handlers, as grpcio
    would be given them (the app's are size-checked: see `grpcio.MethodTable`); `interceptors`:
    the chain grpcio would run (the app's, then its readiness gate), whose last continuation
    returns the handler of `methods`, else the first a generic handler gives."""

    def __init__(
        self,
        methods: Mapping[str, Handler],
        generic: Sequence[grpc.GenericRpcHandler],
        interceptors: Iterable[grpc.aio.ServerInterceptor],
        limits: LimitsSettings,
        tls: TlsSettings | None = None,
    ) -> None:
        self._limits = limits
        self._tls = tls

        async def served(d: grpc.HandlerCallDetails) -> Handler | None:
            handler = methods.get(d.method)
            for other in generic:
                if handler is not None:
                    break
                handler = other.service(d)
            return handler

        self._resolve = resolver(interceptors, served)
        self._calls: dict[int, tuple[_NativeContext, _Inbox, asyncio.Task[_Status]]] = {}
        self._idle: asyncio.Event | None = None  # set while no call is open (stop() waits)
        self.fullness = Fullness(limits.max_concurrent_requests)
        self._transport: _native.Transport | None = None
        self.outbox: _Outbox

    async def start(self, address: SocketAddress) -> int:
        """Listen on `address` (OSError if it cannot); the bound port."""
        from cronoq import _native  # (optional: config.native_built())

        limits = self._limits
        tls: dict[str, bytes | None] = {}
        if self._tls is not None:
            tls = {
                "tls_cert": _read(self._tls.cert),
                "tls_key": _read(self._tls.key),
                "client_ca": None if self._tls.client_ca is None else _read(self._tls.client_ca),
            }
        transport = _native.Transport(
            address.host,
            address.port,
            max_receive_bytes=receive_limit(limits.max_message_bytes),
            max_unsent_bytes=limits.max_unsent_bytes_per_connection,
            max_concurrent_streams=limits.max_concurrent_streams,
            keepalive_interval_s=limits.keepalive_interval_s,
            keepalive_timeout_s=limits.keepalive_timeout_s,
            **tls,
        )
        self.outbox = _Outbox(transport, _native.HIGH_WATER)
        asyncio.get_running_loop().add_reader(transport.fileno(), self._wake)
        self._transport = transport  # (serving: stop() has something to stop)
        return transport.port

    @property
    def transport(self) -> _native.Transport:
        assert self._transport is not None, "not started"
        return self._transport

    @property
    def unsent_bytes(self) -> int:
        return self.transport.unsent_bytes()

    def stop_listening(self) -> None:
        """No new connections or calls; open calls go on."""
        if self._transport is not None:
            self._transport.stop_accepting()

    async def stop(self, grace: float) -> None:
        """grpcio's `stop(grace)`: open calls get `grace` seconds, then are cancelled; then every
        connection closes."""
        if self._transport is None:
            return
        self.stop_listening()
        if self._calls:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()
        tasks = [task for _, _, task in self._calls.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self.outbox.flush()
        asyncio.get_running_loop().remove_reader(self.transport.fileno())
        await asyncio.to_thread(self.transport.close)

    # --- events ---

    def _wake(self) -> None:
        calls = self._calls
        for event in self.transport.drain():
            kind = event[0]
            if kind == _MESSAGE:
                entry = calls.get(event[1])
                if entry is not None:
                    entry[1].put(event[2])
            elif kind == _CALL:
                self._open(*event[1:])
            elif kind == _HALF_CLOSE:
                entry = calls.get(event[1])
                if entry is not None:
                    entry[1].close()
            elif kind == _WRITABLE:
                self.outbox.writable(event[1])
            else:  # _GONE: the client cancelled, or its connection ended
                self.outbox.writable(event[1])
                entry = calls.get(event[1])
                if entry is not None:
                    entry[0].gone = True
                    entry[2].cancel()

    def _open(
        self,
        call_id: int,
        path: str,
        metadata: list[tuple[str, Any]],
        timeout_s: float | None,
        peer: str,
        dns_names: list[str],
    ) -> None:
        if len(self._calls) >= self._limits.max_concurrent_requests:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
            self.transport.finish(call_id, code, TOO_MANY_CALLS, [])
            return
        context = _NativeContext(self, call_id, metadata, timeout_s, peer, dns_names)
        inbox = _Inbox()
        task = asyncio.get_running_loop().create_task(
            self._serve(call_id, CallDetails(path, tuple(metadata)), context, inbox, timeout_s)
        )
        task.add_done_callback(functools.partial(self._ended, call_id, context))
        self._calls[call_id] = (context, inbox, task)
        self.fullness.count(len(self._calls))

    def _ended(self, call_id: int, context: _NativeContext, task: asyncio.Task[_Status]) -> None:
        """However the call's task ended, even cancelled before it first ran (its client reset
        the call in the batch that opened it): its place is free again, and its client, unless
        gone, gets the one status."""
        del self._calls[call_id]
        self.fullness.count(len(self._calls))
        if self._idle is not None and not self._calls:
            self._idle.set()
        context.finished = True
        if context.gone:
            return
        code, message, trailers = _CANCELLED if task.cancelled() else task.result()
        self.outbox.flush_call(call_id)
        self.transport.finish(call_id, code.value[0], message, list(trailers))

    async def _serve(
        self,
        call_id: int,
        details: CallDetails,
        context: _NativeContext,
        inbox: _Inbox,
        timeout_s: float | None,
    ) -> _Status:
        """The call's status (its end is `_ended`'s)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._run(call_id, details, context, inbox)
        except Aborted as e:
            return e.code, e.details, e.trailers
        except TimeoutError:
            return grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE, ()
        except asyncio.CancelledError:  # stop(): the drain is over (or the client is gone)
            return _CANCELLED
        except Exception as e:
            log.exception("unexpected error serving %s", details.method)
            return grpc.StatusCode.UNKNOWN, f"Unexpected {type(e)}: {e}", ()
        return grpc.StatusCode.OK, "", ()

    async def _run(
        self, call_id: int, details: CallDetails, context: _NativeContext, inbox: _Inbox
    ) -> None:
        handler = await self._resolve(details)
        if handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, METHOD_NOT_FOUND)
        decode = handler.request_deserializer or _identity
        encode: Serializer = handler.response_serializer or _identity
        behaviors: Any = handler  # grpc.aio behaviors, which the stubs type as synchronous
        request: Any
        if handler.request_streaming:
            request = _requests(inbox, decode)
        else:
            request = decode(await _single(inbox, context))
        if handler.unary_unary is not None:
            result = behaviors.unary_unary(request, context)
        elif handler.unary_stream is not None:
            result = behaviors.unary_stream(request, context)
        elif handler.stream_unary is not None:
            result = behaviors.stream_unary(request, context)
        else:
            result = behaviors.stream_stream(request, context)
        limit = self._limits.max_message_bytes
        if inspect.isasyncgen(result):
            send = self.outbox.answer
            async with contextlib.aclosing(result) as answers:
                async for answer in answers:
                    await send(call_id, _encoded(encode, answer, limit))
            return
        answer = await result
        if answer is None:
            return
        # At once rather than at the end of the turn: the connection's budget may refuse it.
        sent = self.transport.send(call_id, [_encoded(encode, answer, limit)], budgeted=True)
        if sent == OVER_BUDGET:
            raise Aborted(grpc.StatusCode.RESOURCE_EXHAUSTED, UNREAD)


async def _requests(inbox: _Inbox, decode: Callable[[bytes], Any]) -> AsyncIterator[Any]:
    while (data := await inbox.get()) is not None:
        yield decode(data)


async def _single(inbox: _Inbox, context: _NativeContext) -> bytes:
    """The one request message of a unary call (grpcio refuses any other count as INTERNAL)."""
    data = await inbox.get()
    if data is None or await inbox.get() is not None:
        await context.abort(
            grpc.StatusCode.INTERNAL, "a unary call carries exactly one request message"
        )
    return data


def _encoded(encode: Serializer, answer: Any, limit: int) -> bytes:
    data = encode(answer)
    if len(data) > limit:  # (grpcio's words for its send limit)
        raise Aborted(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Sent message larger than max ({len(data)} vs. {limit})",
        )
    return data


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()
