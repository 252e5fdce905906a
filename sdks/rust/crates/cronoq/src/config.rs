//! Configuration values: a pool's ([`PoolConfig`] and the types of its fields) and the
//! engine-wide one ([`CoreConfig`](crate::core::CoreConfig)), with their translation into the
//! engine's settings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cronoq_core::autoscale::AutoscaleSettings;
use cronoq_core::model::Scoring;
use cronoq_core::vocab::Overflow;

use crate::deps::UnknownDependency;
use crate::priority::PriorityConfig;
use crate::resources::ResourceConfig;
use crate::types::Priority;

/// How many attempts a task gets and how long to wait between them.
///
/// The wait before attempt `n` (`n = 2` is the first retry) is
/// `min(initial_backoff × multiplier^(n−2), max_backoff)`; with `jitter` the actual wait is
/// drawn uniformly below that (full jitter). An executor's
/// [`TaskError::retry_after`](crate::TaskError::retry_after) raises it further. A task whose last
/// allowed attempt fails ends [`DeadLettered`](crate::TaskStatus::DeadLettered).
///
/// ```
/// use std::time::Duration;
/// use cronoq::RetryPolicy;
///
/// let p = RetryPolicy { max_attempts: 5, jitter: false, ..RetryPolicy::default() };
/// assert_eq!(p.backoff(2), Duration::from_secs(1));
/// assert_eq!(p.backoff(4), Duration::from_secs(4));
/// let shrinking = RetryPolicy { multiplier: 0.5, ..p };
/// assert_eq!(shrinking.backoff(3), Duration::from_millis(500));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1.
    pub max_attempts: u32,
    /// The wait before the first retry.
    pub initial_backoff: Duration,
    /// The factor between successive waits: finite and >= 0 (below 1 the waits shrink).
    pub multiplier: f64,
    /// The longest wait.
    pub max_backoff: Duration,
    /// Draw each wait uniformly from zero up to the computed one.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    /// Three attempts, waits from 1 s doubling up to 60 s, with jitter.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_secs(1),
            multiplier: 2.0,
            max_backoff: Duration::from_secs(60),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retry.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The wait before attempt `next_attempt` (2 = the first retry), before jitter.
    pub fn backoff(&self, next_attempt: u32) -> Duration {
        let secs = self.to_core().backoff(next_attempt);
        Duration::try_from_secs_f64(secs).unwrap_or(self.max_backoff)
    }

    /// Why the engine cannot take this policy, if it cannot.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        if !self.multiplier.is_finite() || self.multiplier < 0.0 {
            Some("retry multiplier must be finite and non-negative")
        } else if self.max_attempts == 0 {
            Some("retry.max_attempts must be >= 1")
        } else {
            None
        }
    }

    /// The engine's policy (checked with `problem` first).
    pub(crate) fn to_core(self) -> cronoq_core::RetryPolicy {
        cronoq_core::RetryPolicy::from_parts(
            self.max_attempts,
            self.initial_backoff.as_secs_f64(),
            self.multiplier,
            self.max_backoff.as_secs_f64(),
            self.jitter,
        )
    }
}

/// Queue-pressure autoscaling of a pool: how its worker target follows arrivals, backlog and
/// waits, between `min_workers` and `max_workers`.
///
/// Every `interval` the pool's target is recomputed from the arrival rate (so that workers are
/// busy about `target_utilization` of the time), the backlog (drained within `drain_time`) and
/// the per-class wait objectives `slo`; steps up are immediate and bounded, steps down wait for
/// `stabilization_window` and `cooldown`. In library mode the target becomes the pool's
/// capacity at once.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoscaleConfig {
    /// Time between evaluations (> 0).
    pub interval: Duration,
    /// The busy fraction the arrival-rate term aims for, in (0, 1].
    pub target_utilization: f64,
    /// Within how long a backlog should drain.
    pub drain_time: Duration,
    /// The longest acceptable predicted wait per class, indexed by [`Priority::index`].
    pub slo: [Option<Duration>; 4],
    /// How far ahead fixed-start reservations count.
    pub reservation_horizon: Duration,
    /// A step down takes the highest target seen within this window.
    pub stabilization_window: Duration,
    /// The least time between two steps down.
    pub cooldown: Duration,
    /// One step up may add this fraction of the current capacity (finite, >= 0)…
    pub max_step_up_ratio: f64,
    /// …or at least this many workers.
    pub max_step_up_abs: u32,
    /// One step down removes at most this many workers.
    pub max_step_down: u32,
    /// Weight of the newest arrival-rate sample, in (0, 1].
    pub ewma_alpha: f64,
    /// The price of one worker for one second ([`PoolSnapshot::cost`](crate::PoolSnapshot::cost)).
    pub cost_per_worker_second: f64,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            interval: Duration::from_secs(1),
            target_utilization: 0.75,
            drain_time: Duration::from_secs(30),
            slo: [None; 4],
            reservation_horizon: Duration::from_secs(60),
            stabilization_window: Duration::from_secs(60),
            cooldown: Duration::from_secs(30),
            max_step_up_ratio: 1.0,
            max_step_up_abs: 4,
            max_step_down: 1,
            ewma_alpha: 0.3,
            cost_per_worker_second: 0.0,
        }
    }
}

impl AutoscaleConfig {
    /// The engine's settings, or why they cannot work.
    pub(crate) fn to_core(&self) -> Result<AutoscaleSettings, String> {
        let slo: BTreeMap<usize, f64> = Priority::ALL
            .iter()
            .filter_map(|p| Some((p.index(), self.slo[p.index()]?.as_secs_f64())))
            .collect();
        let settings = AutoscaleSettings {
            interval: self.interval.as_secs_f64(),
            target_utilization: self.target_utilization,
            drain_time: self.drain_time.as_secs_f64(),
            slo,
            reservation_horizon: self.reservation_horizon.as_secs_f64(),
            stabilization_window: self.stabilization_window.as_secs_f64(),
            cooldown: self.cooldown.as_secs_f64(),
            max_step_up_abs: i64::from(self.max_step_up_abs),
            max_step_down: i64::from(self.max_step_down),
            max_step_up_ratio: self.max_step_up_ratio,
            ewma_alpha: self.ewma_alpha,
            cost_per_worker_second: self.cost_per_worker_second,
        };
        settings.validate().map_err(|e| e.message)?;
        if !(self.max_step_up_ratio.is_finite() && self.max_step_up_ratio >= 0.0) {
            return Err("max_step_up_ratio must be a finite number >= 0".into());
        }
        if !(self.ewma_alpha > 0.0 && self.ewma_alpha <= 1.0) {
            return Err("ewma_alpha must be in (0, 1]".into());
        }
        Ok(settings)
    }
}

/// Queue limits: how many tasks may be pending (admitted, not running, not ended) at once,
/// of a pool ([`PoolConfig::bounds`]) or of all pools
/// ([`CoreConfig::global_bounds`](crate::core::CoreConfig::global_bounds)). What a submission
/// beyond them does is its pool's [`OverflowPolicy`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    /// Most pending tasks (`None`: unbounded).
    pub max_pending: Option<usize>,
    /// Most pending tasks of each priority class, indexed by [`Priority::index`]. A task
    /// beyond one waits (overflow `Wait`) or is refused with
    /// [`Overloaded`](crate::SubmitError::Overloaded): no task is shed for it.
    pub max_pending_per_class: [Option<usize>; 4],
}

/// What a submission to a pool at its [`Bounds`] does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OverflowPolicy {
    /// Wait for room: the submitting call parks until the queue has space (the default).
    #[default]
    Wait,
    /// Refuse the new task with [`SubmitError::Overloaded`](crate::SubmitError::Overloaded).
    Reject,
    /// Shed the newest queued task of the least important class below the new task's class
    /// (it ends `Shed`); refuse the new task when there is none.
    ShedLowest,
    /// Shed the oldest queued task of the `Low` class; refuse the new task when there is none.
    ShedOldest,
}

impl OverflowPolicy {
    fn to_core(self) -> Overflow {
        match self {
            OverflowPolicy::Wait => Overflow::Wait,
            OverflowPolicy::Reject => Overflow::Reject,
            OverflowPolicy::ShedLowest => Overflow::ShedLowest,
            OverflowPolicy::ShedOldest => Overflow::ShedOldest,
        }
    }
}

/// Weighted fair sharing of a pool between tenants ([`Task::tenant`](crate::Task::tenant)).
///
/// Within each priority class, tenants take turns in proportion to their weights, so one
/// tenant's burst does not starve the others; a tenant that was idle cannot bank credit.
///
/// ```
/// use cronoq::{Fairness, Pool, TaskError};
///
/// let pool = Pool::<u32, u32>::fixed("default", 4)
///     .executor_fn(|_ctx, n| async move { Ok::<_, TaskError>(*n) })
///     .configure(|c| c.fairness = Some(Fairness::weights([("gold", 3.0), ("free", 1.0)])));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Fairness {
    /// Weights of the listed tenants (finite, > 0).
    pub weights: Vec<(Arc<str>, f64)>,
    /// The weight of every other tenant, and of tasks without a tenant (finite, > 0).
    pub default_weight: f64,
}

impl Default for Fairness {
    /// No listed tenant; every tenant weighs 1.
    fn default() -> Self {
        Fairness {
            weights: Vec::new(),
            default_weight: 1.0,
        }
    }
}

impl Fairness {
    /// These tenants with these weights; every other tenant weighs 1.
    pub fn weights<N: Into<Arc<str>>>(weights: impl IntoIterator<Item = (N, f64)>) -> Fairness {
        Fairness {
            weights: weights.into_iter().map(|(n, w)| (n.into(), w)).collect(),
            ..Fairness::default()
        }
    }

    /// The engine's weights: relative to the default weight, which the engine takes as 1
    /// (fair sharing depends only on the ratios of the weights).
    fn to_core(&self) -> Result<Vec<(String, f64)>, String> {
        let d = self.default_weight;
        let ok = |w: f64| w.is_finite() && w > 0.0;
        if !ok(d) || !self.weights.iter().all(|&(_, w)| ok(w)) {
            return Err(cronoq_core::fair::WEIGHTS_MESSAGE.into());
        }
        Ok(self
            .weights
            .iter()
            .map(|(n, w)| (n.to_string(), w / d))
            .collect())
    }
}

/// A pool's settings. [`Pool`](crate::Pool) builds one; its
/// [`configure`](crate::Pool::configure) gives access to every field.
///
/// ```
/// use std::time::Duration;
/// use cronoq::{Bounds, OverflowPolicy, PoolConfig, RetryPolicy};
///
/// let mut c = PoolConfig::fixed("emails", 4);
/// c.retry = RetryPolicy { max_attempts: 5, ..RetryPolicy::default() };
/// c.bounds = Bounds { max_pending: Some(1000), ..Bounds::default() };
/// c.overflow = OverflowPolicy::Reject;
/// c.lease_ttl = Some(Duration::from_secs(30));
/// assert_eq!(c.max_hold, Duration::from_secs(300));
/// c.max_hold = Duration::from_secs(30); // fixed starts hold a worker at most 30 s early
/// assert_eq!((c.min_workers, c.initial_workers, c.max_workers), (4, 4, 4));
/// ```
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// The pool's name, unique in a scheduler.
    pub name: Arc<str>,
    /// The lowest worker target of the autoscaler.
    pub min_workers: u32,
    /// The highest worker target of the autoscaler.
    pub max_workers: u32,
    /// Workers at start (at most `max_workers`).
    pub initial_workers: u32,
    /// Queue-pressure autoscaling (`None`: the pool keeps `initial_workers`).
    pub autoscale: Option<AutoscaleConfig>,
    /// The retry policy of tasks that bring none.
    pub retry: RetryPolicy,
    /// Queue limits.
    pub bounds: Bounds,
    /// What a submission at the limits does.
    pub overflow: OverflowPolicy,
    /// The expected duration of a kind of task before one of them has succeeded (deadline
    /// urgency and autoscaling use it).
    pub default_duration: Duration,
    /// The earliest a worker is held for a fixed-start task before its start. The engine holds
    /// a slot from the start's tolerance or the kind's learned runtime before it, whichever is
    /// longer, so that the task finds a worker at its time; this caps how long that worker
    /// idles.
    pub max_hold: Duration,
    /// Attempts must heartbeat ([`TaskContext::heartbeat`](crate::TaskContext::heartbeat))
    /// within this time or they are given up and retried (`None`: no lease).
    pub lease_ttl: Option<Duration>,
    /// Weighted fair sharing between tenants (`None`: off).
    pub fairness: Option<Fairness>,
    /// The share of `max_workers` that fixed-start reservations may take at one instant, in
    /// [0, 1] (at least one reservation is always allowed).
    pub reservable_fraction: f64,
    /// What a dependency on a key no task holds does.
    pub unknown_dependency: UnknownDependency,
}

impl PoolConfig {
    /// An autoscaled pool: between 1 and 10 workers, 1 at start.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        PoolConfig {
            name: name.into(),
            min_workers: 1,
            max_workers: 10,
            initial_workers: 1,
            autoscale: Some(AutoscaleConfig::default()),
            retry: RetryPolicy::default(),
            bounds: Bounds::default(),
            overflow: OverflowPolicy::Wait,
            default_duration: Duration::from_secs(1),
            max_hold: Duration::from_secs(300),
            lease_ttl: None,
            fairness: None,
            reservable_fraction: 0.5,
            unknown_dependency: UnknownDependency::Reject,
        }
    }

    /// A pool of exactly `workers` workers, without autoscaling.
    pub fn fixed(name: impl Into<Arc<str>>, workers: u32) -> Self {
        PoolConfig {
            autoscale: None,
            ..PoolConfig::new(name).workers(workers, workers, workers)
        }
    }

    /// Sets the worker bounds: note the order, `min`, `initial`, `max`.
    pub fn workers(mut self, min: u32, initial: u32, max: u32) -> Self {
        self.min_workers = min;
        self.initial_workers = initial;
        self.max_workers = max;
        self
    }

    /// The engine's pool, or why it cannot work (checked at `build`).
    pub(crate) fn to_core(&self) -> Result<cronoq_core::PoolConfig, String> {
        if let Some(problem) = self.retry.problem() {
            return Err(problem.into());
        }
        let autoscale = self.autoscale.as_ref().map(|a| a.to_core()).transpose()?;
        let fair = self.fairness.as_ref().map(Fairness::to_core).transpose()?;
        let max_pending = self
            .bounds
            .max_pending
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        let (unknown_dependency, await_timeout) = self.unknown_dependency.to_core();
        Ok(cronoq_core::PoolConfig {
            unknown_dependency,
            await_timeout,
            reservable_fraction: self.reservable_fraction,
            capacity: self.initial_workers.min(self.max_workers),
            lease_ttl: self.lease_ttl.map(|d| d.as_secs_f64()),
            retry: self.retry.to_core(),
            default_duration: self.default_duration.as_secs_f64(),
            max_hold: Some(self.max_hold.as_secs_f64()),
            max_pending,
            overflow: self.overflow.to_core(),
            cost_per_worker_second: self
                .autoscale
                .as_ref()
                .map_or(0.0, |a| a.cost_per_worker_second),
            min: self.min_workers,
            max: self.max_workers,
            autoscale,
            fair_share: fair.is_some(),
            tenant_weights: fair.unwrap_or_default(),
            ..cronoq_core::PoolConfig::new(self.name.to_string())
        })
    }
}

/// How a nearing deadline raises a task's dispatch score (the urgency curve).
///
/// A task with a deadline has a latest start (the deadline minus its expected duration). Its
/// urgency is 0 while the latest start is more than `window` away, rises linearly to `max` at
/// the latest start, and then grows by `overdue_rate` points per second up to `overdue_cap`
/// more. For scale: the base scores of the classes are 10000, 1000, 100 and 10, and waiting adds
/// up to 800 (2 points per second).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UrgencyConfig {
    /// Urgency at the latest start.
    pub max: f64,
    /// How long before the latest start urgency begins.
    pub window: Duration,
    /// Points per second past the latest start.
    pub overdue_rate: f64,
    /// Most points being overdue adds.
    pub overdue_cap: f64,
}

impl Default for UrgencyConfig {
    /// 5000 points, from 5 s before the latest start; overdue 100 points per second, up to 3000.
    fn default() -> Self {
        UrgencyConfig {
            max: 5000.0,
            window: Duration::from_secs(5),
            overdue_rate: 100.0,
            overdue_cap: 3000.0,
        }
    }
}

impl UrgencyConfig {
    /// The engine's scoring: default class bases and aging, this urgency curve.
    pub(crate) fn to_core(self) -> Result<Scoring, String> {
        let values = [self.max, self.overdue_rate, self.overdue_cap];
        if !values.iter().all(|v| v.is_finite() && *v >= 0.0) {
            return Err("urgency values must be finite and >= 0".into());
        }
        Ok(Scoring {
            window: self.window.as_secs_f64(),
            urgency_max: self.max,
            overdue_rate: self.overdue_rate,
            overdue_cap: self.overdue_cap,
            ..Scoring::default()
        })
    }
}

/// Engine-wide settings, reached through [`Builder::configure`](crate::Builder::configure).
///
/// ```
/// use std::time::Duration;
/// use cronoq::{Scheduler, TaskError};
///
/// let builder = Scheduler::<u32, u32>::builder().configure(|c| {
///     c.retention = Duration::from_secs(600);
///     c.retention_max = 10_000;
///     c.metrics_window = Duration::from_secs(300); // snapshots' metrics of the last 5 minutes
/// });
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CoreConfig {
    /// The resources every pool's tasks may take (also added by
    /// [`Builder::resource`](crate::Builder::resource)); names unique.
    pub resources: Vec<ResourceConfig>,
    /// Queue limits across all pools: a submission beyond them waits or is refused as its
    /// pool's [`OverflowPolicy`] says (`ShedLowest` and `ShedOldest` refuse).
    pub global_bounds: Bounds,
    /// The classes' scores (also set by [`Builder::priority`](crate::Builder::priority)).
    pub priority: PriorityConfig,
    /// The deadline urgency curve (also set by [`Builder::urgency`](crate::Builder::urgency)).
    pub urgency: UrgencyConfig,
    /// How long an ended task stays known: its status, its key (for deduplication) and late
    /// handles.
    pub retention: Duration,
    /// The most ended tasks kept known.
    pub retention_max: usize,
    /// The window of a snapshot's quality metrics
    /// ([`PoolSnapshot::window`](crate::PoolSnapshot::window)): dispatches, attempts ended,
    /// retries, waits and utilization of the last this-long. Counted per whole second (a window
    /// of 2.5 s covers the current second and the two before it); more than zero and at most a
    /// day.
    pub metrics_window: Duration,
    /// The seed of the retry jitter's random numbers.
    pub seed: u64,
}

impl Default for CoreConfig {
    /// One hour and at most a million ended tasks; metrics over 60 s; the default urgency
    /// curve.
    fn default() -> Self {
        CoreConfig {
            resources: Vec::new(),
            priority: PriorityConfig::default(),
            global_bounds: Bounds::default(),
            urgency: UrgencyConfig::default(),
            retention: Duration::from_secs(3600),
            retention_max: 1_000_000,
            metrics_window: Duration::from_secs(60),
            seed: 0x5eed_c0de,
        }
    }
}

/// What the engine takes of a [`CoreConfig`]: its scoring, metrics window (seconds) and
/// resources.
pub(crate) type CoreParts = (Scoring, f64, Vec<cronoq_core::ResourceConfig>);

impl CoreConfig {
    /// The longest `metrics_window`: the engine keeps one slot of counters per second of it.
    pub(crate) const MAX_METRICS_WINDOW: Duration = Duration::from_secs(86_400);

    /// Checks these settings as [`Builder::build`](crate::Builder::build) does: finite,
    /// non-negative priority and urgency values, the metrics window, each resource's permits,
    /// rate and burst, and resource names unique. The message names the
    /// rule; `build` returns it as [`Error::Config`](crate::Error::Config). A pool's own
    /// settings are checked by `build` with the pool's name.
    ///
    /// ```
    /// use cronoq::core::CoreConfig;
    ///
    /// let mut config = CoreConfig::default();
    /// assert_eq!(config.validate(), Ok(()));
    /// config.urgency.max = f64::NAN;
    /// assert_eq!(
    ///     config.validate().unwrap_err(),
    ///     "urgency values must be finite and >= 0"
    /// );
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        self.to_core().map(drop)
    }

    /// The engine's share of these settings, or why they cannot work.
    pub(crate) fn to_core(&self) -> Result<CoreParts, String> {
        let mut scoring = self.urgency.to_core()?;
        self.priority.apply(&mut scoring)?;
        let window = self.metrics_window_secs()?;
        let resources = crate::resources::to_core(&self.resources)?;
        Ok((scoring, window, resources))
    }

    /// The metrics window in the engine's seconds, or why it cannot work.
    fn metrics_window_secs(&self) -> Result<f64, String> {
        let w = self.metrics_window;
        if w.is_zero() || w > Self::MAX_METRICS_WINDOW {
            return Err("metrics_window must be > 0 and at most one day".into());
        }
        Ok(w.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_defaults_and_translation() {
        let c = PoolConfig::new("p");
        assert_eq!(
            (c.min_workers, c.initial_workers, c.max_workers),
            (1, 1, 10)
        );
        let core = c.to_core().unwrap();
        assert_eq!((core.capacity, core.min, core.max), (1, 1, 10));
        assert_eq!(core.max_hold, Some(300.0));
        assert!(core.autoscale.is_some());
        let over = PoolConfig::new("p").workers(1, 50, 3).to_core().unwrap();
        assert_eq!(over.capacity, 3, "initial is clamped to max");
        let fixed = PoolConfig::fixed("p", 4).to_core().unwrap();
        assert_eq!((fixed.capacity, fixed.autoscale.is_none()), (4, true));
    }

    #[test]
    fn fairness_weights_are_relative_to_the_default() {
        let f = Fairness {
            weights: vec![("a".into(), 4.0)],
            default_weight: 2.0,
        };
        assert_eq!(f.to_core().unwrap(), vec![("a".to_string(), 2.0)]);
        let bad = Fairness::weights([("a", f64::NAN)]);
        assert_eq!(
            bad.to_core().unwrap_err(),
            cronoq_core::fair::WEIGHTS_MESSAGE
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let mut c = PoolConfig::new("p");
        c.autoscale.as_mut().unwrap().interval = Duration::ZERO;
        assert_eq!(c.to_core().unwrap_err(), "interval must be > 0");
        let mut c = PoolConfig::new("p");
        c.retry.max_attempts = 0;
        assert_eq!(c.to_core().unwrap_err(), "retry.max_attempts must be >= 1");
        let u = UrgencyConfig {
            max: f64::NAN,
            ..UrgencyConfig::default()
        };
        assert!(u.to_core().is_err());
        let mut core = CoreConfig::default();
        assert_eq!(core.metrics_window_secs(), Ok(60.0));
        core.metrics_window = CoreConfig::MAX_METRICS_WINDOW;
        assert_eq!(core.metrics_window_secs(), Ok(86_400.0));
        for bad in [
            Duration::ZERO,
            CoreConfig::MAX_METRICS_WINDOW + Duration::from_nanos(1),
        ] {
            core.metrics_window = bad;
            assert_eq!(
                core.metrics_window_secs().unwrap_err(),
                "metrics_window must be > 0 and at most one day"
            );
        }
    }

    #[test]
    fn backoff_caps_and_shrinks() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_secs(1),
            multiplier: 1e300,
            max_backoff: Duration::from_secs(60),
            jitter: false,
        };
        assert_eq!(p.backoff(5), Duration::from_secs(60));
        assert_eq!(RetryPolicy::none().max_attempts, 1);
    }
}
