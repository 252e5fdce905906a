//! `cronoq_core::cron` for `test_cron_parity.py`: batch calls, so that one crossing into Rust
//! answers a whole generated example.

use std::collections::HashMap;

use cronoq_core::cron::{CronError, Zone, parse_cron, zone};
use pyo3::prelude::*;

/// What `parse_cron` keeps of an expression, in the order the test reads it from Python's
/// `CronSpec`: seconds, minutes, hours, days, months, weekdays, years (None: any),
/// either_day, interval.
type Fields = (
    Vec<u32>,
    Vec<u32>,
    Vec<u32>,
    Vec<u32>,
    Vec<u32>,
    Vec<u32>,
    Option<Vec<i32>>,
    bool,
    bool,
);

/// Parse each expression: `(fields, None)` or `(None, message)`.
#[pyfunction]
fn cron_parse(exprs: Vec<String>) -> Vec<(Option<Fields>, Option<String>)> {
    exprs
        .iter()
        .map(|expr| match parse_cron(expr) {
            Ok(spec) => {
                let fields = (
                    spec.seconds(),
                    spec.minutes(),
                    spec.hours(),
                    spec.days(),
                    spec.months(),
                    spec.weekdays(),
                    spec.years().map(<[i32]>::to_vec),
                    spec.either_day(),
                    spec.is_interval(),
                );
                (Some(fields), None)
            }
            Err(e) => (None, Some(e.message().to_owned())),
        })
        .collect()
}

/// Look each zone name up: `None` when it loads, otherwise the error message.
#[pyfunction]
fn cron_zone(names: Vec<Option<String>>) -> Vec<Option<String>> {
    names
        .iter()
        .map(|name| zone(name.as_deref()).err().map(|e| e.message().to_owned()))
        .collect()
}

/// For each `(expr, zone, t, steps)`, follow `next_after` from `t` up to `steps` times: the
/// occurrences found (ending at the first None) and the message of the error that stopped the
/// chain, if any (a parse, zone or time error).
#[pyfunction]
fn cron_next_chains(
    cases: Vec<(String, Option<String>, f64, usize)>,
) -> Vec<(Vec<Option<f64>>, Option<String>)> {
    let mut zones: HashMap<Option<String>, Result<Zone, CronError>> = HashMap::new();
    cases
        .into_iter()
        .map(|(expr, name, t, steps)| {
            let tz = zones
                .entry(name.clone())
                .or_insert_with(|| zone(name.as_deref()));
            let failed = |e: &CronError| (Vec::new(), Some(e.message().to_owned()));
            let spec = match parse_cron(&expr) {
                Ok(spec) => spec,
                Err(e) => return failed(&e),
            };
            let tz = match tz {
                Ok(tz) => &*tz,
                Err(e) => return failed(e),
            };
            let mut found = Vec::new();
            let mut t = t;
            for _ in 0..steps {
                match spec.try_next_after(t, tz) {
                    Ok(Some(next)) => {
                        found.push(Some(next));
                        t = next;
                    }
                    Ok(None) => {
                        found.push(None);
                        break;
                    }
                    Err(e) => return (found, Some(e.message().to_owned())),
                }
            }
            (found, None)
        })
        .collect()
}

/// Add the cron functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cron_parse, m)?)?;
    m.add_function(wrap_pyfunction!(cron_zone, m)?)?;
    m.add_function(wrap_pyfunction!(cron_next_chains, m)?)?;
    Ok(())
}
