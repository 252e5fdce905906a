"""A raw HTTP/2 peer for the connection tests: one TCP connection to a gRPC listener, driven
frame by frame with the `h2` package, so that a test decides when pings go out, which calls are
open, and whether the server's frames are read (and so its pings acknowledged) at all.

Everything runs in the calling thread: `pump` reads what the server sent, feeds it to h2 (which
acknowledges the server's pings and SETTINGS as it parses them) and writes what h2 has queued.
A peer that stops calling `pump` leaves the server's frames unread and its pings unanswered: a
half-open peer, as far as the server can tell. A peer made with `window=0` lets the server send
no DATA at all: its streams' flow-control window is 0 and it never sends WINDOW_UPDATE, so every
answer stays with the server (a client that never reads its answers).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

WAIT_S = 30.0  # only a safety net that fails a hung exchange; a busy machine may be slow


def frame(message: Any) -> bytes:
    """A gRPC length-prefixed message (not compressed)."""
    body: bytes = message.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


class Stream:
    """What the server sent on one stream."""

    def __init__(self) -> None:
        self.buffer = b""
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.ended = False
        self.reset: int | None = None  # the RST_STREAM error code

    def take(self) -> bytes | None:
        """The next complete gRPC message's bytes, if one has arrived whole."""
        if len(self.buffer) < 5:
            return None
        (length,) = struct.unpack(">I", self.buffer[1:5])
        if len(self.buffer) < 5 + length:
            return None
        body, self.buffer = self.buffer[5 : 5 + length], self.buffer[5 + length :]
        return body


class H2Peer:
    """An HTTP/2 client connection to `address` ("host:port", plain text); `window`: the
    initial flow-control window of its streams (None: h2's default, given back as data comes)."""

    def __init__(self, address: str, *, window: int | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.authority = address
        self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=WAIT_S)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.streams: dict[int, Stream] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.eof = False  # the server closed the connection
        self.ended: str | None = None  # why h2 gave up on the connection
        self.server_pings = 0  # pings the server sent (h2 acknowledged each as it parsed it)
        self._acks: set[bytes] = set()
        self._pings = 0
        self._settings_acked = False
        self._remote_settings = False
        self.window = window
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
        self.conn.initiate_connection()
        self.flush()

    def close(self) -> None:
        self.sock.close()

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self.sock.sendall(data)

    # --- reading ---

    def _recv(self, timeout: float) -> bytes | None:
        """The bytes that came within `timeout`: None if none did, b"" once the server closed
        (or reset) the connection. Shared by `pump` and the half-open peer's raw reads."""
        readable, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not readable:
            return None
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""

    def pump(self, timeout: float) -> None:
        """Wait up to `timeout` for bytes from the server, then handle all that came."""
        if self.eof or self.ended is not None:
            return
        data = self._recv(timeout)
        if data is None:
            return
        if not data:
            self.eof = True
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 refuses frames for streams after a GOAWAY, and then drops the whole batch of
            # events, the ConnectionTerminated among them: the connection is over all the same
            self.ended = f"{exc}; the last bytes received: {data[-120:]!r}"
            return
        for ev in events:
            self._handle(ev)
        self.flush()

    def _handle(self, ev: h2.events.Event) -> None:
        if isinstance(ev, h2.events.DataReceived):
            assert ev.stream_id is not None and ev.data is not None
            self.streams[ev.stream_id].buffer += ev.data
            # give the window back at once, so flow control never stalls the server (unless the
            # peer keeps a window of its own: then it never grows)
            if self.window is None:
                self.conn.acknowledge_received_data(ev.flow_controlled_length or 0, ev.stream_id)
        elif isinstance(ev, h2.events.ResponseReceived):
            assert ev.stream_id is not None
            self.streams[ev.stream_id].headers.update(_text(ev.headers))
        elif isinstance(ev, h2.events.TrailersReceived):
            assert ev.stream_id is not None
            self.streams[ev.stream_id].trailers.update(_text(ev.headers))
        elif isinstance(ev, h2.events.StreamEnded):
            assert ev.stream_id is not None
            self.streams[ev.stream_id].ended = True
        elif isinstance(ev, h2.events.StreamReset):
            assert ev.stream_id is not None
            self.streams[ev.stream_id].reset = int(ev.error_code or 0)
        elif isinstance(ev, h2.events.PingAckReceived):
            assert ev.ping_data is not None
            self._acks.add(ev.ping_data)
        elif isinstance(ev, h2.events.PingReceived):
            self.server_pings += 1
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev
        elif isinstance(ev, h2.events.SettingsAcknowledged):
            self._settings_acked = True
        elif isinstance(ev, h2.events.RemoteSettingsChanged):
            self._remote_settings = True

    def check_open(self, what: str) -> None:
        """AssertionError naming `what` if the connection is over."""
        if self.eof or self.goaway is not None or self.ended is not None:
            why = self.goaway or self.ended or "closed by the server"
            raise AssertionError(f"the connection ended before {what}: {why}")

    def until(self, done: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
        """Pump until `done()`; AssertionError naming `what` if the connection ends first or
        `timeout` (a safety net) runs out."""
        end = time.monotonic() + timeout
        while not done():
            self.check_open(what)
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within {timeout} s")
            self.pump(left)

    def handshake(self) -> None:
        """Until both sides' SETTINGS are exchanged and acknowledged."""
        self.until(lambda: self._settings_acked and self._remote_settings, "SETTINGS exchange")

    def idle(self, seconds: float) -> None:
        """Stay on the connection for `seconds`, handling (and acknowledging) what comes."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not self.eof and self.ended is None:
            self.pump(left)

    # --- pings ---

    def ping(self) -> None:
        """Send a PING and pump until its ACK arrives."""
        self._pings += 1
        self.check_open(f"ping {self._pings}")
        opaque = struct.pack(">Q", self._pings)
        self.conn.ping(opaque)
        self.flush()
        self.until(lambda: opaque in self._acks, f"an ACK of ping {self._pings}")

    # --- gRPC calls ---

    def open(
        self,
        path: str,
        *messages: Any,
        end: bool = False,
        metadata: tuple[tuple[str, str], ...] = (),
        send: bool = True,
    ) -> int:
        """Start a call to `path` ("/cronoq.v1.Workers/Work") with `metadata` (such as
        `grpc-timeout`), send `messages`, and with `end` half-close it; the stream id. Without
        `send` the frames wait for the next `flush`, to go out with the ones after them."""
        stream_id = self.conn.get_next_available_stream_id()
        self.streams[stream_id] = Stream()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        self.conn.send_headers(stream_id, headers, end_stream=end and not messages)
        for i, message in enumerate(messages, 1):
            self.conn.send_data(stream_id, frame(message), end_stream=end and i == len(messages))
        if send:
            self.flush()
        return stream_id

    def reset(self, stream_id: int, *, send: bool = True) -> None:
        """Cancel the call: RST_STREAM (CANCEL), as a client that gives up on it sends (unless
        the server has ended it already)."""
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        if send:
            self.flush()

    def send(self, stream_id: int, message: Any, *, end: bool = False) -> None:
        self.conn.send_data(stream_id, frame(message), end_stream=end)
        self.flush()

    def read(self, stream_id: int, cls: type[Any], timeout: float = WAIT_S) -> Any:
        """The next message the server sends on `stream_id`, parsed as `cls`."""
        stream = self.streams[stream_id]
        got: list[bytes] = []

        def arrived() -> bool:
            if (body := stream.take()) is not None:
                got.append(body)
                return True
            if stream.ended or stream.reset is not None:
                raise AssertionError(f"stream {stream_id} ended: {stream.trailers}")
            return False

        self.until(arrived, f"a message on stream {stream_id}", timeout)
        return cls.FromString(got[0])

    def finish(self, stream_id: int, timeout: float = WAIT_S) -> dict[str, str]:
        """Pump until the server ends `stream_id`; its trailers (or headers, trailers-only)."""
        stream = self.streams[stream_id]
        self.until(lambda: stream.ended, f"the end of stream {stream_id}", timeout)
        return {**stream.headers, **stream.trailers}

    # --- a half-open peer ---

    def drain_raw_until_closed(self, timeout: float = WAIT_S) -> bytes:
        """Read what the server sends without handing it to h2, so that nothing is
        acknowledged, until the server closes the connection; the bytes read. AssertionError
        if it is still open after `timeout` (a safety net)."""
        end = time.monotonic() + timeout
        received = b""
        while (left := end - time.monotonic()) > 0:
            data = self._recv(left)
            if data is None:
                continue
            if not data:
                self.eof = True
                return received
            received += data
        raise AssertionError(f"the server did not close the connection within {timeout} s")


def _text(headers: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in headers}
