//! Restoring what a store kept (Python: `cronoq.core.restore`): the engine takes back its tasks
//! before anything is submitted.
//!
//! Each stored task carries its id, seq, status, attempt, times and extras (dependencies as
//! submitted, resources, fixed start, attempt history); a retrying task's `ready_at` is when it
//! retries. Ended tasks are retained (lookups, key deduplication). Live ones resume: blocked
//! tasks wait for their parents again, scheduled and never-started fixed starts arrive again
//! (a start that passed meanwhile follows its on_miss), retrying tasks keep their retry time.
//! An attempt that was running when the last holder stopped is counted as used (*lost*): the
//! task retries with the next attempt number after its retry backoff (not at once: the old
//! holder's executor may still be finishing), or is dead-lettered when that was its last
//! attempt. Tasks of a pool or resource that no longer exists fail, as do those whose row
//! could not be read (`broken`).
//!
//! Every status change here follows `model::RESTORE_TRANSITIONS`; totals count only what
//! happens from here (lost attempts included).

use std::collections::HashMap;
use std::sync::Arc;

use crate::deps;
use crate::engine::Engine;
use crate::model::{
    Extras, FIRST_TERMINAL, Status, SubmitError, TaskId, TaskRecord, Totals, py_cmp, py_repr,
};
use crate::rng::Random;
use crate::state::State;
use crate::timers::Timer;

/// The message of a task dead-lettered because its last attempt was lost in a failover.
pub const MSG_LOST: &str = "attempt lost in failover; retries exhausted";
/// The message of a task retrying because its attempt was lost in a failover.
pub const MSG_LOST_RETRY: &str = "attempt lost in failover";

/// A task as a store keeps it: its record, with its pool and kind by name (a record names
/// them by number, which only means something to the engine that made it). The record's
/// `pool` and `kind` are ignored, as is its engine state (`running`, `qgen`, `parked`,
/// `latest_start` and the extras' state beyond the spec and the attempt history): restore
/// starts them afresh. Its `ready_at` counts only while it retries, its `finished_at` only
/// once it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTask {
    /// The record.
    pub record: TaskRecord,
    /// The name of its pool (one no longer configured fails the task, if it is live).
    pub pool: Arc<str>,
    /// The name of its kind.
    pub kind: Arc<str>,
}

/// How one live task was taken back.
enum Readmitted {
    /// It resumed (and, if its attempt was lost, retries: `retried`).
    Resumed { retried: bool },
    /// Its last attempt was lost: it is dead-lettered once every task is back.
    LastLost(TaskId),
    /// It cannot resume, for this reason.
    Failed(Box<TaskRecord>, String),
}

impl<R: Random> Engine<R> {
    /// Take back the tasks a store kept, before anything is submitted (see the module docs);
    /// `broken`: id -> why that task's row cannot be read, so that it fails (an empty reason
    /// counts as none, as in Python). Ids are unique; the engine's `first_id` is past them.
    pub fn restore(&mut self, recs: Vec<StoredTask>, now: f64, broken: &HashMap<TaskId, String>) {
        let mut ordered: Vec<(TaskRecord, Option<usize>)> = recs
            .into_iter()
            .map(|s| {
                let mut rec = s.record;
                rec.kind = self.kind_id(&s.kind);
                let pool = self.st.pool_index.get(&*s.pool).copied();
                rec.pool = pool.unwrap_or_else(|| self.retired_pool(&s.pool));
                fresh(&mut rec);
                (rec, pool)
            })
            .collect();
        ordered.sort_by_key(|(rec, _)| rec.id);
        for (rec, _) in &ordered {
            self.st.seq_at_least(rec.seq);
        }
        let (done, live): (Vec<_>, Vec<_>) = ordered
            .into_iter()
            .partition(|(rec, _)| rec.status >= FIRST_TERMINAL);
        let mut done: Vec<TaskRecord> = done.into_iter().map(|(rec, _)| rec).collect();
        done.sort_by(|a, b| py_cmp(a.finished_at, b.finished_at)); // stable, as Python's sort
        for rec in done {
            self.st.retain(rec);
        }
        let mut lost = Vec::new();
        let mut retried: Vec<u64> = vec![0; self.st.pools.len()];
        for (rec, pool) in live {
            let problem = broken.get(&rec.id).filter(|p| !p.is_empty()).cloned();
            let outcome = match (problem, pool) {
                (Some(problem), _) => Readmitted::Failed(Box::new(rec), problem),
                (None, None) => {
                    let name = self.pool_name(rec.pool).expect("a retired pool's name");
                    let msg = format!("pool {} is no longer configured", py_repr(name));
                    Readmitted::Failed(Box::new(rec), msg)
                }
                (None, Some(_)) => readmit(&mut self.st, rec, now),
            };
            match outcome {
                Readmitted::Resumed { retried: true } => {
                    retried[pool.expect("a configured pool")] += 1;
                }
                Readmitted::Resumed { retried: false } => {}
                Readmitted::LastLost(id) => lost.push(id),
                Readmitted::Failed(rec, problem) => self.st.fail_restored(*rec, problem, now),
            }
        }
        self.st.restart_counts(&retried);
        for id in lost {
            let rec = &self.st.tasks[&id];
            let policy = rec.retry.unwrap_or(self.st.pools[rec.pool].retry);
            if rec.attempt >= policy.max_attempts() && rec.status == Status::Ready {
                self.st.unqueue(id);
                self.st
                    .finish(id, Status::DeadLettered, now, Some(MSG_LOST));
            }
        }
    }
}

/// Clear the engine state a stored record may still carry: restore sets it afresh.
fn fresh(rec: &mut TaskRecord) {
    rec.running = None;
    rec.qgen = 0;
    rec.parked = None;
    rec.latest_start = None;
    if let Some(e) = &mut rec.extra {
        e.resolved = None;
        e.waiting = 0;
        e.awaits.clear();
        e.parents.clear();
        e.children.clear();
        e.held = false;
        e.due = false;
        e.fixed_done = false;
        e.recurring = None;
        e.wanted = None;
    }
}

/// Admit one stored live task of a configured pool again (Python's `_readmit`).
fn readmit<R: Random>(st: &mut State<R>, mut rec: TaskRecord, now: f64) -> Readmitted {
    let status = rec.status;
    let lost = status == Status::Running;
    if let Err(e) = st.resolve_resources(&mut rec) {
        return cannot_resume(rec, &e);
    }
    if status != Status::Blocked
        && let Some(e) = &mut rec.extra
    {
        e.deps.clear(); // satisfied before it was stored
    }
    let policy = rec.retry.unwrap_or(st.pools[rec.pool].retry);
    // A fixed start lost with its attempt goes back under its fixed-start rules (its time has
    // passed: it runs late within its tolerance, else follows on_miss), attempts permitting.
    let fixed_again = lost && rec.start_at().is_some() && rec.attempt < policy.max_attempts();
    if rec.attempt > 0
        && !fixed_again
        && let Some(e) = &mut rec.extra
    {
        e.start_at = None; // its fixed start happened: it runs as any task
    }
    let mut status = status;
    let mut last_lost = false;
    if lost && !fixed_again {
        if rec.attempt >= policy.max_attempts() {
            last_lost = true; // dead-lettered by `restore` once it is admitted
        } else {
            // a retry after the backoff, like any failed attempt (not at once: a worker may
            // still be finishing it), with the next attempt number
            let mut delay = policy.backoff(rec.attempt + 1);
            if policy.jitter() && delay > 0.0 {
                delay = st.rng.uniform(0.0, delay);
            }
            rec.ready_at = now + delay;
            rec.message = Some(Arc::from(MSG_LOST_RETRY));
            status = Status::Retrying;
        }
    }
    if status == Status::Retrying {
        st.reinstate(&mut rec, Status::Retrying, lost); // a lost attempt's retry time is written
        st.resume_retry(rec);
        return Readmitted::Resumed { retried: lost };
    }
    if let Err(e) = deps::resolve(st, &mut rec, None) {
        return cannot_resume(rec, &e);
    }
    st.reinstate(&mut rec, Status::Blocked, false);
    let id = rec.id;
    let special = rec.extra.is_some();
    if special {
        st.deps.open_tombs();
    }
    st.admit(rec, now);
    if special {
        st.deps.close_tombs();
    }
    if last_lost {
        Readmitted::LastLost(id)
    } else {
        Readmitted::Resumed { retried: false }
    }
}

fn cannot_resume(rec: TaskRecord, e: &SubmitError) -> Readmitted {
    Readmitted::Failed(Box::new(rec), format!("cannot resume: {}", e.message))
}

impl<R: Random> State<R> {
    /// Restore's status change (`model::RESTORE_TRANSITIONS`), journaled if `journal`.
    ///
    /// # Panics
    /// On a change the table forbids (an engine bug).
    fn reinstate(&mut self, rec: &mut TaskRecord, status: Status, journal: bool) {
        assert!(
            rec.status.may_restore_to(status),
            "illegal restore transition: task {}: {} -> {status}",
            rec.id,
            rec.status
        );
        rec.status = status;
        if journal && let Some(j) = &mut self.journal {
            j.change(rec.id);
        }
    }

    /// Keep an ended task a store gave back (lookups, key deduplication).
    fn retain(&mut self, rec: TaskRecord) {
        self.retained.push_back((rec.id, rec.finished_at));
        self.index(rec);
    }

    /// Take back a restored retrying task: it retries at its `ready_at`.
    fn resume_retry(&mut self, rec: TaskRecord) {
        let (id, attempt, when) = (rec.id, rec.attempt, rec.ready_at);
        let pool = &mut self.pools[rec.pool];
        pool.pending_by_class[usize::from(rec.cls)] += 1;
        pool.retrying_by_class[usize::from(rec.cls)] += 1;
        self.live += 1;
        self.index(rec);
        self.timers.set(when, Timer::Retry { task: id, attempt });
    }

    /// Make a restored task findable by id and key (admit does it for the others).
    fn index(&mut self, rec: TaskRecord) {
        if let Some(key) = &rec.key {
            self.keys.insert(key.clone(), rec.id);
        }
        self.tasks.insert(rec.id, rec);
    }

    /// A live task that cannot resume fails, without an event or a count (nothing happened
    /// to it from here), its extras dropped but for its schedule's name (Python keeps that
    /// tag on the record); its row is written back.
    fn fail_restored(&mut self, mut rec: TaskRecord, problem: String, now: f64) {
        self.reinstate(&mut rec, Status::Failed, true);
        rec.message = Some(Arc::from(problem));
        rec.finished_at = now;
        rec.extra = rec.extra.take().and_then(|e| e.schedule).map(|name| {
            Box::new(Extras {
                schedule: Some(name),
                ..Extras::default()
            })
        });
        self.retain(rec);
    }

    /// After restore, totals and arrivals count only what happens from here, but for the
    /// lost attempts restore retried (`retried`: how many, by pool).
    fn restart_counts(&mut self, retried: &[u64]) {
        self.totals = Totals {
            retries: retried.iter().sum(),
            ..Totals::default()
        };
        for (pool, &n) in self.pools.iter_mut().zip(retried) {
            pool.arrivals = 0;
            pool.dead_lettered = 0;
            pool.retries = n;
        }
        if let Some(j) = &mut self.journal {
            j.added.clear(); // their rows exist
        }
    }
}
