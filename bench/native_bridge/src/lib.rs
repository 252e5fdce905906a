//! Benchmark prototype of a native transport for `cronoq.v1.Workers/Work`.
//!
//! tonic serves the stream on a tokio runtime thread of its own, which never takes the GIL.
//! Decoded worker messages are queued as `(stream_id, kind, lease_id)` triples, and a socket
//! pair wakes the Python event loop once per batch: the first message queued after a drain
//! writes one byte, and `drain` empties both the socket and the queue under the queue's lock,
//! so a wake-up is never lost and never doubled. Python answers with `send_leases`, one call
//! per batch, and the Lease messages are built and encoded here.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

mod pb {
    tonic::include_proto!("cronoq.v1");
}

use pb::workers_server::{Workers, WorkersServer};
use pb::{server_message, worker_message};

/// What a drained triple reports (its lease id is 0 unless the kind names a lease).
const OPENED: u8 = 0; // a worker registered and was answered; the stream takes leases now
const COMPLETE: u8 = 1;
const FAIL: u8 = 2;
const OTHER: u8 = 3; // heartbeat, set_slots, nack, cancelled: not needed by the benchmark
const CLOSED: u8 = 4; // the worker's side ended (or broke); send_leases to it returns False

const SLOTS: u32 = 64;
const LEASE_TTL_S: f64 = 30.0;
const MAX_MESSAGE_BYTES: u64 = 16 << 20;

type Event = (u64, u8, u64);
type Outbox = mpsc::UnboundedSender<Result<pb::ServerMessage, Status>>;

struct Stream {
    outbox: Outbox,
    pool: String,
}

struct Shared {
    queue: Mutex<Vec<Event>>,
    wake: UnixStream,
    streams: Mutex<HashMap<u64, Stream>>,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves nothing half-updated worth refusing.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn push(&self, event: Event) {
        let mut queue = lock(&self.queue);
        if queue.is_empty() {
            // Non-blocking: a full socket already holds a pending wake-up.
            let _ = (&self.wake).write(&[1]);
        }
        queue.push(event);
    }
}

fn kind_of(msg: Option<worker_message::Msg>) -> (u8, u64) {
    match msg {
        Some(worker_message::Msg::Complete(c)) => (COMPLETE, c.lease),
        Some(worker_message::Msg::Fail(f)) => (FAIL, f.lease),
        _ => (OTHER, 0),
    }
}

struct Service(Arc<Shared>);

#[tonic::async_trait]
impl Workers for Service {
    type WorkStream = UnboundedReceiverStream<Result<pb::ServerMessage, Status>>;

    async fn work(
        &self,
        request: Request<Streaming<pb::WorkerMessage>>,
    ) -> Result<Response<Self::WorkStream>, Status> {
        let mut inbound = request.into_inner();
        let pool = match inbound.message().await? {
            Some(pb::WorkerMessage {
                msg: Some(worker_message::Msg::Register(r)),
            }) => r.pool,
            _ => {
                return Err(Status::failed_precondition(
                    "the first message must be Register",
                ));
            }
        };
        let (outbox, rx) = mpsc::unbounded_channel();
        let registered = pb::Registered {
            worker_id: 1,
            lease_ttl_s: Some(LEASE_TTL_S),
            slots: SLOTS,
            protocol_version: 3,
            max_message_bytes: MAX_MESSAGE_BYTES,
        };
        let _ = outbox.send(Ok(pb::ServerMessage {
            msg: Some(server_message::Msg::Registered(registered)),
        }));
        let shared = self.0.clone();
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&shared.streams).insert(id, Stream { outbox, pool });
        shared.push((id, OPENED, 0));
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let (kind, lease) = kind_of(m.msg);
                shared.push((id, kind, lease));
            }
            lock(&shared.streams).remove(&id);
            shared.push((id, CLOSED, 0));
        });
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }
}

/// A Workers server on a loopback port, driven from Python in batches.
#[pyclass(frozen)]
struct Bridge {
    shared: Arc<Shared>,
    wakeup: UnixStream,
    #[pyo3(get)]
    port: u16,
    stop: Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
}

#[pymethods]
impl Bridge {
    /// Binds `addr` (host:port, port 0 for any) and starts serving on a runtime thread.
    #[staticmethod]
    fn start(addr: &str) -> PyResult<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let (wake, wakeup) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wakeup.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Vec::new()),
            wake,
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let service = WorkersServer::new(Service(shared.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES as usize)
            .max_encoding_message_size(MAX_MESSAGE_BYTES as usize);
        let thread = std::thread::Builder::new()
            .name("native-bridge".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return eprintln!("native-bridge: {e}"),
                    };
                    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                    let serving = Server::builder()
                        .add_service(service)
                        .serve_with_incoming_shutdown(incoming, async {
                            let _ = stop_rx.await;
                        });
                    if let Err(e) = serving.await {
                        eprintln!("native-bridge: {e}");
                    }
                })
            })?;
        Ok(Bridge {
            shared,
            wakeup,
            port,
            stop: Mutex::new(Some((stop_tx, thread))),
        })
    }

    /// The descriptor to watch for reading (`loop.add_reader`): readable while `drain` has
    /// something to return.
    fn fileno(&self) -> i32 {
        self.wakeup.as_raw_fd()
    }

    /// Every `(stream_id, kind, lease_id)` received since the last drain, in arrival order.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let batch = {
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
            std::mem::take(&mut *queue)
        };
        PyList::new(py, batch)
    }

    /// Queues one Lease per id on `stream_id` (each a no-op task of the stream's pool,
    /// attempt 1, normal priority). False when the stream has gone: its CLOSED is then
    /// queued or already drained.
    fn send_leases(&self, stream_id: u64, lease_ids: Vec<u64>) -> bool {
        let streams = lock(&self.shared.streams);
        let Some(stream) = streams.get(&stream_id) else {
            return false;
        };
        for id in lease_ids {
            let lease = pb::Lease {
                lease: id,
                task_id: id,
                attempt: 1,
                pool: stream.pool.clone(),
                priority: pb::Priority::Normal as i32,
                lease_ttl_s: Some(LEASE_TTL_S),
                ..Default::default()
            };
            let msg = pb::ServerMessage {
                msg: Some(server_message::Msg::Lease(lease)),
            };
            if stream.outbox.send(Ok(msg)).is_err() {
                return false;
            }
        }
        true
    }

    /// Ends the server's side of `stream_id` with an OK status once its queued messages are
    /// written. False when it had already gone.
    fn end_stream(&self, stream_id: u64) -> bool {
        lock(&self.shared.streams).remove(&stream_id).is_some()
    }

    /// Stops serving (open streams are cut) and joins the runtime thread.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some((stop, thread)) = lock(&self.stop).take() else {
            return Ok(());
        };
        let _ = stop.send(());
        lock(&self.shared.streams).clear();
        py.detach(|| thread.join())
            .map_err(|_| PyRuntimeError::new_err("the native-bridge thread panicked"))
    }
}

#[pymodule]
fn native_bridge(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Bridge>()?;
    m.add("OPENED", OPENED)?;
    m.add("COMPLETE", COMPLETE)?;
    m.add("FAIL", FAIL)?;
    m.add("OTHER", OTHER)?;
    m.add("CLOSED", CLOSED)?;
    Ok(())
}
