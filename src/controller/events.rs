//! The Events the controller publishes, each through the write gate: a phase change once its
//! status is written, the first failure of a streak, a fight.

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Client, Resource,
    api::PostParams,
    runtime::events::{Event, EventType, Reporter},
};
use tracing::warn;

use super::context::Context;
use crate::{
    fence::{self, Gate},
    plan::PhaseEvent,
};

/// The Event telling a phase change.
pub(super) fn phase_changed(event: PhaseEvent) -> Event {
    Event {
        type_: if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: event.reason,
        note: Some(event.note),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// A Warning Event: the first failure of a streak, a fight.
pub(super) fn warning(reason: &str, note: String) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    }
}

impl Context {
    /// Publishes an Event about `regarding`, through the write gate; a failure is logged, never
    /// fatal.
    pub(super) async fn publish(&self, event: &Event, regarding: &ObjectReference) {
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
    /// [`super::context::PUBLISH_AT_STOP`], when it stops. An Event still queued when the gate
    /// closes is dropped: it would be written by a replica that may no longer write.
    pub(super) fn publish_later(&self, event: Event, regarding: ObjectReference) {
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
}

/// Creates the Event as kube's `Recorder` creates a new one, without its series cache and
/// without reading the answer.
///
/// A `Recorder` keeps every Event it published for six minutes, to count repeats into a
/// series, in a map whose capacity never shrinks; ours are one per phase change or failure
/// streak, so repeats are rare and that cache would hold one full Event per MyApp. It also
/// parses the created Event the server sends back, which nothing here reads.
async fn publish(
    client: &Client,
    gate: &Gate,
    reporter: Reporter,
    event: &Event,
    regarding: &ObjectReference,
) {
    if let Err(error) = create(client, gate, &k8s_event(&reporter, event, regarding)).await {
        if fence::fenced(&error) {
            gate.dropped_event();
        } else {
            warn!(%error, "Failed to publish Event");
        }
    }
}

/// The events.k8s.io/v1 Event telling `event` about `regarding`, named and stamped as kube's
/// `Recorder` names and stamps a new one.
fn k8s_event(reporter: &Reporter, event: &Event, regarding: &ObjectReference) -> K8sEvent {
    let now = Timestamp::now();
    let name = regarding.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        ..K8sEvent::default()
    }
}

/// POSTs `event` to its namespace once `gate` lets it through (`Gate::pass`); the
/// answer's status is checked, its body not parsed.
async fn create(client: &Client, gate: &Gate, event: &K8sEvent) -> Result<(), kube::Error> {
    // Events go where their object is; kube's `Recorder` uses "default" for a cluster-scoped one.
    let namespace = event.metadata.namespace.as_deref().unwrap_or("default");
    let body = serde_json::to_vec(event).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(K8sEvent::url_path(&(), Some(namespace)))
        .create(&PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    let request = gate.pass(request, "create")?;
    client.request_text(request).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_named_after_its_object_and_reported_as_ours() {
        let regarding = ObjectReference {
            api_version: Some("example.com/v1".into()),
            kind: Some("MyApp".into()),
            name: Some("web".into()),
            namespace: Some("shop".into()),
            uid: Some("u1".into()),
            ..ObjectReference::default()
        };
        let reporter = Reporter {
            controller: "myapp-operator".into(),
            instance: None,
        };
        let event = warning("ReconcileFailed", "the apply failed".into());
        let created = k8s_event(&reporter, &event, &regarding);

        let name = created.metadata.name.as_deref().unwrap();
        let stamp = name.strip_prefix("web.").unwrap();
        let nanos = created.event_time.as_ref().unwrap().0.as_nanosecond();
        assert_eq!(stamp, format!("{nanos:x}"), "named after the event time");
        assert_eq!(created.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(created.regarding.as_ref(), Some(&regarding));
        assert_eq!(created.type_.as_deref(), Some("Warning"));
        assert_eq!(created.reason.as_deref(), Some("ReconcileFailed"));
        assert_eq!(created.note.as_deref(), Some("the apply failed"));
        assert_eq!(created.action.as_deref(), Some("Reconcile"));
        assert_eq!(
            created.reporting_controller.as_deref(),
            Some("myapp-operator")
        );
        // Without an instance, the controller stands for it, as kube's Recorder has it.
        assert_eq!(
            created.reporting_instance.as_deref(),
            Some("myapp-operator")
        );
        assert_eq!(created.series, None);

        let instance = Reporter {
            instance: Some("pod-1".into()),
            ..reporter
        };
        let normal = phase_changed(PhaseEvent {
            warning: false,
            reason: "RolloutComplete".into(),
            note: "phase is Running".into(),
        });
        let created = k8s_event(&instance, &normal, &regarding);
        assert_eq!(created.type_.as_deref(), Some("Normal"));
        assert_eq!(created.reporting_instance.as_deref(), Some("pod-1"));
    }
}
