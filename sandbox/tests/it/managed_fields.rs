//! `metadata.managedFields` as kube-apiserver keeps them: Update and Apply entries per manager
//! and subresource, apply conflicts in its words, list-maps shared by key, and fields dropped
//! from an apply kept while another manager owns them.

use crate::support::api::api_error;
use crate::support::fixtures::client;
use crate::support::kubectl::served_kubectl;
use crate::support::watch::watch_from;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent};
use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;
use serde_json::{Value, json};

fn deployment(replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
        },
    })
}

/// A sandbox without the Deployment controller, so that only the test writes Deployments, and
/// its Deployments in `default`.
fn deployments() -> (Sandbox, Api<Deployment>) {
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let api = Api::default_namespaced(client(&sandbox));
    (sandbox, api)
}

/// Server-side applies Deployment `d` of `replicas` with `params`.
async fn apply(
    api: &Api<Deployment>,
    params: &PatchParams,
    replicas: i32,
) -> kube::Result<Deployment> {
    api.patch("d", params, &Patch::Apply(deployment(replicas)))
        .await
}

/// Scales Deployment `d` to `replicas` through its scale subresource, as `manager`.
async fn scale(api: &Api<Deployment>, manager: &str, replicas: i32) {
    let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    api.patch_scale("d", &by(manager), &patch).await.unwrap();
}

/// The one container of Deployment `d`.
fn the_container(d: &Deployment) -> &Container {
    let template = &d.spec.as_ref().unwrap().template;
    &template.spec.as_ref().unwrap().containers[0]
}

fn by(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    }
}

/// The entries of `obj`'s managedFields as (manager, operation, subresource, fieldsV1).
fn entries(obj: &impl serde::Serialize) -> Vec<(String, String, String, Value)> {
    let obj = serde_json::to_value(obj).unwrap();
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (
                s("manager"),
                s("operation"),
                s("subresource"),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

fn fields_of(obj: &impl serde::Serialize, manager: &str) -> Value {
    entries(obj)
        .into_iter()
        .find(|(m, ..)| m == manager)
        .map(|(.., f)| f)
        .unwrap_or_else(|| panic!("no entry of {manager}"))
}

#[tokio::test]
async fn creates_applies_updates_scales_and_status_writes_each_record_their_fields() {
    let (_sandbox, api) = deployments();
    let create = PostParams {
        field_manager: Some("creator".into()),
        ..Default::default()
    };
    let created = api
        .create(&create, &serde_json::from_value(deployment(1)).unwrap())
        .await
        .unwrap();
    let mine = fields_of(&created, "creator");
    assert_eq!(mine["f:spec"]["f:replicas"], json!({}), "{mine}");
    assert_eq!(
        mine["f:spec"]["f:selector"],
        json!({}),
        "an atomic map: {mine}"
    );
    assert_eq!(
        mine["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:image"],
        json!({}),
        "{mine}"
    );

    let apply = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "annotations": {"team": "a"}}});
    api.patch("d", &PatchParams::apply("applier"), &Patch::Apply(apply))
        .await
        .unwrap();
    api.patch(
        "d",
        &by("patcher"),
        &Patch::Merge(json!({"spec": {"paused": true}})),
    )
    .await
    .unwrap();
    scale(&api, "scaler", 4).await;
    api.patch_status(
        "d",
        &by("statuser"),
        &Patch::Merge(json!({"status": {"observedGeneration": 3}})),
    )
    .await
    .unwrap();

    let d = api.get("d").await.unwrap();
    let got: Vec<(String, String, String)> = entries(&d)
        .into_iter()
        .map(|(m, o, s, _)| (m, o, s))
        .collect();
    let entry = |m: &str, o: &str, s: &str| (m.to_string(), o.to_string(), s.to_string());
    assert_eq!(
        got,
        [
            entry("applier", "Apply", ""),
            entry("creator", "Update", ""),
            entry("patcher", "Update", ""),
            entry("scaler", "Update", "scale"),
            entry("statuser", "Update", "status"),
        ]
    );
    assert_eq!(
        fields_of(&d, "applier"),
        json!({"f:metadata": {"f:annotations": {"f:team": {}}}})
    );
    assert_eq!(
        fields_of(&d, "patcher"),
        json!({"f:spec": {"f:paused": {}}})
    );
    assert_eq!(
        fields_of(&d, "scaler"),
        json!({"f:spec": {"f:replicas": {}}})
    );
    assert_eq!(
        fields_of(&d, "statuser"),
        json!({"f:status": {"f:observedGeneration": {}}})
    );
    let creator = fields_of(&d, "creator");
    assert_eq!(
        creator["f:spec"]["f:replicas"],
        Value::Null,
        "the scale took spec.replicas from its creator: {creator}"
    );

    // The list and the reset rule: `[{}]` clears them.
    let listed = api.list(&Default::default()).await.unwrap();
    assert_eq!(entries(&listed.items[0]).len(), 5);
    let cleared = api
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"managedFields": [{}]}})),
        )
        .await
        .unwrap();
    assert_eq!(cleared.metadata.managed_fields, None);
}

#[tokio::test]
async fn an_apply_of_other_replicas_after_a_scale_conflicts_with_the_scaler_until_forced() {
    let (_sandbox, api) = deployments();
    let ops = PatchParams::apply("ops");
    apply(&api, &ops, 2).await.unwrap();
    scale(&api, "kubectl-scale", 5).await;

    // The same value is shared, not a conflict; another one is.
    apply(&api, &ops, 5).await.unwrap();
    let status = api_error(apply(&api, &ops, 3).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"kubectl-scale\" with subresource \"scale\" using apps/v1: .spec.replicas"
    );
    let causes = status.details.map(|d| d.causes).unwrap_or_default();
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].field, ".spec.replicas");
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    assert_eq!(
        causes[0].message,
        "conflict with \"kubectl-scale\" with subresource \"scale\" using apps/v1"
    );

    let forced = apply(&api, &ops.force(), 3).await.unwrap();
    assert_eq!(forced.spec.as_ref().unwrap().replicas, Some(3));
    let managers: Vec<String> = entries(&forced).into_iter().map(|(m, ..)| m).collect();
    assert_eq!(managers, ["ops"], "the scaler owned nothing else");
    assert_eq!(fields_of(&forced, "ops")["f:spec"]["f:replicas"], json!({}));
}

#[tokio::test]
async fn two_appliers_of_one_containers_env_keep_each_others_entries_by_name() {
    let (_sandbox, api) = deployments();
    apply(&api, &PatchParams::apply("base"), 1).await.unwrap();
    let env = |name: &str, value: &str| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": [{"name": "c",
                "env": [{"name": name, "value": value}]}]}}}})
    };
    api.patch("d", &PatchParams::apply("a"), &Patch::Apply(env("A", "1")))
        .await
        .unwrap();
    api.patch("d", &PatchParams::apply("b"), &Patch::Apply(env("B", "1")))
        .await
        .unwrap();
    // `a` changes its own entry: `b`'s stays.
    let d = api
        .patch("d", &PatchParams::apply("a"), &Patch::Apply(env("A", "2")))
        .await
        .unwrap();
    let container = the_container(&d);
    let got: Vec<(String, Option<String>)> = container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    assert_eq!(
        got,
        [
            ("A".to_string(), Some("2".to_string())),
            ("B".to_string(), Some("1".to_string()))
        ]
    );
    assert_eq!(
        container.image.as_deref(),
        Some("nginx"),
        "base's image stays"
    );
    let env_of = |m: &str| {
        fields_of(&d, m)["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]
            ["f:env"]
            .clone()
    };
    assert_eq!(
        env_of("a"),
        json!({"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}})
    );
    assert_eq!(
        env_of("b"),
        json!({"k:{\"name\":\"B\"}": {".": {}, "f:name": {}, "f:value": {}}})
    );
    // `b` stops applying its entry, which nobody else owns: it goes.
    let d = api
        .patch(
            "d",
            &PatchParams::apply("b"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "d"}})),
        )
        .await
        .unwrap();
    let names: Vec<String> = the_container(&d)
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["A"]);
}

#[tokio::test]
async fn a_field_dropped_from_an_apply_stays_while_another_manager_owns_it() {
    let sandbox = Sandbox::new();
    let api: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let config = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});
    api.patch(
        "c",
        &PatchParams::apply("a"),
        &Patch::Apply(config(json!({"x": "1", "y": "2", "z": "3"}))),
    )
    .await
    .unwrap();
    // `b` applies y with the same value (shared), `u` updates z (taking it).
    api.patch(
        "c",
        &PatchParams::apply("b"),
        &Patch::Apply(config(json!({"y": "2"}))),
    )
    .await
    .unwrap();
    api.patch("c", &by("u"), &Patch::Merge(json!({"data": {"z": "4"}})))
        .await
        .unwrap();
    let cm = api
        .patch(
            "c",
            &PatchParams::apply("a"),
            &Patch::Apply(config(json!({"x": "1"}))),
        )
        .await
        .unwrap();
    let data = cm.data.clone().unwrap();
    assert_eq!(
        data.into_iter().collect::<Vec<_>>(),
        [
            ("x".to_string(), "1".to_string()),
            ("y".to_string(), "2".to_string()),
            ("z".to_string(), "4".to_string())
        ]
    );
    // Once `b` drops y too, nobody owns it and it goes.
    let cm = api
        .patch(
            "c",
            &PatchParams::apply("b"),
            &Patch::Apply(config(json!({}))),
        )
        .await
        .unwrap();
    let keys: Vec<String> = cm.data.unwrap().into_keys().collect();
    assert_eq!(keys, ["x", "z"]);
}

#[tokio::test]
async fn watch_events_carry_the_managed_fields_of_the_write() {
    let (_sandbox, api) = deployments();
    let created = apply(&api, &PatchParams::apply("ops"), 2).await.unwrap();
    let mut events = watch_from(&api, &created.resource_version().unwrap()).await;
    scale(&api, "hpa", 7).await;
    let Some(Ok(WatchEvent::Modified(scaled))) = events.next().await else {
        panic!("expected the scale as a MODIFIED event");
    };
    let got: Vec<(String, String, String)> = entries(&scaled)
        .into_iter()
        .map(|(m, o, s, _)| (m, o, s))
        .collect();
    assert_eq!(
        got,
        [
            ("ops".to_string(), "Apply".to_string(), String::new()),
            ("hpa".to_string(), "Update".to_string(), "scale".to_string())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_managed_fields_only_when_asked() {
    let (sandbox, _) = deployments();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    let manifest = k.file("d.json", &deployment(2).to_string());
    k.ok(&["apply", "--server-side", "-f", path_str(&manifest)])
        .await;
    k.ok(&["scale", "deployment", "d", "--replicas=3"]).await;
    let shown = k
        .ok(&[
            "get",
            "deployment",
            "d",
            "-o",
            "yaml",
            "--show-managed-fields",
        ])
        .await;
    assert!(shown.contains("managedFields:"), "{shown}");
    assert!(shown.contains("manager: kubectl\n"), "{shown}");
    assert!(shown.contains("operation: Apply"), "{shown}");
    assert!(shown.contains("subresource: scale"), "{shown}");
    assert!(shown.contains("k:{\"name\":\"c\"}"), "{shown}");
    let hidden = k.ok(&["get", "deployment", "d", "-o", "yaml"]).await;
    assert!(!hidden.contains("managedFields"), "{hidden}");
    // kubectl's own apply of another value conflicts with its scale, in the server's words
    // (kubectl scale sends no fieldManager: the manager is its user agent's product).
    let manifest = k.file("d.json", &deployment(4).to_string());
    let out = k
        .run(&["apply", "--server-side", "-f", path_str(&manifest)])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl\" with subresource \"scale\" using apps/v1: .spec.replicas"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_apply_keeps_a_map_it_still_fills_when_its_entry_claimed_the_map_itself_before() {
    // The state kubectl leaves after migrating a client-side-applied object to server-side
    // apply (`kubectl apply --server-side --force-conflicts`): its Apply entry owns the maps
    // themselves (`.`), which its next apply does not claim for a built-in kind's `data`.
    let sandbox = Sandbox::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sandbox));
    let cm = |data: Value| {
        serde_json::from_value::<ConfigMap>(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "m", "annotations": {"last": "x"}}, "data": data,
        }))
        .unwrap()
    };
    cms.create(&PostParams::default(), &cm(json!({"a": "1", "b": "2"})))
        .await
        .unwrap();
    let entry = |manager: &str, fields: Value| {
        json!({"manager": manager, "operation": "Apply", "apiVersion": "v1",
               "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields})
    };
    let annotation = json!({"f:annotations": {"f:last": {}}});
    let mine = json!({"f:metadata": {".": {}, "f:annotations": {".": {}, "f:last": {}}},
                      "f:data": {".": {}, "f:a": {}, "f:b": {}}});
    let managed = json!([
        entry("kubectl", mine),
        entry("kubectl-last-applied", json!({"f:metadata": annotation}))
    ]);
    cms.patch(
        "m",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([
                {"op": "replace", "path": "/metadata/managedFields", "value": managed}
            ]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"},
                        "data": {"a": "1", "b": "3"}});
    let applied = cms
        .patch("m", &by("kubectl").force(), &Patch::Apply(config))
        .await
        .unwrap();
    let data = applied.data.clone().unwrap_or_default();
    assert_eq!(
        data.get("b").map(String::as_str),
        Some("3"),
        "{:?}",
        applied.metadata
    );
    assert_eq!(
        applied.annotations().get("last").map(String::as_str),
        Some("x")
    );
}
