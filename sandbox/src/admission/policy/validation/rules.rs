//! The checks admission policies and webhook configurations share
//! (`pkg/apis/admissionregistration/validation/validation.go`): rules with operations, label
//! selectors, match conditions and CEL syntax.

use k8s_openapi::api::admissionregistration::v1::{MatchCondition, RuleWithOperations};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::fields::{
    self, Path, duplicate, forbidden, go_strings, invalid, not_supported, qualified_name, quote,
    required,
};
use crate::admission::policy::expressions::parse;
use crate::schema::FieldError;

/// `validateMatchConditions`: at most 64, named by unique qualified names, expressions that
/// compile.
pub(super) fn match_conditions(conditions: &[MatchCondition], path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if conditions.len() > 64 {
        errors.push(FieldError::new(
            path.to_string(),
            "FieldValueTooMany",
            format!("Too many: {}: must have at most 64 items", conditions.len()),
        ));
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, condition) in conditions.iter().enumerate() {
        let at = path.index(i);
        if condition.expression.trim().is_empty() {
            errors.push(required(&at.child("expression"), ""));
        } else {
            errors.extend(compile(
                condition.expression.trim(),
                &at.child("expression"),
            ));
        }
        if condition.name.is_empty() {
            errors.push(required(&at.child("name"), ""));
        } else {
            for message in qualified_name(&condition.name) {
                errors.push(invalid(
                    &at.child("name"),
                    &quote(&condition.name),
                    &message,
                ));
            }
        }
        if !condition.name.is_empty() {
            if names.contains(&condition.name.as_str()) {
                errors.push(duplicate(&at.child("name"), &quote(&condition.name)));
            } else {
                names.push(&condition.name);
            }
        }
    }
    errors
}

/// A syntax error as the compiler reports it; the sandbox does not type-check.
pub(super) fn compile(expression: &str, path: &Path) -> Option<FieldError> {
    let error = parse(expression).err()?;
    Some(invalid(
        path,
        &quote(expression),
        &format!("compilation failed: {error}"),
    ))
}

/// `ValidateLabelSelector`'s operator and values checks.
pub(super) fn label_selector(selector: &LabelSelector, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (i, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let at = path.child("matchExpressions").index(i);
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errors.push(required(
                &at.child("values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errors.push(forbidden(
                &at.child("values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errors.push(invalid(
                &at.child("operator"),
                &quote(other),
                "not a valid selector operator",
            )),
        }
    }
    errors
}

/// `validateRuleWithOperations` (subresources allowed).
pub(super) fn rule_with_operations(rule: &RuleWithOperations, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let operations = rule.operations.as_deref().unwrap_or_default();
    if operations.is_empty() {
        errors.push(required(&path.child("operations"), ""));
    }
    if operations.len() > 1 && operations.iter().any(|o| o == "*") {
        let value = go_strings("admissionregistration.OperationType", operations);
        errors.push(invalid(
            &path.child("operations"),
            &value,
            "if '*' is present, must not specify other operations",
        ));
    }
    let supported = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
    for (i, operation) in operations.iter().enumerate() {
        if !supported.contains(&operation.as_str()) {
            errors.push(not_supported(
                &path.child("operations").index(i),
                operation,
                &supported,
            ));
        }
    }
    let groups = rule.api_groups.as_deref().unwrap_or_default();
    if groups.is_empty() {
        errors.push(required(&path.child("apiGroups"), ""));
    }
    if groups.len() > 1 && groups.iter().any(|g| g == "*") {
        let value = go_strings("string", groups);
        errors.push(invalid(
            &path.child("apiGroups"),
            &value,
            "if '*' is present, must not specify other API groups",
        ));
    }
    let versions = rule.api_versions.as_deref().unwrap_or_default();
    if versions.is_empty() {
        errors.push(required(&path.child("apiVersions"), ""));
    }
    if versions.len() > 1 && versions.iter().any(|v| v == "*") {
        let value = go_strings("string", versions);
        errors.push(invalid(
            &path.child("apiVersions"),
            &value,
            "if '*' is present, must not specify other API versions",
        ));
    }
    for (i, version) in versions.iter().enumerate() {
        if version.is_empty() {
            errors.push(required(&path.child("apiVersions").index(i), ""));
        }
    }
    errors.extend(fields::resources(
        rule.resources.as_deref().unwrap_or_default(),
        &path.child("resources"),
    ));
    if let Some(scope) = rule.scope.as_deref()
        && !["*", "Cluster", "Namespaced"].contains(&scope)
    {
        errors.push(not_supported(
            &path.child("scope"),
            scope,
            &["*", "Cluster", "Namespaced"],
        ));
    }
    errors
}
