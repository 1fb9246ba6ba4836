//! One Event store behind two APIs: what kube's `events.k8s.io/v1` Recorder publishes is what
//! core `v1` readers (`kubectl get events`, `kubectl describe`) see, and the field selectors
//! each API accepts.

use crate::support::fixtures;
use crate::support::kubectl::served_kubectl;

use fixtures::{Widget, client, install_crd, widget};
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as EventsEvent;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use kube_sandbox::Sandbox;
use serde::de::DeserializeOwned;
use serde_json::json;

fn reporter() -> Reporter {
    Reporter {
        controller: "widget-controller".into(),
        instance: Some("widget-controller-0".into()),
    }
}

fn event(reason: &str, note: &str) -> Event {
    Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// A Widget stored in the sandbox, and the reference an Event about it carries.
async fn stored_widget(client: &Client, name: &str) -> ObjectReference {
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let created = widgets
        .create(&PostParams::default(), &widget(name, 1, "hi"))
        .await
        .unwrap();
    created.object_ref(&())
}

fn core_event(name: &str, regarding: &str, reason: &str, component: &str) -> CoreEvent {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "name": regarding,
                           "namespace": "default", "uid": format!("uid-{regarding}"),
                           "fieldPath": "data.x"},
        "reason": reason,
        "message": format!("{reason} {regarding}"),
        "type": "Warning",
        "source": {"component": component, "host": "node-1"},
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:05:00Z",
        "count": 4,
    }))
    .unwrap()
}

/// The Events in `default` through core `v1` and through `events.k8s.io/v1`, after the core
/// Event `a.1` (about ConfigMap `a`, from the kubelet) is created through the first.
async fn event_apis(sandbox: &Sandbox) -> (Api<CoreEvent>, Api<EventsEvent>) {
    let client = client(sandbox);
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let events: Api<EventsEvent> = Api::namespaced(client, "default");
    core.create(
        &PostParams::default(),
        &core_event("a.1", "a", "Synced", "kubelet"),
    )
    .await
    .unwrap();
    (core, events)
}

/// The names of the Events `api` lists with the field selector `selector`, sorted.
async fn selected<K>(api: &Api<K>, selector: &str) -> kube::Result<Vec<String>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default().fields(selector)).await?;
    let mut names: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
    names.sort();
    Ok(names)
}

#[tokio::test]
async fn an_event_written_through_one_api_reads_through_the_other() {
    let sandbox = Sandbox::new();
    // Core in, events.k8s.io out.
    let (core, events) = event_apis(&sandbox).await;
    let read = events.get("a.1").await.unwrap();
    let regarding = read.regarding.as_ref().unwrap();
    assert_eq!(regarding.name.as_deref(), Some("a"));
    assert_eq!(regarding.field_path.as_deref(), Some("data.x"));
    assert_eq!(read.note.as_deref(), Some("Synced a"));
    assert_eq!(read.deprecated_count, Some(4));
    assert_eq!(
        read.deprecated_source
            .as_ref()
            .unwrap()
            .component
            .as_deref(),
        Some("kubelet")
    );
    assert_eq!(
        read.deprecated_last_timestamp
            .as_ref()
            .unwrap()
            .0
            .to_string(),
        "2026-01-01T00:05:00Z"
    );
    assert_eq!(read.type_.as_deref(), Some("Warning"));
    let listed = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1, "one object, seen by both APIs");

    // events.k8s.io in (as kube's Recorder writes), core out.
    let written: EventsEvent = serde_json::from_value(json!({
        "metadata": {"name": "b.1"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": {"kind": "Widget", "name": "b", "namespace": "default", "uid": "uid-b"},
        "related": {"kind": "ConfigMap", "name": "b"},
        "note": "made b",
        "reason": "Created",
        "action": "Create",
        "type": "Normal",
        "reportingController": "widget-controller",
        "reportingInstance": "widget-controller-0",
        "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
    }))
    .unwrap();
    events
        .create(&PostParams::default(), &written)
        .await
        .unwrap();
    let read = core.get("b.1").await.unwrap();
    assert_eq!(read.involved_object.name.as_deref(), Some("b"));
    assert_eq!(read.message.as_deref(), Some("made b"));
    assert_eq!(
        read.reporting_component.as_deref(),
        Some("widget-controller")
    );
    assert_eq!(
        read.reporting_instance.as_deref(),
        Some("widget-controller-0")
    );
    assert_eq!(read.action.as_deref(), Some("Create"));
    assert_eq!(
        read.related.as_ref().unwrap().kind.as_deref(),
        Some("ConfigMap")
    );
    assert_eq!(read.series.as_ref().unwrap().count, Some(2));
    assert_eq!(
        read.event_time.as_ref().unwrap().0.to_string(),
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(
        core.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );

    // An update through one API is the other's next version.
    let patched = events
        .patch(
            "a.1",
            &PatchParams::default(),
            &Patch::Merge(json!({"note": "changed", "deprecatedCount": 5})),
        )
        .await
        .unwrap();
    let read = core.get("a.1").await.unwrap();
    assert_eq!(read.message.as_deref(), Some("changed"));
    assert_eq!(read.count, Some(5));
    assert_eq!(
        read.metadata.resource_version,
        patched.metadata.resource_version
    );
    assert!(read.involved_object.name.is_some(), "untouched fields stay");

    // Deleting through one API removes it from both.
    core.delete("b.1", &Default::default()).await.unwrap();
    assert!(events.get_opt("b.1").await.unwrap().is_none());
}

#[tokio::test]
async fn events_are_selected_by_the_fields_each_api_supports() {
    let sandbox = Sandbox::new();
    let (core, events) = event_apis(&sandbox).await;
    core.create(
        &PostParams::default(),
        &core_event("b.1", "b", "Failed", ""),
    )
    .await
    .unwrap();
    let mut reported = core_event("c.1", "c", "Synced", "");
    reported.reporting_component = Some("widget-controller".into());
    core.create(&PostParams::default(), &reported)
        .await
        .unwrap();

    // (field selector, the Events core v1 selects)
    let core_cases: Vec<(&str, &[&str])> = vec![
        ("involvedObject.name=a", &["a.1"]),
        (
            "involvedObject.kind=ConfigMap,involvedObject.uid=uid-b",
            &["b.1"],
        ),
        (
            "involvedObject.namespace=default,involvedObject.apiVersion=v1",
            &["a.1", "b.1", "c.1"],
        ),
        (
            "involvedObject.fieldPath=data.x,reason=Synced",
            &["a.1", "c.1"],
        ),
        ("reason!=Synced", &["b.1"]),
        ("type=Warning,metadata.name=c.1", &["c.1"]),
        // `source` is the source component, or the reporting component when there is none.
        ("source=kubelet", &["a.1"]),
        ("source=widget-controller", &["c.1"]),
        ("reportingComponent=widget-controller", &["c.1"]),
        ("involvedObject.resourceVersion=", &["a.1", "b.1", "c.1"]),
    ];
    for (selector, expected) in core_cases {
        let names = selected(&core, selector).await;
        assert_eq!(names.unwrap(), expected, "core v1: {selector}");
    }
    // (field selector, the Events events.k8s.io/v1 selects)
    let events_cases: Vec<(&str, &[&str])> = vec![
        ("regarding.name=b", &["b.1"]),
        ("regarding.kind=ConfigMap,regarding.uid=uid-a", &["a.1"]),
        ("reportingController=widget-controller", &["c.1"]),
        ("reason=Failed,type=Warning", &["b.1"]),
    ];
    for (selector, expected) in events_cases {
        let names = selected(&events, selector).await;
        assert_eq!(names.unwrap(), expected, "events.k8s.io/v1: {selector}");
    }

    // Each API refuses the other's labels and fields it does not index, as kube-apiserver does.
    // (API, what it answers a field selector with the label, the label)
    let refused = [
        (
            "core v1",
            selected(&core, "regarding.name=a").await,
            "regarding.name",
        ),
        ("core v1", selected(&core, "message=x").await, "message"),
        (
            "core v1",
            selected(&core, "reportingController=x").await,
            "reportingController",
        ),
        (
            "events.k8s.io/v1",
            selected(&events, "involvedObject.name=a").await,
            "involvedObject.name",
        ),
        (
            "events.k8s.io/v1",
            selected(&events, "note=x").await,
            "note",
        ),
    ];
    for (api, listed, label) in refused {
        let Err(kube::Error::Api(status)) = listed else {
            panic!("{api}: {label}: {listed:?}");
        };
        assert_eq!(
            (status.code, status.reason.as_str()),
            (400, "BadRequest"),
            "{api}: {label}"
        );
        assert_eq!(
            status.message,
            format!("field label not supported: {label}"),
            "{api}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_events_show_in_kubectl_get_events_and_describe() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let client = client(&sandbox);
    install_crd(&client).await;
    let regarding = stored_widget(&client, "w1").await;
    let other = stored_widget(&client, "w2").await;
    let recorder = Recorder::new(client.clone(), reporter());
    recorder
        .publish(&event("Scaled", "scaled w1 to 3"), &regarding)
        .await
        .unwrap();
    // The same Event again: the Recorder patches it into a series.
    recorder
        .publish(&event("Scaled", "scaled w1 to 3"), &regarding)
        .await
        .unwrap();
    recorder
        .publish(&event("Other", "about w2"), &other)
        .await
        .unwrap();

    let out = k.ok(&["get", "events"]).await;
    let header = out.lines().next().unwrap_or("");
    for column in ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"] {
        assert!(header.contains(column), "{out}");
    }
    let line = out
        .lines()
        .find(|l| l.contains("Scaled"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("Normal"), "{out}");
    assert!(line.contains("widget/w1"), "{out}");
    assert!(line.contains("scaled w1 to 3"), "{out}");

    let wide = k.ok(&["get", "events", "-o", "wide"]).await;
    let line = wide
        .lines()
        .find(|l| l.contains("Scaled"))
        .unwrap_or_else(|| panic!("{wide}"));
    assert!(
        line.contains("widget-controller, widget-controller-0"),
        "SOURCE falls back to the reporting controller: {wide}"
    );
    assert!(
        line.split_whitespace().any(|cell| cell == "2"),
        "COUNT is the series' count: {wide}"
    );

    // describe lists core Events by an involvedObject field selector.
    let described = k.ok(&["describe", "widget", "w1"]).await;
    let events = described
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("{described}"));
    assert!(events.contains("Scaled"), "{described}");
    assert!(events.contains("scaled w1 to 3"), "{described}");
    assert!(events.contains("widget-controller"), "From: {described}");
    assert!(!events.contains("about w2"), "{described}");
}
