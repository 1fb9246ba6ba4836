//! The object store: one global resourceVersion counter, the objects, and the event log watches
//! replay from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::defaults::Defaulter;
use crate::registry::{Registry, ResourceType};

/// Where objects of one resource live: (group, plural).
pub type Resource = (String, String);

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed (including getting a deletionTimestamp).
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One logged change.
#[derive(Debug)]
pub struct Event {
    /// resourceVersion of the change.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// Resource of the object.
    pub resource: Resource,
    /// Namespace of the object ("" when cluster-scoped).
    pub namespace: String,
    /// The object after the change (before removal for DELETED, with the new resourceVersion).
    pub object: Value,
    /// For MODIFIED: the labels before the change (so label-selector watches see an object
    /// entering or leaving the selection as ADDED or DELETED).
    pub previous_labels: Option<Value>,
}

/// An object: (resource, namespace, name).
pub type ObjectKey = (Resource, String, String);
/// Server-side apply: the last configuration per (subresource, manager) of one object.
pub type AppliedConfigs = BTreeMap<(String, String), Value>;

/// The current time as the API server writes timestamps.
pub fn now() -> String {
    let ts = jiff::Timestamp::now();
    jiff::Timestamp::from_second(ts.as_second())
        .map(|t| t.to_string())
        .unwrap_or_else(|_| ts.to_string())
}

/// A string field of `metadata`.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// Mutable `metadata`, created (and the value made an object) if missing.
pub fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    let root = ensure_object(obj);
    ensure_object(root.entry("metadata").or_insert_with(|| json!({})))
}

/// The value as a mutable map, replacing it with an empty object if it is not one.
pub fn ensure_object(v: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(serde_json::Map::new());
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("the value was just made an object"),
    }
}

/// The finalizers of an object.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Everything behind the store lock.
pub struct State {
    /// The last resourceVersion handed out.
    pub rv: u64,
    objects: HashMap<Resource, BTreeMap<(String, String), Value>>,
    log: VecDeque<Arc<Event>>,
    log_capacity: usize,
    /// The served resource types.
    pub registry: Registry,
    /// Server-side apply: the last configurations per object, so an apply reads only its
    /// own object's (a scan of every object's would make each apply O(objects)).
    pub applied: HashMap<ObjectKey, AppliedConfigs>,
    /// Built-in defaults, with the Service cluster IPs in use.
    pub defaulter: Defaulter,
}

/// The store shared by all requests.
pub struct Store {
    state: Mutex<State>,
    rv_tx: watch::Sender<u64>,
}

impl Store {
    /// An empty store with the built-in types and the given event log length.
    pub fn new(log_capacity: usize) -> Self {
        let (rv_tx, _) = watch::channel(0);
        Store {
            state: Mutex::new(State {
                rv: 0,
                objects: HashMap::new(),
                log: VecDeque::new(),
                log_capacity: log_capacity.max(1),
                registry: Registry::builtin(),
                applied: HashMap::new(),
                defaulter: Defaulter::new(),
            }),
            rv_tx,
        }
    }

    /// Locks the state. A poisoned lock is recovered: every write completes its map updates
    /// before anything that could panic, so the data stays consistent.
    pub fn lock(&self) -> StoreGuard<'_> {
        let guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        StoreGuard {
            guard,
            rv_tx: &self.rv_tx,
        }
    }

    /// A receiver told about every new resourceVersion.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.rv_tx.subscribe()
    }
}

/// The locked state; announces the new resourceVersion to watchers when dropped.
pub struct StoreGuard<'a> {
    guard: MutexGuard<'a, State>,
    rv_tx: &'a watch::Sender<u64>,
}

impl std::ops::Deref for StoreGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for StoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for StoreGuard<'_> {
    fn drop(&mut self) {
        let rv = self.guard.rv;
        self.rv_tx.send_if_modified(|current| {
            if *current != rv {
                *current = rv;
                true
            } else {
                false
            }
        });
    }
}

/// A watch asked for events older than the log keeps.
#[derive(Debug)]
pub struct Expired {
    /// The oldest version the log can still replay from.
    pub oldest: u64,
}

impl State {
    /// One object.
    pub fn get(&self, res: &Resource, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(res)?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// Whether the log still holds every event after `rv`; `Expired` if not.
    pub fn replays_from(&self, rv: u64) -> Result<(), Expired> {
        let oldest = self.log.front().map(|e| e.rv).unwrap_or(self.rv + 1);
        // The log is complete from `oldest`; anything older than oldest-1 was dropped.
        if rv + 1 < oldest && rv < self.rv {
            return Err(Expired { oldest });
        }
        Ok(())
    }

    /// Objects of a resource, optionally in one namespace, in (namespace, name) order, starting
    /// after the key `after` (a list page's continuation) or from the first.
    pub fn list_after<'a>(
        &'a self,
        res: &Resource,
        ns: Option<&'a str>,
        after: Option<&(String, String)>,
    ) -> impl Iterator<Item = (&'a (String, String), &'a Value)> + 'a {
        use std::ops::Bound;
        let start = match (after, ns) {
            (Some(key), _) => Bound::Excluded(key.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        self.objects
            .get(res)
            .into_iter()
            .flat_map(move |map| map.range((start.clone(), Bound::Unbounded)))
            .take_while(move |((n, _), _)| ns.is_none_or(|ns| n == ns))
    }

    /// Objects of a resource, optionally in one namespace, in (namespace, name) order.
    pub fn list<'a>(&'a self, res: &Resource, ns: Option<&'a str>) -> Vec<&'a Value> {
        self.list_after(res, ns, None).map(|(_, v)| v).collect()
    }

    /// Number of stored objects.
    pub fn len(&self) -> usize {
        self.objects.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores an object under a new resourceVersion and logs the event; returns the stored object.
    pub fn put(&mut self, rt: &ResourceType, mut obj: Value, kind: EventType) -> Value {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let ns = meta_str(&obj, "namespace").unwrap_or("").to_string();
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        let previous = self
            .objects
            .entry(rt.storage())
            .or_default()
            .insert((ns.clone(), name), obj.clone());
        let previous_labels = previous.map(|p| {
            p.pointer("/metadata/labels")
                .cloned()
                .unwrap_or(Value::Null)
        });
        self.log_event(rv, kind, rt.storage(), ns, obj.clone(), previous_labels);
        obj
    }

    fn log_event(
        &mut self,
        rv: u64,
        kind: EventType,
        resource: Resource,
        namespace: String,
        object: Value,
        previous_labels: Option<Value>,
    ) {
        self.log.push_back(Arc::new(Event {
            rv,
            kind,
            resource,
            namespace,
            object,
            previous_labels,
        }));
        while self.log.len() > self.log_capacity {
            self.log.pop_front();
        }
    }

    /// Events after `rv`, or `Expired` when the log no longer reaches back that far.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Arc<Event>>, Expired> {
        self.replays_from(rv)?;
        let start = self.log.partition_point(|e| e.rv <= rv);
        Ok(self.log.range(start..).cloned().collect())
    }

    /// Deletes an object the way DELETE does: with finalizers it only gets a deletionTimestamp;
    /// otherwise it goes, and its dependents are collected. Returns the object as last seen.
    pub fn delete(&mut self, res: &Resource, ns: &str, name: &str, orphan: bool) -> Option<Value> {
        let current = self.get(res, ns, name)?.clone();
        let rt = self.registry.any_version(&res.0, &res.1)?;
        if !finalizers(&current).is_empty() {
            if meta_str(&current, "deletionTimestamp").is_some() {
                return Some(current);
            }
            let mut marked = current;
            let meta = meta_mut(&mut marked);
            meta.insert("deletionTimestamp".into(), json!(now()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            return Some(self.put(&rt, marked, EventType::Modified));
        }
        if rt.kind == "Namespace" && rt.group.is_empty() {
            return Some(self.delete_namespace(name, current));
        }
        self.remove(res, ns, name, orphan)
    }

    fn delete_namespace(&mut self, name: &str, current: Value) -> Value {
        let contents: Vec<(Resource, String)> = self
            .objects
            .iter()
            .flat_map(|(res, map)| {
                map.keys()
                    .filter(|(ns, _)| ns == name)
                    .map(|(_, n)| (res.clone(), n.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (res, obj_name) in contents {
            self.delete(&res, name, &obj_name, false);
        }
        if self.namespace_is_empty(name) {
            let res = (String::new(), "namespaces".to_string());
            return self.remove(&res, "", name, false).unwrap_or(current);
        }
        let Some(rt) = self.registry.get("", "v1", "namespaces") else {
            return current;
        };
        let mut terminating = current;
        meta_mut(&mut terminating).insert("deletionTimestamp".into(), json!(now()));
        terminating["status"] = json!({"phase": "Terminating"});
        self.put(&rt, terminating, EventType::Modified)
    }

    fn namespace_is_empty(&self, name: &str) -> bool {
        self.objects
            .values()
            .all(|map| !map.keys().any(|(ns, _)| ns == name))
    }

    /// Removes an object now, logs DELETED, and collects what depended on it.
    pub fn remove(&mut self, res: &Resource, ns: &str, name: &str, orphan: bool) -> Option<Value> {
        let mut obj = self
            .objects
            .get_mut(res)?
            .remove(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        self.log_event(
            rv,
            EventType::Deleted,
            res.clone(),
            ns.to_string(),
            obj.clone(),
            None,
        );
        self.applied
            .remove(&(res.clone(), ns.to_string(), name.to_string()));
        if res.0.is_empty() && res.1 == "services" {
            self.defaulter.release(&obj);
        }

        if res.0 == "apiextensions.k8s.io" && res.1 == "customresourcedefinitions" {
            self.remove_crd_instances(name, &obj);
        }
        if let Some(uid) = meta_str(&obj, "uid").map(String::from) {
            self.collect_dependents(&uid, orphan);
        }
        if !ns.is_empty() {
            self.finish_terminating_namespace(ns);
        }
        Some(obj)
    }

    fn remove_crd_instances(&mut self, crd_name: &str, crd: &Value) {
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        let res = (group.to_string(), plural.to_string());
        let keys: Vec<(String, String)> = self
            .objects
            .get(&res)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for (ns, name) in keys {
            self.remove(&res, &ns, &name, false);
        }
        self.registry.unregister_crd(crd_name);
    }

    fn finish_terminating_namespace(&mut self, ns: &str) {
        let res = (String::new(), "namespaces".to_string());
        let terminating = self.get(&res, "", ns).is_some_and(|n| {
            meta_str(n, "deletionTimestamp").is_some() && finalizers(n).is_empty()
        });
        if terminating && self.namespace_is_empty(ns) {
            self.remove(&res, "", ns, false);
        }
    }

    /// The garbage collector's check of a written dependent: if the object (still that `uid`)
    /// names owners and none of them exists any more, it is deleted.
    pub fn collect_if_orphaned(&mut self, res: &Resource, ns: &str, name: &str, uid: &str) {
        let Some(obj) = self.get(res, ns, name) else {
            return;
        };
        if meta_str(obj, "uid") != Some(uid) {
            return;
        }
        let refs = obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if !refs.is_empty() && !refs.iter().any(|r| self.owner_exists(r, ns)) {
            self.delete(res, ns, name, false);
        }
    }

    /// Whether the object an owner reference names exists with that uid. An owner whose kind
    /// is not served counts as existing: the real collector leaves such dependents alone too.
    fn owner_exists(&self, owner: &Value, ns: &str) -> bool {
        let api_version = owner["apiVersion"].as_str().unwrap_or("");
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let kind = owner["kind"].as_str().unwrap_or("");
        let Some(rt) = self
            .registry
            .all()
            .find(|t| t.group == group && t.kind == kind)
        else {
            return true;
        };
        let owner_ns = if rt.namespaced { ns } else { "" };
        let name = owner["name"].as_str().unwrap_or("");
        self.get(&rt.storage(), owner_ns, name)
            .is_some_and(|o| o.pointer("/metadata/uid") == owner.get("uid"))
    }

    /// The garbage collector: objects owned by `uid` lose that owner reference; those left with
    /// no owner are deleted (unless orphaning, which only drops the reference).
    fn collect_dependents(&mut self, uid: &str, orphan: bool) {
        let mut dependents = Vec::new();
        for (res, map) in &self.objects {
            for ((ns, name), obj) in map {
                let owned = obj
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid));
                if owned {
                    dependents.push((res.clone(), ns.clone(), name.clone()));
                }
            }
        }
        for (res, ns, name) in dependents {
            let Some(obj) = self.get(&res, &ns, &name).cloned() else {
                continue;
            };
            let Some(rt) = self.registry.any_version(&res.0, &res.1) else {
                continue;
            };
            let refs = obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let remaining: Vec<Value> = refs.into_iter().filter(|r| r["uid"] != uid).collect();
            if remaining.is_empty() && !orphan {
                self.delete(&res, &ns, &name, false);
            } else {
                let mut updated = obj;
                let meta = meta_mut(&mut updated);
                if remaining.is_empty() {
                    meta.remove("ownerReferences");
                } else {
                    meta.insert("ownerReferences".into(), Value::Array(remaining));
                }
                self.put(&rt, updated, EventType::Modified);
            }
        }
    }
}
