//! The thin async shell around `resources.rs`: watch MyApps and their children, apply what
//! differs, report status, back off on errors.

use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{Future, StreamExt, TryStreamExt, channel::mpsc::UnboundedSender, future};
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        core::v1::{ObjectReference, Service},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::{self, Action},
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        utils::Backoff,
        watcher,
    },
};
use serde_json::json;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    Error,
    cache::{self, CachedDeployment, CachedService},
    crd::{MyApp, MyAppStatus, Phase},
    metrics::{Metrics, ResultLabels},
    recent::{RecentWrites, Waiting},
    resources::{self, FIELD_MANAGER, Rollout},
};

/// The field manager that keeps `spec.replicas` of a Deployment when a MyApp stops setting it.
pub const REPLICAS_HANDOFF_MANAGER: &str = "myapp-operator-replicas-handoff";

/// How long after applying a Deployment the status waits for the Deployment controller to
/// observe it before reporting `Pending`. The controller usually answers within milliseconds,
/// and its answer triggers the next reconcile; a `Pending` written in between would be
/// overwritten at once, so waiting saves one status write per change.
pub const PENDING_GRACE: Duration = Duration::from_secs(3);

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
    deployments: Store<CachedDeployment>,
    services: Store<CachedService>,
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
    applied: RecentWrites<(ObjectRef<MyApp>, Child), String>,
    /// Our status writes the MyApp cache has not seen yet.
    reported: RecentWrites<ObjectRef<MyApp>, MyAppStatus>,
    /// Deployments we applied whose controller has not observed the apply yet.
    awaiting_rollout: Waiting<ObjectRef<MyApp>>,
}

/// A child of a MyApp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Child {
    Deployment,
    Service,
}

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

    let (apps, apps_writer) = reflector::store::<MyApp>();
    let app_events = watcher(Api::<MyApp>::all(client.clone()), watch_config)
        .default_backoff()
        .modify(cache::slim_myapp)
        .reflect(apps_writer)
        .inspect_ok(on_list_done(&listed, &apps_listed))
        .try_filter(|event| future::ready(needs_reconcile(event)))
        .applied_objects();

    let (deployments, deployments_writer) = reflector::store::<CachedDeployment>();
    let deployment_events = watcher(
        Api::<CachedDeployment>::all(client.clone()),
        children_config.clone(),
    )
    .default_backoff()
    .reflect(deployments_writer)
    .inspect_ok(on_list_done(&listed, &deployments_listed))
    .touched_objects();

    let (services, services_writer) = reflector::store::<CachedService>();
    let service_events = watcher(Api::<CachedService>::all(client.clone()), children_config)
        .default_backoff()
        .reflect(services_writer)
        .inspect_ok(on_list_done(&listed, &services_listed))
        .touched_objects();

    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: config.instance.clone(),
    };
    let ctx = Arc::new(Context {
        reporter,
        client,
        deployments,
        services,
        deployments_listed: deployments_listed.clone(),
        services_listed: services_listed.clone(),
        metrics,
        config: config.clone(),
        failures: Mutex::default(),
        applied: RecentWrites::new(RECENT_WRITES_TTL),
        reported: RecentWrites::new(RECENT_WRITES_TTL),
        awaiting_rollout: Waiting::new(PENDING_GRACE),
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
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => debug!(%object, "Reconciled"),
                Err(controller::Error::ReconcilerFailed(error, object)) => {
                    warn!(%object, %error, "Reconcile failed")
                }
                Err(error) => warn!(%error, "Controller event"),
            }
        });
    tokio::select! {
        () = controller => {}
        () = announce_synced => {}
    }
    info!("Controller stopped");
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
    let span = info_span!("reconcile", name = %app.name_any(), namespace = ?app.namespace());
    let deadline = ctx.config.reconcile_timeout;
    let result = tokio::time::timeout(deadline, reconcile_once(&app, &ctx).instrument(span))
        .await
        .unwrap_or(Err(Error::ReconcileDeadline(deadline)));
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let label = ResultLabels {
        result: if result.is_ok() { "success" } else { "error" },
    };
    ctx.metrics.reconciles.get_or_create(&label).inc();
    let outcome = result?;
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
    let attempt = {
        let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures
            .entry(ObjectRef::from_obj(app.as_ref()))
            .or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(attempt, ctx.config.backoff_base, ctx.config.backoff_cap);
    warn!(name = %app.name_any(), %error, attempt, ?delay, "Reconcile failed, retrying");
    if attempt == 1 {
        // One Event per failure streak, not per retry: Events are for people.
        let event = Event {
            type_: EventType::Warning,
            reason: "ReconcileFailed".into(),
            note: Some(error.to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = app.object_ref(&());
        tokio::spawn(async move { ctx.publish(&event, &reference).await });
    }
    Action::requeue(delay)
}

/// `base * 2^(attempt-1)`, capped, then jittered by ±20 % so failing objects spread out.
pub fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exp = base.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(30)));
    jitter(exp.min(cap), 0.2)
}

fn jitter(d: Duration, spread: f64) -> Duration {
    d.mul_f64(1.0 + spread * (2.0 * fastrand::f64() - 1.0))
}

/// One pass.
async fn reconcile_once(app: &MyApp, ctx: &Context) -> Result<Outcome, Error> {
    let name = app.name_any();
    let namespace = app
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(name.clone()))?;
    if app.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the children; there is nothing to converge towards.
        return Ok(Outcome::default());
    }
    ctx.deployments_listed.wait().await;
    ctx.services_listed.wait().await;

    let key = ObjectRef::from_obj(app);
    let observed_deployment = ctx
        .deployments
        .get(&ObjectRef::new(&name).within(&namespace));
    let observed_service = ctx.services.get(&ObjectRef::new(&name).within(&namespace));
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let mut writes = 0;

    let desired = resources::deployment(app);
    let deployment = ctx.child_state(
        &key,
        Child::Deployment,
        &desired,
        observed_deployment.as_deref(),
    );
    if deployment == ChildState::Stale {
        let api = Api::<Deployment>::namespaced(ctx.client.clone(), &namespace);
        if let Some(replicas) = replicas_to_hand_over(app, observed_deployment.as_deref()) {
            let keep = json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas},
            });
            api.patch(
                &name,
                &PatchParams::apply(REPLICAS_HANDOFF_MANAGER).force(),
                &Patch::Apply(&keep),
            )
            .await
            .map_err(Error::HandOffReplicas)?;
            ctx.metrics.wrote("replicas_handoff");
            writes += 1;
        }
        let written = api
            .patch(&name, &apply, &Patch::Apply(&desired))
            .await
            .map_err(Error::ApplyDeployment)?;
        ctx.metrics.wrote("deployment");
        writes += 1;
        info!(%name, %namespace, "Applied Deployment");
        ctx.applied.record(
            (key.clone(), Child::Deployment),
            observed_deployment
                .as_ref()
                .and_then(|d| d.resource_version()),
            written.resource_version().as_deref(),
            digest(&desired),
        );
        ctx.awaiting_rollout.start(key.clone());
    }

    let desired = resources::service(app);
    let service = ctx.child_state(&key, Child::Service, &desired, observed_service.as_deref());
    if service == ChildState::Stale {
        let written = Api::<Service>::namespaced(ctx.client.clone(), &namespace)
            .patch(&name, &apply, &Patch::Apply(&desired))
            .await
            .map_err(Error::ApplyService)?;
        ctx.metrics.wrote("service");
        writes += 1;
        info!(%name, %namespace, "Applied Service");
        ctx.applied.record(
            (key.clone(), Child::Service),
            observed_service.as_ref().and_then(|s| s.resource_version()),
            written.resource_version().as_deref(),
            digest(&desired),
        );
    }

    if deployment != ChildState::Current {
        // The cache holds the Deployment as it was before our apply. The watch event of the
        // apply triggers the next reconcile, which reports on the new one, so a status
        // written now would be overwritten at once (one write saved per change).
        return Ok(Outcome {
            writes,
            recheck: Some(PENDING_GRACE),
        });
    }
    let rollout = observed_deployment.as_deref().map(Rollout::from_deployment);
    let observed = rollout.as_ref().is_some_and(Rollout::is_current);
    if let Some(wait) = ctx.pending_grace_left(&key, observed) {
        // Its controller has not answered our apply yet; its answer triggers a reconcile.
        return Ok(Outcome {
            writes,
            recheck: Some(wait),
        });
    }

    // Compare with our last status write if the cache has not seen it yet.
    let mut reported = Cow::Borrowed(app);
    if let Some(status) = ctx
        .reported
        .unseen(&key, app.meta().resource_version.as_deref())
    {
        reported.to_mut().status = Some(status);
    }
    let status = resources::status(&reported, rollout.as_ref(), Timestamp::now());
    if reported.status.as_ref() != Some(&status) {
        let patch = json!({"apiVersion": "example.com/v1", "kind": "MyApp", "status": status});
        let written = Api::<MyApp>::namespaced(ctx.client.clone(), &namespace)
            .patch_status(&name, &apply, &Patch::Apply(&patch))
            .await
            .map_err(Error::PatchStatus)?;
        ctx.metrics.wrote("status");
        writes += 1;
        let before = reported.status.as_ref().and_then(|s| s.phase);
        let after = status.phase;
        ctx.reported.record(
            key,
            app.resource_version(),
            written.resource_version().as_deref(),
            status,
        );
        if before != after {
            publish_phase_change(ctx, app, before, after).await;
        }
    }
    Ok(Outcome {
        writes,
        recheck: None,
    })
}

/// What the cache says about a child, against what we would apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChildState {
    /// The cache holds it as we would apply it.
    Current,
    /// We applied it as desired; the cache has not seen that apply yet.
    Unseen,
    /// Missing or different: apply.
    Stale,
}

/// The applied-digest annotation of a desired child.
fn digest<K: Resource>(desired: &K) -> String {
    desired
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(resources::APPLIED_DIGEST_ANNOTATION))
        .cloned()
        .unwrap_or_default()
}

impl Context {
    /// Publishes an Event about `regarding`; a failure is logged, never fatal.
    ///
    /// A fresh [`Recorder`] each time, on purpose: a shared one keeps every Event it published
    /// for six minutes (to count repeats into a series), in a map whose capacity never shrinks.
    /// Ours are one per phase change or failure streak, so repeats are rare and the cache would
    /// only hold one full Event per MyApp: measured, the largest single item in memory after
    /// 10,000 creates. Building one costs a client clone and an empty map.
    async fn publish(&self, event: &Event, regarding: &ObjectReference) {
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        if let Err(error) = recorder.publish(event, regarding).await {
            warn!(%error, "Failed to publish Event");
        }
    }

    fn child_state<D: Resource + serde::Serialize, O: Resource + serde::Serialize>(
        &self,
        key: &ObjectRef<MyApp>,
        child: Child,
        desired: &D,
        observed: Option<&O>,
    ) -> ChildState {
        // Asked first, always: a cache that caught up with our write ends its entry.
        let cached = observed.and_then(|o| o.meta().resource_version.as_deref());
        let unseen = self.applied.unseen(&(key.clone(), child), cached);
        if observed.is_some_and(|o| resources::is_applied(desired, o)) {
            ChildState::Current
        } else if unseen.is_some_and(|written| written == digest(desired)) {
            ChildState::Unseen
        } else {
            ChildState::Stale
        }
    }

    /// How much longer to wait before reporting a Deployment its controller has not observed
    /// yet; `None` once it has, or once the grace period after our last apply is over.
    fn pending_grace_left(&self, key: &ObjectRef<MyApp>, observed: bool) -> Option<Duration> {
        if observed {
            self.awaiting_rollout.end(key);
            return None;
        }
        let waited = self.awaiting_rollout.elapsed(key)?;
        PENDING_GRACE
            .checked_sub(waited)
            .filter(|left| !left.is_zero())
    }
}

/// When a MyApp stops setting `spec.replicas`, the Deployment must keep its current count: a
/// field its only manager stops applying is removed (and would default to 1). So the count
/// is first applied by a second manager, which keeps owning it until the MyApp sets it again.
fn replicas_to_hand_over(app: &MyApp, observed: Option<&CachedDeployment>) -> Option<i32> {
    let observed = observed?;
    let we_set_it = observed.annotations.get(resources::REPLICAS_ANNOTATION) == Some("true");
    (app.spec.replicas.is_none() && we_set_it)
        .then(|| observed.spec.as_ref().and_then(|s| s.replicas))
        .flatten()
}

async fn publish_phase_change(
    ctx: &Context,
    app: &MyApp,
    before: Option<Phase>,
    after: Option<Phase>,
) {
    let Some(after) = after else { return };
    let type_ = if after == Phase::Degraded {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let event = Event {
        type_,
        reason: format!("{after:?}"),
        note: Some(match before {
            Some(before) => format!("phase changed from {before:?} to {after:?}"),
            None => format!("phase is {after:?}"),
        }),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.publish(&event, &app.object_ref(&())).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MyAppSpec;

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
    fn the_controller_neither_waits_nor_gives_up_on_a_watch_error() {
        let delays: Vec<_> = EachWatchBacksOff.take(100).collect();
        assert_eq!(delays, vec![Duration::ZERO; 100]);
    }

    #[test]
    fn only_an_unreported_generation_or_a_relist_triggers_a_reconcile() {
        let app = |generation: i64, observed: Option<i64>| {
            let mut app = MyApp::new(
                "web",
                MyAppSpec {
                    replicas: None,
                    image: "nginx".into(),
                    port: 80,
                    env: vec![],
                },
            );
            app.metadata.generation = Some(generation);
            app.status = observed.map(|g| crate::crd::MyAppStatus {
                observed_generation: Some(g),
                ..Default::default()
            });
            app
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
    fn replicas_are_handed_over_only_when_the_spec_stops_setting_them() {
        let mut app = MyApp::new(
            "web",
            MyAppSpec {
                replicas: Some(5),
                image: "nginx".into(),
                port: 80,
                env: vec![],
            },
        );
        app.metadata.namespace = Some("ns".into());
        let applied: CachedDeployment = cache::cached(&resources::deployment(&app));
        assert_eq!(
            replicas_to_hand_over(&app, Some(&applied)),
            None,
            "spec still sets replicas"
        );
        app.spec.replicas = None;
        assert_eq!(replicas_to_hand_over(&app, Some(&applied)), Some(5));
        let unmanaged: CachedDeployment = cache::cached(&resources::deployment(&app));
        assert_eq!(
            replicas_to_hand_over(&app, Some(&unmanaged)),
            None,
            "we never set them"
        );
        assert_eq!(replicas_to_hand_over(&app, None), None);
    }
}
