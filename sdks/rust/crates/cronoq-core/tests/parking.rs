//! Resources, parking and worker groups: the tricky rules one by one (the differential suite in
//! tests/parity checks them all at random against the Python core), and property tests of the
//! invariants they keep.

mod common;

use std::collections::HashSet;

use common::{pick, started};
use cronoq_core::engine::MSG_SHED;
use cronoq_core::model::Lease;
use cronoq_core::parking::Parked;
use cronoq_core::vocab::Overflow;
use cronoq_core::{
    Engine, EngineOptions, MersenneTwister, PoolConfig, ResourceConfig, Status, TaskRef, TaskSpec,
};
use proptest::prelude::*;

fn engine(capacity: u32, resources: Vec<ResourceConfig>) -> Engine {
    let pool = PoolConfig {
        capacity,
        ..PoolConfig::new("p")
    };
    let options = EngineOptions {
        resources,
        ..EngineOptions::default()
    };
    Engine::new(vec![pool], 0.0, options, MersenneTwister::new(0)).unwrap()
}

fn wants<'a>(cls: u8, resources: &'a [(&'a str, u32)]) -> TaskSpec<'a> {
    TaskSpec {
        cls,
        resources,
        ..TaskSpec::new("p")
    }
}

fn labeled<'a>(labels: &'a [(&'a str, &'a str)]) -> TaskSpec<'a> {
    TaskSpec {
        labels: Some(labels),
        ..TaskSpec::new("p")
    }
}

fn submit(eng: &mut Engine, spec: TaskSpec<'_>, now: f64) -> u64 {
    eng.submit(spec, now).unwrap().0
}

fn lease_of(eng: &Engine, id: u64) -> Lease {
    eng.lookup(TaskRef::Id(id)).unwrap().running.unwrap()
}

fn parked(eng: &Engine, id: u64) -> Option<Parked> {
    eng.lookup(TaskRef::Id(id)).unwrap().parked
}

fn db(permits: u32) -> ResourceConfig {
    ResourceConfig::semaphore("db", permits).unwrap()
}

#[test]
fn a_task_short_of_permits_waits_aside_and_is_offered_them_when_an_attempt_returns_them() {
    let mut eng = engine(4, vec![db(2)]);
    let big = submit(&mut eng, wants(1, &[("db", 2)]), 0.0);
    let short = submit(&mut eng, wants(1, &[("db", 1)]), 0.0);
    let plain = submit(&mut eng, wants(3, &[]), 0.0);
    assert_eq!(
        started(&mut eng, 0.0),
        [big, plain],
        "the short one blocks nobody"
    );
    assert_eq!(parked(&eng, short), Some(Parked::Resource(0)));
    assert_eq!(eng.pools()[0].queues.n, 0, "parked tasks are not queued");
    assert!(eng.complete(lease_of(&eng, big), 1.0));
    assert!(
        eng.parking().reoffer,
        "the next dispatch offers the permits"
    );
    assert_eq!(started(&mut eng, 1.0), [short]);
    assert_eq!(eng.parking().resources[0].in_use, 1);
    assert_eq!(eng.resource_level("db", 1.0), Some(1.0));
}

#[test]
fn a_task_waits_behind_the_tasks_parked_before_it_and_smaller_ones_pass_a_big_one() {
    let api = ResourceConfig::token_bucket("api", 1.0, 4).unwrap();
    let mut eng = engine(4, vec![api]);
    let first = submit(&mut eng, wants(2, &[("api", 3)]), 0.0);
    assert_eq!(started(&mut eng, 0.0), [first]);
    // One token left: the next wants 2 and parks; a third wants only 1, which the bucket has,
    // but it waits behind the parked one, then passes it at the offer (work conserving).
    let big = submit(&mut eng, wants(0, &[("api", 2)]), 0.0);
    assert_eq!(started(&mut eng, 0.0), []);
    let small = submit(&mut eng, wants(3, &[("api", 1)]), 0.0);
    assert_eq!(parked(&eng, small), Some(Parked::Resource(0)));
    assert!(eng.parking().reoffer);
    assert_eq!(started(&mut eng, 0.0), [small]);
    // The big one's refill timer: 2 tokens at 2.0 s.
    assert_eq!(
        eng.next_wake(),
        Some(1.0),
        "first the wake for the missing token"
    );
    eng.advance(1.0);
    assert_eq!(started(&mut eng, 1.0), []);
    assert_eq!(eng.next_wake(), Some(2.0));
    eng.advance(2.0);
    assert_eq!(started(&mut eng, 2.0), [big]);
}

#[test]
fn a_short_refill_wakes_strictly_after_now_at_unix_sized_times() {
    let now = 1.7e9;
    let api = ResourceConfig::token_bucket("api", 1e9, 1).unwrap();
    let pool = PoolConfig {
        capacity: 2,
        ..PoolConfig::new("p")
    };
    let options = EngineOptions {
        resources: vec![api],
        ..EngineOptions::default()
    };
    let mut eng = Engine::new(vec![pool], now, options, MersenneTwister::new(0)).unwrap();
    let a = submit(&mut eng, wants(2, &[("api", 1)]), now);
    let b = submit(&mut eng, wants(2, &[("api", 1)]), now);
    assert_eq!(started(&mut eng, now), [a]);
    assert_eq!(eng.next_wake(), Some(now.next_up()));
    eng.advance(now.next_up());
    assert_eq!(started(&mut eng, now.next_up()), [b]);
}

#[test]
fn resource_errors_name_the_first_failing_resource_and_amounts_are_checked_first() {
    let api = ResourceConfig::token_bucket("api", 1.0, 2).unwrap();
    let mut eng = engine(1, vec![db(2), api]);
    let err = eng
        .submit(wants(2, &[("db", 1), ("gpu", 1), ("api", 9)]), 0.0)
        .unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        ("unknown_resource", "unknown resource 'gpu'")
    );
    let err = eng.submit(wants(2, &[("api", 3)]), 0.0).unwrap_err();
    assert_eq!(err.code, "resource_exceeds_capacity");
    assert_eq!(
        err.message,
        "requested amount exceeds capacity of resource 'api'"
    );
    // As in a dict, the last amount of a name counts.
    assert!(eng.submit(wants(2, &[("api", 3), ("api", 2)]), 0.0).is_ok());
    // The edge checks amounts before the engine sees the key.
    let keyed = TaskSpec {
        key: Some("k"),
        ..TaskSpec::new("p")
    };
    eng.submit(keyed, 0.0).unwrap();
    let zero = TaskSpec {
        key: Some("k"),
        resources: &[("db", 0)],
        ..TaskSpec::new("p")
    };
    let err = eng.submit(zero, 0.0).unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        ("invalid", "invalid task: resource amount must be > 0")
    );
    let batch = [keyed, zero];
    assert_eq!(eng.submit_batch(&batch, 0.0).unwrap_err().code, "invalid");
    let resolved = eng.resolve_resources(&[("api", 1), ("db", 2)]).unwrap();
    assert_eq!(&resolved[..], [(1, 1), (0, 2)]);
}

#[test]
fn duplicate_resource_names_are_refused() {
    let options = EngineOptions {
        resources: vec![db(1), db(2)],
        ..EngineOptions::default()
    };
    let err = Engine::new(
        vec![PoolConfig::new("p")],
        0.0,
        options,
        MersenneTwister::new(0),
    )
    .unwrap_err();
    assert_eq!(err.0, "duplicate resource name 'db'");
}

#[test]
fn overflow_sheds_a_parked_task_like_a_queued_one() {
    let pool = PoolConfig {
        capacity: 1,
        max_pending: Some(2),
        overflow: Overflow::ShedLowest,
        ..PoolConfig::new("p")
    };
    let options = EngineOptions {
        resources: vec![db(1)],
        ..EngineOptions::default()
    };
    let mut eng = Engine::new(vec![pool], 0.0, options, MersenneTwister::new(0)).unwrap();
    let runs = submit(&mut eng, wants(2, &[("db", 1)]), 0.0);
    assert_eq!(started(&mut eng, 0.0), [runs]);
    let low = submit(&mut eng, wants(3, &[("db", 1)]), 0.0); // parked at once: db is short
    let queued = submit(&mut eng, wants(2, &[]), 0.0);
    assert_eq!(parked(&eng, low), Some(Parked::Resource(0)));
    submit(&mut eng, wants(1, &[]), 0.0); // full: the low task goes, from its parking
    let shed = &eng.take().finished;
    assert_eq!(shed.len(), 1);
    assert_eq!((shed[0].id, shed[0].status), (low, Status::Shed));
    assert_eq!(shed[0].message.as_deref(), Some(MSG_SHED));
    assert_eq!(shed[0].parked, None);
    assert_eq!(
        eng.lookup(TaskRef::Id(queued)).unwrap().status,
        Status::Ready
    );
}

#[test]
fn a_due_fixed_start_short_of_a_resource_stays_due_and_lets_the_next_one_start() {
    let mut eng = engine(3, vec![db(1)]);
    let holder = submit(&mut eng, wants(2, &[("db", 1)]), 0.0);
    assert_eq!(started(&mut eng, 0.0), [holder]);
    let fixed = |start: f64, resources| TaskSpec {
        start_at: Some(start),
        resources,
        ..TaskSpec::new("p")
    };
    let short = submit(&mut eng, fixed(1.0, &[("db", 1)]), 1.0);
    let next = submit(&mut eng, fixed(1.5, &[]), 1.0);
    eng.advance(1.5);
    assert_eq!(
        started(&mut eng, 1.5),
        [next],
        "the short one lets the next due one try"
    );
    let rec = eng.lookup(TaskRef::Id(short)).unwrap();
    assert_eq!(
        (rec.status, rec.parked),
        (Status::Ready, None),
        "due, not parked"
    );
    assert_eq!(eng.pools()[0].holds, 1, "it keeps its held slot");
    assert!(eng.complete(lease_of(&eng, holder), 2.0));
    assert_eq!(started(&mut eng, 2.0), [short], "started on its held slot");
    assert_eq!(eng.pools()[0].holds, 0);
}

#[test]
fn a_due_fixed_start_without_a_matching_group_slot_stays_due() {
    let mut eng = engine(1, vec![]);
    let spec = TaskSpec {
        start_at: Some(0.0),
        labels: Some(&[("zone", "a")]),
        ..TaskSpec::new("p")
    };
    let id = submit(&mut eng, spec, 0.0);
    assert!(started(&mut eng, 0.0).is_empty());
    assert_eq!(parked(&eng, id), None, "not parked on the groups");
    eng.set_group_capacity("p", &[("zone", "a")], 1, 1.0)
        .unwrap();
    assert_eq!(started(&mut eng, 1.0), [id]);
}

#[test]
fn a_held_slot_let_go_offers_resources_again() {
    let mut eng = engine(1, vec![db(1)]);
    let spec = TaskSpec {
        start_at: Some(10.0),
        ..TaskSpec::new("p")
    };
    let id = submit(&mut eng, spec, 0.0);
    eng.advance(9.5);
    assert!(started(&mut eng, 9.5).is_empty());
    assert_eq!(eng.pools()[0].holds, 1);
    assert!(!eng.parking().reoffer);
    assert!(eng.cancel(TaskRef::Id(id), 9.5));
    assert_eq!(eng.pools()[0].holds, 0);
    assert!(
        eng.parking().reoffer,
        "the freed slot is offered to tasks parked on a resource"
    );
}

#[test]
fn labeled_tasks_wait_for_a_matching_group_and_unlabeled_ones_take_unlabeled_slots_first() {
    let mut eng = engine(1, vec![]);
    let gpu: &[(&str, &str)] = &[("gpu", "1")];
    let zone: &[(&str, &str)] = &[("zone", "a"), ("gpu", "1")];
    let labeled_one = submit(&mut eng, labeled(gpu), 0.0);
    let unlabeled = submit(&mut eng, TaskSpec::new("p"), 0.0);
    assert_eq!(
        started(&mut eng, 0.0),
        [unlabeled],
        "no group carries gpu=1"
    );
    assert_eq!(parked(&eng, labeled_one), Some(Parked::Group));
    eng.set_group_capacity("p", zone, 1, 1.0).unwrap();
    assert_eq!(eng.pools()[0].capacity, 2);
    assert!(
        eng.group_has_room("p", &[("gpu", "1"), ("zone", "a")])
            .unwrap()
    );
    eng.dispatch(1.0);
    let starts = eng.take().starts;
    assert_eq!(starts.len(), 1);
    assert_eq!(
        starts[0].task, labeled_one,
        "a group carrying its labels serves it"
    );
    let key = starts[0].slot.as_deref().unwrap();
    assert_eq!(key.len(), 2);
    assert_eq!((&*key[0].0, &*key[1].0), ("gpu", "zone"), "the sorted set");
    assert!(!eng.group_has_room("p", zone).unwrap());
    assert!(
        !eng.group_has_room("p", &[]).unwrap(),
        "the unlabeled slot is busy"
    );
    // A hand-back to the unlabeled slots (over its capacity) frees the group slot.
    assert!(eng.move_attempt(starts[0].lease, &[]));
    assert!(eng.group_has_room("p", zone).unwrap());
    let groups = eng.pools()[0].groups.as_ref().unwrap();
    assert_eq!((groups.unlabeled_busy, groups.by_key[0].busy), (2, 0));
    assert!(eng.complete(lease_of(&eng, unlabeled), 2.0));
    let next = submit(&mut eng, TaskSpec::new("p"), 2.0);
    eng.dispatch(2.0);
    let starts = eng.take().starts;
    assert_eq!(starts[0].task, next);
    assert!(
        starts[0].slot.is_some(),
        "the unlabeled slot is still taken: a group's serves an unlabeled task"
    );
}

#[test]
fn lowered_unlabeled_capacity_keeps_the_groups_slots() {
    let mut eng = engine(2, vec![]);
    eng.set_group_capacity("p", &[("gpu", "1")], 3, 0.0)
        .unwrap();
    eng.set_capacity("p", 1, 0.0).unwrap();
    let pool = &eng.pools()[0];
    assert_eq!((pool.unlabeled, pool.capacity), (1, 4));
    eng.set_group_capacity("p", &[("gpu", "1")], 0, 0.0)
        .unwrap();
    let pool = &eng.pools()[0];
    assert_eq!(pool.capacity, 1);
    assert!(pool.groups.as_ref().unwrap().by_key.is_empty());
}

#[test]
fn an_attempt_moved_within_its_group_without_slots_keeps_the_group() {
    // The Python core dropped the group here, and the slots declared again with it later.
    let mut eng = engine(0, vec![]);
    let a: &[(&str, &str)] = &[("zone", "a")];
    eng.set_group_capacity("p", a, 1, 0.0).unwrap();
    let first = submit(&mut eng, labeled(a), 0.0);
    assert_eq!(started(&mut eng, 0.0), [first]);
    let lease = lease_of(&eng, first);
    eng.set_group_capacity("p", a, 0, 1.0).unwrap();
    assert!(eng.move_attempt(lease, a));
    eng.set_group_capacity("p", a, 1, 2.0).unwrap();
    let second = submit(&mut eng, labeled(a), 2.0);
    assert!(eng.complete(lease, 3.0));
    assert!(eng.group_has_room("p", a).unwrap());
    assert_eq!(started(&mut eng, 3.0), [second]);
    assert!(
        !eng.move_attempt(lease, a),
        "an ended attempt moves nowhere"
    );
}

// --- invariants ----------------------------------------------------------------------------

const AMOUNTS: [&[(&str, u32)]; 5] = [
    &[],
    &[("db", 1)],
    &[("db", 2), ("api", 1)],
    &[("api", 2)],
    &[("api", 1), ("db", 1)],
];
const LABELS: [&[(&str, &str)]; 4] = [&[], &[("zone", "a")], &[("gpu", "1")], &[("zone", "b")]];

#[derive(Clone, Debug)]
enum Op {
    Submit {
        cls: u8,
        amounts: usize,
        labels: usize,
    },
    Dispatch,
    Advance(f64),
    Complete(usize),
    Fail(usize),
    Cancel(u64),
    SetCapacity(u32),
    SetGroup(usize, u32),
    Move(usize, usize),
    Pause(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0..AMOUNTS.len(), 0..LABELS.len())
            .prop_map(|(cls, amounts, labels)| Op::Submit { cls, amounts, labels }),
        3 => Just(Op::Dispatch),
        2 => prop_oneof![0.0f64..3.0, Just(30.0)].prop_map(Op::Advance),
        2 => (0usize..8).prop_map(Op::Complete),
        1 => (0usize..8).prop_map(Op::Fail),
        1 => (1u64..40).prop_map(Op::Cancel),
        1 => (0u32..4).prop_map(Op::SetCapacity),
        1 => (1..LABELS.len(), 0u32..3).prop_map(|(l, n)| Op::SetGroup(l, n)),
        1 => (0usize..8, 0..LABELS.len()).prop_map(|(i, l)| Op::Move(i, l)),
        1 => any::<bool>().prop_map(Op::Pause),
    ]
}

/// Counts match what the tasks and attempts say, and every parked task has exactly its
/// one live entry where it waits.
fn check(eng: &Engine) -> Result<(), TestCaseError> {
    let pool = &eng.pools()[0];
    let park = eng.parking();
    for (r, res) in park.resources.iter().enumerate() {
        let held: i64 = eng
            .running()
            .filter(|_| !res.is_bucket())
            .filter_map(|a| eng.lookup(TaskRef::Id(a.task)).unwrap().extra.as_ref())
            .filter_map(|e| e.wanted.as_ref())
            .flat_map(|w| {
                w.iter()
                    .filter(|(i, _)| *i == r)
                    .map(|(_, n)| i64::from(*n))
            })
            .sum();
        prop_assert_eq!(res.in_use, held);
        prop_assert!(res.tokens >= 0.0 && res.tokens <= f64::from(res.cfg.capacity()));
        prop_assert!(res.in_use <= i64::from(res.cfg.capacity()));
    }
    let ready: Vec<_> = eng.tasks().filter(|r| r.status == Status::Ready).collect();
    let waiting = ready.iter().filter(|r| r.parked.is_some()).count() as i64;
    prop_assert_eq!(pool.queues.n + waiting, ready.len() as i64);
    prop_assert!(
        eng.tasks()
            .all(|r| r.parked.is_none() || r.status == Status::Ready)
    );
    for rec in &ready {
        let Some(on) = rec.parked else { continue };
        let heap = match on {
            Parked::Resource(r) => &park.resources[r].parked,
            Parked::Group => &pool.groups.as_ref().unwrap().parked,
        };
        let live = heap
            .iter()
            .filter(|e| e.task == rec.id && e.generation == rec.qgen)
            .count();
        prop_assert_eq!(live, 1, "task {} waits on {:?}", rec.id, on);
    }
    if let Some(groups) = &pool.groups {
        let on_groups: i64 = groups.by_key.iter().map(|g| g.busy).sum();
        prop_assert_eq!(groups.unlabeled_busy + on_groups, pool.busy);
        prop_assert_eq!(pool.capacity, pool.unlabeled + groups.total());
        let keys: HashSet<_> = groups.by_key.iter().map(|g| g.key.clone()).collect();
        prop_assert_eq!(keys.len(), groups.by_key.len(), "one group per label set");
        for att in eng.running() {
            if let Some(key) = &att.slot {
                prop_assert!(
                    keys.contains(key),
                    "attempt {} on a dropped group",
                    att.lease
                );
            }
        }
        prop_assert!(groups.by_key.iter().all(|g| g.capacity > 0 || g.busy > 0));
    } else {
        prop_assert_eq!(pool.capacity, pool.unlabeled);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn parking_keeps_its_counts(ops in proptest::collection::vec(op(), 1..120), seed in 0i128..1000) {
        let api = ResourceConfig::token_bucket("api", 0.5, 3).unwrap();
        let options = EngineOptions { resources: vec![db(2), api], retention_max: 5, ..EngineOptions::default() };
        let pool = PoolConfig { capacity: 2, max_pending: Some(8), overflow: Overflow::ShedOldest, ..PoolConfig::new("p") };
        let mut eng = Engine::new(vec![pool], 0.0, options, MersenneTwister::new(seed)).unwrap();
        let mut now = 0.0;
        for op in ops {
            match op {
                Op::Submit { cls, amounts, labels } => {
                    let spec = TaskSpec {
                        cls,
                        resources: AMOUNTS[amounts],
                        labels: Some(LABELS[labels]),
                        ..TaskSpec::new("p")
                    };
                    let _ = eng.submit(spec, now);
                }
                Op::Dispatch => {
                    eng.dispatch(now);
                    // Nothing runs in a pool with slots: the semaphore is whole again, so no
                    // task is left waiting on it (the offers do not lose one).
                    let pool = &eng.pools()[0];
                    if eng.running().count() == 0 && pool.capacity > 0 && !pool.paused {
                        let on_db = Some(Parked::Resource(0));
                        prop_assert!(eng.tasks().all(|r| r.parked != on_db));
                    }
                }
                Op::Advance(dt) => {
                    now += dt;
                    eng.advance(now);
                    if let Some(t) = eng.next_wake() {
                        prop_assert!(t > now, "next_wake {} not after {}", t, now);
                    }
                }
                Op::Complete(i) => if let Some(l) = pick(&eng, i) {
                    prop_assert!(eng.complete(l, now));
                },
                Op::Fail(i) => if let Some(l) = pick(&eng, i) {
                    prop_assert!(eng.fail(l, now, "boom", false, None));
                },
                Op::Cancel(id) => { eng.cancel(TaskRef::Id(id), now); }
                Op::SetCapacity(n) => eng.set_capacity("p", n, now).unwrap(),
                Op::SetGroup(l, n) => eng.set_group_capacity("p", LABELS[l], n, now).unwrap(),
                Op::Move(i, l) => if let Some(lease) = pick(&eng, i) {
                    prop_assert!(eng.move_attempt(lease, LABELS[l]));
                },
                Op::Pause(on) => {
                    let _ = if on { eng.pause("p", now) } else { eng.resume("p", now) };
                }
            }
            eng.take();
            check(&eng)?;
        }
    }
}
