//! The engine: every scheduling rule of cronoq that this crate ports, with no I/O and no clock
//! (Python: `cronoq.core.engine`, whose module docstring is the theory of operation).
//!
//! A driver calls the engine with the current time. Each call changes the state and appends
//! what the driver must do to the outbox, an `Actions` drained with `take()`: `starts`
//! (attempts to run now), `aborts` (attempts given up on), `finished` (tasks that ended) and
//! `events` (status changes, as `EngineOptions::event_level` asks). The driver calls
//! `advance(now)` to fire due timers (retry backoff, attempt timeout, lease expiry, autoscaler
//! evaluations, token-bucket refills, fixed starts, recurring occurrences) and prune retained
//! tasks, `dispatch(now)` to fill free slots (and create the recurring occurrences due), drains the
//! outbox, and calls back at `next_wake()`: one timer for the whole engine. A driver with a
//! store also calls `take_journal()` after each turn for the rows to write.
//!
//! Differences from the Python driver interface, none of which changes a decision: attempts
//! are named by lease and tasks by id or key (Python passes the objects); records name their
//! pool and kind by number (`pool_name`, `kind_name`); payloads and outputs stay with the
//! driver; a call naming an unknown pool returns an error (Python raises KeyError), and so
//! does `move_attempt` for an attempt that has ended (Python would count it off its group
//! again); labels and resource amounts are slices of pairs, read as a Python dict reads them.
//! `snapshot(now)` gives each pool's state and quality metrics, as Python's does.
//!
//! Determinism: the same calls with the same times and the same seeded `Random` give the same
//! decisions; jitter is the only use of randomness.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::actions::{Actions, Journal, ScheduleRow};
use crate::deps::{self, Needed};
use crate::dispatch::fill;
use crate::groups::{label_key, labels_of};
use crate::model::{
    AbortReason, Attempt, ConfigError, FIRST_TERMINAL, KindId, Lease, Observer, Outcome,
    PoolConfig, PoolSnapshot, ReadyView, Scoring, Snapshot, Status, SubmitError, TaskId,
    TaskRecord, TaskSpec, Totals, UnknownPool, check_seconds, py_repr,
};
use crate::parking::{Parking, Wanted, amounts_of, make_groups};
use crate::pool::PoolState;
use crate::pyrepr::py_float_repr;
use crate::recurring::Recurring;
use crate::resources::ResourceConfig;
use crate::rng::{MersenneTwister, Random};
use crate::schedules;
use crate::state::{EventLevel, State};
use crate::table::FastBuild;
use crate::vocab::{DepOn, NUM_CLASSES, Overflow};

/// The message of a cancelled task.
pub const MSG_CANCELLED: &str = "cancelled";
/// The message of a task shed under overload.
pub const MSG_SHED: &str = "shed under overload";
/// How long an ended task stays findable by default (seconds).
pub const DEFAULT_RETENTION: f64 = 3600.0;
/// How many ended tasks stay findable at most by default.
pub const DEFAULT_RETENTION_MAX: usize = 100_000;

/// How an engine is set up, beyond its pools and its randomness.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    /// The dispatch score's parameters.
    pub scoring: Scoring,
    /// Which status changes become events.
    pub event_level: EventLevel,
    /// Seconds an ended task stays findable.
    pub retention: f64,
    /// Most ended tasks kept.
    pub retention_max: usize,
    /// The first task id.
    pub first_id: TaskId,
    /// Keep a journal of what changed, for a driver with a store.
    pub journal: bool,
    /// The autoscalers' targets become the pools' capacity. False: capacity comes from
    /// outside (remote workers' grants) and the autoscalers only compute `desired`, for
    /// external scalers to act on.
    pub elastic: bool,
    /// The resources every pool's tasks may take (names unique).
    pub resources: Vec<ResourceConfig>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            scoring: Scoring::default(),
            event_level: EventLevel::None,
            retention: DEFAULT_RETENTION,
            retention_max: DEFAULT_RETENTION_MAX,
            first_id: 1,
            journal: false,
            elastic: true,
            resources: Vec::new(),
        }
    }
}

/// A task named by id or by key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskRef<'a> {
    /// By id.
    Id(TaskId),
    /// By the key it holds.
    Key(&'a str),
}

/// The scheduling state machine. See the module docs for how a driver uses it.
#[derive(Debug)]
pub struct Engine<R = MersenneTwister> {
    pub(crate) st: State<R>,
    kinds: HashMap<Arc<str>, KindId, FastBuild>,
    kind_names: Vec<Arc<str>>,
    retention: f64,
    bounded: bool,
    dispatching: bool,
    /// Pools no longer configured that restored tasks name (`TaskRecord::pool` past `pools`).
    retired: Vec<Arc<str>>,
}

impl Engine<MersenneTwister> {
    /// An engine jittering as Python's default one does (`random.Random(0)`).
    pub fn with_defaults(pools: Vec<PoolConfig>, now: f64) -> Result<Self, ConfigError> {
        Engine::new(
            pools,
            now,
            EngineOptions::default(),
            MersenneTwister::new(0),
        )
    }
}

impl<R: Random> Engine<R> {
    /// An engine over these pools (at least one, names unique, tenant weights finite and > 0,
    /// autoscaled ones with `min <= max`) and the resources of `options`, starting at `now` (the pool statistics count from
    /// there and the autoscalers first evaluate then), jittering with `rng`.
    pub fn new(
        pools: Vec<PoolConfig>,
        now: f64,
        options: EngineOptions,
        rng: R,
    ) -> Result<Self, ConfigError> {
        let bounded = pools.iter().any(|p| p.max_pending.is_some());
        let st = State::new(pools, now, rng, &options)?;
        Ok(Engine {
            st,
            kinds: HashMap::default(),
            kind_names: Vec::new(),
            retention: options.retention,
            bounded,
            dispatching: true,
            retired: Vec::new(),
        })
    }

    // --- reading ---------------------------------------------------------------------------

    /// Tasks not ended yet.
    pub fn live(&self) -> u64 {
        self.st.live
    }

    /// The counters.
    pub fn totals(&self) -> &Totals {
        &self.st.totals
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> &[PoolState] {
        &self.st.pools
    }

    /// The pool with this name.
    pub fn pool(&self, name: &str) -> Option<&PoolState> {
        self.st.pool_index.get(name).map(|&i| &self.st.pools[i])
    }

    /// The running attempts, in start order.
    pub fn running(&self) -> impl Iterator<Item = &Attempt> {
        self.st.running.values()
    }

    /// A running attempt by lease.
    pub fn attempt(&self, lease: Lease) -> Option<&Attempt> {
        self.st.running.get(&lease)
    }

    /// A live or retained task by id or key.
    pub fn lookup(&self, r: TaskRef<'_>) -> Option<&TaskRecord> {
        let id = match r {
            TaskRef::Id(id) => id,
            TaskRef::Key(key) => *self.st.keys.get(key)?,
        };
        self.st.tasks.get(&id)
    }

    /// The live and retained tasks submitted with a dependency on this one (by its id, or by
    /// its key while it holds it), each with the edge's condition, in id order; None if the
    /// task is not held. A scan of every held task, for readers: `Extras::children` lists
    /// only the dependents still waiting.
    pub fn dependents(&self, r: TaskRef<'_>) -> Option<Vec<(TaskId, DepOn)>> {
        let rec = self.lookup(r)?;
        Some(deps::dependents(&self.st.tasks, rec))
    }

    /// The live and retained tasks, in no particular order.
    pub fn tasks(&self) -> impl Iterator<Item = &TaskRecord> {
        self.st.tasks.values()
    }

    /// The id the next admitted task will get.
    pub fn next_id(&self) -> TaskId {
        self.st.next_id
    }

    /// Tasks waiting for a slot, in every pool.
    pub fn pending(&self) -> i64 {
        self.st.pools.iter().map(PoolState::pending).sum()
    }

    /// Can the pool take `n` more pending tasks without its overflow policy?
    pub fn has_room(&self, pool: &str, n: i64) -> Result<bool, UnknownPool> {
        Ok(self.st.pools[self.pool_id(pool)?].has_room(n))
    }

    /// Which status changes become events.
    pub fn event_level(&self) -> EventLevel {
        self.st.event_level
    }

    /// Change which status changes become events (a driver may do so any time).
    pub fn set_event_level(&mut self, level: EventLevel) {
        self.st.event_level = level;
    }

    /// When the driver must call `advance()` next (None: only when something happens).
    pub fn next_wake(&self) -> Option<f64> {
        let mut t = self.st.timers.next_time();
        if let Some(&(_, finished_at)) = self.st.retained.front() {
            let r = finished_at + self.retention;
            if t.is_none_or(|t| r < t) {
                t = Some(r);
            }
        }
        t
    }

    fn pool_id(&self, name: &str) -> Result<usize, UnknownPool> {
        self.st
            .pool_index
            .get(name)
            .copied()
            .ok_or_else(|| UnknownPool(name.to_string()))
    }

    // --- driver interface ------------------------------------------------------------------

    /// Hand the accumulated actions to the driver and start a fresh outbox.
    pub fn take(&mut self) -> Actions {
        // The next outbox is sized as this one: a driver in a steady state allocates each
        // list once per turn instead of growing it.
        let next = self.st.out.sized_as();
        std::mem::replace(&mut self.st.out, next)
    }

    /// `take` into the driver's own lists: `spent`, whose actions the driver has carried out,
    /// is emptied and becomes the next outbox, and receives the accumulated actions. A driver
    /// that hands the same lists back each turn allocates none (their room is kept, up to the
    /// most a fresh outbox gets), where `take` allocates fresh ones.
    pub fn take_into(&mut self, spent: &mut Actions) {
        spent.clear_within_room();
        std::mem::swap(&mut self.st.out, spent);
    }

    /// Hand what changed since the last call to a driver with a store (None: the engine
    /// keeps no journal).
    pub fn take_journal(&mut self) -> Option<Journal> {
        let log = std::mem::take(self.st.journal.as_mut()?);
        let tasks = &self.st.tasks;
        let row = |id: &TaskId| -> TaskRecord {
            tasks
                .get(id)
                .or_else(|| log.gone.get(id))
                .expect("a journaled task is held or kept")
                .clone()
        };
        let current = &self.st.schedules;
        let schedules = log
            .schedules
            .iter()
            .filter(|&&(_, id)| current.is_current(id))
            .map(|(name, _)| {
                let sched = current.get(name).expect("a current schedule");
                ScheduleRow {
                    name: name.clone(),
                    next_time: sched.next_time(),
                    last: sched.last(),
                }
            })
            .collect();
        Some(Journal {
            added: log.added.iter().map(row).collect(),
            changed: log.changed.iter().map(row).collect(),
            schedules,
            pools: log.pools.clone(),
            deleted: log.deleted.clone(),
        })
    }

    // --- submission --------------------------------------------------------------------------

    /// The record of a spec, checked as Python's edge checks a submit (unknown pool, class,
    /// fixed start and tolerance, labels). (Inlined, as `submit_record`: a record is large, and
    /// each call it passes through by value copies it.)
    #[inline(always)]
    pub(crate) fn record(&mut self, spec: TaskSpec<'_>) -> Result<TaskRecord, SubmitError> {
        let Some(&pool) = self.st.pool_index.get(spec.pool) else {
            let msg = format!("unknown pool {}", py_repr(spec.pool));
            return Err(SubmitError::new("unknown_pool", msg));
        };
        if usize::from(spec.cls) >= NUM_CLASSES {
            return Err(SubmitError::new("invalid", "priority must be 0..=3"));
        }
        if let Some(start) = spec.start_at
            && !start.is_finite()
        {
            let msg = format!(
                "start_at must be a finite number of Unix seconds (got {})",
                py_float_repr(start)
            );
            return Err(SubmitError::new("invalid", msg));
        }
        // (checked even without a fixed start, as Python's edge does)
        check_seconds("tolerance", spec.tolerance).map_err(|m| SubmitError::new("invalid", m))?;
        let kind = self.kind_id(spec.kind);
        let rec = TaskRecord::from_spec(spec, pool, kind);
        if let Some(extra) = &rec.extra
            && extra.resources.iter().any(|&(_, amount)| amount == 0)
        {
            let msg = "invalid task: resource amount must be > 0";
            return Err(SubmitError::new("invalid", msg));
        }
        Ok(rec)
    }

    /// The number of a kind, interned at its first use (inlined: a submission's hot path).
    #[inline(always)]
    pub(crate) fn kind_id(&mut self, name: &str) -> KindId {
        match self.kinds.get(name) {
            Some(&kind) => kind,
            None => {
                let name: Arc<str> = Arc::from(name);
                let kind = KindId::try_from(self.kind_names.len()).expect("fewer than 2^32 kinds");
                self.kinds.insert(name.clone(), kind);
                self.kind_names.push(name);
                kind
            }
        }
    }

    /// The index restored tasks of a pool no longer configured get (past the pools).
    pub(crate) fn retired_pool(&mut self, name: &str) -> usize {
        let i = match self.retired.iter().position(|n| &**n == name) {
            Some(i) => i,
            None => {
                self.retired.push(Arc::from(name));
                self.retired.len() - 1
            }
        };
        self.st.pools.len() + i
    }

    /// Admit a task; a live or retained key returns (the existing task, true). On an error
    /// nothing changed. The spec is checked first (as Python's edge builds the record before
    /// the engine sees it), then the key, then its resources, reservation and dependencies. A
    /// task with dependencies is blocked until they end as its edges ask
    /// (`unknown_dependency` for an id or key no task holds, unless its pool awaits keys;
    /// `cycle` for its own key, or an ancestor awaiting its key).
    pub fn submit(&mut self, spec: TaskSpec<'_>, now: f64) -> Result<(TaskId, bool), SubmitError> {
        let rec = self.record(spec)?;
        if let Some(key) = spec.key
            && let Some(&old) = self.st.keys.get(key)
        {
            return Ok((old, true));
        }
        Ok((self.submit_record(rec, now)?, false))
    }

    /// Admit a checked record whose key is free: its resources, reservation and dependencies, the pool's
    /// overflow policy (Python's `submit` past the key check).
    #[inline(always)]
    pub(crate) fn submit_record(
        &mut self,
        mut rec: TaskRecord,
        now: f64,
    ) -> Result<TaskId, SubmitError> {
        let special = rec.extra.is_some();
        if special {
            self.st.resolve_resources(&mut rec)?;
            if rec.start_at().is_some() {
                self.st.check_reservation(&rec)?;
            }
            deps::resolve(&self.st, &mut rec, None)?;
            deps::check_await_cycle(&self.st, &rec, &[])?;
            self.st.deps.open_tombs();
        }
        let mut made = Ok(());
        if self.st.pools[rec.pool].cfg.max_pending.is_some() {
            made = self.make_room(&rec, now);
        }
        let out = made.map(|()| self.st.admit(rec, now));
        if special {
            self.st.deps.close_tombs();
        }
        out
    }

    /// Admit every task of a batch, or none (an error before anything changes). A key taken
    /// already returns its task, with true; a key twice in the batch is an error. Every spec
    /// is checked first, then the keys, then each new task's resources, reservation and
    /// dependencies in batch order.
    /// Dependencies may name keys defined anywhere in the batch (forward references): parents
    /// in the batch are admitted first, ids follow the batch order, and a cycle is refused.
    pub fn submit_batch(
        &mut self,
        specs: &[TaskSpec<'_>],
        now: f64,
    ) -> Result<Vec<(TaskId, bool)>, SubmitError> {
        let mut new: Vec<TaskRecord> = Vec::with_capacity(specs.len());
        for &spec in specs {
            new.push(self.record(spec)?);
        }
        let mut seen: HashSet<&str> = HashSet::new();
        // the batch's new keys, by index into `new`
        let mut fresh: HashMap<&str, usize> = HashMap::new();
        // (existing task) or (index into `new`)
        let mut out: Vec<Result<TaskId, usize>> = Vec::with_capacity(specs.len());
        // Whether each record is of a new task; those of taken keys are dropped from `new`
        // afterwards, in place (a record moved is a large copy).
        let mut keep: Vec<bool> = Vec::with_capacity(specs.len());
        let mut kept = 0;
        for &spec in specs {
            if let Some(key) = spec.key {
                if !seen.insert(key) {
                    let msg = format!("duplicate key {} in batch", py_repr(key));
                    return Err(SubmitError::new("duplicate_key_in_batch", msg));
                }
                if let Some(&old) = self.st.keys.get(key) {
                    out.push(Ok(old));
                    keep.push(false);
                    continue;
                }
                fresh.insert(key, kept);
            }
            out.push(Err(kept));
            keep.push(true);
            kept += 1;
        }
        if kept < new.len() {
            let mut keep = keep.into_iter();
            new.retain(|_| keep.next().unwrap_or(false));
        }
        let special = new.iter().any(|rec| rec.extra.is_some());
        let mut order = None;
        if special {
            // The batch's reservations count against each other; each task is checked in
            // batch order (its resources, reservation, then its dependencies), as Python's
            // `_check`.
            self.st.fixed.in_batch = true;
            let checked = new.iter_mut().try_for_each(|rec| {
                self.st.resolve_resources(rec)?;
                if rec.start_at().is_some() {
                    self.st.check_reservation(rec)?;
                }
                deps::resolve(&self.st, rec, Some(&fresh))
            });
            self.st.fixed.end_batch();
            checked?;
            for rec in &new {
                // every batch-mate's parents are known now
                deps::check_await_cycle(&self.st, rec, &new)?;
            }
            order = Some(deps::parents_first(&new, self.st.next_id)?);
        }
        if self.bounded {
            let mut per_pool: Vec<(usize, i64)> = Vec::new();
            for rec in &new {
                match per_pool.iter_mut().find(|(p, _)| *p == rec.pool) {
                    Some(entry) => entry.1 += 1,
                    None => per_pool.push((rec.pool, 1)),
                }
            }
            for (p, n) in per_pool {
                let pool = &self.st.pools[p];
                if let Some(cap) = pool.cfg.max_pending
                    && pool.pending() + n > i64::from(cap)
                {
                    return Err(SubmitError::new("overloaded", "overloaded"));
                }
            }
        }
        for rec in &mut new {
            self.st.assign_id(rec);
        }
        let ids: Vec<TaskId> = new.iter().map(|rec| rec.id).collect();
        match order {
            None => new.into_iter().for_each(|rec| {
                self.st.admit(rec, now);
            }),
            Some(order) => {
                let mut slots: Vec<Option<TaskRecord>> = new.into_iter().map(Some).collect();
                self.st.deps.open_tombs();
                for i in order {
                    let rec = slots[i].take().expect("each task once");
                    self.st.admit(rec, now);
                }
                self.st.deps.close_tombs();
            }
        }
        Ok(out
            .into_iter()
            .map(|o| match o {
                Ok(old) => (old, true),
                Err(i) => (ids[i], false),
            })
            .collect())
    }

    /// Apply the pool's overflow policy when admitting would exceed max_pending.
    fn make_room(&mut self, rec: &TaskRecord, now: f64) -> Result<(), SubmitError> {
        let p = rec.pool;
        let pool = &self.st.pools[p];
        let cap = pool.cfg.max_pending.expect("a bounded pool");
        if pool.pending() < i64::from(cap) {
            return Ok(());
        }
        let mut victim = None;
        match pool.cfg.overflow {
            Overflow::Wait => return Err(SubmitError::new("full", "queue full")),
            Overflow::Reject => {}
            Overflow::ShedLowest => {
                for c in (usize::from(rec.cls) + 1..=3).rev() {
                    victim = self.st.shed_candidate(p, c, true);
                    if victim.is_some() {
                        break;
                    }
                }
            }
            Overflow::ShedOldest => victim = self.st.shed_candidate(p, 3, false),
        }
        let Some(victim) = victim else {
            return Err(SubmitError::new("overloaded", "overloaded"));
        };
        self.st.unqueue(victim);
        self.st.finish(victim, Status::Shed, now, Some(MSG_SHED));
        Ok(())
    }

    /// Check requested resource amounts (`unknown_resource`, `resource_exceeds_capacity`) as
    /// a submit would, and return them as (resource index, amount) pairs.
    pub fn resolve_resources(&mut self, amounts: &[(&str, u32)]) -> Result<Wanted, SubmitError> {
        self.st.parking.resolve(&amounts_of(amounts))
    }

    // --- dispatch ----------------------------------------------------------------------------

    /// Start the due fixed starts and the best ready tasks on every free slot; then create
    /// the recurring occurrences whose timers fired and fill again. (They are created after
    /// the previous occurrence has taken its slot, so its reservation no longer counts
    /// against the next.)
    pub fn dispatch(&mut self, now: f64) {
        if !self.dispatching {
            return;
        }
        fill(&mut self.st, now);
        if schedules::create_due(self, now) {
            fill(&mut self.st, now);
        }
    }

    // --- recurring schedules ---------------------------------------------------------------

    /// Add or replace a schedule by name; the replaced schedule's occurrences not started yet
    /// are cancelled. Refused (nothing changes): a template a submit would refuse (unknown
    /// pool, class, tolerance, a resource amount of 0) or a deadline that is not a number of seconds.
    ///
    /// # Panics
    /// When `now` is outside years 1-9999 (Python raises `ValueError`), here and at the
    /// dispatches that plan the schedule's next occurrences.
    pub fn add_recurring(&mut self, sched: Recurring, now: f64) -> Result<(), SubmitError> {
        schedules::add(self, sched, now)
    }

    /// Take back a stored schedule: its next occurrence at `next_time` (created at once if
    /// that passed), its latest at `last`, and the held tasks that are occurrences of its
    /// name become its own. A schedule under that name is replaced, not removed. Refused as
    /// `add_recurring` is.
    pub fn resume_recurring(
        &mut self,
        sched: Recurring,
        next_time: Option<f64>,
        last: Option<TaskId>,
        now: f64,
    ) -> Result<(), SubmitError> {
        schedules::resume(self, sched, next_time, last, now)
    }

    /// Drop a schedule and cancel its occurrences not started yet (their keys are freed);
    /// false if no schedule has that name.
    pub fn remove_recurring(&mut self, name: &str, now: f64) -> bool {
        schedules::remove(self, name, now)
    }

    /// The schedules, in the order their names were added (a resumed name keeps its place).
    pub fn recurring(&self) -> impl Iterator<Item = &Recurring> {
        self.st.schedules.iter()
    }

    /// The schedule with this name.
    pub fn schedule(&self, name: &str) -> Option<&Recurring> {
        self.st.schedules.get(name)
    }

    // --- outcomes ----------------------------------------------------------------------------

    /// The attempt's executor succeeded. False if the attempt had already ended (counted in
    /// `stale_completions`, as is a lease the engine never gave).
    pub fn complete(&mut self, lease: Lease, now: f64) -> bool {
        if !self.st.running.contains_key(&lease) {
            self.st.totals.stale_completions += 1;
            return false;
        }
        let (att, runtime) = self.st.end_attempt(lease, now, true);
        let rec = &self.st.tasks[&att.task];
        self.st.pools[rec.pool].learn(rec.kind, runtime);
        self.st.finish(att.task, Status::Succeeded, now, None);
        true
    }

    /// The attempt failed: the task fails (`permanent`), is dead-lettered after its last
    /// attempt, or retries after its backoff (at least `retry_after`). False if the attempt
    /// had already ended.
    pub fn fail(
        &mut self,
        lease: Lease,
        now: f64,
        message: &str,
        permanent: bool,
        retry_after: Option<f64>,
    ) -> bool {
        if !self.st.running.contains_key(&lease) {
            self.st.totals.stale_completions += 1;
            return false;
        }
        let (att, _) = self.st.end_attempt(lease, now, false);
        self.st.after_failure(
            att.task,
            now,
            message,
            permanent,
            retry_after,
            Outcome::Failed,
        );
        true
    }

    /// Extend the attempt's lease to now + its time to live; false if it already ended.
    pub fn heartbeat(&mut self, lease: Lease, now: f64) -> bool {
        let Some(att) = self.st.running.get_mut(&lease) else {
            return false;
        };
        if let Some(ttl) = att.lease_ttl {
            att.lease_expiry = now + ttl;
        }
        true
    }

    // --- cancellation --------------------------------------------------------------------------

    /// Cancel a live task in any state; false if it is unknown or already ended.
    pub fn cancel(&mut self, r: TaskRef<'_>, now: f64) -> bool {
        let Some(rec) = self.lookup(r) else {
            return false;
        };
        if rec.status >= FIRST_TERMINAL {
            return false;
        }
        let (id, status, running) = (rec.id, rec.status, rec.running);
        if status == Status::Running {
            if let Some(lease) = running {
                // None after abort_running() at shutdown
                self.st.abort(lease, now, AbortReason::Cancelled);
            }
        } else if status == Status::Ready && !rec.extra.as_deref().is_some_and(|e| e.due) {
            // (due tasks are not queued)
            self.st.unqueue(id);
        }
        self.st
            .finish(id, Status::Cancelled, now, Some(MSG_CANCELLED));
        true
    }

    // --- operator controls -----------------------------------------------------------------

    /// Start nothing new in the pool until `resume` (submits are still admitted, running
    /// attempts go on, timers fire); false if it was paused already. (`now` as in Python's
    /// signature: pausing changes no metric.)
    pub fn pause(&mut self, pool: &str, _now: f64) -> Result<bool, UnknownPool> {
        let p = self.pool_id(pool)?;
        Ok(self.set_paused(p, true))
    }

    /// Let the pool start tasks again (the driver dispatches next); false if it was not
    /// paused.
    pub fn resume(&mut self, pool: &str, _now: f64) -> Result<bool, UnknownPool> {
        let p = self.pool_id(pool)?;
        if !self.set_paused(p, false) {
            return Ok(false);
        }
        self.st.reoffer_if_resources(); // its parked tasks may take what others left free
        Ok(true)
    }

    fn set_paused(&mut self, p: usize, paused: bool) -> bool {
        let pool = &mut self.st.pools[p];
        if pool.paused == paused {
            return false;
        }
        pool.paused = paused;
        if let Some(j) = &mut self.st.journal {
            j.pool(&pool.name, paused);
        }
        true
    }

    /// Forget ended tasks now rather than at the end of their retention (an operator's
    /// clean-up); returns the ids deleted. Skipped: live tasks, tasks no longer held, and
    /// ended tasks that a live task names as a dependency (it needs their outcome).
    pub fn delete(&mut self, ids: &[TaskId]) -> Vec<TaskId> {
        let st = &mut self.st;
        let needed = Needed::of(&st.tasks);
        let mut out = Vec::new();
        for &id in ids {
            match st.tasks.get(&id) {
                Some(rec) if rec.status >= FIRST_TERMINAL && !needed.names(rec) => {}
                _ => continue,
            }
            st.forget(id);
            out.push(id);
        }
        if !out.is_empty() {
            if let Some(j) = &mut st.journal {
                j.deleted.extend(&out);
            }
            if st.retained.len() > 2 * st.tasks.len() + 1024 {
                // drop the deleted ones it still holds
                let tasks = &st.tasks;
                st.retained.retain(|(id, _)| tasks.contains_key(id));
            }
        }
        out
    }

    // --- capacity ------------------------------------------------------------------------------

    /// Set the pool's unlabeled slots (worker groups keep theirs).
    pub fn set_capacity(&mut self, pool: &str, n: u32, now: f64) -> Result<(), UnknownPool> {
        let p = self.pool_id(pool)?;
        self.st.set_capacity(p, i64::from(n), now);
        Ok(())
    }

    /// Declare or resize the worker group of the pool carrying exactly `labels` (0 removes
    /// its slots; the group goes when nothing runs on it any more).
    pub fn set_group_capacity(
        &mut self,
        pool: &str,
        labels: &[(&str, &str)],
        n: u32,
        now: f64,
    ) -> Result<(), UnknownPool> {
        let p = self.pool_id(pool)?;
        let st = &mut self.st;
        let pool = &mut st.pools[p];
        let unlabeled = pool.unlabeled;
        let groups = make_groups(pool);
        let g = groups.set(labels_of(labels), i64::from(n));
        let capacity = unlabeled + groups.total();
        pool.stats.level(now, pool.busy, capacity);
        pool.capacity = capacity;
        if let Some(g) = g {
            st.unpark_labeled(p, g);
        }
        st.reoffer_if_resources();
        Ok(())
    }

    /// Has the pool's worker group with exactly these labels (empty: the unlabeled slots) a
    /// free slot? A pool without worker groups answers true: all its slots are alike.
    pub fn group_has_room(&self, pool: &str, labels: &[(&str, &str)]) -> Result<bool, UnknownPool> {
        let pool = &self.st.pools[self.pool_id(pool)?];
        let Some(groups) = &pool.groups else {
            return Ok(true);
        };
        if labels.is_empty() {
            return Ok(groups.unlabeled_busy < pool.unlabeled);
        }
        let key = label_key(&labels_of(labels));
        Ok(groups
            .position(&key)
            .is_some_and(|g| groups.by_key[g].busy < groups.by_key[g].capacity))
    }

    /// A running attempt changed slots: a remote worker of another label set took it over (a
    /// hand-back). Keeps the worker groups' busy counts right; false if it has ended.
    pub fn move_attempt(&mut self, lease: Lease, labels: &[(&str, &str)]) -> bool {
        let Some(att) = self.st.running.get_mut(&lease) else {
            return false;
        };
        let pool = self.st.tasks[&att.task].pool;
        let Some(groups) = &mut self.st.pools[pool].groups else {
            return true; // no labeled slots at all: every slot is alike
        };
        let slot = if labels.is_empty() {
            None
        } else {
            groups.position(&label_key(&labels_of(labels)))
        };
        // Onto the new slot first: a move within a group without slots must not drop it
        // (and the old group may go, moving the others' indices: keep the new one's key).
        let key = slot.map(|g| groups.by_key[g].key.clone());
        groups.occupy(slot);
        groups.vacate(att.slot.as_ref());
        att.slot = key;
        true
    }

    /// The resources (in configuration order) and the bookkeeping of the tasks parked on them
    /// or for worker-group slots, to read.
    pub fn parking(&self) -> &Parking {
        &self.st.parking
    }

    /// The units of the named resource available now (free permits, or tokens: the bucket
    /// refills to `now`, as a Python driver's read of `level` does).
    pub fn resource_level(&mut self, name: &str, now: f64) -> Option<f64> {
        let r = self.st.parking.resource(name)?;
        Some(self.st.parking.resources[r].level(now))
    }

    /// The pool's target capacity now (`PoolSnapshot::desired`), without a snapshot.
    pub fn desired(&self, pool: &str) -> Result<i64, UnknownPool> {
        Ok(self.st.pools[self.pool_id(pool)?].desired())
    }

    /// Tell `observer` of every attempt's start (its wait for a slot) and end (its outcome
    /// and runtime) from now on (Python: `Engine(observer=...)`), in place of any earlier one.
    pub fn observe(&mut self, observer: Box<dyn Observer>) {
        self.st.observer.0 = Some(observer);
    }

    /// Each pool's ready tasks per class, the `ready_at` of the first in line and its retry
    /// and dead-letter counts, in configuration order: O(pools x classes) plus the due fixed
    /// starts, for a metrics scrape.
    pub fn ready_view(&mut self) -> Vec<ReadyView> {
        let tasks = &self.st.tasks;
        self.st
            .pools
            .iter_mut()
            .map(|p| p.ready_view(tasks))
            .collect()
    }

    /// Every pool now with its quality metrics, the live and running counts and the totals.
    pub fn snapshot(&mut self, now: f64) -> Snapshot {
        let pools: Vec<PoolSnapshot> = self.st.pools.iter_mut().map(|p| p.snapshot(now)).collect();
        Snapshot {
            pending: pools.iter().map(|p| p.pending).sum(),
            pools,
            live_tasks: self.st.live,
            running: self.st.running.len(),
            totals: self.st.totals.clone(),
        }
    }

    // --- timers ----------------------------------------------------------------------------------

    /// Fire every timer due at or before `now` and forget retained tasks past their retention.
    pub fn advance(&mut self, now: f64) {
        self.st.fire_timers(now);
        let keep = self.retention;
        // Same expression as next_wake(), so a wake-up at that time always prunes.
        while let Some(&(id, finished_at)) = self.st.retained.front() {
            if finished_at + keep > now {
                break;
            }
            self.st.retained.pop_front();
            self.st.forget(id);
        }
    }

    // --- shutdown --------------------------------------------------------------------------------

    /// Stop dispatching (shutdown grace); running attempts may still finish.
    pub fn halt(&mut self) {
        self.dispatching = false;
    }

    /// End every running attempt without a status change (shutdown after grace), in start
    /// order; returns them.
    pub fn abort_running(&mut self, now: f64) -> Vec<Attempt> {
        let leases: Vec<Lease> = self.st.running.keys().collect();
        leases
            .into_iter()
            .map(|lease| self.st.abort(lease, now, AbortReason::Shutdown))
            .collect()
    }

    /// The name of a pool by index (`TaskRecord::pool`), also of one no longer configured
    /// that restored tasks name.
    pub fn pool_name(&self, pool: usize) -> Option<&str> {
        match self.st.pools.get(pool) {
            Some(p) => Some(&p.name),
            None => self.retired.get(pool - self.st.pools.len()).map(|n| &**n),
        }
    }

    /// The name of an interned kind (`TaskRecord::kind`).
    pub fn kind_name(&self, kind: KindId) -> Option<&str> {
        self.kind_names.get(kind as usize).map(|k| &**k)
    }
}
