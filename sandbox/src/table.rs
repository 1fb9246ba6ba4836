//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for): the Name column, then a CRD's
//! `additionalPrinterColumns` (Age when it declares none, as the API server defaults them);
//! built-in kinds with a printer in `crate::printers` get its columns.

use serde_json::{Value, json};

use crate::printers::Printer;
pub use crate::printers::human_duration;
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

/// Evaluates the JSONPath forms printer columns use (fields, `[n]`, `[*]`, `[?(@.k=="v")]`)
/// and gives the first value found, None when nothing matches: the API server's table
/// convertor prints `results[0][0]` of client-go's `FindResults`
/// (`apiextensions-apiserver/pkg/registry/customresource/tableconvertor/tableconvertor.go`),
/// so `.status.addresses[*].value` shows the first address.
pub fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut found: Vec<&Value> = vec![obj];
    for seg in split_path(path) {
        let Some(inner) = seg.strip_prefix('[').and_then(|s| s.strip_suffix(']')) else {
            found = found.into_iter().filter_map(|v| v.get(&seg)).collect();
            continue;
        };
        let arrays: Vec<&Vec<Value>> = found.into_iter().filter_map(Value::as_array).collect();
        let items = arrays.iter().copied().flatten();
        found = if let Some(filter) = inner.strip_prefix("?(@.").and_then(|s| s.strip_suffix(')')) {
            let (key, value) = filter.split_once("==")?;
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
            let pointer = format!("/{}", key.trim().replace('.', "/"));
            items
                .filter(|item| {
                    item.pointer(&pointer).is_some_and(|v| match v {
                        Value::String(s) => s == value,
                        other => serde_json::to_string(other).is_ok_and(|t| t == value),
                    })
                })
                .collect()
        } else if inner.trim() == "*" {
            items.collect()
        } else {
            let index = inner.trim().parse::<usize>().ok()?;
            arrays.iter().filter_map(|a| a.get(index)).collect()
        };
    }
    found.first().map(|v| (*v).clone())
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

/// The row of one object: its cells and its metadata.
fn row(cells: Vec<Value>, obj: &Value) -> Value {
    json!({
        "cells": cells,
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        },
    })
}

/// A Table of `objects`: a built-in kind's own columns (`crate::printers`), else Name and the
/// printer columns.
pub fn table(rt: &ResourceType, objects: &[&Value], resource_version: u64) -> Value {
    if rt.crd.is_none()
        && let Some(printer) = Printer::for_kind(&rt.group, &rt.kind)
    {
        let rows: Vec<Value> = objects
            .iter()
            .map(|obj| row((printer.cells)(obj), obj))
            .collect();
        return json!({
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version.to_string()},
            "columnDefinitions": printer.definitions(),
            "rows": rows,
        });
    }
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
            row(cells, obj)
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
        assert_eq!(
            json_path(&obj, ".status.conditions[*].type"),
            Some(json!("A"))
        );
        assert_eq!(json_path(&obj, ".spec.replicas[*]"), None);
    }
}
