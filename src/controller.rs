//! The async shell around `plan.rs`: watch MyApps and their children, carry out what the plan
//! says (applies, status, Events), back off on errors.

mod crd_missing;
mod fight;
mod write;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{Future, StreamExt, TryStreamExt, channel::mpsc::UnboundedSender, future};
use k8s_openapi::{api::core::v1::ObjectReference, jiff::Timestamp};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::PatchParams,
    runtime::{
        Controller, WatchStreamExt,
        controller::{self, Action},
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef},
        utils::Backoff,
        watcher,
    },
};
use serde_json::json;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    Error,
    cache::{self, CachedDeployment, CachedService, WatchedMyApp},
    crd::{MyApp, MyAppStatus},
    fence::{Fenced, Gate},
    metrics::{Metrics, ReconcileResult, queue::Queue},
    packed::{self, Packed},
    permission::Permission,
    plan::{self, Observed, PENDING_GRACE},
    recent::{RecentWrites, Waiting},
    resources::FIELD_MANAGER,
};
use write::{Landed, Precondition, Writer};

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

/// The field manager that keeps `spec.replicas` of a Deployment when a MyApp stops setting it.
pub const REPLICAS_HANDOFF_MANAGER: &str = "myapp-operator-replicas-handoff";

/// Tunables of the controller, set from the CLI.
#[derive(Clone, Debug)]
pub struct Config {
    /// Reconciles running at once.
    pub concurrency: u16,
    /// Safety-net requeue period of a healthy MyApp (jittered by up to 10 %).
    pub resync: Duration,
    /// Deadline of one reconcile.
    pub reconcile_timeout: Duration,
    /// First retry delay after an error; doubles per consecutive error of the same object.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_cap: Duration,
    /// Objects per page when a watch (re)lists: keeps relist memory peaks down.
    pub page_size: u32,
    /// Name of this replica for Events (the pod name in a cluster).
    pub instance: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            concurrency: 4,
            resync: Duration::from_secs(300),
            reconcile_timeout: Duration::from_secs(30),
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(300),
            page_size: 50,
            instance: None,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    client: Client,
    /// Makes every write, through the write gate.
    writer: Writer,
    /// The MyApp cache, to tell whether a MyApp still exists after creating its child.
    apps: reflector::Store<MyApp>,
    deployments: Packed<CachedDeployment>,
    services: Packed<CachedService>,
    /// Whether each child cache holds a complete list yet.
    deployments_listed: Listed,
    services_listed: Listed,
    /// Who publishes our Events (see [`Context::publish`]).
    reporter: Reporter,
    metrics: Arc<Metrics>,
    config: Config,
    /// Consecutive failures per object; cleared by a success (kube-runtime keeps no such state).
    failures: Mutex<HashMap<ObjectRef<MyApp>, u32>>,
    /// Our child applies the caches have not seen yet, by the applied-digest annotation.
    applied: Arc<Applied>,
    /// Our status writes the MyApp cache has not seen yet.
    reported: Arc<Reported>,
    /// Deployments we applied whose controller has not observed the apply yet.
    awaiting_rollout: Waiting<ObjectRef<MyApp>>,
    /// Rewrites of each Deployment at one generation: fights with another writer.
    fights: fight::Fights,
    /// Events being published, waited for (a little) when the controller stops.
    publishing: TaskTracker,
}

/// Child applies by MyApp and child: see [`Context::applied`].
type Applied = RecentWrites<(ObjectRef<MyApp>, Child), String>;

/// Status writes by MyApp: see [`Context::reported`].
type Reported = RecentWrites<ObjectRef<MyApp>, MyAppStatus>;

/// A child of a MyApp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Child {
    Deployment,
    Service,
}

/// How long a stopping controller waits for the Events it is still publishing.
const PUBLISH_AT_STOP: Duration = Duration::from_secs(2);

/// How long our writes are remembered for read-your-writes: far longer than a watch event
/// takes to arrive.
const RECENT_WRITES_TTL: Duration = Duration::from_secs(30);

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
    let watch_config = watcher::Config::default().page_size(config.page_size);
    let children_config = watch_config
        .clone()
        .labels(&format!("app.kubernetes.io/managed-by={FIELD_MANAGER}"));

    // A (re)list fills a side buffer page by page and swaps it into the cache at its end
    // (`InitDone`). Reconciles its pages trigger run against the cache before the swap, and
    // nothing says what changed or vanished while the watch was down, so every MyApp is
    // reconciled again once any cache has swapped in a new list.
    let (listed, relists) = futures::channel::mpsc::unbounded::<()>();

    let (apps_listed, deployments_listed, services_listed) =
        (Listed::default(), Listed::default(), Listed::default());

    let queue = metrics.queue.clone();
    let applied = Arc::new(RecentWrites::new(RECENT_WRITES_TTL));
    let reported = Arc::new(RecentWrites::new(RECENT_WRITES_TTL));
    let (apps, apps_writer) = reflector::store::<MyApp>();
    let crd = crd_missing::CrdPresence::new(metrics.clone());
    let app_events = watcher(Api::<WatchedMyApp>::all(client.clone()), watch_config)
        .map_ok(cache::watched_myapp)
        .inspect({
            let crd = crd.clone();
            move |item| crd.observe(item)
        })
        .backoff(crd_missing::QuietBackoff::new(crd))
        .reflect(apps_writer)
        .inspect_ok(count_orphans(&applied, &metrics))
        .inspect_ok(on_list_done(&listed, &apps_listed))
        .inspect_ok(forget_seen_status(&reported))
        .try_filter(|event| future::ready(needs_reconcile(event)))
        .applied_objects()
        .inspect_ok(queue_self(&queue));

    let (deployments, mut deployments_writer) = packed::packed::<CachedDeployment>();
    let deployment_events = watcher(
        Api::<CachedDeployment>::all(client.clone()),
        children_config.clone(),
    )
    .default_backoff()
    .inspect_ok(move |event| deployments_writer.apply(event))
    .inspect_ok(on_list_done(&listed, &deployments_listed))
    .touched_objects()
    .try_filter(not_an_echo(&applied, Child::Deployment))
    .inspect_ok(queue_owner(&queue));

    let (services, mut services_writer) = packed::packed::<CachedService>();
    let service_events = watcher(Api::<CachedService>::all(client.clone()), children_config)
        .default_backoff()
        .inspect_ok(move |event| services_writer.apply(event))
        .inspect_ok(on_list_done(&listed, &services_listed))
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
        failures: Mutex::default(),
        applied,
        reported,
        awaiting_rollout: Waiting::new(PENDING_GRACE),
        fights: fight::Fights::default(),
        publishing: publishing.clone(),
    });

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

    let controller = Controller::for_stream(app_events, apps)
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .reconcile_all_on(relists)
        .trigger_backoff(EachWatchBacksOff)
        .with_config(controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
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
                Err(error) => warn!(%error, "Controller event"),
            }
            future::ready(())
        });
    tokio::select! {
        () = controller => {}
        () = announce_synced => {}
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

/// Counts a MyApp from its own watch as waiting.
fn queue_self(queue: &Arc<Queue>) -> impl FnMut(&MyApp) + Send + Sync + 'static {
    let queue = queue.clone();
    move |app| queue.triggered(app.namespace().as_deref(), &app.name_any())
}

/// Counts the MyApp owning a child as waiting, found as the Controller finds it (kube's
/// `trigger_owners`: every owner reference of MyApp's kind and group).
fn queue_owner<K: Resource>(queue: &Arc<Queue>) -> impl FnMut(&K) + Send + Sync + 'static {
    let queue = queue.clone();
    move |child| {
        for app in owners(child) {
            queue.triggered(app.namespace.as_deref(), &app.name);
        }
    }
}

/// The MyApps owning a child: every owner reference of MyApp's kind and group.
fn owners<K: Resource>(child: &K) -> impl Iterator<Item = ObjectRef<MyApp>> + '_ {
    let meta = child.meta();
    meta.owner_references
        .iter()
        .flatten()
        .filter_map(|owner| ObjectRef::from_owner_ref(meta.namespace.as_deref(), owner, ()))
}

/// Lets through every child event but the watch event of our own apply (see
/// [`RecentWrites::echoes`]): the reconcile that applied it has already planned with it and
/// scheduled its next look, so the reconcile the event would trigger only finds the child as
/// applied: about one reconcile in three while converging.
fn not_an_echo<K: Resource>(
    applied: &Arc<Applied>,
    child: Child,
) -> impl FnMut(&K) -> future::Ready<bool> + Send + Sync + 'static {
    let applied = applied.clone();
    move |object| {
        let version = object.meta().resource_version.as_deref();
        let echo = owners(object)
            .next()
            .is_some_and(|app| applied.echoes(&(app, child), version));
        future::ready(!echo)
    }
}

/// Forgets a status write once the MyApp cache holds it: its watch event triggers no
/// reconcile (`needs_reconcile`), whose lookup would have ended the entry, so every MyApp's
/// last status, conditions and all, would stay in memory until its next reconcile (the
/// resync) looked it up, or a later write pruned it once expired.
fn forget_seen_status(
    reported: &Arc<Reported>,
) -> impl FnMut(&watcher::Event<MyApp>) + Send + Sync + 'static {
    let reported = reported.clone();
    move |event| {
        if let watcher::Event::Apply(app) = event {
            reported.echoes(&ObjectRef::from_obj(app), app.resource_version().as_deref());
        }
    }
}

/// Counts the children we created for a MyApp after it was deleted, as its delete event
/// shows: created at a later resourceVersion than the deletion's. No precondition can stop
/// such a create (the child does not exist, and the API server does not check owners at
/// create); the garbage collector removes the child.
fn count_orphans(
    applied: &Arc<Applied>,
    metrics: &Arc<Metrics>,
) -> impl FnMut(&watcher::Event<MyApp>) + Send + Sync + 'static {
    let (applied, metrics) = (applied.clone(), metrics.clone());
    move |event| {
        if let watcher::Event::Delete(app) = event {
            let deleted_at = app.resource_version();
            for child in [Child::Deployment, Child::Service] {
                let key = (ObjectRef::from_obj(app), child);
                if applied.take_created_after(&key, deleted_at.as_deref()) {
                    metrics.orphans.inc();
                }
            }
        }
    }
}

/// Signals `relisted` each time a watch's cache has swapped in a complete (re)list, and marks
/// that cache `listed`.
fn on_list_done<K: 'static>(
    relisted: &UnboundedSender<()>,
    listed: &Listed,
) -> impl FnMut(&watcher::Event<K>) + Send + Sync + 'static {
    let (relisted, listed) = (relisted.clone(), listed.clone());
    move |event| {
        if matches!(event, watcher::Event::InitDone) {
            listed.mark();
            // Fails only once the Controller, and with it the receiver, is gone.
            let _ = relisted.unbounded_send(());
        }
    }
}

/// Whether a watch cache holds its first complete list; any number of tasks may wait for it.
///
/// Not kube's `Store::wait_until_ready`: its `DelayedInit` keeps a single waker, so of two
/// tasks waiting at once only the one that polled last is woken. The Controller waits on the
/// MyApp store that way, so a second waiter (ours, for `Caches synced`) was never woken.
#[derive(Clone, Debug, Default)]
struct Listed(Arc<tokio::sync::watch::Sender<bool>>);

impl Listed {
    fn mark(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once the cache is listed.
    async fn wait(&self) {
        // Cannot fail: `self` holds a sender, so the channel stays open.
        let _ = self.0.subscribe().wait_for(|done| *done).await;
    }
}

/// The Controller's backoff on watch errors, off: each watch above backs off on its own.
///
/// kube's default pauses the merged stream of all three watches whenever any one of them errs,
/// on top of that watch's own backoff, so one watch's 410 stalls the other two and their
/// caches, and the pauses grow with errors that come back to back. A forced relist of the
/// three watches took 6.9 s that way, against 1.5 s with only their own backoffs
/// (`benches/operator.rs`, 1,000 MyApps).
struct EachWatchBacksOff;

impl Iterator for EachWatchBacksOff {
    type Item = Duration;
    /// Never gives up (`None` would end the Controller's stream), never waits.
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for EachWatchBacksOff {
    fn reset(&mut self) {}
}

/// Whether a MyApp watch event triggers a reconcile. A change is one only while the status does
/// not report the current generation, so status-only changes (our own status writes among them)
/// do not trigger, while a new or edited spec does. Every object of a (re)list does, and once
/// the list is complete every MyApp is reconciled again (see `on_list_done`).
///
/// This is kube's `predicates::generation` without its memory: that one remembers the last
/// generation of every object (a key of three strings each), where the object itself says
/// which generation was reconciled last. Unlike it, this lets through metadata-only changes of
/// a MyApp whose current generation has not been reported yet (one that keeps failing), so such
/// a change retries it at once rather than after its backoff.
fn needs_reconcile(event: &watcher::Event<MyApp>) -> bool {
    match event {
        watcher::Event::Apply(app) => {
            let observed = app.status.as_ref().and_then(|s| s.observed_generation);
            observed.is_none() || observed != app.metadata.generation
        }
        _ => true,
    }
}

/// Brings one MyApp's children and status in line with its spec.
pub async fn reconcile(app: Arc<MyApp>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    ctx.metrics
        .queue
        .started(app.namespace().as_deref(), &app.name_any());
    let _running = ctx.metrics.running();
    // Not `name`: a JSON log line's span object has its own `name` key (the span's).
    let span = info_span!(
        "reconcile",
        namespace = %app.namespace().unwrap_or_default(),
        app = %app.name_any(),
    );
    let deadline = ctx.config.reconcile_timeout;
    let result = tokio::time::timeout(deadline, reconcile_once(&app, &ctx).instrument(span))
        .await
        .unwrap_or(Err(Error::ReconcileDeadline(deadline)));
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(error) => {
            ctx.metrics.reconciled(ReconcileResult::Error);
            return Err(error);
        }
    };
    ctx.metrics.reconciled(if outcome.recheck.is_some() {
        ReconcileResult::Requeue
    } else {
        ReconcileResult::Success
    });
    if outcome.writes == 0 {
        ctx.metrics.reconcile_noops.inc();
    }
    ctx.failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&ObjectRef::from_obj(app.as_ref()));
    Ok(Action::requeue(
        outcome
            .recheck
            .unwrap_or_else(|| jitter(ctx.config.resync, 0.1)),
    ))
}

/// What one reconcile did.
#[derive(Debug, Default)]
struct Outcome {
    /// Writes made.
    writes: u32,
    /// Look again this soon (instead of the resync period).
    recheck: Option<Duration>,
}

/// Retries a failed object with exponential backoff and jitter, capped; other objects go on.
pub fn error_policy(app: Arc<MyApp>, error: &Error, ctx: Arc<Context>) -> Action {
    if fenced(error) {
        // Not a failure of the MyApp: the controller is stopping, the next leader takes over.
        debug!(name = %app.name_any(), %error, "Write fenced");
        return Action::await_change();
    }
    let attempt = {
        let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures
            .entry(ObjectRef::from_obj(app.as_ref()))
            .or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(attempt, ctx.config.backoff_base, ctx.config.backoff_cap);
    let name = app.name_any();
    let refusal = StatusRefusal::of(error);
    match refusal {
        Some(StatusRefusal::Forbidden) => {
            warn!(%name, %error, attempt, ?delay, fix = StatusRefusal::FORBIDDEN_FIX, "Status write forbidden");
        }
        Some(StatusRefusal::Conflict) => {
            warn!(%name, %error, attempt, ?delay, "Status write conflict");
        }
        None => warn!(%name, %error, attempt, ?delay, "Reconcile failed, retrying"),
    }
    if attempt == 1 {
        // One Event per failure streak, not per retry: Events are for people.
        let (reason, note) = match refusal {
            Some(refusal) => (refusal.reason(), refusal.note(error)),
            None => ("ReconcileFailed", error.to_string()),
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        ctx.publish_later(event, app.object_ref(&()));
    }
    Action::requeue(delay)
}

/// Whether a status write failed because the MyApp `name` was deleted while its reconcile ran:
/// a 404 about that object. Not any 404: a CRD installed without the status subresource answers
/// 404 too, without naming the object, and that must be reported, not taken for a delete.
fn deleted_meanwhile(error: &kube::Error, name: &str) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.is_not_found() && status.details.as_ref().is_some_and(|d| d.name == name))
}

/// Why the API server refused a status write, when it was for permission or a conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusRefusal {
    /// 403: the ServiceAccount may not patch `myapps/status`.
    Forbidden,
    /// 409: the write conflicted with another writer.
    Conflict,
}

impl StatusRefusal {
    /// What grants the permission back.
    pub const FORBIDDEN_FIX: &str = "grant patch on myapps/status (example.com) to the operator's ServiceAccount: kubectl apply -f deploy/rbac.yaml; myapp-operator check names what is missing";

    /// The refusal `error` is, if it is one.
    pub fn of(error: &Error) -> Option<Self> {
        match error {
            Error::PatchStatus(kube::Error::Api(status)) if status.code == 403 => {
                Some(Self::Forbidden)
            }
            Error::PatchStatus(kube::Error::Api(status)) if status.code == 409 => {
                Some(Self::Conflict)
            }
            _ => None,
        }
    }

    /// The Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Forbidden => "StatusWriteForbidden",
            Self::Conflict => "StatusWriteConflict",
        }
    }

    /// The Event note: which refusal, the API's words, what to do.
    pub fn note(self, error: &Error) -> String {
        match self {
            Self::Forbidden => format!(
                "status not written, forbidden (403): {error}; {}",
                Self::FORBIDDEN_FIX
            ),
            Self::Conflict => format!(
                "status not written, conflict (409): {error}; retrying with the latest version"
            ),
        }
    }
}

/// `base * 2^(attempt-1)`, capped, then jittered by ±20 % so failing objects spread out.
pub fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exp = base.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(30)));
    jitter(exp.min(cap), 0.2)
}

fn jitter(d: Duration, spread: f64) -> Duration {
    d.mul_f64(1.0 + spread * (2.0 * fastrand::f64() - 1.0))
}

/// One pass: gather what the caches know, let [`plan`] decide, carry the plan out.
async fn reconcile_once(app: &MyApp, ctx: &Context) -> Result<Outcome, Error> {
    let name = app.name_any();
    let namespace = app
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(name.clone()))?;
    ctx.deployments_listed.wait().await;
    ctx.services_listed.wait().await;

    let key = ObjectRef::from_obj(app);
    let deployment = ctx.deployments.get(&namespace, &name);
    let service = ctx.services.get(&namespace, &name);
    let (deployment, service) = (deployment.as_ref(), service.as_ref());
    // Asked first, always: a lookup that finds the cache caught up ends the entry.
    let unseen_deployment = ctx
        .applied
        .unseen_at(&(key.clone(), Child::Deployment), version(deployment));
    let unseen_service = ctx
        .applied
        .unseen_at(&(key.clone(), Child::Service), version(service));
    let unseen_status = ctx
        .reported
        .unseen_at(&key, app.meta().resource_version.as_deref());
    // What each write must find on the server: the version it was planned from.
    let deployment_at = Precondition::of(version(deployment), unseen_deployment.as_ref());
    let service_at = Precondition::of(version(service), unseen_service.as_ref());
    let status_at = Precondition::of(app.resource_version().as_deref(), unseen_status.as_ref());
    let observed = Observed {
        deployment,
        service,
        unseen_deployment: unseen_deployment.map(|(digest, _)| digest),
        unseen_service: unseen_service.map(|(digest, _)| digest),
        unseen_status: unseen_status.map(|(status, _)| status),
        awaiting_rollout: ctx.awaiting_rollout.elapsed(&key),
    };
    let mut plan = plan::plan(app, &observed, Timestamp::now());
    if plan.rollout_observed {
        ctx.awaiting_rollout.end(&key);
    }
    let mut outcome = Outcome {
        writes: 0,
        recheck: plan.recheck,
    };

    let generation = app.metadata.generation;
    // A fight holds off rewrites of an existing Deployment (never its creation).
    let held = match (&plan.deployment, deployment) {
        (Some(_), Some(_)) => ctx.fights.holding_off(&key, generation, Instant::now()),
        _ => None,
    };
    if let Some(wait) = held {
        debug!(%name, %namespace, ?wait, "Holding off the Deployment: fight");
        outcome.look_again(wait);
    }
    let planned_deployment = plan.deployment.take().filter(|_| held.is_none());
    let planned_service = plan.service.take();
    // The two children do not depend on each other: both applies are in flight at once.
    let deployment_applied = async {
        let Some(mut desired) = planned_deployment else {
            return Ok(Landed::Skipped);
        };
        let changed = deployment.map(|observed| {
            fight::changed_fields(
                &serde_json::to_value(&desired).unwrap_or_default(),
                &serde_json::to_value(observed).unwrap_or_default(),
            )
        });
        // Before the forced apply takes the fields back: who owns them now.
        let rivals = match &changed {
            Some(_) if ctx.fights.would_fight(&key, generation, Instant::now()) => {
                let desired = serde_json::to_value(&desired).unwrap_or_default();
                let ours = [FIELD_MANAGER, REPLICAS_HANDOFF_MANAGER];
                fight::rivals(&ctx.client, &namespace, &name, &desired, &ours).await
            }
            _ => Vec::new(),
        };
        let mut at = deployment_at;
        if let Some(replicas) = plan.hand_over_replicas {
            let mut keep = json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas},
            });
            at.stamp(&mut keep["metadata"]);
            let manager = PatchParams::apply(REPLICAS_HANDOFF_MANAGER).force();
            match ctx
                .writer
                .apply::<CachedDeployment, _>(&key, "replicas_handoff", &at, &manager, None, &keep)
                .await
                .map_err(Error::HandOffReplicas)?
            {
                Landed::Written(version) => at.expect = version,
                landed => return Ok(landed),
            }
        }
        desired.metadata.resource_version = at.expect.clone();
        let landed = apply_child::<CachedDeployment, _>(
            ctx,
            &key,
            Child::Deployment,
            &desired,
            &at,
            version(deployment),
        )
        .await?;
        if !matches!(landed, Landed::Written(_)) {
            return Ok(landed);
        }
        ctx.awaiting_rollout.start(key.clone());
        if let Some(changed) = changed
            && let Some(fight) = ctx.fights.rewrote(&key, generation, Instant::now())
        {
            ctx.metrics.fights.inc();
            let fields = changed.join(", ");
            let managers: Vec<&str> = rivals.iter().map(|r| r.manager.as_str()).collect();
            warn!(%name, %namespace, writes = fight.writes, hold_off = ?fight.hold_off, %fields, ?managers, "Fight over Deployment");
            let event = Event {
                type_: EventType::Warning,
                reason: "FightDetected".into(),
                note: Some(fight::note(&fight, generation, &fields, &rivals)),
                action: "Reconcile".into(),
                secondary: None,
            };
            ctx.publish(&event, &app.object_ref(&())).await;
        }
        Ok::<Landed, Error>(landed)
    };
    let service_applied = async {
        let Some(mut desired) = planned_service else {
            return Ok(Landed::Skipped);
        };
        desired.metadata.resource_version = service_at.expect.clone();
        apply_child::<CachedService, _>(
            ctx,
            &key,
            Child::Service,
            &desired,
            &service_at,
            version(service),
        )
        .await
    };
    let (deployment_applied, service_applied) =
        future::join(deployment_applied, service_applied).await;
    let hand_off = u32::from(plan.hand_over_replicas.is_some());
    for (landed, writes) in [(deployment_applied?, 1 + hand_off), (service_applied?, 1)] {
        outcome.count(&landed, writes, ctx.config.backoff_base);
    }
    let Some(status) = &plan.status else {
        return Ok(outcome);
    };
    let mut patch =
        json!({"apiVersion": "example.com/v1", "kind": "MyApp", "metadata": {}, "status": status});
    status_at.stamp(&mut patch["metadata"]);
    let ours = PatchParams::apply(FIELD_MANAGER).force();
    let landed = match ctx
        .writer
        .apply::<MyApp, _>(&key, "status", &status_at, &ours, Some("status"), &patch)
        .await
    {
        Ok(landed) => landed,
        // Its children go with it, by their owner references: nothing is left to report
        // on, and nothing to retry.
        Err(error) if deleted_meanwhile(&error, &name) => {
            debug!(%name, %namespace, "MyApp deleted while reconciling, status not written");
            return Ok(Outcome {
                recheck: None,
                ..outcome
            });
        }
        Err(error) => return Err(Error::PatchStatus(error)),
    };
    outcome.count(&landed, 1, ctx.config.backoff_base);
    let Landed::Written(written) = landed else {
        return Ok(outcome);
    };
    ctx.reported.record(
        key,
        app.resource_version(),
        written.as_deref(),
        status.clone(),
    );
    if let Some(event) = &plan.event {
        let event = Event {
            type_: if event.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: event.reason.clone(),
            note: Some(event.note.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        // Not awaited: the reconcile is done once the status is written, and the next one
        // need not wait for this Event's round trip.
        ctx.publish_later(event, app.object_ref(&()));
    }
    Ok(outcome)
}

impl Outcome {
    /// Counts `landed`, worth `writes` writes when written; a refused write looks again after
    /// `retry` (its watch event usually triggers the reconcile sooner).
    fn count(&mut self, landed: &Landed, writes: u32, retry: Duration) {
        match landed {
            Landed::Skipped => {}
            Landed::Written(_) => self.writes += writes,
            Landed::Refused => self.look_again(retry),
        }
    }

    /// Look again within `after`.
    fn look_again(&mut self, after: Duration) {
        self.recheck = Some(self.recheck.map_or(after, |r| r.min(after)));
    }
}

/// Applies one child under our field manager (forced: the spec wins) and remembers the write
/// until the child's cache has seen it (read-your-writes).
async fn apply_child<C, K>(
    ctx: &Context,
    app: &ObjectRef<MyApp>,
    child: Child,
    desired: &K,
    at: &Precondition,
    cached_version: Option<&str>,
) -> Result<Landed, Error>
where
    C: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
    K: Resource + std::fmt::Debug + serde::Serialize,
{
    let (name, namespace) = (&app.name, app.namespace.as_deref().unwrap_or_default());
    let (kind, target) = match child {
        Child::Deployment => ("Deployment", "deployment"),
        Child::Service => ("Service", "service"),
    };
    let ours = PatchParams::apply(FIELD_MANAGER).force();
    let landed = ctx
        .writer
        .apply::<C, _>(app, target, at, &ours, None, desired)
        .await
        .map_err(|error| match child {
            Child::Deployment => Error::ApplyDeployment(error),
            Child::Service => Error::ApplyService(error),
        })?;
    let Landed::Written(written) = &landed else {
        return Ok(landed);
    };
    info!(%name, %namespace, "Applied {kind}");
    ctx.applied.record(
        (app.clone(), child),
        cached_version.map(str::to_owned),
        written.as_deref(),
        plan::digest(desired),
    );
    if at.expect.is_none() && !ctx.still_there(app) {
        ctx.orphaned(app, child);
    }
    Ok(landed)
}

fn version<K: Resource>(cached: Option<&K>) -> Option<&str> {
    cached.and_then(|o| o.meta().resource_version.as_deref())
}

impl Context {
    /// Publishes an Event about `regarding`, through the write gate; a failure is logged, never
    /// fatal.
    ///
    /// A fresh [`Recorder`] each time, on purpose: a shared one keeps every Event it published
    /// for six minutes (to count repeats into a series), in a map whose capacity never shrinks.
    /// Ours are one per phase change or failure streak, so repeats are rare and the cache would
    /// only hold one full Event per MyApp: measured, the largest single item in memory after
    /// 10,000 creates. Building one costs a client clone and an empty map.
    async fn publish(&self, event: &Event, regarding: &ObjectReference) {
        publish(
            &self.client,
            self.writer.gate(),
            self.reporter.clone(),
            event,
            regarding,
        )
        .await;
    }

    /// Publishes an Event in a task of its own; the controller waits for such tasks, at most
    /// [`PUBLISH_AT_STOP`], when it stops. An Event still queued when the gate closes is
    /// dropped: it would be written by a replica that may no longer write.
    fn publish_later(&self, event: Event, regarding: ObjectReference) {
        let (client, gate, reporter) = (
            self.client.clone(),
            self.writer.gate().clone(),
            self.reporter.clone(),
        );
        self.publishing.spawn(async move {
            tokio::select! {
                biased;
                () = gate.closed() => gate.dropped_event(),
                () = publish(&client, &gate, reporter, &event, &regarding) => {}
            }
        });
    }

    /// Whether the MyApp cache still holds `app`.
    fn still_there(&self, app: &ObjectRef<MyApp>) -> bool {
        self.apps.get(app).is_some()
    }

    /// Counts `child`, just created, as an orphan: its MyApp was deleted meanwhile (once, also
    /// if its delete event counts it too).
    fn orphaned(&self, app: &ObjectRef<MyApp>, child: Child) {
        if self.applied.take_created_after(&(app.clone(), child), None) {
            self.metrics.orphans.inc();
            let namespace = app.namespace.as_deref().unwrap_or_default();
            info!(name = %app.name, %namespace, ?child, "Created a child of a deleted MyApp; the garbage collector removes it");
        }
    }
}

async fn publish(
    client: &Client,
    gate: &Gate,
    reporter: Reporter,
    event: &Event,
    regarding: &ObjectReference,
) {
    if gate.check().is_err() {
        gate.dropped_event();
        return;
    }
    let recorder = Recorder::new(client.clone(), reporter);
    if let Err(error) = recorder.publish(event, regarding).await {
        warn!(%error, "Failed to publish Event");
    }
}

/// Whether `error` is a write the gate refused: this replica may no longer write.
fn fenced(error: &Error) -> bool {
    let (Error::ApplyDeployment(error)
    | Error::ApplyService(error)
    | Error::HandOffReplicas(error)
    | Error::PatchStatus(error)) = error
    else {
        return false;
    };
    matches!(error, kube::Error::Service(source) if source.is::<Fenced>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_attempt_and_stops_at_the_cap() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(10);
        for (attempt, nominal) in [
            (1, 100u64),
            (2, 200),
            (3, 400),
            (7, 6400),
            (8, 10_000),
            (40, 10_000),
        ] {
            let d = backoff(attempt, base, cap).as_millis() as u64;
            assert!(
                d >= nominal * 8 / 10 && d <= nominal * 12 / 10,
                "attempt {attempt}: {d} ms, nominal {nominal}"
            );
        }
    }

    #[test]
    fn only_a_404_naming_the_myapp_means_it_was_deleted_meanwhile() {
        let not_found = |details: serde_json::Value| {
            let status = kube::core::Status::failure("not found", "NotFound").with_code(404);
            kube::Error::Api(Box::new(
                status.with_details(serde_json::from_value(details).unwrap()),
            ))
        };
        let gone = not_found(json!({"name": "web", "group": "example.com", "kind": "myapps"}));
        assert!(deleted_meanwhile(&gone, "web"));
        assert!(!deleted_meanwhile(&gone, "api"), "another object's 404");
        // What an API server answers for a path it does not serve (no status subresource).
        let no_route = kube::Error::Api(Box::new(
            kube::core::Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(404),
        ));
        assert!(!deleted_meanwhile(&no_route, "web"));
        let forbidden = kube::Error::Api(Box::new(
            kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
        ));
        assert!(!deleted_meanwhile(&forbidden, "web"));
    }

    #[test]
    fn a_status_write_refused_for_permission_or_conflict_says_which() {
        let refused = |code: u16| {
            Error::PatchStatus(kube::Error::Api(Box::new(
                kube::core::Status::failure("refused", "Refused").with_code(code),
            )))
        };
        assert_eq!(
            StatusRefusal::of(&refused(403)),
            Some(StatusRefusal::Forbidden)
        );
        assert_eq!(
            StatusRefusal::of(&refused(409)),
            Some(StatusRefusal::Conflict)
        );
        assert_eq!(StatusRefusal::of(&refused(500)), None);
        let other = Error::ApplyDeployment(kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Refused").with_code(403),
        )));
        assert_eq!(StatusRefusal::of(&other), None, "only status writes");
        let note = StatusRefusal::Conflict.note(&refused(409));
        assert!(
            note.starts_with("status not written, conflict (409)"),
            "{note}"
        );
        assert_eq!(StatusRefusal::Conflict.reason(), "StatusWriteConflict");
    }

    #[test]
    fn the_controller_neither_waits_nor_gives_up_on_a_watch_error() {
        let delays: Vec<_> = EachWatchBacksOff.take(100).collect();
        assert_eq!(delays, vec![Duration::ZERO; 100]);
    }

    #[test]
    fn only_an_unreported_generation_or_a_relist_triggers_a_reconcile() {
        let app = |generation: i64, observed: Option<i64>| {
            let app = MyApp::test("web").stored().generation(generation);
            match observed {
                Some(g) => app.status(MyAppStatus {
                    observed_generation: Some(g),
                    ..Default::default()
                }),
                None => app,
            }
        };
        use watcher::Event::{Apply, InitApply};
        assert!(needs_reconcile(&Apply(app(1, None))), "new, never reported");
        assert!(needs_reconcile(&Apply(app(2, Some(1)))), "spec edited");
        assert!(
            !needs_reconcile(&Apply(app(2, Some(2)))),
            "status-only change, our own status write among them"
        );
        assert!(needs_reconcile(&InitApply(app(2, Some(2)))), "relist");
    }

    #[test]
    fn only_the_watch_event_of_our_own_apply_triggers_nothing() {
        let app = MyApp::test("web").in_namespace("shop").stored();
        let at = |version: &str| {
            let mut child: CachedDeployment = cache::cached(&crate::resources::deployment(&app));
            child.metadata.resource_version = Some(version.into());
            child
        };
        let applied = Arc::new(Applied::new(RECENT_WRITES_TTL));
        let key = (ObjectRef::from_obj(&app), Child::Deployment);
        applied.record(key, Some("7".into()), Some("8"), "digest".into());
        let mut deployments = not_an_echo(&applied, Child::Deployment);
        let mut services = not_an_echo(&applied, Child::Service);
        let triggers = |filter: &mut dyn FnMut(&CachedDeployment) -> future::Ready<bool>,
                        version: &str| filter(&at(version)).into_inner();
        assert!(
            triggers(&mut deployments, "7"),
            "the version our apply replaced"
        );
        assert!(triggers(&mut services, "8"), "another child of the MyApp");
        assert!(!triggers(&mut deployments, "8"), "our apply's own event");
        assert!(triggers(&mut deployments, "8"), "only once");
        applied.record(
            (ObjectRef::from_obj(&app), Child::Deployment),
            Some("8".into()),
            Some("9"),
            "digest".into(),
        );
        assert!(triggers(&mut deployments, "10"), "a write after ours");
    }

    #[test]
    fn a_status_write_is_forgotten_once_the_myapp_cache_holds_it() {
        let app = |version: &str| {
            let mut app = MyApp::test("web").in_namespace("shop").stored();
            app.metadata.resource_version = Some(version.into());
            app
        };
        let reported = Arc::new(RecentWrites::new(RECENT_WRITES_TTL));
        let key = ObjectRef::from_obj(&app("7"));
        reported.record(
            key.clone(),
            Some("7".into()),
            Some("8"),
            MyAppStatus::default(),
        );
        let mut forget = forget_seen_status(&reported);
        forget(&watcher::Event::Apply(app("7")));
        assert_eq!(
            reported.len(),
            1,
            "the cache still holds the version it replaced"
        );
        forget(&watcher::Event::Apply(app("8")));
        assert!(reported.is_empty(), "the cache holds our write");
    }
}
