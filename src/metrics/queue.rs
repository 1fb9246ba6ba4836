//! `myapp_reconcile_queue_depth`: how many MyApps wait for a reconcile, approximated from
//! outside kube-runtime's Controller, whose scheduler exposes no length.
//!
//! The controller marks a MyApp waiting when a trigger for it enters the Controller (a MyApp
//! watch event, a child's event mapped to its owner, a relist of every MyApp) and done when its
//! reconcile starts or the Controller drops the request because the MyApp is gone. Like the
//! scheduler it counts a MyApp once however many triggers arrive, including one that arrives
//! while the MyApp is being reconciled (kube-runtime runs it again afterwards). What it does
//! not see: requeues the Controller schedules itself (the resync, retry backoff, a rollout
//! recheck) are not counted while they wait for their time, nor when it comes; that time is the
//! point of them, so they are delays rather than a backlog. controller-runtime's
//! `workqueue_depth` leaves delayed items out in the same way until they are due.
//!
//! A MyApp is held as a hash of its namespace and name: every reconcile marks one done, and a
//! key of two strings would be two allocations each time. Two MyApps sharing a 64-bit hash
//! would count once; the gauge is an approximation already.

use std::{
    collections::HashSet,
    hash::{BuildHasher, RandomState},
    sync::{Mutex, MutexGuard},
};

use prometheus_client::metrics::gauge::Gauge;

/// The MyApps waiting, by namespace and name, and the gauge that reports how many.
#[derive(Debug, Default)]
pub struct Queue {
    waiting: Mutex<HashSet<u64>>,
    hasher: RandomState,
    depth: Gauge,
}

impl Queue {
    /// The gauge to register.
    pub fn gauge(&self) -> Gauge {
        self.depth.clone()
    }

    /// How many MyApps wait now.
    pub fn depth(&self) -> i64 {
        self.depth.get()
    }

    /// A trigger for `namespace/name` entered the Controller.
    pub fn triggered(&self, namespace: Option<&str>, name: &str) {
        let key = self.key(namespace, name);
        let mut waiting = self.lock();
        waiting.insert(key);
        self.depth.set(waiting.len() as i64);
    }

    /// A reconcile of `namespace/name` started, or the Controller dropped its request.
    pub fn started(&self, namespace: Option<&str>, name: &str) {
        let key = self.key(namespace, name);
        let mut waiting = self.lock();
        waiting.remove(&key);
        self.depth.set(waiting.len() as i64);
        // A burst of creates leaves a table sized for its backlog; give it back once the
        // backlog is gone, as `recent` does for its maps.
        let (len, capacity) = (waiting.len(), waiting.capacity());
        if capacity > 64 && len < capacity / 4 {
            waiting.shrink_to(len * 2);
        }
    }

    /// The Controller stopped (shutdown or lost lease): nothing waits in it any more.
    pub fn clear(&self) {
        let mut waiting = self.lock();
        waiting.clear();
        self.depth.set(0);
    }

    fn key(&self, namespace: Option<&str>, name: &str) -> u64 {
        self.hasher.hash_one((namespace, name))
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_myapp_triggered_many_times_waits_once_until_its_reconcile_starts() {
        let queue = Queue::default();
        queue.triggered(Some("default"), "web");
        queue.triggered(Some("default"), "web");
        queue.triggered(Some("other"), "web");
        assert_eq!(queue.depth(), 2);
        queue.started(Some("default"), "web");
        assert_eq!(queue.depth(), 1);
        queue.started(Some("default"), "web");
        assert_eq!(
            queue.depth(),
            1,
            "a second start of the same MyApp removes nothing"
        );
        queue.triggered(Some("default"), "api");
        queue.clear();
        assert_eq!(queue.depth(), 0);
    }
}
