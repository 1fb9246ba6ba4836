//! Connection slots: a cap on open connections that, once reached, sheds the connection that has
//! waited longest without sending a request rather than turning the newcomer away.
//!
//! Refusing at the cap (or leaving newcomers in the listen backlog) lets whoever holds the slots
//! decide who is served; holding a slot without a request costs an attacker nothing. Shedding the
//! oldest waiting connection means a client that sends its request promptly always gets in, as
//! long as fewer than `max` requests are actually being answered.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::Notify;

use super::connection::Activity;

/// The open connections and the cap on them.
pub(super) struct Slots {
    max: usize,
    open: Mutex<Open>,
    freed: Notify,
}

struct Open {
    next_id: u64,
    connections: HashMap<u64, Arc<Activity>>,
}

/// One admitted connection; dropping it frees the slot.
pub(super) struct Slot {
    slots: Arc<Slots>,
    id: u64,
}

impl Slots {
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            open: Mutex::new(Open {
                next_id: 0,
                connections: HashMap::new(),
            }),
            freed: Notify::new(),
        })
    }

    /// Admits `activity`, shedding the longest-waiting connection without a request in flight
    /// when the cap is reached; waits only while every slot is answering a request.
    pub(super) async fn admit(self: &Arc<Self>, activity: Arc<Activity>) -> Slot {
        loop {
            if let Some(slot) = self.try_admit(&activity) {
                return slot;
            }
            // `notify_one` stores a permit, so a slot freed between the check and here is seen.
            self.freed.notified().await;
        }
    }

    fn try_admit(self: &Arc<Self>, activity: &Arc<Activity>) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.connections.len() >= self.max && !open.shed_one() {
            return None;
        }
        let id = open.next_id;
        open.next_id += 1;
        open.connections.insert(id, activity.clone());
        Some(Slot {
            slots: self.clone(),
            id,
        })
    }

    /// Sheds one waiting connection (when the process runs out of file descriptors, say).
    /// Returns whether there was one to shed.
    pub(super) fn shed_one(&self) -> bool {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.shed_one()
    }

    /// How many connections hold a slot.
    pub(super) fn len(&self) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.connections.len()
    }
}

impl Open {
    fn shed_one(&mut self) -> bool {
        // A linear scan: it runs only at the cap, over at most `max` entries of a few atomics.
        let victim = self
            .connections
            .iter()
            .filter_map(|(id, activity)| activity.shed_rank().map(|rank| (rank, *id)))
            .min();
        let Some((_, id)) = victim else {
            return false;
        };
        if let Some(activity) = self.connections.remove(&id) {
            activity.shed();
        }
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A shed connection already left the table; its slot was handed on at once.
        if open.connections.remove(&self.id).is_some() {
            drop(open);
            self.slots.freed.notify_one();
        }
    }
}
