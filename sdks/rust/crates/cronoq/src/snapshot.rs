//! Snapshots: the scheduler's state and quality metrics at one moment.

use std::sync::Arc;
use std::time::Duration;

use cronoq_core::model::Totals;

use crate::groups::{self, GroupSnapshot};
use crate::time::Time;

/// The whole scheduler at one moment ([`Scheduler::snapshot`](crate::Scheduler::snapshot)).
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// When it was taken.
    pub at: Time,
    /// Each pool, in configuration order.
    pub pools: Vec<PoolSnapshot>,
    /// Tasks not ended.
    pub live_tasks: usize,
    /// Attempts running.
    pub running: usize,
    /// Tasks pending (admitted, not running, not ended) in every pool.
    pub pending: usize,
    /// Counters since the start.
    pub totals: Totals,
}

impl Snapshot {
    /// The pool with this name.
    pub fn pool(&self, name: &str) -> Option<&PoolSnapshot> {
        self.pools.iter().find(|p| &*p.name == name)
    }
}

/// One pool at one moment, with quality metrics over the last `window`.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSnapshot {
    /// The pool's name.
    pub name: Arc<str>,
    /// Its workers (slots).
    pub capacity: u32,
    /// Attempts running.
    pub busy: u32,
    /// The target capacity: the autoscaler's latest, or the capacity without one.
    pub desired: u32,
    /// Pending tasks per class, indexed by [`Priority::index`](crate::Priority::index).
    pub pending_by_class: [usize; 4],
    /// Tasks waiting for a slot now.
    pub ready: usize,
    /// The window of the metrics below.
    pub window: Duration,
    /// Attempts started in the window.
    pub dispatched: u64,
    /// Attempts that succeeded in the window.
    pub succeeded: u64,
    /// Attempts that failed in the window.
    pub failed: u64,
    /// Retries in the window.
    pub retried: u64,
    /// Share of dispatches that took from the most important class with waiting tasks.
    pub priority_adherence: f64,
    /// Busy worker time over available worker time.
    pub utilization: f64,
    /// Worker time of successful attempts over available worker time.
    pub schedule_efficiency: f64,
    /// Mean wait for a worker.
    pub wait_mean: Duration,
    /// Median wait for a worker.
    pub wait_p50: Duration,
    /// 90th percentile of the wait.
    pub wait_p90: Duration,
    /// 99th percentile of the wait.
    pub wait_p99: Duration,
    /// Median attempt runtime.
    pub run_p50: Duration,
    /// 99th percentile of the runtime.
    pub run_p99: Duration,
    /// Workers integrated over time since the start (worker-seconds).
    pub worker_seconds: f64,
    /// `worker_seconds` times the autoscaler's `cost_per_worker_second`.
    pub cost: f64,
    /// Free slots held for fixed starts about to begin.
    pub held: u32,
    /// Fixed-start reservations not started yet.
    pub reservations: usize,
    /// The share of fixed starts in the window that started within their tolerance.
    pub fixed_start_hit_rate: f64,
    /// Its worker groups: the unlabeled slots first, then the labeled groups in the order
    /// they were declared.
    pub groups: Vec<GroupSnapshot>,
}

impl PoolSnapshot {
    /// Pending tasks of every class.
    pub fn pending(&self) -> usize {
        self.pending_by_class.iter().sum()
    }

    pub(crate) fn from_core(
        p: cronoq_core::model::PoolSnapshot,
        state: &cronoq_core::pool::PoolState,
    ) -> Self {
        let count = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
        let len = |n: i64| usize::try_from(n.max(0)).unwrap_or(usize::MAX);
        let dur = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO);
        PoolSnapshot {
            name: p.name,
            capacity: count(p.capacity),
            busy: count(p.busy),
            desired: count(p.desired),
            pending_by_class: p.pending_by_class.map(len),
            ready: len(p.ready),
            window: dur(p.window),
            dispatched: p.dispatched,
            succeeded: p.succeeded,
            failed: p.failed,
            retried: p.retried,
            priority_adherence: p.priority_adherence,
            utilization: p.utilization,
            schedule_efficiency: p.schedule_efficiency,
            wait_mean: dur(p.wait_mean),
            wait_p50: dur(p.wait_p50),
            wait_p90: dur(p.wait_p90),
            wait_p99: dur(p.wait_p99),
            run_p50: dur(p.run_p50),
            run_p99: dur(p.run_p99),
            worker_seconds: p.worker_seconds,
            cost: p.cost,
            held: count(p.held),
            reservations: p.reservations,
            fixed_start_hit_rate: p.fixed_start_hit_rate,
            groups: groups::snapshot(state),
        }
    }
}
