//! Helpers the integration tests share. Each test file is a crate of its own that uses some of
//! them, so the others are unused there.
#![allow(dead_code)]

use cronoq_core::model::Lease;
use cronoq_core::{Engine, Status, TaskId, TaskRef};

/// Dispatch, and the ids of the tasks that started.
pub fn started(eng: &mut Engine, now: f64) -> Vec<TaskId> {
    eng.dispatch(now);
    eng.take().starts.iter().map(|a| a.task).collect()
}

/// A held task's status.
pub fn status(eng: &Engine, id: TaskId) -> Status {
    eng.lookup(TaskRef::Id(id)).unwrap().status
}

/// The lease of the `i`-th running attempt, counted round the running ones (None: nothing
/// runs), for property tests that draw an index.
pub fn pick(eng: &Engine, i: usize) -> Option<Lease> {
    eng.running()
        .nth(i % eng.running().count().max(1))
        .map(|a| a.lease)
}
