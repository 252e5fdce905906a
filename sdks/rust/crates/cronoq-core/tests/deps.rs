//! Dependencies, rule by rule, with the outcomes the Python core gives for the same calls (the
//! differential suite in tests/parity checks them at random), and proptest invariants of the
//! dependency graph over random sequences.

mod common;

use std::collections::HashMap;

use cronoq_core::deps::{MSG_AWAIT_TIMEOUT, edge_met};
use cronoq_core::vocab::Overflow;
use cronoq_core::{
    DepOn, DepTarget, Engine, EngineOptions, EventLevel, MersenneTwister, PoolConfig, Status,
    TaskId, TaskRef, TaskSpec, UnknownDependency,
};
use proptest::prelude::*;

use DepOn::{Complete, Failure, Success};
use common::{pick, status};

fn engine(pools: Vec<PoolConfig>, options: EngineOptions) -> Engine {
    Engine::new(pools, 0.0, options, MersenneTwister::new(0)).unwrap()
}

fn pool(capacity: u32) -> PoolConfig {
    PoolConfig {
        capacity,
        ..PoolConfig::new("p")
    }
}

fn awaiting(capacity: u32, timeout: Option<f64>) -> PoolConfig {
    PoolConfig {
        unknown_dependency: UnknownDependency::Await,
        await_timeout: timeout,
        ..pool(capacity)
    }
}

fn after<'a>(deps: &'a [(TaskRef<'a>, DepOn)]) -> TaskSpec<'a> {
    TaskSpec {
        deps,
        ..TaskSpec::new("p")
    }
}

fn keyed<'a>(key: &'a str, deps: &'a [(TaskRef<'a>, DepOn)]) -> TaskSpec<'a> {
    TaskSpec {
        key: Some(key),
        ..after(deps)
    }
}

fn message(eng: &Engine, id: TaskId) -> Option<String> {
    let rec = eng.lookup(TaskRef::Id(id)).unwrap();
    rec.message.as_deref().map(str::to_string)
}

/// Start what can start and end the attempt of `id` (success or a permanent failure).
fn run(eng: &mut Engine, id: TaskId, ok: bool, now: f64) {
    eng.dispatch(now);
    let lease = eng.running().find(|a| a.task == id).unwrap().lease;
    if ok {
        eng.complete(lease, now);
    } else {
        eng.fail(lease, now, "boom", true, None);
    }
}

#[test]
fn conditions_are_met_by_the_ends_they_name() {
    use Status::*;
    for s in [Succeeded, Failed, DeadLettered, Cancelled, Skipped, Shed] {
        assert!(edge_met(s, Complete));
        assert_eq!(edge_met(s, Success), s == Succeeded);
        assert_eq!(edge_met(s, Failure), matches!(s, Failed | DeadLettered));
    }
}

#[test]
fn a_blocked_task_is_released_or_skipped_when_its_parent_ends() {
    let mut eng = engine(vec![pool(1)], EngineOptions::default());
    let parent = eng.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    let on = |c| [(TaskRef::Id(parent), c)];
    let (s, f, c) = (on(Success), on(Failure), on(Complete));
    let ids: Vec<TaskId> = [&s, &f, &c]
        .map(|d| eng.submit(after(d), 0.0).unwrap().0)
        .to_vec();
    assert!(ids.iter().all(|&id| status(&eng, id) == Status::Blocked));
    assert_eq!(eng.pools()[0].unready_by_class[2], 3);
    run(&mut eng, parent, false, 1.0);
    assert_eq!(status(&eng, ids[0]), Status::Skipped);
    let msg = format!("dependency {parent} ended as failed");
    assert_eq!(message(&eng, ids[0]), Some(msg));
    assert_eq!(status(&eng, ids[1]), Status::Ready);
    assert_eq!(status(&eng, ids[2]), Status::Ready);
    assert_eq!(eng.lookup(TaskRef::Id(ids[1])).unwrap().eligible_at, 1.0);
    assert_eq!(eng.pools()[0].unready_by_class[2], 0);
    // An ended parent is settled at once: met, ready; unmet, skipped naming its status only.
    let late = eng.submit(after(&s), 2.0).unwrap().0;
    assert_eq!(status(&eng, late), Status::Skipped);
    assert_eq!(
        message(&eng, late).as_deref(),
        Some("dependency ended as failed")
    );
    let late = eng.submit(after(&f), 2.0).unwrap().0;
    assert_eq!(status(&eng, late), Status::Ready);
}

#[test]
fn skips_cascade_breadth_first_through_the_children() {
    let options = EngineOptions {
        event_level: EventLevel::Terminal,
        ..EngineOptions::default()
    };
    let mut eng = engine(vec![pool(0)], options);
    let root = eng.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    let a = eng
        .submit(after(&[(TaskRef::Id(root), Success)]), 0.0)
        .unwrap()
        .0;
    let b = eng
        .submit(after(&[(TaskRef::Id(root), Success)]), 0.0)
        .unwrap()
        .0;
    let a1 = eng
        .submit(after(&[(TaskRef::Id(a), Success)]), 0.0)
        .unwrap()
        .0;
    let b1 = eng
        .submit(after(&[(TaskRef::Id(b), Failure)]), 0.0)
        .unwrap()
        .0;
    let b2 = eng
        .submit(after(&[(TaskRef::Id(b), Complete)]), 0.0)
        .unwrap()
        .0;
    eng.take();
    eng.cancel(TaskRef::Id(root), 1.0);
    let ended: Vec<TaskId> = eng.take().events.iter().map(|e| e.id).collect();
    assert_eq!(
        ended,
        [root, a, b, a1, b1],
        "a's and b's children after both"
    );
    assert_eq!(status(&eng, b2), Status::Ready, "complete: any end");
    assert_eq!(eng.totals().skipped, 4);
}

#[test]
fn unknown_ids_and_keys_are_refused_unless_the_pool_awaits_keys() {
    let mut eng = engine(vec![pool(1)], EngineOptions::default());
    let err = eng
        .submit(after(&[(TaskRef::Id(7), Success)]), 0.0)
        .unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        ("unknown_dependency", "unknown dependency '7'")
    );
    let err = eng
        .submit(after(&[(TaskRef::Key("it's"), Success)]), 0.0)
        .unwrap_err();
    assert_eq!(err.message, r#"unknown dependency "it's""#);
    let err = eng
        .submit(keyed("me", &[(TaskRef::Key("me"), Success)]), 0.0)
        .unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        ("cycle", "dependency cycle")
    );
    assert_eq!((eng.live(), eng.next_id()), (0, 1), "nothing admitted");
}

#[test]
fn an_awaited_key_links_when_it_comes_or_times_out() {
    let mut eng = engine(vec![awaiting(1, Some(5.0))], EngineOptions::default());
    let waits = eng
        .submit(after(&[(TaskRef::Key("k"), Success)]), 0.0)
        .unwrap()
        .0;
    let times_out = eng
        .submit(after(&[(TaskRef::Key("j"), Success)]), 1.0)
        .unwrap()
        .0;
    let rec = eng.lookup(TaskRef::Id(waits)).unwrap();
    let extra = rec.extra.as_deref().unwrap();
    assert_eq!((extra.waiting, &*extra.awaits[0]), (1, "k"));
    assert_eq!(eng.next_wake(), Some(5.0));
    let parent = eng.submit(keyed("k", &[]), 2.0).unwrap().0;
    let extra = eng
        .lookup(TaskRef::Id(waits))
        .unwrap()
        .extra
        .clone()
        .unwrap();
    assert!(extra.awaits.is_empty());
    assert_eq!(extra.parents, [parent]);
    eng.advance(6.0);
    assert_eq!(
        status(&eng, waits),
        Status::Blocked,
        "it awaits no key any more"
    );
    assert_eq!(status(&eng, times_out), Status::Skipped);
    assert_eq!(message(&eng, times_out).as_deref(), Some(MSG_AWAIT_TIMEOUT));
    run(&mut eng, parent, true, 7.0);
    assert_eq!(status(&eng, waits), Status::Ready);
    // A negative timeout times out at the next advance.
    let mut eng = engine(vec![awaiting(1, Some(-3.0))], EngineOptions::default());
    let id = eng
        .submit(after(&[(TaskRef::Key("k"), Success)]), 4.0)
        .unwrap()
        .0;
    assert_eq!(eng.next_wake(), Some(4.0));
    eng.advance(4.0);
    assert_eq!(status(&eng, id), Status::Skipped);
}

#[test]
fn a_task_may_not_take_a_key_its_own_ancestor_awaits() {
    let mut eng = engine(vec![awaiting(0, None)], EngineOptions::default());
    let x = eng
        .submit(after(&[(TaskRef::Key("k"), Success)]), 0.0)
        .unwrap()
        .0;
    let y = eng
        .submit(after(&[(TaskRef::Id(x), Success)]), 0.0)
        .unwrap()
        .0;
    let err = eng
        .submit(keyed("k", &[(TaskRef::Id(y), Success)]), 0.0)
        .unwrap_err();
    assert_eq!(err.code, "cycle");
    // Through a batch-mate, too; and without the edge to y the key is fine.
    let deps = [(TaskRef::Key("m"), Complete)];
    let mate = [(TaskRef::Id(y), Complete)];
    let err = eng
        .submit_batch(&[keyed("k", &deps), keyed("m", &mate)], 0.0)
        .unwrap_err();
    assert_eq!(err.code, "cycle");
    assert_eq!(eng.next_id(), 3);
    let k = eng.submit(keyed("k", &[]), 0.0).unwrap().0;
    assert_eq!(eng.dependents(TaskRef::Key("k")), Some(vec![(x, Success)]));
    assert_eq!(eng.dependents(TaskRef::Id(x)), Some(vec![(y, Success)]));
    assert_eq!(eng.dependents(TaskRef::Id(99)), None);
    assert_eq!(status(&eng, k), Status::Ready);
}

#[test]
fn a_batch_admits_parents_first_with_ids_in_batch_order() {
    let options = EngineOptions {
        event_level: EventLevel::All,
        ..EngineOptions::default()
    };
    let mut eng = engine(vec![pool(0)], options);
    let on_b = [(TaskRef::Key("b"), Success)];
    let on_c = [(TaskRef::Key("c"), Complete)];
    let batch = [keyed("a", &on_b), keyed("b", &on_c), keyed("c", &[])];
    let got = eng.submit_batch(&batch, 0.0).unwrap();
    assert_eq!(got, [(1, false), (2, false), (3, false)]);
    let admitted: Vec<TaskId> = eng
        .take()
        .events
        .iter()
        .filter(|e| e.status == Status::Blocked)
        .map(|e| e.id)
        .collect();
    assert_eq!(admitted, [3, 2, 1]);
    assert_eq!(status(&eng, 1), Status::Blocked);
    assert_eq!(status(&eng, 3), Status::Ready);
    // A cycle, or a key twice, admits nothing.
    let on_e = [(TaskRef::Key("e"), Success)];
    let on_d = [(TaskRef::Key("d"), Failure)];
    let err = eng
        .submit_batch(&[keyed("d", &on_e), keyed("e", &on_d)], 0.0)
        .unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        ("cycle", "dependency cycle")
    );
    let err = eng
        .submit_batch(&[keyed("d", &[]), keyed("d", &[])], 0.0)
        .unwrap_err();
    assert_eq!(err.code, "duplicate_key_in_batch");
    assert_eq!((eng.live(), eng.next_id()), (3, 4));
}

#[test]
fn a_parent_shed_and_forgotten_by_the_submit_still_decides() {
    // The new task's parent is the victim its submit sheds, forgotten at once (retention_max
    // 0): the new task still sees it ended as shed.
    let options = EngineOptions {
        retention_max: 0,
        ..EngineOptions::default()
    };
    let full = PoolConfig {
        max_pending: Some(1),
        overflow: Overflow::ShedLowest,
        ..pool(0)
    };
    for (on, ended) in [
        (Complete, vec![Status::Shed]),
        (Success, vec![Status::Shed, Status::Skipped]),
    ] {
        let mut eng = engine(vec![full.clone()], options.clone());
        let low = TaskSpec {
            cls: 3,
            ..TaskSpec::new("p")
        };
        let victim = eng.submit(low, 0.0).unwrap().0;
        let deps = [(TaskRef::Id(victim), on)];
        let urgent = TaskSpec {
            cls: 0,
            ..after(&deps)
        };
        eng.take();
        eng.submit(urgent, 1.0).unwrap();
        assert!(eng.lookup(TaskRef::Id(victim)).is_none());
        let finished: Vec<Status> = eng.take().finished.iter().map(|r| r.status).collect();
        assert_eq!(
            finished, ended,
            "skipped (forgotten too) unless any end will do"
        );
    }
    // In a batch: `a` and `c` are skipped at once, which forgets `a` before `b` is attached.
    let mut eng = engine(
        vec![pool(1)],
        EngineOptions {
            retention_max: 1,
            ..options
        },
    );
    let p = eng.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    run(&mut eng, p, true, 0.0);
    let dead = [(TaskRef::Id(p), Failure)];
    let on_a = [(TaskRef::Key("a"), Complete)];
    eng.submit_batch(&[keyed("a", &dead), keyed("c", &dead), after(&on_a)], 1.0)
        .unwrap();
    assert!(eng.lookup(TaskRef::Key("a")).is_none());
    assert_eq!(
        status(&eng, 4),
        Status::Ready,
        "complete: a skipped parent will do"
    );
}

#[test]
fn delete_keeps_an_ended_task_a_live_one_depends_on() {
    let mut eng = engine(vec![pool(1)], EngineOptions::default());
    let a = eng.submit(keyed("a", &[]), 0.0).unwrap().0;
    let b = eng.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    let c = eng.submit(TaskSpec::new("p"), 0.0).unwrap().0;
    let deps = [(TaskRef::Key("a"), Success), (TaskRef::Id(b), Success)];
    let child = eng
        .submit(
            TaskSpec {
                cls: 3,
                ..after(&deps)
            },
            0.0,
        )
        .unwrap()
        .0;
    for id in [a, b, c] {
        run(&mut eng, id, true, 1.0);
    }
    assert_eq!(eng.delete(&[a, b, c]), [c]);
    run(&mut eng, child, true, 2.0);
    assert_eq!(eng.delete(&[a, b]), [a, b], "its dependent ended");
}

// --- invariants ------------------------------------------------------------------------------

/// Edges as drawn: (target, condition); see `edges`.
type Drawn = Vec<(u8, u8)>;

#[derive(Clone, Debug)]
enum Op {
    Submit {
        key: Option<u8>,
        deps: Drawn,
        pool: usize,
    },
    Batch(Vec<(Option<u8>, Drawn)>),
    Dispatch,
    Advance(f64),
    Complete(usize),
    Fail(usize),
    Cancel(u8),
    Delete(u8),
}

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

fn deps() -> impl Strategy<Value = Drawn> {
    // target: 0..4 a key, 4.. an id back from the newest; condition 0..3
    proptest::collection::vec((0u8..12, 0u8..3), 0..3)
}

fn op() -> impl Strategy<Value = Op> {
    let key = proptest::option::of(0u8..4);
    prop_oneof![
        5 => (key.clone(), deps(), 0usize..2).prop_map(|(key, deps, pool)| Op::Submit { key, deps, pool }),
        1 => proptest::collection::vec((key, deps()), 0..4).prop_map(Op::Batch),
        3 => Just(Op::Dispatch),
        2 => prop_oneof![0.0f64..3.0, Just(20.0)].prop_map(Op::Advance),
        3 => (0usize..8).prop_map(Op::Complete),
        2 => (0usize..8).prop_map(Op::Fail),
        1 => (0u8..12).prop_map(Op::Cancel),
        1 => (0u8..12).prop_map(Op::Delete),
    ]
}

/// The edges as a spec takes them: ids counted back from the next one.
fn edges(deps: &[(u8, u8)], next: TaskId) -> Vec<(TaskRef<'static>, DepOn)> {
    deps.iter()
        .map(|&(t, c)| {
            let target = match t {
                0..4 => TaskRef::Key(KEYS[usize::from(t)]),
                _ => TaskRef::Id(next.saturating_sub(u64::from(t) - 3)),
            };
            (target, DepOn::ALL[usize::from(c)])
        })
        .collect()
}

fn check(eng: &Engine) -> Result<(), TestCaseError> {
    let held: HashMap<TaskId, _> = eng.tasks().map(|r| (r.id, r)).collect();
    // The unsettled edges each blocked task waits on: live parents' children and awaited keys.
    let mut unsettled: HashMap<TaskId, u32> = HashMap::new();
    for rec in held.values().filter(|r| !r.status.is_terminal()) {
        for (child, _) in rec.extra.iter().flat_map(|e| &e.children) {
            *unsettled.entry(*child).or_default() += 1;
        }
    }
    for (p, pool) in eng.pools().iter().enumerate() {
        for cls in 0..4u8 {
            let count = |s: Status| {
                held.values()
                    .filter(|r| r.pool == p && r.cls == cls && r.status == s)
                    .count() as i64
            };
            let c = usize::from(cls);
            let pending = count(Status::Ready) + count(Status::Retrying) + count(Status::Blocked);
            prop_assert_eq!(pool.pending_by_class[c], pending);
            prop_assert_eq!(pool.unready_by_class[c], count(Status::Blocked));
        }
    }
    for rec in held.values() {
        let Some(extra) = rec.extra.as_deref() else {
            continue;
        };
        if rec.status == Status::Blocked {
            let awaited = extra.deps.iter().filter(|(t, _)| match t {
                DepTarget::Key(k) => extra.awaits.contains(k),
                DepTarget::Id(_) => false,
            });
            let want = unsettled.get(&rec.id).copied().unwrap_or(0) + awaited.count() as u32;
            prop_assert!(extra.waiting > 0, "task {} blocked on nothing", rec.id);
            prop_assert_eq!(extra.waiting, want, "task {}", rec.id);
        }
        if rec.attempt > 0 {
            // It ran: every parent it names by id (if still held) ended meeting its edge.
            for (t, on) in &extra.deps {
                if let DepTarget::Id(id) = t
                    && let Some(parent) = held.get(id)
                {
                    prop_assert!(parent.status.is_terminal() && edge_met(parent.status, *on));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn blocked_tasks_wait_on_exactly_their_unsettled_edges(ops in proptest::collection::vec(op(), 1..120)) {
        let pools = vec![awaiting(2, Some(4.0)), PoolConfig { capacity: 1, ..PoolConfig::new("q") }];
        let options = EngineOptions { retention: 5.0, retention_max: 6, ..EngineOptions::default() };
        let mut eng = Engine::new(pools, 0.0, options, MersenneTwister::new(1)).unwrap();
        let mut now = 0.0;
        for op in ops {
            let next = eng.next_id();
            match op {
                Op::Submit { key, deps, pool } => {
                    let edges = edges(&deps, next);
                    let spec = TaskSpec {
                        key: key.map(|k| KEYS[usize::from(k)]),
                        deps: &edges,
                        ..TaskSpec::new(["p", "q"][pool])
                    };
                    let _ = eng.submit(spec, now);
                }
                Op::Batch(specs) => {
                    let edges: Vec<_> = specs.iter().map(|(_, d)| edges(d, next)).collect();
                    let specs: Vec<TaskSpec<'_>> = specs
                        .iter()
                        .zip(&edges)
                        .map(|((key, _), e)| TaskSpec {
                            key: key.map(|k| KEYS[usize::from(k)]),
                            ..after(e)
                        })
                        .collect();
                    let before = (eng.live(), eng.next_id());
                    if eng.submit_batch(&specs, now).is_err() {
                        prop_assert_eq!((eng.live(), eng.next_id()), before);
                    }
                }
                Op::Dispatch => eng.dispatch(now),
                Op::Advance(dt) => {
                    now += dt;
                    eng.advance(now);
                }
                Op::Complete(i) => if let Some(l) = pick(&eng, i) {
                    eng.complete(l, now);
                },
                Op::Fail(i) => if let Some(l) = pick(&eng, i) {
                    eng.fail(l, now, "boom", false, None);
                },
                Op::Cancel(back) => {
                    eng.cancel(TaskRef::Id(next.saturating_sub(u64::from(back))), now);
                }
                Op::Delete(back) => {
                    eng.delete(&[next.saturating_sub(u64::from(back))]);
                }
            }
            eng.take();
            check(&eng)?;
        }
    }
}
