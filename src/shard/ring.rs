//! The ring: which live shard reconciles a MyApp.
//!
//! Consistent hashing with virtual nodes. Each shard puts [`POINTS_PER_SHARD`] points on a
//! 64-bit circle, and a MyApp belongs to the shard owning the first point at or after its key's
//! hash, wrapping around. A shard that joins takes about 1/n of the MyApps, and only from the
//! arcs its points land in; a shard that leaves gives away only its own. Children are not
//! placed here: they follow their MyApp.
//!
//! Assignments outlive the process (they are written into labels), so the hash must give the
//! same answer in every build, Rust version and platform, which `DefaultHasher` does not
//! promise: FNV-1a over the bytes, then a 64-bit finalizer, because FNV-1a alone leaves keys
//! that differ only in their last bytes (`a#1`, `a#2`, ...) close together on the circle.

use std::fmt::Write as _;

/// Points each shard puts on the circle. The arcs' spread shrinks with the square root of the
/// points, and the largest shard sets how long a change of every MyApp takes and how much one
/// replica holds: for three or five shards named like pods, the largest owned up to 7 % more
/// than its fair share of the circle with 1,024 points, and up to 4 % more with 4,096. A ring of
/// five shards is 200 KiB, rebuilt only when the shards change, and a lookup is a binary search.
pub const POINTS_PER_SHARD: u32 = 4096;

/// The live shards and the points they own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    /// Shard names, sorted and distinct: a shard's index is its place here.
    shards: Vec<Box<str>>,
    /// Every shard's points, sorted: a tie goes to the shard named first, so every replica
    /// that sees the same shards builds the same ring.
    points: Vec<u64>,
    /// The index in `shards` of the shard owning each point of `points` (apart from them:
    /// a pair would be padded to 16 bytes).
    owners: Vec<u16>,
}

impl Ring {
    /// The ring of `shards` (in any order, repeats ignored).
    pub fn new<S: AsRef<str>>(shards: impl IntoIterator<Item = S>) -> Self {
        let mut names: Vec<Box<str>> = shards.into_iter().map(|s| s.as_ref().into()).collect();
        names.sort_unstable();
        names.dedup();
        // A shard's index is a u16: far more shards than any deployment runs.
        names.truncate(usize::from(u16::MAX) + 1);
        let mut points = Vec::with_capacity(names.len() * POINTS_PER_SHARD as usize);
        let mut label = String::new();
        for (index, name) in (0u16..).zip(&names) {
            for point in 0..POINTS_PER_SHARD {
                label.clear();
                // Writing into a String cannot fail.
                let _ = write!(label, "{name}#{point}");
                points.push((hash(label.as_bytes()), index));
            }
        }
        points.sort_unstable();
        let (points, owners) = points.into_iter().unzip();
        Self {
            shards: names,
            points,
            owners,
        }
    }

    /// Whether no shard is live: then no MyApp has a shard.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The shards, sorted by name.
    pub fn shards(&self) -> impl ExactSizeIterator<Item = &str> {
        self.shards.iter().map(AsRef::as_ref)
    }

    /// Whether `shard` is on the ring: a live shard.
    pub fn has(&self, shard: &str) -> bool {
        self.shards.binary_search_by(|s| (**s).cmp(shard)).is_ok()
    }

    /// The shard that reconciles the MyApp `namespace/name`, if any shard is live.
    pub fn shard_for(&self, namespace: &str, name: &str) -> Option<&str> {
        let key = key_hash(namespace, name);
        let at = self.points.partition_point(|&point| point < key);
        let index = self.owners.get(at).or_else(|| self.owners.first())?;
        Some(&self.shards[usize::from(*index)])
    }
}

/// A MyApp's place on the circle: its namespace and name, which no two MyApps share.
fn key_hash(namespace: &str, name: &str) -> u64 {
    let mut state = fnv1a(FNV_OFFSET, namespace.as_bytes());
    // A byte no namespace holds, so that ("a", "bc") and ("ab", "c") differ.
    state = fnv1a(state, b"/");
    finalize(fnv1a(state, name.as_bytes()))
}

fn hash(bytes: &[u8]) -> u64 {
    finalize(fnv1a(FNV_OFFSET, bytes))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state ^= u64::from(byte);
        state = state.wrapping_mul(0x0100_0000_01b3);
    }
    state
}

/// MurmurHash3's 64-bit finalizer: every input bit moves every output bit.
fn finalize(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn keys(count: usize) -> impl Iterator<Item = (String, String)> {
        (0..count).map(|i| (format!("team-{}", i % 37), format!("app-{i}")))
    }

    fn assignments(ring: &Ring, count: usize) -> Vec<String> {
        keys(count)
            .map(|(ns, name)| ring.shard_for(&ns, &name).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn no_shard_means_no_assignment() {
        let ring = Ring::new(Vec::<&str>::new());
        assert!(ring.is_empty());
        assert_eq!(ring.shard_for("default", "web"), None);
    }

    #[test]
    fn one_shard_takes_everything() {
        let ring = Ring::new(["only"]);
        assert!(assignments(&ring, 1_000).iter().all(|s| s == "only"));
    }

    #[test]
    fn the_ring_depends_on_the_set_of_shards_alone() {
        let ring = Ring::new(["b", "c", "a"]);
        assert_eq!(ring, Ring::new(["a", "b", "c", "b"]));
        assert_eq!(ring.shards().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(ring.has("b") && !ring.has("d") && !ring.has(""));
    }

    /// Assignments are written into labels, so a build that hashed differently would move
    /// MyApps between shards on upgrade. These values were computed apart from this code, from
    /// the published FNV-1a and MurmurHash3 constants.
    #[test]
    fn the_hash_is_the_same_in_every_build() {
        assert_eq!(hash(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(key_hash("default", "web"), 0x043e_bfb5_ca03_7b82);
        let ring = Ring::new(["myapp-operator-0", "myapp-operator-1", "myapp-operator-2"]);
        let placed: Vec<_> = [
            ("default", "web"),
            ("team-a", "api"),
            ("prod", "cart"),
            ("team-a", "web"),
        ]
        .iter()
        .map(|(ns, name)| ring.shard_for(ns, name).unwrap())
        .collect();
        assert_eq!(
            placed,
            [
                "myapp-operator-1",
                "myapp-operator-1",
                "myapp-operator-2",
                "myapp-operator-0"
            ]
        );
    }

    #[test]
    fn a_namespace_and_name_are_not_confused_with_another_split_of_the_same_text() {
        assert_ne!(key_hash("ab", "c"), key_hash("a", "bc"));
    }

    #[test]
    fn keys_spread_evenly_over_the_shards() {
        for shards in [2, 3, 5] {
            let ring = Ring::new((0..shards).map(|i| format!("myapp-operator-{i}")));
            let count = 30_000;
            let mut held: HashMap<String, usize> = HashMap::new();
            for shard in assignments(&ring, count) {
                *held.entry(shard).or_default() += 1;
            }
            assert_eq!(held.len(), shards);
            let fair = count as f64 / shards as f64;
            for (shard, n) in held {
                let share = n as f64 / fair;
                assert!(
                    (0.9..=1.1).contains(&share),
                    "{shard} holds {n} of {count} keys, {share:.2} of a fair share among {shards}"
                );
            }
        }
    }

    fn names() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set("[a-z][a-z0-9-]{0,20}", 1..7)
            .prop_map(|set| set.into_iter().collect())
    }

    proptest! {
        #[test]
        fn a_joining_shard_takes_keys_only_for_itself_and_about_its_share(
            shards in names(),
            joining in "[a-z][a-z0-9-]{0,20}",
        ) {
            prop_assume!(!shards.contains(&joining));
            let before = Ring::new(&shards);
            let after = Ring::new(shards.iter().chain([&joining]));
            let count = 4_000;
            let (old, new) = (assignments(&before, count), assignments(&after, count));
            let mut moved = 0;
            for (old, new) in old.iter().zip(&new) {
                if old != new {
                    prop_assert_eq!(new, &joining, "a key moved between shards that stayed");
                    moved += 1;
                }
            }
            let fair = count as f64 / (shards.len() + 1) as f64;
            prop_assert!(
                (0.7 * fair..=1.3 * fair).contains(&f64::from(moved)),
                "{} of {} keys moved to the one shard joining {} others",
                moved, count, shards.len()
            );
        }

        #[test]
        fn a_leaving_shard_gives_away_only_its_own_keys(shards in names(), leaving in 0usize..7) {
            prop_assume!(shards.len() > 1);
            let leaving = &shards[leaving % shards.len()];
            let before = Ring::new(&shards);
            let after = Ring::new(shards.iter().filter(|s| *s != leaving));
            for (old, new) in assignments(&before, 2_000).iter().zip(&assignments(&after, 2_000)) {
                if old != new {
                    prop_assert_eq!(old, leaving, "a key left a shard that stayed");
                }
                prop_assert_ne!(new, leaving);
            }
        }
    }
}
