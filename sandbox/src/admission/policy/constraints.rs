//! Whether a policy's `matchConstraints` or a binding's `matchResources` cover a request
//! (`apiserver/pkg/admission/plugin/policy/matching/matching.go`): namespace selector, object
//! selector, excluded rules, then resource rules with their `resourceNames`. Selector errors
//! count only when the rules match.

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, RuleWithOperations,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::admission::attributes::{AdmissionAttributes, object_labels};
use crate::admission::matching::{rule_matches, selector_matches};

/// Whether `resources` cover `request`; an error is a selector that does not parse.
pub(super) fn matches(
    resources: &MatchResources,
    request: &AdmissionAttributes,
) -> Result<bool, String> {
    let namespace = namespace_matches(resources.namespace_selector.as_ref(), request);
    if namespace == Ok(false) {
        return Ok(false);
    }
    let object = object_matches(resources.object_selector.as_ref(), request);
    if object == Ok(false) {
        return Ok(false);
    }
    let excluded = resources
        .exclude_resource_rules
        .as_deref()
        .unwrap_or_default();
    if rules_match(excluded, request) {
        return Ok(false);
    }
    let rules = resources.resource_rules.as_deref().unwrap_or_default();
    if !rules.is_empty() && !rules_match(rules, request) {
        return Ok(false);
    }
    namespace?;
    object?;
    Ok(true)
}

fn rules_match(rules: &[NamedRuleWithOperations], request: &AdmissionAttributes) -> bool {
    rules.iter().any(|named| {
        let rule = RuleWithOperations {
            api_groups: named.api_groups.clone(),
            api_versions: named.api_versions.clone(),
            operations: named.operations.clone(),
            resources: named.resources.clone(),
            scope: named.scope.clone(),
        };
        rule_matches(&rule, request)
            && named
                .resource_names
                .as_deref()
                .is_none_or(|names| names.is_empty() || names.contains(&request.name))
    })
}

/// A cluster-scoped object other than a Namespace is never excluded by namespace
/// (`predicates/namespace/matcher.go`).
fn namespace_matches(
    selector: Option<&LabelSelector>,
    request: &AdmissionAttributes,
) -> Result<bool, String> {
    let namespaced = request.namespace.as_deref().is_some_and(|n| !n.is_empty());
    if !namespaced && !request.is_namespace_resource() {
        return Ok(true);
    }
    selector_matches(selector, &request.labels_for_namespace_selector())
}

/// The object's or the old object's labels (`predicates/object/matcher.go`).
fn object_matches(
    selector: Option<&LabelSelector>,
    request: &AdmissionAttributes,
) -> Result<bool, String> {
    let candidates = [request.object.as_ref(), request.old_object.as_ref()];
    let mut matched = false;
    for candidate in candidates.into_iter().flatten() {
        matched |= selector_matches(selector, &object_labels(candidate))?;
    }
    Ok(matched || candidates.iter().all(Option::is_none))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::matching::tests::deployment_create;
    use serde_json::json;

    fn resources(value: serde_json::Value) -> MatchResources {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn rules_names_exclusions_and_selectors_decide() {
        let mut request = deployment_create();
        request.namespace_labels = [("env".to_owned(), "prod".to_owned())].into();
        let rule = json!({"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]});
        let check = |value| matches(&resources(value), &request);
        assert_eq!(check(json!({"resourceRules": [rule]})), Ok(true));
        let mut named = rule.clone();
        named["resourceNames"] = json!(["other"]);
        assert_eq!(check(json!({"resourceRules": [named]})), Ok(false));
        assert_eq!(
            check(json!({"resourceRules": [rule], "excludeResourceRules": [rule]})),
            Ok(false)
        );
        let ns = |env: &str| json!({"resourceRules": [rule], "namespaceSelector": {"matchLabels": {"env": env}}});
        assert_eq!(check(ns("prod")), Ok(true));
        assert_eq!(check(ns("dev")), Ok(false));
        let object =
            json!({"resourceRules": [rule], "objectSelector": {"matchLabels": {"app": "db"}}});
        assert_eq!(check(object), Ok(false));
        // A broken selector is an error only for a request the rules cover.
        let broken = |rules| json!({"resourceRules": rules, "objectSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}});
        assert!(check(broken(json!([rule]))).is_err());
        let other = json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]);
        assert_eq!(check(broken(other)), Ok(false));
    }
}
