//! The CEL declaration of a schema node, as k8s.io/apiserver `pkg/cel/common/schemas.go`
//! (`SchemaDeclType`) derives it: the CEL type, the most elements (string length, list items,
//! map entries) a value can have in a request of the maximum size, and the smallest size it
//! serializes to (which bounds how many of it fit in one request).

use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::Value;

pub(crate) use crate::schema::escape;
use crate::schema::strings;

/// kube-apiserver's maximum request size (`k8s.io/apiserver/pkg/apis/cel/config.go`).
pub const MAX_REQUEST_SIZE_BYTES: u64 = 3 * 1024 * 1024;

/// A CEL type as far as cost estimation and field checks need it.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    Null,
    /// A list with its element's declaration when known.
    List(Option<Rc<Decl>>),
    /// A map with its value's declaration when known.
    Map(Option<Rc<Decl>>),
    /// An object of a schema, with its declared fields (CEL-escaped names).
    Object(BTreeMap<String, Rc<Decl>>),
    /// `x-kubernetes-int-or-string` and anything not known statically.
    Dyn,
}

/// A schema node as CEL sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decl {
    pub ty: Ty,
    /// `MaxElements`: 0 for scalars and objects.
    pub max_elements: u64,
    /// `MinSerializedSize`.
    pub min_size: u64,
    /// Whether the size estimator answers for values of this node (`max_elements` is their
    /// size); apiextensions' answers for every schema node.
    pub sized: bool,
}

impl Decl {
    /// A scalar or object: no elements.
    pub fn simple(ty: Ty, min_size: u64) -> Self {
        Decl {
            ty,
            max_elements: 0,
            min_size,
            sized: true,
        }
    }
}

/// `SchemaDeclType(s, isResourceRoot)`; `None` where the real function declares nothing.
pub fn decl(s: &Value, resource_root: bool) -> Option<Rc<Decl>> {
    let flag = |key: &str| s.get(key) == Some(&Value::Bool(true));
    let max = MAX_REQUEST_SIZE_BYTES;
    if flag("x-kubernetes-int-or-string") {
        return Some(Rc::new(Decl {
            ty: Ty::Dyn,
            max_elements: max - 2,
            min_size: 1,
            sized: true,
        }));
    }
    let int = |key: &str| s.get(key).and_then(Value::as_i64).map(|n| n.max(0) as u64);
    let decl = match s.get("type").and_then(Value::as_str).unwrap_or("") {
        "array" => {
            let items = s.get("items")?;
            let item = decl(items, is_embedded(items))?;
            let max_items = int("maxItems").unwrap_or((max - 2) / (item.min_size + 1));
            Decl {
                ty: Ty::List(Some(item)),
                max_elements: max_items,
                min_size: 2,
                sized: true,
            }
        }
        "object" => {
            if let Some(additional) = s.get("additionalProperties").filter(|a| a.is_object()) {
                let value = decl(additional, is_embedded(additional))?;
                let max_props = int("maxProperties").unwrap_or((max - 2) / (value.min_size + 6));
                Decl {
                    ty: Ty::Map(Some(value)),
                    max_elements: max_props,
                    min_size: 2,
                    sized: true,
                }
            } else {
                object(s, resource_root)
            }
        }
        "string" => string(s),
        "boolean" => Decl::simple(Ty::Bool, 4),
        "number" => Decl::simple(Ty::Double, 1),
        "integer" => Decl::simple(Ty::Int, 1),
        _ => return None,
    };
    Some(Rc::new(decl))
}

fn is_embedded(s: &Value) -> bool {
    s.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
}

fn object(s: &Value, resource_root: bool) -> Decl {
    let required = strings(s, "required");
    let mut fields = BTreeMap::new();
    let mut min_size = 2;
    for (name, prop) in s
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let Some(field) = decl(prop, is_embedded(prop)) else {
            continue;
        };
        if required.contains(&name.as_str()) && prop.get("default").is_none() {
            min_size += name.len() as u64 + field.min_size + 4;
        }
        if let Some(escaped) = escape(name) {
            fields.insert(escaped, field);
        }
    }
    if resource_root {
        // WithTypeAndObjectMeta: a resource always has these, whatever its schema says.
        let string = || Rc::new(string(&Value::Null));
        fields.insert("kind".into(), string());
        fields.insert("apiVersion".into(), string());
        let meta = BTreeMap::from([
            ("name".to_owned(), string()),
            ("generateName".to_owned(), string()),
        ]);
        fields.insert(
            "metadata".into(),
            Rc::new(Decl::simple(Ty::Object(meta), 2)),
        );
    }
    Decl::simple(Ty::Object(fields), min_size)
}

fn string(s: &Value) -> Decl {
    let max = MAX_REQUEST_SIZE_BYTES - 2;
    let max_length = s
        .get("maxLength")
        .and_then(Value::as_i64)
        .map(|n| n.max(0) as u64);
    let format = s.get("format").and_then(Value::as_str).unwrap_or("");
    let (ty, min_size, max_elements) = match format {
        "byte" => (Ty::Bytes, 2, max_length.unwrap_or(max)),
        "duration" => (Ty::Duration, 3, 32),
        "date" => (Ty::Timestamp, 12, 12),
        "date-time" => (Ty::Timestamp, 21, 32),
        _ => {
            let enum_max = s.get("enum").and_then(Value::as_array).map(|values| {
                values
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|v| v.len() as u64)
                    .max()
                    .unwrap_or(0)
            });
            // maxLength counts characters; a character is up to 4 bytes.
            let max_elements = max_length.map(|n| n * 4).or(enum_max).unwrap_or(max);
            (Ty::String, 2, max_elements)
        }
    };
    Decl {
        ty,
        max_elements,
        min_size,
        sized: true,
    }
}
