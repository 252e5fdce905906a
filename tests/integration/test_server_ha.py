"""Active-passive high availability on PostgreSQL, with real `cronoq-server` processes on one
schema of a real PostgreSQL server (tests/conftest.py), real sockets, real clients and workers
(docs/server.md, "Standby"; docs/http.md, "Health and readiness" and "Connections on a
standby").

Each server keeps fixed ports across restarts, so that clients and workers, which know both
addresses, find it again. Waits are conditions polled against deadlines: LONG only fails a hung
process, however slow the machine. The takeover time of docs/server.md, "Standby" (a standby
ready within 1 s of the leader's death on loopback) is measured and printed; it is asserted
within TAKEOVER_S times CRONOQ_TEST_TIME_SCALE (default SCALE), so that the suite also passes on
a machine whose cores are busy with other work.

Slow on purpose: the failover rounds (about a minute for ten kills), and the paused leader
(about 15 s: the pause must outlast the 10 s keeper timeout).
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from cronoq.server.fronts.http_api import STANDBY_REASON
from helpers import pgstore
from helpers.ports import free_port
from helpers.servers import Server, write
from helpers.tcpproxy import TcpProxy
from helpers.workers import EchoWorker

CHILD = Path(__file__).with_name("ha_worker_child.py")
LONG = 60.0  # a safety net for every wait: only a hung process gets near it
TAKEOVER_S = 1.0  # docs/server.md, "Standby": a standby leads within this of a leader's death
SCALE = 3.0  # how much slower than that a loaded machine may be, unless CRONOQ_TEST_TIME_SCALE
TIME_SCALE = float(os.environ.get("CRONOQ_TEST_TIME_SCALE") or SCALE)
KEEPER_TIMEOUT_S = 10.0  # a leader that answered no probe for this long has lost (docs/server.md)
RECYCLE_BOUND_S = 3.0  # a standby's fresh HTTP connection is closed within this
ANOTHER_LEADS = "standing by: another server leads"  # a waiting standby's /readyz reason
MIN_ACKS = 20  # fresh submits acknowledged by each leader before the next failover
RETRY = "retry = { max_attempts = 20, initial_backoff_s = 0.05, jitter = false }"
# Channels that reconnect soon after the server on that address came back.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
]

_T = TypeVar("_T")


Pg = pgstore.Where  # the `pg` fixture (tests/conftest.py): the server's URL, the test's schema


# --- helpers ---------------------------------------------------------------------------------


def until(check: Callable[[], _T], what: str, timeout: float = LONG, every: float = 0.01) -> _T:
    """Poll `check` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s: {what}"
        time.sleep(every)
    return value


def readyz(http_address: str, timeout: float = 5.0) -> tuple[int, str | None]:
    """/readyz on a fresh connection: (status, the standby reason header); (0, None) when
    nothing answers."""
    host, _, port = http_address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader(STANDBY_REASON)
    except OSError:
        return 0, None
    finally:
        conn.close()


def query(pg: Pg, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """The rows of one statement on the test's schema, from a connection of its own."""
    return asyncio.run(pgstore.fetch(pg, sql, *args))


def epoch_of(pg: Pg) -> int:
    return int(query(pg, "SELECT epoch FROM cronoq_leader WHERE id = 1")[0][0])


def stub(address: str) -> cronoq_pb2_grpc.TasksStub:
    return cronoq_pb2_grpc.TasksStub(grpc.insecure_channel(address))


def submit(address: str, key: str, payload: bytes = b"x", pool: str = "") -> pb.SubmitResponse:
    with grpc.insecure_channel(address) as ch:
        request = pb.SubmitRequest(task=pb.TaskSpec(key=key, payload=payload, pool=pool))
        reply: pb.SubmitResponse = cronoq_pb2_grpc.TasksStub(ch).Submit(request, timeout=LONG)
        return reply


def get(address: str, ref: pb.TaskRef) -> pb.TaskInfo:
    with grpc.insecure_channel(address) as ch:
        info: pb.TaskInfo = cronoq_pb2_grpc.TasksStub(ch).Get(pb.GetRequest(task=ref), timeout=LONG)
        return info


def wait(address: str, task_id: int) -> pb.TaskResult:
    with grpc.insecure_channel(address) as ch:
        request = pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=LONG)
        result: pb.TaskResult = cronoq_pb2_grpc.TasksStub(ch).Wait(request, timeout=LONG + 5)
        return result


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as e:
        code: grpc.StatusCode = e.code()
        return code
    return grpc.StatusCode.OK


def stopped(pid: int) -> bool:
    """Has SIGSTOP taken effect (state T in /proc)?"""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


def distribution(values: Sequence[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return (
        f"n={len(ms)} min={ms[0]:.0f} ms median={statistics.median(ms):.0f} ms "
        f"max={ms[-1]:.0f} ms; in order: {[round(v * 1000) for v in values]}"
    )


@dataclass
class Slot:
    """One server's place: its configuration and fixed addresses, and the process there now."""

    name: str
    config: str
    grpc: str
    http: str
    env: dict[str, str]
    server: Server | None = None

    def start(self) -> Server:
        assert self.server is None or self.server.proc.poll() is not None
        self.server = Server(self.config, env=self.env)
        return self.server

    @property
    def proc(self) -> subprocess.Popen[str]:
        assert self.server is not None
        return self.server.proc

    def ready(self) -> bool:
        return readyz(self.http)[0] == 200

    def waiting(self) -> bool:
        """Standing by, its lock tried every poll while another server leads."""
        return readyz(self.http) == (503, ANOTHER_LEADS)


class Slots:
    """Server places on one schema (or one each); every process is killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self.all: list[Slot] = []

    def add(self, pg: Pg, extra: str = "", url: str | None = None) -> Slot:
        name = f"s{len(self.all)}"
        grpc_address = f"127.0.0.1:{free_port()}"
        http_address = f"127.0.0.1:{free_port()}"
        text = (
            f'[server]\ngrpc_addr = "{grpc_address}"\nhttp_addr = "{http_address}"\n'
            f'shutdown_grace_s = 0.5\n[store]\nkind = "postgres"\nschema = "{pg.schema}"\n'
            f"{extra}"
        )
        config = write(self._tmp, text, f"{name}.toml")
        slot = Slot(name, config, grpc_address, http_address, {"DATABASE_URL": url or pg.url})
        self.all.append(slot)
        return slot

    def kill_all(self) -> None:
        for slot in self.all:
            if slot.server is not None and slot.server.proc.poll() is None:
                slot.server.proc.send_signal(signal.SIGCONT)
                slot.server.kill()


@pytest.fixture
def slots(tmp_path: Path) -> Iterator[Slots]:
    made = Slots(tmp_path)
    try:
        yield made
    finally:
        made.kill_all()


def pair(slots: Slots, pg: Pg, extra: str = "") -> tuple[Slot, Slot]:
    """Two servers on the test's schema: the first leads, the second waits for the lock."""
    a, b = slots.add(pg, extra), slots.add(pg, extra)
    a.start()
    until(a.ready, "the first server to lead")
    b.start()
    until(b.waiting, "the second server to stand by")
    return a, b


# --- load: keyed submits that follow the leader --------------------------------------------------


@dataclass(frozen=True)
class Ack:
    thread: int
    seq: int
    key: str
    id: int
    duplicate: bool


class Load:
    """Threads that each submit keyed tasks one after another. A submit that fails is sent
    again with the same key, to the other server, until one acknowledges it: a task the dying
    leader wrote is then found by its key, not submitted twice."""

    def __init__(self, addresses: Sequence[str], threads: int = 2) -> None:
        self.addresses = list(addresses)
        self.acked: list[Ack] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(LONG)
            assert not t.is_alive(), "a submitting thread hangs"

    def fresh(self, epoch: int) -> int:
        """How many new tasks the leader of `epoch` acknowledged."""
        with self._lock:
            return sum(1 for a in self.acked if not a.duplicate and a.id >> 48 == epoch)

    def _run(self, n: int) -> None:
        channels = [grpc.insecure_channel(a, options=FAST_RECONNECT) for a in self.addresses]
        stubs = [cronoq_pb2_grpc.TasksStub(c) for c in channels]
        target, seq = 0, 0
        try:
            while not self._stop.is_set():
                key = f"load-{n}-{seq}"
                spec = pb.TaskSpec(key=key, payload=key.encode())
                while not self._stop.is_set():
                    try:
                        reply = stubs[target].Submit(pb.SubmitRequest(task=spec), timeout=LONG)
                    except grpc.RpcError:
                        with self._lock:
                            self.errors += 1
                        target = (target + 1) % len(stubs)
                        self._stop.wait(0.01)  # a client's retry pace, not a wait for a state
                        continue
                    with self._lock:
                        self.acked.append(Ack(n, seq, key, reply.id, reply.duplicate))
                    break
                seq += 1
        finally:
            for c in channels:
                c.close()


# --- (a) failover under load -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "rounds"),
    [
        pytest.param(signal.SIGKILL, 10, id="kill-9"),
        pytest.param(signal.SIGTERM, 4, id="sigterm"),
    ],
)
def test_failover_under_load_loses_no_acknowledged_task(
    tmp_path: Path, pg: Pg, slots: Slots, how: signal.Signals, rounds: int
) -> None:
    """The leader is killed (or stopped by SIGTERM) again and again under a keyed submit load
    with Python workers: each time the standby leads within the takeover bound, the killed
    server comes back as the new standby, and at the end every acknowledged submit exists once
    and succeeded with its output, no attempt ran twice, and each leader's ids carry a higher
    epoch than the one before."""
    pools = f'[[pools]]\nname = "default"\n{RETRY}\n'
    a, b = pair(slots, pg, pools)
    record = tmp_path / "ran.txt"
    workers = subprocess.Popen(
        [sys.executable, str(CHILD), str(record), a.grpc, b.grpc],
        stdout=subprocess.PIPE,
        text=True,
    )
    load = Load([a.grpc, b.grpc])
    try:
        assert workers.stdout is not None and workers.stdout.readline() == "started\n"
        load.start()
        epochs = [epoch_of(pg)]
        until(lambda: load.fresh(epochs[-1]) >= MIN_ACKS, "the first leader's acks")
        leader, standby = a, b
        takeovers: list[float] = []
        for _ in range(rounds):
            began = time.monotonic()
            leader.proc.send_signal(how)
            until(standby.ready, "the standby to lead", every=0.005)
            takeovers.append(time.monotonic() - began)
            code = leader.proc.wait(LONG)
            assert code == (-signal.SIGKILL if how == signal.SIGKILL else 0)
            epochs.append(epoch_of(pg))
            assert epochs[-1] > epochs[-2], epochs
            leader.start()  # back as the new standby, on the same ports
            until(leader.waiting, "the restarted server to stand by")
            until(lambda: load.fresh(epochs[-1]) >= MIN_ACKS, f"acks of epoch {epochs[-1]}")
            leader, standby = standby, leader
    finally:
        load.stop()
    print(f"\n{how.name} takeover (signal to /readyz 200): {distribution(takeovers)}")
    print(f"acknowledged submits: {len(load.acked)}, failed tries: {load.errors}")

    ids = [ack.id for ack in load.acked]
    unfinished = (
        "SELECT count(*) AS n FROM cronoq_tasks WHERE id = ANY($1::bigint[]) AND NOT terminal"
    )
    until(lambda: query(pg, unfinished, ids)[0][0] == 0, "every acknowledged task to end")
    workers.send_signal(signal.SIGTERM)
    assert workers.wait(LONG) == 0

    rows = query(
        pg,
        "SELECT id, key, status, output FROM cronoq_tasks WHERE id = ANY($1::bigint[])",
        ids,
    )
    by_id = {r[0]: r for r in rows}
    for ack in load.acked:
        row = by_id.get(ack.id)
        assert row is not None, f"acknowledged {ack} is not stored"
        assert row[1:3] == (ack.key, "succeeded"), (ack, row)
        assert row[3] == ack.key.encode()[::-1], "the output was not kept"
    twice = query(pg, "SELECT key FROM cronoq_tasks GROUP BY key HAVING count(*) > 1")
    assert twice == [], "a key was admitted twice"

    # Each thread submitted its keys in order, each after the previous one's answer: later
    # ids are greater, and new tasks carry the epoch of the leader that took them.
    for n in {ack.thread for ack in load.acked}:
        mine = [ack.id for ack in load.acked if ack.thread == n]
        assert mine == sorted(mine) and len(set(mine)) == len(mine)
    assert {ack.id >> 48 for ack in load.acked if not ack.duplicate} == set(epochs)
    assert epochs == sorted(set(epochs))

    ran = [tuple(map(int, line.split()[1:])) for line in record.read_text().splitlines()]
    repeated = sorted({r for r in ran if ran.count(r) > 1}) if len(set(ran)) < len(ran) else []
    assert repeated == [], f"(task, attempt) pairs that ran twice: {repeated[:10]}"
    assert set(ids) <= {task for task, _ in ran}

    bound = TAKEOVER_S * TIME_SCALE
    assert max(takeovers) <= bound, f"takeovers over {bound:g} s: {distribution(takeovers)}"


# --- (b) a deposed leader ----------------------------------------------------------------------


def test_a_deposed_leader_stands_by_in_the_same_process_and_leads_again(
    pg: Pg, slots: Slots
) -> None:
    """pg_terminate_backend of the leader's lock session: its worker gets shutdown{not_leader},
    its /readyz leaves 200, its calls answer UNAVAILABLE, its HTTP connections are closed (a
    request already received answered first), and the process stays up as a standby while the
    other server leads; once that one dies, the deposed process leads again."""
    pools = '[[pools]]\nname = "default"\n[[pools]]\nname = "idle"\n'
    a, b = pair(slots, pg, pools)
    assert a.server is not None
    worker = EchoWorker(a.grpc, slots=1)
    try:
        worker.registered.get(timeout=LONG)
        with grpc.insecure_channel(a.grpc) as ch:
            done = cronoq_pb2_grpc.TasksStub(ch).Submit(
                pb.SubmitRequest(task=pb.TaskSpec(key="before", payload=b"abc"), wait=True),
                timeout=LONG,
            )
        assert done.result.output == b"cba"
        waiting_id = submit(a.grpc, "waiting", pool="idle").id  # nobody runs this pool
        host, _, port = a.http.rpartition(":")
        held = socket.create_connection((host, int(port)), timeout=LONG)
        held.sendall(
            f"GET /v1/tasks/{waiting_id}/result?timeout_s=50 HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\n\r\n".encode()
        )

        asyncio.run(pgstore.end_lock_session(pg))  # as an operator would
        began = time.monotonic()
        until(lambda: worker.shutdown is not None, "the worker's shutdown")
        assert worker.shutdown is not None and worker.shutdown.not_leader
        until(lambda: not a.ready(), "the deposed leader's /readyz to leave 200")
        left = time.monotonic() - began
        a.server.wait_for(r"event=standing_by reason=.*lock connection")
        code = code_of(lambda: stub(a.grpc).Get(pb.GetRequest(task=pb.TaskRef(key="before"))))
        assert code is grpc.StatusCode.UNAVAILABLE

        # The wait is answered (503: the leadership went), then its connection closed, once
        # about a second old.
        answer = _read_until_closed(held, RECYCLE_BOUND_S * TIME_SCALE)
        assert answer.startswith(b"HTTP/1.1 503 ") and answer.count(b"HTTP/1.1") == 1
        held.close()

        until(b.ready, "the standby to lead")
        assert get(b.grpc, pb.TaskRef(key="before")).id == done.id
        until(a.waiting, "the deposed server to contend again, as a standby")
        assert a.proc.poll() is None
        print(f"\ndeposed leader: /readyz left 200 after {left * 1000:.0f} ms")
        assert left <= 15.0

        b.proc.kill()
        assert b.proc.wait(LONG) == -signal.SIGKILL
        until(a.ready, "the deposed process to lead again")
        a.server.wait_for("event=ready")
        again = submit(a.grpc, "after")
        assert again.id >> 48 == (done.id >> 48) + 2  # its epoch, the other's, its own again
        assert get(a.grpc, pb.TaskRef(key="before")).id == done.id
    finally:
        worker.stop()


def _read_until_closed(conn: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (fails after `timeout`)."""
    conn.settimeout(timeout)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


# --- (c) a paused leader ------------------------------------------------------------------------


def test_a_paused_leader_loses_the_leadership_on_waking_and_writes_nothing(
    pg: Pg, slots: Slots
) -> None:
    """SLOW (about 15 s): the leader is paused (SIGSTOP) for longer than the keeper's 10 s
    timeout. Paused, it still holds the lock (its kernel keeps the session alive), so the
    standby does not lead. On waking, having answered no probe for 10 s, it loses the
    leadership before it writes anything: neither the completion its worker sent meanwhile nor
    a submit that arrived meanwhile is written or acknowledged. It stands by, the standby leads
    and runs the attempt again."""
    a, b = pair(slots, pg)
    assert a.server is not None
    worker = EchoWorker(a.grpc, slots=1, hold=True)
    try:
        worker.registered.get(timeout=LONG)
        held_id = submit(a.grpc, "held", b"payload").id
        lease = worker.held.get(timeout=LONG)
        assert (lease.task_id, lease.attempt) == (held_id, 1)

        a.proc.send_signal(signal.SIGSTOP)
        until(lambda: stopped(a.proc.pid), "the pause to take effect", every=0.001)
        paused_at = time.monotonic()
        worker.complete(lease, b"from the paused leader")  # waits in its socket
        late: list[BaseException | pb.SubmitResponse] = []

        def late_submit() -> None:
            try:
                late.append(submit(a.grpc, "paused"))
            except grpc.RpcError as e:
                late.append(e)

        submitter = threading.Thread(target=late_submit, daemon=True)
        submitter.start()
        while time.monotonic() - paused_at < KEEPER_TIMEOUT_S + 1.0:  # the pause itself
            assert readyz(b.http) == (503, ANOTHER_LEADS), "the standby led during the pause"
            time.sleep(0.5)
        a.proc.send_signal(signal.SIGCONT)

        a.server.wait_for(r"event=standing_by reason=.*no probe answered for 10 s")
        submitter.join(LONG)
        assert len(late) == 1 and isinstance(late[0], grpc.RpcError), late
        print(f"\na submit sent during the pause: {late[0].code()} {late[0].details()!r}")
        until(b.ready, "the standby to lead once the paused leader let go")
        assert query(pg, "SELECT id FROM cronoq_tasks WHERE key = 'paused'") == []
        row = query(pg, "SELECT status, attempt FROM cronoq_tasks WHERE id = $1", held_id)[0]
        assert row != ("succeeded", 1), "the paused leader wrote its worker's completion"

        rerun = EchoWorker(b.grpc, slots=1)
        try:
            result = wait(b.grpc, held_id)
            assert (result.status, result.output) == (pb.TASK_STATUS_SUCCEEDED, b"daolyap")
            assert rerun.seen == [(held_id, 2)]
        finally:
            rerun.stop()
        until(a.waiting, "the woken server to stand by")
        assert a.proc.poll() is None
    finally:
        worker.stop()


# --- (d) attempts lost in a failover -------------------------------------------------------------


def test_an_attempt_running_at_the_takeover_is_retried_and_a_last_one_dead_lettered(
    pg: Pg, slots: Slots
) -> None:
    """Attempts the killed leader had handed out count as lost: a task with attempts left runs
    again as attempt 2 (after its pool's retry backoff), one whose last attempt was lost ends
    DEAD_LETTERED with the failover message."""
    pools = (
        '[[pools]]\nname = "twice"\n'
        "retry = { max_attempts = 2, initial_backoff_s = 0.05, jitter = false }\n"
        '[[pools]]\nname = "once"\nretry = { max_attempts = 1 }\n'
    )
    a, b = pair(slots, pg, pools)
    holders = [EchoWorker(a.grpc, slots=1, pool=p, hold=True) for p in ("twice", "once")]
    try:
        for h in holders:
            h.registered.get(timeout=LONG)
        twice = submit(a.grpc, "twice", b"again", pool="twice").id
        once = submit(a.grpc, "once", b"last", pool="once").id
        assert [h.held.get(timeout=LONG).attempt for h in holders] == [1, 1]

        a.proc.kill()
        until(b.ready, "the standby to lead")
        rerun = EchoWorker(b.grpc, slots=1, pool="twice")
        try:
            result = wait(b.grpc, twice)
            assert (result.status, result.output) == (pb.TASK_STATUS_SUCCEEDED, b"niaga")
            assert rerun.seen == [(twice, 2)]
        finally:
            rerun.stop()
        lost = wait(b.grpc, once)
        assert (lost.status, lost.message) == (
            pb.TASK_STATUS_DEAD_LETTERED,
            "attempt lost in failover; retries exhausted",
        )
        assert get(b.grpc, pb.TaskRef(id=once)).attempt == 1
    finally:
        for h in holders:
            h.stop()


# --- (e) two schemas ---------------------------------------------------------------------------


def test_two_schemas_of_one_database_have_their_own_leaders_and_keys(
    pg: Pg, pg_cluster: Any, slots: Slots
) -> None:
    other = dataclasses.replace(pg, schema=pg_cluster.schema())  # type: ignore[type-var]
    x, y = slots.add(pg), slots.add(other)
    x.start()
    y.start()
    until(x.ready, "the first schema's leader")
    until(y.ready, "the second schema's leader")
    first, second = submit(x.grpc, "shared", b"x"), submit(y.grpc, "shared", b"y")
    assert not first.duplicate and not second.duplicate, "a key was shared across schemas"
    assert get(x.grpc, pb.TaskRef(key="shared")).id == first.id
    assert get(y.grpc, pb.TaskRef(key="shared")).id == second.id
    assert query(pg, "SELECT key FROM cronoq_tasks") == [("shared",)]
    assert query(other, "SELECT key FROM cronoq_tasks") == [("shared",)]
    locks = query(
        pg,
        "SELECT n.nspname FROM pg_locks AS l JOIN pg_namespace AS n ON n.oid = l.objid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 "
        "AND n.nspname = ANY($2::text[])",
        pgstore.LOCK_CLASS,
        [pg.schema, other.schema],
    )
    assert sorted(r[0] for r in locks) == sorted([pg.schema, other.schema])


# --- (f) connection recycling -------------------------------------------------------------------


def _connect(http_address: str) -> socket.socket:
    host, _, port = http_address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=LONG)


def _ask(conn: socket.socket, path: str = "/readyz") -> bytes:
    """One keep-alive request on `conn`, and its answer (the probes' bodies are short)."""
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith((b"ready", b"standby")):
        chunk = conn.recv(65536)
        assert chunk, f"closed before the answer: {data!r}"
        data += chunk
    return data


def test_a_standby_closes_its_http_connections_and_a_leader_keeps_them(
    pg: Pg, slots: Slots
) -> None:
    leader, standby = pair(slots, pg)
    opened = time.monotonic()
    used, idle = _connect(standby.http), _connect(standby.http)
    assert _ask(used).startswith(b"HTTP/1.1 503 ")
    assert _read_until_closed(used, RECYCLE_BOUND_S * TIME_SCALE) == b""
    used_for = time.monotonic() - opened
    assert _read_until_closed(idle, RECYCLE_BOUND_S * TIME_SCALE) == b""
    idle_for = time.monotonic() - opened
    print(f"\nstandby connections closed after {used_for:.2f} s (used), {idle_for:.2f} s (idle)")
    assert 0.9 <= used_for <= RECYCLE_BOUND_S * TIME_SCALE
    assert used_for <= RECYCLE_BOUND_S * TIME_SCALE and idle_for <= RECYCLE_BOUND_S * TIME_SCALE
    used.close()
    idle.close()

    kept, quiet = _connect(leader.http), _connect(leader.http)
    opened = time.monotonic()
    while time.monotonic() - opened < RECYCLE_BOUND_S:  # longer than a standby keeps one
        answer = _ask(kept)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in answer
        time.sleep(0.25)
    assert _ask(quiet).startswith(b"HTTP/1.1 200 "), "the leader closed an idle connection"
    kept.close()
    quiet.close()

    # Half-sent requests on the standby (headers, a body) hold nothing up: it leads at once.
    slow_headers, slow_body = _connect(standby.http), _connect(standby.http)
    slow_headers.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.")
    slow_body.sendall(b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
    began = time.monotonic()
    leader.proc.kill()
    until(standby.ready, "the standby to lead", every=0.005)
    took = time.monotonic() - began
    print(f"takeover with half-sent requests open on the standby: {took * 1000:.0f} ms")
    assert took <= TAKEOVER_S * TIME_SCALE
    slow_headers.close()
    slow_body.close()


# --- stopping a standby -------------------------------------------------------------------------


def test_a_standby_stops_within_5_s_of_sigterm_also_while_the_database_is_down(
    pg: Pg, slots: Slots
) -> None:
    _, standby = pair(slots, pg)
    down = slots.add(pg, url=f"postgresql://cronoq@127.0.0.1:{free_port()}/cronoq")
    unreachable = down.start()
    unreachable.wait_for(r"cannot connect .*retrying in")
    took = []
    for slot in (standby, down):
        assert slot.server is not None
        began = time.monotonic()
        assert slot.server.terminate(LONG) == 0
        took.append(time.monotonic() - began)
        assert any("event=stopped" in line for line in slot.server.lines)
    print(
        f"\nstandbys stopped {took[0]:.2f} s after SIGTERM (waiting for the lock), "
        f"{took[1]:.2f} s (waiting for the database)"
    )
    assert max(took) <= 5.0 * TIME_SCALE


# --- the database down at start-up ----------------------------------------------------------------


def test_a_server_whose_database_is_down_binds_stands_by_and_leads_once_it_is_up(
    pg: Pg, slots: Slots
) -> None:
    proxy = TcpProxy(pgstore.address(pg.url))
    secret = "not-a-real-password"  # (the test server trusts every local connection)
    url = f"postgresql://cronoq:{secret}@127.0.0.1:{proxy.port}/cronoq"
    slot = slots.add(pg, url=url)
    server = slot.start()
    try:
        server.wait_for(r"event=listening http=")
        server.wait_for(r"cannot connect .*retrying in 0\.5 s")
        server.wait_for(r"cannot connect .*retrying in 1\.0 s")
        status, reason = readyz(slot.http)
        assert status == 503 and reason is not None
        assert reason.startswith("database unreachable: "), reason
        code = code_of(lambda: stub(slot.grpc).Get(pb.GetRequest(task=pb.TaskRef(id=1))))
        assert code is grpc.StatusCode.UNAVAILABLE

        proxy.start()
        until(slot.ready, "the server to lead once the database is up")
        assert not submit(slot.grpc, "up").duplicate
        server.terminate(LONG)
        assert not [line for line in server.lines if secret in line]
    finally:
        proxy.stop()
