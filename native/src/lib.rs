//! `cronoq._native`: a generic gRPC-over-HTTP/2 server whose handlers live in Python.
//!
//! Rust does the HTTP/2 and gRPC framing on a tokio runtime of its own OS thread, which never
//! takes the GIL. Each call's path, metadata and raw messages are queued as events; a socket
//! pair wakes the Python event loop once per batch, and Python drains the queue and answers
//! with raw response messages and a final status. Protobuf stays in Python.
//!
//! `drain()` returns tuples whose first item is the kind:
//! - `(0, call_id, path, metadata, timeout_s, peer, dns_names)`: a new call. `metadata` is
//!   `[(key, str | bytes)]` without pseudo-headers, `te`, `content-type`, `grpc-timeout`,
//!   `grpc-encoding` and `grpc-accept-encoding` (`-bin` values decoded to bytes);
//!   `timeout_s` is `grpc-timeout` in seconds or None; `peer` reads like grpcio's
//!   (`ipv4:127.0.0.1:5555`); `dns_names` are the verified client certificate's DNS SANs
//!   (empty without mTLS).
//! - `(1, call_id, data)`: one complete request message, its prefix removed.
//! - `(2, call_id)`: the client half-closed.
//! - `(3, call_id)`: the call is gone (client reset, connection lost, or refused here for an
//!   oversized or compressed message); never sent for a call Python ended with `finish`.
//!   A call on a connection over its `max_unsent_bytes` is refused here before any event.
//! - `(4, call_id)`: writable again: the call's pending bytes (see `Transport.send`) fell to
//!   `LOW_WATER` or below after a `send` returned more than `HIGH_WATER`. One per such
//!   `send` (later ones while armed add none); none after Gone, and none once the call's task
//!   has seen `finish` (one may still precede it in the queue: ignore unknown calls).

mod client;
mod codec;
mod otlp;
mod server;
mod tls;

use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use tokio::sync::watch;

use server::{Cmd, Event, HIGH_WATER, LOW_WATER, Limits, MetaValue, Shared, State, lock};

/// How long a client may take over the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `close` lets open connections send what their calls queued last (final messages,
/// statuses, GOAWAY) and end cleanly before the runtime drops them mid-write.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Event kinds, the first item of each drained tuple.
const CALL: u8 = 0;
const MESSAGE: u8 = 1;
const HALF_CLOSE: u8 = 2;
const GONE: u8 = 3;
const WRITABLE: u8 = 4;

/// A gRPC server on one port (every address its host resolves to), serving from the moment
/// it is built.
#[pyclass(frozen, module = "cronoq._native")]
struct Transport {
    shared: Arc<Shared>,
    wakeup: UnixStream,
    /// The bound port (the ephemeral one picked when asked for port 0).
    #[pyo3(get)]
    port: u16,
    state: watch::Sender<State>,
    /// Disconnects once every accept loop has dropped its listener.
    listeners_closed: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl Transport {
    #[new]
    #[pyo3(signature = (host, port, *, max_receive_bytes, max_unsent_bytes,
                        max_concurrent_streams, keepalive_interval_s, keepalive_timeout_s,
                        tls_cert=None, tls_key=None, client_ca=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: &str,
        port: u16,
        max_receive_bytes: usize,
        max_unsent_bytes: usize,
        max_concurrent_streams: u32,
        keepalive_interval_s: f64,
        keepalive_timeout_s: f64,
        tls_cert: Option<&[u8]>,
        tls_key: Option<&[u8]>,
        client_ca: Option<&[u8]>,
    ) -> PyResult<Self> {
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => {
                Some(tls::acceptor(cert, key, client_ca).map_err(PyValueError::new_err)?)
            }
            (None, None) if client_ca.is_none() => None,
            _ => {
                return Err(PyValueError::new_err(
                    "TLS needs both tls_cert and tls_key (and client_ca only with them)",
                ));
            }
        };
        let listeners = server::bind(host, port).map_err(|e| {
            let text = format!("cannot bind {host}:{port}: {e}");
            match e.raw_os_error() {
                Some(errno) => PyOSError::new_err((errno, text)),
                None => PyOSError::new_err(text),
            }
        })?;
        let port = listeners[0].local_addr()?.port();
        let limits = Limits {
            max_receive_bytes,
            max_unsent_bytes,
            max_concurrent_streams,
            keepalive_interval: duration(keepalive_interval_s, "keepalive_interval_s")?,
            keepalive_timeout: duration(keepalive_timeout_s, "keepalive_timeout_s")?
                .unwrap_or(Duration::from_secs(20)),
        };
        let (wake, wakeup) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wakeup.set_nonblocking(true)?;
        let shared = Arc::new(Shared::new(wake));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let (state, state_rx) = watch::channel(State::Serving);
        let (closed_tx, closed_rx) = std::sync::mpsc::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("cronoq-native".into())
            .spawn(move || {
                runtime.block_on(run(
                    thread_shared,
                    listeners,
                    limits,
                    tls,
                    state_rx,
                    closed_tx,
                ));
                // Dropping the runtime here drops every connection and call task with it.
            })?;
        Ok(Transport {
            shared,
            wakeup,
            port,
            state,
            listeners_closed: Mutex::new(Some(closed_rx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The read end of the wake socket, for `loop.add_reader`: readable while `drain` has
    /// something to return.
    fn fileno(&self) -> i32 {
        self.wakeup.as_raw_fd()
    }

    /// Every event queued since the last drain, in order, as tuples (see the module docs).
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = {
            let mut queue = lock(&self.shared.queue);
            let mut buf = [0u8; 64];
            loop {
                match (&self.wakeup).read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            std::mem::take(&mut queue.events)
        };
        let out = PyList::empty(py);
        for event in events {
            out.append(event_tuple(py, event)?)?;
        }
        Ok(out)
    }

    /// Queues already-serialized response messages, each framed (uncompressed), after the
    /// response headers if not sent yet; they go out as the client's flow-control window
    /// admits them. Returns the call's pending bytes after these (framed bytes queued and
    /// not yet passed to HTTP/2 with window for them), or -1, with nothing queued, if the
    /// call is gone. Over `HIGH_WATER`, this arms one `(4, call_id)` event for when the
    /// pending bytes are back at `LOW_WATER` or below. With `budgeted` (a unary call's
    /// answer), -2 and nothing queued if the call's connection already holds bytes and these
    /// would take it over `max_unsent_bytes`.
    #[pyo3(signature = (call_id, messages, *, budgeted=false))]
    fn send(&self, call_id: u64, messages: &Bound<'_, PyList>, budgeted: bool) -> PyResult<i64> {
        let mut data = bytes::BytesMut::new();
        for item in messages.iter() {
            codec::frame_into(&mut data, item.cast::<PyBytes>()?.as_bytes());
        }
        Ok(self.shared.send(call_id, data.freeze(), budgeted))
    }

    /// Bytes every connection holds for its client: queued answers not yet passed to HTTP/2
    /// with flow-control window for them.
    fn unsent_bytes(&self) -> usize {
        self.shared.unsent.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sends the response headers now, with this initial metadata (no-op if already sent).
    fn headers(&self, call_id: u64, metadata: &Bound<'_, PyList>) -> PyResult<bool> {
        let mut map = HeaderMap::new();
        append_metadata(&mut map, metadata)?;
        Ok(self.command(call_id, Cmd::Headers(map)))
    }

    /// Ends the call with this status and trailing metadata: a trailers-only response if
    /// nothing was sent yet. No-op for a call that is gone.
    fn finish(
        &self,
        call_id: u64,
        code: u32,
        message: &str,
        trailers: &Bound<'_, PyList>,
    ) -> PyResult<()> {
        let mut map = server::status_trailers(code, message);
        append_metadata(&mut map, trailers)?;
        // Removing the entry first means the task's end reports no Gone for this call.
        if let Some(call) = lock(&self.shared.calls).remove(&call_id) {
            call.flow.disarm();
            let _ = call.tx.send(Cmd::Finish(map));
        }
        Ok(())
    }

    /// Closes the listening sockets (before returning) and sends GOAWAY on every connection;
    /// calls in flight go on, new streams are refused.
    fn stop_accepting(&self, py: Python<'_>) {
        self.state.send_if_modified(|s| {
            let changed = *s == State::Serving;
            if changed {
                *s = State::Draining;
            }
            changed
        });
        if let Some(rx) = lock(&self.listeners_closed).take() {
            // Disconnected once every accept loop dropped its listener: a matter of one tick.
            py.detach(move || {
                let _ = rx.recv_timeout(Duration::from_secs(5));
            });
        }
    }

    /// Drops every connection and stops the thread; idempotent. Nothing is queued after it.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        lock(&self.shared.queue).closed = true;
        self.state.send_replace(State::Closed);
        lock(&self.shared.calls).clear();
        let Some(thread) = lock(&self.thread).take() else {
            return Ok(());
        };
        py.detach(|| thread.join())
            .map_err(|_| PyRuntimeError::new_err("the cronoq-native thread panicked"))
    }
}

impl Transport {
    fn command(&self, call_id: u64, cmd: Cmd) -> bool {
        lock(&self.shared.calls)
            .get(&call_id)
            .is_some_and(|call| call.tx.send(cmd).is_ok())
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.state.send_replace(State::Closed);
    }
}

/// Seconds as a Duration; zero or less disables (None).
fn duration(seconds: f64, name: &str) -> PyResult<Option<Duration>> {
    if seconds.is_nan() || seconds.is_infinite() {
        return Err(PyValueError::new_err(format!("{name} must be finite")));
    }
    Ok((seconds > 0.0).then(|| Duration::from_secs_f64(seconds)))
}

async fn run(
    shared: Arc<Shared>,
    listeners: Vec<std::net::TcpListener>,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut state: watch::Receiver<State>,
    closed: std::sync::mpsc::Sender<()>,
) {
    // Each connection's task holds a clone of `alive`: `open` ends once every one has ended.
    let (alive, mut open) = tokio::sync::mpsc::channel::<()>(1);
    for listener in listeners {
        let shared = shared.clone();
        let conn_state = state.clone();
        let tls = tls.clone();
        let alive = alive.clone();
        let on_conn = move |stream: tokio::net::TcpStream, addr| {
            let peer: Arc<str> = Arc::from(server::peer_string(addr));
            let (shared, state, tls) = (shared.clone(), conn_state.clone(), tls.clone());
            let alive = alive.clone();
            tokio::spawn(async move {
                let _alive = alive;
                let Some(tls) = tls else {
                    let names: Arc<[String]> = Arc::from(Vec::new());
                    return server::serve_connection(shared, stream, peer, names, limits, state)
                        .await;
                };
                // The handshake runs in the connection's task so a slow client holds up no other.
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream));
                let Ok(Ok(stream)) = handshake.await else {
                    return;
                };
                let names = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|leaf| tls::dns_names(leaf))
                    .unwrap_or_default();
                let names: Arc<[String]> = Arc::from(names);
                server::serve_connection(shared, stream, peer, names, limits, state).await;
            });
        };
        tokio::spawn(server::accept_loop(
            listener,
            state.clone(),
            closed.clone(),
            on_conn,
        ));
    }
    drop(closed);
    drop(alive);
    let _ = state.wait_for(|s| *s == State::Closed).await.is_ok();
    // Closed: every connection shuts down gracefully; let it write out its calls' last frames
    // (a worker's `shutdown` message, the statuses) rather than cutting it mid-write.
    let _ = tokio::time::timeout(FLUSH_TIMEOUT, open.recv()).await;
}

/// Python metadata pairs into headers: `-bin` keys take bytes (sent base64), others str.
fn append_metadata(map: &mut HeaderMap, metadata: &Bound<'_, PyList>) -> PyResult<()> {
    for item in metadata.iter() {
        let (key, value): (String, Bound<'_, PyAny>) = item.extract()?;
        let name = HeaderName::from_bytes(key.as_bytes())
            .map_err(|_| PyValueError::new_err(format!("invalid metadata key {key:?}")))?;
        let value = if key.ends_with("-bin") {
            let raw = value.cast::<PyBytes>()?.as_bytes();
            HeaderValue::from_str(&codec::encode_bin(raw))
        } else {
            HeaderValue::from_str(value.cast::<PyString>()?.to_str()?)
        }
        .map_err(|_| PyValueError::new_err(format!("invalid value for metadata key {key:?}")))?;
        map.append(name, value);
    }
    Ok(())
}

fn event_tuple<'py>(py: Python<'py>, event: Event) -> PyResult<Bound<'py, PyTuple>> {
    match event {
        Event::Call(call) => {
            let metadata = PyList::empty(py);
            for (key, value) in &call.metadata {
                let value: Bound<'py, PyAny> = match value {
                    MetaValue::Text(s) => PyString::new(py, s).into_any(),
                    MetaValue::Binary(b) => PyBytes::new(py, b).into_any(),
                };
                metadata.append((key.as_str(), value))?;
            }
            (
                CALL,
                call.id,
                call.path.as_str(),
                metadata,
                call.timeout_s,
                &*call.peer,
                PyList::new(py, call.dns_names.iter())?,
            )
                .into_pyobject(py)
        }
        Event::Message(id, data) => (MESSAGE, id, PyBytes::new(py, &data)).into_pyobject(py),
        Event::HalfClose(id) => (HALF_CLOSE, id).into_pyobject(py),
        Event::Gone(id) => (GONE, id).into_pyobject(py),
        Event::Writable(id) => (WRITABLE, id).into_pyobject(py),
    }
}

/// Takes an object out of the cyclic garbage collector's sight: the engine's retained ended
/// tasks, which full collections would otherwise walk (cronoq.core.model.leave_collector
/// decides which). The ctypes call it replaces costs ten times as much per task.
#[pyfunction]
fn gc_untrack(obj: &Bound<'_, PyAny>) {
    // SAFETY: `obj` is a live object and the GIL is held; untracking is allowed on any object,
    // tracked or not, and its deallocation stays correct (it untracks only if tracked).
    unsafe { pyo3::ffi::PyObject_GC_UnTrack(obj.as_ptr().cast()) }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Transport>()?;
    m.add_function(wrap_pyfunction!(gc_untrack, m)?)?;
    m.add_class::<client::ClientCall>()?;
    m.add_function(wrap_pyfunction!(otlp::otlp_encode, m)?)?;
    m.add("CALL", CALL)?;
    m.add("MESSAGE", MESSAGE)?;
    m.add("HALF_CLOSE", HALF_CLOSE)?;
    m.add("GONE", GONE)?;
    m.add("WRITABLE", WRITABLE)?;
    m.add("HIGH_WATER", HIGH_WATER)?;
    m.add("LOW_WATER", LOW_WATER)?;
    Ok(())
}
