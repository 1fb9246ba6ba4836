//! The patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the server-side
//! apply model.

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

/// Server-side apply for one manager: start from the current object, drop what this manager
/// applied last time and no longer applies (unless another manager applies it), then merge the
/// new configuration (maps merge, lists and scalars replace).
pub fn apply(
    current: &Value,
    previous: Option<&Value>,
    others: &[&Value],
    config: &Value,
) -> Value {
    let mut result = current.clone();
    if let Some(previous) = previous {
        drop_unapplied(&mut result, previous, config, others, 0);
    }
    deep_merge(&mut result, config);
    result
}

fn drop_unapplied(
    result: &mut Value,
    previous: &Value,
    config: &Value,
    others: &[&Value],
    depth: usize,
) {
    let (Value::Object(prev), Value::Object(res)) = (previous, &mut *result) else {
        return;
    };
    for (key, prev_value) in prev {
        // Identity fields are never removed by apply.
        if depth == 0 && matches!(key.as_str(), "apiVersion" | "kind") {
            continue;
        }
        let other_values: Vec<&Value> = others.iter().filter_map(|o| o.get(key)).collect();
        match config.get(key) {
            Some(new_value) => {
                if prev_value.is_object()
                    && new_value.is_object()
                    && let Some(child) = res.get_mut(key)
                {
                    drop_unapplied(child, prev_value, new_value, &other_values, depth + 1);
                }
            }
            None => {
                if other_values.is_empty() {
                    res.remove(key);
                } else if prev_value.is_object() {
                    // Another manager shares this map: remove only our own leaves below it.
                    if let Some(child) = res.get_mut(key) {
                        drop_unapplied(
                            child,
                            prev_value,
                            &Value::Object(Map::new()),
                            &other_values,
                            depth + 1,
                        );
                    }
                }
            }
        }
    }
}

fn deep_merge(target: &mut Value, config: &Value) {
    match (target, config) {
        (Value::Object(t), Value::Object(c)) => {
            for (key, value) in c {
                if value.is_null() {
                    t.remove(key);
                    continue;
                }
                match t.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        deep_merge(existing, value)
                    }
                    _ => {
                        t.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (target, config) => *target = config.clone(),
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
    fn apply_drops_fields_the_manager_stopped_applying() {
        let current =
            json!({"spec": {"a": 1, "b": 2, "c": 3}, "metadata": {"labels": {"x": "1", "y": "2"}}});
        let previous = json!({"spec": {"a": 1, "b": 2}, "metadata": {"labels": {"x": "1"}}});
        let config = json!({"spec": {"a": 5}, "metadata": {"labels": {"z": "3"}}});
        let out = apply(&current, Some(&previous), &[], &config);
        assert_eq!(
            out,
            json!({"spec": {"a": 5, "c": 3}, "metadata": {"labels": {"y": "2", "z": "3"}}})
        );
    }

    #[test]
    fn apply_keeps_fields_another_manager_applies() {
        let current = json!({"spec": {"a": 1, "b": 2}});
        let previous = json!({"spec": {"a": 1, "b": 2}});
        let other = json!({"spec": {"b": 2}});
        let out = apply(
            &current,
            Some(&previous),
            &[&other],
            &json!({"spec": {"a": 1}}),
        );
        assert_eq!(out, json!({"spec": {"a": 1, "b": 2}}));
    }
}
