//! The tables the engine shares and the transition primitives that change them (Python:
//! `cronoq.core.state`): admitting, releasing, making ready, starting, ending and retrying
//! attempts, finishing, retaining and forgetting tasks. `admit`, `finish` and the await timer
//! reach into the dependency graph through the primitives of deps.rs (Python's `DepsHooks`).
//!
//! Every status change goes through `State::move_to`, which checks the life-cycle table
//! (`model::TRANSITIONS`) and records the event; an illegal change panics (an engine bug).
//! Python's records are shared objects; here the tables own the records and everything else
//! names them by id (tasks) or lease (attempts). An attempt has ended exactly when it is no
//! longer in `running`, which is Python's `Attempt.ended`.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::actions::{Actions, JournalLog};
use crate::deps::Dependencies;
use crate::engine::EngineOptions;
use crate::fixed::{FixedStarts, drop_fixed};
use crate::model::{
    AbortReason, Attempt, AttemptOutcome, ConfigError, HISTORY_MAX, Lease, Observer, Outcome,
    PastAttempt, PoolConfig, Status, StatusEvent, SubmitError, TaskId, TaskRecord, Totals, py_repr,
};
use crate::parking::Parking;
use crate::pool::PoolState;
use crate::rng::Random;
use crate::schedules::Schedules;
use crate::table::FastBuild;
pub use crate::table::{Running, Tasks};
use crate::timers::{Timer, Timers};

/// The engine's observer, if any (a wrapper only so that `State` stays `Debug`).
#[derive(Default)]
pub(crate) struct Watcher(pub(crate) Option<Box<dyn Observer>>);

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Watcher(Some)"
        } else {
            "Watcher(None)"
        })
    }
}

/// Which status changes become events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum EventLevel {
    /// None.
    #[default]
    None,
    /// Changes to a terminal status.
    Terminal,
    /// Every change, admission (`blocked`) included.
    All,
}

/// The engine's tables and the primitives every status change goes through.
#[derive(Debug)]
pub struct State<R> {
    /// Pools in configuration order.
    pub pools: Vec<PoolState>,
    /// Pool index by name.
    pub pool_index: HashMap<Arc<str>, usize, FastBuild>,
    /// Jitter.
    pub rng: R,
    /// Which changes become events.
    pub event_level: EventLevel,
    /// Most ended tasks kept.
    pub retention_max: usize,
    /// Live and retained tasks.
    pub tasks: Tasks,
    /// Task by key, for the tasks holding one.
    pub keys: HashMap<Arc<str>, TaskId>,
    /// Running attempts by lease (lease order is start order, as Python's dict).
    pub running: Running,
    /// Tasks not ended.
    pub live: u64,
    /// Counters.
    pub totals: Totals,
    /// The outbox.
    pub out: Actions,
    pub(crate) journal: Option<JournalLog>,
    /// Ended tasks, oldest first, with their end time (deleted ones stay until they reach the
    /// front, as in Python).
    pub retained: VecDeque<(TaskId, f64)>,
    /// The timer heap.
    pub timers: Timers,
    /// The resources and the tasks parked on them or for worker-group slots.
    pub parking: Parking,
    /// The id the next admitted task gets.
    pub next_id: TaskId,
    /// Whether the autoscalers' targets become the pools' capacity (`EngineOptions::elastic`).
    pub elastic: bool,
    /// The dependency graph's state beyond the records (deps.rs, whose primitives `admit` and
    /// `finish` call).
    pub deps: Dependencies,
    /// The fixed-start batch being checked (the rules are in `fixed`).
    pub fixed: FixedStarts,
    /// The recurring schedules (their timers fire here, their occurrences' starts read them).
    pub schedules: Schedules,
    /// Told of every attempt's start and end (`Engine::observe`); None costs a test per
    /// attempt start and end.
    pub(crate) observer: Watcher,
    seq: u64,
    lease: Lease,
}

impl<R: Random> State<R> {
    /// The tables of an engine with these pools (at least one, names unique) and options.
    pub fn new(
        pools: Vec<PoolConfig>,
        now: f64,
        rng: R,
        options: &EngineOptions,
    ) -> Result<Self, ConfigError> {
        if pools.is_empty() {
            return Err(ConfigError("at least one pool is required".into()));
        }
        let parking = Parking::new(&options.resources, now)?;
        let mut states: Vec<PoolState> = Vec::with_capacity(pools.len());
        let mut pool_index = HashMap::default();
        for cfg in pools {
            let pool = PoolState::new(cfg, options.scoring, now)?;
            if pool_index.insert(pool.name.clone(), states.len()).is_some() {
                return Err(ConfigError(format!(
                    "duplicate pool name {}",
                    py_repr(&pool.name)
                )));
            }
            states.push(pool);
        }
        let mut timers = Timers::default();
        for (p, pool) in states.iter().enumerate() {
            if let Some(scaler) = &pool.scaler {
                // The first evaluation happens at start.
                timers.set(scaler.next_eval(), Timer::Scale { pool: p });
            }
        }
        Ok(State {
            pools: states,
            pool_index,
            rng,
            event_level: options.event_level,
            retention_max: options.retention_max,
            tasks: Tasks::default(),
            keys: HashMap::new(),
            running: Running::default(),
            live: 0,
            totals: Totals::default(),
            out: Actions::default(),
            journal: options.journal.then(JournalLog::default),
            retained: VecDeque::new(),
            timers,
            parking,
            next_id: options.first_id,
            elastic: options.elastic,
            deps: Dependencies::default(),
            fixed: FixedStarts::default(),
            schedules: Schedules::default(),
            observer: Watcher(None),
            seq: 0,
            lease: 0,
        })
    }

    fn rec(&self, id: TaskId) -> &TaskRecord {
        self.tasks.get(&id).expect("a live task is held")
    }

    fn rec_mut(&mut self, id: TaskId) -> &mut TaskRecord {
        self.tasks.get_mut(&id).expect("a live task is held")
    }

    // --- admission -----------------------------------------------------------------------

    /// Give the record the next id and admission order.
    pub fn assign_id(&mut self, rec: &mut TaskRecord) {
        rec.id = self.next_id;
        self.next_id += 1;
        self.seq += 1;
        rec.seq = self.seq;
    }

    /// Restore: later tasks are admitted after every stored one (`restore.rs`).
    pub(crate) fn seq_at_least(&mut self, seq: u64) {
        self.seq = self.seq.max(seq);
    }

    /// Take a new task in: indexed and counted; it becomes the parent of the tasks awaiting
    /// its key, and is ready at once unless it has dependencies or a fixed start (then
    /// `attach` decides, and a released fixed start waits for its time).
    pub fn admit(&mut self, mut rec: TaskRecord, now: f64) -> TaskId {
        if rec.id == 0 {
            self.assign_id(&mut rec);
        }
        let id = rec.id;
        if let Some(key) = &rec.key {
            self.keys.insert(key.clone(), id);
        }
        if rec.submitted_at == 0.0 {
            rec.submitted_at = now;
        }
        let pool = rec.pool;
        let cls = usize::from(rec.cls);
        let fixed = rec.start_at().is_some();
        self.tasks.insert(id, rec);
        self.live += 1;
        self.totals.submitted += 1;
        let p = &mut self.pools[pool];
        p.pending_by_class[cls] += 1;
        if !fixed {
            p.arrivals += 1; // the autoscaler's signal (a fixed start arrives at its start)
        }
        if let Some(j) = &mut self.journal {
            j.add(id);
        }
        if self.event_level == EventLevel::All {
            self.event(id, Status::Blocked, now, None);
        }
        if !self.deps.awaiting.is_empty()
            && let Some(key) = self.rec(id).key.clone()
            && self.deps.awaiting.contains_key(&key)
        {
            self.key_admitted(id, &key);
        }
        let rec = self.rec_mut(id);
        if fixed || rec.extra.as_ref().is_some_and(|e| e.resolved.is_some()) {
            let p = &mut self.pools[pool];
            p.unready_by_class[cls] += 1; // until release, fixed's make_due or finish
            if fixed {
                let reserved = p.reservation(&self.tasks[&id]);
                p.reservations.insert(id, reserved);
            }
            self.attach(id, now);
            return id;
        }
        if rec.eligible_at == 0.0 {
            rec.eligible_at = now;
        }
        self.make_ready(id, now);
        id
    }

    /// Keep the checked (resource, amount) pairs that dispatch and release use.
    pub fn resolve_resources(&mut self, rec: &mut TaskRecord) -> Result<(), SubmitError> {
        if let Some(extra) = &mut rec.extra
            && !extra.resources.is_empty()
        {
            extra.wanted = Some(self.parking.resolve(&extra.resources)?);
        }
        Ok(())
    }

    /// Every dependency of a blocked task is satisfied: it may run (or wait for its start).
    pub fn release(&mut self, id: TaskId, now: f64) {
        let rec = self.tasks.get_mut(&id).expect("a live task is held");
        if let Some(e) = &mut rec.extra {
            e.resolved = None;
            e.parents = Vec::new();
            if e.start_at.is_some() {
                self.arrive(id, now);
                return;
            }
        }
        self.pools[rec.pool].unready_by_class[usize::from(rec.cls)] -= 1;
        if rec.eligible_at == 0.0 {
            rec.eligible_at = now;
        }
        self.make_ready(id, now);
    }

    /// The task may run: it joins its pool's ready queue, or waits at once, in priority order,
    /// on a resource that is short or already has tasks waiting (dispatch would only pop it to
    /// park it).
    pub fn make_ready(&mut self, id: TaskId, now: f64) {
        let rec = self.tasks.get_mut(&id).expect("a live task is held");
        transition(rec, Status::Ready);
        rec.ready_at = now;
        let pool = &mut self.pools[rec.pool];
        if let Some(deadline) = rec.deadline {
            rec.latest_start = Some(deadline - pool.expected_duration(rec));
        }
        let wanted = rec.extra.as_ref().and_then(|e| e.wanted.clone());
        let Some(wanted) = wanted else {
            pool.queues.push(rec);
            self.moved(id, Status::Ready, now, None);
            return;
        };
        self.moved(id, Status::Ready, now, None);
        if self.park_if_short(id, &wanted, now, true) {
            return;
        }
        let rec = self.tasks.get_mut(&id).expect("a live task is held");
        self.pools[rec.pool].queues.push(rec);
    }

    // --- attempts --------------------------------------------------------------------------

    /// Start an attempt of a ready task just taken from its queue (`adherent`: from the most
    /// important class that had tasks) on a slot of its pool (`slot`: the index of a worker
    /// group, None: an unlabeled slot).
    pub fn start(&mut self, id: TaskId, now: f64, adherent: bool, slot: Option<usize>) {
        let rec = self.tasks.get_mut(&id).expect("a live task is held");
        transition(rec, Status::Running);
        let pool = &mut self.pools[rec.pool];
        pool.busy += 1;
        pool.pending_by_class[usize::from(rec.cls)] -= 1;
        rec.attempt += 1;
        self.lease += 1;
        let mut att = Attempt::new(id, rec.attempt, self.lease, now, pool.lease_ttl);
        if let Some(groups) = &mut pool.groups {
            att.slot = slot.map(|g| groups.by_key[g].key.clone());
            groups.occupy(slot);
        }
        rec.running = Some(att.lease);
        rec.started_at = now;
        let timeout = rec.timeout;
        pool.stats.on_dispatch(now, now - rec.ready_at, adherent);
        self.running.insert(att.lease, att.clone());
        self.moved(id, Status::Running, now, None);
        self.totals.dispatched += 1;
        if let Some(timeout) = timeout {
            self.timers
                .set(now + timeout, Timer::Timeout { lease: att.lease });
        }
        if att.lease_ttl.is_some() {
            self.timers
                .set(att.lease_expiry, Timer::Lease { lease: att.lease });
        }
        if let Some(o) = &mut self.observer.0 {
            let wait = now - self.tasks[&id].ready_at;
            o.started(&att, wait);
        }
        self.out.starts.push(att);
    }

    /// End a running attempt and free its slot and resources; returns it and its runtime.
    pub fn end_attempt(&mut self, lease: Lease, now: f64, success: bool) -> (Attempt, f64) {
        let att = self.running.remove(&lease).expect("a running attempt");
        let rec = self
            .tasks
            .get_mut(&att.task)
            .expect("a running task is held");
        rec.running = None;
        let p = rec.pool;
        let wanted = rec.extra.as_ref().and_then(|e| e.wanted.clone());
        let pool = &mut self.pools[p];
        pool.stats.level(now, pool.busy - 1, pool.capacity);
        pool.busy -= 1;
        if let Some(groups) = &mut pool.groups {
            let held = groups.vacate(att.slot.as_ref());
            if let Some(g) = held
                && !groups.parked.is_empty()
            {
                self.unpark_labeled(p, g);
            }
        }
        let pool = &mut self.pools[p];
        let runtime = now - att.started_at;
        pool.stats.on_attempt_end(now, att.started_at, success);
        if let Some(wanted) = wanted {
            for &(r, amount) in wanted.iter() {
                self.parking.resources[r].release(amount);
            }
        }
        // Permits came back, or a slot did for a task that a resource could serve: the next
        // dispatch re-offers them (once for all the attempts that ended meanwhile).
        self.reoffer_if_resources();
        if let Some(o) = &mut self.observer.0 {
            o.ended(&att, AttemptOutcome::of(&att, success), runtime);
        }
        (att, runtime)
    }

    /// The engine gives up on a running attempt; the driver is told in `aborts`.
    pub fn abort(&mut self, lease: Lease, now: f64, reason: AbortReason) -> Attempt {
        let running = self.running.get_mut(&lease).expect("a running attempt");
        running.abort_reason = Some(reason); // first: the observer is told of it
        let (att, _) = self.end_attempt(lease, now, false);
        self.out.aborts.push(att.clone());
        att
    }

    /// An attempt ended badly: the task fails, is dead-lettered or retries after backoff.
    #[allow(clippy::too_many_arguments)]
    pub fn after_failure(
        &mut self,
        id: TaskId,
        now: f64,
        message: &str,
        permanent: bool,
        retry_after: Option<f64>,
        outcome: Outcome,
    ) {
        if permanent {
            self.finish(id, Status::Failed, now, Some(message));
            return;
        }
        let rec = self.rec(id);
        let pool = rec.pool;
        let policy = rec.retry.unwrap_or(self.pools[pool].retry);
        if rec.attempt >= policy.max_attempts() {
            self.finish(id, Status::DeadLettered, now, Some(message));
            return;
        }
        let mut delay = policy.backoff(rec.attempt + 1);
        if policy.jitter() && delay > 0.0 {
            delay = self.rng.uniform(0.0, delay);
        }
        if let Some(after) = retry_after
            && after > delay
        {
            delay = after;
        }
        self.totals.retries += 1;
        let message: Arc<str> = Arc::from(message);
        let p = &mut self.pools[pool];
        p.retries += 1;
        p.stats.on_retry(now);
        let rec = self.tasks.get_mut(&id).expect("a live task is held");
        let cls = usize::from(rec.cls);
        p.pending_by_class[cls] += 1;
        p.retrying_by_class[cls] += 1;
        let past = PastAttempt {
            number: rec.attempt,
            started_at: rec.started_at,
            ended_at: now,
            outcome,
            message: message.to_string(),
        };
        let history = &mut rec.extra_mut().history;
        if history.len() == HISTORY_MAX {
            history.remove(0);
        }
        history.push(past);
        rec.message = Some(message.clone());
        rec.ready_at = now + delay;
        let (when, attempt) = (rec.ready_at, rec.attempt);
        self.move_to_msg(id, Status::Retrying, now, Some(message));
        self.timers.set(when, Timer::Retry { task: id, attempt });
    }

    /// Run one due timer.
    pub fn on_timer(&mut self, timer: Timer, now: f64) {
        match timer {
            Timer::Retry { task, attempt } => {
                let Some(rec) = self.tasks.get(&task) else {
                    return; // forgotten: it ended long ago
                };
                if rec.status == Status::Retrying && rec.attempt == attempt {
                    let (pool, cls) = (rec.pool, usize::from(rec.cls));
                    self.pools[pool].retrying_by_class[cls] -= 1;
                    self.make_ready(task, now);
                }
            }
            Timer::Timeout { lease } => {
                if let Some(att) = self.running.get(&lease) {
                    let task = att.task;
                    self.totals.timeouts += 1;
                    self.abort(lease, now, AbortReason::Timeout);
                    let msg = AbortReason::Timeout.message();
                    self.after_failure(task, now, msg, false, None, Outcome::TimedOut);
                }
            }
            Timer::Lease { lease } => {
                let Some(att) = self.running.get(&lease) else {
                    return;
                };
                if att.lease_expiry > now {
                    // A heartbeat extended it.
                    let expiry = att.lease_expiry;
                    self.timers.set(expiry, Timer::Lease { lease });
                    return;
                }
                let task = att.task;
                self.totals.lease_expiries += 1;
                self.abort(lease, now, AbortReason::Lease);
                let msg = AbortReason::Lease.message();
                self.after_failure(task, now, msg, false, None, Outcome::LeaseExpired);
            }
            Timer::Await { task } => self.await_expired(task, now),
            Timer::Scale { pool: p } => {
                let elastic = self.elastic;
                let pool = &mut self.pools[p];
                let new = pool.evaluate_scaler(now, elastic, &self.tasks);
                if elastic && new != pool.unlabeled {
                    self.set_capacity(p, new, now);
                }
                let scaler = self.pools[p].scaler.as_ref().expect("a scaled pool");
                self.timers
                    .set(scaler.next_eval(), Timer::Scale { pool: p });
            }
            Timer::Refill { resource, when } => {
                self.on_tokens(resource, f64::from_bits(when), now);
            }
            Timer::Hold { task } => self.on_hold(task),
            Timer::Start { task } => self.on_start(task, now),
            Timer::Miss { task } => self.on_miss(task, now),
            Timer::Cron { schedule } => {
                if self.schedules.is_current(schedule) {
                    self.schedules.due.push(schedule); // created by the dispatch that follows
                }
            }
        }
    }

    /// Set the pool's unlabeled slots (worker groups keep theirs).
    pub fn set_capacity(&mut self, p: usize, n: i64, now: f64) {
        let pool = &mut self.pools[p];
        let capacity = n + pool.groups.as_ref().map_or(0, |g| g.total());
        pool.stats.level(now, pool.busy, capacity);
        pool.unlabeled = n;
        pool.capacity = capacity;
        self.reoffer_if_resources(); // new slots for tasks waiting on a resource
    }

    /// Fire every timer due at or before `now`, also those set meanwhile.
    pub fn fire_timers(&mut self, now: f64) {
        while let Some((_, timer)) = self.timers.pop_due(now) {
            self.on_timer(timer, now);
        }
    }

    // --- terminal states and retention -----------------------------------------------------

    /// The task ends with `status` (terminal).
    pub fn finish(&mut self, id: TaskId, status: Status, now: f64, message: Option<&str>) {
        let message: Option<Arc<str>> = message.map(Arc::from);
        let rec = self.tasks.get_mut(&id).expect("a live task is held");
        let (old, cls) = (rec.status, usize::from(rec.cls));
        transition(rec, status);
        rec.message = message;
        rec.finished_at = now;
        let pool = &mut self.pools[rec.pool];
        if old != Status::Running {
            // it was pending until now
            pool.pending_by_class[cls] -= 1;
            if old == Status::Retrying {
                pool.retrying_by_class[cls] -= 1;
            } else if old == Status::Blocked || old == Status::Scheduled {
                pool.unready_by_class[cls] -= 1;
            }
        }
        if status == Status::DeadLettered {
            pool.dead_lettered += 1;
        }
        self.live -= 1;
        self.totals.ended(status);
        // Its children are taken before it may be forgotten below; they settle last.
        let mut freed = false;
        let children = match &mut rec.extra {
            Some(e) => {
                e.resolved = None;
                e.parents = Vec::new();
                if e.start_at.is_some() && !e.fixed_done {
                    freed = drop_fixed(id, e, pool);
                }
                std::mem::take(&mut e.children)
            }
            None => Vec::new(),
        };
        self.out.finished.push(rec.clone());
        let message = rec.message.clone();
        self.moved(id, status, now, message.as_ref());
        if freed {
            self.reoffer_if_resources(); // a held slot is free for others again
        }
        self.retained.push_back((id, now));
        if self.retained.len() > self.retention_max {
            let (old, _) = self.retained.pop_front().expect("not empty");
            self.forget(old);
        }
        if !children.is_empty() {
            self.deps_ended(id, status, children, now);
        }
    }

    /// Drop an ended task from memory. One deleted before (`Engine::delete`) is gone already
    /// and still listed in `retained`: nothing is left to drop.
    pub fn forget(&mut self, id: TaskId) {
        let Some(rec) = self.tasks.get(&id) else {
            return;
        };
        self.deps.forgotten(id, rec.status);
        if let Some(key) = &rec.key
            && let Entry::Occupied(e) = self.keys.entry(key.clone())
            && *e.get() == id
        {
            e.remove();
        }
        match &mut self.journal {
            Some(j) => j.forgotten(self.tasks.remove(&id).expect("a held task")),
            None => {
                self.tasks.delete(&id);
            }
        }
    }

    /// The task gives its key up for good (a new task may take it). Also in the outbox's copy
    /// and the journal's row of it, as Python's driver reads the record itself there.
    pub fn free_key(&mut self, id: TaskId) {
        let rec = match self.tasks.get_mut(&id) {
            Some(rec) => Some(rec),
            None => self.journal.as_mut().and_then(|j| j.gone.get_mut(&id)),
        };
        if let Some(key) = rec.and_then(|r| r.key.take())
            && let Entry::Occupied(e) = self.keys.entry(key)
            && *e.get() == id
        {
            e.remove();
        }
        if let Some(copy) = self.out.finished.iter_mut().rev().find(|r| r.id == id) {
            copy.key = None;
        }
    }

    // --- the life-cycle table ----------------------------------------------------------------

    /// Change the task's status (checked against the life-cycle table), journal it and record
    /// the event the level asks for.
    pub fn move_to(&mut self, id: TaskId, new: Status, now: f64, message: Option<&str>) {
        self.move_to_msg(id, new, now, message.map(Arc::from));
    }

    fn move_to_msg(&mut self, id: TaskId, new: Status, now: f64, message: Option<Arc<str>>) {
        transition(self.rec_mut(id), new);
        self.moved(id, new, now, message.as_ref());
    }

    /// After the task's status changed to `new`: journal it and record the event the level
    /// asks for.
    #[inline]
    fn moved(&mut self, id: TaskId, new: Status, now: f64, message: Option<&Arc<str>>) {
        if let Some(j) = &mut self.journal {
            j.change(id);
        }
        let level = self.event_level;
        if level == EventLevel::All || (level == EventLevel::Terminal && new.is_terminal()) {
            self.event_msg(id, new, now, message.cloned());
        }
    }

    /// Record a status event of the task.
    pub fn event(&mut self, id: TaskId, status: Status, now: f64, message: Option<&str>) {
        self.event_msg(id, status, now, message.map(Arc::from));
    }

    fn event_msg(&mut self, id: TaskId, status: Status, now: f64, message: Option<Arc<str>>) {
        let rec = self.rec(id);
        let ev = StatusEvent {
            id,
            pool: self.pools[rec.pool].name.clone(),
            key: rec.key.clone(),
            status,
            attempt: rec.attempt,
            at: now,
            message,
        };
        self.out.events.push(ev);
    }
}

/// Change the task's status, checked against the life-cycle table (the caller then calls
/// `State::moved`).
///
/// # Panics
/// On a change the table forbids (an engine bug).
#[inline]
fn transition(rec: &mut TaskRecord, new: Status) {
    assert!(
        rec.status.may_move_to(new),
        "illegal transition: task {}: {} -> {new}",
        rec.id,
        rec.status
    );
    rec.status = new;
}
