//! The floor: the least a tokio scheduler with this API does per task, for a baseline. It has
//! the message flow of a driver task that owns the state (a call sends a command and awaits a
//! oneshot reply; each attempt is a spawned task that reports on a channel; each handle is a
//! oneshot) and a FIFO queue in front of a fixed number of slots, and nothing else: no
//! priorities, engine, timers, clock, retries, keys, events, output cache or panic catching.
//! The bench body drives it through the same calls as the two crates.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Exec<P, O> = Arc<dyn Fn(TaskContext, Arc<P>) -> BoxFuture<Result<O, TaskError>> + Send + Sync>;

/// What an attempt gets besides its payload: nothing here.
pub struct TaskContext;

/// An attempt's error: never returned by the bench's executor.
#[derive(Debug)]
pub struct TaskError;

/// The scheduler stopped.
#[derive(Debug)]
pub struct Error;

/// A task: its payload.
pub struct Task<P>(P);

impl<P> Task<P> {
    pub fn new(payload: P) -> Self {
        Task(payload)
    }
}

pub struct Pool<P, O> {
    slots: usize,
    exec: Option<Exec<P, O>>,
}

impl<P: Send + Sync + 'static, O: Send + 'static> Pool<P, O> {
    pub fn fixed(_name: &str, slots: u32) -> Self {
        Pool {
            slots: slots as usize,
            exec: None,
        }
    }

    pub fn executor_fn<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(TaskContext, Arc<P>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
    {
        self.exec = Some(Arc::new(move |ctx, p| Box::pin(f(ctx, p))));
        self
    }
}

pub struct Builder<P, O> {
    pool: Option<Pool<P, O>>,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Builder<P, O> {
    pub fn pool(mut self, pool: Pool<P, O>) -> Self {
        self.pool = Some(pool);
        self
    }

    pub async fn build(self) -> Result<Scheduler<P, O>, Error> {
        let pool = self.pool.ok_or(Error)?;
        let (commands, rx) = mpsc::channel(8192);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let driver = Driver {
            exec: pool.exec.ok_or(Error)?,
            slots: pool.slots,
            running: 0,
            queue: VecDeque::new(),
            waiters: Vec::new(),
            done_tx,
        };
        let stopped = tokio::spawn(driver.run(rx, done_rx));
        Ok(Scheduler {
            commands,
            stopped: tokio::sync::Mutex::new(Some(stopped)),
        })
    }
}

enum Command<P, O> {
    Submit(Vec<P>, oneshot::Sender<Vec<TaskHandle<O>>>),
    Shutdown,
}

pub struct Scheduler<P, O> {
    commands: mpsc::Sender<Command<P, O>>,
    stopped: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Scheduler<P, O> {
    pub fn builder() -> Builder<P, O> {
        Builder { pool: None }
    }

    async fn call(&self, payloads: Vec<P>) -> Result<Vec<TaskHandle<O>>, Error> {
        let (tx, rx) = oneshot::channel();
        let c = Command::Submit(payloads, tx);
        self.commands.send(c).await.map_err(|_| Error)?;
        rx.await.map_err(|_| Error)
    }

    pub async fn submit(&self, task: Task<P>) -> Result<TaskHandle<O>, Error> {
        Ok(self.call(vec![task.0]).await?.pop().expect("one handle"))
    }

    pub async fn submit_batch(&self, tasks: Vec<Task<P>>) -> Result<Vec<TaskHandle<O>>, Error> {
        self.call(tasks.into_iter().map(|t| t.0).collect()).await
    }

    pub async fn shutdown(&self, _grace: Duration) -> Result<(), Error> {
        let _ = self.commands.send(Command::Shutdown).await;
        if let Some(driver) = self.stopped.lock().await.take() {
            driver.await.map_err(|_| Error)?;
        }
        Ok(())
    }
}

/// A task's output, or `Error` if the scheduler stopped first.
pub struct TaskHandle<O>(oneshot::Receiver<Arc<O>>);

impl<O> fmt::Debug for TaskHandle<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TaskHandle")
    }
}

impl<O> Future for TaskHandle<O> {
    type Output = Result<Arc<O>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0)
            .poll(cx)
            .map(|r| r.map_err(|_| Error))
    }
}

struct Driver<P, O> {
    exec: Exec<P, O>,
    slots: usize,
    running: usize,
    queue: VecDeque<(usize, Arc<P>)>,
    /// Each task's handle's sender, by id (ids count from 0).
    waiters: Vec<Option<oneshot::Sender<Arc<O>>>>,
    done_tx: mpsc::UnboundedSender<(usize, Result<O, TaskError>)>,
}

impl<P: Send + Sync + 'static, O: Send + Sync + 'static> Driver<P, O> {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command<P, O>>,
        mut done: mpsc::UnboundedReceiver<(usize, Result<O, TaskError>)>,
    ) {
        let mut stopping = false;
        loop {
            if stopping && self.running == 0 {
                return;
            }
            tokio::select! {
                biased;
                Some((id, out)) = done.recv() => {
                    self.running -= 1;
                    if let (Ok(out), Some(w)) = (out, self.waiters[id].take()) {
                        let _ = w.send(Arc::new(out));
                    }
                }
                c = commands.recv(), if !stopping => match c {
                    Some(Command::Submit(payloads, reply)) => {
                        let mut handles = Vec::with_capacity(payloads.len());
                        for p in payloads {
                            let (tx, rx) = oneshot::channel();
                            self.queue.push_back((self.waiters.len(), Arc::new(p)));
                            self.waiters.push(Some(tx));
                            handles.push(TaskHandle(rx));
                        }
                        let _ = reply.send(handles);
                    }
                    Some(Command::Shutdown) | None => stopping = true,
                },
            }
            while self.running < self.slots && !stopping {
                let Some((id, payload)) = self.queue.pop_front() else {
                    break;
                };
                self.running += 1;
                let fut = (self.exec)(TaskContext, payload);
                let done = self.done_tx.clone();
                tokio::spawn(async move {
                    let _ = done.send((id, fut.await));
                });
            }
        }
    }
}
