//! Field sets as structured-merge-diff keeps them (`FieldsV1`): the fields of an object, the
//! fields one write changed, and the list semantics they depend on (atomic, map by keys, set).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

mod order;

/// A set of field paths, as the tree `FieldsV1` spells: children keyed `f:<field>`,
/// `k:{"<key>":<value>,...}` (list-map elements), `v:<json>` (set elements) or `i:<index>`, and
/// `own` for the `.` member (the node itself, written `{}` for a leaf).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    own: bool,
    children: BTreeMap<String, FieldSet>,
}

/// One path into an object, by `FieldsV1` element.
pub type Path = Vec<String>;

impl FieldSet {
    /// Whether no path is a member.
    pub fn is_empty(&self) -> bool {
        !self.own && self.children.is_empty()
    }

    /// Reads a `fieldsV1` value; anything that is not an object is the empty set.
    pub fn from_fields_v1(value: &Value) -> Self {
        let mut set = FieldSet::default();
        if let Value::Object(map) = value {
            for (key, child) in map {
                if key == "." {
                    set.own = true;
                    continue;
                }
                let mut child = FieldSet::from_fields_v1(child);
                if child.children.is_empty() {
                    child.own = true;
                }
                set.children.insert(key.clone(), child);
            }
        }
        set
    }

    /// The set as `fieldsV1`.
    pub fn to_fields_v1(&self) -> Value {
        let mut map = Map::new();
        if self.own && !self.children.is_empty() {
            map.insert(".".into(), Value::Object(Map::new()));
        }
        for (key, child) in &self.children {
            map.insert(key.clone(), child.to_fields_v1());
        }
        Value::Object(map)
    }

    /// Every member path, in element order.
    pub fn members(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        if self.own {
            out.push(prefix.clone());
        }
        for (key, child) in &self.children {
            prefix.push(key.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    /// Whether some member lies strictly below `path`.
    pub fn has_member_below(&self, path: &[String]) -> bool {
        let mut node = self;
        for element in path {
            match node.children.get(element) {
                Some(child) => node = child,
                None => return false,
            }
        }
        !node.children.is_empty()
    }

    /// The members of either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.own |= other.own;
        for (key, child) in &other.children {
            let merged = match out.children.get(key) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(key.clone(), merged);
        }
        out
    }

    /// The members of both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            own: self.own && other.own,
            children: BTreeMap::new(),
        };
        for (key, child) in &self.children {
            if let Some(theirs) = other.children.get(key) {
                let common = child.intersection(theirs);
                if !common.is_empty() {
                    out.children.insert(key.clone(), common);
                }
            }
        }
        out
    }

    /// The members of this set that are not members of `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            own: self.own && !other.own,
            children: BTreeMap::new(),
        };
        for (key, child) in &self.children {
            let rest = match other.children.get(key) {
                Some(theirs) => child.difference(theirs),
                None => child.clone(),
            };
            if !rest.is_empty() {
                out.children.insert(key.clone(), rest);
            }
        }
        out
    }

    fn all_own(mut self) -> FieldSet {
        self.own = true;
        self.children = self
            .children
            .into_iter()
            .map(|(k, c)| (k, c.all_own()))
            .collect();
        self
    }
}

/// A path as structured-merge-diff prints it in conflicts: `.spec.replicas`,
/// `.spec.template.spec.containers[name="app"].image`, `[=value]` for set elements.
pub fn path_string(path: &[String]) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(field) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(key) = element.strip_prefix("k:") {
            let fields: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
            let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(value) = element.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        } else if let Some(index) = element.strip_prefix("i:") {
            out.push_str(&format!("[{index}]"));
        }
    }
    out
}

/// How a list merges between managers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole; one owner.
    Atomic,
    /// Elements keyed by these fields, each with its own owners.
    Map(Vec<String>),
    /// Scalars, each with its own owners.
    Set,
}

/// Where a value sits, for its list and map semantics: a CRD's structural schema, or the
/// built-in table (built-in kinds, and `metadata` everywhere); `Deduced` where neither says
/// (maps granular, lists atomic, as structured-merge-diff's deduced type).
#[derive(Clone, Copy, Debug)]
pub enum Shape<'a> {
    /// The root of an object, with its kind's schema if it is a custom resource.
    Root(Option<&'a Value>),
    /// A place in a CRD schema.
    Schema(&'a Value),
    /// A place in a built-in kind (or in `metadata`).
    Builtin,
    /// Nothing is known.
    Deduced,
}

impl<'a> Shape<'a> {
    fn field(self, name: &str) -> Shape<'a> {
        match self {
            Shape::Root(_) if name == "metadata" => Shape::Builtin,
            Shape::Root(None) | Shape::Builtin => Shape::Builtin,
            Shape::Root(Some(schema)) | Shape::Schema(schema) => {
                if let Some(child) = schema.get("properties").and_then(|p| p.get(name)) {
                    Shape::Schema(child)
                } else if let Some(values) =
                    schema.get("additionalProperties").filter(|v| v.is_object())
                {
                    Shape::Schema(values)
                } else {
                    Shape::Deduced
                }
            }
            Shape::Deduced => Shape::Deduced,
        }
    }

    fn items(self) -> Shape<'a> {
        match self {
            Shape::Root(Some(schema)) | Shape::Schema(schema) => {
                schema.get("items").map_or(Shape::Deduced, Shape::Schema)
            }
            other => other,
        }
    }

    /// How the list in field `name` (holding `items`) merges.
    pub fn list_type(self, name: &str, items: &[Value]) -> ListType {
        match self {
            Shape::Root(Some(schema)) | Shape::Schema(schema) => {
                match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("map") => ListType::Map(
                        schema
                            .get("x-kubernetes-list-map-keys")
                            .and_then(Value::as_array)
                            .map(|keys| {
                                keys.iter()
                                    .filter_map(Value::as_str)
                                    .map(String::from)
                                    .collect()
                            })
                            .unwrap_or_default(),
                    ),
                    Some("set") => ListType::Set,
                    _ => ListType::Atomic,
                }
            }
            Shape::Root(None) | Shape::Builtin => builtin_list_type(name, items),
            Shape::Deduced => ListType::Atomic,
        }
    }

    /// Whether the map in field `name` is owned whole (`x-kubernetes-map-type: atomic`).
    fn atomic_map(self, name: &str) -> bool {
        match self {
            Shape::Root(Some(schema)) | Shape::Schema(schema) => {
                schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic")
            }
            // Label selectors (Deployments', Services') are atomic in the built-in schemas.
            Shape::Root(None) | Shape::Builtin => name == "selector",
            Shape::Deduced => false,
        }
    }
}

/// The list-map keys of the built-in kinds, by field name (`x-kubernetes-list-map-keys` in
/// kube-apiserver's OpenAPI); every other built-in list is atomic.
fn builtin_list_type(name: &str, items: &[Value]) -> ListType {
    let keys: &[&str] = match name {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => &["name"],
        "volumeMounts" => &["mountPath"],
        "volumeDevices" => &["devicePath"],
        "conditions" => &["type"],
        "ownerReferences" => &["uid"],
        "hostAliases" => &["ip"],
        "webhooks" => &["name"],
        "topologySpreadConstraints" => &["topologyKey", "whenUnsatisfiable"],
        "ports" if items.iter().any(|e| e.get("containerPort").is_some()) => {
            &["containerPort", "protocol"]
        }
        "ports" => &["port", "protocol"],
        "finalizers" => return ListType::Set,
        _ => return ListType::Atomic,
    };
    ListType::Map(keys.iter().map(|k| k.to_string()).collect())
}

/// The `k:` element of a list-map item: its key fields in name order, compact JSON. A missing
/// `protocol` is its default, `TCP`, as the built-in schemas default it.
fn key_element(item: &Value, keys: &[String]) -> Option<String> {
    // `None` stands for the default protocol.
    let mut fields: Vec<(&str, Option<&Value>)> = keys
        .iter()
        .filter_map(|key| match item.get(key) {
            Some(v) if !v.is_null() => Some((key.as_str(), Some(v))),
            _ if key == "protocol" => Some((key.as_str(), None)),
            _ => None,
        })
        .collect();
    if fields.is_empty() {
        return None;
    }
    fields.sort_by_key(|&(key, _)| key);
    fields.dedup_by_key(|&mut (key, _)| key);
    // Written in place: every list-map element of every write is named this way.
    let mut out = b"k:{".to_vec();
    for (i, (key, value)) in fields.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key).ok()?;
        out.push(b':');
        match value {
            Some(value) => serde_json::to_writer(&mut out, value).ok()?,
            None => out.extend_from_slice(b"\"TCP\""),
        }
    }
    out.push(b'}');
    String::from_utf8(out).ok()
}

fn element_of(item: &Value, index: usize, list: &ListType) -> String {
    match list {
        ListType::Map(keys) => key_element(item, keys).unwrap_or_else(|| format!("i:{index}")),
        ListType::Set => format!("v:{item}"),
        ListType::Atomic => format!("i:{index}"),
    }
}

/// The fields of `value` (found in field `name`): what an applier owns when it applies it.
/// Maps list their fields, list-map elements are members with their fields, set elements are
/// members, and scalars, atomic lists and atomic or empty maps are leaves.
pub fn to_set(value: &Value, shape: Shape, name: &str) -> FieldSet {
    let mut node = FieldSet::default();
    match value {
        Value::Object(map) if !shape.atomic_map(name) => {
            for (key, child) in map.iter().filter(|(_, v)| !v.is_null()) {
                node.children
                    .insert(format!("f:{key}"), to_set(child, shape.field(key), key));
            }
            node.own = node.children.is_empty();
        }
        Value::Array(items) if !items.is_empty() => {
            let list = shape.list_type(name, items);
            if list == ListType::Atomic {
                node.own = true;
            } else {
                for (i, item) in items.iter().enumerate() {
                    let mut child = match list {
                        ListType::Map(_) => to_set(item, shape.items(), ""),
                        _ => FieldSet::default(),
                    };
                    child.own = true;
                    node.children.insert(element_of(item, i, &list), child);
                }
            }
        }
        _ => node.own = true,
    }
    node
}

/// [`to_set`] of a whole object: the root itself is never a member.
pub fn object_set(obj: &Value, shape: Shape) -> FieldSet {
    let mut set = to_set(obj, shape, "");
    set.own = false;
    set
}

/// The fields a write from `old` to `new` set: added or changed values, and maps, list-map
/// elements and lists that did not exist before (their `.` member), as structured-merge-diff's
/// comparison gives an Update manager.
pub fn changed(old: Option<&Value>, new: &Value, shape: Shape, name: &str) -> FieldSet {
    let mut node = FieldSet::default();
    match new {
        Value::Object(map) if !shape.atomic_map(name) => {
            let before = old.and_then(Value::as_object);
            node.own = before.is_none();
            for (key, child) in map.iter().filter(|(_, v)| !v.is_null()) {
                let set = changed(
                    before.and_then(|b| b.get(key)),
                    child,
                    shape.field(key),
                    key,
                );
                if !set.is_empty() {
                    node.children.insert(format!("f:{key}"), set);
                }
            }
        }
        Value::Array(items) => match shape.list_type(name, items) {
            ListType::Atomic => node.own = old != Some(new),
            list => {
                let before = old.and_then(Value::as_array);
                node.own = before.is_none();
                for (i, item) in items.iter().enumerate() {
                    let element = element_of(item, i, &list);
                    let previous = before.and_then(|b| {
                        b.iter()
                            .enumerate()
                            .find(|(j, o)| element_of(o, *j, &list) == element)
                            .map(|(_, o)| o)
                    });
                    let mut set = match list {
                        ListType::Map(_) => changed(previous, item, shape.items(), ""),
                        _ => FieldSet::default(),
                    };
                    set.own |= previous.is_none();
                    if !set.is_empty() {
                        node.children.insert(element, set);
                    }
                }
            }
        },
        _ => node.own = old != Some(new),
    }
    node
}

/// The fields of `old` that `new` no longer has (every member below a removed value).
pub fn removed(old: &Value, new: Option<&Value>, shape: Shape, name: &str) -> FieldSet {
    let Some(new) = new else {
        return to_set(old, shape, name).all_own();
    };
    let mut node = FieldSet::default();
    match (old, new) {
        (Value::Object(before), Value::Object(after)) if !shape.atomic_map(name) => {
            for (key, child) in before.iter().filter(|(_, v)| !v.is_null()) {
                let set = removed(
                    child,
                    after.get(key).filter(|v| !v.is_null()),
                    shape.field(key),
                    key,
                );
                if !set.is_empty() {
                    node.children.insert(format!("f:{key}"), set);
                }
            }
        }
        (Value::Array(before), Value::Array(after)) => {
            let list = shape.list_type(name, before);
            if list != ListType::Atomic {
                for (i, item) in before.iter().enumerate() {
                    let element = element_of(item, i, &list);
                    let next = after
                        .iter()
                        .enumerate()
                        .find(|(j, n)| element_of(n, *j, &list) == element)
                        .map(|(_, n)| n);
                    let set = match (&list, next) {
                        (ListType::Map(_), _) | (_, None) => removed(item, next, shape.items(), ""),
                        _ => FieldSet::default(),
                    };
                    if !set.is_empty() {
                        node.children.insert(element, set);
                    }
                }
            }
        }
        _ => {}
    }
    node
}

/// Server-side apply's merge of a configuration into the live object: maps merge field by
/// field, list-maps element by key, sets by value, both ordered as the configuration orders
/// them (`order::merged_order`); atomic lists, atomic maps and scalars are replaced. A `null`
/// in the configuration removes the field.
pub fn merge(live: &Value, config: &Value, shape: Shape, name: &str) -> Value {
    let mut out = live.clone();
    merge_into(&mut out, config, shape, name);
    out
}

/// [`merge`] in place: what the configuration does not name stays as it is, uncopied.
pub fn merge_into(live: &mut Value, config: &Value, shape: Shape, name: &str) {
    match (&mut *live, config) {
        (Value::Object(l), Value::Object(c)) if !shape.atomic_map(name) => {
            for (key, value) in c {
                if value.is_null() {
                    l.remove(key);
                    continue;
                }
                match l.get_mut(key) {
                    Some(existing) => merge_into(existing, value, shape.field(key), key),
                    None => {
                        l.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(c)) => {
            let merged = match shape.list_type(name, c) {
                ListType::Atomic => config.clone(),
                list => {
                    let keys = |items: &[Value]| -> Vec<String> {
                        items
                            .iter()
                            .enumerate()
                            .map(|(i, item)| element_of(item, i, &list))
                            .collect()
                    };
                    let merged = order::merged_order(&keys(l), &keys(c))
                        .into_iter()
                        .filter_map(|pair| match pair {
                            (Some(i), Some(j)) if matches!(list, ListType::Map(_)) => {
                                Some(merge(&l[i], &c[j], shape.items(), ""))
                            }
                            (_, Some(j)) => Some(c[j].clone()),
                            (Some(i), None) => Some(l[i].clone()),
                            (None, None) => None,
                        })
                        .collect();
                    Value::Array(merged)
                }
            };
            *live = merged;
        }
        _ => *live = config.clone(),
    }
}

/// Whether list element `item` is the one `element` names.
fn is_element(item: &Value, index: usize, element: &str) -> bool {
    if let Some(key) = element.strip_prefix("k:") {
        let fields: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
        let keys: Vec<String> = fields.keys().cloned().collect();
        key_element(item, &keys).as_deref() == Some(element)
    } else if let Some(value) = element.strip_prefix("v:") {
        serde_json::from_str::<Value>(value).is_ok_and(|v| v == *item)
    } else if let Some(i) = element.strip_prefix("i:") {
        i.parse::<usize>().ok() == Some(index)
    } else {
        false
    }
}

/// Whether `path` ends at a key field of the list-map element it is in (`k:{"name":..}` then
/// `f:name`): removing it would leave an element no key names.
pub fn is_key_field(path: &[String]) -> bool {
    let [.., element, field] = path else {
        return false;
    };
    let (Some(key), Some(field)) = (element.strip_prefix("k:"), field.strip_prefix("f:")) else {
        return false;
    };
    serde_json::from_str::<Map<String, Value>>(key).is_ok_and(|keys| keys.contains_key(field))
}

/// Removes the value at `path` from `obj`, if it is there.
pub fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut node = obj;
    for element in parent {
        let next = match node {
            Value::Object(map) => element.strip_prefix("f:").and_then(|f| map.get_mut(f)),
            Value::Array(items) => items
                .iter_mut()
                .enumerate()
                .find(|(i, item)| is_element(item, *i, element))
                .map(|(_, item)| item),
            _ => None,
        };
        match next {
            Some(next) => node = next,
            None => return,
        }
    }
    match node {
        Value::Object(map) => {
            if let Some(field) = last.strip_prefix("f:") {
                map.remove(field);
            }
        }
        Value::Array(items) => {
            if let Some(at) = items
                .iter()
                .enumerate()
                .position(|(i, item)| is_element(item, i, last))
            {
                items.remove(at);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(set: &FieldSet) -> Vec<String> {
        set.members().iter().map(|p| path_string(p)).collect()
    }

    #[test]
    fn an_applied_deployment_owns_its_leaves_and_container_elements_by_name() {
        let config = json!({"spec": {"replicas": 2, "selector": {"matchLabels": {"app": "a"}},
            "template": {"spec": {"containers": [{"name": "app", "image": "a:1",
                "ports": [{"containerPort": 80}]}]}}}});
        let set = to_set(&config, Shape::Root(None), "");
        assert_eq!(
            set.to_fields_v1(),
            json!({"f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {"f:spec": {
                "f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {},
                    "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                        ".": {}, "f:containerPort": {}}}}}}}}})
        );
        assert_eq!(FieldSet::from_fields_v1(&set.to_fields_v1()), set);
        assert!(paths(&set).contains(
            &".spec.template.spec.containers[name=\"app\"].ports[containerPort=80,protocol=\"TCP\"]"
                .to_string()
        ));
    }

    #[test]
    fn an_update_owns_what_it_changed_and_the_maps_it_created() {
        let old =
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 1, "paused": false}});
        let new = json!({"metadata": {"labels": {"a": "1"}, "annotations": {"x": "y"}},
            "spec": {"replicas": 3, "paused": false}});
        let set = changed(Some(&old), &new, Shape::Root(None), "");
        assert_eq!(
            set.to_fields_v1(),
            json!({"f:metadata": {"f:annotations": {".": {}, "f:x": {}}}, "f:spec": {"f:replicas": {}}})
        );
    }

    #[test]
    fn crd_list_maps_merge_by_key_and_sets_by_value() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "string"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "args": {"type": "array", "items": {"type": "string"}}}}}});
        let shape = Shape::Root(Some(&schema));
        let live = json!({"spec": {"items": [{"k": "a", "v": "1"}], "tags": ["x"], "args": ["1"]}});
        let config =
            json!({"spec": {"items": [{"k": "b", "v": "2"}], "tags": ["y"], "args": ["2"]}});
        assert_eq!(
            merge(&live, &config, shape, ""),
            json!({"spec": {"items": [{"k": "a", "v": "1"}, {"k": "b", "v": "2"}],
                "tags": ["x", "y"], "args": ["2"]}})
        );
        assert_eq!(
            paths(&to_set(&config, shape, "")),
            [
                ".spec.args",
                ".spec.items[k=\"b\"]",
                ".spec.items[k=\"b\"].k",
                ".spec.items[k=\"b\"].v",
                ".spec.tags[=\"y\"]"
            ]
        );
    }

    #[test]
    fn removed_fields_and_set_operations_are_member_wise() {
        let old =
            json!({"spec": {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}});
        let new = json!({"spec": {"env": [{"name": "A", "value": "1"}]}});
        let gone = removed(&old, Some(&new), Shape::Root(None), "");
        assert_eq!(
            paths(&gone),
            [
                ".spec.env[name=\"B\"]",
                ".spec.env[name=\"B\"].name",
                ".spec.env[name=\"B\"].value"
            ]
        );
        let all = to_set(&old, Shape::Root(None), "");
        assert_eq!(all.difference(&gone), to_set(&new, Shape::Root(None), ""));
        assert_eq!(all.intersection(&gone), gone);
        assert_eq!(gone.union(&all), all);
        let mut obj = old.clone();
        remove_path(&mut obj, &gone.members()[0]);
        assert_eq!(obj, new);
    }
}
