//! `deploy/rbac.yaml` grants exactly what the operator uses: the operator runs through a whole
//! life cycle on the sandbox (leader election on, Events, every kind of write), and the
//! (apiGroup, resource, verb) set of its requests in the sandbox's request log must equal the
//! rules of the ClusterRole and the leader-election Role.
//!
//! The operator's client sends its own `User-Agent`, and the sandbox records it: that is how the
//! operator's requests are told from the test's own (which go through a second client with
//! kube's default, empty user agent). Driving the test through kubectl instead would also work
//! but would tie this test to kubectl being installed; the header needs nothing.

use crate::support::converge;
use crate::support::operator;

use converge::{converged, eventually};
use operator::Operator;

use std::{collections::BTreeSet, path::Path, time::Duration};

use hyper::header::{HeaderValue, USER_AGENT};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::Service,
    rbac::v1::{ClusterRole, PolicyRule, Role},
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_sandbox::RequestRecord;
use myapp_operator::{
    crd::{MyApp, Phase},
    dev::{Environment, Options},
};
use serde_json::{Value, json};

const NS: &str = "default";
const OPERATOR_AGENT: &str = "myapp-operator/rbac-test";

/// (apiGroup, resource or resource/subresource, verb), as RBAC spells a permission.
type Permission = (String, String, String);

fn perm(group: &str, resource: &str, verb: &str) -> Permission {
    (group.into(), resource.into(), verb.into())
}

/// The permissions the Kubernetes authorizer checks for one logged request.
fn checked_permissions(record: &RequestRecord) -> Vec<Permission> {
    let group = api_group(&record.path);
    let resource = match (&record.resource, &record.subresource) {
        (Some(r), Some(s)) => format!("{r}/{s}"),
        (Some(r), None) => r.clone(),
        (None, _) => panic!(
            "the operator made a non-resource request ({} {}): rbac.yaml has no nonResourceURLs",
            record.verb, record.path
        ),
    };
    let mut checked = vec![perm(&group, &resource, &record.verb)];
    // A server-side apply that creates the object is a PATCH, but the API server also
    // authorizes it as `create` (patch handler: withAuthorization on the create path); the
    // sandbox answers such an apply with 201 Created.
    if record.verb == "patch" && record.status == 201 {
        checked.push(perm(&group, &resource, "create"));
    }
    checked
}

/// `/api/v1/...` is the core group (""); `/apis/<group>/<version>/...` is `<group>`.
fn api_group(path: &str) -> String {
    let mut segments = path.trim_start_matches('/').split('/');
    match segments.next() {
        Some("apis") => segments.next().unwrap_or_default().to_owned(),
        _ => String::new(),
    }
}

fn granted(rules: &[PolicyRule]) -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    assert!(
                        group != "*" && resource != "*" && verb != "*",
                        "rbac.yaml has a wildcard: {rule:?}"
                    );
                    out.insert(perm(group, resource, verb));
                }
            }
        }
    }
    out
}

/// The union of the ClusterRole's and the leader-election Role's rules in `deploy/rbac.yaml`.
fn rbac_yaml_permissions() -> BTreeSet<Permission> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let mut out = BTreeSet::new();
    for doc in docs {
        match doc["kind"].as_str() {
            Some("ClusterRole") => {
                let role: ClusterRole = serde_json::from_value(doc).unwrap();
                out.extend(granted(&role.rules.unwrap_or_default()));
            }
            Some("Role") => {
                let role: Role = serde_json::from_value(doc).unwrap();
                assert_eq!(
                    role.metadata.namespace.as_deref(),
                    Some("myapp-system"),
                    "the leader-election Role lives in the operator's namespace"
                );
                out.extend(granted(&role.rules.unwrap_or_default()));
            }
            _ => {}
        }
    }
    out
}

/// A client for the sandbox that identifies itself as the operator.
async fn operator_client(env: &Environment) -> Client {
    let text = std::fs::read_to_string(&env.kubeconfig_path).unwrap();
    let kubeconfig = Kubeconfig::from_yaml(&text).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
    config
        .headers
        .push((USER_AGENT, HeaderValue::from_static(OPERATOR_AGENT)));
    Client::try_from(config).unwrap()
}

async fn set_spec(apps: &Api<MyApp>, name: &str, spec: Value) {
    apps.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_yaml_grants_exactly_what_the_operator_requests_over_a_whole_life_cycle() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let env = Environment::start(Options::ephemeral(dir.path().to_owned()))
        .await
        .expect("environment starts");
    let operator = Operator::start(
        operator_client(&env).await,
        "rbac",
        true,
        Duration::from_secs(300),
    );

    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let services = Api::<Service>::namespaced(client.clone(), NS);
    let app = MyApp::test("web").env("LOG_LEVEL", "info");
    // Create: children applied (SSA patches that create), status applied, Events created.
    apps.create(&PostParams::default(), &app).await.unwrap();
    converged(&apps, "web", Phase::Running).await;
    // The OwnerReferencesPermissionEnforcement admission plugin (which the sandbox does not
    // model) checks `update` on the owner's `finalizers` subresource when a child's
    // ownerReference sets blockOwnerDeletion: true. kube's controller_owner_ref leaves it unset,
    // so the rule is needed exactly when a child carries it.
    let mut blocks_owner_deletion = false;
    for meta in [
        deployments.get("web").await.unwrap().metadata,
        services.get("web").await.unwrap().metadata,
    ] {
        blocks_owner_deletion |= meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.block_owner_deletion == Some(true));
    }

    // Change: a new rollout.
    set_spec(&apps, "web", json!({"image": "ghcr.io/example/web:1.4.3"})).await;
    converged(&apps, "web", Phase::Running).await;

    // A deleted child comes back.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Service is re-created", || async {
        services.get_opt("web").await.unwrap()
    })
    .await;

    // Scale through the spec.
    set_spec(&apps, "web", json!({"replicas": 3})).await;
    converged(&apps, "web", Phase::Running).await;

    // A rollout that fails: phase Degraded and a Warning Event.
    env.sandbox.rollouts().set_failing(true);
    set_spec(&apps, "web", json!({"image": "ghcr.io/example/web:2.0.0"})).await;
    converged(&apps, "web", Phase::Degraded).await;

    // Recovery: a second "Running" Event, created like the first (no series patch).
    env.sandbox.rollouts().set_failing(false);
    set_spec(&apps, "web", json!({"image": "ghcr.io/example/web:2.0.1"})).await;
    converged(&apps, "web", Phase::Running).await;

    // Delete: the garbage collector takes the children; the operator only watches.
    apps.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the children are collected", || async {
        (deployments.get_opt("web").await.unwrap().is_none()
            && services.get_opt("web").await.unwrap().is_none())
        .then_some(())
    })
    .await;

    // Stopping releases the Lease (a get and an update).
    operator.stop().await;
    let requests = env.sandbox.faults().requests();
    env.shutdown().await;
    let operator: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| r.user_agent.as_deref() == Some(OPERATOR_AGENT))
        .collect();
    assert!(
        !operator.is_empty(),
        "no request carried the operator's user agent"
    );
    let mut used: BTreeSet<Permission> = operator
        .iter()
        .flat_map(|r| checked_permissions(r))
        .collect();
    if blocks_owner_deletion {
        used.insert(perm("example.com", "myapps/finalizers", "update"));
    }
    compare(&used, &rbac_yaml_permissions());
}

fn compare(used: &BTreeSet<Permission>, granted: &BTreeSet<Permission>) {
    let missing: Vec<&Permission> = used.difference(granted).collect();
    assert!(
        missing.is_empty(),
        "the operator needs permissions rbac.yaml does not grant: {missing:?}"
    );
    let extra: Vec<&Permission> = granted.difference(used).collect();
    assert!(
        extra.is_empty(),
        "rbac.yaml grants permissions the operator never used: {extra:?}"
    );
}
