//! The controller half of the operator, started in-process the way `run` starts it (leader
//! election included), with retries quick enough for tests.
#![allow(dead_code)]

use std::time::Duration;

use kube::Client;
use myapp_operator::{
    cli::LeaderArgs,
    controller,
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
        let stop = CancellationToken::new();
        let parts = Parts::new();
        let leader = LeaderArgs {
            leader_elect: elect,
            lease_name: "myapp-operator".into(),
            lease_namespace: "myapp-system".into(),
            identity: Some(identity.into()),
        };
        let config = controller::Config {
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
            leader,
            identity.into(),
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
