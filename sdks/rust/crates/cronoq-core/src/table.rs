//! The engine's table of tasks by id (Python: the `tasks` dict of `cronoq.core.state`).
//!
//! Ids are dense and ascending, and tasks are admitted and mostly forgotten in id order, so the
//! table is a window of slots indexed by `id - base`: a lookup is an index, and neighbouring
//! tasks sit in neighbouring slots. Slots of forgotten tasks leave holes; the window's front
//! moves on past them, and when holes would outnumber the tasks twice over (a task that lives
//! on while many after it come and go), the tasks at the front move to a map of stragglers, so
//! memory stays proportional to the tasks held. No decision of the ported rules iterates the
//! table (Python's dict order would matter there: insertion order, which is id order for them).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Index;

use crate::model::{TaskId, TaskRecord};

/// A hasher for small keys the engine controls (ids, pool names, kinds): a multiplicative
/// mix, cheaper than std's SipHash. User keys keep std's hasher.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// `BuildHasher` of `FastHasher`.
pub type FastBuild = BuildHasherDefault<FastHasher>;

/// The live and retained tasks by id, each boxed so that a record never moves.
#[derive(Debug, Default)]
pub struct Tasks {
    base: TaskId,
    slots: VecDeque<Option<Box<TaskRecord>>>,
    stragglers: HashMap<TaskId, Box<TaskRecord>, FastBuild>,
    len: usize,
}

impl Tasks {
    /// Tasks held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no task is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, id: TaskId) -> Option<usize> {
        let i = id.checked_sub(self.base)?;
        usize::try_from(i).ok().filter(|&i| i < self.slots.len())
    }

    /// The task with this id.
    pub fn get(&self, id: &TaskId) -> Option<&TaskRecord> {
        match self.slot(*id) {
            Some(i) => self.slots[i].as_deref(),
            None => self.stragglers.get(id).map(|r| &**r),
        }
    }

    /// The task with this id, to change.
    pub fn get_mut(&mut self, id: &TaskId) -> Option<&mut TaskRecord> {
        match self.slot(*id) {
            Some(i) => self.slots[i].as_deref_mut(),
            None => self.stragglers.get_mut(id).map(|r| &mut **r),
        }
    }

    /// Whether a task with this id is held.
    pub fn contains_key(&self, id: &TaskId) -> bool {
        self.get(id).is_some()
    }

    /// Hold a task under its id (not held yet).
    pub fn insert(&mut self, id: TaskId, rec: Box<TaskRecord>) {
        if self.slots.is_empty() && id >= self.base {
            self.base = id;
        }
        let old = if id < self.base {
            self.stragglers.insert(id, rec)
        } else {
            let i = usize::try_from(id - self.base).expect("a window within memory");
            if i >= self.slots.len() {
                self.slots.resize_with(i + 1, || None);
            }
            self.slots[i].replace(rec)
        };
        assert!(old.is_none(), "task {id} is held already");
        self.len += 1;
    }

    /// Drop the task with this id from the table; returns it.
    pub fn remove(&mut self, id: &TaskId) -> Option<Box<TaskRecord>> {
        let rec = match self.slot(*id) {
            Some(i) => self.slots[i].take(),
            None => self.stragglers.remove(id),
        }?;
        self.len -= 1;
        while self.slots.len() > 2 * self.len + 1024 {
            if let Some(Some(front)) = self.slots.pop_front() {
                self.stragglers.insert(self.base, front);
            }
            self.base += 1;
        }
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(rec)
    }

    /// The tasks held, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &TaskRecord> {
        self.stragglers
            .values()
            .map(|r| &**r)
            .chain(self.slots.iter().filter_map(|s| s.as_deref()))
    }
}

impl Index<&TaskId> for Tasks {
    type Output = TaskRecord;

    fn index(&self, id: &TaskId) -> &TaskRecord {
        self.get(id).expect("a held task")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskSpec;

    fn rec(id: TaskId) -> Box<TaskRecord> {
        let mut r = TaskRecord::from_spec(TaskSpec::new("p"), 0, 0);
        r.id = id;
        Box::new(r)
    }

    #[test]
    fn a_long_lived_task_moves_aside_and_the_window_stays_small() {
        let mut t = Tasks::default();
        t.insert(1, rec(1));
        for id in 2..10_000 {
            t.insert(id, rec(id));
            t.remove(&id);
        }
        assert_eq!(t.len(), 1);
        assert!(t.slots.len() <= 1026, "window {}", t.slots.len());
        assert_eq!(t.get(&1).unwrap().id, 1);
        assert!(t.get(&5).is_none());
        t.insert(10_000, rec(10_000));
        assert_eq!(t.values().count(), 2);
        assert_eq!(t.remove(&1).unwrap().id, 1);
        assert!(t.remove(&1).is_none());
        assert_eq!(t[&10_000].id, 10_000);
    }
}
