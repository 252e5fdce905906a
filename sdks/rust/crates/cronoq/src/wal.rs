//! Write-ahead with a persistent store: what the driver holds back until it is durable.
//!
//! With a store whose `persists()` is true the engine keeps a journal. After each engine step
//! the driver turns it into [`Mutation`]s (a `Submitted` for each admitted task, with the spec
//! kept from its admission, a `Status` for each task whose status changed, a `RecurringNext`
//! for each schedule that moved on; a schedule added or removed puts its `RecurringUpsert` or
//! `RecurringRemove` ahead of them) and holds the step's effects back: replies to submissions,
//! cancellations and schedule changes, attempt starts (an attempt
//! starts only once its `Running` status is durable), task ends (handles) and events. One
//! commit is in flight at a time, on a task of its own; what gathers meanwhile goes into the
//! next one (group commit). When a commit is done its held effects are carried out, in the
//! driver, by the next wake-up.
//!
//! A commit that fails with `Unavailable` is retried with a backoff of 50 ms × 2^k (at most
//! 5 s) until the outage has lasted `max_store_outage`; `Other` is retried the same way and is
//! fatal at the fifth failure in a row; `Fenced` (another instance leads) is fatal at once; a
//! panic in `commit` counts as `Other`. A fatal error stops the scheduler: callers waiting for
//! the batch get `Error::Store`.

use std::sync::Arc;
use std::time::Duration;

use cronoq_core::model::Attempt;
use cronoq_core::{Journal, TaskRecord};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::driver::{Admitted, FromTasks};
use crate::error::{Error, StoreError};
use crate::handle::TaskHandle;
use crate::store::{Mutation, Store, TimeBase};
use crate::task::TaskSpec;
use crate::time::Time;
use crate::types::{StatusEvent, Submitted, TaskId, TaskStatus};
use crate::unwind::CatchUnwind;

/// The first retry's delay after a failed commit.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// The longest delay between two tries.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The failures in a row with `StoreError::Other` that stop the scheduler.
const OTHER_LIMIT: u32 = 5;

/// A reply held until its batch is durable.
pub(crate) enum Reply<O> {
    One(
        oneshot::Sender<Result<Admitted<O>, Error>>,
        Result<Admitted<O>, Error>,
    ),
    Many(
        oneshot::Sender<Result<Vec<Result<Submitted, Error>>, Error>>,
        Vec<Result<Submitted, Error>>,
    ),
    Batch(
        oneshot::Sender<Result<Vec<TaskHandle<O>>, Error>>,
        Result<Vec<TaskHandle<O>>, Error>,
    ),
    /// A cancellation's answer, or a schedule removal's.
    Cancel(oneshot::Sender<Result<bool, Error>>, bool),
    /// A schedule's addition.
    Added(oneshot::Sender<Result<(), Error>>, Result<(), Error>),
}

impl<O> Reply<O> {
    /// Answers the caller.
    #[inline(always)]
    pub(crate) fn send(self) {
        match self {
            Reply::One(tx, r) => drop(tx.send(r)),
            Reply::Many(tx, r) => drop(tx.send(Ok(r))),
            Reply::Batch(tx, r) => drop(tx.send(r)),
            Reply::Cancel(tx, r) => drop(tx.send(Ok(r))),
            Reply::Added(tx, r) => drop(tx.send(r)),
        }
    }

    /// Tells the caller the store failed.
    fn fail(self, e: &StoreError) {
        let err = || Error::Store(e.clone());
        match self {
            Reply::One(tx, _) => drop(tx.send(Err(err()))),
            Reply::Many(tx, _) => drop(tx.send(Err(err()))),
            Reply::Batch(tx, _) => drop(tx.send(Err(err()))),
            Reply::Cancel(tx, _) => drop(tx.send(Err(err()))),
            Reply::Added(tx, _) => drop(tx.send(Err(err()))),
        }
    }
}

/// The effects of a batch, carried out once it is durable.
pub(crate) struct Held<O> {
    pub(crate) starts: Vec<Attempt>,
    pub(crate) finished: Vec<TaskRecord>,
    pub(crate) events: Vec<StatusEvent>,
    pub(crate) replies: Vec<Reply<O>>,
}

impl<O> Held<O> {
    fn new() -> Self {
        Held {
            starts: Vec::new(),
            finished: Vec::new(),
            events: Vec::new(),
            replies: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.starts.is_empty()
            && self.finished.is_empty()
            && self.events.is_empty()
            && self.replies.is_empty()
    }
}

/// The driver's side of a persistent store.
pub(crate) struct Wal<P, O> {
    store: Arc<dyn Store<P, O>>,
    epoch: u16,
    max_outage: Duration,
    /// The specs of tasks admitted since the journal was last taken, by id.
    specs: FxHashMap<u64, TaskSpec<P>>,
    /// The batch being gathered: its mutations, outputs and effects.
    mutations: Vec<Mutation<P>>,
    outputs: Vec<(TaskId, Arc<O>)>,
    pub(crate) held: Held<O>,
    /// The effects of the batch being committed, while one is.
    flying: Option<Held<O>>,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Wal<P, O> {
    pub(crate) fn new(store: Arc<dyn Store<P, O>>, epoch: u16, max_outage: Duration) -> Self {
        Wal {
            store,
            epoch,
            max_outage,
            specs: FxHashMap::default(),
            mutations: Vec::new(),
            outputs: Vec::new(),
            held: Held::new(),
            flying: None,
        }
    }

    /// The store (for late handles' outputs).
    pub(crate) fn store(&self) -> &Arc<dyn Store<P, O>> {
        &self.store
    }

    /// Keeps an admitted task's spec for its `Submitted` mutation.
    pub(crate) fn admitted(&mut self, id: u64, spec: TaskSpec<P>) {
        self.specs.insert(id, spec);
    }

    /// A schedule added or removed: its mutation goes into the batch being gathered, ahead
    /// of the journal of the step that made the change (which holds its next occurrence).
    pub(crate) fn recurring(&mut self, mutation: Mutation<P>) {
        self.mutations.push(mutation);
    }

    /// The journal of an engine step becomes mutations of the batch being gathered.
    pub(crate) fn journal(&mut self, journal: Journal, time: impl Fn(f64) -> Time) {
        for rec in journal.added {
            if let Some(spec) = self.specs.remove(&rec.id) {
                self.mutations.push(Mutation::Submitted {
                    id: TaskId(rec.id),
                    seq: rec.seq,
                    arrival: time(rec.submitted_at),
                    spec,
                });
            }
        }
        for rec in journal.changed {
            let status = TaskStatus::from_core(rec.status);
            let at = if status.is_terminal() {
                rec.finished_at
            } else if rec.status == cronoq_core::model::Status::Running {
                rec.started_at
            } else {
                rec.ready_at.max(rec.submitted_at)
            };
            self.mutations.push(Mutation::Status {
                id: TaskId(rec.id),
                status,
                attempt: rec.attempt,
                at: time(at),
                message: rec.message.clone(),
            });
        }
        for row in journal.schedules {
            self.mutations.push(Mutation::RecurringNext {
                name: row.name,
                next: row.next_time.map(&time),
                last: row.last.map(TaskId),
            });
        }
    }

    /// A task that succeeded in the batch being gathered: its output goes with it.
    pub(crate) fn output(&mut self, id: u64, output: Arc<O>) {
        self.outputs.push((TaskId(id), output));
    }

    /// Whether nothing is held or being committed.
    pub(crate) fn idle(&self) -> bool {
        self.flying.is_none() && self.mutations.is_empty() && self.held.is_empty()
    }

    /// Starts committing what was gathered, unless a commit is in flight. Effects of a batch
    /// without mutations (everything before them is durable) come back at once.
    pub(crate) fn flush(&mut self, done: &UnboundedSender<FromTasks<O>>) -> Option<Held<O>> {
        if self.flying.is_some() {
            return None;
        }
        if self.mutations.is_empty() {
            return (!self.held.is_empty()).then(|| std::mem::replace(&mut self.held, Held::new()));
        }
        let batch = std::mem::take(&mut self.mutations);
        let outputs = std::mem::take(&mut self.outputs);
        self.flying = Some(std::mem::replace(&mut self.held, Held::new()));
        let (store, epoch, max_outage) = (self.store.clone(), self.epoch, self.max_outage);
        let done = done.clone();
        tokio::spawn(async move {
            let result = commit(&*store, epoch, &batch, &outputs, max_outage).await;
            // The driver may have stopped meanwhile: nobody to tell.
            let _ = done.send(FromTasks::Committed(result));
        });
        None
    }

    /// The commit in flight is durable: its effects.
    pub(crate) fn committed(&mut self) -> Option<Held<O>> {
        self.flying.take()
    }

    /// The store failed for good: every caller waiting for a batch hears it.
    pub(crate) fn fail(&mut self, e: &StoreError) {
        let held = std::mem::replace(&mut self.held, Held::new());
        for h in self.flying.take().into_iter().chain([held]) {
            for reply in h.replies {
                reply.fail(e);
            }
        }
        self.mutations.clear();
        self.outputs.clear();
    }
}

/// Commits a batch, retrying as the module docs say; the error that stops the scheduler.
async fn commit<P: Send + Sync + 'static, O: Send + Sync + 'static>(
    store: &dyn Store<P, O>,
    epoch: u16,
    batch: &[Mutation<P>],
    outputs: &[(TaskId, Arc<O>)],
    max_outage: Duration,
) -> Result<(), StoreError> {
    let outputs: Vec<(TaskId, &O)> = outputs.iter().map(|(id, o)| (*id, &**o)).collect();
    let mut since: Option<tokio::time::Instant> = None;
    let mut others = 0;
    let mut tries: u32 = 0;
    loop {
        let attempt = store.commit(epoch, TimeBase::default(), batch, &outputs);
        let result = match CatchUnwind(attempt).await {
            Ok(r) => r,
            Err(text) => Err(StoreError::Other(format!("store panicked: {text}"))),
        };
        let e = match result {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let started = *since.get_or_insert_with(tokio::time::Instant::now);
        match &e {
            StoreError::Unavailable(_) => {
                if started.elapsed() >= max_outage {
                    return Err(e);
                }
            }
            StoreError::Other(_) => {
                others += 1;
                if others >= OTHER_LIMIT {
                    return Err(e);
                }
            }
            _ => return Err(e),
        }
        tracing::warn!(error = %e, "a store commit failed; retrying");
        let mut delay = BACKOFF_FIRST
            .saturating_mul(1 << tries.min(10))
            .min(BACKOFF_MAX);
        tries += 1;
        if e.is_transient() {
            // An outage ends at its limit, not at the next try after it.
            let left = max_outage.saturating_sub(started.elapsed());
            delay = delay.min(left.max(Duration::from_millis(1)));
        }
        tokio::time::sleep(delay).await;
    }
}
