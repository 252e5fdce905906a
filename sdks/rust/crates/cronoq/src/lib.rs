//! cronoq in a Rust program: an elastic, priority-aware task scheduler running in-process on
//! tokio (library mode), and [`TaskError`], the error type of every attempt, in-process or in a
//! remote worker (`cronoq_server::worker::run_worker`).
//!
//! A [`Scheduler`] holds named [`Pool`]s of workers. Each pool runs its tasks with one
//! [`Executor`], most often a closure; tasks wait in priority order (four classes, aging,
//! deadline urgency), are retried with backoff, time out, can be cancelled, and are
//! deduplicated by key. Tasks may wait for other tasks ([`Task::after`], [`Dep`]), take
//! shared resources ([`ResourceConfig`]), run only on labeled worker groups
//! ([`Task::label`]), start at a fixed time ([`Task::start_at`]) or recur on a cron schedule
//! ([`Recurring`]); a pool's [`Scaler`] turns its worker target into capacity. The scheduling
//! rules are those of cronoq's engine core
//! (`cronoq-core`), which this crate drives: one tokio task owns the engine and keeps a single
//! timer for it, and each attempt runs as a task of its own.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cronoq::{Pool, Scheduler, Task, TaskContext, TaskError};
//!
//! struct Job { url: String }
//!
//! async fn do_work(job: &Job) -> Result<usize, std::io::Error> {
//!     Ok(job.url.len())
//! }
//!
//! let scheduler = Scheduler::<Job, usize>::builder()
//!     .pool(Pool::new("default").executor_fn(|ctx: TaskContext, job: Arc<Job>| async move {
//!         tokio::select! {
//!             r = do_work(&job) => r.map_err(TaskError::from_err),
//!             _ = ctx.cancelled() => Err(TaskError::Cancelled),
//!         }
//!     }))
//!     .build()
//!     .await?;
//!
//! let handle = scheduler.submit(Task::new(Job { url: "https://example.com".into() })).await?;
//! assert_eq!(*handle.await?, 19);
//! scheduler.shutdown(Duration::from_secs(5)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! `P` (the payload type) and `O` (the output type) are shared by all pools of a scheduler;
//! payloads reach executors as `Arc<P>` and outputs reach handles as `Arc<O>`. Programs
//! without tokio use [`BlockingScheduler`] ([`Builder::build_blocking`]).
//!
//! Tests drive time instead of sleeping: the scheduler's [`Clock`] follows tokio's, so with
//! `#[tokio::test(start_paused = true)]` retries, timeouts and lease expiries happen as soon as
//! every task is idle, in the order their times say.
//!
//! With the default feature `otel` the scheduler reports OpenTelemetry metrics through the
//! global meter provider, and a task submitted inside a `tracing` span carries that span's
//! trace context in its `traceparent` tag, the parent of its attempts' `cronoq.task` spans
//! (the README's "Telemetry" describes both).
//!
//! The crate's README (`sdks/rust/README.md`) describes library mode as a whole, including
//! what this version does not offer yet and where it differs from the published cronoq crate.

#![warn(missing_docs)]

mod admission;
mod blocking;
mod bounds;
#[cfg(feature = "store-codec")]
pub mod codec;
mod config;
mod deps;
mod driver;
mod error;
mod executor;
mod fixed;
mod groups;
mod handle;
mod pool;
mod priority;
mod recurring;
mod resources;
mod scaling;
mod scheduler;
mod snapshot;
mod store;
mod task;
mod telemetry;
mod time;
mod types;
mod unwind;
mod wal;

pub use blocking::{BlockingHandle, BlockingScheduler};
pub use config::{
    AutoscaleConfig, Bounds, Fairness, OverflowPolicy, PoolConfig, RetryPolicy, UrgencyConfig,
};
pub use deps::{Dep, EdgeCond, UnknownDependency};
pub use error::{Error, StoreError, SubmitError, TaskError, TaskFailure};
pub use executor::{BoxFuture, Executor, FnExecutor, TaskContext};
pub use fixed::MissPolicy;
pub use groups::{GroupSnapshot, Labels};
pub use handle::TaskHandle;
pub use pool::Pool;
pub use priority::PriorityConfig;
pub use recurring::{OverlapPolicy, Recurring, RecurringInfo, RecurringSpec};
pub use resources::{ResourceConfig, ResourceKind};
pub use scaling::{ExternalScaler, ScaleError, Scaler, SlotScaler};
pub use scheduler::{Builder, Scheduler};
pub use snapshot::{PoolSnapshot, Snapshot};
pub use store::{
    MemoryStore, Mutation, Recovered, RecoveredTask, RecoveredTerminal, Store, StoreQueries,
    TaskRecord, TimeBase,
};
pub use task::{Task, TaskSpec, When};
pub use time::{Clock, Time};
pub use types::{
    LeaseId, PoolId, Priority, StatusEvent, Submitted, TaskId, TaskRef, TaskStatus, TaskSummary,
};

/// The engine-level types: the ones this crate's root re-exports, under the same names, and
/// those that appear in its signatures without being at its root (the engine-wide settings,
/// the snapshot counters, the tags type and the fixed start). The engine itself is the
/// `cronoq-core` crate, whose interface is its own.
pub mod core {
    pub use crate::config::CoreConfig;
    pub use crate::executor::Tags;
    pub use crate::fixed::FixedStart;
    pub use crate::store::RecoveredRecurring;
    pub use crate::{
        AutoscaleConfig, Bounds, Dep, EdgeCond, Fairness, GroupSnapshot, Labels, LeaseId,
        MissPolicy, Mutation, OverflowPolicy, OverlapPolicy, PoolConfig, PoolId, PoolSnapshot,
        Priority, PriorityConfig, Recovered, RecoveredTask, RecoveredTerminal, RecurringInfo,
        RecurringSpec, ResourceConfig, ResourceKind, RetryPolicy, Snapshot, StatusEvent,
        SubmitError, Submitted, TaskId, TaskRef, TaskSpec, TaskStatus, TaskSummary, Time,
        UnknownDependency, UrgencyConfig,
    };
    pub use cronoq_core::model::Totals;
}
