//! A scheduler's life: building (and what it refuses), shutting down with a grace period,
//! being dropped, and the blocking front for programs without tokio.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Seen, gated, gated_scheduler, secs, settle};
use cronoq::{
    AutoscaleConfig, Error, MemoryStore, Pool, Scheduler, Store, Task, TaskError, TaskFailure,
    TaskId, TaskStatus,
};
use tokio::sync::broadcast::error::RecvError;

fn echo(name: &str) -> Pool<u32, u32> {
    Pool::fixed(name, 1).executor_fn(|_ctx, n: Arc<u32>| async move { Ok(*n) })
}

async fn config_error(b: cronoq::Builder<u32, u32>) -> String {
    match b.build().await {
        Err(Error::Config(m)) => m,
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("built"),
    }
}

#[tokio::test]
async fn build_refuses_what_cannot_work_in_order() {
    let b = Scheduler::<u32, u32>::builder;
    assert_eq!(config_error(b()).await, "at least one pool is required");
    let no_exec = Pool::<u32, u32>::fixed("bare", 1);
    assert_eq!(
        config_error(b().pool(echo("default")).pool(no_exec)).await,
        "pool 'bare' has no executor"
    );
    let inverted = echo("w").workers(3, 1, 2);
    assert_eq!(
        config_error(b().pool(inverted)).await,
        "pool 'w': min_workers > max_workers"
    );
    assert_eq!(
        config_error(b().pool(echo("a\0b"))).await,
        "pool names must not contain NUL"
    );
    assert_eq!(
        config_error(b().pool(echo("d")).pool(echo("d"))).await,
        "duplicate pool 'd'"
    );
    let bad_interval = echo("a").autoscale(AutoscaleConfig {
        interval: Duration::ZERO,
        ..AutoscaleConfig::default()
    });
    assert_eq!(
        config_error(b().pool(bad_interval)).await,
        "pool 'a': interval must be > 0"
    );
    let err = b().build().await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "configuration error: at least one pool is required"
    );
}

#[tokio::test]
async fn the_memory_store_keeps_nothing() {
    let s = Scheduler::<u32, u32>::builder()
        .pool(echo("default"))
        .store(MemoryStore)
        .build()
        .await
        .unwrap();
    assert_eq!(*s.submit(Task::new(3)).await.unwrap().await.unwrap(), 3);
    assert!(!Store::<u32, u32>::persists(&MemoryStore));
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_running_attempts_finish_within_the_grace() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let running = s.submit(Task::new(1)).await.unwrap();
    let queued = s.submit(Task::new(2)).await.unwrap();
    gate.next().await;
    let stopping = {
        let s = s.clone();
        tokio::spawn(async move { s.shutdown(secs(60)).await })
    };
    settle().await;
    assert!(!stopping.is_finished());
    let err = s.submit(Task::new(3)).await.unwrap_err();
    assert!(matches!(err, Error::Shutdown));
    assert_eq!(s.status(TaskId(2)).await.unwrap(), Some(TaskStatus::Ready));
    gate.open(1);
    stopping.await.unwrap().unwrap();
    assert_eq!(*running.await.unwrap(), 1);
    assert_eq!(
        queued.await.unwrap_err(),
        TaskFailure::Shutdown,
        "never started"
    );
    assert_eq!(gate.log(), [Seen::Started(1)]);
    assert!(s.shutdown(secs(1)).await.is_ok(), "again: the same result");
    assert!(matches!(s.status(TaskId(1)).await, Err(Error::Shutdown)));
    s.stopped().await;
}

#[tokio::test(start_paused = true)]
async fn after_the_grace_running_attempts_are_cut_off_without_the_abort_hook() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let mut events = s.events();
    let running = s.submit(Task::new(1)).await.unwrap();
    let ctx = gate.next().await;
    let started = tokio::time::Instant::now();
    let clone = s.clone();
    assert!(s.shutdown(secs(2)).await.is_ok());
    assert!(tokio::time::Instant::now() - started >= secs(2));
    assert!(
        clone.shutdown(secs(9)).await.is_ok(),
        "every clone gets the result"
    );
    ctx.cancelled().await;
    settle().await;
    assert_eq!(gate.log(), [Seen::Started(1), Seen::Dropped(1)]);
    assert_eq!(running.await.unwrap_err(), TaskFailure::Shutdown);
    drop((s, clone));
    assert_eq!(
        events.recv().await.unwrap_err(),
        RecvError::Closed,
        "no event for it"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_fails_parked_submitters() {
    let (s, mut gate) =
        gated_scheduler(1, |p| p.configure(|c| c.bounds.max_pending = Some(1))).await;
    s.submit(Task::new(1)).await.unwrap();
    gate.next().await;
    s.submit(Task::new(2)).await.unwrap();
    let parked = {
        let s = s.clone();
        tokio::spawn(async move { s.submit(Task::new(3)).await })
    };
    settle().await;
    let stopping = {
        let s = s.clone();
        tokio::spawn(async move { s.shutdown(secs(5)).await })
    };
    assert!(matches!(parked.await.unwrap(), Err(Error::Shutdown)));
    stopping.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_scheduler_stops_it_after_the_drop_grace() {
    let (exec, mut gate) = gated();
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 2).executor(exec))
        .drop_grace(secs(3))
        .build()
        .await
        .unwrap();
    let finishes = s.submit(Task::new(1)).await.unwrap();
    let cut_off = s.submit(Task::new(2)).await.unwrap();
    let first = gate.next().await;
    let second = gate.next().await;
    let mut events = s.events();
    drop(s);
    settle().await;
    assert!(!first.is_cancelled());
    gate.open(1); // one attempt ends within the grace
    assert!(finishes.await.is_ok());
    let at = tokio::time::Instant::now();
    second.cancelled().await;
    assert!(tokio::time::Instant::now() - at < secs(3));
    assert_eq!(cut_off.await.unwrap_err(), TaskFailure::Shutdown);
    let ended = events.recv().await.unwrap();
    assert_eq!((ended.id, ended.status), (TaskId(1), TaskStatus::Succeeded));
    assert_eq!(events.recv().await.unwrap_err(), RecvError::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_abort_hook_is_contained() {
    struct Stubborn;
    impl cronoq::Executor<u32, u32> for Stubborn {
        fn execute(
            &self,
            _ctx: cronoq::TaskContext,
            _n: Arc<u32>,
        ) -> cronoq::BoxFuture<Result<u32, TaskError>> {
            Box::pin(std::future::pending())
        }

        fn abort(&self, _lease: cronoq::LeaseId) {
            panic!("abort hook failed");
        }
    }
    let s = Scheduler::<u32, u32>::builder()
        .pool(Pool::fixed("default", 1).executor(Stubborn))
        .build()
        .await
        .unwrap();
    let h = s
        .submit(Task::new(1).timeout(secs(1)).no_retry())
        .await
        .unwrap();
    assert_eq!(
        h.await.unwrap_err().status(),
        Some(TaskStatus::DeadLettered)
    );
    assert!(s.snapshot().await.is_ok());
}

#[test]
fn the_blocking_scheduler_works_without_a_runtime() {
    let s = Scheduler::<u32, u32>::builder()
        .pool(
            Pool::fixed("default", 2).executor_fn(|_ctx, n: Arc<u32>| async move {
                if *n == 0 {
                    std::future::pending::<()>().await;
                }
                Ok(*n * 2)
            }),
        )
        .build_blocking()
        .unwrap();
    let h = s.submit(Task::new(21)).unwrap();
    assert_eq!(h.id(), TaskId(1));
    assert_eq!(*h.wait().unwrap(), 42);
    let mut stuck = s.submit(Task::new(0)).unwrap();
    assert!(stuck.wait_timeout(Duration::from_millis(20)).is_none());
    stuck.cancel();
    let ended = stuck.wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(ended.unwrap_err().status(), Some(TaskStatus::Cancelled));
    let many = s.enqueue_many(vec![Task::new(1), Task::new(2)]).unwrap();
    assert_eq!(many.len(), 2);
    let batch = s.submit_batch(vec![Task::new(5)]).unwrap();
    assert_eq!(*batch.into_iter().next().unwrap().wait().unwrap(), 10);
    let late = s.task_handle(TaskId(1)).unwrap().unwrap();
    assert_eq!(*late.wait().unwrap(), 42);
    assert_eq!(s.status(TaskId(2)).unwrap(), Some(TaskStatus::Cancelled));
    assert!(!s.cancel(TaskId(2)).unwrap());
    assert!(s.enqueue(Task::new(3)).unwrap().id.0 > 0);
    s.set_capacity("default", 3).unwrap();
    assert_eq!(s.snapshot().unwrap().pools[0].capacity, 3);
    let mut events = s.events();
    s.submit(Task::new(4)).unwrap().wait().unwrap();
    assert_eq!(
        events.blocking_recv().unwrap().status,
        TaskStatus::Succeeded
    );
    assert_eq!(s.scheduler().pools().len(), 1);
    s.shutdown(secs(1)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_scheduler_also_works_inside_a_runtime() {
    let s = Scheduler::<u32, u32>::builder()
        .pool(echo("default"))
        .build_blocking()
        .unwrap();
    let h = s.submit(Task::new(8)).unwrap();
    assert_eq!(*h.wait().unwrap(), 8);
    // The scheduler itself is usable from async code too.
    let more = s.scheduler().submit(Task::new(9)).await.unwrap();
    assert_eq!(*more.await.unwrap(), 9);
    drop(s); // stops it in the background
}
