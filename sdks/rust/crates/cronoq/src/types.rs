//! The vocabulary shared by the scheduler's calls: ids, task references, priorities, statuses,
//! status events and listings.

use std::fmt;
use std::sync::Arc;

use cronoq_core::model::Status;

use crate::time::Time;

/// A task's id: `TaskId(1)`, `TaskId(2)`, … in admission order, per scheduler.
///
/// Rejected submissions and duplicates use no id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    /// The number, in decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// One attempt's lease: a new one for every attempt, counting from 1 per scheduler.
///
/// [`Executor::abort`](crate::Executor::abort) names the attempt it gives up by its lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    /// The number, in decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A pool by its index in configuration order: `scheduler.pools()[id.0 as usize]` is its
/// name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolId(pub u16);

/// A task named by id or by key.
///
/// Calls that look a task up take `impl Into<TaskRef>`, so a [`TaskId`] and a key (`&str`,
/// `String`) both work:
///
/// ```
/// use cronoq::{TaskId, TaskRef};
///
/// assert_eq!(TaskRef::from(TaskId(3)), TaskRef::Id(TaskId(3)));
/// assert_eq!(TaskRef::from("nightly"), TaskRef::Key("nightly".into()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TaskRef {
    /// By id.
    Id(TaskId),
    /// By the key it was submitted with.
    Key(Arc<str>),
}

impl From<TaskId> for TaskRef {
    fn from(id: TaskId) -> TaskRef {
        TaskRef::Id(id)
    }
}

impl From<&str> for TaskRef {
    fn from(key: &str) -> TaskRef {
        TaskRef::Key(key.into())
    }
}

impl From<String> for TaskRef {
    fn from(key: String) -> TaskRef {
        TaskRef::Key(key.into())
    }
}

impl From<Arc<str>> for TaskRef {
    fn from(key: Arc<str>) -> TaskRef {
        TaskRef::Key(key)
    }
}

impl fmt::Display for TaskRef {
    /// The id in decimal, or the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskRef::Id(id) => fmt::Display::fmt(id, f),
            TaskRef::Key(key) => f.write_str(key),
        }
    }
}

impl TaskRef {
    /// The engine's form of the reference.
    pub(crate) fn to_core(&self) -> cronoq_core::TaskRef<'_> {
        match self {
            TaskRef::Id(id) => cronoq_core::TaskRef::Id(id.0),
            TaskRef::Key(key) => cronoq_core::TaskRef::Key(key),
        }
    }
}

/// A task's priority class. Lower is more important: `Critical < Low`.
///
/// A more important class is always dispatched first; within a class, waiting time (aging) and
/// a nearing deadline (urgency) order the tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Priority {
    /// The most important class.
    Critical = 0,
    /// Before normal work.
    High = 1,
    /// The default.
    #[default]
    Normal = 2,
    /// Background work.
    Low = 3,
}

impl Priority {
    /// Every class, most important first.
    pub const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::High,
        Priority::Normal,
        Priority::Low,
    ];
    /// The number of classes.
    pub const COUNT: usize = 4;

    /// The class's index, 0 (critical) to 3 (low): the index of per-class arrays such as
    /// [`AutoscaleConfig::slo`](crate::AutoscaleConfig::slo) and
    /// [`PoolSnapshot::pending_by_class`](crate::PoolSnapshot::pending_by_class).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The class with this index.
    ///
    /// ```
    /// use cronoq::Priority;
    /// assert_eq!(Priority::from_index(1), Some(Priority::High));
    /// assert_eq!(Priority::from_index(4), None);
    /// ```
    pub fn from_index(index: usize) -> Option<Priority> {
        Priority::ALL.get(index).copied()
    }

    /// The lower-case name: `critical`, `high`, `normal` or `low`.
    pub fn name(self) -> &'static str {
        cronoq_core::vocab::PRIORITY_NAMES[self.index()]
    }
}

/// Where a task is in its life cycle.
///
/// Every task is first `Blocked` (attempt 0) and moves on at once when nothing holds it; the
/// last seven statuses are terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Admitted, waiting for something other than a slot.
    Blocked,
    /// Waiting for its fixed start.
    Scheduled,
    /// Waiting for a slot.
    Ready,
    /// An attempt runs.
    Running,
    /// Waiting for its retry backoff to pass.
    Retrying,
    /// Ended: an attempt succeeded.
    Succeeded,
    /// Ended: failed permanently (a permanent error, a panic).
    Failed,
    /// Ended: its last allowed attempt failed.
    DeadLettered,
    /// Ended: cancelled.
    Cancelled,
    /// Ended: skipped.
    Skipped,
    /// Ended: its fixed start was missed.
    Missed,
    /// Ended: shed under overload.
    Shed,
}

impl TaskStatus {
    const ALL: [TaskStatus; 12] = [
        TaskStatus::Blocked,
        TaskStatus::Scheduled,
        TaskStatus::Ready,
        TaskStatus::Running,
        TaskStatus::Retrying,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::DeadLettered,
        TaskStatus::Cancelled,
        TaskStatus::Skipped,
        TaskStatus::Missed,
        TaskStatus::Shed,
    ];

    /// Whether the task has ended.
    pub fn is_terminal(self) -> bool {
        self.to_core().is_terminal()
    }

    /// The lower-case name (`dead_lettered`, …), as every cronoq interface spells it.
    pub fn name(self) -> &'static str {
        self.to_core().name()
    }

    /// The status with this name.
    ///
    /// ```
    /// use cronoq::TaskStatus;
    /// assert_eq!(TaskStatus::from_name("dead_lettered"), Some(TaskStatus::DeadLettered));
    /// assert_eq!(TaskStatus::from_name("done"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<TaskStatus> {
        TaskStatus::ALL.into_iter().find(|s| s.name() == name)
    }

    pub(crate) fn from_core(status: Status) -> TaskStatus {
        TaskStatus::ALL[status as usize]
    }

    pub(crate) fn to_core(self) -> Status {
        Status::ALL[self as usize]
    }
}

impl fmt::Display for TaskStatus {
    /// The name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an admission gave: the task's id, and whether its key named an existing task (whose
/// id it is; the new payload was ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Submitted {
    /// The task.
    pub id: TaskId,
    /// The key was taken: `id` is the existing task's.
    pub duplicate: bool,
}

/// One status change of one task, from [`Scheduler::events`](crate::Scheduler::events).
#[derive(Clone, Debug, PartialEq)]
pub struct StatusEvent {
    /// The task.
    pub id: TaskId,
    /// Its pool, by index in configuration order.
    pub pool: PoolId,
    /// Its key.
    pub key: Option<Arc<str>>,
    /// The status it moved to.
    pub status: TaskStatus,
    /// Its attempt number then (0 before the first attempt).
    pub attempt: u32,
    /// When.
    pub at: Time,
    /// The message of the change: the failure's for `retrying`, `failed` and `dead_lettered`,
    /// the reason for `cancelled` and `shed`.
    pub message: Option<Arc<str>>,
}

/// One live task in a listing ([`Scheduler::list_tasks`](crate::Scheduler::list_tasks)).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskSummary {
    /// The task.
    pub id: TaskId,
    /// Its key.
    pub key: Option<Arc<str>>,
    /// Its pool's name.
    pub pool: Arc<str>,
    /// Its kind.
    pub kind: Arc<str>,
    /// Its priority class.
    pub priority: Priority,
    /// Its status.
    pub status: TaskStatus,
    /// Its latest attempt's number (0: none yet).
    pub attempt: u32,
    /// Its tenant, given only for pools with fair sharing.
    pub tenant: Option<Arc<str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_match_the_engines() {
        for (i, s) in TaskStatus::ALL.into_iter().enumerate() {
            assert_eq!(s.to_core() as usize, i);
            assert_eq!(TaskStatus::from_core(s.to_core()), s);
            assert_eq!(TaskStatus::from_name(s.name()), Some(s));
            assert_eq!(s.is_terminal(), i >= 5);
        }
        assert_eq!(TaskStatus::DeadLettered.to_string(), "dead_lettered");
    }

    #[test]
    fn priorities_order_and_name() {
        assert!(Priority::Critical < Priority::Low);
        assert_eq!(Priority::default(), Priority::Normal);
        let names: Vec<&str> = Priority::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["critical", "high", "normal", "low"]);
        assert_eq!(Priority::COUNT, Priority::ALL.len());
    }
}
