//! What happens to attempts: outcomes, retries with backoff, timeouts, cancellation, panics,
//! heartbeats and lease expiry. Every test runs on tokio's paused clock.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{S, Seen, gated_scheduler, secs, settle};
use cronoq::{
    BoxFuture, Executor, LeaseId, Pool, RetryPolicy, Scheduler, Task, TaskContext, TaskError,
    TaskFailure, TaskId, TaskStatus,
};
use tokio::time::Instant;

fn no_jitter(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        jitter: false,
        ..RetryPolicy::default()
    }
}

/// A pool whose executor fails with `error(attempt)` (or succeeds on `None`), recording when
/// each attempt started.
async fn failing(
    policy: RetryPolicy,
    error: fn(u32) -> Option<TaskError>,
) -> (S, Arc<Mutex<Vec<Instant>>>) {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    let pool = Pool::fixed("default", 1)
        .executor_fn(move |ctx: TaskContext, n: Arc<u32>| {
            seen.lock().unwrap().push(Instant::now());
            let result = error(ctx.attempt).map_or(Ok(*n), Err);
            async move { result }
        })
        .configure(|c| c.retry = policy);
    (
        Scheduler::builder().pool(pool).build().await.unwrap(),
        starts,
    )
}

fn gaps(starts: &Mutex<Vec<Instant>>) -> Vec<Duration> {
    let starts = starts.lock().unwrap();
    starts.windows(2).map(|w| w[1] - w[0]).collect()
}

/// `d` up to the driver's rounding to tokio's millisecond timer ticks.
fn about(actual: Duration, d: Duration) -> bool {
    actual >= d && actual < d + Duration::from_millis(5)
}

#[tokio::test(start_paused = true)]
async fn retryable_failures_back_off_exponentially_then_dead_letter() {
    let (s, starts) = failing(no_jitter(3), |n| {
        Some(TaskError::retryable(format!("try {n}")))
    })
    .await;
    let mut events = s.events();
    let out = s.submit(Task::new(1)).await.unwrap().await;
    assert_eq!(
        out.unwrap_err(),
        TaskFailure::Ended {
            status: TaskStatus::DeadLettered,
            message: "try 3".into()
        }
    );
    let gaps = gaps(&starts);
    assert_eq!(gaps.len(), 2);
    assert!(
        about(gaps[0], secs(1)) && about(gaps[1], secs(2)),
        "{gaps:?}"
    );
    let ev = events.recv().await.unwrap();
    assert_eq!((ev.status, ev.attempt), (TaskStatus::DeadLettered, 3));
    assert_eq!(ev.message.as_deref(), Some("try 3"));
    let snap = s.snapshot().await.unwrap();
    assert_eq!((snap.totals.retries, snap.totals.dead_lettered), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_retry_succeeds_and_a_multiplier_below_one_shrinks_the_waits() {
    let policy = RetryPolicy {
        multiplier: 0.5,
        ..no_jitter(4)
    };
    let (s, starts) = failing(policy, |n| (n < 4).then(|| TaskError::from_err("flaky"))).await;
    assert_eq!(*s.submit(Task::new(7)).await.unwrap().await.unwrap(), 7);
    let gaps = gaps(&starts);
    let want = [
        secs(1),
        Duration::from_millis(500),
        Duration::from_millis(250),
    ];
    assert!(gaps.iter().zip(want).all(|(&g, w)| about(g, w)), "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn retry_after_holds_the_next_attempt_back() {
    let (s, starts) = failing(no_jitter(2), |n| {
        (n == 1).then(|| TaskError::retry_after("rate limited", secs(30)))
    })
    .await;
    s.submit(Task::new(1)).await.unwrap().await.unwrap();
    assert!(about(gaps(&starts)[0], secs(30)));
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_fails_at_once_and_a_task_policy_overrides_the_pools() {
    let (s, starts) = failing(no_jitter(5), |_| Some(TaskError::permanent("bad input"))).await;
    let out = s.submit(Task::new(1)).await.unwrap().await.unwrap_err();
    assert_eq!(out.to_string(), "task ended as failed: bad input");
    assert_eq!(starts.lock().unwrap().len(), 1);

    let (s, starts) = failing(no_jitter(5), |_| Some(TaskError::retryable("no"))).await;
    let out = s.submit(Task::new(1).no_retry()).await.unwrap().await;
    assert_eq!(out.unwrap_err().status(), Some(TaskStatus::DeadLettered));
    assert_eq!(starts.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_aborts_the_attempt_then_retries_it() {
    let (s, mut gate) = gated_scheduler(1, |p| p.configure(|c| c.retry = no_jitter(2))).await;
    let started = Instant::now();
    let handle = s.submit(Task::new(5).timeout(secs(2))).await.unwrap();
    let first = gate.next().await;
    let watcher = first.clone();
    let second = gate.next().await;
    assert!(
        about(Instant::now() - started, secs(3)),
        "2 s timeout + 1 s backoff"
    );
    assert!(watcher.is_cancelled());
    watcher.cancelled().await;
    assert_eq!(
        gate.log(),
        [
            Seen::Started(5),
            Seen::Aborted(first.lease),
            Seen::Dropped(5),
            Seen::Started(5)
        ],
        "the abort hook runs before the future is dropped"
    );
    assert_eq!((second.attempt, second.lease), (2, LeaseId(2)));
    let out = handle.await.unwrap_err();
    assert_eq!(
        out,
        TaskFailure::Ended {
            status: TaskStatus::DeadLettered,
            message: "attempt timed out".into()
        }
    );
    assert_eq!(s.snapshot().await.unwrap().totals.timeouts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_zero_timeout_times_out_at_once() {
    let (s, _gate) = gated_scheduler(1, |p| p).await;
    let out = s
        .submit(Task::new(1).timeout(Duration::ZERO).no_retry())
        .await;
    assert_eq!(
        out.unwrap().await.unwrap_err().to_string(),
        "task ended as dead_lettered: attempt timed out"
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_running_task_aborts_it_and_ends_it_cancelled() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let handle = s.submit(Task::new(1)).await.unwrap();
    let queued = s.submit(Task::new(2)).await.unwrap();
    let ctx = gate.next().await;
    // Work spawned with a clone of the context sees the cancellation.
    let spawned = tokio::spawn(async move { ctx.cancelled().await });
    assert!(s.cancel(TaskId(1)).await.unwrap());
    spawned.await.unwrap();
    settle().await;
    assert_eq!(
        gate.log()[..3],
        [
            Seen::Started(1),
            Seen::Aborted(LeaseId(1)),
            Seen::Dropped(1)
        ]
    );
    assert_eq!(
        s.status(TaskId(1)).await.unwrap(),
        Some(TaskStatus::Cancelled)
    );
    assert_eq!(
        handle.await.unwrap_err(),
        TaskFailure::Ended {
            status: TaskStatus::Cancelled,
            message: "cancelled".into()
        }
    );
    assert!(!s.cancel(TaskId(1)).await.unwrap(), "already ended");
    assert!(!s.cancel("no such key").await.unwrap());
    // The slot went to the queued task.
    assert_eq!(gate.next().await.id, TaskId(2));
    gate.open(1);
    assert_eq!(*queued.await.unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_handles_cancel_takes_effect_before_the_next_call() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let _running = s.submit(Task::new(1)).await.unwrap();
    let queued = s.submit(Task::new(2).key("second")).await.unwrap();
    gate.next().await;
    queued.cancel();
    assert_eq!(
        s.status("second").await.unwrap(),
        Some(TaskStatus::Cancelled)
    );
    assert_eq!(
        queued.await.unwrap_err().status(),
        Some(TaskStatus::Cancelled)
    );
    assert!(!gate.log().iter().any(|s| matches!(s, Seen::Aborted(_))));
}

#[tokio::test(start_paused = true)]
async fn an_executor_that_returns_cancelled_ends_its_task_cancelled_without_retry() {
    let (s, starts) = failing(no_jitter(3), |_| Some(TaskError::Cancelled)).await;
    let mut events = s.events();
    let out = s.submit(Task::new(1)).await.unwrap().await.unwrap_err();
    assert_eq!(out.to_string(), "task ended as cancelled: cancelled");
    let ev = events.recv().await.unwrap();
    assert_eq!((ev.status, ev.message), (TaskStatus::Cancelled, None));
    assert_eq!(starts.lock().unwrap().len(), 1);
}

/// Panics in `execute` for payload 1, in its future for payload 2; doubles anything else.
struct Fragile;

impl Executor<u32, u32> for Fragile {
    fn execute(&self, _ctx: TaskContext, n: Arc<u32>) -> BoxFuture<Result<u32, TaskError>> {
        assert_ne!(*n, 1, "refused synchronously");
        Box::pin(async move {
            tokio::task::yield_now().await;
            if *n == 2 {
                panic!("boom in the future");
            }
            Ok(*n * 2)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn panics_fail_their_task_permanently_and_the_scheduler_goes_on() {
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 2).executor(Fragile))
        .build()
        .await
        .unwrap();
    let a = s.submit(Task::new(1)).await.unwrap();
    let b = s.submit(Task::new(2)).await.unwrap();
    let c = s.submit(Task::new(3)).await.unwrap();
    let message = |f: TaskFailure| match f {
        TaskFailure::Ended {
            status: TaskStatus::Failed,
            message,
        } => message.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(
        message(a.await.unwrap_err())
            .starts_with("panic: assertion `left != right` failed: refused synchronously")
    );
    assert_eq!(message(b.await.unwrap_err()), "panic: boom in the future");
    assert_eq!(*c.await.unwrap(), 6);
    assert_eq!(*s.submit(Task::new(4)).await.unwrap().await.unwrap(), 8);
    assert_eq!(s.snapshot().await.unwrap().totals.failed, 2);
}

/// Heartbeats for `beats` half-seconds, then returns; never heartbeats when `beats` is 0 and
/// sleeps instead.
fn heartbeating(ctx: TaskContext, beats: Arc<u32>) -> BoxFuture<Result<u32, TaskError>> {
    Box::pin(async move {
        if *beats == 0 {
            tokio::time::sleep(secs(3600)).await;
        }
        for _ in 0..*beats {
            tokio::time::sleep(Duration::from_millis(500)).await;
            ctx.heartbeat();
        }
        Ok(ctx.attempt)
    })
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_a_lease_and_a_silent_attempt_loses_it() {
    let s = Scheduler::<u32, u32>::builder()
        .pool(
            Pool::fixed("default", 2)
                .executor_fn(heartbeating)
                .configure(|c| {
                    c.lease_ttl = Some(secs(1));
                    c.retry = no_jitter(2);
                }),
        )
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    let beating = s.submit(Task::new(10)).await.unwrap();
    let silent = s.submit(Task::new(0)).await.unwrap();
    assert_eq!(
        *beating.await.unwrap(),
        1,
        "5 s past a 1 s TTL on its first attempt"
    );
    assert!(Instant::now() - started >= secs(5));
    assert_eq!(
        silent.await.unwrap_err(),
        TaskFailure::Ended {
            status: TaskStatus::DeadLettered,
            message: "lease expired".into()
        }
    );
    assert_eq!(s.snapshot().await.unwrap().totals.lease_expiries, 2);
}

#[tokio::test(start_paused = true)]
async fn lease_expiry_calls_the_abort_hook_and_cancels_the_token() {
    let (s, mut gate) = gated_scheduler(1, |p| {
        p.configure(|c| {
            c.lease_ttl = Some(secs(2));
            c.retry = RetryPolicy::none();
        })
    })
    .await;
    let handle = s.submit(Task::new(3)).await.unwrap();
    let ctx = gate.next().await;
    ctx.cancelled().await;
    assert_eq!(
        gate.log(),
        [Seen::Started(3), Seen::Aborted(ctx.lease), Seen::Dropped(3)]
    );
    assert_eq!(
        handle.await.unwrap_err().status(),
        Some(TaskStatus::DeadLettered)
    );
}

#[tokio::test(start_paused = true)]
async fn the_context_describes_the_attempt() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let t0 = s.clock().now();
    s.submit(
        Task::new(1)
            .kind("render")
            .key("report-1")
            .deadline_in(secs(60))
            .timeout(secs(30))
            .tag("traceparent", "00-abc-def-01")
            .tag("env", "prod")
            .tag("env", "eu"),
    )
    .await
    .unwrap();
    let ctx = gate.next().await;
    assert_eq!((ctx.id, ctx.lease, ctx.attempt), (TaskId(1), LeaseId(1), 1));
    assert_eq!((&*ctx.pool, &*ctx.kind), ("default", "render"));
    assert_eq!(ctx.key.as_deref(), Some("report-1"));
    assert_eq!(ctx.deadline, Some(cronoq::Clock::to_system(t0 + secs(60))));
    assert_eq!(ctx.timeout, Some(secs(30)));
    assert_eq!(ctx.tag("env"), Some("prod"));
    assert_eq!(ctx.tags.len(), 3);
    assert_eq!(ctx.traceparent(), Some("00-abc-def-01"));
    assert!(!ctx.is_cancelled());
    settle().await;
}

#[tokio::test(start_paused = true)]
async fn the_one_timer_moves_earlier_and_later_with_the_next_timeout() {
    let (s, mut gate) = gated_scheduler(2, |p| p).await;
    let started = Instant::now();
    let slow = s
        .submit(Task::new(1).timeout(secs(10)).no_retry())
        .await
        .unwrap();
    gate.next().await;
    let fast = s
        .submit(Task::new(2).timeout(secs(2)).no_retry())
        .await
        .unwrap();
    gate.next().await;
    // A timer left at the first wake-up would end `fast` at 10 s; one not set again after it
    // fired would never end `slow` (the 60 s guard would).
    let within = |h| tokio::time::timeout(secs(60), h);
    assert!(within(fast).await.unwrap().is_err());
    assert!(about(Instant::now() - started, secs(2)), "moved earlier");
    assert!(within(slow).await.unwrap().is_err());
    assert!(about(Instant::now() - started, secs(10)), "then later");
}
