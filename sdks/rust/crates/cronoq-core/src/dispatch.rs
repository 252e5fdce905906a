//! Filling free slots (Python: `cronoq.core.dispatch`): fixed starts on the slots held for
//! them, then the best ready tasks of every pool that is not paused, offering freed resources
//! and worker-group slots to the tasks parked on them.

use crate::groups::Pick;
use crate::rng::Random;
use crate::state::State;

/// Offer freed resources and group slots to the tasks parked on them, then fill slots.
///
/// An offered task counts against the resource's level, its pool's room or its group's free
/// slots; one that did not start (outranked in its queue, cancelled meanwhile, or parked again
/// on a group or another resource) may have held back others, so offer again, as when the
/// dispatch itself freed something (a missed fixed start let its held slot go). Offered tasks that did not start are no longer parked, so
/// each round offers fewer tasks or follows a start: the loop ends.
pub fn fill<R: Random>(st: &mut State<R>, now: f64) {
    let mut offer = st.parking.reoffer;
    loop {
        if offer {
            st.offer(now);
        }
        dispatch_pools(st, now);
        let missed = st.parking.unstarted_offers(&st.tasks);
        if !(missed || st.parking.reoffer) {
            return;
        }
        offer = true;
    }
}

fn dispatch_pools<R: Random>(st: &mut State<R>, now: f64) {
    // Fixed starts first, in every pool: one that could not start by its tolerance ends now,
    // and its dependents (in any pool) join the ready queues before those are served.
    for p in 0..st.pools.len() {
        let pool = &mut st.pools[p];
        if !pool.due.is_empty() && pool.busy < pool.capacity && !pool.paused {
            pool.stats.level(now, pool.busy, pool.capacity);
            st.dispatch_due(p, now);
            let pool = &mut st.pools[p];
            pool.stats.level(now, pool.busy, pool.capacity);
        }
        if !st.pools[p].misses.is_empty() {
            st.apply_misses(p, now);
        }
    }
    for p in 0..st.pools.len() {
        let pool = &mut st.pools[p];
        let mut free = pool.free_for_queue();
        if free <= 0 || pool.queues.n == 0 || pool.paused {
            continue;
        }
        // Close the stats interval before the change.
        pool.stats.level(now, pool.busy, pool.capacity);
        while free > 0 && st.pools[p].queues.n != 0 {
            let queues = &mut st.pools[p].queues;
            let id = queues.pop_best(now, &mut st.tasks).expect("a queued task");
            let adherent = queues.adherent;
            let mut slot = None;
            if st.pools[p].groups.is_some() || st.tasks[&id].labels.is_some() {
                match st.slot_for(id, p, true) {
                    Pick::Full => continue, // parked until a matching group has a free slot
                    Pick::Unlabeled => {}
                    Pick::Group(g) => slot = Some(g),
                }
            }
            if st.tasks[&id].extra.is_some() && !st.acquire(id, now, true) {
                if let Some(g) = slot
                    && st.pools[p]
                        .groups
                        .as_ref()
                        .is_some_and(|gs| !gs.parked.is_empty())
                {
                    st.unpark_labeled(p, g); // the group slot it found is free
                }
                continue; // parked on a resource; the next task may run
            }
            free -= 1;
            st.start(id, now, adherent, slot);
        }
        let pool = &mut st.pools[p];
        pool.stats.level(now, pool.busy, pool.capacity);
    }
}
