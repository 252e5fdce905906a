//! Filling free slots (Python: `cronoq.core.dispatch`): the best ready tasks of every pool that
//! is not paused, in configuration order. Parking on resources and worker groups and fixed
//! starts on held slots are not ported yet; with neither, Python's offer loop runs once.

use crate::rng::Random;
use crate::state::State;

/// Start the best ready tasks on every free slot of every pool that is not paused.
pub fn fill<R: Random>(st: &mut State<R>, now: f64) {
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
