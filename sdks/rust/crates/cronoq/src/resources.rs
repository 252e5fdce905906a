//! Resources shared by every pool of a scheduler: semaphores (at most so many units held at
//! once) and token buckets (so many units per second). A task names what it takes with
//! [`Task::resource`](crate::Task::resource); it waits, without blocking the tasks behind it,
//! until every amount is available, and takes them when it starts.

use std::sync::Arc;

/// What a resource is, with its figures: the engine core's own type (a semaphore's permits
/// are held at once and given back when an attempt ends; a token bucket starts full with
/// `burst` tokens and refills at `rate` per second, and taken tokens are not given back).
pub use cronoq_core::resources::ResourceKind;

/// A named resource, added with [`Builder::resource`](crate::Builder::resource).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cronoq::{Pool, ResourceConfig, Scheduler, Task, TaskError};
///
/// let s = Scheduler::<u32, u32>::builder()
///     .pool(Pool::fixed("default", 8).executor_fn(|_ctx, n: Arc<u32>| async move {
///         Ok::<_, TaskError>(*n)
///     }))
///     // two database connections, and an API allowing 5 calls per second (10 at once)
///     .resource(ResourceConfig::semaphore("db", 2))
///     .resource(ResourceConfig::token_bucket("api", 5.0, 10))
///     .build()
///     .await?;
/// let h = s.submit(Task::new(1).resource("db", 1).resource("api", 1)).await?;
/// assert_eq!(*h.await?, 1);
/// s.shutdown(Duration::from_secs(1)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceConfig {
    /// Its name, unique in a scheduler.
    pub name: Arc<str>,
    /// Its kind and figures.
    pub kind: ResourceKind,
}

impl ResourceConfig {
    /// A semaphore of `permits` units.
    pub fn semaphore(name: impl Into<Arc<str>>, permits: u32) -> ResourceConfig {
        ResourceConfig {
            name: name.into(),
            kind: ResourceKind::Semaphore { permits },
        }
    }

    /// A token bucket of `burst` tokens refilled at `rate` per second.
    pub fn token_bucket(name: impl Into<Arc<str>>, rate: f64, burst: u32) -> ResourceConfig {
        ResourceConfig {
            name: name.into(),
            kind: ResourceKind::TokenBucket { rate, burst },
        }
    }

    /// The engine's resource, or why it cannot work (checked at `build`).
    pub(crate) fn to_core(&self) -> Result<cronoq_core::ResourceConfig, String> {
        let made = match self.kind {
            ResourceKind::Semaphore { permits } => {
                cronoq_core::ResourceConfig::semaphore(&*self.name, permits)
            }
            ResourceKind::TokenBucket { rate, burst } => {
                cronoq_core::ResourceConfig::token_bucket(&*self.name, rate, burst)
            }
        };
        made.map_err(|e| format!("resource '{}': {}", self.name, e.0))
    }
}

/// The engine's resources, or why they cannot work: each checked, names unique.
pub(crate) fn to_core(
    resources: &[ResourceConfig],
) -> Result<Vec<cronoq_core::ResourceConfig>, String> {
    for (i, r) in resources.iter().enumerate() {
        if resources[..i].iter().any(|q| q.name == r.name) {
            return Err(format!("duplicate resource '{}'", r.name));
        }
    }
    resources.iter().map(ResourceConfig::to_core).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_checked_and_named() {
        let ok = [
            ResourceConfig::semaphore("db", 2),
            ResourceConfig::token_bucket("api", 0.5, 1),
        ];
        assert_eq!(to_core(&ok).unwrap().len(), 2);
        let twice = [ok[0].clone(), ok[0].clone()];
        assert_eq!(to_core(&twice).unwrap_err(), "duplicate resource 'db'");
        let none = [ResourceConfig::semaphore("db", 0)];
        assert_eq!(
            to_core(&none).unwrap_err(),
            "resource 'db': permits must be >= 1"
        );
        let nan = [ResourceConfig::token_bucket("api", f64::NAN, 1)];
        assert!(
            to_core(&nan)
                .unwrap_err()
                .starts_with("resource 'api': rate")
        );
    }
}
