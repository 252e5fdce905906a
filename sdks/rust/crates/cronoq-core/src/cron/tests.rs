//! The tricky rules of `cron.py`, checked on known answers (worked out with the Python core),
//! and properties that hold for every expression, zone and instant.

use proptest::prelude::*;

use super::*;

fn tz(name: &str) -> Zone {
    zone(Some(name)).unwrap()
}

/// Unix seconds of an RFC 3339 time with its offset, so each expectation shows the wall clock.
fn at(text: &str) -> f64 {
    text.parse::<jiff::Timestamp>().unwrap().as_second() as f64
}

/// The first `times.len()` occurrences after `start` (RFC 3339 times) in zone `name`.
fn assert_runs(expr: &str, name: &str, start: &str, times: &[&str]) {
    let spec = parse_cron(expr).unwrap();
    let zone = tz(name);
    let mut t = at(start);
    for expected in times {
        t = spec
            .next_after(t, &zone)
            .unwrap_or_else(|| panic!("{expr}: none after {t}"));
        assert_eq!(t, at(expected), "{expr} in {name}: expected {expected}");
    }
}

#[test]
fn interval_schedules_skip_the_spring_forward_gap() {
    let ny = "America/New_York";
    let times = ["2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00"];
    assert_runs("0 * * * *", ny, "2026-03-08T00:30:00-05:00", &times);
    let times = ["2026-03-08T01:45:00-05:00", "2026-03-08T03:00:00-04:00"];
    assert_runs("*/15 * * * *", ny, "2026-03-08T01:40:00-05:00", &times);
    // Lord Howe moves its clocks by half an hour: 02:00 becomes 02:30.
    let times = [
        "2026-10-04T01:30:00+10:30",
        "2026-10-04T02:30:00+11:00",
        "2026-10-04T03:00:00+11:00",
    ];
    assert_runs(
        "*/30 * * * *",
        "Australia/Lord_Howe",
        "2026-10-04T01:00:00+10:30",
        &times,
    );
}

#[test]
fn fixed_time_schedules_run_once_at_the_end_of_a_gap() {
    let ny = "America/New_York";
    let times = ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"];
    assert_runs("30 2 * * *", ny, "2026-03-07T12:00:00-05:00", &times);
    // Twelve matches inside the gap collapse into one run.
    let times = ["2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"];
    assert_runs("*/5 2 * * *", ny, "2026-03-08T01:00:00-05:00", &times);
    let times = ["2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"];
    assert_runs(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00:00+10:30",
        &times,
    );
}

#[test]
fn interval_schedules_run_in_both_passes_of_an_overlap() {
    let times = [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ];
    assert_runs(
        "0 * * * *",
        "America/New_York",
        "2026-11-01T00:30:00-04:00",
        &times,
    );
    let times = [
        "2026-04-05T01:20:00+11:00",
        "2026-04-05T01:40:00+11:00",
        "2026-04-05T01:40:00+10:30",
        "2026-04-05T02:00:00+10:30",
    ];
    assert_runs(
        "*/20 * * * *",
        "Australia/Lord_Howe",
        "2026-04-05T01:00:00+11:00",
        &times,
    );
}

#[test]
fn fixed_time_schedules_run_once_in_an_overlap() {
    let times = ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"];
    assert_runs(
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00:00-04:00",
        &times,
    );
    // Starting inside the second pass does not repeat the first pass's run.
    let times = ["2026-11-02T01:30:00-05:00"];
    assert_runs(
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T01:10:00-05:00",
        &times,
    );
    let times = ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"];
    assert_runs(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T12:00:00+11:00",
        &times,
    );
}

#[test]
fn gaps_of_a_whole_day_and_of_a_quarter_hour() {
    // Samoa skipped 2011-12-30 entirely: noon that day runs when the gap ends, at midnight.
    let apia = "Pacific/Apia";
    let times = [
        "2011-12-29T12:00:00-10:00",
        "2011-12-31T00:00:00+14:00",
        "2011-12-31T12:00:00+14:00",
    ];
    assert_runs("0 12 * * *", apia, "2011-12-29T00:00:00-10:00", &times);
    let times = ["2011-12-29T18:00:00-10:00", "2011-12-31T00:00:00+14:00"];
    assert_runs("0 */6 * * *", apia, "2011-12-29T12:00:00-10:00", &times);
    // Nepal moved from +05:30 to +05:45 at the start of 1986.
    let kathmandu = "Asia/Kathmandu";
    let times = ["1986-01-01T00:20:00+05:45", "1986-01-01T00:30:00+05:45"];
    assert_runs(
        "*/10 * * * *",
        kathmandu,
        "1985-12-31T23:55:00+05:30",
        &times,
    );
    let times = ["1986-01-01T00:15:00+05:45", "1986-01-02T00:05:00+05:45"];
    assert_runs("5 0 * * *", kathmandu, "1985-12-31T12:00:00+05:30", &times);
}

#[test]
fn calendar_rules() {
    let leap = ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"];
    assert_runs("0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", &leap);
    let utc = Zone::utc();
    assert_eq!(
        parse_cron("0 0 30 2 *")
            .unwrap()
            .next_after(at("2026-01-01T00:00:00Z"), &utc),
        None
    );
    // Both day fields restricted: Friday or the 13th.
    let either = [
        "2026-01-02T00:00:00Z",
        "2026-01-09T00:00:00Z",
        "2026-01-13T00:00:00Z",
    ];
    assert_runs("0 0 13 * 5", "UTC", "2026-01-01T00:00:00Z", &either);
    // Only the weekday restricted (`?` is `*`): Fridays only.
    let fridays = [
        "2026-01-02T00:00:00Z",
        "2026-01-09T00:00:00Z",
        "2026-01-16T00:00:00Z",
    ];
    assert_runs("0 0 ? * FRI", "UTC", "2026-01-01T00:00:00Z", &fridays);
    let sundays = ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"];
    assert_runs("0 0 * * 7", "UTC", "2026-01-01T00:00:00Z", &sundays);
    assert_eq!(parse_cron("* * * * 0,7").unwrap().weekdays(), [0]);
    assert_eq!(parse_cron("* * * * */2").unwrap().weekdays(), [0, 2, 4, 6]);
    assert_eq!(parse_cron("* * * * 5/1").unwrap().weekdays(), [5, 6]);
    let steps = [
        "2026-01-01T00:10:00Z",
        "2026-01-01T00:30:00Z",
        "2026-01-01T00:50:00Z",
    ];
    assert_runs("10/20 * * * *", "UTC", "2026-01-01T00:00:00Z", &steps);
}

#[test]
fn year_field_limits_the_search() {
    let years = ["2030-01-01T00:00:00Z", "2031-01-01T00:00:00Z"];
    assert_runs(
        "0 0 0 1 1 * 2030-2031",
        "UTC",
        "2026-01-01T00:00:00Z",
        &years,
    );
    let utc = Zone::utc();
    let after = at("2031-01-01T00:00:00Z");
    assert_eq!(
        parse_cron("0 0 0 1 1 * 2030-2031")
            .unwrap()
            .next_after(after, &utc),
        None
    );
    assert_eq!(
        parse_cron("0 0 0 1 1 * 2025")
            .unwrap()
            .next_after(after, &utc),
        None
    );
    assert_eq!(parse_cron("0 0 0 * * * 1970-2099").unwrap().years(), None);
    // Without a year field the search stops ten years ahead.
    let spec = parse_cron("0 0 0 29 2 1").unwrap(); // OR rule: any Monday
    assert!(spec.next_after(at("2026-01-01T00:00:00Z"), &utc).is_some());
    let never = parse_cron("0 0 0 29 2 ? 2099").unwrap();
    assert_eq!(never.next_after(at("2026-01-01T00:00:00Z"), &utc), None);
}

#[test]
fn parse_errors_match_the_python_messages() {
    for (expr, message) in [
        ("* * * *", "Pattern must have between 5 and 7 fields."),
        ("@often", "unknown alias '@often'"),
        ("61 * * * *", "minute field value 61 is out of range 0-59"),
        (
            "* * * JANUARY *",
            "month field value 'JANUARY' is not a number or a month name (JAN-DEC)",
        ),
        ("* * * * 8", "day-of-week field value 8 is out of range 0-7"),
        (
            "*/0 * * * *",
            "minute field step '0' in '*/0' must be a positive integer",
        ),
        (
            "5-1 * * * *",
            "minute field range '5-1' starts after it ends",
        ),
        (
            "1,,2 * * * *",
            "minute field '1,,2' has an empty list entry",
        ),
        (
            "? * * * *",
            "minute field does not accept '?' (only day-of-month and day-of-week do)",
        ),
        ("-5 * * * *", "minute field entry '-5' is incomplete"),
        ("x * * * *", "minute field value 'x' is not a number"),
        (
            "0000000000000000001 * * * *",
            "minute field value 0000000000000000001 is out of range 0-59",
        ),
        (
            "0 0 * * * * 2100",
            "year field value 2100 is out of range 1970-2099",
        ),
    ] {
        assert_eq!(
            parse_cron(expr).unwrap_err().message(),
            format!("{PREFIX}{message}")
        );
    }
    assert!(parse_cron("@HOURLY").unwrap().is_interval());
    assert!(!parse_cron("@daily").unwrap().is_interval());
    assert_eq!(parse_cron("0 0 1 ſep mon").unwrap().months(), [9]);
    assert_eq!(
        parse_cron("*/0000000000000000000007 * * * *")
            .unwrap()
            .minutes()
            .len(),
        9
    );
}

#[test]
fn times_outside_the_date_range_are_errors() {
    let spec = parse_cron("* * * * *").unwrap();
    let utc = Zone::utc();
    let message = |t: f64| {
        spec.try_next_after(t, &utc)
            .unwrap_err()
            .message()
            .to_owned()
    };
    assert_eq!(message(f64::NAN), "t must be a finite number (got nan)");
    assert_eq!(
        message(f64::NEG_INFINITY),
        "t must be a finite number (got -inf)"
    );
    assert_eq!(
        message(1e20),
        "time 100000000000000000001 is outside the supported date range"
    );
    assert_eq!(
        message(-1e20),
        "time -99999999999999999999 is outside the supported date range"
    );
    assert_eq!(
        message(253402300799.5),
        "time 253402300800 is outside the supported date range"
    );
    assert_eq!(spec.try_next_after(253402300798.0, &utc), Ok(None));
}

const ZONES: [&str; 7] = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "America/Sao_Paulo",
    "Pacific/Apia",
];

/// Expressions from a few forms per field, so that matches are frequent enough to test.
fn expressions() -> impl Strategy<Value = String> {
    let minute = prop_oneof![
        Just("*".to_owned()),
        (1u32..30).prop_map(|n| format!("*/{n}")),
        (0u32..60).prop_map(|n| n.to_string()),
        (0u32..30, 30u32..60).prop_map(|(a, b)| format!("{a}-{b}")),
    ];
    let hour = prop_oneof![
        Just("*".to_owned()),
        (1u32..12).prop_map(|n| format!("*/{n}")),
        (0u32..24).prop_map(|n| n.to_string()),
        (0u32..4, 1u32..4).prop_map(|(a, n)| format!("{a}/{n}")),
        (0u32..12, 12u32..24).prop_map(|(a, b)| format!("{a},{b}")),
    ];
    let day = prop_oneof![Just("*".to_owned()), (1u32..32).prop_map(|n| n.to_string())];
    let month = prop_oneof![Just("*".to_owned()), (1u32..13).prop_map(|n| n.to_string())];
    let weekday = prop_oneof![Just("*".to_owned()), (0u32..8).prop_map(|n| n.to_string())];
    (minute.clone(), minute, hour, day, month, weekday)
        .prop_map(|(s, m, h, d, mo, w)| format!("{s} {m} {h} {d} {mo} {w}"))
}

/// Does the wall clock of `instant` in `zone` match the fields of `spec`?
fn matches(spec: &CronSpec, zone: &Zone, instant: i64) -> bool {
    let (year, month, day, hour, minute, second) = civil(instant + zone.offset_at(instant));
    let weekday = (days_from_civil(year, month, day) + 4).rem_euclid(7);
    let has = |set: u64, value: i64| set & (1 << value) != 0;
    let by_date = has(spec.days, day.into());
    let by_weekday = has(spec.weekdays, weekday);
    let day_ok = if spec.either_day {
        by_date || by_weekday
    } else {
        by_date && by_weekday
    };
    has(spec.seconds, second.into())
        && has(spec.minutes, minute.into())
        && has(spec.hours, hour.into())
        && has(spec.months, month.into())
        && day_ok
}

proptest! {
    // A fixed seed and no regression files: the same cases on every run.
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: proptest::test_runner::RngSeed::Fixed(34),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn next_occurrences_are_later_match_and_are_next(
        expr in expressions(),
        zone_index in 0..ZONES.len(),
        // 2000-01-01 to 2040-01-01, with fractions.
        t in 946_684_800.0f64..2_208_988_800.0,
    ) {
        let spec = parse_cron(&expr).unwrap();
        let zone = tz(ZONES[zone_index]);
        let Some(next) = spec.next_after(t, &zone) else {
            return Ok(());
        };
        prop_assert!(next > t);
        prop_assert_eq!(next, next.floor());
        let instant = next as i64;
        // The wall clock matches, except for a fixed-time run moved to the end of a gap.
        let moved = !spec.is_interval() && zone.offset_at(instant - 1) != zone.offset_at(instant);
        prop_assert!(moved || matches(&spec, &zone, instant), "{} at {}", expr, next);
        // Any point before the answer has the same next occurrence.
        for fraction in [0.0, 0.25, 0.5, 0.999] {
            let between = t + (next - 1.0 - t).max(0.0) * fraction;
            prop_assert_eq!(spec.next_after(between, &zone), Some(next));
        }
        // Interval schedules see every matching instant: none is skipped in real time.
        if spec.is_interval() {
            for probe in (t.floor() as i64 + 1..instant).take(7200) {
                prop_assert!(!matches(&spec, &zone, probe), "{} skipped {}", expr, probe);
            }
        }
    }

    #[test]
    fn parsing_never_panics_and_errors_are_prefixed(expr in "[0-9*/,?A-Za-z@ -]{0,30}") {
        match parse_cron(&expr) {
            Ok(spec) => prop_assert_eq!(spec.expr(), expr.as_str()),
            Err(e) => prop_assert!(e.message().starts_with(PREFIX)),
        }
    }
}
