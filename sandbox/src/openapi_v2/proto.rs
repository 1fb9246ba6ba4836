//! The Swagger 2.0 document as gnostic's `openapi.v2.Document` protobuf
//! (`github.com/google/gnostic-models/openapiv2/OpenAPIv2.proto`), encoded by hand like the
//! sandbox's other protobuf (no protobuf crate). Only what kube-apiserver's document holds is
//! written: info, paths with their operations' query parameters and extensions, and the
//! definitions' schemas. Extension, default and enum values are the `Any.yaml` text (JSON is
//! YAML), as gnostic carries them.

use serde_json::{Map, Value};

/// One message being written.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8 & 0x7f) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn key(&mut self, field: u64, wire: u64) {
        self.varint((field << 3) | wire);
    }

    fn bytes(&mut self, field: u64, bytes: &[u8]) {
        self.key(field, 2);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    fn string(&mut self, field: u64, value: &str) {
        if !value.is_empty() {
            self.bytes(field, value.as_bytes());
        }
    }

    fn message(&mut self, field: u64, message: Message) {
        self.bytes(field, &message.0);
    }

    fn int(&mut self, field: u64, value: u64) {
        self.key(field, 0);
        self.varint(value);
    }

    fn bool(&mut self, field: u64, value: bool) {
        if value {
            self.int(field, 1);
        }
    }

    fn double(&mut self, field: u64, value: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&value.to_le_bytes());
    }
}

/// `Any { yaml = 2 }`.
fn any(value: &Value) -> Message {
    let mut any = Message::default();
    any.string(2, &value.to_string());
    any
}

/// `NamedAny { name = 1; value = 2 }` for each `x-` key of `map`, in `field`.
fn extensions(out: &mut Message, field: u64, map: &Map<String, Value>) {
    for (name, value) in map.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Message::default();
        named.string(1, name);
        named.message(2, any(value));
        out.message(field, named);
    }
}

/// `Schema`, field numbers as in `OpenAPIv2.proto`.
fn schema(value: &Value) -> Message {
    let mut out = Message::default();
    let Some(map) = value.as_object() else {
        return out;
    };
    let text = |key: &str| map.get(key).and_then(Value::as_str).unwrap_or("");
    out.string(1, text("$ref"));
    out.string(2, text("format"));
    out.string(3, text("title"));
    out.string(4, text("description"));
    if let Some(default) = map.get("default") {
        out.message(5, any(default));
    }
    for (field, key) in [(7, "maximum"), (9, "minimum")] {
        if let Some(n) = map.get(key).and_then(Value::as_f64) {
            out.double(field, n);
        }
    }
    for (field, key) in [(8, "exclusiveMaximum"), (10, "exclusiveMinimum")] {
        out.bool(field, map.get(key).and_then(Value::as_bool) == Some(true));
    }
    for (field, key) in [
        (11, "maxLength"),
        (12, "minLength"),
        (14, "maxItems"),
        (15, "minItems"),
        (17, "maxProperties"),
        (18, "minProperties"),
    ] {
        if let Some(n) = map.get(key).and_then(Value::as_u64) {
            out.int(field, n);
        }
    }
    out.string(13, text("pattern"));
    out.bool(
        16,
        map.get("uniqueItems").and_then(Value::as_bool) == Some(true),
    );
    for required in map
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.string(19, required.as_str().unwrap_or_default());
    }
    for value in map
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.message(20, any(value));
    }
    match map.get("additionalProperties") {
        Some(Value::Bool(allowed)) => {
            let mut item = Message::default();
            item.int(2, u64::from(*allowed));
            out.message(21, item);
        }
        Some(additional @ Value::Object(_)) => {
            let mut item = Message::default();
            item.message(1, schema(additional));
            out.message(21, item);
        }
        _ => {}
    }
    if let Some(ty) = map.get("type").and_then(Value::as_str) {
        let mut item = Message::default();
        item.string(1, ty);
        out.message(22, item);
    }
    if let Some(items) = map.get("items").filter(|i| i.is_object()) {
        let mut item = Message::default();
        item.message(1, schema(items));
        out.message(23, item);
    }
    if let Some(properties) = map.get("properties").and_then(Value::as_object) {
        out.message(25, named_schemas(properties));
    }
    out.bool(
        27,
        map.get("readOnly").and_then(Value::as_bool) == Some(true),
    );
    extensions(&mut out, 31, map);
    out
}

/// `Properties` / `Definitions`: `repeated NamedSchema additional_properties = 1`.
fn named_schemas(map: &Map<String, Value>) -> Message {
    let mut out = Message::default();
    for (name, value) in map {
        let mut named = Message::default();
        named.string(1, name);
        named.message(2, schema(value));
        out.message(1, named);
    }
    out
}

/// `Operation`: its query parameters (`ParametersItem` > `Parameter` > `NonBodyParameter` >
/// `QueryParameterSubSchema`) and extensions.
fn operation(value: &Value) -> Message {
    let mut out = Message::default();
    let Some(map) = value.as_object() else {
        return out;
    };
    for parameter in map
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text = |key: &str| parameter.get(key).and_then(Value::as_str).unwrap_or("");
        let mut query = Message::default();
        query.string(2, text("in"));
        query.string(4, text("name"));
        query.string(6, text("type"));
        query.bool(
            20,
            parameter.get("uniqueItems").and_then(Value::as_bool) == Some(true),
        );
        let mut non_body = Message::default();
        non_body.message(3, query);
        let mut parameter = Message::default();
        parameter.message(2, non_body);
        let mut item = Message::default();
        item.message(1, parameter);
        out.message(8, item);
    }
    extensions(&mut out, 13, map);
    out
}

/// `PathItem`'s operations.
fn path_item(value: &Value) -> Message {
    let mut out = Message::default();
    for (field, verb) in [
        (2, "get"),
        (3, "put"),
        (4, "post"),
        (5, "delete"),
        (8, "patch"),
    ] {
        if let Some(op) = value.get(verb) {
            out.message(field, operation(op));
        }
    }
    out
}

/// The `Document` of a Swagger 2.0 JSON document.
pub fn encode(document: &Value) -> Vec<u8> {
    let mut out = Message::default();
    out.string(1, document["swagger"].as_str().unwrap_or("2.0"));
    let mut info = Message::default();
    info.string(1, document["info"]["title"].as_str().unwrap_or_default());
    info.string(2, document["info"]["version"].as_str().unwrap_or_default());
    out.message(2, info);
    let mut paths = Message::default();
    for (name, item) in document["paths"].as_object().into_iter().flatten() {
        let mut named = Message::default();
        named.string(1, name);
        named.message(2, path_item(item));
        paths.message(2, named);
    }
    out.message(8, paths);
    if let Some(definitions) = document["definitions"].as_object() {
        out.message(9, named_schemas(definitions));
    }
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_are_written_with_their_numbers_and_wire_types() {
        // swagger = 1 "2.0"; info = 2 {title = 1 "T"}; paths = 8 {}.
        let bytes = encode(&json!({"swagger": "2.0", "info": {"title": "T"}, "paths": {}}));
        assert_eq!(
            bytes,
            [0x0a, 3, b'2', b'.', b'0', 0x12, 3, 0x0a, 1, b'T', 0x42, 0]
        );
        // type = 22 {value = 1 "string"}; maxLength = 11 varint 300.
        let bytes = schema(&json!({"type": "string", "maxLength": 300})).0;
        assert_eq!(
            bytes,
            [
                0x58, 0xac, 0x02, 0xb2, 0x01, 8, 0x0a, 6, b's', b't', b'r', b'i', b'n', b'g'
            ]
        );
    }
}
