//! `run`: the operator in one process — webhook and admin servers on every replica, the
//! controller on the lease holder — and its shutdown sequence.

use std::{future::Future, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    Error,
    admin::{self, Health},
    admission::{self, AdmissionConfig},
    cli::{AdmissionArgs, ControllerArgs, RunArgs},
    controller,
    fence::{Gate, GateCollector},
    leader,
    metrics::Metrics,
    shard::{by_namespace, ranges::Ack, server_side, sharder, view::ShardView},
};

/// The `User-Agent` of every request the operator makes (kube sets none): the API server's
/// audit log and metrics tell the operator's requests from other clients' by it.
pub const USER_AGENT: &str = concat!("myapp-operator/", env!("CARGO_PKG_VERSION"));

/// A client for the cluster found the usual way (in-cluster config, then `KUBECONFIG`).
async fn client() -> Result<Client, Error> {
    let mut config = crate::kubeconfig::infer()
        .await
        .map_err(|source| Error::InferConfig {
            kubeconfig: std::env::var("KUBECONFIG").unwrap_or_else(|_| "unset".into()),
            source: Box::new(source),
        })?;
    crate::telemetry::set_api_server(&config.cluster_url.to_string());
    config.headers.push((
        axum::http::header::USER_AGENT,
        axum::http::HeaderValue::from_static(USER_AGENT),
    ));
    Client::try_from(config).map_err(Error::ConnectCluster)
}

/// Runs the operator until SIGTERM or Ctrl-C, then shuts down in order: readiness false ->
/// the webhook answers for the drain delay -> stops accepting and finishes in-flight requests
/// -> the controller stops gracefully -> the lease is released. A second signal cuts it short
/// and fails (requests may have been dropped).
pub async fn run(args: RunArgs) -> Result<(), Error> {
    // First of all: a SIGTERM in the first milliseconds must start a shutdown, not kill.
    let signals = Signals::install()?;
    let identity = args
        .leader
        .identity
        .clone()
        .unwrap_or_else(default_identity);
    // Flags first: a mistake in them is named before anything else can fail.
    let lease = if args.leader.leader_elect {
        Some(args.leader.lease(identity.clone())?)
    } else {
        None
    };
    let sharder = args.leader.sharder()?;
    let by_namespace = sharder
        .as_ref()
        .is_some_and(|s| s.by == sharder::By::Namespace);
    if by_namespace && !by_namespace::valid_identity(&identity) {
        return Err(Error::ShardIdentity(identity));
    }
    let client = client().await?;
    if by_namespace
        && !server_side::supported(&client)
            .await
            .map_err(Error::ShardSelectorProbe)?
    {
        return Err(Error::ShardSelectorUnsupported {
            api_server: crate::telemetry::api_server().to_owned(),
        });
    }
    let parts = Parts::new();

    let admin_listener = admin::bind(args.admin_addr).await?;
    info!(addr = %admin_listener.local_addr().map_err(Error::ServeAdmin)?, "Admin server listening");
    let stop_admin = CancellationToken::new();
    let admin_task = tokio::spawn(admin::serve(
        admin_listener,
        admin::router(parts.health.clone(), parts.registry.clone()),
        stop_admin.clone().cancelled_owned(),
    ));

    let mut admission = admission_config(&args.admission);
    // With sharding by label, the webhook labels a new MyApp for its shard from this replica's
    // own view of the ring. The task ends with the process.
    if let Some(sharder) = sharder.as_ref().filter(|_| !by_namespace) {
        let view = ShardView::default();
        admission.shards = Some(view.clone());
        tokio::spawn(view.follow(
            client.clone(),
            sharder.namespace.clone(),
            sharder.lease_prefix.clone(),
            parts.metrics.clone(),
        ));
    }

    let stop_webhook = CancellationToken::new();
    let mut config = webhook::ServerConfig::new(args.webhook.webhook_addr, &args.cert_dir);
    config.drain_delay = args.webhook.drain_delay;
    let server = webhook::serve(
        config,
        admission::router(admission),
        parts.webhook_metrics.clone(),
        stop_webhook.clone().cancelled_owned(),
    )
    .await
    .map_err(Error::StartWebhook)?;
    server.warm_up().await.map_err(Error::StartWebhook)?;
    parts.health.set_webhook_serving(server.certs().clone());
    info!(addr = %server.local_addr(), "Webhook serving");

    let stop_controller = CancellationToken::new();
    let config = controller_config(&args.controller, Some(identity));
    let controller_task = match (lease, sharder) {
        (Some(lease), Some(sharder)) => {
            info!(lease = %sharder.lease_name(&lease.identity), "Sharding: reconciling this replica's shard");
            tokio::spawn(shard_while_leading(
                client,
                config,
                lease,
                sharder,
                parts.clone(),
                stop_controller.clone(),
            ))
        }
        (lease, _) => tokio::spawn(reconcile_while_leading(
            client,
            config,
            lease,
            parts.clone(),
            stop_controller.clone(),
        )),
    };

    let shutdown = async {
        signals.first().await;
        info!("Shutting down: readiness off, draining webhook");
        parts.health.set_shutting_down();
        stop_webhook.cancel();
        if let Err(error) = server.wait().await {
            warn!(%error, "Webhook server ended with an error");
        }
        info!("Webhook drained; stopping the controller");
        stop_controller.cancel();
        if let Err(error) = controller_task.await {
            warn!(%error, "Controller task failed");
        }
        stop_admin.cancel();
        let _ = admin_task.await;
        info!("Stopped");
    };
    tokio::select! {
        () = shutdown => Ok(()),
        () = signals.second() => {
            warn!("Second signal: exiting at once");
            Err(Error::ForcedShutdown)
        }
    }
}

/// What the servers and the controller share.
#[derive(Clone)]
pub struct Parts {
    /// Readiness state.
    pub health: Arc<Health>,
    /// Controller metrics.
    pub metrics: Arc<Metrics>,
    /// The write gate of the controller's Lease: open while this replica may write.
    pub gate: Arc<Gate>,
    /// Webhook metrics.
    pub webhook_metrics: webhook::Metrics,
    /// The registry `/metrics` encodes (controller and webhook metrics).
    pub registry: Arc<Registry>,
}

impl Parts {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let gate = Arc::new(Gate::boot_clock());
        registry
            .sub_registry_with_prefix(crate::metrics::PREFIX)
            .register_collector(Box::new(GateCollector(gate.clone())));
        let webhook_metrics = webhook::Metrics::new();
        webhook_metrics.declare_route(crate::admission::VALIDATE_PATH, false);
        webhook_metrics.declare_route(crate::admission::MUTATE_PATH, true);
        // One prefix for the whole process: the webhook's series become `myapp_webhook_*`.
        webhook_metrics.register(registry.sub_registry_with_prefix(crate::metrics::PREFIX));
        Self {
            health: Arc::new(Health::default()),
            metrics,
            gate,
            webhook_metrics,
            registry: Arc::new(registry),
        }
    }
}

impl Default for Parts {
    fn default() -> Self {
        Self::new()
    }
}

/// The webhook rules' configuration from the flags.
pub fn admission_config(args: &AdmissionArgs) -> AdmissionConfig {
    AdmissionConfig {
        max_replicas: args.max_replicas,
        default_env: args.default_env.clone(),
        shards: None,
    }
}

/// The controller's configuration from the flags.
pub fn controller_config(args: &ControllerArgs, instance: Option<String>) -> controller::Config {
    controller::Config {
        concurrency: args.concurrency,
        resync: args.resync,
        reconcile_timeout: args.reconcile_timeout,
        page_size: args.list_page_size,
        instance,
        ..controller::Config::default()
    }
}

/// Runs the controller whenever this replica leads (always, without a `lease`), until `stop`
/// is cancelled. The controller writes only through `parts.gate`; when the gate closes (the
/// lease lost, or its deadline passed in a pause) the controller is dropped at once, in-flight
/// reconciles with it, without waiting for the election to read the Lease. `stop` shuts it
/// down gracefully instead.
pub async fn reconcile_while_leading(
    client: Client,
    config: controller::Config,
    lease: Option<leader::Config>,
    parts: Parts,
    stop: CancellationToken,
) {
    let gate = parts.gate.clone();
    let reconcile = reconcile_whenever_open(&client, &config, &parts, &stop);
    elect_beside(client.clone(), lease, gate, reconcile).await;
}

/// Runs `work` beside the election of `lease`, which keeps `gate` open while this replica
/// holds it (open for good without a `lease`); the election ends with `work`.
async fn elect_beside(
    client: Client,
    lease: Option<leader::Config>,
    gate: Arc<Gate>,
    work: impl Future<Output = ()>,
) {
    let stop_election = CancellationToken::new();
    if lease.is_none() {
        gate.open_always();
    }
    // In this task, not a task of its own: whatever ends this one (a panic in a reconcile, an
    // abort) ends the renewals with it, so the Lease expires and another replica takes over,
    // instead of this replica holding it with nothing reconciling.
    let election = async {
        if let Some(lease) = lease {
            leader::run(
                client,
                lease,
                gate.clone(),
                stop_election.clone().cancelled_owned(),
            )
            .await;
        }
    };
    let work = async {
        work.await;
        stop_election.cancel();
    };
    tokio::join!(election, work);
    if gate.remaining() == Some(std::time::Duration::MAX) {
        gate.close();
    }
}

/// Runs the controller each time the gate opens, until `stop` is cancelled.
async fn reconcile_whenever_open(
    client: &Client,
    config: &controller::Config,
    parts: &Parts,
    stop: &CancellationToken,
) {
    let gate = &parts.gate;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = gate.opened() => {}
        }
        let tenure = gate.tenure();
        let graceful = stop.clone().cancelled_owned();
        let controller = controller::run(
            client.clone(),
            config.clone(),
            parts.metrics.clone(),
            gate.clone(),
            graceful,
            mark_synced(parts),
        );
        // In-flight reconciles get their deadline to finish. Reconciles wait for every
        // cache's first list before they read or write, so a controller whose caches never
        // synced (API unreachable, a list forbidden) has nothing in flight: it stops at once
        // instead of waiting for reconciles that would wait forever.
        let synced = parts.metrics.caches_synced.clone();
        let overdue = async {
            stop.cancelled().await;
            if synced.get() == 0 {
                info!("Caches never synced: stopped without waiting for reconciles");
                return;
            }
            tokio::time::sleep(config.reconcile_timeout).await;
            warn!("Controller did not stop within the reconcile deadline: dropped it");
        };
        tokio::select! {
            () = controller => {}
            () = gate.left(tenure) => warn!("Lost the lease: stopped reconciling"),
            () = overdue => {}
        }
        parts.metrics.caches_synced.set(0);
        if stop.is_cancelled() {
            break;
        }
    }
}

/// Sharding on: this replica reconciles its own shard while it holds a shard Lease of its own
/// (its gate in `parts`), and, while it holds the controller's Lease (`lease`), runs the
/// sharder that places MyApps on the live shards. Until `stop` is cancelled.
pub async fn shard_while_leading(
    client: Client,
    mut config: controller::Config,
    lease: leader::Config,
    sharder: sharder::Config,
    parts: Parts,
    stop: CancellationToken,
) {
    let shard_lease = leader::Config {
        name: sharder.lease_name(&lease.identity),
        ..lease.clone()
    };
    let metrics = parts.metrics.clone();
    let identity = lease.identity.clone();
    let shard = async {
        match sharder.by {
            sharder::By::Label => {
                config.shard = Some(identity);
                let shard_lease = Some(shard_lease);
                reconcile_while_leading(client.clone(), config, shard_lease, parts, stop.clone())
                    .await;
            }
            sharder::By::Namespace => {
                let gate = parts.gate.clone();
                let reconcile = reconcile_ranges_whenever_open(
                    &client, &config, &parts, &stop, &sharder, &identity,
                );
                elect_beside(client.clone(), Some(shard_lease), gate, reconcile).await;
            }
        }
    };

    let gate = Arc::new(Gate::boot_clock());
    let stop_election = CancellationToken::new();
    let election = leader::run(
        client.clone(),
        lease,
        gate.clone(),
        stop_election.clone().cancelled_owned(),
    );
    let gauges = &metrics.shards;
    gauges.enabled.set(1);
    let assign = async {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = gate.opened() => {}
            }
            gauges.sharder.set(1);
            let stopped = tokio::select! {
                () = assign(client.clone(), sharder.clone(), gate.clone(), metrics.clone()) => false,
                () = gate.closed() => {
                    warn!("Lost the lease: stopped assigning shards");
                    false
                }
                () = stop.cancelled() => true,
            };
            // Only the sharder's count is current: a former one's would raise alerts.
            gauges.sharder.set(0);
            gauges.unassigned.set(0);
            if stopped {
                break;
            }
        }
        stop_election.cancel();
    };
    tokio::join!(shard, election, assign);
}

/// The sharder of `config.by`.
async fn assign(client: Client, config: sharder::Config, gate: Arc<Gate>, metrics: Arc<Metrics>) {
    match config.by {
        sharder::By::Label => sharder::run(client, config, gate, metrics).await,
        sharder::By::Namespace => by_namespace::assign(client, config, gate, metrics).await,
    }
}

/// A controller running on some namespace ranges, and the token that stops it gracefully.
struct OnRanges {
    controller: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    graceful: CancellationToken,
}

/// Sharding by namespace: each time the gate opens, learns the term it holds its shard Lease
/// in, then follows the record of namespace ranges and runs the controller on the ranges the
/// newest assignment gives this replica in that term, acknowledging each assignment once it
/// serves nothing else. A change of ranges stops the controller gracefully (in-flight reconciles
/// finish) before the ack and before it starts again on the new ranges; a closed gate drops it
/// at once. Until `stop` is cancelled.
async fn reconcile_ranges_whenever_open(
    client: &Client,
    config: &controller::Config,
    parts: &Parts,
    stop: &CancellationToken,
    sharder: &sharder::Config,
    identity: &str,
) {
    let gate = &parts.gate;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = gate.opened() => {}
        }
        // Everything below belongs to this tenure of the shard Lease: leaving it (a lapse,
        // even one renewed before anything saw the gate closed) ends it all.
        let tenure = gate.tenure();
        let term = match by_namespace::own_term(client, sharder, identity).await {
            Ok(term) if gate.holds(tenure) => term,
            Ok(_) => continue,
            Err(error) => {
                warn!(%error, "Reading this replica's shard Lease failed");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        info!(%term, "Holding the shard Lease: following the namespace ranges");
        let records = by_namespace::follow_record(client.clone(), sharder);
        tokio::pin!(records);
        let mut serving: Vec<crate::shard::ranges::Range> = Vec::new();
        // The newest assignment acted on: its record's uid (a record deleted and written again
        // starts over at generation 0) and generation.
        let mut newest: (Option<String>, u64) = (None, 0);
        let mut running: Option<OnRanges> = None;
        // The record whose assignment is not acknowledged yet, after a write that failed.
        let mut unacknowledged: Option<Lease> = None;
        let graceful = loop {
            let controller = async {
                match &mut running {
                    Some(on) => (&mut on.controller).await,
                    None => std::future::pending().await,
                }
            };
            let retry_ack = async {
                match &unacknowledged {
                    Some(_) => tokio::time::sleep(ACK_RETRY).await,
                    None => std::future::pending().await,
                }
            };
            let record = tokio::select! {
                () = stop.cancelled() => break true,
                () = retry_ack => unacknowledged.take().expect("a record to acknowledge"),
                () = gate.left(tenure) => {
                    warn!("Lost the shard Lease: stopped reconciling");
                    break false;
                }
                () = controller => {
                    warn!("The controller on this shard's ranges ended");
                    break false;
                }
                record = records.next() => match record {
                    Some(Ok(record)) => record,
                    Some(Err(error)) => {
                        warn!(%error, "Watch of the namespace ranges failed");
                        continue;
                    }
                    None => break false,
                },
            };
            let assignment = by_namespace::assignment_of(&record);
            let uid = record.metadata.uid.clone();
            if uid == newest.0 && assignment.generation < newest.1 {
                continue;
            }
            newest = (uid, assignment.generation);
            let mine = assignment.ranges_of(identity, &term);
            if mine != serving {
                if let Some(on) = running.take()
                    && !stop_gracefully(on, config, parts, tenure).await
                {
                    break false;
                }
                if !gate.holds(tenure) {
                    break false;
                }
                serving = mine.to_vec();
                parts.metrics.shards.ring_changes.inc();
                info!(
                    generation = assignment.generation,
                    ranges = serving.len(),
                    "Namespace ranges changed"
                );
                running =
                    (!serving.is_empty()).then(|| on_ranges(client, config, parts, stop, &serving));
            }
            if !gate.holds(tenure) {
                break false;
            }
            let ack = Ack {
                term: term.clone(),
                generation: assignment.generation,
            };
            let acknowledged =
                by_namespace::acknowledge(client, gate, sharder, &record, identity, &ack).await;
            unacknowledged = match acknowledged {
                Ok(()) => None,
                Err(error) => {
                    warn!(%error, "Acknowledging the namespace ranges failed: retrying");
                    Some(record)
                }
            };
        };
        if let Some(on) = running.take()
            && graceful
        {
            stop_gracefully(on, config, parts, tenure).await;
        }
        parts.metrics.caches_synced.set(0);
        if stop.is_cancelled() {
            break;
        }
    }
}

/// How long a shard waits to acknowledge again after the write failed: the sharder gives
/// nothing away until it does.
const ACK_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// What the controller calls once its caches synced. One function for every caller, so that
/// the controller's code is built once.
fn mark_synced(parts: &Parts) -> impl FnOnce() + Send + 'static {
    let metrics = parts.metrics.clone();
    move || {
        metrics.caches_synced.set(1);
    }
}

/// The controller on `ranges`: every list and watch it makes carries their `shardSelector`.
fn on_ranges(
    client: &Client,
    config: &controller::Config,
    parts: &Parts,
    stop: &CancellationToken,
    ranges: &[crate::shard::ranges::Range],
) -> OnRanges {
    let graceful = stop.child_token();
    let controller = controller::run(
        server_side::selecting(client.clone(), ranges),
        config.clone(),
        parts.metrics.clone(),
        parts.gate.clone(),
        graceful.clone().cancelled_owned(),
        mark_synced(parts),
    );
    OnRanges {
        controller: Box::pin(controller),
        graceful,
    }
}

/// Stops `on` gracefully: its in-flight reconciles get their deadline to finish (a reconcile
/// may start before every cache has synced, so the deadline holds whether they have or not).
/// One that overruns it is dropped, and so is everything the moment the gate leaves `tenure`;
/// a request of theirs already sent may still reach the API server, where the resourceVersion
/// preconditions refuse what the next holder of the namespaces changed. Whether the gate still
/// holds in `tenure`.
async fn stop_gracefully(
    on: OnRanges,
    config: &controller::Config,
    parts: &Parts,
    tenure: u64,
) -> bool {
    on.graceful.cancel();
    let gate = &parts.gate;
    tokio::select! {
        () = on.controller => {}
        () = tokio::time::sleep(config.reconcile_timeout) => {
            warn!("Controller did not stop within the reconcile deadline: dropped it");
        }
        () = gate.left(tenure) => {}
    }
    parts.metrics.caches_synced.set(0);
    gate.holds(tenure)
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "myapp-operator".into());
    format!("{host}-{}", std::process::id())
}

/// SIGTERM and Ctrl-C: the first starts the graceful shutdown, the second cuts it short.
struct Signals {
    first: CancellationToken,
    second: CancellationToken,
}

impl Signals {
    fn install() -> Result<Self, Error> {
        let first = CancellationToken::new();
        let second = CancellationToken::new();
        #[cfg(unix)]
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(Error::InstallSignalHandler)?;
        let (f, s) = (first.clone(), second.clone());
        tokio::spawn(async move {
            for token in [f, s] {
                #[cfg(unix)]
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                #[cfg(not(unix))]
                let _ = tokio::signal::ctrl_c().await;
                token.cancel();
            }
        });
        Ok(Self { first, second })
    }

    fn first(&self) -> impl Future<Output = ()> + '_ {
        self.first.cancelled()
    }

    fn second(&self) -> impl Future<Output = ()> + '_ {
        self.second.cancelled()
    }
}
