//! The store's connection and everything done with it, on the store's own thread (one call
//! at a time, in the order they were made): the Rust side of the Python `SqliteStore`'s
//! `_open`, `_try_lead`, `_load`, `_commit`, `_prune`, `_finished` and `_close`.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cronoq::codec::{
    deps_from, deps_json, dur_ns, fixed_cols, from_unix, labels_json, miss_from, ns_dur,
    recurring_from, recurring_json, resources_from, resources_json, retry_from, retry_json, secs,
    tags_from, tags_json, to_unix,
};
use cronoq::core::FixedStart;
use cronoq::{
    MissPolicy, Mutation, Priority, Recovered, RecoveredTask, RecoveredTerminal, StoreError,
    TaskId, TaskRecord, TaskRef, TaskSpec, TaskStatus, TimeBase, core::RecoveredRecurring,
};
use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, Row, TransactionBehavior};

use crate::SqliteStoreConfig;
use crate::lock::LockFile;
use crate::rows::{now_ns, signed, system_time, unsigned};
use crate::schema::{
    APPLICATION, INSERT_TASK, MIGRATIONS, PRUNE, RECURRING_NEXT, RENEW, SCHEMA_V1, SCHEMA_VERSION,
    TASK_COLUMNS, UPDATE_DONE, UPDATE_LIVE, UPSERT_RECURRING,
};

/// An open store file and this handle's leadership of it.
pub(crate) struct Db {
    conn: Connection,
    path: PathBuf,
    config: SqliteStoreConfig,
    /// `"<hostname>:<pid>:<8 hex digits>"`, as the Python store names its holders.
    holder: Arc<str>,
    /// The epoch this handle leads with, 0 when it does not lead.
    epoch: u16,
    lock: LockFile,
}

impl Db {
    /// Opens (creating it owner-only) and checks the file, creating or migrating its schema.
    /// A file that is not a cronoq store, or of a newer version, is refused and left as it was.
    pub(crate) fn open(
        path: &Path,
        config: SqliteStoreConfig,
        holder: Arc<str>,
    ) -> Result<Db, StoreError> {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail(path, format!("cannot create it: {e}"))),
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|e| fail(path, format!("cannot open: {e}")))?;
        conn.busy_timeout(config.busy_timeout)
            .map_err(|e| sql(path, e))?;
        let mut db = Db {
            conn,
            path: path.to_path_buf(),
            config,
            holder,
            epoch: 0,
            lock: LockFile::new(path),
        };
        db.migrate()?;
        Ok(db)
    }

    /// Checks the schema version (reading only), then turns WAL on and creates the tables of
    /// an empty file or brings an older one to this version.
    pub(crate) fn migrate(&mut self) -> Result<(), StoreError> {
        let version = self.inspect()?;
        let sync = if self.config.full_sync {
            "FULL"
        } else {
            "NORMAL"
        };
        self.conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
            .and_then(|_| {
                self.conn
                    .execute_batch(&format!("PRAGMA synchronous={sync}"))
            })
            .map_err(|e| sql(&self.path, e))?;
        match version {
            None => self.create(),
            Some(v) if v < SCHEMA_VERSION => self.upgrade(),
            Some(_) => Ok(()),
        }
        .map_err(|e| sql(&self.path, e))
    }

    /// The file's schema version (`None` for an empty file).
    fn inspect(&self) -> Result<Option<u32>, StoreError> {
        let not_ours = |why: String| fail(&self.path, format!("not a cronoq database ({why})"));
        let tables: Vec<String> = self
            .conn
            .prepare("SELECT name FROM sqlite_master WHERE type='table'")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| not_ours(e.to_string()))?;
        if tables.is_empty() {
            return Ok(None);
        }
        if !tables.iter().any(|t| t == "cronoq_meta") {
            return Err(not_ours("no cronoq_meta table".into()));
        }
        let meta = |key: &str| -> Result<Option<String>, StoreError> {
            self.conn
                .query_row("SELECT value FROM cronoq_meta WHERE key = ?1", [key], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(|e| sql(&self.path, e))
        };
        let version = meta("schema_version")?.filter(|v| v.bytes().all(|b| b.is_ascii_digit()));
        let version = match (meta("application")?.as_deref(), version) {
            (Some(APPLICATION), Some(v)) => v.parse::<u32>().ok(),
            _ => None,
        }
        .ok_or_else(|| not_ours("cronoq_meta has no cronoq schema version".into()))?;
        if version > SCHEMA_VERSION {
            return Err(fail(
                &self.path,
                format!(
                    "schema version {version} is newer than this cronoq supports \
                     ({SCHEMA_VERSION})"
                ),
            ));
        }
        Ok(Some(version))
    }

    fn create(&mut self) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let objects: i64 = tx.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
        if objects > 0 {
            return Ok(()); // another process created it first (dropping `tx` rolls back)
        }
        for stmt in SCHEMA_V1 {
            tx.execute(stmt, [])?;
        }
        tx.execute(
            "INSERT INTO cronoq_meta (key, value) VALUES ('application', ?1), \
             ('schema_version', '1')",
            [APPLICATION],
        )?;
        upgrade_from(&tx, 1)?;
        tx.commit()
    }

    fn upgrade(&mut self) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let current: String = tx.query_row(
            "SELECT value FROM cronoq_meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )?;
        let current = current.parse::<u32>().unwrap_or(SCHEMA_VERSION);
        if current < SCHEMA_VERSION {
            upgrade_from(&tx, current)?; // (not done by another process meanwhile)
        }
        tx.commit()
    }

    /// Takes the leadership if nobody holds an unexpired lease (or its holder, on this host,
    /// is provably gone): the new epoch, else `None`.
    pub(crate) fn try_lead(&mut self) -> Result<Option<u16>, StoreError> {
        let place = self.lock.place();
        if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
            // The leader holds the write lock longer than the busy timeout: not leading yet.
            if matches!(
                e.sqlite_error_code(),
                Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
            ) {
                return Ok(None);
            }
            return Err(sql(&self.path, e));
        }
        match self.lead_in_transaction(place) {
            Ok(Some(epoch)) => {
                self.epoch = epoch;
                self.lock.keep = true;
                Ok(Some(epoch))
            }
            other => {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                // (a lock taken meanwhile: the leader may want it)
                self.lock.release();
                other
            }
        }
    }

    /// [`Db::try_lead`] inside its transaction, which it commits when it leads.
    fn lead_in_transaction(&mut self, place: Option<String>) -> Result<Option<u16>, StoreError> {
        let path = self.path.clone();
        let sql = |e| sql(&path, e);
        let now = now_ns();
        let (epoch, holder, expires, host, lock_holder): (
            i64,
            Option<String>,
            i64,
            Option<String>,
            Option<String>,
        ) = self
            .conn
            .query_row(
                "SELECT epoch, holder, expires_unix_ns, host, lock_holder FROM cronoq_leader \
                 WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .map_err(sql)?;
        if holder.as_deref().is_some_and(|h| !h.is_empty()) && expires > now {
            // Its lease runs: take over only if it ran on this host and held the lock file,
            // and we can take that lock now (it exited or closed the store).
            let here = place.is_some() && host == place && lock_holder == holder;
            if !(here && self.lock.take()) {
                return Ok(None);
            }
        }
        let epoch = u16::try_from(epoch + 1)
            .map_err(|_| fail(&path, format!("epoch {} is beyond 65535", epoch + 1)))?;
        // The lock before the new epoch is written, kept as long as we lead; without it
        // (a stalled former leader still has it) lock_holder is NULL and is tried again at
        // each commit.
        let locked = self.lock.take();
        self.conn
            .execute(
                "UPDATE cronoq_leader SET epoch = ?1, holder = ?2, expires_unix_ns = ?3, \
                 host = ?4, pid = ?5, lock_holder = ?6 WHERE id = 1",
                rusqlite::params![
                    epoch,
                    &*self.holder,
                    now.saturating_add(dur_ns(self.config.lease_ttl)),
                    place,
                    std::process::id(),
                    locked.then_some(&*self.holder),
                ],
            )
            .map_err(sql)?;
        self.conn.execute_batch("COMMIT").map_err(sql)?;
        Ok(Some(epoch))
    }

    /// Writes a batch in one transaction, fenced by `epoch` and renewing the lease (an empty
    /// batch only renews it).
    pub(crate) fn commit(
        &mut self,
        epoch: u16,
        base: TimeBase,
        batch: &[Mutation<Bytes>],
        outputs: &[(TaskId, Bytes)],
    ) -> Result<(), StoreError> {
        // A leader that took over without the lock file's lock tries again (only then).
        let locked = self.lock.held() || (self.lock.keep && self.lock.take());
        let max_id = batch
            .iter()
            .filter_map(|m| match m {
                Mutation::Submitted { id, .. } => Some(id.0),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql(&path, e))?;
        let renewed = tx
            .execute(
                RENEW,
                rusqlite::params![
                    now_ns().saturating_add(dur_ns(self.config.lease_ttl)),
                    signed(max_id),
                    locked.then_some(&*self.holder),
                    epoch,
                    &*self.holder,
                ],
            )
            .map_err(|e| sql(&path, e))?;
        if renewed != 1 {
            drop(tx);
            self.deposed();
            return Err(StoreError::Fenced);
        }
        apply(&tx, base, batch, outputs).map_err(|e| sql(&path, e))?;
        tx.commit().map_err(|e| sql(&path, e))
    }

    /// Everything the previous leaders left, for a leader of the Rust library.
    pub(crate) fn recover(&self, base: TimeBase) -> Result<Recovered<Bytes>, StoreError> {
        let path = &self.path;
        let count = |q: &str| -> Result<i64, StoreError> {
            self.conn
                .query_row(q, [], |r| r.get(0))
                .map_err(|e| sql(path, e))
        };
        if count("SELECT count(*) FROM cronoq_pools WHERE paused = 1")? > 0 {
            return Err(fail(
                path,
                "it holds paused pools, which this library cannot pause".into(),
            ));
        }
        let mut recovered = Recovered::default();
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {TASK_COLUMNS} FROM cronoq_tasks ORDER BY id"
            ))
            .map_err(|e| sql(path, e))?;
        let mut rows = stmt.query([]).map_err(|e| sql(path, e))?;
        while let Some(row) = rows.next().map_err(|e| sql(path, e))? {
            let bad = |e: String| fail(path, e);
            let id = TaskId(unsigned(row.get("id").map_err(|e| sql(path, e))?));
            let status = status_of(row).map_err(bad)?;
            if status.is_terminal() {
                recovered.terminal.push(RecoveredTerminal {
                    id,
                    key: row
                        .get::<_, Option<String>>("key")
                        .map_err(|e| sql(path, e))?
                        .map(Arc::from),
                    status,
                    at: from_unix(base, row.get("updated").map_err(|e| sql(path, e))?),
                });
            } else {
                recovered.tasks.push(live_task(row, id, base).map_err(bad)?);
            }
        }
        drop(rows);
        drop(stmt);
        recovered.recurring = self.schedules(base)?;
        let max_id: i64 = count("SELECT max_id FROM cronoq_leader WHERE id = 1")?;
        recovered.next_id = unsigned(max_id).saturating_add(1);
        Ok(recovered)
    }

    /// The stored schedules, each with its next and latest occurrences; one that cannot be
    /// read fails the recovery, naming it.
    fn schedules(&self, base: TimeBase) -> Result<Vec<RecoveredRecurring<Bytes>>, StoreError> {
        let path = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT name, spec, template_payload, next_unix_ns, last_task_id \
                 FROM cronoq_recurring ORDER BY name",
            )
            .map_err(|e| sql(path, e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<Vec<u8>>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                    r.get::<_, Option<i64>>(4)?,
                ))
            })
            .map_err(|e| sql(path, e))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, spec, payload, next, last) = row.map_err(|e| sql(path, e))?;
            out.push(RecoveredRecurring {
                spec: recurring_from(base, name, &spec, payload.unwrap_or_default())
                    .map_err(|e| fail(path, e))?,
                next: next.map(|ns| from_unix(base, ns)),
                last: last.map(|id| TaskId(unsigned(id))),
            });
        }
        Ok(out)
    }

    /// The task with this id, or the newest with this key.
    pub(crate) fn get_task(
        &self,
        target: &TaskRef,
    ) -> Result<Option<TaskRecord<Bytes>>, StoreError> {
        let (filter, value) = match target {
            TaskRef::Id(id) => ("id = ?1", Value::Integer(signed(id.0))),
            TaskRef::Key(key) => ("key = ?1", Value::Text(key.to_string())),
        };
        let query = format!(
            "SELECT {TASK_COLUMNS} FROM cronoq_tasks WHERE {filter} \
             ORDER BY arrival DESC, id DESC LIMIT 1"
        );
        self.conn
            .query_row(&query, [value], |row| Ok(task_record(row)))
            .optional()
            .map_err(|e| sql(&self.path, e))?
            .transpose()
            .map_err(|e| fail(&self.path, e))
    }

    /// Ended tasks in id order after `after`, of `pools` and `statuses` (all when empty).
    pub(crate) fn list_finished(
        &self,
        pools: &[String],
        statuses: &[TaskStatus],
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskRecord<Bytes>>, StoreError> {
        let mut params = vec![
            after.map_or(Value::Null, |id| Value::Integer(signed(id.0))),
            Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)),
        ];
        let mut query = format!(
            "SELECT {TASK_COLUMNS} FROM cronoq_tasks WHERE terminal = 1 \
             AND (?1 IS NULL OR id > ?1)"
        );
        let mut within = |column: &str, values: Vec<String>| {
            if values.is_empty() {
                return;
            }
            let first = params.len() + 1;
            let marks: Vec<String> = (first..first + values.len())
                .map(|i| format!("?{i}"))
                .collect();
            query.push_str(&format!(" AND {column} IN ({})", marks.join(", ")));
            params.extend(values.into_iter().map(Value::Text));
        };
        within("pool", pools.to_vec());
        within(
            "status",
            statuses.iter().map(|s| s.name().to_owned()).collect(),
        );
        query.push_str(" ORDER BY id LIMIT ?2");
        let mut stmt = self.conn.prepare(&query).map_err(|e| sql(&self.path, e))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |row| {
                Ok(task_record(row))
            })
            .map_err(|e| sql(&self.path, e))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(
                row.map_err(|e| sql(&self.path, e))?
                    .map_err(|e| fail(&self.path, e))?,
            );
        }
        Ok(out)
    }

    /// Deletes terminal rows that ended before `before_ns` (Unix ns), except parents of
    /// blocked tasks; fenced by this handle's leadership.
    pub(crate) fn prune(&mut self, before_ns: i64) -> Result<u64, StoreError> {
        if self.epoch == 0 {
            return Err(StoreError::Fenced);
        }
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql(&path, e))?;
        let ours = tx
            .query_row(
                "SELECT 1 FROM cronoq_leader WHERE id = 1 AND epoch = ?1 AND holder = ?2",
                rusqlite::params![self.epoch, &*self.holder],
                |_| Ok(()),
            )
            .optional()
            .map_err(|e| sql(&path, e))?;
        if ours.is_none() {
            drop(tx);
            self.deposed();
            return Err(StoreError::Fenced);
        }
        let deleted = tx.execute(PRUNE, [before_ns]).map_err(|e| sql(&path, e))?;
        tx.commit().map_err(|e| sql(&path, e))?;
        Ok(deleted as u64)
    }

    /// The stored output of a task that ended (succeeded), if kept.
    pub(crate) fn load_output(&self, id: TaskId) -> Result<Option<Bytes>, StoreError> {
        self.conn
            .query_row(
                "SELECT output FROM cronoq_tasks WHERE id = ?1 AND terminal = 1",
                [signed(id.0)],
                |r| r.get::<_, Option<Vec<u8>>>(0),
            )
            .optional()
            .map(|o| o.flatten().map(Bytes::from))
            .map_err(|e| sql(&self.path, e))
    }

    /// Gives the lease up so that a standby takes over at once (a failure leaves it to
    /// expire), and the lock file's lock with it.
    pub(crate) fn release(&mut self) {
        if self.epoch != 0 {
            let _ = self.conn.execute(
                "UPDATE cronoq_leader SET holder = NULL, expires_unix_ns = 0, \
                 lock_holder = NULL WHERE id = 1 AND epoch = ?1 AND holder = ?2",
                rusqlite::params![self.epoch, &*self.holder],
            );
        }
        self.lock.release();
        self.epoch = 0;
    }

    /// Forgets the leadership once fenced, giving the lock file's lock up.
    fn deposed(&mut self) {
        self.lock.release();
        self.epoch = 0;
    }
}

fn upgrade_from(tx: &rusqlite::Transaction<'_>, version: u32) -> rusqlite::Result<()> {
    for v in version..SCHEMA_VERSION {
        for stmt in MIGRATIONS[v as usize - 1] {
            tx.execute(stmt, [])?;
        }
    }
    tx.execute(
        "UPDATE cronoq_meta SET value = ?1 WHERE key = 'schema_version'",
        [SCHEMA_VERSION.to_string()],
    )?;
    Ok(())
}

/// One batch's changes, in order.
fn apply(
    tx: &rusqlite::Transaction<'_>,
    base: TimeBase,
    batch: &[Mutation<Bytes>],
    outputs: &[(TaskId, Bytes)],
) -> rusqlite::Result<()> {
    for m in batch {
        match m {
            Mutation::Submitted {
                id,
                seq,
                arrival,
                spec,
            } => {
                let (fixed_at, tolerance, on_miss) = fixed_cols(base, &spec.fixed_start);
                tx.prepare_cached(INSERT_TASK)?.execute(rusqlite::params![
                    signed(id.0),
                    i64::try_from(*seq).unwrap_or(i64::MAX),
                    to_unix(base, *arrival),
                    &*spec.pool,
                    &*spec.kind,
                    spec.priority.index() as i64,
                    spec.key.as_deref(),
                    &spec.payload[..],
                    spec.deadline.map(|t| to_unix(base, t)),
                    spec.duration_hint.map(|d| d.as_secs_f64()),
                    spec.timeout.map(|d| d.as_secs_f64()),
                    retry_json(&spec.retry),
                    (!spec.tags.is_empty()).then(|| tags_json(&spec.tags)),
                    spec.tenant.as_deref(),
                    fixed_at,
                    tolerance.map(|ns| ns_dur(ns).as_secs_f64()),
                    on_miss,
                    (!spec.deps.is_empty()).then(|| deps_json(&spec.deps)),
                    (!spec.resources.is_empty()).then(|| resources_json(&spec.resources)),
                    (!spec.labels.is_empty()).then(|| labels_json(&spec.labels)),
                ])?;
            }
            Mutation::Status {
                id,
                status,
                attempt,
                at,
                message,
            } => {
                if status.is_terminal() {
                    let output = (*status == TaskStatus::Succeeded)
                        .then(|| outputs.iter().find(|(o, _)| o == id))
                        .flatten()
                        .map(|(_, o)| &o[..]);
                    tx.prepare_cached(UPDATE_DONE)?.execute(rusqlite::params![
                        status.name(),
                        attempt,
                        to_unix(base, *at),
                        message.as_deref(),
                        output,
                        signed(id.0),
                    ])?;
                } else {
                    tx.prepare_cached(UPDATE_LIVE)?.execute(rusqlite::params![
                        status.name(),
                        attempt,
                        message.as_deref(),
                        to_unix(base, *at),
                        signed(id.0),
                    ])?;
                }
            }
            Mutation::RecurringUpsert { spec } => {
                tx.prepare_cached(UPSERT_RECURRING)?
                    .execute(rusqlite::params![
                        &*spec.name,
                        recurring_json(base, spec),
                        &spec.template.payload[..],
                    ])?;
            }
            Mutation::RecurringRemove { name } => {
                tx.prepare_cached("DELETE FROM cronoq_recurring WHERE name = ?1")?
                    .execute([&**name])?;
            }
            Mutation::RecurringNext { name, next, last } => {
                tx.prepare_cached(RECURRING_NEXT)?
                    .execute(rusqlite::params![
                        next.map(|t| to_unix(base, t)),
                        last.map(|id| signed(id.0)),
                        &**name,
                    ])?;
            }
        }
    }
    Ok(())
}

fn status_of(row: &Row<'_>) -> Result<TaskStatus, String> {
    let name: String = row.get("status").map_err(|e| e.to_string())?;
    TaskStatus::from_name(&name).ok_or_else(|| format!("unknown status {name:?}"))
}

/// A live row as a task to restore, with every option it was submitted with.
fn live_task(row: &Row<'_>, id: TaskId, base: TimeBase) -> Result<RecoveredTask<Bytes>, String> {
    let get_err = |e: rusqlite::Error| format!("task {id}: {e}");
    let text = |name: &str| row.get::<_, Option<String>>(name).map_err(get_err);
    let set = |v: Option<String>| v.filter(|v| !matches!(v.as_str(), "" | "null" | "{}" | "[]"));
    let payload: Option<Vec<u8>> = row.get("payload").map_err(get_err)?;
    let mut spec = TaskSpec::new(payload.map(Bytes::from).unwrap_or_default());
    spec.kind = Arc::from(row.get::<_, String>("kind").map_err(get_err)?);
    spec.pool = Arc::from(row.get::<_, String>("pool").map_err(get_err)?);
    spec.priority = priority(row).map_err(|e| format!("task {id}: {e}"))?;
    spec.key = text("key")?.map(Arc::from);
    spec.deadline = row
        .get::<_, Option<i64>>("deadline")
        .map_err(get_err)?
        .map(|ns| from_unix(base, ns));
    spec.duration_hint = row
        .get::<_, Option<f64>>("duration_hint")
        .map_err(get_err)?
        .map(secs);
    spec.timeout = row
        .get::<_, Option<f64>>("timeout")
        .map_err(get_err)?
        .map(secs);
    spec.retry = retry_from(text("retry")?.as_deref())?;
    spec.tags = text("tags")?
        .as_deref()
        .map(tags_from)
        .transpose()?
        .unwrap_or_default();
    spec.tenant = text("tenant")?.map(Arc::from);
    if let Some(deps) = set(text("deps")?) {
        spec.deps = deps_from(&deps)?;
    }
    if let Some(resources) = set(text("resources")?) {
        spec.resources = resources_from(&resources)?.into_iter().collect();
    }
    if let Some(labels) = set(text("labels")?) {
        spec.labels = tags_from(&labels)?;
    }
    if let Some(at) = row.get::<_, Option<i64>>("fixed_start").map_err(get_err)? {
        let tolerance: Option<f64> = row.get("tolerance").map_err(get_err)?;
        spec.fixed_start = Some(FixedStart {
            at: from_unix(base, at),
            tolerance: tolerance.map_or(Duration::from_secs(1), secs),
            on_miss: text("on_miss")?
                .as_deref()
                .map_or(MissPolicy::RunLate, miss_from),
        });
    }
    Ok(RecoveredTask {
        id,
        seq: u64::try_from(row.get::<_, i64>("seq").map_err(get_err)?).unwrap_or(0),
        arrival: from_unix(base, row.get("arrival").map_err(get_err)?),
        spec,
        attempt: attempt(row).map_err(get_err)?,
    })
}

fn priority(row: &Row<'_>) -> Result<Priority, String> {
    let p: i64 = row.get("priority").map_err(|e| e.to_string())?;
    usize::try_from(p)
        .ok()
        .and_then(Priority::from_index)
        .ok_or_else(|| format!("unknown priority {p}"))
}

fn attempt(row: &Row<'_>) -> rusqlite::Result<u32> {
    Ok(u32::try_from(row.get::<_, i64>("attempt")?).unwrap_or(u32::MAX))
}

/// A row as what a server shows of a task.
fn task_record(row: &Row<'_>) -> Result<TaskRecord<Bytes>, String> {
    let e = |e: rusqlite::Error| e.to_string();
    let status = status_of(row)?;
    let attempt = attempt(row).map_err(e)?;
    let queued = attempt == 0
        && matches!(
            status,
            TaskStatus::Blocked | TaskStatus::Scheduled | TaskStatus::Ready
        );
    Ok(TaskRecord {
        id: TaskId(unsigned(row.get("id").map_err(e)?)),
        key: row.get("key").map_err(e)?,
        pool: row.get("pool").map_err(e)?,
        kind: row.get("kind").map_err(e)?,
        priority: priority(row)?,
        tenant: row.get("tenant").map_err(e)?,
        status: (!queued).then_some(status),
        attempt,
        message: row.get("message").map_err(e)?,
        output: row
            .get::<_, Option<Vec<u8>>>("output")
            .map_err(e)?
            .map(Bytes::from),
        updated: system_time(row.get("updated").map_err(e)?),
    })
}

/// A failure of the store's file as such (not a passing one).
fn fail(path: &Path, reason: String) -> StoreError {
    StoreError::Other(format!("store '{}': {reason}", path.display()))
}

/// SQLite's error: passing (busy, locked, a full disk, I/O) or not.
pub(crate) fn sql(path: &Path, e: rusqlite::Error) -> StoreError {
    let passing = matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure
                | ErrorCode::CannotOpen
        )
    );
    if passing {
        StoreError::Unavailable(format!("store '{}': {e}", path.display()))
    } else {
        fail(path, e.to_string())
    }
}
