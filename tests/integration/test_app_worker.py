"""Server mode of `cronoq.App`, with real processes: a cronoq-server, `cronoq worker
MODULE:APP` commands serving the applications of app_samples/, and the test submitting through
`app.connect` (or a raw `cronoq.client.Client`).

Covered: results of async and plain task functions on two pools, a batch with an in-batch
dependency, a failing function (TaskFailed), payloads that do not fit the parameters; the
command's signals (drain within the grace, a second signal), its JSON log lines, its exit codes
(3 for a refusal reconnecting cannot fix, 2 for a bad MODULE:APP); and kinds a worker does not
know (handed back to another worker of the pool, or failed naming the kind).

Every wait is on a condition (a log line, a task's end, a process's exit); the timeouts are
safety nets against a hang on a slow, shared machine, never a measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

import cronoq
from cronoq.client import Client
from helpers import auth
from helpers.servers import PORT0, LoggedProcess, Serving, serving_process

APPS = Path(__file__).resolve().parent / "app_samples"
COMMAND = [sys.executable, "-m", "cronoq.cli", "worker"]
CLIENT = auth.token("client")
WORKER = auth.token("worker")
RETRY3 = "retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }"
CONFIG = (
    PORT0
    + f'[[pools]]\nname = "default"\n{RETRY3}\n'
    + '[[pools]]\nname = "other"\n'
    + f'[[pools]]\nname = "slow"\n{RETRY3}\n'
    + '[[pools]]\nname = "shared"\n'
    + '[[pools]]\nname = "solo"\nretry = { max_attempts = 1 }\n'
    + "".join(
        f'[[auth.tokens]]\ntoken = "{auth.token(who)}"\n{auth.TOKENS[who]}\n'
        for who in ("client", "worker", "admin")
    )
)
SAFETY = 60.0  # seconds: only a hung process or task gets near it
# After a second SIGTERM the command should end at once (well under a second); this bounds
# the wait for that, generously, without costing a whole SAFETY when it does not.
AT_ONCE = 15.0

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a test's async part under the safety timeout (the directory's 10 s limit for
    `async def` tests is too short for processes on a busy machine)."""
    return asyncio.run(asyncio.wait_for(coro, 3 * SAFETY))


def _load(name: str) -> ModuleType:
    """An app module of app_samples/, imported here too, to submit with its functions."""
    spec = importlib.util.spec_from_file_location(f"app_samples_{name}", APPS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


served = _load("served")
slow = _load("slow")
knows_x = _load("knows_x")
knows_y = _load("knows_y")


def environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}


class WorkerCommand(LoggedProcess):
    """`cronoq worker APP_PATH` as a process in app_samples/, its stderr lines read by a thread
    as they come."""

    def __init__(self, target: str, app_path: str, *args: str, token: str = WORKER) -> None:
        argv = [*COMMAND, app_path, "--target", target, "--token", token, *args]
        super().__init__(argv, cwd=APPS, env=environ())

    async def line(self, pattern: str) -> re.Match[str]:
        """`wait_for` from async code, without blocking the event loop."""
        return await asyncio.to_thread(self.wait_for, pattern, SAFETY)

    def registered(self, *pools: str) -> None:
        """Wait until the command logged each pool's registration (in any order)."""
        waiting = set(pools)
        while waiting:
            waiting.discard(self.wait_for(r"registered with \S+: pool (\w+), ", SAFETY).group(1))

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        return self.terminate(SAFETY)


@contextlib.contextmanager
def worker_command(target: str, app_path: str, *args: str, **kw: str) -> Iterator[WorkerCommand]:
    w = WorkerCommand(target, app_path, *args, **kw)
    try:
        yield w
    finally:
        w.kill()


def ended(target: str, app_path: str, *args: str, token: str = WORKER) -> tuple[int, list[str]]:
    """Run `cronoq worker` to its end: its exit code and stderr lines (stdout must be empty)."""
    argv = [*COMMAND, app_path, "--target", target, "--token", token, *args]
    done = subprocess.run(
        argv, cwd=APPS, env=environ(), capture_output=True, text=True, timeout=SAFETY
    )
    assert done.stdout == "", done.stdout
    return done.returncode, done.stderr.splitlines()


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    with serving_process(tmp_path_factory.mktemp("app-worker"), CONFIG) as s:
        yield s


@pytest.fixture(scope="module")
def target(server: Serving) -> str:
    return f"http://{server.address}"


@pytest.fixture(scope="module")
def serving(target: str) -> Iterator[WorkerCommand]:
    """`cronoq worker served:app` with JSON log lines, serving pools default and other (2
    slots for other, by --slots POOL=N), for the whole module. Stopped at the end: by SIGTERM,
    exiting 0 after draining, its every line JSON."""
    with worker_command(target, "served:app", "--log-format", "json", "--slots", "other=2") as w:
        w.registered("default", "other")
        yield w
        code = w.stop()
        records = [json.loads(line) for line in w.lines]
        assert code == 0, w.lines
        assert [r["msg"] for r in records[-2:]] == ["SIGTERM: draining for up to 10.0 s", "stopped"]


# --- submitting through app.connect -------------------------------------------------------------


def test_async_and_sync_functions_on_two_pools(target: str, serving: WorkerCommand) -> None:
    async def body() -> None:
        async with served.app.connect(target, token=CLIENT) as client:
            h = await served.add.submit(2, 3)
            assert (h.kind, h.duplicate) == ("add", False)
            assert await h.result(timeout=SAFETY) == 5
            assert await (await served.add.submit(b=-1, a=1)).result(timeout=SAFETY) == 0
            # the attempt's context, in an async function of the default pool
            where = await (await served.where.submit()).result(timeout=SAFETY)
            assert where == {"pool": "default", "kind": "where", "attempt": 1}
            # a plain function of pool other: run in a thread, with the context too
            shouted = await (await served.shout.submit("hi")).result(timeout=SAFETY)
            assert shouted == {"text": "HI", "pool": "other", "main_thread": False}
            # options of one call reach the server; a key submitted again is a duplicate
            keyed = served.add.options(key="add-once", priority="high")
            first = await keyed.submit(20, 22)
            again = await keyed.submit(20, 22)
            assert (again.id, again.duplicate) == (first.id, True)
            assert await again.result(timeout=SAFETY) == 42
            info = await client.get(first.id)
            assert (info.pool, info.kind, info.key, info.priority) == (
                "default",
                "add",
                "add-once",
                "high",
            )

    run(body())


def test_batch_with_an_in_batch_dependency(target: str, serving: WorkerCommand) -> None:
    async def body() -> None:
        async with served.app.connect(target, token=CLIENT) as client:
            a = served.add.call(1, 2)
            b = served.where.options(after=a).call()
            ha, hb = await served.app.submit_batch([a, b])
            assert await hb.result(timeout=SAFETY) == {
                "pool": "default",
                "kind": "where",
                "attempt": 1,
            }
            assert await ha.result(timeout=SAFETY) == 3
            ia, ib = await client.get(ha.id), await client.get(hb.id)
            assert ia.key.startswith("add:")  # the key b depends on, generated for a
            assert ib.started_at is not None and ia.finished_at is not None
            assert ib.started_at >= ia.finished_at  # b waited for a
            # a dependency that fails: the call depending on it never runs
            e = served.explode_now.call("first")
            d = served.add.options(after=e).call(1, 1)
            he, hd = await served.app.submit_batch([e, d])
            with pytest.raises(cronoq.TaskFailed) as failed:
                await hd.result(timeout=SAFETY)
            assert (failed.value.status, failed.value.task_id) == ("skipped", hd.id)
            assert failed.value.message == f"dependency {he.id} ended as dead_lettered"
            assert (await client.get(hd.id)).attempt == 0

    run(body())


def test_a_failing_function_raises_task_failed(target: str, serving: WorkerCommand) -> None:
    async def body() -> None:
        async with served.app.connect(target, token=CLIENT) as client:
            h = await served.explode_now.submit("no luck")
            assert h.kind == "explode"
            with pytest.raises(cronoq.TaskFailed) as failed:
                await h.result(timeout=SAFETY)
            assert failed.value.message == "RuntimeError: boom: no luck"
            assert (failed.value.status, failed.value.task_id) == ("dead_lettered", h.id)
            info = await client.get(h.id)  # retried by the pool's policy: 3 attempts
            assert (info.attempt, info.max_attempts, info.kind) == (3, 3, "explode")

    run(body())


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"a": 1, "b": "two"}, """parameter 'b' of add: expected an integer, got "two\""""),
        ({"a": 1}, "missing parameter 'b' of add"),
        ({"a": 1, "b": 2, "c": 3}, "add has no parameter 'c'"),
        (
            [1, 2],
            "the arguments of add must be a JSON object with one member per parameter, got [1, 2]",
        ),
    ],
    ids=["wrong-type", "missing", "unknown", "not-an-object"],
)
def test_a_payload_that_does_not_fit_fails_for_good(
    target: str, serving: WorkerCommand, payload: Any, message: str
) -> None:
    async def body() -> None:
        async with Client(target, token=CLIENT) as client:
            sent = await client.submit(payload, pool="default", kind="add")
            result = await client.wait(sent.id, timeout=SAFETY)
            assert (result.status, result.message) == ("failed", message)
            info = await client.get(sent.id)
            assert (info.attempt, info.max_attempts) == (1, 3)  # permanent: not retried

    run(body())


def test_a_payload_sent_as_text_is_read_as_json(target: str, serving: WorkerCommand) -> None:
    """What `cronoq submit` sends for a payload given as text (text/plain) reaches the
    function as a JSON object would; text that is no JSON fails for good, saying so."""

    async def body() -> None:
        async with Client(target, token=CLIENT) as client:
            sent = await client.submit('{"a": 40, "b": 2}', kind="add")
            result = await client.wait(sent.id, timeout=SAFETY)
            assert (result.status, result.json()) == ("succeeded", 42)
            sent = await client.submit("not json", kind="add")
            result = await client.wait(sent.id, timeout=SAFETY)
            assert result.status == "failed"
            assert result.message.startswith("the arguments of add do not decode: ")

    run(body())


def test_run_submits_to_the_apps_target_from_synchronous_code(
    target: str, serving: WorkerCommand
) -> None:
    """`task.run()` on an `App(target=..., token=...)`: one call from code without an event
    loop, served by the worker command (this app only declares `add`, with serve=False)."""
    app = cronoq.App("caller", target=target, token=CLIENT)

    @app.task(serve=False)
    def add(a: int, b: int) -> int:
        raise AssertionError("runs in the worker command, not here")

    assert add.run(19, 23) == 42
    with pytest.raises(cronoq.TaskFailed, match="parameter 'b' of add"):
        app.task(kind="add2", serve=False)  # a second declaration is fine
        add.options(key="typed-wrong").run(1, "x")  # type: ignore[arg-type]


def test_log_lines_are_json(target: str, serving: WorkerCommand) -> None:
    async def body() -> None:
        async with served.app.connect(target, token=CLIENT):
            await (await served.shout.submit("json")).result(timeout=SAFETY)
        await serving.line("shouting json")

    run(body())
    records = [json.loads(line) for line in serving.seen()]  # every line is one object
    registered = {r["pool"]: r for r in records if r["msg"].startswith("registered with ")}
    assert registered.keys() == {"default", "other"}
    assert registered["default"]["kinds"] == ["add", "where", "explode"]
    assert registered["other"]["kinds"] == ["shout"]
    assert (registered["default"]["slots"], registered["other"]["slots"]) == (10, 2)
    assert all(isinstance(r["worker_id"], int) for r in registered.values())
    assert {(r["level"], r["logger"]) for r in registered.values()} == {("info", "cronoq.worker")}
    # a task function's own logging goes through the same format
    shout = [r for r in records if r["msg"] == "shouting json"]
    assert [(r["level"], r["logger"]) for r in shout] == [("info", "served")]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["ts"]) for r in records)


# --- signals ------------------------------------------------------------------------------------


async def _cancel(client: Client, *ids: int) -> None:
    """Leave pool slow empty for the next test (a task still there would be its worker's)."""
    for task_id in ids:
        with contextlib.suppress(Exception):
            await client.cancel(task_id)


def test_sigterm_lets_the_running_task_finish(target: str, tmp_path: Path) -> None:
    release = tmp_path / "release"
    never = tmp_path / "never"

    async def body(w: WorkerCommand) -> None:
        async with slow.app.connect(target, token=CLIENT) as client:
            h = await slow.hold.submit(str(release))
            submitted = [h.id]
            try:
                await w.line(rf"holding {re.escape(str(release))} attempt 1$")
                w.signal(signal.SIGTERM)
                await w.line(r"SIGTERM: draining for up to 60\.0 s$")
                # draining: a task submitted now is not run by this worker
                later = await slow.hold.submit(str(never))
                submitted.append(later.id)
                release.touch()
                assert await h.result(timeout=SAFETY) == 1  # finished within the grace
                assert await asyncio.to_thread(w.wait) == 0
                assert (await client.get(h.id)).status == "succeeded"
                assert await client.cancel(later.id)  # it had not ended: never run
            finally:
                await _cancel(client, *submitted)

    with worker_command(target, "slow:app", "--grace", "60s") as w:
        w.registered("slow")
        run(body(w))
    assert w.lines[-1].endswith(" INFO cronoq.worker: stopped"), w.lines
    assert not [line for line in w.lines if "again" in line or str(never) in line], w.lines
    assert any(f"released {release} attempt 1" in line for line in w.lines), w.lines


def test_at_the_end_of_the_grace_the_task_is_abandoned_and_retried(
    target: str, tmp_path: Path
) -> None:
    release = tmp_path / "release"

    async def body() -> None:
        async with slow.app.connect(target, token=CLIENT) as client:
            h = await slow.hold.submit(str(release))
            try:
                with worker_command(target, "slow:app", "--grace", "200ms") as first:
                    first.registered("slow")
                    await first.line(rf"holding {re.escape(str(release))} attempt 1$")
                    first.signal(signal.SIGTERM)
                    await first.line(r"SIGTERM: draining for up to 0\.2 s$")
                    assert await asyncio.to_thread(first.wait) == 0  # the grace is over
                assert first.lines[-1].endswith(" INFO cronoq.worker: stopped"), first.lines
                assert not [line for line in first.lines if "released" in line], first.lines
                info = await client.get(h.id)
                assert not info.done, info
                # the server runs the abandoned task again, on the next worker of the pool
                release.touch()
                with worker_command(target, "slow:app") as second:
                    assert await h.result(timeout=SAFETY) == 2
                    assert await asyncio.to_thread(second.stop) == 0
                assert any(f"released {release} attempt 2" in x for x in second.lines)
            finally:
                await _cancel(client, h.id)

    run(body())


def test_a_second_sigterm_stops_at_once(target: str, tmp_path: Path) -> None:
    release = tmp_path / "release"

    async def body() -> None:
        async with slow.app.connect(target, token=CLIENT) as client:
            h = await slow.hold.submit(str(release))
            try:
                with worker_command(target, "slow:app", "--grace", "1h") as first:
                    first.registered("slow")
                    await first.line(rf"holding {re.escape(str(release))} attempt 1$")
                    first.signal(signal.SIGTERM)
                    await first.line(r"SIGTERM: draining for up to 3600\.0 s$")
                    first.signal(signal.SIGTERM)
                    await first.line(r"SIGTERM again: stopping now$")
                    # the running task is abandoned at once, not after the hour of grace
                    assert await asyncio.to_thread(first.wait, AT_ONCE) == 0
                assert first.lines[-1].endswith(" INFO cronoq.worker: stopped"), first.lines
                assert not [line for line in first.lines if "released" in line], first.lines
                release.touch()
                with worker_command(target, "slow:app") as second:
                    assert await h.result(timeout=SAFETY) == 2  # the server retried it
                    assert await asyncio.to_thread(second.stop) == 0
            finally:
                await _cancel(client, h.id)

    run(body())


# --- exit codes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("app_path", "token", "line"),
    [
        ("served:app", "x", r"unauthenticated: .+"),
        ("served:app", CLIENT, r"permission_denied: .+"),
        ("unserved:app", WORKER, r"not_found: unknown pool 'nowhere'"),
    ],
    ids=["wrong-token", "client-token", "unknown-pool"],
)
def test_a_refusal_for_good_exits_3_with_one_line(
    target: str, app_path: str, token: str, line: str
) -> None:
    code, lines = ended(target, app_path, token=token)
    assert (code, len(lines)) == (3, 1), lines
    assert re.fullmatch(f"cronoq: error: {line}", lines[0]), lines


@pytest.mark.parametrize(
    ("app_path", "line"),
    [
        (
            "no_such_module:app",
            "cannot import 'no_such_module': ModuleNotFoundError: No module named 'no_such_module'",
        ),
        ("served:nothing", "served:nothing is nothing, not a cronoq.App"),
        ("served:add", "served:add is an AsyncTaskFunction, not a cronoq.App"),
        (
            "duplicate:app",
            "cannot import 'duplicate': ValueError: task kind 'same' is already declared by first",
        ),
        ("two_apps", "module 'two_apps' holds 2 cronoq.App objects: name one as MODULE:APP"),
    ],
    ids=["no-module", "no-attribute", "not-an-app", "raises-at-import", "two-apps"],
)
def test_a_bad_app_path_exits_2_with_one_line(target: str, app_path: str, line: str) -> None:
    code, lines = ended(target, app_path)
    assert (code, lines) == (2, [f"cronoq: error: {line} (see 'cronoq worker --help')"])


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--pool", "nowhere"],
            "app 'served' declares no pool 'nowhere' (it has default, other)",
        ),
        (["--slots", "0"], "bad --slots '0': use N or POOL=N with N >= 1"),
        (
            ["--slots", "nowhere=2"],
            "--slots 'nowhere=2' names a pool this worker does not serve",
        ),
    ],
    ids=["undeclared-pool", "zero-slots", "slots-of-another-pool"],
)
def test_bad_worker_options_exit_2_with_one_line(target: str, args: list[str], line: str) -> None:
    code, lines = ended(target, "served:app", *args)
    assert (code, lines) == (2, [f"cronoq: error: {line} (see 'cronoq worker --help')"])


# --- kinds a worker does not know ---------------------------------------------------------------


def test_a_kind_a_worker_does_not_know(target: str) -> None:
    """Two workers of pool shared: the one with the most free slots, which the server leases
    to first, does not know kind y and hands it back; the other runs it, in the same attempt.
    Pool solo has only the one that does not know kind z: such a task fails, naming it."""

    async def body() -> None:
        async with knows_y.app.connect(target, token=CLIENT):
            assert await (await knows_y.y.submit(7)).result(timeout=SAFETY) == {
                "n": 7,
                "attempt": 1,
            }
        async with knows_x.app.connect(target, token=CLIENT) as client:
            assert await (await knows_x.x.submit()).result(timeout=SAFETY) == "x"
            sent = await client.submit({}, pool="solo", kind="z")
            result = await client.wait(sent.id, timeout=SAFETY)
            assert result.message == (
                "handed back by its worker and no other worker could take it:"
                " no worker here has a task function for kind 'z'"
            )
            assert result.status == "dead_lettered", result  # retryable, out of attempts
            assert (await client.get(sent.id)).attempt == 1

    with (
        worker_command(target, "knows_x:app", "--slots", "4") as wx,
        worker_command(target, "knows_y:app", "--slots", "1") as wy,
    ):
        wx.registered("shared", "solo")
        wy.registered("shared")
        run(body())
        assert (wx.stop(), wy.stop()) == (0, 0)
