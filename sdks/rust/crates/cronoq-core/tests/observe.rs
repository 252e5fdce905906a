//! The observer and `ready_view`, with the figures the Python core gives for the same calls
//! (the differential suite compares both at random).

mod common;

use std::sync::{Arc, Mutex};

use common::started;
use cronoq_core::{
    Attempt, AttemptOutcome, Engine, EngineOptions, MersenneTwister, Observer, PoolConfig,
    RetryPolicy, TaskRef, TaskSpec,
};

type Calls = Arc<Mutex<Vec<(u64, Option<AttemptOutcome>, f64)>>>;

/// Keeps (lease, outcome or None for a start, wait or runtime).
struct Log(Calls);

impl Observer for Log {
    fn started(&mut self, att: &Attempt, wait: f64) {
        self.0.lock().unwrap().push((att.lease, None, wait));
    }

    fn ended(&mut self, att: &Attempt, outcome: AttemptOutcome, runtime: f64) {
        self.0
            .lock()
            .unwrap()
            .push((att.lease, Some(outcome), runtime));
    }
}

fn engine() -> Engine {
    let pool = PoolConfig {
        capacity: 2,
        retry: RetryPolicy::new(2, 1.0, 2.0, 60.0, false).unwrap(),
        ..PoolConfig::new("p")
    };
    Engine::new(
        vec![pool],
        0.0,
        EngineOptions::default(),
        MersenneTwister::new(0),
    )
    .unwrap()
}

#[test]
fn the_observer_is_told_the_wait_for_a_slot_and_how_each_attempt_ended() {
    let mut eng = engine();
    let calls = Calls::default();
    eng.observe(Box::new(Log(calls.clone())));
    let timed = TaskSpec {
        timeout: Some(2.0),
        ..TaskSpec::new("p")
    };
    let a = eng.submit(timed, 1.0).unwrap().0;
    let b = eng.submit(TaskSpec::new("p"), 1.5).unwrap().0;
    assert_eq!(started(&mut eng, 4.0), [a, b]);
    eng.advance(6.0); // a times out and retries at 7
    eng.complete(2, 6.5);
    eng.advance(7.0);
    assert_eq!(started(&mut eng, 7.5), [a]);
    eng.cancel(TaskRef::Id(a), 8.0);
    let got = calls.lock().unwrap().clone();
    assert_eq!(
        got,
        [
            (1, None, 3.0),
            (2, None, 2.5),
            (1, Some(AttemptOutcome::TimedOut), 2.0),
            (2, Some(AttemptOutcome::Succeeded), 2.5),
            (3, None, 0.5), // waited since its retry made it ready, not since its submit
            (3, Some(AttemptOutcome::Cancelled), 0.5),
        ]
    );
}

#[test]
fn ready_view_counts_ready_tasks_and_the_head_of_each_class() {
    let mut eng = engine();
    eng.set_capacity("p", 0, 0.0).unwrap();
    for (cls, at) in [(1, 1.0), (1, 2.0), (3, 3.0)] {
        let spec = TaskSpec {
            cls,
            ..TaskSpec::new("p")
        };
        eng.submit(spec, at).unwrap();
    }
    let view = &eng.ready_view()[0];
    assert_eq!(view.ready_by_class, [0, 2, 0, 1]);
    assert_eq!(view.oldest_ready_at, [None, Some(1.0), None, Some(3.0)]);
    assert_eq!((view.retries, view.dead_lettered), (0, 0));
}
