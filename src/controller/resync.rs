//! The safety-net resync: every cached MyApp reconciled once per period, each at the same point
//! of every period (a hash of its namespace and name), besides what watch events trigger.
//!
//! kube's way is a requeue after every reconcile (`Action::requeue`), which keeps an entry per
//! MyApp in the controller's scheduler for as long as the MyApp exists: its key (four strings)
//! twice, in a map and in a timer queue. A pass here holds a hash and one short string per
//! MyApp, and only while it lasts; the scheduler holds what is due now. Retries after an error
//! keep their backoff: a MyApp in a failure streak is left to it.

use std::{
    hash::{BuildHasher, BuildHasherDefault, DefaultHasher},
    sync::Arc,
    time::Duration,
};

use futures::{Stream, StreamExt, stream};
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use tokio::time::Instant;

use super::context::Failures;
use crate::{cache::CachedMyApp, packed::key};

/// The shortest time between two hand-overs of a pass. The scheduler gets the MyApps due in
/// between together, so the runtime wakes once for a batch rather than once per MyApp; a tenth
/// of a second later matters to no resync.
const TICK: Duration = Duration::from_millis(100);

/// `ObjectRef`s of the cached MyApps, each once per `period`, handed over when their points come
/// (at most one hand-over per [`TICK`]). The first pass starts one period after the call: the
/// first list triggers every MyApp anyway.
pub(super) fn resyncs(
    apps: Store<CachedMyApp>,
    period: Duration,
    failures: Arc<Failures>,
) -> impl Stream<Item = ObjectRef<CachedMyApp>> + Send + 'static {
    let now = Instant::now();
    let pass = Pass::new(Vec::new(), now);
    stream::unfold(
        (pass, now, apps, failures),
        move |(mut pass, woke, apps, failures)| async move {
            // Asleep until a point comes: an operator with few MyApps, or none, wakes for
            // them only, not ten times a second.
            tokio::time::sleep_until(pass.next_point(period).max(woke + TICK)).await;
            let now = Instant::now();
            let due: Vec<_> = pass
                .due(now, period)
                .filter_map(|key| object_ref(&key))
                .filter(|app| !failures.failing(app))
                .collect();
            if pass.ended(now, period) {
                pass = Pass::new(keys(&apps), now);
            }
            Some((stream::iter(due), (pass, now, apps, failures)))
        },
    )
    .flatten()
}

/// Where in a period a MyApp's resync falls: a hash of its key as a fraction of `u64::MAX`. The
/// hasher has fixed keys, so the point stays the same from one pass (and process) to the next.
fn point(key: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key)
}

/// `namespace/name` of every cached MyApp with its [`point`], in the order of their points.
fn keys(apps: &Store<CachedMyApp>) -> Vec<(u64, Box<str>)> {
    let mut keys: Vec<_> = apps
        .state()
        .iter()
        .map(|app| {
            let key = key(&app.namespace().unwrap_or_default(), &app.name_any());
            (point(&key), key)
        })
        .collect();
    keys.sort_unstable();
    keys
}

/// The `ObjectRef` of a [`key`].
fn object_ref(key: &str) -> Option<ObjectRef<CachedMyApp>> {
    let (namespace, name) = key.split_once('/')?;
    Some(ObjectRef::new(name).within(namespace))
}

/// One period's walk over the MyApps cached when it started.
struct Pass {
    keys: std::vec::IntoIter<(u64, Box<str>)>,
    started: Instant,
}

impl Pass {
    fn new(keys: Vec<(u64, Box<str>)>, started: Instant) -> Self {
        Self {
            keys: keys.into_iter(),
            started,
        }
    }

    /// The keys whose point the pass has reached by `now` and not handed over yet; all that are
    /// left once the period is over.
    fn due(&mut self, now: Instant, period: Duration) -> impl Iterator<Item = Box<str>> + '_ {
        let reached = now.saturating_duration_since(self.started).as_secs_f64()
            / period.as_secs_f64().max(f64::MIN_POSITIVE);
        // `as` saturates: a pass past its period reaches every point.
        let reached = (reached * u64::MAX as f64) as u64;
        std::iter::from_fn(move || {
            let (point, _) = self.keys.as_slice().first()?;
            if *point > reached {
                return None;
            }
            self.keys.next().map(|(_, key)| key)
        })
    }

    /// When the pass reaches the point of the next key it has not handed over, or, with none
    /// left, its period is over.
    fn next_point(&self, period: Duration) -> Instant {
        let fraction = self
            .keys
            .as_slice()
            .first()
            .map_or(1.0, |(point, _)| *point as f64 / u64::MAX as f64);
        self.started + period.mul_f64(fraction)
    }

    /// Whether the period is over and every key handed over.
    fn ended(&self, now: Instant, period: Duration) -> bool {
        self.keys.len() == 0 && now.saturating_duration_since(self.started) >= period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass over `count` MyApps named `ns/app-<i>`, and their keys in name order.
    fn pass(count: usize) -> (Pass, Vec<Box<str>>) {
        let mut names: Vec<Box<str>> = (0..count).map(|i| format!("ns/app-{i}").into()).collect();
        let mut keys: Vec<_> = names.iter().map(|n| (point(n), n.clone())).collect();
        keys.sort_unstable();
        names.sort_unstable();
        (Pass::new(keys, Instant::now()), names)
    }

    #[test]
    fn a_pass_hands_over_each_myapp_once_at_its_point_of_the_period() {
        let (mut pass, names) = pass(1000);
        let (start, period) = (pass.started, Duration::from_secs(100));
        let mut seen = Vec::new();
        for second in 1..=100u64 {
            let now = start + Duration::from_secs(second);
            let due: Vec<_> = pass.due(now, period).collect();
            let limit = (second as f64 / 100.0 * u64::MAX as f64) as u64;
            assert!(due.iter().all(|key| point(key) <= limit), "none early");
            assert!(pass.ended(now, period) == (second == 100), "{second}");
            seen.extend(due);
        }
        seen.sort_unstable();
        assert_eq!(seen, names, "each exactly once");
    }

    #[test]
    fn a_pass_wakes_at_its_next_point_and_without_one_at_its_end() {
        let period = Duration::from_secs(100);
        let empty = Pass::new(Vec::new(), Instant::now());
        assert_eq!(empty.next_point(period), empty.started + period);

        let (mut pass, _) = pass(3);
        let start = pass.started;
        while let Some((point, _)) = pass.keys.as_slice().first().cloned() {
            let at = pass.next_point(period);
            assert!(at > start && at <= start + period);
            assert_eq!(pass.due(at - Duration::from_millis(1), period).count(), 0);
            let due: Vec<_> = pass.due(at + Duration::from_millis(1), period).collect();
            assert!(
                due.iter().any(|key| self::point(key) == point),
                "due at its point"
            );
        }
        assert_eq!(pass.next_point(period), start + period);
    }

    #[test]
    fn myapps_spread_over_the_period() {
        let (mut pass, _) = pass(10_000);
        let (start, period) = (pass.started, Duration::from_secs(10));
        for tenth in 1..=10u64 {
            let due = pass.due(start + Duration::from_secs(tenth), period).count();
            assert!((800..1200).contains(&due), "{due} in second {tenth}");
        }
    }

    #[tokio::test]
    async fn every_cached_myapp_comes_back_each_period_but_one_in_a_failure_streak() {
        let (apps, mut writer) = kube::runtime::reflector::store::<CachedMyApp>();
        for name in ["web", "broken"] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(
                crate::crd::MyApp::test(name).stored().into(),
            ));
        }
        let failures = Arc::new(Failures::default());
        failures.failed(ObjectRef::new("broken").within("default"));
        let period = Duration::from_millis(200);
        let handed: Vec<_> = resyncs(apps, period, failures)
            .take_until(tokio::time::sleep(period * 6))
            .collect()
            .await;
        // Passes start after 200, 400, 600, 800 ms and so on (later on a loaded machine).
        let web = ObjectRef::new("web").within("default");
        assert!(
            handed.iter().filter(|r| **r == web).count() >= 2,
            "{handed:?}"
        );
        assert!(handed.iter().all(|r| *r == web), "{handed:?}");
    }

    #[test]
    fn a_point_is_the_same_in_every_pass() {
        assert_eq!(point("ns/web"), point("ns/web"));
        assert_ne!(point("ns/web"), point("ns/api"));
        assert_eq!(
            object_ref("team-a/web"),
            Some(ObjectRef::new("web").within("team-a"))
        );
        assert_eq!(object_ref("no-slash"), None);
    }
}
