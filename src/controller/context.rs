//! What every reconcile shares: the client and its write gate, the watch caches, the memories
//! of our own writes, fights and failure streaks, and the Events being published.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use kube::{
    Client,
    runtime::{
        events::Reporter,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio_util::task::TaskTracker;
use tracing::info;

pub(super) use super::child::Child;
use super::write::Writer;
use crate::{
    cache::{CachedDeployment, CachedMyApp, CachedService, ReportedStatus},
    fight,
    metrics::Metrics,
    packed::Packed,
    recent::{RecentWrites, Waiting},
};

/// Reconciles running at once unless told otherwise (`run --concurrency`): a reconcile mostly
/// waits for the API server, and with more in flight one wake-up of the operator's thread
/// serves several (`benches/README.md`, "Concurrency").
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// Tunables of the controller, set from the CLI.
#[derive(Clone, Debug)]
pub struct Config {
    /// Reconciles running at once.
    pub concurrency: u16,
    /// Safety-net resync period: every MyApp is reconciled once per period besides what
    /// triggers it.
    pub resync: Duration,
    /// Deadline of one reconcile.
    pub reconcile_timeout: Duration,
    /// First retry delay after an error; doubles per consecutive error of the same object.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_cap: Duration,
    /// Objects per page when a watch (re)lists. Each page is held in memory while it is read,
    /// and each costs a request and its round trip: the default is where bigger pages stop
    /// making a relist faster and only make its peak higher (`benches/README.md`, "List page
    /// size").
    pub page_size: u32,
    /// Name of this replica for Events (the pod name in a cluster).
    pub instance: Option<String>,
    /// The shard this controller reconciles, when sharding is on: it watches only the MyApps
    /// and children whose [`crate::shard::SHARD_LABEL`] names it, and lets go of a MyApp the
    /// sharder drains. Without one it reconciles every MyApp.
    pub shard: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            concurrency: DEFAULT_CONCURRENCY,
            resync: Duration::from_secs(300),
            reconcile_timeout: Duration::from_secs(30),
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(300),
            page_size: 250,
            instance: None,
            shard: None,
        }
    }
}

/// What every reconcile shares.
pub(super) struct Context {
    pub(super) client: Client,
    /// Makes every write, through the write gate.
    pub(super) writer: Writer,
    /// The MyApp cache, to tell whether a MyApp still exists after creating its child.
    pub(super) apps: reflector::Store<CachedMyApp>,
    pub(super) deployments: Packed<CachedDeployment>,
    pub(super) services: Packed<CachedService>,
    /// Whether each child cache holds a complete list yet.
    pub(super) deployments_listed: Listed,
    pub(super) services_listed: Listed,
    /// Who publishes our Events (see [`Context::publish`]).
    pub(super) reporter: Reporter,
    pub(super) metrics: Arc<Metrics>,
    pub(super) config: Config,
    /// Consecutive failures per MyApp (kube-runtime keeps no such state).
    pub(super) failures: Arc<Failures>,
    /// Children found to hold what their MyApp asks, by the versions compared.
    pub(super) verified: Arc<super::verified::Verified>,
    /// Our child applies the caches have not seen yet, by digest.
    pub(super) applied: Arc<Applied>,
    /// Our status writes the MyApp cache has not seen yet.
    pub(super) reported: Arc<Reported>,
    /// Deployments we applied whose controller has not observed the apply yet.
    pub(super) awaiting_rollout: Waiting<ObjectRef<CachedMyApp>>,
    /// Children deleted lately (see [`crate::plan::RECREATE_HOLD`]).
    pub(super) deleted: Arc<Waiting<(ObjectRef<CachedMyApp>, Child)>>,
    /// Rewrites of each Deployment at one generation: fights with another writer.
    pub(super) fights: fight::Fights,
    /// Events being published, waited for (a little) when the controller stops.
    pub(super) publishing: TaskTracker,
    /// Cancelled when the controller is asked to stop: a reconcile still waiting for the
    /// children's lists has written nothing and ends, so that a graceful stop waits only for
    /// reconciles that may be writing.
    pub(super) stopping: tokio_util::sync::CancellationToken,
}

/// Child applies by MyApp and child: see [`Context::applied`].
pub(super) type Applied = RecentWrites<(ObjectRef<CachedMyApp>, Child), String>;

/// Status writes by MyApp: see [`Context::reported`].
pub(super) type Reported = RecentWrites<ObjectRef<CachedMyApp>, ReportedStatus>;

/// How long a stopping controller waits for the Events it is still publishing.
pub(super) const PUBLISH_AT_STOP: Duration = Duration::from_secs(2);

/// How long our writes are remembered for read-your-writes: far longer than a watch event
/// takes to arrive.
pub(super) const RECENT_WRITES_TTL: Duration = Duration::from_secs(30);

impl Context {
    /// Whether the MyApp cache still holds `app`.
    pub(super) fn still_there(&self, app: &ObjectRef<CachedMyApp>) -> bool {
        self.apps.get(app).is_some()
    }

    /// Counts `child`, just created, as an orphan: its MyApp was deleted meanwhile (once, also
    /// if its delete event counts it too).
    pub(super) fn orphaned(&self, app: &ObjectRef<CachedMyApp>, child: Child) {
        if self.applied.take_created_after(&(app.clone(), child), None) {
            self.metrics.orphans.inc();
            let namespace = app.namespace.as_deref().unwrap_or_default();
            info!(name = %app.name, %namespace, ?child, "Created a child of a deleted MyApp; the garbage collector removes it");
        }
    }
}

/// Consecutive failures per MyApp, cleared by a success or by the MyApp's deletion: a MyApp
/// created again under the same name starts afresh (short backoff, a new Warning Event).
#[derive(Debug, Default)]
pub(super) struct Failures(Mutex<HashMap<ObjectRef<CachedMyApp>, u32>>);

impl Failures {
    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectRef<CachedMyApp>, u32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more failure of `app`; which attempt that was.
    pub(super) fn failed(&self, app: ObjectRef<CachedMyApp>) -> u32 {
        let mut failures = self.lock();
        let n = failures.entry(app).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// Ends the streak of `app`.
    pub(super) fn succeeded(&self, app: &ObjectRef<CachedMyApp>) {
        self.lock().remove(app);
    }

    /// Whether `app` is in a failure streak (its retries wait for their backoff).
    pub(super) fn failing(&self, app: &ObjectRef<CachedMyApp>) -> bool {
        self.lock().contains_key(app)
    }

    /// How many MyApps are in a failure streak.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Forgets the streak of a MyApp once its delete event arrives, and after a (re)list those
    /// of MyApps the list no longer holds (deleted while the watch was down).
    pub(super) fn forget_deleted(
        self: &Arc<Self>,
        apps: Store<CachedMyApp>,
    ) -> impl FnMut(&watcher::Event<CachedMyApp>) + Send + Sync + 'static {
        let failures = self.clone();
        move |event| match event {
            watcher::Event::Delete(app) => failures.succeeded(&ObjectRef::from_obj(app)),
            watcher::Event::InitDone => failures.lock().retain(|app, _| apps.get(app).is_some()),
            _ => {}
        }
    }
}

/// Whether a watch cache holds its first complete list; any number of tasks may wait for it.
///
/// Not kube's `Store::wait_until_ready`: its `DelayedInit` keeps a single waker, so of two
/// tasks waiting at once only the one that polled last is woken. The Controller waits on the
/// MyApp store that way, so a second waiter (ours, for `Caches synced`) was never woken.
#[derive(Clone, Debug, Default)]
pub(super) struct Listed(Arc<tokio::sync::watch::Sender<bool>>);

impl Listed {
    pub(super) fn mark(&self) {
        self.0.send_replace(true);
    }

    /// Whether the cache is listed.
    pub(super) fn done(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the cache is listed.
    pub(super) async fn wait(&self) {
        // Cannot fail: `self` holds a sender, so the channel stays open.
        let _ = self.0.subscribe().wait_for(|done| *done).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MyApp;

    #[test]
    fn a_failure_streak_ends_with_a_success_or_the_myapps_deletion() {
        let (apps, mut writer) = kube::runtime::reflector::store::<CachedMyApp>();
        let failures = Arc::new(Failures::default());
        let mut forget = failures.forget_deleted(apps);
        let web: CachedMyApp = MyApp::test("web").in_namespace("shop").stored().into();
        let api: CachedMyApp = MyApp::test("api").in_namespace("shop").stored().into();
        let key = |app: &CachedMyApp| ObjectRef::from_obj(app);
        assert_eq!(failures.failed(key(&web)), 1);
        assert_eq!(failures.failed(key(&web)), 2);
        failures.succeeded(&key(&web));
        assert_eq!(failures.failed(key(&web)), 1, "a success ends the streak");

        // Deleted mid-streak, then created again under the same name: a fresh start.
        forget(&watcher::Event::Delete(web.clone()));
        assert_eq!(
            failures.failed(key(&web)),
            1,
            "the deletion ended the streak"
        );

        // Deleted while the watch was down: the relist no longer holds it.
        failures.failed(key(&api));
        let relisted = watcher::Event::InitApply(web.clone());
        for event in [watcher::Event::Init, relisted, watcher::Event::InitDone] {
            writer.apply_watcher_event(&event);
            forget(&event);
        }
        assert_eq!(
            failures.len(),
            1,
            "only the MyApp still listed keeps its streak"
        );
        assert_eq!(failures.failed(key(&web)), 2);
    }
}
