//! Dependencies between tasks: [`Dep`] (one edge: a parent and the way it must end),
//! [`EdgeCond`], and a pool's [`UnknownDependency`] policy for parents not submitted yet.
//!
//! The engine holds a task with dependencies [`Blocked`](crate::TaskStatus::Blocked) until every
//! parent has ended; it then becomes ready if every edge's condition held, and ends
//! [`Skipped`](crate::TaskStatus::Skipped) (message `dependency <id> ended as <status>`)
//! otherwise.

use std::time::Duration;

use cronoq_core::vocab::{self, DepOn};

use crate::types::TaskRef;

/// How a parent must end for its dependent to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EdgeCond {
    /// The parent succeeded (the default, [`Task::after`](crate::Task::after)).
    #[default]
    OnSuccess,
    /// The parent ended, however.
    OnComplete,
    /// The parent ended otherwise than succeeded: a clean-up or fallback task.
    OnFailure,
}

impl EdgeCond {
    pub(crate) fn to_core(self) -> DepOn {
        match self {
            EdgeCond::OnSuccess => DepOn::Success,
            EdgeCond::OnComplete => DepOn::Complete,
            EdgeCond::OnFailure => DepOn::Failure,
        }
    }
}

/// One dependency: the parent, by id or key, and how it must end.
///
/// ```
/// use cronoq::{Dep, EdgeCond, Task, TaskId, TaskRef};
///
/// let cleanup = Task::new(0u32)
///     .dep(Dep::on_failure("load"))
///     .dep(Dep::on_complete(TaskId(7)));
/// assert_eq!(cleanup.spec().deps[0].target, TaskRef::Key("load".into()));
/// assert_eq!(cleanup.spec().deps[1].cond, EdgeCond::OnComplete);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dep {
    /// The parent: an id, or a key (of a live or retained task, a task of the same batch, or,
    /// in a pool that awaits unknown keys, one not submitted yet).
    pub target: TaskRef,
    /// How it must end.
    pub cond: EdgeCond,
}

impl Dep {
    /// The dependent runs if `target` succeeds.
    pub fn on_success(target: impl Into<TaskRef>) -> Dep {
        Dep {
            target: target.into(),
            cond: EdgeCond::OnSuccess,
        }
    }

    /// The dependent runs once `target` has ended, however.
    pub fn on_complete(target: impl Into<TaskRef>) -> Dep {
        Dep {
            target: target.into(),
            cond: EdgeCond::OnComplete,
        }
    }

    /// The dependent runs if `target` ends otherwise than succeeded.
    pub fn on_failure(target: impl Into<TaskRef>) -> Dep {
        Dep {
            target: target.into(),
            cond: EdgeCond::OnFailure,
        }
    }
}

/// What a dependency on a key that no task holds does (a pool's
/// [`unknown_dependency`](crate::PoolConfig::unknown_dependency)). Unknown ids are always
/// refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UnknownDependency {
    /// Refuse the task with [`SubmitError::UnknownDependency`](crate::SubmitError::UnknownDependency)
    /// (the default).
    #[default]
    Reject,
    /// Admit it blocked until a task with that key is submitted; after `timeout` (`None`:
    /// never) it ends [`Skipped`](crate::TaskStatus::Skipped).
    Await {
        /// How long to wait for the parent to be submitted.
        timeout: Option<Duration>,
    },
}

impl UnknownDependency {
    /// The engine's policy and await timeout (seconds).
    pub(crate) fn to_core(self) -> (vocab::UnknownDependency, Option<f64>) {
        match self {
            UnknownDependency::Reject => (vocab::UnknownDependency::Reject, None),
            UnknownDependency::Await { timeout } => (
                vocab::UnknownDependency::Await,
                timeout.map(|d| d.as_secs_f64()),
            ),
        }
    }
}
