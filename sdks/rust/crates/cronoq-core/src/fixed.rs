//! Fixed start times (Python: `cronoq.core.fixed`): reservations at admission, held slots
//! ahead of the start, the start on a held slot, and what happens when the start is missed.
//!
//! A fixed-start task reserves [start - tolerance, start + expected duration + tolerance) when
//! it is admitted; at most `reservation_limit` reservations of a pool may overlap. It is then
//! *scheduled*: a slot is held for it from `start - lead` (lead: the tolerance or the learned
//! mean runtime, whichever is longer, and at most the pool's `max_hold`), and at the start time
//! it becomes *due*: ready, ahead of the ready queues, started by the next dispatch on the slot
//! held for it. If it has not started by start + tolerance, `on_miss` decides: `run_late` keeps
//! it due, `skip` ends it missed, `fail` ends it failed. A recurring occurrence with overlap
//! skip is skipped at its start time while an earlier occurrence of its schedule is still
//! live.
//!
//! Python's `FixedStarts` component is here the primitives below on `State`, which owns the
//! tables (the pools' reservations, holds, due heaps and misses) and fires the timers; the
//! batch being checked is `FixedStarts`.

use crate::groups::Pick;
use crate::model::{Extras, Status, SubmitError, TaskId, TaskRecord, py_max, py_min};
use crate::pool::{DueEntry, PoolState, peak_overlap};
use crate::rng::Random;
use crate::state::State;
use crate::timers::Timer;
use crate::vocab::OnMiss;

/// The message of a fixed start that was missed (skip or fail).
pub const MSG_MISSED: &str = "fixed start missed";
/// The message of a recurring occurrence skipped while an earlier one is live.
pub const MSG_OVERLAP: &str = "previous occurrence still running";

/// The reservations of the batch being checked (`Engine::submit_batch`): they count against
/// each other before any of them is admitted.
#[derive(Debug, Default)]
pub struct FixedStarts {
    /// A batch is being checked: each reservation checked joins `batch`.
    pub in_batch: bool,
    /// (pool, interval) of the batch's fixed starts checked so far.
    batch: Vec<(usize, (f64, f64))>,
}

impl FixedStarts {
    /// The batch is checked (or refused): its reservations no longer count.
    pub fn end_batch(&mut self) {
        self.in_batch = false;
        self.batch.clear();
    }
}

/// Past start + tolerance with an on_miss other than run_late.
fn too_late(extra: &Extras, now: f64) -> bool {
    let start = extra.start_at.expect("a fixed start");
    extra.on_miss != OnMiss::RunLate && now > start + extra.tolerance
}

impl<R: Random> State<R> {
    fn extra_of(&self, id: TaskId) -> &Extras {
        self.tasks[&id].extra.as_deref().expect("a fixed start")
    }

    /// Fixed starts may overlap at most `reservation_limit` at a time (batch-mates included).
    pub(crate) fn check_reservation(&mut self, rec: &TaskRecord) -> Result<(), SubmitError> {
        let pool = &self.pools[rec.pool];
        let (lo, hi) = pool.reservation(rec);
        let mut others: Vec<(f64, f64)> = pool.reservations.values().copied().collect();
        let batch = &self.fixed.batch;
        others.extend(
            batch
                .iter()
                .filter(|(p, _)| *p == rec.pool)
                .map(|(_, iv)| *iv),
        );
        if peak_overlap(&others, lo, hi) + 1 > pool.reservation_limit {
            return Err(SubmitError::new(
                "reservation_conflict",
                "fixed-start reservation conflict",
            ));
        }
        if self.fixed.in_batch {
            self.fixed.batch.push((rec.pool, (lo, hi)));
        }
        Ok(())
    }

    /// The task may run: wait for its time, run now, or apply on_miss.
    pub(crate) fn arrive(&mut self, id: TaskId, now: f64) {
        let extra = self.extra_of(id);
        let start = extra.start_at.expect("a fixed start");
        if too_late(extra, now) {
            self.move_to(id, Status::Scheduled, now, None);
            self.missed(id, now);
        } else if now >= start {
            self.make_due(id, now);
        } else {
            let tolerance = extra.tolerance;
            self.move_to(id, Status::Scheduled, now, None);
            let pool = &self.pools[self.tasks[&id].pool];
            let mut lead = py_max(tolerance, pool.service_time());
            if let Some(max_hold) = pool.cfg.max_hold {
                lead = py_min(lead, max_hold);
            }
            self.timers.set(start - lead, Timer::Hold { task: id });
            self.timers.set(start, Timer::Start { task: id });
        }
    }

    /// Not started within tolerance and on_miss is skip or fail.
    fn missed(&mut self, id: TaskId, now: f64) {
        let rec = &self.tasks[&id];
        self.pools[rec.pool].stats.on_fixed_start(now, false);
        let status = match self.extra_of(id).on_miss {
            OnMiss::Skip => Status::Missed,
            OnMiss::RunLate | OnMiss::Fail => Status::Failed,
        };
        self.finish(id, status, now, Some(MSG_MISSED));
    }

    /// Start tasks at their fixed start time on the slots held for them, in start order; one
    /// that lacks a matching group slot or a resource lets the next one try (it stays due,
    /// not parked: its held slot is its place).
    pub(crate) fn dispatch_due(&mut self, p: usize, now: f64) {
        let mut waiting = Vec::new();
        loop {
            let pool = &mut self.pools[p];
            if pool.busy >= pool.capacity {
                break;
            }
            let Some(entry) = pool.due.pop() else {
                break;
            };
            let Some(rec) = self.tasks.get(&entry.task) else {
                continue; // ended and forgotten
            };
            let extra = rec.extra.as_deref().expect("a fixed start");
            if rec.status != Status::Ready || !extra.due {
                continue;
            }
            let mut slot = None;
            if self.pools[p].groups.is_some() || rec.labels.is_some() {
                match self.slot_for(entry.task, p, false) {
                    Pick::Full => {
                        waiting.push(entry);
                        continue;
                    }
                    Pick::Unlabeled => {}
                    Pick::Group(g) => slot = Some(g),
                }
            }
            if !self.acquire(entry.task, now, false) {
                waiting.push(entry);
                continue;
            }
            let rec = self
                .tasks
                .get_mut(&entry.task)
                .expect("a live task is held");
            let extra = rec.extra.as_deref_mut().expect("a fixed start");
            let start = extra.start_at.expect("a fixed start");
            let hit = now <= start + extra.tolerance;
            let pool = &mut self.pools[p];
            pool.stats.on_fixed_start(now, hit);
            if drop_fixed(entry.task, extra, pool) {
                self.reoffer_if_resources();
            }
            self.start(entry.task, now, true, slot);
        }
        self.pools[p].due.extend(waiting);
    }

    /// Due tasks past their tolerance (skip or fail) that dispatch could not start end now.
    pub(crate) fn apply_misses(&mut self, p: usize, now: f64) {
        for id in std::mem::take(&mut self.pools[p].misses) {
            if let Some(rec) = self.tasks.get(&id)
                && rec.status == Status::Ready
                && rec.extra.as_deref().is_some_and(|e| e.due)
            {
                self.missed(id, now);
            }
        }
    }

    /// The start time has come: the task waits, ahead of the ready queues, for its slot.
    fn make_due(&mut self, id: TaskId, now: f64) {
        self.move_to(id, Status::Ready, now, None);
        let rec = self.tasks.get_mut(&id).expect("a live task is held");
        let pool = &mut self.pools[rec.pool];
        pool.unready_by_class[usize::from(rec.cls)] -= 1;
        rec.eligible_at = now;
        rec.ready_at = now;
        pool.arrivals += 1;
        let seq = rec.seq;
        let extra = rec.extra.as_deref_mut().expect("a fixed start");
        hold(extra, &mut pool.holds);
        extra.due = true;
        let start = extra.start_at.expect("a fixed start");
        pool.due.push(DueEntry {
            start,
            seq,
            task: id,
        });
        let end = start + extra.tolerance;
        if now <= end {
            self.timers.set(end, Timer::Miss { task: id });
        }
    }

    // --- timer handlers --------------------------------------------------------------------

    /// The slot is held from now on, if the task still waits for its start.
    pub(crate) fn on_hold(&mut self, id: TaskId) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        if rec.status == Status::Scheduled {
            let extra = rec.extra.as_deref_mut().expect("a fixed start");
            hold(extra, &mut self.pools[rec.pool].holds);
        }
    }

    /// The start time came for a task still scheduled.
    pub(crate) fn on_start(&mut self, id: TaskId, now: f64) {
        let Some(rec) = self.tasks.get(&id) else {
            return;
        };
        if rec.status != Status::Scheduled {
            return;
        }
        let extra = rec.extra.as_deref().expect("a fixed start");
        let overlaps = extra
            .recurring
            .is_some_and(|s| self.schedules.earlier_live(s, rec.seq, &self.tasks));
        if overlaps {
            self.finish(id, Status::Skipped, now, Some(MSG_OVERLAP));
        } else if too_late(extra, now) {
            // the driver woke after the tolerance
            self.missed(id, now);
        } else {
            self.make_due(id, now);
        }
    }

    /// The tolerance ran out. Without a free slot the task ends now; with one, the dispatch
    /// that follows this advance starts it or ends it.
    pub(crate) fn on_miss(&mut self, id: TaskId, now: f64) {
        let Some(rec) = self.tasks.get(&id) else {
            return;
        };
        let extra = self.extra_of(id);
        if rec.status == Status::Ready && extra.due && extra.on_miss != OnMiss::RunLate {
            let pool = &mut self.pools[rec.pool];
            if pool.busy >= pool.capacity {
                self.missed(id, now);
            } else {
                pool.misses.push(id);
            }
        }
    }
}

/// The task started or ended: its reservation and held slot go. True if a held slot went,
/// which the caller offers again to the tasks parked on resources (`reoffer_if_resources`).
pub(crate) fn drop_fixed(id: TaskId, extra: &mut Extras, pool: &mut PoolState) -> bool {
    pool.reservations.remove(&id);
    let freed = extra.held;
    if freed {
        extra.held = false;
        pool.holds -= 1;
    }
    extra.due = false;
    extra.fixed_done = true;
    freed
}

/// Hold a slot of the task's pool for it (once).
fn hold(extra: &mut Extras, holds: &mut i64) {
    if !extra.held {
        extra.held = true;
        *holds += 1;
    }
}
