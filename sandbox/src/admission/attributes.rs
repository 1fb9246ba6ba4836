//! The attributes of one admission request: operation, kind and resource, objects, options.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::authentication::v1::UserInfo;
use serde::Serialize;
use serde_json::Value;

/// An admission operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// POST, and server-side apply that creates.
    Create,
    /// PUT and PATCH (also on subresources).
    Update,
    /// DELETE.
    Delete,
    /// Proxy-like subresources (exec, attach, ...).
    Connect,
}

impl Operation {
    /// The name webhook rules and reviews use (`CREATE`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kind as a review carries it (`group` is empty for the core group).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct GroupVersionKind {
    /// API group, `""` for core.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
}

impl GroupVersionKind {
    /// A kind from its parts.
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
        }
    }
}

/// A resource as a review carries it (`group` is empty for the core group).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct GroupVersionResource {
    /// API group, `""` for core.
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name, e.g. `deployments`.
    pub resource: String,
}

impl GroupVersionResource {
    /// A resource from its parts.
    pub fn new(group: &str, version: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
        }
    }
}

/// What the chain needs to know about one write.
#[derive(Clone, Debug)]
pub struct AdmissionAttributes {
    /// The operation.
    pub operation: Operation,
    /// The object's kind.
    pub kind: GroupVersionKind,
    /// The resource written.
    pub resource: GroupVersionResource,
    /// The subresource written (`status`, `scale`), `None` for the main resource.
    pub sub_resource: Option<String>,
    /// The object's name (empty on CREATE with generateName).
    pub name: String,
    /// The namespace, `None` for cluster-scoped resources.
    pub namespace: Option<String>,
    /// The new object (None on DELETE).
    pub object: Option<Value>,
    /// The stored object (UPDATE and DELETE).
    pub old_object: Option<Value>,
    /// Whether the request is a dry run (`dryRun=All`).
    pub dry_run: bool,
    /// Who asks.
    pub user_info: UserInfo,
    /// The operation's options (`CreateOptions`, `UpdateOptions`, `PatchOptions`,
    /// `DeleteOptions`) as JSON, with apiVersion `meta.k8s.io/v1` and kind.
    pub options: Option<Value>,
    /// The labels of the request's namespace (for `namespaceSelector`).
    pub namespace_labels: BTreeMap<String, String>,
    /// The stored Namespace of a namespaced request (policies' `namespaceObject`).
    pub namespace_object: Option<Value>,
}

impl AdmissionAttributes {
    /// Attributes with no name, namespace, objects, options or labels, and an anonymous user;
    /// set the public fields for the rest.
    pub fn new(
        operation: Operation,
        kind: GroupVersionKind,
        resource: GroupVersionResource,
    ) -> Self {
        Self {
            operation,
            kind,
            resource,
            sub_resource: None,
            name: String::new(),
            namespace: None,
            object: None,
            old_object: None,
            dry_run: false,
            user_info: UserInfo::default(),
            options: None,
            namespace_labels: BTreeMap::new(),
            namespace_object: None,
        }
    }

    /// The labels `namespaceSelector` looks at: a Namespace's own, else the namespace's.
    pub(super) fn labels_for_namespace_selector(&self) -> BTreeMap<String, String> {
        if self.is_namespace_resource() {
            let own = self.object.as_ref().or(self.old_object.as_ref());
            return own.map(object_labels).unwrap_or_default();
        }
        self.namespace_labels.clone()
    }

    pub(super) fn is_namespace_resource(&self) -> bool {
        self.resource.group.is_empty() && self.resource.resource == "namespaces"
    }
}

/// The `metadata.labels` of a JSON object (non-string values are skipped).
pub(super) fn object_labels(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}
