//! Fair-share ready queue of one priority class (Python: `cronoq.core.fair`): start-time fair
//! queueing between tenants. The Python module docstring states the rules (groups, virtual
//! times, order, arithmetic); this is the same structure, operation for operation.
//!
//! What reaches a decision, and so is kept exactly as Python keeps it:
//! * `vt = base + count / weight`, one rounding (ties between tenants fall on submission order);
//! * an idle group re-enters at `max(vt, V)`, `V` being the start tag of the last dispatch;
//! * the deadline heap's dead entries: `ReadyQueues::pop_best` reads whether it is empty, and
//!   it is cleared when the queue empties and rebuilt from its live entries once it holds more
//!   than `2 * n + 64`, exactly when Python's is.
//!
//! Python's `oldest()` / `newest()` keep extra lazy heaps; their answers (the smallest
//! `(eligible_at, seq)`, the largest `seq` among queued tasks) are computed here from the
//! groups' heaps instead: the same task, and nothing else of those heaps is ever observed.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use crate::heaps::{QEntry, TaskHeap, is_live, live_head};
use crate::model::{ConfigError, TaskId, TaskRecord, py_cmp};
use crate::state::Tasks;

/// Python's `ValueError` message for a weight that is not finite and > 0.
pub const WEIGHTS_MESSAGE: &str = "tenant weights must be finite and > 0";

/// A lazy heap is rebuilt once it holds more than `2 * live + SLACK` entries.
const SLACK: usize = 64;

/// Checked tenant weights (a name listed twice keeps its last weight, as in a Python dict).
pub fn weights(list: &[(String, f64)]) -> Result<HashMap<Arc<str>, f64>, ConfigError> {
    let mut out = HashMap::with_capacity(list.len());
    for (tenant, w) in list {
        if !w.is_finite() || *w <= 0.0 {
            return Err(ConfigError(WEIGHTS_MESSAGE.into()));
        }
        out.insert(Arc::from(tenant.as_str()), *w);
    }
    Ok(out)
}

/// One tenant (or the untenanted group) of one class queue.
#[derive(Debug)]
struct Group {
    weight: f64,
    /// `vt = base + count / weight`.
    base: f64,
    count: u64,
    vt: f64,
    /// Queued tasks by `(eligible_at, seq)`; the top is always live.
    heap: TaskHeap,
    n: i64,
    /// Generation of its live entry in `fifo`; 0: none (idle).
    generation: u64,
}

/// An active group in `fifo`, keyed `(vt, head eligible_at, head seq)`; `generation` is unique
/// per queue, so entries never tie completely and any correct heap pops them in heapq's order.
#[derive(Clone, Copy, Debug)]
struct GroupEntry {
    vt: f64,
    eligible_at: f64,
    seq: u64,
    generation: u64,
    group: usize,
}

impl Ord for GroupEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: std's heap is a max-heap, heapq a min-heap.
        py_cmp(other.vt, self.vt)
            .then(py_cmp(other.eligible_at, self.eligible_at))
            .then(other.seq.cmp(&self.seq))
            .then(other.generation.cmp(&self.generation))
    }
}

impl PartialOrd for GroupEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for GroupEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for GroupEntry {}

/// Ready tasks of one priority class, ordered by start-time fair queueing between tenants.
#[derive(Debug)]
pub struct FairClassQueue {
    weights: Arc<HashMap<Arc<str>, f64>>,
    index: HashMap<Option<Arc<str>>, usize>,
    groups: Vec<Group>,
    generation: u64,
    active: usize,
    fifo: BinaryHeap<GroupEntry>,
    /// Deadline tasks by `(latest_start, seq)`, dead entries included.
    pub(crate) dl: TaskHeap,
    /// Tasks queued.
    pub n: i64,
    /// System virtual time: the start tag of the most recently dispatched task.
    vnow: f64,
}

impl FairClassQueue {
    /// An empty queue with these (checked) weights.
    pub fn new(weights: Arc<HashMap<Arc<str>, f64>>) -> Self {
        FairClassQueue {
            weights,
            index: HashMap::new(),
            groups: Vec::new(),
            generation: 0,
            active: 0,
            fifo: BinaryHeap::new(),
            dl: TaskHeap::new(),
            n: 0,
            vnow: 0.0,
        }
    }

    /// Add a ready task (bumps `rec.qgen`).
    pub fn push(&mut self, rec: &mut TaskRecord) {
        rec.qgen += 1;
        let g = rec.qgen;
        let gi = match self.index.get(&rec.tenant) {
            Some(&gi) => gi,
            None => {
                let weight = rec
                    .tenant
                    .as_ref()
                    .and_then(|t| self.weights.get(t).copied())
                    .unwrap_or(1.0);
                self.groups.push(Group {
                    weight,
                    base: 0.0,
                    count: 0,
                    vt: 0.0,
                    heap: TaskHeap::new(),
                    n: 0,
                    generation: 0,
                });
                self.index.insert(rec.tenant.clone(), self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        let entry = QEntry {
            key: rec.eligible_at,
            seq: rec.seq,
            generation: g,
            task: rec.id,
        };
        let vnow = self.vnow;
        let grp = &mut self.groups[gi];
        grp.heap.push(entry);
        if grp.n == 0 {
            // Idle -> active: never behind the system virtual time.
            if grp.vt < vnow {
                grp.base = vnow;
                grp.vt = vnow;
                grp.count = 0;
            }
            grp.n = 1;
            self.active += 1;
            self.file(gi);
        } else {
            grp.n += 1;
            if grp
                .heap
                .peek()
                .is_some_and(|e| e.seq == entry.seq && e.generation == g)
            {
                self.file(gi);
            }
        }
        if let Some(ls) = rec.latest_start {
            self.dl.push(QEntry { key: ls, ..entry });
        }
        self.n += 1;
    }

    /// A queued task leaves without being dispatched: no virtual time changes.
    pub fn discard(&mut self, id: TaskId, tasks: &mut Tasks) {
        let (gi, was_head) = self.remove(id, tasks);
        if was_head && self.groups[gi].n != 0 {
            self.file(gi);
        }
    }

    /// A queued task was dispatched: remove it and advance its tenant's virtual time.
    pub fn take(&mut self, id: TaskId, tasks: &mut Tasks) {
        let (gi, _) = self.remove(id, tasks);
        let grp = &mut self.groups[gi];
        self.vnow = grp.vt;
        grp.count += 1;
        grp.vt = grp.base + grp.count as f64 / grp.weight;
        if grp.n != 0 {
            self.file(gi);
        }
    }

    fn remove(&mut self, id: TaskId, tasks: &mut Tasks) -> (usize, bool) {
        let rec = tasks.get_mut(&id).expect("a queued task is held");
        let gi = self.index[&rec.tenant];
        let grp = &mut self.groups[gi];
        let was_head = grp.heap.peek().is_some_and(|e| e.task == id);
        rec.qgen += 1;
        let tasks: &Tasks = tasks;
        self.n -= 1;
        let n = self.n;
        grp.n -= 1;
        if grp.n == 0 {
            grp.heap = TaskHeap::new();
            grp.generation = 0;
            self.active -= 1;
            if n == 0 {
                // Nothing queued: drop every stale entry at once.
                self.fifo.clear();
                self.dl.clear();
                return (gi, was_head);
            }
        } else if was_head {
            while grp.heap.peek().is_some_and(|e| !is_live(e, tasks)) {
                grp.heap.pop();
            }
        } else if grp.heap.len() > 2 * grp.n as usize + SLACK {
            grp.heap.retain(|e| is_live(e, tasks));
        }
        if self.dl.len() > 2 * n as usize + SLACK {
            self.dl.retain(|e| is_live(e, tasks));
        }
        (gi, was_head)
    }

    /// (Re-)enter an active group in `fifo` under its current key.
    fn file(&mut self, gi: usize) {
        self.generation += 1;
        let grp = &mut self.groups[gi];
        grp.generation = self.generation;
        let head = grp.heap.peek().expect("an active group has a task");
        self.fifo.push(GroupEntry {
            vt: grp.vt,
            eligible_at: head.key,
            seq: head.seq,
            generation: self.generation,
            group: gi,
        });
        if self.fifo.len() > 2 * self.active + SLACK {
            let groups = &self.groups;
            self.fifo
                .retain(|e| groups[e.group].generation == e.generation);
        }
    }

    /// The task fair queueing dispatches next (its entry in its group's heap).
    pub fn fifo_head(&mut self) -> Option<QEntry> {
        while let Some(e) = self.fifo.peek() {
            let grp = &self.groups[e.group];
            if grp.generation == e.generation {
                return grp.heap.peek().copied();
            }
            self.fifo.pop();
        }
        None
    }

    /// The queued task with the earliest latest start (ties by seq).
    pub fn dl_head(&mut self, tasks: &Tasks) -> Option<QEntry> {
        // Liveness is unknown without a look: -1 never equals the heap's length.
        live_head(&mut self.dl, tasks, -1)
    }

    /// The queued task with the smallest `(eligible_at, seq)`, whatever its tenant: the
    /// smallest of the active groups' heads (which are live).
    pub fn oldest(&self) -> Option<TaskId> {
        self.groups
            .iter()
            .filter(|g| g.n != 0)
            .filter_map(|g| g.heap.peek())
            .max() // entries order reversed, as the heaps want: the greatest is the smallest
            .map(|e| e.task)
    }

    /// The most recently admitted queued task (largest seq), whatever its tenant: a scan,
    /// only used under overload.
    pub fn newest(&self, tasks: &Tasks) -> Option<TaskId> {
        self.groups
            .iter()
            .flat_map(|g| g.heap.iter())
            .filter(|e| is_live(e, tasks))
            .max_by_key(|e| e.seq)
            .map(|e| e.task)
    }

    /// The tenant's current virtual time (0.0 if never seen); for tests and diagnostics.
    pub fn virtual_time(&self, tenant: Option<&str>) -> f64 {
        let key: Option<Arc<str>> = tenant.map(Arc::from);
        self.index.get(&key).map_or(0.0, |&gi| self.groups[gi].vt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskSpec;

    /// Tasks and a fair queue over them; `add` admits one at `eligible_at` (seq = id).
    struct Fixture {
        tasks: Tasks,
        q: FairClassQueue,
    }

    impl Fixture {
        fn new(weights: &[(&str, f64)]) -> Self {
            let list: Vec<(String, f64)> = weights.iter().map(|&(t, w)| (t.into(), w)).collect();
            Fixture {
                tasks: Tasks::default(),
                q: FairClassQueue::new(Arc::new(super::weights(&list).unwrap())),
            }
        }

        fn add(&mut self, tenant: Option<&str>, eligible_at: f64, latest_start: Option<f64>) {
            let spec = TaskSpec {
                tenant,
                ..TaskSpec::new("p")
            };
            let mut rec = TaskRecord::from_spec(spec, 0, 0);
            rec.id = self.tasks.len() as TaskId + 1;
            rec.seq = rec.id;
            rec.eligible_at = eligible_at;
            rec.latest_start = latest_start;
            self.q.push(&mut rec);
            self.tasks.insert(rec.id, rec);
        }

        /// Dispatch the head; its id.
        fn pop(&mut self) -> TaskId {
            let id = self.q.fifo_head().expect("a queued task").task;
            self.q.take(id, &mut self.tasks);
            id
        }
    }

    #[test]
    fn weights_share_turns_and_exact_ties_go_to_the_earlier_submission() {
        let mut f = Fixture::new(&[("a", 3.0)]);
        for _ in 0..4 {
            f.add(Some("a"), 0.0, None); // ids 1..=4
        }
        f.add(Some("b"), 0.0, None); // 5
        f.add(Some("b"), 0.0, None); // 6
        // a at 0, 1/3, 2/3 and b at 0: then a's fourth at vt exactly 1.0 ties b's second, and
        // the earlier submission (4 before 6) wins.
        let order: Vec<TaskId> = (0..6).map(|_| f.pop()).collect();
        assert_eq!(order, [1, 5, 2, 3, 4, 6]);
        assert_eq!(f.q.virtual_time(Some("a")), 4.0 / 3.0);
        assert_eq!(f.q.virtual_time(Some("b")), 2.0);
    }

    #[test]
    fn an_idle_tenant_reenters_at_the_system_virtual_time() {
        let mut f = Fixture::new(&[]);
        for _ in 0..5 {
            f.add(Some("a"), 0.0, None);
        }
        for _ in 0..4 {
            f.pop();
        }
        // a's vt is 4 and its last dispatch started at 3: b, new, starts at 3, not 0.
        f.add(Some("b"), 1.0, None); // 6
        assert_eq!(f.q.virtual_time(Some("b")), 3.0);
        f.add(None, 2.0, None); // 7: the untenanted group likewise
        assert_eq!(f.q.virtual_time(None), 3.0);
        assert_eq!([f.pop(), f.pop(), f.pop()], [6, 7, 5]);
    }

    #[test]
    fn a_discard_changes_no_virtual_time() {
        let mut f = Fixture::new(&[]);
        f.add(Some("a"), 0.0, None);
        f.add(Some("a"), 0.0, None);
        f.add(Some("b"), 0.0, None);
        f.q.discard(1, &mut f.tasks);
        assert_eq!(f.q.virtual_time(Some("a")), 0.0);
        assert_eq!([f.pop(), f.pop()], [2, 3]);
        assert_eq!(f.q.n, 0);
    }

    #[test]
    fn dead_deadline_entries_go_when_the_queue_empties_or_outnumber_the_live() {
        let mut f = Fixture::new(&[]);
        f.add(Some("keep"), 0.0, None); // 1: stays queued
        for i in 0..66 {
            f.add(Some("a"), 0.0, Some(100.0 - f64::from(i)));
            let id = f.tasks.len() as TaskId;
            f.q.discard(id, &mut f.tasks);
        }
        // 66 dead entries, 1 task queued: not yet more than 2 * 1 + 64.
        assert_eq!(f.q.dl.len(), 66);
        f.add(Some("a"), 0.0, Some(1.0));
        f.q.discard(68, &mut f.tasks);
        assert!(
            f.q.dl.is_empty(),
            "67 > 66 dead entries: rebuilt from the live (none)"
        );
        f.add(Some("a"), 0.0, Some(1.0)); // 69
        f.q.discard(69, &mut f.tasks);
        assert_eq!(f.q.dl.len(), 1, "a dead entry waits for its turn");
        f.pop();
        assert!(
            f.q.dl.is_empty(),
            "the queue emptied: every stale entry dropped"
        );
    }

    #[test]
    fn weights_must_be_finite_and_positive() {
        for w in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            let err = weights(&[("a".into(), 2.0), ("b".into(), w)]).unwrap_err();
            assert_eq!(err.0, WEIGHTS_MESSAGE);
        }
        assert_eq!(
            weights(&[("a".into(), 2.0), ("a".into(), 0.5)]).unwrap()["a"],
            0.5
        );
    }

    #[test]
    fn oldest_and_newest_look_across_tenants() {
        let mut f = Fixture::new(&[]);
        f.add(Some("a"), 5.0, None); // 1
        f.add(Some("b"), 1.0, None); // 2
        f.add(Some("a"), 0.5, None); // 3
        assert_eq!(f.q.oldest(), Some(3));
        assert_eq!(f.q.newest(&f.tasks), Some(3));
        f.q.discard(3, &mut f.tasks);
        assert_eq!(f.q.oldest(), Some(2));
        assert_eq!(f.q.newest(&f.tasks), Some(2));
    }
}
