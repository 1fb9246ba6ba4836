//! Children found to hold what their MyApp asks of them, remembered by the two versions
//! compared, so that a reconcile over the same pair (a resync, or one triggered by another
//! object's event) need not build the desired child and compare it again.
//!
//! What a MyApp asks of a child depends on the MyApp alone (`resources::desired_deployment`,
//! `resources::desired_service`: its spec, name, uid and generation), and anything that changes
//! the MyApp or the child changes its resourceVersion. So once the child at version C was found
//! to hold everything the MyApp at version A asks for, that stays true for as long as the cache
//! holds both at those versions. Versions are compared for equality only.
//!
//! An entry is a few machine words per MyApp, keyed by a hash of its namespace and name: two
//! MyApps sharing a hash cannot pass for each other, since no two objects share a
//! resourceVersion. It goes when its MyApp is deleted, or is missing from a relist.

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash, Hasher},
    sync::{Arc, Mutex, MutexGuard},
};

use kube::runtime::{
    reflector::{ObjectRef, Store},
    watcher,
};

use super::child::Child;
use crate::crd::MyApp;

/// Per MyApp: the version it was at, and each child's version found to hold what it asks.
#[derive(Default)]
pub(super) struct Verified {
    hasher: std::hash::RandomState,
    entries: Mutex<HashMap<u64, Entry>>,
}

#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Entry {
    app: u64,
    deployment: Option<u64>,
    service: Option<u64>,
}

impl Verified {
    /// Whether `child`, cached at `child_version`, was found to hold what the MyApp `key` at
    /// `app_version` asks of it.
    pub(super) fn holds(
        &self,
        key: &ObjectRef<MyApp>,
        app_version: Option<&str>,
        child: Child,
        child_version: Option<&str>,
    ) -> bool {
        let (Some(app), Some(found)) = (app_version, child_version) else {
            return false;
        };
        let entry = self.lock().get(&self.key(key)).copied();
        entry.is_some_and(|e| e.app == version(app) && *e.child(child) == Some(version(found)))
    }

    /// Notes that `child`, cached at `child_version`, holds what the MyApp `key` at
    /// `app_version` asks of it. A note for another MyApp version replaces the entry.
    pub(super) fn note(
        &self,
        key: &ObjectRef<MyApp>,
        app_version: Option<&str>,
        child: Child,
        child_version: Option<&str>,
    ) {
        let (Some(app), Some(found)) = (app_version, child_version) else {
            return;
        };
        let app = version(app);
        let mut entries = self.lock();
        let entry = entries.entry(self.key(key)).or_default();
        if entry.app != app {
            *entry = Entry {
                app,
                ..Entry::default()
            };
        }
        *entry.child_mut(child) = Some(version(found));
    }

    /// Forgets a MyApp once its delete event arrives, and after a (re)list those the list no
    /// longer holds (deleted while the watch was down).
    pub(super) fn forget_deleted(
        self: &Arc<Self>,
        apps: Store<MyApp>,
    ) -> impl FnMut(&watcher::Event<MyApp>) + Send + Sync + 'static {
        let verified = self.clone();
        move |event| match event {
            watcher::Event::Delete(app) => {
                let key = verified.key(&ObjectRef::from_obj(app));
                verified.lock().remove(&key);
            }
            watcher::Event::InitDone => {
                let live: std::collections::HashSet<u64> = apps
                    .state()
                    .iter()
                    .map(|app| verified.key(&ObjectRef::from_obj(app.as_ref())))
                    .collect();
                verified.lock().retain(|key, _| live.contains(key));
            }
            _ => {}
        }
    }

    fn key(&self, key: &ObjectRef<MyApp>) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        key.namespace.hash(&mut hasher);
        key.name.hash(&mut hasher);
        hasher.finish()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Entry {
    fn child(&self, child: Child) -> &Option<u64> {
        match child {
            Child::Deployment => &self.deployment,
            Child::Service => &self.service,
        }
    }

    fn child_mut(&mut self, child: Child) -> &mut Option<u64> {
        match child {
            Child::Deployment => &mut self.deployment,
            Child::Service => &mut self.service,
        }
    }
}

/// A resourceVersion as a number: itself when it is a decimal integer (as every API server's
/// is), else a hash of its text. Only equality is asked of it.
fn version(version: &str) -> u64 {
    version.parse().unwrap_or_else(|_| {
        let mut hasher = std::hash::DefaultHasher::new();
        version.hash(&mut hasher);
        hasher.finish() | 1 << 63
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_holds_while_both_versions_stay_and_a_deletion_forgets_it() {
        let verified = Arc::new(Verified::default());
        let (apps, _writer) = kube::runtime::reflector::store::<MyApp>();
        let mut forget = verified.forget_deleted(apps);
        let web = MyApp::test("web").in_namespace("shop").stored();
        let key = ObjectRef::from_obj(&web);
        let holds = |app: &str, child: Child, found: &str| {
            verified.holds(&key, Some(app), child, Some(found))
        };
        assert!(!holds("10", Child::Deployment, "20"), "nothing noted yet");
        verified.note(&key, Some("10"), Child::Deployment, Some("20"));
        assert!(holds("10", Child::Deployment, "20"));
        assert!(!holds("10", Child::Service, "20"), "per child");
        assert!(!holds("11", Child::Deployment, "20"), "the MyApp changed");
        assert!(!holds("10", Child::Deployment, "21"), "the child changed");
        assert!(
            !verified.holds(&key, None, Child::Deployment, Some("20")),
            "no version, no memory"
        );

        verified.note(&key, Some("10"), Child::Service, Some("30"));
        verified.note(&key, Some("12"), Child::Service, Some("31"));
        assert!(
            !holds("10", Child::Deployment, "20"),
            "a newer MyApp version replaces what the older one found"
        );
        assert!(holds("12", Child::Service, "31"));

        forget(&watcher::Event::Delete(web.clone()));
        assert!(!holds("12", Child::Service, "31"), "the deletion forgot it");
    }

    #[test]
    fn versions_that_are_not_numbers_are_compared_by_their_text() {
        assert_eq!(version("42"), 42);
        assert_eq!(version("abc"), version("abc"));
        assert_ne!(version("abc"), version("abd"));
        assert_ne!(version("abc"), version("0"));
    }
}
