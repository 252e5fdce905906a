//! Dependencies between tasks (Python: `cronoq.core.deps`): resolving edges at admission,
//! blocking a task until its parents end, releasing or skipping it when they do, and refusing
//! cycles.
//!
//! An edge is (parent, condition): `success`, `failure` (failed or dead-lettered) or `complete`
//! (any end). A blocked task counts its unmet edges (`Extras::waiting`); each parent keeps its
//! waiting children (`Extras::children`). When a parent ends, every child's edge is settled:
//! met edges count down and release the child at zero, an unmet edge skips it, and a skipped
//! child settles its own children in turn (through one cascade queue, in Python's order, so
//! long chains do not recurse). A key that names no task yet is awaited
//! (`UnknownDependency::Await`): the edge is linked when a task with that key is admitted, and
//! an `await_timeout` skips the child.
//!
//! Python's records refer to their parents and children as objects; here they name them by
//! id. A batch is resolved before its ids are given: batch-mate `i` is named by the id it will
//! get, `next_id + i` (ids follow the batch order), and looked up among the batch's records.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::model::{
    DepTarget, FIRST_TERMINAL, Resolved, Status, SubmitError, TaskId, TaskRecord, py_max, py_repr,
};
use crate::rng::Random;
use crate::state::{State, Tasks};
use crate::timers::Timer;
use crate::vocab::{DepOn, UnknownDependency};

/// The message of a task skipped because an awaited key did not come in time.
pub const MSG_AWAIT_TIMEOUT: &str = "timed out awaiting unknown dependency";

/// Dependents with their edges' conditions (`Extras::children`).
pub type Children = Vec<(TaskId, DepOn)>;

/// The dependency graph's state beyond the records' extras.
#[derive(Debug, Default)]
pub struct Dependencies {
    /// Key -> (dependent, condition) edges waiting for a task with that key to be admitted.
    /// Entries stay until the key comes, also for dependents that ended meanwhile; whether it
    /// is empty decides whether blocked tasks keep their resolved edges.
    pub awaiting: HashMap<Arc<str>, Vec<(TaskId, DepOn)>>,
    /// Parents whose children are still to settle: (parent, how it ended, its children).
    cascade: VecDeque<(TaskId, Status, Children)>,
    settling: bool,
    /// While a submit admits tasks with dependencies: the final status of every task forgotten
    /// meanwhile (shed, or skipped, past `retention_max`), which a parent resolved before it
    /// still has for the tasks attached after it (Python keeps the parent object).
    tombs: Option<HashMap<TaskId, Status>>,
}

impl Dependencies {
    /// A submit with dependencies starts admitting: keep the statuses of tasks forgotten.
    pub(crate) fn open_tombs(&mut self) {
        self.tombs = Some(HashMap::new());
    }

    /// The submit is done (admitted or refused).
    pub(crate) fn close_tombs(&mut self) {
        self.tombs = None;
    }

    /// A task is forgotten: keep its status if a submit is admitting.
    pub(crate) fn forgotten(&mut self, id: TaskId, status: Status) {
        if let Some(tombs) = &mut self.tombs {
            tombs.insert(id, status);
        }
    }
}

/// Does a parent that ended with `status` satisfy an edge with condition `on`?
pub fn edge_met(status: Status, on: DepOn) -> bool {
    match on {
        DepOn::Complete => true,
        DepOn::Success => status == Status::Succeeded,
        DepOn::Failure => matches!(status, Status::Failed | Status::DeadLettered),
    }
}

fn cycle() -> SubmitError {
    SubmitError::new("cycle", "dependency cycle")
}

/// Find the parents a task's edges name (in the engine, or in its batch by key: `batch` maps
/// the batch's new keys to their index); `unknown_dependency` for an unknown one unless its
/// pool awaits unknown keys. Sets `Extras::resolved`.
pub(crate) fn resolve<R: Random>(
    st: &State<R>,
    rec: &mut TaskRecord,
    batch: Option<&HashMap<&str, usize>>,
) -> Result<(), SubmitError> {
    let awaits = st.pools[rec.pool].cfg.unknown_dependency == UnknownDependency::Await;
    let key = rec.key.clone();
    let Some(extra) = rec.extra.as_deref_mut() else {
        return Ok(());
    };
    if extra.deps.is_empty() {
        return Ok(());
    }
    let mut resolved = Vec::with_capacity(extra.deps.len());
    for (target, on) in &extra.deps {
        let parent = match target {
            DepTarget::Key(k) => {
                if key.as_ref() == Some(k) {
                    return Err(cycle());
                }
                let found = st.keys.get(&**k).copied().or_else(|| {
                    let i = *batch?.get(&**k)?;
                    Some(st.next_id + i as TaskId)
                });
                match found {
                    Some(id) => id,
                    None if awaits => {
                        resolved.push((Resolved::Awaited(k.clone()), *on));
                        continue;
                    }
                    None => {
                        let msg = format!("unknown dependency {}", py_repr(k));
                        return Err(SubmitError::new("unknown_dependency", msg));
                    }
                }
            }
            DepTarget::Id(id) => {
                if !st.tasks.contains_key(id) {
                    let msg = format!("unknown dependency '{id}'");
                    return Err(SubmitError::new("unknown_dependency", msg));
                }
                *id
            }
        };
        resolved.push((Resolved::Parent(parent), *on));
    }
    extra.resolved = Some(resolved);
    Ok(())
}

/// The task a resolved parent names: an admitted one, or a batch-mate not admitted yet (by
/// the id it will get).
fn node<'a, R>(st: &'a State<R>, mates: &'a [TaskRecord], id: TaskId) -> Option<&'a TaskRecord> {
    match id.checked_sub(st.next_id) {
        Some(i) => mates.get(usize::try_from(i).ok()?),
        None => st.tasks.get(&id),
    }
}

/// The known parents of a task being admitted or blocked: those resolved at admission and
/// the awaited keys' tasks admitted since.
fn parents_of(rec: &TaskRecord) -> impl Iterator<Item = TaskId> + '_ {
    let extra = rec.extra.as_deref();
    let resolved = extra
        .and_then(|e| e.resolved.as_deref())
        .unwrap_or_default();
    let later = extra.map_or(&[][..], |e| &e.parents);
    resolved
        .iter()
        .filter_map(|(r, _)| match r {
            Resolved::Parent(id) => Some(*id),
            Resolved::Awaited(_) => None,
        })
        .chain(later.iter().copied())
}

/// A task whose key others await must not depend on any of them (after `resolve`; `mates`:
/// the batch's new records, in batch order).
pub(crate) fn check_await_cycle<R: Random>(
    st: &State<R>,
    rec: &TaskRecord,
    mates: &[TaskRecord],
) -> Result<(), SubmitError> {
    let (Some(key), Some(_)) = (&rec.key, &rec.extra) else {
        return Ok(());
    };
    let Some(awaiting) = st.deps.awaiting.get(key) else {
        return Ok(());
    };
    let waiting: HashSet<TaskId> = awaiting
        .iter()
        .filter(|(child, _)| {
            st.tasks.get(child).is_some_and(|c| {
                c.status == Status::Blocked
                    && c.extra.as_ref().is_some_and(|e| e.awaits.contains(key))
            })
        })
        .map(|&(child, _)| child)
        .collect();
    if !waiting.is_empty() && reaches(st, mates, rec, &waiting) {
        return Err(cycle());
    }
    Ok(())
}

/// Does any live ancestor reachable from the task's parents belong to `targets`? Only blocked
/// tasks wait on parents, so the walk goes on through blocked ones only.
fn reaches<R>(
    st: &State<R>,
    mates: &[TaskRecord],
    rec: &TaskRecord,
    targets: &HashSet<TaskId>,
) -> bool {
    let mut stack: Vec<TaskId> = parents_of(rec).collect();
    let mut seen: HashSet<TaskId> = HashSet::new();
    while let Some(p) = stack.pop() {
        if targets.contains(&p) {
            return true;
        }
        let Some(r) = node(st, mates, p) else {
            continue; // forgotten: it ended
        };
        if r.status != Status::Blocked || !seen.insert(p) {
            continue;
        }
        stack.extend(parents_of(r));
    }
    false
}

/// The batch (`new`, whose ids will be `base`, `base + 1`, ...) in an order where each task
/// comes after its parents in the batch, as indices (stable: a depth-first walk from each
/// task in batch order); `cycle` if there is none.
pub(crate) fn parents_first(new: &[TaskRecord], base: TaskId) -> Result<Vec<usize>, SubmitError> {
    const ON_PATH: u8 = 1;
    const PLACED: u8 = 2;
    let mates = |rec: &TaskRecord| -> Vec<usize> {
        let Some(resolved) = rec.extra.as_ref().and_then(|e| e.resolved.as_ref()) else {
            return Vec::new();
        };
        resolved
            .iter()
            .filter_map(|(r, _)| match r {
                Resolved::Parent(id) => id.checked_sub(base).map(|i| i as usize),
                Resolved::Awaited(_) => None,
            })
            .collect()
    };
    let mut order = Vec::with_capacity(new.len());
    let mut state = vec![0u8; new.len()];
    for root in 0..new.len() {
        if state[root] == PLACED {
            continue;
        }
        let mut stack: Vec<(usize, Vec<usize>, usize)> = vec![(root, mates(&new[root]), 0)];
        state[root] = ON_PATH;
        while let Some((rec, parents, i)) = stack.last_mut() {
            if let Some(&p) = parents.get(*i) {
                *i += 1;
                match state[p] {
                    ON_PATH => return Err(cycle()),
                    PLACED => {}
                    _ => {
                        state[p] = ON_PATH;
                        stack.push((p, mates(&new[p]), 0));
                    }
                }
            } else {
                state[*rec] = PLACED;
                order.push(*rec);
                stack.pop();
            }
        }
    }
    Ok(order)
}

/// The ids and keys that live tasks name as dependencies: ended tasks `Engine::delete` must
/// keep (their dependents need their outcome).
#[derive(Debug, Default)]
pub(crate) struct Needed {
    ids: HashSet<TaskId>,
    keys: HashSet<Arc<str>>,
}

impl Needed {
    /// A scan of the live tasks with dependencies, which only a deletion pays for.
    pub fn of(tasks: &Tasks) -> Self {
        let mut out = Needed::default();
        for rec in tasks.values() {
            let Some(extra) = &rec.extra else { continue };
            if rec.status >= FIRST_TERMINAL {
                continue;
            }
            for (target, _) in &extra.deps {
                match target {
                    DepTarget::Id(id) => out.ids.insert(*id),
                    DepTarget::Key(key) => out.keys.insert(key.clone()),
                };
            }
        }
        out
    }

    /// Does a live task name this one, by its id or its key?
    pub fn names(&self, rec: &TaskRecord) -> bool {
        self.ids.contains(&rec.id) || rec.key.as_ref().is_some_and(|k| self.keys.contains(k))
    }
}

/// The held tasks submitted with a dependency on `rec` (by its id, or by its key while it
/// holds it), each with its first such edge's condition, in id order: a scan of every held
/// task, for readers (`Extras::children` lists only the dependents still waiting).
pub(crate) fn dependents(tasks: &Tasks, rec: &TaskRecord) -> Vec<(TaskId, DepOn)> {
    let mut out: Vec<(TaskId, DepOn)> = Vec::new();
    for child in tasks.values() {
        let Some(extra) = &child.extra else { continue };
        let edge = extra.deps.iter().find(|(target, _)| match target {
            DepTarget::Id(id) => *id == rec.id,
            DepTarget::Key(key) => rec.key.as_ref() == Some(key),
        });
        if let Some(&(_, on)) = edge {
            out.push((child.id, on));
        }
    }
    out.sort_by_key(|&(id, _)| id);
    out
}

/// The primitives' side of the graph (Python's `state.DepsHooks`): called by `State::admit`
/// and `State::finish`, and by the await timer.
impl<R: Random> State<R> {
    /// A task with `key` was admitted: it becomes the parent of the tasks awaiting it.
    pub(crate) fn key_admitted(&mut self, id: TaskId, key: &str) {
        let edges = self.deps.awaiting.remove(key).unwrap_or_default();
        for (child, on) in edges {
            let Some(c) = self.tasks.get_mut(&child) else {
                continue; // forgotten: it ended
            };
            if c.status != Status::Blocked {
                continue;
            }
            let e = c.extra_mut();
            e.awaits.retain(|k| &**k != key);
            e.parents.push(id);
            let rec = self
                .tasks
                .get_mut(&id)
                .expect("a task being admitted is held");
            rec.extra_mut().children.push((child, on));
        }
    }

    /// Link a task being admitted to its parents: it waits for the live ones, is skipped if
    /// an ended one did not meet its edge (the last such one names the status), and is
    /// released if every edge is met.
    pub(crate) fn attach(&mut self, id: TaskId, now: f64) {
        let rec = self
            .tasks
            .get_mut(&id)
            .expect("a task being admitted is held");
        let (p, submitted_at) = (rec.pool, rec.submitted_at);
        // (none for a fixed start without dependencies: it is released at once)
        let edges = rec.extra_mut().resolved.take().unwrap_or_default();
        let timeout = self.pools[p].cfg.await_timeout;
        let mut waiting = 0u32;
        let mut dead: Option<Status> = None;
        for (edge, on) in &edges {
            match edge {
                Resolved::Awaited(key) => {
                    let list = self.deps.awaiting.entry(key.clone()).or_default();
                    list.push((id, *on));
                    let e = self.tasks.get_mut(&id).expect("held").extra_mut();
                    if !e.awaits.contains(key) {
                        e.awaits.push(key.clone());
                    }
                    if let Some(t) = timeout {
                        let when = submitted_at + py_max(0.0, t);
                        self.timers.set(when, Timer::Await { task: id });
                    }
                    waiting += 1;
                }
                Resolved::Parent(parent) => {
                    let status = match self.tasks.get(parent) {
                        Some(r) => r.status,
                        None => *self
                            .deps
                            .tombs
                            .as_ref()
                            .and_then(|t| t.get(parent))
                            .expect("a parent forgotten during the submit"),
                    };
                    if status < FIRST_TERMINAL {
                        let r = self.tasks.get_mut(parent).expect("a live task is held");
                        r.extra_mut().children.push((id, *on));
                        waiting += 1;
                    } else if !edge_met(status, *on) {
                        dead = Some(status);
                    }
                }
            }
        }
        if let Some(dead) = dead {
            let msg = format!("dependency ended as {dead}");
            self.finish(id, Status::Skipped, now, Some(&msg));
        } else if waiting > 0 {
            let keep = !self.deps.awaiting.is_empty();
            let e = self.tasks.get_mut(&id).expect("held").extra_mut();
            e.waiting = waiting;
            if keep {
                e.resolved = Some(edges);
            }
        } else {
            self.release(id, now);
        }
    }

    /// A task with waiting children ended with `status`: settle their edges (skips cascade,
    /// breadth first, as Python's queue does).
    pub(crate) fn deps_ended(&mut self, id: TaskId, status: Status, children: Children, now: f64) {
        self.deps.cascade.push_back((id, status, children));
        if self.deps.settling {
            return; // the loop below, already running, takes it
        }
        self.deps.settling = true;
        while let Some((parent, status, children)) = self.deps.cascade.pop_front() {
            for (child, on) in children {
                let Some(c) = self.tasks.get_mut(&child) else {
                    continue; // forgotten: it ended
                };
                if c.status != Status::Blocked {
                    continue;
                }
                if edge_met(status, on) {
                    let e = c.extra_mut();
                    e.waiting -= 1;
                    if e.waiting == 0 {
                        self.release(child, now);
                    }
                } else {
                    let msg = format!("dependency {parent} ended as {status}");
                    self.finish(child, Status::Skipped, now, Some(&msg));
                }
            }
        }
        self.deps.settling = false;
    }

    /// The await timer of a task: skipped if it still awaits a key.
    pub(crate) fn await_expired(&mut self, id: TaskId, now: f64) {
        let awaits = self.tasks.get(&id).is_some_and(|r| {
            r.status == Status::Blocked && r.extra.as_ref().is_some_and(|e| !e.awaits.is_empty())
        });
        if awaits {
            self.finish(id, Status::Skipped, now, Some(MSG_AWAIT_TIMEOUT));
        }
    }
}
