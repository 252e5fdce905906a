//! What the store's test files share: settings with short leases, a batch builder, and a
//! field-by-field comparison of task specs (which have no `PartialEq`).

#![allow(dead_code)] // each test file uses part of it

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cronoq::{Mutation, Priority, RetryPolicy, TaskId, TaskSpec, TaskStatus, Time};
use cronoq_store_sqlite::SqliteStoreConfig;

/// Unix nanoseconds of a fixed moment, as engine time (engine time is Unix time).
pub const T0: u64 = 1_700_000_000_000_000_000;

/// Short leases, so that takeovers happen within a test; ended tasks kept forever (the
/// tests' tasks ended in 2023), unless a test prunes them itself.
pub fn fast() -> SqliteStoreConfig {
    SqliteStoreConfig {
        retention: Duration::MAX,
        lease_ttl: Duration::from_millis(600),
        lease_renew: Duration::from_millis(100),
        lock_poll: Duration::from_millis(20),
        ..SqliteStoreConfig::default()
    }
}

/// The id of task `n` of a leadership epoch.
pub fn id(epoch: u16, n: u64) -> TaskId {
    TaskId(u64::from(epoch) << 48 | n)
}

/// A task with every option the library's tasks have.
pub fn full_spec(payload: &'static [u8]) -> TaskSpec<Bytes> {
    TaskSpec::new(Bytes::from_static(payload))
        .kind("report")
        .pool("io")
        .priority(Priority::High)
        .key("nightly")
        .deadline(Time(T0 + 60_000_000_000))
        .duration_hint(Duration::from_millis(1500))
        .timeout(Duration::from_millis(2250))
        .retry(RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(250),
            multiplier: 1.5,
            max_backoff: Duration::from_secs(30),
            jitter: false,
        })
        .tag("team", "data")
        .tag("region", "eu")
        .tenant("acme")
}

pub fn submitted(id: TaskId, seq: u64, spec: TaskSpec<Bytes>) -> Mutation<Bytes> {
    Mutation::Submitted {
        id,
        seq,
        arrival: Time(T0 + seq * 1_000),
        spec,
    }
}

pub fn status(
    id: TaskId,
    status: TaskStatus,
    attempt: u32,
    at: u64,
    message: Option<&str>,
) -> Mutation<Bytes> {
    Mutation::Status {
        id,
        status,
        attempt,
        at: Time(T0 + at),
        message: message.map(Arc::from),
    }
}

/// Asserts that two specs agree in every field.
pub fn assert_same_spec(got: &TaskSpec<Bytes>, want: &TaskSpec<Bytes>) {
    assert_eq!(got.payload, want.payload, "payload");
    assert_eq!(got.kind, want.kind, "kind");
    assert_eq!(got.pool, want.pool, "pool");
    assert_eq!(got.priority, want.priority, "priority");
    assert_eq!(got.key, want.key, "key");
    assert_eq!(got.deadline, want.deadline, "deadline");
    assert_eq!(got.duration_hint, want.duration_hint, "duration_hint");
    assert_eq!(got.timeout, want.timeout, "timeout");
    assert_eq!(got.retry, want.retry, "retry");
    assert_eq!(got.tags, want.tags, "tags");
    assert_eq!(got.tenant, want.tenant, "tenant");
    assert_eq!(got.deps, want.deps, "deps");
    assert_eq!(got.resources, want.resources, "resources");
    assert_eq!(got.labels, want.labels, "labels");
    assert_eq!(got.fixed_start, want.fixed_start, "fixed_start");
}

#[path = "../../../../testing/python.rs"]
pub mod python;
