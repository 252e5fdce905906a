//! The file's tables and statements: those of the Python `SqliteStore`
//! (`src/cronoq/store/sqlite.py`), statement for statement, so that one file serves a Rust and
//! a Python process alike.

/// The schema version this crate writes and reads (`cronoq_meta.schema_version`).
pub(crate) const SCHEMA_VERSION: u32 = 5;
/// `cronoq_meta.application` of every cronoq file.
pub(crate) const APPLICATION: &str = "cronoq";

/// Version 1: the tables every cronoq store has.
pub(crate) const SCHEMA_V1: &[&str] = &[
    "CREATE TABLE cronoq_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE cronoq_leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch INTEGER NOT NULL,
        max_id INTEGER NOT NULL,
        holder TEXT,
        expires_unix_ns INTEGER NOT NULL)",
    "INSERT INTO cronoq_leader (id, epoch, max_id, holder, expires_unix_ns) \
     VALUES (1, 0, 0, NULL, 0)",
    "CREATE TABLE cronoq_tasks (
        id INTEGER PRIMARY KEY,
        seq INTEGER NOT NULL,
        arrival INTEGER NOT NULL,
        pool TEXT NOT NULL,
        kind TEXT NOT NULL,
        priority INTEGER NOT NULL,
        key TEXT,
        payload BLOB,
        deadline INTEGER,
        fixed_start INTEGER,
        tolerance REAL,
        on_miss TEXT,
        duration_hint REAL,
        timeout REAL,
        retry TEXT,
        deps TEXT,
        resources TEXT,
        tags TEXT,
        labels TEXT,
        tenant TEXT,
        status TEXT NOT NULL,
        terminal INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        updated INTEGER NOT NULL,
        message TEXT,
        output BLOB)",
    "CREATE UNIQUE INDEX cronoq_tasks_live_key ON cronoq_tasks (key) \
     WHERE terminal = 0 AND key IS NOT NULL",
    "CREATE INDEX cronoq_tasks_done ON cronoq_tasks (updated) WHERE terminal = 1",
    "CREATE TABLE cronoq_recurring (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        template_payload BLOB,
        next_unix_ns INTEGER,
        last_task_id INTEGER)",
];

/// `MIGRATIONS[v - 1]` takes a file from version v to v + 1.
pub(crate) const MIGRATIONS: [&[&str]; 4] = [
    // 2: a ready task's place in its queue and a retrying task's retry time.
    &[
        "ALTER TABLE cronoq_tasks ADD COLUMN eligible INTEGER",
        "ALTER TABLE cronoq_tasks ADD COLUMN not_before INTEGER",
    ],
    // 3: when a task's latest attempt started.
    &["ALTER TABLE cronoq_tasks ADD COLUMN started INTEGER"],
    // 4: where the holder runs and whether it holds the lock file.
    &[
        "ALTER TABLE cronoq_leader ADD COLUMN host TEXT",
        "ALTER TABLE cronoq_leader ADD COLUMN pid INTEGER",
        "ALTER TABLE cronoq_leader ADD COLUMN lock_holder TEXT",
    ],
    // 5: a task's remote worker and earlier attempts, and the pools an operator paused.
    &[
        "ALTER TABLE cronoq_tasks ADD COLUMN worker TEXT",
        "ALTER TABLE cronoq_tasks ADD COLUMN attempts TEXT",
        "CREATE TABLE cronoq_pools (name TEXT PRIMARY KEY, paused INTEGER NOT NULL)",
    ],
];

/// The columns of a task row, in the Python store's order (`TASK_COLUMNS`).
pub(crate) const TASK_COLUMNS: &str = "id, seq, arrival, pool, kind, priority, key, payload, \
    deadline, fixed_start, tolerance, on_miss, duration_hint, timeout, retry, deps, resources, \
    tags, labels, tenant, status, terminal, attempt, updated, message, output, eligible, \
    not_before, started, worker, attempts";

/// An admitted task's row. It starts `blocked` at attempt 0, as every task does (a status
/// change in the same batch moves it on); the options a task does not have and the
/// remote-worker columns are NULL, as the Python store writes them.
pub(crate) const INSERT_TASK: &str = "INSERT INTO cronoq_tasks (id, seq, arrival, pool, kind, \
    priority, key, payload, deadline, duration_hint, timeout, retry, tags, tenant, fixed_start, \
    tolerance, on_miss, deps, resources, labels, status, terminal, attempt, updated) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
    ?19, ?20, 'blocked', 0, 0, ?3)";

/// A live task's status change. `eligible` becomes the time it was queued when it becomes
/// ready, `started` the time its attempt started when it runs; `not_before` (a retrying task's
/// retry time, which a status change does not carry) is NULL, which the Python store reads
/// as "retry at once", and every reader as no retry time.
pub(crate) const UPDATE_LIVE: &str = "UPDATE cronoq_tasks SET status = ?1, attempt = ?2, \
    message = ?3, \
    eligible = CASE WHEN ?1 = 'ready' THEN ?4 ELSE eligible END, not_before = NULL, \
    started = CASE WHEN ?1 = 'running' THEN ?4 ELSE started END \
    WHERE id = ?5 AND terminal = 0";

/// A task's end: its row becomes terminal, with its output if it succeeded.
pub(crate) const UPDATE_DONE: &str = "UPDATE cronoq_tasks SET terminal = 1, status = ?1, \
    attempt = ?2, updated = ?3, message = ?4, output = ?5 WHERE id = ?6 AND terminal = 0";

/// A schedule added or replaced (the Python store's `_UPSERT_RECURRING`): its next and latest
/// occurrences follow in the same batch.
pub(crate) const UPSERT_RECURRING: &str = "INSERT INTO cronoq_recurring \
    (name, spec, template_payload, next_unix_ns, last_task_id) VALUES (?1, ?2, ?3, NULL, NULL) \
    ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, \
    template_payload = excluded.template_payload, next_unix_ns = NULL, last_task_id = NULL";

/// A schedule moved on.
pub(crate) const RECURRING_NEXT: &str =
    "UPDATE cronoq_recurring SET next_unix_ns = ?1, last_task_id = ?2 WHERE name = ?3";

/// Terminal rows that ended before a time, except parents of blocked tasks (the Python
/// store's `_PRUNE`).
pub(crate) const PRUNE: &str = "
DELETE FROM cronoq_tasks WHERE terminal = 1 AND updated < ?1 AND NOT EXISTS (
    SELECT 1 FROM cronoq_tasks AS child, json_each(child.deps) AS edge
    WHERE child.status = 'blocked'
      AND (edge.value -> 0 = printf('%u', cronoq_tasks.id) OR edge.value ->> 0 = cronoq_tasks.key))
";

/// The lease renewal that fences every commit and raises the highest id issued (compared
/// unsigned): the Python store's `_RENEW`.
pub(crate) const RENEW: &str = "
UPDATE cronoq_leader SET expires_unix_ns = ?1, lock_holder = ?3,
    max_id = CASE WHEN (max_id < 0) = (?2 < 0) THEN max(max_id, ?2)
                  WHEN max_id < 0 THEN max_id ELSE ?2 END
WHERE id = 1 AND epoch = ?4 AND holder = ?5
";
