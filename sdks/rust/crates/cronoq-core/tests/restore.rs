//! Restore, rule by rule, with the outcomes the Python core gives for the same calls (the
//! differential suite in tests/parity restarts engines at random), and a proptest invariant
//! of a failover over random sequences.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use cronoq_core::restore::{MSG_LOST, MSG_LOST_RETRY};
use cronoq_core::{
    DepOn, Engine, EngineOptions, MersenneTwister, PoolConfig, RetryPolicy, Status, StoredTask,
    TaskId, TaskRef, TaskSpec,
};
use proptest::prelude::*;

use common::{pick, started, status};

fn engine(pools: &[&str], first_id: TaskId) -> Engine {
    let pools = pools
        .iter()
        .map(|&name| PoolConfig {
            capacity: 2,
            retry: RetryPolicy::new(2, 1.0, 2.0, 60.0, false).unwrap(),
            ..PoolConfig::new(name)
        })
        .collect();
    let options = EngineOptions {
        first_id,
        journal: true,
        ..EngineOptions::default()
    };
    Engine::new(pools, 0.0, options, MersenneTwister::new(0)).unwrap()
}

/// Every task of the engine as a store keeps it.
fn stored(eng: &Engine) -> Vec<StoredTask> {
    eng.tasks()
        .map(|r| StoredTask {
            record: r.clone(),
            pool: Arc::from(eng.pool_name(r.pool).unwrap()),
            kind: Arc::from(eng.kind_name(r.kind).unwrap()),
        })
        .collect()
}

/// A fresh engine of these pools that took back the old one's tasks at `now`.
fn failover(old: &Engine, pools: &[&str], now: f64, broken: &[(TaskId, &str)]) -> Engine {
    let mut eng = engine(pools, old.next_id());
    let broken: HashMap<TaskId, String> = broken.iter().map(|&(i, s)| (i, s.into())).collect();
    eng.restore(stored(old), now, &broken);
    eng
}

fn rec(eng: &Engine, id: TaskId) -> &cronoq_core::TaskRecord {
    eng.lookup(TaskRef::Id(id)).unwrap()
}

#[test]
fn a_lost_attempt_retries_after_its_backoff_and_a_lost_last_one_is_dead_lettered() {
    let mut old = engine(&["p"], 1);
    let a = old.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    let b = old.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    assert_eq!(started(&mut old, 0.0), [a, b]);
    let lease_b = old.running().find(|x| x.task == b).unwrap().lease;
    old.fail(lease_b, 1.0, "boom", false, None); // b retries at 2.0 with attempt 2 next
    old.advance(2.0);
    assert_eq!(started(&mut old, 2.0), [b]);
    let mut eng = failover(&old, &["p"], 10.0, &[]);
    // a's first attempt is used up: attempt 2 after the 1 s backoff, not at once
    let ra = rec(&eng, a);
    assert_eq!(
        (ra.status, ra.attempt, ra.ready_at),
        (Status::Retrying, 1, 11.0)
    );
    assert_eq!(ra.message.as_deref(), Some(MSG_LOST_RETRY));
    // b's last attempt is lost: dead-lettered, counted from here
    let rb = rec(&eng, b);
    assert_eq!(
        (rb.status, rb.message.as_deref()),
        (Status::DeadLettered, Some(MSG_LOST))
    );
    assert_eq!(
        rb.history().len(),
        1,
        "its earlier attempt stays in its history"
    );
    assert_eq!((eng.totals().retries, eng.totals().dead_lettered), (1, 1));
    assert_eq!(
        eng.totals().submitted,
        0,
        "restored tasks are not counted as submitted"
    );
    assert!(started(&mut eng, 10.5).is_empty());
    eng.advance(11.0);
    assert_eq!(started(&mut eng, 11.0), [a]);
    assert_eq!(rec(&eng, a).attempt, 2);
}

#[test]
fn tasks_of_a_pool_gone_or_with_a_broken_row_fail_and_ended_ones_keep_their_pool() {
    let mut old = engine(&["p", "q"], 1);
    let done = old.submit(TaskSpec::new("q"), 0.0).unwrap().0;
    started(&mut old, 0.0);
    let lease = old.running().next().unwrap().lease;
    old.complete(lease, 1.0);
    let live_q = old.submit(TaskSpec::new("q"), 1.0).unwrap().0;
    let broken = old.submit(TaskSpec::new("p"), 1.0).unwrap().0;
    let fine = old.submit(TaskSpec::new("p"), 1.0).unwrap().0;
    let mut eng = failover(
        &old,
        &["p"],
        5.0,
        &[(broken, "corrupt task row"), (fine, "")],
    );
    let r = rec(&eng, live_q);
    assert_eq!(r.status, Status::Failed);
    assert_eq!(
        r.message.as_deref(),
        Some("pool 'q' is no longer configured")
    );
    assert_eq!((r.finished_at, eng.pool_name(r.pool)), (5.0, Some("q")));
    assert_eq!(
        rec(&eng, broken).message.as_deref(),
        Some("corrupt task row")
    );
    let d = rec(&eng, done);
    assert_eq!(
        (d.status, eng.pool_name(d.pool)),
        (Status::Succeeded, Some("q"))
    );
    assert_eq!(
        status(&eng, fine),
        Status::Ready,
        "an empty reason counts as none"
    );
    assert_eq!(eng.live(), 1);
    // the failed rows are written back; nothing was added
    let journal = eng.take_journal().unwrap();
    assert!(journal.added.is_empty());
    let changed: Vec<TaskId> = journal.changed.iter().map(|r| r.id).collect();
    assert_eq!(changed, [live_q, broken, fine]);
    assert!(
        eng.take().finished.is_empty(),
        "failing at restore is no outcome to report"
    );
}

#[test]
fn a_blocked_task_waits_for_its_restored_parent_and_a_lost_fixed_start_arrives_late() {
    let mut old = engine(&["p"], 1);
    let parent = old.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    let edges = [(TaskRef::Id(parent), DepOn::Success)];
    let child = old
        .submit(
            TaskSpec {
                deps: &edges,
                ..TaskSpec::new("p")
            },
            0.0,
        )
        .unwrap()
        .0;
    let fixed = TaskSpec {
        start_at: Some(1.0),
        tolerance: 5.0,
        ..TaskSpec::new("p")
    };
    let timed = old.submit(fixed, 0.0).unwrap().0;
    old.advance(1.0);
    assert_eq!(started(&mut old, 1.0), [timed, parent]);
    let mut eng = failover(&old, &["p"], 3.0, &[]);
    // the fixed start's attempt is lost with attempts left: it starts again, late but
    // within its tolerance, before the parent's retry
    assert_eq!(status(&eng, child), Status::Blocked);
    assert_eq!(started(&mut eng, 3.0), [timed]);
    eng.advance(4.0);
    assert_eq!(started(&mut eng, 4.0), [parent]);
    let lease = pick(&eng, 1).unwrap();
    assert_eq!(eng.attempt(lease).unwrap().task, parent);
    eng.complete(lease, 5.0);
    assert_eq!(status(&eng, child), Status::Ready);
}

proptest! {
    /// After a failover with every pool configured and no broken row, every task is held as
    /// it was stored, no live task fails, a running one retries or is dead-lettered, and the
    /// pending counts add up to the live tasks.
    #[test]
    fn a_failover_keeps_every_task(ops in proptest::collection::vec((0u8..4, 0usize..8), 0..60)) {
        let mut old = engine(&["p", "q"], 1);
        let mut now = 0.0;
        for (op, n) in ops {
            now += 0.5;
            match op {
                0 => {
                    let pool = if n % 2 == 0 { "p" } else { "q" };
                    old.submit(TaskSpec { cls: (n % 4) as u8, ..TaskSpec::new(pool) }, now)
                        .unwrap();
                }
                1 => old.dispatch(now),
                2 => if let Some(l) = pick(&old, n) { old.complete(l, now); },
                _ => if let Some(l) = pick(&old, n) { old.fail(l, now, "boom", n == 0, None); },
            }
            old.advance(now);
        }
        let eng = failover(&old, &["p", "q"], now + 1.0, &[]);
        prop_assert_eq!(eng.tasks().count(), old.tasks().count());
        for r in old.tasks() {
            let got = rec(&eng, r.id);
            let want = match r.status {
                Status::Running if got.status == Status::Retrying => Status::Retrying,
                Status::Running => Status::DeadLettered,
                s => s,
            };
            prop_assert_eq!(got.status, want, "task {}", r.id);
        }
        let pending: i64 = eng.pools().iter().map(|p| p.pending()).sum();
        prop_assert_eq!(pending as u64, eng.live());
        prop_assert_eq!(eng.running().count(), 0);
    }
}
