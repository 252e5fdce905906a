//! One round of bench/rust_library.py for one scheduler on one tokio runtime: no-op tasks
//! submitted and awaited one at a time, in a batch, and the idle round trip (the phases are
//! defined in the script's docstring). The same body is compiled three times by
//! `bench_crate!`, against each crate and against the floor (`floor.rs`): they share the API
//! the body uses, so only the path differs.
//!
//! Usage: `cronoq-bench-rust-library CRATE RUNTIME N RT_WARMUP RT_SAMPLES [PHASES]`
//!
//! * CRATE: `ours` (sdks/rust's `cronoq`), `published` (`cronoq` 0.2.1 from crates.io) or
//!   `floor` (the baseline of `floor.rs`);
//! * RUNTIME: `current` (tokio's current-thread runtime) or `multi` (the multi-thread runtime
//!   with its default worker count, as `#[tokio::main]` builds it); the bench body runs in
//!   `block_on` on the main thread, as `#[tokio::main]`'s `main` does;
//! * N: tasks per throughput phase; RT_WARMUP, RT_SAMPLES: untimed and timed round trips;
//! * PHASES: a comma-separated subset of `seq,batch,rt` (default all), and `repeat=K` to run
//!   each phase K times (for profilers: the binary then spends its time in the phases).
//!
//! It prints, one line each: `threads K` (the runtime's workers; 0 for current-thread),
//! `seq N SECONDS CPU_SECONDS`, `batch N SECONDS CPU_SECONDS` (wall-clock time of the timed
//! region, and the CPU time all the process's threads used in it), `rt NS NS ...` (every timed
//! round trip, in order).

use std::time::{Duration, Instant};

/// Slots of the one pool, as bench/library.py's 64-slot fixed pool.
const SLOTS: u32 = 64;
/// The pool's name: the one tasks go to by default.
const POOL: &str = "default";
/// Tasks per warm-up run of each throughput phase.
const WARMUP: u64 = 1000;

/// CPU time used so far by the process's threads: the sum of their `schedstat` run times, in
/// nanoseconds (0 where /proc is missing). Precise to the nanosecond, unlike `/proc/self/stat`'s
/// clock ticks; threads that have exited are not counted (the bench's threads all live to
/// the end of a phase).
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// What a throughput phase measured: wall-clock time and the process's CPU time.
struct Timed {
    wall: Duration,
    cpu: Duration,
}

impl Timed {
    /// The wall-clock and CPU time that `work` takes.
    async fn measure(work: impl std::future::Future<Output = ()>) -> Timed {
        let cpu0 = cpu_ns();
        let t0 = Instant::now();
        work.await;
        let wall = t0.elapsed();
        let cpu = Duration::from_nanos(cpu_ns().saturating_sub(cpu0));
        Timed { wall, cpu }
    }
}

/// One line of a throughput phase's figures, as bench/rust_library.py reads them.
fn report(phase: &str, n: u64, t: Timed) {
    println!(
        "{phase} {n} {:.9} {:.9}",
        t.wall.as_secs_f64(),
        t.cpu.as_secs_f64()
    );
}

macro_rules! bench_crate {
    ($module:ident, $($krate:tt)+) => {
        mod $module {
            use std::sync::Arc;
            use std::time::{Duration, Instant};

            use $($krate)+::{Pool, Scheduler, Task, TaskContext, TaskError};

            use crate::Timed;

            type Sched = Scheduler<u64, u64>;

            /// A scheduler with one fixed pool of `SLOTS` workers whose executor returns the
            /// payload (the Python bench's `noop`).
            async fn scheduler() -> Sched {
                Scheduler::<u64, u64>::builder()
                    .pool(Pool::fixed(crate::POOL, crate::SLOTS).executor_fn(
                        |_ctx: TaskContext, p: Arc<u64>| async move { Ok::<u64, TaskError>(*p) },
                    ))
                    .build()
                    .await
                    .expect("the scheduler builds")
            }

            async fn stop(s: Sched) {
                s.shutdown(Duration::from_secs(5))
                    .await
                    .expect("the scheduler shuts down");
            }

            /// Submit one task, await its output, repeat: `n` times.
            pub async fn one_at_a_time(n: u64) -> Timed {
                let s = scheduler().await;
                let t = Timed::measure(async {
                    for i in 0..n {
                        let handle = s.submit(Task::new(i)).await.expect("submit");
                        let out = handle.await.expect("the task's output");
                        assert_eq!(*out, i);
                    }
                })
                .await;
                stop(s).await;
                t
            }

            /// Build `n` tasks, submit them in one `submit_batch`, await every handle in order.
            pub async fn batch(n: u64) -> Timed {
                let s = scheduler().await;
                let t = Timed::measure(async {
                    let tasks: Vec<Task<u64>> = (0..n).map(Task::new).collect();
                    let handles = s.submit_batch(tasks).await.expect("submit_batch");
                    for (i, handle) in (0..n).zip(handles) {
                        let out = handle.await.expect("the task's output");
                        assert_eq!(*out, i);
                    }
                })
                .await;
                stop(s).await;
                t
            }

            /// Each of `samples` submits and awaits of one task on an otherwise idle
            /// scheduler, after `warmup` untimed ones.
            pub async fn round_trips(warmup: u64, samples: u64) -> Vec<Duration> {
                let s = scheduler().await;
                for i in 0..warmup {
                    let handle = s.submit(Task::new(i)).await.expect("submit");
                    handle.await.expect("the task's output");
                }
                let mut out = Vec::with_capacity(samples as usize);
                for i in 0..samples {
                    let t0 = Instant::now();
                    let handle = s.submit(Task::new(i)).await.expect("submit");
                    let got = handle.await.expect("the task's output");
                    out.push(t0.elapsed());
                    assert_eq!(*got, i);
                }
                stop(s).await;
                out
            }
        }
    };
}

mod floor;

bench_crate!(ours, cronoq);
bench_crate!(theirs, published);
bench_crate!(bare, crate::floor);

/// Which scheduler a run measures.
#[derive(Clone, Copy, PartialEq)]
enum Which {
    Ours,
    Published,
    Floor,
}

struct Args {
    which: Which,
    multi: bool,
    n: u64,
    rt_warmup: u64,
    rt_samples: u64,
    seq: bool,
    batch: bool,
    rt: bool,
    repeat: u32,
}

fn parse() -> Result<Args, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.len() != 5 && argv.len() != 6 {
        return Err("usage: CRATE RUNTIME N RT_WARMUP RT_SAMPLES [PHASES]".into());
    }
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let which = match argv[0].as_str() {
        "ours" => Which::Ours,
        "published" => Which::Published,
        "floor" => Which::Floor,
        other => return Err(format!("unknown crate {other:?} (ours, published, floor)")),
    };
    let multi = match argv[1].as_str() {
        "current" => false,
        "multi" => true,
        other => return Err(format!("unknown runtime {other:?} (current, multi)")),
    };
    let mut args = Args {
        which,
        multi,
        n: number(&argv[2])?,
        rt_warmup: number(&argv[3])?,
        rt_samples: number(&argv[4])?,
        seq: true,
        batch: true,
        rt: true,
        repeat: 1,
    };
    if let Some(phases) = argv.get(5) {
        (args.seq, args.batch, args.rt) = (false, false, false);
        for p in phases.split(',') {
            match p {
                "seq" => args.seq = true,
                "batch" => args.batch = true,
                "rt" => args.rt = true,
                _ => match p.strip_prefix("repeat=") {
                    Some(k) => args.repeat = number(k)? as u32,
                    None => return Err(format!("unknown phase {p:?} (seq, batch, rt, repeat=K)")),
                },
            }
        }
    }
    Ok(args)
}

fn nanos(d: Duration) -> String {
    d.as_nanos().to_string()
}

macro_rules! run_phases {
    ($module:ident, $args:expr) => {{
        let a = $args;
        // Warm-up: one small run of each throughput phase, so that the allocator's pools and
        // the runtime's threads are in use before timing (the Python bench does the same).
        if a.seq {
            $module::one_at_a_time(WARMUP.min(a.n)).await;
        }
        if a.batch {
            $module::batch(WARMUP.min(a.n)).await;
        }
        for _ in 0..a.repeat {
            if a.seq {
                report("seq", a.n, $module::one_at_a_time(a.n).await);
            }
            if a.batch {
                report("batch", a.n, $module::batch(a.n).await);
            }
            if a.rt {
                let rt = $module::round_trips(a.rt_warmup, a.rt_samples).await;
                let all: Vec<String> = rt.into_iter().map(nanos).collect();
                println!("rt {}", all.join(" "));
            }
        }
    }};
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let runtime = if args.multi {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    }
    .enable_all()
    .build()
    .expect("a tokio runtime");
    println!(
        "threads {}",
        runtime.metrics().num_workers() * usize::from(args.multi)
    );
    runtime.block_on(async {
        match args.which {
            Which::Ours => run_phases!(ours, &args),
            Which::Published => run_phases!(theirs, &args),
            Which::Floor => run_phases!(bare, &args),
        }
    });
}
