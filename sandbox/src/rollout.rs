//! The simulated Deployment controller's switches, and what a Deployment write sets off: with
//! Pods simulated, its ReplicaSets and Pods (`controllers/`), whose kubelet starts them after the
//! rollout delay; without, after the delay, the status a finished (or failed) rollout would have.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::controllers::{self, deployment, kubelet};
use crate::store::{EventType, Store, now};

pub(crate) struct Rollouts {
    enabled: AtomicBool,
    /// Whether ReplicaSets and Pods are simulated (else only the Deployment's status is written).
    pods: AtomicBool,
    fail: AtomicBool,
    delay: Mutex<Duration>,
    /// Deployments (namespace, name) whose status the caller writes itself.
    excluded: Mutex<BTreeSet<(String, String)>>,
}

impl Rollouts {
    pub(crate) fn new(enabled: bool, pods: bool, delay: Duration) -> Arc<Self> {
        Arc::new(Rollouts {
            enabled: AtomicBool::new(enabled),
            pods: AtomicBool::new(pods),
            fail: AtomicBool::new(false),
            delay: Mutex::new(delay),
            excluded: Mutex::default(),
        })
    }

    fn delay(&self) -> Duration {
        *self.delay.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn excludes(&self, namespace: &str, name: &str) -> bool {
        self.excluded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(namespace.to_owned(), name.to_owned()))
    }
}

/// Switches and knobs of the simulated Deployment controller.
#[derive(Clone)]
pub struct RolloutHandle(pub(crate) Arc<Rollouts>);

impl RolloutHandle {
    /// Turns the simulated controller on or off (off: Deployment status is never written).
    pub fn set_enabled(&self, enabled: bool) {
        self.0.enabled.store(enabled, Ordering::SeqCst);
    }

    /// Whether the controller creates ReplicaSets and Pods (on by default; off, it only writes
    /// the Deployment's status after the delay, which keeps large benchmarks fast).
    pub fn set_pods(&self, pods: bool) {
        self.0.pods.store(pods, Ordering::SeqCst);
    }

    /// Makes later rollouts fail with `ProgressDeadlineExceeded` (or succeed again).
    pub fn set_failing(&self, failing: bool) {
        self.0.fail.store(failing, Ordering::SeqCst);
    }

    /// How long a rollout takes before its status is written.
    pub fn set_delay(&self, delay: Duration) {
        *self.0.delay.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }

    /// Leaves one Deployment's status to the caller: a test that plays the Deployment
    /// controller and kubelet itself (real processes as its pods) writes it through
    /// `deployments/status`, and the simulation never overwrites it.
    pub fn exclude(&self, namespace: &str, name: &str) {
        self.0
            .excluded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((namespace.to_owned(), name.to_owned()));
    }
}

/// Called after a Deployment write; schedules the status write for its generation.
pub(crate) fn deployment_written(rollouts: &Arc<Rollouts>, store: &Arc<Store>, deployment: &Value) {
    if !rollouts.enabled.load(Ordering::SeqCst) {
        return;
    }
    let generation = deployment
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let observed = deployment
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if generation.is_none() || generation == observed {
        return;
    }
    let (Some(ns), Some(name)) = (
        deployment
            .pointer("/metadata/namespace")
            .and_then(Value::as_str),
        deployment.pointer("/metadata/name").and_then(Value::as_str),
    ) else {
        return;
    };
    if rollouts.excludes(ns, name) {
        return;
    }
    let (ns, name) = (ns.to_string(), name.to_string());
    let (rollouts, store) = (rollouts.clone(), store.clone());
    if rollouts.pods.load(Ordering::SeqCst) {
        tokio::spawn(roll_out(rollouts, store, ns, name));
        return;
    }
    let delay = rollouts.delay();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let failing = rollouts.fail.load(Ordering::SeqCst);
        if !rollouts.enabled.load(Ordering::SeqCst) {
            return;
        }
        let mut state = store.lock();
        let Some(rt) = state.registry.get("apps", "v1", "deployments") else {
            return;
        };
        let Some(current) = state.get(&rt.storage(), &ns, &name).cloned() else {
            return;
        };
        let Some(generation) = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
        else {
            return;
        };
        let status = rollout_status(&current, generation, failing);
        if current.get("status") == Some(&status) {
            return;
        }
        let mut updated = current;
        updated["status"] = status;
        state.put(&rt, updated, EventType::Modified);
        tracing::debug!(%ns, %name, generation, failing, "Simulated rollout");
    });
}

/// Called after a DELETE: a Pod or ReplicaSet that a simulated Deployment controls is made
/// again, as the ReplicaSet and Deployment controllers react to what their informers see.
pub(crate) fn dependent_deleted(rollouts: &Arc<Rollouts>, store: &Arc<Store>, deleted: &Value) {
    if !rollouts.enabled.load(Ordering::SeqCst) || !rollouts.pods.load(Ordering::SeqCst) {
        return;
    }
    let Some(ns) = deleted
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
    else {
        return;
    };
    let Some(name) = controllers::owning_deployment(&store.lock(), deleted) else {
        return;
    };
    if rollouts.excludes(ns, &name) {
        return;
    }
    tokio::spawn(roll_out(
        rollouts.clone(),
        store.clone(),
        ns.to_string(),
        name,
    ));
}

/// Drives one Deployment's rollout: a controller pass makes Pods, the kubelet starts them after
/// the delay, and the next pass goes on, until a pass makes no Pod.
async fn roll_out(rollouts: Arc<Rollouts>, store: Arc<Store>, ns: String, name: String) {
    loop {
        let created = deployment::sync(&mut store.lock(), &ns, &name);
        if created.is_empty() {
            return;
        }
        tokio::time::sleep(rollouts.delay()).await;
        if !rollouts.enabled.load(Ordering::SeqCst) {
            return;
        }
        let failing = rollouts.fail.load(Ordering::SeqCst);
        kubelet::start(&mut store.lock(), &ns, &created, failing);
        tracing::debug!(%ns, %name, pods = created.len(), failing, "Simulated pods started");
    }
}

fn rollout_status(deployment: &Value, generation: i64, failing: bool) -> Value {
    let replicas = deployment
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let name = deployment
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ts = now();
    let rs = format!("{name}-5d4f8c7b9");
    let condition = |type_: &str, status: &str, reason: &str, message: String| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastUpdateTime": ts, "lastTransitionTime": ts})
    };
    if failing {
        let mut status = json!({
            "observedGeneration": generation,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "unavailableReplicas": replicas,
            "conditions": [
                condition("Available", "False", "MinimumReplicasUnavailable",
                          "Deployment does not have minimum availability.".into()),
                condition("Progressing", "False", "ProgressDeadlineExceeded",
                          format!("ReplicaSet \"{rs}\" has timed out progressing.")),
            ],
        });
        if replicas == 0
            && let Some(m) = status.as_object_mut()
        {
            m.remove("unavailableReplicas");
        }
        return status;
    }
    let mut status = json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "conditions": [
            condition("Available", "True", "MinimumReplicasAvailable",
                      "Deployment has minimum availability.".into()),
            condition("Progressing", "True", "NewReplicaSetAvailable",
                      format!("ReplicaSet \"{rs}\" has successfully progressed.")),
        ],
    });
    if replicas == 0 {
        // The API server omits zero counts.
        if let Some(m) = status.as_object_mut() {
            for k in [
                "replicas",
                "updatedReplicas",
                "readyReplicas",
                "availableReplicas",
            ] {
                m.remove(k);
            }
        }
    }
    status
}
