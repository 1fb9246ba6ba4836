//! `deploy/base/rbac.yaml` grants exactly what the operator uses: the operator runs through a whole
//! life cycle on the sandbox (leader election on, Events, every kind of write), and the
//! (apiGroup, resource, verb) set of its requests in the sandbox's request log must equal the
//! rules of the ClusterRole and the leader-election Role. And enforced, not only recorded: the
//! operator runs as its ServiceAccount under `deploy/base/rbac.yaml` with zero 403s, and without any
//! one of its permissions it meets the 403 that proves why that permission is there.
//!
//! The operator's client sends its own `User-Agent`, and the sandbox records it: that is how the
//! operator's requests are told from the test's own (which go through a second client with
//! kube's default, empty user agent). Driving the test through kubectl instead would also work
//! but would tie this test to kubectl being installed; the header needs nothing.

use crate::support::converge;
use crate::support::operator;

use converge::{converged, eventually};
use futures::StreamExt;
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
};
use kube_sandbox::RequestRecord;
use myapp_operator::{
    crd::{MyApp, Phase},
    dev::Environment,
};
use serde_json::{Value, json};

const NS: &str = "default";
const OPERATOR_AGENT: &str = "myapp-operator/rbac-test";

/// (apiGroup, resource or resource/subresource, verb), as RBAC spells a permission.
pub(crate) type Permission = (String, String, String);

pub(crate) fn perm(group: &str, resource: &str, verb: &str) -> Permission {
    (group.into(), resource.into(), verb.into())
}

/// The permissions the Kubernetes authorizer checks for one logged request.
pub(crate) fn checked_permissions(record: &RequestRecord) -> Vec<Permission> {
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

pub(crate) fn granted(rules: &[PolicyRule]) -> BTreeSet<Permission> {
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

/// The union of the ClusterRole's and the leader-election Role's rules in `deploy/base/rbac.yaml`.
fn rbac_yaml_permissions() -> BTreeSet<Permission> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/rbac.yaml");
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
    let mut config = kube_sandbox::config_for(&text).await.unwrap();
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
    let (env, _dir) = crate::support::dev_environment().await;
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

    // Recovery: a second "RolloutComplete" Event, created like the first (no series patch).
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
    // The table `check` asks the API server about, compiled in beside the calls.
    let table: BTreeSet<Permission> = myapp_operator::check::operator_permissions()
        .map(|p| perm(p.group, p.resource, p.verb))
        .collect();
    compare(&used, &table);
}

pub(crate) fn compare(used: &BTreeSet<Permission>, granted: &BTreeSet<Permission>) {
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

/// `deploy/base/rbac.yaml` without one verb of one rule (the rule goes when no verb is left).
pub(crate) fn rbac_documents_without(removed: &Permission) -> Vec<Value> {
    without(crate::support::install::rbac_documents(), removed)
}

/// RBAC `documents` without one verb of one rule (the rule goes when no verb is left).
pub(crate) fn without(mut documents: Vec<Value>, removed: &Permission) -> Vec<Value> {
    for doc in &mut documents {
        if !matches!(doc["kind"].as_str(), Some("ClusterRole" | "Role")) {
            continue;
        }
        let rules = doc["rules"].as_array_mut().unwrap();
        for rule in rules.iter_mut() {
            let names = |field: &str| -> Vec<String> {
                rule[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect()
            };
            if names("apiGroups").contains(&removed.0) && names("resources").contains(&removed.1) {
                let verbs = rule["verbs"].as_array_mut().unwrap();
                verbs.retain(|v| v.as_str() != Some(removed.2.as_str()));
            }
        }
        rules.retain(|rule| !rule["verbs"].as_array().unwrap().is_empty());
    }
    documents
}

/// What one life cycle under `documents` showed: the operator's refused requests, and
/// whether its MyApp got to Running.
struct Outcome {
    refused: Vec<RequestRecord>,
    running: bool,
}

/// Runs the operator as its ServiceAccount (a bound token, over HTTPS, RBAC enforced) under
/// `documents`, creates a MyApp and watches until `done` says so (given the operator's requests
/// so far and whether the MyApp runs) or 20 s have passed.
async fn life_cycle_under(
    documents: Vec<Value>,
    done: impl Fn(&[RequestRecord], bool) -> bool,
) -> Outcome {
    use crate::support::install::{apply, client_for};
    let sandbox = kube_sandbox::Sandbox::builder()
        .namespace("myapp-system")
        .service_account_token("operator", "myapp-system", "myapp-operator")
        .build();
    let served = sandbox
        .serve_tls("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let admin = client_for(&served.kubeconfig()).await;
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(admin.clone())
        .create(&PostParams::default(), &<MyApp as kube::CustomResourceExt>::crd())
        .await
        .unwrap();
    apply(&admin, documents).await;
    let operator = Operator::start(
        client_for(&served.kubeconfig_for_token("operator").unwrap()).await,
        "rbac",
        true,
        Duration::from_secs(300),
    );
    let apps = Api::<MyApp>::namespaced(admin, NS);
    apps.create(&PostParams::default(), &MyApp::test("web"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let outcome = loop {
        let requests: Vec<RequestRecord> = sandbox
            .faults()
            .requests()
            .into_iter()
            .filter(|r| r.token_id.as_deref() == Some("operator"))
            .collect();
        let running =
            apps.get("web").await.ok().and_then(|a| a.status?.phase) == Some(Phase::Running);
        if done(&requests, running) || tokio::time::Instant::now() > deadline {
            let refused = requests.into_iter().filter(|r| r.status == 403).collect();
            break Outcome { refused, running };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Whether its caches synced or a forbidden list left them empty, nothing is in flight:
    // the operator stops at once, not after its 10 s reconcile deadline.
    tokio::time::timeout(Duration::from_secs(5), operator.stop())
        .await
        .expect("the operator stops at once on shutdown, caches synced or not");
    outcome
}

/// The permissions a refused request was checked for (an apply that would create checks
/// `create` too).
fn refused_permissions(record: &RequestRecord) -> Vec<Permission> {
    let mut checked = checked_permissions(record);
    if record.verb == "patch" {
        let (group, resource, _) = checked[0].clone();
        checked.push((group, resource, "create".into()));
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permission_in_rbac_yaml_is_needed_removing_it_draws_its_403() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Complete: the life cycle runs with no refusal, up to the leader's first Lease renewal
    // (an update, within its 2 s retry period). Then any 403 below comes from the removal.
    let baseline = life_cycle_under(
        crate::support::install::rbac_documents(),
        |requests, running| {
            running
                && requests.iter().any(|r| {
                    r.verb == "update" && r.resource.as_deref() == Some("leases") && r.status == 200
                })
        },
    )
    .await;
    assert!(baseline.running, "the operator converges under rbac.yaml");
    assert!(baseline.refused.is_empty(), "{:#?}", baseline.refused);

    // Each removal runs in its own sandbox, one after the other, in the order rbac.yaml lists
    // them. (Four at a time saved a few seconds but loaded the two cores enough to starve the
    // timing-sensitive tests running beside this one.)
    let outcomes: Vec<(Permission, Outcome)> = futures::stream::iter(rbac_yaml_permissions())
        .map(|removed| async move {
            let wanted = removed.clone();
            let t0 = std::time::Instant::now();
            let outcome = life_cycle_under(rbac_documents_without(&removed), move |requests, _| {
                requests
                    .iter()
                    .any(|r| r.status == 403 && refused_permissions(r).contains(&wanted))
            })
            .await;
            eprintln!(
                "TIMING {removed:?} {:?} {:?}",
                t0.elapsed(),
                outcome
                    .refused
                    .iter()
                    .map(|r| (r.verb.clone(), r.path.clone()))
                    .collect::<Vec<_>>()
            );
            (removed, outcome)
        })
        .buffered(1)
        .collect()
        .await;
    let mut report = Vec::new();
    for (removed, outcome) in outcomes {
        let proof = outcome
            .refused
            .iter()
            .find(|r| refused_permissions(r).contains(&removed));
        let Some(proof) = proof else {
            panic!(
                "without {removed:?} the operator met no 403 for it (running: {}, refused: {:?})",
                outcome.running, outcome.refused
            );
        };
        report.push(format!(
            "{:>14} {:<20} {:<7} -> 403 on {} {}",
            removed.0, removed.1, removed.2, proof.verb, proof.path
        ));
    }
    println!("{}", report.join("\n"));
}
