//! Which webhooks a request goes to: rules, namespace and object selectors, match conditions.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{MatchCondition, RuleWithOperations};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::attributes::{AdmissionAttributes, GroupVersionResource, object_labels};
use super::errors::Error;
use super::hook::Hook;

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
pub(super) enum Conditions {
    /// All true (or none): call the webhook.
    Call,
    /// One is false: skip the webhook.
    Skip,
}

/// Evaluates `matchConditions` as the API server does: any false skips the webhook (even when
/// another failed to evaluate); otherwise any error is returned; otherwise call.
pub(super) fn evaluate_match_conditions(
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
pub(super) fn json_to_cel(value: &Value) -> kube::core::cel::cel::Value {
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

impl Hook<'_> {
    /// Rules and selectors (not matchConditions, which need the review).
    pub(super) fn matches(
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::admission::attributes::{GroupVersionKind, Operation};
    use crate::admission::review::review_request;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use serde_json::json;

    pub(in crate::admission) fn deployment_create() -> AdmissionAttributes {
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
}
