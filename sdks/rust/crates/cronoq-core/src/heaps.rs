//! Lazily invalidated heaps of ready tasks (Python: `cronoq.core.heaps`).
//!
//! An entry is `(key, seq, gen, task)`, live while the task's `qgen` equals `gen`; a task that
//! leaves a queue bumps its `qgen` and dead entries are dropped when they reach the top. A
//! task's `seq` is unique and its generations are distinct, so entries never tie completely
//! and any correct heap pops them in heapq's order. Whether a heap still holds dead entries is
//! seen by the dispatch rules (an empty deadline heap), so entries die exactly when Python's do.
//! Each queue counts its live entries, so that a heap without dead ones is read without
//! looking its tasks up.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::model::{TaskId, py_cmp};
use crate::state::Tasks;

/// One heap entry.
#[derive(Clone, Copy, Debug)]
pub struct QEntry {
    /// The ordering key: eligibility time (FIFO heap) or latest start (deadline heap).
    pub key: f64,
    /// The task's admission order.
    pub seq: u64,
    /// The task's queue generation at the push.
    pub generation: u64,
    /// The task.
    pub task: TaskId,
}

impl Ord for QEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: std's heap is a max-heap, heapq a min-heap.
        py_cmp(other.key, self.key)
            .then(other.seq.cmp(&self.seq))
            .then(other.generation.cmp(&self.generation))
    }
}

impl PartialOrd for QEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for QEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for QEntry {}

/// A min-heap of entries, dead ones included until they reach the top.
pub type TaskHeap = BinaryHeap<QEntry>;

/// Whether the entry is still its task's place in the queue.
pub fn is_live(e: &QEntry, tasks: &Tasks) -> bool {
    tasks.get(&e.task).is_some_and(|r| r.qgen == e.generation)
}

/// The first live entry, dropping dead entries above it. `live` is how many entries of the
/// heap are live: when all are, the top is, and no task is looked up (dead entries are
/// dropped exactly as Python drops them: when one is at the top at a lookup).
pub fn live_head(heap: &mut TaskHeap, tasks: &Tasks, live: i64) -> Option<QEntry> {
    if heap.len() as i64 == live {
        return heap.peek().copied();
    }
    while let Some(e) = heap.peek() {
        if is_live(e, tasks) {
            return Some(*e);
        }
        heap.pop();
    }
    None
}
