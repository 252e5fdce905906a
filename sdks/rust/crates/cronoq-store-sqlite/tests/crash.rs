//! Crash safety with real processes: a scheduler on a SQLite file (tests/bin/crash_child.rs)
//! submits and runs a plan of tasks; it is SIGKILLed mid-load several times, a fresh process
//! each time, and a last life runs the plan to its end. Then every acknowledged task is in the
//! file under the id it was acknowledged with and has succeeded, no task of the plan is lost,
//! and no attempt number was started twice for one task (compare the Python library's
//! tests/integration/test_store_crash.py).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cronoq::{TaskId, TaskStatus};
use cronoq_store_sqlite::SqliteStore;

const TOTAL: u64 = 400;
/// How long each killed life runs after it leads, in milliseconds.
const LIVES_MS: [u64; 6] = [150, 400, 60, 700, 250, 900];

fn spawn(db: &Path, logdir: &Path, life: usize) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crash-child"))
        .arg(db)
        .arg(logdir)
        .arg(life.to_string())
        .arg(TOTAL.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(
        first.trim(),
        format!("ready {life}"),
        "life {life} did not start"
    );
    (child, out)
}

fn lines(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (a, b) = l.split_once(' ').expect("whole lines");
            (a.to_owned(), b.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_schedulers_lose_no_acknowledged_task_and_repeat_no_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    for (life, ms) in LIVES_MS.iter().enumerate() {
        let (mut child, _out) = spawn(&db, dir.path(), life);
        std::thread::sleep(Duration::from_millis(*ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    let acked_before = lines(&dir.path().join("acks")).len();
    let started_before = lines(&dir.path().join("starts")).len();
    let last = LIVES_MS.len();
    let (mut child, mut out) = spawn(&db, dir.path(), last);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut line = String::new();
    while line.trim() != "done" {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the last life died");
        assert!(Instant::now() < deadline, "the last life did not finish");
    }
    assert!(child.wait().unwrap().success());

    // The kills happened mid-load: tasks were acknowledged and started before the last life.
    assert!(acked_before > 0 && started_before > 0);
    let store = SqliteStore::open(&db).await.unwrap();
    let mut by_key: BTreeMap<String, u64> = BTreeMap::new();
    for (key, id) in lines(&dir.path().join("acks")) {
        let id: u64 = id.parse().unwrap();
        // A key names one task across lives.
        assert_eq!(*by_key.entry(key.clone()).or_insert(id), id, "key {key}");
    }
    assert_eq!(
        by_key.len() as u64,
        TOTAL,
        "every task of the plan was acknowledged"
    );
    for (key, &id) in &by_key {
        let rec = store
            .get_task(&TaskId(id).into())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged task {key} ({id}) is lost"));
        assert_eq!(rec.key.as_deref(), Some(key.as_str()));
        assert_eq!(rec.status, Some(TaskStatus::Succeeded), "task {key}");
        let n: u64 = key[1..].parse().unwrap();
        assert_eq!(rec.output.as_deref(), Some(n.to_string().as_bytes()));
    }
    let epochs: HashSet<u64> = by_key.values().map(|id| id >> 48).collect();
    eprintln!(
        "{} killed lives: {acked_before} acknowledgements and {started_before} starts before \
         the last life; ids of {} epochs",
        LIVES_MS.len(),
        epochs.len()
    );
    let mut seen = HashSet::new();
    for (id, attempt) in lines(&dir.path().join("starts")) {
        assert!(
            seen.insert((id.clone(), attempt.clone())),
            "attempt {attempt} of {id} started twice"
        );
    }
}
