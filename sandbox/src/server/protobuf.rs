//! Just enough of Kubernetes' protobuf encoding to read what kubectl's typed clientset sends as
//! protobuf: the reviews (`kubectl auth can-i`, `kubectl auth whoami`) and the Namespaces,
//! ConfigMaps and Secrets of `kubectl create namespace|configmap|secret generic`. The `k8s\0`
//! envelope is `runtime.Unknown` (`apimachinery/pkg/runtime/serializer/protobuf/protobuf.go`);
//! the messages are `k8s.io/api/{core,authorization}/v1/generated.proto` and
//! `apimachinery/pkg/apis/meta/v1/generated.proto` (`ObjectMeta`).

use serde_json::{Map, Value, json};

const MAGIC: &[u8] = b"k8s\0";

/// One field of a message: its number and, for the length-delimited ones, its bytes (for
/// varints, the value).
struct Field<'a> {
    number: u64,
    bytes: Option<&'a [u8]>,
    varint: Option<u64>,
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos).ok_or("truncated protobuf varint")?;
        *pos += 1;
        out |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err("protobuf varint too long".into())
}

fn fields(buf: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let number = key >> 3;
        let mut value = None;
        let bytes = match key & 7 {
            0 => {
                value = Some(varint(buf, &mut pos)?);
                None
            }
            1 => {
                pos += 8;
                None
            }
            5 => {
                pos += 4;
                None
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).map_err(|e| e.to_string())?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len());
                let end = end.ok_or("truncated protobuf field")?;
                let bytes = &buf[pos..end];
                pos = end;
                Some(bytes)
            }
            other => return Err(format!("unsupported protobuf wire type {other}")),
        };
        out.push(Field {
            number,
            bytes,
            varint: value,
        });
    }
    if pos > buf.len() {
        return Err("truncated protobuf field".into());
    }
    Ok(out)
}

fn message(buf: &[u8], number: u64) -> Result<Option<&[u8]>, String> {
    Ok(fields(buf)?
        .into_iter()
        .filter(|f| f.number == number)
        .find_map(|f| f.bytes))
}

/// The named string fields of a message, as a JSON object (numbers not named are skipped).
fn strings(buf: &[u8], names: &[(u64, &str)]) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for f in fields(buf)? {
        if let (Some((_, name)), Some(bytes)) =
            (names.iter().find(|(n, _)| *n == f.number), f.bytes)
        {
            out.insert((*name).to_string(), json!(String::from_utf8_lossy(bytes)));
        }
    }
    Ok(out)
}

/// A review of `kind` sent as protobuf, as the JSON object the review handler reads.
pub(super) fn decode_review(kind: &str, body: &[u8]) -> Result<Value, String> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or("the protobuf body lacks the k8s envelope")?;
    let raw = message(envelope, 2)?.unwrap_or_default();
    let Some(spec) = message(raw, 2)? else {
        return Ok(json!({}));
    };
    let mut out = Map::new();
    if let Some(r) = message(spec, 1)? {
        let names = [
            (1, "namespace"),
            (2, "verb"),
            (3, "group"),
            (4, "version"),
            (5, "resource"),
            (6, "subresource"),
            (7, "name"),
        ];
        out.insert(
            "resourceAttributes".into(),
            Value::Object(strings(r, &names)?),
        );
    }
    if let Some(n) = message(spec, 2)? {
        let names = [(1, "path"), (2, "verb")];
        out.insert(
            "nonResourceAttributes".into(),
            Value::Object(strings(n, &names)?),
        );
    }
    if kind == "SubjectAccessReview" {
        let mut who = strings(spec, &[(3, "user"), (6, "uid")])?;
        let groups: Vec<Value> = fields(spec)?
            .into_iter()
            .filter(|f| f.number == 4)
            .filter_map(|f| f.bytes)
            .map(|b| json!(String::from_utf8_lossy(b)))
            .collect();
        who.insert("groups".into(), Value::Array(groups));
        out.extend(who);
    }
    Ok(json!({"spec": out}))
}

/// A `map<string, string>` (or `map<string, bytes>` as base64, the JSON form of bytes) field.
fn map(buf: &[u8], number: u64, bytes_values: bool) -> Result<Option<Value>, String> {
    let mut out = Map::new();
    for entry in fields(buf)?.into_iter().filter(|f| f.number == number) {
        let entry = entry.bytes.unwrap_or_default();
        let key = message(entry, 1)?.unwrap_or_default();
        let value = message(entry, 2)?.unwrap_or_default();
        let value = if bytes_values {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(value)
        } else {
            String::from_utf8_lossy(value).into_owned()
        };
        out.insert(String::from_utf8_lossy(key).into_owned(), json!(value));
    }
    Ok((!out.is_empty()).then_some(Value::Object(out)))
}

/// A repeated string field, if present.
fn string_list(buf: &[u8], number: u64) -> Result<Option<Value>, String> {
    let items: Vec<Value> = fields(buf)?
        .into_iter()
        .filter(|f| f.number == number)
        .filter_map(|f| f.bytes)
        .map(|b| json!(String::from_utf8_lossy(b)))
        .collect();
    Ok((!items.is_empty()).then_some(Value::Array(items)))
}

/// A bool field, if present.
fn boolean(buf: &[u8], number: u64) -> Result<Option<Value>, String> {
    Ok(fields(buf)?
        .into_iter()
        .find(|f| f.number == number)
        .and_then(|f| f.varint)
        .map(|v| json!(v != 0)))
}

/// `ObjectMeta`'s fields a client sets on create (server-set ones are ignored there anyway).
fn object_meta(buf: &[u8]) -> Result<Value, String> {
    let mut meta = strings(
        buf,
        &[
            (1, "name"),
            (2, "generateName"),
            (3, "namespace"),
            (5, "uid"),
            (6, "resourceVersion"),
        ],
    )?;
    for (number, name) in [(11, "labels"), (12, "annotations")] {
        if let Some(m) = map(buf, number, false)? {
            meta.insert(name.into(), m);
        }
    }
    if let Some(finalizers) = string_list(buf, 14)? {
        meta.insert("finalizers".into(), finalizers);
    }
    Ok(Value::Object(meta))
}

/// A core `v1` Namespace, ConfigMap or Secret sent as protobuf, as its JSON object; `None`
/// for other kinds (which the sandbox does not decode).
pub(super) fn decode_object(kind: &str, body: &[u8]) -> Result<Option<Value>, String> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or("the protobuf body lacks the k8s envelope")?;
    let raw = message(envelope, 2)?.unwrap_or_default();
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!("v1"));
    out.insert("kind".into(), json!(kind));
    if let Some(meta) = message(raw, 1)? {
        out.insert("metadata".into(), object_meta(meta)?);
    }
    let mut put = |name: &str, value: Option<Value>| {
        if let Some(value) = value {
            out.insert(name.into(), value);
        }
    };
    match kind {
        "Namespace" => {
            if let Some(spec) = message(raw, 2)? {
                let finalizers = string_list(spec, 1)?;
                put("spec", Some(json!({})));
                if let Some(f) = finalizers {
                    put("spec", Some(json!({"finalizers": f})));
                }
            }
        }
        "ConfigMap" => {
            put("data", map(raw, 2, false)?);
            put("binaryData", map(raw, 3, true)?);
            put("immutable", boolean(raw, 4)?);
        }
        "Secret" => {
            put("data", map(raw, 2, true)?);
            put("type", strings(raw, &[(3, "type")])?.remove("type"));
            put("stringData", map(raw, 4, false)?);
            put("immutable", boolean(raw, 5)?);
        }
        _ => return Ok(None),
    }
    Ok(Some(Value::Object(out)))
}
