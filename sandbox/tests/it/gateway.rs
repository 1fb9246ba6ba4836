//! Gateway API's gateways CRD, vendored: what kube-apiserver does with it on read (defaults,
//! printer columns). Its writes (`format` inside `oneOf`/`anyOf`) are in `formats.rs`.

use crate::support::fixtures::client;
use crate::support::kubectl::served_kubectl;
use crate::support::vendored::{apply_vendored_crd, install_vendored_crd};

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::ApiResource;
use kube_sandbox::Sandbox;
use kube_sandbox::testing::path_str;
use serde_json::{Value, json};

const GATEWAYS: &str = "gateway-api/gateway.networking.k8s.io_gateways.yaml";

async fn gateways(sandbox: &Sandbox) -> (Api<DynamicObject>, ApiResource) {
    let client = client(sandbox);
    let resource = install_vendored_crd(&client, GATEWAYS).await;
    (Api::namespaced_with(client, "default", &resource), resource)
}

fn gateway(resource: &ApiResource, name: &str) -> DynamicObject {
    let mut gateway = DynamicObject::new(name, resource);
    gateway.data = json!({"spec": {
        "gatewayClassName": "example",
        "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]
    }});
    gateway
}

/// The status the gateways CRD declares as its default (`status.default` in the schema).
fn waiting_conditions() -> Value {
    let condition = |kind: &str| {
        json!({"lastTransitionTime": "1970-01-01T00:00:00Z", "message": "Waiting for controller",
               "reason": "Pending", "status": "Unknown", "type": kind})
    };
    json!([condition("Accepted"), condition("Programmed")])
}

#[tokio::test]
async fn a_new_gateway_reads_back_with_its_default_status_conditions() {
    let sandbox = Sandbox::new();
    let (api, resource) = gateways(&sandbox).await;
    // The create drops the status (a status subresource), and the defaults come back when the
    // stored object is decoded: in the answer to the create, a get, a list and a watch.
    let created = api
        .create(&PostParams::default(), &gateway(&resource, "gw"))
        .await
        .unwrap();
    assert_eq!(created.data["status"]["conditions"], waiting_conditions());
    let got = api.get("gw").await.unwrap();
    assert_eq!(got.data["status"]["conditions"], waiting_conditions());
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        listed.items[0].data["status"]["conditions"],
        waiting_conditions()
    );
    // The status defaults are not owned by the creator: they were never in what it sent.
    let owned = serde_json::to_string(&got.metadata.managed_fields).unwrap();
    assert!(!owned.contains("f:status"), "{owned}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printer_columns_with_a_wildcard_show_the_first_value_as_the_api_server_does() {
    let sandbox = Sandbox::new();
    let Some((_served, k)) = served_kubectl(&sandbox).await else {
        return;
    };
    apply_vendored_crd(&k, GATEWAYS).await;
    let gw = k.file(
        "gw.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n\
         spec:\n  gatewayClassName: example\n  listeners:\n  - name: http\n    port: 80\n    protocol: HTTP\n",
    );
    k.ok(&["apply", "-f", path_str(&gw)]).await;
    let status = json!({"status": {
        "addresses": [{"type": "IPAddress", "value": "10.0.0.1"},
                      {"type": "IPAddress", "value": "10.0.0.2"}],
        "conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed",
                        "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}});
    k.ok(&[
        "patch",
        "gateway",
        "gw",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ])
    .await;
    // `.status.addresses[*].value`: the table convertor prints the first of the values found.
    let out = k.ok(&["get", "gateway", "gw"]).await;
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["NAME", "CLASS", "ADDRESS", "PROGRAMMED", "AGE"]);
    assert_eq!(lines[1][..4], ["gw", "example", "10.0.0.1", "True"]);
}

#[tokio::test]
async fn a_stored_object_reads_back_with_a_default_its_crd_gained_later() {
    let sandbox = Sandbox::new();
    let client = client(&sandbox);
    let crd = |defaulted: bool| {
        let mut size = json!({"type": "integer"});
        if defaulted {
            size["default"] = json!(3);
        }
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gadgets.sandbox.test"},
            "spec": {"group": "sandbox.test", "scope": "Namespaced",
                     "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                       "spec": {"type": "object", "properties": {
                                           "size": size, "note": {"type": "string"}}}}}}}]}
        })
    };
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
            ),
            "customresourcedefinitions",
        ),
    );
    let apply = PatchParams::apply("test").force();
    crds.patch("gadgets.sandbox.test", &apply, &Patch::Apply(crd(false)))
        .await
        .unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("sandbox.test", "v1", "Gadget"),
        "gadgets",
    );
    let gadgets: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let mut gadget = DynamicObject::new("g", &resource);
    gadget.data = json!({"spec": {"note": "old"}});
    gadgets
        .create(&PostParams::default(), &gadget)
        .await
        .unwrap();
    assert_eq!(
        gadgets.get("g").await.unwrap().data["spec"],
        json!({"note": "old"})
    );

    crds.patch("gadgets.sandbox.test", &apply, &Patch::Apply(crd(true)))
        .await
        .unwrap();
    let got = gadgets.get("g").await.unwrap();
    assert_eq!(got.data["spec"], json!({"note": "old", "size": 3}));
    let listed = gadgets.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        listed.items[0].data["spec"],
        json!({"note": "old", "size": 3})
    );
    let mut events = gadgets
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Added(added)) => {
            assert_eq!(added.data["spec"], json!({"note": "old", "size": 3}))
        }
        other => panic!("not an ADDED event: {other:?}"),
    }
    // A write starts from the decoded object, so the default is stored with it.
    let patched = gadgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"note": "new"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["spec"], json!({"note": "new", "size": 3}));
}
