//! KEP-5866's server-side sharded list and watch (alpha in Kubernetes 1.36, behind its feature
//! gate; [`crate::SandboxBuilder::sharded_list_watch`] turns it on here): a `shardSelector`
//! query parameter of LIST and WATCH, `shardRange(<field>, '<start>', '<end>')` or several joined
//! by `||`, keeps the objects whose field's 64-bit FNV-1a hash is in `[start, end)`. The
//! fields are `object.metadata.uid` and `object.metadata.namespace`; the bounds are 64-bit
//! hex strings with a `0x` prefix. A list answers with `metadata.shardInfo.selector`, the
//! selector echoed, so that a client can tell a filtered list from a server that ignored the
//! parameter (as one without the gate does).

use serde_json::Value;

/// A parsed `shardSelector`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSelector {
    /// The text as the client sent it, echoed in `shardInfo`.
    text: String,
    ranges: Vec<ShardRange>,
}

/// One `shardRange(...)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ShardRange {
    field: ShardField,
    start: u64,
    end: u64,
}

/// The fields a shard range may hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ShardField {
    Uid,
    Namespace,
}

impl ShardSelector {
    /// Parses a `shardSelector`; the error says what is wrong, for a 400.
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = |why: String| Err(format!("invalid shardSelector {text:?}: {why}"));
        let mut ranges = Vec::new();
        for term in text.split("||") {
            let term = term.trim();
            let Some(args) = term
                .strip_prefix("shardRange(")
                .and_then(|rest| rest.strip_suffix(')'))
            else {
                return invalid(format!(
                    "{term:?} is not shardRange(<field>, '<start>', '<end>')"
                ));
            };
            let args: Vec<&str> = args.split(',').map(str::trim).collect();
            let [field, start, end] = args[..] else {
                return invalid(format!("shardRange takes 3 arguments, not {}", args.len()));
            };
            let field = match field {
                "object.metadata.uid" => ShardField::Uid,
                "object.metadata.namespace" => ShardField::Namespace,
                other => {
                    return invalid(format!(
                        "unsupported field {other:?}: object.metadata.uid or object.metadata.namespace"
                    ));
                }
            };
            let (start, end) = match (bound(start), bound(end)) {
                (Ok(start), Ok(end)) => (start, end),
                (Err(why), _) | (_, Err(why)) => return invalid(why),
            };
            if start >= end {
                return invalid(format!(
                    "the start {start:#x} is not below the end {end:#x}"
                ));
            }
            ranges.push(ShardRange { field, start, end });
        }
        Ok(Self {
            text: text.to_owned(),
            ranges,
        })
    }

    /// The selector as sent.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `object` is in one of the ranges.
    pub fn matches(&self, object: &Value) -> bool {
        self.ranges.iter().any(|range| {
            let value = match range.field {
                ShardField::Uid => &object["metadata"]["uid"],
                ShardField::Namespace => &object["metadata"]["namespace"],
            };
            let hash = fnv1a(value.as_str().unwrap_or_default().as_bytes());
            range.start <= hash && hash < range.end
        })
    }
}

/// A bound: a quoted 64-bit hex string with a `0x` prefix.
fn bound(text: &str) -> Result<u64, String> {
    let unquoted = text
        .strip_prefix('\'')
        .and_then(|t| t.strip_suffix('\''))
        .or_else(|| text.strip_prefix('"').and_then(|t| t.strip_suffix('"')))
        .ok_or_else(|| format!("the bound {text} is not a quoted string"))?;
    let hex = unquoted
        .strip_prefix("0x")
        .ok_or_else(|| format!("the bound {unquoted:?} has no 0x prefix"))?;
    if hex.is_empty() || hex.len() > 16 {
        return Err(format!("the bound {unquoted:?} is not a 64-bit hex number"));
    }
    u64::from_str_radix(hex, 16).map_err(|e| format!("the bound {unquoted:?}: {e}"))
}

/// 64-bit FNV-1a.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(uid: &str, namespace: &str) -> Value {
        json!({"metadata": {"uid": uid, "namespace": namespace}})
    }

    #[test]
    fn fnv1a_is_the_published_function() {
        // The FNV test vectors for "" and "a".
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn two_halves_of_the_uid_range_split_every_object_between_them() {
        let low = ShardSelector::parse(
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')",
        )
        .unwrap();
        let high = ShardSelector::parse(
            "shardRange(object.metadata.uid, '0x8000000000000000', '0xffffffffffffffff')",
        )
        .unwrap();
        // Random UUIDs, as the API server gives objects (FNV-1a alone does not spread keys
        // that differ only in their last bytes, such as `uid-1`, `uid-2`: all land together).
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            state
        };
        let objects: Vec<Value> = (0..1000)
            .map(|_| {
                let (a, b) = (random(), random());
                let uid = format!(
                    "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xfff,
                    (b >> 48) | 0x8000,
                    b & 0xffff_ffff_ffff
                );
                object(&uid, "default")
            })
            .collect();
        let in_low = objects.iter().filter(|o| low.matches(o)).count();
        assert!(
            (400..600).contains(&in_low),
            "{in_low} of 1000 in the low half"
        );
        for o in &objects {
            let hash = fnv1a(o["metadata"]["uid"].as_str().unwrap().as_bytes());
            // The one hash the half-open ranges leave out is the top value itself.
            assert!(low.matches(o) != high.matches(o) || hash == u64::MAX, "{o}");
        }
    }

    #[test]
    fn ranges_joined_by_or_select_either_and_namespaces_hash_too() {
        let hash = fnv1a(b"team-a");
        let exact = format!(
            "shardRange(object.metadata.namespace, '{:#018x}', '{:#018x}')",
            hash,
            hash + 1
        );
        let one = ShardSelector::parse(&exact).unwrap();
        assert!(one.matches(&object("x", "team-a")));
        assert!(!one.matches(&object("x", "team-b")));
        let either = ShardSelector::parse(&format!(
            "{exact} || shardRange(object.metadata.namespace, '{:#018x}', '{:#018x}')",
            fnv1a(b"team-b"),
            fnv1a(b"team-b") + 1
        ))
        .unwrap();
        assert!(either.matches(&object("x", "team-b")));
        assert_eq!(either.text().matches("||").count(), 1);
    }

    #[test]
    fn a_malformed_selector_says_what_is_wrong() {
        for (text, part) in [
            (
                "range(object.metadata.uid, '0x0', '0x1')",
                "is not shardRange",
            ),
            (
                "shardRange(object.metadata.name, '0x0', '0x1')",
                "unsupported field",
            ),
            ("shardRange(object.metadata.uid, '0x0')", "3 arguments"),
            (
                "shardRange(object.metadata.uid, '0', '0x1')",
                "no 0x prefix",
            ),
            (
                "shardRange(object.metadata.uid, 0x0, '0x1')",
                "not a quoted string",
            ),
            ("shardRange(object.metadata.uid, '0x2', '0x1')", "not below"),
            (
                "shardRange(object.metadata.uid, '0x0', '0x1ffffffffffffffff')",
                "64-bit",
            ),
        ] {
            let error = ShardSelector::parse(text).unwrap_err();
            assert!(error.contains(part), "{text}: {error}");
        }
    }
}
