"""Native transport bridge prototype: tonic serving Workers/Work, Python driving it in batches.

The question is what a Rust transport handing the Python engine batches of decoded messages
would save over grpc.aio's cost per message. Both servicers below speak the same lease protocol
to the same worker, so their figures compare the transports alone (no scheduler on either side).

Phases, interleaved after one unreported warm-up round, best of the runs by pairs/s:
[a]  the bare grpc.aio echo servicer of bench/server.py (`server.py --role echo --n N`): per
     stream, N leases with up to 64 in flight, each Complete answered by the next lease.
[n]  bench/native_bridge (a PyO3 module over tonic, loaded from its cargo build) in a child
     Python process, this file with the hidden `--role native`: the Rust side answers the
     Register and encodes the leases; the asyncio loop watches the bridge's descriptor, and on
     each wake drains every message received since the last (small tuples) and sends as many
     new leases in one `send_leases` call, again N leases with up to 64 in flight.
The worker of both is the Go raw worker of bench/workers/go (`-mode raw`), which answers each
lease with a Complete at once, so that the load generator is not the bottleneck.

Per phase: pairs/s, timed by the servicer from its first lease to its last Complete, and the
CPU per pair (utime + stime from /proc/<pid>/stat, every thread) of the servicer process and of
the worker, from the worker's registration to the servicer's last Complete; /proc counts in
clock ticks, so the servicer's own process clock (every thread, its timed window) is printed
beside it. [n] also prints its
mean batch (Completes per wake). The exit status is 0 unless a run fails.

Usage: python bench/bridge.py [--n N] [--quick]

The crate is built with `cargo build --release` and the Go worker with `go build`; build times
are printed and not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import grpc

from _common import print_about, print_cpus
from server import SLOTS, Proc

BENCH = Path(__file__).resolve().parent
CRATE = BENCH / "native_bridge"
MODULE = "native_bridge"  # the crate's lib name, and so its PyInit_ symbol


@dataclass
class Sizes:
    n: int
    reps: int


FULL = Sizes(n=50_000, reps=3)
QUICK = Sizes(n=2_000, reps=1)


# --- the [n] servicer: this file run with --role native --------------------------------------


def load_bridge(path: str) -> ModuleType:
    """The extension module built from the crate, imported from the file `path`."""
    spec = importlib.util.spec_from_file_location(MODULE, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Stream:
    """One worker stream's count of leases sent and Completes received."""

    __slots__ = ("cpu0", "done", "sent", "t0")

    def __init__(self) -> None:
        self.sent = self.done = 0
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()


async def native_main(lib: str, n: int) -> None:
    nb = load_bridge(lib)
    opened, complete, closed = nb.OPENED, nb.COMPLETE, nb.CLOSED
    bridge = nb.Bridge.start("127.0.0.1:0")
    streams: dict[int, _Stream] = {}
    wakes = 0  # since the latest stream opened: the benchmark serves one stream at a time

    def top_up(sid: int, s: _Stream, k: int) -> None:
        k = min(k, n - s.sent)
        if k > 0:
            bridge.send_leases(sid, range(s.sent + 1, s.sent + k + 1))
            s.sent += k

    def on_wake() -> None:
        nonlocal wakes
        wakes += 1
        got: dict[int, int] = {}
        for sid, kind, _lease in bridge.drain():
            if kind == complete:
                got[sid] = got.get(sid, 0) + 1
            elif kind == opened:
                streams[sid] = s = _Stream()
                wakes = 0
                top_up(sid, s, SLOTS)
            elif kind == closed:
                streams.pop(sid, None)
            else:
                raise RuntimeError(f"stream {sid}: unexpected message kind {kind}")
        for sid, k in got.items():
            s = streams[sid]
            s.done += k
            if s.done == n:
                dt = time.perf_counter() - s.t0
                cpu = time.process_time() - s.cpu0
                print(f"pairs={n} seconds={dt:.6f} cpu={cpu:.6f} wakes={wakes}", flush=True)
                bridge.end_stream(sid)
            else:
                top_up(sid, s, k)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(bridge.fileno(), on_wake)
    print(f"port={bridge.port}", flush=True)
    try:
        await stop.wait()
    finally:
        loop.remove_reader(bridge.fileno())
        bridge.close()


# --- the run -----------------------------------------------------------------------------------


def build(out: Path) -> tuple[str, str]:
    """Builds the Go raw worker and the crate; returns the worker's path and the module's."""
    t0 = time.perf_counter()
    go = out / "go-workers"
    subprocess.run(["go", "build", "-o", str(go), "."], cwd=BENCH / "workers" / "go", check=True)
    t1 = time.perf_counter()
    subprocess.run(["cargo", "build", "-q", "--release"], cwd=CRATE, check=True)
    t2 = time.perf_counter()
    # Python imports an extension by its file name: lib<name>.so must become <name>.abi3.so.
    lib = out / f"{MODULE}.abi3.so"
    shutil.copyfile(CRATE / "target" / "release" / f"lib{MODULE}.so", lib)
    print(f"build:    go worker {t1 - t0:.1f} s, native_bridge (cargo --release) {t2 - t1:.1f} s")
    return str(go), str(lib)


@dataclass
class Run:
    rate: float
    servicer_cpu: float  # seconds per pair
    servicer_clock: float  # the same, by the servicer's own process clock over its timed window
    worker_cpu: float
    batch: float  # Completes per wake ([n] only)


def one_run(servicer: Proc, port: str, go: str, n: int) -> Run:
    worker = Proc([go, "-mode", "raw", "-target", f"127.0.0.1:{port}"], "go raw worker")
    try:
        worker.expect(r"^registered slots=64")
        cpu_s, cpu_w = servicer.cpu(), worker.cpu()
        m = servicer.expect(
            r"^pairs=(\d+) seconds=([\d.]+) cpu=([\d.]+)(?: wakes=(\d+))?", timeout=60 + n / 500
        )
        # Read at once: the worker exits when the stream ends. Until it is reaped, its /proc
        # entry still holds its times.
        dw, ds = worker.cpu() - cpu_w, servicer.cpu() - cpu_s
    finally:
        worker.stop()
    assert int(m.group(1)) == n, m.group(0)
    batch = n / int(m.group(4)) if m.group(4) else 0.0
    return Run(n / float(m.group(2)), ds / n, float(m.group(3)) / n, dw / n, batch)


def _line(label: str, n: int, best: Run, runs: list[Run]) -> str:
    batch = f"   mean batch {best.batch:.1f}" if best.batch else ""
    return (
        f"{label} N={n:,}: {best.rate:>8,.0f} pairs/s ({1e6 / best.rate:.1f} us each)   CPU per "
        f"pair: servicer {best.servicer_cpu * 1e6:.1f} us (own clock "
        f"{best.servicer_clock * 1e6:.1f} us), worker {best.worker_cpu * 1e6:.1f} us"
        f"{batch}   (runs {' '.join(f'{r.rate / 1000:.1f}k' for r in runs)})"
    )


def bench(sz: Sizes, title: str) -> int:
    print_about(title, f"; grpcio {grpc.__version__}")
    print_cpus("this driver, the servicer, the Go raw worker")
    print(f"sizes:    N={sz.n:,}, best of {sz.reps} interleaved runs of [a]/[n]; {SLOTS} in flight")
    with tempfile.TemporaryDirectory(prefix="cronoq-bridge-") as tmp:
        go, lib = build(Path(tmp))
        print()
        py = sys.executable
        echo = Proc([py, str(BENCH / "server.py"), "--role", "echo", "--n", str(sz.n)], "echo")
        native = Proc(
            [py, __file__, "--role", "native", "--n", str(sz.n), "--lib", lib], "native bridge"
        )
        try:
            echo_port = echo.expect(r"^port=(\d+)").group(1)
            native_port = native.expect(r"^port=(\d+)").group(1)
            a: list[Run] = []
            b: list[Run] = []
            for i in range(sz.reps + 1):
                ra = one_run(echo, echo_port, go, sz.n)
                rn = one_run(native, native_port, go, sz.n)
                if i:  # round 0 warms both servicers up and is not reported
                    a.append(ra)
                    b.append(rn)
        finally:
            native.stop()
            echo.stop()
    ba = max(a, key=lambda r: r.rate)
    bn = max(b, key=lambda r: r.rate)
    print(_line("[a]  bare grpc.aio echo        ", sz.n, ba, a))
    print(_line("[n]  native bridge, batches    ", sz.n, bn, b))
    print(
        f"[n]/[a]: throughput {bn.rate / ba.rate:.2f}x, servicer CPU per pair "
        f"{bn.servicer_cpu / ba.servicer_cpu:.2f}x, worker CPU per pair "
        f"{bn.worker_cpu / ba.worker_cpu:.2f}x (best runs)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="pairs per run (50000)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--role", choices=("native",), help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sz = QUICK if args.quick else FULL
    if args.n is not None:
        sz = Sizes(args.n, sz.reps)
    if sz.n < 1:
        ap.error("--n must be >= 1")
    if args.role == "native":
        asyncio.run(native_main(args.lib, sz.n))
        return 0
    title = "cronoq native transport bridge prototype"
    return bench(sz, title + (" (--quick sizes)" if args.quick else ""))


if __name__ == "__main__":
    sys.exit(main())
