//! Sharding by namespace on the API server (KEP-5866): each shard watches the namespaces whose
//! 64-bit FNV-1a hash falls in its ranges, and the API server filters the lists and watches,
//! so no label marks who owns what. Who serves which range is therefore written down: the
//! sharder publishes an [`Assignment`] (numbered by `generation`, each entry stamped with the
//! `term` of its shard's Lease, the Lease's acquireTime), and each shard acknowledges the
//! newest assignment it acts on ([`Ack`]) once it serves nothing outside its entry.
//!
//! The hand-over is the label mode's drain, acknowledge, reassign, for ranges:
//! - a shard's entry only ever shrinks in one generation and grows in a later one;
//! - an entry grows only after every live shard acknowledged the current generation, whose
//!   entries all lie inside the new target: so whatever any live shard still serves is
//!   disjoint from what the growth gives away;
//! - a shard that is not live, or holds its Lease in another term, loses its entry at once: its
//!   write gate closed before anyone could see its Lease expire, and a replica that lets its
//!   Lease lapse and takes it again starts a new term, in which it serves only entries stamped
//!   with that term, never what it held before.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A half-open range `[start, end)` of the namespace hash.
pub type Range = (u64, u64);

/// The 64-bit FNV-1a hash KEP-5866 gives `object.metadata.namespace`.
pub fn namespace_hash(namespace: &str) -> u64 {
    namespace.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The end of the last range. KEP-5866's bounds are 64-bit and the end is excluded, so the one
/// hash `u64::MAX` is on no shard: one namespace name in 2^64.
pub const TOP: u64 = u64::MAX;

/// One shard's entry: the ranges it serves in the term of its Lease named here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The acquireTime of the shard's Lease when the sharder wrote the entry.
    pub term: String,
    /// Disjoint, sorted ranges.
    pub ranges: Vec<Range>,
}

/// Who serves which ranges, as the sharder publishes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Raised by one at each change.
    pub generation: u64,
    /// Entries by shard identity; a shard without one serves nothing.
    pub shards: BTreeMap<String, Entry>,
}

impl Assignment {
    /// The ranges `shard` serves in `term`: none if its entry is of another term.
    pub fn ranges_of(&self, shard: &str, term: &str) -> &[Range] {
        self.shards
            .get(shard)
            .filter(|entry| entry.term == term)
            .map_or(&[], |entry| &entry.ranges)
    }
}

/// A shard's word that, in `term`, it serves nothing outside its entry of `generation`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The term of the shard's Lease.
    pub term: String,
    /// The newest generation it acts on.
    pub generation: u64,
}

/// `shardSelector` for `ranges`: KEP-5866's `shardRange` terms joined by `||`.
pub fn selector(ranges: &[Range]) -> String {
    ranges
        .iter()
        .map(|(start, end)| {
            format!("shardRange(object.metadata.namespace, '{start:#018x}', '{end:#018x}')")
        })
        .collect::<Vec<_>>()
        .join("||")
}

/// The ranges of `shards` (identities, in any order): one contiguous range each, in the order
/// of their names, cut so that each holds about as many MyApps as the others by `weights` (the
/// number of MyApps per namespace hash). A namespace is never split; without weights the hash
/// space is split evenly.
pub fn target<'a>(
    shards: impl IntoIterator<Item = &'a str>,
    weights: &BTreeMap<u64, u64>,
) -> BTreeMap<String, Vec<Range>> {
    let mut shards: Vec<&str> = shards.into_iter().collect();
    shards.sort_unstable();
    shards.dedup();
    let n = shards.len() as u64;
    if n == 0 {
        return BTreeMap::new();
    }
    let total: u64 = weights.values().sum();
    let cuts: Vec<u64> = (1..n)
        .map(|i| {
            if total == 0 {
                return ((u128::from(TOP) * u128::from(i)) / u128::from(n)) as u64;
            }
            // The first namespace past the share of the shards before this cut starts the next
            // range.
            let share = (u128::from(total) * u128::from(i)).div_ceil(u128::from(n));
            let mut seen = 0u128;
            weights
                .iter()
                .find_map(|(&hash, &weight)| {
                    let before = seen;
                    seen += u128::from(weight);
                    (before >= share).then_some(hash)
                })
                .unwrap_or(TOP)
        })
        .collect();
    let mut starts = vec![0];
    starts.extend(cuts);
    let mut ends = starts[1..].to_vec();
    ends.push(TOP);
    shards
        .into_iter()
        .zip(starts.into_iter().zip(ends))
        .map(|(shard, (start, end))| {
            let ranges = if start < end {
                vec![(start, end)]
            } else {
                vec![]
            };
            (shard.to_owned(), ranges)
        })
        .collect()
}

/// The most MyApps (by `weights`) any one shard of `target` holds.
fn largest_share(target: &BTreeMap<String, Vec<Range>>, weights: &BTreeMap<u64, u64>) -> u64 {
    target
        .values()
        .map(|ranges| {
            weights
                .iter()
                .filter(|(hash, _)| contains(ranges, **hash))
                .map(|(_, count)| count)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// Whether moving from the ranges of `current` to those of `proposed` (for the same shards) is
/// worth its moves: the largest share by `weights` would shrink by more than a fifth and by
/// more than [`REBALANCE_AT_LEAST`] MyApps. The MyApps per namespace drift; ranges cut for an
/// empty cluster (even cuts of the hash space) are what this corrects most.
pub fn worth_moving(
    current: &BTreeMap<String, Vec<Range>>,
    proposed: &BTreeMap<String, Vec<Range>>,
    weights: &BTreeMap<u64, u64>,
) -> bool {
    let (now, then) = (
        largest_share(current, weights),
        largest_share(proposed, weights),
    );
    now.saturating_sub(then) > REBALANCE_AT_LEAST && then.saturating_mul(5) < now.saturating_mul(4)
}

/// The fewest MyApps a rebalance must take off the largest shard.
pub const REBALANCE_AT_LEAST: u64 = 10;

/// The sharder's next assignment after `current`, towards `target`, given the `live` shards
/// (identity to term) and their `acks`; `None` when nothing may or need change now.
///
/// Entries of shards not live or of another term go at once, and entries shrink to their
/// target; only when nothing is left to take away, and every live shard acknowledged
/// `current`, does the target itself get published.
pub fn next(
    current: &Assignment,
    acks: &BTreeMap<String, Ack>,
    live: &BTreeMap<String, String>,
    target: &BTreeMap<String, Vec<Range>>,
) -> Option<Assignment> {
    let kept: BTreeMap<String, Entry> = current
        .shards
        .iter()
        .filter(|(shard, entry)| live.get(*shard) == Some(&entry.term))
        .filter_map(|(shard, entry)| {
            let ranges = intersect(&entry.ranges, target.get(shard).map_or(&[], Vec::as_slice));
            (!ranges.is_empty()).then(|| {
                let term = entry.term.clone();
                (shard.clone(), Entry { term, ranges })
            })
        })
        .collect();
    let generation = current.generation + 1;
    if kept != current.shards {
        return Some(Assignment {
            generation,
            shards: kept,
        });
    }
    let full: BTreeMap<String, Entry> = target
        .iter()
        .filter(|(_, ranges)| !ranges.is_empty())
        .filter_map(|(shard, ranges)| {
            let term = live.get(shard)?.clone();
            let ranges = ranges.clone();
            Some((shard.clone(), Entry { term, ranges }))
        })
        .collect();
    let settled = live.iter().all(|(shard, term)| {
        acks.get(shard)
            .is_some_and(|ack| &ack.term == term && ack.generation >= current.generation)
    });
    (full != current.shards && settled).then_some(Assignment {
        generation,
        shards: full,
    })
}

/// The parts of `a` that are also in `b` (both sorted and disjoint).
fn intersect(a: &[Range], b: &[Range]) -> Vec<Range> {
    let mut out = Vec::new();
    for &(a_start, a_end) in a {
        for &(b_start, b_end) in b {
            let (start, end) = (a_start.max(b_start), a_end.min(b_end));
            if start < end {
                out.push((start, end));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Whether `hash` is in one of `ranges`.
pub fn contains(ranges: &[Range], hash: u64) -> bool {
    ranges
        .iter()
        .any(|&(start, end)| start <= hash && hash < end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn live(shards: &[(&str, &str)]) -> BTreeMap<String, String> {
        shards
            .iter()
            .map(|(s, t)| ((*s).to_owned(), (*t).to_owned()))
            .collect()
    }

    fn weights(namespaces: impl IntoIterator<Item = (String, u64)>) -> BTreeMap<u64, u64> {
        let mut out = BTreeMap::new();
        for (namespace, count) in namespaces {
            *out.entry(namespace_hash(&namespace)).or_default() += count;
        }
        out
    }

    #[test]
    fn the_hash_is_kep_5866s_fnv_1a() {
        // FNV-1a's published test vectors.
        assert_eq!(namespace_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(namespace_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(namespace_hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn the_selector_names_the_namespace_and_both_bounds_in_full() {
        assert_eq!(
            selector(&[(0, 0x10), (0x8000_0000_0000_0000, TOP)]),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x0000000000000010')\
             ||shardRange(object.metadata.namespace, '0x8000000000000000', '0xffffffffffffffff')"
        );
    }

    #[test]
    fn the_target_covers_the_space_once_and_balances_the_myapps() {
        let counts = weights((0..40).map(|i| (format!("team-{i}"), 25)));
        let target = target(["pod-c", "pod-a", "pod-b"], &counts);
        let all: Vec<Range> = target.values().flatten().copied().collect();
        assert_eq!(all.first().map(|r| r.0), Some(0));
        assert!(all.windows(2).all(|w| w[0].1 == w[1].0), "{all:x?}");
        assert_eq!(all.last().map(|r| r.1), Some(TOP));
        let held: Vec<u64> = target
            .values()
            .map(|ranges| {
                counts
                    .iter()
                    .filter(|(h, _)| contains(ranges, **h))
                    .map(|(_, w)| w)
                    .sum()
            })
            .collect();
        // 40 namespaces of 25 over three: at most one namespace off a third each.
        assert!(held.iter().all(|h| h.abs_diff(1000 / 3) <= 25), "{held:?}");
        let even = super::target(["a", "b"], &BTreeMap::new());
        assert_eq!(even["a"], vec![(0, TOP / 2)]);
        assert_eq!(even["b"], vec![(TOP / 2, TOP)]);
    }

    #[test]
    fn ranges_cut_for_an_empty_cluster_are_recut_once_the_myapps_pile_up_on_one_shard() {
        let shards = ["pod-a", "pod-b", "pod-c"];
        let empty = target(shards, &BTreeMap::new());
        // FNV-1a puts team-0 to team-9 close together: one even third holds them all.
        let counts = weights((0..10).map(|i| (format!("team-{i}"), 100)));
        let balanced = target(shards, &counts);
        assert!(worth_moving(&empty, &balanced, &counts));
        assert!(!worth_moving(&balanced, &balanced, &counts));
        // A small drift is not worth the moves.
        let mut drifted = counts.clone();
        *drifted.values_mut().next().unwrap() += 30;
        assert!(!worth_moving(
            &balanced,
            &target(shards, &drifted),
            &drifted
        ));
        // Nor is a large share of a handful of MyApps.
        let few = weights((0..3).map(|i| (format!("team-{i}"), 1)));
        assert!(!worth_moving(&empty, &target(shards, &few), &few));
    }

    #[test]
    fn a_move_takes_from_the_holder_first_and_gives_only_after_every_ack() {
        let both = live(&[("a", "t1"), ("b", "t1")]);
        let whole = Assignment {
            generation: 3,
            shards: [(
                "a".into(),
                Entry {
                    term: "t1".into(),
                    ranges: vec![(0, TOP)],
                },
            )]
            .into(),
        };
        let target = target(["a", "b"], &BTreeMap::new());
        let shrunk = next(&whole, &BTreeMap::new(), &both, &target).unwrap();
        assert_eq!(shrunk.generation, 4);
        assert_eq!(shrunk.ranges_of("a", "t1"), &[(0, TOP / 2)]);
        assert!(shrunk.ranges_of("b", "t1").is_empty());
        let ack = |term: &str, generation| Ack {
            term: term.into(),
            generation,
        };
        // b acknowledged, a not yet: nothing is given.
        let mut acks: BTreeMap<String, Ack> = [("b".into(), ack("t1", 4))].into();
        assert_eq!(next(&shrunk, &acks, &both, &target), None);
        // a's ack of an older generation, or of another term, does not count.
        acks.insert("a".into(), ack("t1", 3));
        assert_eq!(next(&shrunk, &acks, &both, &target), None);
        acks.insert("a".into(), ack("t0", 4));
        assert_eq!(next(&shrunk, &acks, &both, &target), None);
        acks.insert("a".into(), ack("t1", 4));
        let grown = next(&shrunk, &acks, &both, &target).unwrap();
        assert_eq!(grown.ranges_of("b", "t1"), &[(TOP / 2, TOP)]);
        assert_eq!(next(&grown, &acks, &both, &target), None);
    }

    #[test]
    fn a_shard_gone_or_back_in_a_new_term_loses_its_entry_at_once() {
        let target = target(["a", "b"], &BTreeMap::new());
        let full = Assignment {
            generation: 1,
            shards: target
                .iter()
                .map(|(s, r)| {
                    let entry = Entry {
                        term: "t1".into(),
                        ranges: r.clone(),
                    };
                    (s.clone(), entry)
                })
                .collect(),
        };
        let gone = next(&full, &BTreeMap::new(), &live(&[("a", "t1")]), &target).unwrap();
        assert_eq!(gone.shards.keys().collect::<Vec<_>>(), ["a"]);
        let renewed = live(&[("a", "t1"), ("b", "t2")]);
        let back = next(&full, &BTreeMap::new(), &renewed, &target).unwrap();
        assert_eq!(back.shards.keys().collect::<Vec<_>>(), ["a"]);
        // The old entry gives a shard in a new term nothing to serve.
        assert!(full.ranges_of("b", "t2").is_empty());
    }

    /// A replica of the model: the term it holds its Lease in, and the ranges it serves.
    #[derive(Clone, Debug)]
    struct Replica {
        term: u32,
        live: bool,
        seen: u64,
        serving: Vec<Range>,
    }

    proptest! {
        /// Plays the sharder and replicas out in any interleaving of their steps (a replica
        /// acting on the newest assignment, a replica dying, coming back in a new term,
        /// joining; the sharder deciding on a set of namespaces) and checks that no two replicas
        /// live in their term ever serve one namespace hash, and that once every replica has
        /// caught up, the assignment is the target and every namespace is served.
        #[test]
        fn no_two_live_replicas_ever_serve_one_namespace(
            steps in proptest::collection::vec((0u8..6, 0usize..4), 1..120),
            namespaces in proptest::collection::vec(0u64..u64::MAX, 1..12),
        ) {
            let counts: BTreeMap<u64, u64> = namespaces.iter().map(|h| (*h, 1)).collect();
            let mut replicas: BTreeMap<String, Replica> = BTreeMap::new();
            let mut published = vec![Assignment::default()];
            let mut acks: BTreeMap<String, Ack> = BTreeMap::new();
            let name = |i: usize| format!("pod-{i}");
            for (kind, who) in steps {
                match kind {
                    // A replica acts on the newest assignment and acknowledges it.
                    0 | 1 => if let Some(replica) = replicas.get_mut(&name(who)) && replica.live {
                        let newest = published.last().unwrap();
                        replica.serving = newest.ranges_of(&name(who), &replica.term.to_string()).to_vec();
                        replica.seen = newest.generation;
                        acks.insert(name(who), Ack { term: replica.term.to_string(), generation: replica.seen });
                    },
                    // It dies: its gate closes, it serves nothing.
                    2 => if let Some(replica) = replicas.get_mut(&name(who)) {
                        replica.live = false;
                        replica.serving.clear();
                    },
                    // It joins, or comes back in a new term.
                    3 => {
                        let replica = replicas.entry(name(who)).or_insert(Replica { term: 0, live: false, seen: 0, serving: vec![] });
                        if !replica.live {
                            replica.term += 1;
                            replica.live = true;
                        }
                    }
                    // The sharder decides.
                    _ => {
                        let live_set: BTreeMap<String, String> = replicas.iter()
                            .filter(|(_, r)| r.live)
                            .map(|(n, r)| (n.clone(), r.term.to_string()))
                            .collect();
                        let target = target(live_set.keys().map(String::as_str), &counts);
                        if let Some(next) = next(published.last().unwrap(), &acks, &live_set, &target) {
                            published.push(next);
                        }
                    }
                }
                for hash in &counts {
                    let serving: Vec<&String> = replicas.iter()
                        .filter(|(_, r)| r.live && contains(&r.serving, *hash.0))
                        .map(|(n, _)| n)
                        .collect();
                    prop_assert!(serving.len() <= 1, "{:#x} served by {:?}", hash.0, serving);
                }
            }
            // Everyone catches up, the sharder decides, until nothing changes.
            let live_set: BTreeMap<String, String> = replicas.iter()
                .filter(|(_, r)| r.live)
                .map(|(n, r)| (n.clone(), r.term.to_string()))
                .collect();
            let target = target(live_set.keys().map(String::as_str), &counts);
            for _ in 0..4 {
                for (name, replica) in replicas.iter_mut().filter(|(_, r)| r.live) {
                    let newest = published.last().unwrap();
                    replica.serving = newest.ranges_of(name, &replica.term.to_string()).to_vec();
                    acks.insert(name.clone(), Ack { term: replica.term.to_string(), generation: newest.generation });
                }
                if let Some(next) = next(published.last().unwrap(), &acks, &live_set, &target) {
                    published.push(next);
                }
            }
            if !live_set.is_empty() {
                for hash in counts.keys() {
                    let serving = replicas.values().filter(|r| r.live && contains(&r.serving, *hash)).count();
                    prop_assert_eq!(serving, 1, "{:#x} not served once at the end", hash);
                }
            }
        }
    }
}
