//! One `Workers/Work` stream, from `register` to its end: a loop that owns every piece of
//! the session's state and reacts to the server, the handlers, the heartbeat timers and the
//! drain, one event at a time.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::{Instant, sleep_until};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tonic::metadata::MetadataMap;
use tonic::transport::Endpoint;
use tonic::{Request, Status, Streaming};

use super::{Connect, Worker};
use crate::lease::seconds;
use crate::proto::server_message::Msg as ServerMsg;
use crate::proto::worker_message::Msg;
use crate::proto::workers_client::WorkersClient;
use crate::proto::{self, ServerMessage, WorkerMessage};
use crate::{Lease, TaskError};

pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, TaskError>> + Send>>;

/// The metadata key of a shard refusal naming the pool's shard.
pub(crate) const ENDPOINT_KEY: &str = "cronoq-shard-endpoint";
const PROTOCOL_VERSION: u32 = 3;
/// Room left for the rest of a `complete` message when checking an output against the
/// server's message limit.
const MESSAGE_OVERHEAD: usize = 1024;
/// Keeps a tiny lease TTL from turning into a busy loop.
const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// How long a handler cancelled by the drain timeout may still take to return with an
/// outcome that is reported.
pub(crate) const OUTCOME_GRACE: Duration = Duration::from_secs(5);
/// How long the server may take to end the stream after the worker half-closed it.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// How one stream ended.
#[derive(Debug, Default)]
pub(crate) struct SessionEnd {
    /// The stream's error; `None` for a normal end.
    pub(crate) status: Option<Status>,
    /// The initial metadata, where a shard refusal may name the endpoint.
    pub(crate) header: MetadataMap,
    /// The server announced it lost its leadership.
    pub(crate) not_leader: bool,
    pub(crate) registered: bool,
}

/// A lease whose handler runs.
struct Run {
    cancel: CancellationToken,
    heartbeat: Option<(delay_queue::Key, Duration)>,
}

/// Where a drain is; each phase but `Serving` ends at its deadline.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Serving,
    /// Running handlers may finish.
    Draining(Instant),
    /// The drain timeout passed: cancelled handlers may still report.
    Cutting(Instant),
    /// Half-closed: waiting for the server to end the stream.
    Closing(Instant),
}

impl Phase {
    fn deadline(self) -> Option<Instant> {
        match self {
            Self::Serving => None,
            Self::Draining(at) | Self::Cutting(at) | Self::Closing(at) => Some(at),
        }
    }
}

struct Session<'w, C> {
    worker: &'w Worker<C>,
    /// `None` once half-closed.
    out: Option<mpsc::UnboundedSender<WorkerMessage>>,
    runs: HashMap<u64, Run>,
    handlers: JoinSet<Result<Bytes, TaskError>>,
    /// The lease each handler task runs.
    tasks: HashMap<Id, u64>,
    heartbeats: DelayQueue<u64>,
    granted: usize,
    ttl: Option<Duration>,
    max_message: usize,
    registered: bool,
    phase: Phase,
}

impl<C: Connect> Worker<C> {
    /// Runs one stream until it ends. When `stop` is cancelled meanwhile, it drains and ends
    /// the stream itself.
    pub(crate) async fn session(&self, endpoint: Endpoint, stop: &CancellationToken) -> SessionEnd {
        let opts = &self.opts;
        let mut client = WorkersClient::new(self.connect.channel(endpoint))
            .max_decoding_message_size(opts.max_message_bytes);
        let (out, rx) = mpsc::unbounded_channel();
        let register = Msg::Register(proto::Register {
            pool: opts.pool.clone(),
            slots: opts.slots,
            worker_name: opts.name.clone(),
            protocol_version: PROTOCOL_VERSION,
            labels: opts.labels.iter().cloned().collect(),
        });
        let _ = out.send(WorkerMessage {
            msg: Some(register),
        });
        let mut request = Request::new(UnboundedReceiverStream::new(rx));
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let response = tokio::select! {
            response = client.work(request) => response,
            () = stop.cancelled() => return SessionEnd::default(),
        };
        let response = match response {
            Ok(response) => response,
            Err(status) => {
                return SessionEnd {
                    status: Some(status),
                    ..SessionEnd::default()
                };
            }
        };
        let header = response.metadata().clone();
        let mut session = Session {
            worker: self,
            out: Some(out),
            runs: HashMap::new(),
            handlers: JoinSet::new(),
            tasks: HashMap::new(),
            heartbeats: DelayQueue::new(),
            granted: opts.slots as usize,
            ttl: None,
            max_message: 0,
            registered: false,
            phase: Phase::Serving,
        };
        let mut end = session.serve(response.into_inner(), stop).await;
        session.abandon();
        // Abandoned handlers keep running with their leases cancelled; their results are
        // dropped, and the server retries those attempts.
        session.handlers.detach_all();
        end.header = header;
        end
    }
}

impl<C> Session<'_, C> {
    async fn serve(
        &mut self,
        mut stream: Streaming<ServerMessage>,
        stop: &CancellationToken,
    ) -> SessionEnd {
        let mut end = SessionEnd::default();
        loop {
            if matches!(self.phase, Phase::Draining(_) | Phase::Cutting(_)) && self.runs.is_empty()
            {
                // Dropping the sender half-closes the stream after the queued outcomes.
                self.out = None;
                self.phase = Phase::Closing(Instant::now() + CLOSE_WAIT);
            }
            let deadline = self.phase.deadline();
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(ServerMessage { msg: Some(msg) })) => {
                        end.registered |= matches!(msg, ServerMsg::Registered(_));
                        if let Some(shutdown) = self.receive(msg) {
                            end.not_leader = shutdown.not_leader;
                            return end;
                        }
                    }
                    Ok(Some(ServerMessage { msg: None })) => {}
                    Ok(None) => return end,
                    Err(status) => {
                        end.status = Some(status);
                        return end;
                    }
                },
                Some(done) = self.handlers.join_next_with_id(), if !self.handlers.is_empty() => {
                    self.finished(done);
                }
                Some(due) = poll_fn(|cx| self.heartbeats.poll_expired(cx)), if !self.heartbeats.is_empty() => {
                    self.heartbeat(due.into_inner());
                }
                () = stop.cancelled(), if self.phase == Phase::Serving => self.drain(),
                () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    match self.phase {
                        Phase::Draining(_) => {
                            for run in self.runs.values() {
                                run.cancel.cancel();
                            }
                            self.phase = Phase::Cutting(Instant::now() + OUTCOME_GRACE);
                        }
                        Phase::Cutting(_) => self.abandon(),
                        Phase::Serving | Phase::Closing(_) => return end,
                    }
                }
            }
        }
    }

    fn send(&self, msg: Msg) {
        if let Some(out) = &self.out {
            // A closed stream shows up as its end in `serve`.
            let _ = out.send(WorkerMessage { msg: Some(msg) });
        }
    }

    /// Acts on one message; a `shutdown` is returned, since it ends the session.
    fn receive(&mut self, msg: ServerMsg) -> Option<proto::Shutdown> {
        match msg {
            ServerMsg::Registered(r) => {
                self.registered = true;
                if r.slots > 0 {
                    self.granted = r.slots as usize;
                }
                self.ttl = r.lease_ttl_s.and_then(seconds).filter(|ttl| !ttl.is_zero());
                self.max_message = usize::try_from(r.max_message_bytes).unwrap_or(usize::MAX);
                tracing::info!(
                    worker_id = r.worker_id,
                    slots = self.granted,
                    "cronoq worker registered"
                );
                if self.phase != Phase::Serving {
                    // The drain began before the registration: stop the leases now.
                    self.send(Msg::SetSlots(proto::SetSlots { slots: 0 }));
                }
            }
            ServerMsg::Lease(lease) => self.start(lease),
            ServerMsg::Abort(abort) => {
                // The server has freed the slot already; so does the worker, at once.
                if let Some(run) = self.remove(abort.lease) {
                    tracing::info!(lease = abort.lease, reason = %abort.reason, "cronoq lease aborted");
                    run.cancel.cancel();
                }
            }
            ServerMsg::Shutdown(shutdown) => {
                tracing::info!(reason = %shutdown.reason, not_leader = shutdown.not_leader,
                    "cronoq worker told to shut down");
                return Some(shutdown);
            }
        }
        None
    }

    /// Starts the handler of a lease, or hands the lease back when the worker is draining or
    /// has no free slot (which a correct server never makes it do).
    fn start(&mut self, m: proto::Lease) {
        let reason = if self.phase != Phase::Serving {
            "worker is stopping"
        } else if self.runs.len() >= self.granted {
            "worker has no free slot"
        } else {
            let id = m.lease;
            let ttl = m
                .lease_ttl_s
                .and_then(seconds)
                .filter(|t| !t.is_zero())
                .or(self.ttl);
            let cancel = CancellationToken::new();
            let lease = Lease::from_wire(m, &self.worker.opts.pool, cancel.clone());
            let handler = self.worker.handler.clone();
            // Called inside the task, so that a handler panicking before its first await is
            // contained like any other panic.
            let task = self.handlers.spawn(async move { handler(lease).await });
            self.tasks.insert(task.id(), id);
            let heartbeat = ttl.map(|ttl| {
                let period = (ttl / 3).max(MIN_HEARTBEAT);
                (self.heartbeats.insert(id, period), period)
            });
            self.runs.insert(id, Run { cancel, heartbeat });
            return;
        };
        self.send(Msg::Nack(proto::Nack {
            lease: m.lease,
            reason: reason.into(),
        }));
    }

    fn heartbeat(&mut self, id: u64) {
        let Some(Run {
            heartbeat: Some((key, period)),
            ..
        }) = self.runs.get_mut(&id)
        else {
            return;
        };
        *key = self.heartbeats.insert(id, *period);
        self.send(Msg::Heartbeat(proto::Heartbeat { lease: id }));
    }

    /// Reports the outcome of a handler that returned, unless its lease was given up.
    fn finished(&mut self, done: Result<(Id, Result<Bytes, TaskError>), JoinError>) {
        let (task, result) = match done {
            Ok((task, result)) => (task, Ok(result)),
            Err(e) => (e.id(), Err(e)),
        };
        let Some(id) = self.tasks.remove(&task) else {
            return;
        };
        let Some(run) = self.remove(id) else {
            return;
        };
        let fail = |message: String, permanent: bool, retry_after: Option<Duration>| {
            Msg::Fail(proto::Fail {
                lease: id,
                message,
                permanent,
                retry_after_s: retry_after.map(|d| d.as_secs_f64()),
            })
        };
        let msg = match result {
            Ok(Ok(output))
                if self.max_message > 0 && output.len() + MESSAGE_OVERHEAD > self.max_message =>
            {
                // The server would refuse the message and the attempt would only time out;
                // failing permanently says why, since a retry would produce the same output.
                fail(
                    format!(
                        "output of {} bytes exceeds the server's message limit of {} bytes",
                        output.len(),
                        self.max_message
                    ),
                    true,
                    None,
                )
            }
            Ok(Ok(output)) => Msg::Complete(proto::Complete {
                lease: id,
                output,
                content_type: String::new(),
            }),
            Ok(Err(TaskError::Retryable {
                message,
                retry_after,
            })) => fail(message.to_string(), false, retry_after),
            Ok(Err(TaskError::Permanent { message })) => fail(message.to_string(), true, None),
            // Cancelled by the drain timeout: the server retries it when the stream ends.
            Ok(Err(TaskError::Cancelled)) if run.cancel.is_cancelled() => return,
            Ok(Err(TaskError::Cancelled)) => Msg::Cancelled(proto::Cancelled { lease: id }),
            Err(e) => {
                let message = match e.try_into_panic() {
                    Ok(panic) => {
                        let text = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a non-string value".into());
                        format!("handler panicked: {text}")
                    }
                    Err(e) => format!("handler task ended: {e}"),
                };
                tracing::error!(lease = id, %message, "cronoq handler failed");
                fail(message, false, None)
            }
        };
        self.send(msg);
    }

    /// Takes a lease out of the running set, with its heartbeats.
    fn remove(&mut self, id: u64) -> Option<Run> {
        let run = self.runs.remove(&id)?;
        if let Some((key, _)) = &run.heartbeat {
            self.heartbeats.try_remove(key);
        }
        Some(run)
    }

    /// Gives up every running lease: nothing more is reported for them.
    fn abandon(&mut self) {
        for (_, run) in self.runs.drain() {
            run.cancel.cancel();
        }
        self.heartbeats.clear();
    }

    /// Stops taking leases; running handlers get the drain timeout.
    fn drain(&mut self) {
        self.phase = Phase::Draining(Instant::now() + self.worker.opts.drain_timeout);
        if self.registered {
            self.send(Msg::SetSlots(proto::SetSlots { slots: 0 }));
        }
    }
}
