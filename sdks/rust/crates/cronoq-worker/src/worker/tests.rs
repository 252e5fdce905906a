//! The worker against fake `Workers` servers, for what the real server cannot be made to do:
//! redirects, refusals, backoff timing, the wire form of every outcome, drains. The fakes
//! run in memory on a paused clock, so timings are exact and nothing waits on the wall
//! clock; the TLS tests use loopback sockets and assert no timing.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Server, ServerTlsConfig, Uri};
use tonic::{Response, Streaming};

use super::*;
use crate::proto::server_message::Msg as ServerMsg;
use crate::proto::worker_message::Msg;
use crate::proto::workers_server::{Workers, WorkersServer};
use crate::proto::{self, ServerMessage, WorkerMessage};
use pki::Pki;

#[path = "../../tests/common/pki.rs"]
mod pki;

/// Longer than anything a test waits for, so on the paused clock it passes only when the
/// worker is stuck.
const STUCK: Duration = Duration::from_secs(120);

type Outbound = mpsc::UnboundedSender<Result<ServerMessage, Status>>;
type Reply = Result<UnboundedReceiverStream<Result<ServerMessage, Status>>, Status>;

/// One stream opened to a fake: the test reads it and decides how the server answers.
struct Conn {
    at: Instant,
    authorization: Option<String>,
    /// The client presented a certificate.
    client_cert: bool,
    inbound: Streaming<WorkerMessage>,
    reply: oneshot::Sender<Reply>,
}

impl Conn {
    async fn register(&mut self) -> proto::Register {
        match self.inbound.message().await {
            Ok(Some(WorkerMessage {
                msg: Some(Msg::Register(r)),
            })) => r,
            other => panic!("first message {other:?}"),
        }
    }

    /// Refuses the stream before any message, as a server does.
    fn refuse(self, status: Status) {
        let _ = self.reply.send(Err(status));
    }

    /// Reads the register, answers it with `registered` and returns the open stream.
    async fn accept(mut self, registered: proto::Registered) -> Stream {
        self.register().await;
        let (out, rx) = mpsc::unbounded_channel();
        let _ = self.reply.send(Ok(UnboundedReceiverStream::new(rx)));
        let stream = Stream {
            out,
            inbound: self.inbound,
        };
        stream.send(ServerMsg::Registered(registered));
        stream
    }
}

struct Stream {
    out: Outbound,
    inbound: Streaming<WorkerMessage>,
}

impl Stream {
    fn send(&self, msg: ServerMsg) {
        let _ = self.out.send(Ok(ServerMessage { msg: Some(msg) }));
    }

    fn lease(&self, id: u64, payload: &'static str) {
        self.send(ServerMsg::Lease(proto::Lease {
            lease: id,
            task_id: id,
            attempt: 1,
            payload: Bytes::from_static(payload.as_bytes()),
            ..Default::default()
        }));
    }

    /// Hands out a lease and returns the worker's next message.
    async fn answer(&mut self, id: u64, payload: &'static str) -> Option<Msg> {
        self.lease(id, payload);
        self.next().await
    }

    /// The worker's next message; `None` once it half-closed.
    async fn next(&mut self) -> Option<Msg> {
        let m = timeout(STUCK, self.inbound.message())
            .await
            .expect("worker stuck");
        m.expect("stream failed")
            .map(|m| m.msg.expect("empty message"))
    }

    /// Ends the stream with a status after the messages sent so far.
    fn end(self, status: Status) {
        let _ = self.out.send(Err(status));
    }
}

struct Fake {
    conns: mpsc::UnboundedSender<Conn>,
    count: Arc<AtomicU32>,
}

#[tonic::async_trait]
impl Workers for Fake {
    type WorkStream = UnboundedReceiverStream<Result<ServerMessage, Status>>;

    async fn work(
        &self,
        request: tonic::Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::WorkStream>, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned());
        self.count.fetch_add(1, Ordering::SeqCst);
        let client_cert = request.peer_certs().is_some_and(|c| !c.is_empty());
        let (reply, decided) = oneshot::channel();
        let conn = Conn {
            at: Instant::now(),
            authorization,
            client_cert,
            inbound: request.into_inner(),
            reply,
        };
        self.conns
            .send(conn)
            .map_err(|_| Status::unavailable("test over"))?;
        let stream = decided
            .await
            .map_err(|_| Status::unavailable("test over"))??;
        Ok(Response::new(stream))
    }
}

/// The servers that in-memory channels reach, by authority.
#[derive(Clone, Default)]
struct Memory {
    servers: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<tokio::io::DuplexStream>>>>,
}

impl Connect for Memory {
    fn channel(&self, endpoint: Endpoint) -> Channel {
        let servers = self.servers.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
            let server = uri
                .authority()
                .and_then(|a| servers.lock().unwrap().get(a.as_str()).cloned());
            async move {
                let (client, side) = tokio::io::duplex(1 << 16);
                server
                    .and_then(|s| s.send(side).ok())
                    .ok_or(io::ErrorKind::ConnectionRefused)?;
                Ok::<_, io::Error>(TokioIo::new(client))
            }
        }))
    }
}

/// A fake listening at `authority`; its streams arrive on the returned receiver.
struct Listener {
    conns: mpsc::UnboundedReceiver<Conn>,
    count: Arc<AtomicU32>,
}

impl Listener {
    async fn next(&mut self) -> Conn {
        timeout(STUCK, self.conns.recv())
            .await
            .expect("worker stuck")
            .expect("fake gone")
    }
}

impl Memory {
    fn listen(&self, authority: &str) -> Listener {
        let (tx, rx) = mpsc::unbounded_channel();
        self.servers
            .lock()
            .unwrap()
            .insert(authority.to_owned(), tx);
        let incoming = UnboundedReceiverStream::new(rx).map(Ok::<_, io::Error>);
        fake(Server::builder(), incoming)
    }
}

/// A fake on a loopback socket with TLS: its address and its streams.
async fn listen_tls(tls: ServerTlsConfig) -> (String, Listener) {
    let socket = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    let server = Server::builder().tls_config(tls).unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(socket);
    (addr, fake(server, incoming))
}

fn fake<I, IO>(mut server: Server, incoming: I) -> Listener
where
    I: tokio_stream::Stream<Item = io::Result<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    let (conns, conns_rx) = mpsc::unbounded_channel();
    let count = Arc::new(AtomicU32::new(0));
    let fake = Fake {
        conns,
        count: count.clone(),
    };
    let router = server.add_service(WorkersServer::new(fake));
    tokio::spawn(router.serve_with_incoming(incoming));
    Listener {
        conns: conns_rx,
        count,
    }
}

/// A worker run in the background; dropping `stop` (or sending) starts its drain.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), WorkerError>>,
}

impl Running {
    fn shutdown(&mut self) {
        self.stop.take();
    }

    async fn result(mut self) -> Result<(), WorkerError> {
        timeout(STUCK, &mut self.done)
            .await
            .expect("run_worker did not return")
            .unwrap()
    }
}

fn start<H, F>(memory: &Memory, opts: WorkerOptions, handler: H) -> Running
where
    H: Fn(Lease) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(serve(
        opts,
        handler,
        async move {
            let _ = stopped.await;
        },
        memory.clone(),
    ));
    Running {
        stop: Some(stop),
        done,
    }
}

async fn ok(_: Lease) -> Result<Bytes, TaskError> {
    Ok(Bytes::from_static(b"ok"))
}

fn registered(slots: u32) -> proto::Registered {
    proto::Registered {
        worker_id: 1,
        slots,
        protocol_version: 3,
        ..Default::default()
    }
}

fn redirect(endpoint: &str) -> Status {
    let mut status = Status::failed_precondition("pool served by shard other");
    let md = status.metadata_mut();
    md.insert(session::ENDPOINT_KEY, endpoint.parse().unwrap());
    md.insert("cronoq-shard", "other".parse().unwrap());
    status
}

/// Accepts a stream, hands out one lease and returns the worker's answer.
async fn complete_once(conn: Conn) -> (Msg, Stream) {
    let mut stream = conn.accept(registered(1)).await;
    stream.lease(1, "x");
    (stream.next().await.expect("half-closed"), stream)
}

#[tokio::test(start_paused = true)]
async fn registers_with_its_options_and_follows_a_redirect() {
    let memory = Memory::default();
    let mut entry = memory.listen("127.0.0.1:1001");
    let mut shard = memory.listen("127.0.0.1:1002");
    let opts = WorkerOptions::new("127.0.0.1:1001", "p")
        .slots(4)
        .token("tok")
        .name("w1")
        .label("gpu", "a100");
    let _worker = start(&memory, opts, ok);

    let mut conn = entry.next().await;
    let register = conn.register().await;
    assert_eq!(conn.authorization.as_deref(), Some("Bearer tok"));
    assert_eq!(
        (
            register.pool.as_str(),
            register.slots,
            register.worker_name.as_str()
        ),
        ("p", 4, "w1")
    );
    assert_eq!(register.protocol_version, 3);
    assert_eq!(
        register.labels,
        HashMap::from([("gpu".into(), "a100".into())])
    );
    let refused_at = conn.at;
    conn.refuse(redirect("http://127.0.0.1:1002/"));

    let conn = shard.next().await;
    // A redirect is followed at once, with the same token.
    assert_eq!(conn.at, refused_at);
    assert_eq!(conn.authorization.as_deref(), Some("Bearer tok"));
    let (answer, _stream) = complete_once(conn).await;
    assert!(matches!(answer, Msg::Complete(c) if c.lease == 1 && c.output == "ok"));
}

#[tokio::test(start_paused = true)]
async fn unsafe_redirects_are_refused() {
    for (endpoint, token, reason) in [
        (
            "grpc://127.0.0.1:1",
            None,
            "not an http:// or https:// endpoint",
        ),
        ("127.0.0.1:1", None, "not an http:// or https:// endpoint"),
        (
            "http://user:pw@127.0.0.1:1",
            None,
            "not a plain host and port",
        ),
        (
            "http://127.0.0.1:1/cronoq",
            None,
            "not a plain host and port",
        ),
        (
            "http://192.0.2.77:7070",
            Some("tok"),
            "token over plain http",
        ),
        (
            "http://localhost.example.com:7070",
            Some("tok"),
            "token over plain http",
        ),
    ] {
        let memory = Memory::default();
        let mut entry = memory.listen("127.0.0.1:1001");
        let mut opts = WorkerOptions::new("http://127.0.0.1:1001", "p");
        opts.token = token.map(str::to_owned);
        let worker = start(&memory, opts, ok);
        entry.next().await.refuse(redirect(endpoint));
        let err = worker.result().await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{endpoint}");
        let text = err.to_string();
        assert!(
            text.starts_with("refusing shard redirect") && text.contains(reason),
            "{endpoint}: {text}"
        );
        assert_eq!(entry.count.load(Ordering::SeqCst), 1, "{endpoint}");
    }
}

#[tokio::test(start_paused = true)]
async fn insecure_redirect_http_sends_the_token_to_another_host() {
    let memory = Memory::default();
    let mut entry = memory.listen("127.0.0.1:1001");
    let mut shard = memory.listen("192.0.2.7:7070");
    let opts = WorkerOptions::new("http://127.0.0.1:1001", "p")
        .token("tok")
        .insecure_redirect_http(true);
    let _worker = start(&memory, opts, ok);
    entry.next().await.refuse(redirect("http://192.0.2.7:7070"));
    let conn = shard.next().await;
    assert_eq!(conn.authorization.as_deref(), Some("Bearer tok"));
    let (answer, _stream) = complete_once(conn).await;
    assert!(matches!(answer, Msg::Complete(_)));
}

#[tokio::test(start_paused = true)]
async fn redirects_in_a_loop_end_after_the_limit() {
    let memory = Memory::default();
    let mut a = memory.listen("127.0.0.1:1001");
    let mut b = memory.listen("127.0.0.1:1002");
    let worker = start(
        &memory,
        WorkerOptions::new("http://127.0.0.1:1001", "p"),
        ok,
    );
    for _ in 0..2 {
        a.next().await.refuse(redirect("http://127.0.0.1:1002"));
        b.next().await.refuse(redirect("http://127.0.0.1:1001"));
    }
    let err = worker.result().await.unwrap_err();
    assert!(err.to_string().contains("4 redirects in a row"), "{err}");
    assert_eq!(
        a.count.load(Ordering::SeqCst) + b.count.load(Ordering::SeqCst),
        MAX_REDIRECTS + 1
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_shard_sends_the_worker_back_to_its_endpoint() {
    let memory = Memory::default();
    let mut entry = memory.listen("127.0.0.1:1001");
    let _worker = start(
        &memory,
        WorkerOptions::new("http://127.0.0.1:1001", "p"),
        ok,
    );
    let conn = entry.next().await;
    let refused_at = conn.at;
    conn.refuse(redirect("http://127.0.0.1:1999"));
    let conn = entry.next().await;
    // The failed connection to the shard waited for the first backoff.
    assert_eq!(conn.at - refused_at, Duration::from_millis(200));
    let (answer, _stream) = complete_once(conn).await;
    assert!(matches!(answer, Msg::Complete(_)));
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_to_its_cap_and_resets_after_a_registration() {
    let memory = Memory::default();
    let mut server = memory.listen("127.0.0.1:1001");
    let opts = WorkerOptions::new("http://127.0.0.1:1001", "p")
        .initial_backoff(Duration::from_millis(100))
        .max_backoff(Duration::from_millis(700));
    let mut worker = start(&memory, opts, ok);
    let mut last = server.next().await;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let at = last.at;
        last.refuse(Status::unavailable("standby"));
        last = server.next().await;
        gaps.push((last.at - at).as_millis());
    }
    assert_eq!(gaps, [100, 200, 400, 700, 700]);
    // A session that registered resets the delay.
    let at = last.at;
    let stream = last.accept(registered(1)).await;
    stream.end(Status::internal("crash"));
    let next = server.next().await;
    assert_eq!((next.at - at).as_millis(), 100);
    // A shutdown during the wait ends it at once.
    next.refuse(Status::unavailable("standby"));
    let waiting = Instant::now();
    worker.shutdown();
    worker.result().await.unwrap();
    assert_eq!(Instant::now(), waiting);
}

#[tokio::test(start_paused = true)]
async fn not_leader_reconnects_at_once_and_a_plain_shutdown_after_the_backoff() {
    for (not_leader, gap) in [(true, 0), (false, 800)] {
        let memory = Memory::default();
        let mut server = memory.listen("127.0.0.1:1001");
        let opts = WorkerOptions::new("http://127.0.0.1:1001", "p")
            .initial_backoff(Duration::from_millis(800));
        let _worker = start(&memory, opts, ok);
        let stream = server.next().await.accept(registered(1)).await;
        let at = Instant::now();
        stream.send(ServerMsg::Shutdown(proto::Shutdown {
            reason: "bye".into(),
            not_leader,
        }));
        let next = server.next().await;
        assert_eq!((next.at - at).as_millis(), gap, "not_leader={not_leader}");
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_that_retrying_cannot_fix_end_the_worker() {
    for code in [
        Code::Unauthenticated,
        Code::PermissionDenied,
        Code::NotFound,
        Code::InvalidArgument,
        Code::Unimplemented,
        Code::FailedPrecondition,
    ] {
        let memory = Memory::default();
        let mut server = memory.listen("127.0.0.1:1001");
        let worker = start(
            &memory,
            WorkerOptions::new("http://127.0.0.1:1001", "p"),
            ok,
        );
        server.next().await.refuse(Status::new(code, "no"));
        let err = worker.result().await.unwrap_err();
        assert!(
            matches!(&err, WorkerError::Refused(s) if s.code() == code),
            "{err}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_reconnect_the_first_end_is_an_error() {
    let memory = Memory::default();
    let mut server = memory.listen("127.0.0.1:1001");
    let opts = WorkerOptions::new("http://127.0.0.1:1001", "p").reconnect(false);
    let worker = start(&memory, opts, ok);
    server.next().await.refuse(Status::unavailable("standby"));
    let err = worker.result().await.unwrap_err();
    assert!(matches!(&err, WorkerError::Disconnected(Some(s)) if s.code() == Code::Unavailable));
}

#[tokio::test(start_paused = true)]
async fn heartbeats_every_third_of_the_lease_ttl() {
    let memory = Memory::default();
    let mut server = memory.listen("127.0.0.1:1001");
    let _worker = start(
        &memory,
        WorkerOptions::new("http://127.0.0.1:1001", "p"),
        |_| async {
            tokio::time::sleep(Duration::from_millis(1050)).await;
            Ok(Bytes::new())
        },
    );
    let mut reg = registered(1);
    reg.lease_ttl_s = Some(0.3);
    let mut stream = server.next().await.accept(reg).await;
    let started = Instant::now();
    stream.lease(5, "slow");
    let mut beats = Vec::new();
    loop {
        match stream.next().await {
            Some(Msg::Heartbeat(h)) if h.lease == 5 => {
                beats.push((Instant::now() - started).as_millis())
            }
            Some(Msg::Complete(c)) if c.lease == 5 => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(beats, [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]);
}

#[tokio::test(start_paused = true)]
async fn every_outcome_on_the_wire() {
    let memory = Memory::default();
    let mut server = memory.listen("127.0.0.1:1001");
    let (cancelled_tx, mut cancelled) = mpsc::unbounded_channel();
    let opts = WorkerOptions::new("http://127.0.0.1:1001", "p").slots(4);
    let _worker = start(&memory, opts, move |lease: Lease| {
        let cancelled_tx = cancelled_tx.clone();
        async move {
            match &lease.payload[..] {
                b"big" => Ok(Bytes::from(vec![0; 4096 - 1024 + 1])),
                b"fits" => Ok(Bytes::from(vec![0; 4096 - 1024])),
                b"panic" => panic!("boom"),
                b"retry" => Err(TaskError::retry_after("later", Duration::from_millis(1500))),
                b"permanent" => Err(TaskError::permanent("bad input")),
                b"error" => Err(TaskError::from_err(io::Error::other("disk full"))),
                b"cancel" => Err(TaskError::Cancelled),
                _ => {
                    lease.cancel.cancelled().await;
                    cancelled_tx.send(lease.lease).unwrap();
                    Ok(Bytes::from_static(b"after the abort"))
                }
            }
        }
    });
    // One slot granted although the worker asks for four.
    let mut reg = registered(1);
    reg.max_message_bytes = 4096;
    let mut stream = server.next().await.accept(reg).await;
    let fail = |m: Option<Msg>| match m {
        Some(Msg::Fail(f)) => f,
        other => panic!("{other:?}"),
    };
    let f = fail(stream.answer(1, "big").await);
    assert!(
        f.permanent && f.message.contains("message limit of 4096 bytes"),
        "{f:?}"
    );
    assert!(
        matches!(stream.answer(2, "fits").await, Some(Msg::Complete(c)) if c.lease == 2 && c.output.len() == 3072)
    );
    let f = fail(stream.answer(3, "panic").await);
    assert_eq!(
        (f.lease, f.permanent, f.message.as_str()),
        (3, false, "handler panicked: boom")
    );
    let f = fail(stream.answer(4, "retry").await);
    assert_eq!(
        (f.lease, f.permanent, f.retry_after_s),
        (4, false, Some(1.5))
    );
    assert_eq!(f.message, "later");
    let f = fail(stream.answer(5, "permanent").await);
    assert_eq!(
        (f.permanent, f.message.as_str(), f.retry_after_s),
        (true, "bad input", None)
    );
    let f = fail(stream.answer(6, "error").await);
    assert_eq!((f.permanent, f.message.as_str()), (false, "disk full"));
    assert!(matches!(stream.answer(7, "cancel").await, Some(Msg::Cancelled(c)) if c.lease == 7));
    // A lease beyond the grant is handed back without running.
    stream.lease(8, "block");
    stream.lease(9, "block");
    assert!(
        matches!(stream.next().await, Some(Msg::Nack(n)) if n.lease == 9 && n.reason == "worker has no free slot")
    );
    // An abort cancels the lease and frees its slot; nothing is reported for it.
    stream.send(ServerMsg::Abort(proto::Abort {
        lease: 8,
        reason: "attempt timed out".into(),
    }));
    assert_eq!(cancelled.recv().await, Some(8));
    stream.lease(10, "cancel");
    assert!(matches!(stream.next().await, Some(Msg::Cancelled(c)) if c.lease == 10));
}

#[tokio::test(start_paused = true)]
async fn drain_lets_handlers_finish_then_cuts_the_rest() {
    let memory = Memory::default();
    let mut server = memory.listen("127.0.0.1:1001");
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let opts = WorkerOptions::new("http://127.0.0.1:1001", "p")
        .slots(4)
        .drain_timeout(Duration::from_millis(200));
    let mut worker = start(&memory, opts, move |lease: Lease| {
        entered_tx.send(()).unwrap();
        async move {
            match &lease.payload[..] {
                b"quick" => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok(Bytes::from_static(b"quick"))
                }
                b"in time" => {
                    lease.cancel.cancelled().await;
                    Ok(Bytes::from_static(b"in time"))
                }
                b"gives up" => {
                    lease.cancel.cancelled().await;
                    Err(TaskError::Cancelled)
                }
                _ => {
                    // Ignores the cancellation past the outcome grace: dropped.
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(Bytes::from_static(b"too late"))
                }
            }
        }
    });
    let mut stream = server.next().await.accept(registered(4)).await;
    for (id, payload) in [
        (1, "quick"),
        (2, "in time"),
        (3, "gives up"),
        (4, "stubborn"),
    ] {
        stream.lease(id, payload);
        entered.recv().await;
    }
    let stopped = Instant::now();
    worker.shutdown();
    assert!(matches!(stream.next().await, Some(Msg::SetSlots(s)) if s.slots == 0));
    stream.lease(5, "quick");
    let mut outcomes = Vec::new();
    while let Some(msg) = stream.next().await {
        let outcome = match msg {
            Msg::Complete(c) => format!(
                "{} complete {}",
                c.lease,
                String::from_utf8_lossy(&c.output)
            ),
            Msg::Nack(n) => format!("{} nack {}", n.lease, n.reason),
            other => panic!("{other:?}"),
        };
        outcomes.push((outcome, (Instant::now() - stopped).as_millis()));
    }
    // The half-close comes once the last handler is given up, after the outcome grace.
    let closed = Instant::now() - stopped;
    assert_eq!(closed, Duration::from_millis(200) + session::OUTCOME_GRACE);
    assert_eq!(
        outcomes,
        [
            ("5 nack worker is stopping".to_string(), 0),
            ("1 complete quick".to_string(), 100),
            ("2 complete in time".to_string(), 200),
        ]
    );
    drop(stream);
    worker.result().await.unwrap();
}

/// A handler cut by the drain timeout keeps its lease heartbeaten until it returns, so that
/// its outcome, reported within the grace, is not lost to a short lease TTL.
#[tokio::test(start_paused = true)]
async fn a_cut_lease_is_heartbeaten_until_its_outcome() {
    let memory = Memory::default();
    let mut server = memory.listen("127.0.0.1:1001");
    let opts =
        WorkerOptions::new("http://127.0.0.1:1001", "p").drain_timeout(Duration::from_millis(200));
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let mut worker = start(&memory, opts, move |lease: Lease| {
        entered_tx.send(()).unwrap();
        async move {
            lease.cancel.cancelled().await;
            tokio::time::sleep(Duration::from_millis(1050)).await;
            Ok(Bytes::from_static(b"late"))
        }
    });
    let mut reg = registered(1);
    reg.lease_ttl_s = Some(0.9);
    let mut stream = server.next().await.accept(reg).await;
    let started = Instant::now();
    stream.lease(1, "x");
    entered.recv().await;
    worker.shutdown();
    let mut messages = Vec::new();
    while let Some(msg) = stream.next().await {
        let what = match msg {
            Msg::SetSlots(s) => format!("set_slots {}", s.slots),
            Msg::Heartbeat(h) => format!("{} heartbeat", h.lease),
            Msg::Complete(c) => format!(
                "{} complete {}",
                c.lease,
                String::from_utf8_lossy(&c.output)
            ),
            other => panic!("{other:?}"),
        };
        messages.push((what, (Instant::now() - started).as_millis()));
    }
    let at = |what: &str, ms| (what.to_string(), ms);
    assert_eq!(
        messages,
        [
            at("set_slots 0", 0),
            at("1 heartbeat", 300),
            at("1 heartbeat", 600),
            at("1 heartbeat", 900),
            at("1 heartbeat", 1200),
            at("1 complete late", 1250),
        ]
    );
    drop(stream);
    worker.result().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_ends_the_stream_is_left_after_the_close_wait() {
    let memory = Memory::default();
    let mut server = memory.listen("127.0.0.1:1001");
    let mut worker = start(
        &memory,
        WorkerOptions::new("http://127.0.0.1:1001", "p"),
        ok,
    );
    let mut stream = server.next().await.accept(registered(1)).await;
    assert!(matches!(
        stream.answer(1, "x").await,
        Some(Msg::Complete(_))
    ));
    let stopped = Instant::now();
    worker.shutdown();
    assert!(matches!(stream.next().await, Some(Msg::SetSlots(s)) if s.slots == 0));
    assert!(stream.next().await.is_none());
    worker.result().await.unwrap();
    assert_eq!(Instant::now() - stopped, session::CLOSE_WAIT);
}

#[tokio::test]
async fn tls_settings_need_an_https_endpoint() {
    let opts = WorkerOptions::new("http://127.0.0.1:1", "p").tls(WorkerTls::default());
    let err = run_worker(opts, ok, std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, WorkerError::Options(why) if why.contains("https://")),
        "{err}"
    );
    for opts in [
        WorkerOptions::new("http://127.0.0.1:1", "p").slots(0),
        WorkerOptions::new("http://127.0.0.1:1/x", "p"),
        WorkerOptions::new("http://127.0.0.1:1", "p").token("bad\ntoken"),
    ] {
        let err = run_worker(opts, ok, std::future::pending())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    }
}

#[tokio::test]
async fn a_redirect_never_moves_from_tls_to_plain_http() {
    let pki = Pki::new();
    let (cert, key) = pki.leaf(&["127.0.0.1"]);
    let (addr, mut entry) = listen_tls(
        ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(cert, key)),
    )
    .await;
    let tls = WorkerTls {
        ca_pem: Some(pki.ca().into_bytes()),
        ..WorkerTls::default()
    };
    let opts = WorkerOptions::new(format!("https://{addr}"), "p").tls(tls);
    let worker = tokio::spawn(run_worker(opts, ok, std::future::pending()));
    // Reaching the fake at all means the CA verified its certificate.
    entry.next().await.refuse(redirect("http://127.0.0.1:1"));
    let err = timeout(STUCK, worker).await.unwrap().unwrap().unwrap_err();
    assert!(
        err.to_string()
            .contains("would move from TLS to plain http"),
        "{err}"
    );
    assert_eq!(entry.count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn mtls_presents_the_identity_and_verifies_the_configured_domain() {
    let pki = Pki::new();
    let (cert, key) = pki.leaf(&["cronoq.internal"]);
    let server_tls = ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(cert, key))
        .client_ca_root(tonic::transport::Certificate::from_pem(pki.ca()));
    let (addr, mut server) = listen_tls(server_tls).await;
    let (cert, key) = pki.leaf(&["worker.internal"]);
    let tls = WorkerTls {
        ca_pem: Some(pki.ca().into_bytes()),
        identity: Some((cert.into_bytes(), key.into_bytes())),
        domain: Some("cronoq.internal".into()),
    };
    let opts = WorkerOptions::new(format!("https://{addr}"), "p").tls(tls);
    let _worker = tokio::spawn(run_worker(opts, ok, std::future::pending()));
    let conn = server.next().await;
    assert!(conn.client_cert);
    let (answer, _stream) = complete_once(conn).await;
    assert!(matches!(answer, Msg::Complete(_)));
}
