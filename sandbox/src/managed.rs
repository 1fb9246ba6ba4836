//! `metadata.managedFields`: which field manager owns which fields, kept on every write as
//! kube-apiserver's field manager keeps them (one entry per manager, operation and subresource),
//! and the conflicts of a server-side apply.

use serde_json::{Map, Value, json};

use crate::fields::{self, FieldSet, Path, Shape};
use crate::registry::ResourceType;
use crate::status::ApiError;
use crate::store::now;

/// The two operations a managedFields entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Server-side apply: the manager owns exactly what it applied.
    Apply,
    /// Any other write: the manager owns what it changed.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The field manager's name.
    pub manager: String,
    /// Apply or Update.
    pub operation: Operation,
    /// The API version the write used.
    pub api_version: String,
    /// When the entry last changed (RFC 3339, seconds).
    pub time: String,
    /// `""`, `status` or `scale`.
    pub subresource: String,
    /// The fields it owns.
    pub fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: Operation, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    /// The manager as kube-apiserver's conflict messages print it (`printManager` in
    /// `managedfields/internal/conflict.go`): Update managers with their API version, and the
    /// subresource when there is one. The time is not printed: it is not part of the manager's
    /// identity there.
    pub fn printed(&self) -> String {
        let mut out = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            out.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == Operation::Update {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }
}

/// The entries of an object's `metadata.managedFields` (entries that do not decode are
/// dropped).
pub fn decode(obj: &Value) -> Vec<Entry> {
    let Some(entries) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| {
            let operation = match e.get("operation").and_then(Value::as_str)? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            Some(Entry {
                manager: text("manager"),
                operation,
                api_version: text("apiVersion"),
                time: text("time"),
                subresource: text("subresource"),
                fields: FieldSet::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
            })
        })
        .collect()
}

/// Writes `entries` into `obj` in kube-apiserver's order (Apply before Update, then by time,
/// manager, API version, subresource); none at all removes the field.
fn encode(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.fields.is_empty());
    entries.sort_by(|a, b| {
        (
            a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if entries.is_empty() {
        meta.remove("managedFields");
        return;
    }
    // Built member by member: `json!` would serialize the `fieldsV1` tree into a second copy.
    let text = |s: &str| Value::String(s.to_owned());
    let list: Vec<Value> = entries
        .into_iter()
        .map(|e| {
            let mut v = Map::new();
            // `manager` and `subresource` are omitempty strings of `ManagedFieldsEntry`.
            if !e.manager.is_empty() {
                v.insert("manager".into(), Value::String(e.manager));
            }
            v.insert("operation".into(), text(e.operation.as_str()));
            v.insert("apiVersion".into(), Value::String(e.api_version));
            v.insert("time".into(), Value::String(e.time));
            v.insert("fieldsType".into(), text("FieldsV1"));
            v.insert("fieldsV1".into(), e.fields.to_fields_v1());
            if !e.subresource.is_empty() {
                v.insert("subresource".into(), Value::String(e.subresource));
            }
            Value::Object(v)
        })
        .collect();
    meta.insert("managedFields".into(), Value::Array(list));
}

/// The `metadata` fields no manager owns: identity and what the server sets.
const SERVER_SET_METADATA: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Who writes and through which endpoint.
pub struct Writer<'a> {
    /// The resource type written.
    pub rt: &'a ResourceType,
    /// `""`, `status` or `scale`.
    pub subresource: &'a str,
    /// The field manager (`fieldManager`, else the user agent's product).
    pub manager: &'a str,
}

impl Writer<'_> {
    fn shape(&self) -> Shape<'_> {
        Shape::Root(self.rt.schema.as_ref().map(|s| s.raw()))
    }

    /// The part of `obj` this endpoint writes, without the fields no manager owns (identity
    /// and server-set metadata, as `stripmeta.go` strips them): `status` alone through
    /// `/status`; everything but `status` elsewhere when the kind has a status subresource.
    /// Built from the parts kept: copying the whole object first copied its managedFields,
    /// the largest part of most objects, on every write only to drop them.
    fn scoped(&self, obj: &Value) -> Value {
        let Some(map) = obj.as_object() else {
            return obj.clone();
        };
        let status_only = self.subresource == "status";
        let mut out = Map::new();
        for (key, value) in map {
            let kept = match key.as_str() {
                "apiVersion" | "kind" => false,
                "status" => status_only || !self.rt.status_subresource,
                _ => !status_only,
            };
            if !kept {
                continue;
            }
            if key == "metadata"
                && let Some(meta) = value.as_object()
            {
                let meta: Map<String, Value> = meta
                    .iter()
                    .filter(|(field, _)| !SERVER_SET_METADATA.contains(&field.as_str()))
                    .map(|(field, v)| (field.clone(), v.clone()))
                    .collect();
                if !meta.is_empty() {
                    out.insert(key.clone(), Value::Object(meta));
                }
                continue;
            }
            out.insert(key.clone(), value.clone());
        }
        Value::Object(out)
    }

    /// A built-in kind's `metadata`, `spec` and `status` are Go structs that are never absent
    /// in the objects kube-apiserver compares, so a write never "creates" them (no `.`
    /// member); a custom resource's are plain maps that can be.
    fn go_structs(&self, mut before: Value, after: &Value) -> Value {
        if self.rt.crd.is_some() {
            return before;
        }
        if let (Some(b), Some(a)) = (before.as_object_mut(), after.as_object()) {
            for key in ["metadata", "spec", "status"] {
                if a.contains_key(key) && !b.contains_key(key) {
                    b.insert(key.into(), json!({}));
                }
            }
        }
        before
    }

    fn new_entry(&self, operation: Operation, fields: FieldSet) -> Entry {
        Entry {
            manager: self.manager.to_string(),
            operation,
            api_version: self.rt.api_version(),
            time: now(),
            subresource: self.subresource.to_string(),
            fields,
        }
    }

    /// The managedFields of an object being created: the creator owns everything it set
    /// (an applier exactly its configuration).
    pub fn created(&self, obj: &mut Value, applied: Option<&Value>) {
        let entry = match applied {
            Some(config) => {
                let fields = fields::object_set(&self.scoped(config), self.shape());
                self.new_entry(Operation::Apply, fields)
            }
            None => {
                let after = self.scoped(obj);
                let before = self.go_structs(json!({}), &after);
                let fields = fields::changed(Some(&before), &after, self.shape(), "");
                self.new_entry(Operation::Update, fields)
            }
        };
        encode(obj, vec![entry]);
    }

    /// The managedFields after an update (PUT, a non-apply patch, `/status`, `/scale`) from
    /// `old` to `new`: the manager's Update entry gains what the write changed (taking it from
    /// every other manager) and loses what it removed. A client that sends managedFields
    /// other than the stored ones replaces them; `[{}]` clears them.
    pub fn updated(&self, old: &Value, new: &mut Value) {
        let sent = new.pointer("/metadata/managedFields").cloned();
        let stored = old.pointer("/metadata/managedFields").cloned();
        let mut entries = match &sent {
            Some(list) if Some(list) != stored.as_ref() => {
                let entries = decode(new);
                if entries.is_empty() {
                    if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.remove("managedFields");
                    }
                    return;
                }
                entries
            }
            _ => decode(old),
        };
        let after = self.scoped(new);
        let before = self.go_structs(self.scoped(old), &after);
        let set = fields::changed(Some(&before), &after, self.shape(), "");
        let gone = fields::removed(&before, Some(&after), self.shape(), "");
        if set.is_empty() && gone.is_empty() && sent.is_none_or(|s| Some(&s) == stored.as_ref()) {
            restore(new, stored);
            return;
        }
        for e in entries.iter_mut() {
            e.fields = e.fields.difference(&set);
        }
        let mine = match entries
            .iter()
            .position(|e| e.is(self.manager, Operation::Update, self.subresource))
        {
            Some(at) => entries.remove(at).fields,
            None => FieldSet::default(),
        };
        entries.push(self.new_entry(Operation::Update, mine.union(&set).difference(&gone)));
        encode(new, entries);
    }

    /// Server-side apply of `config` to `live`: the merged object with its managedFields, or
    /// the conflicts (without `force`) with fields other managers own and the apply changes.
    /// Fields the manager applied before and no longer does are removed unless another
    /// manager owns them.
    pub fn apply(
        &self,
        live: &Value,
        config: &Value,
        force: bool,
    ) -> Result<Value, Vec<(Entry, Path)>> {
        let shape = self.shape();
        let mut entries = decode(live);
        let mut scoped_config = self.scoped(config);
        let applied = fields::object_set(&scoped_config, shape);
        // What the merge may write: the scoped configuration plus the identity it names.
        if let Some(rv) = config.pointer("/metadata/resourceVersion") {
            scoped_config["metadata"]["resourceVersion"] = rv.clone();
        }
        // Merged into a copy of the live object less its managedFields: `encode` below
        // replaces them, so copying them (the largest part of most objects) would be waste.
        let mut merged = copy_without(live, &[], true);
        fields::merge_into(&mut merged, &scoped_config, shape, "");
        let set = fields::changed(Some(&self.scoped(live)), &self.scoped(&merged), shape, "");
        let mut conflicts = Vec::new();
        let mut conflicting = FieldSet::default();
        for e in entries.iter_mut() {
            if e.is(self.manager, Operation::Apply, self.subresource) {
                continue;
            }
            let theirs = e.fields.intersection(&set);
            if theirs.is_empty() {
                continue;
            }
            for path in theirs.members() {
                conflicts.push((e.clone(), path));
            }
            conflicting = conflicting.union(&theirs);
            e.fields = e.fields.difference(&theirs);
        }
        if !conflicts.is_empty() && !force && !self.takes_over_client_side_apply(live, &conflicting)
        {
            conflicts.sort_by(|(a, p), (b, q)| {
                (&a.manager, a.operation, &a.api_version, &a.subresource, p).cmp(&(
                    &b.manager,
                    b.operation,
                    &b.api_version,
                    &b.subresource,
                    q,
                ))
            });
            return Err(conflicts);
        }
        let previous = match entries
            .iter()
            .position(|e| e.is(self.manager, Operation::Apply, self.subresource))
        {
            Some(at) => entries.remove(at).fields,
            None => FieldSet::default(),
        };
        let others = entries
            .iter()
            .fold(FieldSet::default(), |all, e| all.union(&e.fields));
        let mut prune = previous.difference(&applied).difference(&others).members();
        // Shallowest first: a list element or map goes whole unless someone, the applier
        // included, still owns fields in it (a `.` it no longer claims, as when kubectl's
        // migration wrote one); then only its own leaves go, never the key fields that name it.
        let kept = others.union(&applied);
        prune.sort_by_key(Vec::len);
        for path in prune {
            if !kept.has_member_below(&path) && !fields::is_key_field(&path) {
                fields::remove_path(&mut merged, &path);
            }
        }
        entries.push(self.new_entry(Operation::Apply, applied));
        encode(&mut merged, entries);
        if live.pointer("/metadata/managedFields") == merged.pointer("/metadata/managedFields")
            || same_but_times(live, &merged)
        {
            let stored = live.pointer("/metadata/managedFields").cloned();
            restore(&mut merged, stored);
        }
        Ok(merged)
    }

    /// Whether kubectl's server-side apply may take `conflicting` because its client-side apply
    /// set them: kube-apiserver forces an apply by the manager `kubectl` whose conflicts all
    /// lie among the fields of the object's last-applied-configuration annotation that still
    /// hold the value it gives them (`lastAppliedManager` in apimachinery's
    /// `pkg/util/managedfields/internal/lastappliedmanager.go`: the annotation's fields less
    /// those the live object modified or removed). So `kubectl apply --server-side` over what
    /// `kubectl apply` made takes what it set, but not an atomic list the server's defaults
    /// changed (a rule's `scope`), which conflicts as on a cluster.
    fn takes_over_client_side_apply(&self, live: &Value, conflicting: &FieldSet) -> bool {
        if self.manager != "kubectl" {
            return false;
        }
        let Some(last_applied) = live
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(LAST_APPLIED))
            .and_then(Value::as_str)
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
        else {
            return false;
        };
        let shape = self.shape();
        let allowed = fields::object_set(&last_applied, shape)
            .difference(&fields::changed(Some(&last_applied), live, shape, ""))
            .difference(&fields::removed(&last_applied, Some(live), shape, ""));
        conflicting.difference(&allowed).is_empty()
    }
}

/// A copy of `obj` without its members `skip` and, if `managed_fields`, without
/// `metadata.managedFields`: for a write that replaces those, so they are not copied only to
/// be overwritten. A value that is not an object is copied whole.
pub fn copy_without(obj: &Value, skip: &[&str], managed_fields: bool) -> Value {
    let Some(map) = obj.as_object() else {
        return obj.clone();
    };
    let copy = map
        .iter()
        .filter(|(key, _)| !skip.contains(&key.as_str()))
        .map(|(key, value)| {
            let value = match (key.as_str(), value) {
                ("metadata", Value::Object(meta)) if managed_fields => Value::Object(
                    meta.iter()
                        .filter(|(field, _)| field.as_str() != "managedFields")
                        .map(|(field, v)| (field.clone(), v.clone()))
                        .collect(),
                ),
                _ => value.clone(),
            };
            (key.clone(), value)
        })
        .collect();
    Value::Object(copy)
}

/// The annotation kubectl's client-side apply keeps its configuration in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Whether two versions of an object differ at most in their managedFields' times: a no-op
/// write keeps the stored times (`IgnoreManagedFieldsTimestampsTransformer`). Compared in
/// place, as every apply and update asks it of two whole objects.
pub fn same_but_times(old: &Value, new: &Value) -> bool {
    equal_except(old, new, "metadata", |old, new| {
        equal_except(old, new, "managedFields", |old, new| match (old, new) {
            (Value::Array(old), Value::Array(new)) => {
                old.len() == new.len()
                    && old
                        .iter()
                        .zip(new)
                        .all(|(o, n)| match (o.as_object(), n.as_object()) {
                            (Some(o), Some(n)) => equal_without(o, n, "time"),
                            _ => o == n,
                        })
            }
            _ => old == new,
        })
    })
}

/// Whether `a` and `b` are equal, the member `key` of two objects compared by `same` (which
/// is not asked when neither has it). Values that are not both objects compare whole.
fn equal_except(a: &Value, b: &Value, key: &str, same: impl Fn(&Value, &Value) -> bool) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    a.len() == b.len()
        && a.iter().all(|(k, v)| match b.get(k) {
            Some(w) if k == key => same(v, w),
            Some(w) => v == w,
            None => false,
        })
}

/// Whether two maps are equal but for their member `key`, present in either or not.
fn equal_without(a: &Map<String, Value>, b: &Map<String, Value>, key: &str) -> bool {
    let other = |(k, _): &(&String, &Value)| k.as_str() != key;
    a.iter().filter(other).count() == b.iter().filter(other).count()
        && a.iter().filter(other).all(|(k, v)| b.get(k) == Some(v))
}

fn restore(obj: &mut Value, managed: Option<Value>) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match managed {
        Some(m) => meta.insert("managedFields".into(), m),
        None => meta.remove("managedFields"),
    };
}

/// The 409 of an apply that conflicts, in kube-apiserver's words (`NewConflictError` in
/// `managedfields/internal/conflict.go`): one conflict on one line, several grouped by
/// manager; a `FieldManagerConflict` cause per field.
pub fn conflict_error(conflicts: &[(Entry, Path)]) -> ApiError {
    let message = if let [(entry, path)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            entry.printed(),
            fields::path_string(path)
        )
    } else {
        let mut lines: Vec<String> = Vec::new();
        let mut last: Option<String> = None;
        for (entry, path) in conflicts {
            let printed = entry.printed();
            if last.as_ref() != Some(&printed) {
                lines.push(format!("conflicts with {printed}:"));
                last = Some(printed);
            }
            lines.push(format!("- {}", fields::path_string(path)));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut err = ApiError::new(409, "Conflict", message);
    err.details = Some(Box::new(json!({
        "causes": conflicts.iter().map(|(entry, path)| json!({
            "reason": "FieldManagerConflict",
            "message": format!("conflict with {}", entry.printed()),
            "field": fields::path_string(path),
        })).collect::<Vec<_>>(),
    })));
    err
}

/// The field manager of a request without `fieldManager`: the user agent up to its first `/`
/// (`prefixFromUserAgent` in `endpoints/handlers/rest.go`).
pub fn manager_from_user_agent(user_agent: &str) -> String {
    user_agent.split('/').next().unwrap_or("").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    fn deployments() -> std::sync::Arc<ResourceType> {
        Registry::builtin()
            .get("apps", "v1", "deployments")
            .unwrap()
    }

    #[test]
    fn a_scale_update_then_an_apply_of_other_replicas_conflicts_unless_forced() {
        let rt = deployments();
        let mut live = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 1}});
        let applier = Writer {
            rt: &rt,
            subresource: "",
            manager: "ops",
        };
        live = applier.apply(&live, &live.clone(), false).unwrap();
        let scaler = Writer {
            rt: &rt,
            subresource: "scale",
            manager: "kubectl-scale",
        };
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        scaler.updated(&live, &mut scaled);
        let config = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 2}});
        let conflicts = applier.apply(&scaled, &config, false).unwrap_err();
        assert_eq!(
            conflict_error(&conflicts).message,
            "Apply failed with 1 conflict: conflict with \"kubectl-scale\" with subresource \"scale\" using apps/v1: .spec.replicas"
        );
        let forced = applier.apply(&scaled, &config, true).unwrap();
        let entries = decode(&forced);
        assert_eq!(entries.len(), 1, "{forced}");
        assert_eq!(entries[0].manager, "ops");
        assert_eq!(forced["spec"]["replicas"], 2);
    }

    #[test]
    fn objects_that_differ_only_in_managed_fields_times_are_the_same() {
        let entry = |time: Option<&str>, manager: &str| {
            let mut e =
                json!({"manager": manager, "operation": "Apply", "fieldsV1": {"f:spec": {}}});
            if let Some(time) = time {
                e["time"] = json!(time);
            }
            e
        };
        let object = |entries: Vec<Value>| json!({"kind": "X", "metadata": {"name": "a", "managedFields": entries}, "spec": {"n": 1}});
        let old = object(vec![entry(Some("2024-01-01T00:00:00Z"), "a")]);
        assert!(same_but_times(
            &old,
            &object(vec![entry(Some("2025-01-01T00:00:00Z"), "a")])
        ));
        assert!(same_but_times(&old, &object(vec![entry(None, "a")])));
        assert!(!same_but_times(&old, &object(vec![entry(None, "b")])));
        assert!(!same_but_times(&old, &object(vec![])));
        let mut other_spec = old.clone();
        other_spec["spec"]["n"] = json!(2);
        assert!(!same_but_times(&old, &other_spec));
        let mut unmanaged = old.clone();
        unmanaged["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        assert!(!same_but_times(&old, &unmanaged));
        assert!(same_but_times(&unmanaged, &unmanaged.clone()));
    }

    #[test]
    fn several_conflicts_are_grouped_by_manager() {
        let rt = deployments();
        let live = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 1, "paused": false}});
        let a = Writer {
            rt: &rt,
            subresource: "",
            manager: "a",
        };
        let live = a.apply(&live, &live.clone(), false).unwrap();
        let config = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 2, "paused": true}});
        let b = Writer {
            rt: &rt,
            subresource: "",
            manager: "b",
        };
        let conflicts = b.apply(&live, &config, false).unwrap_err();
        assert_eq!(
            conflict_error(&conflicts).message,
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.paused\n- .spec.replicas"
        );
    }

    #[test]
    fn kubectls_apply_takes_over_what_its_client_side_apply_set_and_no_more() {
        let rt = deployments();
        // What `kubectl apply` made: its configuration in the annotation, its fields owned
        // by `kubectl-client-side-apply`; `spec.paused` was set by the configuration too.
        let config = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 1, "paused": false}});
        let mut live = config.clone();
        live["metadata"]["annotations"] =
            json!({LAST_APPLIED: serde_json::to_string(&config).unwrap()});
        Writer {
            rt: &rt,
            subresource: "",
            manager: "kubectl-client-side-apply",
        }
        .created(&mut live, None);
        let mut changed = config.clone();
        changed["spec"]["paused"] = json!(true);
        let writer = |manager| Writer {
            rt: &rt,
            subresource: "",
            manager,
        };
        let taken = writer("kubectl").apply(&live, &changed, false).unwrap();
        assert_eq!(taken["spec"]["paused"], true);
        assert_eq!(
            writer("other").apply(&live, &changed, false).unwrap_err()[0].1,
            ["f:spec", "f:paused"]
        );
        // A field the annotation does not name stays a conflict, for kubectl too.
        live["metadata"]["annotations"] = json!({LAST_APPLIED: "{\"spec\": {}}"});
        assert!(writer("kubectl").apply(&live, &changed, false).is_err());
    }
}
