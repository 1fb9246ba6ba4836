//! The real kube 5 client, watcher and Controller against the in-process router.

use crate::support::api::{api_error, config_map, deployment, requests_with_verb, with_widgets};
use crate::support::fixtures;
use crate::support::watch::{changes, initial_names};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fixtures::{Widget, WidgetStatus, client, install_crd, widget};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kube_sandbox::Sandbox;
use kube_sandbox::testing::eventually;
use serde_json::json;

const MANAGER: &str = "widget-controller";
const FINALIZER: &str = "sandbox.test/cleanup";

struct Ctx {
    client: Client,
    cleanups: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("failed to apply the child: {0}")]
    ApplyChild(#[source] kube::Error),
    #[error("failed to apply the status: {0}")]
    ApplyStatus(#[source] kube::Error),
}

async fn reconcile(
    w: Arc<Widget>,
    ctx: Arc<Ctx>,
) -> Result<Action, kube::runtime::finalizer::Error<ReconcileError>> {
    let ns = w.namespace().unwrap_or_default();
    let widgets: Api<Widget> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&widgets, FINALIZER, w, |event| async {
        match event {
            Finalizer::Apply(w) => {
                let cm = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(w.name_any()),
                        owner_references: w.controller_owner_ref(&()).map(|r| vec![r]),
                        ..Default::default()
                    },
                    data: Some(
                        [
                            ("message".to_string(), w.spec.message.clone()),
                            ("replicas".to_string(), w.spec.replicas.to_string()),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                };
                let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
                let pp = PatchParams::apply(MANAGER).force();
                cms.patch(&w.name_any(), &pp, &Patch::Apply(&cm))
                    .await
                    .map_err(ReconcileError::ApplyChild)?;
                let status = json!({
                    "apiVersion": "sandbox.test/v1",
                    "kind": "Widget",
                    "status": WidgetStatus { observed_replicas: w.spec.replicas },
                });
                widgets
                    .patch_status(&w.name_any(), &pp, &Patch::Apply(&status))
                    .await
                    .map_err(ReconcileError::ApplyStatus)?;
                Ok(Action::await_change())
            }
            Finalizer::Cleanup(_) => {
                ctx.cleanups.fetch_add(1, Ordering::SeqCst);
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn error_policy(
    _: Arc<Widget>,
    _: &kube::runtime::finalizer::Error<ReconcileError>,
    _: Arc<Ctx>,
) -> Action {
    Action::requeue(Duration::from_millis(100))
}

#[tokio::test]
async fn controller_with_owns_reconciles_children_status_finalizers_and_gc() {
    let sandbox = Sandbox::new();
    let (client, widgets) = with_widgets(&sandbox).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        cleanups: AtomicUsize::new(0),
    });
    let controller = Controller::new(widgets.clone(), watcher::Config::default())
        .owns(cms.clone(), watcher::Config::default())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});
    let task = tokio::spawn(controller);

    // Create: the child appears, the status is written, the finalizer is added.
    widgets
        .create(&PostParams::default(), &widget("w1", 2, "hello"))
        .await
        .unwrap();
    eventually("child and status", || async {
        let cm = cms.get_opt("w1").await.unwrap()?;
        let w = widgets.get("w1").await.unwrap();
        let observed = w.status.as_ref().map(|s| s.observed_replicas);
        (cm.data.as_ref()?.get("message")? == "hello"
            && observed == Some(2)
            && w.finalizers().contains(&FINALIZER.to_string()))
        .then_some(())
    })
    .await;
    let w = widgets.get("w1").await.unwrap();
    assert_eq!(
        w.metadata.generation,
        Some(1),
        "status writes never bump generation"
    );

    // Change: the child follows, generation goes up.
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"message": "changed", "replicas": 3}})),
        )
        .await
        .unwrap();
    eventually("child updated", || async {
        let cm = cms.get("w1").await.unwrap();
        let w = widgets.get("w1").await.unwrap();
        (cm.data?.get("message")? == "changed"
            && w.status?.observed_replicas == 3
            && w.metadata.generation == Some(2))
        .then_some(())
    })
    .await;

    // Delete the child: .owns() brings the parent back to recreate it.
    let old_uid = cms.get("w1").await.unwrap().uid();
    cms.delete("w1", &DeleteParams::default()).await.unwrap();
    eventually("child recreated", || async {
        let cm = cms.get_opt("w1").await.unwrap()?;
        (cm.uid() != old_uid).then_some(())
    })
    .await;

    // Delete the parent: the finalizer runs and goes, then the GC removes the child.
    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("parent and child gone", || async {
        let parent = widgets.get_opt("w1").await.unwrap();
        let child = cms.get_opt("w1").await.unwrap();
        (parent.is_none() && child.is_none()).then_some(())
    })
    .await;
    assert_eq!(ctx.cleanups.load(Ordering::SeqCst), 1);
    task.abort();
}

#[tokio::test]
async fn watcher_sees_added_modified_and_deleted_with_resource_versions() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
    // The first poll runs the initial list; after InitDone the watch is live.
    initial_names(&mut events).await;
    cms.create(&PostParams::default(), &config_map("c1"))
        .await
        .unwrap();
    cms.patch(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    cms.delete("c1", &DeleteParams::default()).await.unwrap();

    let seen = changes(&mut events, 3).await;
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["apply", "apply", "delete"]);
    assert_eq!(seen[1].1.data.as_ref().unwrap()["k"], "v");
    let rvs: Vec<u64> = seen
        .iter()
        .map(|(_, o)| o.resource_version().unwrap().parse().unwrap())
        .collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
}

#[tokio::test]
async fn streaming_list_watch_gets_initial_events_and_the_end_bookmark() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for name in ["a", "b"] {
        cms.create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let mut stream = watcher(cms, watcher::Config::default().streaming_lists()).boxed();
    let mut names = initial_names(&mut stream).await;
    names.sort();
    assert_eq!(names, ["a", "b"]);
}

#[tokio::test]
async fn put_with_a_stale_resource_version_is_a_conflict() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let created = cms
        .create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    let mut first = created.clone();
    first.data = Some([("a".to_string(), "1".to_string())].into());
    cms.replace("c", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut stale = created;
    stale.data = Some([("a".to_string(), "2".to_string())].into());
    let status = api_error(
        cms.replace("c", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
}

#[tokio::test]
async fn a_write_that_changes_nothing_bumps_nothing() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let mut cm = config_map("c");
    cm.data = Some([("a".to_string(), "1".to_string())].into());
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let rv_before = sandbox.resource_version();
    let same = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(sandbox.resource_version(), rv_before);
}

#[tokio::test]
async fn custom_resources_are_validated_defaulted_and_pruned_by_the_crd_schema() {
    let sandbox = Sandbox::new();
    let (client, widgets) = with_widgets(&sandbox).await;
    let status = api_error(
        widgets
            .create(&PostParams::default(), &widget("bad", -1, "x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("spec.replicas"),
        "message: {}",
        status.message
    );

    let raw: Api<kube::api::DynamicObject> = Api::default_namespaced_with(
        client.clone(),
        &kube::api::ApiResource::erase::<Widget>(&()),
    );
    let obj: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "sandbox.test/v1", "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"replicas": 1, "message": "m", "extra": "dropped"},
    }))
    .unwrap();
    let created = raw.create(&PostParams::default(), &obj).await.unwrap();
    assert_eq!(
        created.data["spec"]["colour"], "blue",
        "schema default applied"
    );
    assert!(
        created.data["spec"].get("extra").is_none(),
        "unknown field pruned"
    );
    assert!(created.data.get("status").is_none());
}

#[tokio::test]
async fn server_side_apply_drops_fields_the_manager_stopped_applying() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let apply = |data: serde_json::Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});
    let pp = PatchParams::apply("me");
    cms.patch("c", &pp, &Patch::Apply(apply(json!({"a": "1", "b": "2"}))))
        .await
        .unwrap();
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"other": "x"}})),
    )
    .await
    .unwrap();
    let after = cms
        .patch("c", &pp, &Patch::Apply(apply(json!({"a": "1"}))))
        .await
        .unwrap();
    let data = after.data.unwrap();
    assert_eq!(data.get("a").map(String::as_str), Some("1"));
    assert_eq!(data.get("b"), None, "b was applied before and no longer is");
    assert_eq!(data.get("other").map(String::as_str), Some("x"));
}

#[tokio::test]
async fn lists_come_in_pages_of_limit_that_report_the_first_pages_version() {
    let sandbox = Sandbox::builder().event_log_capacity(8).build();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let create = |name: String| {
        let cms = cms.clone();
        async move {
            let cm = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            cms.create(&PostParams::default(), &cm).await.unwrap();
        }
    };
    for i in 0..5 {
        create(format!("c{i}")).await;
    }

    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    let names = |list: &kube::api::ObjectList<ConfigMap>| -> Vec<String> {
        list.items.iter().map(ResourceExt::name_any).collect()
    };
    assert_eq!(names(&first), ["c0", "c1"]);
    let version = first.metadata.resource_version.clone();
    // Written between pages: a later page shows it, at the first page's version, so a watch
    // from that version replays the change.
    create("c2a".into()).await;
    let token = first.metadata.continue_.clone().expect("more pages");
    let second = cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second), ["c2", "c2a"]);
    assert_eq!(second.metadata.resource_version, version);
    let token = second.metadata.continue_.clone().expect("more pages");
    let last = cms
        .list(&ListParams::default().limit(4).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&last), ["c3", "c4"]);
    assert_eq!(last.metadata.continue_, None, "the last page");

    // No limit: one page.
    let all = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 6);
    assert_eq!(all.metadata.continue_, None);

    // A token this server never issued is a 400; one older than the event log, a 410.
    let bad = cms
        .list(&ListParams::default().limit(2).continue_token("not-a-token"))
        .await
        .unwrap_err();
    assert!(
        matches!(&bad, kube::Error::Api(s) if s.code == 400),
        "{bad}"
    );
    for i in 0..10 {
        create(format!("d{i}")).await;
    }
    let expired = cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap_err();
    assert!(
        matches!(&expired, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{expired}"
    );
}

#[tokio::test]
async fn a_watcher_with_a_page_size_and_a_selector_reads_every_matching_page() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for i in 0..7 {
        let labels = if i % 2 == 0 {
            json!({"keep": "yes"})
        } else {
            json!({})
        };
        let cm = json!({"metadata": {"name": format!("c{i}"), "labels": labels}});
        let cm = serde_json::from_value(cm).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    for (config, expected, pages) in [
        (watcher::Config::default().page_size(2), 7, 4),
        (
            watcher::Config::default().page_size(2).labels("keep=yes"),
            4,
            2,
        ),
    ] {
        sandbox.faults().clear_requests();
        let (store, writer) = kube::runtime::reflector::store::<ConfigMap>();
        let stream = kube::runtime::reflector(writer, watcher(cms.clone(), config));
        let task = tokio::spawn(stream.for_each(|_| async {}));
        store.wait_until_ready().await.unwrap();
        assert_eq!(store.state().len(), expected);
        assert_eq!(
            requests_with_verb(&sandbox, "list"),
            pages,
            "{expected} objects in pages of 2"
        );
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_applies_that_create_the_same_object_all_succeed() {
    // Two appliers that both find no object both try to create it; the loser applies to the
    // winner's object instead (the API server's storage retries the same way), never 409.
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let names: Vec<String> = (0..200).map(|i| format!("c-{i}")).collect();
    let appliers = (0..8).map(|applier| {
        let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
        let names = names.clone();
        tokio::spawn(async move {
            let pp = PatchParams::apply(&format!("applier-{applier}")).force();
            for name in &names {
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": name}, "data": {format!("k{applier}"): "v"}});
                cms.patch(name, &pp, &Patch::Apply(cm))
                    .await
                    .unwrap_or_else(|e| panic!("applier-{applier} applying {name}: {e}"));
            }
        })
    });
    for applier in futures::future::join_all(appliers).await {
        applier.unwrap();
    }
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    for name in &names {
        let data = cms.get(name).await.unwrap().data.unwrap_or_default();
        assert_eq!(data.len(), 8, "{name} holds every applier's key: {data:?}");
    }
}

#[tokio::test]
async fn simulated_deployment_controller_writes_rollout_status_and_can_fail() {
    let sandbox = Sandbox::builder()
        .rollout_delay(Duration::from_millis(10))
        .build();
    let deployments: Api<Deployment> = Api::default_namespaced(client(&sandbox));
    deployments
        .create(&PostParams::default(), &deployment("d", 2, "nginx"))
        .await
        .unwrap();
    eventually("rollout status", || async {
        let d = deployments.get("d").await.unwrap();
        let status = d.status?;
        (status.observed_generation == Some(1) && status.available_replicas == Some(2))
            .then_some(())
    })
    .await;

    sandbox.rollouts().set_failing(true);
    deployments
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let reason = eventually("failed rollout", || async {
        let d = deployments.get("d").await.unwrap();
        let status = d.status?;
        if status.observed_generation != Some(2) {
            return None;
        }
        // While it rolls, the controller says it is progressing; then, that it gave up.
        status
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Progressing")
            .and_then(|c| c.reason)
            .filter(|r| r != "ReplicaSetUpdated" && r != "NewReplicaSetCreated")
    })
    .await;
    assert_eq!(reason, "ProgressDeadlineExceeded");
}

#[tokio::test]
async fn deleting_a_crd_stops_serving_its_resources() {
    let sandbox = Sandbox::new();
    let (client, widgets) = with_widgets(&sandbox).await;
    widgets
        .create(&PostParams::default(), &widget("w", 1, "m"))
        .await
        .unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let crd = crds.get("widgets.sandbox.test").await.unwrap();
    let established = crd
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established);
    crds.delete("widgets.sandbox.test", &DeleteParams::default())
        .await
        .unwrap();
    let status = api_error(widgets.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(status.code, 404);
}

#[tokio::test]
async fn a_label_selector_watch_sees_objects_enter_and_leave_the_selection() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let mut events = watcher(cms.clone(), watcher::Config::default().labels("app=web")).boxed();
    initial_names(&mut events).await;
    cms.create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();
    // Into the selection, then out of it.
    for app in ["web", "db"] {
        let label = json!({"metadata": {"labels": {"app": app}}});
        cms.patch("c", &PatchParams::default(), &Patch::Merge(label))
            .await
            .unwrap();
    }
    let seen: Vec<(&str, String)> = changes(&mut events, 2)
        .await
        .into_iter()
        .map(|(change, cm)| (change, cm.name_any()))
        .collect();
    assert_eq!(
        seen,
        [("apply", "c".to_string()), ("delete", "c".to_string())]
    );
}

#[tokio::test]
async fn metadata_watchers_get_partial_object_metadata() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut cm = config_map("c");
    cm.data = Some([("secret".to_string(), "value".to_string())].into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let listed = cms.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].name_any(), "c");
    let metadata: Api<kube::core::PartialObjectMeta<ConfigMap>> =
        Api::default_namespaced(client.clone());
    let mut stream = watcher(metadata, watcher::Config::default()).boxed();
    assert_eq!(initial_names(&mut stream).await, ["c"]);
}

#[tokio::test]
async fn status_writes_change_only_status_and_main_writes_keep_the_stored_status() {
    let sandbox = Sandbox::new();
    let (_, widgets) = with_widgets(&sandbox).await;
    let mut w = widget("w", 1, "m");
    w.status = Some(WidgetStatus {
        observed_replicas: 9,
    });
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.status, None, "create drops status");

    let after_status = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}, "status": {"observed_replicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(after_status.spec.replicas, 1, "/status ignores spec");
    assert_eq!(after_status.status.as_ref().unwrap().observed_replicas, 1);
    assert_eq!(after_status.metadata.generation, Some(1));

    let after_main = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}, "status": {"observed_replicas": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(after_main.spec.replicas, 2);
    assert_eq!(
        after_main.status.unwrap().observed_replicas,
        1,
        "main write keeps status"
    );
    assert_eq!(after_main.metadata.generation, Some(2));
}

#[tokio::test]
async fn dry_run_persists_nothing() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = cms.create(&pp, &config_map("c")).await.unwrap();
    assert_eq!(answered.metadata.name.as_deref(), Some("c"));
    assert!(cms.get_opt("c").await.unwrap().is_none());
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_contents_and_orphaning_keeps_dependents() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let team: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    let owner = team
        .create(&PostParams::default(), &config_map("owner"))
        .await
        .unwrap();
    let mut dependent = config_map("dependent");
    dependent.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.uid().unwrap(),
            ..Default::default()
        },
    ]);
    team.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    team.delete("owner", &DeleteParams::orphan()).await.unwrap();
    // The garbage collector orphans after the API server has answered.
    eventually("the dependent is orphaned", || async {
        let kept = team.get("dependent").await.ok()?;
        kept.metadata.owner_references.is_none().then_some(())
    })
    .await;

    namespaces
        .delete("team", &DeleteParams::default())
        .await
        .unwrap();
    assert!(namespaces.get_opt("team").await.unwrap().is_none());
    assert!(team.get_opt("dependent").await.unwrap().is_none());
    let err = team
        .create(&PostParams::default(), &config_map("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 404));
}

#[tokio::test]
async fn a_dependent_written_after_its_owner_is_gone_is_collected() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let owner = cms
        .create(&PostParams::default(), &config_map("owner"))
        .await
        .unwrap();
    let reference =
        |name: &str, uid: String| k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: name.into(),
            uid,
            ..Default::default()
        };
    let dependent = |name: &str, owners| {
        let mut cm = config_map(name);
        cm.metadata.owner_references = Some(owners);
        cm
    };
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    // A controller working from a stale cache recreates its child after the owner went.
    cms.create(
        &PostParams::default(),
        &dependent("late", vec![reference("owner", owner.uid().unwrap())]),
    )
    .await
    .unwrap();
    // A same-named owner with another uid is not the owner.
    cms.create(&PostParams::default(), &config_map("owner"))
        .await
        .unwrap();
    cms.create(
        &PostParams::default(),
        &dependent(
            "renamed-owner",
            vec![reference("owner", "another-uid".into())],
        ),
    )
    .await
    .unwrap();
    // One live owner is enough to stay.
    let live = cms.get("owner").await.unwrap().uid().unwrap();
    cms.create(
        &PostParams::default(),
        &dependent(
            "kept",
            vec![
                reference("owner", owner.uid().unwrap()),
                reference("owner", live),
            ],
        ),
    )
    .await
    .unwrap();
    eventually("dependents of gone owners are collected", || async {
        (cms.get_opt("late").await.unwrap().is_none()
            && cms.get_opt("renamed-owner").await.unwrap().is_none())
        .then_some(())
    })
    .await;
    assert!(cms.get_opt("kept").await.unwrap().is_some());
}

#[tokio::test]
async fn a_dependent_of_a_custom_kind_whose_crd_went_is_collected_once_the_kind_is_served_again() {
    let sandbox = Sandbox::new();
    let (client, widgets) = with_widgets(&sandbox).await;
    let owner = widgets
        .create(&PostParams::default(), &widget("w1", 1, "hi"))
        .await
        .unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let crd_name = <Widget as kube::CustomResourceExt>::crd_name();
    crds.delete(crd_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the CRD is gone", || async {
        crds.get_opt(crd_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    // A controller with a stale cache writes a child of the Widget while its kind is not
    // served: nobody can tell yet whether the owner exists.
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut child = config_map("child");
    child.metadata.owner_references = owner.controller_owner_ref(&()).map(|r| vec![r]);
    cms.create(&PostParams::default(), &child).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        cms.get_opt("child").await.unwrap().is_some(),
        "collected while its owner's kind was unknown"
    );
    // Once the kind is served again, the owner's absence is plain and the child goes.
    install_crd(&client).await;
    eventually("the child of the gone Widget is collected", || async {
        cms.get_opt("child").await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn delete_answers_the_object_while_finalizers_remain_and_a_status_once_gone() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let mut cm = config_map("held");
    cm.metadata.finalizers = Some(vec!["sandbox.test/hold".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let pending = cms.delete("held", &DeleteParams::default()).await.unwrap();
    let obj = pending.left().expect("the object, still being deleted");
    assert!(obj.metadata.deletion_timestamp.is_some());
    // No new finalizers once deleting.
    let err = cms
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["sandbox.test/hold", "new"]}})),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 422));
    // Removing the last finalizer removes the object.
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());

    cms.create(&PostParams::default(), &config_map("free"))
        .await
        .unwrap();
    let gone = cms.delete("free", &DeleteParams::default()).await.unwrap();
    assert!(gone.is_right(), "immediate deletion answers a Status");
}

#[tokio::test]
async fn bad_requests_get_precise_status_errors() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &config_map("c"))
        .await
        .unwrap();

    const CMS: &str = "/api/v1/namespaces/default/configmaps";
    const JSON: &str = "application/json";
    // (method, path, content type, body, code, reason)
    let cases: Vec<(&str, String, &str, &str, u16, &str)> = vec![
        ("POST", CMS.into(), JSON, "{not json", 400, "BadRequest"),
        (
            "POST",
            CMS.into(),
            JSON,
            r#"{"kind":"Secret","metadata":{"name":"x"}}"#,
            400,
            "BadRequest",
        ),
        (
            "POST",
            CMS.into(),
            JSON,
            r#"{"metadata":{"name":"Not_Valid"}}"#,
            422,
            "Invalid",
        ),
        (
            "POST",
            CMS.into(),
            JSON,
            r#"{"metadata":{}}"#,
            422,
            "Invalid",
        ),
        (
            "POST",
            "/api/v1/namespaces/nowhere/configmaps".into(),
            JSON,
            r#"{"metadata":{"name":"x"}}"#,
            404,
            "NotFound",
        ),
        (
            "POST",
            CMS.into(),
            JSON,
            r#"{"metadata":{"name":"c"}}"#,
            409,
            "AlreadyExists",
        ),
        (
            "PATCH",
            format!("{CMS}/c"),
            "application/json-patch+json",
            r#"[{"op":"remove","path":"/nope"}]"#,
            422,
            "Invalid",
        ),
        (
            "PATCH",
            format!("{CMS}/c"),
            "text/plain",
            "x",
            415,
            "UnsupportedMediaType",
        ),
        (
            "PATCH",
            format!("{CMS}/c"),
            "application/apply-patch+yaml",
            "{}",
            422,
            "Invalid",
        ),
        (
            "GET",
            format!("{CMS}?labelSelector=a%20%3E%201"),
            JSON,
            "",
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/widgets".into(),
            JSON,
            "",
            404,
            "NotFound",
        ),
        ("GET", format!("{CMS}/c/scale"), JSON, "", 404, "NotFound"),
        (
            "PUT",
            format!("{CMS}/c"),
            JSON,
            r#"{"metadata":{"name":"other"}}"#,
            400,
            "BadRequest",
        ),
    ];
    for (method, uri, content_type, body, code, reason) in cases {
        let request = axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .body(body.as_bytes().to_vec())
            .unwrap();
        let what = format!("{} {}", request.method(), request.uri());
        let err = client.request_text(request).await.unwrap_err();
        let kube::Error::Api(status) = err else {
            panic!("{what}: expected an API error, got {err}");
        };
        assert_eq!(
            (status.code, status.reason.as_str()),
            (code, reason),
            "{what}: {}",
            status.message
        );
    }
}

#[tokio::test]
async fn generate_name_gets_a_random_suffix() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("gen-".into());
    let a = cms.create(&PostParams::default(), &cm).await.unwrap();
    let b = cms.create(&PostParams::default(), &cm).await.unwrap();
    assert!(a.name_any().starts_with("gen-") && a.name_any().len() == 9);
    assert_ne!(a.name_any(), b.name_any());
}

#[tokio::test]
async fn server_side_apply_conflicts_with_another_manager_unless_forced() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let config = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": v}});
    cms.patch(
        "c",
        &PatchParams::apply("first"),
        &Patch::Apply(config("1")),
    )
    .await
    .unwrap();
    let status = api_error(
        cms.patch(
            "c",
            &PatchParams::apply("second"),
            &Patch::Apply(config("2")),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(status.code, 409);
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"first\": .data.k"
    );
    let forced = cms
        .patch(
            "c",
            &PatchParams::apply("second").force(),
            &Patch::Apply(config("2")),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["k"], "2");
}

#[tokio::test]
async fn the_scale_subresource_reads_and_writes_replicas() {
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let deployments: Api<Deployment> = Api::default_namespaced(client(&sandbox));
    deployments
        .create(&PostParams::default(), &deployment("d", 2, "nginx"))
        .await
        .unwrap();
    let scale = deployments.get_scale("d").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=d"));
    let scaled = deployments
        .patch_scale(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(5));
    let d = deployments.get("d").await.unwrap();
    assert_eq!(d.spec.unwrap().replicas, Some(5));
    assert_eq!(d.metadata.generation, Some(2));
}

#[tokio::test]
async fn stored_reads_objects_as_a_get_answers_them_without_a_request() {
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let mut cm = config_map("c");
    cm.data = Some([("a".to_string(), "1".to_string())].into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let got = serde_json::to_value(cms.get("c").await.unwrap()).unwrap();
    sandbox.faults().clear_requests();

    let stored = sandbox.stored(&[
        ("", "configmaps", "default", "c"),
        ("", "configmaps", "default", "missing"),
        ("apps", "deployments", "default", "c"),
        ("example.com", "unserved", "default", "c"),
    ]);
    let [Some(found), None, None, None] = stored.as_slice() else {
        panic!("expected the ConfigMap only, got {stored:?}");
    };
    assert_eq!(found.pointer("/data/a"), Some(&json!("1")));
    assert_eq!(found.pointer("/metadata"), got.pointer("/metadata"));
    assert!(
        sandbox.faults().request_counts().is_empty(),
        "no request is made"
    );
}
