//! The controller: watch MyApps and their children, reconcile each MyApp by its plan, back off
//! on errors. The files beside this one hold what every reconcile shares (`context`), the
//! watches' side (`watches`), one reconcile carried out (`execute`), each write through the
//! gate (`write`), the retry policy (`retry`), the Events (`events`), and what the controller
//! says while the CRD is missing (`crd_missing`).

mod child;
mod context;
mod crd_missing;
mod events;
mod execute;
mod resync;
mod retry;
mod verified;
mod watches;
mod write;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures::{Future, StreamExt, TryStreamExt, future};
use kube::{
    Api, Client, ResourceExt,
    runtime::{Controller, WatchStreamExt, controller, events::Reporter, reflector, watcher},
};
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

pub use context::{Config, DEFAULT_CONCURRENCY};
pub use execute::REPLICAS_HANDOFF_MANAGER;
pub use retry::STATUS_FORBIDDEN_FIX;

use crate::{
    cache::{CachedDeployment, CachedMyApp, CachedService},
    fence::Gate,
    fight,
    metrics::Metrics,
    packed,
    permission::Permission,
    plan::{PENDING_GRACE, RECREATE_HOLD},
    recent::{RecentWrites, Waiting},
    resources::FIELD_MANAGER,
    shard::SHARD_LABEL,
};
use context::{Child, Context, Failures, Listed, PUBLISH_AT_STOP, RECENT_WRITES_TTL};
use watches::{
    EachWatchBacksOff, count_orphans, forget_seen_status, needs_reconcile, not_an_echo,
    on_list_done, queue_owner, queue_self, reflect_in_place, remember_deleted,
};
use write::Writer;

/// Every permission the controller's calls need: the watches (list, watch), the server-side
/// applies of children (patch, and create when the apply creates), the status apply, Events.
/// No get: the controller reads from its watch caches, and the one read a fight makes (its
/// Deployment's managedFields, which the caches strip) is a list by name.
pub const PERMISSIONS: &[Permission] = &[
    Permission::cluster("example.com", "myapps", "list"),
    Permission::cluster("example.com", "myapps", "watch"),
    Permission::cluster("example.com", "myapps/status", "patch"),
    Permission::cluster("apps", "deployments", "list"),
    Permission::cluster("apps", "deployments", "watch"),
    Permission::cluster("apps", "deployments", "create"),
    Permission::cluster("apps", "deployments", "patch"),
    Permission::cluster("", "services", "list"),
    Permission::cluster("", "services", "watch"),
    Permission::cluster("", "services", "create"),
    Permission::cluster("", "services", "patch"),
    Permission::cluster("events.k8s.io", "events", "create"),
];

/// Runs the controller until `shutdown` resolves, then lets in-flight reconciles finish.
///
/// `ready` is called once every watch cache has synced, before `Caches synced` is logged.
pub async fn run(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    gate: Arc<Gate>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ready: impl FnOnce() + Send + 'static,
) {
    let mut watch_config = watcher::Config::default().page_size(config.page_size);
    let mut children = format!("app.kubernetes.io/managed-by={FIELD_MANAGER}");
    if let Some(shard) = &config.shard {
        watch_config = watch_config.labels(&format!("{SHARD_LABEL}={shard}"));
        children = format!("{children},{SHARD_LABEL}={shard}");
    }
    let children_config = watch_config.clone().labels(&children);

    // A relist updates each cache in place and drops at its end (`InitDone`) what the list did
    // not hold (`reflect_in_place`, `packed.rs`). Reconciles its pages trigger run before that end,
    // and nothing says what changed or vanished while the watch was down, so every MyApp is
    // reconciled again once any cache has taken in a whole new list.
    let (listed, relists) = futures::channel::mpsc::unbounded::<()>();

    let (apps_listed, deployments_listed, services_listed) =
        (Listed::default(), Listed::default(), Listed::default());

    let queue = metrics.queue.clone();
    let applied = Arc::new(RecentWrites::new(RECENT_WRITES_TTL));
    let reported = Arc::new(RecentWrites::new(RECENT_WRITES_TTL));
    let (apps, apps_writer) = reflector::store::<CachedMyApp>();
    let _held = HeldCount::new(&metrics, &apps);
    let failures = Arc::new(Failures::default());
    let verified = Arc::new(verified::Verified::default());
    let crd = crd_missing::CrdPresence::new(metrics.clone());
    // A MyApp the sharder hands to this shard enters its watch as a change like any other, and
    // one whose status reports its generation triggers nothing by itself: that the cache does
    // not hold it yet is what says it is new here.
    let entering = Arc::new(AtomicBool::new(false));
    let mut note_entering = config
        .shard
        .is_some()
        .then(|| watches::note_entering(apps.clone(), entering.clone()));
    let app_events = watcher(Api::<CachedMyApp>::all(client.clone()), watch_config)
        .inspect({
            let crd = crd.clone();
            move |item| crd.observe(item)
        })
        .backoff(crd_missing::QuietBackoff::new(crd))
        .inspect_ok(move |event| {
            if let Some(note) = &mut note_entering {
                note(event);
            }
        })
        .inspect_ok(reflect_in_place(apps_writer))
        .inspect_ok(count_orphans(&applied, &metrics))
        .inspect_ok(on_list_done(&listed, &apps_listed))
        .inspect_ok(forget_seen_status(&reported))
        .inspect_ok(failures.forget_deleted(apps.clone()))
        .inspect_ok(verified.forget_deleted(apps.clone()))
        .try_filter(move |event| {
            let entering = entering.swap(false, Ordering::Relaxed);
            future::ready(entering || needs_reconcile(event))
        })
        .applied_objects()
        .inspect_ok(queue_self(&queue));

    let deleted = Arc::new(Waiting::new(RECREATE_HOLD));
    let (deployments, mut deployments_writer) = packed::packed::<CachedDeployment>();
    let deployment_events = watcher(
        Api::<CachedDeployment>::all(client.clone()),
        children_config.clone(),
    )
    .default_backoff()
    .inspect_ok(move |event| deployments_writer.apply(event))
    .inspect_ok(on_list_done(&listed, &deployments_listed))
    .inspect_ok(remember_deleted(&deleted, Child::Deployment))
    .touched_objects()
    .try_filter(not_an_echo(&applied, Child::Deployment))
    .inspect_ok(queue_owner(&queue));

    let (services, mut services_writer) = packed::packed::<CachedService>();
    let service_events = watcher(Api::<CachedService>::all(client.clone()), children_config)
        .default_backoff()
        .inspect_ok(move |event| services_writer.apply(event))
        .inspect_ok(on_list_done(&listed, &services_listed))
        .inspect_ok(remember_deleted(&deleted, Child::Service))
        .touched_objects()
        .try_filter(not_an_echo(&applied, Child::Service))
        .inspect_ok(queue_owner(&queue));
    let relists = {
        let (apps, queue) = (apps.clone(), queue.clone());
        relists.inspect(move |()| {
            for app in apps.state() {
                queue.triggered(app.namespace().as_deref(), &app.name_any());
            }
        })
    };

    // Reconciles still waiting for the children's lists see the stop and end (see `stopping`).
    let stopping = tokio_util::sync::CancellationToken::new();
    let shutdown = {
        let stopping = stopping.clone();
        async move {
            shutdown.await;
            stopping.cancel();
        }
    };
    let publishing = TaskTracker::new();
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: config.instance.clone(),
    };
    let ctx = Arc::new(Context {
        reporter,
        writer: Writer::new(client.clone(), gate, metrics.clone()),
        client,
        apps: apps.clone(),
        deployments,
        services,
        deployments_listed: deployments_listed.clone(),
        services_listed: services_listed.clone(),
        metrics,
        config: config.clone(),
        failures: failures.clone(),
        verified,
        applied,
        reported,
        awaiting_rollout: Waiting::new(PENDING_GRACE),
        deleted,
        fights: fight::Fights::default(),
        publishing: publishing.clone(),
        stopping: stopping.clone(),
    });

    // kube runs no reconcile before the MyApp cache's first list, and a stop ends the watches:
    // asked to stop before that list, the Controller would wait for it forever. Nothing has
    // run then, so it ends at once.
    let stopped_unlisted = {
        let (stopping, apps_listed) = (stopping.clone(), apps_listed.clone());
        async move {
            stopping.cancelled().await;
            if !apps_listed.done() {
                return;
            }
            future::pending::<()>().await;
        }
    };
    // Lives as long as the Controller below, never longer (a watch that never lists would
    // otherwise leave it waiting after leadership ends).
    let announce_synced = async move {
        apps_listed.wait().await;
        deployments_listed.wait().await;
        services_listed.wait().await;
        ready();
        info!("Caches synced");
        future::pending::<()>().await;
    };

    let resyncs = resync::resyncs(apps.clone(), config.resync, failures.clone());
    let controller = Controller::for_stream(app_events, apps)
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .reconcile_all_on(relists)
        .reconcile_on(resyncs)
        .trigger_backoff(EachWatchBacksOff)
        .with_config(controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(execute::reconcile, retry::error_policy, ctx)
        .for_each(|result| {
            match result {
                Ok((object, _)) => debug!(%object, "Reconciled"),
                // Logged by `error_policy`, with the attempt and the retry delay.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                // A child's delete (the garbage collector removing it after its MyApp) triggers
                // the MyApp, which is gone by then: the normal end of every delete.
                Err(controller::Error::ObjectNotFound(object)) => {
                    queue.started(object.namespace.as_deref(), &object.name);
                    debug!(%object, "MyApp gone, nothing to reconcile");
                }
                // Said once, in words, by `CrdPresence`.
                Err(controller::Error::QueueError(error)) if crd_missing::is_missing(&error) => {}
                Err(error) => warn!(
                    error = %crate::error::chain(&error),
                    api_server = crate::telemetry::api_server(),
                    fix = crate::telemetry::unreachable_fix(&error),
                    "Controller event"
                ),
            }
            future::ready(())
        });
    tokio::select! {
        () = controller => {}
        () = announce_synced => {}
        () = stopped_unlisted => {}
    }
    publishing.close();
    if tokio::time::timeout(PUBLISH_AT_STOP, publishing.wait())
        .await
        .is_err()
    {
        warn!(
            left = publishing.len(),
            "Stopped with Events still being published"
        );
    }
    queue.clear();
    info!("Controller stopped");
}

/// While the controller runs, `myapp_shard_objects` reads how many MyApps its cache holds;
/// dropped with the controller, it lets go of the cache (so that a replica that stopped
/// reconciling does not keep the cache alive through its metrics) and reports 0.
struct HeldCount(Arc<Metrics>);

impl HeldCount {
    fn new(metrics: &Arc<Metrics>, apps: &reflector::Store<CachedMyApp>) -> Self {
        let apps = apps.clone();
        metrics.shards.held_by(Some(Box::new(move || apps.len())));
        Self(metrics.clone())
    }
}

impl Drop for HeldCount {
    fn drop(&mut self) {
        self.0.shards.held_by(None);
    }
}
