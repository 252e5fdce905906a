//! Library mode: tasks run in this process, on tokio. Two schedulers show the two ways to write
//! an executor: a closure, and a type implementing `Executor` (here a stand-in HTTP client).
//! `cargo run -p cronoq --example library` prints each task's output.

use std::sync::Arc;
use std::time::Duration;

use cronoq::{BoxFuture, Executor, LeaseId, Pool, Scheduler, Task, TaskContext, TaskError};

/// The closure form's payload.
struct Job {
    text: String,
}

/// The real work; here it only takes a moment.
async fn do_work(job: &Job) -> Result<String, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(job.text.to_uppercase())
}

/// The trait form's payload and output.
struct Request {
    path: String,
}

struct Response {
    status: u16,
    body: String,
}

/// A stand-in for an HTTP client: it answers `/status` and nothing else.
#[derive(Clone)]
struct Client {
    host: Arc<str>,
}

impl Client {
    async fn get(&self, path: &str) -> Result<Response, std::io::Error> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (status, body) = match path {
            "/status" => (200, format!("{} is up", self.host)),
            _ => (404, String::new()),
        };
        Ok(Response { status, body })
    }
}

struct HttpExecutor {
    client: Client,
}

impl Executor<Request, Response> for HttpExecutor {
    fn execute(
        &self,
        ctx: TaskContext,
        req: Arc<Request>,
    ) -> BoxFuture<Result<Response, TaskError>> {
        let client = self.client.clone();
        Box::pin(async move {
            let resp = client.get(&req.path).await.map_err(TaskError::from_err)?;
            match resp.status {
                // A retry cannot fix a client error.
                400..=499 => Err(TaskError::permanent(format!(
                    "GET {} (attempt {}): {}",
                    req.path, ctx.attempt, resp.status
                ))),
                _ => Ok(resp),
            }
        })
    }

    // Optional: release per-lease resources synchronously when the engine abandons an attempt.
    fn abort(&self, _lease: LeaseId) {}
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let jobs = Scheduler::<Job, String>::builder()
        .pool(
            Pool::new("default").executor_fn(|ctx: TaskContext, job: Arc<Job>| async move {
                tokio::select! {
                    r = do_work(&job) => r.map_err(TaskError::from_err),
                    _ = ctx.cancelled() => Err(TaskError::Cancelled),
                }
            }),
        )
        .build()
        .await?;
    let handle = jobs
        .submit(Task::new(Job {
            text: "hello".into(),
        }))
        .await?;
    println!("job: {}", handle.await?);

    let http = Scheduler::<Request, Response>::builder()
        .pool(Pool::fixed("default", 4).executor(HttpExecutor {
            client: Client {
                host: "example.com".into(),
            },
        }))
        .build()
        .await?;
    let ok = http
        .submit(Task::new(Request {
            path: "/status".into(),
        }))
        .await?;
    let missing = http
        .submit(Task::new(Request {
            path: "/nope".into(),
        }))
        .await?;
    let resp = ok.await?;
    println!("request: {} {}", resp.status, resp.body);
    println!("request: {}", missing.await.err().ok_or("/nope succeeded")?);

    jobs.shutdown(Duration::from_secs(5)).await?;
    http.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}
