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

    /// Starts reconciling the MyApps of `shard` alone (without an election: always).
    pub fn start_shard(client: Client, shard: &str, resync: Duration) -> Self {
        Self::start_with(client, None, Some(shard.into()), resync)
    }

    fn start_with(
        client: Client,
        lease: Option<leader::Config>,
        shard: Option<String>,
        resync: Duration,
    ) -> Self {
        let stop = CancellationToken::new();
        let parts = Parts::new();
        let config = controller::Config {
            shard,
            resync,
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_secs(2),
            reconcile_timeout: Duration::from_secs(10),
            // Small pages, so that lists of a few objects already come in several.
            page_size: 4,
            ..controller::Config::default()
        };
        let task = tokio::spawn(run::reconcile_while_leading(
            client,
            config,
            lease,
            parts.clone(),
            stop.clone(),
        ));
        Self { stop, task, parts }
    }

    /// Stops the controller and releases the Lease.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("controller task");
    }
}
