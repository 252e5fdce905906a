//! The priority classes' scores: [`PriorityConfig`].

use cronoq_core::model::Scoring;

/// How the four classes score when a worker picks the next task: a class's base score, plus
/// the waiting time times the aging rate, up to the aging cap (plus deadline urgency, see
/// [`UrgencyConfig`](crate::UrgencyConfig)). Arrays are indexed by
/// [`Priority::index`](crate::Priority::index), `Critical` first.
///
/// The engine ages every class alike, so `aging_rate` and `age_cap` must hold one value for
/// all four classes ([`Builder::build`](crate::Builder::build) refuses others).
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
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorityConfig {
    /// The base score of each class (finite).
    pub base: [f64; 4],
    /// Points per second of waiting (finite, >= 0; one value for every class).
    pub aging_rate: [f64; 4],
    /// The most waiting adds (finite, >= 0; one value for every class).
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
            if v.iter().any(|x| *x != v[0]) {
                return Err(format!(
                    "priority {name} must be the same for every class (the engine ages all classes alike)"
                ));
            }
        }
        scoring.base = self.base;
        scoring.aging_rate = self.aging_rate[0];
        scoring.age_cap = self.age_cap[0];
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_reach_the_engine_and_aging_is_one_for_all() {
        let mut s = Scoring::default();
        let p = PriorityConfig {
            base: [4.0, 3.0, 2.0, 1.0],
            aging_rate: [5.0; 4],
            age_cap: [6.0; 4],
        };
        p.apply(&mut s).unwrap();
        assert_eq!(
            (s.base, s.aging_rate, s.age_cap),
            ([4.0, 3.0, 2.0, 1.0], 5.0, 6.0)
        );
        let uneven = PriorityConfig {
            aging_rate: [1.0, 2.0, 2.0, 2.0],
            ..PriorityConfig::default()
        };
        assert!(
            uneven
                .apply(&mut s)
                .unwrap_err()
                .contains("same for every class")
        );
        let nan = PriorityConfig {
            base: [f64::NAN; 4],
            ..PriorityConfig::default()
        };
        assert!(nan.apply(&mut s).is_err());
    }
}
