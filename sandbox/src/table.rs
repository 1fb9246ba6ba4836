//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for): the Name column, then a CRD's
//! `additionalPrinterColumns` (Age when it declares none, as the API server defaults them).

use serde_json::{Value, json};

pub use crate::registry::PrinterColumn;
use crate::registry::ResourceType;

fn split_path(path: &str) -> Vec<String> {
    let mut segs = Vec::new();
    let mut current = String::new();
    let mut depth = 0;
    for c in path.chars() {
        match c {
            '[' => {
                if depth == 0 && !current.is_empty() {
                    segs.push(std::mem::take(&mut current));
                }
                depth += 1;
                current.push(c);
            }
            ']' => {
                depth -= 1;
                current.push(c);
                if depth == 0 {
                    segs.push(std::mem::take(&mut current));
                }
            }
            '.' if depth == 0 => {
                if !current.is_empty() {
                    segs.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        segs.push(current);
    }
    segs
}

/// Evaluates the simple JSONPath forms printer columns use; None when nothing matches.
pub fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut cur = obj.clone();
    for seg in split_path(path) {
        if let Some(inner) = seg.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            let items = cur.as_array()?.clone();
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|s| s.strip_suffix(')')) {
                let (key, value) = filter.split_once("==")?;
                let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
                cur = items.into_iter().find(|item| {
                    item.pointer(&format!("/{}", key.trim().replace('.', "/")))
                        .is_some_and(|v| match v {
                            Value::String(s) => s == value,
                            other => serde_json::to_string(other).is_ok_and(|t| t == value),
                        })
                })?;
            } else {
                cur = items.get(inner.trim().parse::<usize>().ok()?)?.clone();
            }
        } else {
            cur = cur.get(&seg)?.clone();
        }
    }
    Some(cur)
}

/// `5s`, `3m20s`, `2d3h`... like the API server's human-readable durations.
pub fn human_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

fn cell(column: &PrinterColumn, obj: &Value) -> Value {
    let Some(value) = json_path(obj, &column.json_path) else {
        return Value::Null;
    };
    if column.type_ == "date" {
        let since = value
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| jiff::Timestamp::now().as_second() - t.as_second());
        return since.map_or(Value::Null, |s| json!(human_duration(s)));
    }
    match (&value, column.type_.as_str()) {
        (Value::String(_) | Value::Number(_) | Value::Bool(_), _) => value,
        (Value::Null, _) => Value::Null,
        (other, _) => json!(other.to_string()),
    }
}

/// A Table of `objects`.
pub fn table(rt: &ResourceType, objects: &[&Value], resource_version: u64) -> Value {
    let columns: Vec<PrinterColumn> = if rt.printer_columns.is_empty() {
        vec![PrinterColumn::age()]
    } else {
        rt.printer_columns.clone()
    };
    let mut definitions = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace.",
    })];
    definitions.extend(columns.iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": c.format,
               "description": c.description, "priority": c.priority})
    }));
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut cells = vec![
                obj.pointer("/metadata/name")
                    .cloned()
                    .unwrap_or(Value::Null),
            ];
            cells.extend(columns.iter().map(|c| cell(c, obj)));
            json!({
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
                },
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_follows_fields_indexes_and_filters() {
        let obj = json!({"spec": {"replicas": 3},
                         "status": {"conditions": [{"type": "A", "status": "False"},
                                                   {"type": "Ready", "status": "True"}]}});
        assert_eq!(json_path(&obj, ".spec.replicas"), Some(json!(3)));
        assert_eq!(
            json_path(&obj, ".status.conditions[0].type"),
            Some(json!("A"))
        );
        assert_eq!(
            json_path(&obj, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(json!("True"))
        );
        assert_eq!(json_path(&obj, ".spec.missing"), None);
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(3600), "60m");
        assert_eq!(human_duration(4 * 3600 + 60), "4h1m");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
    }
}
