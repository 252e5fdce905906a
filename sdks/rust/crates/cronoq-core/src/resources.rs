//! Shared resources (Python: `cronoq.core.resources`): semaphores and token buckets, taken at
//! dispatch, shared by every pool.
//!
//! A task that cannot get a resource is *parked* on it (out of the ready queues, so it never
//! blocks tasks behind it) and put back when the resource can serve it again (`parking`): a
//! semaphore when permits are released, a token bucket at the time enough tokens will have
//! refilled. Token counts are floats refilled in Python's steps (each refill adds
//! `(now - last) * rate` to the level, capped at the burst), so a level read at another time
//! than Python reads it would round differently: levels are only refilled where Python does.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::model::{ConfigError, TaskId, TaskRecord, py_cmp, py_max, py_min};
use crate::parking::Parked;
use crate::pyrepr::{py_repr, python_shown};

/// This much shortfall of tokens still counts as enough (refill rounding).
pub const EPS: f64 = 1e-9;

/// What a resource is: a semaphore of permits or a token bucket.
#[derive(Clone, Debug, PartialEq)]
pub enum ResourceKind {
    /// At most `permits` units held at once; taken at dispatch, returned when the attempt ends.
    Semaphore {
        /// Units held at once at most.
        permits: u32,
    },
    /// Starts with `burst` tokens and refills at `rate` per second up to `burst`; tokens
    /// taken at dispatch are not returned.
    TokenBucket {
        /// Tokens per second.
        rate: f64,
        /// The bucket's size.
        burst: u32,
    },
}

/// A resource as configured (Python: `cronoq.Resource`, whose checks and messages these are).
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceConfig {
    name: String,
    kind: ResourceKind,
}

/// `_options._check_resource_name`: stores and the wire format cannot carry NUL.
fn checked_name(name: String) -> Result<String, ConfigError> {
    if name.contains('\0') {
        return Err(ConfigError(format!(
            "resource name must not contain NUL characters (got {})",
            py_repr(&name)
        )));
    }
    Ok(name)
}

impl ResourceConfig {
    /// A semaphore of `permits` (>= 1) units.
    pub fn semaphore(name: impl Into<String>, permits: u32) -> Result<Self, ConfigError> {
        let name = checked_name(name.into())?;
        if permits < 1 {
            return Err(ConfigError("permits must be >= 1".into()));
        }
        Ok(ResourceConfig {
            name,
            kind: ResourceKind::Semaphore { permits },
        })
    }

    /// A token bucket refilled at `rate` (finite, > 0) tokens per second up to `burst` (>= 1).
    pub fn token_bucket(
        name: impl Into<String>,
        rate: f64,
        burst: u32,
    ) -> Result<Self, ConfigError> {
        let name = checked_name(name.into())?;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(ConfigError(format!(
                "rate must be a finite number > 0 (got {})",
                python_shown(rate)
            )));
        }
        if burst < 1 {
            return Err(ConfigError("burst must be >= 1".into()));
        }
        Ok(ResourceConfig {
            name,
            kind: ResourceKind::TokenBucket { rate, burst },
        })
    }

    /// Its name, unique in an engine.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its kind and figures.
    pub fn kind(&self) -> &ResourceKind {
        &self.kind
    }

    /// The most a task may ask for: the permits, or the burst.
    pub fn capacity(&self) -> u32 {
        match self.kind {
            ResourceKind::Semaphore { permits } => permits,
            ResourceKind::TokenBucket { burst, .. } => burst,
        }
    }
}

/// A task waiting outside the ready queues, on a resource (with the amount it wants) or for a
/// worker-group slot (amount 0): Python's `(class, eligible_at, seq, generation, task[,
/// amount])`. Live while the task's `qgen` is `generation` and it is still parked there; `seq`
/// is unique and generations distinct, so entries never tie and any correct heap pops them in
/// heapq's order.
#[derive(Clone, Copy, Debug)]
pub struct ParkEntry {
    /// The task's class.
    pub cls: u8,
    /// When it first became eligible.
    pub eligible_at: f64,
    /// Its admission order.
    pub seq: u64,
    /// Its queue generation when parked.
    pub generation: u64,
    /// The task.
    pub task: TaskId,
    /// The amount it wants of the resource (0 on a worker group).
    pub amount: u32,
}

impl ParkEntry {
    /// The entry of a task parked now (bumps its generation, as Python's `park` does).
    pub(crate) fn park(rec: &mut TaskRecord, amount: u32) -> Self {
        rec.qgen += 1;
        ParkEntry {
            cls: rec.cls,
            eligible_at: rec.eligible_at,
            seq: rec.seq,
            generation: rec.qgen,
            task: rec.id,
            amount,
        }
    }

    /// Whether it is still the task's place: same generation, parked on `on`.
    pub(crate) fn is_live(&self, rec: Option<&TaskRecord>, on: Parked) -> bool {
        rec.is_some_and(|r| r.qgen == self.generation && r.parked == Some(on))
    }
}

impl Ord for ParkEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: std's heap is a max-heap, heapq a min-heap.
        other
            .cls
            .cmp(&self.cls)
            .then(py_cmp(other.eligible_at, self.eligible_at))
            .then(other.seq.cmp(&self.seq))
            .then(other.generation.cmp(&self.generation))
    }
}

impl PartialOrd for ParkEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for ParkEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for ParkEntry {}

/// Parked tasks, best first; dead entries stay until they reach the top or a scan drops them,
/// as in Python (whether a heap is empty, dead entries included, reaches decisions).
pub type ParkHeap = BinaryHeap<ParkEntry>;

/// One resource's level plus the tasks parked on it, best first.
#[derive(Debug)]
pub struct ResourceState {
    /// Its name.
    pub name: Arc<str>,
    /// Its configuration.
    pub cfg: ResourceConfig,
    is_bucket: bool,
    permits: i64,
    /// Permits held by running attempts (semaphores).
    pub in_use: i64,
    rate: f64,
    burst: f64,
    /// Tokens in the bucket at `last` (buckets start full).
    pub tokens: f64,
    /// When the bucket was last refilled.
    pub last: f64,
    /// The tasks parked on it.
    pub parked: ParkHeap,
    /// The refill timer already set for this time (buckets).
    pub wake: Option<f64>,
}

impl ResourceState {
    /// The resource at `now`, full, with nothing parked.
    pub fn new(cfg: ResourceConfig, now: f64) -> Self {
        let (is_bucket, permits, rate, burst) = match cfg.kind {
            ResourceKind::Semaphore { permits } => (false, i64::from(permits), 0.0, 0.0),
            ResourceKind::TokenBucket { rate, burst } => (true, 0, rate, f64::from(burst)),
        };
        ResourceState {
            name: Arc::from(cfg.name.as_str()),
            cfg,
            is_bucket,
            permits,
            in_use: 0,
            rate,
            burst,
            tokens: burst,
            last: now,
            parked: ParkHeap::new(),
            wake: None,
        }
    }

    /// Whether it is a token bucket.
    pub fn is_bucket(&self) -> bool {
        self.is_bucket
    }

    fn refill(&mut self, now: f64) {
        if now > self.last {
            self.tokens = py_min(self.burst, self.tokens + (now - self.last) * self.rate);
            self.last = now;
        }
    }

    /// Can it give `amount` now? (Refills a bucket.)
    pub fn available(&mut self, amount: u32, now: f64) -> bool {
        if self.is_bucket {
            self.refill(now);
            return self.tokens + EPS >= f64::from(amount);
        }
        self.in_use + i64::from(amount) <= self.permits
    }

    /// Take `amount` for an attempt that starts now.
    pub fn take(&mut self, amount: u32, now: f64) {
        if self.is_bucket {
            self.refill(now);
            self.tokens = py_max(0.0, self.tokens - f64::from(amount));
        } else {
            self.in_use += i64::from(amount);
        }
    }

    /// End of an attempt: semaphores get their permits back; buckets refill by time only.
    pub fn release(&mut self, amount: u32) {
        if !self.is_bucket {
            self.in_use -= i64::from(amount);
        }
    }

    /// When the bucket will hold `amount` tokens (now if it does). One that is short is ready
    /// strictly later than `now`, even when the shortfall refills in less than the float step
    /// of `now` (Unix-sized times): a wake-up at `now` itself would find it short again, at
    /// the same time, forever.
    pub fn ready_at(&mut self, amount: u32, now: f64) -> f64 {
        self.refill(now);
        let missing = f64::from(amount) - self.tokens;
        if missing <= EPS {
            return now;
        }
        py_max(now + missing / self.rate, now.next_up())
    }

    /// Units available now: free permits, or tokens (refilled).
    pub fn level(&mut self, now: f64) -> f64 {
        if self.is_bucket {
            self.refill(now);
            return self.tokens;
        }
        (self.permits - self.in_use) as f64
    }
}

/// What `unpark` asks of the engine about a parked task.
pub(crate) trait Offer {
    /// Whether the entry is still its task's place.
    fn live(&self, e: &ParkEntry) -> bool;
    /// Whether the task, which the level can serve, may go back to its queue (its pool has a
    /// free slot and its other resources are not short).
    fn fits(&mut self, task: TaskId) -> bool;
}

/// Take out of `parked`, best first, the tasks that `budget` (the level now) can serve and
/// that `offer` lets go; one that wants more than is left lets smaller ones behind it go (work
/// conserving). Also returns the smallest amount still waiting for the level to rise (a lower
/// bound: 1 when the level ran out before the scan ended), or None.
pub(crate) fn unpark(
    parked: &mut ParkHeap,
    mut budget: f64,
    offer: &mut impl Offer,
) -> (Vec<TaskId>, Option<u32>) {
    let mut out = Vec::new();
    let mut kept = Vec::new();
    let mut short: Option<u32> = None;
    while let Some(&entry) = parked.peek() {
        if !offer.live(&entry) {
            parked.pop();
            continue;
        }
        let need = f64::from(entry.amount);
        if need > budget + EPS {
            if budget + EPS < 1.0 {
                // nothing smaller can be served either
                short = Some(1);
                break;
            }
            short = Some(short.map_or(entry.amount, |s| s.min(entry.amount)));
            kept.push(entry);
            parked.pop();
            continue;
        }
        parked.pop();
        if offer.fits(entry.task) {
            budget -= need;
            out.push(entry.task);
        } else {
            kept.push(entry);
        }
    }
    parked.extend(kept);
    (out, short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked_with_pythons_messages() {
        let err = |r: Result<ResourceConfig, ConfigError>| r.unwrap_err().0;
        assert_eq!(
            err(ResourceConfig::semaphore("db", 0)),
            "permits must be >= 1"
        );
        assert_eq!(
            err(ResourceConfig::token_bucket("api", 0.0, 1)),
            "rate must be a finite number > 0 (got 0)"
        );
        assert_eq!(
            err(ResourceConfig::token_bucket("api", -2.5, 1)),
            "rate must be a finite number > 0 (got -2.5)"
        );
        assert_eq!(
            err(ResourceConfig::token_bucket("api", f64::NAN, 1)),
            "rate must be a finite number > 0 (got nan)"
        );
        assert_eq!(
            err(ResourceConfig::token_bucket("api", 1.0, 0)),
            "burst must be >= 1"
        );
        assert_eq!(
            err(ResourceConfig::semaphore("a\0b", 1)),
            "resource name must not contain NUL characters (got 'a\\x00b')"
        );
        assert_eq!(
            ResourceConfig::token_bucket("api", 0.5, 3)
                .unwrap()
                .capacity(),
            3
        );
    }

    #[test]
    fn a_bucket_refills_by_time_up_to_its_burst_and_a_short_one_wakes_strictly_later() {
        let cfg = ResourceConfig::token_bucket("api", 2.0, 4).unwrap();
        let mut r = ResourceState::new(cfg, 10.0);
        assert_eq!(r.level(10.0), 4.0, "buckets start full");
        r.take(3, 10.0);
        assert_eq!(r.level(10.25), 1.5);
        assert!(!r.available(2, 10.25));
        assert_eq!(r.ready_at(2, 10.25), 10.5);
        assert_eq!(r.level(100.0), 4.0, "capped at the burst");
        r.take(4, 100.0);
        r.release(4);
        assert_eq!(r.level(100.0), 0.0, "tokens come back by time only");
        // A shortfall smaller than the float step of a Unix-sized time: still strictly later.
        let big = 1.7e9;
        let mut r = ResourceState::new(ResourceConfig::token_bucket("b", 1e9, 1).unwrap(), big);
        r.take(1, big);
        assert_eq!(r.ready_at(1, big), big.next_up());
    }

    #[test]
    fn a_semaphore_counts_permits_held() {
        let mut r = ResourceState::new(ResourceConfig::semaphore("db", 3).unwrap(), 0.0);
        r.take(2, 0.0);
        assert!(r.available(1, 5.0));
        assert!(!r.available(2, 5.0));
        assert_eq!(r.level(5.0), 1.0);
        r.release(2);
        assert_eq!(r.level(5.0), 3.0);
    }

    struct Fits(Vec<TaskId>);

    impl Offer for Fits {
        fn live(&self, e: &ParkEntry) -> bool {
            e.generation != 0
        }

        fn fits(&mut self, task: TaskId) -> bool {
            !self.0.contains(&task)
        }
    }

    fn entry(task: TaskId, cls: u8, amount: u32, generation: u64) -> ParkEntry {
        ParkEntry {
            cls,
            eligible_at: 0.0,
            seq: task,
            generation,
            task,
            amount,
        }
    }

    #[test]
    fn unpark_serves_best_first_lets_smaller_ones_pass_and_reports_the_smallest_short() {
        let mut heap = ParkHeap::new();
        heap.push(entry(1, 0, 3, 1)); // the best, too big for a level of 2
        heap.push(entry(2, 1, 1, 0)); // dead
        heap.push(entry(3, 1, 1, 1)); // its pool is full
        heap.push(entry(4, 2, 1, 1));
        heap.push(entry(5, 3, 2, 1)); // only 1 left by then
        let (out, short) = unpark(&mut heap, 2.0, &mut Fits(vec![3]));
        assert_eq!(out, [4]);
        assert_eq!(short, Some(2));
        let mut left: Vec<TaskId> = heap.iter().map(|e| e.task).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            [1, 3, 5],
            "the dead entry is dropped, the others kept"
        );
        // An empty level stops the scan at once: 1 is the bound.
        let (out, short) = unpark(&mut heap, 0.5, &mut Fits(vec![]));
        assert!(out.is_empty());
        assert_eq!(short, Some(1));
        assert_eq!(heap.len(), 3);
    }
}
