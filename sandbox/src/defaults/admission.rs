//! `admissionregistration.k8s.io/v1` defaults (`pkg/apis/admissionregistration/v1/defaults.go`),
//! filled in when the object is decoded, before field management, so the manager that wrote
//! the object owns them, as on a real server.

use serde_json::{Map, Value, json};

use super::objects::array_objects;

fn set(map: &mut Map<String, Value>, key: &str, value: Value) {
    if map.get(key).is_none_or(Value::is_null) {
        map.insert(key.to_owned(), value);
    }
}

/// `SetDefaults_Rule`: a rule without a scope covers every scope.
fn default_rules(map: &mut Map<String, Value>, key: &str) {
    for rule in array_objects(map, key) {
        set(rule, "scope", json!("*"));
    }
}

/// `SetDefaults_ValidatingAdmissionPolicySpec` and `SetDefaults_MatchResources`.
pub(super) fn default_policy(object: &mut Value) {
    let Some(spec) = object.as_object_mut().and_then(|o| {
        set(o, "spec", json!({}));
        o.get_mut("spec").and_then(Value::as_object_mut)
    }) else {
        return;
    };
    set(spec, "failurePolicy", json!("Fail"));
    if let Some(constraints) = spec
        .get_mut("matchConstraints")
        .and_then(Value::as_object_mut)
    {
        default_match_resources(constraints);
    }
}

/// `SetDefaults_MatchResources` of a binding's `matchResources`.
pub(super) fn default_binding(object: &mut Value) {
    if let Some(resources) = object
        .pointer_mut("/spec/matchResources")
        .and_then(Value::as_object_mut)
    {
        default_match_resources(resources);
    }
}

fn default_match_resources(resources: &mut Map<String, Value>) {
    set(resources, "matchPolicy", json!("Equivalent"));
    set(resources, "namespaceSelector", json!({}));
    set(resources, "objectSelector", json!({}));
    default_rules(resources, "resourceRules");
    default_rules(resources, "excludeResourceRules");
}

/// `SetDefaults_MutatingWebhook` / `SetDefaults_ValidatingWebhook` for each of `webhooks`,
/// with their rules' scope and their Service's port (`SetDefaults_ServiceReference`).
pub(super) fn default_webhook_configuration(object: &mut Value, mutating: bool) {
    let Some(config) = object.as_object_mut() else {
        return;
    };
    for webhook in array_objects(config, "webhooks") {
        set(webhook, "failurePolicy", json!("Fail"));
        set(webhook, "matchPolicy", json!("Equivalent"));
        set(webhook, "namespaceSelector", json!({}));
        set(webhook, "objectSelector", json!({}));
        set(webhook, "timeoutSeconds", json!(10));
        if mutating {
            set(webhook, "reinvocationPolicy", json!("Never"));
        }
        default_rules(webhook, "rules");
        if let Some(service) = webhook
            .get_mut("clientConfig")
            .and_then(|c| c.get_mut("service"))
            .and_then(Value::as_object_mut)
        {
            set(service, "port", json!(443));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_gets_the_v1_defaults_and_keeps_what_it_set() {
        let mut config = json!({"webhooks": [{
            "name": "a.example.com", "timeoutSeconds": 3,
            "clientConfig": {"service": {"namespace": "ns", "name": "svc"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
        }]});
        default_webhook_configuration(&mut config, true);
        let webhook = &config["webhooks"][0];
        assert_eq!(webhook["failurePolicy"], "Fail");
        assert_eq!(webhook["matchPolicy"], "Equivalent");
        assert_eq!(webhook["namespaceSelector"], json!({}));
        assert_eq!(webhook["objectSelector"], json!({}));
        assert_eq!(webhook["timeoutSeconds"], 3);
        assert_eq!(webhook["reinvocationPolicy"], "Never");
        assert_eq!(webhook["rules"][0]["scope"], "*");
        assert_eq!(webhook["clientConfig"]["service"]["port"], 443);
        let mut validating = json!({"webhooks": [{"name": "v.example.com"}]});
        default_webhook_configuration(&mut validating, false);
        assert_eq!(validating["webhooks"][0].get("reinvocationPolicy"), None);
        assert_eq!(validating["webhooks"][0]["timeoutSeconds"], 10);
    }
}
