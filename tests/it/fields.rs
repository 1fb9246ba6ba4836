//! State oracles for every MyApp spec field, on the sandbox with the real webhook in its
//! admission chain: a change reaches exactly the child fields it should and no other; a change
//! the webhook refuses leaves the MyApp and its children as they were; a change reverted
//! converges back to children identical to the ones before it.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use myapp_operator::crd::{MyApp, Phase};
use serde_json::{Value, json};

use crate::support::converge::{converged, eventually};
use crate::support::operator::Operator;

const NS: &str = "default";

/// One spec field: an accepted change and the child paths it must move, and a change the
/// webhook must refuse naming the field.
struct Case {
    field: &'static str,
    change: Value,
    deployment: &'static [&'static str],
    service: &'static [&'static str],
    refused: Value,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            field: "spec.replicas",
            change: json!({"replicas": 3}),
            deployment: &["/spec/replicas"],
            service: &[],
            refused: json!({"replicas": -1}),
        },
        Case {
            field: "spec.image",
            change: json!({"image": "ghcr.io/example/web:2.0.0"}),
            deployment: &["/spec/template/spec/containers/0/image"],
            service: &[],
            refused: json!({"image": "ghcr.io/Example/web:2.0.0"}),
        },
        Case {
            field: "spec.port",
            change: json!({"port": 9090}),
            deployment: &["/spec/template/spec/containers/0/ports/0/containerPort"],
            service: &["/spec/ports/0/port"],
            refused: json!({"port": 0}),
        },
        Case {
            field: "spec.env",
            change: json!({"env": [{"name": "LOG_LEVEL", "value": "debug"}]}),
            deployment: &["/spec/template/spec/containers/0/env/0/value"],
            service: &[],
            refused: json!({"env": [{"name": "1LOG_LEVEL", "value": "debug"}]}),
        },
    ]
}

/// What a change can move on a child: its spec, labels, annotations and owners, less the
/// annotations the Deployment controller keeps (the rollout's revision) and the generation
/// stamp, which moves with every change and never goes back.
fn shape(mut object: Value) -> Value {
    let mut meta = object["metadata"].take();
    if let Some(annotations) = meta["annotations"].as_object_mut() {
        annotations.retain(|key, _| {
            !key.starts_with("deployment.kubernetes.io/")
                && key != "example.com/planned-from-generation"
        });
    }
    json!({
        "spec": object["spec"].take(),
        "metadata": {
            "labels": meta["labels"],
            "annotations": meta["annotations"],
            "ownerReferences": meta["ownerReferences"],
        },
    })
}

/// The JSON pointers of every leaf that differs between `a` and `b` (added and removed ones
/// too).
fn changed(a: &Value, b: &Value, at: &str, out: &mut BTreeSet<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys()).collect::<BTreeSet<_>>() {
                let null = Value::Null;
                let (l, r) = (x.get(key).unwrap_or(&null), y.get(key).unwrap_or(&null));
                let key = key.replace('~', "~0").replace('/', "~1");
                changed(l, r, &format!("{at}/{key}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                let null = Value::Null;
                let (l, r) = (x.get(i).unwrap_or(&null), y.get(i).unwrap_or(&null));
                changed(l, r, &format!("{at}/{i}"), out);
            }
        }
        (l, r) if l != r => {
            out.insert(at.to_owned());
        }
        _ => {}
    }
}

struct Children {
    deployment: Value,
    service: Value,
    versions: [Option<String>; 3],
}

async fn children(client: &kube::Client, name: &str) -> Children {
    let app = Api::<MyApp>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .unwrap();
    let deployment = Api::<Deployment>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .unwrap();
    let service = Api::<Service>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .unwrap();
    Children {
        versions: [
            app.metadata.resource_version,
            deployment.metadata.resource_version.clone(),
            service.metadata.resource_version.clone(),
        ],
        deployment: shape(serde_json::to_value(deployment).unwrap()),
        service: shape(serde_json::to_value(service).unwrap()),
    }
}

/// The annotation that records a digest of what the operator applied: it moves with every
/// child write, and only then.
const DIGEST: &str = "/metadata/annotations/example.com~1applied-digest";

/// What a change must move on a child: `paths`, and the digest when anything moved.
fn expected(paths: &[&str]) -> Vec<String> {
    let digest = (!paths.is_empty()).then_some(DIGEST);
    let mut all: Vec<String> = paths
        .iter()
        .copied()
        .chain(digest)
        .map(String::from)
        .collect();
    all.sort();
    all
}

fn paths(before: &Value, after: &Value) -> Vec<String> {
    let mut out = BTreeSet::new();
    changed(before, after, "", &mut out);
    out.into_iter().collect()
}

async fn patch_spec(apps: &Api<MyApp>, name: &str, spec: &Value) -> kube::Result<MyApp> {
    apps.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
}

/// Edits `marker`'s image and waits until its Deployment runs it: every watch event sent
/// before the edit has reached the controller by then.
async fn barrier(client: &kube::Client, marker: &str, round: usize) {
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let image = format!("ghcr.io/example/marker:{round}.0.0");
    patch_spec(&apps, marker, &json!({ "image": image }))
        .await
        .unwrap();
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    eventually("the marker's Deployment follows", || async {
        let d = deployments.get(marker).await.ok()?;
        let runs = d.spec?.template.spec?.containers.first()?.image.clone()?;
        (runs == image).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_spec_field_moves_exactly_its_child_fields_a_refusal_moves_nothing_and_a_revert_restores_all()
 {
    let (env, _dir) = crate::support::dev_environment().await;
    let client = env.client().await.unwrap();
    let operator = Operator::start(client.clone(), "solo", false, Duration::from_secs(300));
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    for name in ["web", "marker"] {
        let app = MyApp::test(name).env("LOG_LEVEL", "info");
        apps.create(&PostParams::default(), &app).await.unwrap();
        converged(&apps, name, Phase::Running).await;
    }
    let original = serde_json::to_value(&apps.get("web").await.unwrap().spec).unwrap();
    let start = children(&client, "web").await;

    for (round, case) in cases().into_iter().enumerate() {
        let field = case.field;
        let before = children(&client, "web").await;
        // Refused: the API server answers with the field's path; nothing moves.
        let denied = patch_spec(&apps, "web", &case.refused)
            .await
            .expect_err(&format!("{field}: {} was accepted", case.refused));
        let kube::Error::Api(status) = denied else {
            panic!("{field}: not an API refusal: {denied}");
        };
        assert!(
            status.message.contains(field),
            "{field}: the refusal does not name the field: {}",
            status.message
        );
        barrier(&client, "marker", round).await;
        let after_refusal = children(&client, "web").await;
        assert_eq!(
            after_refusal.versions, before.versions,
            "{field}: a refused change moved the MyApp or a child"
        );

        // Accepted: exactly the expected child paths move.
        patch_spec(&apps, "web", &case.change).await.unwrap();
        converged(&apps, "web", Phase::Running).await;
        let moved = children(&client, "web").await;
        assert_eq!(
            paths(&start.deployment, &moved.deployment),
            expected(case.deployment),
            "{field}: the Deployment paths that moved"
        );
        assert_eq!(
            paths(&start.service, &moved.service),
            expected(case.service),
            "{field}: the Service paths that moved"
        );

        // Reverted: the children come back exactly, but for the digest of what was applied
        // (it covers the generation stamp).
        patch_spec(&apps, "web", &original).await.unwrap();
        converged(&apps, "web", Phase::Running).await;
        let back = children(&client, "web").await;
        let moved = paths(&start.deployment, &back.deployment);
        assert!(
            moved.iter().all(|path| path == DIGEST),
            "{field}: the Deployment after the revert moved {moved:?}"
        );
        assert_eq!(
            paths(&start.service, &back.service),
            Vec::<String>::new(),
            "{field}: the Service after the revert"
        );
    }
    operator.stop().await;
    env.shutdown().await;
}
