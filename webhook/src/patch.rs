//! Add-only JSON Patch (RFC 6902) computed against the raw request object.
//!
//! A mutating rule edits a typed value; serialising the typed value back would drop every field
//! the type does not know. So the patch is computed from three documents: `before` (the typed
//! value as parsed from the raw object, serialised), `after` (the same, after the rule ran), and
//! `raw` (the object exactly as the API server sent it). What changed between `before` and
//! `after` is expressed as `add` operations that apply to `raw`:
//!
//! - an object member that `raw` lacks (or holds as `null`) is added; if its parent is absent
//!   too, the highest absent parent is added holding only what the rule changed (never the typed
//!   defaults around it);
//! - array elements appended by the rule are added one by one at their index (the array is never
//!   replaced whole), and changes inside existing elements recurse;
//! - anything else (a removed member or element, a changed scalar, a changed type) is not
//!   add-only and is refused with [`NotAddOnly`]: it is a bug in the rule, not in the request.
//!
//! Fields `raw` has and the type does not know are never visited, so they survive byte for byte.

use serde::Serialize;
use serde_json::{Map, Value};

/// One `add` operation of a JSON Patch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AddOp {
    /// Always `"add"`.
    pub op: &'static str,
    /// JSON Pointer (RFC 6901) of the location to add.
    pub path: String,
    /// The value to add.
    pub value: Value,
}

/// The rule changed something that an add-only patch cannot express.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("mutation at {path} is not add-only: {what}")]
pub struct NotAddOnly {
    /// JSON Pointer of the offending location.
    pub path: String,
    /// What the rule did there.
    pub what: &'static str,
}

/// Computes the add-only patch that turns `raw` into `raw` plus the rule's additions.
///
/// `before` and `after` are the typed value serialised before and after the rule ran; `raw` is
/// the request object. An empty result means the rule changed nothing.
pub fn add_only(before: &Value, after: Value, raw: &Value) -> Result<Vec<AddOp>, NotAddOnly> {
    let mut ops = Vec::new();
    let mut path = String::new();
    walk(&mut path, before, after, Some(raw), &mut ops)?;
    Ok(ops)
}

fn walk(
    path: &mut String,
    before: &Value,
    after: Value,
    raw: Option<&Value>,
    ops: &mut Vec<AddOp>,
) -> Result<(), NotAddOnly> {
    if *before == after {
        return Ok(());
    }
    let raw = match raw {
        None | Some(Value::Null) => {
            ops.push(AddOp {
                op: "add",
                path: path.clone(),
                value: changed_part(before, after),
            });
            return Ok(());
        }
        Some(raw) => raw,
    };
    // A typed value that skips serialising when empty (`skip_serializing_if = "Vec::is_empty"`)
    // is absent from `before` while the request holds `[]` or `{}`: compare with those instead.
    let before = match raw {
        Value::Array(a) if before.is_null() && a.is_empty() => raw,
        Value::Object(o) if before.is_null() && o.is_empty() => raw,
        _ => before,
    };
    if *before == after {
        return Ok(());
    }
    let refuse = |path: &String, what| {
        Err(NotAddOnly {
            path: path.clone(),
            what,
        })
    };
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => {
            let Value::Object(raw) = raw else {
                return refuse(path, "the request holds a non-object here");
            };
            if before.keys().any(|key| !after.contains_key(key)) {
                return refuse(path, "a member was removed");
            }
            let len = path.len();
            for (key, value) in after {
                push_token(path, &key);
                walk(
                    path,
                    before.get(&key).unwrap_or(&Value::Null),
                    value,
                    raw.get(&key),
                    ops,
                )?;
                path.truncate(len);
            }
            Ok(())
        }
        (Value::Array(before), Value::Array(after)) => {
            let Value::Array(raw) = raw else {
                return refuse(path, "the request holds a non-array here");
            };
            if after.len() < before.len() {
                return refuse(path, "an element was removed");
            }
            if raw.len() != before.len() {
                return refuse(path, "the typed array does not align with the request's");
            }
            let len = path.len();
            for (index, value) in after.into_iter().enumerate() {
                push_index(path, index);
                match before.get(index) {
                    Some(old) => walk(path, old, value, raw.get(index), ops)?,
                    None => ops.push(AddOp {
                        op: "add",
                        path: path.clone(),
                        value,
                    }),
                }
                path.truncate(len);
            }
            Ok(())
        }
        (Value::Null, _) => refuse(path, "a field unknown to the type was set"),
        _ => refuse(path, "a value was changed"),
    }
}

/// What to add where the request has nothing: only the members the rule changed, recursively,
/// so typed defaults (empty strings, zeros) are never written into the object.
fn changed_part(before: &Value, after: Value) -> Value {
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => Value::Object(
            after
                .into_iter()
                .filter_map(|(key, value)| match before.get(&key) {
                    Some(old) if *old == value => None,
                    Some(old) => Some((key, changed_part(old, value))),
                    None => Some((key, value)),
                })
                .collect::<Map<_, _>>(),
        ),
        (_, after) => after,
    }
}

fn push_token(path: &mut String, token: &str) {
    path.push('/');
    for c in token.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

fn push_index(path: &mut String, index: usize) {
    use std::fmt::Write as _;
    let _ = write!(path, "/{index}");
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn patch(before: Value, after: Value, raw: Value) -> Result<Value, NotAddOnly> {
        add_only(&before, after, &raw).map(|ops| serde_json::to_value(ops).unwrap())
    }

    #[test]
    fn an_absent_parent_is_created_with_only_the_changed_members() {
        let before = json!({"spec": {"image": "", "port": 0}});
        let after = json!({"spec": {"image": "", "port": 0, "env": [{"name": "A"}]}});
        let raw = json!({"metadata": {"name": "x"}});
        assert_eq!(
            patch(before, after, raw).unwrap(),
            json!([{"op": "add", "path": "/spec", "value": {"env": [{"name": "A"}]}}])
        );
    }

    #[test]
    fn appended_elements_are_added_one_by_one_after_the_existing_ones() {
        let before = json!({"env": [{"name": "A"}]});
        let after = json!({"env": [{"name": "A"}, {"name": "B"}, {"name": "C"}]});
        let raw = json!({"env": [{"name": "A", "unknown": 1}]});
        assert_eq!(
            patch(before, after, raw).unwrap(),
            json!([
                {"op": "add", "path": "/env/1", "value": {"name": "B"}},
                {"op": "add", "path": "/env/2", "value": {"name": "C"}},
            ])
        );
    }

    #[test]
    fn a_null_member_in_the_request_counts_as_absent() {
        let before = json!({"replicas": null});
        let after = json!({"replicas": 1});
        let raw = json!({"replicas": null});
        assert_eq!(
            patch(before, after, raw).unwrap(),
            json!([{"op": "add", "path": "/replicas", "value": 1}])
        );
    }

    #[test]
    fn pointer_tokens_are_escaped() {
        let before = json!({"labels": {}});
        let after = json!({"labels": {"a/b~c": "x"}});
        let raw = json!({"labels": {}});
        assert_eq!(
            patch(before, after, raw).unwrap(),
            json!([{"op": "add", "path": "/labels/a~1b~0c", "value": "x"}])
        );
    }

    #[test]
    fn changing_or_removing_is_refused() {
        let raw = json!({"a": 1, "b": [1, 2]});
        let changed = patch(json!({"a": 1}), json!({"a": 2}), raw.clone()).unwrap_err();
        assert_eq!(changed.path, "/a");
        let removed = patch(json!({"b": [1, 2]}), json!({"b": [1]}), raw.clone()).unwrap_err();
        assert_eq!(removed.path, "/b");
        let dropped = patch(json!({"a": 1}), json!({}), raw).unwrap_err();
        assert_eq!(dropped.what, "a member was removed");
    }

    #[test]
    fn an_empty_container_skipped_by_the_type_is_appended_to() {
        let before = json!({"spec": {}});
        let after = json!({"spec": {"env": [{"name": "A"}]}});
        let raw = json!({"spec": {"env": []}});
        assert_eq!(
            patch(before, after, raw).unwrap(),
            json!([{"op": "add", "path": "/spec/env/0", "value": {"name": "A"}}])
        );
    }

    #[test]
    fn no_change_gives_no_operation() {
        let value = json!({"a": [1, {"b": null}]});
        assert_eq!(
            patch(value.clone(), value.clone(), value).unwrap(),
            json!([])
        );
    }
}
