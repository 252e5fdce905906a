//! Plain values of the core (Python: `cronoq.core.model`): statuses and the life-cycle table,
//! scoring, retry policies, pool configuration, task records, attempts and status events.
//!
//! A task's rarely used options and the engine state they need are in `Extras`, boxed on the
//! record and absent for a plain task, so the records a busy engine holds stay small. Payloads
//! and outputs are not held by the core: it never reads them, so a driver keeps them by task id.

use crate::pyrepr::py_float_repr;
pub use crate::pyrepr::py_repr;
use std::fmt;
use std::sync::Arc;

use crate::autoscale::AutoscaleSettings;
use crate::engine::TaskRef;
use crate::groups::{LabelKey, Labels, labels_of};
use crate::parking::{Parked, Wanted, amounts_of};
use crate::vocab::{DepOn, OnMiss, Overflow, STATUSES, UnknownDependency};

/// A task's id: assigned at admission, ascending from `EngineOptions::first_id`.
pub type TaskId = u64;

/// A recurring schedule as added (`recurring::Recurring`): each add or resume makes a new
/// one, even under a name in use, as each is a new object in Python.
pub type ScheduleId = u64;

/// An attempt's lease number: unique per engine, ascending from 1.
pub type Lease = u64;

/// A kind of task, interned by the engine: records name it by number, so that keeping and
/// copying one costs no reference count (`Engine::kind_name` gives the name back).
pub type KindId = u32;

/// A task's status. The numbers are the Python core's (stored rows use them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Status {
    /// Admitted, waiting for something other than a slot.
    Blocked = 0,
    /// Waiting for its fixed start.
    Scheduled = 1,
    /// Waiting for a slot.
    Ready = 2,
    /// An attempt runs.
    Running = 3,
    /// Waiting for its retry backoff to pass.
    Retrying = 4,
    /// Ended: its last attempt succeeded.
    Succeeded = 5,
    /// Ended: failed permanently.
    Failed = 6,
    /// Ended: its last allowed attempt failed.
    DeadLettered = 7,
    /// Ended: cancelled.
    Cancelled = 8,
    /// Ended: skipped (a dependency ended without meeting its edge, or an awaited key did not
    /// come in time).
    Skipped = 9,
    /// Ended: its fixed start was missed.
    Missed = 10,
    /// Ended: shed under overload.
    Shed = 11,
}

/// The first terminal status: a status at or above it is terminal.
pub const FIRST_TERMINAL: Status = Status::Succeeded;

const fn bits(list: &[Status]) -> u16 {
    let mut out = 0u16;
    let mut i = 0;
    while i < list.len() {
        out |= 1 << list[i] as u16;
        i += 1;
    }
    out
}

use Status::*;

/// The whole life cycle in one table: status -> the statuses it may move to (a bit set by status
/// number). Every status change goes through `State::move_to`, which checks it.
pub const TRANSITIONS: [u16; 12] = [
    bits(&[Scheduled, Ready, Skipped, Cancelled]),
    bits(&[Ready, Missed, Failed, Skipped, Cancelled]),
    bits(&[Running, Shed, Missed, Failed, DeadLettered, Cancelled]),
    bits(&[Succeeded, Failed, DeadLettered, Retrying, Cancelled]),
    bits(&[Ready, Cancelled]),
    0,
    0,
    0,
    0,
    0,
    0,
    0,
];

/// The status changes restore makes (Python: `model.RESTORE_TRANSITIONS`): a live task is
/// admitted again from `Blocked`, a retrying one stays retrying, a lost attempt's task may
/// retry, one that cannot resume fails; an ended one stays as it ended.
pub const RESTORE_TRANSITIONS: [u16; 12] = [
    bits(&[Blocked, Failed]),
    bits(&[Blocked, Failed]),
    bits(&[Blocked, Failed]),
    bits(&[Blocked, Retrying, Failed]),
    bits(&[Retrying, Failed]),
    bits(&[Succeeded]),
    bits(&[Failed]),
    bits(&[DeadLettered]),
    bits(&[Cancelled]),
    bits(&[Skipped]),
    bits(&[Missed]),
    bits(&[Shed]),
];

impl Status {
    /// Every status, by number.
    pub const ALL: [Status; 12] = [
        Blocked,
        Scheduled,
        Ready,
        Running,
        Retrying,
        Succeeded,
        Failed,
        DeadLettered,
        Cancelled,
        Skipped,
        Missed,
        Shed,
    ];

    /// The lower-case name every public edge uses.
    pub fn name(self) -> &'static str {
        STATUSES[self as usize]
    }

    /// Whether the task has ended.
    pub fn is_terminal(self) -> bool {
        self >= FIRST_TERMINAL
    }

    /// Whether the life-cycle table lets a task move from `self` to `new`.
    pub fn may_move_to(self, new: Status) -> bool {
        TRANSITIONS[self as usize] & (1 << new as u16) != 0
    }

    /// Whether the restore table lets a stored task move from `self` to `new`.
    pub fn may_restore_to(self, new: Status) -> bool {
        RESTORE_TRANSITIONS[self as usize] & (1 << new as u16) != 0
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A configuration the core refuses (Python raises ValueError or TypeError).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

// --- retry policy ------------------------------------------------------------------------------

/// How many attempts a task gets and how long to wait between them (full jitter).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: f64,
    multiplier: f64,
    max_backoff: f64,
    jitter: bool,
}

/// `errors.check_seconds`: a finite, non-negative number of seconds, else Python's message.
pub(crate) fn check_seconds(name: &str, v: f64) -> Result<f64, String> {
    if v.is_nan() || v < 0.0 || v.is_infinite() {
        return Err(format!(
            "{name} must be a finite, non-negative number of seconds (got {})",
            py_float_repr(v)
        ));
    }
    Ok(v)
}

impl RetryPolicy {
    /// A checked policy: at least one attempt, finite non-negative backoffs, a finite
    /// multiplier >= 1.
    pub fn new(
        max_attempts: u32,
        initial_backoff: f64,
        multiplier: f64,
        max_backoff: f64,
        jitter: bool,
    ) -> Result<Self, ConfigError> {
        if max_attempts < 1 {
            return Err(ConfigError("max_attempts must be >= 1".into()));
        }
        let initial_backoff =
            check_seconds("initial_backoff", initial_backoff).map_err(ConfigError)?;
        let max_backoff = check_seconds("max_backoff", max_backoff).map_err(ConfigError)?;
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(ConfigError(format!(
                "multiplier must be a finite number >= 1 (got {})",
                py_float_repr(multiplier)
            )));
        }
        Ok(RetryPolicy {
            max_attempts,
            initial_backoff,
            multiplier,
            max_backoff,
            jitter,
        })
    }

    /// A policy as given, without `new`'s Python checks, for a driver whose public rules differ:
    /// the Rust library takes any finite multiplier >= 0 (below 1 the waits shrink). The caller
    /// keeps `max_attempts >= 1`, the backoffs >= 0 and the multiplier finite and >= 0.
    pub fn from_parts(
        max_attempts: u32,
        initial_backoff: f64,
        multiplier: f64,
        max_backoff: f64,
        jitter: bool,
    ) -> Self {
        RetryPolicy {
            max_attempts,
            initial_backoff,
            multiplier,
            max_backoff,
            jitter,
        }
    }

    /// One attempt, no retries.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// Attempts allowed in all.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The wait before the second attempt.
    pub fn initial_backoff(&self) -> f64 {
        self.initial_backoff
    }

    /// The factor between successive waits.
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The longest wait.
    pub fn max_backoff(&self) -> f64 {
        self.max_backoff
    }

    /// Whether a wait is drawn uniformly from [0, backoff) (full jitter).
    pub fn jitter(&self) -> bool {
        self.jitter
    }

    /// The un-jittered wait before attempt `next_attempt` (>= 2). `powf` is C's `pow`, as
    /// Python's `float ** int` is, so the result is bit-identical (overflow gives inf in both).
    pub fn backoff(&self, next_attempt: u32) -> f64 {
        let exp = i64::from(next_attempt) - 2;
        let mut delay = self.initial_backoff;
        if exp > 0 && self.multiplier != 1.0 {
            delay = self.initial_backoff * self.multiplier.powf(exp as f64);
        }
        py_min(delay, self.max_backoff)
    }
}

impl Default for RetryPolicy {
    /// Three attempts, 1 s doubling up to 60 s, with jitter.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: 1.0,
            multiplier: 2.0,
            max_backoff: 60.0,
            jitter: true,
        }
    }
}

/// Python's `<` / `>` between two floats as an ordering, for heap keys (never NaN there;
/// `-0.0 == 0.0` as in Python).
pub fn py_cmp(a: f64, b: f64) -> std::cmp::Ordering {
    if a < b {
        std::cmp::Ordering::Less
    } else if a > b {
        std::cmp::Ordering::Greater
    } else {
        std::cmp::Ordering::Equal
    }
}

/// Python's `min(a, b)`: `a` unless `b < a` (ties and NaN keep the first).
pub fn py_min(a: f64, b: f64) -> f64 {
    if b < a { b } else { a }
}

/// Python's `max(a, b)`: `a` unless `b > a`.
pub fn py_max(a: f64, b: f64) -> f64 {
    if b > a { b } else { a }
}

// --- scoring -----------------------------------------------------------------------------------

/// Dispatch score = base[class] + min(aging_rate * wait, age_cap) + urgency(slack).
///
/// Urgency is 0 while the slack (latest start - now) is at least `window`, rises linearly to
/// `urgency_max` at slack 0, and past the latest start grows by `overdue_rate` per second up to
/// `overdue_cap` more. The defaults keep an overdue LOW task (10 + 800 + 5000 + 4000) below a
/// fresh CRITICAL one (10000).
///
/// `aging_rates` / `age_caps`, when set, give each class (critical first) its own aging rate /
/// cap in place of `aging_rate` / `age_cap`. Within a class every task still ages alike, which
/// keeps each class's FIFO order valid as time passes (see `queue`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scoring {
    /// Base score per class, critical first.
    pub base: [f64; 4],
    /// Score per second of waiting.
    pub aging_rate: f64,
    /// Most score waiting can add.
    pub age_cap: f64,
    /// Slack below which urgency starts.
    pub window: f64,
    /// Urgency at slack 0.
    pub urgency_max: f64,
    /// Urgency per second past the latest start.
    pub overdue_rate: f64,
    /// Most urgency being overdue adds.
    pub overdue_cap: f64,
    /// Per-class aging rates, critical first (`None`: `aging_rate` for every class).
    pub aging_rates: Option<[f64; 4]>,
    /// Per-class age caps, critical first (`None`: `age_cap` for every class).
    pub age_caps: Option<[f64; 4]>,
}

impl Scoring {
    /// Each class's (aging rate, age cap), critical first (Python's `Scoring.ages`).
    pub fn ages(&self) -> [(f64, f64); 4] {
        let rates = self.aging_rates.unwrap_or([self.aging_rate; 4]);
        let caps = self.age_caps.unwrap_or([self.age_cap; 4]);
        std::array::from_fn(|c| (rates[c], caps[c]))
    }
}

impl Default for Scoring {
    fn default() -> Self {
        Scoring {
            base: [10000.0, 1000.0, 100.0, 10.0],
            aging_rate: 2.0,
            age_cap: 800.0,
            window: 5.0,
            urgency_max: 5000.0,
            overdue_rate: 10.0,
            overdue_cap: 4000.0,
            aging_rates: None,
            age_caps: None,
        }
    }
}

// --- pool configuration ------------------------------------------------------------------------

/// What the core needs to know about a pool (resources are the engine's, worker groups are
/// declared on the engine with `set_group_capacity`).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// The pool's name, unique in an engine.
    pub name: String,
    /// Slots at start.
    pub capacity: u32,
    /// A lease's time to live without a heartbeat (None: attempts hold no lease).
    pub lease_ttl: Option<f64>,
    /// The retry policy of tasks that bring none.
    pub retry: RetryPolicy,
    /// The expected duration of a kind of task before one of them succeeded (deadlines).
    pub default_duration: f64,
    /// Most pending tasks (None: unbounded).
    pub max_pending: Option<u32>,
    /// What a submit does at `max_pending`.
    pub overflow: Overflow,
    /// The price of a slot per second (`PoolSnapshot::cost`).
    pub cost_per_worker_second: f64,
    /// The autoscaler's lowest target.
    pub min: u32,
    /// The autoscaler's highest target.
    pub max: u32,
    /// The autoscaler's settings (None: the capacity changes only when a driver sets it).
    pub autoscale: Option<AutoscaleSettings>,
    /// Tenants take turns within each class (`fair::FairClassQueue`).
    pub fair_share: bool,
    /// Tenant -> weight under fair share (a tenant not listed weighs 1.0), in insertion order.
    pub tenant_weights: Vec<(String, f64)>,
    /// What a dependency on a key no task holds does.
    pub unknown_dependency: UnknownDependency,
    /// Seconds from its submit after which a task still awaiting a key is skipped (None:
    /// forever; a negative one times out at once).
    pub await_timeout: Option<f64>,
    /// The share of `max` that fixed-start reservations may take at one instant (0 to 1; at
    /// least one reservation is always allowed).
    pub reservable_fraction: f64,
    /// Fixed starts: a slot is held at most this many seconds before the start (None: no cap).
    pub max_hold: Option<f64>,
    /// The window (seconds, finite) of the snapshot's quality metrics.
    pub metrics_window: f64,
}

impl PoolConfig {
    /// A pool with Python's defaults: 1 slot, no lease, the default retry policy.
    pub fn new(name: impl Into<String>) -> Self {
        PoolConfig {
            name: name.into(),
            capacity: 1,
            lease_ttl: None,
            retry: RetryPolicy::default(),
            default_duration: 1.0,
            max_pending: None,
            overflow: Overflow::Wait,
            cost_per_worker_second: 0.0,
            min: 1,
            max: 10,
            autoscale: None,
            fair_share: false,
            tenant_weights: Vec::new(),
            unknown_dependency: UnknownDependency::Reject,
            await_timeout: None,
            reservable_fraction: 0.5,
            max_hold: None,
            metrics_window: 60.0,
        }
    }
}

// --- tasks and attempts ------------------------------------------------------------------------

/// How many ended attempts of a retried task its record keeps (`Extras::history`).
pub const HISTORY_MAX: usize = 20;

/// How an attempt ended (`PastAttempt::outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Its executor or worker reported a failure.
    Failed,
    /// It ran past the task's timeout.
    TimedOut,
    /// Its worker stopped heartbeating.
    LeaseExpired,
}

impl Outcome {
    /// The Python name of the outcome.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::LeaseExpired => "lease_expired",
        }
    }
}

/// How an attempt ended, as an observer is told (Python's `ATTEMPT_OUTCOMES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// Its executor succeeded.
    Succeeded,
    /// Its executor or worker reported a failure.
    Failed,
    /// It ran past the task's timeout.
    TimedOut,
    /// Its worker stopped heartbeating.
    LeaseExpired,
    /// Its task was cancelled while it ran.
    Cancelled,
    /// The driver shut down with it still running.
    Abandoned,
}

impl AttemptOutcome {
    /// How an ended attempt ended: its abort's reason, else whether its executor succeeded
    /// (Python's `state.attempt_outcome`).
    pub fn of(att: &Attempt, success: bool) -> Self {
        match att.abort_reason {
            Some(AbortReason::Timeout) => AttemptOutcome::TimedOut,
            Some(AbortReason::Lease) => AttemptOutcome::LeaseExpired,
            Some(AbortReason::Cancelled) => AttemptOutcome::Cancelled,
            Some(AbortReason::Shutdown) => AttemptOutcome::Abandoned,
            None if success => AttemptOutcome::Succeeded,
            None => AttemptOutcome::Failed,
        }
    }

    /// The Python name of the outcome.
    pub fn name(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::TimedOut => "timed_out",
            AttemptOutcome::LeaseExpired => "lease_expired",
            AttemptOutcome::Cancelled => "cancelled",
            AttemptOutcome::Abandoned => "abandoned",
        }
    }
}

/// What a driver may watch of attempts as they start and end (`Engine::observe`; Python's
/// `model.Observer`, the server's histograms): called inside the engine call that starts or
/// ends the attempt, so it must be quick. Times are seconds.
pub trait Observer: Send {
    /// The attempt started after waiting `wait` = its start - `TaskRecord::ready_at`, the
    /// instant its task last became ready: its wait for a slot, not for its dependencies, its
    /// start time or a backoff.
    fn started(&mut self, att: &Attempt, wait: f64);

    /// The attempt ended with `outcome` after `runtime` = its end - `Attempt::started_at`.
    fn ended(&mut self, att: &Attempt, outcome: AttemptOutcome, runtime: f64);
}

/// An attempt that ended without ending its task (the task retried); times in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct PastAttempt {
    /// The attempt's number (1 = first).
    pub number: u32,
    /// When it started.
    pub started_at: f64,
    /// When it ended.
    pub ended_at: f64,
    /// How it ended.
    pub outcome: Outcome,
    /// The failure's message.
    pub message: String,
}

/// What a task is: the options of a submit that the core uses. Build one with
/// `TaskSpec::new(pool)` and set the fields that differ. It borrows its names: a submit copies
/// only what the record keeps (kinds are shared, a key is copied once).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaskSpec<'a> {
    /// The pool that runs it.
    pub pool: &'a str,
    /// Its priority class, 0 (critical) to 3 (low).
    pub cls: u8,
    /// Its kind: tasks of one kind share a learned expected duration.
    pub kind: &'a str,
    /// A deduplication key: a live or retained task with the same key is returned instead.
    pub key: Option<&'a str>,
    /// When it should be done (seconds): its latest start is the deadline minus its expected
    /// duration, and urgency rises as that nears.
    pub deadline: Option<f64>,
    /// Its expected duration, instead of the learned one.
    pub duration_hint: Option<f64>,
    /// Abort an attempt that runs longer than this (seconds).
    pub timeout: Option<f64>,
    /// Its own retry policy (None: the pool's).
    pub retry: Option<RetryPolicy>,
    /// Its tenant, for fair share (None: the untenanted group).
    pub tenant: Option<&'a str>,
    /// Amounts of the engine's resources it takes while it runs, by name (empty: none). A
    /// name given twice keeps its last amount, as in a Python dict.
    pub resources: &'a [(&'a str, u32)],
    /// Labels a worker group must carry to run it (None or empty, which Python's edge makes
    /// None: any slot). A name given twice keeps its last value.
    pub labels: Option<&'a [(&'a str, &'a str)]>,
    /// A fixed start (seconds): it reserves a slot at admission and starts then; with
    /// dependencies it waits for them first (and is late, or missed, if they end after it).
    pub start_at: Option<f64>,
    /// How late the fixed start may be (seconds) before `on_miss` applies.
    pub tolerance: f64,
    /// What a fixed start not made within its tolerance does.
    pub on_miss: OnMiss,
    /// The tasks it waits for, by id or key, each with the way it must end (none: it may run
    /// at once). A key may name a task of the same batch, or, if the pool awaits unknown
    /// keys, one not submitted yet.
    pub deps: &'a [(TaskRef<'a>, DepOn)],
}

impl<'a> TaskSpec<'a> {
    /// A normal-class task of kind "default" in `pool`, with no other options.
    pub fn new(pool: &'a str) -> Self {
        TaskSpec {
            pool,
            cls: 2,
            kind: "default",
            key: None,
            deadline: None,
            duration_hint: None,
            timeout: None,
            retry: None,
            tenant: None,
            resources: &[],
            labels: None,
            start_at: None,
            tolerance: 1.0,
            on_miss: OnMiss::RunLate,
            deps: &[],
        }
    }
}

/// One task: its spec (fixed at submit) and its engine state.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord {
    /// Its id.
    pub id: TaskId,
    /// Its admission order (queue ties are broken by it).
    pub seq: u64,
    /// Its pool's index in the engine's configuration order (`Engine::pools`); past them, a
    /// pool no longer configured that restore met (`Engine::pool_name`).
    pub pool: usize,
    /// Its priority class.
    pub cls: u8,
    /// Its kind, interned (`Engine::kind_name`).
    pub kind: KindId,
    /// Its key, while it holds it.
    pub key: Option<Arc<str>>,
    /// Its deadline.
    pub deadline: Option<f64>,
    /// Its expected duration as given.
    pub duration_hint: Option<f64>,
    /// Its attempt timeout.
    pub timeout: Option<f64>,
    /// Its own retry policy.
    pub retry: Option<RetryPolicy>,
    /// Its tenant (fair share).
    pub tenant: Option<Arc<str>>,
    /// The labels a worker group must carry to run it (never empty).
    pub labels: Option<Labels>,
    /// Its status.
    pub status: Status,
    /// The number of its latest attempt (0: none yet).
    pub attempt: u32,
    /// The message of its latest failure or its end.
    pub message: Option<Arc<str>>,
    /// When it was admitted.
    pub submitted_at: f64,
    /// When it first became eligible to run: its place in its queue (aging counts from here).
    pub eligible_at: f64,
    /// When it last became ready (or, retrying, when it will be).
    pub ready_at: f64,
    /// When its latest attempt started (0: never).
    pub started_at: f64,
    /// Deadline minus expected duration, set when it becomes ready with a deadline.
    pub latest_start: Option<f64>,
    /// When it ended (0: live).
    pub finished_at: f64,
    /// The lease of its running attempt.
    pub running: Option<Lease>,
    /// Its queue generation: a queue entry is live while it matches.
    pub qgen: u64,
    /// What it waits for outside the ready queues, ready: a resource or a group slot.
    pub parked: Option<Parked>,
    /// Its rarely used options and their state (None: a plain task that never retried).
    pub extra: Option<Box<Extras>>,
}

/// A task's rarely used options and the engine state they need (Python: `model.Extras`): the
/// spec as submitted (fixed start, dependencies, resources), then engine state set and cleared by the
/// dependency, fixed-start and recurring code, and the attempt history of a task that retried.
/// Python's `None` and empty lists are alike here (empty), but for `resolved`, whose presence
/// decides how a task is admitted and what the await-cycle check walks.
#[derive(Clone, Debug, PartialEq)]
pub struct Extras {
    /// A fixed start (seconds), with `tolerance` and `on_miss`.
    pub start_at: Option<f64>,
    /// How late the fixed start may be (seconds).
    pub tolerance: f64,
    /// What a fixed start not made within its tolerance does.
    pub on_miss: OnMiss,
    /// Its dependency edges as submitted: (parent id or key, condition).
    pub deps: Vec<(DepTarget, DepOn)>,
    /// The edges resolved at admission; kept while it is blocked only as long as some task
    /// awaits a key (the await-cycle check walks them), cleared when it is released or ends.
    pub resolved: Option<Vec<(Resolved, DepOn)>>,
    /// Unmet edges of a blocked task.
    pub waiting: u32,
    /// Keys it awaits (`UnknownDependency::Await`), each once.
    pub awaits: Vec<Arc<str>>,
    /// Parents that took an awaited key since it was admitted.
    pub parents: Vec<TaskId>,
    /// Dependents waiting on it, with their edges' conditions, in the order they came.
    pub children: Vec<(TaskId, DepOn)>,
    /// A slot of its pool is held for its fixed start.
    pub held: bool,
    /// Its fixed start came: it waits ahead of the ready queues.
    pub due: bool,
    /// Its reservation and held slot are gone (it started or ended).
    pub fixed_done: bool,
    /// The schedule whose earlier occurrences its start checks (overlap skip).
    pub recurring: Option<ScheduleId>,
    /// The name of the schedule it is an occurrence of (Python: its `cronoq.recurring` tag,
    /// the one tag the core reads).
    pub schedule: Option<Arc<str>>,
    /// The attempts after which it retried, oldest first (at most HISTORY_MAX).
    pub history: Vec<PastAttempt>,
    /// Resource name -> amount, as submitted (empty: none).
    pub resources: Vec<(Arc<str>, u32)>,
    /// The same resources checked at admission (`parking::Parking::resolve`).
    pub wanted: Option<Wanted>,
}

/// A dependency's target as submitted (`TaskRef`, owned).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DepTarget {
    /// A task id.
    Id(TaskId),
    /// A key.
    Key(Arc<str>),
}

/// An edge resolved at admission: its parent task, or the key it awaits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// A task admitted before it (or earlier in its batch).
    Parent(TaskId),
    /// A key no task held at its submit.
    Awaited(Arc<str>),
}

impl Default for Extras {
    /// Python's `Extras()`: no fixed start (tolerance 1 s, run late), no dependencies, no state.
    fn default() -> Self {
        Extras {
            start_at: None,
            tolerance: 1.0,
            on_miss: OnMiss::RunLate,
            deps: Vec::new(),
            resolved: None,
            waiting: 0,
            awaits: Vec::new(),
            parents: Vec::new(),
            children: Vec::new(),
            held: false,
            due: false,
            fixed_done: false,
            recurring: None,
            schedule: None,
            history: Vec::new(),
            resources: Vec::new(),
            wanted: None,
        }
    }
}

impl TaskRecord {
    /// The attempts after which it retried, oldest first.
    pub fn history(&self) -> &[PastAttempt] {
        self.extra.as_ref().map_or(&[], |e| &e.history)
    }

    /// Its extras, made when it needs its first one.
    pub(crate) fn extra_mut(&mut self) -> &mut Extras {
        self.extra.get_or_insert_default()
    }

    /// The record of a spec about to be admitted (id 0 until then), unchecked: a driver also
    /// builds the records of a store's tasks with it, for `Engine::restore`.
    #[inline]
    pub fn from_spec(spec: TaskSpec<'_>, pool: usize, kind: KindId) -> Self {
        TaskRecord {
            id: 0,
            seq: 0,
            pool,
            cls: spec.cls,
            kind,
            key: spec.key.map(Arc::from),
            deadline: spec.deadline,
            duration_hint: spec.duration_hint,
            timeout: spec.timeout,
            retry: spec.retry,
            tenant: spec.tenant.map(Arc::from),
            labels: spec
                .labels
                .filter(|l| !l.is_empty())
                .map(|l| labels_of(l).into()),
            status: Status::Blocked,
            attempt: 0,
            message: None,
            submitted_at: 0.0,
            eligible_at: 0.0,
            ready_at: 0.0,
            started_at: 0.0,
            latest_start: None,
            finished_at: 0.0,
            running: None,
            qgen: 0,
            parked: None,
            extra: (spec.start_at.is_some() || !spec.deps.is_empty() || !spec.resources.is_empty())
                .then(|| {
                    let deps = spec.deps.iter().map(|&(target, on)| {
                        let target = match target {
                            TaskRef::Id(id) => DepTarget::Id(id),
                            TaskRef::Key(key) => DepTarget::Key(Arc::from(key)),
                        };
                        (target, on)
                    });
                    Box::new(Extras {
                        start_at: spec.start_at,
                        tolerance: spec.tolerance,
                        on_miss: spec.on_miss,
                        deps: deps.collect(),
                        resources: amounts_of(spec.resources),
                        ..Extras::default()
                    })
                }),
        }
    }

    /// Its fixed start, if it has one.
    pub fn start_at(&self) -> Option<f64> {
        self.extra.as_ref().and_then(|e| e.start_at)
    }
}

/// Why the engine gave up on an attempt (`Attempt::abort_reason`), in the words Python hands to
/// its drivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// It ran past its task's timeout.
    Timeout,
    /// Its lease expired without a heartbeat.
    Lease,
    /// Its task was cancelled.
    Cancelled,
    /// The driver shuts down (`Engine::abort_running`).
    Shutdown,
}

impl AbortReason {
    /// Python's message for the reason (also the failure message of a timeout or lease loss).
    pub fn message(self) -> &'static str {
        match self {
            AbortReason::Timeout => "attempt timed out",
            AbortReason::Lease => "lease expired",
            AbortReason::Cancelled => "cancelled",
            AbortReason::Shutdown => "scheduler shut down",
        }
    }
}

/// One dispatch of a task to a slot. The engine keeps running attempts by lease; the copies
/// in `Actions` are the attempt as it was when started or aborted.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    /// The task it runs.
    pub task: TaskId,
    /// Its number (1 = first).
    pub number: u32,
    /// Its lease: the handle outcomes and heartbeats name it by.
    pub lease: Lease,
    /// When it started.
    pub started_at: f64,
    /// Its pool's lease time to live, if any.
    pub lease_ttl: Option<f64>,
    /// When its lease runs out (inf without a lease).
    pub lease_expiry: f64,
    /// Why the engine aborted it, if it did.
    pub abort_reason: Option<AbortReason>,
    /// The labels of the worker group whose slot runs it (None: an unlabeled slot).
    pub slot: Option<LabelKey>,
}

impl Attempt {
    #[inline]
    pub(crate) fn new(
        task: TaskId,
        number: u32,
        lease: Lease,
        started_at: f64,
        lease_ttl: Option<f64>,
    ) -> Self {
        Attempt {
            task,
            number,
            lease,
            started_at,
            lease_ttl,
            lease_expiry: lease_ttl.map_or(f64::INFINITY, |ttl| started_at + ttl),
            abort_reason: None,
            slot: None,
        }
    }
}

/// One status change of one task; `at` is seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusEvent {
    /// The task.
    pub id: TaskId,
    /// Its pool's name.
    pub pool: Arc<str>,
    /// Its key.
    pub key: Option<Arc<str>>,
    /// The status it moved to.
    pub status: Status,
    /// Its attempt number then.
    pub attempt: u32,
    /// When.
    pub at: f64,
    /// The message of the change.
    pub message: Option<Arc<str>>,
}

/// One pool now, plus quality metrics over the last `window` seconds (Python's
/// `PoolSnapshot`).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSnapshot {
    /// The pool's name.
    pub name: Arc<str>,
    /// Its slots.
    pub capacity: i64,
    /// Attempts running.
    pub busy: i64,
    /// Slots held for fixed starts and free (at most the free slots).
    pub held: i64,
    /// The target capacity: the autoscaler's last one, or the capacity without it.
    pub desired: i64,
    /// Tasks admitted and not running or ended.
    pub pending: i64,
    /// The same per class.
    pub pending_by_class: [i64; 4],
    /// Tasks in its ready queues.
    pub ready: i64,
    /// Fixed starts admitted and not started or ended.
    pub reservations: usize,
    /// The metrics' window (seconds).
    pub window: f64,
    /// Attempts started in the window.
    pub dispatched: u64,
    /// Attempts succeeded in the window.
    pub succeeded: u64,
    /// Attempts failed in the window.
    pub failed: u64,
    /// Retries in the window.
    pub retried: u64,
    /// Share of dispatches that took from the most important non-empty class.
    pub priority_adherence: f64,
    /// Share of fixed starts that started within their tolerance.
    pub fixed_start_hit_rate: f64,
    /// Busy slot-seconds over capacity slot-seconds.
    pub utilization: f64,
    /// Slot-seconds of successful attempts over capacity slot-seconds.
    pub schedule_efficiency: f64,
    /// Mean wait for a slot.
    pub wait_mean: f64,
    /// Median wait for a slot.
    pub wait_p50: f64,
    /// 90th percentile of the wait.
    pub wait_p90: f64,
    /// 99th percentile of the wait.
    pub wait_p99: f64,
    /// Median runtime.
    pub run_p50: f64,
    /// 99th percentile of the runtime.
    pub run_p99: f64,
    /// Capacity integrated over time since the start.
    pub worker_seconds: f64,
    /// `worker_seconds` times the pool's price per slot-second.
    pub cost: f64,
    /// Paused by an operator.
    pub paused: bool,
    /// Tasks wait and the pool has no capacity at all to run them.
    pub unserved: bool,
}

/// The ready tasks of one pool per class and its retry and dead-letter counts, for a metrics
/// scrape (`Engine::ready_view`; Python's `ReadyView`).
#[derive(Clone, Debug, PartialEq)]
pub struct ReadyView {
    /// The pool's name.
    pub pool: Arc<str>,
    /// Tasks ready and waiting for a slot wherever they wait (the ready queue, a short
    /// resource, a worker-group slot, a held slot of their fixed start), per class.
    pub ready_by_class: [i64; 4],
    /// The `ready_at` of the task first in line of each class (its queue's head, or a due
    /// fixed start); tasks parked on a resource or a group slot are not looked at.
    pub oldest_ready_at: [Option<f64>; 4],
    /// Retries of its tasks, counted as `Totals::retries` is.
    pub retries: u64,
    /// Its tasks dead-lettered.
    pub dead_lettered: u64,
}

/// The whole engine now (Python's `Snapshot`).
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Each pool, in configuration order.
    pub pools: Vec<PoolSnapshot>,
    /// Tasks not ended.
    pub live_tasks: u64,
    /// Attempts running.
    pub running: usize,
    /// Tasks pending in every pool.
    pub pending: i64,
    /// The counters.
    pub totals: Totals,
}

/// Counters of what happened, in Python's `TOTALS_KEYS` order (`Totals::iter`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Tasks cancelled.
    pub cancelled: u64,
    /// Tasks dead-lettered.
    pub dead_lettered: u64,
    /// Attempts started.
    pub dispatched: u64,
    /// Tasks failed.
    pub failed: u64,
    /// Attempts whose lease expired.
    pub lease_expiries: u64,
    /// Fixed starts missed.
    pub missed: u64,
    /// Recurring occurrences not created: refused at submit (a reservation conflict, a full
    /// pool).
    pub recurring_conflicts: u64,
    /// Invalid recurring occurrences (no rule of the core counts it: always 0, as in Python).
    pub recurring_invalid: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Tasks shed under overload.
    pub shed: u64,
    /// Tasks skipped.
    pub skipped: u64,
    /// Outcomes reported for attempts that had ended.
    pub stale_completions: u64,
    /// Tasks admitted.
    pub submitted: u64,
    /// Tasks succeeded.
    pub succeeded: u64,
    /// Attempts timed out.
    pub timeouts: u64,
}

impl Totals {
    /// Every counter with its Python name, in Python's order.
    pub fn iter(&self) -> [(&'static str, u64); 15] {
        [
            ("cancelled", self.cancelled),
            ("dead_lettered", self.dead_lettered),
            ("dispatched", self.dispatched),
            ("failed", self.failed),
            ("lease_expiries", self.lease_expiries),
            ("missed", self.missed),
            ("recurring_conflicts", self.recurring_conflicts),
            ("recurring_invalid", self.recurring_invalid),
            ("retries", self.retries),
            ("shed", self.shed),
            ("skipped", self.skipped),
            ("stale_completions", self.stale_completions),
            ("submitted", self.submitted),
            ("succeeded", self.succeeded),
            ("timeouts", self.timeouts),
        ]
    }

    /// The counter of tasks that ended with `status`.
    #[inline]
    pub(crate) fn ended(&mut self, status: Status) {
        let n = match status {
            Succeeded => &mut self.succeeded,
            Failed => &mut self.failed,
            DeadLettered => &mut self.dead_lettered,
            Cancelled => &mut self.cancelled,
            Skipped => &mut self.skipped,
            Missed => &mut self.missed,
            Shed => &mut self.shed,
            Blocked | Scheduled | Ready | Running | Retrying => {
                unreachable!("{status} is not terminal")
            }
        };
        *n += 1;
    }
}

/// A submission the engine refused; `code` says why (Python's `SubmitError.code`), `message`
/// is Python's message, word for word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmitError {
    /// Why: "unknown_pool", "full", "overloaded", "duplicate_key_in_batch",
    /// "reservation_conflict", "invalid", "unknown_dependency", "cycle", "unknown_resource" or
    /// "resource_exceeds_capacity".
    pub code: &'static str,
    /// For people.
    pub message: String,
}

impl SubmitError {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        SubmitError {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SubmitError {}

/// A call named a pool the engine does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPool(pub String);

impl fmt::Display for UnknownPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown pool {}", py_repr(&self.0))
    }
}

impl std::error::Error for UnknownPool {}
