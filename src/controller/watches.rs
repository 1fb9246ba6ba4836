//! The watches' side of the controller: which events trigger which reconcile, what each
//! event tells the memories of our own writes, and when a cache holds a complete list.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{channel::mpsc::UnboundedSender, future};
use kube::{
    Resource, ResourceExt,
    runtime::{
        reflector::{ObjectRef, Store, store::Writer},
        utils::Backoff,
        watcher,
    },
};

use super::context::{Applied, Child, Listed, Reported};
use crate::{
    cache::CachedMyApp,
    metrics::{Metrics, queue::Queue},
    recent::Waiting,
};

/// Applies the MyApp watch's events to the cache as kube's reflector does, but for relists
/// after the first: those update the cache in place, object by object, and at their end remove
/// what they did not hold. kube's writer fills a second cache during a relist and swaps it in at
/// its end, so a relist held every MyApp twice, most of its memory peak. Here a relist holds a
/// key per MyApp beside the cache, and the cache ends up as the swap would leave it. The first
/// list goes through kube's way: it fills an empty cache, and its end marks the cache ready.
pub(super) fn reflect_in_place(
    mut writer: Writer<CachedMyApp>,
) -> impl FnMut(&watcher::Event<CachedMyApp>) + Send + Sync + 'static {
    let cache = writer.as_reader();
    let (mut listed_once, mut listed) = (false, HashSet::<Box<str>>::new());
    let key = |app: &CachedMyApp| {
        crate::packed::key(&app.namespace().unwrap_or_default(), &app.name_any())
    };
    move |event| match event {
        watcher::Event::InitDone if !listed_once => {
            writer.apply_watcher_event(event);
            listed_once = true;
        }
        _ if !listed_once => writer.apply_watcher_event(event),
        watcher::Event::Init => listed.clear(),
        watcher::Event::InitApply(app) => {
            listed.insert(key(app));
            writer.apply_watcher_event(&watcher::Event::Apply(app.clone()));
        }
        watcher::Event::InitDone => {
            for app in cache.state() {
                if !listed.contains(&key(&app)) {
                    writer.apply_watcher_event(&watcher::Event::Delete(CachedMyApp::clone(&app)));
                }
            }
            listed = HashSet::new();
        }
        watcher::Event::Apply(_) | watcher::Event::Delete(_) => writer.apply_watcher_event(event),
    }
}

/// Notes into `entering` whether each MyApp watch event brings a MyApp `cache` does not hold
/// yet, before the cache takes the event in; the filter after it reads the note (the stream
/// handles one event at a time through every step).
pub(super) fn note_entering(
    cache: Store<CachedMyApp>,
    entering: Arc<AtomicBool>,
) -> impl FnMut(&watcher::Event<CachedMyApp>) + Send + Sync + 'static {
    move |event| {
        let new = matches!(event, watcher::Event::Apply(app)
            if cache.get(&ObjectRef::from_obj(app)).is_none());
        entering.store(new, Ordering::Relaxed);
    }
}

/// Counts a MyApp from its own watch as waiting.
pub(super) fn queue_self(queue: &Arc<Queue>) -> impl FnMut(&CachedMyApp) + Send + Sync + 'static {
    let queue = queue.clone();
    move |app| queue.triggered(app.namespace().as_deref(), &app.name_any())
}

/// Counts the MyApp owning a child as waiting, found as the Controller finds it (kube's
/// `trigger_owners`: every owner reference of MyApp's kind and group).
pub(super) fn queue_owner<K: Resource>(
    queue: &Arc<Queue>,
) -> impl FnMut(&K) + Send + Sync + 'static {
    let queue = queue.clone();
    move |child| {
        for app in owners(child) {
            queue.triggered(app.namespace.as_deref(), &app.name);
        }
    }
}

/// The MyApps owning a child: every owner reference of MyApp's kind and group.
fn owners<K: Resource>(child: &K) -> impl Iterator<Item = ObjectRef<CachedMyApp>> + '_ {
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
pub(super) fn not_an_echo<K: Resource>(
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
/// reconcile (`needs_reconcile`), whose lookup would have ended the entry, so what a plan reads
/// of every MyApp's last status would stay in memory a second time until its next reconcile
/// (the resync) looked it up, or a later write pruned it once expired.
pub(super) fn forget_seen_status(
    reported: &Arc<Reported>,
) -> impl FnMut(&watcher::Event<CachedMyApp>) + Send + Sync + 'static {
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
pub(super) fn count_orphans(
    applied: &Arc<Applied>,
    metrics: &Arc<Metrics>,
) -> impl FnMut(&watcher::Event<CachedMyApp>) + Send + Sync + 'static {
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

/// Remembers when a child of a MyApp was deleted (see [`crate::plan::RECREATE_HOLD`]).
pub(super) fn remember_deleted<K: Resource>(
    deleted: &Arc<Waiting<(ObjectRef<CachedMyApp>, Child)>>,
    child: Child,
) -> impl FnMut(&watcher::Event<K>) + Send + Sync + 'static {
    let deleted = deleted.clone();
    move |event| {
        if let watcher::Event::Delete(object) = event {
            for app in owners(object) {
                deleted.start((app, child));
            }
        }
    }
}

/// Signals `relisted` each time a watch's cache has swapped in a complete (re)list, and marks
/// that cache `listed`.
pub(super) fn on_list_done<K: 'static>(
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

/// The Controller's backoff on watch errors, off: each watch above backs off on its own.
///
/// kube's default pauses the merged stream of all three watches whenever any one of them errs,
/// on top of that watch's own backoff, so one watch's 410 would stall the other two and their
/// caches, with pauses that grow when errors come back to back.
pub(super) struct EachWatchBacksOff;

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
/// not report the current generation, or when the sharder drains the MyApp, so status-only
/// changes (our own status writes among them) do not trigger, while a new or edited spec does. Every object of a (re)list does, and once
/// the list is complete every MyApp is reconciled again (see `on_list_done`).
///
/// This is kube's `predicates::generation` without its memory: that one remembers the last
/// generation of every object (a key of three strings each), where the object itself says
/// which generation was reconciled last. Unlike it, this lets through metadata-only changes of
/// a MyApp whose current generation has not been reported yet (one that keeps failing), so such
/// a change retries it at once rather than after its backoff.
pub(super) fn needs_reconcile(event: &watcher::Event<CachedMyApp>) -> bool {
    match event {
        watcher::Event::Apply(app) => {
            let observed = app.status.as_ref().and_then(|s| s.observed_generation);
            app.draining || observed.is_none() || observed != app.metadata.generation
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::RECENT_WRITES_TTL;
    use super::*;
    use crate::{
        cache::{self, CachedDeployment, ReportedStatus},
        crd::{MyApp, MyAppStatus},
        recent::RecentWrites,
    };

    #[test]
    fn a_relist_updates_the_myapp_cache_in_place_and_at_its_end_it_holds_exactly_the_list() {
        use watcher::Event::{Apply, Init, InitApply, InitDone};
        let (cache, writer) = kube::runtime::reflector::store::<CachedMyApp>();
        let mut reflect = reflect_in_place(writer);
        let app = |name: &str, version: &str| {
            let mut app = CachedMyApp::from(MyApp::test(name).stored());
            app.metadata.resource_version = Some(version.into());
            app
        };
        let cached = |name: &str| {
            cache
                .get(&ObjectRef::new(name).within("default"))
                .and_then(|a| a.resource_version())
        };
        for event in [Init, InitApply(app("a", "1")), InitApply(app("b", "2"))] {
            reflect(&event);
        }
        assert!(
            cache.state().is_empty(),
            "the first list fills the cache at its end"
        );
        reflect(&InitDone);
        assert_eq!(cache.state().len(), 2);
        reflect(&Apply(app("c", "3")));

        // A relist given up half-way, then one that completes.
        for event in [Init, InitApply(app("x", "4")), Init] {
            reflect(&event);
        }
        reflect(&InitApply(app("a", "5")));
        reflect(&InitApply(app("c", "3")));
        assert_eq!(
            cached("a").as_deref(),
            Some("5"),
            "updated as its page arrives"
        );
        assert_eq!(
            cached("b").as_deref(),
            Some("2"),
            "kept until the list ends"
        );
        reflect(&InitDone);
        let mut names: Vec<_> = cache.state().iter().map(|a| a.name_any()).collect();
        names.sort();
        assert_eq!(names, ["a", "c"], "b and x were not in the completed list");
        assert_eq!(cached("a").as_deref(), Some("5"));
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
            CachedMyApp::from(match observed {
                Some(g) => app.status(MyAppStatus {
                    observed_generation: Some(g),
                    ..Default::default()
                }),
                None => app,
            })
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
            let mut child: CachedDeployment =
                cache::cached(&crate::resources::deployment(&app, None));
            child.metadata.resource_version = Some(version.into());
            child
        };
        let applied = Arc::new(Applied::new(RECENT_WRITES_TTL));
        let key = (ObjectRef::new("web").within("shop"), Child::Deployment);
        applied.record(key.clone(), Some("7".into()), Some("8"), "digest".into());
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
        applied.record(key, Some("8".into()), Some("9"), "digest".into());
        assert!(triggers(&mut deployments, "10"), "a write after ours");
    }

    #[test]
    fn a_status_write_is_forgotten_once_the_myapp_cache_holds_it() {
        let app = |version: &str| {
            let mut app = CachedMyApp::from(MyApp::test("web").in_namespace("shop").stored());
            app.metadata.resource_version = Some(version.into());
            app
        };
        let reported = Arc::new(RecentWrites::new(RECENT_WRITES_TTL));
        let key = ObjectRef::from_obj(&app("7"));
        reported.record(
            key.clone(),
            Some("7".into()),
            Some("8"),
            ReportedStatus::of(&MyAppStatus::default()),
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
