//! Sharding on the sandbox: controllers that each reconcile only their own shard's MyApps, and
//! one letting go of a MyApp the sharder drains, so that another shard takes it over.

use crate::support::converge;
use crate::support::operator;

use converge::{converged, eventually};
use operator::Operator;

use std::time::Duration;

use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use myapp_operator::{
    crd::{MyApp, Phase},
    dev::{Environment, Options},
    shard::{DRAIN_LABEL, SHARD_LABEL},
};
use serde_json::json;

const NS: &str = "default";

fn shard_of(meta: &ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(SHARD_LABEL).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_reconciles_its_own_myapps_and_a_drained_one_moves_without_a_restart() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let env = Environment::start(Options::ephemeral(dir.path().to_owned()))
        .await
        .expect("environment starts");
    let client = env.client().await.unwrap();
    let resync = Duration::from_secs(300);
    let shard_a = Operator::start_shard(client.clone(), "pod-a", resync);
    let shard_b = Operator::start_shard(client.clone(), "pod-b", resync);
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let services = Api::<Service>::namespaced(client.clone(), NS);
    let create = PostParams::default();
    for app in [
        MyApp::test("web").label(SHARD_LABEL, "pod-a"),
        MyApp::test("api").label(SHARD_LABEL, "pod-b"),
        MyApp::test("lone"),
    ] {
        apps.create(&create, &app).await.unwrap();
    }

    converged(&apps, "web", Phase::Running).await;
    converged(&apps, "api", Phase::Running).await;
    for (name, shard) in [("web", "pod-a"), ("api", "pod-b")] {
        let deployment = deployments.get(name).await.unwrap();
        let service = services.get(name).await.unwrap();
        assert_eq!(
            shard_of(&deployment.metadata).as_deref(),
            Some(shard),
            "{name}'s Deployment"
        );
        assert_eq!(
            shard_of(&service.metadata).as_deref(),
            Some(shard),
            "{name}'s Service"
        );
        let template = deployment.spec.unwrap().template.metadata.unwrap();
        assert_eq!(shard_of(&template), None, "{name}'s pods carry no shard");
    }
    // A MyApp on no shard is nobody's: no shard's watch sees it.
    let lone = apps.get("lone").await.unwrap();
    assert!(
        lone.status.is_none(),
        "lone was reconciled: {:?}",
        lone.status
    );
    assert!(deployments.get_opt("lone").await.unwrap().is_none());

    let before = deployments.get("web").await.unwrap();
    let labels = |labels: serde_json::Value| Patch::Merge(json!({"metadata": {"labels": labels}}));
    let patch = PatchParams::default();
    // The sharder drains web: its shard lets go of it.
    apps.patch("web", &patch, &labels(json!({ DRAIN_LABEL: "true" })))
        .await
        .unwrap();
    eventually("pod-a lets go of web", || async {
        let web = apps.get("web").await.ok()?;
        let left = web.labels();
        (!left.contains_key(SHARD_LABEL) && !left.contains_key(DRAIN_LABEL)).then_some(())
    })
    .await;
    // The sharder hands it to pod-b, which applies its children as its own.
    apps.patch("web", &patch, &labels(json!({ SHARD_LABEL: "pod-b" })))
        .await
        .unwrap();
    let after = eventually("web's children follow it to pod-b", || async {
        let deployment = deployments.get("web").await.ok()?;
        let service = services.get("web").await.ok()?;
        (shard_of(&deployment.metadata).as_deref() == Some("pod-b")
            && shard_of(&service.metadata).as_deref() == Some("pod-b"))
        .then_some(deployment)
    })
    .await;
    assert_eq!(
        after.spec.unwrap().template,
        before.spec.unwrap().template,
        "moving a MyApp between shards must not roll its pods"
    );
    converged(&apps, "web", Phase::Running).await;

    shard_a.stop().await;
    shard_b.stop().await;
}
