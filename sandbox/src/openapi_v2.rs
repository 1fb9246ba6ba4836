//! `GET /openapi/v2`: the Swagger 2.0 document kube-apiserver still serves, which kubectl reads
//! (as protobuf, `proto.rs`) to validate the items of a `kind: List` file client-side, and
//! kubectl 1.27 for every object. It is made from the OpenAPI v3 documents
//! (`crate::discovery::openapi_gv`) the way kube-openapi and apiextensions-apiserver publish
//! v2: `#/definitions/` references, and what v2 cannot say dropped
//! (`apiextensions-apiserver/pkg/controller/openapi/v2/conversion.go`, `ToStructuralOpenAPIV2`).

mod proto;

use serde_json::{Map, Value, json};

use crate::discovery::{self, DEFAULT_MINOR};
use crate::registry::Registry;

pub use proto::encode as protobuf;

/// The media type kubectl asks for; kube-openapi's handler still accepts it.
pub const PROTOBUF_ASKED: &str = "com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// The media type kube-openapi answers protobuf with (`pkg/handler/handler.go`): Go's `mime`
/// package cannot parse the `@` of the one asked for.
pub const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// The whole document: every served group-version's paths and definitions.
pub fn document(registry: &Registry) -> Value {
    let root = discovery::openapi_root(registry, 0);
    let mut paths = Map::new();
    let mut definitions = Map::new();
    for gv in root["paths"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
    {
        let Some(v3) = discovery::openapi_gv(registry, gv) else {
            continue;
        };
        for (path, item) in v3["paths"].as_object().into_iter().flatten() {
            paths.insert(path.clone(), path_item(item));
        }
        for (name, schema) in v3["components"]["schemas"]
            .as_object()
            .into_iter()
            .flatten()
        {
            definitions.insert(name.clone(), to_v2(schema));
        }
    }
    // A custom resource's schema names no type metadata; the published one does
    // (`addTypeMetaProperties` and the ObjectMeta reference in apiextensions' builder).
    let custom: Vec<String> = registry
        .all()
        .filter(|t| t.crd.is_some())
        .map(|t| {
            let reverse: Vec<&str> = t.group.split('.').rev().collect();
            format!("{}.{}.{}", reverse.join("."), t.version, t.kind)
        })
        .collect();
    let meta = if definitions.contains_key(OBJECT_META) {
        json!({"$ref": format!("#/definitions/{OBJECT_META}")})
    } else {
        json!({"type": "object"})
    };
    for name in custom {
        if let Some(properties) = definitions
            .get_mut(&name)
            .and_then(|d| d.get_mut("properties"))
            .and_then(Value::as_object_mut)
        {
            properties.insert("apiVersion".into(), json!({"type": "string"}));
            properties.insert("kind".into(), json!({"type": "string"}));
            properties.insert("metadata".into(), meta.clone());
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{DEFAULT_MINOR}.0-sandbox")},
        "paths": paths,
        "definitions": definitions,
    })
}

/// A v3 path item as v2 writes it: query parameters carry their type themselves.
fn path_item(item: &Value) -> Value {
    let mut out = Map::new();
    for (verb, operation) in item.as_object().into_iter().flatten() {
        let mut operation = operation.clone();
        if let Some(parameters) = operation
            .get_mut("parameters")
            .and_then(Value::as_array_mut)
        {
            for parameter in parameters.iter_mut() {
                parameter["type"] = json!("string");
                parameter["uniqueItems"] = json!(true);
                if let Some(p) = parameter.as_object_mut() {
                    p.remove("schema");
                }
            }
        }
        out.insert(verb.clone(), operation);
    }
    Value::Object(out)
}

/// A v3 schema as v2 publishes it.
fn to_v2(schema: &Value) -> Value {
    let Some(map) = schema.as_object() else {
        return schema.clone();
    };
    // kube-openapi wraps a described reference in a one-element `allOf`; v2 refers directly.
    if let Some([only]) = map
        .get("allOf")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        && only.get("$ref").is_some()
    {
        let mut out = to_v2(only);
        if let (Some(out), Some(description)) = (out.as_object_mut(), map.get("description")) {
            out.insert("description".into(), description.clone());
        }
        return out;
    }
    let mut out = Map::new();
    for (key, value) in map {
        let value = match key.as_str() {
            "$ref" => json!(
                value
                    .as_str()
                    .unwrap_or_default()
                    .replace("#/components/schemas/", "#/definitions/")
            ),
            "allOf" | "anyOf" | "oneOf" | "not" | "nullable" => continue,
            "properties" => Value::Object(
                value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), to_v2(v)))
                    .collect(),
            ),
            "items" | "additionalProperties" if value.is_object() => to_v2(value),
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    let flag = |key: &str| map.get(key).and_then(Value::as_bool) == Some(true);
    // Untyped values and values that keep unknown fields break kubectl when they carry
    // items or properties.
    if flag("nullable") {
        out.remove("type");
    }
    if flag("nullable") || flag("x-kubernetes-preserve-unknown-fields") {
        out.remove("items");
        out.remove("properties");
    }
    if out.get("type").and_then(Value::as_str) == Some("array") && !out.contains_key("items") {
        out.remove("type");
    }
    // A nullable field may be sent as null, so v2 does not require it.
    let nullable: Vec<&String> = map
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(_, p)| p.get("nullable").and_then(Value::as_bool) == Some(true))
        .map(|(k, _)| k)
        .collect();
    if let Some(required) = out.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| !nullable.iter().any(|n| Some(n.as_str()) == r.as_str()));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v3_schema_is_published_as_v2_would_say_it() {
        let v3 = json!({
            "type": "object",
            "required": ["a", "b"],
            "properties": {
                "a": {"type": "string", "nullable": true},
                "b": {"allOf": [{"$ref": "#/components/schemas/X"}], "description": "B."},
                "c": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                      "properties": {"d": {"type": "string"}}},
                "e": {"anyOf": [{"type": "integer"}, {"type": "string"}],
                      "x-kubernetes-int-or-string": true},
            },
        });
        assert_eq!(
            to_v2(&v3),
            json!({
                "type": "object",
                "required": ["b"],
                "properties": {
                    "a": {},
                    "b": {"$ref": "#/definitions/X", "description": "B."},
                    "c": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "e": {"x-kubernetes-int-or-string": true},
                },
            })
        );
    }
}
