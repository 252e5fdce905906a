//! What the store's columns need beside `cronoq::codec` (which holds the Python store's
//! encodings of a task's and a schedule's options): ids as signed 64-bit integers (two's
//! complement of the unsigned id), and wall-clock times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A task id as its column keeps it (ids from 2^63 on, of shards 128-255, are negative).
pub(crate) fn signed(id: u64) -> i64 {
    id as i64
}

/// The id a column value stands for (`signed`'s inverse).
pub(crate) fn unsigned(value: i64) -> u64 {
    value as u64
}

/// Unix nanoseconds as wall-clock time.
pub(crate) fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// The wall clock in Unix nanoseconds.
pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_times() {
        assert_eq!(signed(1 << 48 | 1), (1 << 48) + 1);
        assert_eq!(unsigned(signed(u64::MAX - 1)), u64::MAX - 1);
        assert_eq!(
            system_time(-1_000_000_000),
            UNIX_EPOCH - Duration::from_secs(1)
        );
        assert!(now_ns() > 1_700_000_000_000_000_000);
    }
}
