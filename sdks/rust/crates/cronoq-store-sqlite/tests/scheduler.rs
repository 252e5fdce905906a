//! The Rust library's scheduler on a SQLite file: what one scheduler wrote, the next one
//! (another store handle on the file, as another process would open it) carries on with; and
//! across languages, a Python `cronoq.Scheduler` (tests/python_scheduler.py, run by
//! `$CRONOQ_PYTHON` on this repository's `src`) taking over from a Rust one and the other way.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use bytes::Bytes;
use cronoq::{OverlapPolicy, Pool, Recurring, Scheduler, Task, TaskContext, TaskError, TaskStatus};
use cronoq_store_sqlite::{SqliteStore, SqliteStoreConfig};

/// Payload "stuck" never ends; others come back reversed.
fn pool() -> Pool<Bytes, Bytes> {
    Pool::fixed("default", 1).executor_fn(|_ctx: TaskContext, p: Arc<Bytes>| async move {
        if &p[..] == b"stuck" {
            std::future::pending::<()>().await;
        }
        Ok::<_, TaskError>(p.iter().rev().copied().collect::<Vec<u8>>().into())
    })
}

async fn scheduler(path: &std::path::Path) -> (Scheduler<Bytes, Bytes>, SqliteStore) {
    let config = SqliteStoreConfig {
        retention: Duration::MAX,
        ..SqliteStoreConfig::default()
    };
    let store = SqliteStore::open_with(path, config).await.unwrap();
    let s = Scheduler::builder()
        .pool(pool())
        .store(store.clone())
        .build()
        .await
        .unwrap();
    (s, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_scheduler_recovers_what_the_first_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let (s1, store1) = scheduler(&path).await;
    let done = s1
        .submit(Task::new(Bytes::from("abc")).key("done"))
        .await
        .unwrap();
    let done_id = done.id();
    assert_eq!(&done.await.unwrap()[..], b"cba");
    let stuck = s1
        .enqueue(Task::new(Bytes::from("stuck")))
        .await
        .unwrap()
        .id;
    let queued = s1
        .enqueue(Task::new(Bytes::from("xyz")).key("queued"))
        .await
        .unwrap()
        .id;
    let row = store1.get_task(&stuck.into()).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempt), (Some(TaskStatus::Running), 1));
    s1.shutdown(Duration::ZERO).await.unwrap();
    store1.release_leadership().await;

    let (s2, store2) = scheduler(&path).await;
    assert_eq!(store2.epoch(), Some(2));
    let h = s2.handle(queued).await.unwrap().expect("recovered");
    assert_eq!(&h.await.unwrap()[..], b"zyx");
    // The output of a task that ended under the first scheduler, from the file.
    let late = s2.handle("done").await.unwrap().unwrap();
    assert_eq!(late.id(), done_id);
    assert_eq!(&late.await.unwrap()[..], b"cba");
    // The lost attempt is counted: the next one is the second.
    let row = loop {
        let row = store2.get_task(&stuck.into()).await.unwrap().unwrap();
        if row.attempt == 2 {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(row.status, Some(TaskStatus::Running));
    let fresh = s2.enqueue(Task::new(Bytes::from("n"))).await.unwrap();
    assert_eq!(fresh.id.0 >> 48, 2);
    s2.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_task_still_waits_for_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let (s1, store1) = scheduler(&path).await;
    let parent = s1
        .enqueue(Task::new(Bytes::from("stuck")).key("parent"))
        .await
        .unwrap()
        .id;
    let child = s1
        .enqueue(Task::new(Bytes::from("c")).after("parent"))
        .await
        .unwrap()
        .id;
    s1.shutdown(Duration::ZERO).await.unwrap();
    store1.release_leadership().await;

    let (s2, _store2) = scheduler(&path).await;
    assert_eq!(s2.status(child).await.unwrap(), Some(TaskStatus::Blocked));
    let h = s2.handle(child).await.unwrap().unwrap();
    assert!(s2.cancel(parent).await.unwrap());
    match h.await {
        Err(cronoq::TaskFailure::Ended { status, .. }) => assert_eq!(status, TaskStatus::Skipped),
        other => panic!("{other:?}"),
    }
    s2.shutdown(Duration::ZERO).await.unwrap();
}

/// Runs tests/python_scheduler.py and returns what it printed.
fn python_scheduler(args: &[&str], db: &Path) -> Value {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(common::python::python())
        .arg(format!("{dir}/tests/python_scheduler.py"))
        .arg(args[0])
        .arg(db)
        .args(&args[1..])
        .env("PYTHONPATH", format!("{dir}/../../../../src"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python_scheduler.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_scheduler_runs_what_a_rust_one_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let (s, store) = scheduler(&path).await;
    let done = s
        .submit(Task::new(Bytes::from("abc")).key("rs-done"))
        .await
        .unwrap();
    let done_id = done.id();
    done.await.unwrap();
    let stuck = s.enqueue(Task::new(Bytes::from("stuck"))).await.unwrap().id;
    let queued = s
        .enqueue(Task::new(Bytes::from("xyz")).key("rs-queued"))
        .await
        .unwrap()
        .id;
    s.shutdown(Duration::ZERO).await.unwrap();
    store.release_leadership().await;

    let py = python_scheduler(&["run", "rs-done", "rs-queued"], &path);
    assert_eq!(py["rs-queued"]["id"].as_u64(), Some(queued.0));
    assert_eq!(py["rs-queued"]["output"], "7a7978"); // b"zyx"
    assert_eq!(py["rs-done"]["id"].as_u64(), Some(done_id.0));
    assert_eq!(py["rs-done"]["output"], "636261"); // b"cba", from the file
    // The Python leader counted the attempt lost with the Rust one: it retries.
    let row = store.get_task(&stuck.into()).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempt), (Some(TaskStatus::Retrying), 1));
    assert_eq!(row.message.as_deref(), Some("attempt lost in failover"));
    let row = store.get_task(&queued.into()).await.unwrap().unwrap();
    assert_eq!(row.status, Some(TaskStatus::Succeeded));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_scheduler_runs_what_a_python_one_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let py = python_scheduler(&["write"], &path);
    let id = |name: &str| cronoq::TaskId(py[name].as_u64().unwrap());
    let (s, store) = scheduler(&path).await;
    assert_eq!(store.epoch(), Some(2));
    let queued = s.handle("py-queued").await.unwrap().expect("recovered");
    assert_eq!(queued.id(), id("queued"));
    assert_eq!(&queued.await.unwrap()[..], b"zyx");
    let done = s.handle("py-done").await.unwrap().expect("retained");
    assert_eq!(done.id(), id("done"));
    assert_eq!(&done.await.unwrap()[..], b"cba");
    let stuck = id("stuck");
    let row = loop {
        let row = store.get_task(&stuck.into()).await.unwrap().unwrap();
        if row.attempt == 2 {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(row.status, Some(TaskStatus::Running));
    s.shutdown(Duration::ZERO).await.unwrap();
}

/// The (task id, key) of each attempt, in order.
type Runs = Arc<std::sync::Mutex<Vec<(u64, String)>>>;

/// A scheduler whose executor records each attempt, on a store that keeps ended tasks.
async fn recording(path: &Path, runs: &Runs) -> (Scheduler<Bytes, Bytes>, SqliteStore) {
    let config = SqliteStoreConfig {
        retention: Duration::MAX,
        ..SqliteStoreConfig::default()
    };
    let store = SqliteStore::open_with(path, config).await.unwrap();
    let runs = runs.clone();
    let pool = Pool::fixed("default", 1).executor_fn(move |ctx: TaskContext, p: Arc<Bytes>| {
        let key = ctx.key.as_deref().unwrap_or_default().to_string();
        runs.lock().unwrap().push((ctx.id.0, key));
        async move { Ok::<_, TaskError>((*p).clone()) }
    });
    let s = Scheduler::builder()
        .pool(pool)
        .store(store.clone())
        .build()
        .await
        .unwrap();
    (s, store)
}

/// The keys run by Python (`[[id, key], …]`).
fn python_runs(py: &Value) -> Vec<(u64, String)> {
    py["ran"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_u64().unwrap(), r[1].as_str().unwrap().to_string()))
        .collect()
}

/// Every key of both runs once, and `pending` ran once, under `key`.
fn assert_each_once(mut all: Vec<(u64, String)>, pending: u64, key: &str) {
    let mine: Vec<_> = all.iter().filter(|(id, _)| *id == pending).collect();
    assert_eq!(mine, [&(pending, key.to_string())], "{all:?}");
    let n = all.len();
    all.sort_by(|a, b| a.1.cmp(&b.1));
    all.dedup_by(|a, b| a.1 == b.1);
    assert_eq!(all.len(), n, "an occurrence ran twice: {all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_scheduler_resumes_a_python_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let py = python_scheduler(&["recurring"], &path);
    let pending = py["pending"]["id"].as_u64().unwrap();
    let key = py["pending"]["key"].as_str().unwrap().to_string();
    let runs: Runs = Arc::default();
    let (s, _store) = recording(&path, &runs).await;
    let info = s.list_recurring().await.unwrap();
    assert_eq!((&*info[0].name, &*info[0].cron), ("py-tick", "* * * * * *"));
    assert_eq!(info[0].last_task, Some(cronoq::TaskId(pending)));
    // The pending occurrence runs, then one this scheduler created.
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let runs = runs.lock().unwrap();
        if runs.iter().any(|(id, _)| *id == pending) && runs.last().unwrap().0 != pending {
            break;
        }
    }
    s.shutdown(Duration::ZERO).await.unwrap();
    let mut all = python_runs(&py);
    all.extend(runs.lock().unwrap().iter().cloned());
    assert!(
        all.iter().all(|(_, k)| k.starts_with("py-tick@")),
        "{all:?}"
    );
    assert_each_once(all, pending, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_scheduler_resumes_a_rust_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let runs: Runs = Arc::default();
    let (s, store) = recording(&path, &runs).await;
    let tick = Recurring::new(
        "rs-tick",
        "* * * * * *",
        Task::new(Bytes::from("tick")).key("rs-tick"),
    )
    .overlap(OverlapPolicy::Allow);
    s.add_recurring(tick).await.unwrap();
    let pending = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let last = s.list_recurring().await.unwrap()[0].last_task;
        if let Some(id) = last.filter(|_| !runs.lock().unwrap().is_empty())
            && s.status(id).await.unwrap() == Some(TaskStatus::Scheduled)
        {
            break id;
        }
    };
    s.shutdown(Duration::ZERO).await.unwrap();
    store.release_leadership().await;
    let key = store.get_task(&pending.into()).await.unwrap().unwrap().key;

    let py = python_scheduler(&["resume", "rs-tick", &pending.0.to_string()], &path);
    assert_eq!(
        (&py["cron"], &py["key"]),
        (&Value::from("* * * * * *"), &Value::from("rs-tick"))
    );
    assert_eq!(py["status"], "succeeded");
    let mut all = runs.lock().unwrap().clone();
    all.extend(python_runs(&py));
    assert!(
        all.iter().all(|(_, k)| k.starts_with("rs-tick@")),
        "{all:?}"
    );
    assert_each_once(all, pending.0, &key.unwrap());
}
