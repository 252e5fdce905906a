//! One file, two languages: what the Rust store writes, the Python `SqliteStore` reads (and
//! leads after it), and what the Python store writes, the Rust store recovers. Compared field
//! by field. The Python is `$CRONOQ_PYTHON` (else the repository's `.venv`), running this
//! repository's `src` (tests/python_store.py is its side).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use cronoq::{
    MissPolicy, Mutation, OverlapPolicy, RecurringSpec, Store, TaskSpec, TaskStatus, Time,
    TimeBase, codec,
};
use cronoq_store_sqlite::SqliteStore;
use serde_json::Value;

const BASE: TimeBase = TimeBase {
    unix_nanos_at_zero: 0,
};

/// Runs tests/python_store.py and returns what it printed.
fn python_store(mode: &str, db: &Path) -> Value {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(python::python())
        .arg(format!("{dir}/tests/python_store.py"))
        .args([mode, db.to_str().unwrap()])
        .env("PYTHONPATH", format!("{dir}/../../../../src"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python_store.py {mode} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn secs(v: &Value) -> Option<Duration> {
    v.as_f64().map(Duration::from_secs_f64)
}

fn text(v: &Value) -> Option<&str> {
    v.as_str()
}

fn tags(v: &Value) -> BTreeMap<String, String> {
    v.as_object().map_or_else(BTreeMap::new, |m| {
        m.iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect()
    })
}

/// Asserts that Python read `spec` from the task `py` as it was written.
fn assert_python_read(py: &Value, spec: &TaskSpec<Bytes>) {
    let id = &py["id"];
    assert_eq!(py["pool"], *spec.pool, "{id} pool");
    assert_eq!(py["kind"], *spec.kind, "{id} kind");
    assert_eq!(py["priority"], spec.priority.index(), "{id} priority");
    assert_eq!(text(&py["key"]), spec.key.as_deref(), "{id} key");
    assert_eq!(py["payload"], hex(&spec.payload), "{id} payload");
    assert_eq!(
        py["deadline"].as_u64().map(Time),
        spec.deadline,
        "{id} deadline"
    );
    assert_eq!(
        secs(&py["duration_hint"]),
        spec.duration_hint,
        "{id} duration_hint"
    );
    assert_eq!(secs(&py["timeout"]), spec.timeout, "{id} timeout");
    match spec.retry {
        None => assert!(py["retry"].is_null(), "{id} retry"),
        Some(r) => {
            let p = &py["retry"];
            assert_eq!(p[0], r.max_attempts, "{id} max_attempts");
            assert_eq!(secs(&p[1]), Some(r.initial_backoff), "{id} initial_backoff");
            assert_eq!(p[2], r.multiplier, "{id} multiplier");
            assert_eq!(secs(&p[3]), Some(r.max_backoff), "{id} max_backoff");
            assert_eq!(p[4], r.jitter, "{id} jitter");
        }
    }
    let want: BTreeMap<String, String> = spec
        .tags
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(tags(&py["tags"]), want, "{id} tags");
    assert_eq!(text(&py["tenant"]), spec.tenant.as_deref(), "{id} tenant");
    assert!(py["problem"].is_null(), "{id}: {}", py["problem"]);
}

/// A store on a new file at `path`, leading it, and its epoch.
async fn leading(path: &Path) -> (SqliteStore, u16) {
    let store = SqliteStore::open_with(path, fast()).await.unwrap();
    let epoch = Store::<Bytes, Bytes>::acquire_leadership(&store)
        .await
        .unwrap();
    (store, epoch)
}

#[tokio::test]
async fn python_reads_what_rust_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let (store, epoch) = leading(&path).await;
    let plain = TaskSpec::new(Bytes::from_static(b"\x00\xffplain"));
    let specs = [
        full_spec(b"full"),
        plain.clone(),
        plain.clone().key("ok"),
        plain.clone().key("bad"),
    ];
    let ids: Vec<_> = (1..=4).map(|n| id(epoch, n)).collect();
    let mut batch: Vec<_> = specs
        .iter()
        .zip(&ids)
        .zip(1..)
        .map(|((spec, id), seq)| submitted(*id, seq, spec.clone()))
        .collect();
    batch.extend([
        status(ids[0], TaskStatus::Ready, 0, 10, None),
        status(ids[1], TaskStatus::Running, 1, 20, None),
        status(ids[2], TaskStatus::Running, 1, 30, None),
        status(ids[2], TaskStatus::Succeeded, 1, 40, None),
        status(ids[3], TaskStatus::Running, 2, 50, None),
        status(
            ids[3],
            TaskStatus::DeadLettered,
            2,
            60,
            Some("retries exhausted"),
        ),
    ]);
    let output = Bytes::from_static(b"{\"rows\":3}");
    store
        .commit(epoch, BASE, &batch, &[(ids[2], &output)])
        .await
        .unwrap();
    store.release_leadership().await;

    let py = python_store("read", &path);
    assert_eq!(py["max_id"], ids[3].0);
    assert_eq!(
        py["epoch"],
        epoch + 1,
        "Python leads next, with the next epoch"
    );
    let tasks = py["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4);
    let expected = [
        ("ready", 0, None, None, T0 + 10),
        ("running", 1, None, None, T0 + 2_000),
        ("succeeded", 1, None, Some(hex(&output)), T0 + 40),
        ("dead_lettered", 2, Some("retries exhausted"), None, T0 + 60),
    ];
    for (i, (py, spec)) in tasks.iter().zip(&specs).enumerate() {
        let (status, attempt, message, output, updated) = &expected[i];
        assert_eq!(py["id"], ids[i].0);
        assert_eq!(py["seq"], i + 1);
        assert_eq!(py["arrival"], T0 + (i as u64 + 1) * 1_000);
        assert_python_read(py, spec);
        assert_eq!(py["status"], *status);
        assert_eq!(py["attempt"], *attempt);
        assert_eq!(text(&py["message"]), *message);
        assert_eq!(py["output"].as_str(), output.as_deref());
        if TaskStatus::from_name(status).unwrap().is_terminal() {
            assert_eq!(py["updated"], *updated, "{status}: when it ended");
        }
    }
}

#[tokio::test]
async fn rust_recovers_what_python_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let py = python_store("write", &path);
    let tasks = py["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 6);

    let store = SqliteStore::open_with(&path, fast()).await.unwrap();
    let got = Store::<Bytes, Bytes>::recover(&store, BASE).await.unwrap();
    assert_eq!(got.next_id, py["max_id"].as_u64().unwrap() + 1);
    let mut live = got.tasks.iter();
    let mut ended = got.terminal.iter();
    for t in tasks {
        let status = TaskStatus::from_name(t["status"].as_str().unwrap()).unwrap();
        let id = t["id"].as_u64().unwrap();
        if status.is_terminal() {
            let e = ended.next().unwrap();
            assert_eq!(e.id.0, id);
            assert_eq!(e.status, status, "{id}");
            assert_eq!(e.key.as_deref(), text(&t["key"]), "{id} key");
            assert_eq!(e.at, Time(t["updated"].as_u64().unwrap()), "{id} ended");
        } else {
            let r = live.next().unwrap();
            assert_eq!(r.id.0, id);
            assert_eq!(r.seq, t["seq"].as_u64().unwrap(), "{id} seq");
            assert_eq!(
                r.arrival,
                Time(t["arrival"].as_u64().unwrap()),
                "{id} arrival"
            );
            assert_eq!(
                r.attempt,
                t["attempt"].as_u64().unwrap() as u32,
                "{id} attempt"
            );
            assert_python_read(t, &r.spec);
        }
        // What a server would show of it.
        let rec = store
            .get_task(&cronoq::TaskId(id).into())
            .await
            .unwrap()
            .unwrap();
        let queued = rec.status.is_none();
        assert_eq!(
            rec.status.unwrap_or(status),
            status,
            "{id} status (queued: {queued})"
        );
        assert_eq!(rec.attempt, t["attempt"].as_u64().unwrap() as u32, "{id}");
        assert_eq!(rec.key.as_deref(), text(&t["key"]), "{id}");
        assert_eq!(rec.message.as_deref(), text(&t["message"]), "{id}");
        assert_eq!(
            rec.output.as_deref().map(hex),
            t["output"].as_str().map(str::to_owned),
            "{id}"
        );
    }
    assert!(live.next().is_none() && ended.next().is_none());
    // The statuses Python wrote, by id order.
    let statuses: Vec<_> = tasks
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "ready",
            "running",
            "retrying",
            "succeeded",
            "dead_lettered",
            "cancelled"
        ]
    );
    // The schedule, every field, with its next and latest occurrences.
    let [sched] = &got.recurring[..] else {
        panic!("{:?}", got.recurring)
    };
    let py_sched = &py["schedules"][0];
    assert_python_read_schedule(py_sched, &sched.spec);
    assert_eq!(&sched.spec.template.payload[..], b"sched");
    assert_eq!(sched.next, py_sched["next"].as_u64().map(Time));
    assert_eq!(sched.last.map(|id| id.0), py_sched["last"].as_u64());
    assert_eq!(sched.spec.overlap, OverlapPolicy::Queue);
    let output = Store::<Bytes, Bytes>::load_output(&store, got.terminal[0].id)
        .await
        .unwrap();
    assert_eq!(output.as_deref(), Some(&b"out"[..]));

    // The Python leader released its lease (epoch 2 after its read): Rust leads at once.
    assert_eq!(py["epoch"], 2);
    let epoch = tokio::time::timeout(
        Duration::from_secs(1),
        Store::<Bytes, Bytes>::acquire_leadership(&store),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(epoch, 3);
}

/// A schedule with every option a template may have.
fn full_schedule() -> RecurringSpec<Bytes> {
    let mut template = full_spec(b"sched").resource("db", 2).label("zone", "eu");
    template.deadline = None; // (a template's deadline is relative: `deadline_after`)
    RecurringSpec {
        name: "nightly".into(),
        cron: "0 2 * * *".into(),
        tz: Some("Europe/Berlin".into()),
        template,
        deadline_after: Some(Duration::from_secs(60)),
        overlap: OverlapPolicy::QueueOnSuccess,
        tolerance: Duration::from_millis(2500),
        on_miss: MissPolicy::Skip,
    }
}

/// Asserts that Python read the schedule `py` as `spec` is.
fn assert_python_read_schedule(py: &Value, spec: &RecurringSpec<Bytes>) {
    let t = &spec.template;
    assert_eq!(py["name"], *spec.name);
    assert_eq!(py["cron"], *spec.cron);
    assert_eq!(text(&py["tz"]), spec.tz.as_deref());
    assert_eq!(secs(&py["deadline_in"]), spec.deadline_after);
    assert_eq!(py["overlap"], codec::overlap_name(spec.overlap));
    assert_eq!(secs(&py["tolerance"]), Some(spec.tolerance));
    assert_eq!(py["on_miss"], codec::miss_name(spec.on_miss));
    let resources: BTreeMap<String, u64> =
        py["resources"].as_object().map_or_else(BTreeMap::new, |m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect()
        });
    let want: BTreeMap<String, u64> = t
        .resources
        .iter()
        .map(|(k, v)| (k.to_string(), u64::from(*v)))
        .collect();
    assert_eq!(resources, want, "resources");
    let labels: BTreeMap<String, String> = t
        .labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(tags(&py["labels"]), labels, "labels");
    // The template's other fields, read as a task's are.
    let mut task = py.clone();
    task["id"] = py["name"].clone();
    task["deadline"] = Value::Null;
    task["problem"] = Value::Null;
    assert_python_read(&task, t);
}

#[tokio::test]
async fn python_reads_the_schedules_rust_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cronoq.db");
    let (store, epoch) = leading(&path).await;
    let plain = RecurringSpec {
        name: "plain".into(),
        cron: "* * * * *".into(),
        tz: None,
        template: TaskSpec::new(Bytes::new()),
        deadline_after: None,
        overlap: OverlapPolicy::Skip,
        tolerance: Duration::from_secs(1),
        on_miss: MissPolicy::RunLate,
    };
    let full = full_schedule();
    let last = id(epoch, 7);
    let batch = [
        Mutation::RecurringUpsert { spec: full.clone() },
        Mutation::RecurringNext {
            name: full.name.clone(),
            next: Some(Time(T0 + 3_600_000_000_000)),
            last: Some(last),
        },
        Mutation::RecurringUpsert {
            spec: plain.clone(),
        },
        Mutation::RecurringNext {
            name: plain.name.clone(),
            next: None,
            last: None,
        },
        // Added, then removed: not kept.
        Mutation::RecurringUpsert {
            spec: RecurringSpec {
                name: "gone".into(),
                ..plain.clone()
            },
        },
        Mutation::RecurringRemove {
            name: "gone".into(),
        },
    ];
    store.commit(epoch, BASE, &batch, &[]).await.unwrap();
    store.release_leadership().await;

    let py = python_store("read", &path);
    let schedules = py["schedules"].as_array().unwrap();
    assert_eq!(schedules.len(), 2);
    for (py, spec) in schedules.iter().zip([&full, &plain]) {
        assert_python_read_schedule(py, spec);
        assert_eq!(
            py["spec"], py["rewritten"],
            "the Python store's own encoding"
        );
    }
    assert_eq!(schedules[0]["payload"], hex(b"sched"));
    assert_eq!(schedules[0]["next"], T0 + 3_600_000_000_000);
    assert_eq!(schedules[0]["last"], last.0);
    assert!(schedules[1]["next"].is_null() && schedules[1]["last"].is_null());
    assert_eq!(schedules[1]["payload"], "");
}
