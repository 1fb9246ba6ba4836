//! The operator's Prometheus metrics, registered in one `Registry` that `/metrics` encodes.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Result of one reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` or `error`.
    pub result: &'static str,
}

/// Kind of write a reconcile made.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `deployment`, `service`, `status` or `replicas_handoff`.
    pub target: &'static str,
}

/// Controller metrics.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Reconciles that made no write at all (the steady state).
    pub reconcile_noops: Counter,
    /// Writes made by reconciles, by target.
    pub writes: Family<WriteLabels, Counter>,
    /// Reconcile duration in seconds.
    pub reconcile_duration: Histogram,
    /// 1 while this replica holds the leader lease (or leader election is off).
    pub leader: Gauge,
    /// 1 once every watch cache of the leading controller holds a complete list.
    pub caches_synced: Gauge,
    /// 1 while the leading controller's MyApp watch finds the CRD, 0 once it found it missing
    /// (and before it looked).
    pub crd_installed: Gauge,
    /// Fights detected: a Deployment rewritten again and again at one generation.
    pub fights: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them under the `myapp` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            reconcile_noops: Counter::default(),
            writes: Family::default(),
            reconcile_duration: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            leader: Gauge::default(),
            caches_synced: Gauge::default(),
            crd_installed: Gauge::default(),
            fights: Counter::default(),
        };
        let registry = registry.sub_registry_with_prefix("myapp");
        registry.register(
            "reconcile",
            "Reconciles by result",
            metrics.reconciles.clone(),
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
            "leader",
            "1 while this replica reconciles (holds the lease)",
            metrics.leader.clone(),
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
        metrics
    }

    /// Counts one write to `target`.
    pub fn wrote(&self, target: &'static str) {
        self.writes.get_or_create(&WriteLabels { target }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_in_prometheus_text_with_the_prefix() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.reconcile_noops.inc();
        m.wrote("status");
        m.reconciles
            .get_or_create(&ResultLabels { result: "success" })
            .inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("myapp_reconcile_noop_total 1"), "{text}");
        assert!(
            text.contains("myapp_reconcile_writes_total{target=\"status\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("myapp_reconcile_total{result=\"success\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE myapp_reconcile_duration_seconds histogram"),
            "{text}"
        );
    }
}
