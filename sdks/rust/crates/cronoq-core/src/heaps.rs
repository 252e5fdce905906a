//! Lazily invalidated heaps of ready tasks (Python: `cronoq.core.heaps`).
//!
//! An entry is `(key, seq, gen, task)`, live while the task's `qgen` equals `gen`; a task that
//! leaves a queue bumps its `qgen` and dead entries are dropped when they reach the top. A
//! task's `seq` is unique and its generations are distinct, so entries never tie completely
//! and any correct heap pops them in heapq's order. Whether a heap still holds dead entries is
//! seen by the dispatch rules (an empty deadline heap), so entries die exactly when Python's do.
//! Each queue counts its live entries, so that a heap without dead ones is read without
//! looking its tasks up.
//!
//! Tasks mostly arrive in key order (a FIFO heap's key is the admission time), so a `TaskHeap`
//! keeps entries that come after every entry before them in a sorted run, pushed and popped in
//! O(1), and only the others in a binary heap; its top is the first of the two tops. It pops
//! the same entries in the same order as one binary heap (entries never tie), and its length
//! and emptiness count both parts, so dead entries are dropped exactly as Python drops them.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

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

/// A min-heap of entries, dead ones included until they reach the top: a sorted run of
/// entries pushed in order, and a binary heap of the rest (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct TaskHeap {
    /// Entries in pop order (each pushed after every other entry then in the run).
    run: VecDeque<QEntry>,
    /// Entries pushed out of order.
    heap: BinaryHeap<QEntry>,
}

impl TaskHeap {
    /// An empty heap.
    pub fn new() -> Self {
        TaskHeap::default()
    }

    /// Entries held, dead ones included.
    pub fn len(&self) -> usize {
        self.run.len() + self.heap.len()
    }

    /// Whether no entry is held, dead ones included.
    pub fn is_empty(&self) -> bool {
        self.run.is_empty() && self.heap.is_empty()
    }

    /// Add an entry.
    #[inline]
    pub fn push(&mut self, e: QEntry) {
        // The greater entry pops first (the order is reversed for std's max-heap).
        match self.run.back() {
            Some(last) if e > *last => self.heap.push(e),
            _ => self.run.push_back(e),
        }
    }

    /// Whether the top is the run's first entry (false: the binary heap's, or none).
    #[inline]
    fn top_in_run(&self) -> bool {
        match (self.run.front(), self.heap.peek()) {
            (Some(r), Some(h)) => r > h,
            (r, _) => r.is_some(),
        }
    }

    /// The first entry.
    #[inline]
    pub fn peek(&self) -> Option<&QEntry> {
        if self.top_in_run() {
            self.run.front()
        } else {
            self.heap.peek()
        }
    }

    /// Remove and return the first entry.
    #[inline]
    pub fn pop(&mut self) -> Option<QEntry> {
        if self.top_in_run() {
            self.run.pop_front()
        } else {
            self.heap.pop()
        }
    }

    /// Drop every entry.
    pub fn clear(&mut self) {
        self.run.clear();
        self.heap.clear();
    }

    /// Keep only the entries `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&QEntry) -> bool) {
        self.run.retain(&mut keep);
        self.heap.retain(keep);
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &QEntry> {
        self.run.iter().chain(self.heap.iter())
    }
}

/// Whether the entry is still its task's place in the queue.
pub fn is_live(e: &QEntry, tasks: &Tasks) -> bool {
    tasks.get(&e.task).is_some_and(|r| r.qgen == e.generation)
}

/// The first live entry, dropping dead entries above it. `live` is how many entries of the
/// heap are live: when all are, the top is, and no task is looked up (dead entries are
/// dropped exactly as Python drops them: when one is at the top at a lookup).
#[inline]
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pushes mostly in order with some out of it, pops and retains: the run and the heap
        /// together give what one binary heap gives, top and length at every step.
        #[test]
        fn pops_as_one_binary_heap(
            ops in proptest::collection::vec((0u8..10, 0u32..50), 0..2000),
        ) {
            let mut ours = TaskHeap::new();
            let mut model: BinaryHeap<QEntry> = BinaryHeap::new();
            let (mut seq, mut clock) = (0u64, 0u32);
            for (op, n) in ops {
                match op {
                    0..=5 => {
                        // keys in quarters: ties of keys are common, of whole entries never
                        clock += n % 3;
                        let key = if op == 5 { clock.saturating_sub(n) } else { clock };
                        seq += 1;
                        let e = QEntry {
                            key: f64::from(key) / 4.0,
                            seq: if op == 4 { 1_000_000 - seq } else { seq },
                            generation: u64::from(n),
                            task: seq,
                        };
                        ours.push(e);
                        model.push(e);
                    }
                    6..=8 => {
                        let (a, b) = (ours.pop(), model.pop());
                        prop_assert_eq!(a.map(|e| (e.seq, e.generation)), b.map(|e| (e.seq, e.generation)));
                    }
                    _ => {
                        ours.retain(|e| e.seq % 7 != u64::from(n % 7));
                        model.retain(|e| e.seq % 7 != u64::from(n % 7));
                    }
                }
                prop_assert_eq!(ours.len(), model.len());
                prop_assert_eq!(ours.is_empty(), model.is_empty());
                prop_assert_eq!(ours.peek().map(|e| e.seq), model.peek().map(|e| e.seq));
            }
            let mut all: Vec<u64> = ours.iter().map(|e| e.seq).collect();
            let mut want: Vec<u64> = model.iter().map(|e| e.seq).collect();
            all.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(all, want);
        }
    }
}
