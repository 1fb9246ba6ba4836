//! Built-in objects as kube-apiserver stores them, encoded from their Go structs: an
//! `omitempty` field at its zero value is left out however it was written (create, update,
//! patch, server-side apply), a zero behind a pointer stays, and the simulated controllers'
//! objects are already in that form.

use crate::support::fixtures::client;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_sandbox::Sandbox;
use kube_sandbox::testing::eventually;
use serde_json::{Value, json};

/// Deployment `d` of `replicas`, its container `c` given `env`, with a second container `s`
/// given an empty env list.
fn deployment(replicas: i32, env: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}},
                         "spec": {"containers": [
                             {"name": "c", "image": "nginx", "env": env},
                             {"name": "s", "image": "nginx", "env": []},
                         ]}},
        },
    })
}

/// Deployments as raw JSON, in a sandbox whose Deployment controller leaves them alone.
fn raw_deployments() -> (Sandbox, Api<DynamicObject>) {
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let resource = ApiResource::erase::<Deployment>(&());
    (
        sandbox.clone(),
        Api::default_namespaced_with(client(&sandbox), &resource),
    )
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

fn containers(d: &DynamicObject) -> &Value {
    &d.data["spec"]["template"]["spec"]["containers"]
}

/// The `fieldsV1` of `manager`'s managedFields entry.
fn fields_of(d: &DynamicObject, manager: &str) -> Value {
    let entry = d
        .managed_fields()
        .iter()
        .find(|e| e.manager.as_deref() == Some(manager))
        .unwrap_or_else(|| panic!("no managedFields entry of {manager}"));
    entry.fields_v1.as_ref().unwrap().0.clone()
}

#[tokio::test]
async fn an_empty_env_value_applied_server_side_is_not_stored_but_stays_owned() {
    let (_sandbox, api) = raw_deployments();
    let params = PatchParams::apply("op");
    let env = json!([{"name": "A", "value": ""}, {"name": "B", "value": "b"}]);
    let applied = api
        .patch("d", &params, &Patch::Apply(deployment(0, env.clone())))
        .await
        .unwrap();
    assert_eq!(
        containers(&applied),
        &json!([
            {"name": "c", "image": "nginx", "env": [{"name": "A"}, {"name": "B", "value": "b"}],
             "imagePullPolicy": "Always", "resources": {},
             "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"},
            {"name": "s", "image": "nginx", "imagePullPolicy": "Always", "resources": {},
             "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"},
        ])
    );
    assert_eq!(applied.data["spec"]["replicas"], json!(0));
    // The applier owns what it applied (structured-merge-diff's `Updater.Apply` takes the
    // configuration's field set), also the value the stored object no longer has.
    let owned = fields_of(&applied, "op");
    let c = &owned["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"];
    assert_eq!(
        c["f:env"]["k:{\"name\":\"A\"}"],
        json!({".": {}, "f:name": {}, "f:value": {}})
    );
    // Applying the same configuration again changes nothing: an applier does not loop.
    let again = api
        .patch("d", &params, &Patch::Apply(deployment(0, env)))
        .await
        .unwrap();
    assert_eq!(again.resource_version(), applied.resource_version());
}

#[tokio::test]
async fn created_updated_and_patched_objects_lose_their_empty_omitempty_fields() {
    let (_sandbox, api) = raw_deployments();
    let params = PostParams {
        field_manager: Some("writer".into()),
        ..PostParams::default()
    };
    let created = api
        .create(
            &params,
            &object(deployment(0, json!([{"name": "A", "value": ""}]))),
        )
        .await
        .unwrap();
    assert_eq!(containers(&created)[0]["env"], json!([{"name": "A"}]));
    assert_eq!(containers(&created)[1].get("env"), None);
    assert_eq!(created.data["spec"]["replicas"], json!(0));
    // The field manager sees the decoded object: the creator's Update entry has no value.
    let owned = fields_of(&created, "writer");
    let c = &owned["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"];
    assert_eq!(
        c["f:env"]["k:{\"name\":\"A\"}"],
        json!({".": {}, "f:name": {}})
    );

    let mut replaced = deployment(0, json!([{"name": "A"}, {"name": "B", "value": ""}]));
    replaced["metadata"]["labels"] = json!({});
    let replaced = api.replace("d", &params, &object(replaced)).await.unwrap();
    assert_eq!(
        containers(&replaced)[0]["env"],
        json!([{"name": "A"}, {"name": "B"}])
    );
    assert_eq!(replaced.metadata.labels, None);

    let patch = json!({"spec": {"paused": false, "template": {"spec": {"containers": [
        {"name": "c", "image": "nginx", "workingDir": "", "env": [{"name": "C", "value": ""}]}]}}}});
    let patched = api
        .patch("d", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    assert_eq!(containers(&patched)[0]["env"], json!([{"name": "C"}]));
    assert_eq!(containers(&patched)[0].get("workingDir"), None);
    assert_eq!(patched.data["spec"].get("paused"), None);
}

#[tokio::test]
async fn a_typed_client_reads_back_what_it_wrote_less_the_empty_value() {
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let api: Api<Deployment> = Api::default_namespaced(client(&sandbox));
    let mut d: Deployment = serde_json::from_value(deployment(0, json!([]))).unwrap();
    let template = d.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    template.containers[0].env = Some(vec![EnvVar {
        name: "A".into(),
        value: Some(String::new()),
        value_from: None,
    }]);
    let created = api.create(&PostParams::default(), &d).await.unwrap();
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(0));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.containers[0].env,
        Some(vec![EnvVar {
            name: "A".into(),
            value: None,
            value_from: None,
        }])
    );
    assert_eq!(pod.containers[1].env, None);
    // Writing back what was read is no change at all.
    let replaced = api
        .replace("d", &PostParams::default(), &created)
        .await
        .unwrap();
    assert_eq!(replaced.resource_version(), created.resource_version());
    assert_eq!(replaced.metadata.generation, Some(1));
}

/// Every stored object of type `K`, as JSON.
async fn stored<K>(client: &Client) -> Vec<Value>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::default_namespaced_with(client.clone(), &resource);
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect()
}

#[tokio::test]
async fn the_simulated_controllers_write_objects_as_go_encodes_them() {
    let sandbox = Sandbox::builder()
        .rollout_delay(Duration::from_millis(20))
        .build();
    let client = client(&sandbox);
    let api: Api<Deployment> = Api::default_namespaced(client.clone());
    let d = deployment(2, json!([{"name": "A", "value": "a"}]));
    api.create(&PostParams::default(), &serde_json::from_value(d).unwrap())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    eventually("two pods run", || async {
        let pods = pods.list(&ListParams::default()).await.ok()?.items;
        let running = pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        (running.count() == 2).then_some(())
    })
    .await;
    let mut objects = stored::<Deployment>(&client).await;
    objects.extend(stored::<ReplicaSet>(&client).await);
    objects.extend(stored::<Pod>(&client).await);
    assert_eq!(objects.len(), 4);
    for object in objects {
        let mut encoded = object.clone();
        kube_sandbox::encoding::omit_empty(&mut encoded);
        assert_eq!(encoded, object);
    }
}

#[tokio::test]
async fn an_empty_managed_fields_list_sent_with_an_update_still_clears_them() {
    let (_sandbox, api) = raw_deployments();
    let created = api
        .create(&PostParams::default(), &object(deployment(1, json!([]))))
        .await
        .unwrap();
    assert!(!created.managed_fields().is_empty());
    let mut sent = serde_json::to_value(&created).unwrap();
    sent["metadata"]["managedFields"] = json!([]);
    let replaced = api
        .replace("d", &PostParams::default(), &object(sent))
        .await
        .unwrap();
    assert!(replaced.managed_fields().is_empty(), "{replaced:?}");
}
