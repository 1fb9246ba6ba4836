//! The checks of one `openAPIV3Schema`: structurality and the `metadata` restriction
//! (`pkg/apiserver/schema/validation.go`), defaults that satisfy their schema
//! (`pkg/apiserver/schema/defaulting/validation.go`), the per-node rules of
//! `ValidateCustomResourceDefinitionOpenAPISchema` (list types, list-map keys, rules) and the
//! CEL rules with their static cost (`validation.go`, `cel_validation.go`).

mod defaults;
mod invariants;
mod node;
mod openapi;

use serde_json::Value;

use super::errors::{forbidden, invalid, quote};
use super::rules::{self, CelScope};
use crate::schema::FieldError;
use defaults::defaults;
use invariants::invariants;
use node::Level;
use openapi::{Place, openapi};

/// Checks `root` (an `openAPIV3Schema` reported at `path`), in the order the API server does.
/// Returns every rule's estimated cost (times its cardinality) by the rule's path.
pub(super) fn check(
    root: &Value,
    path: &str,
    status_enabled: bool,
    errors: &mut Vec<FieldError>,
) -> Vec<(String, u64)> {
    let mut found = Vec::new();
    if status_enabled {
        root_with_status(root, path, &mut found);
    }
    if root.get("nullable") == Some(&Value::Bool(true)) {
        found.push(forbidden(
            &format!("{path}.nullable"),
            "nullable cannot be true at the root",
        ));
    }
    let mut structure = Vec::new();
    invariants(root, Level::Root, path, &mut structure);
    // ValidateStructural sorts its errors by their text.
    structure.sort_by_key(|e| format!("{}: {}", e.field, e.message));
    let mut cel_ok = structure.is_empty();
    found.extend(structure);
    if cel_ok {
        let before = found.len();
        defaults(root, path, &mut found);
        cel_ok = found.len() == before;
    }
    let mut total = rules::TotalCost::default();
    let scope = cel_ok.then(|| CelScope::root(root));
    let place = Place {
        root: true,
        ..Place::default()
    };
    openapi(root, path, &place, scope, &mut total, &mut found);
    if let Some(total_errors) = total.errors(path) {
        found.extend(total_errors);
    }
    errors.extend(found);
    total.all
}

/// With a status subresource, `status` is cut out of the root schema, so the root may only
/// hold what still holds after that (`allowedFieldsAtRootSchema`). Fields are checked in the
/// order of Go's `JSONSchemaProps`; only the first offending one is reported.
fn root_with_status(root: &Value, path: &str, errors: &mut Vec<FieldError>) {
    const ALLOWED: &[&str] = &[
        "description",
        "type",
        "format",
        "title",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "required",
        "items",
        "properties",
        "externalDocs",
        "example",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
    ];
    const GO_NAMES: &str = "[Description Type Format Title Maximum ExclusiveMaximum Minimum ExclusiveMinimum MaxLength MinLength Pattern MaxItems MinItems UniqueItems MultipleOf Required Items Properties ExternalDocs Example XPreserveUnknownFields XValidations]";
    let zero = |v: &Value| match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(_) | Value::Bool(true) => false,
    };
    if let Some(ty) = root.get("type").and_then(Value::as_str)
        && ty != "object"
    {
        errors.push(invalid(
            &format!("{path}.type"),
            &quote(ty),
            "only \"object\" is allowed as the type at the root of the schema if the status subresource is enabled",
        ));
        return;
    }
    let offending = root
        .as_object()
        .into_iter()
        .flatten()
        .any(|(k, v)| !zero(v) && !ALLOWED.contains(&k.as_str()));
    if offending {
        // The real value is Go's dump of the whole schema struct; it is abbreviated here.
        errors.push(invalid(
            path,
            "apiextensions.JSONSchemaProps{...}",
            &format!("only {GO_NAMES} fields are allowed at the root of the schema if the status subresource is enabled"),
        ));
    }
}
