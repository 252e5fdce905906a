//! A complete client: it submits a task to the pool `default` of the server at
//! `$CRONOQ_ENDPOINT` (default `http://127.0.0.1:7070`), waits for it and prints its output.
//! The crate wraps only the worker; calls like this one use the generated clients in `proto`.

use cronoq_worker::proto::tasks_client::TasksClient;
use cronoq_worker::proto::{SubmitRequest, TaskSpec, TaskStatus};
use tonic::Request;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint =
        std::env::var("CRONOQ_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:7070".into());
    let text = std::env::args().nth(1).unwrap_or_else(|| "hello".into());
    let mut tasks = TasksClient::connect(endpoint).await?;
    let mut request = Request::new(SubmitRequest {
        task: Some(TaskSpec {
            pool: "default".into(),
            payload: text.into_bytes().into(),
            ..Default::default()
        }),
        wait: true,
        wait_timeout_s: Some(60.0),
    });
    if let Ok(token) = std::env::var("CRONOQ_TOKEN") {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
    }
    let answer = tasks.submit(request).await?.into_inner();
    let result = answer.result.ok_or("the task did not finish within 60 s")?;
    if result.status() != TaskStatus::Succeeded {
        return Err(format!(
            "task {} ended {:?}: {}",
            answer.id,
            result.status(),
            result.message
        )
        .into());
    }
    println!("{}", String::from_utf8_lossy(result.output()));
    Ok(())
}
