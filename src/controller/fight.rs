//! Fight detection: the operator rewriting the same child again and again while the MyApp's
//! spec stays the same means another writer (a controller, a user's `kubectl edit`) keeps
//! changing fields the operator owns, or a hot loop. It is told apart from a user editing the
//! MyApp by the generation: an edit raises it and starts the count afresh.
//!
//! Naming the other field manager needs `managedFields`, which the sandbox does not record yet
//! (issue 13 item 3): the Event names the fields that were changed, not who changed them.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::{Duration, Instant},
};

use kube::runtime::reflector::ObjectRef;
use serde_json::Value;

use crate::crd::MyApp;

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
    streaks: Mutex<HashMap<ObjectRef<MyApp>, Streak>>,
}

impl Fights {
    /// How much longer to leave the child of `key` alone, if a fight holds it off.
    pub fn holding_off(
        &self,
        key: &ObjectRef<MyApp>,
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

    /// Records a rewrite of an existing child; a fight when it is the [`WRITES`]th within
    /// [`WINDOW`] at the same generation.
    pub fn rewrote(
        &self,
        key: &ObjectRef<MyApp>,
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

/// The FightDetected Event's note.
pub fn note(fight: &Fight, generation: Option<i64>, fields: &str) -> String {
    let fields = if fields.is_empty() {
        "its fields"
    } else {
        fields
    };
    format!(
        "the Deployment was rewritten {} times within {} s while this MyApp stayed at generation {}: another writer keeps changing {fields}, or the operator is in a hot loop; holding off {} s (the other field manager is not named: the operator does not read managedFields yet)",
        fight.writes,
        WINDOW.as_secs(),
        generation.unwrap_or_default(),
        fight.hold_off.as_secs()
    )
}

/// The paths of the fields `desired` sets that `observed` holds differently: what the other
/// writer changed.
pub fn changed_fields(desired: &Value, observed: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(desired, observed, String::new(), &mut out);
    out
}

fn walk(desired: &Value, observed: &Value, path: String, out: &mut Vec<String>) {
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
                match o.get(key) {
                    Some(ov) => walk(dv, ov, here, out),
                    None => out.push(here),
                }
            }
        }
        (Value::Array(d), Value::Array(o)) if d.len() == o.len() => {
            for (i, (dv, ov)) in d.iter().zip(o).enumerate() {
                walk(dv, ov, format!("{path}[{i}]"), out);
            }
        }
        (d, o) if d == o => {}
        _ => out.push(path),
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
}
