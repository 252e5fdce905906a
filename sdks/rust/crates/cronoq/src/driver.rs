//! The driver: the one tokio task that owns the engine and carries out its decisions.
//!
//! # Theory of operation
//!
//! The engine (`cronoq-core`) never reads a clock and never runs anything: every call takes
//! the time and leaves actions in its outbox. The driver is its only caller. It waits on four
//! things at once: control messages (handles' `cancel()`, attempts' heartbeats), attempt
//! outcomes, commands from `Scheduler` calls, and **one timer** for the whole engine, set to
//! `Engine::next_wake` (retry backoffs, attempt timeouts, lease expiries, autoscaler
//! evaluations, the end of retention). After each wake-up it takes whatever else has arrived,
//! then runs a turn: `advance(now)` fires due timers, parked submissions are admitted while
//! there is room, `dispatch(now)` fills free slots, and the outbox is carried out:
//!
//! * aborts first: the executor's `abort` hook, then the attempt's cancellation token, then
//!   the attempt's tokio task is aborted (its future dropped);
//! * starts: each attempt is a `tokio::spawn`ed task running the executor's future, whose
//!   outcome comes back on the outcome channel (a panic is caught and becomes a permanent
//!   failure);
//! * finished tasks: their handles are resolved and successful outputs enter the output cache;
//! * events: broadcast to the receivers of `Scheduler::events` (built only while one exists).
//!
//! Control messages are always taken before a command, so a handle's `cancel()` takes effect
//! before any later call of the same caller. Engine time is seconds since `base`, the Unix
//! epoch (recurring schedules read it as Unix time); `Time` is Unix time too.
//!
//! Shutdown (a `shutdown` call, or the last `Scheduler` dropped) stops dispatching and
//! admissions, fails parked submissions, waits for running attempts up to the grace period,
//! then cancels the rest without a status change and stops: the handles of unfinished tasks
//! resolve to `TaskFailure::Shutdown` when their senders are dropped with the driver.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use cronoq_core::model::{Attempt, Status};
use cronoq_core::{Engine, EventLevel, TaskRecord};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::{broadcast, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::admission::{SpecParts, name_error};
use crate::bounds::{self, Room};
use crate::config::{Bounds, PoolConfig};
use crate::deps::UnknownDependency;
use crate::error::{Error, SubmitError, TaskError, TaskFailure};
use crate::executor::{Beat, Control, Executor, Tags, TaskContext};
use crate::handle::{Outcome, TaskHandle};
use crate::recurring::{RecurringInfo, RecurringSpec, Schedules};
use crate::scaling::Scaling;
use crate::snapshot::{PoolSnapshot, Snapshot};
use crate::task::TaskSpec;
use crate::time::{Clock, Time};
use crate::types::{
    LeaseId, PoolId, Priority, StatusEvent, Submitted, TaskId, TaskRef, TaskStatus, TaskSummary,
};
use crate::unwind::{CatchUnwind, panic_message, panic_text};

/// An attempt's outcome as its task reports it: the executor's result, or a panic's text.
pub(crate) type AttemptDone<O> = (u64, Result<Result<O, TaskError>, String>);

/// A successful admission: what the engine said, and a handle when one was asked for.
pub(crate) struct Admitted<O> {
    pub(crate) submitted: Submitted,
    pub(crate) handle: Option<TaskHandle<O>>,
}

/// Which live tasks a listing wants.
pub(crate) struct ListQuery {
    pub(crate) pools: Vec<String>,
    pub(crate) statuses: Vec<TaskStatus>,
    pub(crate) after: Option<TaskId>,
    pub(crate) limit: usize,
}

/// A scheduler call, with where its answer goes.
// A task's spec is moved once per submission; boxing it would cost an allocation instead.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command<P, O> {
    Submit(Submission<P, O>),
    Handle {
        target: TaskRef,
        reply: oneshot::Sender<Option<TaskHandle<O>>>,
    },
    Cancel {
        target: TaskRef,
        reply: oneshot::Sender<bool>,
    },
    Status {
        target: TaskRef,
        reply: oneshot::Sender<Option<TaskStatus>>,
    },
    List {
        query: ListQuery,
        reply: oneshot::Sender<Vec<TaskSummary>>,
    },
    Snapshot {
        reply: oneshot::Sender<Snapshot>,
    },
    SetCapacity {
        pool: Arc<str>,
        capacity: u32,
        reply: oneshot::Sender<()>,
    },
    AddRecurring {
        spec: RecurringSpec<P>,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    RemoveRecurring {
        name: Arc<str>,
        reply: oneshot::Sender<bool>,
    },
    ListRecurring {
        reply: oneshot::Sender<Vec<RecurringInfo>>,
    },
    SetGroupCapacity {
        pool: Arc<str>,
        labels: Vec<(Arc<str>, Arc<str>)>,
        capacity: u32,
        reply: oneshot::Sender<()>,
    },
    Shutdown {
        grace: Duration,
    },
}

/// Tasks to admit (already resolved and checked by the caller).
// A task's spec is moved once per submission; boxing it would cost an allocation instead.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Submission<P, O> {
    /// `submit` (with a handle) or `enqueue`.
    One {
        spec: TaskSpec<P>,
        handle: bool,
        reply: oneshot::Sender<Result<Admitted<O>, Error>>,
    },
    /// `enqueue_many`: `results` holds the caller's verdicts (`Some`) and a `None` for each item
    /// sent, by index.
    Many {
        specs: Vec<(usize, TaskSpec<P>)>,
        results: Vec<Option<Result<Submitted, Error>>>,
        reply: oneshot::Sender<Vec<Result<Submitted, Error>>>,
    },
    /// `submit_batch`: all or nothing.
    Batch {
        specs: Vec<TaskSpec<P>>,
        reply: oneshot::Sender<Result<Vec<TaskHandle<O>>, Error>>,
    },
}

/// A submission waiting for room in a full `Wait` pool.
enum Parked<P, O> {
    One {
        spec: TaskSpec<P>,
        handle: bool,
        reply: oneshot::Sender<Result<Admitted<O>, Error>>,
    },
    Item {
        spec: TaskSpec<P>,
        group: u64,
        index: usize,
    },
    Batch {
        specs: Vec<TaskSpec<P>>,
        reply: oneshot::Sender<Result<Vec<TaskHandle<O>>, Error>>,
    },
}

/// An `enqueue_many` call with items still undecided.
struct Group {
    results: Vec<Option<Result<Submitted, Error>>>,
    remaining: usize,
    reply: oneshot::Sender<Vec<Result<Submitted, Error>>>,
}

/// A batch to park: the (pool, class) queue it waits in, and its tasks.
type Parking<P> = ((usize, usize), Vec<TaskSpec<P>>);

/// What became of one task offered to the engine.
// A task's spec is moved once per submission; boxing it would cost an allocation instead.
#[allow(clippy::large_enum_variant)]
enum Admission<P> {
    Decided(Result<Submitted, Error>),
    Park(TaskSpec<P>),
}

/// A pool as the driver needs it.
pub(crate) struct PoolRuntime<P, O> {
    pub(crate) name: Arc<str>,
    pub(crate) executor: Arc<dyn Executor<P, O>>,
    pub(crate) config: PoolConfig,
}

impl<P, O> PoolRuntime<P, O> {
    /// A full queue parks its submitters (overflow `Wait` with a bound).
    fn parks(&self) -> bool {
        self.config.overflow == crate::OverflowPolicy::Wait && bounds::any(&self.config.bounds)
    }
}

/// What the driver keeps of a live task (the engine keeps no payloads).
struct Live<P> {
    payload: Arc<P>,
    pool: usize,
    kind: Arc<str>,
    key: Option<Arc<str>>,
    tags: Tags,
    deadline: Option<SystemTime>,
    timeout: Option<Duration>,
}

/// A running attempt's task.
struct Running {
    task: u64,
    pool: usize,
    token: CancellationToken,
    abort: tokio::task::AbortHandle,
}

/// The most recent successful outputs, for handles attached after the end.
struct OutputCache<O> {
    capacity: usize,
    order: VecDeque<u64>,
    outputs: HashMap<u64, Arc<O>>,
}

impl<O> OutputCache<O> {
    fn put(&mut self, id: u64, output: Arc<O>) {
        if self.capacity == 0 {
            return;
        }
        if self.order.len() == self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.outputs.remove(&old);
        }
        self.order.push_back(id);
        self.outputs.insert(id, output);
    }
}

/// Everything the driver is started with.
pub(crate) struct Setup<P, O> {
    pub(crate) engine: Engine,
    pub(crate) clock: Clock,
    pub(crate) base: Time,
    pub(crate) pools: Vec<PoolRuntime<P, O>>,
    pub(crate) commands: mpsc::Receiver<Command<P, O>>,
    pub(crate) control: (UnboundedSender<Control>, UnboundedReceiver<Control>),
    pub(crate) events: broadcast::Sender<StatusEvent>,
    pub(crate) emit_transitions: bool,
    pub(crate) output_cache: usize,
    pub(crate) drop_grace: Duration,
    pub(crate) scaling: Option<Scaling>,
    pub(crate) global_bounds: Bounds,
}

/// Messages taken per wake-up before a turn, at most.
const BATCH: usize = 256;

/// How often abandoned parked submissions are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Driver<P, O> {
    engine: Engine,
    clock: Clock,
    base: Time,
    pools: Vec<PoolRuntime<P, O>>,
    pool_index: HashMap<Arc<str>, usize>,
    commands: mpsc::Receiver<Command<P, O>>,
    commands_open: bool,
    control_tx: UnboundedSender<Control>,
    control_rx: UnboundedReceiver<Control>,
    done_tx: UnboundedSender<AttemptDone<O>>,
    done_rx: UnboundedReceiver<AttemptDone<O>>,
    events: broadcast::Sender<StatusEvent>,
    level: EventLevel,
    live: HashMap<u64, Live<P>>,
    running: HashMap<u64, Running>,
    waiters: HashMap<u64, Vec<oneshot::Sender<Outcome<O>>>>,
    outputs: HashMap<u64, Arc<O>>,
    cache: OutputCache<O>,
    parked: BTreeMap<(usize, usize), VecDeque<Parked<P, O>>>,
    groups: HashMap<u64, Group>,
    next_group: u64,
    last_prune: Instant,
    self_cancelled: Vec<u64>,
    stopping: Option<Instant>,
    drop_grace: Duration,
    scaling: Option<Scaling>,
    schedules: Schedules<P>,
    last_now: Cell<(f64, Time)>,
    global_bounds: Bounds,
    /// Some per-class or global bound is set.
    bounded: bool,
}

/// What woke the driver.
// A task's spec is moved once per submission; boxing it would cost an allocation instead.
#[allow(clippy::large_enum_variant)]
enum Wake<P, O> {
    Control(Control),
    Done(AttemptDone<O>),
    Command(Command<P, O>),
    CommandsClosed,
    Timer,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Driver<P, O> {
    pub(crate) fn new(setup: Setup<P, O>) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let bounded = bounds::any(&setup.global_bounds)
            || setup.pools.iter().any(|p| {
                let per_class = &p.config.bounds.max_pending_per_class;
                per_class.iter().any(Option::is_some)
            });
        let pool_index = setup
            .pools
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        Driver {
            engine: setup.engine,
            clock: setup.clock,
            base: setup.base,
            pools: setup.pools,
            pool_index,
            commands: setup.commands,
            commands_open: true,
            control_tx: setup.control.0,
            control_rx: setup.control.1,
            done_tx,
            done_rx,
            events: setup.events,
            level: if setup.emit_transitions {
                EventLevel::All
            } else {
                EventLevel::Terminal
            },
            live: HashMap::new(),
            running: HashMap::new(),
            waiters: HashMap::new(),
            outputs: HashMap::new(),
            cache: OutputCache {
                capacity: setup.output_cache,
                order: VecDeque::new(),
                outputs: HashMap::new(),
            },
            parked: BTreeMap::new(),
            groups: HashMap::new(),
            next_group: 0,
            last_prune: Instant::now(),
            self_cancelled: Vec::new(),
            stopping: None,
            drop_grace: setup.drop_grace,
            scaling: setup.scaling,
            schedules: Schedules::new(),
            last_now: Cell::new((0.0, setup.base)),
            bounded,
            global_bounds: setup.global_bounds,
        }
    }

    /// Runs until the scheduler has stopped.
    pub(crate) async fn run(mut self) {
        loop {
            if let Some(deadline) = self.stopping {
                if self.running.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    self.cut_off();
                    break;
                }
            }
            let wake = self.wake_at();
            let woke = tokio::select! {
                biased;
                Some(c) = self.control_rx.recv() => Wake::Control(c),
                Some(d) = self.done_rx.recv() => Wake::Done(d),
                c = self.commands.recv(), if self.commands_open => match c {
                    Some(c) => Wake::Command(c),
                    None => Wake::CommandsClosed,
                },
                () = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => Wake::Timer,
            };
            self.handle(woke);
            for _ in 0..BATCH {
                let more = if let Ok(c) = self.control_rx.try_recv() {
                    Wake::Control(c)
                } else if let Ok(d) = self.done_rx.try_recv() {
                    Wake::Done(d)
                } else if let Ok(c) = self.commands.try_recv() {
                    Wake::Command(c)
                } else {
                    break;
                };
                self.handle(more);
            }
            self.turn();
        }
        // Dropping the driver drops the waiters' senders: their handles resolve to
        // `TaskFailure::Shutdown`; queued commands' callers get `Error::Shutdown`.
        self.fail_parked();
    }

    fn handle(&mut self, woke: Wake<P, O>) {
        // A receiver created before this message was sent sees the events it causes.
        self.update_event_level();
        match woke {
            Wake::Control(c) => self.on_control(c),
            Wake::Done((lease, out)) => self.on_done(lease, out),
            Wake::Command(c) => {
                // A handle's cancel() sent before this command takes effect first.
                while let Ok(c) = self.control_rx.try_recv() {
                    self.on_control(c);
                }
                self.on_command(c);
            }
            Wake::CommandsClosed => {
                self.commands_open = false;
                self.begin_stop(self.drop_grace);
            }
            Wake::Timer => {}
        }
        // Ends are carried out before the next message, so that a call sees them (a late
        // handle finds the output in the cache).
        let now = self.now();
        self.apply(now);
    }

    // --- time ----------------------------------------------------------------------------

    fn secs(&self, t: Time) -> f64 {
        t.diff_secs(self.base)
    }

    fn now(&self) -> f64 {
        let t = self.clock.now();
        let secs = self.secs(t);
        self.last_now.set((secs, t));
        secs
    }

    /// The time of engine seconds: exact for the latest `now()` (the time of the events it
    /// causes), else as exact as an `f64` of Unix seconds is (about 0.24 µs).
    fn time(&self, secs: f64) -> Time {
        match self.last_now.get() {
            (s, t) if s == secs => t,
            _ => self.base + Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO),
        }
    }

    /// When the driver must wake without a message: the engine's next timer (rounded up by
    /// more than the rounding of Unix seconds in an `f64`, about 0.24 µs, so the timer is due
    /// by then), a pending prune, the end of a shutdown's grace.
    fn wake_at(&self) -> Option<Instant> {
        let mut wake = self.engine.next_wake().map(|secs| {
            let after = Duration::try_from_secs_f64((secs * 1e9).ceil() / 1e9)
                .unwrap_or(Duration::MAX)
                .saturating_add(Duration::from_micros(1));
            self.clock.instant(self.base + after)
        });
        let mut earliest = |t: Instant| {
            if wake.is_none_or(|w| t < w) {
                wake = Some(t);
            }
        };
        if !self.parked.is_empty() {
            earliest(self.last_prune + PRUNE_EVERY);
        }
        if let Some(deadline) = self.stopping {
            earliest(deadline);
        }
        wake
    }

    // --- the turn ------------------------------------------------------------------------

    fn turn(&mut self) {
        let now = self.now();
        self.engine.advance(now);
        if let Some(scaling) = self.scaling.as_mut().filter(|_| self.stopping.is_none()) {
            scaling.request(&mut self.engine, now, &self.control_tx);
        }
        if !self.parked.is_empty() && Instant::now() >= self.last_prune + PRUNE_EVERY {
            self.prune_parked();
        }
        loop {
            let admitted = !self.parked.is_empty() && self.admit_parked(now);
            if self.stopping.is_none() {
                self.engine.dispatch(now);
                if !self.schedules.is_empty() {
                    self.adopt_occurrences();
                }
            }
            self.apply(now);
            if !admitted {
                break;
            }
        }
    }

    /// Carry out the engine's actions until it has none left.
    fn apply(&mut self, now: f64) {
        loop {
            let out = self.engine.take();
            if out.is_empty() {
                break;
            }
            for att in &out.aborts {
                self.abort(att);
            }
            for att in out.starts {
                self.launch(att, now);
            }
            for rec in out.finished {
                self.finished(&rec);
            }
            for ev in out.events {
                self.publish(ev);
            }
        }
        self.self_cancelled.clear();
    }

    fn update_event_level(&mut self) {
        let want = if self.events.receiver_count() > 0 {
            self.level
        } else {
            EventLevel::None
        };
        if self.engine.event_level() != want {
            self.engine.set_event_level(want);
        }
    }

    // --- attempts ------------------------------------------------------------------------

    fn launch(&mut self, att: Attempt, now: f64) {
        let live = self.live.get(&att.task).expect("a started task is live");
        let pool = &self.pools[live.pool];
        let token = CancellationToken::new();
        let beat = pool.config.lease_ttl.map(|_| {
            Arc::new(Beat {
                lease: LeaseId(att.lease),
                in_flight: AtomicBool::new(false),
                to_driver: self.control_tx.clone(),
            })
        });
        let ctx = TaskContext::new(
            TaskId(att.task),
            LeaseId(att.lease),
            att.number,
            pool.name.clone(),
            live.kind.clone(),
            live.key.clone(),
            live.tags.clone(),
            live.deadline,
            live.timeout,
            att.slot.clone().unwrap_or_else(|| Arc::new([])),
            token.clone(),
            beat,
        );
        let span = tracing::info_span!(
            "cronoq.task",
            task.id = att.task,
            task.pool = %pool.name,
            task.kind = %live.kind,
            task.attempt = att.number,
        );
        let executor = pool.executor.clone();
        let payload = live.payload.clone();
        let pool_index = live.pool;
        let fut = match catch_unwind(AssertUnwindSafe(|| executor.execute(ctx, payload))) {
            Ok(fut) => fut,
            Err(p) => {
                let message = panic_message(&panic_text(p.as_ref()));
                self.engine.fail(att.lease, now, &message, true, None);
                return;
            }
        };
        let done = self.done_tx.clone();
        let lease = att.lease;
        let join = tokio::spawn(
            async move {
                let out = CatchUnwind(fut).await;
                // The driver may have stopped meanwhile: nobody to tell.
                let _ = done.send((lease, out));
            }
            .instrument(span),
        );
        self.running.insert(
            att.lease,
            Running {
                task: att.task,
                pool: pool_index,
                token,
                abort: join.abort_handle(),
            },
        );
    }

    /// The engine gave an attempt up: its executor's abort hook, its token, its future.
    fn abort(&mut self, att: &Attempt) {
        let Some(run) = self.running.remove(&att.lease) else {
            return; // it had reported already (a cancellation of its own)
        };
        let executor = &self.pools[run.pool].executor;
        let lease = LeaseId(att.lease);
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| executor.abort(lease))) {
            tracing::error!(
                lease = att.lease,
                panic = %panic_text(p.as_ref()),
                "an executor's abort hook panicked"
            );
        }
        run.token.cancel();
        run.abort.abort();
        tracing::debug!(
            task = att.task,
            lease = att.lease,
            reason = att.abort_reason.map_or("", |r| r.message()),
            "attempt given up"
        );
    }

    /// An attempt's task reported its outcome.
    fn on_done(&mut self, lease: u64, out: Result<Result<O, TaskError>, String>) {
        let Some(run) = self.running.remove(&lease) else {
            return; // the engine gave it up first: the result is discarded
        };
        let now = self.now();
        let task = run.task;
        match out {
            Ok(Ok(output)) => {
                self.outputs.insert(task, Arc::new(output));
                self.engine.complete(lease, now);
            }
            Ok(Err(TaskError::Retryable {
                message,
                retry_after,
            })) => {
                let after = retry_after.map(|d| d.as_secs_f64());
                self.engine.fail(lease, now, &message, false, after);
            }
            Ok(Err(TaskError::Permanent { message })) => {
                self.engine.fail(lease, now, &message, true, None);
            }
            Ok(Err(TaskError::Cancelled)) => {
                if self.engine.cancel(cronoq_core::TaskRef::Id(task), now) {
                    self.self_cancelled.push(task);
                }
            }
            Err(text) => {
                self.engine
                    .fail(lease, now, &panic_message(&text), true, None);
            }
        }
    }

    fn on_control(&mut self, c: Control) {
        let now = self.now();
        match c {
            Control::Cancel(target) => {
                self.engine.cancel(target.to_core(), now);
            }
            Control::Heartbeat(beat) => {
                beat.in_flight.store(false, Ordering::Release);
                self.engine.heartbeat(beat.lease.0, now);
            }
            Control::Scaled(answer) => {
                if let Some(scaling) = self.scaling.as_mut().filter(|_| self.stopping.is_none()) {
                    scaling.answered(&mut self.engine, answer, now);
                }
            }
        }
    }

    // --- ends and events -----------------------------------------------------------------

    fn finished(&mut self, rec: &TaskRecord) {
        self.live.remove(&rec.id);
        let outcome = if rec.status == Status::Succeeded {
            match self.outputs.remove(&rec.id) {
                Some(output) => {
                    self.cache.put(rec.id, output.clone());
                    Ok(output)
                }
                None => Err(TaskFailure::OutputUnavailable { id: TaskId(rec.id) }),
            }
        } else {
            Err(ended(rec))
        };
        if let Some(waiters) = self.waiters.remove(&rec.id) {
            for w in waiters {
                let _ = w.send(outcome.clone());
            }
        }
    }

    fn publish(&mut self, ev: cronoq_core::model::StatusEvent) {
        let status = TaskStatus::from_core(ev.status);
        let message = if status == TaskStatus::Cancelled && self.self_cancelled.contains(&ev.id) {
            None // ended by its executor: no reason to give
        } else {
            ev.message
        };
        let pool = self.pool_index.get(&ev.pool).copied().unwrap_or_default();
        let event = StatusEvent {
            id: TaskId(ev.id),
            pool: PoolId(u16::try_from(pool).unwrap_or(u16::MAX)),
            key: ev.key,
            status,
            attempt: ev.attempt,
            at: self.time(ev.at),
            message,
        };
        // No receiver left: nobody to tell.
        let _ = self.events.send(event);
    }

    /// A handle of a task the engine knows.
    fn make_handle(&mut self, id: u64, duplicate: bool) -> TaskHandle<O> {
        let control = self.control_tx.clone();
        let rec = self
            .engine
            .lookup(cronoq_core::TaskRef::Id(id))
            .expect("a known task");
        if !rec.status.is_terminal() {
            let (tx, rx) = oneshot::channel();
            self.waiters.entry(id).or_default().push(tx);
            return TaskHandle::waiting(TaskId(id), duplicate, rx, control);
        }
        let outcome = if rec.status == Status::Succeeded {
            match self.cache.outputs.get(&id) {
                Some(output) => Ok(output.clone()),
                None => Err(TaskFailure::OutputUnavailable { id: TaskId(id) }),
            }
        } else {
            Err(ended(rec))
        };
        TaskHandle::known(TaskId(id), duplicate, outcome, control)
    }

    // --- commands ------------------------------------------------------------------------

    fn on_command(&mut self, c: Command<P, O>) {
        match c {
            Command::Submit(s) => self.on_submit(s),
            Command::Handle { target, reply } => {
                let id = self.engine.lookup(target.to_core()).map(|rec| rec.id);
                let handle = id.map(|id| self.make_handle(id, false));
                let _ = reply.send(handle);
            }
            Command::Cancel { target, reply } => {
                let now = self.now();
                let cancelled = self.engine.cancel(target.to_core(), now);
                // The attempt is given up before the caller hears back.
                self.apply(now);
                let _ = reply.send(cancelled);
            }
            Command::Status { target, reply } => {
                let status = self.engine.lookup(target.to_core()).map(|r| r.status);
                let _ = reply.send(status.map(TaskStatus::from_core));
            }
            Command::List { query, reply } => {
                let _ = reply.send(self.list(&query));
            }
            Command::Snapshot { reply } => {
                let at = self.clock.now();
                let s = self.engine.snapshot(self.secs(at));
                let _ = reply.send(Snapshot {
                    at,
                    pools: s
                        .pools
                        .into_iter()
                        .zip(self.engine.pools())
                        .map(|(p, state)| PoolSnapshot::from_core(p, state))
                        .collect(),
                    live_tasks: usize::try_from(s.live_tasks).unwrap_or(usize::MAX),
                    running: s.running,
                    pending: usize::try_from(s.pending.max(0)).unwrap_or(usize::MAX),
                    totals: s.totals,
                });
            }
            Command::SetCapacity {
                pool,
                capacity,
                reply,
            } => {
                if self.stopping.is_none() {
                    let now = self.now();
                    // The caller checked the name.
                    let _ = self.engine.set_capacity(&pool, capacity, now);
                    if let Some(scaling) = &mut self.scaling {
                        scaling.noted(&self.engine, &pool);
                    }
                }
                let _ = reply.send(());
            }
            Command::AddRecurring { spec, reply } => {
                let answer = if self.stopping.is_some() {
                    Err(Error::Shutdown)
                } else {
                    let now = self.now();
                    self.schedules.add(&mut self.engine, spec, now)
                };
                let _ = reply.send(answer);
            }
            Command::RemoveRecurring { name, reply } => {
                let now = self.now();
                let removed = self.schedules.remove(&mut self.engine, &name, now);
                // Its occurrences not started yet end before the caller hears back.
                self.apply(now);
                let _ = reply.send(removed);
            }
            Command::ListRecurring { reply } => {
                let base = self.base;
                let time =
                    |secs: f64| base + Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO);
                let _ = reply.send(self.schedules.list(&self.engine, time));
            }
            Command::SetGroupCapacity {
                pool,
                labels,
                capacity,
                reply,
            } => {
                if self.stopping.is_none() {
                    let now = self.now();
                    let labels: Vec<(&str, &str)> =
                        labels.iter().map(|(k, v)| (&**k, &**v)).collect();
                    // The caller checked the name.
                    let _ = self
                        .engine
                        .set_group_capacity(&pool, &labels, capacity, now);
                }
                let _ = reply.send(());
            }
            Command::Shutdown { grace } => self.begin_stop(grace),
        }
    }

    fn list(&self, q: &ListQuery) -> Vec<TaskSummary> {
        let mut out: Vec<TaskSummary> = self
            .engine
            .tasks()
            .filter(|rec| {
                let pool = &self.pools[rec.pool];
                !rec.status.is_terminal()
                    && q.after.is_none_or(|a| rec.id > a.0)
                    && (q.pools.is_empty() || q.pools.iter().any(|p| **p == *pool.name))
                    && (q.statuses.is_empty()
                        || q.statuses.contains(&TaskStatus::from_core(rec.status)))
            })
            .map(|rec| {
                let pool = &self.pools[rec.pool];
                TaskSummary {
                    id: TaskId(rec.id),
                    key: rec.key.clone(),
                    pool: pool.name.clone(),
                    kind: Arc::from(self.engine.kind_name(rec.kind).unwrap_or_default()),
                    priority: Priority::from_index(usize::from(rec.cls)).unwrap_or_default(),
                    status: TaskStatus::from_core(rec.status),
                    attempt: rec.attempt,
                    tenant: if pool.config.fairness.is_some() {
                        rec.tenant.clone()
                    } else {
                        None
                    },
                }
            })
            .collect();
        out.sort_unstable_by_key(|t| t.id);
        out.truncate(q.limit);
        out
    }

    // --- admission -----------------------------------------------------------------------

    fn on_submit(&mut self, s: Submission<P, O>) {
        if self.stopping.is_some() {
            match s {
                Submission::One { reply, .. } => {
                    let _ = reply.send(Err(Error::Shutdown));
                }
                Submission::Many {
                    specs,
                    mut results,
                    reply,
                } => {
                    for (i, _) in specs {
                        results[i] = Some(Err(Error::Shutdown));
                    }
                    let _ = reply.send(results.into_iter().flatten().collect());
                }
                Submission::Batch { reply, .. } => {
                    let _ = reply.send(Err(Error::Shutdown));
                }
            }
            return;
        }
        let now = self.now();
        match s {
            Submission::One {
                spec,
                handle,
                reply,
            } => match self.admit(spec, false, now) {
                Admission::Decided(r) => self.reply_one(r, handle, reply),
                Admission::Park(spec) => {
                    let key = self.park_key(&spec);
                    self.park(
                        key,
                        Parked::One {
                            spec,
                            handle,
                            reply,
                        },
                    );
                }
            },
            Submission::Many {
                specs,
                results,
                reply,
            } => {
                let group = self.next_group;
                self.next_group += 1;
                let remaining = specs.len();
                self.groups.insert(
                    group,
                    Group {
                        results,
                        remaining,
                        reply,
                    },
                );
                if remaining == 0 {
                    self.settle_group(group);
                }
                for (index, spec) in specs {
                    match self.admit(spec, false, now) {
                        Admission::Decided(r) => self.decide_item(group, index, r),
                        Admission::Park(spec) => {
                            let key = self.park_key(&spec);
                            self.park(key, Parked::Item { spec, group, index });
                        }
                    }
                }
            }
            Submission::Batch { specs, reply } => match self.admit_batch(specs, false, now) {
                Ok(r) => {
                    let _ = reply.send(r);
                }
                Err((key, specs)) => self.park(key, Parked::Batch { specs, reply }),
            },
        }
    }

    /// Offer one task to the engine; a full `Wait` pool (or one with earlier parked
    /// submitters of the task's class, unless `queued`: it is the first of them) parks it.
    fn admit(&mut self, spec: TaskSpec<P>, queued: bool, now: f64) -> Admission<P> {
        let pool = self.pool_index.get(&spec.pool).copied();
        if let Some(p) = pool
            && !queued
            && self.waits(p)
            && self
                .parked
                .get(&(p, spec.priority.index()))
                .is_some_and(|q| !q.is_empty())
            && !self.key_known(&spec)
        {
            return Admission::Park(spec);
        }
        if let Some(p) = pool
            && self.bounded
            && !self.key_known(&spec)
        {
            match self.room(&[(p, spec.priority.index())]) {
                Room::Fits => {}
                Room::Full if self.waits(p) => return Admission::Park(spec),
                _ => return Admission::Decided(Err(SubmitError::Overloaded.into())),
            }
        }
        let parts = SpecParts::of(&spec);
        let result = self.engine.submit(self.core_spec(&spec, &parts), now);
        match result {
            Ok((id, duplicate)) => {
                if !duplicate {
                    let p = pool.expect("an admitted task's pool exists");
                    self.live.insert(id, self.live_task(spec, p));
                }
                Admission::Decided(Ok(Submitted {
                    id: TaskId(id),
                    duplicate,
                }))
            }
            Err(e) if e.code == "full" => {
                let p = pool.expect("a full pool exists");
                if self.pools[p].config.bounds.max_pending == Some(0) {
                    Admission::Decided(Err(SubmitError::Overloaded.into()))
                } else {
                    Admission::Park(spec)
                }
            }
            Err(e) => Admission::Decided(Err(self
                .submit_error(&e, std::slice::from_ref(&spec))
                .into())),
        }
    }

    /// Admit a batch, all or nothing: `Ok(answer)`, or `Err((park key, specs))` to wait for
    /// room in a full `Wait` pool.
    fn admit_batch(
        &mut self,
        specs: Vec<TaskSpec<P>>,
        queued: bool,
        now: f64,
    ) -> Result<Result<Vec<TaskHandle<O>>, Error>, Parking<P>> {
        // The engine's own checks, in its order, for errors that name their key or pool.
        let mut seen: Vec<&str> = Vec::new();
        let mut need: Vec<(usize, usize, i64)> = Vec::new(); // (pool, first class, new tasks)
        for spec in &specs {
            if let Some(key) = spec.key.as_deref() {
                if seen.contains(&key) {
                    return Ok(Err(SubmitError::DuplicateKeyInBatch(key.into()).into()));
                }
                seen.push(key);
                if self.key_known(spec) {
                    continue;
                }
            }
            let Some(&p) = self.pool_index.get(&spec.pool) else {
                return Ok(Err(SubmitError::UnknownPool(spec.pool.clone()).into()));
            };
            match need.iter_mut().find(|(q, _, _)| *q == p) {
                Some(entry) => entry.2 += 1,
                None => need.push((p, spec.priority.index(), 1)),
            }
        }
        for &(p, cls, n) in &need {
            let pool = &self.pools[p];
            if !pool.parks() {
                continue;
            }
            let behind = !queued && self.parked.get(&(p, cls)).is_some_and(|q| !q.is_empty());
            let room = self.engine.has_room(&pool.name, n).unwrap_or(true);
            let fits = pool
                .config
                .bounds
                .max_pending
                .is_some_and(|cap| n as usize <= cap);
            if (behind || !room) && fits {
                return Err(((p, cls), specs));
            }
        }
        if self.bounded {
            let new: Vec<(usize, usize)> = specs
                .iter()
                .filter(|s| !self.key_known(s))
                .map(|s| (self.pool_index[&s.pool], s.priority.index()))
                .collect();
            match self.room(&new) {
                Room::Fits => {}
                Room::Full if new.iter().all(|&(p, _)| self.waits(p)) => {
                    return Err((new[0], specs));
                }
                _ => return Ok(Err(SubmitError::Overloaded.into())),
            }
        }
        let parts: Vec<SpecParts<'_>> = specs.iter().map(SpecParts::of).collect();
        let core: Vec<cronoq_core::TaskSpec<'_>> = specs
            .iter()
            .zip(&parts)
            .map(|(s, parts)| self.core_spec(s, parts))
            .collect();
        let result = self.engine.submit_batch(&core, now);
        drop(core);
        drop(parts);
        let admitted = match result {
            Ok(admitted) => admitted,
            Err(e) => return Ok(Err(self.submit_error(&e, &specs).into())),
        };
        let mut handles = Vec::with_capacity(specs.len());
        for (spec, (id, duplicate)) in specs.into_iter().zip(admitted) {
            if !duplicate {
                let p = self.pool_index[&spec.pool];
                self.live.insert(id, self.live_task(spec, p));
            }
            handles.push((id, duplicate));
        }
        Ok(Ok(handles
            .into_iter()
            .map(|(id, duplicate)| self.make_handle(id, duplicate))
            .collect()))
    }

    /// Whether a full queue parks the pool's submitters: overflow `Wait`, with a bound.
    fn waits(&self, p: usize) -> bool {
        self.pools[p].parks()
            || (self.pools[p].config.overflow == crate::OverflowPolicy::Wait
                && bounds::any(&self.global_bounds))
    }

    /// Room for these new tasks (pool, class) under the per-class and global bounds.
    fn room(&self, new: &[(usize, usize)]) -> Room {
        let pools = &self.pools;
        let per_class = |p: usize| pools[p].config.bounds.max_pending_per_class;
        bounds::room(&self.engine, per_class, &self.global_bounds, new)
    }

    fn key_known(&self, spec: &TaskSpec<P>) -> bool {
        spec.key
            .as_deref()
            .is_some_and(|k| self.engine.lookup(cronoq_core::TaskRef::Key(k)).is_some())
    }

    fn park_key(&self, spec: &TaskSpec<P>) -> (usize, usize) {
        (self.pool_index[&spec.pool], spec.priority.index())
    }

    fn park(&mut self, key: (usize, usize), p: Parked<P, O>) {
        if self.parked.is_empty() {
            self.last_prune = Instant::now();
        }
        self.parked.entry(key).or_default().push_back(p);
    }

    /// Admit parked submissions, first come first served per (pool, class), while they fit;
    /// true if any was decided.
    fn admit_parked(&mut self, now: f64) -> bool {
        let mut decided = false;
        let keys: Vec<(usize, usize)> = self.parked.keys().copied().collect();
        for key in keys {
            while let Some(front) = self.parked.get_mut(&key).and_then(VecDeque::pop_front) {
                if self.abandoned(&front) {
                    continue;
                }
                let back = match front {
                    Parked::One {
                        spec,
                        handle,
                        reply,
                    } => match self.admit(spec, true, now) {
                        Admission::Decided(r) => {
                            self.reply_one(r, handle, reply);
                            None
                        }
                        Admission::Park(spec) => Some(Parked::One {
                            spec,
                            handle,
                            reply,
                        }),
                    },
                    Parked::Item { spec, group, index } => match self.admit(spec, true, now) {
                        Admission::Decided(r) => {
                            self.decide_item(group, index, r);
                            None
                        }
                        Admission::Park(spec) => Some(Parked::Item { spec, group, index }),
                    },
                    Parked::Batch { specs, reply } => match self.admit_batch(specs, true, now) {
                        Ok(r) => {
                            let _ = reply.send(r);
                            None
                        }
                        Err((_, specs)) => Some(Parked::Batch { specs, reply }),
                    },
                };
                match back {
                    Some(p) => {
                        self.parked.entry(key).or_default().push_front(p);
                        break;
                    }
                    None => decided = true,
                }
            }
            if self.parked.get(&key).is_some_and(VecDeque::is_empty) {
                self.parked.remove(&key);
            }
        }
        decided
    }

    /// Whether nobody waits for this parked submission any more.
    fn abandoned(&self, p: &Parked<P, O>) -> bool {
        match p {
            Parked::One { reply, .. } => reply.is_closed(),
            Parked::Batch { reply, .. } => reply.is_closed(),
            Parked::Item { group, .. } => {
                self.groups.get(group).is_none_or(|g| g.reply.is_closed())
            }
        }
    }

    /// Drop parked submissions whose callers gave up waiting.
    fn prune_parked(&mut self) {
        let mut parked = std::mem::take(&mut self.parked);
        for queue in parked.values_mut() {
            queue.retain(|p| !self.abandoned(p));
        }
        parked.retain(|_, q| !q.is_empty());
        self.parked = parked;
        self.groups.retain(|_, g| !g.reply.is_closed());
        self.last_prune = Instant::now();
    }

    fn reply_one(
        &mut self,
        r: Result<Submitted, Error>,
        handle: bool,
        reply: oneshot::Sender<Result<Admitted<O>, Error>>,
    ) {
        let answer = r.map(|submitted| Admitted {
            handle: handle.then(|| self.make_handle(submitted.id.0, submitted.duplicate)),
            submitted,
        });
        let _ = reply.send(answer);
    }

    fn decide_item(&mut self, group: u64, index: usize, r: Result<Submitted, Error>) {
        let Some(g) = self.groups.get_mut(&group) else {
            return; // abandoned
        };
        g.results[index] = Some(r);
        g.remaining -= 1;
        if g.remaining == 0 {
            self.settle_group(group);
        }
    }

    fn settle_group(&mut self, group: u64) {
        if let Some(g) = self.groups.remove(&group) {
            let _ = g.reply.send(g.results.into_iter().flatten().collect());
        }
    }

    fn core_spec<'a>(
        &self,
        spec: &'a TaskSpec<P>,
        parts: &'a SpecParts<'a>,
    ) -> cronoq_core::TaskSpec<'a> {
        let mut core = cronoq_core::TaskSpec {
            pool: &spec.pool,
            cls: spec.priority as u8,
            kind: &spec.kind,
            key: spec.key.as_deref(),
            deadline: spec.deadline.map(|t| self.secs(t)),
            duration_hint: spec.duration_hint.map(|d| d.as_secs_f64()),
            timeout: spec.timeout.map(|d| d.as_secs_f64()),
            retry: spec.retry.map(|r| r.to_core()),
            tenant: spec.tenant.as_deref(),
            ..cronoq_core::TaskSpec::new(&spec.pool)
        };
        parts.fill(&mut core, spec, |t| self.secs(t));
        core
    }

    /// Gives the occurrences the engine just created their template's payload and options.
    fn adopt_occurrences(&mut self) {
        let base = self.base;
        let time = |secs: f64| base + Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO);
        let live = &self.live;
        let created = self
            .schedules
            .created(&self.engine, |id| live.contains_key(&id), time);
        for (id, spec) in created {
            let p = self.pool_index[&spec.pool];
            self.live.insert(id, self.live_task(spec, p));
        }
    }

    fn live_task(&self, spec: TaskSpec<P>, pool: usize) -> Live<P> {
        Live {
            payload: spec.payload,
            pool,
            kind: spec.kind,
            key: spec.key,
            tags: spec.tags.into(),
            deadline: spec.deadline.map(Clock::to_system),
            timeout: spec.timeout,
        }
    }

    fn submit_error(&mut self, e: &cronoq_core::SubmitError, specs: &[TaskSpec<P>]) -> SubmitError {
        let (pools, index) = (&self.pools, &self.pool_index);
        let awaits = |pool: &str| {
            index.get(pool).is_some_and(|&p| {
                matches!(
                    pools[p].config.unknown_dependency,
                    UnknownDependency::Await { .. }
                )
            })
        };
        name_error(&mut self.engine, e, specs, awaits)
    }

    // --- stopping ------------------------------------------------------------------------

    fn begin_stop(&mut self, grace: Duration) {
        if self.stopping.is_some() {
            return;
        }
        let far = Duration::from_secs(100 * 365 * 24 * 3600);
        let now = Instant::now();
        self.stopping = Some(now.checked_add(grace).unwrap_or(now + far));
        self.engine.halt();
        self.fail_parked();
    }

    fn fail_parked(&mut self) {
        for (_, queue) in std::mem::take(&mut self.parked) {
            for p in queue {
                match p {
                    Parked::One { reply, .. } => {
                        let _ = reply.send(Err(Error::Shutdown));
                    }
                    Parked::Batch { reply, .. } => {
                        let _ = reply.send(Err(Error::Shutdown));
                    }
                    Parked::Item { group, index, .. } => {
                        self.decide_item(group, index, Err(Error::Shutdown));
                    }
                }
            }
        }
    }

    /// The grace is over: cancel what still runs, without a status change.
    fn cut_off(&mut self) {
        let now = self.now();
        for att in self.engine.abort_running(now) {
            if let Some(run) = self.running.remove(&att.lease) {
                run.token.cancel();
                run.abort.abort();
            }
        }
    }
}

/// How a task that did not succeed ended, for its handles.
fn ended(rec: &TaskRecord) -> TaskFailure {
    let status = TaskStatus::from_core(rec.status);
    TaskFailure::Ended {
        status,
        message: rec.message.clone().unwrap_or_else(|| status.name().into()),
    }
}
