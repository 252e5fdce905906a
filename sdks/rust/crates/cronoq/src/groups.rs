//! Worker groups: labeled slots of a pool ([`Scheduler::set_group_capacity`](crate::Scheduler::set_group_capacity)).
//!
//! A pool's capacity is its unlabeled slots plus the slots of its groups. A task with labels
//! ([`Task::label`](crate::Task::label)) runs only on a group whose labels include all of
//! them; a task without labels runs on any slot, unlabeled ones first. The attempt's
//! [`TaskContext::group`](crate::TaskContext::group) names the group it runs on.

use std::sync::Arc;

use cronoq_core::pool::PoolState;

/// Label pairs, sorted by name: a worker group's labels ([`TaskContext::group`](crate::TaskContext::group)).
pub type Labels = Arc<[(Arc<str>, Arc<str>)]>;

/// One worker group of a pool in a [`PoolSnapshot`](crate::PoolSnapshot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSnapshot {
    /// Its labels, sorted by name (empty: the pool's unlabeled slots).
    pub labels: Vec<(Arc<str>, Arc<str>)>,
    /// Its slots.
    pub capacity: u32,
    /// Attempts running on it.
    pub busy: u32,
}

/// A pool's groups, the unlabeled slots first, then the groups in the order they were
/// declared.
pub(crate) fn snapshot(pool: &PoolState) -> Vec<GroupSnapshot> {
    let count = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
    let Some(groups) = &pool.groups else {
        return vec![GroupSnapshot {
            labels: Vec::new(),
            capacity: count(pool.capacity),
            busy: count(pool.busy),
        }];
    };
    let mut out = Vec::with_capacity(groups.by_key.len() + 1);
    out.push(GroupSnapshot {
        labels: Vec::new(),
        capacity: count(pool.unlabeled),
        busy: count(groups.unlabeled_busy),
    });
    out.extend(groups.by_key.iter().map(|g| GroupSnapshot {
        labels: g.key.to_vec(),
        capacity: count(g.capacity),
        busy: count(g.busy),
    }));
    out
}
