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

mod attributes;
mod client;
mod errors;
mod hook;
mod matching;
mod policy;
mod review;
mod trust;

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use serde_json::Value;
use tracing::{debug, warn};

pub use attributes::{AdmissionAttributes, GroupVersionKind, GroupVersionResource, Operation};
pub use client::ServiceRef;
pub use errors::{Error, Rejection};
pub use hook::DEFAULT_TIMEOUT_SECONDS;
pub use matching::{is_exempt_resource, rule_matches, selector_matches};
pub use policy::validation::PARAMS_NOT_MODELLED;
pub(crate) use policy::validation::prepare as prepare_policy_object;
pub use policy::{AuditAnnotation, VALIDATION_FAILURE_KEY, Validating};

use client::WebhookClient;
use errors::denial;
use hook::Hook;
use matching::{Conditions, evaluate_match_conditions};
use review::{check_patched, review_request};

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

/// Warnings of two phases, in order, each once.
pub fn merge_warnings(mut first: Vec<String>, second: Vec<String>) -> Vec<String> {
    for warning in second {
        if !first.contains(&warning) {
            first.push(warning);
        }
    }
    first
}

/// The webhook call path: knows where services live, keeps connections, runs [`Self::admit`].
///
/// Cheap to clone; clones share the registered addresses and the connection pool.
#[derive(Clone, Default)]
pub struct AdmissionChain {
    client: Arc<WebhookClient>,
    audit: Arc<Mutex<Vec<AuditAnnotation>>>,
}

impl fmt::Debug for AdmissionChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let services = self.client.service_count();
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
        self.client.register_service(service, address);
    }

    /// Sets the endpoints behind `service`, each Ready or not, as its EndpointSlice would list
    /// them: a call dials only Ready ones (in turn), and fails with `no endpoints available`
    /// when there is none. Kept-alive connections are per Service, as the API server's are.
    pub fn set_endpoints(&self, service: ServiceRef, addresses: Vec<(SocketAddr, bool)>) {
        self.client.set_endpoints(service, addresses);
    }

    /// Runs the whole chain for one request: [`Self::mutate`], then [`Self::validate`] on the
    /// mutated object. Warnings of both phases are returned together.
    ///
    /// The real server validates the mutated object (defaults, schema, pruning) between the two
    /// phases; a store that does so calls the two phases itself.
    pub async fn admit(
        &self,
        mutating: &[MutatingWebhookConfiguration],
        validating: impl Into<Validating>,
        request: &AdmissionAttributes,
    ) -> Result<Admitted, Rejection> {
        let validating = validating.into();
        let mutated = self.mutate(mutating, request).await?;
        let mut request = request.clone();
        request.object = mutated.object;
        match self.validate(&validating, &request).await {
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

    /// The validating phase, on `request.object` as it will be stored: the bound
    /// ValidatingAdmissionPolicies (in policy-name order), then the matching validating webhooks
    /// in configuration-name order, as the real server orders its plugins. The returned object
    /// is `request.object`.
    pub async fn validate(
        &self,
        validating: impl Into<Validating>,
        request: &AdmissionAttributes,
    ) -> Result<Admitted, Rejection> {
        let validating = validating.into();
        let mut object = request.object.clone();
        let policies = policy::dispatch(&validating, request);
        let mut warnings = policies.warnings;
        if !policies.annotations.is_empty() {
            let mut audit = self.audit.lock().unwrap_or_else(PoisonError::into_inner);
            audit.extend(policies.annotations);
        }
        if let Some(error) = policies.denial {
            debug!(%error, "Denied by a ValidatingAdmissionPolicy");
            return Err(Rejection { error, warnings });
        }
        if is_exempt_resource(&request.resource) {
            return Ok(Admitted { object, warnings });
        }
        for hook in &Hook::validating(&validating.webhooks) {
            if let Err(error) = self
                .dispatch(hook, request, &mut object, &mut warnings)
                .await
            {
                return Err(Rejection { error, warnings });
            }
        }
        Ok(Admitted { object, warnings })
    }

    /// The audit annotations ValidatingAdmissionPolicies gave requests so far (the Audit
    /// action's `validation.policy.admission.k8s.io/validation_failure`), oldest first: what
    /// the real server writes into its audit log.
    pub fn audit_annotations(&self) -> Vec<AuditAnnotation> {
        self.audit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
        let verdict = match self.client.call(hook, &uid, review_request).await {
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
}

#[cfg(test)]
mod tests {
    use super::matching::tests::deployment_create;
    use super::*;

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
    fn warning_header_values_are_quoted_and_escaped() {
        assert_eq!(warning_header_value("plain"), "299 - \"plain\"");
        assert_eq!(
            warning_header_value("a \"quoted\" \\ thing\nnext"),
            "299 - \"a \\\"quoted\\\" \\\\ thing next\""
        );
    }
}
