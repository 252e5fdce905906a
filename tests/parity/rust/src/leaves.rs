//! `cronoq_core::autoscale` and `cronoq_core::stats` for `test_leaves_parity.py`: each call runs
//! whole generated sequences, so that one crossing into Rust answers a batch of examples.

use cronoq_core::autoscale::{AutoscaleSettings, Autoscaler, Signals};
use cronoq_core::stats::{Histogram, PoolStats, Slot, bucket_of, bucket_value, frexp, percentiles};
use pyo3::prelude::*;

/// `AutoscaleSettings` field by field, in the dataclass's order (`slo` as (class, seconds)).
pub(crate) type SettingsFields = (
    f64,
    f64,
    f64,
    Vec<(usize, f64)>,
    f64,
    f64,
    f64,
    i64,
    i64,
    f64,
    f64,
    f64,
);

pub(crate) fn settings(f: SettingsFields) -> AutoscaleSettings {
    AutoscaleSettings {
        interval: f.0,
        target_utilization: f.1,
        drain_time: f.2,
        slo: f.3.into_iter().collect(),
        reservation_horizon: f.4,
        stabilization_window: f.5,
        cooldown: f.6,
        max_step_up_abs: f.7,
        max_step_down: f.8,
        max_step_up_ratio: f.9,
        ewma_alpha: f.10,
        cost_per_worker_second: f.11,
    }
}

/// The message of the first setting `AutoscaleConfig` would refuse, for each case.
#[pyfunction]
fn autoscale_validate(cases: Vec<SettingsFields>) -> Vec<Option<String>> {
    cases
        .into_iter()
        .map(|f| settings(f).validate().err().map(|e| e.message))
        .collect()
}

/// One `evaluate` call: now, arrivals, service_time, backlog_by_class, busy, capacity,
/// reserved, stranded.
type Step = (f64, i64, f64, [i64; 4], i64, i64, i64, bool);

/// After a step: the returned capacity, `desired`, `next_eval` and `ewma`.
type StepOut = (i64, i64, f64, Option<f64>);

/// An autoscaler made from settings, min, max and now, and the steps to take.
type ScalerCase = (SettingsFields, i64, i64, f64, Vec<Step>);

/// For each case, what each of its steps gave.
#[pyfunction]
fn autoscale_runs(cases: Vec<ScalerCase>) -> Vec<Vec<StepOut>> {
    cases
        .into_iter()
        .map(|(fields, min, max, start, steps)| {
            let mut a = Autoscaler::new(settings(fields), min, max, start);
            steps
                .into_iter()
                .map(
                    |(now, arrivals, service_time, backlog, busy, capacity, reserved, stranded)| {
                        let signals = Signals {
                            arrivals,
                            service_time,
                            backlog_by_class: backlog,
                            busy,
                            capacity,
                            reserved,
                            stranded,
                        };
                        let new = a.evaluate(now, &signals);
                        (new, a.desired(), a.next_eval(), a.ewma())
                    },
                )
                .collect()
        })
        .collect()
}

/// `math.frexp` of each value.
#[pyfunction]
fn stats_frexp(xs: Vec<f64>) -> Vec<(f64, i32)> {
    xs.into_iter().map(frexp).collect()
}

/// `(bucket_of(x), bucket_value(bucket_of(x)))` of each sample.
#[pyfunction]
fn stats_buckets(xs: Vec<f64>) -> Vec<(i32, f64)> {
    xs.into_iter()
        .map(|x| {
            let b = bucket_of(x);
            (b, bucket_value(b))
        })
        .collect()
}

/// Histograms as (bucket, count) pairs, and the percentiles to read from them.
type PercentileCase = (Vec<Vec<(i32, u64)>>, Vec<f64>);

/// `percentiles(hists, ps)` for each case.
#[pyfunction]
fn stats_percentiles(cases: Vec<PercentileCase>) -> Vec<Vec<f64>> {
    cases
        .into_iter()
        .map(|(hists, ps)| {
            let hists: Vec<Histogram> =
                hists.into_iter().map(|h| h.into_iter().collect()).collect();
            percentiles(&hists, &ps)
        })
        .collect()
}

/// One call on a `PoolStats`: (op, now, x, a, b, flag) where op is 0 `level(now, a, b)`,
/// 1 `on_dispatch(now, x, flag)`, 2 `on_attempt_end(now, x, flag)`, 3 `on_retry(now)`,
/// 4 `on_fixed_start(now, flag)`, 5 a snapshot at `now`.
type Op = (u8, f64, f64, i64, i64, bool);

/// A slot: sec, its seven counters, its four float sums, its two histograms (sorted).
type SlotOut = (i64, Vec<u64>, Vec<f64>, Vec<(i32, u64)>, Vec<(i32, u64)>);

/// A snapshot: `window_slots(now)` in slot order, then `summary(now)` as its four counts and
/// ten floats in the dict's order, then `worker_seconds`.
type SnapshotOut = (Vec<SlotOut>, Vec<u64>, Vec<f64>, f64);

fn slot_out(s: &Slot) -> SlotOut {
    let hist = |h: &Histogram| h.iter().map(|(&b, &n)| (b, n)).collect();
    (
        s.sec,
        vec![
            s.dispatched,
            s.adherent,
            s.succeeded,
            s.failed,
            s.retried,
            s.fixed,
            s.fixed_hits,
        ],
        vec![s.busy_s, s.cap_s, s.success_s, s.wait_sum],
        hist(&s.wait_hist),
        hist(&s.run_hist),
    )
}

/// For each `(now, capacity, window, ops)`: a `PoolStats` made at `now`, driven by `ops`; the
/// snapshots those took.
#[pyfunction]
fn stats_runs(cases: Vec<(f64, i64, f64, Vec<Op>)>) -> Vec<Vec<SnapshotOut>> {
    cases
        .into_iter()
        .map(|(start, capacity, window, ops)| {
            let mut st = PoolStats::with_window(start, capacity, window);
            let mut out = Vec::new();
            for (op, now, x, a, b, flag) in ops {
                match op {
                    0 => st.level(now, a, b),
                    1 => st.on_dispatch(now, x, flag),
                    2 => st.on_attempt_end(now, x, flag),
                    3 => st.on_retry(now),
                    4 => st.on_fixed_start(now, flag),
                    _ => {
                        let slots = st.window_slots(now).into_iter().map(slot_out).collect();
                        let m = st.summary(now);
                        let counts = vec![m.dispatched, m.succeeded, m.failed, m.retried];
                        let floats = vec![
                            m.priority_adherence,
                            m.fixed_start_hit_rate,
                            m.utilization,
                            m.schedule_efficiency,
                            m.wait_mean,
                            m.wait_p50,
                            m.wait_p90,
                            m.wait_p99,
                            m.run_p50,
                            m.run_p99,
                        ];
                        out.push((slots, counts, floats, st.worker_seconds()));
                    }
                }
            }
            out
        })
        .collect()
}

/// Add the autoscaler and stats functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(autoscale_validate, m)?)?;
    m.add_function(wrap_pyfunction!(autoscale_runs, m)?)?;
    m.add_function(wrap_pyfunction!(stats_frexp, m)?)?;
    m.add_function(wrap_pyfunction!(stats_buckets, m)?)?;
    m.add_function(wrap_pyfunction!(stats_percentiles, m)?)?;
    m.add_function(wrap_pyfunction!(stats_runs, m)?)?;
    Ok(())
}
