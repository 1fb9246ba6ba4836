//! The controller half of the operator, started in-process the way `run` starts it (leader
//! election included), with retries quick enough for tests.

use std::time::Duration;

use kube::Client;
use myapp_operator::{
    controller, leader,
    run::{self, Parts},
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running controller; [`Operator::stop`] shuts it down as SIGTERM would.
pub struct Operator {
    pub stop: CancellationToken,
    pub task: JoinHandle<()>,
    pub parts: Parts,
}

impl Operator {
    /// Starts reconciling (once it holds the Lease, with `elect`) as `identity`, requeueing
    /// healthy MyApps every `resync`.
    pub fn start(client: Client, identity: &str, elect: bool, resync: Duration) -> Self {
        let lease = elect.then(|| leader::Config::new("myapp-operator", "myapp-system", identity));
        Self::start_with(client, lease, None, resync)
    }

    /// Starts reconciling once it holds `lease`.
    pub fn start_elected(client: Client, lease: leader::Config) -> Self {
        Self::start_with(client, Some(lease), None, Duration::from_secs(300))
    }

    /// Starts reconciling the MyApps of `shard` alone (without an election: always).
    pub fn start_shard(client: Client, shard: &str, resync: Duration) -> Self {
        Self::start_with(client, None, Some(shard.into()), resync)
    }

    /// Starts a replica with sharding on: it reconciles its own shard under a shard Lease of
    /// its own and, while it holds the controller's Lease, assigns MyApps to the live shards.
    /// Leases last 2 s, so that a stopped replica's MyApps move within seconds.
    pub fn start_sharded(client: Client, identity: &str) -> Self {
        let stop = CancellationToken::new();
        let parts = Parts::new();
        let lease = leader::Config::new("myapp-operator", "myapp-system", identity)
            .with_timing(
                Duration::from_secs(2),
                Duration::from_millis(1_500),
                Duration::from_millis(200),
            )
            .expect("lease timing");
        let sharder = myapp_operator::shard::sharder::Config {
            namespace: "myapp-system".into(),
            lease_prefix: "myapp-operator-shard-".into(),
            by: myapp_operator::shard::sharder::By::Label,
            record: "myapp-operator-ranges".into(),
            settle: Duration::from_secs(2),
        };
        let task = tokio::spawn(run::shard_while_leading(
            client,
            Self::config(None, Duration::from_secs(300)),
            lease,
            sharder,
            parts.clone(),
            stop.clone(),
        ));
        Self { stop, task, parts }
    }

    fn start_with(
        client: Client,
        lease: Option<leader::Config>,
        shard: Option<String>,
        resync: Duration,
    ) -> Self {
        let stop = CancellationToken::new();
        let parts = Parts::new();
        let task = tokio::spawn(run::reconcile_while_leading(
            client,
            Self::config(shard, resync),
            lease,
            parts.clone(),
            stop.clone(),
        ));
        Self { stop, task, parts }
    }

    /// The controller's settings in tests: quick retries, small pages.
    fn config(shard: Option<String>, resync: Duration) -> controller::Config {
        controller::Config {
            shard,
            resync,
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_secs(2),
            reconcile_timeout: Duration::from_secs(10),
            // Small pages, so that lists of a few objects already come in several.
            page_size: 4,
            ..controller::Config::default()
        }
    }

    /// Stops the controller and releases the Lease.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("controller task");
    }
}
