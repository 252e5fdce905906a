//! The engine's tables keyed by numbers it hands out in ascending order: tasks by id (Python:
//! the `tasks` dict of `cronoq.core.state`) and running attempts by lease (Python: the
//! `running` dict).
//!
//! Such keys are dense and mostly retired in the order they were given, so a table is a window
//! of slots indexed by `key - base`, values held in place: a lookup is an index, and values
//! given out one after another sit side by side in memory, so the loop's walk along them
//! (admitting, dispatching the oldest, forgetting the oldest ended) reads memory in order,
//! which the processor prefetches. Slots of removed values leave holes; the window's front
//! moves on past them, and when the window would span more than `SPREAD` slots per value held
//! (a value that stays while many after it come and go), the values at the front move to an
//! ordered map of stragglers, so memory stays proportional to the values held. Iteration is in key order,
//! which is Python's insertion order for both tables.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Index;

use crate::model::{Attempt, TaskRecord};

/// A hasher for small keys the engine controls (ids, pool names, kinds): a multiplicative
/// mix over 8 bytes at a time, cheaper than std's SipHash. User keys keep std's hasher.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    fn mix(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        let n = rest.len();
        if n >= 4 {
            // two overlapping words cover the 4 to 7 bytes
            let word = |i: usize| {
                u64::from(u32::from_le_bytes(
                    rest[i..i + 4].try_into().expect("4 bytes"),
                ))
            };
            self.mix(word(0) | (word(n - 4) << 32));
        } else if n > 0 {
            self.mix(rest.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// `BuildHasher` of `FastHasher`.
pub type FastBuild = BuildHasherDefault<FastHasher>;

/// Most slots the window spans per value held, beyond `SLACK`: room for a backlog of one
/// class that waits while other classes pass it (one id in four, three in four ended and
/// retained), without moving it aside. A hole costs a slot, as big as a value.
const SPREAD: usize = 4;
/// Slots the window may span beyond `SPREAD` per value.
const SLACK: usize = 1024;

/// Values by an ascending number the engine gives out (see the module docs).
#[derive(Debug)]
pub struct Window<V> {
    base: u64,
    slots: VecDeque<Option<V>>,
    stragglers: BTreeMap<u64, V>,
    len: usize,
}

/// The live and retained tasks by id.
pub type Tasks = Window<TaskRecord>;

/// The running attempts by lease, in lease order (start order).
pub type Running = Window<Attempt>;

impl<V> Default for Window<V> {
    fn default() -> Self {
        Window {
            base: 0,
            slots: VecDeque::new(),
            stragglers: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<V> Window<V> {
    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no value is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn slot(&self, key: u64) -> Option<usize> {
        let i = key.wrapping_sub(self.base);
        if i < self.slots.len() as u64 {
            Some(i as usize)
        } else {
            None
        }
    }

    /// The value under this key.
    #[inline]
    pub fn get(&self, key: &u64) -> Option<&V> {
        match self.slot(*key) {
            Some(i) => self.slots[i].as_ref(),
            None if *key < self.base => self.stragglers.get(key),
            None => None,
        }
    }

    /// The value under this key, to change.
    #[inline]
    pub fn get_mut(&mut self, key: &u64) -> Option<&mut V> {
        match self.slot(*key) {
            Some(i) => self.slots[i].as_mut(),
            None if *key < self.base => self.stragglers.get_mut(key),
            None => None,
        }
    }

    /// Whether a value is held under this key.
    pub fn contains_key(&self, key: &u64) -> bool {
        self.get(key).is_some()
    }

    /// Hold a value under its key (not held yet).
    ///
    /// # Panics
    /// If the key is held already.
    pub fn insert(&mut self, key: u64, value: V) {
        if self.slots.is_empty() && key >= self.base {
            self.base = key;
        }
        let old = if key < self.base {
            self.stragglers.insert(key, value)
        } else if key - self.base == self.slots.len() as u64 {
            self.slots.push_back(Some(value));
            None
        } else {
            if key - self.base > (self.slots.len() + SPREAD * self.len + SLACK) as u64 {
                self.jump(key);
            }
            let i = usize::try_from(key - self.base).expect("a window within memory");
            if i >= self.slots.len() {
                self.slots.resize_with(i + 1, || None);
            }
            self.slots[i].replace(value)
        };
        assert!(old.is_none(), "key {key} is held already");
        self.len += 1;
    }

    /// A key far past the window (the ids of a new leadership epoch, `epoch << 48 | n`): the
    /// window starts afresh at it, the values held move aside.
    #[cold]
    fn jump(&mut self, key: u64) {
        let base = self.base;
        for (i, slot) in std::mem::take(&mut self.slots).into_iter().enumerate() {
            if let Some(v) = slot {
                self.stragglers.insert(base + i as u64, v);
            }
        }
        self.base = key;
    }

    /// Drop the value under this key from the table; returns it.
    pub fn remove(&mut self, key: &u64) -> Option<V> {
        let value = match self.slot(*key) {
            Some(i) => self.slots[i].take(),
            None => self.stragglers.remove(key),
        }?;
        self.removed();
        Some(value)
    }

    /// Drop the value under this key, in place (no copy of it is returned); whether it was
    /// held.
    pub fn delete(&mut self, key: &u64) -> bool {
        match self.slot(*key) {
            Some(i) if self.slots[i].is_some() => self.slots[i] = None,
            Some(_) => return false,
            None => {
                if self.stragglers.remove(key).is_none() {
                    return false;
                }
            }
        }
        self.removed();
        true
    }

    /// One value fewer: move the window's front past the holes (and sparse values aside).
    fn removed(&mut self) {
        self.len -= 1;
        while self.slots.len() > SPREAD * self.len + SLACK {
            if let Some(Some(front)) = self.slots.pop_front() {
                self.stragglers.insert(self.base, front);
            }
            self.base += 1;
        }
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
    }

    /// The keys and values held, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        let base = self.base;
        self.stragglers.iter().map(|(&k, v)| (k, v)).chain(
            self.slots
                .iter()
                .enumerate()
                .filter_map(move |(i, s)| s.as_ref().map(|v| (base + i as u64, v))),
        )
    }

    /// The keys held, in order.
    pub fn keys(&self) -> impl Iterator<Item = u64> {
        self.iter().map(|(k, _)| k)
    }

    /// The values held, in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

impl<V> Index<&u64> for Window<V> {
    type Output = V;

    fn index(&self, key: &u64) -> &V {
        self.get(key).expect("a held key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{TaskId, TaskSpec};
    use proptest::prelude::*;

    fn rec(id: TaskId) -> TaskRecord {
        let mut r = TaskRecord::from_spec(TaskSpec::new("p"), 0, 0);
        r.id = id;
        r
    }

    #[test]
    fn short_names_differing_in_one_byte_hash_apart() {
        use std::hash::BuildHasher;
        let h = |s: &[u8]| FastBuild::default().hash_one(s);
        for len in 1..=17 {
            let base = vec![b'a'; len];
            for i in 0..len {
                let mut other = base.clone();
                other[i] = b'b';
                assert_ne!(h(&base), h(&other), "length {len}, byte {i}");
            }
        }
    }

    #[test]
    fn a_jump_in_keys_moves_the_window() {
        let mut t: Window<TaskRecord> = Window::default();
        let (old, new) = (1 << 48 | 1, 2 << 48 | 1);
        t.insert(old, rec(old));
        t.insert(old + 1, rec(old + 1));
        t.insert(new, rec(new));
        assert!(t.slots.len() <= SPREAD + SLACK, "window {}", t.slots.len());
        assert_eq!(t.keys().collect::<Vec<_>>(), vec![old, old + 1, new]);
        assert_eq!(t.get(&(old + 1)).map(|r| r.id), Some(old + 1));
        assert_eq!(t.remove(&old).map(|r| r.id), Some(old));
        t.insert(new + 1, rec(new + 1));
        assert_eq!(t.len(), 3);
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
        assert!(t.slots.len() <= SPREAD + SLACK, "window {}", t.slots.len());
        assert_eq!(t.get(&1).unwrap().id, 1);
        assert!(t.get(&5).is_none());
        t.insert(10_000, rec(10_000));
        assert_eq!(t.values().count(), 2);
        assert_eq!(t.remove(&1).unwrap().id, 1);
        assert!(t.remove(&1).is_none());
        assert_eq!(t[&10_000].id, 10_000);
    }

    proptest! {
        /// Any mix of fresh keys (ascending, with gaps, now and then below the window),
        /// removals and deletions leaves the table equal to an ordered map, iteration order included.
        #[test]
        fn behaves_as_an_ordered_map(
            ops in proptest::collection::vec((0u8..8, 0u64..2000), 0..3000),
        ) {
            let mut t: Window<u64> = Window::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut next = 1u64;
            for (op, n) in ops {
                match op {
                    0..=3 => {
                        next += n % 3;
                        t.insert(next, next * 7);
                        model.insert(next, next * 7);
                        next += 1;
                    }
                    4 => {
                        // a key below the window's front, not held (a restored task)
                        if let Some(k) = (1..next).rev().find(|k| !model.contains_key(k)) {
                            t.insert(k, k * 7);
                            model.insert(k, k * 7);
                        }
                    }
                    _ => {
                        let k = model.keys().nth(n as usize % model.len().max(1)).copied();
                        let k = k.unwrap_or(n);
                        if n % 2 == 0 {
                            prop_assert_eq!(t.remove(&k), model.remove(&k));
                        } else {
                            prop_assert_eq!(t.delete(&k), model.remove(&k).is_some());
                        }
                    }
                }
                prop_assert_eq!(t.len(), model.len());
            }
            prop_assert!(t.slots.len() <= SPREAD * t.len() + SLACK);
            let got: Vec<(u64, u64)> = t.iter().map(|(k, &v)| (k, v)).collect();
            let want: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
            prop_assert_eq!(got, want);
            for k in 0..next + 2 {
                prop_assert_eq!(t.get(&k), model.get(&k));
            }
        }
    }
}
