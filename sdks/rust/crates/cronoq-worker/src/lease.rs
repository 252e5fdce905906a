use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::proto;
use crate::trace::{TRACEPARENT, TRACESTATE, TraceContext};

/// One attempt of one task, handed to the worker's handler.
///
/// Execution is at least once: `(task_id, attempt)` is a fencing token, since attempt numbers
/// never repeat for a task, also across server failovers.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Names this attempt in every message about it; it changes with every attempt.
    pub lease: u64,
    pub task_id: u64,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The pool (the worker's own when the server leaves it out).
    pub pool: String,
    pub payload: Bytes,
    pub content_type: String,
    pub kind: String,
    pub key: String,
    /// The task's tags, without the server's reserved `cronoq.*` ones.
    pub tags: HashMap<String, String>,
    /// The per-attempt timeout: the server aborts the attempt when it passes.
    pub timeout: Option<Duration>,
    /// The task's soft deadline.
    pub deadline: Option<SystemTime>,
    /// Cancelled when the worker gives the attempt up: the server aborted it (timeout,
    /// cancellation, lease expiry), the connection ended, or the drain timeout passed.
    pub cancel: CancellationToken,
}

impl Lease {
    /// The task's W3C trace context: its `traceparent` tag, None without one. A program that
    /// traces gives it to its propagator as the parent of the attempt's span.
    pub fn traceparent(&self) -> Option<&str> {
        self.tags.get(TRACEPARENT).map(String::as_str)
    }

    /// The task's W3C `tracestate` tag, None without one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tags.get(TRACESTATE).map(String::as_str)
    }

    /// Both, None without a traceparent.
    pub fn trace_context(&self) -> Option<TraceContext> {
        TraceContext::from_tags(&self.tags)
    }

    pub(crate) fn from_wire(m: proto::Lease, pool: &str, cancel: CancellationToken) -> Self {
        let deadline = m.deadline_unix_ns.and_then(|ns| {
            let offset = Duration::from_nanos(ns.unsigned_abs());
            if ns >= 0 {
                UNIX_EPOCH.checked_add(offset)
            } else {
                UNIX_EPOCH.checked_sub(offset)
            }
        });
        Self {
            lease: m.lease,
            task_id: m.task_id,
            attempt: m.attempt,
            pool: if m.pool.is_empty() {
                pool.to_owned()
            } else {
                m.pool
            },
            payload: m.payload,
            content_type: m.content_type,
            kind: m.kind,
            key: m.key,
            tags: m.tags,
            timeout: m.timeout_s.and_then(seconds),
            deadline,
            cancel,
        }
    }
}

/// A wire duration in seconds; negative, infinite and NaN ones mean none.
pub(crate) fn seconds(s: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(s).ok()
}
