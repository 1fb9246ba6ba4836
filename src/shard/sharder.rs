//! The sharder: on the replica that holds the controller's Lease, keeps every MyApp on the
//! shard the ring of live shards gives it, one label change at a time as [`next_move`]
//! decides. It follows the shard Leases and the MyApps on no live shard, lists every MyApp's
//! metadata when the ring changes, and writes only labels, each write through its gate and
//! expecting the version it decided on.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::{DRAIN_LABEL, LiveShards, Move, Ring, SHARD_LABEL, live::is_stale, next_move};
use crate::{crd::MyApp, fence::Gate, metrics::Metrics, permission::Permission};

/// What sharding needs beyond the controller's and the election's permissions: the sharder
/// and a shard letting a MyApp go patch MyApps' labels, and the sharder lists and watches the
/// shard Leases in the operator's namespace and deletes those of gone replicas
/// (`deploy/sharding/` grants these).
pub const PERMISSIONS: &[Permission] = &[
    Permission::cluster("example.com", "myapps", "patch"),
    Permission::namespaced("coordination.k8s.io", "leases", "list"),
    Permission::namespaced("coordination.k8s.io", "leases", "watch"),
    Permission::namespaced("coordination.k8s.io", "leases", "delete"),
];

/// A MyApp as the sharder sees it: its metadata.
type AppMeta = PartialObjectMeta<MyApp>;

/// How often every MyApp is listed and looked at (besides every ring change): a drain whose
/// write failed is retried.
const PASS_PERIOD: Duration = Duration::from_secs(300);

/// How often the MyApps on no live shard are looked at again: an assignment whose write
/// failed is retried.
const RETRY_PERIOD: Duration = Duration::from_secs(30);

/// MyApps per page of a pass's list: one page is held at a time.
const PAGE: u32 = 500;

/// How many label writes a pass has in flight: a ring change moves about 1/n of the MyApps,
/// and the first pass after sharding is turned on labels every one.
const PASS_CONCURRENCY: usize = 16;

/// Where the shard Leases are, and how MyApps are spread over the shards.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the shard Leases (the operator's own).
    pub namespace: String,
    /// The name every shard Lease starts with; the rest is its replica's identity.
    pub lease_prefix: String,
    /// How a shard's MyApps are told from the others'.
    pub by: By,
    /// Sharding by namespace: the Lease whose annotations record who serves which ranges.
    pub record: String,
    /// How long a sharder by label that has just started waits before it gives MyApps to
    /// shards: the lease duration, in which replicas starting beside it take their shard
    /// Leases. Without it, when every replica starts at once the first sharder gives
    /// everything to the one shard it sees and then moves most of it back. A shard that dies
    /// meanwhile loses nothing sooner for it: its Lease counts as live for a lease duration
    /// after the sharder first sees it anyway.
    pub settle: Duration,
}

/// How a shard's MyApps are told from the others'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// A label on each MyApp and its children, set by the webhook and the sharder; the API
    /// server selects each shard's objects by label. Works on every cluster; balances by
    /// MyApp.
    #[default]
    Label,
    /// Ranges of the namespace's hash, filtered by the API server (KEP-5866's
    /// `shardSelector`, alpha in Kubernetes 1.36 behind its feature gate): no label writes at
    /// all, but a namespace is never split over shards.
    Namespace,
}

impl Config {
    /// The name of the shard Lease of the replica `identity`.
    pub fn lease_name(&self, identity: &str) -> String {
        format!("{}{identity}", self.lease_prefix)
    }
}

/// The watch of the MyApps on no live shard, for one ring: selected by the server with
/// `<shard label> notin (<live shards>)`, which also selects MyApps without the label. At
/// rest it holds nothing; a MyApp the webhook could not label, or one its shard let go of,
/// arrives here, and leaves once labelled for a live shard.
struct Unplaced {
    events: std::pin::Pin<Box<dyn futures::Stream<Item = Result<AppMeta, watcher::Error>> + Send>>,
    store: Store<AppMeta>,
}

impl Unplaced {
    fn watch(client: &Client, ring: &Ring) -> Option<Self> {
        if ring.is_empty() {
            return None;
        }
        let live: Vec<&str> = ring.shards().collect();
        let selector = format!("{SHARD_LABEL} notin ({})", live.join(","));
        let (store, writer) = reflector::store::<AppMeta>();
        let events = watcher(
            Api::<AppMeta>::all(client.clone()),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff()
        // Names, versions and labels are all the sharder reads.
        .modify(|app| {
            app.metadata.managed_fields = None;
            app.metadata.annotations = None;
        })
        .reflect(writer)
        .applied_objects();
        Some(Self {
            events: Box::pin(events),
            store,
        })
    }
}

/// Assigns MyApps to shards until dropped (when the gate closes, the caller drops it). Each
/// label write counts as a `shard_move` write in `metrics`: the moves' own write budget.
///
/// It holds no copy of the MyApps: new MyApps are labelled by the webhook, and the sharder
/// watches only those on no live shard. A ring change, and a pass every [`PASS_PERIOD`], list
/// every MyApp's metadata a page at a time to drain those whose shard the ring changed.
pub async fn run(client: Client, config: Config, gate: Arc<Gate>, metrics: Arc<Metrics>) {
    let lease_events = LiveShards::watch(client.clone(), &config.namespace);
    let settling = tokio::time::sleep(config.settle);
    tokio::pin!(settling);
    let mut sharder = Sharder {
        client,
        gate,
        metrics,
        shards: LiveShards::new(&config.lease_prefix),
        ring: Ring::default(),
        assigning: config.settle.is_zero(),
        config,
    };
    let mut unplaced: Option<Unplaced> = None;
    tokio::pin!(lease_events);
    let mut pass = tokio::time::interval(PASS_PERIOD);
    pass.reset();
    let mut retry = tokio::time::interval(RETRY_PERIOD);
    loop {
        let expired = sharder.shards.expired(sharder.gate.now());
        let next_unplaced = async {
            match &mut unplaced {
                Some(unplaced) => unplaced.events.try_next().await,
                None => std::future::pending().await,
            }
        };
        let step = tokio::select! {
            event = lease_events.next() => match event {
                Some(Ok(event)) => Step::Leases(Some(event)),
                Some(Err(error)) => {
                    warn!(%error, "Shard Lease watch failed");
                    continue;
                }
                None => return,
            },
            () = expired => Step::Leases(None),
            event = next_unplaced => match event {
                Ok(Some(app)) => Step::Unplaced(app),
                Ok(None) => return,
                Err(error) => {
                    warn!(%error, "Watch of the MyApps on no live shard failed");
                    continue;
                }
            },
            _ = pass.tick() => Step::Pass,
            _ = retry.tick() => Step::Retry,
            // What settling held back is what the watch of the MyApps on no live shard holds:
            // no pass over every MyApp for it.
            () = &mut settling, if !sharder.assigning => {
                sharder.assigning = true;
                Step::Retry
            }
        };
        match step {
            Step::Leases(event) => {
                if let Some(event) = event
                    && !sharder
                        .shards
                        .event(event, sharder.gate.now(), Timestamp::now())
                {
                    continue;
                }
                if sharder.ring_changed() {
                    unplaced = Unplaced::watch(&sharder.client, &sharder.ring);
                    sharder.pass().await;
                }
            }
            Step::Unplaced(app) => sharder.look_at(&app).await,
            Step::Pass => sharder.pass().await,
            Step::Retry => {
                let stuck = unplaced.as_ref().map(|u| u.store.state());
                for app in stuck.into_iter().flatten() {
                    sharder.look_at(&app).await;
                }
            }
        }
        let left = unplaced.as_ref().map_or(0, |u| u.store.len());
        sharder.metrics.shards.unassigned.set(left as i64);
    }
}

/// What woke the sharder.
enum Step {
    /// A shard Lease event, or (none) the expiry of a live shard.
    Leases(Option<watcher::Event<Lease>>),
    /// A MyApp on no live shard.
    Unplaced(AppMeta),
    /// Time for a pass over every MyApp.
    Pass,
    /// Time to look at the MyApps on no live shard again (after a failed write, or once
    /// settling ends).
    Retry,
}

struct Sharder {
    client: Client,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    config: Config,
    shards: LiveShards,
    /// The live shards, rebuilt on every Lease event and expiry, and all a move decision reads
    /// of membership: a shard that expired a moment ago still counts until then, which only
    /// holds its MyApps back for that moment (a live holder is drained, never overruled).
    ring: Ring,
    /// Whether it gives MyApps to shards yet ([`Config::settle`]); drains go on meanwhile.
    assigning: bool,
}

impl Sharder {
    /// Builds the ring again if the live shards changed; whether they did.
    fn ring_changed(&mut self) -> bool {
        if !self.shards.listed() {
            return false;
        }
        let live = self.shards.live(self.gate.now());
        if live.iter().copied().eq(self.ring.shards()) {
            return false;
        }
        info!(shards = ?live, "Shard ring changed");
        self.ring = Ring::new(&live);
        true
    }

    /// Lists every MyApp's metadata a page at a time and makes each one's next label change,
    /// [`PASS_CONCURRENCY`] writes at a time.
    async fn pass(&self) {
        forget_gone_shards(&self.client, &self.gate, &self.config).await;
        if self.ring.is_empty() {
            return;
        }
        let api = Api::<MyApp>::all(self.client.clone());
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = match api.list_metadata(&params).await {
                Ok(page) => page,
                Err(error) => {
                    warn!(%error, "Listing the MyApps for a shard pass failed: retried at the next");
                    return;
                }
            };
            futures::stream::iter(&page.items)
                .for_each_concurrent(PASS_CONCURRENCY, |app| self.look_at(app))
                .await;
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }

    /// Writes the next label change `app` needs, if any.
    async fn look_at(&self, app: &AppMeta) {
        let (namespace, name) = (app.namespace().unwrap_or_default(), app.name_any());
        let Some(step) = next_move(&self.ring, &namespace, &name, app.labels()) else {
            return;
        };
        if matches!(step, Move::Assign(_)) && !self.assigning {
            return;
        }
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
            // Changed since seen: the watch of unplaced MyApps, or the next pass, brings it back.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
            Err(error) => warn!(%namespace, %name, ?step, %error, "Shard label write failed"),
        }
    }
}

/// Deletes the shard Leases nobody has renewed for an hour ([`super::live::STALE_AFTER`]):
/// each replica's Lease is named after its pod, so every restart leaves one behind. Such a
/// shard is long out of the ring; a replica that comes back creates its Lease again.
pub async fn forget_gone_shards(client: &Client, gate: &Gate, config: &Config) {
    let api = Api::<Lease>::namespaced(client.clone(), &config.namespace);
    let leases = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) => {
            warn!(%error, "Listing the shard Leases to forget gone ones failed");
            return;
        }
    };
    let now = Timestamp::now();
    for lease in leases {
        let name = lease.name_any();
        if !name.starts_with(&config.lease_prefix) || !is_stale(&lease, now) {
            continue;
        }
        // Only this version: a replica that renewed it since keeps it.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.resource_version(),
                uid: lease.uid(),
            }),
            ..DeleteParams::default()
        };
        let deleted = async {
            let request = kube::core::Request::new(Lease::url_path(&(), Some(&config.namespace)))
                .delete(&name, &params)
                .map_err(kube::Error::BuildRequest)?;
            let request = gate.pass(request, "delete")?;
            client.request_text(request).await
        };
        match deleted.await {
            Ok(_) => info!(lease = %name, "Deleted a shard Lease nobody renewed for an hour"),
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
            Err(error) => warn!(lease = %name, %error, "Deleting a shard Lease failed"),
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
