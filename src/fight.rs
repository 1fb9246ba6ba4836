//! Fight detection: the operator rewriting the same child again and again while the MyApp's
//! spec stays the same means another writer (a controller, a user's `kubectl edit`) keeps
//! changing fields the operator owns, or a hot loop. It is told apart from a user editing the
//! MyApp by the generation: an edit raises it and starts the count afresh.
//!
//! The Event names the other field manager from the Deployment's `managedFields`: the caches
//! strip them (memory), so when a rewrite is about to be the one that makes a fight the
//! controller reads the Deployment once more, with the `list` permission it already holds (a
//! list by `metadata.name`), before its forced apply takes the fields back.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams},
    runtime::reflector::ObjectRef,
};
use serde_json::Value;

use crate::cache::CachedMyApp;

/// This many rewrites of a child within [`WINDOW`], at one generation, is a fight.
pub const WRITES: usize = 4;
/// The window the rewrites are counted in.
pub const WINDOW: Duration = Duration::from_secs(120);
/// The first hold-off after a fight is detected; doubles with each fight over the same
/// generation, up to [`LONGEST_HOLD_OFF`].
pub const FIRST_HOLD_OFF: Duration = Duration::from_secs(30);
/// The longest hold-off.
pub const LONGEST_HOLD_OFF: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
struct Streak {
    generation: Option<i64>,
    writes: VecDeque<Instant>,
    fights: u32,
    hold_until: Option<Instant>,
}

/// A detected fight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fight {
    /// Rewrites counted in the window.
    pub writes: usize,
    /// How long the operator now leaves the child alone.
    pub hold_off: Duration,
}

/// Rewrites of each MyApp's Deployment, per generation.
#[derive(Debug, Default)]
pub struct Fights {
    streaks: Mutex<HashMap<ObjectRef<CachedMyApp>, Streak>>,
}

impl Fights {
    /// How much longer to leave the child of `key` alone, if a fight holds it off.
    pub fn holding_off(
        &self,
        key: &ObjectRef<CachedMyApp>,
        generation: Option<i64>,
        now: Instant,
    ) -> Option<Duration> {
        let mut streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
        let streak = streaks.get_mut(key)?;
        if streak.generation != generation {
            // The user changed the spec: a fresh start.
            streaks.remove(key);
            return None;
        }
        let until = streak.hold_until?;
        (until > now).then(|| until - now)
    }

    /// Whether a rewrite now would be the one [`Fights::rewrote`] calls a fight (so the
    /// caller can read who owns the fields before it takes them back).
    pub fn would_fight(
        &self,
        key: &ObjectRef<CachedMyApp>,
        generation: Option<i64>,
        now: Instant,
    ) -> bool {
        let streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
        let Some(streak) = streaks.get(key).filter(|s| s.generation == generation) else {
            return WRITES <= 1;
        };
        let recent = streak
            .writes
            .iter()
            .filter(|at| now.duration_since(**at) <= WINDOW)
            .count();
        recent + 1 >= WRITES
    }

    /// Records a rewrite of an existing child; a fight when it is the [`WRITES`]th within
    /// [`WINDOW`] at the same generation.
    pub fn rewrote(
        &self,
        key: &ObjectRef<CachedMyApp>,
        generation: Option<i64>,
        now: Instant,
    ) -> Option<Fight> {
        let mut streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
        // Deleted MyApps and ended streaks go (rewrites are rare, so this scan is cheap).
        streaks.retain(|_, s| {
            s.hold_until.is_some_and(|until| until + WINDOW > now)
                || s.writes
                    .back()
                    .is_some_and(|at| now.duration_since(*at) <= WINDOW)
        });
        let streak = streaks.entry(key.clone()).or_default();
        if streak.generation != generation {
            *streak = Streak {
                generation,
                ..Streak::default()
            };
        }
        streak.writes.push_back(now);
        while streak
            .writes
            .front()
            .is_some_and(|at| now.duration_since(*at) > WINDOW)
        {
            streak.writes.pop_front();
        }
        if streak.writes.len() < WRITES {
            return None;
        }
        let hold_off = FIRST_HOLD_OFF
            .saturating_mul(2u32.saturating_pow(streak.fights.min(16)))
            .min(LONGEST_HOLD_OFF);
        streak.fights += 1;
        streak.hold_until = Some(now + hold_off);
        let writes = streak.writes.len();
        streak.writes.clear();
        Some(Fight { writes, hold_off })
    }
}

/// A field manager other than the operator's that owns fields the operator rewrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rival {
    /// Its name, as in `managedFields`.
    pub manager: String,
    /// `Update` or `Apply`, and the subresource when there is one.
    pub operation: String,
    /// The rewritten fields it owns, by path.
    pub fields: Vec<String>,
}

/// The FightDetected Event's note: the fields, and who owns them when `managedFields` says.
pub fn note(fight: &Fight, generation: Option<i64>, fields: &str, rivals: &[Rival]) -> String {
    let fields = if fields.is_empty() {
        "its fields"
    } else {
        fields
    };
    let who = match rivals {
        [] => format!(
            "another writer keeps changing {fields} (no field manager but the operator's owns them in managedFields)"
        ),
        rivals => {
            let named: Vec<String> = rivals
                .iter()
                .map(|r| {
                    format!(
                        "{:?} ({}) keeps changing {}",
                        r.manager,
                        r.operation,
                        r.fields.join(", ")
                    )
                })
                .collect();
            format!("field manager {}", named.join("; field manager "))
        }
    };
    format!(
        "the Deployment was rewritten {} times within {} s while this MyApp stayed at generation {}: {who}, or the operator is in a hot loop; holding off {} s",
        fight.writes,
        WINDOW.as_secs(),
        generation.unwrap_or_default(),
        fight.hold_off.as_secs()
    )
}

/// Reads the Deployment `name` once (a list by name: the operator may list, not get) and names
/// the field managers, other than `ours`, that own fields of `desired` it holds differently.
/// Empty when the read fails: the fight is still told, without names.
pub async fn rivals(
    client: &Client,
    namespace: &str,
    name: &str,
    desired: &Value,
    ours: &[&str],
) -> Vec<Rival> {
    // As JSON, which is all the walk below reads: no reader for a whole Deployment's pod
    // template in the binary for this one rare read.
    let api = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<Deployment>(&()),
    );
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    let listed = match api.list(&params).await {
        Ok(list) => list,
        Err(error) => {
            tracing::warn!(%error, %name, "Reading the Deployment's managedFields failed");
            return Vec::new();
        }
    };
    let Some(observed) = listed
        .items
        .first()
        .and_then(|d| serde_json::to_value(d).ok())
    else {
        return Vec::new();
    };
    rivals_in(desired, &observed, ours)
}

/// [`rivals`] over an object already read (with its managedFields).
pub fn rivals_in(desired: &Value, observed: &Value, ours: &[&str]) -> Vec<Rival> {
    let entries = observed
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    entries
        .iter()
        .filter_map(|entry| {
            let manager = entry.get("manager").and_then(Value::as_str).unwrap_or("");
            if ours.contains(&manager) {
                return None;
            }
            let mut changed = Vec::new();
            walk(
                desired,
                observed,
                String::new(),
                entry.get("fieldsV1").map(Owner::Node),
                &mut changed,
            );
            let mut fields: Vec<String> = changed
                .into_iter()
                .filter(|(_, owned)| *owned)
                .map(|(p, _)| p)
                .collect();
            fields.sort();
            if fields.is_empty() {
                return None;
            }
            let mut operation = entry
                .get("operation")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if let Some(sub) = entry.get("subresource").and_then(Value::as_str) {
                operation.push_str(&format!(" of /{sub}"));
            }
            Some(Rival {
                manager: manager.to_string(),
                operation,
                fields,
            })
        })
        .collect()
}

/// The paths of the fields `desired` sets that `observed` holds differently: what the other
/// writer changed.
pub fn changed_fields(desired: &Value, observed: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(desired, observed, String::new(), None, &mut out);
    out.into_iter().map(|(path, _)| path).collect()
}

/// Where a manager's `fieldsV1` stands beside the walk: at a node, or under a leaf it owns
/// whole (an atomic list or map).
#[derive(Clone, Copy)]
enum Owner<'a> {
    Node(&'a Value),
    Whole,
}

impl<'a> Owner<'a> {
    fn field(self, key: &str) -> Option<Owner<'a>> {
        match self {
            Owner::Whole => Some(Owner::Whole),
            Owner::Node(node) => node.get(format!("f:{key}")).map(Owner::leaf_or_node),
        }
    }

    /// The owner of list element `item` (at `index`): by `k:` key fields, `v:` value or `i:`.
    fn element(self, item: &Value, index: usize) -> Option<Owner<'a>> {
        let Owner::Node(node) = self else {
            return Some(Owner::Whole);
        };
        let map = node.as_object()?;
        map.iter()
            .find(|(element, _)| {
                if let Some(key) = element.strip_prefix("k:") {
                    serde_json::from_str::<serde_json::Map<String, Value>>(key).is_ok_and(|keys| {
                        keys.iter().all(|(k, v)| {
                            item.get(k) == Some(v)
                                || (k == "protocol" && item.get(k).is_none() && v == "TCP")
                        })
                    })
                } else if let Some(value) = element.strip_prefix("v:") {
                    serde_json::from_str::<Value>(value).is_ok_and(|v| v == *item)
                } else {
                    element.strip_prefix("i:").and_then(|i| i.parse().ok()) == Some(index)
                }
            })
            .map(|(_, child)| Owner::leaf_or_node(child))
    }

    fn leaf_or_node(node: &'a Value) -> Owner<'a> {
        match node.as_object() {
            Some(map) if map.is_empty() => Owner::Whole,
            _ => Owner::Node(node),
        }
    }
}

/// Collects (path, owned by `owner`) of every field `desired` sets that `observed` does not
/// hold the same.
fn walk(
    desired: &Value,
    observed: &Value,
    path: String,
    owner: Option<Owner>,
    out: &mut Vec<(String, bool)>,
) {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => {
            for (key, dv) in d {
                if key == "apiVersion" || key == "kind" || dv.is_null() {
                    continue;
                }
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                let child = owner.and_then(|o| o.field(key));
                match o.get(key) {
                    Some(ov) => walk(dv, ov, here, child, out),
                    None => out.push((here, child.is_some())),
                }
            }
        }
        (Value::Array(d), Value::Array(o)) if d.len() == o.len() => {
            for (i, (dv, ov)) in d.iter().zip(o).enumerate() {
                let child = owner.and_then(|w| w.element(ov, i));
                walk(dv, ov, format!("{path}[{i}]"), child, out);
            }
        }
        (d, o) if d == o => {}
        _ => out.push((path, owner.is_some())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn four_rewrites_at_one_generation_are_a_fight_and_an_edit_starts_afresh() {
        let fights = Fights::default();
        let key = ObjectRef::new("web").within("default");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        for s in 0..3 {
            assert_eq!(fights.rewrote(&key, Some(2), at(s)), None);
        }
        // A user edits the MyApp: generation 3, the count starts again.
        assert_eq!(fights.holding_off(&key, Some(3), at(3)), None);
        for s in 4..7 {
            assert_eq!(fights.rewrote(&key, Some(3), at(s)), None);
        }
        let fight = fights.rewrote(&key, Some(3), at(7)).unwrap();
        assert_eq!(
            fight,
            Fight {
                writes: 4,
                hold_off: FIRST_HOLD_OFF
            }
        );
        assert_eq!(
            fights.holding_off(&key, Some(3), at(17)),
            Some(Duration::from_secs(20))
        );
        assert_eq!(fights.holding_off(&key, Some(3), at(40)), None);
        // The fight goes on after the hold-off: the next one is twice as long.
        for s in 40..43 {
            assert_eq!(fights.rewrote(&key, Some(3), at(s)), None);
        }
        assert_eq!(
            fights.rewrote(&key, Some(3), at(43)).unwrap().hold_off,
            FIRST_HOLD_OFF * 2
        );
    }

    #[test]
    fn rewrites_spread_wider_than_the_window_are_no_fight() {
        let fights = Fights::default();
        let key = ObjectRef::new("web").within("default");
        let t0 = Instant::now();
        for i in 0..10 {
            let at = t0 + WINDOW / 2 * i;
            assert_eq!(fights.rewrote(&key, Some(1), at), None, "write {i}");
        }
    }

    #[test]
    fn the_changed_fields_are_named_by_path() {
        let desired = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "app", "image": "web:1"}]}}}});
        let observed = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "app", "image": "web:evil", "imagePullPolicy": "Always"}]}}}});
        assert_eq!(
            changed_fields(&desired, &observed),
            ["spec.template.spec.containers[0].image"]
        );
    }

    #[test]
    fn the_other_manager_is_named_from_managed_fields_and_ours_are_not() {
        let desired = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "app", "image": "web:1", "args": ["a"]}]}}}});
        let observed = json!({
            "metadata": {"managedFields": [
                {"manager": "myapp-operator", "operation": "Apply", "fieldsV1": {"f:spec": {
                    "f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                        "k:{\"name\":\"app\"}": {".": {}, "f:name": {}}}}}}}},
                {"manager": "other-controller", "operation": "Update", "fieldsV1": {"f:spec": {
                    "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                        "f:image": {}, "f:args": {}}}}}}}},
                {"manager": "kubectl-scale", "operation": "Update", "subresource": "scale",
                    "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            ]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "app", "image": "web:evil", "args": ["b", "c"]}]}}}});
        let rivals = rivals_in(&desired, &observed, &["myapp-operator"]);
        assert_eq!(
            rivals,
            [Rival {
                manager: "other-controller".into(),
                operation: "Update".into(),
                fields: vec![
                    "spec.template.spec.containers[0].args".into(),
                    "spec.template.spec.containers[0].image".into()
                ],
            }]
        );
        let fight = Fight {
            writes: 4,
            hold_off: FIRST_HOLD_OFF,
        };
        assert_eq!(
            note(
                &fight,
                Some(3),
                "spec.template.spec.containers[0].image",
                &rivals
            ),
            "the Deployment was rewritten 4 times within 120 s while this MyApp stayed at generation 3: field manager \"other-controller\" (Update) keeps changing spec.template.spec.containers[0].args, spec.template.spec.containers[0].image, or the operator is in a hot loop; holding off 30 s"
        );
        assert!(note(&fight, Some(3), "x", &[]).contains("another writer keeps changing x"));
    }

    #[test]
    fn the_rewrite_that_would_make_a_fight_is_known_before_it_is_made() {
        let fights = Fights::default();
        let key = ObjectRef::new("web").within("default");
        let t0 = Instant::now();
        for s in 0..3 {
            assert!(!fights.would_fight(&key, Some(1), t0 + Duration::from_secs(s)));
            fights.rewrote(&key, Some(1), t0 + Duration::from_secs(s));
        }
        assert!(fights.would_fight(&key, Some(1), t0 + Duration::from_secs(3)));
        assert!(!fights.would_fight(&key, Some(2), t0 + Duration::from_secs(3)));
        assert!(
            fights
                .rewrote(&key, Some(1), t0 + Duration::from_secs(3))
                .is_some()
        );
    }
}
