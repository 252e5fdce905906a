//! The engine's recurring schedules by name (Python: `cronoq.core.schedules`): each creates its
//! next occurrence (`recurring`) when its timer fires, at the dispatch that follows.
//!
//! Occurrences are submitted and cancelled like any task, through the engine's own submit and
//! cancel. The table (`Schedules`) is part of the engine's `State`, whose timers and
//! fixed-start rules read it; adding, removing and materializing, which submit and cancel,
//! are functions of the engine.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::engine::{Engine, TaskRef};
use crate::model::{ScheduleId, Status, SubmitError, TaskId, check_seconds, py_max};
use crate::recurring::{Recurring, occurrence_key};
use crate::rng::Random;
use crate::state::State;
use crate::table::Tasks;
use crate::timers::Timer;
use crate::vocab::{DepOn, Overlap};

/// The schedules by name, in Python's dict order, and those an occurrence still names.
#[derive(Debug, Default)]
pub struct Schedules {
    /// Every schedule some name or occurrence refers to: the current ones, and those replaced
    /// by a resume while occurrences of their own may wait for their start (they check it
    /// then).
    objects: HashMap<ScheduleId, Recurring>,
    /// The schedules replaced by a resume still kept.
    replaced: Vec<ScheduleId>,
    /// Name -> (its place in the order, the current schedule).
    by_name: HashMap<Arc<str>, (u64, ScheduleId)>,
    /// Names by place: a name keeps its place when resumed, and goes last when added again.
    order: BTreeMap<u64, Arc<str>>,
    places: u64,
    ids: ScheduleId,
    /// Schedules whose timers fired: their occurrences are created at the next dispatch.
    pub(crate) due: Vec<ScheduleId>,
}

impl Schedules {
    /// The schedules, in the order Python's dict keeps their names.
    pub fn iter(&self) -> impl Iterator<Item = &Recurring> {
        self.order
            .values()
            .map(|name| &self.objects[&self.by_name[name].1])
    }

    /// The current schedule under this name.
    pub fn get(&self, name: &str) -> Option<&Recurring> {
        self.by_name.get(name).map(|(_, id)| &self.objects[id])
    }

    /// Whether the schedule is the one under its name.
    pub(crate) fn is_current(&self, id: ScheduleId) -> bool {
        self.objects
            .get(&id)
            .is_some_and(|s| self.by_name.get(&s.name).is_some_and(|&(_, cur)| cur == id))
    }

    /// Has the schedule an occurrence admitted before the `seq`-th that is still live?
    pub(crate) fn earlier_live(&self, id: ScheduleId, seq: u64, tasks: &Tasks) -> bool {
        self.objects
            .get(&id)
            .is_some_and(|s| s.earlier_live(seq, tasks))
    }

    /// `by_name[name] = sched`: a new name goes last, a name in use keeps its place (and the
    /// schedule it named is kept as replaced).
    fn insert(&mut self, sched: Recurring) -> ScheduleId {
        self.ids += 1;
        let id = self.ids;
        let name = sched.name.clone();
        self.objects.insert(id, sched);
        match self.by_name.get_mut(&name) {
            Some(entry) => {
                self.replaced.push(entry.1);
                entry.1 = id;
            }
            None => {
                self.places += 1;
                self.order.insert(self.places, name.clone());
                self.by_name.insert(name, (self.places, id));
            }
        }
        id
    }

    /// `by_name.pop(name)`: the schedule, no longer under its name.
    fn pop(&mut self, name: &str) -> Option<Recurring> {
        let (place, id) = self.by_name.remove(name)?;
        self.order.remove(&place);
        self.objects.remove(&id)
    }

    /// Forget the schedules replaced by a resume that no live occurrence names any more.
    fn prune(&mut self, tasks: &Tasks) {
        let objects = &mut self.objects;
        self.replaced.retain(|id| {
            let named = objects[id].recent.iter().any(|r| {
                tasks.get(r).is_some_and(|rec| {
                    !rec.status.is_terminal()
                        && rec
                            .extra
                            .as_deref()
                            .is_some_and(|e| e.recurring == Some(*id))
                })
            });
            if !named {
                objects.remove(id);
            }
            named
        });
    }
}

/// Checks a schedule's template as a submit of it would be checked (unknown pool, class,
/// tolerance), and its deadline.
fn check<R: Random>(eng: &mut Engine<R>, sched: &Recurring) -> Result<(), SubmitError> {
    eng.record(sched.occurrence(0.0, None, &[], &sched.names()))?;
    if let Some(d) = sched.deadline_in {
        check_seconds("deadline_in", d).map_err(|m| SubmitError::new("invalid", m))?;
    }
    Ok(())
}

/// Add or replace a schedule by name; a replaced schedule's pending occurrences are cancelled.
pub(crate) fn add<R: Random>(
    eng: &mut Engine<R>,
    sched: Recurring,
    now: f64,
) -> Result<(), SubmitError> {
    check(eng, &sched)?;
    remove(eng, &sched.name, now);
    let id = eng.st.schedules.insert(sched);
    plan_next(&mut eng.st, id, now, now);
    Ok(())
}

/// Take back a stored schedule (after restore): its next occurrence is the stored one,
/// created at once if its time passed meanwhile (then its on_miss applies); the occurrences
/// that passed after it are not created. The schedule it replaces, if any, is not removed:
/// its occurrences become this one's.
pub(crate) fn resume<R: Random>(
    eng: &mut Engine<R>,
    sched: Recurring,
    next_time: Option<f64>,
    last: Option<TaskId>,
    now: f64,
) -> Result<(), SubmitError> {
    check(eng, &sched)?;
    let st = &mut eng.st;
    let name = sched.name.clone();
    let id = st.schedules.insert(sched);
    let mut mine: Vec<(u64, TaskId)> = st
        .tasks
        .values()
        .filter(|r| r.extra.as_deref().and_then(|e| e.schedule.as_ref()) == Some(&name))
        .map(|r| (r.seq, r.id))
        .collect();
    mine.sort_unstable();
    let sched = st.schedules.objects.get_mut(&id).expect("just added");
    for (_, r) in mine {
        sched.created(r, &st.tasks);
    }
    if let Some(last) = last
        && st.tasks.contains_key(&last)
    {
        sched.last = Some(last);
    }
    if let Some(t) = next_time {
        plan_next(st, id, t - 0.5, now);
    }
    st.schedules.prune(&st.tasks);
    Ok(())
}

/// Drop a schedule and cancel its occurrences that have not started yet (their keys are freed,
/// so a schedule added again under the same name creates them anew).
pub(crate) fn remove<R: Random>(eng: &mut Engine<R>, name: &str, now: f64) -> bool {
    let Some(sched) = eng.st.schedules.pop(name) else {
        return false;
    };
    for id in sched.unstarted(&eng.st.tasks) {
        eng.cancel(TaskRef::Id(id), now);
        eng.st.free_key(id); // for good: a store writes the cancelled task without it
    }
    eng.st.schedules.prune(&eng.st.tasks);
    true
}

/// Create the occurrences whose timers fired; true if there were any.
pub(crate) fn create_due<R: Random>(eng: &mut Engine<R>, now: f64) -> bool {
    let due = std::mem::take(&mut eng.st.schedules.due);
    if due.is_empty() {
        return false;
    }
    for id in due {
        if eng.st.schedules.is_current(id) {
            materialize(eng, id, now);
        }
    }
    true
}

/// Find the next occurrence strictly after `after` and set the timer that creates it.
///
/// # Panics
/// When `after` is not finite or outside years 1-9999 (Python raises `ValueError`).
fn plan_next<R: Random>(st: &mut State<R>, id: ScheduleId, after: f64, not_before: f64) {
    let sched = st
        .schedules
        .objects
        .get_mut(&id)
        .expect("a current schedule");
    let t = sched.spec.next_after(after, &sched.tz);
    sched.next_time = t;
    if let Some(j) = &mut st.journal {
        j.schedule(&sched.name, id);
    }
    if let Some(t) = t {
        let when = py_max(not_before, t - 2.0 * sched.tolerance);
        st.timers.set(when, Timer::Cron { schedule: id });
    }
}

/// Create the occurrence at the schedule's next time as an ordinary fixed-start task (in the
/// queue modes, one depending on the previous occurrence; none while the one before it still
/// waits for its own predecessor).
fn materialize<R: Random>(eng: &mut Engine<R>, id: ScheduleId, now: f64) {
    // (a copy: the submit below changes the tables it is kept in)
    let sched = eng.st.schedules.objects[&id].clone();
    let t = sched.next_time.expect("a planned occurrence");
    let tasks = &eng.st.tasks;
    let status = |task: Option<TaskId>| task.and_then(|r| tasks.get(&r)).map(|r| r.status);
    let prev_live = status(sched.last).is_some_and(|s| !s.is_terminal());
    let queue = matches!(sched.overlap, Overlap::Queue | Overlap::QueueOnSuccess);
    if queue && status(sched.queued) == Some(Status::Blocked) {
        eng.st.totals.recurring_conflicts += 1;
        plan_next(&mut eng.st, id, py_max(t, now), t);
        return;
    }
    let edge = match (sched.overlap, sched.last) {
        (Overlap::QueueOnSuccess, Some(prev)) => Some((TaskRef::Id(prev), DepOn::Success)),
        (Overlap::Queue, Some(prev)) if prev_live => Some((TaskRef::Id(prev), DepOn::Complete)),
        _ => None,
    };
    let edges: Vec<(TaskRef<'_>, DepOn)> = edge.into_iter().collect();
    let key = sched.key.as_deref().map(|k| occurrence_key(k, t));
    let got = match key.as_deref().and_then(|k| eng.st.keys.get(k)) {
        Some(&old) => Ok(old),
        None => {
            let names = sched.names();
            let spec = sched.occurrence(t, key.as_deref(), &edges, &names);
            let mut rec = eng.record(spec).expect("a template checked when added");
            let extra = rec.extra.as_deref_mut().expect("a fixed start");
            extra.schedule = Some(sched.name.clone());
            if sched.overlap == Overlap::Skip {
                extra.recurring = Some(id); // checked at its start time
            }
            eng.submit_record(rec, now)
        }
    };
    let st = &mut eng.st;
    match got {
        Ok(task) => {
            let sched = st
                .schedules
                .objects
                .get_mut(&id)
                .expect("a current schedule");
            sched.created(task, &st.tasks);
        }
        Err(_) => st.totals.recurring_conflicts += 1,
    }
    // Occurrences whose time passed before this one was created (a stalled or stopped driver)
    // are not created: the schedule goes on from now.
    plan_next(st, id, py_max(t, now), t);
}
