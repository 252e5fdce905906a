//! Worker groups: labeled slots inside a pool (Python: `cronoq.core.groups`).
//!
//! A pool's capacity is its unlabeled slots plus the slots of its groups. A task with labels
//! runs only on a group whose labels contain all of them (subset match); a task without labels
//! runs on any slot, unlabeled slots first. A labeled task that finds no free matching slot is
//! parked here (out of the ready queues, so it blocks nobody) until a matching group has a free
//! slot.
//!
//! Python keeps the groups in a dict by label set (a frozenset), so they are looked at in the
//! order they were declared; here they are a list in that order, each keyed by its labels
//! sorted. Attempts name their group by that key: a group is dropped only when it has no slot
//! and no attempt on it, so the key of a running attempt's group always finds that group.

use std::sync::Arc;

use crate::model::{TaskId, TaskRecord};
use crate::parking::Parked;
use crate::resources::{ParkEntry, ParkHeap};
use crate::state::Tasks;

/// Labels as a dict keeps them: unique names, in the order first given.
pub type Labels = Arc<[(Arc<str>, Arc<str>)]>;

/// A set of labels (Python's frozenset of items): sorted, so equal sets are equal keys.
pub type LabelKey = Arc<[(Arc<str>, Arc<str>)]>;

/// Label pairs as a Python dict made from them keeps them: a name given twice keeps its first
/// place and its last value.
pub fn labels_of(pairs: &[(&str, &str)]) -> Vec<(Arc<str>, Arc<str>)> {
    let mut out: Vec<(Arc<str>, Arc<str>)> = Vec::with_capacity(pairs.len());
    for &(name, value) in pairs {
        match out.iter_mut().find(|(n, _)| &**n == name) {
            Some(entry) => entry.1 = Arc::from(value),
            None => out.push((Arc::from(name), Arc::from(value))),
        }
    }
    out
}

/// The set of these labels (unique names).
pub fn label_key(labels: &[(Arc<str>, Arc<str>)]) -> LabelKey {
    let mut key = labels.to_vec();
    key.sort_unstable();
    key.into()
}

/// Slots that carry exactly `labels`.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// Its labels, as first declared.
    pub labels: Labels,
    /// Their set.
    pub key: LabelKey,
    /// Its slots.
    pub capacity: i64,
    /// Attempts running on it.
    pub busy: i64,
}

impl Group {
    /// Whether it carries every one of a task's labels (a subset match).
    pub fn serves(&self, wanted: &[(Arc<str>, Arc<str>)]) -> bool {
        wanted
            .iter()
            .all(|pair| self.key.binary_search(pair).is_ok())
    }
}

/// Where a task may run now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// On an unlabeled slot.
    Unlabeled,
    /// On a slot of this group (its index in `Groups::by_key`).
    Group(usize),
    /// Nowhere: no free slot serves it.
    Full,
}

/// The groups of one pool and the labeled tasks waiting for one of them.
#[derive(Debug, Default)]
pub struct Groups {
    /// The groups, in the order they were declared.
    pub by_key: Vec<Group>,
    /// Attempts running on unlabeled slots.
    pub unlabeled_busy: i64,
    /// Labeled tasks waiting for a slot, best first.
    pub parked: ParkHeap,
}

impl Groups {
    /// The index of the group carrying exactly this set of labels.
    pub fn position(&self, key: &[(Arc<str>, Arc<str>)]) -> Option<usize> {
        self.by_key.iter().position(|g| *g.key == *key)
    }

    /// The slots of every group.
    pub fn total(&self) -> i64 {
        self.by_key.iter().map(|g| g.capacity).sum()
    }

    /// Declare or resize the group carrying exactly `labels`; its index, None when it is
    /// dropped (no slot and nothing running on it).
    pub fn set(&mut self, labels: Vec<(Arc<str>, Arc<str>)>, capacity: i64) -> Option<usize> {
        let key = label_key(&labels);
        let g = match self.position(&key) {
            Some(g) => {
                self.by_key[g].capacity = capacity;
                g
            }
            None => {
                self.by_key.push(Group {
                    labels: labels.into(),
                    key,
                    capacity,
                    busy: 0,
                });
                self.by_key.len() - 1
            }
        };
        if capacity == 0 && self.by_key[g].busy == 0 {
            self.by_key.remove(g);
            return None;
        }
        Some(g)
    }

    /// The slot for a task with these labels (None or empty: unlabeled).
    pub fn pick(&self, labels: Option<&[(Arc<str>, Arc<str>)]>, unlabeled_capacity: i64) -> Pick {
        let free = |g: &&Group| g.busy < g.capacity;
        match labels {
            Some(wanted) if !wanted.is_empty() => self
                .by_key
                .iter()
                .position(|g| free(&g) && g.serves(wanted))
                .map_or(Pick::Full, Pick::Group),
            _ if self.unlabeled_busy < unlabeled_capacity => Pick::Unlabeled,
            _ => self
                .by_key
                .iter()
                .position(|g| free(&g))
                .map_or(Pick::Full, Pick::Group),
        }
    }

    /// An attempt starts on the slot (None: unlabeled).
    pub fn occupy(&mut self, slot: Option<usize>) {
        match slot {
            None => self.unlabeled_busy += 1,
            Some(g) => self.by_key[g].busy += 1,
        }
    }

    /// An attempt leaves the slot of this group (None: unlabeled); the group's index if it is
    /// still held (one without slots goes with its last attempt).
    pub fn vacate(&mut self, slot: Option<&LabelKey>) -> Option<usize> {
        let Some(key) = slot else {
            self.unlabeled_busy -= 1;
            return None;
        };
        let g = self
            .position(key)
            .expect("a running attempt's group is held");
        let group = &mut self.by_key[g];
        group.busy -= 1;
        if group.capacity == 0 && group.busy == 0 {
            self.by_key.remove(g);
            return None;
        }
        Some(g)
    }

    /// Park a ready task until a matching group has a free slot.
    pub fn park(&mut self, rec: &mut TaskRecord) {
        self.parked.push(ParkEntry::park(rec, 0));
        rec.parked = Some(Parked::Group);
    }

    /// Parked tasks that group `g` can serve now (as many as it has free slots), best first.
    pub fn unpark(&mut self, g: usize, tasks: &Tasks) -> Vec<TaskId> {
        let group = &self.by_key[g];
        let free = group.capacity - group.busy;
        if free <= 0 || self.parked.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut keep = Vec::new();
        while (out.len() as i64) < free {
            let Some(entry) = self.parked.pop() else {
                break;
            };
            let rec = tasks.get(&entry.task);
            if !entry.is_live(rec, Parked::Group) {
                continue;
            }
            let labels = rec.and_then(|r| r.labels.as_deref()).unwrap_or_default();
            if group.serves(labels) {
                out.push(entry.task);
            } else {
                keep.push(entry);
            }
        }
        self.parked.extend(keep);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(Arc<str>, Arc<str>)> {
        labels_of(pairs)
    }

    #[test]
    fn labels_keep_dict_order_and_match_as_sets() {
        let l = labels(&[("zone", "a"), ("gpu", "1"), ("zone", "b")]);
        assert_eq!(l, labels(&[("zone", "b"), ("gpu", "1")]));
        assert_eq!(
            label_key(&l),
            label_key(&labels(&[("gpu", "1"), ("zone", "b")]))
        );
        let mut gs = Groups::default();
        let g = gs.set(l, 1).unwrap();
        assert!(gs.by_key[g].serves(&labels(&[("gpu", "1")])));
        assert!(!gs.by_key[g].serves(&labels(&[("gpu", "2")])));
        assert!(!gs.by_key[g].serves(&labels(&[("gpu", "1"), ("os", "x")])));
    }

    #[test]
    fn unlabeled_tasks_take_unlabeled_slots_first_then_any_group() {
        let mut gs = Groups::default();
        gs.set(labels(&[("gpu", "1")]), 1);
        gs.set(labels(&[("zone", "a")]), 1);
        assert_eq!(gs.pick(None, 1), Pick::Unlabeled);
        gs.occupy(None);
        assert_eq!(gs.pick(Some(&[]), 1), Pick::Group(0));
        gs.occupy(Some(0));
        assert_eq!(gs.pick(None, 1), Pick::Group(1));
        let zone = labels(&[("zone", "a")]);
        assert_eq!(gs.pick(Some(&zone), 1), Pick::Group(1));
        gs.occupy(Some(1));
        assert_eq!(
            gs.pick(Some(&zone), 5),
            Pick::Full,
            "labeled: never unlabeled"
        );
    }

    #[test]
    fn a_group_without_slots_goes_with_its_last_attempt_and_comes_back_last() {
        let mut gs = Groups::default();
        let gpu = labels(&[("gpu", "1")]);
        gs.set(gpu.clone(), 1);
        gs.set(labels(&[("zone", "a")]), 2);
        gs.occupy(Some(0));
        let key = gs.by_key[0].key.clone();
        assert_eq!(
            gs.set(gpu.clone(), 0),
            Some(0),
            "kept while its attempt runs"
        );
        assert_eq!(gs.total(), 2);
        assert_eq!(gs.vacate(Some(&key)), None);
        assert_eq!(gs.by_key.len(), 1);
        assert_eq!(
            gs.set(gpu.clone(), 0),
            None,
            "declared without slots: not kept"
        );
        assert_eq!(gs.set(gpu, 3), Some(1), "declared again: after the others");
        assert_eq!(gs.total(), 5);
    }
}
