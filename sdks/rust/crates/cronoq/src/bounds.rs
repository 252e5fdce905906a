//! The queue bounds the engine does not keep itself: a pool's per-class bounds
//! ([`Bounds::max_pending_per_class`](crate::Bounds::max_pending_per_class)) and the bounds
//! across all pools ([`CoreConfig::global_bounds`](crate::core::CoreConfig::global_bounds)).
//! The driver checks them before it offers tasks to the engine, which keeps each pool's
//! `max_pending`.

use cronoq_core::Engine;

use crate::config::Bounds;

/// Whether `n` more pending tasks fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// They fit now.
    Fits,
    /// Not now: when other tasks leave the queue.
    Full,
    /// Not even into empty queues.
    Never,
}

/// The bound `cap` with `pending` tasks and `n` more.
fn against(cap: Option<usize>, pending: i64, n: usize) -> Room {
    let Some(cap) = cap else {
        return Room::Fits;
    };
    let pending = usize::try_from(pending.max(0)).unwrap_or(usize::MAX);
    if n > cap {
        Room::Never
    } else if pending.saturating_add(n) > cap {
        Room::Full
    } else {
        Room::Fits
    }
}

/// The tightest of two answers.
fn worst(a: Room, b: Room) -> Room {
    match (a, b) {
        (Room::Never, _) | (_, Room::Never) => Room::Never,
        (Room::Full, _) | (_, Room::Full) => Room::Full,
        _ => Room::Fits,
    }
}

/// Room for new tasks: `per_pool[p][class]` of them in pool `p` (whose per-class bounds are
/// `pool_bounds[p]`), against those bounds and the `global` ones.
pub(crate) fn room(
    engine: &Engine,
    pool_bounds: impl Fn(usize) -> [Option<usize>; 4],
    global: &Bounds,
    new: &[(usize, usize)],
) -> Room {
    let pools = engine.pools();
    let mut answer = Room::Fits;
    let mut by_class = [0usize; 4];
    for (i, &(p, cls)) in new.iter().enumerate() {
        if new[..i].contains(&(p, cls)) {
            continue;
        }
        let n = new.iter().filter(|&&x| x == (p, cls)).count();
        by_class[cls] += n;
        let cap = pool_bounds(p)[cls];
        answer = worst(answer, against(cap, pools[p].pending_by_class[cls], n));
    }
    let pending = |cls: usize| pools.iter().map(|q| q.pending_by_class[cls]).sum::<i64>();
    for (cls, &n) in by_class.iter().enumerate() {
        if n > 0 {
            let cap = global.max_pending_per_class[cls];
            answer = worst(answer, against(cap, pending(cls), n));
        }
    }
    let all = pools.iter().map(|q| q.pending()).sum();
    worst(answer, against(global.max_pending, all, new.len()))
}

/// Whether any bound of these kinds is set.
pub(crate) fn any(bounds: &Bounds) -> bool {
    bounds.max_pending.is_some() || bounds.max_pending_per_class.iter().any(Option::is_some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_fit_fill_or_never() {
        assert_eq!(against(None, 100, 5), Room::Fits);
        assert_eq!(against(Some(3), 1, 2), Room::Fits);
        assert_eq!(against(Some(3), 2, 2), Room::Full);
        assert_eq!(against(Some(3), 0, 4), Room::Never);
        assert_eq!(worst(Room::Full, Room::Fits), Room::Full);
        assert_eq!(worst(Room::Full, Room::Never), Room::Never);
        assert!(!any(&Bounds::default()));
    }
}
