//! The words of cronoq's options and answers (Python: `cronoq.core.vocab`), each defined once
//! with its spelling, so an edge that parses or prints a name cannot disagree with the core.

/// Priority classes by name, most important first; a class is its index (0 = critical).
pub const PRIORITY_NAMES: [&str; 4] = ["critical", "high", "normal", "low"];

/// The number of strict priority classes.
pub const NUM_CLASSES: usize = 4;

/// What a fixed start that passed its tolerance does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OnMiss {
    /// It stays due and starts on the next free slot, late.
    #[default]
    RunLate,
    /// It ends `missed`.
    Skip,
    /// It ends `failed`.
    Fail,
}

impl OnMiss {
    /// Every policy, in the order Python lists them.
    pub const ALL: [OnMiss; 3] = [OnMiss::RunLate, OnMiss::Skip, OnMiss::Fail];

    /// The policy's name, as given in Python.
    pub fn name(self) -> &'static str {
        match self {
            OnMiss::RunLate => "run_late",
            OnMiss::Skip => "skip",
            OnMiss::Fail => "fail",
        }
    }

    /// The policy with this name, if any.
    pub fn parse(name: &str) -> Option<OnMiss> {
        OnMiss::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// What a recurring occurrence does while an earlier one is still live. Python's `queue` and
/// `queue_on_success` make the occurrence depend on the previous one, so they come with the
/// port of dependencies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Overlap {
    /// Skipped at its start time while an earlier occurrence is live.
    #[default]
    Skip,
    /// Runs beside the earlier ones.
    Allow,
}

impl Overlap {
    /// Every policy ported, in the order Python lists them.
    pub const ALL: [Overlap; 2] = [Overlap::Skip, Overlap::Allow];

    /// The policy's name, as given in Python.
    pub fn name(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
        }
    }

    /// The policy with this name, if any.
    pub fn parse(name: &str) -> Option<Overlap> {
        Overlap::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// What a pool at `max_pending` does with one more task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Overflow {
    /// Refuse the new task with `full` (the caller may wait and try again).
    #[default]
    Wait,
    /// Refuse the new task with `overloaded`.
    Reject,
    /// Shed the newest queued task of the least important class below the new task's class.
    ShedLowest,
    /// Shed the oldest queued task of the `low` class.
    ShedOldest,
}

impl Overflow {
    /// Every policy, in the order Python lists them.
    pub const ALL: [Overflow; 4] = [
        Overflow::Wait,
        Overflow::Reject,
        Overflow::ShedLowest,
        Overflow::ShedOldest,
    ];

    /// The policy's name, as configured in Python.
    pub fn name(self) -> &'static str {
        match self {
            Overflow::Wait => "wait",
            Overflow::Reject => "reject",
            Overflow::ShedLowest => "shed_lowest",
            Overflow::ShedOldest => "shed_oldest",
        }
    }

    /// The policy with this name, if any.
    pub fn parse(name: &str) -> Option<Overflow> {
        Overflow::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// A task's status names, by status number (`model::Status as usize`); the last seven are
/// terminal.
pub const STATUSES: [&str; 12] = [
    "blocked",
    "scheduled",
    "ready",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "dead_lettered",
    "cancelled",
    "skipped",
    "missed",
    "shed",
];

/// What a pool does with a dependency on a key no task holds yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum UnknownDependency {
    /// Refuse the submit with `unknown_dependency`.
    #[default]
    Reject,
    /// Admit the task blocked until a task with that key is admitted (or `await_timeout`).
    Await,
}

impl UnknownDependency {
    /// Every policy, in the order Python lists them.
    pub const ALL: [UnknownDependency; 2] = [UnknownDependency::Reject, UnknownDependency::Await];

    /// The policy's name, as configured in Python.
    pub fn name(self) -> &'static str {
        match self {
            UnknownDependency::Reject => "reject",
            UnknownDependency::Await => "await",
        }
    }

    /// The policy with this name, if any.
    pub fn parse(name: &str) -> Option<UnknownDependency> {
        UnknownDependency::ALL
            .into_iter()
            .find(|o| o.name() == name)
    }
}

/// How a dependency must end for its dependent to run (Python's `DepOn`; the edges normalise
/// the `on_` aliases before the core sees them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DepOn {
    /// It succeeded.
    Success,
    /// It ended, however.
    Complete,
    /// It failed or was dead-lettered.
    Failure,
}

impl DepOn {
    /// Every condition, in the order Python lists them.
    pub const ALL: [DepOn; 3] = [DepOn::Success, DepOn::Complete, DepOn::Failure];

    /// The condition's name.
    pub fn name(self) -> &'static str {
        match self {
            DepOn::Success => "success",
            DepOn::Complete => "complete",
            DepOn::Failure => "failure",
        }
    }

    /// The condition with this name, if any.
    pub fn parse(name: &str) -> Option<DepOn> {
        DepOn::ALL.into_iter().find(|o| o.name() == name)
    }
}
