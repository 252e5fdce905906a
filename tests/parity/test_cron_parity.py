"""Differential tests of cron expressions: `cronoq.core.cron` against the Rust port
(`cronoq_core::cron`) on the same generated inputs.

Compared: what `parse_cron` accepts and keeps (every field, the day rule, interval or fixed time)
or its error message; chains of `next_after` (every occurrence, or the error that stops the
chain); and `zone(name)` for every file of the tz database and mangled names. Instants cluster
around the offset changes of the zones (found from `utcoffset`), where the DST rules act, and
also cover the whole date range, its edges and non-finite values. Each hypothesis example is one
batch: one call into Rust answers all of it. CRONOQ_PARITY_SCALE=N runs N times as many.
"""

from __future__ import annotations

import math
import os
import random
from datetime import UTC, datetime
from functools import cache
from types import ModuleType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cronoq.core.cron import CronError, parse_cron, zone
from parity.budget import examples

ZONES = [
    None,
    "UTC",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "America/Sao_Paulo",
    "Pacific/Apia",
]
TZDIR = "/usr/share/zoneinfo"
WEEK = 7 * 86_400
MIN_T = datetime(1, 1, 1, tzinfo=UTC).timestamp()
MAX_T = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
# Spans scanned for offset changes: the tz data's own years, and years far in the future where
# only the zone's rule string (the TZif footer) applies.
SPANS = [(1900, 2100), (2399, 2401), (9997, 9999)]


def _year_start(year: int) -> int:
    return int(datetime(year, 1, 1, tzinfo=UTC).timestamp())


@cache
def transitions(name: str | None) -> tuple[int, ...]:
    """Unix seconds at which the zone's UTC offset changes (a weekly scan, then bisection)."""
    tz = zone(name)

    def offset(t: int) -> Any:
        return datetime.fromtimestamp(t, tz).utcoffset()

    found: list[int] = []
    for first, last in SPANS:
        t, end = _year_start(first), _year_start(last) - WEEK
        current = offset(t)
        while t < end:
            following = offset(t + WEEK)
            if following != current:
                low, high = t, t + WEEK
                while high - low > 1:
                    middle = (low + high) // 2
                    low, high = (middle, high) if offset(middle) == current else (low, middle)
                found.append(high)
            t, current = t + WEEK, following
    return tuple(found)


# ---- expressions -------------------------------------------------------------------------

MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
WEEKDAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
# (low, high, names) of second, minute, hour, day-of-month, month, day-of-week, year.
FIELDS = [
    (0, 59, []),
    (0, 59, []),
    (0, 23, []),
    (1, 31, []),
    (1, 12, MONTHS),
    (0, 7, WEEKDAYS),
    (1970, 2099, []),
]


def _value(rng: random.Random, low: int, high: int, names: list[str], value: int = -1) -> str:
    """A value as written: a number, sometimes zero-padded, or a name in some case."""
    value = rng.randint(low, high) if value < 0 else value
    roll = rng.random()
    if names and roll < 0.25 and 0 <= value - (low == 1) < len(names):
        word = names[value - (low == 1)]
        return rng.choice([word, word.lower(), word.title(), word[0].lower() + word[1:]])
    return f"0{value}" if roll > 0.9 else str(value)


# Rejected values and steps (some accepted in surprising ways: "\u017fun" upper-cases to SUN).
_ODD_TEXT = ["x", "JANUARY", "\u017fun", "", "-", "1-", "-1", "1--2", "+1", "1.5", "\u0663", "*/"]
_ODD_TEXT += ["/2", "?", "0", "00", "1/2", "L", "#", "9" * 20, "0" * 18 + "7", "0" * 17 + "7"]


def _bad(rng: random.Random, low: int, high: int) -> str:
    if rng.random() < 0.7:
        return rng.choice([*_ODD_TEXT, str(high + 1), str(low - 1)])
    return "".join(rng.choice("0123456789*/,?-aAnN#LW") for _ in range(rng.randint(0, 5)))


def _entry(rng: random.Random, index: int, broken: bool) -> str:
    low, high, names = FIELDS[index]

    def value() -> str:
        if broken and rng.random() < 0.3:
            return _bad(rng, low, high)
        return _value(rng, low, high, names)

    def step() -> str:
        return _bad(rng, low, high) if broken and rng.random() < 0.3 else str(rng.randint(1, 70))

    def named(number: int) -> str:
        return _value(rng, low, high, names, number)

    star = "?" if index in (3, 5) and rng.random() < 0.3 else "*"
    first, last = sorted((rng.randint(low, high), rng.randint(low, high)))
    forms = [
        lambda: star,
        value,
        lambda: f"{first}-{last}",
        lambda: f"{value()}-{value()}" if broken else f"{named(first)}-{named(last)}",
        lambda: f"{star}/{step()}",
        lambda: f"{value()}/{step()}",
        lambda: f"{first}-{last}/{step()}",
        lambda: "?" if broken else star,
    ]
    return rng.choice(forms)()


def _field_pool(index: int, broken: bool, size: int = 1500) -> list[str]:
    """Field texts drawn once from a seeded generator; hypothesis picks among them."""
    rng = random.Random(f"cron-{index}-{broken}")
    pool = []
    for _ in range(size):
        count = rng.choice([1, 1, 1, 2, 3])
        entries = [_entry(rng, index, broken) for _ in range(count)]
        if broken and rng.random() < 0.1:
            entries.insert(rng.randint(0, count), "")  # an empty list entry
        pool.append(",".join(entries))
    return pool


# Built once, and one pick per field: hypothesis spends far more on building strategies and on
# many small draws than on one pick from a list.
_FIELD_TEXT = {
    (index, broken): st.sampled_from(_field_pool(index, bool(broken)))
    for index in range(7)
    for broken in (0, 1)
}
# What str.split() splits on, and a zero-width space that it does not.
_SPACES = st.sampled_from([" "] * 20 + ["  ", "\t", "\n", "\x1c", "\u3000", "\xa0", "\u200b"])
_PERCENT = st.integers(0, 99)
_ALIASES = ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]
_ALIAS = st.sampled_from(
    [*_ALIASES, "@often", "@", "@reboot", "@YEARLY", "@Hourly", "@wee\u212aly"]
).flatmap(lambda alias: st.sampled_from([alias, f" {alias}\t", f"{alias} 1"]))
_ANY_TEXT = st.text(max_size=20)
_COUNT = st.sampled_from([5] * 8 + [6] * 6 + [7] * 6 + [4, 8])
_EDGE = st.sampled_from(["", " ", "\t"])
# Field indexes (into FIELDS) of an expression with that many fields.
_POSITIONS = {
    4: [1, 2, 3, 4],
    5: [1, 2, 3, 4, 5],
    6: [0, 1, 2, 3, 4, 5],
    7: [0, 1, 2, 3, 4, 5, 6],
    8: [0, 1, 2, 3, 4, 5, 6, 6],
}


@st.composite
def expressions(draw: st.DrawFn, broken_percent: int = 2) -> str:
    """Cron expressions of every syntax form; some of them invalid in some way."""
    kind = draw(_PERCENT)
    if kind < 6:
        return draw(_ALIAS)
    if kind < 8:
        return draw(_ANY_TEXT)
    indexes = _POSITIONS[draw(_COUNT)]
    out = draw(_EDGE)
    for position, index in enumerate(indexes):
        broken = int(draw(_PERCENT) < broken_percent)
        out += draw(_FIELD_TEXT[index, broken])
        out += draw(_SPACES) if position < len(indexes) - 1 else draw(_EDGE)
    return out


# ---- instants ----------------------------------------------------------------------------


_FRACTION = st.sampled_from([0.0, 0.0, 0.5, 0.999, -0.25])


def _weighted(*options: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, by weight (`st.one_of` would merge repeated ones)."""
    table = [strategy for weight, strategy in options for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(table.__getitem__)


_ODD_TIMES = st.sampled_from([math.nan, math.inf, -math.inf, 1e20, -1e20, 2.0**62, -0.0, 1e300])
_CENTURIES = st.integers(_year_start(1900), _year_start(2100))
_EDGES = st.one_of(
    st.integers(int(MIN_T) - 3 * 86_400, int(MIN_T) + 3 * 86_400),
    st.integers(int(MAX_T) - 11 * 366 * 86_400, int(MAX_T) + 3 * 86_400),
)


@cache
def instants(name: str | None) -> st.SearchStrategy[float]:
    """Unix times for zone `name`: mostly within hours of its offset changes."""
    changes = transitions(name)
    near = (
        st.tuples(st.sampled_from(changes), st.integers(-4 * 3600, 4 * 3600)).map(sum)
        if changes
        else _CENTURIES
    )
    whole = _weighted((6, near), (2, _CENTURIES), (1, _EDGES))
    plain = st.tuples(whole, _FRACTION).map(lambda pair: pair[0] + pair[1])
    return _weighted((15, plain), (1, _ODD_TIMES))


# ---- the Python side, shaped like the Rust answers ---------------------------------------


def py_fields(expr: str) -> tuple[Any, str | None]:
    try:
        spec = parse_cron(expr)
    except CronError as error:
        return None, str(error)
    fields = (  # the order of the Rust side's tuple
        list(spec._seconds),
        list(spec._minutes),
        list(spec._hours),
        sorted(spec._days),
        list(spec._months),
        sorted(spec._weekdays),
        None if spec._years is None else list(spec._years),
        spec._either_day,
        spec._interval,
    )
    return fields, None


def py_chain(expr: str, name: str | None, t: float, steps: int) -> tuple[list[Any], str | None]:
    try:
        spec = parse_cron(expr)
        tz = zone(name)
    except CronError as error:
        return [], str(error)
    found: list[float | None] = []
    for _ in range(steps):
        try:
            t_next = spec.next_after(t, tz)
        except ValueError as error:
            return found, str(error)
        found.append(t_next)
        if t_next is None:
            break
        t = t_next
    return found, None


def py_zone(name: str | None) -> str | None:
    try:
        zone(name)
    except CronError as error:
        return str(error)
    return None


def _compare(kind: str, inputs: list[Any], python: list[Any], rust: list[Any]) -> None:
    differences = [
        f"{case!r}\n    python: {p!r}\n    rust:   {r!r}"
        for case, p, r in zip(inputs, python, rust, strict=True)
        if p != r
    ]
    assert not differences, f"{len(differences)} {kind} differences:\n" + "\n".join(differences[:5])


# ---- tests -------------------------------------------------------------------------------


@examples(60)
@given(st.lists(expressions(broken_percent=15), min_size=40, max_size=60))
def test_parse_matches(core_py: ModuleType, exprs: list[str]) -> None:
    python = [py_fields(expr) for expr in exprs]
    rust = [(None if f is None else tuple(f), m) for f, m in core_py.cron_parse(exprs)]
    _compare("parse", exprs, python, rust)


# Schedules that fire often, at the hours where offsets change: most of their occurrences fall
# inside or right after a gap or an overlap.
_DENSE = st.tuples(
    st.sampled_from(["0", "0", "0", "*/15", "30", "*/20", "0,30", "59"]),
    st.sampled_from(["*", "*/15", "*/5", "0", "30", "45", "0,30", "*/7", "10/20", "59", "15-45"]),
    st.sampled_from(["*", "*/2", "*/3", "0/4", "1", "2", "3", "1-3", "0", "23", "1,2", "2/3"]),
    st.sampled_from(["*", "*", "?", "1-15", "*/2", "1,15,31"]),
    st.sampled_from(["*", "*", "*", "3,4,10,11", "MAR-APR"]),
    st.sampled_from(["*", "*", "?", "1-5", "0", "SUN"]),
).map(" ".join)


@st.composite
def chain_cases(draw: st.DrawFn, zones: list[str | None]) -> tuple[str, str | None, float, int]:
    name = draw(st.sampled_from(zones))
    expr = draw(st.one_of(_DENSE, expressions()))
    return expr, name, draw(instants(name)), draw(st.integers(1, 6))


@examples(120)
@given(st.lists(chain_cases(ZONES), min_size=20, max_size=30))
def test_next_after_chains_match(core_py: ModuleType, cases: list[Any]) -> None:
    python = [py_chain(*case) for case in cases]
    rust = [(list(found), message) for found, message in core_py.cron_next_chains(cases)]
    _compare("next_after", cases, python, rust)


def zone_files() -> list[str]:
    """Every file under the tz directory, as a key (TZif or not)."""
    names = []
    for directory, _, files in os.walk(TZDIR):
        for file in files:
            names.append(os.path.relpath(os.path.join(directory, file), TZDIR))
    return sorted(names)


@cache
def loadable_zones() -> list[str]:
    return [name for name in zone_files() if py_zone(name) is None]


def test_every_tz_file_loads_alike(core_py: ModuleType) -> None:
    names: list[str | None] = [None, ""]
    for name in zone_files():
        names += [name, name.lower(), name + "/", "./" + name, name.replace("/", "//"), "/" + name]
    names += ["..", ".", "../zoneinfo/UTC", "America", "America/../UTC", "UTC\x00", "it's", "\\"]
    python = [py_zone(name) for name in names]
    _compare("zone", names, python, core_py.cron_zone(names))
    assert len(loadable_zones()) > 300  # the tz database is there, not just errors compared


@examples(40)
@given(st.lists(st.text(max_size=12), min_size=10, max_size=20))
def test_arbitrary_zone_names_fail_alike(core_py: ModuleType, names: list[str]) -> None:
    _compare("zone", names, [py_zone(name) for name in names], core_py.cron_zone(names))


@examples(50)
@given(st.data())
def test_every_zone_of_the_database_gives_the_same_occurrences(
    core_py: ModuleType, data: st.DataObject
) -> None:
    zones = data.draw(st.lists(st.sampled_from(loadable_zones()), min_size=1, max_size=3))
    cases = data.draw(st.lists(chain_cases(zones), min_size=10, max_size=20))
    python = [py_chain(*case) for case in cases]
    rust = [(list(found), message) for found, message in core_py.cron_next_chains(cases)]
    _compare("next_after", cases, python, rust)


def test_every_zone_of_the_database_over_the_whole_date_range(core_py: ModuleType) -> None:
    """Coarse but complete: every loadable zone, from year 1 (local mean time, before the first
    transition) through the tz data's years to the far future of its rule string."""
    years = [2, 1800, 1890, 1920, 1950, 1985, 2010, 2030, 2045, 2100, 2400, 5000, 9998]
    starts = [float(_year_start(year) + 191 * 86_400 + 7 * 3600) for year in years]
    cases = [
        (expr, name, t, 3)
        for name in loadable_zones()
        if not name.startswith("posix/")  # copies of the zones at the top level
        for t in starts
        for expr in ("0 0 * * * *", "0 30 2 * * *", "0 0 0 * 3 SUN")
    ]
    python = [py_chain(*case) for case in cases]
    rust = [(list(found), message) for found, message in core_py.cron_next_chains(cases)]
    _compare("next_after", cases, python, rust)
