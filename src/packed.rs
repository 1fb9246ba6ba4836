//! The children's watch caches: each object kept as one byte string, its JSON, parsed again
//! when a reconcile reads it.
//!
//! kube's reflector store keeps an `Arc` of the typed object under an `ObjectRef` key. Even with
//! the partial types of [`crate::cache`] that is some forty allocations per child, most of them
//! short strings that glibc's malloc rounds up to 32 bytes, around a 370-byte `ObjectMeta` whose
//! fields are nearly all `None`. Here a child is one exact-size allocation (the JSON its cached
//! type's `Serialize` writes, which its `Deserialize` reads back to an equal value) under a
//! `namespace/name` key, and a reconcile parses each of its two children once. That trades a
//! parse per read for memory, which at scale is mostly these caches (`benches/README.md` has
//! the operator's RSS per MyApp).
//!
//! The JSON is stored with its most common tokens (field names, and the label keys and values
//! the operator writes on every child) replaced by one byte each, which stores a Deployment in
//! under 70 % of its JSON: see [`TOKENS`].
//!
//! A (re)list updates the cache in place, where kube's `reflector::store::Writer` fills a side
//! buffer and swaps it in at `InitDone`: that holds a second copy of every object while the
//! list lasts, which made a relist's memory peak nearly twice the cache's. Here each listed
//! object is marked with the list that saw it (its bytes kept when its version is unchanged)
//! and, at `InitDone`, what the list did not hold is dropped: the cache then holds exactly the
//! list, as the swap would. Meanwhile a reader sees each object at its listed version as soon
//! as its page arrives, never an older one than before the list.

use std::{
    collections::HashMap,
    marker::PhantomData,
    sync::{Arc, LazyLock, PoisonError, RwLock},
};

use kube::{Resource, runtime::watcher};
use serde::{Serialize, de::DeserializeOwned};
use tracing::warn;

use crate::{resources, shard::SHARD_LABEL};

/// Encoded JSON and its version by `namespace/name`.
type Objects = HashMap<Box<str>, Stored>;

/// One cached object.
struct Stored {
    /// Its resourceVersion as [`version_number`] gives it: a reconcile that only asks whether a
    /// child changed reads this, and parses nothing.
    version: Option<u64>,
    /// The (re)list that last held it, or during which an event wrote it.
    list: u32,
    json: Box<[u8]>,
}

/// The strings whose quoted JSON form is stored as one byte, [`code`]'s. Compact JSON, as
/// `serde_json::to_vec` writes it, holds none of those bytes, so replacing each token by its
/// byte and each such byte by its token gives back every byte as it was, wherever a token is
/// found. Longest and most repeated first; at most 43.
const TOKENS: &[&str] = &[
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/name",
    resources::FIELD_MANAGER,
    resources::APP_NAME,
    resources::APPLIED_DIGEST_ANNOTATION,
    "metadata",
    "namespace",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "ownerReferences",
    "apiVersion",
    "example.com/v1",
    "MyApp",
    "controller",
    "blockOwnerDeletion",
    "labels",
    "annotations",
    "matchLabels",
    "template",
    "containers",
    "containerPort",
    "protocol",
    "observedGeneration",
    "updatedReplicas",
    "availableReplicas",
    "conditions",
    "lastTransitionTime",
    "MinimumReplicasAvailable",
    "NewReplicaSetAvailable",
    "targetPort",
    // Past the first 32, in the second range of bytes.
    SHARD_LABEL,
];

/// The first byte of the second range of [`code`]s.
const SECOND_RANGE: u8 = 0xF5;

/// The byte the `index`-th token is stored as: 0x00 to 0x1F, which compact JSON never holds
/// (whitespace is not written and control characters in strings are escaped), then 0xF5 to
/// 0xFF, which UTF-8 never holds (and `serde_json` writes UTF-8).
fn code(index: usize) -> u8 {
    match u8::try_from(index) {
        Ok(low @ 0..0x20) => low,
        _ => SECOND_RANGE + (index - 0x20) as u8,
    }
}

/// The index of the token that `byte` stands for, if it stands for one.
fn token_of(byte: u8) -> Option<usize> {
    match byte {
        0..0x20 => Some(usize::from(byte)),
        SECOND_RANGE.. => Some(usize::from(byte - SECOND_RANGE) + 0x20),
        _ => None,
    }
}

/// [`TOKENS`] as they appear in JSON, quotes included.
static QUOTED: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    TOKENS
        .iter()
        .map(|token| serde_json::to_vec(token).unwrap_or_default())
        .collect()
});

/// The indices in [`QUOTED`] by length: `BY_LENGTH[n]` holds the tokens `n` bytes long.
static BY_LENGTH: LazyLock<Vec<Vec<usize>>> = LazyLock::new(|| {
    let longest = QUOTED.iter().map(Vec::len).max().unwrap_or_default();
    let mut by_length = vec![Vec::new(); longest + 1];
    for (index, quoted) in QUOTED.iter().enumerate() {
        by_length[quoted.len()].push(index);
    }
    by_length
});

/// `json` with every token of [`QUOTED`] replaced by its byte.
///
/// A token is a whole JSON string, and none holds a quote, so a token starts at a quote only
/// if it ends at the next one: that string is compared with the tokens of its length alone
/// (at most six), not with all of them: every watch event of every child is encoded, so a
/// comparison per token at every quote would show in the operator's CPU while converging.
fn encode(json: &[u8]) -> Vec<u8> {
    let (quoted, by_length) = (&*QUOTED, &*BY_LENGTH);
    let mut out = Vec::with_capacity(json.len() / 2);
    let mut rest = json;
    while let Some((&first, tail)) = rest.split_first() {
        let token = (first == b'"')
            .then(|| tail.iter().position(|&b| b == b'"'))
            .flatten()
            .and_then(|end| {
                let string = &rest[..end + 2];
                by_length
                    .get(string.len())?
                    .iter()
                    .copied()
                    .find(|&index| quoted[index] == string)
            });
        match token {
            Some(index) => {
                out.push(code(index));
                rest = &rest[quoted[index].len()..];
            }
            None => {
                out.push(first);
                rest = tail;
            }
        }
    }
    out
}

/// What [`encode`] was given.
fn decode(encoded: &[u8]) -> Vec<u8> {
    let quoted = &*QUOTED;
    let mut out = Vec::with_capacity(encoded.len() * 2);
    for &byte in encoded {
        match token_of(byte).and_then(|index| quoted.get(index)) {
            Some(token) => out.extend_from_slice(token),
            None => out.push(byte),
        }
    }
    out
}

/// A resourceVersion as a number: itself when it is a decimal integer below 2^63 written
/// without a sign or leading zeros (as every API server's is), else a hash of its text with
/// the top bit set, so that the two kinds never meet and [`version_text`] gives a number's text
/// back. Only equality is asked of it.
pub fn version_number(version: &str) -> u64 {
    let plain = version.bytes().all(|b| b.is_ascii_digit()) && !version.starts_with('0');
    match version.parse::<u64>() {
        Ok(number) if number < 1 << 63 && (plain || version == "0") => number,
        _ => {
            let mut hasher = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(version, &mut hasher);
            std::hash::Hasher::finish(&hasher) | 1 << 63
        }
    }
}

/// The resourceVersion that [`version_number`] made `number` of, if it was a number.
pub fn version_text(number: u64) -> Option<String> {
    (number < 1 << 63).then(|| number.to_string())
}

/// The reading half of a cache of `K`s.
pub struct Packed<K> {
    objects: Arc<RwLock<Objects>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
            kind: PhantomData,
        }
    }
}

/// The writing half, fed every event of the watch.
pub struct PackedWriter<K> {
    objects: Arc<RwLock<Objects>>,
    /// The current (or last) list, counted from `Init` to `Init`.
    list: u32,
    kind: PhantomData<fn() -> K>,
}

/// An empty cache of `K`s: its reading and writing halves.
pub fn packed<K>() -> (Packed<K>, PackedWriter<K>) {
    let objects = Arc::new(RwLock::new(Objects::new()));
    let reader = Packed {
        objects: objects.clone(),
        kind: PhantomData,
    };
    let writer = PackedWriter {
        objects,
        list: 0,
        kind: PhantomData,
    };
    (reader, writer)
}

/// An object's `namespace/name`, one allocation: the key of the caches here, of the resync's
/// passes and of a MyApp relist's listed set. Neither a namespace nor a name can hold a `/`.
pub(crate) fn key(namespace: &str, name: &str) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
}

fn key_of<K: Resource>(object: &K) -> Box<str> {
    let meta = object.meta();
    key(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl<K: Resource + Serialize> PackedWriter<K> {
    /// Applies one watch event, as kube's reflector would to its store.
    pub fn apply(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => {
                if let Some(stored) = pack(object, self.list) {
                    self.write().insert(key_of(object), stored);
                }
            }
            watcher::Event::Delete(object) => {
                self.write().remove(&key_of(object));
            }
            // A list given up half-way (the watcher starts over with `Init`) leaves its marks
            // behind; only the marks of the list that reaches `InitDone` count.
            watcher::Event::Init => self.list = self.list.wrapping_add(1),
            watcher::Event::InitApply(object) => {
                let key = key_of(object);
                let version = object
                    .meta()
                    .resource_version
                    .as_deref()
                    .map(version_number);
                let mut objects = self.write();
                match objects.get_mut(&key) {
                    Some(stored) if version.is_some() && stored.version == version => {
                        stored.list = self.list;
                    }
                    _ => {
                        drop(objects);
                        if let Some(stored) = pack(object, self.list) {
                            self.write().insert(key, stored);
                        }
                    }
                }
            }
            watcher::Event::InitDone => {
                let list = self.list;
                // Freed after the lock is released.
                let gone: Vec<_> = self
                    .write()
                    .extract_if(|_, stored| stored.list != list)
                    .collect();
                drop(gone);
            }
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Objects> {
        self.objects.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `object` as JSON in an allocation of its exact size. Serializing the cached types cannot
/// fail (every map key is a string); were it to, the object is left out, so reconciles see the
/// child as missing and apply it again, and the failure is logged.
fn pack<K: Resource + Serialize>(object: &K, list: u32) -> Option<Stored> {
    match serde_json::to_vec(object) {
        Ok(json) => Some(Stored {
            version: object
                .meta()
                .resource_version
                .as_deref()
                .map(version_number),
            list,
            json: encode(&json).into_boxed_slice(),
        }),
        Err(error) => {
            let meta = object.meta();
            warn!(name = ?meta.name, namespace = ?meta.namespace, %error, "Child not cached: cannot serialize it");
            None
        }
    }
}

impl<K: DeserializeOwned> Packed<K> {
    /// The object named `name` in `namespace`, if the cache holds it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<K> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        let json = decode(&objects.get(&*key(namespace, name))?.json);
        drop(objects);
        match serde_json::from_slice(&json) {
            Ok(object) => Some(object),
            // Only what `pack` wrote is read back; as in `pack`, the child then reads as
            // missing and is applied again.
            Err(error) => {
                warn!(name, namespace, %error, "Cached child cannot be read back");
                None
            }
        }
    }

    /// The [`version_number`] of the object named `name` in `namespace`, if the cache holds
    /// it, without parsing it.
    pub fn version(&self, namespace: &str, name: &str) -> Option<u64> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        objects.get(&*key(namespace, name))?.version
    }

    /// How many objects the cache holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether the cache holds nothing.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{CachedDeployment, CachedService};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    #[test]
    fn versions_that_are_not_numbers_are_compared_by_their_text() {
        assert_eq!(version_number("42"), 42);
        assert_eq!(version_text(version_number("42")).as_deref(), Some("42"));
        assert_eq!(version_text(version_number("0")).as_deref(), Some("0"));
        for not_plain in ["007", "+7", "abc", "", "18446744073709551615"] {
            let number = version_number(not_plain);
            assert_eq!(version_text(number), None, "{not_plain}");
        }
        assert_ne!(version_number("007"), version_number("7"));
        assert_ne!(version_number("+7"), version_number("7"));
        assert_eq!(version_number("abc"), version_number("abc"));
        assert_ne!(version_number("abc"), version_number("abd"));
        assert_ne!(version_number("abc"), version_number("0"));
    }

    #[test]
    fn every_token_has_a_byte_of_its_own_that_compact_json_never_holds() {
        let codes: Vec<u8> = (0..TOKENS.len()).map(code).collect();
        assert!(
            codes.iter().all(|c| !(0x20..SECOND_RANGE).contains(c)),
            "{} tokens: more than the two ranges hold",
            TOKENS.len()
        );
        assert!(
            codes
                .iter()
                .enumerate()
                .all(|(i, &c)| token_of(c) == Some(i)),
            "a byte reads back as another token"
        );
        assert!((0x20..SECOND_RANGE).all(|byte| token_of(byte).is_none()));
        let mut seen = std::collections::HashSet::new();
        assert!(
            TOKENS.iter().all(|t| seen.insert(t)),
            "a token is listed twice"
        );
    }

    proptest! {
        // Any compact JSON, tokens or not, inside strings, escaped or not, comes back whole.
        #[test]
        fn decoding_gives_back_what_was_encoded(
            parts in proptest::collection::vec(
                prop_oneof![
                    proptest::sample::select(TOKENS.to_vec()).prop_map(str::to_owned),
                    ".{0,12}",
                    Just("\\\"".to_owned()),
                ],
                0..12,
            ),
        ) {
            let text = parts.concat();
            let json = serde_json::to_vec(&serde_json::json!({ &text: [&text, {"k": &text}] })).unwrap();
            prop_assert!(json.iter().all(|&b| token_of(b).is_none()));
            prop_assert_eq!(encode(&json), encode_at_every_quote(&json));
            prop_assert_eq!(decode(&encode(&json)), json);
        }
    }

    /// [`encode`] as first written: every token tried at every quote.
    fn encode_at_every_quote(json: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = json;
        while let Some((&first, tail)) = rest.split_first() {
            let token = (first == b'"')
                .then(|| QUOTED.iter().position(|q| rest.starts_with(q)))
                .flatten();
            match token {
                Some(index) => {
                    out.push(code(index));
                    rest = &rest[QUOTED[index].len()..];
                }
                None => {
                    out.push(first);
                    rest = tail;
                }
            }
        }
        out
    }

    fn deployment(name: &str, version: &str) -> CachedDeployment {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": name, "namespace": "shop", "resourceVersion": version, "generation": 2,
                "uid": "5d7e8f2a-0000-4000-8000-000000000001",
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"app.kubernetes.io/instance": name, "team": "a", SHARD_LABEL: "pod-1"},
                "annotations": {crate::resources::APPLIED_DIGEST_ANNOTATION: "abc"},
                "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "MyApp", "name": name,
                                     "uid": "u1", "controller": true, "blockOwnerDeletion": true}],
            },
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/instance": name}},
                    "spec": {"containers": [{
                        "name": "app", "image": "ghcr.io/example/web:1.4.2",
                        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": ""}],
                    }]},
                },
            },
            "status": {
                "observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 2,
                "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                                "lastTransitionTime": "2026-12-01T10:00:05Z"}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_child_reads_back_equal_to_what_the_watch_delivered() {
        let (cache, mut writer) = packed::<CachedDeployment>();
        let web = deployment("web", "7");
        writer.apply(&watcher::Event::Apply(web.clone()));
        assert_eq!(cache.get("shop", "web"), Some(web.clone()));
        assert_eq!(cache.get("other", "web"), None);
        assert_eq!(cache.get("shop", "we"), None);
        assert_eq!(
            cache.version("shop", "web"),
            Some(7),
            "read without parsing"
        );
        assert_eq!(cache.version("other", "web"), None);

        let service: CachedService = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "8",
                         "labels": {"a": "b"}},
            "spec": {"type": "ClusterIP", "selector": {"a": "b"},
                     "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]},
        }))
        .unwrap();
        let (services, mut writer) = packed::<CachedService>();
        writer.apply(&watcher::Event::Apply(service.clone()));
        let read = services.get("shop", "web").unwrap();
        assert_eq!(read, service);
        assert_eq!(
            serde_json::to_value(&read).unwrap(),
            serde_json::to_value(&service).unwrap()
        );
    }

    #[test]
    fn applies_and_deletes_change_the_cache_at_once() {
        let (cache, mut writer) = packed::<CachedDeployment>();
        writer.apply(&watcher::Event::Apply(deployment("web", "7")));
        writer.apply(&watcher::Event::Apply(deployment("web", "9")));
        let version = |c: &Packed<CachedDeployment>| {
            c.get("shop", "web")
                .and_then(|d| d.metadata.resource_version)
        };
        assert_eq!(version(&cache).as_deref(), Some("9"));
        assert_eq!(cache.version("shop", "web"), Some(9));
        assert_eq!(cache.len(), 1);
        writer.apply(&watcher::Event::Delete(deployment("web", "10")));
        assert!(cache.is_empty());
    }

    #[test]
    fn a_relist_updates_in_place_and_at_its_end_the_cache_holds_exactly_the_list() {
        let (cache, mut writer) = packed::<CachedDeployment>();
        for (name, version) in [("gone", "1"), ("web", "2"), ("same", "3")] {
            writer.apply(&watcher::Event::Apply(deployment(name, version)));
        }
        let version = |name: &str| {
            cache
                .get("shop", name)
                .and_then(|d| d.metadata.resource_version)
        };

        // A list given up half-way: what it alone held does not survive the next one.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(deployment("gone", "1")));
        writer.apply(&watcher::Event::InitApply(deployment("abandoned", "4")));

        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(deployment("web", "5")));
        writer.apply(&watcher::Event::InitApply(deployment("same", "3")));
        writer.apply(&watcher::Event::InitApply(deployment("new", "6")));
        // Each listed object at its listed version at once; the rest as before until the end.
        assert_eq!(version("web").as_deref(), Some("5"));
        assert_eq!(version("new").as_deref(), Some("6"));
        assert_eq!(version("gone").as_deref(), Some("1"));

        writer.apply(&watcher::Event::InitDone);
        assert_eq!(version("gone"), None);
        assert_eq!(version("abandoned"), None);
        let listed: Vec<_> = ["web", "same", "new"].map(version).into();
        assert_eq!(
            listed,
            [Some("5".into()), Some("3".into()), Some("6".into())]
        );
        assert_eq!(cache.len(), 3);

        // Events after the list belong to it: the next list's end keeps what it holds.
        writer.apply(&watcher::Event::Apply(deployment("later", "7")));
        writer.apply(&watcher::Event::Init);
        for (name, v) in [("web", "5"), ("same", "3"), ("new", "6"), ("later", "7")] {
            writer.apply(&watcher::Event::InitApply(deployment(name, v)));
        }
        writer.apply(&watcher::Event::InitDone);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.get("shop", "same"), Some(deployment("same", "3")));
    }

    #[test]
    fn a_cached_child_is_kept_as_its_json_in_under_70_percent_of_the_bytes() {
        let (cache, mut writer) = packed::<CachedDeployment>();
        let web = deployment("web", "7");
        writer.apply(&watcher::Event::Apply(web.clone()));
        let objects = cache.objects.read().unwrap();
        let encoded = &objects.get("shop/web").unwrap().json;
        let json = decode(encoded);
        let parsed: Value = serde_json::from_slice(&json).unwrap();
        assert!(
            encoded.len() * 10 < json.len() * 7,
            "{} bytes stored for {} of JSON",
            encoded.len(),
            json.len()
        );
        assert_eq!(parsed, serde_json::to_value(&web).unwrap());
        let shard_label = TOKENS.iter().position(|&t| t == SHARD_LABEL).unwrap();
        assert!(
            encoded.contains(&code(shard_label)),
            "the shard label's key is stored as one byte of the second range"
        );
        // Only what the cached type keeps: no uid.
        assert_eq!(parsed["metadata"].get("uid"), None);
    }
}
