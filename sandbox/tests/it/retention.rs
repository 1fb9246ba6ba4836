//! What the sandbox keeps over time, as a long `dev` session or a churn benchmark needs: Events
//! expire after their time to live, the watch history is bounded by size, and the garbage
//! collector finds dependents through an owner index that follows every write.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event, ObjectReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Resource, ResourceExt};
use kube_sandbox::Sandbox;
use kube_sandbox::testing::eventually;
use serde_json::json;

use crate::support::api::config_map;
use crate::support::fixtures::client;
use crate::support::watch::watch_from;

fn event(name: &str) -> Event {
    Event {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("ConfigMap".into()),
            name: Some("c".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        reason: Some("Tested".into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn events_are_deleted_when_their_time_to_live_has_passed_and_watchers_see_it() {
    let sandbox = Sandbox::builder()
        .event_ttl(Duration::from_millis(300))
        .build();
    let events = Api::<Event>::default_namespaced(client(&sandbox));
    let created = events
        .create(&PostParams::default(), &event("e1"))
        .await
        .unwrap();
    let mut watch = watch_from(&events, &created.resource_version().unwrap()).await;
    // A list sweeps expired Events even when nothing else is written.
    eventually("the Event expires", || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let deleted = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch reports the expiry")
        .unwrap()
        .unwrap();
    assert!(
        matches!(&deleted, WatchEvent::Deleted(e) if e.name_any() == "e1"),
        "{deleted:?}"
    );
}

#[tokio::test]
async fn events_live_an_hour_by_default() {
    let sandbox = Sandbox::new();
    let events = Api::<Event>::default_namespaced(client(&sandbox));
    events
        .create(&PostParams::default(), &event("e1"))
        .await
        .unwrap();
    let configmaps = Api::<ConfigMap>::default_namespaced(client(&sandbox));
    configmaps
        .create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    assert_eq!(
        events.list(&Default::default()).await.unwrap().items.len(),
        1
    );
}

#[tokio::test]
async fn the_watch_history_is_bounded_by_size_and_an_older_resume_must_relist() {
    let sandbox = Sandbox::builder().event_log_bytes(20_000).build();
    let configmaps = Api::<ConfigMap>::default_namespaced(client(&sandbox));
    let mut first_rv = None;
    for i in 0..100 {
        let mut cm = config_map(&format!("c{i}"));
        cm.data = Some([("payload".to_owned(), "x".repeat(1000))].into());
        let created = configmaps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
        first_rv.get_or_insert(created.resource_version().unwrap());
    }
    // About 2 KB of memory per event: the history holds the last ~10 writes, not all 100.
    let mut old = watch_from(&configmaps, first_rv.as_deref().unwrap()).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), old.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&answer, Ok(WatchEvent::Error(e)) if e.code == 410),
        "a resume from the first write is Expired: {answer:?}"
    );
    let recent = sandbox.resource_version() - 5;
    let mut watch = watch_from(&configmaps, &recent.to_string()).await;
    let replayed = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(replayed, WatchEvent::Added(_)), "{replayed:?}");
}

#[tokio::test]
async fn a_dependent_that_dropped_its_owner_reference_outlives_the_owner() {
    let sandbox = Sandbox::new();
    let configmaps = Api::<ConfigMap>::default_namespaced(client(&sandbox));
    let owner = configmaps
        .create(&PostParams::default(), &config_map("owner"))
        .await
        .unwrap();
    let reference = owner.controller_owner_ref(&()).unwrap();
    for name in ["kept", "collected"] {
        let mut dependent = config_map(name);
        dependent.metadata.owner_references = Some(vec![reference.clone()]);
        configmaps
            .create(&PostParams::default(), &dependent)
            .await
            .unwrap();
    }
    // The owner index follows updates: "kept" is no longer a dependent.
    configmaps
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
        )
        .await
        .unwrap();
    configmaps
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    assert!(configmaps.get_opt("collected").await.unwrap().is_none());
    assert!(configmaps.get_opt("kept").await.unwrap().is_some());
}

#[tokio::test]
async fn a_watch_resumed_from_before_superseded_versions_gets_each_as_it_was_written() {
    let sandbox = Sandbox::new();
    let api = Api::<ConfigMap>::default_namespaced(client(&sandbox));
    let mut cm = config_map("c");
    cm.labels_mut().insert("app".into(), "web".into());
    cm.data = Some([("k".to_string(), "1".to_string())].into());
    let from = api
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    // A live watch renders each version's line before the next write supersedes it: the log
    // then keeps that version as its line only.
    let mut live = watch_from(&api, &from).await;
    let mut written = Vec::new();
    for (labels, data) in [(json!({"app": null}), "2"), (json!({"tier": "a"}), "3")] {
        let patch = json!({"metadata": {"labels": labels}, "data": {"k": data}});
        api.patch("c", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        match live.next().await.unwrap().unwrap() {
            WatchEvent::Modified(cm) => written.push(cm),
            other => panic!("{other:?}"),
        }
    }

    let mut resumed = watch_from(&api, &from).await;
    for expected in &written {
        match resumed.next().await.unwrap().unwrap() {
            WatchEvent::Modified(cm) => assert_eq!(&cm, expected),
            other => panic!("{other:?}"),
        }
    }

    // A label-selector watch reads the released versions' labels: the object left the
    // selection with the first change and stayed out; it enters again with the next write.
    let mut selected = api
        .watch(&WatchParams::default().labels("app=web"), &from)
        .await
        .unwrap()
        .boxed();
    match selected.next().await.unwrap().unwrap() {
        WatchEvent::Deleted(cm) => assert_eq!(cm, written[0]),
        other => panic!("{other:?}"),
    }
    let patch = json!({"metadata": {"labels": {"app": "web"}}, "data": {"k": "4"}});
    api.patch("c", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    match selected.next().await.unwrap().unwrap() {
        WatchEvent::Added(cm) => assert_eq!(cm.data.unwrap()["k"], "4"),
        other => panic!("{other:?}"),
    }
}
