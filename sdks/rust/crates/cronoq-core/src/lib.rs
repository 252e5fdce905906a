//! cronoq's scheduling engine as plain data and functions: no clock reads, no I/O, no async.
//! Every call takes `now` and returns what the driver must do. It makes the same decisions as
//! the Python core (`cronoq.core`) for the same calls, which the differential suite in
//! `tests/parity` checks operation by operation.
//!
//! # How it maps to the Python core
//!
//! One Rust module per Python module of `src/cronoq/core`, under the same name: `vocab`, `model`,
//! `actions`, `timers`, `heaps`, `queue`, `fair` (fair share's class queue), `pool`, `state`
//! (the tables and the transition primitives), `deps` (dependencies, blocking and releasing
//! tasks), `fixed` (fixed starts and reservations), `recurring` and `schedules` (recurring
//! schedules over `cron`), `resources` (semaphores and token buckets), `groups` (worker groups),
//! `parking` (tasks waiting on a resource or for a group slot, and the offers that put them
//! back), `dispatch` and `engine` (the driver interface), `restore` (taking back what a store
//! kept: `Engine::restore` of `StoredTask`s), `stats`, `autoscale` (evaluated by the
//! pools' timers) and `cron`; `table` the tables of tasks and running attempts (Python's `tasks`
//! and `running` dicts), `rng` the injected randomness and `pyrepr` Python's `repr()` of a name,
//! for error messages. Python's records and attempts are shared objects; here the engine's tables
//! own them and everything else names them by task id or lease.
//! Parity rules kept throughout: iteration orders that reach a decision are Python's (configuration
//! order for pools, start order for attempts, insertion order for the journal), float arithmetic is
//! done in Python's order on `f64` (no fused operations), `min`/`max` keep Python's tie rules
//! (`model::py_min`), heap entries never tie completely so any correct heap pops in heapq's order,
//! and the one source of randomness is injected (`rng::Random`; `rng::MersenneTwister` is Python's
//! `random.Random`).
//!
//! Every rule of the Python core is ported, restore, the observer (`Engine::observe`),
//! `ready_view` and a recurring template's resources and labels included. Not ported: the
//! operators' readers that only read the engine (Python's `core/search.py` and
//! `Engine.page`). Snapshots take their quality metrics from `stats`.

pub mod actions;
pub mod autoscale;
pub mod cron;
pub mod deps;
pub mod dispatch;
pub mod engine;
pub mod fair;
pub mod fixed;
pub mod groups;
pub mod heaps;
pub mod model;
pub mod parking;
pub mod pool;
pub mod pyrepr;
pub mod queue;
pub mod recurring;
pub mod resources;
pub mod restore;
pub mod rng;
pub mod schedules;
pub mod state;
pub mod stats;
pub mod table;
pub mod timers;
pub mod vocab;

pub use actions::{Actions, Journal};
pub use engine::{Engine, EngineOptions, TaskRef};
pub use model::{
    Attempt, AttemptOutcome, DepTarget, Extras, Observer, PoolConfig, ReadyView, RetryPolicy,
    Scoring, Status, SubmitError, TaskId, TaskRecord, TaskSpec,
};
pub use resources::ResourceConfig;
pub use restore::StoredTask;
pub use rng::{MersenneTwister, Random};
pub use state::EventLevel;
pub use vocab::{DepOn, UnknownDependency};
