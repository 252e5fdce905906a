"""Cron expressions: parsing and next-occurrence arithmetic, with no I/O and no clock.

The scheduler stores a `CronSpec` per recurring schedule and asks `next_after(t, tz)` for the
next occurrence whenever one is due to be materialized; callers always pass the time, so the
engine stays deterministic and testable on a virtual clock.

Syntax
------
5 fields ``minute hour day-of-month month day-of-week`` (the second is 0); 6 fields add a
leading seconds field; 7 fields add a trailing year field (1970-2099). Each field takes ``*``,
numbers, ranges ``a-b``, steps ``*/n``, ``a-b/n`` and ``a/n`` (``a`` to the field's maximum)
and comma lists of those. Months accept JAN-DEC and weekdays SUN-SAT (any case); weekday 7 is
Sunday like 0, and ``*`` or ``a/n`` in that field stop at 6 so Sunday is not counted twice.
``?`` means ``*`` in the two day fields. Aliases: ``@yearly``/``@annually``, ``@monthly``,
``@weekly``, ``@daily``/``@midnight``, ``@hourly``.

Days follow the classic cron rule: when both day-of-month and day-of-week are restricted (their
set is not every day), a day matches if either matches; otherwise only the restricted one
counts. A year field covering all of 1970-2099 places no limit on the year.

Patterns that can never match (``0 0 30 2 *``) are valid; `next_after` then returns None. It
searches at most ten years ahead (enough for the eight-year leap-day gap around 2100) or up to
the last year of the year field, skipping whole years, months, days, hours and minutes that
cannot match, so it never walks second by second.

Wall clock and daylight saving time
-----------------------------------
Fields are matched against the wall clock of the given zone. Two kinds of schedule are told
apart by how the *hour* field is written:

* interval schedules: the hour field is ``*`` or uses a step (``@hourly``, ``*/15 * * * *``,
  ``*/30 * * * * *``). They measure real time, so
  - wall times skipped by a spring-forward gap simply do not happen (an hourly job runs at
    01:00 and then 03:00 on the change day, a 15-minute job at 01:45 then 03:00);
  - wall times repeated by a fall-back overlap run in both passes (an hourly job runs at 01:00
    EDT and again at 01:00 EST), so the interval holds in real time.
* fixed-time schedules: any other hour field (``30 2 * * *``, ``*/5 2 * * *``, ``@daily``).
  They name a time of day, so
  - a wall time inside a gap runs once, at the first instant after the gap (02:30 on the
    spring-forward day in America/New_York runs at 03:00 EDT); several matches in one gap
    collapse into that single run;
  - a repeated wall time runs once, at its first occurrence (fold=0).

This is the rule of classic cron implementations (real-time jobs versus time-of-day jobs),
decided by the hour field alone so that one test answers both questions. Occurrences are whole
Unix seconds. Offset changes are located by bisection on `tzinfo.utcoffset`, so any tzinfo
works; a zone is assumed not to change its offset twice within one gap or overlap, which holds
for the tz database.
"""

from __future__ import annotations

import calendar
import math
import re
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["CronError", "CronSpec", "parse_cron", "zone"]

_PREFIX = "Invalid pattern: "
_FIELD_COUNT = _PREFIX + "Pattern must have between 5 and 7 fields."
_HORIZON_YEARS = 10
_LAST_YEAR = 9998  # keeps all date arithmetic inside datetime's range
_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)
_DIGITS = re.compile(r"[0-9]+")

_ALIASES: Mapping[str, str] = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}

_MONTH_NAMES: Mapping[str, int] = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
        start=1,
    )
}
_WEEKDAY_NAMES: Mapping[str, int] = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}


class CronError(ValueError):
    """A cron expression or time zone that cannot be used; the message is the reason."""


@dataclass(frozen=True)
class _Field:
    """How one position of the expression is read."""

    name: str
    low: int
    high: int  # largest value accepted when written
    top: int  # where ``*`` and ``a/n`` stop (6 for weekdays: 7 is only an alias of Sunday)
    names: Mapping[str, int]
    names_hint: str = ""
    question: bool = False  # ``?`` allowed (day fields only)


_SECONDS = _Field("second", 0, 59, 59, {})
_MINUTES = _Field("minute", 0, 59, 59, {})
_HOURS = _Field("hour", 0, 23, 23, {})
_DAYS = _Field("day-of-month", 1, 31, 31, {}, question=True)
_MONTHS = _Field("month", 1, 12, 12, _MONTH_NAMES, "a month name (JAN-DEC)")
_WEEKDAYS = _Field("day-of-week", 0, 7, 6, _WEEKDAY_NAMES, "a weekday name (SUN-SAT)", True)
_YEARS = _Field("year", 1970, 2099, 2099, {})
_ALL_DAYS = frozenset(range(1, 32))
_ALL_WEEKDAYS = frozenset(range(7))
_ALL_YEARS = frozenset(range(1970, 2100))


def _value(token: str, item: str, field: _Field) -> int:
    if not token:
        raise CronError(f"{_PREFIX}{field.name} field entry '{item}' is incomplete")
    if _DIGITS.fullmatch(token):
        # Very long digit strings are out of range anyway; don't make int() work for them.
        value = int(token) if len(token) <= 18 else field.high + 1
        if not field.low <= value <= field.high:
            raise CronError(
                f"{_PREFIX}{field.name} field value {token} is out of range "
                f"{field.low}-{field.high}"
            )
        return value
    named = field.names.get(token.upper())
    if named is not None:
        return named
    kind = f"a number or {field.names_hint}" if field.names else "a number"
    raise CronError(f"{_PREFIX}{field.name} field value '{token}' is not {kind}")


def _parse_field(text: str, field: _Field) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{_PREFIX}{field.name} field '{text}' has an empty list entry")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _DIGITS.fullmatch(step_text) or int(step_text) == 0:
                raise CronError(
                    f"{_PREFIX}{field.name} field step '{step_text}' in '{item}' "
                    "must be a positive integer"
                )
            step = int(step_text)
        if base in ("*", "?"):
            if base == "?" and not field.question:
                raise CronError(
                    f"{_PREFIX}{field.name} field does not accept '?' "
                    "(only day-of-month and day-of-week do)"
                )
            start, end = field.low, field.top
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _value(first, item, field), _value(last, item, field)
            if start > end:
                raise CronError(f"{_PREFIX}{field.name} field range '{base}' starts after it ends")
        else:
            start = _value(base, item, field)
            end = max(start, field.top) if slash else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _next_in(values: tuple[int, ...], at_least: int) -> int | None:
    """Smallest allowed value >= `at_least`, or None when the field must carry over."""
    index = bisect_left(values, at_least)
    return values[index] if index < len(values) else None


@dataclass(frozen=True, repr=False)
class CronSpec:
    """A parsed cron expression; build it with `parse_cron`. Immutable and hashable."""

    expr: str
    _seconds: tuple[int, ...]
    _minutes: tuple[int, ...]
    _hours: tuple[int, ...]
    _days: frozenset[int]
    _months: tuple[int, ...]
    _weekdays: frozenset[int]
    _years: tuple[int, ...] | None  # None: any year
    _either_day: bool  # both day fields restricted: the OR rule applies
    _interval: bool  # hour field is ``*`` or a step: follows real time across DST changes

    def __repr__(self) -> str:
        return f"CronSpec({self.expr!r})"

    def next_after(self, t: float, tz: tzinfo) -> float | None:
        """First occurrence strictly after Unix time `t`, matched on the wall clock of `tz`.

        Returns Unix seconds, or None when nothing matches within the search horizon. The DST
        rules are those of the module docstring.
        """
        if not math.isfinite(t):
            raise ValueError(f"t must be a finite number (got {t!r})")
        first_second = math.floor(t) + 1
        start = _wall_at(first_second, tz)
        last_year = self._last_year(start.year)
        found: list[int] = []
        scan_from = start
        early, late = _instants(start, tz)
        if early < late:
            # `t` lies in a fall-back overlap: wall times [low, high) happen twice, once before
            # `change` and once after it.
            change = _transition(early, late, tz)
            high = start + (change - early) * _SECOND
            low = high - (late - early) * _SECOND
            second_pass = first_second >= change
            if second_pass:
                scan_from = high  # every wall time before `high` has had its first run
            if self._interval:
                repeat = self._next_wall(start if second_pass else low, last_year)
                if repeat is not None and repeat < high:
                    found.append(_instants(repeat, tz)[1])
        regular = self._first_run_from(scan_from, tz, last_year)
        if regular is not None:
            found.append(regular)
        return float(min(found)) if found else None

    def _last_year(self, year: int) -> int:
        if self._years is not None:
            return min(self._years[-1], _LAST_YEAR)
        return min(year + _HORIZON_YEARS, _LAST_YEAR)

    def _first_run_from(self, wall: datetime, tz: tzinfo, last_year: int) -> int | None:
        """Earliest run of a matching wall time >= `wall` (first passes and gap ends only)."""
        candidate = self._next_wall(wall, last_year)
        while candidate is not None:
            early, late = _instants(candidate, tz)
            if early <= late:  # exists; when repeated, its first pass comes first
                return early
            change = _transition(late, early, tz)  # the wall time falls in a gap
            if not self._interval:
                return change
            # The gap's wall times do not happen: resume at the wall time after the change.
            candidate = self._next_wall(_wall_at(change, tz), last_year)
        return None

    def _next_wall(self, wall: datetime, last_year: int) -> datetime | None:
        """Smallest matching wall time >= `wall`, carrying over field by field."""
        year, month, day = wall.year, wall.month, wall.day
        hour, minute, second = wall.hour, wall.minute, wall.second
        while year <= last_year:
            if self._years is not None:
                next_year = _next_in(self._years, year)
                if next_year is None or next_year > last_year:
                    return None
                if next_year != year:
                    year, month, day, hour, minute, second = next_year, 1, 1, 0, 0, 0
            next_month = _next_in(self._months, month)
            if next_month is None:
                year, month, day, hour, minute, second = year + 1, 1, 1, 0, 0, 0
                continue
            if next_month != month:
                month, day, hour, minute, second = next_month, 1, 0, 0, 0
            next_day = self._next_day(year, month, day)
            if next_day is None:
                month, day, hour, minute, second = month + 1, 1, 0, 0, 0
                continue
            if next_day != day:
                day, hour, minute, second = next_day, 0, 0, 0
            next_hour = _next_in(self._hours, hour)
            if next_hour is None:
                day, hour, minute, second = day + 1, 0, 0, 0
                continue
            if next_hour != hour:
                hour, minute, second = next_hour, 0, 0
            next_minute = _next_in(self._minutes, minute)
            if next_minute is None:
                hour, minute, second = hour + 1, 0, 0
                continue
            if next_minute != minute:
                minute, second = next_minute, 0
            next_second = _next_in(self._seconds, second)
            if next_second is None:
                minute, second = minute + 1, 0
                continue
            return datetime(year, month, day, hour, minute, next_second)
        return None

    def _next_day(self, year: int, month: int, day: int) -> int | None:
        first_weekday, length = calendar.monthrange(year, month)  # Monday = 0
        for candidate in range(day, length + 1):
            weekday = (first_weekday + candidate) % 7  # cron numbering: Sunday = 0
            by_date = candidate in self._days
            by_weekday = weekday in self._weekdays
            if (by_date or by_weekday) if self._either_day else (by_date and by_weekday):
                return candidate
        return None


def parse_cron(expr: str) -> CronSpec:
    """Parse a 5-, 6- or 7-field expression or an alias; raises `CronError` with the reason."""
    if not isinstance(expr, str):
        raise TypeError(f"cron expression must be a str, not {type(expr).__name__}")
    parts = expr.split()
    if len(parts) == 1 and parts[0].startswith("@"):
        alias = _ALIASES.get(parts[0].lower())
        if alias is None:
            raise CronError(f"{_PREFIX}unknown alias '{parts[0]}'")
        parts = alias.split()
    if not 5 <= len(parts) <= 7:
        raise CronError(_FIELD_COUNT)
    if len(parts) == 5:
        parts.insert(0, "0")
    if len(parts) == 6:
        parts.append("*")
    seconds, minutes, hours, days, months, weekdays, years = (
        _parse_field(text, field)
        for text, field in zip(
            parts, (_SECONDS, _MINUTES, _HOURS, _DAYS, _MONTHS, _WEEKDAYS, _YEARS), strict=True
        )
    )
    weekdays = frozenset(day % 7 for day in weekdays)
    return CronSpec(
        expr=expr,
        _seconds=tuple(sorted(seconds)),
        _minutes=tuple(sorted(minutes)),
        _hours=tuple(sorted(hours)),
        _days=days,
        _months=tuple(sorted(months)),
        _weekdays=weekdays,
        _years=None if years == _ALL_YEARS else tuple(sorted(years)),
        _either_day=days != _ALL_DAYS and weekdays != _ALL_WEEKDAYS,
        _interval="*" in parts[2] or "/" in parts[2],
    )


def zone(name: str | None) -> tzinfo:
    """The time zone a schedule is evaluated in: None is UTC, otherwise an IANA name."""
    if name is None:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {name!r}") from None


def _wall_at(instant: int, tz: tzinfo) -> datetime:
    """Naive wall-clock time of Unix second `instant` in `tz`."""
    try:
        local = datetime.fromtimestamp(instant, tz)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"time {instant} is outside the supported date range") from None
    return local.replace(tzinfo=None, fold=0)


def _offset_at(instant: int, tz: tzinfo) -> timedelta | None:
    return datetime.fromtimestamp(instant, tz).utcoffset()


def _instants(wall: datetime, tz: tzinfo) -> tuple[int, int]:
    """Unix seconds of `wall` read with fold=0 and fold=1.

    Equal: the wall time happens once. First < second: it happens twice (fall-back overlap).
    First > second: it never happens (spring-forward gap); the offsets are those before and
    after the change, so the change lies in (second, first].
    """
    naive = (wall - _EPOCH) // _SECOND
    results: list[int] = []
    for fold in (0, 1):
        offset = wall.replace(tzinfo=tz, fold=fold).utcoffset()
        results.append(naive - (0 if offset is None else offset // _SECOND))
    return results[0], results[1]


def _transition(before: int, after: int, tz: tzinfo) -> int:
    """First Unix second in (before, after] whose UTC offset is that of `after` (bisection)."""
    target = _offset_at(after, tz)
    while after - before > 1:
        middle = (before + after) // 2
        if _offset_at(middle, tz) == target:
            after = middle
        else:
            before = middle
    return after
