//! `kubectl explain` on built-in kinds, from the OpenAPI v3 documents the sandbox serves.

use crate::support::kubectl::served_kubectl;

use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_built_in_fields_and_still_applies_keyed_lists() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let out = k.ok(&["explain", "deployment.spec.replicas"]).await;
    assert!(out.contains("GROUP:      apps"), "{out}");
    assert!(out.contains("FIELD: replicas <integer>"), "{out}");
    assert!(out.contains("Number of desired pods"), "{out}");
    let out = k.ok(&["explain", "pods.spec.containers.ports"]).await;
    assert!(out.contains("containerPort\t<integer> -required-"), "{out}");

    // kubectl's client-side apply computes its strategic merge patch from these schemas: a
    // container dropped from the manifest goes, one kept keeps the fields others set.
    let two = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - {name: app, image: \"nginx:1\"}\n      - {name: extra, image: \"busybox:1\"}\n";
    let file = k.file("web.yaml", two);
    let out = k.run(&["apply", "-f", path_str(&file)]).await;
    assert!(out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("openapi"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    k.ok(&["set", "env", "deployment/web", "-c", "app", "MODE=fast"])
        .await;
    let file = k.file(
        "web.yaml",
        &two.replace("      - {name: extra, image: \"busybox:1\"}\n", ""),
    );
    let out = k.run(&["apply", "-f", path_str(&file)]).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && !stderr.contains("openapi"),
        "{stderr}"
    );
    let names = k
        .ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[*].name}",
        ])
        .await;
    assert_eq!(names, "app");
    let env = k
        .ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env[0].value}",
        ])
        .await;
    assert_eq!(env, "fast");
}
