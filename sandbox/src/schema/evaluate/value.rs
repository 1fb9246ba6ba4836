//! A JSON value as a rule sees it, after k8s.io/apiserver `pkg/cel/common/values.go`
//! (`UnstructuredToVal`): declared fields by their CEL-escaped names, map keys as they are,
//! `number` fields as doubles, and strings of the `byte`, `duration`, `date` and `date-time`
//! formats as bytes, durations and timestamps.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use cel::Value as Cel;
use cel::objects::{Key, Map};
use serde_json::Value;

use crate::schema::value::escape;

/// `value` under the schema node `schema`.
pub(super) fn to_cel(value: &Value, schema: &Value) -> Cel {
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => {
            let double = schema.get("type").and_then(Value::as_str) == Some("number");
            match (n.as_i64(), n.as_u64()) {
                (Some(i), _) if !double => Cel::Int(i),
                (None, Some(u)) if !double => Cel::UInt(u),
                _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
            }
        }
        Value::String(s) if int_or_string => Cel::String(Arc::new(s.clone())),
        Value::String(s) => string(s, schema.get("format").and_then(Value::as_str)),
        Value::Array(items) => {
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            Cel::List(Arc::new(
                items.iter().map(|i| to_cel(i, item_schema)).collect(),
            ))
        }
        Value::Object(fields) => object(fields, schema, |_| true),
    }
}

/// [`to_cel`] of `value` with, if it is an object, only the fields named `read` (CEL names,
/// sorted): what a rule that only selects those fields sees of it.
pub(super) fn fields_to_cel(value: &Value, schema: &Value, read: &[&str]) -> Cel {
    match value {
        Value::Object(fields) => object(fields, schema, |name| read.binary_search(&name).is_ok()),
        _ => to_cel(value, schema),
    }
}

/// An object's fields whose CEL names are `kept`, as a CEL map.
fn object(
    fields: &serde_json::Map<String, Value>,
    schema: &Value,
    kept: impl Fn(&str) -> bool,
) -> Cel {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    // Keys of a map (`additionalProperties`) are data, not field names: not escaped.
    let is_map = !matches!(additional, None | Some(Value::Bool(false)));
    let mut map = HashMap::with_capacity(fields.len());
    for (key, field) in fields {
        let name = if is_map {
            Some(key.clone())
        } else {
            escape(key)
        };
        // A property with no CEL name cannot be read by a rule.
        let Some(name) = name.filter(|name| kept(name)) else {
            continue;
        };
        let child = properties
            .and_then(|p| p.get(key))
            .or(additional.filter(|a| a.is_object()))
            .unwrap_or(&Value::Null);
        map.insert(Key::String(Arc::new(name)), to_cel(field, child));
    }
    Cel::Map(Map { map: Arc::new(map) })
}

/// A string by its `format`; one that does not parse stays a string (its format error is
/// reported by the schema checks).
fn string(s: &str, format: Option<&str>) -> Cel {
    let parsed = match format {
        Some("byte") => base64::engine::general_purpose::STANDARD
            .decode(s)
            .ok()
            .map(|b| Cel::Bytes(Arc::new(b))),
        Some("duration") => cel::functions::duration(Arc::new(s.to_owned())).ok(),
        Some("date-time") => cel::functions::timestamp(Arc::new(s.to_owned())).ok(),
        Some("date") => cel::functions::timestamp(Arc::new(format!("{s}T00:00:00Z"))).ok(),
        _ => None,
    };
    parsed.unwrap_or_else(|| Cel::String(Arc::new(s.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn declared_fields_are_escaped_and_map_keys_are_not() {
        let schema = json!({"type": "object", "properties": {
            "a-b": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}
        }});
        let value = to_cel(&json!({"a-b": "x", "labels": {"c-d": "y"}}), &schema);
        let Cel::Map(map) = value else {
            panic!("a map")
        };
        assert!(
            map.map
                .contains_key(&Key::String(Arc::new("a__dash__b".into())))
        );
        let Some(Cel::Map(labels)) = map.map.get(&Key::String(Arc::new("labels".into()))) else {
            panic!("labels")
        };
        assert!(
            labels
                .map
                .contains_key(&Key::String(Arc::new("c-d".into())))
        );
    }

    #[test]
    fn numbers_follow_the_schema_type_and_strings_their_format() {
        assert_eq!(
            to_cel(&json!(3), &json!({"type": "number"})),
            Cel::Float(3.0)
        );
        assert_eq!(to_cel(&json!(3), &json!({"type": "integer"})), Cel::Int(3));
        assert!(matches!(
            to_cel(
                &json!("1h30m"),
                &json!({"type": "string", "format": "duration"})
            ),
            Cel::Duration(_)
        ));
        assert!(matches!(
            to_cel(
                &json!("2024-01-02"),
                &json!({"type": "string", "format": "date"})
            ),
            Cel::Timestamp(_)
        ));
        assert!(matches!(
            to_cel(
                &json!("2024-01-02T03:04:05Z"),
                &json!({"type": "string", "format": "date-time"})
            ),
            Cel::Timestamp(_)
        ));
    }
}
