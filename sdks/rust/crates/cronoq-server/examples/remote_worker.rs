//! A worker written for the published crates (`cronoq` and `cronoq-server`): it serves the
//! pool `default` over TLS until Ctrl-C, upper-casing each task's text payload.
//!
//! `CRONOQ_ENDPOINT=https://host:port CRONOQ_WORKER_TOKEN=... CRONOQ_CA=ca.pem`

use std::time::Duration;

use bytes::Bytes;
use cronoq::TaskError;
use cronoq_server::worker::{WorkerOptions, WorkerTls, run_worker};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::var("CRONOQ_ENDPOINT")?;
    let token = std::env::var("CRONOQ_WORKER_TOKEN")?;
    let ca = std::fs::read(std::env::var("CRONOQ_CA")?)?;

    let opts = WorkerOptions::new(endpoint, "default")
        .slots(8)
        .token(token)
        .name("w1")
        .tls(WorkerTls {
            ca_pem: Some(ca),
            identity: None,
            domain: None,
        })
        .drain_timeout(Duration::from_secs(60));
    run_worker(
        opts,
        |lease| async move {
            // lease.lease, task_id, attempt, pool, payload, content_type, kind, key, tags,
            // timeout, deadline, cancel (a CancellationToken)
            tokio::select! {
                out = process(&lease.payload) => out.map(Bytes::from).map_err(TaskError::from_err),
                _ = lease.cancel.cancelled() => Err(TaskError::Cancelled),
            }
        },
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// The work: the payload as upper-case text; a payload that is no UTF-8 fails the attempt.
async fn process(payload: &[u8]) -> Result<String, std::str::Utf8Error> {
    std::str::from_utf8(payload).map(str::to_uppercase)
}

async fn shutdown_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
