//! Read-your-writes over watch caches.
//!
//! A reflector's store learns of our own write only when its watch event arrives. A reconcile
//! that runs before then (another object's event triggered it) sees the object as it was before
//! the write and would make the same write again: harmless, but a write. [`RecentWrites`]
//! remembers, per key, which cached version a write replaced and what it wrote; while the cache
//! still holds the replaced version, the reconcile compares against what was written instead.
//! This is the "expectations" idea of the Kubernetes ReplicaSet controller, reduced to
//! resourceVersions: the cache has not seen the write while it holds the version the write
//! replaced, or a version older than the one the server gave the write. The second case is a
//! concurrent write that our forced apply overwrote, whose watch event arrives before ours:
//! without it, a reconcile on that event would undo a change that is already undone. "Older"
//! is asked only of versions that KEP-5504 (stable in Kubernetes 1.35) makes comparable,
//! decimal integers without leading zeros; other versions are opaque and only equality counts.
//!
//! An entry goes as soon as a lookup finds the cache past it, or the watch event of the write
//! itself arrives ([`RecentWrites::echoes`]), so at steady state the map is empty; entries
//! never looked up again expire after the TTL.

use std::{
    cmp::Ordering,
    collections::HashMap,
    hash::Hash,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Recent writes per key.
pub struct RecentWrites<K, V> {
    ttl: Duration,
    entries: Mutex<Timed<K, Entry<V>>>,
}

struct Entry<V> {
    /// The resourceVersion the cache held when the write was made (`None`: not cached).
    replaced: Option<String>,
    /// The resourceVersion the server gave the write.
    version: Option<String>,
    written: V,
}

impl<K: Eq + Hash, V: Clone> RecentWrites<K, V> {
    /// Remembers writes for at most `ttl`: far longer than a watch event takes to arrive.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(Timed::default()),
        }
    }

    /// Notes that `written` replaced the cached version `replaced`, and that the server now
    /// holds version `new_version`. A write the server found unchanged (same version) is not
    /// noted: the cache is already current.
    pub fn record(&self, key: K, replaced: Option<String>, new_version: Option<&str>, written: V) {
        if replaced.is_some() && replaced.as_deref() == new_version {
            return;
        }
        let version = new_version.map(str::to_owned);
        let entry = Entry {
            replaced,
            version,
            written,
        };
        self.lock().insert(key, entry, self.ttl);
    }

    /// Whether the object under `key`, now at `version`, is our write itself as its watch
    /// event brings it back: the version the server gave the write. The reconcile that wrote
    /// it planned with what it wrote, so the event is news to nobody. A match ends the entry
    /// (the cache holds the write now).
    pub fn echoes(&self, key: &K, version: Option<&str>) -> bool {
        let mut entries = self.lock();
        let echo = entries
            .get(key, self.ttl)
            .is_some_and(|(_, entry)| version.is_some() && entry.version.as_deref() == version);
        if echo {
            entries.remove(key);
        }
        echo
    }

    /// What was written under `key`, if the cache (now at version `cached`) has not seen it
    /// yet: it holds the replaced version or one older than the write's. Any other version
    /// ends the entry: the write, or someone's after it.
    pub fn unseen(&self, key: &K, cached: Option<&str>) -> Option<V> {
        self.unseen_at(key, cached).map(|(written, _)| written)
    }

    /// [`RecentWrites::unseen`], with the resourceVersion the server gave the write: the one
    /// the server holds now, as far as this process knows.
    pub fn unseen_at(&self, key: &K, cached: Option<&str>) -> Option<(V, Option<String>)> {
        let mut entries = self.lock();
        let (_, entry) = entries.get(key, self.ttl)?;
        let behind = match (cached, entry.version.as_deref()) {
            (Some(cached), Some(written)) => compare(cached, written) == Some(Ordering::Less),
            _ => false,
        };
        if behind || entry.replaced.as_deref() == cached {
            return Some((entry.written.clone(), entry.version.clone()));
        }
        entries.remove(key);
        None
    }

    /// Ends the entry under `key` if it records a write that created its object (the cache
    /// held nothing) at a version later than `version` (any version, for `None`); returns
    /// whether it did. A version that does not compare counts as later.
    pub fn take_created_after(&self, key: &K, version: Option<&str>) -> bool {
        let mut entries = self.lock();
        let created_after = entries.get(key, self.ttl).is_some_and(|(_, entry)| {
            entry.replaced.is_none()
                && match (entry.version.as_deref(), version) {
                    (Some(written), Some(version)) => {
                        compare(written, version) != Some(Ordering::Less)
                    }
                    _ => true,
                }
        });
        if created_after {
            entries.remove(key);
        }
        created_after
    }

    /// Number of remembered writes (expired ones included until pruned).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether nothing is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Timed<K, Entry<V>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How two resourceVersions of one resource compare, when both are comparable as KEP-5504
/// defines it: decimal integers without leading zeros (so zero is not one), compared by
/// length, then digit by digit. `None` for any other pair: opaque versions.
fn compare(a: &str, b: &str) -> Option<Ordering> {
    let comparable =
        |v: &str| !v.starts_with('0') && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    (comparable(a) && comparable(b)).then(|| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// Since when each key has been waiting for something, forgotten after `ttl`.
pub struct Waiting<K> {
    ttl: Duration,
    since: Mutex<Timed<K, ()>>,
}

impl<K: Eq + Hash> Waiting<K> {
    /// Forgets a wait after `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            since: Mutex::new(Timed::default()),
        }
    }

    /// `key` starts waiting now.
    pub fn start(&self, key: K) {
        self.lock().insert(key, (), self.ttl);
    }

    /// How long `key` has been waiting, if it is.
    pub fn elapsed(&self, key: &K) -> Option<Duration> {
        self.lock().get(key, self.ttl).map(|(at, ())| at.elapsed())
    }

    /// `key` no longer waits.
    pub fn end(&self, key: &K) {
        self.lock().remove(key);
    }

    fn lock(&self) -> MutexGuard<'_, Timed<K, ()>> {
        self.since.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A map whose entries expire; expired entries are dropped in bulk and the table shrinks with
/// its content, so a burst (10,000 creates) does not leave its peak allocation behind.
struct Timed<K, V> {
    map: HashMap<K, (Instant, V)>,
    /// Size at which expired entries are dropped; doubles with the live entries, so pruning
    /// costs O(1) per insert.
    prune_at: usize,
}

impl<K, V> Default for Timed<K, V> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            prune_at: 1024,
        }
    }
}

impl<K: Eq + Hash, V> Timed<K, V> {
    fn insert(&mut self, key: K, value: V, ttl: Duration) {
        if self.map.len() >= self.prune_at {
            self.map.retain(|_, (at, _)| at.elapsed() < ttl);
            self.prune_at = (2 * self.map.len()).max(1024);
            self.shrink();
        }
        self.map.insert(key, (Instant::now(), value));
    }

    /// The live entry under `key` and when it was inserted; an expired one is removed.
    fn get(&mut self, key: &K, ttl: Duration) -> Option<&(Instant, V)> {
        if self.map.get(key)?.0.elapsed() >= ttl {
            self.remove(key);
            return None;
        }
        self.map.get(key)
    }

    fn remove(&mut self, key: &K) {
        if self.map.remove(key).is_some() {
            self.shrink();
        }
    }

    fn shrink(&mut self) {
        if self.map.capacity() > 64 && self.map.len() < self.map.capacity() / 4 {
            self.map.shrink_to(self.map.len() * 2);
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
        assert!(recent.is_empty(), "an entry the cache caught up with goes");
        recent.record("web", Some("7".into()), Some("8"), "digest-b");
        assert_eq!(
            recent.unseen(&"web", Some("9")),
            None,
            "someone wrote after us"
        );
        assert_eq!(recent.unseen(&"api", Some("7")), None, "another key");
    }

    #[test]
    fn a_write_is_unseen_while_the_cache_holds_a_version_older_than_it() {
        // Another writer changed the object (50 -> 55) while our forced apply, planned at 50,
        // was in flight and overwrote it (56); the cache gets 55 before 56.
        let recent = RecentWrites::new(Duration::from_secs(60));
        recent.record("web", Some("50".into()), Some("56"), "digest-b");
        assert_eq!(recent.unseen(&"web", Some("55")), Some("digest-b"));
        assert_eq!(
            recent.unseen(&"web", Some("9")),
            Some("digest-b"),
            "compared as numbers, not as text"
        );
        assert_eq!(
            recent.unseen(&"web", Some("61")),
            None,
            "someone wrote after us"
        );
        assert!(recent.is_empty());
        // Versions that are not canonical decimal integers are opaque: only equality counts.
        recent.record("web", Some("a".into()), Some("c"), "digest-b");
        assert_eq!(recent.unseen(&"web", Some("b")), None);
        recent.record("web", Some("050".into()), Some("056"), "digest-b");
        assert_eq!(recent.unseen(&"web", Some("055")), None);
    }

    #[test]
    fn resource_versions_compare_as_kep_5504_says_or_not_at_all() {
        assert_eq!(compare("9", "10"), Some(Ordering::Less));
        assert_eq!(compare("123", "122"), Some(Ordering::Greater));
        assert_eq!(compare("42", "42"), Some(Ordering::Equal));
        for opaque in ["", "0", "007", "12a", "-1", "1.5"] {
            assert_eq!(compare(opaque, "5"), None, "{opaque:?}");
            assert_eq!(compare("5", opaque), None, "{opaque:?}");
        }
    }

    #[test]
    fn a_create_is_unseen_while_the_cache_has_no_object() {
        let recent = RecentWrites::new(Duration::from_secs(60));
        recent.record("web", None, Some("1"), 42);
        assert_eq!(recent.unseen(&"web", None), Some(42));
        assert_eq!(recent.unseen(&"web", Some("1")), None);
        assert_eq!(
            recent.unseen(&"web", None),
            None,
            "deleted after the cache saw it"
        );
    }

    #[test]
    fn only_the_version_the_write_was_given_is_its_echo() {
        let recent = RecentWrites::new(Duration::from_secs(60));
        recent.record("web", Some("7".into()), Some("8"), "digest-b");
        assert!(!recent.echoes(&"web", Some("7")), "the version it replaced");
        assert!(!recent.echoes(&"web", Some("9")), "someone wrote after us");
        assert!(!recent.echoes(&"web", None));
        assert!(!recent.echoes(&"api", Some("8")), "another key");
        assert!(recent.echoes(&"web", Some("8")));
        assert!(recent.is_empty(), "the echo ends the entry");
        assert!(
            !recent.echoes(&"web", Some("8")),
            "an event is an echo once"
        );
        recent.record("web", None, None, "digest-c");
        assert!(
            !recent.echoes(&"web", None),
            "a write without a version has no echo"
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
        assert!(recent.len() < 1100, "{} entries kept", recent.len());
    }

    #[test]
    fn a_wait_is_timed_until_it_ends_or_expires() {
        let waiting = Waiting::new(Duration::from_secs(60));
        waiting.start("web");
        assert!(waiting.elapsed(&"web").is_some());
        waiting.end(&"web");
        assert_eq!(waiting.elapsed(&"web"), None);
        let expired = Waiting::new(Duration::ZERO);
        expired.start("web");
        assert_eq!(expired.elapsed(&"web"), None);
    }

    #[test]
    fn only_a_create_after_the_given_version_is_taken_and_only_once() {
        let recent = RecentWrites::new(Duration::from_secs(30));
        recent.record("web", None, Some("20"), "digest");
        recent.record("api", Some("7".into()), Some("21"), "digest");
        assert!(
            !recent.take_created_after(&"web", Some("25")),
            "created before the delete"
        );
        assert!(
            !recent.take_created_after(&"api", Some("10")),
            "an update, not a create"
        );
        assert!(recent.take_created_after(&"web", Some("15")));
        assert!(!recent.take_created_after(&"web", None), "taken already");
        recent.record("db", None, Some("30"), "digest");
        assert!(recent.take_created_after(&"db", None), "any version");
    }
}
