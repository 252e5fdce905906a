//! [`Scheduler`] and its [`Builder`]: the handle programs use, and how one is started.

use std::sync::Arc;
use std::time::Duration;

use cronoq_core::{Engine, EngineOptions, EventLevel, MersenneTwister};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::blocking::BlockingScheduler;
use crate::config::{CoreConfig, UrgencyConfig};
use crate::driver::{Admitted, Command, Driver, ListQuery, PoolRuntime, Setup, Submission};
use crate::error::{Error, SubmitError};
use crate::handle::TaskHandle;
use crate::pool::Pool;
use crate::priority::PriorityConfig;
use crate::recurring::{Recurring, RecurringInfo};
use crate::resources::ResourceConfig;
use crate::scaling::Scaling;
use crate::snapshot::Snapshot;
use crate::store::{MemoryStore, Recovered, Store, TimeBase};
use crate::task::Task;
use crate::time::{Clock, Time};
use crate::types::{StatusEvent, Submitted, TaskId, TaskRef, TaskStatus, TaskSummary};
use crate::unwind::CatchUnwind;
use crate::wal::Wal;

/// How a scheduler's driver ended, once it has (`None` while it runs).
type Exit = Option<Result<(), Error>>;

/// Sets a scheduler up: its pools and options. [`Scheduler::builder`] gives one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), cronoq::Error> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cronoq::{Pool, Scheduler, TaskError};
///
/// let s = Scheduler::<String, usize>::builder()
///     .pool(Pool::fixed("default", 4).executor_fn(|_ctx, s: Arc<String>| async move {
///         Ok::<_, TaskError>(s.len())
///     }))
///     .emit_transitions(true)
///     .output_cache(100)
///     .build()
///     .await?;
/// assert_eq!(&*s.pools()[0], "default");
/// s.shutdown(Duration::from_secs(1)).await
/// # }
/// ```
pub struct Builder<P, O> {
    pools: Vec<Pool<P, O>>,
    store: Arc<dyn Store<P, O>>,
    emit_transitions: bool,
    queue_capacity: usize,
    events_capacity: usize,
    drop_grace: Duration,
    output_cache: usize,
    max_store_outage: Duration,
    core: CoreConfig,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Default for Builder<P, O> {
    fn default() -> Self {
        Builder {
            pools: Vec::new(),
            store: Arc::new(MemoryStore),
            emit_transitions: false,
            queue_capacity: 8192,
            events_capacity: 4096,
            drop_grace: Duration::from_secs(5),
            output_cache: 1024,
            max_store_outage: Duration::from_secs(300),
            core: CoreConfig::default(),
        }
    }
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Builder<P, O> {
    /// Adds a pool (at least one; names unique). Pools keep this order everywhere: in
    /// [`Scheduler::pools`], in snapshots and as [`PoolId`](crate::PoolId)s.
    pub fn pool(mut self, pool: Pool<P, O>) -> Self {
        self.pools.push(pool);
        self
    }

    /// Adds a resource that tasks of every pool may take ([`Task::resource`]); names unique.
    pub fn resource(mut self, resource: ResourceConfig) -> Self {
        self.core.resources.push(resource);
        self
    }

    /// Sets the classes' base scores and aging (see [`PriorityConfig`]).
    pub fn priority(mut self, priority: PriorityConfig) -> Self {
        self.core.priority = priority;
        self
    }

    /// Sets the deadline urgency curve (see [`UrgencyConfig`]).
    pub fn urgency(mut self, urgency: UrgencyConfig) -> Self {
        self.core.urgency = urgency;
        self
    }

    /// Sets the store (default [`MemoryStore`]). With a store that persists, every change is
    /// written ahead of its effects and the scheduler starts from what the store holds (see
    /// [`Store`] and the crate's README, "Persistence").
    pub fn store(self, store: impl Store<P, O>) -> Self {
        self.store_arc(Arc::new(store))
    }

    /// Sets a shared store (see [`Builder::store`]).
    pub fn store_arc(mut self, store: Arc<dyn Store<P, O>>) -> Self {
        self.store = store;
        self
    }

    /// Also broadcast non-terminal status changes to [`Scheduler::events`] (default: only
    /// ends).
    pub fn emit_transitions(mut self, on: bool) -> Self {
        self.emit_transitions = on;
        self
    }

    /// How many calls may queue for the scheduler's driver (default 8192, at least 1); callers
    /// wait for space beyond that.
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n.max(1);
        self
    }

    /// How many events an event receiver may fall behind before it misses some (default 4096,
    /// at least 1; rounded up to a power of two).
    pub fn events_capacity(mut self, n: usize) -> Self {
        self.events_capacity = n.max(1);
        self
    }

    /// How long running attempts may finish when the last [`Scheduler`] is dropped without
    /// [`shutdown`](Scheduler::shutdown) (default 5 s).
    pub fn drop_grace(mut self, grace: Duration) -> Self {
        self.drop_grace = grace;
        self
    }

    /// How many recent outputs are kept for handles attached after their task ended (default
    /// 1024; 0 keeps none).
    pub fn output_cache(mut self, n: usize) -> Self {
        self.output_cache = n;
        self
    }

    /// How long commits to a persistent store may keep failing with
    /// [`StoreError::Unavailable`](crate::StoreError::Unavailable) before the scheduler stops
    /// with that error (default 300 s).
    pub fn max_store_outage(mut self, limit: Duration) -> Self {
        self.max_store_outage = limit;
        self
    }

    /// Changes engine-wide settings (see [`CoreConfig`]).
    pub fn configure(mut self, f: impl FnOnce(&mut CoreConfig)) -> Self {
        f(&mut self.core);
        self
    }

    /// Starts the scheduler on the current tokio runtime, which must have its time driver
    /// enabled.
    ///
    /// With a store that persists it first waits until this instance leads
    /// ([`Store::acquire_leadership`]; ids then carry its epoch in their top 16 bits), reads
    /// the store back ([`Store::recover`]) and takes its tasks back: live ones run again under
    /// their ids (one whose attempt was running counts that attempt as used: it retries after
    /// its backoff, or is dead-lettered when it has no attempts left), ended ones keep their
    /// keys and statuses; recurring schedules resume with their next occurrence (one the
    /// configuration no longer supports, such as a pool or resource gone, is dropped, deleted
    /// from the store and counted in `recurring_invalid`). If anything fails after leadership
    /// was acquired, it is released.
    ///
    /// # Errors
    /// [`Error::Config`] when the configuration cannot work: no pool, a pool without executor,
    /// `min_workers > max_workers`, a NUL in a pool name, two pools with one name (checked in
    /// this order), invalid settings (autoscaling, retry policy, fairness weights, urgency,
    /// priority scores, metrics window, reservable fraction), a resource without permits,
    /// tokens or a finite positive rate, two resources with one name; [`Error::Store`] when the
    /// store fails to lead or to recover.
    pub async fn build(self) -> Result<Scheduler<P, O>, Error> {
        let store = self.store.clone();
        let (mut setup, parts) = if store.persists() {
            let epoch = store.acquire_leadership().await?;
            let started = match store.recover(TimeBase::default()).await {
                Ok(recovered) => self.prepare(Some((epoch, recovered))),
                Err(e) => Err(Error::Store(e)),
            };
            match started {
                Ok(started) => started,
                Err(e) => {
                    store.release_leadership().await;
                    return Err(e);
                }
            }
        } else {
            self.prepare(None)?
        };
        if let Some(scaling) = &mut setup.scaling {
            let now = setup.clock.now().diff_secs(setup.base);
            scaling.initial(&mut setup.engine, now).await;
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        tokio::spawn(async move {
            let result = match CatchUnwind(Box::pin(Driver::new(setup).run())).await {
                Ok(exit) => exit,
                Err(text) => {
                    tracing::error!(panic = %text, "the scheduler's driver panicked: it stops");
                    Err(Error::Internal(format!("driver panicked: {text}")))
                }
            };
            // Every caller of shutdown() and stopped() reads it.
            exit_tx.send_replace(Some(result));
        });
        Ok(Scheduler {
            inner: Arc::new(Inner {
                commands: parts.commands,
                events: parts.events,
                pools: parts.pools,
                clock: parts.clock,
                exit: exit_rx,
            }),
        })
    }

    /// Starts the scheduler on a runtime of its own, for programs without tokio (see
    /// [`BlockingScheduler`]).
    ///
    /// # Errors
    /// As [`Builder::build`], and [`Error::Config`] when the runtime cannot be created.
    pub fn build_blocking(self) -> Result<BlockingScheduler<P, O>, Error> {
        BlockingScheduler::start(self)
    }

    /// Checks the configuration and makes everything the driver and the handles need; with a
    /// persistent store, from its epoch and what it held.
    fn prepare(self, durable: Option<(u16, Recovered<P>)>) -> Result<Prepared<P, O>, Error> {
        let config = Error::Config;
        if self.pools.is_empty() {
            return Err(config("at least one pool is required".into()));
        }
        if let Some(p) = self.pools.iter().find(|p| p.executor.is_none()) {
            return Err(config(format!("pool '{}' has no executor", p.config.name)));
        }
        if let Some(p) = self
            .pools
            .iter()
            .find(|p| p.config.min_workers > p.config.max_workers)
        {
            return Err(config(format!(
                "pool '{}': min_workers > max_workers",
                p.config.name
            )));
        }
        if self.pools.iter().any(|p| p.config.name.contains('\0')) {
            return Err(config("pool names must not contain NUL".into()));
        }
        for (i, p) in self.pools.iter().enumerate() {
            if self.pools[..i]
                .iter()
                .any(|q| q.config.name == p.config.name)
            {
                return Err(config(format!("duplicate pool '{}'", p.config.name)));
            }
        }
        let mut core_pools = Vec::with_capacity(self.pools.len());
        let mut runtimes = Vec::with_capacity(self.pools.len());
        let mut scalers = Vec::with_capacity(self.pools.len());
        for pool in self.pools {
            scalers.push((pool.config.name.clone(), pool.scaler));
            let name = pool.config.name.clone();
            core_pools.push(
                pool.config
                    .to_core()
                    .map_err(|m| config(format!("pool '{name}': {m}")))?,
            );
            runtimes.push(PoolRuntime {
                name,
                executor: pool.executor.expect("checked above"),
                config: pool.config,
            });
        }
        let (scoring, metrics_window, resources) = self.core.to_core().map_err(config)?;
        for pool in &mut core_pools {
            pool.metrics_window = metrics_window;
        }
        let scaling = Scaling::new(scalers);
        let clock = Clock::start();
        // Engine time is Unix time in seconds, as cron schedules need (0.0 means "never").
        let base = Time::ZERO;
        let now = clock.now().diff_secs(base);
        let options = EngineOptions {
            scoring,
            event_level: EventLevel::None,
            retention: self.core.retention.as_secs_f64(),
            retention_max: self.core.retention_max,
            resources,
            // Without custom scalers the engine's targets are the in-process slots.
            elastic: scaling.is_none(),
            ..EngineOptions::default()
        };
        // Ids of a leadership are `epoch << 48 | n` (as the Python store numbers them), past
        // those the store holds.
        let first_id = durable.as_ref().map_or(1, |(epoch, recovered)| {
            (u64::from(*epoch) << 48 | 1).max(recovered.next_id)
        });
        let options = EngineOptions {
            first_id,
            journal: durable.is_some(),
            ..options
        };
        let rng = MersenneTwister::new(i128::from(self.core.seed));
        let engine = Engine::new(core_pools, now, options, rng).map_err(|e| config(e.0))?;
        let (commands_tx, commands_rx) = mpsc::channel(self.queue_capacity);
        let (events, _) = broadcast::channel(self.events_capacity);
        let pools: Arc<[Arc<str>]> = runtimes.iter().map(|p| p.name.clone()).collect();
        let setup = Setup {
            engine,
            clock,
            base,
            pools: runtimes,
            commands: commands_rx,
            events: events.clone(),
            emit_transitions: self.emit_transitions,
            output_cache: self.output_cache,
            drop_grace: self.drop_grace,
            scaling,
            global_bounds: self.core.global_bounds.clone(),
            durable: durable.map(|(epoch, recovered)| {
                let wal = Wal::new(self.store.clone(), epoch, self.max_store_outage);
                let r = recovered;
                (wal, r.tasks, r.terminal, r.recurring)
            }),
        };
        let parts = Parts {
            commands: commands_tx,
            events,
            pools,
            clock,
        };
        Ok((setup, parts))
    }
}

/// A checked configuration: the driver's setup, and the handle side's parts.
type Prepared<P, O> = (Setup<P, O>, Parts<P, O>);

/// What the scheduler's handle side keeps of a new scheduler.
struct Parts<P, O> {
    commands: mpsc::Sender<Command<P, O>>,
    events: broadcast::Sender<StatusEvent>,
    pools: Arc<[Arc<str>]>,
    clock: Clock,
}

/// A running scheduler: submit tasks, look them up, cancel them, watch them, stop it.
///
/// Cheap to clone (clones share one scheduler), `Send` and `Sync`. Every call goes to the
/// scheduler's driver task; after it has stopped, calls return [`Error::Shutdown`]. When the
/// last clone is dropped without [`shutdown`](Scheduler::shutdown), the scheduler stops as if
/// `shutdown(drop_grace)` had been called.
///
/// `P` is the payload type and `O` the output type, shared by all pools; use an enum for
/// different kinds of work.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cronoq::{Pool, Priority, Scheduler, Task, TaskContext, TaskError};
///
/// let s = Scheduler::<String, String>::builder()
///     .pool(Pool::new("default").executor_fn(|_ctx: TaskContext, name: Arc<String>| async move {
///         Ok::<_, TaskError>(format!("hello, {name}"))
///     }))
///     .build()
///     .await?;
/// let handle = s.submit(Task::new("ada".to_string()).priority(Priority::High)).await?;
/// assert_eq!(*handle.await?, "hello, ada");
/// s.shutdown(Duration::from_secs(5)).await?;
/// # Ok(())
/// # }
/// ```
pub struct Scheduler<P, O> {
    inner: Arc<Inner<P, O>>,
}

struct Inner<P, O> {
    commands: mpsc::Sender<Command<P, O>>,
    events: broadcast::Sender<StatusEvent>,
    pools: Arc<[Arc<str>]>,
    clock: Clock,
    exit: watch::Receiver<Exit>,
}

impl<P, O> Clone for Scheduler<P, O> {
    fn clone(&self) -> Self {
        Scheduler {
            inner: self.inner.clone(),
        }
    }
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Scheduler<P, O> {
    /// A builder with the default settings.
    pub fn builder() -> Builder<P, O> {
        Builder::default()
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command<P, O>,
    ) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        if let Some(command) = self.try_send(make(tx))? {
            self.send(command).await?;
        }
        rx.await.map_err(|_| Error::Shutdown)
    }

    /// Sends a command at once if the queue has room (it finds none while earlier senders
    /// wait, so they keep their turn); else gives it back, for [`send`](Self::send). Not
    /// async, so a command sent at once is not moved into a future that holds it across an
    /// await (a task's spec is large: each move is a copy).
    fn try_send(&self, command: Command<P, O>) -> Result<Option<Command<P, O>>, Error> {
        match self.inner.commands.try_send(command) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full(command)) => Ok(Some(command)),
            Err(TrySendError::Closed(_)) => Err(Error::Shutdown),
        }
    }

    /// Sends a command once the queue has room.
    async fn send(&self, command: Command<P, O>) -> Result<(), Error> {
        self.inner
            .commands
            .send(command)
            .await
            .map_err(|_| Error::Shutdown)
    }

    /// The task resolved against the scheduler's clock and checked.
    fn prepare(&self, task: impl Into<Task<P>>) -> Result<crate::task::TaskSpec<P>, Error> {
        let mut spec = task.into().resolve(|| self.inner.clock.now());
        crate::telemetry::capture(&mut spec.tags);
        spec.check()?;
        Ok(spec)
    }

    /// [`prepare`](Scheduler::prepare) in the box the task is sent in: it is resolved and
    /// checked there (each move of a task is a copy).
    fn prepare_boxed(&self, task: impl Into<Task<P>>) -> Result<Box<Task<P>>, Error> {
        let mut task = Box::new(task.into());
        task.resolve_in_place(|| self.inner.clock.now());
        crate::telemetry::capture(task.tags_mut());
        task.spec().check()?;
        Ok(task)
    }

    /// Sends the task at once (when the caller's future is first polled) and returns what
    /// awaits the answer: `call` inlined, so that the task is moved through no future (each
    /// move of a task is a copy); a command the full queue gives back waits in a boxed future.
    fn admit(
        &self,
        task: impl Into<Task<P>>,
        handle: bool,
    ) -> impl Future<Output = Result<Admitted<O>, Error>> + '_ {
        let sent = self.prepare_boxed(task).and_then(|task| {
            let (reply, rx) = oneshot::channel();
            let command = Command::Submit(Submission::One {
                task,
                handle,
                reply,
            });
            let waiting = self.try_send(command)?.map(|c| Box::pin(self.send(c)));
            Ok((waiting, rx))
        });
        async move {
            let (waiting, rx) = sent?;
            if let Some(send) = waiting {
                send.await?;
            }
            rx.await.map_err(|_| Error::Shutdown)?
        }
    }

    /// Submits a task and returns its handle once the task is admitted.
    ///
    /// A key that a live or retained task holds gives a handle to that task
    /// ([`is_duplicate`](TaskHandle::is_duplicate)); the new payload is ignored. A submission to
    /// a full pool whose overflow policy is `Wait` waits here until there is room (first come,
    /// first served per pool and priority class); dropping the future gives up waiting.
    ///
    /// # Errors
    /// [`Error::Submit`] when the task is not admitted (malformed, unknown pool, overload),
    /// [`Error::Shutdown`] when the scheduler stops or has stopped.
    pub async fn submit(&self, task: impl Into<Task<P>>) -> Result<TaskHandle<O>, Error> {
        let admitted = self.admit(task, true).await?;
        Ok(admitted.handle.expect("a handle was asked for"))
    }

    /// [`submit`](Scheduler::submit) without a handle: the id, and whether the key named an
    /// existing task.
    ///
    /// # Errors
    /// As [`submit`](Scheduler::submit).
    pub async fn enqueue(&self, task: impl Into<Task<P>>) -> Result<Submitted, Error> {
        Ok(self.admit(task, false).await?.submitted)
    }

    /// Admits each task on its own, in order, in one call: one result per task. Tasks for a
    /// full `Wait` pool wait for room as [`submit`](Scheduler::submit) does; the call returns
    /// when every task is decided.
    ///
    /// # Errors
    /// [`Error::Shutdown`] when the scheduler has stopped; each task's own error is in its
    /// result.
    pub async fn enqueue_many(
        &self,
        tasks: Vec<Task<P>>,
    ) -> Result<Vec<Result<Submitted, Error>>, Error> {
        let mut results = Vec::with_capacity(tasks.len());
        let mut specs = Vec::with_capacity(tasks.len());
        for (i, task) in tasks.into_iter().enumerate() {
            match self.prepare(task) {
                Ok(spec) => {
                    results.push(None);
                    specs.push((i, spec));
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        self.call(|reply| {
            Command::Submit(Submission::Many {
                specs,
                results,
                reply,
            })
        })
        .await?
    }

    /// Admits every task or none; handles in input order. A key an existing task holds gives
    /// a handle to that task; a key twice in the batch is an error. A batch for a full `Wait`
    /// pool waits until it fits, unless it could not fit even into an empty queue.
    ///
    /// # Errors
    /// The first problem found ([`Error::Submit`]), [`Error::Shutdown`].
    pub async fn submit_batch(&self, tasks: Vec<Task<P>>) -> Result<Vec<TaskHandle<O>>, Error> {
        // Sized at once (collecting into a `Result` cannot know the size: it grows by doubling).
        let mut specs = Vec::with_capacity(tasks.len());
        for task in tasks {
            specs.push(self.prepare(task)?);
        }
        self.call(|reply| Command::Submit(Submission::Batch { specs, reply }))
            .await?
    }

    /// A new handle of a live or recently ended task (`None` if it is unknown). For an ended
    /// task it resolves at once: to the output while the output cache keeps it, else to
    /// [`TaskFailure::OutputUnavailable`](crate::TaskFailure::OutputUnavailable), or to how
    /// it ended.
    ///
    /// # Errors
    /// [`Error::Shutdown`].
    pub async fn handle(&self, target: impl Into<TaskRef>) -> Result<Option<TaskHandle<O>>, Error> {
        let target = target.into();
        self.call(|reply| Command::Handle { target, reply }).await
    }

    /// Cancels a task: `true` if it was live. A running attempt is given up at once (the
    /// executor's [`abort`](crate::Executor::abort) hook, its token, then its future is
    /// dropped) and the task ends [`Cancelled`](TaskStatus::Cancelled).
    ///
    /// # Errors
    /// [`Error::Shutdown`].
    pub async fn cancel(&self, target: impl Into<TaskRef>) -> Result<bool, Error> {
        let target = target.into();
        self.call(|reply| Command::Cancel { target, reply }).await?
    }

    /// A live or recently ended task's status (`None` if it is unknown).
    ///
    /// # Errors
    /// [`Error::Shutdown`].
    pub async fn status(&self, target: impl Into<TaskRef>) -> Result<Option<TaskStatus>, Error> {
        let target = target.into();
        self.call(|reply| Command::Status { target, reply }).await
    }

    /// Live tasks in id order: of these pools (all if empty; unknown names match nothing), in
    /// these statuses (all if empty), with ids above `after`, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Shutdown`].
    pub async fn list_tasks(
        &self,
        pools: &[&str],
        statuses: &[TaskStatus],
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskSummary>, Error> {
        let query = ListQuery {
            pools: pools.iter().map(|p| p.to_string()).collect(),
            statuses: statuses.to_vec(),
            after,
            limit,
        };
        self.call(|reply| Command::List { query, reply }).await
    }

    /// Every pool's state and quality metrics now.
    ///
    /// # Errors
    /// [`Error::Shutdown`].
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        self.call(|reply| Command::Snapshot { reply }).await
    }

    /// Sets a pool's workers now (not limited to `max_workers`); its autoscaler, if any, may
    /// change them again later. Ignored once the scheduler is stopping.
    ///
    /// # Errors
    /// [`SubmitError::UnknownPool`] (as [`Error::Submit`]), [`Error::Shutdown`].
    pub async fn set_capacity(&self, pool: &str, capacity: u32) -> Result<(), Error> {
        let Some(pool) = self.inner.pools.iter().find(|p| &***p == pool).cloned() else {
            return Err(SubmitError::UnknownPool(pool.into()).into());
        };
        self.call(|reply| Command::SetCapacity {
            pool,
            capacity,
            reply,
        })
        .await
    }

    /// Declares or resizes the worker group of `pool` carrying exactly `labels` (in any
    /// order; empty: the pool's unlabeled slots) with `capacity` slots (0 removes them). The
    /// pool's capacity is the sum of its groups'. Tasks with [`Task::label`]s run only on a
    /// group carrying all of them. Ignored once the scheduler is stopping.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cronoq::{Pool, Scheduler, Task, TaskContext, TaskError};
    ///
    /// let s = Scheduler::<u32, String>::builder()
    ///     .pool(Pool::fixed("default", 1).executor_fn(|ctx: TaskContext, _n: Arc<u32>| async move {
    ///         Ok::<_, TaskError>(ctx.group.iter().map(|(k, v)| format!("{k}={v}")).collect())
    ///     }))
    ///     .build()
    ///     .await?;
    /// s.set_group_capacity("default", &[("gpu", "a100")], 2).await?;
    /// let h = s.submit(Task::new(1).label("gpu", "a100")).await?;
    /// assert_eq!(*h.await?, "gpu=a100");
    /// assert_eq!(s.snapshot().await?.pools[0].capacity, 3);
    /// s.shutdown(Duration::from_secs(1)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`SubmitError::UnknownPool`] (as [`Error::Submit`]), [`Error::Shutdown`].
    pub async fn set_group_capacity(
        &self,
        pool: &str,
        labels: &[(&str, &str)],
        capacity: u32,
    ) -> Result<(), Error> {
        let Some(pool) = self.inner.pools.iter().find(|p| &***p == pool).cloned() else {
            return Err(SubmitError::UnknownPool(pool.into()).into());
        };
        let labels = labels
            .iter()
            .map(|&(k, v)| (Arc::from(k), Arc::from(v)))
            .collect();
        self.call(|reply| Command::SetGroupCapacity {
            pool,
            labels,
            capacity,
            reply,
        })
        .await
    }

    /// Adds a recurring schedule, or replaces the one with its name (whose occurrences not
    /// started yet are cancelled). With a store that persists, it returns once the schedule
    /// and its next occurrence are written: the next leader resumes it.
    ///
    /// # Errors
    /// [`Error::Config`] for a template with an absolute deadline, a fixed start or a
    /// dependency, one that a submit would refuse (`invalid task: …`, `invalid template:
    /// unknown pool 'x'`, an unknown resource), a NUL in the name, an invalid cron expression
    /// (`invalid cron '<expr>': …`) or an unknown time zone; [`Error::Store`] when the store
    /// failed; [`Error::Shutdown`].
    pub async fn add_recurring(&self, recurring: Recurring<P>) -> Result<(), Error> {
        let spec = Box::new(recurring.into_spec()?);
        self.call(|reply| Command::AddRecurring { spec, reply })
            .await?
    }

    /// Removes a recurring schedule: `true` if there was one with this name. Its occurrences
    /// not started yet are cancelled. With a store that persists, it returns once the removal
    /// is written.
    ///
    /// # Errors
    /// [`Error::Store`] when the store failed; [`Error::Shutdown`].
    pub async fn remove_recurring(&self, name: &str) -> Result<bool, Error> {
        let name = Arc::from(name);
        self.call(|reply| Command::RemoveRecurring { name, reply })
            .await?
    }

    /// The recurring schedules, by name, with their next occurrence and latest task.
    ///
    /// # Errors
    /// [`Error::Shutdown`].
    pub async fn list_recurring(&self) -> Result<Vec<RecurringInfo>, Error> {
        self.call(|reply| Command::ListRecurring { reply }).await
    }

    /// A receiver of status events from now on: task ends, and every transition with
    /// [`Builder::emit_transitions`]. A receiver that falls more than the events capacity
    /// behind gets `RecvError::Lagged(n)` once and continues; after the scheduler has stopped
    /// and every clone is dropped it gets `RecvError::Closed`.
    pub fn events(&self) -> broadcast::Receiver<StatusEvent> {
        self.inner.events.subscribe()
    }

    /// The pools' names, in configuration order (`PoolId` indexes it).
    pub fn pools(&self) -> &[Arc<str>] {
        &self.inner.pools
    }

    /// The scheduler's clock.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Resolves when the scheduler has stopped.
    pub async fn stopped(&self) {
        let mut exit = self.inner.exit.clone();
        // An error means the driver task is gone (its runtime shut down): stopped too.
        let _ = exit.wait_for(Option::is_some).await;
    }

    /// Stops the scheduler: no new work is admitted or started, parked submissions fail with
    /// [`Error::Shutdown`], running attempts get up to `grace` to finish, and then the rest
    /// are cancelled (token cancelled, future dropped; the abort hook is not called). Handles
    /// of unfinished tasks resolve to [`TaskFailure::Shutdown`](crate::TaskFailure::Shutdown).
    ///
    /// Every caller (every clone) gets the same result, and calling it again is harmless. A
    /// `grace` too large to add to the current instant waits as long as a hundred years.
    ///
    /// # Errors
    /// [`Error::Internal`] if the driver failed.
    pub async fn shutdown(&self, grace: Duration) -> Result<(), Error> {
        // If the driver is gone already the command has nobody to go to: fine.
        let _ = self.inner.commands.send(Command::Shutdown { grace }).await;
        let mut exit = self.inner.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(done) => done.clone().unwrap_or(Ok(())),
            Err(_) => Err(Error::Shutdown),
        }
    }
}
