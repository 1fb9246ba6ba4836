//! The ReplicaSet controller (`pkg/controller/replicaset/replica_set.go`,
//! `replica_set_utils.go`): as many Pods as `spec.replicas`, made from the template and owned by
//! the ReplicaSet, the surplus removed least-ready and newest first; and the ReplicaSet's status
//! counted from its Pods.

use serde_json::{Map, Value, json};

use super::{
    controlled, controller_reference, deleting, int, kubelet, random_suffix, stamp_created,
};
use crate::store::{EventType, State, meta_str};

const PODS: (&str, &str) = ("", "pods");

/// Creates or deletes Pods until the ReplicaSet has `spec.replicas` of them, then writes its
/// status. Returns the names of the Pods created (for the kubelet to start).
pub(crate) fn sync(state: &mut State, ns: &str, name: &str) -> Vec<String> {
    let (Some(rs_rt), Some(pod_rt)) = (
        state.registry.get("apps", "v1", "replicasets"),
        state.registry.get("", "v1", "pods"),
    ) else {
        return Vec::new();
    };
    let Some(rs) = state.get(&rs_rt.storage(), ns, name).cloned() else {
        return Vec::new();
    };
    let uid = meta_str(&rs, "uid").unwrap_or("").to_string();
    let mut pods: Vec<Value> = controlled(state, PODS, &uid)
        .into_iter()
        .filter(|p| !deleting(p))
        .collect();
    let want = usize::try_from(int(&rs, "/spec/replicas")).unwrap_or(0);
    let mut created = Vec::new();
    if !deleting(&rs) && pods.len() < want {
        for _ in pods.len()..want {
            let pod = kubelet::scheduled(pod_for(state, &rs));
            created.push(meta_str(&pod, "name").unwrap_or("").to_string());
            state.put(&pod_rt, pod, EventType::Added);
        }
    } else if pods.len() > want {
        // `getPodsToDelete`: not ready before ready, not started before started, newer first.
        pods.sort_by_key(|p| {
            (
                kubelet::is_ready(p),
                kubelet::is_started(p),
                std::cmp::Reverse(meta_str(p, "creationTimestamp").unwrap_or("").to_string()),
            )
        });
        for pod in &pods[..pods.len() - want] {
            let pod_name = meta_str(pod, "name").unwrap_or("");
            state.delete(&pod_rt.storage(), ns, pod_name, false);
        }
    }
    write_status(state, ns, name);
    created
}

/// Counts the ReplicaSet's Pods into its status (`calculateStatus`): every Pod, those with the
/// template's labels, the Ready ones, and (no `minReadySeconds` wait) the available ones.
pub(crate) fn write_status(state: &mut State, ns: &str, name: &str) {
    let Some(rs_rt) = state.registry.get("apps", "v1", "replicasets") else {
        return;
    };
    let Some(rs) = state.get(&rs_rt.storage(), ns, name).cloned() else {
        return;
    };
    let uid = meta_str(&rs, "uid").unwrap_or("").to_string();
    let pods: Vec<Value> = controlled(state, PODS, &uid)
        .into_iter()
        .filter(|p| !deleting(p))
        .collect();
    let template_labels = rs
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let labelled = pods
        .iter()
        .filter(|p| {
            template_labels
                .iter()
                .all(|(k, v)| p.pointer("/metadata/labels").and_then(|l| l.get(k)) == Some(v))
        })
        .count();
    let ready = pods.iter().filter(|p| kubelet::is_ready(p)).count();
    let mut status = Map::new();
    status.insert("replicas".into(), json!(pods.len()));
    // The API omits the other counts when they are zero.
    for (field, count) in [
        ("fullyLabeledReplicas", labelled),
        ("readyReplicas", ready),
        ("availableReplicas", ready),
    ] {
        if count > 0 {
            status.insert(field.into(), json!(count));
        }
    }
    status.insert(
        "observedGeneration".into(),
        json!(int(&rs, "/metadata/generation")),
    );
    let status = Value::Object(status);
    if rs.get("status") == Some(&status) {
        return;
    }
    let mut updated = rs;
    updated["status"] = status;
    state.put(&rs_rt, updated, EventType::Modified);
}

/// A Pod from the ReplicaSet's template (`GetPodFromTemplate`), with what the API server's
/// admission and defaulting add to every Pod (service account, priority, the
/// not-ready/unreachable tolerations of `DefaultTolerationSeconds`).
fn pod_for(state: &State, rs: &Value) -> Value {
    let rs_name = meta_str(rs, "name").unwrap_or("");
    let ns = meta_str(rs, "namespace").unwrap_or("");
    let pods = (PODS.0.to_string(), PODS.1.to_string());
    let name = loop {
        let candidate = format!("{rs_name}-{}", random_suffix(5));
        if state.get(&pods, ns, &candidate).is_none() {
            break candidate;
        }
    };
    let template = rs.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut metadata = json!({
        "name": name,
        "generateName": format!("{rs_name}-"),
        "namespace": ns,
        "ownerReferences": [controller_reference(rs)],
    });
    for field in ["labels", "annotations", "finalizers"] {
        if let Some(v) = template.pointer(&format!("/metadata/{field}")) {
            metadata[field] = v.clone();
        }
    }
    let mut spec = template.get("spec").cloned().unwrap_or(json!({}));
    if let Some(spec) = spec.as_object_mut() {
        let account = spec
            .get("serviceAccountName")
            .cloned()
            .unwrap_or(json!("default"));
        spec.insert("serviceAccountName".into(), account.clone());
        spec.insert("serviceAccount".into(), account);
        spec.entry("priority").or_insert(json!(0));
        spec.entry("enableServiceLinks").or_insert(json!(true));
        spec.entry("preemptionPolicy")
            .or_insert(json!("PreemptLowerPriority"));
        let tolerations = spec.entry("tolerations").or_insert(json!([]));
        if let Some(list) = tolerations.as_array_mut() {
            for key in [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
            ] {
                if !list.iter().any(|t| t["key"] == key) {
                    list.push(json!({"key": key, "operator": "Exists",
                                     "effect": "NoExecute", "tolerationSeconds": 300}));
                }
            }
        }
    }
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec});
    stamp_created(&mut pod, false);
    pod
}
