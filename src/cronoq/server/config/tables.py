"""Reading one TOML table: typed getters that record every complaint and fall back to the
default, so validation reports all problems at once (docs/configuration.md)."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .settings import (
    YEAR,
)

if TYPE_CHECKING:
    pass


_T = TypeVar("_T")


class Absent:
    """A key that is missing or was rejected: the getter falls back to the default."""


ABSENT = Absent()


def toml_type(value: object) -> str:
    """The TOML name of a value's type, for 'must be X (got Y)'."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date or time"


def quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class Table:
    """One TOML table being read, with the path that names it in error messages.

    Each getter returns the key's value, or the default when the key is missing or wrong. A
    wrong value is recorded as `<path>.<key>: <rule>` and its key put in `bad`, so that later
    checks can leave it out instead of reporting consequences of the same mistake. `close`
    reports each key that no getter asked for: that is how unknown keys are rejected.
    """

    def __init__(self, errors: list[str], path: str, data: Mapping[str, Any]) -> None:
        self.errors = errors
        self.path = path
        self.data = data
        self.bad: set[str] = set()
        self._asked: set[str] = set()

    def path_of(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, rule: str) -> None:
        self.bad.add(key)
        self.errors.append(f"{self.path_of(key)}: {rule}")

    def error(self, rule: str) -> None:
        """A problem of the table as a whole (a missing pair of keys, a conflict)."""
        self.errors.append(f"{self.path}: {rule}")

    def has(self, key: str) -> bool:
        return key in self.data

    def require(self, *keys: str) -> None:
        for key in keys:
            if key not in self.data:
                self.fail(key, "is required")

    def close(self) -> None:
        for key in self.data:
            if key not in self._asked:
                self.errors.append(f"{self.path_of(key)}: unknown key{self._closest(key)}")

    def _closest(self, key: str) -> str:
        """`; did you mean "limits"?` for the known key of this table nearest to a misspelt
        one (the keys its getters asked for), or nothing when none is near."""
        near = difflib.get_close_matches(key, sorted(self._asked), n=1)
        return f"; did you mean {quote(near[0])}?" if near else ""

    def _raw(self, key: str, types: tuple[type, ...], what: str) -> Any:
        self._asked.add(key)
        if key not in self.data:
            return ABSENT
        value = self.data[key]
        # bool is an int subclass in Python, but TOML's true is no integer
        if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
            return value
        self.fail(key, f"must be {what} (got {toml_type(value)})")
        return ABSENT

    def string(self, key: str, default: _T, *, choices: Sequence[str] | None = None) -> str | _T:
        value = self._raw(key, (str,), "a string")
        if value is ABSENT:
            return default
        if not value:
            self.fail(key, "must not be empty")
            return default
        if choices is not None and value not in choices:
            listed = ", ".join(quote(c) for c in choices)
            self.fail(key, f"must be one of {listed} (got {quote(value)})")
            return default
        return str(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._raw(key, (bool,), "a boolean")
        return default if value is ABSENT else bool(value)

    def integer(
        self, key: str, default: _T, *, low: int | None = None, high: int | None = None
    ) -> int | _T:
        value = self._raw(key, (int,), "an integer")
        if value is ABSENT:
            return default
        if (low is not None and value < low) or (high is not None and value > high):
            rule = f"must be >= {low}" if high is None else f"must be from {low} to {high}"
            self.fail(key, f"{rule} (got {value})")
            return default
        return int(value)

    def number(self, key: str, default: _T) -> float | _T:
        value = self._raw(key, (int, float), "a number")
        if value is ABSENT:
            return default
        if not math.isfinite(value):
            self.fail(key, f"must be a finite number (got {value})")
            return default
        return float(value)

    def duration(
        self, key: str, default: _T, *, positive: bool = True, least: float | None = None
    ) -> float | _T:
        """Seconds: finite, at most one year, and > 0, or >= 0 where 0 has a meaning
        (`positive=False`), or at least `least` where a smaller value would misbehave."""
        value = self._raw(key, (int, float), "a number of seconds")
        if value is ABSENT:
            return default
        if least is not None:
            enough, low = value >= least, f">= {least:g}"
        else:
            enough, low = (value > 0, "> 0") if positive else (value >= 0, ">= 0")
        # NaN fails both comparisons, infinity the second
        if not (enough and value <= YEAR):
            self.fail(key, f"must be {low} and at most one year (got {value})")
            return default
        return float(value)

    def strings(self, key: str) -> tuple[str, ...] | None:
        value = self._raw(key, (list,), "an array of strings")
        if value is ABSENT:
            return None
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(f"{key}[{i}]", f"must be a string (got {toml_type(item)})")
            elif not item:
                self.fail(f"{key}[{i}]", "must not be empty")
        if any(k.startswith(f"{key}[") for k in self.bad):
            self.bad.add(key)
            return None
        return tuple(value)

    def table(self, key: str) -> Table:
        """The sub-table `key`; an empty one (all defaults) when it is missing or not a table."""
        return self.optional_table(key) or Table(self.errors, self.path_of(key), {})

    def optional_table(self, key: str) -> Table | None:
        """The sub-table `key`; None when it is missing or not a table."""
        value = self._raw(key, (dict,), "a table")
        return None if value is ABSENT else Table(self.errors, self.path_of(key), value)

    def tables(self, key: str) -> list[Table] | None:
        """The array of tables `key`, None when it is missing."""
        value = self._raw(key, (list,), "an array of tables")
        if value is ABSENT:
            return None if key not in self.data else []
        out = []
        for i, item in enumerate(value):
            path = f"{self.path_of(key)}[{i}]"
            if isinstance(item, dict):
                out.append(Table(self.errors, path, item))
            else:
                self.errors.append(f"{path}: must be a table (got {toml_type(item)})")
        return out


def library_rules(table: Table, build: Callable[..., object], args: dict[str, Any]) -> None:
    """Check values against the rules of the library type that `build` constructs.

    The library raises at its first complaint, phrased `<argument> must ...`, where every
    argument is named like its key. That argument is reported, dropped (the library default
    takes its place) and the rest checked again, until the library accepts what is left.
    Values that already failed the server's own checks are not passed at all.
    """
    args = {key: value for key, value in args.items() if key not in table.bad}
    while True:
        try:
            build(**args)
            return
        except (TypeError, ValueError, OverflowError) as exc:
            message = str(exc)
            subject, sep, rule = message.partition(" must ")
            key = subject.replace(" ", "_")  # "tenant weights must ..." names tenant_weights
            if not sep or key not in args:
                table.error(message)
                return
            table.fail(key, f"must {rule}")
            del args[key]
