//! The engine's state of one pool (Python: `cronoq.core.pool`): slots, queues, counters,
//! learned durations, the quality statistics (`stats::PoolStats`), the autoscaler and the
//! worker groups. Not ported yet: fixed-start bookkeeping (so no task is due or reserved).

use std::sync::Arc;

use crate::autoscale::{Autoscaler, Signals};
use crate::groups::Groups;
use crate::model::{
    ConfigError, KindId, PoolConfig, PoolSnapshot, RetryPolicy, Scoring, TaskRecord,
};
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
    /// Its slots: the unlabeled ones plus those of every worker group. Signed: a capacity
    /// lowered below `busy` leaves a negative room.
    pub capacity: i64,
    /// Its unlabeled slots (what `set_capacity` and the autoscaler set).
    pub unlabeled: i64,
    /// Its worker groups, made when a group or a labeled task first appears.
    pub groups: Option<Groups>,
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
    /// Its autoscaler, if configured.
    pub scaler: Option<Autoscaler>,
    /// Tasks admitted since the last autoscaler evaluation.
    pub arrivals: i64,
}

impl PoolState {
    /// A pool as configured at `now`, with nothing admitted. Refused: tenant weights that are
    /// not finite and > 0 under fair share (Python's `ValueError`), and autoscaler bounds with
    /// `min > max` (Python's assertion).
    pub fn new(cfg: PoolConfig, sc: Scoring, now: f64) -> Result<Self, ConfigError> {
        let fair = if cfg.fair_share {
            Some(cfg.tenant_weights.as_slice())
        } else {
            None
        };
        let queues = ReadyQueues::new(sc, fair)?;
        let scaler = match &cfg.autoscale {
            Some(_) if cfg.min > cfg.max => {
                return Err(ConfigError(format!(
                    "autoscaler bounds must satisfy 0 <= min <= max ({}, {})",
                    cfg.min, cfg.max
                )));
            }
            Some(settings) => Some(Autoscaler::new(
                settings.clone(),
                i64::from(cfg.min),
                i64::from(cfg.max),
                now,
            )),
            None => None,
        };
        Ok(PoolState {
            name: Arc::from(cfg.name.as_str()),
            capacity: i64::from(cfg.capacity),
            unlabeled: i64::from(cfg.capacity),
            groups: None,
            busy: 0,
            queues,
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
            scaler,
            arrivals: 0,
            cfg,
        })
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

    /// One autoscaler evaluation: the unlabeled slots the pool should have (Python's
    /// `evaluate_scaler`, whose docstring says why, without `elastic`, the autoscaler steps
    /// from its own last target). Resets the arrivals counted since the last one. The backlog is the queued and
    /// retrying tasks per class (no fixed start is ever due here, none reserves a slot).
    ///
    /// # Panics
    /// Without an autoscaler (the engine evaluates only pools that have one).
    pub fn evaluate_scaler(&mut self, now: f64, elastic: bool) -> i64 {
        let mut backlog = [0i64; 4];
        for (c, q) in self.queues.classes.iter().enumerate() {
            backlog[c] = q.n() + self.retrying_by_class[c];
        }
        let sig = Signals {
            arrivals: self.arrivals,
            service_time: self.service_time(),
            backlog_by_class: backlog,
            busy: self.busy,
            capacity: if elastic {
                self.unlabeled
            } else {
                self.desired()
            },
            reserved: 0,
            stranded: !elastic && self.unlabeled == 0,
        };
        let scaler = self.scaler.as_mut().expect("a pool with an autoscaler");
        let new = scaler.evaluate(now, &sig);
        self.arrivals = 0;
        new
    }

    /// The target capacity: the autoscaler's last one, or the capacity without it.
    pub fn desired(&self) -> i64 {
        self.scaler
            .as_ref()
            .map_or(self.capacity, Autoscaler::desired)
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
            desired: self.desired(),
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
