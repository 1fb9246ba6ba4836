//! `kubectl create namespace|configmap|secret`, which kubectl 1.32/1.33 send as protobuf.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube_sandbox::Sandbox;

use crate::support::fixtures::client;
use crate::support::kubectl::served_kubectl;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_namespaces_config_maps_and_secrets_sent_as_protobuf() {
    // The kubectl on PATH runs the release matching the server's minor version.
    for minor in [32, 33] {
        create_with_kubectl_of(minor).await;
    }
}

async fn create_with_kubectl_of(minor: u32) {
    let sandbox = Sandbox::builder().server_minor_version(minor).build();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let out = k.ok(&["create", "namespace", "team"]).await;
    assert_eq!(out.trim(), "namespace/team created");
    let out = k
        .ok(&[
            "create",
            "configmap",
            "settings",
            "-n",
            "team",
            "--from-literal=a=b",
            "--from-literal=mode=fast",
        ])
        .await;
    assert_eq!(out.trim(), "configmap/settings created");
    let out = k
        .ok(&[
            "create",
            "secret",
            "generic",
            "token",
            "-n",
            "team",
            "--from-literal=a=b",
        ])
        .await;
    assert_eq!(out.trim(), "secret/token created");

    let client = client(&sandbox);
    let namespace = Api::<Namespace>::all(client.clone())
        .get("team")
        .await
        .unwrap();
    assert_eq!(namespace.status.unwrap().phase.as_deref(), Some("Active"));
    let map = Api::<ConfigMap>::namespaced(client.clone(), "team")
        .get("settings")
        .await
        .unwrap();
    let data = map.data.unwrap();
    assert_eq!(data["a"], "b");
    assert_eq!(data["mode"], "fast");
    let secret = Api::<Secret>::namespaced(client.clone(), "team")
        .get("token")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    assert_eq!(secret.data.unwrap()["a"].0, b"b");

    // A kind the sandbox does not decode is still refused, with the reason.
    let out = k
        .run(&["create", "deployment", "web", "--image=nginx", "-n", "team"])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("does not decode"), "{stderr}");
}
