//! The sharder: on the replica that holds the controller's Lease, keeps every MyApp on the
//! shard the ring of live shards gives it, one label change at a time as [`next_move`]
//! decides. It reads shard Leases and MyApps' metadata from two watches and writes only labels,
//! each write through its gate and expecting the version it decided on.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::{DRAIN_LABEL, LiveShards, Move, Ring, SHARD_LABEL, next_move};
use crate::{
    crd::MyApp,
    fence::Gate,
    metrics::{Metrics, ShardLabels},
    permission::Permission,
};

/// What sharding needs beyond the controller's and the election's permissions: the sharder
/// and a shard letting a MyApp go patch MyApps' labels, and the sharder lists and watches the
/// shard Leases in the operator's namespace (`deploy/sharding/` grants these).
pub const PERMISSIONS: &[Permission] = &[
    Permission::cluster("example.com", "myapps", "patch"),
    Permission::namespaced("coordination.k8s.io", "leases", "list"),
    Permission::namespaced("coordination.k8s.io", "leases", "watch"),
];

/// A MyApp as the sharder sees it: its metadata.
type AppMeta = PartialObjectMeta<MyApp>;

/// How often every MyApp is looked at again besides what the watches report: a label write
/// that failed is retried by the next pass.
const PASS_PERIOD: Duration = Duration::from_secs(30);

/// How many label writes a pass has in flight: a ring change moves about 1/n of the MyApps,
/// and the first pass after sharding is turned on labels every one.
const PASS_CONCURRENCY: usize = 16;

/// How often the shard gauges are recounted, when a MyApp changed since (a count reads every
/// MyApp's labels once).
const RECOUNT_PERIOD: Duration = Duration::from_secs(5);

/// Where the shard Leases are.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the shard Leases (the operator's own).
    pub namespace: String,
    /// The name every shard Lease starts with; the rest is its replica's identity.
    pub lease_prefix: String,
}

impl Config {
    /// The name of the shard Lease of the replica `identity`.
    pub fn lease_name(&self, identity: &str) -> String {
        format!("{}{identity}", self.lease_prefix)
    }
}

/// Assigns MyApps to shards until dropped (when the gate closes, the caller drops it). Each
/// label write counts as a `shard_move` write in `metrics`: the moves' own write budget.
pub async fn run(client: Client, config: Config, gate: Arc<Gate>, metrics: Arc<Metrics>) {
    let (apps, writer) = reflector::store::<AppMeta>();
    let app_events = watcher(
        Api::<AppMeta>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    // The sharder reads names, versions and labels: the managed fields and annotations (where
    // `kubectl apply` keeps a whole copy of the object) would be most of its cache.
    .modify(|app| {
        app.metadata.managed_fields = None;
        app.metadata.annotations = None;
    })
    .reflect(writer)
    .applied_objects();
    let lease_events = LiveShards::watch(client.clone(), &config.namespace);
    let mut sharder = Sharder {
        client,
        gate,
        metrics,
        shards: LiveShards::new(&config.lease_prefix),
        ring: Ring::default(),
    };
    tokio::pin!(app_events, lease_events);
    let mut pass = tokio::time::interval(PASS_PERIOD);
    let mut recount = tokio::time::interval(RECOUNT_PERIOD);
    // Whether a MyApp or the ring changed since the shard gauges were last set.
    let mut changed = true;
    loop {
        let expiry = sharder.shards.next_expiry(sharder.gate.now());
        let expired = async {
            match expiry {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = lease_events.next() => match event {
                Some(Ok(event)) => sharder.lease_event(event, &apps).await,
                Some(Err(error)) => warn!(%error, "Shard Lease watch failed"),
                None => return,
            },
            event = app_events.try_next() => match event {
                Ok(Some(app)) => {
                    sharder.look_at(&app).await;
                    changed = true;
                }
                Ok(None) => return,
                Err(error) => warn!(%error, "MyApp metadata watch failed"),
            },
            () = expired => sharder.membership_changed(&apps).await,
            _ = pass.tick() => sharder.pass(&apps).await,
            _ = recount.tick(), if changed && sharder.shards.listed() => {
                sharder.count(&apps.state());
                changed = false;
            }
        }
    }
}

struct Sharder {
    client: Client,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    shards: LiveShards,
    /// The live shards, rebuilt on every Lease event and expiry, and all a move decision reads
    /// of membership: a shard that expired a moment ago still counts until then, which only
    /// holds its MyApps back for that moment (a live holder is drained, never overruled).
    ring: Ring,
}

impl Sharder {
    async fn lease_event(&mut self, event: watcher::Event<Lease>, apps: &Store<AppMeta>) {
        if self.shards.event(event, self.gate.now()) {
            self.membership_changed(apps).await;
        }
    }

    /// Builds the ring again if the live shards changed, and then looks at every MyApp.
    async fn membership_changed(&mut self, apps: &Store<AppMeta>) {
        if !self.shards.listed() {
            return;
        }
        let live = self.shards.live(self.gate.now());
        if live.iter().copied().eq(self.ring.shards()) {
            return;
        }
        info!(shards = ?live, "Shard ring changed");
        self.ring = Ring::new(&live);
        self.metrics.shards.ring_changes.inc();
        self.count(&apps.state());
        self.pass(apps).await;
    }

    /// Looks at every MyApp cached, [`PASS_CONCURRENCY`] label writes at a time.
    async fn pass(&self, apps: &Store<AppMeta>) {
        futures::stream::iter(apps.state())
            .for_each_concurrent(PASS_CONCURRENCY, |app| async move {
                self.look_at(&app).await;
            })
            .await;
    }

    /// Sets the shard gauges from `apps` as they are now.
    fn count(&self, apps: &[Arc<AppMeta>]) {
        let mut on: std::collections::BTreeMap<&str, i64> =
            self.ring.shards().map(|shard| (shard, 0)).collect();
        let mut unassigned = 0;
        for app in apps {
            match app
                .labels()
                .get(SHARD_LABEL)
                .and_then(|s| on.get_mut(s.as_str()))
            {
                Some(count) => *count += 1,
                None => unassigned += 1,
            }
        }
        let gauges = &self.metrics.shards;
        // Shards that left drop out of the family rather than stay at their last count.
        gauges.objects.clear();
        for (shard, count) in on {
            let labels = ShardLabels {
                shard: shard.to_owned(),
            };
            gauges.objects.get_or_create(&labels).set(count);
        }
        gauges.unassigned.set(unassigned);
    }

    /// Writes the next label change `app` needs, if any.
    async fn look_at(&self, app: &AppMeta) {
        if !self.shards.listed() {
            return;
        }
        let (namespace, name) = (app.namespace().unwrap_or_default(), app.name_any());
        let Some(step) = next_move(&self.ring, &namespace, &name, app.labels()) else {
            return;
        };
        let labels = match &step {
            Move::Assign(shard) => json!({ SHARD_LABEL: shard, DRAIN_LABEL: null }),
            Move::Drain => json!({ DRAIN_LABEL: "true" }),
            Move::Keep => json!({ DRAIN_LABEL: null }),
        };
        let version = app.resource_version();
        let relabelled = relabel(
            &self.client,
            &self.gate,
            &namespace,
            &name,
            version.as_deref(),
            labels,
        );
        match relabelled.await {
            Ok(()) => {
                self.metrics.wrote("shard_move");
                debug!(%namespace, %name, ?step, "Moved");
            }
            // Changed since seen: its watch event brings it back here.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
            Err(error) => warn!(%namespace, %name, ?step, %error, "Shard label write failed"),
        }
    }
}

/// Changes the `labels` of the MyApp `namespace/name` (a label set to null is removed) in one
/// merge patch that expects `version`, once `gate` lets it through: the one write sharding
/// makes, by the sharder and by a shard letting a MyApp go. The answer is not read.
pub async fn relabel(
    client: &Client,
    gate: &Gate,
    namespace: &str,
    name: &str,
    version: Option<&str>,
    labels: Value,
) -> Result<(), kube::Error> {
    let patch = json!({ "metadata": { "resourceVersion": version, "labels": labels } });
    let request = kube::core::Request::new(MyApp::url_path(&(), Some(namespace)))
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .map_err(kube::Error::BuildRequest)?;
    let request = gate.pass(request, "patch")?;
    client.request_text(request).await?;
    Ok(())
}
