//! The order of a merged associative list (a list-map or a set), as structured-merge-diff's
//! `typed/merge.go` (`visitListItems`) makes it when server-side apply merges the applied
//! configuration (right) into the live object (left): the configuration's items in its order,
//! each live-only item kept where it stood relative to the shared items around it.

use std::collections::{HashSet, VecDeque};

/// The merged list as pairs of (live index, configuration index) over the items' keys: both
/// for a shared item, one for an item only on that side. A duplicated key pairs with its first
/// occurrence, as the walker's index of observed elements does.
pub(super) fn merged_order(
    live: &[String],
    config: &[String],
) -> Vec<(Option<usize>, Option<usize>)> {
    let first = |keys: &[String], key: &str| keys.iter().position(|k| k == key);
    let in_config = |key: &str| first(config, key).is_some();
    // The shared items in the configuration's order: the live list is walked so that each one
    // is emitted when the configuration reaches it, not where the live list had it.
    let mut shared: VecDeque<&str> = config
        .iter()
        .filter(|k| first(live, k).is_some())
        .map(String::as_str)
        .collect();
    let mut next_shared = shared.pop_front();
    let mut merged: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(live.len().max(config.len()));
    let (mut l, mut r) = (0, 0);
    while l < live.len() || r < config.len() {
        if l < live.len() && r < config.len() {
            let key = live[l].as_str();
            if key == config[r] {
                merged.insert(key);
                out.push((Some(l), Some(r)));
                (l, r) = (l + 1, r + 1);
                next_shared = shared.pop_front();
                continue;
            }
            if in_config(key) && next_shared.is_some_and(|next| next != key) {
                // A shared item the configuration has not reached yet.
                l += 1;
                continue;
            }
        }
        if l < live.len() {
            let key = live[l].as_str();
            if !in_config(key) {
                out.push((Some(l), None));
                l += 1;
                continue;
            } else if merged.contains(key) {
                l += 1;
            }
        }
        if r < config.len() {
            let key = config[r].as_str();
            merged.insert(key);
            out.push((first(live, key), Some(r)));
            r += 1;
            if next_shared == Some(key) {
                next_shared = shared.pop_front();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merged keys, each marked by where it came from: `a` both, `a<` live only, `a>`
    /// configuration only.
    fn merged(live: &str, config: &str) -> String {
        let keys = |s: &str| -> Vec<String> { s.split_whitespace().map(str::to_owned).collect() };
        let (live, config) = (keys(live), keys(config));
        merged_order(&live, &config)
            .into_iter()
            .map(|pair| match pair {
                (Some(l), Some(_)) => live[l].clone(),
                (Some(l), None) => format!("{}<", live[l]),
                (None, Some(r)) => format!("{}>", config[r]),
                (None, None) => unreachable!(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn the_merged_list_follows_the_configuration_with_live_only_items_interleaved() {
        // (live, applied configuration, merged)
        let cases = [
            ("a b c", "a b c", "a b c"),
            // Reordered: the configuration's order wins.
            ("a b c", "c b a", "c b a"),
            ("a b c", "b a", "b c< a"),
            // Inserted in the middle, at the start, at the end.
            ("a c", "a b c", "a b> c"),
            ("b c", "a b c", "a> b c"),
            ("a b", "a b c", "a b c>"),
            // Items only in the live object (another manager's) stay beside the shared item
            // they followed.
            ("a x b y c", "a b c", "a x< b y< c"),
            ("x a b", "b a", "x< b a"),
            ("a x b", "b a", "x< b a"),
            ("a x b", "b z a", "x< b z> a"),
            // Nothing shared.
            ("x y", "a b", "x< y< a> b>"),
            ("", "a b", "a> b>"),
            ("x y", "", "x< y<"),
        ];
        for (live, config, want) in cases {
            assert_eq!(
                merged(live, config),
                want,
                "live {live:?}, applied {config:?}"
            );
        }
    }
}
