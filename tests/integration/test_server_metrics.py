"""`/metrics` of a `cronoq-server` process after real traffic (docs/http.md, "Metrics").

One server with five pools, listed out of alphabetical order so that "configuration order" is
visible, and raw worker streams (helpers/workers.py) that take every lease by hand, so each
figure follows from what the module fixture did: tasks that succeed, fail, are retried, time
out, lose their lease, are cancelled, shed or still wait, one attempt still running, and a
completion for a lease the worker no longer holds. The fixture then scrapes `/metrics` once;
each test checks families of that one scrape, parsed with prometheus_client's parser: name,
type, label names, samples per pool in configuration order, and the values the traffic implies.
Two tests scrape again for figures that only come with time (the autoscaler's target, the
cost), polling until they show instead of sleeping for a guessed time.

The published families are pinned by name, type and label names (PUBLISHED); our task-queue
families (NEW: the wait and attempt-duration histograms, the ready-queue gauges, the per-pool
retry and dead-letter counters) are checked beside them, by counts the traffic implies rather
than by how long anything took.
"""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc
from helpers.servers import PORT0, Serving, serving_process
from helpers.workers import Worker

TTL = 0.5  # the lease TTL of pool "ttl": its one lease expires on purpose
ONCE = "retry = { max_attempts = 1 }\n"
CONFIG = PORT0 + "".join(
    [
        # the worked pool: two attempts per task, no backoff, a fixed size (the pools but alpha
        # and idle do not autoscale: their desired size is their capacity)
        '[[pools]]\nname = "zeta"\nautoscale = false\n'
        "retry = { max_attempts = 2, initial_backoff_s = 0, jitter = false }\n",
        # no worker: its tasks stay pending, and the autoscaler wants capacity for them
        '[[pools]]\nname = "alpha"\nmax = 4\nautoscale = true\n',
        f'[[pools]]\nname = "ttl"\nautoscale = false\nlease_ttl_s = {TTL}\n{ONCE}',
        '[[pools]]\nname = "shed"\nautoscale = false\nmax_pending = 1\noverflow = "shed_oldest"\n',
        # a labelled worker whose label value needs escaping, never a task; a price per slot
        # second (charged with or without autoscaling)
        '[[pools]]\nname = "idle"\nautoscale = true\ncost_per_worker_second = 1.0\n',
    ]
)
POOLS = ["zeta", "alpha", "ttl", "shed", "idle"]
ODD_LABEL = 'a"b\\c'  # a quote and a backslash: escaped in the text, read back as is

# What the fixture's traffic adds up to (the comments in `traffic` count them).
SUBMITTED = 14
DISPATCHED = 9
ENDED = {
    "succeeded": 4,
    "failed": 1,
    "dead_lettered": 2,
    "cancelled": 1,
    "skipped": 0,
    "missed": 0,
    "shed": 1,
}

# The families of the published cronoq-server 0.2.1 plus our earlier ones: (type, label names).
# Dashboards rely on them; nothing here may change.
PUBLISHED: dict[str, tuple[str, list[str]]] = {
    "cronoq_up": ("gauge", []),
    "cronoq_leader": ("gauge", []),
    **{
        name: ("gauge", ["pool"])
        for name in (
            "cronoq_pool_workers",
            "cronoq_pool_desired_workers",
            "cronoq_pool_busy_workers",
            "cronoq_pool_held_workers",
            "cronoq_pool_workers_connected",
            "cronoq_pool_reservations",
            "cronoq_pool_dispatched_window",
            "cronoq_pool_succeeded",
            "cronoq_pool_failed",
            "cronoq_pool_priority_adherence",
            "cronoq_pool_fixed_start_hit_rate",
            "cronoq_pool_utilization",
            "cronoq_pool_schedule_efficiency",
        )
    },
    "cronoq_pool_pending": ("gauge", ["pool", "class"]),
    "cronoq_pool_wait_seconds": ("gauge", ["pool", "quantile"]),
    "cronoq_pool_cost_total": ("counter", ["pool"]),
    "cronoq_group_capacity": ("gauge", ["pool", "labels"]),
    "cronoq_group_busy": ("gauge", ["pool", "labels"]),
    "cronoq_workers_connected": ("gauge", []),
    "cronoq_live_tasks": ("gauge", []),
    "cronoq_running_tasks": ("gauge", []),
    "cronoq_pending_tasks": ("gauge", []),
    "cronoq_tasks_total": ("counter", ["status"]),
    **{
        name: ("counter", [])
        for name in (
            "cronoq_tasks_submitted_total",
            "cronoq_attempts_dispatched_total",
            "cronoq_retries_total",
            "cronoq_timeouts_total",
            "cronoq_lease_expiries_total",
            "cronoq_stale_completions_total",
        )
    },
}
# Our task-queue families, exposed after the published ones (docs/http.md, "Task queue metrics").
NEW: dict[str, tuple[str, list[str]]] = {
    "cronoq_pool_queue_wait_seconds": ("histogram", ["pool", "class"]),
    "cronoq_pool_attempt_duration_seconds": ("histogram", ["pool", "class", "outcome"]),
    "cronoq_pool_ready_tasks": ("gauge", ["pool", "class"]),
    "cronoq_pool_oldest_ready_age_seconds": ("gauge", ["pool", "class"]),
    "cronoq_pool_retries_total": ("counter", ["pool"]),
    "cronoq_pool_dead_lettered_total": ("counter", ["pool"]),
    "cronoq_pool_paused": ("gauge", ["pool"]),
    "cronoq_pool_unserved": ("gauge", ["pool"]),
}
CLASSES = ["critical", "high", "normal", "low"]
LE = [
    "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5",
    "5.0", "10.0", "30.0", "60.0", "120.0", "300.0", "600.0", "1800.0", "3600.0", "+Inf",
]  # fmt: skip

OLD_NAMES = [
    "cronoq_pool_capacity",
    "cronoq_pool_desired",
    "cronoq_pool_busy",
    "cronoq_pool_held",
    "cronoq_pool_dispatched",
    "cronoq_pool_cost",
    "cronoq_tasks_live",
    "cronoq_tasks_running",
    "cronoq_tasks_pending",
]


@dataclass
class Scrape:
    content_type: str
    text: str
    families: dict[str, tuple[str, list[Sample]]]  # exposed family name -> (type, samples)


def scrape(http_address: str) -> Scrape:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=30) as r:
        content_type, text = r.headers["Content-Type"], r.read().decode()
    families = {}
    for f in text_string_to_metric_families(text):
        # The parser drops a counter's `_total`; dashboards know the family by its samples'
        # name, as the text's HELP and TYPE lines write it.
        name = f.name + "_total" if f.type == "counter" else f.name
        assert name not in families, name
        families[name] = (f.type, f.samples)
    return Scrape(content_type, text, families)


WAIT = 30.0  # the longest wait for a server message: only a hung server gets near it


async def register(w: Worker, pool: str, slots: int, **labels: str) -> None:
    reg = pb.Register(pool=pool, slots=slots, worker_name=pool, protocol_version=3, labels=labels)
    w.send(register=reg)
    assert (await w.recv(WAIT)).WhichOneof("msg") == "registered"


async def lease_of(w: Worker) -> pb.Lease:
    msg = await w.recv(WAIT)
    assert msg.WhichOneof("msg") == "lease", msg
    return msg.lease


async def traffic(serving: Serving) -> Scrape:
    """Run the traffic, then scrape while its worker streams are still connected."""
    async with grpc.aio.insecure_channel(serving.address) as channel:
        tasks = cronoq_pb2_grpc.TasksStub(channel)

        async def submit(pool: str, **spec: object) -> int:
            got = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool=pool, **spec)))
            return int(got.id)

        async def ended(tid: int) -> int:
            result = await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=tid)))
            return int(result.status)

        w = Worker(channel)
        await register(w, "zeta", 2)
        # 1 submitted, 1 dispatched: times out, dead-lettered (one attempt only)
        tid = await submit("zeta", timeout_s=0.2, retry=pb.RetryPolicy(max_attempts=1))
        lease = await lease_of(w)
        abort = await w.recv(WAIT)
        assert abort.WhichOneof("msg") == "abort" and abort.abort.lease == lease.lease, abort
        assert await ended(tid) == pb.TASK_STATUS_DEAD_LETTERED
        # a stale completion: the lease ended with the timeout. Reports on one stream are
        # handled in order, so the completions below show this one was counted.
        w.send(complete=pb.Complete(lease=lease.lease))
        # 3 submitted, 3 dispatched, 3 succeeded
        for _ in range(3):
            tid = await submit("zeta")
            w.send(complete=pb.Complete(lease=(await lease_of(w)).lease))
            assert await ended(tid) == pb.TASK_STATUS_SUCCEEDED
        # 1 submitted, 2 dispatched, 1 retry, 1 succeeded
        tid = await submit("zeta")
        w.send(fail=pb.Fail(lease=(await lease_of(w)).lease, message="again"))
        again = await lease_of(w)
        assert (again.task_id, again.attempt) == (tid, 2)
        w.send(complete=pb.Complete(lease=again.lease))
        assert await ended(tid) == pb.TASK_STATUS_SUCCEEDED
        # 1 submitted, 1 dispatched, 1 failed
        tid = await submit("zeta")
        lease = await lease_of(w)
        w.send(fail=pb.Fail(lease=lease.lease, message="no", permanent=True))
        assert await ended(tid) == pb.TASK_STATUS_FAILED
        # 1 submitted, 1 dispatched, still running at the scrape (the lease TTL is 30 s)
        tid = await submit("zeta")
        assert (await lease_of(w)).task_id == tid

        # 1 submitted, 1 dispatched: the lease expires, dead-lettered
        w2 = Worker(channel)
        await register(w2, "ttl", 1)
        tid = await submit("ttl")
        lease = await lease_of(w2)
        abort = await w2.recv(WAIT)
        assert abort.WhichOneof("msg") == "abort" and abort.abort.lease == lease.lease, abort
        assert await ended(tid) == pb.TASK_STATUS_DEAD_LETTERED

        # 4 submitted: 2 high and 1 low pending, 1 cancelled
        for priority in (pb.PRIORITY_HIGH, pb.PRIORITY_HIGH, pb.PRIORITY_LOW):
            await submit("alpha", priority=priority)
        tid = await submit("alpha")
        assert (await tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(id=tid)))).cancelled
        # 2 submitted: the second sheds the first, a low one (max_pending 1), and waits
        first = await submit("shed", priority=pb.PRIORITY_LOW)
        await submit("shed")
        assert await ended(first) == pb.TASK_STATUS_SHED

        w3 = Worker(channel)
        await register(w3, "idle", 3, note=ODD_LABEL)
        # paused by an operator; it has no task, so no other figure changes
        ops = cronoq_pb2_grpc.OperationsStub(channel)
        assert (await ops.PausePool(pb.PoolRequest(pool="idle"))).paused
        return await asyncio.to_thread(scrape, serving.http_address)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serving, Scrape]]:
    with serving_process(tmp_path_factory.mktemp("metrics"), CONFIG) as serving:
        yield serving, asyncio.run(asyncio.wait_for(traffic(serving), 120))


@pytest.fixture
def metrics(served: tuple[Serving, Scrape]) -> Scrape:
    return served[1]


def family(m: Scrape, name: str, kind: str, labels: list[str]) -> list[Sample]:
    """The samples of one exposed family, after checking its type, its HELP line and that
    every sample is named after it and carries exactly `labels`."""
    assert name in m.families, f"{name} missing from {sorted(m.families)}"
    got_kind, samples = m.families[name]
    assert got_kind == kind, name
    assert f"# TYPE {name} {kind}\n" in m.text
    help_line = next(line for line in m.text.splitlines() if line.startswith(f"# HELP {name} "))
    assert len(help_line) > len(f"# HELP {name} "), name
    for s in samples:
        assert s.name == name and sorted(s.labels) == sorted(labels), s
    return samples


def per_pool(m: Scrape, name: str, kind: str = "gauge") -> dict[str, float]:
    """A family with one sample per pool, checked to list the pools in configuration order."""
    samples = family(m, name, kind, ["pool"])
    assert [s.labels["pool"] for s in samples] == POOLS, name
    return {s.labels["pool"]: s.value for s in samples}


def scrape_until(
    serving: Serving, name: str, kind: str, ok: Callable[[dict[str, float]], bool]
) -> dict[str, float]:
    """Scrape until the per-pool family `name` satisfies `ok`; its last values."""
    end = time.monotonic() + 60  # only a safety net for a hung server
    while not ok(values := per_pool(scrape(serving.http_address), name, kind)):
        assert time.monotonic() < end, values
        time.sleep(0.05)  # between two checks of the condition, not a wait for it
    return values


def single(m: Scrape, name: str, kind: str) -> float:
    (s,) = family(m, name, kind, [])
    return s.value


# --- the exposition ---------------------------------------------------------------------------


def test_content_type_and_every_family_typed(metrics: Scrape) -> None:
    assert metrics.content_type == "text/plain; version=0.0.4; charset=utf-8"
    helps = [line.split()[2] for line in metrics.text.splitlines() if line.startswith("# HELP")]
    types = [line.split()[2] for line in metrics.text.splitlines() if line.startswith("# TYPE")]
    assert helps == types == list(metrics.families)


def test_no_old_name_or_label_is_exported(metrics: Scrape) -> None:
    for name in OLD_NAMES:
        assert name not in metrics.families
        assert f"{name}{{" not in metrics.text and f"{name} " not in metrics.text
    published = {k for name in PUBLISHED for s in metrics.families[name][1] for k in s.labels}
    assert published == {"pool", "class", "quantile", "status", "labels"}
    labels = {k for _, samples in metrics.families.values() for s in samples for k in s.labels}
    assert labels == published | {"outcome", "le"}  # the new histograms' own


def test_published_families_unchanged_and_new_ones_beside_them(metrics: Scrape) -> None:
    """Every published family keeps its name, type and label names, in the published order;
    the new families follow them and are all there is besides."""
    assert list(metrics.families) == [*PUBLISHED, *NEW]
    for name, (kind, labels) in PUBLISHED.items():
        family(metrics, name, kind, labels)


# --- per pool -----------------------------------------------------------------------------------


def test_pool_workers_is_the_granted_slots(metrics: Scrape) -> None:
    assert per_pool(metrics, "cronoq_pool_workers") == {
        "zeta": 2,
        "alpha": 0,
        "ttl": 1,
        "shed": 0,
        "idle": 3,
    }


def test_pool_workers_connected(metrics: Scrape) -> None:
    connected = per_pool(metrics, "cronoq_pool_workers_connected")
    assert connected == {"zeta": 1, "alpha": 0, "ttl": 1, "shed": 0, "idle": 1}


def test_pool_desired_workers_per_pool(served: tuple[Serving, Scrape]) -> None:
    serving, metrics = served
    desired = per_pool(metrics, "cronoq_pool_desired_workers")
    assert all(v >= 0 for v in desired.values())
    # Without autoscaling the target is the capacity itself.
    assert desired["zeta"] == 2 and desired["ttl"] == 1 and desired["shed"] == 0
    # The autoscaler evaluates alpha's backlog once a second: it asks for capacity soon.
    want = scrape_until(serving, "cronoq_pool_desired_workers", "gauge", lambda v: v["alpha"] >= 1)
    assert want["alpha"] <= 4  # the pool's max


def test_pool_busy_and_held_workers(metrics: Scrape) -> None:
    assert per_pool(metrics, "cronoq_pool_busy_workers") == dict.fromkeys(POOLS, 0) | {"zeta": 1}
    assert per_pool(metrics, "cronoq_pool_held_workers") == dict.fromkeys(POOLS, 0)
    assert per_pool(metrics, "cronoq_pool_reservations") == dict.fromkeys(POOLS, 0)


def test_pool_dispatched_window(metrics: Scrape) -> None:
    dispatched = per_pool(metrics, "cronoq_pool_dispatched_window")
    assert dispatched == dict.fromkeys(POOLS, 0) | {"zeta": 8, "ttl": 1}


def test_pool_succeeded_and_failed_in_the_window(metrics: Scrape) -> None:
    assert per_pool(metrics, "cronoq_pool_succeeded") == dict.fromkeys(POOLS, 0) | {"zeta": 4}
    # attempts: zeta's timeout, retried failure and permanent failure; ttl's lost lease
    failed = per_pool(metrics, "cronoq_pool_failed")
    assert failed == dict.fromkeys(POOLS, 0) | {"zeta": 3, "ttl": 1}


def test_pool_ratios(metrics: Scrape) -> None:
    for name in (
        "cronoq_pool_priority_adherence",
        "cronoq_pool_fixed_start_hit_rate",
        "cronoq_pool_utilization",
        "cronoq_pool_schedule_efficiency",
    ):
        for pool, v in per_pool(metrics, name).items():
            assert math.isnan(v) or 0 <= v <= 1, (name, pool, v)
    assert per_pool(metrics, "cronoq_pool_utilization")["zeta"] > 0


def test_pool_pending_by_class(metrics: Scrape) -> None:
    samples = family(metrics, "cronoq_pool_pending", "gauge", ["pool", "class"])
    classes = ["critical", "high", "normal", "low"]
    assert [(s.labels["pool"], s.labels["class"]) for s in samples] == [
        (p, c) for p in POOLS for c in classes
    ]
    pending = {(s.labels["pool"], s.labels["class"]): s.value for s in samples}
    expected = dict.fromkeys(pending, 0) | {
        ("alpha", "high"): 2,
        ("alpha", "low"): 1,
        ("shed", "normal"): 1,
    }
    assert pending == expected


def test_pool_wait_seconds_quantiles(metrics: Scrape) -> None:
    samples = family(metrics, "cronoq_pool_wait_seconds", "gauge", ["pool", "quantile"])
    assert [(s.labels["pool"], s.labels["quantile"]) for s in samples] == [
        (p, q) for p in POOLS for q in ("0.5", "0.9", "0.99")
    ]
    assert all(math.isnan(s.value) or s.value >= 0 for s in samples)


def test_pool_cost_total_is_a_counter(served: tuple[Serving, Scrape]) -> None:
    serving, metrics = served
    cost = per_pool(metrics, "cronoq_pool_cost_total", "counter")
    assert cost["alpha"] == cost["ttl"] == cost["shed"] == 0  # no price
    # idle's worker was connected for a while: 3 slots at 1.0 a slot second
    later = scrape_until(serving, "cronoq_pool_cost_total", "counter", lambda v: v["idle"] > 0)
    assert all(later[p] >= cost[p] for p in POOLS)  # a counter never goes down


def test_worker_groups_with_an_escaped_label_value(metrics: Scrape) -> None:
    assert 'note=a\\"b\\\\c' in metrics.text  # the exposition escapes `"` and `\`
    for name, slots in (("cronoq_group_capacity", 3), ("cronoq_group_busy", 0)):
        samples = family(metrics, name, "gauge", ["pool", "labels"])
        groups = {(s.labels["pool"], s.labels["labels"]): s.value for s in samples}
        assert groups[("idle", f"note={ODD_LABEL}")] == slots


# --- the whole server -------------------------------------------------------------------------


def test_task_and_worker_gauges(metrics: Scrape) -> None:
    assert single(metrics, "cronoq_workers_connected", "gauge") == 3
    assert single(metrics, "cronoq_live_tasks", "gauge") == 5  # 3 + 1 pending, 1 running
    assert single(metrics, "cronoq_running_tasks", "gauge") == 1
    assert single(metrics, "cronoq_pending_tasks", "gauge") == 4


def test_tasks_total_by_terminal_status(metrics: Scrape) -> None:
    samples = family(metrics, "cronoq_tasks_total", "counter", ["status"])
    assert {s.labels["status"]: s.value for s in samples} == ENDED
    assert len(samples) == 7


def test_unlabelled_counters(metrics: Scrape) -> None:
    assert single(metrics, "cronoq_tasks_submitted_total", "counter") == SUBMITTED
    assert single(metrics, "cronoq_attempts_dispatched_total", "counter") == DISPATCHED
    assert single(metrics, "cronoq_retries_total", "counter") == 1
    assert single(metrics, "cronoq_timeouts_total", "counter") == 1
    assert single(metrics, "cronoq_lease_expiries_total", "counter") == 1
    assert single(metrics, "cronoq_stale_completions_total", "counter") == 1


def test_up_and_leader(metrics: Scrape) -> None:
    assert single(metrics, "cronoq_up", "gauge") == 1
    assert single(metrics, "cronoq_leader", "gauge") == 1


# --- the task-queue families ----------------------------------------------------------------


def histogram(m: Scrape, name: str, labels: list[str]) -> dict[tuple[str, ...], Hist]:
    """The series of one histogram family by label values (without `le`), each checked to have
    the documented buckets, cumulative, with the +Inf bucket equal to the count."""
    assert name in m.families, name
    kind, samples = m.families[name]
    assert kind == "histogram" and f"# TYPE {name} histogram\n" in m.text, name
    out: dict[tuple[str, ...], Hist] = {}
    for s in samples:
        key = tuple(s.labels[k] for k in labels)
        h = out.setdefault(key, Hist({}, math.nan, math.nan))
        if s.name == name + "_bucket":
            assert sorted(s.labels) == sorted([*labels, "le"]), s
            h.buckets[s.labels["le"]] = s.value
        else:
            assert sorted(s.labels) == sorted(labels), s
            if s.name == name + "_sum":
                h.sum = s.value
            else:
                assert s.name == name + "_count", s
                h.count = s.value
    for key, h in out.items():
        assert list(h.buckets) == LE, key
        counts = list(h.buckets.values())
        assert counts == sorted(counts) and counts[-1] == h.count, (key, counts)
        assert h.sum >= 0, key
    return out


@dataclass
class Hist:
    buckets: dict[str, float]  # le -> cumulative count
    sum: float
    count: float


def per_pool_class(m: Scrape, name: str) -> dict[tuple[str, str], float]:
    samples = family(m, name, "gauge", ["pool", "class"])
    keys = [(s.labels["pool"], s.labels["class"]) for s in samples]
    assert keys == [(p, c) for p in POOLS for c in CLASSES], name
    return {k: s.value for k, s in zip(keys, samples, strict=True)}


def test_queue_wait_histogram_counts_every_start(metrics: Scrape) -> None:
    waits = histogram(metrics, "cronoq_pool_queue_wait_seconds", ["pool", "class"])
    # every dispatch (DISPATCHED) is one observation: 8 in zeta, 1 in ttl, all normal
    assert {k: h.count for k, h in waits.items()} == {("zeta", "normal"): 8, ("ttl", "normal"): 1}
    assert sum(h.count for h in waits.values()) == DISPATCHED


def test_attempt_duration_histogram_by_outcome(metrics: Scrape) -> None:
    runs = histogram(metrics, "cronoq_pool_attempt_duration_seconds", ["pool", "class", "outcome"])
    assert {k: h.count for k, h in runs.items()} == {
        ("zeta", "normal", "succeeded"): 4,
        ("zeta", "normal", "failed"): 2,  # the retried attempt and the permanent failure
        ("zeta", "normal", "timed_out"): 1,
        ("ttl", "normal", "lease_expired"): 1,
    }  # the attempt still running has not ended: it is in none
    # an attempt ends by its timeout (0.2 s) or lease (TTL) no sooner than that after its start
    timed_out = runs["zeta", "normal", "timed_out"]
    assert timed_out.sum >= 0.2 and timed_out.buckets["0.1"] == 0
    expired = runs["ttl", "normal", "lease_expired"]
    assert expired.sum >= TTL and expired.buckets["0.25"] == 0


def test_ready_tasks_and_the_oldest_age(metrics: Scrape) -> None:
    ready = per_pool_class(metrics, "cronoq_pool_ready_tasks")
    # the same as pending here: no task waits on a dependency, a start time or a backoff
    assert ready == dict.fromkeys(ready, 0) | {
        ("alpha", "high"): 2,
        ("alpha", "low"): 1,
        ("shed", "normal"): 1,
    }
    age = per_pool_class(metrics, "cronoq_pool_oldest_ready_age_seconds")
    waiting = {k for k, n in ready.items() if n}
    assert all(age[k] == 0 for k in age if k not in waiting)
    assert all(age[k] >= 0 for k in waiting)
    # the high tasks were submitted before the low one: they have waited at least as long
    assert age["alpha", "high"] >= age["alpha", "low"]


def test_per_pool_retries_and_dead_letters(metrics: Scrape) -> None:
    retries = per_pool(metrics, "cronoq_pool_retries_total", "counter")
    dead = per_pool(metrics, "cronoq_pool_dead_lettered_total", "counter")
    assert retries == dict.fromkeys(POOLS, 0) | {"zeta": 1}
    assert dead == dict.fromkeys(POOLS, 0) | {"zeta": 1, "ttl": 1}
    # per pool, the published whole-server counters split up
    assert sum(retries.values()) == single(metrics, "cronoq_retries_total", "counter")
    assert sum(dead.values()) == ENDED["dead_lettered"]


def test_pool_paused_and_unserved(metrics: Scrape) -> None:
    """Unserved: tasks pending and no capacity at all (alpha and shed have no worker; idle has
    one but nothing to do). Paused: idle, by Operations/PausePool."""
    assert per_pool(metrics, "cronoq_pool_unserved") == dict.fromkeys(POOLS, 0) | {
        "alpha": 1,
        "shed": 1,
    }
    assert per_pool(metrics, "cronoq_pool_paused") == dict.fromkeys(POOLS, 0) | {"idle": 1}
