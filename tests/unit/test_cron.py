"""Unit tests of the cron parser and next-occurrence arithmetic (docs/fixed-starts.md,
"Recurring schedules").

Times are written as UTC ISO strings so every expectation is an exact instant; `run` follows a
schedule from a start time and lists the occurrences it produces. The DST tables cover spring
and fall 2026 in two northern zones and one southern zone for daily, hourly, 15-minute and
30-second schedules; the property test checks `next_after` against a brute-force oracle that
restates the matching and DST rules independently of the implementation.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cronoq.core import cron
from cronoq.core.cron import CronError, CronSpec, parse_cron, zone

NEW_YORK = "America/New_York"
BERLIN = "Europe/Berlin"
SYDNEY = "Australia/Sydney"


def at(text: str) -> float:
    """Unix seconds of a UTC time written like 2026-03-08T07:00:00Z."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(instant: float) -> str:
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(expr: str, start: str, count: int, tz: str | None = None) -> list[str | None]:
    """The next `count` occurrences after `start` (stopping at the first None)."""
    spec, where = parse_cron(expr), zone(tz)
    moment = at(start)
    found: list[str | None] = []
    for _ in range(count):
        result = spec.next_after(moment, where)
        if result is None:
            found.append(None)
            break
        found.append(iso(result))
        moment = result
    return found


# -- syntax ----------------------------------------------------------------------------------

JAN1 = "2026-01-01T00:00:00Z"  # a Thursday


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("* * * * *", ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z"]),
        ("5 * * * *", ["2026-01-01T00:05:00Z", "2026-01-01T01:05:00Z", "2026-01-01T02:05:00Z"]),
        ("10-12 * * * *", ["2026-01-01T00:10:00Z", "2026-01-01T00:11:00Z", "2026-01-01T00:12:00Z",
                           "2026-01-01T01:10:00Z"]),
        ("*/20 * * * *", ["2026-01-01T00:20:00Z", "2026-01-01T00:40:00Z", "2026-01-01T01:00:00Z"]),
        ("10-30/10 * * * *", ["2026-01-01T00:10:00Z", "2026-01-01T00:20:00Z",
                              "2026-01-01T00:30:00Z", "2026-01-01T01:10:00Z"]),
        ("45/5 * * * *", ["2026-01-01T00:45:00Z", "2026-01-01T00:50:00Z", "2026-01-01T00:55:00Z",
                          "2026-01-01T01:45:00Z"]),
        ("5,10-11,*/30 * * * *", ["2026-01-01T00:05:00Z", "2026-01-01T00:10:00Z",
                                  "2026-01-01T00:11:00Z", "2026-01-01T00:30:00Z",
                                  "2026-01-01T01:00:00Z"]),
        ("0 22-23 * * *", ["2026-01-01T22:00:00Z", "2026-01-01T23:00:00Z",
                           "2026-01-02T22:00:00Z"]),
        ("0 0 1 JAN,jul *", ["2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z"]),
        ("0 0 1 jan-Mar/2 *", ["2026-03-01T00:00:00Z", "2027-01-01T00:00:00Z"]),
        ("0 9 * * mon-fri", ["2026-01-01T09:00:00Z", "2026-01-02T09:00:00Z",
                             "2026-01-05T09:00:00Z"]),
        ("0 0 * * 0", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
        ("0 0 * * 7", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
        ("0 0 * * SUN", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
        ("0 0 * * 5-7", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z",
                         "2026-01-09T00:00:00Z"]),
        # `*` and `a/n` in the weekday field stop at Saturday: Sunday is not counted twice.
        ("0 0 * * */2", ["2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z", "2026-01-06T00:00:00Z",
                         "2026-01-08T00:00:00Z"]),
        ("0 0 * * 1/2", ["2026-01-02T00:00:00Z", "2026-01-05T00:00:00Z", "2026-01-07T00:00:00Z",
                         "2026-01-09T00:00:00Z"]),
        ("0 0 ? * MON", ["2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z"]),
        ("0 0 13 * ?", ["2026-01-13T00:00:00Z", "2026-02-13T00:00:00Z"]),
        ("15 * * * * *", ["2026-01-01T00:00:15Z", "2026-01-01T00:01:15Z"]),
        ("0 30 1 * * *", ["2026-01-01T01:30:00Z", "2026-01-02T01:30:00Z"]),
        ("@yearly", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
        ("@annually", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
        ("@monthly", ["2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"]),
        ("@weekly", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
        ("@daily", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]),
        ("@midnight", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]),
        ("@hourly", ["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"]),
        ("@Daily", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]),
        ("  0   12\t* * *  ", ["2026-01-01T12:00:00Z", "2026-01-02T12:00:00Z"]),
    ],
)  # fmt: skip
def test_syntax_elements(expr: str, expected: list[str]) -> None:
    assert run(expr, JAN1, len(expected)) == expected


def test_every_second_with_six_fields() -> None:
    spec = parse_cron("* * * * * *")
    assert spec.next_after(at("2026-01-01T12:00:00Z") + 0.5, zone(None)) == at(
        "2026-01-01T12:00:01Z"
    )
    assert run("* * * * * *", "2026-01-01T23:59:58Z", 3) == [
        "2026-01-01T23:59:59Z",
        "2026-01-02T00:00:00Z",
        "2026-01-02T00:00:01Z",
    ]


def test_next_after_is_strictly_after() -> None:
    spec, utc = parse_cron("0 * * * *"), zone(None)
    assert spec.next_after(at("2026-01-01T05:00:00Z"), utc) == at("2026-01-01T06:00:00Z")
    assert spec.next_after(at("2026-01-01T05:00:00Z") - 0.001, utc) == at("2026-01-01T05:00:00Z")


def test_year_field() -> None:
    assert run("0 0 12 1 1 * 2030", JAN1, 2) == ["2030-01-01T12:00:00Z", None]
    assert run("0 0 0 1 1 * 2027-2031/2", JAN1, 4) == [
        "2027-01-01T00:00:00Z",
        "2029-01-01T00:00:00Z",
        "2031-01-01T00:00:00Z",
        None,
    ]
    assert run("0 0 0 1 1 * 2020", JAN1, 1) == [None]
    # A year field covering 1970-2099 limits nothing.
    assert run("0 0 0 1 1 * *", "2099-06-01T00:00:00Z", 1) == ["2100-01-01T00:00:00Z"]


def test_classic_or_rule_for_days() -> None:
    feb1 = "2026-02-01T00:00:00Z"  # a Sunday
    assert run("0 0 13 * FRI", feb1, 6) == [
        "2026-02-06T00:00:00Z",
        "2026-02-13T00:00:00Z",
        "2026-02-20T00:00:00Z",
        "2026-02-27T00:00:00Z",
        "2026-03-06T00:00:00Z",
        "2026-03-13T00:00:00Z",
    ]
    assert run("0 0 13 * *", feb1, 2) == ["2026-02-13T00:00:00Z", "2026-03-13T00:00:00Z"]
    assert run("0 0 * * FRI", feb1, 2) == ["2026-02-06T00:00:00Z", "2026-02-13T00:00:00Z"]
    # A day-of-month covering every day is unrestricted: only the weekday counts.
    assert run("0 0 1-31 * FRI", feb1, 2) == ["2026-02-06T00:00:00Z", "2026-02-13T00:00:00Z"]
    # A stepped day-of-month is a restriction, so the OR rule applies (1, 11, 21 or Monday).
    assert run("0 0 */10 * MON", feb1, 7) == [
        "2026-02-02T00:00:00Z",
        "2026-02-09T00:00:00Z",
        "2026-02-11T00:00:00Z",
        "2026-02-16T00:00:00Z",
        "2026-02-21T00:00:00Z",
        "2026-02-23T00:00:00Z",
        "2026-03-01T00:00:00Z",
    ]


def field_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the search's field steps (calls of cron._next_in): a search that skips field by
    field takes a few per answer, one that walks the calendar second by second millions."""
    steps = [0]
    real = cron._next_in

    def counted(*args: Any) -> Any:
        steps[0] += 1
        return real(*args)

    monkeypatch.setattr(cron, "_next_in", counted)
    return steps


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 0 30 2 * 2030-2099"])
def test_never_matching_dates_are_valid_and_give_none_quickly(
    expr: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_cron(expr)
    steps = field_steps(monkeypatch)
    assert spec.next_after(at(JAN1), zone(None)) is None
    assert spec.next_after(at(JAN1), zone(NEW_YORK)) is None
    assert steps[0] <= 1000  # a search over the whole horizon, month by month at most


def test_leap_day_across_2100_is_within_the_horizon() -> None:
    assert run("0 0 29 2 *", "2096-03-01T00:00:00Z", 1) == ["2104-02-29T00:00:00Z"]


def test_next_after_skips_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """Far and frequent schedules, DST overlaps and gaps included, take a few field steps per
    answer, not a walk through the calendar."""
    utc, berlin = zone(None), zone(BERLIN)
    cases = [
        (parse_cron("0 0 0 1 1 * 2099"), at(JAN1), utc),
        (parse_cron("59 59 23 31 12 *"), at(JAN1), utc),
        (parse_cron("* * * * * *"), at("2026-10-25T00:30:00Z"), berlin),  # in the overlap
        (parse_cron("*/30 * * * * *"), at("2026-03-29T00:59:59Z"), berlin),  # before the gap
    ]
    for spec, moment, where in cases:
        steps = field_steps(monkeypatch)
        assert spec.next_after(moment, where) is not None
        assert steps[0] <= 50


# -- errors ----------------------------------------------------------------------------------

COUNT = "Invalid pattern: Pattern must have between 5 and 7 fields."


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", COUNT),
        ("* * * * * * * *", COUNT),
        ("", COUNT),
        ("   ", COUNT),
        ("@daily 5", COUNT),
        ("61 * * * *", "Invalid pattern: minute field value 61 is out of range 0-59"),
        ("* 24 * * *", "Invalid pattern: hour field value 24 is out of range 0-23"),
        ("* * 0 * *", "Invalid pattern: day-of-month field value 0 is out of range 1-31"),
        ("* * 32 * *", "Invalid pattern: day-of-month field value 32 is out of range 1-31"),
        ("* * * 13 *", "Invalid pattern: month field value 13 is out of range 1-12"),
        ("* * * * 8", "Invalid pattern: day-of-week field value 8 is out of range 0-7"),
        ("60 * * * * *", "Invalid pattern: second field value 60 is out of range 0-59"),
        ("0 0 0 1 1 * 1969", "Invalid pattern: year field value 1969 is out of range 1970-2099"),
        ("0 0 0 1 1 * 2100", "Invalid pattern: year field value 2100 is out of range 1970-2099"),
        ("1-99 * * * *", "Invalid pattern: minute field value 99 is out of range 0-59"),
        ("*/0 * * * *",
         "Invalid pattern: minute field step '0' in '*/0' must be a positive integer"),
        ("*/x * * * *",
         "Invalid pattern: minute field step 'x' in '*/x' must be a positive integer"),
        ("* */ * * *", "Invalid pattern: hour field step '' in '*/' must be a positive integer"),
        ("* 1-5/-2 * * *",
         "Invalid pattern: hour field step '-2' in '1-5/-2' must be a positive integer"),
        ("* 1/2/3 * * *",
         "Invalid pattern: hour field step '2/3' in '1/2/3' must be a positive integer"),
        ("* * * FOO *",
         "Invalid pattern: month field value 'FOO' is not a number or a month name (JAN-DEC)"),
        ("* * * * FUNDAY",
         "Invalid pattern: day-of-week field value 'FUNDAY' is not a number or a weekday name "
         "(SUN-SAT)"),
        ("JAN * * * *", "Invalid pattern: minute field value 'JAN' is not a number"),
        ("* * L * *", "Invalid pattern: day-of-month field value 'L' is not a number"),
        ("* * * * MON#2",
         "Invalid pattern: day-of-week field value 'MON#2' is not a number or a weekday name "
         "(SUN-SAT)"),
        ("5-2 * * * *", "Invalid pattern: minute field range '5-2' starts after it ends"),
        ("* * * DEC-JAN *", "Invalid pattern: month field range 'DEC-JAN' starts after it ends"),
        ("1,,2 * * * *", "Invalid pattern: minute field '1,,2' has an empty list entry"),
        ("1, * * * *", "Invalid pattern: minute field '1,' has an empty list entry"),
        ("-5 * * * *", "Invalid pattern: minute field entry '-5' is incomplete"),
        ("/5 * * * *", "Invalid pattern: minute field entry '/5' is incomplete"),
        ("* ? * * *",
         "Invalid pattern: hour field does not accept '?' (only day-of-month and day-of-week do)"),
        ("@fortnightly", "Invalid pattern: unknown alias '@fortnightly'"),
        ("1" * 40 + " * * * *", f"Invalid pattern: minute field value {'1' * 40} is out of range "
         "0-59"),
    ],
)  # fmt: skip
def test_invalid_patterns(expr: str, message: str) -> None:
    with pytest.raises(CronError) as caught:
        parse_cron(expr)
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


def test_non_string_expression() -> None:
    with pytest.raises(TypeError, match="cron expression must be a str, not int"):
        parse_cron(5)  # type: ignore[arg-type]


def test_non_finite_time() -> None:
    with pytest.raises(ValueError, match="finite"):
        parse_cron("* * * * *").next_after(math.nan, zone(None))


# -- zones -----------------------------------------------------------------------------------


def test_zone() -> None:
    assert zone(None) is UTC
    assert zone(BERLIN) == ZoneInfo(BERLIN)
    for name in ("Mars/Olympus", "", "../etc/passwd", "America", "a\0b"):
        with pytest.raises(CronError) as caught:
            zone(name)
        assert str(caught.value) == f"unknown time zone {name!r}"
    with pytest.raises(CronError) as caught:
        zone("Mars/Olympus")
    assert str(caught.value) == "unknown time zone 'Mars/Olympus'"


# -- the spec object -------------------------------------------------------------------------


def test_spec_is_immutable_with_expr_and_repr() -> None:
    spec = parse_cron("*/5 9-17 * * MON-FRI")
    assert spec.expr == "*/5 9-17 * * MON-FRI"
    assert repr(spec) == "CronSpec('*/5 9-17 * * MON-FRI')"
    assert repr(parse_cron("@hourly")) == "CronSpec('@hourly')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.expr = "* * * * *"  # type: ignore[misc]
    assert spec == parse_cron("*/5 9-17 * * MON-FRI")
    assert hash(spec) == hash(parse_cron("*/5 9-17 * * MON-FRI"))
    assert isinstance(spec, CronSpec)


# -- daylight saving time --------------------------------------------------------------------
# 2026 changes: New York  Mar 8 02:00 EST -> 03:00 EDT (07:00Z), Nov 1 02:00 EDT -> 01:00 EST
# (06:00Z); Berlin Mar 29 02:00 CET -> 03:00 CEST (01:00Z), Oct 25 03:00 CEST -> 02:00 CET
# (01:00Z); Sydney Apr 5 03:00 AEDT -> 02:00 AEST (Apr 4 16:00Z), Oct 4 02:00 AEST -> 03:00
# AEDT (Oct 3 16:00Z).

DAILY = "30 2 * * *"
HOURLY = "0 * * * *"
QUARTER = "*/15 * * * *"
HALF_MINUTE = "*/30 * * * * *"

DST_TABLE = [
    # New York, spring: 02:30 does not exist and runs at 03:00 EDT; interval schedules skip it.
    (NEW_YORK, DAILY, "2026-03-07T00:00:00Z",
     ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    (NEW_YORK, HOURLY, "2026-03-08T05:30:00Z",
     ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"]),
    (NEW_YORK, QUARTER, "2026-03-08T06:30:00Z",
     ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"]),
    (NEW_YORK, HALF_MINUTE, "2026-03-08T06:59:00Z",
     ["2026-03-08T06:59:30Z", "2026-03-08T07:00:00Z", "2026-03-08T07:00:30Z"]),
    # New York, fall: 01:00-02:00 happens twice; 02:30 is not ambiguous there.
    (NEW_YORK, DAILY, "2026-10-31T00:00:00Z",
     ["2026-10-31T06:30:00Z", "2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"]),
    (NEW_YORK, "30 1 * * *", "2026-10-31T00:00:00Z",
     ["2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
    (NEW_YORK, HOURLY, "2026-11-01T04:30:00Z",
     ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z",
      "2026-11-01T08:00:00Z"]),
    (NEW_YORK, QUARTER, "2026-11-01T05:40:00Z",
     ["2026-11-01T05:45:00Z", "2026-11-01T06:00:00Z", "2026-11-01T06:15:00Z",
      "2026-11-01T06:30:00Z", "2026-11-01T06:45:00Z", "2026-11-01T07:00:00Z"]),
    (NEW_YORK, HALF_MINUTE, "2026-11-01T05:59:00Z",
     ["2026-11-01T05:59:30Z", "2026-11-01T06:00:00Z", "2026-11-01T06:00:30Z"]),
    # Berlin, spring.
    (BERLIN, DAILY, "2026-03-28T00:00:00Z",
     ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
    (BERLIN, HOURLY, "2026-03-28T23:30:00Z",
     ["2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"]),
    (BERLIN, QUARTER, "2026-03-29T00:30:00Z",
     ["2026-03-29T00:45:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z"]),
    (BERLIN, HALF_MINUTE, "2026-03-29T00:59:00Z",
     ["2026-03-29T00:59:30Z", "2026-03-29T01:00:00Z", "2026-03-29T01:00:30Z"]),
    # Berlin, fall: 02:00-03:00 happens twice; 02:30 runs in the first pass only.
    (BERLIN, DAILY, "2026-10-24T00:00:00Z",
     ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
    (BERLIN, HOURLY, "2026-10-24T23:30:00Z",
     ["2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"]),
    (BERLIN, QUARTER, "2026-10-25T00:30:00Z",
     ["2026-10-25T00:45:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:15:00Z"]),
    (BERLIN, HALF_MINUTE, "2026-10-25T00:59:00Z",
     ["2026-10-25T00:59:30Z", "2026-10-25T01:00:00Z", "2026-10-25T01:00:30Z"]),
    # Sydney, fall (April): 02:00-03:00 happens twice.
    (SYDNEY, DAILY, "2026-04-02T12:00:00Z",
     ["2026-04-02T15:30:00Z", "2026-04-03T15:30:00Z", "2026-04-04T15:30:00Z",
      "2026-04-05T16:30:00Z"]),
    (SYDNEY, HOURLY, "2026-04-04T14:30:00Z",
     ["2026-04-04T15:00:00Z", "2026-04-04T16:00:00Z", "2026-04-04T17:00:00Z"]),
    (SYDNEY, QUARTER, "2026-04-04T15:40:00Z",
     ["2026-04-04T15:45:00Z", "2026-04-04T16:00:00Z", "2026-04-04T16:15:00Z"]),
    (SYDNEY, HALF_MINUTE, "2026-04-04T15:59:00Z",
     ["2026-04-04T15:59:30Z", "2026-04-04T16:00:00Z", "2026-04-04T16:00:30Z"]),
    # Sydney, spring (October): 02:00-03:00 does not exist.
    (SYDNEY, DAILY, "2026-10-01T12:00:00Z",
     ["2026-10-01T16:30:00Z", "2026-10-02T16:30:00Z", "2026-10-03T16:00:00Z",
      "2026-10-04T15:30:00Z"]),
    (SYDNEY, HOURLY, "2026-10-03T15:30:00Z",
     ["2026-10-03T16:00:00Z", "2026-10-03T17:00:00Z"]),
    (SYDNEY, QUARTER, "2026-10-03T15:40:00Z",
     ["2026-10-03T15:45:00Z", "2026-10-03T16:00:00Z", "2026-10-03T16:15:00Z"]),
    (SYDNEY, HALF_MINUTE, "2026-10-03T15:59:00Z",
     ["2026-10-03T15:59:30Z", "2026-10-03T16:00:00Z", "2026-10-03T16:00:30Z"]),
]  # fmt: skip


@pytest.mark.parametrize(("tz", "expr", "start", "expected"), DST_TABLE)
def test_dst_transitions(tz: str, expr: str, start: str, expected: list[str]) -> None:
    assert run(expr, start, len(expected), tz) == expected


def test_fixed_time_starting_in_the_second_pass_waits_for_the_next_day() -> None:
    # 06:10Z is 01:10 EST, the second pass; 01:30 already ran at 05:30Z (EDT).
    assert run("30 1 * * *", "2026-11-01T06:10:00Z", 1, NEW_YORK) == ["2026-11-02T06:30:00Z"]
    # An interval schedule started there continues in real time.
    assert run("*/20 * * * *", "2026-11-01T06:10:00Z", 2, NEW_YORK) == [
        "2026-11-01T06:20:00Z",
        "2026-11-01T06:40:00Z",
    ]


def test_fixed_hour_with_a_minute_step_runs_each_wall_time_once() -> None:
    # The hour is named, so this is a time-of-day schedule: the repeated 01:xx is not rerun.
    assert run("*/20 1 * * *", "2026-11-01T04:00:00Z", 4, NEW_YORK) == [
        "2026-11-01T05:00:00Z",
        "2026-11-01T05:20:00Z",
        "2026-11-01T05:40:00Z",
        "2026-11-02T06:00:00Z",
    ]
    # Every matching minute of the missing 02:xx hour collapses into one run at the gap's end.
    assert run("* 2 * * *", "2026-03-08T06:00:00Z", 3, NEW_YORK) == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:00:00Z",
        "2026-03-09T06:01:00Z",
    ]


def test_every_second_across_both_changes() -> None:
    assert run("* * * * * *", "2026-03-08T06:59:58Z", 3, NEW_YORK) == [
        "2026-03-08T06:59:59Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:00:01Z",
    ]
    assert run("* * * * * *", "2026-11-01T05:59:58Z", 3, NEW_YORK) == [
        "2026-11-01T05:59:59Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:00:01Z",
    ]


def test_fixed_offset_zone() -> None:
    from datetime import timezone

    plus_five_thirty = timezone(timedelta(hours=5, minutes=30))
    spec = parse_cron("0 9 * * *")
    assert spec.next_after(at(JAN1), plus_five_thirty) == at("2026-01-01T03:30:00Z")


# -- property: next_after is the first occurrence --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Oracle:
    """The matching and DST rules restated by brute force, for 5-field specs."""

    expr: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    fixed: bool  # hour field names hours: a time-of-day schedule

    def matches(self, wall: datetime) -> bool:
        if wall.second or wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        by_date = wall.day in self.days
        by_weekday = (wall.weekday() + 1) % 7 in self.weekdays
        if self.days != frozenset(range(1, 32)) and self.weekdays != frozenset(range(7)):
            return by_date or by_weekday
        return by_date and by_weekday

    def fires_at(self, instant: int, tz: tzinfo) -> bool:
        local = datetime.fromtimestamp(instant, tz)
        wall = local.replace(tzinfo=None)
        if self.matches(wall) and not (self.fixed and local.fold == 1):
            return True
        if self.fixed:  # a run at the end of a gap stands for every match inside it
            skipped = datetime.fromtimestamp(instant - 60, tz).replace(tzinfo=None, fold=0)
            skipped += timedelta(minutes=1)
            while skipped < wall:
                if self.matches(skipped):
                    return True
                skipped += timedelta(minutes=1)
        return False


def field(low: int, high: int, top: int) -> st.SearchStrategy[tuple[str, frozenset[int]]]:
    """A field's text and the values it denotes (`top` is where `*` and `a/n` stop)."""
    value = st.integers(low, high)
    single = value.map(lambda v: (str(v), frozenset({v})))
    span = st.tuples(value, value).map(sorted)
    ranged = span.map(lambda ab: (f"{ab[0]}-{ab[1]}", frozenset(range(ab[0], ab[1] + 1))))
    step = st.integers(1, top - low + 1)
    every = step.map(lambda n: (f"*/{n}", frozenset(range(low, top + 1, n))))
    ranged_step = st.tuples(span, step).map(
        lambda x: (f"{x[0][0]}-{x[0][1]}/{x[1]}", frozenset(range(x[0][0], x[0][1] + 1, x[1])))
    )
    item = st.one_of(single, ranged, every, ranged_step)
    listed = st.lists(item, min_size=1, max_size=3).map(
        lambda items: (",".join(t for t, _ in items), frozenset().union(*(v for _, v in items)))
    )
    return st.one_of(st.just(("*", frozenset(range(low, top + 1)))), listed)


def rarely_restricted(
    low: int, high: int, top: int
) -> st.SearchStrategy[tuple[str, frozenset[int]]]:
    """Day and month fields: mostly `*`, so that schedules often fire near a DST change."""
    star = st.just(("*", frozenset(range(low, top + 1))))
    return st.one_of(star, star, star, field(low, high, top))


@st.composite
def oracles(draw: st.DrawFn) -> Oracle:
    minute_text, minutes = draw(field(0, 59, 59))
    # Most hour fields name only hours 0-3, where the changes of the test zones are.
    near = st.integers(0, 3).map(lambda v: (str(v), frozenset({v})))
    hour_text, hours = draw(st.one_of(field(0, 23, 23), field(0, 3, 23), near, near))
    day_text, days = draw(rarely_restricted(1, 31, 31))
    month_text, months = draw(rarely_restricted(1, 12, 12))
    weekday_text, weekdays = draw(rarely_restricted(0, 7, 6))
    expr = f"{minute_text} {hour_text} {day_text} {month_text} {weekday_text}"
    return Oracle(
        expr,
        minutes,
        hours,
        days,
        months,
        frozenset(day % 7 for day in weekdays),
        fixed="*" not in hour_text and "/" not in hour_text,
    )


# A zone and one of its 2026 changes to probe around (UTC has none, any instant will do).
ZONES_AND_CHANGES = [
    (None, "2026-11-01T06:00:00Z"),
    (NEW_YORK, "2026-03-08T07:00:00Z"),
    (NEW_YORK, "2026-11-01T06:00:00Z"),
    (BERLIN, "2026-03-29T01:00:00Z"),
    (BERLIN, "2026-10-25T01:00:00Z"),
    (SYDNEY, "2026-04-04T16:00:00Z"),
    (SYDNEY, "2026-10-03T16:00:00Z"),
]


@st.composite
def zones_and_times(draw: st.DrawFn) -> tuple[str | None, float]:
    """A zone and a time: anywhere in 2020-2030, or mostly within hours of a change."""
    name, change_text = draw(st.sampled_from(ZONES_AND_CHANGES))
    change = int(at(change_text))
    close = st.integers(change - 90 * 60, change + 90 * 60)
    whole = draw(
        st.one_of(
            st.integers(int(at("2020-01-01T00:00:00Z")), int(at("2030-12-31T00:00:00Z"))),
            st.integers(change - 26 * 3600, change + 2 * 3600),
            close,
            close,
        )
    )
    return name, whole + draw(st.sampled_from([0.0, 0.25, 0.999]))


def daily_or_hourly(expr: str, minute: int, hour: int | None) -> Oracle:
    """An oracle for `minute hour * * *` (hour None: every hour)."""
    hours = frozenset(range(24)) if hour is None else frozenset({hour})
    every_day, every_month = frozenset(range(1, 32)), frozenset(range(1, 13))
    return Oracle(expr, frozenset({minute}), hours, every_day, every_month, frozenset(range(7)),
                  fixed=hour is not None)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(oracle=oracles(), where=zones_and_times())
# The DST paths, always tried: a repeated hour's second pass, started in either pass, and a gap.
@example(daily_or_hourly("30 1 * * *", 30, 1), (NEW_YORK, at("2026-11-01T06:10:00Z")))
@example(daily_or_hourly("0 * * * *", 0, None), (NEW_YORK, at("2026-11-01T05:30:00Z")))
@example(daily_or_hourly("0 * * * *", 0, None), (BERLIN, at("2026-10-25T01:10:00Z")))
@example(daily_or_hourly("30 2 * * *", 30, 2), (NEW_YORK, at("2026-03-08T06:00:00Z")))
def test_next_after_is_the_first_occurrence(
    oracle: Oracle, where: tuple[str | None, float]
) -> None:
    tz_name, moment = where
    tz = zone(tz_name)
    result = parse_cron(oracle.expr).next_after(moment, tz)
    if result is not None:
        assert result > moment
        assert result == int(result) and int(result) % 60 == 0
        assert oracle.fires_at(int(result), tz), (oracle.expr, iso(result))
    end = moment + 26 * 3600 if result is None else min(result, moment + 26 * 3600)
    minute = (math.floor(moment) // 60 + 1) * 60
    while minute < end:
        assert not oracle.fires_at(minute, tz), (oracle.expr, iso(minute))
        minute += 60
