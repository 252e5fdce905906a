//! Tasks: the [`Task`] builder that programs submit, the engine-level [`TaskSpec`] it wraps,
//! and the checks every task passes before the engine sees it.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use smallvec::SmallVec;

use crate::config::RetryPolicy;
use crate::deps::Dep;
use crate::error::SubmitError;
use crate::fixed::{DEFAULT_TOLERANCE, FixedStart, MissPolicy};
use crate::time::{Clock, Time};
use crate::types::{Priority, TaskRef};

/// A point in time given relative to the submission or as wall-clock time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// This long after the task is submitted.
    In(Duration),
    /// At this wall-clock time.
    At(SystemTime),
}

/// A task as the engine takes it: every option, with absolute times. Most programs build a
/// [`Task`] instead, which also takes relative times.
#[derive(Debug)]
pub struct TaskSpec<P> {
    /// The payload handed to the executor.
    pub payload: Arc<P>,
    /// The kind: tasks of one kind share a learned expected duration.
    pub kind: Arc<str>,
    /// The pool that runs it.
    pub pool: Arc<str>,
    /// The priority class.
    pub priority: Priority,
    /// The deduplication key: while a task with this key is live or retained, submitting
    /// another returns that task.
    pub key: Option<Arc<str>>,
    /// The soft deadline: as it nears (less the expected duration) the task's urgency rises.
    pub deadline: Option<Time>,
    /// A fixed start: the task starts at this time, on a slot reserved for it.
    pub fixed_start: Option<FixedStart>,
    /// The expected duration, instead of the learned one.
    pub duration_hint: Option<Duration>,
    /// The most one attempt may run; then it is given up and retried.
    pub timeout: Option<Duration>,
    /// The retry policy (`None`: the pool's).
    pub retry: Option<RetryPolicy>,
    /// The tasks it waits for, each with the way it must end.
    pub deps: Vec<Dep>,
    /// Amounts of the scheduler's resources each attempt takes, by name.
    pub resources: SmallVec<[(Arc<str>, u32); 2]>,
    /// Tags, in order; a key may repeat.
    pub tags: Vec<(Arc<str>, Arc<str>)>,
    /// Labels a worker group must carry to run it (empty: any slot).
    pub labels: Vec<(Arc<str>, Arc<str>)>,
    /// The tenant, for pools with fair sharing.
    pub tenant: Option<Arc<str>>,
}

impl<P> Clone for TaskSpec<P> {
    /// A copy sharing the payload.
    fn clone(&self) -> Self {
        TaskSpec {
            payload: self.payload.clone(),
            kind: self.kind.clone(),
            pool: self.pool.clone(),
            priority: self.priority,
            key: self.key.clone(),
            deadline: self.deadline,
            fixed_start: self.fixed_start,
            duration_hint: self.duration_hint,
            timeout: self.timeout,
            retry: self.retry,
            deps: self.deps.clone(),
            resources: self.resources.clone(),
            tags: self.tags.clone(),
            labels: self.labels.clone(),
            tenant: self.tenant.clone(),
        }
    }
}

/// `"default"`, the kind and pool of most tasks: one shared string, so that a new task does not
/// allocate its own.
fn default_name() -> Arc<str> {
    DEFAULT_NAME.get_or_init(|| Arc::from("default")).clone()
}

static DEFAULT_NAME: OnceLock<Arc<str>> = OnceLock::new();

/// Whether a name is the shared `"default"`, which needs no check for NUL characters.
fn is_default(name: &Arc<str>) -> bool {
    DEFAULT_NAME.get().is_some_and(|d| Arc::ptr_eq(d, name))
}

impl<P> TaskSpec<P> {
    /// A task of kind `"default"` for the pool `"default"`, priority `Normal`.
    pub fn new(payload: P) -> Self {
        TaskSpec::from_arc(Arc::new(payload))
    }

    /// [`TaskSpec::new`] with a shared payload.
    pub fn from_arc(payload: Arc<P>) -> Self {
        TaskSpec {
            payload,
            kind: default_name(),
            pool: default_name(),
            priority: Priority::Normal,
            key: None,
            deadline: None,
            fixed_start: None,
            duration_hint: None,
            timeout: None,
            retry: None,
            deps: Vec::new(),
            resources: SmallVec::new(),
            tags: Vec::new(),
            labels: Vec::new(),
            tenant: None,
        }
    }

    /// The same task with another payload.
    pub fn map_payload<Q>(self, payload: Arc<Q>) -> TaskSpec<Q> {
        TaskSpec {
            payload,
            kind: self.kind,
            pool: self.pool,
            priority: self.priority,
            key: self.key,
            deadline: self.deadline,
            fixed_start: self.fixed_start,
            duration_hint: self.duration_hint,
            timeout: self.timeout,
            retry: self.retry,
            deps: self.deps,
            resources: self.resources,
            tags: self.tags,
            labels: self.labels,
            tenant: self.tenant,
        }
    }

    /// Sets the kind.
    pub fn kind(mut self, kind: impl Into<Arc<str>>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Sets the pool.
    pub fn pool(mut self, pool: impl Into<Arc<str>>) -> Self {
        self.pool = pool.into();
        self
    }

    /// Sets the priority class.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the deduplication key.
    pub fn key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the deadline.
    pub fn deadline(mut self, at: Time) -> Self {
        self.deadline = Some(at);
        self
    }

    /// Sets the fixed start.
    pub fn fixed_start(mut self, start: FixedStart) -> Self {
        self.fixed_start = Some(start);
        self
    }

    /// Sets the expected duration.
    pub fn duration_hint(mut self, d: Duration) -> Self {
        self.duration_hint = Some(d);
        self
    }

    /// Sets the per-attempt timeout.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Sets the retry policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Adds a dependency.
    pub fn dep(mut self, dep: Dep) -> Self {
        self.deps.push(dep);
        self
    }

    /// Adds a dependency on `target`'s success.
    pub fn after(self, target: impl Into<TaskRef>) -> Self {
        self.dep(Dep::on_success(target))
    }

    /// Adds a resource amount.
    pub fn resource(mut self, name: impl Into<Arc<str>>, amount: u32) -> Self {
        self.resources.push((name.into(), amount));
        self
    }

    /// Adds a required worker-group label.
    pub fn label(mut self, name: impl Into<Arc<str>>, value: impl Into<Arc<str>>) -> Self {
        self.labels.push((name.into(), value.into()));
        self
    }

    /// Adds a tag.
    pub fn tag(mut self, key: impl Into<Arc<str>>, value: impl Into<Arc<str>>) -> Self {
        self.tags.push((key.into(), value.into()));
        self
    }

    /// Sets the tenant.
    pub fn tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The checks the library makes before the engine sees a task (the engine checks the rest:
    /// the pool, the bounds).
    pub(crate) fn check(&self) -> Result<(), SubmitError> {
        let nul = |s: &str| s.contains('\0');
        let name = |s: &Arc<str>| !is_default(s) && nul(s);
        let names = [Some(&self.kind), Some(&self.pool), self.key.as_ref()];
        if names.into_iter().flatten().any(name) || self.tenant.as_deref().is_some_and(nul) {
            return Err(SubmitError::Invalid(
                "kind, pool, key and tenant must not contain NUL characters",
            ));
        }
        if self.tags.iter().any(|(k, v)| nul(k) || nul(v)) {
            return Err(SubmitError::Invalid("tags must not contain NUL characters"));
        }
        if self.labels.iter().any(|(k, v)| nul(k) || nul(v)) {
            return Err(SubmitError::Invalid(
                "labels must not contain NUL characters",
            ));
        }
        if self.resources.iter().any(|(n, _)| nul(n)) {
            return Err(SubmitError::Invalid(
                "resource names must not contain NUL characters",
            ));
        }
        let dep_key = |d: &Dep| matches!(&d.target, TaskRef::Key(k) if nul(k));
        if self.deps.iter().any(dep_key) {
            return Err(SubmitError::Invalid(
                "dependency keys must not contain NUL characters",
            ));
        }
        match self.retry.and_then(|r| r.problem()) {
            Some(problem) => Err(SubmitError::Invalid(problem)),
            None => Ok(()),
        }
    }
}

/// A task to submit: a payload and its options, each set by a method that takes and returns
/// the task.
///
/// ```
/// use std::time::Duration;
/// use cronoq::{Priority, RetryPolicy, Task};
///
/// let task = Task::new("report-42".to_string())
///     .pool("reports")
///     .kind("render")
///     .key("report-42")
///     .priority(Priority::High)
///     .deadline_in(Duration::from_secs(60))
///     .timeout(Duration::from_secs(10))
///     .retry(RetryPolicy { max_attempts: 5, ..RetryPolicy::default() })
///     .tag("customer", "acme");
/// assert_eq!(&*task.spec().pool, "reports");
/// ```
///
/// Relative times (`*_in`) count from the submission; with both `deadline_in` and
/// `deadline_at`, the last call wins.
pub struct Task<P> {
    spec: TaskSpec<P>,
    deadline: Option<When>,
    start: Option<When>,
    tolerance: Option<Duration>,
    on_miss: Option<MissPolicy>,
}

impl<P> Clone for Task<P> {
    /// A copy sharing the payload.
    fn clone(&self) -> Self {
        Task {
            spec: self.spec.clone(),
            deadline: self.deadline,
            start: self.start,
            tolerance: self.tolerance,
            on_miss: self.on_miss,
        }
    }
}

impl<P: fmt::Debug> fmt::Debug for Task<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("spec", &self.spec)
            .field("deadline", &self.deadline)
            .field("start", &self.start)
            .field("tolerance", &self.tolerance)
            .field("on_miss", &self.on_miss)
            .finish()
    }
}

impl<P> From<TaskSpec<P>> for Task<P> {
    fn from(spec: TaskSpec<P>) -> Self {
        Task {
            spec,
            deadline: None,
            start: None,
            tolerance: None,
            on_miss: None,
        }
    }
}

impl<P> Task<P> {
    /// A task of kind `"default"` for the pool named `"default"`, priority `Normal`.
    pub fn new(payload: P) -> Self {
        TaskSpec::new(payload).into()
    }

    /// [`Task::new`] with a shared payload.
    pub fn from_arc(payload: Arc<P>) -> Self {
        TaskSpec::from_arc(payload).into()
    }

    /// Sets the kind (default `"default"`): tasks of one kind share a learned expected
    /// duration.
    pub fn kind(self, kind: impl Into<Arc<str>>) -> Self {
        self.with(|s| s.kind(kind))
    }

    /// Sets the pool (default: the pool named `"default"`).
    pub fn pool(self, pool: impl Into<Arc<str>>) -> Self {
        self.with(|s| s.pool(pool))
    }

    /// Sets the priority class (default `Normal`).
    pub fn priority(self, priority: Priority) -> Self {
        self.with(|s| s.priority(priority))
    }

    /// Sets the deduplication key: while a task with this key is live or retained, submitting
    /// another returns a handle to that task instead.
    pub fn key(self, key: impl Into<Arc<str>>) -> Self {
        self.with(|s| s.key(key))
    }

    /// A soft deadline this long after the submission.
    pub fn deadline_in(mut self, d: Duration) -> Self {
        self.deadline = Some(When::In(d));
        self.spec.deadline = None;
        self
    }

    /// A soft deadline at this wall-clock time.
    pub fn deadline_at(mut self, at: SystemTime) -> Self {
        self.deadline = Some(When::At(at));
        self.spec.deadline = Some(Clock::from_system(at));
        self
    }

    /// A fixed start this long after the submission (see [`Task::start_at`]).
    pub fn start_in(mut self, d: Duration) -> Self {
        self.start = Some(When::In(d));
        self.spec.fixed_start = None;
        self
    }

    /// A fixed start at this wall-clock time: the task reserves a slot at admission (refused
    /// with [`SubmitError::ReservationConflict`] when the pool's reservations are taken), waits
    /// [`Scheduled`](crate::TaskStatus::Scheduled) and starts then, ahead of queued tasks. With
    /// both `start_in` and `start_at`, the last call wins.
    pub fn start_at(mut self, at: SystemTime) -> Self {
        self.start = Some(When::At(at));
        self.spec.fixed_start = Some(self.fixed(Clock::from_system(at)));
        self
    }

    /// How late a fixed start may be before [`Task::on_miss`] applies (default 1 s; ignored
    /// without a fixed start).
    pub fn start_tolerance(mut self, d: Duration) -> Self {
        self.tolerance = Some(d);
        if let Some(f) = &mut self.spec.fixed_start {
            f.tolerance = d;
        }
        self
    }

    /// What a fixed start later than its tolerance does (default
    /// [`MissPolicy::RunLate`]; ignored without a fixed start).
    pub fn on_miss(mut self, policy: MissPolicy) -> Self {
        self.on_miss = Some(policy);
        if let Some(f) = &mut self.spec.fixed_start {
            f.on_miss = policy;
        }
        self
    }

    /// The expected duration, instead of the one learned from this kind's earlier runs.
    pub fn duration_hint(self, d: Duration) -> Self {
        self.with(|s| s.duration_hint(d))
    }

    /// The most one attempt may run; then the attempt is given up (its executor aborted) and
    /// the task retried. `Duration::ZERO` times out at once.
    pub fn timeout(self, d: Duration) -> Self {
        self.with(|s| s.timeout(d))
    }

    /// The retry policy (default: the pool's).
    pub fn retry(self, policy: RetryPolicy) -> Self {
        self.with(|s| s.retry(policy))
    }

    /// One attempt only.
    pub fn no_retry(self) -> Self {
        self.retry(RetryPolicy::none())
    }

    /// Adds a tag; tags keep their order and a key may repeat.
    pub fn tag(self, key: impl Into<Arc<str>>, value: impl Into<Arc<str>>) -> Self {
        self.with(|s| s.tag(key, value))
    }

    /// Sets the tenant, for pools with fair sharing.
    pub fn tenant(self, tenant: impl Into<Arc<str>>) -> Self {
        self.with(|s| s.tenant(tenant))
    }

    /// Waits for `target` (an id or a key) to succeed: the task is
    /// [`Blocked`](crate::TaskStatus::Blocked) until then, and ends
    /// [`Skipped`](crate::TaskStatus::Skipped) if `target` ends otherwise. Repeatable; in
    /// [`Scheduler::submit_batch`](crate::Scheduler::submit_batch) a key may name a later task
    /// of the batch.
    pub fn after(self, target: impl Into<TaskRef>) -> Self {
        self.with(|s| s.after(target))
    }

    /// Adds a dependency with its own condition ([`Dep::on_complete`], [`Dep::on_failure`]).
    pub fn dep(self, dep: Dep) -> Self {
        self.with(|s| s.dep(dep))
    }

    /// Each attempt takes `amount` (> 0) of the named resource: the task waits until it is
    /// available. Repeatable.
    pub fn resource(self, name: impl Into<Arc<str>>, amount: u32) -> Self {
        self.with(|s| s.resource(name, amount))
    }

    /// Runs only on a worker group carrying this label (see
    /// [`Scheduler::set_group_capacity`](crate::Scheduler::set_group_capacity)). Repeatable: a
    /// group must carry every label.
    pub fn label(self, name: impl Into<Arc<str>>, value: impl Into<Arc<str>>) -> Self {
        self.with(|s| s.label(name, value))
    }

    /// The underlying spec (a relative deadline is not resolved yet).
    pub fn spec(&self) -> &TaskSpec<P> {
        &self.spec
    }

    fn with(mut self, f: impl FnOnce(TaskSpec<P>) -> TaskSpec<P>) -> Self {
        self.spec = f(self.spec);
        self
    }

    /// How the deadline was given (`None` also for a deadline set on the spec itself).
    pub(crate) fn deadline_when(&self) -> Option<When> {
        self.deadline
    }

    /// Whether the deadline is absolute (`deadline_at`, or set on the spec).
    pub(crate) fn absolute_deadline(&self) -> bool {
        match self.deadline {
            Some(When::At(_)) => true,
            Some(When::In(_)) => false,
            None => self.spec.deadline.is_some(),
        }
    }

    /// Whether it has a fixed start.
    pub(crate) fn starts(&self) -> bool {
        self.start.is_some() || self.spec.fixed_start.is_some()
    }

    /// The fixed-start tolerance and miss policy it set, if any.
    pub(crate) fn fixed_options(&self) -> (Option<Duration>, Option<MissPolicy>) {
        (self.tolerance, self.on_miss)
    }

    /// A fixed start at `at` with this task's tolerance and miss policy.
    fn fixed(&self, at: Time) -> FixedStart {
        FixedStart {
            at,
            tolerance: self.tolerance.unwrap_or(DEFAULT_TOLERANCE),
            on_miss: self.on_miss.unwrap_or_default(),
        }
    }

    /// The spec with relative times resolved at `now()` (read only when there is one).
    pub(crate) fn resolve(mut self, now: impl FnOnce() -> Time) -> TaskSpec<P> {
        self.resolve_in_place(now);
        self.spec
    }

    /// [`resolve`](Task::resolve) where the task is (a submission resolves it in the box it is
    /// sent in: each move of a task is a copy), then [`into_spec`](Task::into_spec). The
    /// relative times are spent: a second call changes nothing.
    pub(crate) fn resolve_in_place(&mut self, now: impl FnOnce() -> Time) {
        let relative = |w: Option<When>| matches!(w, Some(When::In(_)));
        let now = if relative(self.deadline) || relative(self.start) {
            now()
        } else {
            Time::ZERO
        };
        if let Some(When::In(d)) = self.start.take() {
            self.spec.fixed_start = Some(self.fixed(now + d));
        }
        if let Some(When::In(d)) = self.deadline.take() {
            self.spec.deadline = Some(now + d);
        }
    }

    /// The tags of a task being prepared in place, for the trace context captured into them.
    pub(crate) fn tags_mut(&mut self) -> &mut Vec<(Arc<str>, Arc<str>)> {
        &mut self.spec.tags
    }

    /// The spec, of a task resolved in place.
    pub(crate) fn into_spec(self) -> TaskSpec<P> {
        self.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_deadline_call_wins() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let t = Task::new(1)
            .deadline_at(at)
            .deadline_in(Duration::from_secs(5));
        assert_eq!(t.spec().deadline, None);
        let spec = t.clone().resolve(|| Time(1_000_000_000));
        assert_eq!(spec.deadline, Some(Time(6_000_000_000)));
        let t = t.deadline_at(at);
        assert_eq!(
            t.resolve(|| Time::ZERO).deadline,
            Some(Time(100_000_000_000))
        );
    }

    #[test]
    fn checks_name_the_rule() {
        let msg = |t: Task<u8>| t.spec().check().unwrap_err().to_string();
        assert_eq!(
            msg(Task::new(0).kind("a\0b")),
            "invalid task: kind, pool, key and tenant must not contain NUL characters"
        );
        assert_eq!(
            msg(Task::new(0).tenant("\0")),
            "invalid task: kind, pool, key and tenant must not contain NUL characters"
        );
        assert_eq!(
            msg(Task::new(0).tag("k", "v\0")),
            "invalid task: tags must not contain NUL characters"
        );
        let bad = RetryPolicy {
            multiplier: -1.0,
            ..RetryPolicy::default()
        };
        assert_eq!(
            msg(Task::new(0).retry(bad)),
            "invalid task: retry multiplier must be finite and non-negative"
        );
        let zero = RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(
            msg(Task::new(0).retry(zero)),
            "invalid task: retry.max_attempts must be >= 1"
        );
        assert!(Task::new(0).key("k").spec().check().is_ok());
    }

    #[test]
    fn specs_map_and_share_payloads() {
        let t = Task::new(7u8).kind("k");
        let copy = t.clone();
        assert!(Arc::ptr_eq(&t.spec().payload, &copy.spec().payload));
        let s = t.resolve(|| Time::ZERO).map_payload(Arc::new("x"));
        assert_eq!((&*s.kind, *s.payload), ("k", "x"));
    }
}
