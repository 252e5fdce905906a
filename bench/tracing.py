"""Tracing overhead of cronoq (docs/observability.md, "Traces"), in one run: the server with its
spans off and on, the library's Scheduler with and without an OpenTelemetry SDK, and (with
--base) the server of another revision with tracing off.

Machines here are noisy, so every figure is a ratio to a baseline measured in the same run, and
the throughput figures are the best of interleaved runs (off, on, off, on, ...). The server
workload is bench/server.py's [b] (its functions, not a copy): `python -m cronoq.server.cli`
(one pool of 256, memory store, the native transport when built, else grpcio) with the Go raw
worker of bench/workers/go (256 slots, a Complete for each Lease at once); N no-op tasks by
Tasks.SubmitBatch in batches of limits.max_tasks_per_batch from 4 concurrent callers, timed until
all have succeeded. Spans go to a sink started by this script (this file run with the hidden
`--role sink`, a process of its own): an OTLP/HTTP endpoint that answers every
`POST /v1/traces` 200 at once and keeps the bodies; it decodes them (opentelemetry-proto) only
when asked for its count, after a timed run, so that the collector's work does not share the
measured window.

Phases
------
[t0] (with --base REV) the server of REV (a temporary git worktree, its `src/` first on the
     server's PYTHONPATH; this tree's built cronoq._native copied in, whose only change since
     tracing is the OTLP encoder) against this tree's, both with tracing off, on the same
     transport, interleaved: tasks/s of each and this tree's ratio to REV's (target: no
     measurable slowdown, i.e. within the runs' spread).
[t1] the server with tracing off (no OTEL_* variables) and with tracing on
     (OTEL_EXPORTER_OTLP_ENDPOINT = the sink, OTEL_TRACES_SAMPLER=always_on: every task sampled,
     the exporter's defaults otherwise), two servers up side by side, interleaved: tasks/s,
     on/off ratio (target >= 0.7x), the server's CPU per task (/proc, every thread: the
     exporter's thread and the native encoder included), and the spans of each tracing-on run:
     expected (cronoq.queue_wait, cronoq.dispatch and cronoq.attempt per task, cronoq.submit per
     SubmitBatch call), received by the sink within a few seconds of the run's end, and the
     difference (dropped or not exported; the exporter must drop none).
[t2] library mode: sequential `await sched.submit(i)` of N tasks then every handle awaited
     (bench/library.py's [2a] loop: one pool of 64 slots, a no-op executor) with
     `Scheduler(tracing=None)` (no SDK configured: off) and with `tracing=` an opentelemetry-sdk
     TracerProvider whose BatchSpanProcessor (max_queue_size raised so that no span is dropped)
     exports with opentelemetry-exporter-otlp-proto-http to the sink, interleaved: tasks/s and
     the on/off ratio (no target: the cost of the user's SDK), and the spans the sink received.

Usage: python bench/tracing.py [--n N] [--lib-n N] [--reps R] [--base REV] [--quick]

--quick uses small sizes and one run of each (a smoke run). The exit status is 0 whether the
target is met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import library as L
import server as S
from _common import print_about, print_cpus, verdict
from cronoq.server.config import native_built

ROOT = Path(__file__).resolve().parent.parent
TARGET_ON_OFF = 0.7  # [t1]: tracing on / off
SPANS_PER_TASK = 3  # cronoq.queue_wait, cronoq.dispatch, cronoq.attempt
SINK_WAIT_S = 5.0  # after a run, how long the sink may take to receive the last spans


@dataclass
class Sizes:
    n: int  # tasks per server run
    lib_n: int  # tasks per library run
    reps: int


FULL = Sizes(n=20_000, lib_n=10_000, reps=5)
QUICK = Sizes(n=2_000, lib_n=1_000, reps=1)


# --- the sink: this file run with --role sink -------------------------------------------------


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the exporters' connections expect
    bodies: ClassVar[list[bytes]] = []
    spans = 0
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            self.bodies.append(body)
        self._answer(b"", "application/x-protobuf")  # an empty ExportTraceServiceResponse

    def do_GET(self) -> None:
        """The count of spans received so far (the bodies kept are decoded now)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        with self.lock:
            bodies, self.bodies[:] = self.bodies[:], []
            for body in bodies:
                req = ExportTraceServiceRequest.FromString(body)
                _Sink.spans += sum(len(s.spans) for r in req.resource_spans for s in r.scope_spans)
            count = _Sink.spans
        self._answer(str(count).encode(), "text/plain")


def sink_main() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    print(f"port={httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


class Sink:
    """The sink process, its traces URL and its count of spans received."""

    def __init__(self) -> None:
        self.proc = S.Proc([sys.executable, os.path.abspath(__file__), "--role", "sink"], "sink")
        port = self.proc.expect(r"^port=(\d+)").group(1)
        self.base = f"http://127.0.0.1:{port}"
        self.traces_url = self.base + "/v1/traces"

    def count(self) -> int:
        with urllib.request.urlopen(self.base + "/count", timeout=30) as r:
            return int(r.read())

    def until(self, goal: int, timeout: float = SINK_WAIT_S) -> int:
        """The count once it reaches `goal`, or when `timeout` has passed."""
        deadline = time.monotonic() + timeout
        while (got := self.count()) < goal and time.monotonic() < deadline:
            time.sleep(0.1)
        return got


@contextlib.contextmanager
def environ(**changes: str | None) -> Iterator[None]:
    """os.environ with `changes` (None: unset) for what is started inside (the server inherits
    it), restored after."""
    old = {k: os.environ.get(k) for k in changes}

    def put(values: dict[str, str | None]) -> None:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    put(changes)
    try:
        yield
    finally:
        put(old)


# Every OTEL_* variable that would turn the server's tracing on or change it: unset for "off".
_OTEL_OFF: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OTEL_")}


def _on(sink: Sink) -> dict[str, str | None]:
    return {
        **_OTEL_OFF,
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.base,
        "OTEL_TRACES_SAMPLER": "always_on",
    }


# --- [t2] library mode ---------------------------------------------------------------------------


async def phase_library(n: int, tracing: object) -> float:
    """Tasks/s of bench/library.py's [2a] loop on a Scheduler with `tracing`."""
    return n / await L.phase_sequential(n, tracing=tracing)


def sdk_provider(sink: Sink) -> tuple[object, object]:
    """An opentelemetry-sdk TracerProvider exporting to the sink, and its span processor."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "cronoq-bench"}))
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=sink.traces_url), max_queue_size=1 << 20
    )
    provider.add_span_processor(processor)
    return provider, processor


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Traced:
    run: S.ServerRun
    expected: int
    received: int


@dataclass
class Results:
    transport: str
    base: dict[str, list[S.ServerRun]]  # [t0]: "base", "this"
    off: list[S.ServerRun]  # [t1]
    on: list[Traced]
    lib_off: list[float]  # [t2]
    lib_on: list[float]
    lib_spans: list[int]  # [t2]: spans received per tracing-on run


def _expected(n: int) -> int:
    return SPANS_PER_TASK * n + -(-n // S.BATCH)


@contextlib.contextmanager
def base_tree(rev: str) -> Iterator[Path]:
    """A temporary worktree of `rev` with this tree's built cronoq._native copied in."""
    with tempfile.TemporaryDirectory(prefix="cronoq-tracing-base-") as tmp:
        tree = Path(tmp) / "base"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "-q", "--detach", str(tree), rev], check=True)
        try:
            for so in (ROOT / "src" / "cronoq").glob("_native*.so"):
                shutil.copy2(so, tree / "src" / "cronoq" / so.name)
            where = subprocess.run(
                [sys.executable, "-c", "import cronoq; print(cronoq.__file__)"],
                env={**os.environ, "PYTHONPATH": str(tree / "src")},
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            assert where.startswith(str(tree)), f"{rev}'s server would import {where}"
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=True)


async def measure(sz: Sizes, base_rev: str | None, stack: contextlib.AsyncExitStack) -> Results:
    transport = "native" if native_built() else "grpcio"
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="cronoq-tracing-"))
    t0 = time.perf_counter()
    go = S.build_go_worker(tmp)
    print(f"built:    the Go raw worker in {time.perf_counter() - t0:.1f} s")
    sink = Sink()
    stack.callback(sink.proc.stop)

    def fleet(env: dict[str, str | None]) -> S.Fleet:
        with environ(**env):
            f = S.Fleet(go, transport=transport)
        stack.callback(f.close)
        return f

    fleets = {"off": fleet(_OTEL_OFF), "on": fleet(_on(sink))}
    if base_rev is not None:
        tree = stack.enter_context(base_tree(base_rev))
        fleets["base"] = fleet({**_OTEL_OFF, "PYTHONPATH": str(tree / "src")})
        print(f"base:     {base_rev} from {tree} (the server's PYTHONPATH)")
    clients = {k: await stack.enter_async_context(S.connect(f.target)) for k, f in fleets.items()}
    warm = min(sz.n, S.CALLERS * S.BATCH)
    for k, f in fleets.items():
        await S.phase_server(clients[k], warm, f.server, f.worker)
    print("warm-up:  spans received", sink.until(_expected(warm)), "of", _expected(warm))
    provider, processor = sdk_provider(sink)
    await phase_library(min(sz.lib_n, 1000), None)
    await phase_library(min(sz.lib_n, 1000), provider)
    processor.force_flush()  # type: ignore[attr-defined]
    r = Results(transport, {"base": [], "this": []}, [], [], [], [], [])

    async def run(name: str) -> S.ServerRun:
        f = fleets[name]
        return await S.phase_server(clients[name], sz.n, f.server, f.worker)

    for i in range(sz.reps):
        print(f"round {i + 1}/{sz.reps}", file=sys.stderr)
        if base_rev is not None:
            # A/B order alternates by round so that neither side always runs first.
            for name in ("base", "off") if i % 2 == 0 else ("off", "base"):
                r.base["base" if name == "base" else "this"].append(await run(name))
        for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
            if name == "off":
                r.off.append(await run("off"))
                continue
            before = sink.count()
            got = await run("on")
            received = sink.until(before + _expected(sz.n)) - before
            r.on.append(Traced(got, _expected(sz.n), received))
        for tracing in (None, provider) if i % 2 == 0 else (provider, None):
            if tracing is None:
                r.lib_off.append(await phase_library(sz.lib_n, None))
                continue
            before = sink.count()
            r.lib_on.append(await phase_library(sz.lib_n, tracing))
            processor.force_flush()  # type: ignore[attr-defined]
            r.lib_spans.append(sink.count() - before)
    provider.shutdown()  # type: ignore[attr-defined]
    return r


def _runs(xs: list[float]) -> str:
    return "runs " + " ".join(f"{x / 1000:.1f}k" for x in xs)


def _median_cpu(runs: list[S.ServerRun]) -> str:
    return f"{statistics.median(x.server_cpu for x in runs) * 1e6:.1f} us"


def report(sz: Sizes, r: Results, base_rev: str | None) -> None:
    if base_rev is not None:
        a, b = S._best(r.base["base"]), S._best(r.base["this"])
        print(
            f"[t0]  server {base_rev} vs this tree, tracing off, [b {r.transport}]  N={sz.n:,}: "
            f"{base_rev} {a.rate:,.0f} tasks/s, this tree {b.rate:,.0f} tasks/s = "
            f"{b.rate / a.rate:.3f}x   server CPU per task {a.server_cpu * 1e6:.1f} / "
            f"{b.server_cpu * 1e6:.1f} us"
        )
        print(
            f"{'':6}{base_rev}: {_runs([x.rate for x in r.base['base']])}; this tree: "
            f"{_runs([x.rate for x in r.base['this']])}; server CPU per task, median of the "
            f"runs: {_median_cpu(r.base['base'])} / {_median_cpu(r.base['this'])}"
        )
    off = S._best(r.off)
    on = max(r.on, key=lambda t: t.run.rate)
    ratio = on.run.rate / off.rate
    print(
        f"[t1]  server, tracing off / on (sampler 1.0), [b {r.transport}]  N={sz.n:,}: off "
        f"{off.rate:,.0f} tasks/s, on {on.run.rate:,.0f} tasks/s = {ratio:.2f}x  target >= "
        f"{TARGET_ON_OFF}x  {verdict(ratio >= TARGET_ON_OFF)}"
    )
    print(
        f"{'':6}server CPU per task: off {off.server_cpu * 1e6:.1f} us, on "
        f"{on.run.server_cpu * 1e6:.1f} us (best runs), medians {_median_cpu(r.off)} / "
        f"{_median_cpu([t.run for t in r.on])}; off {_runs([x.rate for x in r.off])}; "
        f"on {_runs([x.run.rate for x in r.on])}"
    )
    lost = [t.expected - t.received for t in r.on]
    print(
        f"{'':6}spans per tracing-on run: expected {on.expected:,}, received "
        + ", ".join(f"{t.received:,}" for t in r.on)
        + f"; dropped or not exported: {', '.join(f'{x:,}' for x in lost)}"
        + f"  {verdict(not any(lost))}"
    )
    lib_off, lib_on = max(r.lib_off), max(r.lib_on)
    print(
        f"[t2]  library, Scheduler tracing=None / SDK TracerProvider  N={sz.lib_n:,}: off "
        f"{lib_off:,.0f} tasks/s, on {lib_on:,.0f} tasks/s = {lib_on / lib_off:.2f}x "
        f"({1e6 / lib_on - 1e6 / lib_off:.0f} us more per task)   off {_runs(r.lib_off)}; on "
        f"{_runs(r.lib_on)}"
    )
    print(
        f"{'':6}spans received per run: {', '.join(f'{x:,}' for x in r.lib_spans)} "
        f"({r.lib_spans[-1] / sz.lib_n:.1f} per task)"
    )
    print(
        f"\ntargets:  [t1] {verdict(ratio >= TARGET_ON_OFF)}, [t1 spans] {verdict(not any(lost))}"
    )


async def bench(sz: Sizes, base_rev: str | None) -> int:
    async with contextlib.AsyncExitStack() as stack:
        r = await measure(sz, base_rev, stack)
    print()
    report(sz, r, base_rev)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="tasks per server run (20000)")
    ap.add_argument("--lib-n", type=int, default=None, help="tasks per library run (10000)")
    ap.add_argument("--reps", type=int, default=None, help="interleaved runs of each side (5)")
    ap.add_argument("--base", default=None, help="[t0]: the server of this git revision too")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--role", choices=("sink",), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "sink":
        sink_main()
        return 0
    base = QUICK if args.quick else FULL
    given = {"n": args.n, "lib_n": args.lib_n, "reps": args.reps}
    sz = Sizes(**{**base.__dict__, **{k: v for k, v in given.items() if v is not None}})
    if min(sz.n, sz.lib_n, sz.reps) < 1:
        ap.error("--n, --lib-n and --reps must be >= 1")
    print_about("cronoq tracing overhead benchmark" + (" (--quick sizes)" if args.quick else ""))
    print_cpus("this client and sink, the servers, the Go raw workers")
    print(
        f"sizes:    server N={sz.n:,} (SubmitBatch of {S.BATCH:,} from {S.CALLERS} callers, Go "
        f"raw worker {S.GO_SLOTS} slots); library N={sz.lib_n:,}; best of {sz.reps} "
        f"interleaved runs\ntargets:  [t1] tracing on >= {TARGET_ON_OFF}x off, no span dropped"
    )
    return asyncio.run(bench(sz, args.base))


if __name__ == "__main__":
    sys.exit(main())
