//! Engine time ([`Time`], Unix nanoseconds) and the scheduler's [`Clock`], which follows tokio's
//! clock so that a test with paused time drives the scheduler too.

use std::ops::{Add, Sub};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: nanoseconds since the Unix epoch.
///
/// Events, snapshots and [`Clock::now`] give times in this form; [`Clock::to_system`] turns one
/// into a [`SystemTime`].
///
/// ```
/// use std::time::Duration;
/// use cronoq::Time;
///
/// let t = Time::from_secs_f64(1.5);
/// assert_eq!(t, Time(1_500_000_000));
/// assert_eq!((t + Duration::from_millis(500)).as_secs_f64(), 2.0);
/// assert_eq!(Time::ZERO.saturating_sub(t), Duration::ZERO);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

impl Time {
    /// The Unix epoch.
    pub const ZERO: Time = Time(0);
    /// The latest representable time (in the year 2554).
    pub const MAX: Time = Time(u64::MAX);

    /// The time `secs` seconds after the epoch (negative and NaN give [`Time::ZERO`], too large
    /// values [`Time::MAX`]).
    pub fn from_secs_f64(secs: f64) -> Time {
        let nanos = secs * 1e9;
        if nanos.is_nan() || nanos <= 0.0 {
            Time::ZERO
        } else if nanos >= u64::MAX as f64 {
            Time::MAX
        } else {
            Time(nanos.round() as u64)
        }
    }

    /// Seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub fn saturating_sub(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self - other` in seconds, negative when `other` is later.
    pub fn diff_secs(self, other: Time) -> f64 {
        if self >= other {
            (self.0 - other.0) as f64 / 1e9
        } else {
            -((other.0 - self.0) as f64 / 1e9)
        }
    }
}

impl Add<Duration> for Time {
    type Output = Time;

    /// Saturates at [`Time::MAX`].
    fn add(self, d: Duration) -> Time {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_add(nanos))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;

    /// Saturates at [`Time::ZERO`].
    fn sub(self, d: Duration) -> Time {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_sub(nanos))
    }
}

/// The scheduler's clock: the wall-clock time read once at start, advanced by tokio's monotonic
/// clock.
///
/// Engine time therefore never goes backwards (a step of the system clock after start is not
/// followed), and a test that pauses tokio's clock (`#[tokio::test(start_paused = true)]`,
/// `tokio::time::advance`) moves the scheduler's time with it, so tests drive time instead of
/// sleeping. [`Scheduler::clock`](crate::Scheduler::clock) gives a scheduler's clock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use cronoq::Clock;
///
/// let clock = Clock::start();
/// let t0 = clock.now();
/// tokio::time::advance(Duration::from_secs(5)).await;
/// assert_eq!(clock.now().saturating_sub(t0), Duration::from_secs(5));
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    at_start: Time,
    start: tokio::time::Instant,
}

/// How far ahead [`Clock::instant`] puts a time it cannot reach (about 100 years).
const FAR_AHEAD: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Clock {
    /// A clock anchored now: the system time read once, then tokio's clock.
    ///
    /// Call it inside a tokio runtime when the runtime's clock is paused, so the anchor is the
    /// paused clock's.
    pub fn start() -> Clock {
        Clock {
            at_start: Clock::from_system(SystemTime::now()),
            start: tokio::time::Instant::now(),
        }
    }

    /// The current time.
    pub fn now(&self) -> Time {
        self.at_start + self.start.elapsed()
    }

    /// The tokio instant at which this clock reads `t` (a time before the clock started gives
    /// the start; one too far ahead gives about 100 years from now).
    pub fn instant(&self, t: Time) -> tokio::time::Instant {
        let after = t.saturating_sub(self.at_start);
        self.start
            .checked_add(after)
            .or_else(|| tokio::time::Instant::now().checked_add(FAR_AHEAD))
            .unwrap_or(self.start)
    }

    /// The Unix time of engine time zero, in nanoseconds: always 0, since engine time is Unix
    /// time.
    pub fn unix_nanos_at_zero(&self) -> i64 {
        0
    }

    /// A wall-clock time as engine time (before 1970 gives [`Time::ZERO`], after 2554
    /// [`Time::MAX`]).
    pub fn from_system(t: SystemTime) -> Time {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Time(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            Err(_) => Time::ZERO,
        }
    }

    /// Engine time as wall-clock time.
    pub fn to_system(t: Time) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(t.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_saturate() {
        assert_eq!(Time::from_secs_f64(-1.0), Time::ZERO);
        assert_eq!(Time::from_secs_f64(f64::NAN), Time::ZERO);
        assert_eq!(Time::from_secs_f64(1e30), Time::MAX);
        assert_eq!(Time::MAX + Duration::from_secs(1), Time::MAX);
        assert_eq!(Time(5) - Duration::from_secs(1), Time::ZERO);
        assert_eq!(Time(2_000_000_000).diff_secs(Time(3_000_000_000)), -1.0);
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(Clock::from_system(before), Time::ZERO);
        assert_eq!(
            Clock::to_system(Time(7)),
            UNIX_EPOCH + Duration::from_nanos(7)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn instants_follow_the_paused_clock() {
        let clock = Clock::start();
        let t = clock.now() + Duration::from_secs(3);
        assert_eq!(
            clock.instant(t) - clock.instant(clock.now()),
            Duration::from_secs(3)
        );
        tokio::time::sleep_until(clock.instant(t)).await;
        assert_eq!(clock.now(), t);
        assert!(clock.instant(Time::MAX) > tokio::time::Instant::now());
        assert_eq!(
            clock.instant(Time::ZERO),
            clock.instant(clock.now() - clock.start.elapsed())
        );
    }
}
