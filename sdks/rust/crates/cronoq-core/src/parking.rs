//! Ready tasks that wait outside the ready queues (Python: `cronoq.core.parking`): on a
//! resource that is short, or for a free slot of a worker group that carries their labels.
//!
//! Dispatch pops the best ready task; if it cannot get its resources or a matching slot it is
//! *parked* there (so it never blocks the tasks behind it) and offered again when the resource
//! or group can serve it: the next dispatch after an attempt ended, permits came back, a bucket
//! refilled or a slot was added. Offered tasks go back into their ready queues (they still
//! compete by score); `Parking::offered` lets the dispatch loop offer again if one did not
//! start. Requests for the same resource amounts share one resolved list (few distinct
//! requests exist).
//!
//! Python's `Parking` holds the engine's pools, resources and timers; here the resources are
//! `Parking`'s and the rules that also reach pools, tasks and timers are `State` methods.

use std::collections::HashMap;
use std::sync::Arc;

use crate::groups::{Groups, Pick};
use crate::model::{ConfigError, Status, SubmitError, TaskId, py_cmp, py_repr};
use crate::pool::PoolState;
use crate::resources::{self, Offer, ParkEntry, ResourceConfig, ResourceState};
use crate::rng::Random;
use crate::state::{State, Tasks};
use crate::timers::Timer;

/// What a ready task outside its queue waits for (Python: `TaskRecord.parked`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Parked {
    /// The resource of this index (`Parking::resources`), short when it was parked.
    Resource(usize),
    /// A slot of a worker group of its pool that carries its labels.
    Group,
}

/// A task's resources resolved at submit: (resource index, amount) pairs, in the order asked.
pub type Wanted = Arc<[(usize, u32)]>;

/// Distinct resource requests remembered.
const WANTED_CACHE: usize = 1024;

/// Resource amounts as a Python dict made from them keeps them: a name given twice keeps its
/// first place and its last amount.
pub fn amounts_of(pairs: &[(&str, u32)]) -> Vec<(Arc<str>, u32)> {
    let mut out: Vec<(Arc<str>, u32)> = Vec::with_capacity(pairs.len());
    for &(name, amount) in pairs {
        match out.iter_mut().find(|(n, _)| &**n == name) {
            Some(entry) => entry.1 = amount,
            None => out.push((Arc::from(name), amount)),
        }
    }
    out
}

/// The engine's resources and what its offers of them and of worker-group slots need.
#[derive(Debug)]
pub struct Parking {
    /// The resources, in configuration order.
    pub resources: Vec<ResourceState>,
    /// An attempt ended (or slots came) since parked tasks were last offered resources.
    pub reoffer: bool,
    /// Tasks put back in a queue by a resource or group since the dispatch loop last looked.
    pub offered: Vec<TaskId>,
    index: HashMap<Arc<str>, usize>,
    wanted: HashMap<Vec<(Arc<str>, u32)>, Wanted>,
}

impl Parking {
    /// The resources of an engine at `now` (names unique).
    pub fn new(configs: &[ResourceConfig], now: f64) -> Result<Self, ConfigError> {
        let mut resources = Vec::with_capacity(configs.len());
        let mut index = HashMap::new();
        for cfg in configs {
            let r = ResourceState::new(cfg.clone(), now);
            if index.insert(r.name.clone(), resources.len()).is_some() {
                return Err(ConfigError(format!(
                    "duplicate resource name {}",
                    py_repr(&r.name)
                )));
            }
            resources.push(r);
        }
        Ok(Parking {
            resources,
            reoffer: false,
            offered: Vec::new(),
            index,
            wanted: HashMap::new(),
        })
    }

    /// The index of the resource with this name.
    pub fn resource(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Check requested amounts (`unknown_resource`, `resource_exceeds_capacity`, the first
    /// failing name in order) and return them as (resource, amount) pairs.
    pub fn resolve(&mut self, amounts: &[(Arc<str>, u32)]) -> Result<Wanted, SubmitError> {
        if let Some(wanted) = self.wanted.get(amounts) {
            return Ok(wanted.clone());
        }
        let mut pairs = Vec::with_capacity(amounts.len());
        for (name, amount) in amounts {
            let Some(r) = self.resource(name) else {
                let msg = format!("unknown resource {}", py_repr(name));
                return Err(SubmitError::new("unknown_resource", msg));
            };
            if *amount > self.resources[r].cfg.capacity() {
                let msg = format!(
                    "requested amount exceeds capacity of resource {}",
                    py_repr(name)
                );
                return Err(SubmitError::new("resource_exceeds_capacity", msg));
            }
            pairs.push((r, *amount));
        }
        let wanted: Wanted = pairs.into();
        if self.wanted.len() >= WANTED_CACHE {
            self.wanted.clear();
        }
        self.wanted.insert(amounts.to_vec(), wanted.clone());
        Ok(wanted)
    }

    /// Did a task offered since the last call not start? (Forgets the offers.) One forgotten
    /// meanwhile has ended: it did not start.
    pub fn unstarted_offers(&mut self, tasks: &Tasks) -> bool {
        if self.offered.is_empty() {
            return false;
        }
        let missed = self
            .offered
            .iter()
            .any(|id| tasks.get(id).is_none_or(|r| r.status != Status::Running));
        self.offered.clear();
        missed
    }
}

/// The pool's worker groups, made at its first group or labeled task: every attempt running
/// then is on an unlabeled slot.
pub fn make_groups(pool: &mut PoolState) -> &mut Groups {
    let busy = pool.busy;
    pool.groups.get_or_insert_with(|| Groups {
        unlabeled_busy: busy,
        ..Groups::default()
    })
}

/// A resource's offer of its level to the tasks parked on it (`resources::unpark`): the room
/// each pool has left, counted down as its tasks are let go.
struct ResourceOffer<'a, R> {
    st: &'a mut State<R>,
    r: usize,
    now: f64,
    room: Vec<(usize, i64)>,
}

impl<R: Random> Offer for ResourceOffer<'_, R> {
    fn live(&self, e: &ParkEntry) -> bool {
        e.is_live(self.st.tasks.get(&e.task), Parked::Resource(self.r))
    }

    fn fits(&mut self, task: TaskId) -> bool {
        let st = &mut *self.st;
        let rec = &st.tasks[&task];
        let wanted = rec.extra.as_ref().and_then(|e| e.wanted.clone());
        let wanted = wanted.expect("a task parked on a resource wants it");
        if wanted.len() > 1 && st.park_if_short(task, &wanted, self.now, false) {
            return false; // another of its resources is short: it now waits there
        }
        let p = st.tasks[&task].pool;
        let left = match self.room.iter_mut().find(|(q, _)| *q == p) {
            Some(entry) => {
                entry.1 -= 1;
                entry.1 + 1
            }
            None => {
                let left = st.pools[p].free_for_queue();
                self.room.push((p, left - 1));
                left
            }
        };
        left > 0
    }
}

impl<R: Random> State<R> {
    // --- resources ---------------------------------------------------------------------------

    /// Take the task's resources, or (with `park`) park it on the first one that is short.
    pub(crate) fn acquire(&mut self, id: TaskId, now: f64, park: bool) -> bool {
        let wanted = self.tasks[&id]
            .extra
            .as_ref()
            .and_then(|e| e.wanted.clone());
        let Some(wanted) = wanted else {
            return true;
        };
        let resources = &mut self.parking.resources;
        if wanted
            .iter()
            .any(|&(r, amount)| !resources[r].available(amount, now))
        {
            if park {
                self.park_if_short(id, &wanted, now, false);
            }
            return false;
        }
        for &(r, amount) in wanted.iter() {
            resources[r].take(amount, now);
        }
        true
    }

    /// Is one of the task's resources short now (or, with `behind_waiters`, does one have
    /// tasks waiting, dead entries included as in Python)? Then park it there.
    pub(crate) fn park_if_short(
        &mut self,
        id: TaskId,
        wanted: &[(usize, u32)],
        now: f64,
        behind_waiters: bool,
    ) -> bool {
        for &(r, amount) in wanted {
            let res = &mut self.parking.resources[r];
            let short = !res.available(amount, now);
            if short || (behind_waiters && !res.parked.is_empty()) {
                let rec = self.tasks.get_mut(&id).expect("a ready task is held");
                res.parked.push(ParkEntry::park(rec, amount));
                rec.parked = Some(Parked::Resource(r));
                if !short {
                    self.parking.reoffer = true; // the next dispatch offers what is free
                } else if res.is_bucket() {
                    self.bucket_wake(r, amount, now);
                }
                return true;
            }
        }
        false
    }

    /// Wake when the bucket holds `amount` tokens, unless an earlier wake is set (a superseded
    /// later timer is ignored when it fires: its time is no longer the resource's `wake`).
    fn bucket_wake(&mut self, r: usize, amount: u32, now: f64) {
        let res = &mut self.parking.resources[r];
        let when = res.ready_at(amount, now);
        if res.wake.is_none_or(|wake| when < wake) {
            res.wake = Some(when);
            let timer = Timer::Refill {
                resource: r,
                when: when.to_bits(),
            };
            self.timers.set(when, timer);
        }
    }

    /// A bucket's refill timer set for `when` fired.
    pub(crate) fn on_tokens(&mut self, r: usize, when: f64, now: f64) {
        let res = &mut self.parking.resources[r];
        if res.wake == Some(when) {
            res.wake = None;
            self.unpark_resource(r, now);
        }
    }

    /// Put back in their ready queues the parked tasks the resource can serve now, best first,
    /// skipping tasks whose pool has no free slot (they would only park again).
    fn unpark_resource(&mut self, r: usize, now: f64) {
        // Out of the resource while it is offered: `fits` may park a task on another one
        // (never on this one, which can serve it).
        let mut parked = std::mem::take(&mut self.parking.resources[r].parked);
        let budget = self.parking.resources[r].level(now);
        let mut offer = ResourceOffer {
            st: self,
            r,
            now,
            room: Vec::new(),
        };
        let (out, short) = resources::unpark(&mut parked, budget, &mut offer);
        let res = &mut self.parking.resources[r];
        debug_assert!(res.parked.is_empty());
        res.parked = parked;
        let bucket = res.is_bucket();
        for &id in &out {
            let rec = self.tasks.get_mut(&id).expect("a parked task is held");
            rec.parked = None;
            self.pools[rec.pool].queues.push(rec);
        }
        self.parking.offered.extend(out);
        if let Some(short) = short
            && bucket
        {
            self.bucket_wake(r, short, now);
        }
    }

    // --- worker groups -----------------------------------------------------------------------

    /// The worker-group slot the task would run on in pool `p`; with `park`, parked when
    /// none is free.
    pub(crate) fn slot_for(&mut self, id: TaskId, p: usize, park: bool) -> Pick {
        let pool = &mut self.pools[p];
        let unlabeled = pool.unlabeled;
        let groups = make_groups(pool);
        let rec = self.tasks.get_mut(&id).expect("a ready task is held");
        let slot = groups.pick(rec.labels.as_deref(), unlabeled);
        if park && slot == Pick::Full {
            groups.park(rec);
        }
        slot
    }

    /// Put back in their queues the tasks parked for group `g` of pool `p` that it can serve.
    pub(crate) fn unpark_labeled(&mut self, p: usize, g: usize) {
        let groups = self.pools[p].groups.as_mut().expect("a pool with groups");
        let out = groups.unpark(g, &self.tasks);
        for &id in &out {
            let rec = self.tasks.get_mut(&id).expect("a parked task is held");
            rec.parked = None;
            self.pools[p].queues.push(rec);
        }
        self.parking.offered.extend(out);
    }

    // --- offers ------------------------------------------------------------------------------

    /// Offer what resources and groups can serve now to the tasks parked on them.
    pub(crate) fn offer(&mut self, now: f64) {
        self.parking.reoffer = false;
        for r in 0..self.parking.resources.len() {
            if !self.parking.resources[r].parked.is_empty() {
                self.unpark_resource(r, now);
            }
        }
        for p in 0..self.pools.len() {
            let n = match &self.pools[p].groups {
                Some(groups) if !groups.parked.is_empty() => groups.by_key.len(),
                _ => continue,
            };
            for g in 0..n {
                let group = &self.pools[p].groups.as_ref().expect("groups").by_key[g];
                if group.busy < group.capacity {
                    self.unpark_labeled(p, g);
                }
            }
        }
    }

    /// Parked tasks may take what is free again (an attempt ended, slots came): the next
    /// dispatch offers it, when there are resources to offer.
    pub(crate) fn reoffer_if_resources(&mut self) {
        if !self.parking.resources.is_empty() {
            self.parking.reoffer = true;
        }
    }

    /// The newest (or oldest) ready task of a class of pool `p`, queued or parked: a scan,
    /// only run under overload, where max_pending bounds it.
    pub(crate) fn shed_candidate(&mut self, p: usize, cls: usize, newest: bool) -> Option<TaskId> {
        let q = &mut self.pools[p].queues.classes[cls];
        let head = if newest {
            q.newest(&self.tasks)
        } else {
            q.oldest(&self.tasks)
        };
        let tasks = &self.tasks;
        let mine = |e: &&ParkEntry| {
            tasks
                .get(&e.task)
                .is_some_and(|r| r.qgen == e.generation && r.pool == p && usize::from(r.cls) == cls)
        };
        let mut found: Vec<TaskId> = head.into_iter().collect();
        for r in &self.parking.resources {
            found.extend(r.parked.iter().filter(mine).map(|e| e.task));
        }
        if let Some(groups) = &self.pools[p].groups {
            found.extend(groups.parked.iter().filter(mine).map(|e| e.task));
        }
        if newest {
            found.into_iter().max_by_key(|id| tasks[id].seq)
        } else {
            found.into_iter().min_by(|a, b| {
                let (a, b) = (&tasks[a], &tasks[b]);
                py_cmp(a.eligible_at, b.eligible_at).then(a.seq.cmp(&b.seq))
            })
        }
    }

    /// Take a ready task out of wherever it waits: its ready queue or a parking heap (whose
    /// entry dies with the bumped generation).
    pub(crate) fn unqueue(&mut self, id: TaskId) {
        let rec = self.tasks.get_mut(&id).expect("a ready task is held");
        if rec.parked.is_some() {
            rec.parked = None;
            rec.qgen += 1;
        } else {
            let p = rec.pool;
            self.pools[p].queues.discard(id, &mut self.tasks);
        }
    }
}
