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
