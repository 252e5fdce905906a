//! The Rust engine core as a Python module, for the differential suite only.

mod cron;
mod engine;
mod leaves;
mod restore;

use pyo3::prelude::*;

#[pymodule]
fn cronoq_core_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    cron::register(m)?;
    engine::register(m)?;
    leaves::register(m)?;
    Ok(())
}
