//! Cron expressions: parsing and next-occurrence arithmetic, a port of `cronoq/core/cron.py`.
//!
//! The syntax, the day rule, the ten-year search horizon and the daylight-saving rules are
//! those of the Python module's docstring, and every error message is the same text: the
//! differential suite in `tests/parity` feeds both the same expressions, instants and zones and
//! compares the answers. How the port maps to `cron.py`:
//!
//! - `parse_cron` and the field parser follow `parse_cron` / `_parse_field` / `_value` step by
//!   step (same checks in the same order); a field's values are a bit set instead of a tuple.
//! - Wall times are naive seconds (`datetime - 1970-01-01`), so `_next_wall` works on fields
//!   derived from them and the overlap bounds `low`/`high` are plain integers.
//! - `zone(name)` finds and checks the zone file as `zoneinfo.ZoneInfo(name)` does, and jiff
//!   reads it. `Zone` answers what `cron.py` asks a `tzinfo`: the offset at an instant
//!   (`_offset_at`) and the offsets of a wall time with fold 0 and 1 (`_instants`). The offset
//!   change is still found by the same bisection (`_transition`), so results match even where
//!   the tz library would describe a transition differently.
//! - `ValueError`s of `next_after` (a non-finite time, one outside years 1-9999) are
//!   `TimeError`s of `try_next_after`, with Python's messages.

#[cfg(test)]
mod tests;
mod zone;

use std::fmt;

use zone::{MAX_SECOND, MIN_SECOND};

use crate::pyrepr::py_float_repr;
pub use zone::{Zone, zone};

const PREFIX: &str = "Invalid pattern: ";
const HORIZON_YEARS: i32 = 10;
/// Keeps every date inside Python's `datetime` range, as `_LAST_YEAR` does.
const LAST_YEAR: i32 = 9998;

const ALIASES: [(&str, &str); 7] = [
    ("@yearly", "0 0 0 1 1 *"),
    ("@annually", "0 0 0 1 1 *"),
    ("@monthly", "0 0 0 1 * *"),
    ("@weekly", "0 0 0 * * 0"),
    ("@daily", "0 0 0 * * *"),
    ("@midnight", "0 0 0 * * *"),
    ("@hourly", "0 0 * * * *"),
];

const MONTH_NAMES: [(&str, u32); 12] = [
    ("JAN", 1),
    ("FEB", 2),
    ("MAR", 3),
    ("APR", 4),
    ("MAY", 5),
    ("JUN", 6),
    ("JUL", 7),
    ("AUG", 8),
    ("SEP", 9),
    ("OCT", 10),
    ("NOV", 11),
    ("DEC", 12),
];
const WEEKDAY_NAMES: [(&str, u32); 7] = [
    ("SUN", 0),
    ("MON", 1),
    ("TUE", 2),
    ("WED", 3),
    ("THU", 4),
    ("FRI", 5),
    ("SAT", 6),
];

/// A cron expression or time zone that cannot be used; the message is the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronError {
    message: String,
}

impl CronError {
    fn new(message: String) -> CronError {
        CronError { message }
    }

    /// The reason, word for word as the Python core gives it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CronError {}

/// A time `next_after` cannot work from: not finite, or outside years 1-9999 (Python's
/// `ValueError`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeError {
    message: String,
}

impl TimeError {
    /// The reason, word for word as the Python core gives it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TimeError {}

/// How one position of the expression is read (`_Field`).
struct Field {
    name: &'static str,
    low: u32,
    /// Largest value accepted when written.
    high: u32,
    /// Where `*` and `a/n` stop (6 for weekdays: 7 is only an alias of Sunday).
    top: u32,
    names: &'static [(&'static str, u32)],
    names_hint: &'static str,
    /// `?` allowed (day fields only).
    question: bool,
}

const fn field(name: &'static str, low: u32, high: u32) -> Field {
    Field {
        name,
        low,
        high,
        top: high,
        names: &[],
        names_hint: "",
        question: false,
    }
}

const SECONDS: Field = field("second", 0, 59);
const MINUTES: Field = field("minute", 0, 59);
const HOURS: Field = field("hour", 0, 23);
const DAYS: Field = Field {
    question: true,
    ..field("day-of-month", 1, 31)
};
const MONTHS: Field = Field {
    names: &MONTH_NAMES,
    names_hint: "a month name (JAN-DEC)",
    ..field("month", 1, 12)
};
const WEEKDAYS: Field = Field {
    top: 6,
    names: &WEEKDAY_NAMES,
    names_hint: "a weekday name (SUN-SAT)",
    question: true,
    ..field("day-of-week", 0, 7)
};
const YEARS: Field = field("year", 1970, 2099);

const ALL_DAYS: u64 = ((1 << 32) - 1) & !1;
const ALL_WEEKDAYS: u64 = (1 << 7) - 1;

fn error(text: String) -> CronError {
    CronError::new(format!("{PREFIX}{text}"))
}

/// `[0-9]+`: Python's `_DIGITS` matches ASCII digits only.
fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// The value of a digit string, saturating: every value past 18 digits exceeds every field.
fn digits_value(text: &str) -> u64 {
    let significant = text.trim_start_matches('0');
    if significant.len() > 18 {
        u64::MAX
    } else {
        significant.parse().unwrap_or(0)
    }
}

fn value(token: &str, item: &str, field: &Field) -> Result<u32, CronError> {
    let name = field.name;
    if token.is_empty() {
        return Err(error(format!("{name} field entry '{item}' is incomplete")));
    }
    if is_digits(token) {
        // Like `_value`, read at most 18 digits: longer text is out of range even when it is
        // zero-padded.
        let value = if token.len() <= 18 {
            digits_value(token)
        } else {
            u64::from(field.high) + 1
        };
        if value < u64::from(field.low) || value > u64::from(field.high) {
            let (low, high) = (field.low, field.high);
            return Err(error(format!(
                "{name} field value {token} is out of range {low}-{high}"
            )));
        }
        return Ok(u32::try_from(value).unwrap_or(field.high));
    }
    // Full Unicode upper-casing, as Python's `str.upper` (`ſun` is `SUN`).
    let upper = token.to_uppercase();
    if let Some(&(_, value)) = field.names.iter().find(|(known, _)| *known == upper) {
        return Ok(value);
    }
    let kind = if field.names.is_empty() {
        "a number".to_owned()
    } else {
        format!("a number or {}", field.names_hint)
    };
    Err(error(format!("{name} field value '{token}' is not {kind}")))
}

/// The values of one field: `values[v]` tells whether `v` is allowed.
fn parse_field(text: &str, field: &Field) -> Result<Vec<bool>, CronError> {
    let name = field.name;
    let mut values = vec![false; field.high as usize + 1];
    for item in text.split(',') {
        if item.is_empty() {
            return Err(error(format!(
                "{name} field '{text}' has an empty list entry"
            )));
        }
        let (base, step_text) = match item.split_once('/') {
            Some((base, step)) => (base, Some(step)),
            None => (item, None),
        };
        let mut step = 1;
        if let Some(step_text) = step_text {
            if !is_digits(step_text) || digits_value(step_text) == 0 {
                return Err(error(format!(
                    "{name} field step '{step_text}' in '{item}' must be a positive integer"
                )));
            }
            step = usize::try_from(digits_value(step_text)).unwrap_or(usize::MAX);
        }
        let (start, end) = if base == "*" || base == "?" {
            if base == "?" && !field.question {
                return Err(error(format!(
                    "{name} field does not accept '?' (only day-of-month and day-of-week do)"
                )));
            }
            (field.low, field.top)
        } else if let Some((first, last)) = base.split_once('-') {
            let start = value(first, item, field)?;
            let end = value(last, item, field)?;
            if start > end {
                return Err(error(format!(
                    "{name} field range '{base}' starts after it ends"
                )));
            }
            (start, end)
        } else {
            let start = value(base, item, field)?;
            (
                start,
                if step_text.is_some() {
                    start.max(field.top)
                } else {
                    start
                },
            )
        };
        for v in (start..=end).step_by(step) {
            values[v as usize] = true;
        }
    }
    Ok(values)
}

/// A parsed cron expression; build it with [`parse_cron`]. Immutable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CronSpec {
    expr: String,
    seconds: u64,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Sorted years, `None` for any year.
    years: Option<Vec<i32>>,
    /// Both day fields restricted: the OR rule applies.
    either_day: bool,
    /// Hour field is `*` or a step: follows real time across DST changes.
    interval: bool,
}

/// Characters Python's `str.split()` splits on: Unicode white space plus U+001C-U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Parse a 5-, 6- or 7-field expression or an alias.
pub fn parse_cron(expr: &str) -> Result<CronSpec, CronError> {
    let mut parts: Vec<&str> = expr.split(python_space).filter(|p| !p.is_empty()).collect();
    if parts.len() == 1 && parts[0].starts_with('@') {
        let lower = parts[0].to_lowercase();
        let Some(&(_, alias)) = ALIASES.iter().find(|(name, _)| *name == lower) else {
            return Err(error(format!("unknown alias '{}'", parts[0])));
        };
        parts = alias.split(' ').collect();
    }
    if !(5..=7).contains(&parts.len()) {
        return Err(error(
            "Pattern must have between 5 and 7 fields.".to_owned(),
        ));
    }
    if parts.len() == 5 {
        parts.insert(0, "0");
    }
    if parts.len() == 6 {
        parts.push("*");
    }
    let mask = |values: Vec<bool>| {
        (values.iter().enumerate())
            .filter(|(_, allowed)| **allowed)
            .fold(0u64, |set, (value, _)| set | 1 << value)
    };
    let seconds = mask(parse_field(parts[0], &SECONDS)?);
    let minutes = mask(parse_field(parts[1], &MINUTES)?);
    let hours = mask(parse_field(parts[2], &HOURS)?);
    let days = mask(parse_field(parts[3], &DAYS)?);
    let months = mask(parse_field(parts[4], &MONTHS)?);
    let written_weekdays = mask(parse_field(parts[5], &WEEKDAYS)?);
    let years: Vec<i32> = (parse_field(parts[6], &YEARS)?.iter().enumerate())
        .filter(|(_, allowed)| **allowed)
        .filter_map(|(year, _)| i32::try_from(year).ok())
        .collect();
    // Weekday 7 is Sunday.
    let weekdays = (written_weekdays | (written_weekdays >> 7)) & ALL_WEEKDAYS;
    // A year field covering all of 1970-2099 places no limit on the year.
    let all_years = (YEARS.high - YEARS.low + 1) as usize;
    let years = (years.len() != all_years).then_some(years);
    Ok(CronSpec {
        expr: expr.to_owned(),
        seconds,
        minutes,
        hours,
        days,
        months,
        weekdays,
        years,
        either_day: days != ALL_DAYS && weekdays != ALL_WEEKDAYS,
        interval: parts[2].contains('*') || parts[2].contains('/'),
    })
}

/// Smallest allowed value >= `at_least` in a bit set, or `None` when the field must carry over.
fn next_in(set: u64, at_least: u32) -> Option<u32> {
    let rest = set.checked_shr(at_least).unwrap_or(0);
    (rest != 0).then(|| at_least + rest.trailing_zeros())
}

fn bits(set: u64) -> Vec<u32> {
    (0..64).filter(|bit| set & (1 << bit) != 0).collect()
}

const SECONDS_PER_DAY: i64 = 86_400;

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let year = i64::from(year) - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Fields (year, month, day, hour, minute, second) of naive wall seconds (also a recurring
/// occurrence's key, of UTC seconds).
pub(crate) fn civil(naive: i64) -> (i32, u32, u32, u32, u32, u32) {
    let days = naive.div_euclid(SECONDS_PER_DAY) + 719_468;
    let secs = naive.rem_euclid(SECONDS_PER_DAY);
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let small = |value: i64| u32::try_from(value).unwrap_or(0);
    (
        i32::try_from(year).unwrap_or(i32::MAX),
        small(month),
        small(day),
        small(secs / 3600),
        small(secs / 60 % 60),
        small(secs % 60),
    )
}

fn naive_of(year: i32, month: u32, day: u32, hour: u32, minute: u32, second: u32) -> i64 {
    days_from_civil(year, month, day) * SECONDS_PER_DAY
        + i64::from(hour * 3600 + minute * 60 + second)
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Decimal text of `floor + 1` for an integral `floor` of any size, as Python prints the int.
fn int_plus_one(floor: f64) -> String {
    // Fixed-precision formatting of an integral f64 is exact.
    let text = format!("{floor:.0}");
    let (negative, digits) = match text.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, text.as_str()),
    };
    let mut digits: Vec<u8> = digits.bytes().collect();
    if negative {
        // -(n) + 1 = -(n - 1), with n >= 1.
        let mut index = digits.len();
        while index > 0 {
            index -= 1;
            if digits[index] == b'0' {
                digits[index] = b'9';
            } else {
                digits[index] -= 1;
                break;
            }
        }
        let trimmed = String::from_utf8_lossy(&digits)
            .trim_start_matches('0')
            .to_owned();
        return if trimmed.is_empty() {
            "0".to_owned()
        } else {
            format!("-{trimmed}")
        };
    }
    let mut index = digits.len();
    loop {
        if index == 0 {
            digits.insert(0, b'1');
            break;
        }
        index -= 1;
        if digits[index] == b'9' {
            digits[index] = b'0';
        } else {
            digits[index] += 1;
            break;
        }
    }
    String::from_utf8_lossy(&digits).into_owned()
}

fn out_of_range(instant: &str) -> TimeError {
    TimeError {
        message: format!("time {instant} is outside the supported date range"),
    }
}

/// Naive wall seconds of Unix second `instant` in `tz` (`_wall_at`): both the UTC and the
/// local date must lie in years 1-9999, as Python's `datetime.fromtimestamp` requires.
fn wall_at(instant: i64, tz: &Zone) -> Result<i64, TimeError> {
    if !(MIN_SECOND..=MAX_SECOND).contains(&instant) {
        return Err(out_of_range(&instant.to_string()));
    }
    let local = instant + tz.offset_at(instant);
    if !(MIN_SECOND..=MAX_SECOND).contains(&local) {
        return Err(out_of_range(&instant.to_string()));
    }
    Ok(local)
}

/// Unix seconds of the wall time read with fold=0 and fold=1 (`_instants`): equal when it
/// happens once, first < second in an overlap, first > second in a gap.
fn instants(wall: i64, tz: &Zone) -> (i64, i64) {
    let (early, late) = tz.wall_offsets(wall);
    (wall - early, wall - late)
}

/// First Unix second in (before, after] whose UTC offset is that of `after` (bisection, as
/// `_transition`, so the same second is found whatever the zone data says in between).
fn transition(mut before: i64, mut after: i64, tz: &Zone) -> i64 {
    let target = tz.offset_at(after);
    while after - before > 1 {
        let middle = (before + after).div_euclid(2);
        if tz.offset_at(middle) == target {
            after = middle;
        } else {
            before = middle;
        }
    }
    after
}

impl CronSpec {
    /// The expression as given.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// Allowed seconds, ascending.
    pub fn seconds(&self) -> Vec<u32> {
        bits(self.seconds)
    }

    /// Allowed minutes, ascending.
    pub fn minutes(&self) -> Vec<u32> {
        bits(self.minutes)
    }

    /// Allowed hours, ascending.
    pub fn hours(&self) -> Vec<u32> {
        bits(self.hours)
    }

    /// Allowed days of the month, ascending.
    pub fn days(&self) -> Vec<u32> {
        bits(self.days)
    }

    /// Allowed months, ascending.
    pub fn months(&self) -> Vec<u32> {
        bits(self.months)
    }

    /// Allowed weekdays (Sunday = 0), ascending.
    pub fn weekdays(&self) -> Vec<u32> {
        bits(self.weekdays)
    }

    /// Allowed years, ascending, or `None` when the year is not limited.
    pub fn years(&self) -> Option<&[i32]> {
        self.years.as_deref()
    }

    /// Both day fields are restricted, so a day matches if either does.
    pub fn either_day(&self) -> bool {
        self.either_day
    }

    /// An interval schedule (hour field `*` or a step), which follows real time across DST
    /// changes; otherwise a fixed-time one.
    pub fn is_interval(&self) -> bool {
        self.interval
    }

    /// First occurrence strictly after Unix time `t`, matched on the wall clock of `tz`; `None`
    /// when nothing matches within the search horizon.
    ///
    /// # Panics
    ///
    /// When `t` is not finite or outside years 1-9999, where the Python core raises
    /// `ValueError`; [`CronSpec::try_next_after`] returns that error instead.
    pub fn next_after(&self, t: f64, tz: &Zone) -> Option<f64> {
        self.try_next_after(t, tz).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`CronSpec::next_after`], with Python's `ValueError` as an error.
    pub fn try_next_after(&self, t: f64, tz: &Zone) -> Result<Option<f64>, TimeError> {
        if !t.is_finite() {
            return Err(TimeError {
                message: format!("t must be a finite number (got {})", py_float_repr(t)),
            });
        }
        let floor = t.floor();
        // Beyond these bounds every time is out of range; the check keeps the cast exact.
        if !(-1e15..=1e15).contains(&floor) {
            return Err(out_of_range(&int_plus_one(floor)));
        }
        let first_second = floor as i64 + 1;
        let start = wall_at(first_second, tz)?;
        let last_year = self.last_year(civil(start).0);
        let mut found: Option<i64> = None;
        let mut scan_from = start;
        let (early, late) = instants(start, tz);
        if early < late {
            // `t` lies in a fall-back overlap: wall times [low, high) happen twice, once before
            // `change` and once after it.
            let change = transition(early, late, tz);
            let high = start + (change - early);
            let low = high - (late - early);
            let second_pass = first_second >= change;
            if second_pass {
                scan_from = high; // every wall time before `high` has had its first run
            }
            if self.interval {
                let from = if second_pass { start } else { low };
                if let Some(repeat) = self.next_wall(from, last_year)
                    && repeat < high
                {
                    found = Some(instants(repeat, tz).1);
                }
            }
        }
        if let Some(regular) = self.first_run_from(scan_from, tz, last_year)? {
            found = Some(found.map_or(regular, |repeat| repeat.min(regular)));
        }
        Ok(found.map(|instant| instant as f64))
    }

    fn last_year(&self, year: i32) -> i32 {
        match &self.years {
            Some(years) => years
                .last()
                .copied()
                .unwrap_or(YEARS.low as i32)
                .min(LAST_YEAR),
            None => year.saturating_add(HORIZON_YEARS).min(LAST_YEAR),
        }
    }

    /// Earliest run of a matching wall time >= `wall` (first passes and gap ends only).
    fn first_run_from(
        &self,
        wall: i64,
        tz: &Zone,
        last_year: i32,
    ) -> Result<Option<i64>, TimeError> {
        let mut candidate = self.next_wall(wall, last_year);
        while let Some(wall) = candidate {
            let (early, late) = instants(wall, tz);
            if early <= late {
                return Ok(Some(early)); // exists; when repeated, its first pass comes first
            }
            let change = transition(late, early, tz); // the wall time falls in a gap
            if !self.interval {
                return Ok(Some(change));
            }
            // The gap's wall times do not happen: resume at the wall time after the change.
            candidate = self.next_wall(wall_at(change, tz)?, last_year);
        }
        Ok(None)
    }

    /// Smallest matching wall time >= `wall`, carrying over field by field.
    fn next_wall(&self, wall: i64, last_year: i32) -> Option<i64> {
        let (mut year, mut month, mut day, mut hour, mut minute, mut second) = civil(wall);
        while year <= last_year {
            if let Some(years) = &self.years {
                let index = years.partition_point(|&y| y < year);
                let next_year = *years.get(index)?;
                if next_year > last_year {
                    return None;
                }
                if next_year != year {
                    (year, month, day, hour, minute, second) = (next_year, 1, 1, 0, 0, 0);
                }
            }
            let Some(next_month) = next_in(self.months, month) else {
                (year, month, day, hour, minute, second) = (year + 1, 1, 1, 0, 0, 0);
                continue;
            };
            if next_month != month {
                (month, day, hour, minute, second) = (next_month, 1, 0, 0, 0);
            }
            let Some(next_day) = self.next_day(year, month, day) else {
                (month, day, hour, minute, second) = (month + 1, 1, 0, 0, 0);
                continue;
            };
            if next_day != day {
                (day, hour, minute, second) = (next_day, 0, 0, 0);
            }
            let Some(next_hour) = next_in(self.hours, hour) else {
                (day, hour, minute, second) = (day + 1, 0, 0, 0);
                continue;
            };
            if next_hour != hour {
                (hour, minute, second) = (next_hour, 0, 0);
            }
            let Some(next_minute) = next_in(self.minutes, minute) else {
                (hour, minute, second) = (hour + 1, 0, 0);
                continue;
            };
            if next_minute != minute {
                (minute, second) = (next_minute, 0);
            }
            let Some(next_second) = next_in(self.seconds, second) else {
                (minute, second) = (minute + 1, 0);
                continue;
            };
            return Some(naive_of(year, month, day, hour, minute, next_second));
        }
        None
    }

    fn next_day(&self, year: i32, month: u32, day: u32) -> Option<u32> {
        let length = days_in_month(year, month);
        // 1970-01-01 was a Thursday (4 in cron numbering, Sunday = 0).
        let first_weekday = (days_from_civil(year, month, 1) + 4).rem_euclid(7);
        (day..=length).find(|&candidate| {
            let weekday = (first_weekday + i64::from(candidate) - 1).rem_euclid(7);
            let by_date = self.days & (1 << candidate) != 0;
            let by_weekday = self.weekdays & (1 << weekday) != 0;
            if self.either_day {
                by_date || by_weekday
            } else {
                by_date && by_weekday
            }
        })
    }
}
