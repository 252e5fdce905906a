use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Why an attempt did not succeed: it decides what becomes of the task.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskError {
    /// The task is retried after the pool's backoff, and never sooner than `retry_after`;
    /// it is dead-lettered when its attempts are used up.
    Retryable {
        message: Arc<str>,
        retry_after: Option<Duration>,
    },
    /// No retry can fix it: the task ends failed.
    Permanent { message: Arc<str> },
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
