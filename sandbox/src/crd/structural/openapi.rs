//! The per-node rules of `ValidateCustomResourceDefinitionOpenAPISchema`: types, defaults
//! where allowed, list and map types, list-map keys, and the CEL rules with their cost.

use serde_json::Value;

use super::node::properties;
use crate::crd::errors::{forbidden, invalid, not_supported, quote, required};
use crate::crd::rules::{self, CelScope};
use crate::schema::{FieldError, strings};

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

/// Where a node sits, as `specStandardValidatorV3` tracks it while descending.
#[derive(Clone, Default)]
pub(super) struct Place {
    pub(super) root: bool,
    /// Why defaults are forbidden here (`in top-level metadata`), if they are.
    pub(super) no_defaults: Option<String>,
    /// The list above that old and new values cannot be matched through, if any.
    pub(super) uncorrelatable: Option<String>,
}

impl Place {
    fn below(&self) -> Place {
        Place {
            root: false,
            ..self.clone()
        }
    }
}

/// Returns whether this node or one below it had a schema error (which turns CEL off above it).
pub(super) fn openapi(
    s: &Value,
    path: &str,
    place: &Place,
    scope: Option<CelScope>,
    total: &mut rules::TotalCost,
    errors: &mut Vec<FieldError>,
) -> bool {
    let mut schema_errors = Vec::new();
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("");
    if !ty.is_empty() && !TYPES.contains(&ty) {
        schema_errors.push(not_supported(&format!("{path}.type"), ty, TYPES));
    }
    if let Some(reason) = &place.no_defaults
        && s.get("default").is_some()
    {
        schema_errors.push(forbidden(
            &format!("{path}.default"),
            &format!("must not be set {reason}"),
        ));
    }
    if s.get("uniqueItems") == Some(&Value::Bool(true)) {
        schema_errors.push(forbidden(
            &format!("{path}.uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    let additional = s.get("additionalProperties");
    if let Some(a) = additional
        && properties(s).next().is_some()
        && (a == &Value::Bool(false) || a.is_object())
    {
        schema_errors.push(forbidden(
            &format!("{path}.additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    let mut below = false;
    if let Some(a) = additional.filter(|a| a.is_object()) {
        let child = scope.as_ref().and_then(|c| c.additional(a));
        let at = format!("{path}.additionalProperties");
        below |= openapi(a, &at, &place.below(), child, total, errors);
    }
    for (k, v) in properties(s) {
        let mut sub = place.below();
        if place.root && matches!(k.as_str(), "metadata" | "kind" | "apiVersion") {
            sub.no_defaults = Some(format!("in top-level {k}"));
        }
        let child = scope.as_ref().and_then(|c| c.property(k, v));
        below |= openapi(
            v,
            &format!("{path}.properties[{k}]"),
            &sub,
            child,
            total,
            errors,
        );
    }
    if let Some(items) = s.get("items").filter(|i| i.is_object()) {
        let mut sub = place.below();
        if s.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
            sub.uncorrelatable.get_or_insert_with(|| path.to_owned());
        }
        let child = scope.as_ref().and_then(|c| c.items(items));
        below |= openapi(items, &format!("{path}.items"), &sub, child, total, errors);
    }
    if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
        schema_errors.push(invalid(
            &format!("{path}.x-kubernetes-preserve-unknown-fields"),
            "false",
            "must be true or undefined",
        ));
    }
    list_types(s, path, &mut schema_errors);
    map_list_keys(s, path, &mut schema_errors);
    let rules = s
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, rule) in rules.iter().enumerate() {
        rules::check_rule_fields(
            rule,
            &format!("{path}.x-kubernetes-validations[{i}]"),
            &mut schema_errors,
        );
    }
    let had_errors = below || !schema_errors.is_empty();
    errors.extend(schema_errors);
    if !had_errors
        && !rules.is_empty()
        && let Some(scope) = &scope
    {
        let uncorrelatable = place.uncorrelatable.as_deref();
        rules::compile_all(rules, scope, path, uncorrelatable, total, errors);
    }
    had_errors
}

/// `x-kubernetes-list-type` and `x-kubernetes-map-type` shapes.
fn list_types(s: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("");
    if let Some(map_type) = s.get("x-kubernetes-map-type").and_then(Value::as_str) {
        if ty.is_empty() {
            errors.push(required(
                &format!("{path}.type"),
                "must be object if x-kubernetes-map-type is specified",
            ));
        } else if ty != "object" {
            errors.push(invalid(
                &format!("{path}.type"),
                &quote(ty),
                "must be object if x-kubernetes-map-type is specified",
            ));
        }
        if !matches!(map_type, "atomic" | "granular") {
            errors.push(not_supported(
                &format!("{path}.x-kubernetes-map-type"),
                map_type,
                &["atomic", "granular"],
            ));
        }
    }
    let list_type = s.get("x-kubernetes-list-type").and_then(Value::as_str);
    if let Some(list_type) = list_type {
        if ty.is_empty() {
            errors.push(required(
                &format!("{path}.type"),
                "must be array if x-kubernetes-list-type is specified",
            ));
        } else if ty != "array" {
            errors.push(invalid(
                &format!("{path}.type"),
                &quote(ty),
                "must be array if x-kubernetes-list-type is specified",
            ));
        }
        if list_type == "set"
            && ty == "array"
            && let Some(items) = s.get("items")
        {
            let text = |key: &str| items.get(key).and_then(Value::as_str);
            match text("type") {
                Some("array") if text("x-kubernetes-list-type").is_some_and(|t| t != "atomic") => {
                    errors.push(invalid(
                        &format!("{path}.items.x-kubernetes-list-type"),
                        &quote(text("x-kubernetes-list-type").unwrap_or("")),
                        "must be atomic as item of a list with x-kubernetes-list-type=set",
                    ));
                }
                Some("object") if text("x-kubernetes-map-type") != Some("atomic") => {
                    // The real check prints the item's list type here (its pointer, nil: "null").
                    let shown = text("x-kubernetes-list-type").map_or("\"null\"".to_owned(), quote);
                    errors.push(invalid(
                        &format!("{path}.items.x-kubernetes-map-type"),
                        &shown,
                        "must be atomic as item of a list with x-kubernetes-list-type=set",
                    ));
                }
                _ => {}
            }
        }
        if !matches!(list_type, "atomic" | "set" | "map") {
            errors.push(not_supported(
                &format!("{path}.x-kubernetes-list-type"),
                list_type,
                &["atomic", "set", "map"],
            ));
        }
    }
    let keys = strings(s, "x-kubernetes-list-map-keys");
    if !keys.is_empty() && list_type != Some("map") {
        match list_type {
            None => errors.push(required(
                &format!("{path}.x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            Some(t) => errors.push(invalid(
                &format!("{path}.x-kubernetes-list-type"),
                &quote(t),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
        }
    }
    if list_type == Some("map") {
        if keys.is_empty() {
            errors.push(required(
                &format!("{path}.x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match s.get("items") {
            None => errors.push(required(
                &format!("{path}.items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(items) => {
                let item_type = items.get("type").and_then(Value::as_str).unwrap_or("");
                if item_type != "object" {
                    errors.push(invalid(
                        &format!("{path}.items.type"),
                        &quote(item_type),
                        "must be object if parent array's x-kubernetes-list-type is map",
                    ));
                } else if keys
                    .iter()
                    .any(|k| items.pointer(&format!("/properties/{k}")).is_none())
                {
                    errors.push(invalid(
                        &format!("{path}.x-kubernetes-list-map-keys"),
                        &format!("{keys:?}").replace(", ", " "),
                        "entries must all be names of item properties",
                    ));
                }
            }
        }
    }
}

/// `validateMapListKeysMapSet`: list-map keys must be required or defaulted, and not nullable.
fn map_list_keys(s: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let list_type = s.get("x-kubernetes-list-type").and_then(Value::as_str);
    let Some(items) = s.get("items").filter(|i| i.is_object()) else {
        return;
    };
    if !matches!(list_type, Some("map" | "set")) {
        return;
    }
    if items.get("nullable") == Some(&Value::Bool(true)) {
        errors.push(forbidden(
            &format!("{path}.items.nullable"),
            &format!(
                "cannot be nullable when x-kubernetes-list-type is {}",
                list_type.unwrap_or("")
            ),
        ));
    }
    if list_type != Some("map") {
        return;
    }
    let required_keys = strings(items, "required");
    for key in strings(s, "x-kubernetes-list-map-keys") {
        let Some(prop) = items.pointer(&format!("/properties/{key}")) else {
            continue;
        };
        let at = format!("{path}.items.properties[{key}]");
        if !required_keys.contains(&key) && prop.get("default").is_none() {
            errors.push(required(
                &format!("{at}.default"),
                "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
            ));
        }
        if prop.get("nullable") == Some(&Value::Bool(true)) {
            errors.push(forbidden(
                &format!("{at}.nullable"),
                "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
            ));
        }
    }
}
