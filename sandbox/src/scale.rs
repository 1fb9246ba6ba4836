//! The `scale` subresource: an `autoscaling/v1` Scale view of a Deployment or of a custom
//! resource whose CRD declares `subresources.scale`.

use serde_json::{Map, Value, json};

use crate::registry::ResourceType;
pub use crate::registry::ScalePaths;

fn pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |mut p, seg| {
            p.push('/');
            p.push_str(seg);
            p
        })
}

/// The Scale of `obj`.
pub fn to_scale(paths: &ScalePaths, obj: &Value) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let keep = [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ];
    let metadata: Map<String, Value> = meta
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| keep.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let spec_replicas = obj
        .pointer(&pointer(&paths.spec_replicas))
        .cloned()
        .unwrap_or(json!(0));
    let status_replicas = obj
        .pointer(&pointer(&paths.status_replicas))
        .cloned()
        .unwrap_or(json!(0));
    let mut status = json!({"replicas": status_replicas});
    let selector = if paths.selector_from_match_labels {
        obj.pointer("/spec/selector/matchLabels")
            .and_then(Value::as_object)
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
    } else {
        paths
            .label_selector
            .as_ref()
            .and_then(|p| obj.pointer(&pointer(p)))
            .and_then(Value::as_str)
            .map(String::from)
    };
    if let Some(selector) = selector {
        status["selector"] = json!(selector);
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": {"replicas": spec_replicas},
        "status": status,
    })
}

/// Sets the desired replicas of `obj`, creating the parent objects of the path if missing.
pub fn set_replicas(paths: &ScalePaths, obj: &mut Value, replicas: i64) {
    let segs: Vec<&str> = paths
        .spec_replicas
        .trim_start_matches('.')
        .split('.')
        .collect();
    let Some((last, parents)) = segs.split_last() else {
        return;
    };
    let mut cur = obj;
    for seg in parents {
        let map = crate::store::ensure_object(cur);
        cur = map.entry(seg.to_string()).or_insert_with(|| json!({}));
    }
    crate::store::ensure_object(cur).insert(last.to_string(), json!(replicas));
}

/// The scale paths of a kind, if it serves `/scale`.
pub fn paths(rt: &ResourceType) -> Option<&ScalePaths> {
    rt.scale.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_scale_shows_replicas_and_its_selector() {
        let paths = ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: None,
            selector_from_match_labels: true,
        };
        let mut d = json!({"metadata": {"name": "d", "labels": {"x": "y"}},
                           "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}}},
                           "status": {"replicas": 1}});
        let scale = to_scale(&paths, &d);
        assert_eq!(scale["spec"]["replicas"], 2);
        assert_eq!(scale["status"], json!({"replicas": 1, "selector": "app=d"}));
        assert!(scale["metadata"].get("labels").is_none());
        set_replicas(&paths, &mut d, 5);
        assert_eq!(d["spec"]["replicas"], 5);
    }
}
