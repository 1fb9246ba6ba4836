//! A replica's own view of the ring, for the webhook: it labels a MyApp being created with the
//! shard the ring of live shards gives it, so that a new MyApp needs no label write by the
//! sharder. Every replica follows the shard Leases for it; a view that is stale or not built
//! yet is harmless, as the sharder moves a MyApp the webhook placed on a shard that is not
//! the ring's with the same handshake as any other.

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use tracing::{debug, warn};

use super::{live::LiveShards, ring::Ring};
use crate::{
    fence::{BootClock, Clock},
    metrics::Metrics,
};

/// The ring as this replica last saw the shard Leases; none until they were listed once.
#[derive(Clone, Debug, Default)]
pub struct ShardView(Arc<RwLock<Option<Ring>>>);

/// A view that holds `ring` until [`ShardView::follow`] replaces it.
impl From<Ring> for ShardView {
    fn from(ring: Ring) -> Self {
        Self(Arc::new(RwLock::new(Some(ring))))
    }
}

/// Two views are equal when they are the same view.
impl PartialEq for ShardView {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ShardView {}

impl ShardView {
    /// The live shard the MyApp `namespace/name` belongs on, if the ring is known and not
    /// empty.
    pub fn shard_for(&self, namespace: &str, name: &str) -> Option<String> {
        let ring = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ring.as_ref()?.shard_for(namespace, name).map(str::to_owned)
    }

    fn set(&self, ring: Ring) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(ring);
    }

    /// Keeps the view equal to the ring of the live holders of the Leases in `namespace`
    /// whose name starts with `prefix`, until dropped; counts each change in `metrics`.
    pub async fn follow(
        self,
        client: kube::Client,
        namespace: String,
        prefix: String,
        metrics: Arc<Metrics>,
    ) {
        let clock = BootClock;
        let mut shards = LiveShards::new(&prefix);
        let events = LiveShards::watch(client, &namespace);
        tokio::pin!(events);
        let mut current: Option<Vec<String>> = None;
        loop {
            let expired = shards.expired(clock.now());
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        if !shards.event(event, clock.now(), Timestamp::now()) {
                            continue;
                        }
                    }
                    Some(Err(error)) => {
                        warn!(%error, "Shard Lease watch failed (the webhook's view of the ring)");
                        continue;
                    }
                    None => return,
                },
                () = expired => {}
            }
            let live: Vec<String> = shards
                .live(clock.now())
                .into_iter()
                .map(str::to_owned)
                .collect();
            if current.as_ref() != Some(&live) {
                debug!(shards = ?live, "The webhook's view of the ring changed");
                self.set(Ring::new(&live));
                metrics.shards.ring_changes.inc();
                current = Some(live);
            }
        }
    }
}
