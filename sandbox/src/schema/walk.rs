//! Walks over a schema and a value: the object as CEL rules see it, the rules ratcheting
//! drops, pattern and CEL compilation, list uniqueness, pruning and defaulting.

use std::collections::{HashMap, HashSet};

use kube::core::cel::CompiledSchema;
use regex::Regex;
use serde_json::{Map, Value};

use super::{
    errors::{FieldError, SchemaError},
    value::{join, render, strings},
};

/// The object as CEL rules see it: at the root, `metadata` holds only `name` and
/// `generateName`, the two fields the API server declares for rules there
/// (`WithTypeAndObjectMeta` in k8s.io/apiextensions-apiserver). Besides matching what a rule
/// may use, this keeps `managedFields` out of the conversion to CEL values that `kube-cel`
/// makes at every schema node on every write.
pub(super) fn rule_view(object: &Value) -> Value {
    let Some(fields) = object.as_object() else {
        return object.clone();
    };
    let view = fields
        .iter()
        .map(|(key, value)| {
            if key != "metadata" {
                return (key.clone(), value.clone());
            }
            let visible = ["name", "generateName"]
                .into_iter()
                .filter_map(|field| Some((field.to_owned(), value.get(field)?.clone())))
                .collect::<Map<_, _>>();
            (key.clone(), Value::Object(visible))
        })
        .collect();
    Value::Object(view)
}

/// Removes from `node` and everything below it the rules whose failure ratcheting drops: those
/// that do not use `oldSelf` (transition rules are never ratcheted).
pub(super) fn drop_ratcheting_rules(node: &mut CompiledSchema) {
    node.validations
        .retain(|rule| !matches!(rule, Ok(rule) if !rule.is_transition_rule));
    let children = node
        .properties
        .values_mut()
        .chain(node.items.as_deref_mut())
        .chain(node.additional_properties.as_deref_mut())
        .chain(&mut node.all_of)
        .chain(&mut node.one_of)
        .chain(&mut node.any_of);
    for child in children {
        drop_ratcheting_rules(child);
    }
}

/// Every `pattern` in the schema, junctor branches included, compiled once and keyed by its
/// text.
pub(super) fn collect_patterns(
    schema: &Value,
    path: &str,
    out: &mut HashMap<String, Regex>,
) -> Result<(), SchemaError> {
    if let Some(p) = schema.get("pattern").and_then(Value::as_str)
        && !out.contains_key(p)
    {
        let re = Regex::new(p).map_err(|source| SchemaError::CompilePattern {
            path: path.to_owned(),
            pattern: p.to_owned(),
            source,
        })?;
        out.insert(p.to_owned(), re);
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            collect_patterns(v, &join(path, k), out)?;
        }
    }
    if let Some(items) = schema.get("items") {
        collect_patterns(items, path, out)?;
    }
    if let Some(add) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        collect_patterns(add, &format!("{path}.*"), out)?;
    }
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for branch in schema
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            collect_patterns(branch, path, out)?;
        }
    }
    if let Some(not) = schema.get("not") {
        collect_patterns(not, path, out)?;
    }
    Ok(())
}

pub(super) fn first_compile_error(schema: &CompiledSchema, path: &str) -> Option<(String, String)> {
    if let Some(e) = schema.compilation_errors().first() {
        return Some((path.to_owned(), e.to_string()));
    }
    let children = schema
        .properties
        .iter()
        .map(|(k, v)| (join(path, k), v))
        .chain(
            schema
                .items
                .iter()
                .map(|i| (format!("{path}[*]"), i.as_ref())),
        )
        .chain(
            schema
                .additional_properties
                .iter()
                .map(|a| (format!("{path}.*"), a.as_ref())),
        );
    for (child_path, child) in children {
        if let Some(found) = first_compile_error(child, &child_path) {
            return Some(found);
        }
    }
    None
}

/// The `x-kubernetes-list-type` `map` and `set` uniqueness errors of `value`, the API server's
/// pass after the OpenAPI checks (`structurallisttype.ValidateListSetsAndMaps`).
pub(super) fn list_errors(schema: &Value, value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    match value {
        Value::Array(items) => {
            check_list_uniqueness(schema, items, path, errors);
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    list_errors(item_schema, item, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                if path.is_empty() && key == "metadata" {
                    continue;
                }
                if let Some(child_schema) = properties.and_then(|p| p.get(key)).or(additional) {
                    list_errors(child_schema, child, &join(path, key), errors);
                }
            }
        }
        _ => {}
    }
}

fn check_list_uniqueness(
    schema: &Value,
    items: &[Value],
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => {
            let keys = strings(schema, "x-kubernetes-list-map-keys");
            let mut seen = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                let key: Vec<Value> = keys
                    .iter()
                    .map(|k| item.get(*k).cloned().unwrap_or(Value::Null))
                    .collect();
                if !seen.insert(serde_json::to_string(&key).unwrap_or_default()) {
                    let shown: Vec<String> = keys
                        .iter()
                        .zip(&key)
                        .map(|(k, v)| format!("\"{k}\":{}", render(v)))
                        .collect();
                    errors.push(FieldError {
                        field: format!("{path}[{i}]"),
                        reason: "FieldValueDuplicate".into(),
                        message: format!(
                            "Duplicate value: map[string]interface {{}}{{{}}}",
                            shown.join(", ")
                        ),
                    });
                }
            }
        }
        Some("set") => {
            let mut seen = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                if !seen.insert(serde_json::to_string(item).unwrap_or_default()) {
                    errors.push(FieldError {
                        field: format!("{path}[{i}]"),
                        reason: "FieldValueDuplicate".into(),
                        message: format!("Duplicate value: {}", render(item)),
                    });
                }
            }
        }
        _ => {}
    }
}

pub(super) fn prune_value(
    schema: &Value,
    value: &mut Value,
    path: &str,
    dropped: &mut Vec<String>,
) {
    if schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
        && schema.get("properties").is_none()
    {
        return;
    }
    match value {
        Value::Object(map) => {
            let preserve = schema
                .get("x-kubernetes-preserve-unknown-fields")
                .and_then(Value::as_bool)
                == Some(true);
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let nullable = |s: &Value| s.get("nullable").and_then(Value::as_bool).unwrap_or(false);
            let mut remove = Vec::new();
            for (key, child) in map.iter_mut() {
                let child_path = join(path, key);
                match properties.and_then(|p| p.get(key)).or(additional) {
                    Some(child_schema) if child.is_null() && !nullable(child_schema) => {
                        remove.push(key.clone())
                    }
                    Some(child_schema) => prune_value(child_schema, child, &child_path, dropped),
                    None if preserve
                        || schema.get("additionalProperties") == Some(&Value::Bool(true)) => {}
                    None => {
                        dropped.push(child_path);
                        remove.push(key.clone());
                    }
                }
            }
            for key in remove {
                map.remove(&key);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_value(item_schema, item, &format!("{path}[{i}]"), dropped);
                }
            }
        }
        _ => {}
    }
}

pub(super) fn apply_defaults(schema: &Value, value: &mut Value, root: bool) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, child_schema) in props {
                    if root && key == "metadata" {
                        continue;
                    }
                    if !map.contains_key(key)
                        && let Some(default) = child_schema.get("default")
                    {
                        map.insert(key.clone(), default.clone());
                    }
                    if let Some(child) = map.get_mut(key) {
                        apply_defaults(child_schema, child, false);
                    }
                }
            }
            if let Some(add) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                let declared: Map<String, Value> = schema
                    .get("properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                for (key, child) in map.iter_mut() {
                    if !declared.contains_key(key) {
                        apply_defaults(add, child, false);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    apply_defaults(item_schema, item, false);
                }
            }
        }
        _ => {}
    }
}
