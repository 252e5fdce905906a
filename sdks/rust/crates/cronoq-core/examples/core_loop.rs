//! The Rust core's figure of bench/core.py: the loop of bench/library.py's [3] ("core, virtual
//! clock") on the Rust engine alone. One pool of 64 slots, a backlog queued up front (classes
//! cycling 0..3), then per step: time += 1 us, advance(), dispatch(), take(), complete every
//! started attempt and submit a replacement (its TaskSpec built in the loop). One cycle = one
//! task submitted, dispatched and completed = 3 decisions.
//!
//! `cargo run --release --example core_loop -- BACKLOG COMPLETIONS REPS` prints one line per
//! run: `cycles N seconds S` (the timed loop only; the backlog is queued before the clock
//! starts, as in Python).

use std::time::Instant;

use cronoq_core::{Engine, PoolConfig, TaskSpec};

const SLOTS: u32 = 64;
const POOL: &str = "bench";

fn make(i: u64) -> TaskSpec<'static> {
    TaskSpec {
        cls: (i & 3) as u8,
        ..TaskSpec::new(POOL)
    }
}

fn run(backlog: u64, completions: u64) -> (f64, u64) {
    let cfg = PoolConfig {
        capacity: SLOTS,
        ..PoolConfig::new(POOL)
    };
    let mut eng = Engine::with_defaults(vec![cfg], 0.0).expect("a valid pool");
    for i in 0..backlog {
        eng.submit(make(i), 0.0).expect("an unbounded pool");
    }
    let mut next = backlog;
    let mut done = 0u64;
    let mut step = 0u64;
    let t0 = Instant::now();
    while done < completions {
        step += 1;
        let now = step as f64 * 1e-6;
        eng.advance(now);
        eng.dispatch(now);
        for att in eng.take().starts {
            eng.complete(att.lease, now);
            eng.submit(make(next), now).expect("an unbounded pool");
            next += 1;
            done += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(eng.totals().succeeded, done);
    assert_eq!(eng.live(), backlog);
    (secs, done)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("BACKLOG COMPLETIONS REPS: integers"))
        .collect();
    let (backlog, completions, reps) = match args[..] {
        [b, c, r] => (b, c, r),
        [] => (100_000, 3_000_000, 3),
        _ => panic!("usage: core_loop [BACKLOG COMPLETIONS REPS]"),
    };
    for _ in 0..reps {
        let (secs, cycles) = run(backlog, completions);
        println!("cycles {cycles} seconds {secs:.6}");
    }
}
