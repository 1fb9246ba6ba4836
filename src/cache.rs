//! What the operator caches of its children: partial typed objects holding only the fields
//! [`crate::resources`] applies (so [`crate::resources::is_applied`] can compare) and the status
//! fields [`crate::resources::Rollout`] reads.
//!
//! The watch caches hold one of each child per MyApp, so their size is the operator's memory.
//! A k8s-openapi `Deployment` is 2.4 KB inline and each `Container` another 2.1 KB before any
//! content, nearly all of it optional fields the operator never reads. These types deserialize
//! straight from the API's JSON (unknown fields are skipped while parsing), serialize under the
//! same field names, and inherit the `Resource` impl of the full type, so `Api`, the watcher and
//! the reflector use them like the real thing.

use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Service},
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, Time},
        util::intstr::IntOrString,
    },
};
use kube::Resource;
use serde::{Deserialize, Serialize};

use crate::resources::{APPLIED_DIGEST_ANNOTATION, REPLICAS_ANNOTATION};

/// A label map as a sorted list of pairs. A `BTreeMap` allocates a half-kilobyte node for even
/// one entry, and the selectors and template labels here hold two or three.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Labels(pub Vec<(String, String)>);

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
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
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
                while let Some(pair) = map.next_entry::<String, String>()? {
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

/// A Deployment as cached.
#[derive(Resource, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[resource(inherit = Deployment)]
pub struct CachedDeployment {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<DeploymentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DeploymentStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub selector: LabelSelector,
    #[serde(default)]
    pub template: PodTemplate,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<Labels>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PodTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct TemplateMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Labels>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ContainerPort>>,
    /// `valueFrom` is not kept: an entry set that way by someone else lacks the `value` the
    /// operator applies, so it reads as different, which it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub container_port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct EnvVar {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<DeploymentCondition>>,
}

/// A Deployment condition without its message and `lastUpdateTime`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A Service as cached.
#[derive(Resource, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[resource(inherit = Service)]
pub struct CachedService {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ServiceSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Labels>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ServicePort>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// Drops from a cached object's metadata what nothing reads: `managedFields` (often most of
/// an object) and annotations other than the operator's own (the Deployment controller's
/// revision, `kubectl apply`'s copy of the whole object).
pub fn slim_metadata<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k == APPLIED_DIGEST_ANNOTATION || k == REPLICAS_ANNOTATION);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
