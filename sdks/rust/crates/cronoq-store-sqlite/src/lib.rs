//! A durable store for the cronoq library in one SQLite file, shared by a leader and its
//! standbys: [`SqliteStore`].
//!
//! The file is the one the Python library's `cronoq.SqliteStore` keeps, table for table and
//! column for column (schema version 5: `cronoq_meta`, `cronoq_leader`, `cronoq_tasks`,
//! `cronoq_recurring`, `cronoq_pools`), with the same encodings (times in Unix nanoseconds,
//! durations in float seconds, ids as signed 64-bit integers, options as the Python store's
//! JSON) and the same leader rules. A Rust and a Python process can therefore take turns
//! leading one file, and each reads what the other wrote.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), cronoq::StoreError> {
//! use bytes::Bytes;
//! use cronoq::{Mutation, Store, StoreQueries, TaskId, TaskSpec, TaskStatus, Time, TimeBase};
//! use cronoq_store_sqlite::SqliteStore;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = SqliteStore::open(dir.path().join("cronoq.db")).await?;
//! let epoch = Store::<Bytes, Bytes>::acquire_leadership(&store).await?;
//! let id = TaskId(u64::from(epoch) << 48 | 1);
//! let batch = [
//!     Mutation::Submitted {
//!         id,
//!         seq: 1,
//!         arrival: Time(1_700_000_000_000_000_000),
//!         spec: TaskSpec::new(Bytes::from_static(b"payload")).key("nightly"),
//!     },
//!     Mutation::Status {
//!         id,
//!         status: TaskStatus::Ready,
//!         attempt: 0,
//!         at: Time(1_700_000_000_000_000_000),
//!         message: None,
//!     },
//! ];
//! store.commit(epoch, TimeBase::default(), &batch, &[]).await?;
//!
//! let recovered = Store::<Bytes, Bytes>::recover(&store, TimeBase::default()).await?;
//! assert_eq!(recovered.tasks[0].spec.key.as_deref(), Some("nightly"));
//! let record = store.get_task(&"nightly".into()).await?.unwrap();
//! assert_eq!((record.id, record.status), (id, None)); // queued
//! # Ok(())
//! # }
//! ```
//!
//! # Leader and standbys
//!
//! [`Store::acquire_leadership`] waits until no other process holds an unexpired lease, then
//! writes a new epoch (the fencing token) and this process as the holder. While it leads, a
//! background task renews the lease every [`lease_renew`](SqliteStoreConfig::lease_renew)
//! and prunes ended tasks older than [`retention`](SqliteStoreConfig::retention); standbys
//! poll every [`lock_poll`](SqliteStoreConfig::lock_poll). Every write transaction first
//! renews the lease *where the epoch and holder are still ours*: after another process took
//! over, nothing is written and the call fails with [`StoreError::Fenced`]. As in the Python
//! store, the leader also holds an `flock` on `<path>-leader`, so that a standby on the same
//! host takes over as soon as a leader that exited frees it, without waiting for its lease.
//!
//! # Acknowledged means durable
//!
//! A batch is written whole or not at all, in one transaction, and [`Store::commit`] returns
//! only once it is committed (with [`full_sync`](SqliteStoreConfig::full_sync), synced to
//! disk). Attempt numbers never repeat: a task's row holds the number of its latest attempt
//! from the moment it started, so the attempt that was running when a leader stopped counts
//! as used by the next ([`cronoq::RecoveredTask::attempt`]).
//!
//! # Differences from the published `cronoq-store-sqlite`
//!
//! * Table names and columns are the Python store's: the published crate's
//!   `cronoq_schema_version` table is `cronoq_meta` here, and there is a `cronoq_pools`
//!   table, so that a file is shared with a Python process.
//! * SQLite is reached through `rusqlite` (bundled SQLite) on one thread of the store's own,
//!   not through an `sqlx` pool: there is no `pool()` method and no `max_connections`
//!   setting.
//! * What this library cannot carry on is refused by [`Store::recover`] instead of being
//!   dropped: paused pools (written by Python processes), or a schedule whose stored
//!   definition cannot be read, make it fail with [`StoreError::Other`] naming them. Tasks'
//!   dependencies, resources, fixed starts and labels, and recurring schedules (with their
//!   template's payload, next occurrence and latest occurrence), are written and read back in
//!   the Python store's encoding.
//! * A removed schedule's cancelled occurrences keep their keys in the file
//!   ([`Mutation::Status`] carries no key; the Python store clears them).
//! * Tags are written as the Python store's JSON object, in order: a key given twice reads
//!   back here as both pairs, in a Python process as its last value. A retry policy's
//!   multiplier below 1 (allowed here, not in Python) is written as it is, and a Python
//!   leader fails such a live task as a corrupt row. Durations are float seconds, so one
//!   longer than about 104 days may come back a few nanoseconds off.

#![warn(missing_docs)]

mod db;
mod lock;
mod rows;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use cronoq::{Mutation, Recovered, Store, StoreError, TaskId, TaskRef, TaskStatus, TimeBase};
use tokio::sync::{oneshot, watch};

use crate::db::Db;

/// A task as the store keeps it, with its output as bytes.
pub type TaskRecord = cronoq::TaskRecord<Bytes>;

/// The settings of a [`SqliteStore`]; the defaults are the Python `SqliteStore`'s.
///
/// ```
/// use std::time::Duration;
/// use cronoq_store_sqlite::SqliteStoreConfig;
///
/// let config = SqliteStoreConfig {
///     lease_ttl: Duration::from_secs(30),
///     lease_renew: Duration::from_secs(5),
///     ..SqliteStoreConfig::default()
/// };
/// assert_eq!(config.retention, Duration::from_secs(3600));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteStoreConfig {
    /// How long ended tasks are kept before the leader prunes them (3600 s; `Duration::MAX`
    /// keeps them).
    pub retention: Duration,
    /// How long a leader's lease runs without a renewal (10 s): a standby takes over once it
    /// ran out.
    pub lease_ttl: Duration,
    /// How often a leader renews its lease while it writes nothing (2 s); shorter than
    /// `lease_ttl`.
    pub lease_renew: Duration,
    /// How often a standby tries to take the lead (500 ms).
    pub lock_poll: Duration,
    /// How long a statement waits for another process's write lock before the call fails
    /// with [`StoreError::Unavailable`] (5 s).
    pub busy_timeout: Duration,
    /// How long a commit may wait behind the store's earlier calls before it gives up,
    /// unwritten, with [`StoreError::Unavailable`] (30 s); a commit that started finishes.
    pub commit_timeout: Duration,
    /// Sync every commit to disk (`synchronous=FULL`, the default), or only the WAL's
    /// checkpoints (`NORMAL`: a power loss may then undo the last commits).
    pub full_sync: bool,
}

impl Default for SqliteStoreConfig {
    fn default() -> Self {
        SqliteStoreConfig {
            retention: Duration::from_secs(3600),
            lease_ttl: Duration::from_secs(10),
            lease_renew: Duration::from_secs(2),
            lock_poll: Duration::from_millis(500),
            busy_timeout: Duration::from_secs(5),
            commit_timeout: Duration::from_secs(30),
            full_sync: true,
        }
    }
}

/// A call for the store's thread.
type Job = Box<dyn FnOnce(&mut Db) + Send>;

/// Durable scheduler state in one SQLite file (WAL mode), with one leader at a time; cheap to
/// clone (the clones share one connection and one leadership).
///
/// It implements [`Store<Bytes, Bytes>`](Store) and [`StoreQueries<Bytes>`](cronoq::StoreQueries):
/// payloads and outputs are bytes, which the program encodes. Its calls run in order on a
/// thread of the store's own, so no tokio worker waits on the disk.
///
/// A leader and a standby on one file:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), cronoq::StoreError> {
/// use std::time::Duration;
/// use bytes::Bytes;
/// use cronoq::Store;
/// use cronoq_store_sqlite::SqliteStore;
///
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("cronoq.db");
/// let leader = SqliteStore::open(&path).await?;
/// let standby = SqliteStore::open(&path).await?;
/// assert_eq!(Store::<Bytes, Bytes>::acquire_leadership(&leader).await?, 1);
/// let waiting = tokio::spawn(async move {
///     Store::<Bytes, Bytes>::acquire_leadership(&standby).await
/// });
/// tokio::time::sleep(Duration::from_millis(100)).await;
/// assert!(!waiting.is_finished()); // the leader's lease runs
/// leader.release_leadership().await;
/// assert_eq!(waiting.await.unwrap()?, 2); // the next epoch
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    config: SqliteStoreConfig,
    jobs: mpsc::Sender<Job>,
    /// The epoch this store leads with, 0 when it does not lead.
    epoch: AtomicU32,
    /// Whether it leads, for [`SqliteStore::leadership_lost`].
    leading: watch::Sender<bool>,
    /// Counts leaderships, so that a keeper task of an earlier one stops.
    generation: AtomicU64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("config", &self.inner.config)
            .field("epoch", &self.epoch())
            .finish()
    }
}

impl SqliteStore {
    /// Opens the store at `path` with the default settings (see [`SqliteStore::open_with`]).
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, SqliteStoreConfig::default()).await
    }

    /// Opens the store at `path`, creating the file (readable and writable by its owner only)
    /// or bringing an older cronoq file to this schema version.
    ///
    /// Fails with [`StoreError::Other`] for a path that SQLite would not take as a plain file
    /// name (empty, or starting with `:` or `file:`), for settings that cannot work
    /// (`lease_renew` not shorter than `lease_ttl`, a zero `lock_poll`), and for a file that
    /// is not a cronoq store or is of a newer version (left as it was).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use cronoq_store_sqlite::SqliteStore;
    ///
    /// assert!(SqliteStore::open(":memory:").await.is_err());
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = SqliteStore::open(dir.path().join("cronoq.db")).await.unwrap();
    /// assert_eq!(store.epoch(), None); // a standby until it acquires the leadership
    /// # }
    /// ```
    pub async fn open_with(
        path: impl AsRef<Path>,
        config: SqliteStoreConfig,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let name = path.to_string_lossy();
        if name.is_empty()
            || name.contains('\0')
            || name.starts_with(':')
            || name.starts_with("file:")
        {
            return Err(StoreError::Other(format!(
                "store path {name:?}: must name a file (not empty, without NUL, not starting \
                 with ':' or 'file:')"
            )));
        }
        if config.lease_renew.is_zero() || config.lease_renew >= config.lease_ttl {
            return Err(StoreError::Other(
                "lease_renew must be > 0 and shorter than lease_ttl".into(),
            ));
        }
        if config.lock_poll.is_zero() {
            return Err(StoreError::Other("lock_poll must be > 0".into()));
        }
        let holder: Arc<str> = format!(
            "{}:{}:{:08x}",
            lock::hostname(),
            std::process::id(),
            random_u32()
        )
        .into();
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (opened, opening) = oneshot::channel();
        let (thread_path, thread_config) = (path.clone(), config.clone());
        std::thread::Builder::new()
            .name("cronoq-sqlite".into())
            .spawn(move || {
                let mut db = match Db::open(&thread_path, thread_config, holder) {
                    Ok(db) => {
                        let _ = opened.send(Ok(()));
                        db
                    }
                    Err(e) => {
                        let _ = opened.send(Err(e));
                        return;
                    }
                };
                // Until every handle is gone; a call that panics fails alone.
                while let Ok(job) = inbox.recv() {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut db)));
                }
            })
            .map_err(|e| StoreError::Other(format!("cannot start the store's thread: {e}")))?;
        opening.await.map_err(|_| gone())??;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                config,
                jobs,
                epoch: AtomicU32::new(0),
                leading: watch::Sender::new(false),
                generation: AtomicU64::new(0),
            }),
        })
    }

    /// Brings the file to this crate's schema version (which [`SqliteStore::open`] did
    /// already; a file another process recreated meanwhile is created again).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), cronoq::StoreError> {
    /// use cronoq_store_sqlite::SqliteStore;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = SqliteStore::open(dir.path().join("cronoq.db")).await?;
    /// store.migrate().await?; // nothing left to do
    /// assert!(store.config().full_sync);
    /// assert!(store.path().ends_with("cronoq.db"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.call(Db::migrate).await
    }

    /// The store's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The settings it was opened with.
    pub fn config(&self) -> &SqliteStoreConfig {
        &self.inner.config
    }

    /// The epoch it leads with (the fencing token, and the top bits of the ids its leader
    /// issues), or `None` while it does not lead.
    pub fn epoch(&self) -> Option<u16> {
        match self.inner.epoch.load(Ordering::Acquire) {
            0 => None,
            e => u16::try_from(e).ok(),
        }
    }

    /// Whether it leads now (its last write was not fenced, and it did not release).
    pub fn is_leader(&self) -> bool {
        self.epoch().is_some()
    }

    /// Resolves once this store does not lead: at once while it does not, else when a
    /// commit or a renewal finds that another process took over, or it released.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), cronoq::StoreError> {
    /// use bytes::Bytes;
    /// use cronoq::Store;
    /// use cronoq_store_sqlite::SqliteStore;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = SqliteStore::open(dir.path().join("cronoq.db")).await?;
    /// Store::<Bytes, Bytes>::acquire_leadership(&store).await?;
    /// let lost = tokio::spawn({
    ///     let store = store.clone();
    ///     async move { store.leadership_lost().await }
    /// });
    /// store.release_leadership().await;
    /// lost.await.unwrap();
    /// assert!(!store.is_leader());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn leadership_lost(&self) {
        let mut leading = self.inner.leading.subscribe();
        let _ = leading.wait_for(|l| !*l).await;
    }

    /// Gives the lease up so that a standby takes over at once (without it, a standby waits
    /// for the lease to run out). Does nothing while it does not lead.
    pub async fn release_leadership(&self) {
        let generation = self.inner.generation.load(Ordering::Acquire);
        let _ = self
            .call(|db| {
                db.release();
                Ok(())
            })
            .await;
        self.deposed(generation);
    }

    /// The task with this id, or the newest task with this key (`None`: the store has no
    /// such task, or pruned it). A read: it needs no leadership.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), cronoq::StoreError> {
    /// use cronoq::TaskId;
    /// use cronoq_store_sqlite::SqliteStore;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = SqliteStore::open(dir.path().join("cronoq.db")).await?;
    /// assert_eq!(store.get_task(&TaskId(1).into()).await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_task(&self, target: &TaskRef) -> Result<Option<TaskRecord>, StoreError> {
        let target = target.clone();
        self.call(move |db| db.get_task(&target)).await
    }

    /// Ended tasks in id order after `after` (the last id of the previous page), at most
    /// `limit`; only those of `pools` and of `statuses` (each: all when empty).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), cronoq::StoreError> {
    /// use cronoq::TaskStatus;
    /// use cronoq_store_sqlite::SqliteStore;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = SqliteStore::open(dir.path().join("cronoq.db")).await?;
    /// let page = store.list_finished(&["default"], &[TaskStatus::Failed], None, 100).await?;
    /// assert!(page.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list_finished(
        &self,
        pools: &[&str],
        statuses: &[TaskStatus],
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let pools: Vec<String> = pools.iter().map(|p| (*p).to_owned()).collect();
        let statuses = statuses.to_vec();
        self.call(move |db| db.list_finished(&pools, &statuses, after, limit))
            .await
    }

    /// Deletes the tasks that ended more than `older_than` ago (except those a blocked task
    /// depends on), and returns how many. Only the leader may: [`StoreError::Fenced`]
    /// otherwise. The leader also does it by itself, with
    /// [`retention`](SqliteStoreConfig::retention).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), cronoq::StoreError> {
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use cronoq::{Store, StoreError};
    /// use cronoq_store_sqlite::SqliteStore;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = SqliteStore::open(dir.path().join("cronoq.db")).await?;
    /// let day = Duration::from_secs(86_400);
    /// assert!(matches!(store.prune(day).await, Err(StoreError::Fenced)));
    /// Store::<Bytes, Bytes>::acquire_leadership(&store).await?;
    /// assert_eq!(store.prune(day).await?, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        let generation = self.inner.generation.load(Ordering::Acquire);
        let before = rows::now_ns().saturating_sub(cronoq::codec::dur_ns(older_than));
        let result = self.call(move |db| db.prune(before)).await;
        if matches!(result, Err(StoreError::Fenced)) {
            self.deposed(generation);
        }
        result
    }

    /// Runs `f` on the store's thread, after every call made before.
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Db) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .jobs
            .send(Box::new(move |db| {
                let _ = tx.send(f(db));
            }))
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Notes that the leadership `generation` ended (a later one is left alone).
    fn deposed(&self, generation: u64) {
        if self
            .inner
            .generation
            .compare_exchange(
                generation,
                generation + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.inner.epoch.store(0, Ordering::Release);
            self.inner.leading.send_replace(false);
        }
    }

    /// While leadership `generation` lasts: renews the lease every `lease_renew` and prunes
    /// old ended tasks now and then (as the Python library's driver does: every half
    /// retention, between 1 s and 60 s). Ends when the store is dropped.
    fn keep(&self, generation: u64, epoch: u16) {
        let store: Weak<Inner> = Arc::downgrade(&self.inner);
        let config = &self.inner.config;
        let (renew, retention) = (config.lease_renew, config.retention);
        let prune_every = (retention / 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            let mut next_prune = Instant::now();
            loop {
                tokio::time::sleep(renew).await;
                let Some(inner) = store.upgrade() else { return };
                let store = SqliteStore { inner };
                if store.inner.generation.load(Ordering::Acquire) != generation {
                    return;
                }
                let renewed = store
                    .call(move |db| db.commit(epoch, TimeBase::default(), &[], &[]))
                    .await;
                if matches!(renewed, Err(StoreError::Fenced)) {
                    store.deposed(generation);
                    return;
                }
                if Instant::now() >= next_prune {
                    // (a failure is met again by the next commit, or the next round)
                    let _ = store.prune(retention).await;
                    next_prune = Instant::now() + prune_every;
                }
            }
        });
    }
}

#[async_trait]
impl Store<Bytes, Bytes> for SqliteStore {
    /// Waits until this store leads (polling every `lock_poll`, through passing failures
    /// such as a full disk), and returns the new epoch; the epoch it leads with if it leads
    /// already.
    async fn acquire_leadership(&self) -> Result<u16, StoreError> {
        if let Some(epoch) = self.epoch() {
            return Ok(epoch);
        }
        loop {
            match self.call(Db::try_lead).await {
                Ok(Some(epoch)) => {
                    let generation = self.inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
                    self.inner.epoch.store(u32::from(epoch), Ordering::Release);
                    self.inner.leading.send_replace(true);
                    self.keep(generation, epoch);
                    return Ok(epoch);
                }
                Ok(None) => {}
                // A full disk, an I/O error, a lock held past the busy timeout: tried again,
                // as the Python store's `lead()` does (a full disk is freed sooner or later).
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e),
            }
            tokio::time::sleep(self.inner.config.lock_poll).await;
        }
    }

    async fn release_leadership(&self) {
        SqliteStore::release_leadership(self).await;
    }

    /// Writes the batch in one transaction, in order, with the outputs of the tasks that
    /// succeeded in it, after checking (in the same transaction) that `epoch` still leads.
    async fn commit(
        &self,
        epoch: u16,
        base: TimeBase,
        batch: &[Mutation<Bytes>],
        outputs: &[(TaskId, &Bytes)],
    ) -> Result<(), StoreError> {
        let generation = self.inner.generation.load(Ordering::Acquire);
        let batch = batch.to_vec();
        let outputs: Vec<(TaskId, Bytes)> =
            outputs.iter().map(|(id, o)| (*id, (*o).clone())).collect();
        let (queued, limit) = (Instant::now(), self.inner.config.commit_timeout);
        let result = self
            .call(move |db| {
                let waited = queued.elapsed();
                if waited > limit {
                    return Err(StoreError::Unavailable(format!(
                        "commit waited {waited:?} for the store (commit_timeout {limit:?})"
                    )));
                }
                db.commit(epoch, base, &batch, &outputs)
            })
            .await;
        if matches!(result, Err(StoreError::Fenced)) && self.epoch() == Some(epoch) {
            self.deposed(generation);
        }
        result
    }

    /// Live tasks (with the attempts they used), ended tasks (for their keys and statuses)
    /// and the next id's counter. Refuses a file holding what this library cannot carry on
    /// (see the crate's documentation).
    async fn recover(&self, base: TimeBase) -> Result<Recovered<Bytes>, StoreError> {
        self.call(move |db| db.recover(base)).await
    }

    async fn load_output(&self, id: TaskId) -> Result<Option<Bytes>, StoreError> {
        self.call(move |db| db.load_output(id)).await
    }
}

#[async_trait]
impl cronoq::StoreQueries<Bytes> for SqliteStore {
    async fn get_task(&self, target: &TaskRef) -> Result<Option<TaskRecord>, StoreError> {
        SqliteStore::get_task(self, target).await
    }

    async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        SqliteStore::prune(self, older_than).await
    }

    async fn list_finished(
        &self,
        pools: &[&str],
        statuses: &[TaskStatus],
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        SqliteStore::list_finished(self, pools, statuses, after, limit).await
    }

    fn is_leader(&self) -> bool {
        SqliteStore::is_leader(self)
    }

    async fn leadership_lost(&self) {
        SqliteStore::leadership_lost(self).await;
    }
}

/// The store's thread has stopped.
fn gone() -> StoreError {
    StoreError::Unavailable("the store's thread has stopped".into())
}

/// 32 random bits (for the holder's name), from the standard library's randomly seeded
/// hasher.
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u32
}
