//! Fixed starts: a task that must start at a given time ([`Task::start_at`](crate::Task::start_at),
//! [`Task::start_in`](crate::Task::start_in)).
//!
//! At admission the task reserves a slot around its start (at most the pool's
//! [`reservable_fraction`](crate::PoolConfig::reservable_fraction) of `max_workers` reservations
//! may overlap, else [`SubmitError::ReservationConflict`](crate::SubmitError::ReservationConflict));
//! it waits [`Scheduled`](crate::TaskStatus::Scheduled), a slot is held for it shortly before
//! the start, and it starts at its time ahead of every queued task. One that has not started
//! within its tolerance follows its [`MissPolicy`].

use std::time::Duration;

use cronoq_core::vocab::OnMiss;

use crate::time::Time;

/// What a fixed start not made within its tolerance does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MissPolicy {
    /// Start as soon as possible anyway (the default).
    #[default]
    RunLate,
    /// End [`Missed`](crate::TaskStatus::Missed) (message `fixed start missed`).
    Skip,
    /// End [`Failed`](crate::TaskStatus::Failed) (message `fixed start missed`).
    Fail,
}

impl MissPolicy {
    pub(crate) fn to_core(self) -> OnMiss {
        match self {
            MissPolicy::RunLate => OnMiss::RunLate,
            MissPolicy::Skip => OnMiss::Skip,
            MissPolicy::Fail => OnMiss::Fail,
        }
    }
}

/// A fixed start as the engine takes it: an absolute time, how late it may be, and what
/// happens when it is later than that.
///
/// ```
/// use std::time::Duration;
/// use cronoq::{MissPolicy, Time};
/// use cronoq::core::FixedStart;
///
/// let f = FixedStart::at(Time::from_secs_f64(1_800_000_000.0));
/// assert_eq!((f.tolerance, f.on_miss), (Duration::from_secs(1), MissPolicy::RunLate));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedStart {
    /// When the task starts.
    pub at: Time,
    /// How late the start may be before `on_miss` applies.
    pub tolerance: Duration,
    /// What a start later than the tolerance does.
    pub on_miss: MissPolicy,
}

impl FixedStart {
    /// A start at `at`, 1 s of tolerance, [`MissPolicy::RunLate`].
    pub fn at(at: Time) -> FixedStart {
        FixedStart {
            at,
            tolerance: DEFAULT_TOLERANCE,
            on_miss: MissPolicy::RunLate,
        }
    }
}

/// The tolerance of a fixed start that sets none.
pub(crate) const DEFAULT_TOLERANCE: Duration = Duration::from_secs(1);
