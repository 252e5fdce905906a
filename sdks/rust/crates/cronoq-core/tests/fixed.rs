//! Fixed starts and recurring schedules: their tricky rules one by one (the figures are the
//! Python core's for the same calls; the differential suite checks them all at random), and
//! property tests of their bookkeeping over random operation sequences.

mod common;

use common::{started, status};
use cronoq_core::cron::{parse_cron, zone};
use cronoq_core::fixed::{MSG_MISSED, MSG_OVERLAP};
use cronoq_core::pool::peak_overlap;
use cronoq_core::recurring::{Recurring, occurrence_key};
use cronoq_core::vocab::{OnMiss, Overlap};
use cronoq_core::{
    DepOn, Engine, EngineOptions, EventLevel, MersenneTwister, PoolConfig, Status, TaskRef,
    TaskSpec,
};
use proptest::prelude::*;

fn engine(capacity: u32, max: u32) -> Engine {
    let pool = PoolConfig {
        capacity,
        max,
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

fn fixed(start: f64, tolerance: f64, on_miss: OnMiss) -> TaskSpec<'static> {
    TaskSpec {
        start_at: Some(start),
        tolerance,
        on_miss,
        ..TaskSpec::new("p")
    }
}

fn every(name: &str, cron: &str, overlap: Overlap) -> Recurring {
    let mut sched = Recurring::new(name, parse_cron(cron).unwrap(), zone(None).unwrap(), "p");
    sched.overlap = overlap;
    sched
}

#[test]
fn a_slot_is_held_from_start_minus_lead_and_the_task_starts_on_it_on_time() {
    let mut eng = engine(1, 10);
    let (id, _) = eng.submit(fixed(10.0, 2.0, OnMiss::Skip), 0.0).unwrap();
    assert_eq!(status(&eng, id), Status::Scheduled);
    // lead = max(tolerance 2, default duration 1): held from 8
    eng.advance(7.9);
    let (plain, _) = eng.submit(TaskSpec::new("p"), 7.9).unwrap();
    eng.advance(8.0);
    assert_eq!(eng.pools()[0].holds, 1);
    assert_eq!(
        started(&mut eng, 8.0),
        Vec::<u64>::new(),
        "the slot is held"
    );
    assert_eq!(eng.snapshot(8.0).pools[0].held, 1);
    eng.advance(10.0);
    assert_eq!(status(&eng, id), Status::Ready);
    assert_eq!(
        started(&mut eng, 10.0),
        [id],
        "ahead of the older ready task"
    );
    let snap = eng.snapshot(10.0);
    assert_eq!((snap.pools[0].held, snap.pools[0].reservations), (0, 0));
    assert_eq!(snap.pools[0].fixed_start_hit_rate, 1.0);
    assert_eq!(status(&eng, plain), Status::Ready);
}

#[test]
fn on_miss_decides_once_the_tolerance_has_passed() {
    let mut eng = engine(0, 10);
    let ids: Vec<u64> = [OnMiss::Skip, OnMiss::Fail, OnMiss::RunLate]
        .map(|m| eng.submit(fixed(5.0, 1.0, m), 0.0).unwrap().0)
        .to_vec();
    // Already past its tolerance at admission: scheduled, then missed at once.
    let (late, _) = eng.submit(fixed(-3.0, 1.0, OnMiss::Skip), 0.0).unwrap();
    assert_eq!(status(&eng, late), Status::Missed);
    eng.advance(5.0);
    eng.advance(6.0); // the tolerance runs out with no free slot: ended now
    let got: Vec<Status> = ids.iter().map(|&id| status(&eng, id)).collect();
    assert_eq!(got, [Status::Missed, Status::Failed, Status::Ready]);
    let rec = eng.lookup(TaskRef::Id(ids[0])).unwrap();
    assert_eq!(rec.message.as_deref(), Some(MSG_MISSED));
    eng.set_capacity("p", 1, 100.0).unwrap();
    assert_eq!(started(&mut eng, 100.0), [ids[2]], "run_late starts late");
    assert_eq!(eng.snapshot(100.0).pools[0].fixed_start_hit_rate, 0.0);
    assert_eq!(eng.totals().missed, 2);
}

#[test]
fn a_due_task_whose_tolerance_ends_with_a_free_slot_is_left_to_the_next_dispatch() {
    let mut eng = engine(1, 10);
    let (id, _) = eng.submit(fixed(5.0, 1.0, OnMiss::Fail), 0.0).unwrap();
    eng.pause("p", 0.0).unwrap();
    eng.advance(6.0);
    assert_eq!(eng.pools()[0].misses, [id]);
    assert_eq!(status(&eng, id), Status::Ready);
    // Paused: the dispatch does not start it, and ends it.
    assert_eq!(started(&mut eng, 6.0), Vec::<u64>::new());
    assert_eq!(status(&eng, id), Status::Failed);
    assert_eq!(eng.pools()[0].holds, 0);
}

#[test]
fn reservations_overlap_at_most_the_reservable_share_of_max() {
    // max 4 x 0.5: two at a time, batch-mates and admitted ones alike; touching is no overlap
    let mut eng = engine(1, 4);
    let batch = [
        fixed(10.0, 1.0, OnMiss::Skip),
        fixed(10.5, 1.0, OnMiss::Skip),
    ];
    eng.submit_batch(&batch, 0.0).unwrap();
    let err = eng.submit(fixed(11.0, 1.0, OnMiss::Skip), 0.0).unwrap_err();
    assert_eq!(err.code, "reservation_conflict");
    assert_eq!(err.message, "fixed-start reservation conflict");
    // [9, 12) and [9.5, 12.5) reserved (start - tol, start + 1 s expected + tol);
    // [12.5, 14.5) touches the second
    eng.submit(fixed(13.0, 0.5, OnMiss::Skip), 0.0).unwrap();
    let three = [
        fixed(20.0, 1.0, OnMiss::Skip),
        fixed(20.0, 1.0, OnMiss::Skip),
        fixed(20.0, 1.0, OnMiss::Skip),
    ];
    let err = eng.submit_batch(&three, 0.0).unwrap_err();
    assert_eq!(err.code, "reservation_conflict");
    assert_eq!(
        eng.pools()[0].reservations.len(),
        3,
        "a refused batch reserves nothing"
    );
    assert_eq!(peak_overlap(&[(0.0, 1.0), (1.0, 2.0)], 0.0, 2.0), 1);
    assert_eq!(peak_overlap(&[(0.0, 2.0), (1.0, 3.0)], 2.0, 5.0), 1);
}

#[test]
fn refused_options_carry_python_messages() {
    let mut eng = engine(1, 10);
    let err = eng
        .submit(fixed(f64::NAN, 1.0, OnMiss::Skip), 0.0)
        .unwrap_err();
    assert_eq!(
        err.message,
        "start_at must be a finite number of Unix seconds (got nan)"
    );
    let err = eng.submit(fixed(1.0, -1.0, OnMiss::Skip), 0.0).unwrap_err();
    assert_eq!(
        err.message,
        "tolerance must be a finite, non-negative number of seconds (got -1.0)"
    );
    for (fraction, shown) in [(1.5, "1.5"), (-1.0, "-1"), (f64::NAN, "nan")] {
        let pool = PoolConfig {
            reservable_fraction: fraction,
            ..PoolConfig::new("p")
        };
        let err = Engine::with_defaults(vec![pool], 0.0).unwrap_err();
        assert_eq!(
            err.0,
            format!("reservable_fraction must be in [0, 1] (got {shown})")
        );
    }
    let mut sched = every("r", "* * * * * *", Overlap::Skip);
    sched.pool = "nope".into();
    assert_eq!(
        eng.add_recurring(sched, 0.0).unwrap_err().code,
        "unknown_pool"
    );
    let mut sched = every("r", "* * * * * *", Overlap::Skip);
    sched.deadline_in = Some(-1.0);
    assert_eq!(eng.add_recurring(sched, 0.0).unwrap_err().code, "invalid");
    assert_eq!(
        eng.recurring().count(),
        0,
        "a refused schedule changes nothing"
    );
}

#[test]
fn cancelling_a_due_task_frees_its_held_slot_and_leaves_the_queues_alone() {
    let mut eng = engine(0, 10);
    let (id, _) = eng.submit(fixed(1.0, 5.0, OnMiss::RunLate), 0.0).unwrap();
    eng.submit(TaskSpec::new("p"), 0.0).unwrap();
    eng.advance(1.0);
    assert_eq!((eng.pools()[0].holds, eng.pools()[0].queues.n), (1, 1));
    assert!(eng.cancel(TaskRef::Id(id), 1.0));
    assert_eq!((eng.pools()[0].holds, eng.pools()[0].queues.n), (0, 1));
    eng.set_capacity("p", 1, 2.0).unwrap();
    assert_eq!(started(&mut eng, 2.0), [2]);
}

#[test]
fn occurrence_keys_name_the_utc_second() {
    assert_eq!(occurrence_key("k", 0.0), "k@1970-01-01T00:00:00Z");
    assert_eq!(
        occurrence_key("k", 1_700_000_000.9),
        "k@2023-11-14T22:13:20Z"
    );
    assert_eq!(occurrence_key("k", -0.5), "k@1969-12-31T23:59:59Z");
}

#[test]
fn an_occurrence_is_skipped_while_an_earlier_one_runs() {
    let mut eng = engine(2, 10);
    eng.set_event_level(EventLevel::Terminal);
    let mut sched = every("r", "*/5 * * * * *", Overlap::Skip);
    sched.key = Some("k".into());
    eng.add_recurring(sched, 0.0).unwrap();
    for t in 1..=11 {
        eng.advance(f64::from(t));
        eng.dispatch(f64::from(t));
    }
    let first = eng.lookup(TaskRef::Key("k@1970-01-01T00:00:05Z")).unwrap();
    assert_eq!(first.status, Status::Running);
    let second = eng.lookup(TaskRef::Key("k@1970-01-01T00:00:10Z")).unwrap();
    assert_eq!(second.status, Status::Skipped);
    assert_eq!(second.message.as_deref(), Some(MSG_OVERLAP));
    assert_eq!(eng.schedule("r").unwrap().next_time(), Some(15.0));
    assert_eq!(eng.totals().skipped, 1);
}

#[test]
fn removing_a_schedule_cancels_what_has_not_started_and_frees_the_keys() {
    let mut eng = engine(0, 10);
    let mut sched = every("r", "*/5 * * * * *", Overlap::Allow);
    sched.key = Some("k".into());
    sched.tolerance = 10.0; // created 20 s ahead
    eng.add_recurring(sched.clone(), 0.0).unwrap();
    for t in [0.0, 5.0] {
        eng.advance(t);
        eng.dispatch(t);
    }
    let waiting = eng.schedule("r").unwrap().recent().to_vec();
    let statuses: Vec<Status> = waiting.iter().map(|&id| status(&eng, id)).collect();
    assert_eq!(statuses, [Status::Ready, Status::Scheduled]);
    eng.take();
    assert!(eng.remove_recurring("r", 6.0));
    assert!(!eng.remove_recurring("r", 6.0));
    let acts = eng.take();
    assert_eq!(acts.finished.len(), 2);
    assert!(
        acts.finished.iter().all(|r| r.key.is_none()),
        "as Python's driver reads it"
    );
    for id in waiting {
        let rec = eng.lookup(TaskRef::Id(id)).unwrap();
        assert_eq!((rec.status, rec.key.is_none()), (Status::Cancelled, true));
    }
    assert_eq!(
        (eng.pools()[0].holds, eng.pools()[0].reservations.len()),
        (0, 0)
    );
    eng.add_recurring(sched, 6.0).unwrap();
    eng.advance(6.0);
    eng.dispatch(6.0);
    assert!(eng.lookup(TaskRef::Key("k@1970-01-01T00:00:05Z")).is_none());
    let again = eng.lookup(TaskRef::Key("k@1970-01-01T00:00:10Z")).unwrap();
    assert_eq!(
        again.status,
        Status::Scheduled,
        "its key was freed: created anew"
    );
}

#[test]
fn a_resumed_schedule_takes_its_occurrences_over_and_keeps_its_place() {
    let mut eng = engine(1, 10);
    eng.add_recurring(every("a", "*/5 * * * * *", Overlap::Allow), 0.0)
        .unwrap();
    eng.add_recurring(every("b", "@hourly", Overlap::Allow), 0.0)
        .unwrap();
    eng.advance(3.0);
    eng.dispatch(3.0);
    let occurrence = eng.schedule("a").unwrap().last().unwrap();
    // Resumed with a next occurrence that passed: created at the next dispatch, late.
    eng.resume_recurring(
        every("a", "*/5 * * * * *", Overlap::Allow),
        Some(10.0),
        Some(occurrence),
        30.0,
    )
    .unwrap();
    let names: Vec<&str> = eng.recurring().map(|s| &*s.name).collect();
    assert_eq!(names, ["a", "b"]);
    let a = eng.schedule("a").unwrap();
    assert_eq!(
        (a.recent(), a.last()),
        (&[occurrence][..], Some(occurrence))
    );
    eng.advance(30.0);
    eng.dispatch(30.0);
    let a = eng.schedule("a").unwrap();
    assert_eq!(a.recent().len(), 2);
    assert_eq!(a.next_time(), Some(35.0));
}

#[test]
fn a_fixed_start_with_dependencies_waits_for_them_then_for_its_time() {
    let mut eng = engine(1, 10);
    let (parent, _) = eng.submit(TaskSpec::new("p"), 0.0).unwrap();
    let deps = [(TaskRef::Id(parent), DepOn::Success)];
    let early = TaskSpec {
        deps: &deps,
        ..fixed(10.0, 1.0, OnMiss::Skip)
    };
    let (child, _) = eng.submit(early, 0.0).unwrap();
    // blocked, reserved and unready until released; then scheduled for its time
    assert_eq!(status(&eng, child), Status::Blocked);
    assert_eq!(eng.pools()[0].reservations.len(), 1);
    assert_eq!(eng.pools()[0].unready_by_class[2], 1);
    eng.dispatch(0.0);
    let lease = eng.take().starts[0].lease;
    eng.complete(lease, 2.0);
    assert_eq!(status(&eng, child), Status::Scheduled);
    assert_eq!(eng.pools()[0].unready_by_class[2], 1);
    eng.advance(10.0);
    assert_eq!(started(&mut eng, 10.0), [child]);
    assert_eq!(eng.pools()[0].unready_by_class[2], 0);
    assert!(eng.pools()[0].reservations.is_empty());

    // Released after its start plus tolerance: on_miss applies at once; a failed parent
    // skips it, and its reservation goes with it.
    let (parent, _) = eng.submit(TaskSpec::new("p"), 10.0).unwrap();
    let deps = [(TaskRef::Id(parent), DepOn::Complete)];
    let late = TaskSpec {
        deps: &deps,
        ..fixed(12.0, 1.0, OnMiss::Skip)
    };
    let (missed, _) = eng.submit(late, 10.0).unwrap();
    let deps = [(TaskRef::Id(parent), DepOn::Success)];
    let unmet = TaskSpec {
        deps: &deps,
        ..fixed(30.0, 1.0, OnMiss::RunLate)
    };
    let (skipped, _) = eng.submit(unmet, 10.0).unwrap();
    let lease = eng.running().next().unwrap().lease; // the first child's
    eng.complete(lease, 11.0);
    assert_eq!(started(&mut eng, 11.0), [parent]);
    let lease = eng.running().next().unwrap().lease;
    eng.fail(lease, 20.0, "boom", true, None);
    assert_eq!(status(&eng, missed), Status::Missed);
    assert_eq!(status(&eng, skipped), Status::Skipped);
    assert!(eng.pools()[0].reservations.is_empty());
    assert_eq!(eng.pools()[0].unready_by_class, [0; 4]);
}

#[test]
fn queued_occurrences_wait_for_the_previous_one_and_the_next_is_not_created_meanwhile() {
    let mut eng = engine(1, 10);
    eng.add_recurring(every("r", "*/5 * * * * *", Overlap::Queue), 0.0)
        .unwrap();
    for t in [3.0, 5.0, 8.0, 10.0, 13.0, 15.0] {
        eng.advance(t);
        eng.dispatch(t);
    }
    // 1 runs from 5; 2 (at 10) waits for it; the one at 15 is not created while 2 waits
    let sched = eng.schedule("r").unwrap();
    assert_eq!((sched.recent(), sched.queued()), (&[1, 2][..], Some(2)));
    assert_eq!(status(&eng, 2), Status::Blocked);
    assert_eq!(eng.totals().recurring_conflicts, 1);
    eng.take();
    let lease = eng.running().next().unwrap().lease;
    eng.fail(lease, 16.0, "boom", true, None);
    // any end releases it, past its tolerance (run late): due at once
    assert_eq!(started(&mut eng, 16.0), [2]);

    // queue_on_success: a failed predecessor skips the next occurrence
    let mut eng = engine(1, 10);
    let sched = every("r", "*/5 * * * * *", Overlap::QueueOnSuccess);
    eng.add_recurring(sched, 0.0).unwrap();
    for t in [3.0, 5.0, 8.0] {
        eng.advance(t);
        eng.dispatch(t);
    }
    assert_eq!(status(&eng, 2), Status::Blocked);
    let lease = eng.running().next().unwrap().lease;
    eng.fail(lease, 9.0, "boom", true, None);
    let rec = eng.lookup(TaskRef::Id(2)).unwrap();
    assert_eq!(rec.status, Status::Skipped);
    assert_eq!(rec.message.as_deref(), Some("dependency 1 ended as failed"));
}

// --- properties ------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Submit(Option<(f64, f64, u8)>),
    Batch(Vec<(f64, f64, u8)>),
    Dispatch,
    Advance(f64),
    Complete(usize),
    Cancel(u64),
    SetCapacity(u32),
    Pause(bool),
    Add(u8, u8, u8, f64),
    Remove(u8),
}

fn start() -> impl Strategy<Value = (f64, f64, u8)> {
    (
        -10.0f64..30.0,
        prop_oneof![Just(0.0), Just(1.0), 0.0f64..10.0],
        0u8..3,
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::option::of(start()).prop_map(Op::Submit),
        1 => proptest::collection::vec(start(), 0..4).prop_map(Op::Batch),
        4 => Just(Op::Dispatch),
        4 => prop_oneof![0.0f64..3.0, Just(60.0)].prop_map(Op::Advance),
        2 => (0usize..8).prop_map(Op::Complete),
        1 => (1u64..40).prop_map(Op::Cancel),
        1 => (0u32..4).prop_map(Op::SetCapacity),
        1 => any::<bool>().prop_map(Op::Pause),
        1 => (0u8..2, 0u8..3, 0u8..4, prop_oneof![Just(0.0), Just(1.0), Just(10.0)])
            .prop_map(|(n, c, overlap, tol)| Op::Add(n, c, overlap, tol)),
        1 => (0u8..2).prop_map(Op::Remove),
    ]
}

const ON_MISS: [OnMiss; 3] = [OnMiss::RunLate, OnMiss::Skip, OnMiss::Fail];

fn check(eng: &Engine) -> Result<(), TestCaseError> {
    let pool = &eng.pools()[0];
    let live = || eng.tasks().filter(|r| !r.status.is_terminal());
    let fixed =
        |r: &&cronoq_core::TaskRecord| r.extra.as_ref().is_some_and(|e| e.start_at.is_some());
    let count =
        |f: &dyn Fn(&cronoq_core::TaskRecord) -> bool| live().filter(|r| f(r)).count() as i64;
    let extra = |r: &cronoq_core::TaskRecord| r.extra.clone().unwrap_or_default();
    let scheduled = count(&|r| r.status == Status::Scheduled);
    // (fixed starts blocked on the previous occurrence, in the queue modes)
    let blocked = count(&|r| r.status == Status::Blocked);
    prop_assert_eq!(
        pool.unready_by_class.iter().sum::<i64>(),
        scheduled + blocked
    );
    let due = count(&|r| r.status == Status::Ready && extra(r).due);
    let ready = count(&|r| r.status == Status::Ready);
    prop_assert_eq!(pool.queues.n, ready - due, "due tasks are not queued");
    prop_assert_eq!(pool.holds, count(&|r| extra(r).held));
    for r in live().filter(fixed) {
        let e = extra(r);
        let waiting = matches!(r.status, Status::Scheduled | Status::Blocked)
            || (r.status == Status::Ready && e.due);
        prop_assert_eq!(!e.fixed_done, waiting, "task {} {:?}", r.id, e);
        prop_assert_eq!(pool.reservations.contains_key(&r.id), waiting);
        if e.due {
            prop_assert!(pool.due.iter().any(|d| d.task == r.id));
        }
    }
    prop_assert_eq!(pool.reservations.len() as i64, scheduled + blocked + due);
    let reserved: Vec<(f64, f64)> = pool.reservations.values().copied().collect();
    let peak = peak_overlap(&reserved, f64::NEG_INFINITY, f64::INFINITY);
    prop_assert!(
        peak <= pool.reservation_limit,
        "{} reservations overlap",
        peak
    );
    let pending: i64 = pool.pending_by_class.iter().sum();
    prop_assert_eq!(pending, count(&|r| r.status != Status::Running));
    for s in eng.recurring() {
        prop_assert!(s.last().is_none_or(|l| s.recent().last() == Some(&l)));
        prop_assert!(s.queued().is_none_or(|q| s.last() == Some(q)));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn fixed_start_bookkeeping_holds_after_every_operation(
        ops in proptest::collection::vec(op(), 1..100),
    ) {
        let mut eng = engine(2, 4);
        let names = ["r0", "r1"];
        let crons = ["*/5 * * * * *", "*/2 * * * * *", "7,37 * * * * *"];
        let mut now = 0.0;
        let spec = |now: f64, (offset, tol, m): (f64, f64, u8)| fixed(now + offset, tol, ON_MISS[usize::from(m)]);
        for op in ops {
            let busy_before = eng.pools()[0].busy;
            match op {
                Op::Submit(None) => { eng.submit(TaskSpec::new("p"), now).unwrap(); }
                Op::Submit(Some(s)) => { let _ = eng.submit(spec(now, s), now); }
                Op::Batch(list) => {
                    let specs: Vec<TaskSpec<'_>> = list.into_iter().map(|s| spec(now, s)).collect();
                    let _ = eng.submit_batch(&specs, now);
                }
                Op::Dispatch => eng.dispatch(now),
                Op::Advance(dt) => {
                    now += dt;
                    eng.advance(now);
                    if let Some(t) = eng.next_wake() {
                        prop_assert!(t > now, "next_wake {} not after {}", t, now);
                    }
                }
                Op::Complete(i) => {
                    let n = eng.running().count();
                    if n > 0 {
                        let lease = eng.running().nth(i % n).unwrap().lease;
                        eng.complete(lease, now);
                    }
                }
                Op::Cancel(id) => { eng.cancel(TaskRef::Id(id), now); }
                Op::SetCapacity(n) => eng.set_capacity("p", n, now).unwrap(),
                Op::Pause(on) => {
                    let _ = if on { eng.pause("p", now) } else { eng.resume("p", now) };
                }
                Op::Add(n, c, overlap, tol) => {
                    let overlap = Overlap::ALL[usize::from(overlap)];
                    let mut sched = every(names[usize::from(n)], crons[usize::from(c)], overlap);
                    sched.tolerance = tol;
                    eng.add_recurring(sched, now).unwrap();
                }
                Op::Remove(n) => { eng.remove_recurring(names[usize::from(n)], now); }
            }
            let pool = &eng.pools()[0];
            // Dispatch fills free slots only; a lowered capacity just starts nothing.
            prop_assert!(pool.busy <= pool.capacity.max(busy_before));
            check(&eng)?;
        }
    }
}

#[test]
fn occurrences_take_the_templates_resources_and_labels_and_an_unknown_one_is_a_conflict() {
    let options = EngineOptions {
        resources: vec![cronoq_core::ResourceConfig::semaphore("db", 1).unwrap()],
        ..EngineOptions::default()
    };
    let pool = PoolConfig {
        capacity: 2,
        ..PoolConfig::new("p")
    };
    let mut eng = Engine::new(vec![pool], 0.0, options, MersenneTwister::new(0)).unwrap();
    let mut sched = every("r", "*/5 * * * * *", Overlap::Allow);
    sched.resources = vec![("db".into(), 2), ("db".into(), 1)]; // the last amount counts
    sched.labels = vec![("zone".into(), "a".into())];
    eng.add_recurring(sched, 0.0).unwrap();
    eng.advance(5.0);
    eng.dispatch(5.0);
    let id = eng.schedule("r").unwrap().last().unwrap();
    let rec = eng.lookup(TaskRef::Id(id)).unwrap();
    let extra = rec.extra.as_deref().unwrap();
    assert_eq!(extra.resources, [("db".into(), 1)]);
    assert_eq!(
        rec.labels.as_deref().unwrap(),
        [("zone".into(), "a".into())]
    );
    let mut zero = every("z", "*/5 * * * * *", Overlap::Allow);
    zero.resources = vec![("db".into(), 0)];
    let refused = eng.add_recurring(zero, 5.0).unwrap_err();
    assert_eq!(refused.code, "invalid");
    let mut unknown = every("u", "*/5 * * * * *", Overlap::Allow);
    unknown.resources = vec![("nope".into(), 1)];
    eng.add_recurring(unknown, 5.0).unwrap();
    eng.advance(10.0);
    eng.dispatch(10.0);
    assert_eq!(eng.totals().recurring_conflicts, 1);
    assert!(eng.schedule("u").unwrap().last().is_none());
}
