//! The write gate: a replica writes only while it can prove that it still holds its Lease.
//!
//! Holding a Lease is a belief renewed every retry period. Between two renewals the process may
//! be paused (SIGSTOP, a CPU-throttled container, a node under memory pressure, a VM migrated or
//! suspended) and wake up after another replica has taken over. When it wakes, tokio polls every
//! ready task in no particular order, so reconciles planned before the pause would write before
//! the lease loop could read the Lease and stop them. So every write the controller makes (child
//! and status applies, the replicas hand-off, Events) first asks the [`Gate`], which compares the
//! boot clock with the deadline the last successful renewal earned. `CLOCK_BOOTTIME` runs through
//! SIGSTOP and through system suspend, where `CLOCK_MONOTONIC` (and so tokio's `Instant`) stops:
//! a pause never looks like no time passed.
//!
//! Past the deadline the gate closes itself, at the first check that finds it so or when its
//! [`Gate::enforce`] timer fires, whichever comes first: the controller and the Events still
//! queued wait on [`Gate::closed`] and stop at once, without a Lease read.
//!
//! What no local check can close is the moment between the check and the request reaching the
//! API server. Writes to objects that exist carry a resourceVersion precondition (see
//! `controller`), so the API server refuses one planned from a state that changed since.
//!
//! client-go's leader election does not fence writes at all (its package documentation says so);
//! this is stricter. One gate guards one Lease; a replica holding several Leases (shards) has a
//! gate for each.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};
use tokio::sync::watch;

/// A reading of the boot clock: time since the machine booted, suspend included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootTime(Duration);

impl BootTime {
    /// The reading `since_boot` after boot.
    pub fn from_since_boot(since_boot: Duration) -> Self {
        Self(since_boot)
    }

    /// This reading plus `span`.
    pub fn after(self, span: Duration) -> Self {
        Self(self.0.saturating_add(span))
    }

    /// How long from `earlier` to this reading (zero if `earlier` is later).
    pub fn since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    fn nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Where the gate reads the time: the boot clock in production, a hand-set one in tests.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now.
    fn now(&self) -> BootTime;
}

/// `CLOCK_BOOTTIME` on Linux. Elsewhere the monotonic clock (on macOS it runs through sleep).
#[derive(Clone, Copy, Debug, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> BootTime {
        #[cfg(target_os = "linux")]
        let id = rustix::time::ClockId::Boottime;
        #[cfg(all(unix, not(target_os = "linux")))]
        let id = rustix::time::ClockId::Monotonic;
        #[cfg(unix)]
        {
            let t = rustix::time::clock_gettime(id);
            let secs = u64::try_from(t.tv_sec).unwrap_or(0);
            let nanos = u32::try_from(t.tv_nsec).unwrap_or(0);
            BootTime(Duration::new(secs, nanos))
        }
        #[cfg(not(unix))]
        {
            static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            BootTime(START.get_or_init(std::time::Instant::now).elapsed())
        }
    }
}

/// A write the gate refused: the Lease's deadline has passed (or it was never held).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not written: this replica no longer holds the Lease (its deadline passed)")]
pub struct Fenced;

/// `until` when the gate is closed.
const CLOSED: u64 = 0;
/// `until` when the gate never closes (leader election off: the only replica).
const ALWAYS: u64 = u64::MAX;

/// The write gate of one Lease: open until a deadline on the boot clock.
#[derive(Debug)]
pub struct Gate {
    clock: Arc<dyn Clock>,
    /// The deadline in nanoseconds of boot time, [`CLOSED`] or [`ALWAYS`].
    until: AtomicU64,
    /// Whether the gate is open, for those who wait for it to open or close.
    open: watch::Sender<bool>,
    /// Writes refused since the start.
    refused: AtomicU64,
    /// Events dropped unpublished because the gate closed.
    dropped_events: AtomicU64,
    /// How many times the gate opened after being closed or past its deadline.
    tenures: AtomicU64,
}

impl Gate {
    /// A closed gate reading `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            until: AtomicU64::new(CLOSED),
            open: watch::Sender::new(false),
            refused: AtomicU64::new(0),
            dropped_events: AtomicU64::new(0),
            tenures: AtomicU64::new(0),
        }
    }

    /// A closed gate on the boot clock.
    pub fn boot_clock() -> Self {
        Self::new(Arc::new(BootClock))
    }

    /// The gate's clock, now: a renewal takes its start from here.
    pub fn now(&self) -> BootTime {
        self.clock.now()
    }

    /// Opens the gate until `deadline` (a renewal succeeded), unless that is already past.
    /// Returns whether it is open.
    pub fn open_until(&self, deadline: BootTime) -> bool {
        if self.now() >= deadline {
            self.close();
            return false;
        }
        let lapsed = !self.is_open();
        if lapsed {
            self.tenures.fetch_add(1, Ordering::SeqCst);
        }
        self.until.store(deadline.nanos().max(1), Ordering::SeqCst);
        // A new tenure is news even to those who never saw the gate closed ([`Gate::left`]).
        self.open
            .send_if_modified(|open| !std::mem::replace(open, true) || lapsed);
        true
    }

    /// Opens the gate for good: the only replica, without leader election.
    pub fn open_always(&self) {
        if !self.is_open() {
            self.tenures.fetch_add(1, Ordering::SeqCst);
        }
        self.until.store(ALWAYS, Ordering::SeqCst);
        self.open
            .send_if_modified(|open| !std::mem::replace(open, true));
    }

    /// Closes the gate now (the Lease was lost or released).
    pub fn close(&self) {
        self.until.store(CLOSED, Ordering::SeqCst);
        self.open
            .send_if_modified(|open| std::mem::replace(open, false));
    }

    /// Asks to write: `Ok` while the deadline is ahead. A check that finds it past closes the
    /// gate (waking everyone waiting on [`Gate::closed`]) and counts the refusal.
    pub fn check(&self) -> Result<(), Fenced> {
        if self.is_open() {
            return Ok(());
        }
        if self.until.load(Ordering::SeqCst) != CLOSED {
            self.close();
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(Fenced)
    }

    /// `request`, named `verb` as kube's client names the span of its own calls, if a write may
    /// pass now ([`Gate::check`]). Called last before the send, so that nothing but the
    /// transport lies between the check and it. A refused write fails with [`Fenced`] inside
    /// `kube::Error::Service` (see [`fenced`]).
    pub fn pass(
        &self,
        mut request: http::Request<Vec<u8>>,
        verb: &'static str,
    ) -> Result<http::Request<Vec<u8>>, kube::Error> {
        request.extensions_mut().insert(verb);
        self.check()
            .map_err(|fenced| kube::Error::Service(Box::new(fenced)))?;
        Ok(request)
    }

    /// Which tenure the gate is in: raised each time it opens after being closed or past its
    /// deadline. A holder that lapsed and renewed is in another tenure even if nobody saw the
    /// gate closed in between (the deadline passed during a pause, and the renewal came first).
    pub fn tenure(&self) -> u64 {
        self.tenures.load(Ordering::SeqCst)
    }

    /// Whether the gate is open in `tenure`: open now, and not reopened since.
    pub fn holds(&self, tenure: u64) -> bool {
        self.is_open() && self.tenure() == tenure
    }

    /// Whether a write would pass now. Reads the clock; changes nothing.
    pub fn is_open(&self) -> bool {
        match self.until.load(Ordering::SeqCst) {
            CLOSED => false,
            ALWAYS => true,
            until => self.now().nanos() < until,
        }
    }

    /// How long the gate stays open from now: `None` if closed, `Duration::MAX` if always.
    pub fn remaining(&self) -> Option<Duration> {
        match self.until.load(Ordering::SeqCst) {
            CLOSED => None,
            ALWAYS => Some(Duration::MAX),
            until => Some(Duration::from_nanos(
                until.saturating_sub(self.now().nanos()),
            ))
            .filter(|left| !left.is_zero()),
        }
    }

    /// Resolves once the gate is open.
    pub async fn opened(&self) {
        // Cannot fail: `self` holds the sender.
        let _ = self.open.subscribe().wait_for(|open| *open).await;
    }

    /// Resolves once the gate is closed (at once if it is).
    pub async fn closed(&self) {
        let _ = self.open.subscribe().wait_for(|open| !*open).await;
    }

    /// Resolves once the gate is no longer open in `tenure` (at once if it is not): closed, or
    /// opened again in a new tenure, which [`Gate::closed`] may never see.
    pub async fn left(&self, tenure: u64) {
        let _ = self
            .open
            .subscribe()
            .wait_for(|_| !self.holds(tenure))
            .await;
    }

    /// Closes the gate at its deadline, whether or not anything writes then; runs until dropped.
    /// The timer runs on the monotonic clock, which stops in a system suspend: after one, the
    /// first check closes the gate instead.
    pub async fn enforce(&self) {
        loop {
            self.opened().await;
            match self.remaining() {
                Some(Duration::MAX) => self.closed().await,
                Some(left) => {
                    tokio::select! {
                        () = tokio::time::sleep(left) => {}
                        () = self.closed() => {}
                    }
                }
                None => {}
            }
            if !self.is_open() {
                self.close();
            }
        }
    }

    /// Counts an Event dropped because the gate closed before it was published.
    pub fn dropped_event(&self) {
        self.dropped_events.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Events dropped so far.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events.load(Ordering::Relaxed)
    }
}

/// Whether `error` is a write the gate refused ([`Gate::pass`]).
pub fn fenced(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Service(source) if source.is::<Fenced>())
}

/// The gate's series, read when `/metrics` is scraped: `leader` is computed from the clock at
/// that moment, so a replica that wakes past its deadline reports 0 on its first scrape.
#[derive(Debug)]
pub struct GateCollector(pub Arc<Gate>);

impl Collector for GateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let leader = ConstGauge::new(i64::from(self.0.is_open()));
        leader.encode(encoder.encode_descriptor(
            "leader",
            "1 while this replica may write: it holds the Lease and its deadline is ahead",
            None,
            leader.metric_type(),
        )?)?;
        let counters = [
            (
                "fenced_writes",
                "Writes the gate refused: the Lease's deadline had passed",
                self.0.refused(),
            ),
            (
                "events_dropped",
                "Events dropped unpublished because the gate closed",
                self.0.dropped_events(),
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_lets_a_request_through_while_open_and_refuses_it_as_fenced_once_closed() {
        let gate = Gate::boot_clock();
        gate.open_always();
        let request = http::Request::new(b"{}".to_vec());
        let passed = gate.pass(request, "create").unwrap();
        assert_eq!(passed.extensions().get::<&'static str>(), Some(&"create"));
        assert_eq!(passed.body(), b"{}");

        gate.close();
        let refused = gate
            .pass(http::Request::new(Vec::new()), "create")
            .unwrap_err();
        assert!(fenced(&refused), "{refused}");
        assert_eq!(gate.refused(), 1);
        let other = kube::Error::Service("connection reset".into());
        assert!(!fenced(&other), "only a refusal of the gate is fenced");
    }

    use std::sync::Mutex;

    /// A clock the test sets by hand.
    #[derive(Debug, Default)]
    struct HandClock(Mutex<Duration>);

    impl HandClock {
        fn advance(&self, by: Duration) {
            *self.0.lock().unwrap() += by;
        }
    }

    impl Clock for HandClock {
        fn now(&self) -> BootTime {
            BootTime(*self.0.lock().unwrap())
        }
    }

    fn gate() -> (Arc<HandClock>, Gate) {
        let clock = Arc::new(HandClock::default());
        clock.advance(Duration::from_secs(100));
        (clock.clone(), Gate::new(clock))
    }

    #[test]
    fn a_new_gate_refuses_and_counts_the_refusal() {
        let (_, gate) = gate();
        assert_eq!(gate.check(), Err(Fenced));
        assert_eq!(gate.refused(), 1);
        assert!(!gate.is_open());
    }

    #[test]
    fn writes_pass_until_the_deadline_and_not_at_it() {
        let (clock, gate) = gate();
        let renewed = gate.now();
        assert!(gate.open_until(renewed.after(Duration::from_secs(10))));
        clock.advance(Duration::from_millis(9_999));
        assert_eq!(gate.check(), Ok(()));
        clock.advance(Duration::from_millis(1));
        assert_eq!(gate.check(), Err(Fenced));
        assert!(
            !*gate.open.borrow(),
            "the check that found it past closed it"
        );
    }

    #[test]
    fn a_suspend_past_the_deadline_is_seen_by_the_first_write_after_it() {
        // A jump as the boot clock makes it after a system suspend or a VM pause: no time
        // passes for the process, all of it passes for the clock.
        let (clock, gate) = gate();
        assert!(gate.open_until(gate.now().after(Duration::from_secs(12))));
        assert_eq!(gate.check(), Ok(()));
        clock.advance(Duration::from_secs(3600));
        assert_eq!(gate.check(), Err(Fenced));
        assert_eq!(gate.remaining(), None);
    }

    #[test]
    fn a_renewal_moves_the_deadline_and_a_late_one_does_not_open() {
        let (clock, gate) = gate();
        let first = gate.now();
        assert!(gate.open_until(first.after(Duration::from_secs(10))));
        clock.advance(Duration::from_secs(8));
        assert!(gate.open_until(gate.now().after(Duration::from_secs(10))));
        clock.advance(Duration::from_secs(8));
        assert_eq!(
            gate.check(),
            Ok(()),
            "16 s after the first renewal, 8 after the second"
        );
        // A renewal whose answer came back after the deadline it earned.
        let started = gate.now();
        clock.advance(Duration::from_secs(11));
        assert!(!gate.open_until(started.after(Duration::from_secs(10))));
        assert_eq!(gate.check(), Err(Fenced));
    }

    #[test]
    fn a_gate_reopened_after_its_deadline_passed_unseen_is_in_a_new_tenure() {
        let (clock, gate) = gate();
        assert!(gate.open_until(gate.now().after(Duration::from_secs(10))));
        let first = gate.tenure();
        assert!(gate.holds(first));
        // Renewals in time stay in the tenure.
        clock.advance(Duration::from_secs(5));
        assert!(gate.open_until(gate.now().after(Duration::from_secs(10))));
        assert!(gate.holds(first));
        // A pause past the deadline, and the renewal runs before anything looked at the gate.
        clock.advance(Duration::from_secs(20));
        assert!(*gate.open.borrow(), "nobody has seen it closed");
        assert!(gate.open_until(gate.now().after(Duration::from_secs(10))));
        assert!(gate.is_open());
        assert!(!gate.holds(first));
        assert!(gate.holds(first + 1));
        gate.close();
        assert!(!gate.holds(first + 1));
    }

    #[tokio::test]
    async fn leaving_a_tenure_is_seen_even_when_the_gate_never_looked_closed() {
        let (clock, gate) = gate();
        let gate = Arc::new(gate);
        assert!(gate.open_until(gate.now().after(Duration::from_secs(10))));
        let tenure = gate.tenure();
        let left = tokio::spawn({
            let gate = gate.clone();
            async move { gate.left(tenure).await }
        });
        tokio::task::yield_now().await;
        assert!(!left.is_finished());
        clock.advance(Duration::from_secs(20));
        assert!(gate.open_until(gate.now().after(Duration::from_secs(10))));
        tokio::time::timeout(Duration::from_secs(5), left)
            .await
            .expect("left resolves")
            .unwrap();
    }

    #[test]
    fn an_always_open_gate_closes_only_when_told() {
        let (clock, gate) = gate();
        gate.open_always();
        clock.advance(Duration::from_secs(1 << 40));
        assert_eq!(gate.check(), Ok(()));
        assert_eq!(gate.remaining(), Some(Duration::MAX));
        gate.close();
        assert_eq!(gate.check(), Err(Fenced));
    }

    #[tokio::test]
    async fn the_deadline_closes_the_gate_without_a_write() {
        let gate = Arc::new(Gate::boot_clock());
        let enforcing = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enforce().await }
        });
        assert!(gate.open_until(gate.now().after(Duration::from_millis(100))));
        let closed = tokio::time::timeout(Duration::from_secs(30), gate.closed()).await;
        assert!(closed.is_ok(), "the gate never closed at its deadline");
        assert!(!*gate.open.borrow());
        assert_eq!(
            gate.refused(),
            0,
            "no write was refused: the timer closed it"
        );
        enforcing.abort();
    }

    #[test]
    fn the_leader_series_is_read_from_the_clock_at_scrape_time() {
        let (clock, gate) = gate();
        let gate = Arc::new(gate);
        let mut registry = prometheus_client::registry::Registry::default();
        registry
            .sub_registry_with_prefix("myapp")
            .register_collector(Box::new(GateCollector(gate.clone())));
        let scrape = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        assert!(gate.open_until(gate.now().after(Duration::from_secs(10))));
        assert!(scrape().contains("myapp_leader 1"), "{}", scrape());
        clock.advance(Duration::from_secs(11));
        // Nothing checked the gate since: the scrape alone tells.
        assert!(scrape().contains("myapp_leader 0"), "{}", scrape());
        assert!(
            scrape().contains("myapp_fenced_writes_total 0"),
            "{}",
            scrape()
        );
    }
}
