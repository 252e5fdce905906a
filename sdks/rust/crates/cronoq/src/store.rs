//! Where a scheduler keeps its state: the [`Store`] interface and [`MemoryStore`], which keeps
//! everything in the scheduler's memory, and [`StoreQueries`], the lookups a server makes in a
//! persistent store (such as `cronoq-store-sqlite`'s `SqliteStore`).
//!
//! With a store whose [`persists`](Store::persists) is true, a scheduler writes ahead: each
//! step's changes ([`Mutation`]s) are committed, in order and in the background, before their
//! effects are seen (replies to submissions, cancellations and schedule changes, attempt
//! starts, task ends and events); what gathers while a commit is in flight goes into the next
//! one. A schedule's move to its next occurrence is written with the occurrence it created. At
//! [`build`](crate::Builder::build) it waits for the leadership, reads the store back and
//! carries on with its tasks and schedules (see [`Builder::build`](crate::Builder::build)). A commit failing
//! with [`StoreError::Unavailable`] is retried with a backoff of 50 ms doubling up to 5 s for
//! [`max_store_outage`](crate::Builder::max_store_outage); [`StoreError::Other`] is retried
//! alike and stops the scheduler at the fifth failure in a row; [`StoreError::Fenced`] stops it
//! at once (a panic in `commit` counts as `Other`). Callers waiting for a failed commit get
//! [`Error::Store`](crate::Error::Store), later calls [`Error::Shutdown`](crate::Error::Shutdown),
//! and [`shutdown`](crate::Scheduler::shutdown) returns the error.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::StoreError;
use crate::recurring::RecurringSpec;
use crate::task::TaskSpec;
use crate::time::Time;
use crate::types::{Priority, TaskId, TaskRef, TaskStatus};

/// How a store relates engine time to Unix time: engine time zero is this many nanoseconds
/// after the Unix epoch (always 0 from this library, whose engine time is Unix time; stores
/// apply it anyway).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeBase {
    /// Unix nanoseconds at engine time zero.
    pub unix_nanos_at_zero: i64,
}

/// One change for a store to apply, in order.
#[derive(Clone, Debug)]
// `Submitted` holds the task's spec itself, as stores written for the published crate expect.
#[allow(clippy::large_enum_variant)]
pub enum Mutation<P> {
    /// A task was admitted.
    Submitted {
        /// The task.
        id: TaskId,
        /// Its admission order.
        seq: u64,
        /// When it was admitted.
        arrival: Time,
        /// What it is.
        spec: TaskSpec<P>,
    },
    /// A task changed status.
    Status {
        /// The task.
        id: TaskId,
        /// Its new status.
        status: TaskStatus,
        /// Its attempt number then.
        attempt: u32,
        /// When.
        at: Time,
        /// The message of the change.
        message: Option<std::sync::Arc<str>>,
    },
    /// A recurring schedule was added, or replaced the one with its name; its next occurrence
    /// follows in a [`RecurringNext`](Mutation::RecurringNext) of the same batch.
    RecurringUpsert {
        /// The schedule.
        spec: RecurringSpec<P>,
    },
    /// A recurring schedule was removed (or dropped at start, when the configuration no
    /// longer supports it).
    RecurringRemove {
        /// Its name.
        name: std::sync::Arc<str>,
    },
    /// A recurring schedule moved on: written in the batch of the occurrence it created.
    RecurringNext {
        /// Its name.
        name: std::sync::Arc<str>,
        /// Its next occurrence (`None`: its expression names no later time).
        next: Option<Time>,
        /// The latest occurrence it created.
        last: Option<TaskId>,
    },
}

/// A live task read back from a store.
#[derive(Clone, Debug)]
pub struct RecoveredTask<P> {
    /// The task.
    pub id: TaskId,
    /// Its admission order.
    pub seq: u64,
    /// When it was admitted.
    pub arrival: Time,
    /// What it is.
    pub spec: TaskSpec<P>,
    /// Attempts it has used, counting one that was running when the store's writer stopped.
    pub attempt: u32,
}

/// A recently ended task read back from a store (for its key and its status).
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveredTerminal {
    /// The task.
    pub id: TaskId,
    /// Its key.
    pub key: Option<std::sync::Arc<str>>,
    /// How it ended.
    pub status: TaskStatus,
    /// When.
    pub at: Time,
}

/// A recurring schedule read back from a store: it resumes with its next occurrence, so
/// that none is created twice or lost across a restart.
#[derive(Clone, Debug)]
pub struct RecoveredRecurring<P> {
    /// The schedule.
    pub spec: RecurringSpec<P>,
    /// Its next occurrence (created at once if its time passed meanwhile).
    pub next: Option<Time>,
    /// The latest occurrence it created.
    pub last: Option<TaskId>,
}

/// What a store holds, read back at start.
#[derive(Clone, Debug)]
pub struct Recovered<P> {
    /// Live tasks.
    pub tasks: Vec<RecoveredTask<P>>,
    /// Recently ended tasks.
    pub terminal: Vec<RecoveredTerminal>,
    /// Recurring schedules.
    pub recurring: Vec<RecoveredRecurring<P>>,
    /// The next task id's counter.
    pub next_id: u64,
}

impl<P> Default for Recovered<P> {
    /// Nothing.
    fn default() -> Self {
        Recovered {
            tasks: Vec::new(),
            terminal: Vec::new(),
            recurring: Vec::new(),
            next_id: 0,
        }
    }
}

/// Where a scheduler keeps its state. Declared with `#[async_trait]`: implementations use the
/// `async-trait` crate too.
///
/// A persistent store writes every change ahead of its effects and is read back by the next
/// leader; [`MemoryStore`] keeps nothing outside the scheduler.
#[async_trait]
pub trait Store<P, O>: Send + Sync + 'static {
    /// Whether the store keeps anything (only [`MemoryStore`] does not).
    fn persists(&self) -> bool {
        true
    }

    /// Waits until this instance leads, and returns its fencing epoch.
    async fn acquire_leadership(&self) -> Result<u16, StoreError>;

    /// Gives leadership up (when starting failed after it was acquired).
    async fn release_leadership(&self) {}

    /// Applies a batch of changes durably and in order, with the outputs of the tasks that
    /// succeeded in it; [`StoreError::Fenced`] when `epoch` is no longer the leader's.
    async fn commit(
        &self,
        epoch: u16,
        base: TimeBase,
        batch: &[Mutation<P>],
        outputs: &[(TaskId, &O)],
    ) -> Result<(), StoreError>;

    /// Reads back what the store holds.
    async fn recover(&self, base: TimeBase) -> Result<Recovered<P>, StoreError>;

    /// The output of a task that succeeded, if kept.
    async fn load_output(&self, _id: TaskId) -> Result<Option<O>, StoreError> {
        Ok(None)
    }
}

/// The store that keeps nothing outside the scheduler: the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStore;

#[async_trait]
impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Store<P, O> for MemoryStore {
    fn persists(&self) -> bool {
        false
    }

    async fn acquire_leadership(&self) -> Result<u16, StoreError> {
        Ok(0)
    }

    async fn commit(
        &self,
        _epoch: u16,
        _base: TimeBase,
        _batch: &[Mutation<P>],
        _outputs: &[(TaskId, &O)],
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn recover(&self, _base: TimeBase) -> Result<Recovered<P>, StoreError> {
        Ok(Recovered::default())
    }
}

/// A task as a store keeps it, for [`StoreQueries`]: what a server shows about a task that
/// may have ended long ago, or before this process started.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord<O> {
    /// The task.
    pub id: TaskId,
    /// Its deduplication key.
    pub key: Option<String>,
    /// The pool that runs it.
    pub pool: String,
    /// Its kind.
    pub kind: String,
    /// Its priority class.
    pub priority: Priority,
    /// Its tenant.
    pub tenant: Option<String>,
    /// Its status; `None` while it is queued (admitted, its first attempt not started).
    pub status: Option<TaskStatus>,
    /// Its latest attempt's number (0 before the first).
    pub attempt: u32,
    /// The message of its latest status change.
    pub message: Option<String>,
    /// The output of a task that succeeded, if the store kept it.
    pub output: Option<O>,
    /// When its row last changed: when it ended, for a task that did.
    pub updated: SystemTime,
}

/// Lookups a server needs of a persistent store, beside what [`Store`] does for a scheduler
/// (which uses none of them). Declared with `#[async_trait]`.
///
/// ```
/// use cronoq::{StoreError, StoreQueries, TaskRef, TaskStatus};
///
/// /// How a task ended, if it did.
/// async fn ended<O>(
///     store: &impl StoreQueries<O>,
///     key: &str,
/// ) -> Result<Option<TaskStatus>, StoreError> {
///     let record = store.get_task(&TaskRef::from(key)).await?;
///     Ok(record.and_then(|r| r.status).filter(|s| s.is_terminal()))
/// }
/// ```
#[async_trait]
pub trait StoreQueries<O>: Send + Sync + 'static {
    /// The task with this id, or the newest task with this key; `None` if the store has none
    /// (or pruned it).
    async fn get_task(&self, target: &TaskRef) -> Result<Option<TaskRecord<O>>, StoreError>;

    /// Deletes the ended tasks that ended more than `older_than` ago, and returns how many.
    /// Only the leader may: [`StoreError::Fenced`] otherwise.
    async fn prune(&self, older_than: Duration) -> Result<u64, StoreError>;

    /// Ended tasks in id order, after `after` (a page's last id), at most `limit` of them;
    /// only those of `pools` and of `statuses` (each: all when empty).
    async fn list_finished(
        &self,
        pools: &[&str],
        statuses: &[TaskStatus],
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskRecord<O>>, StoreError>;

    /// Whether this instance leads now.
    fn is_leader(&self) -> bool;

    /// Resolves once this instance does not lead (at once if it does not lead now).
    async fn leadership_lost(&self);
}
