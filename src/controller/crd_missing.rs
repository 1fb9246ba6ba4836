//! The MyApp CRD missing, said once in words: the watch's 404 becomes one error naming the CRD
//! and the fix, the `myapp_crd_installed` gauge, and quiet retries that back off (up to [`LONGEST_RETRY`])
//! and log again only when the state changes or after [`REMIND_EVERY`].
//!
//! kube's watcher yields `Event::Init` before each list attempt, and its stream backoff resets
//! on every item that is not an error: with the CRD missing, each failed list was preceded by a
//! reset, so the retries never slowed down (every 1.4 s, each logged). [`QuietBackoff`] keeps
//! growing while the CRD is missing.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kube::runtime::{utils::Backoff, watcher};
use tracing::{debug, error, info};

use crate::metrics::Metrics;

/// While the CRD stays missing, the error is logged again this often.
pub const REMIND_EVERY: Duration = Duration::from_secs(600);

/// The command that installs the CRD.
pub const FIX: &str =
    "kubectl apply -f deploy/base/crd.yaml (or: myapp-operator crd | kubectl apply -f -)";

/// What the MyApp watch last said about the CRD; cheap to clone into the watch stream.
#[derive(Clone)]
pub struct CrdPresence {
    metrics: Arc<Metrics>,
    /// `Some(when it was last logged)` while missing, `None` while present or not yet known.
    missing: Arc<Mutex<Option<Instant>>>,
}

impl CrdPresence {
    /// Starts knowing nothing.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            missing: Arc::default(),
        }
    }

    /// Looks at one item of the MyApp watch stream.
    pub fn observe<K>(&self, item: &Result<watcher::Event<K>, watcher::Error>) {
        match item {
            // Emitted before every list attempt, so it says nothing about the CRD.
            Ok(watcher::Event::Init) => {}
            Ok(_) => self.present(),
            Err(error) if is_missing(error) => self.absent(),
            Err(_) => {}
        }
    }

    fn is_missing(&self) -> bool {
        self.missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn present(&self) {
        self.metrics.crd_installed.set(1);
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        if missing.take().is_some() {
            info!(crd = "myapps.example.com", "MyApp CRD installed");
        }
    }

    fn absent(&self) {
        self.metrics.crd_installed.set(0);
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        match *missing {
            Some(logged) if logged.elapsed() < REMIND_EVERY => {
                debug!(crd = "myapps.example.com", "MyApp CRD still not installed");
            }
            _ => {
                error!(
                    crd = "myapps.example.com",
                    fix = FIX,
                    "MyApp CRD is not installed: nothing is reconciled until it is; the webhook keeps serving"
                );
                *missing = Some(Instant::now());
            }
        }
    }
}

/// The longest wait between two lists while the CRD is missing: how long the operator may take
/// to notice that the CRD was installed.
pub const LONGEST_RETRY: Duration = Duration::from_secs(10);

/// kube's default watch backoff (0.8 s doubling, with jitter), at most [`LONGEST_RETRY`], and
/// not reset while the CRD is missing.
pub struct QuietBackoff {
    inner: watcher::DefaultBackoff,
    presence: CrdPresence,
}

impl QuietBackoff {
    /// The backoff of the MyApp watch that `presence` observes.
    pub fn new(presence: CrdPresence) -> Self {
        Self {
            inner: watcher::DefaultBackoff::default(),
            presence,
        }
    }
}

impl Iterator for QuietBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        self.inner.next().map(|delay| delay.min(LONGEST_RETRY))
    }
}

impl Backoff for QuietBackoff {
    fn reset(&mut self) {
        if !self.presence.is_missing() {
            self.inner.reset();
        }
    }
}

/// Whether a watch error is the API server not serving MyApps at all (404 on list or watch).
pub fn is_missing(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_found() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(404),
        )))
    }

    #[test]
    fn the_backoff_keeps_growing_while_the_crd_is_missing() {
        let mut registry = prometheus_client::registry::Registry::default();
        let presence = CrdPresence::new(Arc::new(Metrics::register(&mut registry)));
        presence.observe::<()>(&Err(not_found()));
        let mut backoff = QuietBackoff::new(presence.clone());
        let mut delays = Vec::new();
        for _ in 0..7 {
            backoff.reset();
            delays.push(backoff.next().unwrap());
        }
        assert_eq!(delays[6], LONGEST_RETRY, "{delays:?}");
        presence.observe::<()>(&Ok(watcher::Event::InitDone));
        backoff.reset();
        assert!(backoff.next().unwrap() < Duration::from_secs(2));
    }

    #[test]
    fn a_404_sets_the_gauge_to_0_and_the_next_success_back_to_1() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let presence = CrdPresence::new(metrics.clone());
        presence.observe::<()>(&Err(not_found()));
        assert_eq!(metrics.crd_installed.get(), 0);
        assert!(presence.missing.lock().unwrap().is_some());
        presence.observe::<()>(&Ok(watcher::Event::Init));
        assert_eq!(
            metrics.crd_installed.get(),
            0,
            "Init comes before every list"
        );
        presence.observe::<()>(&Ok(watcher::Event::InitDone));
        assert_eq!(metrics.crd_installed.get(), 1);
        assert!(presence.missing.lock().unwrap().is_none());
    }
}
