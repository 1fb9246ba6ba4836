//! The Deployment's status and its conditions, counted from its ReplicaSets.

use serde_json::{Map, Value, json};

use super::util::{REVISION, replicas, revision, split, surge_and_unavailable};
use crate::controllers::{controlled, int, kubelet};
use crate::registry::ResourceType;
use crate::store::{EventType, State, meta_mut, meta_str, now};

/// The Deployment's status from its ReplicaSets (`calculateStatus`, `syncRolloutStatus`) and its
/// revision annotation from the new ReplicaSet's.
pub(super) fn write_status(
    state: &mut State,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    created_rs: Option<&str>,
) {
    let Some(d) = state.get(&rt.storage(), ns, name).cloned() else {
        return;
    };
    let (new, olds) = split(state, &d);
    let desired = replicas(&d);
    let all: Vec<&Value> = olds.iter().chain(new.as_ref()).collect();
    let sum = |p: &str| all.iter().map(|rs| int(rs, p)).sum::<i64>();
    let (total, ready, available) = (
        sum("/status/replicas"),
        sum("/status/readyReplicas"),
        sum("/status/availableReplicas"),
    );
    let updated = new.as_ref().map_or(0, |rs| int(rs, "/status/replicas"));
    let mut status = Map::new();
    status.insert(
        "observedGeneration".into(),
        json!(int(&d, "/metadata/generation")),
    );
    for (field, count) in [
        ("replicas", total),
        ("updatedReplicas", updated),
        ("readyReplicas", ready),
        ("availableReplicas", available),
        ("unavailableReplicas", (desired - available).max(0)),
    ] {
        if count > 0 {
            status.insert(field.into(), json!(count));
        }
    }
    let old_status = d.get("status").cloned().unwrap_or(json!({}));
    let mut conditions: Vec<Value> = old_status["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ts = now();
    let (_, max_unavailable) = surge_and_unavailable(&d);
    if available >= desired - max_unavailable {
        set_condition(
            &mut conditions,
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
            &ts,
        );
    } else {
        set_condition(
            &mut conditions,
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            &ts,
        );
    }
    let rs_name = new
        .as_ref()
        .and_then(|rs| meta_str(rs, "name"))
        .unwrap_or("")
        .to_string();
    let complete = updated == desired && total == desired && available == desired;
    let failing = new.as_ref().is_some_and(|rs| new_pods_failing(state, rs));
    let progressed = [
        "replicas",
        "updatedReplicas",
        "readyReplicas",
        "availableReplicas",
    ]
    .iter()
    .any(|f| old_status.get(*f) != status.get(*f));
    if d.pointer("/spec/paused") == Some(&json!(true)) {
        set_condition(
            &mut conditions,
            "Progressing",
            "Unknown",
            "DeploymentPaused",
            "Deployment is paused",
            &ts,
        );
    } else if complete && new.is_some() {
        set_condition(
            &mut conditions,
            "Progressing",
            "True",
            "NewReplicaSetAvailable",
            &format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
            &ts,
        );
    } else if failing {
        set_condition(
            &mut conditions,
            "Progressing",
            "False",
            "ProgressDeadlineExceeded",
            &format!("ReplicaSet \"{rs_name}\" has timed out progressing."),
            &ts,
        );
    } else if let Some(created) = created_rs {
        set_condition(
            &mut conditions,
            "Progressing",
            "True",
            "NewReplicaSetCreated",
            &format!("Created new replica set \"{created}\""),
            &ts,
        );
    } else if progressed || !conditions.iter().any(|c| c["type"] == "Progressing") {
        // Progress refreshes the condition's lastUpdateTime, even with the same reason.
        conditions.retain(|c| c["type"] != "Progressing" || c["status"] == "True");
        let since = conditions
            .iter()
            .find(|c| c["type"] == "Progressing")
            .map(|c| c["lastTransitionTime"].clone());
        conditions.retain(|c| c["type"] != "Progressing");
        let mut c = condition(
            "Progressing",
            "True",
            "ReplicaSetUpdated",
            &format!("ReplicaSet \"{rs_name}\" is progressing."),
            &ts,
        );
        if let Some(since) = since {
            c["lastTransitionTime"] = since;
        }
        conditions.push(c);
    }
    status.insert("conditions".into(), json!(conditions));
    let mut updated_d = d.clone();
    updated_d["status"] = Value::Object(status);
    if let Some(rs) = &new {
        let rev = revision(rs).to_string();
        if let Some(a) = meta_mut(&mut updated_d)
            .entry("annotations")
            .or_insert_with(|| json!({}))
            .as_object_mut()
        {
            a.insert(REVISION.into(), json!(rev));
        }
    }
    if updated_d != d {
        state.put(rt, updated_d, EventType::Modified);
    }
}

/// Whether a Pod of the new ReplicaSet cannot start: the sandbox's stand-in for the progress
/// deadline passing.
fn new_pods_failing(state: &State, rs: &Value) -> bool {
    let uid = meta_str(rs, "uid").unwrap_or("");
    controlled(state, ("", "pods"), uid)
        .iter()
        .any(kubelet::is_failing)
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, ts: &str) -> Value {
    json!({"type": type_, "status": status, "lastUpdateTime": ts, "lastTransitionTime": ts,
           "reason": reason, "message": message})
}

/// `SetDeploymentCondition`: unchanged when status and reason are the same; the transition
/// time kept when only the reason changes; the condition moved to the end.
fn set_condition(
    conditions: &mut Vec<Value>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    ts: &str,
) {
    let current = conditions.iter().find(|c| c["type"] == type_).cloned();
    if current
        .as_ref()
        .is_some_and(|c| c["status"] == status && c["reason"] == reason)
    {
        return;
    }
    let mut c = condition(type_, status, reason, message, ts);
    if let Some(current) = current
        && current["status"] == status
    {
        c["lastTransitionTime"] = current["lastTransitionTime"].clone();
    }
    conditions.retain(|c| c["type"] != type_);
    conditions.push(c);
}
