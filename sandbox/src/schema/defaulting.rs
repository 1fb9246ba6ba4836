//! Defaulting on read: the API server's storage codec defaults every custom resource it decodes
//! (`unstructuredDefaulter` in apiextensions-apiserver's `pkg/apiserver/customresource_handler.go`,
//! over `structuraldefaulting.Default`), so an object stored without a field that has a default
//! (written before the CRD gained it, or a status dropped at create) reads back with it.
//!
//! Reads are frequent and almost always find nothing missing, so the schema is reduced once to
//! the nodes that lead to a `default`, and an object is copied only when one of them is absent.

use serde_json::{Map, Value};

use super::walk::apply_defaults;

/// The part of a schema that holds defaults: `properties`, `items` and `additionalProperties`
/// kept only where a `default` lies at or below them. None when the schema has no default.
pub(super) fn defaults_skeleton(schema: &Value) -> Option<Value> {
    let mut out = Map::new();
    if let Some(default) = schema.get("default") {
        out.insert("default".into(), default.clone());
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let kept: Map<String, Value> = props
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), defaults_skeleton(v)?)))
            .collect();
        if !kept.is_empty() {
            out.insert("properties".into(), Value::Object(kept));
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = schema.get(key).filter(|c| c.is_object())
            && let Some(kept) = defaults_skeleton(child)
        {
            out.insert(key.into(), kept);
        }
    }
    // `apply_defaults` skips declared properties when walking `additionalProperties`.
    if out.contains_key("additionalProperties")
        && let Some(props) = schema.get("properties").and_then(Value::as_object)
    {
        let declared = out
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(declared) = declared.as_object_mut() {
            for key in props.keys() {
                declared
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
            }
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// Whether defaulting `value` by `skeleton` would add anything.
pub(super) fn lacks_defaults(skeleton: &Value, value: &Value, root: bool) -> bool {
    match value {
        Value::Object(map) => {
            let declared = skeleton.get("properties").and_then(Value::as_object);
            let missing = declared.into_iter().flatten().any(|(key, child)| {
                if root && key == "metadata" {
                    return false;
                }
                match map.get(key) {
                    None => child.get("default").is_some(),
                    Some(v) => lacks_defaults(child, v, false),
                }
            });
            missing
                || skeleton.get("additionalProperties").is_some_and(|add| {
                    map.iter()
                        .filter(|(k, _)| declared.is_none_or(|d| !d.contains_key(*k)))
                        .any(|(_, v)| lacks_defaults(add, v, false))
                })
        }
        Value::Array(items) => skeleton
            .get("items")
            .is_some_and(|s| items.iter().any(|item| lacks_defaults(s, item, false))),
        _ => false,
    }
}

/// `object` defaulted by `skeleton`, or None when nothing is missing.
pub(super) fn defaulted(skeleton: &Value, object: &Value) -> Option<Value> {
    if !lacks_defaults(skeleton, object, true) {
        return None;
    }
    let mut out = object.clone();
    apply_defaults(skeleton, &mut out, true);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "plain": {"type": "string"},
                "items": {"type": "array", "items": {"type": "object", "properties": {
                    "k": {"type": "string"}, "v": {"type": "string", "default": "d"}}}},
                "labels": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {"on": {"type": "boolean", "default": true}}}}
            }},
            "status": {"type": "object", "default": {"phase": "Pending"}}
        }})
    }

    #[test]
    fn the_skeleton_keeps_only_the_paths_to_defaults() {
        let skeleton = defaults_skeleton(&schema()).unwrap();
        assert!(
            skeleton
                .pointer("/properties/spec/properties/plain")
                .is_none()
        );
        assert_eq!(
            skeleton.pointer("/properties/spec/properties/items/items/properties/v/default"),
            Some(&json!("d"))
        );
        assert_eq!(
            defaults_skeleton(&json!({"properties": {"a": {"type": "string"}}})),
            None
        );
    }

    #[test]
    fn an_object_missing_a_default_is_copied_with_it_and_a_complete_one_is_not() {
        let skeleton = defaults_skeleton(&schema()).unwrap();
        let stored = json!({"metadata": {"name": "a"},
                            "spec": {"items": [{"k": "x", "v": "set"}, {"k": "y"}],
                                     "labels": {"l": {}}}});
        let read = defaulted(&skeleton, &stored).expect("defaults are missing");
        assert_eq!(
            read,
            json!({"metadata": {"name": "a"},
                   "spec": {"items": [{"k": "x", "v": "set"}, {"k": "y", "v": "d"}],
                            "labels": {"l": {"on": true}}},
                   "status": {"phase": "Pending"}})
        );
        assert_eq!(defaulted(&skeleton, &read), None);
    }
}
