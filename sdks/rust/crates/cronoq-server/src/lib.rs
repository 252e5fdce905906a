//! The remote worker under the module path of the published `cronoq-server` crate, so that a
//! program written for it builds with only its `Cargo.toml` dependency lines changed. The
//! server itself is the Python `cronoq-server`; this crate has no server code.

/// Running a remote worker: [`run_worker`](worker::run_worker), its options and its errors,
/// as implemented by the `cronoq-worker` crate.
pub mod worker {
    pub use cronoq_worker::worker::*;
    pub use cronoq_worker::{Lease, TraceContext};
}
