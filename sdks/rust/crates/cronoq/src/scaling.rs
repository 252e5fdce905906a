//! Capacity: how a pool's worker target becomes workers. A [`Scaler`] carries out each
//! target the pool's autoscaler sets and answers with the capacity available now;
//! [`SlotScaler`] (the default) makes in-process slots at once, [`ExternalScaler`] leaves
//! capacity to [`Scheduler::set_capacity`](crate::Scheduler::set_capacity).
//!
//! With only slot scalers the engine turns targets into capacity itself. With any other
//! scaler the driver asks each pool's scaler whenever its target changes (slot scalers are
//! answered on the spot), one tokio task per request, and applies the answers in request
//! order: an answer older than one applied already is dropped.

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use cronoq_core::Engine;
use tokio::sync::mpsc::UnboundedSender;

use crate::driver::FromTasks;
use crate::unwind::CatchUnwind;

/// Why a [`Scaler`] could not carry out a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScaleError {
    /// Capacity is managed outside the scheduler ([`ExternalScaler`]): the request is
    /// ignored.
    External,
    /// Any other failure; the capacity stays as it was.
    Other(String),
}

impl fmt::Display for ScaleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScaleError::External => f.write_str("capacity is managed externally"),
            ScaleError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ScaleError {}

/// Carries out a pool's capacity requests: at `build` for its initial workers, then whenever
/// its autoscaler's target changes. Implement it with `#[async_trait]`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use async_trait::async_trait;
/// use cronoq::{Pool, ScaleError, Scaler, Scheduler, TaskError};
///
/// /// Grants at most two workers, whatever is asked.
/// struct AtMostTwo;
///
/// #[async_trait]
/// impl Scaler for AtMostTwo {
///     async fn scale_to(&self, _pool: &str, desired: u32) -> Result<u32, ScaleError> {
///         Ok(desired.min(2))
///     }
/// }
///
/// let s = Scheduler::<u32, u32>::builder()
///     .pool(Pool::fixed("default", 5).scaler(AtMostTwo).executor_fn(|_ctx, n: Arc<u32>| async move {
///         Ok::<_, TaskError>(*n)
///     }))
///     .build()
///     .await?;
/// let pool = &s.snapshot().await?.pools[0];
/// assert_eq!((pool.capacity, pool.desired), (2, 2));
/// s.shutdown(Duration::from_secs(1)).await?;
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait Scaler: Send + Sync + 'static {
    /// Make `pool` have `desired` workers; return how many it has now. An error leaves the
    /// capacity as it was (at `build`: none).
    async fn scale_to(&self, pool: &str, desired: u32) -> Result<u32, ScaleError>;
}

/// In-process slots: the capacity follows every request at once (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotScaler;

#[async_trait]
impl Scaler for SlotScaler {
    async fn scale_to(&self, _pool: &str, desired: u32) -> Result<u32, ScaleError> {
        Ok(desired)
    }
}

/// Capacity comes from outside: the pool starts with none and runs nothing until
/// [`Scheduler::set_capacity`](crate::Scheduler::set_capacity) reports some; its autoscaler's
/// targets are only shown ([`PoolSnapshot::desired`](crate::PoolSnapshot::desired)).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExternalScaler;

#[async_trait]
impl Scaler for ExternalScaler {
    async fn scale_to(&self, _pool: &str, _desired: u32) -> Result<u32, ScaleError> {
        Err(ScaleError::External)
    }
}

/// A pool's scaler as its builder holds it: `None` is a [`SlotScaler`].
pub(crate) type PoolScaler = Option<Arc<dyn Scaler>>;

/// The form a pool's builder holds `scaler` in.
pub(crate) fn of<S: Scaler>(scaler: S) -> PoolScaler {
    (TypeId::of::<S>() != TypeId::of::<SlotScaler>()).then(|| Arc::new(scaler) as Arc<dyn Scaler>)
}

/// A scaler's answer to request `seq` of pool `pool`, back to the driver (`Err`: the text of
/// a panic).
#[derive(Debug)]
pub(crate) struct Answer {
    pool: usize,
    seq: u64,
    result: Result<Result<u32, ScaleError>, String>,
}

/// One pool's requests.
struct PoolScaling {
    name: Arc<str>,
    /// `None`: slot scaler, answered on the spot.
    scaler: PoolScaler,
    /// The target last asked for (or set by `set_capacity`).
    requested: i64,
    /// The last request's number, and the number of the last answer applied.
    sent: u64,
    applied: u64,
}

/// Every pool's requests, for a driver whose engine leaves targets to it (not elastic).
pub(crate) struct Scaling {
    pools: Vec<PoolScaling>,
}

fn capacity(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

impl Scaling {
    /// The requests of these pools (in configuration order; `None`: a slot scaler), or `None`
    /// when every one is a slot scaler and the engine can turn targets into capacity itself.
    pub(crate) fn new(pools: Vec<(Arc<str>, PoolScaler)>) -> Option<Scaling> {
        if pools.iter().all(|(_, s)| s.is_none()) {
            return None;
        }
        let pools = pools
            .into_iter()
            .map(|(name, scaler)| PoolScaling {
                name,
                scaler,
                requested: 0,
                sent: 0,
                applied: 0,
            })
            .collect();
        Some(Scaling { pools })
    }

    /// Asks each custom scaler for its pool's initial workers (the engine's capacity now) and
    /// sets what it answers: an error or a panic leaves the pool without workers.
    pub(crate) async fn initial(&mut self, engine: &mut Engine, now: f64) {
        for pool in &mut self.pools {
            let want = engine.desired(&pool.name).unwrap_or(0);
            pool.requested = want;
            let Some(scaler) = &pool.scaler else {
                continue;
            };
            let asked = CatchUnwind(scaler.scale_to(&pool.name, capacity(want))).await;
            let got = match asked {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => {
                    report(&pool.name, &Ok(Err(e)));
                    0
                }
                Err(text) => {
                    report(&pool.name, &Err(text));
                    0
                }
            };
            // Configured by name: the pool exists.
            let _ = engine.set_capacity(&pool.name, got, now);
            pool.requested = engine.desired(&pool.name).unwrap_or(want);
        }
    }

    /// Asks for every target that changed since it was last asked for.
    pub(crate) fn request<O: Send + 'static>(
        &mut self,
        engine: &mut Engine,
        now: f64,
        to: &UnboundedSender<FromTasks<O>>,
    ) {
        for (p, pool) in self.pools.iter_mut().enumerate() {
            let want = engine.desired(&pool.name).unwrap_or(pool.requested);
            if want == pool.requested {
                continue;
            }
            pool.requested = want;
            let Some(scaler) = pool.scaler.clone() else {
                let _ = engine.set_capacity(&pool.name, capacity(want), now);
                continue;
            };
            pool.sent += 1;
            let (seq, name, to) = (pool.sent, pool.name.clone(), to.clone());
            tokio::spawn(async move {
                let result = CatchUnwind(scaler.scale_to(&name, capacity(want))).await;
                // The driver may have stopped meanwhile: nobody to tell.
                let _ = to.send(FromTasks::Scaled(Answer {
                    pool: p,
                    seq,
                    result,
                }));
            });
        }
    }

    /// Applies an answer unless a later one was applied already.
    pub(crate) fn answered(&mut self, engine: &mut Engine, a: Answer, now: f64) {
        let pool = &mut self.pools[a.pool];
        if a.seq <= pool.applied {
            return;
        }
        pool.applied = a.seq;
        match a.result {
            Ok(Ok(n)) => {
                let _ = engine.set_capacity(&pool.name, n, now);
            }
            other => report(&pool.name, &other),
        }
    }

    /// `set_capacity` changed the pool's capacity: its target as it stands now is not a
    /// request to make.
    pub(crate) fn noted(&mut self, engine: &Engine, pool: &str) {
        if let Some(p) = self.pools.iter_mut().find(|p| &*p.name == pool) {
            p.requested = engine.desired(pool).unwrap_or(p.requested);
        }
    }
}

/// Logs a request that gave no capacity (an external scaler's refusal is expected).
fn report(pool: &str, result: &Result<Result<u32, ScaleError>, String>) {
    match result {
        Ok(Err(ScaleError::External)) | Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(pool, error = %e, "a scale request failed"),
        Err(text) => tracing::error!(pool, panic = %text, "a scaler panicked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_apply_in_request_order() {
        let pool = cronoq_core::PoolConfig::new("p");
        let mut engine = Engine::with_defaults(vec![pool], 1.0).unwrap();
        let mut scaling =
            Scaling::new(vec![("p".into(), Some(Arc::new(ExternalScaler) as _))]).unwrap();
        let answer = |seq, n| Answer {
            pool: 0,
            seq,
            result: Ok(Ok(n)),
        };
        let capacity = |e: &Engine| e.pool("p").unwrap().capacity;
        scaling.answered(&mut engine, answer(2, 5), 1.0);
        assert_eq!(capacity(&engine), 5);
        scaling.answered(&mut engine, answer(1, 3), 1.0);
        assert_eq!(capacity(&engine), 5, "an older answer is dropped");
        let failed = Answer {
            pool: 0,
            seq: 3,
            result: Err("boom".into()),
        };
        scaling.answered(&mut engine, failed, 1.0);
        assert_eq!(capacity(&engine), 5, "a panic changes nothing");
        assert!(Scaling::new(vec![("p".into(), None)]).is_none());
    }
}
