//! The API server's admission webhook call path, over real HTTPS.
//!
//! For each write the store hands the chain the stored webhook configurations and the request's
//! attributes; the chain calls the matching mutating webhooks one after the other (each on the
//! previous one's result, with one reinvocation round for `reinvocationPolicy: IfNeeded`), then
//! the matching validating webhooks on the mutated object, and says what to store:
//!
//! ```text
//! AdmissionChain::admit(
//!     &self,
//!     mutating: &[MutatingWebhookConfiguration],
//!     validating: &[ValidatingWebhookConfiguration],
//!     request: &AdmissionAttributes,
//! ) -> Result<Admitted { object: Option<Value>, warnings: Vec<String> },
//!             Rejection { error: Error, warnings: Vec<String> }>
//! ```
//!
//! or in two phases, so the store can default, prune and schema-validate the mutated object in
//! between as the real server does (`mutate` then `validate`, same result types; concatenate
//! their warnings with [`merge_warnings`]).
//!
//! [`Rejection::status`] is the `Status` to answer with (its `code` is the HTTP status), and
//! every warning becomes a `Warning` response header valued [`warning_header_value`], on success
//! and on rejection alike (kubectl prints both).
//!
//! As the real server does it:
//! - Configurations are taken in name order, webhooks in their listed order. Writes to webhook
//!   configurations themselves are never sent to webhooks.
//! - Matching: `rules` (operations, apiGroups, apiVersions, resources with `*`, `plural/sub`,
//!   `*/status`; scope), `namespaceSelector` (on the namespace's labels, or the object's own for a
//!   Namespace), `objectSelector` (on the object's or the old object's labels), and
//!   `matchConditions` evaluated as CEL (kube-cel, through kube's `cel` feature) over `object`, `oldObject` and `request`.
//! - TLS trusts only `clientConfig.caBundle` (rustls, ring). A `service` reference is dialled at
//!   the address registered for `namespace/name:port` while the certificate is verified for
//!   `<name>.<namespace>.svc`; a `url` is dialled at its own host. HTTP/1.1, kept-alive
//!   connections reused, `timeoutSeconds` (default 10) bounds the whole call.
//! - The answer is checked (HTTP 2xx, `AdmissionReview` `admission.k8s.io/v1`, `response.uid`,
//!   patch rules); a failed call or invalid answer follows `failurePolicy` (Fail: 500 `Internal
//!   error occurred: failed calling webhook "<name>": ...`; Ignore: skipped), while a patch that
//!   does not decode or apply is an internal error whatever the policy.
//! - A denial becomes the webhook's `Status` with code at least 400 and the message
//!   `admission webhook "<name>" denied the request: <message>`.
//! - A dry run fails with 400 when a matching webhook has side effects (`Some`/`Unknown`): the
//!   real server does not call such webhooks and rejects the request instead.
//!
//! # Wiring it into the write path
//!
//! - CREATE (POST, and server-side apply that creates): `object` is the new object with its
//!   defaults, `old_object` `None`, `options` a `CreateOptions` (`PatchOptions` for apply).
//! - UPDATE (PUT, PATCH, also on `/status` with `sub_resource: Some("status")`): `object` is the
//!   object after the patch, `old_object` the stored one.
//! - DELETE: `object` `None`, `old_object` the stored object, `options` a `DeleteOptions`.
//! - Namespaces: `namespace` is the Namespace's own name, as the real server's request info has
//!   it. `namespace_labels` are the stored namespace's labels (the real server always labels a
//!   namespace `kubernetes.io/metadata.name: <name>`, and selectors often use it).
//! - Answer a [`Rejection`] with `status()` as body and its `code` as HTTP status; send the
//!   warnings as `Warning` headers in both outcomes. With `dry_run`, persist nothing.
//!
//! # Not modelled
//!
//! - `matchPolicy: Equivalent` conversion: rules see only the request's own group/version.
//! - `admission.k8s.io/v1beta1` reviews (a webhook accepting only v1beta1 is a failed call).
//! - `authorizer` in matchConditions (an expression using it fails to evaluate and follows
//!   failurePolicy).
//! - Validating webhooks are called one after the other, not in parallel: with several denials
//!   the first in order is reported, where the real server reports whichever answers first.
//! - `auditAnnotations` are ignored; there is no audit log.
//! - A webhook without `caBundle` fails: the real server would trust the system roots.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhookConfiguration, RuleWithOperations,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, Status, StatusCause, StatusDetails,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tracing::{debug, warn};

/// The webhook timeout when a configuration names none.
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 10;

/// The largest answer read from a webhook; more is an invalid answer, not a hang.
const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// Idle connections kept per webhook endpoint.
const MAX_IDLE_PER_ENDPOINT: usize = 8;

/// Why a request was not admitted, or why calling a webhook failed.
///
/// The chain returns [`Error::Denied`], [`Error::DryRunUnsupported`], [`Error::CallWebhook`]
/// (wrapping one of the call failures below), [`Error::ParseSelector`], [`Error::DecodePatch`] or
/// [`Error::ApplyPatch`]; [`Error::status`] turns any of them into the API server's answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A webhook answered `allowed: false`; `status` is what the client gets.
    #[error("{}", .status.message.as_deref().unwrap_or("admission webhook denied the request"))]
    Denied {
        /// The webhook's name.
        webhook: String,
        /// The denial as the API server answers it.
        status: Box<Status>,
    },
    /// A matching webhook has side effects and the request is a dry run.
    #[error("admission webhook \"{webhook}\" does not support dry run")]
    DryRunUnsupported {
        /// The webhook's name.
        webhook: String,
    },
    /// Calling a webhook failed or its answer was invalid, and its failurePolicy is Fail.
    #[error("failed calling webhook \"{webhook}\": {source}")]
    CallWebhook {
        /// The webhook's name.
        webhook: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// A webhook's namespaceSelector or objectSelector is not a valid label selector.
    #[error("webhook \"{webhook}\" has an invalid label selector: {reason}")]
    ParseSelector {
        /// The webhook's name.
        webhook: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A mutating webhook returned a patch that is not an RFC 6902 JSON Patch.
    #[error("webhook \"{webhook}\" returned an invalid JSON patch: {source}")]
    DecodePatch {
        /// The webhook's name.
        webhook: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// A mutating webhook returned a patch that does not apply to the object.
    #[error("webhook \"{webhook}\" returned a JSON patch that does not apply: {source}")]
    ApplyPatch {
        /// The webhook's name.
        webhook: String,
        /// The failed operation.
        #[source]
        source: json_patch::PatchError,
    },
    /// A mutating webhook's patch has nothing to apply to (DELETE), or turned the object into
    /// something that is not the same kind.
    #[error("webhook \"{webhook}\" returned a JSON patch with an invalid result: {reason}")]
    CheckPatchedObject {
        /// The webhook's name.
        webhook: String,
        /// What is wrong with the result.
        reason: String,
    },
    /// A matchCondition is not valid CEL or did not evaluate to a boolean.
    #[error("failed to evaluate match condition \"{condition}\": {reason}")]
    EvaluateMatchCondition {
        /// The condition's name.
        condition: String,
        /// The parse or evaluation error.
        reason: String,
    },
    /// The client config names no address the sandbox can dial.
    #[error("failed to call webhook: {reason}")]
    ResolveWebhook {
        /// Why (an unregistered service, a URL that is not `https://host[:port]/...`).
        reason: String,
    },
    /// The client config's caBundle holds no usable certificate.
    #[error("failed to call webhook: invalid caBundle: {reason}")]
    LoadCaBundle {
        /// What is wrong with it.
        reason: String,
    },
    /// The webhook does not accept `admission.k8s.io/v1` reviews.
    #[error("webhook does not accept v1 AdmissionReview (admissionReviewVersions: {versions:?})")]
    NegotiateReviewVersion {
        /// The versions the configuration lists.
        versions: Vec<String>,
    },
    /// The TCP connection to the webhook failed.
    #[error("failed to call webhook: Post \"{url}\": dial tcp {address}: {source}")]
    ConnectWebhook {
        /// The URL called.
        url: String,
        /// The address dialled.
        address: String,
        /// The connection error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (untrusted certificate, wrong name, ...).
    #[error("failed to call webhook: Post \"{url}\": tls: {source}")]
    TlsHandshake {
        /// The URL called.
        url: String,
        /// The handshake error.
        #[source]
        source: std::io::Error,
    },
    /// Sending the review or reading the answer's head failed.
    #[error("failed to call webhook: Post \"{url}\": {source}")]
    SendReview {
        /// The URL called.
        url: String,
        /// The HTTP error.
        #[source]
        source: hyper::Error,
    },
    /// Reading the answer's body failed or it was too large.
    #[error("failed to call webhook: Post \"{url}\": reading the response: {source}")]
    ReadReview {
        /// The URL called.
        url: String,
        /// The body error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The webhook did not answer within its timeoutSeconds.
    #[error("failed to call webhook: Post \"{url}\": context deadline exceeded ({seconds}s)")]
    TimeOut {
        /// The URL called.
        url: String,
        /// The webhook's timeoutSeconds.
        seconds: i32,
    },
    /// The webhook answered with an HTTP status outside 2xx.
    #[error("failed to call webhook: the server responded with the status code {code}: {body}")]
    WebhookStatus {
        /// The HTTP status code.
        code: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// The answer is not an `AdmissionReview` document.
    #[error("received invalid webhook response: {source}")]
    DecodeReview {
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The answer is an `AdmissionReview` the API server does not accept.
    #[error("received invalid webhook response: {reason}")]
    VerifyReview {
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    /// The `Status` the API server answers with; its `code` is the HTTP status.
    pub fn status(&self) -> Status {
        match self {
            Error::Denied { status, .. } => (**status).clone(),
            Error::DryRunUnsupported { .. } => failure(400, "BadRequest", self.to_string(), None),
            _ => {
                // As apierrors.NewInternalError: the cause repeats the bare message.
                let message = self.to_string();
                let details = StatusDetails {
                    causes: Some(vec![StatusCause {
                        message: Some(message.clone()),
                        ..StatusCause::default()
                    }]),
                    ..StatusDetails::default()
                };
                failure(
                    500,
                    "InternalError",
                    format!("Internal error occurred: {message}"),
                    Some(details),
                )
            }
        }
    }
}

/// A `Status` with `status: Failure`.
fn failure(code: i32, reason: &str, message: String, details: Option<StatusDetails>) -> Status {
    Status {
        code: Some(code),
        details,
        message: Some(message),
        reason: Some(reason.to_owned()),
        status: Some("Failure".to_owned()),
        ..Status::default()
    }
}

/// A request the chain did not admit, with the warnings webhooks gave before it ended.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejection {
    /// Why.
    #[source]
    pub error: Error,
    /// Warnings to send as `Warning` headers all the same.
    pub warnings: Vec<String>,
}

impl Rejection {
    /// The `Status` to answer with ([`Error::status`]).
    pub fn status(&self) -> Status {
        self.error.status()
    }
}

/// A request the chain admitted.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    /// The object to store: the request's object after every mutating webhook's patch (`None`
    /// for DELETE and CONNECT without an object).
    pub object: Option<Value>,
    /// Warnings from the webhooks, in call order, without duplicates.
    pub warnings: Vec<String>,
}

/// The value of a `Warning` response header for a webhook warning: `299 - "<text>"`, with `"`
/// and `\` escaped and control characters replaced by spaces (header values cannot hold them).
pub fn warning_header_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str("299 - \"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\t' => out.push(c),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// === Request attributes ===

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
        }
    }

    /// The labels `namespaceSelector` looks at: a Namespace's own, else the namespace's.
    fn labels_for_namespace_selector(&self) -> BTreeMap<String, String> {
        if self.is_namespace_resource() {
            let own = self.object.as_ref().or(self.old_object.as_ref());
            return own.map(object_labels).unwrap_or_default();
        }
        self.namespace_labels.clone()
    }

    fn is_namespace_resource(&self) -> bool {
        self.resource.group.is_empty() && self.resource.resource == "namespaces"
    }
}

/// The `metadata.labels` of a JSON object (non-string values are skipped).
fn object_labels(object: &Value) -> BTreeMap<String, String> {
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

// === Matching ===

fn exact_or_wildcard(items: Option<&Vec<String>>, requested: &str) -> bool {
    items
        .into_iter()
        .flatten()
        .any(|item| item == "*" || item == requested)
}

/// Whether a webhook rule covers the request: operation, group, version, resource (with
/// `plural/sub`, `*`, `*/*`, `*/status`), and scope (`Cluster`, `Namespaced`, `*`; Namespaces
/// count as cluster-scoped).
pub fn rule_matches(rule: &RuleWithOperations, request: &AdmissionAttributes) -> bool {
    let operation = exact_or_wildcard(rule.operations.as_ref(), request.operation.as_str());
    let group = exact_or_wildcard(rule.api_groups.as_ref(), &request.resource.group);
    let version = exact_or_wildcard(rule.api_versions.as_ref(), &request.resource.version);
    let sub = request.sub_resource.as_deref().unwrap_or("");
    let resource = rule.resources.iter().flatten().any(|item| {
        let (res, rule_sub) = item.split_once('/').unwrap_or((item, ""));
        (res == "*" || res == request.resource.resource) && (rule_sub == "*" || rule_sub == sub)
    });
    let cluster_scoped =
        request.namespace.as_deref().is_none_or(str::is_empty) || request.is_namespace_resource();
    let scope = match rule.scope.as_deref() {
        Some("Namespaced") => !cluster_scoped,
        Some("Cluster") => cluster_scoped,
        _ => true,
    };
    operation && group && version && resource && scope
}

/// Whether `labels` satisfy a label selector (`matchLabels` and `matchExpressions` with In,
/// NotIn, Exists, DoesNotExist). An absent or empty selector matches everything.
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let Some(selector) = selector else {
        return Ok(true);
    };
    for (key, value) in selector.match_labels.iter().flatten() {
        if labels.get(key) != Some(value) {
            return Ok(false);
        }
    }
    for requirement in selector.match_expressions.iter().flatten() {
        let values = requirement.values.as_deref().unwrap_or_default();
        let present = labels.get(&requirement.key);
        let ok = match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "operator {} on key {:?} needs at least one value",
                    requirement.operator, requirement.key
                ));
            }
            "In" => present.is_some_and(|v| values.contains(v)),
            "NotIn" => present.is_none_or(|v| !values.contains(v)),
            "Exists" => present.is_some(),
            "DoesNotExist" => present.is_none(),
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Resources never sent to webhooks, so a broken webhook can always be removed.
pub fn is_exempt_resource(resource: &GroupVersionResource) -> bool {
    resource.group == "admissionregistration.k8s.io"
        && matches!(
            resource.resource.as_str(),
            "validatingwebhookconfigurations"
                | "mutatingwebhookconfigurations"
                | "validatingadmissionpolicies"
                | "validatingadmissionpolicybindings"
                | "mutatingadmissionpolicies"
                | "mutatingadmissionpolicybindings"
        )
}

/// What a match condition decided.
#[derive(Debug, PartialEq)]
enum Conditions {
    /// All true (or none): call the webhook.
    Call,
    /// One is false: skip the webhook.
    Skip,
}

/// Evaluates `matchConditions` as the API server does: any false skips the webhook (even when
/// another failed to evaluate); otherwise any error is returned; otherwise call.
fn evaluate_match_conditions(
    conditions: &[MatchCondition],
    object: Option<&Value>,
    request: &AdmissionAttributes,
    request_json: &Value,
) -> Result<Conditions, Error> {
    use kube::core::cel::KubeCelExt as _;
    use kube::core::cel::cel;

    if conditions.is_empty() {
        return Ok(Conditions::Call);
    }
    let null = Value::Null;
    let mut context = cel::Context::default().with_all();
    context.add_variable_from_value("object", json_to_cel(object.unwrap_or(&null)));
    context.add_variable_from_value(
        "oldObject",
        json_to_cel(request.old_object.as_ref().unwrap_or(&null)),
    );
    context.add_variable_from_value("request", json_to_cel(request_json));
    let mut first_error = None;
    for condition in conditions {
        let outcome = cel::Program::compile(&condition.expression)
            .map_err(|e| e.to_string())
            .and_then(|program| program.execute(&context).map_err(|e| e.to_string()))
            .and_then(|value| match value {
                cel::Value::Bool(b) => Ok(b),
                other => Err(format!("expected a boolean, got {other:?}")),
            });
        match outcome {
            Ok(true) => {}
            Ok(false) => return Ok(Conditions::Skip),
            Err(reason) => {
                first_error.get_or_insert(Error::EvaluateMatchCondition {
                    condition: condition.name.clone(),
                    reason,
                });
            }
        }
    }
    first_error.map_or(Ok(Conditions::Call), Err)
}

/// JSON as CEL sees Kubernetes objects: integral numbers are `int` (serde would make positive
/// ones `uint`, and `object.spec.replicas == 2` would then be false).
fn json_to_cel(value: &Value) -> kube::core::cel::cel::Value {
    use kube::core::cel::cel::Value as Cel;
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Cel::Int(i),
            (None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(items) => Cel::List(Arc::new(items.iter().map(json_to_cel).collect())),
        Value::Object(map) => Cel::from(
            map.iter()
                .map(|(k, v)| (k.clone(), json_to_cel(v)))
                .collect::<HashMap<String, Cel>>(),
        ),
    }
}

// === Webhooks, mutating and validating alike ===

/// One webhook of either kind, borrowed from its configuration.
struct Hook<'a> {
    name: &'a str,
    client_config: &'a WebhookClientConfig,
    rules: &'a [RuleWithOperations],
    ignore_failures: bool,
    namespace_selector: Option<&'a LabelSelector>,
    object_selector: Option<&'a LabelSelector>,
    side_effects: &'a str,
    timeout_seconds: i32,
    match_conditions: &'a [MatchCondition],
    review_versions: &'a [String],
    reinvoke_if_needed: bool,
    mutating: bool,
}

impl<'a> Hook<'a> {
    fn mutating(configs: &'a [MutatingWebhookConfiguration]) -> Vec<Hook<'a>> {
        let mut configs: Vec<_> = configs.iter().collect();
        configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        configs
            .into_iter()
            .flat_map(|c| c.webhooks.iter().flatten())
            .map(|w| Hook {
                name: &w.name,
                client_config: &w.client_config,
                rules: w.rules.as_deref().unwrap_or_default(),
                ignore_failures: w.failure_policy.as_deref() == Some("Ignore"),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
                match_conditions: w.match_conditions.as_deref().unwrap_or_default(),
                review_versions: &w.admission_review_versions,
                reinvoke_if_needed: w.reinvocation_policy.as_deref() == Some("IfNeeded"),
                mutating: true,
            })
            .collect()
    }

    fn validating(configs: &'a [ValidatingWebhookConfiguration]) -> Vec<Hook<'a>> {
        let mut configs: Vec<_> = configs.iter().collect();
        configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        configs
            .into_iter()
            .flat_map(|c| c.webhooks.iter().flatten())
            .map(|w| Hook {
                name: &w.name,
                client_config: &w.client_config,
                rules: w.rules.as_deref().unwrap_or_default(),
                ignore_failures: w.failure_policy.as_deref() == Some("Ignore"),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
                match_conditions: w.match_conditions.as_deref().unwrap_or_default(),
                review_versions: &w.admission_review_versions,
                reinvoke_if_needed: false,
                mutating: false,
            })
            .collect()
    }

    /// Rules and selectors (not matchConditions, which need the review).
    fn matches(
        &self,
        request: &AdmissionAttributes,
        object: Option<&Value>,
    ) -> Result<bool, Error> {
        if !self.rules.iter().any(|rule| rule_matches(rule, request)) {
            return Ok(false);
        }
        let selector_error = |reason| Error::ParseSelector {
            webhook: self.name.to_owned(),
            reason,
        };
        // A cluster-scoped object other than a Namespace is never exempted by namespace.
        let namespaced = request
            .namespace
            .as_deref()
            .is_some_and(|ns| !ns.is_empty());
        if (namespaced || request.is_namespace_resource())
            && !selector_matches(
                self.namespace_selector,
                &request.labels_for_namespace_selector(),
            )
            .map_err(selector_error)?
        {
            return Ok(false);
        }
        if self.object_selector.is_none_or(selector_is_empty) {
            return Ok(true);
        }
        let mut matched = false;
        for candidate in [object, request.old_object.as_ref()].into_iter().flatten() {
            matched |= selector_matches(self.object_selector, &object_labels(candidate))
                .map_err(selector_error)?;
        }
        Ok(matched)
    }

    fn has_no_side_effects(&self) -> bool {
        matches!(self.side_effects, "None" | "NoneOnDryRun")
    }
}

fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
}

/// A review answer that passed the API server's checks.
struct Verdict {
    allowed: bool,
    status: Option<Status>,
    patch: Option<Vec<u8>>,
    warnings: Vec<String>,
}

#[derive(Deserialize)]
struct ReviewAnswer {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    response: Option<ReviewResponse>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewResponse {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    allowed: bool,
    #[serde(default)]
    status: Option<Value>,
    #[serde(default)]
    patch: Option<String>,
    #[serde(default)]
    patch_type: Option<String>,
    #[serde(default)]
    warnings: Option<Vec<String>>,
}

/// Checks an answer as `VerifyAdmissionResponse` does and decodes its patch.
fn verify_answer(body: &[u8], uid: &str, mutating: bool) -> Result<Verdict, Error> {
    let answer: ReviewAnswer =
        serde_json::from_slice(body).map_err(|source| Error::DecodeReview { source })?;
    let verify = |reason: String| Error::VerifyReview { reason };
    let response = answer
        .response
        .ok_or_else(|| verify("webhook response was absent".to_owned()))?;
    if response.uid != uid {
        return Err(verify(format!(
            "expected response.uid={uid:?}, got {:?}",
            response.uid
        )));
    }
    if answer.api_version != "admission.k8s.io/v1" || answer.kind != "AdmissionReview" {
        return Err(verify(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            answer.api_version, answer.kind
        )));
    }
    // The patch is base64 in JSON; bad base64 is a decoding failure of the whole answer.
    let patch = match response.patch.as_deref() {
        Some(text) => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| verify(format!("response.patch is not base64: {e}")))?,
        None => Vec::new(),
    };
    let patch = if mutating {
        match (patch.is_empty(), response.patch_type.as_deref()) {
            (true, None) => None,
            (false, None) => {
                return Err(verify(
                    "webhook returned response.patch but not response.patchType".to_owned(),
                ));
            }
            (true, Some(_)) => {
                return Err(verify(
                    "webhook returned response.patchType but not response.patch".to_owned(),
                ));
            }
            (false, Some("JSONPatch")) => Some(patch),
            (false, Some(other)) => {
                return Err(verify(format!(
                    "webhook returned invalid response.patchType of {other:?}"
                )));
            }
        }
    } else {
        if !patch.is_empty() {
            return Err(verify(
                "validating webhooks may not return patches".to_owned(),
            ));
        }
        if response.patch_type.is_some() {
            return Err(verify(
                "validating webhooks may not return patchType".to_owned(),
            ));
        }
        None
    };
    let status = match response.status {
        Some(mut status) => {
            // The embedded status's own apiVersion/kind are not checked by the real server.
            if let Some(map) = status.as_object_mut() {
                map.remove("apiVersion");
                map.remove("kind");
            }
            Some(
                serde_json::from_value::<Status>(status)
                    .map_err(|source| Error::DecodeReview { source })?,
            )
        }
        None => None,
    };
    Ok(Verdict {
        allowed: response.allowed,
        status,
        patch,
        warnings: response.warnings.unwrap_or_default(),
    })
}

/// The real server decodes the patched object into the request's type: it must stay an object
/// of the same apiVersion and kind.
fn check_patched(before: &Value, after: &Value) -> Result<(), String> {
    if !after.is_object() {
        return Err("the patched object is not a JSON object".to_owned());
    }
    for field in ["apiVersion", "kind"] {
        let was = before.get(field);
        if was.is_some() && after.get(field) != was {
            return Err(format!("the patch changes {field}"));
        }
    }
    Ok(())
}

/// Warnings of two phases, in order, each once.
pub fn merge_warnings(mut first: Vec<String>, second: Vec<String>) -> Vec<String> {
    for warning in second {
        if !first.contains(&warning) {
            first.push(warning);
        }
    }
    first
}

/// The denial a client sees, as `ToStatusErr` builds it.
fn denial(webhook: &str, status: Option<Status>) -> Error {
    let mut status = status.unwrap_or_default();
    let denied_by = format!("admission webhook {webhook:?} denied the request");
    if status.code.is_none_or(|code| code < 400) {
        status.code = Some(400);
    }
    if status
        .status
        .as_deref()
        .is_none_or(|s| s.is_empty() || s == "Success")
    {
        status.status = Some("Failure".to_owned());
    }
    status.message = Some(
        match (status.message.as_deref(), status.reason.as_deref()) {
            (Some(message), _) if !message.is_empty() => format!("{denied_by}: {message}"),
            (_, Some(reason)) if !reason.is_empty() => format!("{denied_by}: {reason}"),
            _ => format!("{denied_by} without explanation"),
        },
    );
    Error::Denied {
        webhook: webhook.to_owned(),
        status: Box::new(status),
    }
}

// === The chain ===

/// A Service a webhook configuration may reference: `namespace/name:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The Service port (443 when the reference names none).
    pub port: u16,
}

impl ServiceRef {
    /// A reference from its parts.
    pub fn new(namespace: &str, name: &str, port: u16) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
        }
    }

    /// The name its certificate must carry: `<name>.<namespace>.svc`.
    pub fn dns_name(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

impl FromStr for ServiceRef {
    type Err = String;

    /// Parses `namespace/name:port` (or `namespace/name`, port 443).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (namespace, rest) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not namespace/name:port"))?;
        let (name, port) = match rest.split_once(':') {
            Some((name, port)) => (
                name,
                port.parse()
                    .map_err(|_| format!("{port:?} in {s:?} is not a port number"))?,
            ),
            None => (rest, 443),
        };
        if namespace.is_empty() || name.is_empty() {
            return Err(format!("{s:?} is not namespace/name:port"));
        }
        Ok(Self::new(namespace, name, port))
    }
}

type Sender = http1::SendRequest<Full<Bytes>>;

/// Where and how to reach one webhook.
struct Endpoint {
    /// What to dial: a socket address, or `host:port` to resolve.
    dial: String,
    server_name: ServerName<'static>,
    /// The URL the real server would call, for `Host`, the path and messages.
    url: String,
    host_header: String,
    path_and_query: String,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    dial: String,
    server_name: String,
    ca_bundle: Vec<u8>,
}

#[derive(Default)]
struct Inner {
    services: RwLock<HashMap<ServiceRef, SocketAddr>>,
    idle: Mutex<HashMap<PoolKey, Vec<Sender>>>,
    tls: Mutex<HashMap<Vec<u8>, Arc<rustls::ClientConfig>>>,
}

/// The webhook call path: knows where services live, keeps connections, runs [`Self::admit`].
///
/// Cheap to clone; clones share the registered addresses and the connection pool.
#[derive(Clone, Default)]
pub struct AdmissionChain {
    inner: Arc<Inner>,
}

impl fmt::Debug for AdmissionChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let services = self
            .inner
            .services
            .read()
            .map(|s| s.len())
            .unwrap_or_default();
        f.debug_struct("AdmissionChain")
            .field("services", &services)
            .finish_non_exhaustive()
    }
}

impl AdmissionChain {
    /// A chain that knows no service addresses yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builder form of [`Self::register_service`].
    pub fn with_service(self, service: ServiceRef, address: SocketAddr) -> Self {
        self.register_service(service, address);
        self
    }

    /// Makes webhooks referencing `service` dial `address` (while still verifying the
    /// certificate for `<name>.<namespace>.svc`). Replaces an earlier registration.
    pub fn register_service(&self, service: ServiceRef, address: SocketAddr) {
        let mut services = self
            .inner
            .services
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        services.insert(service, address);
    }

    /// Runs the whole chain for one request: [`Self::mutate`], then [`Self::validate`] on the
    /// mutated object. Warnings of both phases are returned together.
    ///
    /// The real server validates the mutated object (defaults, schema, pruning) between the two
    /// phases; a store that does so calls the two phases itself.
    pub async fn admit(
        &self,
        mutating: &[MutatingWebhookConfiguration],
        validating: &[ValidatingWebhookConfiguration],
        request: &AdmissionAttributes,
    ) -> Result<Admitted, Rejection> {
        let mutated = self.mutate(mutating, request).await?;
        let mut request = request.clone();
        request.object = mutated.object;
        match self.validate(validating, &request).await {
            Ok(validated) => Ok(Admitted {
                object: validated.object,
                warnings: merge_warnings(mutated.warnings, validated.warnings),
            }),
            Err(rejection) => Err(Rejection {
                error: rejection.error,
                warnings: merge_warnings(mutated.warnings, rejection.warnings),
            }),
        }
    }

    /// The mutating phase: matching mutating webhooks in configuration-name order, each on the
    /// previous one's result, then one reinvocation round for `reinvocationPolicy: IfNeeded`.
    /// Returns the mutated object.
    pub async fn mutate(
        &self,
        mutating: &[MutatingWebhookConfiguration],
        request: &AdmissionAttributes,
    ) -> Result<Admitted, Rejection> {
        let mut object = request.object.clone();
        let mut warnings = Vec::new();
        if is_exempt_resource(&request.resource) {
            return Ok(Admitted { object, warnings });
        }
        let hooks = Hook::mutating(mutating);
        let outcome = async {
            // The object each webhook left behind, to know whom a later change concerns.
            let mut after_call: Vec<Option<Option<Value>>> = Vec::with_capacity(hooks.len());
            for hook in &hooks {
                let called = self
                    .dispatch(hook, request, &mut object, &mut warnings)
                    .await?;
                after_call.push(called.then(|| object.clone()));
            }
            // As the real server: IfNeeded webhooks whose output a later webhook changed see the
            // object once more.
            for (hook, seen) in hooks.iter().zip(after_call) {
                if hook.reinvoke_if_needed && seen.is_some_and(|seen| seen != object) {
                    self.dispatch(hook, request, &mut object, &mut warnings)
                        .await?;
                }
            }
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => Ok(Admitted { object, warnings }),
            Err(error) => Err(Rejection { error, warnings }),
        }
    }

    /// The validating phase: matching validating webhooks in configuration-name order, on
    /// `request.object` as it will be stored. The returned object is `request.object`.
    pub async fn validate(
        &self,
        validating: &[ValidatingWebhookConfiguration],
        request: &AdmissionAttributes,
    ) -> Result<Admitted, Rejection> {
        let mut object = request.object.clone();
        let mut warnings = Vec::new();
        if is_exempt_resource(&request.resource) {
            return Ok(Admitted { object, warnings });
        }
        for hook in &Hook::validating(validating) {
            if let Err(error) = self
                .dispatch(hook, request, &mut object, &mut warnings)
                .await
            {
                return Err(Rejection { error, warnings });
            }
        }
        Ok(Admitted { object, warnings })
    }

    /// Calls one webhook if it matches; returns whether it was called.
    async fn dispatch(
        &self,
        hook: &Hook<'_>,
        request: &AdmissionAttributes,
        object: &mut Option<Value>,
        warnings: &mut Vec<String>,
    ) -> Result<bool, Error> {
        if !hook.matches(request, object.as_ref())? {
            return Ok(false);
        }
        let uid = uuid::Uuid::new_v4().to_string();
        let review_request = review_request(&uid, request, object.as_ref());
        let call_error = |source: Error| Error::CallWebhook {
            webhook: hook.name.to_owned(),
            source: Box::new(source),
        };
        match evaluate_match_conditions(
            hook.match_conditions,
            object.as_ref(),
            request,
            &review_request,
        ) {
            Ok(Conditions::Call) => {}
            Ok(Conditions::Skip) => return Ok(false),
            Err(error) if hook.ignore_failures => {
                warn!(webhook = hook.name, %error, "Match condition failed, failing open");
                return Ok(false);
            }
            Err(error) => return Err(call_error(error)),
        }
        if request.dry_run && !hook.has_no_side_effects() {
            return Err(Error::DryRunUnsupported {
                webhook: hook.name.to_owned(),
            });
        }
        let verdict = match self.call(hook, &uid, review_request).await {
            Ok(verdict) => verdict,
            Err(error) if hook.ignore_failures => {
                warn!(webhook = hook.name, %error, "Failed calling webhook, failing open");
                return Ok(false);
            }
            Err(error) => {
                warn!(webhook = hook.name, %error, "Failed calling webhook, failing closed");
                return Err(call_error(error));
            }
        };
        for warning in verdict.warnings {
            if !warning.is_empty() && !warnings.contains(&warning) {
                warnings.push(warning);
            }
        }
        if !verdict.allowed {
            debug!(webhook = hook.name, "Denied");
            return Err(denial(hook.name, verdict.status));
        }
        if let Some(patch) = verdict.patch {
            let webhook = hook.name.to_owned();
            let patch: json_patch::Patch =
                serde_json::from_slice(&patch).map_err(|source| Error::DecodePatch {
                    webhook: webhook.clone(),
                    source,
                })?;
            if !patch.0.is_empty() {
                let Some(current) = object.as_ref() else {
                    return Err(Error::CheckPatchedObject {
                        webhook,
                        reason: "the request has no object to patch".to_owned(),
                    });
                };
                let mut patched = current.clone();
                json_patch::patch(&mut patched, &patch).map_err(|source| Error::ApplyPatch {
                    webhook: webhook.clone(),
                    source,
                })?;
                check_patched(current, &patched)
                    .map_err(|reason| Error::CheckPatchedObject { webhook, reason })?;
                *object = Some(patched);
            }
        }
        Ok(true)
    }

    /// POSTs the review and checks the answer, all within the webhook's timeout.
    async fn call(&self, hook: &Hook<'_>, uid: &str, request: Value) -> Result<Verdict, Error> {
        if !hook.review_versions.is_empty() && !hook.review_versions.iter().any(|v| v == "v1") {
            return Err(Error::NegotiateReviewVersion {
                versions: hook.review_versions.to_vec(),
            });
        }
        let seconds = hook.timeout_seconds.clamp(1, 30);
        let endpoint = self.endpoint(hook.client_config, seconds)?;
        let ca_bundle = hook
            .client_config
            .ca_bundle
            .as_ref()
            .map(|ByteString(b)| b.clone())
            .unwrap_or_default();
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        });
        let body = Bytes::from(review.to_string());
        let url = endpoint.url.clone();
        let exchange = self.exchange(&endpoint, ca_bundle, body);
        let (code, answer) =
            match tokio::time::timeout(Duration::from_secs(seconds as u64), exchange).await {
                Ok(answered) => answered?,
                Err(_elapsed) => return Err(Error::TimeOut { url, seconds }),
            };
        if !(200..=206).contains(&code) {
            let body = String::from_utf8_lossy(&answer[..answer.len().min(256)]).into_owned();
            return Err(Error::WebhookStatus { code, body });
        }
        verify_answer(&answer, uid, hook.mutating)
    }

    /// Where a client config points, as the real server would call it.
    fn endpoint(&self, config: &WebhookClientConfig, seconds: i32) -> Result<Endpoint, Error> {
        let resolve = |reason: String| Error::ResolveWebhook { reason };
        if let Some(service) = &config.service {
            let port = service.port.unwrap_or(443);
            let port = u16::try_from(port)
                .map_err(|_| resolve(format!("service port {port} is out of range")))?;
            let key = ServiceRef::new(&service.namespace, &service.name, port);
            let address = self
                .inner
                .services
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&key)
                .copied()
                .ok_or_else(|| {
                    resolve(format!(
                        "service \"{key}\" has no address registered with the sandbox"
                    ))
                })?;
            let host = key.dns_name();
            let server_name = ServerName::try_from(host.clone())
                .map_err(|e| resolve(format!("{host:?} is not a valid server name: {e}")))?;
            let path = service.path.as_deref().unwrap_or("/");
            let host_header = format!("{host}:{port}");
            let path_and_query = format!("{path}?timeout={seconds}s");
            return Ok(Endpoint {
                dial: address.to_string(),
                server_name,
                url: format!("https://{host_header}{path_and_query}"),
                host_header,
                path_and_query,
            });
        }
        let Some(url) = config.url.as_deref() else {
            return Err(resolve(
                "clientConfig has neither service nor url".to_owned(),
            ));
        };
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| resolve(format!("invalid url {url:?}: {e}")))?;
        if uri.scheme_str() != Some("https") {
            return Err(resolve(format!("url {url:?} is not https")));
        }
        let host = uri
            .host()
            .ok_or_else(|| resolve(format!("url {url:?} has no host")))?;
        // An IPv6 literal comes bracketed; the server name is the bare address.
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let server_name = ServerName::try_from(bare.clone())
            .map_err(|e| resolve(format!("{host:?} is not a valid server name: {e}")))?;
        let port = uri.port_u16().unwrap_or(443);
        let path = match uri.path() {
            "" => "/",
            p => p,
        };
        let path_and_query = match uri.query() {
            Some(q) => format!("{path}?{q}&timeout={seconds}s"),
            None => format!("{path}?timeout={seconds}s"),
        };
        let host_header = format!("{host}:{port}");
        Ok(Endpoint {
            dial: host_header.clone(),
            server_name,
            url: format!("https://{host_header}{path_and_query}"),
            host_header,
            path_and_query,
        })
    }

    /// Sends the body on a pooled or new connection; returns the status code and body.
    async fn exchange(
        &self,
        endpoint: &Endpoint,
        ca_bundle: Vec<u8>,
        body: Bytes,
    ) -> Result<(u16, Bytes), Error> {
        let key = PoolKey {
            dial: endpoint.dial.clone(),
            server_name: endpoint.server_name.to_str().into_owned(),
            ca_bundle,
        };
        let make = || {
            hyper::Request::post(endpoint.path_and_query.as_str())
                .header(hyper::header::HOST, endpoint.host_header.as_str())
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header(hyper::header::ACCEPT, "application/json")
                .header(
                    hyper::header::USER_AGENT,
                    "kube-sandbox-apiserver-admission",
                )
                .body(Full::new(body.clone()))
        };
        // A kept-alive connection may have been closed by the server meanwhile: try a fresh one.
        if let Some(mut sender) = self.take_idle(&key).await {
            let request = make().map_err(|e| Error::ResolveWebhook {
                reason: format!("invalid request for {}: {e}", endpoint.url),
            })?;
            match sender.send_request(request).await {
                Ok(response) => return self.finish(key, sender, response, endpoint).await,
                Err(error) => debug!(%error, url = %endpoint.url, "Reused connection failed"),
            }
        }
        let mut sender = self.connect(endpoint, &key).await?;
        let request = make().map_err(|e| Error::ResolveWebhook {
            reason: format!("invalid request for {}: {e}", endpoint.url),
        })?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| Error::SendReview {
                url: endpoint.url.clone(),
                source,
            })?;
        self.finish(key, sender, response, endpoint).await
    }

    /// Reads the answer, then returns the connection to the pool if it can serve again.
    async fn finish(
        &self,
        key: PoolKey,
        sender: Sender,
        response: hyper::Response<hyper::body::Incoming>,
        endpoint: &Endpoint,
    ) -> Result<(u16, Bytes), Error> {
        let code = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|source| Error::ReadReview {
                url: endpoint.url.clone(),
                source,
            })?
            .to_bytes();
        if !sender.is_closed() {
            let mut idle = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let senders = idle.entry(key).or_default();
            if senders.len() < MAX_IDLE_PER_ENDPOINT {
                senders.push(sender);
            }
        }
        Ok((code, body))
    }

    async fn take_idle(&self, key: &PoolKey) -> Option<Sender> {
        loop {
            let sender = {
                let mut idle = self
                    .inner
                    .idle
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                idle.get_mut(key).and_then(Vec::pop)
            };
            let mut sender = sender?;
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    async fn connect(&self, endpoint: &Endpoint, key: &PoolKey) -> Result<Sender, Error> {
        let config = self.tls_config(&key.ca_bundle)?;
        let url = || endpoint.url.clone();
        let tcp = TcpStream::connect(endpoint.dial.as_str())
            .await
            .map_err(|source| Error::ConnectWebhook {
                url: url(),
                address: endpoint.dial.clone(),
                source,
            })?;
        // Reviews are small request/response pairs: Nagle would only add latency.
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(endpoint.server_name.clone(), tcp)
            .await
            .map_err(|source| Error::TlsHandshake { url: url(), source })?;
        let (sender, connection) = http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| Error::SendReview { url: url(), source })?;
        let url = url();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, %url, "Webhook connection ended");
            }
        });
        Ok(sender)
    }

    /// A client configuration trusting exactly the certificates of `ca_bundle`.
    fn tls_config(&self, ca_bundle: &[u8]) -> Result<Arc<rustls::ClientConfig>, Error> {
        let mut cache = self
            .inner
            .tls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = cache.get(ca_bundle) {
            return Ok(config.clone());
        }
        let load = |reason: String| Error::LoadCaBundle { reason };
        if ca_bundle.is_empty() {
            return Err(load(
                "empty: the sandbox trusts only clientConfig.caBundle".to_owned(),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_bundle) {
            let cert = cert.map_err(|e| load(format!("not PEM: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| load(format!("bad certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(load("no certificate in it".to_owned()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| load(format!("no TLS version available: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // The API server's webhook client pins HTTP/1.1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        cache.insert(ca_bundle.to_vec(), config.clone());
        Ok(config)
    }
}

/// The `request` of an `AdmissionReview` for `object` (the current, possibly mutated, object).
fn review_request(uid: &str, request: &AdmissionAttributes, object: Option<&Value>) -> Value {
    let mut review = json!({
        "uid": uid,
        "kind": request.kind,
        "resource": request.resource,
        "requestKind": request.kind,
        "requestResource": request.resource,
        "operation": request.operation.as_str(),
        "userInfo": request.user_info,
        "object": object,
        "oldObject": request.old_object,
        "dryRun": request.dry_run,
        "options": request.options,
    });
    if let Some(map) = review.as_object_mut() {
        if let Some(sub) = request.sub_resource.as_deref().filter(|s| !s.is_empty()) {
            map.insert("subResource".to_owned(), json!(sub));
            map.insert("requestSubResource".to_owned(), json!(sub));
        }
        if !request.name.is_empty() {
            map.insert("name".to_owned(), json!(request.name));
        }
        if let Some(namespace) = request.namespace.as_deref().filter(|s| !s.is_empty()) {
            map.insert("namespace".to_owned(), json!(namespace));
        }
    }
    review
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn deployment_create() -> AdmissionAttributes {
        let mut request = AdmissionAttributes::new(
            Operation::Create,
            GroupVersionKind::new("apps", "v1", "Deployment"),
            GroupVersionResource::new("apps", "v1", "deployments"),
        );
        request.namespace = Some("default".to_owned());
        request.name = "web".to_owned();
        request.object = Some(json!({"metadata": {"name": "web", "labels": {"app": "web"}}}));
        request
    }

    fn rule(
        ops: &[&str],
        groups: &[&str],
        resources: &[&str],
        scope: Option<&str>,
    ) -> RuleWithOperations {
        let owned = |items: &[&str]| Some(items.iter().map(|s| s.to_string()).collect());
        RuleWithOperations {
            operations: owned(ops),
            api_groups: owned(groups),
            api_versions: owned(&["*"]),
            resources: owned(resources),
            scope: scope.map(str::to_owned),
        }
    }

    #[test]
    fn rules_match_operations_groups_and_resources() {
        let request = deployment_create();
        assert!(rule_matches(
            &rule(&["CREATE"], &["apps"], &["deployments"], None),
            &request
        ));
        assert!(rule_matches(
            &rule(&["*"], &["*"], &["*"], Some("*")),
            &request
        ));
        assert!(!rule_matches(
            &rule(&["UPDATE"], &["apps"], &["deployments"], None),
            &request
        ));
        assert!(!rule_matches(
            &rule(&["CREATE"], &[""], &["deployments"], None),
            &request
        ));
        assert!(!rule_matches(
            &rule(&["CREATE"], &["apps"], &["services"], None),
            &request
        ));
    }

    #[test]
    fn subresources_match_only_rules_that_name_them() {
        let mut request = deployment_create();
        request.operation = Operation::Update;
        request.sub_resource = Some("status".to_owned());
        assert!(!rule_matches(
            &rule(&["*"], &["*"], &["deployments"], None),
            &request
        ));
        assert!(!rule_matches(&rule(&["*"], &["*"], &["*"], None), &request));
        assert!(rule_matches(
            &rule(&["*"], &["*"], &["deployments/status"], None),
            &request
        ));
        assert!(rule_matches(
            &rule(&["*"], &["*"], &["*/status"], None),
            &request
        ));
        assert!(rule_matches(
            &rule(&["*"], &["*"], &["*/*"], None),
            &request
        ));
        assert!(!rule_matches(
            &rule(&["*"], &["*"], &["deployments/scale"], None),
            &request
        ));
    }

    #[test]
    fn scope_tells_namespaced_from_cluster_requests() {
        let namespaced = deployment_create();
        let mut namespace = AdmissionAttributes::new(
            Operation::Create,
            GroupVersionKind::new("", "v1", "Namespace"),
            GroupVersionResource::new("", "v1", "namespaces"),
        );
        // A Namespace is cluster-scoped even though its request names it as the namespace.
        namespace.namespace = Some("team".to_owned());
        let cluster = rule(&["*"], &["*"], &["*"], Some("Cluster"));
        let scoped = rule(&["*"], &["*"], &["*"], Some("Namespaced"));
        assert!(rule_matches(&scoped, &namespaced));
        assert!(!rule_matches(&cluster, &namespaced));
        assert!(rule_matches(&cluster, &namespace));
        assert!(!rule_matches(&scoped, &namespace));
    }

    fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn selectors_support_labels_and_every_operator() {
        let labels: BTreeMap<String, String> = [
            ("env".to_owned(), "prod".to_owned()),
            ("tier".to_owned(), "web".to_owned()),
        ]
        .into();
        let selector = |expressions: Vec<LabelSelectorRequirement>| LabelSelector {
            match_labels: Some([("tier".to_owned(), "web".to_owned())].into()),
            match_expressions: Some(expressions),
        };
        let check = |e: Vec<LabelSelectorRequirement>| {
            selector_matches(Some(&selector(e)), &labels).unwrap()
        };
        assert!(check(vec![requirement("env", "In", &["prod", "staging"])]));
        assert!(!check(vec![requirement("env", "In", &["dev"])]));
        assert!(check(vec![requirement("env", "NotIn", &["dev"])]));
        assert!(check(vec![requirement("missing", "NotIn", &["dev"])]));
        assert!(!check(vec![requirement("env", "NotIn", &["prod"])]));
        assert!(check(vec![requirement("env", "Exists", &[])]));
        assert!(!check(vec![requirement("env", "DoesNotExist", &[])]));
        assert!(check(vec![requirement("missing", "DoesNotExist", &[])]));
        assert!(selector_matches(None, &labels).unwrap());
        assert!(selector_matches(Some(&LabelSelector::default()), &BTreeMap::new()).unwrap());
        assert!(selector_matches(Some(&selector(vec![])), &BTreeMap::new()) == Ok(false));
        assert!(
            selector_matches(
                Some(&selector(vec![requirement("env", "Near", &["x"])])),
                &labels
            )
            .is_err()
        );
    }

    #[test]
    fn match_conditions_skip_on_false_and_fail_on_errors() {
        let request = deployment_create();
        let review = review_request("u", &request, request.object.as_ref());
        let condition = |name: &str, expression: &str| MatchCondition {
            name: name.to_owned(),
            expression: expression.to_owned(),
        };
        let eval = |conditions: &[MatchCondition]| {
            evaluate_match_conditions(conditions, request.object.as_ref(), &request, &review)
        };
        assert_eq!(
            eval(&[condition("create", "request.operation == 'CREATE'")]).unwrap(),
            Conditions::Call
        );
        assert_eq!(
            eval(&[condition("labels", "object.metadata.labels.app == 'web'")]).unwrap(),
            Conditions::Call
        );
        assert_eq!(
            eval(&[condition("update", "request.operation == 'UPDATE'")]).unwrap(),
            Conditions::Skip
        );
        assert_eq!(
            eval(&[condition("old", "oldObject == null")]).unwrap(),
            Conditions::Call
        );
        let broken = condition("broken", "object.nope.deeper == 1");
        assert!(matches!(
            eval(std::slice::from_ref(&broken)),
            Err(Error::EvaluateMatchCondition { .. })
        ));
        // A false condition wins over an error.
        assert_eq!(
            eval(&[broken, condition("no", "false")]).unwrap(),
            Conditions::Skip
        );
    }

    #[test]
    fn denials_raise_the_code_and_name_the_webhook() {
        let status = Status {
            code: Some(200),
            message: Some("replicas must be >= 0".to_owned()),
            reason: Some("Invalid".to_owned()),
            ..Status::default()
        };
        let status = denial("validate.example.com", Some(status)).status();
        assert_eq!(status.code, Some(400));
        assert_eq!(status.status.as_deref(), Some("Failure"));
        assert_eq!(status.reason.as_deref(), Some("Invalid"));
        assert_eq!(
            status.message.as_deref(),
            Some(
                "admission webhook \"validate.example.com\" denied the request: replicas must be >= 0"
            )
        );
        let bare = denial("v", None).status();
        assert_eq!(
            bare.message.as_deref(),
            Some("admission webhook \"v\" denied the request without explanation")
        );
    }

    #[test]
    fn admission_futures_can_run_on_a_multithreaded_server() {
        // axum handlers need Send futures; this fails to compile otherwise.
        fn spawnable<F: std::future::Future + Send>(future: F) -> F {
            future
        }
        let chain = AdmissionChain::new();
        let request = deployment_create();
        let future = spawnable(chain.admit(&[], &[], &request));
        let admitted = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
            .unwrap();
        assert_eq!(admitted.object, request.object);
    }

    #[test]
    fn patched_objects_keep_their_kind() {
        let before = json!({"apiVersion": "v1", "kind": "Service"});
        assert!(
            check_patched(
                &before,
                &json!({"apiVersion": "v1", "kind": "Service", "x": 1})
            )
            .is_ok()
        );
        assert!(check_patched(&before, &json!({"apiVersion": "v1", "kind": "Pod"})).is_err());
        assert!(check_patched(&before, &json!([1])).is_err());
    }

    #[test]
    fn warning_header_values_are_quoted_and_escaped() {
        assert_eq!(warning_header_value("plain"), "299 - \"plain\"");
        assert_eq!(
            warning_header_value("a \"quoted\" \\ thing\nnext"),
            "299 - \"a \\\"quoted\\\" \\\\ thing next\""
        );
    }

    #[test]
    fn service_refs_parse_and_print() {
        let service: ServiceRef = "ops/webhook:8443".parse().unwrap();
        assert_eq!(service, ServiceRef::new("ops", "webhook", 8443));
        assert_eq!(service.to_string(), "ops/webhook:8443");
        assert_eq!(service.dns_name(), "webhook.ops.svc");
        assert_eq!("ops/webhook".parse::<ServiceRef>().unwrap().port, 443);
        assert!("webhook:443".parse::<ServiceRef>().is_err());
        assert!("ops/webhook:http".parse::<ServiceRef>().is_err());
    }

    #[test]
    fn answers_are_verified_like_the_api_server() {
        let ok = |response: Value| {
            serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response
            }))
            .unwrap()
        };
        let reason = |body: Vec<u8>, mutating: bool| match verify_answer(&body, "u1", mutating) {
            Err(Error::VerifyReview { reason }) => reason,
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("answer accepted"),
        };
        assert!(verify_answer(&ok(json!({"uid": "u1", "allowed": true})), "u1", false).is_ok());
        assert!(reason(ok(json!({"uid": "u2", "allowed": true})), false).contains("response.uid"));
        let patch = base64::engine::general_purpose::STANDARD.encode("[]");
        assert!(
            reason(
                ok(json!({"uid": "u1", "allowed": true, "patch": patch})),
                true
            )
            .contains("not response.patchType")
        );
        assert!(
            reason(
                ok(json!({"uid": "u1", "allowed": true, "patchType": "JSONPatch"})),
                true
            )
            .contains("not response.patch")
        );
        assert!(
            reason(
                ok(json!({"uid": "u1", "allowed": true, "patch": patch, "patchType": "JSONPatch"})),
                false
            )
            .contains("may not return patches")
        );
        let wrong_kind = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
            "response": {"uid": "u1", "allowed": true}
        }))
        .unwrap();
        assert!(reason(wrong_kind, false).contains("expected webhook response"));
        assert!(
            reason(
                b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}".to_vec(),
                false
            )
            .contains("absent")
        );
    }
}
