//! Read-your-writes over watch caches.
//!
//! A reflector's store learns of our own write only when its watch event arrives. A reconcile
//! that runs before then (another object's event triggered it) sees the object as it was before
//! the write and would make the same write again: harmless, but a write. [`RecentWrites`]
//! remembers for a short while, per key, which cached version a write replaced and what it
//! wrote; while the cache still holds the replaced version, the reconcile compares against what
//! was written instead. This is the "expectations" idea of the Kubernetes ReplicaSet
//! controller, reduced to resourceVersion equality (versions are opaque, so only "is the cache
//! still at the version we replaced" is asked, never "is it older").

use std::{
    collections::HashMap,
    hash::Hash,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Recent writes per key, forgotten after `ttl`.
pub struct RecentWrites<K, V> {
    ttl: Duration,
    inner: Mutex<Inner<K, V>>,
}

struct Inner<K, V> {
    entries: HashMap<K, Entry<V>>,
    /// Size at which expired entries are dropped; doubles with the live entries, so pruning
    /// costs O(1) per call.
    prune_at: usize,
}

struct Entry<V> {
    /// The resourceVersion the cache held when the write was made (`None`: not cached).
    replaced: Option<String>,
    written: V,
    at: Instant,
    /// The cache has been seen past `replaced`: a later return to it (a deleted object is
    /// uncached again) is someone else's change, not our write still on its way.
    seen: bool,
}

impl<K: Eq + Hash, V: Clone> RecentWrites<K, V> {
    /// Remembers writes for `ttl`: longer than a watch event takes to arrive.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                prune_at: 1024,
            }),
        }
    }

    /// Notes that `written` replaced the cached version `replaced`, and that the server now
    /// holds version `new_version`. A write the server found unchanged (same version) is not
    /// noted: the cache is already current.
    pub fn record(&self, key: K, replaced: Option<String>, new_version: Option<&str>, written: V) {
        if replaced.is_some() && replaced.as_deref() == new_version {
            return;
        }
        let mut inner = self.lock();
        inner.prune(self.ttl);
        let entry = Entry {
            replaced,
            written,
            at: Instant::now(),
            seen: false,
        };
        inner.entries.insert(key, entry);
    }

    /// What was written under `key`, if the cache (now at version `cached`) has not seen it yet.
    ///
    /// A cache that never shows the written version in a call here (the object was created and
    /// deleted between two calls) reads as unseen until the entry expires.
    pub fn unseen(&self, key: &K, cached: Option<&str>) -> Option<V> {
        let mut inner = self.lock();
        inner.prune(self.ttl);
        let entry = inner
            .entries
            .get_mut(key)
            .filter(|e| !e.seen && e.at.elapsed() < self.ttl)?;
        if entry.replaced.as_deref() == cached {
            Some(entry.written.clone())
        } else {
            entry.seen = true;
            None
        }
    }

    /// How long ago the last write under `key` was made, if it is still remembered.
    pub fn age(&self, key: &K) -> Option<Duration> {
        let inner = self.lock();
        inner
            .entries
            .get(key)
            .map(|e| e.at.elapsed())
            .filter(|age| *age < self.ttl)
    }

    /// Number of remembered writes (expired ones included until pruned).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K, V>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<K, V> Inner<K, V> {
    fn prune(&mut self, ttl: Duration) {
        if self.entries.len() >= self.prune_at {
            self.entries.retain(|_, e| e.at.elapsed() < ttl);
            self.prune_at = (2 * self.entries.len()).max(1024);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_unseen_only_while_the_cache_holds_the_version_it_replaced() {
        let recent = RecentWrites::new(Duration::from_secs(60));
        recent.record("web", Some("7".into()), Some("8"), "digest-b");
        assert_eq!(recent.unseen(&"web", Some("7")), Some("digest-b"));
        assert_eq!(
            recent.unseen(&"web", Some("8")),
            None,
            "the cache caught up"
        );
        assert_eq!(
            recent.unseen(&"web", Some("9")),
            None,
            "someone wrote after us"
        );
        assert_eq!(recent.unseen(&"api", Some("7")), None, "another key");
    }

    #[test]
    fn a_create_is_unseen_while_the_cache_has_no_object() {
        let recent = RecentWrites::new(Duration::from_secs(60));
        recent.record("web", None, Some("1"), 42);
        assert_eq!(recent.unseen(&"web", None), Some(42));
        assert_eq!(recent.unseen(&"web", Some("1")), None);
    }

    #[test]
    fn an_object_deleted_after_the_cache_saw_our_create_is_stale() {
        let recent = RecentWrites::new(Duration::from_secs(60));
        recent.record("web", None, Some("1"), ());
        assert_eq!(recent.unseen(&"web", Some("1")), None);
        assert_eq!(recent.unseen(&"web", None), None, "deleted, not unseen");
        assert!(
            recent.age(&"web").is_some(),
            "the write time is still known"
        );
    }

    #[test]
    fn a_write_that_changed_nothing_is_not_remembered() {
        let recent = RecentWrites::new(Duration::from_secs(60));
        recent.record("web", Some("7".into()), Some("7"), ());
        assert_eq!(recent.unseen(&"web", Some("7")), None);
        assert!(recent.is_empty());
    }

    #[test]
    fn writes_are_forgotten_after_the_ttl_and_pruned_in_bulk() {
        let recent = RecentWrites::new(Duration::ZERO);
        for i in 0..2000 {
            recent.record(i, None, Some("1"), ());
        }
        assert_eq!(recent.unseen(&1999, None), None, "expired");
        assert_eq!(recent.age(&1999), None);
        assert!(recent.len() < 1100, "{} entries kept", recent.len());
    }
}
