//! The [`Pool`] builder: a named group of workers, its executor and its settings.

use std::future::Future;
use std::sync::Arc;

use crate::config::{AutoscaleConfig, PoolConfig};
use crate::error::TaskError;
use crate::executor::{Executor, FnExecutor, TaskContext};
use crate::scaling::{self, PoolScaler, Scaler};

/// A pool for [`Builder::pool`](crate::Builder::pool): a named set of workers (slots) that run
/// its tasks with one executor.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cronoq::{Pool, TaskContext, TaskError};
///
/// let pool = Pool::new("default")
///     .workers(2, 2, 16)
///     .executor_fn(|ctx: TaskContext, url: Arc<String>| async move {
///         Ok::<_, TaskError>(format!("fetched {url} (attempt {})", ctx.attempt))
///     })
///     .configure(|c| c.lease_ttl = Some(Duration::from_secs(30)));
/// ```
pub struct Pool<P, O> {
    pub(crate) config: PoolConfig,
    pub(crate) executor: Option<Arc<dyn Executor<P, O>>>,
    pub(crate) scaler: PoolScaler,
}

impl<P, O> Pool<P, O> {
    /// An autoscaled pool: between 1 and 10 workers, 1 at start, scaled by queue pressure
    /// ([`AutoscaleConfig::default`]).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Pool {
            config: PoolConfig::new(name),
            executor: None,
            scaler: None,
        }
    }

    /// A pool of exactly `workers` workers, without autoscaling.
    pub fn fixed(name: impl Into<Arc<str>>, workers: u32) -> Self {
        Pool {
            config: PoolConfig::fixed(name, workers),
            executor: None,
            scaler: None,
        }
    }

    /// Sets the worker bounds: note the order, `min`, `initial`, `max` (`initial` is clamped
    /// to `max`).
    pub fn workers(mut self, min: u32, initial: u32, max: u32) -> Self {
        self.config = self.config.workers(min, initial, max);
        self
    }

    /// Sets the executor (required).
    pub fn executor(self, executor: impl Executor<P, O>) -> Self {
        self.executor_arc(Arc::new(executor))
    }

    /// Sets a shared executor.
    pub fn executor_arc(mut self, executor: Arc<dyn Executor<P, O>>) -> Self {
        self.executor = Some(executor);
        self
    }

    /// Sets a closure as the executor (see [`FnExecutor`]).
    pub fn executor_fn<F, Fut>(self, f: F) -> Self
    where
        F: Fn(TaskContext, Arc<P>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
    {
        self.executor(FnExecutor::new(f))
    }

    /// Sets the scaler that carries out the pool's capacity requests (default
    /// [`SlotScaler`](crate::SlotScaler): in-process slots follow the target at once).
    pub fn scaler(mut self, scaler: impl Scaler) -> Self {
        self.scaler = scaling::of(scaler);
        self
    }

    /// Sets a shared scaler (see [`Pool::scaler`]).
    pub fn scaler_arc(mut self, scaler: Arc<dyn Scaler>) -> Self {
        self.scaler = Some(scaler);
        self
    }

    /// Turns queue-pressure autoscaling on with these settings.
    pub fn autoscale(mut self, config: AutoscaleConfig) -> Self {
        self.config.autoscale = Some(config);
        self
    }

    /// Turns autoscaling off: the pool keeps its initial workers.
    pub fn no_autoscale(mut self) -> Self {
        self.config.autoscale = None;
        self
    }

    /// Changes any setting (retries, bounds, overflow, lease TTL, fairness, …).
    pub fn configure(mut self, f: impl FnOnce(&mut PoolConfig)) -> Self {
        f(&mut self.config);
        self
    }
}
