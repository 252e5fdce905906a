//! The engine's one timer heap (Python: `cronoq.core.timers`): every wake-up the engine needs
//! is an entry here, so the driver keeps a single timer for the whole engine.
//!
//! Python stores a handler per entry; here an entry is a `Timer` value the state matches on.
//! Entries fire in (time, order set) order; that pair is unique, so any correct heap pops them
//! in the order heapq does. Entries are never removed, only outlived: each handler checks
//! whether its timer still applies.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::model::{Lease, ScheduleId, TaskId, py_cmp};

/// What a timer is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// A retrying task's backoff is over (if it still retries that attempt).
    Retry {
        /// The task.
        task: TaskId,
        /// The attempt it retries after.
        attempt: u32,
    },
    /// An attempt's timeout (if it still runs).
    Timeout {
        /// The attempt.
        lease: Lease,
    },
    /// An attempt's lease may have expired (unless a heartbeat extended it).
    Lease {
        /// The attempt.
        lease: Lease,
    },
    /// A pool's autoscaler evaluation is due; it sets the next one.
    Scale {
        /// The pool's index.
        pool: usize,
    },
    /// A token bucket should hold enough tokens for a task parked on it (if this is still
    /// its wake-up: an earlier one may have been set since).
    Refill {
        /// The resource's index.
        resource: usize,
        /// The time it was set for (`f64::to_bits`: the handler compares it, as Python's
        /// does, with the bucket's current wake-up).
        when: u64,
    },
    /// A task awaiting a key has waited its pool's `await_timeout` (if it still awaits one).
    Await {
        /// The task.
        task: TaskId,
    },
    /// A scheduled fixed start's slot is held from now (if it is still scheduled).
    Hold {
        /// The task.
        task: TaskId,
    },
    /// A scheduled fixed start's time has come (if it is still scheduled).
    Start {
        /// The task.
        task: TaskId,
    },
    /// A due fixed start's tolerance ran out (if it is still due).
    Miss {
        /// The task.
        task: TaskId,
    },
    /// A recurring schedule's next occurrence is to be created (if the schedule is still the
    /// one under its name).
    Cron {
        /// The schedule.
        schedule: ScheduleId,
    },
}

#[derive(Debug)]
struct Entry {
    when: f64,
    seq: u64,
    timer: Timer,
}

impl Ord for Entry {
    /// Python's tuple order on (when, seq), reversed for std's max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        py_cmp(other.when, self.when).then(other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Entry {}

/// The timer heap.
#[derive(Debug, Default)]
pub struct Timers {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl Timers {
    /// Entries set and not fired yet (outlived ones included).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no entry is left.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Fire `timer` at `when`.
    pub fn set(&mut self, when: f64, timer: Timer) {
        self.seq += 1;
        self.heap.push(Entry {
            when,
            seq: self.seq,
            timer,
        });
    }

    /// The time of the earliest entry.
    pub fn next_time(&self) -> Option<f64> {
        self.heap.peek().map(|e| e.when)
    }

    /// The earliest entry if it is due at or before `now`, removed, with its time.
    pub fn pop_due(&mut self, now: f64) -> Option<(f64, Timer)> {
        if self.heap.peek()?.when <= now {
            self.heap.pop().map(|e| (e.when, e.timer))
        } else {
            None
        }
    }
}
