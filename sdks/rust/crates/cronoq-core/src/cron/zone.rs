//! Time zones as `cron.py` sees them through Python's `zoneinfo`: the same files, found the
//! same way, read as offsets at instants and offsets of wall times with `fold` 0 and 1.
//!
//! `zone(name)` follows `zoneinfo.ZoneInfo(name)`: the key must be a normalized relative path,
//! the first regular file of that name under Python's default `TZPATH` wins, and it must be TZif
//! data. jiff parses the file and answers the offset questions.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};

use super::CronError;
use crate::pyrepr::py_repr;

/// The directories Python's `zoneinfo` searches (its compiled-in `TZPATH` on Linux), in order.
const TZPATH: [&str; 4] = [
    "/usr/share/zoneinfo",
    "/usr/lib/zoneinfo",
    "/usr/share/lib/zoneinfo",
    "/etc/zoneinfo",
];

/// Unix seconds of 0001-01-01T00:00:00 and 9999-12-31T23:59:59: Python's `datetime` range.
pub(crate) const MIN_SECOND: i64 = -62_135_596_800;
pub(crate) const MAX_SECOND: i64 = 253_402_300_799;

/// A time zone a schedule is evaluated in: UTC or a zone of the system's tz database.
#[derive(Clone, Debug, PartialEq)]
pub struct Zone {
    tz: TimeZone,
}

impl Zone {
    /// UTC, the zone of a schedule without one (`zone(None)`).
    pub fn utc() -> Zone {
        Zone { tz: TimeZone::UTC }
    }

    /// UTC offset in seconds at Unix second `instant`.
    pub(crate) fn offset_at(&self, instant: i64) -> i64 {
        // jiff stops a day short of Python's last instant; no zone changes offset in that day.
        let clamped = instant.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
        let timestamp = Timestamp::from_second(clamped).unwrap_or(Timestamp::MAX);
        i64::from(self.tz.to_offset(timestamp).seconds())
    }

    /// Offsets of the wall time `naive` (seconds since 1970-01-01T00:00 on the wall clock) read
    /// with fold=0 and fold=1: equal when it happens once, (before, after) in a gap or overlap.
    pub(crate) fn wall_offsets(&self, naive: i64) -> (i64, i64) {
        let (year, month, day, hour, minute, second) = super::civil(naive);
        let Ok(wall) = i16::try_from(year).map_err(drop).and_then(|year| {
            // Every field but the year is in range by construction.
            let narrow = |value: u32| i8::try_from(value).unwrap_or(0);
            DateTime::new(
                year,
                narrow(month),
                narrow(day),
                narrow(hour),
                narrow(minute),
                narrow(second),
                0,
            )
            .map_err(drop)
        }) else {
            let offset = self.offset_at(naive);
            return (offset, offset);
        };
        match self.tz.to_ambiguous_timestamp(wall).offset() {
            AmbiguousOffset::Unambiguous { offset } => {
                let offset = i64::from(offset.seconds());
                (offset, offset)
            }
            AmbiguousOffset::Gap { before, after } | AmbiguousOffset::Fold { before, after } => {
                (i64::from(before.seconds()), i64::from(after.seconds()))
            }
        }
    }
}

/// The zone named `name` (an IANA name such as `"Europe/Berlin"`), or UTC for `None`.
///
/// Reads the zone's file: like `zoneinfo`, this is the one place the cron code touches the file
/// system. Any failure is `CronError("unknown time zone 'name'")`, the name quoted as Python's
/// `repr` does.
pub fn zone(name: Option<&str>) -> Result<Zone, CronError> {
    let Some(name) = name else {
        return Ok(Zone::utc());
    };
    load(name).ok_or_else(|| CronError::new(format!("unknown time zone {}", py_repr(name))))
}

fn load(key: &str) -> Option<Zone> {
    if !valid_key(key) {
        return None;
    }
    let path = TZPATH
        .iter()
        .map(|dir| std::path::Path::new(dir).join(key))
        .find(|path| path.is_file())?;
    let data = std::fs::read(path).ok()?;
    TimeZone::tzif(key, &data).ok().map(|tz| Zone { tz })
}

/// `zoneinfo`'s key check: relative, already normalized, and not climbing out of the tz
/// directory.
fn valid_key(key: &str) -> bool {
    !key.starts_with('/')
        && normpath(key).len() == key.len()
        && normpath(&format!("_/{}", normpath(key))).starts_with("_/")
}

/// `posixpath.normpath` for the paths `valid_key` gives it.
fn normpath(path: &str) -> String {
    if path.is_empty() {
        return ".".to_owned();
    }
    let initial = if path.starts_with("//") && !path.starts_with("///") {
        2
    } else {
        usize::from(path.starts_with('/'))
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        if part.is_empty() || part == "." {
            continue;
        }
        if part != ".." || (initial == 0 && parts.is_empty()) || parts.last() == Some(&"..") {
            parts.push(part);
        } else {
            parts.pop();
        }
    }
    let joined = "/".repeat(initial) + &parts.join("/");
    if joined.is_empty() {
        ".".to_owned()
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_like_zoneinfo() {
        for good in ["UTC", "America/New_York", "a/b", "..a"] {
            assert!(valid_key(good), "{good}");
        }
        for bad in [
            "", "/etc/x", "a//b", "a/", "./a", "a/./b", "..", "../a", "a/../b", "a/..",
        ] {
            assert!(!valid_key(bad), "{bad}");
        }
        assert_eq!(normpath("//a/../b"), "//b");
    }

    #[test]
    fn unknown_zones_are_quoted_like_python() {
        for (name, message) in [
            ("Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
            ("it's", "unknown time zone \"it's\""),
            (
                "a\"b'c\n\u{1}é\u{200b}",
                "unknown time zone 'a\"b\\'c\\n\\x01é\\u200b'",
            ),
            ("../UTC", "unknown time zone '../UTC'"),
            ("zone.tab", "unknown time zone 'zone.tab'"),
        ] {
            assert_eq!(zone(Some(name)).unwrap_err().to_string(), message);
        }
        assert_eq!(zone(None).unwrap(), Zone::utc());
        assert!(zone(Some("America/New_York")).is_ok());
    }
}
