//! The Rust side of the repository's `bench/workers.py`: a worker of one pool that completes
//! every lease at once, through `run_worker` (`--mode sdk`) or straight on the generated stubs
//! (`--mode raw`, the baseline that shows what the SDK adds). It stops on SIGTERM.
//!
//! `bench_worker --mode raw|sdk --target HOST:PORT [--pool default] [--slots 64]`

use bytes::Bytes;
use cronoq_worker::proto::workers_client::WorkersClient;
use cronoq_worker::proto::{Complete, Register, WorkerMessage, server_message, worker_message};
use cronoq_worker::worker::{WorkerOptions, run_worker};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let (mut mode, mut target, mut pool, mut slots) = (
        String::from("raw"),
        String::new(),
        String::from("default"),
        64u32,
    );
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--mode" => mode = value,
            "--target" => target = value,
            "--pool" => pool = value,
            "--slots" => slots = value.parse()?,
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    let endpoint = format!("http://{target}");
    let mut term = signal(SignalKind::terminate())?;
    if mode == "sdk" {
        let opts = WorkerOptions::new(endpoint, pool)
            .slots(slots)
            .name("bench-rust-sdk");
        run_worker(opts, |_lease| async { Ok(Bytes::new()) }, async move {
            term.recv().await;
        })
        .await?;
        return Ok(());
    }
    tokio::select! {
        done = raw(endpoint, pool, slots) => done,
        _ = term.recv() => Ok(()),
    }
}

/// Registers, then answers each Lease with a Complete from the same task: no handler tasks,
/// no heartbeats, nothing but the protocol's minimum.
async fn raw(endpoint: String, pool: String, slots: u32) -> Result<(), Error> {
    let mut client = WorkersClient::connect(endpoint).await?;
    let (tx, rx) = mpsc::channel(1024);
    let message = |msg| WorkerMessage { msg: Some(msg) };
    tx.send(message(worker_message::Msg::Register(Register {
        pool,
        slots,
        worker_name: "bench-rust-raw".into(),
        protocol_version: 3,
        ..Default::default()
    })))
    .await?;
    let mut stream = client.work(ReceiverStream::new(rx)).await?.into_inner();
    while let Some(reply) = stream.message().await? {
        match reply.msg {
            Some(server_message::Msg::Lease(lease)) => {
                let done = Complete {
                    lease: lease.lease,
                    ..Default::default()
                };
                tx.send(message(worker_message::Msg::Complete(done)))
                    .await?;
            }
            Some(server_message::Msg::Shutdown(_)) => break,
            _ => {}
        }
    }
    Ok(())
}
