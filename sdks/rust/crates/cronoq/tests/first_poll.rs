//! Where an attempt's future is polled: on a current-thread runtime its first poll happens on
//! the driver, and one ready at once is never spawned; one still pending is spawned and woken as
//! usual. On a multi-thread runtime every attempt is a task of its own. Current-thread tests
//! run on tokio's paused clock; multi-thread ones cannot, and wait on conditions.

mod common;

use std::sync::{Arc, Mutex};

use common::{S, Seen, gated_scheduler, secs, settle};
use cronoq::{FnExecutor, Pool, Scheduler, Task, TaskError, TaskFailure, TaskId, TaskStatus};
use tokio::sync::{mpsc, oneshot};
use tokio::task::Id;

/// Per attempt: its payload, the tokio task of its first poll and that of its end.
type Polls = Arc<Mutex<Vec<(u32, Id, Id)>>>;

/// A scheduler of `workers` whose attempts record where they are polled: an odd payload ends
/// at once; an even one waits for a value from the test, whose sender it hands over on `wait`
/// during its first poll; payload 0 panics at once.
async fn recording(workers: u32) -> (S, Polls, mpsc::UnboundedReceiver<oneshot::Sender<u32>>) {
    let polls: Polls = Arc::default();
    let (wait_tx, wait) = mpsc::unbounded_channel();
    let seen = polls.clone();
    let exec = FnExecutor::new(move |_ctx, n: Arc<u32>| {
        let (seen, wait_tx) = (seen.clone(), wait_tx.clone());
        async move {
            let first = tokio::task::id();
            if *n == 0 {
                panic!("boom at once");
            }
            let mut out = *n;
            if n.is_multiple_of(2) {
                let (tx, rx) = oneshot::channel();
                wait_tx.send(tx).unwrap();
                out += rx.await.unwrap();
            }
            seen.lock().unwrap().push((*n, first, tokio::task::id()));
            Ok::<u32, TaskError>(out)
        }
    });
    let s = Scheduler::builder()
        .pool(Pool::fixed("default", workers).executor(exec))
        .build()
        .await
        .unwrap();
    (s, polls, wait)
}

fn polls_of(polls: &Polls, n: u32) -> (Id, Id) {
    let polls = polls.lock().unwrap();
    let &(_, first, end) = polls.iter().find(|p| p.0 == n).expect("it ran");
    (first, end)
}

#[tokio::test(start_paused = true)]
async fn on_a_current_thread_runtime_attempts_ready_at_once_run_on_the_driver() {
    let (s, polls, mut wait) = recording(2).await;
    assert_eq!(*s.submit(Task::new(1)).await.unwrap().await.unwrap(), 1);
    assert_eq!(*s.submit(Task::new(3)).await.unwrap().await.unwrap(), 3);
    let (one, one_end) = polls_of(&polls, 1);
    assert_eq!(one, one_end, "never spawned: it ended in its first poll");
    assert_eq!(polls_of(&polls, 3), (one, one), "both on the driver's task");
    // One that must wait: polled first on the driver, then spawned; the waker it registered
    // there is replaced when tokio polls its new task, and the value sent later wakes it.
    let handle = s.submit(Task::new(2)).await.unwrap();
    let tx = wait.recv().await.unwrap();
    settle().await; // its task has been polled and waits
    tx.send(40).unwrap();
    let out = tokio::time::timeout(secs(60), handle).await.expect("woken");
    assert_eq!(*out.unwrap(), 42);
    let (first, end) = polls_of(&polls, 2);
    assert_eq!(first, one, "first polled on the driver");
    assert_ne!(end, one, "ended on a task of its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_multi_thread_runtime_every_attempt_is_a_task_of_its_own() {
    let (s, polls, mut wait) = recording(2).await;
    assert_eq!(*s.submit(Task::new(1)).await.unwrap().await.unwrap(), 1);
    assert_eq!(*s.submit(Task::new(3)).await.unwrap().await.unwrap(), 3);
    let handle = s.submit(Task::new(2)).await.unwrap();
    wait.recv().await.unwrap().send(40).unwrap();
    assert_eq!(*handle.await.unwrap(), 42);
    let (one, three, two) = (
        polls_of(&polls, 1),
        polls_of(&polls, 3),
        polls_of(&polls, 2),
    );
    for (first, end) in [one, three, two] {
        assert_eq!(first, end, "each polled on its own task only");
    }
    assert!(one.0 != three.0 && one.0 != two.0 && three.0 != two.0);
}

/// A panic in the first poll (on the driver, on a current-thread runtime) fails the task
/// permanently with its text, and the scheduler goes on.
async fn panic_at_once_fails_the_task() {
    let (s, _polls, _wait) = recording(1).await;
    let out = s.submit(Task::new(0)).await.unwrap().await.unwrap_err();
    assert_eq!(
        out,
        TaskFailure::Ended {
            status: TaskStatus::Failed,
            message: "panic: boom at once".into()
        }
    );
    assert_eq!(*s.submit(Task::new(5)).await.unwrap().await.unwrap(), 5);
    assert_eq!(s.snapshot().await.unwrap().totals.failed, 1);
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_first_poll_fails_the_task_current_thread() {
    panic_at_once_fails_the_task().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_first_poll_fails_the_task_multi_thread() {
    panic_at_once_fails_the_task().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_thread_gated_attempts_run_and_cancellation_drops_the_future() {
    let (s, mut gate) = gated_scheduler(1, |p| p).await;
    let handle = s.submit(Task::new(1)).await.unwrap();
    let queued = s.submit(Task::new(2)).await.unwrap();
    let ctx = gate.next().await;
    assert!(s.cancel(TaskId(1)).await.unwrap());
    ctx.cancelled().await;
    assert_eq!(
        handle.await.unwrap_err(),
        TaskFailure::Ended {
            status: TaskStatus::Cancelled,
            message: "cancelled".into()
        }
    );
    gate.next().await; // the queued one started
    gate.open(1);
    assert_eq!(*queued.await.unwrap(), 2);
    // The aborted task drops its future on some worker: wait for it.
    while !gate.log().contains(&Seen::Dropped(1)) {
        tokio::task::yield_now().await;
    }
    let log = gate.log();
    assert_eq!(log[..2], [Seen::Started(1), Seen::Aborted(ctx.lease)]);
    assert!(log.contains(&Seen::Started(2)));
}
