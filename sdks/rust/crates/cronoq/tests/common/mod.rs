//! Helpers shared by the library's tests: gated executors that report to the test what they
//! see, so tests wait on conditions instead of sleeping, and run on tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cronoq::{BoxFuture, Executor, LeaseId, Pool, Scheduler, TaskContext, TaskError};
use tokio::sync::{Semaphore, mpsc};

pub type S = Scheduler<u32, u32>;

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// What a [`Gated`] executor saw and did, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// `execute` was called for this payload.
    Started(u32),
    /// The abort hook was called.
    Aborted(LeaseId),
    /// An attempt's future was dropped before it finished.
    Dropped(u32),
}

/// An executor whose attempts wait for a permit of `gate` (one per attempt) and then return
/// their payload; it reports each start (with the context) on `started` and keeps a log.
pub struct Gated {
    pub gate: Arc<Semaphore>,
    pub log: Arc<Mutex<Vec<Seen>>>,
    pub started: mpsc::UnboundedSender<TaskContext>,
}

/// Records `Dropped` when dropped before it is disarmed.
struct DropGuard {
    payload: u32,
    log: Arc<Mutex<Vec<Seen>>>,
    armed: bool,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if self.armed {
            self.log.lock().unwrap().push(Seen::Dropped(self.payload));
        }
    }
}

impl Executor<u32, u32> for Gated {
    fn execute(&self, ctx: TaskContext, n: Arc<u32>) -> BoxFuture<Result<u32, TaskError>> {
        let gate = self.gate.clone();
        let log = self.log.clone();
        let started = self.started.clone();
        Box::pin(async move {
            let mut guard = DropGuard {
                payload: *n,
                log: log.clone(),
                armed: true,
            };
            log.lock().unwrap().push(Seen::Started(*n));
            let _ = started.send(ctx);
            gate.acquire().await.unwrap().forget();
            guard.armed = false;
            Ok(*n)
        })
    }

    fn abort(&self, lease: LeaseId) {
        self.log.lock().unwrap().push(Seen::Aborted(lease));
    }
}

/// A gated executor and the test's ends of it.
pub struct Gate {
    pub gate: Arc<Semaphore>,
    pub log: Arc<Mutex<Vec<Seen>>>,
    pub started: mpsc::UnboundedReceiver<TaskContext>,
}

impl Gate {
    /// Lets `n` attempts finish.
    pub fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// The next attempt that started.
    pub async fn next(&mut self) -> TaskContext {
        self.started.recv().await.expect("the executor lives")
    }

    pub fn log(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

/// A gated executor for a pool.
pub fn gated() -> (Gated, Gate) {
    let gate = Arc::new(Semaphore::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::unbounded_channel();
    let exec = Gated {
        gate: gate.clone(),
        log: log.clone(),
        started: tx,
    };
    (
        exec,
        Gate {
            gate,
            log,
            started: rx,
        },
    )
}

/// A scheduler with one fixed pool `default` of `workers` gated workers, configured by `f`.
pub async fn gated_scheduler(
    workers: u32,
    f: impl FnOnce(Pool<u32, u32>) -> Pool<u32, u32>,
) -> (S, Gate) {
    let (exec, gate) = gated();
    let pool = f(Pool::fixed("default", workers).executor(exec));
    let s = Scheduler::builder().pool(pool).build().await.unwrap();
    (s, gate)
}

/// Lets every task run until none has anything left to do: on tokio's paused clock, time
/// moves (here by 1 ms) only once every task is idle.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}
