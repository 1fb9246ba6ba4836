//! The Events the controller publishes, each through the write gate: a phase change once its
//! status is written, the first failure of a streak, a fight.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tracing::warn;

use super::context::Context;
use crate::{fence::Gate, plan::PhaseEvent};

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
    ///
    /// A fresh [`Recorder`] each time, on purpose: a shared one keeps every Event it published
    /// for six minutes (to count repeats into a series), in a map whose capacity never shrinks.
    /// Ours are one per phase change or failure streak, so repeats are rare and that cache
    /// would only hold one full Event per MyApp. Building one costs a client clone and an empty
    /// map.
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

async fn publish(
    client: &Client,
    gate: &Gate,
    reporter: Reporter,
    event: &Event,
    regarding: &ObjectReference,
) {
    if gate.check().is_err() {
        gate.dropped_event();
        return;
    }
    let recorder = Recorder::new(client.clone(), reporter);
    if let Err(error) = recorder.publish(event, regarding).await {
        warn!(%error, "Failed to publish Event");
    }
}
