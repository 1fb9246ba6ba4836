//! ValidatingAdmissionPolicy and its Binding (`admissionregistration.k8s.io/v1`), evaluated in
//! the validating phase before the validating webhooks, as kube-apiserver's
//! `ValidatingAdmissionPolicy` plugin does (`apiserver/pkg/admission/plugin/policy/validating/`
//! `dispatcher.go`, `validator.go`; `policy/generic/policy_matcher.go`; `policy/matching/`).
//!
//! For each policy (in name order) whose `matchConstraints` match the request, each binding
//! naming it (in name order) whose `matchResources` match: the policy's `matchConditions`, then
//! its `validations`, over `object`, `oldObject`, `request`, `namespaceObject` and
//! `variables`. A validation that is not `true` is a failure; an evaluation error is a failure
//! under `failurePolicy: Fail` and nothing under `Ignore`. Each failure is handed to the
//! binding's `validationActions`: Deny refuses the request (the first denial is the answer),
//! Warn adds a `Warning`, Audit records the `validation.policy.admission.k8s.io/validation_failure`
//! annotation ([`AuditAnnotation`]).
//!
//! Not modelled: params (`paramKind`, `paramRef`: refused when the objects are written, see
//! [`validation`]), `authorizer`, `auditAnnotations`' value expressions, the runtime cost budget,
//! `matchPolicy: Equivalent` (rules see the request's own group and version only), and the
//! type checking that fills `status.typeChecking`.

mod constraints;
mod expressions;
pub(crate) mod validation;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use serde_json::json;

use super::attributes::{AdmissionAttributes, GroupVersionResource, Operation};
use super::errors::Error;
use expressions::{Decision, evaluate};

/// The audit annotation key of a failed validation under the Audit action.
pub const VALIDATION_FAILURE_KEY: &str = "validation.policy.admission.k8s.io/validation_failure";

/// What the validating phase checks a write against: the stored webhook configurations,
/// policies and bindings.
#[derive(Clone, Debug, Default)]
pub struct Validating {
    /// ValidatingWebhookConfigurations.
    pub webhooks: Vec<ValidatingWebhookConfiguration>,
    /// ValidatingAdmissionPolicies.
    pub policies: Vec<ValidatingAdmissionPolicy>,
    /// ValidatingAdmissionPolicyBindings.
    pub bindings: Vec<ValidatingAdmissionPolicyBinding>,
}

impl Validating {
    /// Whether nothing could take part: no webhooks, and no policy with a binding.
    pub fn is_empty(&self) -> bool {
        self.webhooks.is_empty() && (self.policies.is_empty() || self.bindings.is_empty())
    }
}

// === impl From for Validating ===
// Webhook configurations alone, as the chain's callers that know no policies pass them.

impl From<&Validating> for Validating {
    fn from(validating: &Validating) -> Self {
        validating.clone()
    }
}

impl From<&[ValidatingWebhookConfiguration]> for Validating {
    fn from(webhooks: &[ValidatingWebhookConfiguration]) -> Self {
        Validating {
            webhooks: webhooks.to_vec(),
            ..Validating::default()
        }
    }
}

impl<const N: usize> From<&[ValidatingWebhookConfiguration; N]> for Validating {
    fn from(webhooks: &[ValidatingWebhookConfiguration; N]) -> Self {
        Self::from(webhooks.as_slice())
    }
}

impl From<&Vec<ValidatingWebhookConfiguration>> for Validating {
    fn from(webhooks: &Vec<ValidatingWebhookConfiguration>) -> Self {
        Self::from(webhooks.as_slice())
    }
}

/// One audit annotation a request got from a policy, with the request it belongs to (the real
/// server writes it into the request's audit event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditAnnotation {
    /// The request's operation.
    pub operation: Operation,
    /// The resource written.
    pub resource: GroupVersionResource,
    /// The request's namespace, if any.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
    /// The annotation's key, e.g. [`VALIDATION_FAILURE_KEY`].
    pub key: String,
    /// Its value: for a validation failure, a JSON list of one
    /// `{"message", "policy", "binding", "expressionIndex", "validationActions"}`.
    pub value: String,
}

/// What the policies made of one request.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Warn actions' texts, each once.
    pub warnings: Vec<String>,
    /// Audit annotations.
    pub annotations: Vec<AuditAnnotation>,
    /// The first denial, as the client gets it.
    pub denial: Option<Error>,
}

/// A failure handed to the Deny action.
struct Denied {
    policy: String,
    binding: Option<String>,
    message: String,
    reason: Option<String>,
}

/// Runs every policy bound to something that matches `request`.
pub(super) fn dispatch(validating: &Validating, request: &AdmissionAttributes) -> Outcome {
    let mut outcome = Outcome::default();
    let mut denied: Option<Denied> = None;
    let mut policies: Vec<&ValidatingAdmissionPolicy> = validating.policies.iter().collect();
    policies.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut bindings: Vec<&ValidatingAdmissionPolicyBinding> = validating.bindings.iter().collect();
    bindings.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for policy in policies {
        let policy_name = policy.metadata.name.clone().unwrap_or_default();
        let spec = policy.spec.clone().unwrap_or_default();
        let fail_closed = spec.failure_policy.as_deref() != Some("Ignore");
        let matched = match spec.match_constraints.as_ref() {
            None => Err("policy contained no match constraints, a required field".to_owned()),
            Some(constraints) => constraints::matches(constraints, request),
        };
        match matched {
            Err(error) => {
                config_error(&mut denied, fail_closed, &policy_name, None, error);
                continue;
            }
            Ok(false) => continue,
            Ok(true) => {}
        }
        let mut decisions: Option<Vec<Decision>> = None;
        let mine = bindings.iter().filter(|b| {
            b.spec.as_ref().and_then(|s| s.policy_name.as_deref()) == Some(&policy_name)
        });
        for binding in mine {
            let binding_name = binding.metadata.name.clone().unwrap_or_default();
            let binding_spec = binding.spec.clone().unwrap_or_default();
            if let Some(resources) = binding_spec.match_resources.as_ref() {
                match constraints::matches(resources, request) {
                    Err(error) => {
                        let binding = Some(binding_name);
                        config_error(&mut denied, fail_closed, &policy_name, binding, error);
                        continue;
                    }
                    Ok(false) => continue,
                    Ok(true) => {}
                }
            }
            // Without params every binding sees the same evaluation.
            let decisions = decisions.get_or_insert_with(|| evaluate(&spec, request));
            let actions = binding_spec.validation_actions.unwrap_or_default();
            for (index, decision) in decisions.iter().enumerate() {
                let Decision::Deny { message, reason } = decision else {
                    continue;
                };
                for action in &actions {
                    match action.as_str() {
                        "Deny" if denied.is_none() => {
                            denied = Some(Denied {
                                policy: policy_name.clone(),
                                binding: Some(binding_name.clone()),
                                message: message.clone(),
                                reason: reason.clone(),
                            });
                        }
                        "Warn" => {
                            let warning = format!(
                                "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {message}"
                            );
                            if !outcome.warnings.contains(&warning) {
                                outcome.warnings.push(warning);
                            }
                        }
                        "Audit" => {
                            let value = json!([{
                                "message": message,
                                "policy": policy_name,
                                "binding": binding_name,
                                "expressionIndex": index,
                                "validationActions": actions,
                            }]);
                            annotate(&mut outcome, request, value.to_string());
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    outcome.denial = denied.map(|d| denial(request, d));
    outcome
}

/// A policy or binding that cannot be matched fails the request under `failurePolicy: Fail`
/// (`addConfigError`).
fn config_error(
    denied: &mut Option<Denied>,
    fail_closed: bool,
    policy: &str,
    binding: Option<String>,
    error: String,
) {
    if fail_closed && denied.is_none() {
        let scope = if binding.is_some() {
            "binding"
        } else {
            "policy"
        };
        *denied = Some(Denied {
            policy: policy.to_owned(),
            binding,
            message: format!("failed to configure {scope}: {error}"),
            reason: None,
        });
    }
}

/// Records the validation-failure annotation once per request: the real server refuses to
/// overwrite an audit annotation with another value (`AddAnnotation`), so the first stays.
fn annotate(outcome: &mut Outcome, request: &AdmissionAttributes, value: String) {
    if outcome
        .annotations
        .iter()
        .any(|a| a.key == VALIDATION_FAILURE_KEY)
    {
        return;
    }
    outcome.annotations.push(AuditAnnotation {
        operation: request.operation,
        resource: request.resource.clone(),
        namespace: request.namespace.clone(),
        name: request.name.clone(),
        key: VALIDATION_FAILURE_KEY.to_owned(),
        value,
    });
}

/// The refusal as the dispatcher builds it: `admission.NewForbidden` (`<resource> "<name>" is
/// forbidden: ...`) with the failure's reason (default `Invalid`), its code, and one cause
/// repeating the policy's message.
fn denial(request: &AdmissionAttributes, denied: Denied) -> Error {
    let Denied {
        policy,
        binding,
        message,
        reason,
    } = denied;
    let message = match &binding {
        Some(binding) => format!(
            "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
        ),
        None => format!("ValidatingAdmissionPolicy '{policy}' denied request: {message}"),
    };
    let resource = &request.resource;
    let qualified = if resource.group.is_empty() {
        resource.resource.clone()
    } else {
        format!("{}.{}", resource.resource, resource.group)
    };
    let name = forbidden_name(request);
    let reason = reason
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "Invalid".to_owned());
    let code = match reason.as_str() {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    };
    let status = Status {
        code: Some(code),
        message: Some(format!("{qualified} {name:?} is forbidden: {message}")),
        reason: Some(reason),
        status: Some("Failure".to_owned()),
        details: Some(StatusDetails {
            name: Some(name),
            group: Some(resource.group.clone()),
            kind: Some(resource.resource.clone()),
            causes: Some(vec![StatusCause {
                message: Some(message),
                ..StatusCause::default()
            }]),
            ..StatusDetails::default()
        }),
        ..Status::default()
    };
    Error::PolicyDenied {
        policy,
        binding,
        status: Box::new(status),
    }
}

/// The name `admission.NewForbidden` shows: the request's, else the object's, else its
/// `generateName`, else `Unknown`.
fn forbidden_name(request: &AdmissionAttributes) -> String {
    if !request.name.is_empty() {
        return request.name.clone();
    }
    let meta = |field: &str| {
        request
            .object
            .as_ref()
            .and_then(|o| o.pointer(&format!("/metadata/{field}")))
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    meta("name")
        .or_else(|| meta("generateName"))
        .unwrap_or_else(|| "Unknown".to_owned())
}
