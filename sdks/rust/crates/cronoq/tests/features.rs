//! Dependencies and batches, resources, worker groups and labels, fixed starts, custom
//! scalers and the external scaler, priority scores, recurring schedules, per-class and global
//! queue bounds. Every test runs on tokio's paused clock.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use common::{Seen, gated, gated_scheduler, secs, settle};
use cronoq::{
    AutoscaleConfig, Bounds, Dep, Error, ExternalScaler, GroupSnapshot, MissPolicy, OverflowPolicy,
    OverlapPolicy, Pool, Priority, PriorityConfig, Recurring, ResourceConfig, ScaleError, Scaler,
    Scheduler, SlotScaler, SubmitError, Task, TaskContext, TaskError, TaskFailure, TaskId,
    TaskStatus, UnknownDependency, core::CoreConfig,
};

/// A scheduler whose executor fails payload 0 permanently and returns the others.
async fn failing_zero(workers: u32) -> Scheduler<u32, u32> {
    Scheduler::builder()
        .pool(
            Pool::fixed("default", workers).executor_fn(|_ctx, n: Arc<u32>| async move {
                match *n {
                    0 => Err(TaskError::permanent("zero")),
                    n => Ok(n),
                }
            }),
        )
        .build()
        .await
        .unwrap()
}

fn invalid(e: Error) -> String {
    match e {
        Error::Submit(e) => e.to_string(),
        other => panic!("not a submit error: {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_dependent_waits_blocked_for_its_parent() {
    let (s, mut gate) = gated_scheduler(2, |p| p).await;
    let parent = s.submit(Task::new(1).key("load")).await.unwrap();
    let child = s.submit(Task::new(2).after("load")).await.unwrap();
    assert_eq!(gate.next().await.id, parent.id());
    settle().await;
    assert_eq!(
        s.status(child.id()).await.unwrap(),
        Some(TaskStatus::Blocked)
    );
    gate.open(1);
    assert_eq!(*parent.await.unwrap(), 1);
    assert_eq!(gate.next().await.id, child.id());
    gate.open(1);
    assert_eq!(*child.await.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn edge_conditions_skip_or_run_dependents() {
    let s = failing_zero(2).await;
    let parent = s.submit(Task::new(0).key("p")).await.unwrap();
    let on_success = s.submit(Task::new(1).after(parent.id())).await.unwrap();
    let on_failure = s
        .submit(Task::new(2).dep(Dep::on_failure("p")))
        .await
        .unwrap();
    let on_complete = s
        .submit(Task::new(3).dep(Dep::on_complete("p")))
        .await
        .unwrap();
    assert!(parent.await.is_err());
    let skipped = on_success.await.unwrap_err();
    assert_eq!(skipped.status(), Some(TaskStatus::Skipped));
    // (`dependency 1 ended as failed`, or without the id when the parent had ended before
    // the dependent was submitted, as here)
    assert!(
        skipped.to_string().ends_with("ended as failed"),
        "{skipped}"
    );
    assert_eq!(*on_failure.await.unwrap(), 2);
    assert_eq!(*on_complete.await.unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn dependency_errors_name_the_parent() {
    let s = failing_zero(1).await;
    let err = |e: Error| invalid(e);
    assert_eq!(
        err(s.submit(Task::new(1).after("nope")).await.unwrap_err()),
        "unknown dependency 'nope'"
    );
    assert_eq!(
        err(s.submit(Task::new(1).after(TaskId(42))).await.unwrap_err()),
        "unknown dependency '42'"
    );
    assert!(matches!(
        s.submit(Task::new(1).key("me").after("me")).await,
        Err(Error::Submit(SubmitError::Cycle))
    ));
    assert_eq!(
        err(s.submit(Task::new(1).after("a\0b")).await.unwrap_err()),
        "invalid task: dependency keys must not contain NUL characters"
    );
    let batch = s
        .submit_batch(vec![Task::new(1).key("a"), Task::new(2).after("missing")])
        .await;
    assert!(matches!(
        batch,
        Err(Error::Submit(SubmitError::UnknownDependency(k))) if &*k == "missing"
    ));
    assert_eq!(s.snapshot().await.unwrap().totals.submitted, 0);
}

#[tokio::test(start_paused = true)]
async fn a_batch_may_name_later_tasks_and_parents_are_admitted_first() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let handles = s
        .submit_batch(vec![
            Task::new(1).key("late").after("z"),
            Task::new(2).key("mid").after("z"),
            Task::new(3).key("z"),
        ])
        .await
        .unwrap();
    let ids: Vec<TaskId> = handles.iter().map(|h| h.id()).collect();
    assert_eq!(ids, [TaskId(1), TaskId(2), TaskId(3)], "ids in input order");
    for key in ["z", "late", "mid"] {
        let ctx = gate.next().await;
        assert_eq!(ctx.key.as_deref(), Some(key));
        gate.open(1);
    }
    for h in handles {
        h.await.unwrap();
    }
    let cycle = s
        .submit_batch(vec![
            Task::new(1).key("x").after("y"),
            Task::new(2).key("y").after("x"),
        ])
        .await;
    assert!(matches!(cycle, Err(Error::Submit(SubmitError::Cycle))));
}

#[tokio::test(start_paused = true)]
async fn a_pool_may_await_keys_not_submitted_yet() {
    let (s, mut gate) = gated_scheduler(1, |p| {
        p.configure(|c| {
            c.unknown_dependency = UnknownDependency::Await {
                timeout: Some(secs(10)),
            }
        })
    })
    .await;
    let child = s.submit(Task::new(2).after("later")).await.unwrap();
    let orphan = s.submit(Task::new(3).after("never")).await.unwrap();
    let parent = s.submit(Task::new(1).key("later")).await.unwrap();
    assert_eq!(gate.next().await.id, parent.id());
    gate.open(2);
    assert_eq!(gate.next().await.id, child.id());
    assert_eq!(*child.await.unwrap(), 2);
    let failure = orphan.await.unwrap_err();
    assert_eq!(failure.status(), Some(TaskStatus::Skipped));
}

#[tokio::test(start_paused = true)]
async fn a_semaphore_limits_attempts_across_pools() {
    let (exec, mut gate) = gated();
    let exec = Arc::new(exec);
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 2).executor_arc(exec.clone()))
        .pool(Pool::fixed("other", 2).executor_arc(exec))
        .resource(ResourceConfig::semaphore("db", 1))
        .build()
        .await
        .unwrap();
    let a = s.submit(Task::new(1).resource("db", 1)).await.unwrap();
    let b = s
        .submit(Task::new(2).pool("other").resource("db", 1))
        .await
        .unwrap();
    let free = s.submit(Task::new(3)).await.unwrap();
    assert_eq!(gate.next().await.id, a.id());
    assert_eq!(
        gate.next().await.id,
        free.id(),
        "a waiting task blocks nobody"
    );
    settle().await;
    assert_eq!(s.status(b.id()).await.unwrap(), Some(TaskStatus::Ready));
    gate.open(1);
    a.await.unwrap();
    assert_eq!(gate.next().await.id, b.id());
    gate.open(2);
    b.await.unwrap();
    free.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_token_bucket_paces_attempts() {
    let s = Scheduler::<u32, Duration>::builder()
        .pool(
            Pool::fixed("default", 4).executor_fn(|ctx: TaskContext, _n: Arc<u32>| async move {
                let _ = ctx;
                Ok::<_, TaskError>(tokio::time::Instant::now().elapsed())
            }),
        )
        .resource(ResourceConfig::token_bucket("api", 1.0, 1))
        .build()
        .await
        .unwrap();
    let mut events = s.events();
    let start = tokio::time::Instant::now();
    let handles = futures_join(&s, 3).await;
    let mut ends = Vec::new();
    for _ in 0..3 {
        let ev = events.recv().await.unwrap();
        assert_eq!(ev.status, TaskStatus::Succeeded);
        ends.push(tokio::time::Instant::now() - start);
    }
    for h in handles {
        h.await.unwrap();
    }
    assert!(ends[2] >= secs(2), "one token per second: {ends:?}");
}

async fn futures_join(s: &Scheduler<u32, Duration>, n: u32) -> Vec<cronoq::TaskHandle<Duration>> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(s.submit(Task::new(i).resource("api", 1)).await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn resource_errors_at_build_and_submit() {
    let build = |r: Vec<ResourceConfig>| {
        let mut b = Scheduler::<u32, u32>::builder().pool(
            Pool::fixed("default", 1)
                .executor_fn(|_ctx, n: Arc<u32>| async move { Ok::<_, TaskError>(*n) }),
        );
        for r in r {
            b = b.resource(r);
        }
        b.build()
    };
    let twice = vec![
        ResourceConfig::semaphore("db", 1),
        ResourceConfig::semaphore("db", 2),
    ];
    assert_eq!(
        build(twice).await.err().unwrap().to_string(),
        "configuration error: duplicate resource 'db'"
    );
    let s = build(vec![ResourceConfig::semaphore("db", 2)])
        .await
        .unwrap();
    let err = |t: Task<u32>| {
        let s = s.clone();
        async move { invalid(s.submit(t).await.unwrap_err()) }
    };
    assert_eq!(
        err(Task::new(1).resource("cache", 1)).await,
        "unknown resource 'cache'"
    );
    assert_eq!(
        err(Task::new(1).resource("db", 3)).await,
        "requested amount exceeds capacity of resource 'db'"
    );
    assert_eq!(
        err(Task::new(1).resource("db", 0)).await,
        "invalid task: resource amount must be > 0"
    );
    assert_eq!(
        err(Task::new(1).resource("d\0b", 1)).await,
        "invalid task: resource names must not contain NUL characters"
    );
    let batch = s
        .submit_batch(vec![Task::new(1), Task::new(2).resource("gpu", 1)])
        .await;
    assert!(matches!(
        batch,
        Err(Error::Submit(SubmitError::UnknownResource(r))) if &*r == "gpu"
    ));
}

#[tokio::test(start_paused = true)]
async fn labeled_tasks_wait_for_a_matching_group() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let labeled = s
        .submit(Task::new(1).label("gpu", "a100").label("zone", "eu"))
        .await
        .unwrap();
    let plain = s.submit(Task::new(2)).await.unwrap();
    let ctx = gate.next().await;
    assert_eq!((ctx.id, ctx.group.len()), (plain.id(), 0));
    s.set_group_capacity(
        "default",
        &[("zone", "eu"), ("gpu", "a100"), ("os", "linux")],
        1,
    )
    .await
    .unwrap();
    let ctx = gate.next().await;
    assert_eq!(ctx.id, labeled.id());
    let names: Vec<(&str, &str)> = ctx.group.iter().map(|(k, v)| (&**k, &**v)).collect();
    assert_eq!(names, [("gpu", "a100"), ("os", "linux"), ("zone", "eu")]);
    let snap = s.snapshot().await.unwrap();
    let pool = snap.pool("default").unwrap();
    assert_eq!(pool.capacity, 2);
    assert_eq!(
        pool.groups,
        [
            GroupSnapshot {
                labels: vec![],
                capacity: 1,
                busy: 1
            },
            GroupSnapshot {
                labels: vec![
                    ("gpu".into(), "a100".into()),
                    ("os".into(), "linux".into()),
                    ("zone".into(), "eu".into())
                ],
                capacity: 1,
                busy: 1
            },
        ]
    );
    gate.open(2);
    labeled.await.unwrap();
    plain.await.unwrap();
    assert_eq!(gate.log(), [Seen::Started(2), Seen::Started(1)]);
    assert!(matches!(
        s.set_group_capacity("nope", &[], 1).await,
        Err(Error::Submit(SubmitError::UnknownPool(_)))
    ));
    assert_eq!(
        invalid(s.submit(Task::new(3).label("k", "\0")).await.unwrap_err()),
        "invalid task: labels must not contain NUL characters"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fixed_start_waits_scheduled_and_starts_on_time() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let start = tokio::time::Instant::now();
    let h = s.submit(Task::new(1).start_in(secs(30))).await.unwrap();
    settle().await;
    assert_eq!(s.status(h.id()).await.unwrap(), Some(TaskStatus::Scheduled));
    assert_eq!(s.snapshot().await.unwrap().pools[0].reservations, 1);
    let ctx = gate.next().await;
    assert_eq!(ctx.id, h.id());
    let waited = tokio::time::Instant::now() - start;
    assert!(waited >= secs(30) && waited < secs(31), "{waited:?}");
    gate.open(1);
    h.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reservations_conflict_and_missed_starts_follow_their_policy() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let at = SystemTime::now() + secs(60);
    let first = s.submit(Task::new(1).start_at(at)).await.unwrap();
    assert!(matches!(
        s.submit(Task::new(2).start_at(at)).await,
        Err(Error::Submit(SubmitError::ReservationConflict))
    ));
    // The only worker is busy past the next start: it is missed.
    let busy = s.submit(Task::new(3)).await.unwrap();
    assert_eq!(gate.next().await.id, busy.id());
    let missed = s
        .submit(
            Task::new(4)
                .on_miss(MissPolicy::Skip)
                .start_tolerance(Duration::from_millis(500))
                .start_in(secs(5)),
        )
        .await
        .unwrap();
    match missed.await {
        Err(TaskFailure::Ended { status, message }) => {
            assert_eq!(
                (status, &*message),
                (TaskStatus::Missed, "fixed start missed")
            );
        }
        other => panic!("{other:?}"),
    }
    gate.open(2);
    busy.await.unwrap();
    assert_eq!(gate.next().await.id, first.id());
    first.await.unwrap();
}

/// Answers every request with at most `cap` workers and records it.
struct Capped {
    cap: u32,
    asked: Arc<Mutex<Vec<(String, u32)>>>,
}

#[async_trait]
impl Scaler for Capped {
    async fn scale_to(&self, pool: &str, desired: u32) -> Result<u32, ScaleError> {
        self.asked.lock().unwrap().push((pool.to_string(), desired));
        match desired {
            99 => panic!("no such size"),
            _ => Ok(desired.min(self.cap)),
        }
    }
}

/// Fails every request.
struct Broken;

#[async_trait]
impl Scaler for Broken {
    async fn scale_to(&self, _pool: &str, _desired: u32) -> Result<u32, ScaleError> {
        Err(ScaleError::Other("cloud quota".into()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_scalers_answer_is_the_capacity() {
    let (exec, mut gate) = gated();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 3).executor(exec).scaler(Capped {
            cap: 1,
            asked: asked.clone(),
        }))
        .build()
        .await
        .unwrap();
    assert_eq!(*asked.lock().unwrap(), [("default".to_string(), 3)]);
    let a = s.submit(Task::new(1)).await.unwrap();
    let b = s.submit(Task::new(2)).await.unwrap();
    assert_eq!(gate.next().await.id, a.id());
    settle().await;
    assert_eq!(s.status(b.id()).await.unwrap(), Some(TaskStatus::Ready));
    let pool = &s.snapshot().await.unwrap().pools[0];
    assert_eq!((pool.capacity, pool.busy), (1, 1));
    gate.open(2);
    a.await.unwrap();
    assert_eq!(gate.next().await.id, b.id());
    b.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_external_pool_runs_only_what_set_capacity_reports() {
    let (exec, mut gate) = gated();
    let (slots, mut slot_gate) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(
            Pool::fixed("default", 2)
                .executor(exec)
                .scaler(ExternalScaler),
        )
        .pool(Pool::fixed("local", 1).executor(slots).scaler(SlotScaler))
        .build()
        .await
        .unwrap();
    let h = s.submit(Task::new(1)).await.unwrap();
    let local = s.submit(Task::new(2).pool("local")).await.unwrap();
    assert_eq!(
        slot_gate.next().await.id,
        local.id(),
        "slot pools still run"
    );
    settle().await;
    assert_eq!(s.status(h.id()).await.unwrap(), Some(TaskStatus::Ready));
    assert_eq!(s.snapshot().await.unwrap().pools[0].capacity, 0);
    s.set_capacity("default", 1).await.unwrap();
    assert_eq!(gate.next().await.id, h.id());
    gate.open(1);
    slot_gate.open(1);
    h.await.unwrap();
    local.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_autoscalers_targets_go_to_the_scaler() {
    let (exec, mut gate) = gated();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let s = Scheduler::<u32, u32>::builder()
        .pool(
            Pool::new("default")
                .workers(1, 1, 6)
                .autoscale(AutoscaleConfig::default())
                .executor(exec)
                .scaler(Capped {
                    cap: 3,
                    asked: asked.clone(),
                }),
        )
        .build()
        .await
        .unwrap();
    let mut handles = Vec::new();
    for i in 0..20 {
        handles.push(s.submit(Task::new(i)).await.unwrap());
    }
    gate.next().await;
    // The backlog raises the target at the next evaluations; the scaler grants 3 at most.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let asked_now = asked.lock().unwrap().clone();
    assert_eq!(asked_now[0], ("default".to_string(), 1));
    assert!(asked_now.len() >= 2 && asked_now[1].1 > 1, "{asked_now:?}");
    let pool = &s.snapshot().await.unwrap().pools[0];
    assert_eq!(pool.capacity, 3);
    assert!(
        pool.desired > 3,
        "the target is still shown: {}",
        pool.desired
    );
    gate.open(20);
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn failing_and_panicking_scalers_leave_the_capacity() {
    let (exec, mut gate) = gated();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 2).executor(exec).scaler(Broken))
        .pool(
            Pool::fixed("other", 99)
                .executor_fn(|_ctx, n: Arc<u32>| async move { Ok(*n) })
                .scaler_arc(Arc::new(Capped { cap: 5, asked })),
        )
        .build()
        .await
        .unwrap();
    let snap = s.snapshot().await.unwrap();
    assert_eq!((snap.pools[0].capacity, snap.pools[1].capacity), (0, 0));
    s.set_capacity("default", 1).await.unwrap();
    let h = s.submit(Task::new(7)).await.unwrap();
    assert_eq!(gate.next().await.id, h.id());
    gate.open(1);
    assert_eq!(*h.await.unwrap(), 7);
    assert_eq!(
        ScaleError::External.to_string(),
        "capacity is managed externally"
    );
}

#[tokio::test(start_paused = true)]
async fn aging_lets_a_waiting_low_task_overtake_a_normal_one() {
    let (exec, mut gate) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 1).executor(exec))
        .priority(PriorityConfig {
            aging_rate: [1000.0; 4],
            ..PriorityConfig::default()
        })
        .build()
        .await
        .unwrap();
    let busy = s.submit(Task::new(0)).await.unwrap();
    gate.next().await;
    s.submit(Task::new(3).priority(Priority::Low))
        .await
        .unwrap();
    tokio::time::sleep(secs(1)).await;
    s.submit(Task::new(2)).await.unwrap();
    s.submit(Task::new(1).priority(Priority::High))
        .await
        .unwrap();
    gate.open(4);
    busy.await.unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(gate.next().await.id.0);
    }
    assert_eq!(order, [4, 2, 3], "High, then the aged Low, then Normal");
    let negative = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 1).executor(gated().0))
        .priority(PriorityConfig {
            age_cap: [1.0, 2.0, 3.0, -4.0],
            ..PriorityConfig::default()
        })
        .build()
        .await;
    assert!(
        matches!(negative, Err(Error::Config(m)) if m == "priority age_cap must be finite and >= 0")
    );
}

/// Runs a Low task submitted 2 s before a High and a Normal one on one busy worker, under
/// `priority`, and returns the ids in the order they start (Low 2, High 3, Normal 4).
async fn order_after_low_waited(priority: PriorityConfig) -> Vec<u64> {
    let (exec, mut gate) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 1).executor(exec))
        .priority(priority)
        .build()
        .await
        .unwrap();
    let busy = s.submit(Task::new(0)).await.unwrap();
    gate.next().await;
    s.submit(Task::new(2).priority(Priority::Low))
        .await
        .unwrap();
    tokio::time::sleep(secs(2)).await;
    s.submit(Task::new(3).priority(Priority::High))
        .await
        .unwrap();
    s.submit(Task::new(4)).await.unwrap();
    gate.open(4);
    busy.await.unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(gate.next().await.id.0);
    }
    order
}

#[tokio::test(start_paused = true)]
async fn a_class_that_ages_faster_overtakes_a_higher_one() {
    let default = order_after_low_waited(PriorityConfig::default()).await;
    assert_eq!(
        default,
        [3, 4, 2],
        "High, Normal, then Low (4 points of aging)"
    );
    let low_ages_fast = PriorityConfig {
        aging_rate: [2.0, 2.0, 2.0, 1000.0],
        age_cap: [800.0, 800.0, 800.0, 5000.0],
        ..PriorityConfig::default()
    };
    let order = order_after_low_waited(low_ages_fast).await;
    assert_eq!(
        order,
        [2, 3, 4],
        "Low (10 + 2000) before High (1000) and Normal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slot_is_held_no_earlier_than_max_hold_before_a_fixed_start() {
    // A tolerance of 400 s would hold the only worker from 600 s; the default cap is 300 s.
    let (s, _gate) = gated_scheduler(1, |p| p).await;
    s.submit(Task::new(1).start_tolerance(secs(400)).start_in(secs(1000)))
        .await
        .unwrap();
    let held = || async { s.snapshot().await.unwrap().pools[0].held };
    tokio::time::sleep(secs(650)).await;
    assert_eq!(held().await, 0, "not held 350 s ahead");
    tokio::time::sleep(secs(51)).await;
    assert_eq!(held().await, 1, "held from 300 s ahead");
    // A pool's own cap: 10 s ahead of a start with 50 s of tolerance.
    let (s, _gate) = gated_scheduler(1, |p| p.configure(|c| c.max_hold = secs(10))).await;
    s.submit(Task::new(1).start_tolerance(secs(50)).start_in(secs(100)))
        .await
        .unwrap();
    let held = || async { s.snapshot().await.unwrap().pools[0].held };
    tokio::time::sleep(secs(80)).await;
    assert_eq!(held().await, 0, "not held 20 s ahead");
    tokio::time::sleep(secs(11)).await;
    assert_eq!(held().await, 1, "held from 10 s ahead");
}

#[tokio::test(start_paused = true)]
async fn snapshot_metrics_forget_dispatches_older_than_the_window() {
    let build = |window: Duration| {
        Scheduler::<u32, u32>::builder()
            .pool(Pool::fixed("default", 1).executor_fn(|_ctx, n: Arc<u32>| async move { Ok(*n) }))
            .configure(move |c| c.metrics_window = window)
            .build()
    };
    for (window, after_10s) in [(secs(60), 1), (secs(5), 0)] {
        let s = build(window).await.unwrap();
        s.submit(Task::new(1)).await.unwrap().await.unwrap();
        let snap = s.snapshot().await.unwrap();
        assert_eq!(
            (snap.pools[0].window, snap.pools[0].dispatched),
            (window, 1)
        );
        tokio::time::sleep(secs(10)).await;
        let dispatched = s.snapshot().await.unwrap().pools[0].dispatched;
        assert_eq!(dispatched, after_10s, "window {window:?}");
    }
    assert!(matches!(
        build(Duration::ZERO).await,
        Err(Error::Config(m)) if m == "metrics_window must be > 0 and at most one day"
    ));
}

#[tokio::test(start_paused = true)]
async fn validate_refuses_what_build_refuses_with_the_same_message() {
    let bad: [fn(&mut CoreConfig); 5] = [
        |c| c.urgency.overdue_rate = -1.0,
        |c| c.priority.age_cap[3] = f64::INFINITY,
        |c| c.metrics_window = Duration::ZERO,
        |c| {
            c.resources
                .push(ResourceConfig::token_bucket("api", 0.0, 1))
        },
        |c| {
            c.resources = vec![
                ResourceConfig::semaphore("db", 1),
                ResourceConfig::semaphore("db", 2),
            ]
        },
    ];
    assert_eq!(CoreConfig::default().validate(), Ok(()));
    for change in bad {
        let mut config = CoreConfig::default();
        change(&mut config);
        let said = config.validate().unwrap_err();
        let built = Scheduler::<u32, u32>::builder()
            .pool(Pool::fixed("default", 1).executor_fn(|_ctx, n: Arc<u32>| async move { Ok(*n) }))
            .configure(change)
            .build()
            .await;
        assert!(
            matches!(&built, Err(Error::Config(m)) if *m == said),
            "{said}: {:?}",
            built.err()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_schedule_creates_tagged_occurrences_until_removed() {
    let (s, mut gate) = gated_scheduler(2, |p| p).await;
    let every_second =
        Recurring::new("tick", "* * * * * *", Task::new(7).key("t")).overlap(OverlapPolicy::Allow);
    s.add_recurring(every_second).await.unwrap();
    let mut keys = Vec::new();
    for _ in 0..3 {
        let ctx = gate.next().await;
        assert_eq!(ctx.tag("cronoq.recurring"), Some("tick"));
        let key = ctx.key.clone().unwrap();
        assert!(
            key.starts_with("t@") && key.ends_with('Z') && key.len() == 22,
            "{key}"
        );
        keys.push(key);
        gate.open(1);
    }
    keys.dedup();
    assert_eq!(keys.len(), 3, "one occurrence per second");
    let info = s.list_recurring().await.unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(
        (&*info[0].name, &*info[0].cron, &*info[0].pool),
        ("tick", "* * * * * *", "default")
    );
    assert_eq!(info[0].overlap, OverlapPolicy::Allow);
    assert!(info[0].next.is_some() && info[0].last_task.is_some());
    assert!(s.remove_recurring("tick").await.unwrap());
    assert!(!s.remove_recurring("tick").await.unwrap());
    assert!(s.list_recurring().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_occurrence_is_skipped_while_the_previous_one_runs() {
    let (s, mut gate) = gated_scheduler(2, |p| p).await;
    let mut events = s.events();
    let tick = Recurring::new("tick", "* * * * * *", Task::new(1).key("t"));
    s.add_recurring(tick).await.unwrap();
    let first = gate.next().await;
    let skipped = loop {
        let ev = events.recv().await.unwrap();
        if ev.status == TaskStatus::Skipped {
            break ev;
        }
    };
    assert_ne!(skipped.id, first.id);
    assert_eq!(
        skipped.message.as_deref(),
        Some("previous occurrence still running")
    );
    s.remove_recurring("tick").await.unwrap();
    gate.open(1);
}

#[tokio::test(start_paused = true)]
async fn schedules_are_checked_when_added() {
    let (s, _gate) = gated_scheduler(1, |p| p).await;
    let add = |r: Recurring<u32>| {
        let s = s.clone();
        async move {
            match s.add_recurring(r).await {
                Err(Error::Config(m)) => m,
                other => panic!("{other:?}"),
            }
        }
    };
    let t = || Task::new(1);
    assert!(
        add(Recurring::new("r", "61 * * * *", t()))
            .await
            .starts_with("invalid cron '61 * * * *': ")
    );
    assert_eq!(
        add(Recurring::new("r", "* * * * *", t()).tz("Mars/Olympus")).await,
        "unknown time zone 'Mars/Olympus'"
    );
    assert_eq!(
        add(Recurring::new("r", "* * * * *", t().pool("nope"))).await,
        "invalid template: unknown pool 'nope'"
    );
    assert!(
        add(Recurring::new(
            "r",
            "* * * * *",
            t().deadline_at(SystemTime::now())
        ))
        .await
        .contains("absolute deadline")
    );
    assert_eq!(
        add(Recurring::new("r", "* * * * *", t().start_in(secs(5)))).await,
        "recurring templates cannot set a fixed start"
    );
    assert!(
        add(Recurring::new("r", "* * * * *", t().after("x")))
            .await
            .contains("cannot set a dependency")
    );
    assert_eq!(
        add(Recurring::new("r\0", "* * * * *", t())).await,
        "recurring names must not contain NUL characters"
    );
    assert_eq!(
        add(Recurring::new("r", "* * * * *", t().tag("k", "\0"))).await,
        "invalid task: tags must not contain NUL characters"
    );
    assert!(s.list_recurring().await.unwrap().is_empty());
    // A year far ahead: the next occurrence is then.
    s.add_recurring(Recurring::new("far", "0 0 0 1 1 * 2099", t()))
        .await
        .unwrap();
    let next = s.list_recurring().await.unwrap()[0].next.unwrap();
    assert_eq!(next, cronoq::Time(4_070_908_800_000_000_000));
}

#[tokio::test(start_paused = true)]
async fn occurrences_hold_the_templates_resource_and_run_on_its_labelled_group() {
    let (exec, mut gate) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 2).executor(exec))
        .resource(ResourceConfig::semaphore("db", 1))
        .build()
        .await
        .unwrap();
    s.set_group_capacity("default", &[("zone", "eu")], 1)
        .await
        .unwrap();
    let template = Task::new(7).resource("db", 1).label("zone", "eu");
    let tick = Recurring::new("tick", "* * * * * *", template).overlap(OverlapPolicy::Allow);
    s.add_recurring(tick).await.unwrap();
    let ctx = gate.next().await;
    assert_eq!(ctx.tag("cronoq.recurring"), Some("tick"));
    let group: Vec<(&str, &str)> = ctx.group.iter().map(|(k, v)| (&**k, &**v)).collect();
    assert_eq!(group, [("zone", "eu")], "on the labelled group");
    // While it runs it holds the one unit of "db": a task needing it waits, and so does the
    // next occurrence (the labelled group is busy too, but an unlabelled slot is free).
    let waiting = s.submit(Task::new(1).resource("db", 1)).await.unwrap();
    tokio::time::sleep(secs(3)).await;
    assert_eq!(
        s.status(waiting.id()).await.unwrap(),
        Some(TaskStatus::Ready)
    );
    s.remove_recurring("tick").await.unwrap();
    gate.open(1);
    assert_eq!(gate.next().await.id, waiting.id(), "the unit is back");
    gate.open(1);
    waiting.await.unwrap();
}

fn low_bound(n: usize) -> Bounds {
    let mut b = Bounds::default();
    b.max_pending_per_class[Priority::Low.index()] = Some(n);
    b
}

#[tokio::test(start_paused = true)]
async fn a_per_class_bound_parks_only_its_class() {
    let (s, mut gate) = gated_scheduler(1, |p| p.configure(|c| c.bounds = low_bound(1))).await;
    let busy = s.submit(Task::new(0)).await.unwrap();
    gate.next().await;
    let low = || Task::new(1).priority(Priority::Low);
    let first = s.submit(low()).await.unwrap();
    let parked = tokio::spawn({
        let s = s.clone();
        async move { s.submit(Task::new(2).priority(Priority::Low)).await }
    });
    settle().await;
    assert!(!parked.is_finished(), "a second Low task waits for room");
    let normal = s.submit(Task::new(3)).await.unwrap();
    gate.open(1);
    busy.await.unwrap();
    assert_eq!(gate.next().await.id, normal.id());
    gate.open(1);
    assert_eq!(gate.next().await.id, first.id());
    let second = parked.await.unwrap().unwrap();
    gate.open(2);
    assert_eq!(gate.next().await.id, second.id());
    second.await.unwrap();
    assert!(
        matches!(
            s.submit_batch(vec![low(), low()]).await,
            Err(Error::Submit(SubmitError::Overloaded))
        ),
        "a batch that cannot fit even an empty queue"
    );
}

#[tokio::test(start_paused = true)]
async fn bounds_refuse_under_reject_and_across_pools() {
    let (exec, mut gate) = gated();
    let exec = Arc::new(exec);
    let s = Scheduler::<u32, u32>::builder()
        .pool(
            Pool::fixed("default", 1)
                .executor_arc(exec.clone())
                .configure(|c| {
                    c.bounds = low_bound(0);
                    c.overflow = OverflowPolicy::Reject;
                }),
        )
        .pool(Pool::fixed("other", 1).executor_arc(exec).configure(|c| {
            c.overflow = OverflowPolicy::Reject;
        }))
        .configure(|c| c.global_bounds.max_pending = Some(1))
        .build()
        .await
        .unwrap();
    assert!(matches!(
        s.submit(Task::new(1).priority(Priority::Low)).await,
        Err(Error::Submit(SubmitError::Overloaded))
    ));
    let busy = s.submit(Task::new(2)).await.unwrap();
    gate.next().await;
    let queued = s.submit(Task::new(3)).await.unwrap();
    assert!(
        matches!(
            s.submit(Task::new(4).pool("other")).await,
            Err(Error::Submit(SubmitError::Overloaded))
        ),
        "one task pending across both pools"
    );
    gate.open(2);
    busy.await.unwrap();
    queued.await.unwrap();
    let later = s.submit(Task::new(5).pool("other")).await.unwrap();
    gate.open(1);
    later.await.unwrap();
}
