//! The checks of one `openAPIV3Schema`: structurality and the `metadata` restriction
//! (`pkg/apiserver/schema/validation.go`), defaults that satisfy their schema
//! (`pkg/apiserver/schema/defaulting/validation.go`), the per-node rules of
//! `ValidateCustomResourceDefinitionOpenAPISchema` (list types, list-map keys, rules) and the
//! CEL rules with their static cost (`validation.go`, `cel_validation.go`).

use serde_json::Value;

use super::errors::{forbidden, invalid, not_supported, quote, required};
use super::rules::{self, CelScope};
use crate::schema::{CrdSchema, FieldError, strings};

/// The schema's own level, which decides the wording of a missing `type`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Field,
    Item,
}

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

// === structural invariants ===

fn invariants(s: &Value, level: Level, path: &str, errors: &mut Vec<FieldError>) {
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

// === defaults ===

/// `ValidateDefaults`: every `default` must be pruned already and valid against its own schema.
fn defaults(s: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if let Some(default) = s.get("default") {
        default_value(s, default, &format!("{path}.default"), errors);
    }
    if let Some(items) = s.get("items").filter(|i| i.is_object()) {
        defaults(items, &format!("{path}.items"), errors);
    }
    for (k, v) in properties(s) {
        defaults(v, &format!("{path}.properties[{k}]"), errors);
    }
    if let Some(additional) = s.get("additionalProperties").filter(|a| a.is_object()) {
        defaults(additional, &format!("{path}.additionalProperties"), errors);
    }
}

fn default_value(s: &Value, default: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let Ok(schema) = CrdSchema::from_value(s.clone()) else {
        return;
    };
    let mut pruned = default.clone();
    if let Value::Object(map) = &mut pruned {
        // CrdSchema keeps apiVersion/kind/metadata at its root; a default has no such exemption.
        if s.get("properties").is_some() && s.get("x-kubernetes-preserve-unknown-fields").is_none()
        {
            map.retain(|k, _| s.pointer(&format!("/properties/{k}")).is_some());
        }
    }
    schema.prune(&mut pruned);
    if &pruned != default {
        errors.push(invalid(
            path,
            &go_value(default),
            "must not have unknown fields",
        ));
        return;
    }
    for e in schema.validate(default, None) {
        let field = if e.field.is_empty() {
            path.to_owned()
        } else {
            format!("{path}.{}", e.field)
        };
        // The value's own path in the message reads from the schema, as the real validator's does.
        let message = e.message.replacen(
            &format!(": {} in body", e.field),
            &format!(": {field} in body"),
            1,
        );
        errors.push(FieldError::new(field, e.reason, message));
    }
}

/// A JSON value as Go's `%v`-ish rendering in `Invalid value:` (strings quoted).
fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        other => other.to_string(),
    }
}

// === ValidateCustomResourceDefinitionOpenAPISchema ===

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

/// Where a node sits, as `specStandardValidatorV3` tracks it while descending.
#[derive(Clone, Default)]
struct Place {
    root: bool,
    /// Why defaults are forbidden here (`in top-level metadata`), if they are.
    no_defaults: Option<String>,
    /// The list above that old and new values cannot be matched through, if any.
    uncorrelatable: Option<String>,
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
fn openapi(
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

/// The `properties` of a schema node, in the schema's order.
pub(super) fn properties(s: &Value) -> impl Iterator<Item = (&String, &Value)> {
    s.get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
}
