//! Ready queues of one pool (Python: `cronoq.core.queue`): one per priority class, each with a
//! FIFO heap and a deadline heap.
//!
//! Within a class every task ages at the same rate (classes may differ: `Scoring::aging_rates`),
//! so the oldest eligible task always has the highest aging term and the FIFO order never needs
//! re-sorting as time passes (linear aging folds into the static key `(eligible_at, seq)`).
//! Classes are compared by scoring each one's heads at `now` with its own rate and cap.
//! Deadline urgency depends on `latest_start`, so tasks with a deadline also sit in a second
//! heap keyed by it. Choosing the next task compares at most two heads per class:
//! O(classes + log n) per decision. The score
//! arithmetic is Python's, operation for operation, so ties and near-ties fall the same way.
//! With fair share, a class's queue is a `fair::FairClassQueue` instead (tenants take turns
//! within each class; classes stay strict).

use std::sync::Arc;

use crate::fair::{self, FairClassQueue};
use crate::heaps::{QEntry, TaskHeap, is_live, live_head};
use crate::model::{ConfigError, Scoring, TaskId, TaskRecord};
use crate::state::Tasks;
use crate::vocab::NUM_CLASSES;

/// The ready tasks of one class: in FIFO order, or by fair share between tenants.
#[derive(Debug)]
pub enum ClassQueue {
    /// Oldest eligible first.
    Fifo(FifoQueue),
    /// Start-time fair queueing between tenants.
    Fair(FairClassQueue),
}

impl ClassQueue {
    /// Tasks queued.
    pub fn n(&self) -> i64 {
        match self {
            ClassQueue::Fifo(q) => q.n,
            ClassQueue::Fair(q) => q.n,
        }
    }

    fn push(&mut self, rec: &mut TaskRecord) {
        match self {
            ClassQueue::Fifo(q) => q.push(rec),
            ClassQueue::Fair(q) => q.push(rec),
        }
    }

    fn discard(&mut self, id: TaskId, tasks: &mut Tasks) {
        match self {
            ClassQueue::Fifo(q) => q.discard(tasks.get_mut(&id).expect("a queued task is held")),
            ClassQueue::Fair(q) => q.discard(id, tasks),
        }
    }

    fn take(&mut self, id: TaskId, tasks: &mut Tasks) {
        match self {
            ClassQueue::Fifo(q) => q.take(tasks.get_mut(&id).expect("a queued task is held")),
            ClassQueue::Fair(q) => q.take(id, tasks),
        }
    }

    /// Python's `not q.dl`: the deadline heap holds no entry, dead ones included.
    fn dl_is_empty(&self) -> bool {
        match self {
            ClassQueue::Fifo(q) => q.dl.is_empty(),
            ClassQueue::Fair(q) => q.dl.is_empty(),
        }
    }

    /// Whether no queued task has a latest start, known without a look-up.
    fn no_deadlines(&self) -> bool {
        match self {
            ClassQueue::Fifo(q) => q.ndl == 0,
            ClassQueue::Fair(q) => q.dl.is_empty(),
        }
    }

    /// The task first in line (dead entries above it are dropped).
    pub(crate) fn fifo_head(&mut self, tasks: &Tasks) -> Option<QEntry> {
        match self {
            ClassQueue::Fifo(q) => q.fifo_head(tasks),
            ClassQueue::Fair(q) => q.fifo_head(),
        }
    }

    fn dl_head(&mut self, tasks: &Tasks) -> Option<QEntry> {
        match self {
            ClassQueue::Fifo(q) => q.dl_head(tasks),
            ClassQueue::Fair(q) => q.dl_head(tasks),
        }
    }

    /// The oldest queued task (smallest `(eligible_at, seq)`).
    pub fn oldest(&mut self, tasks: &Tasks) -> Option<TaskId> {
        match self {
            ClassQueue::Fifo(q) => q.oldest(tasks),
            ClassQueue::Fair(q) => q.oldest(),
        }
    }

    /// The most recently admitted queued task: a scan, only used under overload.
    pub fn newest(&self, tasks: &Tasks) -> Option<TaskId> {
        match self {
            ClassQueue::Fifo(q) => q.newest(tasks),
            ClassQueue::Fair(q) => q.newest(tasks),
        }
    }
}

/// The ready tasks of one class in FIFO order (Python's `ClassQueue`).
#[derive(Debug, Default)]
pub struct FifoQueue {
    fifo: TaskHeap,
    dl: TaskHeap,
    /// Tasks queued (live entries of the FIFO heap).
    pub n: i64,
    /// Tasks queued with a latest start (live entries of the deadline heap).
    ndl: i64,
}

impl FifoQueue {
    fn push(&mut self, rec: &mut TaskRecord) {
        rec.qgen += 1;
        let g = rec.qgen;
        self.fifo.push(QEntry {
            key: rec.eligible_at,
            seq: rec.seq,
            generation: g,
            task: rec.id,
        });
        if let Some(ls) = rec.latest_start {
            self.dl.push(QEntry {
                key: ls,
                seq: rec.seq,
                generation: g,
                task: rec.id,
            });
            self.ndl += 1;
        }
        self.n += 1;
    }

    fn discard(&mut self, rec: &mut TaskRecord) {
        rec.qgen += 1;
        self.n -= 1;
        if rec.latest_start.is_some() {
            self.ndl -= 1;
        }
    }

    /// The task was dispatched (usually the FIFO head: drop its entry at once).
    fn take(&mut self, rec: &mut TaskRecord) {
        self.discard(rec);
        if self.fifo.peek().is_some_and(|e| e.task == rec.id) {
            self.fifo.pop();
        }
    }

    fn fifo_head(&mut self, tasks: &Tasks) -> Option<QEntry> {
        live_head(&mut self.fifo, tasks, self.n)
    }

    fn dl_head(&mut self, tasks: &Tasks) -> Option<QEntry> {
        live_head(&mut self.dl, tasks, self.ndl)
    }

    /// The oldest queued task (the FIFO head).
    pub fn oldest(&mut self, tasks: &Tasks) -> Option<TaskId> {
        self.fifo_head(tasks).map(|e| e.task)
    }

    /// The most recently admitted queued task: a scan, only used under overload.
    pub fn newest(&self, tasks: &Tasks) -> Option<TaskId> {
        self.fifo
            .iter()
            .filter(|e| is_live(e, tasks))
            .max_by_key(|e| e.seq)
            .map(|e| e.task)
    }
}

/// A queue head in the running for the next dispatch: what the score and its ties read.
#[derive(Clone, Copy)]
struct Cand {
    task: TaskId,
    cls: usize,
    eligible_at: f64,
    seq: u64,
    latest_start: Option<f64>,
}

/// Deadline urgency at `now` of a task that should start by `latest_start`.
pub fn urgency(latest_start: f64, now: f64, sc: &Scoring) -> f64 {
    let slack = latest_start - now;
    if slack >= sc.window {
        return 0.0;
    }
    if slack >= 0.0 {
        return sc.urgency_max * (1.0 - slack / sc.window);
    }
    sc.urgency_max + crate::model::py_min(sc.overdue_rate * -slack, sc.overdue_cap)
}

/// The ready tasks of one pool, ordered by dispatch score.
#[derive(Debug)]
pub struct ReadyQueues {
    /// One queue per class, critical first.
    pub classes: [ClassQueue; NUM_CLASSES],
    /// Tasks queued in all classes.
    pub n: i64,
    sc: Scoring,
    /// Whether the last `pop_best` took from the most important non-empty class.
    pub adherent: bool,
    bound: [(f64, f64); NUM_CLASSES],
    /// Each class's (aging rate, age cap): classes may age differently, the tasks of one class
    /// alike, so comparing classes scores each class's heads at `now` with its own.
    age: [(f64, f64); NUM_CLASSES],
}

impl ReadyQueues {
    /// Empty queues scored by `sc`; with `fair_weights`, tenants take turns within each class
    /// (refused: a weight that is not finite and > 0).
    pub fn new(sc: Scoring, fair_weights: Option<&[(String, f64)]>) -> Result<Self, ConfigError> {
        let age = sc.ages();
        let bound = std::array::from_fn(|c| {
            let (b, cap) = (sc.base[c], age[c].1);
            (b + cap, b + cap + sc.urgency_max + sc.overdue_cap)
        });
        let classes = match fair_weights {
            None => std::array::from_fn(|_| ClassQueue::Fifo(FifoQueue::default())),
            Some(list) => {
                let weights = Arc::new(fair::weights(list)?);
                std::array::from_fn(|_| ClassQueue::Fair(FairClassQueue::new(weights.clone())))
            }
        };
        Ok(ReadyQueues {
            classes,
            n: 0,
            sc,
            adherent: true,
            bound,
            age,
        })
    }

    /// Queue a ready task in its class.
    #[inline]
    pub fn push(&mut self, rec: &mut TaskRecord) {
        self.classes[usize::from(rec.cls)].push(rec);
        self.n += 1;
    }

    /// Take a queued task out (its heap entries die lazily).
    pub fn discard(&mut self, id: TaskId, tasks: &mut Tasks) {
        let cls = usize::from(tasks[&id].cls);
        self.classes[cls].discard(id, tasks);
        self.n -= 1;
    }

    /// Remove and return the task with the highest score at `now`.
    #[inline]
    pub fn pop_best(&mut self, now: f64, tasks: &mut Tasks) -> Option<TaskId> {
        if self.n == 0 {
            return None;
        }
        let total = self.n;
        if let Some(q) = self.classes.iter_mut().find(|q| q.n() != 0)
            && q.n() == total
            && q.dl_is_empty()
        {
            // Only one class has tasks and none has a deadline: its FIFO head wins.
            let id = q.fifo_head(tasks).expect("a queued task").task;
            q.take(id, tasks);
            self.n -= 1;
            self.adherent = true;
            return Some(id);
        }
        let sc = &self.sc;
        let mut best: Option<Cand> = None;
        let mut best_score = -1.0;
        let mut best_dl = 0.0;
        let mut first: Option<usize> = None;
        for (c, q) in self.classes.iter_mut().enumerate() {
            if q.n() == 0 {
                continue;
            }
            first.get_or_insert(c);
            let dl_empty = q.dl_is_empty();
            let bound = if dl_empty {
                self.bound[c].0
            } else {
                self.bound[c].1
            };
            if bound < best_score {
                continue;
            }
            let e = q.fifo_head(tasks).expect("a queued task");
            // Only a class with deadlines needs the head's record for its latest start.
            let ls = if q.no_deadlines() {
                None
            } else {
                tasks[&e.task].latest_start
            };
            let head = Cand {
                task: e.task,
                cls: c,
                eligible_at: e.key,
                seq: e.seq,
                latest_start: ls,
            };
            let (rate, cap) = self.age[c];
            let age = rate * (now - head.eligible_at);
            let mut s = sc.base[c] + if age < cap { age } else { cap };
            if let Some(ls) = ls {
                s += urgency(ls, now, sc);
            }
            let (mut cand, mut cand_s) = (head, s);
            if !dl_empty
                && let Some(d) = q.dl_head(tasks)
                && d.task != head.task
            {
                let dls = d.key;
                let d = Cand {
                    task: d.task,
                    cls: c,
                    eligible_at: tasks[&d.task].eligible_at,
                    seq: d.seq,
                    latest_start: Some(dls),
                };
                let age = rate * (now - d.eligible_at);
                let mut ds = sc.base[c] + if age < cap { age } else { cap };
                ds += urgency(dls, now, sc);
                if ds > s || (ds == s && ls.is_none_or(|ls| dls < ls)) {
                    (cand, cand_s) = (d, ds);
                }
            }
            let cdl = cand.latest_start.unwrap_or(f64::INFINITY);
            match best {
                Some(b) if cand_s <= best_score => {
                    if cand_s == best_score
                        && (cdl < best_dl
                            || (cdl == best_dl
                                && (cand.eligible_at < b.eligible_at
                                    || (cand.eligible_at == b.eligible_at && cand.seq < b.seq))))
                    {
                        best = Some(cand);
                        best_dl = cdl;
                    }
                }
                _ => {
                    best = Some(cand);
                    best_score = cand_s;
                    best_dl = cdl;
                }
            }
        }
        let best = best.expect("a non-empty class");
        self.classes[best.cls].take(best.task, tasks);
        self.n -= 1;
        self.adherent = Some(best.cls) == first;
        Some(best.task)
    }
}
