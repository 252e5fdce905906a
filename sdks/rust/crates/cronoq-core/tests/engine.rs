//! The engine's tricky rules, one by one, with the figures the Python core gives for the same
//! calls (the differential suite in tests/parity checks them all at random).

mod common;

use common::started;
use cronoq_core::engine::{MSG_CANCELLED, MSG_SHED};
use cronoq_core::model::{AbortReason, Outcome};
use cronoq_core::vocab::Overflow;
use cronoq_core::{
    Engine, EngineOptions, EventLevel, MersenneTwister, PoolConfig, RetryPolicy, Status, TaskRef,
    TaskSpec,
};

fn pool(capacity: u32) -> PoolConfig {
    PoolConfig {
        capacity,
        ..PoolConfig::new("p")
    }
}

fn engine(pools: Vec<PoolConfig>, options: EngineOptions) -> Engine {
    Engine::new(pools, 0.0, options, MersenneTwister::new(0)).unwrap()
}

fn task(cls: u8) -> TaskSpec<'static> {
    TaskSpec {
        cls,
        ..TaskSpec::new("p")
    }
}

#[test]
fn backoff_grows_by_the_multiplier_up_to_the_cap_and_overflows_to_the_cap() {
    let p = RetryPolicy::new(10, 1.5, 2.0, 60.0, false).unwrap();
    let waits: Vec<f64> = (2..=8).map(|n| p.backoff(n)).collect();
    assert_eq!(waits, [1.5, 3.0, 6.0, 12.0, 24.0, 48.0, 60.0]);
    let huge = RetryPolicy::new(3, 1.0, 1e300, 1e308, false).unwrap();
    assert_eq!(
        huge.backoff(4),
        1e308,
        "inf (Python's OverflowError) is capped"
    );
    assert!(RetryPolicy::new(0, 1.0, 2.0, 1.0, true).is_err());
    assert!(RetryPolicy::new(1, 1.0, 0.5, 1.0, true).is_err());
    assert!(RetryPolicy::new(1, f64::NAN, 2.0, 1.0, true).is_err());
}

#[test]
fn a_refused_retry_policy_quotes_the_value_as_python_does() {
    // The Python core's messages, value for value (`{value!r}`: `-1.0`, `nan`, not `-1`, `NaN`).
    let message =
        |a: u32, i: f64, m: f64, x: f64| RetryPolicy::new(a, i, m, x, true).unwrap_err().0;
    let seconds = "must be a finite, non-negative number of seconds";
    assert_eq!(
        message(1, -1.0, 2.0, 1.0),
        format!("initial_backoff {seconds} (got -1.0)")
    );
    assert_eq!(
        message(1, f64::NAN, 2.0, 1.0),
        format!("initial_backoff {seconds} (got nan)")
    );
    assert_eq!(
        message(1, 1.0, 2.0, f64::INFINITY),
        format!("max_backoff {seconds} (got inf)")
    );
    assert_eq!(
        message(1, 1.0, 0.5, 1.0),
        "multiplier must be a finite number >= 1 (got 0.5)"
    );
}

#[test]
fn classes_are_strict_but_a_waiting_low_task_ages_past_a_fresh_normal_one() {
    let mut eng = engine(vec![pool(0)], EngineOptions::default());
    let low = eng.submit(task(3), 0.0).unwrap().0;
    // At 40 s the low task scores 10 + 80 < 100 of a fresh normal task; at 50 s, 10 + 100.
    let normal = eng.submit(task(2), 40.0).unwrap().0;
    eng.set_capacity("p", 1, 40.0).unwrap();
    assert_eq!(started(&mut eng, 40.0), [normal]);
    let normal2 = eng.submit(task(2), 50.0).unwrap().0;
    let critical = eng.submit(task(0), 50.0).unwrap().0;
    // The critical task first (base 10000), then the aged low one (10 + 100 > 100 + 0).
    eng.set_capacity("p", 3, 50.0).unwrap();
    assert_eq!(started(&mut eng, 50.0), [critical, low]);
    eng.set_capacity("p", 4, 50.0).unwrap();
    assert_eq!(started(&mut eng, 50.0), [normal2]);
}

#[test]
fn an_overdue_deadline_outranks_an_older_task_of_its_class() {
    let mut eng = engine(vec![pool(0)], EngineOptions::default());
    let old = eng.submit(task(2), 0.0).unwrap().0;
    let urgent = TaskSpec {
        deadline: Some(3.0),
        ..task(2)
    };
    let urgent = eng.submit(urgent, 1.0).unwrap().0;
    // latest start = deadline - default duration (1 s) = 2.0: at 2.0 urgency is 5000.
    let rec = eng.lookup(TaskRef::Id(urgent)).unwrap();
    assert_eq!(rec.latest_start, Some(2.0));
    eng.set_capacity("p", 1, 2.0).unwrap();
    assert_eq!(started(&mut eng, 2.0), [urgent]);
    eng.set_capacity("p", 2, 2.0).unwrap();
    assert_eq!(started(&mut eng, 2.0), [old]);
}

#[test]
fn a_failed_attempt_retries_after_a_jittered_backoff_drawn_as_python_does() {
    let mut eng = engine(vec![pool(1)], EngineOptions::default());
    let id = eng.submit(task(2), 0.0).unwrap().0;
    eng.dispatch(0.0);
    let att = eng.take().starts.remove(0);
    assert!(eng.fail(att.lease, 10.0, "boom", false, None));
    let rec = eng.lookup(TaskRef::Id(id)).unwrap();
    // random.Random(0).uniform(0.0, 1.0) = 0.8444218515250481
    assert_eq!(rec.ready_at, 10.0 + 0.8444218515250481);
    assert_eq!(rec.status, Status::Retrying);
    assert_eq!(rec.history()[0].outcome, Outcome::Failed);
    assert_eq!(eng.next_wake(), Some(10.0 + 0.8444218515250481));
    eng.advance(10.8);
    assert!(eng.take().is_empty());
    eng.advance(10.9);
    eng.dispatch(10.9);
    let again = eng.take().starts;
    assert_eq!((again[0].task, again[0].number), (id, 2));
    assert!(
        !eng.fail(att.lease, 11.0, "late", false, None),
        "a stale outcome"
    );
    assert_eq!(eng.totals().stale_completions, 1);
}

#[test]
fn the_last_attempt_dead_letters_and_retry_after_lengthens_the_wait() {
    let p = PoolConfig {
        retry: RetryPolicy::new(2, 1.0, 2.0, 60.0, false).unwrap(),
        ..pool(1)
    };
    let mut eng = engine(vec![p], EngineOptions::default());
    let id = eng.submit(task(2), 0.0).unwrap().0;
    eng.dispatch(0.0);
    let lease = eng.take().starts[0].lease;
    eng.fail(lease, 1.0, "boom", false, Some(5.0));
    assert_eq!(eng.lookup(TaskRef::Id(id)).unwrap().ready_at, 6.0);
    eng.advance(6.0);
    eng.dispatch(6.0);
    let lease = eng.take().starts[0].lease;
    eng.fail(lease, 7.0, "bust", false, None);
    let acts = eng.take();
    assert_eq!(acts.finished[0].status, Status::DeadLettered);
    assert_eq!(acts.finished[0].message.as_deref(), Some("bust"));
    assert_eq!(eng.pools()[0].dead_lettered, 1);
}

#[test]
fn a_lease_runs_out_unless_heartbeats_extend_it() {
    let p = PoolConfig {
        lease_ttl: Some(2.0),
        retry: RetryPolicy::none(),
        ..pool(1)
    };
    let mut eng = engine(vec![p], EngineOptions::default());
    eng.submit(task(2), 0.0).unwrap();
    eng.dispatch(0.0);
    let lease = eng.take().starts[0].lease;
    assert!(eng.heartbeat(lease, 1.5));
    eng.advance(2.0);
    assert!(eng.take().aborts.is_empty(), "extended to 3.5");
    assert_eq!(eng.next_wake(), Some(3.5));
    eng.advance(3.5);
    let acts = eng.take();
    assert_eq!(acts.aborts[0].abort_reason, Some(AbortReason::Lease));
    assert_eq!(acts.finished[0].message.as_deref(), Some("lease expired"));
    assert!(!eng.heartbeat(lease, 4.0));
    assert_eq!(eng.totals().lease_expiries, 1);
}

#[test]
fn an_attempt_past_its_timeout_is_aborted_and_retried() {
    let mut eng = engine(vec![pool(1)], EngineOptions::default());
    let spec = TaskSpec {
        timeout: Some(1.0),
        ..task(2)
    };
    let id = eng.submit(spec, 0.0).unwrap().0;
    eng.dispatch(0.0);
    eng.take();
    eng.advance(1.0);
    let acts = eng.take();
    assert_eq!(acts.aborts[0].abort_reason, Some(AbortReason::Timeout));
    let rec = eng.lookup(TaskRef::Id(id)).unwrap();
    assert_eq!(rec.status, Status::Retrying);
    assert_eq!(rec.history()[0].outcome, Outcome::TimedOut);
    assert_eq!(eng.totals().timeouts, 1);
    assert_eq!(eng.pools()[0].busy, 0);
}

#[test]
fn overflow_policies_refuse_or_shed() {
    let bounded = |overflow| PoolConfig {
        max_pending: Some(2),
        overflow,
        ..pool(0)
    };
    let mut eng = engine(vec![bounded(Overflow::Wait)], EngineOptions::default());
    eng.submit(task(3), 0.0).unwrap();
    eng.submit(task(3), 0.0).unwrap();
    let err = eng.submit(task(0), 0.0).unwrap_err();
    assert_eq!((err.code, err.message.as_str()), ("full", "queue full"));

    let mut eng = engine(vec![bounded(Overflow::Reject)], EngineOptions::default());
    eng.submit(task(3), 0.0).unwrap();
    eng.submit(task(3), 0.0).unwrap();
    assert_eq!(eng.submit(task(0), 0.0).unwrap_err().code, "overloaded");

    let mut eng = engine(
        vec![bounded(Overflow::ShedLowest)],
        EngineOptions::default(),
    );
    eng.submit(task(2), 0.0).unwrap();
    let newest_low = eng.submit(task(3), 0.5).unwrap().0;
    eng.submit(task(1), 1.0).unwrap();
    let shed = eng.take().finished;
    assert_eq!((shed[0].id, shed[0].status), (newest_low, Status::Shed));
    assert_eq!(shed[0].message.as_deref(), Some(MSG_SHED));
    // Nothing below class 2 is left to shed for a normal task.
    assert_eq!(eng.submit(task(2), 1.0).unwrap_err().code, "overloaded");

    let mut eng = engine(
        vec![bounded(Overflow::ShedOldest)],
        EngineOptions::default(),
    );
    let oldest = eng.submit(task(3), 0.0).unwrap().0;
    eng.submit(task(3), 1.0).unwrap();
    eng.submit(task(3), 2.0).unwrap();
    assert_eq!(eng.take().finished[0].id, oldest);
}

#[test]
fn keys_deduplicate_while_held_and_batches_are_all_or_nothing() {
    let mut eng = engine(vec![pool(1)], EngineOptions::default());
    let keyed = |key: &'static str| TaskSpec {
        key: Some(key),
        ..task(2)
    };
    let (a, fresh) = eng.submit(keyed("k"), 0.0).unwrap();
    assert!(!fresh);
    assert_eq!(eng.submit(keyed("k"), 0.0).unwrap(), (a, true));
    let err = eng
        .submit_batch(&[keyed("x"), keyed("y"), keyed("x")], 0.0)
        .unwrap_err();
    assert_eq!(err.code, "duplicate_key_in_batch");
    assert_eq!(err.message, "duplicate key 'x' in batch");
    assert_eq!(eng.live(), 1, "nothing of the batch was admitted");
    let got = eng
        .submit_batch(&[keyed("k"), keyed("z"), task(1)], 0.0)
        .unwrap();
    assert_eq!(got, [(a, true), (a + 1, false), (a + 2, false)]);
    let err = eng.submit(TaskSpec::new("nope"), 0.0).unwrap_err();
    assert_eq!(err.message, "unknown pool 'nope'");
}

#[test]
fn cancelling_a_running_task_aborts_its_attempt_and_frees_the_slot() {
    let options = EngineOptions {
        event_level: EventLevel::Terminal,
        ..EngineOptions::default()
    };
    let mut eng = engine(vec![pool(1)], options);
    let id = eng.submit(task(2), 0.0).unwrap().0;
    eng.dispatch(0.0);
    let lease = eng.take().starts[0].lease;
    assert!(eng.cancel(TaskRef::Id(id), 1.0));
    assert!(!eng.cancel(TaskRef::Id(id), 1.0));
    let acts = eng.take();
    assert_eq!(acts.aborts[0].abort_reason, Some(AbortReason::Cancelled));
    assert_eq!(acts.events[0].status, Status::Cancelled);
    assert_eq!(acts.events[0].message.as_deref(), Some(MSG_CANCELLED));
    assert!(!eng.complete(lease, 2.0));
    assert_eq!(eng.pools()[0].busy, 0);
    assert_eq!(eng.live(), 0);
}

#[test]
fn retention_keeps_ended_tasks_for_a_while_and_at_most_so_many() {
    let options = EngineOptions {
        retention: 10.0,
        retention_max: 2,
        ..EngineOptions::default()
    };
    let mut eng = engine(vec![pool(0)], options);
    let ids: Vec<u64> = (0..3)
        .map(|i| eng.submit(task(2), f64::from(i)).unwrap().0)
        .collect();
    for (i, id) in ids.iter().enumerate() {
        eng.cancel(TaskRef::Id(*id), 1.0 + i as f64);
    }
    assert!(eng.lookup(TaskRef::Id(ids[0])).is_none(), "retention_max");
    assert_eq!(eng.next_wake(), Some(12.0));
    eng.advance(12.0);
    assert!(eng.lookup(TaskRef::Id(ids[1])).is_none());
    assert!(eng.lookup(TaskRef::Id(ids[2])).is_some());
    assert_eq!(eng.delete(&[ids[2], ids[2]]), [ids[2]]);
    assert_eq!(
        eng.next_wake(),
        Some(13.0),
        "a deleted task still wakes the engine once"
    );
}

#[test]
fn the_journal_names_each_change_once_and_keeps_rows_of_forgotten_tasks() {
    let options = EngineOptions {
        journal: true,
        retention_max: 0,
        ..EngineOptions::default()
    };
    let mut eng = engine(vec![pool(1)], options);
    let a = eng.submit(task(2), 0.0).unwrap().0;
    let b = eng.submit(task(2), 0.0).unwrap().0;
    eng.dispatch(0.0);
    let lease = eng.take().starts[0].lease;
    eng.complete(lease, 1.0);
    eng.pause("p", 1.0).unwrap();
    let j = eng.take_journal().unwrap();
    let ids = |rs: &[cronoq_core::TaskRecord]| rs.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(&j.added), [a, b]);
    assert_eq!(ids(&j.changed), [a, b]);
    assert_eq!(
        j.changed[0].status,
        Status::Succeeded,
        "forgotten, its last row is kept"
    );
    assert_eq!(j.changed[0].finished_at, 1.0);
    assert_eq!(j.pools, [("p".into(), true)]);
    assert!(eng.take_journal().unwrap().is_empty());
}

#[test]
fn shutdown_stops_dispatch_and_abandons_running_attempts() {
    let mut eng = engine(vec![pool(2)], EngineOptions::default());
    let a = eng.submit(task(2), 0.0).unwrap().0;
    eng.dispatch(0.0);
    eng.take();
    eng.halt();
    eng.submit(task(2), 0.0).unwrap();
    eng.dispatch(0.0);
    assert!(eng.take().starts.is_empty());
    let aborted = eng.abort_running(1.0);
    assert_eq!(aborted[0].abort_reason, Some(AbortReason::Shutdown));
    assert_eq!(eng.lookup(TaskRef::Id(a)).unwrap().status, Status::Running);
    assert!(
        eng.cancel(TaskRef::Id(a), 2.0),
        "a task whose attempt was abandoned"
    );
    assert_eq!(eng.take().aborts.len(), 1, "only abort_running's");
}

#[test]
fn a_snapshot_reports_the_pool_and_its_quality_metrics() {
    let p = PoolConfig {
        cost_per_worker_second: 0.5,
        ..pool(2)
    };
    let mut eng = engine(vec![p], EngineOptions::default());
    eng.submit(task(3), 0.0).unwrap();
    eng.submit(task(0), 0.0).unwrap();
    eng.submit(task(2), 0.0).unwrap();
    eng.dispatch(1.0);
    let leases: Vec<u64> = eng.take().starts.iter().map(|a| a.lease).collect();
    eng.complete(leases[0], 3.0);
    let snap = eng.snapshot(4.0);
    let pool = &snap.pools[0];
    assert_eq!(
        (pool.capacity, pool.busy, pool.pending, pool.ready),
        (2, 1, 1, 1)
    );
    assert_eq!((pool.dispatched, pool.succeeded), (2, 1));
    // Both dispatches took from the most important class that had tasks.
    assert_eq!(pool.priority_adherence, 1.0);
    assert_eq!(pool.wait_mean, 1.0);
    // 2 slots for 4 s (a snapshot accounts up to its time); busy 2 from 1 s to 3 s, then 1:
    // 5 busy slot-seconds of 8 (Python: the same figures).
    assert_eq!(pool.worker_seconds, 8.0);
    assert_eq!(pool.cost, 4.0);
    assert_eq!(pool.utilization, 5.0 / 8.0);
    assert_eq!((snap.live_tasks, snap.running, snap.pending), (2, 1, 1));
}

#[test]
fn take_into_hands_over_the_actions_and_keeps_the_drivers_lists_as_the_next_outbox() {
    let mut eng = engine(vec![pool(2)], EngineOptions::default());
    let a = eng.submit(task(2), 0.0).unwrap().0;
    let b = eng.submit(task(2), 0.0).unwrap().0;
    eng.dispatch(0.0);
    let mut out = cronoq_core::Actions::default();
    eng.take_into(&mut out);
    let started: Vec<_> = out.starts.iter().map(|att| att.task).collect();
    assert_eq!(started, [a, b]);
    let (room, list) = (out.starts.capacity(), out.starts.as_ptr());
    let leases: Vec<_> = out.starts.iter().map(|att| att.lease).collect();
    for lease in leases {
        assert!(eng.complete(lease, 1.0));
    }
    // The lists just given back are the engine's outbox now: the ends land in them.
    let mut next = cronoq_core::Actions::default();
    eng.take_into(&mut next);
    let ended: Vec<_> = next.finished.iter().map(|r| (r.id, r.status)).collect();
    assert_eq!(ended, [(a, Status::Succeeded), (b, Status::Succeeded)]);
    assert!(next.starts.is_empty());
    eng.take_into(&mut out);
    assert!(
        out.is_empty(),
        "the spent lists were emptied, nothing new happened"
    );
    assert_eq!(next.starts.capacity(), 0);
    eng.take_into(&mut next);
    assert_eq!((next.starts.as_ptr(), next.starts.capacity()), (list, room));
}
