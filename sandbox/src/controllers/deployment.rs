//! The Deployment controller (`pkg/controller/deployment/{sync.go,rolling.go,recreate.go,
//! progress.go,util/deployment_util.go}`): one ReplicaSet per pod-template revision, named
//! `<deployment>-<pod-template-hash>`; a rolling update within `maxSurge`/`maxUnavailable` (or
//! Recreate); old ReplicaSets kept at zero up to `revisionHistoryLimit`; and the Deployment's
//! status and revision counted from its ReplicaSets.

mod status;
mod util;

use std::sync::Arc;

use serde_json::{Value, json};

use super::stamp_created;
use super::{controlled, controller_reference, deleting, int, replicaset};
use crate::registry::ResourceType;
use crate::store::{EventType, State, meta_mut, meta_str};
use status::write_status;
use util::{
    DESIRED, HASH_LABEL, MAX, REPLICA_SETS, REVISION, REVISION_HISTORY, copied_annotations,
    replicas, revision, rs_key, split, surge_and_unavailable, template_hash,
};

/// Brings a Deployment's ReplicaSets one rollout step further (as many passes as change
/// something without waiting for a Pod to start) and writes its status. Returns the Pods created,
/// for the kubelet to start.
pub(crate) fn sync(state: &mut State, ns: &str, name: &str) -> Vec<String> {
    let (Some(d_rt), Some(rs_rt)) = (
        state.registry.get("apps", "v1", "deployments"),
        state.registry.get("apps", "v1", "replicasets"),
    ) else {
        return Vec::new();
    };
    let mut created = Vec::new();
    let mut new_rs_created = None;
    for _ in 0..8 {
        let Some(d) = state.get(&d_rt.storage(), ns, name).cloned() else {
            return created;
        };
        if deleting(&d) {
            return created;
        }
        let step = step(state, &d, &rs_rt);
        created.extend(step.pods);
        new_rs_created = new_rs_created.or(step.created_rs);
        if !step.changed {
            break;
        }
    }
    write_status(state, &d_rt, ns, name, new_rs_created.as_deref());
    created
}

#[derive(Default)]
struct Step {
    changed: bool,
    pods: Vec<String>,
    created_rs: Option<String>,
}

fn step(state: &mut State, d: &Value, rs_rt: &ResourceType) -> Step {
    let mut out = Step::default();
    let ns = meta_str(d, "namespace").unwrap_or("").to_string();
    let uid = meta_str(d, "uid").unwrap_or("").to_string();
    for rs in controlled(state, REPLICA_SETS, &uid) {
        let rs_name = meta_str(&rs, "name").unwrap_or("");
        out.pods.extend(replicaset::sync(state, &ns, rs_name));
    }
    let (new, olds) = split(state, d);
    let desired = replicas(d);
    let (surge, unavailable) = surge_and_unavailable(d);
    let recreate = d.pointer("/spec/strategy/type") == Some(&json!("Recreate"));
    let old_total: i64 = olds.iter().map(|rs| int(rs, "/spec/replicas")).sum();
    let new = match new {
        Some(rs) => rs,
        None if d.pointer("/spec/paused") == Some(&json!(true)) => return out,
        None => {
            let initial = if recreate {
                if old_total > 0 { 0 } else { desired }
            } else {
                (desired + surge - old_total).clamp(0, desired)
            };
            let rs = new_replica_set(state, d, &olds, initial);
            out.created_rs = meta_str(&rs, "name").map(String::from);
            let stored = Arc::unwrap_or_clone(state.put(rs_rt, rs, EventType::Added));
            out.changed = true;
            out.pods.extend(replicaset::sync(
                state,
                &ns,
                meta_str(&stored, "name").unwrap_or(""),
            ));
            stored
        }
    };
    out.changed |= keep_revision_newest(state, rs_rt, d, &new, &olds);
    if d.pointer("/spec/paused") == Some(&json!(true)) {
        return out;
    }
    let mut scale = |state: &mut State, rs: &Value, to: i64| {
        if int(rs, "/spec/replicas") != to {
            out.pods
                .extend(scale_replica_set(state, rs_rt, d, rs, to, surge));
            out.changed = true;
        }
    };
    if recreate {
        for rs in &olds {
            scale(state, rs, 0);
        }
        if old_total == 0 {
            scale(state, &new, desired);
        }
    } else {
        let new_replicas = int(&new, "/spec/replicas");
        let all_total = old_total + new_replicas;
        if new_replicas > desired {
            scale(state, &new, desired);
        } else if new_replicas < desired && all_total < desired + surge {
            let up = (desired + surge - all_total).min(desired - new_replicas);
            scale(state, &new, new_replicas + up);
        }
        let (new, olds) = split(state, d);
        scale_down_old(state, d, new.as_ref(), &olds, unavailable, &mut scale);
    }
    let (new, olds) = split(state, d);
    if new.is_some_and(|rs| int(&rs, "/status/availableReplicas") >= desired)
        && olds.iter().all(|rs| int(rs, "/spec/replicas") == 0)
    {
        clean_up_history(state, d, olds);
    }
    out
}

/// `reconcileOldReplicaSets`: first the old ReplicaSets' unavailable Pods, then available ones
/// as long as `desired - maxUnavailable` Pods stay available, oldest ReplicaSet first.
fn scale_down_old(
    state: &mut State,
    d: &Value,
    new: Option<&Value>,
    olds: &[Value],
    max_unavailable: i64,
    scale: &mut impl FnMut(&mut State, &Value, i64),
) {
    let old_total: i64 = olds.iter().map(|rs| int(rs, "/spec/replicas")).sum();
    if old_total == 0 {
        return;
    }
    let min_available = replicas(d) - max_unavailable;
    let new_replicas = new.map_or(0, |rs| int(rs, "/spec/replicas"));
    let new_unavailable = new.map_or(0, |rs| new_replicas - int(rs, "/status/availableReplicas"));
    let mut budget = old_total + new_replicas - min_available - new_unavailable;
    let mut remaining: Vec<(Value, i64)> = Vec::new();
    for rs in olds {
        let (have, available) = (
            int(rs, "/spec/replicas"),
            int(rs, "/status/availableReplicas"),
        );
        let down = (have - available).min(budget).max(0);
        if down > 0 {
            scale(state, rs, have - down);
            budget -= down;
        }
        remaining.push((rs.clone(), have - down));
    }
    let available: i64 = olds
        .iter()
        .chain(new)
        .map(|rs| int(rs, "/status/availableReplicas"))
        .sum();
    let mut total_down = available - min_available;
    for (rs, have) in remaining {
        if total_down <= 0 {
            break;
        }
        let down = have.min(total_down);
        if down > 0 {
            let current = state
                .get(
                    &rs_key(),
                    meta_str(&rs, "namespace").unwrap_or(""),
                    meta_str(&rs, "name").unwrap_or(""),
                )
                .cloned()
                .unwrap_or(rs);
            scale(state, &current, have - down);
            total_down -= down;
        }
    }
}
/// A new ReplicaSet for the Deployment's template (`getNewReplicaSet`).
fn new_replica_set(state: &State, d: &Value, olds: &[Value], replicas: i64) -> Value {
    let ns = meta_str(d, "namespace").unwrap_or("");
    let d_name = meta_str(d, "name").unwrap_or("");
    let template = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut collisions = 0;
    let (name, hash) = loop {
        let hash = template_hash(&template, collisions);
        let name = format!("{d_name}-{hash}");
        if state.get(&rs_key(), ns, &name).is_none() || collisions > 100 {
            break (name, hash);
        }
        collisions += 1;
    };
    let mut template = template;
    let labels = template["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    template["metadata"]["labels"][HASH_LABEL] = json!(hash);
    let mut selector = d.pointer("/spec/selector").cloned().unwrap_or(json!({}));
    selector["matchLabels"][HASH_LABEL] = json!(hash);
    let mut rs_labels = labels;
    rs_labels.insert(HASH_LABEL.into(), json!(hash));
    let mut annotations = copied_annotations(d);
    let next = olds.iter().map(revision).max().unwrap_or(0) + 1;
    annotations.insert(REVISION.into(), json!(next.to_string()));
    let (surge, _) = surge_and_unavailable(d);
    annotations.insert(DESIRED.into(), json!(self::replicas(d).to_string()));
    annotations.insert(MAX.into(), json!((self::replicas(d) + surge).to_string()));
    let mut spec = json!({"replicas": replicas, "selector": selector, "template": template});
    if let Some(min_ready) = d.pointer("/spec/minReadySeconds") {
        spec["minReadySeconds"] = min_ready.clone();
    }
    let mut rs = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name, "namespace": ns, "labels": rs_labels, "annotations": annotations,
            "ownerReferences": [controller_reference(d)],
        },
        "spec": spec,
    });
    stamp_created(&mut rs, true);
    rs
}

/// Copies the Deployment's annotations to its new ReplicaSet and, when the template went back
/// to an older ReplicaSet's (a rollback), gives it the next revision and remembers the old one
/// in `revision-history` (`SetNewReplicaSetAnnotations`). Returns whether it wrote.
fn keep_revision_newest(
    state: &mut State,
    rt: &ResourceType,
    d: &Value,
    new: &Value,
    olds: &[Value],
) -> bool {
    let mut rs = new.clone();
    let max_old = olds.iter().map(revision).max().unwrap_or(0);
    let current = revision(new);
    let annotations = meta_mut(&mut rs)
        .entry("annotations")
        .or_insert_with(|| json!({}));
    let Some(annotations) = annotations.as_object_mut() else {
        return false;
    };
    annotations.extend(copied_annotations(d));
    if current <= max_old {
        annotations.insert(REVISION.into(), json!((max_old + 1).to_string()));
        if current > 0 {
            let history = match annotations.get(REVISION_HISTORY).and_then(Value::as_str) {
                Some(h) if !h.is_empty() => format!("{h},{current}"),
                _ => current.to_string(),
            };
            annotations.insert(REVISION_HISTORY.into(), json!(history));
        }
    }
    if rs == *new {
        return false;
    }
    state.put(rt, rs, EventType::Modified);
    true
}

/// Sets a ReplicaSet's `spec.replicas` with the desired/max annotations
/// (`scaleReplicaSet`), then lets the ReplicaSet controller act on it.
fn scale_replica_set(
    state: &mut State,
    rt: &ResourceType,
    d: &Value,
    rs: &Value,
    to: i64,
    surge: i64,
) -> Vec<String> {
    let ns = meta_str(rs, "namespace").unwrap_or("").to_string();
    let name = meta_str(rs, "name").unwrap_or("").to_string();
    let Some(mut rs) = state.get(&rt.storage(), &ns, &name).cloned() else {
        return Vec::new();
    };
    rs["spec"]["replicas"] = json!(to);
    let generation = int(&rs, "/metadata/generation");
    let meta = meta_mut(&mut rs);
    meta.insert("generation".into(), json!(generation + 1));
    if let Some(a) = meta
        .entry("annotations")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        a.insert(DESIRED.into(), json!(replicas(d).to_string()));
        a.insert(MAX.into(), json!((replicas(d) + surge).to_string()));
    }
    state.put(rt, rs, EventType::Modified);
    replicaset::sync(state, &ns, &name)
}

/// Deletes the oldest empty ReplicaSets beyond `revisionHistoryLimit` (`cleanupDeployment`).
fn clean_up_history(state: &mut State, d: &Value, olds: Vec<Value>) {
    let limit = d
        .pointer("/spec/revisionHistoryLimit")
        .and_then(Value::as_i64)
        .unwrap_or(10);
    let mut empty: Vec<Value> = olds
        .into_iter()
        .filter(|rs| {
            int(rs, "/spec/replicas") == 0 && int(rs, "/status/replicas") == 0 && !deleting(rs)
        })
        .collect();
    let surplus = usize::try_from(empty.len() as i64 - limit).unwrap_or(0);
    empty.sort_by_key(revision);
    for rs in empty.into_iter().take(surplus) {
        let ns = meta_str(&rs, "namespace").unwrap_or("");
        let name = meta_str(&rs, "name").unwrap_or("");
        state.delete(&rs_key(), ns, name, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(strategy: Value, replicas: i64) -> Value {
        json!({"spec": {"replicas": replicas, "strategy": strategy}})
    }

    #[test]
    fn surge_rounds_up_and_unavailable_rounds_down() {
        let rolling = json!({"type": "RollingUpdate",
                             "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}});
        assert_eq!(
            surge_and_unavailable(&deployment(rolling.clone(), 2)),
            (1, 0)
        );
        assert_eq!(surge_and_unavailable(&deployment(rolling, 10)), (3, 2));
        let zero = json!({"type": "RollingUpdate",
                          "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}});
        assert_eq!(surge_and_unavailable(&deployment(zero, 3)), (0, 1));
        let recreate = json!({"type": "Recreate"});
        assert_eq!(surge_and_unavailable(&deployment(recreate, 3)), (0, 3));
    }

    #[test]
    fn the_template_hash_ignores_its_own_label_and_changes_with_collisions() {
        let template = json!({"metadata": {"labels": {"app": "a"}}, "spec": {}});
        let mut labelled = template.clone();
        labelled["metadata"]["labels"][HASH_LABEL] = json!("x");
        assert_eq!(template_hash(&template, 0), template_hash(&labelled, 0));
        assert_ne!(template_hash(&template, 0), template_hash(&template, 1));
    }
}
