//! The patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge
//! patch. Server-side apply lives in `managed` and `fields`.

use serde_json::{Map, Value};

/// Applies an RFC 7386 merge patch in place.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn parse_pointer(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!(
            "invalid JSON pointer {path:?}: must start with '/'"
        ));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn lookup<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn lookup_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(move |i| a.get_mut(i)),
        _ => None,
    })
}

fn add(doc: &mut Value, tokens: &[String], value: Value, path: &str) -> Result<(), String> {
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match lookup_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            if last == "-" {
                a.push(value);
                return Ok(());
            }
            match last.parse::<usize>() {
                Ok(i) if i <= a.len() => {
                    a.insert(i, value);
                    Ok(())
                }
                _ => Err(format!(
                    "add operation does not apply: index out of range at {path:?}"
                )),
            }
        }
        _ => Err(format!(
            "add operation does not apply: doc is missing path: {path:?}"
        )),
    }
}

fn remove(doc: &mut Value, tokens: &[String], path: &str) -> Result<Value, String> {
    let missing = || format!("remove operation does not apply: doc is missing path: {path:?}");
    let Some((last, parent)) = tokens.split_last() else {
        return Err("remove operation cannot remove the whole document".into());
    };
    match lookup_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last).ok_or_else(missing),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

/// Applies an RFC 6902 JSON patch. A `test` of `null` on a missing path succeeds, as in the API
/// server (kube's finalizer helper relies on it).
pub fn json_patch(doc: &Value, ops: &Value) -> Result<Value, String> {
    let Some(ops) = ops.as_array() else {
        return Err("json patch must be a JSON array of operations".into());
    };
    let mut doc = doc.clone();
    for op in ops {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("operation has no \"op\"")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{name} operation has no \"path\""))?;
        let tokens = parse_pointer(path)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("{name} operation has no \"value\""))
        };
        let from = || -> Result<(String, Vec<String>), String> {
            let from = op
                .get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{name} operation has no \"from\""))?;
            Ok((from.to_string(), parse_pointer(from)?))
        };
        match name {
            "add" => add(&mut doc, &tokens, value()?, path)?,
            "remove" => {
                remove(&mut doc, &tokens, path)?;
            }
            "replace" => {
                if lookup(&doc, &tokens).is_none() {
                    return Err(format!(
                        "replace operation does not apply: doc is missing key: {path}"
                    ));
                }
                if tokens.is_empty() {
                    doc = value()?;
                } else {
                    let v = value()?;
                    if let Some(target) = lookup_mut(&mut doc, &tokens) {
                        *target = v;
                    }
                }
            }
            "move" => {
                let (from_path, from_tokens) = from()?;
                let v = remove(&mut doc, &from_tokens, &from_path)?;
                add(&mut doc, &tokens, v, path)?;
            }
            "copy" => {
                let (from_path, from_tokens) = from()?;
                let v = lookup(&doc, &from_tokens).cloned().ok_or_else(|| {
                    format!(
                        "copy operation does not apply: doc is missing from path: {from_path:?}"
                    )
                })?;
                add(&mut doc, &tokens, v, path)?;
            }
            "test" => {
                let expected = value()?;
                let ok = match lookup(&doc, &tokens) {
                    Some(actual) => *actual == expected,
                    None => expected.is_null(),
                };
                if !ok {
                    return Err(format!("testing value {path} failed: test failed"));
                }
            }
            other => return Err(format!("unexpected kind of operation: {other:?}")),
        }
    }
    Ok(doc)
}

/// The merge key of a list field, by field name (the sandbox has no per-kind schema; these are
/// the keyed lists of the built-in kinds an operator's children use, and a webhook
/// configuration's `webhooks`). `None`: the list is
/// replaced. `Some("")`: a list of scalars merged as a set (finalizers).
fn merge_key(field: &str, elements: &[Value]) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "webhooks" => Some("name"),
        "ports" => {
            if elements.iter().any(|e| e.get("containerPort").is_some()) {
                Some("containerPort")
            } else {
                Some("port")
            }
        }
        "finalizers" => Some(""),
        _ => None,
    }
}

/// Applies a strategic merge patch, approximating the API server without per-kind schemas:
/// maps merge, the keyed lists of [`merge_key`] merge by key, other lists are replaced, and the
/// directives `$patch` (replace/delete/merge), `$setElementOrder/<list>`,
/// `$deleteFromPrimitiveList/<list>` and `$retainKeys` are honoured rather than stored.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    match patch_map.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch.clone();
            strip_directives(&mut replaced);
            *target = replaced;
            return;
        }
        Some("delete") => {
            *target = Value::Null;
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else {
        return;
    };
    for (key, value) in patch_map {
        if key.starts_with('$') {
            if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/")
                && let (Some(Value::Array(items)), Some(remove)) =
                    (map.get_mut(field), value.as_array())
            {
                items.retain(|i| !remove.contains(i));
            }
            continue;
        }
        if value.is_null() {
            map.remove(key);
            continue;
        }
        match (map.get_mut(key), value) {
            (Some(existing), Value::Object(_)) if existing.is_object() => {
                strategic_merge_patch(existing, value);
                if existing.is_null() {
                    map.remove(key);
                }
            }
            (Some(Value::Array(existing)), Value::Array(items)) => match merge_key(key, items) {
                Some("") => {
                    for item in items {
                        if !existing.contains(item) {
                            existing.push(item.clone());
                        }
                    }
                }
                Some(merge_key) => merge_keyed_list(existing, items, merge_key),
                None => {
                    let mut replaced = value.clone();
                    strip_directives(&mut replaced);
                    map.insert(key.clone(), replaced);
                }
            },
            _ => {
                let mut new = value.clone();
                strip_directives(&mut new);
                map.insert(key.clone(), new);
            }
        }
        if let Some(Value::Array(order)) = patch_map.get(&format!("$setElementOrder/{key}"))
            && let Some(Value::Array(items)) = map.get_mut(key)
        {
            reorder(items, order, merge_key(key, order).unwrap_or(""));
        }
    }
    if let Some(Value::Array(retain)) = patch_map.get("$retainKeys") {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        map.retain(|k, _| keep.contains(&k.as_str()));
    }
}

fn merge_keyed_list(existing: &mut Vec<Value>, items: &[Value], key: &str) {
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *existing = items
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .map(|mut i| {
                strip_directives(&mut i);
                i
            })
            .collect();
        return;
    }
    for item in items {
        let id = item.get(key);
        let position = id.and_then(|id| existing.iter().position(|e| e.get(key) == Some(id)));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                existing.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge_patch(&mut existing[i], item),
            (None, false) => {
                let mut new = item.clone();
                strip_directives(&mut new);
                existing.push(new);
            }
        }
    }
}

fn reorder(items: &mut [Value], order: &[Value], key: &str) {
    let rank = |item: &Value| {
        order.iter().position(|o| {
            if key.is_empty() {
                o == item
            } else {
                o.get(key).is_some() && o.get(key) == item.get(key)
            }
        })
    };
    // Stable: listed elements in the given order, unlisted ones after, as they were.
    items.sort_by_key(|item| rank(item).unwrap_or(usize::MAX));
}

fn strip_directives(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            for v in map.values_mut() {
                strip_directives(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_removes_nulls_and_merges_maps() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge_patch(&mut doc, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(doc, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }

    #[test]
    fn json_patch_test_of_null_on_a_missing_path_succeeds() {
        let doc = json!({"metadata": {}});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"metadata": {"finalizers": ["x"]}}));
    }

    #[test]
    fn json_patch_test_of_a_wrong_value_fails() {
        let doc = json!({"a": 1});
        assert!(json_patch(&doc, &json!([{"op": "test", "path": "/a", "value": 2}])).is_err());
        assert!(json_patch(&doc, &json!([{"op": "test", "path": "/b", "value": 2}])).is_err());
    }

    #[test]
    fn json_patch_supports_remove_replace_move_copy_and_append() {
        let doc = json!({"a": [1, 2], "b": {"c": 1}});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "add", "path": "/a/-", "value": 3},
                {"op": "remove", "path": "/a/0"},
                {"op": "replace", "path": "/b/c", "value": 5},
                {"op": "copy", "from": "/b/c", "path": "/d"},
                {"op": "move", "from": "/d", "path": "/e"}
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"a": [2, 3], "b": {"c": 5}, "e": 5}));
        assert!(json_patch(&doc, &json!([{"op": "remove", "path": "/zz"}])).is_err());
    }

    #[test]
    fn strategic_merge_patch_merges_containers_by_name_and_honours_directives() {
        let mut doc = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "ports": [{"containerPort": 80, "protocol": "TCP"}]},
            {"name": "b", "image": "b:1"}
        ]}}}, "metadata": {"finalizers": ["x"]}});
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                "containers": [{"name": "a", "image": "a:2"}, {"name": "b", "$patch": "delete"}]
            }}}, "metadata": {"finalizers": ["y"]}}),
        );
        assert_eq!(
            doc,
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "a", "image": "a:2", "ports": [{"containerPort": 80, "protocol": "TCP"}]}
            ]}}}, "metadata": {"finalizers": ["x", "y"]}})
        );
    }

    #[test]
    fn strategic_merge_patch_replaces_unkeyed_lists_and_removes_nulls() {
        let mut doc = json!({"data": {"a": "1", "b": "2"}, "args": ["x", "y"]});
        strategic_merge_patch(&mut doc, &json!({"data": {"a": null}, "args": ["z"]}));
        assert_eq!(doc, json!({"data": {"b": "2"}, "args": ["z"]}));
    }
}
