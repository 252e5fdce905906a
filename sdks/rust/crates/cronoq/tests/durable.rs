//! A scheduler with a store that persists: write-ahead (replies, starts and ends wait for
//! their commit), recovery by the next instance (same ids, lost attempts counted, outputs and
//! keys kept, ids of the new epoch), and store failures (outages, other errors, fencing,
//! panics), with an in-memory store that keeps what a durable one would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cronoq::core::RecoveredRecurring;
use cronoq::{
    Error, Mutation, OverlapPolicy, Pool, Recovered, RecoveredTask, RecoveredTerminal, Recurring,
    RecurringSpec, RetryPolicy, Scheduler, Store, StoreError, Task, TaskContext, TaskError,
    TaskFailure, TaskId, TaskSpec, TaskStatus, Time, TimeBase,
};

/// A task's row.
struct Row {
    seq: u64,
    arrival: Time,
    spec: TaskSpec<u32>,
    /// `None` while queued.
    status: Option<TaskStatus>,
    attempt: u32,
    at: Time,
    output: Option<u32>,
}

/// How the next commits fail.
enum Failing {
    No,
    /// The next `n` commits fail with this error.
    Times(StoreError, usize),
    /// Every commit panics.
    Panic,
}

/// A schedule's row: spec, next occurrence, latest occurrence.
type Schedule = (RecurringSpec<u32>, Option<Time>, Option<TaskId>);

struct State {
    epoch: u16,
    rows: BTreeMap<u64, Row>,
    /// Schedules by name.
    schedules: BTreeMap<Arc<str>, Schedule>,
    max_id: u64,
    commits: usize,
    failing: Failing,
    released: usize,
    recover_fails: bool,
}

/// An in-memory store that persists (across schedulers sharing it).
#[derive(Clone)]
struct Mem(Arc<Mutex<State>>);

impl Mem {
    fn new() -> Mem {
        Mem(Arc::new(Mutex::new(State {
            epoch: 0,
            rows: BTreeMap::new(),
            schedules: BTreeMap::new(),
            max_id: 0,
            commits: 0,
            failing: Failing::No,
            released: 0,
            recover_fails: false,
        })))
    }

    fn fail(&self, failing: Failing) {
        self.0.lock().unwrap().failing = failing;
    }

    /// A row's (status, attempt).
    fn row(&self, id: TaskId) -> Option<(Option<TaskStatus>, u32)> {
        let st = self.0.lock().unwrap();
        st.rows.get(&id.0).map(|r| (r.status, r.attempt))
    }
}

#[async_trait]
impl Store<u32, u32> for Mem {
    async fn acquire_leadership(&self) -> Result<u16, StoreError> {
        let mut st = self.0.lock().unwrap();
        st.epoch += 1;
        Ok(st.epoch)
    }

    async fn release_leadership(&self) {
        self.0.lock().unwrap().released += 1;
    }

    async fn commit(
        &self,
        epoch: u16,
        _base: TimeBase,
        batch: &[Mutation<u32>],
        outputs: &[(TaskId, &u32)],
    ) -> Result<(), StoreError> {
        let mut st = self.0.lock().unwrap();
        if epoch != st.epoch {
            return Err(StoreError::Fenced);
        }
        match &mut st.failing {
            Failing::No => {}
            Failing::Times(_, 0) => st.failing = Failing::No,
            Failing::Times(e, n) => {
                *n -= 1;
                return Err(e.clone());
            }
            Failing::Panic => {
                drop(st); // (not poisoned)
                panic!("disk on fire");
            }
        }
        st.commits += 1;
        for m in batch {
            match m {
                Mutation::Submitted {
                    id,
                    seq,
                    arrival,
                    spec,
                } => {
                    st.max_id = st.max_id.max(id.0);
                    st.rows.insert(
                        id.0,
                        Row {
                            seq: *seq,
                            arrival: *arrival,
                            spec: spec.clone(),
                            status: None,
                            attempt: 0,
                            at: *arrival,
                            output: None,
                        },
                    );
                }
                Mutation::Status {
                    id,
                    status,
                    attempt,
                    at,
                    ..
                } => {
                    let row = st.rows.get_mut(&id.0).expect("submitted before");
                    row.status = Some(*status);
                    row.attempt = *attempt;
                    row.at = *at;
                    if *status == TaskStatus::Succeeded {
                        row.output = outputs.iter().find(|(o, _)| o == id).map(|(_, o)| **o);
                    }
                }
                Mutation::RecurringUpsert { spec } => {
                    st.schedules
                        .insert(spec.name.clone(), (spec.clone(), None, None));
                }
                Mutation::RecurringRemove { name } => {
                    st.schedules.remove(name);
                }
                Mutation::RecurringNext { name, next, last } => {
                    let row = st.schedules.get_mut(name).expect("upserted before");
                    (row.1, row.2) = (*next, *last);
                }
            }
        }
        Ok(())
    }

    async fn recover(&self, _base: TimeBase) -> Result<Recovered<u32>, StoreError> {
        let st = self.0.lock().unwrap();
        if st.recover_fails {
            return Err(StoreError::Other("unreadable".into()));
        }
        let mut out = Recovered::default();
        for (&id, r) in &st.rows {
            match r.status {
                Some(s) if s.is_terminal() => out.terminal.push(RecoveredTerminal {
                    id: TaskId(id),
                    key: r.spec.key.clone(),
                    status: s,
                    at: r.at,
                }),
                _ => out.tasks.push(RecoveredTask {
                    id: TaskId(id),
                    seq: r.seq,
                    arrival: r.arrival,
                    spec: r.spec.clone(),
                    attempt: r.attempt,
                }),
            }
        }
        out.recurring = st
            .schedules
            .values()
            .map(|(spec, next, last)| RecoveredRecurring {
                spec: spec.clone(),
                next: *next,
                last: *last,
            })
            .collect();
        out.next_id = st.max_id + 1;
        Ok(out)
    }

    async fn load_output(&self, id: TaskId) -> Result<Option<u32>, StoreError> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .rows
            .get(&id.0)
            .and_then(|r| r.output))
    }
}

/// Payload 0 runs forever; others return ten times their payload.
fn tens(name: &str, workers: u32) -> Pool<u32, u32> {
    Pool::fixed(name, workers).executor_fn(|_ctx, n: Arc<u32>| async move {
        if *n == 0 {
            std::future::pending::<()>().await;
        }
        Ok::<_, TaskError>(*n * 10)
    })
}

async fn build(store: &Mem, pool: Pool<u32, u32>) -> Scheduler<u32, u32> {
    Scheduler::builder()
        .pool(pool)
        .store(store.clone())
        .max_store_outage(Duration::from_millis(300))
        .build()
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_next_instance_carries_on_with_what_the_store_kept() {
    let store = Mem::new();
    let s1 = build(&store, tens("default", 1)).await;
    let done = s1.submit(Task::new(1).key("done")).await.unwrap();
    let done_id = done.id();
    assert_eq!(done_id.0 >> 48, 1, "ids carry the epoch");
    assert_eq!(*done.await.unwrap(), 10);
    // A running attempt that never ends, and a task waiting behind it.
    let stuck = s1.enqueue(Task::new(0)).await.unwrap().id;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let pending = s1.enqueue(Task::new(3).key("pending")).await.unwrap().id;
    assert_eq!(
        store.row(stuck),
        Some((Some(TaskStatus::Running), 1)),
        "the attempt's start is durable"
    );
    assert_eq!(store.row(pending), Some((Some(TaskStatus::Ready), 0)));
    s1.shutdown(Duration::ZERO).await.unwrap();

    let s2 = build(&store, tens("default", 2)).await;
    // The pending task runs under its id.
    let h = s2.handle(pending).await.unwrap().expect("recovered");
    assert_eq!(*h.await.unwrap(), 30);
    // The lost attempt is counted: the task retries with attempt 2 and stays stuck.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(s2.status(stuck).await.unwrap(), Some(TaskStatus::Running));
    assert_eq!(store.row(stuck), Some((Some(TaskStatus::Running), 2)));
    // The old output comes back through the store; the key still deduplicates.
    let late = s2.handle("done").await.unwrap().expect("retained");
    assert_eq!(*late.await.unwrap(), 10);
    let again = s2.enqueue(Task::new(7).key("done")).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.id, done_id);
    // New ids carry the new epoch.
    let fresh = s2.submit(Task::new(4)).await.unwrap();
    assert_eq!(fresh.id().0 >> 48, 2);
    assert!(fresh.id().0 > (2 << 48));
    assert_eq!(*fresh.await.unwrap(), 40);
    assert_eq!(
        store.row(pending),
        Some((Some(TaskStatus::Succeeded), 1)),
        "its end is durable"
    );
    s2.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_lost_last_attempt_is_dead_lettered() {
    let store = Mem::new();
    let s1 = build(&store, tens("default", 1)).await;
    let one_try = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    let id = s1.enqueue(Task::new(0).retry(one_try)).await.unwrap().id;
    tokio::time::sleep(Duration::from_millis(10)).await;
    s1.shutdown(Duration::ZERO).await.unwrap();
    let s2 = build(&store, tens("default", 1)).await;
    let h = s2.handle(id).await.unwrap().unwrap();
    match h.await {
        Err(TaskFailure::Ended { status, message }) => {
            assert_eq!(status, TaskStatus::DeadLettered);
            assert_eq!(&*message, "attempt lost in failover; retries exhausted");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.row(id), Some((Some(TaskStatus::DeadLettered), 1)));
    s2.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_attempt_starts_only_once_its_start_is_durable() {
    let store = Mem::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (check, log) = (store.clone(), seen.clone());
    let pool =
        Pool::fixed("default", 2).executor_fn(move |ctx: cronoq::TaskContext, n: Arc<u32>| {
            log.lock().unwrap().push(check.row(ctx.id));
            async move { Ok::<_, TaskError>(*n) }
        });
    let s = build(&store, pool).await;
    let handles = s
        .submit_batch((1..=5).map(Task::new).collect())
        .await
        .unwrap();
    for (i, h) in handles.into_iter().enumerate() {
        let id = h.id();
        assert_eq!(*h.await.unwrap(), i as u32 + 1);
        assert_eq!(store.row(id), Some((Some(TaskStatus::Succeeded), 1)));
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![Some((Some(TaskStatus::Running), 1)); 5]);
    s.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_outage_is_ridden_out_within_its_limit() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    store.fail(Failing::Times(StoreError::Unavailable("down".into()), 3));
    let h = s.submit(Task::new(2)).await.unwrap();
    assert_eq!(*h.await.unwrap(), 20);
    store.fail(Failing::Times(StoreError::Other("odd".into()), 4));
    assert_eq!(s.enqueue_many(vec![Task::new(3)]).await.unwrap().len(), 1);
    s.shutdown(Duration::ZERO).await.unwrap();
}

/// The scheduler stopped with `expected`: the waiting call got it, later calls get
/// `Shutdown`, `stopped()` resolves and `shutdown()` returns it.
async fn stopped_with(
    s: &Scheduler<u32, u32>,
    waiting: Result<cronoq::Submitted, Error>,
) -> String {
    let Err(Error::Store(e)) = waiting else {
        panic!("not a store error: {waiting:?}")
    };
    s.stopped().await;
    assert!(matches!(
        s.enqueue(Task::new(1)).await,
        Err(Error::Shutdown)
    ));
    match s.shutdown(Duration::ZERO).await {
        Err(Error::Store(again)) => assert_eq!(again.to_string(), e.to_string()),
        other => panic!("{other:?}"),
    }
    e.to_string()
}

#[tokio::test(start_paused = true)]
async fn an_outage_past_its_limit_stops_the_scheduler() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    store.fail(Failing::Times(
        StoreError::Unavailable("down".into()),
        usize::MAX,
    ));
    let start = tokio::time::Instant::now();
    let waiting = s.enqueue(Task::new(1)).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(400),
        "{took:?}"
    );
    assert_eq!(stopped_with(&s, waiting).await, "store unavailable: down");
}

#[tokio::test(start_paused = true)]
async fn other_errors_stop_it_at_the_fifth_in_a_row() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    store.fail(Failing::Times(StoreError::Other("corrupt".into()), 5));
    let waiting = s.enqueue(Task::new(1)).await;
    assert_eq!(stopped_with(&s, waiting).await, "corrupt");
}

#[tokio::test(start_paused = true)]
async fn fencing_stops_it_at_once() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    store.0.lock().unwrap().epoch += 1; // another instance leads
    let start = tokio::time::Instant::now();
    let waiting = s.enqueue(Task::new(1)).await;
    assert!(start.elapsed() < Duration::from_millis(50));
    assert_eq!(stopped_with(&s, waiting).await, "fenced: leadership lost");
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_commit_is_another_error() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    store.fail(Failing::Panic);
    let waiting = s.enqueue(Task::new(1)).await;
    assert_eq!(
        stopped_with(&s, waiting).await,
        "store panicked: disk on fire"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_recovery_releases_the_leadership() {
    let store = Mem::new();
    store.0.lock().unwrap().recover_fails = true;
    let built = Scheduler::builder()
        .pool(tens("default", 1))
        .store(store.clone())
        .build()
        .await;
    assert!(matches!(built, Err(Error::Store(StoreError::Other(m))) if m == "unreadable"));
    // So does a configuration error found after it was acquired.
    store.0.lock().unwrap().recover_fails = false;
    let built = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 1))
        .store(store.clone())
        .build()
        .await;
    assert!(matches!(built, Err(Error::Config(_))));
    assert_eq!(store.0.lock().unwrap().released, 2);
}

#[tokio::test(start_paused = true)]
async fn cancellations_and_ends_are_written() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    let stuck = s.submit(Task::new(0)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(s.cancel(stuck.id()).await.unwrap());
    assert_eq!(
        store.row(stuck.id()),
        Some((Some(TaskStatus::Cancelled), 1))
    );
    assert!(matches!(
        stuck.await,
        Err(TaskFailure::Ended {
            status: TaskStatus::Cancelled,
            ..
        })
    ));
    let commits = store.0.lock().unwrap().commits;
    assert!(commits >= 2, "{commits}");
    s.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn occurrences_of_a_schedule_are_written_as_tasks() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    let tick = Recurring::new("tick", "* * * * * *", Task::new(5));
    s.add_recurring(tick).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let ran = {
        let st = store.0.lock().unwrap();
        let done = |r: &&Row| *r.spec.payload == 5 && r.status == Some(TaskStatus::Succeeded);
        st.rows.values().filter(done).count()
    };
    assert!(ran >= 2, "{ran}");
    s.shutdown(Duration::ZERO).await.unwrap();
}

/// A pool whose executor records each attempt's task and key, and returns its payload.
fn recording(name: &str, seen: &Arc<Mutex<Vec<(TaskId, String)>>>) -> Pool<u32, u32> {
    let seen = seen.clone();
    Pool::fixed(name, 1).executor_fn(move |ctx: TaskContext, n: Arc<u32>| {
        let key = ctx.key.as_deref().unwrap_or_default().to_string();
        seen.lock().unwrap().push((ctx.id, key));
        async move { Ok::<_, TaskError>(*n) }
    })
}

/// A scheduler with a schedule every ten seconds (key "t") stopped once an occurrence ran and
/// the next one was created (2 s ahead of its time) but not started: that one's id and key.
async fn stopped_with_an_occurrence_pending(
    store: &Mem,
    seen: &Arc<Mutex<Vec<(TaskId, String)>>>,
) -> (TaskId, String) {
    let s1 = build(store, recording("default", seen)).await;
    let every_ten = Recurring::new("tick", "*/10 * * * * *", Task::new(5).key("t"))
        .overlap(OverlapPolicy::Allow);
    s1.add_recurring(every_ten).await.unwrap();
    // Written before the reply: the schedule and its next occurrence.
    let next = s1.list_recurring().await.unwrap()[0].next;
    {
        let st = store.0.lock().unwrap();
        let (spec, stored_next, _) = &st.schedules[&Arc::from("tick")];
        assert_eq!((&*spec.cron, *stored_next), ("*/10 * * * * *", next));
    }
    let pending = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let info = s1.list_recurring().await.unwrap();
        let last = info[0].last_task;
        if let Some(id) = last.filter(|_| !seen.lock().unwrap().is_empty())
            && s1.status(id).await.unwrap() == Some(TaskStatus::Scheduled)
        {
            break id;
        }
    };
    s1.shutdown(Duration::ZERO).await.unwrap();
    assert_eq!(store.row(pending), Some((Some(TaskStatus::Scheduled), 0)));
    let st = store.0.lock().unwrap();
    let row = &st.rows[&pending.0];
    assert!(row.spec.fixed_start.is_some(), "written with its start");
    (pending, row.spec.key.as_deref().unwrap().to_string())
}

#[tokio::test(start_paused = true)]
async fn a_schedule_resumes_without_creating_an_occurrence_twice() {
    let store = Mem::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (pending, key) = stopped_with_an_occurrence_pending(&store, &seen).await;
    let before = seen.lock().unwrap().len();
    let s2 = build(&store, recording("default", &seen)).await;
    let info = s2.list_recurring().await.unwrap();
    assert_eq!(
        info[0].last_task,
        Some(pending),
        "it resumes with its latest occurrence"
    );
    assert_eq!(
        s2.status(pending).await.unwrap(),
        Some(TaskStatus::Scheduled),
        "it waits for its time"
    );
    // (Its clock read the wall clock again, which the paused test clock did not move: the
    // pending occurrence's time is as far ahead as the first scheduler ran.)
    let runs = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let runs = seen.lock().unwrap().clone();
        if runs.len() >= before + 3 {
            break runs;
        }
    };
    let pending_runs: Vec<_> = runs.iter().filter(|(_, k)| *k == key).collect();
    assert_eq!(
        pending_runs,
        [&(pending, key.clone())],
        "the occurrence created before the restart ran once, under its key"
    );
    let mut keys: Vec<_> = runs.iter().map(|(_, k)| k.clone()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), runs.len(), "no occurrence twice: {runs:?}");
    s2.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_resumed_schedule_owns_its_stored_occurrences() {
    let store = Mem::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (pending, _) = stopped_with_an_occurrence_pending(&store, &seen).await;
    let s2 = build(&store, recording("default", &seen)).await;
    assert!(s2.remove_recurring("tick").await.unwrap());
    assert_eq!(
        s2.status(pending).await.unwrap(),
        Some(TaskStatus::Cancelled),
        "removing the schedule cancels its occurrence not started"
    );
    s2.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_schedule_the_configuration_no_longer_supports_is_dropped_and_counted() {
    let store = Mem::new();
    let s1 = Scheduler::builder()
        .pool(tens("default", 1))
        .pool(tens("other", 1))
        .store(store.clone())
        .build()
        .await
        .unwrap();
    let gone = Recurring::new("gone", "0 0 * * * *", Task::new(1).pool("other"));
    s1.add_recurring(gone).await.unwrap();
    let kept = Recurring::new("kept", "0 0 * * * *", Task::new(1));
    s1.add_recurring(kept).await.unwrap();
    assert!(s1.remove_recurring("kept").await.unwrap());
    assert!(
        !store.0.lock().unwrap().schedules.contains_key("kept"),
        "a removal is written before the reply"
    );
    s1.add_recurring(Recurring::new("kept", "0 0 * * * *", Task::new(1)))
        .await
        .unwrap();
    s1.shutdown(Duration::ZERO).await.unwrap();

    let s2 = build(&store, tens("default", 1)).await;
    let names: Vec<_> = s2.list_recurring().await.unwrap();
    assert_eq!(names.len(), 1);
    assert_eq!(&*names[0].name, "kept");
    assert_eq!(s2.snapshot().await.unwrap().totals.recurring_invalid, 1);
    // It is dropped from the store too, with the first batch written.
    s2.submit(Task::new(2)).await.unwrap().await.unwrap();
    let names: Vec<Arc<str>> = store.0.lock().unwrap().schedules.keys().cloned().collect();
    assert_eq!(names, [Arc::from("kept")]);
    s2.shutdown(Duration::ZERO).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn adding_a_schedule_waits_for_its_commit() {
    let store = Mem::new();
    let s = build(&store, tens("default", 1)).await;
    store.0.lock().unwrap().epoch += 1; // another instance leads
    let added = s
        .add_recurring(Recurring::new("r", "0 0 * * * *", Task::new(1)))
        .await;
    assert!(
        matches!(added, Err(Error::Store(StoreError::Fenced))),
        "{added:?}"
    );
    assert!(matches!(
        s.remove_recurring("r").await,
        Err(Error::Shutdown)
    ));
}
