//! Simulated kube-controller-manager and kubelet: Deployments make ReplicaSets, ReplicaSets make
//! Pods, and Pods report as a kubelet would, without running any container.

/// The Deployment controller: ReplicaSets per template revision, rolling updates, status.
pub(crate) mod deployment;
/// A kubelet that never runs a container: pod phases, conditions and container statuses.
pub(crate) mod kubelet;
/// The ReplicaSet controller: as many Pods as `spec.replicas`, and the ReplicaSet's status.
pub(crate) mod replicaset;

use serde_json::{Value, json};

use crate::store::{ObjectKey, State, meta_mut, meta_str, now};

/// kube-controller-manager's random suffix alphabet (`apimachinery/pkg/util/rand`), which has
/// no vowels and no characters that look alike.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `rand.SafeEncodeString`: every character becomes one of [`SAFE_ALPHABET`].
pub(crate) fn safe_encode(s: &str) -> String {
    s.bytes()
        .map(|b| SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()] as char)
        .collect()
}

/// `rand.String(n)` over [`SAFE_ALPHABET`], as `generateName` suffixes are made.
pub(crate) fn random_suffix(n: usize) -> String {
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(n)
        .map(|b| SAFE_ALPHABET[usize::from(*b) % SAFE_ALPHABET.len()] as char)
        .collect()
}

/// An owner reference to `owner` as a controller sets it (`controller: true`,
/// `blockOwnerDeletion: true`).
pub(crate) fn controller_reference(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta_str(owner, "name"),
        "uid": meta_str(owner, "uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// Whether `obj`'s controller (the owner reference with `controller: true`) has `uid`.
pub(crate) fn controlled_by(obj: &Value, uid: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r["controller"] == true && r["uid"] == uid)
        })
}

/// The objects of `resource` that `uid` controls, as stored now (by the owner index).
pub(crate) fn controlled(state: &State, resource: (&str, &str), uid: &str) -> Vec<Value> {
    state
        .dependents_of(uid)
        .into_iter()
        .filter(|((group, plural), _, _)| (group.as_str(), plural.as_str()) == resource)
        .filter_map(|(res, ns, name): ObjectKey| state.get(&res, &ns, &name).cloned())
        .filter(|o| controlled_by(o, uid))
        .collect()
}

/// The name of the object's controller (its owner reference with `controller: true`) if that
/// is of `kind`.
fn controller_named<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true && r["kind"] == kind)?["name"]
        .as_str()
}

/// The Deployment that controls a Pod (through its ReplicaSet) or a ReplicaSet, by name.
pub(crate) fn owning_deployment(state: &State, obj: &Value) -> Option<String> {
    let ns = meta_str(obj, "namespace").unwrap_or("");
    let rs = match obj["kind"].as_str() {
        Some("ReplicaSet") => obj.clone(),
        Some("Pod") => {
            let name = controller_named(obj, "ReplicaSet")?;
            let res = ("apps".to_string(), "replicasets".to_string());
            state.get(&res, ns, name)?.clone()
        }
        _ => return None,
    };
    controller_named(&rs, "Deployment").map(String::from)
}

/// The server-set metadata of a created object: uid, creationTimestamp, and generation 1.
pub(crate) fn stamp_created(obj: &mut Value, generation: bool) {
    let meta = meta_mut(obj);
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    if generation {
        meta.insert("generation".into(), json!(1));
    }
}

/// An integer field, 0 when absent.
pub(crate) fn int(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// Whether the object is being deleted.
pub(crate) fn deleting(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_encoding_uses_only_the_controller_managers_alphabet() {
        let encoded = safe_encode("3712348765");
        assert_eq!(encoded.len(), 10);
        assert!(encoded.bytes().all(|b| SAFE_ALPHABET.contains(&b)));
        // '0' is byte 48, and 48 % 27 = 21 picks the 22nd character.
        assert_eq!(safe_encode("0"), "4");
        assert_eq!(random_suffix(5).len(), 5);
    }
}
