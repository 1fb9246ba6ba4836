//! A leader frozen past its lease (SIGSTOP) while the other replica takes over and writes newer
//! specs, then resumed (SIGCONT): it must write nothing. The real `run` binary, two replicas with
//! their own ServiceAccount tokens under enforced RBAC, short leases; the API server's request
//! log tells the replicas' writes apart by token.
//!
//! The oracles: no write of the paused replica lands after the other replica took the Lease;
//! the paused replica reports `myapp_leader 0` on its first scrape after waking; every child
//! equals its MyApp's newest spec at the end; `status.observedGeneration` never decreases in the
//! watch history.

use std::time::Duration;

use kube::{Api, api::PostParams};
use kube_sandbox::{RequestRecord, testing::eventually};
use myapp_operator::crd::MyApp;

use crate::oracle::{
    NeverBackwards, all_running, assert_no_refusal_and_no_regression, differences, set_images,
};
use crate::run::{Cluster, SHORT_LEASE, gauge};

const APPS: usize = 60;
/// Pause rounds, alternating which replica is paused; `PAUSE_ROUNDS` asks for more.
fn rounds() -> usize {
    std::env::var("PAUSE_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
}

fn image(round: usize, step: usize) -> String {
    format!("ghcr.io/example/web:{round}.{step}.0")
}

/// Whether the cluster holds every MyApp of [`model`] and exactly its children, converged.
async fn converged_on(cluster: &Cluster, image: &str) -> bool {
    differences(&cluster.client(), &all_running(APPS, image))
        .await
        .is_empty()
}

fn is_write(record: &RequestRecord) -> bool {
    !matches!(record.verb.as_str(), "get" | "list" | "watch")
}

/// Every overwrite `token` made that the API server accepted after its rival took the Lease
/// (the rival's first accepted Lease write since `from`).
fn landed_after_takeover(
    requests: &[RequestRecord],
    from: usize,
    token: &str,
    rival: &str,
) -> Vec<String> {
    let takeover = requests
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, r)| {
            r.token_id.as_deref() == Some(rival)
                && r.resource.as_deref() == Some("leases")
                && is_write(r)
                && r.status < 300
        })
        .map(|(i, _)| i)
        .expect("the rival took the Lease");
    requests[takeover..]
        .iter()
        .filter(|r| r.token_id.as_deref() == Some(token) && is_write(r) && r.status < 300)
        // Its own Lease writes are refused (409) by the rival's; an Event is a new object, not
        // an overwrite, and one that passed the gate just before the pause may land after it.
        .filter(|r| !matches!(r.resource.as_deref(), Some("leases" | "events")))
        .map(|r| format!("{} {} -> {}", r.verb, r.path, r.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_paused_past_its_lease_wakes_up_writing_nothing() {
    let cluster = Cluster::start(true).await;
    let apps = Api::<MyApp>::namespaced(cluster.client(), "default");
    for i in 0..APPS {
        let app = MyApp::test(&format!("app-{i}"))
            .replicas(Some(1))
            .image(&image(0, 0));
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    let history = NeverBackwards::generations(apps.clone());

    let replica = |identity: &str| {
        let mut args = vec!["--identity", identity, "--drain-delay", "0s"];
        args.extend(SHORT_LEASE);
        cluster.replica(&args)
    };
    // replica-0 and replica-1 are the tokens, in start order.
    let replicas = [
        (replica("first"), "first", "replica-0"),
        (replica("second"), "second", "replica-1"),
    ];
    eventually("the first converges", || async {
        converged_on(&cluster, &image(0, 0)).await.then_some(())
    })
    .await;
    let mut leader = usize::from(cluster.lease_holder().await.as_deref() == Some("second"));

    for round in 1..=rounds() {
        let (paused, paused_name, paused_token) = &replicas[leader];
        let (_, rival_name, rival_token) = &replicas[1 - leader];
        let from = cluster.sandbox.faults().requests().len();
        // Freeze the leader in the middle of a burst: its reconciles are planned, queued or
        // on the wire when it stops.
        let planned = image(round, 1);
        let burst = set_images(&apps, APPS, &planned);
        let freeze = async {
            tokio::time::sleep(Duration::from_millis(15)).await;
            paused.signal("-STOP");
        };
        futures::join!(burst, freeze);
        eventually("the other replica takes the Lease", || async {
            (cluster.lease_holder().await.as_deref() == Some(*rival_name)).then_some(())
        })
        .await;
        // Newer specs, written by the new leader while the old one sleeps.
        let newest = image(round, 2);
        set_images(&apps, APPS, &newest).await;
        eventually("the new leader converges", || async {
            converged_on(&cluster, &newest).await.then_some(())
        })
        .await;

        paused.signal("-CONT");
        assert_eq!(
            gauge(paused.admin, "myapp_leader").await,
            Some(0),
            "{paused_name} reported leading on its first scrape after waking"
        );
        // Whatever the woken replica had planned, it has had time to try: its Lease loop
        // has read the Lease (and found the rival's) since it woke.
        let noticed = paused.lines_until(Duration::from_secs(10), |line| {
            line.contains("Lost the lease") || line.contains(r#""leader":false"#)
        });
        assert!(
            noticed
                .last()
                .is_some_and(|line| line.contains("lease") || line.contains("leader")),
            "{paused_name} never noticed that it lost the lease: {noticed:#?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let requests = cluster.sandbox.faults().requests();
        let stale = landed_after_takeover(&requests, from, paused_token, rival_token);
        assert_eq!(
            stale,
            Vec::<String>::new(),
            "round {round}: {paused_name} wrote after {rival_name} took over"
        );
        let refused = requests[from..]
            .iter()
            .filter(|r| r.token_id.as_deref() == Some(*paused_token) && r.status == 409)
            .filter(|r| r.resource.as_deref() != Some("leases"))
            .count();
        eprintln!(
            "round {round}: {paused_name} paused; after waking: fenced writes {:?}, Events dropped {:?}, writes refused with 409 {refused}",
            gauge(paused.admin, "myapp_fenced_writes_total").await,
            gauge(paused.admin, "myapp_events_dropped_total").await,
        );
        assert!(
            converged_on(&cluster, &newest).await,
            "round {round}: a child or status no longer matches the newest spec"
        );
        assert_eq!(cluster.lease_holder().await.as_deref(), Some(*rival_name));
        leader = 1 - leader;
    }
    assert_no_refusal_and_no_regression(cluster.refused_replica_requests(), history);
}
