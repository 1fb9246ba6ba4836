//! The `MyApp` API (`example.com/v1`): spec, status, and the schema the cluster enforces.
//!
//! What OpenAPI can say lives in the schema (ranges, lengths, patterns, list-map keys); what it
//! cannot say, or cannot say readably, is a CEL rule with a message written for the user. The
//! admission webhook enforces the same rules and more (see `admission.rs`), so a cluster still
//! rejects bad specs when the webhook is down.

use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{CustomResource, CustomResourceExt, KubeSchema, Resource, core::object::HasSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of every kind this operator serves.
pub const GROUP: &str = "example.com";
/// The only served (and stored) version.
pub const VERSION: &str = "v1";

/// Upper bound on `spec.replicas` that the schema enforces; the webhook may be configured lower.
pub const MAX_REPLICAS: i32 = 1000;
/// Upper bound on `spec.image`: a repository name (255) plus a tag (128) and a sha512 digest fit.
pub const MAX_IMAGE_LEN: usize = 512;
/// Upper bound on the number of `spec.env` entries.
pub const MAX_ENV: usize = 64;
/// Upper bound on an env variable name.
pub const MAX_ENV_NAME_LEN: usize = 128;
/// Upper bound on an env variable value. 64 values of this size stay far below etcd's 1.5 MiB.
pub const MAX_ENV_VALUE_LEN: usize = 8192;

/// Kubernetes' environment variable name rule (the C-identifier-like `EnvVarName` validation that
/// every supported API server accepts).
pub const ENV_NAME_PATTERN: &str = "^[-._a-zA-Z][-._a-zA-Z0-9]*$";

/// An image reference per the distribution spec, `[host[:port]/]path[:tag][@digest]`, as
/// Docker splits it, written for CEL's RE2 `matches()` (and the Rust `regex` crate the sandbox
/// evaluates it with). Path components are lower-case. The first of several components is the
/// host when it looks like one (a `.`, a `:`, an upper-case letter, `localhost`) and must then
/// be a valid host: so it is either a host (DNS labels or a bracketed IPv6 literal, which
/// holds a `:`) or a path component without a `.`.
pub const IMAGE_REFERENCE_PATTERN: &str = concat!(
    r"^(((([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])([.]([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\])(:[0-9]+)?",
    r"|[a-z0-9]+(([_]|__|[-]+)[a-z0-9]+)*)/([a-z0-9]+(([._]|__|[-]+)[a-z0-9]+)*/)*)?",
    r"[a-z0-9]+(([._]|__|[-]+)[a-z0-9]+)*",
    r"(:[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})?",
    r"(@[a-z0-9]+([+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,})?$",
);

/// The name rule for a MyApp: it names the child Service, and Service names are DNS-1035 labels.
pub const NAME_RULE: &str =
    "size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')";

/// A stateless application: one Deployment and one ClusterIP Service that the operator keeps
/// equal to this spec.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "example.com",
    version = "v1",
    kind = "MyApp",
    plural = "myapps",
    singular = "myapp",
    shortname = "mya",
    category = "all",
    namespaced,
    status = "MyAppStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "MyApp runs a container image as a Deployment behind a ClusterIP Service.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas", description = "Pods the Deployment runs (whoever sets the count: spec.replicas or an autoscaler)"),
    printcolumn(name = "Available", type_ = "integer", json_path = ".status.availableReplicas", description = "Replicas available to serve"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Pending, Progressing, Running or Degraded"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image", description = "Container image", priority = "1"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = kube::core::Rule::new(NAME_RULE)
        .message("metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter, at most 63 characters) because it names the app's Service")
        .reason(kube::core::Reason::FieldValueInvalid),
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unwrap_descriptions)]
pub struct MyAppSpec {
    /// Number of pods to run. When unset, the operator leaves the Deployment's replica count to
    /// whoever scales it (a HorizontalPodAutoscaler, `kubectl scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,

    /// Container image reference, `[registry[:port]/]repository[:tag][@digest]`, for example
    /// `ghcr.io/example/web:1.4.2`. Pin a tag or digest: `latest` or no tag draws a warning.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = kube::core::Rule::new(image_rule())
        // The API server prints a rule's failure as `Invalid value: "string"` (the type, not
        // the value), so the message quotes the value itself.
        .message(kube::core::Message::Expression(IMAGE_MESSAGE.into()))
        .reason(kube::core::Reason::FieldValueInvalid))]
    pub image: String,

    /// TCP port the container listens on; the Service exposes the same port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Environment variables for the container, keyed by name. The operator may add defaults
    /// configured on it, never overriding a name set here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub env: Vec<EnvVar>,
}

/// One environment variable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[schemars(transform = unwrap_descriptions)]
pub struct EnvVar {
    /// Variable name: letters, digits, `_`, `-` and `.`, not starting with a digit.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    )]
    pub name: String,

    /// Variable value (may be empty).
    #[serde(default)]
    #[schemars(length(max = 8192))]
    pub value: String,
}

/// What the operator last observed of a MyApp's children.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unwrap_descriptions)]
pub struct MyAppStatus {
    /// The `metadata.generation` of the spec this status describes. Never decreases: the API
    /// server refuses a status planned from an older spec (a writer that woke up late).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= oldSelf")
        .message("status.observedGeneration may not decrease: this status describes an older spec than the one already reported")
        .reason(kube::core::Reason::FieldValueInvalid))]
    pub observed_generation: Option<i64>,

    /// Pods the Deployment runs (the scale subresource reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,

    /// Pods that are available to serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,

    /// Where the app is in its life; see `Phase`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Label selector of the app's pods in string form (the scale subresource reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// Standard conditions: `Ready`, `Progressing` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The types of the conditions the operator writes, in the order it writes them.
pub const CONDITION_TYPES: [&str; 3] = ["Ready", "Progressing", "Degraded"];

/// What the pure builders (`resources`, `status`) read of a MyApp: its metadata and spec. The
/// API type has them, and so has the MyApp cache's, which keeps only a digest of the status.
pub trait MyAppLike: Resource<DynamicType = ()> + HasSpec<Spec = MyAppSpec> {}

impl MyAppLike for MyApp {}

/// A summary of the app's state, for people and `kubectl get`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Accepted, but the Deployment's controller has not reported on the app's Deployment yet.
    Pending,
    /// The Deployment is rolling out a change (one its controller may not have picked up yet)
    /// or scaling.
    Progressing,
    /// The current spec is rolled out and every desired replica is available.
    Running,
    /// The rollout failed, or fewer replicas than desired have been available for too long.
    Degraded,
}

/// `kubectl explain` prints a description as it is, so a doc comment's line breaks would come
/// out mid-sentence: a single line break becomes a space, a blank line stays a paragraph break.
fn unwrap_descriptions(schema: &mut schemars::Schema) {
    if let Some(serde_json::Value::String(text)) = schema.get_mut("description") {
        *text = text
            .split("\n\n")
            .map(|paragraph| {
                paragraph
                    .split('\n')
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    schemars::transform::transform_subschemas(&mut unwrap_descriptions, schema);
}

/// The image rule's failure message, as a CEL expression: the value and what it should be.
const IMAGE_MESSAGE: &str = r#"'spec.image "' + self + '" is not an image reference: use one such as registry.example.com/team/app:1.2.3 or app@sha256:<digest> (lower-case repository path, optional tag, optional digest)'"#;

/// The pattern inside a CEL string literal, whose escapes take a backslash of their own.
fn image_rule() -> String {
    let pattern = IMAGE_REFERENCE_PATTERN.replace('\\', "\\\\");
    format!("self.matches('{pattern}')")
}

/// Annotation on the installed CRD: the schema serial this binary was built with. Raise
/// [`SCHEMA_SERIAL`] with every change of the schema a user could notice, so that `check` can
/// say whether an installed CRD is older or newer than the binary.
pub const SCHEMA_SERIAL_ANNOTATION: &str = "example.com/schema-serial";
/// Annotation on the installed CRD: [`schema_digest`] of the CRD it was generated as; tells any
/// change, including one nobody remembered to count in the serial.
pub const SCHEMA_DIGEST_ANNOTATION: &str = "example.com/schema-digest";
/// The schema serial of this build (see [`SCHEMA_SERIAL_ANNOTATION`]).
pub const SCHEMA_SERIAL: u32 = 4;

/// `sha256:<hex>` of the generated CRD (without the two stamp annotations) as compact JSON.
pub fn schema_digest() -> String {
    let json = serde_json::to_vec(&MyApp::crd()).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The CRD to install: the generated one stamped with [`SCHEMA_SERIAL`] and [`schema_digest`].
pub fn stamped_crd() -> CustomResourceDefinition {
    let mut crd = MyApp::crd();
    let annotations = crd
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(SCHEMA_SERIAL_ANNOTATION.into(), SCHEMA_SERIAL.to_string());
    annotations.insert(SCHEMA_DIGEST_ANNOTATION.into(), schema_digest());
    crd
}

/// The CustomResourceDefinition as YAML, exactly as `deploy/base/crd.yaml` holds it.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(&stamped_crd())
}
