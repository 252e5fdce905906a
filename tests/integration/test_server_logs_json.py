"""`cronoq-server` with JSON log lines (docs/server.md, "Logs"): `server.log_format = "json"`
or CRONOQ_LOG_FORMAT=json, as a real process. Every line one JSON object with `ts`, `level`,
`logger` and `event` or `msg`, the events' fields as members; `--check` refuses other values;
without the key or the variable the lines stay logfmt."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2, cronoq_pb2_grpc
from helpers.servers import COMMAND, PORT0, LoggedProcess, Server, server_command, write

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LEVELS = {"debug", "info", "warning", "error"}
LOGFMT_LINE = re.compile(r"ts=\S+ level=(debug|info|warning|error) logger=\S+ (event|msg)=\S")
VALID = "configuration is valid\n"
ENV = "CRONOQ_LOG_FORMAT"
SHORT_TOKEN = "sixteen-chars-ok"  # long enough to serve, short enough to be warned about


def records(lines: list[str]) -> list[dict[str, Any]]:
    """Each line as its JSON object, checked for the members every record has."""
    out = []
    for line in lines:
        record = json.loads(line)  # one object per line: a record never spans lines
        assert isinstance(record, dict), line
        assert TS.fullmatch(record["ts"]) and record["level"] in LEVELS, line
        assert isinstance(record["logger"], str) and record["logger"], line  # asyncio's too
        assert ("event" in record) != ("msg" in record), line  # exactly one of the two
        out.append(record)
    return out


def events(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in recs if "event" in r]


def serve_and_stop(s: Server) -> list[dict[str, Any]]:
    """Wait until `s` is ready, call it once, SIGTERM it: its every line, parsed."""
    s.wait_for(r'"event": "ready"')
    with grpc.insecure_channel(s.address) as ch:
        grpc.channel_ready_future(ch).result(timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            cronoq_pb2_grpc.TasksStub(ch).Get(cronoq_pb2.GetRequest(), timeout=10)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # served
    assert s.terminate() == 0, s.lines
    return records(s.lines)


def check_startup_and_shutdown(recs: list[dict[str, Any]], address: str) -> None:
    named = events(recs)
    grpc_line, http_line = [r for r in named if r["event"] == "listening"][:2]
    assert grpc_line["grpc"] == address and grpc_line["tls"] is False
    assert grpc_line["transport"] in ("native", "grpcio")
    assert (grpc_line["level"], grpc_line["logger"]) == ("info", "cronoq.server.app")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", http_line["http"]) and http_line["tls"] is False
    (ready,) = [r for r in named if r["event"] == "ready"]
    assert set(ready) == {"ts", "level", "logger", "event"}  # an event without fields
    assert [r["event"] for r in named[-3:]] == ["signal", "stopping", "stopped"]
    assert named[-3]["signal"] == "SIGTERM" and named[-2]["grace_s"] == 0.5


def test_json_lines_from_the_config_file(tmp_path: Path, servers: list[Server]) -> None:
    s = Server(write(tmp_path, PORT0 + 'log_format = "json"\nlog_level = "debug"\n'))
    servers.append(s)
    check_startup_and_shutdown(serve_and_stop(s), s.address)


def test_json_lines_from_the_environment(tmp_path: Path, servers: list[Server]) -> None:
    s = Server(write(tmp_path, PORT0), env={ENV: "json"})
    servers.append(s)
    check_startup_and_shutdown(serve_and_stop(s), s.address)


def test_the_key_wins_over_the_variable(tmp_path: Path, servers: list[Server]) -> None:
    s = Server(write(tmp_path, PORT0 + 'log_format = "logfmt"\n'), env={ENV: "json"})
    servers.append(s)
    s.wait_for("event=ready")
    assert s.terminate() == 0
    assert s.lines and all(LOGFMT_LINE.match(line) for line in s.lines), s.lines


def test_without_either_the_lines_stay_logfmt(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k != ENV}
    s = LoggedProcess([*COMMAND, "-c", write(tmp_path, PORT0)], env=environ)
    try:
        s.wait_for(
            r"^ts=\S+ level=info logger=cronoq\.server\.app event=listening grpc=\S+ tls=false"
        )
        s.wait_for(r"^ts=\S+ level=info logger=cronoq\.server\.app event=ready$")
        assert s.terminate() == 0
    finally:
        s.kill()
    assert all(LOGFMT_LINE.match(line) for line in s.lines), s.lines


def test_warnings_while_validating_are_json_too(tmp_path: Path, servers: list[Server]) -> None:
    config = (
        PORT0 + f'log_format = "json"\n[[auth.tokens]]\ntoken = "{SHORT_TOKEN}"\nrole = "client"\n'
    )
    s = Server(write(tmp_path, config))
    servers.append(s)
    s.wait_for(r'"event": "ready"')
    assert s.terminate() == 0
    recs = records(s.lines)
    warning = recs[0]  # before the listeners
    assert warning["level"] == "warning" and warning["logger"].startswith("cronoq.server.config")
    assert warning["msg"].startswith("auth.tokens[0].token: a token shorter than 32")
    assert SHORT_TOKEN not in "\n".join(s.lines)


def test_a_failed_start_logs_json_then_the_error_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = f'[server]\ngrpc_addr = "127.0.0.1:{port}"\n'
        r = server_command("-c", write(tmp_path, config), env={ENV: "json"})
    assert r.returncode == 1
    *logged, last = r.stderr.splitlines()
    (failed,) = [rec for rec in records(logged) if rec.get("event") == "failed"]
    assert failed["level"] == "error"
    assert failed["error"] == f"cannot listen on 127.0.0.1:{port}: address already in use"
    assert last == f"Error: cannot listen on 127.0.0.1:{port}: address already in use"


@pytest.mark.parametrize(
    ("config", "env", "error"),
    [
        (
            '[server]\nlog_format = "text"\n',
            {},
            'Error: server.log_format: must be one of "logfmt", "json" (got "text")',
        ),
        (
            "[server]\nlog_format = 1\n",
            {},
            "Error: server.log_format: must be a string (got an integer)",
        ),
        (
            "",
            {ENV: "JSON"},
            'Error: server.log_format: CRONOQ_LOG_FORMAT must be one of "logfmt", "json"'
            ' (got "JSON")',
        ),
    ],
    ids=["file", "type", "env"],
)
def test_check_refuses_another_value(
    tmp_path: Path, config: str, env: dict[str, str], error: str
) -> None:
    path = write(tmp_path, config)
    checked = server_command("--check", "-c", path, env=env)
    assert (checked.returncode, checked.stdout, checked.stderr) == (1, "", error + "\n")
    served = server_command("-c", path, env=env)  # nor does the server start: nothing is logged
    assert (served.returncode, served.stderr) == (1, error + "\n")


def test_check_accepts_both_values(tmp_path: Path) -> None:
    for value in ("logfmt", "json"):
        r = server_command("--check", "-c", write(tmp_path, f'[server]\nlog_format = "{value}"\n'))
        assert (r.returncode, r.stdout, r.stderr) == (0, VALID, "")
        r = server_command("--check", env={ENV: value})
        assert (r.returncode, r.stdout, r.stderr) == (0, VALID, "")
