//! A remote worker for `cronoq-server`: it serves one pool over the `cronoq.v1.Workers/Work`
//! stream (worker protocol v3), running a handler for each lease the server hands out.
//!
//! ```no_run
//! use bytes::Bytes;
//! use cronoq_worker::TaskError;
//! use cronoq_worker::worker::{WorkerOptions, run_worker};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let opts = WorkerOptions::new("http://127.0.0.1:7070", "default").slots(4);
//! run_worker(
//!     opts,
//!     |lease| async move {
//!         let text = std::str::from_utf8(&lease.payload).map_err(TaskError::permanent)?;
//!         Ok(Bytes::from(text.to_uppercase()))
//!     },
//!     async { tokio::signal::ctrl_c().await.ok(); },
//! )
//! .await?;
//! # Ok(())
//! # }
//! ```
//!
//! See [`worker::run_worker`] for what the worker does, and the crate's README for the rules.

mod lease;
mod trace;
pub mod worker;

/// The generated `cronoq.v1` messages and clients (`Workers`, `Tasks`, `Admin`), for calls the
/// worker does not wrap, such as submitting tasks.
pub mod proto {
    tonic::include_proto!("cronoq.v1");
}

pub use cronoq::TaskError;
pub use lease::Lease;
pub use trace::{TRACEPARENT, TRACESTATE, TraceContext};
