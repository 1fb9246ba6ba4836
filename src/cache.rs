//! What the watch caches keep. Children are partial typed objects holding only the fields
//! [`crate::resources`] applies (so [`crate::resources::Desired::is_applied_to`] can compare)
//! and the status fields [`crate::status::Rollout`] reads; MyApps lose what nothing reads and
//! keep of their status what the controller reads ([`CachedMyApp`]).
//!
//! The watch caches hold one of each child per MyApp, so their size is the operator's memory.
//! A k8s-openapi `Deployment` is 2.4 KB inline and each `Container` another 2.1 KB before any
//! content, nearly all of it optional fields the operator never reads. These types deserialize
//! straight from the API's JSON (unknown fields are skipped while parsing), serialize under the
//! same field names, and inherit the `Resource` impl of the full type, so `Api` and the watcher
//! use them like the real thing. The partial types inside them are named `Slim*`, so that none
//! reads as k8s-openapi's type of the same name. [`crate::packed`] keeps each child as its JSON.

use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Service},
    apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time},
};
use kube::{Resource, core::object::HasSpec};
use serde::{Deserialize, Serialize};

use std::{
    borrow::Cow,
    hash::{DefaultHasher, Hash, Hasher},
};

use crate::{
    crd::{CONDITION_TYPES, MyApp, MyAppLike, MyAppSpec, MyAppStatus, Phase},
    resources::{
        APP_NAME, APPLIED_DIGEST_ANNOTATION, FIELD_MANAGER, GENERATION_ANNOTATION, PORT_NAME,
        REPLICAS_ANNOTATION,
    },
    shard::{DRAIN_LABEL, SHARD_LABEL},
};

/// A string read from the API. The ones the operator writes on every child (label keys and
/// values, annotation keys, `TCP`, `http`) and the ones the Deployment controller writes
/// (condition types, statuses and reasons) are shared statics, not one allocation per object:
/// with 10,000 MyApps cached, that is about 25 allocations fewer per MyApp.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Str(Cow<'static, str>);

/// The strings [`Str`] shares. Anything else is kept as read. A test checks that every string
/// the builders in `resources` emit for every MyApp alike is here.
const KNOWN: &[&str] = &[
    // What the operator writes (see `resources`).
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    APP_NAME,
    FIELD_MANAGER,
    APPLIED_DIGEST_ANNOTATION,
    GENERATION_ANNOTATION,
    REPLICAS_ANNOTATION,
    "true",
    // The generation stamp of every MyApp never edited.
    "1",
    PORT_NAME,
    "TCP",
    "ClusterIP",
    // What the Deployment controller writes in its conditions.
    "Available",
    "Progressing",
    "ReplicaFailure",
    "True",
    "False",
    "Unknown",
    "MinimumReplicasAvailable",
    "MinimumReplicasUnavailable",
    "NewReplicaSetAvailable",
    "NewReplicaSetCreated",
    "FoundNewReplicaSet",
    "ReplicaSetUpdated",
    "ProgressDeadlineExceeded",
];

impl Str {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is one of the shared statics.
    #[cfg(test)]
    fn is_shared(&self) -> bool {
        matches!(self.0, Cow::Borrowed(_))
    }

    fn known(s: &str) -> Option<Self> {
        KNOWN
            .iter()
            .find(|known| **known == s)
            .map(|known| Self(Cow::Borrowed(known)))
    }
}

impl std::ops::Deref for Str {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Str {
    fn from(s: &str) -> Self {
        Self::known(s).unwrap_or_else(|| Self(Cow::Owned(s.to_owned())))
    }
}

impl From<String> for Str {
    fn from(s: String) -> Self {
        Self::known(&s).unwrap_or(Self(Cow::Owned(s)))
    }
}

impl PartialEq<str> for Str {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Str {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for Str {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Str {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Str;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Str, E> {
                Ok(Str::from(s))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Str, E> {
                Ok(Str::from(s))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

/// A label map as a sorted list of pairs. A `BTreeMap` allocates a half-kilobyte node for even
/// one entry, and the selectors and template labels here hold two or three.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Labels(pub Vec<(Str, Str)>);

impl Labels {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl Serialize for Labels {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = Labels;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of strings to strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Labels, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(pair) = map.next_entry::<Str, Str>()? {
                    pairs.push(pair);
                }
                // As a map would: sorted, the last of duplicate keys wins.
                pairs.reverse();
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
                pairs.dedup_by(|later, earlier| later.0 == earlier.0);
                Ok(Labels(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

/// A Deployment as cached. Its labels and the operator's annotations are kept as pairs beside
/// `metadata` (whose maps would cost a half-kilobyte node each); the JSON form is unchanged.
#[derive(Resource, Clone, Debug, Default, PartialEq)]
#[resource(inherit = Deployment)]
pub struct CachedDeployment {
    /// Everything but labels and annotations.
    pub metadata: ObjectMeta,
    /// `metadata.labels`.
    pub labels: Labels,
    /// The operator's own `metadata.annotations`; others are not kept.
    pub annotations: Labels,
    pub spec: Option<SlimDeploymentSpec>,
    pub status: Option<SlimDeploymentStatus>,
}

impl<'de> Deserialize<'de> for CachedDeployment {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::<SlimDeploymentSpec, SlimDeploymentStatus>::deserialize(deserializer)?;
        let (metadata, labels, annotations) = wire.metadata.split_child();
        Ok(Self {
            metadata,
            labels,
            annotations,
            spec: wire.spec,
            status: wire.status,
        })
    }
}

impl CachedDeployment {
    /// What an apply of ours sets on it (see `resources::child_meta`): name, namespace, labels,
    /// annotations, owner references and spec. Not its status, nor what the server sets.
    pub fn applied_part(&self) -> impl Serialize + '_ {
        let metadata = &self.metadata;
        (
            &metadata.name,
            &metadata.namespace,
            &self.labels,
            &self.annotations,
            &metadata.owner_references,
            &self.spec,
        )
    }
}

impl Serialize for CachedDeployment {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireRef {
            metadata: WireMetaRef::new(&self.metadata, &self.labels, &self.annotations),
            spec: &self.spec,
            status: &self.status,
        }
        .serialize(serializer)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimDeploymentSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub selector: SlimLabelSelector,
    #[serde(default)]
    pub template: SlimPodTemplate,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimLabelSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<Labels>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimPodTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<SlimTemplateMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<SlimPodSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimTemplateMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Labels>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimPodSpec {
    #[serde(default)]
    pub containers: Vec<SlimContainer>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimContainer {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<SlimContainerPort>>,
    /// `valueFrom` is not kept: an entry set that way by someone else lacks the `value` the
    /// operator applies, so it reads as different, which it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<SlimEnvVar>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimContainerPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Str>,
    pub container_port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Str>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct SlimEnvVar {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<SlimDeploymentCondition>>,
}

/// A Deployment condition without its message and `lastUpdateTime`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimDeploymentCondition {
    #[serde(rename = "type")]
    pub type_: Str,
    pub status: Str,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A Service as cached, metadata kept as for [`CachedDeployment`]; its status is not kept.
#[derive(Resource, Clone, Debug, Default, PartialEq)]
#[resource(inherit = Service)]
pub struct CachedService {
    /// Everything but labels and annotations.
    pub metadata: ObjectMeta,
    /// `metadata.labels`.
    pub labels: Labels,
    /// The operator's own `metadata.annotations`; others are not kept.
    pub annotations: Labels,
    pub spec: Option<SlimServiceSpec>,
}

impl<'de> Deserialize<'de> for CachedService {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::<SlimServiceSpec, serde::de::IgnoredAny>::deserialize(deserializer)?;
        let (metadata, labels, annotations) = wire.metadata.split_child();
        Ok(Self {
            metadata,
            labels,
            annotations,
            spec: wire.spec,
        })
    }
}

impl Serialize for CachedService {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireRef::<_, ()> {
            metadata: WireMetaRef::new(&self.metadata, &self.labels, &self.annotations),
            spec: &self.spec,
            status: &None,
        }
        .serialize(serializer)
    }
}

/// A MyApp as its watch cache keeps it: without what nothing reads (`managedFields`, labels
/// and annotations, which `kubectl apply` fills with a whole copy of the object; all skipped
/// while parsing, not built and then dropped) but whether it is draining, and with its status
/// reduced to what the controller reads of it ([`ReportedStatus`]). Its [`SHARD_LABEL`] is
/// not kept: a shard's watch selects only the MyApps that name it, so every one it caches
/// names the same shard, which the controller knows (`controller::Config::shard`).
#[derive(Resource, Clone, Debug, PartialEq)]
#[resource(inherit = MyApp)]
pub struct CachedMyApp {
    /// Everything but labels, annotations and managedFields.
    pub metadata: ObjectMeta,
    pub spec: MyAppSpec,
    pub status: Option<ReportedStatus>,
    /// Whether it carries [`DRAIN_LABEL`]: its shard is asked to let it go.
    pub draining: bool,
}

impl MyAppLike for CachedMyApp {}

impl HasSpec for CachedMyApp {
    type Spec = MyAppSpec;
    fn spec(&self) -> &MyAppSpec {
        &self.spec
    }
    fn spec_mut(&mut self) -> &mut MyAppSpec {
        &mut self.spec
    }
}

impl<'de> Deserialize<'de> for CachedMyApp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            metadata: WireMeta<ShardLabels<serde::de::IgnoredAny>>,
            spec: MyAppSpec,
            #[serde(default)]
            status: Option<MyAppStatus>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let (metadata, labels, _annotations) = wire.metadata.split();
        let labels = labels.unwrap_or_default();
        Ok(Self {
            metadata,
            spec: wire.spec,
            status: wire.status.as_ref().map(ReportedStatus::of),
            draining: labels.draining,
        })
    }
}

/// What the MyApp cache and the mutating route read of a MyApp's labels: those that say which
/// shard reconciles it, the shard label's value read as an `S` (the cache, which needs only
/// the drain label, skips it with `IgnoredAny`). The others are skipped as they are read, their
/// keys compared without being copied.
pub(crate) struct ShardLabels<S> {
    /// The shard label's value.
    pub(crate) shard: Option<S>,
    /// Whether the drain label is set.
    pub(crate) draining: bool,
}

impl<S> Default for ShardLabels<S> {
    fn default() -> Self {
        Self {
            shard: None,
            draining: false,
        }
    }
}

impl<'de, S: Deserialize<'de>> Deserialize<'de> for ShardLabels<S> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Key(Option<&'static str>);
        impl<'de> Deserialize<'de> for Key {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Kept;
                impl serde::de::Visitor<'_> for Kept {
                    type Value = Key;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a label key")
                    }
                    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key, E> {
                        Ok(Key([SHARD_LABEL, DRAIN_LABEL]
                            .into_iter()
                            .find(|k| *k == key)))
                    }
                }
                deserializer.deserialize_str(Kept)
            }
        }
        struct Pairs<S>(std::marker::PhantomData<S>);
        impl<'de, S: Deserialize<'de>> serde::de::Visitor<'de> for Pairs<S> {
            type Value = ShardLabels<S>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of strings to strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ShardLabels<S>, A::Error> {
                let mut kept = ShardLabels::default();
                while let Some(Key(key)) = map.next_key()? {
                    match key {
                        Some(SHARD_LABEL) => kept.shard = Some(map.next_value::<S>()?),
                        Some(_) => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            kept.draining = true;
                        }
                        None => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(kept)
            }
        }
        deserializer.deserialize_map(Pairs(std::marker::PhantomData))
    }
}

/// A MyApp as its cache would hold it once the watch sent it.
#[cfg(test)]
impl From<MyApp> for CachedMyApp {
    fn from(app: MyApp) -> Self {
        cached(&app)
    }
}

/// What the controller reads of a MyApp's status as reported. A whole status is a selector and
/// three conditions of four strings each, about a kilobyte per MyApp; this allocates nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportedStatus {
    /// [`digest`] of the whole status: a plan writes the status it computes when that one's
    /// digest differs ([`ReportedStatus::is`]).
    digest: u64,
    /// `observedGeneration`: whether a MyApp's watch event triggers a reconcile.
    pub observed_generation: Option<i64>,
    /// `phase`: the phase Event says which phase the app left.
    pub phase: Option<Phase>,
    /// For each of [`CONDITION_TYPES`], whether its condition is `True` (else `False`) and its
    /// `lastTransitionTime`, which a condition keeps while its status does not flip. A missing
    /// condition, or one of another status (`Unknown`), is `None`: the operator writes only
    /// `True` and `False`, so no status it computes keeps that one's time. The CRD keys
    /// conditions by type, so a status holds at most one of each.
    transitions: [Option<(bool, Time)>; 3],
}

impl ReportedStatus {
    /// What the controller reads of `status`.
    pub fn of(status: &MyAppStatus) -> Self {
        let transition = |type_: &str| {
            let condition = status.conditions.iter().find(|c| c.type_ == type_)?;
            let is_true = match condition.status.as_str() {
                "True" => true,
                "False" => false,
                _ => return None,
            };
            Some((is_true, condition.last_transition_time.clone()))
        };
        Self {
            digest: digest(status),
            observed_generation: status.observed_generation,
            phase: status.phase,
            transitions: CONDITION_TYPES.map(transition),
        }
    }

    /// The `lastTransitionTime` of the condition of `type_`, if it has `status`.
    pub fn transitioned(&self, type_: &str, status: &str) -> Option<&Time> {
        let at = CONDITION_TYPES.iter().position(|t| *t == type_)?;
        let (is_true, time) = self.transitions[at].as_ref()?;
        (status == if *is_true { "True" } else { "False" }).then_some(time)
    }

    /// Whether `status` is the status reported (but for a digest collision, one in 2^64).
    pub fn is(&self, status: &MyAppStatus) -> bool {
        self.digest == digest(status)
    }
}

/// A hash of every field of `status`, so equal statuses have equal digests and statuses that
/// differ anywhere (a condition's message, a transition time to the nanosecond) differ but for
/// a collision. SipHash under fixed keys (`DefaultHasher::new`), not `RandomState`: the digest
/// of a status parsed from a watch event and of the status a plan computes must compare, within
/// the process; no digest leaves it.
fn digest(status: &MyAppStatus) -> u64 {
    // Destructured whole, so that a field added to the status cannot be left out.
    let MyAppStatus {
        observed_generation,
        replicas,
        available_replicas,
        phase,
        selector,
        conditions,
    } = status;
    let mut hasher = DefaultHasher::new();
    (
        observed_generation,
        replicas,
        available_replicas,
        phase,
        selector,
    )
        .hash(&mut hasher);
    conditions.len().hash(&mut hasher);
    for condition in conditions {
        let Condition {
            type_,
            status,
            reason,
            message,
            observed_generation,
            last_transition_time,
        } = condition;
        (type_, status, reason, message, observed_generation).hash(&mut hasher);
        last_transition_time.0.hash(&mut hasher);
    }
    hasher.finish()
}

/// A cached child as the API sends it.
#[derive(Deserialize)]
struct Wire<S, T> {
    metadata: WireMeta<Labels>,
    #[serde(default)]
    spec: Option<S>,
    #[serde(default)]
    status: Option<T>,
}

/// `metadata` as the API sends it, but for `managedFields`: a third of a child's JSON, which
/// no cache keeps, so it is skipped while parsing instead of being built into nested maps and
/// dropped. Every other field of `ObjectMeta` is named here (none is flattened, which would
/// buffer every metadata key first): `split` builds an `ObjectMeta` field by field, so it stops
/// compiling when k8s-openapi adds one.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta<L> {
    labels: Option<L>,
    annotations: Option<L>,
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    finalizers: Option<Vec<String>>,
    owner_references: Option<Vec<OwnerReference>>,
    self_link: Option<String>,
}

impl<L> WireMeta<L> {
    /// `ObjectMeta` without labels, annotations and managedFields; labels and annotations apart.
    fn split(self) -> (ObjectMeta, Option<L>, Option<L>) {
        let meta = ObjectMeta {
            name: self.name,
            generate_name: self.generate_name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            generation: self.generation,
            creation_timestamp: self.creation_timestamp,
            deletion_timestamp: self.deletion_timestamp,
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            finalizers: self.finalizers,
            owner_references: self.owner_references,
            self_link: self.self_link,
            annotations: None,
            labels: None,
            managed_fields: None,
        };
        (meta, self.labels, self.annotations)
    }
}

impl WireMeta<Labels> {
    /// A child's metadata as cached: without its uid, and with only the operator's annotations.
    fn split_child(self) -> (ObjectMeta, Labels, Labels) {
        let (mut meta, labels, annotations) = self.split();
        // Never read, and kube's store would copy it into the object's key.
        meta.uid = None;
        let mut annotations = annotations.unwrap_or_default();
        annotations.0.retain(|(k, _)| {
            [
                APPLIED_DIGEST_ANNOTATION,
                GENERATION_ANNOTATION,
                REPLICAS_ANNOTATION,
            ]
            .contains(&k.as_str())
        });
        (meta, labels.unwrap_or_default(), annotations)
    }
}

/// A cached child serialized in the API's shape, for comparing with what would be applied.
#[derive(Serialize)]
struct WireRef<'a, S, T> {
    metadata: WireMetaRef<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: &'a Option<S>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: &'a Option<T>,
}

#[derive(Serialize)]
struct WireMetaRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<&'a Labels>,
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<&'a Labels>,
    #[serde(flatten)]
    rest: &'a ObjectMeta,
}

impl<'a> WireMetaRef<'a> {
    fn new(rest: &'a ObjectMeta, labels: &'a Labels, annotations: &'a Labels) -> Self {
        Self {
            labels: (!labels.0.is_empty()).then_some(labels),
            annotations: (!annotations.0.is_empty()).then_some(annotations),
            rest,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimServiceSpec {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<Str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Labels>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<SlimServicePort>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimServicePort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Str>,
    pub port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<SlimTargetPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Str>,
}

/// A Service's `targetPort`: a number or a container port's name (`IntOrString`, with the
/// name a [`Str`]).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum SlimTargetPort {
    Number(i32),
    Name(Str),
}

/// What a watch cache holds of `object` as the API returned it.
#[cfg(test)]
pub fn cached<T: Serialize, C: serde::de::DeserializeOwned>(object: &T) -> C {
    serde_json::from_value(serde_json::to_value(object).unwrap()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `Str` of a cached child, with where it is.
    fn strings_of(deployment: &CachedDeployment, service: &CachedService) -> Vec<(String, Str)> {
        let mut found = Vec::new();
        let mut labels = |place: &str, labels: &Labels| {
            for (key, value) in &labels.0 {
                found.push((format!("{place} key"), key.clone()));
                found.push((format!("{place}[{}]", key.as_str()), value.clone()));
            }
        };
        labels("deployment labels", &deployment.labels);
        labels("deployment annotations", &deployment.annotations);
        labels("service labels", &service.labels);
        labels("service annotations", &service.annotations);
        let spec = deployment.spec.clone().unwrap_or_default();
        labels(
            "selector",
            &spec.selector.match_labels.clone().unwrap_or_default(),
        );
        let template = spec.template.metadata.clone().unwrap_or_default();
        labels("template labels", &template.labels.unwrap_or_default());
        let service_spec = service.spec.clone().unwrap_or_default();
        labels(
            "service selector",
            &service_spec.selector.unwrap_or_default(),
        );
        for container in spec.template.spec.unwrap_or_default().containers {
            for port in container.ports.unwrap_or_default() {
                found.extend(port.name.map(|n| ("container port name".into(), n)));
                found.extend(port.protocol.map(|p| ("container port protocol".into(), p)));
            }
        }
        found.extend(service_spec.type_.map(|t| ("service type".into(), t)));
        for port in service_spec.ports.unwrap_or_default() {
            found.extend(port.name.map(|n| ("service port name".into(), n)));
            found.extend(port.protocol.map(|p| ("service port protocol".into(), p)));
            if let Some(SlimTargetPort::Name(name)) = port.target_port {
                found.push(("service target port".into(), name));
            }
        }
        found
    }

    #[test]
    fn a_myapp_cache_keeps_whether_it_drains_and_no_label() {
        let labelled = MyApp::test("web")
            .label(SHARD_LABEL, "pod-a")
            .label(DRAIN_LABEL, "true")
            .label("team", "shop");
        let app = CachedMyApp::from(labelled);
        assert!(app.draining);
        assert_eq!(app.metadata.labels, None, "every label is skipped");

        let app = CachedMyApp::from(MyApp::test("web").label(SHARD_LABEL, "pod-a"));
        assert!(!app.draining);
    }

    #[test]
    fn every_string_the_builders_emit_for_every_myapp_alike_is_shared() {
        let children = |app: &MyApp| -> (CachedDeployment, CachedService) {
            (
                cached(&crate::resources::deployment(app, None)),
                cached(&crate::resources::service(app, None)),
            )
        };
        let (d1, s1) = children(&MyApp::test("web").env("A", "1").stored());
        let (d2, s2) = children(&MyApp::test("shop").replicas(None).port(9090).stored());
        let (first, second) = (strings_of(&d1, &s1), strings_of(&d2, &s2));
        assert!(first.len() > 10, "the walk finds the strings: {first:?}");
        let mut constant = 0;
        for (place, value) in &first {
            let same_everywhere = second.iter().any(|(p, v)| p == place && v == value);
            if same_everywhere {
                constant += 1;
                assert!(
                    value.is_shared(),
                    "{place} = {value:?} is the same for every MyApp: add it to KNOWN"
                );
            }
        }
        assert!(constant > 5, "{first:?}");
    }

    #[test]
    fn strings_the_operator_writes_are_shared_others_kept_as_read() {
        let json = r#"["app.kubernetes.io/instance", "TCP", "web-1", "T\u0043P", "tcp"]"#;
        let parsed: Vec<Str> = serde_json::from_str(json).unwrap();
        let shared: Vec<bool> = parsed
            .iter()
            .map(|s| matches!(s.0, Cow::Borrowed(_)))
            .collect();
        assert_eq!(
            shared,
            [true, true, false, true, false],
            "escaped text is matched too; case matters"
        );
        assert_eq!(parsed[2], "web-1");
        assert_eq!(
            serde_json::to_string(&parsed).unwrap(),
            r#"["app.kubernetes.io/instance","TCP","web-1","TCP","tcp"]"#
        );
    }

    #[test]
    fn a_target_port_is_a_number_or_a_name() {
        let ports: Vec<SlimTargetPort> = serde_json::from_str(r#"[8080, "http"]"#).unwrap();
        assert_eq!(
            ports,
            [
                SlimTargetPort::Number(8080),
                SlimTargetPort::Name(PORT_NAME.into())
            ]
        );
        assert_eq!(serde_json::to_string(&ports).unwrap(), r#"[8080,"http"]"#);
    }

    #[test]
    fn labels_read_and_write_as_a_json_map() {
        let labels: Labels = serde_json::from_str(r#"{"b": "2", "a": "1", "b": "3"}"#).unwrap();
        assert_eq!(
            labels.0,
            [("a".into(), "1".into()), ("b".into(), "3".into())],
            "sorted, the last duplicate wins"
        );
        assert_eq!(labels.get("b"), Some("3"));
        assert_eq!(
            serde_json::to_string(&labels).unwrap(),
            r#"{"a":"1","b":"3"}"#
        );
        assert!(serde_json::from_str::<Labels>(r#"{"a": 1}"#).is_err());
    }

    /// Metadata with every field `ObjectMeta` has, each set.
    fn every_metadata_field() -> serde_json::Value {
        serde_json::json!({
            "name": "web", "generateName": "w-", "namespace": "shop", "uid": "u1",
            "resourceVersion": "7", "generation": 3, "selfLink": "/apis/x",
            "creationTimestamp": "2026-12-03T10:00:00Z",
            "deletionTimestamp": "2026-12-03T11:00:00Z", "deletionGracePeriodSeconds": 30,
            "finalizers": ["example.com/f"],
            "labels": {"team": "a"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:image": {}}}}],
            "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "MyApp", "name": "web",
                "uid": "u0", "controller": true, "blockOwnerDeletion": true}],
        })
    }

    #[test]
    fn a_cached_myapp_is_the_myapp_without_managed_fields_labels_and_annotations() {
        let json = serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "MyApp",
            "metadata": every_metadata_field(),
            "spec": {"replicas": 2, "image": "nginx:1.27", "port": 8080,
                "env": [{"name": "A", "value": "1"}]},
            "status": {"observedGeneration": 3, "availableReplicas": 2, "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "reason": "Available",
                    "message": "2/2 replicas available",
                    "lastTransitionTime": "2026-12-03T10:00:00Z"}]},
        });
        let mut expected: MyApp = serde_json::from_value(json.clone()).unwrap();
        let meta = &mut expected.metadata;
        assert!(meta.managed_fields.is_some() && meta.labels.is_some());
        (meta.managed_fields, meta.labels, meta.annotations) = (None, None, None);
        let cached: CachedMyApp = serde_json::from_value(json).unwrap();
        assert_eq!(cached.metadata, expected.metadata);
        assert_eq!(cached.spec, expected.spec);
        let status = expected.status.unwrap();
        assert_eq!(cached.status, Some(ReportedStatus::of(&status)));
        assert!(
            cached.status.unwrap().is(&status),
            "the digest survives the wire"
        );
    }

    /// A status as the operator writes it, every field set.
    fn full_status() -> MyAppStatus {
        let condition = |type_: &str, status: &str, second: i64| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Available".into(),
            message: "2/2 replicas available".into(),
            observed_generation: Some(3),
            last_transition_time: Time(
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).unwrap(),
            ),
        };
        MyAppStatus {
            observed_generation: Some(3),
            replicas: Some(2),
            available_replicas: Some(2),
            phase: Some(Phase::Running),
            selector: Some("app.kubernetes.io/instance=web,app.kubernetes.io/name=myapp".into()),
            conditions: vec![
                condition("Ready", "True", 0),
                condition("Progressing", "False", 1),
                condition("Degraded", "False", 2),
            ],
        }
    }

    #[test]
    fn equal_statuses_have_equal_digests_and_a_change_of_any_field_changes_it() {
        let status = full_status();
        assert_eq!(digest(&status), digest(&status.clone()));
        assert_eq!(
            digest(&status),
            digest(&serde_json::from_value(serde_json::to_value(&status).unwrap()).unwrap()),
            "the same status read back from its JSON"
        );
        type Change = fn(&mut MyAppStatus);
        let changes: [(&str, Change); 16] = [
            ("observedGeneration", |s| s.observed_generation = Some(4)),
            ("observedGeneration unset", |s| s.observed_generation = None),
            ("replicas", |s| s.replicas = Some(3)),
            ("availableReplicas", |s| s.available_replicas = Some(1)),
            ("phase", |s| s.phase = Some(Phase::Degraded)),
            ("selector", |s| s.selector = Some("app=web".into())),
            ("selector unset", |s| s.selector = None),
            ("a condition fewer", |s| drop(s.conditions.pop())),
            ("conditions reordered", |s| s.conditions.swap(1, 2)),
            ("a type", |s| s.conditions[0].type_ = "Available".into()),
            ("a status", |s| s.conditions[1].status = "True".into()),
            ("a reason", |s| {
                s.conditions[2].reason = "Unavailable".into()
            }),
            ("a message", |s| s.conditions[0].message.push('!')),
            ("a condition's generation", |s| {
                s.conditions[0].observed_generation = Some(2)
            }),
            ("a transition time", |s| {
                s.conditions[1].last_transition_time.0 += std::time::Duration::from_secs(1)
            }),
            ("a transition time's nanoseconds", |s| {
                s.conditions[2].last_transition_time.0 += std::time::Duration::from_nanos(1)
            }),
        ];
        let mut seen = vec![digest(&status)];
        for (field, change) in changes {
            let mut changed = status.clone();
            change(&mut changed);
            assert!(!seen.contains(&digest(&changed)), "{field}: same digest");
            seen.push(digest(&changed));
        }
    }

    #[test]
    fn a_reported_status_keeps_each_conditions_status_and_transition_time() {
        let mut status = full_status();
        status.conditions[2].status = "Unknown".into();
        status.conditions.swap(0, 1);
        let reported = ReportedStatus::of(&status);
        let (observed, phase) = (reported.observed_generation, reported.phase);
        assert_eq!((observed, phase), (Some(3), Some(Phase::Running)));
        let time = |second: i64| {
            Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).unwrap())
        };
        assert_eq!(reported.transitioned("Ready", "True"), Some(&time(0)));
        assert_eq!(reported.transitioned("Ready", "False"), None);
        assert_eq!(
            reported.transitioned("Progressing", "False"),
            Some(&time(1))
        );
        assert_eq!(
            reported.transitioned("Degraded", "False"),
            None,
            "Unknown now"
        );
        assert_eq!(
            reported.transitioned("Degraded", "Unknown"),
            None,
            "never written"
        );
        assert_eq!(reported.transitioned("Available", "True"), None, "not ours");
        assert!(reported.is(&status));
        assert!(!reported.is(&full_status()));
    }

    #[test]
    fn a_cached_child_keeps_every_metadata_field_but_managed_fields_and_uid() {
        let meta = every_metadata_field();
        let json = serde_json::json!({"metadata": meta, "spec": {}});
        let mut expected: ObjectMeta = serde_json::from_value(meta).unwrap();
        let set = serde_json::to_value(&expected)
            .unwrap()
            .as_object()
            .unwrap()
            .len();
        assert_eq!(
            set, 15,
            "the fixture sets every field of ObjectMeta, each spelled right"
        );
        (
            expected.managed_fields,
            expected.labels,
            expected.annotations,
        ) = (None, None, None);
        expected.uid = None;
        let cached: CachedService = serde_json::from_value(json).unwrap();
        assert_eq!(cached.metadata, expected);
        assert_eq!(cached.labels.get("team"), Some("a"));
        assert_eq!(cached.annotations, Labels::default(), "not the operator's");
    }

    #[test]
    fn metadata_that_is_not_an_object_is_an_error() {
        let json = serde_json::json!({"metadata": "web", "spec": {}});
        assert!(serde_json::from_value::<CachedService>(json).is_err());
        let json =
            serde_json::json!({"metadata": "web", "spec": {"image": "nginx:1.27", "port": 80}});
        assert!(serde_json::from_value::<CachedMyApp>(json).is_err());
        let json = serde_json::json!({"metadata": {}, "spec": {"image": "nginx:1.27", "port": 80}});
        assert!(serde_json::from_value::<CachedMyApp>(json).is_ok());
        let json = serde_json::json!({"metadata": {}});
        assert!(
            serde_json::from_value::<CachedMyApp>(json).is_err(),
            "no spec"
        );
    }

    #[test]
    fn a_cached_child_keeps_labels_and_our_annotations_beside_its_metadata() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "shop", "resourceVersion": "7",
                "labels": {"app.kubernetes.io/name": "myapp", "team": "a"},
                "annotations": {APPLIED_DIGEST_ANNOTATION: "abc", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "managedFields": [{"manager": "kubectl"}],
                "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "MyApp", "name": "web", "uid": "u1"}],
            },
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1", "ports": [{"port": 80}]},
            "status": {"loadBalancer": {}},
        });
        let cached: CachedService = serde_json::from_value(json).unwrap();
        assert_eq!(cached.metadata.labels, None);
        assert_eq!(cached.metadata.managed_fields, None);
        assert_eq!(cached.labels.get("team"), Some("a"));
        assert_eq!(
            cached.annotations.0,
            [(APPLIED_DIGEST_ANNOTATION.into(), "abc".into())]
        );
        assert_eq!(
            cached.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert_eq!(
            serde_json::to_value(&cached).unwrap(),
            serde_json::json!({
                "metadata": {
                    "name": "web", "namespace": "shop", "resourceVersion": "7",
                    "labels": {"app.kubernetes.io/name": "myapp", "team": "a"},
                    "annotations": {APPLIED_DIGEST_ANNOTATION: "abc"},
                    "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "MyApp", "name": "web", "uid": "u1"}],
                },
                "spec": {"type": "ClusterIP", "ports": [{"port": 80}]},
            })
        );
    }
}
