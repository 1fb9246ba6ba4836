//! Sharding by namespace (KEP-5866's sharded list and watch), with the real
//! `run --sharding --shard-by namespace` binary against an API server that has the feature on:
//! replicas with their own tokens under enforced RBAC, while one joins, one is killed, one is
//! frozen past its lease and one leaves, each during a burst of spec changes.
//!
//! The oracles:
//! - The API server filters: each replica's controller holds only its namespaces' MyApps
//!   (`myapp_shard_objects`), and together they hold them all.
//! - No MyApp is written by two replicas with overlapping ownership: in the request log, each
//!   MyApp's writes (status, Deployment, Service) come in runs of one replica's token, and
//!   between two runs of different replicas the record of namespace ranges was written (a hand-
//!   over needs the sharder's shrink, or the former holder's acknowledgement).
//! - The end state: every child equal to its MyApp's newest spec, `observedGeneration` never
//!   decreasing, no request refused by RBAC.
//!
//! And without the feature, `run --shard-by namespace` refuses to start, naming what to do.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::PostParams};
use kube_sandbox::{RequestRecord, testing::eventually};
use myapp_operator::crd::MyApp;

use crate::oracle::{
    NeverBackwards, all_running, assert_no_refusal_and_no_regression, differences_in, set_images,
};
use crate::run::{Cluster, SHORT_LEASE, exits_within, gauge, operator_run};
use crate::support::install::{apply, deploy_documents, rbac_documents};

/// Namespaces, and MyApps in each.
const NAMESPACES: usize = 8;
const PER_NAMESPACE: usize = 4;
/// The record of namespace ranges, beside the `myapp-operator` Lease.
const RECORD: &str = "myapp-operator-ranges";

/// How long after a replica was killed or frozen its writes can no longer be in flight, and
/// before anyone may take over its namespaces (its lease lasts 2 s).
const SILENT_AFTER: Duration = Duration::from_millis(1_500);

/// The term of `identity`'s shard Lease (its acquireTime).
async fn term_of(cluster: &Cluster, identity: &str) -> Option<String> {
    let leases = Api::<Lease>::namespaced(cluster.client(), "myapp-system");
    let lease = leases
        .get_opt(&format!("myapp-operator-shard-{identity}"))
        .await
        .ok()??;
    myapp_operator::shard::by_namespace::term_of(&lease)
}

fn namespaces() -> Vec<String> {
    (0..NAMESPACES).map(|i| format!("team-{i}")).collect()
}

async fn sharded_cluster(feature: bool) -> Cluster {
    Cluster::start_configured(true, rbac_documents(), |mut builder| {
        for namespace in namespaces() {
            builder = builder.namespace(&namespace);
        }
        builder.sharded_list_watch(feature)
    })
    .await
}

/// The write a replica made for the MyApp it is about, or to the record.
enum Write {
    /// Its status, its Deployment or its Service.
    Owned(String),
    /// The record of namespace ranges (for a shard, its acknowledgement).
    Record,
}

fn write_of(record: &RequestRecord) -> Option<(&str, Write)> {
    let token = crate::oracle::replica_write(record)?;
    let name = record.name.clone()?;
    let namespace = record.namespace.clone().unwrap_or_default();
    let write = match (record.resource.as_deref()?, record.subresource.as_deref()) {
        ("leases", None) if name == RECORD => Write::Record,
        ("myapps", Some("status")) | ("deployments" | "services", None) => {
            Write::Owned(format!("{namespace}/{name}"))
        }
        _ => return None,
    };
    Some((token, write))
}

/// Each MyApp written by a second replica while the first could still be writing it: neither
/// did the first write the record (its acknowledgement that it let the MyApp's namespace go)
/// since its last write of the MyApp, nor was it `silenced` (killed or frozen: the token and
/// the number of requests in the log at that moment) in between.
fn overlapping(requests: &[RequestRecord], silenced: &[(&str, usize)]) -> Vec<String> {
    let mut last: BTreeMap<String, (&str, usize)> = BTreeMap::new();
    let mut record_writes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut overlaps = Vec::new();
    for (j, request) in requests.iter().enumerate() {
        match write_of(request) {
            Some((token, Write::Record)) => record_writes.entry(token).or_default().push(j),
            Some((token, Write::Owned(app))) => {
                if let Some(&(previous, i)) = last.get(&app)
                    && previous != token
                {
                    let between = |at: usize| i < at && at < j;
                    let acked = record_writes
                        .get(previous)
                        .is_some_and(|at| at.iter().any(|&at| between(at)));
                    let gone = silenced
                        .iter()
                        .any(|&(who, at)| who == previous && i < at && at <= j);
                    if !acked && !gone {
                        overlaps.push(format!(
                            "{app}: {token} wrote ({} {}, request {j}) while {previous} owned it",
                            request.verb, request.path
                        ));
                    }
                }
                last.insert(app, (token, j));
            }
            None => {}
        }
    }
    overlaps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sharded_by_namespace_replicas_joining_crashing_freezing_and_leaving_never_share_a_myapp() {
    let cluster = Arc::new(sharded_cluster(true).await);
    apply(&cluster.client(), deploy_documents("sharding/rbac.yaml")).await;
    for namespace in namespaces() {
        let apps = Api::<MyApp>::namespaced(cluster.client(), &namespace);
        for i in 0..PER_NAMESPACE {
            let app = MyApp::test(&format!("app-{i}"))
                .replicas(Some(1))
                .image("ghcr.io/example/web:0.0.0");
            apps.create(&PostParams::default(), &app).await.unwrap();
        }
    }
    let history = NeverBackwards::generations(Api::all(cluster.client()));
    let replica = |identity: &str| {
        let mut args = vec![
            "--identity",
            identity,
            "--drain-delay",
            "0s",
            "--sharding",
            "--shard-by",
            "namespace",
        ];
        args.extend(SHORT_LEASE);
        cluster.replica(&args)
    };
    let converged = |image: String| {
        let cluster = cluster.clone();
        async move {
            eventually(&format!("every MyApp runs {image}"), || async {
                let want = all_running(PER_NAMESPACE, &image);
                for namespace in namespaces() {
                    if !differences_in(&cluster.client(), &namespace, &want)
                        .await
                        .is_empty()
                    {
                        return None;
                    }
                }
                Some(())
            })
            .await;
        }
    };
    let burst = |image: &'static str| {
        let cluster = cluster.clone();
        async move {
            for namespace in namespaces() {
                let apps = Api::<MyApp>::namespaced(cluster.client(), &namespace);
                set_images(&apps, PER_NAMESPACE, image).await;
            }
        }
    };

    let a = replica("pod-a");
    let b = replica("pod-b");
    converged("ghcr.io/example/web:0.0.0".into()).await;
    // The API server filtered: each holds its own namespaces' MyApps, together all of them.
    eventually("each replica holds its half of the MyApps", || async {
        let held = (
            gauge(a.admin, "myapp_shard_objects").await?,
            gauge(b.admin, "myapp_shard_objects").await?,
        );
        let all = (NAMESPACES * PER_NAMESPACE) as i64;
        (held.0 > 0 && held.1 > 0 && held.0 + held.1 == all).then_some(())
    })
    .await;

    // A replica joins during a burst.
    let c = async { replica("pod-c") };
    let ((), c) = futures::join!(burst("ghcr.io/example/web:1.0.0"), c);
    converged("ghcr.io/example/web:1.0.0".into()).await;

    // Replicas' tokens follow their start order.
    let logged = || cluster.sandbox.faults().requests().len();
    let mut silenced = Vec::new();
    // One is killed during a burst: its namespaces move once its shard Lease runs out.
    let kill = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.signal("-KILL");
        // Requests it had in flight reach the log a moment later; nobody may take over its
        // namespaces before its 2 s lease has run out, so a write of them before this point
        // is an overlap.
        tokio::time::sleep(SILENT_AFTER).await;
        logged()
    };
    let ((), killed) = futures::join!(burst("ghcr.io/example/web:2.0.0"), kill);
    silenced.push(("replica-0", killed));
    converged("ghcr.io/example/web:2.0.0".into()).await;

    // One is frozen past its lease during a burst, and wakes up in a new term to find its
    // namespaces served by the others.
    let term_before = term_of(&cluster, "pod-b").await;
    let freeze = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        b.signal("-STOP");
        tokio::time::sleep(SILENT_AFTER).await;
        logged()
    };
    let ((), frozen) = futures::join!(burst("ghcr.io/example/web:3.0.0"), freeze);
    silenced.push(("replica-1", frozen));
    converged("ghcr.io/example/web:3.0.0".into()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.signal("-CONT");
    burst("ghcr.io/example/web:4.0.0").await;
    converged("ghcr.io/example/web:4.0.0".into()).await;
    eventually(
        "pod-b holds its shard Lease again, in a new term",
        || async {
            let now = term_of(&cluster, "pod-b").await;
            (now.is_some() && now != term_before).then_some(())
        },
    )
    .await;

    // One leaves (SIGTERM: it stops reconciling, then releases its shard Lease) and another
    // joins.
    c.signal("-TERM");
    let d = replica("pod-d");
    let mut c = c;
    exits_within(
        &mut c.process,
        Duration::from_secs(30),
        "pod-c did not stop",
    )
    .await;
    // It stopped reconciling before its last write, the release of its shard Lease.
    let released = cluster
        .sandbox
        .faults()
        .requests()
        .iter()
        .rposition(|r| {
            r.token_id.as_deref() == Some("replica-2")
                && r.name.as_deref() == Some("myapp-operator-shard-pod-c")
                && r.verb == "update"
        })
        .expect("pod-c released its shard Lease");
    silenced.push(("replica-2", released + 1));
    burst("ghcr.io/example/web:5.0.0").await;
    converged("ghcr.io/example/web:5.0.0".into()).await;
    eventually("b and d hold every MyApp between them", || async {
        let held = gauge(b.admin, "myapp_shard_objects").await?
            + gauge(d.admin, "myapp_shard_objects").await?;
        (held == (NAMESPACES * PER_NAMESPACE) as i64).then_some(())
    })
    .await;

    let requests = cluster.sandbox.faults().requests();
    assert_eq!(
        overlapping(&requests, &silenced),
        Vec::<String>::new(),
        "silenced: {silenced:?}"
    );
    let labelled = requests
        .iter()
        .filter(|r| r.resource.as_deref() == Some("myapps") && r.verb == "patch")
        .filter(|r| r.subresource.is_none())
        .filter(|r| {
            r.token_id
                .as_deref()
                .is_some_and(|t| t.starts_with("replica-"))
        })
        .count();
    assert_eq!(labelled, 0, "sharding by namespace writes no MyApp labels");
    assert_no_refusal_and_no_regression(cluster.refused_replica_requests(), history);
    drop((b, d));
}

#[tokio::test]
async fn sharding_by_namespace_refuses_to_start_where_the_api_server_ignores_shard_selectors() {
    let cluster = sharded_cluster(false).await;
    apply(&cluster.client(), deploy_documents("sharding/rbac.yaml")).await;
    let (kubeconfig, _) = cluster.next_replica_kubeconfig();
    let mut process = kube_sandbox::testing::Reap(
        operator_run(&kubeconfig)
            .args(["--sharding", "--shard-by", "namespace", "--cert-dir"])
            .arg(&cluster.certs)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = exits_within(&mut process, Duration::from_secs(30), "run did not exit").await;
    assert_eq!(status.code(), Some(1));
    let mut stderr = String::new();
    std::io::Read::read_to_string(process.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("ignored it: turn the feature on, or use --shard-by label"),
        "{stderr}"
    );
}

#[test]
fn a_second_writer_before_the_first_acknowledged_or_went_silent_is_an_overlap() {
    let write = |token: &str, resource: &str, name: &str| RequestRecord {
        verb: "patch".into(),
        path: format!("/apis/x/v1/namespaces/team-0/{resource}/{name}"),
        resource: Some(resource.into()),
        subresource: None,
        namespace: Some("team-0".into()),
        name: Some(name.into()),
        field_manager: None,
        user_agent: None,
        user: None,
        token_id: Some(token.into()),
        status: 200,
    };
    let handed_over = [
        write("replica-0", "deployments", "web"),
        write("replica-0", "leases", RECORD),
        write("replica-1", "deployments", "web"),
    ];
    assert!(overlapping(&handed_over, &[]).is_empty());
    let both = [
        write("replica-0", "deployments", "web"),
        write("replica-1", "services", "web"),
    ];
    assert_eq!(overlapping(&both, &[]).len(), 1);
    assert!(overlapping(&both, &[("replica-0", 1)]).is_empty());
    // Only the former owner's write of the record is its acknowledgement.
    let sharder_wrote = [
        write("replica-0", "deployments", "web"),
        write("replica-2", "leases", RECORD),
        write("replica-1", "services", "web"),
    ];
    assert_eq!(overlapping(&sharder_wrote, &[]).len(), 1);
    let other_lease = [
        write("replica-0", "deployments", "web"),
        write("replica-0", "leases", "myapp-operator"),
        write("replica-1", "services", "web"),
    ];
    assert_eq!(overlapping(&other_lease, &[]).len(), 1);
}
