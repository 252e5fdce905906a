//! The engine's side of the differential suite (tests/parity/engine_ops.py): runs a whole
//! operation sequence on the Rust engine in one call and returns its normalized trace, which
//! the suite compares with the Python engine's, operation by operation and field by field.

use crate::leaves::{SettingsFields, settings};
use cronoq_core::autoscale::AutoscaleSettings;
use cronoq_core::model::{Attempt, Lease, RetryPolicy, Scoring, Snapshot, TaskRecord};
use cronoq_core::parking::Parked;
use cronoq_core::vocab::Overflow;
use cronoq_core::{
    Engine, EngineOptions, EventLevel, MersenneTwister, PoolConfig, ResourceConfig, TaskRef,
    TaskSpec,
};
use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::sync::Arc;

type Obj<'py> = Bound<'py, PyAny>;

/// A Python tuple of the values, each converted.
macro_rules! tup {
    ($py:expr; $($v:expr),* $(,)?) => {
        PyTuple::new($py, [$($v.into_bound_py_any($py)?),*])?.into_any()
    };
}

fn item<'py, T: for<'a> FromPyObjectOwned<'py>>(t: &Bound<'py, PyTuple>, i: usize) -> PyResult<T> {
    t.get_item(i)?.extract::<T>().map_err(Into::into)
}

fn retry(t: &Obj<'_>) -> PyResult<Option<RetryPolicy>> {
    if t.is_none() {
        return Ok(None);
    }
    let t = t.cast::<PyTuple>()?;
    RetryPolicy::new(
        item(t, 0)?,
        item(t, 1)?,
        item(t, 2)?,
        item(t, 3)?,
        item(t, 4)?,
    )
    .map(Some)
    .map_err(|e| PyValueError::new_err(e.0))
}

/// A submit's options as the suite encodes them, owning the names a `TaskSpec` borrows.
struct Spec {
    pool: String,
    cls: u8,
    kind: String,
    key: Option<String>,
    deadline: Option<f64>,
    duration_hint: Option<f64>,
    timeout: Option<f64>,
    retry: Option<RetryPolicy>,
    tenant: Option<String>,
    resources: Vec<(String, u32)>,
    labels: Option<Vec<(String, String)>>,
}

/// Pairs of names borrowed from owned ones, as `TaskSpec` and the engine's calls take them.
fn str_pairs(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect()
}

fn amounts(pairs: &[(String, u32)]) -> Vec<(&str, u32)> {
    pairs.iter().map(|(a, n)| (a.as_str(), *n)).collect()
}

impl Spec {
    fn read(t: &Bound<'_, PyTuple>, at: usize) -> PyResult<Spec> {
        Ok(Spec {
            pool: item(t, at)?,
            cls: item(t, at + 1)?,
            kind: item(t, at + 2)?,
            key: item(t, at + 3)?,
            deadline: item(t, at + 4)?,
            duration_hint: item(t, at + 5)?,
            timeout: item(t, at + 6)?,
            retry: retry(&t.get_item(at + 7)?)?,
            tenant: item(t, at + 8)?,
            resources: item::<Option<Vec<(String, u32)>>>(t, at + 9)?.unwrap_or_default(),
            labels: item(t, at + 10)?,
        })
    }

    /// The spec, borrowing `names` for its resources and labels (`Spec::names`).
    fn spec<'a>(&'a self, names: &'a Names<'a>) -> TaskSpec<'a> {
        TaskSpec {
            pool: &self.pool,
            cls: self.cls,
            kind: &self.kind,
            key: self.key.as_deref(),
            deadline: self.deadline,
            duration_hint: self.duration_hint,
            timeout: self.timeout,
            retry: self.retry,
            tenant: self.tenant.as_deref(),
            resources: &names.0,
            labels: names.1.as_deref(),
        }
    }

    fn names(&self) -> Names<'_> {
        (
            amounts(&self.resources),
            self.labels.as_deref().map(str_pairs),
        )
    }
}

/// A spec's resource amounts and labels as the slices `TaskSpec` borrows.
type Names<'a> = (Vec<(&'a str, u32)>, Option<Vec<(&'a str, &'a str)>>);

/// A resource of the suite's config, through the checked constructors.
fn resource(t: &Bound<'_, PyTuple>) -> PyResult<ResourceConfig> {
    let name: String = item(t, 0)?;
    let kind: String = item(t, 1)?;
    let cfg = if kind == "semaphore" {
        ResourceConfig::semaphore(name, item(t, 2)?)
    } else {
        ResourceConfig::token_bucket(name, item(t, 3)?, item(t, 4)?)
    };
    cfg.map_err(|e| PyValueError::new_err(e.0))
}

/// `AutoscaleSettings` field by field, as the leaves' suite passes them, or None.
fn autoscale(t: &Obj<'_>) -> PyResult<Option<AutoscaleSettings>> {
    if t.is_none() {
        return Ok(None);
    }
    Ok(Some(settings(t.extract::<SettingsFields>()?)))
}

fn engine(config: &Bound<'_, PyTuple>) -> PyResult<Engine> {
    let seed: i64 = item(config, 0)?;
    let sc = config.get_item(1)?;
    let sc = sc.cast::<PyTuple>()?;
    let scoring = Scoring {
        base: item(sc, 0)?,
        aging_rate: item(sc, 1)?,
        age_cap: item(sc, 2)?,
        window: item(sc, 3)?,
        urgency_max: item(sc, 4)?,
        overdue_rate: item(sc, 5)?,
        overdue_cap: item(sc, 6)?,
    };
    let event_level = match item::<u8>(config, 2)? {
        0 => EventLevel::None,
        1 => EventLevel::Terminal,
        _ => EventLevel::All,
    };
    let mut pools = Vec::new();
    for p in config.get_item(5)?.cast::<PyList>()?.iter() {
        let p = p.cast::<PyTuple>()?;
        let mut cfg = PoolConfig::new(item::<String>(p, 0)?);
        cfg.capacity = item(p, 1)?;
        cfg.lease_ttl = item(p, 2)?;
        cfg.retry = retry(&p.get_item(3)?)?.unwrap_or_default();
        cfg.default_duration = item(p, 4)?;
        cfg.max_pending = item(p, 5)?;
        let overflow: String = item(p, 6)?;
        cfg.overflow = Overflow::parse(&overflow)
            .ok_or_else(|| PyValueError::new_err(format!("unknown overflow {overflow}")))?;
        cfg.cost_per_worker_second = item(p, 7)?;
        cfg.min = item(p, 8)?;
        cfg.max = item(p, 9)?;
        cfg.autoscale = autoscale(&p.get_item(10)?)?;
        cfg.fair_share = item(p, 11)?;
        cfg.tenant_weights = item(p, 12)?;
        pools.push(cfg);
    }
    let options = EngineOptions {
        scoring,
        event_level,
        retention: item(config, 3)?,
        retention_max: item(config, 4)?,
        first_id: 1,
        journal: true,
        elastic: item(config, 6)?,
        resources: config
            .get_item(7)?
            .cast::<PyList>()?
            .iter()
            .map(|r| resource(r.cast::<PyTuple>()?))
            .collect::<PyResult<_>>()?,
    };
    Engine::new(pools, 0.0, options, MersenneTwister::new(i128::from(seed)))
        .map_err(|e| PyValueError::new_err(e.0))
}

fn record<'py>(py: Python<'py>, eng: &Engine, r: &TaskRecord) -> PyResult<Obj<'py>> {
    let history = PyList::empty(py);
    for p in r.history() {
        history.append(
            tup!(py; p.number, p.started_at, p.ended_at, p.outcome.name(), p.message.as_str()),
        )?;
    }
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
        r.tenant.as_deref().into_bound_py_any(py)?,
        r.status.name().into_bound_py_any(py)?,
        r.attempt.into_bound_py_any(py)?,
        r.message.as_deref().into_bound_py_any(py)?,
        r.submitted_at.into_bound_py_any(py)?,
        r.eligible_at.into_bound_py_any(py)?,
        r.ready_at.into_bound_py_any(py)?,
        r.started_at.into_bound_py_any(py)?,
        r.latest_start.into_bound_py_any(py)?,
        r.finished_at.into_bound_py_any(py)?,
        r.running.into_bound_py_any(py)?,
        PyTuple::new(py, history)?.into_any(),
        labels(py, r.labels.as_deref())?,
        r.extra
            .as_ref()
            .filter(|e| !e.resources.is_empty())
            .map(|e| {
                e.resources
                    .iter()
                    .map(|(n, a)| (&**n, *a))
                    .collect::<Vec<_>>()
            })
            .into_bound_py_any(py)?,
        parked(eng, r.parked).into_bound_py_any(py)?,
    ];
    Ok(PyTuple::new(py, fields)?.into_any())
}

/// Labels as a list of (name, value) pairs, or None.
fn labels<'py>(py: Python<'py>, l: Option<&[(Arc<str>, Arc<str>)]>) -> PyResult<Obj<'py>> {
    l.map(|l| l.iter().map(|(n, v)| (&**n, &**v)).collect::<Vec<_>>())
        .into_bound_py_any(py)
}

/// What a ready task waits for outside its queue: a resource's name, or "group".
fn parked(eng: &Engine, p: Option<Parked>) -> Option<&str> {
    match p? {
        Parked::Resource(r) => Some(&*eng.parking().resources[r].name),
        Parked::Group => Some("group"),
    }
}

fn attempt<'py>(py: Python<'py>, a: &Attempt) -> PyResult<Obj<'py>> {
    Ok(tup!(py;
        a.task,
        a.number,
        a.lease,
        a.started_at,
        a.lease_ttl,
        a.lease_expiry,
        a.abort_reason.map(|r| r.message()),
        labels(py, a.slot.as_deref())?,
    ))
}

/// The parking state (engine_ops.parking_row), read without refilling any bucket; None
/// without resources and worker groups.
fn parking<'py>(py: Python<'py>, eng: &Engine) -> PyResult<Obj<'py>> {
    let park = eng.parking();
    if park.resources.is_empty() && eng.pools().iter().all(|p| p.groups.is_none()) {
        return Ok(py.None().into_bound(py));
    }
    let live = |task, generation, on| {
        eng.lookup(TaskRef::Id(task))
            .is_some_and(|r| r.qgen == generation && r.parked == Some(on))
    };
    let resources = PyList::empty(py);
    for (i, r) in park.resources.iter().enumerate() {
        let mut waiting: Vec<(u64, u32)> = r
            .parked
            .iter()
            .filter(|e| live(e.task, e.generation, Parked::Resource(i)))
            .map(|e| (e.task, e.amount))
            .collect();
        waiting.sort_unstable();
        resources.append(tup!(py;
            &*r.name, r.in_use, r.tokens, r.last, r.wake, r.parked.len(), waiting
        ))?;
    }
    let pools = PyList::empty(py);
    for p in eng.pools() {
        let groups = match &p.groups {
            None => py.None().into_bound(py),
            Some(g) => {
                let list = PyList::empty(py);
                for x in &g.by_key {
                    list.append(tup!(py; labels(py, Some(&x.labels))?, x.capacity, x.busy))?;
                }
                let mut waiting: Vec<u64> = g
                    .parked
                    .iter()
                    .filter(|e| live(e.task, e.generation, Parked::Group))
                    .map(|e| e.task)
                    .collect();
                waiting.sort_unstable();
                tup!(py; g.unlabeled_busy, list, g.parked.len(), waiting)
            }
        };
        pools.append(tup!(py; p.unlabeled, groups))?;
    }
    Ok(tup!(py; resources, pools, park.reoffer, park.offered.clone()))
}

fn records<'py>(py: Python<'py>, eng: &Engine, rs: &[TaskRecord]) -> PyResult<Obj<'py>> {
    let out = PyList::empty(py);
    for r in rs {
        out.append(record(py, eng, r)?)?;
    }
    Ok(out.into_any())
}

fn attempts<'py>(py: Python<'py>, atts: &[Attempt]) -> PyResult<Obj<'py>> {
    let out = PyList::empty(py);
    for a in atts {
        out.append(attempt(py, a)?)?;
    }
    Ok(out.into_any())
}

fn totals(t: &cronoq_core::model::Totals) -> Vec<u64> {
    t.iter().iter().map(|(_, v)| *v).collect()
}

fn snapshot<'py>(py: Python<'py>, s: &Snapshot) -> PyResult<Obj<'py>> {
    let pools = PyList::empty(py);
    for p in &s.pools {
        let fields = [
            (*p.name).into_bound_py_any(py)?,
            p.capacity.into_bound_py_any(py)?,
            p.busy.into_bound_py_any(py)?,
            p.desired.into_bound_py_any(py)?,
            p.pending.into_bound_py_any(py)?,
            p.pending_by_class.to_vec().into_bound_py_any(py)?,
            p.ready.into_bound_py_any(py)?,
            p.window.into_bound_py_any(py)?,
            p.dispatched.into_bound_py_any(py)?,
            p.succeeded.into_bound_py_any(py)?,
            p.failed.into_bound_py_any(py)?,
            p.retried.into_bound_py_any(py)?,
            p.priority_adherence.into_bound_py_any(py)?,
            p.utilization.into_bound_py_any(py)?,
            p.schedule_efficiency.into_bound_py_any(py)?,
            p.wait_mean.into_bound_py_any(py)?,
            p.wait_p50.into_bound_py_any(py)?,
            p.wait_p90.into_bound_py_any(py)?,
            p.wait_p99.into_bound_py_any(py)?,
            p.run_p50.into_bound_py_any(py)?,
            p.run_p99.into_bound_py_any(py)?,
            p.worker_seconds.into_bound_py_any(py)?,
            p.cost.into_bound_py_any(py)?,
            p.paused.into_bound_py_any(py)?,
            p.unserved.into_bound_py_any(py)?,
        ];
        pools.append(PyTuple::new(py, fields)?)?;
    }
    Ok(tup!(py; pools, s.live_tasks, s.running, s.pending, totals(&s.totals)))
}

/// The running attempt or the issued lease an operation picks (engine_ops.pick).
fn pick(eng: &Engine, r: i64, issued: Lease) -> Option<Lease> {
    if r >= 0 {
        let running: Vec<Lease> = eng.running().map(|a| a.lease).collect();
        (!running.is_empty()).then(|| running[(r as usize) % running.len()])
    } else {
        (issued > 0).then(|| ((-r - 1) as u64) % issued + 1)
    }
}

fn submit_result<'py>(
    py: Python<'py>,
    r: Result<(u64, bool), cronoq_core::SubmitError>,
) -> PyResult<Obj<'py>> {
    Ok(match r {
        Ok((id, existed)) => tup!(py; "ok", id, existed),
        Err(e) => tup!(py; "err", e.code, e.message),
    })
}

/// Run `ops` on a fresh engine made from `config`; one trace entry per operation.
#[pyfunction]
fn run_engine<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyTuple>,
    ops: &Bound<'py, PyList>,
) -> PyResult<Bound<'py, PyList>> {
    let mut eng = engine(config)?;
    let mut issued: Lease = 0;
    let trace = PyList::empty(py);
    for op in ops.iter() {
        let t = op.cast::<PyTuple>()?;
        let kind: String = item(t, 0)?;
        let now: f64 = item(t, 1)?;
        let result: Obj<'py> = match kind.as_str() {
            "submit" => {
                let spec = Spec::read(t, 2)?;
                let names = spec.names();
                submit_result(py, eng.submit(spec.spec(&names), now))?
            }
            "batch" => {
                let mut owned = Vec::new();
                for s in t.get_item(2)?.cast::<PyList>()?.iter() {
                    owned.push(Spec::read(s.cast::<PyTuple>()?, 0)?);
                }
                let names: Vec<Names<'_>> = owned.iter().map(Spec::names).collect();
                let specs: Vec<TaskSpec<'_>> =
                    owned.iter().zip(&names).map(|(s, n)| s.spec(n)).collect();
                match eng.submit_batch(&specs, now) {
                    Ok(v) => {
                        let out = PyList::empty(py);
                        for (id, existed) in v {
                            out.append(tup!(py; id, existed))?;
                        }
                        tup!(py; "ok", out)
                    }
                    Err(e) => tup!(py; "err", e.code, e.message),
                }
            }
            "dispatch" => {
                eng.dispatch(now);
                py.None().into_bound(py)
            }
            "advance" => {
                eng.advance(now);
                py.None().into_bound(py)
            }
            "complete" | "fail" | "heartbeat" => match pick(&eng, item(t, 2)?, issued) {
                None => "noop".into_bound_py_any(py)?,
                Some(lease) => match kind.as_str() {
                    "complete" => eng.complete(lease, now),
                    "fail" => {
                        let msg: String = item(t, 3)?;
                        eng.fail(lease, now, &msg, item(t, 4)?, item(t, 5)?)
                    }
                    _ => eng.heartbeat(lease, now),
                }
                .into_bound_py_any(py)?,
            },
            "cancel" => {
                let target = t.get_item(2)?;
                let done = if let Ok(id) = target.extract::<u64>() {
                    eng.cancel(TaskRef::Id(id), now)
                } else {
                    let key: String = target.extract()?;
                    eng.cancel(TaskRef::Key(&key), now)
                };
                done.into_bound_py_any(py)?
            }
            "lookup" => {
                let target = t.get_item(2)?;
                let found = if let Ok(id) = target.extract::<u64>() {
                    eng.lookup(TaskRef::Id(id))
                } else {
                    let key: String = target.extract()?;
                    eng.lookup(TaskRef::Key(&key))
                };
                match found {
                    Some(r) => record(py, &eng, r)?,
                    None => py.None().into_bound(py),
                }
            }
            "set_capacity" => {
                let pool: String = item(t, 2)?;
                eng.set_capacity(&pool, item(t, 3)?, now)
                    .map_err(|e| PyValueError::new_err(e.to_string()))?;
                py.None().into_bound(py)
            }
            "set_group" => {
                let pool: String = item(t, 2)?;
                let labels: Vec<(String, String)> = item(t, 3)?;
                eng.set_group_capacity(&pool, &str_pairs(&labels), item(t, 4)?, now)
                    .map_err(|e| PyValueError::new_err(e.to_string()))?;
                py.None().into_bound(py)
            }
            "move" => match pick(&eng, item(t, 2)?, issued) {
                None => "noop".into_bound_py_any(py)?,
                Some(lease) => {
                    let labels: Vec<(String, String)> = item(t, 3)?;
                    if !eng.move_attempt(lease, &str_pairs(&labels)) {
                        return Err(PyValueError::new_err("moved an attempt that ended"));
                    }
                    py.None().into_bound(py)
                }
            },
            "group_room" => {
                let pool: String = item(t, 2)?;
                let labels: Vec<(String, String)> = item(t, 3)?;
                eng.group_has_room(&pool, &str_pairs(&labels))
                    .map_err(|e| PyValueError::new_err(e.to_string()))?
                    .into_bound_py_any(py)?
            }
            "resolve" => {
                let pairs: Vec<(String, u32)> = item(t, 2)?;
                match eng.resolve_resources(&amounts(&pairs)) {
                    Ok(wanted) => {
                        let resources = &eng.parking().resources;
                        let named: Vec<(&str, u32)> = wanted
                            .iter()
                            .map(|&(r, n)| (&*resources[r].name, n))
                            .collect();
                        tup!(py; "ok", named)
                    }
                    Err(e) => tup!(py; "err", e.code, e.message),
                }
            }
            "pause" | "resume" => {
                let pool: String = item(t, 2)?;
                let done = if kind == "pause" {
                    eng.pause(&pool, now)
                } else {
                    eng.resume(&pool, now)
                };
                done.map_err(|e| PyValueError::new_err(e.to_string()))?
                    .into_bound_py_any(py)?
            }
            "delete" => {
                let ids: Vec<u64> = item(t, 2)?;
                eng.delete(&ids).into_bound_py_any(py)?
            }
            "halt" => {
                eng.halt();
                py.None().into_bound(py)
            }
            "abort_running" => {
                let atts = eng.abort_running(now);
                attempts(py, &atts)?
            }
            "snapshot" => {
                let names: Vec<String> = eng
                    .parking()
                    .resources
                    .iter()
                    .map(|r| r.name.to_string())
                    .collect();
                let levels: Vec<f64> = names
                    .iter()
                    .map(|n| eng.resource_level(n, now).expect("a configured resource"))
                    .collect();
                let snap = snapshot(py, &eng.snapshot(now))?;
                tup!(py; snap, levels)
            }
            other => return Err(PyValueError::new_err(format!("unknown operation {other}"))),
        };
        let acts = eng.take();
        if let Some(last) = acts.starts.last() {
            issued = last.lease;
        }
        let events = PyList::empty(py);
        for e in &acts.events {
            events.append(tup!(py;
                e.id, &*e.pool, e.key.as_deref(), e.status.name(), e.attempt, e.at, e.message.as_deref()
            ))?;
        }
        let pools = PyList::empty(py);
        for p in eng.pools() {
            let mut durations: Vec<(&str, f64)> = (0u32..)
                .zip(&p.durations)
                .filter_map(|(k, d)| Some((eng.kind_name(k)?, (*d)?)))
                .collect();
            durations.sort_by(|a, b| a.0.cmp(b.0));
            pools.append(tup!(py;
                p.capacity, p.busy, p.pending_by_class.to_vec(), p.retrying_by_class.to_vec(),
                p.queues.n, p.retries, p.dead_lettered, p.paused, p.learned, durations,
                p.desired(), p.arrivals
            ))?;
        }
        let journal = eng
            .take_journal()
            .expect("the suite's engines keep a journal");
        let jpools: Vec<(&str, bool)> = journal.pools.iter().map(|(n, p)| (&**n, *p)).collect();
        let journal = tup!(py;
            records(py, &eng, &journal.added)?, records(py, &eng, &journal.changed)?, jpools, journal.deleted.clone()
        );
        let totals = totals(eng.totals());
        trace.append(tup!(py;
            result,
            attempts(py, &acts.starts)?,
            attempts(py, &acts.aborts)?,
            records(py, &eng, &acts.finished)?,
            events,
            eng.next_wake(),
            eng.live(),
            totals,
            pools,
            journal,
            parking(py, &eng)?,
        ))?;
    }
    Ok(trace)
}

/// Add the engine's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_engine, m)?)
}
