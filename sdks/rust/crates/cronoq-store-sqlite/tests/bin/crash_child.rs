//! One life of the crash test (tests/crash.rs): a scheduler on a SQLite file that submits a
//! fixed plan of tasks (keys `t0`, `t1`, …; a key submitted in an earlier life names its
//! task) and runs them, logging what it was told and what it started, until it is killed or
//! every task of the plan has ended.
//!
//! `crash-child DB LOGDIR LIFE TOTAL`: appends `<key> <id>` to `LOGDIR/acks` for every
//! acknowledged submission and `<id> <attempt>` to `LOGDIR/starts` for every attempt started
//! (each line written whole before anything else happens, so a kill leaves whole lines);
//! prints `ready` once it leads and `done` when every task has ended.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cronoq::{Pool, RetryPolicy, Scheduler, Task, TaskContext, TaskError};
use cronoq_store_sqlite::{SqliteStore, SqliteStoreConfig};

fn log(path: &std::path::Path) -> Arc<Mutex<File>> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("a log file");
    Arc::new(Mutex::new(file))
}

fn line(file: &Mutex<File>, text: String) {
    // One write per line: a kill leaves whole lines.
    file.lock()
        .unwrap()
        .write_all(text.as_bytes())
        .expect("a log line");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, db, logdir, life, total] = &args[..] else {
        panic!("usage: crash-child DB LOGDIR LIFE TOTAL");
    };
    let logdir = std::path::Path::new(logdir);
    let life: u64 = life.parse().unwrap();
    let total: u64 = total.parse().unwrap();
    let (acks, starts) = (log(&logdir.join("acks")), log(&logdir.join("starts")));
    let config = SqliteStoreConfig {
        retention: Duration::MAX,
        ..SqliteStoreConfig::default()
    };
    let store = SqliteStore::open_with(db, config).await.unwrap();
    let started = starts.clone();
    let pool = Pool::fixed("default", 8)
        .configure(|p| {
            p.retry = RetryPolicy {
                max_attempts: 100,
                initial_backoff: Duration::from_millis(5),
                max_backoff: Duration::from_millis(20),
                ..RetryPolicy::default()
            };
        })
        .executor_fn(move |ctx: TaskContext, payload: Arc<Bytes>| {
            line(&started, format!("{} {}\n", ctx.id.0, ctx.attempt));
            async move {
                // Long enough for kills to find attempts running.
                let ms = 5 + (ctx.id.0 % 7) * 5;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<_, TaskError>(Bytes::from(payload.to_vec()))
            }
        });
    let s = Scheduler::<Bytes, Bytes>::builder()
        .pool(pool)
        .store(store)
        .build()
        .await
        .unwrap();
    println!("ready {life}");
    let mut ids = Vec::with_capacity(total as usize);
    for n in 0..total {
        let key = format!("t{n}");
        let payload = Bytes::from(n.to_string());
        let got = s
            .enqueue(Task::new(payload).key(key.clone()))
            .await
            .unwrap();
        line(&acks, format!("{key} {}\n", got.id.0));
        ids.push(got.id);
    }
    for id in ids {
        loop {
            match s.status(id).await.unwrap() {
                Some(status) if status.is_terminal() => break,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
    s.shutdown(Duration::from_secs(5)).await.unwrap();
    println!("done");
}
