//! Limits kube-apiserver puts on every object, seen through kubectl with a real-world CRD:
//! prometheus-operator's prometheuses CRD is too big for client-side apply, whose
//! last-applied-configuration annotation holds the whole object again.

use crate::support::kubectl::{served_kubectl, stderr, stdout};
use crate::support::vendored::vendored_crd;

use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;

const PROMETHEUSES: &str = "prometheus-operator/monitoring.coreos.com_prometheuses.yaml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_apply_of_a_crd_over_the_annotation_limit_is_refused() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let crd = k.file("prometheuses.yaml", &vendored_crd(PROMETHEUSES));
    let out = k.run(&["apply", "-f", path_str(&crd)]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    // `ValidateAnnotations` in apimachinery's `pkg/api/validation/objectmeta.go`, as kubectl
    // prints an `Invalid` Status.
    assert_eq!(
        stderr(&out).trim_end(),
        "The CustomResourceDefinition \"prometheuses.monitoring.coreos.com\" is invalid: \
         metadata.annotations: Too long: may not be more than 262144 bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_and_create_of_the_same_crd_succeed() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let crd = k.file("prometheuses.yaml", &vendored_crd(PROMETHEUSES));
    let out = k
        .ok(&["apply", "--server-side", "-f", path_str(&crd)])
        .await;
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/prometheuses.monitoring.coreos.com serverside-applied"
    );
    k.ok(&["delete", "crd", "prometheuses.monitoring.coreos.com"])
        .await;
    let out = k.ok(&["create", "-f", path_str(&crd)]).await;
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/prometheuses.monitoring.coreos.com created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_that_grows_the_annotations_past_the_limit_is_refused() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    // Two annotations that fit alone but not together: the limit is on their sum.
    let configmap = |annotations: &[&str]| {
        let half = "x".repeat(131_072);
        let annotations: Vec<String> = annotations
            .iter()
            .map(|key| format!("    {key}: {half}"))
            .collect();
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\n  annotations:\n{}\n",
            annotations.join("\n")
        )
    };
    let one = k.file("one.yaml", &configmap(&["a"]));
    k.ok(&["create", "-f", path_str(&one)]).await;
    let two = k.file("two.yaml", &configmap(&["a", "b"]));
    let out = k.run(&["replace", "-f", path_str(&two)]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim_end(),
        "The ConfigMap \"big\" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes"
    );
}
