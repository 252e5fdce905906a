//! The store on real files in temporary directories: every mutation written and read back,
//! fencing, leases and takeovers, the queries, pruning, and what it refuses.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use cronoq::core::FixedStart;
use cronoq::{
    Dep, MissPolicy, Store, StoreError, StoreQueries, TaskId, TaskSpec, TaskStatus, Time, TimeBase,
};
use cronoq_store_sqlite::{SqliteStore, SqliteStoreConfig};

const BASE: TimeBase = TimeBase {
    unix_nanos_at_zero: 0,
};

async fn lead(store: &SqliteStore) -> u16 {
    Store::<Bytes, Bytes>::acquire_leadership(store)
        .await
        .unwrap()
}

async fn recover(store: &SqliteStore) -> cronoq::Recovered<Bytes> {
    Store::<Bytes, Bytes>::recover(store, BASE).await.unwrap()
}

/// A raw connection to the file, to look at or change what the store wrote.
fn raw(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

#[tokio::test]
async fn every_mutation_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let store = SqliteStore::open_with(&path, fast()).await.unwrap();
    let epoch = lead(&store).await;
    assert_eq!(epoch, 1);

    let full = full_spec(b"full");
    let plain = TaskSpec::new(Bytes::from_static(b"plain"));
    let (a, b, c, d, e) = (id(1, 1), id(1, 2), id(1, 3), id(1, 4), id(1, 5));
    let first = [
        submitted(a, 1, full.clone()),
        status(a, TaskStatus::Ready, 0, 1_000, None),
        submitted(b, 2, plain.clone()),
        status(b, TaskStatus::Ready, 0, 2_000, None),
        submitted(c, 3, plain.clone().key("c")),
        submitted(d, 4, plain.clone().key("d")),
        submitted(e, 5, plain.clone().key("e")),
    ];
    store.commit(epoch, BASE, &first, &[]).await.unwrap();
    let out = Bytes::from_static(b"the output");
    let second = [
        status(b, TaskStatus::Running, 1, 3_000, None),
        status(b, TaskStatus::Retrying, 1, 4_000, Some("boom")),
        status(c, TaskStatus::Running, 1, 5_000, None),
        status(c, TaskStatus::Succeeded, 1, 6_000, None),
        status(d, TaskStatus::Running, 1, 7_000, None),
        status(d, TaskStatus::Failed, 1, 8_000, Some("permanent: no")),
        status(e, TaskStatus::Cancelled, 0, 9_000, Some("cancelled")),
    ];
    store
        .commit(epoch, BASE, &second, &[(c, &out)])
        .await
        .unwrap();
    store
        .commit(
            epoch,
            BASE,
            &[status(a, TaskStatus::Running, 1, 10_000, None)],
            &[],
        )
        .await
        .unwrap();

    // Read back by another handle of the same file, as the next leader would.
    let reader = SqliteStore::open_with(&path, fast()).await.unwrap();
    let got = recover(&reader).await;
    assert_eq!(got.next_id, e.0 + 1);
    assert_eq!(got.tasks.len(), 2);
    let (ta, tb) = (&got.tasks[0], &got.tasks[1]);
    assert_eq!(
        (ta.id, ta.seq, ta.arrival, ta.attempt),
        (a, 1, Time(T0 + 1_000), 1)
    );
    assert_same_spec(&ta.spec, &full);
    assert_eq!((tb.id, tb.seq, tb.attempt), (b, 2, 1));
    assert_same_spec(&tb.spec, &plain);
    let ended: Vec<_> = got
        .terminal
        .iter()
        .map(|t| (t.id, t.key.as_deref().map(str::to_owned), t.status, t.at))
        .collect();
    assert_eq!(
        ended,
        [
            (c, Some("c".into()), TaskStatus::Succeeded, Time(T0 + 6_000)),
            (d, Some("d".into()), TaskStatus::Failed, Time(T0 + 8_000)),
            (e, Some("e".into()), TaskStatus::Cancelled, Time(T0 + 9_000)),
        ]
    );
    let output = Store::<Bytes, Bytes>::load_output(&reader, c)
        .await
        .unwrap();
    assert_eq!(output, Some(out.clone()));
    let none = Store::<Bytes, Bytes>::load_output(&reader, d)
        .await
        .unwrap();
    assert_eq!(none, None);

    // The queries.
    let rec = reader.get_task(&c.into()).await.unwrap().unwrap();
    assert_eq!(
        (rec.key.as_deref(), rec.status, rec.attempt, rec.output),
        (Some("c"), Some(TaskStatus::Succeeded), 1, Some(out))
    );
    let by_key = reader.get_task(&"nightly".into()).await.unwrap().unwrap();
    assert_eq!(
        (by_key.id, by_key.pool.as_str(), by_key.kind.as_str()),
        (a, "io", "report")
    );
    assert_eq!(
        (by_key.status, by_key.tenant.as_deref()),
        (Some(TaskStatus::Running), Some("acme"))
    );
    let queued = TaskSpec::new(Bytes::new());
    store
        .commit(epoch, BASE, &[submitted(id(1, 6), 6, queued)], &[])
        .await
        .unwrap();
    let fresh = reader.get_task(&id(1, 6).into()).await.unwrap().unwrap();
    assert_eq!((fresh.status, fresh.attempt), (None, 0));
    let all = reader.list_finished(&[], &[], None, 10).await.unwrap();
    assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [c, d, e]);
    let page = reader.list_finished(&[], &[], Some(c), 1).await.unwrap();
    assert_eq!(page.iter().map(|r| r.id).collect::<Vec<_>>(), [d]);
    let failed = reader
        .list_finished(
            &["default"],
            &[TaskStatus::Failed, TaskStatus::Cancelled],
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(failed.iter().map(|r| r.id).collect::<Vec<_>>(), [d, e]);
    assert_eq!(failed[0].message.as_deref(), Some("permanent: no"));
    let other_pool = reader.list_finished(&["io"], &[], None, 10).await.unwrap();
    assert!(other_pool.is_empty());
}

#[tokio::test]
async fn a_commit_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(dir.path().join("db"), fast())
        .await
        .unwrap();
    let epoch = lead(&store).await;
    let spec = TaskSpec::new(Bytes::new()).key("same");
    store
        .commit(epoch, BASE, &[submitted(id(1, 1), 1, spec.clone())], &[])
        .await
        .unwrap();
    // The second insert breaks the live-key index: the first of the batch is undone too.
    let batch = [
        submitted(id(1, 2), 2, TaskSpec::new(Bytes::new())),
        submitted(id(1, 3), 3, spec),
    ];
    let err = store.commit(epoch, BASE, &batch, &[]).await.unwrap_err();
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");
    assert_eq!(store.get_task(&id(1, 2).into()).await.unwrap(), None);
    assert_eq!(recover(&store).await.next_id, id(1, 1).0 + 1);
}

#[tokio::test]
async fn a_deposed_leader_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let first = SqliteStore::open_with(&path, fast()).await.unwrap();
    let second = SqliteStore::open_with(&path, fast()).await.unwrap();
    assert_eq!(lead(&first).await, 1);
    // The first leader stalls past its lease (as if paused): the second takes over.
    raw(&path)
        .execute("UPDATE cronoq_leader SET expires_unix_ns = 0", [])
        .unwrap();
    assert_eq!(lead(&second).await, 2);
    assert!(first.is_leader()); // it does not know yet

    let batch = [submitted(id(1, 1), 1, TaskSpec::new(Bytes::new()))];
    let err = first.commit(1, BASE, &batch, &[]).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced), "{err:?}");
    assert!(!first.is_leader());
    first.leadership_lost().await;
    assert_eq!(second.get_task(&id(1, 1).into()).await.unwrap(), None);
    let err = first.prune(Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced), "{err:?}");

    // The new leader writes, with its epoch; the old epoch stays fenced.
    let batch = [submitted(id(2, 1), 1, TaskSpec::new(Bytes::new()))];
    second.commit(2, BASE, &batch, &[]).await.unwrap();
    let err = second.commit(1, BASE, &[], &[]).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced));
}

#[tokio::test]
async fn a_standby_takes_over_when_the_lease_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let standby = SqliteStore::open_with(&path, fast()).await.unwrap();
    // A holder on another host (nothing proves it gone): its lease must be waited out.
    let expires = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
        + 400_000_000;
    raw(&path)
        .execute(
            "UPDATE cronoq_leader SET epoch = 7, holder = 'elsewhere:1:00000000', \
             expires_unix_ns = ?1, host = 'elsewhere x 1:2'",
            [expires],
        )
        .unwrap();
    let started = Instant::now();
    let epoch = lead(&standby).await;
    assert_eq!(epoch, 8);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(standby.epoch(), Some(8));
}

#[tokio::test]
async fn a_leader_renews_its_lease_and_a_standby_waits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let leader = SqliteStore::open_with(&path, fast()).await.unwrap();
    let standby = SqliteStore::open_with(&path, fast()).await.unwrap();
    assert_eq!(lead(&leader).await, 1);
    let waiting = tokio::spawn({
        let standby = standby.clone();
        async move { lead(&standby).await }
    });
    // Well past the lease: the background renewals keep it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished());
    assert!(leader.is_leader());
    // A release hands over at once.
    leader.release_leadership().await;
    assert!(!leader.is_leader());
    let epoch = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(epoch, 2);
    let err = leader.commit(1, BASE, &[], &[]).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced));
}

#[tokio::test]
async fn a_standby_on_this_host_takes_over_when_the_leader_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let config = SqliteStoreConfig {
        lease_ttl: Duration::from_secs(60),
        lease_renew: Duration::from_secs(1),
        ..fast()
    };
    let leader = SqliteStore::open_with(&path, config.clone()).await.unwrap();
    let standby = SqliteStore::open_with(&path, config).await.unwrap();
    assert_eq!(lead(&leader).await, 1);
    let holder: Option<String> = raw(&path)
        .query_row("SELECT lock_holder FROM cronoq_leader", [], |r| r.get(0))
        .unwrap();
    assert!(holder.is_some(), "the leader holds the lock file");
    // Dropped without releasing (as a process that dies): its lock file's lock goes, and
    // the standby does not wait out the 60 s lease.
    drop(leader);
    let epoch = tokio::time::timeout(Duration::from_secs(5), lead(&standby))
        .await
        .unwrap();
    assert_eq!(epoch, 2);
}

#[tokio::test]
async fn pruning_deletes_old_ended_tasks_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(dir.path().join("db"), fast())
        .await
        .unwrap();
    let err = store.prune(Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced), "only a leader prunes");
    let epoch = lead(&store).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let hour = 3_600_000_000_000;
    let spec = TaskSpec::new(Bytes::new());
    let batch = [
        submitted(id(1, 1), 1, spec.clone()),
        status(id(1, 1), TaskStatus::Failed, 1, now - T0 - 2 * hour, None),
        submitted(id(1, 2), 2, spec.clone()),
        status(id(1, 2), TaskStatus::Failed, 1, now - T0 - 1_000, None),
        submitted(id(1, 3), 3, spec),
    ];
    store.commit(epoch, BASE, &batch, &[]).await.unwrap();
    assert_eq!(store.prune(Duration::from_secs(3600)).await.unwrap(), 1);
    let left = recover(&store).await;
    assert_eq!(
        left.terminal.iter().map(|t| t.id).collect::<Vec<_>>(),
        [id(1, 2)]
    );
    assert_eq!(left.tasks.len(), 1);
}

#[tokio::test]
async fn the_leader_prunes_by_itself_after_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let config = SqliteStoreConfig {
        retention: Duration::from_secs(1),
        ..fast()
    };
    let store = SqliteStore::open_with(dir.path().join("db"), config)
        .await
        .unwrap();
    let epoch = lead(&store).await;
    let batch = [
        submitted(id(1, 1), 1, TaskSpec::new(Bytes::new())),
        status(id(1, 1), TaskStatus::Succeeded, 1, 5, None),
        submitted(id(1, 2), 2, TaskSpec::new(Bytes::new())),
    ];
    store.commit(epoch, BASE, &batch, &[]).await.unwrap();
    let started = Instant::now();
    while !recover(&store).await.terminal.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(5), "never pruned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(recover(&store).await.tasks.len(), 1, "live tasks stay");
}

#[tokio::test]
async fn ids_of_high_shards_are_stored_signed() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(dir.path().join("db"), fast())
        .await
        .unwrap();
    let epoch = lead(&store).await;
    let low = TaskId(200u64 << 56 | 1u64 << 40 | 1);
    let batch = [
        submitted(id(1, 9), 1, TaskSpec::new(Bytes::new())),
        submitted(low, 2, TaskSpec::new(Bytes::new())),
    ];
    store.commit(epoch, BASE, &batch, &[]).await.unwrap();
    // A later, lower id does not lower the high-water mark (compared unsigned).
    let later = [submitted(id(1, 10), 3, TaskSpec::new(Bytes::new()))];
    store.commit(epoch, BASE, &later, &[]).await.unwrap();
    let got = recover(&store).await;
    assert_eq!(got.next_id, low.0 + 1);
    assert!(got.tasks.iter().any(|t| t.id == low));
    assert_eq!(store.get_task(&low.into()).await.unwrap().unwrap().id, low);
}

#[tokio::test]
async fn the_file_is_created_owner_only_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let journal: String = raw(&path)
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
    assert_eq!(store.config(), &SqliteStoreConfig::default());
    store.migrate().await.unwrap();
    let version: String = raw(&path)
        .query_row(
            "SELECT value FROM cronoq_meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, "5");
}

#[tokio::test]
async fn paths_and_settings_that_cannot_work_are_refused() {
    for path in [":memory:", "file:x.db?mode=memory", ""] {
        let err = SqliteStore::open(path).await.unwrap_err();
        assert!(matches!(err, StoreError::Other(_)), "{path}: {err:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = SqliteStoreConfig {
        lease_renew: Duration::from_secs(10),
        ..SqliteStoreConfig::default()
    };
    assert!(
        SqliteStore::open_with(dir.path().join("db"), config)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn files_of_others_and_newer_files_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.db");
    raw(&other)
        .execute_batch("CREATE TABLE mine (x); INSERT INTO mine VALUES (1);")
        .unwrap();
    let err = SqliteStore::open(&other).await.unwrap_err().to_string();
    assert!(err.contains("not a cronoq database"), "{err}");
    let tables: i64 = raw(&other)
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tables, 1);

    let newer = dir.path().join("newer.db");
    drop(SqliteStore::open(&newer).await.unwrap());
    raw(&newer)
        .execute(
            "UPDATE cronoq_meta SET value = '6' WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
    let err = SqliteStore::open(&newer).await.unwrap_err().to_string();
    assert!(err.contains("schema version 6 is newer"), "{err}");
}

#[tokio::test]
async fn an_older_file_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        // A version 4 file: no worker/attempts columns, no cronoq_pools table.
        drop(SqliteStore::open(&path).await.unwrap());
        let db = raw(&path);
        db.execute_batch(
            "ALTER TABLE cronoq_tasks DROP COLUMN worker; \
             ALTER TABLE cronoq_tasks DROP COLUMN attempts; DROP TABLE cronoq_pools; \
             UPDATE cronoq_meta SET value = '4' WHERE key = 'schema_version';",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let epoch = lead(&store).await;
    let batch = [submitted(id(1, 1), 1, TaskSpec::new(Bytes::new()))];
    store.commit(epoch, BASE, &batch, &[]).await.unwrap();
    assert_eq!(recover(&store).await.tasks.len(), 1);
}

#[tokio::test]
async fn dependencies_resources_fixed_starts_and_labels_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path).await.unwrap();
    let epoch = lead(&store).await;
    let start = FixedStart {
        at: Time(T0 + 5_000_000_000),
        tolerance: Duration::from_millis(2500),
        on_miss: MissPolicy::Skip,
    };
    let spec = TaskSpec::new(Bytes::from_static(b"x"))
        .dep(Dep::on_success(id(1, 1)))
        .dep(Dep::on_failure("cleanup"))
        .dep(Dep::on_complete("other"))
        .resource("gpu", 2)
        .resource("db", 1)
        .label("zone", "eu")
        .label("gpu", "a100")
        .fixed_start(start);
    let batch = [submitted(id(1, 2), 2, spec.clone())];
    store.commit(epoch, BASE, &batch, &[]).await.unwrap();
    let raw_deps: String = raw(&path)
        .query_row("SELECT deps FROM cronoq_tasks", [], |r| r.get(0))
        .unwrap();
    // The Python store's encoding.
    let want_deps = format!(
        r#"[[{},"success"],["cleanup","failure"],["other","complete"]]"#,
        id(1, 1).0
    );
    assert_eq!(raw_deps, want_deps);
    let got = recover(&store).await.tasks.pop().unwrap();
    let mut want = spec;
    want.resources.sort();
    let mut got_spec = got.spec;
    got_spec.resources.sort();
    assert_same_spec(&got_spec, &want);
}

#[tokio::test]
async fn recover_refuses_what_the_library_cannot_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path).await.unwrap();
    let epoch = lead(&store).await;
    let batch = [submitted(id(1, 1), 1, TaskSpec::new(Bytes::new()))];
    store.commit(epoch, BASE, &batch, &[]).await.unwrap();
    let db = raw(&path);
    for (change, undo, what) in [
        (
            "UPDATE cronoq_tasks SET deps = '[[\"parent\",\"sometimes\"]]'",
            "UPDATE cronoq_tasks SET deps = NULL",
            "dependencies",
        ),
        (
            "INSERT INTO cronoq_pools VALUES ('io', 1)",
            "DELETE FROM cronoq_pools",
            "paused pools",
        ),
        (
            "INSERT INTO cronoq_recurring (name, spec) VALUES ('n', '{}')",
            "DELETE FROM cronoq_recurring",
            "recurring schedule \"n\": no pool",
        ),
    ] {
        db.execute(change, []).unwrap();
        let err = Store::<Bytes, Bytes>::recover(&store, BASE)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(what), "{what}: {err}");
        db.execute(undo, []).unwrap();
    }
    assert_eq!(recover(&store).await.tasks.len(), 1);
}

#[tokio::test]
async fn a_commit_queued_too_long_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = SqliteStoreConfig {
        commit_timeout: Duration::ZERO,
        ..fast()
    };
    let store = SqliteStore::open_with(dir.path().join("db"), config)
        .await
        .unwrap();
    let epoch = lead(&store).await;
    let batch = [submitted(id(1, 1), 1, TaskSpec::new(Bytes::new()))];
    let err = store.commit(epoch, BASE, &batch, &[]).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(recover(&store).await.tasks.is_empty());
    assert!(StoreQueries::<Bytes>::is_leader(&store));
}
