//! Property tests of the invariants the Python simulations check (tests/sim), over random
//! operation sequences: the live count is the tasks not ended, dispatch never fills more than
//! the capacity, pending counts match the statuses, every attempt ends at most once, and after
//! `advance(t)` nothing is overdue; with an autoscaled pool (elastic) and a fair-share one.

mod common;

use std::collections::HashSet;

use common::pick;
use cronoq_core::autoscale::AutoscaleSettings;
use cronoq_core::model::Lease;
use cronoq_core::vocab::Overflow;
use cronoq_core::{
    Engine, EngineOptions, MersenneTwister, PoolConfig, RetryPolicy, Status, TaskRef, TaskSpec,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Submit {
        pool: usize,
        cls: u8,
        key: Option<u8>,
        deadline: Option<f64>,
        timeout: Option<f64>,
        tenant: Option<u8>,
    },
    Dispatch,
    Advance(f64),
    Complete(usize),
    Fail(usize, bool),
    Heartbeat(usize),
    Stale(usize),
    Cancel(u64),
    SetCapacity(usize, u32),
    Pause(usize, bool),
    Delete(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let secs = prop_oneof![Just(None), (0.0f64..20.0).prop_map(Some)];
    prop_oneof![
        4 => (0usize..2, 0u8..4, proptest::option::of(0u8..4), secs.clone(), secs, proptest::option::of(0u8..3))
            .prop_map(|(pool, cls, key, deadline, timeout, tenant)| Op::Submit { pool, cls, key, deadline, timeout, tenant }),
        3 => Just(Op::Dispatch),
        3 => prop_oneof![0.0f64..3.0, Just(60.0)].prop_map(Op::Advance),
        2 => (0usize..8).prop_map(Op::Complete),
        2 => (0usize..8, any::<bool>()).prop_map(|(i, p)| Op::Fail(i, p)),
        1 => (0usize..8).prop_map(Op::Heartbeat),
        1 => (0usize..64).prop_map(Op::Stale),
        1 => (1u64..40).prop_map(Op::Cancel),
        1 => (0usize..2, 0u32..4).prop_map(|(p, n)| Op::SetCapacity(p, n)),
        1 => (0usize..2, any::<bool>()).prop_map(|(p, on)| Op::Pause(p, on)),
        1 => (1u64..40).prop_map(Op::Delete),
    ]
}

fn pools() -> Vec<PoolConfig> {
    vec![
        PoolConfig {
            capacity: 2,
            lease_ttl: Some(1.0),
            max_pending: Some(4),
            overflow: Overflow::ShedLowest,
            min: 0,
            max: 4,
            autoscale: Some(AutoscaleSettings {
                stabilization_window: 3.0,
                cooldown: 1.0,
                ..AutoscaleSettings::default()
            }),
            ..PoolConfig::new("a")
        },
        PoolConfig {
            capacity: 1,
            retry: RetryPolicy::new(3, 0.5, 2.0, 4.0, true).unwrap(),
            fair_share: true,
            tenant_weights: vec![("t0".into(), 3.0), ("t1".into(), 0.5)],
            ..PoolConfig::new("b")
        },
    ]
}

fn check(eng: &Engine) -> Result<(), TestCaseError> {
    let live = eng.tasks().filter(|r| !r.status.is_terminal()).count() as u64;
    prop_assert_eq!(eng.live(), live);
    for (p, pool) in eng.pools().iter().enumerate() {
        let running = eng
            .running()
            .filter(|a| eng.lookup(TaskRef::Id(a.task)).unwrap().pool == p);
        prop_assert_eq!(pool.busy, running.count() as i64);
        for cls in 0..4u8 {
            let mine = |s: Status| {
                eng.tasks()
                    .filter(|r| r.pool == p && r.cls == cls && r.status == s)
                    .count() as i64
            };
            let c = usize::from(cls);
            prop_assert_eq!(
                pool.pending_by_class[c],
                mine(Status::Ready) + mine(Status::Retrying)
            );
            prop_assert_eq!(pool.retrying_by_class[c], mine(Status::Retrying));
        }
        let queued = eng
            .tasks()
            .filter(|r| r.pool == p && r.status == Status::Ready)
            .count();
        prop_assert_eq!(pool.queues.n, queued as i64);
        let by_class: i64 = pool.queues.classes.iter().map(|q| q.n()).sum();
        prop_assert_eq!(by_class, pool.queues.n);
        if let Some(scaler) = &pool.scaler {
            prop_assert!(scaler.min() <= pool.desired() && pool.desired() <= scaler.max());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn invariants_hold_after_every_operation(ops in proptest::collection::vec(op(), 1..120), seed in 0i128..1000) {
        let names = ["a", "b"];
        let options = EngineOptions { retention: 5.0, retention_max: 20, ..EngineOptions::default() };
        let mut eng = Engine::new(pools(), 0.0, options, MersenneTwister::new(seed)).unwrap();
        let mut now = 0.0;
        let mut issued: Vec<Lease> = Vec::new();
        let mut ended: HashSet<Lease> = HashSet::new();
        for op in ops {
            let busy_before: Vec<i64> = eng.pools().iter().map(|p| p.busy).collect();
            match op {
                Op::Submit { pool, cls, key, deadline, timeout, tenant } => {
                    let spec = TaskSpec {
                        cls,
                        tenant: tenant.map(|t| ["t0", "t1", "t2"][usize::from(t)]),
                        key: key.map(|k| ["k0", "k1", "k2", "k3"][usize::from(k)]),
                        deadline: deadline.map(|d| now + d),
                        timeout,
                        ..TaskSpec::new(names[pool])
                    };
                    let _ = eng.submit(spec, now);
                }
                Op::Dispatch => eng.dispatch(now),
                Op::Advance(dt) => {
                    now += dt;
                    eng.advance(now);
                    if let Some(t) = eng.next_wake() {
                        prop_assert!(t > now, "next_wake {} not after {}", t, now);
                    }
                }
                Op::Complete(i) => if let Some(l) = pick(&eng, i) {
                    prop_assert!(eng.complete(l, now));
                    prop_assert!(ended.insert(l));
                },
                Op::Fail(i, permanent) => if let Some(l) = pick(&eng, i) {
                    prop_assert!(eng.fail(l, now, "boom", permanent, None));
                    prop_assert!(ended.insert(l));
                },
                Op::Heartbeat(i) => if let Some(l) = pick(&eng, i) {
                    prop_assert!(eng.heartbeat(l, now));
                },
                Op::Stale(i) => if !issued.is_empty() {
                    let l = issued[i % issued.len()];
                    let stale = eng.totals().stale_completions;
                    let done = eng.complete(l, now);
                    prop_assert_eq!(done, !ended.contains(&l));
                    prop_assert_eq!(eng.totals().stale_completions, stale + u64::from(!done));
                    if done {
                        ended.insert(l);
                    }
                },
                Op::Cancel(id) => { eng.cancel(TaskRef::Id(id), now); }
                Op::SetCapacity(p, n) => eng.set_capacity(names[p], n, now).unwrap(),
                Op::Pause(p, on) => {
                    let _ = if on { eng.pause(names[p], now) } else { eng.resume(names[p], now) };
                }
                Op::Delete(id) => { eng.delete(&[id]); }
            }
            let acts = eng.take();
            for a in &acts.starts {
                prop_assert!(!issued.contains(&a.lease));
                issued.push(a.lease);
            }
            for a in &acts.aborts {
                prop_assert!(ended.insert(a.lease), "lease {} ended twice", a.lease);
            }
            for (p, pool) in eng.pools().iter().enumerate() {
                // Dispatch fills free slots only; a lowered capacity just starts nothing.
                prop_assert!(pool.busy <= pool.capacity.max(busy_before[p]));
            }
            check(&eng)?;
        }
    }
}
