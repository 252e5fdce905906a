//! What the driver hands the engine for a task's dependencies, resources, labels and fixed
//! start, and how the engine's refusals of those become [`SubmitError`]s that name the key or
//! resource at fault.

use cronoq_core::vocab::{DepOn, OnMiss};
use cronoq_core::{Engine, TaskRef as CoreRef};

use crate::error::SubmitError;
use crate::task::TaskSpec;
use crate::time::Time;
use crate::types::TaskRef;

/// A task's options that the engine takes as borrowed slices, gathered once per submission.
pub(crate) struct SpecParts<'a> {
    deps: Vec<(CoreRef<'a>, DepOn)>,
    resources: Vec<(&'a str, u32)>,
    labels: Vec<(&'a str, &'a str)>,
}

impl<'a> SpecParts<'a> {
    pub(crate) fn of<P>(spec: &'a TaskSpec<P>) -> SpecParts<'a> {
        SpecParts {
            deps: spec
                .deps
                .iter()
                .map(|d| (d.target.to_core(), d.cond.to_core()))
                .collect(),
            resources: spec.resources.iter().map(|(n, a)| (&**n, *a)).collect(),
            labels: spec.labels.iter().map(|(n, v)| (&**n, &**v)).collect(),
        }
    }

    /// Sets these options and the fixed start (`secs` turns a time into engine seconds) on
    /// the engine's spec.
    pub(crate) fn fill<P>(
        &'a self,
        core: &mut cronoq_core::TaskSpec<'a>,
        spec: &TaskSpec<P>,
        secs: impl Fn(Time) -> f64,
    ) {
        core.deps = &self.deps;
        core.resources = &self.resources;
        if !self.labels.is_empty() {
            core.labels = Some(&self.labels);
        }
        if let Some(f) = spec.fixed_start {
            core.start_at = Some(secs(f.at));
            core.tolerance = f.tolerance.as_secs_f64();
            core.on_miss = f.on_miss.to_core();
        } else {
            core.on_miss = OnMiss::RunLate;
        }
    }
}

/// The library's error for the engine's refusal of `specs` (one task, or a batch in order):
/// the key, dependency or resource it names is found again by making the engine's checks in
/// its order. `batch_keys` are the batch's new keys, which dependencies may name.
pub(crate) fn name_error<P>(
    engine: &mut Engine,
    e: &cronoq_core::SubmitError,
    specs: &[TaskSpec<P>],
    awaits: impl Fn(&str) -> bool,
) -> SubmitError {
    let known = |engine: &Engine, t: &TaskRef| engine.lookup(t.to_core()).is_some();
    let new: Vec<&TaskSpec<P>> = specs
        .iter()
        .filter(|s| {
            s.key
                .as_deref()
                .is_none_or(|k| engine.lookup(CoreRef::Key(k)).is_none())
        })
        .collect();
    match e.code {
        "unknown_pool" => SubmitError::UnknownPool(specs[0].pool.clone()),
        "full" => SubmitError::Full,
        "overloaded" => SubmitError::Overloaded,
        "cycle" => SubmitError::Cycle,
        "reservation_conflict" => SubmitError::ReservationConflict,
        "duplicate_key_in_batch" => {
            let mut seen = Vec::new();
            let twice = specs.iter().filter_map(|s| s.key.clone()).find(|k| {
                let again = seen.contains(k);
                seen.push(k.clone());
                again
            });
            SubmitError::DuplicateKeyInBatch(twice.unwrap_or_default())
        }
        "unknown_resource" | "resource_exceeds_capacity" => {
            let name = new
                .iter()
                .flat_map(|s| s.resources.iter())
                .find(|(n, a)| {
                    engine
                        .resolve_resources(&[(&**n, *a)])
                        .is_err_and(|r| r.code == e.code)
                })
                .map(|(n, _)| n.clone())
                .unwrap_or_default();
            if e.code == "unknown_resource" {
                SubmitError::UnknownResource(name)
            } else {
                SubmitError::ResourceExceedsCapacity(name)
            }
        }
        "unknown_dependency" => {
            let in_batch = |k: &str| new.iter().any(|s| s.key.as_deref() == Some(k));
            let missing = new.iter().find_map(|s| {
                s.deps.iter().find_map(|d| match &d.target {
                    TaskRef::Id(id) => (!known(engine, &d.target)).then(|| id.0.to_string()),
                    TaskRef::Key(k) => {
                        let found = known(engine, &d.target) || in_batch(k) || awaits(&s.pool);
                        (!found).then(|| k.to_string())
                    }
                })
            });
            SubmitError::UnknownDependency(missing.unwrap_or_default().into())
        }
        _ => SubmitError::Invalid(invalid_message(&e.message)),
    }
}

/// The engine's `invalid` messages that a task of this library can cause, as static text.
fn invalid_message(message: &str) -> &'static str {
    const KNOWN: [&str; 2] = ["resource amount must be > 0", "priority must be 0..=3"];
    KNOWN
        .into_iter()
        .find(|m| message.contains(m))
        .unwrap_or("refused by the engine")
}
