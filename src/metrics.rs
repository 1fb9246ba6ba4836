//! The process's Prometheus metrics, in one `Registry` that `/metrics` encodes.
//!
//! Everything the operator defines is under one prefix, `myapp_` (the webhook server's series
//! too: `myapp_webhook_*`), named the Prometheus way (`_total` on counters, base units in the
//! name); the process series carry the standard unprefixed names every dashboard knows. Every
//! labelled series exists at 0 from the start, so `rate()` sees its first increment.
//!
//! | series | type | what |
//! |---|---|---|
//! | `myapp_reconcile_total{result}` | counter | reconciles by `success`, `requeue` (asked to look again before the resync), `error` |
//! | `myapp_reconcile_errors_total` | counter | failed reconciles |
//! | `myapp_reconcile_duration_seconds` | histogram | time of one reconcile |
//! | `myapp_reconcile_noop_total` | counter | reconciles that wrote nothing (the steady state) |
//! | `myapp_reconcile_writes_total{target}` | counter | writes by `deployment`, `service`, `status`, `replicas_handoff`; sharding's label writes by `shard_move` (the sharder) and `shard_release` (a shard letting a MyApp go) |
//! | `myapp_reconciles_in_flight` | gauge | reconciles running now |
//! | `myapp_reconcile_queue_depth` | gauge | MyApps waiting to be reconciled (approximate: see [`queue`]) |
//! | `myapp_write_conflicts_total{target}` | counter | writes the API server refused with 409: planned from a version it no longer holds |
//! | `myapp_orphan_children_total` | counter | children created for a MyApp deleted while its reconcile ran (the garbage collector removes them) |
//! | `myapp_leader` | gauge | 1 while this replica may write: it holds the Lease and its deadline is ahead (read from the clock at scrape time) |
//! | `myapp_fenced_writes_total`, `myapp_events_dropped_total` | counter | writes the write gate refused, Events dropped unpublished, past the Lease's deadline |
//! | `myapp_caches_synced` | gauge | 1 once the leading controller's caches hold a full list |
//! | `myapp_sharding` | gauge | 1 on a replica run with `--sharding` (then `myapp_leader` is about its shard Lease) |
//! | `myapp_sharder` | gauge | 1 while this replica assigns MyApps to shards (it holds the operator's Lease) |
//! | `myapp_shard_objects` | gauge | MyApps this replica's controller holds: its shard's with sharding on, all of them without (read at scrape time) |
//! | `myapp_shard_unassigned` | gauge | on the sharder: MyApps on no live shard (unlabelled, or on a shard whose Lease ran out), from its watch of them |
//! | `myapp_shard_ring_changes_total` | counter | how often the set of live shards this replica sees changed (the generation of its ring) |
//! | `myapp_webhook_*` | | the webhook server's (see the `webhook` crate's README) |
//! | `myapp_build_info{version,git_commit,rustc}` | info | always 1 |
//! | `process_*` | | CPU seconds, resident memory, open and max fds, start time (see [`process`]) |

use std::{fmt::Write as _, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
        info::Info,
    },
    registry::Registry,
};

pub mod process;
pub mod queue;

/// The prefix of every series the operator defines.
pub const PREFIX: &str = "myapp";

/// How one reconcile ended: the `result` label of `myapp_reconcile_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReconcileResult {
    /// Done; the next look is the resync.
    Success,
    /// Done for now, but asked to look again soon (a rollout under way, a write not yet seen).
    Requeue,
    /// Failed; retried with backoff.
    Error,
}

impl ReconcileResult {
    /// Every result, in label order.
    pub const ALL: [Self; 3] = [Self::Success, Self::Requeue, Self::Error];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Requeue => "requeue",
            Self::Error => "error",
        }
    }
}

impl EncodeLabelValue for ReconcileResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels of `myapp_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// How the reconcile ended.
    pub result: ReconcileResult,
}

/// The write targets of `myapp_reconcile_writes_total`.
pub const WRITE_TARGETS: [&str; 6] = [
    "deployment",
    "service",
    "status",
    "replicas_handoff",
    "shard_release",
    "shard_move",
];

/// Kind of write a reconcile made.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// One of [`WRITE_TARGETS`].
    pub target: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    git_commit: &'static str,
    rustc: &'static str,
}

/// How many MyApps a replica's controller holds, read when `/metrics` is scraped.
type HeldCount = Box<dyn Fn() -> usize + Send + Sync>;

/// Sharding's metrics (all 0 with sharding off, but `myapp_shard_objects`).
#[derive(Default)]
pub struct ShardMetrics {
    /// 1 on a replica run with sharding on.
    pub enabled: Gauge,
    /// 1 while this replica runs the sharder.
    pub sharder: Gauge,
    /// MyApps on no live shard, as the sharder sees them.
    pub unassigned: Gauge,
    /// Changes of the set of live shards this replica saw.
    pub ring_changes: Counter,
    /// The controller's count of the MyApps it holds, while it runs.
    held: Arc<std::sync::Mutex<Option<HeldCount>>>,
}

impl std::fmt::Debug for ShardMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMetrics")
            .field("enabled", &self.enabled)
            .field("sharder", &self.sharder)
            .field("unassigned", &self.unassigned)
            .field("ring_changes", &self.ring_changes)
            .finish_non_exhaustive()
    }
}

impl ShardMetrics {
    /// Where `myapp_shard_objects` is read from from now on (the running controller's cache);
    /// `None` when no controller runs.
    pub fn held_by(&self, count: Option<HeldCount>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = count;
    }

    /// The MyApps the controller holds now (0 when none runs).
    pub fn held(&self) -> usize {
        held(&self.held)
    }
}

fn held(count: &std::sync::Mutex<Option<HeldCount>>) -> usize {
    count
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map_or(0, |count| count())
}

/// `myapp_shard_objects`, read at scrape time.
struct HeldCollector(Arc<std::sync::Mutex<Option<HeldCount>>>);

impl std::fmt::Debug for HeldCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldCollector")
    }
}

impl Collector for HeldCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let objects = ConstGauge::new(i64::try_from(held(&self.0)).unwrap_or(i64::MAX));
        objects.encode(encoder.encode_descriptor(
            "shard_objects",
            "MyApps this replica's controller holds: its shard's with sharding on, all without",
            None,
            objects.metric_type(),
        )?)
    }
}

/// Controller metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Failed reconciles.
    pub reconcile_errors: Counter,
    /// Reconciles that made no write at all (the steady state).
    pub reconcile_noops: Counter,
    /// Writes made by reconciles, by target.
    pub writes: Family<WriteLabels, Counter>,
    /// Reconcile duration in seconds.
    pub reconcile_duration: Histogram,
    /// Reconciles running now.
    pub in_flight: Gauge,
    /// MyApps waiting for a reconcile to start.
    pub queue: Arc<queue::Queue>,
    /// Writes the API server refused with 409, by target: the version they were planned from
    /// is no longer the current one.
    pub conflicts: Family<WriteLabels, Counter>,
    /// Children created for a MyApp that was deleted while its reconcile ran.
    pub orphans: Counter,
    /// 1 once every watch cache of the leading controller holds a complete list.
    pub caches_synced: Gauge,
    /// 1 while the leading controller's MyApp watch finds the CRD, 0 once it found it missing
    /// (and before it looked).
    pub crd_installed: Gauge,
    /// Fights detected: a Deployment rewritten again and again at one generation.
    pub fights: Counter,
    /// Sharding's.
    pub shards: ShardMetrics,
}

impl Metrics {
    /// Creates the controller metrics, every labelled series at 0, and registers them, the
    /// build info and the process metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            reconcile_errors: Counter::default(),
            reconcile_noops: Counter::default(),
            writes: Family::default(),
            reconcile_duration: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            in_flight: Gauge::default(),
            queue: Arc::default(),
            conflicts: Family::default(),
            orphans: Counter::default(),
            caches_synced: Gauge::default(),
            crd_installed: Gauge::default(),
            fights: Counter::default(),
            shards: ShardMetrics::default(),
        };
        for result in ReconcileResult::ALL {
            let _ = metrics.reconciles.get_or_create(&ResultLabels { result });
        }
        for target in WRITE_TARGETS {
            let _ = metrics.writes.get_or_create(&WriteLabels { target });
            let _ = metrics.conflicts.get_or_create(&WriteLabels { target });
        }
        registry.register_collector(Box::new(process::Collector));
        let registry = registry.sub_registry_with_prefix(PREFIX);
        registry.register(
            "build",
            "Version, git commit and compiler of this binary",
            Info::new(BuildLabels {
                version: crate::version::VERSION,
                git_commit: crate::version::GIT_COMMIT,
                rustc: crate::version::RUSTC,
            }),
        );
        registry.register(
            "reconcile",
            "Reconciles by result: success, requeue (look again soon) or error",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed",
            metrics.reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_noop",
            "Reconciles that made no write",
            metrics.reconcile_noops.clone(),
        );
        registry.register(
            "reconcile_writes",
            "Writes made by reconciles, by target",
            metrics.writes.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration",
            metrics.reconcile_duration.clone(),
        );
        registry.register(
            "reconciles_in_flight",
            "Reconciles running now",
            metrics.in_flight.clone(),
        );
        registry.register(
            "reconcile_queue_depth",
            "MyApps triggered by a watch event or relist whose reconcile has not started \
             (approximate: scheduled retries and resyncs are not counted)",
            metrics.queue.gauge(),
        );
        registry.register(
            "write_conflicts",
            "Writes the API server refused with 409 (planned from a version it no longer holds), by target",
            metrics.conflicts.clone(),
        );
        registry.register(
            "orphan_children",
            "Children created for a MyApp deleted while its reconcile ran (the garbage collector removes them)",
            metrics.orphans.clone(),
        );
        registry.register(
            "caches_synced",
            "1 once the leading controller's watch caches hold a complete list",
            metrics.caches_synced.clone(),
        );
        registry.register(
            "crd_installed",
            "1 while the leading controller finds the MyApp CRD installed",
            metrics.crd_installed.clone(),
        );
        registry.register(
            "fights",
            "Fights detected over a Deployment (rewritten at one generation; see the FightDetected Event)",
            metrics.fights.clone(),
        );
        let shards = &metrics.shards;
        registry.register_collector(Box::new(HeldCollector(shards.held.clone())));
        registry.register(
            "sharding",
            "1 on a replica run with --sharding (myapp_leader then tells its shard Lease)",
            shards.enabled.clone(),
        );
        registry.register(
            "sharder",
            "1 while this replica assigns MyApps to shards (it holds the operator's Lease)",
            shards.sharder.clone(),
        );
        registry.register(
            "shard_unassigned",
            "MyApps on no live shard (unlabelled, or on a shard whose Lease ran out), as the sharder sees them",
            shards.unassigned.clone(),
        );
        registry.register(
            "shard_ring_changes",
            "Changes of the set of live shards this replica saw (the generation of its ring)",
            shards.ring_changes.clone(),
        );
        metrics
    }

    /// Counts one write to `target` that the API server refused with 409.
    pub fn conflicted(&self, target: &'static str) {
        self.conflicts.get_or_create(&WriteLabels { target }).inc();
    }

    /// Counts one write to `target`.
    pub fn wrote(&self, target: &'static str) {
        self.writes.get_or_create(&WriteLabels { target }).inc();
    }

    /// Counts one finished reconcile.
    pub fn reconciled(&self, result: ReconcileResult) {
        self.reconciles
            .get_or_create(&ResultLabels { result })
            .inc();
        if result == ReconcileResult::Error {
            self.reconcile_errors.inc();
        }
    }

    /// Marks one reconcile running until the guard drops (also when it is cancelled).
    pub fn running(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }
}

/// A reconcile counted in `myapp_reconciles_in_flight`.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn metrics_render_in_prometheus_text_with_the_prefix() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.reconcile_noops.inc();
        m.wrote("status");
        m.reconciled(ReconcileResult::Success);
        m.reconciled(ReconcileResult::Error);
        let text = encode(&registry);
        for line in [
            "myapp_reconcile_noop_total 1",
            "myapp_reconcile_writes_total{target=\"status\"} 1",
            "myapp_reconcile_total{result=\"success\"} 1",
            "myapp_reconcile_total{result=\"error\"} 1",
            "myapp_reconcile_errors_total 1",
            "# TYPE myapp_reconcile_duration_seconds histogram",
            "# TYPE myapp_build info",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn every_labelled_series_is_there_at_zero_before_anything_happened() {
        let mut registry = Registry::default();
        let _m = Metrics::register(&mut registry);
        let text = encode(&registry);
        for result in ["success", "requeue", "error"] {
            let line = format!("myapp_reconcile_total{{result=\"{result}\"}} 0");
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
        for target in WRITE_TARGETS {
            let line = format!("myapp_reconcile_writes_total{{target=\"{target}\"}} 0");
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn a_cancelled_reconcile_leaves_the_in_flight_gauge() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let first = m.running();
        let second = m.running();
        assert_eq!(m.in_flight.get(), 2);
        drop(first);
        drop(second);
        assert_eq!(m.in_flight.get(), 0);
    }
}
