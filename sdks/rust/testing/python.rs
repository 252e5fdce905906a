//! Shared by the test suites of the workspace's crates (each includes this file with
//! `#[path]`): the Python interpreter that runs this repository's `src`.

use std::path::PathBuf;

/// `$CRONOQ_PYTHON`, else the repository's `.venv` (crates sit at `sdks/rust/crates/<name>`).
pub fn python() -> PathBuf {
    let python = std::env::var_os("CRONOQ_PYTHON").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../../.venv/bin/python"
            ))
        },
        PathBuf::from,
    );
    assert!(
        python.exists(),
        "no Python for cronoq at {} (set CRONOQ_PYTHON)",
        python.display()
    );
    python
}
