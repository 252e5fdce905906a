//! Windowed quality metrics of one pool, kept in one-second slots.
//!
//! A port of `cronoq/core/stats.py` (its docstring explains the slots and the histograms) that
//! gives bit-identical results, checked by `tests/parity/test_leaves_parity.py`. What that
//! takes, beyond doing the same f64 operations in the same order:
//! * `int(t)` truncates toward zero while `_spans` cuts at `math.floor`; both are kept, as is the
//!   float comparison `s.sec <= now` of `window_slots`.
//! * `_spans` is a generator whose consumer writes to each slot before the next one is looked
//!   up (and possibly reset, when a span covers `n + 1` seconds): [`PoolStats`] interleaves the
//!   lookups and the writes the same way.
//! * the window's sums add left to right from 0, in slot order (not time order), as the Python
//!   loop does.
//! * Python's dict histograms become `BTreeMap`s: only their merged, sorted contents matter.
//! * Python raises on a sample that is NaN or +inf (when its second is sealed) and on a bucket
//!   of 2^1023 or more (when a percentile is read); the port panics at the same points.

use std::collections::BTreeMap;

use crate::model::{py_max, py_min};

/// Histogram buckets per power of two.
pub const SUB_BUCKETS: i32 = 256;
/// The bucket of zero (and negative) samples, which reports exactly 0.
const ZERO_BUCKET: i32 = -(1 << 30);
/// The window of a pool's snapshot, seconds.
pub const DEFAULT_WINDOW: f64 = 60.0;

/// Sample count per bucket (Python's `dict[int, int]`).
pub type Histogram = BTreeMap<i32, u64>;

/// `math.frexp`: `x = m * 2^e` with `0.5 <= |m| < 1`, exact for subnormals too; `(x, 0)` for
/// zero, infinities and NaN.
pub fn frexp(x: f64) -> (f64, i32) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let bits = x.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    if biased == 0 {
        // subnormal: scale into the normal range first (exact)
        let (m, e) = frexp(x * 18_014_398_509_481_984.0); // 2^54
        return (m, e - 54);
    }
    let m = f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52));
    (m, biased - 1022)
}

/// `2.0 ** e`, exact (as C's pow is for powers of two), for the exponents `frexp` gives.
fn pow2(e: i32) -> f64 {
    assert!(e <= 1023, "2.0 ** {e}: numerical result out of range");
    if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else if e >= -1074 {
        f64::from_bits(1 << (e + 1074))
    } else {
        0.0
    }
}

/// Histogram bucket of a non-negative sample.
///
/// # Panics
/// If `x` is NaN or +inf (Python's `int()` of one raises).
pub fn bucket_of(x: f64) -> i32 {
    if x <= 0.0 {
        return ZERO_BUCKET;
    }
    assert!(x.is_finite(), "histogram sample must be finite (got {x})");
    let (m, e) = frexp(x);
    e * SUB_BUCKETS + ((m - 0.5) * 2.0 * f64::from(SUB_BUCKETS)) as i32
}

/// Representative (geometric middle) value of a bucket.
pub fn bucket_value(b: i32) -> f64 {
    if b == ZERO_BUCKET {
        return 0.0;
    }
    let (e, sub) = (b.div_euclid(SUB_BUCKETS), b.rem_euclid(SUB_BUCKETS));
    let width = f64::from(2 * SUB_BUCKETS);
    let lo = (0.5 + f64::from(sub) / width) * pow2(e);
    let hi = (0.5 + f64::from(sub + 1) / width) * pow2(e);
    (lo * hi).sqrt()
}

/// Nearest-rank percentiles of the merged histograms (0.0 when there are no samples). Like
/// Python, a `p` above 1 has no rank and adds no value.
pub fn percentiles<'a>(hists: impl IntoIterator<Item = &'a Histogram>, ps: &[f64]) -> Vec<f64> {
    let mut merged = Histogram::new();
    for h in hists {
        for (&b, &n) in h {
            *merged.entry(b).or_insert(0) += n;
        }
    }
    let total: u64 = merged.values().sum();
    if total == 0 {
        return vec![0.0; ps.len()];
    }
    let mut out = Vec::with_capacity(ps.len());
    for &p in ps {
        // Python's max(1, ceil(p * total)) on an unbounded int: a rank below 1 is 1
        let rank = (p * total as f64).ceil();
        let rank = if rank < 1.0 { 1 } else { rank as u64 };
        let mut seen = 0;
        for (&b, &n) in &merged {
            seen += n;
            if seen >= rank {
                out.push(bucket_value(b));
                break;
            }
        }
    }
    out
}

/// One second of metrics. Samples of the current second are kept raw (a push is the cheapest
/// thing to do per dispatch) and folded into the histograms when the second ends.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slot {
    pub sec: i64,
    pub dispatched: u64,
    pub adherent: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub retried: u64,
    pub fixed: u64,
    pub fixed_hits: u64,
    pub busy_s: f64,
    pub cap_s: f64,
    pub success_s: f64,
    pub wait_sum: f64,
    pub wait_hist: Histogram,
    pub run_hist: Histogram,
    waits: Vec<f64>,
    runs: Vec<f64>,
}

impl Slot {
    fn reset(&mut self, sec: i64) {
        self.sec = sec;
        self.dispatched = 0;
        self.adherent = 0;
        self.succeeded = 0;
        self.failed = 0;
        self.retried = 0;
        self.fixed = 0;
        self.fixed_hits = 0;
        self.busy_s = 0.0;
        self.cap_s = 0.0;
        self.success_s = 0.0;
        self.wait_sum = 0.0;
        self.wait_hist.clear();
        self.run_hist.clear();
        self.waits.clear();
        self.runs.clear();
    }

    /// Fold the raw samples into the histograms.
    fn seal(&mut self) {
        for (raw, hist) in [
            (&mut self.waits, &mut self.wait_hist),
            (&mut self.runs, &mut self.run_hist),
        ] {
            for &x in raw.iter() {
                *hist.entry(bucket_of(x)).or_insert(0) += 1;
            }
            raw.clear();
        }
    }
}

/// The windowed fields of `PoolSnapshot` (the dict `PoolStats.summary` returns).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub dispatched: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub retried: u64,
    pub priority_adherence: f64,
    pub fixed_start_hit_rate: f64,
    pub utilization: f64,
    pub schedule_efficiency: f64,
    pub wait_mean: f64,
    pub wait_p50: f64,
    pub wait_p90: f64,
    pub wait_p99: f64,
    pub run_p50: f64,
    pub run_p99: f64,
}

/// Python's `int(t)` for a time (truncation toward zero).
fn int(t: f64) -> i64 {
    t as i64
}

/// A sum of floats as the Python core adds them: left to right, from 0.
fn float_sum(xs: impl Iterator<Item = f64>) -> f64 {
    xs.fold(0.0, |acc, x| acc + x)
}

/// Metrics of one pool: call [`PoolStats::level`] before busy or capacity change, `on_*` per
/// event.
#[derive(Clone, Debug)]
pub struct PoolStats {
    window: f64,
    n: usize,
    slots: Vec<Slot>,
    /// Index of the current slot (Python keeps a reference to the same list element).
    cur: usize,
    last: f64,
    busy: i64,
    cap: i64,
    worker_seconds: f64,
}

impl PoolStats {
    /// Stats over the default 60 s window.
    pub fn new(now: f64, capacity: i64) -> Self {
        Self::with_window(now, capacity, DEFAULT_WINDOW)
    }

    /// # Panics
    /// If `window` is not finite (Python's `math.ceil` raises).
    pub fn with_window(now: f64, capacity: i64, window: f64) -> Self {
        assert!(
            window.is_finite(),
            "stats window must be finite (got {window})"
        );
        let n = window.ceil().max(1.0) as usize;
        let fresh = Slot {
            sec: -1,
            ..Slot::default()
        };
        let mut stats = Self {
            window,
            n,
            slots: vec![fresh; n],
            cur: 0,
            last: now,
            busy: 0,
            cap: capacity,
            worker_seconds: 0.0,
        };
        stats.cur = stats.slot_at(now);
        stats
    }

    /// The window, seconds (`PoolSnapshot.window`).
    pub fn window(&self) -> f64 {
        self.window
    }

    /// Capacity integrated over time since the start (`PoolSnapshot.worker_seconds`), up to
    /// the last `level` call.
    pub fn worker_seconds(&self) -> f64 {
        self.worker_seconds
    }

    fn slot_at(&mut self, t: f64) -> usize {
        let sec = int(t);
        let i = sec.rem_euclid(self.n as i64) as usize;
        let s = &mut self.slots[i];
        if s.sec != sec {
            s.reset(sec);
        }
        i
    }

    /// The slot of the current second; moving to a new second seals the previous one.
    fn slot(&mut self, now: f64) -> &mut Slot {
        if self.slots[self.cur].sec != int(now) {
            self.slots[self.cur].seal();
            self.cur = self.slot_at(now);
        }
        &mut self.slots[self.cur]
    }

    /// Calls `add(slot, seconds)` for the pieces of [start, end) within the last window, one
    /// per second, each piece's slot looked up right before its call (Python's generator).
    fn spans(&mut self, start: f64, end: f64, mut add: impl FnMut(&mut Slot, f64)) {
        // The window's first second: the one before shares the current second's slot.
        let mut t = py_max(start, end.floor() - self.n as f64 + 1.0);
        while t < end {
            let stop = py_min(end, t.floor() + 1.0);
            let i = self.slot_at(t);
            add(&mut self.slots[i], stop - t);
            t = stop;
        }
    }

    /// Account worker-seconds up to `now` at the old levels, then switch to the new ones.
    pub fn level(&mut self, now: f64, busy: i64, capacity: i64) {
        let last = self.last;
        if now > last {
            let (cap, was_busy) = (self.cap as f64, self.busy as f64);
            self.worker_seconds += cap * (now - last);
            if self.cap == 0 && self.busy == 0 {
                // nothing to account in the slots
            } else if int(now) == int(last) {
                // the common case: one slot
                let s = self.slot(now);
                let dt = now - last;
                s.busy_s += was_busy * dt;
                s.cap_s += cap * dt;
            } else {
                self.spans(last, now, |s, dt| {
                    s.busy_s += was_busy * dt;
                    s.cap_s += cap * dt;
                });
            }
            self.last = now;
        }
        self.busy = busy;
        self.cap = capacity;
    }

    pub fn on_dispatch(&mut self, now: f64, wait: f64, adherent: bool) {
        let s = self.slot(now);
        s.dispatched += 1;
        if adherent {
            s.adherent += 1;
        }
        s.wait_sum += wait;
        s.waits.push(wait);
    }

    pub fn on_attempt_end(&mut self, now: f64, started_at: f64, success: bool) {
        let s = self.slot(now);
        let runtime = now - started_at;
        if !success {
            s.failed += 1;
        } else {
            s.succeeded += 1;
            // Spread the attempt's worker-seconds over the seconds it ran, like busy time.
            if int(started_at) == int(now) {
                s.success_s += runtime;
            } else {
                // For an attempt longer than the window the first piece is `now - n`, in the
                // current slot's place: see the module docs on what that loses.
                self.spans(started_at, now, |slot, dt| slot.success_s += dt);
            }
        }
        // Python appends to the slot object it looked up first: the same list element
        self.slots[self.cur].runs.push(runtime);
    }

    pub fn on_retry(&mut self, now: f64) {
        self.slot(now).retried += 1;
    }

    pub fn on_fixed_start(&mut self, now: f64, hit: bool) {
        let s = self.slot(now);
        s.fixed += 1;
        if hit {
            s.fixed_hits += 1;
        }
    }

    /// The slots of the window ending at `now`, sealed, in slot (not time) order; accounts the
    /// current levels up to `now` first.
    pub fn window_slots(&mut self, now: f64) -> Vec<&Slot> {
        self.level(now, self.busy, self.cap);
        self.slots[self.cur].seal();
        let first = int(now) - self.n as i64 + 1;
        self.slots
            .iter()
            .filter(|s| first <= s.sec && s.sec as f64 <= now)
            .collect()
    }

    /// The windowed fields of `PoolSnapshot`.
    pub fn summary(&mut self, now: f64) -> Summary {
        let slots = self.window_slots(now);
        let count = |f: fn(&Slot) -> u64| slots.iter().map(|s| f(s)).sum::<u64>();
        let total = |f: fn(&Slot) -> f64| float_sum(slots.iter().map(|s| f(s)));
        let dispatched = count(|s| s.dispatched);
        let adherent = count(|s| s.adherent);
        let fixed = count(|s| s.fixed);
        let hits = count(|s| s.fixed_hits);
        let cap_s = total(|s| s.cap_s);
        let busy_s = total(|s| s.busy_s);
        let success_s = total(|s| s.success_s);
        let wait_sum = total(|s| s.wait_sum);
        let w = percentiles(slots.iter().map(|s| &s.wait_hist), &[0.5, 0.9, 0.99]);
        let r = percentiles(slots.iter().map(|s| &s.run_hist), &[0.5, 0.99]);
        let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 1.0 };
        let of_capacity = |x: f64| {
            if cap_s > 0.0 {
                py_min(1.0, x / cap_s)
            } else {
                0.0
            }
        };
        Summary {
            dispatched,
            succeeded: count(|s| s.succeeded),
            failed: count(|s| s.failed),
            retried: count(|s| s.retried),
            priority_adherence: ratio(adherent, dispatched),
            fixed_start_hit_rate: ratio(hits, fixed),
            utilization: of_capacity(busy_s),
            schedule_efficiency: of_capacity(success_s),
            wait_mean: if dispatched > 0 {
                wait_sum / dispatched as f64
            } else {
                0.0
            },
            wait_p50: w[0],
            wait_p90: w[1],
            wait_p99: w[2],
            run_p50: r[0],
            run_p99: r[1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frexp_is_pythons() {
        assert_eq!(frexp(1.0), (0.5, 1));
        assert_eq!(frexp(0.75), (0.75, 0));
        assert_eq!(frexp(-3.0), (-0.75, 2));
        assert_eq!(frexp(5e-324), (0.5, -1073));
        assert_eq!(
            frexp(f64::MAX),
            (f64::MAX / 2f64.powi(1024 - 1) / 2.0, 1024)
        );
        assert_eq!(frexp(0.0), (0.0, 0));
    }

    #[test]
    fn buckets() {
        assert_eq!(bucket_of(0.0), ZERO_BUCKET);
        assert_eq!(bucket_of(-1.0), ZERO_BUCKET);
        assert_eq!(bucket_value(ZERO_BUCKET), 0.0);
        assert_eq!(bucket_of(1.0), 256);
        assert_eq!(bucket_of(1.5), 256 + 128);
        assert_eq!(bucket_of(0.5), 0);
        // below 0.5 the exponent is negative: floor division of the bucket number recovers it
        assert_eq!(bucket_of(0.25), -256);
        assert_eq!(bucket_value(256), (1.0f64 * (1.0 + 1.0 / 256.0)).sqrt());
        // lo * hi underflows below ~1e-154 (and overflows above ~1e154): Python's too
        assert_eq!(bucket_value(bucket_of(5e-324)), 0.0);
        assert_eq!(bucket_value(bucket_of(1e300)), f64::INFINITY);
    }

    #[test]
    #[should_panic(expected = "histogram sample must be finite")]
    fn infinite_sample_panics() {
        bucket_of(f64::INFINITY);
    }

    #[test]
    fn percentiles_of_nothing_and_above_one() {
        assert_eq!(percentiles([], &[0.5, 0.9]), vec![0.0, 0.0]);
        let h = Histogram::from([(bucket_of(2.0), 3)]);
        assert_eq!(
            percentiles([&h], &[0.0, 2.0]),
            vec![bucket_value(bucket_of(2.0))]
        );
    }

    #[test]
    fn levels_are_spread_over_the_seconds() {
        let mut s = PoolStats::new(10.5, 4);
        s.level(10.5, 2, 4);
        s.level(13.0, 2, 4);
        let per_slot: Vec<(i64, f64, f64)> = s
            .window_slots(13.0)
            .iter()
            .filter(|x| x.sec >= 0) // never-used slots (sec -1) count, empty, as in Python
            .map(|x| (x.sec, x.busy_s, x.cap_s))
            .collect();
        assert_eq!(
            per_slot,
            vec![(10, 1.0, 2.0), (11, 2.0, 4.0), (12, 2.0, 4.0)]
        );
        assert_eq!(s.worker_seconds(), 10.0);
        assert_eq!(s.summary(13.0).utilization, 0.5);
    }

    #[test]
    fn window_is_the_current_second_and_the_ones_before() {
        let mut s = PoolStats::new(0.0, 1);
        s.on_dispatch(0.5, 1.0, true);
        s.on_dispatch(1.5, 3.0, false);
        let m = s.summary(60.9);
        assert_eq!(
            (m.dispatched, m.wait_mean, m.priority_adherence),
            (1, 3.0, 0.0)
        );
        let m = s.summary(61.0);
        assert_eq!(
            (m.dispatched, m.wait_mean, m.priority_adherence),
            (0, 0.0, 1.0)
        );
    }

    #[test]
    fn long_attempt_ending_at_a_fractional_second_is_counted() {
        // The attempt's span starts at the window's first second, not at the one before, whose
        // slot is the current one: resetting it would lose this success.
        let mut s = PoolStats::new(0.3, 2);
        s.level(0.3, 1, 2);
        s.level(100.5, 0, 2);
        s.on_attempt_end(100.5, 0.3, true);
        let m = s.summary(100.7);
        assert_eq!(m.succeeded, 1);
        assert_eq!(m.run_p50, bucket_value(bucket_of(100.5 - 0.3)));
    }

    #[test]
    fn event_before_the_level_after_an_idle_window_is_kept() {
        // A `level` whose span reaches a window back stops short of the current slot.
        let mut s = PoolStats::new(0.0, 1);
        s.on_retry(517.0);
        assert_eq!(s.summary(517.0).retried, 1);
        s.on_retry(517.5);
        assert_eq!(s.summary(517.5).retried, 2);
    }

    proptest! {
        #[test]
        fn percentile_is_within_two_permille_of_nearest_rank(
            mut xs in proptest::collection::vec(
                prop_oneof![Just(0.0), 1e-150..1e150f64, 0.0..10.0f64], 1..200),
            p in 0.0..=1.0f64,
        ) {
            let mut h = Histogram::new();
            for &x in &xs {
                *h.entry(bucket_of(x)).or_insert(0) += 1;
            }
            xs.sort_by(f64::total_cmp);
            let rank = ((p * xs.len() as f64).ceil() as usize).max(1);
            let exact = xs[rank - 1];
            let got = percentiles([&h], &[p])[0];
            if exact == 0.0 {
                prop_assert_eq!(got, 0.0);
            } else {
                prop_assert!((got - exact).abs() <= 0.002 * exact, "{} vs {}", got, exact);
            }
        }

        #[test]
        fn window_counts_equal_the_events_in_the_window(
            start in 0u32..1000,
            window in prop_oneof![Just(60.0), 0.5..90.0f64],
            events in proptest::collection::vec((0u32..400, 0u8..4, 0u32..800), 0..120),
            query in 0u32..400,
        ) {
            // times and waits in quarters and eighths: every sum is exact
            let mut s = PoolStats::with_window(f64::from(start), 1, window);
            let n = window.ceil().max(1.0) as i64;
            let mut now = f64::from(start);
            let mut seen: Vec<(f64, u8, f64)> = Vec::new();
            for (dt, kind, w) in events {
                now += f64::from(dt) / 4.0;
                let wait = f64::from(w) / 8.0;
                // as the engine does before a change; without it, see the test above
                s.level(now, 0, 1);
                match kind {
                    0 => s.on_dispatch(now, wait, w % 2 == 0),
                    1 => s.on_retry(now),
                    2 => s.on_fixed_start(now, w % 3 == 0),
                    _ => s.on_attempt_end(now, now - wait.min(0.5), false),
                }
                seen.push((now, kind, wait));
            }
            let end = now + f64::from(query) / 4.0;
            let first = end as i64 - n + 1;
            let inside: Vec<_> = seen.iter().filter(|e| e.0 as i64 >= first).collect();
            let count = |k: u8| inside.iter().filter(|e| e.1 == k).count() as u64;
            let m = s.summary(end);
            prop_assert_eq!(m.dispatched, count(0));
            prop_assert_eq!(m.retried, count(1));
            prop_assert_eq!(m.failed, count(3));
            let waits: f64 = inside.iter().filter(|e| e.1 == 0).map(|e| e.2).sum();
            let mean = if count(0) > 0 { waits / count(0) as f64 } else { 0.0 };
            prop_assert_eq!(m.wait_mean, mean);
        }

        #[test]
        fn capacity_seconds_are_the_integral_over_the_window(
            start in 0u32..1000,
            levels in proptest::collection::vec((0u32..300, 0i64..6, 0i64..6), 1..60),
            query in 0u32..300,
        ) {
            let mut s = PoolStats::new(f64::from(start) / 4.0, 0);
            let mut now = f64::from(start) / 4.0;
            let mut pieces: Vec<(f64, f64, i64, i64)> = Vec::new();
            let (mut busy, mut cap) = (0, 0);
            for (dt, b, c) in levels {
                let next = now + f64::from(dt) / 4.0;
                pieces.push((now, next, busy, cap));
                now = next;
                (busy, cap) = (b.min(c), c);
                s.level(now, busy, cap);
            }
            let end = now + f64::from(query) / 4.0;
            pieces.push((now, end, busy, cap));
            let lo = ((end as i64) - 59) as f64;
            let within = |f: fn(&(f64, f64, i64, i64)) -> i64| -> f64 {
                pieces
                    .iter()
                    .map(|p| (p.1.min(end) - p.0.max(lo)).max(0.0) * f(p) as f64)
                    .sum()
            };
            let (cap_s, busy_s) = (within(|p| p.3), within(|p| p.2));
            let m = s.summary(end);
            let total: f64 = pieces.iter().map(|p| (p.1 - p.0) * p.3 as f64).sum();
            prop_assert_eq!(s.worker_seconds(), total);
            let utilization = if cap_s > 0.0 { (busy_s / cap_s).min(1.0) } else { 0.0 };
            prop_assert_eq!(m.utilization, utilization);
            prop_assert!((0.0..=1.0).contains(&m.utilization));
        }
    }
}
