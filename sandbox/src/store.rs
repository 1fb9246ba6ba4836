//! The object store: one global resourceVersion counter, the objects, and the event log watches
//! replay from.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::defaults::Defaulter;
use crate::registry::{Registry, ResourceType};

/// Deletion with a propagation policy: the garbage collector's finalizers.
mod gc;

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
    /// The object after the change (before removal for DELETED, with the new resourceVersion):
    /// see [`Event::object`].
    held: Mutex<Held>,
    /// For MODIFIED: the labels before the change (so label-selector watches see an object
    /// entering or leaving the selection as ADDED or DELETED).
    pub previous_labels: Option<Value>,
    /// The event's watch line as stored (`{"type", "object"}`, the object exactly as stored),
    /// rendered by the first watch that sends it so and shared with every other: the API
    /// server's watch cache also serializes an event once per encoding. Its JSON is smaller
    /// than the object's [`heap_bytes`] estimate, so the log holds at most about twice its
    /// byte bound.
    pub line: OnceLock<bytes::Bytes>,
}

/// How a logged event holds its object.
#[derive(Debug)]
enum Held {
    /// As a value: shared with the store while it is the current version.
    Object(Arc<Value>),
    /// In the event's line only, once the object is no longer stored and the line is rendered:
    /// a superseded version as a `Value` takes about five times its JSON's bytes, and the log
    /// keeps every version a watch may still replay. What every watch reads of every event is
    /// kept beside it; the rest is parsed from the line when asked for.
    Line {
        name: String,
        uid: String,
        labels: Option<Value>,
    },
}

impl Event {
    /// A logged change of `object`.
    pub fn new(
        rv: u64,
        kind: EventType,
        resource: Resource,
        namespace: String,
        object: Arc<Value>,
        previous_labels: Option<Value>,
    ) -> Self {
        Event {
            rv,
            kind,
            resource,
            namespace,
            held: Mutex::new(Held::Object(object)),
            previous_labels,
            line: OnceLock::new(),
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object after the change: shared while the event holds it, else parsed from the
    /// line (which holds it exactly as stored).
    pub fn object(&self) -> Arc<Value> {
        if let Held::Object(object) = &*self.held() {
            return object.clone();
        }
        let line = self
            .line
            .get()
            .expect("an event holds its object or its line");
        let mut event: Value = serde_json::from_slice(line).expect("a rendered line is JSON");
        Arc::new(event["object"].take())
    }

    /// The object's name and uid.
    pub fn identity(&self) -> (String, String) {
        match &*self.held() {
            Held::Object(object) => {
                let field = |f| meta_str(object, f).unwrap_or("").to_string();
                (field("name"), field("uid"))
            }
            Held::Line { name, uid, .. } => (name.clone(), uid.clone()),
        }
    }

    /// `f` of the object's labels.
    pub fn with_labels<R>(&self, f: impl FnOnce(Option<&Value>) -> R) -> R {
        match &*self.held() {
            Held::Object(object) => f(object.pointer("/metadata/labels")),
            Held::Line { labels, .. } => f(labels.as_ref()),
        }
    }

    /// Drops the object as a value once nothing else holds it (the store has a newer version
    /// or none) and the line holds it.
    pub fn release_if_superseded(&self) {
        if self.line.get().is_none() {
            return;
        }
        let mut held = self.held();
        let Held::Object(object) = &mut *held else {
            return;
        };
        // Every other holder got its share through this lock or from the store; one left
        // means the event's is the last.
        if Arc::strong_count(object) != 1 {
            return;
        }
        let field = |f| meta_str(object, f).unwrap_or("").to_string();
        let line = Held::Line {
            name: field("name"),
            uid: field("uid"),
            labels: object.pointer("/metadata/labels").cloned(),
        };
        let released = std::mem::replace(&mut *held, line);
        drop(held);
        drop(released);
    }
}

/// An object's `metadata.resourceVersion` as stored.
fn version(obj: &Value) -> Option<u64> {
    meta_str(obj, "resourceVersion")?.parse().ok()
}

/// An object: (resource, namespace, name).
pub type ObjectKey = (Resource, String, String);

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

/// The finalizer that keeps an owner until its blocking dependents are gone.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The finalizer that keeps an owner until its dependents no longer name it.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// What a DELETE does to the objects that name the deleted one as owner
/// (`DeleteOptions.propagationPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// The owner goes now; the collector deletes its dependents after (the default).
    Background,
    /// The owner stays, being deleted, until the dependents that block it are gone.
    Foreground,
    /// The owner goes once its dependents no longer name it; they stay.
    Orphan,
}

impl Propagation {
    /// The finalizer the API server adds for this policy, if any.
    fn finalizer(self) -> Option<&'static str> {
        match self {
            Propagation::Background => None,
            Propagation::Foreground => Some(FOREGROUND_FINALIZER),
            Propagation::Orphan => Some(ORPHAN_FINALIZER),
        }
    }
}

/// Marks an object as being deleted, as `markAsDeleting` does: the first time, its generation
/// (if it has one) goes up, so controllers see a change they must act on.
fn mark_deleting(obj: &mut Value) {
    let meta = meta_mut(obj);
    if meta.get("deletionTimestamp").is_none() {
        if let Some(generation) = meta.get("generation").and_then(Value::as_i64)
            && generation > 0
        {
            meta.insert("generation".into(), json!(generation + 1));
        }
        meta.insert("deletionTimestamp".into(), json!(now()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
    }
}

/// How long the event log and Events are kept.
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    /// At most this many events in the watch log.
    pub log_events: usize,
    /// At most about this many bytes of objects ([`heap_bytes`]) in the watch log.
    pub log_bytes: usize,
    /// Events (`v1` and `events.k8s.io/v1`) expire this long after their last write, as
    /// kube-apiserver's `--event-ttl` (1 h by default) makes them.
    pub event_ttl: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            log_events: 100_000,
            log_bytes: 64 << 20,
            event_ttl: Duration::from_secs(3600),
        }
    }
}

/// About how many bytes a JSON value holds on the heap: serde_json's `BTreeMap` nodes (about
/// 84 bytes per entry at a typical fill), 32 bytes per array element, string contents, and
/// 16 bytes of allocator overhead per allocation. Measured against RSS in `benches/churn.sh`.
pub fn heap_bytes(value: &Value) -> usize {
    const ALLOCATION: usize = 16;
    match value {
        Value::String(s) => s.len() + ALLOCATION,
        Value::Array(items) => ALLOCATION + items.iter().map(|v| 32 + heap_bytes(v)).sum::<usize>(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| 84 + k.len() + ALLOCATION + heap_bytes(v))
            .sum(),
        _ => 0,
    }
}

/// Everything behind the store lock.
pub struct State {
    /// The last resourceVersion handed out.
    pub rv: u64,
    objects: Objects,
    log: VecDeque<(Arc<Event>, usize)>,
    log_bytes: usize,
    retention: Retention,
    /// Owner uid -> the objects whose ownerReferences name it: the garbage collector's index.
    dependents: HashMap<String, BTreeSet<ObjectKey>>,
    /// When each Event expires, oldest write first (an entry is stale when the Event was
    /// written again since: `event_deadlines` holds its current deadline).
    event_expiry: VecDeque<(Instant, ObjectKey)>,
    event_deadlines: HashMap<ObjectKey, Instant>,
    /// Owners being deleted in the foreground or orphaning, waiting for a collector pass.
    gc_queue: Vec<ObjectKey>,
    gc_running: bool,
    /// Dependents (with their uid) whose owners include one of a kind not served, and none
    /// that exists: checked again when a CRD registers, as the real collector retries them
    /// until its REST mapper knows the kind.
    unresolved_owners: Vec<(ObjectKey, String)>,
    /// The served resource types.
    pub registry: Registry,
    /// Built-in defaults, with the Service cluster IPs in use.
    pub defaulter: Defaulter,
}

/// The store shared by all requests.
pub struct Store {
    state: Mutex<State>,
    rv_tx: watch::Sender<u64>,
}

impl Store {
    /// An empty store with the built-in types, keeping history as `retention` says.
    pub fn new(retention: Retention) -> Self {
        let (rv_tx, _) = watch::channel(0);
        Store {
            state: Mutex::new(State {
                rv: 0,
                objects: HashMap::new(),
                log: VecDeque::new(),
                log_bytes: 0,
                retention: Retention {
                    log_events: retention.log_events.max(1),
                    ..retention
                },
                dependents: HashMap::new(),
                event_expiry: VecDeque::new(),
                event_deadlines: HashMap::new(),
                gc_queue: Vec::new(),
                gc_running: false,
                unresolved_owners: Vec::new(),
                registry: Registry::builtin(),
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

type Objects = HashMap<Resource, BTreeMap<(String, String), Arc<Value>>>;

fn objects_after<'a>(
    objects: &'a Objects,
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
    objects
        .get(res)
        .into_iter()
        .flat_map(move |map| map.range((start.clone(), Bound::Unbounded)))
        .take_while(move |((n, _), _)| ns.is_none_or(|ns| n == ns))
        .map(|(k, v)| (k, &**v))
}

/// The store's objects frozen at one resourceVersion, as a lagging API server or watch cache
/// still serves them.
pub(crate) struct Snapshot {
    /// The resourceVersion the objects are at.
    pub(crate) rv: u64,
    objects: Objects,
}

impl Snapshot {
    /// One object.
    pub(crate) fn get(&self, res: &Resource, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(res)?
            .get(&(ns.to_string(), name.to_string()))
            .map(|v| &**v)
    }

    /// As [`State::list_after`].
    pub(crate) fn list_after<'a>(
        &'a self,
        res: &Resource,
        ns: Option<&'a str>,
        after: Option<&(String, String)>,
    ) -> impl Iterator<Item = (&'a (String, String), &'a Value)> + 'a {
        objects_after(&self.objects, res, ns, after)
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
        self.get_shared(res, ns, name).map(|v| &**v)
    }

    /// One object as shared: cloning it costs a reference count, not a copy.
    pub fn get_shared(&self, res: &Resource, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(res)?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// Whether the log still holds every event after `rv`; `Expired` if not.
    pub fn replays_from(&self, rv: u64) -> Result<(), Expired> {
        let oldest = self.log.front().map(|(e, _)| e.rv).unwrap_or(self.rv + 1);
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
        objects_after(&self.objects, res, ns, after)
    }

    /// The objects as they are now, at the current resourceVersion: shared, not copied.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            rv: self.rv,
            objects: self.objects.clone(),
        }
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

    /// Stores an object under a new resourceVersion and logs the event; returns the stored object,
    /// shared with the store and the log: a caller that answers with a copy makes it after
    /// releasing the lock, and one that needs none makes none.
    pub fn put(&mut self, rt: &ResourceType, mut obj: Value, kind: EventType) -> Arc<Value> {
        self.expire_events();
        // Both Event APIs store the core form.
        crate::events::convert(&mut obj, crate::events::CORE);
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let ns = meta_str(&obj, "namespace").unwrap_or("").to_string();
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        let key: ObjectKey = (rt.storage(), ns.clone(), name.clone());
        let stored = Arc::new(obj);
        let previous = self
            .objects
            .entry(rt.storage())
            .or_default()
            .insert((ns.clone(), name), stored.clone());
        self.index_owners(&key, previous.as_deref(), Some(&stored));
        if rt.kind == "Event" {
            let deadline = Instant::now() + self.retention.event_ttl;
            self.event_deadlines.insert(key.clone(), deadline);
            self.event_expiry.push_back((deadline, key));
        }
        let previous_version = previous.as_deref().and_then(version);
        let previous_labels = previous.map(|p| {
            p.pointer("/metadata/labels")
                .cloned()
                .unwrap_or(Value::Null)
        });
        let event = Event::new(rv, kind, rt.storage(), ns, stored.clone(), previous_labels);
        self.log_event(event);
        self.release_logged(previous_version);
        stored
    }

    /// Lets the logged event of `version`, an object version the store no longer holds, drop
    /// its object if its line is rendered (a watch that renders it later lets it go then).
    fn release_logged(&self, version: Option<u64>) {
        let Some(rv) = version.filter(|rv| *rv > 0) else {
            return;
        };
        if let Some((event, _)) = self.log.get(self.log_position_after(rv - 1))
            && event.rv == rv
        {
            event.release_if_superseded();
        }
    }

    /// Keeps [`State::dependents`] in step with an object's owner references.
    fn index_owners(&mut self, key: &ObjectKey, before: Option<&Value>, after: Option<&Value>) {
        let owners = |obj: Option<&Value>| -> BTreeSet<String> {
            obj.and_then(|o| o.pointer("/metadata/ownerReferences")?.as_array())
                .into_iter()
                .flatten()
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect()
        };
        let (before, after) = (owners(before), owners(after));
        for uid in before.difference(&after) {
            if let Some(set) = self.dependents.get_mut(uid) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(uid);
                }
            }
        }
        for uid in after.difference(&before) {
            self.dependents
                .entry(uid.clone())
                .or_default()
                .insert(key.clone());
        }
    }

    /// Removes the Events whose time to live has passed, as etcd's leases do (watchers see
    /// them DELETED). Called before every write and by lists of Events.
    pub fn expire_events(&mut self) {
        let now = Instant::now();
        while let Some((deadline, _)) = self.event_expiry.front() {
            if *deadline > now {
                break;
            }
            let Some((deadline, key)) = self.event_expiry.pop_front() else {
                break;
            };
            if self.event_deadlines.get(&key) == Some(&deadline) {
                self.event_deadlines.remove(&key);
                let (res, ns, name) = key;
                self.remove(&res, &ns, &name, false);
            }
        }
    }

    fn log_event(&mut self, event: Event) {
        // What the logged object holds on the heap (it is shared with the store while it is
        // the current version, so this over-counts: the bound errs on the small side).
        let bytes = heap_bytes(&event.object());
        self.log.push_back((Arc::new(event), bytes));
        self.log_bytes += bytes;
        while self.log.len() > self.retention.log_events
            || (self.log_bytes > self.retention.log_bytes && self.log.len() > 1)
        {
            if let Some((_, size)) = self.log.pop_front() {
                self.log_bytes -= size;
            }
        }
    }

    /// Events after `rv`, or `Expired` when the log no longer reaches back that far.
    pub fn events_since(&self, rv: u64) -> Result<Vec<Arc<Event>>, Expired> {
        self.replays_from(rv)?;
        let start = self.log_position_after(rv);
        Ok(self.log.range(start..).map(|(e, _)| e.clone()).collect())
    }

    /// Where the events after `rv` start in the log. Every write logs the resourceVersion it
    /// takes, so the logged versions rise one at a time and the place is found by subtraction,
    /// checked; a binary search (one dereference of a scattered event per step, on every
    /// watch's every wake-up) only if the check fails.
    fn log_position_after(&self, rv: u64) -> usize {
        let len = self.log.len();
        let front = self.log.front().map_or(0, |(e, _)| e.rv);
        let guess =
            usize::try_from(rv.saturating_add(1).saturating_sub(front)).map_or(len, |i| i.min(len));
        let after = |i: usize| i == len || self.log[i].0.rv > rv;
        let not_before = |i: usize| i == 0 || self.log[i - 1].0.rv <= rv;
        if after(guess) && not_before(guess) {
            return guess;
        }
        self.log.partition_point(|(e, _)| e.rv <= rv)
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
            mark_deleting(&mut marked);
            return Some(Arc::unwrap_or_clone(self.put(
                &rt,
                marked,
                EventType::Modified,
            )));
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
        Arc::unwrap_or_clone(self.put(&rt, terminating, EventType::Modified))
    }

    fn namespace_is_empty(&self, name: &str) -> bool {
        self.objects
            .values()
            .all(|map| !map.keys().any(|(ns, _)| ns == name))
    }

    /// Removes an object now, logs DELETED, and collects what depended on it.
    pub fn remove(&mut self, res: &Resource, ns: &str, name: &str, orphan: bool) -> Option<Value> {
        let removed = self
            .objects
            .get_mut(res)?
            .remove(&(ns.to_string(), name.to_string()))?;
        let key: ObjectKey = (res.clone(), ns.to_string(), name.to_string());
        self.index_owners(&key, Some(&removed), None);
        self.event_deadlines.remove(&key);
        let mut obj = Arc::unwrap_or_clone(removed);
        self.release_logged(version(&obj));
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let logged = Arc::new(obj);
        self.log_event(Event::new(
            rv,
            EventType::Deleted,
            res.clone(),
            ns.to_string(),
            logged.clone(),
            None,
        ));
        let obj = Arc::unwrap_or_clone(logged);
        if res.0.is_empty() && res.1 == "services" {
            self.defaulter.release(&obj);
        }

        if res.0 == "apiextensions.k8s.io" && res.1 == "customresourcedefinitions" {
            self.remove_crd_instances(name, &obj);
        }
        if let Some(uid) = meta_str(&obj, "uid").map(String::from) {
            self.collect_dependents(&uid, orphan);
        }
        self.dependent_removed(&obj);
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
    /// names owners and none of them exists any more, it is deleted. When some owner is of a
    /// kind not served (its CRD deleted), the real collector cannot tell and retries until the
    /// kind resolves: the dependent waits for [`State::recheck_unresolved_owners`].
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
        let owners: Vec<Option<bool>> = refs.iter().map(|r| self.owner_exists(r, ns)).collect();
        if owners.is_empty() || owners.contains(&Some(true)) {
            return;
        }
        if owners.contains(&None) {
            let key = (res.clone(), ns.to_owned(), name.to_owned());
            self.unresolved_owners.push((key, uid.to_owned()));
        } else {
            self.delete(res, ns, name, false);
        }
    }

    /// Checks again the dependents whose owner kinds were not served (after a CRD registers).
    pub fn recheck_unresolved_owners(&mut self) {
        for ((res, ns, name), uid) in std::mem::take(&mut self.unresolved_owners) {
            self.collect_if_orphaned(&res, &ns, &name, &uid);
        }
    }

    /// Whether the object an owner reference names exists with that uid; `None` when its
    /// kind is not served, so nobody can tell.
    fn owner_exists(&self, owner: &Value, ns: &str) -> Option<bool> {
        let api_version = owner["apiVersion"].as_str().unwrap_or("");
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let kind = owner["kind"].as_str().unwrap_or("");
        let rt = self
            .registry
            .all()
            .find(|t| t.group == group && t.kind == kind)?;
        let owner_ns = if rt.namespaced { ns } else { "" };
        let name = owner["name"].as_str().unwrap_or("");
        let found = self.get(&rt.storage(), owner_ns, name);
        Some(found.is_some_and(|o| o.pointer("/metadata/uid") == owner.get("uid")))
    }

    /// The garbage collector: objects owned by `uid` lose that owner reference; those left with
    /// no owner are deleted (unless orphaning, which only drops the reference).
    fn collect_dependents(&mut self, uid: &str, orphan: bool) {
        let dependents: Vec<ObjectKey> = self
            .dependents
            .get(uid)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use std::sync::Weak;

    use super::*;

    fn config_map(data: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "labels": labels},
               "data": {"k": data}})
    }

    /// Stores `obj` and returns its logged event and a handle that tells whether its value
    /// still lives.
    fn put(state: &mut State, obj: Value, kind: EventType) -> (Arc<Event>, Weak<Value>) {
        let rt = state.registry.any_version("", "configmaps").unwrap();
        let stored = state.put(&rt, obj, kind);
        let event = state.events_since(state.rv - 1).unwrap().pop().unwrap();
        (event, Arc::downgrade(&stored))
    }

    /// What a watch caches: the event's line as stored.
    fn render(event: &Event) {
        let line = format!(
            r#"{{"type":"{}","object":{}}}"#,
            event.kind.as_str(),
            event.object()
        );
        event.line.set(bytes::Bytes::from(line + "\n")).unwrap();
    }

    #[test]
    fn a_superseded_version_whose_line_is_rendered_is_kept_as_its_line() {
        let store = Store::new(Retention::default());
        let mut state = store.lock();
        let (first, value) = put(
            &mut state,
            config_map("1", json!({"app": "web"})),
            EventType::Added,
        );
        let logged = Value::clone(&first.object());
        render(&first);
        put(&mut state, config_map("2", json!({})), EventType::Modified);
        assert!(value.upgrade().is_none(), "the superseded value is dropped");
        assert_eq!(
            *first.object(),
            logged,
            "the line holds the object as stored"
        );
        assert_eq!(first.identity(), ("c".to_string(), "u1".to_string()));
        assert_eq!(
            first.with_labels(|labels| labels.cloned()),
            Some(json!({"app": "web"}))
        );
    }

    #[test]
    fn a_version_keeps_its_value_while_stored_or_unrendered_and_a_later_render_lets_it_go() {
        let store = Store::new(Retention::default());
        let mut state = store.lock();
        let (first, value) = put(&mut state, config_map("1", json!({})), EventType::Added);
        render(&first);
        first.release_if_superseded();
        assert!(
            value.upgrade().is_some(),
            "the store still holds this version"
        );
        let (second, second_value) =
            put(&mut state, config_map("2", json!({})), EventType::Modified);
        assert!(value.upgrade().is_none());
        put(&mut state, config_map("3", json!({})), EventType::Modified);
        assert!(
            second_value.upgrade().is_some(),
            "no line to keep it in: superseded, the value stays"
        );
        render(&second);
        second.release_if_superseded();
        assert!(second_value.upgrade().is_none());
        assert_eq!(second.object()["data"]["k"], "2");
    }

    #[test]
    fn a_removed_objects_last_stored_version_is_kept_as_its_line() {
        let store = Store::new(Retention::default());
        let mut state = store.lock();
        let (first, value) = put(&mut state, config_map("1", json!({})), EventType::Added);
        render(&first);
        let removed = state.remove(&(String::new(), "configmaps".into()), "ns", "c", false);
        assert!(removed.is_some());
        assert!(value.upgrade().is_none());
        assert_eq!(first.object()["data"]["k"], "1");
    }
}
