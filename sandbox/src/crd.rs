//! Validation of CustomResourceDefinitions as kube-apiserver 1.33 does it when one is created or
//! updated: the schema must be structural, `metadata` may only restrict `name`/`generateName`,
//! list-map keys must be required or defaulted, defaults must satisfy their schema, CEL rules must
//! compile within the static cost limits, printer columns and scale paths must be simple
//! JSONPaths. The real rules live in apiextensions-apiserver
//! `pkg/apis/apiextensions/validation/validation.go` (and `cel_validation.go`),
//! `pkg/apiserver/schema/validation.go` and `pkg/apiserver/schema/defaulting/validation.go`.
//!
//! Field paths are the ones of the internal version the real server validates: when every
//! version carries the same schema (or subresources, or printer columns) they are reported under
//! `spec.validation.openAPIV3Schema` (`spec.subresources`, `spec.additionalPrinterColumns`), as
//! the v1-to-internal conversion moves identical per-version fields to the top level
//! (`pkg/apis/apiextensions/v1/conversion.go`).

mod check;
pub mod cost;
mod errors;
mod rules;
mod structural;
mod types;

use serde_json::Value;

use crate::schema::FieldError;
use errors::{invalid, quote, required};

/// Every reason `crd` (a CustomResourceDefinition as JSON) would be refused; empty means valid.
pub fn validate(crd: &Value) -> Vec<FieldError> {
    validate_with_costs(crd).0
}

/// [`validate`], and the estimated cost of every CEL rule that compiled (times its
/// cardinality, as checked against the limit), by the rule's field path.
pub fn validate_with_costs(crd: &Value) -> (Vec<FieldError>, Vec<(String, u64)>) {
    let versions: &[Value] = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut errors = Vec::new();
    let mut costs = Vec::new();
    let per_version = |key: &str| -> Vec<(String, Option<&Value>)> {
        let first = versions.first().map(|v| v.get(key));
        if versions.iter().all(|v| Some(v.get(key)) == first) {
            let top = match key {
                "schema" => "spec.validation",
                "subresources" => "spec.subresources",
                _ => "spec.additionalPrinterColumns",
            };
            vec![(top.to_owned(), first.flatten())]
        } else {
            versions
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("spec.versions[{i}].{key}"), v.get(key)))
                .collect()
        }
    };
    for (path, columns) in per_version("additionalPrinterColumns") {
        for (i, column) in columns
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            check_column(column, &format!("{path}[{i}]"), &mut errors);
        }
    }
    for (path, subresources) in per_version("subresources") {
        if let Some(scale) = subresources.and_then(|s| s.get("scale")) {
            check_scale(scale, &path, &mut errors);
        }
    }
    let status_enabled = |path: &str| {
        if path == "spec.validation" {
            versions
                .iter()
                .any(|v| v.pointer("/subresources/status").is_some())
        } else {
            let i: usize = path
                .trim_start_matches("spec.versions[")
                .split(']')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            versions
                .get(i)
                .is_some_and(|v| v.pointer("/subresources/status").is_some())
        }
    };
    for (path, schema) in per_version("schema") {
        if let Some(root) = schema.and_then(|s| s.get("openAPIV3Schema")) {
            let enabled = status_enabled(&path);
            costs.extend(structural::check(
                root,
                &format!("{path}.openAPIV3Schema"),
                enabled,
                &mut errors,
            ));
        }
    }
    (errors, costs)
}

/// `ValidateCustomResourceColumnDefinition`.
fn check_column(column: &Value, path: &str, errors: &mut Vec<FieldError>) {
    const TYPES: &str = "boolean,date,integer,number,string";
    const FORMATS: &[&str] = &[
        "byte",
        "date",
        "date-time",
        "double",
        "float",
        "int32",
        "int64",
        "password",
    ];
    let text = |key: &str| column.get(key).and_then(Value::as_str).unwrap_or("");
    if text("name").is_empty() {
        errors.push(required(&format!("{path}.name"), ""));
    }
    let ty = text("type");
    if ty.is_empty() {
        errors.push(required(
            &format!("{path}.type"),
            &format!("must be one of {TYPES}"),
        ));
    } else if !TYPES.split(',').any(|t| t == ty) {
        errors.push(invalid(
            &format!("{path}.type"),
            &quote(ty),
            &format!("must be one of {TYPES}"),
        ));
    }
    let format = text("format");
    if !format.is_empty() && !FORMATS.contains(&format) {
        errors.push(invalid(
            &format!("{path}.format"),
            &quote(format),
            &format!("must be one of {}", FORMATS.join(",")),
        ));
    }
    let json_path = text("jsonPath");
    if json_path.is_empty() {
        errors.push(required(&format!("{path}.JSONPath"), ""));
    } else {
        errors.extend(simple_json_path(json_path, &format!("{path}.JSONPath")));
    }
}

/// `ValidateCustomResourceDefinitionSubresources`: the scale paths.
fn check_scale(scale: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let text = |key: &str| scale.get(key).and_then(Value::as_str);
    for (key, under, detail) in [
        (
            "specReplicasPath",
            &[".spec."][..],
            "should be a json path under .spec",
        ),
        (
            "statusReplicasPath",
            &[".status."][..],
            "should be a json path under .status",
        ),
    ] {
        let field = format!("{path}.scale.{key}");
        match text(key).unwrap_or("") {
            "" => errors.push(required(&field, "")),
            p => {
                let bad = simple_json_path(p, &field);
                if !bad.is_empty() {
                    errors.extend(bad);
                } else if !under.iter().any(|u| p.starts_with(u)) {
                    errors.push(invalid(&field, &quote(p), detail));
                }
            }
        }
    }
    if let Some(p) = text("labelSelectorPath").filter(|p| !p.is_empty()) {
        let field = format!("{path}.scale.labelSelectorPath");
        let bad = simple_json_path(p, &field);
        if !bad.is_empty() {
            errors.extend(bad);
        } else if !p.starts_with(".spec.") && !p.starts_with(".status.") {
            errors.push(invalid(
                &field,
                &quote(p),
                "should be a json path under either .spec or .status",
            ));
        }
    }
}

/// `validateSimpleJSONPath`.
fn simple_json_path(s: &str, path: &str) -> Vec<FieldError> {
    if s.is_empty() {
        vec![invalid(path, &quote(s), "must not be empty")]
    } else if !s.starts_with('.') {
        vec![invalid(
            path,
            &quote(s),
            "must be a simple json path starting with .",
        )]
    } else {
        Vec::new()
    }
}
