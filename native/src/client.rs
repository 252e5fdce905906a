//! The client side: one gRPC bidirectional call (a worker's `Workers/Work` stream) on an HTTP/2
//! connection of its own, for `cronoq.client.Worker`.
//!
//! Like the server transport, HTTP/2 and gRPC's framing run on a tokio runtime of their own OS
//! thread, which never takes the GIL. Python hands over each loop turn's serialized messages in
//! one `send` (framed here and written coalesced, as few DATA frames as the flow-control window
//! allows); every response message read since the last wake, and then the end of the call, are
//! queued and a socket pair wakes the Python event loop once per batch (`drain`).

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::client::ResponseFuture;
use h2::{Ping, PingPong, Reason, RecvStream, SendStream};
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, TE, USER_AGENT};
use http::{Request, Response, StatusCode, Uri};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::codec::{self, Decoder, Reject};
use crate::server::{MetaValue, lock};

/// How long connecting (TCP, TLS and the HTTP/2 handshake together) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the end of a call may take to write its RST_STREAM and GOAWAY to a peer that does
/// not read them, before the connection is dropped anyway.
const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);
/// grpcio's variable naming a PEM file of trusted roots in place of its defaults.
const ROOTS_ENV: &str = "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH";

/// gRPC status codes this side produces itself.
const CANCELLED: u32 = 1;
const UNKNOWN: u32 = 2;
const PERMISSION_DENIED: u32 = 7;
const RESOURCE_EXHAUSTED: u32 = 8;
const UNIMPLEMENTED: u32 = 12;
const INTERNAL: u32 = 13;
const UNAVAILABLE: u32 = 14;
const UNAUTHENTICATED: u32 = 16;

/// How a call ended, as Python's `drain` reports it.
pub struct End {
    pub code: u32,
    pub message: String,
    /// The response headers' metadata (empty for a trailers-only response or no response).
    pub initial: Vec<(String, MetaValue)>,
    pub trailing: Vec<(String, MetaValue)>,
}

impl End {
    fn status(code: u32, message: impl Into<String>) -> Self {
        End {
            code,
            message: message.into(),
            initial: Vec::new(),
            trailing: Vec::new(),
        }
    }
}

/// What the call's task has queued for Python since the last `drain`.
#[derive(Default)]
struct Inbox {
    messages: Vec<Bytes>,
    end: Option<End>,
    /// The thread is about to exit: its connection and runtime are gone.
    finished: bool,
    /// Write end of the wake socket (Python watches the other end); dropped by `close`.
    wake: Option<UnixStream>,
}

struct Shared {
    inbox: Mutex<Inbox>,
}

impl Shared {
    /// Queues under the lock, waking Python only when the inbox goes from empty to not: `drain`
    /// empties the socket and the inbox under the same lock, so no wake-up is lost or doubled.
    fn update(&self, change: impl FnOnce(&mut Inbox)) {
        let mut inbox = lock(&self.inbox);
        let was_empty = inbox.messages.is_empty() && inbox.end.is_none() && !inbox.finished;
        change(&mut inbox);
        if was_empty && let Some(wake) = &inbox.wake {
            // Non-blocking: a full socket already holds a pending wake-up.
            let _ = (&*wake).write(&[1]);
        }
    }
}

/// What Python asks of the call.
enum Cmd {
    /// Framed messages, concatenated; with `true`, the request stream ends after them.
    Data(Bytes, bool),
    /// Reset the stream (CANCEL) and close the connection.
    Cancel,
}

/// Everything the call's thread needs to connect.
struct Target {
    host: String,
    port: u16,
    authority: String,
    path: String,
    headers: HeaderMap,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    max_receive_bytes: usize,
    keepalive: Option<(Duration, Duration)>,
}

/// One gRPC bidirectional call on a connection of its own, started as it is built.
#[pyclass(frozen, module = "cronoq._native")]
pub struct ClientCall {
    shared: Arc<Shared>,
    /// The read end of the wake socket; taken (closed) by `close`.
    wakeup: Mutex<Option<UnixStream>>,
    cmds: mpsc::UnboundedSender<Cmd>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl ClientCall {
    #[new]
    #[pyo3(signature = (host, port, path, metadata, *, authority, user_agent, max_receive_bytes,
                        tls=false, server_name=None, root_certificates=None,
                        certificate_chain=None, private_key=None, keepalive_time_s=0.0,
                        keepalive_timeout_s=20.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: String,
        port: u16,
        path: &str,
        metadata: &Bound<'_, PyList>,
        authority: String,
        user_agent: &str,
        max_receive_bytes: usize,
        tls: bool,
        server_name: Option<&str>,
        root_certificates: Option<&[u8]>,
        certificate_chain: Option<&[u8]>,
        private_key: Option<&[u8]>,
        keepalive_time_s: f64,
        keepalive_timeout_s: f64,
    ) -> PyResult<Self> {
        let mut headers = HeaderMap::new();
        crate::append_metadata(&mut headers, metadata)?;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        let agent = HeaderValue::from_str(user_agent)
            .map_err(|_| PyValueError::new_err("invalid user_agent"))?;
        headers.insert(USER_AGENT, agent);
        let tls = if tls {
            let name = server_name.unwrap_or(&host);
            let name = ServerName::try_from(name.to_owned())
                .map_err(|e| PyValueError::new_err(format!("server name {name:?}: {e}")))?;
            let roots = match root_certificates {
                Some(pem) => Some(pem.to_vec()),
                None => match std::env::var_os(ROOTS_ENV) {
                    Some(path) => Some(std::fs::read(&path).map_err(|e| {
                        PyValueError::new_err(format!("{ROOTS_ENV}={path:?}: {e}"))
                    })?),
                    None => None,
                },
            };
            let connector = connector(roots.as_deref(), certificate_chain, private_key)
                .map_err(PyValueError::new_err)?;
            Some((connector, name))
        } else if root_certificates.is_some() || certificate_chain.is_some() {
            return Err(PyValueError::new_err("certificates are for tls=True only"));
        } else {
            None
        };
        let keepalive = match crate::duration(keepalive_time_s, "keepalive_time_s")? {
            Some(time) => {
                let timeout = crate::duration(keepalive_timeout_s, "keepalive_timeout_s")?
                    .unwrap_or(Duration::from_secs(20));
                Some((time, timeout))
            }
            None => None,
        };
        let target = Target {
            host,
            port,
            authority,
            path: path.to_owned(),
            headers,
            tls,
            max_receive_bytes,
            keepalive,
        };
        let (wake, wakeup) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wakeup.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox {
                wake: Some(wake),
                ..Inbox::default()
            }),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let (cmds, rx) = mpsc::unbounded_channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("cronoq-client".into())
            .spawn(move || {
                let end = runtime.block_on(call(&thread_shared, target, rx));
                thread_shared.update(|inbox| inbox.end = Some(end));
                // Every socket and task of the call goes with the runtime, before Python hears
                // that the thread is done.
                drop(runtime);
                thread_shared.update(|inbox| inbox.finished = true);
            })?;
        Ok(ClientCall {
            shared,
            wakeup: Mutex::new(Some(wakeup)),
            cmds,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The read end of the wake socket, for `loop.add_reader`: readable while `drain` has
    /// something to return.
    fn fileno(&self) -> PyResult<i32> {
        lock(&self.wakeup)
            .as_ref()
            .map(|w| w.as_raw_fd())
            .ok_or_else(|| PyRuntimeError::new_err("closed"))
    }

    /// Queues serialized messages, each framed (uncompressed), to be written together; with
    /// `end`, the request stream half-closes after them. False (nothing queued) once the call
    /// has ended.
    #[pyo3(signature = (messages, *, end=false))]
    fn send(&self, messages: &Bound<'_, PyList>, end: bool) -> PyResult<bool> {
        let mut data = BytesMut::new();
        for item in messages.iter() {
            codec::frame_into(&mut data, item.cast::<PyBytes>()?.as_bytes());
        }
        Ok(self.cmds.send(Cmd::Data(data.freeze(), end)).is_ok())
    }

    /// `(messages, end, finished)`: every response message read since the last drain (bytes,
    /// prefix removed), the end of the call once known (`(code, message, initial_metadata,
    /// trailing_metadata)`, the message percent-decoded, `-bin` values as bytes) and whether
    /// the call's thread is done (nothing more will come).
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let (messages, end, finished) = {
            let mut inbox = lock(&self.shared.inbox);
            if let Some(wakeup) = lock(&self.wakeup).as_ref() {
                let mut buf = [0u8; 64];
                loop {
                    match (&*wakeup).read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => continue,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            (
                std::mem::take(&mut inbox.messages),
                inbox.end.take(),
                inbox.finished,
            )
        };
        let list = PyList::empty(py);
        for message in messages {
            list.append(PyBytes::new(py, &message))?;
        }
        let end = match end {
            None => py.None().into_bound(py),
            Some(end) => (
                end.code,
                end.message,
                metadata_list(py, &end.initial)?,
                metadata_list(py, &end.trailing)?,
            )
                .into_pyobject(py)?
                .into_any(),
        };
        (list, end, finished).into_pyobject(py)
    }

    /// Resets the stream (CANCEL) and closes the connection; the end follows as CANCELLED
    /// unless the call had already ended. Does not wait.
    fn cancel(&self) {
        let _ = self.cmds.send(Cmd::Cancel);
    }

    /// Cancels the call if still open, waits for its thread to end and closes both ends of the
    /// wake socket; idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let _ = self.cmds.send(Cmd::Cancel);
        let thread = lock(&self.thread).take();
        let joined = match thread {
            Some(thread) => py.detach(|| thread.join()).is_ok(),
            None => true,
        };
        lock(&self.wakeup).take();
        lock(&self.shared.inbox).wake.take();
        if joined {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err("the cronoq-client thread panicked"))
        }
    }
}

fn metadata_list<'py>(
    py: Python<'py>,
    metadata: &[(String, MetaValue)],
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for (key, value) in metadata {
        let value: Bound<'py, PyAny> = match value {
            MetaValue::Text(s) => PyString::new(py, s).into_any(),
            MetaValue::Binary(b) => PyBytes::new(py, b).into_any(),
        };
        list.append((key.as_str(), value))?;
    }
    Ok(list)
}

/// A TLS connector trusting `roots_pem` (else the system's roots), presenting the client
/// certificate `chain_pem` with `key_pem` when given (mTLS), offering only h2 by ALPN.
fn connector(
    roots_pem: Option<&[u8]>,
    chain_pem: Option<&[u8]>,
    key_pem: Option<&[u8]>,
) -> Result<TlsConnector, String> {
    let mut roots = RootCertStore::empty();
    match roots_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("root_certificates: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("root_certificates: {e}"))?;
            }
            if roots.is_empty() {
                return Err("root_certificates: no certificate in the PEM".into());
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "no system root certificates could be loaded ({:?})",
                    found.errors
                ));
            }
        }
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match (chain_pem, key_pem) {
        (Some(chain), Some(key)) => {
            let certs = CertificateDer::pem_slice_iter(chain)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("certificate_chain: {e}"))?;
            if certs.is_empty() {
                return Err("certificate_chain: no certificate in the PEM".into());
            }
            let key =
                PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("private_key: {e}"))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("certificate_chain/private_key: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err("a client certificate needs both certificate_chain and private_key".into());
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Connects and runs the call to its end; what Python sends meanwhile waits for the connection.
async fn call(shared: &Shared, target: Target, mut cmds: mpsc::UnboundedReceiver<Cmd>) -> End {
    let mut out = Outgoing::default();
    let connecting = tokio::time::timeout(CONNECT_TIMEOUT, connect(&target));
    tokio::pin!(connecting);
    let connected = loop {
        tokio::select! {
            biased;
            cmd = cmds.recv() => match cmd {
                Some(Cmd::Data(data, end)) => out.queue(&data, end),
                Some(Cmd::Cancel) | None => return End::status(CANCELLED, "Cancelled"),
            },
            connected = &mut connecting => break connected,
        }
    };
    match connected {
        Ok(Ok(Io::Plain(tcp))) => exchange(shared, &target, tcp, cmds, out).await,
        Ok(Ok(Io::Tls(tls))) => exchange(shared, &target, *tls, cmds, out).await,
        Ok(Err(e)) => End::status(UNAVAILABLE, e),
        Err(_) => End::status(UNAVAILABLE, "connecting timed out"),
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

async fn connect(target: &Target) -> Result<Io, String> {
    let host = target
        .host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&target.host);
    let tcp = TcpStream::connect((host, target.port))
        .await
        .map_err(|e| format!("failed to connect to {}:{}: {e}", target.host, target.port))?;
    let _ = tcp.set_nodelay(true);
    match &target.tls {
        None => Ok(Io::Plain(tcp)),
        Some((connector, name)) => connector
            .connect(name.clone(), tcp)
            .await
            .map(|tls| Io::Tls(Box::new(tls)))
            .map_err(|e| format!("TLS handshake with {}: {e}", target.authority)),
    }
}

/// Outgoing data waiting for flow-control capacity, and whether the request stream is to end
/// after it.
#[derive(Default)]
struct Outgoing {
    data: BytesMut,
    end: bool,
    /// The end of the request stream was sent.
    ended: bool,
}

impl Outgoing {
    /// Appends framed data (none after the end of the request stream was asked for).
    fn queue(&mut self, data: &[u8], end: bool) {
        if !self.end {
            self.data.extend_from_slice(data);
            self.end = end;
        }
    }
}

/// The receive side: waiting for the response headers, then reading its body.
enum Receiving {
    Headers(ResponseFuture),
    Body(RecvStream),
}

/// The HTTP/2 handshake, the request and the exchange of messages, to the call's end.
async fn exchange<IO>(
    shared: &Shared,
    target: &Target,
    io: IO,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    out: Outgoing,
) -> End
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = h2::client::Builder::new();
    builder
        // Windows larger than the 64 KiB default, so that leases are not throttled per RTT.
        .initial_window_size(1 << 20)
        .initial_connection_window_size(4 << 20)
        .max_header_list_size(64 << 10);
    let (send_request, mut conn) = match builder.handshake::<_, Bytes>(io).await {
        Ok(pair) => pair,
        Err(e) => return End::status(UNAVAILABLE, format!("HTTP/2 handshake: {e}")),
    };
    let ping_pong = conn.ping_pong();
    let scheme = if target.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let uri = match Uri::builder()
        .scheme(scheme)
        .authority(target.authority.as_str())
        .path_and_query(target.path.as_str())
        .build()
    {
        Ok(uri) => uri,
        Err(e) => return End::status(INTERNAL, format!("invalid authority or path: {e}")),
    };
    let mut request = Request::post(uri).body(()).expect("a valid request");
    *request.headers_mut() = target.headers.clone();
    let started = async {
        let mut ready = send_request.ready().await?;
        ready.send_request(request, false)
    };
    let (response, mut stream) = tokio::select! {
        started = started => match started {
            Ok(pair) => pair,
            Err(e) => return End::status(UNAVAILABLE, format!("starting the call: {e}")),
        },
        ended = &mut conn => return End::status(UNAVAILABLE, connection_lost(ended.err())),
    };
    let keepalive = keepalive(ping_pong, target.keepalive);
    tokio::pin!(keepalive);
    let end = run(
        shared,
        target.max_receive_bytes,
        &mut conn,
        &mut stream,
        response,
        &mut cmds,
        out,
        keepalive,
    )
    .await;
    // The request stream is reset unless both sides have ended it; dropping the handles lets
    // the connection send GOAWAY and close.
    stream.send_reset(Reason::CANCEL);
    drop(stream);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn).await;
    end
}

/// The receive side's state and what it makes of each thing received.
struct Reader {
    receiving: Receiving,
    initial: Vec<(String, MetaValue)>,
    decoder: Decoder,
    max_receive_bytes: usize,
}

impl Reader {
    /// Queues the messages `received` completes for Python; the call's end if it ends it.
    fn handle(&mut self, shared: &Shared, received: Received) -> Option<End> {
        match received {
            Received::Response(response) => {
                let (parts, body) = response.into_parts();
                if let Some(end) = refused(parts.status, &parts.headers) {
                    return Some(end);
                }
                if body.is_end_stream() {
                    // Trailers-only: the status is in the headers.
                    return Some(status_of(&parts.headers, Vec::new()));
                }
                self.initial = metadata_of(&parts.headers);
                self.receiving = Receiving::Body(body);
                None
            }
            Received::Data(chunk) => {
                if let Receiving::Body(body) = &mut self.receiving {
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                self.decoder.push(&chunk);
                let mut messages = Vec::new();
                let mut end = None;
                while let Some(message) = self.decoder.next_message() {
                    match message {
                        Ok(message) => messages.push(message),
                        Err(reject) => {
                            end = Some(rejected(reject, self.max_receive_bytes));
                            break;
                        }
                    }
                }
                if !messages.is_empty() {
                    shared.update(|inbox| inbox.messages.append(&mut messages));
                }
                end
            }
            Received::Trailers(trailers) => Some(if self.decoder.has_partial() {
                End::status(INTERNAL, "the response ended inside a message")
            } else {
                status_of(&trailers, std::mem::take(&mut self.initial))
            }),
            Received::Failed(e) => Some(stream_error(e)),
        }
    }

    /// After the connection ended: what it had read before is still delivered, and a status
    /// it carried wins over `lost`.
    fn drain(&mut self, shared: &Shared, lost: End) -> End {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            let received = std::pin::pin!(receive(&mut self.receiving)).poll(&mut cx);
            match received {
                std::task::Poll::Ready(Received::Failed(_)) | std::task::Poll::Pending => {
                    return lost;
                }
                std::task::Poll::Ready(received) => {
                    if let Some(end) = self.handle(shared, received) {
                        return end;
                    }
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run<C>(
    shared: &Shared,
    max_receive_bytes: usize,
    conn: &mut C,
    stream: &mut SendStream<Bytes>,
    response: ResponseFuture,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    mut out: Outgoing,
    mut keepalive: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> End
where
    C: Future<Output = Result<(), h2::Error>> + Unpin,
{
    let mut reader = Reader {
        receiving: Receiving::Headers(response),
        initial: Vec::new(),
        decoder: Decoder::new(max_receive_bytes),
        max_receive_bytes,
    };
    loop {
        if let Err(e) = flush(stream, &mut out) {
            return stream_error(e);
        }
        let waiting = !out.data.is_empty();
        tokio::select! {
            // Python's messages first: they answer what was already read.
            biased;
            cmd = cmds.recv() => {
                // Everything queued meanwhile too, so that it reaches h2 together.
                let mut next = cmd;
                loop {
                    match next {
                        Some(Cmd::Data(data, end)) => out.queue(&data, end),
                        Some(Cmd::Cancel) | None => return End::status(CANCELLED, "Cancelled"),
                    }
                    match cmds.try_recv() {
                        Ok(cmd) => next = Some(cmd),
                        Err(_) => break,
                    }
                }
            }
            received = receive(&mut reader.receiving) => {
                if let Some(end) = reader.handle(shared, received) {
                    return end;
                }
            }
            capacity = std::future::poll_fn(|cx| stream.poll_capacity(cx)), if waiting => {
                if let Some(Err(e)) = capacity {
                    return stream_error(e);
                }
            }
            ended = &mut *conn => {
                return reader.drain(shared, End::status(UNAVAILABLE, connection_lost(ended.err())));
            }
            () = keepalive.as_mut() => return End::status(UNAVAILABLE, "keepalive watchdog timeout"),
        }
    }
}

enum Received {
    Response(Response<RecvStream>),
    Data(Bytes),
    /// The response ended with these trailers (empty if it ended without any).
    Trailers(HeaderMap),
    Failed(h2::Error),
}

async fn receive(receiving: &mut Receiving) -> Received {
    match receiving {
        Receiving::Headers(response) => match response.await {
            Ok(response) => Received::Response(response),
            Err(e) => Received::Failed(e),
        },
        Receiving::Body(body) => match body.data().await {
            Some(Ok(chunk)) => Received::Data(chunk),
            Some(Err(e)) => Received::Failed(e),
            None => match body.trailers().await {
                Ok(trailers) => Received::Trailers(trailers.unwrap_or_default()),
                Err(e) => Received::Failed(e),
            },
        },
    }
}

/// Passes queued data to h2 as far as the stream's capacity goes, reserving what is left,
/// then the end of the request stream once asked for and everything is out.
fn flush(stream: &mut SendStream<Bytes>, out: &mut Outgoing) -> Result<(), h2::Error> {
    while !out.data.is_empty() {
        stream.reserve_capacity(out.data.len());
        let capacity = stream.capacity();
        if capacity == 0 {
            return Ok(());
        }
        let n = capacity.min(out.data.len());
        let data = out.data.split_to(n).freeze();
        let last = out.end && out.data.is_empty();
        stream.send_data(data, last)?;
        out.ended |= last;
    }
    if out.end && !out.ended {
        stream.send_data(Bytes::new(), true)?;
        out.ended = true;
    }
    Ok(())
}

/// Resolves when a ping goes unanswered for the keepalive timeout (never, if disabled).
async fn keepalive(ping_pong: Option<PingPong>, keepalive: Option<(Duration, Duration)>) {
    let (Some(mut pp), Some((interval, timeout))) = (ping_pong, keepalive) else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        if pp.send_ping(Ping::opaque()).is_err() {
            return;
        }
        let pong = std::future::poll_fn(|cx| pp.poll_pong(cx));
        if !matches!(tokio::time::timeout(timeout, pong).await, Ok(Ok(_))) {
            return;
        }
    }
}

fn connection_lost(e: Option<h2::Error>) -> String {
    match e {
        Some(e) => format!("connection lost: {e}"),
        None => "connection closed".into(),
    }
}

/// The end for an error of the call's stream: a reset by the server, a GOAWAY, or an I/O error.
fn stream_error(e: h2::Error) -> End {
    if let Some(reason) = e.reason()
        && e.is_remote()
        && !e.is_go_away()
    {
        let code = match reason {
            Reason::CANCEL => CANCELLED,
            Reason::REFUSED_STREAM => UNAVAILABLE,
            Reason::ENHANCE_YOUR_CALM => RESOURCE_EXHAUSTED,
            Reason::INADEQUATE_SECURITY => PERMISSION_DENIED,
            _ => INTERNAL,
        };
        return End::status(
            code,
            format!("Received RST_STREAM with error code {}", u32::from(reason)),
        );
    }
    End::status(UNAVAILABLE, format!("connection lost: {e}"))
}

fn rejected(reject: Reject, max: usize) -> End {
    match reject {
        // grpcio's words for its receive limit.
        Reject::TooLarge(declared) => End::status(
            RESOURCE_EXHAUSTED,
            format!("Received message larger than max ({declared} vs. {max})"),
        ),
        Reject::Compressed => End::status(
            INTERNAL,
            "a compressed message, though no compression was offered",
        ),
    }
}

/// The end for a response that is not gRPC's (HTTP status other than 200, or another content
/// type), mapped as gRPC's HTTP-to-status table does; None for a gRPC response.
fn refused(status: StatusCode, headers: &HeaderMap) -> Option<End> {
    if status == StatusCode::OK {
        let grpc = headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        return (!grpc).then(|| End::status(UNKNOWN, "the response is not gRPC (content-type)"));
    }
    let code = match status.as_u16() {
        400 => INTERNAL,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 => UNIMPLEMENTED,
        429 | 502..=504 => UNAVAILABLE,
        _ => UNKNOWN,
    };
    Some(End::status(
        code,
        format!("Received http2 header with status: {}", status.as_u16()),
    ))
}

/// The call's status from its trailers (or trailers-only headers): `grpc-status`,
/// `grpc-message` percent-decoded, and the rest as trailing metadata.
fn status_of(trailers: &HeaderMap, initial: Vec<(String, MetaValue)>) -> End {
    let code = trailers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok());
    let Some(code) = code else {
        return End {
            initial,
            ..End::status(UNKNOWN, "the call ended without a grpc-status")
        };
    };
    let message = trailers
        .get("grpc-message")
        .map(|v| percent_decode(v.as_bytes()))
        .unwrap_or_default();
    End {
        code,
        message,
        initial,
        trailing: metadata_of(trailers),
    }
}

/// Headers as metadata: without gRPC's own (status, message, content type) and `-bin` values
/// decoded to bytes.
fn metadata_of(headers: &HeaderMap) -> Vec<(String, MetaValue)> {
    let own = |name: &HeaderName| {
        matches!(
            name.as_str(),
            "grpc-status"
                | "grpc-message"
                | "content-type"
                | "grpc-encoding"
                | "grpc-accept-encoding"
        )
    };
    headers
        .iter()
        .filter(|(name, _)| !own(name))
        .map(|(name, value)| {
            let key = name.as_str();
            let value = if key.ends_with("-bin") {
                MetaValue::Binary(
                    codec::decode_bin(value.as_bytes())
                        .unwrap_or_else(|| value.as_bytes().to_vec()),
                )
            } else {
                MetaValue::Text(String::from_utf8_lossy(value.as_bytes()).into_owned())
            };
            (key.to_owned(), value)
        })
        .collect()
}

/// `grpc-message` decoding: %XX to its byte, the rest as is, then UTF-8 (lossy); a `%` not
/// followed by two hex digits stays literal, as gRPC's decoders leave it.
pub fn percent_decode(value: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%'
            && i + 2 < value.len()
            && let (Some(hi), Some(lo)) = (hex(value[i + 1]), hex(value[i + 2]))
        {
            out.push(hi << 4 | lo);
            i += 3;
            continue;
        }
        out.push(value[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(metadata: &[(String, MetaValue)]) -> Vec<(String, String)> {
        metadata
            .iter()
            .map(|(k, v)| match v {
                MetaValue::Text(s) => (k.clone(), s.clone()),
                MetaValue::Binary(b) => (k.clone(), format!("{b:?}")),
            })
            .collect()
    }

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(percent_decode(b"plain"), "plain");
        assert_eq!(percent_decode(b"caf%C3%A9 100%25"), "café 100%");
        assert_eq!(percent_decode(b"a%0Ab"), "a\nb");
        // not an escape: left as is
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%zz%4"), "%zz%4");
        assert_eq!(percent_decode(b"%ff"), "\u{fffd}");
        // what the server side encodes, this side decodes
        let message = "no such thing ü %";
        assert_eq!(
            percent_decode(codec::percent_encode(message).as_bytes()),
            message
        );
    }

    #[test]
    fn trailers_give_the_status_and_the_rest_as_metadata() {
        let mut trailers = crate::server::status_trailers(9, "moved ü");
        trailers.insert(
            "cronoq-shard-endpoint",
            HeaderValue::from_static("http://b:1"),
        );
        trailers.insert("trace-bin", HeaderValue::from_static("AAE"));
        let initial = vec![("x".to_owned(), MetaValue::Text("y".into()))];
        let end = status_of(&trailers, initial);
        assert_eq!((end.code, end.message.as_str()), (9, "moved ü"));
        assert_eq!(
            text(&end.trailing),
            vec![
                ("cronoq-shard-endpoint".to_owned(), "http://b:1".to_owned()),
                ("trace-bin".to_owned(), "[0, 1]".to_owned()),
            ]
        );
        assert_eq!(text(&end.initial), vec![("x".to_owned(), "y".to_owned())]);
        let missing = status_of(&HeaderMap::new(), Vec::new());
        assert_eq!(missing.code, UNKNOWN);
    }

    #[test]
    fn http_statuses_map_as_grpc_says() {
        let grpc = {
            let mut h = HeaderMap::new();
            h.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/grpc+proto"),
            );
            h
        };
        assert!(refused(StatusCode::OK, &grpc).is_none());
        assert_eq!(
            refused(StatusCode::OK, &HeaderMap::new()).unwrap().code,
            UNKNOWN
        );
        for (status, code) in [
            (400, INTERNAL),
            (401, UNAUTHENTICATED),
            (403, PERMISSION_DENIED),
            (404, UNIMPLEMENTED),
            (429, UNAVAILABLE),
            (502, UNAVAILABLE),
            (503, UNAVAILABLE),
            (504, UNAVAILABLE),
            (500, UNKNOWN),
        ] {
            let end = refused(StatusCode::from_u16(status).unwrap(), &grpc).unwrap();
            assert_eq!(end.code, code, "{status}");
        }
    }

    #[test]
    fn outgoing_data_is_coalesced_until_the_end() {
        let mut out = Outgoing::default();
        let mut framed = BytesMut::new();
        codec::frame_into(&mut framed, b"one");
        codec::frame_into(&mut framed, b"two");
        out.queue(&framed, false);
        out.queue(&framed[..8], true);
        out.queue(b"after the end", false);
        assert_eq!(out.data.len(), framed.len() + 8);
        assert!(out.end && !out.ended);
        let mut decoder = Decoder::new(10);
        decoder.push(&out.data);
        assert_eq!(decoder.next_message().unwrap().unwrap(), &b"one"[..]);
        assert_eq!(decoder.next_message().unwrap().unwrap(), &b"two"[..]);
        assert_eq!(decoder.next_message().unwrap().unwrap(), &b"one"[..]);
        assert!(!decoder.has_partial());
    }

    #[test]
    fn a_receive_limit_is_grpcios_words() {
        let end = rejected(Reject::TooLarge(2000), 1000);
        assert_eq!(end.code, RESOURCE_EXHAUSTED);
        assert_eq!(
            end.message,
            "Received message larger than max (2000 vs. 1000)"
        );
    }
}
