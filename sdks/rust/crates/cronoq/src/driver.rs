//! The driver: the one tokio task that owns the engine and carries out its decisions.
//!
//! # Theory of operation
//!
//! The engine (`cronoq-core`) never reads a clock and never runs anything: every call takes
//! the time and leaves actions in its outbox. The driver is its only caller. It waits on: commands
//! from `Scheduler` calls; one channel from handles and attempts (`cancel()`, outcomes);
//! heartbeats, when a pool has a lease TTL; and **one timer** for the whole engine, set to
//! `Engine::next_wake` (retry backoffs, attempt timeouts, lease expiries, autoscaler
//! evaluations, the end of retention) and moved only when that changes. Each wake-up takes
//! what has arrived (up to `BATCH` messages a channel), reads the clock once, handles the
//! messages, then runs a turn: `advance(now)` fires due timers, parked submissions are admitted
//! while there is room, `dispatch(now)` fills free slots, and the outbox is carried out:
//!
//! * aborts first: the executor's `abort` hook, then the attempt's cancellation token, then
//!   the attempt's tokio task is aborted (its future dropped);
//! * starts: each attempt is a `tokio::spawn`ed task running the executor's future, whose
//!   outcome comes back on the channel from tasks (a panic is caught and becomes a permanent
//!   failure). On a current-thread runtime the driver polls the future once first: one that
//!   is ready at once is not spawned, its outcome is taken at the next wake-up, which comes at
//!   once (the driver and the attempts share the thread there, so this adds no stall);
//! * finished tasks: their handles are resolved and successful outputs enter the output cache;
//! * events: broadcast to the receivers of `Scheduler::events` (built only while one exists).
//!
//! Cancellations and outcomes are always taken before a command, so a handle's `cancel()`
//! takes effect before any later call of the same caller. Engine time is seconds since `base`,
//! the Unix epoch (recurring schedules read it as Unix time); `Time` is Unix time too.
//!
//! Shutdown (a `shutdown` call, or the last `Scheduler` dropped) stops dispatching and
//! admissions, fails parked submissions, waits for running attempts up to the grace period,
//! then cancels the rest without a status change and stops: the handles of unfinished tasks
//! resolve to `TaskFailure::Shutdown` when their senders are dropped with the driver.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::poll_fn;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use cronoq_core::model::{Attempt, Status};
use cronoq_core::{Actions, Engine, EventLevel, TaskRecord};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::{broadcast, oneshot};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::admission::{SpecParts, name_error};
use crate::bounds::{self, Room};
use crate::config::{Bounds, PoolConfig};
use crate::deps::UnknownDependency;
use crate::error::{Error, StoreError, SubmitError, TaskError, TaskFailure};
use crate::executor::{Beat, Executor, Tags, TaskContext};
use crate::groups::Labels;
use crate::handle::{Outcome, TaskHandle};
use crate::recurring::{self, RecurringInfo, RecurringSpec, Schedules};
use crate::scaling::{Answer, Scaling};
use crate::snapshot::{PoolSnapshot, Snapshot};
use crate::store::{Mutation, RecoveredRecurring, RecoveredTask, RecoveredTerminal};
use crate::task::{Task, TaskSpec};
use crate::telemetry::{self, AttemptMark, Telemetry};
use crate::time::{Clock, Time};
use crate::types::{
    LeaseId, PoolId, Priority, StatusEvent, Submitted, TaskId, TaskRef, TaskStatus, TaskSummary,
};
use crate::unwind::{CatchUnwind, panic_message, panic_text};
use crate::wal::{Held, Reply, Wal};

/// What handles, attempts and scalers tell the driver, on one channel (one to poll, not
/// several, per wake-up): cancellations, outcomes and scalers' answers. Heartbeats have a channel of their own, polled only
/// when a pool has a lease TTL.
pub(crate) enum FromTasks<O> {
    /// A handle's `cancel()`.
    Cancel(TaskRef),
    /// An attempt's outcome (task id, lease): the executor's result, or a panic's text.
    Done(u64, u64, Result<Result<O, TaskError>, String>),
    /// A scaler's answer.
    Scaled(Answer),
    /// The commit in flight is done (with a persistent store).
    Committed(Result<(), StoreError>),
}

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

/// A scheduler call, with where its answer goes. Small: a command is moved several times on
/// its way (into the queue, out of it, into the driver's inbox), so a task's spec travels
/// boxed (one allocation costs less than those copies of a large spec).
pub(crate) enum Command<P, O> {
    Submit(Submission<P, O>),
    Handle {
        target: TaskRef,
        reply: oneshot::Sender<Option<TaskHandle<O>>>,
    },
    Cancel {
        target: TaskRef,
        reply: oneshot::Sender<Result<bool, Error>>,
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
        spec: Box<RecurringSpec<P>>,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    RemoveRecurring {
        name: Arc<str>,
        reply: oneshot::Sender<Result<bool, Error>>,
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
pub(crate) enum Submission<P, O> {
    /// `submit` (with a handle) or `enqueue`: the task resolved and checked in place.
    One {
        task: Box<Task<P>>,
        handle: bool,
        reply: oneshot::Sender<Result<Admitted<O>, Error>>,
    },
    /// `enqueue_many`: `results` holds the caller's verdicts (`Some`) and a `None` for each item
    /// sent, by index.
    Many {
        specs: Vec<(usize, TaskSpec<P>)>,
        results: Vec<Option<Result<Submitted, Error>>>,
        reply: oneshot::Sender<Result<Vec<Result<Submitted, Error>>, Error>>,
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
    reply: oneshot::Sender<Result<Vec<Result<Submitted, Error>>, Error>>,
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

/// The outcome of an attempt whose first poll, on the driver, was ready: taken as if its task
/// had sent it.
struct Ready<O> {
    task: u64,
    lease: u64,
    mark: AttemptMark,
    out: Result<Result<O, TaskError>, String>,
}

/// What the driver keeps of a live task (the engine keeps no payloads), in one entry per task
/// so that a task costs one insert and one remove however many of these it uses.
struct Live<P, O> {
    payload: Arc<P>,
    pool: usize,
    kind: Arc<str>,
    key: Option<Arc<str>>,
    tags: Tags,
    deadline: Option<SystemTime>,
    timeout: Option<Duration>,
    /// Its attempt while one runs.
    running: Option<Running>,
    /// Its handles, to resolve when it ends.
    waiters: Waiters<O>,
    /// Its output, from its attempt's success until the engine records the end.
    output: Option<Arc<O>>,
}

/// A running attempt's task.
struct Running {
    lease: u64,
    token: CancellationToken,
    /// Its tokio task, kept to abort it (a handle of its own would be one more reference to
    /// take and drop per attempt).
    abort: tokio::task::JoinHandle<()>,
    /// For the attempt's metrics.
    mark: AttemptMark,
}

/// The handles waiting for a task: nearly always one, kept inline; more in a list.
struct Waiters<O> {
    first: Option<oneshot::Sender<Outcome<O>>>,
    more: Vec<oneshot::Sender<Outcome<O>>>,
}

impl<O> Waiters<O> {
    fn new() -> Self {
        Waiters {
            first: None,
            more: Vec::new(),
        }
    }

    fn push(&mut self, tx: oneshot::Sender<Outcome<O>>) {
        if self.first.is_none() {
            self.first = Some(tx);
        } else {
            self.more.push(tx);
        }
    }

    fn resolve(self, outcome: Outcome<O>) {
        if let Some(w) = self.first {
            let _ = w.send(outcome.clone());
        }
        for w in self.more {
            let _ = w.send(outcome.clone());
        }
    }
}

/// The most recent successful outputs, for handles attached after the end.
struct OutputCache<O> {
    capacity: usize,
    order: VecDeque<u64>,
    outputs: FxHashMap<u64, Arc<O>>,
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
    pub(crate) events: broadcast::Sender<StatusEvent>,
    pub(crate) emit_transitions: bool,
    pub(crate) output_cache: usize,
    pub(crate) drop_grace: Duration,
    pub(crate) scaling: Option<Scaling>,
    pub(crate) global_bounds: Bounds,
    /// With a persistent store: its write-ahead, and what it held at start.
    pub(crate) durable: Option<Durable<P, O>>,
}

/// A persistent store's write-ahead, and the live and ended tasks and the schedules it held
/// at start.
pub(crate) type Durable<P, O> = (
    Wal<P, O>,
    Vec<RecoveredTask<P>>,
    Vec<RecoveredTerminal>,
    Vec<RecoveredRecurring<P>>,
);

/// Messages taken per wake-up before a turn, at most.
const BATCH: usize = 256;

/// How often abandoned parked submissions are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Driver<P, O> {
    engine: Engine,
    clock: Clock,
    base: Time,
    pools: Vec<PoolRuntime<P, O>>,
    pool_index: FxHashMap<Arc<str>, usize>,
    commands: mpsc::Receiver<Command<P, O>>,
    commands_open: bool,
    to_driver: UnboundedSender<FromTasks<O>>,
    from_tasks: UnboundedReceiver<FromTasks<O>>,
    beat_tx: UnboundedSender<Arc<Beat>>,
    beats: UnboundedReceiver<Arc<Beat>>,
    /// Some pool has a lease TTL: its attempts may send heartbeats.
    leases: bool,
    events: broadcast::Sender<StatusEvent>,
    level: EventLevel,
    /// The live tasks by id (ids are the engine's: a fast hash is enough).
    live: FxHashMap<u64, Live<P, O>>,
    /// How many attempts run.
    running: usize,
    cache: OutputCache<O>,
    parked: BTreeMap<(usize, usize), VecDeque<Parked<P, O>>>,
    groups: HashMap<u64, Group>,
    next_group: u64,
    last_prune: Instant,
    /// The engine's last next wake-up, and its instant (it stays the same for many turns).
    engine_wake: Option<(f64, Instant)>,
    /// The tags of the tasks without any, shared (a fresh empty `Tags` allocates).
    no_tags: Tags,
    /// The group of the attempts on unlabeled slots (empty), shared for the same reason.
    no_group: Labels,
    self_cancelled: Vec<u64>,
    stopping: Option<Instant>,
    drop_grace: Duration,
    scaling: Option<Scaling>,
    schedules: Schedules<P>,
    last_now: Cell<(f64, Time)>,
    global_bounds: Bounds,
    /// Some per-class or global bound is set.
    bounded: bool,
    /// With a persistent store: what waits for a commit.
    wal: Option<Wal<P, O>>,
    /// The store error that stopped the scheduler.
    failed: Option<StoreError>,
    /// Metrics (feature `otel`).
    telemetry: Telemetry,
    /// The engine's last outbox, carried out, whose lists it gets back (`Engine::take_into`).
    outbox: Actions,
    /// On a current-thread runtime: an attempt's future is polled once on the driver before
    /// it is spawned (a blocking poll would stall the scheduler there anyway).
    first_poll: bool,
    /// The outcomes of attempts ready at their first poll, taken at the next wake-up.
    ready: Vec<Ready<O>>,
    /// An attempt's task was aborted since the driver last yielded: tokio drops its future
    /// only when it runs next, so until then new attempts are spawned without a first poll
    /// here (none starts before an abandoned one is dropped, as when every attempt is spawned).
    dropping: bool,
}

/// The messages taken in one wake-up, in buffers kept from one to the next.
struct Inbox<P, O> {
    commands: Vec<Command<P, O>>,
    from_tasks: Vec<FromTasks<O>>,
    beats: Vec<Arc<Beat>>,
    /// Every `Scheduler` is gone and every command was taken.
    closed: bool,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Driver<P, O> {
    pub(crate) fn new(mut setup: Setup<P, O>) -> Self {
        let (to_driver, from_tasks) = mpsc::unbounded_channel();
        let (beat_tx, beats) = mpsc::unbounded_channel();
        let leases = setup.pools.iter().any(|p| p.config.lease_ttl.is_some());
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
        let durable = setup.durable.take();
        let telemetry = Telemetry::new(setup.pools.iter().map(|p| &p.name));
        let mut driver = Driver {
            engine: setup.engine,
            clock: setup.clock,
            base: setup.base,
            pools: setup.pools,
            pool_index,
            commands: setup.commands,
            commands_open: true,
            to_driver,
            from_tasks,
            beat_tx,
            beats,
            leases,
            events: setup.events,
            level: if setup.emit_transitions {
                EventLevel::All
            } else {
                EventLevel::Terminal
            },
            live: FxHashMap::default(),
            running: 0,
            cache: OutputCache {
                capacity: setup.output_cache,
                order: VecDeque::new(),
                outputs: FxHashMap::default(),
            },
            parked: BTreeMap::new(),
            groups: HashMap::new(),
            next_group: 0,
            last_prune: Instant::now(),
            engine_wake: None,
            no_tags: Tags::from([]),
            no_group: Labels::from([]),
            self_cancelled: Vec::new(),
            stopping: None,
            drop_grace: setup.drop_grace,
            scaling: setup.scaling,
            schedules: Schedules::new(),
            last_now: Cell::new((0.0, setup.base)),
            bounded,
            global_bounds: setup.global_bounds,
            wal: None,
            failed: None,
            telemetry,
            outbox: Actions::default(),
            first_poll: tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::CurrentThread,
            ready: Vec::new(),
            dropping: false,
        };
        if let Some((wal, tasks, terminal, recurring)) = durable {
            driver.wal = Some(wal);
            driver.restore(tasks, terminal, recurring);
        }
        driver
    }

    /// Runs until the scheduler has stopped; a store error if one stopped it.
    pub(crate) async fn run(mut self) -> Result<(), Error> {
        // The one timer, moved only when the wake-up time changes (a new `Sleep` per wake-up
        // would be registered and dropped each time).
        let mut timer = pin!(tokio::time::sleep_until(Instant::now()));
        let mut armed: Option<Instant> = None;
        let mut inbox = Inbox {
            commands: Vec::new(),
            from_tasks: Vec::new(),
            beats: Vec::new(),
            closed: false,
        };
        loop {
            if let Some(e) = &self.failed {
                return Err(self.fail(e.clone()));
            }
            if let Some(deadline) = self.stopping {
                if self.running == 0
                    && self.ready.is_empty()
                    && self.wal.as_ref().is_none_or(Wal::idle)
                {
                    break;
                }
                if Instant::now() >= deadline {
                    self.cut_off();
                    break;
                }
            }
            let wake = self.wake_at();
            if wake != armed {
                if let Some(at) = wake {
                    timer.as_mut().reset(at);
                }
                armed = wake;
            }
            let fired =
                poll_fn(|cx| self.poll_inbox(cx, &mut inbox, timer.as_mut(), armed.is_some()))
                    .await;
            if fired {
                armed = None;
            }
            let now = self.now();
            self.take_inbox(&mut inbox, now);
            self.turn(now);
            if self.wal.is_some() {
                self.flush(now);
            }
            self.telemetry
                .turned(now, || self.engine.snapshot(now).pools);
        }
        // Dropping the driver drops the waiters' senders: their handles resolve to
        // `TaskFailure::Shutdown`; queued commands' callers get `Error::Shutdown`.
        self.fail_parked();
        Ok(())
    }

    /// Moves what has arrived into `inbox`, up to `BATCH` messages a channel; ready when
    /// anything did, with whether the timer fired. Once one channel has given something, the
    /// rest are only emptied (`try_recv`: no waker registered, as none is needed before the
    /// next poll); each is polled, and so registered, while nothing has come. Commands are
    /// taken first, so a handle's `cancel()` sent before a command taken here is taken too.
    fn poll_inbox(
        &mut self,
        cx: &mut Context<'_>,
        inbox: &mut Inbox<P, O>,
        timer: Pin<&mut Sleep>,
        armed: bool,
    ) -> Poll<bool> {
        // Outcomes of attempts that were ready at once are waiting: no sleep.
        let mut got = !self.ready.is_empty();
        if self.commands_open {
            match self.commands.poll_recv_many(cx, &mut inbox.commands, BATCH) {
                Poll::Ready(0) => {
                    inbox.closed = true;
                    got = true;
                }
                Poll::Ready(_) => got = true,
                Poll::Pending => {}
            }
        }
        got |= take(&mut self.from_tasks, cx, &mut inbox.from_tasks, got);
        if self.leases {
            got |= take(&mut self.beats, cx, &mut inbox.beats, got);
        }
        // With messages to handle the turn runs anyway, and it fires what is due.
        let fired = !got && armed && timer.poll(cx).is_ready();
        if got || fired {
            Poll::Ready(fired)
        } else {
            // The driver yields: the aborted attempts' tasks run, and drop their futures.
            self.dropping = false;
            Poll::Pending
        }
    }

    /// Handles what `poll_inbox` took: cancellations and outcomes in their order (a handle's
    /// `cancel()` takes effect before any later call of the same caller), heartbeats, then
    /// commands, each of which sees the ends before it carried out (a late handle finds the
    /// output in the cache).
    fn take_inbox(&mut self, inbox: &mut Inbox<P, O>, now: f64) {
        // A receiver created before these messages were sent sees the events they cause.
        self.update_event_level();
        let mut touched =
            !self.ready.is_empty() || !inbox.from_tasks.is_empty() || !inbox.beats.is_empty();
        if !self.ready.is_empty() {
            self.take_ready(now);
        }
        for m in inbox.from_tasks.drain(..) {
            match m {
                FromTasks::Cancel(target) => {
                    self.engine.cancel(target.to_core(), now);
                }
                FromTasks::Done(task, lease, out) => self.on_done(task, lease, out, now),
                FromTasks::Scaled(answer) => {
                    if let Some(scaling) = self.scaling.as_mut().filter(|_| self.stopping.is_none())
                    {
                        scaling.answered(&mut self.engine, answer, now);
                    }
                }
                FromTasks::Committed(result) => self.committed(result, now),
            }
        }
        for beat in std::mem::take(&mut inbox.beats) {
            self.on_beat(&beat, now);
        }
        for c in inbox.commands.drain(..) {
            if touched {
                self.apply(now);
            }
            self.on_command(c, now);
            touched = true;
        }
        if std::mem::take(&mut inbox.closed) {
            self.apply(now);
            self.commands_open = false;
            self.begin_stop(self.drop_grace);
        }
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
    fn wake_at(&mut self) -> Option<Instant> {
        let mut wake = match (self.engine.next_wake(), self.engine_wake) {
            (Some(secs), Some((known, at))) if secs == known => Some(at),
            (Some(secs), _) => {
                let after = Duration::try_from_secs_f64((secs * 1e9).ceil() / 1e9)
                    .unwrap_or(Duration::MAX)
                    .saturating_add(Duration::from_micros(1));
                let at = self.clock.instant(self.base + after);
                self.engine_wake = Some((secs, at));
                Some(at)
            }
            (None, _) => None,
        };
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
        if let Some(at) = self.telemetry.refresh_at() {
            earliest(at);
        }
        wake
    }

    // --- the turn ------------------------------------------------------------------------

    fn turn(&mut self, now: f64) {
        self.engine.advance(now);
        if let Some(scaling) = self.scaling.as_mut().filter(|_| self.stopping.is_none()) {
            scaling.request(&mut self.engine, now, &self.to_driver);
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

    /// Carry out the engine's actions until it has none left: only an executor that panicked
    /// in `execute` leaves more (its failure), so the outbox is taken again only then (an
    /// empty take would also leave the engine a next outbox without room).
    fn apply(&mut self, now: f64) {
        if self.wal.is_some() {
            self.hold();
            return;
        }
        // The outbox's lists go back to the engine emptied: no allocation per turn.
        let mut out = std::mem::take(&mut self.outbox);
        loop {
            self.engine.take_into(&mut out);
            let mut again = false;
            for att in &out.aborts {
                self.abort(att);
            }
            for att in out.starts.drain(..) {
                again |= !self.launch(att, now);
            }
            for rec in out.finished.drain(..) {
                self.finished(&rec);
            }
            for ev in out.events.drain(..) {
                self.publish(ev);
            }
            if !again {
                break;
            }
        }
        self.outbox = out;
        self.self_cancelled.clear();
    }

    /// `apply` with a persistent store: aborts at once; the journal becomes the batch's
    /// mutations (with the outputs of the tasks that succeeded); starts, ends and events wait
    /// for the batch.
    #[cold]
    #[inline(never)]
    fn hold(&mut self) {
        let out = self.engine.take();
        for att in &out.aborts {
            self.abort(att);
        }
        let events: Vec<StatusEvent> = out.events.into_iter().map(|ev| self.event(ev)).collect();
        self.self_cancelled.clear();
        let journal = self.engine.take_journal();
        let (base, last) = (self.base, self.last_now.get());
        let time = move |secs: f64| {
            if secs == last.0 {
                last.1
            } else {
                base + Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO)
            }
        };
        let live = &self.live;
        let wal = self.wal.as_mut().expect("hold runs with a store");
        if let Some(journal) = journal {
            wal.journal(journal, time);
        }
        for rec in &out.finished {
            if rec.status == Status::Succeeded
                && let Some(output) = live.get(&rec.id).and_then(|l| l.output.clone())
            {
                wal.output(rec.id, output);
            }
        }
        wal.held.starts.extend(out.starts);
        wal.held.finished.extend(out.finished);
        wal.held.events.extend(events);
    }

    /// Starts committing what was held, unless a commit is in flight (and carries out a
    /// batch without mutations at once).
    fn flush(&mut self, now: f64) {
        while self.failed.is_none()
            && let Some(held) = self.wal.as_mut().and_then(|wal| wal.flush(&self.to_driver))
        {
            self.release(held, now);
            self.apply(now);
        }
    }

    /// The store failed for good: nothing more runs here (another instance may lead).
    #[cold]
    fn fail(&mut self, e: StoreError) -> Error {
        self.cut_off();
        self.fail_parked();
        Error::Store(e)
    }

    /// The commit in flight ended: its effects are carried out, or the scheduler stops.
    fn committed(&mut self, result: Result<(), StoreError>, now: f64) {
        let Some(wal) = self.wal.as_mut() else { return };
        match result {
            Ok(()) => {
                if let Some(held) = wal.committed() {
                    self.release(held, now);
                    self.apply(now);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "the store failed: the scheduler stops");
                wal.fail(&e);
                self.failed = Some(e);
            }
        }
    }

    /// Carries out a durable batch's effects: ends, replies, events, then starts (of the
    /// attempts the engine still runs).
    fn release(&mut self, held: Held<O>, now: f64) {
        for rec in &held.finished {
            self.finished(rec);
        }
        for reply in held.replies {
            reply.send();
        }
        for ev in held.events {
            // No receiver left: nobody to tell.
            let _ = self.events.send(ev);
        }
        for att in held.starts {
            if self.engine.attempt(att.lease).is_some() {
                self.launch(att, now);
            }
        }
    }

    /// Answers a caller: at once, or with a store once the batch is durable.
    #[inline(always)]
    fn answer(&mut self, reply: Reply<O>) {
        match &mut self.wal {
            None => reply.send(),
            Some(wal) => wal.held.replies.push(reply),
        }
    }

    /// Takes back what the store held: live tasks (one whose attempt was running counts it
    /// as lost: retried or dead-lettered), ended ones (keys, statuses) and schedules (those
    /// the configuration no longer supports are dropped, from the store too).
    #[cold]
    fn restore(
        &mut self,
        tasks: Vec<RecoveredTask<P>>,
        terminal: Vec<RecoveredTerminal>,
        recurring: Vec<RecoveredRecurring<P>>,
    ) {
        let now = self.now();
        let first_pool = self.pools[0].name.clone();
        let no_kind: Arc<str> = Arc::from("");
        let mut stored = Vec::with_capacity(tasks.len() + terminal.len());
        for t in &tasks {
            let parts = SpecParts::of(&t.spec);
            let mut rec = TaskRecord::from_spec(self.core_spec(&t.spec, &parts), 0, 0);
            let at = self.secs(t.arrival);
            rec.id = t.id.0;
            rec.seq = t.seq;
            (rec.submitted_at, rec.eligible_at, rec.ready_at) = (at, at, at);
            rec.attempt = t.attempt;
            rec.status = if t.attempt > 0 {
                Status::Running // lost with its holder
            } else if t.spec.deps.is_empty() {
                Status::Ready
            } else {
                Status::Blocked
            };
            recurring::mark_occurrence(&mut rec, &t.spec);
            stored.push(cronoq_core::StoredTask {
                record: rec,
                pool: t.spec.pool.clone(),
                kind: t.spec.kind.clone(),
            });
        }
        for t in terminal {
            let spec = cronoq_core::TaskSpec {
                key: t.key.as_deref(),
                ..cronoq_core::TaskSpec::new(&first_pool)
            };
            let mut rec = TaskRecord::from_spec(spec, 0, 0);
            let at = self.secs(t.at);
            rec.id = t.id.0;
            rec.status = t.status.to_core();
            (rec.submitted_at, rec.finished_at) = (at, at);
            stored.push(cronoq_core::StoredTask {
                record: rec,
                pool: first_pool.clone(),
                kind: no_kind.clone(),
            });
        }
        self.engine.restore(stored, now, &HashMap::new());
        let base = self.base;
        let secs = move |t: Time| t.diff_secs(base);
        let dropped = self
            .schedules
            .resume(&mut self.engine, recurring, secs, now);
        if let Some(wal) = &mut self.wal {
            for name in dropped {
                wal.recurring(Mutation::RecurringRemove { name });
            }
        }
        for t in tasks {
            let live = self
                .engine
                .lookup(cronoq_core::TaskRef::Id(t.id.0))
                .is_some_and(|r| !r.status.is_terminal());
            if live {
                let p = self.pool_index[&t.spec.pool];
                let entry = self.live_task(t.spec, p);
                self.live.insert(t.id.0, entry);
            }
        }
        self.apply(now);
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

    /// Starts an attempt's task; false when `execute` panicked (the attempt has failed).
    /// (Inlined into `apply`, the hot path, although `release` calls it too.)
    #[inline(always)]
    fn launch(&mut self, att: Attempt, now: f64) -> bool {
        let live = self.live.get(&att.task).expect("a started task is live");
        let pool = &self.pools[live.pool];
        let token = CancellationToken::new();
        let beat = pool.config.lease_ttl.map(|_| {
            Arc::new(Beat {
                lease: LeaseId(att.lease),
                in_flight: AtomicBool::new(false),
                to_driver: self.beat_tx.clone(),
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
            att.slot.clone().unwrap_or_else(|| self.no_group.clone()),
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
        telemetry::parent(&span, &live.tags);
        let mark = self.telemetry.start(live.pool, &live.kind, now);
        let executor = pool.executor.clone();
        let payload = live.payload.clone();
        let fut = match catch_unwind(AssertUnwindSafe(|| executor.execute(ctx, payload))) {
            Ok(fut) => fut,
            Err(p) => {
                let message = panic_message(&panic_text(p.as_ref()));
                self.engine.fail(att.lease, now, &message, true, None);
                self.telemetry.end(&mark, false, now);
                return false;
            }
        };
        let (task, lease) = (att.task, att.lease);
        let mut fut = CatchUnwind(fut);
        if self.first_poll && !self.dropping {
            // A no-op waker: the driver need not wake for it, and a future still pending is
            // spawned, and tokio polls a new task at once, which then registers its own waker.
            let mut cx = Context::from_waker(Waker::noop());
            if let Poll::Ready(out) = span.in_scope(|| Pin::new(&mut fut).poll(&mut cx)) {
                self.ready.push(Ready {
                    task,
                    lease,
                    mark,
                    out,
                });
                return true;
            }
        }
        let done = self.to_driver.clone();
        let join = tokio::spawn(
            async move {
                let out = fut.await;
                // The driver may have stopped meanwhile: nobody to tell.
                let _ = done.send(FromTasks::Done(task, lease, out));
            }
            .instrument(span),
        );
        let live = self.live.get_mut(&task).expect("a started task is live");
        live.running = Some(Running {
            lease,
            token,
            abort: join,
            mark,
        });
        self.running += 1;
        true
    }

    /// Takes the task's running attempt if it is this lease's.
    fn take_running(&mut self, task: u64, lease: u64) -> Option<(usize, Running)> {
        let live = self.live.get_mut(&task)?;
        if live.running.as_ref().is_none_or(|r| r.lease != lease) {
            return None;
        }
        self.running -= 1;
        live.running.take().map(|r| (live.pool, r))
    }

    /// The engine gave an attempt up: its executor's abort hook, its token, its future.
    fn abort(&mut self, att: &Attempt) {
        let Some((pool, run)) = self.take_running(att.task, att.lease) else {
            return; // it had reported already (a cancellation of its own)
        };
        let executor = &self.pools[pool].executor;
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
        self.dropping = true;
        self.telemetry.end(&run.mark, false, self.last_now.get().0);
        tracing::debug!(
            task = att.task,
            lease = att.lease,
            reason = att.abort_reason.map_or("", |r| r.message()),
            "attempt given up"
        );
    }

    /// An attempt's task reported its outcome.
    fn on_done(
        &mut self,
        task: u64,
        lease: u64,
        out: Result<Result<O, TaskError>, String>,
        now: f64,
    ) {
        let Some((_, run)) = self.take_running(task, lease) else {
            return; // the engine gave it up first: the result is discarded
        };
        self.settle(task, lease, &run.mark, out, now);
    }

    /// Takes the outcomes of the attempts that were ready at their first poll, as `on_done`
    /// does those sent by attempts' tasks.
    fn take_ready(&mut self, now: f64) {
        // The list goes back emptied: no allocation per wake-up (settling launches nothing).
        let mut ready = std::mem::take(&mut self.ready);
        // They come before anything else of this wake-up, and nothing gives an attempt up
        // between its launch and then: the engine still runs each.
        for r in ready.drain(..) {
            self.settle(r.task, r.lease, &r.mark, r.out, now);
        }
        self.ready = ready;
    }

    /// An attempt's outcome, to the engine and the metrics.
    fn settle(
        &mut self,
        task: u64,
        lease: u64,
        mark: &AttemptMark,
        out: Result<Result<O, TaskError>, String>,
        now: f64,
    ) {
        self.telemetry.end(mark, matches!(out, Ok(Ok(_))), now);
        match out {
            Ok(Ok(output)) => {
                if let Some(live) = self.live.get_mut(&task) {
                    live.output = Some(Arc::new(output));
                }
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

    fn on_beat(&mut self, beat: &Beat, now: f64) {
        beat.in_flight.store(false, Ordering::Release);
        self.engine.heartbeat(beat.lease.0, now);
    }

    // --- ends and events -----------------------------------------------------------------

    /// A task ended: its handles are resolved. (Inlined into `apply`, the hot path, although
    /// `release` calls it too.)
    #[inline(always)]
    fn finished(&mut self, rec: &TaskRecord) {
        let Some(mut live) = self.live.remove(&rec.id) else {
            return;
        };
        if let Some(run) = live.running.take() {
            self.running -= 1;
            self.telemetry.end(&run.mark, false, self.last_now.get().0);
        }
        self.telemetry.finished(live.pool, rec.status);
        let outcome = if rec.status == Status::Succeeded {
            match live.output {
                Some(output) => {
                    self.cache.put(rec.id, output.clone());
                    Ok(output)
                }
                None => Err(TaskFailure::OutputUnavailable { id: TaskId(rec.id) }),
            }
        } else {
            Err(ended(rec))
        };
        live.waiters.resolve(outcome);
    }

    fn publish(&mut self, ev: cronoq_core::model::StatusEvent) {
        // No receiver left: nobody to tell.
        let _ = self.events.send(self.event(ev));
    }

    fn event(&self, ev: cronoq_core::model::StatusEvent) -> StatusEvent {
        let status = TaskStatus::from_core(ev.status);
        let message = if status == TaskStatus::Cancelled && self.self_cancelled.contains(&ev.id) {
            None // ended by its executor: no reason to give
        } else {
            ev.message
        };
        let pool = self.pool_index.get(&ev.pool).copied().unwrap_or_default();
        StatusEvent {
            id: TaskId(ev.id),
            pool: PoolId(u16::try_from(pool).unwrap_or(u16::MAX)),
            key: ev.key,
            status,
            attempt: ev.attempt,
            at: self.time(ev.at),
            message,
        }
    }

    /// A handle of a task the engine knows.
    /// A live task's handle waits for its end (which `finished` sends); the engine is asked
    /// only about a task that has left the table.
    fn make_handle(&mut self, id: u64, duplicate: bool) -> TaskHandle<O> {
        let control = self.to_driver.clone();
        if let Some(live) = self.live.get_mut(&id) {
            let (tx, rx) = oneshot::channel();
            live.waiters.push(tx);
            return TaskHandle::waiting(TaskId(id), duplicate, rx, control);
        }
        let rec = self
            .engine
            .lookup(cronoq_core::TaskRef::Id(id))
            .expect("a known task");
        let outcome = if rec.status == Status::Succeeded {
            match (self.cache.outputs.get(&id), &self.wal) {
                (Some(output), _) => Ok(output.clone()),
                (None, Some(wal)) => return stored_output(wal, id, duplicate, control),
                (None, None) => Err(TaskFailure::OutputUnavailable { id: TaskId(id) }),
            }
        } else {
            Err(ended(rec))
        };
        TaskHandle::known(TaskId(id), duplicate, outcome, control)
    }

    // --- commands ------------------------------------------------------------------------

    fn on_command(&mut self, c: Command<P, O>, now: f64) {
        match c {
            Command::Submit(s) => self.on_submit(s, now),
            Command::Handle { target, reply } => {
                let id = self.engine.lookup(target.to_core()).map(|rec| rec.id);
                let handle = id.map(|id| self.make_handle(id, false));
                let _ = reply.send(handle);
            }
            Command::Cancel { target, reply } => {
                let cancelled = self.engine.cancel(target.to_core(), now);
                // The attempt is given up before the caller hears back.
                self.apply(now);
                self.answer(Reply::Cancel(reply, cancelled));
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
                    totals: self.schedules.totals(s.totals),
                });
            }
            Command::SetCapacity {
                pool,
                capacity,
                reply,
            } => {
                if self.stopping.is_none() {
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
                    let copy = self.wal.is_some().then(|| (*spec).clone());
                    let answer = self.schedules.add(&mut self.engine, *spec, now);
                    if let (Ok(()), Some(wal), Some(spec)) = (&answer, &mut self.wal, copy) {
                        wal.recurring(Mutation::RecurringUpsert { spec });
                    }
                    // With a store, its next occurrence goes into the same batch.
                    self.apply(now);
                    answer
                };
                self.answer(Reply::Added(reply, answer));
            }
            Command::RemoveRecurring { name, reply } => {
                let now = self.now();
                let removed = self.schedules.remove(&mut self.engine, &name, now);
                if let (true, Some(wal)) = (removed, &mut self.wal) {
                    wal.recurring(Mutation::RecurringRemove { name });
                }
                // Its occurrences not started yet end before the caller hears back.
                self.apply(now);
                self.answer(Reply::Cancel(reply, removed));
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

    fn on_submit(&mut self, s: Submission<P, O>, now: f64) {
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
                    let _ = reply.send(Ok(results.into_iter().flatten().collect()));
                }
                Submission::Batch { reply, .. } => {
                    let _ = reply.send(Err(Error::Shutdown));
                }
            }
            return;
        }
        match s {
            Submission::One {
                task,
                handle,
                reply,
            } => match self.admit(task.into_spec(), false, now) {
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
                Ok(r) => self.answer(Reply::Batch(reply, r)),
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
                    self.telemetry.submitted(p);
                    self.journal_spec(id, &spec);
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
        self.live.reserve(specs.len());
        for (spec, (id, duplicate)) in specs.into_iter().zip(admitted) {
            if !duplicate {
                let p = self.pool_index[&spec.pool];
                self.telemetry.submitted(p);
                self.journal_spec(id, &spec);
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
                            self.answer(Reply::Batch(reply, r));
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
        self.answer(Reply::One(reply, answer));
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
            let results = g.results.into_iter().flatten().collect();
            self.answer(Reply::Many(g.reply, results));
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
            self.telemetry.submitted(p);
            self.journal_spec(id, &spec);
            self.live.insert(id, self.live_task(spec, p));
        }
    }

    /// A task admitted: with a store, its spec is kept for the journal.
    #[inline(always)]
    fn journal_spec(&mut self, id: u64, spec: &TaskSpec<P>) {
        if let Some(wal) = &mut self.wal {
            wal.admitted(id, spec.clone());
        }
    }

    fn live_task(&self, spec: TaskSpec<P>, pool: usize) -> Live<P, O> {
        Live {
            payload: spec.payload,
            pool,
            kind: spec.kind,
            key: spec.key,
            tags: if spec.tags.is_empty() {
                self.no_tags.clone()
            } else {
                spec.tags.into()
            },
            deadline: spec.deadline.map(Clock::to_system),
            timeout: spec.timeout,
            running: None,
            waiters: Waiters::new(),
            output: None,
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
            if let Some((_, run)) = self.take_running(att.task, att.lease) {
                run.token.cancel();
                run.abort.abort();
                self.telemetry.end(&run.mark, false, now);
            }
        }
        for r in self.ready.drain(..) {
            self.telemetry.end(&r.mark, false, now);
        }
    }
}

/// Moves up to `BATCH` messages of `rx` into `buf`: polled (its waker registered) unless
/// another channel already gave something (`try_recv` then); true if any came.
fn take<T>(
    rx: &mut UnboundedReceiver<T>,
    cx: &mut Context<'_>,
    buf: &mut Vec<T>,
    got: bool,
) -> bool {
    if !got {
        return matches!(rx.poll_recv_many(cx, buf, BATCH), Poll::Ready(n) if n > 0);
    }
    let before = buf.len();
    while buf.len() < BATCH {
        match rx.try_recv() {
            Ok(m) => buf.push(m),
            Err(_) => break, // the driver holds a sender: never disconnected
        }
    }
    buf.len() > before
}

/// A late handle of a task that succeeded before the output cache's memory: its output from
/// the store.
fn stored_output<P: Send + Sync + 'static, O: Send + Sync + 'static>(
    wal: &Wal<P, O>,
    id: u64,
    duplicate: bool,
    control: UnboundedSender<FromTasks<O>>,
) -> TaskHandle<O> {
    let (tx, rx) = oneshot::channel();
    let store = wal.store().clone();
    tokio::spawn(async move {
        let outcome = match store.load_output(TaskId(id)).await {
            Ok(Some(output)) => Ok(Arc::new(output)),
            Ok(None) | Err(_) => Err(TaskFailure::OutputUnavailable { id: TaskId(id) }),
        };
        let _ = tx.send(outcome);
    });
    TaskHandle::waiting(TaskId(id), duplicate, rx, control)
}

/// How a task that did not succeed ended, for its handles.
fn ended(rec: &TaskRecord) -> TaskFailure {
    let status = TaskStatus::from_core(rec.status);
    TaskFailure::Ended {
        status,
        message: rec.message.clone().unwrap_or_else(|| status.name().into()),
    }
}
