//! The autoscaler: a pool's target capacity from the signals the engine samples, with no clock.
//!
//! A port of `cronoq/core/autoscale.py`; that module's docstring states the formula, and every
//! step here does the same f64 operations in the same order, so both give the same capacity for
//! the same calls (checked by `tests/parity/test_leaves_parity.py`).
//!
//! How the Python module maps here:
//! * `AutoscaleSettings` is the frozen dataclass. Python checks the user-facing values when
//!   `cronoq.AutoscaleConfig` is built; [`AutoscaleSettings::validate`] makes the same checks, in
//!   the same order and with the same messages, for the fields that config sets.
//! * `Autoscaler` keeps the same state; `evaluate`'s keyword arguments are [`Signals`]. Python's
//!   public attributes (`settings`, `min`, `max`, `next_eval`, `desired`, `ewma`) are getters.
//! * Counts are `i64`, like Python's ints and the engine's `PoolState` counters; where a step
//!   could leave `i64` (`capacity + step`, `capacity - max_step_down`) it saturates, which
//!   cannot change the result: it is then bounded by `target` or `stabilized`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use crate::model::{check_seconds, py_max};
use crate::pyrepr::python_shown;

/// Demand below this fraction of one worker counts as none.
const MIN_DEMAND: f64 = 0.01;
/// Float slack for rounding up and for time comparisons.
const EPS: f64 = 1e-9;
/// Lower-case class names, as `slo` keys show in messages (`Priority(cls).name.lower()`).
const CLASS_NAMES: [&str; 4] = ["critical", "high", "normal", "low"];

/// Engine-side autoscaler settings; `Default` gives the Python dataclass defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoscaleSettings {
    /// Seconds between evaluations.
    pub interval: f64,
    /// Busy fraction the arrival-rate term aims for, in (0, 1].
    pub target_utilization: f64,
    /// Seconds within which the backlog should drain (0: at once, so any backlog wants `max`).
    pub drain_time: f64,
    /// Class (0 critical .. 3 low) -> maximum predicted queue wait, seconds. Ordered by class,
    /// like the dict `AutoscaleConfig` builds (the order never changes a decision: every term is
    /// combined with `max`).
    pub slo: BTreeMap<usize, f64>,
    /// How far ahead fixed-start reservations count (read by the pool, not by `evaluate`).
    pub reservation_horizon: f64,
    /// A step down takes the highest target of this many seconds.
    pub stabilization_window: f64,
    /// Seconds from one step down to the next.
    pub cooldown: f64,
    /// Workers one step up may add at least.
    pub max_step_up_abs: i64,
    /// Workers one step down may remove at most.
    pub max_step_down: i64,
    /// +100 % of the current capacity per step. Not user-settable (so never validated); it must
    /// be finite and non-negative, as in Python.
    pub max_step_up_ratio: f64,
    /// Weight of the newest arrival-rate sample. Not user-settable either.
    pub ewma_alpha: f64,
    /// Prices `PoolSnapshot.cost`; no influence on decisions.
    pub cost_per_worker_second: f64,
}

impl Default for AutoscaleSettings {
    fn default() -> Self {
        Self {
            interval: 1.0,
            target_utilization: 0.75,
            drain_time: 30.0,
            slo: BTreeMap::new(),
            reservation_horizon: 60.0,
            stabilization_window: 60.0,
            cooldown: 30.0,
            max_step_up_abs: 4,
            max_step_down: 1,
            max_step_up_ratio: 1.0,
            ewma_alpha: 0.5,
            cost_per_worker_second: 0.0,
        }
    }
}

/// A setting `AutoscaleConfig` refuses; `message` is its `ValueError` text, word for word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError {
    pub message: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SettingsError {}

fn invalid(message: String) -> Result<(), SettingsError> {
    Err(SettingsError { message })
}

/// `errors.check_seconds`, with the settings' error.
fn valid_seconds(name: &str, v: f64) -> Result<(), SettingsError> {
    check_seconds(name, v)
        .map(drop)
        .map_err(|message| SettingsError { message })
}

impl AutoscaleSettings {
    /// The checks `cronoq.AutoscaleConfig.__init__` makes, first failure first.
    pub fn validate(&self) -> Result<(), SettingsError> {
        // _positive_seconds: `<= 0` first (so a negative interval gets this message), then
        // check_seconds (NaN and inf)
        if self.interval <= 0.0 {
            return invalid("interval must be > 0".to_owned());
        }
        valid_seconds("interval", self.interval)?;
        let u = self.target_utilization;
        if !(0.0 < u && u <= 1.0) {
            return invalid(format!(
                "target_utilization must be in (0, 1] (got {})",
                python_shown(u)
            ));
        }
        valid_seconds("drain_time", self.drain_time)?;
        for (&cls, &seconds) in &self.slo {
            let Some(name) = CLASS_NAMES.get(cls) else {
                return invalid("slo key must be 0..=3".to_owned());
            };
            valid_seconds(&format!("slo['{name}']"), seconds)?;
        }
        valid_seconds("reservation_horizon", self.reservation_horizon)?;
        valid_seconds("stabilization_window", self.stabilization_window)?;
        valid_seconds("cooldown", self.cooldown)?;
        // `_count`: an OverflowError in Python
        for (name, value) in [
            ("max_step_up_abs", self.max_step_up_abs),
            ("max_step_down", self.max_step_down),
        ] {
            if value < 0 {
                return invalid(format!("{name} must not be negative (got {value})"));
            }
        }
        let cost = self.cost_per_worker_second;
        if !(cost.is_finite() && cost >= 0.0) {
            return invalid(format!(
                "cost_per_worker_second must be a finite number >= 0 (got {})",
                python_shown(cost)
            ));
        }
        Ok(())
    }
}

/// The signals of one pool handed to [`Autoscaler::evaluate`] (the Python keyword arguments;
/// the module docstring there says what each one is).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signals {
    /// Tasks admitted since the previous evaluation (a fixed start counts when it is due).
    pub arrivals: i64,
    /// Mean attempt runtime learned by the engine (`default_duration` before any).
    pub service_time: f64,
    /// Ready + due + retrying tasks per class, index 0 = critical .. 3 = low.
    pub backlog_by_class: [i64; 4],
    /// Running attempts.
    pub busy: i64,
    /// The current capacity (the last target when the capacity is managed outside the engine).
    pub capacity: i64,
    /// Peak concurrent fixed-start reservations starting within `reservation_horizon`.
    pub reserved: i64,
    /// Capacity managed outside the engine and no worker connected: a backlog wants `max`.
    pub stranded: bool,
}

/// Target capacity of one pool; see the Python module docstring for the exact rules.
#[derive(Clone, Debug)]
pub struct Autoscaler {
    settings: AutoscaleSettings,
    min: i64,
    max: i64,
    next_eval: f64,
    desired: i64,
    ewma: Option<f64>,
    first_eval: Option<f64>,
    rate_since: f64,
    carry: i64,
    last_down: Option<f64>,
    /// (time, target) with strictly decreasing targets: the front is the window's maximum.
    window: VecDeque<(f64, i64)>,
}

impl Autoscaler {
    /// # Panics
    /// Unless `0 <= min <= max`, like the Python constructor's assertion (a pool's bounds are
    /// checked where the pool is configured, so this is a programming error).
    pub fn new(settings: AutoscaleSettings, min: i64, max: i64, now: f64) -> Self {
        assert!(
            0 <= min && min <= max,
            "autoscaler bounds must satisfy 0 <= min <= max ({min}, {max})"
        );
        Self {
            settings,
            min,
            max,
            next_eval: now,
            desired: min,
            ewma: None,
            first_eval: None,
            rate_since: now,
            carry: 0,
            last_down: None,
            window: VecDeque::new(),
        }
    }

    pub fn settings(&self) -> &AutoscaleSettings {
        &self.settings
    }

    pub fn min(&self) -> i64 {
        self.min
    }

    pub fn max(&self) -> i64 {
        self.max
    }

    /// When `evaluate` is due next; the first evaluation happens at start.
    pub fn next_eval(&self) -> f64 {
        self.next_eval
    }

    /// The last capacity `evaluate` returned (`min` before the first evaluation).
    pub fn desired(&self) -> i64 {
        self.desired
    }

    /// Smoothed arrival rate (tasks/s); `None` until the first sample.
    pub fn ewma(&self) -> Option<f64> {
        self.ewma
    }

    fn sample_rate(&mut self, now: f64, arrivals: i64) {
        if self.first_eval.is_none() {
            // baseline: no previous evaluation, so no elapsed time and no rate
            self.rate_since = now;
            self.carry = 0;
            return;
        }
        let elapsed = now - self.rate_since;
        let total = self.carry + arrivals;
        if elapsed <= EPS {
            self.carry = total;
            return;
        }
        let rate = total as f64 / elapsed;
        let alpha = self.settings.ewma_alpha;
        self.ewma = Some(match self.ewma {
            None => rate,
            Some(ewma) => alpha * rate + (1.0 - alpha) * ewma,
        });
        self.rate_since = now;
        self.carry = 0;
    }

    /// Workers wanted right now (step 2 of the formula), capped at `max`; uses `ewma`.
    fn demand(&self, sig: &Signals) -> f64 {
        let s = &self.settings;
        let cap = self.max as f64;
        let backlog = &sig.backlog_by_class;
        if sig.stranded && backlog.iter().any(|&n| n != 0) {
            return cap;
        }
        // `x <= cap` is false for NaN too, so a NaN term counts as `max`
        let bounded = |x: f64| if x <= cap { x } else { cap };
        let service_time = sig.service_time;
        let workers_to_drain = |tasks: i64, within: f64| {
            if within > 0.0 {
                tasks as f64 * service_time / within
            } else if tasks > 0 {
                cap
            } else {
                0.0
            }
        };
        let rate = self.ewma.unwrap_or(0.0);
        let total: i64 = backlog.iter().sum();
        let mut raw = py_max(
            py_max(
                bounded(rate * service_time / s.target_utilization),
                bounded(sig.busy as f64 + workers_to_drain(total, s.drain_time)),
            ),
            bounded(sig.reserved as f64),
        );
        for (&cls, &wait) in &s.slo {
            // Python's slice `[:cls + 1]`, which stops at the end of the list
            let ahead: i64 = backlog[..(cls + 1).min(backlog.len())].iter().sum();
            raw = py_max(raw, bounded(workers_to_drain(ahead, wait)));
        }
        raw
    }

    fn target(&self, raw: f64) -> i64 {
        let n = if raw < MIN_DEMAND {
            0.0
        } else {
            (raw - EPS).ceil()
        };
        // `raw <= max`, so `n` is an integer at most `max`; the clamp is Python's min/max.
        (n as i64).clamp(self.min, self.max)
    }

    fn stabilized(&mut self, now: f64, target: i64) -> i64 {
        let window = &mut self.window;
        while window.back().is_some_and(|&(_, t)| t <= target) {
            window.pop_back();
        }
        window.push_back((now, target));
        let horizon = now - self.settings.stabilization_window;
        while window.len() > 1 && window[0].0 <= horizon + EPS {
            window.pop_front();
        }
        window[0].1
    }

    /// Return the new capacity; sets `desired` and advances `next_eval` by `interval`.
    pub fn evaluate(&mut self, now: f64, sig: &Signals) -> i64 {
        self.sample_rate(now, sig.arrivals);
        let first_eval = *self.first_eval.get_or_insert(now);
        let raw = self.demand(sig);
        let target = self.target(raw);
        let stabilized = self.stabilized(now, target);
        let s = &self.settings;
        let capacity = sig.capacity;

        let mut new = capacity;
        if target > capacity {
            // `as i64` saturates: harmless, as `target` bounds the result
            let by_ratio = (capacity as f64 * s.max_step_up_ratio).floor() as i64;
            let step = 1.max(s.max_step_up_abs).max(by_ratio);
            new = target.min(capacity.saturating_add(step));
        } else if stabilized < capacity
            && now - first_eval >= s.stabilization_window - EPS
            && self
                .last_down
                .is_none_or(|last| now - last >= s.cooldown - EPS)
        {
            new = stabilized.max(capacity.saturating_sub(s.max_step_down));
        }
        // bounds win over step limits and cooldown (capacity set from outside [min, max])
        new = new.max(self.min).min(self.max);
        if new < capacity {
            self.last_down = Some(now);
        }

        self.desired = new;
        self.next_eval += s.interval;
        if self.next_eval <= now {
            self.next_eval = now + s.interval;
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn make(min: i64, max: i64) -> Autoscaler {
        Autoscaler::new(AutoscaleSettings::default(), min, max, 0.0)
    }

    fn sig(capacity: i64) -> Signals {
        Signals {
            service_time: 1.0,
            capacity,
            ..Signals::default()
        }
    }

    #[test]
    fn validation_messages() {
        let bad = |f: fn(&mut AutoscaleSettings)| {
            let mut s = AutoscaleSettings::default();
            f(&mut s);
            s.validate().unwrap_err().message
        };
        assert_eq!(bad(|s| s.interval = -1.0), "interval must be > 0");
        assert_eq!(
            bad(|s| s.interval = f64::INFINITY),
            "interval must be a finite, non-negative number of seconds (got inf)"
        );
        assert_eq!(
            bad(|s| s.target_utilization = 0.0),
            "target_utilization must be in (0, 1] (got 0)"
        );
        assert_eq!(
            bad(|s| {
                s.slo.insert(2, -0.5);
            }),
            "slo['normal'] must be a finite, non-negative number of seconds (got -0.5)"
        );
        assert_eq!(
            bad(|s| {
                s.slo.insert(4, 1.0);
            }),
            "slo key must be 0..=3"
        );
        assert_eq!(
            bad(|s| s.max_step_down = -2),
            "max_step_down must not be negative (got -2)"
        );
        assert_eq!(
            bad(|s| s.cost_per_worker_second = f64::NAN),
            "cost_per_worker_second must be a finite number >= 0 (got nan)"
        );
        assert!(AutoscaleSettings::default().validate().is_ok());
    }

    #[test]
    fn first_evaluation_only_sets_the_baseline() {
        let mut a = make(0, 10);
        let s = Signals {
            arrivals: 100,
            ..sig(0)
        };
        assert_eq!(a.evaluate(5.0, &s), 0);
        assert_eq!(a.ewma(), None);
        // 10 arrivals over 2 s: 5/s x 1 s / 0.75 = 6.67 -> 7, in one step of max(1, 4, 0) = 4
        let s = Signals {
            arrivals: 10,
            ..sig(0)
        };
        assert_eq!(a.evaluate(7.0, &s), 4);
        assert_eq!(a.ewma(), Some(5.0));
    }

    #[test]
    fn same_instant_carries_arrivals() {
        let mut a = make(0, 100);
        a.evaluate(0.0, &sig(0));
        a.evaluate(
            1.0,
            &Signals {
                arrivals: 3,
                ..sig(0)
            },
        );
        assert_eq!(a.ewma(), Some(3.0));
        a.evaluate(
            1.0,
            &Signals {
                arrivals: 4,
                ..sig(0)
            },
        );
        assert_eq!(a.ewma(), Some(3.0));
        a.evaluate(
            2.0,
            &Signals {
                arrivals: 1,
                ..sig(0)
            },
        );
        // (4 + 1) / (2 - 1) = 5, then 0.5 * 5 + 0.5 * 3
        assert_eq!(a.ewma(), Some(4.0));
    }

    #[test]
    fn scale_down_waits_for_window_then_cooldown() {
        let mut a = make(1, 20);
        let mut cap = 8;
        for t in 0..60 {
            cap = a.evaluate(t as f64, &sig(cap));
            assert_eq!(cap, 8, "no step down before the window has history (t={t})");
        }
        cap = a.evaluate(60.0, &sig(cap));
        assert_eq!(cap, 7);
        for t in 61..90 {
            cap = a.evaluate(t as f64, &sig(cap));
            assert_eq!(cap, 7, "cooldown (t={t})");
        }
        assert_eq!(a.evaluate(90.0, &sig(cap)), 6);
    }

    #[test]
    fn window_of_a_tenth_steps_on_the_boundaries() {
        // 600 evaluations of 0.1 s accumulate float error; the EPS slack keeps t = 60 a boundary
        let settings = AutoscaleSettings {
            interval: 0.1,
            ..AutoscaleSettings::default()
        };
        let mut a = Autoscaler::new(settings, 0, 10, 0.0);
        let mut cap = 5;
        let mut now = 0.0;
        let mut first_down = None;
        while now < 61.0 {
            let new = a.evaluate(now, &sig(cap));
            if new < cap && first_down.is_none() {
                first_down = Some(now);
            }
            cap = new;
            now = a.next_eval();
        }
        let t: f64 = first_down.unwrap();
        assert!((t - 60.0).abs() < 1e-6, "first step down at {t}");
    }

    #[test]
    fn stranded_backlog_asks_for_max_and_bounds_win() {
        let mut a = make(2, 9);
        let s = Signals {
            backlog_by_class: [0, 0, 0, 1],
            stranded: true,
            ..sig(0)
        };
        // from 0: +max(1, 4, 0) = 4, and never below min
        assert_eq!(a.evaluate(0.0, &s), 4);
        // a capacity set above max comes down at once, cooldown or not
        assert_eq!(a.evaluate(1.0, &sig(30)), 9);
    }

    #[test]
    fn slo_zero_wants_max_for_a_nonempty_backlog() {
        let mut settings = AutoscaleSettings::default();
        settings.slo.insert(1, 0.0);
        settings.max_step_up_abs = 100;
        let mut a = Autoscaler::new(settings, 0, 12, 0.0);
        let low_only = Signals {
            backlog_by_class: [0, 0, 0, 1],
            ..sig(0)
        };
        // class 3 is not within `[:2]`: drain term 1 x 1 / 30 -> 1 worker
        assert_eq!(a.evaluate(0.0, &low_only), 1);
        let high = Signals {
            backlog_by_class: [0, 1, 0, 0],
            ..sig(1)
        };
        assert_eq!(a.evaluate(1.0, &high), 12);
    }

    #[test]
    fn next_eval_keeps_the_grid_or_skips_missed_points() {
        let mut a = make(0, 1);
        assert_eq!(a.next_eval(), 0.0);
        a.evaluate(0.0, &sig(0));
        assert_eq!(a.next_eval(), 1.0);
        a.evaluate(1.5, &sig(0));
        assert_eq!(a.next_eval(), 2.0);
        a.evaluate(7.25, &sig(0));
        assert_eq!(a.next_eval(), 8.25);
    }

    #[test]
    #[should_panic(expected = "autoscaler bounds must satisfy 0 <= min <= max (3, 2)")]
    fn bounds_are_asserted() {
        make(3, 2);
    }

    fn settings_strategy() -> impl Strategy<Value = AutoscaleSettings> {
        (
            (
                0.05..5.0f64,
                0.05..=1.0f64,
                prop_oneof![Just(0.0), 0.5..60.0f64],
            ),
            proptest::collection::btree_map(0usize..4, prop_oneof![Just(0.0), 0.5..30.0f64], 0..4),
            (
                prop_oneof![Just(0.0), 0.5..60.0f64],
                prop_oneof![Just(0.0), 1.0..30.0f64],
            ),
            (0i64..6, 1i64..4, 0.0..2.0f64, 0.01..=1.0f64),
        )
            .prop_map(
                |((interval, tu, drain), slo, (window, cooldown), (abs, down, ratio, alpha))| {
                    AutoscaleSettings {
                        interval,
                        target_utilization: tu,
                        drain_time: drain,
                        slo,
                        stabilization_window: window,
                        cooldown,
                        max_step_up_abs: abs,
                        max_step_down: down,
                        max_step_up_ratio: ratio,
                        ewma_alpha: alpha,
                        ..AutoscaleSettings::default()
                    }
                },
            )
    }

    /// Mostly quiet signals with occasional load, so that shrinks and cooldowns happen often.
    fn step_strategy() -> impl Strategy<Value = (f64, Signals, Option<i64>)> {
        let few = || prop_oneof![4 => Just(0i64), 1 => 0i64..6, 1 => Just(40i64)];
        (
            prop_oneof![Just(0.0), Just(1.0), 0.0..8.0f64],
            (
                few(),
                0.0..10.0f64,
                [few(), few(), few(), few()],
                few(),
                few(),
            ),
            proptest::option::weighted(0.2, 0i64..40),
        )
            .prop_map(
                |(dt, (arrivals, service_time, backlog, busy, reserved), set)| {
                    let signals = Signals {
                        arrivals,
                        service_time,
                        backlog_by_class: backlog,
                        busy,
                        capacity: 0,
                        reserved,
                        stranded: false,
                    };
                    (dt, signals, set)
                },
            )
    }

    proptest! {
        #[test]
        fn bounds_steps_window_and_cooldown(
            settings in settings_strategy(),
            min in 0i64..5,
            extra in 0i64..15,
            start in 0.0..1000.0f64,
            steps in proptest::collection::vec(step_strategy(), 1..150),
        ) {
            let max = min + extra;
            let s = settings.clone();
            let mut a = Autoscaler::new(settings, min, max, start);
            let (mut now, mut cap) = (start, min);
            let mut last_down: Option<f64> = None;
            for (dt, mut signals, set) in steps {
                // a capacity set from outside, possibly outside [min, max]
                if let Some(set) = set {
                    cap = set;
                }
                signals.capacity = cap;
                let new = a.evaluate(now, &signals);
                prop_assert_eq!(a.desired(), new);
                prop_assert!(min <= new && new <= max);
                prop_assert!(a.next_eval() > now);
                if new > cap {
                    let ratio = (cap as f64 * s.max_step_up_ratio).floor() as i64;
                    prop_assert!(new - cap <= 1.max(s.max_step_up_abs).max(ratio) || cap < min);
                }
                if new < cap && cap <= max {
                    prop_assert!(cap - new <= s.max_step_down);
                    prop_assert!(now - start >= s.stabilization_window - EPS);
                    if let Some(last) = last_down {
                        prop_assert!(now - last >= s.cooldown - EPS);
                    }
                }
                if new < cap {
                    last_down = Some(now);
                }
                cap = new;
                now += dt;
            }
        }
    }
}
