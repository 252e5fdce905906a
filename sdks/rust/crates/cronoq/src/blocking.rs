//! [`BlockingScheduler`]: the scheduler for programs without tokio, on a runtime of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::error::{Error, TaskFailure};
use crate::handle::TaskHandle;
use crate::recurring::Recurring;
use crate::scheduler::{Builder, Scheduler};
use crate::snapshot::Snapshot;
use crate::task::Task;
use crate::telemetry::in_caller_span;
use crate::types::{StatusEvent, Submitted, TaskId, TaskRef, TaskStatus};

/// A scheduler whose methods block the calling thread, running on a multi-thread tokio
/// runtime of its own (threads named `cronoq`). Its methods work outside and inside a tokio
/// runtime (inside, the wait happens on a helper thread). Executors still return futures and
/// run on the scheduler's runtime.
///
/// ```
/// use std::time::Duration;
/// use cronoq::{Pool, Scheduler, Task, TaskError};
///
/// let s = Scheduler::<u32, u32>::builder()
///     .pool(Pool::fixed("default", 2).executor_fn(|_ctx, n| async move { Ok::<_, TaskError>(*n * 2) }))
///     .build_blocking()?;
/// let handle = s.submit(Task::new(21))?;
/// assert_eq!(*handle.wait().unwrap(), 42);
/// s.shutdown(Duration::from_secs(1))?;
/// # Ok::<(), cronoq::Error>(())
/// ```
///
/// Dropping it stops the scheduler and its runtime in the background, without a grace
/// period.
pub struct BlockingScheduler<P, O> {
    scheduler: Option<Scheduler<P, O>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> BlockingScheduler<P, O> {
    pub(crate) fn start(builder: Builder<P, O>) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("cronoq")
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start a runtime: {e}")))?;
        let scheduler = block(&runtime, builder.build())?;
        Ok(BlockingScheduler {
            scheduler: Some(scheduler),
            runtime: Some(runtime),
        })
    }

    /// The scheduler itself, for the calls this type does not repeat (`list_tasks`, `handle`,
    /// `stopped`, `clock`, …), to await on its runtime or any other.
    pub fn scheduler(&self) -> &Scheduler<P, O> {
        self.scheduler.as_ref().expect("present until dropped")
    }

    fn block<T: Send>(&self, f: impl Future<Output = T> + Send) -> T {
        block(self.runtime.as_ref().expect("present until dropped"), f)
    }

    /// [`Scheduler::submit`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::submit`].
    pub fn submit(&self, task: impl Into<Task<P>>) -> Result<BlockingHandle<O>, Error> {
        let task = task.into();
        self.block(in_caller_span(self.scheduler().submit(task)))
            .map(BlockingHandle)
    }

    /// [`Scheduler::enqueue`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::enqueue`].
    pub fn enqueue(&self, task: impl Into<Task<P>>) -> Result<Submitted, Error> {
        let task = task.into();
        self.block(in_caller_span(self.scheduler().enqueue(task)))
    }

    /// [`Scheduler::enqueue_many`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::enqueue_many`].
    pub fn enqueue_many(
        &self,
        tasks: Vec<Task<P>>,
    ) -> Result<Vec<Result<Submitted, Error>>, Error> {
        self.block(in_caller_span(self.scheduler().enqueue_many(tasks)))
    }

    /// [`Scheduler::submit_batch`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::submit_batch`].
    pub fn submit_batch(&self, tasks: Vec<Task<P>>) -> Result<Vec<BlockingHandle<O>>, Error> {
        let handles = self.block(in_caller_span(self.scheduler().submit_batch(tasks)))?;
        Ok(handles.into_iter().map(BlockingHandle).collect())
    }

    /// [`Scheduler::handle`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::handle`].
    pub fn task_handle(
        &self,
        target: impl Into<TaskRef>,
    ) -> Result<Option<BlockingHandle<O>>, Error> {
        let target = target.into();
        let handle = self.block(self.scheduler().handle(target))?;
        Ok(handle.map(BlockingHandle))
    }

    /// [`Scheduler::cancel`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::cancel`].
    pub fn cancel(&self, target: impl Into<TaskRef>) -> Result<bool, Error> {
        let target = target.into();
        self.block(self.scheduler().cancel(target))
    }

    /// [`Scheduler::status`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::status`].
    pub fn status(&self, target: impl Into<TaskRef>) -> Result<Option<TaskStatus>, Error> {
        let target = target.into();
        self.block(self.scheduler().status(target))
    }

    /// [`Scheduler::snapshot`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::snapshot`].
    pub fn snapshot(&self) -> Result<Snapshot, Error> {
        self.block(self.scheduler().snapshot())
    }

    /// [`Scheduler::set_capacity`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::set_capacity`].
    pub fn set_capacity(&self, pool: &str, capacity: u32) -> Result<(), Error> {
        self.block(self.scheduler().set_capacity(pool, capacity))
    }

    /// [`Scheduler::add_recurring`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::add_recurring`].
    pub fn add_recurring(&self, recurring: Recurring<P>) -> Result<(), Error> {
        self.block(self.scheduler().add_recurring(recurring))
    }

    /// [`Scheduler::remove_recurring`], blocking.
    ///
    /// # Errors
    /// As [`Scheduler::remove_recurring`].
    pub fn remove_recurring(&self, name: &str) -> Result<bool, Error> {
        self.block(self.scheduler().remove_recurring(name))
    }

    /// [`Scheduler::events`]; receive with `blocking_recv`.
    pub fn events(&self) -> broadcast::Receiver<StatusEvent> {
        self.scheduler().events()
    }

    /// [`Scheduler::shutdown`], blocking, then stops the runtime.
    ///
    /// # Errors
    /// As [`Scheduler::shutdown`].
    pub fn shutdown(self, grace: Duration) -> Result<(), Error> {
        // Dropping `self` then stops the runtime.
        self.block(self.scheduler().shutdown(grace))
    }
}

impl<P, O> Drop for BlockingScheduler<P, O> {
    fn drop(&mut self) {
        self.scheduler = None;
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Runs `f` to completion on `runtime`, from a helper thread when this thread is inside a
/// runtime already (where blocking on another one is not allowed).
fn block<T: Send>(runtime: &tokio::runtime::Runtime, f: impl Future<Output = T> + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return runtime.block_on(f);
    }
    thread::scope(|s| {
        s.spawn(|| runtime.block_on(f))
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A [`TaskHandle`] to wait on by blocking the thread; waiting needs no runtime.
pub struct BlockingHandle<O>(TaskHandle<O>);

impl<O> std::fmt::Debug for BlockingHandle<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BlockingHandle").field(&self.0).finish()
    }
}

impl<O> BlockingHandle<O> {
    /// The task's id.
    pub fn id(&self) -> TaskId {
        self.0.id()
    }

    /// Cancels the task (see [`TaskHandle::cancel`]).
    pub fn cancel(&self) {
        self.0.cancel()
    }

    /// Waits for the task's output.
    ///
    /// # Errors
    /// As awaiting a [`TaskHandle`].
    pub fn wait(mut self) -> Result<Arc<O>, TaskFailure> {
        park_on(&mut self.0, None).expect("a wait without a deadline ends with the outcome")
    }

    /// Waits at most `timeout`: `None` if the task has not ended by then (the handle stays
    /// usable).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<Arc<O>, TaskFailure>> {
        park_on(&mut self.0, Instant::now().checked_add(timeout))
    }
}

/// Wakes a parked thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `f` on this thread, parking it in between, until it resolves or `deadline` passes.
fn park_on<F: Future + Unpin>(f: &mut F, deadline: Option<Instant>) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = Pin::new(&mut *f).poll(&mut cx) {
            return Some(out);
        }
        match deadline {
            None => thread::park(),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return None;
                }
                thread::park_timeout(d - now);
            }
        }
    }
}
