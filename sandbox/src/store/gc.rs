//! Deletion with a propagation policy, as kube-apiserver and the garbage collector share it:
//! `Foreground` and `Orphan` put a finalizer on the owner and the collector finishes the job
//! (`apiserver/pkg/registry/generic/registry/store.go` `deletionFinalizersForGarbageCollection`,
//! `pkg/controller/garbagecollector/garbagecollector.go` `processDeletingDependentsItem` and
//! `orphanDependents`).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    EventType, FOREGROUND_FINALIZER, ORPHAN_FINALIZER, ObjectKey, Propagation, Resource, State,
    finalizers, mark_deleting, meta_mut, meta_str,
};

fn blocks_owner(reference: &Value, uid: &str) -> bool {
    reference["uid"] == uid && reference["blockOwnerDeletion"] == true
}

fn owner_references(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

impl State {
    /// The objects whose owner references name `uid`.
    pub fn dependents_of(&self, uid: &str) -> Vec<ObjectKey> {
        self.dependents
            .get(uid)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Deletes as DELETE with `policy` does. With `Foreground` or `Orphan` the object is only
    /// marked (finalizer, deletionTimestamp) and [`State::collect_deleting`] must run after, as
    /// the garbage collector runs after the API server answers.
    pub fn delete_propagating(
        &mut self,
        res: &Resource,
        ns: &str,
        name: &str,
        policy: Propagation,
    ) -> Option<Value> {
        let Some(finalizer) = policy.finalizer() else {
            return self.delete(res, ns, name, false);
        };
        let current = self.get(res, ns, name)?.clone();
        let rt = self.registry.any_version(&res.0, &res.1)?;
        let mut wanted: Vec<String> = finalizers(&current)
            .into_iter()
            .filter(|f| f != FOREGROUND_FINALIZER && f != ORPHAN_FINALIZER)
            .collect();
        wanted.push(finalizer.to_string());
        let mut marked = current.clone();
        meta_mut(&mut marked).insert("finalizers".into(), json!(wanted));
        mark_deleting(&mut marked);
        if marked == current {
            return Some(current);
        }
        Some(Arc::unwrap_or_clone(self.put(
            &rt,
            marked,
            EventType::Modified,
        )))
    }

    /// The garbage collector's pass over an object being deleted with the `orphan` or
    /// `foregroundDeletion` finalizer: orphans or deletes its dependents, then removes the
    /// finalizer once nothing blocks it (and the object, when no finalizer is left).
    pub fn collect_deleting(&mut self, res: &Resource, ns: &str, name: &str) {
        self.gc_queue
            .push((res.clone(), ns.to_string(), name.to_string()));
        if self.gc_running {
            return;
        }
        self.gc_running = true;
        while let Some((res, ns, name)) = self.gc_queue.pop() {
            self.collect_one(&res, &ns, &name);
        }
        self.gc_running = false;
    }

    /// Called when an object is removed: owners waiting in the foreground for it get another
    /// pass.
    pub(super) fn dependent_removed(&mut self, removed: &Value) {
        let ns = meta_str(removed, "namespace").unwrap_or("").to_string();
        let waiting: Vec<ObjectKey> = owner_references(removed)
            .iter()
            .filter_map(|r| self.owner_key(r, &ns))
            .filter(|(res, ns, name)| {
                self.get(res, ns, name)
                    .is_some_and(|o| finalizers(o).iter().any(|f| f == FOREGROUND_FINALIZER))
            })
            .collect();
        for (res, ns, name) in waiting {
            self.collect_deleting(&res, &ns, &name);
        }
    }

    /// Where the object an owner reference names is stored, if its kind is served.
    fn owner_key(&self, owner: &Value, ns: &str) -> Option<ObjectKey> {
        let api_version = owner["apiVersion"].as_str().unwrap_or("");
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let kind = owner["kind"].as_str().unwrap_or("");
        let rt = self
            .registry
            .all()
            .find(|t| t.group == group && t.kind == kind)?;
        let owner_ns = if rt.namespaced { ns } else { "" };
        Some((
            rt.storage(),
            owner_ns.to_string(),
            owner["name"].as_str()?.to_string(),
        ))
    }

    fn collect_one(&mut self, res: &Resource, ns: &str, name: &str) {
        let Some(owner) = self.get(res, ns, name).cloned() else {
            return;
        };
        let Some(uid) = meta_str(&owner, "uid").map(String::from) else {
            return;
        };
        let held = finalizers(&owner);
        let done = if held.iter().any(|f| f == ORPHAN_FINALIZER) {
            self.orphan_dependents(&uid);
            ORPHAN_FINALIZER
        } else if held.iter().any(|f| f == FOREGROUND_FINALIZER) {
            if !self.delete_dependents_first(&uid) {
                return;
            }
            FOREGROUND_FINALIZER
        } else {
            return;
        };
        // The dependents' deletion may have finished the owner already (a nested pass).
        let Some(owner) = self.get(res, ns, name).cloned() else {
            return;
        };
        let Some(rt) = self.registry.any_version(&res.0, &res.1) else {
            return;
        };
        let remaining: Vec<String> = finalizers(&owner)
            .into_iter()
            .filter(|f| f != done)
            .collect();
        let mut updated = owner;
        meta_mut(&mut updated).insert("finalizers".into(), json!(remaining));
        if remaining.is_empty() {
            meta_mut(&mut updated).remove("finalizers");
        }
        let stored = self.put(&rt, updated, EventType::Modified);
        if remaining.is_empty() && meta_str(&stored, "deletionTimestamp").is_some() {
            self.remove(res, ns, name, false);
        }
    }

    /// Drops the owner reference to `uid` from every dependent.
    fn orphan_dependents(&mut self, uid: &str) {
        for (res, ns, name) in self.dependents_of(uid) {
            self.drop_owner_reference(&res, &ns, &name, uid);
        }
    }

    fn drop_owner_reference(&mut self, res: &Resource, ns: &str, name: &str, uid: &str) {
        let Some(obj) = self.get(res, ns, name).cloned() else {
            return;
        };
        let Some(rt) = self.registry.any_version(&res.0, &res.1) else {
            return;
        };
        let remaining: Vec<Value> = owner_references(&obj)
            .into_iter()
            .filter(|r| r["uid"] != uid)
            .collect();
        let mut updated = obj;
        let meta = meta_mut(&mut updated);
        if remaining.is_empty() {
            meta.remove("ownerReferences");
        } else {
            meta.insert("ownerReferences".into(), Value::Array(remaining));
        }
        self.put(&rt, updated, EventType::Modified);
    }

    /// Deletes the dependents of an owner deleted in the foreground: those with another owner
    /// that still exists only lose the reference; those with dependents of their own that block
    /// are deleted in the foreground too. Returns whether no dependent blocks the owner any more.
    fn delete_dependents_first(&mut self, uid: &str) -> bool {
        for (res, ns, name) in self.dependents_of(uid) {
            let Some(obj) = self.get(&res, &ns, &name).cloned() else {
                continue;
            };
            if meta_str(&obj, "deletionTimestamp").is_some() {
                continue;
            }
            let refs = owner_references(&obj);
            let other_owner_lives = refs
                .iter()
                .filter(|r| r["uid"] != uid)
                .any(|r| self.owner_exists(r, &ns) != Some(false));
            if other_owner_lives {
                self.drop_owner_reference(&res, &ns, &name, uid);
                continue;
            }
            let dep_uid = meta_str(&obj, "uid").unwrap_or("").to_string();
            let has_blocking = self.dependents_of(&dep_uid).iter().any(|(r, n, m)| {
                self.get(r, n, m).is_some_and(|d| {
                    owner_references(d)
                        .iter()
                        .any(|x| blocks_owner(x, &dep_uid))
                })
            });
            if has_blocking {
                self.delete_propagating(&res, &ns, &name, Propagation::Foreground);
                self.gc_queue.push((res, ns, name));
            } else {
                self.delete(&res, &ns, &name, false);
            }
        }
        !self.dependents_of(uid).iter().any(|(res, ns, name)| {
            self.get(res, ns, name)
                .is_some_and(|d| owner_references(d).iter().any(|r| blocks_owner(r, uid)))
        })
    }
}
