//! The engine's state of one pool (Python: `cronoq.core.pool`): slots, queues, counters,
//! learned durations, fixed-start bookkeeping, the quality statistics (`stats::PoolStats`),
//! the autoscaler and the worker groups.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use crate::autoscale::{Autoscaler, Signals};
use crate::groups::Groups;
use crate::model::{
    ConfigError, KindId, PoolConfig, PoolSnapshot, ReadyView, RetryPolicy, Scoring, Status, TaskId,
    TaskRecord, py_cmp, py_max, py_min,
};
use crate::pyrepr::python_shown;
use crate::queue::ReadyQueues;
use crate::stats::PoolStats;
use crate::table::Tasks;
use crate::vocab::NUM_CLASSES;

/// Weight of the newest runtime in the learned expected duration of a (pool, kind).
pub const EWMA_ALPHA: f64 = 0.2;

/// A fixed start waiting for its slot in `PoolState::due`: popped in (start, admission) order,
/// which never ties (admission orders are unique), so the heap pops as heapq does.
#[derive(Clone, Copy, Debug)]
pub struct DueEntry {
    /// Its fixed start.
    pub start: f64,
    /// Its admission order.
    pub seq: u64,
    /// The task.
    pub task: TaskId,
}

impl Ord for DueEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: std's heap is a max-heap, heapq a min-heap.
        py_cmp(other.start, self.start).then(other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for DueEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for DueEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for DueEntry {}

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
    /// Pending tasks not ready yet (blocked on dependencies, or scheduled for a fixed start)
    /// per class: only tasks with extras ever are, so a plain task never touches it.
    pub unready_by_class: [i64; 4],
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
    /// Tasks admitted since the last autoscaler evaluation (a fixed start counts when due).
    pub arrivals: i64,
    /// The intervals fixed starts not started yet reserve, by task.
    pub reservations: BTreeMap<TaskId, (f64, f64)>,
    /// Most reservations that may overlap at one instant.
    pub reservation_limit: i64,
    /// Slots held for fixed starts (from the hold until the start).
    pub holds: i64,
    /// Fixed starts at their start time, waiting for their held slot; entries of tasks that
    /// moved on stay until popped, as in Python.
    pub due: BinaryHeap<DueEntry>,
    /// Due tasks whose tolerance ran out with a free slot (skip or fail): the next dispatch
    /// starts them or ends them.
    pub misses: Vec<TaskId>,
}

impl PoolState {
    /// A pool as configured at `now`, with nothing admitted. Refused: tenant weights that are
    /// not finite and > 0 under fair share (Python's `ValueError`), autoscaler bounds with
    /// `min > max` (Python's assertion), and a reservable fraction outside [0, 1] (the check
    /// of Python's `cronoq.Pool`).
    pub fn new(cfg: PoolConfig, sc: Scoring, now: f64) -> Result<Self, ConfigError> {
        let fraction = cfg.reservable_fraction;
        if !(0.0..=1.0).contains(&fraction) {
            return Err(ConfigError(format!(
                "reservable_fraction must be in [0, 1] (got {})",
                python_shown(fraction)
            )));
        }
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
            unready_by_class: [0; 4],
            retry: cfg.retry,
            lease_ttl: cfg.lease_ttl,
            durations: Vec::new(),
            learned: None,
            retries: 0,
            dead_lettered: 0,
            paused: false,
            stats: PoolStats::with_window(now, i64::from(cfg.capacity), cfg.metrics_window),
            scaler,
            arrivals: 0,
            reservations: BTreeMap::new(),
            reservation_limit: 1.max((f64::from(cfg.max) * fraction).floor() as i64),
            holds: 0,
            due: BinaryHeap::new(),
            misses: Vec::new(),
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
    /// from its own last target). Resets the arrivals counted since the last one. The backlog
    /// is the queued, due and retrying tasks per class; the reservations starting within the
    /// horizon count at their peak overlap.
    ///
    /// # Panics
    /// Without an autoscaler (the engine evaluates only pools that have one).
    pub fn evaluate_scaler(&mut self, now: f64, elastic: bool, tasks: &Tasks) -> i64 {
        let mut backlog = [0i64; 4];
        for (c, q) in self.queues.classes.iter().enumerate() {
            backlog[c] = q.n();
        }
        for e in &self.due {
            if let Some(rec) = tasks.get(&e.task)
                && rec.status == Status::Ready
            {
                backlog[usize::from(rec.cls)] += 1;
            }
        }
        for (c, n) in self.retrying_by_class.iter().enumerate() {
            backlog[c] += n;
        }
        let scaler = self.scaler.as_ref().expect("a pool with an autoscaler");
        let horizon = now + scaler.settings().reservation_horizon;
        let upcoming: Vec<(f64, f64)> = self
            .reservations
            .values()
            .filter(|iv| iv.0 <= horizon)
            .copied()
            .collect();
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
            reserved: peak_overlap(&upcoming, now, f64::INFINITY),
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

    /// The interval a fixed-start task reserves: [start - tol, start + duration + tol).
    ///
    /// # Panics
    /// For a task without a fixed start.
    pub fn reservation(&self, rec: &TaskRecord) -> (f64, f64) {
        let extra = rec.extra.as_deref().expect("a fixed start");
        let start = extra.start_at.expect("a fixed start");
        let tol = extra.tolerance;
        (start - tol, start + self.expected_duration(rec) + tol)
    }

    /// Slots ready tasks may take: held slots are kept for fixed starts.
    pub fn free_for_queue(&self) -> i64 {
        self.capacity - self.busy - self.holds
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

    /// Ready tasks per class and the `ready_at` of the first in line (`ReadyView`).
    pub fn ready_view(&mut self, tasks: &Tasks) -> ReadyView {
        let mut ready = [0i64; NUM_CLASSES];
        for (c, r) in ready.iter_mut().enumerate() {
            *r = self.pending_by_class[c] - self.retrying_by_class[c] - self.unready_by_class[c];
        }
        let mut oldest: [Option<f64>; NUM_CLASSES] = [None; NUM_CLASSES];
        for (c, q) in self.queues.classes.iter_mut().enumerate() {
            if q.n() != 0
                && let Some(head) = q.fifo_head(tasks)
            {
                oldest[c] = Some(tasks[&head.task].ready_at);
            }
        }
        for e in self.due.iter() {
            // fixed starts waiting for their held slot (few)
            let Some(rec) = tasks.get(&e.task) else {
                continue;
            };
            if rec.status == Status::Ready && rec.extra.as_ref().is_some_and(|x| x.due) {
                let c = usize::from(rec.cls);
                if oldest[c].is_none_or(|at| rec.ready_at < at) {
                    oldest[c] = Some(rec.ready_at);
                }
            }
        }
        ReadyView {
            pool: self.name.clone(),
            ready_by_class: ready,
            oldest_ready_at: oldest,
            retries: self.retries,
            dead_lettered: self.dead_lettered,
        }
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
            held: self.holds.min((self.capacity - self.busy).max(0)),
            desired: self.desired(),
            pending,
            pending_by_class: self.pending_by_class,
            ready: self.queues.n,
            reservations: self.reservations.len(),
            window: self.stats.window(),
            dispatched: m.dispatched,
            succeeded: m.succeeded,
            failed: m.failed,
            retried: m.retried,
            priority_adherence: m.priority_adherence,
            fixed_start_hit_rate: m.fixed_start_hit_rate,
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

/// Most of the half-open intervals that cover one instant of [lo, hi).
pub fn peak_overlap(intervals: &[(f64, f64)], lo: f64, hi: f64) -> i64 {
    let mut points: Vec<(f64, i64)> = Vec::new();
    for &(a, b) in intervals {
        if a < hi && b > lo {
            points.push((py_max(a, lo), 1));
            points.push((py_min(b, hi), -1));
        }
    }
    // At equal times, ends (-1) before starts (+1): touching is no overlap.
    points.sort_by(|x, y| py_cmp(x.0, y.0).then(x.1.cmp(&y.1)));
    let (mut peak, mut level) = (0, 0);
    for (_, step) in points {
        level += step;
        peak = peak.max(level);
    }
    peak
}
