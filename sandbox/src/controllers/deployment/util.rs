//! What the controller reads of a Deployment and its ReplicaSets, as
//! `util/deployment_util.go` reads it: the template hash and matching, the replica bounds of a
//! rollout, and the revision annotations.

use serde_json::{Map, Value, json};

use crate::controllers::{controlled, safe_encode};
use crate::store::{State, meta_str};

/// The label that tells a Deployment's ReplicaSets (and their Pods) apart.
pub(super) const HASH_LABEL: &str = "pod-template-hash";
/// The revision of a ReplicaSet, copied to its Deployment.
pub(super) const REVISION: &str = "deployment.kubernetes.io/revision";
pub(super) const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub(super) const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
pub(super) const MAX: &str = "deployment.kubernetes.io/max-replicas";
/// Deployment annotations never copied to a ReplicaSet (`annotationsToSkip`).
const NOT_COPIED: [&str; 7] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED,
    MAX,
    "deployment.kubernetes.io/error-selector-overlapping-with",
    "deployment.kubernetes.io/selector-updated-at",
];
pub(super) const REPLICA_SETS: (&str, &str) = ("apps", "replicasets");

pub(super) fn rs_key() -> (String, String) {
    (REPLICA_SETS.0.to_string(), REPLICA_SETS.1.to_string())
}

/// The ReplicaSet whose template is the Deployment's (ignoring the hash label) and the others,
/// oldest first.
pub(super) fn split(state: &State, d: &Value) -> (Option<Value>, Vec<Value>) {
    let uid = meta_str(d, "uid").unwrap_or("");
    let mut all = controlled(state, REPLICA_SETS, uid);
    all.sort_by_key(|rs| {
        (
            meta_str(rs, "creationTimestamp").unwrap_or("").to_string(),
            meta_str(rs, "name").unwrap_or("").to_string(),
        )
    });
    let template = d.pointer("/spec/template").cloned().unwrap_or(Value::Null);
    let position = all.iter().position(|rs| {
        rs.pointer("/spec/template")
            .is_some_and(|t| without_hash(t) == without_hash(&template))
    });
    let new = position.map(|i| all.remove(i));
    (new, all)
}

/// A pod template without the `pod-template-hash` label (`EqualIgnoreHash`), and without the
/// nulls and empty objects and lists a Go client writes for unset fields (`creationTimestamp:
/// null` in the template kubectl's `rollout undo` sends), which decode to the same struct.
fn without_hash(template: &Value) -> Value {
    let mut t = template.clone();
    drop_empty(&mut t);
    if let Some(labels) = t
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(HASH_LABEL);
        if labels.is_empty()
            && let Some(meta) = t.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.remove("labels");
        }
    }
    t
}

fn drop_empty(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.values_mut().for_each(drop_empty);
            map.retain(|_, v| match v {
                Value::Null => false,
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => true,
            });
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty),
        _ => {}
    }
}

/// The pod-template hash: FNV-1a (32 bits) of the template and the collision count, printed in
/// decimal and made safe (`controller.ComputeHash`). The real one hashes Go's printed struct,
/// so the values differ from a cluster's; the shape and the alphabet are the same.
pub(super) fn template_hash(template: &Value, collisions: i64) -> String {
    let mut text = without_hash(template).to_string();
    if collisions > 0 {
        text.push_str(&collisions.to_string());
    }
    let hash = text.bytes().fold(2_166_136_261_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    });
    safe_encode(&hash.to_string())
}

/// `spec.replicas` (the API server defaults it to 1).
pub(super) fn replicas(d: &Value) -> i64 {
    d.pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

/// `MaxSurge` and `MaxUnavailable` resolved against `spec.replicas` (surge rounds up,
/// unavailable down; both zero means one unavailable: `ResolveFenceposts`). Recreate has no
/// surge and all replicas may be unavailable.
pub(super) fn surge_and_unavailable(d: &Value) -> (i64, i64) {
    let desired = replicas(d);
    if d.pointer("/spec/strategy/type") == Some(&json!("Recreate")) {
        return (0, desired);
    }
    let resolve = |field: &str, default: &str, up: bool| {
        let v = d
            .pointer(&format!("/spec/strategy/rollingUpdate/{field}"))
            .cloned()
            .unwrap_or(json!(default));
        match v {
            Value::Number(n) => n.as_i64().unwrap_or(0),
            Value::String(s) => {
                let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(25);
                let scaled = pct * desired;
                if up {
                    (scaled + 99) / 100
                } else {
                    scaled / 100
                }
            }
            _ => 0,
        }
    };
    let surge = resolve("maxSurge", "25%", true);
    let unavailable = resolve("maxUnavailable", "25%", false);
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

pub(super) fn revision(rs: &Value) -> i64 {
    rs.pointer("/metadata/annotations")
        .and_then(|a| a.get(REVISION))
        .and_then(Value::as_str)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// The Deployment's annotations a ReplicaSet carries (`copyDeploymentAnnotationsToReplicaSet`).
pub(super) fn copied_annotations(d: &Value) -> Map<String, Value> {
    d.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|a| {
            a.iter()
                .filter(|(k, _)| !NOT_COPIED.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}
