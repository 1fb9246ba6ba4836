//! The API server's checks of ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding
//! objects, and of webhook configurations (`validation/webhooks.rs`), when they are written,
//! with its messages (`pkg/apis/admissionregistration/validation/validation.go`,
//! `ValidateValidatingAdmissionPolicy`, `ValidateValidatingAdmissionPolicyBinding`), plus the
//! sandbox's own refusal of params, which it does not model.

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, RuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, Validation,
};
use serde_json::Value;

use crate::schema::FieldError;

mod fields;
mod rules;
mod webhooks;
use fields::{Path, duplicate, forbidden, go_strings, invalid, not_supported, quote, required};
use rules::{compile, label_selector};

const GROUP: &str = "admissionregistration.k8s.io";

/// What the sandbox answers for params, which it does not model.
pub const PARAMS_NOT_MODELLED: &str =
    "params are not modelled by the sandbox yet: remove paramKind and paramRef";

/// Validates a written policy, binding or webhook configuration (`old` on an update), defaulted
/// when it was decoded (`crate::defaults`); `None` for any other resource.
pub(crate) fn prepare(
    group: &str,
    plural: &str,
    object: &Value,
    old: Option<&Value>,
) -> Option<Vec<FieldError>> {
    if group != GROUP {
        return None;
    }
    match plural {
        "validatingadmissionpolicies" => Some(match serde_json::from_value(object.clone()) {
            Ok(policy) => validate_policy(&policy),
            Err(e) => vec![undecodable(e)],
        }),
        "validatingadmissionpolicybindings" => Some(match serde_json::from_value(object.clone()) {
            Ok(binding) => validate_binding(&binding),
            Err(e) => vec![undecodable(e)],
        }),
        "mutatingwebhookconfigurations" => Some(webhooks::validate(object, old, true)),
        "validatingwebhookconfigurations" => Some(webhooks::validate(object, old, false)),
        _ => None,
    }
}

fn undecodable(error: serde_json::Error) -> FieldError {
    FieldError::new("", "FieldValueInvalid", format!("Invalid value: {error}"))
}

/// `validateValidatingAdmissionPolicySpec` (object metadata is checked by the write path).
pub(crate) fn validate_policy(policy: &ValidatingAdmissionPolicy) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = policy.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    match spec.failure_policy.as_deref() {
        None => errors.push(required(&path.child("failurePolicy"), "")),
        Some(p) if !["Fail", "Ignore"].contains(&p) => errors.push(not_supported(
            &path.child("failurePolicy"),
            p,
            &["Fail", "Ignore"],
        )),
        Some(_) => {}
    }
    match spec.match_constraints.as_ref() {
        None => errors.push(required(&path.child("matchConstraints"), "")),
        Some(constraints) => {
            let at = path.child("matchConstraints");
            errors.extend(match_resources(constraints, &at));
            if constraints
                .resource_rules
                .as_ref()
                .is_none_or(Vec::is_empty)
            {
                errors.push(required(&at.child("resourceRules"), ""));
            }
        }
    }
    errors.extend(rules::match_conditions(
        spec.match_conditions.as_deref().unwrap_or_default(),
        &path.child("matchConditions"),
    ));
    for (i, variable) in spec.variables.iter().flatten().enumerate() {
        let at = path.child("variables").index(i);
        if variable.name.trim().is_empty() {
            errors.push(required(&at.child("name"), "name is not specified"));
        } else if !is_cel_identifier(&variable.name) {
            errors.push(invalid(
                &at.child("name"),
                &quote(&variable.name),
                "name is not a valid CEL identifier",
            ));
        }
        if variable.expression.trim().is_empty() {
            errors.push(required(
                &at.child("expression"),
                "expression is not specified",
            ));
        } else {
            errors.extend(compile(&variable.expression, &at.child("expression")));
        }
    }
    let validations = spec.validations.as_deref().unwrap_or_default();
    if validations.is_empty() && spec.audit_annotations.as_ref().is_none_or(Vec::is_empty) {
        let detail = "validations or auditAnnotations must contain at least one item";
        errors.push(required(&path.child("validations"), detail));
        errors.push(required(&path.child("auditAnnotations"), detail));
    }
    for (i, validation) in validations.iter().enumerate() {
        errors.extend(validate_validation(
            validation,
            &path.child("validations").index(i),
        ));
    }
    if spec.param_kind.is_some() {
        errors.push(forbidden(&path.child("paramKind"), PARAMS_NOT_MODELLED));
    }
    errors
}

/// `validateValidation`.
fn validate_validation(validation: &Validation, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if validation.expression.trim().is_empty() {
        errors.push(required(
            &path.child("expression"),
            "expression is not specified",
        ));
    } else {
        errors.extend(compile(&validation.expression, &path.child("expression")));
    }
    if let Some(expression) = validation.message_expression.as_deref() {
        if !expression.is_empty() && expression.trim().is_empty() {
            errors.push(invalid(
                &path.child("messageExpression"),
                &quote(expression),
                "must be non-empty if specified",
            ));
        } else if !expression.is_empty() {
            errors.extend(compile(expression, &path.child("messageExpression")));
        }
    }
    if let Some(message) = validation.message.as_deref() {
        if !message.is_empty() && message.trim().is_empty() {
            errors.push(invalid(
                &path.child("message"),
                &quote(message),
                "message must be non-empty if specified",
            ));
        } else if message.trim().contains(['\n', '\r']) {
            errors.push(invalid(
                &path.child("message"),
                &quote(message),
                "message must not contain line breaks",
            ));
        }
    }
    if let Some(reason) = validation.reason.as_deref() {
        let supported = ["Forbidden", "Invalid", "RequestEntityTooLarge"];
        if !supported.contains(&reason) {
            errors.push(not_supported(&path.child("reason"), reason, &supported));
        }
    }
    errors
}

/// `validateMatchResources`.
fn match_resources(resources: &MatchResources, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match resources.match_policy.as_deref() {
        None => errors.push(required(&path.child("matchPolicy"), "")),
        Some(p) if !["Equivalent", "Exact"].contains(&p) => {
            errors.push(not_supported(
                &path.child("matchPolicy"),
                p,
                &["Equivalent", "Exact"],
            ));
        }
        Some(_) => {}
    }
    for (name, selector) in [
        ("namespaceSelector", &resources.namespace_selector),
        ("objectSelector", &resources.object_selector),
    ] {
        match selector {
            None => errors.push(required(&path.child(name), "")),
            Some(selector) => errors.extend(label_selector(selector, &path.child(name))),
        }
    }
    for (name, rules) in [
        ("resourceRules", &resources.resource_rules),
        ("excludeResourceRules", &resources.exclude_resource_rules),
    ] {
        for (i, rule) in rules.iter().flatten().enumerate() {
            errors.extend(named_rule(rule, &path.child(name).index(i)));
        }
    }
    errors
}

/// `validateNamedRuleWithOperations` and `validateRuleWithOperations` (subresources allowed).
fn named_rule(rule: &NamedRuleWithOperations, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (i, name) in rule.resource_names.iter().flatten().enumerate() {
        let at = path.child("resourceNames").index(i);
        for bad in [".", ".."] {
            if name == bad {
                errors.push(invalid(&at, &quote(name), &format!("may not be '{bad}'")));
            }
        }
        for bad in ["/", "%"] {
            if name.contains(bad) {
                errors.push(invalid(
                    &at,
                    &quote(name),
                    &format!("may not contain '{bad}'"),
                ));
            }
        }
        if names.contains(&name.as_str()) {
            errors.push(duplicate(&at, &quote(name)));
        } else {
            names.push(name);
        }
    }
    errors.extend(rules::rule_with_operations(
        &RuleWithOperations {
            api_groups: rule.api_groups.clone(),
            api_versions: rule.api_versions.clone(),
            operations: rule.operations.clone(),
            resources: rule.resources.clone(),
            scope: rule.scope.clone(),
        },
        path,
    ));
    errors
}

/// `validateValidatingAdmissionPolicyBindingSpec`.
pub(crate) fn validate_binding(binding: &ValidatingAdmissionPolicyBinding) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = binding.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    match spec.policy_name.as_deref().filter(|n| !n.is_empty()) {
        None => errors.push(required(&path.child("policyName"), "")),
        Some(name) => {
            if let Some(message) = fields::dns_subdomain(name) {
                errors.push(invalid(&path.child("policyName"), &quote(name), &message));
            }
        }
    }
    if let Some(resources) = spec.match_resources.as_ref() {
        // Upstream spells this path `matchResouces`.
        errors.extend(match_resources(resources, &path.child("matchResouces")));
    }
    let actions = spec.validation_actions.as_deref().unwrap_or_default();
    let at = path.child("validationActions");
    let mut seen: Vec<&str> = Vec::new();
    for (i, action) in actions.iter().enumerate() {
        if !["Audit", "Deny", "Warn"].contains(&action.as_str()) {
            errors.push(not_supported(
                &at.index(i),
                action,
                &["Audit", "Deny", "Warn"],
            ));
        }
        if seen.contains(&action.as_str()) {
            errors.push(duplicate(&at.index(i), &quote(action)));
        }
        seen.push(action);
    }
    if seen.contains(&"Deny") && seen.contains(&"Warn") {
        errors.push(invalid(
            &at,
            &go_strings("admissionregistration.ValidationAction", actions),
            "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
        ));
    }
    if seen.is_empty() {
        errors.push(required(&at, "at least one validation action is required"));
    }
    if spec.param_ref.is_some() {
        errors.push(forbidden(&path.child("paramRef"), PARAMS_NOT_MODELLED));
    }
    errors
}

/// A CEL identifier that is not a reserved word (`isCELIdentifier`).
fn is_cel_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && !crate::schema::CEL_RESERVED.contains(&name)
}
