//! The priority classes' scores: [`PriorityConfig`].

use cronoq_core::model::Scoring;

/// How the four classes score when a worker picks the next task: a class's base score, plus
/// the waiting time times the class's aging rate, up to the class's aging cap (plus deadline
/// urgency, see [`UrgencyConfig`](crate::UrgencyConfig)). Arrays are indexed by
/// [`Priority::index`](crate::Priority::index), `Critical` first.
///
/// Classes may age at different rates and up to different caps: a class that ages faster
/// catches up sooner with the classes above it, while the tasks of one class still run oldest
/// first.
///
/// ```
/// use cronoq::{PriorityConfig, Scheduler};
///
/// // A Low task that waited 1 s overtakes a fresh Normal one (10 + 800 > 100), not a fresh
/// // High one (1000).
/// let fast_aging = PriorityConfig {
///     aging_rate: [1000.0; 4],
///     ..PriorityConfig::default()
/// };
/// let builder = Scheduler::<u32, u32>::builder().priority(fast_aging);
///
/// // Only Low ages fast, and further: after 2 s it overtakes a fresh High task too
/// // (10 + 2000 > 1000), while a Normal task that waited as long gains 4 points.
/// let low_catches_up = PriorityConfig {
///     aging_rate: [2.0, 2.0, 2.0, 1000.0],
///     age_cap: [800.0, 800.0, 800.0, 5000.0],
///     ..PriorityConfig::default()
/// };
/// let builder = Scheduler::<u32, u32>::builder().priority(low_catches_up);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorityConfig {
    /// The base score of each class (finite).
    pub base: [f64; 4],
    /// Points per second of waiting, per class (finite, >= 0).
    pub aging_rate: [f64; 4],
    /// The most waiting adds, per class (finite, >= 0).
    pub age_cap: [f64; 4],
}

impl Default for PriorityConfig {
    /// Bases 10000, 1000, 100 and 10; 2 points per second of waiting, up to 800.
    fn default() -> Self {
        PriorityConfig {
            base: [10000.0, 1000.0, 100.0, 10.0],
            aging_rate: [2.0; 4],
            age_cap: [800.0; 4],
        }
    }
}

impl PriorityConfig {
    /// Sets these scores on the engine's scoring, or says why they cannot work.
    pub(crate) fn apply(&self, scoring: &mut Scoring) -> Result<(), String> {
        let finite = |v: &[f64; 4]| v.iter().all(|x| x.is_finite());
        let non_negative = |v: &[f64; 4]| v.iter().all(|x| *x >= 0.0);
        if !finite(&self.base) {
            return Err("priority base scores must be finite".into());
        }
        for (name, v) in [("aging_rate", &self.aging_rate), ("age_cap", &self.age_cap)] {
            if !finite(v) || !non_negative(v) {
                return Err(format!("priority {name} must be finite and >= 0"));
            }
        }
        // One value for every class unless they differ (the engine's per-class settings).
        let per_class = |v: [f64; 4]| v.iter().any(|x| *x != v[0]).then_some(v);
        scoring.base = self.base;
        scoring.aging_rate = self.aging_rate[0];
        scoring.age_cap = self.age_cap[0];
        scoring.aging_rates = per_class(self.aging_rate);
        scoring.age_caps = per_class(self.age_cap);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_reach_the_engine_per_class_where_they_differ() {
        let mut s = Scoring::default();
        let p = PriorityConfig {
            base: [4.0, 3.0, 2.0, 1.0],
            aging_rate: [5.0; 4],
            age_cap: [6.0; 4],
        };
        p.apply(&mut s).unwrap();
        assert_eq!(
            (s.base, s.aging_rate, s.age_cap, s.aging_rates, s.age_caps),
            ([4.0, 3.0, 2.0, 1.0], 5.0, 6.0, None, None)
        );
        let uneven = PriorityConfig {
            aging_rate: [1.0, 2.0, 2.0, 2.0],
            ..PriorityConfig::default()
        };
        uneven.apply(&mut s).unwrap();
        assert_eq!(
            (s.aging_rates, s.age_caps),
            (Some([1.0, 2.0, 2.0, 2.0]), None)
        );
        assert_eq!(s.ages()[0], (1.0, 800.0));
        let nan = PriorityConfig {
            base: [f64::NAN; 4],
            ..PriorityConfig::default()
        };
        assert_eq!(
            nan.apply(&mut s).unwrap_err(),
            "priority base scores must be finite"
        );
        for (rate, cap, rule) in [
            ([1.0, -1.0, 1.0, 1.0], [1.0; 4], "aging_rate"),
            ([1.0; 4], [1.0, 1.0, 1.0, f64::INFINITY], "age_cap"),
        ] {
            let bad = PriorityConfig {
                aging_rate: rate,
                age_cap: cap,
                ..PriorityConfig::default()
            };
            assert_eq!(
                bad.apply(&mut s).unwrap_err(),
                format!("priority {rule} must be finite and >= 0")
            );
        }
    }
}
