"""bench/library.py, server.py, store.py, takeover.py, shards.py, workers.py, app.py,
tracing.py, operations.py, fleet.py, peers.py, core.py and rust_library.py --quick run to the end
and print every figure (targets are not checked)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "library.py"
SERVER_BENCH = BENCH.parent / "server.py"

# One pattern per figure line; each must carry a number, and targeted figures a verdict.
FIGURES = {
    "1": r"^\[1\]  asyncio floor .*\d+ items/s",
    "2a": r"^\[2a\] sequential submit .*tasks/s .*x floor .*(PASS|MISS)",
    "2b": r"^\[2b\] submit_batch .*tasks/s .*x floor .*(PASS|MISS)",
    "2c": r"^\[2c\] idle round trip .*p50 [\d.]+ us  p99 [\d.]+ us .*(PASS|MISS)",
    "3": r"^\[3\]  core, virtual clock .*cycles/s .*decisions/s .*(PASS|MISS)",
    "3-def": r"^     decision = one engine operation",
    "4a": r"^\[4a\] memory, Engine\.submit .*[\d,]+ B/task .*(PASS|MISS)",
    "4b": r"^\[4b\] memory, sched\.enqueue .*[\d,]+ B/task .*(PASS|MISS)",
    "5a": r"^\[5a\] core, fair share .*cycles/s .*decisions/s .*[\d.]+x \[3\] .*(PASS|MISS)",
    "5a-def": r"^     one pool, 64 slots, fair_share=True, [\d,]+ tenants",
    "5b": r"^\[5b\] core, dependency chains .*decisions/s .*[\d.]+x \[3\] per decision .*"
    r"(PASS|MISS)",
    "5b-def": r"^     decisions = submits \+ dispatches \+ completes = [\d,]+",
    "5c": r"^\[5c\] core, semaphore .*cycles/s .*decisions/s .*[\d.]+x \[3\] .*(PASS|MISS)",
    "5c-def": r"^     one pool, 64 slots; every task needs 1 permit of a semaphore",
    "6": r"^\[6\]  core, O\(log n\) scaling .*= [\d.]+x .*(PASS|MISS)",
    "6-sizes": r"(^     backlog +[\d,]+: +[\d,]+ decisions/s .*[\d.]+x \[3\].*\n){3}",
    "6-cost": r"^     kept affordable: ",
    "header-python": r"^python: ",
    "header-platform": r"^platform: ",
    "header-cpus": r"^cpus: ",
    "summary": r"^targets:  \d+/\d+ met",
}


def test_quick_benchmark_prints_every_figure() -> None:
    _run(BENCH, ["--quick"], FIGURES, timeout=600)


SERVER_FIGURES = {
    "a": r"^\[a\] +bare grpc\.aio echo, Go raw worker .*[\d,]+ pairs/s .*servicer \d+ us, worker",
    "b-grpcio": r"^\[b grpcio\] +server, SubmitBatch x4 .*[\d,]+ tasks/s .*[\d.]+x \[a\]",
    "b-native": r"^\[b native\] +server, SubmitBatch x4 .*[\d,]+ tasks/s .*[\d.]+x \[a\] .*"
    r"(PASS|MISS)",
    "b-cpu": r"^ +CPU per task: server \d+ us +target <= 80 us +(PASS|MISS)",
    "c-grpcio": r"^\[c grpcio\] +Submit\(wait=true\) round trip .*p50 [\d.]+ ms  p99 [\d.]+ ms",
    "c-native": r"^\[c native\] +Submit\(wait=true\) .*p50 [\d.]+ ms .*(PASS|MISS)",
    "d": r"^\[d\] +echo, cronoq\.client\.Worker .*= [\d.]+x the Python raw worker's .*(PASS|MISS)",
    "e": r"^\[e native\] +Client\.submit_batch \+ Worker .*[\d,]+ tasks/s .*Worker \d+ us",
    "f-sqlite": r"^\[f sqlite\] +server \(native\), SubmitBatch x4 .*[\d,]+ tasks/s .*(PASS|MISS)",
    "f-ceiling": r"^ +CPU per task: server \d+ us, worker [\d.]+ us; store ceiling [\d,]+ tasks/s",
    "f-postgres": r"^\[f postgres\] +server \(native\), .*[\d,]+ tasks/s .*(PASS|MISS)",
    "header-python": r"^python: ",
    "header-platform": r"^platform: .*grpcio ",
    "header-cpus": r"^cpus: ",
    "summary": r"^targets:  \d/6 met",
}

SERVER_PROFILE = {
    "rate": r"^\[b native\] under cProfile, N=[\d,]+: [\d,]+ tasks/s; server CPU \d+ us per task",
    "areas": r"^ +[\d.]+%  +[\d.]+ us/task  cronoq\.server$",
    "top": r"ncalls +tottime +percall +cumtime",
}


def _run(script: Path, args: list[str], patterns: dict[str, str], timeout: float = 120) -> None:
    """Run a benchmark and check that every pattern matches a line of its output."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=BENCH.parent.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    missing = [n for n, p in patterns.items() if not re.search(p, proc.stdout, re.MULTILINE)]
    assert not missing, f"figure lines missing: {missing}\n{proc.stdout}"


def test_quick_server_benchmark_prints_every_figure() -> None:
    _run(SERVER_BENCH, ["--quick"], SERVER_FIGURES)


def test_quick_server_profile_prints_where_the_time_goes() -> None:
    _run(SERVER_BENCH, ["--quick", "--profile"], SERVER_PROFILE)


STORE_BENCH = BENCH.parent / "store.py"
STORE_FIGURES = {
    "0": r"^\[0\]  this machine: 4 KiB write \+ fdatasync p50 [\d.]+ ms; store-thread round trip",
    "1": r"^\[1\]  in-memory batch .*[\d,]+ tasks/s",
    "2": r"^\[2\]  SQLite batch .*[\d,]+ tasks/s +[\d.]+x \[1\] .*(PASS|MISS)",
    "2-why": r"^     best run: insert of [\d,]+ rows [\d.]+ s; \d+ rounds of [\d.]+ ms = commit",
    "3a": r"^\[3a\] sequential, FULL .*acknowledged submits/s .*(PASS|MISS)",
    "3a-ceiling": r"^     ceiling here: 1 / \(fdatasync \+ round trip\) = [\d,]+/s",
    "3b": r"^\[3b\] sequential, NORMAL .*acknowledged submits/s .*(PASS|MISS)",
    "4": r"^\[4\]  64 concurrent submitters .*tasks/s .*commits = [\d.]+ per task",
    "header-postgres": r"^postgres: PostgreSQL [\d.]+ \(fsync=\w+, synchronous_commit=\w+",
    "0p": r"^\[0p\] PostgreSQL: SELECT 1 round trip p50 \d+ us; one-row transaction p50 [\d.]+ ms",
    "2p": r"^\[2p\] PostgreSQL batch .*[\d,]+ tasks/s +[\d.]+x \[2\] .*(PASS|MISS)",
    "2p-why": r"^\[2p\] .*\n     best run: insert of [\d,]+ rows [\d.]+ s; \d+ rounds of [\d.]+ ms",
    "3p": r"^\[3p\] sequential, PostgreSQL .*[\d,]+ acknowledged submits/s",
    "3p-ceiling": r"^\[3p\] .*\n     ceiling here: 1 / one-row transaction \(\[0p\]\) = [\d,]+/s",
    "4p": r"^\[4p\] 64 concurrent submitters, PostgreSQL .*tasks/s .*(PASS|MISS); [\d,]+ commits",
    # The server path: measured, or (a server that refuses the store) the reason and a miss.
    "5": r"^\[5\]  server SubmitBatch, SQLite .*[\d,]+ tasks/s .*CPU per 1k tasks: server [\d,]+",
    "5p": r"^\[5p\] server SubmitBatch, PostgreSQL .*"
    r"([\d,]+ tasks/s .*[\d.]+x \[5\]|not measured \(.+\)) .*(PASS|MISS)",
    "summary": r"^targets:  \d/6 met",
}


def test_quick_store_benchmark_prints_every_figure() -> None:
    _run(STORE_BENCH, ["--quick"], STORE_FIGURES, timeout=300)


TAKEOVER_BENCH = BENCH.parent / "takeover.py"
TAKEOVER_FIGURES = {
    "0": r"^\[0\]  fresh start, spawn -> first answer +median [\d,]+ ms  \(min [\d,]+, max",
    "1": r"^\[1\]  restart after kill -9, kill -> answer +median [\d,]+ ms .*x the \d+ s lease; "
    r"[+-][\d,]+ ms over \[0\] .*(PASS|MISS)",
    "1-split": r"^     of which kill -> listening \(process start-up\) median [\d,]+ ms",
    "2": r"^\[2\]  standby after kill -9, kill -> answer +median [\d,]+ ms .*(PASS|MISS)",
    "baseline": r"^     baseline: the dead leader's lease, \d+ s",
    "summary": r"^targets:  \d/2 met",
}


def test_quick_takeover_benchmark_prints_every_figure() -> None:
    _run(TAKEOVER_BENCH, ["--quick"], TAKEOVER_FIGURES, timeout=300)


SHARDS_BENCH = BENCH.parent / "shards.py"
SHARDS_FIGURES = {
    "s1": r"^\[s1\] one server, 2 pools .*[\d,]+ tasks/s .*baseline",
    "s2": r"^\[s2\] 2 shards, direct .*[\d,]+ tasks/s .*[\d.]+x \[s1\] .*(PASS|MISS)",
    "s3": r"^\[s3\] 2 shards, all through a .*[\d,]+ tasks/s .*[\d.]+x \[s2\] .*(PASS|MISS)",
    "cpu": r"^     CPU per 1k tasks: server a [\d,]+ ms, server b [\d,]+ ms",
    "s4-submit": r"^\[s4\] Submit of 1 task .*forward overhead p50 [+-][\d,]+ us per call",
    "s4-get": r"^\[s4\] Get by id .*forward overhead p50 [+-][\d,]+ us per call",
    "summary": r"^targets:  \d/2 met",
}


def test_quick_shards_benchmark_prints_every_figure() -> None:
    _run(SHARDS_BENCH, ["--quick"], SHARDS_FIGURES, timeout=300)


WORKERS_BENCH = BENCH.parent / "workers.py"
WORKERS_FIGURES = {
    "built": r"^built:    go in [\d.]+ s",
    "raw": r"^go raw +[\d,]+ leases/s +worker CPU +[\d.]+ us/lease",
    "sdk": r"^python sdk +[\d,]+ leases/s .*server +\d+ us/task, [\d.]+ cores busy",
    "ratio": r"^ +CPU [\d.]+x its raw worker's  target <= 1\.5x  (PASS|MISS)",
    "saturation": r"server [\d.]+x its busiest: saturated \(>= 0\.9x\)  (PASS|MISS)",
    "summary": r"^targets:  \d/3 met",
}


def test_quick_workers_benchmark_prints_every_figure() -> None:
    """The Python and Go workers (TypeScript and Rust need their SDK builds, which the test
    command makes after this suite)."""
    _run(WORKERS_BENCH, ["--quick", "--only", "python,go"], WORKERS_FIGURES, timeout=300)


APP_BENCH = BENCH.parent / "app.py"
APP_FIGURES = {
    "1a": r"^\[1a\] library, submit all, then await all .*N=[\d,]+: plain [\d.]+ us, app [\d.]+ us "
    r"CPU per task = [\d.]+x .*(PASS|MISS)",
    "1b": r"^\[1b\] library, one at a time .*N=[\d,]+: plain [\d.]+ us, app [\d.]+ us CPU per task "
    r"= [\d.]+x .*(PASS|MISS)",
    "rounds": r"^     rounds \(us per task\): plain [\d. ]+; app [\d. ]+; ratios [\d. ]+",
    "2-plain": r"^ +plain Worker +[\d,]+ leases/s +worker CPU +\d+ us/lease +server +\d+ us/task",
    "2-app": r"^ +app worker +[\d,]+ leases/s +worker CPU +\d+ us/lease +server +\d+ us/task",
    "2": r"^\[2\]  server, app worker vs plain Worker .*[\d.]+x leases/s .*(PASS|MISS)",
    "header-python": r"^python: ",
    "header-platform": r"^platform: .*grpcio ",
    "header-cpus": r"^cpus: ",
    "summary": r"^targets:  \d/3 met",
}

APP_PROFILE = {
    "total": r"^\[1a\] under cProfile, N=[\d,]+, .*: own time per task plain [\d.]+ us, app [\d.]+",
    "gc": r"^     garbage collector, app +[\d.]+ us per task",
    "delta": r"^ +[+-][\d.]+ +[\d.]+ +[\d.]+ +[\d.]+/[\d.]+ +\S+",
    "mine": r"^ +[\d.]+ +[\d.]+ +[\d.]+  cronoq/app/_app\.py:\d+\(submit\)",
}


def test_quick_app_benchmark_prints_every_figure() -> None:
    _run(APP_BENCH, ["--quick"], APP_FIGURES, timeout=300)


def test_quick_app_profile_prints_where_the_time_goes() -> None:
    _run(APP_BENCH, ["--profile", "--n", "1000"], APP_PROFILE)


TRACING_BENCH = BENCH.parent / "tracing.py"
TRACING_FIGURES = {
    "t1": r"^\[t1\]  server, tracing off / on \(sampler 1\.0\), .*off [\d,]+ tasks/s, on [\d,]+ "
    r"tasks/s = [\d.]+x  target >= 0\.7x  (PASS|MISS)",
    "t1-cpu": r"^ +server CPU per task: off [\d.]+ us, on [\d.]+ us",
    "t1-spans": r"^ +spans per tracing-on run: expected [\d,]+, received [\d,]+; dropped "
    r".*(PASS|MISS)",
    "t2": r"^\[t2\]  library, Scheduler tracing=None / SDK TracerProvider .*= [\d.]+x",
    "t2-spans": r"^ +spans received per run: [\d,]+ \([\d.]+ per task\)",
    "header-python": r"^python: ",
    "header-cpus": r"^cpus: ",
    "summary": r"^targets:  \[t1\] (PASS|MISS), \[t1 spans\] (PASS|MISS)",
}


def test_quick_tracing_benchmark_prints_every_figure() -> None:
    _run(TRACING_BENCH, ["--quick"], TRACING_FIGURES)


OPERATIONS_BENCH = BENCH.parent / "operations.py"
_LATENCY = r"p50 +[\d.]+ ms  p99 +[\d.]+ ms  max +[\d.]+ ms"
OPERATIONS_FIGURES = {
    "o1-base": r"^\[o1\] live, no bulk action +[\d,]+ tasks: " + _LATENCY,
    "o1-bulk": r"^\[o1\] live, bulk retry of [\d,]+ +[\d,]+ tasks: " + _LATENCY,
    "o1-ratio": r"^\[o1\] p99 bulk / no bulk = [\d.]+x  target <= 2x  (PASS|MISS)",
    "o1-during": r"^     submitted while the bulk action ran: ([\d,]+ tasks, p50|none)",
    "o1-rate": r"^\[o1\] bulk retry of [\d,]+ dead letters: [\d.]+ s = [\d,]+ tasks/s",
    "o2-floor": r"^     floor: Client\.get of one task [\d.]+ ms",
    "o2": r"(^\[o2\] +[\w ,]+: +[\d,]+ matches +[\d.]+ ms  target <= 200 ms  (PASS|MISS)\n){9}",
    "header-python": r"^python: ",
    "header-cpus": r"^cpus: .*load average",
    "summary": r"^targets:  \d/2 met",
}


def test_quick_operations_benchmark_prints_every_figure() -> None:
    _run(OPERATIONS_BENCH, ["--quick"], OPERATIONS_FIGURES)


FLEET_BENCH = BENCH.parent / "fleet.py"
_FLEET_LATENCY = r"p50 [\d.]+ ms  p99 [\d.]+ ms  max [\d.]+ ms  target p99 <= \d ms  (PASS|MISS)"
FLEET_FIGURES = {
    f"{kind}-{store}-{n}": rf"^\[a {store} {kind} x{n}\] +N=[\d,]+: +[\d,]+ leases/s.*CPU: "
    r"workers \d+ us/lease, server \d+ us/task \([\d.]+x \[g\]\).*\n +\[b\] at [\d,]+ tasks/s "
    r"\(reached [\d,]+; server \d+ us/task\), [\d,]+ tasks: " + _FLEET_LATENCY
    for kind in ("worker", "app")
    for store in ("memory", "sqlite")
    for n in (1, 4)
} | {
    "target-one": r"^\[a memory worker x1\] .*leases/s  target >= 25k or >= 2\.5x base  "
    r"(PASS|MISS)",
    "ceiling": r"^ +\[c\] [\d.]+x the store's ceiling, [\d,]+ tasks/s .*target >= 0\.9x  "
    r"(PASS|MISS)",
    "go": r"^\[g sqlite\] +N=[\d,]+: +[\d,]+ tasks/s +CPU: Go raw worker [\d.]+ us/lease, server",
    "go-ratio": r"^ +server CPU per task, app x1 / Go raw worker: [\d.]+x  target <= 1\.3x  "
    r"(PASS|MISS)",
    "header-cpus": r"^cpus: .*load average",
    "summary": r"^targets:  \d+/\d+ met",
}


def test_quick_fleet_benchmark_prints_every_figure() -> None:
    args = ["--quick", "--workers", "1,4", "--store", "memory,sqlite"]
    _run(FLEET_BENCH, args, FLEET_FIGURES, timeout=600)


PEERS_BENCH = BENCH.parent / "peers.py"
PEERS_DIR = BENCH.parent / "peers"


def _peers_missing() -> dict[str, str]:
    """The peers this machine cannot run, and why (the published server is never built here)."""
    missing = {}
    if shutil.which("redis-server") is None:
        missing["bullmq"] = "redis-server is not installed"
    elif not (PEERS_DIR / "bullmq" / "node_modules" / "bullmq").is_dir():
        missing["bullmq"] = "bench/peers/bullmq has no node_modules (npm ci there)"
    if shutil.which("go") is None:
        missing["river"] = "go is not installed"
    return missing


def test_quick_peers_benchmark_prints_every_figure() -> None:
    missing = _peers_missing()
    peers = [p for p in ("bullmq", "river") if p not in missing]
    if not peers:
        pytest.skip("; ".join(f"{k}: {v}" for k, v in missing.items()))
    systems = ["cronoq-pg", "cronoq-sqlite", *peers]
    figures = {
        f"{name}": rf"^{name} +\[p\] N=[\d,]+: +[\d,]+ tasks/s +CPU \d+ us/task \(.+\) .*\n +\[l\] "
        r"200 tasks/s \(reached [\d,]+\), [\d,]+ tasks: p50 [\d.]+ ms  p99 [\d.]+ ms  max"
        for name in systems
    } | {
        "cpu-pg": r"^cronoq-pg .*\(server \d+, postgres \d+, worker \d+\)",
        "cpu-river": r"^river .*\(postgres \d+, worker \d+\)" if "river" in peers else ".",
        "cpu-bullmq": r"^bullmq .*\(redis \d+, worker \d+\)" if "bullmq" in peers else ".",
        "header-cpus": r"^cpus: .*load average",
    }
    _run(PEERS_BENCH, ["--quick", "--systems", ",".join(systems)], figures, timeout=600)


CORE_BENCH = BENCH.parent / "core.py"
CORE_FIGURES = {
    "1": r"^\[1\] Python core, virtual clock +[\d,]+ cycles/s +[\d,]+ decisions/s",
    "2": r"^\[2\] Rust core, virtual clock +[\d,]+ cycles/s +[\d,]+ decisions/s  target >= "
    r"1,000,000 decisions/s  (PASS|MISS)",
    "3": r"^\[3\] Rust / Python +[\d.]+x  target >= 20x  (PASS|MISS)",
    "header-python": r"^python: ",
    "header-cpus": r"^cpus: ",
    "summary": r"^targets:  \d/2 met",
}


def test_quick_core_benchmark_prints_every_figure() -> None:
    _run(CORE_BENCH, ["--quick"], CORE_FIGURES, timeout=600)


RUST_LIBRARY_BENCH = BENCH.parent / "rust_library.py"
_SYSTEMS = [(system, rt) for system in ("floor", "ours", "published") for rt in ("ct", "mt")]
RUST_LIBRARY_FIGURES = {
    "header-python": r"^python: ",
    "header-cpus": r"^cpus: ",
    "header-rust": r"^rust: +ours = sdks/rust/crates/cronoq \(git \w+.*published = cronoq 0\.2\.1",
    "built": r"^built: +debug in [\d.]+ s",
    "1-python": r"^\[1 python\] .*[\d,]+ tasks/s \([\d.]+ us each\)  CPU [\d.]+ us/task",
    "2-python": r"^\[2 python\] .*[\d,]+ tasks/s \([\d.]+ us each\)  CPU [\d.]+ us/task",
    "3-python": r"^\[3 python\] .*p50 +[\d.]+ us  p99 +[\d.]+ us",
    **{
        f"{num}-{system}-{rt}": rf"^\[{num} {system} {rt}\] .*[\d,]+ tasks/s .*CPU [\d.]+ us/task  "
        r"[\d.]+x python"
        for num in ("1", "2")
        for system, rt in _SYSTEMS
    },
    **{
        f"3-{system}-{rt}": rf"^\[3 {system} {rt}\] .*p50 +[\d.]+ us  p99 +[\d.]+ us"
        for system, rt in _SYSTEMS
    },
    **{
        f"{num}-{rt}": rf"^\[{num} {rt}\] +ours / published = [\d.]+x  target >= 1\.5x  "
        r"(PASS|MISS)   \(by CPU per task: [\d.]+x; above the floor: ours -?[\d.]+ us, "
        r"published -?[\d.]+ us per task\)"
        for num in ("1", "2")
        for rt in ("ct", "mt")
    },
    **{
        f"3-{rt}": rf"^\[3 {rt}\] +ours p50 / published p50 = [\d.]+x  target <= 1x  (PASS|MISS)"
        for rt in ("ct", "mt")
    },
    "summary": r"^targets:  \d/6 met",
}


def test_quick_rust_library_benchmark_prints_every_figure() -> None:
    """Builds bench/rust-library in debug mode (see the script's docstring for why)."""
    _run(RUST_LIBRARY_BENCH, ["--quick"], RUST_LIBRARY_FIGURES, timeout=900)
