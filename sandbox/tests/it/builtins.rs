//! Built-in kinds as kubectl 1.33 meets them on a real kube-apiserver 1.33: the CRD table, a
//! `kind: List` file, webhook configurations refused and defaulted, and the defaults of
//! admission objects owned by the manager that wrote them.

use crate::support::kubectl::{apply_widget_crd, served_kubectl, stderr};

use kube_sandbox::Sandbox;
use kube_sandbox::testing::{Kubectl, path_str};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_crd_prints_name_and_created_at_as_rfc3339() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    apply_widget_crd(&k, &[]).await;
    let created = k
        .ok(&[
            "get",
            "crd",
            "widgets.sandbox.test",
            "-o",
            "jsonpath={.metadata.creationTimestamp}",
        ])
        .await;
    for args in [&["get", "crd"][..], &["get", "crd", "widgets.sandbox.test"]] {
        let out = k.ok(args).await;
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [
                vec!["NAME", "CREATED", "AT"],
                vec!["widgets.sandbox.test", created.as_str()]
            ],
            "{out}"
        );
    }
}

/// A policy and its binding whose rules name their scope, as `kubectl apply` files do when
/// they mean to be applied both ways.
const POLICY_AND_BINDING: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: replicas
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments], scope: "*"}
  validations:
  - expression: "object.spec.replicas <= 5"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: replicas
spec:
  policyName: replicas
  validationActions: [Deny]
  matchResources:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments], scope: "*"}
"#;

/// The managedFields of `resource/name`, as (manager, operation, fieldsV1).
async fn managed_fields(k: &Kubectl, resource: &str) -> Vec<(String, String, Value)> {
    let out = k
        .ok(&["get", resource, "-o", "json", "--show-managed-fields"])
        .await;
    let object: Value = serde_json::from_str(&out).unwrap();
    object["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let text = |key: &str| e[key].as_str().unwrap_or_default().to_owned();
            (text("manager"), text("operation"), e["fieldsV1"].clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defaults_of_a_policy_and_binding_belong_to_the_client_side_apply_that_created_them() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let file = k.file("policy.yaml", POLICY_AND_BINDING);
    k.ok(&["apply", "-f", path_str(&file)]).await;

    // Defaulted on decode, before the field manager: the creator owns the defaults.
    let binding = managed_fields(&k, "validatingadmissionpolicybinding/replicas").await;
    let [(manager, operation, fields)] = &binding[..] else {
        panic!("{binding:?}");
    };
    assert_eq!(
        (manager.as_str(), operation.as_str()),
        ("kubectl-client-side-apply", "Update")
    );
    let resources = &fields["f:spec"]["f:matchResources"];
    for default in ["f:matchPolicy", "f:namespaceSelector", "f:objectSelector"] {
        assert_eq!(resources[default], json!({}), "{default} in {fields}");
    }
    let policy = managed_fields(&k, "validatingadmissionpolicy/replicas").await;
    let spec = &policy[0].2["f:spec"];
    assert_eq!(spec["f:failurePolicy"], json!({}), "{spec}");
    assert_eq!(
        spec["f:matchConstraints"]["f:matchPolicy"],
        json!({}),
        "{spec}"
    );

    // The same file server-side: the applier shares what it applies (the scope it names
    // included), kubectl migrates the client-side entry, and re-applies, leaving the
    // defaults to no one (they are filled in again on decode).
    let out = k
        .ok(&["apply", "--server-side", "-f", path_str(&file)])
        .await;
    assert!(out.contains("validatingadmissionpolicybinding.admissionregistration.k8s.io/replicas serverside-applied"), "{out}");
    let binding = managed_fields(&k, "validatingadmissionpolicybinding/replicas").await;
    let managers: Vec<(&str, &str)> = binding
        .iter()
        .map(|(m, o, _)| (m.as_str(), o.as_str()))
        .collect();
    assert_eq!(
        managers,
        [("kubectl", "Apply"), ("kubectl-last-applied", "Apply")]
    );
    assert_eq!(
        binding[0].2["f:spec"],
        json!({"f:matchResources": {"f:resourceRules": {}}, "f:policyName": {}, "f:validationActions": {}})
    );
    let spec = k
        .ok(&[
            "get",
            "validatingadmissionpolicybinding/replicas",
            "-o",
            "jsonpath={.spec.matchResources.matchPolicy}",
        ])
        .await;
    assert_eq!(spec, "Equivalent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_side_apply_of_rules_without_their_defaulted_scope_conflicts_with_client_side_apply()
 {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    // `resourceRules` is an atomic list: the stored one carries the defaulted `scope`, the
    // applied one does not, so the apply changes a field `kubectl-client-side-apply` owns; the
    // last-applied annotation does not excuse it, as it differs from the live value too
    // (`lastappliedmanager.go`).
    let file = k.file(
        "binding.yaml",
        &POLICY_AND_BINDING.replace(", scope: \"*\"", ""),
    );
    k.ok(&["apply", "-f", path_str(&file)]).await;
    let out = k
        .run(&["apply", "--server-side", "-f", path_str(&file)])
        .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using admissionregistration.k8s.io/v1: .spec.matchResources.resourceRules"),
        "{}",
        stderr(&out)
    );
}

/// A mutating webhook configuration that breaks most of what 1.33 checks.
const BROKEN_WEBHOOKS: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: broken
webhooks:
- name: short.example
  clientConfig:
    url: http://example.com/mutate?x=1
    service: {namespace: ns, name: svc}
  rules:
  - {operations: [CREATE, "*"], apiGroups: [""], apiVersions: [v1], resources: [pods], scope: Everywhere}
  timeoutSeconds: 31
  failurePolicy: Sometimes
  reinvocationPolicy: Always
- name: short.example
  clientConfig:
    url: http://example.com/mutate?x=1
  sideEffects: Some
  admissionReviewVersions: [v2]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_configurations_are_refused_with_the_api_servers_field_errors() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let file = k.file("broken.yaml", BROKEN_WEBHOOKS);
    let out = k.run(&["apply", "-f", path_str(&file)]).await;
    assert!(!out.status.success());
    let expected = [
        "The MutatingWebhookConfiguration \"broken\" is invalid: ",
        "* webhooks[0].name: Invalid value: \"short.example\": should be a domain with at least three segments separated by dots",
        "* webhooks[0].rules[0].operations: Invalid value: []admissionregistration.OperationType{\"CREATE\", \"*\"}: if '*' is present, must not specify other operations",
        "* webhooks[0].rules[0].scope: Unsupported value: \"Everywhere\": supported values: \"*\", \"Cluster\", \"Namespaced\"",
        "* webhooks[0].failurePolicy: Unsupported value: \"Sometimes\": supported values: \"Fail\", \"Ignore\"",
        "* webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun",
        "* webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
        "* webhooks[0].reinvocationPolicy: Unsupported value: \"Always\": supported values: \"IfNeeded\", \"Never\"",
        "* webhooks[0].clientConfig: Required value: exactly one of url or service is required",
        "* webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1",
        "* webhooks[1].name: Invalid value: \"short.example\": should be a domain with at least three segments separated by dots",
        "* webhooks[1].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\"",
        "* webhooks[1].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme; desired format: https://host[/path]",
        "* webhooks[1].clientConfig.url: Invalid value: \"x=1\": query parameters are not permitted in the URL",
        "* webhooks[1].admissionReviewVersions: Invalid value: []string{\"v2\"}: must include at least one of v1, v1beta1",
        "* webhooks[1].name: Duplicate value: \"short.example\"",
    ];
    assert_eq!(stderr(&out).trim_end(), expected.join("\n"));
    let out = k
        .run(&["get", "mutatingwebhookconfiguration", "broken"])
        .await;
    assert!(!out.status.success(), "nothing was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_configuration_is_stored_with_the_v1_defaults() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let file = k.file(
        "hooks.yaml",
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: hooks
webhooks:
- name: check.hooks.example.com
  clientConfig:
    service: {namespace: ns, name: svc, path: /validate}
  rules:
  - {operations: [CREATE], apiGroups: [apps], apiVersions: [v1], resources: [deployments]}
  sideEffects: None
  admissionReviewVersions: [v1]
"#,
    );
    k.ok(&["apply", "-f", path_str(&file)]).await;
    let out = k
        .ok(&[
            "get",
            "validatingwebhookconfiguration",
            "hooks",
            "-o",
            "json",
        ])
        .await;
    let stored: Value = serde_json::from_str(&out).unwrap();
    let webhook = &stored["webhooks"][0];
    assert_eq!(webhook["failurePolicy"], "Fail");
    assert_eq!(webhook["matchPolicy"], "Equivalent");
    assert_eq!(webhook["namespaceSelector"], json!({}));
    assert_eq!(webhook["objectSelector"], json!({}));
    assert_eq!(webhook["timeoutSeconds"], 10);
    assert_eq!(webhook["rules"][0]["scope"], "*");
    assert_eq!(webhook["clientConfig"]["service"]["port"], 443);
    assert_eq!(webhook.get("reinvocationPolicy"), None);

    // An update that keeps what the stored object already breaks is let through only for
    // that: here the new webhook's missing side effects are still refused.
    let mut broken = stored.clone();
    broken["webhooks"][0]
        .as_object_mut()
        .unwrap()
        .remove("sideEffects");
    let file = k.file("broken.json", &broken.to_string());
    let out = k.run(&["replace", "-f", path_str(&file)]).await;
    assert!(
        stderr(&out).contains(
            "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun"
        ),
        "{}",
        stderr(&out)
    );
}

/// A `kind: List` file: a custom resource and a ConfigMap.
const LIST: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: sandbox.test/v1
  kind: Widget
  metadata: {name: w1}
  spec: {replicas: 2, message: hello}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: settings}
  data: {level: info}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_a_list_validating_its_items_with_openapi_v2() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    apply_widget_crd(&k, &[]).await;
    // kubectl validates a List's items client-side, against the OpenAPI v2 document it asks
    // for as protobuf (`kubectl/pkg/util/openapi/validation`), whatever its version.
    let file = k.file("list.yaml", LIST);
    let out = k.ok(&["apply", "-f", path_str(&file)]).await;
    assert_eq!(
        out.trim(),
        "widget.sandbox.test/w1 created\nconfigmap/settings created"
    );
    let out = k.ok(&["apply", "-f", path_str(&file)]).await;
    assert_eq!(
        out.trim(),
        "widget.sandbox.test/w1 unchanged\nconfigmap/settings unchanged"
    );
    let bad = LIST
        .replace("message: hello}", "message: hello, flavour: red}")
        .replace("data: {level: info}", "data: {level: info}\n  datta: {}");
    let file = k.file("bad.yaml", &bad);
    let out = k.run(&["apply", "-f", path_str(&file)]).await;
    assert!(!out.status.success());
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "error: error validating \"{}\": error validating data: [ValidationError(Widget.spec): unknown field \"flavour\" in test.sandbox.v1.Widget.spec, ValidationError(ConfigMap): unknown field \"datta\" in io.k8s.api.core.v1.ConfigMap]; if you choose to ignore these errors, turn validation off with --validate=false",
            path_str(&file)
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_over_a_webhook_configuration_merges_its_webhooks_by_name() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let hooks = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: hooks
webhooks:
- name: check.hooks.example.com
  clientConfig:
    service: {namespace: ns, name: svc, path: /validate}
  rules:
  - {operations: [CREATE], apiGroups: [apps], apiVersions: [v1], resources: [deployments]}
  sideEffects: None
  admissionReviewVersions: [v1]
  timeoutSeconds: 5
"#;
    // Created without the last-applied annotation (as `dev` writes its own), then applied:
    // kubectl's strategic merge patch names only what changed in each webhook, which the
    // server merges by `name` (`patchMergeKey` of `webhooks` in `k8s.io/api`).
    let file = k.file("hooks.yaml", hooks);
    k.ok(&["create", "-f", path_str(&file)]).await;
    let file = k.file(
        "hooks.yaml",
        &hooks.replace("timeoutSeconds: 5", "timeoutSeconds: 7"),
    );
    let out = k.ok(&["apply", "-f", path_str(&file)]).await;
    assert!(out.contains("configured"), "{out}");
    let out = k
        .ok(&[
            "get",
            "validatingwebhookconfiguration",
            "hooks",
            "-o",
            "json",
        ])
        .await;
    let stored: Value = serde_json::from_str(&out).unwrap();
    let webhook = &stored["webhooks"][0];
    assert_eq!(webhook["timeoutSeconds"], 7);
    assert_eq!(webhook["sideEffects"], "None");
    assert_eq!(webhook["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(webhook["clientConfig"]["service"]["path"], "/validate");
}
