//! The structural invariants (`validateStructuralInvariants` and its helpers in
//! `pkg/apiserver/schema/validation.go`): types everywhere, no value validations where they
//! cannot apply, and the `metadata` restriction at the root.

use serde_json::Value;

use super::node::{Level, properties};
use crate::crd::errors::{forbidden, invalid, quote, required};
use crate::schema::FieldError;

pub(super) fn invariants(s: &Value, level: Level, path: &str, errors: &mut Vec<FieldError>) {
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("");
    let flag = |key: &str| s.get(key) == Some(&Value::Bool(true));
    if ty == "array" && s.get("items").is_none() {
        errors.push(required(&format!("{path}.items"), "must be specified"));
    }
    if let Some(items) = s.get("items").filter(|i| i.is_object()) {
        invariants(items, Level::Item, &format!("{path}.items"), errors);
    }
    for (k, v) in properties(s) {
        invariants(v, Level::Field, &format!("{path}.properties[{k}]"), errors);
    }
    if let Some(additional) = s.get("additionalProperties") {
        if level == Level::Root {
            errors.push(forbidden(
                &format!("{path}.additionalProperties"),
                "must not be used at the root",
            ));
        }
        if additional.is_object() {
            invariants(
                additional,
                Level::Field,
                &format!("{path}.additionalProperties"),
                errors,
            );
        }
    }
    if flag("x-kubernetes-int-or-string") && flag("x-kubernetes-preserve-unknown-fields") {
        errors.push(invalid(
            &format!("{path}.x-kubernetes-preserve-unknown-fields"),
            "true",
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    let int_or_string = flag("x-kubernetes-int-or-string");
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, nested) in s
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            // The two int-or-string shapes (`anyOf: [{type: integer}, {type: string}]`) are exempt.
            if int_or_string && (junctor == "anyOf" || (junctor == "allOf" && i == 0)) {
                continue;
            }
            value_validation(nested, &format!("{path}.{junctor}[{i}]"), errors);
        }
    }
    if let Some(not) = s.get("not") {
        value_validation(not, &format!("{path}.not"), errors);
    }
    if let Some(pattern) = s.get("pattern").and_then(Value::as_str)
        && let Err(e) = regex::Regex::new(pattern)
    {
        errors.push(invalid(
            &format!("{path}.pattern"),
            &quote(pattern),
            &format!("must be a valid regular expression, but isn't: {e}"),
        ));
    }
    let embedded = flag("x-kubernetes-embedded-resource");
    if embedded && ty != "object" {
        if ty.is_empty() {
            errors.push(required(
                &format!("{path}.type"),
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        } else {
            errors.push(invalid(
                &format!("{path}.type"),
                &quote(ty),
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        }
    } else if ty.is_empty() && !int_or_string && !flag("x-kubernetes-preserve-unknown-fields") {
        let detail = match level {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errors.push(required(&format!("{path}.type"), detail));
    }
    if level == Level::Root && !ty.is_empty() && ty != "object" {
        errors.push(invalid(
            &format!("{path}.type"),
            &quote(ty),
            "must be object at the root",
        ));
    }
    let check_meta = level == Level::Root || embedded;
    for key in ["kind", "apiVersion"] {
        if check_meta && let Some(field) = s.pointer(&format!("/properties/{key}")) {
            let t = field.get("type").and_then(Value::as_str).unwrap_or("");
            if t != "string" {
                errors.push(invalid(
                    &format!("{path}.properties[{key}].type"),
                    &quote(t),
                    "must be string",
                ));
            }
        }
    }
    if let Some(meta) = s.pointer("/properties/metadata") {
        metadata(
            meta,
            check_meta,
            level,
            &format!("{path}.properties[metadata]"),
            errors,
        );
    }
}

/// `validateStructuralMetadataInvariants`: at the root, `metadata` may only say it is an object
/// and restrict `name` and `generateName`.
fn metadata(s: &Value, check: bool, level: Level, path: &str, errors: &mut Vec<FieldError>) {
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("");
    if check && ty != "object" {
        errors.push(invalid(
            &format!("{path}.type"),
            &quote(ty),
            "must be object",
        ));
    }
    if level != Level::Root {
        return;
    }
    let props: Vec<&str> = properties(s).map(|(k, _)| k.as_str()).collect();
    let only_names =
        !props.is_empty() && props.iter().all(|k| matches!(*k, "name" | "generateName"));
    let extra = s
        .as_object()
        .into_iter()
        .flatten()
        .any(|(k, _)| match k.as_str() {
            "type" | "default" => false,
            "properties" => !only_names,
            _ => true,
        });
    if extra {
        errors.push(forbidden(
            path,
            "must not specify anything other than name and generateName, but metadata is implicitly specified",
        ));
    }
}

/// `validateNestedValueValidation`: inside `allOf`/`anyOf`/`oneOf`/`not` only value
/// validations are allowed.
fn value_validation(v: &Value, path: &str, errors: &mut Vec<FieldError>) {
    const FORBIDDEN: &[(&str, &str)] = &[
        ("type", "must be empty to be structural"),
        ("additionalProperties", "must be undefined to be structural"),
        ("default", "must be undefined to be structural"),
        ("title", "must be empty to be structural"),
        ("description", "must be empty to be structural"),
        ("nullable", "must be false to be structural"),
        (
            "x-kubernetes-preserve-unknown-fields",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-embedded-resource",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-int-or-string",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-list-map-keys",
            "must be empty to be structural",
        ),
        (
            "x-kubernetes-list-type",
            "must be undefined to be structural",
        ),
        (
            "x-kubernetes-map-type",
            "must be undefined to be structural",
        ),
        ("x-kubernetes-validations", "must be empty to be structural"),
    ];
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, nested) in v
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            value_validation(nested, &format!("{path}.{junctor}[{i}]"), errors);
        }
    }
    if let Some(items) = v.get("items") {
        value_validation(items, &format!("{path}.items"), errors);
    }
    for (k, p) in properties(v) {
        value_validation(p, &format!("{path}.properties[{k}]"), errors);
    }
    for (key, detail) in FORBIDDEN {
        let set = match v.get(*key) {
            None | Some(Value::Bool(false)) | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if set {
            errors.push(forbidden(&format!("{path}.{key}"), detail));
        }
    }
    if v.pointer("/properties/metadata").is_some() {
        errors.push(forbidden(
            &format!("{path}.properties[metadata]"),
            "must not be specified in a nested context",
        ));
    }
}
