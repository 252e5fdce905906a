"""Parameter types of the `cronoq` command line: durations, times, moments, task references,
pairs.

Each type turns bad input into a click usage error that names the option, so the command exits
2 with one line instead of sending something the server would refuse less clearly.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import grpc

__all__ = [
    "DURATION",
    "MOMENT",
    "PAIR",
    "PEM",
    "REF",
    "RESOURCE",
    "TIME",
    "credentials",
    "parse_duration",
    "parse_moment",
    "parse_ref",
    "parse_time",
    "tls_options",
]

# The end of the wire's times: Unix nanoseconds in a signed 64-bit integer.
_LAST = datetime.fromtimestamp((2**63 - 1) // 10**9, UTC)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)?")


def parse_duration(text: str) -> float:
    """Seconds in `text`: a plain number (`1.5`) or a number with one unit (`500ms`, `2h`).

    Negative, infinite and exponent forms are refused: every duration the server takes is a
    finite number of seconds, and a typo should not turn into a surprising one.
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"bad duration {text!r}: give seconds (1.5) or a number with a unit "
            "ms, s, m, h or d (500ms, 30s, 5m, 2h)"
        )
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parse_time(text: str) -> datetime:
    """An RFC 3339 time with its offset (`2030-01-02T09:00:00Z`); a zone is required because a
    time without one would silently mean this machine's local time."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"bad time {text!r}: use RFC 3339, e.g. 2030-01-02T09:00:00Z") from None
    if when.tzinfo is None:
        raise ValueError(f"bad time {text!r}: add a zone offset, e.g. Z or +02:00")
    if when >= _LAST:
        raise ValueError(f"bad time {text!r}: the protocol carries times before {_LAST:%Y-%m-%d}")
    return when


def parse_moment(text: str) -> datetime:
    """A filter's bound: an RFC 3339 time, or a duration back from now (`30m`: half an hour
    ago), which is what one usually means by `--since`."""
    try:
        ago = parse_duration(text)
    except ValueError:
        try:
            return parse_time(text)
        except ValueError:
            raise ValueError(
                f"bad time {text!r}: use RFC 3339 (2030-01-02T09:00:00Z) or a duration back "
                "from now (30m, 2h, 1d)"
            ) from None
    return datetime.now(UTC) - timedelta(seconds=ago)


def parse_ref(text: str) -> int | str:
    """A task reference: all digits is an id, anything else is a key."""
    if not text:
        raise ValueError("empty task reference: give an id or a key")
    return int(text) if text.isdigit() else text


if TYPE_CHECKING:  # generic in recent click, not subscriptable at run time in older
    _ParamType = click.ParamType[Any, Any]
else:
    _ParamType = click.ParamType


class _Converting(_ParamType):
    """A click type from a function that raises ValueError with a message for the user."""

    def __init__(self, name: str, parse: Any) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default given already converted
        try:
            return self._parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"bad pair {text!r}: use name=value")
    return name, value


def _resource(text: str) -> tuple[str, int]:
    name, amount = _pair(text)
    if not amount.isdigit() or int(amount) < 1:
        raise ValueError(f"bad resource {text!r}: use name=amount with a whole amount >= 1")
    return name, int(amount)


DURATION = _Converting("duration", parse_duration)
TIME = _Converting("time", parse_time)
MOMENT = _Converting("time|duration", parse_moment)
REF = _Converting("ref", parse_ref)
PAIR = _Converting("name=value", _pair)
RESOURCE = _Converting("name=amount", _resource)


PEM = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)
_F = TypeVar("_F", bound=Callable[..., Any])


def tls_options(f: _F) -> _F:
    """--ca, --cert and --key (mutual TLS), for the global options and `cronoq worker`."""
    f = click.option("--key", "key_file", type=PEM, help="PEM private key of --cert.")(f)
    f = click.option("--cert", type=PEM, help="PEM client certificate (mutual TLS; needs --key).")(
        f
    )
    return click.option(
        "--ca", type=PEM, help="PEM file of the CA that signed the server's certificate."
    )(f)


def credentials(
    ca: Path | None, cert: Path | None, key_file: Path | None
) -> grpc.ChannelCredentials | None:
    """The channel credentials --ca, --cert and --key give (None without any)."""
    if (cert is None) != (key_file is None):
        raise click.UsageError("--cert and --key go together (mutual TLS)")
    if not (ca or cert):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=None if ca is None else ca.read_bytes(),
        private_key=None if key_file is None else key_file.read_bytes(),
        certificate_chain=None if cert is None else cert.read_bytes(),
    )
