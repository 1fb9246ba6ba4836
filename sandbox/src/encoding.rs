//! Built-in objects as kube-apiserver stores and serves them: decoded into their Go structs and
//! encoded back with `encoding/json`, so a field tagged `omitempty` that holds Go's zero value
//! is left out. `{"name": "A", "value": ""}` in a container's `env` reads back as
//! `{"name": "A"}`, while `Deployment.spec.replicas: 0` stays (a `*int32`), as do empty
//! structs (`resources: {}`) and pointers to zero values. A client that compares what it wrote
//! with what it reads back loops on a real cluster unless it writes what Go would.
//!
//! The Go facts come from a table generated from `k8s.io/api` and apimachinery's `meta/v1`
//! (`data/k8s-api/`): per struct reachable from the served built-in kinds, its JSON fields,
//! whether each is `omitempty` and its type (pointer, slice, map, struct, scalar, or a type
//! with its own `MarshalJSON`). Custom resources are unstructured JSON on a real server and are
//! not touched; neither is a field the table does not know.
//!
//! Go's rules (`isEmptyValue` in `encoding/json/encode.go`): `omitempty` omits `false`, `0`,
//! `""`, a nil pointer, interface, slice or map, and a slice or map of length 0 (`[]byte`, a
//! base64 string, included); never a struct value, whatever it holds. A JSON `null` decodes to
//! the zero value, so it goes too, except into a struct. `metav1.Time`, `MicroTime`,
//! `resource.Quantity`, `intstr.IntOrString`, `Duration` and `FieldsV1` are structs with their
//! own marshalers: never omitted, never walked.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{Map, Value};

/// The generated table (format in `data/k8s-api/README.md`).
const FIELDS: &str = include_str!("../data/k8s-api/fields.txt");

static TABLE: LazyLock<Table> = LazyLock::new(|| Table::parse(FIELDS));

/// Leaves out of a built-in object the `omitempty` fields that hold their zero value, as
/// encoding its Go struct does, in one walk guided by the table: nothing is copied, and an
/// object without such fields is left as it is. An object whose `apiVersion` and `kind` are
/// not a built-in kind of the table is not touched.
pub fn omit_empty(obj: &mut Value) {
    let table = &*TABLE;
    let Some(root) = table.root(obj) else {
        return;
    };
    if let Value::Object(map) = obj {
        table.walk_struct(map, root);
    }
}

/// Whether the table knows `apiVersion`/`kind` as a built-in kind.
pub fn is_modelled(api_version: &str, kind: &str) -> bool {
    TABLE
        .roots
        .iter()
        .any(|(v, k, _)| v == api_version && k == kind)
}

/// A field's Go type, as far as encoding it matters.
#[derive(Debug)]
enum Type {
    String,
    Bool,
    Number,
    /// `[]byte`: a base64 string, empty when the slice is.
    Bytes,
    /// A struct with its own `MarshalJSON` (`Time`, `Quantity`, ...).
    Opaque,
    Struct(usize),
    Pointer(Box<Type>),
    Slice(Box<Type>),
    Map(Box<Type>),
}

impl Type {
    /// Whether `encoding/json` leaves the value out of an `omitempty` field (after decoding
    /// it into the field). A value of another JSON type than the field's is kept: the sandbox
    /// does not refuse what a real server could not decode.
    fn omitted(&self, value: &Value) -> bool {
        match (self, value) {
            (Type::Struct(_) | Type::Opaque, _) => false,
            (_, Value::Null) => true,
            (Type::String | Type::Bytes, Value::String(s)) => s.is_empty(),
            (Type::Bool, Value::Bool(b)) => !b,
            (Type::Number, Value::Number(n)) => n.as_f64() == Some(0.0),
            (Type::Slice(_), Value::Array(items)) => items.is_empty(),
            (Type::Map(_), Value::Object(map)) => map.is_empty(),
            _ => false,
        }
    }

    /// Whether values of this type can hold structs to walk into.
    fn holds_structs(&self) -> bool {
        match self {
            Type::Struct(_) => true,
            Type::Pointer(inner) | Type::Slice(inner) | Type::Map(inner) => inner.holds_structs(),
            _ => false,
        }
    }
}

struct Field {
    omitempty: bool,
    ty: Type,
    /// [`Type::holds_structs`], worked out once.
    walk: bool,
}

/// The Go structs of the built-in kinds, by index, with their JSON fields.
struct Table {
    structs: Vec<HashMap<String, Field>>,
    /// apiVersion, kind and the struct of the served kinds.
    roots: Vec<(String, String, usize)>,
}

impl Table {
    /// Parses the table; it is compiled in, so a line it cannot read is a bug (a unit test
    /// parses it).
    fn parse(text: &str) -> Table {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let index: HashMap<&str, usize> = lines
            .iter()
            .filter(|l| !l.starts_with('@'))
            .enumerate()
            .map(|(i, l)| (l.split(' ').next().unwrap_or(""), i))
            .collect();
        let mut table = Table {
            structs: Vec::with_capacity(index.len()),
            roots: Vec::new(),
        };
        for line in lines {
            let mut words = line.split(' ');
            if let Some(api_version) = line.strip_prefix('@') {
                let parts: Vec<&str> = api_version.split(' ').collect();
                let [api_version, kind, name] = parts[..] else {
                    panic!("bad root line in the Go field table: {line}");
                };
                table
                    .roots
                    .push((api_version.into(), kind.into(), index[name]));
                continue;
            }
            words.next();
            let fields = words
                .map(|word| {
                    let (name, ty) = word
                        .split_once(':')
                        .unwrap_or_else(|| panic!("bad field {word} in the Go field table"));
                    let (name, omitempty) = match name.strip_suffix('?') {
                        Some(name) => (name, true),
                        None => (name, false),
                    };
                    let ty = parse_type(ty, &index);
                    let walk = ty.holds_structs();
                    (
                        name.to_owned(),
                        Field {
                            omitempty,
                            ty,
                            walk,
                        },
                    )
                })
                .collect();
            table.structs.push(fields);
        }
        // `metadata.managedFields: []` resets the entries, which the field manager tells from
        // none (`isResetManagedFields` in `managedfields/internal/fieldmanager.go` sees the Go
        // slice before it is encoded); the field manager writes the field afterwards.
        if let Some(field) = index
            .get("meta.ObjectMeta")
            .and_then(|at| table.structs[*at].get_mut("managedFields"))
        {
            field.omitempty = false;
        }
        table
    }

    fn root(&self, obj: &Value) -> Option<usize> {
        let api_version = obj.get("apiVersion")?.as_str()?;
        let kind = obj.get("kind")?.as_str()?;
        self.roots
            .iter()
            .find(|(v, k, _)| v == api_version && k == kind)
            .map(|(_, _, at)| *at)
    }

    fn walk_struct(&self, map: &mut Map<String, Value>, at: usize) {
        let fields = &self.structs[at];
        map.retain(|name, value| {
            let Some(field) = fields.get(name.as_str()) else {
                return true;
            };
            if field.omitempty && field.ty.omitted(value) {
                return false;
            }
            if field.walk {
                self.walk(value, &field.ty);
            }
            true
        });
    }

    fn walk(&self, value: &mut Value, ty: &Type) {
        match (ty, value) {
            (Type::Struct(at), Value::Object(map)) => self.walk_struct(map, *at),
            (Type::Pointer(inner), value) => self.walk(value, inner),
            (Type::Slice(inner), Value::Array(items)) => {
                for item in items {
                    self.walk(item, inner);
                }
            }
            (Type::Map(inner), Value::Object(map)) => {
                for item in map.values_mut() {
                    self.walk(item, inner);
                }
            }
            _ => {}
        }
    }
}

fn parse_type(ty: &str, index: &HashMap<&str, usize>) -> Type {
    if let Some(inner) = ty.strip_prefix('*') {
        return Type::Pointer(Box::new(parse_type(inner, index)));
    }
    if ty == "[]byte" {
        return Type::Bytes;
    }
    if let Some(inner) = ty.strip_prefix("[]") {
        return Type::Slice(Box::new(parse_type(inner, index)));
    }
    if let Some(inner) = ty.strip_prefix("map[string]") {
        return Type::Map(Box::new(parse_type(inner, index)));
    }
    if ty.starts_with('=') {
        return Type::Opaque;
    }
    match ty {
        "string" => Type::String,
        "bool" => Type::Bool,
        "int" | "int8" | "int16" | "int32" | "int64" | "uint" | "uint8" | "uint16" | "uint32"
        | "uint64" | "float32" | "float64" => Type::Number,
        name => Type::Struct(
            *index
                .get(name)
                .unwrap_or_else(|| panic!("unknown type {name} in the Go field table")),
        ),
    }
}

#[cfg(test)]
mod tests;
