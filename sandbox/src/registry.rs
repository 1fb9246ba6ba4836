//! The resource types the sandbox serves: the built-in kinds and the ones CRDs register at run time.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::schema::{CrdSchema, FieldError};

/// One served group/version/resource.
#[derive(Clone, Debug)]
pub struct ResourceType {
    /// API group, empty for the core group.
    pub group: String,
    /// Served version.
    pub version: String,
    /// Kind of a single object.
    pub kind: String,
    /// Plural resource name used in URLs.
    pub plural: String,
    /// Singular resource name.
    pub singular: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names kubectl accepts (`cm`, `deploy`).
    pub short_names: Vec<String>,
    /// Categories such as `all`.
    pub categories: Vec<String>,
    /// Whether the resource has a `/status` subresource.
    pub status_subresource: bool,
    /// Whether the API server maintains `metadata.generation` for this kind.
    pub generation: bool,
    /// The CRD that registered this type, by name, if any.
    pub crd: Option<String>,
    /// The structural schema of a custom resource version; its `raw()` JSON is also what the
    /// OpenAPI documents publish (one copy per version, however big the CRD).
    pub schema: Option<Arc<CrdSchema>>,
    /// A CRD version's `additionalPrinterColumns` (empty: Name and Age).
    pub printer_columns: Vec<PrinterColumn>,
    /// Where the `scale` subresource reads and writes, if served.
    pub scale: Option<ScalePaths>,
}

impl ResourceType {
    /// `apiVersion` of objects of this type.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` as the API server names a resource in messages (`myapps.example.com`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The key objects of this resource are stored under (shared by all versions).
    /// `events.k8s.io` Events are core Events, as kube-apiserver serves both from one storage
    /// (`pkg/registry/events/rest/storage_events.go`); `crate::events` converts between them.
    pub fn storage(&self) -> (String, String) {
        if self.group == "events.k8s.io" && self.plural == "events" {
            return (String::new(), self.plural.clone());
        }
        (self.group.clone(), self.plural.clone())
    }
}

/// Where a kind keeps the numbers a Scale shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalePaths {
    /// `.spec.replicas` or the CRD's `specReplicasPath`.
    pub spec_replicas: String,
    /// `.status.replicas` or the CRD's `statusReplicasPath`.
    pub status_replicas: String,
    /// The CRD's `labelSelectorPath` (a string field), if any.
    pub label_selector: Option<String>,
    /// Deployments: the selector string is made from `.spec.selector.matchLabels`.
    pub selector_from_match_labels: bool,
}

/// One printer column.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    /// Header.
    pub name: String,
    /// OpenAPI type: string, integer, number, boolean, date.
    pub type_: String,
    /// OpenAPI format.
    pub format: String,
    /// Column description.
    pub description: String,
    /// 0 is shown by default; higher only with `-o wide`.
    pub priority: i32,
    /// JSONPath (simple form: `.a.b[0].c`, `[?(@.type=="Ready")]` filters).
    pub json_path: String,
}

impl PrinterColumn {
    /// The Age column the API server adds when a CRD declares no columns (and built-ins show).
    pub fn age() -> Self {
        PrinterColumn {
            name: "Age".into(),
            type_: "date".into(),
            format: String::new(),
            description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
            priority: 0,
            json_path: ".metadata.creationTimestamp".into(),
        }
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    generation: bool,
}

#[rustfmt::skip]
const BUILTINS: &[Builtin] = &[
    Builtin { group: "", version: "v1", kind: "Namespace", plural: "namespaces", namespaced: false, short: &["ns"], categories: &[], status: true, generation: false },
    Builtin { group: "", version: "v1", kind: "ConfigMap", plural: "configmaps", namespaced: true, short: &["cm"], categories: &[], status: false, generation: false },
    Builtin { group: "", version: "v1", kind: "Secret", plural: "secrets", namespaced: true, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "", version: "v1", kind: "Service", plural: "services", namespaced: true, short: &["svc"], categories: &["all"], status: true, generation: false },
    Builtin { group: "", version: "v1", kind: "ServiceAccount", plural: "serviceaccounts", namespaced: true, short: &["sa"], categories: &[], status: false, generation: false },
    Builtin { group: "", version: "v1", kind: "Pod", plural: "pods", namespaced: true, short: &["po"], categories: &["all"], status: true, generation: false },
    // Stored, not derived from Services: a test publishes a webhook Service's endpoints both to
    // the admission client (`AdmissionChain::set_endpoints`) and here, as the endpoint controllers would.
    Builtin { group: "", version: "v1", kind: "Endpoints", plural: "endpoints", namespaced: true, short: &["ep"], categories: &[], status: false, generation: false },
    Builtin { group: "discovery.k8s.io", version: "v1", kind: "EndpointSlice", plural: "endpointslices", namespaced: true, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "", version: "v1", kind: "Event", plural: "events", namespaced: true, short: &["ev"], categories: &[], status: false, generation: false },
    Builtin { group: "apps", version: "v1", kind: "Deployment", plural: "deployments", namespaced: true, short: &["deploy"], categories: &["all"], status: true, generation: true },
    Builtin { group: "apps", version: "v1", kind: "ReplicaSet", plural: "replicasets", namespaced: true, short: &["rs"], categories: &["all"], status: true, generation: true },
    Builtin { group: "events.k8s.io", version: "v1", kind: "Event", plural: "events", namespaced: true, short: &["ev"], categories: &[], status: false, generation: false },
    Builtin { group: "coordination.k8s.io", version: "v1", kind: "Lease", plural: "leases", namespaced: true, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "apiextensions.k8s.io", version: "v1", kind: "CustomResourceDefinition", plural: "customresourcedefinitions", namespaced: false, short: &["crd", "crds"], categories: &["api-extensions"], status: true, generation: true },
    Builtin { group: "admissionregistration.k8s.io", version: "v1", kind: "ValidatingWebhookConfiguration", plural: "validatingwebhookconfigurations", namespaced: false, short: &[], categories: &["api-extensions"], status: false, generation: true },
    Builtin { group: "admissionregistration.k8s.io", version: "v1", kind: "MutatingWebhookConfiguration", plural: "mutatingwebhookconfigurations", namespaced: false, short: &[], categories: &["api-extensions"], status: false, generation: true },
    Builtin { group: "admissionregistration.k8s.io", version: "v1", kind: "ValidatingAdmissionPolicy", plural: "validatingadmissionpolicies", namespaced: false, short: &[], categories: &["api-extensions"], status: true, generation: true },
    Builtin { group: "admissionregistration.k8s.io", version: "v1", kind: "ValidatingAdmissionPolicyBinding", plural: "validatingadmissionpolicybindings", namespaced: false, short: &[], categories: &["api-extensions"], status: false, generation: true },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", kind: "ClusterRole", plural: "clusterroles", namespaced: false, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", kind: "ClusterRoleBinding", plural: "clusterrolebindings", namespaced: false, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", kind: "Role", plural: "roles", namespaced: true, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "rbac.authorization.k8s.io", version: "v1", kind: "RoleBinding", plural: "rolebindings", namespaced: true, short: &[], categories: &[], status: false, generation: false },
    // Reviews: answered by the authorizer and the authenticator, never stored (server/review.rs).
    Builtin { group: "authorization.k8s.io", version: "v1", kind: "SelfSubjectAccessReview", plural: "selfsubjectaccessreviews", namespaced: false, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "authorization.k8s.io", version: "v1", kind: "SubjectAccessReview", plural: "subjectaccessreviews", namespaced: false, short: &[], categories: &[], status: false, generation: false },
    Builtin { group: "authentication.k8s.io", version: "v1", kind: "SelfSubjectReview", plural: "selfsubjectreviews", namespaced: false, short: &[], categories: &[], status: false, generation: false },
];

/// Every served resource, keyed by (group, version, plural).
#[derive(Clone, Debug)]
pub struct Registry {
    types: BTreeMap<(String, String, String), Arc<ResourceType>>,
}

/// Why a CRD could not be registered.
#[derive(Debug)]
pub struct CrdRejected(pub String);

impl From<CrdRejected> for FieldError {
    fn from(rejected: CrdRejected) -> Self {
        FieldError::new("", "FieldValueInvalid", rejected.0)
    }
}

impl Registry {
    /// The built-in kinds.
    pub fn builtin() -> Self {
        let mut types = BTreeMap::new();
        for b in BUILTINS {
            let t = ResourceType {
                group: b.group.into(),
                version: b.version.into(),
                kind: b.kind.into(),
                plural: b.plural.into(),
                singular: b.kind.to_lowercase(),
                namespaced: b.namespaced,
                short_names: b.short.iter().map(|s| s.to_string()).collect(),
                categories: b.categories.iter().map(|s| s.to_string()).collect(),
                status_subresource: b.status,
                generation: b.generation,
                crd: None,
                schema: None,
                printer_columns: Vec::new(),
                scale: (b.kind == "Deployment").then(|| ScalePaths {
                    spec_replicas: ".spec.replicas".into(),
                    status_replicas: ".status.replicas".into(),
                    label_selector: None,
                    selector_from_match_labels: true,
                }),
            };
            types.insert(
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(t),
            );
        }
        Registry { types }
    }

    /// The type served at group/version/plural.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// Any served version of a stored resource (for GC and cascading deletes).
    pub fn any_version(&self, group: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .values()
            .find(|t| t.group == group && t.plural == plural)
            .cloned()
    }

    /// All served types.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.values()
    }

    /// Group/versions served, grouped by group in registration order (core group excluded).
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values() {
            if t.group.is_empty() {
                continue;
            }
            let versions = out.entry(t.group.clone()).or_default();
            if !versions.contains(&t.version) {
                versions.push(t.version.clone());
            }
        }
        out
    }

    /// Registers (or re-registers) the served versions of a CRD, replacing what it registered before.
    pub fn register_crd(&mut self, crd: &CustomResourceDefinition) -> Result<(), CrdRejected> {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let spec = &crd.spec;
        let expected = format!("{}.{}", spec.names.plural, spec.group);
        if name != expected {
            return Err(CrdRejected(format!(
                "metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
            )));
        }
        if spec.scope != "Namespaced" && spec.scope != "Cluster" {
            return Err(CrdRejected(format!(
                "spec.scope: Unsupported value: \"{}\": supported values: \"Cluster\", \"Namespaced\"",
                spec.scope
            )));
        }
        if let Some(clash) = self.types.values().find(|t| {
            t.group == spec.group
                && t.plural == spec.names.plural
                && t.crd.as_deref() != Some(name.as_str())
        }) {
            return Err(CrdRejected(format!(
                "resource {} is already served",
                clash.qualified()
            )));
        }
        let mut new = Vec::new();
        for v in spec.versions.iter().filter(|v| v.served) {
            let schema = CrdSchema::from_crd(crd, &v.name)
                .map_err(|e| CrdRejected(format!("spec.versions[{}].schema: {e}", v.name)))?;
            let subresources = v.subresources.as_ref();
            new.push(ResourceType {
                group: spec.group.clone(),
                version: v.name.clone(),
                kind: spec.names.kind.clone(),
                plural: spec.names.plural.clone(),
                singular: spec
                    .names
                    .singular
                    .clone()
                    .unwrap_or_else(|| spec.names.kind.to_lowercase()),
                namespaced: spec.scope == "Namespaced",
                short_names: spec.names.short_names.clone().unwrap_or_default(),
                categories: spec.names.categories.clone().unwrap_or_default(),
                status_subresource: subresources.is_some_and(|s| s.status.is_some()),
                generation: true,
                crd: Some(name.clone()),
                schema: Some(Arc::new(schema)),
                printer_columns: v
                    .additional_printer_columns
                    .iter()
                    .flatten()
                    .map(|c| PrinterColumn {
                        name: c.name.clone(),
                        type_: c.type_.clone(),
                        format: c.format.clone().unwrap_or_default(),
                        description: c.description.clone().unwrap_or_default(),
                        priority: c.priority.unwrap_or(0),
                        json_path: c.json_path.clone(),
                    })
                    .collect(),
                scale: subresources
                    .and_then(|s| s.scale.as_ref())
                    .map(|s| ScalePaths {
                        spec_replicas: s.spec_replicas_path.clone(),
                        status_replicas: s.status_replicas_path.clone(),
                        label_selector: s.label_selector_path.clone(),
                        selector_from_match_labels: false,
                    }),
            });
        }
        self.unregister_crd(&name);
        for t in new {
            self.types.insert(
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(t),
            );
        }
        Ok(())
    }

    /// Stops serving every version a CRD registered.
    pub fn unregister_crd(&mut self, name: &str) {
        self.types.retain(|_, t| t.crd.as_deref() != Some(name));
    }
}
