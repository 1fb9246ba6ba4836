//! Sharding under faults, with the real `run --sharding` binary: replicas with their own tokens
//! under enforced RBAC (`deploy/base/rbac.yaml` and `deploy/sharding/rbac.yaml`), short leases,
//! while one joins, one is killed (SIGKILL), one is frozen past its lease (SIGSTOP, then
//! SIGCONT) and one leaves (SIGTERM), each in the middle of a burst of spec changes.
//!
//! The oracles:
//! - No MyApp is written by two replicas with overlapping ownership: in the API server's request
//!   log, each MyApp's writes (its status, its Deployment, its Service) come in runs of one
//!   replica's token, and between two runs of different replicas there is a write of the
//!   MyApp's labels (the sharder's move or the former owner's let-go).
//! - No MyApp moves from a live replica straight to another: watched, a MyApp's shard label
//!   changes from one replica to another only once the first one's shard Lease ran out;
//!   otherwise it goes through no label (the first one let it go).
//! - No MyApp stays on no live shard (unlabelled, or labelled for a replica whose shard Lease
//!   ran out) longer than the bound, sampled all along.
//! - The end state: every MyApp on a live shard, every child equal to its MyApp's newest spec,
//!   `observedGeneration` never decreasing, no request refused by RBAC.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{Api, ResourceExt, api::PostParams};
use kube_sandbox::{RequestRecord, testing::eventually};
use myapp_operator::{crd::MyApp, shard::SHARD_LABEL};

use crate::oracle::{
    NeverBackwards, all_running, assert_no_refusal_and_no_regression, differences, set_images,
};
use crate::run::{Cluster, SHORT_LEASE};
use crate::support::install::{apply, deploy_documents};

const APPS: usize = 40;
/// How long a MyApp may be on no live shard: the 2 s lease of a gone replica has already run
/// out when the test sees it so, and the sharder needs a watch event and a label write.
const BOUND: Duration = Duration::from_secs(5);

/// The holders of shard Leases that are live now, by the Leases' own times.
async fn live_shards(cluster: &Cluster) -> Vec<String> {
    let leases = Api::<Lease>::namespaced(cluster.client(), "myapp-system");
    let Ok(list) = leases.list(&Default::default()).await else {
        return Vec::new();
    };
    let now = Timestamp::now().as_millisecond();
    list.items
        .into_iter()
        .filter(|lease| lease.name_any().starts_with("myapp-operator-shard-"))
        .filter_map(|lease| {
            let spec = lease.spec?;
            let holder = spec.holder_identity.filter(|h| !h.is_empty())?;
            let renewed = spec.renew_time?.0.as_millisecond();
            let until = renewed + i64::from(spec.lease_duration_seconds?) * 1_000;
            (until >= now).then_some(holder)
        })
        .collect()
}

/// MyApps on no live shard now.
async fn unassigned(cluster: &Cluster, apps: &Api<MyApp>) -> Option<Vec<String>> {
    let live = live_shards(cluster).await;
    let list = apps.list(&Default::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .filter(|app| {
                !app.labels()
                    .get(SHARD_LABEL)
                    .is_some_and(|s| live.contains(s))
            })
            .map(ResourceExt::name_any)
            .collect(),
    )
}

/// Samples [`unassigned`] every 100 ms until dropped, keeping since when each MyApp has been
/// on no live shard and the longest such stretch seen.
fn watch_unassigned(
    cluster: Arc<Cluster>,
    apps: Api<MyApp>,
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<(Duration, String)>>) {
    let longest = Arc::new(Mutex::new((Duration::ZERO, String::new())));
    let kept = longest.clone();
    let task = tokio::spawn(async move {
        let mut since: BTreeMap<String, Instant> = BTreeMap::new();
        loop {
            if let Some(now_unassigned) = unassigned(&cluster, &apps).await {
                let now = Instant::now();
                since.retain(|name, _| now_unassigned.contains(name));
                for name in now_unassigned {
                    let start = *since.entry(name.clone()).or_insert(now);
                    let mut longest = kept.lock().unwrap();
                    if now - start > longest.0 {
                        *longest = (now - start, name);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (task, longest)
}

/// Watches every MyApp's shard label until dropped, keeping each change from one replica
/// straight to another made while the first one's shard Lease was live.
fn watch_moves(
    cluster: Arc<Cluster>,
    apps: Api<MyApp>,
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Vec<String>>>) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let overruled = Arc::new(Mutex::new(Vec::new()));
    let kept = overruled.clone();
    let task = tokio::spawn(async move {
        let mut shard_of: BTreeMap<String, String> = BTreeMap::new();
        let events = watcher(apps, watcher::Config::default()).applied_objects();
        tokio::pin!(events);
        while let Some(Ok(app)) = events.next().await {
            let name = app.name_any();
            let Some(now) = app.labels().get(SHARD_LABEL).cloned() else {
                shard_of.remove(&name);
                continue;
            };
            let before = shard_of.insert(name.clone(), now.clone());
            if let Some(before) = before
                && before != now
                && live_shards(&cluster).await.contains(&before)
            {
                kept.lock()
                    .unwrap()
                    .push(format!("{name}: moved from live {before} to {now}"));
            }
        }
    });
    (task, overruled)
}

/// The write a replica made for the MyApp it is about, and whether it is a label write.
enum Write<'a> {
    /// Its status, its Deployment or its Service, by this token.
    Owned(&'a str),
    /// Its labels (a move or a let-go).
    Labels,
}

fn write_of(record: &RequestRecord) -> Option<(String, Write<'_>)> {
    let token = crate::oracle::replica_write(record)?;
    let name = record.name.clone()?;
    let write = match (record.resource.as_deref()?, record.subresource.as_deref()) {
        ("myapps", None) => Write::Labels,
        ("myapps", Some("status")) | ("deployments" | "services", None) => Write::Owned(token),
        _ => return None,
    };
    Some((name, write))
}

/// Each MyApp written by a second replica with no label write since the first one's last
/// write: two owners at once.
fn overlapping(requests: &[RequestRecord]) -> Vec<String> {
    // Per MyApp: the last writer, and whether its labels changed since that writer's last write.
    let mut last: BTreeMap<String, (String, bool)> = BTreeMap::new();
    let mut overlaps = Vec::new();
    for (i, record) in requests.iter().enumerate() {
        let Some((name, write)) = write_of(record) else {
            continue;
        };
        match write {
            Write::Labels => {
                if let Some((_, relabelled)) = last.get_mut(&name) {
                    *relabelled = true;
                }
            }
            Write::Owned(token) => {
                if let Some((previous, relabelled)) = last.get(&name)
                    && previous != token
                    && !relabelled
                {
                    overlaps.push(format!(
                        "{name}: {token} wrote ({} {}, request {i}) while {previous} owned it",
                        record.verb, record.path
                    ));
                }
                last.insert(name, (token.to_owned(), false));
            }
        }
    }
    overlaps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sharded_replicas_joining_crashing_freezing_and_leaving_never_share_a_myapp() {
    let cluster = Arc::new(Cluster::start(true).await);
    apply(&cluster.client(), deploy_documents("sharding/rbac.yaml")).await;
    let apps = Api::<MyApp>::namespaced(cluster.client(), "default");
    for i in 0..APPS {
        let app = MyApp::test(&format!("app-{i}"))
            .replicas(Some(1))
            .image("ghcr.io/example/web:0.0.0");
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    let history = NeverBackwards::generations(apps.clone());
    let replica = |identity: &str| {
        let mut args = vec!["--identity", identity, "--drain-delay", "0s", "--sharding"];
        args.extend(SHORT_LEASE);
        cluster.replica(&args)
    };
    let converged = |image: String| {
        let cluster = cluster.clone();
        async move {
            eventually(&format!("every MyApp runs {image}"), || async {
                differences(&cluster.client(), &all_running(APPS, &image))
                    .await
                    .is_empty()
                    .then_some(())
            })
            .await;
        }
    };
    let (sampler, longest) = watch_unassigned(cluster.clone(), apps.clone());
    let (mover, overruled) = watch_moves(cluster.clone(), apps.clone());

    let a = replica("pod-a");
    let b = replica("pod-b");
    converged("ghcr.io/example/web:0.0.0".into()).await;

    // A replica joins during a burst: about a third of the MyApps move to it.
    let burst = set_images(&apps, APPS, "ghcr.io/example/web:1.0.0");
    let c = async { replica("pod-c") };
    let ((), c) = futures::join!(burst, c);
    converged("ghcr.io/example/web:1.0.0".into()).await;

    // One is killed during a burst: its MyApps move once its shard Lease runs out.
    let burst = set_images(&apps, APPS, "ghcr.io/example/web:2.0.0");
    let kill = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.signal("-KILL");
    };
    futures::join!(burst, kill);
    converged("ghcr.io/example/web:2.0.0".into()).await;

    // One is frozen past its lease during a burst, and wakes up to find its MyApps moved.
    let burst = set_images(&apps, APPS, "ghcr.io/example/web:3.0.0");
    let freeze = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        b.signal("-STOP");
    };
    futures::join!(burst, freeze);
    converged("ghcr.io/example/web:3.0.0".into()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.signal("-CONT");
    set_images(&apps, APPS, "ghcr.io/example/web:4.0.0").await;
    converged("ghcr.io/example/web:4.0.0".into()).await;

    // One leaves (SIGTERM: it releases its shard Lease) and another joins.
    c.signal("-TERM");
    let d = replica("pod-d");
    set_images(&apps, APPS, "ghcr.io/example/web:5.0.0").await;
    converged("ghcr.io/example/web:5.0.0".into()).await;
    eventually("every MyApp is on a live shard", || async {
        unassigned(&cluster, &apps)
            .await
            .is_some_and(|left| left.is_empty())
            .then_some(())
    })
    .await;
    sampler.abort();
    mover.abort();
    assert_eq!(*overruled.lock().unwrap(), Vec::<String>::new());

    let requests = cluster.sandbox.faults().requests();
    assert_eq!(overlapping(&requests), Vec::<String>::new());
    let (longest, which) = longest.lock().unwrap().clone();
    eprintln!("longest on no live shard: {longest:?} ({which})");
    assert!(
        longest <= BOUND,
        "{which} was on no live shard for {longest:?}"
    );
    assert_no_refusal_and_no_regression(cluster.refused_replica_requests(), history);
    drop((b, d));
}

#[test]
fn a_second_writer_without_a_label_write_between_is_an_overlap() {
    let write = |token: &str, resource: &str, sub: Option<&str>| RequestRecord {
        verb: "patch".into(),
        path: format!("/apis/x/v1/namespaces/default/{resource}/web"),
        resource: Some(resource.into()),
        subresource: sub.map(Into::into),
        namespace: Some("default".into()),
        name: Some("web".into()),
        field_manager: None,
        user_agent: None,
        user: None,
        token_id: Some(token.into()),
        status: 200,
    };
    let handed_over = [
        write("replica-0", "deployments", None),
        write("replica-0", "myapps", Some("status")),
        write("replica-0", "myapps", None),
        write("replica-1", "deployments", None),
    ];
    assert!(overlapping(&handed_over).is_empty());
    let both = [
        write("replica-0", "deployments", None),
        write("replica-1", "services", None),
    ];
    assert_eq!(overlapping(&both).len(), 1, "{:?}", overlapping(&both));
    let back = [
        write("replica-0", "deployments", None),
        write("replica-1", "myapps", None),
        write("replica-1", "services", None),
        write("replica-0", "myapps", Some("status")),
    ];
    assert_eq!(overlapping(&back).len(), 1);
}
