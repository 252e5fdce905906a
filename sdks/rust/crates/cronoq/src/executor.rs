//! Executors: what runs one attempt of a task in this process ([`Executor`], [`FnExecutor`]),
//! and what an attempt knows about itself ([`TaskContext`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::error::TaskError;
use crate::groups::Labels;
use crate::types::{LeaseId, TaskId};

/// A boxed future that can move between threads: what [`Executor::execute`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A task's tags: every `(key, value)` pair in submission order, repeated keys kept.
pub type Tags = Arc<[(Arc<str>, Arc<str>)]>;

/// Runs attempts of one pool's tasks: `P` is the payload type, `O` the output type.
///
/// Most executors are closures ([`Pool::executor_fn`](crate::Pool::executor_fn)); implement
/// the trait for more control, such as per-attempt resources released by
/// [`abort`](Executor::abort):
///
/// ```
/// use std::sync::Arc;
/// use cronoq::{BoxFuture, Executor, LeaseId, TaskContext, TaskError};
///
/// struct Doubler;
///
/// impl Executor<u64, u64> for Doubler {
///     fn execute(&self, ctx: TaskContext, n: Arc<u64>) -> BoxFuture<Result<u64, TaskError>> {
///         Box::pin(async move {
///             if ctx.attempt > 3 {
///                 return Err(TaskError::permanent("giving up"));
///             }
///             n.checked_mul(2).ok_or_else(|| TaskError::permanent("overflow"))
///         })
///     }
///
///     fn abort(&self, _lease: LeaseId) {}
/// }
/// ```
///
/// What the result does to the task:
///
/// | result | the task |
/// | --- | --- |
/// | `Ok(output)` | succeeds; every handle gets the output as one shared `Arc<O>` |
/// | `Err(TaskError::Retryable { .. })` | retries after its backoff (at least `retry_after`), or ends `DeadLettered` after its last attempt |
/// | `Err(TaskError::Permanent { .. })` | ends `Failed` |
/// | `Err(TaskError::Cancelled)` | ends `Cancelled`, without a retry |
/// | a panic, in `execute` or in the future | ends `Failed` with the message `panic: <text>`; the scheduler and other attempts go on |
pub trait Executor<P, O>: Send + Sync + 'static {
    /// Starts one attempt. It is called on the scheduler's driver task, so its synchronous part
    /// should be quick (blocking here stalls the whole scheduler); the returned future runs on
    /// a task of its own.
    fn execute(&self, ctx: TaskContext, payload: Arc<P>) -> BoxFuture<Result<O, TaskError>>;

    /// Called synchronously, on the driver task, when the scheduler gives an attempt up (its
    /// task was cancelled, it timed out, its lease expired), before anything else is dispatched
    /// and before the attempt's future is dropped. Not called for attempts cut off by a
    /// shutdown. A panic here is logged and ignored. The default does nothing.
    fn abort(&self, _lease: LeaseId) {}
}

/// An [`Executor`] made of a closure `Fn(TaskContext, Arc<P>) -> impl Future<Output =
/// Result<O, TaskError>>`. [`Pool::executor_fn`](crate::Pool::executor_fn) wraps a closure in
/// one; it can also be called directly, e.g. in unit tests:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// use cronoq::{Executor, FnExecutor, TaskContext, TaskError, TaskId};
///
/// let exec = FnExecutor::new(|ctx: TaskContext, n: Arc<u32>| async move {
///     Ok::<_, TaskError>(format!("{} of task {}", n, ctx.id))
/// });
/// let out = exec.execute(TaskContext::for_test(TaskId(7)), Arc::new(3)).await;
/// assert_eq!(out.unwrap(), "3 of task 7");
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct FnExecutor<F>(pub F);

impl<F> FnExecutor<F> {
    /// Wraps the closure.
    pub fn new(f: F) -> Self {
        FnExecutor(f)
    }
}

impl<P, O, F, Fut> Executor<P, O> for FnExecutor<F>
where
    F: Fn(TaskContext, Arc<P>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
{
    fn execute(&self, ctx: TaskContext, payload: Arc<P>) -> BoxFuture<Result<O, TaskError>> {
        Box::pin((self.0)(ctx, payload))
    }
}

/// An attempt's heartbeat channel: one request at a time is in flight.
#[derive(Debug)]
pub(crate) struct Beat {
    pub(crate) lease: LeaseId,
    pub(crate) in_flight: AtomicBool,
    /// The driver's channel of heartbeats (it sends `self`).
    pub(crate) to_driver: UnboundedSender<Arc<Beat>>,
}

/// What an attempt knows about itself, handed to [`Executor::execute`].
///
/// Clones share the attempt's cancellation: hand one to work spawned elsewhere, which then
/// sees [`is_cancelled`](TaskContext::is_cancelled) and [`cancelled`](TaskContext::cancelled)
/// when the attempt is given up.
///
/// When the scheduler gives an attempt up (its task is cancelled, it times out, its lease
/// expires) it cancels the attempt's token and then **drops the executor's future**: code
/// inside that future stops at its current `.await` and never observes the cancellation
/// itself, so clean-up belongs in `Drop` guards or in the executor's
/// [`abort`](Executor::abort). A `select!` on [`cancelled`](TaskContext::cancelled) inside the
/// future does no harm; it matters for work the attempt spawned elsewhere.
#[derive(Clone)]
pub struct TaskContext {
    /// The task.
    pub id: TaskId,
    /// This attempt's lease.
    pub lease: LeaseId,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The pool's name.
    pub pool: Arc<str>,
    /// The task's kind.
    pub kind: Arc<str>,
    /// The task's key.
    pub key: Option<Arc<str>>,
    /// The task's tags, in submission order.
    pub tags: Tags,
    /// The task's soft deadline: pick a faster path when it is near.
    pub deadline: Option<SystemTime>,
    /// The most this attempt may run.
    pub timeout: Option<Duration>,
    /// The labels of the worker group this attempt runs on, sorted by name (empty on the
    /// pool's unlabeled slots).
    pub group: Labels,
    token: CancellationToken,
    beat: Option<Arc<Beat>>,
}

impl TaskContext {
    /// The context of a running attempt (`beat` when its pool has a lease TTL).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: TaskId,
        lease: LeaseId,
        attempt: u32,
        pool: Arc<str>,
        kind: Arc<str>,
        key: Option<Arc<str>>,
        tags: Tags,
        deadline: Option<SystemTime>,
        timeout: Option<Duration>,
        group: Labels,
        token: CancellationToken,
        beat: Option<Arc<Beat>>,
    ) -> Self {
        TaskContext {
            id,
            lease,
            attempt,
            pool,
            kind,
            key,
            tags,
            deadline,
            timeout,
            group,
            token,
            beat,
        }
    }

    /// A context detached from any scheduler, for calling an executor in a unit test: lease
    /// `LeaseId(id.0)`, attempt 1, pool and kind `"default"`, nothing else set. Its heartbeats
    /// do nothing; cancel it through [`cancellation_token`](TaskContext::cancellation_token).
    /// The public fields may be changed afterwards.
    pub fn for_test(id: TaskId) -> Self {
        TaskContext {
            id,
            lease: LeaseId(id.0),
            attempt: 1,
            pool: Arc::from("default"),
            kind: Arc::from("default"),
            key: None,
            tags: Arc::from([]),
            deadline: None,
            timeout: None,
            group: Arc::from([]),
            token: CancellationToken::new(),
            beat: None,
        }
    }

    /// Whether the attempt was given up (task cancelled, attempt timed out, lease expired,
    /// scheduler stopped).
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves when the attempt is given up (at once if it was).
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// The attempt's cancellation token, for code that knows nothing of cronoq.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Extends the attempt's lease by the pool's lease TTL. Call it regularly from long
    /// attempts of pools with a lease TTL, or they are given up and retried when the TTL runs
    /// out. Cheap: at most one request per attempt is in flight, and without a lease TTL it
    /// does nothing.
    pub fn heartbeat(&self) {
        if let Some(beat) = &self.beat
            && !beat.in_flight.swap(true, Ordering::AcqRel)
        {
            // The driver may be gone; then there is no lease to extend.
            let _ = beat.to_driver.send(beat.clone());
        }
    }

    /// The value of the first tag with this key.
    ///
    /// ```
    /// use cronoq::{TaskContext, TaskId};
    ///
    /// let mut ctx = TaskContext::for_test(TaskId(1));
    /// ctx.tags = vec![("env".into(), "prod".into()), ("env".into(), "eu".into())].into();
    /// assert_eq!(ctx.tag("env"), Some("prod"));
    /// assert_eq!(ctx.traceparent(), None);
    /// ```
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// The task's W3C trace context: its `traceparent` tag, set by the submitter.
    pub fn traceparent(&self) -> Option<&str> {
        self.tag("traceparent")
    }
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .field("pool", &self.pool)
            .field("kind", &self.kind)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_test_context_is_detached() {
        let ctx = TaskContext::for_test(TaskId(9));
        assert_eq!(
            (ctx.lease, ctx.attempt, &*ctx.pool),
            (LeaseId(9), 1, "default")
        );
        ctx.heartbeat();
        let spawned = ctx.clone();
        assert!(!spawned.is_cancelled());
        ctx.cancellation_token().cancel();
        spawned.cancelled().await;
        assert!(spawned.is_cancelled());
        let shown = format!("{ctx:?}");
        assert!(shown.starts_with("TaskContext { id: TaskId(9), attempt: 1"));
        assert!(shown.ends_with(".. }"));
    }

    #[tokio::test]
    async fn heartbeats_are_coalesced() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let beat = Arc::new(Beat {
            lease: LeaseId(1),
            in_flight: AtomicBool::new(false),
            to_driver: tx,
        });
        let mut ctx = TaskContext::for_test(TaskId(1));
        ctx.beat = Some(beat.clone());
        ctx.heartbeat();
        ctx.heartbeat();
        assert!(rx.try_recv().is_ok_and(|b| Arc::ptr_eq(&b, &beat)));
        assert!(rx.try_recv().is_err(), "the second waits for the first");
        beat.in_flight.store(false, Ordering::Release);
        ctx.heartbeat();
        assert!(rx.try_recv().is_ok());
    }
}
