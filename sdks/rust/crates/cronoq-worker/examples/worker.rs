//! A complete worker: it serves the pool `default` of the server at `$CRONOQ_ENDPOINT`
//! (default `http://127.0.0.1:7070`) until Ctrl-C, upper-casing each task's text payload.

use std::time::Duration;

use bytes::Bytes;
use cronoq_worker::TaskError;
use cronoq_worker::worker::{WorkerOptions, run_worker};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint =
        std::env::var("CRONOQ_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:7070".into());
    let mut opts = WorkerOptions::new(endpoint, "default")
        .slots(8)
        .name("shouter-1")
        .drain_timeout(Duration::from_secs(60));
    if let Ok(token) = std::env::var("CRONOQ_WORKER_TOKEN") {
        opts = opts.token(token);
    }
    run_worker(
        opts,
        |lease| async move {
            // Not UTF-8: no retry can fix that.
            let text = std::str::from_utf8(&lease.payload).map_err(TaskError::permanent)?;
            tokio::select! {
                out = shout(text) => out.map(Bytes::from).map_err(TaskError::from_err),
                () = lease.cancel.cancelled() => Err(TaskError::Cancelled),
            }
        },
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    )
    .await?;
    Ok(())
}

/// The real work; here it only takes a moment.
async fn shout(text: &str) -> Result<String, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(text.to_uppercase())
}
