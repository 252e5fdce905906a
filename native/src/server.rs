//! The tokio side: listeners, HTTP/2 connections (h2 directly, for trailers-only responses and
//! frame-level control) and one task per call. Nothing here touches Python: events go into
//! [`Shared`]'s queue and Python's commands arrive over each call's channel.

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::io::Write;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{Ping, PingPong, Reason, RecvStream, SendStream};
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};

use crate::codec::{self, Decoder, Reject};

/// A metadata value as Python sees it: text, or bytes for `-bin` keys.
pub enum MetaValue {
    Text(String),
    Binary(Vec<u8>),
}

pub struct Call {
    pub id: u64,
    pub path: String,
    pub metadata: Vec<(String, MetaValue)>,
    pub timeout_s: Option<f64>,
    pub peer: Arc<str>,
    pub dns_names: Arc<[String]>,
}

pub enum Event {
    Call(Box<Call>),
    Message(u64, Bytes),
    HalfClose(u64),
    Gone(u64),
    /// The call's pending bytes fell to `LOW_WATER` or below after a `send()` saw them above
    /// `HIGH_WATER`.
    Writable(u64),
}

/// Pending bytes above which a `send()` arms the call's [`Event::Writable`].
pub const HIGH_WATER: usize = 64 << 10;
/// Pending bytes at or below which an armed call hears [`Event::Writable`].
pub const LOW_WATER: usize = 16 << 10;

/// Most send capacity a call asks h2 for at a time: more than one stream window is of no
/// use and would hold connection window away from the connection's other streams.
const MAX_RESERVE: usize = 1 << 20;

/// What one connection's calls hold for its client: the sum of their [`Flow`]s' pending
/// bytes, and the most it may hold before its new calls are refused (`max_unsent_bytes`).
pub struct Unsent {
    bytes: AtomicUsize,
    budget: usize,
    /// Every connection's bytes together (`Transport.unsent_bytes`).
    total: Arc<AtomicUsize>,
}

impl Unsent {
    pub fn new(budget: usize, total: Arc<AtomicUsize>) -> Self {
        Unsent {
            bytes: AtomicUsize::new(0),
            budget,
            total,
        }
    }

    fn add(&self, n: usize) {
        self.bytes.fetch_add(n, Ordering::SeqCst);
        self.total.fetch_add(n, Ordering::SeqCst);
    }

    fn sub(&self, n: usize) {
        self.bytes.fetch_sub(n, Ordering::SeqCst);
        self.total.fetch_sub(n, Ordering::SeqCst);
    }

    /// Over its budget: no new call on this connection.
    fn over(&self) -> bool {
        self.bytes.load(Ordering::SeqCst) > self.budget
    }

    /// Whether `n` more bytes may be held: always while nothing is, else within the budget.
    fn admits(&self, n: usize) -> bool {
        let held = self.bytes.load(Ordering::SeqCst);
        held == 0 || held + n <= self.budget
    }
}

/// A call's backpressure: bytes handed to `send()` (framed) that its task has not yet passed
/// to h2 with flow-control capacity for them (counted in its connection's [`Unsent`] too),
/// and whether a Writable event is owed.
pub struct Flow {
    pending: AtomicUsize,
    armed: AtomicBool,
    unsent: Arc<Unsent>,
}

impl Flow {
    pub fn new(unsent: Arc<Unsent>) -> Self {
        Flow {
            pending: AtomicUsize::new(0),
            armed: AtomicBool::new(false),
            unsent,
        }
    }

    /// Counts `n` more bytes queued (before their command goes out, so the task never
    /// subtracts first); the pending bytes after them.
    fn queue(&self, n: usize) -> usize {
        self.unsent.add(n);
        self.pending.fetch_add(n, Ordering::SeqCst) + n
    }

    /// Takes back bytes counted by [`Flow::queue`] whose command could not be sent.
    fn unqueue(&self, n: usize) {
        self.unsent.sub(n);
        self.pending.fetch_sub(n, Ordering::SeqCst);
    }

    /// The call's task ended: whatever it still held (queued, or in its channel) is dropped.
    fn release(&self) {
        self.unsent.sub(self.pending.swap(0, Ordering::SeqCst));
    }

    /// After a `send()` left `after` bytes pending: arms the Writable event if over
    /// `HIGH_WATER`. True if the event is due at once, the task having drained to
    /// `LOW_WATER` between the count and the arming (it then saw nothing armed).
    fn arm(&self, after: usize) -> bool {
        if after <= HIGH_WATER {
            return false;
        }
        self.armed.store(true, Ordering::SeqCst);
        self.pending.load(Ordering::SeqCst) <= LOW_WATER && self.disarm()
    }

    /// Clears the arming; true if it was armed (whoever clears it owes the one event).
    pub fn disarm(&self) -> bool {
        self.armed.swap(false, Ordering::SeqCst)
    }

    /// `n` bytes passed to h2; true if the Writable event is now due.
    fn passed(&self, n: usize) -> bool {
        self.unsent.sub(n);
        let before = self.pending.fetch_sub(n, Ordering::SeqCst);
        before - n <= LOW_WATER && self.disarm()
    }

    #[cfg(test)]
    fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }
}

/// A live call as Python's commands reach it.
pub struct CallHandle {
    pub tx: mpsc::UnboundedSender<Cmd>,
    pub flow: Arc<Flow>,
}

/// What Python asks of one call, carried to its task.
pub enum Cmd {
    /// Already framed messages, concatenated, counted in the call's [`Flow`] (empty: just
    /// the response headers). Written as flow control allows, coalesced with the data queued
    /// around them.
    Data(Bytes),
    Headers(HeaderMap),
    /// Trailing metadata, `grpc-status` and `grpc-message` first.
    Finish(HeaderMap),
}

pub struct Queue {
    pub events: Vec<Event>,
    /// Set by close: nothing is queued after it.
    pub closed: bool,
}

pub struct Shared {
    pub queue: Mutex<Queue>,
    /// Write end of the wake socket; Python watches the other end.
    pub wake: UnixStream,
    /// Live calls. Whoever removes an entry owns the call's end: `finish` (no Gone event)
    /// or the call's task (Gone event).
    pub calls: Mutex<HashMap<u64, CallHandle>>,
    /// Bytes every connection holds for its client (see [`Unsent`]).
    pub unsent: Arc<AtomicUsize>,
    next_id: AtomicU64,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves nothing half-updated worth refusing.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(wake: UnixStream) -> Self {
        Shared {
            queue: Mutex::new(Queue {
                events: Vec::new(),
                closed: false,
            }),
            wake,
            calls: Mutex::new(HashMap::new()),
            unsent: Arc::new(AtomicUsize::new(0)),
            next_id: AtomicU64::new(1),
        }
    }

    /// Queues an event, waking Python only when the queue goes non-empty: `drain` empties
    /// the socket and the queue under the same lock, so a wake-up is never lost or doubled.
    pub fn push(&self, event: Event) {
        let mut queue = lock(&self.queue);
        if queue.closed {
            return;
        }
        if queue.events.is_empty() {
            // Non-blocking: a full socket already holds a pending wake-up.
            let _ = (&self.wake).write(&[1]);
        }
        queue.events.push(event);
    }

    /// `Transport.send`: queues framed data for the call; its pending bytes after them, or
    /// -1 (nothing queued) if the call is gone, or with `budgeted` -2 (nothing queued) if its
    /// connection cannot hold these bytes too (see [`Unsent::admits`]).
    pub fn send(&self, id: u64, data: Bytes, budgeted: bool) -> i64 {
        let n = data.len();
        let calls = lock(&self.calls);
        let Some(call) = calls.get(&id) else {
            return -1;
        };
        if budgeted && !call.flow.unsent.admits(n) {
            return -2;
        }
        let after = call.flow.queue(n);
        if call.tx.send(Cmd::Data(data)).is_err() {
            call.flow.unqueue(n);
            return -1;
        }
        // Under the calls lock, so that a Writable due here is queued before any Gone.
        if call.flow.arm(after) {
            self.push(Event::Writable(id));
        }
        i64::try_from(after).unwrap_or(i64::MAX)
    }

    /// Ends a call from Rust's side: Python hears Gone unless `finish` got there first.
    fn forget(&self, id: u64) {
        if lock(&self.calls).remove(&id).is_some() {
            self.push(Event::Gone(id));
        }
    }
}

/// Listener lifecycle, broadcast to every accept loop and connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Serving,
    /// Listeners closed, GOAWAY sent; calls in flight go on.
    Draining,
    Closed,
}

#[derive(Clone, Copy)]
pub struct Limits {
    pub max_receive_bytes: usize,
    /// What one connection may hold for its client before its new calls are refused.
    pub max_unsent_bytes: usize,
    pub max_concurrent_streams: u32,
    pub keepalive_interval: Option<Duration>,
    pub keepalive_timeout: Duration,
}

/// Binds every address `host` resolves to, on one port (the first bound picks it if 0).
pub fn bind(host: &str, port: u16) -> std::io::Result<Vec<StdListener>> {
    use std::net::ToSocketAddrs;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let mut addrs: Vec<SocketAddr> = (bare, port).to_socket_addrs()?.collect();
    addrs.dedup();
    // A dual-stack `::` already covers 0.0.0.0, as with grpcio.
    if addrs.iter().any(|a| a.is_ipv6() && a.ip().is_unspecified()) {
        addrs.retain(|a| !(a.is_ipv4() && a.ip().is_unspecified()));
    }
    let mut listeners = Vec::new();
    let mut port = port;
    let mut last_err = None;
    for mut addr in addrs {
        addr.set_port(port);
        match bind_one(addr) {
            Ok(l) => {
                port = l.local_addr()?.port();
                listeners.push(l);
            }
            // One family missing on this host (no IPv6, say) is not fatal while another binds.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT)
                ) =>
            {
                last_err = Some(e)
            }
            Err(e) => return Err(e),
        }
    }
    match (listeners.is_empty(), last_err) {
        (false, _) => Ok(listeners),
        (true, Some(e)) => Err(e),
        (true, None) => Err(std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            "the host resolved to no address",
        )),
    }
}

fn bind_one(addr: SocketAddr) -> std::io::Result<StdListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    // Restarts reuse a port in TIME_WAIT; no SO_REUSEPORT, so a second server fails to bind.
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(!addr.ip().is_unspecified())?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Like grpcio's peer strings; IPv4-mapped addresses of a dual-stack socket read as IPv4.
pub fn peer_string(addr: SocketAddr) -> String {
    let ip = addr.ip().to_canonical();
    match ip {
        std::net::IpAddr::V4(v4) => format!("ipv4:{v4}:{}", addr.port()),
        std::net::IpAddr::V6(v6) => format!("ipv6:[{v6}]:{}", addr.port()),
    }
}

/// Accepts until the state leaves Serving; dropping the listener closes its socket, and
/// `_closed` going with it tells `stop_accepting` so.
pub async fn accept_loop<F>(
    listener: StdListener,
    mut state: watch::Receiver<State>,
    _closed: std::sync::mpsc::Sender<()>,
    on_conn: F,
) where
    F: Fn(tokio::net::TcpStream, SocketAddr),
{
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return eprintln!("cronoq._native: {e}"),
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    on_conn(stream, addr);
                }
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            () = async { let _ = state.wait_for(|s| *s != State::Serving).await; } => return,
        }
    }
}

/// Serves one HTTP/2 connection until it ends, the keepalive gives up or the transport closes.
pub async fn serve_connection<IO>(
    shared: Arc<Shared>,
    io: IO,
    peer: Arc<str>,
    dns_names: Arc<[String]>,
    limits: Limits,
    mut state: watch::Receiver<State>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(limits.max_concurrent_streams)
        // Windows larger than the 64 KiB default so one stream is not throttled per RTT.
        .initial_window_size(1 << 20)
        .initial_connection_window_size(4 << 20)
        .max_header_list_size(64 << 10)
        .max_send_buffer_size(1 << 20);
    let Ok(Ok(mut conn)) =
        tokio::time::timeout(Duration::from_secs(20), builder.handshake::<_, Bytes>(io)).await
    else {
        return;
    };
    let unsent = Arc::new(Unsent::new(limits.max_unsent_bytes, shared.unsent.clone()));
    let ping_pong = conn.ping_pong();
    let keepalive = keepalive(ping_pong, limits);
    tokio::pin!(keepalive);
    let mut draining = false;
    loop {
        if !draining && *state.borrow() != State::Serving {
            draining = true;
            conn.graceful_shutdown();
        }
        tokio::select! {
            accepted = conn.accept() => match accepted {
                Some(Ok((request, respond))) => {
                    start_call(&shared, request, respond, &peer, &dns_names, &unsent, limits);
                }
                Some(Err(_)) | None => return,
            },
            _ = state.changed(), if !draining => {}
            () = &mut keepalive => return,
        }
    }
}

/// Resolves when a ping goes unanswered for the keepalive timeout (never, if disabled).
async fn keepalive(ping_pong: Option<PingPong>, limits: Limits) {
    let (Some(mut pp), Some(interval)) = (ping_pong, limits.keepalive_interval) else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        if pp.send_ping(Ping::opaque()).is_err() {
            return;
        }
        let pong = poll_fn(|cx| pp.poll_pong(cx));
        match tokio::time::timeout(limits.keepalive_timeout, pong).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
    }
}

/// RESOURCE_EXHAUSTED for a call on a connection over its [`Unsent`] budget (Python's too).
pub const UNREAD: &str = "this connection holds too many answers its client has not read (limits.max_unsent_bytes_per_connection)";

fn start_call(
    shared: &Arc<Shared>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: &Arc<str>,
    dns_names: &Arc<[String]>,
    unsent: &Arc<Unsent>,
    limits: Limits,
) {
    if request.method() != Method::POST {
        return respond_plain(&mut respond, StatusCode::METHOD_NOT_ALLOWED);
    }
    let grpc = request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        return respond_plain(&mut respond, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
    if unsent.over() {
        // Refused here: Python never hears of it, so it takes no place of its calls.
        let _ = Responder::Pending(respond).finish(status_trailers(8, UNREAD));
        return;
    }
    let (parts, body) = request.into_parts();
    let mut metadata = Vec::with_capacity(parts.headers.len());
    let mut timeout_s = None;
    for (name, value) in &parts.headers {
        let key = name.as_str();
        match key {
            "te" | "content-type" | "grpc-encoding" | "grpc-accept-encoding" => continue,
            "grpc-timeout" => {
                timeout_s = codec::parse_timeout(value.as_bytes());
                continue;
            }
            _ => {}
        }
        let value = if key.ends_with("-bin") {
            MetaValue::Binary(
                codec::decode_bin(value.as_bytes()).unwrap_or_else(|| value.as_bytes().to_vec()),
            )
        } else {
            MetaValue::Text(String::from_utf8_lossy(value.as_bytes()).into_owned())
        };
        metadata.push((key.to_owned(), value));
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    let flow = Arc::new(Flow::new(unsent.clone()));
    lock(&shared.calls).insert(
        id,
        CallHandle {
            tx,
            flow: flow.clone(),
        },
    );
    shared.push(Event::Call(Box::new(Call {
        id,
        path: parts.uri.path().to_owned(),
        metadata,
        timeout_s,
        peer: peer.clone(),
        dns_names: dns_names.clone(),
    })));
    tokio::spawn(run_call(
        shared.clone(),
        id,
        body,
        respond,
        rx,
        flow,
        limits.max_receive_bytes,
    ));
}

fn respond_plain(respond: &mut SendResponse<Bytes>, status: StatusCode) {
    let mut response = Response::new(());
    *response.status_mut() = status;
    let _ = respond.send_response(response, true);
}

/// The response side of a call: headers not sent yet, or the open stream after them.
enum Responder {
    Pending(SendResponse<Bytes>),
    Open(SendStream<Bytes>),
}

impl Responder {
    fn poll_reset(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let polled = match self {
            Responder::Pending(r) => r.poll_reset(cx),
            Responder::Open(s) => s.poll_reset(cx),
        };
        polled.map(|_| ())
    }

    /// Sends the response headers (plus `metadata`) if not sent yet.
    fn open(&mut self, metadata: Option<HeaderMap>) -> Result<&mut SendStream<Bytes>, h2::Error> {
        if let Responder::Pending(respond) = self {
            let mut response = Response::new(());
            let headers = response.headers_mut();
            if let Some(metadata) = metadata {
                *headers = metadata;
            }
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            let stream = respond.send_response(response, false)?;
            *self = Responder::Open(stream);
        }
        match self {
            Responder::Open(stream) => Ok(stream),
            Responder::Pending(_) => unreachable!("opened above"),
        }
    }

    /// Ends the call with `trailers`: trailers-only if nothing was sent yet.
    fn finish(self, trailers: HeaderMap) -> Result<(), h2::Error> {
        match self {
            Responder::Pending(mut respond) => {
                let mut response = Response::new(());
                *response.headers_mut() = trailers;
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                respond.send_response(response, true).map(|_| ())
            }
            Responder::Open(mut stream) => stream.send_trailers(trailers),
        }
    }
}

/// `grpc-status` and `grpc-message` trailers, ahead of any trailing metadata.
pub fn status_trailers(code: u32, message: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(code),
    );
    if !message.is_empty() {
        let encoded = codec::percent_encode(message);
        // Percent-encoding leaves only printable ASCII, always a valid header value.
        if let Ok(v) = HeaderValue::from_str(&encoded) {
            trailers.insert(HeaderName::from_static("grpc-message"), v);
        }
    }
    trailers
}

/// Response data a call's task holds until h2 grants the flow-control capacity to send it.
#[derive(Default)]
struct Outgoing {
    chunks: VecDeque<Bytes>,
    /// Total length of `chunks`.
    queued: usize,
}

impl Outgoing {
    fn push(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.queued += data.len();
            self.chunks.push_back(data);
        }
    }

    fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Up to `max` bytes (more than 0) from the front, as one buffer: a chunk or part of one
    /// as is, several chunks copied together.
    fn take(&mut self, max: usize) -> Bytes {
        let single = self.chunks.len() == 1;
        let out = match self.chunks.front_mut() {
            None => return Bytes::new(),
            Some(front) if front.len() > max => front.split_to(max),
            Some(front) if front.len() == max || single => {
                let whole = std::mem::take(front);
                self.chunks.pop_front();
                whole
            }
            Some(_) => {
                let mut joined = BytesMut::with_capacity(max.min(self.queued));
                while let Some(front) = self.chunks.front_mut() {
                    let room = max - joined.len();
                    if front.len() > room {
                        joined.extend_from_slice(&front.split_to(room));
                    } else {
                        joined.extend_from_slice(front);
                        self.chunks.pop_front();
                    }
                    if joined.len() == max {
                        break;
                    }
                }
                joined.freeze()
            }
        };
        self.queued -= out.len();
        out
    }
}

/// Passes `out` to h2 as far as the stream's capacity goes, reserving what is left. The
/// bytes passed leave the call's pending count; Ok(true) if that makes its Writable due.
fn flush(
    stream: &mut SendStream<Bytes>,
    out: &mut Outgoing,
    flow: &Flow,
) -> Result<bool, h2::Error> {
    let mut passed = 0;
    let mut result = Ok(());
    while !out.is_empty() {
        stream.reserve_capacity(out.queued.min(MAX_RESERVE));
        let capacity = stream.capacity();
        if capacity == 0 {
            break;
        }
        let data = out.take(capacity);
        passed += data.len();
        result = stream.send_data(data, false);
        if result.is_err() {
            break;
        }
    }
    let writable = passed > 0 && flow.passed(passed);
    result.map(|()| writable)
}

/// What woke a call's task on its response stream.
enum StreamEvent {
    /// The client reset the stream, or the stream or connection failed.
    Gone,
    /// More send capacity.
    Capacity,
}

/// Resolves on a reset, and also on new send capacity while `waiting` for some.
fn poll_stream(
    responder: &mut Responder,
    waiting: bool,
    cx: &mut std::task::Context<'_>,
) -> Poll<StreamEvent> {
    if responder.poll_reset(cx).is_ready() {
        return Poll::Ready(StreamEvent::Gone);
    }
    match responder {
        Responder::Open(stream) if waiting => match stream.poll_capacity(cx) {
            Poll::Ready(Some(Ok(_))) => Poll::Ready(StreamEvent::Capacity),
            Poll::Ready(Some(Err(_)) | None) => Poll::Ready(StreamEvent::Gone),
            Poll::Pending => Poll::Pending,
        },
        _ => Poll::Pending,
    }
}

/// Ends a call refused here at once: what Python queued still goes first (whole messages
/// before the status), left to h2's buffer whatever the capacity.
fn end_now(mut responder: Responder, mut out: Outgoing, trailers: HeaderMap) {
    if let Responder::Open(stream) = &mut responder {
        while !out.is_empty() {
            if stream.send_data(out.take(usize::MAX), false).is_err() {
                return;
            }
        }
    }
    let _ = responder.finish(trailers);
}

/// Gives back to its connection what a call's task still held when it ended.
struct Release(Arc<Flow>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// How a call's task goes on after a command.
enum Next {
    Continue,
    /// The stream failed: reset it and report the call gone.
    Gone,
    /// Python ended the call with these trailers, to follow the data still held.
    Finish(HeaderMap),
}

fn apply(cmd: Option<Cmd>, responder: &mut Responder, out: &mut Outgoing) -> Next {
    match cmd {
        Some(Cmd::Data(data)) => match responder.open(None) {
            Ok(_) => {
                out.push(data);
                Next::Continue
            }
            Err(_) => Next::Gone,
        },
        Some(Cmd::Headers(metadata)) => match responder.open(Some(metadata)) {
            Ok(_) => Next::Continue,
            Err(_) => Next::Gone,
        },
        Some(Cmd::Finish(trailers)) => Next::Finish(trailers),
        // The transport closed, or `finish` raced a Rust-side end: nothing to send.
        None => Next::Gone,
    }
}

/// One call: request messages to Python as they complete, Python's commands to the stream,
/// response data as the client's flow-control window admits it, then the trailers.
async fn run_call(
    shared: Arc<Shared>,
    id: u64,
    mut body: RecvStream,
    respond: SendResponse<Bytes>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    flow: Arc<Flow>,
    max_receive_bytes: usize,
) {
    // However the task ends (after the call left `calls`, so nothing is queued after it).
    let _release = Release(flow.clone());
    let mut responder = Responder::Pending(respond);
    let mut decoder = Decoder::new(max_receive_bytes);
    let mut out = Outgoing::default();
    // Set once Python has ended the call: the trailers wait for the data still held.
    let mut finish: Option<HeaderMap> = None;
    let mut reading = !body.is_end_stream();
    if !reading {
        shared.push(Event::HalfClose(id));
    }
    'call: loop {
        if let (Responder::Open(stream), false) = (&mut responder, out.is_empty()) {
            match flush(stream, &mut out, &flow) {
                // Python no longer hears of a call it finished.
                Ok(writable) => {
                    if writable && finish.is_none() {
                        shared.push(Event::Writable(id));
                    }
                }
                Err(_) => break,
            }
        }
        if out.is_empty()
            && let Some(trailers) = finish.take()
        {
            let _ = responder.finish(trailers);
            return;
        }
        let waiting = !out.is_empty();
        tokio::select! {
            // Commands first: answering what Python already decided is cheaper than reading more.
            biased;
            cmd = cmds.recv(), if finish.is_none() => {
                // Everything queued meanwhile too, so that it reaches h2 together.
                let mut next = apply(cmd, &mut responder, &mut out);
                loop {
                    match next {
                        Next::Continue => {}
                        Next::Gone => break 'call,
                        Next::Finish(trailers) => {
                            finish = Some(trailers);
                            break;
                        }
                    }
                    match cmds.try_recv() {
                        Ok(cmd) => next = apply(Some(cmd), &mut responder, &mut out),
                        Err(_) => break,
                    }
                }
            }
            chunk = body.data(), if reading => match chunk {
                // After `finish`, the rest of the request is read only to free its window.
                Some(Ok(chunk)) if finish.is_some() => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    decoder.push(&chunk);
                    while let Some(message) = decoder.next_message() {
                        match message {
                            Ok(message) => shared.push(Event::Message(id, message)),
                            Err(reject) => {
                                let trailers = match reject {
                                    // grpcio's words, byte for byte, "SERVER: " included.
                                    Reject::TooLarge(declared) => status_trailers(
                                        8,
                                        &format!(
                                            "SERVER: Received message larger than max ({declared} vs. {max_receive_bytes})"
                                        ),
                                    ),
                                    Reject::Compressed => {
                                        status_trailers(12, "compressed messages are not supported")
                                    }
                                };
                                end_now(responder, out, trailers);
                                shared.forget(id);
                                return;
                            }
                        }
                    }
                }
                None => {
                    reading = false;
                    if finish.is_some() {
                        continue;
                    }
                    if decoder.has_partial() {
                        let trailers = status_trailers(13, "the request ended inside a message");
                        end_now(responder, out, trailers);
                        shared.forget(id);
                        return;
                    }
                    shared.push(Event::HalfClose(id));
                }
                Some(Err(_)) => break,
            },
            event = poll_fn(|cx| poll_stream(&mut responder, waiting, cx)) => match event {
                StreamEvent::Capacity => {}
                StreamEvent::Gone => break,
            },
        }
    }
    if let Responder::Open(stream) = &mut responder {
        stream.send_reset(Reason::CANCEL);
    }
    shared.forget(id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_read_like_grpcio() {
        assert_eq!(
            peer_string("127.0.0.1:5555".parse().unwrap()),
            "ipv4:127.0.0.1:5555"
        );
        assert_eq!(
            peer_string("[::1]:5555".parse().unwrap()),
            "ipv6:[::1]:5555"
        );
        assert_eq!(
            peer_string("[::ffff:10.1.2.3]:7".parse().unwrap()),
            "ipv4:10.1.2.3:7"
        );
    }

    #[test]
    fn outgoing_takes_whole_split_and_joined() {
        let mut out = Outgoing::default();
        out.push(Bytes::from_static(b"abc"));
        out.push(Bytes::new());
        assert_eq!(out.take(10), &b"abc"[..]);
        assert!(out.is_empty());
        for chunk in [&b"abcd"[..], b"ef", b"ghi"] {
            out.push(Bytes::from_static(chunk));
        }
        assert_eq!(out.queued, 9);
        assert_eq!(out.take(3), &b"abc"[..]);
        assert_eq!(out.take(1), &b"d"[..]);
        assert_eq!(out.take(4), &b"efgh"[..]);
        assert_eq!(out.queued, 1);
        assert_eq!(out.take(4), &b"i"[..]);
        assert!(out.is_empty() && out.chunks.is_empty());
        assert_eq!(out.take(4), &b""[..]);
    }

    #[test]
    fn writable_once_per_arming() {
        let flow = Flow::new(Arc::new(Unsent::new(0, Arc::default())));
        assert!(
            !flow.arm(flow.queue(HIGH_WATER)),
            "at HIGH_WATER: not armed"
        );
        assert!(!flow.passed(HIGH_WATER));
        let after = flow.queue(HIGH_WATER + 1);
        assert!(!flow.arm(after));
        assert!(!flow.arm(flow.queue(10)), "still armed: no second event");
        assert!(
            !flow.passed(HIGH_WATER + 11 - LOW_WATER - 1),
            "above LOW_WATER"
        );
        assert!(flow.passed(1), "at LOW_WATER");
        assert!(!flow.passed(LOW_WATER), "spent");
        assert_eq!(flow.pending(), 0);
        // The task drains between the count and the arming: the sender owes the event.
        let after = flow.queue(HIGH_WATER + 1);
        assert!(!flow.passed(HIGH_WATER + 1));
        assert!(flow.arm(after));
        assert!(!flow.disarm());
    }

    #[test]
    fn a_connection_holds_its_calls_pending_bytes_until_they_end() {
        let total = Arc::new(AtomicUsize::new(0));
        let unsent = Arc::new(Unsent::new(100, total.clone()));
        let (a, b) = (Flow::new(unsent.clone()), Flow::new(unsent.clone()));
        assert!(unsent.admits(1000), "nothing held: any one answer goes");
        a.queue(60);
        assert!(unsent.admits(40) && !unsent.admits(41) && !unsent.over());
        b.queue(50);
        assert!(unsent.over());
        assert_eq!(total.load(Ordering::SeqCst), 110);
        a.passed(60);
        assert!(!unsent.over());
        b.release();
        assert_eq!(total.load(Ordering::SeqCst), 0);
        assert!(unsent.admits(1000));
    }

    /// A real h2 client that reads nothing for a while, then everything.
    #[test]
    fn flow_control_holds_data_until_the_client_reads() {
        const COUNT: usize = 200;
        const SIZE: usize = 1024;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (wake, _wakeup) = UnixStream::pair().unwrap();
            wake.set_nonblocking(true).unwrap();
            let shared = Arc::new(Shared::new(wake));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (_state, state_rx) = watch::channel(State::Serving);
            let limits = Limits {
                max_receive_bytes: 1000,
                max_unsent_bytes: 1 << 30,
                max_concurrent_streams: 10,
                keepalive_interval: None,
                keepalive_timeout: Duration::from_secs(20),
            };
            let server_shared = shared.clone();
            tokio::spawn(async move {
                let (io, _) = listener.accept().await.unwrap();
                let (peer, names) = (Arc::from("test"), Arc::from(Vec::new()));
                serve_connection(server_shared, io, peer, names, limits, state_rx).await;
            });
            let io = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut client, conn) = h2::client::handshake(io).await.unwrap();
            tokio::spawn(conn);
            let request = Request::post("http://test/x.Y/Stream")
                .header(CONTENT_TYPE, "application/grpc")
                .body(())
                .unwrap();
            let (response, mut request_body) = client.send_request(request, false).unwrap();
            request_body.send_data(Bytes::new(), true).unwrap();

            let events = async || {
                tokio::time::sleep(Duration::from_millis(20)).await;
                std::mem::take(&mut lock(&shared.queue).events)
            };
            let id = loop {
                let found = events().await.iter().find_map(|e| match e {
                    Event::Call(call) => Some(call.id),
                    _ => None,
                });
                if let Some(id) = found {
                    break id;
                }
            };
            let framed = codec::PREFIX_LEN + SIZE;
            let mut results = Vec::new();
            for i in 0..COUNT {
                let mut data = BytesMut::new();
                codec::frame_into(&mut data, &[i as u8; SIZE]);
                results.push(shared.send(id, data.freeze(), false));
                tokio::task::yield_now().await;
            }
            assert!(results.windows(2).all(|w| w[0] <= w[1] + framed as i64));
            assert!(*results.last().unwrap() > HIGH_WATER as i64, "{results:?}");
            assert!(*results.last().unwrap() <= (COUNT * framed) as i64);
            events().await;
            // h2's default 64 KiB window (less a byte) went out; the rest waits.
            let pending = shared.send(id, Bytes::new(), false);
            assert_eq!(pending, (COUNT * framed - 65_535) as i64);
            assert!(
                !events()
                    .await
                    .iter()
                    .any(|e| matches!(e, Event::Writable(_)))
            );

            let mut body = response.await.unwrap().into_body();
            let mut received = BytesMut::new();
            while received.len() < COUNT * framed {
                let chunk = body.data().await.unwrap().unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
                received.extend_from_slice(&chunk);
            }
            let writable: Vec<_> = events()
                .await
                .into_iter()
                .filter_map(|e| match e {
                    Event::Writable(id) => Some(id),
                    _ => None,
                })
                .collect();
            assert_eq!(writable, vec![id]);
            assert_eq!(shared.send(id, Bytes::new(), false), 0);
            let mut decoder = Decoder::new(SIZE);
            decoder.push(&received);
            for i in 0..COUNT {
                assert_eq!(
                    decoder.next_message().unwrap().unwrap(),
                    vec![i as u8; SIZE]
                );
            }
            assert!(!decoder.has_partial());

            let call = lock(&shared.calls).remove(&id).unwrap();
            let _ = call.tx.send(Cmd::Finish(status_trailers(0, "")));
            let trailers = body.trailers().await.unwrap().unwrap();
            assert_eq!(trailers["grpc-status"], "0");
            assert_eq!(shared.send(id, Bytes::new(), false), -1);
        });
    }

    #[test]
    fn status_trailers_encode_the_message() {
        let t = status_trailers(5, "no such thing ü");
        assert_eq!(t["grpc-status"], "5");
        assert_eq!(t["grpc-message"], "no such thing %C3%BC");
        assert!(!status_trailers(0, "").contains_key("grpc-message"));
    }
}
