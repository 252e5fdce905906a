//! Restarts of the engine suite (engine_ops.restart): the rows a store would keep of the Rust
//! engine's tasks, as Python tuples (compared with the Python engine's), read back as
//! `StoredTask`s by a fresh engine of the operation's configuration, which also takes back the
//! pauses and the schedules whose pool is still configured.

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::{Obj, Recorder, engine, item, labels, retry, schedule, str_pairs};
use cronoq_core::groups::labels_of;
use cronoq_core::model::{
    DepTarget, Extras, FIRST_TERMINAL, Outcome, PastAttempt, Status, TaskRecord,
};
use cronoq_core::vocab::OnMiss;
use cronoq_core::{DepOn, Engine, StoredTask};
use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

fn bad(what: &str, name: &str) -> PyErr {
    PyValueError::new_err(format!("unknown {what} {name}"))
}

/// engine_ops.stored_row of one record.
fn row<'py>(py: Python<'py>, eng: &Engine, r: &TaskRecord) -> PyResult<Obj<'py>> {
    let e = r.extra.as_deref();
    let policy = r.retry.map(|p| {
        (
            p.max_attempts(),
            p.initial_backoff(),
            p.multiplier(),
            p.max_backoff(),
            p.jitter(),
        )
    });
    let fixed = e.and_then(|e| Some((e.start_at?, e.tolerance, e.on_miss.name())));
    let deps = match e {
        Some(e) if !e.deps.is_empty() => {
            let edges = PyList::empty(py);
            for (target, on) in &e.deps {
                let target = match target {
                    DepTarget::Id(id) => id.into_bound_py_any(py)?,
                    DepTarget::Key(key) => (**key).into_bound_py_any(py)?,
                };
                edges.append(PyTuple::new(
                    py,
                    [target, on.name().into_bound_py_any(py)?],
                )?)?;
            }
            edges.into_any()
        }
        _ => py.None().into_bound(py),
    };
    let resources = e.filter(|e| !e.resources.is_empty()).map(|e| {
        e.resources
            .iter()
            .map(|(n, a)| (&**n, *a))
            .collect::<Vec<_>>()
    });
    let history: Vec<(u32, f64, f64, &str, &str)> = r
        .history()
        .iter()
        .map(|p| {
            (
                p.number,
                p.started_at,
                p.ended_at,
                p.outcome.name(),
                p.message.as_str(),
            )
        })
        .collect();
    let fields = [
        r.id.into_bound_py_any(py)?,
        r.seq.into_bound_py_any(py)?,
        eng.pool_name(r.pool).into_bound_py_any(py)?,
        r.cls.into_bound_py_any(py)?,
        eng.kind_name(r.kind).into_bound_py_any(py)?,
        r.key.as_deref().into_bound_py_any(py)?,
        r.deadline.into_bound_py_any(py)?,
        r.duration_hint.into_bound_py_any(py)?,
        r.timeout.into_bound_py_any(py)?,
        policy.into_bound_py_any(py)?,
        r.tenant.as_deref().into_bound_py_any(py)?,
        r.status.name().into_bound_py_any(py)?,
        r.attempt.into_bound_py_any(py)?,
        r.message.as_deref().into_bound_py_any(py)?,
        r.submitted_at.into_bound_py_any(py)?,
        r.eligible_at.into_bound_py_any(py)?,
        if r.status == Status::Retrying {
            r.ready_at
        } else {
            0.0
        }
        .into_bound_py_any(py)?,
        r.started_at.into_bound_py_any(py)?,
        if r.status >= FIRST_TERMINAL {
            r.finished_at
        } else {
            0.0
        }
        .into_bound_py_any(py)?,
        fixed.into_bound_py_any(py)?,
        deps,
        resources.into_bound_py_any(py)?,
        labels(py, r.labels.as_deref())?,
        history.into_bound_py_any(py)?,
        e.and_then(|e| e.schedule.as_deref())
            .into_bound_py_any(py)?,
    ];
    Ok(PyTuple::new(py, fields)?.into_any())
}

/// The task a stored row reads back as (engine_ops.from_stored).
fn from_row(t: &Bound<'_, PyTuple>) -> PyResult<StoredTask> {
    let status: String = item(t, 11)?;
    let status = *Status::ALL
        .iter()
        .find(|s| s.name() == status)
        .ok_or_else(|| bad("status", &status))?;
    let fixed: Option<(f64, f64, String)> = item(t, 19)?;
    let mut deps = Vec::new();
    if let Some(edges) = item::<Option<Vec<(Bound<'_, PyAny>, String)>>>(t, 20)? {
        for (target, on) in edges {
            let target = match target.extract::<u64>() {
                Ok(id) => DepTarget::Id(id),
                Err(_) => DepTarget::Key(Arc::from(target.extract::<String>()?)),
            };
            deps.push((
                target,
                DepOn::parse(&on).ok_or_else(|| bad("condition", &on))?,
            ));
        }
    }
    let resources: Vec<(Arc<str>, u32)> = item::<Option<Vec<(String, u32)>>>(t, 21)?
        .unwrap_or_default()
        .into_iter()
        .map(|(n, a)| (Arc::from(n), a))
        .collect();
    let mut history = Vec::new();
    for (number, started_at, ended_at, outcome, message) in
        item::<Vec<(u32, f64, f64, String, String)>>(t, 23)?
    {
        let outcome = match outcome.as_str() {
            "failed" => Outcome::Failed,
            "timed_out" => Outcome::TimedOut,
            "lease_expired" => Outcome::LeaseExpired,
            _ => return Err(bad("outcome", &outcome)),
        };
        history.push(PastAttempt {
            number,
            started_at,
            ended_at,
            outcome,
            message,
        });
    }
    let schedule: Option<String> = item(t, 24)?;
    let extra = (fixed.is_some()
        || !deps.is_empty()
        || !resources.is_empty()
        || !history.is_empty()
        || schedule.is_some())
    .then(|| -> PyResult<Box<Extras>> {
        let mut e = Extras {
            deps,
            resources,
            history,
            schedule: schedule.map(Arc::from),
            ..Extras::default()
        };
        if let Some((start_at, tolerance, on_miss)) = fixed {
            e.start_at = Some(start_at);
            e.tolerance = tolerance;
            e.on_miss = OnMiss::parse(&on_miss).ok_or_else(|| bad("on_miss", &on_miss))?;
        }
        Ok(Box::new(e))
    })
    .transpose()?;
    let labels: Option<Vec<(String, String)>> = item(t, 22)?;
    let record = TaskRecord {
        id: item(t, 0)?,
        seq: item(t, 1)?,
        pool: 0,
        cls: item(t, 3)?,
        kind: 0,
        key: item::<Option<String>>(t, 5)?.map(Arc::from),
        deadline: item(t, 6)?,
        duration_hint: item(t, 7)?,
        timeout: item(t, 8)?,
        retry: retry(&t.get_item(9)?)?,
        tenant: item::<Option<String>>(t, 10)?.map(Arc::from),
        labels: labels.map(|l| labels_of(&str_pairs(&l)).into()),
        status,
        attempt: item(t, 12)?,
        message: item::<Option<String>>(t, 13)?.map(Arc::from),
        submitted_at: item(t, 14)?,
        eligible_at: item(t, 15)?,
        ready_at: item(t, 16)?,
        started_at: item(t, 17)?,
        latest_start: None,
        finished_at: item(t, 18)?,
        running: None,
        qgen: 0,
        parked: None,
        extra,
    };
    Ok(StoredTask {
        record,
        pool: Arc::from(item::<String>(t, 2)?),
        kind: Arc::from(item::<String>(t, 4)?),
    })
}

/// A failover (engine_ops.restart): the fresh engine, and the rows it restored from.
pub fn restart<'py>(
    py: Python<'py>,
    old: &Engine,
    op: &Bound<'py, PyTuple>,
    defined: &HashMap<String, Bound<'py, PyTuple>>,
    recorder: &Recorder,
) -> PyResult<(Engine, Obj<'py>)> {
    let now: f64 = item(op, 1)?;
    let config = op.get_item(2)?;
    let broken: HashMap<u64, String> = item::<Vec<(u64, String)>>(op, 3)?.into_iter().collect();
    let gap: u64 = item(op, 4)?;
    let rows = PyList::empty(py);
    for r in old.tasks() {
        rows.append(row(py, old, r)?)?; // (in id order, as the Python side sorts them)
    }
    let mut eng = engine(config.cast::<PyTuple>()?, recorder, old.next_id() + gap)?;
    for p in old.pools() {
        if p.paused && eng.pool(&p.name).is_some() {
            eng.pause(&p.name, now)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
    }
    let stored = rows
        .iter()
        .map(|r| from_row(r.cast::<PyTuple>()?))
        .collect::<PyResult<Vec<_>>>()?;
    eng.restore(stored, now, &broken);
    for s in old.recurring() {
        let sched = schedule(&defined[&*s.name], 2)?;
        if eng.pool(&sched.pool).is_some() {
            eng.resume_recurring(sched, s.next_time(), s.last(), now)
                .map_err(|e| PyValueError::new_err(e.message))?;
        }
    }
    Ok((eng, rows.into_any()))
}
