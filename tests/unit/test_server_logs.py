"""The server's log formats (docs/server.md, "Logs"): `server.log_format` and CRONOQ_LOG_FORMAT
read and validated; the JSON formatter the server shares with the worker command
(cronoq._logs.JsonFormatter): members, events, fields that clash, tracebacks on one line; and
the logfmt lines, unchanged."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from cronoq._logs import JsonFormatter, setup_logging
from cronoq.server.cli import LogfmtFormatter, _formatter
from cronoq.server.config import ConfigError, load_config, log_format_of
from cronoq.server.logs import event

CREATED = 1_780_000_000.25  # 2026-05-28T20:26:40.250Z
TS = "2026-05-28T20:26:40.250Z"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]]]:
    """A logger of its own whose records go, formatted, to a string."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("cronoq.server.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, out, handler
    logger.removeHandler(handler)


def record(
    msg: str, *args: object, fields: dict[str, Any] | None = None, exc: bool = False
) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("line one\nline two")
        except ValueError:
            info = sys.exc_info()
    rec = logging.LogRecord("cronoq.server.app", logging.INFO, __file__, 1, msg, args, info)
    rec.created, rec.msecs = CREATED, 250.0
    if fields is not None:
        rec.fields = fields
    return rec


# --- the key and the variable -------------------------------------------------------------------


def test_the_default_is_logfmt() -> None:
    assert load_config(None, env={}).server.log_format == "logfmt"
    assert load_config("[server]\n", env={}).server.log_format == "logfmt"


def test_the_key_then_the_variable() -> None:
    assert load_config('[server]\nlog_format = "json"', env={}).server.log_format == "json"
    assert load_config(None, env={"CRONOQ_LOG_FORMAT": "json"}).server.log_format == "json"
    assert load_config(None, env={"CRONOQ_LOG_FORMAT": ""}).server.log_format == "logfmt"
    given = '[server]\nlog_format = "logfmt"'
    assert load_config(given, env={"CRONOQ_LOG_FORMAT": "json"}).server.log_format == "logfmt"
    # "text", the worker command's human format, is logfmt for the server
    assert load_config(None, env={"CRONOQ_LOG_FORMAT": "text"}).server.log_format == "logfmt"
    # the key wins even over a variable that would be refused
    assert load_config(given, env={"CRONOQ_LOG_FORMAT": "xml"}).server.log_format == "logfmt"


@pytest.mark.parametrize(
    ("text", "env", "error"),
    [
        (
            '[server]\nlog_format = "JSON"',
            {},
            'server.log_format: must be one of "logfmt", "json" (got "JSON")',
        ),
        ('[server]\nlog_format = ""', {}, "server.log_format: must not be empty"),
        ("[server]\nlog_format = true", {}, "server.log_format: must be a string (got a boolean)"),
        (
            None,
            {"CRONOQ_LOG_FORMAT": "yaml"},
            'server.log_format: CRONOQ_LOG_FORMAT must be one of "logfmt", "json" (got "yaml")',
        ),
    ],
    ids=["case", "empty", "type", "env"],
)
def test_other_values_are_refused(text: str | None, env: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(text, env=env)
    assert list(info.value.errors) == [error]


def test_the_format_asked_for_before_validation() -> None:
    assert log_format_of({}, env={}) == "logfmt"
    assert log_format_of({}, env={"CRONOQ_LOG_FORMAT": "json"}) == "json"
    assert log_format_of({"server": {"log_format": "json"}}, env={}) == "json"
    assert (
        log_format_of({"server": {"log_format": "logfmt"}}, env={"CRONOQ_LOG_FORMAT": "json"})
        == "logfmt"
    )
    # anything validation will refuse is logfmt, the default, until it has been refused
    assert (
        log_format_of({"server": {"log_format": 3}}, env={"CRONOQ_LOG_FORMAT": "json"}) == "logfmt"
    )
    assert log_format_of({"server": "x"}, env={"CRONOQ_LOG_FORMAT": "xml"}) == "logfmt"


# --- the JSON formatter -------------------------------------------------------------------------


def test_an_event_has_its_name_and_fields_as_members() -> None:
    line = JsonFormatter(events=True).format(
        record("listening", fields={"grpc": "127.0.0.1:7070", "tls": False, "n": 3, "x": None})
    )
    assert line == (
        '{"ts": "2026-05-28T20:26:40.250Z", "level": "info", "logger": "cronoq.server.app",'
        ' "event": "listening", "grpc": "127.0.0.1:7070", "tls": false, "n": 3, "x": null}'
    )


def test_a_plain_record_has_msg() -> None:
    for formatter in (JsonFormatter(events=True), JsonFormatter()):
        line = formatter.format(record("%d tasks in %s", 2, "p"))
        assert json.loads(line) == {
            "ts": TS,
            "level": "info",
            "logger": "cronoq.server.app",
            "msg": "2 tasks in p",
        }


def test_fields_never_replace_the_members_of_the_line() -> None:
    fields = {
        "ts": 1,
        "level": "x",
        "logger": "y",
        "event": "z",
        "msg": "m",
        "exc": "e",
        "field_level": "taken",
        "ok": 2,
    }
    got = json.loads(JsonFormatter(events=True).format(record("clash", fields=fields, exc=True)))
    assert (got["ts"], got["level"], got["logger"], got["event"]) == (
        TS,
        "info",
        "cronoq.server.app",
        "clash",
    )
    assert "msg" not in got and got["exc"].startswith("Traceback")
    assert (got["field_ts"], got["field_level"], got["field_logger"]) == (1, "x", "y")
    assert (got["field_event"], got["field_msg"], got["field_exc"]) == ("z", "m", "e")
    assert (got["field_field_level"], got["ok"]) == ("taken", 2)


def test_values_json_cannot_hold_become_text() -> None:
    error = OSError("cannot listen on 127.0.0.1:7070: address already in use")
    fields = {"error": error, "retry_in_s": float("inf"), "nan": float("nan"), "pools": ("a", "b")}
    line = JsonFormatter(events=True).format(record("failed", fields=fields))
    got = json.loads(line)  # strict JSON: no Infinity nor NaN
    assert got["error"] == str(error)
    assert (got["retry_in_s"], got["nan"], got["pools"]) == ("inf", "nan", ["a", "b"])
    assert "Infinity" not in line and "NaN" not in line


def test_a_traceback_stays_on_one_line(captured: Any) -> None:
    logger, out, handler = captured
    handler.setFormatter(_formatter("json"))
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        logger.exception("worker_stream_failed", extra={"fields": {"worker": 7}})
        logger.exception("plain failure")
    first, second = out.getvalue().splitlines()
    failed, plain = json.loads(first), json.loads(second)
    assert (failed["event"], failed["worker"], failed["level"]) == (
        "worker_stream_failed",
        7,
        "error",
    )
    assert plain["msg"] == "plain failure"
    for got in (failed, plain):
        assert got["exc"].startswith("Traceback (most recent call last):\n")
        assert got["exc"].endswith("RuntimeError: boom\nsecond line")
        assert list(got)[-1] == "exc"


def test_the_server_and_the_worker_command_write_the_same_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The worker command's JSON (setup_logging) and the server's, for the same records: only a
    record with fields differs, `msg` for the worker, `event` for the server."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("json", "info")
        (worker_handler,) = root.handlers
        worker = worker_handler.formatter
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    server = _formatter("json")
    assert isinstance(worker, JsonFormatter) and type(server) is type(worker)
    for rec in (record("stopped %s", "now"), record("failed", exc=True)):
        assert worker.format(rec) == server.format(rec)
    with_fields = record("registered", fields={"pool": "p", "slots": 2})
    w, s = json.loads(worker.format(with_fields)), json.loads(server.format(with_fields))
    assert w.pop("msg") == s.pop("event") == "registered"
    assert list(w.items()) == list(s.items())


# --- logfmt, as published -----------------------------------------------------------------------


def test_logfmt_stays_as_it_was(captured: Any) -> None:
    logger, out, handler = captured
    handler.setFormatter(_formatter("logfmt"))
    assert type(handler.formatter) is LogfmtFormatter
    assert LogfmtFormatter().format(
        record("listening", fields={"grpc": "127.0.0.1:7070", "tls": False, "note": "a b"})
    ) == (
        f"ts={TS} level=info logger=cronoq.server.app"
        ' event=listening grpc=127.0.0.1:7070 tls=false note="a b"'
    )
    assert (
        LogfmtFormatter().format(record("%d tasks", 2))
        == f'ts={TS} level=info logger=cronoq.server.app msg="2 tasks"'
    )
    event(logger, logging.INFO, "signal", signal="SIGTERM")
    assert re.fullmatch(
        r"ts=\S+Z level=info logger=cronoq\.server\.test_logs event=signal signal=SIGTERM\n",
        out.getvalue(),
    )
