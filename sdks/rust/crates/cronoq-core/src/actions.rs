//! What an engine call leaves for its driver (Python: `cronoq.core.actions`): the actions to
//! carry out and, for a driver with a store, the journal of what changed since it last
//! persisted.
//!
//! Python's outbox holds the live objects; here `Actions` holds copies of the attempts and
//! records as they were when the engine acted on them, which is what a Python driver reads
//! right after the call (nothing changes an ended task or an aborted attempt afterwards).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::model::{Attempt, ScheduleId, StatusEvent, TaskId, TaskRecord};

/// Most entries a fresh outbox list has room for (`Actions::sized_as`).
const ROOM_MAX: usize = 1024;

/// What the driver must do after a call (see the engine's theory of operation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Actions {
    /// Attempts to run now.
    pub starts: Vec<Attempt>,
    /// Attempts the engine gave up on: cancel their executor or abort their lease.
    pub aborts: Vec<Attempt>,
    /// Tasks that reached a terminal status, as they ended.
    pub finished: Vec<TaskRecord>,
    /// Status changes, recorded only when the event level asks for them.
    pub events: Vec<StatusEvent>,
}

impl Actions {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
            && self.aborts.is_empty()
            && self.finished.is_empty()
            && self.events.is_empty()
    }

    /// Empties the lists, keeping their room up to `ROOM_MAX` entries each (a burst does not
    /// keep large lists alive).
    pub(crate) fn clear_within_room(&mut self) {
        fn clear<T>(list: &mut Vec<T>) {
            list.clear();
            list.shrink_to(ROOM_MAX);
        }
        clear(&mut self.starts);
        clear(&mut self.aborts);
        clear(&mut self.finished);
        clear(&mut self.events);
    }

    /// Empty lists with room for as many entries as these hold (up to `ROOM_MAX` each: a
    /// burst does not leave large lists behind).
    pub(crate) fn sized_as(&self) -> Actions {
        let room = |n: usize| n.min(ROOM_MAX);
        Actions {
            starts: Vec::with_capacity(room(self.starts.len())),
            aborts: Vec::with_capacity(room(self.aborts.len())),
            finished: Vec::with_capacity(room(self.finished.len())),
            events: Vec::with_capacity(room(self.events.len())),
        }
    }
}

/// What changed since the driver last persisted (`Engine::take_journal`): tasks admitted (whole
/// rows to write), tasks whose status changed (each once, in the order of its first change),
/// schedules whose next occurrence moved, pools paused or resumed (name, paused now) and ended
/// tasks deleted from the history (ids).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Journal {
    /// Tasks admitted, in admission order.
    pub added: Vec<TaskRecord>,
    /// Tasks whose status changed, in the order of their first change.
    pub changed: Vec<TaskRecord>,
    /// Schedules whose next occurrence moved, in the order of their names' first move: only
    /// those still under their name (Python's journal keeps replaced ones too, which its
    /// drivers pass over).
    pub schedules: Vec<ScheduleRow>,
    /// Pools paused (true) or resumed (false), in the order of their first change.
    pub pools: Vec<(Arc<str>, bool)>,
    /// Ended tasks deleted by `Engine::delete`.
    pub deleted: Vec<TaskId>,
}

impl Journal {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.changed.is_empty()
            && self.schedules.is_empty()
            && self.pools.is_empty()
            && self.deleted.is_empty()
    }
}

/// What a store keeps of a schedule's state (Python's `schedule_row`): its next occurrence and
/// the latest one created.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleRow {
    /// The schedule's name.
    pub name: Arc<str>,
    /// Its next occurrence.
    pub next_time: Option<f64>,
    /// The latest occurrence created.
    pub last: Option<TaskId>,
}

/// The journal as the engine keeps it between two `take_journal` calls: task ids, read as rows
/// when taken. A task forgotten meanwhile leaves its final row here (`gone`), as a Python
/// journal keeps the record object it names.
#[derive(Debug, Default)]
pub(crate) struct JournalLog {
    pub added: Vec<TaskId>,
    pub changed: Vec<TaskId>,
    changed_set: HashSet<TaskId>,
    named: HashSet<TaskId>,
    pub schedules: Vec<(Arc<str>, ScheduleId)>,
    schedule_index: HashMap<Arc<str>, usize>,
    pub pools: Vec<(Arc<str>, bool)>,
    pub deleted: Vec<TaskId>,
    pub gone: HashMap<TaskId, TaskRecord>,
}

impl JournalLog {
    pub fn add(&mut self, id: TaskId) {
        self.added.push(id);
        self.named.insert(id);
    }

    pub fn change(&mut self, id: TaskId) {
        if self.changed_set.insert(id) {
            self.changed.push(id);
            self.named.insert(id);
        }
    }

    /// A schedule's next occurrence moved (`journal.schedules[name] = sched`).
    pub fn schedule(&mut self, name: &Arc<str>, id: ScheduleId) {
        match self.schedule_index.get(name) {
            Some(&i) => self.schedules[i].1 = id,
            None => {
                self.schedule_index
                    .insert(name.clone(), self.schedules.len());
                self.schedules.push((name.clone(), id));
            }
        }
    }

    pub fn pool(&mut self, name: &Arc<str>, paused: bool) {
        match self.pools.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = paused,
            None => self.pools.push((name.clone(), paused)),
        }
    }

    /// A task is dropped from memory: keep its row if the journal names it.
    pub fn forgotten(&mut self, rec: TaskRecord) {
        if self.named.contains(&rec.id) {
            self.gone.insert(rec.id, rec);
        }
    }
}
