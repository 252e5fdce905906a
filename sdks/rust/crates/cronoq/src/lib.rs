//! cronoq for Rust programs. For now this crate holds [`TaskError`], the error type of every
//! attempt: the remote worker's handlers return it (`cronoq_server::worker::run_worker`), as
//! the in-process library's executors will.

mod error;

pub use error::TaskError;
