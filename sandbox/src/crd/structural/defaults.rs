//! `ValidateDefaults` (`pkg/apiserver/schema/defaulting/validation.go`): every `default` is
//! pruned already and valid against its own schema.

use serde_json::Value;

use super::node::properties;
use crate::crd::errors::{invalid, quote};
use crate::schema::{CrdSchema, FieldError};

/// `ValidateDefaults`: every `default` must be pruned already and valid against its own schema.
pub(super) fn defaults(s: &Value, path: &str, errors: &mut Vec<FieldError>) {
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
        // `<nil>` is the validated value itself (a nil field path), named `` in the message.
        let own = if e.field == "<nil>" {
            ""
        } else {
            e.field.as_str()
        };
        let field = if own.is_empty() {
            path.to_owned()
        } else {
            format!("{path}.{own}")
        };
        // The value's own path in the message reads from the schema, as the real validator's does.
        let message = e.message.replacen(
            &format!(": {own} in body"),
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
