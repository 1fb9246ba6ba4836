//! Children found to hold what their MyApp asks of them, remembered by the MyApp's version and
//! the child's shape, so that a reconcile over the same pair (a resync, one triggered by
//! another object's event, or by the child's own status) need not build the desired child and
//! compare it again; and MyApps found settled, remembered by all three versions, so that such a
//! reconcile need not even read its children from the cache.
//!
//! What a MyApp asks of a child depends on the MyApp alone (`resources::desired_deployment`,
//! `resources::desired_service`: its spec, name, uid and generation), and anything that changes
//! the MyApp changes its resourceVersion. Of the child, the comparison reads only what an apply
//! of ours sets (`CachedDeployment::applied_part`): not its status, which its controller
//! rewrites several times per rollout. A child's shape is a keyed hash of that part, so once
//! the child in one shape was found to hold everything the MyApp at version A asks for, any
//! version of it in the same shape does too, for as long as the MyApp stays at A. The hash's
//! key is drawn per process, so that nobody who can edit a child can make another shape pass
//! for the one found holding. A Service is remembered by its version instead: nothing but
//! writes to what an apply sets changes it (its status only for a load balancer), so a
//! reconcile that finds it holding at the version cached now need not even read it. Versions
//! are compared for equality only.
//!
//! A plan is settled when it finds nothing to write and nothing to wait for, with no write of
//! ours outstanding and a status that time alone cannot change (`plan::Plan::settles`). The
//! plan reads nothing else, and the memories of our writes change only by a write, which
//! changes a version: so at the same three versions the plan is settled again, and is not
//! made.
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
use crate::cache::CachedMyApp;

/// Per MyApp: the version it was at, each child's shape found to hold what it asks, and the
/// children's versions at which the three were found settled.
#[derive(Default)]
pub(super) struct Verified {
    hasher: std::hash::RandomState,
    entries: Mutex<HashMap<u64, Entry>>,
}

#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Entry {
    app: u64,
    /// The Deployment's shape found holding.
    deployment: Option<u64>,
    /// The Service's version found holding.
    service: Option<u64>,
    /// The Deployment's and the Service's versions, when settled.
    settled: Option<(u64, u64)>,
}

/// What one reconcile saw: the versions, each as `packed::version_number` gives it, and the
/// Deployment's shape ([`Verified::shape`]) once it was read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Versions {
    pub app: Option<u64>,
    pub deployment: Option<u64>,
    pub service: Option<u64>,
    pub deployment_shape: Option<u64>,
}

impl Versions {
    /// What the memory of `child` found holding is kept by: the Deployment's shape, the
    /// Service's version.
    fn found(&self, child: Child) -> Option<u64> {
        match child {
            Child::Deployment => self.deployment_shape,
            Child::Service => self.service,
        }
    }
}

impl Verified {
    /// A Deployment's shape: a hash, keyed per process, of the part of it that an apply of
    /// ours sets (`CachedDeployment::applied_part`). None if it cannot be serialized (the
    /// cached type always can: every map key is a string); such a Deployment is compared every
    /// time.
    pub(super) fn shape(&self, applied_part: &impl serde::Serialize) -> Option<u64> {
        // Hashed as one slice: SipHash pays a partial block per write, and a serializer
        // writes many short pieces.
        let json = serde_json::to_vec(applied_part).ok()?;
        Some(self.hasher.hash_one(json))
    }

    /// Whether `child`, in its shape (a Deployment) or at its version (a Service) in `seen`,
    /// was found to hold what the MyApp `key` at its version asks of it.
    pub(super) fn holds(&self, key: &ObjectRef<CachedMyApp>, seen: Versions, child: Child) -> bool {
        let (Some(app), Some(found)) = (seen.app, seen.found(child)) else {
            return false;
        };
        let entry = self.lock().get(&self.key(key)).copied();
        entry.is_some_and(|e| e.app == app && *e.child(child) == Some(found))
    }

    /// Notes that `child`, in its shape (a Deployment) or at its version (a Service) in `seen`,
    /// holds what the MyApp `key` at its version asks of it. A note for another MyApp version
    /// replaces the entry.
    pub(super) fn note(&self, key: &ObjectRef<CachedMyApp>, seen: Versions, child: Child) {
        let (Some(app), Some(found)) = (seen.app, seen.found(child)) else {
            return;
        };
        let mut entries = self.lock();
        let entry = entries.entry(self.key(key)).or_default();
        if entry.app != app {
            *entry = Entry {
                app,
                ..Entry::default()
            };
        }
        let noted = entry.child_mut(child);
        if *noted != Some(found) {
            *noted = Some(found);
            entry.settled = None;
        }
    }

    /// Whether the MyApp `key` was found settled at exactly these versions.
    pub(super) fn settled(&self, key: &ObjectRef<CachedMyApp>, seen: Versions) -> bool {
        let Some(app) = seen.app else {
            return false;
        };
        let entry = self.lock().get(&self.key(key)).copied();
        entry.is_some_and(|e| {
            e.app == app
                && e.settled.is_some_and(|(deployment, service)| {
                    seen.deployment == Some(deployment) && seen.service == Some(service)
                })
        })
    }

    /// Notes that the MyApp `key` is settled at these versions: both children hold what it
    /// asks, and its status is what it should be.
    pub(super) fn settle(&self, key: &ObjectRef<CachedMyApp>, seen: Versions) {
        let (Some(app), Some(deployment), Some(service)) =
            (seen.app, seen.deployment, seen.service)
        else {
            return;
        };
        let entry = Entry {
            app,
            deployment: seen.deployment_shape,
            service: seen.service,
            settled: Some((deployment, service)),
        };
        self.lock().insert(self.key(key), entry);
    }

    /// Forgets a MyApp once its delete event arrives, and after a (re)list those the list no
    /// longer holds (deleted while the watch was down).
    pub(super) fn forget_deleted(
        self: &Arc<Self>,
        apps: Store<CachedMyApp>,
    ) -> impl FnMut(&watcher::Event<CachedMyApp>) + Send + Sync + 'static {
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

    fn key(&self, key: &ObjectRef<CachedMyApp>) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MyApp;

    /// A Deployment whose version is its shape: each version in another shape.
    fn seen(app: u64, deployment: u64, service: u64) -> Versions {
        Versions {
            app: Some(app),
            deployment: Some(deployment),
            service: Some(service),
            deployment_shape: Some(deployment),
        }
    }

    #[test]
    fn a_child_holds_while_both_versions_stay_and_a_deletion_forgets_it() {
        let verified = Arc::new(Verified::default());
        let (apps, _writer) = kube::runtime::reflector::store::<CachedMyApp>();
        let mut forget = verified.forget_deleted(apps);
        let web: CachedMyApp = MyApp::test("web").in_namespace("shop").stored().into();
        let key = ObjectRef::from_obj(&web);
        let holds = |app, child, found| verified.holds(&key, seen(app, found, found), child);
        assert!(!holds(10, Child::Deployment, 20), "nothing noted yet");
        verified.note(&key, seen(10, 20, 0), Child::Deployment);
        assert!(holds(10, Child::Deployment, 20));
        assert!(!holds(10, Child::Service, 20), "per child");
        assert!(!holds(11, Child::Deployment, 20), "the MyApp changed");
        assert!(!holds(10, Child::Deployment, 21), "the child changed");
        let unversioned = Versions {
            app: None,
            ..seen(0, 20, 20)
        };
        assert!(
            !verified.holds(&key, unversioned, Child::Deployment),
            "no version, no memory"
        );

        verified.note(&key, seen(10, 0, 30), Child::Service);
        verified.note(&key, seen(12, 0, 31), Child::Service);
        assert!(
            !holds(10, Child::Deployment, 20),
            "a newer MyApp version replaces what the older one found"
        );
        assert!(holds(12, Child::Service, 31));

        assert!(
            !verified.holds(&key, seen(12, 0, 32), Child::Service),
            "a Service is kept by its version: another version is compared again"
        );
        verified.note(&key, seen(12, 40, 31), Child::Deployment);
        let status_only = Versions {
            deployment: Some(41),
            ..seen(12, 40, 31)
        };
        assert!(
            verified.holds(&key, status_only, Child::Deployment),
            "a Deployment's new version in the same shape holds"
        );
        let unread = Versions {
            deployment_shape: None,
            ..seen(12, 40, 31)
        };
        assert!(
            !verified.holds(&key, unread, Child::Deployment),
            "no shape, no memory"
        );

        forget(&watcher::Event::Delete(web.clone()));
        assert!(!holds(12, Child::Service, 31), "the deletion forgot it");
    }

    #[test]
    fn a_shape_covers_what_an_apply_sets_and_not_the_status_or_the_version() {
        use crate::{
            cache::{CachedDeployment, cached},
            resources,
        };
        use k8s_openapi::api::apps::v1::DeploymentStatus;
        let app = MyApp::test("web").in_namespace("shop").stored();
        let desired = resources::desired_deployment(&app, None);
        let service = resources::desired_service(&app, None);
        for json in [desired.json(), service.json()] {
            let top: Vec<_> = json.as_object().unwrap().keys().collect();
            assert_eq!(top, ["metadata", "spec"], "an apply sets nothing else");
            for key in json["metadata"].as_object().unwrap().keys() {
                assert!(
                    [
                        "name",
                        "namespace",
                        "labels",
                        "annotations",
                        "ownerReferences"
                    ]
                    .contains(&key.as_str()),
                    "metadata.{key} is not in the applied part"
                );
            }
        }
        let verified = Verified::default();
        let shape = |deployment: &k8s_openapi::api::apps::v1::Deployment| {
            verified
                .shape(&cached::<_, CachedDeployment>(deployment).applied_part())
                .unwrap()
        };
        let mut deployment = desired.object().clone();
        deployment.metadata.resource_version = Some("5".into());
        let at_5 = shape(&deployment);
        deployment.metadata.resource_version = Some("6".into());
        deployment.status = Some(DeploymentStatus {
            ready_replicas: Some(3),
            ..DeploymentStatus::default()
        });
        assert_eq!(
            shape(&deployment),
            at_5,
            "a status and a version are not part of it"
        );
        let edits: [fn(&mut k8s_openapi::api::apps::v1::Deployment); 4] = [
            |d| d.spec.as_mut().unwrap().replicas = Some(7),
            |d| {
                let labels = d.metadata.labels.get_or_insert_default();
                labels.insert("team".into(), "a".into());
            },
            |d| {
                let annotations = d.metadata.annotations.get_or_insert_default();
                annotations.insert(resources::APPLIED_DIGEST_ANNOTATION.into(), "x".into());
            },
            |d| d.metadata.owner_references = None,
        ];
        for (n, edit) in edits.into_iter().enumerate() {
            let mut edited = deployment.clone();
            edit(&mut edited);
            assert_ne!(shape(&edited), at_5, "edit {n}");
        }
    }

    #[test]
    fn a_myapp_is_settled_only_at_the_three_versions_it_was_found_settled_at() {
        let verified = Verified::default();
        let key = ObjectRef::new("web").within("shop");
        assert!(
            !verified.settled(&key, seen(10, 20, 30)),
            "nothing noted yet"
        );
        verified.settle(&key, seen(10, 20, 30));
        assert!(verified.settled(&key, seen(10, 20, 30)));
        assert!(verified.holds(&key, seen(10, 20, 30), Child::Deployment));
        assert!(verified.holds(&key, seen(10, 20, 30), Child::Service));
        for other in [seen(11, 20, 30), seen(10, 21, 30), seen(10, 20, 31)] {
            assert!(!verified.settled(&key, other), "{other:?}");
        }
        let no_service = Versions {
            service: None,
            ..seen(10, 20, 30)
        };
        assert!(!verified.settled(&key, no_service), "a child went");
        let status_only = Versions {
            deployment: Some(21),
            ..seen(10, 20, 30)
        };
        assert!(
            !verified.settled(&key, status_only),
            "a child's new version unsettles the MyApp, even in the same shape"
        );
        assert!(verified.holds(&key, status_only, Child::Deployment));

        verified.note(&key, seen(10, 22, 30), Child::Deployment);
        assert!(
            !verified.settled(&key, seen(10, 20, 30)),
            "a child found holding at another version unsettles the MyApp"
        );
        assert!(!verified.settled(&key, seen(10, 22, 30)));
        assert!(verified.holds(&key, seen(10, 22, 30), Child::Service));

        verified.settle(&key, no_service);
        assert!(
            !verified.settled(&key, no_service),
            "never settled without both children"
        );
    }
}
