//! Sharding on the sandbox: controllers that each reconcile only their own shard's MyApps, one
//! letting go of a MyApp the sharder drains so that another shard takes it over, and replicas
//! whose sharder spreads MyApps over the live shards and moves a stopped replica's.

use crate::rbac::{Permission, checked_permissions, compare, granted, perm, without};
use crate::run::Cluster;
use crate::support::operator;
use crate::support::{converge, dev_environment, install};

use converge::{converged, eventually};
use operator::Operator;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        coordination::v1::{Lease, LeaseSpec},
        core::v1::Service,
        rbac::v1::PolicyRule,
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use myapp_operator::{
    crd::{MyApp, Phase},
    metrics::WriteLabels,
    shard::{DRAIN_LABEL, SHARD_LABEL, sharder},
};
use serde_json::{Value, json};

const NS: &str = "default";

fn shard_of(meta: &ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(SHARD_LABEL).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_reconciles_its_own_myapps_and_a_drained_one_moves_without_a_restart() {
    let (env, _dir) = dev_environment().await;
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

/// The shard of every MyApp named, once each is assigned, converged, and its children carry it.
async fn placed(apps: &Api<MyApp>, deployments: &Api<Deployment>, names: &[String]) -> Vec<String> {
    let mut shards = Vec::new();
    for name in names {
        // A MyApp being moved is on no shard for a moment.
        let shard = eventually(&format!("{name} is on a shard"), || async {
            shard_of(&apps.get(name).await.ok()?.metadata)
        })
        .await;
        converged(apps, name, Phase::Running).await;
        eventually(&format!("{name}'s Deployment is on {shard}"), || async {
            let deployment = deployments.get(name).await.ok()?;
            (shard_of(&deployment.metadata).as_deref() == Some(shard.as_str())).then_some(())
        })
        .await;
        shards.push(shard);
    }
    shards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sharder_spreads_myapps_over_the_live_replicas_and_moves_a_stopped_or_crashed_ones() {
    let (env, _dir) = dev_environment().await;
    let client = env.client().await.unwrap();
    let [a, b, c] = ["pod-a", "pod-b", "pod-c"]
        .map(|identity| Operator::start_sharded(client.clone(), identity));
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let names: Vec<String> = (0..24).map(|i| format!("app-{i}")).collect();
    for name in &names {
        apps.create(&PostParams::default(), &MyApp::test(name))
            .await
            .unwrap();
    }
    let shards = placed(&apps, &deployments, &names).await;
    for shard in ["pod-a", "pod-b", "pod-c"] {
        assert!(
            shards.iter().any(|s| s == shard),
            "{shard} holds none of {shards:?}"
        );
    }
    // Every assignment is a label write the sharder counts apart from the controllers' writes.
    let moves = shard_moves([&a, &b, &c]);
    assert!(moves >= 24, "{moves} moves counted for 24 assignments");
    // One replica runs the sharder and sees no MyApp on no live shard; each replica counts
    // the MyApps its shard holds.
    eventually(
        "the replicas hold 24 MyApps between them, none unassigned",
        || async {
            let replicas = [&a, &b, &c];
            let sharders = replicas
                .iter()
                .filter(|r| r.parts.metrics.shards.sharder.get() == 1)
                .count();
            let held: Vec<usize> = replicas
                .iter()
                .map(|r| r.parts.metrics.shards.held())
                .collect();
            let unassigned: i64 = replicas
                .iter()
                .map(|r| r.parts.metrics.shards.unassigned.get())
                .sum();
            (sharders == 1
                && held.iter().sum::<usize>() == 24
                && held.iter().all(|&n| n > 0)
                && unassigned == 0)
                .then_some(())
        },
    )
    .await;

    // A crashed replica releases nothing: its MyApps move once its shard Lease expires (2 s).
    c.task.abort();
    // A stopped one releases its shard Lease: its MyApps move at once.
    b.stop().await;
    all_on(&apps, "pod-a").await;
    placed(&apps, &deployments, &names).await;
    // pod-a runs the sharder now and holds all 24; its view of the ring changed with each
    // replica that left, and its metrics say so.
    eventually("pod-a holds all 24", || async {
        let gauges = &a.parts.metrics.shards;
        (gauges.sharder.get() == 1
            && gauges.held() == 24
            && gauges.unassigned.get() == 0
            && scraped(&a, "myapp_shard_objects") == Some(24))
        .then_some(())
    })
    .await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_over_myapps_labelled_for_them_move_none() {
    let (env, _dir) = dev_environment().await;
    let client = env.client().await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let ring = myapp_operator::shard::Ring::new(["pod-a", "pod-b", "pod-c"]);
    let names: Vec<String> = (0..24).map(|i| format!("app-{i}")).collect();
    for name in &names {
        let mut app = MyApp::test(name);
        let shard = ring.shard_for(NS, name).unwrap().to_owned();
        app.metadata
            .labels
            .get_or_insert_default()
            .insert(SHARD_LABEL.to_owned(), shard);
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    // As pods of one Deployment start: a little apart, the first one taking the sharder's Lease.
    let mut replicas = Vec::new();
    for identity in ["pod-a", "pod-b", "pod-c"] {
        replicas.push(Operator::start_sharded(client.clone(), identity));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    placed(&apps, &deployments, &names).await;
    eventually("each replica holds its own MyApps", || async {
        let held: Vec<usize> = replicas
            .iter()
            .map(|r| r.parts.metrics.shards.held())
            .collect();
        (held.iter().sum::<usize>() == 24 && held.iter().all(|&n| n > 0)).then_some(())
    })
    .await;
    // The sharder waited for the replicas starting beside it instead of taking their MyApps for
    // the one shard it saw first and moving them back.
    let moves = shard_moves(&replicas);
    assert_eq!(moves, 0, "label writes by the sharder");
    for replica in replicas {
        replica.stop().await;
    }
}

/// The label writes the sharder counted (`shard_move`), over every replica (whichever ran it).
fn shard_moves<'a>(replicas: impl IntoIterator<Item = &'a Operator>) -> u64 {
    let target = WriteLabels {
        target: "shard_move",
    };
    replicas
        .into_iter()
        .map(|replica| replica.parts.metrics.writes.get_or_create(&target).get())
        .sum()
}

/// An unlabelled series of `replica`'s metrics.
fn scraped(replica: &Operator, series: &str) -> Option<i64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &replica.parts.registry).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_lease_stops_being_renewed_loses_its_myapps_once_it_expires() {
    let (env, _dir) = dev_environment().await;
    let client = env.client().await.unwrap();
    // A replica that crashed a moment ago: its shard Lease, renewed now for 3 s, and its MyApps.
    let leases = Api::<Lease>::namespaced(client.clone(), "myapp-system");
    let ghost = Lease {
        metadata: ObjectMeta {
            name: Some("myapp-operator-shard-pod-ghost".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("pod-ghost".into()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &ghost).await.unwrap();
    let apps = Api::<MyApp>::namespaced(client.clone(), NS);
    let names: Vec<String> = (0..4).map(|i| format!("app-{i}")).collect();
    for name in &names {
        let app = MyApp::test(name).label(SHARD_LABEL, "pod-ghost");
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    let started = Instant::now();
    let a = Operator::start_sharded(client.clone(), "pod-a");

    all_on(&apps, "pod-a").await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "moved after {:?}, before the ghost's Lease could have expired",
        started.elapsed()
    );
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    placed(&apps, &deployments, &names).await;
    a.stop().await;
}

async fn all_on(apps: &Api<MyApp>, shard: &str) {
    eventually(&format!("every MyApp is on {shard}"), || async {
        let all = apps.list(&Default::default()).await.ok()?;
        all.items
            .iter()
            .all(|app| shard_of(&app.metadata).as_deref() == Some(shard))
            .then_some(())
    })
    .await;
}

/// The documents of `deploy/base/rbac.yaml` and `deploy/sharding/rbac.yaml`: what a sharded
/// install grants the operator.
fn sharded_rbac_documents() -> Vec<Value> {
    let mut documents = install::rbac_documents();
    documents.extend(install::deploy_documents("sharding/rbac.yaml"));
    documents
}

/// Every permission the ClusterRoles and Roles of `documents` grant.
fn granted_by(documents: &[Value]) -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for doc in documents {
        if matches!(doc["kind"].as_str(), Some("ClusterRole" | "Role")) {
            let rules: Vec<PolicyRule> =
                serde_json::from_value(doc["rules"].clone()).unwrap_or_default();
            out.extend(granted(&rules));
        }
    }
    out
}

/// The shard Lease of a replica gone for two hours, which the sharder deletes.
fn forgotten_lease() -> Lease {
    let two_hours_ago = Timestamp::now() - std::time::Duration::from_secs(7200);
    Lease {
        metadata: ObjectMeta {
            name: Some("myapp-operator-shard-pod-gone".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("pod-gone".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(two_hours_ago)),
            ..LeaseSpec::default()
        }),
    }
}

/// `cluster` with the Lease of a replica gone for two hours, which the sharder deletes.
async fn with_a_forgotten_lease(cluster: Cluster) -> Cluster {
    Api::<Lease>::namespaced(cluster.client(), "myapp-system")
        .create(&PostParams::default(), &forgotten_lease())
        .await
        .unwrap();
    cluster
}

/// A sharded replica in process, as the cluster's next replica (`replica-<n>`, its own token
/// and identity).
async fn sharded_replica(cluster: &Cluster) -> Operator {
    let (kubeconfig, identity) = cluster.next_replica_kubeconfig();
    let kubeconfig = std::fs::read_to_string(kubeconfig).unwrap();
    Operator::start_sharded(install::client_for(&kubeconfig).await, &identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_need_exactly_the_base_and_sharding_rbac_and_meet_no_refusal() {
    let documents = sharded_rbac_documents();
    let cluster = with_a_forgotten_lease(Cluster::start_under(true, documents.clone()).await).await;
    let apps = Api::<MyApp>::namespaced(cluster.client(), NS);
    let deployments = Api::<Deployment>::namespaced(cluster.client(), NS);
    // One replica takes every MyApp; a second one joins (drains and let-gos move about half
    // to it) and leaves again (they move back).
    let first = sharded_replica(&cluster).await;
    let names: Vec<String> = (0..8).map(|i| format!("app-{i}")).collect();
    for name in &names {
        apps.create(&PostParams::default(), &MyApp::test(name))
            .await
            .unwrap();
    }
    placed(&apps, &deployments, &names).await;
    let second = sharded_replica(&cluster).await;
    eventually("replica-1 takes some MyApps", || async {
        let all = apps.list(&Default::default()).await.ok()?;
        all.items
            .iter()
            .any(|app| shard_of(&app.metadata).as_deref() == Some("replica-1"))
            .then_some(())
    })
    .await;
    placed(&apps, &deployments, &names).await;
    second.stop().await;
    all_on(&apps, "replica-0").await;
    let leases = Api::<Lease>::namespaced(cluster.client(), "myapp-system");
    assert!(
        leases
            .get_opt("myapp-operator-shard-pod-gone")
            .await
            .unwrap()
            .is_none(),
        "the Lease of a replica gone for two hours is deleted"
    );
    placed(&apps, &deployments, &names).await;
    first.stop().await;

    let requests = cluster.replica_requests();
    let refused: Vec<String> = requests
        .iter()
        .filter(|r| matches!(r.status, 401 | 403))
        .map(|r| format!("{} {} -> {}", r.verb, r.path, r.status))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");
    let used: BTreeSet<Permission> = requests.iter().flat_map(checked_permissions).collect();
    compare(&used, &granted_by(&documents));
    // The tables `check` asks the API server about for a sharded install.
    let table: BTreeSet<Permission> = myapp_operator::check::operator_permissions()
        .chain(sharder::PERMISSIONS)
        .map(|p| perm(p.group, p.resource, p.verb))
        .collect();
    compare(&used, &table);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permission_sharding_adds_is_needed_removing_it_draws_its_403() {
    let added: BTreeSet<Permission> = granted_by(&install::deploy_documents("sharding/rbac.yaml"));
    assert_eq!(added.len(), sharder::PERMISSIONS.len(), "{added:?}");
    for removed in added {
        let documents = without(sharded_rbac_documents(), &removed);
        let cluster = with_a_forgotten_lease(Cluster::start_under(true, documents).await).await;
        let apps = Api::<MyApp>::namespaced(cluster.client(), NS);
        apps.create(&PostParams::default(), &MyApp::test("web"))
            .await
            .unwrap();
        let replica = sharded_replica(&cluster).await;
        eventually(&format!("a 403 for {removed:?}"), || async {
            cluster
                .replica_requests()
                .iter()
                .any(|r| r.status == 403 && checked_permissions(r).contains(&removed))
                .then_some(())
        })
        .await;
        replica.stop().await;
    }
}
