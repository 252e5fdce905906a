//! Recurring schedules (Python: `cronoq.core.recurring`): a cron expression in a time zone
//! that materializes one fixed-start task per occurrence. `Recurring` is one schedule; the
//! engine's component that keeps them and creates their occurrences is `schedules`.
//!
//! Each occurrence is created 2 x tolerance ahead of its time (or when the previous one fires,
//! if that is later) as an ordinary fixed-start task with the key `<key>@<UTC time>Z`. Overlap
//! with the previous occurrence: `allow` runs both, `skip` skips the new one at its start time
//! while an earlier one is live, `queue` makes it depend on the previous one (any end) while
//! that is live, `queue_on_success` makes it depend on the previous one succeeding. In the
//! queue modes an occurrence still waiting for its predecessor means the next one is not
//! created (a conflict, counted in `Totals::recurring_conflicts`, as is an occurrence whose
//! submit is refused).
//!
//! Python's schedules are objects that occurrences and timers point to; here each schedule
//! added or resumed gets a `ScheduleId`, and occurrences and timers name it by that id. A
//! schedule replaced under its name is never current again, which is what Python's
//! generation counter tells its timers.

use std::sync::Arc;

use crate::cron::{CronSpec, Zone, civil};
use crate::engine::TaskRef;
use crate::model::{RetryPolicy, Status, TaskId, TaskSpec};
use crate::table::Tasks;
use crate::vocab::{DepOn, OnMiss, Overlap};

/// A template's resource amounts and labels, borrowed (`Recurring::names`).
pub(crate) type Names<'a> = (Vec<(&'a str, u32)>, Vec<(&'a str, &'a str)>);

/// `<key>@<UTC time of the occurrence>Z`, the time to the second (Python's `time.gmtime`
/// floors it).
pub fn occurrence_key(key: &str, t: f64) -> String {
    let (year, month, day, hour, minute, second) = civil(t.floor() as i64);
    format!("{key}@{year}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

/// One schedule: when (spec, tz), what (the task template) and how overlaps are handled, and
/// the state of its occurrences.
#[derive(Clone, Debug)]
pub struct Recurring {
    /// Its name, unique among the engine's schedules.
    pub name: Arc<str>,
    /// When its occurrences are.
    pub spec: CronSpec,
    /// The zone whose wall clock `spec` is read on.
    pub tz: Zone,
    /// The pool its occurrences run in.
    pub pool: String,
    /// Their priority class.
    pub cls: u8,
    /// Their kind.
    pub kind: String,
    /// The key their keys are made of (None: occurrences have none).
    pub key: Option<String>,
    /// Their tenant.
    pub tenant: Option<String>,
    /// Their deadline, after their start (seconds).
    pub deadline_in: Option<f64>,
    /// Their expected duration.
    pub duration_hint: Option<f64>,
    /// Their attempt timeout.
    pub timeout: Option<f64>,
    /// Their retry policy (None: the pool's).
    pub retry: Option<RetryPolicy>,
    /// Amounts of the engine's resources each takes while it runs, by name (empty: none; a
    /// name given twice keeps its last amount).
    pub resources: Vec<(String, u32)>,
    /// Labels a worker group must carry to run them (empty: any slot).
    pub labels: Vec<(String, String)>,
    /// What an occurrence does while an earlier one is live.
    pub overlap: Overlap,
    /// How late an occurrence may start (seconds).
    pub tolerance: f64,
    /// What an occurrence not started within its tolerance does.
    pub on_miss: OnMiss,
    pub(crate) next_time: Option<f64>,
    pub(crate) last: Option<TaskId>,
    /// An occurrence blocked on the previous one (queue modes), when it was created.
    pub(crate) queued: Option<TaskId>,
    pub(crate) recent: Vec<TaskId>,
}

impl Recurring {
    /// A schedule with Python's defaults: normal class, kind "default", no key, overlap skip,
    /// 1 s tolerance, run late.
    pub fn new(name: &str, spec: CronSpec, tz: Zone, pool: &str) -> Self {
        Recurring {
            name: Arc::from(name),
            spec,
            tz,
            pool: pool.to_owned(),
            cls: 2,
            kind: "default".to_owned(),
            key: None,
            tenant: None,
            deadline_in: None,
            duration_hint: None,
            timeout: None,
            retry: None,
            resources: Vec::new(),
            labels: Vec::new(),
            overlap: Overlap::Skip,
            tolerance: 1.0,
            on_miss: OnMiss::RunLate,
            next_time: None,
            last: None,
            queued: None,
            recent: Vec::new(),
        }
    }

    /// Its next occurrence (None: none within the cron search horizon, or not planned).
    pub fn next_time(&self) -> Option<f64> {
        self.next_time
    }

    /// The latest occurrence created.
    pub fn last(&self) -> Option<TaskId> {
        self.last
    }

    /// The latest occurrence, if it was blocked on the previous one when it was created
    /// (queue modes: the next one is not created while it still is).
    pub fn queued(&self) -> Option<TaskId> {
        self.queued
    }

    /// Its occurrences still live when the latest was created, and the latest.
    pub fn recent(&self) -> &[TaskId] {
        &self.recent
    }

    /// The template's resources and labels as the slices an occurrence's `TaskSpec` borrows.
    pub(crate) fn names(&self) -> Names<'_> {
        let resources = self.resources.iter().map(|(n, a)| (n.as_str(), *a));
        let labels = self.labels.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        (resources.collect(), labels.collect())
    }

    /// The submit of the occurrence at `t` (its key, made by `occurrence_key`, is passed in),
    /// with its dependency on the previous occurrence in the queue modes and the template's
    /// resources and labels (`names`).
    pub(crate) fn occurrence<'a>(
        &'a self,
        t: f64,
        key: Option<&'a str>,
        deps: &'a [(TaskRef<'a>, DepOn)],
        names: &'a Names<'a>,
    ) -> TaskSpec<'a> {
        TaskSpec {
            pool: &self.pool,
            cls: self.cls,
            kind: &self.kind,
            key,
            deadline: self.deadline_in.map(|d| t + d),
            duration_hint: self.duration_hint,
            timeout: self.timeout,
            retry: self.retry,
            tenant: self.tenant.as_deref(),
            start_at: Some(t),
            tolerance: self.tolerance,
            on_miss: self.on_miss,
            deps,
            resources: &names.0,
            labels: Some(&names.1),
        }
    }

    /// Remember a new occurrence (and forget those that have ended).
    pub(crate) fn created(&mut self, id: TaskId, tasks: &Tasks) {
        self.last = Some(id);
        let blocked = tasks.get(&id).is_some_and(|r| r.status == Status::Blocked);
        self.queued = blocked.then_some(id);
        self.recent.retain(|r| is_live(*r, tasks));
        self.recent.push(id);
    }

    /// Is an occurrence created before the one admitted `seq`-th still live?
    pub(crate) fn earlier_live(&self, seq: u64, tasks: &Tasks) -> bool {
        self.recent.iter().any(|r| {
            tasks
                .get(r)
                .is_some_and(|rec| rec.seq < seq && !rec.status.is_terminal())
        })
    }

    /// Occurrences created and not started: scheduled, or ready (due).
    pub(crate) fn unstarted(&self, tasks: &Tasks) -> Vec<TaskId> {
        let waiting = [Status::Blocked, Status::Scheduled, Status::Ready];
        self.recent
            .iter()
            .copied()
            .filter(|r| {
                tasks
                    .get(r)
                    .is_some_and(|rec| waiting.contains(&rec.status))
            })
            .collect()
    }
}

/// Whether the task is held and not ended (a forgotten task ended long ago).
fn is_live(id: TaskId, tasks: &Tasks) -> bool {
    tasks.get(&id).is_some_and(|r| !r.status.is_terminal())
}
