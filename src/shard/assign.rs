//! The sharder's decisions: the next label change that brings a MyApp to the shard the ring
//! gives it, without ever letting two live shards reconcile it at once.
//!
//! A MyApp's shard is its [`SHARD_LABEL`]; the shard's controller watches only MyApps (and
//! children) that carry its name there. Moving a MyApp from one live shard to another is a
//! handshake, as in the anchors' sharder: the sharder asks the current shard to let go
//! ([`DRAIN_LABEL`]); that shard finishes what it has in flight and removes both labels; only
//! then does the sharder write the new shard. A MyApp whose shard is no longer live is assigned
//! at once: a shard stops writing before its Lease expires (its write gate closes at the renew
//! deadline), and membership drops it only after the Lease's duration.

use std::collections::BTreeMap;

use super::ring::Ring;

/// The shard that reconciles a MyApp, by name (a replica's identity).
pub const SHARD_LABEL: &str = "shard.example.com/myapp-operator";

/// Set by the sharder to ask a MyApp's shard to let it go; its value is always `"true"`.
pub const DRAIN_LABEL: &str = "drain.shard.example.com/myapp-operator";

/// One label change to make on a MyApp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Move {
    /// Set [`SHARD_LABEL`] to this shard (and remove [`DRAIN_LABEL`] if set).
    Assign(String),
    /// Set [`DRAIN_LABEL`]: the live shard that holds the MyApp is to let it go.
    Drain,
    /// Remove [`DRAIN_LABEL`]: the ring gives the MyApp back to the shard that holds it.
    Keep,
}

/// What the sharder does next for the MyApp `namespace/name` with `labels`, given the `ring`
/// of the live shards; nothing when the MyApp is where the ring puts it, when its shard has yet
/// to answer a drain, or when no shard is live.
pub fn next_move(
    ring: &Ring,
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Option<Move> {
    let wanted = ring.shard_for(namespace, name)?;
    let draining = labels.contains_key(DRAIN_LABEL);
    let held_by = labels
        .get(SHARD_LABEL)
        .map(String::as_str)
        .filter(|shard| !shard.is_empty());
    match held_by {
        // Unassigned, or its shard let go of it or is gone.
        None => Some(Move::Assign(wanted.to_owned())),
        Some(shard) if !ring.has(shard) => Some(Move::Assign(wanted.to_owned())),
        Some(shard) if shard == wanted => draining.then_some(Move::Keep),
        // A live shard holds it: only that shard may give it up.
        Some(_) if draining => None,
        Some(_) => Some(Move::Drain),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The ring of three live shards, the shard it gives `team-a/web`, and another of the three.
    fn setup() -> (Ring, &'static str, &'static str) {
        let shards = ["pod-0", "pod-1", "pod-2"];
        let ring = Ring::new(shards);
        let wanted = ring.shard_for("team-a", "web").unwrap();
        let wanted = shards.into_iter().find(|s| *s == wanted).unwrap();
        let other = shards.into_iter().find(|s| *s != wanted).unwrap();
        (ring, wanted, other)
    }

    #[test]
    fn an_unassigned_myapp_or_one_on_a_gone_shard_is_assigned_at_once() {
        let (ring, wanted, _) = setup();
        let assign = Some(Move::Assign(wanted.to_owned()));
        for found in [
            labels(&[]),
            labels(&[(SHARD_LABEL, "")]),
            labels(&[(SHARD_LABEL, "pod-gone")]),
            labels(&[(SHARD_LABEL, "pod-gone"), (DRAIN_LABEL, "true")]),
        ] {
            assert_eq!(next_move(&ring, "team-a", "web", &found), assign);
        }
    }

    #[test]
    fn a_myapp_on_its_shard_stays_and_a_drain_the_ring_took_back_is_withdrawn() {
        let (ring, wanted, _) = setup();
        let on = labels(&[(SHARD_LABEL, wanted)]);
        assert_eq!(next_move(&ring, "team-a", "web", &on), None);
        let draining = labels(&[(SHARD_LABEL, wanted), (DRAIN_LABEL, "true")]);
        assert_eq!(
            next_move(&ring, "team-a", "web", &draining),
            Some(Move::Keep)
        );
    }

    #[test]
    fn a_myapp_on_another_live_shard_is_drained_and_left_to_it_until_it_lets_go() {
        let (ring, wanted, other) = setup();
        let held = labels(&[(SHARD_LABEL, other)]);
        assert_eq!(next_move(&ring, "team-a", "web", &held), Some(Move::Drain));
        let draining = labels(&[(SHARD_LABEL, other), (DRAIN_LABEL, "true")]);
        assert_eq!(next_move(&ring, "team-a", "web", &draining), None);
        // The shard let go: both labels removed.
        assert_eq!(
            next_move(&ring, "team-a", "web", &labels(&[])),
            Some(Move::Assign(wanted.to_owned()))
        );
    }

    #[test]
    fn without_a_live_shard_nothing_moves() {
        let ring = Ring::new(Vec::<&str>::new());
        let found = labels(&[(SHARD_LABEL, "pod-0")]);
        assert_eq!(next_move(&ring, "team-a", "web", &found), None);
    }

    proptest! {
        /// The handshake's promise: the sharder never names a new shard while a live one holds
        /// the MyApp, and played out (the holder letting go when asked), every MyApp ends on
        /// the shard the ring gives it.
        #[test]
        fn no_live_shard_loses_a_myapp_it_did_not_let_go_and_every_myapp_arrives(
            live in prop::collection::btree_set("pod-[0-5]", 1..5),
            holder in proptest::option::of("pod-[0-7]"),
            draining: bool,
            name in "[a-z]{1,8}",
        ) {
            let live: BTreeSet<&str> = live.iter().map(String::as_str).collect();
            let ring = Ring::new(&live);
            let mut found = BTreeMap::new();
            if let Some(holder) = &holder {
                found.insert(SHARD_LABEL.to_owned(), holder.clone());
            }
            if draining {
                found.insert(DRAIN_LABEL.to_owned(), "true".to_owned());
            }
            for _ in 0..4 {
                let holder = found.get(SHARD_LABEL).cloned();
                match next_move(&ring, "ns", &name, &found) {
                    None => {
                        if !found.contains_key(DRAIN_LABEL) {
                            break;
                        }
                        // The live holder answers the drain: it lets go.
                        found.clear();
                    }
                    Some(Move::Assign(shard)) => {
                        prop_assert!(
                            holder.as_deref().is_none_or(|h| !live.contains(h)),
                            "assigned to {} while live {:?} held it", shard, holder
                        );
                        found.clear();
                        found.insert(SHARD_LABEL.to_owned(), shard);
                    }
                    Some(Move::Drain) => {
                        found.insert(DRAIN_LABEL.to_owned(), "true".to_owned());
                    }
                    Some(Move::Keep) => {
                        found.remove(DRAIN_LABEL);
                    }
                }
            }
            prop_assert_eq!(
                found.get(SHARD_LABEL).map(String::as_str),
                ring.shard_for("ns", &name)
            );
            prop_assert!(!found.contains_key(DRAIN_LABEL));
        }
    }
}
