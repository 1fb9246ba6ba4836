//! The real kubectl over loopback against a served sandbox, with its own HOME and cache dir.
//!
//! Skipped (with a printed reason) when kubectl is not on PATH, unless
//! `SANDBOX_REQUIRE_KUBECTL=1`, which turns a missing kubectl into a failure.

use crate::support::api::widget_yaml;
use crate::support::kubectl::{apply_widget_crd, served_kubectl, stderr};

use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_and_deletes_custom_resources() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let out = apply_widget_crd(&k, &[]).await;
    assert!(out.contains("widgets.sandbox.test created"), "{out}");

    // Client-side apply: create, then a merge patch.
    let w1 = k.file("w1.yaml", &widget_yaml("w1", 1, "hello"));
    let out = k.ok(&["apply", "-f", path_str(&w1)]).await;
    assert!(out.contains("widget.sandbox.test/w1 created"), "{out}");
    let w1 = k.file("w1.yaml", &widget_yaml("w1", 2, "changed"));
    let out = k.ok(&["apply", "-f", path_str(&w1)]).await;
    assert!(out.contains("widget.sandbox.test/w1 configured"), "{out}");

    // Get by short name and as YAML.
    let out = k.ok(&["get", "wd"]).await;
    assert!(out.contains("w1"), "{out}");
    // The CRD's printer column, through a server-side Table.
    assert!(
        out.lines().next().unwrap_or("").contains("REPLICAS"),
        "{out}"
    );
    assert!(out.contains('2'), "{out}");
    let yaml = k.ok(&["get", "widget", "w1", "-o", "yaml"]).await;
    assert!(yaml.contains("kind: Widget"), "{yaml}");
    assert!(yaml.contains("message: changed"), "{yaml}");
    assert!(yaml.contains("colour: blue"), "schema default: {yaml}");
    assert!(
        yaml.contains("kubectl.kubernetes.io/last-applied-configuration"),
        "{yaml}"
    );

    // scale goes through the scale subresource; the schema still applies.
    let out = k.ok(&["scale", "widget", "w1", "--replicas=4"]).await;
    assert!(out.contains("widget.sandbox.test/w1 scaled"), "{out}");
    let out = k
        .ok(&["get", "wd", "w1", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(out, "4");
    let out = k.run(&["scale", "widget", "w1", "--replicas=11"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("spec.replicas"));
    k.ok(&["scale", "widget", "w1", "--replicas=2"]).await;

    // explain reads the CRD schema from the OpenAPI v3 document.
    let out = k.ok(&["explain", "widgets.spec"]).await;
    assert!(out.contains("replicas"), "{out}");
    assert!(out.contains("How many; never negative."), "{out}");

    // Server-side apply.
    let w2 = k.file("w2.yaml", &widget_yaml("w2", 3, "ssa"));
    let out = k.ok(&["apply", "--server-side", "-f", path_str(&w2)]).await;
    assert!(
        out.contains("widget.sandbox.test/w2 serverside-applied"),
        "{out}"
    );
    let applied = sandbox
        .faults()
        .requests()
        .into_iter()
        .any(|r| r.verb == "patch" && r.field_manager.as_deref() == Some("kubectl"));
    assert!(
        applied,
        "an apply patch with fieldManager=kubectl was recorded"
    );

    // The schema rejects a bad spec with the API server's wording.
    let bad = k.file("bad.yaml", &widget_yaml("bad", -1, "x"));
    let out = k.run(&["apply", "-f", path_str(&bad)]).await;
    let printed = stderr(&out);
    assert!(!out.status.success());
    assert!(printed.contains("spec.replicas"), "{printed}");

    // Unknown fields fail kubectl's default strict validation.
    let unknown = k.file(
        "unknown.yaml",
        "apiVersion: sandbox.test/v1\nkind: Widget\nmetadata:\n  name: u\nspec:\n  replicas: 1\n  message: m\n  bogus: 1\n",
    );
    let out = k.run(&["apply", "-f", path_str(&unknown)]).await;
    let printed = stderr(&out);
    assert!(!out.status.success());
    assert!(
        printed.contains("unknown field \"spec.bogus\""),
        "{printed}"
    );

    // Delete waits for the object to go (through a watch).
    let out = k.ok(&["delete", "wd", "w1", "w2"]).await;
    assert!(out.contains("widget.sandbox.test \"w1\" deleted"), "{out}");
    let out = k.ok(&["get", "widgets", "-o", "name"]).await;
    assert!(out.trim().is_empty(), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_manages_built_in_kinds_by_short_name() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let cm = k.file(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n",
    );
    let out = k.ok(&["apply", "-f", path_str(&cm)]).await;
    assert!(out.contains("configmap/settings created"), "{out}");
    let cm = k.file(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"2\"\n",
    );
    let out = k.ok(&["apply", "-f", path_str(&cm)]).await;
    assert!(out.contains("configmap/settings configured"), "{out}");
    let out = k
        .ok(&["get", "cm", "settings", "-o", "jsonpath={.data.a}"])
        .await;
    assert_eq!(out, "2");
    let ns = k.file(
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n",
    );
    let out = k.ok(&["apply", "-f", path_str(&ns)]).await;
    assert!(out.contains("namespace/team created"), "{out}");
    let out = k.ok(&["get", "ns"]).await;
    assert!(out.contains("team"), "{out}");
    // Chunked lists: kubectl follows `continue` one namespace at a time, as a Table and not.
    for output in [&["-o", "name"][..], &[]] {
        sandbox.faults().clear_requests();
        let out = k
            .ok(&[&["get", "ns", "--chunk-size=1"][..], output].concat())
            .await;
        for ns in ["default", "kube-public", "kube-system", "team"] {
            assert!(out.contains(ns), "{out}");
        }
        let pages = sandbox
            .faults()
            .requests()
            .iter()
            .filter(|r| r.verb == "list" && r.resource.as_deref() == Some("namespaces"))
            .count();
        assert_eq!(pages, 4, "one request per namespace");
    }
    let out = k.ok(&["delete", "cm", "settings"]).await;
    assert!(out.contains("deleted"), "{out}");

    // Client-side apply of a changed Deployment sends a strategic merge patch: the container
    // is merged by name, nothing of the patch's directives is stored.
    let deployment = |image: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  selector:\n    matchLabels: {{app: web}}\n  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n      - name: app\n        image: {image}\n        ports: [{{containerPort: 8080}}]\n      - name: sidecar\n        image: busybox\n"
        )
    };
    let d = k.file("d.yaml", &deployment("nginx:1"));
    k.ok(&["apply", "-f", path_str(&d)]).await;
    let d = k.file("d.yaml", &deployment("nginx:2"));
    let out = k.ok(&["apply", "-f", path_str(&d)]).await;
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let json = k.ok(&["get", "deploy", "web", "-o", "json"]).await;
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let containers = &value["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[0]["image"], "nginx:2", "{json}");
    assert_eq!(containers[0]["ports"][0]["containerPort"], 8080, "{json}");
    assert_eq!(containers[1]["name"], "sidecar", "{json}");
    assert!(!json.contains("$setElementOrder"), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dispatched_kubectl_build_applies_and_reads_custom_resources() {
    // kubectl 1.27 validates with OpenAPI v2, which it only accepts as protobuf (and learns
    // there that the server validates fields itself); 1.32 and 1.33 use v3.
    for minor in [27, 32, 33] {
        let validate = "--validate=strict";
        let sandbox = Sandbox::builder().server_minor_version(minor).build();
        let Some((_served, k)) = served_kubectl(&sandbox).await else {
            return;
        };
        apply_widget_crd(&k, &[validate]).await;
        let w = k.file("w.yaml", &widget_yaml("w", 1, "hi"));
        k.ok(&["apply", validate, "-f", path_str(&w)]).await;
        k.ok(&["apply", validate, "--server-side", "-f", path_str(&w)])
            .await;
        let out = k
            .ok(&["get", "wd", "w", "-o", "jsonpath={.spec.message}"])
            .await;
        assert_eq!(out, "hi", "kubectl for 1.{minor}");
        let out = k.ok(&["delete", "-f", path_str(&w)]).await;
        assert!(out.contains("deleted"), "kubectl for 1.{minor}: {out}");
    }
}
