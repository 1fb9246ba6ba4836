//! Server-side apply orders an associative list as structured-merge-diff does
//! (`typed/merge.go`, `visitListItems`): the applied configuration's order, with the items only
//! the live object has (another manager's) kept beside the item they followed.

use crate::support::fixtures::client;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube_sandbox::Sandbox;
use serde_json::{Value, json};

/// A Deployment configuration whose one container has the variables `env`, in that order.
fn config(env: &[&str]) -> Value {
    let env: Vec<Value> = env
        .iter()
        .map(|n| json!({"name": n, "value": n.to_lowercase()}))
        .collect();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "app", "image": "nginx", "env": env}]}}}
    })
}

/// Only the variables `env`: what a second manager applies to own them.
fn env_only(env: &[&str]) -> Value {
    let env: Vec<Value> = env
        .iter()
        .map(|n| json!({"name": n, "value": n.to_lowercase()}))
        .collect();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"template": {"spec": {"containers": [{"name": "app", "env": env}]}}}
    })
}

fn env_names(deployment: &Deployment) -> Vec<String> {
    deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect()
}

#[tokio::test]
async fn applied_list_maps_follow_the_configuration_with_other_managers_items_interleaved() {
    let sandbox = Sandbox::new();
    sandbox.rollouts().set_enabled(false);
    let deployments: Api<Deployment> = Api::namespaced(client(&sandbox), "default");
    // (manager, what it applies, the env that results)
    let steps: [(&str, Value, &[&str]); 6] = [
        ("a", config(&["A", "B", "C"]), &["A", "B", "C"]),
        // Another manager's item goes after the live ones it does not name.
        ("b", env_only(&["X"]), &["A", "B", "C", "X"]),
        // Reordered: the configuration's order; X stays after C, which it followed.
        ("a", config(&["C", "B", "A"]), &["C", "X", "B", "A"]),
        // Inserted in the middle.
        (
            "a",
            config(&["C", "N", "B", "A"]),
            &["C", "X", "N", "B", "A"],
        ),
        // A removed item goes; the other manager's stays where it was.
        ("a", config(&["C", "B", "A"]), &["C", "X", "B", "A"]),
        // The other manager's configuration orders only the items it names.
        ("b", env_only(&["Y", "X"]), &["C", "Y", "X", "B", "A"]),
    ];
    for (i, (manager, applied, want)) in steps.into_iter().enumerate() {
        let params = PatchParams::apply(manager);
        let got = deployments
            .patch("web", &params, &Patch::Apply(&applied))
            .await
            .unwrap_or_else(|e| panic!("step {i}: {e}"));
        assert_eq!(
            env_names(&got),
            want,
            "step {i}: {manager} applied {applied}"
        );
    }
}
