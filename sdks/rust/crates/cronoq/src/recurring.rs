//! Recurring schedules: [`Recurring`] (a cron expression, a time zone and a task template),
//! its engine form [`RecurringSpec`], [`OverlapPolicy`] and [`RecurringInfo`]; and the
//! driver's side of them, which gives each occurrence the engine creates its template's
//! payload.
//!
//! The engine creates each occurrence a little ahead of its time (twice the tolerance) as a
//! fixed-start task with the key `<key>@<UTC time>Z` when the template has a key, tagged
//! `cronoq.recurring=<name>`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cronoq_core::Engine;
use cronoq_core::cron::{parse_cron, zone};
use cronoq_core::model::{DepTarget, Totals};
use cronoq_core::vocab::Overlap;

use crate::deps::{Dep, EdgeCond};
use crate::error::Error;
use crate::fixed::{DEFAULT_TOLERANCE, FixedStart, MissPolicy};
use crate::store::RecoveredRecurring;
use crate::task::{Task, TaskSpec, When};
use crate::time::Time;
use crate::types::{TaskId, TaskRef};

/// The tag that names the schedule an occurrence belongs to.
pub(crate) const RECURRING_TAG: &str = "cronoq.recurring";

/// What an occurrence does while an earlier occurrence of its schedule is still live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OverlapPolicy {
    /// It ends [`Skipped`](crate::TaskStatus::Skipped) at its start time (the default).
    #[default]
    Skip,
    /// Both run.
    Allow,
    /// It waits for the earlier one to end, however it ends.
    Queue,
    /// It waits for the earlier one to succeed, and is skipped if that does not.
    QueueOnSuccess,
}

impl OverlapPolicy {
    fn to_core(self) -> Overlap {
        match self {
            OverlapPolicy::Skip => Overlap::Skip,
            OverlapPolicy::Allow => Overlap::Allow,
            OverlapPolicy::Queue => Overlap::Queue,
            OverlapPolicy::QueueOnSuccess => Overlap::QueueOnSuccess,
        }
    }
}

/// A schedule as the engine takes it: every option explicit. Most programs build a
/// [`Recurring`] instead.
#[derive(Debug)]
pub struct RecurringSpec<P> {
    /// Its name, unique in a scheduler: adding a name again replaces the schedule.
    pub name: Arc<str>,
    /// The cron expression (five fields, or six with seconds first, or seven with years last).
    pub cron: Arc<str>,
    /// The IANA time zone the expression is read in (`None`: UTC).
    pub tz: Option<Arc<str>>,
    /// What each occurrence is: payload, pool, kind, priority, key prefix, retry, timeout,
    /// tags, tenant and duration hint.
    pub template: TaskSpec<P>,
    /// Each occurrence's soft deadline, after its start.
    pub deadline_after: Option<Duration>,
    /// What an occurrence does while an earlier one is live.
    pub overlap: OverlapPolicy,
    /// How late an occurrence may start before `on_miss` applies.
    pub tolerance: Duration,
    /// What an occurrence later than its tolerance does.
    pub on_miss: MissPolicy,
}

/// A recurring schedule to add with [`Scheduler::add_recurring`](crate::Scheduler::add_recurring).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cronoq::{OverlapPolicy, Pool, Recurring, Scheduler, Task, TaskError};
///
/// let s = Scheduler::<&'static str, ()>::builder()
///     .pool(Pool::fixed("default", 1).executor_fn(|_ctx, _job: Arc<&str>| async move {
///         Ok::<_, TaskError>(())
///     }))
///     .build()
///     .await?;
/// let nightly = Recurring::new("nightly", "0 2 * * *", Task::new("report").key("report"))
///     .tz("Europe/Berlin")
///     .overlap(OverlapPolicy::Queue);
/// s.add_recurring(nightly).await?;
/// assert_eq!(s.list_recurring().await?[0].name.as_ref(), "nightly");
/// assert!(s.remove_recurring("nightly").await?);
/// s.shutdown(Duration::from_secs(1)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Recurring<P> {
    template: Task<P>,
    spec: RecurringSpec<P>,
    tolerance: Option<Duration>,
    on_miss: Option<MissPolicy>,
}

impl<P> Clone for RecurringSpec<P> {
    /// A copy sharing the template's payload.
    fn clone(&self) -> Self {
        RecurringSpec {
            name: self.name.clone(),
            cron: self.cron.clone(),
            tz: self.tz.clone(),
            template: self.template.clone(),
            deadline_after: self.deadline_after,
            overlap: self.overlap,
            tolerance: self.tolerance,
            on_miss: self.on_miss,
        }
    }
}

impl<P> Clone for Recurring<P> {
    /// A copy sharing the template's payload.
    fn clone(&self) -> Self {
        Recurring {
            template: self.template.clone(),
            spec: self.spec.clone(),
            tolerance: self.tolerance,
            on_miss: self.on_miss,
        }
    }
}

impl<P> Recurring<P> {
    /// A schedule named `name` creating a task like `template` at every time `cron` names, in
    /// UTC. The template's `deadline_in` becomes a deadline after each occurrence's start; its
    /// `key` a prefix of the occurrences' keys.
    pub fn new(name: impl Into<Arc<str>>, cron: impl Into<Arc<str>>, template: Task<P>) -> Self {
        Recurring {
            spec: RecurringSpec {
                name: name.into(),
                cron: cron.into(),
                tz: None,
                template: template.spec().clone(),
                deadline_after: match template.deadline_when() {
                    Some(When::In(d)) => Some(d),
                    _ => None,
                },
                overlap: OverlapPolicy::Skip,
                tolerance: DEFAULT_TOLERANCE,
                on_miss: MissPolicy::RunLate,
            },
            template,
            tolerance: None,
            on_miss: None,
        }
    }

    /// The IANA time zone the expression is read in (default UTC).
    pub fn tz(mut self, tz: impl Into<Arc<str>>) -> Self {
        self.spec.tz = Some(tz.into());
        self
    }

    /// What an occurrence does while an earlier one is live (default
    /// [`OverlapPolicy::Skip`]).
    pub fn overlap(mut self, overlap: OverlapPolicy) -> Self {
        self.spec.overlap = overlap;
        self
    }

    /// How late an occurrence may start (default: the template's `start_tolerance`, else 1 s).
    pub fn tolerance(mut self, d: Duration) -> Self {
        self.tolerance = Some(d);
        self
    }

    /// What an occurrence later than its tolerance does (default: the template's `on_miss`,
    /// else [`MissPolicy::RunLate`]).
    pub fn on_miss(mut self, policy: MissPolicy) -> Self {
        self.on_miss = Some(policy);
        self
    }

    /// The engine form, or why the template cannot be one (checked by `add_recurring`).
    pub(crate) fn into_spec(self) -> Result<RecurringSpec<P>, Error> {
        let config = |m: &str| Err(Error::Config(m.to_string()));
        let t = &self.template;
        if self.spec.name.contains('\0') {
            return config("recurring names must not contain NUL characters");
        }
        if t.absolute_deadline() {
            return config(
                "recurring templates cannot set an absolute deadline (use deadline_in, relative to each occurrence)",
            );
        }
        if t.starts() {
            return config("recurring templates cannot set a fixed start");
        }
        if !t.spec().deps.is_empty() {
            return config(
                "recurring templates cannot set a dependency (use OverlapPolicy::Queue to chain occurrences)",
            );
        }
        t.spec().check().map_err(|e| Error::Config(e.to_string()))?;
        let (tolerance, on_miss) = t.fixed_options();
        let mut spec = self.spec;
        spec.tolerance = self.tolerance.or(tolerance).unwrap_or(DEFAULT_TOLERANCE);
        spec.on_miss = self.on_miss.or(on_miss).unwrap_or_default();
        Ok(spec)
    }
}

/// A schedule as [`Scheduler::list_recurring`](crate::Scheduler::list_recurring) describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecurringInfo {
    /// Its name.
    pub name: Arc<str>,
    /// Its cron expression.
    pub cron: Arc<str>,
    /// Its time zone (`None`: UTC).
    pub tz: Option<Arc<str>>,
    /// The pool its occurrences run in.
    pub pool: Arc<str>,
    /// Their kind.
    pub kind: Arc<str>,
    /// What an occurrence does while an earlier one is live.
    pub overlap: OverlapPolicy,
    /// Its next occurrence (`None`: the expression names no later time).
    pub next: Option<Time>,
    /// The latest occurrence created.
    pub last_task: Option<TaskId>,
}

/// A stored task that is an occurrence of a schedule (its tag names it) becomes one again in
/// the engine, for the schedule to take it back when it resumes.
pub(crate) fn mark_occurrence<P>(rec: &mut cronoq_core::TaskRecord, spec: &TaskSpec<P>) {
    if let Some((_, name)) = spec.tags.iter().find(|(k, _)| &**k == RECURRING_TAG) {
        rec.extra.get_or_insert_with(Box::default).schedule = Some(name.clone());
    }
}

/// The engine's form of a schedule, or why its expression or time zone is refused.
fn to_core(spec: &RecurringSpec<impl Sized>) -> Result<cronoq_core::recurring::Recurring, Error> {
    let cron = parse_cron(&spec.cron)
        .map_err(|e| Error::Config(format!("invalid cron '{}': {}", spec.cron, e.message())))?;
    let tz = zone(spec.tz.as_deref()).map_err(|_| {
        Error::Config(format!(
            "unknown time zone '{}'",
            spec.tz.as_deref().unwrap_or("")
        ))
    })?;
    let t = &spec.template;
    let mut core = cronoq_core::recurring::Recurring::new(&spec.name, cron, tz, &t.pool);
    core.cls = t.priority as u8;
    core.kind = t.kind.to_string();
    core.key = t.key.as_deref().map(str::to_string);
    core.tenant = t.tenant.as_deref().map(str::to_string);
    core.deadline_in = spec.deadline_after.map(|d| d.as_secs_f64());
    core.duration_hint = t.duration_hint.map(|d| d.as_secs_f64());
    core.timeout = t.timeout.map(|d| d.as_secs_f64());
    core.retry = t.retry.map(|r| r.to_core());
    core.resources = t
        .resources
        .iter()
        .map(|(n, a)| (n.to_string(), *a))
        .collect();
    core.labels = t
        .labels
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    core.overlap = spec.overlap.to_core();
    core.tolerance = spec.tolerance.as_secs_f64();
    core.on_miss = spec.on_miss.to_core();
    Ok(core)
}

/// The engine's refusal of a schedule's template.
fn template_error(spec: &RecurringSpec<impl Sized>, e: cronoq_core::SubmitError) -> Error {
    let why = match e.code {
        "unknown_pool" => format!("unknown pool '{}'", spec.template.pool),
        _ => e.message,
    };
    Error::Config(format!("invalid template: {why}"))
}

/// The driver's schedules: each one's spec, for the payload of the occurrences the engine
/// creates.
pub(crate) struct Schedules<P> {
    specs: BTreeMap<Arc<str>, RecurringSpec<P>>,
    /// Stored schedules dropped at start (`recurring_invalid`).
    invalid: u64,
}

impl<P> Schedules<P> {
    pub(crate) fn new() -> Self {
        Schedules {
            specs: BTreeMap::new(),
            invalid: 0,
        }
    }

    /// Adds or replaces a schedule in the engine.
    pub(crate) fn add(
        &mut self,
        engine: &mut Engine,
        spec: RecurringSpec<P>,
        now: f64,
    ) -> Result<(), Error> {
        let core = to_core(&spec)?;
        engine
            .add_recurring(core, now)
            .map_err(|e| template_error(&spec, e))?;
        self.specs.insert(spec.name.clone(), spec);
        Ok(())
    }

    /// Takes back the schedules a store kept (after the store's tasks): each with its next
    /// occurrence and its latest, its stored occurrences its own. Those the configuration no
    /// longer supports (a pool or resource gone, say) are dropped, logged and counted in
    /// `recurring_invalid`; their names are returned, for the store to forget them.
    pub(crate) fn resume(
        &mut self,
        engine: &mut Engine,
        stored: Vec<RecoveredRecurring<P>>,
        secs: impl Fn(Time) -> f64,
        now: f64,
    ) -> Vec<Arc<str>> {
        let mut dropped = Vec::new();
        for s in stored {
            let spec = s.spec;
            let resumed = to_core(&spec).and_then(|core| {
                let next = s.next.map(&secs);
                engine
                    .resume_recurring(core, next, s.last.map(|id| id.0), now)
                    .map_err(|e| template_error(&spec, e))
            });
            match resumed {
                Ok(()) => {
                    self.specs.insert(spec.name.clone(), spec);
                }
                Err(e) => {
                    tracing::warn!(schedule = %spec.name, error = %e, "a stored recurring schedule is dropped");
                    self.invalid += 1;
                    dropped.push(spec.name);
                }
            }
        }
        dropped
    }

    /// The engine's totals with the schedules dropped at start.
    pub(crate) fn totals(&self, mut totals: Totals) -> Totals {
        totals.recurring_invalid += self.invalid;
        totals
    }

    /// Removes a schedule (its occurrences not started yet are cancelled); false if none has
    /// that name.
    pub(crate) fn remove(&mut self, engine: &mut Engine, name: &str, now: f64) -> bool {
        self.specs.remove(name);
        engine.remove_recurring(name, now)
    }

    /// Every schedule, by name (`time` turns engine seconds into a `Time`).
    pub(crate) fn list(&self, engine: &Engine, time: impl Fn(f64) -> Time) -> Vec<RecurringInfo> {
        self.specs
            .values()
            .map(|s| {
                let sched = engine.schedule(&s.name);
                RecurringInfo {
                    name: s.name.clone(),
                    cron: s.cron.clone(),
                    tz: s.tz.clone(),
                    pool: s.template.pool.clone(),
                    kind: s.template.kind.clone(),
                    overlap: s.overlap,
                    next: sched.and_then(|r| r.next_time()).map(&time),
                    last_task: sched.and_then(|r| r.last()).map(TaskId),
                }
            })
            .collect()
    }

    /// The occurrences the engine created that the driver does not hold yet (`held`), each
    /// with its task: the template with the occurrence's key and deadline (`time` turns engine
    /// seconds into a `Time`) and the `cronoq.recurring` tag.
    pub(crate) fn created(
        &self,
        engine: &Engine,
        held: impl Fn(u64) -> bool,
        time: impl Fn(f64) -> Time,
    ) -> Vec<(u64, TaskSpec<P>)> {
        let mut out = Vec::new();
        for s in self.specs.values() {
            let Some(sched) = engine.schedule(&s.name) else {
                continue;
            };
            for &id in sched.recent() {
                let Some(rec) = engine.lookup(cronoq_core::TaskRef::Id(id)) else {
                    continue;
                };
                if held(id) || rec.status.is_terminal() {
                    continue;
                }
                let mut task = s.template.clone();
                task.key = rec.key.clone();
                task.deadline = rec.deadline.map(&time);
                task.tags.push((RECURRING_TAG.into(), s.name.clone()));
                // As the engine holds it, so that a store gives it back as it was: at its
                // time, and after the previous occurrence in the queue modes.
                if let Some(extra) = rec.extra.as_deref() {
                    task.fixed_start = extra.start_at.map(|at| FixedStart {
                        at: time(at),
                        tolerance: s.tolerance,
                        on_miss: s.on_miss,
                    });
                    task.deps = extra
                        .deps
                        .iter()
                        .map(|(target, _)| {
                            let target = match target {
                                DepTarget::Id(id) => TaskRef::Id(TaskId(*id)),
                                DepTarget::Key(key) => TaskRef::Key(key.clone()),
                            };
                            let cond = match s.overlap {
                                OverlapPolicy::QueueOnSuccess => EdgeCond::OnSuccess,
                                _ => EdgeCond::OnComplete,
                            };
                            Dep { target, cond }
                        })
                        .collect();
                }
                out.push((id, task));
            }
        }
        out
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }
}
