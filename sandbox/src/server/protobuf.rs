//! Just enough of Kubernetes' protobuf encoding to read the reviews kubectl's typed clientset
//! sends as protobuf (`kubectl auth can-i`, `kubectl auth whoami`): the `k8s\0` envelope
//! (`runtime.Unknown`, `apimachinery/pkg/runtime/serializer/protobuf/protobuf.go`) and the
//! string fields of the review specs (`k8s.io/api/authorization/v1/generated.proto`).

use serde_json::{Map, Value, json};

const MAGIC: &[u8] = b"k8s\0";

/// One field of a message: its number and, for the length-delimited ones, its bytes.
struct Field<'a> {
    number: u64,
    bytes: Option<&'a [u8]>,
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
        let bytes = match key & 7 {
            0 => {
                varint(buf, &mut pos)?;
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
        out.push(Field { number, bytes });
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
