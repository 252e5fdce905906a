//! Submitting: keys and late handles, full queues and overflow policies, batches,
//! `enqueue_many`, validation, priorities, events, snapshots and listings. Every test runs on
//! tokio's paused clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Seen, gated, gated_scheduler, secs, settle};
use cronoq::{
    Bounds, Error, Fairness, OverflowPolicy, Pool, PoolId, Priority, RetryPolicy, Scheduler,
    StatusEvent, SubmitError, Submitted, Task, TaskError, TaskFailure, TaskId, TaskStatus,
};

fn bounded(max: usize, overflow: OverflowPolicy) -> impl FnOnce(Pool<u32, u32>) -> Pool<u32, u32> {
    move |p| {
        p.configure(|c| {
            c.bounds = Bounds {
                max_pending: Some(max),
                ..Bounds::default()
            };
            c.overflow = overflow;
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_deduplicates_and_every_handle_shares_the_output() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let first = s.submit(Task::new(1).key("k")).await.unwrap();
    let again = s.submit(Task::new(2).key("k")).await.unwrap();
    assert_eq!((again.id(), again.is_duplicate()), (first.id(), true));
    assert!(!first.is_duplicate());
    assert_eq!(
        s.enqueue(Task::new(3).key("k")).await.unwrap(),
        Submitted {
            id: TaskId(1),
            duplicate: true
        }
    );
    assert_eq!(gate.next().await.id, TaskId(1));
    gate.open(1);
    let (a, b) = (first.await.unwrap(), again.await.unwrap());
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(*a, 1, "the duplicate's payload was ignored");
    // A late handle, by key, from the output cache.
    let late = s.handle("k").await.unwrap().unwrap().await.unwrap();
    assert!(Arc::ptr_eq(&a, &late));
    let dup_after_end = s.submit(Task::new(4).key("k")).await.unwrap();
    assert!(dup_after_end.is_duplicate());
    assert!(Arc::ptr_eq(&a, &dup_after_end.await.unwrap()));
    assert!(s.handle(TaskId(99)).await.unwrap().is_none());
    assert_eq!(s.status(TaskId(99)).await.unwrap(), None);
    assert_eq!(s.status("k").await.unwrap(), Some(TaskStatus::Succeeded));
    assert_eq!(
        s.snapshot().await.unwrap().totals.submitted,
        1,
        "duplicates use no id"
    );
}

#[tokio::test(start_paused = true)]
async fn late_handles_without_a_cached_output_and_of_failed_tasks() {
    let s = Scheduler::<u32, u32>::builder()
        .pool(
            Pool::fixed("default", 1).executor_fn(|_ctx, n: Arc<u32>| async move {
                match *n {
                    0 => Err(TaskError::permanent("zero")),
                    n => Ok(n),
                }
            }),
        )
        .output_cache(0)
        .build()
        .await
        .unwrap();
    s.submit(Task::new(5)).await.unwrap().await.unwrap();
    let late = s.handle(TaskId(1)).await.unwrap().unwrap();
    assert_eq!(
        late.await.unwrap_err(),
        TaskFailure::OutputUnavailable { id: TaskId(1) }
    );
    s.submit(Task::new(0)).await.unwrap().await.unwrap_err();
    let late = s.handle(TaskId(2)).await.unwrap().unwrap().await;
    assert_eq!(
        late.unwrap_err(),
        TaskFailure::Ended {
            status: TaskStatus::Failed,
            message: "zero".into()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn every_handle_of_a_running_task_gets_its_output() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let first = s.submit(Task::new(3)).await.unwrap();
    gate.next().await;
    let second = s.handle(TaskId(1)).await.unwrap().unwrap();
    let third = s.handle(TaskId(1)).await.unwrap().unwrap();
    gate.open(1);
    let outs = [first.await, second.await, third.await].map(|o| o.unwrap());
    assert!(outs.iter().all(|o| Arc::ptr_eq(o, &outs[0]) && **o == 3));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_handle_does_not_cancel_its_task() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    drop(s.submit(Task::new(1)).await.unwrap());
    gate.next().await;
    gate.open(1);
    let handle = s.handle(TaskId(1)).await.unwrap().unwrap();
    assert_eq!(*handle.await.unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_wait_pool_parks_submitters_in_order_until_there_is_room() {
    let (s, mut gate) = gated_scheduler(1, bounded(1, OverflowPolicy::Wait)).await;
    s.submit(Task::new(1)).await.unwrap(); // runs
    gate.next().await;
    s.submit(Task::new(2)).await.unwrap(); // pending: the queue is full
    let parked = |n: u32| {
        let s = s.clone();
        tokio::spawn(async move { s.enqueue(Task::new(n)).await })
    };
    let third = parked(3);
    settle().await;
    let fourth = parked(4);
    settle().await;
    assert!(!third.is_finished() && !fourth.is_finished());
    gate.open(1); // 1 ends, 2 starts, 3 fits
    assert_eq!(third.await.unwrap().unwrap().id, TaskId(3));
    settle().await;
    assert!(!fourth.is_finished());
    gate.open(1);
    assert_eq!(fourth.await.unwrap().unwrap().id, TaskId(4));
    gate.open(2);
    let started: Vec<TaskId> = [gate.next().await, gate.next().await, gate.next().await]
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(started, [TaskId(2), TaskId(3), TaskId(4)]);
}

#[tokio::test(start_paused = true)]
async fn a_parked_submitter_that_gives_up_is_forgotten() {
    let (s, mut gate) = gated_scheduler(1, bounded(1, OverflowPolicy::Wait)).await;
    s.submit(Task::new(1)).await.unwrap();
    gate.next().await;
    s.submit(Task::new(2)).await.unwrap();
    let gave_up = tokio::time::timeout(secs(1), s.submit(Task::new(3))).await;
    assert!(gave_up.is_err());
    gate.open(2);
    settle().await;
    let later = s.enqueue(Task::new(4)).await.unwrap();
    assert_eq!(later.id, TaskId(3), "the abandoned submission used no id");
    gate.open(1);
}

#[tokio::test(start_paused = true)]
async fn what_cannot_fit_an_empty_queue_is_refused_at_once() {
    let (s, _gate) = gated_scheduler(1, bounded(0, OverflowPolicy::Wait)).await;
    let err = s.submit(Task::new(1)).await.unwrap_err();
    assert!(
        matches!(err, Error::Submit(SubmitError::Overloaded)),
        "{err}"
    );

    let (s, mut gate) = gated_scheduler(1, bounded(1, OverflowPolicy::Wait)).await;
    let batch = vec![Task::new(1), Task::new(2)];
    let err = s.submit_batch(batch).await.unwrap_err();
    assert_eq!(err.to_string(), "overloaded");
    // A batch that fits an empty queue waits for room.
    s.submit(Task::new(1)).await.unwrap();
    gate.next().await;
    s.submit(Task::new(2)).await.unwrap();
    let waiting = {
        let s = s.clone();
        tokio::spawn(async move { s.submit_batch(vec![Task::new(3)]).await })
    };
    settle().await;
    assert!(!waiting.is_finished());
    gate.open(1);
    let handles = waiting.await.unwrap().unwrap();
    assert_eq!(handles[0].id(), TaskId(3));
}

#[tokio::test(start_paused = true)]
async fn reject_refuses_and_shedding_ends_a_queued_task() {
    let (s, mut gate) = gated_scheduler(1, bounded(1, OverflowPolicy::Reject)).await;
    s.submit(Task::new(1)).await.unwrap();
    gate.next().await;
    s.submit(Task::new(2)).await.unwrap();
    let err = s.submit(Task::new(3)).await.unwrap_err();
    assert!(matches!(err, Error::Submit(SubmitError::Overloaded)));

    let (s, mut gate) = gated_scheduler(1, bounded(1, OverflowPolicy::ShedOldest)).await;
    s.submit(Task::new(1)).await.unwrap();
    gate.next().await;
    let victim = s
        .submit(Task::new(2).priority(Priority::Low))
        .await
        .unwrap();
    let newcomer = s.submit(Task::new(3)).await.unwrap();
    assert_eq!(
        victim.await.unwrap_err(),
        TaskFailure::Ended {
            status: TaskStatus::Shed,
            message: "shed under overload".into()
        }
    );
    gate.open(2);
    assert_eq!(*newcomer.await.unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_all_or_nothing() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let handles = s
        .submit_batch(vec![Task::new(1).key("a"), Task::new(2), Task::new(3)])
        .await
        .unwrap();
    let ids: Vec<TaskId> = handles.iter().map(|h| h.id()).collect();
    assert_eq!(ids, [TaskId(1), TaskId(2), TaskId(3)]);
    let err = s
        .submit_batch(vec![Task::new(4).key("x"), Task::new(5).key("x")])
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "duplicate key 'x' in batch");
    let err = s
        .submit_batch(vec![Task::new(6), Task::new(7).pool("nope")])
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "unknown pool 'nope'");
    let mixed = s
        .submit_batch(vec![Task::new(8).key("a"), Task::new(9)])
        .await
        .unwrap();
    assert_eq!((mixed[0].id(), mixed[0].is_duplicate()), (TaskId(1), true));
    assert_eq!(mixed[1].id(), TaskId(4), "rejected batches used no id");
    assert!(s.submit_batch(Vec::new()).await.unwrap().is_empty());
    gate.open(4);
    for h in handles {
        h.await.unwrap();
    }
    gate.next().await;
}

#[tokio::test(start_paused = true)]
async fn enqueue_many_decides_each_task_on_its_own() {
    let (s, mut gate) = gated_scheduler(1, bounded(1, OverflowPolicy::Wait)).await;
    s.submit(Task::new(1)).await.unwrap();
    gate.next().await;
    let many = {
        let s = s.clone();
        tokio::spawn(async move {
            s.enqueue_many(vec![
                Task::new(2),
                Task::new(3).kind("bad\0kind"),
                Task::new(4).pool("nope"),
                Task::new(5), // waits for room
            ])
            .await
        })
    };
    settle().await;
    assert!(!many.is_finished());
    gate.open(1);
    let results = many.await.unwrap().unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0].as_ref().unwrap().id, TaskId(2));
    assert_eq!(
        results[1].as_ref().unwrap_err().to_string(),
        "invalid task: kind, pool, key and tenant must not contain NUL characters"
    );
    assert_eq!(
        results[2].as_ref().unwrap_err().to_string(),
        "unknown pool 'nope'"
    );
    assert_eq!(results[3].as_ref().unwrap().id, TaskId(3));
    assert!(s.enqueue_many(Vec::new()).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn submissions_are_checked_before_the_engine_sees_them() {
    let (s, _gate) = gated_scheduler(1, |p| p).await;
    let msg = |t: Task<u32>| {
        let s = s.clone();
        async move { s.submit(t).await.unwrap_err().to_string() }
    };
    assert_eq!(
        msg(Task::new(1).tag("a\0", "b")).await,
        "invalid task: tags must not contain NUL characters"
    );
    let nan = RetryPolicy {
        multiplier: f64::NAN,
        ..RetryPolicy::default()
    };
    assert_eq!(
        msg(Task::new(1).retry(nan)).await,
        "invalid task: retry multiplier must be finite and non-negative"
    );
    let none = RetryPolicy {
        max_attempts: 0,
        ..RetryPolicy::default()
    };
    assert_eq!(
        msg(Task::new(1).retry(none)).await,
        "invalid task: retry.max_attempts must be >= 1"
    );
    assert_eq!(
        msg(Task::new(1).pool("other")).await,
        "unknown pool 'other'"
    );

    // Without a pool named "default", a task must name its pool.
    let (exec, _g) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("only", 1).executor(exec))
        .build()
        .await
        .unwrap();
    let err = s.submit(Task::new(1)).await.unwrap_err();
    assert!(matches!(err, Error::Submit(SubmitError::UnknownPool(ref p)) if &**p == "default"));
    assert!(s.submit(Task::new(1).pool("only")).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn more_important_classes_run_first() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    s.submit(Task::new(0)).await.unwrap();
    gate.next().await;
    for (n, p) in [
        (1, Priority::Low),
        (2, Priority::Normal),
        (3, Priority::Critical),
        (4, Priority::High),
    ] {
        s.submit(Task::new(n).priority(p)).await.unwrap();
    }
    gate.open(5);
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(gate.next().await.id.0);
    }
    assert_eq!(order, [4, 5, 3, 2], "critical (id 4), high, normal, low");
}

#[tokio::test(start_paused = true)]
async fn set_capacity_changes_a_pools_workers() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    for n in 1..=3 {
        s.submit(Task::new(n)).await.unwrap();
    }
    gate.next().await;
    s.set_capacity("default", 3).await.unwrap();
    gate.next().await;
    gate.next().await;
    let snap = s.snapshot().await.unwrap();
    let pool = snap.pool("default").unwrap();
    assert_eq!((pool.capacity, pool.busy, pool.desired), (3, 3, 3));
    let err = s.set_capacity("nope", 1).await.unwrap_err();
    assert!(matches!(err, Error::Submit(SubmitError::UnknownPool(_))));
    gate.open(3);
}

#[tokio::test(start_paused = true)]
async fn events_report_ends_or_every_transition() {
    let (exec, mut gate) = gated();
    let (exec2, _gate2) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("first", 1).executor(exec2))
        .pool(Pool::fixed("default", 1).executor(exec))
        .emit_transitions(true)
        .build()
        .await
        .unwrap();
    let mut events = s.events();
    let t0 = s.clock().now();
    s.submit(Task::new(1).key("e")).await.unwrap();
    gate.next().await;
    tokio::time::advance(secs(2)).await;
    gate.open(1);
    let mut seen: Vec<StatusEvent> = Vec::new();
    while seen.last().is_none_or(|e| !e.status.is_terminal()) {
        seen.push(events.recv().await.unwrap());
    }
    let statuses: Vec<(TaskStatus, u32)> = seen.iter().map(|e| (e.status, e.attempt)).collect();
    assert_eq!(
        statuses,
        [
            (TaskStatus::Blocked, 0),
            (TaskStatus::Ready, 0),
            (TaskStatus::Running, 1),
            (TaskStatus::Succeeded, 1)
        ]
    );
    let last = seen.last().unwrap();
    assert_eq!(
        (last.id, last.pool, last.key.as_deref()),
        (TaskId(1), PoolId(1), Some("e"))
    );
    assert_eq!(&*s.pools()[last.pool.0 as usize], "default");
    assert!(
        last.at >= t0 + secs(2) && last.at < t0 + secs(3),
        "{:?} {t0:?}",
        last.at
    );
    assert!(seen[0].at >= t0 && seen[0].at < t0 + Duration::from_millis(5));
}

#[tokio::test(start_paused = true)]
async fn a_receiver_that_falls_behind_is_told_once_and_goes_on() {
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 4).executor_fn(|_ctx, n: Arc<u32>| async move { Ok(*n) }))
        .events_capacity(3)
        .build()
        .await
        .unwrap();
    let mut events = s.events();
    let handles = s
        .submit_batch((0..6).map(Task::new).collect())
        .await
        .unwrap();
    for h in handles {
        h.await.unwrap();
    }
    settle().await;
    let lagged = events.recv().await.unwrap_err();
    assert_eq!(
        lagged,
        tokio::sync::broadcast::error::RecvError::Lagged(2),
        "capacity 3 acts as 4"
    );
    let rest: Vec<TaskId> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|e| e.id)
        .collect();
    assert_eq!(rest, [TaskId(3), TaskId(4), TaskId(5), TaskId(6)]);
}

#[tokio::test(start_paused = true)]
async fn snapshots_and_listings_show_the_live_tasks() {
    let (exec, mut gate) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 1).executor(exec))
        .pool(
            Pool::fixed("fair", 0)
                .executor_fn(|_ctx, n: Arc<u32>| async move { Ok(*n) })
                .configure(|c| c.fairness = Some(Fairness::weights([("gold", 2.0)]))),
        )
        .build()
        .await
        .unwrap();
    s.submit(Task::new(1).tenant("acme")).await.unwrap();
    gate.next().await;
    s.submit(Task::new(2).priority(Priority::High).key("two"))
        .await
        .unwrap();
    s.submit(Task::new(3).pool("fair").tenant("gold").kind("k"))
        .await
        .unwrap();
    let all = s.list_tasks(&[], &[], None, 10).await.unwrap();
    let ids: Vec<u64> = all.iter().map(|t| t.id.0).collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(
        (all[0].status, all[0].attempt, all[0].tenant.clone()),
        (TaskStatus::Running, 1, None)
    );
    assert_eq!(
        (all[1].priority, all[1].key.as_deref()),
        (Priority::High, Some("two"))
    );
    assert_eq!(
        (&*all[2].pool, &*all[2].kind, all[2].tenant.as_deref()),
        ("fair", "k", Some("gold"))
    );
    let ready = s
        .list_tasks(&["default"], &[TaskStatus::Ready], None, 10)
        .await
        .unwrap();
    assert_eq!(ready.iter().map(|t| t.id.0).collect::<Vec<_>>(), [2]);
    assert_eq!(
        s.list_tasks(&[], &[], Some(TaskId(1)), 1).await.unwrap()[0].id,
        TaskId(2)
    );
    assert!(
        s.list_tasks(&["nope"], &[], None, 10)
            .await
            .unwrap()
            .is_empty()
    );

    let snap = s.snapshot().await.unwrap();
    assert_eq!((snap.live_tasks, snap.running, snap.pending), (3, 1, 2));
    let p = snap.pool("default").unwrap();
    assert_eq!((p.capacity, p.busy, p.pending(), p.ready), (1, 1, 1, 1));
    assert_eq!(p.pending_by_class, [0, 1, 0, 0]);
    assert_eq!(snap.pools[1].pending_by_class[Priority::Normal.index()], 1);
    assert_eq!(snap.totals.submitted, 3);
    assert!(snap.pool("nope").is_none());
    gate.open(2);
}

#[tokio::test(start_paused = true)]
async fn the_gated_executor_reports_what_it_saw() {
    // The helper the other tests rely on: starts are logged before the attempt waits.
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let h = s.submit(Task::new(9)).await.unwrap();
    gate.next().await;
    assert_eq!(gate.log(), [Seen::Started(9)]);
    gate.open(1);
    assert_eq!(*h.await.unwrap(), 9);
}

#[tokio::test(start_paused = true)]
async fn an_autoscaled_pool_grows_with_its_backlog() {
    let (exec, mut gate) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::new("default").executor(exec))
        .build()
        .await
        .unwrap();
    for n in 0..40 {
        s.enqueue(Task::new(n)).await.unwrap();
    }
    gate.next().await;
    tokio::time::sleep(secs(3)).await;
    let pool = s.snapshot().await.unwrap().pools.remove(0);
    assert!(pool.capacity > 1 && pool.capacity <= 10, "{pool:?}");
    assert_eq!(pool.busy, pool.capacity);
    let mut started = 1;
    while gate.started.try_recv().is_ok() {
        started += 1;
    }
    assert_eq!(started, pool.capacity);
    gate.open(40);
}

#[tokio::test(start_paused = true)]
async fn callers_beyond_a_full_queue_wait_for_room_and_are_all_answered() {
    let (exec, gate) = gated();
    let s = Scheduler::builder()
        .pool(Pool::fixed("default", 1).executor(exec))
        .queue_capacity(1)
        .build()
        .await
        .unwrap();
    // Sent at once, most find the one-command queue full and wait for room (`send`).
    let calls = (0..20).map(|n| {
        let s = s.clone();
        tokio::spawn(async move { s.enqueue(Task::new(n)).await })
    });
    let mut ids = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        ids.push(call.await.unwrap().unwrap().id);
    }
    ids.sort();
    assert_eq!(ids, (1..=20).map(TaskId).collect::<Vec<_>>());
    gate.open(20);
}
