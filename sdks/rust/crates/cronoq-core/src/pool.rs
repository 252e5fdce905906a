//! The engine's state of one pool (Python: `cronoq.core.pool`): slots, queues, counters,
//! learned durations and the quality statistics (`stats::PoolStats`). Not ported yet: worker
//! groups, fixed-start bookkeeping and the autoscaler.

use std::sync::Arc;

use crate::model::{KindId, PoolConfig, PoolSnapshot, RetryPolicy, Scoring, TaskRecord};
use crate::queue::ReadyQueues;
use crate::stats::PoolStats;

/// Weight of the newest runtime in the learned expected duration of a (pool, kind).
pub const EWMA_ALPHA: f64 = 0.2;

/// Engine-side state of one pool.
#[derive(Debug)]
pub struct PoolState {
    /// Its configuration.
    pub cfg: PoolConfig,
    /// Its name.
    pub name: Arc<str>,
    /// Its slots. Signed: a capacity lowered below `busy` leaves a negative room.
    pub capacity: i64,
    /// Attempts running.
    pub busy: i64,
    /// Its ready tasks.
    pub queues: ReadyQueues,
    /// Pending (admitted, not running, not ended) tasks per class.
    pub pending_by_class: [i64; 4],
    /// Retrying tasks per class.
    pub retrying_by_class: [i64; 4],
    /// The default retry policy of its tasks.
    pub retry: RetryPolicy,
    /// Its lease time to live.
    pub lease_ttl: Option<f64>,
    /// Learned expected duration per kind (EWMA of successful runtimes), by `KindId`.
    pub durations: Vec<Option<f64>>,
    /// Learned mean runtime of any kind.
    pub learned: Option<f64>,
    /// Retries of its tasks.
    pub retries: u64,
    /// Its tasks dead-lettered.
    pub dead_lettered: u64,
    /// Paused by an operator: dispatch passes it by.
    pub paused: bool,
    /// Quality metrics over a sliding window (snapshots).
    pub stats: PoolStats,
}

impl PoolState {
    /// A pool as configured at `now`, with nothing admitted.
    pub fn new(cfg: PoolConfig, sc: Scoring, now: f64) -> Self {
        PoolState {
            name: Arc::from(cfg.name.as_str()),
            capacity: i64::from(cfg.capacity),
            busy: 0,
            queues: ReadyQueues::new(sc),
            pending_by_class: [0; 4],
            retrying_by_class: [0; 4],
            retry: cfg.retry,
            lease_ttl: cfg.lease_ttl,
            durations: Vec::new(),
            learned: None,
            retries: 0,
            dead_lettered: 0,
            paused: false,
            stats: PoolStats::new(now, i64::from(cfg.capacity)),
            cfg,
        }
    }

    /// The task's expected duration: its hint, the learned one of its kind, or the default.
    pub fn expected_duration(&self, rec: &TaskRecord) -> f64 {
        if let Some(hint) = rec.duration_hint {
            return hint;
        }
        self.durations
            .get(rec.kind as usize)
            .copied()
            .flatten()
            .unwrap_or(self.cfg.default_duration)
    }

    /// The learned mean runtime, or the pool's default before any task succeeded.
    pub fn service_time(&self) -> f64 {
        self.learned.unwrap_or(self.cfg.default_duration)
    }

    /// Slots ready tasks may take.
    pub fn free_for_queue(&self) -> i64 {
        self.capacity - self.busy
    }

    /// Pending tasks of every class.
    pub fn pending(&self) -> i64 {
        self.pending_by_class.iter().sum()
    }

    /// Can the pool take `n` more pending tasks without its overflow policy?
    pub fn has_room(&self, n: i64) -> bool {
        self.cfg
            .max_pending
            .is_none_or(|cap| self.pending() + n <= i64::from(cap))
    }

    /// The pool now, with its quality metrics over the stats window.
    pub fn snapshot(&mut self, now: f64) -> PoolSnapshot {
        let m = self.stats.summary(now);
        let pending = self.pending();
        let worker_seconds = self.stats.worker_seconds();
        PoolSnapshot {
            name: self.name.clone(),
            capacity: self.capacity,
            busy: self.busy,
            pending,
            pending_by_class: self.pending_by_class,
            ready: self.queues.n,
            window: self.stats.window(),
            dispatched: m.dispatched,
            succeeded: m.succeeded,
            failed: m.failed,
            retried: m.retried,
            priority_adherence: m.priority_adherence,
            utilization: m.utilization,
            schedule_efficiency: m.schedule_efficiency,
            wait_mean: m.wait_mean,
            wait_p50: m.wait_p50,
            wait_p90: m.wait_p90,
            wait_p99: m.wait_p99,
            run_p50: m.run_p50,
            run_p99: m.run_p99,
            worker_seconds,
            cost: worker_seconds * self.cfg.cost_per_worker_second,
            paused: self.paused,
            unserved: pending > 0 && self.capacity == 0,
        }
    }

    /// Learn from a successful attempt's runtime (inline in Python's `Engine.complete`).
    pub(crate) fn learn(&mut self, kind: KindId, runtime: f64) {
        let k = kind as usize;
        if k >= self.durations.len() {
            self.durations.resize(k + 1, None);
        }
        let d = &mut self.durations[k];
        *d = Some(match *d {
            None => runtime,
            Some(d) => d + EWMA_ALPHA * (runtime - d),
        });
        self.learned = Some(match self.learned {
            None => runtime,
            Some(d) => d + EWMA_ALPHA * (runtime - d),
        });
    }
}
