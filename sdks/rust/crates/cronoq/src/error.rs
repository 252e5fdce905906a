//! The errors of the library: [`TaskError`] (what an attempt returns), [`Error`] (what a
//! scheduler call returns), [`SubmitError`] (why a task was not admitted), [`TaskFailure`] (why a
//! task has no output) and [`StoreError`] (what a store reports).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::types::{TaskId, TaskStatus};

/// Why an attempt did not succeed: it decides what becomes of the task.
///
/// An in-process executor and a remote worker's handler both return it.
///
/// ```
/// use std::time::Duration;
/// use cronoq::TaskError;
///
/// let e = TaskError::from_err(std::io::Error::other("disk full"));
/// assert_eq!(e, TaskError::retryable("disk full"));
/// assert_eq!(TaskError::permanent("bad input").to_string(), "bad input");
/// let later = TaskError::retry_after("rate limited", Duration::from_secs(30));
/// assert!(matches!(later, TaskError::Retryable { retry_after: Some(_), .. }));
/// assert_eq!(TaskError::Cancelled.to_string(), "cancelled");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum TaskError {
    /// The task is retried after the pool's backoff, and never sooner than `retry_after`;
    /// it is dead-lettered when its attempts are used up.
    Retryable {
        /// What went wrong.
        message: Arc<str>,
        /// The least time before the next attempt (it may exceed the policy's `max_backoff`).
        retry_after: Option<Duration>,
    },
    /// No retry can fix it: the task ends failed.
    Permanent {
        /// What went wrong.
        message: Arc<str>,
    },
    /// The attempt stopped because it was cancelled. Returned on the attempt's own initiative
    /// it ends the task as cancelled; a remote worker reports nothing for an attempt it
    /// cancelled itself (abort, lost connection, drain timeout), since the server has already
    /// given that attempt up.
    Cancelled,
}

impl TaskError {
    /// A retryable failure carrying `err`'s message: what most errors are.
    pub fn from_err(err: impl fmt::Display) -> Self {
        Self::retryable(err.to_string())
    }

    /// A failure that a later attempt may not hit.
    pub fn retryable(message: impl Into<Arc<str>>) -> Self {
        Self::Retryable {
            message: message.into(),
            retry_after: None,
        }
    }

    /// A retryable failure whose next attempt must not start sooner than `after`, for when
    /// the remote side said when to come back.
    pub fn retry_after(message: impl Into<Arc<str>>, after: Duration) -> Self {
        Self::Retryable {
            message: message.into(),
            retry_after: Some(after),
        }
    }

    /// A failure that retrying cannot fix (invalid input, a refused request).
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self::Permanent {
            message: message.to_string().into(),
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retryable { message, .. } | Self::Permanent { message } => f.write_str(message),
            Self::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl std::error::Error for TaskError {}

/// Why a task was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// No pool has this name (a task's pool is `"default"` unless it names one).
    UnknownPool(Arc<str>),
    /// No resource of the scheduler has this name.
    UnknownResource(Arc<str>),
    /// The task asks for more of this resource than it has (permits, or a bucket's burst).
    ResourceExceedsCapacity(Arc<str>),
    /// The task's fixed start would overlap more reservations than its pool allows.
    ReservationConflict,
    /// The task's dependencies would wait for each other (or for itself).
    Cycle,
    /// No task has this key or id (an id as its decimal text), and the pool does not await
    /// unknown keys ([`UnknownDependency`](crate::UnknownDependency)).
    UnknownDependency(Arc<str>),
    /// The pool's queue is full. Callers of the scheduler never see it: a submission to a full
    /// [`Wait`](crate::OverflowPolicy::Wait) pool waits for room instead.
    Full,
    /// The pool's queue is full and its overflow policy refused the task, or the task (or
    /// batch) could not fit even into an empty queue.
    Overloaded,
    /// Two tasks of one batch have this key.
    DuplicateKeyInBatch(Arc<str>),
    /// The task is malformed; the text says how.
    Invalid(&'static str),
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::UnknownPool(p) => write!(f, "unknown pool '{p}'"),
            SubmitError::UnknownResource(r) => write!(f, "unknown resource '{r}'"),
            SubmitError::ResourceExceedsCapacity(r) => {
                write!(f, "requested amount exceeds capacity of resource '{r}'")
            }
            SubmitError::ReservationConflict => f.write_str("fixed-start reservation conflict"),
            SubmitError::Cycle => f.write_str("dependency cycle"),
            SubmitError::UnknownDependency(k) => write!(f, "unknown dependency '{k}'"),
            SubmitError::Full => f.write_str("queue full"),
            SubmitError::Overloaded => f.write_str("overloaded"),
            SubmitError::DuplicateKeyInBatch(k) => write!(f, "duplicate key '{k}' in batch"),
            SubmitError::Invalid(m) => write!(f, "invalid task: {m}"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// What a store reports when it cannot do what it was asked.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// Another instance leads now: this one must stop writing.
    Fenced,
    /// The store cannot be reached for now; retrying may help.
    Unavailable(String),
    /// Any other failure.
    Other(String),
}

impl StoreError {
    /// Whether retrying may help (only [`StoreError::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Fenced => f.write_str("fenced: leadership lost"),
            StoreError::Unavailable(m) => write!(f, "store unavailable: {m}"),
            StoreError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for StoreError {}

/// What a scheduler call returns when it cannot do what was asked.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The task (or batch) was not admitted; also an unknown pool in
    /// [`set_capacity`](crate::Scheduler::set_capacity).
    Submit(SubmitError),
    /// The scheduler has stopped, or is stopping and takes no more work.
    Shutdown,
    /// The configuration cannot work (from [`Builder::build`](crate::Builder::build)).
    Config(String),
    /// The store failed.
    Store(StoreError),
    /// The scheduler's driver failed unexpectedly (a bug); the text says how.
    Internal(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Submit(e) => fmt::Display::fmt(e, f),
            Error::Shutdown => f.write_str("scheduler is shut down"),
            Error::Config(m) => write!(f, "configuration error: {m}"),
            Error::Store(e) => write!(f, "store error: {e}"),
            Error::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Submit(e) => Some(e),
            Error::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl From<SubmitError> for Error {
    fn from(e: SubmitError) -> Error {
        Error::Submit(e)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Error {
        Error::Store(e)
    }
}

/// Why a [`TaskHandle`](crate::TaskHandle) has no output.
///
/// ```
/// use cronoq::{TaskFailure, TaskStatus};
///
/// let f = TaskFailure::Ended { status: TaskStatus::Failed, message: "bad input".into() };
/// assert_eq!(f.to_string(), "task ended as failed: bad input");
/// assert_eq!(f.status(), Some(TaskStatus::Failed));
/// assert_eq!(TaskFailure::Shutdown.status(), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskFailure {
    /// The task ended without succeeding.
    Ended {
        /// How it ended.
        status: TaskStatus,
        /// The last error or the reason (`attempt timed out`, `cancelled`, `panic: …`); the
        /// status's name when there is none.
        message: Arc<str>,
    },
    /// The task succeeded, but its output is no longer kept (the handle was attached after
    /// the end, and the output cache has let it go).
    OutputUnavailable {
        /// The task.
        id: TaskId,
    },
    /// The scheduler stopped before the task ended.
    Shutdown,
}

impl TaskFailure {
    /// The task's final status, when it ended (`None` for [`TaskFailure::Shutdown`]).
    pub fn status(&self) -> Option<TaskStatus> {
        match self {
            TaskFailure::Ended { status, .. } => Some(*status),
            TaskFailure::OutputUnavailable { .. } => Some(TaskStatus::Succeeded),
            TaskFailure::Shutdown => None,
        }
    }
}

impl fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskFailure::Ended { status, message } => {
                write!(f, "task ended as {status}: {message}")
            }
            TaskFailure::OutputUnavailable { id } => {
                write!(
                    f,
                    "task {id} succeeded, but its output is no longer available"
                )
            }
            TaskFailure::Shutdown => f.write_str("scheduler shut down"),
        }
    }
}

impl std::error::Error for TaskFailure {}
