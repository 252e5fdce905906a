//! [`TaskHandle`]: a submitted task's result, as a future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::driver::FromTasks;
use crate::error::TaskFailure;
use crate::types::{TaskId, TaskRef};

/// What a task ended with: its output, or why there is none.
pub(crate) type Outcome<O> = Result<Arc<O>, TaskFailure>;

/// A submitted task: await it for its output.
///
/// It resolves once, to the output (shared with every other handle of the task) or to a
/// [`TaskFailure`]. It is `Unpin`, so `&mut handle` can be awaited under a timeout and awaited
/// again later while it has not resolved; [`Scheduler::handle`](crate::Scheduler::handle) gives
/// more handles of one task. Dropping a handle does not cancel the task, and handles do not keep
/// the scheduler running: if it stops first, they resolve to [`TaskFailure::Shutdown`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), cronoq::Error> {
/// use std::time::Duration;
/// use cronoq::{Pool, Scheduler, TaskError};
///
/// let s = Scheduler::<u32, u32>::builder()
///     .pool(Pool::fixed("default", 1).executor_fn(|_ctx, n| async move { Ok::<_, TaskError>(*n + 1) }))
///     .build()
///     .await?;
/// let mut handle = s.submit(cronoq::Task::new(41)).await?;
/// let out = match tokio::time::timeout(Duration::from_secs(5), &mut handle).await {
///     Ok(result) => result,
///     Err(_elapsed) => handle.await, // not yet: wait on
/// };
/// assert_eq!(*out.unwrap(), 42);
/// s.shutdown(Duration::from_secs(1)).await
/// # }
/// ```
pub struct TaskHandle<O> {
    id: TaskId,
    duplicate: bool,
    state: State<O>,
    control: UnboundedSender<FromTasks<O>>,
}

enum State<O> {
    Waiting(oneshot::Receiver<Outcome<O>>),
    Known(Outcome<O>),
    Resolved,
}

impl<O> TaskHandle<O> {
    /// A handle that resolves when the driver sends the outcome (or drops the sender: the
    /// scheduler stopped).
    pub(crate) fn waiting(
        id: TaskId,
        duplicate: bool,
        rx: oneshot::Receiver<Outcome<O>>,
        control: UnboundedSender<FromTasks<O>>,
    ) -> Self {
        TaskHandle {
            id,
            duplicate,
            state: State::Waiting(rx),
            control,
        }
    }

    /// A handle of a task that has ended already.
    pub(crate) fn known(
        id: TaskId,
        duplicate: bool,
        outcome: Outcome<O>,
        control: UnboundedSender<FromTasks<O>>,
    ) -> Self {
        TaskHandle {
            id,
            duplicate,
            state: State::Known(outcome),
            control,
        }
    }

    /// The task's id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Whether the submission's key named an existing task: this handle is that task's, and
    /// the submitted payload was ignored.
    pub fn is_duplicate(&self) -> bool {
        self.duplicate
    }

    /// Cancels the task, without waiting: the cancellation takes effect before any scheduler
    /// call made after this one from the same task or thread. Nothing happens if it has ended.
    pub fn cancel(&self) {
        // If the scheduler has stopped there is nothing left to cancel.
        let _ = self.control.send(FromTasks::Cancel(TaskRef::Id(self.id)));
    }
}

impl<O> Future for TaskHandle<O> {
    type Output = Result<Arc<O>, TaskFailure>;

    /// # Panics
    /// When polled again after it resolved.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let outcome = match &mut this.state {
            State::Waiting(rx) => match Pin::new(rx).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(outcome)) => outcome,
                Poll::Ready(Err(_)) => Err(TaskFailure::Shutdown),
            },
            State::Known(_) => match std::mem::replace(&mut this.state, State::Resolved) {
                State::Known(outcome) => outcome,
                State::Waiting(_) | State::Resolved => unreachable!("matched as known"),
            },
            State::Resolved => panic!("TaskHandle polled after it resolved"),
        };
        this.state = State::Resolved;
        Poll::Ready(outcome)
    }
}

impl<O> fmt::Debug for TaskHandle<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("id", &self.id)
            .field("duplicate", &self.duplicate)
            .finish()
    }
}
