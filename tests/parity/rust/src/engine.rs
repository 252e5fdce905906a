//! The engine's side of the differential suite (tests/parity/engine_ops.py): runs a whole
//! operation sequence on the Rust engine in one call and returns its normalized trace, which
//! the suite compares with the Python engine's, operation by operation and field by field.

use crate::leaves::{SettingsFields, settings};
use crate::restore::restart;
use cronoq_core::autoscale::AutoscaleSettings;
use cronoq_core::cron::{parse_cron, zone};
use cronoq_core::model::{
    Attempt, AttemptOutcome, DepTarget, Extras, Lease, Observer, Resolved, RetryPolicy, Scoring,
    Snapshot, TaskRecord, py_cmp,
};
use cronoq_core::parking::Parked;
use cronoq_core::recurring::Recurring;
use cronoq_core::vocab::{OnMiss, Overflow, Overlap};
use cronoq_core::{
    DepOn, Engine, EngineOptions, EventLevel, MersenneTwister, PoolConfig, ResourceConfig, TaskRef,
    TaskSpec, UnknownDependency,
};
use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub(crate) type Obj<'py> = Bound<'py, PyAny>;

/// A Python tuple of the values, each converted.
macro_rules! tup {
    ($py:expr; $($v:expr),* $(,)?) => {
        PyTuple::new($py, [$($v.into_bound_py_any($py)?),*])?.into_any()
    };
}

pub(crate) fn item<'py, T: for<'a> FromPyObjectOwned<'py>>(
    t: &Bound<'py, PyTuple>,
    i: usize,
) -> PyResult<T> {
    t.get_item(i)?.extract::<T>().map_err(Into::into)
}

pub(crate) fn retry(t: &Obj<'_>) -> PyResult<Option<RetryPolicy>> {
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

/// A dependency's target as the suite encodes it: an id (int) or a key (str).
enum Target {
    Id(u64),
    Key(String),
}

impl Target {
    fn read(t: &Obj<'_>) -> PyResult<Target> {
        Ok(match t.extract::<u64>() {
            Ok(id) => Target::Id(id),
            Err(_) => Target::Key(t.extract()?),
        })
    }

    fn task_ref(&self) -> TaskRef<'_> {
        match self {
            Target::Id(id) => TaskRef::Id(*id),
            Target::Key(key) => TaskRef::Key(key),
        }
    }
}

fn dep_on(name: &str) -> PyResult<DepOn> {
    DepOn::parse(name).ok_or_else(|| PyValueError::new_err(format!("unknown condition {name}")))
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
    start: Option<(f64, f64, OnMiss)>,
    deps: Vec<(Target, DepOn)>,
    resources: Vec<(String, u32)>,
    labels: Option<Vec<(String, String)>>,
}

fn on_miss(name: &str) -> PyResult<OnMiss> {
    OnMiss::parse(name).ok_or_else(|| PyValueError::new_err(format!("unknown on_miss {name}")))
}

/// Pairs of names borrowed from owned ones, as `TaskSpec` and the engine's calls take them.
pub(crate) fn str_pairs(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
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
        let start = match item::<Option<(f64, f64, String)>>(t, at + 9)? {
            None => None,
            Some((start_at, tolerance, miss)) => Some((start_at, tolerance, on_miss(&miss)?)),
        };
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
            start,
            deps: match t.get_item(at + 10)? {
                d if d.is_none() => Vec::new(),
                d => {
                    let mut out = Vec::new();
                    for edge in d.cast::<PyList>()?.iter() {
                        let edge = edge.cast::<PyTuple>()?;
                        let on: String = item(edge, 1)?;
                        out.push((Target::read(&edge.get_item(0)?)?, dep_on(&on)?));
                    }
                    out
                }
            },
            resources: item::<Option<Vec<(String, u32)>>>(t, at + 11)?.unwrap_or_default(),
            labels: item(t, at + 12)?,
        })
    }

    /// The edges as a `TaskSpec` borrows them.
    fn edges(&self) -> Vec<(TaskRef<'_>, DepOn)> {
        self.deps
            .iter()
            .map(|(t, on)| (t.task_ref(), *on))
            .collect()
    }

    /// The spec, borrowing `edges` (`Spec::edges`) and `names` for its resources and labels
    /// (`Spec::names`).
    fn spec<'a>(&'a self, edges: &'a [(TaskRef<'a>, DepOn)], names: &'a Names<'a>) -> TaskSpec<'a> {
        let (start_at, tolerance, on_miss) = match self.start {
            Some((at, tolerance, on_miss)) => (Some(at), tolerance, on_miss),
            None => (None, 1.0, OnMiss::RunLate),
        };
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
            start_at,
            tolerance,
            on_miss,
            deps: edges,
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

/// The schedule of an add_recurring or resume_recurring operation (engine_ops._schedule):
/// (name, cron, zone, template, overlap, tolerance, on_miss) from `at`.
pub(crate) fn schedule(t: &Bound<'_, PyTuple>, at: usize) -> PyResult<Recurring> {
    let name: String = item(t, at)?;
    let expr: String = item(t, at + 1)?;
    let tz: Option<String> = item(t, at + 2)?;
    let spec = parse_cron(&expr).map_err(|e| PyValueError::new_err(e.message().to_owned()))?;
    let tz = zone(tz.as_deref()).map_err(|e| PyValueError::new_err(e.message().to_owned()))?;
    let template = t.get_item(at + 3)?;
    let tpl = template.cast::<PyTuple>()?;
    let mut sched = Recurring::new(&name, spec, tz, &item::<String>(tpl, 0)?);
    sched.cls = item(tpl, 1)?;
    sched.kind = item(tpl, 2)?;
    sched.key = item(tpl, 3)?;
    sched.deadline_in = item(tpl, 4)?;
    sched.duration_hint = item(tpl, 5)?;
    sched.timeout = item(tpl, 6)?;
    sched.retry = retry(&tpl.get_item(7)?)?;
    sched.tenant = item(tpl, 8)?;
    sched.resources = item::<Option<_>>(tpl, 9)?.unwrap_or_default();
    sched.labels = item::<Option<_>>(tpl, 10)?.unwrap_or_default();
    let overlap: String = item(t, at + 4)?;
    sched.overlap = Overlap::parse(&overlap)
        .ok_or_else(|| PyValueError::new_err(format!("unknown overlap {overlap}")))?;
    sched.tolerance = item(t, at + 5)?;
    sched.on_miss = on_miss(&item::<String>(t, at + 6)?)?;
    Ok(sched)
}

/// `AutoscaleSettings` field by field, as the leaves' suite passes them, or None.
fn autoscale(t: &Obj<'_>) -> PyResult<Option<AutoscaleSettings>> {
    if t.is_none() {
        return Ok(None);
    }
    Ok(Some(settings(t.extract::<SettingsFields>()?)))
}

/// What the engine's observer was told, in order (engine_ops.Recorder).
#[derive(Clone, Default)]
pub(crate) struct Recorder(Arc<Mutex<Vec<Call>>>);

/// One observer call: (lease, task, attempt number), then the wait, or the outcome and the
/// runtime.
enum Call {
    Started(Lease, u64, u32, f64),
    Ended(Lease, u64, u32, AttemptOutcome, f64),
}

impl Observer for Recorder {
    fn started(&mut self, att: &Attempt, wait: f64) {
        let call = Call::Started(att.lease, att.task, att.number, wait);
        self.0.lock().expect("not poisoned").push(call);
    }

    fn ended(&mut self, att: &Attempt, outcome: AttemptOutcome, runtime: f64) {
        let call = Call::Ended(att.lease, att.task, att.number, outcome, runtime);
        self.0.lock().expect("not poisoned").push(call);
    }
}

impl Recorder {
    /// The calls since the last take, as engine_ops.Recorder.take gives them.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Obj<'py>> {
        let out = PyList::empty(py);
        for call in self.0.lock().expect("not poisoned").drain(..) {
            out.append(match call {
                Call::Started(lease, task, n, wait) => tup!(py; "started", lease, task, n, wait),
                Call::Ended(lease, task, n, outcome, runtime) => {
                    tup!(py; "ended", lease, task, n, outcome.name(), runtime)
                }
            })?;
        }
        Ok(out.into_any())
    }
}

pub(crate) fn engine(
    config: &Bound<'_, PyTuple>,
    recorder: &Recorder,
    first_id: u64,
) -> PyResult<Engine> {
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
        aging_rates: item(sc, 7)?,
        age_caps: item(sc, 8)?,
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
        let unknown: String = item(p, 13)?;
        cfg.unknown_dependency = UnknownDependency::parse(&unknown)
            .ok_or_else(|| PyValueError::new_err(format!("unknown policy {unknown}")))?;
        cfg.await_timeout = item(p, 14)?;
        cfg.reservable_fraction = item(p, 15)?;
        cfg.max_hold = item(p, 16)?;
        cfg.metrics_window = item(p, 17)?;
        pools.push(cfg);
    }
    let options = EngineOptions {
        scoring,
        event_level,
        retention: item(config, 3)?,
        retention_max: item(config, 4)?,
        first_id,
        journal: true,
        elastic: item(config, 6)?,
        resources: config
            .get_item(7)?
            .cast::<PyList>()?
            .iter()
            .map(|r| resource(r.cast::<PyTuple>()?))
            .collect::<PyResult<_>>()?,
    };
    let mut eng = Engine::new(pools, 0.0, options, MersenneTwister::new(i128::from(seed)))
        .map_err(|e| PyValueError::new_err(e.0))?;
    if item(config, 8)? {
        eng.observe(Box::new(recorder.clone()));
    }
    Ok(eng)
}

/// engine_ops.deps_row: the dependency fields of the extras.
fn deps_row<'py>(py: Python<'py>, e: Option<&Extras>) -> PyResult<Obj<'py>> {
    let Some(e) = e else {
        let empty = PyTuple::empty(py);
        return Ok(tup!(py; py.None(), 0u32, &empty, py.None(), &empty, &empty));
    };
    let target = |t: &DepTarget| match t {
        DepTarget::Id(id) => id.into_bound_py_any(py),
        DepTarget::Key(key) => (**key).into_bound_py_any(py),
    };
    let deps = if e.deps.is_empty() {
        py.None().into_bound(py)
    } else {
        let edges: Vec<Obj<'py>> = e
            .deps
            .iter()
            .map(|(t, on)| Ok(tup!(py; target(t)?, on.name())))
            .collect::<PyResult<_>>()?;
        PyTuple::new(py, edges)?.into_any()
    };
    let mut awaits: Vec<&str> = e.awaits.iter().map(|k| &**k).collect();
    awaits.sort_unstable();
    let resolved = match &e.resolved {
        None => py.None().into_bound(py),
        Some(edges) => {
            let rows: Vec<Obj<'py>> = edges
                .iter()
                .map(|(r, on)| match r {
                    Resolved::Parent(id) => Ok(tup!(py; *id, py.None(), on.name())),
                    Resolved::Awaited(key) => Ok(tup!(py; py.None(), &**key, on.name())),
                })
                .collect::<PyResult<_>>()?;
            PyTuple::new(py, rows)?.into_any()
        }
    };
    let children: Vec<Obj<'py>> = e
        .children
        .iter()
        .map(|(id, on)| Ok(tup!(py; *id, on.name())))
        .collect::<PyResult<_>>()?;
    Ok(tup!(py;
        deps,
        e.waiting,
        PyTuple::new(py, awaits)?,
        resolved,
        PyTuple::new(py, &e.parents)?,
        PyTuple::new(py, children)?,
    ))
}

fn record<'py>(py: Python<'py>, eng: &Engine, r: &TaskRecord) -> PyResult<Obj<'py>> {
    let history = PyList::empty(py);
    for p in r.history() {
        history.append(
            tup!(py; p.number, p.started_at, p.ended_at, p.outcome.name(), p.message.as_str()),
        )?;
    }
    let fixed = match r.extra.as_deref() {
        Some(e) if e.start_at.is_some() => tup!(py;
            e.start_at, e.tolerance, e.on_miss.name(), e.held, e.due, e.fixed_done,
            e.recurring.is_some(),
        ),
        _ => py.None().into_bound(py),
    };
    let tag = r.extra.as_deref().and_then(|e| e.schedule.as_deref());
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
        fixed,
        tag.into_bound_py_any(py)?,
        deps_row(py, r.extra.as_deref())?,
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
pub(crate) fn labels<'py>(
    py: Python<'py>,
    l: Option<&[(Arc<str>, Arc<str>)]>,
) -> PyResult<Obj<'py>> {
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
            p.held.into_bound_py_any(py)?,
            p.desired.into_bound_py_any(py)?,
            p.pending.into_bound_py_any(py)?,
            p.pending_by_class.to_vec().into_bound_py_any(py)?,
            p.ready.into_bound_py_any(py)?,
            p.reservations.into_bound_py_any(py)?,
            p.window.into_bound_py_any(py)?,
            p.dispatched.into_bound_py_any(py)?,
            p.succeeded.into_bound_py_any(py)?,
            p.failed.into_bound_py_any(py)?,
            p.retried.into_bound_py_any(py)?,
            p.priority_adherence.into_bound_py_any(py)?,
            p.fixed_start_hit_rate.into_bound_py_any(py)?,
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
    let recorder = Recorder::default();
    let mut eng = engine(config, &recorder, 1)?;
    let mut issued: Lease = 0;
    // each schedule's latest definition (restarts resume it)
    let mut defined: HashMap<String, Bound<'py, PyTuple>> = HashMap::new();
    let trace = PyList::empty(py);
    for op in ops.iter() {
        let t = op.cast::<PyTuple>()?;
        let kind: String = item(t, 0)?;
        let now: f64 = item(t, 1)?;
        let result: Obj<'py> = match kind.as_str() {
            "submit" => {
                let spec = Spec::read(t, 2)?;
                let edges = spec.edges();
                let names = spec.names();
                submit_result(py, eng.submit(spec.spec(&edges, &names), now))?
            }
            "batch" => {
                let mut owned = Vec::new();
                for s in t.get_item(2)?.cast::<PyList>()?.iter() {
                    owned.push(Spec::read(s.cast::<PyTuple>()?, 0)?);
                }
                let edges: Vec<Vec<(TaskRef<'_>, DepOn)>> = owned.iter().map(Spec::edges).collect();
                let names: Vec<Names<'_>> = owned.iter().map(Spec::names).collect();
                let specs: Vec<TaskSpec<'_>> = owned
                    .iter()
                    .zip(edges.iter().zip(&names))
                    .map(|(s, (e, n))| s.spec(e, n))
                    .collect();
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
                let target = Target::read(&t.get_item(2)?)?;
                match eng.lookup(target.task_ref()) {
                    Some(r) => record(py, &eng, r)?,
                    None => py.None().into_bound(py),
                }
            }
            "dependents" => {
                let target = Target::read(&t.get_item(2)?)?;
                match eng.dependents(target.task_ref()) {
                    Some(children) => {
                        let out = PyList::empty(py);
                        for (id, on) in children {
                            out.append(tup!(py; id, on.name()))?;
                        }
                        out.into_any()
                    }
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
            "ready_view" => {
                let out = PyList::empty(py);
                for v in eng.ready_view() {
                    out.append(tup!(py;
                        &*v.pool, v.ready_by_class.to_vec(), v.oldest_ready_at.to_vec(),
                        v.retries, v.dead_lettered
                    ))?;
                }
                out.into_any()
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
            "add_recurring" => {
                eng.add_recurring(schedule(t, 2)?, now)
                    .map_err(|e| PyValueError::new_err(e.message))?;
                defined.insert(item(t, 2)?, t.clone());
                py.None().into_bound(py)
            }
            "resume_recurring" => {
                eng.resume_recurring(schedule(t, 2)?, item(t, 9)?, item(t, 10)?, now)
                    .map_err(|e| PyValueError::new_err(e.message))?;
                defined.insert(item(t, 2)?, t.clone());
                py.None().into_bound(py)
            }
            "restart" => {
                let (fresh, rows) = restart(py, &eng, t, &defined, &recorder)?;
                eng = fresh;
                issued = 0;
                rows
            }
            "remove_recurring" => {
                let name: String = item(t, 2)?;
                eng.remove_recurring(&name, now).into_bound_py_any(py)?
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
            let reservations: Vec<(u64, f64, f64)> = p
                .reservations
                .iter()
                .map(|(&id, &(lo, hi))| (id, lo, hi))
                .collect();
            let mut due: Vec<(f64, u64, u64)> =
                p.due.iter().map(|e| (e.start, e.seq, e.task)).collect();
            due.sort_by(|a, b| py_cmp(a.0, b.0).then(a.1.cmp(&b.1)));
            pools.append(tup!(py;
                p.capacity, p.busy, p.pending_by_class.to_vec(), p.retrying_by_class.to_vec(),
                p.queues.n, p.retries, p.dead_lettered, p.paused, p.learned, durations,
                p.desired(), p.arrivals, p.reservation_limit, p.holds,
                p.unready_by_class.to_vec(), reservations, due, p.misses.clone()
            ))?;
        }
        let journal = eng
            .take_journal()
            .expect("the suite's engines keep a journal");
        let jpools: Vec<(&str, bool)> = journal.pools.iter().map(|(n, p)| (&**n, *p)).collect();
        let jschedules: Vec<(&str, Option<f64>, Option<u64>)> = journal
            .schedules
            .iter()
            .map(|s| (&*s.name, s.next_time, s.last))
            .collect();
        let journal = tup!(py;
            records(py, &eng, &journal.added)?, records(py, &eng, &journal.changed)?,
            jschedules, jpools, journal.deleted.clone()
        );
        let recurring = PyList::empty(py);
        for s in eng.recurring() {
            recurring.append(tup!(py;
                &*s.name, s.next_time(), s.last(), s.queued(), s.recent().to_vec()
            ))?;
        }
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
            recurring,
            parking(py, &eng)?,
            recorder.take(py)?,
        ))?;
    }
    Ok(trace)
}

/// Add the engine's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_engine, m)?)
}
