//! The worker against the real cronoq-server: every outcome, heartbeats, slots, aborts, drains,
//! reconnects, fatal refusals, mTLS, a real shard redirect, the trace context, and the README's
//! example program.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{CLIENT_TOKEN, CronoqServer, WORKER_TOKEN, example, interrupt, task};
use cronoq_worker::proto::{self, TaskStatus};
use cronoq_worker::worker::{WorkerError, WorkerOptions, WorkerTls, run_worker};
use cronoq_worker::{Lease, TaskError, TraceContext};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tonic::Code;

/// A worker running in the background until `stop`.
struct Worker {
    shutdown: oneshot::Sender<()>,
    done: JoinHandle<Result<(), WorkerError>>,
}

impl Worker {
    fn start<H, F>(opts: WorkerOptions, handler: H) -> Self
    where
        H: Fn(Lease) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
    {
        let (shutdown, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(run_worker(opts, handler, async {
            let _ = stopped.await;
        }));
        Self { shutdown, done }
    }

    /// Starts the drain and returns what run_worker returned.
    async fn stop(self) -> Result<(), WorkerError> {
        let _ = self.shutdown.send(());
        tokio::time::timeout(Duration::from_secs(30), self.done)
            .await
            .expect("run_worker did not return")
            .unwrap()
    }
}

fn options(server: &CronoqServer, pool: &str) -> WorkerOptions {
    WorkerOptions::new(server.endpoint(), pool)
        .token(WORKER_TOKEN)
        .name(format!("rust-{pool}"))
}

fn status(result: &proto::TaskResult) -> TaskStatus {
    TaskStatus::try_from(result.status).unwrap()
}

#[tokio::test]
async fn every_outcome() {
    let server = CronoqServer::start("127.0.0.1:0");
    let mut tasks = server.tasks();
    let seen: Arc<Mutex<Option<Lease>>> = Arc::default();
    let seen_by_handler = seen.clone();
    let worker = Worker::start(
        options(&server, "rust-outcomes").slots(8),
        move |lease: Lease| {
            let seen = seen_by_handler.clone();
            async move {
                match &lease.payload[..] {
                    b"ok" => {
                        *seen.lock().unwrap() = Some(lease);
                        Ok(Bytes::from_static(b"done"))
                    }
                    b"permanent" => Err(TaskError::permanent("bad input")),
                    b"retry-after" if lease.attempt == 1 => Err(TaskError::retry_after(
                        "rate limited",
                        Duration::from_millis(700),
                    )),
                    b"retry-after" => Ok(format!("attempt {}", lease.attempt).into()),
                    b"cancel" => Err(TaskError::Cancelled),
                    b"panic" if lease.attempt == 1 => panic!("boom"),
                    b"panic" => Ok(Bytes::from_static(b"recovered")),
                    b"error" => Err(TaskError::from_err(std::io::Error::other("always broken"))),
                    b"slow" => {
                        // Longer than the pool's 1 s lease TTL: only heartbeats keep the lease.
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        Ok(Bytes::from_static(b"slow"))
                    }
                    b"big" => Ok(vec![b'x'; 300_000].into()),
                    other => Err(TaskError::permanent(format!(
                        "unexpected payload {other:?}"
                    ))),
                }
            }
        },
    );

    struct Case {
        payload: &'static str,
        status: TaskStatus,
        attempt: u32,
        output: &'static str,
        message: &'static str,
    }
    let case = |payload, status, attempt, output, message| Case {
        payload,
        status,
        attempt,
        output,
        message,
    };
    let cases = [
        case("ok", TaskStatus::Succeeded, 1, "done", ""),
        case("permanent", TaskStatus::Failed, 1, "", "bad input"),
        case("retry-after", TaskStatus::Succeeded, 2, "attempt 2", ""),
        case("cancel", TaskStatus::Cancelled, 1, "", ""),
        case("panic", TaskStatus::Succeeded, 2, "recovered", ""),
        case("error", TaskStatus::DeadLettered, 2, "", "always broken"),
        case("big", TaskStatus::Failed, 1, "", "message limit"),
    ];
    let mut ids = Vec::new();
    for c in &cases {
        let mut spec = task("rust-outcomes", c.payload);
        spec.kind = "test".into();
        spec.tags = HashMap::from([("case".into(), c.payload.into())]);
        spec.timeout_s = Some(10.0);
        if c.payload == "error" {
            spec.retry = Some(proto::RetryPolicy {
                max_attempts: 2,
                jitter: true,
                ..Default::default()
            });
        }
        ids.push(tasks.submit(spec).await);
    }
    for (c, &id) in cases.iter().zip(&ids) {
        let result = tasks.wait(id).await;
        let info = tasks.get(id).await;
        assert_eq!(
            (
                status(&result),
                info.attempt,
                result.output.as_deref().unwrap_or_default()
            ),
            (c.status, c.attempt, c.output.as_bytes()),
            "{}: {result:?}",
            c.payload
        );
        assert!(
            result.message.contains(c.message),
            "{}: {result:?}",
            c.payload
        );
        if c.payload == "retry-after" {
            // The server's own clock: the second attempt waited for the retry-after.
            let waited = info.finished_unix_ns.unwrap() - info.created_unix_ns.unwrap();
            assert!(
                waited >= 600_000_000,
                "finished {waited} ns after the submit"
            );
        }
    }
    let lease = seen.lock().unwrap().take().unwrap();
    assert_eq!(
        (
            lease.task_id,
            lease.attempt,
            lease.pool.as_str(),
            lease.kind.as_str()
        ),
        (ids[0], 1, "rust-outcomes", "test")
    );
    assert_eq!(lease.tags.get("case").map(String::as_str), Some("ok"));
    assert_eq!(lease.timeout, Some(Duration::from_secs(10)));
    assert!(!lease.cancel.is_cancelled());
    worker.stop().await.unwrap();
}

/// The trace context set with the submit option reaches each attempt through the server, by
/// Submit and by SubmitBatch; a task without one has none.
#[tokio::test]
async fn the_trace_context_travels_with_the_task() {
    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let server = CronoqServer::start("127.0.0.1:0");
    let mut tasks = server.tasks();
    type Seen = (Option<String>, Option<String>, Option<TraceContext>);
    let (seen, mut leases) = mpsc::unbounded_channel::<(u64, Seen)>();
    let worker = Worker::start(options(&server, "trace").slots(4), move |lease: Lease| {
        let got = (
            lease.traceparent().map(str::to_owned),
            lease.tracestate().map(str::to_owned),
            lease.trace_context(),
        );
        let _ = seen.send((lease.task_id, got));
        async { Ok(Bytes::new()) }
    });
    let trace = TraceContext::new(PARENT).with_tracestate("vendor=abc");
    let traced = tasks
        .submit(task("trace", "one").with_trace_context(&trace))
        .await;
    let plain = tasks.submit(task("trace", "two")).await;
    let batch = tasks
        .0
        .submit_batch(proto::SubmitBatchRequest {
            tasks: vec![task("trace", "three").with_trace_context(&TraceContext::new(PARENT))],
        })
        .await
        .unwrap()
        .into_inner();
    let batched = batch.tasks[0].id;
    let mut got = HashMap::new();
    while got.len() < 3 {
        let (id, s) = tokio::time::timeout(Duration::from_secs(20), leases.recv())
            .await
            .expect("no lease")
            .unwrap();
        got.insert(id, s);
    }
    assert_eq!(
        got[&traced],
        (
            Some(PARENT.to_owned()),
            Some("vendor=abc".to_owned()),
            Some(trace)
        )
    );
    assert_eq!(got[&plain], (None, None, None));
    assert_eq!(
        got[&batched],
        (
            Some(PARENT.to_owned()),
            None,
            Some(TraceContext::new(PARENT))
        )
    );
    worker.stop().await.unwrap();
}

#[tokio::test]
async fn heartbeats_keep_a_lease_longer_than_its_ttl() {
    let server = CronoqServer::start("127.0.0.1:0");
    let mut tasks = server.tasks();
    // The pool's lease TTL is 3 s: without heartbeats the lease would expire and the task
    // run again.
    let worker = Worker::start(
        options(&server, "rust-heartbeat"),
        |lease: Lease| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok(Bytes::from(format!("attempt {}", lease.attempt)))
        },
    );
    let id = tasks.submit(task("rust-heartbeat", "slow")).await;
    let result = tasks.wait(id).await;
    assert_eq!(
        result.output.as_deref(),
        Some(&b"attempt 1"[..]),
        "{result:?}"
    );
    worker.stop().await.unwrap();
}

#[tokio::test]
async fn runs_no_more_than_the_granted_slots() {
    let server = CronoqServer::start("127.0.0.1:0");
    let mut tasks = server.tasks();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (running_h, peak_h) = (running.clone(), peak.clone());
    // The pool's max is 2, so the grant is 2 although the worker asks for 5.
    let worker = Worker::start(options(&server, "slots").slots(5), move |_| {
        let (running, peak, entered) = (running_h.clone(), peak_h.clone(), entered_tx.clone());
        let mut released = released.clone();
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            entered.send(()).unwrap();
            released.wait_for(|go| *go).await.unwrap();
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(Bytes::new())
        }
    });
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(tasks.submit(task("slots", "")).await);
    }
    entered.recv().await;
    entered.recv().await;
    let workers = server
        .admin()
        .list_workers(proto::Empty {})
        .await
        .unwrap()
        .into_inner();
    let me = workers
        .workers
        .iter()
        .find(|w| w.name == "rust-slots")
        .unwrap();
    assert_eq!((me.slots, me.busy), (2, 2));
    release.send(true).unwrap();
    for id in ids {
        assert_eq!(status(&tasks.wait(id).await), TaskStatus::Succeeded);
    }
    assert_eq!(peak.load(Ordering::SeqCst), 2);
    worker.stop().await.unwrap();
}

#[tokio::test]
async fn an_abort_cancels_the_lease_and_reports_nothing() {
    let server = CronoqServer::start("127.0.0.1:0");
    let mut tasks = server.tasks();
    let mut admin = server.admin();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let worker = Worker::start(options(&server, "abort"), move |lease: Lease| {
        let events = events_tx.clone();
        async move {
            if &lease.payload[..] == b"after" {
                return Ok(Bytes::from_static(b"after"));
            }
            events.send("entered").unwrap();
            lease.cancel.cancelled().await;
            events.send("cancelled").unwrap();
            Ok(Bytes::from_static(b"too late"))
        }
    });
    let stale = |s: proto::SnapshotResponse| s.totals.unwrap().stale_completions;
    let before = stale(admin.snapshot(proto::Empty {}).await.unwrap().into_inner());
    let id = tasks.submit(task("abort", "block")).await;
    assert_eq!(events.recv().await, Some("entered"));
    assert!(tasks.cancel(id).await);
    assert_eq!(events.recv().await, Some("cancelled"));
    // Outcomes travel in order on the one stream: once the next task is done, a report of
    // the aborted lease would have been counted.
    let next = tasks.submit(task("abort", "after")).await;
    assert_eq!(status(&tasks.wait(next).await), TaskStatus::Succeeded);
    let after = stale(admin.snapshot(proto::Empty {}).await.unwrap().into_inner());
    assert_eq!(after, before, "the aborted lease was reported");
    assert_eq!(status(&tasks.wait(id).await), TaskStatus::Cancelled);
    worker.stop().await.unwrap();
}

#[tokio::test]
async fn a_drain_lets_running_handlers_finish_and_cuts_the_rest() {
    let server = CronoqServer::start("127.0.0.1:0");
    let mut tasks = server.tasks();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let opts = options(&server, "drain")
        .slots(2)
        .drain_timeout(Duration::from_millis(700));
    let worker = Worker::start(opts, move |lease: Lease| {
        let entered = entered_tx.clone();
        async move {
            entered.send(()).unwrap();
            if &lease.payload[..] == b"quick" {
                tokio::time::sleep(Duration::from_millis(300)).await;
                return Ok(Bytes::from_static(b"finished"));
            }
            // Runs until the drain timeout cancels it, then still reports in time.
            lease.cancel.cancelled().await;
            Ok(Bytes::from_static(b"cut short"))
        }
    });
    let quick = tasks.submit(task("drain", "quick")).await;
    let long = tasks.submit(task("drain", "long")).await;
    entered.recv().await;
    entered.recv().await;
    worker.stop().await.unwrap();
    for (id, output) in [(quick, "finished"), (long, "cut short")] {
        let result = tasks.wait(id).await;
        assert_eq!(
            result.output.as_deref(),
            Some(output.as_bytes()),
            "{result:?}"
        );
    }
}

#[tokio::test]
async fn reconnects_after_a_server_restart() {
    let mut server = CronoqServer::start("127.0.0.1:0");
    let addr = server.addr.clone();
    let opts = options(&server, "restart").initial_backoff(Duration::from_millis(50));
    let worker = Worker::start(opts, |lease: Lease| async move { Ok(lease.payload) });
    for (round, payload) in ["before", "after"].into_iter().enumerate() {
        if round == 1 {
            server.kill();
            server = CronoqServer::start(&addr);
        }
        let mut tasks = server.tasks();
        let id = tasks.submit(task("restart", payload)).await;
        let result = tasks.wait(id).await;
        assert_eq!(
            result.output.as_deref(),
            Some(payload.as_bytes()),
            "{payload}: {result:?}"
        );
    }
    worker.stop().await.unwrap();
}

#[tokio::test]
async fn refusals_retrying_cannot_fix_are_returned() {
    let server = CronoqServer::start("127.0.0.1:0");
    for (opts, code) in [
        (options(&server, "no-such-pool"), Code::NotFound),
        (
            options(&server, "default").token("wrong-token-for-the-rust-sdk-tests-00"),
            Code::Unauthenticated,
        ),
        (
            options(&server, "default").token(common::CLIENT_TOKEN),
            Code::PermissionDenied,
        ),
    ] {
        let pool = opts.pool.clone();
        let err = run_worker(opts, |_| async { Ok(Bytes::new()) }, std::future::pending())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, WorkerError::Refused(s) if s.code() == code),
            "{pool}: {err}"
        );
    }
}

#[tokio::test]
async fn mtls_with_a_client_certificate() {
    let pki = common::pki::Pki::new();
    let dir = common::Scratch::new("tls");
    let (cert, key) = pki.leaf(&["127.0.0.1"]);
    let config = format!(
        "[server]\ngrpc_addr = \"127.0.0.1:0\"\nhttp_addr = \"127.0.0.1:0\"\nshutdown_grace_s = 0.5\n\
         [server.tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n\
         [[auth.certs]]\ndns_name = \"worker.test\"\nrole = \"worker\"\n\
         [[auth.certs]]\ndns_name = \"client.test\"\nrole = \"client\"\n\
         [[pools]]\nname = \"default\"\n",
        dir.write("server.pem", &cert),
        dir.write("server.key", &key),
        dir.write("ca.pem", &pki.ca()),
    );
    let server = CronoqServer::with_config(&config);
    let identity = |name| {
        let (cert, key) = pki.leaf(&[name]);
        (cert.into_bytes(), key.into_bytes())
    };
    let tls = WorkerTls {
        ca_pem: Some(pki.ca().into_bytes()),
        identity: Some(identity("worker.test")),
        domain: None,
    };
    let opts = WorkerOptions::new(format!("https://{}", server.addr), "default").tls(tls);
    let worker = Worker::start(opts, |lease: Lease| async move { Ok(lease.payload) });

    let (cert, key) = identity("client.test");
    let client_tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pki.ca()))
        .identity(tonic::transport::Identity::from_pem(cert, key));
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", server.addr))
        .unwrap()
        .tls_config(client_tls)
        .unwrap()
        .connect_lazy();
    let mut tasks = common::Tasks(
        cronoq_worker::proto::tasks_client::TasksClient::with_interceptor(
            channel,
            common::Bearer::none(),
        ),
    );
    let id = tasks.submit(task("default", "over mTLS")).await;
    let result = tasks.wait(id).await;
    assert_eq!(
        result.output.as_deref(),
        Some(&b"over mTLS"[..]),
        "{result:?}"
    );
    worker.stop().await.unwrap();
}

/// The README's examples are `examples/worker.rs` and `examples/client.rs`, which `cargo test`
/// builds: run the worker against the server, give it tasks (one through the client example),
/// and stop it with Ctrl-C (SIGINT).
#[tokio::test]
async fn the_readme_examples_serve_submit_and_stop_on_ctrl_c() {
    let readme = include_str!("../../../README.md");
    for (name, source) in [
        ("worker", include_str!("../examples/worker.rs")),
        ("client", include_str!("../examples/client.rs")),
    ] {
        assert!(
            readme.contains(source),
            "README.md must show examples/{name}.rs as it is"
        );
    }
    let server = CronoqServer::start("127.0.0.1:0");
    let child = std::process::Command::new(example("worker"))
        .env("CRONOQ_ENDPOINT", server.endpoint())
        .env("CRONOQ_WORKER_TOKEN", WORKER_TOKEN)
        .spawn()
        .unwrap();
    let mut tasks = server.tasks();
    let id = tasks.submit(task("default", "hello")).await;
    let result = tasks.wait(id).await;
    assert_eq!(result.output.as_deref(), Some(&b"HELLO"[..]), "{result:?}");
    let id = tasks
        .submit(proto::TaskSpec {
            payload: vec![0xff].into(),
            ..task("default", "")
        })
        .await;
    assert_eq!(status(&tasks.wait(id).await), TaskStatus::Failed);
    let client = tokio::task::spawn_blocking({
        let endpoint = server.endpoint();
        move || {
            std::process::Command::new(example("client"))
                .arg("ada")
                .env("CRONOQ_ENDPOINT", endpoint)
                .env("CRONOQ_TOKEN", CLIENT_TOKEN)
                .output()
        }
    })
    .await
    .unwrap()
    .unwrap();
    assert!(client.status.success(), "{client:?}");
    assert_eq!(String::from_utf8_lossy(&client.stdout), "ADA\n");

    interrupt(child).await;
}

/// A loopback port nobody listens on now, for configurations that must name every shard's
/// endpoint before any server starts.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Two shards, a (pool `pa`) and b (pool `pb`): a worker for `pb` sent to a is refused with
/// b's endpoint, follows it with its token (b is on loopback) and serves there.
#[tokio::test]
async fn follows_a_real_shard_redirect() {
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let plan = format!(
        "[[auth.tokens]]\ntoken = {worker:?}\nrole = \"worker\"\n\
         [[auth.tokens]]\ntoken = {client:?}\nrole = \"client\"\n\
         [[auth.tokens]]\ntoken = {admin:?}\nrole = \"admin\"\n\
         [[pools]]\nname = \"pa\"\n[[pools]]\nname = \"pb\"\n\
         [[shards]]\nname = \"a\"\nnumber = 1\npools = [\"pa\"]\nendpoint = \"http://127.0.0.1:{}\"\n\
         [[shards]]\nname = \"b\"\nnumber = 2\npools = [\"pb\"]\nendpoint = \"http://127.0.0.1:{}\"\n",
        ports[0],
        ports[2],
        worker = WORKER_TOKEN,
        client = common::CLIENT_TOKEN,
        admin = common::ADMIN_TOKEN,
    );
    let shard = |name: &str, grpc: u16, http: u16| {
        CronoqServer::with_config(&format!(
            "[server]\ngrpc_addr = \"127.0.0.1:{grpc}\"\nhttp_addr = \"127.0.0.1:{http}\"\n\
             shard = {name:?}\nshutdown_grace_s = 0.5\n{plan}"
        ))
    };
    let a = shard("a", ports[0], ports[1]);
    let b = shard("b", ports[2], ports[3]);
    let worker = Worker::start(options(&a, "pb"), |lease: Lease| async move {
        Ok(lease.payload)
    });
    let mut tasks = b.tasks();
    let id = tasks.submit(task("pb", "on shard b")).await;
    let result = tasks.wait(id).await;
    assert_eq!(
        result.output.as_deref(),
        Some(&b"on shard b"[..]),
        "{result:?}"
    );
    let workers = b
        .admin()
        .list_workers(proto::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        workers
            .workers
            .iter()
            .any(|w| w.name == "rust-pb" && w.pool == "pb")
    );
    worker.stop().await.unwrap();
}
