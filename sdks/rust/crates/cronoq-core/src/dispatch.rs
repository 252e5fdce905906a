//! Filling free slots (Python: `cronoq.core.dispatch`): fixed starts on the slots held for
//! them, then the best ready tasks of every pool that is not paused, in configuration order.
//! Parking on resources and worker groups is not ported yet; without it, Python's offer loop
//! runs once.

use crate::rng::Random;
use crate::state::State;

/// Start the due fixed starts, end those past their tolerance that could not start, then
/// start the best ready tasks on every free slot of every pool that is not paused.
pub fn fill<R: Random>(st: &mut State<R>, now: f64) {
    // Fixed starts first, in every pool: one that could not start by its tolerance ends now.
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
            free -= 1;
            st.start(id, now, adherent);
        }
        let pool = &mut st.pools[p];
        pool.stats.level(now, pool.busy, pool.capacity);
    }
}
