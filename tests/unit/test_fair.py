"""Unit tests of the fair-share class queue at the queue level
(docs/overflow-and-fairness.md, "Tenants and fair share").

A single slot is played by repeatedly taking `fifo_head()` (`take` = dispatch). A naive O(n)
reference of the same rules checks the heap implementation on random operation sequences.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from heapq import heappop

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core import fair
from cronoq.core.fair import FairClassQueue
from cronoq.core.model import TaskRecord


class Maker:
    """Builds task records with increasing `seq` (submission order)."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(
        self, tenant: str | None, eligible_at: float = 0.0, latest_start: float | None = None
    ) -> TaskRecord:
        self.seq += 1
        rec = TaskRecord(None, "p", tenant=tenant)
        rec.id = rec.seq = self.seq
        rec.eligible_at = eligible_at
        rec.latest_start = latest_start
        return rec


def letter(rec: TaskRecord) -> str:
    return "n" if rec.tenant is None else rec.tenant


def dispatch(q: FairClassQueue, k: int | None = None) -> list[TaskRecord]:
    """Take the fair head `k` times (all when None), as a single slot would."""
    out: list[TaskRecord] = []
    while k is None or len(out) < k:
        rec = q.fifo_head()
        if rec is None:
            break
        q.take(rec)
        out.append(rec)
    return out


def trace(q: FairClassQueue, k: int | None = None) -> str:
    return "".join(letter(r) for r in dispatch(q, k))


# --- the traces of docs/overflow-and-fairness.md, "Tenants and fair share" ------------------------


def spec_queue(weights: Mapping[str, float], gate_first: bool) -> FairClassQueue:
    q = FairClassQueue(weights)
    mk = Maker()
    gate = mk(None)
    q.push(gate)
    if gate_first:
        assert q.fifo_head() is gate
        q.take(gate)
    for tenant, count in (("a", 12), ("b", 6), ("c", 3), (None, 3)):
        for _ in range(count):
            q.push(mk(tenant))
    if not gate_first:
        assert q.fifo_head() is gate
        q.take(gate)
    assert q.virtual_time(None) == 1.0
    return q


@pytest.mark.parametrize("gate_first", [True, False])
def test_trace_equal_weights(gate_first: bool) -> None:
    q = spec_queue({}, gate_first)
    assert q.n == 24
    assert trace(q) == "abcabcnabcnabnababaaaaaa"
    assert q.n == 0 and q.fifo_head() is None


@pytest.mark.parametrize("gate_first", [True, False])
def test_trace_weighted(gate_first: bool) -> None:
    q = spec_queue({"a": 3, "b": 1}, gate_first)
    assert trace(q) == "abcaaabcnaaabcnaaabnaabb"
    assert q.n == 0


def test_weighted_virtual_times_meet_exactly() -> None:
    q = FairClassQueue({"a": 3})
    mk = Maker()
    for _ in range(30):
        q.push(mk("a"))
    for k in range(1, 31):
        dispatch(q, 1)
        if k % 3 == 0:
            assert q.virtual_time("a") == k // 3


@pytest.mark.parametrize("bad", [0, -1, 0.0, math.nan, math.inf, -math.inf])
def test_bad_weights(bad: float) -> None:
    with pytest.raises(ValueError, match=r"^tenant weights must be finite and > 0$"):
        FairClassQueue({"a": 1.0, "b": bad})


def test_unlisted_tenants_and_untenanted_weigh_one() -> None:
    q = FairClassQueue({"a": 2.0})
    mk = Maker()
    for tenant in ("a", "b", None):
        for _ in range(4):
            q.push(mk(tenant))
    # a advances by 0.5 per dispatch, b and untenanted by 1.
    assert trace(q, 8) == "abnaabna"
    assert q.virtual_time("a") == 2.0
    assert q.virtual_time("b") == 2.0
    assert q.virtual_time(None) == 2.0


# --- discard, retry, idle tenants ----------------------------------------------------------------


def test_discard_does_not_advance_virtual_time() -> None:
    q = FairClassQueue({})
    mk = Maker()
    a = [mk("a") for _ in range(3)]
    b = [mk("b") for _ in range(3)]
    for r in a + b:
        q.push(r)
    assert q.fifo_head() is a[0]
    q.discard(a[0])
    assert q.n == 5
    assert q.virtual_time("a") == 0.0
    # a keeps its turn: its next task still comes first.
    assert q.fifo_head() is a[1]
    q.discard(b[1])  # not a head: nothing moves
    assert dispatch(q) == [a[1], b[0], a[2], b[2]]
    assert q.virtual_time("a") == 2.0 and q.virtual_time("b") == 2.0


def test_discard_last_task_makes_tenant_idle() -> None:
    q = FairClassQueue({})
    mk = Maker()
    a, b = mk("a"), mk("b")
    q.push(a)
    q.push(b)
    q.discard(a)
    assert q.fifo_head() is b
    q.discard(b)
    assert q.n == 0 and q.fifo_head() is None and q.dl_head() is None
    assert not q.fifo and not q.dl


def test_retried_task_keeps_its_place() -> None:
    q = FairClassQueue({})
    mk = Maker()
    a = [mk("a") for _ in range(3)]
    b = [mk("b") for _ in range(3)]
    for r in a + b:
        q.push(r)
    first = dispatch(q, 1)[0]
    assert first is a[0]
    # The attempt fails and the task is queued again with its original eligible_at and seq.
    gen = a[0].qgen
    q.push(a[0])
    assert a[0].qgen == gen + 1
    assert q.n == 6
    assert dispatch(q) == [b[0], a[0], b[1], a[1], b[2], a[2]]


def test_retried_task_of_idle_tenant() -> None:
    q = FairClassQueue({})
    mk = Maker()
    a0 = mk("a")
    bs = [mk("b") for _ in range(6)]
    q.push(a0)
    for r in bs:
        q.push(r)
    assert dispatch(q, 5) == [a0, *bs[:4]]
    assert q.virtual_time("a") == 1.0 and q.vnow == 3.0
    # a was idle while b ran: its retry re-enters at the system virtual time, with no credit.
    q.push(a0)
    assert q.virtual_time("a") == 3.0
    assert dispatch(q) == [a0, bs[4], bs[5]]


def test_idle_tenant_returning_gets_no_burst() -> None:
    q = FairClassQueue({})
    mk = Maker()
    for tenant in ("a", "b", "c"):
        q.push(mk(tenant))
    assert trace(q) == "abc"
    for _ in range(20):
        q.push(mk("a"))
        q.push(mk("b"))
    assert trace(q, 20) == "ab" * 10
    assert q.virtual_time("c") == 1.0 and q.virtual_time("a") == 11.0
    assert q.vnow == 10.0
    for _ in range(10):
        q.push(mk("c"))
    # Raised from 1 to the system virtual time 10: one turn to come level, then round robin.
    assert q.virtual_time("c") == 10.0
    assert trace(q, 9) == "cabcabcab"
    # A tenant never seen before enters the same way.
    for _ in range(5):
        q.push(mk("d"))
    assert q.virtual_time("d") == q.vnow
    assert trace(q, 8).count("d") <= 3


def test_new_tenant_after_long_run_gets_no_burst() -> None:
    q = FairClassQueue({})
    mk = Maker()
    for _ in range(100):
        q.push(mk("a"))
    dispatch(q, 50)
    for _ in range(10):
        q.push(mk("z"))
    assert trace(q, 10) == "zazazazaza"


# --- deadlines ----------------------------------------------------------------------------------


def test_dl_head_across_tenants() -> None:
    q = FairClassQueue({})
    mk = Maker()
    assert q.dl_head() is None
    plain = mk("a")
    q.push(plain)
    assert q.dl_head() is None and not q.dl
    b1 = mk("b", latest_start=50.0)
    c1 = mk("c", latest_start=20.0)
    n1 = mk(None, latest_start=30.0)
    a2 = mk("a", latest_start=20.0)  # same latest start as c1, submitted later
    for r in (b1, c1, n1, a2):
        q.push(r)
    assert q.dl
    assert q.dl_head() is c1
    # Fair order is untouched by deadlines.
    assert q.fifo_head() is plain
    # The engine dispatches the urgent task: its tenant pays for it.
    q.take(c1)
    assert q.virtual_time("c") == 1.0 and q.vnow == 0.0
    assert q.dl_head() is a2
    q.discard(a2)
    assert q.dl_head() is n1
    assert q.virtual_time("a") == 0.0
    q.take(n1)
    assert q.dl_head() is b1
    assert trace(q) == "ab"
    assert q.dl_head() is None


def test_take_of_non_head_task() -> None:
    q = FairClassQueue({})
    mk = Maker()
    a = [mk("a"), mk("a", latest_start=5.0), mk("a")]
    b = [mk("b"), mk("b")]
    for r in a + b:
        q.push(r)
    assert q.dl_head() is a[1]
    q.take(a[1])  # dispatched for urgency, not the head of a
    assert q.virtual_time("a") == 1.0
    assert dispatch(q) == [b[0], a[0], b[1], a[2]]


def test_ready_queues_fast_path_pop() -> None:
    # ReadyQueues.pop_best's single-class fast path pops q.fifo after fifo_head().
    q = FairClassQueue({})
    mk = Maker()
    for tenant in ("a", "a", "b", "b", None):
        q.push(mk(tenant))
    out = []
    while q.n:
        rec = q.fifo_head()
        assert rec is not None
        heappop(q.fifo)
        q.take(rec)
        out.append(letter(rec))
    assert "".join(out) == "abnab"


# --- overload shedding: oldest / newest ----------------------------------------------------------


def test_oldest_and_newest_across_tenants() -> None:
    q = FairClassQueue({})
    mk = Maker()
    assert q.oldest() is None and q.newest() is None
    a1 = mk("a", eligible_at=5.0)
    b1 = mk("b", eligible_at=3.0)
    n1 = mk(None, eligible_at=3.0)
    for r in (a1, b1, n1):
        q.push(r)
    # Built lazily on first use, then maintained.
    assert q.oldest() is b1 and q.newest() is n1
    a2 = mk("a", eligible_at=1.0)
    q.push(a2)
    assert q.oldest() is a2 and q.newest() is a2
    q.discard(a2)
    assert q.oldest() is b1 and q.newest() is n1
    assert q.fifo_head() is b1  # all level at 0: earliest head
    q.take(b1)
    assert q.oldest() is n1
    q.discard(n1)
    assert q.oldest() is a1 and q.newest() is a1
    q.take(a1)
    assert q.oldest() is None and q.newest() is None
    # A retried task is old again but not new.
    a3 = mk("a", eligible_at=9.0)
    q.push(a3)
    q.push(b1)
    assert q.oldest() is b1 and q.newest() is a3


# --- bounded memory -------------------------------------------------------------------------------


def test_stale_entries_are_compacted() -> None:
    q = FairClassQueue({})
    mk = Maker()
    keep_a = mk("a", latest_start=0.0)
    q.push(keep_a)
    q.push(mk("b"))
    assert q.oldest() is keep_a and q.newest() is not None
    for _ in range(5_000):
        # Cancelled behind a head that stays: entries die deep inside the heaps.
        r = mk("a", latest_start=1.0)
        q.push(r)
        q.discard(r)
        # A new head of a queued tenant: the group is re-filed with an ever smaller key, twice.
        r2 = mk("b", eligible_at=-float(r.seq))
        q.push(r2)
        q.discard(r2)
    assert q.n == 2
    limit = 2 * 2 + fair._SLACK
    assert len(q.dl) <= limit
    assert len(q.fifo) <= limit
    for grp in q._groups.values():
        assert len(grp.heap) <= limit
    assert q._age is not None and len(q._age) <= limit
    assert q._new is not None and len(q._new) <= limit
    assert q.fifo_head() is keep_a and q.dl_head() is keep_a


# --- scale -----------------------------------------------------------------------------------


def test_ten_thousand_tenants() -> None:
    q = FairClassQueue({f"t{i}": 1.0 + i % 3 for i in range(0, 10_000, 7)})
    mk = Maker()
    tenants = [f"t{i}" for i in range(10_000)]
    for t in tenants:
        for _ in range(10):
            q.push(mk(t))
    assert q.n == 100_000
    seen: set[str | None] = set()
    count = 0
    while True:
        rec = q.fifo_head()
        if rec is None:
            break
        q.take(rec)
        if count < 10_000:
            seen.add(rec.tenant)
        count += 1
    assert count == 100_000
    assert q.n == 0
    # The first round serves every tenant once (all start level at 0).
    assert len(seen) == 10_000


# --- model check against a naive reference -------------------------------------------------------


class RefQueue:
    """The same rules, computed by brute force over a list."""

    def __init__(self, weights: Mapping[str, float]) -> None:
        self.weights = dict(weights)
        self.queued: list[TaskRecord] = []
        self.base: dict[str | None, float] = {}
        self.count: dict[str | None, int] = {}
        self.vnow = 0.0

    def weight(self, tenant: str | None) -> float:
        return 1.0 if tenant is None else self.weights.get(tenant, 1.0)

    def vt(self, tenant: str | None) -> float:
        return self.base.get(tenant, 0.0) + self.count.get(tenant, 0) / self.weight(tenant)

    def push(self, rec: TaskRecord) -> None:
        t = rec.tenant
        if all(r.tenant != t for r in self.queued) and self.vt(t) < self.vnow:
            self.base[t] = self.vnow
            self.count[t] = 0
        self.queued.append(rec)

    def discard(self, rec: TaskRecord) -> None:
        self.queued.remove(rec)

    def take(self, rec: TaskRecord) -> None:
        self.queued.remove(rec)
        t = rec.tenant
        self.vnow = self.vt(t)
        self.count[t] = self.count.get(t, 0) + 1

    def fifo_head(self) -> TaskRecord | None:
        if not self.queued:
            return None
        return min(self.queued, key=lambda r: (self.vt(r.tenant), r.eligible_at, r.seq))

    def dl_head(self) -> TaskRecord | None:
        dl = [r for r in self.queued if r.latest_start is not None]
        if not dl:
            return None
        return min(dl, key=lambda r: (r.latest_start, r.seq))

    def oldest(self) -> TaskRecord | None:
        return min(self.queued, key=lambda r: (r.eligible_at, r.seq), default=None)

    def newest(self) -> TaskRecord | None:
        return max(self.queued, key=lambda r: r.seq, default=None)


TENANTS = [None, "a", "b", "c", "d"]

op_st = st.one_of(
    st.tuples(
        st.just("push"),
        st.sampled_from(TENANTS),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(0, 5)),
    ),
    st.tuples(
        st.sampled_from(["retry", "take", "take_dl", "take_any", "discard", "fast", "probe"])
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    weights=st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([0.5, 1.0, 2.0, 2.5, 3.0, 7.0]),
    ),
    ops=st.lists(op_st, max_size=120),
    slack=st.sampled_from([0, 3, fair._SLACK]),
    data=st.data(),
)
def test_matches_reference(
    weights: dict[str, float], ops: list[tuple[object, ...]], slack: int, data: st.DataObject
) -> None:
    saved = fair._SLACK  # a hypothesis test cannot take the function-scoped monkeypatch
    fair._SLACK = slack
    try:
        check_against_reference(weights, ops, data)
    finally:
        fair._SLACK = saved


def check_against_reference(
    weights: dict[str, float], ops: list[tuple[object, ...]], data: st.DataObject
) -> None:
    q = FairClassQueue(weights)
    ref = RefQueue(weights)
    mk = Maker()
    queued: list[TaskRecord] = []
    done: list[TaskRecord] = []  # dispatched, may be retried

    def remove(rec: TaskRecord, dispatched: bool) -> None:
        queued.remove(rec)
        if dispatched:
            q.take(rec)
            ref.take(rec)
            done.append(rec)
        else:
            q.discard(rec)
            ref.discard(rec)

    for op in ops:
        kind = op[0]
        if kind == "push":
            _, tenant, el, ls = op
            assert tenant is None or isinstance(tenant, str)
            assert isinstance(el, int)
            assert ls is None or isinstance(ls, int)
            rec = mk(tenant, float(el), None if ls is None else float(ls))
            q.push(rec)
            ref.push(rec)
            queued.append(rec)
        elif kind == "retry":
            if not done:
                continue
            rec = done.pop(data.draw(st.integers(0, len(done) - 1)))
            q.push(rec)
            ref.push(rec)
            queued.append(rec)
        elif kind == "take":
            head = q.fifo_head()
            if head is not None:
                remove(head, True)
        elif kind == "take_dl":
            d = q.dl_head()
            if d is not None:
                remove(d, True)
        elif kind == "probe":
            assert q.oldest() is ref.oldest()
            assert q.newest() is ref.newest()
        elif kind == "fast":
            head = q.fifo_head()
            if head is not None:
                heappop(q.fifo)
                remove(head, data.draw(st.booleans()))
        elif queued:
            rec = queued[data.draw(st.integers(0, len(queued) - 1))]
            remove(rec, kind == "take_any")
        assert q.n == len(queued) == len(ref.queued)
        assert q.fifo_head() is ref.fifo_head()
        assert q.dl_head() is ref.dl_head()
        assert q.vnow == ref.vnow
        for t in TENANTS:
            assert q.virtual_time(t) == ref.vt(t)
    assert q.oldest() is ref.oldest()
    assert q.newest() is ref.newest()
    # Draining gives the same order.
    while True:
        head = ref.fifo_head()
        assert q.fifo_head() is head
        if head is None:
            break
        q.take(head)
        ref.take(head)
    assert q.n == 0
