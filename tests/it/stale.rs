//! Stale and unobserved state: the real `run` binary reading a view of the cluster that lags
//! the store (a list and watch served from an older resourceVersion, as a lagging API server of
//! an HA pair or a watch cache behind it serves them), and watch events coalesced or cut by a
//! 410 and relist in the middle of a burst. It must never write a child or a status older than
//! what is already there, and must converge on what the user wrote once its view catches up.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, api::PostParams};
use kube_sandbox::{RequestRecord, testing::eventually};
use myapp_operator::{
    crd::{MyApp, MyAppSpec},
    run::USER_AGENT,
};

use crate::oracle::{NeverBackwards, differences, set_images};
use crate::run::Cluster;
use crate::support::operator::Operator;

const APPS: usize = 20;

fn image(version: u64) -> String {
    format!("ghcr.io/example/web:{version}.0.0")
}

fn version(image: &str) -> Option<u64> {
    image.rsplit_once(':')?.1.split('.').next()?.parse().ok()
}

fn model(version: u64) -> BTreeMap<String, MyAppSpec> {
    (0..APPS)
        .map(|i| {
            let name = format!("app-{i}");
            let app = MyApp::test(&name).replicas(Some(1)).image(&image(version));
            (name, app.spec)
        })
        .collect()
}

/// Edits every MyApp to `version` at once.
async fn set_image(apps: &Api<MyApp>, version: u64) {
    set_images(apps, APPS, &image(version)).await;
}

async fn converged_on(cluster: &Cluster, version: u64) {
    let client = cluster.client();
    let want = model(version);
    eventually(&format!("every child runs version {version}"), || async {
        differences(&client, &want).await.is_empty().then_some(())
    })
    .await;
}

/// Every Deployment's image version, as the test's own (never lagging) view shows it.
fn image_versions(client: kube::Client) -> NeverBackwards {
    NeverBackwards::watch(
        Api::<Deployment>::namespaced(client, "default"),
        |d| d.metadata.name.clone().unwrap_or_default(),
        |d| {
            let spec = d.spec.as_ref()?.template.spec.as_ref()?;
            version(spec.containers.first()?.image.as_deref()?).map(|v| v as i64)
        },
    )
}

fn operator_writes(records: &[RequestRecord], accepted: bool) -> Vec<String> {
    records
        .iter()
        .filter(|r| r.user_agent.as_deref() == Some(USER_AGENT))
        .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
        .filter(|r| r.resource.as_deref() != Some("events"))
        .filter(|r| (r.status < 300) == accepted)
        .map(|r| format!("{} {} -> {}", r.verb, r.path, r.status))
        .collect()
}

/// How many lists the operator has made.
fn operator_lists(records: &[RequestRecord]) -> usize {
    records
        .iter()
        .filter(|r| r.user_agent.as_deref() == Some(USER_AGENT) && r.verb == "list")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_started_on_a_lagging_view_overwrites_nothing_newer() {
    let cluster = Cluster::start(true).await;
    let faults = cluster.sandbox.faults();
    let apps = Api::<MyApp>::namespaced(cluster.client(), "default");
    for (name, spec) in model(1) {
        let app = MyApp::new(&name, spec);
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    let images = image_versions(cluster.client());
    let generations = NeverBackwards::generations(apps.clone());
    // A replica in the test's process (its own user agent, so the lag below never reaches it)
    // converges on version 1, then stops.
    let first = Operator::start(cluster.client(), "first", false, Duration::from_secs(300));
    converged_on(&cluster, 1).await;
    first.stop().await;

    // Version 2 is written while no replica runs, and the lagging view freezes there: every
    // MyApp asks for version 2, every child still runs version 1.
    set_image(&apps, 2).await;
    faults.hold_reads(USER_AGENT);
    // The store moves on: a replica converges on version 2, then on version 3, and stops.
    let second = Operator::start(cluster.client(), "second", false, Duration::from_secs(300));
    converged_on(&cluster, 2).await;
    set_image(&apps, 3).await;
    converged_on(&cluster, 3).await;
    second.stop().await;

    // The real binary starts on the lagging view: it plans version 2 over children it believes
    // run version 1. The API server must refuse every one of those writes.
    let from = faults.requests().len();
    let stale = cluster.replica(&["--leader-elect=false", "--drain-delay", "0s"]);
    eventually("the stale replica tried every Deployment", || async {
        let tried = faults.requests()[from..]
            .iter()
            .filter(|r| r.user_agent.as_deref() == Some(USER_AGENT))
            .filter(|r| r.resource.as_deref() == Some("deployments") && r.verb == "patch")
            .count();
        (tried >= APPS).then_some(())
    })
    .await;
    let held = faults.requests()[from..].to_vec();
    assert_eq!(
        operator_writes(&held, true),
        Vec::<String>::new(),
        "a write planned from the lagging view landed"
    );
    let refused = operator_writes(&held, false);
    assert!(
        refused.iter().all(|line| line.ends_with("409")),
        "refused otherwise than with 409: {refused:#?}"
    );

    // The view catches up (intermediate events coalesced): the replica converges on version 3.
    faults.release_reads(true);
    converged_on(&cluster, 3).await;
    drop(stale);
    assert_eq!(
        images.regressions(),
        Vec::<String>::new(),
        "an image went back"
    );
    assert_eq!(
        generations.regressions(),
        Vec::<String>::new(),
        "observedGeneration went backwards"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_events_and_a_relist_in_the_middle_of_a_burst_converge_without_going_back() {
    let cluster = Cluster::start(true).await;
    let faults = cluster.sandbox.faults();
    let apps = Api::<MyApp>::namespaced(cluster.client(), "default");
    for (name, spec) in model(0) {
        let app = MyApp::new(&name, spec);
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    let images = image_versions(cluster.client());
    let generations = NeverBackwards::generations(apps.clone());
    let _replica = cluster.replica(&["--leader-elect=false", "--drain-delay", "0s"]);
    converged_on(&cluster, 0).await;

    let mut version = 0;
    for round in 0..3 {
        // Four edits of every MyApp; the replica's view stops after the first and, when it
        // resumes, gets only each object's newest event.
        version += 1;
        set_image(&apps, version).await;
        faults.hold_reads(USER_AGENT);
        let lists = operator_lists(&faults.requests());
        if round == 1 {
            // Every watch ends, and the resumes find their resourceVersion expired: relists.
            // The test's own two watches resume too, hence one expiry for every watch open.
            for _ in 0..8 {
                faults.expire_next_watch();
            }
            faults.close_watches();
        }
        for _ in 0..3 {
            version += 1;
            set_image(&apps, version).await;
        }
        faults.release_reads(true);
        converged_on(&cluster, version).await;
        if round == 1 {
            assert!(
                operator_lists(&faults.requests()) > lists,
                "the replica did not list again after the 410"
            );
        }
    }
    assert_eq!(
        images.regressions(),
        Vec::<String>::new(),
        "an image went back"
    );
    assert_eq!(
        generations.regressions(),
        Vec::<String>::new(),
        "observedGeneration went backwards"
    );
}
